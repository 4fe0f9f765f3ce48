r"""PaTH-FoX attention and its linear duals (the gated Householder RNN, Gated DeltaNet): every form.

Two position encodings of the earlier chapters act together.  Token ``s``
carries a Householder-like transition (chapter 5) and a forget gate (chapter 3) ::

    H_s = I - beta_s w_s w_s^T     (D x D, symmetric; beta_s in [0, 2]; |w_s| = 1)
    a_s = exp(log_f[s])            (log_f[s] <= 0, finite: a gate in (0, 1])

Positions are 0-based and a token's own transition and gate never act on
itself: between key ``j`` and query ``i >= j`` act the tokens ``s = j+1 .. i``,
in products with the *smallest* index on the *left*.  Their cumulative log
gate is ``G_ij = sum_{s=j+1..i} log_f[s] = c_i - c_j`` (``c = cumsum(log_f)``;
``G_ii = 0``), and ``Gamma_ij = exp(G_ij)`` is the product of their gates.

Softmax side, PaTH-FoX attention: PaTH's multiplicative encoding inside the
logit, FoX's additive bias next to it (the gate is *not* multiplied by
``scale``, as in FoX; ``scale=None`` means ``D ** -0.5``) ::

    logit_ij = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i + G_ij        (j <= i)
    o_i      = sum_{j <= i} softmax_j(logit_ij) v_j

Linear side, the gated Householder RNN (no normalisation, no scale) ::

    S_t = a_t S_{t-1} H_t + v_t k_t^T,      o_t = S_t q_t               (S_t is Dv x D)
        =>  o_i = sum_{j<=i} exp(G_ij) (k_j^T H_{j+1} ... H_i q_i) v_j

The scalar gate commutes with every matrix, so the unrolled product
``a_{j+1} H_{j+1} ... a_i H_i`` splits into ``exp(G_ij)`` times ``H_{j+1} ... H_i``:
a scalar decay times PaTH's product.  Exponentiate the softmax logit and the
same split appears, ``exp(logit_ij) = exp(G_ij) exp(scale k_j^T H_{j+1} ... H_i q_i)``:
FoX's factor times PaTH's.  That is the duality of this chapter: the linear
side multiplies the PaTH score by ``exp(G_ij)``, the softmax side adds
``G_ij`` to the PaTH logit.

Gated DeltaNet is the gated Householder RNN with ``w = k`` and values ``beta * v`` ::

    S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
        = S' - beta_t (S' k_t - v_t) k_t^T,     S' = a_t S_{t-1}

Read as online regression, a step is two gradient steps on the state: first
weight decay, ``S' = S_{t-1} - (1 - a_t) grad (1/2)|S|_F^2`` at ``S_{t-1}``
(i.e. ``S' = a_t S_{t-1}``), then one step of size ``beta_t`` on the
regression loss ``l_t(S) = (1/2) |S k_t - v_t|_2^2``, whose gradient
``(S k_t - v_t) k_t^T`` is evaluated at the *decayed* state ``S'``.  Its
parallel form, with ``M`` the lower-triangular 0/1 mask (diagonal included)
and ``M^-`` the strictly lower one ::

    U = (I + diag(beta) (K K^T * Gamma * M^-))^{-1} diag(beta) V,     O = (Q K^T * Gamma * M) U

(``S_t = sum_{j<=t} Gamma_tj u_j k_j^T``: ``u_t = beta_t (v_t - sum_{j<t} Gamma_tj (k_t . k_j) u_j)``
is what token ``t`` actually writes.)

Chunks and blocks.  A chunk ``[s, e]`` keeps both encodings *local*: its
transitions through the UT transform of the chunk (:func:`pathedu.path.ut_transform`,
``H_s ... H_e = I - W^T A^T W``), its gates through the chunk-local cumulative
log gate ``b_i = sum_{r=s..i} log_f[r]`` (<= 0).  Every decay is exponentiated
from a sum of gates that is <= 0 and masked *before* ``exp``: ``b_i`` (the
chunk start to ``i``), ``G_ij`` inside the chunk, ``sum_{r=j+1..e} log_f[r]``
(``j`` to the chunk end); no ``exp(-b_j)`` is ever formed (it overflows).
Between chunks the state is decayed by ``exp(b_e)``, the gates of the whole
chunk, exactly as it is multiplied by ``H_s ... H_e``.

Shapes everywhere: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``,
``beta, log_f: (..., T)``, outputs ``(..., T, Dv)``; the leading dims (batch,
heads, ...) must agree.  Reference forms compute in float32 or wider
(float64 when ``q`` or ``log_f`` is float64: gate sums in 16-bit floats lose
the digits that matter, and torch has no 16-bit triangular solve on the CPU),
with ``w``, ``beta`` and ``log_f`` cast to that dtype, and return ``q``'s dtype.
Every value check of a call (``w`` finite, ``beta`` in [0, 2], ``beta_t |w_t|^2 <= 2``, ``log_f`` <= 0
and finite) is read with one host synchronisation.

``w`` is PaTH's: a unit vector by definition; a ``w`` whose transitions expand (``beta_t |w_t|^2 > 2``) is
refused with a ``ValueError`` naming ``w`` (:mod:`pathedu.path` says why and with what tolerance), never
normalised for you.  Gated DeltaNet's ``w = k`` is not checked so.

Non-finite inputs: as everywhere in pathedu (:mod:`pathedu.checks`, "Non-finite inputs"), a NaN or inf in
``q``, ``k`` or ``v`` at position t changes only the outputs at positions >= t; ``w``, ``beta`` and ``log_f``
must be finite (``ValueError`` otherwise).

================  ==================================  ==========================================
form              softmax side (PaTH-FoX)             linear side (gated Householder RNN,
                                                      Gated DeltaNet)
================  ==================================  ==========================================
naive             ``pathfox_naive``: loops, explicit  ``gated_householder_naive``,
                  products of H, gate sums            ``gated_deltanet_naive``: loops, products
recurrent         ``pathfox_recurrent``: KV cache     ``gated_householder_recurrent``,
                  with in-place key updates by H_t    ``gated_deltanet_recurrent``: state S_t
                  and per-key gate sums
matrix            ``pathfox_matrix``: masked UT       ``gated_householder_matrix``: masked UT
                  logits + FoX bias                   times Gamma; ``gated_deltanet_matrix``:
                                                      (I + B_Gamma)^{-1}
blockwise         ``pathfox_blockwise``: right-to-    ``gated_householder_chunked``,
                  left scan carrying q^ and its gate  ``gated_deltanet_chunked``: UT/WY per
                  offset, online softmax              chunk with decay + carried state
Triton            ``pathfox_triton``: the PaTH kernel ``gated_householder_triton``,
                  with the FoX bias hook              ``gated_deltanet_triton``: the chunked
                                                      DeltaNet kernel, scalar decay hook
================  ==================================  ==========================================

Also: :func:`pathfox_logits` (the ``T x T`` logit matrix) and :class:`PathForgetKVCache`.
"""
from __future__ import annotations

