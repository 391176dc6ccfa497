#!/usr/bin/env bash
# Host overhead of this tree against an earlier commit, interleaved: the host_overhead bench
# is built at REV (in a temporary worktree, its own target dir) and here, then run
# alternately ROUNDS times each (old, new, old, new, ...) so that drift of the machine hits
# both alike; prints per row (shape, io, C, sampler) the median ms per decode step of each and
# the ratio new / old. Host figures of this machine, not phone figures.
#   scripts/host-overhead-compare.sh REV [--rounds N] [--shape llama-1b|deepseek-1.5b|tiny] [--json]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
rev=${1:?usage: scripts/host-overhead-compare.sh REV [--rounds N] [--shape S] [--json]}
shift
rounds=3 shape=llama-1b json=0
while (($#)); do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --shape) shape=$2; shift 2 ;;
        --json) json=1; shift ;;
        *) echo "host-overhead-compare: unknown argument $1" >&2; exit 2 ;;
    esac
done
old_tree=$(mktemp -d)
logs=$(mktemp -d)
trap 'git worktree remove --force "$old_tree" >/dev/null 2>&1 || true; rm -rf "$logs"' EXIT
git worktree add --detach "$old_tree" "$rev" >/dev/null 2>&1
bench_exe() { # DIR TARGET_DIR -> the bench executable's path (the emulator built beside it)
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo build --release -p qnn-emu --quiet >&2)
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo bench --bench host_overhead --no-run --message-format=json --quiet 2>/dev/null) |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "host_overhead":
        print(m["executable"])'
}
echo "host-overhead-compare: building the bench at $rev and here" >&2
old=$(bench_exe "$old_tree" "$PWD/target/host-overhead-old")
new=$(bench_exe "$PWD" "$PWD/target")
[[ -x $old && -x $new ]] || { echo "host-overhead-compare: a bench did not build" >&2; exit 1; }
tok="$(scripts/build-parity.sh)/tok/deepseek-r1-distill.json"
for ((i = 1; i <= rounds; i++)); do
    for side in old new; do
        exe=$old
        [[ $side == new ]] && exe=$new
        echo "host-overhead-compare: round $i/$rounds, $side" >&2
        # Both on the same synthetic bundles; each with the emulator of its own commit.
        "$exe" --json --shape "$shape" --mask-tokenizer "$tok" --dir "$PWD/target/bundles/host-overhead" \
            >"$logs/$side-$i.json" 2>/dev/null
    done
done
python3 - "$logs" "$rounds" "$rev" "$json" <<'PY'
import json, statistics, sys
logs, rounds, rev, as_json = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
def rows(side):
    out = {}
    for i in range(1, rounds + 1):
        for r in json.load(open(f"{logs}/{side}-{i}.json")):
            if "total_ms_per_step" in r:
                out.setdefault((r["shape"], r["io"], r["ctx"], r["sampler"]), []).append(r["total_ms_per_step"])
    return out
old, new = rows("old"), rows("new")
table = []
for k in sorted(set(old) & set(new)):
    o, n = statistics.median(old[k]), statistics.median(new[k])
    table.append({"shape": k[0], "io": k[1], "ctx": k[2], "sampler": k[3], "old_ms": o, "new_ms": n, "ratio": n / o})
ratios = [r["ratio"] for r in table]
summary = {"against": rev, "rounds": rounds, "rows": table,
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
if as_json:
    print(json.dumps(summary))
else:
    print(f"{'shape':<14} {'io':<9} {'C':>5} {'sampler':<10} {'old ms':>9} {'new ms':>9} {'new/old':>8}")
    for r in table:
        print(f"{r['shape']:<14} {r['io']:<9} {r['ctx']:>5} {r['sampler']:<10} {r['old_ms']:>9.4f} {r['new_ms']:>9.4f} {r['ratio']:>8.3f}")
    print(f"new/old: median {summary['ratio_median']:.3f}, range {summary['ratio_min']:.3f}-{summary['ratio_max']:.3f} ({rounds} interleaved rounds, against {rev})")
PY
