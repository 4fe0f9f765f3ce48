"""Check functions for the exercises of chapter 3 (FoX <-> GLA / Mamba2).

Each ``check_*`` takes the student's answer, prints a one-line verdict with a
hint and returns a :class:`pathedu.exercises.Verdict` (truthy when right).  A
wrong answer, or one that raises, never raises here.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from .. import fox
from ._grader import Verdict, call_student as _call, check_function, verdict

__all__ = ["check_log_gate_matrix", "check_fox_matrix", "check_gla_recurrent", "check_stuck_product"]


def _log_f(shape, seed):
    g = torch.Generator().manual_seed(300 + seed)
    return F.logsigmoid(1.5 + 1.5 * torch.randn(*shape, generator=g, dtype=torch.float64))


def _qkv(seed, Dv=None):
    g = torch.Generator().manual_seed(200 + seed)
    lead, T, D = [(2,), (3,), (1, 2)][seed], [9, 14, 1][seed], 8
    q, k = (torch.randn(*lead, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(*lead, T, D if Dv is None else Dv, generator=g, dtype=torch.float64)
    return q, k, v


def check_log_gate_matrix(fn) -> Verdict:
    """``fn(log_f: (..., T)) -> D: (..., T, T)`` with ``D[i, j] = sum_{s=j+1..i} log_f[s]`` for
    ``j <= i`` and ``-inf`` above the diagonal; checked on float64 gates of a few shapes."""
    name = "cumulative log gate D"
    for seed, shape in enumerate([(7,), (2, 10), (3, 1)]):
        log_f = _log_f(shape, seed)
        T = shape[-1]
        got, err = _call(fn, log_f.clone())
        if err:
            return verdict(name, False, err)
        if not isinstance(got, torch.Tensor):
            return verdict(name, False, f"expected a torch.Tensor, got {type(got).__name__}.")
        if tuple(got.shape) != shape + (T,):
            return verdict(name, False, f"expected shape {shape + (T,)} for log_f of shape {shape}, got {tuple(got.shape)}.")
        got = got.double()
        want = fox.log_gate_matrix(log_f)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        if future.any() and not bool((got[..., future] == float("-inf")).all()):
            return verdict(name, False, "above the diagonal (j > i, the future) D must be -inf, not 0: a logit of 0 "
                                        "still gets softmax weight (the seed's FoX snippet makes this mistake).")
        past = ~future
        if not torch.allclose(got[..., past], want[..., past], rtol=1e-9, atol=1e-12):
            incl = fox.log_gate_matrix(log_f) + log_f[..., None, :]  # sum over s = j..i
            if torch.allclose(got[..., past], incl[..., past], rtol=1e-9, atol=1e-12):
                return verdict(name, False, "you included key j's own gate: the sum runs over s = j+1 .. i, "
                                            "so the diagonal D[i, i] is 0.")
            if torch.allclose(got[..., past], -want[..., past], rtol=1e-9, atol=1e-12):
                return verdict(name, False, "the sign is flipped: log gates are <= 0, so D <= 0 below the diagonal.")
            return verdict(name, False, "wrong values on or below the diagonal: D[i, j] = log_f[j+1] + ... + log_f[i]. "
                                        "Hint: a cumulative sum c, then c_i - c_j, gives it.")
    return verdict(name, True, "0 on the diagonal, sums of log gates below it, -inf above.")


def check_fox_matrix(fn) -> Verdict:
    """``fn(q, k, v, log_f) -> (..., T, Dv)``: FoX, ``softmax(Q K^T / sqrt(D) + D_gate) V`` with the
    causal mask, the gate *not* multiplied by the scale; checked against :func:`pathedu.fox.fox_matrix`."""
    def make(seed):
        q, k, v = _qkv(seed, Dv=[8, 5, 3][seed])
        return q, k, v, _log_f(q.shape[:-1], seed)

    return check_function("FoX matrix form", fn, fox.fox_matrix, make, rtol=1e-9,
                          hint="logits = Q K^T / sqrt(D) + D_gate, with D_gate[i, j] = sum_{s=j+1..i} log_f[s] and "
                               "-inf above the diagonal (not 0); the gate is not scaled; then softmax over keys and @ V.")


def check_gla_recurrent(fn) -> Verdict:
    """``fn(q, k, v, log_f) -> (..., T, Dv)`` with a per-channel gate ``log_f: (..., T, D)``:
    ``S_t = S_{t-1} diag(exp(log_f[t])) + v_t k_t^T``, ``o_t = S_t q_t`` (``S_t`` is Dv x D);
    checked against :func:`pathedu.fox.gla_matrix` on float64 inputs with ``Dv = D``."""
    def make(seed):
        q, k, v = _qkv(seed)  # Dv = D: a gate on the wrong side of S is a wrong value, not a shape error
        return q, k, v, _log_f(q.shape, seed)

    return check_function("GLA recurrent form", fn, fox.gla_matrix, make, rtol=1e-9,
                          hint="Start from S = zeros(..., Dv, D); each step: first decay the old state column by column, "
                               "S = S * exp(log_f[..., t, None, :]) (key channels are S's columns), then add "
                               "outer(v_t, k_t); o_t = S @ q_t.")


def check_stuck_product(n, value) -> Verdict:
    """``n``, ``value``: a float32 product of gates ``f = 0.9``, multiplied one gate at a time, stops changing
    after ``n`` gates (``p_{n+1} == p_n`` for the smallest such ``n``; within 2 is accepted) at the value
    ``p_n`` (a positive number, within 1e-6 relative)."""
    name = "a float32 running product of gates 0.9"
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
        return verdict(name, False, f"{int(n)} is {'too small' if n < want_n else 'too large'}. Keep a float32 "
                                    "scalar and multiply it by 0.9 in a loop; stop when it no longer changes.")
    if abs(value - want_value) > 1e-6 * want_value:
        return verdict(name, False, f"the count is right but {value!r} is not the value the product sticks at.")
    return verdict(name, True, f"after {want_n} gates the product sticks at {want_value:.3g} = "
                               f"{want_value / 2 ** -149:.0f} x 2^-149, a subnormal: 0.9 times it rounds back to "
                               f"it. From then on P_i / P_j = 1 instead of 0.9^(i-j): silently wrong, no NaN.")
