r"""Symbolic checks (sympy) of the identities behind PaTH attention and DeltaNet.

Everything is exact: vectors are matrices of real symbols (``w_{t,d}``, ``k_{t,d}``, ...),
``beta_t`` are symbols, and an identity "holds" when the expanded difference is
the zero polynomial.  Each public function runs in well under 10 s for the
default sizes and returns a sympy ``Matrix`` or a ``bool`` (deterministic, so
notebook outputs can be compared by nbval).

Conventions (as in :mod:`pathedu.path`): 0-based positions; ``H_s = I - beta_s w_s w_s^T``;
``W`` holds ``w_0 .. w_{C-1}`` as *rows* (C x D); ``D_beta = diag(beta)``;
``strictLower`` keeps entries below the diagonal, ``lower`` the diagonal too.  The letters are the book's:
``C`` is the number of tokens (a block's or a sequence's length) and ``L`` the UT factor, which
:func:`pathedu.path.ut_transform` and the kernels call ``A``.

* UT transform: ``H_{C-1} ... H_1 H_0 = I - W^T L W``, ``L = (I + strictLower(D_beta W W^T))^{-1} D_beta``;
  transposed, ``H_0 H_1 ... H_{C-1} = I - W^T L^T W``; its proof by induction (:func:`ut_induction_step`,
  :func:`ut_recurrence_is_forward_substitution`).
* Masked sub-interval: ``H_i ... H_{j+1} = I - sum_{s,t in (j,i]} w_s L_st w_t^T`` with the *global* ``L``.
* DeltaNet: the pseudo-values ``u_t`` with ``S_t = sum_{j<=t} u_j k_j^T`` are ``U = (I + B)^{-1} (beta * V)``,
  ``B = strictLower(diag(beta) K K^T)``, which is ``L V`` with ``L`` the UT factor of ``w = k``.
* Blockwise PaTH: ``k~_j^T P_{J+1} ... P_{I-1} q~_i = k_j^T H_{j+1} ... H_i q_i``.
"""
from __future__ import annotations

import sympy as sp

__all__ = [
    "vectors", "betas", "householder", "product", "lower", "strict_lower",
    "ut_factor", "ut_form", "ut_residual", "ut_identity", "ut_induction_step", "ut_recurrence_is_forward_substitution",
    "gram_ut_factor",
    "interval_from_factor", "masked_interval_identity",
    "deltanet_pseudo_values", "deltanet_identity", "blockwise_identity",
]

VARIANTS = ("correct", "transposed", "wrong_order", "paper")


def _is_zero(M) -> bool:
    return all(sp.expand(x) == 0 for x in M)


def vectors(C: int, D: int, name: str = "w") -> sp.Matrix:
    """A ``C x D`` matrix of real symbols ``name_{t,d}``: row ``t`` is the vector of token ``t``."""
    return sp.Matrix(C, D, lambda t, d: sp.Symbol(f"{name}_{{{t},{d}}}", real=True))


def betas(C: int) -> list:
    """Real symbols ``beta_0 .. beta_{C-1}``."""
    return [sp.Symbol(f"beta_{t}", real=True) for t in range(C)]


def householder(w_row, beta) -> sp.Matrix:
    """``H = I - beta w w^T`` for one row ``w_row`` (1 x D)."""
    w = sp.Matrix(w_row).reshape(len(w_row), 1)
    return sp.eye(w.rows) - beta * w * w.T


def product(W, beta, *, order: str = "decreasing", start: int = 0, stop: int | None = None) -> sp.Matrix:
    """The direct product of ``H_start .. H_{stop-1}``, expanded.

    ``order="decreasing"``: ``H_{stop-1} ... H_start`` (largest index on the left);
    ``order="increasing"``: ``H_start ... H_{stop-1}``.  An empty range gives ``I``.
    """
    stop = W.rows if stop is None else stop
    P = sp.eye(W.cols)
    for s in range(start, stop):
        H = householder(W.row(s), beta[s])
        P = H * P if order == "decreasing" else P * H
    return P.applyfunc(sp.expand)


