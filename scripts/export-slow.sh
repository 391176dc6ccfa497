#!/usr/bin/env bash
# The exporter's slow end-to-end tests (export/tests, marker `slow`): SmolLM2-135M (real weights,
# the cached GGUF) exported for v75 fp16, v79 w8a16 and v81 w4a16, each compiled by
# onnxruntime-qnn and run by qhx_generate on the x86 HTP simulator (--verify: 2 prompts x 8
# steps against the float reference, ids equal to the ORT loop over the same binaries).
# Minutes each on 2 cores; run niced, one at a time (pytest runs them in order).
#
#   scripts/export-slow.sh [PYTEST ARGS...]        e.g. -k w8a16
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=$("$root/scripts/qnn-libs.sh" --python | tail -n 1)
"$root/scripts/qhx-export.sh" --version >/dev/null  # installs export/ into the venv on first use
[[ -x "${QHX_GENERATE:-$root/target/release/qhx_generate}" ]] ||
    { echo "export-slow: build qhx_generate first (cargo build --release)" >&2; exit 1; }
cd "$root/export"
exec nice -n 10 "$py" -m pytest -m slow -q --durations=0 tests "$@"
