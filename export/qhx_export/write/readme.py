"""The README.md at an HTP bundle's top: how it was made, every file in it, how to run it on
this machine's HTP simulator and on a phone, and what the cost model and --verify said."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from qhx_export import __version__

# What a phone of each HTP arch is (the Stub/Skel pair and the bundle's dsp_arch must match it).
PHONES = {
    "v73": "SM8550, Snapdragon 8 Gen 2",
    "v75": "SM8650, Snapdragon 8 Gen 3",
    "v79": "SM8750, Snapdragon 8 Elite",
    "v81": "SM8850, Snapdragon 8 Elite Gen 5",
}
DEVICE_DIR = "/data/local/tmp/qhx"
PROMPTS = ("The capital of France is", "Hello", "a")
N_TOKENS = 32


def example_prompt(bundle_dir: str, ctx: int) -> tuple[str, int]:
    """The README's prompt and token count, sized so the lines run on this bundle as written: the
    first prompt of PROMPTS that leaves room in `ctx` (counted with the bundle's tokenizer, one
    more for a BOS), and at most N_TOKENS of what is left."""
    path = os.path.join(bundle_dir, "tokenizer.json")
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
    except Exception:  # tokenizers raises its own Exception types; no count: the usual line
        return PROMPTS[0], N_TOKENS
    for p in PROMPTS:
        room = ctx - len(tok.encode(p, add_special_tokens=True).ids) - 1
        if room >= 1:
            return p, min(N_TOKENS, room)
    return PROMPTS[-1], 1


def checkout() -> str | None:
    """The qhx checkout this exporter runs from (it has scripts/qnn-libs.sh), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.normpath(os.path.join(here, "..", "..", ".."))
    return top if os.path.isfile(os.path.join(top, "scripts", "qnn-libs.sh")) else None


def bundle_files(root: str) -> dict[str, int]:
    """Every file under `root` (relative path -> bytes), sorted; the exporter's own marker aside."""
    out = {}
    for top, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(top, f), root)
            if rel != ".qhx-export.json":
                out[rel] = os.path.getsize(os.path.join(top, f))
    return out


def run_section(
    root: str, final: str, manifests: list[str], arches: list[str], qairt: str, ctx: int, shared: bool = False
) -> list[str]:
    """`qhx_generate` lines for the simulator and for a phone. `root` is where the bundle is being
    written, `final` its path once written, `manifests` its descriptions relative to it (one per
    arch directory with --arch all), `ctx` its context length."""
    per_arch = len(arches) > 1
    first = manifests[0]
    top = checkout()
    sim_desc = os.path.join(final, first)
    text, n = example_prompt(os.path.join(root, os.path.dirname(first)), ctx)
    prompt = shlex.quote(text)
    lines = [
        "## Run it",
        "",
        "On this machine, on the x86_64 HTP *simulator* (QAIRT's backend from the onnxruntime-qnn "
        "wheel; it runs the graphs on the CPU, so its speed says nothing about a phone's)"
        + (", from the qhx checkout:" if top else ", from a qhx checkout:"),
        "",
        "```bash",
        f"cd {top}" if top else "cd <your qhx checkout>",
        "cargo build --release   # once: target/release/qhx_generate",
        "L=$(scripts/qnn-libs.sh)",
        f'target/release/qhx_generate {sim_desc} "$L/libQnnHtp.so" "$L/libQnnSystem.so" '
        f"{os.path.dirname(sim_desc)} {n} {prompt}",
        "```",
        "",
    ]
    if shared:
        lines += [
            "This bundle's graphs share their weights in one context binary: the x86_64 simulator "
            "cannot load such a binary (qhx_generate says so and stops); export again with "
            "`--no-weight-sharing` to run it here. A phone loads it.",
            "",
        ]
    if per_arch:
        lines += [
            f"Any arch directory runs on the simulator (`{os.path.dirname(first)}/` above). On a phone, "
            "give the bundle's root in the manifest's place: qhx_generate asks the backend for the "
            "device's HTP arch and takes that directory.",
            "",
        ]
    arch = arches[0]
    nn = "<NN>" if per_arch else arch[1:]
    dev = f"{DEVICE_DIR}/bundle"
    desc = dev if per_arch else f"{dev}/{first}"
    lines += [
        f"On a phone ({'the Stub/Skel pair of its arch, below' if per_arch else PHONES[arch]}): "
        f'qhx_generate built for Android (main README, "Build") and, from QAIRT {qairt} (the SDK '
        "that compiled this bundle), `libQnnHtp.so`, `libQnnSystem.so` and "
        f"`libQnnHtpV{nn}Stub.so` from `lib/aarch64-android/`, `libQnnHtpV{nn}Skel.so` from "
        f"`lib/hexagon-v{nn}/unsigned/`, all in one directory:",
        "",
        "```bash",
        f"adb shell mkdir -p {DEVICE_DIR}",
        f"adb push {final} {dev}",
        f"adb push qhx_generate libQnnHtp.so libQnnSystem.so libQnnHtpV{nn}Stub.so "
        f"libQnnHtpV{nn}Skel.so {DEVICE_DIR}/",
        f'adb shell "cd {DEVICE_DIR} && export LD_LIBRARY_PATH=.:/vendor/lib64 '
        f"ADSP_LIBRARY_PATH='{DEVICE_DIR};/vendor/dsp/cdsp' && "
        f'./qhx_generate {desc} libQnnHtp.so libQnnSystem.so {dev} {n} {prompt}"',
        "```",
        "",
    ]
    if per_arch:
        lines += [
            "| directory | phone | Stub / Skel |",
            "|---|---|---|",
            *[_arch_row(a) for a in arches],
            "",
        ]
    lines += ["These phone steps are written from QAIRT's documented layout, not run on hardware here.", ""]
    return lines


