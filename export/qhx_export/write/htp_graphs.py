"""The graphs of an HTP bundle: which roles it has (prefill, decode, verify, lm-head, and the
verify rows only estimated), each built as an ONNX graph, and the host embedding beside them."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from qhx_export.cache import StageCache, key_of
from qhx_export.graphs import GraphOptions, layer_graph, lmhead_graph, save, specs
from qhx_export.read.base import Checkpoint
from qhx_export.write.options import HtpOptions, Log


@dataclass
class Graph:
    """One graph on its way to a context binary: the ONNX file, how QNN runs it (fp16: float graph,
    quant: pure QDQ, mixed: QDQ with fp16 nodes), its fixed-point I/O, and its stage-cache key."""

    path: str
    mode: str
    quant: dict[str, tuple[float, int]]
    key: str


def build_graphs(
    ck: Checkpoint,
    o: HtpOptions,
    cache: StageCache,
    src: str,
    gopts: GraphOptions,
    log: Log,
    tick: Callable[[], None],
) -> dict[str, Graph]:
    """Float ONNX graphs by role. Besides the bundle's roles, `est_verify_<k>` graphs (k rows over
    the cache) for the estimate table of --estimate-verify."""
    c = ck.config
    sp = specs(c, o.name, o.ar, o.ctx, o.prefill, gopts.quantized, o.verify_rows, gopts.io_f16, o.kv_layout)
    for k in extra_verify_rows(o):
        sp[f"est_verify_{k}"] = specs(
            c, o.name, o.ar, o.ctx, "none", gopts.quantized, k, kv_layout=o.kv_layout
        )["verify"]
    for rung in o.ctx_ladder:
        rs = specs(
            c, o.name, o.ar, rung, o.prefill, gopts.quantized, o.verify_rows, gopts.io_f16, o.kv_layout
        )
        for base in rung_bases(o):
            sp[rung_role(base, rung)] = rs[base]
    out, cached = {}, 0
    order = ("prefill", "verify", "decode", "lmhead")
    for role in (*order, *(r for r in sp if r not in order)):
        if role not in sp:
            continue
        key = key_of("graph", {"source": src, "spec": sp[role], "options": asdict(gopts), "role": role})

        def build(d: str, role: str = role) -> None:
            fn = lmhead_graph if role == "lmhead" else layer_graph
            # each tensor read when the graph takes it and dropped after (no cache of every
            # weight in f32: that alone is 7 GB for a 1.5B model)
            m = fn(c, ck.float32, sp[role], gopts)
            save(m, os.path.join(d, "graph.onnx"))

        d, hit = cache.entry("graph", key, build)
        cached += hit
        out[role] = Graph(os.path.join(d, "graph.onnx"), "fp16", {}, key)
        tick()
    if cached:
        log(f"float graphs: {cached} of {len(out)} from the stage cache")
    return out


def rung_bases(o: HtpOptions) -> list[str]:
    """The roles a context-ladder rung repeats: decode, a verify graph, a prefill that reads the
    cache (a window prefill starts every rung from an empty cache, so there is one)."""
    return [
        r
        for r, on in (
            ("prefill", o.prefill == "past"),
            ("verify", o.verify_rows is not None),
            ("decode", True),
        )
        if on
    ]


def rung_role(base: str, ctx: int) -> str:
    """`decode@256`: the role of `base` on the ladder rung of cache size `ctx`."""
    return f"{base}@{ctx}"


def base_role(role: str) -> str:
    """`decode` for `decode@256` (and for `decode`)."""
    return role.split("@", 1)[0]


def extra_verify_rows(o: HtpOptions) -> list[int]:
    """--estimate-verify row counts that are not the bundle's own verify graph."""
    return sorted({k for k in o.estimate_verify if k != o.verify_rows})


def is_bundle_role(role: str) -> bool:
    """False for graphs built only to be estimated."""
    return not role.startswith("est_")


# qhx_generate's manifest arch (llama, qwen2, qwen3, gemma3, lfm2): the host work of a real bundle
# differs only by the `layers` section (QK-norm and the rest live in the graphs). Qwen3 bundles
# say "qwen2", as they did before the runtime knew "qwen3" (source.family says qwen3).


def host_embedding(ck: Checkpoint, resid_scale: float = 1.0) -> np.ndarray:
    """The host's f32 embedding table: token_embd, times the family's scale (Gemma: sqrt(hidden))
    and the graphs' residual-stream scale."""
    emb = ck.float32("token_embd.weight")
    scale = (ck.family.embed_scale(ck.config) or 1.0) * resid_scale
    return (emb * np.float32(scale)).astype(np.float32) if scale != 1.0 else emb
