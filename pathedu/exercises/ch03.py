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

__all__ = ["check_log_gate_matrix", "check_fox_matrix", "check_gla_recurrent", "check_underflow_length"]


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


def check_underflow_length(n) -> Verdict:
    """``n``: how many gates ``f = 0.9`` a float32 running product ``f * f * ...`` multiplies
    before it is exactly 0 (the smallest such count; within 2 of the measured one is accepted)."""
    name = "float32 underflow of a product of gates 0.9"
    prod = torch.cumprod(torch.full((2000,), 0.9, dtype=torch.float32), 0)
    want = int(torch.nonzero(prod == 0)[0, 0].item()) + 1
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        n = n.item()
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or n != int(n):
        return verdict(name, False, f"expected a whole number of gates, got {n!r}.")
    n = int(n)
    if abs(n - want) <= 2:
        return verdict(name, True, f"{want} gates of 0.9 multiply to exactly 0 in float32, while their log-space sum "
                                   f"is a harmless {want * torch.log(torch.tensor(0.9)).item():.1f}.")
    hint = ("Multiply in float32, torch.cumprod(torch.full((2000,), 0.9), 0), and find the first 0; or solve "
            "0.9^n < 2^-149 / 2 (half the smallest float32 subnormal).")
    return verdict(name, False, f"{n} is {'too small' if n < want else 'too large'}. {hint}")
