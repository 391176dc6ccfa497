"""Tensor names: HF <-> GGUF, and llama.cpp's q/k row permutation (readers undo it where a
family has one)."""

from __future__ import annotations

import numpy as np

from qhx_export import ExportError

GLOBAL_NAMES = {  # HF -> GGUF
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {  # HF suffix under model.layers.N. -> GGUF suffix under blk.N.
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
BIAS_NAMES = {
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
QK_NORM_NAMES = {
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
# tensors a GGUF may carry that are buffers, not parameters (llama3's per-frequency RoPE divisors)
BUFFERS = ("rope_freqs.weight",)
LAYER_TYPES = ("full_attention", "sliding_attention", "conv")


def unpermute_index(rows: int, n_heads: int, what: str = "tensor") -> np.ndarray:
    """Gather index taking llama.cpp-stored q/k rows (each head's RoPE pairs adjacent) back to
    HF rotate-half order: HF row h*d + j*(d/2) + i is stored at row h*d + 2*i + j."""
    if n_heads <= 0 or rows % n_heads or (rows // n_heads) % 2:
        raise ExportError(f"{what}: cannot undo the RoPE permutation of {rows} rows over {n_heads} heads")
    d = rows // n_heads
    return np.arange(rows).reshape(n_heads, d // 2, 2).transpose(0, 2, 1).reshape(-1)


def permute_index(rows: int, n_heads: int, what: str = "tensor") -> np.ndarray:
    """The inverse gather: HF rows -> llama.cpp's stored order."""
    return np.argsort(unpermute_index(rows, n_heads, what))
