#!/usr/bin/env python3
"""Write an emulator bundle for a tiny parity model (see tiny_models.py).

    make_tiny.py --family qwen2|llama3 --tokenizer TOKENIZER.json --out DIR
                 [--io f32|f16] [--prefill-len 16] [--ctx 256] [--name NAME]

Weights are written as f32 (HF layout: rotate-half q/k rows, so nothing is permuted).
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bundle as mb  # noqa: E402
import tiny_models as tm  # noqa: E402


def build(args) -> None:
    c = tm.FAMILIES[args.family]
    w = tm.weights(args.family)
    name = args.name or f"tiny_{args.family}"
    p = {"arch": c["arch"], "hidden": c["hidden"], "n_layers": c["n_layers"], "n_heads": c["n_heads"],
         "n_kv_heads": c["n_kv_heads"], "head_dim": c["head_dim"], "ffn": c["ffn"], "vocab": c["vocab"],
         "rms_eps": c["rms_eps"]}
    if args.io.startswith("ufixed") and not args.calib:
        raise SystemExit(f"make_tiny: error: --io {args.io} needs --calib")
    graphs = mb.graphs_for(p, name, args.prefill_len, args.ctx, args.io, args.prefill, args.kv_layout,
                           mb.load_ranges(args.calib))
    os.makedirs(args.out, exist_ok=True)
    items = [(tm.gguf_name(k), "f32", list(v.shape), np.ascontiguousarray(v, dtype="<f4")) for k, v in w.items()]
    blk = [it for it in items if it[0].startswith("blk.")]
    head_name = "output.weight" if not c["tied"] else "token_embd.weight"
    head = [it for it in items if it[0] in ("output_norm.weight", head_name)]
    refs = mb.write_graph_binaries(args.out, name, p, graphs, blk, head, args.shared)["refs"]
    files = {}
    emb = w["model.embed_tokens.weight"]
    edt = "f32" if args.io == "f32" else "f16"
    files["embed"] = f"{name}_embed_{edt}.bin"
    with mb.atomic_open(os.path.join(args.out, files["embed"])) as f:
        f.write(np.ascontiguousarray(emb.astype("<f2" if edt == "f16" else "<f4")).tobytes())
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    params = {k: p[k] for k in ("hidden", "vocab", "n_layers", "n_heads", "n_kv_heads", "head_dim")}
    params.update({"max_ctx": args.ctx, "rope_theta": c["rope_theta"], "bos_token_id": c["bos"],
                   "eos_token_id": c["eos"]})
    if c["rope_scaling"]:
        params["rope_scaling"] = c["rope_scaling"]
    man = {
        "schema_version": 1,
        "model": {"name": name, "family": "llm", "arch": c["arch"], "dsp_arch": mb.DSP_ARCH, "soc_model": mb.SOC_MODEL,
                  "n_params": mb.count_params({tm.gguf_name(k): v.shape for k, v in w.items()})},
        "params": params,
        "artifacts": {"contexts": refs,
                      "embed": {"file": files["embed"], "dtype": edt}, "tokenizer": "tokenizer.json"},
        "plan": {"op": "llama_generate", "ar": args.prefill_len if args.prefill != "none" else 1},
        "source": {"writer": "scripts/make_tiny.py", "family": args.family, "weights_sha256": tm.checksum(w)},
    }
    with mb.atomic_open(os.path.join(args.out, f"{name}.json")) as f:
        f.write(json.dumps(man, indent=2).encode() + b"\n")
    mb.log(f"wrote tiny {args.family} bundle to {args.out} (weights sha256 {tm.checksum(w)[:16]}…)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(tm.FAMILIES), required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--io", choices=("f32", "f16", "ufixed16"), default="f32")
    ap.add_argument("--prefill", choices=("window", "past", "none"), default="window")
    ap.add_argument("--kv-layout", choices=("pos_major", "head_major"), default="pos_major")
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--calib", help="value ranges JSON recorded with QNN_EMU_CALIBRATE")
    ap.add_argument("--prefill-len", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--name")
    build(ap.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
