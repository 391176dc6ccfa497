"""`--verify`: the written bundle run by qhx_generate on the HTP simulator against the package's
own float reference (the family's numpy forward over the same weights).

Per prompt: the float reference's greedy continuation is the gold; qhx_generate runs teacher-forced
on it (`--teacher-force`, prompt ids through `--tokens-in`) and the agreement is the share of steps
whose top-1 equals the gold token, or is a tie: the reference's runner-up where the reference's top-2
logits differ by less than one f16 step at their magnitude (tests/harness/parity.py's rule; the HTP's
logits cannot order them). Ties are reported apart. The same teacher-forced run through ORT's QNN
EP over the same binaries (qhx_export.verify.loop) must give identical ids: a difference is a host
bug on one side.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qhx_export import ExportError
from qhx_export.read.base import Checkpoint
from qhx_export.verify.ties import Top2, agreement

THRESHOLDS = {"fp16": 0.98, "w8a16": 0.95, "w4a16": 0.85}
PROMPTS = [  # short prompts: the simulator runs ~135M MAC/token at well under 1 GMAC/s
    "The capital of France is",
    "def add(a, b):\n    return",
    "Once upon a time, a small robot",
    "Water boils at",
]


def find_qhx_generate() -> str:
    """QHX_GENERATE, then PATH, then target/release of this checkout."""
    env = os.environ.get("QHX_GENERATE")
    if env:
        if not os.access(env, os.X_OK):
            raise ExportError(f"QHX_GENERATE={env} is not an executable")
        return env
    on_path = shutil.which("qhx_generate")
    if on_path:
        return on_path
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (os.path.join(here, "..", "..", ".."), os.getcwd()):
        cand = os.path.normpath(os.path.join(up, "target", "release", "qhx_generate"))
        if os.access(cand, os.X_OK):
            return cand
    raise ExportError(
        "--verify: qhx_generate not found (set QHX_GENERATE, put it on PATH, or cargo build --release)"
    )


def qnn_libdir() -> str:
    import onnxruntime_qnn

    return os.path.dirname(onnxruntime_qnn.__file__)


def float_greedy(
    ck: Checkpoint, ids: Sequence[int], n: int, logits_out: list[np.ndarray] | None = None
) -> tuple[list[int], list[Top2]]:
    """The float reference's greedy continuation (n tokens) and each step's top-2 (id, logit);
    `logits_out` receives every step's logits."""
    w = ck.weights()
    seq, out, top2 = list(ids), [], []
    for _ in range(n):
        logits = np.asarray(ck.family.forward(ck.config, w, seq)[-1], dtype=np.float64)
        if logits_out is not None:
            logits_out.append(logits)
        i, j = (int(k) for k in np.argsort(-logits, kind="stable")[:2])
        top2.append(((i, float(logits[i])), (j, float(logits[j]))))
        out.append(i)
        seq.append(i)
    return out, top2


def heldout_ppl(ck: Checkpoint, loop: Any, n_tokens: int) -> dict[str, Any]:
    """Perplexity of the bundle (the ORT loop over its binaries) and of the float reference over
    the first `n_tokens` of the shipped held-out text (qhx_export/data), teacher-forced from its
    first token, and the mean KL divergence between them over those positions."""
    from qhx_export.quant import corpus
    from qhx_export.quant.methods import kl, log_softmax

    (ids,) = corpus.windows(
        corpus.data_text(corpus.HELDOUT), ck.tokenizer_json(), ck.bos_token_id(), n_tokens + 1, 1
    )
    first = 1 if ck.bos_token_id() is not None else 0  # BOS, then the text's first token
    prompt, rest = ids[: first + 1], ids[first + 1 :]
    got: list[np.ndarray] = []
    loop.generate(prompt, len(rest), rest, logits_out=got)
    ref = np.asarray(ck.family.forward(ck.config, ck.weights(), ids), np.float64)[first : first + len(rest)]
    q = np.stack(got[: len(rest)])
    tgt = np.asarray(rest)
    nll_q = -log_softmax(q)[np.arange(len(tgt)), tgt]
    nll_f = -log_softmax(ref)[np.arange(len(tgt)), tgt]
    return {
        "text": corpus.HELDOUT,
        "tokens": len(tgt),
        "ppl": round(float(np.exp(nll_q.mean())), 3),
        "float_ppl": round(float(np.exp(nll_f.mean())), 3),
        "kld": round(float(kl(ref, q).mean()), 5),
    }


def run_qhx(
    binary: str, manifest: str, ids: Sequence[int], n: int, teacher: Sequence[int] | None
) -> list[int]:
    """qhx_generate --json on prompt ids; returns output_ids. Raises ExportError on failure."""
    lib = qnn_libdir()
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write(",".join(map(str, ids)))
    try:
        cmd = [
            binary,
            manifest,
            os.path.join(lib, "libQnnHtp.so"),
            os.path.join(lib, "libQnnSystem.so"),
            os.path.dirname(os.path.abspath(manifest)),
            str(n),
            "--tokens-in",
            f.name,
            "--ignore-eos",
            "--json",
            "-q",
        ]
        if teacher is not None:
            cmd += ["--teacher-force", ",".join(map(str, teacher))]
        env = dict(os.environ, LD_LIBRARY_PATH=lib)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise ExportError(f"--verify: qhx_generate exit {r.returncode}: {last}")
    try:
        doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    except ValueError as e:
        raise ExportError(f"--verify: qhx_generate printed no JSON document: {r.stdout[-120:]!r}") from e
    return [int(t) for t in doc["output_ids"]]


