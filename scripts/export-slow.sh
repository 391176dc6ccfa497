#!/usr/bin/env bash
# The exporter's slow end-to-end tests (export/tests, marker `slow`): SmolLM2-135M (real weights,
# the cached GGUF) exported for v75 fp16, v79 w8a16 and v81 w4a16, each compiled by
# onnxruntime-qnn and run by qhx_generate on the x86 HTP simulator (--verify: 2 prompts x 8
# steps against the float reference, ids equal to the ORT loop over the same binaries).
# Minutes each on 2 cores; run niced, one at a time (pytest runs them in order).
#
#   scripts/export-slow.sh [PYTEST ARGS...]        e.g. -k w8a16
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
export_env export-slow smollm2
cd "$root/export"
exec nice -n 10 "$py" -m pytest -m slow -q --durations=0 tests "$@"
