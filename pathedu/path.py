r"""PaTH attention and its linear duals (the Householder RNN, DeltaNet): every form.

The transition of token ``s`` is a Householder-like matrix ::

    H_s = I - beta_s w_s w_s^T        (D x D, symmetric; beta_s in [0, 2]; |w_s| = 1)

``w_s`` is a unit vector, by definition (``beta_s = 2``: a reflection, eigenvalue -1): PaTH's layers normalise it.
The forms take ``w`` as given and require what keeps every product of transitions bounded, that no ``H_s``
expands: its eigenvalues are 1 and ``1 - beta_s |w_s|^2``, so ``beta_s |w_s|^2 <= 2``.  That holds for unit ``w_s``
and ``beta_s`` in [0, 2], and for ``w_s = 0`` (no transition, as in the paper's constructions,
:mod:`pathedu.constructions`).  Every attention and RNN form here and in :mod:`pathedu.pathfox` (and the Triton
kernels) refuses anything else with a ``ValueError`` naming ``w`` (within
:data:`pathedu.checks.TRANSITION_TOL` = ``2^-4``, the same for every dtype: it passes a unit vector rounded to
bfloat16), rather than return what such products give: growth like ``(beta |w|^2 - 1)^T``, which overflows
float32 into NaN.  ``w`` is never normalised for you: ``w = torch.nn.functional.normalize(w, dim=-1)``.  The
algebra of :func:`ut_transform`, :func:`householder_product` and :func:`interval_product` holds for any ``w``,
which they take as given.  Positions are 0-based and a token's own transition never
acts on itself.

Softmax side, PaTH attention: the product of transitions *between* key j and
query i is the position encoding ::

    logit_ij = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i    (j <= i; j = i: plain k_i^T q_i)
    o_i      = sum_{j <= i} softmax_j(logit_ij) v_j

Linear side, the Householder RNN (PaTH's dual, no normalisation, no scale) ::

    S_t = S_{t-1} H_t + v_t k_t^T,     o_t = S_t q_t = sum_{j<=t} (k_j^T H_{j+1} ... H_t q_t) v_j

Unrolling ``S_t = S_{t-1} H_t`` puts the *smallest* index on the *left*:
``H_{j+1} ... H_t``.  (The reverse product ``H_t ... H_{j+1}`` gives other numbers.)

DeltaNet is the Householder RNN with ``w = k`` and values ``beta * v`` ::

    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T

Products of transitions, compactly (the UT transform).  With ``W`` (L x D) holding
``w_0 .. w_{L-1}`` as rows and ``D_beta = diag(beta)`` ::

    H_{L-1} ... H_1 H_0 = I - W^T A W,    A = (I + strictLower(D_beta W W^T))^{-1} D_beta   (L x L, lower)
    H_0 H_1 ... H_{L-1} = I - W^T A^T W   (the transpose: every H_s is symmetric)

and any contiguous sub-interval uses the same global ``A`` restricted to it
(:func:`ut_transform`, :func:`interval_product`).

Shapes everywhere: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``,
``beta: (..., T)``, outputs ``(..., T, Dv)``; the leading dims must agree.
Reference forms compute in ``q``'s dtype (``w`` and ``beta`` are cast to it),
except that the forms built on a triangular solve (the UT transform, DeltaNet's
``(I + B)^{-1}``) compute float16/bfloat16 input in float32 (torch has no 16-bit
triangular solve on the CPU) and return ``q``'s dtype, and that the UT factor ``A`` itself
is solved in float64 whatever the input (then rounded to the working dtype): in float32 its
forward substitution loses digits where the ``w`` are nearly parallel and ``beta`` near 2
(``_ut_factor`` says how many).

Non-finite inputs: as everywhere in pathedu (:mod:`pathedu.checks`, "Non-finite inputs"), a NaN or inf in
``q``, ``k`` or ``v`` at position t changes only the outputs at positions >= t; ``w`` and ``beta`` must be
finite (``ValueError`` otherwise).

================  =================================  =====================================
form              softmax side (PaTH)                linear side (Householder RNN, DeltaNet)
================  =================================  =====================================
naive             ``path_naive``: loops, explicit    ``householder_naive``,
                  products of H                      ``deltanet_naive``: loops, products
recurrent         ``path_recurrent``: KV cache with  ``householder_recurrent``,
                  in-place key updates               ``deltanet_recurrent``: state S_t
matrix            ``path_matrix``: masked UT form    ``householder_matrix``: masked UT;
                                                     ``deltanet_matrix``: (I + B)^{-1}
blockwise         ``path_blockwise``: right-to-left  ``householder_chunked``,
                  scan, online softmax               ``deltanet_chunked``: chunks + state
Triton            ``path_triton``                    ``householder_triton``, ``deltanet_triton``
================  =================================  =====================================

Also: :func:`path_dyadic` (PaTH on the backward pass's schedule: every pair of blocks meets once, at the
boundary of the smallest dyadic node holding both; :func:`dyadic_level`), :func:`path_logits` (the ``T x T``
logit matrix), :func:`ut_transform`, :func:`householder_product`, :func:`interval_product` and :class:`PathKVCache`.
"""
from __future__ import annotations

import torch

from .checks import (QKV, check_per_token, check_positive_int, check_qkv, check_scale, finite_condition,
                     range_condition, require, transition_condition)
from .masks import causal_mask, causal_matmul, masked_logits
from .nope import KVCache, _initial_state, causal_softmax, empty_output, online_softmax_step

