#!/usr/bin/env bash
# Bundle-shape matrix for the parity goldens (issue #4): for SmolLM2 (real weights) and the
# tiny Qwen2, every prefill shape x KV layout x I/O dtype, P=64, C=512:
#   prefill: window (AR=P, no past; rest of the prompt via decode) | past (chunked prefill
#            reading the cache; prefill+decode in one shared binary) | none (decode-over-prompt)
#   layout:  pos_major | head_major      io: f32 | f16 | ufixed16 (scales calibrated below)
# Fixed-point scales come from QNN_EMU_CALIBRATE runs of the f32 bundle over the golden
# prompts. Prints the output dir (target/bundles/matrix).
#   QHX_MATRIX=full (default): all 18 variants for both families.
#   QHX_MATRIX=ci: all 18 tiny-Qwen2 variants, and for SmolLM2 six that cover every prefill
#   shape, layout and dtype at least once (scripts/test.sh uses this to stay fast).
set -euo pipefail
cd "$(dirname "$0")/.."
par=$(scripts/build-parity.sh)
cache=${QHX_CACHE:-$HOME/.cache/qhx}
py="$cache/venv/bin/python"
out=target/bundles/matrix
mkdir -p "$out"
bin=target/release/qhx_generate
lib=target/release/libqnn_emu.so
[[ -x $bin && -f $lib ]] || { echo "build-matrix: build the workspace first" >&2; exit 1; }

calibrate() { # family manifest dir
    local fam=$1 man=$2 dir=$3 calib="$out/$1.calib.json"
    if [[ -f $calib && $calib -nt $man ]]; then return; fi
    echo "build-matrix: calibrating $fam on the f32 bundle" >&2
    rm -f "$calib"
    for g in tests/goldens/parity/${fam}_*.json; do
        prompt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt"], end="")' "$g")
        QNN_EMU_CALIBRATE="$PWD/$calib" "$bin" "$man" "$lib" "$lib" "$dir" 8 "$prompt" --ignore-eos >/dev/null 2>&1
    done
}
calibrate smollm2 "$par/smollm2-f32/smollm2.json" "$par/smollm2-f32"
calibrate qwen2 "$par/qwen2-f32/tiny_qwen2.json" "$par/qwen2-f32"

gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
for prefill in window past none; do
  for layout in pos_major head_major; do
    for io in f32 f16 ufixed16; do
      v="$prefill-$layout-$io"
      extra=()
      [[ $prefill == past ]] && extra+=(--shared)
      [[ $io == ufixed16 ]] && extra+=(--calib)
      emb=f16; [[ $io == f32 ]] && emb=f32
      d="$out/smollm2-$v"
      case "${QHX_MATRIX:-full}:$v" in
          # ci: each prefill shape, layout and dtype at least once, six bundles
          full:*|ci:window-pos_major-f32|ci:window-pos_major-ufixed16|ci:past-head_major-ufixed16|ci:none-pos_major-f16|ci:none-head_major-ufixed16|ci:past-pos_major-f32) build_smol=1 ;;
          *) build_smol=0 ;;
      esac
      if [[ $build_smol == 1 ]] && [[ ! -f $d/smollm2.json || -n "$(find export/qhx_export -name '*.py' -newer "$d/smollm2.json" | head -n 1)" || $out/smollm2.calib.json -nt $d/smollm2.json ]]; then
          echo "build-matrix: $d" >&2
          # The exporter package (export/) writes the SmolLM2 bundles.
          args=("$gguf" --target emu -o "$d" --force --name smollm2 --prefill "$prefill" --kv-layout "$layout" --io "$io"
                --embed-dtype "$emb" --ar 64 --ctx 512 "${extra[@]}")
          [[ $io == ufixed16 ]] && args+=("$out/smollm2.calib.json")
          PYTHONPATH="$PWD/export" "$py" -m qhx_export "${args[@]}" >&2
      fi
      d="$out/qwen2-$v"
      if [[ ! -f $d/tiny_qwen2.json || $par/hf/qwen2/qhx_source.json -nt $d/tiny_qwen2.json ||
            -n "$(find export/qhx_export -name '*.py' -newer "$d/tiny_qwen2.json" | head -n 1)" ||
            $out/qwen2.calib.json -nt $d/tiny_qwen2.json ]]; then
          echo "build-matrix: $d" >&2
          # The tiny Qwen2 HF directory build-parity.sh wrote, through the same exporter.
          args=("$par/hf/qwen2" --target emu -o "$d" --force --name tiny_qwen2 --prefill "$prefill" --kv-layout "$layout"
                --io "$io" --embed-dtype "$emb" --ar 64 --ctx 512 "${extra[@]}")
          [[ $io == ufixed16 ]] && args+=("$out/qwen2.calib.json")
          PYTHONPATH="$PWD/export" "$py" -m qhx_export "${args[@]}" >&2
      fi
    done
  done
done
echo "$out"
