#!/usr/bin/env bash
# parity.sh <serial> <manifest_name> <gold.json|ids> <prompt> : greedy parity run on one
# device; exit 3 on the first divergence (qhx_generate --expect-tokens). The gold file is
# pushed next to the bundle. NOT VERIFIED ON HARDWARE.
source "$(dirname "$0")/common.sh"
serial=$1 manifest=$2 gold=$3 prompt=$4
if [[ -f "$gold" ]]; then
    adb -s "$serial" push "$gold" "$REMOTE/bundle/gold.json" >&2
    gold=bundle/gold.json
fi
adb -s "$serial" shell "$(remote_env) && ./qhx_generate bundle/$manifest libQnnHtp.so libQnnSystem.so bundle 1 '$prompt' --json --expect-tokens $gold"
