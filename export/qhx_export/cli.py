"""qhx-export: a GGUF file or HF directory -> a qhx bundle.

    qhx-export INPUT -o DIR [--target htp|emu] [--arch v73|v75|v79|v81|all] [--soc N]
               [--precision fp16|w8a16|w4a16] [--ctx C] [--ar N] [--prefill window|past|none]
               [--kv-dtype f16|u8] [--kv-layout pos_major|head_major] [--format qhx|genie|both]
               [--genie-splits N]

Exit status: 0 written; 1 bad input or option (one line on stderr naming the file, tensor or
option); 2 a documented option that is not implemented yet; 3 an internal error (a bug: rerun
with QHX_EXPORT_DEBUG=1 for the traceback); 4 --verify measured agreement below the threshold
(the bundle is kept); 130 interrupted. The bundle is written to
`DIR.partial` and renamed to DIR at the end, so a failed run leaves no half-written bundle.
DIR must be new or empty; a previous bundle of qhx-export (its .qhx-export.json lists what it
wrote) is replaced with --force only; a directory holding anything else is never touched.
Progress goes to stderr; stdout lists the written manifests, one per line, and its last line is
what to give qhx_generate in the manifest's place: the manifest, or with --arch all the bundle
root DIR (qhx_generate picks the arch directory of the device it runs on).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from qhx_export import ExportError, NotImplementedYet, __version__

ARCHES = ("v73", "v75", "v79", "v81")
WEIGHT_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# w8a16 keeps the V projection fp16 (its agreement is most sensitive to it); w4a16 does not: an
# fp16 weight in a 4-bit graph costs ~13 % of a layer's time (issue 30), and the 4-bit methods
# hold the quality without it
DEFAULT_FP16_WEIGHTS = {"w8a16": ("attn_v",), "w4a16": ()}
# --target htp: every graph of an arch in one weight-shared context binary, as phones load them
# (the x86_64 HTP simulator cannot: bundles run there are written --no-weight-sharing)
DEFAULT_WEIGHT_SHARING = True
SOC_DEFAULT = {"v73": 57, "v75": 60, "v79": 69, "v81": 87}  # SM8550, SM8650, SM8750, SM8850
EXIT_BAD_INPUT, EXIT_NOT_IMPLEMENTED, EXIT_INTERNAL, EXIT_VERIFY, EXIT_INTERRUPTED = 1, 2, 3, 4, 130


class VerifyFailed(ExportError):
    """--verify measured agreement below the precision's threshold: exit 4."""


