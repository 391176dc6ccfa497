"""--layout lfm2-split-v1 / lfm2-shared-v1: the LFM2 runner's file names, graph names and manifest
form, what they refuse, and (when target/release holds qhx_generate and libqnn_emu.so) the same
greedy ids from all three layouts of one tiny LFM2 on the emulator."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from qhx_export.cli import main
from qhx_export.write.emu import read_context

from .test_families_new import hf_copy, one_line_error, run

REPO = Path(__file__).resolve().parents[2]
RELEASE = REPO / "target" / "release"
SMOLLM2_GGUF = (
    Path(os.environ.get("QHX_CACHE", Path.home() / ".cache" / "qhx"))
    / "assets"
    / "smollm2"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)

SPLIT = {
    "schema_version": 1,
    "model": {"name": "lfm2-5-230m", "family": "llm", "dsp_arch": "v79"},
    "params": {
        "hidden": 32,
        "vocab": 64,
        "n_layers": 3,
        "max_ctx": 16,
        "kv_dim": 16,
        "head_dim": 8,
        "rope_theta": 1000000.0,
        "eos_token_id": 2,
    },
    "artifacts": {
        "contexts": {
            "prefill": {"bin": "lfm230_pf_512_w8.bin"},
            "decode": {"bin": "lfm230_dec_512_w8.bin"},
            "lmhead": {"bin": "lfm230_lmh_w8.bin"},
        },
        "embed": "lfm_embed_f16.bin",
        "tokenizer": "tokenizer.json",
    },
    "chat": {"bos": [1]},
}


def shared_manifest() -> dict:
    m = json.loads(json.dumps(SPLIT))
    m["model"]["name"] = "lfm2-5-350m-2048"
    m["artifacts"]["contexts"] = {"shared": {"bin": "lfm_2048_shared.bin"}, "lmhead": {"bin": "lfm_lmh.bin"}}
    m["plan"] = {
        "params": {"prefill": "lfm_pf_512_f16", "decode": "lfm_dec_2048_f16", "lmhead": "lfm_lmh_f16"}
    }
    return {k: m[k] for k in ("schema_version", "model", "params", "artifacts", "plan", "chat")}


def graphs_of(path: Path) -> list[str]:
    header, _, _ = read_context(str(path))
    return [g["name"] for g in header["graphs"]]


def emu(src: Path, out: Path, layout: str, *more: str) -> list[str]:
    return [str(src), "-o", str(out), "--target", "emu", "--arch", "v79", "--layout", layout, *more]


@pytest.mark.parametrize("layout", ["lfm2-split-v1", "lfm2-shared-v1"])
def test_files_graphs_and_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str) -> None:
    src = hf_copy(tmp_path, "lfm2")
    (src / "tokenizer_config.json").write_text('{"add_bos_token": true}')  # BOS 1, as LFM2's
    out = tmp_path / "b"
    rc, err = run(emu(src, out, layout, "--ar", "4", "--ctx", "16"), capsys)
    assert rc == 0, err
    split = layout == "lfm2-split-v1"
    want = shared_manifest() if not split else SPLIT
    man_name = f"{want['model']['name']}.json"
    bins = [c["bin"] for c in want["artifacts"]["contexts"].values()]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [man_name, *bins, "lfm_embed_f16.bin", "tokenizer.json", ".qhx-export.json"]
    )
    assert json.loads((out / man_name).read_text()) == want
    if split:
        assert [graphs_of(out / b) for b in bins] == [
            ["lfm230_pf_512_w8"],
            ["lfm230_dec_512_w8"],
            ["lfm230_lmh_w8"],
        ]
    else:
        assert [graphs_of(out / b) for b in bins] == [["lfm_pf_512_f16", "lfm_dec_2048_f16"], ["lfm_lmh_f16"]]
    # the contract's tensors, all fp16, conv state without a layers section
    dec_bin = out / bins[1 if split else 0]
    (dec,) = [g for g in read_context(str(dec_bin))[0]["graphs"] if "dec" in g["name"]]
    names = {t["name"]: t for t in dec["inputs"] + dec["outputs"]}
    assert {t["dtype"] for t in names.values()} == {"f16"}
    assert names["past_conv_0"]["dims"] == [32, 3] and names["present_conv_2"]["dims"] == [32, 3]
    assert names["past_k_1"]["dims"] == [16, 16] and "past_k_0" not in names
    assert os.path.getsize(out / "lfm_embed_f16.bin") == 64 * 32 * 2
    # --model-name renames the manifest (a name the runner knows as LFM2)
    rc, err = run(
        emu(src, tmp_path / "n", layout, "--ar", "4", "--ctx", "16", "--model-name", "lfm2-x"), capsys
    )
    assert rc == 0, err
    assert json.loads((tmp_path / "n" / "lfm2-x.json").read_text())["model"]["name"] == "lfm2-x"


@pytest.mark.parametrize(
    ("family", "more", "needle"),
    [
        ("gemma3", [], "LFM2 runner's bundle form; this model is gemma3"),
        ("qwen3", [], "this model is qwen3"),
        ("lfm2", ["--verify-rows", "2"], "no verify graph"),
        ("lfm2", ["--prefill", "past"], "--prefill window"),
        ("lfm2", ["--prefill", "none"], "--prefill window"),
        ("lfm2", ["--io", "f32"], "fp16"),
        ("lfm2", ["--embed-dtype", "f32"], "fp16"),
        ("lfm2", ["--name", "x"], "fixed by the contract (--name)"),
        ("lfm2", ["--model-name", "tiny"], "must start with 'lfm'"),
        ("lfm2", ["--shared"], "--shared cannot hold"),
        ("lfm2", ["--kv-layout", "head_major"], "head_major cannot hold"),
    ],
)
def test_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str, more: list[str], needle: str
) -> None:
    src = hf_copy(tmp_path, family)
    out = tmp_path / "b"
    rc, err = run(emu(src, out, "lfm2-split-v1", "--ar", "4", "--ctx", "16", *more), capsys)
    one_line_error(rc, err, 1, needle)
    assert not out.exists() and not (tmp_path / "b.partial").exists()


def test_htp_refuses_quantized_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = hf_copy(tmp_path, "lfm2")
    rc, err = run(
        [str(src), "-o", str(tmp_path / "b"), "--layout", "lfm2-split-v1", "--precision", "w8a16"], capsys
    )
    one_line_error(rc, err, 1, "fp16")


# ---- the same ids from every layout (qhx_generate on the emulator) -------------------------------


def smollm2_tokenizer(tmp: Path) -> Path | None:
    """The SmolLM2 tokenizer.json tiny LFM2 uses: goldens.py's copy, or converted from the asset."""
    made = REPO / "target" / "goldens-tok" / "smollm2.json"
    if made.exists():
        return made
    if not SMOLLM2_GGUF.exists():
        return None
    from qhx_export.read import open_checkpoint

    p = tmp / "smollm2-tokenizer.json"
    p.write_bytes(open_checkpoint(str(SMOLLM2_GGUF)).tokenizer_json())
    return p


