#!/usr/bin/env bash
# The seed design (W8A16 everywhere, fp16 lm-head) against ours (the exporter's W4A16 defaults)
# on the Llama-3.2-1B per-layer shape, random weights, in one run: µs per layer, lm-head µs,
# ms/token at 16 layers, the GB/s each graph's weights imply, and the ratio (issue 30). The
# figures are Qualcomm's cost model (Hextimate, soc 72), not phone measurements. A few minutes.
#
#   scripts/export-design-ratio.sh [--layers N] [--json] [--ours "QHX-EXPORT OPTIONS"]
#                                                      (results: target/design-ratio/)
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
export_env export-design-ratio llama3tok
exec nice -n 10 "$py" -m studies.design_ratio "$root/target/design-ratio" "$@"