def _arch_row(a: str) -> str:
    return f"| `{a}/` | {PHONES[a]} | `libQnnHtpV{a[1:]}Stub.so` / `libQnnHtpV{a[1:]}Skel.so` |"


def estimate_section(est: dict[str, Any]) -> list[str]:
    from qhx_export.compile.estimate import graph_line

    lines = ["## Estimates (Qualcomm's cost model, soc 72; not a phone measurement)", ""]
    if est.get("summary"):
        lines += [est["summary"], ""]
    lines += [f"- {graph_line(role, row)}" for role, row in est.get("graphs", {}).items()]
    for k, v in est.get("verify_vs_decode", {}).items():
        lines.append(f"- a {k}-row verify costs {v['cost_in_decode_steps']} decode steps")
    return [*lines, ""]


def bundle_readme(root: str, final: str, report: dict[str, Any], title: str) -> str:
    """The README's text. `root` is where the bundle is being written, `final` its path after."""
    src = report.get("source", {})
    opt = report.get("options", {})
    lines = [
        f"# {title}: qhx HTP bundle ({opt.get('precision')})",
        "",
        f"Written by qhx-export {__version__} from `{src.get('path')}` (sha256 `{src.get('sha256')}`).",
        "",
    ]
    if report.get("manifests"):
        qairt = report.get("versions", {}).get("qairt", "?")
        arches = opt.get("arches") or ["v79"]
        ctx, shared = int(opt.get("ctx") or 512), bool(opt.get("weight_sharing"))
        lines += run_section(root, final, report["manifests"], arches, qairt, ctx, shared)
    lines += ["## Options", "", *[f"- {k}: {v}" for k, v in opt.items()], ""]
    lines += [
        "## Files",
        "",
        "| file | bytes |",
        "|---|---|",
        *[f"| {k} | {v:,} |" for k, v in bundle_files(root).items()],
        "| README.md | (this file) |",
        "",
    ]
    db = report.get("decode_bytes")
    if db:
        lines += [
            "## Bytes per decode token",
            "",
            f"Layer weights {db['layer_weights']:,}, lm-head {db['lmhead_weights']:,}, "
            f"K/V cache read at full context {db['kv_cache_read']:,}: {db['total']:,} bytes.",
            "",
        ]
    for where, v in report.get("verify", {}).items():
        from qhx_export.verify.run import table

        lines += [
            f"## Verify ({where})",
            "",
            "qhx_generate on the x86 HTP *simulator*, teacher-forced on the float reference's greedy "
            "continuation (the simulator's speed says nothing about a phone's).",
            "",
            "```",
            table(v),
            "```",
            "",
        ]
    if report.get("estimate"):
        lines += estimate_section(report["estimate"])
    lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()), ""]
    return "\n".join(lines)


def dumps(report: dict[str, Any]) -> bytes:
    return json.dumps(report, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
