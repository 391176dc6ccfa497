"""The emulator bundle writer: manifest, context binaries decoded per tests/qnn-emu/FORMAT.md
against the weights the GGUF was written from (the gguf package's own quantize / dequantize, not
this package's reader), the HF-directory path, --arch all, verify graphs and their bad options."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from qhx_export.cli import main
from qhx_export.dequant import GgmlType, dequantize
from qhx_export.read import open_checkpoint
from qhx_export.write.emu import EmuOptions, read_context, write_bundle

from .conftest import tiny_config, tiny_weights, write_gguf, write_hf
from .test_cli import emu as cli_emu

Q = gguf.GGMLQuantizationType
EMU_ENC = {"q4_1": Q.Q4_1, "q8_0": Q.Q8_0, "f32": Q.F32}  # FORMAT.md's encodings: GGML's blocks


def types(name: str) -> GgmlType:
    if name == "token_embd.weight":
        return Q.Q8_0
    if "attn_v" in name:
        return Q.Q5_0  # not an emulator encoding: dequantized to f32 in the bundle
    return Q.Q4_1 if name.endswith("weight") and "norm" not in name else Q.F32


def as_stored(a: np.ndarray, qt: GgmlType) -> np.ndarray:
    """What a weight reads as after the GGUF's quantization (gguf's quantizer and dequantizer)."""
    return a if qt == Q.F32 else gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt)


def test_manifest_and_binaries(tmp_path: Path) -> None:
    c = tiny_config("llama")
    w = tiny_weights(c, seed=21)
    path = write_gguf(tmp_path / "Tiny-Test.Q4_1.gguf", c, w, types=types)
    out = tmp_path / "b"
    out.mkdir()
    ck = open_checkpoint(str(path))
    man_path, sizes = write_bundle(
        ck, str(out), EmuOptions(name="tiny", prefill_len=8, ctx=32), lambda m: None
    )
    man = json.loads(Path(man_path).read_text())
    assert man["model"] == {
        "name": "tiny-test",
        "family": "llm",
        "arch": "llama",
        "dsp_arch": "v81",
        "soc_model": 87,
        "n_params": sum(a.size for a in w.values()),
    }
    assert man["params"] == {
        "hidden": 64,
        "vocab": 300,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 16,
        "max_ctx": 32,
        "rope_theta": 500000.0,
        "bos_token_id": None,
        "eos_token_id": 2,
        "rope_scaling": c.rope_scaling,
    }
    assert man["plan"] == {"op": "llama_generate", "ar": 8}
    assert man["artifacts"]["contexts"]["decode"] == {"bin": "tiny_decode.bin", "graph": "tiny_decode"}
    assert man["source"]["weights"] == (
        "q4_1 raw blocks (dequantized by the emulator as gguf/transformers do); "
        "q5_0 dequantized to f32 with qhx_export.dequant"
    )
    assert "<|im_start|>" in man["chat"]["template"]
    assert sizes[man_path.rsplit("/", 1)[1]] == os.path.getsize(man_path)
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    # every weight in the binaries decodes (gguf's dequantizer over FORMAT.md's GGML blocks) to the
    # HF-layout weight the GGUF was written from, through the GGUF's quantization: q/k rows are
    # un-permuted, Q4_1 stays raw blocks, Q5_0 is dequantized to f32
    seen = set()
    for kind in ("prefill", "decode", "lmhead"):
        header, d, blob = read_context(str(out / f"tiny_{kind}.bin"))
        assert header["graphs"][0]["name"] == f"tiny_{kind}" and header["model"]["head_dim"] == 16
        for e in header["weights"]:
            raw = np.frombuffer(blob, np.uint8, e["nbytes"], d + e["offset"])
            got = gguf.quants.dequantize(raw, EMU_ENC[e["enc"]]).reshape(e["shape"])
            name = e["name"]
            assert e["enc"] == {Q.Q4_1: "q4_1", Q.Q5_0: "f32", Q.F32: "f32"}[types(name)], e
            assert np.array_equal(got, as_stored(w[name], types(name))), name
            assert np.array_equal(got, dequantize(raw, EMU_ENC[e["enc"]], e["shape"])), name
            seen.add(name)
    assert seen == set(w) - {"token_embd.weight"}
    emb = np.fromfile(out / "tiny_embed_f32.bin", "<f4").reshape(300, 64)
    assert np.array_equal(emb, as_stored(w["token_embd.weight"], Q.Q8_0))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    toks = ck.meta["tokenizer.ggml.tokens"]
    assert tok.encode("hello<|im_start|>hi").ids == [toks.index("hello"), 1, toks.index("h"), toks.index("i")]


def test_hf_dir_to_emu_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = tiny_config("qwen2")
    w = tiny_weights(c, seed=23)
    d = write_hf(tmp_path / "Tiny-Qwen", c, w)
    assert main([str(d), "-o", str(tmp_path / "b"), "--target", "emu", "--ar", "4", "--ctx", "16"]) == 0
    man_path = capsys.readouterr().out.splitlines()[-1]
    assert man_path == str(tmp_path / "b" / "tiny-qwen.json")
    man = json.loads(Path(man_path).read_text())
    assert man["model"]["arch"] == "qwen2" and man["source"]["hf"] == "Tiny-Qwen"
    assert man["source"]["weights"] == "f32 (from safetensors)"
    assert (tmp_path / "b" / "tokenizer.json").read_bytes() == (d / "tokenizer.json").read_bytes()
    header, dstart, blob = read_context(str(tmp_path / "b" / "tiny-qwen_decode.bin"))
    e = next(x for x in header["weights"] if x["name"] == "blk.1.attn_k.bias")
    got = np.frombuffer(blob, "<f4", e["nbytes"] // 4, dstart + e["offset"])
    assert np.array_equal(got, w["blk.1.attn_k.bias"])


def test_arch_all_writes_one_dir_per_arch(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tiny_gguf("llama")
    out = tmp_path / "all"
    assert (
        main([str(path), "-o", str(out), "--target", "emu", "--arch", "all", "--ar", "4", "--ctx", "8"]) == 0
    )
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    # the manifests, then the bundle root (what qhx_generate takes in the manifest's place)
    assert lines == [*(str(out / a / "tiny-test.json") for a in ("v73", "v75", "v79", "v81")), str(out)]
    assert f"bundle root {out}" in cap.err
    socs = [json.loads(Path(p).read_text())["model"]["soc_model"] for p in lines[:-1]]
    assert socs == [57, 60, 69, 87]
    assert read_context(str(out / "v75" / "tiny-test_lmhead.bin"))[0]["dsp_arch"] == "v75"
    assert not (tmp_path / "all.partial").exists()


def test_help_says_arch_all_prints_the_root(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "stdout's last line is DIR itself, the bundle root" in text


RELEASE = Path(__file__).resolve().parents[2] / "target" / "release"


@pytest.mark.skipif(
    not (RELEASE / "qhx_generate").exists() or not (RELEASE / "libqnn_emu.so").exists(),
    reason="target/release/qhx_generate and libqnn_emu.so not built (cargo build --release)",
)
@pytest.mark.parametrize(("arch", "soc"), [("75", "60"), ("81", "87")])
def test_arch_all_root_runs_the_devices_arch(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str], arch: str, soc: str
) -> None:
    """The printed root, given to qhx_generate as is, runs the arch directory of the device (the
    emulator reports QNN_EMU_ARCH) with the same ids as that directory's manifest."""
    import subprocess

    out = tmp_path / "all"
    assert main(cli_emu(tiny_gguf("llama"), out, "--arch", "all")) == 0
    root = capsys.readouterr().out.splitlines()[-1]
    lib = str(RELEASE / "libqnn_emu.so")
    env = dict(os.environ, QNN_EMU_ARCH=arch, QNN_EMU_SOC_MODEL=soc)

    def run(desc: str) -> tuple[list[int], str]:
        cmd = [str(RELEASE / "qhx_generate"), desc, lib, lib, desc if desc == root else str(out / f"v{arch}")]
        r = subprocess.run([*cmd, "6", "hello", "--json", "-v"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr[-600:]
        doc, _ = json.JSONDecoder().raw_decode(r.stdout)
        return [int(t) for t in doc["output_ids"]], r.stderr

    got, err = run(root)
    assert f"bundle description: {out / f'v{arch}' / 'tiny-test.json'}" in err, err[-600:]
    assert got == run(str(out / f"v{arch}" / "tiny-test.json"))[0]


@pytest.mark.parametrize("shared", [False, True])
def test_verify_rows_adds_a_verify_graph_over_the_decode_cache(tmp_path: Path, shared: bool) -> None:
    """--verify-rows K: a K-row graph with past K/V beside decode (same binary, one copy of the
    weights), named by `contexts.verify`; the other graphs are unchanged."""
    c = tiny_config("llama")
    path = write_gguf(tmp_path / "Tiny-Test.Q4_1.gguf", c, tiny_weights(c, seed=23), types=types)
    ck = open_checkpoint(str(path))
    plain, spec = tmp_path / "plain", tmp_path / "spec"
    for d, k in ((plain, None), (spec, 4)):
        d.mkdir()
        o = EmuOptions(name="tiny", prefill_len=8, ctx=32, shared=shared, verify_rows=k)
        write_bundle(ck, str(d), o, lambda m: None)
    man = json.loads((spec / "tiny.json").read_text())["artifacts"]["contexts"]
    bin_name = "tiny_shared.bin" if shared else "tiny_decode.bin"
    assert man["verify"]["graph"] == "tiny_verify"
    assert man["verify"].get("bin", "tiny_shared.bin") == bin_name
    header, _, _ = read_context(str(spec / bin_name))
    g = {x["name"]: x for x in header["graphs"]}
    v = g["tiny_verify"]
    assert (v["kind"], v["seq"], v["ctx"]) == ("prefill", 4, 32)
    dims = {t["name"]: t["dims"] for t in v["inputs"] + v["outputs"]}
    assert dims["x"] == [4, 64] and dims["cmask"] == [4, 36] and dims["past_k_1"] == [32, 32]
    assert dims["new_v_0"] == [4, 32] and dims["y"] == [4, 64]
    # the same weights as the binary without the verify graph: one copy, shared
    plain_header, _, _ = read_context(str(plain / bin_name))
    assert header["weights"] == plain_header["weights"]
    assert [x for x in header["graphs"] if x["name"] != "tiny_verify"] == plain_header["graphs"]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--verify-rows", "1"], "--verify-rows 1: must be 2 or more"),
        (["--verify-rows", "8"], "fewer than the prefill's --ar 8"),
        (["--verify-rows", "40"], "--verify-rows 40: must be 2 or more and at most --ctx 32"),
        (["--verify-rows", "4", "--estimate"], "--estimate is an option of --target htp"),
        (["--target", "htp", "--estimate-verify", "2,4"], "--estimate-verify needs --estimate"),
        (["--target", "htp", "--estimate-verify", "2,x"], "expected row counts such as 2,4,8,16"),
        (["--target", "htp", "--estimate-only", "--verify"], "--estimate-only writes no bundle"),
    ],
)
def test_bad_verify_rows_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    c = tiny_config("llama")
    path = write_gguf(tmp_path / "Tiny-Test.Q4_1.gguf", c, tiny_weights(c, seed=24), types=types)
    argv = [str(path), "-o", str(tmp_path / "out"), "--ar", "8", "--ctx", "32"]
    if "--target" not in flags:
        argv += ["--target", "emu"]
    assert main(argv + flags) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and needle in err[-1], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.mark.skipif(
    not (RELEASE / "qhx_generate").exists() or not (RELEASE / "libqnn_emu.so").exists(),
    reason="target/release/qhx_generate and libqnn_emu.so not built (cargo build --release)",
)
@pytest.mark.parametrize("head", ["logits", "argmax"])
def test_verify_head_reads_a_verify_in_one_execute(tmp_path: Path, head: str) -> None:
    """--verify-head: the lm-head over the verify's K rows sits beside the lm-head (its weights
    once); qhx_generate --spec runs it once per verify, where the one-row head ran once per row,
    and the greedy ids are those of the bundle without it (and of the plain run)."""
    import subprocess

    c = tiny_config("llama")
    path = write_gguf(tmp_path / "Tiny-Test.Q4_1.gguf", c, tiny_weights(c, seed=29), types=types)
    ck = open_checkpoint(str(path))
    plain, vh = tmp_path / "plain", tmp_path / "vh"
    for d, h in ((plain, None), (vh, head)):
        d.mkdir()
        o = EmuOptions(name="tiny", prefill_len=8, ctx=64, prefill="past", verify_rows=4, verify_head=h)
        write_bundle(ck, str(d), o, lambda m: None)
    man = json.loads((vh / "tiny.json").read_text())["artifacts"]["contexts"]
    assert man["verify_head"] == {"bin": "tiny_lmhead.bin", "graph": "tiny_verify_head"}
    header, _, _ = read_context(str(vh / "tiny_lmhead.bin"))
    g = {x["name"]: x for x in header["graphs"]}["tiny_verify_head"]
    assert (g["kind"], g["seq"]) == ("lmhead", 4)
    assert g["outputs"][0]["dims"] == ([4, c.vocab] if head == "logits" else [4])
    assert header["weights"] == read_context(str(plain / "tiny_lmhead.bin"))[0]["weights"]
    lib = str(RELEASE / "libqnn_emu.so")

    def run(d: Path, extra: list[str]) -> tuple[list[int], dict[str, int], dict]:
        trace = d / "trace.json"
        env = dict(os.environ, QNN_EMU_TRACE=str(trace))
        cmd = [str(RELEASE / "qhx_generate"), str(d / "tiny.json"), lib, lib, str(d), "24"]
        r = subprocess.run(
            [*cmd, "a b a b a b a b", "--json", "--ignore-eos", *extra],
            capture_output=True,
            text=True,
            env=env,
        )
        assert r.returncode == 0, r.stderr[-600:]
        doc = json.loads(r.stdout)
        t = json.loads(trace.read_text())
        ex = {name: st["executes"] for name, st in t.get("exec", {}).items()}
        return [int(x) for x in doc["output_ids"]], ex, doc.get("spec") or {}

    spec = ["--spec", "lookup", "--spec-adaptive", "off", "--lookup-min", "1", "--draft-max", "3"]
    base, _, _ = run(plain, [])
    ids_p, ex_p, sp_p = run(plain, spec)
    ids_v, ex_v, sp_v = run(vh, spec)
    assert ids_p == base and ids_v == base
    verifies = sp_v["verifies"]
    assert verifies > 0 and sp_v == sp_p
    assert ex_v.get("tiny_verify_head") == verifies, ex_v
    # the one-row head ran once per verify row before (every token a verify yielded); now a
    # verify runs none of it
    yielded = round(sp_v["tokens_per_verify"] * verifies)
    assert ex_p["tiny_lmhead"] - ex_v["tiny_lmhead"] == yielded, (ex_v, ex_p, sp_v)
