"""The f16 tie rule, shared by `--verify` (qhx_export.verify.run) and the parity scripts
(scripts/parity.py): a pick that differs from the reference's top-1 agrees when it is the
reference's runner-up and the reference's top-2 logits differ by less than one step of the
logits' dtype at the top logit (logits of that dtype cannot order the two). Standard library
only: scripts/parity.py runs under a bare python3."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
