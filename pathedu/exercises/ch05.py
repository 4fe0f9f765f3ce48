"""Chapter 5 exercises: check functions for ``notebooks/05_path_deltanet_lab.ipynb``.

The checks run the student's functions on fresh random float64 inputs against :mod:`pathedu.path`
and name the mistake when an answer matches a known wrong variant.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.

Exercises:

1. :func:`check_delta_step`: one step of the delta rule,
   ``S <- S - beta (S k - v) k^T`` (a gradient step on ``|S k - v|^2 / 2``).
2. :func:`check_interval_product`: the product ``H_{j+1} H_{j+2} ... H_i``
   between key ``j`` and query ``i``, in the right order.
3. :func:`check_ut_factor`: the UT factor ``A`` of three transitions, with
   ``H_2 H_1 H_0 = I - W^T A W``.
4. :func:`check_path_attention`: PaTH attention from its definition.
5. :func:`check_householder_chunk_step`: one chunk of the Householder RNN with
   the state of the prefix (the chunkwise-parallel form),
   ``o_i = S q~_i + sum_{j<=i} (k_j^T H_{j+1} ... H_i q_i) v_j`` and
   ``S <- S P + sum_j v_j k~_j^T``.
6. :func:`check_eigenvalues` (predict, then run): the extreme eigenvalues of one transition.
7. :func:`check_why_beta_range` (explain): why beta stays in [0, 2].
8. :func:`check_deltanet_bug` (find the bug): DeltaNet's recurrence with one planted error.

"""
from __future__ import annotations

import torch

from .. import path
from ._grader import (Exercises, Verdict, check_function, check_parts, outer, rand64, randn64, seeded, switched_off,
                      unit, paragraph)

__all__ = ["check_delta_step", "check_interval_product", "check_ut_factor", "check_path_attention",
           "check_householder_chunk_step", "check_eigenvalues", "check_why_beta_range", "check_deltanet_bug",
           "hint"]

EXERCISES = Exercises("ch05", {
    1: ("The delta rule is one step of gradient descent on the memory's regression loss |S k - v|^2 / 2, with "
        "step size beta. What is the gradient of that loss with respect to S?",
        "The prediction S k and the error S k - v are (..., Dv); the gradient is an outer product of the error "
        "with k, (..., Dv, D); beta (...) scales it, broadcast over the last two dims; descent subtracts it.",
        "Compute the prediction S k, the error S k - v, and subtract beta * outer(error, k): batched, "
        "error[..., :, None] * k[..., None, :] and beta[..., None, None]."),
    2: ("Unroll S_t = S_{t-1} H_t from key j's write to query i's read: which transitions act on the key, and in "
        "which order do they appear in the product?",
        "A (D, D) product of the transitions H_s = I - beta_s w_s w_s^T for s = j+1 .. i (the identity when "
        "j = i), the smallest index on the left; w[s] is (D,), beta[s] a number.",
        "Start from the identity and multiply on the right by H_{j+1}, then H_{j+2}, ..., up to H_i, with "
        "H_s = torch.eye(D) - beta[s] * torch.outer(w[s], w[s])."),
    3: ("Multiply out H_2 H_1 H_0: every term besides I is a number times some w_s w_t^T, so the product is "
        "I - W^T A W for a 3x3 table A of those numbers. The UT transform gets A from one triangular system.",
        "From W (3, D) and beta (3,): the Gram matrix W W^T (3, 3) with row s scaled by beta_s, its strictly "
        "lower triangle, the identity and D_beta = diag(beta); A (3, 3) comes out lower triangular.",
        "Build G = D_beta W W^T (row s scaled by beta_s), keep its strictly lower part, add I, invert (or solve) "
        "and multiply by D_beta on the right: A = (I + strictLower(D_beta W W^T))^{-1} D_beta."),
    4: ("It is causal softmax attention in which query i reads key j through the transitions between them "
        "(exercise 2's product). Can you build those products for one query without starting afresh for every key?",
        "For each query i: i + 1 logits, one per key j <= i, each D**-0.5 * k_j^T P q_i with P = H_{j+1} ... H_i "
        "(D, D); a softmax over them; the weights times v[: i + 1] give o_i (Dv,). The output is (T, Dv).",
        "For each i, walk j = i, i-1, ..., 0 keeping P = H_{j+1} ... H_i (start with I; after key j, "
        "P <- H_j P); logit = scale * k_j^T P q_i; then softmax over j <= i."),
    5: ("As in chapter 1's chunk exercise, split everything into what the state from before the chunk contributes "
        "and what the chunk's own tokens contribute. What is new: the chunk's transitions act on both.",
        "Two terms each. The outputs: what the old state S returns for each query after the chunk's transitions "
        "up to that token have acted on it, plus the in-chunk outputs (the Householder RNN of the chunk alone, "
        "from a zero state). The state: S carried through all C transitions, plus each v_j k_j^T with k_j carried "
        "through the transitions after j.",
        "With the chunk's UT factor A (path.ut_transform(w_c, beta_c)[1], allowed here) and T(x) = x.mT: "
        "qw = (q_c @ T(w_c)).tril(), wk = (w_c @ T(k_c)).tril(-1); q~ = q_c - qw @ A @ w_c; "
        "k~ = k_c - T(A @ wk) @ w_c; scores = (q_c @ T(k_c) - qw @ A @ wk).tril(); o_c = q~ @ T(S) + scores @ v_c; "
        "S_new = S - (S @ T(w_c)) @ T(A) @ w_c + T(v_c) @ k~. (Slower, also right: build the products "
        "H_s ... H_i with explicit loops.)"),
    6: ("H w = ? for the unit vector w itself, and H u = ? for any u orthogonal to w.",
        "One eigenvector is w, with eigenvalue 1 - beta; the D - 1 directions orthogonal to w keep eigenvalue 1.",
        "(smallest, largest) = (1 - beta, 1) for beta > 0; put in beta = 1.5."),
    7: ("Exercise 6 gave H's eigenvalues. What does a product of many transitions do to a vector when one of "
        "them has |1 - beta| > 1?",
        "Say what H is at beta = 0, 1 and 2, and what happens to the state (and to PaTH's products) when "
        "beta > 2: the size of the eigenvalue along w, repeated over many tokens.",
        "Eigenvalue 1 - beta along w: in [-1, 1] for beta in [0, 2], so no transition expands (beta = 1 "
        "projects, beta = 2 reflects, a norm-preserving swap); beta > 2 expands along w, and products of many "
        "transitions grow geometrically until they overflow (NaN)."),
    8: ("Run the planted form and path.deltanet_recurrent on one token with beta = 0.5: compare S_0 k_0 with v_0.",
        "One step is S <- S (I - beta k k^T) + beta v k^T: the step size multiplies both the erase and the write.",
        "The planted form writes v k^T without beta (bug kind \"scale\"): multiply the write by beta_t."),

})
hint = EXERCISES.hint


