"""A token loop over a bundle's graphs through onnxruntime: the host side of qhx_generate written
again from the graph contract (tests/qnn-emu/FORMAT.md), not from qhx's Rust.

It drives either the bundle's QNN context binaries (the EPContext wrappers next to them, through
ORT's QNN EP on the HTP simulator: the same backend and binaries qhx_generate runs, so greedy ids
must be equal) or ONNX graphs on ORT's CPU EP (calibration, and fast agreement tables). Host work:
embedding rows, RoPE cos/sin, additive masks, K/V rows into the cache, quantize / dequantize of
fixed-point I/O.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

ONNX_TYPES = {"tensor(float)": "f32", "tensor(uint16)": "ufixed16", "tensor(uint8)": "ufixed8"}
NP_TYPES = {"f32": np.float32, "ufixed16": np.uint16, "ufixed8": np.uint8}


def rope_rows(inv: np.ndarray, pos0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, Dh] for positions pos0.., rotate-half layout (each frequency twice)."""
    a = (inv[None, :] * np.arange(pos0, pos0 + n, dtype=np.float32)[:, None]).astype(np.float32)
    a = np.concatenate([a, a], axis=1)
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)


class Io:
    """One graph tensor: float, or QNN fixed point (real = (q + offset) * scale)."""

    def __init__(
        self, name: str, dims: Sequence[int], dtype: str = "f32", scale: float = 1.0, offset: int = 0
    ) -> None:
        self.name, self.dims, self.dtype = name, [int(d) for d in dims], dtype
        self.scale, self.offset = scale, offset
        self.np = NP_TYPES[dtype]

    def encode(self, real: np.ndarray) -> np.ndarray:
        if self.dtype == "f32":
            return np.asarray(real, np.float32)
        hi = 65535 if self.dtype == "ufixed16" else 255
        r = np.asarray(real, np.float32)
        q = np.trunc(r / np.float32(self.scale) + np.copysign(np.float32(0.5), r)) - np.float32(self.offset)
        return np.clip(q, 0, hi).astype(self.np)

    def decode(self, raw: np.ndarray) -> np.ndarray:
        if self.dtype == "f32":
            return np.asarray(raw, np.float32)
        return ((raw.astype(np.float32) + np.float32(self.offset)) * np.float32(self.scale)).astype(
            np.float32
        )

    def neg(self) -> float:
        """The additive 'hidden' mask value: -inf for float, the range minimum for fixed point."""
        return float("-inf") if self.dtype == "f32" else float(self.decode(np.zeros(1, self.np))[0])


