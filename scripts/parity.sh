#!/usr/bin/env bash
# Parity suite: every golden in tests/goldens/parity (HF transformers fp32 greedy) through the
# real qhx_generate binary, f32 and f16 I/O bundles. Prints 'N passed, M failed'. No torch needed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python harness (tests/), the studies (benches/) and the exporter package, by module name.
export PYTHONPATH="$PWD/tests:$PWD/benches:$PWD/export${PYTHONPATH:+:$PYTHONPATH}"
cargo build --release --workspace --quiet
scripts/build-parity.sh >/dev/null
exec python3 -m harness.parity "$@"
