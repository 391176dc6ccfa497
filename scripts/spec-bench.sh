#!/usr/bin/env bash
# Speculative decoding on the task set (benches/studies/spec-tasks.json: code edits, a summary, a
# question about a document, a free story) with SmolLM2's real weights on the emulator, in every
# mode: --spec lookup, --spec lookahead, and --spec draft with the same weights exported at f16
# I/O as the draft bundle (so nearly every draft agrees: the emulator has no W4A16; the draft's
# cost is SmolLM2 W4A16's estimate, the natural draft on a phone). Tokens per verify, decode executes per token, and the speedup estimated from Qualcomm's
# cost model, not from emulator time (benches/studies/spec_bench.py says how). Outside CI.
#   scripts/spec-bench.sh [--json]
# The estimate comes from the exporter: SmolLM2 fp16 for the HTP with an 8-row graph over
# the cache (the demo bundle's verify shape), --estimate (Hextimate, soc_model 72); the
# export is cached in target/spec-bench/ (about 2 minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python harness (tests/), the studies (benches/) and the exporter package, by module name.
export PYTHONPATH="$PWD/tests:$PWD/benches:$PWD/export${PYTHONPATH:+:$PYTHONPATH}"
export CARGO_TERM_COLOR=never
cargo build --release --workspace --quiet >&2
bundle=$(scripts/build-bundle.sh)
cache=$(scripts/fetch-assets.sh smollm2 | tail -n 1)
gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
est=target/spec-bench/estimate-ar8
if [[ ! -f $est/export-report.json ]]; then
    echo "spec-bench: Hextimate of SmolLM2's 8-row and decode graphs (qhx-export --estimate)" >&2
    mkdir -p target/spec-bench
    scripts/qhx-export.sh "$gguf" --target htp --precision fp16 --prefill past --ar 8 --ctx 512 \
        --estimate -o "$est" --force >&2
fi
draft=target/spec-bench/draft-f16
if [[ ! -f $draft/smollm2d.json || $draft/smollm2d.json -ot $gguf ]]; then
    echo "spec-bench: the draft bundle (SmolLM2 at f16 I/O, --target emu)" >&2
    scripts/qhx-export.sh "$gguf" --target emu --io f16 --embed-dtype f16 --name smollm2d \
        --model-name smollm2-135m-instruct-f16io -o "$draft" --force >&2
fi
dest=target/spec-bench/estimate-w4a16
if [[ ! -f $dest/export-report.json ]]; then
    echo "spec-bench: Hextimate of SmolLM2 W4A16's decode and lm-head (the draft's cost)" >&2
    scripts/qhx-export.sh "$gguf" --target htp --precision w4a16 --quant-method rtn --ctx 512 \
        --estimate-only -o "$dest" --force >&2
fi
python3 -m studies.spec_bench --generate target/release/qhx_generate --lib target/release/libqnn_emu.so \
    --manifest "$bundle/smollm2.json" --tasks benches/studies/spec-tasks.json \
    --estimate "$est/export-report.json" --draft "$draft/smollm2d.json" \
    --draft-estimate "$dest/export-report.json" "$@"
