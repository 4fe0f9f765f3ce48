r"""ALiBi softmax attention and RetNet's constant-decay linear attention: every form of both sides.

Linear side (RetNet's retention without its rotation and normalisation, a
constant forget gate ``gamma`` per head, no scale)::

    S_t = gamma S_{t-1} + v_t k_t^T,     o_t = S_t q_t      (S_t is Dv x D)

Unrolled, ``o_i = sum_{j<=i} gamma^(i-j) (q_i . k_j) v_j``: the product of the
``i - j`` gates between key ``j`` and query ``i`` is ``gamma^(i-j)``.  With
``gamma = exp(-slope)`` that product is ``exp(-slope (i-j))``, and its logarithm
read as an additive logit bias is ALiBi's (softmax side)::

    o_i = sum_{j<=i} softmax_j(scale * q_i . k_j - slope * (i - j)) v_j

The bias is always ``<= 0``: ALiBi *penalises* distance (a positive bias
``+slope (i-j)`` would favour the oldest tokens).

Arguments shared by every form:

* ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, output ``(..., T, Dv)``; the
  leading dims (batch, heads, ...) must agree.  Positions are 0-based, ``i`` is
  the query, ``j <= i`` the key.
* ``slope``: a float or a tensor broadcastable to the leading dims (one slope
  per head, e.g. ``alibi_slopes(H)`` for leading dims ``(B, H)``); finite and
  ``>= 0``.
* ``gamma``: a float or a tensor broadcastable to the leading dims; in ``(0, 1]``.
* ``scale`` (softmax side only): ``None`` means ``D ** -0.5``.  The bias is not
  multiplied by ``scale``.

Forms, from the definition towards the kernel:

================  ==================================  ==================================
form              softmax side (ALiBi)                linear side (RetNet)
================  ==================================  ==================================
naive             ``alibi_naive``: loop over i        ``retnet_naive``: loop over i
recurrent         ``alibi_recurrent``: KV cache,      ``retnet_recurrent``: state S_t
                  bias added as the cache is read
matrix            ``alibi_matrix``: softmax(QK^T+B)   ``retnet_matrix``: (QK^T * D) V
blockwise         ``alibi_blockwise``: online         ``retnet_chunked``: chunks +
                  softmax over key blocks + bias      decayed carried state
Triton            ``alibi_triton``: bias hook of      ``retnet_triton``: scalar-gate hook
                  the FlashAttention template         of the chunked template
================  ==================================  ==================================

Helpers: :func:`alibi_bias` (the matrix ``B``), :func:`retnet_decay` (the
matrix ``D = exp(B)``), :func:`alibi_slopes`, :func:`retnet_gammas`,
:func:`slope_to_gamma`, :func:`gamma_to_slope`, :func:`half_life`.

Non-finite inputs: a NaN or inf in ``q``, ``k`` or ``v`` at position t changes
only the outputs at positions >= t (masks are selects, and masked weights never
multiply it: :func:`pathedu.masks.causal_matmul`).
"""
from __future__ import annotations

import math
import numbers

import torch

from .checks import QKV, check_device, check_int, check_positive_int, check_qkv, check_scale, range_condition, require
from .masks import causal_mask, causal_matmul, masked_logits
from .nope import _initial_state, blockwise_softmax, causal_softmax, chunk_scan, decode_with_cache, empty_output

__all__ = [
    "alibi_naive", "alibi_recurrent", "alibi_matrix", "alibi_blockwise", "alibi_triton",
    "retnet_naive", "retnet_recurrent", "retnet_matrix", "retnet_chunked", "retnet_triton",
    "alibi_bias", "retnet_decay", "alibi_slopes", "retnet_gammas", "slope_to_gamma", "gamma_to_slope",
    "half_life",
]


# ---------------------------------------------------------------------------
# Validation of the per-head arguments (slope, gamma)
# ---------------------------------------------------------------------------

