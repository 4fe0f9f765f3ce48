"""Check functions for the exercises of chapter 2 (ALiBi <-> RetNet).

The references are :mod:`pathedu.alibi`'s forms.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.
"""
from __future__ import annotations

import math
import numbers

import torch

from .. import alibi
from ._grader import (Exercises, Verdict, call_student as _call, check_function, fallback_hint, not_attempted,
                      student_failed, verdict, randn64, seeded, paragraph)

__all__ = ["check_alibi_slopes", "check_alibi_bias", "check_retnet_recurrent", "check_half_life_gamma",
           "check_reach", "check_why_no_state", "check_retnet_bug", "hint"]

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
    5: ("ALiBi adds -lambda d to the logit of a key d tokens back: what does that do to its weight after exp?",
        "The weight is multiplied by e^(-lambda d); solve e^(-lambda d) < 10^-3 for the smallest whole d.",
        "e^(-d/2) < 10^-3 means d > 2 ln(1000): the smallest whole number above it."),
    6: ("Write both as sums over keys and ask which one can be updated token by token with a fixed amount of "
        "memory.",
        "RetNet's weight gamma^(i-j) (q_i . k_j) factors into gamma^i and gamma^-j and is linear in the values; "
        "ALiBi's weight goes through a softmax: an exponential of the logit and a normalisation over every key.",
        "gamma^(i-j) = gamma^i gamma^-j, so S_t = gamma S_{t-1} + v_t k_t^T holds the whole past in Dv x D "
        "numbers; exp(q.k) does not factor into a finite feature map and the softmax's denominator needs every "
        "key: ALiBi keeps a KV cache that grows with t."),
    7: ("Step it by hand for T = 1: what should o_0 be, and what does the planted form return?",
        "Each step must first decay and write the state, then read it: the token sees itself.",
        "The planted form reads S before writing token t: the diagonal is dropped (bug kind \"mask\"); swap "
        "the two lines."),
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
        g = seeded(100 + seed)
        lead, T, D, Dv = [(2,), (3,), (1, 2)][seed], [7, 13, 1][seed], 8, [8, 5, 3][seed]
        q, k = (randn64(g, *lead, T, D) for _ in range(2))
        v = randn64(g, *lead, T, Dv)
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


# ---------------------------------------------------------------------------
# Exercise 5 (predict, then run): how far back a slope of 1/2 lets a key count
# ---------------------------------------------------------------------------

REACH_SLOPE, REACH_FACTOR = 0.5, 1e-3


def _reach() -> int:
    bias = alibi.alibi_bias(64, torch.tensor(REACH_SLOPE, dtype=torch.float64))[-1].flip(0)  # by distance 0, 1, ..
    return int(torch.nonzero(torch.exp(bias) < REACH_FACTOR)[0, 0])


@EXERCISES.prediction(5, "predict: the reach of a slope", _reach, near=0.25)
def check_reach(d) -> Verdict:
    """Exercise 5: the smallest distance ``d`` (an int) at which ALiBi's bias with slope :data:`REACH_SLOPE`
    multiplies a key's softmax weight by less than :data:`REACH_FACTOR` (half the point within 25%)."""


# ---------------------------------------------------------------------------
# Exercise 6 (explain): why RetNet has a state and ALiBi a cache
# ---------------------------------------------------------------------------

NO_STATE_RUBRIC = paragraph("""2 points. 1: RetNet's weight gamma^(i-j) (q_i . k_j) is linear in the values and the
    decay factors as gamma^i gamma^-j (or: each step multiplies the state by gamma), so the past fits in a Dv x D
    state, S_t = gamma S_{t-1} + v_t k_t^T. 1: ALiBi's decay sits inside a softmax: exp(q.k) has no finite
    factorisation and the normaliser sums over every key, so it keeps every key and value (a KV cache growing with
    t). Half a point for 'softmax is not linear' alone.""")


@EXERCISES.explanation(6, "explain: a state or a cache", rubric=NO_STATE_RUBRIC)
def check_why_no_state(text) -> Verdict:
    """Exercise 6: why the same constant decay gives RetNet a fixed-size state and ALiBi a growing cache."""


# ---------------------------------------------------------------------------
# Exercise 7 (find the bug): RetNet's recurrence with one planted error
# ---------------------------------------------------------------------------

def _retnet_planted(q, k, v, gamma):
    """The lab's planted form: o_t is read from the state before token t is written."""
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        outs.append((S @ q[..., t, :, None])[..., 0])
        S = gamma * S + v[..., t, :, None] * k[..., t, None, :]
    return torch.stack(outs, dim=-2)


def _retnet_bug_inputs(seed):
    g = seeded(700 + seed)
    lead, T, D, Dv = [((2,), 9, 6, 4), ((2, 3), 5, 4, 7), ((), 12, 8, 3)][seed % 3]
    q, k = (randn64(g, *lead, T, D) for _ in range(2))
    return q, k, randn64(g, *lead, T, Dv), [0.9, 0.7, 0.97][seed % 3]


@EXERCISES.planted_bug(7, "find the bug: RetNet's recurrence", bug="mask", reference=alibi.retnet_recurrent,
                       make_inputs=_retnet_bug_inputs, buggy=_retnet_planted)
def check_retnet_bug(bug, retnet_fixed) -> Verdict:
    """Exercise 7: ``bug`` names the planted error of the lab's ``retnet_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``retnet_fixed(q, k, v, gamma) -> (..., T, Dv)`` is the recurrence
    fixed, compared with :func:`pathedu.alibi.retnet_recurrent`."""
