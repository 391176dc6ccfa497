"""A Genie-layout token loop over onnxruntime (SMART_MASK KV cache, written from Genie's public
description, not from qhx's or Genie's code). The exporter runs it over the float Genie graphs on
ORT's CPU EP to calibrate quantized Genie bundles; `python -m qhx_export.verify.genie_loop` runs it
over a bundle's EPContext wrappers (the binaries Genie runs, through ORT's QNN EP) as an
independent host.

Host side, per step of a variant with AR rows over context CL (past P = CL - AR):
  * input_ids rows 0..n-1 hold the chunk's tokens, the rest pad (0), left-aligned;
  * attention_mask row r attends columns [0, n_past) (the cache) and P..P+r (the chunk's own
    tokens, concatenated after the past inside the graph); everything else is masked (-1000;
    quantized masks: raw 0 masked, raw 65535 attend);
  * position_ids_cos/sin row r = cos/sin((n_past + r) * inv_freq) (Dh/2 columns), pad rows 0;
  * the splits of a variant run in order, each later split reading the tensors earlier ones
    output by name (the hidden state);
  * after the step rows 0..n-1 of past_*_out go to cache slots n_past.. (SMART_MASK).
The prompt runs in AR-sized chunks of the largest variant (last one padded), then decode uses
the AR-1 variant; greedy picks the first maximum of the last real row's logits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from qhx_export.verify.loop import ONNX_TYPES, Io, host_inv_freq, io_of

MASK_NEG = -1000.0


class Tensor(Io):
    """A graph tensor; int32 (input_ids) passes through unchanged."""

    def __init__(
        self, name: str, dims: Sequence[int], dtype: str = "f32", scale: float = 1.0, offset: int = 0
    ) -> None:
        if dtype == "int32":
            self.name, self.dims, self.dtype = name, [int(d) for d in dims], dtype
            self.scale, self.offset, self.np = 1.0, 0, np.int32
        else:
            super().__init__(name, dims, dtype, scale, offset)

    def encode(self, real: np.ndarray) -> np.ndarray:
        return np.asarray(real, np.int32) if self.dtype == "int32" else super().encode(real)

    def decode(self, raw: np.ndarray) -> np.ndarray:
        return np.asarray(raw) if self.dtype == "int32" else super().decode(raw)


TYPES = {**ONNX_TYPES, "tensor(int32)": "int32"}


class Split:
    """One graph (an ORT session) of a variant; real values in and out."""

    def __init__(self, sess: Any, quant: dict[str, tuple[float, int]] | None = None) -> None:
        self.sess = sess
        self.inputs = io_of(sess.get_inputs(), TYPES, quant or {}, Tensor)
        self.outputs = io_of(sess.get_outputs(), TYPES, quant or {}, Tensor)
        self.record: list[dict[str, np.ndarray]] | None = None  # every execute's feeds (calibration)

    def run(self, real_feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {n: t.encode(np.asarray(real_feeds[n]).reshape(t.dims)) for n, t in self.inputs.items()}
        if self.record is not None:
            self.record.append({n: self.inputs[n].decode(v).copy() for n, v in feeds.items()})
        outs = self.sess.run(None, feeds)
        return {
            o.name: self.outputs[o.name].decode(v) for o, v in zip(self.sess.get_outputs(), outs, strict=True)
        }


class GenieLoop:
    def __init__(self, p: dict[str, Any], rope: dict[str, Any], variants: dict[int, list[Split]]) -> None:
        """p: head_dim / n_kv_heads / n_layers; rope: theta, scaling (HF's rope_scaling);
        variants: {AR: [Split]} in split order, all over the same CL."""
        self.L, self.Dh, self.nkv = p["n_layers"], p["head_dim"], p["n_kv_heads"]
        self.inv = host_inv_freq(rope["theta"], self.Dh, rope.get("scaling"))
        self.variants = variants
        self.CL = variants[max(variants)][0].inputs["attention_mask"].dims[-1]
        self.k = np.zeros((self.L, self.nkv, self.Dh, self.CL), np.float32)  # real values
        self.v = np.zeros((self.L, self.nkv, self.CL, self.Dh), np.float32)
        self.n_past = 0
        self.last_logits: np.ndarray | None = None

    def reset(self) -> None:
        self.k[:] = 0.0
        self.v[:] = 0.0
        self.n_past = 0
        self.last_logits = None

    def step(self, ids: Sequence[int]) -> None:
        ar = max(self.variants) if len(ids) > 1 else min(self.variants)
        n, P, CL = len(ids), self.CL - ar, self.CL
        if n > ar or self.n_past + n > P:
            raise ValueError("context full")
        tok = np.zeros((1, ar), np.int32)
        tok[0, :n] = ids
        mask = np.full((ar, CL), MASK_NEG, np.float32)
        for r in range(n):
            mask[r, : self.n_past] = 0.0
            mask[r, P : P + r + 1] = 0.0
        pos = np.zeros(ar, np.float32)
        pos[:n] = np.arange(self.n_past, self.n_past + n)
        ang = (pos[:, None] * self.inv[None, :]).astype(np.float32)
        feeds: dict[str, np.ndarray] = {
            "input_ids": tok,
            "attention_mask": mask,
            "position_ids_cos": np.cos(ang),
            "position_ids_sin": np.sin(ang),
        }
        for i in range(self.L):
            feeds[f"past_key_{i}_in"] = self.k[i][:, None, :, :P]
            feeds[f"past_value_{i}_in"] = self.v[i][:, None, :P, :]
        outs: dict[str, np.ndarray] = {}
        for sp in self.variants[ar]:
            outs.update(sp.run({nm: outs[nm] if nm in outs else feeds[nm] for nm in sp.inputs}))
        for i in range(self.L):
            ko = outs[f"past_key_{i}_out"].reshape(self.nkv, self.Dh, ar)
            vo = outs[f"past_value_{i}_out"].reshape(self.nkv, ar, self.Dh)
            self.k[i][:, :, self.n_past : self.n_past + n] = ko[:, :, :n]
            self.v[i][:, self.n_past : self.n_past + n, :] = vo[:, :n, :]
        self.last_logits = outs["logits"].reshape(ar, -1)[n - 1]
        self.n_past += n

    def generate(self, ids: Sequence[int], n_tokens: int, teacher: Sequence[int] | None = None) -> list[int]:
        """Greedy ids after the prompt `ids`; `teacher`: feed these ids instead (teacher forcing)."""
        ar = max(self.variants)
        ids = list(ids)
        for i in range(0, len(ids), ar):
            self.step(ids[i : i + ar])
        out: list[int] = []
        while True:
            assert self.last_logits is not None
            tok = int(np.argmax(self.last_logits))
            out.append(tok)
            if len(out) >= n_tokens or self.n_past >= self.CL - min(self.variants):
                return out
            fed = teacher[len(out) - 1] if teacher is not None and len(out) - 1 < len(teacher) else tok
            self.step([fed])


def qnn_session(path: str, qnn_opts: dict) -> Any:
    """An ORT session on the QNN EP over one EPContext wrapper (no CPU fallback)."""
    import onnxruntime as ort

    from qhx_export.compile.htp import qnn_devices

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(qnn_devices(), qnn_opts)
    return ort.InferenceSession(path, so)


def load_bundle(d: str) -> GenieLoop:
    """The QNN EP loop over a Genie bundle's context binaries (its genie-source.json lists the
    EPContext wrappers the exporter keeps beside them, their order, QNN options and
    fixed-point I/O): the binaries Genie runs, through ORT's QNN EP."""
    with open(os.path.join(d, "genie-source.json"), encoding="utf-8") as f:
        src = json.load(f)
    variants: dict = {}
    for g in sorted(src["graphs"], key=lambda g: g["name"]):
        sess = qnn_session(os.path.join(d, g["wrapper"]), src["qnn_options"][g["precision"]])
        quant = {k: tuple(v) for k, v in g.get("quant", {}).items()}
        variants.setdefault(g["ar"], []).append(Split(sess, quant))
    return GenieLoop(src["params"], src["rope"], variants)


def main(argv: list[str] | None = None) -> int:
    """`python -m qhx_export.verify.genie_loop BUNDLE_DIR N_TOKENS --ids 1,2,3`: prints
    {"input_ids", "output_ids"} of a greedy run over the bundle's context binaries (run with
    the QNN venv's python: scripts/qnn-libs.sh --python)."""
    ap = argparse.ArgumentParser(prog="python -m qhx_export.verify.genie_loop", description=main.__doc__)
    ap.add_argument("bundle")
    ap.add_argument("n_tokens", type=int)
    ap.add_argument("--ids", required=True)
    a = ap.parse_args(argv)
    loop = load_bundle(a.bundle)
    ids = [int(t) for t in a.ids.split(",")]
    print(json.dumps({"input_ids": ids, "output_ids": loop.generate(ids, a.n_tokens)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