def _as_tensor(x, name: str) -> torch.Tensor:
    """A real number or a real tensor as a float64 tensor (values are checked in float64)."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"`{name}` must be a real tensor, got dtype {x.dtype}")
        check_device(x, name)
        return x.to(torch.float64)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"`{name}` must be a float or a tensor, got {type(x).__name__}")
    return torch.tensor(float(x), dtype=torch.float64)


def slope_condition(t: torch.Tensor, name: str = "slope"):
    """ALiBi's slopes ``t`` finite and ``>= 0``: a :class:`pathedu.checks.Condition` (one reduction)."""
    return range_condition(t, name, 0.0, float("inf"), " (ALiBi's bias -slope*(i-j) penalises distance)",
                           finite=True)


def gamma_condition(t: torch.Tensor, name: str = "gamma"):
    """RetNet's gates ``t`` in ``(0, 1]``: a :class:`pathedu.checks.Condition` (one reduction)."""
    return range_condition(t, name, 0.0, 1.0, " (a forget gate that shrinks the state)", lo_open=True)


def _check_slope_values(t: torch.Tensor, name: str = "slope") -> None:
    require(slope_condition(t, name))


def _check_gamma_values(t: torch.Tensor, name: str = "gamma") -> None:
    require(gamma_condition(t, name))


def _per_head(x, name: str, n: QKV, like: torch.Tensor, check, dtype=None) -> torch.Tensor:
    """Validate a float or a tensor broadcastable to the leading dims ``n.lead``; return it
    as a tensor of shape ``n.lead + (1, 1)`` (ready to broadcast against ``(..., T, T)``)
    in ``dtype`` (default: ``like``'s dtype) on ``like``'s device.  ``check(t, name)``
    reads the values (one host synchronisation); a public form calls this once."""
    t = _as_tensor(x, name)
    check(t, name)
    try:
        t = torch.broadcast_to(t.to(like.device), n.lead)
    except RuntimeError:
        raise ValueError(f"`{name}` of shape {tuple(t.shape)} does not broadcast to the leading dims {n.lead} "
                         f"(pass a float, or one value per head)") from None
    return t.to(like.dtype if dtype is None else dtype)[..., None, None]


def _slope(slope, n, like, dtype=None):
    return _per_head(slope, "slope", n, like, _check_slope_values, dtype)


def _gamma(gamma, n, like, dtype=None):
    return _per_head(gamma, "gamma", n, like, _check_gamma_values, dtype)


def _positions(T: int, device) -> torch.Tensor:
    """``(T, T)`` distances ``i - j`` (row = query i, column = key j); negative above the diagonal."""
    idx = torch.arange(T, device=device)
    return idx[:, None] - idx[None, :]


# ---------------------------------------------------------------------------
# Slopes, gammas and their conversions
# ---------------------------------------------------------------------------

def slope_to_gamma(slope):
    """``gamma = exp(-slope)``: the RetNet gate whose unrolled product is ALiBi's bias.

    ``slope`` a float (returns a float) or a tensor (returns a tensor); finite, ``>= 0``.
    ``slope = 0`` gives ``gamma = 1`` (NoPE <-> plain linear attention, chapter 1).
    """
    t = _as_tensor(slope, "slope")
    _check_slope_values(t)
    if isinstance(slope, torch.Tensor):
        return torch.exp(-slope.to(torch.promote_types(slope.dtype, torch.float32)))
    return math.exp(-float(slope))


def gamma_to_slope(gamma):
    """``slope = -log(gamma)``, the inverse of :func:`slope_to_gamma`; ``gamma`` in ``(0, 1]``."""
    t = _as_tensor(gamma, "gamma")
    _check_gamma_values(t)
    if isinstance(gamma, torch.Tensor):
        return -torch.log(gamma.to(torch.promote_types(gamma.dtype, torch.float32)))
    return -math.log(float(gamma))


