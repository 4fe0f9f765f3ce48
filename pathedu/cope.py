r"""CoPE, contextual position encoding (Golovneva et al., 2024): positions counted by gates.

Softmax attention whose position of key ``j`` seen from query ``i`` is not ``i - j`` but a
*count*: the sum of sigmoid gates that the query opens on the keys between them.  With
``z_ij = scale * q_i . k_j`` (``scale=None`` means ``D ** -0.5``)::

    g_ij   = sigmoid(z_ij)                              (j <= i; a gate in (0, 1))
    p_ij   = sum_{m=j..i} g_im,  clamped to [0, P - 1]  (both ends included)
    e(p)   = (1 - w) E[floor(p)] + w E[ceil(p)],  w = p - floor(p)
    logit_ij = z_ij + q_i . e(p_ij)                     (the position term is *not* scaled)
    o_i    = sum_{j <= i} softmax_j(logit_i.) v_j

``E = pos_emb`` is a learned table of ``P`` position embeddings (rows ``0 .. P-1``) and
``e(p)`` its linear interpolation at a fractional position.  Conventions: positions are
0-based; the sum over ``m = j..i`` includes the key itself and the query itself, so the
diagonal's position is ``p_ii = g_ii = sigmoid(z_ii)`` in (0, 1), and positions grow from
right to left (``p_ij > p_i,j+1``); they are clamped to ``[0, P - 1]`` *before* the
interpolation (a key farther than ``P - 1`` counted tokens gets ``E[P - 1]``).  When every
gate is 1 the position is ``i - j + 1``: a relative position; when gates open only on
selected tokens (ends of sentences, a chosen word), it counts those.

Unlike FoX's cumulative log gate ``D_ij`` (chapter 3), the count is a cumulative sum of
*linear* gates and depends on the query: each query ``i`` opens its own gates on the keys,
so the table of counts is a full ``T x T`` object, not a difference of per-token prefix sums.

The interpolation is computed on scalars (the paper's optimisation): ``q_i . e(p)`` is
linear in ``e``, so with ``qe = Q E^T`` (``(..., T, P)``, every integer position once)::

    q_i . e(p) = (1 - w) qe[i, floor(p)] + w qe[i, ceil(p)]

Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``pos_emb: (P, D)`` or broadcastable
to ``(..., P, D)`` (one table per head), output ``(..., T, Dv)``.  Reference forms compute
in float32 or wider (float64 when an input is float64) and return ``q``'s dtype.  A NaN or
inf in ``q``, ``k`` or ``v`` at position t changes only the outputs at positions >= t;
``pos_emb`` must be finite.

================  ========================================================================
form              what it does
================  ========================================================================
naive             ``cope_naive``: loops over i and j, vectors ``e(p)`` interpolated, then q . e
recurrent         ``cope_recurrent``: decoding with a KV cache; each query's gates over the
                  cache, summed page by page from the newest key back
matrix            ``cope_matrix``: every z, gate and count at once (a reverse cumulative sum),
                  ``qe = Q E^T`` gathered and interpolated
blockwise         ``cope_blockwise``: key blocks right to left from the query block, the
                  running count carried per row, online softmax
Triton            ``cope_triton`` (:mod:`pathedu.kernels.cope`)
================  ========================================================================

Also :func:`cope_positions` (the clamped or raw counts ``p``, for figures) and
:class:`CopeKVCache`.  CoPE has no linear-attention dual here: its position enters through a
gather indexed by a query-dependent count, which no fixed-size state can carry.
"""
from __future__ import annotations

import torch

from .checks import (FLOAT_DTYPES, QKV, check_device, check_positive_int, check_qkv, check_scale, finite_condition,
                     require)
from .masks import causal_mask, masked_logits
from .nope import KVCache, causal_softmax, empty_output, online_softmax_step

__all__ = ["cope_naive", "cope_recurrent", "cope_matrix", "cope_blockwise", "cope_triton", "cope_positions",
           "CopeKVCache", "check_pos_emb"]


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------

