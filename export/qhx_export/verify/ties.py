"""The f16 tie rule, shared by `--verify` (qhx_export.verify.run) and the parity scripts
(tests/harness/parity.py), and the one agreement count over it. A pick that differs from the
reference's top-1 agrees when it is the reference's runner-up and the reference's top-2 logits
differ by less than one step of the logits' dtype at the top logit (logits of that dtype cannot
order the two). Standard library only: tests/harness/parity.py runs under a bare python3."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# (id, logit) of the reference's top-1 and runner-up; lists from JSON goldens work too
Top2 = Sequence[Sequence[float]]


def ulp(x: float, dtype: str = "f16") -> float:
    """Spacing of `dtype` values (f16 or f32) around |x|, subnormal spacing near 0."""
    if x == 0:  # frexp(0) has exponent 0, which would give the spacing at 0.5
        return 2.0**-24 if dtype == "f16" else 2.0**-149
    e = math.frexp(abs(x))[1] - 1
    return 2.0 ** (max(e, -14) - 10) if dtype == "f16" else 2.0 ** (max(e, -126) - 23)


def is_tie(top2: Top2, picked: int, dtype: str = "f16") -> bool:
    """`picked` is the runner-up of `top2` and the two logits are within one `dtype` step."""
    (_, a), (j, b) = top2[0], top2[1]
    return picked == int(j) and abs(a - b) < ulp(a, dtype)


@dataclass
class Agreement:
    """Teacher-forced top-1 agreement of picks with gold ids, ties excused."""

    same: int  # steps whose pick is the gold id
    ties: list[int]  # steps whose pick misses the gold by a tie (counted as agreeing)
    n: int  # gold steps
    first: int | None  # the first step whose pick differs (tie or not)

    @property
    def agree(self) -> int:
        return self.same + len(self.ties)

    @property
    def rate(self) -> float:
        return self.agree / self.n if self.n else 0.0


def agreement(got: Sequence[int], gold: Sequence[int], top2: Sequence[Top2], dtype: str = "f16") -> Agreement:
    """The one agreement count: `top2[s]` is the reference's top-2 at step s (steps past its
    end have none, so a miss there is never a tie)."""
    same, ties, first = 0, [], None
    for s, (a, b) in enumerate(zip(got, gold, strict=False)):
        if a == b:
            same += 1
            continue
        if first is None:
            first = s
        if s < len(top2) and is_tie(top2[s], a, dtype):
            ties.append(s)
    return Agreement(same, ties, len(gold), first)
