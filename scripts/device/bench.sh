#!/usr/bin/env bash
# bench.sh <serial> <manifest_name> [extra qhx_generate flags] : qhx_generate --bench --json
# on one device; prints the JSON document with the serial added. NOT VERIFIED ON HARDWARE.
source "$(dirname "$0")/common.sh"
serial=$1 manifest=$2
shift 2
adb -s "$serial" shell "$(remote_env) && ./qhx_generate bundle/$manifest libQnnHtp.so libQnnSystem.so bundle 1 'The capital of France is' --bench --json $*" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); d["serial"]=sys.argv[1]; print(json.dumps(d))' "$serial"