def check_pos_emb(pos_emb, n: QKV, like: torch.Tensor) -> int:
    """Validate ``pos_emb: (P, D)`` or ``(..., P, D)`` broadcastable to ``n.lead + (P, D)``; return ``P``.

    Shapes, dtype and device are checked here (``TypeError``/``ValueError`` naming ``pos_emb``);
    the value check (finite) is :func:`pos_emb_condition`, read by the caller with its other
    conditions (one host synchronisation).
    """
    if not isinstance(pos_emb, torch.Tensor):
        raise TypeError(f"`pos_emb` must be a torch.Tensor, got {type(pos_emb).__name__}")
    if pos_emb.dtype not in FLOAT_DTYPES:
        raise TypeError(f"`pos_emb` must have a floating dtype (float16/bfloat16/float32/float64), got {pos_emb.dtype}")
    check_device(pos_emb, "pos_emb")
    if pos_emb.dim() < 2:
        raise ValueError(f"`pos_emb` must have shape (P, D) or (..., P, D), got shape {tuple(pos_emb.shape)}")
    P, D = pos_emb.shape[-2:]
    if D != n.D:
        raise ValueError(f"head dim of `pos_emb` ({D}) differs from that of `q` ({n.D})")
    if P < 1:
        raise ValueError(f"`pos_emb` must hold at least one position (P >= 1), got shape {tuple(pos_emb.shape)}")
    lead = tuple(pos_emb.shape[:-2])
    ok = len(lead) <= len(n.lead)
    if ok:
        try:
            ok = tuple(torch.broadcast_shapes(lead, n.lead)) == n.lead
        except RuntimeError:
            ok = False
    if not ok:
        raise ValueError(f"`pos_emb` of shape {tuple(pos_emb.shape)} does not broadcast to {n.lead + (P, D)} "
                         f"(the leading dims of `q` {n.lead}, then P, D)")
    if pos_emb.device != like.device:
        raise ValueError(f"`pos_emb` must be on {like.device}, got {pos_emb.device}")
    return P


def pos_emb_condition(pos_emb):
    """Every entry of ``pos_emb`` finite, as a condition for :func:`pathedu.checks.require`."""
    return finite_condition(pos_emb, "pos_emb")


def _work_dtype(q, pos_emb) -> torch.dtype:
    """float32 or wider: counts of gates summed in 16-bit floats lose the digits that pick a position."""
    return torch.promote_types(torch.promote_types(q.dtype, pos_emb.dtype), torch.float32)


def _prepare(q, k, v, pos_emb, scale):
    """Validate every argument (one host sync); return ``(n, scale, P, dtype)``."""
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    P = check_pos_emb(pos_emb, n, q)
    require(pos_emb_condition(pos_emb))
    return n, scale, P, _work_dtype(q, pos_emb)


# ---------------------------------------------------------------------------
# The pieces every form shares
# ---------------------------------------------------------------------------

def _neighbours(p, P: int):
    """Clamp the counts ``p`` to ``[0, P - 1]``; return ``(lo, hi, w)``: the integer neighbours
    ``floor(p)``, ``ceil(p)`` (int64, same shape) and the weight ``w = p - floor(p)`` of ``hi``.

    A NaN count (a NaN key among those counted) indexes row 0, and its ``w`` stays NaN, so the
    logit it feeds is NaN, as the definition says."""
    p = p.clamp(0, P - 1)
    safe = torch.where(torch.isnan(p), torch.zeros((), dtype=p.dtype, device=p.device), p).detach()
    lo = torch.floor(safe)
    return lo.long(), torch.ceil(safe).long(), p - lo


def _position_logits(qe, p, P: int):
    """``q_i . e(p_ij)`` from the scalars ``qe = Q E^T`` (``(..., M, P)``, one row per query) and
    counts ``p`` (``(..., M, N)``): ``(1 - w) qe[i, floor p] + w qe[i, ceil p]``, a gather."""
    lo, hi, w = _neighbours(p, P)
    qe = qe.expand(p.shape[:-1] + (P,))
    return (1 - w) * qe.gather(-1, lo) + w * qe.gather(-1, hi)


