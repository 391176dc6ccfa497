"""A token loop over a bundle's graphs through onnxruntime: the host side of qhx_generate written
again from the graph contract (tests/qnn-emu/FORMAT.md), not from qhx's Rust.

It drives either the bundle's QNN context binaries (the EPContext wrappers next to them, through
ORT's QNN EP on the HTP simulator: the same backend and binaries qhx_generate runs, so greedy ids
must be equal) or ONNX graphs on ORT's CPU EP (calibration, and fast agreement tables). Host work:
embedding rows, RoPE cos/sin, additive masks, K/V rows into the cache, quantize / dequantize of
fixed-point I/O. Other layer shapes (the manifest's `layers` section, or without one the LFM2
contract: a layer is conv when the decode graph has `past_conv_<i>`): sliding_attention layers get
their own RoPE rows and a window mask (HF's rule: a key at k is visible to the query at q iff
q - window < k <= q); conv layers' state is seeded from the prefill's `conv_bx_<i>` (the last W
real rows, zeros before the prompt) and carried from `present_conv_<i>` after each decode step.

It also follows qhx's speculative schedule (`generate_spec`: prompt-lookup drafts verified in one
rows execute over the cache, rewound by position and mask), and runs as a command for the real
backend's parity checks (tests/harness/real_parity.py):

    python -m qhx_export.verify.loop MANIFEST N_TOKENS --ids 1,2,3 [--teacher 4,5,6]
    python -m qhx_export.verify.loop MANIFEST 0 --jobs JOBS.json [--fp32-twin]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

ONNX_TYPES = {
    "tensor(float)": "f32",
    "tensor(float16)": "f16",
    "tensor(uint16)": "ufixed16",
    "tensor(uint8)": "ufixed8",
}
NP_TYPES = {"f32": np.float32, "f16": np.float16, "ufixed16": np.uint16, "ufixed8": np.uint8}


def _libm() -> Any:
    """The C library's f32 math (glibc libm), which qhx's host (Rust f32 powf / sin_cos) calls;
    None where it cannot be loaded."""
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for fn in ("powf", "sinf", "cosf"):
            f = getattr(lib, fn)
            f.restype = ctypes.c_float
            f.argtypes = [ctypes.c_float] * (2 if fn == "powf" else 1)
    except (OSError, AttributeError):
        return None
    return lib


LIBM = _libm()


def host_inv_freq(theta: float, head_dim: int, scaling: dict[str, Any] | None) -> np.ndarray:
    """RoPE inverse frequencies as qhx's host computes them: 1 / powf(theta, 2i / d) in f32 (numpy's
    f32 power differs from libm's powf in the last bit for ~15 % of them); llama3 scaling as in
    families.reference.inv_freq."""
    from qhx_export.families.reference import inv_freq

    if scaling or LIBM is None:
        return inv_freq(_RopeCfg(theta, head_dim, scaling))  # type: ignore[arg-type]
    d = np.float32(head_dim)
    base = [LIBM.powf(np.float32(theta), np.float32(2 * i) / d) for i in range(head_dim // 2)]
    return (np.float32(1.0) / np.asarray(base, np.float32)).astype(np.float32)


def rope_rows(inv: np.ndarray, pos0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, Dh] for positions pos0.., rotate-half layout (each frequency twice), with the
    host's f32 angle and libm's f32 sinf / cosf (numpy's f32 cos differs by an ulp for ~5 % of
    the angles, which can flip an fp16 near-tie between qhx_generate and this loop)."""
    a = (inv[None, :] * np.arange(pos0, pos0 + n, dtype=np.float32)[:, None]).astype(np.float32)
    if LIBM is None:
        c, s = np.cos(a.astype(np.float64)), np.sin(a.astype(np.float64))
    else:
        c = np.frompyfunc(LIBM.cosf, 1, 1)(a).astype(np.float64)
        s = np.frompyfunc(LIBM.sinf, 1, 1)(a).astype(np.float64)
    c, s = c.astype(np.float32), s.astype(np.float32)
    return np.concatenate([c, c], axis=1), np.concatenate([s, s], axis=1)