class Graph:
    def __init__(self, sess: Any, quant: dict[str, tuple[float, int]]) -> None:
        self.sess = sess
        self.inputs = {
            i.name: Io(i.name, i.shape, ONNX_TYPES[i.type], *quant.get(i.name, (1.0, 0)))
            for i in sess.get_inputs()
        }
        self.outputs = {
            o.name: Io(o.name, o.shape, ONNX_TYPES[o.type], *quant.get(o.name, (1.0, 0)))
            for o in sess.get_outputs()
        }
        self.feeds = {n: np.zeros(t.dims, t.np) for n, t in self.inputs.items()}
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
        from qhx_export.families.base import inv_freq

        p = man["params"]
        self.man, self.root, self.graphs = man, root, graphs
        self.H, self.Dh, self.nkv, self.L = p["hidden"], p["head_dim"], p["n_kv_heads"], p["n_layers"]
        if embed is None:
            e = man["artifacts"]["embed"]
            dt = "<f2" if e.get("dtype", "f16") == "f16" else "<f4"
            embed = np.fromfile(os.path.join(root, e["file"]), dt).reshape(-1, self.H)
        self.embed = embed
        self.inv = inv_freq(_RopeCfg(p["rope_theta"], self.Dh, p.get("rope_scaling")))  # type: ignore[arg-type]
        self.pre, self.dec, self.lm = graphs.get("prefill"), graphs["decode"], graphs.get("lmhead")
        self.ver = graphs.get("verify")  # a few rows over the decode cache (speculative decoding)
        self.C = self.dec.inputs["cmask"].dims[0]
        self.neg_override = neg_override
        self.reset()

    def reset(self) -> None:
        """An empty cache (every input zero), position 0."""
        for g in self.graphs.values():
            for n in g.feeds:
                g.feeds[n][...] = 0
        self.pos = 0
        self.dmask = np.full(self.C, self.neg(self.dec.inputs["cmask"]), np.float32)
        self.dec.set("cmask", self.dmask)
        self.hidden: np.ndarray | None = None

    def neg(self, t: Io) -> float:
        return self.neg_override if self.neg_override is not None else t.neg()

    def emb_rows(self, ids: Sequence[int]) -> np.ndarray:
        return self.embed[np.asarray(ids, np.int64)].astype(np.float32)

    def store_kv(self, outs: dict[str, np.ndarray], src: Graph, n: int, pos0: int) -> None:
        """new_k/new_v rows 0..n of a graph's outputs into decode cache rows pos0.."""
        for i in range(self.L):
            for kind in ("k", "v"):
                so, di = src.outputs[f"new_{kind}_{i}"], self.dec.inputs[f"past_{kind}_{i}"]
                rows = outs[so.name].reshape(-1, self.nkv * self.Dh)[:n]
                dst = self.dec.feeds[di.name].reshape(-1, self.nkv * self.Dh)
                if so.dtype == di.dtype and (so.scale, so.offset) == (di.scale, di.offset):
                    dst[pos0 : pos0 + n] = rows
                else:
                    dst[pos0 : pos0 + n] = di.encode(so.decode(rows))

    def prefill_chunk(self, chunk: Sequence[int], graph: Graph | None = None) -> None:
        """Feed `chunk` through a rows graph: the prefill, or `graph` (the verify graph)."""
        g = graph if graph is not None else self.pre
        assert g is not None
        H, n, pos0 = self.H, len(chunk), self.pos
        R = g.inputs["x"].dims[0]
        x = np.zeros((R, H), np.float32)
        x[:n] = self.emb_rows(chunk)
        g.set("x", x)
        cos, sin = rope_rows(self.inv, pos0, R)
        g.set("cos", cos)
        g.set("sin", sin)
        past = "past_k_0" in g.inputs
        C = self.C if past else 0
        m = np.full((R, C + R), self.neg(g.inputs["cmask"]), np.float32)
        for r in range(R):
            m[r, : min(pos0, C)] = 0.0
            m[r, C : C + r + 1] = 0.0
        g.set("cmask", m)
        if past:  # the chunk reads the decode cache as it stands
            for i in range(self.L):
                for kind in ("k", "v"):
                    g.feeds[f"past_{kind}_{i}"] = self.dec.feeds[f"past_{kind}_{i}"]
        outs = g.run()
        self.store_kv(outs, g, n, pos0)
        self.dmask[pos0 : pos0 + n] = 0.0
        self.dec.set("cmask", self.dmask)
        self.hidden = g.outputs["y"].decode(outs["y"]).reshape(R, H)[n - 1]
        self.pos = pos0 + n

    def decode_step(self, tok: int) -> None:
        g, p = self.dec, self.pos
        g.set("x", self.emb_rows([tok])[0])
        cos, sin = rope_rows(self.inv, p, 1)
        g.set("cos", cos)
        g.set("sin", sin)
        outs = g.run()
        self.store_kv(outs, g, 1, p)
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
            if "past_k_0" not in self.pre.inputs:
                c = min(len(ids), R)
                self.prefill_chunk(ids[:c])
                i = c
            else:
                while i < len(ids) and self.pos + R <= self.C:
                    c = min(len(ids) - i, R)
                    self.prefill_chunk(ids[i : i + c])
                    i += c
        if self.ver is not None:  # as qhx's plan: 2 or more tokens left go through verify
            R = self.ver.inputs["x"].dims[0]
            while len(ids) - i >= 2 and self.pos + min(len(ids) - i, R) <= self.C:
                c = min(len(ids) - i, R)
                self.prefill_chunk(ids[i : i + c], self.ver)
                i += c
        for t in ids[i:]:
            self.decode_step(int(t))

    def generate(self, ids: Sequence[int], n_tokens: int, teacher: Sequence[int] | None = None) -> list[int]:
        """Greedy from an empty cache; with `teacher`, feed teacher[k] after step k and record
        the model's own top-1 (first maximum, like qhx's argmax)."""
        self.reset()
        self.run_prompt(list(ids))
        out: list[int] = []
        while True:
            tok = int(np.argmax(self.logits()))
            out.append(tok)
            if len(out) >= n_tokens or self.pos >= self.C:
                return out
            fed = teacher[len(out) - 1] if teacher is not None and len(out) - 1 < len(teacher) else tok
            self.decode_step(int(fed))


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


def load_bundle(man_path: str, twin: bool = False) -> Loop:
    """The bundle's QNN binaries through ORT's QNN EP (simulator), or (twin) the ONNX graphs they
    were compiled from on ORT's CPU EP (kept by --keep-onnx)."""
    root = os.path.dirname(os.path.abspath(man_path))
    with open(man_path, encoding="utf-8") as f:
        man = json.load(f)
    real = man["source"]["real"]
    graphs = {}
    for role, ent in real["graphs"].items():
        quant = {k: (float(v[0]), int(v[1])) for k, v in ent.get("quant", {}).items()}
        if twin:  # the same fixed-point I/O: the kept graph is the compiled one
            graphs[role] = cpu_graph(os.path.join(root, "onnx", f"{role}.onnx"), quant)
        else:
            graphs[role] = qnn_graph(
                os.path.join(root, ent["wrapper"]), real["qnn_options"][ent["precision"]], quant
            )
    return Loop(man, root, graphs)
