"""Quantization: the calibration corpus, per-output-channel QDQ MatMul weights, fixed-point graph
I/O, mixed precision, and the quantized graphs' logits against the float graphs (ORT CPU EP)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qhx_export import ExportError
from qhx_export.graphs import GraphOptions, layer_graph, save, specs
from qhx_export.graphs.decoder import FLOAT_NODES_KEY
from qhx_export.quant import corpus
from qhx_export.quant.qdq import CALIB_MASK, feeds_stream, fixed_point_io, minmax, quantize
from qhx_export.verify.loop import Loop, cpu_graph

from .conftest import tiny_config, tiny_weights

pytest.importorskip("onnxruntime")


def test_corpus() -> None:
    texts = corpus.builtin("{{ '<|im_start|>' }}")
    assert len(texts) >= 32
    assert sum("<|im_start|>assistant" in t for t in texts) >= 6  # chat turns in the model's markers
    assert sum("def " in t or "fn main" in t or "#include" in t for t in texts) >= 3  # code
    assert any("Москва" in t for t in texts) and any("東京" in t for t in texts)  # languages
    llama3 = corpus.builtin("<|start_header_id|>")
    assert any("<|start_header_id|>assistant" in t for t in llama3)
    assert all("User:" not in t for t in texts)


def test_calib_file(tmp_path: Path) -> None:
    p = tmp_path / "c.txt"
    p.write_text("one two\nthree\n\n\nfour five\n", encoding="utf-8")
    assert corpus.from_file(str(p)) == ["one two\nthree", "four five"]
    (tmp_path / "e.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ExportError, match="no text"):
        corpus.from_file(str(tmp_path / "e.txt"))
    with pytest.raises(ExportError, match="cannot read"):
        corpus.from_file(str(tmp_path / "missing.txt"))


def _loop(c: object, paths: dict[str, str], w: dict[str, np.ndarray]) -> Loop:
    man = {"params": {k: getattr(c, k) for k in ("hidden", "head_dim", "n_kv_heads", "n_layers")}}
    man["params"].update(rope_theta=c.rope_theta, rope_scaling=c.rope_scaling)  # type: ignore[attr-defined]
    graphs = {r: cpu_graph(p) for r, p in paths.items()}
    graphs.setdefault("lmhead", graphs["decode"])
    return Loop(man, "", graphs, neg_override=CALIB_MASK, embed=w["token_embd.weight"])


@pytest.mark.parametrize("bits", [8, 4])
def test_per_channel_qdq(tmp_path: Path, bits: int) -> None:
    c = tiny_config("qwen2")
    w = tiny_weights(c, 4)
    sp = specs(c, "t", 4, 32, "window", True)
    paths = {}
    for role in ("prefill", "decode"):
        paths[role] = str(tmp_path / f"{role}.onnx")
        save(layer_graph(c, lambda n: w[n], sp[role], GraphOptions(quantized=True)), paths[role])
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, c.vocab, 12)) for _ in range(6)]
    dst = str(tmp_path / "decode.qdq.onnx")
    ranges, _ = minmax(paths["decode"], feeds_stream(lambda: _loop(c, paths, w), seqs, "decode", 40))
    quantize(paths["decode"], dst, ranges, bits, True)
    m = onnx.load(dst)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    mm_weights = 0
    for n in m.graph.node:
        if n.op_type != "MatMul":
            continue
        (dq,) = [d for d in m.graph.node if d.output[0] == n.input[1]] or [None]
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue  # an activation x activation MatMul (attention)
        attrs = {a.name: a.i for a in dq.attribute}
        if bits == 4:  # LPBQ: int4 blocks of 32 rows, scales from a uint8 (1..15) x per-channel DQ
            q, zp = inits[dq.input[0]], inits[dq.input[2]]
            assert attrs == {"axis": 0, "block_size": 32} and not np.any(zp)
            assert q.dtype == onnx.helper.tensor_dtype_to_np_dtype(onnx.TensorProto.INT4)
            (sdq,) = [d for d in m.graph.node if d.output[0] == dq.input[1]]
            k, ch = inits[sdq.input[0]], inits[sdq.input[1]]
            assert k.dtype == np.uint8 and k.min() >= 1 and k.max() <= 15
            assert k.shape == (q.shape[0] // 32, q.shape[1]) and ch.shape == (q.shape[1],)
        else:
            q, scale, zp = (inits[dq.input[k]] for k in range(3))
            assert attrs["axis"] == 1 and scale.shape == (q.shape[1],) and not np.any(zp)
            assert q.dtype == np.int8
        mm_weights += 1
    assert mm_weights == 7 * c.n_layers
    # mixed precision: a tensor between float nodes only (the residual stream, inside the RMSNorms)
    # is never quantized
    props = {p.key: p.value for p in onnx.load(paths["decode"]).metadata_props}
    floats = set(json.loads(props[FLOAT_NODES_KEY]))
    quantized = {x.input[0] for x in m.graph.node if x.op_type == "QuantizeLinear"}
    adds = [n for n in m.graph.node if n.name in floats and n.op_type == "Add"]
    users = {n.name: [u for u in m.graph.node if n.output[0] in u.input] for n in adds}
    inner = [a for a in adds if users[a.name] and all(u.name in floats for u in users[a.name])]
    assert inner and not any(a.output[0] in quantized for a in inner)
    quant = fixed_point_io(dst)
    m = onnx.load(dst)
    io = {i.name: i.type.tensor_type.elem_type for i in (*m.graph.input, *m.graph.output)}
    assert set(quant) == set(io) and all(t == onnx.TensorProto.UINT16 for t in io.values())
    assert quant["cmask"][0] * -quant["cmask"][1] == pytest.approx(-CALIB_MASK, rel=1e-3)  # 0 exact


def test_quantized_decode_tracks_float(tmp_path: Path) -> None:
    """The w8a16 decode graph (fixed-point I/O) on ORT's CPU EP stays close to the float graph."""
    c = tiny_config("llama")
    w = tiny_weights(c, 4)
    sp = specs(c, "t", 4, 32, "none", True)
    paths = {"decode": str(tmp_path / "decode.onnx")}
    save(layer_graph(c, lambda n: w[n], sp["decode"], GraphOptions(quantized=True)), paths["decode"])
    rng = np.random.default_rng(1)
    seqs = [list(rng.integers(0, c.vocab, 16)) for _ in range(8)]
    dst = str(tmp_path / "decode.qdq.onnx")
    ranges, _ = minmax(paths["decode"], feeds_stream(lambda: _loop(c, paths, w), seqs, "decode", 100))
    quantize(paths["decode"], dst, ranges, 8, False)
    quant = fixed_point_io(dst)
    from qhx_export.verify.loop import Graph

    f, q = _loop(c, paths, w), _loop(c, paths, w)
    import onnxruntime as ort

    q.dec = q.graphs["decode"] = Graph(ort.InferenceSession(dst, providers=["CPUExecutionProvider"]), quant)
    q.reset()
    for t in seqs[0][:10]:
        f.decode_step(int(t))
        q.decode_step(int(t))
    assert f.hidden is not None and q.hidden is not None
    err = np.abs(f.hidden - q.hidden).max() / np.abs(f.hidden).max()
    assert err < 0.05, err


