"""GGUF tokenizer metadata (`tokenizer.ggml.*`) -> a HF `tokenizers` JSON.

Two vocabularies, chosen by `tokenizer.ggml.model`:
* "gpt2": byte-level BPE (`build_bpe_tokenizer`), written as json.dumps(..., ensure_ascii=False,
  indent=1); built to encode like transformers' own GGUF tokenizer conversion.
* "llama" in a Gemma GGUF (architecture gemma / gemma2 / gemma3): SentencePiece-style BPE with
  byte fallback (`build_gemma_tokenizer`). The file has no merges; they are rebuilt from the
  vocabulary order.
Both are built to encode like transformers' own GGUF tokenizer conversion
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qhx_export import ExportError

# GGUF token types (llama.cpp llama_token_type)
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4
# Architectures whose "llama" (SentencePiece) vocabulary is Gemma's: BPE, byte fallback, no
# prefix space, spaces spelled U+2581.
GEMMA_ARCHES = ("gemma", "gemma2", "gemma3")
SPIECE_SPACE = "\u2581"

# Split patterns for `tokenizer.ggml.pre` values whose merges were learned with a split other
# than GPT-2's (which ByteLevel(use_regex=True) applies by itself).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_SPLITS = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "pixtral"), _LLAMA3_SPLIT
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# pre-tokenizer names that GPT-2's own split serves
PRE_GPT2 = {"default", "gpt2", "gpt-2", "smollm", "starcoder", "refact", "olmo", "jais"}

Warn = Callable[[str], None]


def _stderr_warn(msg: str) -> None:
    print(f"qhx-export: warning: {msg}", file=sys.stderr)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, spare = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + spare)
            spare += 1
    return table


def _need(meta: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in meta:
        raise ExportError(f"{where}: missing metadata key {key}")
    return meta[key]


def build_tokenizer(meta: Mapping[str, Any], where: str, warn: Warn = _stderr_warn) -> dict[str, Any]:
    """A `tokenizers` JSON object from the GGUF's tokenizer metadata."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        return build_bpe_tokenizer(meta, where, warn)
    arch = meta.get("general.architecture")
    if kind == "llama" and arch in GEMMA_ARCHES:
        return build_gemma_tokenizer(meta, where, warn)
    raise ExportError(
        f"{where}: tokenizer.ggml.model is {kind!r} (architecture {arch!r}); supported: byte-level BPE"
        f" ('gpt2') and Gemma's SentencePiece vocabulary ('llama' in {', '.join(GEMMA_ARCHES)})"
    )


def build_bpe_tokenizer(meta: Mapping[str, Any], where: str, warn: Warn = _stderr_warn) -> dict[str, Any]:
    """Byte-level BPE (`tokenizer.ggml.model` "gpt2")."""
    tokens: Sequence[str] = _need(meta, "tokenizer.ggml.tokens", where)
    merges: Sequence[str] = _need(meta, "tokenizer.ggml.merges", where)
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ExportError(f"{where}: tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")

    table = byte_alphabet()
    alphabet = set(table.values())

    def spelled(tok: str) -> str:
        # llama.cpp stores a few tokens as plain text; the BPE model needs them byte-spelled
        return tok if set(tok) <= alphabet else "".join(table[b] for b in tok.encode("utf-8"))

    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        # A control token outside the byte alphabet (DeepSeek's '<｜User｜>') keeps its raw text
        # as vocab key: `tokenizers` binds an added token to the vocab id of its content.
        s = tok if types[i] == TOKEN_CONTROL else spelled(tok)
        if s in vocab:
            warn(f"token {i} {tok!r} duplicates token {vocab[s]}; the later id wins")
        vocab[s] = i

    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty == TOKEN_CONTROL:
            special = True  # matched as raw text, so non-byte-alphabet spellings are fine
        elif ty == TOKEN_USER_DEFINED:
            if tok not in vocab:
                warn(f"user-defined token {i} {tok!r} is not in the BPE vocab; not added")
                continue
            special = False  # matched whole, but kept in decoded text (like `<think>`)
        else:
            continue
        added.append(
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
        )

    pairs = []
    for k, mg in enumerate(merges):
        a, sep, b = mg.partition(" ")
        if not sep or not a or not b or " " in b:
            raise ExportError(f"{where}: tokenizer.ggml.merges[{k}] = {mg!r} is not 'A B'")
        pairs.append([a, b])

    prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    pre_tok: dict[str, Any]
    if pre in PRE_SPLITS:
        pre_tok = {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": PRE_SPLITS[pre]},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": prefix_space,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        }
    else:
        if pre not in PRE_GPT2:
            warn(f"tokenizer.ggml.pre {pre!r} unknown; using GPT-2's split")
        pre_tok = {
            "type": "ByteLevel",
            "add_prefix_space": prefix_space,
            "trim_offsets": True,
            "use_regex": True,
        }

    post: dict[str, Any] = {
        "type": "ByteLevel",
        "add_prefix_space": True,
        "trim_offsets": False,
        "use_regex": True,
    }
    template = bos_eos_template(meta, tokens, where)
    if template:
        post = {"type": "Sequence", "processors": [post, template]}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tok,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": pairs,
        },
    }


