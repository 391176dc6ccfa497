#!/usr/bin/env bash
# merge.sh <bench.json>... : one table over the --bench --json documents of many devices
# (or `--json` for one merged array).
set -euo pipefail
python3 - "$@" <<'PY'
import json, sys
args = [a for a in sys.argv[1:] if a != "--json"]
docs = []
for p in args:
    if p.endswith(".parity.json"):
        continue
    try:
        with open(p) as f:
            docs.append(json.load(f))
    except (OSError, ValueError) as e:
        print(f"merge: skipping {p}: {e}", file=sys.stderr)
if "--json" in sys.argv:
    print(json.dumps(docs))
    sys.exit(0)
print("| serial | soc | arch | model | perf | mem | test | t/s | ms/tok |")
print("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: |")
for d in docs:
    dev = d.get("device", {})
    for r in d.get("results", []):
        print(f"| {d.get('serial','?')} | {dev.get('soc_model')} | v{dev.get('dsp_arch')} | {d.get('model')} "
              f"| {d.get('perf_mode')} | {d.get('io_mode')} | {r['test']} "
              f"| {r['mean_tok_s']:.2f} ± {r['stddev_tok_s']:.2f} | {r['ms_per_tok']:.3f} |")
PY