import torch

from . import fox, path
from .checks import (QKV, check_per_token, check_positive_int, check_qkv, check_scale, finite_condition,
                     log_gate_condition, range_condition, require, transition_condition)
from .masks import causal_mask, causal_matmul, masked_logits
from .nope import _initial_state, causal_softmax, empty_output, online_softmax_step

__all__ = [
    "pathfox_naive", "pathfox_recurrent", "pathfox_matrix", "pathfox_blockwise", "pathfox_triton", "pathfox_logits",
    "gated_householder_naive", "gated_householder_recurrent", "gated_householder_matrix",
    "gated_householder_chunked", "gated_householder_triton",
    "gated_deltanet_naive", "gated_deltanet_recurrent", "gated_deltanet_matrix", "gated_deltanet_chunked",
    "gated_deltanet_triton",
    "PathForgetKVCache",
]


# ---------------------------------------------------------------------------
# Validation (once per public call; the helpers below take validated inputs)
# ---------------------------------------------------------------------------

def _validate(q, k, v, w, beta, log_f, *, tuning=()):
    """Check shapes, types and devices, then the tuning arguments, then every value at once.

    ``w=None``: no Householder vectors (Gated DeltaNet: ``w = k``).  ``tuning``:
    ``(name, value)`` pairs, each a positive int.  Returns the sizes, the working
    dtype (float32 or wider, :func:`pathedu.fox._work_dtype`) and the tuning values.
    All value conditions are read with one host sync (:func:`pathedu.checks.require`).
    """
    n = check_qkv(q, k, v)
    if w is not None:
        check_per_token(w, "w", n, q, extra=(n.D,))
    check_per_token(beta, "beta", n, q)
    check_per_token(log_f, "log_f", n, q)
    tuned = [check_positive_int(x, name) for name, x in tuning]
    require(None if w is None else finite_condition(w, "w"),
            finite_condition(beta, "beta"), range_condition(beta, "beta", 0, 2, " (H = I - beta w w^T)"),
            log_gate_condition(log_f), None if w is None else transition_condition(w, beta))
    return n, fox._work_dtype(q, log_f), tuned


def _cast(dt, *xs):
    return tuple(x.to(dt) for x in xs)


# ---------------------------------------------------------------------------
# Gate sums (all <= 0, each a sum over exactly its own gates)
# ---------------------------------------------------------------------------

def _gate_after(g):
    """``sum_{r=j+1..e} g[r]`` for each ``j`` of a chunk ``g: (..., C)`` (0 for the last token):
    the gates from a key to the chunk end, as a reversed cumulative sum (no difference of sums)."""
    rev = g.flip(-1).cumsum(-1).flip(-1)  # sum_{r=j..e}
    return torch.cat((rev[..., 1:], torch.zeros_like(rev[..., :1])), dim=-1)


# ---------------------------------------------------------------------------
# Softmax side: PaTH-FoX
# ---------------------------------------------------------------------------

