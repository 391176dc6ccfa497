#!/usr/bin/env python3
"""Which file imports which, and whether that is allowed: no import circle between files (Rust
crates src/, capi/src/ and server/src/, the exporter package export/qhx_export), and no file of the qhx
library importing from a floor above its own (FLOORS). Stdlib only; run by
scripts/check-layers.sh, which CI runs.

An edge is any path a file names: `crate::a::b::Item` (the longest prefix that is a module
file), `super::` and `self::` paths, and, in a folder's mod.rs, the children it names
(`pub use child::X`); in Python every `import` / `from ... import`, lazy ones included. The
crate root (lib.rs) is not a target: it only declares modules and the `elog!` macro.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# The qhx library's floors, ground up. A module belongs to the first floor with an entry that
# is the module or one of its parents. A file may import from its own floor (without a circle)
# and from floors below it, never from one above.
FLOORS: list[tuple[str, list[str]]] = [
    (
        "leaves",
        [
            "error", "cancel", "stats", "sampler", "speculative", "stop", "grammar", "tokenizer",
            "chat", "tools", "envcheck", "ops::convert", "os",
        ],
    ),
    ("qnn", ["qnn"]),
    ("description", ["bundle"]),
    ("host ops", ["ops", "kv"]),
    ("plan", ["plan"]),
    ("loaders and runner", ["load", "runner", "draft"]),
    ("engine", ["engine"]),
    ("session", ["text", "reasoning", "session"]),
    ("tools on a session", ["bench", "interactive"]),
    ("front ends", ["cli"]),
]

RUST_PATH = re.compile(r"(?<![\w:])(crate|super|self)((?:::[a-z_][a-z0-9_]*)+)")
CHILD_PATH = re.compile(r"(?<![\w:])([a-z_][a-z0-9_]*)::")
COMMENT = re.compile(r"//[^\n]*")
STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def rust_modules(src: Path) -> dict[str, Path]:
    """module path ('' for the crate root) -> file, for one crate's src/ (bin/ left out)."""
    mods = {}
    for p in sorted(src.rglob("*.rs")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[0] == "bin":
            continue
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        mods["::".join(parts)] = p
    return mods


def resolve(mods: dict[str, Path], segs: list[str]) -> str | None:
    for i in range(len(segs), -1, -1):
        m = "::".join(segs[:i])
        if m in mods:
            return m
    return None


def rust_edges(src: Path) -> tuple[dict[str, Path], set[tuple[str, str]]]:
    mods = rust_modules(src)
    edges = set()
    for m, p in mods.items():
        text = STRING.sub('""', COMMENT.sub("", p.read_text()))
        here = m.split("::") if m else []
        is_dir_root = p.name in ("mod.rs", "lib.rs")
        # the module that `super::` names from this file, and the one `self::` names
        parent = here[:-1]
        for base, rest in RUST_PATH.findall(text):
            segs = rest.split("::")[1:]
            if base == "crate":
                full = segs
            elif base == "super":
                full = parent + segs
            else:
                full = here + segs
            t = resolve(mods, full)
            if t is not None and t not in (m, ""):
                edges.add((m, t))
        if is_dir_root:
            for child in CHILD_PATH.findall(text):
                t = "::".join([*here, child])
                if t in mods and t != m:
                    edges.add((m, t))
    return mods, edges


def python_edges(pkg: Path) -> tuple[dict[str, Path], set[tuple[str, str]]]:
    top = pkg.name
    mods = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    edges = set()
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), str(p))
        pkg_of = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg_of.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                names = [f"{mod}.{a.name}" for a in node.names] + [mod]
            for n in names:
                if not (n == top or n.startswith(top + ".")):
                    continue
                segs = n.split(".")
                t = next((".".join(segs[:i]) for i in range(len(segs), 0, -1) if ".".join(segs[:i]) in mods), None)
                if t is not None and t != m and not (t == top and isinstance(node, ast.ImportFrom)):
                    edges.add((m, t))
    return mods, edges


def circles(nodes: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in succ:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            if i < len(succ[v]):
                work.append((v, i + 1))
                w = succ[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            for w in succ[v]:
                if w in on:
                    low[v] = min(low[v], low[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def floor_of(module: str) -> int | None:
    for i, (_, entries) in enumerate(FLOORS):
        for e in entries:
            if module == e or module.startswith(e + "::"):
                return i
    return None


def report_circles(what: str, mods: dict[str, Path], edges: set[tuple[str, str]], root: Path) -> int:
    bad = 0
    for comp in circles(sorted(mods), edges):
        bad += 1
        inside = set(comp)
        print(f"check-layers: import circle in {what} between {len(comp)} files:")
        for a in comp:
            tos = sorted(b for x, b in edges if x == a and b in inside)
            print(f"  {mods[a].relative_to(root)} -> {', '.join(str(mods[b].relative_to(root)) for b in tos)}")
    return bad


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    bad = 0
    mods, edges = rust_edges(root / "src")
    n_edges = len(edges)
    bad += report_circles("src/", mods, edges, root)
    for m in sorted(mods):
        if m and floor_of(m) is None:
            bad += 1
            print(f"check-layers: {mods[m].relative_to(root)} is on no floor (add its module to FLOORS)")
    for a, b in sorted(edges):
        fa, fb = floor_of(a), floor_of(b)
        if fa is not None and fb is not None and fb > fa:
            bad += 1
            print(
                f"check-layers: {mods[a].relative_to(root)} (floor {FLOORS[fa][0]}) imports "
                f"{mods[b].relative_to(root)} (floor {FLOORS[fb][0]}, above it)"
            )
    cmods, cedges = rust_edges(root / "capi" / "src")
    bad += report_circles("capi/src/", cmods, cedges, root)
    smods, sedges = rust_edges(root / "server" / "src")
    bad += report_circles("server/src/", smods, sedges, root)
    pmods, pedges = python_edges(root / "export" / "qhx_export")
    bad += report_circles("export/qhx_export/", pmods, pedges, root)
    print(
        f"check-layers: src/ {len(mods)} files {n_edges} imports on {len(FLOORS)} floors, capi/src/ {len(cmods)} "
        f"files, server/src/ {len(smods)} files {len(sedges)} imports, export/qhx_export/ {len(pmods)} files {len(pedges)} imports: "
        + ("ok" if bad == 0 else f"{bad} problem{'s' if bad != 1 else ''}"),
        file=sys.stderr,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
