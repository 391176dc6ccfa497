"""Genie bundles (--format genie): split graphs, quantized graph I/O, option errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from qhx_export.graphs import GraphOptions

from .conftest import tiny_config, tiny_weights
from .test_cli import check_error, run


def _feeds(c: object, ar: int, cl: int, seed: int = 0) -> dict[str, np.ndarray]:
    from qhx_export.graphs.genie import MASK_NEG, io_spec

    rng = np.random.default_rng(seed)
    half = c.head_dim // 2  # type: ignore[attr-defined]
    ang = (np.arange(3, 3 + ar)[:, None] * 10000.0 ** (-np.arange(half) / half)[None]).astype(np.float32)
    mask = np.full((1, 1, ar, cl), MASK_NEG, np.float32)
    mask[0, 0, :, :3] = 0.0  # three cached tokens, then the causal chunk
    mask[0, 0, :, cl - ar :] = np.where(np.tril(np.ones((ar, ar))) > 0, 0.0, MASK_NEG)
    feed = {
        "input_ids": np.array([[1, 5, 9, 13][:ar]], np.int32),
        "attention_mask": mask,
        "position_ids_cos": np.cos(ang).reshape(1, 1, ar, half),
        "position_ids_sin": np.sin(ang).reshape(1, 1, ar, half),
    }
    for name, _, dims in io_spec(c, ar, cl)[0]:  # type: ignore[arg-type]
        if name.startswith("past_"):
            feed[name] = rng.standard_normal(dims).astype(np.float32)
    return feed


@pytest.mark.parametrize("quantized", [False, True])
def test_split_graphs_chain_to_the_whole(quantized: bool) -> None:
    """Two splits (layer 0 | layer 1 + head), the hidden state passed by name, compute what the
    one-graph variant does, K/V outputs included; split 1 takes input_ids, split 2 the hidden."""
    import onnxruntime as ort

    from qhx_export.graphs.genie import SPLIT_HIDDEN, genie_graph, split_layers

    c = tiny_config("qwen2", n_layers=3)
    w = tiny_weights(c, 5)
    wf = lambda n: np.asarray(w[n], np.float32)  # noqa: E731
    ar, cl = 4, 16
    o = GraphOptions(quantized=quantized)
    feed = _feeds(c, ar, cl)

    def run_graph(m: object, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
        names = [o.name for o in s.get_outputs()]
        return dict(zip(names, s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()}), strict=True))

    whole = run_graph(genie_graph(c, wf, "g", ar, cl, o), feed)
    parts = split_layers(c.n_layers, 2)
    assert parts == [[0], [1, 2]] or parts == [[0, 1], [2]]
    got: dict[str, np.ndarray] = {}
    for s, layers in enumerate(parts, start=1):
        m = genie_graph(c, wf, f"g{s}", ar, cl, o, layers, s, 2)
        ins = {i.name for i in m.graph.input}
        outs = {t.name for t in m.graph.output}
        assert ("input_ids" in ins) == (s == 1)
        assert (SPLIT_HIDDEN.format(1) in ins) == (s == 2)
        assert ("logits" in outs) == (s == 2) and (SPLIT_HIDDEN.format(1) in outs) == (s == 1)
        assert {n for n in ins if n.startswith("past_key_")} == {f"past_key_{i}_in" for i in layers}
        got.update(run_graph(m, {**feed, **got}))
    for name, v in whole.items():
        np.testing.assert_allclose(got[name], v, atol=1e-5, err_msg=name)


def test_io_ranges_tied_and_unioned() -> None:
    """Genie binds one quantization per tensor name: ranges are unioned over the variants, a
    layer's past_*_in / past_*_out share one (uint8), the mask is [-1000, 0], cos/sin [-1, 1]."""
    from qhx_export.write.genie import GenieGraph, io_ranges

    a, b = GenieGraph("prompt", 4, 1, [0]), GenieGraph("token", 1, 1, [0])
    io = {
        "prompt": ["attention_mask", "position_ids_cos", "past_key_0_in", "past_key_0_out", "logits"],
        "token": ["attention_mask", "position_ids_cos", "past_key_0_in", "past_key_0_out", "logits"],
    }
    ranges = {
        "prompt": {
            "attention_mask": (-1000.0, 0.0),
            "position_ids_cos": (-0.5, 1.0),
            "past_key_0_in": (-1.0, 2.0),
            "past_key_0_out": (-3.0, 1.0),
            "logits": (-4.0, 5.0),
        },
        "token": {
            "attention_mask": (-1000.0, 0.0),
            "position_ids_cos": (0.0, 1.0),
            "past_key_0_in": (-2.0, 6.0),
            "past_key_0_out": (0.5, 1.0),
            "logits": (-7.0, 2.0),
        },
    }
    got = io_ranges([a, b], ranges, io)
    assert got["past_key_0_in"] == got["past_key_0_out"] == (8, -3.0, 6.0)
    assert got["logits"] == (16, -7.0, 5.0)
    assert got["attention_mask"] == (16, -1000.0, 0.0)
    assert got["position_ids_cos"] == (16, -1.0, 1.0)


