#!/usr/bin/env bash
# Build the Genie-layout bundles (Qualcomm Genie's tensor names and genie_config.json, one QNN
# context binary per graph) with the exporter package (scripts/qhx-export.sh --format genie) from
# the tiny HF directories scripts/build-parity.sh writes (tiny_models.write_hf_dir: the parity
# bundles' weights and tokenizers), into target/bundles/real/genie-<family>-<variant>/, one
# genie_config.json (and genie-source.json) per directory, and print target/bundles/real as the
# last line. Called by scripts/build-real.sh; idempotent: a bundle is rebuilt only when the hash
# of its inputs (exporter package, HF directory, venv pins, options) differs from the one in its
# .inputs-sha256.
#
#   genie-llama3-fp16          tiny Llama-3 (llama3 RoPE) + Llama-3 tokenizer, fp16, graphs
#                              prompt_ar4_cl64_1_of_1 + token_ar1_cl64_1_of_1, float I/O
#   genie-llama3-w8a16         the same, W8A16 QDQ: uint16 mask/cos/sin/logits, uint8 KV;
#                              calibrated (--calib) on three parity goldens' prompt + HF gold
#                              text (short, code, question), as the bundles have always been
#   genie-qwen2-fp16           tiny Qwen2 + DeepSeek-R1-Distill tokenizer, fp16
#   genie-qwen2-w8a16          the same, W8A16 / uint8 KV
#   genie-llama3-fp16-split2   tiny Llama-3 fp16, 2 splits per AR variant (layer 0 | layer 1 +
#                              head), *_1_of_2 / *_2_of_2, hidden state passed by name
set -euo pipefail
cd "$(dirname "$0")/.."
par=target/bundles/parity
if [[ ! -f $par/hf/llama3/qhx_source.json || ! -f $par/hf/qwen2/qhx_source.json ]]; then
    scripts/build-parity.sh >/dev/null # the tiny HF directories (and their tokenizers)
fi
scripts/qnn-libs.sh >/dev/null
out=target/bundles/real
mkdir -p "$out"
pins=$(grep -E '^PINS=' scripts/qnn-libs.sh)

# calib FAMILY: a --calib text of the family's parity goldens (one sequence each). With the
# built-in corpus instead, tiny Qwen2's top three logits after one prompt sat within 7 uint16
# steps, and qhx_generate and Genie picked different ids there.
calib() {
    local f="$out/.genie-calib-$1.txt"
    python3 - "$1" "$f" <<'PY'
import json, sys
fam, out = sys.argv[1], sys.argv[2]
seqs = []
for case in ("short", "code", "question"):
    with open(f"tests/goldens/parity/{fam}_{case}.json", encoding="utf-8") as g:
        d = json.load(g)
    seqs.append((d["prompt"] + d["gold_text"]).replace("\n\n", "\n"))
with open(out + ".tmp", "w", encoding="utf-8") as f:
    f.write("\n\n".join(seqs) + "\n")
PY
    mv "$f.tmp" "$f"
    echo "$f"
}

# build DIR HF_DIR EXPORTER_ARGS...: qhx-export into DIR unless its recorded input hash matches.
build() {
    local d="$out/$1" hf=$2
    shift 2
    local key
    key=$({
        printf '%s\n' "$pins" "$*"
        cat export/pyproject.toml
        find export/qhx_export -name '*.py' | LC_ALL=C sort | xargs cat
        find "$hf" -type f | LC_ALL=C sort | xargs sha256sum | cut -d' ' -f1
        for a in "$@"; do if [[ -f $a ]]; then sha256sum <"$a"; fi; done
    } | sha256sum | cut -d' ' -f1)
    if [[ -f $d/.inputs-sha256 && $(cat "$d/.inputs-sha256") == "$key" && -f $d/genie_config.json ]]; then
        echo "build-genie: $d up to date" >&2
        return
    fi
    echo "build-genie: $d" >&2
    local t0=$SECONDS
    rm -f "$d/.inputs-sha256"
    scripts/qhx-export.sh "$hf" -o "$d" --force --target htp --format genie --ar 4 --ctx 64 --no-weight-sharing "$@" >&2
    printf '%s' "$key" >"$d/.inputs-sha256"
    echo "build-genie: $d built in $((SECONDS - t0))s" >&2
}

l3=(--name tiny_llama3 --model-name llama3)
q2=(--name tiny_qwen2 --model-name qwen2)
build genie-llama3-fp16 "$par/hf/llama3" "${l3[@]}"
build genie-llama3-w8a16 "$par/hf/llama3" "${l3[@]}" --precision w8a16 --calib "$(calib llama3)"
build genie-qwen2-fp16 "$par/hf/qwen2" "${q2[@]}"
build genie-qwen2-w8a16 "$par/hf/qwen2" "${q2[@]}" --precision w8a16 --calib "$(calib qwen2)"
build genie-llama3-fp16-split2 "$par/hf/llama3" "${l3[@]}" --genie-splits 2
echo "$out"
