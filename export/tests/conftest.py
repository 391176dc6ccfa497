"""Shared tiny models: random weights per family, written out as GGUF files or HF directories."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from qhx_export.families import Config, Family, registered


@pytest.fixture(scope="session", autouse=True)
def _stage_cache() -> Iterator[None]:
    """Exports in the suite run every stage (no stage cache, never the user's ~/.cache/qhx-export;
    pytest keeps its temporary directories, and a SmolLM2 export's stages are gigabytes): a test
    of the cache passes --cache-dir itself."""
    old = os.environ.get("QHX_EXPORT_CACHE")
    os.environ["QHX_EXPORT_CACHE"] = "off"
    yield
    if old is None:
        os.environ.pop("QHX_EXPORT_CACHE", None)
    else:
        os.environ["QHX_EXPORT_CACHE"] = old


@pytest.fixture(autouse=True)
def _no_weight_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite runs its bundles on the x86_64 HTP simulator, which cannot load weight-shared
    context binaries: --target htp exports here default to --no-weight-sharing, and a test of
    sharing passes --weight-sharing itself."""
    import qhx_export.cli

    monkeypatch.setattr(qhx_export.cli, "DEFAULT_WEIGHT_SHARING", False)


LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def tiny_config(family: str, **over: object) -> Config:
    base: dict[str, object] = dict(
        family=family,
        hidden=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        ffn=96,
        vocab=300,
        rms_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        tied=False,
        max_ctx=256,
        qkv_bias=family == "qwen2",
        qk_norm=family == "qwen3",
    )
    if family == "llama":
        base.update(rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING))
    if family == "qwen3":
        base.update(head_dim=24, tied=True, rms_eps=1e-6)  # head_dim != hidden / n_heads
    base.update(over)
    return Config(**base)  # type: ignore[arg-type]


def tiny_weights(c: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Internal (GGUF-named, HF-layout) float32 weights of `c`."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in registered()[c.family].tensor_shapes(c).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.5 * rng.standard_normal(shape)
        elif name == "token_embd.weight":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) * shape[-1] ** -0.5 * (3.0 if name == "output.weight" else 1.0)
        out[name] = a.astype(np.float32)
    return out


BYTES = [chr(b) for b in range(0x21, 0x7F)]


def add_tokenizer(w: gguf.GGUFWriter, vocab: int) -> list[str]:
    """A small byte-level BPE vocabulary (printable ASCII + a few merges + padding)."""
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *BYTES, "he", "ll", "hell", "hello"]
    toks += [f"<pad{i}>" for i in range(vocab - len(toks))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_merges(["h e", "l l", "he ll", "hell o"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    return toks


def write_gguf(
    path: Path,
    c: Config,
    weights: dict[str, np.ndarray],
    types: Callable[[str], gguf.GGMLQuantizationType] | None = None,
    meta_over: dict[str, object] | None = None,
) -> Path:
    """A GGUF file as llama.cpp's converter would write it (q/k rows permuted for llama)."""
    fam: type[Family] = registered()[c.family]
    meta = fam.to_gguf_metadata(c)
    meta.update(meta_over or {})
    w = gguf.GGUFWriter(str(path), str(meta.pop("general.architecture")))
    for k, v in meta.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, str(v))
    add_tokenizer(w, c.vocab)
    Q = gguf.GGMLQuantizationType
    for name, arr in weights.items():
        qt = types(name) if types else Q.F32
        stored = fam.to_gguf_layout(name, arr, c)
        if qt == Q.F32:
            w.add_tensor(name, stored)
        elif qt in (Q.Q2_K, Q.Q3_K):  # gguf cannot quantize these: zero blocks of the right size
            size = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor(
                name,
                np.zeros((stored.shape[0], stored.shape[1] // size[0] * size[1]), np.uint8),
                raw_dtype=qt,
            )
        else:
            w.add_tensor(name, gguf.quants.quantize(stored, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_hf(d: Path, c: Config, weights: dict[str, np.ndarray]) -> Path:
    fam = registered()[c.family]
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(fam.to_hf_config(c)))
    save_file({fam.hf_name(n, c): a for n, a in weights.items()}, str(d / "model.safetensors"))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ messages }}", "bos_token": None, "eos_token": "<|im_end|>"})
    )
    return d


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Callable[..., Path]:
    def make(family: str = "llama", name: str = "Tiny-Test.Q8_0.gguf", **kw: object) -> Path:
        c = tiny_config(family)
        return write_gguf(tmp_path / name, c, tiny_weights(c), **kw)  # type: ignore[arg-type]

    return make
