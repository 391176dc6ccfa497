"""Real HTP bundles (`--target htp`), the pipeline: the graphs (write/htp_graphs.py), calibrated
and quantized (write/calibrate.py), compiled into QNN context binaries (qhx_export.compile.htp),
one binary per graph, plus the f16 embedding, the tokenizer and the manifest qhx_generate reads;
the Genie form (write/genie.py) from the same graphs; the report.

Bundle files (per arch directory with `--arch all`):
  <name>_<role>_qnn.bin   the context binary (role: prefill, decode, lmhead)
  <name>_<role>.onnx      ORT's EPContext wrapper of it (qhx_export.verify runs the same binary)
  <name>_embed_f16.bin, tokenizer.json, <name>.json (the manifest)
`source.real` in the manifest records how every graph was made: QNN provider options, precision
and the scale/offset of fixed-point graph I/O.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

import numpy as np

from qhx_export import ExportError, NotImplementedYet, __version__
from qhx_export.cache import StageCache, key_of, source_hash
from qhx_export.compile import htp as qc
from qhx_export.graphs import GraphOptions
from qhx_export.quant.lpbq import BLOCK as LPBQ_BLOCK
from qhx_export.read.base import Checkpoint
from qhx_export.write import lfm2_layout
from qhx_export.write.calibrate import calib_ids, norm_prescale, quantize_graphs, stream_scales
from qhx_export.write.emu import generated_weights, layers_section, manifest_params
from qhx_export.write.files import atomic_open
from qhx_export.write.htp_graphs import (
    Graph,
    base_role,
    build_graphs,
    extra_verify_rows,
    host_embedding,
    is_bundle_role,
    rung_bases,
)
from qhx_export.write.options import HtpOptions, Log, Progress


def soc_for(o: HtpOptions, arch: str) -> int:
    return o.soc if o.soc is not None else qc.SOC_DEFAULT[arch]


def manifest(
    ck: Checkpoint,
    o: HtpOptions,
    arch: str,
    refs: dict[str, Any],
    real: dict[str, Any],
    files: dict[str, str],
) -> dict[str, Any]:
    from qhx_export.read.gguf import GgufCheckpoint

    c = ck.config
    params = manifest_params(ck, o.ctx)
    if isinstance(getattr(ck, "base", ck), GgufCheckpoint):  # a rotated view reads its base
        source: dict[str, Any] = {
            "gguf": os.path.basename(ck.path),
            "gguf_sha256": o.report["source"]["sha256"],
        }
    else:
        source = {"hf": os.path.basename(os.path.abspath(ck.path)), **generated_weights(ck.path)}
    source.update({"writer": f"qhx-export {__version__}", "family": ck.family.name, "real": real})
    out: dict[str, Any] = {
        "schema_version": 1,
        "model": {
            "name": o.model_name or ck.default_name(),
            "family": "llm",
            "arch": ck.family.host_arch or ck.family.name,
            "dsp_arch": arch,
            "soc_model": soc_for(o, arch),
            "n_params": ck.n_params(),
        },
        "params": params,
        "artifacts": {
            "contexts": refs,
            "embed": {"file": files["embed"], "dtype": "f16"},
            "tokenizer": files["tokenizer"],
        },
        "plan": {"op": "llama_generate", "ar": o.ar if o.prefill != "none" else 1},
        "source": source,
    }
    template = ck.chat_template()
    if template:
        out["chat"] = {"template": template}
    layers = layers_section(c, o.ctx)
    if layers:
        out["layers"] = layers
    return out


# schema 2's step I/O kinds by the graphs' tensor names (the sliding layers' cos_local /
# sin_local / cmask_local are found through the manifest's `layers` section)
STEP_INPUTS = {"x": "embedding", "cos": "rope_cos", "sin": "rope_sin", "cmask": "mask"}
STEP_OUTPUTS = {"y": "hidden"}
LAYER_IO = {"past_k": "past_key", "past_v": "past_value", "new_k": "new_key", "new_v": "new_value"}


def step_io(path: str, head: bool) -> tuple[dict[str, str], dict[str, str]]:
    """A graph's schema 2 `inputs` and `outputs` maps, read from its ONNX I/O names."""
    import onnx

    g = onnx.load(path, load_external_data=False).graph
    if head:
        return {g.input[0].name: "hidden"}, {g.output[0].name: "logits"}

    def kinds(names: list[str], table: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for n in names:
            stem, _, idx = n.rpartition("_")
            if n in table:
                out[n] = table[n]
            elif idx.isdigit() and stem in LAYER_IO:
                out[f"{stem}_{{i}}"] = LAYER_IO[stem]
        return out

    return kinds([t.name for t in g.input], STEP_INPUTS), kinds([t.name for t in g.output], STEP_OUTPUTS)


def as_schema_2(man: dict[str, Any], graphs: dict[str, Graph]) -> dict[str, Any]:
    """The schema 1 manifest `man` as schema 2: `plan.steps`, one rung of [prefill,] [verify,]
    decode per context-ladder size, smallest first, then the head; each step names its binary
    and graph (one binary holds them all when weights are shared)."""
    refs = man["artifacts"].pop("contexts")
    top = max((int(r.split("@")[1]) for r in refs if "@" in r), default=0) + 1  # the main rung sorts last

    def rung_of(role: str) -> int:
        return int(role.split("@")[1]) if "@" in role else top

    order = {"prefill": 0, "verify": 1, "decode": 2}
    steps = []
    for role in sorted((r for r in refs if r != "lmhead"), key=lambda r: (rung_of(r), order[base_role(r)])):
        inputs, outputs = step_io(graphs[role].path, head=False)
        steps.append({"role": base_role(role), **refs[role], "inputs": inputs, "outputs": outputs})
    inputs, outputs = step_io(graphs["lmhead"].path, head=True)
    steps.append({"role": "head", **refs["lmhead"], "inputs": inputs, "outputs": outputs})
    man["schema_version"] = 2
    man["plan"]["steps"] = steps
    return man


def write_bundle(ck: Checkpoint, root: str, o: HtpOptions, log: Log, progress: Progress) -> list[str]:
    """Write the bundle under `root` (which exists: the staged DIR.partial); returns manifest paths."""
    if o.kv_dtype == "u8" and o.precision == "fp16":
        raise ExportError("--kv-dtype u8 needs a quantized --precision (w8a16 or w4a16)")
    if o.fmt != "qhx" and (not ck.family.genie_format or ck.config.layer_types is not None):
        raise NotImplementedYet(f"--format {o.fmt}: Genie bundles of {ck.family.name} are not written")
    if "conv" in ck.config.types:
        from qhx_export.write.emu import EmuOptions, check_family_options

        check_family_options(ck, EmuOptions(name=o.name, prefill=o.prefill, verify_rows=o.verify_rows))
    lay = lfm2_layout.get(o.layout)
    if lay is not None and lay.shared:
        raise NotImplementedYet(
            f"--layout {lay.name} --target htp: one context binary holding two graphs is not written yet "
            "(--target emu writes it)"
        )
    t0 = time.monotonic()
    qc.register()
    src = os.path.abspath(ck.path)
    work = os.path.join(root, ".work")
    os.makedirs(work, exist_ok=True)
    cache = StageCache(o.cache_dir, work, log)
    # the input's content, for the report and every stage key (memoized in the cache)
    src_hash = source_hash(src, o.cache_dir) if os.path.isfile(src) or cache.enabled else None
    o.report.update(
        {
            "source": {
                "path": os.path.basename(src.rstrip("/")),
                "sha256": src_hash if os.path.isfile(src) else None,
                **({"tree_sha256": src_hash} if os.path.isdir(src) and src_hash else {}),
            },
            "options": {
                "precision": o.precision,
                "ctx": o.ctx,
                "ar": o.ar,
                "prefill": o.prefill,
                "kv_dtype": o.kv_dtype,
                "kv_layout": o.kv_layout,
                "arches": o.arches,
                "calib": o.calib or "built-in",
                "calib_steps": o.calib_steps,
                "verify_rows": o.verify_rows,
                "estimate_verify": o.estimate_verify,
                "quant_method": o.quant_method if o.precision == "w4a16" else None,
                "rotate": o.rotate,
                "head_precision": o.head_precision if o.precision == "w4a16" else None,
                "weight_sharing": o.weight_sharing,
                "ctx_ladder": [*o.ctx_ladder, o.ctx] if o.ctx_ladder else None,
            },
            "stages": {},
        }
    )
    rotation = None
    if o.rotate != "none" and o.precision != "fp16":
        from qhx_export.quant.rotate import rotated

        base = ck
        ck = rotated(ck, o.rotate)
        if ck is not base:
            rotation = getattr(ck, "how", o.rotate)
            log(f"--rotate {o.rotate}: the residual stream is rotated by a {rotation}, folded in the weights")
            # the rotated model's graphs, ranges and weights are another input's
            src_hash = f"{src_hash}+rotate:hadamard" if src_hash else None
    seqs = calib_ids(ck, o, 64)
    pkey = key_of("prescale", {"source": src_hash, "seqs": seqs[:4]})
    found = cache.lookup("prescale", pkey)
    if found is None:
        prescale, peak = norm_prescale(ck, seqs[:4])
        with cache.make("prescale", pkey) as d, open(os.path.join(d, "prescale.json"), "w") as f:
            json.dump([prescale, peak], f)
    else:
        with open(os.path.join(found, "prescale.json")) as f:
            prescale, peak = json.load(f)
    resid_scale, qk_prescale = stream_scales(ck, peak)
    if resid_scale != 1.0:
        prescale = min(1.0, prescale / resid_scale)
    log(
        f"residual stream peak |x| {peak:.0f} over 4 calibration sequences: RMSNorm prescale {prescale:g}"
        + (f", stream carried x{resid_scale:g}" if resid_scale != 1.0 else "")
    )
    quantized = o.precision != "fp16"
    gopts = GraphOptions(
        quantized=quantized,
        prescale=prescale,
        fp16_weights=o.fp16_weights if quantized else (),
        io_f16=lay is not None,
        resid_scale=resid_scale,
        qk_prescale=qk_prescale,
    )
    o.report["graph"] = {
        "norm_prescale": prescale,
        "residual_peak": peak,
        "fold_q_scale": True,
        "residual_scale": resid_scale,
        "qk_norm_prescale": qk_prescale,
        "attention": "gqa-native, self-score matmul, 1D decode mask",
        "rotate": rotation,
    }
    n_roles = 2 + (o.prefill != "none") + (o.verify_rows is not None) + len(extra_verify_rows(o))
    n_roles += len(o.ctx_ladder) * len(rung_bases(o))
    graphs = (
        build_graphs(ck, o, cache, src_hash or "", gopts, log, progress("build graphs", n_roles))
        if o.fmt != "genie"
        else {}
    )
    o.report["stages"]["build_s"] = round(time.monotonic() - t0, 1)
    to_compile = graphs
    if quantized and graphs:
        to_compile = quantize_graphs(ck, o, graphs, seqs, peak, cache, log, progress)

    if o.estimate and to_compile:
        from qhx_export.compile.estimate import estimate_graph, graph_line, summarize

        per: dict[str, dict[str, Any]] = {}
        tick = progress("estimate (Hextimate, soc 72)", len(to_compile))
        for role, g in to_compile.items():
            t1 = time.monotonic()
            ekey = key_of("estimate", {"graph": g.key, "mode": g.mode})
            hit = cache.lookup("estimate", ekey)
            if hit is None:
                res = estimate_graph(g.path, g.mode, work, role)
                if "error" not in res:  # a missing row is not worth keeping
                    with cache.make("estimate", ekey) as d, open(os.path.join(d, "estimate.json"), "w") as f:
                        json.dump(res, f)
            else:
                with open(os.path.join(hit, "estimate.json")) as f:
                    res = json.load(f)
            per[role] = res
            log(f"estimate {graph_line(role, res)} ({'cached' if hit else f'{time.monotonic() - t1:.1f}s'})")
            tick()
        vrows = {f"est_verify_{k}": k for k in extra_verify_rows(o)}
        if o.verify_rows is not None:
            vrows["verify"] = o.verify_rows
        o.report["estimate"] = summarize(per, decode_bytes(ck, o), o.ar, vrows)
        for k, v in o.report["estimate"].get("verify_vs_decode", {}).items():
            log(f"estimate: a {k}-row verify costs {v['cost_in_decode_steps']} decode steps")
        if "summary" in o.report["estimate"]:
            log(f"estimate: {o.report['estimate']['summary']}")
        lad = o.report["estimate"].get("ladder_decode_ms_per_token")
        if lad:
            rungs = ", ".join(f"C={o.ctx if c == 'ctx' else c} {v} ms" for c, v in lad.items())
            log(f"estimate: decode + lm-head per token on each rung: {rungs}")
    if o.estimate_only:
        o.report["decode_bytes"] = decode_bytes(ck, o)
        shutil.rmtree(work, ignore_errors=True)
        o.report["stages"]["total_s"] = round(time.monotonic() - t0, 1)
        o.report["cache"] = cache.summary()
        cache.prune()
        return []

    genie = None
    if o.fmt in ("genie", "both"):  # built (and calibrated) once for every arch
        from qhx_export.write.genie import prepare_genie

        genie = prepare_genie(ck, o, prescale, seqs, peak, work, log, progress)
    emb = np.ascontiguousarray(host_embedding(ck, resid_scale).astype("<f2"))
    tok = ck.tokenizer_json()
    manifests, compile_s, sizes = [], {}, {}
    genie_paths = []
    for arch in o.arches:
        out = os.path.join(root, arch) if o.per_arch_dirs else root
        os.makedirs(out, exist_ok=True)
        soc = soc_for(o, arch)
        if genie is not None:
            from qhx_export.write.genie import write_genie

            cfg, gsizes = write_genie(ck, out, arch, soc, o, genie, log)
            genie_paths.append(cfg)
            sizes.update({os.path.relpath(os.path.join(out, k), root): v for k, v in gsizes.items()})
            if o.fmt == "genie":
                continue
        modes = {g.mode for g in to_compile.values()}
        real: dict[str, Any] = {
            "backend": f"QNN HTP (onnxruntime-qnn, QAIRT {qc.qnn_version()})",
            "precision": o.precision,
            "prefill": o.prefill,
            "kv_layout": o.kv_layout,
            "qnn_options": {m: qc.qnn_options(arch, soc, m) for m in sorted(modes)},
            "graphs": {},
        }
        refs: dict[str, Any] = {}
        all_roles = {r: v for r, v in to_compile.items() if is_bundle_role(r)}
        bundle_roles = dict(all_roles)
        if o.weight_sharing and lay is None:
            binf, wrappers, secs = compile_shared_cached(
                cache,
                bundle_roles,
                out,
                o.name,
                {r: qc.qnn_options(arch, soc, g.mode) for r, g in bundle_roles.items()},
            )
            size = os.path.getsize(os.path.join(out, binf))
            how = "from the stage cache" if secs is None else f"compiled in {secs:.1f}s"
            n = len(bundle_roles)
            log(f"{arch}: {n} graphs in {binf} ({size / 1e6:.1f} MB, weights stored once) {how}")
            compile_s[f"{arch}/shared"] = round(secs or 0.0, 1)
            sizes[os.path.relpath(os.path.join(out, binf), root)] = size
            for role, g in bundle_roles.items():
                refs[role] = {"bin": binf, "graph": qc.wrapper_graph(os.path.join(out, wrappers[role]))}
                ent = {"wrapper": wrappers[role], "precision": g.mode}
                if g.quant:
                    ent["quant"] = {k: list(v) for k, v in g.quant.items()}
                real["graphs"][role] = ent
            real["weight_sharing"] = True
            bundle_roles = {}  # compiled
        tick = progress(f"compile {arch}", len(bundle_roles))
        for role, g in bundle_roles.items():
            t1 = time.monotonic()
            mode, quant = g.mode, g.quant
            wrapper, binf, secs = compile_cached(
                cache, g, out, f"{o.name}_{file_role(role)}", qc.qnn_options(arch, soc, mode)
            )
            if lay is not None:  # the contract's file name (the wrapper follows it)
                binf = qc.rename_binary(out, wrapper, binf, lay.bin_of(role))
            size = os.path.getsize(os.path.join(out, binf))
            how = "from the stage cache" if secs is None else f"compiled in {secs:.1f}s"
            log(f"{arch} {role}: {binf} ({size / 1e6:.1f} MB) {how}")
            compile_s[f"{arch}/{role}"] = round(time.monotonic() - t1, 1)
            sizes[os.path.relpath(os.path.join(out, binf), root)] = size
            refs[role] = {"bin": binf}
            ent: dict[str, Any] = {"wrapper": wrapper, "precision": mode}
            if quant:
                ent["quant"] = {k: list(v) for k, v in quant.items()}
            real["graphs"][role] = ent
            tick()
        files = {"embed": f"{o.name}_embed_f16.bin", "tokenizer": "tokenizer.json"}
        if lay is not None:
            files = {"embed": lfm2_layout.EMBED, "tokenizer": lfm2_layout.TOKENIZER}
        with atomic_open(os.path.join(out, files["embed"])) as f:
            f.write(memoryview(emb).cast("B"))
        with atomic_open(os.path.join(out, files["tokenizer"])) as f:
            f.write(tok)
        if o.keep_onnx:
            os.makedirs(os.path.join(out, "onnx"), exist_ok=True)
            for role, g in all_roles.items():
                shutil.copyfile(g.path, os.path.join(out, "onnx", f"{file_role(role)}.onnx"))
                if g.path != graphs[role].path:  # quantized: also the float graph it was made from
                    shutil.copyfile(
                        graphs[role].path, os.path.join(out, "onnx", f"{file_role(role)}.float.onnx")
                    )
        man = manifest(ck, o, arch, refs, real, files)
        if o.ctx_ladder or o.weight_sharing:
            man = as_schema_2(man, all_roles)
        mpath = os.path.join(out, f"{o.name}.json")
        if lay is not None:  # the runner's form has no `source`: the report keeps how it was made
            man = lfm2_layout.manifest(
                ck.config, lay, o.model_name, arch, o.ctx, ck.bos_token_id(), ck.eos_token_id()
            )
            mpath = os.path.join(out, lfm2_layout.manifest_file(lay, o.model_name))
            o.report.setdefault("real", {})[os.path.relpath(mpath, root)] = real
        with atomic_open(mpath) as f:
            f.write(json.dumps(man, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
        manifests.append(mpath)
    manifests += genie_paths
    shutil.rmtree(work, ignore_errors=True)
    o.report["cache"] = cache.summary()
    cache.prune()
    o.report["stages"]["compile_s"] = compile_s
    o.report["sizes"] = sizes
    o.report["stages"]["total_s"] = round(time.monotonic() - t0, 1)
    o.report["decode_bytes"] = decode_bytes(ck, o)
    if not manifests:
        raise ExportError("no arch to write")
    return manifests


def file_role(role: str) -> str:
    """A role as it goes into a file name: `decode@256` -> `decode_c256`."""
    return role.replace("@", "_c")


def compile_shared_cached(
    cache: StageCache, graphs: dict[str, Graph], out: str, name: str, options: dict[str, dict[str, str]]
) -> tuple[str, dict[str, str], float | None]:
    """qc.compile_shared of every graph through the stage cache: (binary, wrapper by role,
    seconds or None from the cache). The lm-head goes last (it shares nothing)."""
    roles = sorted(graphs, key=lambda r: (r == "lmhead", r))
    binf = f"{name}_qnn.bin"
    stems = {r: f"{name}_{file_role(r)}" for r in roles}
    jobs = [(graphs[r].path, stems[r], options[r]) for r in roles]
    secs: list[float] = []

    def run(d: str) -> None:
        secs.append(qc.compile_shared(jobs, d, binf)[1])

    if not cache.enabled:
        wrappers, t = qc.compile_shared(jobs, out, binf)
        return binf, dict(zip(roles, wrappers, strict=True)), t
    key = key_of(
        "compile-shared",
        {
            "graphs": {r: graphs[r].key for r in roles},
            "stems": stems,
            "options": options,
            "qairt": qc.qnn_version(),
        },
    )
    d, _ = cache.entry("compile", key, run)
    for f in [binf, *(f"{s}.onnx" for s in stems.values())]:
        shutil.copyfile(os.path.join(d, f), os.path.join(out, f))
    return binf, {r: f"{stems[r]}.onnx" for r in roles}, secs[0] if secs else None


def compile_cached(
    cache: StageCache, g: Graph, out: str, stem: str, options: dict[str, str]
) -> tuple[str, str, float | None]:
    """qc.compile_graph through the stage cache: (wrapper, binary, seconds or None when the
    binary came from the cache). The cached pair is copied, never linked: a bundle file edited in
    place must not change the entry."""
    if not cache.enabled:
        return qc.compile_graph(g.path, out, stem, options)
    key = key_of("compile", {"graph": g.key, "stem": stem, "options": options, "qairt": qc.qnn_version()})
    secs: list[float] = []

    def run(d: str) -> None:
        secs.append(qc.compile_graph(g.path, d, stem, options)[2])

    d, _ = cache.entry("compile", key, run)
    wrapper, binf = f"{stem}.onnx", f"{stem}_qnn.bin"
    for f in (wrapper, binf):
        shutil.copyfile(os.path.join(d, f), os.path.join(out, f))
    return wrapper, binf, secs[0] if secs else None


# ---- the bundle says how it was made --------------------------------------------------------------


def decode_bytes(ck: Checkpoint, o: HtpOptions) -> dict[str, int]:
    """Bytes one decode step streams: layer weights, lm-head weights, and the K/V cache read."""
    c = ck.config
    # int4 LPBQ weights also stream a 4-bit multiplier per block of LPBQ_BLOCK input rows
    lpbq = 4 + 4 / LPBQ_BLOCK
    wbits = {"fp16": 16, "w8a16": 8, "w4a16": lpbq}[o.precision]
    hbits = 16 if o.precision != "w4a16" else (lpbq if o.head_precision == "int4" else 8)
    sizes = {
        "attn_q": c.hidden * c.q_rows,
        "attn_k": c.hidden * c.kv_rows,
        "attn_v": c.hidden * c.kv_rows,
        "attn_output": c.q_rows * c.hidden,
        "ffn_gate": c.hidden * c.ffn,
        "ffn_up": c.hidden * c.ffn,
        "ffn_down": c.hidden * c.ffn,
    }
    kept = set(o.fp16_weights) if o.precision != "fp16" else set()
    per_layer_bits = sum(n * (16 if k in kept else wbits) for k, n in sizes.items())
    # K/V graph I/O element: float32 in fp16 graphs (FLOAT_32 I/O), uint16 quantized, uint8 with u8
    kv_elem = 1 if o.kv_dtype == "u8" else (4 if o.precision == "fp16" else 2)
    kv = 2 * c.n_layers * o.ctx * c.kv_rows * kv_elem
    layers = int(c.n_layers * per_layer_bits / 8)
    head = int(c.vocab * c.hidden * hbits / 8)
    return {"layer_weights": layers, "lmhead_weights": head, "kv_cache_read": kv, "total": layers + head + kv}


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"qhx-export": __version__, "qairt": qc.qnn_version()}
    for pkg in ("onnxruntime", "onnxruntime-qnn", "onnx", "numpy", "gguf"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "-"
    return out


def write_report(root: str, manifests: list[str], o: HtpOptions, final: str | None = None) -> None:
    """export-report.json and README.md at the bundle's top (`final`: its path once renamed)."""
    from qhx_export.write.readme import bundle_readme, dumps

    r = o.report
    r["versions"] = versions()
    r["manifests"] = [os.path.relpath(m, root) for m in manifests]
    with atomic_open(os.path.join(root, "export-report.json")) as f:
        f.write(dumps(r))
    text = bundle_readme(root, final or root, r, o.model_name or o.name)
    with atomic_open(os.path.join(root, "README.md")) as f:
        f.write(text.encode("utf-8"))
