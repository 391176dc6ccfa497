"""Calibration and quantization of an HTP bundle's graphs: the calibration text and ids, the
RMSNorm prescale and residual-stream scales that keep fp16 in range, and each graph's QDQ form
from ranges recorded by running the float graphs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable

import numpy as np

from qhx_export.cache import StageCache, key_of
from qhx_export.quant.lpbq import BLOCK as LPBQ_BLOCK
from qhx_export.read.base import Checkpoint
from qhx_export.write.emu import layers_section
from qhx_export.write.htp_graphs import Graph, base_role, host_embedding
from qhx_export.write.options import MIXED_PEAK, HtpOptions, Log, Progress

NORM_PEAK = 128.0  # RMSNorm inputs are scaled so the largest |x| seen is at most this (x^2 < 65504)


def calib_texts(ck: Checkpoint, o: HtpOptions) -> list[str]:
    from qhx_export.quant import corpus

    return corpus.from_file(o.calib) if o.calib else corpus.builtin(ck.chat_template())


def calib_ids(ck: Checkpoint, o: HtpOptions, max_len: int) -> list[list[int]]:
    from qhx_export.quant import corpus

    return corpus.tokenize(calib_texts(ck, o), ck.tokenizer_json(), ck.bos_token_id(), max_len)


METHOD_SEQ_LEN = 256  # tokens per calibration sequence of the 4-bit weight methods
METHOD_WINDOWS = 40  # windows of the shipped long text beside the built-in corpus (~10k tokens)
METHOD_FORWARDS = 6  # calibration forwards of the 4-bit methods: the layers go in this many groups,
# each group's inputs recorded with the groups before it quantized (one forward a layer costs
# ~4x the time for SmolLM2; measured with groups of 5 of its 30 layers)


def method_group(n_layers: int) -> int:
    return max(1, math.ceil(n_layers / METHOD_FORWARDS))


def method_seqs(ck: Checkpoint, o: HtpOptions) -> list[list[int]]:
    """What `--quant-method seqmse|gptq` calibrates on: the calibration texts (the built-in corpus
    or --calib) at up to METHOD_SEQ_LEN tokens, and with the built-in corpus also windows of the
    shipped long text (GPTQ's Hessians want many more tokens than the inputs they span); at most
    --method-tokens of them."""
    from qhx_export.quant import corpus

    tj, bos = ck.tokenizer_json(), ck.bos_token_id()
    seqs = corpus.tokenize(calib_texts(ck, o), tj, bos, METHOD_SEQ_LEN)
    if not o.calib:
        seqs += corpus.windows(corpus.data_text(corpus.CALIB_LONG), tj, bos, METHOD_SEQ_LEN, METHOD_WINDOWS)
    if o.method_tokens is not None:  # --method-tokens: the first N tokens, in order
        kept, left = [], o.method_tokens
        for s in seqs:
            if left <= 0:
                break
            kept.append(s[:left])
            left -= len(kept[-1])
        seqs = kept
    return seqs


class LazySolution:
    """The 4-bit method's LPBQ triples by checkpoint tensor, solved (or read from the stage
    cache) the first time a graph asks for one: when every QDQ graph is cached nothing runs."""

    def __init__(self, ck: Checkpoint, o: HtpOptions, cache: StageCache, source: object, log: Log) -> None:
        self.ck, self.o, self.cache, self.source, self.log = ck, o, cache, source, log
        self.triples: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self.summary: dict[str, object] = {"method": o.quant_method}

    def __call__(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.triples is None:
            self.triples = self._load()
        if name not in self.triples:
            raise KeyError(f"--quant-method {self.o.quant_method}: no solution for {name}")
        return self.triples[name]

    def _load(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        from qhx_export.quant.methods import solve

        seqs = method_seqs(self.ck, self.o)
        key = key_of(
            "solve",
            {
                "source": self.source,
                "method": self.o.quant_method,
                "seqs": hashlib.sha256(json.dumps(seqs).encode()).hexdigest(),
                "skip": list(self.o.fp16_weights),
                "group": method_group(self.ck.config.n_layers),
            },
        )

        def run(d: str) -> None:
            self.log(
                f"{self.o.quant_method}: choosing the 4-bit weights on {len(seqs)} calibration sequences "
                f"({sum(map(len, seqs))} tokens), in {METHOD_FORWARDS} groups of layers"
            )
            sol = solve(
                self.ck,
                seqs,
                self.o.quant_method,
                log=self.log,
                skip=self.o.fp16_weights,
                group=method_group(self.ck.config.n_layers),
            )
            arrays = {}
            for n, (q, k, ch) in sol.triples.items():
                arrays[n + "/q"], arrays[n + "/k"], arrays[n + "/ch"] = q, k, ch
            np.savez(os.path.join(d, "solution.npz"), **arrays)
            with open(os.path.join(d, "summary.json"), "w") as f:
                json.dump(sol.summary(), f)

        d, hit = self.cache.entry("solve", key, run)
        with open(os.path.join(d, "summary.json")) as f:
            self.summary = {**json.load(f), "cached": hit}
        out = {}
        with np.load(os.path.join(d, "solution.npz")) as z:
            for k in z.files:
                n, part = k.rsplit("/", 1)
                out.setdefault(n, {})[part] = z[k]
        return {n: (v["q"], v["k"], v["ch"]) for n, v in out.items()}


def norm_prescale(ck: Checkpoint, seqs: list[list[int]]) -> tuple[float, float]:
    """(prescale, residual peak): the largest |x| entering an RMSNorm over `seqs` (float
    reference), and the power of two that brings it under NORM_PEAK."""
    trace: dict[str, float] = {}
    w = ck.weights()
    for ids in seqs:
        ck.family.forward(ck.config, w, ids, trace)
    peak = trace.get("residual_max", 0.0)
    k = max(0, math.ceil(math.log2(peak / NORM_PEAK))) if peak > NORM_PEAK else 0
    return 2.0**-k, peak


STREAM_PEAK = 16384.0  # post-normed families carry the residual stream scaled under this


def stream_scales(ck: Checkpoint, peak: float) -> tuple[float, float]:
    """(residual scale, q/k-norm prescale): powers of two for post-normed families (Gemma 3),
    whose residual stream can pass fp16's range; 1 for the others."""
    if not ck.config.post_norms:
        return 1.0, 1.0
    k = max(0, math.ceil(math.log2(peak / STREAM_PEAK))) if peak > STREAM_PEAK else 0
    return 2.0**-k, 0.125


