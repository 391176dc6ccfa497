"""Regenerate the tiny Qwen3 / Gemma 3 / LFM2 goldens in this directory (independent reference).

    /root/.cache/qhx/venv-ref/bin/python export/tests/data/make_family_goldens.py

Uses torch + transformers only (not qhx_export). For each family it builds a tiny random model
from a fixed seed, rounds its weights to float16 (so the committed model.safetensors is small and
exact), and saves `<family>/` with config.json + model.safetensors (float16) + golden.json: the
token ids and transformers' float32 logits for them (the model reloaded in float32, eager
attention). test_families_new.py holds the numpy reference forwards against these logits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
IDS = [5, 17, 3, 42, 8, 61, 29, 11, 0, 33, 54, 7, 19, 2]  # 14 tokens: past the Gemma window of 4

COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
)
CONFIGS: dict[str, dict[str, object]] = {
    "qwen3": dict(
        COMMON, model_type="qwen3", num_hidden_layers=2, tie_word_embeddings=True, rms_norm_eps=1e-6
    ),
    "gemma3": dict(
        COMMON,
        model_type="gemma3_text",
        num_hidden_layers=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=4,
        query_pre_attn_scalar=12,  # != head_dim: the score scale is its own parameter
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "lfm2": dict(
        COMMON,
        model_type="lfm2",
        num_hidden_layers=3,
        layer_types=["conv", "full_attention", "conv"],
        block_auto_adjust_ff_dim=False,
        norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}


def build(family: str, seed: int) -> None:
    cfg = dict(CONFIGS[family])
    model_type = str(cfg.pop("model_type"))
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                # non-trivial norms (Gemma's are offsets from 1, the rest multipliers near 1)
                p.copy_((0.0 if model_type == "gemma3_text" else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 if "embed" in name else p.shape[-1] ** -0.5))
        for p in model.parameters():
            p.copy_(p.half().float())  # round to f16: the saved f16 weights are what ran
    out = HERE / family
    out.mkdir(exist_ok=True)
    model.half().save_pretrained(out, safe_serialization=True)
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0].float().numpy()
    versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
    golden = {
        "made_by": f"make_family_goldens.py ({versions})",
        "ids": IDS,
        "logits": [[float(v) for v in row] for row in logits.round(6)],
    }
    (out / "golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    (out / "generation_config.json").unlink(missing_ok=True)
    print(f"{out}: {sum(p.numel() for p in model.parameters())} params", file=sys.stderr)


if __name__ == "__main__":
    for seed, fam in enumerate(sys.argv[1:] or list(CONFIGS)):
        build(fam, seed)