def _householder(w_s, beta_s):
    eye = torch.eye(w_s.shape[-1], dtype=w_s.dtype)
    return eye - beta_s[..., None, None] * w_s[..., :, None] * w_s[..., None, :]


# ---------------------------------------------------------------------------
# Exercise 1: one delta-rule step
# ---------------------------------------------------------------------------

def _delta_inputs(seed):
    g = seeded(500 + seed)
    lead, D, Dv = [((3,), 5, 4), ((2, 2), 6, 3), ((), 4, 7)][seed % 3]
    S = randn64(g, *lead, Dv, D)
    k = unit(randn64(g, *lead, D))
    v = randn64(g, *lead, Dv)
    beta = 2 * rand64(g, *lead)
    return S, k, v, beta


def _delta_reference(S, k, v, beta):
    """Through the library: one token of :func:`pathedu.path.deltanet_recurrent` from state S."""
    _, S_new = path.deltanet_recurrent(k[..., None, :], k[..., None, :], v[..., None, :], beta[..., None],
                                       initial_state=S, return_state=True)
    return S_new


def _error(S, k, v):
    """The memory's prediction error ``S k - v``."""
    return (S @ k[..., :, None])[..., 0] - v


_DELTA_WRONG = [
    (lambda S, k, v, beta: S + beta[..., None, None] * outer(v, k),
     "Your update adds beta v k^T only: that is linear attention. The delta rule first subtracts "
     "what the memory already returns for k: use the error (S k - v)."),
    (lambda S, k, v, beta: S + beta[..., None, None] * outer(_error(S, k, v), k),
     "Your step goes uphill: the gradient of |S k - v|^2 / 2 is (S k - v) k^T, and descent subtracts it."),
    (lambda S, k, v, beta: S - outer(_error(S, k, v), k),
     "Your step ignores beta (it takes beta = 1): scale the correction by beta."),
]