def test_lpbq_blocks_hold_every_value() -> None:
    """The block form the HTP runs: 4-bit multipliers k (1..15) of a per-channel scale, no value
    clipped, each within half a step of its block's scale; a block of small weights keeps a
    finer step than per-channel int4 would give it."""
    from qhx_export.quant.lpbq import block_int4

    rng = np.random.default_rng(3)
    w = rng.standard_normal((128, 24)).astype(np.float32) * 0.02
    w[5, 3] = 0.9  # an outlier in block 0 of column 3
    q, k, ch = block_int4(w)
    assert q.min() >= -8 and q.max() <= 7 and k.min() >= 1 and k.max() <= 15
    scale = np.repeat(ch[None, :] * k, 32, axis=0)
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-7)
    assert k[1:, 3].max() < k[0, 3] == 15  # the other blocks of column 3 are not at the outlier's step
    err_block = np.abs(q * scale - w)[32:, 3].max()
    per_channel = np.abs(w[:, 3]).max() / 7
    assert err_block < per_channel / 4
    with pytest.raises(ExportError, match="multiple of the block"):
        block_int4(w[:100])


def test_fp16_weights_stay_out_of_quantization(tmp_path: Path) -> None:
    """--fp16-weights attn_v: the V projections (and their bias adds) are not quantized; every
    other MatMul weight is."""
    c = tiny_config("qwen2")
    w = tiny_weights(c, 4)
    sp = specs(c, "t", 4, 32, "window", True)
    src = str(tmp_path / "decode.onnx")
    save(
        layer_graph(c, lambda n: w[n], sp["decode"], GraphOptions(quantized=True, fp16_weights=("attn_v",))),
        src,
    )
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, c.vocab, 12)) for _ in range(4)]
    ranges, _ = minmax(src, feeds_stream(lambda: _loop(c, {"decode": src}, w), seqs, "decode", 20))
    dst = str(tmp_path / "decode.qdq.onnx")
    quantize(src, dst, ranges, 8, False)
    m = onnx.load(dst)
    inits = {i.name: i for i in m.graph.initializer}
    made_by = {o: n for n in m.graph.node for o in n.output}
    float_w = [n for n in m.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    dq_w = [
        n
        for n in m.graph.node
        if n.op_type == "MatMul"
        and made_by.get(n.input[1]) is not None
        and made_by[n.input[1]].op_type == "DequantizeLinear"
        and made_by[n.input[1]].input[0] in inits
    ]
    assert len(float_w) == c.n_layers and len(dq_w) == 6 * c.n_layers
    for n in float_w:
        assert inits[n.input[1]].data_type == onnx.TensorProto.FLOAT
        assert list(inits[n.input[1]].dims) == [c.hidden, c.kv_rows]
