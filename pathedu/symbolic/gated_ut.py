r"""Symbolic checks (sympy) of the identities behind PaTH-FoX, the gated Householder RNN and Gated DeltaNet.

As in :mod:`pathedu.symbolic.ut`, everything is exact: vectors are matrices of
real symbols (``w_{t,d}``, ``k_{t,d}``, ...), ``beta_t`` are real symbols, and
the gates are positive symbols ``a_t`` (``a_t = exp(log_f[t])``, so a product
of gates ``a_{j+1} ... a_i`` is ``exp`` of a sum of log gates).  An identity
"holds" when the expanded difference is the zero polynomial.  Each public
function runs in well under a few seconds for the default sizes and returns a
sympy ``Matrix`` or a ``bool`` (deterministic, so notebook outputs can be
compared by nbval).

Conventions (as in :mod:`pathedu.pathfox`): 0-based positions;
``H_s = I - beta_s w_s w_s^T``; ``W`` holds ``w_0 .. w_{L-1}`` as rows;
``D_beta = diag(beta)``; ``A = (I + strictLower(D_beta W W^T))^{-1} D_beta``
is the UT factor of :func:`pathedu.symbolic.ut.ut_factor`;
``Gamma_ij = a_{j+1} ... a_i`` (1 for ``j = i``, 0 for ``j > i``).

* Gated UT transform: the scalar gates commute with everything, so in the
  recurrence's order (smallest index on the left)
  ``(a_0 H_0)(a_1 H_1) ... (a_{L-1} H_{L-1}) = (a_0 a_1 ... a_{L-1}) (I - W^T A^T W)``,
  and in the other order ``... = (prod a) (I - W^T A W)``: the UT factor needs no decay.
* Gated chunk: unrolling ``S_t = a_t S_{t-1} H_t + v_t k_t^T`` over one chunk from a
  state ``S`` gives ``S_e = Gamma_{e,-1} S P + sum_j Gamma_ej v_j k~_j^T`` and
  ``o_i = Gamma_{i,-1} S q~_i + sum_{j<=i} Gamma_ij (k_j^T H_{j+1} ... H_i q_i) v_j``
  (``Gamma_{i,-1} = a_0 ... a_i``; ``q~``, ``k~``, ``P`` from the chunk's UT factor):
  the decayed per-token pieces of :func:`pathedu.pathfox.gated_householder_chunked`.
* Gated DeltaNet: unrolling ``S_t = a_t S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``
  gives ``S_t = sum_{j<=t} Gamma_tj u_j k_j^T`` with
  ``U = (I + D_beta (K K^T * Gamma * M^-))^{-1} D_beta V``; from a state ``S``, the
  chunk's pseudo-values are ``U = (I + D_beta (K K^T * Gamma * M^-))^{-1} D_beta (V - diag(Gamma_{.,-1}) K S^T)``.
  Without the delta term (``S_t = a_t S_{t-1} + beta_t v_t k_t^T``) it fails.
* Gated DeltaNet as online regression: ``S_t = S' - beta_t grad_S (1/2)|S k_t - v_t|^2``
  at ``S = S' = a_t S_{t-1}``.
"""
from __future__ import annotations

import sympy as sp

from .ut import _is_zero, _unit_lower_inverse, betas, householder, interval_from_factor, strict_lower, ut_factor, \
    ut_form, vectors

__all__ = [
    "gates", "gate_product", "gamma_matrix", "gated_product",
    "gated_ut_residual", "gated_ut_identity", "gated_chunk_residual", "gated_chunk_identity",
    "gated_deltanet_pseudo_values", "gated_deltanet_residual", "gated_deltanet_identity",
    "gated_deltanet_chunk_identity", "gated_deltanet_gradient_step",
]

UT_VARIANTS = ("increasing", "decreasing", "wrong_order")
DELTANET_VARIANTS = ("gated", "no_delta")


def gates(L: int) -> list:
    """Positive symbols ``a_0 .. a_{L-1}`` (``a_t = exp(log_f[t])``)."""
    return [sp.Symbol(f"a_{t}", positive=True) for t in range(L)]