@EXERCISES.check(1)
def check_delta_step(delta_step) -> Verdict:
    """Exercise 1: ``delta_step(S, k, v, beta) -> S_new``, one step of the delta rule.

    ``S: (..., Dv, D)`` (the memory: it should map keys to values, ``S k ~ v``),
    ``k: (..., D)`` (unit norm), ``v: (..., Dv)``, ``beta: (...)`` in [0, 2].
    ``S_new = S - beta (S k - v) k^T``: one gradient step, with step size beta, on
    the regression loss ``|S k - v|^2 / 2``; equivalently
    ``S (I - beta k k^T) + beta v k^T``.
    """
    return check_function("delta-rule step", delta_step, _delta_reference, _delta_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_DELTA_WRONG)


# ---------------------------------------------------------------------------
# Exercise 2: the product between key j and query i
# ---------------------------------------------------------------------------

def _interval_inputs(seed):
    g = seeded(600 + seed)
    L, D, j, i = [(7, 4, 1, 5), (6, 3, -1, 4), (9, 5, 2, 8)][seed % 3]
    w = unit(randn64(g, L, D))
    beta = 2 * rand64(g, L)
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


@EXERCISES.check(2)
def check_interval_product(interval_product) -> Verdict:
    """Exercise 2: ``interval_product(w, beta, j, i) -> H_{j+1} H_{j+2} ... H_i``.

    ``w: (L, D)`` (rows ``w_0 .. w_{L-1}``), ``beta: (L,)``, ints ``-1 <= j < i < L``;
    ``H_s = I - beta_s w_s w_s^T``.  Returns the ``(D, D)`` product with the
    smallest index on the left: the matrix in ``logit_ij = k_j^T (...) q_i``.
    """
    return check_function("interval product", interval_product, _interval_reference, _interval_inputs,
                          trials=3, rtol=1e-10, wrong_variants=_INTERVAL_WRONG)


# ---------------------------------------------------------------------------
# Exercise 3: the UT factor of three transitions
# ---------------------------------------------------------------------------

def _ut_inputs(seed):
    g = seeded(700 + seed)
    D = (4, 5, 3)[seed % 3]  # L = 3 <= D: W has full row rank, so A is unique
    w = unit(randn64(g, 3, D))
    beta = 0.2 + 1.6 * rand64(g, 3)
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


@EXERCISES.check(3)
def check_ut_factor(ut_factor) -> Verdict:
    """Exercise 3: ``ut_factor(w, beta) -> A`` for L = 3 transitions.

    ``w: (3, D)`` holds ``w_0, w_1, w_2`` as rows (``W``), ``beta: (3,)``.
    ``A: (3, 3)`` lower triangular with ``H_2 H_1 H_0 = I - W^T A W``:
    ``A = (I + strictLower(D_beta W W^T))^{-1} D_beta``, ``D_beta = diag(beta)``.
    """
    return check_function("UT factor (L = 3)", ut_factor, _ut_reference, _ut_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_UT_WRONG)


# ---------------------------------------------------------------------------
# Exercise 4: PaTH attention from the definition
# ---------------------------------------------------------------------------

def _path_inputs(seed):
    g = seeded(800 + seed)
    T, D, Dv = [(6, 4, 3), (9, 3, 5), (1, 4, 2)][seed % 3]
    q, k, v = 2 * randn64(g, T, D), 2 * randn64(g, T, D), randn64(g, T, Dv)
    w = unit(randn64(g, T, D))
    beta = 2 * rand64(g, T)
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


@EXERCISES.check(4)
def check_path_attention(path_attention) -> Verdict:
    """Exercise 4: ``path_attention(q, k, v, w, beta) -> o``, PaTH attention from its definition.

    ``q, k, w: (T, D)``, ``v: (T, Dv)``, ``beta: (T,)``;
    ``logit_ij = D**-0.5 * k_j^T H_{j+1} ... H_i q_i`` for ``j <= i`` (``-inf`` above
    the diagonal), ``o_i = sum_j softmax_j(logit_ij) v_j``: ``(T, Dv)``.
    """
    return check_function("PaTH attention", path_attention, _path_reference, _path_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_PATH_WRONG)


# ---------------------------------------------------------------------------
# Exercise 5: one chunk of the Householder RNN with the prefix state
# ---------------------------------------------------------------------------

