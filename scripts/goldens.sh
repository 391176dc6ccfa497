#!/usr/bin/env bash
# Regenerate golden files (developer-only; CI never runs this). One entry point for the three
# golden tools in tests/golden_tools/, each run by module name with the interpreter it needs:
#   scripts/goldens.sh hf [--only PART[,PART...]]   tests/goldens/{parity,rope.json,tokenizers.json}
#                                                   from HF transformers (the reference venv, see
#                                                   tests/golden_tools/goldens.py)
#   scripts/goldens.sh chat [--gguf F] [--tokenizer F]  tests/goldens/chat/ (reference venv)
#   scripts/goldens.sh genie BUNDLE... --out DIR    tests/goldens/genie/ from libGenie.so (QNN venv)
# QHX_REF_PYTHON overrides the reference venv's interpreter ($QHX_CACHE/venv-ref/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/tests:$PWD/export${PYTHONPATH:+:$PYTHONPATH}"
cache=${QHX_CACHE:-$HOME/.cache/qhx}
ref=${QHX_REF_PYTHON:-$cache/venv-ref/bin/python}
die() { printf 'goldens: error: %s\n' "$*" >&2; exit 1; }
tool=${1:-}
shift || true
case $tool in
    hf | chat)
        [[ -x $ref ]] || die "no reference venv at $ref (setup: tests/golden_tools/goldens.py's docstring)"
        mod=golden_tools.goldens
        [[ $tool == chat ]] && mod=golden_tools.chat_goldens
        exec "$ref" -m "$mod" "$@"
        ;;
    genie)
        lib=$(scripts/qnn-libs.sh | tail -n 1)
        py=$(scripts/qnn-libs.sh --python | tail -n 1)
        LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$py" -m golden_tools.genie_goldens "$@"
        ;;
    *) die "usage: scripts/goldens.sh hf|chat|genie [ARGS...]" ;;
esac
