#!/usr/bin/env bash
# Gemma-3-270M fp16 (real weights) on the real QNN backend against the HF goldens: the exporter's
# test marked `gemma_real` (export/tests/test_htp_goldens.py). The cached Q4_K_M GGUF exported
# --target htp --precision fp16 --arch v79 --ar 16 --ctx 512, run by qhx_generate on the x86 HTP
# simulator teacher-forced for 4 steps on the two shortest golden prompts: agreement >= 98 % each,
# ids equal to the ORT loop over the same binaries. A few minutes on 2 cores (export, then
# ~10-20 s a step, twice). Prints pytest's summary (with the test's ids, agreement and timings);
# the exit status is pytest's.
#
#   scripts/real-gemma.sh [PYTEST ARGS...]
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
export_env real-gemma gemma3
cd "$root/export"
exec "$py" -m pytest -p no:cacheprovider -m gemma_real -rA --durations=0 tests/test_htp_goldens.py "$@"
