"""LFM2 (Liquid): a hybrid of gated short-convolution layers and GQA attention layers.

HF model_type "lfm2" (Lfm2ForCausalLM). Per layer (`layer_types`: "conv" or "full_attention"):
h = x + op(operator_norm(x)); out = h + w2(silu(w1(n)) * w3(n)), n = ffn_norm(h). RMSNorm is
the plain x^ * w; the final norm is HF's `model.embedding_norm` (applied after the last layer,
despite the name); embeddings are tied.

* attention layers: q/k/v/out_proj with a per-head RMSNorm of q and k (q_layernorm /
  k_layernorm) before RoPE, scale 1 / sqrt(head_dim);
* conv layers (ShortConv): B, C, x = chunks of in_proj(h) (that order); y = C * conv(B * x)
  with a depthwise causal convolution of width conv_L_cache (3) over positions, zero left
  padding; then out_proj. Decoding keeps the last 3 values of B * x per channel as state.

Internal names follow llama.cpp (blk.N.shortconv.{in_proj,conv,out_proj}.weight, the conv
weight squeezed to [hidden, L]). The FFN width is the effective one (block_auto_adjust_ff_dim
applied).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from qhx_export import ExportError
from qhx_export.families.base import Family
from qhx_export.families.config import Config, _int
from qhx_export.families.reference import (
    Weights,
    attention,
    final_logits,
    rms_norm,
    rope_tables,
    rotate_half_rope,
    swiglu_residual,
)

GLOBALS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.embedding_norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
COMMON = {  # HF suffix -> GGUF suffix, every layer
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
}
ATTN = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
}
CONV = {
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
}


def effective_ffn(cfg: Mapping[str, Any], where: str) -> int:
    """Lfm2MLP's width from intermediate_size and the block_* adjustments."""
    f = _int(cfg, "intermediate_size", where)
    if cfg.get("block_auto_adjust_ff_dim", False):
        f = int(2 * f / 3)
        mult = cfg.get("block_ffn_dim_multiplier")
        if mult is not None:
            f = int(float(mult) * f)
            m = _int(cfg, "block_multiple_of", where, 256)
            f = m * ((f + m - 1) // m)
    return f


def causal_conv(bx: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Depthwise causal convolution: bx [T, H], k [H, L] -> [T, H] with
    out[t, h] = sum_j k[h, j] * bx[t - (L - 1) + j, h] (zero before position 0)."""
    T, L = bx.shape[0], k.shape[1]
    pad = np.concatenate([np.zeros((L - 1, bx.shape[1]), np.float32), bx]).astype(np.float32)
    out = np.zeros_like(bx, dtype=np.float32)
    for j in range(L):
        out += pad[j : j + T] * k[:, j]
    return out.astype(np.float32)


class Lfm2(Family):
    name = "lfm2"
    gguf_arches: ClassVar[tuple[str, ...]] = ()  # HF directories only for now
    hf_model_types: ClassVar[tuple[str, ...]] = ("lfm2",)
    hf_architecture = "Lfm2ForCausalLM"
    emu_arch = "lfm2"
    qk_norm = True
    genie_format = False

    @classmethod
    def supported_layer_types(cls) -> tuple[str, ...]:
        return ("full_attention", "conv")

    # ---- config ---------------------------------------------------------------------------------

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any], where: str) -> Config:
        if cfg.get("conv_bias"):
            raise ExportError(f"{where}: conv_bias is set; LFM2 convolutions with bias are not supported")
        n = _int(cfg, "num_hidden_layers", where)
        types = cfg.get("layer_types")
        if types is None:
            full = cfg.get("full_attn_idxs")
            full = list(range(n)) if full is None else full
            types = ["full_attention" if i in full else "conv" for i in range(n)]
        if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
            raise ExportError(f"{where}: layer_types is {types!r}, expected a list of strings")
        base = dict(cfg)
        base["rms_norm_eps"] = cfg.get("norm_eps", cfg.get("rms_norm_eps", 1e-5))
        base["intermediate_size"] = effective_ffn(cfg, where)
        base["tie_word_embeddings"] = cfg.get("tie_word_embeddings", cfg.get("tie_embedding", True))
        c = super().config_from_hf(base, where)
        c = dataclasses.replace(c, layer_types=tuple(types), conv_width=_int(cfg, "conv_L_cache", where, 3))
        cls.check(c, where)
        return c

    @classmethod
    def check(cls, c: Config, where: str) -> None:
        super().check(c, where)
        if c.conv_width is not None and c.conv_width < 1:
            raise ExportError(f"{where}: conv_L_cache is {c.conv_width}, must be positive")

    @classmethod
    def config_from_gguf(cls, meta: Mapping[str, Any], shapes: Mapping[str, list[int]], where: str) -> Config:
        raise ExportError(f"{where}: LFM2 GGUF files are not read yet; export the HF directory")

    @classmethod
    def to_hf_config(cls, c: Config) -> dict[str, Any]:
        out = super().to_hf_config(c)
        out["norm_eps"] = out.pop("rms_norm_eps")
        out.update(layer_types=list(c.types), conv_L_cache=c.conv_width or 3, block_auto_adjust_ff_dim=False)
        return out

    # ---- tensors ------------------------------------------------------------------------------

    @classmethod
    def layer_names(cls, c: Config) -> dict[str, str]:
        return {**COMMON, **ATTN, **CONV}

    @classmethod
    def gguf_name(cls, hf: str, c: Config) -> str | None:
        if hf in GLOBALS:
            return GLOBALS[hf]
        return None if hf in ("model.norm.weight",) else super().gguf_name(hf, c)

    @classmethod
    def hf_name(cls, name: str, c: Config) -> str:
        for hf, g in GLOBALS.items():
            if g == name:
                return hf
        return super().hf_name(name, c)

    @classmethod
    def hf_tensor_shape(cls, name: str, shape: list[int]) -> list[int]:
        if name.endswith("shortconv.conv.weight") and len(shape) == 3 and shape[1] == 1:
            return [shape[0], shape[2]]  # [H, 1, L] -> [H, L]
        return shape

    @classmethod
    def tensor_shapes(cls, c: Config) -> dict[str, list[int]]:
        H, F = c.hidden, c.ffn
        out: dict[str, list[int]] = {"token_embd.weight": [c.vocab, H], "output_norm.weight": [H]}
        for i, kind in enumerate(c.types):
            b = f"blk.{i}."
            out.update({b + "attn_norm.weight": [H], b + "ffn_norm.weight": [H]})
            if kind == "conv":
                out[b + "shortconv.in_proj.weight"] = [3 * H, H]
                out[b + "shortconv.conv.weight"] = [H, c.conv_width or 3]
                out[b + "shortconv.out_proj.weight"] = [H, H]
            else:
                out[b + "attn_q.weight"] = [c.q_rows, H]
                out[b + "attn_k.weight"] = [c.kv_rows, H]
                out[b + "attn_v.weight"] = [c.kv_rows, H]
                out[b + "attn_output.weight"] = [H, c.q_rows]
                out[b + "attn_q_norm.weight"] = [c.head_dim]
                out[b + "attn_k_norm.weight"] = [c.head_dim]
            out.update(
                {b + "ffn_gate.weight": [F, H], b + "ffn_up.weight": [F, H], b + "ffn_down.weight": [H, F]}
            )
        if not c.tied:
            out["output.weight"] = [c.vocab, H]
        return out

    # ---- reference forward -----------------------------------------------------------------------

    @classmethod
    def forward(
        cls, c: Config, w: Weights, ids: Sequence[int], trace: dict[str, float] | None = None
    ) -> np.ndarray:
        """float32 logits [T, vocab] of a causal forward over `ids` from position 0."""
        T, H = len(ids), c.hidden
        x = np.asarray(w["token_embd.weight"], np.float32)[np.asarray(ids, np.int64)]
        cos, sin = rope_tables(c, T)
        pos = np.arange(T)
        future = pos[None, :] > pos[:, None]
        peak = 0.0
        for i, kind in enumerate(c.types):
            b = f"blk.{i}."
            peak = max(peak, float(np.abs(x).max()))
            h = rms_norm(x, w[b + "attn_norm.weight"], c.rms_eps)
            if kind == "conv":
                bcx = h @ w[b + "shortconv.in_proj.weight"].T
                gate_b, gate_c, xs = bcx[:, :H], bcx[:, H : 2 * H], bcx[:, 2 * H :]
                y = gate_c * causal_conv(gate_b * xs, w[b + "shortconv.conv.weight"])
                x = x + y @ w[b + "shortconv.out_proj.weight"].T
            else:
                q, k, v = Family.project_qkv(c, w, i, h)
                q = rms_norm(q, w[b + "attn_q_norm.weight"], c.rms_eps)
                k = rms_norm(k, w[b + "attn_k_norm.weight"], c.rms_eps)
                q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)
                x = x + attention(c, q, k, v, future) @ w[b + "attn_output.weight"].T
            x = x.astype(np.float32)
            peak = max(peak, float(np.abs(x).max()))
            x = swiglu_residual(c, w, b, x)
        return final_logits(c, w, x, peak, trace)
