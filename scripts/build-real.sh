#!/usr/bin/env bash
# Build every real-HTP bundle (scripts/make_real.py: ONNX graphs compiled into QNN context
# binaries by onnxruntime's QNN EP) into target/bundles/real/<family>-<variant>/, one manifest
# per directory, and print target/bundles/real as the last line. Idempotent: a bundle is
# rebuilt only when the hash of its inputs (writer scripts, weights source, tokenizer, venv
# pins, options) differs from the one recorded in its .inputs-sha256.
#
#   qwen2-fp16-none                 tiny Qwen2 + DeepSeek-R1-Distill tokenizer, fp16, decode over
#                                   the prompt, no prefill graph (the DeepSeek v81 seed's shape)
#   llama3-w8a16-window             tiny Llama-3 (llama3 RoPE) + Llama-3 tokenizer, W8A16 (QDQ,
#                                   calibrated), AR=16 prefill window + decode + lm-head, ufixed16 I/O
#   llama3-fp16-past                tiny Llama-3, fp16, chunked prefill (P=16) reading the cache
#   qwen2-fp16-past-head_major      tiny Qwen2, fp16, chunked prefill (P=16) with past inputs
#                                   and head-major K/V
#   QHX_REAL=full adds:
#   smollm2-fp16-window             SmolLM2-135M-Instruct real weights, fp16, AR=64 window (slow)
#   smollm2-w8a16-window            the same, W8A16 (calibrated on the SmolLM2 goldens) with the
#                                   residual adds and RMSNorms in fp16 (--float-residual)
#   scripts/build-real.sh NAME...   builds only the named bundles (any of the above)
set -euo pipefail
cd "$(dirname "$0")/.."
par=$(scripts/build-parity.sh)            # tokenizers (DeepSeek's from GGUF metadata)
cache=$(scripts/fetch-assets.sh smollm2 llama3tok dsr1 | tail -n 1)
scripts/qnn-libs.sh >/dev/null
py=$(scripts/qnn-libs.sh --python 2>/dev/null | tail -n 1)
out=target/bundles/real
mkdir -p "$out"
dstok="$PWD/$par/tok/deepseek-r1-distill.json"
l3tok="$cache/assets/llama3tok/tokenizer.json"
gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
smoltok="$PWD/$par/smollm2-f16/tokenizer.json"
pins=$(grep -E '^PINS=' scripts/qnn-libs.sh)

built=()
only=" $* "
# build DIR ARGS...: make_real.py into DIR unless its recorded input hash matches.
build() {
    local d="$out/$1"
    built+=("$1")
    if [[ $only != "  " && $only != *" $1 "* ]]; then
        return
    fi
    shift
    local key
    key=$({
        printf '%s\n' "$pins" "$*"
        cat scripts/make_real.py scripts/real_graphs.py scripts/real_ref.py scripts/make_bundle.py scripts/tiny_models.py
        for a in "$@"; do if [[ -f $a ]]; then sha256sum <"$a"; fi; done
    } | sha256sum | cut -d' ' -f1)
    if [[ -f $d/.inputs-sha256 && $(cat "$d/.inputs-sha256") == "$key" ]] && compgen -G "$d/*.json" >/dev/null; then
        echo "build-real: $d up to date" >&2
        return
    fi
    echo "build-real: $d" >&2
    local t0=$SECONDS
    rm -f "$d/.inputs-sha256"
    "$py" scripts/make_real.py --out "$d" "$@" >&2
    printf '%s' "$key" >"$d/.inputs-sha256"
    echo "build-real: $d built in $((SECONDS - t0))s" >&2
}

calib=(tests/goldens/parity/llama3_{short,code,question}.json)
build qwen2-fp16-none --family qwen2 --tokenizer "$dstok" --prefill none --ctx 256
build llama3-w8a16-window --family llama3 --tokenizer "$l3tok" --precision w8a16 --prefill window \
    --prefill-len 16 --ctx 256 --calib "${calib[@]}"
build llama3-fp16-past --family llama3 --tokenizer "$l3tok" --prefill past --prefill-len 16 --ctx 256
build qwen2-fp16-past-head_major --family qwen2 --tokenizer "$dstok" --prefill past \
    --kv-layout head_major --prefill-len 16 --ctx 256
# For --spec on the real backend (real_parity.py's verify-schedule case).
build llama3echo-fp16-past --family llama3echo --tokenizer "$l3tok" --prefill past --prefill-len 16 --ctx 256
if [[ ${QHX_REAL:-ci} == full || $only == *smollm2* ]]; then
    build smollm2-fp16-window --family smollm2 --gguf "$gguf" --tokenizer "$smoltok" --prefill window \
        --prefill-len 64 --ctx 512 --norm-prescale 0.015625
    build smollm2-w8a16-window --family smollm2 --gguf "$gguf" --tokenizer "$smoltok" --precision w8a16 \
        --float-residual --norm-prescale 0.015625 --prefill window --prefill-len 64 --ctx 512 \
        --calib tests/goldens/parity/smollm2_{short,code,question}.json
fi
# Directories of bundles this script no longer makes would be picked up by the parity run.
[[ $only == "  " ]] && for d in "$out"/*/; do
    n=$(basename "$d")
    [[ $n == genie-* ]] && continue # scripts/build-genie.sh's, below
    [[ " ${built[*]} smollm2-fp16-window smollm2-w8a16-window " == *" $n "* ]] || { echo "build-real: removing stale $d" >&2; rm -rf -- "$d"; }
done
[[ $only == "  " ]] && scripts/build-genie.sh >/dev/null # Genie-layout bundles: genie-<family>-<variant>/
echo "$out"
