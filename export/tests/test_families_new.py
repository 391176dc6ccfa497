"""Qwen3, Gemma 3 and LFM2: config reading (HF and Gemma 3 GGUF), tensor checks, the numpy
forwards against transformers goldens (data/, made by data/make_family_goldens.py), and the
emulator bundles' header, graph I/O, weights and manifest `layers` section."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from qhx_export import ExportError
from qhx_export.cli import main
from qhx_export.families import Config, registered
from qhx_export.families.config import f32_value
from qhx_export.families.lfm2 import causal_conv, effective_ffn
from qhx_export.read import open_checkpoint
from qhx_export.write.emu import read_context

from .conftest import tiny_weights, write_gguf

DATA = Path(__file__).parent / "data"
NEW = ["qwen3", "gemma3", "lfm2"]
GEMMA_GGUF = Path(
    os.environ.get("QHX_CACHE", os.path.expanduser("~/.cache/qhx")), "assets/gemma3/gemma-3-270m-q4_k_m.gguf"
)


def hf_copy(tmp_path: Path, family: str) -> Path:
    """A golden HF directory plus the tokenizer files a bundle needs."""
    d = tmp_path / family
    shutil.copytree(DATA / family, d)
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    return d


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def one_line_error(rc: int, err: str, want_rc: int, needle: str) -> None:
    assert rc == want_rc, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("qhx-export: error: " if want_rc == 1 else "qhx-export: not implemented: "), err
    assert needle in last, (needle, last)


def emu_args(src: Path, out: Path, *more: str) -> list[str]:
    return [str(src), "-o", str(out), "--target", "emu", "--ar", "4", "--ctx", "16", *more]


# ---- the reference forwards against transformers -----------------------------------------------


@pytest.mark.parametrize("family", NEW)
def test_forward_matches_transformers_golden(family: str) -> None:
    ck = open_checkpoint(str(DATA / family))
    assert ck.family.name == family
    golden = json.loads((DATA / family / "golden.json").read_text())
    ref = np.asarray(golden["logits"], np.float32)
    trace: dict[str, float] = {}
    out = ck.family.forward(ck.config, ck.weights(), golden["ids"], trace)
    assert out.shape == ref.shape == (len(golden["ids"]), ck.config.vocab)
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
    assert trace["residual_max"] > 0


def test_gemma3_window_matters() -> None:
    """The golden runs past the window of 4: a full-attention forward would differ."""
    ck = open_checkpoint(str(DATA / "gemma3"))
    ids = json.loads((DATA / "gemma3" / "golden.json").read_text())["ids"]
    c = ck.config
    wide = dataclasses.replace(c, sliding_window=len(ids))
    a = ck.family.forward(c, ck.weights(), ids)
    b = ck.family.forward(wide, ck.weights(), ids)
    np.testing.assert_array_equal(a[:4], b[:4])
    assert np.abs(a[4:] - b[4:]).max() > 1e-3


def test_lfm2_conv_decode_equals_prefill() -> None:
    """The emulator's decode recurrence (state' = [s1, s2, bx_t]; out = sum_k w[:, k] * state')
    gives the prefill's causal convolution, seeded from the last W rows of conv_bx."""
    rng = np.random.default_rng(1)
    T, H, W = 9, 5, 3
    bx = rng.standard_normal((T, H)).astype(np.float32)
    k = rng.standard_normal((H, W)).astype(np.float32)
    full = causal_conv(bx, k)
    state = np.zeros((H, W), np.float32)
    for t in range(T):
        state = np.concatenate([state[:, 1:], bx[t][:, None]], axis=1)
        np.testing.assert_allclose((k * state).sum(1), full[t], atol=1e-6)
    np.testing.assert_array_equal(state, bx[-W:].T)  # the host's seed from conv_bx


# ---- config reading ---------------------------------------------------------------------------------