class Io:
    """One graph tensor: float, or QNN fixed point (real = (q + offset) * scale)."""

    def __init__(
        self, name: str, dims: Sequence[int], dtype: str = "f32", scale: float = 1.0, offset: int = 0
    ) -> None:
        self.name, self.dims, self.dtype = name, [int(d) for d in dims], dtype
        self.scale, self.offset = scale, offset
        self.np = NP_TYPES[dtype]

    def encode(self, real: np.ndarray) -> np.ndarray:
        if self.dtype in ("f32", "f16"):
            return np.asarray(real, self.np)
        hi = 65535 if self.dtype == "ufixed16" else 255
        r = np.asarray(real, np.float32)
        # qhx's rounding: the quotient in f32, then rounded half away from zero exactly (in f64:
        # in f32, x + 0.5 itself rounds, e.g. 10000.4999 + 0.5 -> 10001, one code off qhx's)
        x = (r / np.float32(self.scale)).astype(np.float64)
        q = np.trunc(x + np.copysign(0.5, x)) - self.offset
        return np.clip(q, 0, hi).astype(self.np)

    def decode(self, raw: np.ndarray) -> np.ndarray:
        if self.dtype in ("f32", "f16"):
            return np.asarray(raw, np.float32)
        return ((raw.astype(np.float32) + np.float32(self.offset)) * np.float32(self.scale)).astype(
            np.float32
        )

    def zero(self) -> np.ndarray:
        """Real 0 (a fixed-point tensor's zero point, not raw 0): what an unwritten cache slot
        holds, as in qhx_generate (the HTP's softmax leaves masked slots a trace of weight)."""
        return self.encode(np.zeros(self.dims, np.float32)).reshape(self.dims)

    def neg(self) -> float:
        """The additive 'hidden' mask value: -inf for float, the range minimum for fixed point."""
        if self.dtype in ("f32", "f16"):
            return float("-inf")
        return float(self.decode(np.zeros(1, self.np))[0])


def io_of(
    args: Sequence[Any], types: dict[str, str], quant: dict[str, tuple[float, int]], cls: type[Io] = Io
) -> dict[str, Io]:
    """{name: tensor} of an ORT session's inputs or outputs, with their fixed-point parameters."""
    return {a.name: cls(a.name, a.shape, types[a.type], *quant.get(a.name, (1.0, 0))) for a in args}


class Graph:
    def __init__(self, sess: Any, quant: dict[str, tuple[float, int]]) -> None:
        self.sess = sess
        self.inputs = io_of(sess.get_inputs(), ONNX_TYPES, quant)
        self.outputs = io_of(sess.get_outputs(), ONNX_TYPES, quant)
        self.feeds = {n: t.zero() for n, t in self.inputs.items()}
        self.record: list[dict[str, np.ndarray]] | None = None  # every execute's feeds (real values)

    def set(self, name: str, real: np.ndarray) -> None:
        t = self.inputs[name]
        self.feeds[name] = t.encode(np.asarray(real, np.float32).reshape(-1)).reshape(t.dims)

    def run(self) -> dict[str, np.ndarray]:
        if self.record is not None:
            self.record.append({n: self.inputs[n].decode(v).copy() for n, v in self.feeds.items()})
        outs = self.sess.run(None, self.feeds)
        return {o.name: v for o, v in zip(self.sess.get_outputs(), outs, strict=True)}


