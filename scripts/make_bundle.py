#!/usr/bin/env python3
"""Turn a llama/qwen2 GGUF into a qhx bundle for the qnn-emu backend.

    make_bundle.py --gguf PATH --out DIR [--name smollm2] [--prefill-len 64] [--ctx 512]
                   [--io f32|f16] [--embed-dtype f32|f16] [--weights q|f32] [--model-name NAME]
    make_bundle.py --self-test

Needs only gguf, numpy and the standard library (no torch, no transformers).

Files written into DIR (each written as `<file>.tmp` and renamed, so a failed run never leaves a
half-written file):

* `<name>_prefill.bin`, `<name>_decode.bin`, `<name>_lmhead.bin`: emulator context binaries
  (tests/qnn-emu/FORMAT.md): `QHXEMUCB`, u32 version 1, u32 header length N, N bytes of JSON
  header, zero padding to D = align64(16 + N), then the weights, each at D + offset (64-aligned).
  The prefill/decode binaries carry every `blk.*` weight, the lm-head binary `output_norm.weight`
  plus `output.weight` (or `token_embd.weight` when the embedding is tied).
* `<name>_embed_<f32|f16>.bin`: headerless [vocab, hidden] row-major token embedding, dequantized.
* `tokenizer.json`: a HF `tokenizers` file rebuilt from the GGUF's `tokenizer.ggml.*` metadata
  (byte-level BPE), built to encode like transformers' own GGUF tokenizer conversion.
* `<name>.json`: the qhx manifest.

Weights. Shapes are written PyTorch-style [out, in]; GGUF lists dims fastest-first (ne0 = in),
and its data is already row-major with `in` contiguous, so only the shape list is reversed. With
`--weights q`, Q4_1 and Q8_0 tensors keep their raw GGML blocks (32 values per block along `in`),
F32 stays f32 and F16 stays f16; any other type, and everything with `--weights f32`, is
dequantized to f32 with `gguf.quants.dequantize`.

RoPE permutation. llama.cpp's converter reorders the rows of attn_q / attn_k so each head's
rotary pairs are adjacent (interleaved RoPE): HF row h*d + j*(d/2) + i is stored at GGUF row
h*d + 2*i + j (h = head, d = head_dim, j in {0, 1}, i < d/2). The qnn-emu graphs use HF
rotate-half RoPE, so we undo it: view the rows as (n, d/2, 2), swap to (n, 2, d/2), flatten.
n is n_heads for q and n_kv_heads for k. It only moves whole rows, so it is applied to the raw
quantized blocks (a row of a Q4_1 [rows, in] tensor is in/32 blocks of 20 bytes) and to q/k
biases. Qwen2 GGUFs are not permuted by llama.cpp, so nothing is undone for arch qwen2.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
import time

import numpy as np

MAGIC = b"QHXEMUCB"
FORMAT_VERSION = 1
ALIGN = 64
SOC_MODEL = 87
DSP_ARCH = "v81"
QK = 32  # values per Q4_1 / Q8_0 block
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}
ARCHES = ("llama", "qwen2")
PERMUTED_ARCHES = ("llama",)  # arches whose q/k rows llama.cpp permutes

# GGUF token types (llama.cpp llama_token_type)
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4

# Split patterns for `tokenizer.ggml.pre` values whose merges were learned with a split other
# than GPT-2's (which ByteLevel(use_regex=True) applies by itself).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "pixtral"),
                    _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# pre-tokenizer names that GPT-2's own split serves
PRE_GPT2 = {"default", "gpt2", "gpt-2", "smollm", "starcoder", "refact", "olmo", "jais"}


class BundleError(Exception):
    """Bad input: reported as one line and exit status 1."""


def log(msg: str) -> None:
    print(f"make_bundle: {msg}", file=sys.stderr)


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def f32_value(v) -> float:
    """A float as the shortest decimal that round-trips through f32 (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(v)))


@contextlib.contextmanager
def atomic_open(path: str):
    """Write `path.tmp`, rename to `path` on success, remove the tmp file on failure."""
    tmp = path + ".tmp"
    f = open(tmp, "wb")
    try:
        yield f
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# RoPE row permutation

def rope_unpermute_index(rows: int, n_heads: int) -> np.ndarray:
    """Row gather index taking GGUF (interleaved) q/k rows to HF (rotate-half) order:
    new[h*d + j*(d/2) + i] = old[h*d + 2*i + j]."""
    if n_heads <= 0 or rows % n_heads:
        raise BundleError(f"cannot unpermute {rows} rows over {n_heads} heads")
    d = rows // n_heads
    if d % 2:
        raise BundleError(f"head dim {d} is odd: cannot undo the RoPE permutation")
    return np.arange(rows).reshape(n_heads, d // 2, 2).transpose(0, 2, 1).reshape(-1)


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The permutation llama.cpp's converter applies (HF -> GGUF), for the self-test only."""
    r = w.shape[0]
    return w.reshape(n_heads, 2, r // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------
# Reference decoders of the emulator encodings, written from FORMAT.md (self-test only)

def decode_q4_1(raw: np.ndarray, shape) -> np.ndarray:
    b = raw.reshape(-1, 20)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)
    m = b[:, 2:4].copy().view("<f2").astype(np.float32)
    qs = b[:, 4:20]
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)  # j, then j + 16
    return (d * q + m).reshape(shape)


