#!/usr/bin/env bash
# fleet.sh <bundle_dir> <manifest_name> [gold.json] : on every device (ANDROID_SERIALS or
# `adb devices`), in parallel: push, parity (when a gold file is given), bench. Results go
# to results/<serial>.json; merge.sh prints one table. NOT VERIFIED ON HARDWARE.
source "$(dirname "$0")/common.sh"
here=$(dirname "$0")
bundle=$1 manifest=$2 gold=${3:-}
mkdir -p results
pids=()
for s in $(serials); do
    (
        "$here/push.sh" "$s" "$bundle"
        if [[ -n "$gold" ]]; then
            "$here/parity.sh" "$s" "$manifest" "$gold" 'The capital of France is' > "results/$s.parity.json" ||
                echo "$s: parity failed (exit $?)" >&2
        fi
        "$here/bench.sh" "$s" "$manifest" > "results/$s.json"
    ) > "results/$s.log" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
"$here/merge.sh" results/*.json
exit $rc