def test_hf_configs() -> None:
    g = open_checkpoint(str(DATA / "gemma3")).config
    assert g.types == ("sliding_attention", "sliding_attention", "full_attention")
    assert (g.sliding_window, g.rope_theta, g.rope_local_theta, g.act) == (4, 1e6, 10000.0, "gelu_tanh")
    assert g.score_scale == pytest.approx(12**-0.5) and g.tied and g.qk_norm
    lf = open_checkpoint(str(DATA / "lfm2")).config
    assert lf.types == ("conv", "full_attention", "conv") and lf.attn_layers == [1]
    assert (lf.conv_width, lf.ffn, lf.rms_eps, lf.rope_theta) == (3, 48, 1e-5, 1e6)
    q = open_checkpoint(str(DATA / "qwen3")).config
    assert q.layer_types is None and q.qk_norm and q.attn_scale is None


def test_lfm2_effective_ffn() -> None:
    # LFM2-350M's config: 6656 -> 2/3 -> x1.0 -> a multiple of 256 = 4608 (its w1 rows)
    cfg = {
        "intermediate_size": 6656,
        "block_auto_adjust_ff_dim": True,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
    }
    assert effective_ffn(cfg, "x") == 4608
    assert effective_ffn({"intermediate_size": 6656}, "x") == 6656


def edit_config(tmp_path: Path, family: str, **over: object) -> Path:
    d = hf_copy(tmp_path, family)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(over)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    ("family", "over", "needle"),
    [
        ("lfm2", {"layer_types": ["conv", "mamba", "conv"]}, "layer 1 has type 'mamba'; lfm2 supports"),
        (
            "gemma3",
            {"layer_types": ["sliding_attention", "conv", "full_attention"]},
            "layer 1 has type 'conv'",
        ),
        ("gemma3", {"layer_types": ["full_attention"]}, "layer_types lists 1 layers, the model has 3"),
        ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping is set"),
        ("lfm2", {"conv_bias": True}, "conv_bias is set"),
        ("qwen3", {"use_sliding_window": True}, "sliding-window attention is not supported"),
        (
            "lfm2",
            {"intermediate_size": 40},
            "blk.0.ffn_gate.weight has shape [48, 32], lfm2 expects [40, 32]",
        ),
    ],
)
def test_hf_config_errors(tmp_path: Path, family: str, over: dict[str, object], needle: str) -> None:
    with pytest.raises(ExportError, match="config.json: |/" + family) as e:
        open_checkpoint(str(edit_config(tmp_path, family, **over)))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("family", "drop", "needle"),
    [
        ("lfm2", "model.layers.0.conv.conv.weight", "missing tensor blk.0.shortconv.conv.weight"),
        (
            "gemma3",
            "model.layers.2.post_feedforward_layernorm.weight",
            "missing tensor blk.2.post_ffw_norm.weight",
        ),
        ("lfm2", "model.layers.1.self_attn.q_layernorm.weight", "missing tensor blk.1.attn_q_norm.weight"),
    ],
)
def test_missing_tensor(tmp_path: Path, family: str, drop: str, needle: str) -> None:
    d = hf_copy(tmp_path, family)
    t = load_file(str(d / "model.safetensors"))
    del t[drop]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ExportError, match=needle.replace(".", r"\.")):
        open_checkpoint(str(d))


def test_wrong_shape_and_stray_tensor(tmp_path: Path) -> None:
    d = hf_copy(tmp_path, "lfm2")
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.0.conv.conv.weight"] = np.zeros((32, 1, 4), np.float16)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(
        ExportError, match=r"blk\.0\.shortconv\.conv\.weight has shape \[32, 4\], lfm2 expects"
    ):
        open_checkpoint(str(d))
    t["model.layers.0.conv.conv.weight"] = np.zeros((32, 1, 3), np.float16)
    t["model.layers.0.self_attn.q_proj.weight"] = np.zeros((32, 32), np.float16)  # a conv layer
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ExportError, match=r"tensor blk\.0\.attn_q\.weight is not part of a lfm2 model"):
        open_checkpoint(str(d))


