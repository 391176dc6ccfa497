# Sourced by the exporter's slow scripts (export-slow.sh, export-quality.sh,
# export-seed-shapes.sh): `export_env NAME [ASSET...]` fetches the assets, installs export/ into
# the cached QNN venv, checks that qhx_generate is built, and sets $root, $py, QHX_CACHE and
# PYTHONPATH (the harness in tests/, the studies in benches/, the exporter, by module name).
export_env() {
    local name=$1
    shift
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    QHX_CACHE=$("$root/scripts/fetch-assets.sh" "$@" | tail -n 1)
    export QHX_CACHE
    export PYTHONPATH="$root/tests:$root/benches:$root/export${PYTHONPATH:+:$PYTHONPATH}"
    py=$("$root/scripts/qnn-libs.sh" --python | tail -n 1)
    "$root/scripts/qhx-export.sh" --version >/dev/null  # installs export/ on first use
    [[ -x "${QHX_GENERATE:-$root/target/release/qhx_generate}" ]] ||
        { echo "$name: build qhx_generate first (cargo build --release)" >&2; exit 1; }
}
