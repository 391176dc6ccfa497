#!/usr/bin/env python3
"""Write a real-HTP qhx bundle: ONNX graphs from numpy weights, compiled into QNN context
binaries by onnxruntime's QNN execution provider (HTP backend, v79 / soc 69).

    make_real.py --family qwen2|llama3 --tokenizer TOK.json --out DIR
                 [--prefill none|window|past] [--kv-layout pos_major|head_major]
                 [--precision fp16|w8a16] [--prefill-len 16] [--ctx 256] [--calib GOLDEN.json ...]
    make_real.py --family smollm2 --gguf SmolLM2.gguf --tokenizer TOK.json --out DIR ...

Run with the QNN venv's python (scripts/qnn-libs.sh --python). Weights are the emulator
bundles' own: scripts/tiny_models.py for the tiny families, the GGUF through make_bundle.Model
for SmolLM2. Graph I/O (names, ranks, dims) is make_bundle.graphs_for's, so the unchanged
qhx_generate binds these graphs like the emulator's (tests/qnn-emu/FORMAT.md).

Each graph becomes its own binary (one graph per context binary):
  <name>_<role>.onnx        the EPContext wrapper ORT wrote (scripts/real_ref.py runs it)
  <name>_<role>_qnn.bin     the QNN context binary qhx_generate loads
plus <name>_embed_f16.bin, tokenizer.json and the manifest <name>.json, whose
source.real records how every graph was made (and the QDQ scale/offset of quantized I/O).

Precision:
  fp16   float ONNX graphs, enable_htp_fp16_precision=1: FLOAT_32 graph I/O, fp16 inside.
  w8a16  prefill/decode quantized with onnxruntime.quantization (QDQ, QNN config: uint8
         weights, uint16 activations), min-max calibrated on the activations of the float
         graphs running the --calib prompts (and their HF gold continuations) on ORT's CPU EP.
         Graph I/O is uint16 (the Q/DQ at the boundary removed, their scale/offset kept), so
         the binaries carry UFIXED_POINT_16 I/O. The lm-head stays fp16 (it reads the
         in-graph-normalised hidden state, as in the emulator's fixed-point bundles).
         --float-residual leaves the residual adds and per-layer RMSNorms unquantized: they
         run in fp16 on the HTP (graph I/O stays uint16). SmolLM2 needs it: its residual
         stream reaches |x| ~ 22,550 (median ~13), so one 16-bit range per tensor there
         leaves a step of ~0.7 and the first token moves with one-step input changes
         (scripts/real_sensitivity.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bundle as mb  # noqa: E402
import real_graphs as rg  # noqa: E402
import real_ref  # noqa: E402
import tiny_models as tm  # noqa: E402

SOC_MODEL, HTP_ARCH = 69, 79
QNN_OPTIONS = {
    "fp16": {"backend_type": "htp", "enable_htp_fp16_precision": "1", "soc_model": str(SOC_MODEL),
             "htp_arch": str(HTP_ARCH)},
    "w8a16": {"backend_type": "htp", "soc_model": str(SOC_MODEL), "htp_arch": str(HTP_ARCH)},
    # --float-residual: the float nodes left in a QDQ graph run in fp16 on the HTP.
    "w8a16-mixed": {"backend_type": "htp", "enable_htp_fp16_precision": "1", "soc_model": str(SOC_MODEL),
                    "htp_arch": str(HTP_ARCH)},
}
# Hidden-slot score of quantized graphs: a 16-bit tensor cannot span -30000..10, so the mask
# selects this floor instead of adding -inf (e^-60 is zero for softmax all the same).
QUANT_MASK_FLOOR = -60.0
CALIB_MASK = -30000.0  # hidden-slot value in the calibration feeds (sets cmask's range)


def log(msg: str) -> None:
    print(f"make_real: {msg}", file=sys.stderr, flush=True)


def load_weights(args):
    """(params p, config c, GGUF-named f32 weights, embedding f32 [V, H], provenance)"""
    if args.family == "smollm2":
        m = mb.Model(args.gguf)
        m.check_shapes()
        p = dict(m.params)
        w = {}
        for n in m.tensors:
            if n == "token_embd.weight":
                continue
            _, _, arr = m.weight(n, "f32")
            w[n] = np.asarray(arr, np.float32)
        emb = m.embedding("f32").astype(np.float32)
        rs = mb.rope_scaling(m)
        add_bos = bool(m.get("tokenizer.ggml.add_bos_token", False))
        bos, eos = m.get("tokenizer.ggml.bos_token_id"), m.get("tokenizer.ggml.eos_token_id")
        c = {"rope_theta": mb.f32_value(m.get(f"{m.arch}.rope.freq_base", 10000.0)), "rope_scaling": rs,
             "bos": int(bos) if add_bos and bos is not None else None, "eos": int(eos), "tied": "output.weight" not in w}
        if c["tied"]:
            w["token_embd.weight"] = emb
        src = {"gguf": os.path.basename(args.gguf), "gguf_sha256": mb.sha256_file(args.gguf)}
        chat = m.get("tokenizer.chat_template")
        return p, c, w, emb, src, chat
    c = tm.FAMILIES[args.family]
    hf = tm.weights(args.family)
    p = {k: c[k] for k in ("arch", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab", "rms_eps")}
    w = {tm.gguf_name(k): v for k, v in hf.items()}
    emb = hf["model.embed_tokens.weight"]
    return p, c, w, emb, {"weights_sha256": tm.checksum(hf)}, None


def save(model, path):
    import onnx
    onnx.save(model, path)


def compile_qnn(src: str, out_dir: str, stem: str, precision: str) -> tuple[str, str]:
    """ORT QNN EP compile: writes <stem>.onnx (EPContext wrapper) and <stem>_qnn.bin."""
    import onnxruntime as ort
    real_ref.register_qnn()
    wrapper = os.path.join(out_dir, f"{stem}.onnx")
    for f in (wrapper, os.path.join(out_dir, f"{stem}_qnn.bin")):
        if os.path.exists(f):
            os.unlink(f)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "0")
    so.add_session_config_entry("ep.context_file_path", wrapper)
    so.add_provider_for_devices(real_ref.qnn_devices(), QNN_OPTIONS[precision])
    t0 = time.monotonic()
    ort.InferenceSession(src, so)
    binf = os.path.join(out_dir, f"{stem}_qnn.bin")
    if not os.path.isfile(binf):
        raise SystemExit(f"make_real: error: ORT wrote no {binf}")
    log(f"compiled {os.path.basename(src)} -> {os.path.basename(binf)} ({os.path.getsize(binf)} bytes, "
        f"{time.monotonic() - t0:.1f}s)")
    return os.path.basename(wrapper), os.path.basename(binf)


def cpu_graph(path: str, record: bool) -> real_ref.Graph:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    g = real_ref.Graph(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]), {})
    if record:
        g.record = []
    return g


def calibration_feeds(man: dict, root: str, float_paths: dict, calib: list[str]) -> dict:
    """Run the float graphs over the calibration prompts (teacher-forced on their gold ids):
    {role: [feeds of every execute]}."""
    graphs = {r: cpu_graph(pth, r != "lmhead") for r, pth in float_paths.items()}
    for path in calib:
        gdn = json.load(open(path, encoding="utf-8"))
        loop = real_ref.Loop(man, root, graphs, neg_override=CALIB_MASK)
        loop.generate(gdn["input_ids"], len(gdn["gold_ids"]), gdn["gold_ids"])
        for g in graphs.values():  # fresh cache per prompt
            for n in g.feeds:
                g.feeds[n][...] = 0
    return {r: g.record for r, g in graphs.items() if g.record is not None}


class Reader:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def quantize(src: str, dst: str, feeds: list, float_residual: bool) -> None:
    """QDQ-quantize `src`; with `float_residual`, its residual adds and per-layer RMSNorms
    (listed by real_graphs in a model property) stay float."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    exclude = []
    if float_residual:
        props = {p.key: p.value for p in onnx.load(src).metadata_props}
        exclude = json.loads(props.get(rg.FLOAT_NODES_KEY, "[]"))
    cfg = get_qnn_qdq_config(src, Reader(feeds), activation_type=QuantType.QUInt16,
                             weight_type=QuantType.QUInt8, nodes_to_exclude=exclude)
    ort_quantize(src, dst, cfg)


