#!/usr/bin/env bash
# Load a bundle N times in a row, each in a fresh process on the real QNN backend (one
# token each), and count crashes: a process killed by a signal or exiting with a code other
# than 0. Context creation crashed intermittently on the x86 HTP backend when contexts were
# created on parallel threads; this is the check that the default load path survives.
#
#   scripts/load-stress.sh [N] [BUNDLE_DIR] [extra qhx_generate flags...]
#
# N defaults to 200; BUNDLE_DIR to the W8A16 AR-prefill bundle (three binaries) under
# target/bundles/real. Prints `loads: N, crashes: C` as its last line; exits 1 on a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
dir=${2:-target/bundles/real/llama3-w8a16-window}
shift $(( $# > 2 ? 2 : $# ))
lib=$(scripts/qnn-libs.sh | tail -n 1)
manifest=$(ls "$dir"/*.json)
bin=target/release/qhx_generate
[[ -x $bin ]] || cargo build --release --quiet
crashes=0
declare -A codes=()
err=$(mktemp)
trap 'rm -f "$err"' EXIT
t0=$(date +%s)
for ((i = 1; i <= n; i++)); do
    rc=0
    LD_LIBRARY_PATH=$lib "$bin" "$manifest" "$lib/libQnnHtp.so" "$lib/libQnnSystem.so" "$dir" 1 a \
        "$@" >/dev/null 2>"$err" || rc=$?
    if [[ $rc -ne 0 ]]; then
        crashes=$((crashes + 1))
        codes[$rc]=$(( ${codes[$rc]:-0} + 1 ))
        printf 'load-stress: run %d exited %d: %s\n' "$i" "$rc" "$(tail -n 1 "$err")" >&2
    fi
    (( i % 50 == 0 )) && printf 'load-stress: %d/%d runs, %d crashes\n' "$i" "$n" "$crashes" >&2
done
printf 'load-stress: %d runs in %d s (%s)\n' "$n" $(( $(date +%s) - t0 )) "${*:-default flags}" >&2
for c in "${!codes[@]}"; do printf 'load-stress: exit %s x %s\n' "$c" "${codes[$c]}" >&2; done
echo "loads: $n, crashes: $crashes"
[[ $crashes -eq 0 ]]