def _qe(q, pos_emb):
    """``qe[..., i, n] = q_i . E[n]``: ``(..., T, D) x (..., P, D) -> (..., T, P)`` (pos_emb broadcast)."""
    return q @ pos_emb.transpose(-1, -2)


def _reverse_cumsum(g):
    """``out[..., j] = sum_{m >= j} g[..., m]`` along the last dim (keys summed from the right)."""
    return g.flip(-1).cumsum(-1).flip(-1)


def _counts(z, T: int):
    """The counts ``p_ij = sum_{m=j..i} sigmoid(z_im)`` of validated logits ``z: (..., T, T)`` (unclamped),
    0 above the diagonal: the gates of hidden keys are set to 0 by a select before the sum (a NaN
    key never reaches an earlier row)."""
    mask = causal_mask(T, z.device)
    g = torch.where(mask, torch.sigmoid(z), torch.zeros((), dtype=z.dtype, device=z.device))
    return _reverse_cumsum(g)


# ---------------------------------------------------------------------------
# The forms
# ---------------------------------------------------------------------------

def cope_positions(q, k, *, scale=None, P=None):
    """The contextual positions ``p: (..., T, T)`` (row ``i`` = query, column ``j`` = key).

    ``p_ij = sum_{m=j..i} sigmoid(scale q_i . k_m)`` for ``j <= i`` (both ends included, so
    ``p_ii = sigmoid(z_ii)``), 0 above the diagonal (no gate is counted there).  ``P=None``:
    the raw counts; ``P`` a positive int: clamped to ``[0, P - 1]`` as the forms use them.
    Shapes: ``q, k: (..., T, D)``; computed in float32 or wider, returned in ``q``'s dtype.
    """
    n = check_qkv(q, k, k)
    scale = check_scale(scale, n.D)
    if P is not None:
        P = check_positive_int(P, "P")
    dt = torch.promote_types(q.dtype, torch.float32)
    p = _counts(scale * q.to(dt) @ k.to(dt).transpose(-1, -2), n.T)
    if P is not None:
        p = p.clamp(0, P - 1)
    return p.to(q.dtype)


def cope_naive(q, k, v, pos_emb, *, scale=None):
    """The definition, one query and one key at a time.

    For each query ``i``, walk ``j = i, i-1, ..., 0`` adding the gate ``sigmoid(z_ij)`` to a
    running count (so the count of key ``j`` includes ``j`` and ``i``), clamp it to ``[0, P-1]``,
    interpolate the *vector* ``e(p) = (1 - w) E[floor p] + w E[ceil p]`` and take
    ``logit_ij = z_ij + q_i . e(p)``; then a softmax over ``j <= i``.  Shapes:
    ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``pos_emb: (P, D)`` or ``(..., P, D)`` -> ``(..., T, Dv)``.
    """
    n, scale, P, dt = _prepare(q, k, v, pos_emb, scale)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    E = pos_emb.to(dt).expand(n.lead + (P, n.D))
    outs = []
    for i in range(n.T):
        logits = [None] * (i + 1)
        count = torch.zeros(n.lead, dtype=dt, device=q.device)
        for j in range(i, -1, -1):
            z = scale * (q_[..., i, :] * k_[..., j, :]).sum(-1)
            count = count + torch.sigmoid(z)  # sum_{m=j..i} g_im
            lo, hi, w = _neighbours(count, P)
            e_lo = E.gather(-2, lo[..., None, None].expand(n.lead + (1, n.D)))[..., 0, :]
            e_hi = E.gather(-2, hi[..., None, None].expand(n.lead + (1, n.D)))[..., 0, :]
            e = (1 - w)[..., None] * e_lo + w[..., None] * e_hi
            logits[j] = z + (q_[..., i, :] * e).sum(-1)
        weights = torch.softmax(torch.stack(logits, dim=-1), dim=-1)
        outs.append(torch.einsum("...j,...jd->...d", weights, v_[..., : i + 1, :]))
    return torch.stack(outs, dim=-2).to(q.dtype)


