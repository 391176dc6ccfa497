#!/usr/bin/env bash
# Build the SmolLM2 emulator bundle into target/bundles/smollm2 (idempotent: skipped when the
# bundle is newer than the writer script and the GGUF).
#   scripts/build-bundle.sh            -> prints the bundle dir on stdout
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(scripts/fetch-assets.sh smollm2 | tail -n 1)
gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
out=target/bundles/smollm2
if [[ -f "$out/smollm2.json" && "$out/smollm2.json" -nt scripts/make_bundle.py && "$out/smollm2.json" -nt "$gguf" ]]; then
    echo "build-bundle: $out is up to date" >&2
else
    echo "build-bundle: writing $out" >&2
    "$cache/venv/bin/python" scripts/make_bundle.py --gguf "$gguf" --out "$out" --name smollm2 >&2
fi
echo "$out"
