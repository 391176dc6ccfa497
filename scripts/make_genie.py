#!/usr/bin/env python3
"""Write a Genie bundle (Qualcomm's genie_config.json layout) from the tiny models' weights:
ONNX graphs in Genie's tensor layout (scripts/genie_graphs.py), compiled into QNN context
binaries by onnxruntime's QNN EP, one binary per graph.

    make_genie.py --family llama3|qwen2 --tokenizer TOK.json --out DIR
                  [--precision fp16|w8a16] [--ar 4] [--ctx 64] [--splits 1] [--calib GOLDEN.json ...]

Run with the QNN venv's python (scripts/qnn-libs.sh --python). DIR gets:
  genie_config.json                 the dialog config libGenie.so loads (paths relative to DIR)
  tokenizer.json
  <stem>_qnn.bin                    one QNN context binary per graph; stems
                                    {name}_{prompt|token}_ar{AR}_cl{CL}_{i}_of_{n}, AR = --ar
                                    and 1; the graph inside is renamed (same length, '_'
                                    padded) to {prompt|token}_ar{AR}_cl{CL}_{i}_of_{n}, see
                                    rename_graph (ORT names every graph
                                    QNNExecutionProvider_QNNExecutionProvider_<hash>_<n>_0)
  <stem>.onnx                       ORT's EPContext wrapper of it (scripts/genie_ref.py runs it)
  genie-source.json                 how every graph was made: graph file, QNN graph name, AR,
                                    split, precision, I/O scale/offset of quantized tensors

Graph names (Genie orders the splits of one (AR, CL) by sorted graph name). ORT's QNN EP names
every graph QNNExecutionProvider_QNNExecutionProvider_<hash>_<n>_0 and offers no way to choose it:
the session option ep.context_node_name_prefix and a provider option graph_name (or a session
option ep.graph_name) leave it unchanged (QAIRT 2.51 / onnxruntime-qnn 2.7.0). <hash> is a
hash of the source model's path string (m.onnx, m2.onnx and /tmp/x/m.onnx give three hashes for
one model), so picking source paths until the hashes sort right would also work, but the names
would stay meaningless. What this writer does instead: rewrite the name inside the binary with a
same-length one (rename_graph); libQnnSystem, libQnnHtp (ORT's QNN EP over the EPContext wrapper,
scripts/genie_ref.py) and libGenie.so load the result, and Genie's dump-specs shows the new names.

Precision:
  fp16   float graphs, enable_htp_fp16_precision=1: FLOAT_32 I/O, fp16 inside.
  w8a16  QDQ (onnxruntime.quantization, QNN config: uint8 weights, uint16 activations),
         calibrated on the float graphs running the --calib prompts (teacher-forced on their
         gold ids) through scripts/genie_ref.py's loop on ORT's CPU EP. Graph I/O like AI Hub's
         w4a16 bundles: KV uint8, mask/cos/sin/logits uint16, each with its own scale/offset;
         every I/O tensor's range is the union over all variants, and a layer's _in/_out pair
         share one range (Genie requires identical quantization there). The mask is quantized
         as [-1000, 0]: Genie's raw 0 (masked) reads -1000, raw 65535 (attend) reads 0.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import genie_graphs as gg  # noqa: E402
import genie_ref  # noqa: E402
import make_bundle as mb  # noqa: E402
import make_real  # noqa: E402
import tiny_models as tm  # noqa: E402

GENIE_OPTS = {"fp16": make_real.QNN_OPTIONS["fp16"], "w8a16": make_real.QNN_OPTIONS["w8a16"]}


def log(msg: str) -> None:
    print(f"make_genie: {msg}", file=sys.stderr, flush=True)


def graph_plan(p: dict, name: str, ar: int, ctx: int, splits: int) -> list[dict]:
    """Every graph: stem, AR, split index, layers."""
    L = p["n_layers"]
    if not 1 <= splits <= L:
        raise SystemExit(f"make_genie: error: --splits {splits} must be 1..{L} (n_layers)")
    bounds = [round(L * k / splits) for k in range(splits + 1)]
    plan = []
    for a in sorted({ar, 1}, reverse=True):
        kind = "prompt" if a > 1 else "token"
        for s in range(splits):
            gname = f"{kind}_ar{a}_cl{ctx}_{s + 1}_of_{splits}"
            plan.append({"stem": f"{name}_{gname}", "genie_name": gname, "ar": a, "split": s + 1,
                         "layers": list(range(bounds[s], bounds[s + 1])), "first": s == 0,
                         "last": s == splits - 1})
    return plan


def calibrate(p, rope, float_paths: dict, plan: list, calib: list[str]) -> tuple[dict, dict]:
    """Run the float graphs (CPU EP) over the calibration prompts: ({stem: [feeds]},
    {tensor: (min, max)} over every graph's inputs and outputs)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    splits = {}
    variants = {}
    for g in plan:
        sp = genie_ref.Split(ort.InferenceSession(float_paths[g["stem"]], so, providers=["CPUExecutionProvider"]), {})
        sp.record = []
        splits[g["stem"]] = sp
        variants.setdefault(g["ar"], []).append(sp)
    ranges = {}

    def widen(n, arr):
        a = np.asarray(arr, np.float32)
        lo, hi = ranges.get(n, (0.0, 0.0))
        ranges[n] = (min(lo, float(a.min())), max(hi, float(a.max())))

    for sp in splits.values():  # wrap run to see outputs too
        orig = sp.run

        def run(feeds, orig=orig):
            outs = orig(feeds)
            for n, v in outs.items():
                widen(n, v)
            return outs
        sp.run = run
    for path in calib:
        gdn = json.load(open(path, encoding="utf-8"))
        gold = gdn["gold_ids"] if isinstance(gdn["gold_ids"], list) else json.loads(gdn["gold_ids"])
        loop = genie_ref.GenieLoop(p, rope, variants)
        n = min(len(gold), loop.CL - 1 - len(gdn["input_ids"]))
        loop.generate(gdn["input_ids"], n, gold)
    feeds = {s: sp.record for s, sp in splits.items()}
    for recs in feeds.values():
        for f in recs:
            for n, v in f.items():
                if n != "input_ids":
                    widen(n, v)
    return feeds, ranges


def io_overrides(p: dict, ranges: dict) -> dict:
    from onnxruntime.quantization import QuantType
    ov = {}
    for n, (lo, hi) in ranges.items():
        qt = QuantType.QUInt16
        if n.startswith("past_"):
            base = n.rsplit("_", 1)[0]
            lo = min(ranges.get(base + "_in", (0, 0))[0], ranges.get(base + "_out", (0, 0))[0])
            hi = max(ranges.get(base + "_in", (0, 0))[1], ranges.get(base + "_out", (0, 0))[1])
            qt = QuantType.QUInt8
        if n == "attention_mask":
            lo, hi = gg.MASK_NEG, 0.0
        if n.startswith("position_ids_"):
            lo, hi = -1.0, 1.0
        m = max(abs(lo), abs(hi)) * 1e-6 + 1e-6  # keep rmin < rmax and both around 0
        ov[n] = [{"quant_type": qt, "rmin": np.array(min(lo, 0.0) - (m if lo == hi else 0), np.float32),
                  "rmax": np.array(max(hi, 0.0), np.float32)}]
    return ov


def quantized_io(path: str) -> dict:
    """make_real.quantized_io for graphs with an int32 input_ids (left as it is)."""
    import onnx
    m = onnx.load(path)
    ids = [i for i in m.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.INT32]
    keep = [onnx.helper.make_tensor_value_info(i.name, onnx.TensorProto.INT32,
                                               [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in ids]
    if not ids:
        return make_real.quantized_io(path)
    for i in ids:
        m.graph.input.remove(i)
    tmp = path + ".noids.onnx"
    # check_model would reject the dangling input_ids; quantized_io only needs the structure.
    onnx.save(m, tmp)
    import onnx.checker as chk
    orig_check = chk.check_model
    chk.check_model = lambda *a, **k: None
    try:
        quant = make_real.quantized_io(tmp)
    finally:
        chk.check_model = orig_check
    m = onnx.load(tmp)
    os.unlink(tmp)
    for k, i in enumerate(keep):
        m.graph.input.insert(k, i)
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return quant


def qnn_graph_name(bin_path: str) -> str:
    """The graph name ORT gave the binary (from the EPContext wrapper's node attributes)."""
    import onnx
    w = onnx.load(bin_path[: -len("_qnn.bin")] + ".onnx")
    for n in w.graph.node:
        if n.op_type == "EPContext":
            return n.name
    return ""


def rename_graph(bin_path: str, new: str) -> str:
    """Give the binary's one graph the name `new`, padded with '_' to the length of the name ORT
    wrote (QNNExecutionProvider_QNNExecutionProvider_<hash>_<n>_0, 66-67 chars). The binary's
    header holds the name three times, twice as a uint32-length-prefixed string and once
    inside a longer record, so only a same-length rewrite keeps every length and offset. libQnnSystem, libQnnHtp and libGenie load the result
    (checked by scripts/build-genie.sh runs); the EPContext wrapper's node is renamed to
    match so ORT still finds the graph. Returns the new name."""
    import onnx
    old = qnn_graph_name(bin_path)
    if not old or len(new) > len(old):
        raise SystemExit(f"make_genie: error: cannot rename graph {old!r} of {bin_path} to {new!r}")
    name = new + "_" * (len(old) - len(new))
    data = bytearray(open(bin_path, "rb").read())
    n = data.count(old.encode())
    if n == 0:
        raise SystemExit(f"make_genie: error: graph name {old} not found in {bin_path}")
    data = data.replace(old.encode(), name.encode())
    with mb.atomic_open(bin_path) as f:
        f.write(bytes(data))
    wpath = bin_path[: -len("_qnn.bin")] + ".onnx"
    w = onnx.load(wpath)
    for node in w.graph.node:
        if node.op_type == "EPContext" and node.name == old:
            node.name = name
            for a in node.attribute:
                if a.name == "partition_name":
                    a.s = name.encode()
    onnx.save(w, wpath)
    log(f"renamed graph {old} -> {name} ({n} occurrences in {os.path.basename(bin_path)})")
    return name


def genie_config(p: dict, c: dict, ar: int, ctx: int, bins: list[str], n_threads: int = 1) -> dict:
    Dh = p["head_dim"]
    eos = c["eos"]
    pe = {"type": "rope", "rope-dim": Dh // 2, "rope-theta": c["rope_theta"]}
    if c.get("rope_scaling"):
        rs = c["rope_scaling"]
        pe["rope-scaling"] = {"rope-type": rs["rope_type"], "factor": rs["factor"],
                              "low-freq-factor": rs["low_freq_factor"], "high-freq-factor": rs["high_freq_factor"],
                              "original-max-position-embeddings": rs["original_max_position_embeddings"]}
    return {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": ctx, "n-vocab": p["vocab"], "bos-token": c["bos"],
                    "eos-token": eos if len(eos) > 1 else eos[0]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 1.0, "greedy": True},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": n_threads,
                   "backend": {"version": 1, "type": "QnnHtp",
                               "QnnHtp": {"version": 1, "spill-fill-bufsize": 0, "use-mmap": False,
                                          "mmap-budget": 0, "poll": False, "cpu-mask": "0x1",
                                          "kv-dim": Dh, "allow-async-init": False}},
                   "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": bins},
                             "positional-encoding": pe}}}}


