"""Readers: GGUF and HF directories give the family's tensors in HF layout, and the reference
forward over read weights matches the forward over the originals."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from qhx_export import ExportError
from qhx_export.read import open_checkpoint
from qhx_export.read.gguf import GgufCheckpoint

from .conftest import tiny_config, tiny_weights, write_gguf, write_hf

Q = gguf.GGMLQuantizationType
IDS = [1, 40, 41, 7, 250, 3]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_gguf_reads_back_exactly(tmp_path: Path, family: str) -> None:
    c = tiny_config(family)
    w = tiny_weights(c, seed=11)
    ck = open_checkpoint(str(write_gguf(tmp_path / "m.gguf", c, w)))
    assert ck.config == c and ck.family.name == family
    for name, arr in w.items():
        assert np.array_equal(ck.float32(name), arr), name  # llama's q/k permutation undone exactly
    assert np.array_equal(ck.family.forward(c, ck.weights(), IDS), ck.family.forward(c, w, IDS))


def test_quantized_gguf_is_close_and_raw_rows_move_whole_blocks(tmp_path: Path) -> None:
    c = tiny_config("llama")
    w = tiny_weights(c, seed=12)
    kinds = {"attn_q": Q.Q4_1, "attn_k": Q.Q8_0, "attn_v": Q.Q5_1, "ffn_up": Q.Q4_0}
    path = write_gguf(
        tmp_path / "m.gguf",
        c,
        w,
        types=lambda n: next(
            (t for k, t in kinds.items() if k in n), Q.F16 if n.endswith("weight") else Q.F32
        ),
    )
    ck = open_checkpoint(str(path))
    assert isinstance(ck, GgufCheckpoint)
    q = ck.float32("blk.0.attn_q.weight")
    assert np.abs(q - w["blk.0.attn_q.weight"]).max() < 0.1
    raw = ck.raw_rows("blk.0.attn_q.weight")  # [rows, 2 blocks * 20 bytes], HF row order
    assert raw.shape == (c.q_rows, c.hidden // 32 * 20)
    from qhx_export.dequant import GgmlType, dequantize

    assert np.array_equal(dequantize(raw, GgmlType.Q4_1, [c.q_rows, c.hidden]), q)
    logits = ck.family.forward(c, ck.weights(), IDS)
    want = ck.family.forward(c, w, IDS)
    assert np.abs(logits - want).max() < 0.1 * np.abs(want).max()


def test_hf_dir_reads_back_exactly(tmp_path: Path) -> None:
    for family in ("llama", "qwen2", "qwen3"):
        c = tiny_config(family)
        w = tiny_weights(c, seed=13)
        ck = open_checkpoint(str(write_hf(tmp_path / family, c, w)))
        assert ck.config == c
        assert list(ck.shapes) == list(w)
        for name, arr in w.items():
            assert np.array_equal(ck.float32(name), arr), name


def test_hf_bf16_and_tied_copy(tmp_path: Path) -> None:
    """BF16 tensors (no numpy dtype) are widened; a stored copy of a tied lm_head is dropped."""
    from safetensors.numpy import save_file

    c = tiny_config("qwen3")  # tied
    w = tiny_weights(c, seed=14)
    d = write_hf(tmp_path / "m", c, w)
    fam = open_checkpoint(str(d)).family
    bf = {fam.hf_name(n, c): (a.view(np.uint32) >> 16).astype(np.uint16) for n, a in w.items()}
    # write a BF16 file by hand: safetensors' numpy API has no bfloat16 either
    header: dict[str, object] = {}
    blobs, off = [], 0
    for k, a in bf.items():
        header[k] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    hb = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(len(hb).to_bytes(8, "little") + hb + b"".join(blobs))
    save_file({"lm_head.weight": w["token_embd.weight"]}, str(d / "extra.safetensors"))
    ck = open_checkpoint(str(d))
    assert "output.weight" not in ck.shapes and ck.family is fam
    for name, arr in w.items():
        want = ((arr.view(np.uint32) >> 16) << 16).view(np.float32)
        assert np.array_equal(ck.float32(name), want), name


def test_hf_errors(tmp_path: Path) -> None:
    c = tiny_config("llama")
    w = tiny_weights(c)
    d = write_hf(tmp_path / "m", c, w)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "gemma3"}))
    with pytest.raises(
        ExportError,
        match=r"config\.json: model_type is 'gemma3'; supported: gemma3_text, lfm2, llama, qwen2, qwen3",
    ):
        open_checkpoint(str(d))
    (d / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 95}))
    with pytest.raises(ExportError, match=r"tensor blk\.0\.ffn_gate\.weight has shape \[96, 64\]"):
        open_checkpoint(str(d))
    (d / "config.json").write_text("{")
    with pytest.raises(ExportError, match=r"config\.json: not valid JSON"):
        open_checkpoint(str(d))
    (d / "config.json").unlink()
    with pytest.raises(ExportError, match=r"no config\.json"):
        open_checkpoint(str(d))