def log(msg: str) -> None:
    print(f"qhx-export: {msg}", file=sys.stderr, flush=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 1 (2 means "not implemented yet")
        raise ExportError(f"{message} (see --help)")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="qhx-export",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("input", help="a .gguf file or a Hugging Face model directory")
    ap.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="DIR",
        help="output bundle directory: new, empty, or (with --force) a previous bundle of qhx-export; "
        "a directory holding anything else is refused untouched",
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="replace DIR when it holds a previous qhx-export bundle (only the files that bundle's "
        ".qhx-export.json lists; a bundle with other files added is still refused)",
    )
    ap.add_argument(
        "--target",
        choices=("htp", "emu"),
        default="htp",
        help="htp: real QNN context binaries; emu: the qnn-emu test format (default htp)",
    )
    ap.add_argument(
        "--arch",
        choices=(*ARCHES, "all"),
        help="Hexagon arch (default v79 for htp, v81 for emu); all: one directory per arch (DIR/v73 ... "
        "DIR/v81), and stdout's last line is DIR itself, the bundle root: qhx_generate takes it in the "
        "manifest's place and runs the directory of the device's arch",
    )
    ap.add_argument("--soc", type=int, metavar="N", help="soc_model (default 57/60/69/87 by arch)")
    ap.add_argument("--precision", choices=("fp16", "w8a16", "w4a16"), help="htp weights/activations")
    ap.add_argument(
        "--ctx", type=int, metavar="C", help="KV cache capacity (default 512, or the last --ctx-ladder size)"
    )
    ap.add_argument("--ar", type=int, default=64, metavar="N", help="prefill rows (default 64)")
    ap.add_argument(
        "--prefill",
        choices=("window", "past", "none"),
        default="window",
        help="prefill graph: AR=N window, chunked with past K/V, or none (default window)",
    )
    ap.add_argument("--kv-dtype", choices=("f16", "u8"), default="f16", help="KV cache dtype (default f16)")
    ap.add_argument(
        "--kv-layout",
        choices=("pos_major", "head_major"),
        default="pos_major",
        help="K/V cache tensors of the graphs' I/O: pos_major [rows, n_kv*head_dim] or head_major "
        "[n_kv, rows, head_dim] (default pos_major; qhx_generate reads either from the graph dims)",
    )
    ap.add_argument(
        "--verify-rows",
        type=int,
        metavar="K",
        help="also write a K-row verify graph over the decode cache (qhx_generate --spec checks "
        "K-1 drafted tokens per execute); 2..--ar-1, e.g. 8",
    )
    ap.add_argument(
        "--verify-head",
        metavar="logits|argmax",
        help="with --verify-rows K: also write the lm-head over the verify's K rows as one graph "
        "(beside the lm-head, sharing its weights), so a verify reads its logits in one execute; "
        "argmax: the graph gives each row's greedy pick (int32) and no logits cross to the host "
        "(sampled and constrained runs then use the one-row head)",
    )
    ap.add_argument(
        "--format",
        choices=("qhx", "genie", "both"),
        default="qhx",
        help="qhx manifest, Genie config, or both (default qhx); quantized Genie graphs have uint8 "
        "KV and uint16 mask/cos/sin/logits I/O whatever --kv-dtype says (Genie's layout)",
    )
    ap.add_argument(
        "--genie-splits",
        type=int,
        default=1,
        metavar="N",
        help="Genie graphs per (AR, CL) variant, over consecutive layers (the last with the head; "
        "the hidden state passes between them by name); 1..n_layers (default 1)",
    )
    ap.add_argument(
        "--layout",
        choices=("qhx", "lfm2-split-v1", "lfm2-shared-v1"),
        default="qhx",
        help="file / graph names and manifest form: qhx (default), or the LFM2 runner's bundles "
        "(lfm2-split-v1: LFM2.5-230M's three binaries; lfm2-shared-v1: LFM2.5-350M's shared prefill/"
        "decode binary); LFM2 only, fp16 graph I/O",
    )
    ap.add_argument("--name", help="file / graph name prefix (default: from the input's name)")
    ap.add_argument("--model-name", help="manifest model.name (default: from the input's name)")
    emu = ap.add_argument_group("--target emu")
    emu.add_argument(
        "--io",
        choices=("f32", "f16", "ufixed16"),
        help="graph I/O dtype (default f32; f16 with --layout lfm2-*)",
    )
    emu.add_argument("--embed-dtype", choices=("f32", "f16"), help="default f32; f16 with --layout lfm2-*")
    emu.add_argument(
        "--weights",
        choices=("q", "f32"),
        default="q",
        help="q: keep GGUF Q4_1/Q8_0 blocks and f16 (default); f32: dequantize all",
    )
    emu.add_argument("--shared", action="store_true", help="prefill and decode graphs in one binary")
    ap.add_argument(
        "--calib",
        metavar="FILE",
        help="htp: calibration text (sequences separated by blank lines; default: the built-in corpus); "
        "emu: value ranges JSON for --io ufixed16",
    )
    htp = ap.add_argument_group("--target htp")
    htp.add_argument(
        "--calib-steps",
        type=int,
        default=512,
        metavar="N",
        help="w8a16 / w4a16: decode (and verify, lm-head) executes calibrated on, spread over the "
        "sequences (512); fewer export faster with ranges from fewer tokens",
    )
    htp.add_argument("--keep-onnx", action="store_true", help="keep the ONNX graphs in DIR/onnx/")
    htp.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the stage cache: finished stages (float graphs, calibration, QDQ graphs, context "
        "binaries, estimates) kept by input hash + options + exporter code, so a rerun after a "
        "failure resumes and another --arch reuses the graphs (default $QHX_EXPORT_CACHE or "
        "~/.cache/qhx-export; QHX_EXPORT_CACHE=off: none; least recently used entries go past "
        "$QHX_EXPORT_CACHE_MAX_GB, 20)",
    )
    htp.add_argument("--no-cache", action="store_true", help="no stage cache: every stage runs")
    htp.add_argument(
        "--verify",
        action="store_true",
        help="run the bundle with qhx_generate on the HTP simulator against the float reference "
        "(teacher-forced top-1 agreement; exit 4 below fp16 98%%, w8a16 95%%, w4a16 85%%)",
    )
    htp.add_argument(
        "--estimate",
        action="store_true",
        help="Qualcomm's cost model (Hextimate, soc_model 72, v81-class) per graph: decode ms/token and "
        "prefill tok/s estimates (not phone measurements)",
    )
    htp.add_argument(
        "--fp16-weights",
        metavar="KINDS",
        type=_weight_kinds,
        help="w8a16 / w4a16: weight kinds kept fp16, comma-separated from "
        f"{','.join(WEIGHT_KINDS)}, or none (default: w8a16 attn_v, the V projection, ~3%% of a "
        "layer's weights and the one SmolLM2's agreement is most sensitive to; w4a16 none, since an "
        "fp16 weight in a 4-bit graph costs ~13%% of the layer's time)",
    )
    htp.add_argument(
        "--estimate-verify",
        metavar="K,K,...",
        type=_row_list,
        default=[],
        help="with --estimate: also estimate verify graphs of these row counts (not written), "
        "each as a cost in decode steps, e.g. 2,4,8,16",
    )
    htp.add_argument(
        "--ctx-ladder",
        metavar="C1,C2,...",
        type=_row_list,
        default=[],
        help="context ladder: a decode (and verify, and a --prefill past) graph per cache size, "
        "ascending, the last = --ctx; qhx_generate starts on the smallest that holds the prompt "
        "and moves the cache up as the dialog grows (weights stored once with weight sharing)",
    )
    htp.add_argument(
        "--weight-sharing",
        action=argparse.BooleanOptionalAction,
        help="all graphs of an arch in one context binary, weights stored once (default); "
        "--no-weight-sharing: one binary per graph, each with its weights (the form the x86_64 "
        "HTP simulator, and so --verify, can load)",
    )
    htp.add_argument(
        "--estimate-only",
        action="store_true",
        help="--estimate without a bundle: DIR gets export-report.json (and README.md) only",
    )
    htp.add_argument(
        "--quant-method",
        choices=("rtn", "seqmse", "gptq", "seqmse+gptq"),
        help="w4a16: how the 4-bit weights are chosen on the LPBQ grid: rtn (nearest), seqmse (scales "
        "searched for the least output error on calibration activations, layer after layer), gptq "
        "(rounding errors compensated through the calibration Hessian), seqmse+gptq (GPTQ's rounding "
        "on SeqMSE's scales); default seqmse+gptq (README: 4-bit weights)",
    )
    htp.add_argument(
        "--method-tokens",
        type=int,
        metavar="N",
        help="w4a16: calibrate seqmse / gptq on the first N tokens of their sequences (default: all, "
        "~12k with the built-in corpus); fewer export faster and keep less quality",
    )
    htp.add_argument(
        "--rotate",
        choices=("none", "hadamard", "auto"),
        help="w8a16 / w4a16: rotate the residual stream by a randomized Hadamard matrix folded into the "
        "weights (no op added; not for Gemma 3 or LFM2); auto: hadamard where the family folds it "
        "(the w4a16 default), none otherwise (the w8a16 default)",
    )
    htp.add_argument(
        "--head-precision",
        choices=("int8", "int4"),
        help="w4a16: lm-head weights int8 per channel (default) or int4 LPBQ",
    )
    htp.add_argument("--verify-tokens", type=int, default=16, metavar="N", help="steps per prompt (16)")
    htp.add_argument(
        "--verify-ppl-tokens",
        type=int,
        default=32,
        metavar="N",
        help="--verify: perplexity and KL divergence over the first N tokens of the shipped held-out "
        "text, through the ORT loop on the simulator (32; 0: none)",
    )
    htp.add_argument(
        "--no-ort-check",
        action="store_true",
        help="--verify: skip the ORT loop over the same binaries (whose ids must equal qhx_generate's)",
    )
    ap.add_argument("--version", action="version", version=f"qhx-export {__version__}")
    return ap


