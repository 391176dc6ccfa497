"""The options of an HTP export, shared by the qhx-HTP writer (write/htp.py) and the Genie
writer (write/genie.py), which the pipeline in write/htp.py drives; kept apart so that neither
writer imports the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Log = Callable[[str], None]  # a progress line to stderr
Progress = Callable[[str, int], Callable[[], None]]  # a stage of n steps; the callable ticks one

MIXED_PEAK = 1024.0  # a residual stream wider than this keeps its adds and norms in fp16
DEFAULT_QUANT_METHOD = "seqmse+gptq"  # w4a16's weight choice (quant/methods.py); see the README table
DEFAULT_ROTATE = {"w4a16": "auto"}  # by precision, else none (quant/rotate.py)


@dataclass
class HtpOptions:
    name: str
    arches: list[str]
    per_arch_dirs: bool = False
    soc: int | None = None
    precision: str = "fp16"
    ctx: int = 512
    ar: int = 64
    prefill: str = "window"
    kv_dtype: str = "f16"
    kv_layout: str = "pos_major"  # K/V graph I/O: pos_major [rows, K] | head_major [n_kv, rows, Dh]
    calib: str | None = None
    calib_steps: int = 512  # decode / verify / lm-head calibration executes, spread over the sequences
    cache_dir: str | None = None  # the stage cache (qhx_export.cache); None: no cache
    keep_onnx: bool = False
    estimate: bool = False
    verify_rows: int | None = None  # also a K-row verify graph over the decode cache (--spec)
    estimate_verify: list[int] = field(default_factory=list)  # verify row counts only estimated
    estimate_only: bool = False  # the cost model's report, no bundle
    fp16_weights: tuple[str, ...] = ()  # quantized precisions: weight kinds kept fp16
    quant_method: str = DEFAULT_QUANT_METHOD  # w4a16: rtn | seqmse | gptq (quant/methods.py)
    method_tokens: int | None = None  # w4a16: the methods' calibration tokens capped at this
    rotate: str = "none"  # none | hadamard | auto: the residual stream rotated (quant/rotate.py)
    head_precision: str = "int8"  # w4a16's lm-head weights: int8 per channel | int4 LPBQ
    fmt: str = "qhx"  # qhx | genie | both
    genie_splits: int = 1  # Genie graphs per (AR, CL) variant
    model_name: str | None = None
    layout: str = "qhx"  # qhx, or an LFM2 runner form (qhx_export.write.lfm2_layout)
    ctx_ladder: tuple[int, ...] = ()  # the smaller rungs of a context ladder (ascending; ctx is the last)
    weight_sharing: bool = True  # every graph of an arch in one context binary, weights stored once
    report: dict[str, Any] = field(default_factory=dict)  # filled while writing