__all__ = [
    "path_naive", "path_recurrent", "path_matrix", "path_blockwise", "path_dyadic", "path_triton",
    "householder_naive", "householder_recurrent", "householder_matrix", "householder_chunked", "householder_triton",
    "deltanet_naive", "deltanet_recurrent", "deltanet_matrix", "deltanet_chunked", "deltanet_triton",
    "path_logits", "dyadic_level", "ut_transform", "householder_product", "interval_product", "PathKVCache",
]

ORDERS = ("increasing", "decreasing")


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------

def _beta_conditions(beta):
    """``beta`` finite and in [0, 2], as conditions for :func:`pathedu.checks.require` (NaN: "finite")."""
    return finite_condition(beta, "beta"), range_condition(beta, "beta", 0, 2, " (H = I - beta w w^T)")


def _check_beta(beta, n: QKV, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """``beta: (..., T)``, finite, in [0, 2] (one host sync); returned in ``dtype`` (default ``like``'s)."""
    check_per_token(beta, "beta", n, like)
    require(*_beta_conditions(beta))
    return beta.to(like.dtype if dtype is None else dtype)


def _check_w_beta(w, beta, n: QKV | None = None, like: torch.Tensor | None = None, dtype=None, *,
                  unit: bool = True):
    """Validate ``w: (..., T, D)`` (finite, matching ``k``) and ``beta: (..., T)`` in [0, 2], and unless
    ``unit=False`` that ``beta_t |w_t|^2 <= 2`` (:func:`pathedu.checks.transition_condition`).

    Without ``n``/``like`` (:func:`ut_transform`, :func:`householder_product`),
    the sizes are read off ``w`` itself.  Shapes first, then every value check
    read at once (one host sync).  Returns ``(w, beta)`` in ``dtype`` (default
    ``like``'s dtype).
    """
    if n is None:
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"`w` must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() < 2:
            raise ValueError(f"`w` must have shape (..., T, D) with at least 2 dims, got shape {tuple(w.shape)}")
        n = QKV(tuple(w.shape[:-2]), w.shape[-2], w.shape[-1], w.shape[-1])
        like = w
    check_per_token(w, "w", n, like, extra=(n.D,))
    check_per_token(beta, "beta", n, like)
    require(finite_condition(w, "w"), *_beta_conditions(beta), transition_condition(w, beta) if unit else None)
    dtype = like.dtype if dtype is None else dtype
    return w.to(dtype), beta.to(dtype)


def _check_blockwise(q, k, v, w, beta, scale, block):
    """The blockwise forms' arguments: ``(n, scale, dtype, w, beta, block)``, ``w`` and ``beta`` in the dtype
    the forms compute in (:func:`_solve_dtype`)."""
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    dt = _solve_dtype(q.dtype)
    w, beta = _check_w_beta(w, beta, n, q, dtype=dt)
    return n, scale, dt, w, beta, check_positive_int(block, "block")


def _solve_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the forms built on a triangular solve: float16/bfloat16 are computed in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ---------------------------------------------------------------------------
# Products of transitions
# ---------------------------------------------------------------------------

def _householder(w_s, beta_s):
    """``H_s = I - beta_s w_s w_s^T`` as a matrix: ``w_s: (..., D)``, ``beta_s: (...)`` -> ``(..., D, D)``."""
    eye = torch.eye(w_s.shape[-1], dtype=w_s.dtype, device=w_s.device)
    return eye - beta_s[..., None, None] * w_s[..., :, None] * w_s[..., None, :]


def householder_product(w, beta, *, order: str = "increasing"):
    """The direct product of all L transitions, one matrix product at a time.

    ``order="increasing"``: ``H_0 H_1 ... H_{L-1}`` (smallest index on the left:
    the order of the PaTH logit and of the unrolled recurrence);
    ``order="decreasing"``: ``H_{L-1} ... H_1 H_0`` (the order the UT transform
    writes natively).  The two are transposes of each other.

    Shapes: ``w: (..., L, D)``, ``beta: (..., L)`` -> ``(..., D, D)``; L = 0 gives ``I``.
    ``w`` is taken as given (unit or not).
    """
    w, beta = _check_w_beta(w, beta, unit=False)
    if order not in ORDERS:
        raise ValueError(f"`order` must be one of {ORDERS}, got {order!r}")
    return _product(w, beta, order)


def _product(w, beta, order: str):
    """:func:`householder_product` of already validated arguments."""
    L, D = w.shape[-2:]
    P = torch.eye(D, dtype=w.dtype, device=w.device).expand(w.shape[:-2] + (D, D))
    for s in range(L):
        H = _householder(w[..., s, :], beta[..., s])
        P = P @ H if order == "increasing" else H @ P
    return P


def interval_product(w, beta, j: int, i: int):
    """``H_{j+1} H_{j+2} ... H_i``: the product between key ``j`` and query ``i`` in the PaTH logit.

    Smallest index on the left; ``j = i`` is the empty product ``I``; ``j = -1``
    starts at ``H_0``.  Needs ``-1 <= j <= i < L``.  Computed directly (no UT).

    Shapes: ``w: (..., L, D)``, ``beta: (..., L)`` -> ``(..., D, D)``; ``w`` taken as given (unit or not).
    """
    w, beta = _check_w_beta(w, beta, unit=False)
    L = w.shape[-2]
    for name, x in (("j", j), ("i", i)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"`{name}` must be an int, got {type(x).__name__}")
    if not -1 <= j <= i < L:
        raise ValueError(f"`j` and `i` must satisfy -1 <= j <= i < L = {L}, got j={j}, i={i}")
    return _product(w[..., j + 1 : i + 1, :], beta[..., j + 1 : i + 1], "increasing")


def ut_transform(w, beta):
    r"""The UT transform: compact factors ``(W, A)`` of a product of L transitions.

    With ``W = w`` (rows ``w_0 .. w_{L-1}``) and ``D_beta = diag(beta)``::

        A = (I + strictLower(D_beta W W^T))^{-1} D_beta          (L x L, lower triangular)
        H_{L-1} ... H_1 H_0 = I - W^T A W                        (largest index on the left)
        H_0 H_1 ... H_{L-1} = I - W^T A^T W                      (smallest index on the left)

    ``strictLower`` keeps entries below the diagonal.  The entry
    ``strictLower(D_beta W W^T)_{st} = beta_s w_s . w_t`` (t < s).  For a
    contiguous sub-interval ``(j, i]`` the same ``A`` restricted to rows and
    columns ``j+1 .. i`` gives ``H_i ... H_{j+1}`` (the inverse of a lower
    triangular matrix restricted to a diagonal block is the block's inverse).

    Shapes: ``w: (..., L, D)``, ``beta: (..., L)`` -> ``W: (..., L, D)``, ``A: (..., L, L)``; ``w`` taken as
    given (unit or not).
    """
    w, beta = _check_w_beta(w, beta, unit=False)
    return w, _ut_factor(w, beta)


def _ut_factor(w, beta):
    """The UT factor ``A`` of validated ``w, beta``, solved in float64 and returned in ``w``'s dtype.

    Why float64: the forward substitution behind ``(I + strictLower(D_beta W W^T))^{-1}`` sums terms of size up
    to 4 that cancel, and the system's condition grows with L where the ``w`` are nearly parallel and ``beta``
    near 2 (consecutive near-reflections that nearly undo each other).  Solved in float32 there, ``A`` is off by
    6e-4 of its largest entry at L = 2048, and :func:`householder_matrix` by 2e-3 relative (5e-3 on the worst
    row); solved in float64 and rounded, ``A`` holds to float32's rounding and the scores built on it to 1e-4.
    (On a device without float64, Apple's MPS, the solve runs in float32.)"""
    solve = torch.float32 if w.device.type == "mps" else torch.float64
    w_, beta_ = w.to(solve), beta.to(solve)
    L = w.shape[-2]
    eye = torch.eye(L, dtype=solve, device=w.device)
    gram = beta_[..., :, None] * (w_ @ w_.transpose(-1, -2))  # D_beta W W^T: row s times beta_s
    A = torch.linalg.solve_triangular(eye + gram.tril(-1), torch.diag_embed(beta_), upper=False, unitriangular=True)
    return A.to(w.dtype)


def _masked_ut_scores(q, k, w, beta, A=None):
    r"""``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` for ``j <= i`` (0 above the diagonal), from the global UT factor::

        Ã = lower(Q K^T) - lower(Q W^T) A strictLower(W K^T)

    ``lower`` keeps ``s <= i`` (diagonal included), ``strictLower`` keeps ``t > j``;
    both are selects (``tril``), so a non-finite ``k_j`` (column j) or ``q_i``
    (row i) stays in its own column or row, and the final ``tril`` drops column j
    from the rows ``i < j``.
    """
    A = _ut_factor(w, beta) if A is None else A
    qw = (q @ w.transpose(-1, -2)).tril()  # q_i . w_s, s <= i
    wk = (w @ k.transpose(-1, -2)).tril(-1)  # w_t . k_j, t > j
    return (q @ k.transpose(-1, -2) - qw @ A @ wk).tril()


def _block_factors(qc, kc, wc, bc):
    r"""What one block ``[s, e]`` contributes to the blockwise/chunked forms (all from the block's own UT factor):

    * ``A``: the block's UT factor, so ``P = H_s ... H_e = I - W^T A^T W``;
    * ``intra``: the in-block scores ``k_j^T H_{j+1} ... H_i q_i`` (j <= i, 0 above the diagonal);
    * ``q_tilde``: rows ``q~_i = H_s ... H_i q_i`` (boundary-adjusted queries);
    * ``k_tilde``: rows ``k~_j = H_e ... H_{j+1} k_j``, i.e. ``k~_j^T = k_j^T H_{j+1} ... H_e``.
    """
    A = _ut_factor(wc, bc)
    qw = (qc @ wc.transpose(-1, -2)).tril()  # q_i . w_s, s <= i
    wk = (wc @ kc.transpose(-1, -2)).tril(-1)  # w_t . k_j, t > j
    intra = (qc @ kc.transpose(-1, -2) - qw @ A @ wk).tril()
    q_tilde = qc - qw @ A @ wc
    k_tilde = kc - (A @ wk).transpose(-1, -2) @ wc
    return A, intra, q_tilde, k_tilde


def _apply_block(x, wc, A):
    """Rows ``x`` (``(..., M, D)``) mapped to ``P x`` with ``P = H_s ... H_e = I - W^T A^T W``:
    as rows, ``x^T P^T = x^T - (x^T W^T) A W``."""
    return x - (x @ wc.transpose(-1, -2)) @ A @ wc


# ---------------------------------------------------------------------------
# Softmax side: PaTH attention
# ---------------------------------------------------------------------------

def path_naive(q, k, v, w, beta, *, scale=None):
    """The definition, one query at a time, with explicit D x D products of transitions.

    For each query ``i``, walk ``j = i, i-1, ..., 0`` keeping ``P = H_{j+1} ... H_i``
    (start ``P = I``; after key ``j``, ``P <- H_j P``), so that
    ``logit_ij = scale * k_j^T P q_i``; then a softmax over ``j <= i``.
    O(T^2 D^3): for checking, not for use.

    Shapes: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` -> ``(..., T, Dv)``.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    w, beta = _check_w_beta(w, beta, n, q)
    if n.T == 0:
        return empty_output(q, v)
    eye = torch.eye(n.D, dtype=q.dtype, device=q.device)
    outs = []
    for i in range(n.T):
        logits = [None] * (i + 1)
        P = eye.expand(n.lead + (n.D, n.D))
        for j in range(i, -1, -1):
            logits[j] = scale * torch.einsum("...d,...de,...e->...", k[..., j, :], P, q[..., i, :])
            P = _householder(w[..., j, :], beta[..., j]) @ P
        p = torch.softmax(torch.stack(logits, dim=-1), dim=-1)
        outs.append(torch.einsum("...j,...jd->...d", p, v[..., : i + 1, :]))
    return torch.stack(outs, dim=-2)


class PathKVCache(KVCache):
    """A decoding cache whose keys are updated by every new transition.

    The cache holds ``k^_j = H_t ... H_{j+1} k_j`` after token ``t`` has arrived
    (largest index on the left), so that ``k^_j^T q_t = k_j^T H_{j+1} ... H_t q_t``:
    decoding is then plain softmax attention (:meth:`attend`, paged, online
    softmax) over the cache.

    ``step(k_t, v_t, w_t, beta_t)``: first ``k^_j <- H_t^T k^_j = H_t k^_j`` for
    every cached ``j < t`` (``H_t`` is symmetric), then append ``(k_t, v_t)``:
    a token's own transition never acts on its own key.  O(t D) work per token,
    and neither the ``w`` nor the ``beta`` history needs to be stored.  A
    serving kernel updates the keys in place; here each page of keys is
    replaced by its updated copy, so that autograd can differentiate through
    decoding (it needs the old keys for the gradient).

    Shapes: ``k_t, w_t: (..., D)``, ``v_t: (..., Dv)``, ``beta_t: (...)``.
    """

    def transition(self, w_t, beta_t):
        """Apply ``H_t = I - beta_t w_t w_t^T`` to every cached key, page by page."""
        b, w_col, w_row = beta_t[..., None, None], w_t[..., :, None], w_t[..., None, :]
        # k^_j <- k^_j - beta_t (w_t . k^_j) w_t, for the rows k^_j of each page
        self.k_pages = [keys - b * (keys @ w_col) * w_row for keys in self.k_pages]

    def step(self, k_t, v_t, w_t, beta_t):
        """Token ``t`` arrives: update the cached keys by ``H_t``, then append ``(k_t, v_t)``."""
        self.transition(w_t, beta_t)
        self.append(k_t, v_t)


def path_recurrent(q, k, v, w, beta, *, scale=None, page: int = 64):
    """Decoding with key updates (:class:`PathKVCache`), token by token.

    When token ``t`` arrives, every cached key is multiplied by ``H_t``, then
    ``(k_t, v_t)`` is appended and ``q_t`` attends to the cache with an ordinary
    (paged, online-softmax) softmax attention.  The result equals the prefill
    forms (:func:`path_matrix`).  Shapes as :func:`path_naive`.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    w, beta = _check_w_beta(w, beta, n, q)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)
    cache = PathKVCache(n.lead, n.D, n.Dv, n.T, dtype=q.dtype, device=q.device, page=page)
    outs = []
    for t in range(n.T):
        cache.step(k[..., t, :], v[..., t, :], w[..., t, :], beta[..., t])
        outs.append(cache.attend(q[..., t, :], scale))
    return torch.stack(outs, dim=-2)


