#!/usr/bin/env bash
# Quality of exported SmolLM2-135M bundles (issue "qhx-export", outside CI: ~30 min on 2 cores):
# fp16 / w8a16 / w4a16, teacher-forced top-1 agreement with HF transformers fp32 on the 8 parity
# prompts x 32 tokens (tests/goldens/parity/smollm2_*.json), weight bytes per decode token, and
# the cost model's decode ms/token (Hextimate, soc 72: an estimate, not a phone figure). The
# table runs each bundle's graphs on ORT's CPU EP; qhx_generate on the x86 HTP simulator runs the
# first 2 prompts the same way and must agree with that CPU loop on >= 95 % of the steps.
#
#   scripts/export-quality.sh [--precision fp16 w8a16 w4a16] [--sim-prompts N] [--reuse]
#                                                         (results: target/export-quality/)
#   scripts/export-quality.sh --model gemma3 --precision fp16 w8a16 --sim-prompts 2 --sim-tokens 8
#       Gemma-3-270M (Q4_K_M GGUF) against tests/goldens/parity/gemma3_*.json
#                                                         (results: target/export-quality/gemma3/)
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
model=smollm2
prev=
for a in "$@"; do
    [[ $prev == --model ]] && model=$a
    [[ $a == --model=* ]] && model=${a#--model=}
    prev=$a
done
export_env export-quality "$model"
exec nice -n 10 "$py" -m studies.export_quality "$root/target/export-quality" "$@"
