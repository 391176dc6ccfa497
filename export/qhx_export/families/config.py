"""A decoder's resolved config, in one shape whichever reader (GGUF metadata, HF config.json)
made it, and the typed reads of metadata those readers share."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from qhx_export import ExportError


def f32_value(v: float) -> float:
    """A float as the shortest decimal that round-trips through f32 (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(v)))


@dataclass(frozen=True)
class Config:
    """A checkpoint's resolved architecture, the same whichever format it came from."""

    family: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # llama3 keys as HF names them, or None
    tied: bool  # lm-head shares token_embd.weight
    max_ctx: int | None  # trained context (max_position_embeddings / context_length)
    qkv_bias: bool
    qk_norm: bool
    # Families past the plain pre-norm decoder (Gemma 3, LFM2); the defaults are Llama's.
    layer_types: tuple[str, ...] | None = None  # HF names per layer; None: all full_attention
    sliding_window: int | None = None  # sliding_attention layers see this many positions
    rope_local_theta: float | None = None  # RoPE base of sliding_attention layers
    attn_scale: float | None = None  # q.k multiplier; None: 1 / sqrt(head_dim)
    act: str = "silu"  # silu | gelu_tanh
    conv_width: int | None = None  # LFM2 short-conv kernel (L_cache)
    post_norms: bool = False  # RMSNorms on the attention and FFN outputs too (Gemma 3)
    norm_offset: float = 0.0  # RMSNorms apply (norm_offset + w): 1 for Gemma 3's (1 + w)

    def norm_offset_of(self, name: str) -> float:
        """What a norm tensor's multiplier adds to the stored weight (0 for other tensors)."""
        return self.norm_offset if name.endswith("norm.weight") else 0.0

    @property
    def types(self) -> tuple[str, ...]:
        """One layer type per layer ("full_attention", "sliding_attention" or "conv")."""
        return self.layer_types or ("full_attention",) * self.n_layers

    @property
    def attn_layers(self) -> list[int]:
        """Indices of the layers that have attention (and K/V)."""
        return [i for i, t in enumerate(self.types) if t != "conv"]

    @property
    def score_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def q_rows(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.n_kv_heads * self.head_dim

    def shape_params(self) -> dict[str, int]:
        """The shape keys every manifest's `params` (and Genie's source record) starts with."""
        return {
            "hidden": self.hidden,
            "vocab": self.vocab,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
        }

    def rope_params(self) -> dict[str, Any]:
        """The shape keys and RoPE: what a host loop over the graphs (verify/loop.py) reads."""
        return {**self.shape_params(), "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling}


def _int(meta: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = meta.get(key, default)
    if v is None:
        raise ExportError(f"{where}: missing {key}")
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 0:
        raise ExportError(f"{where}: {key} is {v!r}, expected a non-negative integer")
    return int(v)


def _float(meta: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = meta.get(key, default)
    if v is None:
        raise ExportError(f"{where}: missing {key}")
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise ExportError(f"{where}: {key} is {v!r}, expected a number")
    return f32_value(float(v))


def rope_from_hf(cfg: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], Any]:
    """(object holding rope_theta, rope_scaling-like object or None) of a config.json.

    transformers < 5 writes top-level `rope_theta` / `rope_scaling`; transformers 5 writes
    `rope_parameters` ({"rope_theta", "rope_type", scaling keys}), which is then both."""
    rp = cfg.get("rope_parameters")
    if "rope_theta" in cfg or rp is None:
        return cfg, cfg.get("rope_scaling")
    if not isinstance(rp, Mapping):
        raise ExportError(f"{where}: rope_parameters is {rp!r}, expected an object")
    return rp, rp