def tiny_models() -> ModuleType | None:
    """tests/fixtures/tiny_models.py (the parity goldens' tiny weights), or None outside a checkout."""
    script = REPO / "tests" / "fixtures" / "tiny_models.py"
    if not script.exists():
        return None
    spec = importlib.util.spec_from_file_location("tiny_models", script)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tiny_models"] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_lfm2_dir(tmp: Path) -> Path:
    """tests/fixtures/tiny_models.py's LFM2 (the parity goldens' weights) with the SmolLM2 tokenizer, or
    the test data's LFM2 (no text tokenizer: prompts go in as ids)."""
    tok = smollm2_tokenizer(tmp)
    mod = tiny_models()
    if tok is None or mod is None:
        return hf_copy(tmp, "lfm2")
    return Path(mod.write_hf_dir("lfm2", str(tmp / "lfm2-tiny"), str(tok)))


def qhx_ids(manifest: Path, n: int, prompt: str | None, ids: list[int] | None) -> list[int]:
    emu_lib = str(RELEASE / "libqnn_emu.so")
    cmd = [str(RELEASE / "qhx_generate"), str(manifest), emu_lib, emu_lib, str(manifest.parent), str(n)]
    if ids is not None:
        f = manifest.parent / "prompt.ids"
        f.write_text(",".join(map(str, ids)))
        cmd += ["--tokens-in", str(f), "--ignore-eos"]
    else:
        cmd += [str(prompt)]
    r = subprocess.run([*cmd, "--json", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-800:]
    doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    return [int(t) for t in doc["output_ids"]]


@pytest.mark.skipif(
    not (RELEASE / "qhx_generate").exists() or not (RELEASE / "libqnn_emu.so").exists(),
    reason="target/release/qhx_generate and libqnn_emu.so not built (cargo build --release)",
)
def test_layouts_give_the_same_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tiny_lfm2_dir(tmp_path)
    text = (src / "qhx_source.json").exists()
    prompt, ids = ("The capital of France is", None) if text else (None, [1, 5, 9, 13, 17])
    got = {}
    for layout in ("qhx", "lfm2-split-v1", "lfm2-shared-v1"):
        out = tmp_path / layout
        more = ["--io", "f16", "--embed-dtype", "f16", "--name", "lfm2"] if layout == "qhx" else []
        rc = main(emu(src, out, layout, "--ar", "16", "--ctx", "64", *more))
        lines = capsys.readouterr().out.strip().splitlines()
        assert rc == 0
        got[layout] = qhx_ids(Path(lines[-1]), 8, prompt, ids)
    assert got["lfm2-split-v1"] == got["qhx"] == got["lfm2-shared-v1"], got
    golden = REPO / "tests" / "goldens" / "parity" / "lfm2_short.json"
    if text and golden.exists():  # tiny_models' weights: HF transformers' greedy ids
        assert got["qhx"] == json.loads(golden.read_text())["gold_ids"][:8]
