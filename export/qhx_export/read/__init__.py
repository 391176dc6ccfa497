"""Checkpoint readers. `open_checkpoint(path)` picks one by what the path is."""

from __future__ import annotations

import os

from qhx_export import ExportError
from qhx_export.read.base import Checkpoint


def open_checkpoint(path: str) -> Checkpoint:
    """A GGUF file or a Hugging Face directory (config.json + *.safetensors)."""
    if os.path.isdir(path):
        from qhx_export.read.hf import HfCheckpoint

        return HfCheckpoint(path)
    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file or directory")
    from qhx_export.read.gguf import GgufCheckpoint

    return GgufCheckpoint(path)


__all__ = ["Checkpoint", "open_checkpoint"]
