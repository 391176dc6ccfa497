"""The exporter's bad-input catalogue (output-directory cases: test_out_dir.py): one line on
stderr naming the file / tensor / option, a non-zero exit, no traceback, and nothing left
behind (no DIR, no DIR.partial)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from qhx_export.cli import main

from .conftest import tiny_config, tiny_weights, write_gguf

Q = gguf.GGMLQuantizationType


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.out, cap.err


def check_error(rc: int, err: str, want_rc: int, *needles: str) -> None:
    assert rc == want_rc, err
    last = err.strip().splitlines()[-1]
    kind = "error: " if want_rc == 1 else "not implemented: "
    assert last.startswith(f"qhx-export: {kind}"), err
    for n in needles:
        assert n in last, (n, last)
    assert sum(line.startswith("qhx-export: error") for line in err.splitlines()) <= 1


def emu(path: Path | str, out: Path, *more: str) -> list[str]:
    return [str(path), "-o", str(out), "--target", "emu", "--ar", "4", "--ctx", "8", *more]


def test_ok_and_stdout_last_line(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(emu(tiny_gguf(), tmp_path / "b"), capsys)
    assert rc == 0 and out.splitlines()[-1] == str(tmp_path / "b" / "tiny-test.json")
    assert not (tmp_path / "b.partial").exists()
    # a rerun replaces the bundle with --force (tests/test_out_dir.py: without it, refused)
    rc, out, _ = run(emu(tiny_gguf(), tmp_path / "b", "--name", "x", "--force"), capsys)
    assert rc == 0 and sorted(p.name for p in (tmp_path / "b").iterdir())[:2] == [
        ".qhx-export.json",
        "tokenizer.json",
    ]


def test_not_a_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "model.gguf"
    f.write_text("hello, this is not a model\n")
    rc, _, err = run(emu(f, tmp_path / "b"), capsys)
    check_error(rc, err, 1, str(f), "not a GGUF file")
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


@pytest.mark.parametrize("keep", [0.5, 0.05, 6 / 1_000_000])
def test_truncated_gguf(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str], keep: float
) -> None:
    src = tiny_gguf()
    data = src.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(6, int(len(data) * keep))])
    rc, _, err = run(emu(cut, tmp_path / "b"), capsys)
    check_error(rc, err, 1, str(cut))
    assert "truncated" in err
    for numpy_words in ("dtype", "divisor", "reshape", "out of bounds", "Error:"):
        assert numpy_words not in err, err
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_truncated_gguf_names_what_is_cut(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A cut inside a tensor names the tensor, its byte range and the whole file's size; a cut
    inside the header names the metadata key it falls in (gguf's reader itself fails with
    numpy's "When changing to a larger dtype ..." or "cannot reshape" there)."""
    import gguf as gguf_py

    src = tiny_gguf()
    data = src.read_bytes()
    r = gguf_py.GGUFReader(str(src))
    last = max(r.tensors, key=lambda t: int(t.data_offset))
    first_key = next(k for k in r.fields if not k.startswith("GGUF."))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(last.data_offset) + 3])
    rc, _, err = run(emu(cut, tmp_path / "b"), capsys)
    check_error(
        rc, err, 1, str(cut), f"truncated at {int(last.data_offset) + 3} bytes", f"tensor {last.name} ("
    )
    check_error(rc, err, 1, f"the whole file is {len(data)} bytes")
    cut.write_bytes(data[:40])
    rc, _, err = run(emu(cut, tmp_path / "b"), capsys)
    check_error(rc, err, 1, "truncated at 40 bytes, inside metadata")
    assert first_key in err or "metadata key 1 of" in err


def test_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(emu(tmp_path / "nope.gguf", tmp_path / "b"), capsys)
    check_error(rc, err, 1, "nope.gguf: no such file")


def test_unknown_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = tiny_config("llama")
    path = write_gguf(tmp_path / "m.gguf", c, tiny_weights(c), meta_over={"general.architecture": "mamba"})
    rc, _, err = run(emu(path, tmp_path / "b"), capsys)
    check_error(rc, err, 1, str(path), "general.architecture is 'mamba'", "llama, qwen2, qwen3")


def test_unsupported_tensor_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = tiny_config("llama", hidden=256, head_dim=64)
    path = write_gguf(
        tmp_path / "m.gguf",
        c,
        tiny_weights(c),
        types=lambda n: Q.Q2_K if n == "blk.1.attn_q.weight" else Q.F32,
    )
    rc, _, err = run(emu(path, tmp_path / "b"), capsys)
    check_error(rc, err, 1, str(path), "blk.1.attn_q.weight", "Q2_K")


