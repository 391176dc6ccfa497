"""Deterministic tiny models for the parity suite, shared by goldens.py and build-parity.sh (write_hf_dir).

Weights come from numpy's legacy RandomState (its stream is frozen across numpy versions)
with a fixed seed per family, in HF transformers' parameter names and layouts (q/k rows in
rotate-half order). `checksum()` is recorded in every golden so a drift fails loudly.
"""
import hashlib
import json
import os
import shutil
import struct

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
# Issue 17's families. Untied lm-heads throughout (see llama3).
# Qwen3: no q/k/v bias, RMSNorm on each q/k head (q_norm/k_norm over head_dim) before RoPE,
# head_dim 32 != hidden / n_heads, theta 1e6; DeepSeek-R1-Distill tokenizer as qwen2.
FAMILIES["qwen3"] = dict(arch="qwen3", hidden=96, n_layers=2, n_heads=6, n_kv_heads=1, head_dim=32,
                         ffn=256, vocab=152064, rope_theta=1000000.0, rms_eps=1e-6, tied=False,
                         bias=False, qk_norm=True, rope_scaling=None, bos=151646, eos=[151643],
                         seed=20261205)
# LFM2: gated short-convolution layers (in_proj -> B, C, x; C * conv3(B * x) -> out_proj) between
# GQA attention layers with q/k RMSNorm; SwiGLU w1/w3/w2; final norm named embedding_norm.
# SmolLM2's tokenizer (vocab 49152, bos 1, eos 2).
FAMILIES["lfm2"] = dict(arch="lfm2", hidden=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                        ffn=192, vocab=49152, rope_theta=1000000.0, rms_eps=1e-5, tied=False,
                        bias=False, rope_scaling=None, conv_L_cache=3,
                        layer_types=["conv", "full_attention", "conv", "full_attention"],
                        bos=1, eos=[2], seed=20261206)
# Gemma 3 with a sliding window of 8 so 32-token goldens leave it: sliding layers use RoPE base
# 1e4, the full layer 1e6; q.k scaled by query_pre_attn_scalar**-0.5 (24, not head_dim 16);
# embeddings times sqrt(hidden); four norms per layer plus q/k norms, all stored as w and applied
# as (1 + w); GELU (tanh) gate. Gemma 3 tokenizer (vocab 262144, bos 2, eos 1 / <end_of_turn> 106).
FAMILIES["gemma3w"] = dict(arch="gemma3", hidden=64, n_layers=3, n_heads=4, n_kv_heads=1, head_dim=16,
                           ffn=128, vocab=262144, rope_theta=1000000.0, rope_local_theta=10000.0,
                           rms_eps=1e-6, tied=False, bias=False, rope_scaling=None, sliding_window=8,
                           query_pre_attn_scalar=24,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                           bos=2, eos=[1, 106], seed=20261207)


def weights(family: str) -> dict:
    """HF-named float32 arrays, in a fixed generation order."""
    c = FAMILIES[family]
    if c["arch"] == "lfm2":
        return _lfm2_weights(c)
    if c["arch"] == "gemma3":
        return _gemma3_weights(c)
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
        if c.get("qk_norm"):
            w[p + "self_attn.q_norm.weight"] = 1.0 + normal((Dh,), 0.1)
            w[p + "self_attn.k_norm.weight"] = 1.0 + normal((Dh,), 0.1)
        w[p + "post_attention_layernorm.weight"] = 1.0 + normal((H,), 0.1)
        w[p + "mlp.gate_proj.weight"] = normal((F, H), H ** -0.5)
        w[p + "mlp.up_proj.weight"] = normal((F, H), H ** -0.5)
        w[p + "mlp.down_proj.weight"] = normal((H, F), F ** -0.5)
    w["model.norm.weight"] = 1.0 + normal((H,), 0.1)
    if not c["tied"]:
        # Logit std ~3 keeps greedy choices far from float-noise ties.
        w["lm_head.weight"] = normal((V, H), 3.0 * H ** -0.5)
    return w


