"""Block-quantized int4 MatMul weights the HTP runs: QNN's low-power block quantization (LPBQ).

Per-output-channel int4 loses too much of a small model (SmolLM2-135M teacher-forced: 44 % of
HF's top-1 with int4 weights alone), and a plain block-quantized DequantizeLinear -> MatMul is
not taken by the HTP (onnxruntime's QNN EP leaves it on the CPU). LPBQ is what the HTP has: per
block of B input rows a 4-bit integer multiplier k of a per-channel float scale, so a block's
scale is `ch[n] * k[b, n]` with k in 1..15 (QNN's BLOCKWISE_EXPANSION, block-scale bitwidth 4).
onnxruntime's QNN EP fuses this chain into one such MatMul:

    DequantizeLinear(k: uint8 [K/B, N], ch: float [N], 0: uint8 [N], axis=1)      -> scales
    DequantizeLinear(q: int4 [K, N], scales, 0: int4 [K/B, N], axis=0, block_size=B) -> W
    MatMul(x, W)

Measured here (x86 simulator, v73-v81): it compiles with CPU fallback disabled and matches the
float product to 3e-5 relative. k above 15 compiles but computes wrong results, and int8 weights
in this form are rejected (QNN error 3110), so only w4a16 uses it. B = 64 with K = 512 or 576
crashes the simulator after loading, so the block is 32 (every family's K is a multiple of it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import numpy as np

from qhx_export import ExportError

BLOCK = 32


def block_int4(w: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [K, N] (MatMul B layout) -> (q int8 in -8..7 [K, N], k uint8 in 1..15 [K/B, N], ch f32 [N])
    with w ~ q * ch[n] * k[b, n]. Each block's scale is rounded up to the next multiple of ch, so
    no value clips."""
    K, N = w.shape
    if K % block:
        raise ExportError(f"LPBQ: {K} input rows are not a multiple of the block ({block})")
    blocks = w.reshape(K // block, block, N)
    need = np.abs(blocks).max(axis=1) / np.float32(7.0)  # [K/B, N]
    ch = need.max(axis=0) / np.float32(15.0)
    ch[ch == 0] = np.float32(1.0)
    k = np.clip(np.ceil(need / ch - np.float32(1e-6)), 1, 15).astype(np.uint8)
    scale = (ch[None, :] * k).astype(np.float32)
    q = np.clip(np.round(blocks / scale[:, None, :]), -8, 7).astype(np.int8).reshape(K, N)
    return q, k, ch.astype(np.float32)


def _int4_tensor(name: str, values: np.ndarray) -> object:
    """An INT4 initializer: two values a byte, the first in the low nibble (ONNX's packing)."""
    from onnx import TensorProto, helper

    flat = values.astype(np.int8).reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    u = flat.astype(np.uint8) & np.uint8(0x0F)
    packed = (u[0::2] | (u[1::2] << np.uint8(4))).astype(np.uint8)
    return helper.make_tensor(name, TensorProto.INT4, list(values.shape), packed.tobytes(), raw=True)


Triple = tuple[np.ndarray, np.ndarray, np.ndarray]


def chain(stem: str, t: Triple, out: str, block: int = BLOCK) -> tuple[list[object], list[object]]:
    """The initializers and the two DequantizeLinear nodes that make the float weight `out` from
    an LPBQ triple (the form the module docstring shows); names start with `stem`."""
    from onnx import helper, numpy_helper

    q, k, ch = t
    names = {s: f"{stem}_lpbq_{s}" for s in ("q", "k", "ch", "kzp", "qzp", "scale")}
    inits = [
        _int4_tensor(names["q"], q),
        numpy_helper.from_array(k, names["k"]),
        numpy_helper.from_array(ch, names["ch"]),
        numpy_helper.from_array(np.zeros(ch.shape, np.uint8), names["kzp"]),
        _int4_tensor(names["qzp"], np.zeros(k.shape, np.int8)),
    ]
    nodes = [
        helper.make_node(
            "DequantizeLinear",
            [names["k"], names["ch"], names["kzp"]],
            [names["scale"]],
            name=f"{stem}_lpbq_scale_dq",
            axis=1,
        ),
        helper.make_node(
            "DequantizeLinear",
            [names["q"], names["scale"], names["qzp"]],
            [out],
            name=f"{stem}_lpbq_dq",
            axis=0,
            block_size=block,
        ),
    ]
    return inits, nodes


def from_solution(w: np.ndarray, solved: Triple, where: str) -> Triple:
    """A graph weight w [K, N] that is a multiple of a checkpoint tensor (the q projection carries
    the folded score scale) with that tensor's solved triple: the solved q and k, w's own
    per-channel scale (the solver keeps block_int4's, so the two differ by the multiple)."""
    q, k, ch_src = solved
    if q.shape != w.shape:
        raise ExportError(f"{where}: solved weight {q.shape} does not match the graph's {w.shape}")
    ch = block_int4(w)[2]
    ratio = ch / ch_src
    if not np.allclose(ratio, ratio[0], rtol=1e-3):
        raise ExportError(f"{where}: the graph weight is not a multiple of its checkpoint tensor")
    return q, k, ch


def apply(
    float_src: str, qdq_path: str, weights_key: str, solve: Callable[[str], Triple] | None = None
) -> int:
    """Rewrite the int4 per-channel weight DequantizeLinear of every MatMul in `qdq_path` (made by
    onnxruntime's quantizer from `float_src`) into the LPBQ chain, from the float weights:
    nearest rounding, or `solve(checkpoint tensor)` (quant/methods.py) for weights whose source
    the graph records. Returns the number of weights rewritten."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    from qhx_export.graphs.decoder import WEIGHT_SOURCES_KEY

    fm = onnx.load(float_src, load_external_data=False)
    props = {p.key: p.value for p in fm.metadata_props}
    weights = set(json.loads(props.get(weights_key, "[]")))
    sources: dict[str, str] = json.loads(props.get(WEIGHT_SOURCES_KEY, "{}"))
    finits = {t.name: t for t in fm.graph.initializer if t.name in weights}
    by_node = {n.name: n.input[1] for n in fm.graph.node if n.op_type == "MatMul" and n.input[1] in weights}
    base = os.path.dirname(os.path.abspath(float_src))

    def float_weight(name: str) -> np.ndarray:
        t = finits[name]
        if uses_external_data(t):
            load_external_data_for_tensor(t, base)
        a = numpy_helper.to_array(t).astype(np.float32)
        t.ClearField("raw_data")  # keep one weight in memory at a time
        return a

    m = onnx.load(qdq_path)
    g = m.graph
    made_by = {o: n for n in g.node for o in n.output}
    drop_inits: set[str] = set()
    new_nodes: dict[str, list[onnx.NodeProto]] = {}
    new_inits = []
    done = 0
    for n in g.node:
        if n.op_type != "MatMul" or n.name not in by_node:
            continue
        dq = made_by.get(n.input[1])
        if dq is None or dq.op_type != "DequantizeLinear":
            raise ExportError(f"{qdq_path}: MatMul {n.name} weight is not dequantized (no QDQ weight)")
        w = float_weight(by_node[n.name])
        stem = by_node[n.name]
        if solve is not None and stem in sources:
            q, k, ch = from_solution(w, solve(sources[stem]), f"{qdq_path}: {sources[stem]}")
        else:
            q, k, ch = block_int4(w)
        inits, new_nodes[dq.name] = chain(stem, (q, k, ch), dq.output[0])
        new_inits += inits
        drop_inits.update(i for i in dq.input if i)
        done += 1
    if not done:
        return 0
    nodes = []
    for n in g.node:
        nodes += new_nodes.get(n.name, [n])
    del g.node[:]
    g.node.extend(nodes)
    still_used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name not in drop_inits or t.name in still_used]
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    assert all(t.data_type != TensorProto.UNDEFINED for t in new_inits)
    from qhx_export.graphs.decoder import save

    save(m, qdq_path)
    return done
