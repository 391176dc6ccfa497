"""Genie bundles (`--format genie|both`, fp16): `genie_config.json` + one QNN context binary per
(AR, CL) variant in Genie's tensor layout (qhx_export.graphs.genie), loadable by Qualcomm's
libGenie.so and by qhx_generate.

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
from collections.abc import Callable
from typing import Any

import numpy as np

from qhx_export import ExportError, NotImplementedYet
from qhx_export.compile import htp as qc
from qhx_export.graphs import GraphOptions, save
from qhx_export.graphs.genie import genie_graph
from qhx_export.read.base import Checkpoint
from qhx_export.write.files import atomic_open

Log = Callable[[str], None]


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


def write_genie(
    ck: Checkpoint,
    out: str,
    arch: str,
    soc: int,
    name: str,
    ar: int,
    ctx: int,
    prescale: float,
    precision: str,
    work: str,
    log: Log,
) -> tuple[str, dict[str, int]]:
    """Write the Genie files into `out`; returns (genie_config.json path, {file: bytes})."""
    if precision != "fp16":
        raise NotImplementedYet(f"--format genie with --precision {precision} (fp16 only so far)")
    w = ck.weights()
    o = GraphOptions(prescale=prescale)
    bins, sizes = [], {}
    for a in sorted({ar, 1}, reverse=True):
        gname = f"{'prompt' if a > 1 else 'token'}_ar{a}_cl{ctx}_1_of_1"
        stem = f"{name}_{gname}"
        src = os.path.join(work, f"genie-{gname}.onnx")
        save(genie_graph(ck.config, lambda n: np.asarray(w[n], np.float32), gname, a, ctx, o), src)
        wrapper, binf, secs = qc.compile_graph(src, out, stem, qc.qnn_options(arch, soc, "fp16"))
        rename_graph(os.path.join(out, binf), os.path.join(out, wrapper), gname)
        size = os.path.getsize(os.path.join(out, binf))
        log(f"{arch} genie {gname}: {binf} ({size / 1e6:.1f} MB) compiled in {secs:.1f}s")
        bins.append(binf)
        sizes[binf] = size
    cfg_path = os.path.join(out, "genie_config.json")
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        with atomic_open(os.path.join(out, "tokenizer.json")) as f:
            f.write(ck.tokenizer_json())
    with atomic_open(cfg_path) as f:
        f.write(json.dumps(genie_config(ck, ctx, bins), indent=2).encode("utf-8") + b"\n")
    return cfg_path, sizes