def pathfox_naive(q, k, v, w, beta, log_f, *, scale=None):
    """The definition, one query at a time, with explicit D x D products and gate sums.

    For each query ``i``, walk ``j = i, i-1, ..., 0`` keeping ``P = H_{j+1} ... H_i``
    (smallest index on the left; start ``P = I``, after key ``j``: ``P <- H_j P``)
    and ``G = sum_{s=j+1..i} log_f[s]`` (start 0, after key ``j``: ``G <- G + log_f[j]``),
    so that ``logit_ij = scale * k_j^T P q_i + G``; then a softmax over ``j <= i``.
    O(T^2 D^3): for checking, not for use.

    Shapes: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta, log_f: (..., T)`` -> ``(..., T, Dv)``.
    """
    n, dt, _ = _validate(q, k, v, w, beta, log_f)
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    eye = torch.eye(n.D, dtype=dt, device=q.device).expand(n.lead + (n.D, n.D))
    outs = []
    for i in range(n.T):
        logits = [None] * (i + 1)
        P, G = eye, torch.zeros_like(g[..., 0])
        for j in range(i, -1, -1):
            logits[j] = scale * torch.einsum("...d,...de,...e->...", k_[..., j, :], P, q_[..., i, :]) + G
            P = path._householder(w_[..., j, :], b_[..., j]) @ P
            G = G + g[..., j]
        p = torch.softmax(torch.stack(logits, dim=-1), dim=-1)
        outs.append(torch.einsum("...j,...jd->...d", p, v_[..., : i + 1, :]))
    return torch.stack(outs, dim=-2).to(q.dtype)


