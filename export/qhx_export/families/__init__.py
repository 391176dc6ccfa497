"""Decoder families. Importing this package registers every family module in it."""

from __future__ import annotations

from qhx_export.families import gemma3, lfm2, llama, qwen2, qwen3
from qhx_export.families.base import Family, for_gguf_arch, for_hf_config, registered
from qhx_export.families.config import Config

__all__ = [
    "Config",
    "Family",
    "for_gguf_arch",
    "for_hf_config",
    "gemma3",
    "lfm2",
    "llama",
    "qwen2",
    "qwen3",
    "registered",
]