def _lfm2_weights(c: dict) -> dict:
    rng = np.random.RandomState(c["seed"])
    H, Dh, F, V, Lc = c["hidden"], c["head_dim"], c["ffn"], c["vocab"], c["conv_L_cache"]
    Q, K = c["n_heads"] * Dh, c["n_kv_heads"] * Dh

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((V, H), 1.0)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        w[p + "operator_norm.weight"] = 1.0 + normal((H,), 0.1)
        if kind == "conv":
            w[p + "conv.in_proj.weight"] = normal((3 * H, H), H ** -0.5)
            w[p + "conv.conv.weight"] = normal((H, 1, Lc), Lc ** -0.5)  # depthwise, causal
            w[p + "conv.out_proj.weight"] = normal((H, H), H ** -0.5)
        else:
            w[p + "self_attn.q_proj.weight"] = normal((Q, H), H ** -0.5)
            w[p + "self_attn.k_proj.weight"] = normal((K, H), H ** -0.5)
            w[p + "self_attn.v_proj.weight"] = normal((K, H), H ** -0.5)
            w[p + "self_attn.q_layernorm.weight"] = 1.0 + normal((Dh,), 0.1)
            w[p + "self_attn.k_layernorm.weight"] = 1.0 + normal((Dh,), 0.1)
            w[p + "self_attn.out_proj.weight"] = normal((H, Q), Q ** -0.5)
        w[p + "ffn_norm.weight"] = 1.0 + normal((H,), 0.1)
        w[p + "feed_forward.w1.weight"] = normal((F, H), H ** -0.5)
        w[p + "feed_forward.w3.weight"] = normal((F, H), H ** -0.5)
        w[p + "feed_forward.w2.weight"] = normal((H, F), F ** -0.5)
    w["model.embedding_norm.weight"] = 1.0 + normal((H,), 0.1)
    w["lm_head.weight"] = normal((V, H), 3.0 * H ** -0.5)
    return w


