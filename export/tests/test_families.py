"""Families: config mappings, the q/k permutation, and the reference forward against an
independent per-token loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qhx_export import ExportError
from qhx_export.families import Config, registered
from qhx_export.families.names import permute_index, unpermute_index

from .conftest import tiny_config, tiny_weights

FAMILIES = ["llama", "qwen2", "qwen3"]


# ---- the q/k permutation ------------------------------------------------------------------------


def llama_cpp_stored(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Built by hand from the rule "each head's rotate-half pair (i, i + d/2) becomes the adjacent
    rows (2i, 2i + 1)", independently of the package's index arithmetic."""
    rows = w.shape[0]
    d = rows // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(d // 2):
            out[h * d + 2 * i] = w[h * d + i]
            out[h * d + 2 * i + 1] = w[h * d + d // 2 + i]
    return out


@pytest.mark.parametrize(("rows", "heads"), [(64, 4), (32, 2), (8, 1), (96, 3)])
def test_unpermute_inverts_llama_cpp(rows: int, heads: int) -> None:
    hf = np.random.default_rng(rows).standard_normal((rows, 5)).astype(np.float32)
    stored = llama_cpp_stored(hf, heads)
    assert np.array_equal(stored[unpermute_index(rows, heads)], hf)
    assert np.array_equal(hf[permute_index(rows, heads)], stored)
    bias = hf[:, 0].copy()
    assert np.array_equal(llama_cpp_stored(bias[:, None], heads)[:, 0][unpermute_index(rows, heads)], bias)


def test_family_layouts_round_trip() -> None:
    for fam_name in FAMILIES:
        fam = registered()[fam_name]
        c = tiny_config(fam_name)
        for name, w in tiny_weights(c).items():
            back = fam.from_gguf_layout(name, fam.to_gguf_layout(name, w, c), c)
            assert np.array_equal(back, w), name
            moved = not np.array_equal(fam.to_gguf_layout(name, w, c), w)
            permuted = fam_name == "llama" and name.split(".")[-2] in ("attn_q", "attn_k")
            assert moved == permuted, (fam_name, name)
    c = tiny_config("llama")
    w = tiny_weights(c)["blk.0.attn_k.weight"]
    assert np.array_equal(
        registered()["llama"].to_gguf_layout("blk.0.attn_k.weight", w, c), llama_cpp_stored(w, c.n_kv_heads)
    )


def test_unpermute_rejects_odd_head_dim() -> None:
    with pytest.raises(ExportError, match="attn_q"):
        unpermute_index(12, 4, "blk.0.attn_q.weight")


# ---- config mappings ----------------------------------------------------------------------------


@pytest.mark.parametrize("fam_name", FAMILIES)
def test_config_round_trips(fam_name: str) -> None:
    fam = registered()[fam_name]
    c = tiny_config(fam_name)
    assert fam.config_from_hf(fam.to_hf_config(c), "config.json") == c
    assert fam.config_from_gguf(fam.to_gguf_metadata(c), fam.tensor_shapes(c), "x.gguf") == c


def test_config_rejects_bad_shapes() -> None:
    fam = registered()["llama"]
    cfg = fam.to_hf_config(tiny_config("llama"))
    with pytest.raises(ExportError, match="not a multiple of 3 KV heads"):
        fam.config_from_hf({**cfg, "num_key_value_heads": 3}, "config.json")
    with pytest.raises(ExportError, match="rope_scaling type 'yarn'"):
        fam.config_from_hf({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "config.json")
    with pytest.raises(ExportError, match="missing hidden_size"):
        fam.config_from_hf({k: v for k, v in cfg.items() if k != "hidden_size"}, "config.json")
    with pytest.raises(ExportError, match="sliding"):
        registered()["qwen2"].config_from_hf({**cfg, "use_sliding_window": True}, "config.json")


def test_check_tensors_names_the_tensor() -> None:
    fam = registered()["qwen2"]
    c = tiny_config("qwen2")
    shapes = fam.tensor_shapes(c)
    with pytest.raises(ExportError, match=r"blk\.1\.attn_k\.bias"):
        fam.check_tensors(c, {k: v for k, v in shapes.items() if k != "blk.1.attn_k.bias"}, "f")
    with pytest.raises(ExportError, match=r"blk\.0\.ffn_up\.weight has shape \[96, 63\]"):
        fam.check_tensors(c, {**shapes, "blk.0.ffn_up.weight": [96, 63]}, "f")
    with pytest.raises(ExportError, match=r"blk\.0\.ssm_a is not part of a qwen2 model"):
        fam.check_tensors(c, {**shapes, "blk.0.ssm_a": [4]}, "f")


# ---- reference forward vs a per-token loop ---------------------------------------------------------


def loop_inv_freq(c: Config) -> list[float]:
    """Per-dimension RoPE frequencies, llama3 scaling written out from HF's definition."""
    d = c.head_dim
    out = []
    for i in range(d // 2):
        f = c.rope_theta ** (-2.0 * i / d)
        if c.rope_scaling:
            rs = c.rope_scaling
            wl = 2 * math.pi / f
            lo_wl = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
            hi_wl = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
            if wl > lo_wl:
                f = f / rs["factor"]
            elif wl >= hi_wl:
                t = (rs["original_max_position_embeddings"] / wl - rs["low_freq_factor"]) / (
                    rs["high_freq_factor"] - rs["low_freq_factor"]
                )
                f = (1 - t) * f / rs["factor"] + t * f
        out.append(f)
    return out


def norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / math.sqrt(float((x64 * x64).mean()) + eps) * w


def per_token_loop(c: Config, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64, one token at a time with a K/V cache, one head at a time."""
    d, half, g = c.head_dim, c.head_dim // 2, c.n_heads // c.n_kv_heads
    freqs = loop_inv_freq(c)
    cache: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []) for _ in range(c.n_layers)]
    logits = []
    for t, tok in enumerate(ids):
        x = w["token_embd.weight"][tok].astype(np.float64)
        for i in range(c.n_layers):
            b = f"blk.{i}."
            h = norm(x, w[b + "attn_norm.weight"], c.rms_eps)
            proj = {}
            for p in ("q", "k", "v"):
                y = w[f"{b}attn_{p}.weight"].astype(np.float64) @ h
                if c.qkv_bias:
                    y = y + w[f"{b}attn_{p}.bias"]
                proj[p] = y.reshape(-1, d)
            for p in ("q", "k"):
                for j in range(proj[p].shape[0]):
                    v = proj[p][j]
                    if c.qk_norm:
                        v = norm(v, w[f"{b}attn_{p}_norm.weight"], c.rms_eps)
                    r = v.copy()
                    for k in range(half):
                        a, bb = v[k], v[k + half]
                        cs, sn = math.cos(t * freqs[k]), math.sin(t * freqs[k])
                        r[k], r[k + half] = a * cs - bb * sn, bb * cs + a * sn
                    proj[p][j] = r
            keys, vals = cache[i]
            keys.append(proj["k"])
            vals.append(proj["v"])
            out = np.zeros(c.q_rows)
            for j in range(c.n_heads):
                kv = j // g
                s = np.array([proj["q"][j] @ keys[u][kv] / math.sqrt(d) for u in range(t + 1)])
                p = np.exp(s - s.max())
                p /= p.sum()
                out[j * d : (j + 1) * d] = sum(p[u] * vals[u][kv] for u in range(t + 1))
            x = x + w[b + "attn_output.weight"] @ out
            h = norm(x, w[b + "ffn_norm.weight"], c.rms_eps)
            gate = w[b + "ffn_gate.weight"] @ h
            up = w[b + "ffn_up.weight"] @ h
            x = x + w[b + "ffn_down.weight"] @ (gate / (1 + np.exp(-gate)) * up)
        x = norm(x, w["output_norm.weight"], c.rms_eps)
        head = w["token_embd.weight"] if c.tied else w["output.weight"]
        logits.append(head @ x)
    return np.array(logits)


@pytest.mark.parametrize("fam_name", FAMILIES)
def test_reference_forward_matches_per_token_loop(fam_name: str) -> None:
    c = tiny_config(fam_name)
    w = tiny_weights(c, seed=3)
    ids = [5, 17, 200, 3, 99, 42, 7, 150, 11]
    got = registered()[fam_name].forward(c, w, ids)
    want = per_token_loop(c, w, ids)
    assert got.dtype == np.float32 and got.shape == (len(ids), c.vocab)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_llama3_scaling_changes_logits() -> None:
    """The scaled frequencies differ from plain RoPE at positions beyond a few tokens."""
    c = tiny_config("llama")
    w = tiny_weights(c, seed=4)
    ids = list(range(1, 40))
    fam = registered()["llama"]
    plain = fam.forward(Config(**{**c.__dict__, "rope_scaling": None}), w, ids)
    assert not np.allclose(plain, fam.forward(c, w, ids), atol=1e-3)


def test_rope_freqs_tensor_divides_frequencies() -> None:
    """A GGUF's rope_freqs.weight divisors give the same logits as the llama3 parameters."""
    c = tiny_config("llama")
    w = tiny_weights(c, seed=5)
    plain = Config(**{**c.__dict__, "rope_scaling": None})
    base = [c.rope_theta ** (-2.0 * i / c.head_dim) for i in range(c.head_dim // 2)]
    factors = np.array([b / s for b, s in zip(base, loop_inv_freq(c), strict=True)], np.float32)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    fam = registered()["llama"]
    np.testing.assert_allclose(
        fam.forward(plain, {**w, "rope_freqs.weight": factors}, ids), fam.forward(c, w, ids), atol=1e-3
    )