class Loop:
    """The host side of a bundle: manifest params, embedding, and the prefill/decode/lmhead graphs."""

    def __init__(
        self,
        man: dict[str, Any],
        root: str,
        graphs: dict[str, Graph],
        neg_override: float | None = None,
        embed: np.ndarray | None = None,
    ) -> None:
        p = man["params"]
        self.man, self.root, self.graphs = man, root, graphs
        self.H, self.Dh, self.L = p["hidden"], p["head_dim"], p["n_layers"]
        self.nkv = p.get("n_kv_heads") or p["kv_dim"] // self.Dh  # LFM2 schema-v1 gives kv_dim
        if embed is None:
            e = man["artifacts"]["embed"]
            e = {"file": e, "dtype": "f16"} if isinstance(e, str) else e
            dt = "<f2" if e.get("dtype", "f16") == "f16" else "<f4"
            embed = np.fromfile(os.path.join(root, e["file"]), dt).reshape(-1, self.H)
        self.embed = embed
        self.inv = host_inv_freq(p["rope_theta"], self.Dh, p.get("rope_scaling"))
        self.pre, self.dec, self.lm = graphs.get("prefill"), graphs["decode"], graphs.get("lmhead")
        self.ver = graphs.get("verify")  # a few rows over the decode cache (speculative decoding)
        self.C = self.dec.inputs["cmask"].dims[0]
        # a context ladder (roles `decode@C`, ...): each rung's prefill / verify / decode graphs,
        # smallest cache first; a prefill without past inputs (a window) serves every rung
        window = self.pre if self.pre is not None and not self.has_past(self.pre) else None
        sizes = sorted({int(r.split("@")[1]) for r in graphs if "@" in r})
        self.ladder = [
            {
                "prefill": graphs.get(f"prefill@{c}", window),
                "verify": graphs.get(f"verify@{c}"),
                "decode": graphs[f"decode@{c}"],
                "C": c,
            }
            for c in sizes
        ] + [{"prefill": self.pre, "verify": self.ver, "decode": self.dec, "C": self.C}]
        self.top_C = self.C
        self.rung = len(self.ladder) - 1
        layers = man.get("layers") or {}
        self.types = list(layers.get("types") or [])
        if not self.types:
            self.types = [
                "conv" if f"past_conv_{i}" in self.dec.inputs else "full_attention" for i in range(self.L)
            ]
        self.window = int(layers.get("sliding_window") or 0)
        local = (layers.get("rope") or {}).get("sliding_attention")
        self.inv_local = host_inv_freq(local["theta"], self.Dh, local.get("scaling")) if local else None
        self.conv_w = int(((layers.get("state") or {}).get("conv") or {}).get("width", 3))
        self.neg_override = neg_override
        self.reset()

    def reset(self) -> None:
        """An empty cache (every input real 0), position 0, on the smallest rung."""
        for g in self.graphs.values():
            for n, t in g.inputs.items():
                g.feeds[n] = t.zero()
        self.pos = 0
        self._enter(0)
        self.dmask = np.full(self.C, self.neg(self.dec.inputs["cmask"]), np.float32)
        self.dec.set("cmask", self.dmask)
        self.hidden: np.ndarray | None = None

    @staticmethod
    def has_past(g: Graph) -> bool:
        return any(k.startswith("past_k_") for k in g.inputs)

    def _enter(self, r: int) -> None:
        rung = self.ladder[r]
        self.rung, self.pre, self.ver, self.dec, self.C = (
            r,
            rung["prefill"],
            rung["verify"],
            rung["decode"],
            rung["C"],
        )

    def fits(self, kind: str, need: int) -> bool:
        """Some rung has a `kind` graph whose cache holds `need` more slots from here."""
        return any(r[kind] is not None and self.pos + need <= r["C"] for r in self.ladder)

    def climb(self, kind: str, need: int) -> None:
        """As qhx's runner: the execute goes to the smallest rung whose `kind` graph holds `need`
        more slots; the cache moves there first (rows [0, pos) copied, the rest real 0, the mask
        following)."""
        if len(self.ladder) == 1:
            return
        to = next(i for i, r in enumerate(self.ladder) if r[kind] is not None and self.pos + need <= r["C"])
        if to == self.rung:
            return
        old = self.dec
        self._enter(to)
        for i in self.attn_layers():
            for kind_ in ("k", "v"):
                si, di = old.inputs[f"past_{kind_}_{i}"], self.dec.inputs[f"past_{kind_}_{i}"]
                src = self.kv_rows(old.feeds[si.name], si.dims)
                buf = di.zero()
                dst = self.kv_rows(buf, di.dims)
                if (si.dtype, si.scale, si.offset) == (di.dtype, di.scale, di.offset):
                    dst[: self.pos] = src[: self.pos]
                else:
                    dst[: self.pos] = di.encode(si.decode(src[: self.pos]))
                self.dec.feeds[di.name] = buf
        self.dmask = np.full(self.C, self.neg(self.dec.inputs["cmask"]), np.float32)
        self.dmask[: self.pos] = 0.0
        self.dec.set("cmask", self.dmask)

    def attn_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.types) if t != "conv"]

    def set_rope(self, g: Graph, pos0: int, rows: int) -> None:
        cos, sin = rope_rows(self.inv, pos0, rows)
        g.set("cos", cos)
        g.set("sin", sin)
        if "cos_local" in g.inputs and self.inv_local is not None:
            cos, sin = rope_rows(self.inv_local, pos0, rows)
            g.set("cos_local", cos)
            g.set("sin_local", sin)

    def rows_mask(self, g: Graph, name: str, pos0: int, R: int, C: int, window: int) -> None:
        """[R, C + R] (C = 0: no cache columns): cache slots before pos0, then the rows' own causal
        columns; with `window`, only keys at q - window < k <= q."""
        q = pos0 + np.arange(R)[:, None]
        k_cache = np.arange(C)[None, :]
        k_own = pos0 + np.arange(R)[None, :]
        vis = np.concatenate([np.broadcast_to(k_cache < pos0, (R, C)), k_own <= q], axis=1)
        if window:
            vis &= np.concatenate([k_cache > q - window, k_own > q - window], axis=1)
        g.set(name, np.where(vis, np.float32(0.0), np.float32(self.neg(g.inputs[name]))))

    def decode_local_mask(self, p: int) -> None:
        """The decode step at position p: cache slots p - window < k < p (its own key is separate)."""
        if "cmask_local" not in self.dec.inputs:
            return
        k = np.arange(self.C)
        vis = (k < p) & (k > p - self.window)
        self.dec.set(
            "cmask_local",
            np.where(vis, np.float32(0.0), np.float32(self.neg(self.dec.inputs["cmask_local"]))),
        )

    def seed_conv(self, outs: dict[str, np.ndarray], g: Graph, n: int) -> None:
        """Decode conv state from a prefill's B*x rows: the last W real rows, zeros before them."""
        W, H = self.conv_w, self.H
        for i, t in enumerate(self.types):
            if t != "conv":
                continue
            o = g.outputs[f"conv_bx_{i}"]
            rows = o.decode(outs[o.name]).reshape(-1, H)[:n]
            st = np.concatenate([np.zeros((W, H), np.float32), rows])[-W:]
            self.dec.set(f"past_conv_{i}", st.T)  # [H, W], oldest column first

    def neg(self, t: Io) -> float:
        return self.neg_override if self.neg_override is not None else t.neg()

    def emb_rows(self, ids: Sequence[int]) -> np.ndarray:
        return self.embed[np.asarray(ids, np.int64)].astype(np.float32)

    def kv_rows(self, arr: np.ndarray, dims: list[int]) -> np.ndarray:
        """A K/V tensor as a [rows, n_kv, Dh] view: head-major tensors ([n_kv, rows, Dh], 3 dims)
        are transposed, position-major ones ([rows, K]) reshaped."""
        if len(dims) == 3:
            return arr.reshape(self.nkv, -1, self.Dh).transpose(1, 0, 2)
        return arr.reshape(-1, self.nkv, self.Dh)

    def store_kv(self, outs: dict[str, np.ndarray], src: Graph, n: int, pos0: int) -> None:
        """new_k/new_v rows 0..n of a graph's outputs into decode cache rows pos0.."""
        for i in self.attn_layers():
            for kind in ("k", "v"):
                so, di = src.outputs[f"new_{kind}_{i}"], self.dec.inputs[f"past_{kind}_{i}"]
                rows = self.kv_rows(outs[so.name], so.dims)[:n]
                dst = self.kv_rows(self.dec.feeds[di.name], di.dims)
                if so.dtype == di.dtype and (so.scale, so.offset) == (di.scale, di.offset):
                    dst[pos0 : pos0 + n] = rows
                else:
                    dst[pos0 : pos0 + n] = di.encode(so.decode(rows))

    def prefill_chunk(self, chunk: Sequence[int], graph: Graph | None = None) -> None:
        """Feed `chunk` through a rows graph: the prefill, or `graph` (the verify graph)."""
        g = graph if graph is not None else self.pre
        assert g is not None
        if self.has_past(g) and (g is self.ver or g is self.pre):
            # a rung's cache-reading graph: the smallest rung that holds the chunk runs it
            kind = "verify" if g is self.ver else "prefill"
            rows = g.inputs["x"].dims[0]
            self.climb(kind, rows if kind == "prefill" else min(len(chunk), rows))
            g = self.ladder[self.rung][kind]
        H, n, pos0 = self.H, len(chunk), self.pos
        R = g.inputs["x"].dims[0]
        x = np.zeros((R, H), np.float32)
        x[:n] = self.emb_rows(chunk)
        g.set("x", x)
        self.set_rope(g, pos0, R)
        past = any(k.startswith("past_k_") for k in g.inputs)
        C = self.C if past else 0
        self.rows_mask(g, "cmask", pos0, R, C, 0)
        if "cmask_local" in g.inputs:
            self.rows_mask(g, "cmask_local", pos0, R, C, self.window)
        if past:  # the chunk reads the decode cache as it stands
            for i in self.attn_layers():
                for kind in ("k", "v"):
                    g.feeds[f"past_{kind}_{i}"] = self.dec.feeds[f"past_{kind}_{i}"]
        outs = g.run()
        self.store_kv(outs, g, n, pos0)
        if "conv" in self.types:
            self.seed_conv(outs, g, n)
        self.dmask[pos0 : pos0 + n] = 0.0
        self.dec.set("cmask", self.dmask)
        y = g.outputs["y"].decode(outs["y"]).reshape(R, H)
        self.rows = y[:n]  # every fed row's hidden state (a verify reads each)
        self.hidden = y[n - 1]
        self.pos = pos0 + n

    def decode_step(self, tok: int) -> None:
        self.climb("decode", 1)
        g, p = self.dec, self.pos
        g.set("x", self.emb_rows([tok])[0])
        self.set_rope(g, p, 1)
        self.decode_local_mask(p)
        outs = g.run()
        self.store_kv(outs, g, 1, p)
        for i, t in enumerate(self.types):
            if t == "conv":  # the window after this token is the next step's past
                o = g.outputs[f"present_conv_{i}"]
                g.set(f"past_conv_{i}", o.decode(outs[o.name]))
        self.dmask[p] = 0.0
        g.set("cmask", self.dmask)
        self.hidden = g.outputs["y"].decode(outs["y"]).reshape(-1)
        self.pos = p + 1

    def logits(self) -> np.ndarray:
        assert self.hidden is not None
        assert self.lm is not None, "a loop without an lm-head graph has no logits"
        name = next(iter(self.lm.inputs))
        self.lm.set(name, self.hidden)
        out = self.lm.run()
        t = next(iter(self.lm.outputs.values()))
        return t.decode(out[t.name]).reshape(-1)

    def run_prompt(self, ids: Sequence[int]) -> None:
        i = 0
        if self.pre is not None:
            R = self.pre.inputs["x"].dims[0]
            if not any(k.startswith("past_k_") for k in self.pre.inputs):
                c = min(len(ids), R)
                self.prefill_chunk(ids[:c])
                i = c
            else:
                while i < len(ids) and self.fits("prefill", R):
                    c = min(len(ids) - i, R)
                    self.prefill_chunk(ids[i : i + c])
                    i += c
        if self.ver is not None:  # as qhx's plan: 2 or more tokens left go through verify
            R = self.ver.inputs["x"].dims[0]
            while len(ids) - i >= 2 and self.fits("verify", min(len(ids) - i, R)):
                c = min(len(ids) - i, R)
                self.prefill_chunk(ids[i : i + c], self.ver)
                i += c
        for t in ids[i:]:
            self.decode_step(int(t))

    def generate(
        self,
        ids: Sequence[int],
        n_tokens: int,
        teacher: Sequence[int] | None = None,
        margins: list[list[float]] | None = None,
        logits_out: list[np.ndarray] | None = None,
    ) -> list[int]:
        """Greedy from an empty cache; with `teacher`, feed teacher[k] after step k and record
        the model's own top-1 (first maximum, like qhx's argmax). `margins` receives
        [top1, logit1, top2, logit2] per step, `logits_out` every step's logits."""
        self.reset()
        self.run_prompt(list(ids))
        out: list[int] = []
        while True:
            lg = self.logits()
            if logits_out is not None:
                logits_out.append(np.array(lg, np.float32))
            tok = int(np.argmax(lg))
            if margins is not None:
                o = np.argsort(-lg, kind="stable")[:2]
                margins.append([int(o[0]), float(lg[o[0]]), int(o[1]), float(lg[o[1]])])
            out.append(tok)
            if len(out) >= n_tokens or self.pos >= self.top_C:
                return out
            fed = teacher[len(out) - 1] if teacher is not None and len(out) - 1 < len(teacher) else tok
            self.decode_step(int(fed))

    # ---- speculation, on qhx's schedule ----

    def verify_graph(self) -> Graph | None:
        """The rows graph a verify runs: the verify graph, else a prefill that reads the cache."""
        if self.ver is not None:
            return self.ver
        if self.pre is not None and any(k.startswith("past_k_") for k in self.pre.inputs):
            return self.pre
        return None

    def max_ctx(self) -> int:
        return min(int(self.man["params"].get("max_ctx") or self.top_C), self.top_C)

    def verifies(self, n: int) -> bool:
        """n tokens fit one execute of the verify graph over the cache (qhx's verify step)."""
        g = self.verify_graph()
        if g is None or n < 2:
            return False
        R = g.inputs["x"].dims[0]
        kind = "verify" if g is self.ver else "prefill"
        # qhx: a verify step admits a chunk that fits (pos + n), a prefill its whole rows
        return n <= R and self.fits(kind, n if kind == "verify" else R) and self.pos + n <= self.max_ctx()

    def rewind(self, pos: int) -> None:
        """Drop the rows fed after `pos`: position and mask only (their K/V rows stay, hidden)."""
        assert "conv" not in self.types, "conv state has no rollback"
        self.dmask[pos : self.pos] = self.neg(self.dec.inputs["cmask"])
        self.dec.set("cmask", self.dmask)
        self.pos = pos

    def generate_spec(self, ids: Sequence[int], n_tokens: int, draft_max: int) -> tuple[list[int], int]:
        """Greedy with prompt-lookup speculation, on qhx's schedule (--spec lookup
        --spec-adaptive off): draft from prompt + output, verify [tok, drafts...] in one rows
        execute over the cache, keep the drafts the model's own row picks confirm plus its pick
        after them, undo the rest by position and mask. Returns (ids, verifies)."""
        self.reset()
        self.run_prompt(list(ids))
        hist = [int(t) for t in ids]
        max_ctx = self.max_ctx()
        tok = int(np.argmax(self.logits()))
        hist.append(tok)
        out: list[int] = []
        verifies, emitted = 0, False
        while True:
            if not emitted:
                out.append(tok)
                if len(out) >= n_tokens or self.pos >= max_ctx:
                    return out, verifies
            emitted = False
            d = lookup(hist, min(draft_max, n_tokens - len(out) - 1))
            while d and not self.verifies(len(d) + 1):
                d.pop()
            if d:
                verifies += 1
                p0 = self.pos
                self.prefill_chunk([tok, *d], self.verify_graph())
                rows = self.rows.copy()
                for j in range(len(d) + 1):
                    self.hidden = rows[j]
                    a = int(np.argmax(self.logits()))
                    hist.append(a)
                    out.append(a)
                    fed = p0 + 1 + j
                    if len(out) >= n_tokens or fed >= max_ctx:
                        self.rewind(fed)
                        return out, verifies
                    if j == len(d) or a != d[j]:
                        self.rewind(fed)
                        tok, emitted = a, True
                        break
                continue
            self.decode_step(tok)
            tok = int(np.argmax(self.logits()))
            hist.append(tok)