def _gemma3_weights(c: dict) -> dict:
    """Norm weights are stored as HF keeps them: w, applied as (1 + w)."""
    rng = np.random.RandomState(c["seed"])
    H, Dh, F, V = c["hidden"], c["head_dim"], c["ffn"], c["vocab"]
    Q, K = c["n_heads"] * Dh, c["n_kv_heads"] * Dh

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # Embedding rows are scaled by sqrt(H) in the model: std H**-0.5 keeps the stream at ~1.
    w = {"model.embed_tokens.weight": normal((V, H), H ** -0.5)}
    for i in range(c["n_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = normal((H,), 0.1)
        w[p + "self_attn.q_proj.weight"] = normal((Q, H), H ** -0.5)
        w[p + "self_attn.k_proj.weight"] = normal((K, H), H ** -0.5)
        w[p + "self_attn.v_proj.weight"] = normal((K, H), H ** -0.5)
        w[p + "self_attn.q_norm.weight"] = normal((Dh,), 0.1)
        w[p + "self_attn.k_norm.weight"] = normal((Dh,), 0.1)
        w[p + "self_attn.o_proj.weight"] = normal((H, Q), Q ** -0.5)
        w[p + "post_attention_layernorm.weight"] = normal((H,), 0.1)
        w[p + "pre_feedforward_layernorm.weight"] = normal((H,), 0.1)
        w[p + "mlp.gate_proj.weight"] = normal((F, H), H ** -0.5)
        w[p + "mlp.up_proj.weight"] = normal((F, H), H ** -0.5)
        w[p + "mlp.down_proj.weight"] = normal((H, F), F ** -0.5)
        w[p + "post_feedforward_layernorm.weight"] = normal((H,), 0.1)
    w["model.norm.weight"] = normal((H,), 0.1)
    w["lm_head.weight"] = normal((V, H), 3.0 * H ** -0.5)
    return w


def hf_config(family: str) -> dict:
    """The HF config.json content of a tiny family (transformers 5 keys: rope_parameters)."""
    c = FAMILIES[family]
    kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["ffn"],
              num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
              num_key_value_heads=c["n_kv_heads"], max_position_embeddings=131072,
              tie_word_embeddings=c["tied"], bos_token_id=c["bos"], eos_token_id=c["eos"][0],
              torch_dtype="float32")
    rp = {"rope_theta": c["rope_theta"], "rope_type": "default"}
    if c["rope_scaling"]:
        rp = {"rope_theta": c["rope_theta"], **c["rope_scaling"]}
    arch = c["arch"]
    if arch in ("qwen2", "qwen3", "llama"):
        kw.update(head_dim=c["head_dim"], rms_norm_eps=c["rms_eps"], rope_parameters=rp)
    if arch == "qwen2":
        return dict(kw, architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False)
    if arch == "qwen3":
        return dict(kw, architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False,
                    attention_bias=False)
    if arch == "llama":
        return dict(kw, architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False,
                    mlp_bias=False)
    if arch == "lfm2":
        return dict(kw, architectures=["Lfm2ForCausalLM"], model_type="lfm2", norm_eps=c["rms_eps"],
                    rope_parameters=rp, conv_bias=False, conv_L_cache=c["conv_L_cache"],
                    block_auto_adjust_ff_dim=False, layer_types=list(c["layer_types"]),
                    pad_token_id=0)
    if arch == "gemma3":
        return dict(kw, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                    head_dim=c["head_dim"], rms_norm_eps=c["rms_eps"],
                    hidden_activation="gelu_pytorch_tanh",
                    query_pre_attn_scalar=c["query_pre_attn_scalar"],
                    sliding_window=c["sliding_window"], layer_types=list(c["layer_types"]),
                    rope_parameters={
                        "full_attention": {"rope_type": "default", "rope_theta": c["rope_theta"]},
                        "sliding_attention": {"rope_type": "default",
                                              "rope_theta": c["rope_local_theta"]}},
                    final_logit_softcapping=None, attn_logit_softcapping=None,
                    attention_bias=False, pad_token_id=0)
    raise ValueError(f"no HF config for family {family}")


def _write_safetensors(path: str, w: dict) -> None:
    """float32 tensors in the safetensors layout: u64 LE header size, JSON header, raw data."""
    header, offset = {}, 0
    for name in sorted(w):
        n = w[name].size * 4
        header[name] = {"dtype": "F32", "shape": list(w[name].shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data starts 8-aligned
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for name in sorted(w):
            f.write(np.ascontiguousarray(w[name], dtype="<f4").tobytes())
    os.replace(path + ".tmp", path)


def write_hf_dir(family: str, out: str, tokenizer_json: str) -> str:
    """A HF checkpoint directory of a tiny family: config.json, model.safetensors (float32),
    tokenizer.json (copied; given a BOS template when it adds none), tokenizer_config.json and
    qhx_source.json (weights checksum). AutoModelForCausalLM / AutoTokenizer load it and give the
    goldens' input_ids and greedy ids (transformers 5.24)."""
    c = FAMILIES[family]
    w = weights(family)
    os.makedirs(out, exist_ok=True)
    cfg = hf_config(family)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
        f.write("\n")
    _write_safetensors(os.path.join(out, "model.safetensors"), w)
    with open(tokenizer_json, encoding="utf-8") as f:
        tok = json.load(f)
    names = {i: s for s, i in tok["model"]["vocab"].items()}
    names.update({t["id"]: t["content"] for t in tok.get("added_tokens", [])})
    bos = names[c["bos"]]
    if bos in json.dumps(tok.get("post_processor"), ensure_ascii=False):
        shutil.copyfile(tokenizer_json, os.path.join(out, "tokenizer.json"))
    else:
        # The goldens' input_ids start with the family's bos (goldens.py prepends it when the
        # tokenizer does not): the directory's tokenizer adds it, as LFM2's own tokenizer does.
        def seq(name, type_id):
            return [{"SpecialToken": {"id": bos, "type_id": type_id}},
                    {"Sequence": {"id": name, "type_id": type_id}}]
        template = {"type": "TemplateProcessing", "single": seq("A", 0), "pair": seq("A", 0) + seq("B", 1),
                    "special_tokens": {bos: {"id": bos, "ids": [c["bos"]], "tokens": [bos]}}}
        old = tok.get("post_processor")
        tok["post_processor"] = {"type": "Sequence", "processors": [old, template]} if old else template
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=1)
    tc = {"bos_token": names.get(c["bos"]), "eos_token": names.get(c["eos"][0]), "add_bos_token": True,
          "add_eos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
          "clean_up_tokenization_spaces": False, "model_max_length": 131072}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out, "qhx_source.json"), "w") as f:
        json.dump({"script": "scripts/tiny_models.py", "family": family, "weights_sha256": checksum(w)}, f,
                  indent=1, sort_keys=True)
        f.write("\n")
    return out


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
        "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    return f"blk.{i}.{table[rest]}"
