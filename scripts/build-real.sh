#!/usr/bin/env bash
# Build every real-HTP bundle with the exporter package (qhx-export --target htp: ONNX graphs
# compiled into QNN context binaries by onnxruntime's QNN EP, v79 / soc 69) into
# target/bundles/real/<family>-<variant>/, one manifest per directory (next to the exporter's
# tokenizer.json and export-report.json), and print target/bundles/real as the last line.
# Idempotent: a bundle is rebuilt only when the hash of its inputs (the exporter's sources, the
# checkpoint, venv pins, options) differs from the one recorded in its .inputs-sha256.
#
# The tiny families are the HF directories of tests/fixtures/tiny_models.py (write_hf_dir): qwen2 and
# llama3 are build-parity.sh's (target/bundles/parity/hf/, the goldens' weights and tokenizers),
# llama3echo is written here (target/bundles/tiny-hf/). Every bundle keeps its ONNX graphs
# (--keep-onnx): python -m qhx_export.verify.loop --fp32-twin runs the float ones on ORT's CPU EP.
#
#   qwen2-fp16-none                 tiny Qwen2 + DeepSeek-R1-Distill tokenizer, fp16, decode over
#                                   the prompt, no prefill graph (the DeepSeek v81 seed's shape)
#   llama3-w8a16-window             tiny Llama-3 (llama3 RoPE) + Llama-3 tokenizer, W8A16 (int8
#                                   per-channel weights, uint16 activations calibrated on the
#                                   exporter's built-in corpus), AR=16 prefill window + decode +
#                                   fp16 lm-head, ufixed16 I/O
#   llama3-fp16-past                tiny Llama-3, fp16, chunked prefill (AR=16) reading the cache
#   qwen2-fp16-past-head_major      tiny Qwen2, fp16, chunked prefill (AR=16) with past inputs
#                                   and head-major K/V (--kv-layout head_major)
#   llama3echo-fp16-past            tiny Llama-3 with a tied lm-head (it echoes its last token, so
#                                   prompt lookup drafts): real_parity.py's --spec verify case
#   QHX_REAL=full adds:
#   smollm2-fp16-window             SmolLM2-135M-Instruct real weights, fp16, AR=64 window (slow)
#   smollm2-w8a16-window            the same, W8A16; its residual stream (|x| ~ 22,550) makes the
#                                   exporter keep the residual adds and RMSNorms in fp16, and
#                                   the RMSNorm input prescale is the exporter's own (both
#                                   automatic, from the calibration corpus)
#   scripts/build-real.sh NAME...   builds only the named bundles (any of the above)
set -euo pipefail
cd "$(dirname "$0")/.."
par=$(scripts/build-parity.sh)            # tiny HF dirs (hf/qwen2, hf/llama3) and tokenizers
cache=$(scripts/fetch-assets.sh smollm2 llama3tok dsr1 | tail -n 1)
scripts/qnn-libs.sh >/dev/null
py=$(scripts/qnn-libs.sh --python 2>/dev/null | tail -n 1)
out=target/bundles/real
mkdir -p "$out"
l3tok="$cache/assets/llama3tok/tokenizer.json"
gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
pins=$(grep -E '^PINS=' scripts/qnn-libs.sh)
exporter=$(find export/qhx_export -name '*.py' | LC_ALL=C sort)

# The tied tiny Llama-3 (no goldens, so build-parity.sh does not make it), rebuilt when
# tiny_models.py or the tokenizer changes.
echo_hf=target/bundles/tiny-hf/llama3echo
if [[ ! -f $echo_hf/qhx_source.json || tests/fixtures/tiny_models.py -nt $echo_hf/qhx_source.json ||
    $l3tok -nt $echo_hf/qhx_source.json ]]; then
    echo "build-real: $echo_hf" >&2
    rm -rf "$echo_hf"
    PYTHONPATH="$PWD/tests" "$py" -c 'import sys; from fixtures import tiny_models; tiny_models.write_hf_dir(*sys.argv[1:])' \
        llama3echo "$echo_hf" "$l3tok" >&2
fi

built=()
only=" $* "
# build DIR INPUT ARGS...: qhx-export INPUT into DIR unless its recorded input hash matches.
build() {
    local d="$out/$1" input=$2
    built+=("$1")
    if [[ $only != "  " && $only != *" $1 "* ]]; then
        return
    fi
    shift 2
    local key
    key=$({
        printf '%s\n' "$pins" "$*"
        # shellcheck disable=SC2086 # one path per line, no spaces
        cat $exporter
        if [[ -d $input ]]; then # a tiny HF dir: its weights' checksum, config and tokenizer
            cat "$input/qhx_source.json" "$input/config.json" "$input/tokenizer.json"
        else
            sha256sum <"$input"
        fi
    } | sha256sum | cut -d' ' -f1)
    if [[ -f $d/.inputs-sha256 && $(cat "$d/.inputs-sha256") == "$key" ]] && compgen -G "$d/*.json" >/dev/null; then
        echo "build-real: $d up to date" >&2
        return
    fi
    echo "build-real: $d" >&2
    local t0=$SECONDS
    # the exporter stages DIR.partial and replaces DIR whole, so nothing stale survives; it
    # replaces only what it wrote, so the stamp this script wrote into DIR goes first
    rm -f "$d/.inputs-sha256"
    PYTHONPATH="$PWD/export" "$py" -m qhx_export "$input" --target htp -o "$d" --force --arch v79 --keep-onnx --no-weight-sharing "$@" >&2
    printf '%s' "$key" >"$d/.inputs-sha256"
    echo "build-real: $d built in $((SECONDS - t0))s" >&2
}

build qwen2-fp16-none "$par/hf/qwen2" --name tiny_qwen2 --prefill none --ctx 256
build llama3-w8a16-window "$par/hf/llama3" --name tiny_llama3 --precision w8a16 --prefill window \
    --ar 16 --ctx 256
build llama3-fp16-past "$par/hf/llama3" --name tiny_llama3 --prefill past --ar 16 --ctx 256
build qwen2-fp16-past-head_major "$par/hf/qwen2" --name tiny_qwen2 --prefill past --kv-layout head_major \
    --ar 16 --ctx 256
# For --spec on the real backend (real_parity.py's verify-schedule case).
build llama3echo-fp16-past "$echo_hf" --name tiny_llama3echo --prefill past --ar 16 --ctx 256
if [[ ${QHX_REAL:-ci} == full || $only == *smollm2* ]]; then
    build smollm2-fp16-window "$gguf" --name smollm2 --prefill window --ar 64 --ctx 512
    build smollm2-w8a16-window "$gguf" --name smollm2 --precision w8a16 --prefill window --ar 64 --ctx 512
fi
# Directories of bundles this script no longer makes would be picked up by the parity run.
[[ $only == "  " ]] && for d in "$out"/*/; do
    n=$(basename "$d")
    [[ $n == genie-* ]] && continue # scripts/build-genie.sh's, below
    [[ " ${built[*]} smollm2-fp16-window smollm2-w8a16-window " == *" $n "* ]] || { echo "build-real: removing stale $d" >&2; rm -rf -- "$d"; }
done
[[ $only == "  " ]] && scripts/build-genie.sh >/dev/null # Genie-layout bundles: genie-<family>-<variant>/
echo "$out"
