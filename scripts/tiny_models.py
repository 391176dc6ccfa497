"""Deterministic tiny models for the parity suite, shared by goldens.py and make_tiny.py.

Weights come from numpy's legacy RandomState (its stream is frozen across numpy versions)
with a fixed seed per family, in HF transformers' parameter names and layouts (q/k rows in
rotate-half order). `checksum()` is recorded in every golden so a drift fails loudly.
"""
import hashlib

import numpy as np

FAMILIES = {
    # GQA 6:1 like DeepSeek-R1-Distill-Qwen-1.5B's 12:2; q/k/v bias; untied lm-head; theta 1e4.
    "qwen2": dict(arch="qwen2", hidden=96, n_layers=2, n_heads=6, n_kv_heads=1, head_dim=16,
                  ffn=256, vocab=152064, rope_theta=10000.0, rms_eps=1e-6, tied=False, bias=True,
                  rope_scaling=None, bos=151646, eos=[151643], seed=20261202),
    # Llama-3.2-1B's RoPE: theta 5e5 with llama3 scaling. Untied: a random tied model only
    # echoes its last token, which would hide cache and position errors.
    "llama3": dict(arch="llama", hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   ffn=192, vocab=128256, rope_theta=500000.0, rms_eps=1e-5, tied=False, bias=False,
                   rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                   bos=128000, eos=[128001, 128008, 128009], seed=20261203),
}
# The same shape tied: a random tied model repeats its last token, so prompt lookup drafts and
# the model keeps the drafts. Only real_parity.py's speculative case runs it (the verify
# schedule on the real backend); it has no HF goldens and proves nothing about numerics.
FAMILIES["llama3echo"] = dict(FAMILIES["llama3"], tied=True, seed=20261204)


def weights(family: str) -> dict:
    """HF-named float32 arrays, in a fixed generation order."""
    c = FAMILIES[family]
    rng = np.random.RandomState(c["seed"])
    H, L, Dh, F, V = c["hidden"], c["n_layers"], c["head_dim"], c["ffn"], c["vocab"]
    Q, K = c["n_heads"] * Dh, c["n_kv_heads"] * Dh

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((V, H), 1.0)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1.0 + normal((H,), 0.1)
        w[p + "self_attn.q_proj.weight"] = normal((Q, H), H ** -0.5)
        w[p + "self_attn.k_proj.weight"] = normal((K, H), H ** -0.5)
        w[p + "self_attn.v_proj.weight"] = normal((K, H), H ** -0.5)
        if c["bias"]:
            w[p + "self_attn.q_proj.bias"] = normal((Q,), 0.1)
            w[p + "self_attn.k_proj.bias"] = normal((K,), 0.1)
            w[p + "self_attn.v_proj.bias"] = normal((K,), 0.1)
        w[p + "self_attn.o_proj.weight"] = normal((H, Q), Q ** -0.5)
        w[p + "post_attention_layernorm.weight"] = 1.0 + normal((H,), 0.1)
        w[p + "mlp.gate_proj.weight"] = normal((F, H), H ** -0.5)
        w[p + "mlp.up_proj.weight"] = normal((F, H), H ** -0.5)
        w[p + "mlp.down_proj.weight"] = normal((H, F), F ** -0.5)
    w["model.norm.weight"] = 1.0 + normal((H,), 0.1)
    if not c["tied"]:
        # Logit std ~3 keeps greedy choices far from float-noise ties.
        w["lm_head.weight"] = normal((V, H), 3.0 * H ** -0.5)
    return w


def checksum(w: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(w):
        h.update(name.encode())
        h.update(np.ascontiguousarray(w[name], dtype="<f4").tobytes())
    return h.hexdigest()


# HF name -> emulator (GGUF-style) name
def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    i, rest = parts[2], ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    return f"blk.{i}.{table[rest]}"
