"""Check functions for the exercises of chapter 2 (ALiBi <-> RetNet).

Each ``check_*`` takes the student's answer, prints a one-line verdict with a
hint and returns a :class:`pathedu.exercises.Verdict` (truthy when right).  A
wrong answer, or one that raises, never raises here.  ``hint(n, level=1)`` prints a hint for
exercise ``n``: level 1 a nudge, 2 the structure, 3 the recipe.
"""
from __future__ import annotations

import math
import numbers

import torch

from .. import alibi
from ._grader import (Exercises, Verdict, call_student as _call, check_function, fallback_hint, not_attempted,
                      student_failed, verdict)

__all__ = ["check_alibi_slopes", "check_alibi_bias", "check_retnet_recurrent", "check_half_life_gamma", "hint"]

EXERCISES = Exercises("ch02", {
    1: ("Start with a number of heads that is a power of two: there the slopes form a geometric sequence. Then "
        "ask how ALiBi fills in the heads when n is not a power of two (it borrows slopes from a finer sequence).",
        "For n a power of two, slope h (h = 1..n) is a power of 2 whose exponent is proportional to h/n. "
        "Otherwise: p = the largest power of two below n gives p slopes, and the other n - p come from the "
        "sequence for 2p heads. Return n numbers, head 0 first.",
        "For n a power of two: 2^(-8h/n), h = 1..n. Otherwise take the slopes of the largest power of two p < n, "
        "then every other slope of 2p heads (the 1st, 3rd, ...) until you have n."),
    2: ("Entry (i, j) must penalise how far key j lies behind query i, and a key in the future must get no weight "
        "at all once the softmax has run. Which values do both?",
        "A (T, T) matrix built from the distance i - j (rows i, columns j, from two aranges): on and below the "
        "diagonal a multiple of the distance that is <= 0; above it a value whose exponential is exactly 0.",
        "pos = torch.arange(T, dtype=torch.float64); dist = pos[:, None] - pos[None, :]; "
        "bias = (-slope * dist).masked_fill(dist < 0, -torch.inf) (-inf, not 0: a 0 logit still gets softmax "
        "weight)."),
    3: ("Write it as an RNN: what is the state, what happens to it at each token (before the token is written), "
        "and how is the output read from it?",
        "The state S has shape (..., Dv, D) and starts at zero; each of the T steps updates it from the previous "
        "S, gamma, v_t and k_t, then reads o_t (..., Dv) from it with q_t; the T outputs stack to (..., T, Dv).",
        "Start from S = zeros(..., Dv, D); each step: S = gamma * S + outer(v_t, k_t), then o_t = S @ q_t; stack "
        "the o_t along dim -2."),
    4: ("After d tokens a value written into the state has been multiplied by gamma d times. Which equation says "
        "that this factor is one half at d = 100?",
        "Solve gamma^100 = 1/2 for gamma (take logarithms of both sides); the answer is one Python float a little "
        "below 1.",
        "100 log(gamma) = log(1/2), so gamma = 2 ** (-1 / 100), about 0.9931; ALiBi's matching slope is "
        "-log(gamma) = log(2) / 100."),
})
hint = EXERCISES.hint


def _as_float_list(x):
    try:
        t = torch.as_tensor(x, dtype=torch.float64).flatten()
    except Exception:
        return None
    return t.tolist()


@EXERCISES.check(1)
def check_alibi_slopes(answer) -> Verdict:
    """``answer``: a function ``n_heads -> slopes`` (list or tensor, head h at index h), or the
    12 slopes for 12 heads.  A function is checked on 1, 6, 8, 12, 16 and 24 heads."""
    name = "ALiBi slopes"
    more = fallback_hint()
    sizes = (1, 6, 8, 12, 16, 24) if callable(answer) else (12,)
    for n in sizes:
        if callable(answer):
            got, err = _call(answer, n)
            if err:
                return student_failed(name, err)
        else:
            got = answer
        got = _as_float_list(got)
        want = alibi.alibi_slopes(n).tolist()
        if got is None:
            return verdict(name, False, f"expected a list or tensor of numbers for {n} heads. {more}")
        if len(got) != n:
            return verdict(name, False, f"expected {n} slopes for {n} heads, got {len(got)}. {more}")
        close = [math.isclose(a, b, rel_tol=1e-6) for a, b in zip(got, want)]  # float32 answers are fine
        if not all(close):
            if all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(sorted(got), sorted(want))):
                return verdict(name, False, f"the right slopes for {n} heads, in another order: keep the "
                                            "power-of-two heads first, then the interleaved ones.")
            h = close.index(False)
            return verdict(name, False, f"wrong slopes for {n} heads (head {h}: expected {want[h]:.6g}, "
                                        f"got {got[h]:.6g}). {more}")
    return verdict(name, True, f"right for {', '.join(map(str, sizes))} heads.")