def quantize_graphs(
    ck: Checkpoint,
    o: HtpOptions,
    graphs: dict[str, Graph],
    seqs: list[list[int]],
    peak: float,
    cache: StageCache,
    log: Log,
    progress: Progress,
) -> dict[str, Graph]:
    """Calibrate and QDQ-quantize: the graphs to compile, by role."""
    from qhx_export.quant.qdq import (
        CALIB_MASK,
        feeds_stream,
        fixed_point_io,
        minmax,
        quantize,
        tied_kv_ranges,
    )
    from qhx_export.verify.loop import Loop, cpu_graph

    c = ck.config
    bits = 4 if o.precision == "w4a16" else 8
    mixed = peak > MIXED_PEAK
    wdesc = "int8 per-channel" if bits == 8 else f"int4 LPBQ (blocks of {LPBQ_BLOCK})"
    log(
        f"{o.precision}: {wdesc} weights, uint16 activations"
        f"{f'; residual adds and RMSNorms in fp16 (residual peak {peak:.0f})' if mixed else ''}; "
        f"calibrating on {len(seqs)} sequences ({o.calib_steps} decode steps)"
    )
    man = {"params": c.rope_params(), "layers": layers_section(c, o.ctx)}
    resid_scale = o.report.get("graph", {}).get("residual_scale", 1.0)
    emb = host_embedding(ck, resid_scale).astype(np.float16)

    def make_loop(role: str) -> Callable[[], Loop]:
        # only the graphs calibrating `role` needs: a 1B model's float graph is ~4 GB in ORT
        need = {"prefill", "decode", role} | ({"lmhead"} if role == "lmhead" else set())
        return lambda: Loop(
            man,
            cache.scratch,
            {r: cpu_graph(graphs[r].path) for r in graphs if r in need},
            neg_override=CALIB_MASK,
            embed=emb,
        )

    # w4a16: the lm-head too, with int8 per-channel weights (4-bit logits lose too much);
    # w8a16 keeps an fp16 lm-head
    roles = [r for r in graphs if r != "lmhead"] + (["lmhead"] if bits == 4 else [])
    # what calibration read: every float graph (the loop runs prefill / decode / lm-head), the
    # token sequences, the step budget and the host embedding's scale
    calib_in = {
        "graphs": {r: g.key for r, g in sorted(graphs.items())},
        "seqs": hashlib.sha256(json.dumps(seqs).encode()).hexdigest(),
        "steps": o.calib_steps,
        "resid_scale": resid_scale,
    }
    ranges, calib_keys = {}, {}
    # a context-ladder rung's graph is its base role's over another cache size: same tensors,
    # same activations, so it takes the base role's ranges (and thus the same I/O encodings,
    # which lets the runtime move the cache between rungs byte for byte)
    rungs = [r for r in roles if base_role(r) != r]
    roles_calibrated = [r for r in roles if r not in rungs]
    tick = progress("calibrate", len(roles_calibrated))
    for role in roles_calibrated:
        t0 = time.monotonic()
        calib_keys[role] = key_of("calibrate", {**calib_in, "role": role})

        def run(d: str, role: str = role) -> None:
            r, _ = minmax(graphs[role].path, feeds_stream(make_loop(role), seqs, role, o.calib_steps))
            with open(os.path.join(d, "ranges.json"), "w") as f:
                json.dump(r, f)

        d, hit = cache.entry("calibrate", calib_keys[role], run)
        with open(os.path.join(d, "ranges.json")) as f:
            ranges[role] = {k: (float(v[0]), float(v[1])) for k, v in json.load(f).items()}
        log(f"calibrated {role} ({'cached' if hit else f'{time.monotonic() - t0:.1f}s'})")
        tick()
    for role in rungs:
        ranges[role], calib_keys[role] = ranges[base_role(role)], calib_keys[base_role(role)]
    kv_ranges = tied_kv_ranges([ranges[r] for r in roles if r != "lmhead"])
    method = o.quant_method if bits == 4 else None
    solution = LazySolution(ck, o, cache, calib_in["graphs"], log) if method not in (None, "rtn") else None
    out: dict[str, Graph] = {}
    kv_u8 = o.kv_dtype == "u8"
    tick = progress("quantize", len(roles))
    for role in roles:
        t0 = time.monotonic()
        rbits = (4 if o.head_precision == "int4" and bits == 4 else 8) if role == "lmhead" else bits
        rmixed = mixed and role != "lmhead"
        # tied K/V ranges make every role's QDQ graph depend on every role's calibration
        key = key_of(
            "quantize",
            {
                "calib": calib_keys,
                "role": role,
                "bits": rbits,
                "mixed": rmixed,
                "kv_u8": kv_u8,
                "method": method,
            },
        )

        def run(d: str, role: str = role, rbits: int = rbits, rmixed: bool = rmixed) -> None:
            dst = os.path.join(d, "graph.qdq.onnx")
            quantize(graphs[role].path, dst, ranges[role], rbits, rmixed, kv_u8, kv_ranges, solve=solution)
            with open(os.path.join(d, "io.json"), "w") as f:
                json.dump(fixed_point_io(dst), f)

        d, hit = cache.entry("quantize", key, run)
        with open(os.path.join(d, "io.json")) as f:
            quant = {k: (float(v[0]), int(v[1])) for k, v in json.load(f).items()}
        fp16_inside = (mixed or bool(o.fp16_weights)) and role != "lmhead"
        out[role] = Graph(os.path.join(d, "graph.qdq.onnx"), "mixed" if fp16_inside else "quant", quant, key)
        log(f"quantized {role} ({'cached' if hit else f'{time.monotonic() - t0:.1f}s'})")
        tick()
    if "lmhead" not in out:
        out["lmhead"] = graphs["lmhead"]
    o.report["quantization"] = {
        "weights": "int8 symmetric per output channel (MatMul)"
        if bits == 8
        else f"int4 symmetric, blocks of {LPBQ_BLOCK} input rows: 4-bit multipliers of a per-channel "
        "scale (QNN LPBQ)",
        "activations": "uint16 asymmetric (MinMax)",
        "mixed_fp16": mixed,
        "fp16_weights": list(o.fp16_weights),
        "lmhead": (f"{o.head_precision} " + ("per channel" if o.head_precision == "int8" else "LPBQ"))
        + ", uint16 activations"
        if bits == 4
        else "fp16",
        "method": (solution.summary if solution is not None else {"method": method}) if method else None,
        "rotate": o.report.get("graph", {}).get("rotate"),
        "kv_cache": "uint8, input and output ranges tied per layer" if o.kv_dtype == "u8" else "uint16",
        "calibration_sequences": len(seqs),
        "calibration_decode_steps": o.calib_steps,
    }
    return out
