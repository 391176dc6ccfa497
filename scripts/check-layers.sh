#!/usr/bin/env bash
# The import floors (issue 31): fails when a file of src/, capi/src/ or export/qhx_export imports
# in a circle, or a file of the qhx library imports from a floor above its own (the floor
# table and the rules are in tests/harness/check_layers.py; stdlib python3 only).
#
#   scripts/check-layers.sh              check this checkout
#   scripts/check-layers.sh --self-test  also show that the check fails on a copy of src/
#                                        with an upward import and with a circle planted in it
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check="$root/tests/harness/check_layers.py"

python3 "$check" "$root"
[[ "${1:-}" == "--self-test" ]] || exit 0

tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
plant() {  # plant <what> <expected report> (<file> <line>)...: a copy with each <line> added
    local what=$1 want=$2
    shift 2
    rm -rf -- "${tmp:?}/t"
    mkdir -p "$tmp/t/export"
    cp -r "$root/src" "$root/capi" "$tmp/t/"
    cp -r "$root/export/qhx_export" "$tmp/t/export/"
    while (($#)); do
        printf '%s\n' "$2" >>"$tmp/t/$1"
        shift 2
    done
    local out
    if out=$(python3 "$check" "$tmp/t" 2>&1); then
        echo "check-layers: self-test: $what was not caught" >&2
        exit 1
    fi
    grep -q "$want" <<<"$out" || { echo "check-layers: self-test: $what: unexpected report: $out" >&2; exit 1; }
}
plant "an upward import (error.rs -> engine)" "error.rs (floor leaves) imports src/engine.rs" \
    src/error.rs 'use crate::engine::Engine;'
plant "a circle (sampler.rs <-> stop.rs)" "import circle in src/ between 2 files" \
    src/sampler.rs 'use crate::stop::StopMatcher;' src/stop.rs 'use crate::sampler::SamplerConfig;'
plant "a Python circle (cache.py <-> write/htp.py)" "import circle in export/qhx_export/" \
    export/qhx_export/cache.py 'import qhx_export.write.htp'
echo "check-layers: self-test: an upward import and circles in Rust and Python are each caught" >&2
