"""Genie bundles (`--format genie|both`): `genie_config.json` + one QNN context binary per
(AR, CL) variant and split in Genie's tensor layout (qhx_export.graphs.genie), loadable by
Qualcomm's libGenie.so and by qhx_generate, and `genie-source.json` (how every graph was made:
graph file, QNN graph name, AR, split, layers, QNN options, scale/offset of fixed-point I/O).

Precision: fp16 graphs run fp16 inside with float32 I/O. w8a16 / w4a16 graphs are the package's
QDQ graphs (qhx_export.quant.qdq: per-channel int8 or LPBQ int4 weights, uint16 activations,
--fp16-weights islands), calibrated by the Genie-layout loop (qhx_export.verify.genie_loop) over
the float graphs, with graph I/O as in AI Hub's Genie bundles: KV uint8, mask / cos / sin /
logits / split hidden state uint16, each tensor with its own scale/offset, every range the union
over all variants (Genie binds one quantization per tensor name), a layer's `_in` / `_out` pair
sharing one range (Genie copies raw bytes from one into the other), and the mask's range
[-1000, 0] (Genie writes raw 0 for masked and raw 65535 for attend).

Graph names: Genie orders the splits of one (AR, CL) by sorted graph name, and ORT's QNN EP names
every graph QNNExecutionProvider_QNNExecutionProvider_<hash>_<n>_0 with no option to choose it.
The writer rewrites the name inside the binary with a same-length one
(`{prompt|token}_ar{N}_cl{C}_1_of_1`, '_'-padded): the binary holds the name three times, so only
a same-length rewrite keeps every length and offset; the EPContext wrapper's node is renamed to
match so ORT still finds the graph.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from qhx_export import ExportError, __version__
from qhx_export.compile import htp as qc
from qhx_export.graphs import GraphOptions, save
from qhx_export.graphs.genie import MASK_NEG, genie_graph, split_layers
from qhx_export.read.base import Checkpoint
from qhx_export.write.files import atomic_open

if TYPE_CHECKING:
    from qhx_export.write.options import HtpOptions

Log = Callable[[str], None]
Progress = Callable[[str, int], Callable[[], None]]
Feeds = dict[str, np.ndarray]


def qnn_graph_name(wrapper: str) -> str:
    import onnx

    for n in onnx.load(wrapper).graph.node:
        if n.op_type == "EPContext":
            return str(n.name)
    return ""


def rename_graph(bin_path: str, wrapper: str, new: str) -> str:
    """Give the binary's one graph the name `new`, '_'-padded to the length ORT's had."""
    import onnx

    old = qnn_graph_name(wrapper)
    if not old or len(new) > len(old):
        raise ExportError(f"{bin_path}: cannot rename graph {old!r} to {new!r}")
    name = new + "_" * (len(old) - len(new))
    with open(bin_path, "rb") as f:
        data = f.read()
    if old.encode() not in data:
        raise ExportError(f"{bin_path}: graph name {old} not found in the binary")
    with atomic_open(bin_path) as f:
        f.write(data.replace(old.encode(), name.encode()))
    w = onnx.load(wrapper)
    for node in w.graph.node:
        if node.op_type == "EPContext" and node.name == old:
            node.name = name
            for a in node.attribute:
                if a.name == "partition_name":
                    a.s = name.encode()
    onnx.save(w, wrapper)
    return name


def genie_config(ck: Checkpoint, ctx: int, bins: list[str]) -> dict[str, Any]:
    c = ck.config
    eos = ck.eos_token_id()
    pe: dict[str, Any] = {"type": "rope", "rope-dim": c.head_dim // 2, "rope-theta": c.rope_theta}
    if c.rope_scaling:
        rs = c.rope_scaling
        pe["rope-scaling"] = {
            "rope-type": "llama3",
            "factor": rs["factor"],
            "low-freq-factor": rs["low_freq_factor"],
            "high-freq-factor": rs["high_freq_factor"],
            "original-max-position-embeddings": rs["original_max_position_embeddings"],
        }
    context: dict[str, Any] = {"version": 1, "size": ctx, "n-vocab": c.vocab}
    bos = ck.bos_token_id()
    context["bos-token"] = bos if bos is not None else -1  # required by Genie's schema; -1: none
    if eos is not None:
        context["eos-token"] = eos
    return {
        "dialog": {
            "version": 1,
            "type": "basic",
            "context": context,
            "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 1.0, "greedy": True},
            "tokenizer": {"version": 1, "path": "tokenizer.json"},
            "engine": {
                "version": 1,
                "n-threads": 1,
                "backend": {
                    "version": 1,
                    "type": "QnnHtp",
                    "QnnHtp": {
                        "version": 1,
                        "spill-fill-bufsize": 0,
                        "use-mmap": False,
                        "mmap-budget": 0,
                        "poll": False,
                        "cpu-mask": "0x1",
                        "kv-dim": c.head_dim,
                        "allow-async-init": False,
                    },
                },
                "model": {
                    "version": 1,
                    "type": "binary",
                    "binary": {"version": 1, "ctx-bins": bins},
                    "positional-encoding": pe,
                },
            },
        }
    }


@dataclass
class GenieGraph:
    """One graph of the bundle: a split of an (AR, CL) variant, and what to compile."""

    gname: str  # {prompt|token}_ar{AR}_cl{CL}_{i}_of_{n}: the graph's name inside its binary
    ar: int
    split: int
    layers: list[int]
    path: str = ""  # the ONNX graph to compile (float, or QDQ)
    mode: str = "fp16"  # qc.qnn_options mode: fp16, quant, mixed
    quant: dict[str, tuple[float, int]] = field(default_factory=dict)  # fixed-point I/O


def plan(n_layers: int, ar: int, ctx: int, splits: int) -> list[GenieGraph]:
    """Every graph, prompt variant first, splits in order (Genie orders them by sorted name)."""
    if not 1 <= splits <= n_layers:
        raise ExportError(f"--genie-splits {splits}: must be 1..{n_layers} (the model's layers)")
    out = []
    for a in sorted({ar, 1}, reverse=True):
        kind = "prompt" if a > 1 else "token"
        for s, layers in enumerate(split_layers(n_layers, splits), start=1):
            out.append(GenieGraph(f"{kind}_ar{a}_cl{ctx}_{s}_of_{splits}", a, s, layers))
    return out


def prepare_genie(
    ck: Checkpoint,
    o: HtpOptions,
    prescale: float,
    seqs: list[list[int]],
    peak: float,
    work: str,
    log: Log,
    progress: Progress,
) -> list[GenieGraph]:
    """The graphs of the Genie bundle, float (fp16) or calibrated and QDQ-quantized, ready to
    compile for any arch."""
    from qhx_export.write.options import MIXED_PEAK

    c = ck.config
    graphs = plan(c.n_layers, o.ar, o.ctx, o.genie_splits)
    quantized = o.precision != "fp16"
    mixed = quantized and peak > MIXED_PEAK
    gopts = GraphOptions(
        quantized=quantized, prescale=prescale, fp16_weights=o.fp16_weights if quantized else ()
    )
    w = ck.weights()
    tick = progress("genie graphs", len(graphs))
    for g in graphs:
        g.path = os.path.join(work, f"genie-{g.gname}.onnx")
        m = genie_graph(
            c,
            lambda n: np.asarray(w[n], np.float32),
            g.gname,
            g.ar,
            o.ctx,
            gopts,
            g.layers,
            g.split,
            o.genie_splits,
        )
        save(m, g.path)
        tick()
    if quantized:
        quantize_genie(ck, o, graphs, seqs, mixed, work, log, progress)
    return graphs


def _calib_feeds(
    ck: Checkpoint, graphs: list[GenieGraph], target: GenieGraph, seqs: list[list[int]], steps: int
) -> Iterator[Feeds]:
    """Feeds of every execute of `target` while the float graphs (ORT's CPU EP) read `seqs`: each
    sequence's first half as the prompt (in two or more chunks of at most AR rows), then up to
    `steps` decode steps in all, spread over the sequences and teacher-forced on their own ids."""
    import onnxruntime as ort

    from qhx_export.verify.genie_loop import GenieLoop, Split

    so = ort.SessionOptions()
    so.log_severity_level = 3
    variants: dict[int, list[Split]] = {}
    rec = None
    for g in graphs:
        sp = Split(ort.InferenceSession(g.path, so, providers=["CPUExecutionProvider"]))
        variants.setdefault(g.ar, []).append(sp)
        if g is target:
            rec = sp
    assert rec is not None
    c = ck.config
    loop = GenieLoop(
        {"n_layers": c.n_layers, "head_dim": c.head_dim, "n_kv_heads": c.n_kv_heads},
        {"theta": c.rope_theta, "scaling": c.rope_scaling},
        variants,
    )
    AR = max(variants)
    per_seq = max(1, steps // max(1, len(seqs)))
    budget = steps
    for ids in seqs:
        if budget <= 0:
            return
        loop.reset()
        rec.record = []
        n0 = max(1, len(ids) // 2) if AR > 1 else 1
        n0 = min(n0, loop.CL - AR)
        # at least two prompt chunks, so the prompt graph also calibrates reading a filled cache
        # (a chunk from an empty cache alone leaves its scores against the cache no range)
        chunk = min(AR, max(2, (n0 + 1) // 2))  # one id would run the AR-1 graph
        for i in range(0, n0, chunk):
            loop.step(ids[i : min(i + chunk, n0)])
            yield from rec.record
            rec.record.clear()
        for t in ids[n0 : n0 + per_seq]:
            if budget <= 0 or loop.n_past + 1 > loop.CL - 1:
                break
            loop.step([int(t)])
            budget -= 1
            yield from rec.record
            rec.record.clear()


def io_ranges(
    graphs: list[GenieGraph], ranges: dict[str, dict[str, tuple[float, float]]], io: dict[str, list[str]]
) -> dict[str, tuple[int, float, float]]:
    """{graph I/O tensor: (bits, lo, hi)}: each tensor's range over every graph that binds it, a
    layer's past_*_in / past_*_out pair one range (uint8), the mask [-1000, 0], cos/sin [-1, 1]."""
    union: dict[str, tuple[float, float]] = {}
    for g in graphs:
        for t in io[g.gname]:
            lo, hi = ranges[g.gname][t]
            key = t.removesuffix("_in").removesuffix("_out") if t.startswith("past_") else t
            a, b = union.get(key, (0.0, 0.0))
            union[key] = (min(a, lo), max(b, hi))
    out: dict[str, tuple[int, float, float]] = {}
    for g in graphs:
        for t in io[g.gname]:
            if t == "attention_mask":
                out[t] = (16, MASK_NEG, 0.0)
            elif t.startswith("position_ids_"):
                out[t] = (16, -1.0, 1.0)
            elif t.startswith("past_"):
                out[t] = (8, *union[t.removesuffix("_in").removesuffix("_out")])
            else:
                out[t] = (16, *union[t])
    return out


def quantize_genie(
    ck: Checkpoint,
    o: HtpOptions,
    graphs: list[GenieGraph],
    seqs: list[list[int]],
    mixed: bool,
    work: str,
    log: Log,
    progress: Progress,
) -> None:
    """Calibrate every graph on the Genie loop, then QDQ-quantize it with the shared I/O ranges."""
    import onnx

    from qhx_export.quant.lpbq import BLOCK as LPBQ_BLOCK
    from qhx_export.quant.qdq import fixed_point_io, minmax, quantize

    bits = 4 if o.precision == "w4a16" else 8
    log(
        f"genie {o.precision}: {'int8 per-channel' if bits == 8 else f'int4 LPBQ (blocks of {LPBQ_BLOCK})'} "
        f"weights, uint16 activations, uint8 KV; calibrating {len(graphs)} graphs on {len(seqs)} sequences"
    )
    ranges: dict[str, dict[str, tuple[float, float]]] = {}
    io: dict[str, list[str]] = {}
    tick = progress("genie calibrate", len(graphs))
    for g in graphs:
        t0 = time.monotonic()
        ranges[g.gname], _ = minmax(g.path, _calib_feeds(ck, graphs, g, seqs, o.calib_steps))
        gr = onnx.load(g.path, load_external_data=False).graph
        io[g.gname] = [
            v.name for v in (*gr.input, *gr.output) if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        ]
        missing = [t for t in io[g.gname] if t not in ranges[g.gname]]
        if missing:
            raise ExportError(
                f"genie {g.gname}: no calibration data for {missing[0]} (calibration too short)"
            )
        log(f"calibrated genie {g.gname} ({time.monotonic() - t0:.1f}s)")
        tick()
    shared = io_ranges(graphs, ranges, io)
    tick = progress("genie quantize", len(graphs))
    for g in graphs:
        t0 = time.monotonic()
        dst = os.path.join(work, f"genie-{g.gname}.qdq.onnx")
        quantize(g.path, dst, ranges[g.gname], bits, mixed, io_ranges={t: shared[t] for t in io[g.gname]})
        g.quant = fixed_point_io(dst)
        g.path = dst
        g.mode = "mixed" if mixed or o.fp16_weights else "quant"
        log(f"quantized genie {g.gname} ({time.monotonic() - t0:.1f}s)")
        tick()
    o.report["genie_quantization"] = {
        "weights": "int8 symmetric per output channel" if bits == 8 else f"int4 LPBQ, blocks of {LPBQ_BLOCK}",
        "activations": "uint16 asymmetric (MinMax)",
        "io": "KV uint8 (past_*_in / past_*_out ranges tied per layer), mask [-1000, 0] / cos / sin / "
        "logits / split hidden state uint16; ranges the union over every variant",
        "mixed_fp16": mixed,
        "fp16_weights": list(o.fp16_weights),
        "calibration_sequences": len(seqs),
        "calibration_decode_steps": o.calib_steps,
    }


def write_genie(
    ck: Checkpoint, out: str, arch: str, soc: int, o: HtpOptions, graphs: list[GenieGraph], log: Log
) -> tuple[str, dict[str, int]]:
    """Compile `graphs` for `arch` into `out` with genie_config.json and genie-source.json;
    returns (genie_config.json path, {file: bytes})."""
    c = ck.config
    bins, sizes, entries = [], {}, []
    compiled: dict[str, tuple[str, str]] = {}  # gname -> (wrapper, binary)
    if o.weight_sharing:
        # as AI Hub's bundles: one binary per split holding its prompt and token graphs, the
        # split's weights stored once
        splits = sorted({g.split for g in graphs})
        for k, split in enumerate(splits, start=1):
            part = [g for g in graphs if g.split == split]
            binf = f"{o.name}_part_{k}_of_{len(splits)}.bin"
            jobs = [(g.path, f"{o.name}_{g.gname}", qc.qnn_options(arch, soc, g.mode)) for g in part]
            wrappers, secs = qc.compile_shared(jobs, out, binf)
            size = os.path.getsize(os.path.join(out, binf))
            log(f"{arch} genie {binf}: {len(part)} graphs, {size / 1e6:.1f} MB (weights once) in {secs:.1f}s")
            bins.append(binf)
            sizes[binf] = size
            compiled.update({g.gname: (w, binf) for g, w in zip(part, wrappers, strict=True)})
    for g in graphs:
        stem = f"{o.name}_{g.gname}"
        opts = qc.qnn_options(arch, soc, g.mode)
        if g.gname in compiled:
            wrapper, binf = compiled[g.gname]
        else:
            wrapper, binf, secs = qc.compile_graph(g.path, out, stem, opts)
        ort_name = qnn_graph_name(os.path.join(out, wrapper))
        name = rename_graph(os.path.join(out, binf), os.path.join(out, wrapper), g.gname)
        if g.gname not in compiled:
            size = os.path.getsize(os.path.join(out, binf))
            log(f"{arch} genie {g.gname}: {binf} ({size / 1e6:.1f} MB) compiled in {secs:.1f}s")
            bins.append(binf)
            sizes[binf] = size
        ent: dict[str, Any] = {
            "stem": stem,
            "bin": binf,
            "wrapper": wrapper,
            "name": name,
            "ort_name": ort_name,
            "ar": g.ar,
            "split": g.split,
            "layers": g.layers,
            "precision": g.mode,
        }
        if g.quant:
            ent["quant"] = {k: list(v) for k, v in g.quant.items()}
        entries.append(ent)
    source = {
        "writer": f"qhx-export {__version__}",
        "source": os.path.basename(os.path.abspath(ck.path).rstrip("/")),
        "family": ck.family.name,
        "model_name": o.model_name or ck.default_name(),
        "precision": o.precision,
        "ar": o.ar,
        "ctx": o.ctx,
        "splits": o.genie_splits,
        "qnn_options": {m: qc.qnn_options(arch, soc, m) for m in sorted({g.mode for g in graphs})},
        "params": c.shape_params(),
        "rope": {"theta": c.rope_theta, "scaling": c.rope_scaling},
        "graphs": entries,
    }
    cfg_path = os.path.join(out, "genie_config.json")
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        with atomic_open(os.path.join(out, "tokenizer.json")) as f:
            f.write(ck.tokenizer_json())
    with atomic_open(os.path.join(out, "genie-source.json")) as f:
        f.write(json.dumps(source, indent=2).encode("utf-8") + b"\n")
    with atomic_open(cfg_path) as f:
        f.write(json.dumps(genie_config(ck, o.ctx, bins), indent=2).encode("utf-8") + b"\n")
    return cfg_path, sizes
