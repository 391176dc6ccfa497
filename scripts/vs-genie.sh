#!/usr/bin/env bash
# Side by side on the same Genie bundles and the same x86 HTP simulator: Qualcomm's libGenie.so
# (tests/harness/genie_run.py, GenieDialog_tokenQuery) and our qhx_generate (given the bundle's
# genie_config.json in the manifest position). Prints one row per bundle: prompt tokens,
# generated tokens, load ms, TTFT ms, decode tok/s for both, and qhx/Genie ratios; --json
# prints one JSON document instead. Simulator speed is not phone speed: the graphs run on the
# CPU at ~0.2-1 GMAC/s, so these numbers compare host paths, not devices.
#
#   scripts/vs-genie.sh [--json] [BUNDLE_DIR...]     default: every target/bundles/real/genie-*
#   env: VS_GENIE_N (generated tokens, default 16), VS_GENIE_CASES (parity prompts, default
#        short,midword,question,cyrillic,code), QHX_GENERATE (default target/release/qhx_generate)
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python harness (tests/), the studies (benches/) and the exporter package, by module name.
export PYTHONPATH="$PWD/tests:$PWD/benches:$PWD/export${PYTHONPATH:+:$PYTHONPATH}"
json=0
if [[ ${1:-} == --json ]]; then json=1; shift; fi
lib=$(scripts/qnn-libs.sh 2>/dev/null | tail -n 1)
py=$(scripts/qnn-libs.sh --python 2>/dev/null | tail -n 1)
if [[ $# -eq 0 ]]; then
    out=$(scripts/build-genie.sh 2>/dev/null | tail -n 1)
    set -- "$out"/genie-*/
fi
args=()
[[ $json == 1 ]] && args+=(--json)
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$py" -m harness.vs_genie --lib-dir "$lib" \
    --qhx "${QHX_GENERATE:-target/release/qhx_generate}" --n "${VS_GENIE_N:-16}" \
    --cases "${VS_GENIE_CASES:-short,midword,question,cyrillic,code}" "${args[@]}" "$@"