def test_unknown_tensor_type_id(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A type id no GGML version defines (patched into the tensor directory)."""
    path = tiny_gguf()
    data = bytearray(path.read_bytes())
    name = b"output_norm.weight"
    at = data.index(name) + len(name)  # then: u32 n_dims (1), u64 dim, u32 type
    assert int.from_bytes(data[at : at + 4], "little") == 1
    data[at + 12 : at + 16] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    rc, _, err = run(emu(path, tmp_path / "b"), capsys)
    check_error(rc, err, 1, str(path), "99")


def test_shape_the_family_does_not_allow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = tiny_config("llama")
    w = tiny_weights(c)
    w["blk.0.attn_k.weight"] = w["blk.0.attn_k.weight"][:16]
    path = write_gguf(tmp_path / "m.gguf", c, {k: v for k, v in w.items()})
    rc, _, err = run(emu(path, tmp_path / "b"), capsys)
    check_error(rc, err, 1, str(path), "blk.0.attn_k.weight")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--arch", "v99"], ["--arch", "v99"]),
        (["--precision", "int3"], ["--precision"]),
        (["--ctx", "0"], ["--ctx 0"]),
        (["--calib-steps", "0"], ["--calib-steps 0"]),
        (["--ar", "16"], ["--ar 16 exceeds --ctx 8"]),
        (["--ar", "x"], ["--ar", "'x'"]),
        (["--name", "a/b"], ["--name 'a/b'"]),
        (["--soc", "60", "--arch", "all"], ["--soc", "--arch all"]),
        (["--io", "ufixed16"], ["--io ufixed16 needs --calib"]),
        (["--precision", "w8a16"], ["--precision"]),
        (["--bogus"], ["--bogus"]),
    ],
)
def test_bad_options(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needles: list[str],
) -> None:
    rc, _, err = run(emu(tiny_gguf(), tmp_path / "b", *args), capsys)
    check_error(rc, err, 1, *needles)
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--precision", "w8a16", "--quant-method", "gptq"], ["--quant-method is for --precision w4a16"]),
        (["--head-precision", "int4"], ["--head-precision is for --precision w4a16"]),
        (["--rotate", "hadamard"], ["--rotate is for --precision w8a16 / w4a16"]),
        (["--precision", "w4a16", "--quant-method", "awq"], ["--quant-method", "'awq'"]),
        (["--verify-ppl-tokens", "-1"], ["--verify-ppl-tokens -1"]),
    ],
)
def test_bad_htp_options(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needles: list[str],
) -> None:
    out = tmp_path / "b"
    rc, _, err = run([str(tiny_gguf()), "-o", str(out), "--ar", "4", "--ctx", "8", *args], capsys)
    check_error(rc, err, 1, *needles)
    assert not out.exists() and not (tmp_path / "b.partial").exists()


def test_not_implemented_exits_2(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tiny_gguf()
    htp = [str(path), "-o", str(tmp_path / "b")]  # --target htp (the default)
    rc, _, err = run([*htp, "--kv-dtype", "u8"], capsys)
    check_error(rc, err, 1, "--kv-dtype u8 needs a quantized --precision")
    rc, _, err = run([*htp, "--format", "genie", "--kv-layout", "head_major"], capsys)
    check_error(rc, err, 1, "--kv-layout is for qhx graphs")
    for more in (["--kv-dtype", "u8"], ["--format", "genie"]):
        rc, _, err = run(emu(path, tmp_path / "b", *more), capsys)
        check_error(rc, err, 2, more[0])
    qwen3 = tiny_gguf("qwen3", name="q3.gguf")  # the emulator runs Qwen3 (QK-norm) since arch "qwen3"
    rc, _, err = run(emu(qwen3, tmp_path / "q3"), capsys)
    assert rc == 0, err
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_unwritable_output(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    rc, _, err = run(emu(tiny_gguf(), tmp_path / "file"), capsys)
    check_error(rc, err, 1, "-o", "not a directory")
    rc, _, err = run(emu(tiny_gguf(), tmp_path / "file" / "sub"), capsys)
    check_error(rc, err, 1, "-o", "cannot create")


def test_interrupt_leaves_nothing(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import qhx_export.write.emu as emu_mod

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(emu_mod, "write_graph_binaries", interrupted)
    rc, _, err = run(emu(tiny_gguf(), tmp_path / "b"), capsys)
    assert rc == 130 and "interrupted" in err
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_estimate_figures_read_as_milliseconds() -> None:
    from qhx_export.compile.estimate import ms, rate

    assert [ms(u) for u in (3.21, 52.0, 5229.0, 123_456.0)] == ["0.00321", "0.052", "5.23", "123"]
    assert [rate(r) for r in (15873.04, 67.13)] == ["15,873", "67.1"]
