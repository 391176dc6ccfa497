#!/usr/bin/env bash
# The exporter end to end on real weights, sized for CI (export/tests/test_htp.py, marker `e2e`):
# SmolLM2-135M (the cached GGUF) exported --target htp for v75 fp16, v79 w8a16 (64 calibration
# decode steps) and v81 w4a16, each compiled by onnxruntime-qnn and run by qhx_generate on the
# x86 HTP simulator on 2 prompts x 4 steps teacher-forced on the float reference (--verify).
# scripts/test.sh runs it in its background real-backend stage; scripts/export-slow.sh has the
# full-size versions. Prints pytest's summary; the exit status is pytest's.
#
#   scripts/export-e2e.sh [PYTEST ARGS...]
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
export_env export-e2e smollm2
cd "$root/export"
exec "$py" -m pytest -p no:cacheprovider -m e2e -rA --durations=0 tests/test_htp.py "$@"