def tiny_gemma3(**over: object) -> Config:
    base: dict[str, object] = dict(
        family="gemma3",
        hidden=64,
        n_layers=6,
        n_heads=4,
        n_kv_heads=1,
        head_dim=32,
        ffn=96,
        vocab=300,
        rms_eps=1e-6,
        rope_theta=1e6,
        rope_scaling=None,
        tied=True,
        max_ctx=256,
        qkv_bias=False,
        qk_norm=True,
        layer_types=("sliding_attention",) * 5 + ("full_attention",),
        sliding_window=3,
        rope_local_theta=10000.0,
        attn_scale=f32_value(32**-0.5),
        act="gelu_tanh",
        post_norms=True,
        norm_offset=1.0,
    )
    base.update(over)
    return Config(**base)  # type: ignore[arg-type]


def test_gemma3_gguf(tmp_path: Path) -> None:
    """A GGUF stores Gemma norms as 1 + w (llama.cpp's converter); the reader hands back w, the
    config comes from gemma3.* keys and llama.cpp's every-6th-layer-full rule."""
    c = tiny_gemma3()
    fam = registered()["gemma3"]
    w = tiny_weights(c)
    for n in w:
        if n.endswith("norm.weight"):
            w[n] = (w[n] - 1.0).astype(np.float32)  # HF-style offsets around 0
    stored = {n: fam.to_gguf_values(n, a, c) for n, a in w.items()}
    path = write_gguf(tmp_path / "g.gguf", c, stored)
    ck = open_checkpoint(str(path))
    assert ck.family is fam
    assert ck.config == c
    np.testing.assert_array_equal(ck.float32("blk.3.post_ffw_norm.weight"), w["blk.3.post_ffw_norm.weight"])
    ids = [5, 9, 1, 40, 7, 7, 3]
    np.testing.assert_allclose(fam.forward(c, ck.weights(), ids), fam.forward(c, w, ids), atol=1e-5)


@pytest.mark.skipif(not GEMMA_GGUF.is_file(), reason="scripts/fetch-assets.sh gemma3 not run")
def test_gemma3_270m_gguf_config() -> None:
    c = open_checkpoint(str(GEMMA_GGUF)).config
    assert (c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn) == (640, 18, 4, 1, 256, 2048)
    assert c.types.count("full_attention") == 3 and c.types[5] == "full_attention"
    assert (c.sliding_window, c.rope_theta, c.rope_local_theta) == (512, 1e6, 10000.0)
    assert c.score_scale == pytest.approx(256**-0.5) and c.tied


# ---- emulator bundles ---------------------------------------------------------------------------


def bundle(tmp_path: Path, family: str, capsys: pytest.CaptureFixture[str], *more: str) -> Path:
    out = tmp_path / f"b-{family}"
    rc, err = run(emu_args(hf_copy(tmp_path, family), out, "--name", family, *more), capsys)
    assert rc == 0, err
    return out


def io_names(g: dict[str, object], side: str) -> list[str]:
    return [t["name"] for t in g[side]]  # type: ignore[index, union-attr]