def lower(M) -> sp.Matrix:
    """Entries on and below the diagonal."""
    return sp.Matrix(M.rows, M.cols, lambda a, b: M[a, b] if b <= a else 0)


def strict_lower(M) -> sp.Matrix:
    """Entries strictly below the diagonal."""
    return sp.Matrix(M.rows, M.cols, lambda a, b: M[a, b] if b < a else 0)


def _unit_lower_inverse(N) -> sp.Matrix:
    """Inverse of a unit lower-triangular matrix by forward substitution (exact polynomials, no division)."""
    n = N.rows
    X = sp.zeros(n, n)
    for s in range(n):
        for c in range(n):
            X[s, c] = sp.expand((1 if s == c else 0) - sum(N[s, t] * X[t, c] for t in range(s)))
    return X


def ut_factor(W, beta, *, typing: str = "correct") -> sp.Matrix:
    """The UT factor ``L = (I + strictLower(D_beta W W^T))^{-1} D_beta`` (C x C, lower triangular).

    ``typing="paper"`` uses ``W D_beta W^T`` as printed in the PaTH paper: with
    ``W`` of shape C x D this only type-checks when D = C (sympy raises
    ``ShapeError`` otherwise), and even then the identity fails.
    """
    Db = sp.diag(*beta[: W.rows])
    inner = Db * W * W.T if typing == "correct" else W * Db * W.T
    return (_unit_lower_inverse(sp.eye(W.rows) + strict_lower(inner)) * Db).applyfunc(sp.expand)


def ut_form(W, L, *, transpose: bool = False) -> sp.Matrix:
    """``I - W^T L W`` (``transpose=False``) or ``I - W^T L^T W``, expanded."""
    return (sp.eye(W.cols) - W.T * (L.T if transpose else L) * W).applyfunc(sp.expand)


def ut_residual(C: int = 3, D: int = 2, *, variant: str = "correct") -> sp.Matrix:
    """Direct product minus its UT form, expanded (the zero matrix when the identity holds).

    ``variant``:

    * ``"correct"``: ``H_{C-1} ... H_0 - (I - W^T L W)``;
    * ``"transposed"``: ``H_0 ... H_{C-1} - (I - W^T L^T W)``;
    * ``"wrong_order"``: ``H_0 ... H_{C-1} - (I - W^T L W)`` (not zero);
    * ``"paper"``: ``H_{C-1} ... H_0 - (I - W^T L' W)`` with ``L'`` built from
      ``W D_beta W^T`` (raises ``sympy.ShapeError`` unless D = C; not zero when D = C).
    """
    if variant not in VARIANTS:
        raise ValueError(f"`variant` must be one of {VARIANTS}, got {variant!r}")
    W, b = vectors(C, D), betas(C)
    L = ut_factor(W, b, typing="paper" if variant == "paper" else "correct")
    direct = product(W, b, order="decreasing" if variant in ("correct", "paper") else "increasing")
    return (direct - ut_form(W, L, transpose=variant == "transposed")).applyfunc(sp.expand)


def ut_identity(C: int = 3, D: int = 2, *, variant: str = "correct") -> bool:
    """Does the UT identity hold exactly for symbolic ``w`` (C vectors of D symbols) and ``beta``?

    True for ``"correct"`` and ``"transposed"``, False for ``"wrong_order"`` and
    ``"paper"`` (see :func:`ut_residual`).
    """
    return _is_zero(ut_residual(C, D, variant=variant))