def decode_q8_0(raw: np.ndarray, shape) -> np.ndarray:
    b = raw.reshape(-1, 34)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)
    q = b[:, 2:34].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(shape)


# ---------------------------------------------------------------------------------------------
# GGUF reading

class Model:
    """The parts of a GGUF file a bundle needs."""

    def __init__(self, path: str):
        import gguf

        self.gguf = gguf
        self.path = path
        try:
            self.reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # gguf raises ValueError / struct.error / OSError on bad files
            raise BundleError(f"{path}: not a readable GGUF file ({e})") from e
        self.meta = {}
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.meta[key] = field.contents()
            except Exception as e:
                raise BundleError(f"{path}: cannot decode metadata {key} ({e})") from e
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.meta.get("general.architecture")
        if self.arch not in ARCHES:
            raise BundleError(f"{path}: general.architecture is {self.arch!r}; supported: {', '.join(ARCHES)}")
        self.params = self._params()

    def get(self, key, default=None):
        return self.meta.get(key, default)

    def need(self, key):
        if key not in self.meta:
            raise BundleError(f"{self.path}: missing metadata key {key}")
        return self.meta[key]

    def shape(self, name) -> list[int]:
        """PyTorch-order shape (GGUF lists ne0 first)."""
        return [int(x) for x in reversed(self.tensors[name].shape.tolist())]

    def _params(self) -> dict:
        a = self.arch
        hidden = int(self.need(f"{a}.embedding_length"))
        n_layers = int(self.need(f"{a}.block_count"))
        n_heads = int(self.need(f"{a}.attention.head_count"))
        n_kv = int(self.get(f"{a}.attention.head_count_kv", n_heads))
        ffn = int(self.need(f"{a}.feed_forward_length"))
        head_dim = int(self.get(f"{a}.rope.dimension_count", hidden // n_heads))
        eps = self.get(f"{a}.attention.layer_norm_rms_epsilon")
        if eps is None:
            raise BundleError(f"{self.path}: missing {a}.attention.layer_norm_rms_epsilon")
        if "token_embd.weight" not in self.tensors:
            raise BundleError(f"{self.path}: no token_embd.weight tensor")
        vocab, emb_hidden = self.shape("token_embd.weight")
        if emb_hidden != hidden:
            raise BundleError(f"token_embd.weight is {[vocab, emb_hidden]}, expected hidden {hidden}")
        meta_vocab = self.get(f"{a}.vocab_size")
        if meta_vocab is not None and int(meta_vocab) != vocab:
            raise BundleError(f"{a}.vocab_size {meta_vocab} != token_embd rows {vocab}")
        if n_heads % n_kv:
            raise BundleError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
        return {"arch": a, "hidden": hidden, "n_layers": n_layers, "n_heads": n_heads,
                "n_kv_heads": n_kv, "head_dim": head_dim, "ffn": ffn, "vocab": vocab,
                "rms_eps": f32_value(eps)}

    def check_shapes(self) -> None:
        """Every weight the graphs use exists with the shape FORMAT.md gives it."""
        p = self.params
        H, Dh, F, V = p["hidden"], p["head_dim"], p["ffn"], p["vocab"]
        Q, K = p["n_heads"] * Dh, p["n_kv_heads"] * Dh
        want = {"output_norm.weight": [H]}
        for i in range(p["n_layers"]):
            b = f"blk.{i}."
            want.update({b + "attn_norm.weight": [H], b + "attn_q.weight": [Q, H],
                         b + "attn_k.weight": [K, H], b + "attn_v.weight": [K, H],
                         b + "attn_output.weight": [H, Q], b + "ffn_norm.weight": [H],
                         b + "ffn_gate.weight": [F, H], b + "ffn_up.weight": [F, H],
                         b + "ffn_down.weight": [H, F]})
            for w, rows in (("q", Q), ("k", K), ("v", K)):
                if b + f"attn_{w}.bias" in self.tensors:
                    want[b + f"attn_{w}.bias"] = [rows]
        if "output.weight" in self.tensors:
            want["output.weight"] = [V, H]
        for name, shape in want.items():
            if name not in self.tensors:
                raise BundleError(f"{self.path}: missing tensor {name}")
            if self.shape(name) != shape:
                raise BundleError(f"{name}: shape {self.shape(name)}, expected {shape}")
        extra = [n for n in self.tensors if n.startswith("blk.") and n not in want]
        if extra:
            raise BundleError(f"tensors the graphs do not know: {', '.join(extra[:5])}")

    def weight(self, name: str, mode: str) -> tuple[str, list[int], np.ndarray]:
        """(enc, torch shape, array whose bytes are the encoded tensor), q/k rows unpermuted."""
        Q = self.gguf.GGMLQuantizationType
        t = self.tensors[name]
        shape = self.shape(name)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        qt = t.tensor_type
        if mode == "q" and qt in (Q.Q4_1, Q.Q8_0):
            enc = "q4_1" if qt == Q.Q4_1 else "q8_0"
            if shape[-1] % QK:
                raise BundleError(f"{name}: last dim {shape[-1]} is not a multiple of {QK}")
            arr = np.asarray(t.data, dtype=np.uint8).reshape(rows, shape[-1] // QK * BLOCK_BYTES[enc])
        elif mode == "q" and qt == Q.F16:
            enc, arr = "f16", np.asarray(t.data).view("<f2").reshape(shape)
        elif qt == Q.F32:
            enc, arr = "f32", np.asarray(t.data).view("<f4").reshape(shape)
        else:
            try:
                arr = self.gguf.quants.dequantize(t.data, qt)
            except NotImplementedError as e:
                raise BundleError(f"{name}: cannot dequantize {qt.name} ({e})") from e
            enc, arr = "f32", np.asarray(arr, dtype="<f4").reshape(shape)
        perm = self.rope_heads(name)
        if perm:
            arr = arr[rope_unpermute_index(shape[0], perm)]
        return enc, shape, np.ascontiguousarray(arr)

    def rope_heads(self, name: str) -> int:
        """Head count to unpermute this tensor's rows over, or 0 when it is not permuted."""
        if self.arch not in PERMUTED_ARCHES:
            return 0
        m = re.fullmatch(r"blk\.\d+\.attn_([qk])\.(weight|bias)", name)
        if not m:
            return 0
        return self.params["n_heads"] if m.group(1) == "q" else self.params["n_kv_heads"]

    def n_params(self) -> int:
        """Weights in the model, counted as transformers' num_parameters() does (a tied head
        once; llama3's rope_freqs is a buffer, not a parameter)."""
        return count_params({n: self.shape(n) for n in self.tensors})

    def embedding(self, dtype: str) -> np.ndarray:
        t = self.tensors["token_embd.weight"]
        emb = np.asarray(self.gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        emb = emb.reshape(self.shape("token_embd.weight"))
        return emb.astype("<f2" if dtype == "f16" else "<f4", copy=False)


def count_params(shapes: dict) -> int:
    """Sum of elements over GGUF-named tensor shapes, leaving out non-parameter buffers."""
    return sum(int(np.prod(sh)) for n, sh in shapes.items() if n != "rope_freqs.weight")


# ---------------------------------------------------------------------------------------------
# Context binaries

def scale_offset(dtype: str, lo: float, hi: float) -> tuple[float, int]:
    """QNN fixed-point params spanning [lo, hi] plus 5 % headroom (real = (q + offset) * scale);
    the same rule as qnn_emu::writer::scale_offset."""
    levels = {"ufixed16": 65535.0, "ufixed8": 255.0}.get(dtype)
    if levels is None:
        return 1.0, 0
    pad = 0.05 * max(hi - lo, 1e-3)
    lo, hi = min(lo, 0.0) - pad, max(hi, 0.0) + pad
    scale = float(np.float32((hi - lo) / levels))
    return scale, int(round(lo / scale))


def role(name: str) -> str:
    """Calibration role of an I/O tensor: past and new K/V of one layer share a range."""
    if name in ("x", "hidden"):
        return "x"
    if name in ("cos", "sin"):
        return "rope"
    if name == "cmask":
        return "mask"
    return name.removeprefix("past_").removeprefix("new_")


def io_tensor(name: str, dims, dtype: str, ranges: dict | None = None, y_role: str = "y") -> dict:
    scale, offset = 1.0, 0
    if dtype.startswith("ufixed"):
        r = y_role if name == "y" else role(name)
        # The mask minimum must beat any score against a never-written cache slot (zero bytes
        # decode to the range minimum, not 0.0); 0 stays exact (integer zero-point).
        lo, hi = {"rope": (-1.0, 1.0), "mask": (-30000.0, 0.0)}.get(r) or (ranges or {}).get(r) or (-32.0, 32.0)
        scale, offset = scale_offset(dtype, lo, hi)
    return {"name": name, "dtype": dtype, "dims": list(dims), "scale": scale, "offset": offset}


def graphs_for(p: dict, name: str, P: int, C: int, io: str, prefill: str = "window",
               layout: str = "pos_major", ranges: dict | None = None) -> dict[str, dict]:
    """Graph headers. prefill: "window" (AR=P, no past), "past" (chunked, reads the cache),
    or "none". layout: pos_major [rows, K] or head_major [n_kv, rows, head_dim] K/V."""
    H, Dh, V, L = p["hidden"], p["head_dim"], p["vocab"], p["n_layers"]
    nkv = p["n_kv_heads"]
    K = nkv * Dh

    def kv(rows):
        return [nkv, rows, Dh] if layout == "head_major" else [rows, K]

    # Fixed-point bundles apply the final norm in-graph: the raw residual stream carries
    # outliers (about 8000 in SmolLM2) that 16-bit activations cannot hold next to values of 1.
    final_norm = io.startswith("ufixed")

    def t(n, dims, dt=io):
        return io_tensor(n, dims, dt, ranges, "y_norm" if final_norm else "y")

    def per_layer(fmt, dims):
        return [t(fmt.format(kind=kind, i=i), dims) for i in range(L) for kind in ("k", "v")]

    # Logits stay f16 when activations are fixed point (W8A16 bundles keep an fp16 lm-head).
    lm_io = "f16" if io.startswith("ufixed") else io
    out = {
        "decode": {"name": f"{name}_decode", "kind": "decode", "seq": 1, "ctx": C, "kv_layout": layout,
                   "final_norm": final_norm,
                   "inputs": [t("x", [H]), t("cos", [Dh]), t("sin", [Dh]), t("cmask", [C])]
                   + per_layer("past_{kind}_{i}", kv(C)),
                   "outputs": [t("y", [H])] + per_layer("new_{kind}_{i}", kv(1))},
        "lmhead": {"name": f"{name}_lmhead", "kind": "lmhead", "seq": 1, "ctx": 0, "norm": not final_norm,
                   "inputs": [t("hidden", [H], lm_io)], "outputs": [t("logits", [V], lm_io)]},
    }
    if prefill != "none":
        past = prefill == "past"
        out["prefill"] = {
            "name": f"{name}_prefill", "kind": "prefill", "seq": P, "ctx": C if past else 0, "kv_layout": layout,
            "final_norm": final_norm,
            "inputs": [t("x", [P, H]), t("cos", [P, Dh]), t("sin", [P, Dh]), t("cmask", [P, C + P if past else P])]
            + (per_layer("past_{kind}_{i}", kv(C)) if past else []),
            "outputs": [t("y", [P, H])] + per_layer("new_{kind}_{i}", kv(P)),
        }
    return out


def write_graph_binaries(out_dir: str, name: str, p: dict, graphs: dict, blk, head, shared: bool) -> dict:
    """Write the context binaries; returns {role: {"bin"?, "graph"}} for the manifest plus
    {"_sizes": {file: bytes}}."""
    refs, sizes = {}, {}
    layer_graphs = [graphs[k] for k in ("prefill", "decode") if k in graphs]
    if graphs["decode"].get("final_norm"):
        blk = blk + [w for w in head if w[0] == "output_norm.weight"]
    if shared:
        f = f"{name}_shared.bin"
        sizes[f] = write_context(os.path.join(out_dir, f), p, layer_graphs, blk)
        refs["shared"] = {"bin": f}
        for k in ("prefill", "decode"):
            if k in graphs:
                refs[k] = {"graph": graphs[k]["name"]}
    else:
        for k in ("prefill", "decode"):
            if k in graphs:
                f = f"{name}_{k}.bin"
                sizes[f] = write_context(os.path.join(out_dir, f), p, [graphs[k]], blk)
                refs[k] = {"bin": f, "graph": graphs[k]["name"]}
    f = f"{name}_lmhead.bin"
    sizes[f] = write_context(os.path.join(out_dir, f), p, [graphs["lmhead"]], head)
    refs["lmhead"] = {"bin": f, "graph": graphs["lmhead"]["name"]}
    return {"refs": refs, "sizes": sizes}


def load_ranges(path: str | None) -> dict | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return {k: tuple(v) for k, v in json.load(f).items()}


def write_context(path: str, model_hdr: dict, graphs: list[dict], weights) -> int:
    """weights: list of (name, enc, shape, array). Returns the file size."""
    entries, off = [], 0
    for name, enc, shape, arr in weights:
        entries.append({"name": name, "enc": enc, "shape": list(shape), "offset": off, "nbytes": arr.nbytes})
        off = align(off + arr.nbytes)
    header = {"model": model_hdr, "soc_model": SOC_MODEL, "dsp_arch": DSP_ARCH,
              "null_compute": False, "graphs": graphs, "weights": entries}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    data_start = align(16 + len(hb))
    with atomic_open(path) as f:
        f.write(MAGIC + struct.pack("<II", FORMAT_VERSION, len(hb)) + hb)
        f.write(b"\0" * (data_start - f.tell()))
        for (_, _, _, arr), e in zip(weights, entries):
            f.write(b"\0" * (data_start + e["offset"] - f.tell()))
            f.write(memoryview(arr).cast("B"))
        size = f.tell()
    return size


def read_context(path: str) -> tuple[dict, int, bytes]:
    """Parse a context binary back (self-test): (header, data start D, file bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != MAGIC:
        raise AssertionError(f"{path}: bad magic")
    version, n = struct.unpack_from("<II", blob, 8)
    assert version == FORMAT_VERSION, version
    header = json.loads(blob[16:16 + n])
    d = align(16 + n)
    assert not any(blob[16 + n:d]), "padding not zero"
    for w in header["weights"]:
        assert w["offset"] % ALIGN == 0 and d + w["offset"] + w["nbytes"] <= len(blob), w
    return header, d, blob


# ---------------------------------------------------------------------------------------------
# Tokenizer

def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, spare = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + spare)
            spare += 1
    return table


def build_tokenizer(m: Model) -> dict:
    """A `tokenizers` JSON (byte-level BPE) from the GGUF's tokenizer metadata."""
    kind = m.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise BundleError(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is supported")
    tokens = m.need("tokenizer.ggml.tokens")
    merges = m.need("tokenizer.ggml.merges")
    types = m.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise BundleError("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")

    table = byte_alphabet()
    alphabet = set(table.values())

    def spelled(tok: str) -> str:
        # llama.cpp stores a few tokens as plain text; the BPE model needs them byte-spelled
        return tok if set(tok) <= alphabet else "".join(table[b] for b in tok.encode("utf-8"))

    vocab = {}
    for i, tok in enumerate(tokens):
        # A control token outside the byte alphabet (DeepSeek's '<｜User｜>') keeps its raw text
        # as vocab key: `tokenizers` binds an added token to the vocab id of its content.
        s = tok if types[i] == TOKEN_CONTROL else spelled(tok)
        if s in vocab:
            log(f"warning: token {i} {tok!r} duplicates token {vocab[s]}; the later id wins")
        vocab[s] = i

    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty == TOKEN_CONTROL:
            # Added tokens match raw text, so non-byte-alphabet spellings such as
            # DeepSeek's '<｜User｜>' are fine here (the vocab gets the byte-level spelling).
            special = True
        elif ty == TOKEN_USER_DEFINED:
            if tok not in vocab:
                log(f"warning: user-defined token {i} {tok!r} is not in the BPE vocab; not added")
                continue
            special = False  # matched whole, but kept in decoded text (like `<think>`)
        else:
            continue
        added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": special})

    pairs = []
    for k, mg in enumerate(merges):
        a, sep, b = mg.partition(" ")
        if not sep or not a or not b or " " in b:
            raise BundleError(f"tokenizer.ggml.merges[{k}] = {mg!r} is not 'A B'")
        pairs.append([a, b])

    prefix_space = bool(m.get("tokenizer.ggml.add_space_prefix", False))
    pre = m.get("tokenizer.ggml.pre", "default")
    if pre in PRE_SPLITS:
        pre_tok = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRE_SPLITS[pre]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": True, "use_regex": False}]}
    else:
        if pre not in PRE_GPT2:
            log(f"warning: tokenizer.ggml.pre {pre!r} unknown; using GPT-2's split")
        pre_tok = {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": True, "use_regex": True}

    post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    template = bos_eos_template(m, tokens)
    if template:
        post = {"type": "Sequence", "processors": [post, template]}

    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added, "normalizer": None, "pre_tokenizer": pre_tok,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": pairs},
    }


def bos_eos_template(m: Model, tokens) -> dict | None:
    """TemplateProcessing adding BOS / EOS when the GGUF asks for them, else None."""
    ends = {}
    for which in ("bos", "eos"):
        if m.get(f"tokenizer.ggml.add_{which}_token", False):
            tid = m.get(f"tokenizer.ggml.{which}_token_id")
            if tid is None:
                raise BundleError(f"tokenizer.ggml.add_{which}_token is set but {which}_token_id is missing")
            ends[which] = (tokens[int(tid)], int(tid))
    if not ends:
        return None

    def seq(name, type_id):
        out = [{"SpecialToken": {"id": ends["bos"][0], "type_id": type_id}}] if "bos" in ends else []
        out.append({"Sequence": {"id": name, "type_id": type_id}})
        if "eos" in ends:
            out.append({"SpecialToken": {"id": ends["eos"][0], "type_id": type_id}})
        return out

    return {"type": "TemplateProcessing", "single": seq("A", 0), "pair": seq("A", 0) + seq("B", 1),
            "special_tokens": {tok: {"id": tok, "ids": [tid], "tokens": [tok]} for tok, tid in ends.values()}}


# ---------------------------------------------------------------------------------------------
# Manifest

def rope_scaling(m: Model) -> dict | None:
    """llama3-style rope scaling from `<arch>.rope.scaling.*`, if the file states it."""
    pre = f"{m.arch}.rope.scaling."
    keys = {k[len(pre):]: v for k, v in m.meta.items() if k.startswith(pre)}
    if "rope_freqs.weight" in m.tensors:
        log("warning: rope_freqs.weight (per-frequency factors) is present and not carried into the bundle")
    if keys.get("type") != "llama3" and not ({"low_freq_factor", "high_freq_factor"} & keys.keys()):
        if keys.get("type") not in (None, "none"):
            log(f"warning: rope scaling type {keys.get('type')!r} is not carried into the manifest")
        return None
    return {"rope_type": "llama3",
            "factor": f32_value(keys.get("factor", 8.0)),
            "low_freq_factor": f32_value(keys.get("low_freq_factor", 1.0)),
            "high_freq_factor": f32_value(keys.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings": int(keys.get("original_context_length", 8192))}


def default_model_name(gguf_path: str) -> str:
    """SmolLM2-135M-Instruct.Q4_1.gguf -> smollm2-135m-instruct."""
    stem = os.path.basename(gguf_path)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.I)
    stem = re.sub(r"[._-](I?Q\d\w*|F16|F32|BF16)$", "", stem, flags=re.I)
    return stem.lower()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def manifest(m: Model, args, files: dict, encs: set[str], dequantized: set[str], refs: dict) -> dict:
    p = m.params
    add_bos = bool(m.get("tokenizer.ggml.add_bos_token", False))
    bos = m.get("tokenizer.ggml.bos_token_id")
    eos = m.get("tokenizer.ggml.eos_token_id")
    params = {"hidden": p["hidden"], "vocab": p["vocab"], "n_layers": p["n_layers"],
              "n_heads": p["n_heads"], "n_kv_heads": p["n_kv_heads"], "head_dim": p["head_dim"],
              "max_ctx": args.ctx,
              "rope_theta": f32_value(m.get(f"{m.arch}.rope.freq_base", 10000.0)),
              "bos_token_id": int(bos) if add_bos and bos is not None else None,
              "eos_token_id": int(eos) if eos is not None else None}
    rs = rope_scaling(m)
    if rs:
        params["rope_scaling"] = rs
    if args.weights == "q":
        quant = sorted(encs & set(BLOCK_BYTES))
        desc = (f"{'/'.join(quant)} raw blocks (dequantized by the emulator as gguf/transformers do)"
                if quant else "f32/f16 as stored")
        if dequantized:
            desc += f"; {'/'.join(sorted(dequantized))} dequantized to f32 with gguf.quants.dequantize"
    else:
        desc = "f32 (dequantized with gguf.quants.dequantize)"
    out = {
        "schema_version": 1,
        "model": {"name": args.model_name or default_model_name(args.gguf), "family": "llm",
                  "arch": m.arch, "dsp_arch": DSP_ARCH, "soc_model": SOC_MODEL,
                  "n_params": m.n_params()},
        "params": params,
        "artifacts": {"contexts": refs,
                      "embed": {"file": files["embed"], "dtype": args.embed_dtype},
                      "tokenizer": files["tokenizer"]},
        "plan": {"op": "llama_generate", "ar": args.prefill_len if args.prefill != "none" else 1},
        "source": {"gguf": os.path.basename(args.gguf), "gguf_sha256": sha256_file(args.gguf),
                   "writer": "scripts/make_bundle.py", "weights": desc},
    }
    template = m.get("tokenizer.chat_template")
    if template:
        out["chat"] = {"template": template}
    return out


# ---------------------------------------------------------------------------------------------
# Bundle

def build(args) -> dict[str, int]:
    """Write the bundle; returns {file name: size}."""
    t0 = time.monotonic()
    if not os.path.isfile(args.gguf):
        raise BundleError(f"{args.gguf}: no such file")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", args.name):
        raise BundleError(f"--name {args.name!r}: use letters, digits, '_', '-', '.'")
    if args.prefill_len < 1 or args.ctx < 1:
        raise BundleError("--prefill-len and --ctx must be positive")
    if args.prefill_len > args.ctx:
        raise BundleError(f"--prefill-len {args.prefill_len} exceeds --ctx {args.ctx}")
    m = Model(args.gguf)
    m.check_shapes()
    p = m.params
    log(f"{os.path.basename(args.gguf)}: {p['arch']} hidden={p['hidden']} layers={p['n_layers']} "
        f"heads={p['n_heads']}/{p['n_kv_heads']} head_dim={p['head_dim']} ffn={p['ffn']} vocab={p['vocab']}")
    os.makedirs(args.out, exist_ok=True)

    Q = m.gguf.GGMLQuantizationType
    kept = {Q.F32} | ({Q.Q4_1, Q.Q8_0, Q.F16} if args.weights == "q" else set())
    dequantized = {m.tensors[n].tensor_type.name.lower() for n in m.tensors if m.tensors[n].tensor_type not in kept}

    def load(names):
        return [(n, *m.weight(n, args.weights)) for n in names]

    if args.io.startswith("ufixed") and not args.calib:
        raise BundleError(f"--io {args.io} needs --calib (value ranges recorded with QNN_EMU_CALIBRATE)")
    graphs = graphs_for(p, args.name, args.prefill_len, args.ctx, args.io, args.prefill, args.kv_layout,
                        load_ranges(args.calib))
    files, sizes, encs = {}, {}, set()
    blk = load([n for n in m.tensors if n.startswith("blk.")])
    head_w = "output.weight" if "output.weight" in m.tensors else "token_embd.weight"
    head = load(["output_norm.weight", head_w])
    encs |= {w[1] for w in blk + head}
    written = write_graph_binaries(args.out, args.name, p, graphs, blk, head, args.shared)
    sizes.update(written["sizes"])
    del blk, head

    files["embed"] = f"{args.name}_embed_{args.embed_dtype}.bin"
    emb = m.embedding(args.embed_dtype)  # (fixed-point bundles use an f16 table)
    with atomic_open(os.path.join(args.out, files["embed"])) as f:
        f.write(memoryview(np.ascontiguousarray(emb)).cast("B"))
    sizes[files["embed"]] = emb.nbytes
    del emb

    files["tokenizer"] = "tokenizer.json"
    tok = json.dumps(build_tokenizer(m), ensure_ascii=False, indent=1).encode("utf-8")
    with atomic_open(os.path.join(args.out, files["tokenizer"])) as f:
        f.write(tok)
    sizes[files["tokenizer"]] = len(tok)

    man_name = f"{args.name}.json"
    man = json.dumps(manifest(m, args, files, encs, dequantized, written["refs"]), indent=2,
                     ensure_ascii=False).encode("utf-8") + b"\n"
    with atomic_open(os.path.join(args.out, man_name)) as f:
        f.write(man)
    sizes[man_name] = len(man)

    for name, size in sizes.items():
        log(f"wrote {os.path.join(args.out, name)} ({size} bytes)")
    log(f"done in {time.monotonic() - t0:.1f}s")
    return sizes


# ---------------------------------------------------------------------------------------------
# Self-test

def self_test() -> None:
    import gguf

    rng = np.random.default_rng(7)
    Q = gguf.GGMLQuantizationType
    H, NH, NKV, DH, FF, V, L = 128, 4, 2, 32, 96, 300, 2

    # 1. in memory: unpermuting raw Q4_1 / Q8_0 rows == permuting the dequantized matrix, and it
    #    exactly inverts llama.cpp's permutation (quantization is per row, so it commutes).
    for rows, n in ((NH * DH, NH), (NKV * DH, NKV)):
        hf = rng.standard_normal((rows, H)).astype(np.float32)
        idx = rope_unpermute_index(rows, n)
        assert np.array_equal(llama_cpp_permute(hf, n)[idx], hf), "unpermute does not invert llama.cpp's"
        for qt, dec in ((Q.Q4_1, decode_q4_1), (Q.Q8_0, decode_q8_0)):
            stored = gguf.quants.quantize(llama_cpp_permute(hf, n), qt)  # what a GGUF holds
            raw_fixed = stored[idx]  # our row-wise fix on raw blocks
            want = gguf.quants.dequantize(stored, qt)[idx]
            assert np.array_equal(gguf.quants.dequantize(raw_fixed, qt), want), qt
            assert np.array_equal(dec(raw_fixed, (rows, H)), want), f"FORMAT.md {qt.name} decode"
            assert np.array_equal(want, gguf.quants.dequantize(gguf.quants.quantize(hf, qt), qt)), qt
        bias = rng.standard_normal(rows).astype(np.float32)
        assert np.array_equal(llama_cpp_permute(bias, n)[idx], bias)
    # head h, pair (i, j): HF row h*d + j*d/2 + i comes from GGUF row h*d + 2i + j
    idx = rope_unpermute_index(2 * 8, 2)
    assert all(idx[h * 8 + j * 4 + i] == h * 8 + 2 * i + j for h in range(2) for j in range(2) for i in range(4))

    # 2. end to end through a tiny 2-layer llama GGUF
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "Tiny-Test.Q4_1.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(L); w.add_embedding_length(H); w.add_feed_forward_length(FF)
        w.add_head_count(NH); w.add_head_count_kv(NKV); w.add_rope_dimension_count(DH)
        w.add_layer_norm_rms_eps(1e-5); w.add_rope_freq_base(10000.0); w.add_context_length(256)
        byte_toks = [byte_alphabet()[b] for b in range(256)]
        toks = ["<|endoftext|>", "<|im_start|>", "<think>"] + byte_toks + ["he", "ll", "hell", "hello"]
        toks += [f"<pad{i}>" for i in range(V - len(toks))]
        w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("smollm")
        w.add_token_list(toks)
        w.add_token_types([3, 3, 4] + [1] * (V - 3))
        w.add_token_merges(["h e", "l l", "he ll", "hell o"])
        w.add_bos_token_id(1); w.add_eos_token_id(0); w.add_add_bos_token(False); w.add_add_space_prefix(False)
        hf, stored_type = {}, {}

        def add(name, arr, qt):
            hf[name], stored_type[name] = arr, qt
            if name.endswith(("attn_q.weight", "attn_k.weight")):
                arr = llama_cpp_permute(arr, NH if "attn_q" in name else NKV)
            w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)

        add("token_embd.weight", rng.standard_normal((V, H)).astype(np.float32), Q.Q8_0)
        for i in range(L):
            b = f"blk.{i}."
            add(b + "attn_norm.weight", rng.standard_normal(H).astype(np.float32), Q.F32)
            add(b + "ffn_norm.weight", rng.standard_normal(H).astype(np.float32), Q.F32)
            for nm, shape in (("attn_q", (NH * DH, H)), ("attn_k", (NKV * DH, H)), ("attn_v", (NKV * DH, H)),
                              ("attn_output", (H, NH * DH)), ("ffn_gate", (FF, H)), ("ffn_up", (FF, H)),
                              ("ffn_down", (H, FF))):
                add(b + nm + ".weight", rng.standard_normal(shape).astype(np.float32), Q.Q4_1)
        add("output_norm.weight", rng.standard_normal(H).astype(np.float32), Q.F32)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

        for mode in ("q", "f32"):
            out = os.path.join(tmp, f"out-{mode}")
            args = argparse.Namespace(gguf=path, out=out, name="tiny", prefill_len=8, ctx=32, io="f32",
                                      embed_dtype="f32", weights=mode, model_name=None,
                                      prefill="window", kv_layout="pos_major", shared=False, calib=None)
            sizes = build(args)
            for k in ("prefill", "decode", "lmhead"):
                header, d, blob = read_context(os.path.join(out, f"tiny_{k}.bin"))
                assert header["graphs"][0]["name"] == f"tiny_{k}" and header["model"]["head_dim"] == DH
                for e in header["weights"]:
                    raw = np.frombuffer(blob, np.uint8, e["nbytes"], d + e["offset"])
                    dec = {"q4_1": decode_q4_1, "q8_0": decode_q8_0,
                           "f32": lambda r, s: r.view("<f4").reshape(s)}[e["enc"]](raw, e["shape"])
                    qt = stored_type[e["name"]]
                    want = gguf.quants.dequantize(gguf.quants.quantize(hf[e["name"]], qt), qt)
                    assert e["enc"] in (("q4_1", "q8_0", "f32") if mode == "q" else ("f32",)), e
                    assert np.array_equal(dec, want.reshape(e["shape"])), e["name"]
            lm = header["graphs"][0]  # the last binary read is the lm-head
            assert [t["name"] for t in lm["inputs"]] == ["hidden"] and lm["outputs"][0]["dims"] == [V]
            emb = np.fromfile(os.path.join(out, "tiny_embed_f32.bin"), "<f4").reshape(V, H)
            assert np.array_equal(emb, gguf.quants.dequantize(gguf.quants.quantize(hf["token_embd.weight"], Q.Q8_0), Q.Q8_0))
            man = json.load(open(os.path.join(out, "tiny.json")))
            assert man["params"]["head_dim"] == DH and man["params"]["bos_token_id"] is None
            assert man["model"]["name"] == "tiny-test" and set(sizes) >= {"tiny.json", "tokenizer.json"}
            assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
            try:
                from tokenizers import Tokenizer
            except ImportError:
                log("self-test: tokenizers not installed, tokenizer.json load skipped")
            else:
                tk = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
                enc = tk.encode("hello<|im_start|><think>hi", add_special_tokens=True)
                assert enc.ids == [toks.index("hello"), 1, 2, toks.index("h"), toks.index("i")], enc.ids
                assert tk.decode(enc.ids, skip_special_tokens=False) == "hello<|im_start|><think>hi"
    log("self-test passed")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # bad usage is bad input: exit 1, not argparse's 2
        self.print_usage(sys.stderr)
        print(f"make_bundle: error: {message}", file=sys.stderr)
        sys.exit(1)


def main(argv=None) -> int:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="input GGUF (llama or qwen2 arch)")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--name", default="smollm2", help="file / graph name prefix (default smollm2)")
    ap.add_argument("--prefill-len", type=int, default=64, help="prefill rows P (default 64)")
    ap.add_argument("--ctx", type=int, default=512, help="KV capacity C (default 512)")
    ap.add_argument("--io", choices=("f32", "f16", "ufixed16"), default="f32", help="graph I/O dtype")
    ap.add_argument("--prefill", choices=("window", "past", "none"), default="window",
                    help="prefill graph: AR=P window (default), chunked with past K/V inputs, or none")
    ap.add_argument("--kv-layout", choices=("pos_major", "head_major"), default="pos_major")
    ap.add_argument("--shared", action="store_true", help="prefill and decode graphs in one binary")
    ap.add_argument("--calib", help="value ranges JSON (QNN_EMU_CALIBRATE) for fixed-point I/O")
    ap.add_argument("--embed-dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--weights", choices=("q", "f32"), default="q",
                    help="q: keep Q4_1/Q8_0 blocks (default); f32: dequantize everything")
    ap.add_argument("--model-name", help="manifest model.name (default: from the GGUF file name)")
    ap.add_argument("--self-test", action="store_true", help="run the built-in checks and exit")
    args = ap.parse_args(argv)
    try:
        if args.self_test:
            self_test()
            return 0
        if not args.gguf or not args.out:
            ap.error("--gguf and --out are required")
        build(args)
    except BundleError as e:
        print(f"make_bundle: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"make_bundle: error: {e} (run scripts/fetch-assets.sh and use its venv)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
