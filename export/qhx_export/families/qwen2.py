"""Qwen2 / Qwen2.5 (and DeepSeek-R1-Distill-Qwen): Llama with biases on q, k and v.

llama.cpp stores Qwen2 q/k rows in HF order (no permutation to undo). The bias is what makes
|k| large (~400 in Qwen2), which is why graphs compute the self-score as a matmul.
"""

from __future__ import annotations

from typing import Any, ClassVar

from qhx_export import ExportError
from qhx_export.families.base import Family
from qhx_export.families.config import Config


class Qwen2(Family):
    name = "qwen2"
    gguf_arches: ClassVar[tuple[str, ...]] = ("qwen2",)
    hf_model_types: ClassVar[tuple[str, ...]] = ("qwen2",)
    emu_arch = "qwen2"
    hf_architecture = "Qwen2ForCausalLM"
    qkv_bias = True

    @classmethod
    def config_from_hf(cls, cfg: dict[str, Any], where: str) -> Config:
        if cfg.get("use_sliding_window"):
            raise ExportError(
                f"{where}: use_sliding_window is set; sliding-window attention is not supported"
            )
        return super().config_from_hf(cfg, where)