def _weight_kinds(text: str) -> tuple[str, ...]:
    if text == "none":
        return ()
    kinds = tuple(k for k in text.split(",") if k)
    bad = [k for k in kinds if k not in WEIGHT_KINDS]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: expected none or kinds from {', '.join(WEIGHT_KINDS)}")
    return kinds


def _row_list(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected row counts such as 2,4,8,16") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one row count")
    return out


def _name(default: str) -> str:
    """A file-name-safe prefix from the input's name."""
    out = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in default)
    return out.lstrip(".-") or "model"


def _progress() -> Callable[[str, int], Callable[[], None]]:
    from tqdm import tqdm

    bars: list[Any] = []

    def start(stage: str, total: int) -> Callable[[], None]:
        for b in bars:
            b.close()
        bar = tqdm(total=total, desc=stage, file=sys.stderr, unit="t", leave=False, disable=None)
        bars[:] = [bar]

        def tick() -> None:
            bar.update(1)
            if bar.n >= total:
                bar.close()

        return tick

    return start


def _check_args(a: argparse.Namespace) -> None:
    if a.ctx < 1:
        raise ExportError(f"--ctx {a.ctx}: must be positive")
    if a.ar < 1:
        raise ExportError(f"--ar {a.ar}: must be positive")
    if a.ar > a.ctx and a.prefill != "none":
        raise ExportError(f"--ar {a.ar} exceeds --ctx {a.ctx}")
    if a.soc is not None and a.soc <= 0:
        raise ExportError(f"--soc {a.soc}: must be a positive soc_model number")
    if a.method_tokens is not None and a.method_tokens < 1:
        raise ExportError(f"--method-tokens {a.method_tokens}: must be positive")
    if a.calib_steps < 1:
        raise ExportError(f"--calib-steps {a.calib_steps}: must be positive")
    if a.verify_ppl_tokens < 0:
        raise ExportError(f"--verify-ppl-tokens {a.verify_ppl_tokens}: must be 0 or more")
    if a.soc is not None and a.arch == "all":
        raise ExportError("--soc with --arch all: give one --arch per --soc")
    for k in ([a.verify_rows] if a.verify_rows is not None else []) + a.estimate_verify:
        opt = "--verify-rows" if k == a.verify_rows else "--estimate-verify"
        if not 2 <= k <= a.ctx:
            raise ExportError(f"{opt} {k}: must be 2 or more and at most --ctx {a.ctx}")
    if a.verify_head is not None:
        if a.verify_head.startswith("topk:"):
            raise NotImplementedYet(
                f"--verify-head {a.verify_head}: an in-graph top-k head is not written yet (logits or argmax)"
            )
        if a.verify_head not in ("logits", "argmax"):
            raise ExportError(f"--verify-head {a.verify_head!r}: expected logits or argmax")
        if a.verify_rows is None:
            raise ExportError("--verify-head needs --verify-rows K (the rows it reads)")
        if a.target == "htp":
            raise NotImplementedYet(
                "--verify-head --target htp: the K-row head is written for --target emu only so far"
            )
    if a.verify_rows is not None and a.prefill != "none" and a.verify_rows >= a.ar:
        raise ExportError(f"--verify-rows {a.verify_rows}: must be fewer than the prefill's --ar {a.ar}")
    if a.estimate_verify and not (a.estimate or a.estimate_only):
        raise ExportError("--estimate-verify needs --estimate (or --estimate-only)")
    if a.estimate_only and a.verify:
        raise ExportError("--estimate-only writes no bundle for --verify to run")
    if a.ctx_ladder:
        ladder = a.ctx_ladder
        if ladder != sorted(set(ladder)):
            raise ExportError(
                f"--ctx-ladder {','.join(map(str, ladder))}: sizes must be distinct and ascending"
            )
        if ladder[-1] != a.ctx:
            raise ExportError(
                f"--ctx-ladder ends at {ladder[-1]} but --ctx is {a.ctx}: the last rung is the context"
            )
        if len(ladder) < 2:
            raise ExportError("--ctx-ladder needs two sizes or more (one is --ctx alone)")
        low = max(a.ar if a.prefill != "none" else 1, a.verify_rows or 1)
        if ladder[0] < low:
            raise ExportError(
                f"--ctx-ladder {ladder[0]}: a rung must hold the prefill's --ar / --verify-rows ({low})"
            )
    if a.genie_splits != 1 and a.format == "qhx":
        raise ExportError(f"--genie-splits {a.genie_splits} needs --format genie or both")
    if a.genie_splits < 1:
        raise ExportError(f"--genie-splits {a.genie_splits}: must be positive")
    from qhx_export.write.files import check_out

    check_out(os.path.normpath(a.out), a.force)  # refused before any work, checked again at the end


