"""The 4-bit weight methods (quant/methods.py, gptq.py, hessian.py) and the rotation (rotate.py)
on a tiny model: each method must beat round-to-nearest, the rotation must leave the function."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from qhx_export import ExportError
from qhx_export.families import Config, registered
from qhx_export.quant import gptq, lpbq
from qhx_export.quant.hessian import hessians
from qhx_export.quant.methods import proxy, solve
from qhx_export.quant.rotate import hadamard, rotated, rotation
from qhx_export.read.base import Checkpoint
from tests.conftest import tiny_config, tiny_weights

DATA = Path(__file__).parent / "data"


class MemCheckpoint(Checkpoint):
    def __init__(self, c: Config, w: Mapping[str, np.ndarray]) -> None:
        self.path, self.config, self.family = "mem", c, registered()[c.family]
        self.w = dict(w)
        self.shapes = {n: list(a.shape) for n, a in w.items()}

    def float32(self, name: str) -> np.ndarray:
        return self.w[name]

    def bos_token_id(self) -> int | None:
        return None


def outlier_model(family: str = "llama", seed: int = 3) -> MemCheckpoint:
    """A tiny model whose weights have the heavy tails and hot input channels 4 bits struggle with."""
    c = tiny_config(family, hidden=64, ffn=128, n_layers=2, vocab=300)
    w = tiny_weights(c, seed)
    rng = np.random.default_rng(seed)
    for n, a in w.items():
        if n.startswith("blk.") and n.endswith(".weight") and a.ndim == 2:
            a *= np.exp(rng.standard_normal(a.shape[1]) * 0.3)[None, :].astype(np.float32)  # hot inputs
    return MemCheckpoint(c, w)


def seqs(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 300, length).tolist() for _ in range(n)]


def test_each_method_beats_round_to_nearest() -> None:
    ck = outlier_model()
    calib, held = seqs(32, 48, 1), seqs(6, 48, 2)
    cases = [(s, None, 0) for s in held]
    res = {}
    for m in ("rtn", "seqmse", "gptq"):
        sol = solve(ck, calib, m, log=lambda _: None)
        assert len(sol.triples) == 14  # 7 linear weights x 2 layers
        res[m] = proxy(ck, cases, sol.dequantized())
    # measured: rtn 0.188, seqmse 0.132, gptq 0.145 (mean KL divergence to the float forward)
    for m, bar in (("seqmse", 0.85), ("gptq", 0.9)):
        assert res[m].kld < bar * res["rtn"].kld, (m, res[m].kld, res["rtn"].kld)


def test_solutions_are_on_the_lpbq_grid() -> None:
    ck = outlier_model()
    sol = solve(ck, seqs(8, 32, 1), "gptq", log=lambda _: None)
    for n, (q, k, ch) in sol.triples.items():
        assert q.dtype == np.int8 and q.min() >= -8 and q.max() <= 7, n
        assert k.dtype == np.uint8 and k.min() >= 1 and k.max() <= 15, n
        assert q.shape == (ck.w[n].shape[1], ck.w[n].shape[0])
        assert k.shape == (q.shape[0] // lpbq.BLOCK, q.shape[1])
        # the per-channel scale is round-to-nearest's, so a graph weight that is a multiple of
        # the tensor (the q projection's folded score scale) takes the solution
        np.testing.assert_allclose(ch, lpbq.block_int4(ck.w[n].T)[2], rtol=1e-6)
        _, _, ch2 = lpbq.from_solution(0.125 * ck.w[n].T, (q, k, ch), n)
        np.testing.assert_allclose(ch2, 0.125 * ch, rtol=1e-5)
    with pytest.raises(ExportError, match="not a multiple"):
        n = "blk.0.attn_q.weight"
        other = ck.w["blk.0.attn_output.weight"].T  # same shape, another tensor
        lpbq.from_solution(other, sol.triples[n], n)


def test_gptq_lowers_the_calibration_output_error() -> None:
    rng = np.random.default_rng(0)
    # correlated inputs (what a layer sees), some channels hotter than others
    x = rng.standard_normal((400, 24)) @ rng.standard_normal((24, 64)) + 0.3 * rng.standard_normal((400, 64))
    x *= np.exp(0.5 * rng.standard_normal(64))[None, :]
    h = x.T @ x
    w = rng.standard_normal((64, 48)).astype(np.float32)
    rtn = gptq.dequant(*lpbq.block_int4(w))
    for f in (gptq.gptq, gptq.seqmse):
        got = gptq.dequant(*f(w, h))
        assert gptq.output_error(w, got, h) < 0.7 * gptq.output_error(w, rtn, h), f.__name__
    with pytest.raises(ExportError, match="Hessian"):
        gptq.gptq(w, h[:32, :32])


def test_hessians_record_each_linear_input() -> None:
    ck = outlier_model()
    hs, tokens = hessians(ck, seqs(2, 10, 5), {0})
    assert tokens == 20
    assert sorted(hs) == sorted(
        f"blk.0.{k}.weight"
        for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    )
    assert hs["blk.0.attn_q.weight"].shape == (64, 64) and hs["blk.0.ffn_down.weight"].shape == (128, 128)
    # q, k and v read the same normed input
    np.testing.assert_array_equal(hs["blk.0.attn_q.weight"], hs["blk.0.attn_v.weight"])


@pytest.mark.parametrize("n", [64, 576, 640, 1536, 2048, 2304])
def test_hadamard_matrices(n: int) -> None:
    h = hadamard(n)
    assert h is not None
    assert set(np.unique(h)) == {-1, 1}
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n, dtype=np.int64))


def test_rotation_fallback_is_orthogonal() -> None:
    assert hadamard(896) is None
    q, how = rotation(896)
    assert "random orthogonal" in how
    np.testing.assert_allclose(q @ q.T, np.eye(896), atol=1e-10)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_rotation_keeps_the_function(family: str) -> None:
    ck = outlier_model(family)
    r = rotated(ck, "hadamard")
    assert not r.config.tied and "output.weight" in r.shapes
    ids = seqs(1, 12, 9)[0]
    a = ck.family.forward(ck.config, ck.weights(), ids)
    b = r.family.forward(r.config, r.weights(), ids)
    np.testing.assert_allclose(a, b, atol=2e-4 * np.abs(a).max())
    assert np.abs(r.float32("blk.0.attn_norm.weight") - 1).max() == 0


def test_rotation_refuses_post_norm_families() -> None:
    from qhx_export.read import open_checkpoint

    ck = open_checkpoint(str(DATA / "gemma3"))  # a tiny Gemma 3 directory (norms after sublayers)
    with pytest.raises(ExportError, match="--rotate hadamard: gemma3"):
        rotated(ck, "hadamard")


def test_method_tokens_keeps_the_first_n_calibration_tokens(
    tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--method-tokens N: the 4-bit methods calibrate on the first N tokens of their sequences,
    in order (the last one cut), and the option is checked like the other w4a16 options."""
    from qhx_export.cli import main
    from qhx_export.read import open_checkpoint
    from qhx_export.write.calibrate import method_seqs
    from qhx_export.write.options import HtpOptions

    path = tiny_gguf("llama", name="tiny.gguf")
    ck = open_checkpoint(str(path))
    every = method_seqs(ck, HtpOptions(name="t", arches=["v79"]))
    total = sum(map(len, every))
    n = len(every[0]) + len(every[1]) // 2
    cut = method_seqs(ck, HtpOptions(name="t", arches=["v79"], method_tokens=n))
    assert sum(map(len, cut)) == n < total
    assert cut == [every[0], every[1][: len(every[1]) // 2]]
    assert method_seqs(ck, HtpOptions(name="t", arches=["v79"], method_tokens=10 * total)) == every
    for extra, needle in (
        (["--precision", "w8a16", "--method-tokens", "64"], "--method-tokens is for --precision w4a16"),
        (["--precision", "w4a16", "--method-tokens", "0"], "--method-tokens 0: must be positive"),
    ):
        rc = main([str(path), "-o", str(path.parent / "never"), "--arch", "v79", *extra])
        err = capsys.readouterr().err
        assert rc != 0 and f"error: {needle}" in err, (extra, err)
        assert not (path.parent / "never").exists()
