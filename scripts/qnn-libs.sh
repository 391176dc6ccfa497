#!/usr/bin/env bash
# The real QNN HTP backend for x86_64 (QAIRT 2.51, HTP in simulation), from PyPI's
# onnxruntime-qnn wheel, installed on first use into a private venv of its own:
#
#   scripts/qnn-libs.sh          prints, as its last line, the directory holding the real
#                                libQnnHtp.so and libQnnSystem.so (progress goes to stderr)
#   scripts/qnn-libs.sh --python prints the venv's python instead (onnx + onnxruntime QNN EP,
#                                used by the exporter --target htp and the reference loop qhx_export.verify.loop)
#
# Cache: QHX_CACHE (default ~/.cache/qhx)/venv-qnn, kept apart from venv/ so the asset tools'
# pins (scripts/fetch-assets.sh) never move; reinstalled only when the pin stamp changes.
#
# The libraries carry RPATH $ORIGIN:$ORIGIN/../onnxruntime_qnn.libs, which finds the wheel's
# libc++ and the libHtpPrepare.so that libQnnHtp.so dlopens, so qhx_generate runs them by path
# with no LD_LIBRARY_PATH (checked: a fp16 real bundle runs with LD_LIBRARY_PATH unset). A copy
# of the libraries made elsewhere, without that directory layout, needs LD_LIBRARY_PATH=<dir>:
#
#   L=$(scripts/qnn-libs.sh); target/release/qhx_generate <manifest> \
#       $L/libQnnHtp.so $L/libQnnSystem.so <dir> 8 'Hello'
set -euo pipefail

QHX_CACHE=${QHX_CACHE:-$HOME/.cache/qhx}
VENV="$QHX_CACHE/venv-qnn"
PINS="onnxruntime-qnn==2.7.0 onnxruntime==1.32.0 onnx==1.23.2 numpy==2.4.6 gguf==0.19.0 tokenizers==0.23.3"
PY_SYS=${PYTHON:-python3}

log() { printf 'qnn-libs: %s\n' "$*" >&2; }
die() { printf 'qnn-libs: error: %s\n' "$*" >&2; exit 1; }

ensure_venv() {
    local stamp="$VENV/.qhx-pins"
    if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
        log "venv at $VENV is broken (interpreter gone?); recreating"
        rm -rf -- "$VENV"
    fi
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$PINS" && -x "$VENV/bin/python" ]]; then
        return
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        command -v "$PY_SYS" >/dev/null || die "$PY_SYS not found (need python3 >= 3.11 with venv + pip)"
        "$PY_SYS" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            die "onnxruntime-qnn 2.7.0 needs python >= 3.11 ($PY_SYS is older; set PYTHON=)"
        log "creating venv $VENV"
        mkdir -p "$QHX_CACHE"
        "$PY_SYS" -m venv "$VENV" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
    log "installing $PINS into $VENV (first use: ~300 MB download)"
    # shellcheck disable=SC2086  # PINS is a word list on purpose
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --only-binary=:all: $PINS >&2 ||
        die "pip install $PINS failed"
    printf '%s' "$PINS" >"$stamp"
}

main() {
    case "${1:-}" in
        ""|--python) ;;
        *) die "usage: scripts/qnn-libs.sh [--python]" ;;
    esac
    ensure_venv
    local dir
    dir=$("$VENV/bin/python" -c 'import os, onnxruntime_qnn; print(os.path.dirname(onnxruntime_qnn.__file__))') ||
        die "cannot import onnxruntime_qnn from $VENV"
    for lib in libQnnHtp.so libQnnSystem.so; do
        [[ -f "$dir/$lib" ]] || die "$dir/$lib missing from the onnxruntime-qnn wheel"
    done
    if [[ "${1:-}" == --python ]]; then
        printf '%s\n' "$VENV/bin/python"
    else
        printf '%s\n' "$dir"
    fi
}

main "$@"
