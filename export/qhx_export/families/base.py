"""What every decoder family shares: the registry and `Family`, whose hooks and reference forward
a family module overrides. The config (families/config.py), the tensor names (names.py) and the
numpy pieces of the forward (reference.py) sit beside it.

Internal conventions (every reader hands weights over in this form):

* tensor names are GGUF's (`token_embd.weight`, `blk.3.attn_q.weight`, `output_norm.weight`),
  because the emulator format and the manifests already use them;
* shapes are PyTorch's ([out, in]; GGUF lists dims fastest-first, so readers reverse them);
* q/k rows are in HF's rotate-half order (a reader undoes llama.cpp's permutation where the
  family has one: `Family.from_gguf_layout`).

A family module subclasses `Family`; `__init_subclass__` registers it by name, GGUF
`general.architecture` and HF `model_type`. Layer hooks (`project_qkv`) are where a family's
attention differs; the rest of the reference forward is shared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from qhx_export import ExportError
from qhx_export.families.config import Config, _float, _int, f32_value, rope_from_hf
from qhx_export.families.names import (
    BIAS_NAMES,
    BUFFERS,
    GLOBAL_NAMES,
    LAYER_NAMES,
    QK_NORM_NAMES,
    permute_index,
    unpermute_index,
)
from qhx_export.families.reference import (
    Weights,
    final_logits,
    inv_freq,
    rms_norm,
    rotate_half_rope,
    swiglu_residual,
)

# -------------------------------------------------------------------------------------------------
# registry

_REGISTRY: dict[str, type[Family]] = {}


def registered() -> dict[str, type[Family]]:
    return dict(_REGISTRY)


def for_gguf_arch(arch: object, where: str) -> type[Family]:
    for fam in _REGISTRY.values():
        if arch in fam.gguf_arches:
            return fam
    known = sorted(a for f in _REGISTRY.values() for a in f.gguf_arches)
    raise ExportError(f"{where}: general.architecture is {arch!r}; supported: {', '.join(known)}")


def for_hf_config(cfg: Mapping[str, Any], where: str) -> type[Family]:
    mt = cfg.get("model_type")
    for fam in _REGISTRY.values():
        if mt in fam.hf_model_types:
            return fam
    known = sorted(t for f in _REGISTRY.values() for t in f.hf_model_types)
    raise ExportError(f"{where}: model_type is {mt!r}; supported: {', '.join(known)}")


class Family:
    """One decoder family. Subclasses set the class variables and override hooks."""

    name: ClassVar[str]
    gguf_arches: ClassVar[tuple[str, ...]]
    hf_model_types: ClassVar[tuple[str, ...]]
    hf_architecture: ClassVar[str]  # config.json "architectures"[0] when writing one
    qkv_bias: ClassVar[bool] = False
    qk_norm: ClassVar[bool] = False
    gguf_rope_permuted: ClassVar[bool] = False  # llama.cpp's converter permutes q/k rows
    emu_arch: ClassVar[str | None] = None  # manifest arch the qnn-emu graphs run, None: no graphs
    htp_graphs: ClassVar[bool] = True  # graphs/decoder.py builds this family's HTP graphs
    genie_format: ClassVar[bool] = True  # --format genie can write it (Genie's plain decoder)
    post_norms: ClassVar[bool] = False  # Config.post_norms
    norm_offset: ClassVar[float] = 0.0  # Config.norm_offset
    host_arch: ClassVar[str | None] = None  # the manifest arch qhx_generate runs it as; None: name

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name in _REGISTRY:
            raise RuntimeError(f"family {cls.name} registered twice")
        _REGISTRY[cls.name] = cls

    # ---- config ---------------------------------------------------------------------------------

    @classmethod
    def check(cls, c: Config, where: str) -> None:
        """Shape rules every family shares; a family adds its own."""
        for k in ("hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab"):
            if getattr(c, k) <= 0:
                raise ExportError(f"{where}: {k} is {getattr(c, k)}, must be positive")
        if c.n_heads % c.n_kv_heads:
            raise ExportError(
                f"{where}: {c.n_heads} attention heads are not a multiple of {c.n_kv_heads} KV heads"
            )
        if c.head_dim % 2:
            raise ExportError(f"{where}: head_dim {c.head_dim} is odd (RoPE needs pairs)")
        if c.layer_types is not None:
            if len(c.layer_types) != c.n_layers:
                raise ExportError(
                    f"{where}: layer_types lists {len(c.layer_types)} layers, the model has {c.n_layers}"
                )
            for i, t in enumerate(c.layer_types):
                if t not in cls.supported_layer_types():
                    raise ExportError(
                        f"{where}: layer {i} has type {t!r}; {cls.name} supports "
                        f"{', '.join(cls.supported_layer_types())}"
                    )
        if "sliding_attention" in c.types and not c.sliding_window:
            raise ExportError(f"{where}: sliding_attention layers need a positive sliding_window")

    @classmethod
    def supported_layer_types(cls) -> tuple[str, ...]:
        return ("full_attention",)

    @classmethod
    def rope_scaling_from_hf(cls, rs: Any, where: str) -> dict[str, Any] | None:
        if rs is None:
            return None
        if not isinstance(rs, Mapping):
            raise ExportError(f"{where}: rope_scaling is {rs!r}, expected an object or null")
        kind = rs.get("rope_type", rs.get("type"))
        if kind in (None, "default"):
            return None
        if kind != "llama3":
            raise ExportError(f"{where}: rope_scaling type {kind!r} is not supported (only llama3)")
        try:
            return {
                "rope_type": "llama3",
                "factor": f32_value(rs["factor"]),
                "low_freq_factor": f32_value(rs["low_freq_factor"]),
                "high_freq_factor": f32_value(rs["high_freq_factor"]),
                "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
            }
        except (KeyError, TypeError, ValueError) as e:
            raise ExportError(f"{where}: llama3 rope_scaling lacks or mistypes {e}") from e

    @classmethod
    def rope_scaling_from_gguf(cls, meta: Mapping[str, Any], arch: str, where: str) -> dict[str, Any] | None:
        pre = f"{arch}.rope.scaling."
        keys = {k[len(pre) :]: v for k, v in meta.items() if k.startswith(pre)}
        kind = keys.get("type")
        if kind != "llama3" and not ({"low_freq_factor", "high_freq_factor"} & keys.keys()):
            if kind not in (None, "none"):
                raise ExportError(f"{where}: {pre}type {kind!r} is not supported (only llama3)")
            return None
        return {
            "rope_type": "llama3",
            "factor": f32_value(keys.get("factor", 8.0)),
            "low_freq_factor": f32_value(keys.get("low_freq_factor", 1.0)),
            "high_freq_factor": f32_value(keys.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings": int(keys.get("original_context_length", 8192)),
        }

    @classmethod
    def config_from_gguf(cls, meta: Mapping[str, Any], shapes: Mapping[str, list[int]], where: str) -> Config:
        """GGUF metadata (+ tensor shapes for vocab / tying / bias) -> Config."""
        a = str(meta.get("general.architecture"))
        hidden = _int(meta, f"{a}.embedding_length", where)
        n_heads = _int(meta, f"{a}.attention.head_count", where)
        head_dim = meta.get(f"{a}.attention.key_length", meta.get(f"{a}.rope.dimension_count"))
        if "token_embd.weight" not in shapes:
            raise ExportError(f"{where}: no token_embd.weight tensor")
        emb = shapes["token_embd.weight"]
        vocab = _int(meta, f"{a}.vocab_size", where, emb[0])
        if vocab != emb[0]:
            raise ExportError(f"{where}: {a}.vocab_size {vocab} != token_embd.weight rows {emb[0]}")
        c = Config(
            family=cls.name,
            hidden=hidden,
            n_layers=_int(meta, f"{a}.block_count", where),
            n_heads=n_heads,
            n_kv_heads=_int(meta, f"{a}.attention.head_count_kv", where, n_heads),
            head_dim=int(head_dim) if head_dim is not None else hidden // max(n_heads, 1),
            ffn=_int(meta, f"{a}.feed_forward_length", where),
            vocab=vocab,
            rms_eps=_float(meta, f"{a}.attention.layer_norm_rms_epsilon", where),
            rope_theta=_float(meta, f"{a}.rope.freq_base", where, 10000.0),
            rope_scaling=cls.rope_scaling_from_gguf(meta, a, where),
            tied="output.weight" not in shapes,
            max_ctx=_int(meta, f"{a}.context_length", where) if f"{a}.context_length" in meta else None,
            qkv_bias=cls.qkv_bias or "blk.0.attn_q.bias" in shapes,
            qk_norm=cls.qk_norm,
            post_norms=cls.post_norms,
            norm_offset=cls.norm_offset,
        )
        cls.check(c, where)
        return c

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any], where: str) -> Config:
        """config.json -> Config."""
        hidden = _int(cfg, "hidden_size", where)
        n_heads = _int(cfg, "num_attention_heads", where)
        head_dim = cfg.get("head_dim")
        rope, scaling = rope_from_hf(cfg, where)
        c = Config(
            family=cls.name,
            hidden=hidden,
            n_layers=_int(cfg, "num_hidden_layers", where),
            n_heads=n_heads,
            n_kv_heads=_int(cfg, "num_key_value_heads", where, n_heads),
            head_dim=_int(cfg, "head_dim", where) if head_dim is not None else hidden // max(n_heads, 1),
            ffn=_int(cfg, "intermediate_size", where),
            vocab=_int(cfg, "vocab_size", where),
            rms_eps=_float(cfg, "rms_norm_eps", where),
            rope_theta=_float(rope, "rope_theta", where, 10000.0),
            rope_scaling=cls.rope_scaling_from_hf(rope.get("rope_scaling", scaling), where),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            max_ctx=_int(cfg, "max_position_embeddings", where) if "max_position_embeddings" in cfg else None,
            qkv_bias=cls.qkv_bias or bool(cfg.get("attention_bias", False)),
            qk_norm=cls.qk_norm,
            post_norms=cls.post_norms,
            norm_offset=cls.norm_offset,
        )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ExportError(f"{where}: hidden_act {cfg.get('hidden_act')!r} is not supported (silu)")
        if cfg.get("mlp_bias"):
            raise ExportError(f"{where}: mlp_bias is not supported")
        cls.check(c, where)
        return c

    @classmethod
    def to_hf_config(cls, c: Config) -> dict[str, Any]:
        """Config -> config.json (the inverse of config_from_hf)."""
        out: dict[str, Any] = {
            "architectures": [cls.hf_architecture],
            "model_type": cls.hf_model_types[0],
            "hidden_size": c.hidden,
            "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads,
            "head_dim": c.head_dim,
            "intermediate_size": c.ffn,
            "vocab_size": c.vocab,
            "rms_norm_eps": c.rms_eps,
            "rope_theta": c.rope_theta,
            "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
            "tie_word_embeddings": c.tied,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }
        if c.max_ctx is not None:
            out["max_position_embeddings"] = c.max_ctx
        if c.qkv_bias and not cls.qkv_bias:
            out["attention_bias"] = True
        return out

    @classmethod
    def to_gguf_metadata(cls, c: Config) -> dict[str, Any]:
        """Config -> GGUF architecture keys (the inverse of config_from_gguf)."""
        a = cls.gguf_arches[0]
        out: dict[str, Any] = {
            "general.architecture": a,
            f"{a}.embedding_length": c.hidden,
            f"{a}.block_count": c.n_layers,
            f"{a}.attention.head_count": c.n_heads,
            f"{a}.attention.head_count_kv": c.n_kv_heads,
            f"{a}.attention.key_length": c.head_dim,
            f"{a}.attention.value_length": c.head_dim,
            f"{a}.rope.dimension_count": c.head_dim,
            f"{a}.feed_forward_length": c.ffn,
            f"{a}.vocab_size": c.vocab,
            f"{a}.attention.layer_norm_rms_epsilon": c.rms_eps,
            f"{a}.rope.freq_base": c.rope_theta,
        }
        if c.max_ctx is not None:
            out[f"{a}.context_length"] = c.max_ctx
        if c.rope_scaling:
            rs = c.rope_scaling
            out[f"{a}.rope.scaling.type"] = "llama3"
            out[f"{a}.rope.scaling.factor"] = rs["factor"]
            out[f"{a}.rope.scaling.low_freq_factor"] = rs["low_freq_factor"]
            out[f"{a}.rope.scaling.high_freq_factor"] = rs["high_freq_factor"]
            out[f"{a}.rope.scaling.original_context_length"] = rs["original_max_position_embeddings"]
        return out

    # ---- tensors ------------------------------------------------------------------------------

    @classmethod
    def layer_names(cls, c: Config) -> dict[str, str]:
        """HF suffix -> GGUF suffix of one layer's tensors for this config."""
        out = dict(LAYER_NAMES)
        if c.qkv_bias:
            out.update(BIAS_NAMES)
        if c.qk_norm:
            out.update(QK_NORM_NAMES)
        return out

    @classmethod
    def gguf_name(cls, hf: str, c: Config) -> str | None:
        """HF tensor name -> internal (GGUF) name; None for a tensor the family does not use."""
        if hf in GLOBAL_NAMES:
            return GLOBAL_NAMES[hf]
        parts = hf.split(".", 3)
        if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
            suffix = cls.layer_names(c).get(parts[3])
            return f"blk.{parts[2]}.{suffix}" if suffix else None
        return None

    @classmethod
    def hf_name(cls, name: str, c: Config) -> str:
        """Internal (GGUF) name -> HF tensor name."""
        for hf, g in GLOBAL_NAMES.items():
            if g == name:
                return hf
        _, i, suffix = name.split(".", 2)
        inv = {g: h for h, g in cls.layer_names(c).items()}
        return f"model.layers.{i}.{inv[suffix]}"

    @classmethod
    def tensor_shapes(cls, c: Config) -> dict[str, list[int]]:
        """Every parameter the family needs for this config, PyTorch-order shapes."""
        H, F = c.hidden, c.ffn
        per = {
            "attn_norm.weight": [H],
            "ffn_norm.weight": [H],
            "attn_q.weight": [c.q_rows, H],
            "attn_k.weight": [c.kv_rows, H],
            "attn_v.weight": [c.kv_rows, H],
            "attn_output.weight": [H, c.q_rows],
            "ffn_gate.weight": [F, H],
            "ffn_up.weight": [F, H],
            "ffn_down.weight": [H, F],
        }
        if c.qkv_bias:
            per.update({"attn_q.bias": [c.q_rows], "attn_k.bias": [c.kv_rows], "attn_v.bias": [c.kv_rows]})
        if c.qk_norm:
            per.update({"attn_q_norm.weight": [c.head_dim], "attn_k_norm.weight": [c.head_dim]})
        out = {"token_embd.weight": [c.vocab, H], "output_norm.weight": [H]}
        for i in range(c.n_layers):
            out.update({f"blk.{i}.{k}": v for k, v in per.items()})
        if not c.tied:
            out["output.weight"] = [c.vocab, H]
        return out

    @classmethod
    def check_tensors(cls, c: Config, shapes: Mapping[str, Sequence[int]], where: str) -> None:
        """The checkpoint holds exactly the tensors the family needs (plus known buffers)."""
        want = cls.tensor_shapes(c)
        for name, shape in want.items():
            if name not in shapes:
                raise ExportError(f"{where}: missing tensor {name}")
            if list(shapes[name]) != shape:
                raise ExportError(
                    f"{where}: tensor {name} has shape {list(shapes[name])}, {cls.name} expects {shape}"
                )
        extra = [n for n in shapes if n not in want and n not in BUFFERS]
        if extra:
            more = f" (and {len(extra) - 3} more)" if len(extra) > 3 else ""
            raise ExportError(
                f"{where}: tensor {extra[0]} is not part of a {cls.name} model: {', '.join(extra[:3])}{more}"
            )
        if "rope_freqs.weight" in shapes and list(shapes["rope_freqs.weight"]) != [c.head_dim // 2]:
            raise ExportError(
                f"{where}: rope_freqs.weight has shape {list(shapes['rope_freqs.weight'])}, "
                f"expected [{c.head_dim // 2}]"
            )

    @classmethod
    def hf_tensor_shape(cls, name: str, shape: list[int]) -> list[int]:
        """A safetensors shape -> the internal one (LFM2 squeezes its conv weight)."""
        return shape

    @classmethod
    def from_gguf_values(cls, name: str, arr: np.ndarray, c: Config) -> np.ndarray:
        """A dequantized GGUF tensor -> HF semantics (Gemma: llama.cpp stores norms as 1 + w)."""
        return arr

    @classmethod
    def to_gguf_values(cls, name: str, arr: np.ndarray, c: Config) -> np.ndarray:
        """The inverse of from_gguf_values (writing GGUF files, tests)."""
        return arr

    @classmethod
    def embed_scale(cls, c: Config) -> float | None:
        """A multiplier the host embedding table is pre-scaled by (Gemma: sqrt(hidden)), or None."""
        return None

    @classmethod
    def rope_permute_heads(cls, name: str, c: Config) -> int:
        """Heads to (un)permute this tensor's rows over when stored by llama.cpp, or 0."""
        if not cls.gguf_rope_permuted or not name.startswith("blk."):
            return 0
        suffix = name.split(".", 2)[2]
        if suffix in ("attn_q.weight", "attn_q.bias"):
            return c.n_heads
        if suffix in ("attn_k.weight", "attn_k.bias"):
            return c.n_kv_heads
        return 0

    @classmethod
    def from_gguf_layout(cls, name: str, rows: np.ndarray, c: Config) -> np.ndarray:
        """A GGUF tensor's rows (float, or raw quantized blocks: whole rows move) in HF order."""
        n = cls.rope_permute_heads(name, c)
        return rows[unpermute_index(rows.shape[0], n, name)] if n else rows

    @classmethod
    def to_gguf_layout(cls, name: str, rows: np.ndarray, c: Config) -> np.ndarray:
        """HF rows -> the order llama.cpp stores them in (writing GGUF files, tests)."""
        n = cls.rope_permute_heads(name, c)
        return rows[permute_index(rows.shape[0], n, name)] if n else rows

    # ---- reference forward -----------------------------------------------------------------------

    @classmethod
    def project_qkv(cls, c: Config, w: Weights, i: int, h: np.ndarray) -> tuple[np.ndarray, ...]:
        """Layer hook: normed hidden [T, H] -> q [T, n_heads, d], k, v [T, n_kv, d], before RoPE."""
        b = f"blk.{i}."
        T = h.shape[0]
        q = h @ w[b + "attn_q.weight"].T
        k = h @ w[b + "attn_k.weight"].T
        v = h @ w[b + "attn_v.weight"].T
        if c.qkv_bias:
            q, k, v = q + w[b + "attn_q.bias"], k + w[b + "attn_k.bias"], v + w[b + "attn_v.bias"]
        return (
            q.reshape(T, c.n_heads, c.head_dim),
            k.reshape(T, c.n_kv_heads, c.head_dim),
            v.reshape(T, c.n_kv_heads, c.head_dim),
        )

    @classmethod
    def forward(
        cls, c: Config, w: Weights, ids: Sequence[int], trace: dict[str, float] | None = None
    ) -> np.ndarray:
        """float32 logits [T, vocab] of a causal forward over `ids` from position 0.

        `trace` (optional) receives "residual_max": the largest |x| entering any RMSNorm (the
        graph writer sizes its fp16 norm prescale from it).

        Vectorized over positions (one matmul per weight); the tests hold it against an
        independent per-token loop with a KV cache.
        """
        T, d, g = len(ids), c.head_dim, c.n_heads // c.n_kv_heads
        x = np.asarray(w["token_embd.weight"], np.float32)[np.asarray(ids, np.int64)]
        ang = np.arange(T, dtype=np.float32)[:, None] * inv_freq(c, w.get("rope_freqs.weight"))[None, :]
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        future = np.triu(np.ones((T, T), bool), 1)
        scale = np.float32(1.0 / math.sqrt(d))
        peak = 0.0
        for i in range(c.n_layers):
            b = f"blk.{i}."
            peak = max(peak, float(np.abs(x).max()))
            h = rms_norm(x, w[b + "attn_norm.weight"], c.rms_eps)
            q, k, v = cls.project_qkv(c, w, i, h)
            q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)
            # GQA: query head j reads KV head j // g
            qg = q.reshape(T, c.n_kv_heads, g, d).transpose(1, 2, 0, 3)  # [kv, g, T, d]
            kt = k.transpose(1, 2, 0)[:, None]  # [kv, 1, d, T]
            s = (qg @ kt) * scale  # [kv, g, T, T]
            s = np.where(future, np.float32(-np.inf), s)
            s = np.exp(s - s.max(-1, keepdims=True))
            p = (s / s.sum(-1, keepdims=True)).astype(np.float32)
            o = p @ v.transpose(1, 0, 2)[:, None]  # [kv, g, T, d]
            o = o.transpose(2, 0, 1, 3).reshape(T, c.q_rows)
            x = x + o @ w[b + "attn_output.weight"].T
            peak = max(peak, float(np.abs(x).max()))
            x = swiglu_residual(c, w, b, x)
        return final_logits(c, w, x, peak, trace)
