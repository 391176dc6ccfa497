"""Gemma 3 (text): Gemma3ForCausalLM / HF model_type "gemma3_text", GGUF architecture "gemma3".

Differences from the Llama layer:

* every RMSNorm multiplies by (1 + w), in float32, and there are four per layer:
  h = x + post_attention_norm(attn(attn_norm(x))); out = h + post_ffw_norm(mlp(ffn_norm(h)));
* QK-norm (per head, also 1 + w) before RoPE; scores scaled by query_pre_attn_scalar ** -0.5;
* the MLP is gelu_tanh(gate) * up;
* the embedding is multiplied by sqrt(hidden) (as float32), the lm-head is the plain table;
* layers are "sliding_attention" (a window of `sliding_window` positions, the query's own
  included, RoPE base rope_local_base_freq = 10000) or "full_attention" (RoPE base 1e6). HF
  configs list them in `layer_types`; a GGUF does not: llama.cpp's rule is every 6th layer full.

Internally the norms hold HF's w. llama.cpp's converter stores 1 + w in a GGUF (transformers'
GGUF loader subtracts the 1 again), so the GGUF reader subtracts it and the emulator writer adds
it back: the emulator applies a plain x^ * w and its norm weights are the multipliers 1 + w.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from qhx_export import ExportError
from qhx_export.families.base import Family
from qhx_export.families.config import Config, _float, _int, f32_value
from qhx_export.families.names import LAYER_NAMES, QK_NORM_NAMES
from qhx_export.families.reference import (
    Weights,
    attention,
    gelu_tanh,
    rms_norm,
    rope_tables,
    rotate_half_rope,
)

LOCAL_THETA = 10000.0
SWA_PATTERN = 6  # llama.cpp / HF default: layers 5, 11, ... are full attention

# HF suffix -> GGUF suffix: Llama's, with Gemma's sandwich norms (its post_attention_layernorm
# is the attention output's norm, and the FFN has a norm on each side) and q/k norms.
GEMMA_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    **QK_NORM_NAMES,
}


def _plus_one(name: str) -> bool:
    return name.endswith("norm.weight")


def swa_types(n_layers: int, pattern: int = SWA_PATTERN) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers))


class Gemma3(Family):
    name = "gemma3"
    post_norms = True
    norm_offset = 1.0
    genie_format = False
    gguf_arches: ClassVar[tuple[str, ...]] = ("gemma3",)
    hf_model_types: ClassVar[tuple[str, ...]] = ("gemma3_text",)
    hf_architecture = "Gemma3ForCausalLM"
    emu_arch = "gemma3"
    qk_norm = True

    @classmethod
    def supported_layer_types(cls) -> tuple[str, ...]:
        return ("full_attention", "sliding_attention")

    # ---- config ---------------------------------------------------------------------------------

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any], where: str) -> Config:
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(key) is not None:
                raise ExportError(f"{where}: {key} is set; logit soft-capping is not supported")
        if cfg.get("use_bidirectional_attention"):
            raise ExportError(f"{where}: use_bidirectional_attention is not supported")
        act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
        if act != "gelu_pytorch_tanh":
            raise ExportError(f"{where}: hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")
        rp = cfg.get("rope_parameters")
        if isinstance(rp, Mapping) and "full_attention" in rp:
            full, local = rp.get("full_attention") or {}, rp.get("sliding_attention") or {}
            theta = _float(full, "rope_theta", where, 1_000_000.0)
            local_theta = _float(local, "rope_theta", where, LOCAL_THETA)
            for kind, r in (("full_attention", full), ("sliding_attention", local)):
                if r.get("rope_type", "default") != "default":
                    raise ExportError(
                        f"{where}: rope_parameters.{kind}.rope_type {r.get('rope_type')!r} is not supported"
                    )
        else:
            theta = _float(cfg, "rope_theta", where, 1_000_000.0)
            local_theta = _float(cfg, "rope_local_base_freq", where, LOCAL_THETA)
            if cls.rope_scaling_from_hf(cfg.get("rope_scaling"), where) is not None:
                raise ExportError(f"{where}: rope_scaling is not supported for gemma3")
        base = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling", "hidden_act")}
        base["rope_theta"] = theta
        c = super().config_from_hf(base, where)
        n = c.n_layers
        types = cfg.get("layer_types")
        if types is None:
            types = swa_types(n, _int(cfg, "sliding_window_pattern", where, SWA_PATTERN))
        if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
            raise ExportError(f"{where}: layer_types is {types!r}, expected a list of strings")
        c = dataclasses.replace(
            c,
            layer_types=tuple(types),
            sliding_window=_int(cfg, "sliding_window", where, 4096),
            rope_local_theta=local_theta,
            attn_scale=f32_value(_float(cfg, "query_pre_attn_scalar", where, 256.0) ** -0.5),
            act="gelu_tanh",
            tied=bool(cfg.get("tie_word_embeddings", True)),
        )
        cls.check(c, where)
        return c

    @classmethod
    def config_from_gguf(cls, meta: Mapping[str, Any], shapes: Mapping[str, list[int]], where: str) -> Config:
        a = "gemma3"
        c = super().config_from_gguf(meta, shapes, where)
        pattern = _int(meta, f"{a}.attention.sliding_window_pattern", where, SWA_PATTERN)
        c = dataclasses.replace(
            c,
            layer_types=swa_types(c.n_layers, pattern),
            sliding_window=_int(meta, f"{a}.attention.sliding_window", where),
            rope_local_theta=_float(meta, f"{a}.rope.freq_base_swa", where, LOCAL_THETA),
            # llama.cpp's rule (query_pre_attn_scalar is not in the file): head_dim ** -0.5,
            # except the 27B's hidden / n_heads, which a 27B GGUF would need
            attn_scale=f32_value(c.head_dim**-0.5),
            act="gelu_tanh",
            qk_norm=True,
        )
        cls.check(c, where)
        return c

    @classmethod
    def to_hf_config(cls, c: Config) -> dict[str, Any]:
        out = super().to_hf_config(c)
        del out["hidden_act"], out["rope_scaling"]
        out.update(
            hidden_activation="gelu_pytorch_tanh",
            layer_types=list(c.types),
            sliding_window=c.sliding_window,
            rope_local_base_freq=c.rope_local_theta or LOCAL_THETA,
            query_pre_attn_scalar=round(c.score_scale**-2),  # an int in Gemma3TextConfig
        )
        return out

    @classmethod
    def to_gguf_metadata(cls, c: Config) -> dict[str, Any]:
        out = super().to_gguf_metadata(c)
        out["gemma3.attention.sliding_window"] = c.sliding_window
        return out

    # ---- tensors ------------------------------------------------------------------------------

    @classmethod
    def layer_names(cls, c: Config) -> dict[str, str]:
        return dict(GEMMA_LAYER_NAMES)

    @classmethod
    def tensor_shapes(cls, c: Config) -> dict[str, list[int]]:
        out = super().tensor_shapes(c)
        H = c.hidden
        for i in range(c.n_layers):
            out[f"blk.{i}.post_attention_norm.weight"] = [H]
            out[f"blk.{i}.post_ffw_norm.weight"] = [H]
        return out

    @classmethod
    def from_gguf_values(cls, name: str, arr: np.ndarray, c: Config) -> np.ndarray:
        return (arr - np.float32(1.0)).astype(np.float32) if _plus_one(name) else arr

    @classmethod
    def to_gguf_values(cls, name: str, arr: np.ndarray, c: Config) -> np.ndarray:
        return (arr + np.float32(1.0)).astype(np.float32) if _plus_one(name) else arr

    @classmethod
    def embed_scale(cls, c: Config) -> float:
        return float(np.float32(math.sqrt(c.hidden)))

    # ---- reference forward -----------------------------------------------------------------------

    @classmethod
    def forward(
        cls, c: Config, w: Weights, ids: Sequence[int], trace: dict[str, float] | None = None
    ) -> np.ndarray:
        """float32 logits [T, vocab] of a causal forward over `ids` from position 0."""
        T = len(ids)
        one = np.float32(1.0)

        def norm(x: np.ndarray, name: str) -> np.ndarray:
            return rms_norm(x, w[name] + one, c.rms_eps)

        x = np.asarray(w["token_embd.weight"], np.float32)[np.asarray(ids, np.int64)]
        x = (x * np.float32(cls.embed_scale(c))).astype(np.float32)
        rope = {
            "full_attention": rope_tables(c, T),
            "sliding_attention": rope_tables(c, T, c.rope_local_theta or LOCAL_THETA),
        }
        pos = np.arange(T)
        future = pos[None, :] > pos[:, None]
        hidden = {
            "full_attention": future,
            "sliding_attention": future | (pos[None, :] <= pos[:, None] - (c.sliding_window or T)),
        }
        peak = 0.0
        for i, kind in enumerate(c.types):
            b = f"blk.{i}."
            peak = max(peak, float(np.abs(x).max()))
            h = norm(x, b + "attn_norm.weight")
            q, k, v = Family.project_qkv(c, w, i, h)
            q, k = norm(q, b + "attn_q_norm.weight"), norm(k, b + "attn_k_norm.weight")
            cos, sin = rope[kind]
            q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)
            a = attention(c, q, k, v, hidden[kind]) @ w[b + "attn_output.weight"].T
            x = (x + norm(a, b + "post_attention_norm.weight")).astype(np.float32)
            peak = max(peak, float(np.abs(x).max()))
            n = norm(x, b + "ffn_norm.weight")
            m = gelu_tanh(n @ w[b + "ffn_gate.weight"].T) * (n @ w[b + "ffn_up.weight"].T)
            x = (x + norm(m @ w[b + "ffn_down.weight"].T, b + "post_ffw_norm.weight")).astype(np.float32)
        peak = max(peak, float(np.abs(x).max()))
        if trace is not None:
            trace["residual_max"] = max(trace.get("residual_max", 0.0), peak)
        x = norm(x, "output_norm.weight")
        head = w["token_embd.weight"] if c.tied else w["output.weight"]
        return (x @ np.asarray(head, np.float32).T).astype(np.float32)
