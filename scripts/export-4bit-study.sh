#!/usr/bin/env bash
# Issue 30's studies of 4-bit weights (outside CI), each a module of benches/studies/:
#
#   scripts/export-4bit-study.sh matmul OUT [--islands add,dq,flag,qadd] [--json]
#       one MatMul per weight form under the cost model (Hextimate, soc 72; a minute or two)
#   scripts/export-4bit-study.sh layer GRAPH.qdq.onnx OUT [--forms as-is,int4,none,kv-direct,...]
#       an exported QDQ graph with its weights rewritten into each form (or parts cut away)
#   scripts/export-4bit-study.sh methods [--model smollm2|gemma3] [--methods ...] [--rotate ...]
#       the --quant-method / --rotate choices on the CPU (numpy forward vs the parity goldens)
#
# Cost-model figures are estimates for a v81-class HTP, never phone measurements.
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
study=${1:-}
shift || true
case $study in
matmul) mod=studies.matmul_speed ;;
layer) mod=studies.layer_speed ;;
methods) mod=studies.quant_methods ;;
*)
    echo "export-4bit-study: first argument: matmul, layer or methods" >&2
    exit 2
    ;;
esac
export_env export-4bit-study smollm2 gemma3
exec nice -n 10 "$py" -m "$mod" "$@"
