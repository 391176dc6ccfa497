"""QDQ graphs for the HTP: calibration on real text, per-output-channel weights, 16-bit activations.

* Calibration: the float graphs run on ORT's CPU EP through the package's token loop over the
  calibration sequences; each execute's feeds stream straight into onnxruntime's MinMax calibrator
  (a generator, so the K/V caches of hundreds of steps are never held at once).
* Weights: every MatMul weight gets one symmetric scale per output column (DequantizeLinear
  axis 1, zero point 0) through `init_overrides` (onnxruntime's `get_qnn_qdq_config(per_channel=True)`
  covers only Conv); int8 (w8a16), or int4 (w4a16, opset 21) rewritten into blocks of 32 with
  4-bit block multipliers of a per-channel scale (quant/lpbq.py: the form the HTP runs).
* Activations: uint16. Mixed precision keeps the residual adds and per-layer RMSNorms in float:
  they run in fp16 on the HTP (SmolLM2's residual stream spans ~22,000 next to values near 1).
* Graph I/O: the QuantizeLinear after each input and DequantizeLinear before each output are
  removed, so the binary's I/O tensors are fixed point with the calibrated scale/offset
  (returned in QNN's convention: real = (q + offset) * scale).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from qhx_export import ExportError
from qhx_export.graphs.decoder import FLOAT_NODES_KEY, FP16_NODES_KEY, WEIGHTS_KEY, save
from qhx_export.verify.loop import Graph, Loop

CALIB_MASK = -30000.0  # hidden-slot value in calibration feeds (sets cmask's range; < -1 = hidden)
Feeds = dict[str, np.ndarray]


def feeds_stream(
    make_loop: Callable[[], Loop], seqs: list[list[int]], role: str, max_decode: int
) -> Iterator[Feeds]:
    """Feeds of every execute of graph `role` while the float loop reads `seqs` (prefill: the
    first AR tokens of each, or with past inputs each in two chunks; decode and lmhead: up to
    `max_decode` steps in all, teacher-forced, spread over every sequence; verify: chunks of its
    rows after the prompt, the same budget in tokens). The other roles' prompt is the first half
    of a sequence (at most AR tokens), so each sequence leaves steps to calibrate on."""
    loop = make_loop()
    g: Graph = loop.graphs[role]
    budget = max_decode
    per_seq = max(1, max_decode // max(1, len(seqs)))
    for ids in seqs:
        if role != "prefill" and budget <= 0:
            return
        loop.reset()
        captured: list[Feeds] = []
        g.record = captured
        if role == "prefill":
            assert loop.pre is not None
            R = loop.pre.inputs["x"].dims[0]
            if any(k.startswith("past_k_") for k in loop.pre.inputs):
                # A chunked prefill also reads a filled cache: each sequence goes in as two
                # chunks, the second over the first's K/V. From an empty cache alone its scores
                # against the cache calibrate to nothing and clip at run time (w8a16 --prefill
                # past gave 6 % agreement).
                half = max(1, min(R, (len(ids) + 1) // 2))
                for s in range(0, min(len(ids), 2 * half), half):
                    if loop.pos + R > loop.C:
                        break
                    loop.prefill_chunk(ids[s : s + half])
            else:
                loop.prefill_chunk(ids[:R])
            yield from captured
            continue
        n0 = 1  # without a prefill graph the first token goes through decode too
        if loop.pre is not None:
            n0 = max(1, min(len(ids) // 2, loop.pre.inputs["x"].dims[0]))
        g.record = None
        loop.run_prompt(ids[:n0])
        g.record = captured
        if role.startswith(("verify", "est_verify")):  # teacher-forced chunks of its rows
            R = g.inputs["x"].dims[0]
            rest, left = ids[n0:], per_seq
            while rest and budget > 0 and left > 0 and loop.pos + R <= loop.C:
                loop.prefill_chunk(rest[:R], g)
                rest = rest[R:]
                budget -= R
                left -= R
                yield from captured
                captured.clear()
            continue
        for t in ids[n0 : n0 + per_seq]:
            if budget <= 0 or loop.pos >= loop.C:
                break
            loop.decode_step(int(t))
            if role == "lmhead":
                loop.logits()
            budget -= 1
            yield from captured
            captured.clear()


def minmax(src: str, feeds: Iterator[Feeds]) -> tuple[dict[str, tuple[float, float]], Feeds | None]:
    """Streaming MinMax calibration: the range of every float tensor of `src` over `feeds`
    (onnxruntime's calibrator keeps every execute's outputs, or with CalibMaxIntermediateOutputs
    drops them uncounted). Returns (ranges, the first feeds)."""
    import onnx
    import onnxruntime as ort

    # weights stay on disk: a 1B model's float graph is past protobuf's 2 GB (external data)
    m = onnx.shape_inference.infer_shapes(onnx.load(src, load_external_data=False))
    floats = {
        v.name
        for v in (*m.graph.value_info, *m.graph.output, *m.graph.input)
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    inits = {i.name for i in m.graph.initializer}
    names = sorted({o for n in m.graph.node for o in n.output if o in floats and o not in inits})
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names if n not in have
    )
    so = ort.SessionOptions()
    so.log_severity_level = 3
    external = any(onnx.external_data_helper.uses_external_data(t) for t in m.graph.initializer)
    aug = f"{src}.calib-{os.getpid()}.onnx"  # beside src, so its external data locations resolve
    if external:
        onnx.save(m, aug)
    model: str | bytes = aug if external else m.SerializeToString()
    del m
    try:
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    finally:
        if external:
            os.unlink(aug)
    inputs = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    first = None
    for f in feeds:
        feed = {k: f[k] for k in inputs}
        first = first or feed
        vals = dict(zip(outs, sess.run(outs, feed), strict=True))
        vals.update({k: v for k, v in feed.items() if k in floats})
        for k, v in vals.items():
            a, b = float(np.min(v)), float(np.max(v))
            lo[k], hi[k] = min(lo.get(k, a), a), max(hi.get(k, b), b)
    return {k: (lo[k], hi[k]) for k in lo}, first


def tied_kv_ranges(all_ranges: list[dict[str, tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """{"k_3": (lo, hi)}: each layer's K (V) range over the cache inputs and new rows of every graph."""
    out: dict[str, tuple[float, float]] = {}
    for ranges in all_ranges:
        for t, (a, b) in ranges.items():
            if t.startswith(("past_", "new_")):
                key = t.removeprefix("past_").removeprefix("new_")
                lo, hi = out.get(key, (0.0, 0.0))
                out[key] = (min(lo, a), max(hi, b))
    return out


