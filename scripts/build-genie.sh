#!/usr/bin/env bash
# Build the Genie-layout bundles (scripts/make_genie.py: Qualcomm Genie's tensor names and
# genie_config.json, ONNX graphs compiled by onnxruntime's QNN EP, one binary per graph) into
# target/bundles/real/genie-<family>-<variant>/, one genie_config.json per directory, and print
# target/bundles/real as the last line. Called by scripts/build-real.sh; idempotent: a bundle
# is rebuilt only when the hash of its inputs (writer scripts, tokenizer, calibration goldens,
# venv pins, options) differs from the one in its .inputs-sha256.
#
#   genie-llama3-fp16          tiny Llama-3 (llama3 RoPE) + Llama-3 tokenizer, fp16, graphs
#                              prompt_ar4_cl64_1_of_1 + token_ar1_cl64_1_of_1, float I/O
#   genie-llama3-w8a16         the same, W8A16 QDQ: uint16 mask/cos/sin/logits, uint8 KV
#   genie-qwen2-fp16           tiny Qwen2 + DeepSeek-R1-Distill tokenizer, fp16
#   genie-qwen2-w8a16          the same, W8A16 / uint8 KV
#   genie-llama3-fp16-split2   tiny Llama-3 fp16, 2 splits per AR variant (layer 0 | layer 1 +
#                              head), *_1_of_2 / *_2_of_2, hidden state passed by name
set -euo pipefail
cd "$(dirname "$0")/.."
par=target/bundles/parity
dstok="$par/tok/deepseek-r1-distill.json"
cache=${QHX_CACHE:-$HOME/.cache/qhx}
l3tok="$cache/assets/llama3tok/tokenizer.json"
if [[ ! -f $dstok || ! -f $l3tok ]]; then
    scripts/build-parity.sh >/dev/null # tokenizers (DeepSeek's from GGUF metadata)
fi
scripts/qnn-libs.sh >/dev/null
py=$(scripts/qnn-libs.sh --python 2>/dev/null | tail -n 1)
out=target/bundles/real
mkdir -p "$out"
pins=$(grep -E '^PINS=' scripts/qnn-libs.sh)

# build DIR ARGS...: make_genie.py into DIR unless its recorded input hash matches.
build() {
    local d="$out/$1"
    shift
    local key
    key=$({
        printf '%s\n' "$pins" "$*"
        cat scripts/make_genie.py scripts/genie_graphs.py scripts/genie_ref.py scripts/make_real.py \
            scripts/real_graphs.py scripts/real_ref.py scripts/make_bundle.py scripts/tiny_models.py
        for a in "$@"; do if [[ -f $a ]]; then sha256sum <"$a"; fi; done
    } | sha256sum | cut -d' ' -f1)
    if [[ -f $d/.inputs-sha256 && $(cat "$d/.inputs-sha256") == "$key" && -f $d/genie_config.json ]]; then
        echo "build-genie: $d up to date" >&2
        return
    fi
    echo "build-genie: $d" >&2
    local t0=$SECONDS
    rm -f "$d/.inputs-sha256"
    "$py" scripts/make_genie.py --out "$d" "$@" >&2
    printf '%s' "$key" >"$d/.inputs-sha256"
    echo "build-genie: $d built in $((SECONDS - t0))s" >&2
}

g=tests/goldens/parity
build genie-llama3-fp16 --family llama3 --tokenizer "$l3tok" --ar 4 --ctx 64
build genie-llama3-w8a16 --family llama3 --tokenizer "$l3tok" --ar 4 --ctx 64 --precision w8a16 \
    --calib "$g/llama3_short.json" "$g/llama3_code.json" "$g/llama3_question.json"
build genie-qwen2-fp16 --family qwen2 --tokenizer "$dstok" --ar 4 --ctx 64
build genie-qwen2-w8a16 --family qwen2 --tokenizer "$dstok" --ar 4 --ctx 64 --precision w8a16 \
    --calib "$g/qwen2_short.json" "$g/qwen2_code.json" "$g/qwen2_question.json"
build genie-llama3-fp16-split2 --family llama3 --tokenizer "$l3tok" --ar 4 --ctx 64 --splits 2
echo "$out"
