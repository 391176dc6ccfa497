#!/usr/bin/env bash
# bench.sh <serial> <manifest_name> [extra --bench flags, e.g. -p 128,512 -n 128 -r 5] :
# qhx_generate --bench -o json on one device; prints its JSON array of llama-bench rows with
# the serial added to each. NOT VERIFIED ON HARDWARE.
source "$(dirname "$0")/common.sh"
serial=$1 manifest=$2
shift 2
# -q: adb shell merges stderr into stdout, so no banner may reach the JSON.
adb -s "$serial" shell "$(remote_env) && ./qhx_generate bundle/$manifest libQnnHtp.so libQnnSystem.so bundle --bench -q -o json $*" |
    python3 -c 'import json,sys; rows=json.load(sys.stdin); [r.update(serial=sys.argv[1]) for r in rows]; print(json.dumps(rows))' "$serial"
