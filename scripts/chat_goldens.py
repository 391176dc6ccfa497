"""Chat-template goldens: HF transformers `apply_chat_template(..., add_generation_prompt=True)`
ids for the DeepSeek-R1-Distill tokenizer with the chat template from its GGUF metadata.

Developer script (not run by CI); deterministic. Run with the reference venv:

    /root/.cache/qhx/venv-ref/bin/python scripts/chat_goldens.py \
        [--gguf ~/.cache/qhx/assets/dsr1/model_part_0000.gguf] \
        [--tokenizer target/bundles/parity/tok/deepseek-r1-distill.json]

writes tests/goldens/chat/deepseek-r1-distill.json: the template, bos/eos strings, and per
conversation the messages, the rendered text and the ids.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_meta import read_metadata  # noqa: E402

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Name a primary color."},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two, three."},
        {"role": "user", "content": "Now backwards."},
    ],
    "non_ascii": [
        {"role": "system", "content": "Réponds en français, s'il te plaît."},
        {"role": "user", "content": "東京はどこ? Ünïcödé ✓ emoji 🦀🚀 and Ελληνικά."},
    ],
    "assistant_think": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nThe user asks for 2+2. That is 4.\n</think>\n\n2+2 = 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/qhx/assets/dsr1/model_part_0000.gguf"))
    ap.add_argument("--tokenizer", default=os.path.join(root, "target/bundles/parity/tok/deepseek-r1-distill.json"))
    ap.add_argument("--out", default=os.path.join(root, "tests/goldens/chat/deepseek-r1-distill.json"))
    a = ap.parse_args()

    import transformers

    meta = read_metadata(a.gguf)
    template = meta["tokenizer.chat_template"]
    tokens = meta["tokenizer.ggml.tokens"]
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    eos = tokens[meta["tokenizer.ggml.eos_token_id"]]
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=a.tokenizer, bos_token=bos, eos_token=eos)
    tok.chat_template = template
    convs = []
    for name, msgs in CONVERSATIONS.items():
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        # HF tokenizes the rendered text without adding special tokens; check that here.
        assert ids == tok(text, add_special_tokens=False)["input_ids"], name
        convs.append({"name": name, "messages": msgs, "text": text, "ids": ids})
    doc = {
        "made_by": "scripts/chat_goldens.py: transformers %s PreTrainedTokenizerFast(tokenizer_file=<DeepSeek-R1-Distill "
        "tokenizer.json from GGUF metadata>, bos_token, eos_token), chat_template = GGUF tokenizer.chat_template, "
        "apply_chat_template(messages, add_generation_prompt=True)" % transformers.__version__,
        "gguf": os.path.basename(a.gguf),
        "template": template,
        "bos_token": bos,
        "eos_token": eos,
        "conversations": convs,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"chat_goldens: {len(convs)} conversations -> {a.out}")


if __name__ == "__main__":
    main()
