#!/usr/bin/env bash
# Host overhead per decode step on synthetic null-compute bundles (DeepSeek-1.5B-like and
# Llama-1B-like, f16 and ufixed16 I/O, C in 512/1024/4096, greedy and top-k/top-p), plus the
# cold start (manifest + tokenizer + embed mmap + binary info). Prints a table, or with
# --json one JSON array (stdout carries nothing else: the harness keeps fd 1 from the QNN
# library's banner, as qhx_generate does), and the structured-output mask work per token at
# V = 151,936 (llguidance; goal p99 <= 0.3 ms). Bundles are cached in target/bundles/host-overhead/.
#   scripts/host-overhead.sh [--json] [--steps N] [--shape deepseek-1.5b|llama-1b|tiny]
# (tiny: a small shape that checks the harness in seconds; tests/host_overhead.rs runs it.)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
cargo build --release -p qnn-emu --quiet >&2
# The grammar-mask row runs on the DeepSeek-R1-Distill tokenizer (V = 151,936 rows).
tok="$(scripts/build-parity.sh)/tok/deepseek-r1-distill.json"
cargo bench --quiet --bench host_overhead -- --mask-tokenizer "$tok" "$@"
