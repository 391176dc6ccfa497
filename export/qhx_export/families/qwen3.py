"""Qwen3 (dense): no q/k/v bias, an RMSNorm over each head's q and k (QK-norm) before RoPE, and
head_dim given explicitly (it is not hidden / n_heads: Qwen3-0.6B has 1024 / 16 heads of 128).

llama.cpp stores Qwen3 q/k rows in HF order, and the norms as blk.N.attn_q_norm / attn_k_norm.
The emulator runs it as arch "qwen3" (the Llama layer plus the two per-head norms).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from qhx_export import ExportError
from qhx_export.families.base import Family
from qhx_export.families.config import Config
from qhx_export.families.reference import Weights, rms_norm


class Qwen3(Family):
    name = "qwen3"
    gguf_arches: ClassVar[tuple[str, ...]] = ("qwen3",)
    hf_model_types: ClassVar[tuple[str, ...]] = ("qwen3",)
    hf_architecture = "Qwen3ForCausalLM"
    emu_arch = "qwen3"
    qk_norm = True
    host_arch = "qwen2"  # qhx_generate runs it as Qwen2 with its q/k norms in the graphs

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any], where: str) -> Config:
        types = cfg.get("layer_types")
        if cfg.get("use_sliding_window") or (
            isinstance(types, list) and any(t != "full_attention" for t in types)
        ):
            raise ExportError(f"{where}: sliding-window attention is not supported for qwen3")
        return super().config_from_hf(cfg, where)

    @classmethod
    def project_qkv(cls, c: Config, w: Weights, i: int, h: np.ndarray) -> tuple[np.ndarray, ...]:
        q, k, v = super().project_qkv(c, w, i, h)
        b = f"blk.{i}."
        return (
            rms_norm(q, w[b + "attn_q_norm.weight"], c.rms_eps),
            rms_norm(k, w[b + "attn_k_norm.weight"], c.rms_eps),
            v,
        )