def half_life(gamma):
    """Tokens after which the decay ``gamma^d`` has halved: ``d = log(1/2) / log(gamma)``
    (``inf`` for ``gamma = 1``).  ``gamma`` a float in ``(0, 1]``."""
    t = _as_tensor(gamma, "gamma")
    _check_gamma_values(t)
    return math.inf if float(gamma) == 1.0 else math.log(0.5) / math.log(float(gamma))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The per-head slopes of the ALiBi paper, as a float64 tensor ``(n_heads,)``.

    For ``n`` a power of two: the geometric sequence that starts at ``2^(-8/n)``
    and has that same ratio, ``2^(-8 h / n)`` for heads ``h = 1..n`` (8 heads:
    ``1/2, 1/4, ..., 1/256``).  For other ``n``: the slopes of the largest power
    of two ``p < n``, followed by every other slope of ``2p`` heads
    (``2^(-8(2h-1)/(2p))``, ``h = 1..n-p``), i.e. the sequence for ``2p`` heads
    with the ones already used left out.  The order is the paper code's: head
    ``h`` gets entry ``h``.
    """
    n = check_int(n_heads, "n_heads")
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    slopes = [2.0 ** (-8.0 * h / p) for h in range(1, p + 1)]
    # Odd entries (1st, 3rd, ...) of the 2p-head sequence fall between the p-head ones.
    slopes += [2.0 ** (-8.0 * (2 * h - 1) / (2 * p)) for h in range(1, n - p + 1)]
    return torch.tensor(slopes, dtype=torch.float64)


def retnet_gammas(n_heads: int) -> torch.Tensor:
    """RetNet's per-head decays ``gamma_h = 1 - 2^(-5-h)``, ``h = 0..n-1``, float64 ``(n_heads,)``.

    Half-lives from about 22 tokens (head 0) upwards, doubling head by head.
    """
    n = check_int(n_heads, "n_heads")
    return 1.0 - 2.0 ** (-5.0 - torch.arange(n, dtype=torch.float64))


def alibi_bias(T: int, slope, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """ALiBi's additive bias matrix ``B``, row = query ``i``, column = key ``j``:
    ``B_ij = -slope (i - j)`` for ``j <= i`` and ``-inf`` for ``j > i`` (the causal mask).

    ``slope``: a float or a tensor of any shape ``S`` (finite, ``>= 0``); returns
    ``S + (T, T)``.  ``exp(B)`` is :func:`retnet_decay` with ``gamma = exp(-slope)``.
    """
    t = _as_tensor(slope, "slope")
    _check_slope_values(t)
    return masked_logits(_distance_bias(T, t.to(dtype=dtype, device=device)), causal_mask(T, device))


def _distance_bias(T: int, lam: torch.Tensor) -> torch.Tensor:
    """``-lam (i - j)`` for every ``(i, j)``, unmasked (positive above the diagonal): ``lam.shape + (T, T)``.
    ``lam`` already validated; the result is in its dtype, on its device."""
    return -lam[..., None, None] * _positions(T, lam.device).to(lam.dtype)


def retnet_decay(T: int, gamma, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """RetNet's decay matrix ``D``, row = query ``i``, column = key ``j``:
    ``D_ij = gamma^(i - j)`` for ``j <= i`` and ``0`` for ``j > i``.

    ``gamma``: a float or a tensor of any shape ``S``, in ``(0, 1]``; returns ``S + (T, T)``.
    Powers are taken directly (no ``exp(log)``), so tiny gammas underflow to 0, never NaN.
    """
    t = _as_tensor(gamma, "gamma")
    _check_gamma_values(t)
    return _decay_powers(T, t.to(dtype=dtype, device=device)).tril()


def _decay_powers(T: int, g: torch.Tensor) -> torch.Tensor:
    """``g^max(i - j, 0)`` for every ``(i, j)``, unmasked (1 above the diagonal): ``g.shape + (T, T)``.
    ``g`` already validated; the result is in its dtype, on its device."""
    return g[..., None, None] ** _positions(T, g.device).clamp_min(0).to(g.dtype)


# ---------------------------------------------------------------------------
# Softmax side: ALiBi
# ---------------------------------------------------------------------------

def _per_query(q, k, v, n: QKV, weights) -> torch.Tensor:
    """The naive forms' loop, one query at a time: ``o_i = weights(dist, qk) V_{<=i}`` with
    ``dist: (i+1,)`` = ``i - j`` and ``qk: (..., i+1)`` = ``q_i . k_j`` for ``j = 0..i``.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``.
    """
    if n.T == 0:
        return empty_output(q, v)
    outs = []
    for i in range(n.T):
        dist = i - torch.arange(i + 1, device=q.device, dtype=q.dtype)  # i - j for j = 0..i
        qk = torch.einsum("...d,...jd->...j", q[..., i, :], k[..., : i + 1, :])
        outs.append(torch.einsum("...j,...jd->...d", weights(dist, qk), v[..., : i + 1, :]))
    return torch.stack(outs, dim=-2)


def alibi_naive(q, k, v, slope, *, scale=None):
    """The definition, one query at a time:
    ``o_i = softmax_j(scale q_i . k_j - slope (i - j))_{j<=i} V_{<=i}``.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``; ``slope``
    a float or broadcastable to the leading dims, ``>= 0``.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    lam = _slope(slope, n, q)[..., 0]  # (..., 1)
    return _per_query(q, k, v, n, lambda dist, qk: torch.softmax(scale * qk - lam * dist, dim=-1))


