#!/usr/bin/env bash
# Build the SmolLM2 emulator bundle into target/bundles/smollm2 with the exporter package
# (export/, `qhx-export --target emu`), run from the asset venv, which has its packages
# (idempotent: skipped when the bundle is newer than the package and the GGUF). The bundle
# carries an 8-row verify graph beside decode, so `--spec` verifies drafts on it.
#   scripts/build-bundle.sh            -> prints the bundle dir on stdout
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(scripts/fetch-assets.sh smollm2 | tail -n 1)
gguf="$cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
out=target/bundles/smollm2
man="$out/smollm2.json"
if [[ -f "$man" && "$man" -nt "$gguf" && -z "$(find export/qhx_export -name '*.py' -newer "$man" | head -n 1)" ]]; then
    echo "build-bundle: $out is up to date" >&2
else
    echo "build-bundle: writing $out" >&2
    PYTHONPATH="$PWD/export" "$cache/venv/bin/python" -m qhx_export "$gguf" --target emu -o "$out" --force \
        --name smollm2 --model-name smollm2-135m-instruct --verify-rows 8 >&2
fi
echo "$out"
