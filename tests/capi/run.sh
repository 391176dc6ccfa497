#!/usr/bin/env bash
# The C API test (issue 19): build libqhx.a and tests/capi/capi_test.c against the header,
# then run it on the emulator with SmolLM2 (model A, chat template; its expected text is the
# CLI's --json text for the same request) and the tiny Llama-3 parity bundle (model B), and
# once more with AddressSanitizer + LeakSanitizer on the C program.
#   tests/capi/run.sh [htp_lib system_lib manifest_a manifest_b]  (default: the emulator)
#   CAPI_MODE=basic: the SDK's call order only, without ASan (for the HTP simulator, whose
#   speed allows little more and whose libraries are not ours to leak-check).
set -euo pipefail
cd "$(dirname "$0")/../.."
# The feature set of scripts/test.sh's build (see there): a no-op after it.
cargo build --release --workspace --lib --bins --tests --quiet
out=${CAPI_OUT:-target/capi}
mkdir -p "$out"
cflags=(-std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude)
libs=(target/release/libqhx.a -lpthread -ldl -lm)
cc "${cflags[@]}" tests/capi/capi_test.c "${libs[@]}" -o "$out/capi_test"
cc "${cflags[@]}" -fsanitize=address -fno-omit-frame-pointer tests/capi/capi_test.c "${libs[@]}" \
    -o "$out/capi_test_asan"
emu=target/release/libqnn_emu.so
htp=${1:-$emu}
sys=${2:-$emu}
a=${3:-$(scripts/build-bundle.sh)/smollm2.json}
b=${4:-$(scripts/build-parity.sh)/llama3-f32/tiny_llama3.json}
n=12
prompt="What is the capital of France?"
chat=(--chat)
[[ ${CAPI_MODE:-} != basic ]] || chat=()
target/release/qhx_generate "$a" "$htp" "$sys" "$(dirname "$a")" "$n" "$prompt" "${chat[@]}" --json \
    > "$out/cli.json" 2> "$out/cli.err" || { cat "$out/cli.err" >&2; exit 1; }
python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["text"])' \
    "$out/cli.json" > "$out/expected_a.txt"
echo "capi: expected text (qhx_generate ${chat[*]} --json): $(cat "$out/expected_a.txt")" >&2
"$out/capi_test" "$htp" "$sys" "$a" "$out/expected_a.txt" "$b" "$n" ${CAPI_MODE:+"$CAPI_MODE"} > /dev/null
[[ ${CAPI_MODE:-} != basic ]] || exit 0
echo "capi: again under AddressSanitizer + LeakSanitizer" >&2
# The emulator and QNN libraries are loaded with dlopen; their own allocations are checked
# by LeakSanitizer too (no suppressions).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    "$out/capi_test_asan" "$htp" "$sys" "$a" "$out/expected_a.txt" "$b" "$n" > /dev/null
