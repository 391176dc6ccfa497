#!/usr/bin/env python3
"""Reference token loop over a real bundle, in Python, through onnxruntime.

    real_ref.py MANIFEST N_TOKENS --ids 1,2,3 [--teacher 4,5,6]     prints {"output_ids": [...]}

It drives the *same* QNN context binaries qhx_generate runs (the EPContext wrapper models that
the exporter, qhx-export --target htp, wrote next to them, through onnxruntime's QNN EP on the
HTP backend) and
does the host work itself, written from the graph contract (tests/qnn-emu/FORMAT.md), not from
qhx's Rust: embedding rows, RoPE cos/sin, the additive masks, K/V rows written into the cache,
quantize/dequantize of fixed-point I/O. Same backend and binaries, so the ids must equal
qhx_generate's exactly; a difference is a host bug on one side.

With --fp32-twin the same loop runs the float ONNX graphs the binaries were compiled from
(kept by --keep-onnx: onnx/<role>.float.onnx for a quantized graph, else onnx/<role>.onnx) on
ORT's CPU EP. K/V tensors may be position-major ([rows, K]) or head-major ([n_kv, rows, Dh]):
the layout is read from the graph dims, as qhx_generate reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ONNX_TYPES = {"tensor(float)": "f32", "tensor(uint16)": "ufixed16", "tensor(uint8)": "ufixed8"}


def inv_freq(theta: float, dh: int, scaling: dict | None) -> np.ndarray:
    """RoPE inverse frequencies (f32), with Llama-3's frequency scaling when given."""
    f = np.array([np.float32(1.0) / np.power(np.float32(theta), np.float32(2 * i) / np.float32(dh))
                  for i in range(dh // 2)], np.float32)
    if not scaling:
        return f
    factor, low, high = (np.float32(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old = np.float32(scaling["original_max_position_embeddings"])
    out = []
    for v in f:
        wavelen = np.float32(2.0 * np.pi) / v
        scaled = v / factor if wavelen > old / low else v
        if old / high <= wavelen <= old / low:
            smooth = (old / wavelen - low) / (high - low)
            scaled = (np.float32(1) - smooth) * scaled / factor + smooth * scaled
        out.append(np.float32(scaled))
    return np.array(out, np.float32)


def rope_rows(inv: np.ndarray, pos0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, Dh] for positions pos0.., rotate-half layout (each frequency twice)."""
    a = (inv[None, :] * np.arange(pos0, pos0 + n, dtype=np.float32)[:, None]).astype(np.float32)
    a = np.concatenate([a, a], axis=1)
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)


class Io:
    """One graph tensor: float, or QNN fixed point (real = (q + offset) * scale)."""

    def __init__(self, name, dims, dtype="f32", scale=1.0, offset=0):
        self.name, self.dims, self.dtype, self.scale, self.offset = name, list(dims), dtype, scale, offset
        self.np = {"f32": np.float32, "ufixed16": np.uint16, "ufixed8": np.uint8}[dtype]

    def encode(self, real: np.ndarray) -> np.ndarray:
        if self.dtype == "f32":
            return np.asarray(real, np.float32)
        hi = 65535 if self.dtype == "ufixed16" else 255
        s = np.float32(self.scale)
        # round half away from zero (C's roundf), then saturate
        q = np.trunc(np.asarray(real, np.float32) / s + np.copysign(np.float32(0.5), real)) - np.float32(self.offset)
        return np.clip(q, 0, hi).astype(self.np)

    def decode(self, raw: np.ndarray) -> np.ndarray:
        if self.dtype == "f32":
            return np.asarray(raw, np.float32)
        return ((raw.astype(np.float32) + np.float32(self.offset)) * np.float32(self.scale)).astype(np.float32)

    def neg(self) -> float:
        """The additive 'hidden' mask value: -inf for float, the range minimum for fixed point."""
        return float("-inf") if self.dtype == "f32" else float(self.decode(np.zeros(1, self.np))[0])


class Graph:
    def __init__(self, sess, quant: dict):
        self.sess = sess
        self.inputs = {i.name: Io(i.name, i.shape, ONNX_TYPES[i.type], *quant.get(i.name, (1.0, 0)))
                       for i in sess.get_inputs()}
        self.outputs = {o.name: Io(o.name, o.shape, ONNX_TYPES[o.type], *quant.get(o.name, (1.0, 0)))
                        for o in sess.get_outputs()}
        # real 0 (a fixed-point tensor's zero point): what qhx_generate holds in unwritten cache
        # slots (the HTP's softmax leaves masked slots a trace of weight, so raw 0 would show)
        self.feeds = {n: t.encode(np.zeros(t.dims, np.float32)) for n, t in self.inputs.items()}
        self.record = None  # list: every execute's feeds (real values) are appended

    def set(self, name, real):
        """Encode real values into the whole input (row-major)."""
        t = self.inputs[name]
        self.feeds[name] = t.encode(np.asarray(real, np.float32).reshape(-1)).reshape(t.dims)

    def run(self) -> dict:
        if self.record is not None:
            self.record.append({n: self.inputs[n].decode(v) if self.inputs[n].dtype != "f32" else v.copy()
                                for n, v in self.feeds.items()})
        outs = self.sess.run(None, self.feeds)
        return {o.name: v for o, v in zip(self.sess.get_outputs(), outs)}


def kv_rows(arr: np.ndarray, layout: str, n_kv: int, dh: int) -> np.ndarray:
    """A K/V tensor as [rows, n_kv, dh] (a view of the same elements)."""
    if layout == "head_major":
        return arr.reshape(n_kv, -1, dh).transpose(1, 0, 2)
    return arr.reshape(-1, n_kv, dh)


class Loop:
    """The host side of a bundle: manifest params + the three graphs."""

    def __init__(self, man: dict, root: str, graphs: dict, neg_override: float | None = None):
        p = man["params"]
        self.p, self.man, self.root = p, man, root
        self.H, self.Dh, self.nkv, self.L = p["hidden"], p["head_dim"], p["n_kv_heads"], p["n_layers"]
        emb = man["artifacts"]["embed"]
        dt = "<f2" if emb.get("dtype", "f16") == "f16" else "<f4"
        self.embed = np.fromfile(os.path.join(root, emb["file"]), dt).reshape(-1, self.H)
        self.inv = inv_freq(p["rope_theta"], self.Dh, p.get("rope_scaling"))
        self.pre, self.dec, self.lm = graphs.get("prefill"), graphs["decode"], graphs["lmhead"]
        self.C = self.dec.inputs["cmask"].dims[0]
        self.layout = "head_major" if len(self.dec.inputs["past_k_0"].dims) == 3 else "pos_major"
        self.neg_override = neg_override
        self.pos = 0
        for g in graphs.values():  # an empty cache: every input zero
            for n in g.feeds:
                g.feeds[n][...] = 0
        mk = self.dec.inputs["cmask"]
        self.dmask = np.full(self.C, self.neg(mk), np.float32)
        self.dec.set("cmask", self.dmask)
        self.hidden = None

    def reset(self) -> None:
        """Forget the cache (a fresh run over the same sessions)."""
        graphs = {k: v for k, v in (("prefill", self.pre), ("decode", self.dec), ("lmhead", self.lm)) if v}
        self.__init__(self.man, self.root, graphs, self.neg_override)

    def neg(self, t: Io) -> float:
        return self.neg_override if self.neg_override is not None else t.neg()

    def emb_rows(self, ids):
        return self.embed[np.asarray(ids, np.int64)].astype(np.float32)

    def store_kv(self, outs: dict, src_graph: Graph, n: int, pos0: int) -> None:
        """new_k/new_v rows 0..n of a graph's outputs into decode cache rows pos0.. (through
        real values when the quantization of the two tensors differs)."""
        for i in range(self.L):
            for kind in ("k", "v"):
                so, di = src_graph.outputs[f"new_{kind}_{i}"], self.dec.inputs[f"past_{kind}_{i}"]
                src = kv_rows(outs[so.name], self.layout, self.nkv, self.Dh)[:n]
                dst = kv_rows(self.dec.feeds[di.name], self.layout, self.nkv, self.Dh)
                if so.dtype == di.dtype and (so.scale, so.offset) == (di.scale, di.offset):
                    dst[pos0:pos0 + n] = src
                else:
                    dst[pos0:pos0 + n] = di.encode(so.decode(src))

    def prefill_chunk(self, chunk) -> None:
        g, H, n, pos0 = self.pre, self.H, len(chunk), self.pos
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
            m[r, :min(pos0, C)] = 0.0
            m[r, C:C + r + 1] = 0.0
        g.set("cmask", m)
        if past:  # the chunk reads the decode cache as it stands
            for i in range(self.L):
                for kind in ("k", "v"):
                    g.feeds[f"past_{kind}_{i}"] = self.dec.feeds[f"past_{kind}_{i}"]
        outs = g.run()
        self.store_kv(outs, g, n, pos0)
        self.dmask[pos0:pos0 + n] = 0.0
        self.dec.set("cmask", self.dmask)
        y = g.outputs["y"].decode(outs["y"]).reshape(R, H)
        self.rows = y[:n]  # every fed row's hidden state (a verify reads each)
        self.hidden = y[n - 1]
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
        name = next(iter(self.lm.inputs))
        self.lm.set(name, self.hidden)
        out = self.lm.run()
        t = next(iter(self.lm.outputs.values()))
        return t.decode(out[t.name]).reshape(-1)

    def rewind(self, pos: int) -> None:
        """Drop the rows fed after `pos`: position and mask only (their K/V rows stay, hidden)."""
        neg = self.neg(self.dec.inputs["cmask"])
        self.dmask[pos:self.pos] = neg
        self.dec.set("cmask", self.dmask)
        self.pos = pos

    def verifies(self, n: int) -> bool:
        """n tokens fit one execute of the prefill graph over the cache (qhx's verify step)."""
        if self.pre is None or "past_k_0" not in self.pre.inputs or n < 2:
            return False
        R = self.pre.inputs["x"].dims[0]
        max_ctx = min(self.p["max_ctx"], self.C)
        return n <= R and self.pos + R <= self.C and self.pos + n <= max_ctx

    def generate_spec(self, ids, n_tokens: int, draft_max: int) -> tuple[list[int], int]:
        """Greedy with prompt-lookup speculation, on qhx's schedule (--spec lookup
        --spec-adaptive off): draft from prompt + output, verify [tok, drafts...] in one
        prefill execute over the cache, keep the drafts the model's own row picks confirm plus
        its pick after them, undo the rest by position and mask. Returns (ids, verifies)."""
        self.run_prompt(list(ids))
        hist = [int(t) for t in ids]
        max_ctx = min(self.p["max_ctx"], self.C)
        tok = int(np.argmax(self.logits()))
        hist.append(tok)
        out, verifies, emitted = [], 0, False
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
                self.prefill_chunk([tok, *d])
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

    def run_prompt(self, ids) -> None:
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
                    self.prefill_chunk(ids[i:i + c])
                    i += c
        for t in ids[i:]:
            self.decode_step(int(t))

    def generate(self, ids, n_tokens: int, teacher=None, margins=None) -> list[int]:
        """Greedy; with `teacher`, feed teacher[k] after step k and record the model's pick.
        `margins` (a list) receives [top1, logit1, top2, logit2] per step."""
        self.run_prompt(list(ids))
        out = []
        while True:
            lg = self.logits()
            tok = int(np.argmax(lg))  # first maximum, like qhx's argmax
            if margins is not None:
                o = np.argsort(-lg, kind="stable")[:2]
                margins.append([int(o[0]), float(lg[o[0]]), int(o[1]), float(lg[o[1]])])
            out.append(tok)
            if len(out) >= n_tokens or self.pos >= self.C:
                return out
            fed = teacher[len(out) - 1] if teacher is not None and len(out) - 1 < len(teacher) else tok
            self.decode_step(int(fed))


def lookup(history: list[int], max_n: int, ngram_min: int = 2, ngram_max: int = 4) -> list[int]:
    """Prompt lookup as qhx's --spec lookup: the longest suffix n-gram (ngram_max down to
    ngram_min tokens) that occurred earlier proposes what followed its latest occurrence."""
    n = len(history)
    if max_n <= 0:
        return []
    for g in range(ngram_max, max(ngram_min, 1) - 1, -1):
        if g >= n:
            continue
        suffix = history[n - g:]
        for start in range(n - g - 1, -1, -1):
            if history[start:start + g] == suffix:
                return history[start + g:min(start + g + max_n, n)]
    return []


def qnn_session(path: str, qnn_opts: dict):
    import onnxruntime as ort
    register_qnn()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(qnn_devices(), qnn_opts)
    return ort.InferenceSession(path, so)


_REGISTERED = []


def register_qnn() -> None:
    import onnxruntime as ort
    import onnxruntime_qnn
    if not _REGISTERED:
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
        _REGISTERED.append(True)


def qnn_devices():
    import onnxruntime as ort
    return [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]


def load_bundle(man_path: str, fp32_twin: bool = False) -> Loop:
    """The bundle's QNN binaries through ORT's QNN EP, or (fp32_twin) its float graphs on
    ORT's CPU EP."""
    import onnxruntime as ort
    root = os.path.dirname(os.path.abspath(man_path))
    man = json.load(open(man_path, encoding="utf-8"))
    real = man["source"]["real"]
    graphs = {}
    for role, ent in real["graphs"].items():
        if fp32_twin:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            path = os.path.join(root, "onnx", f"{role}.float.onnx")
            if not os.path.isfile(path):  # a float graph compiled as it is
                path = os.path.join(root, "onnx", f"{role}.onnx")
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            graphs[role] = Graph(sess, {})
        else:
            sess = qnn_session(os.path.join(root, ent["wrapper"]), real["qnn_options"][ent["precision"]])
            graphs[role] = Graph(sess, {k: tuple(v) for k, v in ent.get("quant", {}).items()})
    return Loop(man, root, graphs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("n_tokens", type=int)
    ap.add_argument("--ids", help="prompt token ids, comma separated")
    ap.add_argument("--teacher", help="ids to feed after each step (teacher forcing)")
    ap.add_argument("--fp32-twin", action="store_true",
                    help="run the bundle's float graphs on ORT's CPU EP instead (with --jobs: "
                         "also the per-step top-2 logits)")
    ap.add_argument("--jobs", help='JSON file: [{"ids": [...], "n": N, "teacher"?: [...], "spec"?: draft_max}, ...]; prints '
                                   "one JSON list of output id lists (sessions loaded once)")
    a = ap.parse_args()
    # The QNN backend prints on stdout (C stdio): keep fd 1 for our JSON only.
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    loop = load_bundle(a.manifest, a.fp32_twin)
    if a.jobs:
        res = []
        for job in json.load(open(a.jobs, encoding="utf-8")):
            loop.reset()
            if "spec" in job:
                ids, verifies = loop.generate_spec(job["ids"], job["n"], job["spec"])
                res.append({"output_ids": ids, "verifies": verifies})
            elif a.fp32_twin:
                margins = []
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