def weights_of(path: Path) -> dict[str, np.ndarray]:
    hdr, d, blob = read_context(str(path))
    out = {}
    for e in hdr["weights"]:
        assert e["enc"] == "f32"
        out[e["name"]] = np.frombuffer(blob, "<f4", e["nbytes"] // 4, d + e["offset"]).reshape(e["shape"])
    return out


def test_qwen3_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bundle(tmp_path, "qwen3", capsys)
    hdr, _, _ = read_context(str(out / "qwen3_decode.bin"))
    assert hdr["model"]["arch"] == "qwen3"
    assert not {"layer_types", "attn_scale", "act", "sliding_window", "conv_width"} & hdr["model"].keys()
    assert "blk.1.attn_k_norm.weight" in {w["name"] for w in hdr["weights"]}
    man = json.loads((out / "qwen3.json").read_text())
    assert man["model"]["arch"] == "qwen3" and "layers" not in man
    assert man["plan"]["op"] == "qwen3_generate"  # QHexRT's host-op name for Qwen3 (2916cc2)


def test_gemma3_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bundle(tmp_path, "gemma3", capsys, "--io", "f16", "--embed-dtype", "f32")
    ck = open_checkpoint(str(DATA / "gemma3"))
    c = ck.config
    hdr, _, _ = read_context(str(out / "gemma3_decode.bin"))
    m = hdr["model"]
    assert m["arch"] == "gemma3" and m["layer_types"] == list(c.types) and m["sliding_window"] == 4
    assert m["act"] == "gelu_tanh" and m["attn_scale"] == pytest.approx(12**-0.5, rel=1e-7)
    dec = hdr["graphs"][0]
    assert io_names(dec, "inputs")[:7] == [
        "x",
        "cos",
        "sin",
        "cmask",
        "cos_local",
        "sin_local",
        "cmask_local",
    ]
    assert io_names(dec, "outputs") == ["y"] + [f"new_{k}_{i}" for i in range(3) for k in "kv"]
    pre, _, _ = read_context(str(out / "gemma3_prefill.bin"))
    dims = {t["name"]: t["dims"] for t in pre["graphs"][0]["inputs"]}
    assert dims["cmask_local"] == dims["cmask"] == [4, 4] and dims["cos_local"] == [4, 8]
    # norms are written as the multipliers 1 + w; everything else as read
    blk = weights_of(out / "gemma3_decode.bin")
    w = ck.weights()
    norms = ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "attn_q_norm", "attn_k_norm"]
    for n in (f"blk.{i}.{k}.weight" for i in range(3) for k in norms):
        np.testing.assert_array_equal(blk[n], w[n] + np.float32(1.0))
    np.testing.assert_array_equal(blk["blk.0.attn_q.weight"], w["blk.0.attn_q.weight"])
    head = weights_of(out / "gemma3_lmhead.bin")
    np.testing.assert_array_equal(head["output_norm.weight"], w["output_norm.weight"] + np.float32(1.0))
    np.testing.assert_array_equal(head["token_embd.weight"], w["token_embd.weight"])  # unscaled
    # the host table is pre-scaled by float32(sqrt(hidden))
    emb = np.fromfile(out / "gemma3_embed_f32.bin", "<f4").reshape(c.vocab, c.hidden)
    np.testing.assert_array_equal(emb, w["token_embd.weight"] * np.float32(math.sqrt(c.hidden)))
    man = json.loads((out / "gemma3.json").read_text())
    assert man["model"]["arch"] == "gemma3" and man["params"]["rope_theta"] == 1e6
    assert man["layers"] == {
        "types": ["sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 4,
        "rope": {"sliding_attention": {"theta": 10000.0, "cos": "cos_local", "sin": "sin_local"}},
        "masks": {"sliding_attention": "cmask_local"},
    }


def test_gemma3_f16_embed_prescaled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bundle(tmp_path, "gemma3", capsys, "--embed-dtype", "f16")
    w = open_checkpoint(str(DATA / "gemma3")).float32("token_embd.weight")
    emb = np.fromfile(out / "gemma3_embed_f16.bin", "<f2").reshape(w.shape)
    np.testing.assert_array_equal(emb, (w * np.float32(math.sqrt(32))).astype(np.float16))


def test_lfm2_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bundle(tmp_path, "lfm2", capsys, "--io", "f16")
    hdr, _, _ = read_context(str(out / "lfm2_decode.bin"))
    m = hdr["model"]
    assert m["arch"] == "lfm2" and m["layer_types"] == ["conv", "full_attention", "conv"]
    assert m["conv_width"] == 3 and "act" not in m and "attn_scale" not in m
    dec = hdr["graphs"][0]
    ins = {t["name"]: (t["dims"], t["dtype"]) for t in dec["inputs"]}
    outs = {t["name"]: (t["dims"], t["dtype"]) for t in dec["outputs"]}
    assert list(ins) == ["x", "cos", "sin", "cmask", "past_k_1", "past_v_1", "past_conv_0", "past_conv_2"]
    assert list(outs) == ["y", "new_k_1", "new_v_1", "present_conv_0", "present_conv_2"]
    assert ins["past_conv_0"] == outs["present_conv_2"] == ([32, 3], "f16")
    pre, _, _ = read_context(str(out / "lfm2_prefill.bin"))
    g = pre["graphs"][0]
    assert io_names(g, "inputs") == ["x", "cos", "sin", "cmask"]
    assert {t["name"]: t["dims"] for t in g["outputs"]}["conv_bx_2"] == [4, 32]
    shapes = {w["name"]: w["shape"] for w in hdr["weights"]}
    assert shapes["blk.0.shortconv.conv.weight"] == [32, 3]
    assert shapes["blk.2.shortconv.in_proj.weight"] == [96, 32]
    assert "blk.0.attn_q.weight" not in shapes and "blk.1.shortconv.in_proj.weight" not in shapes
    assert "blk.1.attn_q_norm.weight" in shapes
    # the conv kernel as HF's conv.conv.weight [H, 1, 3] squeezed
    hf = load_file(str(DATA / "lfm2" / "model.safetensors"))["model.layers.0.conv.conv.weight"]
    np.testing.assert_array_equal(
        weights_of(out / "lfm2_decode.bin")["blk.0.shortconv.conv.weight"], hf[:, 0]
    )
    man = json.loads((out / "lfm2.json").read_text())
    assert man["model"]["arch"] == "lfm2"
    assert man["layers"] == {
        "types": ["conv", "full_attention", "conv"],
        "state": {
            "conv": {
                "past": "past_conv_{i}",
                "present": "present_conv_{i}",
                "seed": "conv_bx_{i}",
                "width": 3,
            }
        },
    }


@pytest.mark.parametrize(
    ("more", "needle"),
    [(["--verify-rows", "2"], "--verify-rows: lfm2"), (["--prefill", "past"], "--prefill past: lfm2")],
)
def test_lfm2_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: list[str], needle: str
) -> None:
    out = tmp_path / "b"
    rc, err = run(emu_args(hf_copy(tmp_path, "lfm2"), out, *more), capsys)
    one_line_error(rc, err, 1, needle)
    assert not out.exists() and not (tmp_path / "b.partial").exists()