class CopeKVCache(KVCache):
    """A decoding cache for CoPE: plain keys and values; the positions are recomputed by each query.

    A query's counts run over *its own* gates on the cached keys, so nothing about positions can
    be stored when a token is appended: :meth:`attend` reads the pages from the newest back,
    page by page, carrying each row's count of the gates already passed (the page's counts are a
    reverse cumulative sum plus that carry), and folds every page into an online softmax
    (:func:`pathedu.nope.online_softmax_step`, which does not care about the order of pages).
    O(t (D + P)) work per token; the cache is NoPE's.

    Shapes: ``append(k_t: (..., D), v_t: (..., Dv))``; ``attend(q_t: (..., D), scale, qe_t: (..., P))
    -> (..., Dv)`` with ``qe_t = E q_t`` (``qe_t[n] = q_t . E[n]``).
    """

    def attend(self, q_t, scale, qe_t):
        P = qe_t.shape[-1]
        m = torch.full(q_t.shape[:-1] + (1,), float("-inf"), dtype=q_t.dtype, device=q_t.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_t.shape[:-1] + (1, self.Dv), dtype=q_t.dtype, device=q_t.device)
        carry = torch.zeros(q_t.shape[:-1], dtype=q_t.dtype, device=q_t.device)  # gates of later pages
        for start, end, k_p, v_p in reversed(list(self.pages())):
            z = scale * torch.einsum("...d,...jd->...j", q_t, k_p)  # (..., n)
            g = torch.sigmoid(z)
            p = carry[..., None] + _reverse_cumsum(g)  # sum_{m=j..t} g_m for the page's keys
            carry = carry + g.sum(-1)
            s = z + _position_logits(qe_t[..., None, :], p[..., None, :], P)[..., 0, :]
            # Every cached token is in the query's past: no mask.
            m, l, acc = online_softmax_step(m, l, acc, s[..., None, :], v_p)
        return (acc / l[..., None])[..., 0, :]


def cope_recurrent(q, k, v, pos_emb, *, scale=None, page: int = 64):
    """Decoding: token by token, append ``(k_t, v_t)`` to a :class:`CopeKVCache`, then attend.

    The new query ``q_t`` computes its gates over the whole cache and their reverse cumulative
    sum (newest key first, page by page), interpolates ``q_t . e(p)`` from ``qe_t = E q_t`` and
    merges the pages with the online softmax.  Positions cannot be cached: they depend on the
    query.  Shapes as :func:`cope_naive`.
    """
    n, scale, P, dt = _prepare(q, k, v, pos_emb, scale)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    qe = _qe(q_, pos_emb.to(dt))  # (..., T, P)
    cache = CopeKVCache(n.lead, n.D, n.Dv, n.T, dtype=dt, device=q.device, page=page)
    outs = []
    for t in range(n.T):
        cache.append(k_[..., t, :], v_[..., t, :])
        outs.append(cache.attend(q_[..., t, :], scale, qe[..., t, :]))
    return torch.stack(outs, dim=-2).to(q.dtype)


def cope_matrix(q, k, v, pos_emb, *, scale=None):
    """Parallel form: every count at once, the position term gathered from ``qe = Q E^T``::

        Z = scale Q K^T,   G = sigmoid(Z) (0 above the diagonal, a select)
        p = reverse cumulative sum of G along keys, clamped to [0, P - 1]
        logits = Z + (1 - w) qe[i, floor p] + w qe[i, ceil p]
        O = softmax(logits + M) V

    O(T^2 (D + 1) + T P D) work and O(T^2) memory: ``q_i . E[n]`` is computed once per integer
    position, then interpolated as scalars.  Shapes as :func:`cope_naive`.
    """
    n, scale, P, dt = _prepare(q, k, v, pos_emb, scale)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_ = q.to(dt), k.to(dt)
    z = scale * q_ @ k_.transpose(-1, -2)
    logits = z + _position_logits(_qe(q_, pos_emb.to(dt)), _counts(z, n.T), P)
    return causal_softmax(logits, v.to(dt)).to(q.dtype)