def _hh_chunk_inputs(seed):
    """A chunk (q_c, k_c, v_c, w_c, beta_c) and the state S after a random prefix; D != Dv so a
    transposed state shows.  Trial 0 (the one the wrong variants are matched on) has C > 1."""
    g = seeded(900 + seed)
    lead, P, C, D, Dv = [((2,), 7, 5, 6, 4), ((3, 2), 4, 6, 4, 5), ((), 9, 1, 5, 3)][seed % 3]

    def tokens(n):
        q, k, v = randn64(g, *lead, n, D), randn64(g, *lead, n, D), randn64(g, *lead, n, Dv)
        w = unit(randn64(g, *lead, n, D))
        beta = 2 * rand64(g, *lead, n)
        return q, k, v, w, beta

    _, S = path.householder_recurrent(*tokens(P), return_state=True)
    return (*tokens(C), S)


def _hh_chunk_reference(q, k, v, w, beta, S):
    return path.householder_recurrent(q, k, v, w, beta, initial_state=S, return_state=True)


def _hh_chunk_factors(q, k, w, beta):
    """The chunk's pieces from explicit products (0-based inside the chunk, last token C-1):
    ``q~_i = H_0 ... H_i q_i``, ``scores_ij = k_j^T H_{j+1} ... H_i q_i`` (j <= i, else 0),
    ``k~_j^T = k_j^T H_{j+1} ... H_{C-1}`` and ``P = H_0 ... H_{C-1}``."""
    C, D = q.shape[-2:]
    Hs = [_householder(w[..., s, :], beta[..., s]) for s in range(C)]
    eye = torch.eye(D, dtype=q.dtype).expand(q.shape[:-2] + (D, D))
    q_tilde, k_tilde = torch.empty_like(q), torch.empty_like(k)
    scores = torch.zeros(q.shape[:-2] + (C, C), dtype=q.dtype)
    F = eye
    for i in range(C):
        F = F @ Hs[i]  # H_0 ... H_i
        q_tilde[..., i, :] = (F @ q[..., i, :, None])[..., 0]
        R = eye  # H_{j+1} ... H_i, from j = i down
        for j in range(i, -1, -1):
            scores[..., i, j] = torch.einsum("...d,...de,...e->...", k[..., j, :], R, q[..., i, :])
            R = Hs[j] @ R
    G = eye  # H_{j+1} ... H_{C-1}, from j = C-1 down
    for j in range(C - 1, -1, -1):
        k_tilde[..., j, :] = (k[..., j, None, :] @ G)[..., 0, :]
        G = Hs[j] @ G
    return q_tilde, scores, k_tilde, F


def _hh_chunk_with(q, k, v, w, beta, S, *, carry=True, tilde_k=True, tilde_q=True, read_old=True):
    """The chunk step, right by default; each flag set to False makes one known mistake."""
    q_tilde, scores, k_tilde, P = _hh_chunk_factors(q, k, w, beta)
    S_new = (S @ P if carry else S) + v.transpose(-1, -2) @ (k_tilde if tilde_k else k)
    S_read = S if read_old else S_new
    o = (q_tilde if tilde_q else q) @ S_read.transpose(-1, -2) + scores @ v
    return o, S_new


_HH_CHUNK_WRONG = switched_off(_hh_chunk_with, [
    ("carry",
     "Your S_new adds the chunk's writes to S as it is: the old state also goes through every transition of "
     "the chunk, S -> S H_s ... H_e, before the writes are added."),
    ("tilde_k",
     "Your S_new writes the raw keys k_j: a key written at position j is still transformed by the later "
     "transitions of the chunk, so write v_j (k_j^T H_{j+1} ... H_e)."),
    ("read_old",
     "Your inter-chunk term uses the state *after* the chunk, so the chunk's own tokens are counted twice "
     "(and the future leaks in); use S from before the chunk."),
    ("tilde_q",
     "Your inter-chunk term reads S with the raw queries: the old state reaches query i only through the "
     "transitions H_s ... H_i of the chunk up to i, so read it with H_s ... H_i q_i."),
])


