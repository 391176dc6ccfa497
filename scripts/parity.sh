#!/usr/bin/env bash
# Parity suite: every golden in tests/goldens/parity (HF transformers fp32 greedy) through the
# real qhx_generate binary, f32 and f16 I/O bundles. Prints 'N passed, M failed'. No torch needed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --quiet
scripts/build-parity.sh >/dev/null
exec python3 scripts/parity.py "$@"