def cope_blockwise(q, k, v, pos_emb, *, scale=None, block_m: int = 64, block_n: int = 64):
    """The blockwise algorithm in PyTorch: the reference :mod:`pathedu.kernels.cope` follows.

    For each block of ``block_m`` queries, key blocks of ``block_n`` rows are visited **right to
    left**, from the one holding the block's last query down to 0, because a key's count needs
    the gates of every key after it.  Each row carries ``c_i``, the sum of its gates on the keys
    already passed; in a block the counts are ``p_ij = c_i + sum_{m >= j in the block} g_im``
    (a reverse cumulative sum within the block), then ``c_i`` grows by the block's row sums.
    Gates of hidden keys (``j > i``, on the diagonal) are 0 by a select.  The logits of each
    block are folded into the online softmax (:func:`pathedu.nope.online_softmax_step`: the
    order of blocks does not matter to it).  Never a ``T x T`` matrix; ``qe = Q E^T`` is
    ``(..., T, P)``.  Shapes as :func:`cope_naive`.
    """
    n, scale, P, dt = _prepare(q, k, v, pos_emb, scale)
    block_m, block_n = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    qe = _qe(q_, pos_emb.to(dt))
    v_finite = bool(torch.isfinite(v_).all())  # one check for every diagonal block
    zero = torch.zeros((), dtype=dt, device=q.device)
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
    for start_m in range(0, n.T, block_m):
        end_m = min(start_m + block_m, n.T)
        rows = torch.arange(start_m, end_m, device=q.device)
        q_blk, qe_blk = q_[..., start_m:end_m, :], qe[..., start_m:end_m, :]
        m = torch.full(q_blk.shape[:-1], float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_blk.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
        carry = torch.zeros_like(m)  # per row: the gates of the key blocks already passed
        for start_n in range(((end_m - 1) // block_n) * block_n, -1, -block_n):
            end_n = min(start_n + block_n, n.T)
            cols = torch.arange(start_n, end_n, device=q.device)
            z = scale * q_blk @ k_[..., start_n:end_n, :].transpose(-1, -2)  # (..., M, N)
            g = torch.sigmoid(z)
            diagonal = end_n > start_m + 1
            if diagonal:  # the block reaches the diagonal: hidden keys open no gate
                visible = cols[None, :] <= rows[:, None]
                g = torch.where(visible, g, zero)
            p = carry[..., None] + _reverse_cumsum(g)
            carry = carry + g.sum(-1)
            s = z + _position_logits(qe_blk, p, P)
            if diagonal:
                s = masked_logits(s, visible)
            m, l, acc = online_softmax_step(m, l, acc, s, v_[..., start_n:end_n, :], masked=diagonal,
                                            finite=v_finite)
        out[..., start_m:end_m, :] = acc / l[..., None]
    return out.to(q.dtype)


def cope_triton(q, k, v, pos_emb, *, scale=None):
    """CoPE in Triton: :func:`pathedu.kernels.cope.cope_attention`.

    A pre-pass computes ``qe = Q E^T`` in fp32; the kernel scans key blocks right to left from
    the diagonal, as :func:`cope_blockwise`, with fp32 counts and online softmax.  Accepts
    fp16/bf16/fp32 ``q, k, v`` and head dims 16..128.  When autograd wants gradients (of ``q``, ``k``,
    ``v`` or ``pos_emb``), the output has a ``grad_fn``: two more kernels, and autograd through the
    pre-pass for ``pos_emb``.  Shapes as :func:`cope_naive`.  Every argument is validated
    by the kernel entry point (one host sync).
    """
    from .kernels.cope import cope_attention

    return cope_attention(q, k, v, pos_emb, scale=scale)