def path_matrix(q, k, v, w, beta, *, scale=None):
    r"""Parallel form from one global UT transform (masked UT)::

        A = (I + strictLower(D_beta W W^T))^{-1} D_beta
        Ã = lower(Q K^T) - lower(Q W^T) A strictLower(W K^T)
        O = softmax(scale * Ã + M) V        (M: 0 for j <= i, -inf above)

    i.e. ``Ã_ij = q_i.k_j - sum_{s<=i} sum_{t>j} (q_i.w_s) A_st (w_t.k_j) = k_j^T H_{j+1} ... H_i q_i``.
    O(T^2 D + T^3) work (the triangular solve, in float64: the module's text says why), O(T^2) memory.
    Shapes as :func:`path_naive`.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    dt = _solve_dtype(q.dtype)
    w, beta = _check_w_beta(w, beta, n, q, dtype=dt)
    if n.T == 0:
        return empty_output(q, v)
    logits = scale * _masked_ut_scores(q.to(dt), k.to(dt), w, beta)
    return causal_softmax(logits, v.to(dt)).to(q.dtype)


def path_logits(q, k, w, beta, *, scale=None):
    """The PaTH logits ``scale * k_j^T H_{j+1} ... H_i q_i`` as a ``(..., T, T)`` matrix (row i = query,
    column j = key), ``-inf`` above the diagonal; from the masked UT form of :func:`path_matrix`.

    Shapes: ``q, k, w: (..., T, D)``, ``beta: (..., T)`` -> ``(..., T, T)``.
    """
    n = check_qkv(q, k, k)
    scale = check_scale(scale, n.D)
    dt = _solve_dtype(q.dtype)
    w, beta = _check_w_beta(w, beta, n, q, dtype=dt)
    logits = masked_logits(scale * _masked_ut_scores(q.to(dt), k.to(dt), w, beta), causal_mask(n.T, q.device))
    return logits.to(q.dtype)


def path_blockwise(q, k, v, w, beta, *, scale=None, block: int = 64):
    r"""The blockwise algorithm in PyTorch: the reference :mod:`pathedu.kernels.path_attention` follows.

    Positions are cut into blocks of ``B = block`` tokens; block ``J`` covers
    ``[s_J, e_J]``.  Per block, from the block's own UT factor ``A_J``:

    * ``P_J = H_{s_J} ... H_{e_J} = I - W_J^T A_J^T W_J`` (smallest index on the left);
    * keys ``k~_j = H_{e_J} ... H_{j+1} k_j`` (so ``k~_j^T = k_j^T H_{j+1} ... H_{e_J}``);
    * queries ``q~_i = H_{s_I} ... H_i q_i``.

    For ``j`` in an earlier block ``J < I``:
    ``logit_ij = scale * k~_j^T P_{J+1} ... P_{I-1} q~_i``.  Query block ``I`` scans
    right to left: the diagonal block first (masked UT form inside the block), then
    ``J = I-1, ..., 0`` with a carried ``q^`` (start ``q^ = q~_I``; after key
    block ``J``, ``q^ <- P_J q^``), folding each block into an online softmax.
    O(T^2 D + T D^2) work; never a ``T x T`` matrix.  Shapes as :func:`path_naive`.
    """
    n, scale, dt, w, beta, block = _check_blockwise(q, k, v, w, beta, scale, block)
    if n.T == 0:
        return empty_output(q, v)
    q_in, (q, k, v) = q, (x.to(dt) for x in (q, k, v))
    v_finite = bool(torch.isfinite(v).all())  # one check for every diagonal block
    spans = [(s, min(s + block, n.T)) for s in range(0, n.T, block)]
    factors = [_block_factors(q[..., s:e, :], k[..., s:e, :], w[..., s:e, :], beta[..., s:e]) for s, e in spans]
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
    for I, (s_I, e_I) in enumerate(spans):
        _, intra, q_tilde, _ = factors[I]
        m = torch.full(q_tilde.shape[:-1], float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_tilde.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
        diag = masked_logits(scale * intra, causal_mask(e_I - s_I, q.device))
        m, l, acc = online_softmax_step(m, l, acc, diag, v[..., s_I:e_I, :], masked=True, finite=v_finite)
        q_hat = q_tilde
        for J in range(I - 1, -1, -1):
            s_J, e_J = spans[J]
            A_J, _, _, k_tilde = factors[J]
            logits = scale * q_hat @ k_tilde.transpose(-1, -2)
            m, l, acc = online_softmax_step(m, l, acc, logits, v[..., s_J:e_J, :])
            q_hat = _apply_block(q_hat, w[..., s_J:e_J, :], A_J)  # q^ <- P_J q^
        out[..., s_I:e_I, :] = acc / l[..., None]
    return out.to(q_in.dtype)


def _blocked(q, k, w, beta, block: int):
    r"""Every block's pieces at once: the sequence padded to ``n * block`` tokens (``q = k = w = 0`` and
    ``beta = 0`` past T, i.e. ``H = I``) and cut into ``n`` blocks.

    Returns ``intra`` ``(..., n, B, B)`` (the in-block scores of :func:`_block_factors`), ``q_tilde`` and
    ``k_tilde`` ``(..., n, B, D)``, and ``phi`` ``(..., n, D, D)``: each block's whole transition in row
    form, ``Phi_J = P_J^T = I - W_J^T A_J W_J``, so that a carried query moves as ``q^ <- q^ Phi_J``.
    """
    T, D = q.shape[-2], q.shape[-1]
    n = -(-T // block)
    pad = n * block - T

    def blocks(x, rows):
        x = torch.nn.functional.pad(x, (0, 0, 0, pad) if rows else (0, pad))
        return x.unflatten(-2 if rows else -1, (n, block))

    wc = blocks(w, True)
    A, intra, q_tilde, k_tilde = _block_factors(blocks(q, True), blocks(k, True), wc, blocks(beta, False))
    phi = torch.eye(D, dtype=q.dtype, device=q.device) - wc.transpose(-1, -2) @ A @ wc
    return intra, q_tilde, k_tilde, phi


def dyadic_level(I: int, J: int) -> int:
    """The level at which query block ``I`` meets key block ``J < I``: the highest bit where ``I`` and ``J``
    differ.  At level ``l`` the blocks are grouped in nodes of ``2^(l+1)``; ``J`` lies in the left half of
    its node, ``I`` in the right half, and they meet at the boundary ``mid`` between the halves."""
    return (I ^ J).bit_length() - 1


def _meeting_points(q_tilde, k_tilde, phi):
    r"""Every query and key carried to the boundary where it meets its partners, level by level.

    At level ``l`` (halves of ``h = 2^l`` blocks), block ``I`` in a right half whose boundary is
    ``mid`` holds its queries carried left to ``mid``: ``q~_I Phi_{I-1} ... Phi_mid``; block ``J`` in a
    left half holds its keys carried right to ``mid``: ``k~_J Phi_{J+1}^T ... Phi_{mid-1}^T``.  Then for
    every ``J < I`` meeting at level ``l`` (:func:`dyadic_level`) the scores are one product,
    ``X_l[I] X_l[J]^T = q~_I Phi_{I-1} ... Phi_{J+1} k~_J^T``.  The carries are prefix products of
    the ``Phi`` inside each half (``h - 1`` sequential D x D products per level, all nodes at once).

    Shapes: ``q_tilde, k_tilde: (..., n, B, D)``, ``phi: (..., n, D, D)`` -> ``(L, ..., n, B, D)`` with
    ``L = ceil(log2 n)`` levels.
    """
    n, D = phi.shape[-3], phi.shape[-1]
    eye = torch.eye(D, dtype=phi.dtype, device=phi.device)
    levels = []
    for lvl in range(max(0, (n - 1).bit_length())):
        h = 1 << lvl
        nodes = -(-n // (2 * h))
        extra = nodes * 2 * h - n

        def halves(x, fill=None):  # (..., n, a, b) -> (..., nodes, 2, h, a, b), padded past n
            if extra:
                tail = (fill if fill is not None else torch.zeros_like(x[..., :1, :, :])).expand(
                    x.shape[:-3] + (extra,) + x.shape[-2:])
                x = torch.cat([x, tail], dim=-3)
            return x.unflatten(-3, (nodes, 2, h))

        p = halves(phi, eye)
        right, left = p[..., 1, :, :, :], p[..., 0, :, :, :]
        carry_q = [eye.expand_as(right[..., 0, :, :])]  # block mid + t: Phi_{mid+t-1} ... Phi_mid
        for t in range(1, h):
            carry_q.append(right[..., t - 1, :, :] @ carry_q[-1])
        carry_k = [eye.expand_as(left[..., 0, :, :])]  # block mid - h + t: Phi_{..+t+1}^T ... Phi_{mid-1}^T
        for t in range(h - 2, -1, -1):
            carry_k.append(left[..., t + 1, :, :].transpose(-1, -2) @ carry_k[-1])
        x = torch.stack([halves(k_tilde)[..., 0, :, :, :] @ torch.stack(carry_k[::-1], dim=-3),
                         halves(q_tilde)[..., 1, :, :, :] @ torch.stack(carry_q, dim=-3)], dim=-4)
        levels.append(x.flatten(-5, -3)[..., :n, :, :])
    if not levels:
        return q_tilde.new_zeros((0,) + tuple(q_tilde.shape))
    return torch.stack(levels)


def path_dyadic(q, k, v, w, beta, *, scale=None, block: int = 64):
    r"""PaTH attention on the backward pass's schedule: every pair of blocks meets once, in the middle.

    The blockwise scan (:func:`path_blockwise`) carries each query block right to left across every
    key block before it.  Its reverse (the backward pass) would need the carried query at every block
    in the opposite order.  Here instead, query block ``I`` and key block ``J < I`` meet at the
    boundary between the two halves of the smallest dyadic node holding both (:func:`dyadic_level`):
    queries are carried left to that boundary, keys right to it (:func:`_meeting_points`), and their
    scores are one product.  Diagonal blocks use the in-block scores.  The logits are the same as
    :func:`path_matrix`'s; this form assembles the whole ``T x T`` matrix (a reference for small T),
    and autograd through it is the schedule that ``path_triton``'s backward pass runs tile by tile.
    Shapes as :func:`path_naive`.
    """
    n, scale, dt, w, beta, block = _check_blockwise(q, k, v, w, beta, scale, block)
    if n.T == 0:
        return empty_output(q, v)
    intra, q_tilde, k_tilde, phi = _blocked(q.to(dt), k.to(dt), w, beta, block)
    X = _meeting_points(q_tilde, k_tilde, phi)
    nb = phi.shape[-3]
    rows = []
    for I in range(nb):
        row = [X[dyadic_level(I, J)][..., I, :, :] @ X[dyadic_level(I, J)][..., J, :, :].transpose(-1, -2)
               for J in range(I)]
        row.append(intra[..., I, :, :])
        row += [torch.zeros_like(intra[..., I, :, :])] * (nb - I - 1)  # hidden by the causal mask
        rows.append(torch.cat(row, dim=-1))
    logits = torch.cat(rows, dim=-2)[..., :n.T, :n.T]
    return causal_softmax(scale * logits, v.to(dt)).to(q.dtype)


def path_triton(q, k, v, w, beta, *, scale=None, save_factors=True):
    """PaTH attention in Triton (:func:`pathedu.kernels.path_attention.path_attention`), the blockwise algorithm.

    fp16/bf16/fp32 ``q, k, v``; ``w`` (finite) and ``beta`` (in [0, 2]) used in fp32;
    head dims 16..128; any T.  Shapes as :func:`path_naive`.  Every argument is
    validated by the kernel entry point (values read once its kernels are queued).
    With gradients, the forward runs on the backward's schedule; ``save_factors``: keep its factors for the
    backward (fastest) or only the output and its log-sum-exp (least memory), as the kernel's docstring says.
    """
    from .kernels.path_attention import path_attention

    return path_attention(q, k, v, w, beta, scale=scale, save_factors=save_factors)


# ---------------------------------------------------------------------------
# Linear side: the Householder RNN
# ---------------------------------------------------------------------------

def householder_naive(q, k, v, w, beta):
    """The unrolled recurrence: ``o_i = sum_{j<=i} (k_j^T H_{j+1} ... H_i q_i) v_j``, loops and explicit products.

    As :func:`path_naive` without scale or softmax.  Shapes as :func:`path_naive`.
    """
    n = check_qkv(q, k, v)
    w, beta = _check_w_beta(w, beta, n, q)
    return _unrolled(q, k, v, w, beta, n)


def _unrolled(q, k, v, w, beta, n):
    eye = torch.eye(n.D, dtype=q.dtype, device=q.device)
    out = torch.zeros(q.shape[:-1] + (n.Dv,), dtype=q.dtype, device=q.device)
    for i in range(n.T):
        P = eye.expand(n.lead + (n.D, n.D))  # H_{j+1} ... H_i, starting from j = i
        for j in range(i, -1, -1):
            score = torch.einsum("...d,...de,...e->...", k[..., j, :], P, q[..., i, :])
            out[..., i, :] += score[..., None] * v[..., j, :]
            P = _householder(w[..., j, :], beta[..., j]) @ P
    return out


def householder_recurrent(q, k, v, w, beta, *, initial_state=None, return_state: bool = False):
    """The RNN: ``S_t = S_{t-1} H_t + v_t k_t^T``, ``o_t = S_t q_t``.

    ``S_{t-1} H_t = S_{t-1} - beta_t (S_{t-1} w_t) w_t^T``: O(D Dv) per step.
    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`path_naive`.
    """
    n = check_qkv(q, k, v)
    w, beta = _check_w_beta(w, beta, n, q)
    S = _initial_state(initial_state, n, q)
    outs = []
    for t in range(n.T):
        w_t, b_t = w[..., t, :], beta[..., t]
        S = S - b_t[..., None, None] * (S @ w_t[..., :, None]) * w_t[..., None, :]
        S = S + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2) if outs else empty_output(q, v)
    return (out, S) if return_state else out


def householder_matrix(q, k, v, w, beta):
    """Parallel form: ``O = (Ã * M) V`` with Ã the masked-UT scores of :func:`path_matrix` (no scale, no softmax).

    The UT factor is solved in float64 (then rounded), so that float32 holds where the ``w`` are nearly parallel
    and ``beta`` near 2 (at T = 2048: 7e-5 relative on the worst row, where a float32 solve gave 5e-3).
    Shapes as :func:`path_naive`.
    """
    n = check_qkv(q, k, v)
    dt = _solve_dtype(q.dtype)
    w, beta = _check_w_beta(w, beta, n, q, dtype=dt)
    if n.T == 0:
        return empty_output(q, v)
    return causal_matmul(_masked_ut_scores(q.to(dt), k.to(dt), w, beta), v.to(dt)).to(q.dtype)


def householder_chunked(q, k, v, w, beta, *, chunk: int = 64, initial_state=None, return_state: bool = False):
    r"""Chunkwise-parallel form: the reference :func:`pathedu.kernels.delta_rule.chunked_householder` follows.

    Chunk ``c`` covers ``[s, e]``; ``S`` (Dv x D) is the state after chunk ``c-1``.
    From the chunk's own UT factor ``A_c`` (see :func:`path_blockwise` for
    ``q~``, ``k~`` and ``P_c = H_s ... H_e = I - W_c^T A_c^T W_c``)::

        O_c = Q~_c S^T + (Ã_c * M) V_c              (inter-chunk + intra-chunk)
        S  <- S P_c + V_c^T K~_c = S - (S W_c^T) A_c^T W_c + V_c^T K~_c

    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`path_naive`.
    """
    n = check_qkv(q, k, v)
    dt = _solve_dtype(q.dtype)
    w, beta = _check_w_beta(w, beta, n, q, dtype=dt)
    chunk = check_positive_int(chunk, "chunk")
    S = _initial_state(initial_state, n, q, dtype=dt)
    q_in, (q, k, v) = q, (x.to(dt) for x in (q, k, v))
    v_finite = bool(torch.isfinite(v).all())  # one check for every chunk's intra-chunk product
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
    for s in range(0, n.T, chunk):
        e = min(s + chunk, n.T)
        wc, vc = w[..., s:e, :], v[..., s:e, :]
        A, intra, q_tilde, k_tilde = _block_factors(q[..., s:e, :], k[..., s:e, :], wc, beta[..., s:e])
        out[..., s:e, :] = q_tilde @ S.transpose(-1, -2) + causal_matmul(intra, vc, finite=v_finite)
        S = S - (S @ wc.transpose(-1, -2)) @ A.transpose(-1, -2) @ wc + vc.transpose(-1, -2) @ k_tilde
    out = out.to(q_in.dtype)
    return (out, S.to(q_in.dtype)) if return_state else out


def householder_triton(q, k, v, w, beta, *, initial_state=None, return_state: bool = False):
    """The chunked Householder RNN in Triton (:func:`pathedu.kernels.delta_rule.chunked_householder`).

    fp16/bf16/fp32 ``q, k, v``; ``w`` (finite) and ``beta`` (in [0, 2]) used in fp32;
    head dims 16..128.  Shapes as :func:`householder_naive`.  ``initial_state`` / ``return_state`` as
    :func:`householder_recurrent` (``(..., Dv, D)``; the returned state is fp32): a long sequence can be run in
    pieces.  Differentiable in ``q, k, v, w, beta`` and ``initial_state``, and through the returned state (the
    kernel's backward pass).  Every argument is validated by the kernel entry point (values read once its
    kernels are queued).
    """
    from .kernels.delta_rule import chunked_householder

    return chunked_householder(q, k, v, w, beta, initial_state=initial_state, return_state=return_state)


# ---------------------------------------------------------------------------
# Linear side: DeltaNet (the Householder RNN with w = k, values beta * v)
# ---------------------------------------------------------------------------

def deltanet_naive(q, k, v, beta):
    """The unrolled delta rule: ``o_i = sum_{j<=i} beta_j (k_j^T H_{j+1} ... H_i q_i) v_j``
    with ``H_s = I - beta_s k_s k_s^T``; loops and explicit products.

    This is :func:`householder_naive` with ``w = k`` and values ``beta * v``.
    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` in [0, 2] -> ``(..., T, Dv)``.
    """
    n = check_qkv(q, k, v)
    beta = _check_beta(beta, n, q)
    return _unrolled(q, k, beta[..., None] * v, k, beta, n)


def deltanet_recurrent(q, k, v, beta, *, initial_state=None, return_state: bool = False):
    """The delta rule, token by token: ``S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T``, ``o_t = S_t q_t``.

    (Equal to ``S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``: one step of
    gradient descent on ``|S k_t - v_t|^2 / 2`` with step ``beta_t``.)
    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`deltanet_naive`.
    """
    n = check_qkv(q, k, v)
    beta = _check_beta(beta, n, q)
    S = _initial_state(initial_state, n, q)
    outs = []
    for t in range(n.T):
        k_t = k[..., t, :]
        error = v[..., t, :] - (S @ k_t[..., :, None])[..., 0]  # v_t - S_{t-1} k_t
        S = S + beta[..., t, None, None] * error[..., :, None] * k_t[..., None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2) if outs else empty_output(q, v)
    return (out, S) if return_state else out


def deltanet_matrix(q, k, v, beta):
    r"""Parallel form: pseudo-values from one triangular solve, then linear attention::

        B = diag(beta) (K K^T * M^-),    U = (I + B)^{-1} (beta * V),    O = (Q K^T * M) U

    ``M^-``: strictly lower 0/1 mask (j < i); ``M``: lower, diagonal included.
    ``S_t = sum_{j<=t} u_j k_j^T``: ``u_j`` is what token ``j`` actually writes.
    Shapes as :func:`deltanet_naive`.
    """
    n = check_qkv(q, k, v)
    dt = _solve_dtype(q.dtype)
    beta = _check_beta(beta, n, q, dtype=dt)
    if n.T == 0:
        return empty_output(q, v)
    q_in, (q, k, v) = q, (x.to(dt) for x in (q, k, v))
    # The masks M^- and M are selects (tril), and (Q K^T * M) meets U through causal_matmul: a
    # non-finite k_t or v_t makes u_j non-finite for j >= t only (forward substitution), and the
    # zeros of the mask must not see them.
    B = (beta[..., :, None] * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(n.T, dtype=dt, device=q.device)
    U = torch.linalg.solve_triangular(eye + B, beta[..., None] * v, upper=False, unitriangular=True)
    return causal_matmul((q @ k.transpose(-1, -2)).tril(), U).to(q_in.dtype)


def deltanet_chunked(q, k, v, beta, *, chunk: int = 64, initial_state=None, return_state: bool = False):
    r"""Chunkwise-parallel delta rule (WY representation + carried state): the reference
    :func:`pathedu.kernels.delta_rule.chunked_delta_rule` follows.

    For chunk ``c`` with state ``S`` (Dv x D) after chunk ``c-1``::

        T_c = (I + diag(beta_c)(K_c K_c^T * M^-))^{-1}          (C x C, unit lower triangular)
        W_c = T_c (beta_c * K_c),   U~_c = T_c (beta_c * V_c)     (the WY factors)
        U_c = U~_c - W_c S^T                                      (pseudo-values given S)
        O_c = Q_c S^T + (Q_c K_c^T * M) U_c,      S <- S + U_c^T K_c

    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`deltanet_naive`.
    """
    n = check_qkv(q, k, v)
    dt = _solve_dtype(q.dtype)
    beta = _check_beta(beta, n, q, dtype=dt)
    chunk = check_positive_int(chunk, "chunk")
    S = _initial_state(initial_state, n, q, dtype=dt)
    q_in, (q, k, v) = q, (x.to(dt) for x in (q, k, v))
    # T_c, W_c, U~_c and U_c are causal (row r depends on tokens <= r); their products with
    # lower-triangular weights go through causal_matmul so that zero weights never meet a
    # non-finite k_t or v_t of a later row.  finite=False: the careful product, checked once here.
    kv_finite = bool(torch.isfinite(k).all() & torch.isfinite(v).all())
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
    for s in range(0, n.T, chunk):
        e = min(s + chunk, n.T)
        qc, kc, vc, bc = q[..., s:e, :], k[..., s:e, :], v[..., s:e, :], beta[..., s:e]
        eye = torch.eye(e - s, dtype=dt, device=q.device)
        B = (bc[..., :, None] * (kc @ kc.transpose(-1, -2))).tril(-1)  # diag(beta) (K K^T * M^-)
        T_c = torch.linalg.solve_triangular(eye + B, eye.expand_as(B), upper=False, unitriangular=True)
        W_c = causal_matmul(T_c, bc[..., None] * kc, finite=kv_finite)
        U_tilde = causal_matmul(T_c, bc[..., None] * vc, finite=kv_finite)
        U = U_tilde - W_c @ S.transpose(-1, -2)
        out[..., s:e, :] = qc @ S.transpose(-1, -2) + causal_matmul((qc @ kc.transpose(-1, -2)).tril(), U,
                                                                    finite=kv_finite)
        S = S + U.transpose(-1, -2) @ kc
    out = out.to(q_in.dtype)
    return (out, S.to(q_in.dtype)) if return_state else out


def deltanet_triton(q, k, v, beta, *, factor_dtype=None, initial_state=None, return_state: bool = False):
    """The chunked delta rule in Triton (:func:`pathedu.kernels.delta_rule.chunked_delta_rule`).

    fp16/bf16/fp32 ``q, k, v``; ``beta`` (in [0, 2]) used in fp32; head dims 16..128.
    Shapes as :func:`deltanet_naive`.  ``factor_dtype``: the stored WY factors' dtype (None: bf16 for bf16
    inputs, fp32 otherwise; ``torch.float32`` is closer to float64 and slower).  ``initial_state`` /
    ``return_state`` as :func:`deltanet_recurrent` (the returned state is fp32).  Differentiable in ``q, k, v,
    beta`` and ``initial_state``, and through the returned state (the kernel's backward pass).  Every argument
    is validated by the kernel entry point (values read once its kernels are queued).
    """
    from .kernels.delta_rule import chunked_delta_rule

    return chunked_delta_rule(q, k, v, beta, factor_dtype=factor_dtype, initial_state=initial_state,
                              return_state=return_state)
