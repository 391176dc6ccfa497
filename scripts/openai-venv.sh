#!/usr/bin/env bash
# The client side of the server tests: a venv with the official `openai` package (the
# reference client), jsonschema (to validate structured replies) and pytest, pinned.
# Idempotent; prints the venv's python on stdout.
#   scripts/openai-venv.sh
set -euo pipefail
QHX_CACHE=${QHX_CACHE:-$HOME/.cache/qhx}
VENV="$QHX_CACHE/venv-openai"
PINS="openai==3.63.0 jsonschema==4.26.0 pytest==9.2.0"
PY_SYS=${PYTHON:-python3}
stamp="$VENV/.qhx-pins"
die() { printf 'openai-venv: error: %s\n' "$*" >&2; exit 1; }
if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf -- "$VENV"
fi
if ! [[ -f "$stamp" && "$(cat "$stamp")" == "$PINS" && -x "$VENV/bin/python" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        mkdir -p "$QHX_CACHE"
        "$PY_SYS" -m venv "$VENV" >&2 || die "python3 -m venv failed"
    fi
    printf 'openai-venv: installing %s into %s\n' "$PINS" "$VENV" >&2
    # shellcheck disable=SC2086  # PINS is a word list on purpose
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q $PINS >&2 ||
        die "pip install $PINS failed"
    printf '%s' "$PINS" >"$stamp"
fi
echo "$VENV/bin/python"
