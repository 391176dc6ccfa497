"""-o DIR never costs the user a file: a directory that is not a bundle of ours is refused
untouched, a previous bundle is replaced only with --force (and only if nothing was added to
it), and leftovers (DIR.partial, DIR.old) are removed only when they are ours."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from qhx_export import ExportError
from qhx_export.write.files import MARKER, staged_dir

from .test_cli import check_error, emu, run


def snapshot(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def bundle(tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "b"
    rc, _, err = run(emu(tiny_gguf(), out), capsys)
    assert rc == 0, err
    return out


def test_marker_lists_every_file(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = bundle(tmp_path, tiny_gguf, capsys)
    doc = json.loads((out / MARKER).read_text())
    assert doc["writer"] == "qhx-export" and doc["complete"] is True
    assert sorted(doc["files"]) == sorted(k for k in snapshot(out) if k != MARKER)
    assert "tiny-test.json" in doc["files"]


def test_foreign_directory_refused_untouched(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    (models / "notes.txt").write_text("mine")
    (models / "sub" / "other.gguf").write_bytes(b"\0" * 64)
    before = snapshot(models)
    for more in ([], ["--force"], ["--format", "genie", "--target", "htp"]):
        htp = [str(tiny_gguf()), "-o", str(models), *more]
        args = htp if "htp" in more else emu(tiny_gguf(), models, *more)
        rc, out, err = run(args, capsys)
        check_error(rc, err, 1, str(models), "not a bundle of qhx-export", "nothing was touched")
        assert out == ""
        assert snapshot(models) == before
        assert not (tmp_path / "models.partial").exists()


def test_previous_bundle_needs_force(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = bundle(tmp_path, tiny_gguf, capsys)
    before = snapshot(out)
    rc, _, err = run(emu(tiny_gguf(), out, "--name", "x"), capsys)
    check_error(rc, err, 1, str(out), "previous bundle", "--force")
    assert snapshot(out) == before
    rc, stdout, err = run(emu(tiny_gguf(), out, "--name", "x", "--force"), capsys)
    assert rc == 0, err
    assert stdout.splitlines()[-1] == str(out / "x.json")
    assert not (out / "tiny-test.json").exists() and (out / "x.json").is_file()
    assert not (tmp_path / "b.old").exists() and not (tmp_path / "b.partial").exists()


def test_force_refuses_a_bundle_with_a_users_file(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = bundle(tmp_path, tiny_gguf, capsys)
    (out / "my-notes.md").write_text("do not lose me")
    before = snapshot(out)
    rc, _, err = run(emu(tiny_gguf(), out, "--force"), capsys)
    check_error(rc, err, 1, "'my-notes.md'", "not written by qhx-export", "nothing was touched")
    assert snapshot(out) == before


def test_arch_all_subdirectories(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "all"
    rc, _, err = run(emu(tiny_gguf(), out, "--arch", "all"), capsys)
    assert rc == 0, err
    files = json.loads((out / MARKER).read_text())["files"]
    assert {f.split("/")[0] for f in files if "/" in f} == {"v73", "v75", "v79", "v81"}
    rc, _, err = run(emu(tiny_gguf(), out, "--arch", "all", "--force"), capsys)
    assert rc == 0, err
    (out / "v75" / "calib.txt").write_text("mine")
    (out / "v79" / "extra").mkdir()
    before = snapshot(out)
    rc, _, err = run(emu(tiny_gguf(), out, "--arch", "all", "--force"), capsys)
    check_error(rc, err, 1, "'v75/calib.txt' and 1 more", "not written by qhx-export")
    assert snapshot(out) == before and (out / "v79" / "extra").is_dir()


def test_a_file_a_symlink_and_an_empty_directory(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    for more in ([], ["--force"]):
        rc, _, err = run(emu(tiny_gguf(), f, *more), capsys)
        check_error(rc, err, 1, "-o", "not a directory")
        assert f.read_text() == "x"
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "keep").write_text("k")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    rc, _, err = run(emu(tiny_gguf(), tmp_path / "link", "--force"), capsys)
    check_error(rc, err, 1, "symbolic link")
    assert (tmp_path / "real" / "keep").read_text() == "k" and (tmp_path / "link").is_symlink()
    (tmp_path / "empty").mkdir()
    rc, _, err = run(emu(tiny_gguf(), tmp_path / "empty"), capsys)
    assert rc == 0, err
    assert (tmp_path / "empty" / "tiny-test.json").is_file()


def test_read_only_parent(tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    # procfs refuses new directories even to root (chmod would not stop a root test run)
    out = Path("/proc/qhx-export-test-bundle")
    rc, _, err = run(emu(tiny_gguf(), out), capsys)
    check_error(rc, err, 1, "-o", "cannot create")
    assert not out.exists()


def test_leftovers_removed_only_when_ours(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b"
    partial = tmp_path / "b.partial"
    partial.mkdir()
    (partial / "thesis.tex").write_text("mine")
    rc, _, err = run(emu(tiny_gguf(), out), capsys)
    check_error(rc, err, 1, str(partial), "not written by qhx-export")
    assert (partial / "thesis.tex").read_text() == "mine" and not out.exists()
    # a killed run's work directory (marker written first, marked incomplete) is cleared
    (partial / "thesis.tex").unlink()
    (partial / MARKER).write_text(json.dumps({"writer": "qhx-export", "complete": False, "files": []}))
    (partial / "half.bin").write_bytes(b"\1" * 10)
    rc, _, err = run(emu(tiny_gguf(), out), capsys)
    assert rc == 0, err
    assert not partial.exists() and (out / "tiny-test.json").is_file()
    # a foreign DIR.old is never removed to make room for the swap
    old = tmp_path / "b.old"
    old.mkdir()
    (old / "x").write_text("mine")
    rc, _, err = run(emu(tiny_gguf(), out, "--force"), capsys)
    check_error(rc, err, 1, str(old), "not written by qhx-export")
    assert (old / "x").read_text() == "mine" and (out / "tiny-test.json").is_file()
    assert not partial.exists()


def test_file_added_during_the_export_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "b"
    with staged_dir(str(out)) as tmp:
        Path(tmp, "m.json").write_text("{}")
    with pytest.raises(ExportError, match=r"'late\.txt'"):
        with staged_dir(str(out), force=True) as tmp:
            Path(tmp, "m.json").write_text("{}")
            (out / "late.txt").write_text("written while the export ran")
    assert (out / "late.txt").is_file() and (out / "m.json").is_file()
    assert not Path(str(out) + ".partial").exists()
    assert os.listdir(tmp_path) == ["b"]