def ut_induction_step(C: int = 2, D: int = 3, *, sign: int = -1) -> bool:
    """The induction step of the UT form, for a *generic* lower-triangular ``L`` (its entries are free symbols).

    If ``P = I - W^T L W`` (``W``: C rows), then one more transition gives the same form with one more row::

        H_C P = I - W'^T L' W',   W' = [W; w_C],   L' = [[L, 0], [-beta_C g_C^T L, beta_C]],   g_C = W w_C

    (``g_C`` holds the dot products ``g_{sC} = w_s . w_C``.)  The identity holds whatever ``L`` is, so it is
    the step of a proof by induction (the base case ``C = 0`` is ``P = I``, and ``C = 1`` is ``L = [beta_0]``).
    ``sign=+1`` appends ``+beta_C g_C^T L`` instead: a control that must fail.
    """
    W, b = vectors(C + 1, D), betas(C + 1)
    W_old, w_new = W[:C, :], W[C, :]
    L = sp.Matrix(C, C, lambda s, t: sp.Symbol(f"l_{{{s},{t}}}", real=True) if t <= s else 0)
    g = W_old * w_new.T  # (C x 1): w_s . w_C
    L_next = sp.zeros(C + 1, C + 1)
    L_next[:C, :C] = L
    L_next[C, :C] = sign * b[C] * g.T * L
    L_next[C, C] = b[C]
    lhs = householder(w_new, b[C]) * ut_form(W_old, L)
    return _is_zero(lhs - ut_form(W, L_next))


def ut_recurrence_is_forward_substitution(C: int = 3, D: int = 2) -> bool:
    """The row the induction step appends, ``[-beta_C g_C^T L, beta_C]``, is the last row of the closed form
    ``(I + strictLower(D_beta W W^T))^{-1} D_beta`` for ``C + 1`` tokens when ``L`` is the closed form for
    ``C``: the recurrence *is* forward substitution, one row per token.

    Why: the new row of ``N = I + strictLower(D_beta W W^T)`` is ``[beta_C g_C^T, 1]``, so the last row of
    ``N^{-1}`` is ``[-beta_C g_C^T X, 1]`` with ``X`` the inverse for ``C`` tokens, and multiplying by
    ``D_beta`` on the right turns ``X`` into ``X D_beta = L`` and the 1 into ``beta_C``."""
    W, b = vectors(C + 1, D), betas(C + 1)
    L = ut_factor(W[:C, :], b)
    g = W[:C, :] * W[C, :].T
    row = (-b[C] * g.T * L).row_join(sp.Matrix([[b[C]]]))
    return _is_zero(row - ut_factor(W, b).row(C))


def gram_ut_factor(C: int = 3) -> sp.Matrix:
    """The UT factor written with Gram symbols ``g_{st} = w_s . w_t`` (for display).

    ``L = (I + strictLower(D_beta G))^{-1} D_beta`` with ``G`` the symmetric Gram matrix ``W W^T``
    (entries ``g_{st}``): entry ``L_st`` depends only on the betas and the inner products between
    tokens t..s.
    """
    g = lambda s, t: sp.Symbol(f"g_{{{min(s, t)}{max(s, t)}}}", real=True)  # noqa: E731
    G = sp.Matrix(C, C, g)
    b = betas(C)
    Db = sp.diag(*b)
    return (_unit_lower_inverse(sp.eye(C) + strict_lower(Db * G)) * Db).applyfunc(sp.factor)


def interval_from_factor(W, L, j: int, i: int) -> sp.Matrix:
    """``I - sum_{s,t in (j,i]} w_s L_st w_t^T``: the masked UT form of ``H_i ... H_{j+1}`` (global ``L``)."""
    span = range(j + 1, i + 1)
    M = sp.eye(W.cols)
    for s in span:
        for t in span:
            M -= L[s, t] * W.row(s).T * W.row(t)
    return M.applyfunc(sp.expand)


def masked_interval_identity(C: int = 3, D: int = 2) -> bool:
    """For every ``-1 <= j < i <= C-1``: ``H_i ... H_{j+1} = I - sum_{s,t in (j,i]} w_s L_st w_t^T``,
    with ``L`` the UT factor of the whole sequence (not of the interval)."""
    W, b = vectors(C, D), betas(C)
    L = ut_factor(W, b)
    return all(
        _is_zero(product(W, b, order="decreasing", start=j + 1, stop=i + 1) - interval_from_factor(W, L, j, i))
        for i in range(C) for j in range(-1, i)
    )