@dataclass
class Row:
    prompt: str
    n: int
    agree: int  # top-1 equal to the gold, ties included
    qhx_ids: list[int]
    ort_ids: list[int] | None
    gold: list[int]
    ties: list[int]  # steps counted in `agree` as ties

    @property
    def rate(self) -> float:
        return self.agree / self.n if self.n else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "steps": self.n,
            "agree": self.agree,
            "ties": len(self.ties),
            "tie_steps": self.ties,
            "rate": round(self.rate, 4),
            "ort_equal": None if self.ort_ids is None else self.ort_ids == self.qhx_ids,
            "gold": self.gold,
            "qhx": self.qhx_ids,
        }


def row(prompt: str, got: list[int], gold: list[int], top2: Sequence[Top2], ort: list[int] | None) -> Row:
    """One prompt's agreement: equal steps plus ties."""
    a = agreement(got, gold, top2)
    return Row(prompt, len(gold), a.agree, got, ort, gold, a.ties)


def verify(
    ck: Checkpoint,
    manifest: str,
    precision: str,
    n_tokens: int = 16,
    prompts: Sequence[str] = PROMPTS[:2],
    with_ort: bool = True,
    real: dict[str, Any] | None = None,
    ppl_tokens: int = 0,
) -> dict[str, Any]:
    """Teacher-forced agreement table of one written bundle. with_ort: also the ORT QNN loop
    (`real`: the manifest's source.real when it has none, as the LFM2 runner's form), whose
    logits give the mean KL divergence to the float reference over the steps, and with
    `ppl_tokens` the perplexity over the held-out text."""
    from qhx_export.quant.corpus import tokenize
    from qhx_export.quant.methods import kl

    binary = find_qhx_generate()
    with open(manifest, encoding="utf-8") as f:
        desc = json.load(f)
    genie = "dialog" in desc  # a genie_config.json: qhx_generate runs it; the ORT loop does not
    ctx = int(desc["dialog"]["context"]["size"] if genie else desc["params"]["max_ctx"])
    tok = ck.tokenizer_json()
    rows = []
    klds: list[np.ndarray] = []
    loop = None
    if with_ort and not genie:
        from qhx_export.verify.loop import load_bundle

        loop = load_bundle(manifest, real=real)
    for p in prompts:
        (ids,) = tokenize([p], tok, ck.bos_token_id(), 10_000)
        n = min(n_tokens, ctx - len(ids))  # the last step's logits come from slot C - 1
        if n < 1:
            raise ExportError(f"--verify: prompt {p!r} ({len(ids)} tokens) does not fit --ctx {ctx}")
        ref: list[np.ndarray] = []
        gold, top2 = float_greedy(ck, ids, n, ref)
        got = run_qhx(binary, manifest, ids, n, gold)
        lg: list[np.ndarray] = []
        ort = loop.generate(ids, n, gold, logits_out=lg) if loop is not None else None
        rows.append(row(p, got, gold, top2, ort))
        if lg:
            klds.append(kl(np.stack(ref), np.stack(lg)))
    mean = sum(r.rate for r in rows) / len(rows)
    extra: dict[str, Any] = {}
    if klds:
        extra["kld"] = round(float(np.concatenate(klds).mean()), 5)
    if loop is not None and ppl_tokens > 0:
        extra["heldout"] = heldout_ppl(ck, loop, min(ppl_tokens, ctx - 2))
    return {
        **extra,
        "precision": precision,
        "threshold": THRESHOLDS[precision],
        "tokens": n_tokens,
        "mean": round(mean, 4),
        "ties": sum(len(r.ties) for r in rows),
        "pass": mean >= THRESHOLDS[precision]
        and all(r.ort_ids is None or r.ort_ids == r.qhx_ids for r in rows),
        "rows": [r.as_dict() for r in rows],
        "qhx_generate": binary,
    }


def table(res: dict[str, Any]) -> str:
    lines = [f"{'prompt':36} {'steps':>5} {'agree':>6} {'ties':>5} {'rate':>7}  ORT loop"]
    for r in res["rows"]:
        eq = "-" if r["ort_equal"] is None else ("equal" if r["ort_equal"] else "DIFFERS")
        ties = r.get("ties", 0)
        lines.append(
            f"{json.dumps(r['prompt'])[:36]:36} {r['steps']:5} {r['agree']:6} {ties:5} {r['rate']:7.1%}  {eq}"
            + (f"  (ties at steps {', '.join(map(str, r['tie_steps']))})" if ties else "")
        )
    n_ties = res.get("ties", 0)
    if "kld" in res:
        lines.append(
            f"mean KL divergence to the float reference over these steps (ORT loop): {res['kld']:.4f}"
        )
    if "heldout" in res:
        h = res["heldout"]
        lines.append(
            f"held-out text ({h['text']}, {h['tokens']} tokens): perplexity {h['ppl']:.2f} "
            f"(float reference {h['float_ppl']:.2f}), mean KL divergence {h['kld']:.4f}"
        )
    lines.append(
        f"mean {res['mean']:.1%}{f' with {n_ties} f16 ties' if n_ties else ''} "
        f"(threshold {res['threshold']:.0%}, {res['precision']}): "
        f"{'pass' if res['pass'] else 'FAIL'}"
    )
    return "\n".join(lines)