def lookup(history: list[int], max_n: int, ngram_min: int = 2, ngram_max: int = 4) -> list[int]:
    """Prompt lookup as qhx's --spec lookup: the longest suffix n-gram (ngram_max down to
    ngram_min tokens) that occurred earlier proposes what followed its latest occurrence."""
    n = len(history)
    if max_n <= 0:
        return []
    for g in range(ngram_max, max(ngram_min, 1) - 1, -1):
        if g >= n:
            continue
        suffix = history[n - g :]
        for start in range(n - g - 1, -1, -1):
            if history[start : start + g] == suffix:
                return history[start + g : min(start + g + max_n, n)]
    return []


class _RopeCfg:
    """The three Config fields inv_freq reads."""

    def __init__(self, theta: float, head_dim: int, scaling: dict[str, Any] | None) -> None:
        self.rope_theta, self.head_dim, self.rope_scaling = theta, head_dim, scaling


# ---- sessions ------------------------------------------------------------------------------------


def cpu_graph(path: str, quant: dict[str, tuple[float, int]] | None = None) -> Graph:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return Graph(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]), quant or {})


def qnn_graph(path: str, qnn_opts: dict[str, str], quant: dict[str, tuple[float, int]]) -> Graph:
    import onnxruntime as ort

    from qhx_export.compile.htp import qnn_devices

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(qnn_devices(), qnn_opts)
    return Graph(ort.InferenceSession(path, so), quant)


