#!/usr/bin/env bash
# Random-weight exports of the seed bundles' shapes (issue "qhx-export", outside CI: about an
# hour on 2 cores): Llama-3.2-1B W8A16 and W4A16 (v79, AR=128, C=512, as the seed card) and
# DeepSeek-R1-Distill-Qwen-1.5B fp16 (v81, C=1024). Per bundle: export wall time and peak RSS,
# file sizes, Hextimate estimates per graph (soc 72; the Llama W8A16 run also estimates verify
# graphs of 2, 4, 8 and 16 rows for speculative decoding), and qhx_generate on the x86 HTP
# simulator for a prompt + 2 decode steps with ids equal to the ORT loop over the same binaries.
#
#   scripts/export-seed-shapes.sh [--only TAG ...] [--layers N]     (results: target/seed-shapes/)
#
# --layers N cuts every shape to N layers (a quick check of the pipeline). The random
# checkpoints are cached under $QHX_CACHE/seed (2.5 and 3.5 GB).
set -euo pipefail
source "$(dirname "$0")/export-env.sh"
export_env export-seed-shapes llama3tok dsr1
exec nice -n 10 "$py" -m studies.seed_shapes "$root/target/seed-shapes" "$@"