def gate_product(a, j: int, i: int):
    """``Gamma_ij = a_{j+1} ... a_i``: 1 for ``j = i`` (a token's own gate never acts on itself),
    0 for ``j > i`` (the future).  ``j = -1`` starts at ``a_0``."""
    if j > i:
        return sp.Integer(0)
    return sp.Mul(*a[j + 1 : i + 1])


def gamma_matrix(a) -> sp.Matrix:
    """``Gamma`` (L x L): ``Gamma_ij = a_{j+1} ... a_i`` on and below the diagonal, 0 above."""
    L = len(a)
    return sp.Matrix(L, L, lambda i, j: gate_product(a, j, i))


def gated_product(W, beta, a, *, order: str = "increasing") -> sp.Matrix:
    """The direct product of the gated transitions ``a_s H_s``, expanded.

    ``order="increasing"``: ``(a_0 H_0)(a_1 H_1) ... (a_{L-1} H_{L-1})`` (the order in which
    ``S_t = a_t S_{t-1} H_t`` multiplies its state); ``"decreasing"``: the reverse.
    """
    P = sp.eye(W.cols)
    for s in range(W.rows):
        G = a[s] * householder(W.row(s), beta[s])
        P = P * G if order == "increasing" else G * P
    return P.applyfunc(sp.expand)


def gated_ut_residual(L: int = 3, D: int = 2, *, variant: str = "increasing") -> sp.Matrix:
    """Direct product of gated transitions minus its compact form, expanded (zero when the identity holds).

    ``variant``:

    * ``"increasing"``: ``(a_0 H_0) ... (a_{L-1} H_{L-1}) - (prod a)(I - W^T A^T W)``;
    * ``"decreasing"``: ``(a_{L-1} H_{L-1}) ... (a_0 H_0) - (prod a)(I - W^T A W)``;
    * ``"wrong_order"``: ``(a_0 H_0) ... (a_{L-1} H_{L-1}) - (prod a)(I - W^T A W)`` (not zero).
    """
    if variant not in UT_VARIANTS:
        raise ValueError(f"`variant` must be one of {UT_VARIANTS}, got {variant!r}")
    W, b, a = vectors(L, D), betas(L), gates(L)
    A = ut_factor(W, b)
    direct = gated_product(W, b, a, order="decreasing" if variant == "decreasing" else "increasing")
    compact = sp.Mul(*a) * ut_form(W, A, transpose=variant == "increasing")
    return (direct - compact).applyfunc(sp.expand)


def gated_ut_identity(L: int = 3, D: int = 2, *, variant: str = "increasing") -> bool:
    """Does the gated UT identity hold exactly (see :func:`gated_ut_residual`)?  True for
    ``"increasing"`` and ``"decreasing"``, False for ``"wrong_order"``."""
    return _is_zero(gated_ut_residual(L, D, variant=variant))


