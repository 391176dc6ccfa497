"""What a reader hands the writers: config, family, tensors (internal names, HF layout)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from qhx_export.families import Config, Family


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


class Checkpoint:
    """A model on disk. Subclasses fill the attributes and implement `float32`."""

    path: str
    family: type[Family]
    config: Config
    shapes: dict[str, list[int]]  # internal name -> PyTorch-order shape, in file order

    def names(self) -> list[str]:
        return list(self.shapes)

    def float32(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, HF layout."""
        raise NotImplementedError

    def n_params(self) -> int:
        """Parameters as transformers counts them (tied head once; rope_freqs is a buffer)."""
        return sum(math.prod(s) for n, s in self.shapes.items() if n != "rope_freqs.weight")

    def weights(self) -> Mapping[str, np.ndarray]:
        """A lazy mapping name -> float32 array (for the reference forward)."""
        return _LazyWeights(self)

    # tokenizer / chat facts for the manifest
    def bos_token_id(self) -> int | None:
        """BOS the runtime prepends to a raw prompt, or None."""
        raise NotImplementedError

    def eos_token_id(self) -> int | list[int] | None:
        raise NotImplementedError

    def chat_template(self) -> str | None:
        raise NotImplementedError

    def tokenizer_json(self) -> bytes:
        raise NotImplementedError

    def default_name(self) -> str:
        raise NotImplementedError


class _LazyWeights(Mapping[str, np.ndarray]):
    def __init__(self, ck: Checkpoint) -> None:
        self.ck = ck
        self.cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.ck.shapes:
            raise KeyError(name)
        if name not in self.cache:
            self.cache[name] = self.ck.float32(name)
        return self.cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.ck.shapes)

    def __len__(self) -> int:
        return len(self.ck.shapes)


def as_meta(value: Any) -> Any:
    """numpy scalars -> Python scalars (metadata read from files)."""
    return value.item() if isinstance(value, np.generic) else value
