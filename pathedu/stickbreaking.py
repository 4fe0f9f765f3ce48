r"""Stick-breaking attention (Tan et al., 2024): a forget gate that depends on the query.

No softmax.  Each query breaks a stick of length 1, starting from the *nearest*
earlier key and walking back: key ``j`` takes the fraction ``sigma(z_ij)`` of
what the later keys left over.  With ``z_ij = scale * q_i . k_j`` (``scale=None``
means ``D ** -0.5``), 0-based positions and keys strictly before the query::

    A_ij = sigma(z_ij) * prod_{m=j+1..i-1} (1 - sigma(z_im))      (j < i; A_ij = 0 for j >= i)
    o_i  = sum_{j<i} A_ij v_j                                     (o_0 = 0: the first token sees nothing)

A token never attends to itself, and a row's weights sum to at most 1: what is
left, ``1 - sum_j A_ij = prod_{j<i} (1 - sigma(z_ij))``, is the stick nobody
took (:func:`stick_remainder`).

In log space, with ``1 - sigma(z) = sigma(-z)``::

    log A_ij = log sigma(z_ij) + sum_{m=j+1..i-1} log sigma(-z_im)

a cumulative log forget gate like FoX's ``sum_{s=j+1..i} log f_s``
(:mod:`pathedu.fox`), except that the gate of token ``m`` as seen from query
``i``, ``log sigma(-z_im)``, depends on the query as well as on the token; the
sum stops at ``i - 1`` (the query's own token is not a key of its row).
Every log-sigmoid is ``F.logsigmoid`` (``-softplus(-x)``, computed without
forming ``sigmoid(x)``): ``log(1 - sigmoid(x))`` in float32 is ``-inf`` from
``x ~ 17`` on (``sigmoid`` rounds to 1), where ``logsigmoid(-x) = -x`` is exact.
Every exponent of the log-space forms is <= 0, so no maximum is subtracted and
no normaliser is kept: the weights are at most 1 and cannot overflow.

Shapes everywhere: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, output
``(..., T, Dv)``; the leading dims (batch, heads, ...) must agree.  Reference
forms compute in the input dtype.

Non-finite inputs: a NaN or inf in ``q``, ``k`` or ``v`` at position t changes
only the outputs at positions >= t (masks are selects, applied *before* the
cumulative sums, and masked weights never multiply a value:
:func:`pathedu.masks.causal_matmul`).

================  ===================================================
form              stick-breaking attention
================  ===================================================
naive             ``stickbreaking_naive``: loops, the products of
                  the definition in linear space
recurrent         ``stickbreaking_recurrent``: decoding, a
                  :class:`StickBreakingCache` read right to left
matrix            ``stickbreaking_matrix``: log space, a reverse
                  cumulative sum along keys, strictly causal
blockwise         ``stickbreaking_blockwise``: key blocks right to
                  left, the log of the remaining stick carried
Triton            ``stickbreaking_triton``
================  ===================================================

Also: :func:`stickbreaking_weights` (the ``T x T`` matrix ``A``), :func:`stickbreaking_log_weights`
(``log A``, ``-inf`` where ``j >= i``) and :func:`stick_remainder` (what each row leaves over).
There is no linear-RNN dual with a fixed-size state: the gate ``sigma(-z_im)`` of a
past token changes with every new query, so the past cannot be folded into a state once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import check_positive_int, check_qkv, check_scale
from .masks import causal_mask, causal_matmul, masked_logits
from .nope import KVCache, empty_output

__all__ = [
    "stickbreaking_naive", "stickbreaking_recurrent", "stickbreaking_matrix", "stickbreaking_blockwise",
    "stickbreaking_triton", "stickbreaking_weights", "stickbreaking_log_weights", "stick_remainder",
    "StickBreakingCache",
]


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------

def _prepare(q, k, v, scale):
    n = check_qkv(q, k, v)
    return n, check_scale(scale, n.D)


def _suffix_sum(x):
    """``x: (..., N)`` -> ``(..., N)``: entry ``j`` is ``sum_{m > j} x[..., m]`` (strictly after ``j``;
    0 for the last entry).  Each entry is a sum of exactly its own terms, added from the right end
    (a cumulative sum of the flipped row, shifted by one), never a difference of two long sums."""
    return F.pad(x.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1))


def _log_weights(z):
    """``log A`` of validated logits ``z: (..., T, T)`` (row ``i`` = query, column ``j`` = key):
    ``log sigma(z_ij) + sum_{m=j+1..i-1} log sigma(-z_im)`` for ``j < i``, ``-inf`` for ``j >= i``.

    The gates ``log sigma(-z_im)`` of the keys a row does not see (``m >= i``) are set to 0 by a
    select *before* the reverse cumulative sum, so a NaN there never reaches the row."""
    seen = causal_mask(z.shape[-1], z.device, strict=True)
    log_gate = F.logsigmoid(-z).masked_fill(~seen, 0.0)  # log(1 - sigma(z_im)), 0 where m >= i
    return masked_logits(F.logsigmoid(z) + _suffix_sum(log_gate), seen)


def _block_log_weights(z, carry, seen=None):
    """One key block of the right-to-left scan (blockwise form, decoding cache, Triton kernel).

    ``z: (..., M, N)``: the logits of ``M`` query rows against ``N`` consecutive keys;
    ``carry: (..., M)``: ``sum log sigma(-z_im)`` over the keys ``m`` right of the block that each
    row sees (the log of the stick those keys left over); ``seen``: a boolean ``(M, N)`` mask of the
    keys each row sees (None: all of them).  Returns ``(log_w, carry')``: ``log_w: (..., M, N)`` the
    log weights (``-inf`` where not seen) and ``carry'`` the carry with this block's gates added."""
    log_gate = F.logsigmoid(-z)
    if seen is not None:
        log_gate = log_gate.masked_fill(~seen, 0.0)
    log_w = F.logsigmoid(z) + _suffix_sum(log_gate) + carry[..., None]
    if seen is not None:
        log_w = masked_logits(log_w, seen)
    return log_w, carry + log_gate.sum(-1)


# ---------------------------------------------------------------------------
# The weights
# ---------------------------------------------------------------------------

def stickbreaking_log_weights(q, k, *, scale=None):
    """``log A: (..., T, T)`` (row ``i`` = query, column ``j`` = key), from the log-space form::

        log A_ij = log sigma(z_ij) + sum_{m=j+1..i-1} log sigma(-z_im)    (j < i)

    with ``z_ij = scale * q_i . k_j``; ``-inf`` on and above the diagonal (``j >= i``).
    Shapes: ``q, k: (..., T, D)`` -> ``(..., T, T)``; computed in ``q``'s dtype.
    """
    n = check_qkv(q, k, k)
    scale = check_scale(scale, n.D)
    return _log_weights(scale * q @ k.transpose(-1, -2))


def stickbreaking_weights(q, k, *, scale=None):
    """The attention matrix ``A: (..., T, T)`` of stick-breaking attention (row ``i`` = query)::

        A_ij = sigma(z_ij) prod_{m=j+1..i-1} (1 - sigma(z_im))  for j < i,   0 for j >= i

    computed in log space (:func:`stickbreaking_log_weights`, then ``exp``).  Strictly lower
    triangular (row 0 is all zeros); every entry in [0, 1] and every row sum <= 1.
    Shapes: ``q, k: (..., T, D)`` -> ``(..., T, T)``.
    """
    return torch.exp(stickbreaking_log_weights(q, k, scale=scale))


def stick_remainder(q, k, *, scale=None):
    """What each query leaves of its stick: ``r_i = prod_{j<i} (1 - sigma(z_ij)) = 1 - sum_j A_ij``.

    Computed as ``exp(sum_{j<i} log sigma(-z_ij))`` (an empty product, 1, for ``i = 0``).
    Shapes: ``q, k: (..., T, D)`` -> ``(..., T)``.
    """
    n = check_qkv(q, k, k)
    scale = check_scale(scale, n.D)
    z = scale * q @ k.transpose(-1, -2)
    seen = causal_mask(n.T, q.device, strict=True)
    return torch.exp(F.logsigmoid(-z).masked_fill(~seen, 0.0).sum(-1))


# ---------------------------------------------------------------------------
# Forms
# ---------------------------------------------------------------------------

def stickbreaking_naive(q, k, v, *, scale=None):
    """The definition, literally: for each query ``i`` and key ``j < i``, the product of linear-space
    factors ``A_ij = sigma(z_ij) prod_{m=j+1..i-1} (1 - sigma(z_im))``, then ``o_i = sum_j A_ij v_j``
    (``o_0 = 0``).

    For reading, not for use: the factors ``1 - sigma(z)`` are formed as written, so in float32 they
    round to 0 from ``z ~ 17`` on (the true value ``e^{-z}`` is lost), which the log-space forms avoid.
    O(T^3) work.  Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``.
    """
    n, scale = _prepare(q, k, v, scale)
    if n.T == 0:
        return empty_output(q, v)
    outs = [q.new_zeros(n.lead + (n.Dv,))]  # o_0 = 0: no key before the first token
    for i in range(1, n.T):
        sig = torch.sigmoid(scale * torch.einsum("...d,...jd->...j", q[..., i, :], k[..., :i, :]))  # (..., i)
        weights = [sig[..., j] * torch.prod(1 - sig[..., j + 1:i], dim=-1) for j in range(i)]
        outs.append(torch.einsum("...j,...jd->...d", torch.stack(weights, dim=-1), v[..., :i, :]))
    return torch.stack(outs, dim=-2)


class StickBreakingCache(KVCache):
    """A decoding cache for stick-breaking attention: plain keys and values, read right to left.

    Nothing but ``k`` and ``v`` is stored: the gates ``sigma(-z_tm)`` depend on the query, so they
    are formed when the query arrives.  :meth:`read` walks the pages from the newest to the oldest
    and carries the log of the stick still left, ``sum log sigma(-z_tm)`` over the keys already
    passed; within a page, a reverse cumulative sum gives each key the gates of the keys after it.
    Every cached token is in the query's past (decoding attends *before* appending the query's
    own token), so no key is masked.  O(t D) work per token.

    Shapes: ``append(k_t: (..., D), v_t: (..., Dv))``; ``read(q_t: (..., D), scale) ->
    (o_t: (..., Dv), log_rest: (...))``; ``attend(q_t, scale) -> (..., Dv)``.
    """

    def read(self, q_t, scale):
        """The output for ``q_t`` and the log of the stick it leaves, ``sum_j log sigma(-z_tj)``
        (0 for an empty cache: the whole stick is left)."""
        carry = q_t.new_zeros(q_t.shape[:-1])  # log of the remaining stick: log 1 = 0
        acc = q_t.new_zeros(q_t.shape[:-1] + (self.Dv,))
        for start, end, k_p, v_p in reversed(list(self.pages())):  # newest page first
            z = scale * torch.einsum("...d,...jd->...j", q_t, k_p)
            log_w, carry = _block_log_weights(z[..., None, :], carry[..., None])  # one query row
            acc = acc + torch.einsum("...j,...jd->...d", torch.exp(log_w[..., 0, :]), v_p)
            carry = carry[..., 0]
        return acc, carry

    def attend(self, q_t, scale):
        return self.read(q_t, scale)[0]


def stickbreaking_recurrent(q, k, v, *, scale=None, page: int = 64):
    """Decoding: token by token, attend from ``q_t`` to a :class:`StickBreakingCache` of the earlier
    tokens, then append ``(k_t, v_t)`` (a token is not a key of its own row; ``o_0 = 0``).

    Unlike softmax decoding (:func:`pathedu.nope.nope_recurrent`) the cache cannot be read in any
    order: the stick is broken from the newest key back, so each query walks the cache right to
    left.  Shapes as :func:`stickbreaking_naive`.
    """
    n, scale = _prepare(q, k, v, scale)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)
    cache = StickBreakingCache(n.lead, n.D, n.Dv, n.T, dtype=q.dtype, device=q.device, page=page)
    outs = []
    for t in range(n.T):
        outs.append(cache.attend(q[..., t, :], scale))
        cache.append(k[..., t, :], v[..., t, :])
    return torch.stack(outs, dim=-2)


def stickbreaking_matrix(q, k, v, *, scale=None):
    """Parallel form, in log space::

        Z     = scale Q K^T
        G_im  = log sigma(-Z_im) for m < i, 0 otherwise           (a select, before any sum)
        log A = log sigma(Z) + (sum_{m > j} G_im)_ij, -inf for j >= i
        O     = exp(log A) V

    The sum over ``m = j+1 .. i-1`` is a reverse cumulative sum along the keys of each row.
    No maximum, no normaliser: ``log A <= 0``.  O(T^2) memory.  Shapes as :func:`stickbreaking_naive`.
    """
    n, scale = _prepare(q, k, v, scale)
    if n.T == 0:
        return empty_output(q, v)
    return causal_matmul(torch.exp(_log_weights(scale * q @ k.transpose(-1, -2))), v)


def stickbreaking_blockwise(q, k, v, *, scale=None, block_m: int = 64, block_n: int = 64):
    """The right-to-left scan in PyTorch: the reference :mod:`pathedu.kernels.stickbreaking` follows.

    For each block of ``block_m`` queries ``[s_m, e_m)``, visit the key blocks ``[s_n, e_n)`` of
    ``block_n`` keys (aligned at 0) from the last one any row sees (it holds key ``e_m - 2``) down
    to the first, carrying per row ``c_i = sum log sigma(-z_im)`` over the keys already passed
    (the log of the stick they left over; ``c = 0`` at the start).  In block ``[s_n, e_n)``::

        log w_ij = log sigma(z_ij) + sum_{m=j+1..e_n-1, m<i} log sigma(-z_im) + c_i
        acc_i   += sum_j w_ij v_j,        c_i += sum_{m in block, m<i} log sigma(-z_im)

    Only blocks that reach the query block (``e_n > s_m``) need the strict mask ``j < i``.
    Never a ``T x T`` matrix, no online-softmax rescaling (weights are final when computed).
    Shapes as :func:`stickbreaking_naive`.
    """
    n, scale = _prepare(q, k, v, scale)
    block_m, block_n = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if n.T == 0:
        return empty_output(q, v)
    v_finite = bool(torch.isfinite(v).all())  # one check for every masked block
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=q.dtype, device=q.device)
    for s_m in range(0, n.T, block_m):
        e_m = min(s_m + block_m, n.T)
        q_blk = q[..., s_m:e_m, :] * scale
        rows = torch.arange(s_m, e_m, device=q.device)
        carry = q.new_zeros(q_blk.shape[:-1])  # (..., M)
        acc = q.new_zeros(q_blk.shape[:-1] + (n.Dv,))
        for s_n in reversed(range(0, e_m - 1, block_n)):  # key blocks holding keys <= e_m - 2
            e_n = min(s_n + block_n, n.T)
            cols = torch.arange(s_n, e_n, device=q.device)
            z = q_blk @ k[..., s_n:e_n, :].transpose(-1, -2)
            masked = e_n > s_m  # the block reaches the query block: hide keys j >= i
            seen = cols[None, :] < rows[:, None] if masked else None
            log_w, carry = _block_log_weights(z, carry, seen)
            w, v_blk = torch.exp(log_w), v[..., s_n:e_n, :]
            acc = acc + (causal_matmul(w, v_blk, finite=v_finite) if masked else w @ v_blk)
        out[..., s_m:e_m, :] = acc
    return out


def stickbreaking_triton(q, k, v, *, scale=None):
    """Stick-breaking attention in Triton: :func:`pathedu.kernels.stickbreaking.stickbreaking_attention`.

    One program per query block scans key blocks right to left from the diagonal, carrying the
    log of the remaining stick per row (:func:`stickbreaking_blockwise`, tile by tile).  When autograd
    wants gradients of ``q``, ``k`` or ``v``, the output has a ``grad_fn``: the backward is two more
    kernels (a sweep over query blocks for ``dq``, one over key blocks for ``dk`` and ``dv``).  Accepts
    fp16/bf16/fp32 and head dims 16..128, accumulates in fp32.  Shapes as :func:`stickbreaking_naive`.  Every argument
    is validated by the kernel entry point.
    """
    from .kernels.stickbreaking import stickbreaking_attention

    return stickbreaking_attention(q, k, v, scale=scale)
