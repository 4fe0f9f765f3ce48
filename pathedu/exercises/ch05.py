"""Chapter 5 exercises: check functions for ``notebooks/05_path_deltanet_lab.ipynb``.

Each ``check_*`` function takes the student's function, runs it on a few fresh
random float64 inputs, compares it with the library's forms
(:mod:`pathedu.path`) and prints one line: ``Correct [...]`` or ``Not yet [...]``
with a hint (naming the mistake when the answer matches a known wrong variant).
It returns a :class:`~pathedu.exercises.Verdict` and never raises because of the
answer: a stub that raises ``NotImplementedError`` gets a friendly "Not yet".

Exercises:

1. :func:`check_delta_step`: one step of the delta rule,
   ``S <- S - beta (S k - v) k^T`` (a gradient step on ``|S k - v|^2 / 2``).
2. :func:`check_interval_product`: the product ``H_{j+1} H_{j+2} ... H_i``
   between key ``j`` and query ``i``, in the right order.
3. :func:`check_ut_factor`: the UT factor ``A`` of three transitions, with
   ``H_2 H_1 H_0 = I - W^T A W``.
4. :func:`check_path_attention`: PaTH attention from its definition.
"""
from __future__ import annotations

import torch

from .. import path
from ._grader import Verdict, check_function

__all__ = ["check_delta_step", "check_interval_product", "check_ut_factor", "check_path_attention"]


def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def _householder(w_s, beta_s):
    eye = torch.eye(w_s.shape[-1], dtype=w_s.dtype)
    return eye - beta_s[..., None, None] * w_s[..., :, None] * w_s[..., None, :]


# ---------------------------------------------------------------------------
# Exercise 1: one delta-rule step
# ---------------------------------------------------------------------------

def _delta_inputs(seed):
    g = torch.Generator().manual_seed(500 + seed)
    lead, D, Dv = [((3,), 5, 4), ((2, 2), 6, 3), ((), 4, 7)][seed % 3]
    S = _randn(g, *lead, Dv, D)
    k = _unit(_randn(g, *lead, D))
    v = _randn(g, *lead, Dv)
    beta = 2 * torch.rand(lead, generator=g, dtype=torch.float64)
    return S, k, v, beta


def _delta_reference(S, k, v, beta):
    """Through the library: one token of :func:`pathedu.path.deltanet_recurrent` from state S."""
    _, S_new = path.deltanet_recurrent(k[..., None, :], k[..., None, :], v[..., None, :], beta[..., None],
                                       initial_state=S, return_state=True)
    return S_new


def _outer(a, b):
    """Batched outer product ``a b^T``: ``(..., m), (..., n) -> (..., m, n)``."""
    return a[..., :, None] * b[..., None, :]


def _error(S, k, v):
    """The memory's prediction error ``S k - v``."""
    return (S @ k[..., :, None])[..., 0] - v


_DELTA_WRONG = [
    (lambda S, k, v, beta: S + beta[..., None, None] * _outer(v, k),
     "Your update adds beta v k^T only: that is linear attention. The delta rule first subtracts "
     "what the memory already returns for k: use the error (S k - v)."),
    (lambda S, k, v, beta: S + beta[..., None, None] * _outer(_error(S, k, v), k),
     "Your step goes uphill: the gradient of |S k - v|^2 / 2 is (S k - v) k^T, and descent subtracts it."),
    (lambda S, k, v, beta: S - _outer(_error(S, k, v), k),
     "Your step ignores beta (it takes beta = 1): scale the correction by beta."),
]


def check_delta_step(delta_step) -> Verdict:
    """Exercise 1: ``delta_step(S, k, v, beta) -> S_new``, one step of the delta rule.

    ``S: (..., Dv, D)`` (the memory: it should map keys to values, ``S k ~ v``),
    ``k: (..., D)`` (unit norm), ``v: (..., Dv)``, ``beta: (...)`` in [0, 2].
    ``S_new = S - beta (S k - v) k^T``: one gradient step, with step size beta, on
    the regression loss ``|S k - v|^2 / 2``; equivalently
    ``S (I - beta k k^T) + beta v k^T``.
    """
    return check_function("delta-rule step", delta_step, _delta_reference, _delta_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_DELTA_WRONG,
                          hint="Hint: compute the prediction S k, the error S k - v, and subtract beta * "
                               "outer(error, k).")