def run(argv: Sequence[str] | None) -> list[str]:
    """Parse, export; returns the written manifest paths. Raises ExportError."""
    a = parser().parse_args(argv)
    if a.ctx is None:
        a.ctx = a.ctx_ladder[-1] if a.ctx_ladder else 512
    _check_args(a)
    t0 = time.monotonic()
    from qhx_export.read import open_checkpoint

    log(f"reading {a.input}")
    ck = open_checkpoint(a.input)
    c = ck.config
    log(
        f"{os.path.basename(a.input.rstrip('/'))}: {c.family} hidden={c.hidden} layers={c.n_layers} "
        f"heads={c.n_heads}/{c.n_kv_heads} head_dim={c.head_dim} ffn={c.ffn} vocab={c.vocab}"
        f"{' tied' if c.tied else ''}"
    )
    if a.target == "htp":
        return _export_htp(a, ck, t0)
    return _export_emu(a, ck, t0)


def _export_htp(a: argparse.Namespace, ck: Any, t0: float) -> list[str]:
    from qhx_export.write.files import staged_dir
    from qhx_export.write.htp import write_bundle, write_report
    from qhx_export.write.options import DEFAULT_QUANT_METHOD, DEFAULT_ROTATE, HtpOptions

    for opt, val in (
        ("--io", a.io is not None),
        ("--weights", a.weights != "q"),
        ("--shared", a.shared),
        ("--embed-dtype", a.embed_dtype is not None),
    ):
        if val:
            raise ExportError(f"{opt} is an option of --target emu")
    if a.no_cache and a.cache_dir:
        raise ExportError("--no-cache with --cache-dir: give one")
    from qhx_export.cache import default_root, max_bytes

    max_bytes()  # a bad QHX_EXPORT_CACHE_MAX_GB is an error before any work
    if a.format == "genie" and a.kv_layout != "pos_major":
        raise ExportError("--kv-layout is for qhx graphs; --format genie writes Genie's own cache layout")
    _check_layout(a, ck, io_f16=(a.precision or "fp16") == "fp16")
    if a.genie_splits > ck.config.n_layers:
        raise ExportError(f"--genie-splits {a.genie_splits}: the model has {ck.config.n_layers} layers")
    if not ck.family.htp_graphs:
        raise NotImplementedYet(
            f"{a.input}: --target htp has no {ck.family.name} graphs yet; use --target emu"
        )
    precision = a.precision or "fp16"
    sharing = DEFAULT_WEIGHT_SHARING if a.weight_sharing is None else a.weight_sharing
    if a.verify and sharing:
        raise ExportError(
            "--verify runs the bundle on this machine's HTP simulator, which cannot load weight-shared "
            "binaries: add --no-weight-sharing (the graphs are the same, one binary each)"
        )
    if a.ctx_ladder and a.format != "qhx":
        raise NotImplementedYet(
            "--ctx-ladder with --format genie: Genie context-length variants are not written yet"
        )
    if a.ctx_ladder and "conv" in ck.config.types:
        raise NotImplementedYet(f"--ctx-ladder: {ck.family.name}'s conv state cannot move between rungs yet")
    if a.ctx_ladder and a.layout != "qhx":
        raise ExportError(f"--ctx-ladder with --layout {a.layout}: that runner's contract has one context")
    for opt, val, need in (
        ("--quant-method", a.quant_method, ("w4a16",)),
        ("--method-tokens", a.method_tokens, ("w4a16",)),
        ("--head-precision", a.head_precision, ("w4a16",)),
        ("--rotate", a.rotate, ("w8a16", "w4a16")),
    ):
        if val is not None and precision not in need:
            raise ExportError(f"{opt} is for --precision {' / '.join(need)}")
    name = a.name or _name(ck.default_name())
    o = HtpOptions(
        name=name,
        arches=list(ARCHES) if a.arch == "all" else [a.arch or "v79"],
        per_arch_dirs=a.arch == "all",
        soc=a.soc,
        precision=a.precision or "fp16",
        ctx=a.ctx,
        ar=a.ar,
        prefill=a.prefill,
        kv_dtype=a.kv_dtype,
        kv_layout=a.kv_layout,
        calib=a.calib,
        calib_steps=a.calib_steps,
        cache_dir=None if a.no_cache else _abs(a.cache_dir or default_root()),
        keep_onnx=a.keep_onnx,
        estimate=a.estimate or a.estimate_only,
        estimate_only=a.estimate_only,
        verify_rows=a.verify_rows,
        estimate_verify=a.estimate_verify,
        fp16_weights=DEFAULT_FP16_WEIGHTS.get(precision, ()) if a.fp16_weights is None else a.fp16_weights,
        quant_method=a.quant_method or DEFAULT_QUANT_METHOD,
        method_tokens=a.method_tokens,
        rotate=a.rotate or DEFAULT_ROTATE.get(precision, "none"),
        head_precision=a.head_precision or "int8",
        fmt=a.format,
        genie_splits=a.genie_splits,
        model_name=a.model_name,
        layout=a.layout,
        ctx_ladder=tuple(a.ctx_ladder[:-1]),
        weight_sharing=sharing,
    )
    from qhx_export.compile.htp import stdout_to_stderr

    failed = []
    with stdout_to_stderr(), staged_dir(a.out, a.force) as tmp:
        paths = write_bundle(ck, tmp, o, log, _progress())
        if a.verify:
            from qhx_export.verify.run import table, verify

            o.report["verify"] = {}
            for p in paths:
                where = os.path.relpath(p, tmp)
                log(f"verify {where}: qhx_generate on the HTP simulator, {a.verify_tokens} steps x 2 prompts")
                t1 = time.monotonic()
                res = verify(
                    ck,
                    p,
                    o.precision,
                    a.verify_tokens,
                    with_ort=not a.no_ort_check,
                    real=o.report.get("real", {}).get(where),
                    ppl_tokens=a.verify_ppl_tokens,
                )
                res["seconds"] = round(time.monotonic() - t1, 1)
                o.report["verify"][where] = res
                for line in table(res).splitlines():
                    log(line)
                if not res["pass"]:
                    failed.append(where)
        write_report(tmp, paths, o, os.path.abspath(a.out))
        rel = [os.path.relpath(p, tmp) for p in paths] or ["export-report.json"]
    log(f"done in {time.monotonic() - t0:.1f}s")
    out = _with_root(a, [os.path.join(os.path.normpath(a.out), m) for m in rel])
    if failed:
        for m in out:
            print(m)
        raise VerifyFailed(f"--verify: {', '.join(failed)} below the {o.precision} threshold (bundle kept)")
    return out