@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
def test_no_genie_bundles(tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str) -> None:
    args = [str(hf_copy(tmp_path, family)), "-o", str(tmp_path / "b"), "--target", "htp", "--format", "genie"]
    rc, err = run(args, capsys)
    one_line_error(rc, err, 2, f"Genie bundles of {family}")


@pytest.mark.parametrize("family", NEW)
def test_config_flags_say_what_the_weights_hold(family: str) -> None:
    """The family facts the graphs and writers read from Config (not from tensor names or the
    family's name): post-norms exactly when the checkpoint has them, the arch qhx_generate runs."""
    ck = open_checkpoint(str(DATA / family))
    c = ck.config
    assert c.post_norms == ("blk.0.post_attention_norm.weight" in ck.family.tensor_shapes(c))
    assert c.post_norms == (family == "gemma3")
    # Gemma's RMSNorms apply 1 + w; every other family's apply w.
    assert c.norm_offset == (1.0 if family == "gemma3" else 0.0)
    assert c.norm_offset_of("blk.0.attn_norm.weight") == c.norm_offset
    assert c.norm_offset_of("blk.0.attn_q.weight") == 0.0
    assert registered()["llama"].norm_offset == 0.0 and registered()["gemma3"].norm_offset == 1.0
    assert (ck.family.host_arch or ck.family.name) == {"qwen3": "qwen2"}.get(family, family)
    assert ck.family.genie_format == (family == "qwen3")
