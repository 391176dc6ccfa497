#!/usr/bin/env bash
# merge.sh <bench.json>... : one table over the `--bench -o json` row arrays of many devices
# (or `--json` for one merged array of rows).
set -euo pipefail
python3 - "$@" <<'PY'
import json, sys
args = [a for a in sys.argv[1:] if a != "--json"]
rows = []
for p in args:
    if p.endswith(".parity.json"):
        continue
    try:
        with open(p) as f:
            rows.extend(json.load(f))
    except (OSError, ValueError, TypeError) as e:
        print(f"merge: skipping {p}: {e}", file=sys.stderr)
if "--json" in sys.argv:
    print(json.dumps(rows))
    sys.exit(0)
print("| serial | soc | arch | model | perf | I/O | test | t/s |")
print("| --- | --- | --- | --- | --- | --- | --- | ---: |")
for r in rows:
    test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    print(f"| {r.get('serial', '?')} | {r.get('soc_model')} | v{r.get('dsp_arch')} | {r.get('model_type')} "
          f"| {r.get('perf_mode')} | {r.get('io_type')} {r.get('io_mode')} | {test} "
          f"| {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |")
PY
