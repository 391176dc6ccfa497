# Sourced by the exporter's slow scripts (export-slow.sh, export-quality.sh,
# export-seed-shapes.sh): `export_env NAME [ASSET...]` fetches the assets, installs export/ into
# the cached QNN venv, checks that qhx_generate is built, and sets $root, $py and QHX_CACHE.
export_env() {
    local name=$1
    shift
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    QHX_CACHE=$("$root/scripts/fetch-assets.sh" "$@" | tail -n 1)
    export QHX_CACHE
    py=$("$root/scripts/qnn-libs.sh" --python | tail -n 1)
    "$root/scripts/qhx-export.sh" --version >/dev/null  # installs export/ on first use
    [[ -x "${QHX_GENERATE:-$root/target/release/qhx_generate}" ]] ||
        { echo "$name: build qhx_generate first (cargo build --release)" >&2; exit 1; }
}
