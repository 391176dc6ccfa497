"""The built-in calibration corpus: short original texts covering what a chat model meets: prose,
code, chat-formatted turns and several languages. `--calib FILE` replaces it (one sequence per
paragraph, paragraphs separated by blank lines).

Chat turns are rendered in the checkpoint's own turn markers when its chat template uses ChatML
(`<|im_start|>`) or Llama 3 headers (`<|start_header_id|>`), else as plain "User:/Assistant:".
"""

from __future__ import annotations

from qhx_export import ExportError

PROSE = [
    "The river had been rising for three days, and by the time the baker opened her shop the water "
    "was lapping at the second step. She set out the bread anyway, because people still had to eat.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Most of it happens in "
    "the leaves, inside chloroplasts, where chlorophyll absorbs red and blue light and reflects green.",
    "In 1869 the first transcontinental railroad in the United States was completed, cutting the trip "
    "from New York to San Francisco from months to about a week.",
    "To make a simple tomato sauce, warm olive oil with sliced garlic, add crushed tomatoes and a pinch "
    "of salt, and let it simmer for twenty minutes, stirring now and then.",
    "The committee reviewed the proposal on Tuesday. Its members agreed that the budget was reasonable "
    "but asked for a clearer timeline and a plan for measuring results after the first year.",
    "A prime number has exactly two divisors: one and itself. There are infinitely many of them, as "
    "Euclid showed by multiplying a finite list of primes together and adding one.",
    "Dear Mr. Patel, thank you for your letter of 12 March. We have checked your account and the "
    "duplicate charge of $48.20 will be refunded within five business days. Kind regards, Support",
    "The old lighthouse keeper counted the ships every night: three fishing boats, a ferry, and once, "
    "years ago, a tall sailing ship that never appeared on any register.",
    "Q: What is the capital of Australia? A: Canberra. Q: How many legs does a spider have? A: Eight. "
    "Q: Which planet is closest to the sun? A: Mercury.",
    "Battery life depends on temperature: lithium-ion cells lose capacity quickly in the cold and age "
    "faster when they are kept fully charged in a hot car.",
]
CODE = [
    "def fibonacci(n: int) -> list[int]:\n    seq = [0, 1]\n    while len(seq) < n:\n"
    "        seq.append(seq[-1] + seq[-2])\n    return seq[:n]\n\nprint(fibonacci(10))\n",
    'fn main() {\n    let words = vec!["apple", "banana", "cherry"];\n    for (i, w) in '
    'words.iter().enumerate() {\n        println!("{}: {}", i, w.to_uppercase());\n    }\n}\n',
    "#include <stdio.h>\n\nint main(void) {\n    int sum = 0;\n    for (int i = 1; i <= 100; i++) {\n"
    '        sum += i;\n    }\n    printf("%d\\n", sum);\n    return 0;\n}\n',
    "const fetchUser = async (id) => {\n  const res = await fetch(`/api/users/${id}`);\n  if (!res.ok) "
    "throw new Error(`HTTP ${res.status}`);\n  return res.json();\n};\n",
    "SELECT c.name, COUNT(o.id) AS orders\nFROM customers c\nLEFT JOIN orders o ON o.customer_id = c.id\n"
    "WHERE o.created_at >= '2024-01-01'\nGROUP BY c.name\nORDER BY orders DESC\nLIMIT 10;\n",
    '{\n  "name": "weather-app",\n  "version": "1.4.2",\n  "dependencies": {\n    "axios": '
    '"^1.6.0",\n    "react": "^18.2.0"\n  },\n  "scripts": {"start": "vite"}\n}\n',
    '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.log; do\n  gzip -9 "$f"\n  echo "compressed $f"\n'
    "done\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n",
]
CHATS = [
    (
        "You are a helpful assistant.",
        "How do I boil an egg?",
        "Place the egg in boiling water for 7 minutes for a jammy yolk, or 10 for hard-boiled, then cool it "
        "in cold water.",
    ),
    (None, "Translate 'good morning' into Spanish and French.", "Spanish: buenos días. French: bonjour."),
    (
        None,
        "Write a haiku about the sea.",
        "Grey waves fold and break\nsalt wind carries gull voices\nthe tide keeps its time",
    ),
    ("You are a concise assistant.", "What is 17 times 23?", "17 × 23 = 391."),
    (
        None,
        "Can you explain what a linked list is?",
        "A linked list is a chain of nodes where each node stores a value and a pointer to the next node, "
        "so inserting in the middle is cheap but finding the n-th item takes n steps.",
    ),
    (
        None,
        "Give me three tips for better sleep.",
        "1. Keep a regular schedule. 2. Avoid screens an hour before bed. 3. Keep the room cool and dark.",
    ),
    (None, "Fix this Python: print('hello'", "You are missing the closing parenthesis: print('hello')"),
    (
        None,
        "¿Cuál es la montaña más alta del mundo?",
        "El monte Everest, con 8.849 metros sobre el nivel del mar.",
    ),
]
LANGUAGES = [
    "Le soleil se couchait derrière les collines et les enfants rentraient lentement à la maison, "
    "fatigués mais heureux après une longue journée au bord du lac.",
    "Die Stadtbibliothek bleibt wegen Renovierungsarbeiten bis Ende Mai geschlossen. Ausgeliehene "
    "Bücher können im Rathaus zurückgegeben werden.",
    "El tren salió con veinte minutos de retraso, pero llegamos a Sevilla a tiempo para la cena.",
    "Москва — столица России и крупнейший город страны. Летом в парках много людей.",
    "東京は日本の首都で、世界で最も人口の多い都市の一つです。春には桜が咲きます。",
    "今天天气很好，我们去公园散步吧。下午还可以去图书馆看书。",
    "Il gatto dorme sul divano mentre fuori piove. La casa è silenziosa e calda.",
    "Bu akşam arkadaşlarımla yemeğe çıkacağım; sonra belki sinemaya gideriz.",
    "서울은 한국의 수도이며 많은 사람들이 지하철을 이용합니다.",
    "A biblioteca abre às nove horas e fecha às seis da tarde, de segunda a sexta.",
]


