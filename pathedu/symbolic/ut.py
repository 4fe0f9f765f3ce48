r"""Symbolic checks (sympy) of the identities behind PaTH attention and DeltaNet.

Everything is exact: vectors are matrices of real symbols (``w_{t,d}``, ``k_{t,d}``, ...),
``beta_t`` are symbols, and an identity "holds" when the expanded difference is
the zero polynomial.  Each public function runs in well under 10 s for the
default sizes and returns a sympy ``Matrix`` or a ``bool`` (deterministic, so
notebook outputs can be compared by nbval).

Conventions (as in :mod:`pathedu.path`): 0-based positions; ``H_s = I - beta_s w_s w_s^T``;
``W`` holds ``w_0 .. w_{L-1}`` as *rows* (L x D); ``D_beta = diag(beta)``;
``strictLower`` keeps entries below the diagonal, ``lower`` the diagonal too.

* UT transform: ``H_{L-1} ... H_1 H_0 = I - W^T A W``, ``A = (I + strictLower(D_beta W W^T))^{-1} D_beta``;
  transposed, ``H_0 H_1 ... H_{L-1} = I - W^T A^T W``; its proof by induction (:func:`ut_induction_step`,
  :func:`ut_recurrence_is_forward_substitution`).
* Masked sub-interval: ``H_i ... H_{j+1} = I - sum_{s,t in (j,i]} w_s A_st w_t^T`` with the *global* ``A``.
* DeltaNet: the pseudo-values ``u_t`` with ``S_t = sum_{j<=t} u_j k_j^T`` are ``U = (I + B)^{-1} (beta * V)``,
  ``B = diag(beta)(K K^T * M^-)``, which is ``A V`` with ``A`` the UT factor of ``w = k``.
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


def vectors(L: int, D: int, name: str = "w") -> sp.Matrix:
    """An ``L x D`` matrix of real symbols ``name_{t,d}``: row ``t`` is the vector of token ``t``."""
    return sp.Matrix(L, D, lambda t, d: sp.Symbol(f"{name}_{{{t},{d}}}", real=True))


def betas(L: int) -> list:
    """Real symbols ``beta_0 .. beta_{L-1}``."""
    return [sp.Symbol(f"beta_{t}", real=True) for t in range(L)]


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
    L = N.rows
    X = sp.zeros(L, L)
    for s in range(L):
        for c in range(L):
            X[s, c] = sp.expand((1 if s == c else 0) - sum(N[s, t] * X[t, c] for t in range(s)))
    return X


def ut_factor(W, beta, *, typing: str = "correct") -> sp.Matrix:
    """The UT factor ``A = (I + strictLower(D_beta W W^T))^{-1} D_beta`` (L x L, lower triangular).

    ``typing="paper"`` uses ``W D_beta W^T`` as printed in the PaTH paper: with
    ``W`` of shape L x D this only type-checks when D = L (sympy raises
    ``ShapeError`` otherwise), and even then the identity fails.
    """
    Db = sp.diag(*beta[: W.rows])
    inner = Db * W * W.T if typing == "correct" else W * Db * W.T
    return (_unit_lower_inverse(sp.eye(W.rows) + strict_lower(inner)) * Db).applyfunc(sp.expand)


def ut_form(W, A, *, transpose: bool = False) -> sp.Matrix:
    """``I - W^T A W`` (``transpose=False``) or ``I - W^T A^T W``, expanded."""
    return (sp.eye(W.cols) - W.T * (A.T if transpose else A) * W).applyfunc(sp.expand)


def ut_residual(L: int = 3, D: int = 2, *, variant: str = "correct") -> sp.Matrix:
    """Direct product minus its UT form, expanded (the zero matrix when the identity holds).

    ``variant``:

    * ``"correct"``: ``H_{L-1} ... H_0 - (I - W^T A W)``;
    * ``"transposed"``: ``H_0 ... H_{L-1} - (I - W^T A^T W)``;
    * ``"wrong_order"``: ``H_0 ... H_{L-1} - (I - W^T A W)`` (not zero);
    * ``"paper"``: ``H_{L-1} ... H_0 - (I - W^T A' W)`` with ``A'`` built from
      ``W D_beta W^T`` (raises ``sympy.ShapeError`` unless D = L; not zero when D = L).
    """
    if variant not in VARIANTS:
        raise ValueError(f"`variant` must be one of {VARIANTS}, got {variant!r}")
    W, b = vectors(L, D), betas(L)
    A = ut_factor(W, b, typing="paper" if variant == "paper" else "correct")
    direct = product(W, b, order="decreasing" if variant in ("correct", "paper") else "increasing")
    return (direct - ut_form(W, A, transpose=variant == "transposed")).applyfunc(sp.expand)


def ut_identity(L: int = 3, D: int = 2, *, variant: str = "correct") -> bool:
    """Does the UT identity hold exactly for symbolic ``w`` (L vectors of D symbols) and ``beta``?

    True for ``"correct"`` and ``"transposed"``, False for ``"wrong_order"`` and
    ``"paper"`` (see :func:`ut_residual`).
    """
    return _is_zero(ut_residual(L, D, variant=variant))


def ut_induction_step(L: int = 2, D: int = 3, *, sign: int = -1) -> bool:
    """The induction step of the UT form, for a *generic* lower-triangular ``A`` (its entries are free symbols).

    If ``P = I - W^T A W`` (``W``: L rows), then one more transition gives the same form with one more row::

        H_L P = I - W'^T A' W',   W' = [W; w_L],   A' = [[A, 0], [-beta_L g^T A, beta_L]],   g = W w_L

    The identity holds whatever ``A`` is, so it is the step of a proof by induction (the base case ``L = 0``
    is ``P = I``, and ``L = 1`` is ``A = [beta_0]``).  ``sign=+1`` appends ``+beta_L g^T A`` instead: a
    control that must fail.
    """
    W, b = vectors(L + 1, D), betas(L + 1)
    Wl, w_new = W[:L, :], W[L, :]
    A = sp.Matrix(L, L, lambda s, t: sp.Symbol(f"a_{{{s},{t}}}", real=True) if t <= s else 0)
    g = Wl * w_new.T  # (L x 1): w_s . w_L
    A_next = sp.zeros(L + 1, L + 1)
    A_next[:L, :L] = A
    A_next[L, :L] = sign * b[L] * g.T * A
    A_next[L, L] = b[L]
    lhs = householder(w_new, b[L]) * ut_form(Wl, A)
    return _is_zero(lhs - ut_form(W, A_next))


def ut_recurrence_is_forward_substitution(L: int = 3, D: int = 2) -> bool:
    """The row the induction step appends, ``[-beta_L g^T A, beta_L]``, is the last row of the closed form
    ``(I + strictLower(D_beta W W^T))^{-1} D_beta`` for ``L + 1`` tokens when ``A`` is the closed form for
    ``L``: the recurrence *is* forward substitution, one row per token."""
    W, b = vectors(L + 1, D), betas(L + 1)
    A = ut_factor(W[:L, :], b)
    g = W[:L, :] * W[L, :].T
    row = (-b[L] * g.T * A).row_join(sp.Matrix([[b[L]]]))
    return _is_zero(row - ut_factor(W, b).row(L))


def gram_ut_factor(L: int = 3) -> sp.Matrix:
    """The UT factor written with Gram symbols ``g_{st} = w_s . w_t`` (for display).

    ``A = (I + strictLower(D_beta G))^{-1} D_beta`` with ``G`` symmetric: entry
    ``A_st`` depends only on the betas and inner products between tokens t..s.
    """
    g = lambda s, t: sp.Symbol(f"g_{{{min(s, t)}{max(s, t)}}}", real=True)  # noqa: E731
    G = sp.Matrix(L, L, g)
    b = betas(L)
    Db = sp.diag(*b)
    return (_unit_lower_inverse(sp.eye(L) + strict_lower(Db * G)) * Db).applyfunc(sp.factor)


def interval_from_factor(W, A, j: int, i: int) -> sp.Matrix:
    """``I - sum_{s,t in (j,i]} w_s A_st w_t^T``: the masked UT form of ``H_i ... H_{j+1}`` (global ``A``)."""
    span = range(j + 1, i + 1)
    M = sp.eye(W.cols)
    for s in span:
        for t in span:
            M -= A[s, t] * W.row(s).T * W.row(t)
    return M.applyfunc(sp.expand)


def masked_interval_identity(L: int = 3, D: int = 2) -> bool:
    """For every ``-1 <= j < i <= L-1``: ``H_i ... H_{j+1} = I - sum_{s,t in (j,i]} w_s A_st w_t^T``,
    with ``A`` the UT factor of the whole sequence (not of the interval)."""
    W, b = vectors(L, D), betas(L)
    A = ut_factor(W, b)
    return all(
        _is_zero(product(W, b, order="decreasing", start=j + 1, stop=i + 1) - interval_from_factor(W, A, j, i))
        for i in range(L) for j in range(-1, i)
    )


def deltanet_pseudo_values(L: int = 3, D: int = 2, Dv: int = 1) -> sp.Matrix:
    """``U = (I + B)^{-1} (beta * V)`` with ``B = diag(beta)(K K^T * M^-)``, symbolic ``K`` (L x D), ``V`` (L x Dv)."""
    K, V, b = vectors(L, D, "k"), vectors(L, Dv, "v"), betas(L)
    Db = sp.diag(*b)
    return (_unit_lower_inverse(sp.eye(L) + strict_lower(Db * K * K.T)) * Db * V).applyfunc(sp.expand)


def deltanet_identity(L: int = 3, D: int = 2, Dv: int = 1) -> bool:
    """Unroll ``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` (``S_{-1} = 0``) and check, exactly:

    1. each step writes a rank-one ``S_t - S_{t-1} = u_t k_t^T`` with ``u_t`` the rows of
       ``U = (I + B)^{-1} (beta * V)`` (so ``S_t = sum_{j<=t} u_j k_j^T``);
    2. ``U = A V`` with ``A`` the UT factor of the transitions (``w = k``).
    """
    K, V, b = vectors(L, D, "k"), vectors(L, Dv, "v"), betas(L)
    U = deltanet_pseudo_values(L, D, Dv)
    S = sp.zeros(Dv, D)
    for t in range(L):
        k_t, v_t = K.row(t).T, V.row(t).T
        S_new = (S * householder(K.row(t), b[t]) + b[t] * v_t * k_t.T).applyfunc(sp.expand)
        if not _is_zero(S_new - S - U.row(t).T * k_t.T):
            return False
        S = S_new
    return _is_zero(U - ut_factor(K, b) * V)


def blockwise_identity(L: int = 5, D: int = 2, block: int = 2, *, transpose_update: bool = False) -> bool:
    """The blockwise PaTH logits equal the direct ones, for every key ``j`` in a block before query ``i``'s.

    Per block ``[s, e]`` (the block's own UT factor ``A_J``): ``q~_i = H_s ... H_i q_i``
    and ``k~_j = H_e ... H_{j+1} k_j`` from the masked UT form,
    ``P_J = H_s ... H_e = I - W_J^T A_J^T W_J``.  Query ``i`` scans key blocks
    right to left with ``q^ = q~_i``, then ``q^ <- P_J q^`` after block ``J``, and
    ``k~_j^T q^`` must equal ``k_j^T H_{j+1} ... H_i q_i``.

    ``transpose_update=True`` carries ``q^ <- P_J^T q^`` instead (the blocks'
    products in the other order): False as soon as a middle block has two tokens.
    """
    W, Q, K, b = vectors(L, D), vectors(L, D, "q"), vectors(L, D, "k"), betas(L)
    spans = [(s, min(s + block, L)) for s in range(0, L, block)]
    fac = []
    for s, e in spans:
        Wb = W[s:e, :]
        A = ut_factor(Wb, b[s:e])
        P = ut_form(Wb, A, transpose=not transpose_update)  # H_s ... H_e (or H_e ... H_s)
        q_t = [(interval_from_factor(Wb, A, -1, i - s).T * Q.row(i).T).applyfunc(sp.expand) for i in range(s, e)]
        k_t = [(interval_from_factor(Wb, A, j - s, e - 1 - s) * K.row(j).T).applyfunc(sp.expand) for j in range(s, e)]
        fac.append((P, q_t, k_t))
    for I, (s_I, e_I) in enumerate(spans):
        for i in range(s_I, e_I):
            q_hat = fac[I][1][i - s_I]
            for J in range(I - 1, -1, -1):
                s_J, e_J = spans[J]
                for j in range(s_J, e_J):
                    direct = K.row(j) * product(W, b, order="increasing", start=j + 1, stop=i + 1) * Q.row(i).T
                    if sp.expand((fac[J][2][j - s_J].T * q_hat)[0, 0] - direct[0, 0]) != 0:
                        return False
                q_hat = (fac[J][0] * q_hat).applyfunc(sp.expand)
    return True
