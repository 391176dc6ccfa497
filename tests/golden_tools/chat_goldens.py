"""Chat-template goldens: HF transformers `apply_chat_template(..., add_generation_prompt=True)`
ids for the DeepSeek-R1-Distill tokenizer with the chat template from its GGUF metadata.

Developer script (not run by CI); deterministic. Runs with the reference venv:

    scripts/goldens.sh chat \
        [--gguf ~/.cache/qhx/assets/dsr1/model_part_0000.gguf] \
        [--tokenizer target/bundles/parity/tok/deepseek-r1-distill.json]

writes tests/goldens/chat/deepseek-r1-distill.json: the template, bos/eos strings, and per
conversation the messages, the rendered text and the ids; the same for SmolLM2 (template from
the parity bundle's manifest) in smollm2.json; and features.json: a template that uses the
Jinja / Python features HF templates rely on (loop controls, namespace, string methods,
tojson, raise_exception), rendered by HF for each conversation (text only).
"""
import argparse
import json
import os

from qhx_export.read.gguf_meta import read_metadata

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


# Exercises what HF chat templates use beyond plain Jinja: loop controls, namespace(),
# Python str methods, tojson, raise_exception, trim_blocks / lstrip_blocks whitespace.
FEATURES_TEMPLATE = """{%- set ns = namespace(sys='', n=0) -%}
{%- if messages[0]['role'] == 'system' -%}
    {%- set ns.sys = messages[0]['content'].strip() -%}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{{ bos_token }}[sys={{ ns.sys | tojson }}]
{% for m in messages %}
    {% if m['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('unknown role ' + m['role']) }}
    {% endif %}
    {% if m['content'].startswith('skip') %}{% continue %}{% endif %}
    {% if m['content'].endswith('STOP') %}{% break %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    {% set words = m['content'].split(' ') %}
    <{{ m['role'] | upper }} #{{ loop.index }} words={{ words | length }} first={{ words[0] | lower }} last={{ words[-1] }}>
    {{ m['content'].replace('a', 'A').lstrip() }}{{ eos_token if m['role'] == 'assistant' }}
{% endfor %}
n={{ ns.n }}{% if add_generation_prompt %}<ASSISTANT>{% endif %}"""

FEATURE_CONVERSATIONS = {
    "plain": [{"role": "user", "content": "hello there"}],
    "system_and_history": [
        {"role": "system", "content": "  Be nice. \n"},
        {"role": "user", "content": "a b c"},
        {"role": "assistant", "content": "  banana split"},
        {"role": "user", "content": "skip me please"},
        {"role": "user", "content": "quote \" and ünïcode"},
    ],
    "break": [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "now STOP"},
        {"role": "user", "content": "never shown"},
    ],
}


def hf_convs(tok, convs, with_ids=True):
    out = []
    for name, msgs in convs.items():
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        c = {"name": name, "messages": msgs, "text": text}
        if with_ids:
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = [int(i) for i in ids]
            # HF tokenizes the rendered text without adding special tokens; check that here.
            assert ids == tok(text, add_special_tokens=False)["input_ids"], name
            c["ids"] = ids
        out.append(c)
    return out


def write(path, doc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"chat_goldens: {len(doc['conversations'])} conversations -> {path}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/qhx/assets/dsr1/model_part_0000.gguf"))
    ap.add_argument("--tokenizer", default=os.path.join(root, "target/bundles/parity/tok/deepseek-r1-distill.json"))
    ap.add_argument("--smollm2", default=os.path.join(root, "target/bundles/parity/smollm2-f32"))
    ap.add_argument("--out-dir", default=os.path.join(root, "tests/goldens/chat"))
    a = ap.parse_args()

    import transformers

    meta = read_metadata(a.gguf)
    template = meta["tokenizer.chat_template"]
    tokens = meta["tokenizer.ggml.tokens"]
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    eos = tokens[meta["tokenizer.ggml.eos_token_id"]]
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=a.tokenizer, bos_token=bos, eos_token=eos)
    tok.chat_template = template
    made = ("tests/golden_tools/chat_goldens.py: transformers %s PreTrainedTokenizerFast(tokenizer_file, bos_token, eos_token), "
            "tokenizer.chat_template = %s, apply_chat_template(messages, add_generation_prompt=True)")
    write(os.path.join(a.out_dir, "deepseek-r1-distill.json"), {
        "made_by": made % (transformers.__version__, "the GGUF's tokenizer.chat_template"),
        "tokenizer": "DeepSeek-R1-Distill tokenizer.json built from %s metadata (python -m qhx_export.tokenizer)" % os.path.basename(a.gguf),
        "template": template, "bos_token": bos, "eos_token": eos,
        "conversations": hf_convs(tok, CONVERSATIONS),
    })

    man = json.load(open(os.path.join(a.smollm2, "smollm2.json")))
    stok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.smollm2, "tokenizer.json"),
                                                eos_token="<|im_end|>")
    stok.chat_template = man["chat"]["template"]
    write(os.path.join(a.out_dir, "smollm2.json"), {
        "made_by": made % (transformers.__version__, "the SmolLM2 parity bundle manifest's chat.template"),
        "template": man["chat"]["template"], "bos_token": "", "eos_token": "<|im_end|>",
        "conversations": hf_convs(stok, CONVERSATIONS),
    })

    tok.chat_template = FEATURES_TEMPLATE
    feats = hf_convs(tok, FEATURE_CONVERSATIONS, with_ids=False)
    try:
        tok.apply_chat_template([{"role": "tool", "content": "x"}], add_generation_prompt=True, tokenize=False)
        raise SystemExit("raise_exception did not raise")
    except Exception as e:  # jinja2 TemplateError
        err = str(e)
    write(os.path.join(a.out_dir, "features.json"), {
        "made_by": made % (transformers.__version__, "FEATURES_TEMPLATE in tests/golden_tools/chat_goldens.py") + " (text only)",
        "template": FEATURES_TEMPLATE, "bos_token": bos, "eos_token": eos,
        "conversations": feats,
        "error_case": {"messages": [{"role": "tool", "content": "x"}], "hf_error": err},
    })


if __name__ == "__main__":
    main()
