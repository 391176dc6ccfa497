#!/usr/bin/env bash
# Run every fuzz target (tests/fuzz) for a fixed number of executions with cargo-fuzz /
# libFuzzer + AddressSanitizer, and report executions, executions/s and crashes per target.
#
#   scripts/fuzz.sh [runs_per_target=100000] [target...]
#   FUZZ_SECONDS=n also stops each target after n seconds (whichever comes first).
#   FUZZ_MAX_LEN=n caps input length (libFuzzer's -max_len; default: its own growth).
#
# cargo-fuzz needs nightly rustc flags; on a stable toolchain this sets RUSTC_BOOTSTRAP=1
# (the fuzz crate is outside the main workspace, so nothing else is built that way).
# Installs cargo-fuzz from crates.io when missing. Seeds come from the emulator's bundle
# writer (tests/fuzz/src/bin/seeds.rs); findings land in tests/fuzz/artifacts/<target>/.
# Per-input leak checks are off by default (FUZZ_LEAKS=1 turns them on): they cost ~3 ms
# per execution whenever a run's malloc and free counts differ (library caches do), and
# leaks are covered by scripts/valgrind.sh and the RSS test. ASan still checks every access.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100000}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(manifest emu_format binary_info embed prompt genie_config server_request)

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# The targets that need the QNN ABI dlopen this (uninstrumented) emulator build.
cargo build --release -p qnn-emu --quiet
export QHX_FUZZ_EMU="$PWD/target/release/libqnn_emu.so"
export QNN_EMU_THREADS=1
export RUSTC_BOOTSTRAP=1
fz=(--fuzz-dir tests/fuzz)
cargo fuzz build "${fz[@]}" --release >&2
tests/fuzz/target/x86_64-unknown-linux-gnu/release/seeds tests/fuzz/corpus >&2
cd tests/fuzz

total_fail=0
summary=()
for t in "${targets[@]}"; do
    log="target/fuzz-$t.log"
    mkdir -p target "artifacts/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    set +e
    (cd ../.. && cargo fuzz run "${fz[@]}" --release "$t" "tests/fuzz/corpus/$t" \
        -- -artifact_prefix="tests/fuzz/artifacts/$t/" -runs="$runs" -rss_limit_mb=2048 \
        -malloc_limit_mb=1024 -timeout=10 -detect_leaks="${FUZZ_LEAKS:-0}" -max_total_time="${FUZZ_SECONDS:-0}" \
        -print_final_stats=1 ${FUZZ_MAX_LEN:+-max_len=$FUZZ_MAX_LEN}) > "$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -E '^stat::number_of_executed_units:' "$log" | awk '{print $2}' | tail -n1 || true)
    secs=$(grep -E '^Done [0-9]+ runs in' "$log" | awk '{print $5}' | tail -n1 || true)
    after=$(find "artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    if [[ $rc -ne 0 && $crashes -eq 0 ]]; then crashes="? (exit $rc, see tests/fuzz/$log)"; fi
    [[ $rc -eq 0 ]] || total_fail=1
    rate=$(grep -E '^stat::average_exec_per_sec:' "$log" | awk '{print $2}' | tail -n1 || true)
    line="$t: ${execs:-0} executions in ${secs:-?} s (${rate:-?} exec/s), crashes: $crashes"
    summary+=("$line")
    echo "fuzz $line" >&2
done
printf '%s\n' "${summary[@]}"
exit $total_fail
