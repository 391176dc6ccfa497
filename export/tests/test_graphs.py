"""The HTP graphs (qhx_export.graphs) on ORT's CPU EP, driven by the package's token loop, against
each family's numpy reference forward: every family, every prefill mode, prompts longer than AR
(chunked prefill), then decode steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from qhx_export.families import registered
from qhx_export.graphs import GraphOptions, layer_graph, lmhead_graph, save, specs
from qhx_export.graphs.decoder import FLOAT_NODES_KEY, WEIGHTS_KEY
from qhx_export.verify.loop import Loop, cpu_graph

from .conftest import tiny_config, tiny_weights

pytest.importorskip("onnxruntime")


def build(
    tmp: Path,
    family: str,
    prefill: str,
    o: GraphOptions,
    ar: int = 4,
    ctx: int = 32,
    kv_layout: str = "pos_major",
) -> Loop:
    c = tiny_config(family)
    w = tiny_weights(c, 3)
    graphs = {}
    for role, s in specs(c, "t", ar, ctx, prefill, o.quantized, kv_layout=kv_layout).items():
        fn = lmhead_graph if role == "lmhead" else layer_graph
        save(fn(c, lambda n: w[n], s, o), str(tmp / f"{role}.onnx"))
        graphs[role] = cpu_graph(str(tmp / f"{role}.onnx"))
    man = {"params": c.rope_params()}
    return Loop(man, str(tmp), graphs, embed=w["token_embd.weight"])


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("prefill", ["window", "past", "none"])
def test_graphs_match_reference(tmp_path: Path, family: str, prefill: str) -> None:
    c = tiny_config(family)
    w = tiny_weights(c, 3)
    loop = build(tmp_path, family, prefill, GraphOptions(prescale=0.5))
    ids = [5, 17, 33, 2, 9, 100, 44, 7, 8, 250, 3, 61]
    n_prompt = 3 if prefill == "window" else 9  # past: chunks of 4, 4, 1
    ref = registered()[family].forward(c, w, ids)
    loop.run_prompt(ids[:n_prompt])
    errs = [np.abs(loop.logits() - ref[n_prompt - 1]).max()]
    for k in range(n_prompt, len(ids)):
        loop.decode_step(ids[k])
        errs.append(np.abs(loop.logits() - ref[k]).max())
    assert max(errs) < 1e-4 * max(1.0, float(np.abs(ref).max())), errs


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("prefill", ["window", "past"])
def test_head_major_graphs_match_reference(tmp_path: Path, family: str, prefill: str) -> None:
    """--kv-layout head_major: every K/V tensor of the graph I/O is [n_kv, rows, Dh] (n_kv = 2,
    so a layout mix-up would scramble heads), and the loop over them still gives the reference
    forward's logits through a chunked prefill and decode steps."""
    c = tiny_config(family)
    assert c.n_kv_heads == 2
    w = tiny_weights(c, 3)
    loop = build(tmp_path, family, prefill, GraphOptions(), kv_layout="head_major")
    rows = {"decode": 1, "prefill": 4}
    for role in ("decode", "prefill"):
        g = loop.dec if role == "decode" else loop.pre
        assert g is not None
        kv = {n: t.dims for n, t in {**g.inputs, **g.outputs}.items() if n.startswith(("past_", "new_"))}
        want = {n: [2, 32 if n.startswith("past_") else rows[role], c.head_dim] for n in kv}
        assert kv == want and len(kv) == 2 * c.n_layers * (2 if role == "decode" or prefill == "past" else 1)
    ids = [5, 17, 33, 2, 9, 100, 44, 7, 8, 250, 3, 61]
    n_prompt = 3 if prefill == "window" else 9
    ref = registered()[family].forward(c, w, ids)
    loop.run_prompt(ids[:n_prompt])
    errs = [np.abs(loop.logits() - ref[n_prompt - 1]).max()]
    for k in range(n_prompt, len(ids)):
        loop.decode_step(ids[k])
        errs.append(np.abs(loop.logits() - ref[k]).max())
    assert max(errs) < 1e-4 * max(1.0, float(np.abs(ref).max())), errs


def test_graph_design(tmp_path: Path) -> None:
    """GQA-native (no K/V repeat: no Expand/Tile), q scale folded (no score-sized Mul by 1/sqrt(d)),
    1D decode mask, model properties for mixed precision and per-channel weights."""
    c = tiny_config("llama")
    w = tiny_weights(c, 3)
    sp = specs(c, "t", 4, 32, "window", False)
    m = layer_graph(c, lambda n: w[n], sp["decode"], GraphOptions())
    ops = {n.op_type for n in m.graph.node}
    assert not ops & {"Expand", "Tile", "Gemm"}
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    scale = np.float32(c.head_dim**-0.5)
    assert not any(v.shape == () and np.isclose(v, scale) for v in consts.values())
    cm = next(i for i in m.graph.input if i.name == "cmask")
    assert [d.dim_value for d in cm.type.tensor_type.shape.dim] == [32]
    props = {p.key: p.value for p in m.metadata_props}
    assert FLOAT_NODES_KEY in props and WEIGHTS_KEY in props
    # 7 MatMul weights per layer, each [in, out]
    assert len(__import__("json").loads(props[WEIGHTS_KEY])) == 7 * c.n_layers


def test_genie_graph_exact_ops_same_math() -> None:
    """The Genie graph with the float graphs' exact ops (SiLU through Tanh, softmax written out
    with its Exp input floored, QNN's RmsNorm) computes what the single ops do, on a first step
    whose past slots are all masked (Genie's -1000, where the HTP's fp16 Exp returns garbage
    without the floor)."""
    import onnxruntime as ort

    from qhx_export.graphs.genie import MASK_NEG, genie_graph, io_spec

    c = tiny_config("llama")
    w = tiny_weights(c, 3)
    ar, cl, half = 4, 16, c.head_dim // 2
    rng = np.random.default_rng(0)
    ang = np.arange(ar)[:, None] * 10000.0 ** (-np.arange(half) / half)[None]
    mask = np.full((1, 1, ar, cl), MASK_NEG, np.float32)
    mask[0, 0, :, cl - ar :] = np.where(np.tril(np.ones((ar, ar))) > 0, 0.0, MASK_NEG)
    feed: dict[str, np.ndarray] = {
        "input_ids": np.array([[1, 5, 9, 13]], np.int32),
        "attention_mask": mask,
        "position_ids_cos": np.cos(ang).reshape(1, 1, ar, half).astype(np.float32),
        "position_ids_sin": np.sin(ang).reshape(1, 1, ar, half).astype(np.float32),
    }
    for name, _, dims in io_spec(c, ar, cl)[0]:
        if name.startswith("past_"):
            feed[name] = rng.standard_normal(dims).astype(np.float32)
    out = {}
    for exact in (False, True):
        m = genie_graph(c, lambda n: np.asarray(w[n], np.float32), "g", ar, cl, GraphOptions(exact_ops=exact))
        ops = {n.op_type for n in m.graph.node}
        if exact:
            assert {"Tanh", "Exp", "Max", "SimplifiedLayerNormalization"} <= ops
            assert not ops & {"Softmax", "Sigmoid", "ReduceMean"}
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        out[exact] = sess.run(["logits"], feed)[0]
    np.testing.assert_allclose(out[True], out[False], atol=1e-4)