def gated_chunk_residual(L: int = 3, D: int = 2, Dv: int = 1) -> sp.Matrix:
    """The unrolled gated Householder RNN over one chunk of ``L`` tokens from a symbolic state
    ``S`` (Dv x D), minus the chunked form's pieces; returns the stacked differences
    ``[o_0 | ... | o_{L-1} | S_{L-1}]`` (Dv x (L + D)), expanded.

    The chunked form (:func:`pathedu.pathfox.gated_householder_chunked`), with
    ``A`` the chunk's UT factor and ``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` from it::

        o_i = (a_0 ... a_i) S q~_i + sum_{j<=i} Gamma_ij Ã_ij v_j,     q~_i = H_0 ... H_i q_i
        S_e = (a_0 ... a_e) S (I - W^T A^T W) + sum_j Gamma_ej v_j k~_j^T,   k~_j = H_e ... H_{j+1} k_j
    """
    W, b, a = vectors(L, D), betas(L), gates(L)
    Q, K, V, S0 = vectors(L, D, "q"), vectors(L, D, "k"), vectors(L, Dv, "v"), vectors(Dv, D, "S")
    A = ut_factor(W, b)
    e = L - 1
    # direct: the recurrence, token by token
    S, direct = S0, []
    for t in range(L):
        S = (a[t] * S * householder(W.row(t), b[t]) + V.row(t).T * K.row(t)).applyfunc(sp.expand)
        direct.append(S * Q.row(t).T)
    direct.append(S)
    # chunked: interval_from_factor(W, A, j, i) = H_i ... H_{j+1}; its transpose is H_{j+1} ... H_i
    chunked = []
    for i in range(L):
        q_tilde = interval_from_factor(W, A, -1, i).T * Q.row(i).T
        o = gate_product(a, -1, i) * S0 * q_tilde
        for j in range(i + 1):
            score = (K.row(j) * interval_from_factor(W, A, j, i).T * Q.row(i).T)[0, 0]
            o += gate_product(a, j, i) * score * V.row(j).T
        chunked.append(o)
    S_e = gate_product(a, -1, e) * S0 * ut_form(W, A, transpose=True)
    for j in range(L):
        k_tilde = interval_from_factor(W, A, j, e) * K.row(j).T
        S_e += gate_product(a, j, e) * V.row(j).T * k_tilde.T
    chunked.append(S_e)
    return (sp.Matrix.hstack(*direct) - sp.Matrix.hstack(*chunked)).applyfunc(sp.expand)


def gated_chunk_identity(L: int = 3, D: int = 2, Dv: int = 1) -> bool:
    """Do the chunked form's decayed pieces equal the unrolled recurrence exactly (:func:`gated_chunk_residual`)?"""
    return _is_zero(gated_chunk_residual(L, D, Dv))


def _deltanet_solve(K, b, a) -> sp.Matrix:
    """``(I + D_beta (K K^T * Gamma * M^-))^{-1}``, by forward substitution (exact polynomials)."""
    L = K.rows
    Bmat = sp.diag(*b) * strict_lower((K * K.T).multiply_elementwise(gamma_matrix(a)))
    return _unit_lower_inverse(sp.eye(L) + Bmat)


def gated_deltanet_pseudo_values(L: int = 3, D: int = 2, Dv: int = 1) -> sp.Matrix:
    """``U = (I + D_beta (K K^T * Gamma * M^-))^{-1} D_beta V`` (L x Dv) for symbolic ``K`` (L x D),
    ``V`` (L x Dv), ``beta`` and gates ``a``."""
    K, V, b, a = vectors(L, D, "k"), vectors(L, Dv, "v"), betas(L), gates(L)
    return (_deltanet_solve(K, b, a) * sp.diag(*b) * V).applyfunc(sp.expand)


def _deltanet_states(K, V, b, a, variant: str, S0=None) -> list:
    """``S_0 .. S_{L-1}`` of the gated delta rule (``variant="gated"``) or of the rule without
    the delta term (``"no_delta"``: ``S_t = a_t S_{t-1} + beta_t v_t k_t^T``), from ``S0`` (default 0)."""
    if variant not in DELTANET_VARIANTS:
        raise ValueError(f"`variant` must be one of {DELTANET_VARIANTS}, got {variant!r}")
    S = sp.zeros(V.cols, K.cols) if S0 is None else S0
    states = []
    for t in range(K.rows):
        k_t, v_t = K.row(t).T, V.row(t).T
        transition = householder(K.row(t), b[t]) if variant == "gated" else sp.eye(K.cols)
        S = (a[t] * S * transition + b[t] * v_t * k_t.T).applyfunc(sp.expand)
        states.append(S)
    return states


def gated_deltanet_residual(L: int = 3, D: int = 2, Dv: int = 1, *, variant: str = "gated") -> sp.Matrix:
    """``S_{L-1} - sum_{j<=L-1} Gamma_{L-1,j} u_j k_j^T``, expanded: the last state of the unrolled
    recurrence (``variant`` as in :func:`gated_deltanet_identity`) minus the matrix form's."""
    K, V, b, a = vectors(L, D, "k"), vectors(L, Dv, "v"), betas(L), gates(L)
    U = gated_deltanet_pseudo_values(L, D, Dv)
    S = _deltanet_states(K, V, b, a, variant)[-1]
    form = sum((gate_product(a, j, L - 1) * U.row(j).T * K.row(j) for j in range(L)), sp.zeros(Dv, D))
    return (S - form).applyfunc(sp.expand)