# ---------------------------------------------------------------------------
# Exercise 2: the product between key j and query i
# ---------------------------------------------------------------------------

def _interval_inputs(seed):
    g = torch.Generator().manual_seed(600 + seed)
    L, D, j, i = [(7, 4, 1, 5), (6, 3, -1, 4), (9, 5, 2, 8)][seed % 3]
    w = _unit(_randn(g, L, D))
    beta = 2 * torch.rand(L, generator=g, dtype=torch.float64)
    return w, beta, j, i


def _interval_reference(w, beta, j, i):
    return path.interval_product(w, beta, j, i)


def _product(w, beta, idx):
    P = torch.eye(w.shape[-1], dtype=w.dtype)
    for s in idx:
        P = P @ _householder(w[s], beta[s])
    return P


_INTERVAL_WRONG = [
    (lambda w, beta, j, i: _product(w, beta, range(i, j, -1)),
     "Your product runs H_i ... H_{j+1}: the reverse order (the seed snippet's `P = H[s] @ P` bug). "
     "Unrolling S_t = S_{t-1} H_t puts the smallest index on the left."),
    (lambda w, beta, j, i: _product(w, beta, range(max(j, 0), i + 1)),
     "Your product includes H_j: a token's own transition never acts on its own key; start at j + 1."),
    (lambda w, beta, j, i: _product(w, beta, range(j + 1, i)),
     "Your product stops at H_{i-1}: the query's own transition H_i is part of the path (s runs to i)."),
]


def check_interval_product(interval_product) -> Verdict:
    """Exercise 2: ``interval_product(w, beta, j, i) -> H_{j+1} H_{j+2} ... H_i``.

    ``w: (L, D)`` (rows ``w_0 .. w_{L-1}``), ``beta: (L,)``, ints ``-1 <= j < i < L``;
    ``H_s = I - beta_s w_s w_s^T``.  Returns the ``(D, D)`` product with the
    smallest index on the left: the matrix in ``logit_ij = k_j^T (...) q_i``.
    """
    return check_function("interval product", interval_product, _interval_reference, _interval_inputs,
                          trials=3, rtol=1e-10, wrong_variants=_INTERVAL_WRONG,
                          hint="Hint: start from the identity and multiply on the right by H_{j+1}, then "
                               "H_{j+2}, ..., up to H_i.")


# ---------------------------------------------------------------------------
# Exercise 3: the UT factor of three transitions
# ---------------------------------------------------------------------------

def _ut_inputs(seed):
    g = torch.Generator().manual_seed(700 + seed)
    D = (4, 5, 3)[seed % 3]  # L = 3 <= D: W has full row rank, so A is unique
    w = _unit(_randn(g, 3, D))
    beta = 0.2 + 1.6 * torch.rand(3, generator=g, dtype=torch.float64)
    return w, beta


def _ut_reference(w, beta):
    return path.ut_transform(w, beta)[1]


def _inv_eye_plus(N):
    return torch.linalg.inv(torch.eye(N.shape[-1], dtype=N.dtype) + N)


_UT_WRONG = [
    (lambda w, beta: _inv_eye_plus((beta[:, None] * (w @ w.T)).triu(1)) @ torch.diag(beta),
     "Your A is upper triangular: with the rows w_0, w_1, w_2 in W, strictLower keeps s > t (below the diagonal)."),
    (lambda w, beta: _inv_eye_plus((w @ w.T * beta[None, :]).tril(-1)) @ torch.diag(beta),
     "You scaled the columns of W W^T by beta: entry (s, t) must be beta_s w_s . w_t (scale the rows)."),
    (lambda w, beta: _inv_eye_plus((beta[:, None] * (w @ w.T)).tril(-1)),
     "You forgot the final D_beta: A = (I + strictLower(D_beta W W^T))^{-1} D_beta."),
    (lambda w, beta: _inv_eye_plus((beta[:, None] * (w @ w.T)).tril(-1)).T @ torch.diag(beta),
     "Your A is the factor of the product in the other order; keep A lower triangular."),
]