class PathForgetKVCache(path.PathKVCache):
    """The decoding cache of PaTH-FoX: keys updated by every new transition, and each key's gate sum.

    After token ``t`` has arrived the cache holds, for every ``j <= t``,
    ``k^_j = H_t ... H_{j+1} k_j`` (as :class:`pathedu.path.PathKVCache`) and
    ``G_j = sum_{s=j+1..t} log_f[s]`` (<= 0), so that
    ``scale * k^_j^T q_t + G_j`` is the PaTH-FoX logit: decoding is FoX-style
    softmax attention (paged, online softmax) with a per-key bias.

    ``step(k_t, v_t, w_t, beta_t, log_f_t)``: first ``k^_j <- H_t k^_j`` and
    ``G_j <- G_j + log_f[t]`` for every cached ``j < t`` (one pass over the cache,
    which PaTH makes anyway), then append ``(k_t, v_t)`` with ``G_t = 0``: a
    token's own transition and gate never act on itself.

    The gate sums are kept *relative to the current token*: each ``G_j`` is
    the sum of exactly its own gates, never a difference ``c_t - c_j`` of two
    long prefix sums.  A running prefix sum grows without bound and loses the
    small gates (in float32, after 1024 gates of -30, ``|c|`` is 3e4, where the
    spacing is 2e-3: each later gate of -1e-3 is rounded to -2e-3 or to 0),
    and the difference of two such sums is wrong by far more than the gates it
    should measure.  ``G_j`` of a recent key holds only recent gates, with the
    precision of its own size; a key whose ``G_j`` is huge has weight
    ``exp(G_j) = 0`` anyway.  Kept in the working dtype (float32 or wider).

    Shapes: ``k_t, w_t: (..., D)``, ``v_t: (..., Dv)``, ``beta_t, log_f_t: (...)``;
    ``attend(q_t: (..., D), scale) -> (..., Dv)``; ``G``: ``(..., len)``.
    """

    def __init__(self, lead, D, Dv, T_max=None, *, dtype, device, page: int = 64):
        super().__init__(lead, D, Dv, T_max, dtype=dtype, device=device, page=page)
        self.g_pages: list[torch.Tensor] = []  # each (..., <= page)

    def step(self, k_t, v_t, w_t, beta_t, log_f_t):
        """Token ``t`` arrives: update the cached keys by ``H_t`` and their gate sums by ``log_f[t]``,
        then append ``(k_t, v_t)`` with gate sum 0."""
        if self.T_max is not None and self.len >= self.T_max:
            raise ValueError(f"the cache is full (`T_max` = {self.T_max} tokens)")
        self.transition(w_t, beta_t)
        g_t = log_f_t.to(self.dtype)[..., None]
        self.g_pages = [G + g_t for G in self.g_pages]  # out of place, so autograd can differentiate
        self._write(self.g_pages, torch.zeros_like(g_t), dim=-1)
        self.append(k_t, v_t)

    @property
    def G(self) -> torch.Tensor:
        """Every cached key's gate sum ``sum_{s=j+1..t} log_f[s]``, ``(..., len)``."""
        return torch.cat(self.g_pages, dim=-1) if self.g_pages else \
            torch.empty(self.lead + (0,), dtype=self.dtype, device=self.device)

    def attend(self, q_t, scale):
        """Attend from ``q_t: (..., D)`` to every cached token, each logit biased by its key's gate sum."""
        return super().attend(q_t, scale, bias=lambda start, end: self.g_pages[start // self.page])


def pathfox_recurrent(q, k, v, w, beta, log_f, *, scale=None, page: int = 64):
    """Decoding with key updates and per-key gate sums (:class:`PathForgetKVCache`), token by token.

    When token ``t`` arrives, every cached key is multiplied by ``H_t`` and every
    cached gate sum gets ``log_f[t]``; then ``(k_t, v_t)`` is appended (gate sum 0)
    and ``q_t`` attends to the cache with FoX-style softmax attention (paged,
    online softmax, additive bias).  Neither the ``w``/``beta`` history nor a
    prefix sum of gates is stored.  Equals the prefill forms (:func:`pathfox_matrix`).
    Shapes as :func:`pathfox_naive`.
    """
    n, dt, (page,) = _validate(q, k, v, w, beta, log_f, tuning=(("page", page),))
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    cache = PathForgetKVCache(n.lead, n.D, n.Dv, n.T, dtype=dt, device=q.device, page=page)
    outs = []
    for t in range(n.T):
        cache.step(k_[..., t, :], v_[..., t, :], w_[..., t, :], b_[..., t], g[..., t])
        outs.append(cache.attend(q_[..., t, :], scale))
    return torch.stack(outs, dim=-2).to(q.dtype)


def _pathfox_logits(q, k, w, beta, g, scale):
    """``scale * Ã + G`` (``-inf`` above the diagonal) of validated inputs in the working dtype."""
    return scale * path._masked_ut_scores(q, k, w, beta) + fox._log_gate_matrix(g)


def pathfox_matrix(q, k, v, w, beta, log_f, *, scale=None):
    r"""Parallel form: PaTH's masked UT logits plus FoX's cumulative log gate::

        A = (I + strictLower(D_beta W W^T))^{-1} D_beta
        Ã = lower(Q K^T) - lower(Q W^T) A strictLower(W K^T)      (Ã_ij = k_j^T H_{j+1} ... H_i q_i)
        O = softmax(scale * Ã + G) V                                (G_ij = sum_{s=j+1..i} log_f[s], -inf for j > i)

    ``G`` from :func:`pathedu.fox.log_gate_matrix` (each entry a sum over exactly
    its own gates).  O(T^2 D + T^3) work, O(T^2) memory.  Shapes as :func:`pathfox_naive`.
    """
    n, dt, _ = _validate(q, k, v, w, beta, log_f)
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    return causal_softmax(_pathfox_logits(q_, k_, w_, b_, g, scale), v_).to(q.dtype)


def pathfox_logits(q, k, w, beta, log_f, *, scale=None):
    """The PaTH-FoX logits ``scale * k_j^T H_{j+1} ... H_i q_i + sum_{s=j+1..i} log_f[s]``
    as a ``(..., T, T)`` matrix (row i = query, column j = key), ``-inf`` above the
    diagonal; from the masked UT form of :func:`pathfox_matrix`.  Subtract
    :func:`pathedu.fox.log_gate_matrix` (below the diagonal) to get
    :func:`pathedu.path.path_logits`.

    Shapes: ``q, k, w: (..., T, D)``, ``beta, log_f: (..., T)`` -> ``(..., T, T)``.
    """
    n, dt, _ = _validate(q, k, k, w, beta, log_f)
    scale = check_scale(scale, n.D)
    q_, k_, w_, b_, g = _cast(dt, q, k, w, beta, log_f)
    if n.T == 0:
        return q.new_empty(n.lead + (0, 0))
    logits = masked_logits(_pathfox_logits(q_, k_, w_, b_, g, scale), causal_mask(n.T, q.device))
    return logits.to(q.dtype)


def pathfox_blockwise(q, k, v, w, beta, log_f, *, scale=None, block: int = 64):
    r"""The blockwise algorithm in PyTorch: :func:`pathedu.path.path_blockwise` with FoX's gate carried alongside.

    Blocks of ``B = block`` tokens; block ``J`` covers ``[s_J, e_J]``.  Per block,
    from the block's own UT factor ``A_J`` (:func:`pathedu.path.path_blockwise`):
    ``P_J = H_{s_J} ... H_{e_J}``, keys ``k~_j = H_{e_J} ... H_{j+1} k_j``, queries
    ``q~_i = H_{s_I} ... H_i q_i``; and from the block's own gates:

    * key side: ``g~_j = sum_{s=j+1..e_J} log_f[s]`` (key to block end, a reversed cumulative sum);
    * query side: ``b_i = sum_{s=s_I..i} log_f[s]`` (block start to query);
    * ``T_J = sum_{s=s_J..e_J} log_f[s]`` (the whole block);
    * diagonal block: ``G_ij`` inside the block, ``-inf`` above the diagonal.

    For ``j`` in an earlier block ``J < I``::

        logit_ij = scale * k~_j^T P_{J+1} ... P_{I-1} q~_i + g~_j + T_{J+1} + ... + T_{I-1} + b_i

    Query block ``I`` scans right to left: the diagonal block first, then
    ``J = I-1, ..., 0`` carrying ``q^`` and a gate offset ``g^`` (start
    ``q^ = q~_i``, ``g^ = b_i``; after key block ``J``: ``q^ <- P_J q^``,
    ``g^ <- g^ + T_J``), folding each block into an online softmax.  The gate is
    carried exactly as the transition is: a scalar beside the vector.  Every
    bias is a sum of gates over its own span (no difference of long prefix
    sums).  O(T^2 D + T D^2) work; never a ``T x T`` matrix.  Shapes as :func:`pathfox_naive`.
    """
    n, dt, (block,) = _validate(q, k, v, w, beta, log_f, tuning=(("block", block),))
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    v_finite = bool(torch.isfinite(v_).all())  # one check for every diagonal block
    spans = [(s, min(s + block, n.T)) for s in range(0, n.T, block)]
    factors = [path._block_factors(q_[..., s:e, :], k_[..., s:e, :], w_[..., s:e, :], b_[..., s:e]) for s, e in spans]
    gates = [(g[..., s:e].cumsum(-1), _gate_after(g[..., s:e])) for s, e in spans]  # (b, g~) per block
    outs = []
    for I, (s_I, e_I) in enumerate(spans):
        _, intra, q_tilde, _ = factors[I]
        b_I = gates[I][0]
        m = torch.full(q_tilde.shape[:-1], float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_tilde.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
        diag = masked_logits(scale * intra + fox._log_gate_matrix(g[..., s_I:e_I]), causal_mask(e_I - s_I, q.device))
        m, l, acc = online_softmax_step(m, l, acc, diag, v_[..., s_I:e_I, :], masked=True, finite=v_finite)
        q_hat, g_hat = q_tilde, b_I
        for J in range(I - 1, -1, -1):
            s_J, e_J = spans[J]
            A_J, _, _, k_tilde = factors[J]
            b_J, g_tilde = gates[J]
            logits = scale * q_hat @ k_tilde.transpose(-1, -2) + g_hat[..., :, None] + g_tilde[..., None, :]
            m, l, acc = online_softmax_step(m, l, acc, logits, v_[..., s_J:e_J, :])
            q_hat = path._apply_block(q_hat, w_[..., s_J:e_J, :], A_J)  # q^ <- P_J q^
            g_hat = g_hat + b_J[..., -1:]  # g^ <- g^ + T_J
        outs.append(acc / l[..., None])
    return torch.cat(outs, dim=-2).to(q.dtype)


def pathfox_triton(q, k, v, w, beta, log_f, *, scale=None, save_factors=True):
    """PaTH-FoX in Triton: :func:`pathedu.kernels.path_attention.path_attention` with ``log_f``.

    The PaTH kernel (preparation pass, then the right-to-left scan) with the FoX bias hook
    of the FlashAttention template: each logit block gets ``c_r - c_j`` (``c`` the fp32
    cumulative log gate, taken once by :func:`pathedu.kernels.gates.cumulative_log_gates`;
    ``r`` the query block's first row; the per-row rest ``c_i - c_r`` cancels in softmax).
    fp16/bf16/fp32 ``q, k, v``; ``w``,
    ``beta``, ``log_f`` used in fp32; head dims 16..128; any T; validated once by the
    kernel's entry point.  Shapes as :func:`pathfox_naive`.  ``save_factors``: as :func:`pathedu.path.path_triton`'s.
    """
    from .kernels.path_attention import path_attention

    return path_attention(q, k, v, w, beta, scale=scale, log_f=log_f, save_factors=save_factors)


# ---------------------------------------------------------------------------
# Linear side: the gated Householder RNN
# ---------------------------------------------------------------------------

def _gated_unrolled(q, k, v, w, beta, g, n: QKV):
    """``o_i = sum_{j<=i} exp(G_ij) (k_j^T H_{j+1} ... H_i q_i) v_j`` by loops (inputs validated, in one dtype).

    Walk ``j = i .. 0`` keeping ``P = H_{j+1} ... H_i`` and ``G = sum_{s=j+1..i} g[s]``
    (<= 0, so ``exp(G)`` never overflows)."""
    eye = torch.eye(n.D, dtype=q.dtype, device=q.device).expand(n.lead + (n.D, n.D))
    outs = []
    for i in range(n.T):
        o = torch.zeros(n.lead + (n.Dv,), dtype=q.dtype, device=q.device)
        P, G = eye, torch.zeros_like(g[..., 0])
        for j in range(i, -1, -1):
            score = torch.einsum("...d,...de,...e->...", k[..., j, :], P, q[..., i, :])
            o = o + (torch.exp(G) * score)[..., None] * v[..., j, :]
            P = path._householder(w[..., j, :], beta[..., j]) @ P
            G = G + g[..., j]
        outs.append(o)
    return torch.stack(outs, dim=-2)


def gated_householder_naive(q, k, v, w, beta, log_f):
    """The unrolled recurrence, loops and explicit products::

        o_i = sum_{j<=i} exp(sum_{s=j+1..i} log_f[s]) (k_j^T H_{j+1} ... H_i q_i) v_j

    (smallest index on the left).  As :func:`pathfox_naive` without scale or
    softmax, the gate a factor instead of a bias.  O(T^2 D^3).
    Shapes as :func:`pathfox_naive`.
    """
    n, dt, _ = _validate(q, k, v, w, beta, log_f)
    if n.T == 0:
        return empty_output(q, v)
    return _gated_unrolled(*_cast(dt, q, k, v, w, beta, log_f), n).to(q.dtype)


def gated_householder_recurrent(q, k, v, w, beta, log_f, *, initial_state=None, return_state: bool = False):
    """The RNN: ``S_t = a_t S_{t-1} H_t + v_t k_t^T``, ``o_t = S_t q_t``, ``a_t = exp(log_f[t])``.

    ``a_t S_{t-1} H_t = a_t (S_{t-1} - beta_t (S_{t-1} w_t) w_t^T)``: O(D Dv) per step.
    ``initial_state``/returned state: ``(..., Dv, D)`` (returned in ``q``'s dtype).
    Shapes as :func:`pathfox_naive`.
    """
    n, dt, _ = _validate(q, k, v, w, beta, log_f)
    S = _initial_state(initial_state, n, q, dtype=dt)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    outs = []
    for t in range(n.T):
        w_t = w_[..., t, :]
        S = torch.exp(g[..., t, None, None]) * S
        S = S - b_[..., t, None, None] * (S @ w_t[..., :, None]) * w_t[..., None, :]
        S = S + v_[..., t, :, None] * k_[..., t, None, :]
        outs.append((S @ q_[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2).to(q.dtype) if outs else empty_output(q, v)
    return (out, S.to(q.dtype)) if return_state else out


def gated_householder_matrix(q, k, v, w, beta, log_f):
    """Parallel form: ``O = (Ã * Gamma * M) V`` with Ã the masked-UT scores of
    :func:`pathedu.path.path_matrix` and ``Gamma = exp(G)`` (``G`` from
    :func:`pathedu.fox.log_gate_matrix`: ``-inf``, hence 0, above the diagonal,
    masked before it is exponentiated).  No scale, no softmax.
    Shapes as :func:`pathfox_naive`.
    """
    n, dt, _ = _validate(q, k, v, w, beta, log_f)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    weights = (path._masked_ut_scores(q_, k_, w_, b_) * torch.exp(fox._log_gate_matrix(g))).tril()
    return causal_matmul(weights, v_).to(q.dtype)


def gated_householder_chunked(q, k, v, w, beta, log_f, *, chunk: int = 64, initial_state=None,
                              return_state: bool = False):
    r"""Chunkwise-parallel form: :func:`pathedu.path.householder_chunked` with the gate carried alongside.

    Chunk ``c`` covers ``[s, e]``; ``S`` (Dv x D) is the state after chunk ``c-1``.
    From the chunk's own UT factor ``A_c`` (``q~``, ``k~``, ``Ã_c`` and
    ``P_c = H_s ... H_e = I - W_c^T A_c^T W_c`` as in :func:`pathedu.path.householder_chunked`)
    and its local gates ``b_i = sum_{r=s..i} log_f[r]``, ``g~_j = sum_{r=j+1..e} log_f[r]``,
    ``Gamma_c[i, j] = exp(sum_{r=j+1..i} log_f[r])`` (0 above the diagonal)::

        O_c = diag(e^b) Q~_c S^T + (Ã_c * Gamma_c) V_c                      (inter-chunk + intra-chunk)
        S  <- e^{b_e} S P_c + V_c^T diag(e^{g~}) K~_c

    The UT factor needs no decay: the gates commute with the transitions and
    factor out of every product.  Every exponent is a sum of gates, <= 0.
    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`pathfox_naive`.
    """
    n, dt, (chunk,) = _validate(q, k, v, w, beta, log_f, tuning=(("chunk", chunk),))
    S = _initial_state(initial_state, n, q, dtype=dt)
    q_, k_, v_, w_, b_, g = _cast(dt, q, k, v, w, beta, log_f)
    v_finite = bool(torch.isfinite(v_).all())  # one check for every chunk's intra-chunk product
    outs = []
    for s in range(0, n.T, chunk):
        e = min(s + chunk, n.T)
        wc, vc, gc = w_[..., s:e, :], v_[..., s:e, :], g[..., s:e]
        A, intra, q_tilde, k_tilde = path._block_factors(q_[..., s:e, :], k_[..., s:e, :], wc, b_[..., s:e])
        b = gc.cumsum(-1)  # block start to i, <= 0
        decay = torch.exp(fox._log_gate_matrix(gc))  # masked (-inf) before exp: 0 above the diagonal
        outs.append((torch.exp(b)[..., None] * q_tilde) @ S.transpose(-1, -2)
                    + causal_matmul((intra * decay).tril(), vc, finite=v_finite))
        S_P = S - (S @ wc.transpose(-1, -2)) @ A.transpose(-1, -2) @ wc  # S P_c
        k_decayed = torch.exp(_gate_after(gc))[..., None] * k_tilde  # rows e^{g~_j} k~_j
        S = torch.exp(b[..., -1, None, None]) * S_P + vc.transpose(-1, -2) @ k_decayed
    out = torch.cat(outs, dim=-2).to(q.dtype) if outs else empty_output(q, v)
    return (out, S.to(q.dtype)) if return_state else out


def gated_householder_triton(q, k, v, w, beta, log_f, *, initial_state=None, return_state: bool = False):
    """The gated Householder RNN in Triton: :func:`pathedu.kernels.delta_rule.chunked_householder`
    with ``log_f``.

    Chapter 5's chunked kernel (the UT preparation pass, then the linear template's
    ``"householder"`` hook) with the template's scalar ``DECAY`` hook on top: the UT
    factors stay gate-free, and the gate rescales the inter-chunk rows by ``e^{b_i}``,
    the in-chunk scores by ``e^{b_i - b_j}`` and the carried state by ``e^{b_last}``, as
    in :func:`gated_householder_chunked`.  fp16/bf16/fp32 ``q, k, v``; ``w``, ``beta``,
    ``log_f`` used in fp32; head dims 16..128; any T; validated once by the kernel's
    entry point.  Shapes as :func:`pathfox_naive`.  ``initial_state`` / ``return_state`` as
    :func:`gated_householder_recurrent` (the returned state is fp32).  Differentiable in every tensor argument,
    ``initial_state`` included, and through the returned state (the kernel's backward pass).
    """
    from .kernels.delta_rule import chunked_householder

    return chunked_householder(q, k, v, w, beta, log_f=log_f, initial_state=initial_state,
                               return_state=return_state)


# ---------------------------------------------------------------------------
# Linear side: Gated DeltaNet (the gated Householder RNN with w = k, values beta * v)
# ---------------------------------------------------------------------------

def gated_deltanet_naive(q, k, v, beta, log_f):
    """The unrolled gated delta rule, loops and explicit products::

        o_i = sum_{j<=i} exp(sum_{s=j+1..i} log_f[s]) beta_j (k_j^T H_{j+1} ... H_i q_i) v_j,
        H_s = I - beta_s k_s k_s^T

    This is :func:`gated_householder_naive` with ``w = k`` and values ``beta * v``.
    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``beta`` (in [0, 2]) and
    ``log_f`` (<= 0): ``(..., T)`` -> ``(..., T, Dv)``.
    """
    n, dt, _ = _validate(q, k, v, None, beta, log_f)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, b_, g = _cast(dt, q, k, v, beta, log_f)
    return _gated_unrolled(q_, k_, b_[..., None] * v_, k_, b_, g, n).to(q.dtype)


def gated_deltanet_recurrent(q, k, v, beta, log_f, *, initial_state=None, return_state: bool = False):
    """The gated delta rule, token by token::

        S' = a_t S_{t-1},    S_t = S' + beta_t (v_t - S' k_t) k_t^T,    o_t = S_t q_t

    (``= a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``).  As online
    regression: ``S'`` is a weight-decay step on ``(1/2)|S|_F^2`` with step
    ``1 - a_t``, then ``S_t = S' - beta_t grad l_t(S')`` with
    ``l_t(S) = (1/2) |S k_t - v_t|_2^2``, the gradient taken at the decayed state.
    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`gated_deltanet_naive`.
    """
    n, dt, _ = _validate(q, k, v, None, beta, log_f)
    S = _initial_state(initial_state, n, q, dtype=dt)
    q_, k_, v_, b_, g = _cast(dt, q, k, v, beta, log_f)
    outs = []
    for t in range(n.T):
        k_t = k_[..., t, :]
        S = torch.exp(g[..., t, None, None]) * S  # weight decay: S' = a_t S_{t-1}
        error = v_[..., t, :] - (S @ k_t[..., :, None])[..., 0]  # v_t - S' k_t = -grad of l_t, read through k_t
        S = S + b_[..., t, None, None] * error[..., :, None] * k_t[..., None, :]
        outs.append((S @ q_[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2).to(q.dtype) if outs else empty_output(q, v)
    return (out, S.to(q.dtype)) if return_state else out


def gated_deltanet_matrix(q, k, v, beta, log_f):
    r"""Parallel form: pseudo-values from one triangular solve, then gated linear attention::

        Gamma_ij = exp(sum_{s=j+1..i} log_f[s])        (0 above the diagonal)
        B = diag(beta) (K K^T * Gamma * M^-),    U = (I + B)^{-1} diag(beta) V,    O = (Q K^T * Gamma * M) U

    ``M^-``: strictly lower (j < i); ``M``: lower, diagonal included; both selects.
    ``S_t = sum_{j<=t} Gamma_tj u_j k_j^T`` with
    ``u_t = beta_t (v_t - sum_{j<t} Gamma_tj (k_t . k_j) u_j)``: what token ``t`` writes.
    The solve is done in float32 or wider.  Shapes as :func:`gated_deltanet_naive`.
    """
    n, dt, _ = _validate(q, k, v, None, beta, log_f)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, b_, g = _cast(dt, q, k, v, beta, log_f)
    gamma = torch.exp(fox._log_gate_matrix(g))  # masked (-inf) before exp: 0 above the diagonal
    # The masks are selects (tril) applied after every product, and (Q K^T * Gamma * M) meets U through
    # causal_matmul: a non-finite k_t or v_t makes u_j non-finite for j >= t only (forward substitution).
    B = (b_[..., :, None] * (k_ @ k_.transpose(-1, -2)) * gamma).tril(-1)
    eye = torch.eye(n.T, dtype=dt, device=q.device)
    U = torch.linalg.solve_triangular(eye + B, b_[..., None] * v_, upper=False, unitriangular=True)
    return causal_matmul(((q_ @ k_.transpose(-1, -2)) * gamma).tril(), U).to(q.dtype)


def gated_deltanet_chunked(q, k, v, beta, log_f, *, chunk: int = 64, initial_state=None,
                           return_state: bool = False):
    r"""Chunkwise-parallel gated delta rule: the WY representation per chunk, with decay inside the chunk.

    Chunk ``c`` covers ``[s, e]``; ``S`` (Dv x D) is the state after chunk ``c-1``;
    local gates ``b_i = sum_{r=s..i} log_f[r]``, ``g~_j = sum_{r=j+1..e} log_f[r]``,
    ``Gamma_c[i, j] = exp(sum_{r=j+1..i} log_f[r])`` (0 above the diagonal).  Inside the chunk
    ``a_t S_{t-1} = e^{b_t} S + sum_{j<t} Gamma_c[t, j] u_j k_j^T``, so the pseudo-values
    ``u_t = beta_t (v_t - a_t S_{t-1} k_t)`` solve one unit lower-triangular system::

        T_c = (I + diag(beta_c) (K_c K_c^T * Gamma_c * M^-))^{-1}           (C x C)
        W_c = T_c diag(beta_c e^b) K_c,    U~_c = T_c diag(beta_c) V_c        (the WY factors, decay inside)
        U_c = U~_c - W_c S^T                                                  (pseudo-values given S)
        O_c = diag(e^b) Q_c S^T + (Q_c K_c^T * Gamma_c * M) U_c
        S  <- e^{b_e} S + U_c^T diag(e^{g~}) K_c

    Unlike :func:`gated_householder_chunked` (whose UT factor is gate-free),
    the decay enters ``T_c``: each ``u_t`` is corrected by what the *decayed*
    state already predicts.  Every exponent is a sum of gates, <= 0, masked
    before ``exp``.  ``initial_state``/returned state: ``(..., Dv, D)``.
    Shapes as :func:`gated_deltanet_naive`.
    """
    n, dt, (chunk,) = _validate(q, k, v, None, beta, log_f, tuning=(("chunk", chunk),))
    S = _initial_state(initial_state, n, q, dtype=dt)
    q_, k_, v_, b_, g = _cast(dt, q, k, v, beta, log_f)
    # T_c, W_c, U~_c and U_c are causal (row r depends on tokens <= r); their products with
    # lower-triangular weights go through causal_matmul so that zero weights never meet a
    # non-finite k_t or v_t of a later row (checked once here).
    kv_finite = bool(torch.isfinite(k_).all() & torch.isfinite(v_).all())
    outs = []
    for s in range(0, n.T, chunk):
        e = min(s + chunk, n.T)
        qc, kc, vc, bc, gc = q_[..., s:e, :], k_[..., s:e, :], v_[..., s:e, :], b_[..., s:e], g[..., s:e]
        b = gc.cumsum(-1)
        gamma = torch.exp(fox._log_gate_matrix(gc))
        eye = torch.eye(e - s, dtype=dt, device=q.device)
        B = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * gamma).tril(-1)
        T_c = torch.linalg.solve_triangular(eye + B, eye.expand_as(B), upper=False, unitriangular=True)
        W_c = causal_matmul(T_c, (bc * torch.exp(b))[..., None] * kc, finite=kv_finite)
        U = causal_matmul(T_c, bc[..., None] * vc, finite=kv_finite) - W_c @ S.transpose(-1, -2)
        outs.append(torch.exp(b)[..., None] * (qc @ S.transpose(-1, -2))
                    + causal_matmul(((qc @ kc.transpose(-1, -2)) * gamma).tril(), U, finite=kv_finite))
        S = torch.exp(b[..., -1, None, None]) * S + U.transpose(-1, -2) @ (torch.exp(_gate_after(gc))[..., None] * kc)
    out = torch.cat(outs, dim=-2).to(q.dtype) if outs else empty_output(q, v)
    return (out, S.to(q.dtype)) if return_state else out


def gated_deltanet_triton(q, k, v, beta, log_f, *, factor_dtype=None, initial_state=None,
                          return_state: bool = False):
    """Gated DeltaNet in Triton: :func:`pathedu.kernels.delta_rule.chunked_delta_rule` with ``log_f``.

    :func:`gated_deltanet_chunked` in a kernel: the WY factors with the decay inside the
    triangular solve (the preparation pass), then the linear template's ``"delta"`` hook with
    its scalar ``DECAY`` hook on top.  (:func:`gated_householder_triton` keeps its UT factors
    gate-free instead; both factorisations agree.)
    fp16/bf16/fp32 ``q, k, v``; ``beta`` (in [0, 2]) and ``log_f`` (<= 0) used in fp32;
    head dims 16..128.  Shapes as :func:`gated_deltanet_naive`.  ``factor_dtype``: the stored WY factors' dtype
    (None: bf16 for bf16 inputs, fp32 otherwise; ``torch.float32`` is closer to float64 and slower).
    ``initial_state`` / ``return_state`` as :func:`gated_deltanet_recurrent` (the returned state is fp32).
    Differentiable in every tensor argument, ``initial_state`` included, and through the returned state (the
    kernel's backward pass).
    """
    from .kernels.delta_rule import chunked_delta_rule

    return chunked_delta_rule(q, k, v, beta, log_f=log_f, factor_dtype=factor_dtype, initial_state=initial_state,
                              return_state=return_state)