def gated_deltanet_identity(L: int = 3, D: int = 2, Dv: int = 1, *, variant: str = "gated") -> bool:
    """Unroll the recurrence from ``S_{-1} = 0`` and check, for every ``t``, exactly:
    ``S_t = sum_{j<=t} Gamma_tj u_j k_j^T`` with ``U`` from :func:`gated_deltanet_pseudo_values`.

    ``variant="gated"``: Gated DeltaNet, ``S_t = a_t S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``
    (True); ``"no_delta"``: ``S_t = a_t S_{t-1} + beta_t v_t k_t^T``, the associative-memory
    notes' row for Gated DeltaNet, which drops the delta term (False for L >= 2).
    """
    K, V, b, a = vectors(L, D, "k"), vectors(L, Dv, "v"), betas(L), gates(L)
    U = gated_deltanet_pseudo_values(L, D, Dv)
    for t, S in enumerate(_deltanet_states(K, V, b, a, variant)):
        form = sum((gate_product(a, j, t) * U.row(j).T * K.row(j) for j in range(t + 1)), sp.zeros(Dv, D))
        if not _is_zero(S - form):
            return False
    return True


def gated_deltanet_chunk_identity(L: int = 3, D: int = 2, Dv: int = 1) -> bool:
    """The chunked WY form of :func:`pathedu.pathfox.gated_deltanet_chunked`, from a symbolic state ``S``::

        U = (I + D_beta (K K^T * Gamma * M^-))^{-1} D_beta (V - diag(a_0 ... a_t) K S^T)
        S_t = (a_0 ... a_t) S + sum_{j<=t} Gamma_tj u_j k_j^T            (every t)

    checked exactly against the unrolled recurrence started at ``S``."""
    K, V, b, a = vectors(L, D, "k"), vectors(L, Dv, "v"), betas(L), gates(L)
    S0 = vectors(Dv, D, "S")
    decay0 = sp.diag(*[gate_product(a, -1, t) for t in range(L)])
    U = (_deltanet_solve(K, b, a) * sp.diag(*b) * (V - decay0 * K * S0.T)).applyfunc(sp.expand)
    for t, S in enumerate(_deltanet_states(K, V, b, a, "gated", S0)):
        form = gate_product(a, -1, t) * S0
        form += sum((gate_product(a, j, t) * U.row(j).T * K.row(j) for j in range(t + 1)), sp.zeros(Dv, D))
        if not _is_zero(S - form):
            return False
    return True


def gated_deltanet_gradient_step(D: int = 2, Dv: int = 2) -> sp.Matrix:
    """One step of Gated DeltaNet minus two gradient steps, expanded (the zero matrix).

    With ``l(S) = (1/2) |S k - v|_2^2`` and ``S' = a S_prev`` (weight decay: a step of
    size ``1 - a`` on ``(1/2)|S|_F^2``), ``S' - beta grad l(S')`` (the gradient taken
    entry by entry with sympy, at the decayed state) minus
    ``a S_prev (I - beta k k^T) + beta v k^T``."""
    S_prev, k, v = vectors(Dv, D, "S"), vectors(1, D, "k").T, vectors(1, Dv, "v").T
    a, beta = sp.Symbol("a", positive=True), sp.Symbol("beta", real=True)
    X = vectors(Dv, D, "X")  # the variable of the loss
    r = X * k - v
    loss = (r.T * r)[0, 0] / 2
    grad = sp.Matrix(Dv, D, lambda i, j: sp.diff(loss, X[i, j]))
    S_dec = a * S_prev
    step = S_dec - beta * grad.subs({X[i, j]: S_dec[i, j] for i in range(Dv) for j in range(D)}, simultaneous=True)
    rule = a * S_prev * (sp.eye(D) - beta * k * k.T) + beta * v * k.T
    return (step - rule).applyfunc(sp.expand)
