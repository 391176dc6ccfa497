"""The stage cache (qhx_export.cache): entries are whole or absent, least recently used ones go
first, and an HTP export resumes from the finished stages of an earlier run (a rerun, another
arch, a run stopped by a compile error or Ctrl-C) with the same bundle bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import qhx_export
from qhx_export.cache import StageCache, key_of, source_hash
from qhx_export.cli import main


def cache_at(root: Path | None, scratch: Path) -> StageCache:
    return StageCache(str(root) if root else None, str(scratch), lambda _m: None)


def test_entry_is_built_once_then_found(tmp_path: Path) -> None:
    built: list[str] = []

    def build(d: str) -> None:
        built.append(d)
        Path(d, "x.bin").write_bytes(b"abc")

    c = cache_at(tmp_path / "c", tmp_path)
    d1, hit1 = c.entry("graph", "k1", build)
    d2, hit2 = cache_at(tmp_path / "c", tmp_path).entry("graph", "k1", build)  # a later run
    assert (
        d1 == d2
        and (hit1, hit2) == (False, True)
        and len(built) == 1
        and Path(d2, "x.bin").read_bytes() == b"abc"
    )
    assert c.stats == {"graph": {"hit": 0, "miss": 1}}


@pytest.mark.parametrize("exc", [RuntimeError("compile failed"), KeyboardInterrupt()])
def test_failed_stage_leaves_no_entry(tmp_path: Path, exc: BaseException) -> None:
    def build(d: str) -> None:
        Path(d, "half.onnx").write_bytes(b"half")
        raise exc

    c = cache_at(tmp_path / "c", tmp_path)
    with pytest.raises(type(exc)):
        c.entry("quantize", "k", build)
    assert c.lookup("quantize", "k") is None
    assert os.listdir(tmp_path / "c" / "quantize") == []  # no partial either


def test_no_cache_never_finds(tmp_path: Path) -> None:
    c = cache_at(None, tmp_path)
    c.entry("graph", "k", lambda d: Path(d, "g").write_bytes(b"1"))
    assert c.lookup("graph", "k") is None
    assert c.summary() == {"dir": None}


def test_prune_removes_least_recently_used_but_not_this_runs(tmp_path: Path) -> None:
    root = tmp_path / "c"
    old = cache_at(root, tmp_path)
    for i, k in enumerate(("a", "b", "c")):
        d, _ = old.entry("compile", k, lambda d: Path(d, "bin").write_bytes(b"\0" * 1000))
        os.utime(d, (1000.0 + i, 1000.0 + i))  # a oldest
    stale = root / "compile" / "d.partial-999999"
    stale.mkdir()
    os.utime(stale, (1.0, 1.0))
    run = cache_at(root, tmp_path)
    assert run.lookup("compile", "a") is not None  # used now: kept, and newest
    removed = run.prune(limit=2500)  # three entries of ~1030 bytes: one goes
    assert sorted(os.listdir(root / "compile")) == ["a", "c"]
    assert removed >= 1000 and not stale.exists()


def test_source_hash(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights" * 1000)
    memo = tmp_path / "c"
    assert source_hash(str(f), str(memo)) == hashlib.sha256(f.read_bytes()).hexdigest()
    assert len(os.listdir(memo / "sources")) == 1
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"1234")
    h1 = source_hash(str(d), str(memo))
    (d / "model.safetensors").write_bytes(b"1235")
    assert source_hash(str(d), str(memo)) != h1


def test_keys_follow_every_part() -> None:
    base = key_of("calibrate", {"graphs": {"decode": "x"}, "steps": 512})
    assert base == key_of("calibrate", {"steps": 512, "graphs": {"decode": "x"}})
    assert base != key_of("calibrate", {"graphs": {"decode": "x"}, "steps": 64})
    assert base != key_of("quantize", {"graphs": {"decode": "x"}, "steps": 512})


# ---- through the exporter (--target htp, tiny model) -------------------------------------------

needs_qnn = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime_qnn") is None, reason="needs the onnxruntime-qnn wheel"
)
W8 = ["--precision", "w8a16", "--ar", "4", "--ctx", "48", "--calib-steps", "48"]


def export(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def bundle_files(d: Path) -> dict[str, bytes]:
    skip = {"export-report.json", "README.md"}  # they hold timings and the cache's counts
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name not in skip}


def stages(d: Path) -> dict[str, dict[str, int]]:
    return json.loads((d / "export-report.json").read_text())["cache"]["stages"]


@needs_qnn
def test_rerun_takes_every_stage_from_the_cache(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(tiny_gguf("llama", name="tiny.gguf"))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    t0 = time.monotonic()
    assert export([src, "-o", str(tmp_path / "a"), "--arch", "v75", *W8, *cache], capsys)[0] == 0
    first = time.monotonic() - t0
    assert all(s["hit"] == 0 for s in stages(tmp_path / "a").values())
    t0 = time.monotonic()
    rc, err = export([src, "-o", str(tmp_path / "b"), "--arch", "v75", *W8, *cache], capsys)
    again = time.monotonic() - t0
    assert rc == 0 and "from the stage cache" in err
    st = stages(tmp_path / "b")
    assert set(st) == {"prescale", "graph", "calibrate", "quantize", "compile"}
    assert all(s["miss"] == 0 and s["hit"] > 0 for s in st.values()), st
    assert bundle_files(tmp_path / "a") == bundle_files(tmp_path / "b")
    print(f"first export {first:.1f}s, from the cache {again:.1f}s", file=sys.stderr)
    # another arch: everything up to the QDQ graphs is reused, only the compile runs
    assert export([src, "-o", str(tmp_path / "c"), "--arch", "v81", *W8, *cache], capsys)[0] == 0
    st = stages(tmp_path / "c")
    assert st["compile"] == {"hit": 0, "miss": 3}
    assert all(st[s]["miss"] == 0 for s in ("graph", "calibrate", "quantize")), st


@needs_qnn
def test_resume_after_a_failed_compile(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(tiny_gguf("qwen2", name="tiny.gguf"))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    # soc_model 9999 does not exist: QNN refuses the device config at the first compile
    rc, err = export([src, "-o", str(tmp_path / "b"), "--arch", "v75", "--soc", "9999", *W8, *cache], capsys)
    assert rc == 1 and "QNN compile failed" in err and "soc_model 9999" in err
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()
    rc, err = export([src, "-o", str(tmp_path / "b"), "--arch", "v75", *W8, *cache], capsys)
    assert rc == 0, err
    st = stages(tmp_path / "b")
    assert st["compile"]["hit"] == 0 and st["compile"]["miss"] == 3
    assert all(st[s]["miss"] == 0 and st[s]["hit"] > 0 for s in ("graph", "calibrate", "quantize")), st


@needs_qnn
def test_resume_after_ctrl_c(tmp_path: Path, tiny_gguf: Callable[..., Path]) -> None:
    """SIGINT while the second graph calibrates: exit 130, nothing of the bundle left; the
    rerun takes the float graphs and the first graph's ranges from the cache."""
    src = str(tiny_gguf("llama", name="tiny.gguf"))
    pkg_root = str(Path(qhx_export.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=pkg_root)
    args = [sys.executable, "-m", "qhx_export", src, "-o", str(tmp_path / "b"), "--arch", "v75"]
    args += [*W8, "--calib-steps", "512", "--cache-dir", str(tmp_path / "cache")]
    p = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    assert p.stderr is not None
    seen = []
    for line in p.stderr:
        seen.append(line)
        if line.startswith("qhx-export: calibrated prefill"):
            p.send_signal(signal.SIGINT)
            break
    rest = p.stderr.read()
    assert p.wait(timeout=120) == 130, "".join(seen) + rest
    assert "interrupted" in rest and "Traceback" not in rest
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()
    assert not [n for n in os.listdir(tmp_path / "cache" / "calibrate") if ".partial-" in n]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    st = stages(tmp_path / "b")
    assert st["graph"] == {"hit": 3, "miss": 0}
    assert st["calibrate"] == {"hit": 1, "miss": 1}, st
    assert "calibrated prefill (cached)" in r.stderr


@needs_qnn
def test_no_cache_writes_no_cache(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "default-cache"
    monkeypatch.setenv("QHX_EXPORT_CACHE", str(root))
    src = str(tiny_gguf("llama", name="tiny.gguf"))
    args = [src, "-o", str(tmp_path / "b"), "--arch", "v75", "--prefill", "none", "--ctx", "16"]
    assert export([*args, "--no-cache"], capsys)[0] == 0
    assert not root.exists()
    assert json.loads((tmp_path / "b" / "export-report.json").read_text())["cache"] == {"dir": None}
    assert export([*args, "--force"], capsys)[0] == 0  # the default: $QHX_EXPORT_CACHE
    assert (root / "compile").is_dir()


@pytest.mark.parametrize(
    ("extra", "env", "msg"),
    [
        (["--no-cache", "--cache-dir", "x"], None, "--no-cache with --cache-dir"),
        (["--target", "emu", "--cache-dir", "x"], None, "--cache-dir is an option of --target htp"),
        ([], "lots", "QHX_EXPORT_CACHE_MAX_GB='lots'"),
    ],
)
def test_bad_cache_options(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    env: str | None,
    msg: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("QHX_EXPORT_CACHE_MAX_GB", env)
    rc, err = export([str(tiny_gguf("llama")), "-o", str(tmp_path / "b"), *extra], capsys)
    lines = err.strip().splitlines()
    assert rc == 1 and msg in lines[-1] and sum("error" in ln for ln in lines) == 1, err
    assert not (tmp_path / "b").exists()