def alibi_recurrent(q, k, v, slope, *, scale=None, page: int = 64):
    """Decoding: token by token, append ``(k_t, v_t)`` to a :class:`pathedu.nope.KVCache`,
    then attend with the ALiBi bias added as each page of the cache is read.

    The bias ``-slope (t - j)`` depends only on the distance between the query
    ``t`` (the newest token) and the cached key ``j``, so the cache stores plain
    keys.  (Softmax ignores a per-query constant, so ``-slope t`` could be
    dropped and ``+slope j`` stored with each key instead; but ``slope j`` grows
    without bound, and large fp32 logits lose the digits that tell neighbours
    apart.)  O(t) memory and O(t D) work per token, against RetNet's fixed
    ``Dv x D`` state.  Shapes as :func:`alibi_naive`.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    lam = _slope(slope, n, q)[..., 0, 0]  # (...)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)

    def bias(t, start, end):  # -slope (t - j) for cached keys j = start..end-1
        return -lam[..., None] * (t - torch.arange(start, end, device=q.device, dtype=q.dtype))

    return decode_with_cache(q, k, v, scale, page=page, bias=bias)


def alibi_matrix(q, k, v, slope, *, scale=None):
    """Parallel form: ``softmax(scale Q K^T + B) V`` with ``B`` = :func:`alibi_bias`
    (``-slope (i-j)`` on and below the diagonal, ``-inf`` above).

    Shapes as :func:`alibi_naive`; O(T^2) memory for the logits.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    lam = _slope(slope, n, q)[..., 0, 0]
    if n.T == 0:
        return empty_output(q, v)
    # The bias is finite everywhere; the future is hidden afterwards, by a select (causal_softmax).
    return causal_softmax(scale * q @ k.transpose(-1, -2) + _distance_bias(n.T, lam), v)


