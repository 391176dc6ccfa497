"""--target htp for Gemma 3 and LFM2 on tiny models (tests/fixtures/tiny_models.py's gemma3w and lfm2,
with their real tokenizers): compiled by onnxruntime-qnn, run by qhx_generate on the x86 HTP
simulator (--verify) with ids equal to the ORT loop over the same binaries. Gemma 3 runs past its
sliding window (8) with a window prefill (and, outside CI, a chunked one); LFM2 runs the qhx layout
(f32 I/O) and the LFM2 runner's split-v1 layout (fp16 I/O). Skipped without onnxruntime-qnn,
qhx_generate or the tokenizers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .test_htp import export, qhx_generate
from .test_lfm2_layout import REPO, smollm2_tokenizer, tiny_models

pytest.importorskip("onnxruntime_qnn")
GEMMA_GGUF = (
    Path(os.environ.get("QHX_CACHE", Path.home() / ".cache" / "qhx"))
    / "assets/gemma3/gemma-3-270m-q4_k_m.gguf"
)


def gemma_tokenizer(tmp: Path) -> Path | None:
    made = REPO / "target" / "goldens-tok" / "gemma3.json"
    if made.exists():
        return made
    if not GEMMA_GGUF.exists():
        return None
    from qhx_export.read import open_checkpoint

    p = tmp / "gemma3-tokenizer.json"
    p.write_bytes(open_checkpoint(str(GEMMA_GGUF)).tokenizer_json())
    return p


def tiny_dir(tmp: Path, family: str) -> Path:
    tok = gemma_tokenizer(tmp) if family == "gemma3w" else smollm2_tokenizer(tmp)
    mod = tiny_models()
    if tok is None or mod is None:
        pytest.fail(f"no tokenizer for tiny {family}: run scripts/fetch-assets.sh smollm2 gemma3")
    return Path(mod.write_hf_dir(family, str(tmp / family), str(tok)))


@pytest.mark.parametrize(
    ("family", "more"),
    [
        pytest.param(
            "gemma3w",
            ["--prefill", "past", "--ar", "4", "--ctx", "32"],
            # chunked prefill past the sliding window, outside CI (scripts/export-slow.sh). With the
            # single fp16 ops one near-tie (margin 0.008) on the second prompt resolved differently
            # in qhx_generate and the ORT loop (it was xfail); with the exact float ops they agree
            marks=pytest.mark.slow,
        ),
        ("gemma3w", ["--ar", "4", "--ctx", "32"]),
        # test_htp_goldens runs the qhx layout against the HF goldens in CI; --verify here too
        # only outside it (scripts/export-slow.sh), for CI's time budget
        pytest.param("lfm2", ["--ar", "4", "--ctx", "32"], marks=pytest.mark.slow),
        ("lfm2", ["--ar", "4", "--ctx", "32", "--layout", "lfm2-split-v1"]),
    ],
)
def test_tiny_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str, more: list[str]
) -> None:
    qhx_generate()
    src = tiny_dir(tmp_path, family)
    out = tmp_path / "b"
    rc, lines, err = export(
        [str(src), "-o", str(out), "--arch", "v79", *more, "--verify", "--verify-tokens", "8"], capsys
    )
    assert rc == 0, err
    rep = json.loads((out / "export-report.json").read_text())
    (res,) = rep["verify"].values()
    assert len(res["rows"]) == 2 and all(r["ort_equal"] for r in res["rows"]), res["rows"]
    assert res["mean"] >= 0.98
    man = json.loads(Path(lines[-1]).read_text())
    if family == "gemma3w":
        assert man["layers"]["types"] == ["sliding_attention", "sliding_attention", "full_attention"]
        assert man["layers"]["sliding_window"] == 8
    elif "--layout" in more:
        assert sorted(p.name for p in out.glob("*.bin")) == [
            "lfm230_dec_512_w8.bin",
            "lfm230_lmh_w8.bin",
            "lfm230_pf_512_w8.bin",
            "lfm_embed_f16.bin",
        ]
        assert "source" not in man and "lfm2-5-230m.json" in rep["real"]
    else:
        assert man["layers"]["state"]["conv"]["width"] == 3
