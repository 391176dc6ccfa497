"""Llama (Llama 2 / 3.x, SmolLM2, TinyLlama ...): the plain pre-norm decoder.

Differences from the base: llama.cpp's converter stores attn_q / attn_k rows permuted so that each
head's RoPE pairs are adjacent (interleaved RoPE); readers undo it. Llama 3.1+ "llama3" RoPE
scaling comes from config.json's rope_scaling or GGUF `llama.rope.scaling.*`; llama.cpp's own
llama3 GGUFs carry it as the `rope_freqs.weight` divisors instead, which the reference forward
applies.
"""

from __future__ import annotations

from typing import ClassVar

from qhx_export.families.base import Family


class Llama(Family):
    name = "llama"
    gguf_arches: ClassVar[tuple[str, ...]] = ("llama",)
    hf_model_types: ClassVar[tuple[str, ...]] = ("llama",)
    emu_arch = "llama"
    hf_architecture = "LlamaForCausalLM"
    gguf_rope_permuted = True