def load_bundle(
    man_path: str, twin: bool = False, real: dict[str, Any] | None = None, float_twin: bool = False
) -> Loop:
    """The bundle's QNN binaries through ORT's QNN EP (simulator), or (twin) the ONNX graphs they
    were compiled from on ORT's CPU EP (kept by --keep-onnx), or (float_twin) the float graphs a
    quantized graph was made from (onnx/<role>.float.onnx, else the graph itself) on the CPU EP
    with float I/O."""
    root = os.path.dirname(os.path.abspath(man_path))
    with open(man_path, encoding="utf-8") as f:
        man = json.load(f)
    real = real or (man.get("source") or {}).get("real")
    if real is None:  # a runner-form manifest (--layout lfm2-*): export-report.json keeps it
        real = _report_real(man_path)
    graphs = {}
    for role, ent in real["graphs"].items():
        quant = {k: (float(v[0]), int(v[1])) for k, v in ent.get("quant", {}).items()}
        if float_twin:
            path = os.path.join(root, "onnx", f"{role}.float.onnx")
            if not os.path.isfile(path):  # a float graph compiled as it is
                path = os.path.join(root, "onnx", f"{role}.onnx")
            graphs[role] = cpu_graph(path, {})
        elif twin:  # the same fixed-point I/O: the kept graph is the compiled one
            graphs[role] = cpu_graph(os.path.join(root, "onnx", f"{role}.onnx"), quant)
        else:
            graphs[role] = qnn_graph(
                os.path.join(root, ent["wrapper"]), real["qnn_options"][ent["precision"]], quant
            )
    return Loop(man, root, graphs)


