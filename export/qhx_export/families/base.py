"""What every decoder family shares: the resolved config, the registry, the HF <-> GGUF maps and
the numpy float32 reference forward.

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
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from qhx_export import ExportError

Weights = Mapping[str, np.ndarray]


def f32_value(v: float) -> float:
    """A float as the shortest decimal that round-trips through f32 (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(v)))


@dataclass(frozen=True)
class Config:
    """A checkpoint's resolved architecture, the same whichever format it came from."""

    family: str
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # llama3 keys as HF names them, or None
    tied: bool  # lm-head shares token_embd.weight
    max_ctx: int | None  # trained context (max_position_embeddings / context_length)
    qkv_bias: bool
    qk_norm: bool
    # Families past the plain pre-norm decoder (Gemma 3, LFM2); the defaults are Llama's.
    layer_types: tuple[str, ...] | None = None  # HF names per layer; None: all full_attention
    sliding_window: int | None = None  # sliding_attention layers see this many positions
    rope_local_theta: float | None = None  # RoPE base of sliding_attention layers
    attn_scale: float | None = None  # q.k multiplier; None: 1 / sqrt(head_dim)
    act: str = "silu"  # silu | gelu_tanh
    conv_width: int | None = None  # LFM2 short-conv kernel (L_cache)
    post_norms: bool = False  # RMSNorms on the attention and FFN outputs too (Gemma 3)

    @property
    def types(self) -> tuple[str, ...]:
        """One layer type per layer ("full_attention", "sliding_attention" or "conv")."""
        return self.layer_types or ("full_attention",) * self.n_layers

    @property
    def attn_layers(self) -> list[int]:
        """Indices of the layers that have attention (and K/V)."""
        return [i for i, t in enumerate(self.types) if t != "conv"]

    @property
    def score_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def q_rows(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.n_kv_heads * self.head_dim

    def shape_params(self) -> dict[str, int]:
        """The shape keys every manifest's `params` (and Genie's source record) starts with."""
        return {
            "hidden": self.hidden,
            "vocab": self.vocab,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
        }


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


# -------------------------------------------------------------------------------------------------
# tensor names

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


# -------------------------------------------------------------------------------------------------
# numpy pieces of the reference forward


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(var + np.float32(eps))).astype(np.float32) * w


def inv_freq(c: Config, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2], with llama3 scaling (or GGUF rope_freqs divisors)."""
    d = c.head_dim
    inv = 1.0 / np.power(np.float32(c.rope_theta), np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    inv = inv.astype(np.float32)
    if freq_factors is not None:
        return (inv / np.asarray(freq_factors, np.float32)).astype(np.float32)
    rs = c.rope_scaling
    if not rs:
        return inv
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    wavelen = 2.0 * math.pi / inv.astype(np.float64)
    smooth = (old / wavelen - low) / (high - low)
    scaled = np.where(
        wavelen > old / low,
        inv / factor,
        np.where(wavelen < old / high, inv, (1.0 - smooth) * inv / factor + smooth * inv),
    )
    return scaled.astype(np.float32)


def rotate_half_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, d]; cos/sin [T, d/2]: HF's rotate-half RoPE (pairs i, i + d/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x / (np.float32(1.0) + np.exp(-x))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), HF's gelu_pytorch_tanh)."""
    x = np.asarray(x, np.float32)
    inner = np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x * x * x)
    return (np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))).astype(np.float32)


def rope_tables(
    c: Config, T: int, theta: float | None = None, freq_factors: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, head_dim / 2] for positions 0..T-1; `theta` overrides the base (no scaling)."""
    if theta is None:
        inv = inv_freq(c, freq_factors)
    else:
        d = c.head_dim
        inv = (
            1.0 / np.power(np.float32(theta), np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
        ).astype(np.float32)
    ang = np.arange(T, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def attention(c: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """Softmax attention of q [T, n_heads, d] over k, v [T, n_kv, d] (after RoPE); `hidden` [T, T]
    is True where a query may not see a key. Returns [T, n_heads * d]; GQA maps query head j to
    KV head j // (n_heads / n_kv_heads)."""
    T, d, g = q.shape[0], c.head_dim, c.n_heads // c.n_kv_heads
    qg = q.reshape(T, c.n_kv_heads, g, d).transpose(1, 2, 0, 3)  # [kv, g, T, d]
    kt = k.transpose(1, 2, 0)[:, None]  # [kv, 1, d, T]
    s = (qg @ kt) * np.float32(c.score_scale)  # [kv, g, T, T]
    s = np.where(hidden, np.float32(-np.inf), s)
    s = np.exp(s - s.max(-1, keepdims=True))
    p = (s / s.sum(-1, keepdims=True)).astype(np.float32)
    o = p @ v.transpose(1, 0, 2)[:, None]  # [kv, g, T, d]
    return o.transpose(2, 0, 1, 3).reshape(T, c.q_rows).astype(np.float32)


# -------------------------------------------------------------------------------------------------
# families


def _int(meta: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = meta.get(key, default)
    if v is None:
        raise ExportError(f"{where}: missing {key}")
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 0:
        raise ExportError(f"{where}: {key} is {v!r}, expected a non-negative integer")
    return int(v)


def _float(meta: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = meta.get(key, default)
    if v is None:
        raise ExportError(f"{where}: missing {key}")
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise ExportError(f"{where}: {key} is {v!r}, expected a number")
    return f32_value(float(v))


def rope_from_hf(cfg: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], Any]:
    """(object holding rope_theta, rope_scaling-like object or None) of a config.json.

    transformers < 5 writes top-level `rope_theta` / `rope_scaling`; transformers 5 writes
    `rope_parameters` ({"rope_theta", "rope_type", scaling keys}), which is then both."""
    rp = cfg.get("rope_parameters")
    if "rope_theta" in cfg or rp is None:
        return cfg, cfg.get("rope_scaling")
    if not isinstance(rp, Mapping):
        raise ExportError(f"{where}: rope_parameters is {rp!r}, expected an object")
    return rp, rp


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
    def emu_adds_one(cls, name: str) -> bool:
        """The emulator applies plain x^ * w: norms stored as 1 + w (Gemma) say True here."""
        return False

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


def swiglu_residual(c: Config, w: Weights, b: str, x: np.ndarray) -> np.ndarray:
    """x + down(silu(gate(n)) * up(n)), n = RMSNorm(x): the FFN half of a layer `b` ("blk.i.")."""
    n = rms_norm(x, w[b + "ffn_norm.weight"], c.rms_eps)
    m = silu(n @ w[b + "ffn_gate.weight"].T) * (n @ w[b + "ffn_up.weight"].T)
    return (x + m @ w[b + "ffn_down.weight"].T).astype(np.float32)


def final_logits(
    c: Config, w: Weights, x: np.ndarray, peak: float, trace: dict[str, float] | None
) -> np.ndarray:
    """The residual stream's last |x| into `peak` (recorded in `trace`), the final RMSNorm and
    the (tied or own) vocabulary projection: float32 logits [T, vocab]."""
    peak = max(peak, float(np.abs(x).max()))
    if trace is not None:
        trace["residual_max"] = max(trace.get("residual_max", 0.0), peak)
    x = rms_norm(x, w["output_norm.weight"], c.rms_eps)
    head = w["token_embd.weight"] if c.tied else w["output.weight"]
    return (x @ np.asarray(head, np.float32).T).astype(np.float32)


# -------------------------------------------------------------------------------------------------
# llama.cpp's q/k row permutation


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
