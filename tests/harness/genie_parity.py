#!/usr/bin/env python3
"""Genie interop checks for scripts/test.sh, on the Genie bundles scripts/build-genie.sh writes:

  1. every bundle, every prompt: libGenie.so and qhx_generate give the same greedy ids (read
     from `scripts/vs-genie.sh --json`, which runs both live on the same binaries);
  2. a config whose kv-dim disagrees with the binaries' head dim: qhx_generate exits 1 with one
     line on stderr naming kv-dim (Genie's own check, kept);
  3. the config's sampler block: with no sampling flag, a sampling block gives the ids the
     same settings give as flags (and not the greedy ids), and `greedy: true` wins over its
     temp/top-k;
  4. `--bench -o json` on a Genie bundle: one llama-bench row per test (pp on the AR-N variant,
     tg on AR-1).

    genie_parity.py VS_GENIE_JSON QHX_GENERATE LIB_DIR BUNDLE_DIR...
Prints one line per case and `N passed, M failed` last.
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    vs, qhx, lib = sys.argv[1], sys.argv[2], sys.argv[3]
    bundles = sys.argv[4:]
    passed = failed = 0
    rows = json.load(open(vs, encoding="utf-8"))
    rows = rows["rows"] if isinstance(rows, dict) else rows
    if len(rows) != len(bundles):
        print(f"genie: vs-genie covered {len(rows)} bundles, expected {len(bundles)}")
        failed += 1
    for r in rows:
        g, h = r.get("genie", {}), r.get("qhx", {})
        if "error" in g or "error" in h:
            print(f"genie/{r['bundle']}: FAIL (genie: {g.get('error')}, qhx: {h.get('error')})")
            failed += 1
            continue
        if len(g["ids"]) < 5:
            print(f"genie/{r['bundle']}: FAIL (only {len(g['ids'])} prompts, want >= 5)")
            failed += 1
        x = r.get("ratio_qhx_over_genie", {})
        print(f"genie/{r['bundle']}: load ms {g['load_ms']:.0f} vs qhx {h['load_ms']:.0f}, "
              f"TTFT ms {g['ttft_ms']:.0f} vs {h['ttft_ms']:.0f}, tok/s {g['tok_s']:.2f} vs "
              f"{h['tok_s']:.2f} (simulator, not phone speed; qhx/Genie {x})")
        for i, (a, b) in enumerate(zip(g["ids"], h["ids"])):
            if a == b:
                passed += 1
                print(f"genie/{r['bundle']}/prompt{i}: ok ({len(a)} ids equal)")
            else:
                failed += 1
                k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"genie/{r['bundle']}/prompt{i}: FAIL first difference at step {k}: Genie {a[k:k+3]} qhx {b[k:k+3]}")
    # A kv-dim that disagrees with the binaries.
    src = bundles[0]
    with tempfile.TemporaryDirectory() as d:
        cfg = json.load(open(os.path.join(src, "genie_config.json"), encoding="utf-8"))
        htp = cfg["dialog"]["engine"]["backend"]["QnnHtp"]
        htp["kv-dim"] = int(htp.get("kv-dim", 64)) + 1
        path = os.path.join(d, "genie_config.json")
        json.dump(cfg, open(path, "w", encoding="utf-8"))
        env = dict(os.environ, LD_LIBRARY_PATH=lib)
        p = subprocess.run([qhx, path, f"{lib}/libQnnHtp.so", f"{lib}/libQnnSystem.so", src, "2", "hi"],
                           capture_output=True, text=True, env=env)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        ok = p.returncode == 1 and len(lines) == 1 and "kv-dim" in lines[0] and p.stdout == ""
        print(f"genie/bad-kv-dim: {'ok' if ok else 'FAIL'} (exit {p.returncode}: {lines})")
        passed, failed = passed + ok, failed + (not ok)
    p_, f_ = sampler_block(qhx, lib, src)
    passed, failed = passed + p_, failed + f_
    ok = bench_rows(qhx, lib, src)
    passed, failed = passed + ok, failed + (not ok)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def sampler_block(qhx: str, lib: str, src: str) -> tuple:
    """Case 3: the Genie config's sampler block drives qhx when no sampling flag is given."""
    env = dict(os.environ, LD_LIBRARY_PATH=lib)
    base = json.load(open(os.path.join(src, "genie_config.json"), encoding="utf-8"))
    prompt = "The capital of France is"

    def run(cfg_path, *flags):
        p = subprocess.run([qhx, cfg_path, f"{lib}/libQnnHtp.so", f"{lib}/libQnnSystem.so", src,
                            "16", prompt, "--ignore-eos", "--json", *flags],
                           capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(f"genie: {os.path.basename(cfg_path)} {' '.join(flags)}: exit {p.returncode}: "
                  f"{p.stderr.strip().splitlines()[-1:]}")
            return None, p.stderr
        return json.loads(p.stdout)["output_ids"], p.stderr

    def with_sampler(d, name, block):
        cfg = json.loads(json.dumps(base))
        cfg["dialog"]["sampler"] = block
        path = os.path.join(d, name)
        json.dump(cfg, open(path, "w", encoding="utf-8"))
        return path

    passed = failed = 0
    with tempfile.TemporaryDirectory() as d:
        sampling = with_sampler(d, "sampling.json", {"version": 1, "seed": 7, "temp": 0.8,
                                                     "top-k": 40, "top-p": 0.95})
        forced = with_sampler(d, "greedy.json", {"version": 1, "seed": 7, "temp": 0.8,
                                                 "top-k": 40, "top-p": 0.95, "greedy": True})
        greedy, _ = run(os.path.join(src, "genie_config.json"), "--temp", "0")
        from_block, err = run(sampling)
        from_flags, _ = run(os.path.join(src, "genie_config.json"), "--temp", "0.8", "--top-k",
                            "40", "--top-p", "0.95", "--seed", "7")
        ok = (greedy is not None and from_block is not None and from_block == from_flags
              and from_block != greedy and "sampling as" in err)
        print(f"genie/sampler-block: {'ok' if ok else 'FAIL'} (block {from_block}, flags "
              f"{from_flags}, greedy {greedy})")
        passed, failed = passed + ok, failed + (not ok)
        forced_ids, _ = run(forced)
        ok = greedy is not None and forced_ids == greedy
        print(f"genie/sampler-greedy-wins: {'ok' if ok else 'FAIL'} ({forced_ids} vs greedy {greedy})")
        passed, failed = passed + ok, failed + (not ok)
    return passed, failed


def bench_rows(qhx: str, lib: str, src: str) -> bool:
    """--bench on a Genie bundle: llama-bench rows for pp (AR-N variant) and tg (AR-1)."""
    env = dict(os.environ, LD_LIBRARY_PATH=lib)
    p = subprocess.run([qhx, os.path.join(src, "genie_config.json"), f"{lib}/libQnnHtp.so",
                        f"{lib}/libQnnSystem.so", src, "--bench", "-p", "6", "-n", "3", "-r", "2",
                        "-o", "json"], capture_output=True, text=True, env=env)
    why = f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"
    if p.returncode == 0:
        try:
            rows = json.loads(p.stdout)
            tests = [(r["n_prompt"], r["n_gen"]) for r in rows]
            good = (tests == [(6, 0), (0, 3)]
                    and all(r["model_type"].endswith("(genie)") and r["avg_ts"] > 0
                            and len(r["samples_ns"]) == 2 and r["model_size"] > 0 for r in rows))
            why = f"tests {tests}, t/s {[round(r['avg_ts'], 2) for r in rows]}, I/O {rows[0]['io_type']}"
            if good:
                print(f"genie/bench: ok ({why})")
                return True
        except (ValueError, KeyError, TypeError) as e:
            why = f"bad JSON rows: {e}"
    print(f"genie/bench: FAIL ({why})")
    return False


if __name__ == "__main__":
    sys.exit(main())
