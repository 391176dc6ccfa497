"""Hugging Face directory reader: config.json, *.safetensors, tokenizer files.

Tensors are memory-mapped from each file's own header offsets (no safetensors import, so the
plain asset venv can export HF directories too); numpy has no bfloat16, so BF16 tensors (most HF
checkpoints) are widened to float32 here.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import numpy as np

from qhx_export import ExportError
from qhx_export.families import for_hf_config
from qhx_export.read.base import Checkpoint

FLOAT_DTYPES = {"F32", "F16", "BF16"}
NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def _json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except OSError as e:
        raise ExportError(f"{path}: cannot read ({e.strerror})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(out, dict):
        raise ExportError(f"{path}: expected a JSON object")
    return out


def _safetensors_header(path: str) -> tuple[int, dict[str, Any]]:
    """(data start, header) of a .safetensors file: u64 header length, JSON header, data."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ExportError(f"{path}: not a safetensors file ({len(head)} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20 or n > os.path.getsize(path) - 8:
                raise ExportError(f"{path}: not a safetensors file (header length {n})")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ExportError(f"{path}: cannot read ({e.strerror})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: not a safetensors file (header is not JSON)") from e
    return 8 + n, header


class HfCheckpoint(Checkpoint):
    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/") or path
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ExportError(f"{path}: no config.json (a HF model directory needs one)")
        self.hf_config = _json(cfg_path)
        self.family = for_hf_config(self.hf_config, cfg_path)
        self.config = self.family.config_from_hf(self.hf_config, cfg_path)
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise ExportError(f"{path}: no *.safetensors files")
        self.where: dict[str, tuple[str, str, int, int]] = {}  # name -> (file, hf name, start, end)
        shapes: dict[str, list[int]] = {}
        for fn in files:
            fp = os.path.join(path, fn)
            data_start, header = _safetensors_header(fp)
            size = os.path.getsize(fp)
            if not isinstance(header, dict):
                raise ExportError(f"{fp}: not a safetensors file (header is not an object)")
            for hf_name in [k for k in header if k != "__metadata__"]:
                info = header[hf_name]
                if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
                    raise ExportError(f"{fp}: not a readable safetensors file (entry {hf_name})")
                name = self.family.gguf_name(hf_name, self.config)
                if name is None:
                    if "rotary_emb.inv_freq" in hf_name:
                        continue  # a buffer some old checkpoints saved
                    raise ExportError(f"{fp}: tensor {hf_name} is not part of a {self.family.name} model")
                if info["dtype"] not in FLOAT_DTYPES:
                    raise ExportError(
                        f"{fp}: tensor {hf_name} is {info['dtype']}; "
                        f"only {', '.join(sorted(FLOAT_DTYPES))} are read"
                    )
                a, b = (int(x) for x in info["data_offsets"])
                if b - a != math.prod(info["shape"]) * (4 if info["dtype"] == "F32" else 2):
                    raise ExportError(f"{fp}: tensor {hf_name}: {b - a} bytes do not match its shape")
                if data_start + b > size:
                    raise ExportError(
                        f"{fp}: truncated: tensor {hf_name} ends at byte {data_start + b}, "
                        f"the file has {size}"
                    )
                if name in shapes:
                    raise ExportError(f"{fp}: tensor {hf_name} appears in two files")
                shapes[name] = self.family.hf_tensor_shape(name, [int(x) for x in info["shape"]])
                self.where[name] = (fp, info["dtype"], data_start + a, data_start + b)
        # a tied checkpoint may still store lm_head.weight (a copy): drop it, the config decides
        if self.config.tied:
            shapes.pop("output.weight", None)
        order = [n for n in self.family.tensor_shapes(self.config) if n in shapes]
        self.shapes = {n: shapes[n] for n in order + [n for n in shapes if n not in order]}
        self.family.check_tensors(self.config, self.shapes, path)

    def float32(self, name: str) -> np.ndarray:
        fp, dtype, start, end = self.where[name]
        item = np.dtype(NUMPY_DTYPES[dtype])
        if end == start:
            return np.zeros(self.shapes[name], np.float32)
        raw = np.memmap(fp, dtype=item, mode="r", offset=start, shape=((end - start) // item.itemsize,))
        if dtype == "BF16":
            out = (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
        else:
            out = raw.astype(np.float32)
        return np.ascontiguousarray(out.reshape(self.shapes[name]), dtype=np.float32)

    # ---- tokenizer / chat ---------------------------------------------------------------------------

    def _tok_config(self) -> dict[str, Any]:
        p = os.path.join(self.path, "tokenizer_config.json")
        return _json(p) if os.path.isfile(p) else {}

    def bos_token_id(self) -> int | None:
        """BOS when the tokenizer config asks for it (add_bos_token) or tokenizer.json's
        post-processor starts every sequence with a special token (Llama 3)."""
        bos = self.hf_config.get("bos_token_id")
        if self._tok_config().get("add_bos_token") and isinstance(bos, int):
            return bos
        tok = _json(os.path.join(self.path, "tokenizer.json"))
        post = tok.get("post_processor") or {}
        procs = post.get("processors", [post]) if isinstance(post, dict) else []
        for p in procs:
            if isinstance(p, dict) and p.get("type") == "TemplateProcessing":
                first = (p.get("single") or [{}])[0]
                if "SpecialToken" in first:
                    tid = p["special_tokens"][first["SpecialToken"]["id"]]["ids"][0]
                    return int(tid)
        return None

    def eos_token_id(self) -> int | list[int] | None:
        gen = os.path.join(self.path, "generation_config.json")
        eos = _json(gen).get("eos_token_id") if os.path.isfile(gen) else None
        if eos is None:
            eos = self.hf_config.get("eos_token_id")
        return eos if isinstance(eos, (int, list)) else None

    def chat_template(self) -> str | None:
        t = self._tok_config().get("chat_template")
        if t is None and os.path.isfile(os.path.join(self.path, "chat_template.jinja")):
            with open(os.path.join(self.path, "chat_template.jinja"), encoding="utf-8") as f:
                t = f.read()
        return t if isinstance(t, str) and t else None

    def tokenizer_json(self) -> bytes:
        p = os.path.join(self.path, "tokenizer.json")
        if not os.path.isfile(p):
            raise ExportError(f"{self.path}: no tokenizer.json")
        with open(p, "rb") as f:
            return f.read()

    def default_name(self) -> str:
        return os.path.basename(os.path.abspath(self.path)).lower()
