"""--verify's tie rule: a miss is excused when the pick is the reference's runner-up and the
reference's top-2 logits differ by less than one f16 step at their magnitude."""

from __future__ import annotations

from qhx_export.verify.run import row, table
from qhx_export.verify.ties import agreement, ulp


def test_ulp() -> None:
    assert ulp(12.9) == 2.0**-7  # [8, 16): 8 * 2**-10
    assert ulp(-1.0) == 2.0**-10
    assert ulp(0.0) == 2.0**-24  # subnormal spacing
    assert ulp(12.9, "f32") == 2.0**-20
    assert ulp(0.0, "f32") == 2.0**-149


def test_ties_are_excused_and_reported_apart() -> None:
    gold = [5, 6, 7, 8]
    top2 = [
        ((5, 12.9), (9, 12.8946)),  # gap 0.0054 < 0.0078 at 12.9 (gemma3w-more1's step)
        ((6, 12.9), (9, 12.88)),  # gap 0.02: a real miss
        ((7, 3.0), (9, 2.9999)),  # tie, but the pick below is a third token
        ((8, 1.0), (9, 0.5)),
    ]
    r = row("p", [9, 9, 4, 8], gold, top2, None)
    assert r.ties == [0] and r.agree == 2 and r.rate == 0.5
    d = r.as_dict()
    assert d["ties"] == 1 and d["tie_steps"] == [0] and d["agree"] == 2
    res = {
        "precision": "fp16",
        "threshold": 0.98,
        "mean": r.rate,
        "ties": 1,
        "pass": False,
        "rows": [d],
    }
    text = table(res)
    assert "ties at steps 0" in text and "with 1 f16 ties" in text and "FAIL" in text


def test_no_tie_without_a_miss() -> None:
    top2 = [((1, 12.9), (2, 12.8946))]
    r = row("p", [1], [1], top2, [1])
    assert r.ties == [] and r.agree == 1 and r.rate == 1.0


def test_agreement_counts_ties_and_the_first_divergence() -> None:
    """The one count --verify and tests/harness/parity.py share: a miss past the recorded top-2 steps
    is never a tie, and the first divergence is the first miss, tie or not."""
    top2 = [((5, 12.9), (9, 12.8946)), ((6, 4.0), (9, 3.0))]  # step 0 a tie, step 1 a real miss
    a = agreement([9, 9, 7, 1], [5, 6, 7, 8], top2)
    assert (a.same, a.ties, a.n, a.first, a.agree) == (1, [0], 4, 0, 2) and a.rate == 0.5
    b = agreement([5, 6, 7], [5, 6, 7], [])
    assert (b.same, b.ties, b.first, b.rate) == (3, [], None, 1.0)
    assert agreement([], [], []).rate == 0.0
