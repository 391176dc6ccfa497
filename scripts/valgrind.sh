#!/usr/bin/env bash
# One end-to-end generation (tiny synthetic bundle, real emulator math, prefill + decode +
# lm-head) under valgrind memcheck. Fails on any memcheck error or definite/indirect leak.
# Prints valgrind's error and leak summary.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release --workspace --quiet
cargo build --release -p qnn-emu --example write_bundle --quiet
dir=target/valgrind/tiny
rm -rf "$dir"
manifest=$(target/release/examples/write_bundle "$dir")
lib=target/release/libqnn_emu.so
log=target/valgrind/memcheck.log
export QNN_EMU_THREADS=1
set +e
valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --log-file="$log" \
    target/release/qhx_generate "$manifest" "$lib" "$lib" "$dir" 12 'Hello valgrind' \
    > target/valgrind/stdout.txt 2> target/valgrind/stderr.txt
rc=$?
set -e
grep -E "ERROR SUMMARY|definitely lost|indirectly lost|possibly lost|still reachable|in use at exit|total heap usage" "$log" | sed 's/^==[0-9]*== *//'
echo "stats: $(grep finish= target/valgrind/stderr.txt)"
if [[ $rc -ne 0 ]]; then
    echo "valgrind.sh: exit $rc (see $log)" >&2
    exit 1
fi
echo "valgrind.sh: clean"