def _export_emu(a: argparse.Namespace, ck: Any, t0: float) -> list[str]:
    from qhx_export.write.emu import EmuOptions, write_bundle
    from qhx_export.write.files import staged_dir

    if a.precision is not None:
        raise ExportError(
            "--precision is for --target htp; an emulator bundle's dtypes are --io and --weights"
        )
    for opt, val in (
        ("--estimate", a.estimate),
        ("--estimate-only", a.estimate_only),
        ("--estimate-verify", bool(a.estimate_verify)),
        ("--verify", a.verify),
        ("--keep-onnx", a.keep_onnx),
        ("--fp16-weights", a.fp16_weights is not None),
        ("--cache-dir", a.cache_dir is not None),
        ("--no-cache", a.no_cache),
        ("--ctx-ladder", bool(a.ctx_ladder)),
        ("--weight-sharing", a.weight_sharing is not None),
    ):
        if val:
            raise ExportError(f"{opt} is an option of --target htp")
    if a.kv_dtype != "f16":
        raise NotImplementedYet(f"--kv-dtype {a.kv_dtype} is not implemented for --target emu")
    if a.format != "qhx":
        raise NotImplementedYet(f"--format {a.format} is not implemented for --target emu (qhx only)")
    if a.layout != "qhx":  # the contract's I/O and embedding are fp16
        a.io, a.embed_dtype = a.io or "f16", a.embed_dtype or "f16"
    a.io, a.embed_dtype = a.io or "f32", a.embed_dtype or "f32"
    _check_layout(a, ck, io_f16=a.io == "f16" and a.embed_dtype == "f16")
    arches = list(ARCHES) if a.arch == "all" else [a.arch or "v81"]
    name = a.name or _name(ck.default_name())
    manifests = []
    with staged_dir(a.out, a.force) as tmp:
        for arch in arches:
            out = os.path.join(tmp, arch) if a.arch == "all" else tmp
            os.makedirs(out, exist_ok=True)
            o = EmuOptions(
                name=name,
                prefill_len=a.ar,
                ctx=a.ctx,
                io=a.io,
                prefill=a.prefill,
                kv_layout=a.kv_layout,
                shared=a.shared,
                verify_rows=a.verify_rows,
                verify_head=a.verify_head,
                calib=a.calib,
                embed_dtype=a.embed_dtype,
                weights=a.weights,
                model_name=a.model_name,
                layout=a.layout,
                dsp_arch=arch,
                soc_model=a.soc if a.soc is not None else SOC_DEFAULT[arch],
                writer=f"qhx-export {__version__}",
            )
            path, _ = write_bundle(ck, out, o, log, _progress())
            manifests.append(os.path.relpath(path, tmp))
    log(f"done in {time.monotonic() - t0:.1f}s")
    return _with_root(a, [os.path.join(os.path.normpath(a.out), m) for m in manifests])


