#!/usr/bin/env python3
"""Parity on the real QNN HTP backend: every real bundle (scripts/build-real.sh) through the
unchanged qhx_generate with the real libQnnHtp.so / libQnnSystem.so, against

  (a) qhx_export.verify.loop: a Python token loop driving the *same* context binaries through
      onnxruntime's QNN EP, with its own host work (embed, RoPE, masks, K/V rows,
      quantize/dequantize). Same backend, same binaries: the ids must be identical, for a
      free greedy run (--json output_ids) and for a teacher-forced run over the gold ids;
  (b) the HF goldens (tests/goldens/parity): the first divergence and the teacher-forced top-1
      agreement per case, which must reach the bundle's floor (fp16 98 %, W8A16 90 %). A
      divergence counts as a tie (agreeing) only under tests/harness/parity.py's rule: our pick is
      HF's runner-up and HF's top-2 gap is below the resolution of the logits' dtype there.

Also checked for every case: exit status 0, stdout of a --json run is exactly one JSON
document, input_ids equal the golden's (our tokenizer).

    real_parity.py [--bundles target/bundles/real] [--filter SUBSTR] [--free 8]

Prints one line per case and 'N passed, M failed' last; exit 1 when anything failed.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from harness import parity  # tie rule and golden checks shared with the emulator suite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOOR = {"fp16": 0.98, "w8a16": 0.90}
# Golden cases per bundle (short prompts keep the simulator's time in budget; the chunked
# prefill also takes the 109-token prompt: seven chunks). Not in CI, measured and reported: on
# the exporter's graphs both tiny Qwen2 bundles take HF's runner-up on `short` at step 21 (31/32),
# where the fp32 top-2 gap is 0.0028 at a logit of 12.37 (0.36 f16 steps), beyond the 8 steps
# whose HF runner-up the goldens record. (The former writer's graphs missed llama3-fp16-past
# cyrillic and long that way instead; the exporter's pass cyrillic 32/32, long is not re-run.)
CASES = {
    "qwen2-fp16-none": ["midword", "question", "cyrillic", "code", "cjk_emoji"],
    "llama3-w8a16-window": ["short", "midword", "question", "cyrillic", "code"],
    "llama3-fp16-past": ["short", "midword", "question", "code", "cyrillic", "cjk_emoji"],
    "qwen2-fp16-past-head_major": ["midword", "question", "cyrillic", "code", "long", "cjk_emoji"],
}
DEFAULT_CASES = ["short", "question", "code"]


def floor_for(fam: str, precision: str):
    """The per-case HF agreement floor, or None when it is reported only: random tiny weights
    leave near-tied logits that 8-bit weights reorder, so W8A16 is held to the bar on SmolLM2's
    real weights (QHX_REAL=full) and tiny W8A16 bundles show their fp32 margins instead."""
    if precision == "w8a16" and fam != "smollm2":
        return None
    return FLOOR[precision]


def one_json(stdout: str):
    """The JSON document, or None when stdout is not exactly one JSON document."""
    try:
        doc, end = json.JSONDecoder().raw_decode(stdout)
    except ValueError:
        return None
    return doc if not stdout[end:].strip() else None


def qhx(args, d, man, g, n, extra):
    cmd = [args.bin, man, args.htp, args.system, d, str(n), g["prompt"], "--ignore-eos", "--json", *extra]
    env = dict(os.environ, LD_LIBRARY_PATH=args.libdir)
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def ref_run(args, man, jobs, twin=False):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(jobs, f)
    try:
        cmd = [args.python, "-m", "qhx_export.verify.loop", man, "0", "--jobs", f.name]
        r = subprocess.run(cmd + (["--fp32-twin"] if twin else []), capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    doc = one_json(r.stdout) if r.returncode == 0 else None
    if doc is None:
        raise RuntimeError(f"qhx_export.verify.loop{' --fp32-twin' if twin else ''} failed (exit {r.returncode}): "
                           f"{r.stderr.strip().splitlines()[-3:]}")
    return doc


def reference(args, man, goldens):
    """The reference loop (qhx_export.verify.loop) over every case of one bundle (sessions loaded once): {case: (free or None,
    teacher-forced, fp32 twin's per-step top-2)}. The free run is done for the first case."""
    jobs = []
    for k, g in enumerate(goldens):
        if k == 0:
            jobs.append({"ids": g["input_ids"], "n": args.free})
        jobs.append({"ids": g["input_ids"], "n": len(g["gold_ids"]), "teacher": g["gold_ids"]})
    doc = ref_run(args, man, jobs)
    twin = ref_run(args, man, [j for j in jobs if "teacher" in j], twin=True)
    out, i = {}, 0
    for k, g in enumerate(goldens):
        free = None
        if k == 0:
            free, i = doc[i], i + 1
        out[g["case"]] = (free, doc[i], twin[k])
        i += 1
    return out


def run_case(args, d, man, g, free: bool):
    """qhx_generate on one golden: (free run or None, teacher-forced run)."""
    fr = qhx(args, d, man, g, args.free, []) if free else None
    gold = g["gold_ids"]
    tf = qhx(args, d, man, g, len(gold), ["--teacher-force", ",".join(map(str, gold))])
    return fr, tf


def parse(r, what):
    """(doc, error) of one qhx_generate --json run."""
    if r.returncode != 0:
        return None, f"{what}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"
    doc = one_json(r.stdout)
    if doc is None:
        return None, f"{what}: stdout is not exactly one JSON document: {r.stdout[-160:]!r}"
    return doc, None


SPEC_TOKENS, SPEC_DRAFT = 24, 8
# Bundles run only by the speculative case, with the prompt of this family's golden: the tiny
# random families never repeat a token in 32, so prompt lookup never drafts on them; a tied
# random model repeats its last token, so it drafts, and keeps its drafts.
SPEC_ONLY = {"llama3echo-fp16-past": ("llama3", "code")}


def spec_case(args, d, man, g):
    """--spec lookup on the real backend: qhx_generate's greedy ids (every draft verified, so
    the schedule does not depend on timing) against the reference loop on the same verify
    schedule (drafts checked by one prefill execute over the cache). Same binaries, same
    schedule: the ids must be equal; and at least one verify must have run."""
    r = qhx(args, d, man, g, SPEC_TOKENS, ["--spec", "lookup", "--spec-adaptive", "off", "--draft-max", str(SPEC_DRAFT)])
    doc, err = parse(r, "qhx --spec lookup")
    if err:
        return False, err
    try:
        ref = ref_run(args, man, [{"ids": g["input_ids"], "n": SPEC_TOKENS, "spec": SPEC_DRAFT}])[0]
    except RuntimeError as e:
        return False, str(e)
    got, want = doc["output_ids"], ref["output_ids"]
    sv = doc.get("spec", {}).get("verifies", 0)
    if got != want:
        return False, f"--spec ids differ from the reference's verify schedule at step {first_diff(got, want)}"
    if sv == 0 or sv != ref["verifies"]:
        return False, f"verifies: qhx {sv}, reference {ref['verifies']} (want equal and > 0)"
    return True, f"--spec lookup: {len(got)} ids equal the reference loop's verify schedule ({sv} verifies)"


def first_diff(a, b):
    return next(i for i, (x, y) in enumerate(zip(a + [None], b + [None])) if x != y)


def check(floor, g, runs, ref):
    """One golden through one real bundle: (ok, message)."""
    (rf, rt), (ref_free, ref_tf, twin) = runs, ref
    msgs = []
    if rf is not None:
        free, err = parse(rf, "free run")
        if err:
            return False, err
        if free["output_ids"] != ref_free:
            k = first_diff(free["output_ids"], ref_free)
            return False, f"free run differs from the ORT reference loop at step {k}: {free['output_ids'][k:k + 3]} vs {ref_free[k:k + 3]}"
        msgs.append(f"{len(ref_free)} free")
    tf, err = parse(rt, "teacher-forced run")
    if err:
        return False, err
    if tf["input_ids"] != g["input_ids"]:
        return False, f"input_ids differ: {tf['input_ids'][:12]} vs {g['input_ids'][:12]}"
    if tf["output_ids"] != ref_tf:
        k = first_diff(tf["output_ids"], ref_tf)
        return False, f"teacher-forced run differs from the ORT reference loop at step {k}: {tf['output_ids'][k:k + 3]} vs {ref_tf[k:k + 3]}"
    msgs.append(f"{len(ref_tf)} forced")
    res = parity.agreement(g, tf["output_ids"], "f16")
    gold = g["gold_ids"]
    # fp32 twin (the same float graphs on ORT's CPU EP): its margins where we differ from HF.
    twin_ok = twin["output_ids"] == gold
    margins = [f"step {s}: fp32 top-2 gap {t[1] - t[3]:.4f} at {t[1]:.2f}{' (our pick is its runner-up)' if got == t[2] else ''}"
               for s, (got, want, t) in enumerate(zip(tf["output_ids"], gold, twin["top2"])) if got != want]
    text = f"ids == ORT reference loop ({' + '.join(msgs)}); vs HF: {res['text']}"
    text += f"; fp32 twin {'reproduces HF' if twin_ok else 'DIFFERS from HF at step %d' % first_diff(twin['output_ids'], gold)}"
    if margins:
        text += "; " + "; ".join(margins)
    if floor is None:
        return True, text + " (floor reported only: tiny W8A16)"
    return res["rate"] >= floor, text + f"; floor {floor:.0%}"


def inspect_quant(args, d, m):
    """qhx_inspect on every quantized binary: each tensor whose QDQ model carried a scale/offset
    must be UFIXED_POINT_16 in the binary with exactly those params. (ok, message) or None."""
    real = m["source"]["real"]["graphs"]
    checked = 0
    for role, ent in real.items():
        if not ent.get("quant"):
            continue
        binf = os.path.join(d, m["artifacts"]["contexts"][role]["bin"])
        inspect = os.path.join(os.path.dirname(args.bin), "qhx_inspect")
        r = subprocess.run([inspect, "--json", "-", args.system, binf], capture_output=True, text=True,
                           env=dict(os.environ, LD_LIBRARY_PATH=args.libdir))
        doc = one_json(r.stdout) if r.returncode == 0 else None
        if doc is None:
            return False, f"qhx_inspect {binf}: exit {r.returncode}, stdout not one JSON document"
        (graph,) = doc["binaries"][0]["graphs"]
        tensors = {t["name"]: t for t in graph["inputs"] + graph["outputs"]}
        for name, (scale, offset) in ent["quant"].items():
            t = tensors.get(name)
            q = (t or {}).get("quant") or {}
            if not t or t["dtype"] != "UFIXED_POINT_16" or q.get("offset") != offset or \
                    abs(q.get("scale", 0) - scale) > 1e-6 * abs(scale):
                return False, f"{role} {name}: binary has {t and t['dtype']} {q}, the QDQ model had scale {scale} offset {offset}"
            checked += 1
    if not checked:
        return None
    return True, f"qhx_inspect: {checked} I/O tensors are UFIXED_POINT_16 with the QDQ model's scale/offset"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/qhx_generate"))
    ap.add_argument("--bundles", default=os.path.join(ROOT, "target/bundles/real"))
    ap.add_argument("--libdir", help="dir of libQnnHtp.so / libQnnSystem.so (default: scripts/qnn-libs.sh)")
    ap.add_argument("--python", help="python with onnxruntime-qnn (default: scripts/qnn-libs.sh --python)")
    ap.add_argument("--filter", default="")
    ap.add_argument("--exclude", default="", help="skip bundles whose name contains this (CI: smollm2)")
    ap.add_argument("--free", type=int, default=8, help="tokens of the free greedy run")
    ap.add_argument("--all-cases", action="store_true", help="every golden of the family, not the CI set")
    args = ap.parse_args()
    qnn = os.path.join(ROOT, "scripts/qnn-libs.sh")
    if not args.libdir:
        args.libdir = subprocess.run([qnn], capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    if not args.python:
        args.python = subprocess.run([qnn, "--python"], capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    args.htp = os.path.join(args.libdir, "libQnnHtp.so")
    args.system = os.path.join(args.libdir, "libQnnSystem.so")
    passed = failed = 0
    bundles = sorted(e for e in os.listdir(args.bundles) if os.path.isdir(os.path.join(args.bundles, e)))
    for b in bundles:
        d = os.path.join(args.bundles, b)
        if args.exclude and args.exclude in b:
            continue
        if b.startswith("genie-"):
            continue  # Genie-layout bundles (scripts/build-genie.sh): scripts/vs-genie.sh runs them
        # the exporter writes tokenizer.json and export-report.json beside the manifest
        mans = [p for p in glob.glob(os.path.join(d, "*.json"))
                if os.path.basename(p) not in ("tokenizer.json", "export-report.json")]
        if len(mans) != 1:
            print(f"FAIL real/{b}: {len(mans)} manifests in {d} (want exactly one)")
            failed += 1
            continue
        man = mans[0]
        m = json.load(open(man, encoding="utf-8"))
        if b in SPEC_ONLY:
            fam, case = SPEC_ONLY[b]
            g = json.load(open(os.path.join(ROOT, f"tests/goldens/parity/{fam}_{case}.json"), encoding="utf-8"))
            if args.filter in f"real/{b}/{case}":
                ok, why = spec_case(args, d, man, g)
                print(f"{'ok  ' if ok else 'FAIL'} real/{b}/{case}/spec: {why}", flush=True)
                passed += ok
                failed += not ok
            continue
        # The goldens' family is the directory's first word (qwen2, llama3, smollm2): the
        # manifest's source.family is the exporter's family class (llama for Llama-3 and SmolLM2).
        fam, precision = b.split("-")[0], m["source"]["real"]["precision"]
        names = None if args.all_cases else set(CASES.get(b, DEFAULT_CASES))
        goldens = []
        for path in sorted(glob.glob(os.path.join(ROOT, f"tests/goldens/parity/{fam}_*.json"))):
            g = json.load(open(path, encoding="utf-8"))
            if (names is None or g["case"] in names) and args.filter in f"real/{b}/{g['case']}":
                goldens.append(g)
        if not goldens:
            continue
        q = inspect_quant(args, d, m)
        if q is not None:
            print(f"{'ok  ' if q[0] else 'FAIL'} real/{b}/inspect: {q[1]}", flush=True)
            passed += q[0]
            failed += not q[0]
        t0 = time.monotonic()
        drift = {g["case"]: parity.weights_drift(man, g) for g in goldens}
        # The reference loop and qhx_generate share the 2 cores: one each.
        with ThreadPoolExecutor(max_workers=1) as pool:
            fut = pool.submit(reference, args, man, goldens)
            runs = {g["case"]: run_case(args, d, man, g, k == 0) for k, g in enumerate(goldens) if not drift[g["case"]]}
            try:
                refs = fut.result()
            except RuntimeError as e:
                for g in goldens:
                    print(f"FAIL real/{b}/{g['case']}: {e}")
                failed += len(goldens)
                continue
        for g in goldens:
            if drift[g["case"]]:
                ok, why = False, drift[g["case"]]
            else:
                ok, why = check(floor_for(fam, precision), g, runs[g["case"]], refs[g["case"]])
            print(f"{'ok  ' if ok else 'FAIL'} real/{b}/{g['case']}: {why}", flush=True)
            passed += ok
            failed += not ok
        print(f"real/{b}: {len(goldens)} cases in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