def quantize(
    src: str,
    dst: str,
    ranges: dict[str, tuple[float, float]],
    weight_bits: int,
    mixed: bool,
    kv_u8: bool = False,
    kv_ranges: dict[str, tuple[float, float]] | None = None,
    io_ranges: dict[str, tuple[int, float, float]] | None = None,
    solve: Callable[[str], Any] | None = None,
) -> None:
    """QDQ-quantize the float graph `src` into `dst` (uint16 activations, per-channel weights).
    `io_ranges`: {tensor: (bits, lo, hi)} fixed unsigned 8/16-bit ranges (Genie's graph I/O, whose
    ranges are shared across graphs and by each layer's K/V input and output). `solve`: the
    4-bit method's LPBQ triple by checkpoint tensor (quant/methods.py; None: nearest)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    m = onnx.load(src, load_external_data=False)
    props = {p.key: p.value for p in m.metadata_props}
    weights = json.loads(props.get(WEIGHTS_KEY, "[]"))
    exclude = json.loads(props.get(FLOAT_NODES_KEY, "[]")) if mixed else []
    exclude += json.loads(props.get(FP16_NODES_KEY, "[]"))  # weights kept fp16 (--fp16-weights)
    # A tensor between float nodes only must get no range override: ORT would quantize it
    ex = set(exclude)
    made_by = {o: n.name for n in m.graph.node for o in n.output}
    used_by: dict[str, list[str]] = {}
    for n in m.graph.node:
        for i in n.input:
            used_by.setdefault(i, []).append(n.name)
    outputs = {o.name for o in m.graph.output}
    inner = {
        t
        for t, p in made_by.items()
        if p in ex and t not in outputs and all(u in ex for u in used_by.get(t, []))
    }
    del m
    wtype = {8: QuantType.QInt8, 4: QuantType.QInt4}[weight_bits]
    if not ranges:
        raise ExportError(f"{src}: no calibration data (the calibration sequences are too short)")
    overrides: dict[str, list[dict[str, Any]]] = {
        w: [{"axis": 1, "quant_type": wtype, "symmetric": True}] for w in weights
    }
    if kv_u8 or kv_ranges is not None:
        # A layer's cache input and its new rows share one range (tied); `kv_ranges`
        # (tied_kv_ranges over every graph) ties them across graphs too, so a chunked prefill
        # or a verify graph reads the decode cache in place (same scale and offset).
        shared = kv_ranges if kv_ranges is not None else tied_kv_ranges([ranges])
        kv_type = QuantType.QUInt8 if kv_u8 else QuantType.QUInt16
        for t in [t for t in ranges if t.startswith(("past_", "new_"))]:
            lo, hi = shared[t.removeprefix("past_").removeprefix("new_")]
            overrides[t] = [{"quant_type": kv_type, "rmin": np.float32(lo), "rmax": np.float32(hi)}]
    for t, (bits, lo, hi) in (io_ranges or {}).items():
        # both ends around 0 (an asymmetric range must hold 0) and apart (a constant tensor)
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        hi = hi if hi > lo else lo + 1e-6
        qt = QuantType.QUInt8 if bits == 8 else QuantType.QUInt16
        overrides[t] = [{"quant_type": qt, "rmin": np.float32(lo), "rmax": np.float32(hi)}]
    cfg = get_qnn_qdq_config(
        src,
        None,  # type: ignore[arg-type]  # ranges come from the calibration cache below
        activation_type=QuantType.QUInt16,
        weight_type=QuantType.QUInt8,
        init_overrides=overrides,
        nodes_to_exclude=exclude,
    )
    # onnxruntime's own calibrator would augment the graph again (quadratic in its size): hand
    # the quantizer our ranges as its calibration cache instead
    cache = dst + ".ranges.json"
    data = {
        t: TensorData(lowest=np.float32(lo), highest=np.float32(hi))
        for t, (lo, hi) in ranges.items()
        if t not in inner
    }
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), cache)
    try:
        with _fast_rewiring(), _quiet_root_logger():
            quantize_static(
                src,
                dst,
                None,
                calibration_cache_path=cache,
                quant_format=QuantFormat.QDQ,
                activation_type=cfg.activation_type,
                weight_type=cfg.weight_type,
                op_types_to_quantize=cfg.op_types_to_quantize,
                nodes_to_exclude=cfg.nodes_to_exclude,
                per_channel=cfg.per_channel,
                calibrate_method=CalibrationMethod.MinMax,
                use_external_data_format=cfg.use_external_data_format,
                extra_options=cfg.extra_options,
            )
    finally:
        os.unlink(cache)
    if weight_bits == 4:  # per-channel int4 -> the HTP's block-quantized form (quant/lpbq.py)
        from qhx_export.quant import lpbq

        lpbq.apply(src, dst, WEIGHTS_KEY, solve)


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime's quantizer logs "Please consider to run pre-processing" through the root
    logger at every call (its shape inference is not what we need: the graphs carry shapes);
    our own progress lines stay the only ones on stderr."""
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