@pytest.mark.parametrize(
    ("more", "needle"),
    [
        (["--genie-splits", "0"], "--genie-splits 0: must be positive"),
        (["--genie-splits", "3"], "--genie-splits 3: the model has 2 layers"),
        (["--genie-splits", "x"], "--genie-splits"),
    ],
)
def test_bad_genie_splits(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    more: list[str],
    needle: str,
) -> None:
    out = tmp_path / "b"
    rc, _, err = run(
        [str(tiny_gguf()), "-o", str(out), "--format", "genie", "--ar", "4", "--ctx", "16", *more], capsys
    )
    check_error(rc, err, 1, needle)
    assert not out.exists() and not (tmp_path / "b.partial").exists()


def test_genie_splits_needs_genie_format(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run([str(tiny_gguf()), "-o", str(tmp_path / "b"), "--genie-splits", "2"], capsys)
    check_error(rc, err, 1, "--genie-splits 2 needs --format genie or both")
    assert not (tmp_path / "b").exists()


def _export(args: list[str], capsys: pytest.CaptureFixture[str]) -> Path:
    pytest.importorskip("onnxruntime_qnn")
    rc, out, err = run(args, capsys)
    assert rc == 0, err
    return Path(out.strip().splitlines()[-1]).parent


@pytest.mark.parametrize("precision", ["w8a16", "w4a16"])
def test_quantized_genie_io(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    """A w8a16 / w4a16 Genie bundle: fixed-point graph I/O as AI Hub's bundles have it (KV uint8 with each
    layer's _in / _out quantization identical in every graph, mask uint16 over [-1000, 0] so raw 0
    is masked and raw 65535 attends, cos/sin/logits uint16, input_ids int32), and the same
    quantization for a tensor in every graph that binds it."""
    import onnx

    calib = tmp_path / "calib.txt"
    calib.write_text("the quick brown fox jumps over the lazy dog\n\nhello world, hello again\n")
    args = ["--format", "genie", "--precision", precision, "--ar", "4", "--ctx", "16"]
    out = _export(
        [str(tiny_gguf()), "-o", str(tmp_path / "b"), *args, "--calib", str(calib), "--calib-steps", "8"],
        capsys,
    )
    src = json.loads((out / "genie-source.json").read_text())
    assert src["precision"] == precision and src["splits"] == 1
    assert [g["name"].rstrip("_") for g in src["graphs"]] == [
        "prompt_ar4_cl16_1_of_1",
        "token_ar1_cl16_1_of_1",
    ]
    seen: dict[str, list[float]] = {}
    for g in src["graphs"]:
        assert g["precision"] in ("quant", "mixed")
        q = g["quant"]
        for i in range(2):
            for kv in ("key", "value"):
                assert q[f"past_{kv}_{i}_in"] == q[f"past_{kv}_{i}_out"]
                assert -255 <= q[f"past_{kv}_{i}_in"][1] <= 0  # uint8 offset
        scale, offset = q["attention_mask"]
        assert offset == -65535 and abs(scale * 65535 - 1000.0) < 1e-3
        assert "input_ids" not in q
        for k, v in q.items():
            assert seen.setdefault(k, v) == v, k
        wrapper = onnx.load(str(out / g["wrapper"]))
        types = {v.name: v.type.tensor_type.elem_type for v in (*wrapper.graph.input, *wrapper.graph.output)}
        T = onnx.TensorProto
        assert types["input_ids"] == T.INT32
        assert types["past_key_0_in"] == types["past_value_1_out"] == T.UINT8
        assert types["attention_mask"] == types["position_ids_cos"] == types["logits"] == T.UINT16
    cfg = json.loads((out / "genie_config.json").read_text())
    assert cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] == [g["bin"] for g in src["graphs"]]


def test_split2_genie_bundle(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--genie-splits 2: four binaries in Genie's order (prompt splits, then token splits), each
    graph renamed inside its binary, the hidden state bound by name between the splits."""
    import onnx

    args = ["--format", "genie", "--genie-splits", "2", "--ar", "4", "--ctx", "16", "--name", "t"]
    out = _export([str(tiny_gguf()), "-o", str(tmp_path / "b"), *args], capsys)
    cfg = json.loads((out / "genie_config.json").read_text())
    names = [
        "prompt_ar4_cl16_1_of_2",
        "prompt_ar4_cl16_2_of_2",
        "token_ar1_cl16_1_of_2",
        "token_ar1_cl16_2_of_2",
    ]
    assert cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] == [f"t_{n}_qnn.bin" for n in names]
    src = json.loads((out / "genie-source.json").read_text())
    assert [g["layers"] for g in src["graphs"]] == [[0], [1], [0], [1]]
    for g, n in zip(src["graphs"], names, strict=True):
        assert g["name"].rstrip("_") == n
        assert g["name"].encode() in (out / g["bin"]).read_bytes()
        w = onnx.load(str(out / g["wrapper"]))
        ins = {v.name for v in w.graph.input}
        outs = {v.name for v in w.graph.output}
        if g["split"] == 1:
            assert "input_ids" in ins and "hidden_states_split_1" in outs and "logits" not in outs
        else:
            assert "hidden_states_split_1" in ins and "logits" in outs and "input_ids" not in ins