@EXERCISES.check(2)
def check_alibi_bias(fn) -> Verdict:
    """``fn(T, slope) -> (T, T)`` tensor: ALiBi's bias, row = query i, column = key j,
    ``-slope (i - j)`` for ``j <= i`` and ``-inf`` above the diagonal."""
    name = "ALiBi bias"
    for T, slope in ((1, 0.5), (6, 0.5), (9, 0.125), (5, 2.0)):
        got, err = _call(fn, T, slope)
        if err:
            return student_failed(name, err)
        if not isinstance(got, torch.Tensor):
            return verdict(name, False, f"expected a torch.Tensor, got {type(got).__name__}.")
        if tuple(got.shape) != (T, T):
            return verdict(name, False, f"expected shape {(T, T)} for T={T}, got {tuple(got.shape)}.")
        got = got.double()
        want = alibi.alibi_bias(T, slope)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        if future.any() and not bool((got[future] == float("-inf")).all()):
            return verdict(name, False, "the future (j > i) must be -inf, not 0: a 0 logit still gets softmax weight "
                                        "(the seed's snippet makes this mistake).")
        past = ~future
        if torch.allclose(got[past], -want[past], rtol=1e-9, atol=1e-12) and slope * (T - 1) > 0:
            return verdict(name, False, "the sign is flipped: ALiBi penalises distance, so the bias is "
                                        "-slope*(i-j) <= 0 (the seed displays +slope*(i-j)).")
        if not torch.allclose(got[past], want[past], rtol=1e-9, atol=1e-12):
            return verdict(name, False, f"wrong values on or below the diagonal for T={T}, slope={slope}: "
                                        f"entry (i, j) is -slope*(i-j). {fallback_hint()}")
    return verdict(name, True, "negative below the diagonal, 0 on it, -inf above.")


@EXERCISES.check(3)
def check_retnet_recurrent(fn) -> Verdict:
    """``fn(q, k, v, gamma) -> (..., T, Dv)``: the recurrence ``S_t = gamma S_{t-1} + v_t k_t^T``,
    ``o_t = S_t q_t``, checked against :func:`pathedu.alibi.retnet_matrix` on float64 inputs."""
    def make(seed):
        g = torch.Generator().manual_seed(100 + seed)
        lead, T, D, Dv = [(2,), (3,), (1, 2)][seed], [7, 13, 1][seed], 8, [8, 5, 3][seed]
        q, k = (torch.randn(*lead, T, D, generator=g, dtype=torch.float64) for _ in range(2))
        v = torch.randn(*lead, T, Dv, generator=g, dtype=torch.float64)
        return q, k, v, [0.9, 0.5, 0.99][seed]

    return check_function("RetNet recurrent form", fn, alibi.retnet_matrix, make, rtol=1e-9)


@EXERCISES.check(4)
def check_half_life_gamma(gamma) -> Verdict:
    """``gamma``: the gate whose decay ``gamma^d`` halves after ``d = 100`` tokens (``None``, the stub's value,
    is "not attempted yet")."""
    name = "gamma with a half-life of 100 tokens"
    if gamma is None:
        return not_attempted(name, "your answer is still None. Set it to a number and run the cell again")
    want = 2.0 ** (-1 / 100)
    if isinstance(gamma, torch.Tensor) and gamma.numel() == 1:
        gamma = gamma.item()
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
        return verdict(name, False, f"expected a number, got {type(gamma).__name__}.")
    gamma = float(gamma)
    if math.isclose(gamma, want, rel_tol=1e-6):
        return verdict(name, True, f"gamma = 2^(-1/100) = {want:.6f}, slope = log(2)/100 = {math.log(2) / 100:.6f}.")
    if math.isclose(gamma, math.exp(-1 / 100), rel_tol=1e-6):
        return verdict(name, False, "that gamma falls to 1/e after 100 tokens, not to 1/2: solve gamma^100 = 1/2.")
    if math.isclose(gamma, 0.5 ** 100, rel_tol=1e-6) or math.isclose(gamma, 0.99, rel_tol=1e-9):
        return verdict(name, False, "solve gamma^100 = 1/2 for gamma (take logs: 100 log gamma = log 1/2).")
    if not 0 < gamma <= 1:
        return verdict(name, False, f"a forget gate lies in (0, 1], got {gamma}.")
    h = alibi.half_life(gamma)
    return verdict(name, False, f"your gamma halves after {h:.1f} tokens, not 100: solve gamma^100 = 1/2.")