def alibi_blockwise(q, k, v, slope, *, scale=None, block_m: int = 64, block_n: int = 64):
    """FlashAttention with ALiBi in PyTorch: the reference the Triton kernel's ``"alibi"`` hook follows.

    :func:`pathedu.nope.nope_blockwise` with one line added: each block of
    logits gets ``-slope (i - j)`` before the online-softmax update
    (:func:`pathedu.nope.online_softmax_step`).  The bias is computed from the
    block's row and column indices; no ``T x T`` matrix is ever formed.
    Shapes as :func:`alibi_naive`.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    lam = _slope(slope, n, q)  # (..., 1, 1)
    block_m, block_n = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if n.T == 0:
        return empty_output(q, v)
    bias = lambda rows, cols: -lam * (rows[:, None] - cols[None, :]).to(q.dtype)  # noqa: E731
    return blockwise_softmax(q, k, v, scale, bias=bias, block_m=block_m, block_n=block_n)


def alibi_triton(q, k, v, slope, *, scale=None):
    """ALiBi through the FlashAttention template's bias hook:
    :func:`pathedu.kernels.flash_attention.attention` with ``alibi_slope=slope``.

    fp16/bf16/fp32, head dims 16..128, fp32 accumulation.  Shapes as :func:`alibi_naive`
    (``slope``: a float or a tensor broadcastable to the leading dims, finite, >= 0).
    Every argument is validated by the kernel entry point
    (:func:`pathedu.kernels.flash_attention.biased_attention`; values read once the kernel is queued).
    """
    from .kernels.flash_attention import biased_attention

    return biased_attention(q, k, v, "alibi", slope, scale=scale, name="slope")


# ---------------------------------------------------------------------------
# Linear side: RetNet (constant decay)
# ---------------------------------------------------------------------------

def retnet_naive(q, k, v, gamma):
    """The definition: ``o_i = sum_{j<=i} gamma^(i-j) (q_i . k_j) v_j``, a loop over i.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``; ``gamma``
    a float or broadcastable to the leading dims, in ``(0, 1]``.
    """
    n = check_qkv(q, k, v)
    g = _gamma(gamma, n, q)[..., 0]  # (..., 1)
    return _per_query(q, k, v, n, lambda dist, qk: g ** dist * qk)


def retnet_recurrent(q, k, v, gamma, *, initial_state=None, return_state: bool = False):
    """The RNN: ``S_t = gamma S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``; O(D Dv) memory per step.

    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`retnet_naive`.
    """
    n = check_qkv(q, k, v)
    g = _gamma(gamma, n, q)  # (..., 1, 1)
    S = _initial_state(initial_state, n, q)
    outs = []
    for t in range(n.T):
        S = g * S + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2) if outs else empty_output(q, v)
    return (out, S) if return_state else out


def retnet_matrix(q, k, v, gamma):
    """Parallel form: ``(Q K^T * D) V`` with ``D`` = :func:`retnet_decay`
    (``gamma^(i-j)`` on and below the diagonal, 0 above).

    The 0 above the diagonal is a select (``tril``) and the product with ``V`` is
    :func:`pathedu.masks.causal_matmul`.  Shapes as :func:`retnet_naive`; O(T^2) memory.
    """
    n = check_qkv(q, k, v)
    g = _gamma(gamma, n, q)[..., 0, 0]
    return causal_matmul(((q @ k.transpose(-1, -2)) * _decay_powers(n.T, g)).tril(), v)


def retnet_chunked(q, k, v, gamma, *, chunk: int = 64):
    """Chunkwise-parallel form: the reference the chunked template's ``"scalar"`` gate follows.

    :func:`pathedu.nope.linear_chunked` with the decay put in.  With ``H = S^T``
    (``D x Dv``) the state after the previous chunk and ``r = 0..C-1`` a row's
    offset in the chunk of ``C`` tokens::

        O_c = (gamma^(r+1) Q_c) H + (Q_c K_c^T * D_C) V_c
        H  <- gamma^C H + (gamma^(C-1-r) K_c)^T V_c

    (``D_C`` = :func:`retnet_decay` of size C).  Every power is ``>= 0``, so
    nothing overflows however small gamma is.  Shapes as :func:`retnet_naive`.
    """
    n = check_qkv(q, k, v)
    g = _gamma(gamma, n, q)  # (..., 1, 1)
    chunk = check_positive_int(chunk, "chunk")

    def step(s, e, qc, kc, vc, H):
        C = e - s
        r = torch.arange(C, device=q.device, dtype=q.dtype)[:, None]  # (C, 1)
        intra = ((qc @ kc.transpose(-1, -2)) * _decay_powers(C, g[..., 0, 0])).tril()  # Q K^T * D_C, 0s by a select
        return (qc * g ** (r + 1)) @ H, intra, g ** C * H + (kc * g ** (C - 1 - r)).transpose(-1, -2) @ vc

    return chunk_scan(q, k, v, chunk, step)


def retnet_triton(q, k, v, gamma, *, initial_state=None, return_state: bool = False):
    """RetNet through the chunked template's scalar-gate hook:
    :func:`pathedu.kernels.linear_attention.chunked_linear_attention` with
    ``log_f = log(gamma)`` expanded to ``(..., T)`` (the same gate at every step).

    fp16/bf16/fp32, head dims 16..128, fp32 state.  Shapes as :func:`retnet_naive`
    (``gamma``: a float or a tensor broadcastable to the leading dims, in (0, 1]; its log
    is taken in float64).  ``initial_state`` / ``return_state`` as :func:`retnet_recurrent`
    (``(..., Dv, D)``; the returned state is fp32).  Differentiable in ``q, k, v``,
    ``initial_state`` and a ``gamma`` tensor that requires grad, and through the returned state.
    Every argument is validated by the kernel entry point
    (:func:`pathedu.kernels.linear_attention.gated_linear_attention`; values read once the kernel is queued).
    """
    from .kernels.linear_attention import gated_linear_attention

    return gated_linear_attention(q, k, v, "gamma", gamma, initial_state=initial_state, return_state=return_state)
