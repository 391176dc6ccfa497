"""ONNX graph -> QNN HTP context binary, through onnxruntime-qnn's EPContext cache.

The PyPI onnxruntime-qnn wheel (QAIRT 2.51) compiles for every phone arch: `htp_arch` 73/75/79/81
with `soc_model` 57/60/69/87 (SM8550 / SM8650 / SM8750 / SM8850). Each compile writes
`<stem>.onnx` (the EPContext wrapper ORT can run to drive the same binary) and `<stem>_qnn.bin`
(the context binary qhx_generate loads). CPU fallback is disabled, so an op the HTP cannot take is
a compile error, never a silent CPU node.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from qhx_export import ExportError

ARCHES = ("v73", "v75", "v79", "v81")
SOC_DEFAULT = {"v73": 57, "v75": 60, "v79": 69, "v81": 87}  # SM8550, SM8650, SM8750, SM8850
ESTIMATE_SOC = 72  # SA8797 (v81-class): the only soc Hextimate estimates for in this wheel

_registered: list[bool] = []


def register() -> None:
    import onnxruntime as ort

    try:
        import onnxruntime_qnn
    except ImportError as e:
        raise ExportError(
            "--target htp needs the onnxruntime-qnn wheel (scripts/qhx-export.sh installs it)"
        ) from e
    if not _registered:
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
        _registered.append(True)


def qnn_devices() -> list[Any]:
    import onnxruntime as ort

    register()
    return [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]


def qnn_options(arch: str, soc: int, mode: str) -> dict[str, str]:
    """Provider options. mode: fp16 (float graph, fp16 inside), quant (pure QDQ graph), mixed
    (QDQ graph whose float nodes run in fp16)."""
    o = {"backend_type": "htp", "soc_model": str(soc), "htp_arch": arch.removeprefix("v")}
    if mode in ("fp16", "mixed"):
        o["enable_htp_fp16_precision"] = "1"
    return o


def qnn_version() -> str:
    try:
        from onnxruntime_qnn import build_and_package_info as info

        return str(getattr(info, "qnn_version", "?"))
    except ImportError:
        return "?"


def _compile_session(
    src: str, stem: str, wrapper: str, options: dict[str, str], share: str | None = None
) -> None:
    """One ORT session that compiles `src` into the EPContext wrapper `wrapper` (and its
    binary). `share`: "on" / "last" for a session of a weight-shared compile (the last one
    writes the binary). Errors name the graph by `stem`."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    # ORT would fuse MatMul+Add into Gemm, which HTP validation can reject (error 3110)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "0")
    so.add_session_config_entry("ep.context_file_path", wrapper)
    if share is not None:
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        if share == "last":
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    so.add_provider_for_devices(qnn_devices(), dict(options))
    try:
        ort.InferenceSession(src, so)
    except Exception as e:  # ORT raises its own exception types
        msg = str(e).strip().splitlines()
        where = f"graph {stem} (htp_arch {options.get('htp_arch')}, soc_model {options.get('soc_model')})"
        how = " (weight-shared)" if share else ""
        raise ExportError(f"{where}: QNN compile{how} failed: {msg[-1] if msg else e}") from e


def compile_graph(
    src: str, out_dir: str, stem: str, options: dict[str, str], profile: str | None = None
) -> tuple[str, str, float]:
    """Compile `src` into `out_dir/<stem>.onnx` + `<stem>_qnn.bin`; returns (wrapper, bin, seconds).
    `profile`: a CSV path for QNN 'detailed' profiling (Hextimate rows when soc_model is 72).
    Errors name the graph by `stem` (`src` may be a stage-cache file)."""
    wrapper = os.path.join(out_dir, f"{stem}.onnx")
    binf = os.path.join(out_dir, f"{stem}_qnn.bin")
    for f in (wrapper, binf):
        if os.path.exists(f):
            os.unlink(f)
    opts = dict(options)
    if profile:
        opts.update({"profiling_level": "detailed", "profiling_file_path": profile})
    t0 = time.monotonic()
    _compile_session(src, stem, wrapper, opts)
    if not os.path.isfile(binf):
        raise ExportError(f"graph {stem}: ORT wrote no {binf}")
    return os.path.basename(wrapper), os.path.basename(binf), time.monotonic() - t0


def compile_shared(
    graphs: list[tuple[str, str, dict[str, str]]], out_dir: str, binf: str
) -> tuple[list[str], float]:
    """Compile every (src, stem, options) into ONE context binary `out_dir/binf` whose graphs
    store each weight once (ORT's EPContext sharing: one QNN context across the sessions,
    weights matched by initializer name and content, the binary written by the last). Returns
    the wrappers (`<stem>.onnx`, in order, each pointing at `binf`) and the seconds taken."""
    paths = [os.path.join(out_dir, f"{stem}.onnx") for _, stem, _ in graphs]
    first_bin = os.path.join(out_dir, f"{graphs[0][1]}_qnn.bin")
    for f in [*paths, first_bin, os.path.join(out_dir, binf)]:
        if os.path.exists(f):
            os.unlink(f)
    t0 = time.monotonic()
    for i, ((src, stem, options), wrapper) in enumerate(zip(graphs, paths, strict=True)):
        _compile_session(src, stem, wrapper, options, "last" if i == len(graphs) - 1 else "on")
    if not os.path.isfile(first_bin):
        raise ExportError(f"graphs {', '.join(g[1] for g in graphs)}: ORT wrote no shared {first_bin}")
    os.replace(first_bin, os.path.join(out_dir, binf))
    for w in paths:
        point_wrapper(w, binf)
    return [os.path.basename(p) for p in paths], time.monotonic() - t0


def point_wrapper(path: str, binf: str) -> None:
    """Point the EPContext wrapper at `path` to the context binary `binf` (beside it)."""
    import onnx

    m = onnx.load(path)
    for node in m.graph.node:
        for a in node.attribute:
            if node.op_type == "EPContext" and a.name == "ep_cache_context":
                a.s = binf.encode("utf-8")
    onnx.save(m, path)


def wrapper_graph(path: str) -> str:
    """The QNN graph name the EPContext wrapper at `path` runs (its node's name)."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    for node in m.graph.node:
        if node.op_type == "EPContext":
            return str(node.name)
    raise ExportError(f"{path}: no EPContext node")


def rename_binary(out_dir: str, wrapper: str, binf: str, new: str) -> str:
    """Rename a compiled context binary to `new` and point its EPContext wrapper at it."""
    os.replace(os.path.join(out_dir, binf), os.path.join(out_dir, new))
    point_wrapper(os.path.join(out_dir, wrapper), new)
    return new


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """The QNN libraries print on stdout through C stdio (e.g. libnative's banner, flushed at
    exit): while they run, fd 1 goes to stderr, and C's buffers are flushed before it comes back,
    so stdout stays ours (its last line is the manifest path)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