def _chat(system: str | None, user: str, reply: str, template: str | None) -> str:
    t = template or ""
    if "<|im_start|>" in t:
        s = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        return f"{s}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{reply}<|im_end|>\n"
    if "<|start_header_id|>" in t:
        s = f"<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>" if system else ""
        return (
            f"{s}<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
            f"<|start_header_id|>assistant<|end_header_id|>\n\n{reply}<|eot_id|>"
        )
    s = f"System: {system}\n" if system else ""
    return f"{s}User: {user}\nAssistant: {reply}\n"


def builtin(template: str | None = None) -> list[str]:
    """The built-in sequences (36), chat turns in the model's own markers."""
    return PROSE + CODE + [_chat(*c, template) for c in CHATS] + LANGUAGES


def from_file(path: str) -> list[str]:
    """--calib FILE: UTF-8 text, sequences separated by blank lines."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"--calib {path}: cannot read ({e})") from e
    seqs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    if not seqs:
        raise ExportError(f"--calib {path}: no text in it")
    return seqs


def data_text(name: str) -> str:
    """A text shipped with the package (qhx_export/data/, public domain; see its README.md)."""
    from importlib import resources

    return resources.files("qhx_export").joinpath("data", name).read_text(encoding="utf-8")


HELDOUT = "heldout-coriolanus.txt"  # perplexity / KL divergence: never calibrated on
CALIB_LONG = "calib-henry6.txt"  # long-text calibration windows for the 4-bit methods


def windows(
    text: str, tokenizer_json: bytes, bos: int | None, length: int, count: int | None = None
) -> list[list[int]]:
    """`text` tokenized whole and cut into windows of `length` tokens (BOS first when the model
    uses one), at most `count` of them."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    ids = tok.encode(text, add_special_tokens=False).ids
    step = length - (bos is not None)
    out = [
        ([bos] if bos is not None else []) + ids[i : i + step] for i in range(0, len(ids) - step + 1, step)
    ]
    return out[:count] if count is not None else out


def tokenize(texts: list[str], tokenizer_json: bytes, bos: int | None, max_len: int) -> list[list[int]]:
    """Token ids of each text (BOS prepended when the model uses one), cut to `max_len`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    out = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        ids = ([bos] if bos is not None else []) + ids
        if len(ids) >= 2:
            out.append(ids[:max_len])
    return out
