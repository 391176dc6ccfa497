#!/usr/bin/env bash
# What qhx_server adds per request: the same request through a Session (qhx_generate's path)
# and through HTTP + SSE, interleaved in one process on a null-compute synthetic bundle;
# medians of TTFT and ms/token and their differences (targets: <= 2 ms, <= 0.1 ms). Host
# figures, not phone figures.
#   scripts/server-overhead.sh [--json] [--rounds N] [--tokens N] [--shape llama-1b|deepseek-1.5b|tiny]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
cargo build --release -p qnn-emu --quiet >&2
cargo bench --quiet -p qhx-server --bench overhead -- "$@"
