#!/usr/bin/env bash
# Run the exporter package (export/, `qhx-export`) from the cached QNN venv:
#
#   scripts/qhx-export.sh INPUT -o DIR [--target htp|emu] [...]      (qhx-export --help)
#
# On first use (and whenever export/pyproject.toml or this checkout's path changes) it installs
# export/ editable into $QHX_CACHE/venv-qnn (default ~/.cache/qhx; the venv scripts/qnn-libs.sh
# makes: onnxruntime-qnn, which --target htp will compile with, next to the same gguf / numpy /
# tokenizers pins as the asset venv). QHX_EXPORT_PYTHON=/path/to/python uses that interpreter's
# environment instead. Install output goes to stderr; stdout is qhx-export's own (its last line
# is the written manifest's path). The exit status is qhx-export's. The install includes the
# package's test extras (pinned pytest and ruff), so after one run the suite is:
#   "$(scripts/qnn-libs.sh --python)" -m pytest export/tests   (and -m ruff check export)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf 'qhx-export.sh: %s\n' "$*" >&2; }
die() { printf 'qhx-export.sh: error: %s\n' "$*" >&2; exit 1; }

if [[ -n "${QHX_EXPORT_PYTHON:-}" ]]; then
    py=$QHX_EXPORT_PYTHON
    [[ -x "$py" ]] || die "QHX_EXPORT_PYTHON=$py is not an executable"
else
    py=$("$root/scripts/qnn-libs.sh" --python | tail -n 1) || die "scripts/qnn-libs.sh --python failed"
fi
venv=$(cd "$(dirname "$py")/.." && pwd)
stamp="$venv/.qhx-export"
want="$(sha256sum "$root/export/pyproject.toml" | cut -d' ' -f1) $root/export[test]"

installed() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$py" -c 'import qhx_export' 2>/dev/null
}

if ! installed; then
    # one installer at a time (two test jobs may start together); re-check under the lock
    exec 9>"$venv/.qhx-export.lock"
    flock 9
    if ! installed; then
        log "installing $root/export (editable) into $venv"
        "$py" -m pip install --disable-pip-version-check -q -e "$root/export[test]" >&2 ||
            die "pip install -e $root/export[test] failed"
        printf '%s' "$want" >"$stamp"
    fi
    exec 9>&-
fi
# This checkout's package first: the venv is shared, and its editable install may point at
# another checkout (a second worktree, a CI clone) that installed last.
PYTHONPATH="$root/export${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m qhx_export "$@"
