#!/usr/bin/env python3
"""A Genie-layout token loop in Python over onnxruntime (SMART_MASK KV, written from Genie's
public description, not from qhx's or Genie's code):

    genie_ref.py BUNDLE_DIR N_TOKENS --ids 1,2,3      prints {"output_ids": [...]}

It runs the EPContext wrappers make_genie.py keeps next to the context binaries (so the same
QNN binaries Genie runs, through ORT's QNN EP), or, inside make_genie.py, the float ONNX graphs
on ORT's CPU EP to collect calibration inputs for the W8A16 bundles.

Host side, per step of a variant with AR rows over context CL (past P = CL - AR):
  * input_ids rows 0..n-1 hold the chunk's tokens, the rest pad (0), left-aligned;
  * attention_mask row r attends columns [0, n_past) (the cache) and P..P+r (the chunk's own
    tokens, concatenated after the past inside the graph); everything else is masked
    (-1000 float; raw 0 quantized, raw 65535 attend);
  * position_ids_cos/sin row r = cos/sin((n_past + r) * inv_freq) (Dh/2 columns), pad rows 0;
  * after the step rows 0..n-1 of past_*_out go to cache slots n_past.. (SMART_MASK).
The prompt runs in AR-sized chunks of the largest variant (last one padded), then decode uses
the AR-1 variant; greedy picks the first maximum of the last real row's logits.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_ref  # noqa: E402

MASK_NEG = -1000.0
TYPES = {"tensor(float)": "f32", "tensor(uint16)": "ufixed16", "tensor(uint8)": "ufixed8",
         "tensor(int32)": "int32"}


class Tensor(real_ref.Io):
    def __init__(self, name, dims, dtype, scale=1.0, offset=0):
        if dtype == "int32":
            self.name, self.dims, self.dtype, self.scale, self.offset = name, list(dims), dtype, 1.0, 0
            self.np = np.int32
        else:
            super().__init__(name, dims, dtype, scale, offset)

    def encode(self, real):
        return np.asarray(real, np.int32) if self.dtype == "int32" else super().encode(real)


class Split:
    """One graph (session) of a variant."""

    def __init__(self, sess, quant: dict):
        self.sess = sess
        q = lambda n: quant.get(n, (1.0, 0))  # noqa: E731
        self.inputs = {i.name: Tensor(i.name, i.shape, TYPES[i.type], *q(i.name)) for i in sess.get_inputs()}
        self.outputs = {o.name: Tensor(o.name, o.shape, TYPES[o.type], *q(o.name)) for o in sess.get_outputs()}
        self.record = None  # list of every execute's feeds (real values), for calibration

    def run(self, real_feeds: dict) -> dict:
        """Real-valued feeds in, real-valued outputs out (encode/decode at the boundary)."""
        feeds = {}
        for n, t in self.inputs.items():
            feeds[n] = t.encode(np.asarray(real_feeds[n]).reshape(t.dims))
        if self.record is not None:
            self.record.append({n: np.asarray(real_feeds[n], np.float32 if self.inputs[n].dtype != "int32"
                                              else np.int32).reshape(self.inputs[n].dims) for n in feeds})
        outs = self.sess.run(None, feeds)
        res = {}
        for o, v in zip(self.sess.get_outputs(), outs):
            t = self.outputs[o.name]
            res[o.name] = v if t.dtype == "int32" else t.decode(v)
        return res


class GenieLoop:
    def __init__(self, p: dict, rope: dict, variants: dict):
        """p: hidden/head_dim/n_kv_heads/n_layers; rope: theta, scaling; variants: {AR: [Split]}
        in split order, all over the same CL."""
        self.p = p
        self.L, self.Dh, self.nkv = p["n_layers"], p["head_dim"], p["n_kv_heads"]
        self.inv = real_ref.inv_freq(rope["theta"], self.Dh, rope.get("scaling"))
        self.variants = variants
        first = variants[max(variants)][0]
        self.CL = first.inputs["attention_mask"].dims[-1]
        self.k = np.zeros((self.L, self.nkv, self.Dh, self.CL), np.float32)  # real values
        self.v = np.zeros((self.L, self.nkv, self.CL, self.Dh), np.float32)
        self.n_past = 0
        self.last_logits = None

    def step(self, ids: list[int]) -> None:
        ar = max(self.variants) if len(ids) > 1 else min(self.variants)
        n, P, CL = len(ids), self.CL - ar, self.CL
        assert n <= ar and self.n_past + n <= P, "context full"
        tok = np.zeros((1, ar), np.int32)
        tok[0, :n] = ids
        mask = np.full((ar, CL), MASK_NEG, np.float32)
        for r in range(n):
            mask[r, :self.n_past] = 0.0
            mask[r, P:P + r + 1] = 0.0
        pos = np.zeros(ar, np.float32)
        pos[:n] = np.arange(self.n_past, self.n_past + n)
        ang = (pos[:, None] * self.inv[None, :]).astype(np.float32)
        feeds = {"input_ids": tok, "attention_mask": mask, "position_ids_cos": np.cos(ang),
                 "position_ids_sin": np.sin(ang)}
        for i in range(self.L):
            feeds[f"past_key_{i}_in"] = self.k[i][:, None, :, :P]
            feeds[f"past_value_{i}_in"] = self.v[i][:, None, :P, :]
        outs = {}
        for sp in self.variants[ar]:
            outs.update(sp.run({nm: (outs.get(nm) if nm in outs else feeds[nm]) for nm in sp.inputs}))
        for i in range(self.L):
            ko = outs[f"past_key_{i}_out"].reshape(self.nkv, self.Dh, ar)
            vo = outs[f"past_value_{i}_out"].reshape(self.nkv, ar, self.Dh)
            self.k[i][:, :, self.n_past:self.n_past + n] = ko[:, :, :n]
            self.v[i][:, self.n_past:self.n_past + n, :] = vo[:, :n, :]
        self.last_logits = outs["logits"].reshape(ar, -1)[n - 1]
        self.n_past += n

    def generate(self, ids, n_tokens: int, teacher=None) -> list[int]:
        ar = max(self.variants)
        ids = list(ids)
        for i in range(0, len(ids), ar):
            self.step(ids[i:i + ar])
        out = []
        while True:
            tok = int(np.argmax(self.last_logits))
            out.append(tok)
            if len(out) >= n_tokens or self.n_past >= self.CL - min(self.variants):
                return out
            fed = teacher[len(out) - 1] if teacher is not None and len(out) - 1 < len(teacher) else tok
            self.step([fed])


def load_bundle(d: str) -> GenieLoop:
    """The QNN EP loop over a make_genie.py bundle (its genie-source.json lists the wrappers)."""
    src = json.load(open(os.path.join(d, "genie-source.json"), encoding="utf-8"))
    variants = {}
    for g in sorted(src["graphs"], key=lambda g: g["name"]):
        sess = real_ref.qnn_session(os.path.join(d, g["wrapper"]), src["qnn_options"][g["precision"]])
        variants.setdefault(g["ar"], []).append(Split(sess, {k: tuple(v) for k, v in g.get("quant", {}).items()}))
    return GenieLoop(src["params"], src["rope"], variants)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("n_tokens", type=int)
    ap.add_argument("--ids", required=True)
    a = ap.parse_args()
    loop = load_bundle(a.bundle)
    ids = [int(t) for t in a.ids.split(",")]
    print(json.dumps({"input_ids": ids, "output_ids": loop.generate(ids, a.n_tokens)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