def rename(nodes, field: str, old: str, new: str) -> None:
    """Point every node's `field` ("input" or "output") entries named `old` at `new`."""
    for n in nodes:
        names = getattr(n, field)
        for k, x in enumerate(names):
            if x == old:
                names[k] = new


def quantized_io(path: str) -> dict:
    """Make the graph I/O of a QDQ model uint16: an input that feeds a QuantizeLinear becomes
    that Q's output, an output made by a DequantizeLinear becomes that DQ's input. Returns
    {tensor: (scale, offset)} in QNN's convention (real = (q + offset) * scale, offset = -zp)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    g = m.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    quant, drop = {}, []
    for inp in g.input:
        qs = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == inp.name]
        others = [n for n in g.node if inp.name in n.input and n.op_type != "QuantizeLinear"]
        if len(qs) != 1 or others:
            raise SystemExit(f"make_real: error: input {inp.name} does not enter through one QuantizeLinear")
        q = qs[0]
        scale, zp = inits[q.input[1]], inits[q.input[2]]
        rename(g.node, "input", q.output[0], inp.name)
        drop.append(q)
        inp.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(zp.dtype)
        quant[inp.name] = (float(np.float32(scale)), -int(zp))
    for out in g.output:
        dq = [n for n in g.node if n.op_type == "DequantizeLinear" and n.output[0] == out.name]
        if len(dq) != 1:
            raise SystemExit(f"make_real: error: output {out.name} does not leave through a DequantizeLinear")
        d = dq[0]
        scale, zp = inits[d.input[1]], inits[d.input[2]]
        rename(g.node, "output", d.input[0], out.name)
        rename(g.node, "input", d.input[0], out.name)
        drop.append(d)
        out.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(zp.dtype)
        quant[out.name] = (float(np.float32(scale)), -int(zp))
    keep = [n for n in g.node if n not in drop]
    del g.node[:]
    g.node.extend(keep)
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return quant


def build(args) -> None:
    t0 = time.monotonic()
    p, c, w, emb, src, chat = load_weights(args)
    name = args.name or (f"tiny_{args.family}" if args.family != "smollm2" else "smollm2")
    io = "ufixed16" if args.precision == "w8a16" else "f32"
    specs = mb.graphs_for(p, name, args.prefill_len, args.ctx, io, args.prefill, args.kv_layout)
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):  # a rebuild starts clean: exactly one manifest per dir
        fp = os.path.join(args.out, f)
        if os.path.isfile(fp):
            os.unlink(fp)
    work = os.environ.get("QHX_REAL_WORK") or tempfile.mkdtemp(prefix="make_real-")
    os.makedirs(work, exist_ok=True)
    opts = {"prescale": args.norm_prescale}
    qopts = dict(opts, mask_floor=QUANT_MASK_FLOOR) if args.precision == "w8a16" else opts
    float_paths = {}
    for role, spec in specs.items():
        model = (rg.lmhead_graph if role == "lmhead" else rg.layer_graph)(p, w, spec, opts if role == "lmhead" else qopts)
        float_paths[role] = os.path.join(work, f"{role}.float.onnx")
        save(model, float_paths[role])
    log(f"wrote {len(specs)} float ONNX graphs ({time.monotonic() - t0:.1f}s)")

    edt = "f16"
    efile = f"{name}_embed_{edt}.bin"
    with mb.atomic_open(os.path.join(args.out, efile)) as f:
        f.write(np.ascontiguousarray(emb.astype("<f2")).tobytes())
    # In a subdirectory: the bundle dir holds exactly one *.json, the manifest.
    os.makedirs(os.path.join(args.out, "tok"), exist_ok=True)
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tok", "tokenizer.json"))
    params = {k: p[k] for k in ("hidden", "vocab", "n_layers", "n_heads", "n_kv_heads", "head_dim")}
    eos = c["eos"]
    params.update({"max_ctx": args.ctx, "rope_theta": c["rope_theta"], "bos_token_id": c["bos"],
                   "eos_token_id": eos})
    if c.get("rope_scaling"):
        params["rope_scaling"] = c["rope_scaling"]
    man = {
        "schema_version": 1,
        "model": {"name": name, "family": "llm", "arch": p["arch"], "dsp_arch": f"v{HTP_ARCH}",
                  "soc_model": SOC_MODEL, "n_params": mb.count_params({k: v.shape for k, v in w.items()})},
        "params": params,
        "artifacts": {"contexts": {}, "embed": {"file": efile, "dtype": edt}, "tokenizer": "tok/tokenizer.json"},
        "plan": {"op": "llama_generate", "ar": args.prefill_len if args.prefill != "none" else 1},
        "source": {"writer": "scripts/make_real.py", "family": args.family, **src,
                   "real": {"backend": "QNN HTP (onnxruntime-qnn, QAIRT 2.51)", "precision": args.precision,
                            "prefill": args.prefill, "kv_layout": args.kv_layout,
                            "qnn_options": QNN_OPTIONS, "graphs": {}}},
    }
    if chat:
        man["chat"] = {"template": chat}

    to_compile = {}
    if args.precision == "w8a16":
        feeds = calibration_feeds(man, args.out, float_paths, args.calib)
        for role in ("prefill", "decode"):
            if role not in specs:
                continue
            qpath = os.path.join(work, f"{role}.qdq.onnx")
            t1 = time.monotonic()
            quantize(float_paths[role], qpath, feeds[role], args.float_residual)
            quant = quantized_io(qpath)
            log(f"quantized {role} on {len(feeds[role])} calibration executes ({time.monotonic() - t1:.1f}s)")
            to_compile[role] = (qpath, "w8a16-mixed" if args.float_residual else "w8a16", quant)
        to_compile["lmhead"] = (float_paths["lmhead"], "fp16", {})
    else:
        to_compile = {r: (pth, "fp16", {}) for r, pth in float_paths.items()}

    for role, (pth, prec, quant) in to_compile.items():
        wrapper, binf = compile_qnn(pth, args.out, f"{name}_{role}", prec)
        man["artifacts"]["contexts"][role] = {"bin": binf}
        ent = {"wrapper": wrapper, "precision": prec}
        if quant:
            ent["quant"] = {k: list(v) for k, v in quant.items()}
        man["source"]["real"]["graphs"][role] = ent
    # The float graphs stay as the bundle's fp32 twin: real_ref.py --float runs them on ORT's
    # CPU EP to show fp32 top-2 margins where the HTP's pick differs from HF's.
    os.makedirs(os.path.join(args.out, "float"), exist_ok=True)
    for role, pth in float_paths.items():
        shutil.copyfile(pth, os.path.join(args.out, "float", f"{role}.onnx"))
    if not os.environ.get("QHX_REAL_WORK"):
        shutil.rmtree(work, ignore_errors=True)
    with mb.atomic_open(os.path.join(args.out, f"{name}.json")) as f:
        f.write(json.dumps(man, indent=2, ensure_ascii=False).encode() + b"\n")
    log(f"wrote real {args.family} {args.precision} bundle to {args.out} in {time.monotonic() - t0:.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(tm.FAMILIES) + ["smollm2"], required=True)
    ap.add_argument("--gguf", help="SmolLM2 GGUF (family smollm2)")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name")
    ap.add_argument("--precision", choices=("fp16", "w8a16"), default="fp16")
    ap.add_argument("--prefill", choices=("window", "past", "none"), default="window")
    ap.add_argument("--kv-layout", choices=("pos_major", "head_major"), default="pos_major")
    ap.add_argument("--prefill-len", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--norm-prescale", type=float, default=1.0,
                    help="scale RMSNorm inputs by this before squaring (fp16 range; SmolLM2 needs 1/64)")
    ap.add_argument("--calib", nargs="*", default=[], help="golden JSON files whose prompts calibrate w8a16")
    ap.add_argument("--float-residual", action="store_true",
                    help="w8a16: keep the residual adds and per-layer RMSNorms in fp16 (mixed precision; "
                         "SmolLM2's residual outliers make 16-bit ranges there too coarse)")
    args = ap.parse_args()
    if args.family == "smollm2" and not args.gguf:
        ap.error("--family smollm2 needs --gguf")
    if args.precision == "w8a16" and not args.calib:
        ap.error("--precision w8a16 needs --calib")
    if args.float_residual and args.precision != "w8a16":
        ap.error("--float-residual applies to --precision w8a16")
    build(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