def _report_real(man_path: str) -> dict[str, Any]:
    """source.real of a manifest written without one, from export-report.json beside it (or one
    directory up, with --arch all)."""
    here = os.path.dirname(os.path.abspath(man_path))
    for top in (here, os.path.dirname(here)):
        rep = os.path.join(top, "export-report.json")
        if os.path.isfile(rep):
            with open(rep, encoding="utf-8") as f:
                real = json.load(f).get("real", {})
            key = os.path.relpath(os.path.abspath(man_path), top)
            if key in real:
                return dict(real[key])
    raise FileNotFoundError(f"{man_path}: no source.real and no export-report.json entry for it")


# ---- the command ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m qhx_export.verify.loop",
        description="The reference token loop over a real bundle's context binaries (ORT's QNN EP)",
    )
    ap.add_argument("manifest")
    ap.add_argument("n_tokens", type=int)
    ap.add_argument("--ids", help="prompt token ids, comma separated")
    ap.add_argument("--teacher", help="ids to feed after each step (teacher forcing)")
    ap.add_argument(
        "--fp32-twin",
        action="store_true",
        help="run the bundle's float graphs on ORT's CPU EP instead (with --jobs: also each step's top-2)",
    )
    ap.add_argument(
        "--jobs",
        help='JSON file: [{"ids": [...], "n": N, "teacher"?: [...], "spec"?: draft_max}, ...]; prints one '
        "JSON list of results (sessions loaded once)",
    )
    a = ap.parse_args(argv)
    # The QNN backend prints on stdout (C stdio): keep fd 1 for our JSON only.
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    loop = load_bundle(a.manifest, float_twin=a.fp32_twin)
    if a.jobs:
        with open(a.jobs, encoding="utf-8") as f:
            jobs = json.load(f)
        res: list[Any] = []
        for job in jobs:
            if "spec" in job:
                ids, verifies = loop.generate_spec(job["ids"], job["n"], job["spec"])
                res.append({"output_ids": ids, "verifies": verifies})
            elif a.fp32_twin:
                margins: list[list[float]] = []
                ids = loop.generate(job["ids"], job["n"], job.get("teacher"), margins)
                res.append({"output_ids": ids, "top2": margins})
            else:
                res.append(loop.generate(job["ids"], job["n"], job.get("teacher")))
        out.write(json.dumps(res) + "\n")
        out.flush()
        return 0
    if not a.ids:
        ap.error("--ids or --jobs is required")
    ids = [int(t) for t in a.ids.split(",")]
    teacher = [int(t) for t in a.teacher.split(",")] if a.teacher else None
    out.write(json.dumps({"input_ids": ids, "output_ids": loop.generate(ids, a.n_tokens, teacher)}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