@EXERCISES.check(5, allow=("pathedu.path.ut_transform",))
def check_householder_chunk_step(chunk_step) -> Verdict:
    """Exercise 5: ``chunk_step(q_c, k_c, v_c, w_c, beta_c, S) -> (o_c, S_new)``, one chunk of the Householder RNN.

    ``q_c, k_c, w_c: (..., C, D)`` (``w`` unit norm), ``v_c: (..., C, Dv)``,
    ``beta_c: (..., C)`` in [0, 2): one chunk of C tokens ``[s, e]``;
    ``S: (..., Dv, D)``: the state after every earlier token (the layout of
    :func:`pathedu.path.householder_recurrent`'s state).  With
    ``H_t = I - beta_t w_t w_t^T``, must return the chunk's outputs
    ``o_c: (..., C, Dv)``, ``o_i = S q~_i + sum_{j<=i} (k_j^T H_{j+1} ... H_i q_i) v_j``
    with ``q~_i = H_s ... H_i q_i``, and the state after the chunk ``(..., Dv, D)``,
    ``S_new = S H_s ... H_e + sum_j v_j k~_j^T`` with ``k~_j^T = k_j^T H_{j+1} ... H_e``:
    equal to running the recurrence ``S_t = S_{t-1} H_t + v_t k_t^T``,
    ``o_t = S_t q_t`` token by token from ``S``.
    """
    return check_parts("Householder RNN chunk with prefix state", chunk_step, _hh_chunk_reference,
                       _hh_chunk_inputs, ("o_c", "S_new"),
                       wrong_variants=_HH_CHUNK_WRONG)


# ---------------------------------------------------------------------------
# Exercise 6 (predict, then run): the eigenvalues of one transition
# ---------------------------------------------------------------------------

EIG_BETA, EIG_D = 1.5, 4


def _eigenvalues() -> tuple:
    w = unit(torch.ones(1, EIG_D, dtype=torch.float64))
    H = path.householder_product(w, torch.tensor([EIG_BETA], dtype=torch.float64))
    ev = torch.linalg.eigvalsh(H)
    return round(ev.min().item(), 12), round(ev.max().item(), 12)


@EXERCISES.prediction(6, "predict: the eigenvalues of H", _eigenvalues, atol=1e-6)
def check_eigenvalues(extremes) -> Verdict:
    """Exercise 6: ``(smallest, largest)`` eigenvalue of ``H = I - beta w w^T`` for a unit ``w`` in ``D =``
    :data:`EIG_D` dimensions and ``beta =`` :data:`EIG_BETA` (a pair of numbers, half the point each)."""


# ---------------------------------------------------------------------------
# Exercise 7 (explain): why beta stays in [0, 2]
# ---------------------------------------------------------------------------

BETA_RUBRIC = paragraph("""2 points. 1: H = I - beta w w^T has eigenvalue 1 - beta along the unit w and 1 elsewhere,
    so for beta in [0, 2] every eigenvalue lies in [-1, 1]: no transition expands (beta = 0 keeps, beta = 1 projects
    out w, beta = 2 reflects, a norm-preserving swap). 1: beyond 2, |1 - beta| > 1 expands along w, and products of
    many transitions (the state, PaTH's position encoding) grow geometrically until float32 overflows into inf and
    NaN; that is why the forms refuse beta |w|^2 > 2.""")


@EXERCISES.explanation(7, "explain: beta in [0, 2]", rubric=BETA_RUBRIC)
def check_why_beta_range(text) -> Verdict:
    """Exercise 7: why beta (with a unit w) stays in [0, 2]."""


# ---------------------------------------------------------------------------
# Exercise 8 (find the bug): DeltaNet with one planted error
# ---------------------------------------------------------------------------

def _deltanet_planted(q, k, v, beta):
    """The lab's planted form: the write v_t k_t^T is not multiplied by beta_t."""
    S = torch.zeros(*q.shape[:-2], v.shape[-1], q.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        k_t, b_t = k[..., t, :], beta[..., t, None, None]
        S = S - b_t * (S @ k_t[..., :, None]) * k_t[..., None, :] + v[..., t, :, None] * k_t[..., None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, -2)


def _deltanet_bug_inputs(seed):
    g = seeded(800 + seed)
    lead, T, D, Dv = [((2,), 8, 6, 4), ((2, 2), 5, 4, 7), ((), 11, 8, 3)][seed % 3]
    q, k = randn64(g, *lead, T, D), unit(randn64(g, *lead, T, D))
    beta = 2 * rand64(g, *lead, T)
    return q, k, randn64(g, *lead, T, Dv), beta


@EXERCISES.planted_bug(8, "find the bug: DeltaNet", bug="scale", reference=path.deltanet_recurrent,
                       make_inputs=_deltanet_bug_inputs, buggy=_deltanet_planted)
def check_deltanet_bug(bug, deltanet_fixed) -> Verdict:
    """Exercise 8: ``bug`` names the planted error of the lab's ``deltanet_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``deltanet_fixed(q, k, v, beta) -> (..., T, Dv)`` is DeltaNet's
    recurrence fixed, compared with :func:`pathedu.path.deltanet_recurrent`."""