def deltanet_pseudo_values(C: int = 3, D: int = 2, Dv: int = 1) -> sp.Matrix:
    """``U = (I + B)^{-1} (beta * V)`` with ``B = strictLower(diag(beta) K K^T)``, symbolic ``K`` (C x D),
    ``V`` (C x Dv)."""
    K, V, b = vectors(C, D, "k"), vectors(C, Dv, "v"), betas(C)
    Db = sp.diag(*b)
    return (_unit_lower_inverse(sp.eye(C) + strict_lower(Db * K * K.T)) * Db * V).applyfunc(sp.expand)


def deltanet_identity(C: int = 3, D: int = 2, Dv: int = 1) -> bool:
    """Unroll ``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` (``S_{-1} = 0``) and check, exactly:

    1. each step writes a rank-one ``S_t - S_{t-1} = u_t k_t^T`` with ``u_t`` the rows of
       ``U = (I + B)^{-1} (beta * V)`` (so ``S_t = sum_{j<=t} u_j k_j^T``);
    2. ``U = L V`` with ``L`` the UT factor of the transitions (``w = k``).
    """
    K, V, b = vectors(C, D, "k"), vectors(C, Dv, "v"), betas(C)
    U = deltanet_pseudo_values(C, D, Dv)
    S = sp.zeros(Dv, D)
    for t in range(C):
        k_t, v_t = K.row(t).T, V.row(t).T
        S_new = (S * householder(K.row(t), b[t]) + b[t] * v_t * k_t.T).applyfunc(sp.expand)
        if not _is_zero(S_new - S - U.row(t).T * k_t.T):
            return False
        S = S_new
    return _is_zero(U - ut_factor(K, b) * V)


def blockwise_identity(T: int = 5, D: int = 2, block: int = 2, *, transpose_update: bool = False) -> bool:
    """The blockwise PaTH logits equal the direct ones, for every key ``j`` in a block before query ``i``'s.

    ``T`` tokens in blocks of ``block``.  Per block ``[a, e]`` (the block's own UT factor ``L_J``):
    ``q~_i = H_a ... H_i q_i`` and ``k~_j = H_e ... H_{j+1} k_j`` from the masked UT form,
    ``P_J = H_a ... H_e = I - W_J^T L_J^T W_J``.  Query ``i`` scans key blocks
    right to left with ``q^ = q~_i``, then ``q^ <- P_J q^`` after block ``J`` (except the
    last, block 0), and ``k~_j^T q^`` must equal ``k_j^T H_{j+1} ... H_i q_i``.

    ``transpose_update=True`` carries ``q^ <- P_J^T q^`` instead (the blocks'
    products in the other order): False as soon as a middle block has two tokens.
    """
    W, Q, K, b = vectors(T, D), vectors(T, D, "q"), vectors(T, D, "k"), betas(T)
    spans = [(a, min(a + block, T)) for a in range(0, T, block)]
    fac = []
    for a, e in spans:
        Wb = W[a:e, :]
        L = ut_factor(Wb, b[a:e])
        P = ut_form(Wb, L, transpose=not transpose_update)  # H_a ... H_e (or H_e ... H_a)
        q_t = [(interval_from_factor(Wb, L, -1, i - a).T * Q.row(i).T).applyfunc(sp.expand) for i in range(a, e)]
        k_t = [(interval_from_factor(Wb, L, j - a, e - 1 - a) * K.row(j).T).applyfunc(sp.expand)
               for j in range(a, e)]
        fac.append((P, q_t, k_t))
    for I, (a_I, e_I) in enumerate(spans):
        for i in range(a_I, e_I):
            q_hat = fac[I][1][i - a_I]
            for J in range(I - 1, -1, -1):
                a_J, e_J = spans[J]
                for j in range(a_J, e_J):
                    direct = K.row(j) * product(W, b, order="increasing", start=j + 1, stop=i + 1) * Q.row(i).T
                    if sp.expand((fac[J][2][j - a_J].T * q_hat)[0, 0] - direct[0, 0]) != 0:
                        return False
                if J > 0:  # block 0 is the last one scanned: no carry after it
                    q_hat = (fac[J][0] * q_hat).applyfunc(sp.expand)
    return True