def _added_token(tid: int, content: str, special: bool) -> dict[str, Any]:
    return {
        "id": tid,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def gemma_merges(tokens: Sequence[str]) -> list[list[str]]:
    """BPE merges implied by a Gemma vocabulary that lists none.

    Every split of a token into two vocabulary pieces is a merge. Gemma's scores do not follow its
    merge order; the file order does: merges rank by the merged token's id (its last occurrence),
    and the splits of one token by longer left piece first.
    """
    last: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        last[tok] = i
    out: list[list[str]] = []
    for tok, _ in sorted(last.items(), key=lambda kv: kv[1]):
        for cut in range(len(tok) - 1, 0, -1):
            left, right = tok[:cut], tok[cut:]
            if left in last and right in last:
                out.append([left, right])
    return out


def build_gemma_tokenizer(meta: Mapping[str, Any], where: str, warn: Warn = _stderr_warn) -> dict[str, Any]:
    """Gemma's SentencePiece vocabulary (`tokenizer.ggml.model` "llama", Gemma architectures).

    The tokenizer is BPE over text whose spaces are spelled U+2581, with byte fallback (`<0xNN>`
    tokens) for anything the vocabulary cannot spell, and no prefix space. Control tokens are
    special added tokens; user-defined ones (newline runs, `[multimodal]`) are matched whole but
    decoded as text. Runs of spaces are stored as real spaces in GGUF files but are
    vocabulary entries spelled with U+2581, reached through merges.
    """
    raw: Sequence[str] = _need(meta, "tokenizer.ggml.tokens", where)
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(raw)
    if len(types) != len(raw):
        raise ExportError(f"{where}: tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
    # The rule transformers applies: a whitespace-only token holding a space is all U+2581.
    tokens = [SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in raw]

    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            warn(f"token {i} {tok!r} duplicates token {vocab[tok]}; the later id wins")
        vocab[tok] = i

    added = []
    for i, (tok, ty) in enumerate(zip(raw, types, strict=True)):
        if ty == TOKEN_CONTROL:
            added.append(_added_token(i, tok, True))
        elif ty == TOKEN_USER_DEFINED and tok in vocab:
            # an all-space token was respelled above; BPE reaches it through merges
            added.append(_added_token(i, tok, False))

    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = raw[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(raw) else "<unk>"

    # SentencePiece GGUFs that do not say otherwise get BOS (llama.cpp's and transformers' rule).
    ends = dict(meta)
    ends.setdefault("tokenizer.ggml.add_bos_token", True)
    template = bos_eos_template(ends, raw, where)

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE_SPACE},
        # Splits on " ", which the normalizer has already replaced: no pre-tokenization in effect.
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        },
        "post_processor": template,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPIECE_SPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": gemma_merges(tokens),
        },
    }


def bos_eos_template(meta: Mapping[str, Any], tokens: Sequence[str], where: str) -> dict[str, Any] | None:
    """TemplateProcessing adding BOS / EOS when the GGUF asks for them, else None."""
    ends: dict[str, tuple[str, int]] = {}
    for which in ("bos", "eos"):
        if meta.get(f"tokenizer.ggml.add_{which}_token", False):
            tid = meta.get(f"tokenizer.ggml.{which}_token_id")
            if tid is None:
                raise ExportError(
                    f"{where}: tokenizer.ggml.add_{which}_token is set but {which}_token_id is missing"
                )
            if not 0 <= int(tid) < len(tokens):
                raise ExportError(f"{where}: tokenizer.ggml.{which}_token_id {tid} is outside the vocabulary")
            ends[which] = (tokens[int(tid)], int(tid))
    if not ends:
        return None

    def seq(name: str, type_id: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if "bos" in ends:
            out.append({"SpecialToken": {"id": ends["bos"][0], "type_id": type_id}})
        out.append({"Sequence": {"id": name, "type_id": type_id}})
        if "eos" in ends:
            out.append({"SpecialToken": {"id": ends["eos"][0], "type_id": type_id}})
        return out

    return {
        "type": "TemplateProcessing",
        "single": seq("A", 0),
        "pair": seq("A", 0) + seq("B", 1),
        "special_tokens": {tok: {"id": tok, "ids": [tid], "tokens": [tok]} for tok, tid in ends.values()},
    }


def tokenizer_json_bytes(meta: Mapping[str, Any], where: str, warn: Warn = _stderr_warn) -> bytes:
    """The tokenizer.json file content, formatted as the bundles always were."""
    return json.dumps(build_tokenizer(meta, where, warn), ensure_ascii=False, indent=1).encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    """`python -m qhx_export.tokenizer GGUF OUT.json`: tokenizer.json from a GGUF's tokenizer
    metadata alone (a truncated or split GGUF will do), written whole or not at all."""
    import os
    import sys

    from qhx_export import ExportError
    from qhx_export.read.gguf_meta import MetaError, read_metadata

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m qhx_export.tokenizer GGUF OUT.json", file=sys.stderr)
        return 2
    src, out = args
    try:
        data = tokenizer_json_bytes(read_metadata(src), src)
        with open(out + ".tmp", "wb") as f:
            f.write(data)
        os.replace(out + ".tmp", out)
    except (MetaError, ExportError, OSError) as e:
        print(f"qhx_export.tokenizer: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