def build(args) -> None:
    t0 = time.monotonic()
    if args.family not in tm.FAMILIES:
        raise SystemExit(f"make_genie: error: unknown family {args.family}")
    p, c, w, emb, src, _ = make_real.load_weights(argparse.Namespace(family=args.family, gguf=None))
    name = args.name or f"tiny_{args.family}"
    rope = {"theta": c["rope_theta"], "scaling": c.get("rope_scaling")}
    plan = graph_plan(p, name, args.ar, args.ctx, args.splits)
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):  # a rebuild starts clean
        fp = os.path.join(args.out, f)
        if os.path.isfile(fp):
            os.unlink(fp)
    # A fixed work path: ORT's graph name hashes the source model's path, and a random temp dir
    # made the name (and so its padded length) change on every build. With it, a forced
    # rebuild gave 12/12 byte-identical binaries once and 10/12 another time (the two that
    # differed still gave Genie the same ids; the cause was not pinned down).
    work = os.environ.get("QHX_GENIE_WORK") or os.path.join(args.out, ".work")
    os.makedirs(work, exist_ok=True)
    quant = args.precision == "w8a16"
    float_paths, qdq_opts = {}, {"quant": True, "mask_floor": make_real.QUANT_MASK_FLOOR}
    for g in plan:
        model = gg.genie_graph(p, w, emb, g["stem"], g["ar"], args.ctx, g["layers"], g["first"], g["last"],
                               g["split"], qdq_opts if quant else {})
        float_paths[g["stem"]] = os.path.join(work, g["stem"] + ".float.onnx")
        make_real.save(model, float_paths[g["stem"]])
    log(f"wrote {len(plan)} float ONNX graphs ({time.monotonic() - t0:.1f}s)")

    to_compile = {g["stem"]: (float_paths[g["stem"]], "fp16", {}) for g in plan}
    if quant:
        feeds, ranges = calibrate(p, rope, float_paths, plan, args.calib)
        ov = io_overrides(p, ranges)
        from onnxruntime.quantization import QuantType, quantize as ort_quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
        for g in plan:
            st = g["stem"]
            qpath = os.path.join(work, st + ".qdq.onnx")
            t1 = time.monotonic()
            cfg = get_qnn_qdq_config(float_paths[st], make_real.Reader(feeds[st]), activation_type=QuantType.QUInt16,
                                     weight_type=QuantType.QUInt8, init_overrides=ov)
            ort_quantize(float_paths[st], qpath, cfg)
            q = quantized_io(qpath)
            log(f"quantized {st} on {len(feeds[st])} calibration executes ({time.monotonic() - t1:.1f}s)")
            to_compile[st] = (qpath, "w8a16", q)

    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    source = {"writer": "scripts/make_genie.py", "family": args.family, **src, "precision": args.precision,
              "ar": args.ar, "ctx": args.ctx, "splits": args.splits, "qnn_options": GENIE_OPTS,
              "params": {k: p[k] for k in ("hidden", "vocab", "n_layers", "n_heads", "n_kv_heads", "head_dim")},
              "rope": rope, "graphs": []}
    bins = []
    for g in plan:
        pth, prec, q = to_compile[g["stem"]]
        wrapper, binf = make_real.compile_qnn(pth, args.out, g["stem"], prec)
        bins.append(binf)
        gname = qnn_graph_name(os.path.join(args.out, binf))
        ort_name = gname
        if args.graph_names == "genie":
            gname = rename_graph(os.path.join(args.out, binf), g["genie_name"])
        ent = {"stem": g["stem"], "bin": binf, "wrapper": wrapper, "name": gname, "ort_name": ort_name,
               "ar": g["ar"], "split": g["split"], "layers": g["layers"], "precision": prec}
        if q:
            ent["quant"] = {k: list(v) for k, v in q.items()}
        source["graphs"].append(ent)
    if not os.environ.get("QHX_GENIE_WORK"):
        shutil.rmtree(work, ignore_errors=True)
    cfg = genie_config(p, c, args.ar, args.ctx, bins)
    with mb.atomic_open(os.path.join(args.out, "genie-source.json")) as f:
        f.write(json.dumps(source, indent=2).encode() + b"\n")
    with mb.atomic_open(os.path.join(args.out, "genie_config.json")) as f:
        f.write(json.dumps(cfg, indent=2).encode() + b"\n")
    log(f"wrote Genie {args.family} {args.precision} bundle to {args.out} in {time.monotonic() - t0:.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(tm.FAMILIES), required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name")
    ap.add_argument("--precision", choices=("fp16", "w8a16"), default="fp16")
    ap.add_argument("--ar", type=int, default=4, help="tokens per step of the prompt variant")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--splits", type=int, default=1)
    ap.add_argument("--calib", nargs="*", default=[])
    ap.add_argument("--graph-names", choices=("genie", "ort"), default="genie",
                    help="genie: rename each graph in its binary to {prompt|token}_ar{N}_cl{C}_{i}_of_{n} "
                         "(AI Hub's scheme; sorted names give the split order); ort: keep ORT's names")
    args = ap.parse_args()
    if args.precision == "w8a16" and not args.calib:
        ap.error("--precision w8a16 needs --calib")
    build(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