def _with_root(a: argparse.Namespace, paths: list[str]) -> list[str]:
    """--arch all: the bundle root last, as qhx_generate takes it (it picks the device's arch)."""
    if a.arch != "all" or not paths or paths[-1].endswith("export-report.json"):
        return paths
    root = os.path.normpath(a.out)
    log(f"bundle root {root}: one directory per arch; qhx_generate takes the root and runs the device's")
    return [*paths, root]


def _abs(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def _check_layout(a: argparse.Namespace, ck: Any, io_f16: bool) -> None:
    from qhx_export.write import lfm2_layout

    lay = lfm2_layout.get(a.layout)
    if lay is None:
        return
    lfm2_layout.check(
        lay,
        ck.family.name,
        prefill=a.prefill,
        verify_rows=a.verify_rows,
        io_f16=io_f16,
        name=a.name,
        model_name=a.model_name,
        extra={
            "--shared": a.shared,
            "--kv-layout head_major": a.kv_layout != "pos_major",
            "--format genie": a.format != "qhx",
            "--kv-dtype u8": a.kv_dtype != "f16",
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        for path in run(argv):
            print(path)
        return 0
    except VerifyFailed as e:
        log(f"error: {e}")
        return EXIT_VERIFY
    except NotImplementedYet as e:
        log(f"not implemented: {e}")
        return EXIT_NOT_IMPLEMENTED
    except ExportError as e:
        log(f"error: {e}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        log("interrupted; nothing was written")
        return EXIT_INTERRUPTED
    except OSError as e:  # full disk, permissions, a file vanishing under us
        where = e.filename or "output"
        log(f"error: {where}: {e.strerror or e}")
        return EXIT_BAD_INPUT
    except MemoryError:
        log("error: out of memory")
        return EXIT_BAD_INPUT
    except Exception as e:
        if os.environ.get("QHX_EXPORT_DEBUG"):
            raise
        log(f"internal error: {type(e).__name__}: {e} (rerun with QHX_EXPORT_DEBUG=1 for a traceback)")
        return EXIT_INTERNAL
