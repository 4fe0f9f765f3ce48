"""Check functions for the exercises of chapter 3 (FoX <-> GLA / Mamba2).

The references are :mod:`pathedu.fox`'s forms.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from .. import fox
from ._grader import (Exercises, Verdict, call_student as _call, check_function, fallback_hint, not_attempted,
                      student_failed, verdict, randn64, seeded, paragraph)

__all__ = ["check_log_gate_matrix", "check_fox_matrix", "check_gla_recurrent", "check_stuck_product",
           "check_gate_product", "check_why_log_space", "check_fox_bug", "hint"]

EXERCISES = Exercises("ch03", {
    1: ("G[i, j] is a sum of log gates over a range of positions that depends on both i and j. Can one running "
        "sum give every such range sum at once, without a double loop? And what must the future (j > i) hold?",
        "With c the cumulative sum of log_f along the last dim (shape (..., T)), G[i, j] is the difference of "
        "two entries of c, one at the query i and one at the key j; broadcasting c against itself gives "
        "(..., T, T). Above the diagonal G needs a value whose exponential is 0.",
        "c = torch.cumsum(log_f, -1); G = c[..., :, None] - c[..., None, :] (log_f[j] cancels: a key's own gate "
        "never acts); then masked_fill the future, torch.ones(T, T, dtype=torch.bool).triu(1), with -inf "
        "(not 0)."),
    2: ("FoX is softmax attention with one extra term on the logits. Which term, and does the usual 1/sqrt(D) "
        "scale apply to it?",
        "Logits (..., T, T): the scaled Q K^T plus exercise 1's gate matrix (its -inf above the diagonal is also "
        "the causal mask); a softmax over the keys (the last dim), then a product with V (..., T, Dv).",
        "logits = Q K^T / sqrt(D) + G, with G[i, j] = sum_{s=j+1..i} log_f[s] and -inf above the "
        "diagonal (not 0); the gate is not scaled; then softmax over keys and @ V."),
    3: ("It is RetNet's recurrence with one gate per key channel instead of one number. Which dimension of the "
        "state S (Dv x D) does a key-channel gate scale, and does a token's gate act on its own write?",
        "State S (..., Dv, D), zero at first. At step t the gate exp(log_f[..., t, :]) (shape (..., D)) scales "
        "S's columns, then the write v_t k_t^T (..., Dv, D) is added, then o_t = S q_t (..., Dv); the outputs "
        "stack to (..., T, Dv).",
        "Start from S = zeros(..., Dv, D); each step: first decay the old state column by column, "
        "S = S * exp(log_f[..., t, None, :]) (key channels are S's columns), then add outer(v_t, k_t); "
        "o_t = S @ q_t."),
    4: ("Multiply a float32 number by 0.9 over and over, one step at a time, and watch it: it never reaches 0, "
        "but at some step it stops changing. Which step, and why there?",
        "Keep p a float32 scalar tensor, multiply it by 0.9 in a loop of 2000 steps and keep every value; n is "
        "the number of gates after which one more multiplication leaves the value unchanged, value is that "
        "value. Not torch.cumprod.",
        "p = torch.ones((), dtype=torch.float32); products = []; for _ in range(2000): p = p * 0.9; "
        "products.append(p.item()). n = the first n >= 1 with products[n] == products[n - 1], "
        "value = products[n - 1]."),
    5: ("Which gates act between key 1 and query 4? A key's own gate never acts on it.",
        "e^{G_{4,1}} is the product f_s over s = j+1 .. i: three gates.",
        "f_2 f_3 f_4 = 0.8 * 0.7 * 0.6 (not f_1, the key's own gate)."),
    6: ("Multiply a thousand gates of 0.9 in float32 (exercise 4) and compare with adding their logs.",
        "Two problems of products in floating point: where they end up, and what a ratio of two of them is "
        "worth; and what a sum of logs gives the softmax instead.",
        "Products of gates underflow (to 0 or a stuck subnormal), so P_i / P_j is 0/0 or wrong; the sums "
        "c_i - c_j of log gates stay in range and are <= 0, and added to the logits they are the gate."),
    7: ("Compare the planted form's logits with exercise 2's: what is added to Q K^T / sqrt(D)?",
        "The gate enters the softmax as a bias: its log, sum_{s=j+1..i} log f_s, not the product itself.",
        "The planted form adds e^{c_i - c_j} (the gate product) to the logits: linear space where log space "
        "belongs (bug kind \"space\"); add c_i - c_j instead."),
})
hint = EXERCISES.hint


def _log_f(shape, seed):
    g = seeded(300 + seed)
    return F.logsigmoid(1.5 + 1.5 * randn64(g, *shape))


def _qkv(seed, Dv=None):
    g = seeded(200 + seed)
    lead, T, D = [(2,), (3,), (1, 2)][seed], [9, 14, 1][seed], 8
    q, k = (randn64(g, *lead, T, D) for _ in range(2))
    v = randn64(g, *lead, T, D if Dv is None else Dv)
    return q, k, v


@EXERCISES.check(1)
def check_log_gate_matrix(fn) -> Verdict:
    """``fn(log_f: (..., T)) -> G: (..., T, T)`` with ``G[i, j] = sum_{s=j+1..i} log_f[s]`` for
    ``j <= i`` and ``-inf`` above the diagonal; checked on float64 gates of a few shapes."""
    name = "log-gate matrix G"
    for seed, shape in enumerate([(7,), (2, 10), (3, 1)]):
        log_f = _log_f(shape, seed)
        T = shape[-1]
        got, err = _call(fn, log_f.clone())
        if err:
            return student_failed(name, err)
        if not isinstance(got, torch.Tensor):
            return verdict(name, False, f"expected a torch.Tensor, got {type(got).__name__}.")
        if tuple(got.shape) != shape + (T,):
            return verdict(name, False, f"expected shape {shape + (T,)} for log_f of shape {shape}, got {tuple(got.shape)}.")
        got = got.double()
        want = fox.log_gate_matrix(log_f)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        if future.any() and not bool((got[..., future] == float("-inf")).all()):
            return verdict(name, False, "above the diagonal (j > i, the future) G must be -inf, not 0: a logit of 0 "
                                        "still gets softmax weight (the seed's FoX snippet makes this mistake).")
        past = ~future
        if not torch.allclose(got[..., past], want[..., past], rtol=1e-9, atol=1e-12):
            incl = fox.log_gate_matrix(log_f) + log_f[..., None, :]  # sum over s = j..i
            if torch.allclose(got[..., past], incl[..., past], rtol=1e-9, atol=1e-12):
                return verdict(name, False, "you included key j's own gate: the sum runs over s = j+1 .. i, "
                                            "so the diagonal G[i, i] is 0.")
            if torch.allclose(got[..., past], -want[..., past], rtol=1e-9, atol=1e-12):
                return verdict(name, False, "the sign is flipped: log gates are <= 0, so G <= 0 below the diagonal.")
            return verdict(name, False, "wrong values on or below the diagonal: G[i, j] = log_f[j+1] + ... + log_f[i]. "
                                        + fallback_hint())
    return verdict(name, True, "0 on the diagonal, sums of log gates below it, -inf above.")


@EXERCISES.check(2)
def check_fox_matrix(fn) -> Verdict:
    """``fn(q, k, v, log_f) -> (..., T, Dv)``: FoX, ``softmax(Q K^T / sqrt(D) + G) V`` with the
    causal mask, the gate *not* multiplied by the scale; checked against :func:`pathedu.fox.fox_matrix`."""
    def make(seed):
        q, k, v = _qkv(seed, Dv=[8, 5, 3][seed])
        return q, k, v, _log_f(q.shape[:-1], seed)

    return check_function("FoX matrix form", fn, fox.fox_matrix, make, rtol=1e-9)


@EXERCISES.check(3)
def check_gla_recurrent(fn) -> Verdict:
    """``fn(q, k, v, log_f) -> (..., T, Dv)`` with a per-channel gate ``log_f: (..., T, D)``:
    ``S_t = S_{t-1} diag(exp(log_f[t])) + v_t k_t^T``, ``o_t = S_t q_t`` (``S_t`` is Dv x D);
    checked against :func:`pathedu.fox.gla_matrix` on float64 inputs with ``Dv = D``."""
    def make(seed):
        q, k, v = _qkv(seed)  # Dv = D: a gate on the wrong side of S is a wrong value, not a shape error
        return q, k, v, _log_f(q.shape, seed)

    return check_function("GLA recurrent form", fn, fox.gla_matrix, make, rtol=1e-9)


@EXERCISES.check(4)
def check_stuck_product(n, value) -> Verdict:
    """``n``, ``value``: a float32 product of gates ``f = 0.9``, multiplied one gate at a time, stops changing
    after ``n`` gates (``p_{n+1} == p_n`` for the smallest such ``n``; within 2 is accepted) at the value
    ``p_n`` (a positive number, within 1e-6 relative)."""
    name = "a float32 running product of gates 0.9"
    if n is None and value is None:
        return not_attempted(name, "your answers are still None. Set both and run the cell again")
    p = fox.running_product(0.9, 2000)
    want_n = int(torch.nonzero(p[1:] == p[:-1])[0, 0].item()) + 1
    want_value = p[want_n - 1].item()
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        n = n.item()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or n != int(n):
        return verdict(name, False, f"expected a whole number of gates for `n`, got {n!r}.")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return verdict(name, False, f"expected a number for `value`, got {value!r}.")
    if value == 0:
        return verdict(name, False, "the product never reaches 0 when it is multiplied one gate at a time. "
                                    "torch.cumprod is not one gate at a time.")
    if abs(int(n) - want_n) > 2:
        return verdict(name, False, f"{int(n)} is {'too small' if n < want_n else 'too large'}. "
                                    + fallback_hint())
    if abs(value - want_value) > 1e-6 * want_value:
        return verdict(name, False, f"the count is right but {value!r} is not the value the product sticks at.")
    return verdict(name, True, f"after {want_n} gates the product sticks at {want_value:.3g} = "
                               f"{want_value / 2 ** -149:.0f} x 2^-149, a subnormal: 0.9 times it rounds back to "
                               f"it. From then on P_i / P_j = 1 instead of 0.9^(i-j): silently wrong, no NaN.")


# ---------------------------------------------------------------------------
# Exercise 5 (predict, then run): one entry of the gate matrix
# ---------------------------------------------------------------------------

#: The lab's gates for exercise 5 (positions 0 .. 5).
GATES = (0.9, 0.5, 0.8, 0.7, 0.6, 0.9)


def _gate_product() -> float:
    return torch.exp(fox.log_gate_matrix(torch.log(torch.tensor(GATES, dtype=torch.float64)))[4, 1]).item()


@EXERCISES.prediction(5, "predict: one gate product", _gate_product, rtol=1e-2)
def check_gate_product(value) -> Verdict:
    """Exercise 5: ``e^{G_{4,1}}`` for the gates :data:`GATES` (a number, within 1%)."""


# ---------------------------------------------------------------------------
# Exercise 6 (explain): why log space
# ---------------------------------------------------------------------------

LOG_SPACE_RUBRIC = paragraph("""2 points. 1: a running product of gates underflows in floating point (to 0, or stuck
    at a subnormal in float32), so the ratio P_i / P_j of two products is 0/0, or silently wrong, once the sequence
    is long or the gates small. 1: sums of log gates stay in range, the difference c_i - c_j is <= 0 (its
    exponential never overflows), and on the softmax side it is simply added to the logits (one addition in the
    kernel). Half a point for 'numerical stability' without saying what fails.""")


@EXERCISES.explanation(6, "explain: why log space", rubric=LOG_SPACE_RUBRIC)
def check_why_log_space(text) -> Verdict:
    """Exercise 6: why the forms take log gates and sum them instead of multiplying gates."""


# ---------------------------------------------------------------------------
# Exercise 7 (find the bug): FoX with one planted error
# ---------------------------------------------------------------------------

def _fox_planted(q, k, v, log_f):
    """The lab's planted form: the gate product, not its log, is added to the logits."""
    T = q.shape[-2]
    c = torch.cumsum(log_f, -1)
    gate = torch.exp(c[..., :, None] - c[..., None, :])
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    logits = (q @ k.mT) * q.shape[-1] ** -0.5 + gate
    return torch.softmax(logits.masked_fill(future, -torch.inf), -1) @ v


def _fox_bug_inputs(seed):
    q, k, v = _qkv(seed, Dv=[6, 8, 4][seed % 3])
    return q, k, v, _log_f(q.shape[:-1], seed + 10)


@EXERCISES.planted_bug(7, "find the bug: FoX", bug="space", reference=fox.fox_matrix, make_inputs=_fox_bug_inputs,
                       buggy=_fox_planted)
def check_fox_bug(bug, fox_fixed) -> Verdict:
    """Exercise 7: ``bug`` names the planted error of the lab's ``fox_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``fox_fixed(q, k, v, log_f) -> (..., T, Dv)`` is FoX fixed, compared
    with :func:`pathedu.fox.fox_matrix`."""
