"""qhx-export: Llama / Qwen GGUF or Hugging Face checkpoints -> qhx bundles."""

from __future__ import annotations

__version__ = "0.1.0"


class ExportError(Exception):
    """Bad input or an unsupported request: reported as one line on stderr, exit status 1.

    The message names the file, tensor or option at fault.
    """


class NotImplementedYet(ExportError):
    """A documented option whose implementation has not landed yet: exit status 2."""