def check_ut_factor(ut_factor) -> Verdict:
    """Exercise 3: ``ut_factor(w, beta) -> A`` for L = 3 transitions.

    ``w: (3, D)`` holds ``w_0, w_1, w_2`` as rows (``W``), ``beta: (3,)``.
    ``A: (3, 3)`` lower triangular with ``H_2 H_1 H_0 = I - W^T A W``:
    ``A = (I + strictLower(D_beta W W^T))^{-1} D_beta``, ``D_beta = diag(beta)``.
    """
    return check_function("UT factor (L = 3)", ut_factor, _ut_reference, _ut_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_UT_WRONG,
                          hint="Hint: build G = D_beta W W^T (row s scaled by beta_s), keep its strictly "
                               "lower part, add I, invert (or solve) and multiply by D_beta on the right.")


# ---------------------------------------------------------------------------
# Exercise 4: PaTH attention from the definition
# ---------------------------------------------------------------------------

def _path_inputs(seed):
    g = torch.Generator().manual_seed(800 + seed)
    T, D, Dv = [(6, 4, 3), (9, 3, 5), (1, 4, 2)][seed % 3]
    q, k, v = 2 * _randn(g, T, D), 2 * _randn(g, T, D), _randn(g, T, Dv)
    w = _unit(_randn(g, T, D))
    beta = 2 * torch.rand(T, generator=g, dtype=torch.float64)
    return q, k, v, w, beta


def _path_reference(q, k, v, w, beta):
    return path.path_naive(q, k, v, w, beta, scale=q.shape[-1] ** -0.5)


def _path_with(order, q, k, v, w, beta, scale=None):
    T, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    logits = torch.full((T, T), float("-inf"), dtype=q.dtype)
    for i in range(T):
        for j in range(i + 1):
            idx = {"right": range(j + 1, i + 1), "reversed": range(i, j, -1), "with_j": range(j, i + 1)}[order]
            logits[i, j] = scale * k[j] @ _product(w, beta, idx) @ q[i]
    return torch.softmax(logits, -1) @ v


_PATH_WRONG = [
    (lambda q, k, v, w, beta: _path_with("reversed", q, k, v, w, beta),
     "Your logits use H_i ... H_{j+1}: the reverse order. The logit is k_j^T H_{j+1} ... H_i q_i."),
    (lambda q, k, v, w, beta: _path_with("with_j", q, k, v, w, beta),
     "Your product includes H_j: the key's own transition does not act on it; start at j + 1."),
    (lambda q, k, v, w, beta: _path_with("right", q, k, v, w, beta, scale=1.0),
     "You forgot the scale D**-0.5 on the logits."),
    (lambda q, k, v, w, beta: torch.softmax((q @ k.T).masked_fill(torch.ones(q.shape[0], q.shape[0]).triu(1).bool(),
                                                                  float("-inf")) * q.shape[1] ** -0.5, -1) @ v,
     "Your output is plain causal softmax attention: the Householder products are missing."),
]


def check_path_attention(path_attention) -> Verdict:
    """Exercise 4: ``path_attention(q, k, v, w, beta) -> o``, PaTH attention from its definition.

    ``q, k, w: (T, D)``, ``v: (T, Dv)``, ``beta: (T,)``;
    ``logit_ij = D**-0.5 * k_j^T H_{j+1} ... H_i q_i`` for ``j <= i`` (``-inf`` above
    the diagonal), ``o_i = sum_j softmax_j(logit_ij) v_j``: ``(T, Dv)``.
    """
    return check_function("PaTH attention", path_attention, _path_reference, _path_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_PATH_WRONG,
                          hint="Hint: for each i, walk j = i, i-1, ..., 0 keeping P = H_{j+1} ... H_i (start "
                               "with I; after key j, P <- H_j P); logit = scale * k_j^T P q_i; then softmax over j <= i.")