@contextlib.contextmanager
def _fast_rewiring() -> Iterator[None]:
    """onnxruntime's QDQ quantizer rewires each quantized tensor's consumers by visiting every
    input of every node in Python (quadratic: minutes for a 30-layer graph). While it runs, the
    same rewiring skips nodes that do not read the tensor (a C-level membership test)."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    orig = getattr(ONNXModel, "replace_input_of_all_nodes", None)
    if orig is None:
        yield
        return

    def fast(self: Any, old: str, new: str) -> None:
        for node in self.model.graph.node:
            if old in node.input:
                ONNXModel.replace_node_input(node, old, new)

    ONNXModel.replace_input_of_all_nodes = fast  # type: ignore[method-assign]
    try:
        yield
    finally:
        ONNXModel.replace_input_of_all_nodes = orig  # type: ignore[method-assign]


def _rename(nodes: Any, field: str, old: str, new: str) -> None:
    for n in nodes:
        names = getattr(n, field)
        for k, x in enumerate(names):
            if x == old:
                names[k] = new


def fixed_point_io(path: str) -> dict[str, tuple[float, int]]:
    """Make the graph I/O of a QDQ model fixed point: an input feeding one QuantizeLinear becomes
    that Q's output, an output made by a DequantizeLinear becomes that DQ's input. Returns
    {tensor: (scale, offset)} with offset = -zero_point."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    g = m.graph
    inits = {i.name: i for i in g.initializer}

    def arr(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name])

    quant: dict[str, tuple[float, int]] = {}
    drop = []
    for inp in g.input:
        if inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            continue  # integer inputs (Genie's input_ids) stay as they are
        qs = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == inp.name]
        others = [n for n in g.node if inp.name in n.input and n.op_type != "QuantizeLinear"]
        if len(qs) != 1 or others:
            raise ExportError(f"{path}: input {inp.name} does not enter through one QuantizeLinear")
        q = qs[0]
        scale, zp = arr(q.input[1]), arr(q.input[2])
        _rename(g.node, "input", q.output[0], inp.name)
        drop.append(q)
        inp.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(zp.dtype)
        quant[inp.name] = (float(np.float32(scale)), -int(zp))
    for out in g.output:
        dq = [n for n in g.node if n.op_type == "DequantizeLinear" and n.output[0] == out.name]
        if len(dq) != 1:
            raise ExportError(f"{path}: output {out.name} does not leave through a DequantizeLinear")
        d = dq[0]
        scale, zp = arr(d.input[1]), arr(d.input[2])
        _rename(g.node, "output", d.input[0], out.name)
        _rename(g.node, "input", d.input[0], out.name)
        drop.append(d)
        out.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(zp.dtype)
        quant[out.name] = (float(np.float32(scale)), -int(zp))
    keep = [n for n in g.node if n not in drop]
    del g.node[:]
    g.node.extend(keep)
    save(m, path)  # external data again past 1.5 GB
    return quant
