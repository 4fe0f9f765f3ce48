r"""FoX softmax attention and GLA / Mamba2 linear attention: data-dependent forget gates.

Every token ``t`` carries a forget gate ``f_t = sigma(w . x_t + b)`` in (0, 1),
passed in log space, ``log_f[t] = logsigmoid(w . x_t + b) <= 0``
(:func:`forget_gate_logits_to_log_f`).  Between a key at ``j`` and a query at
``i >= j`` the gates of the tokens ``s = j+1 .. i`` act (a token's own gate
never acts on itself), so the *cumulative log gate* is::

    D_ij = sum_{s=j+1..i} log_f[s]   (<= 0; D_ii = 0)

Softmax side, the Forgetting Transformer (FoX): ``D`` is an additive logit
bias, a data-dependent ALiBi (constant ``log_f = -lambda`` gives ALiBi's
``-lambda (i - j)``)::

    o_i = sum_{j<=i} softmax_j(scale * q_i . k_j + D_ij) v_j

The gate is *not* multiplied by ``scale``.

Linear side, GLA / Mamba2: the gated recurrence, ``a_t = exp(log_f[t])``::

    S_t = S_{t-1} diag(a_t) + v_t k_t^T,     o_t = S_t q_t     (S_t is Dv x D)

with ``log_f`` either ``(..., T)``, one gate per token shared by all channels
(Mamba2-style; ``diag(a_t) = a_t I``), or ``(..., T, D)``, one gate per token
and key channel (GLA-style).  Unrolled, ``o_i = sum_{j<=i} v_j sum_d q_id k_jd
exp(D_ijd)``: with a scalar gate the weight is ``exp(D_ij) (q_i . k_j)``, the
same factor FoX puts on ``exp(scale q_i . k_j)``.

Gate sums are always formed in log space, as sums of ``log_f`` (never as
products of gates, which underflow), and are exponentiated only when the
exponent is known to be <= 0.  Reference forms compute in float32 or wider
(float64 when ``q`` or ``log_f`` is float64) and return ``q``'s dtype.

Shapes everywhere: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, output
``(..., T, Dv)``; the leading dims (batch, heads, ...) must agree.

Non-finite inputs: a NaN or inf in ``q``, ``k`` or ``v`` at position t changes
only the outputs at positions >= t (masks are selects, and masked weights never
multiply it: :func:`pathedu.masks.causal_matmul`); ``log_f`` must be finite.

================  ==============================  ==============================
form              softmax side (FoX)              linear side (GLA / Mamba2)
================  ==============================  ==============================
naive             ``fox_naive``: loop over i      ``gla_naive``: loop over i
recurrent         ``fox_recurrent``: KV cache +   ``gla_recurrent``: state S_t
                  running cumulative log gate
matrix            ``fox_matrix``: softmax(QK^T    ``gla_matrix``: (QK^T * e^D) V
                  + D) V
blockwise         ``fox_blockwise``: online       ``gla_chunked``: chunks +
                  softmax, bias c_i - c_j         carried state
Triton            ``fox_triton``                  ``gla_triton``
================  ==============================  ==============================
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import (QKV, check_device, check_floating, check_per_token, check_positive_int, check_qkv, check_scale,
                     log_gate_condition, require)
from .masks import causal_mask, causal_matmul, masked_logits
from .nope import KVCache, _initial_state, blockwise_softmax, causal_softmax, empty_output

__all__ = [
    "forget_gate_logits_to_log_f", "log_gate_matrix", "running_product", "ForgetKVCache",
    "fox_naive", "fox_recurrent", "fox_matrix", "fox_blockwise", "fox_triton",
    "gla_naive", "gla_recurrent", "gla_matrix", "gla_chunked", "gla_triton",
]


# ---------------------------------------------------------------------------
# Gates
# ---------------------------------------------------------------------------

def forget_gate_logits_to_log_f(x):
    """Raw gate scores ``x = w . x_t + b`` (any shape) -> ``log_f = log sigmoid(x) <= 0``.

    ``logsigmoid`` is computed without forming ``sigmoid(x)``, so strongly
    negative scores keep their value (``-200`` stays ``-200``, where
    ``log(sigmoid(-200))`` is ``-inf`` in float32).
    """
    check_floating(x, "x")
    return F.logsigmoid(x)


def _check_log_values(log_f) -> None:
    """Every entry a finite log gate: ``-inf < log_f <= 0`` (NaN fails too); one host sync."""
    require(log_gate_condition(log_f))


def _work_dtype(q, log_f) -> torch.dtype:
    """float32 or wider: gate sums in 16-bit floats would lose the digits that matter."""
    return torch.promote_types(torch.promote_types(q.dtype, log_f.dtype), torch.float32)


def running_product(f: float, n: int, dtype=torch.float32) -> torch.Tensor:
    """``(n,)``: the products ``p_t = f^t`` (``t = 1 .. n``) as a recurrence keeps them: one multiply per
    step, ``p_t = p_{t-1} * f`` rounded to ``dtype`` each time (on the CPU).

    Not ``torch.cumprod``: on a CPU that accumulates in double and rounds each prefix, so its float32 result
    reaches 0.  Step by step it does not: below the normal range a product ``m 2^-149`` times ``f`` rounds
    back to itself once ``m (1 - f) < 1/2``, and the product sticks at a subnormal (chapter 3).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"`n` must be a non-negative int, got {n!r}")
    if not 0 < f <= 1:
        raise ValueError(f"`f` must be a gate in (0, 1], got {f!r}")
    x = torch.ones((), dtype=dtype)
    g = torch.tensor(f, dtype=dtype)
    out = torch.empty(n, dtype=dtype)
    for t in range(n):
        x = x * g
        out[t] = x
    return out


def log_gate_matrix(log_f):
    """The cumulative log gate ``D: (..., T, T)`` of per-token log gates ``log_f: (..., T)``.

    ``D[..., i, j] = sum_{s=j+1..i} log_f[..., s]`` for ``j <= i`` (so ``D_ii = 0``)
    and ``-inf`` for ``j > i`` (the future, hidden).  Each entry is summed over
    exactly its own gates (for each key j, a running sum of ``log_f[s]`` over
    ``s > j``), not as a difference ``c_i - c_j`` of two long prefix sums, so
    no digits are lost to cancellation.  O(T^2) memory; the result is the
    transposed view of a contiguous key-major ``(..., T, T)`` tensor.
    """
    check_floating(log_f, "log_f")
    if log_f.dim() < 1:
        raise ValueError(f"`log_f` must have shape (..., T), got shape {tuple(log_f.shape)}")
    check_device(log_f, "log_f")
    _check_log_values(log_f)
    return _log_gate_matrix(log_f)


def _log_gate_matrix(log_f):
    """:func:`log_gate_matrix` of an already validated ``log_f``."""
    T = log_f.shape[-1]
    # Y[..., j, i] = sum_{j < s <= i} log_f[s]: keep log_f[s] for s > j in row j, sum along the row
    # (a cumulative sum along the last, contiguous dim), then read it transposed as D[..., i, j].
    Y = log_f[..., None, :].expand(log_f.shape[:-1] + (T, T)).triu(1).cumsum(-1)
    return Y.transpose(-1, -2).masked_fill_(~causal_mask(T, log_f.device), float("-inf"))


# ---------------------------------------------------------------------------
# Softmax side: FoX
# ---------------------------------------------------------------------------

def _prepare_fox(q, k, v, log_f, scale):
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    check_per_token(log_f, "log_f", n, q)
    _check_log_values(log_f)
    return n, scale, _work_dtype(q, log_f)


def fox_naive(q, k, v, log_f, *, scale=None):
    """The definition, one query at a time::

        o_i = softmax_j(scale q_i . k_j + sum_{s=j+1..i} log_f[s]) V_{<=i}

    The bias of each key is a sum over exactly its own gates, grown one gate at
    a time as ``i`` advances.  Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``,
    ``log_f: (..., T)`` with entries <= 0 -> ``(..., T, Dv)``.
    """
    n, scale, dt = _prepare_fox(q, k, v, log_f, scale)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, g = q.to(dt), k.to(dt), v.to(dt), log_f.to(dt)
    bias = torch.zeros_like(g)  # bias[..., j] = sum_{s=j+1..i}, grown as i advances
    outs = []
    for i in range(n.T):
        bias[..., :i] += g[..., i, None]  # token i's gate joins the sum of every earlier key; bias_ii = 0
        logits = scale * torch.einsum("...d,...jd->...j", q_[..., i, :], k_[..., : i + 1, :]) + bias[..., : i + 1]
        outs.append(torch.einsum("...j,...jd->...d", torch.softmax(logits, dim=-1), v_[..., : i + 1, :]))
    return torch.stack(outs, dim=-2).to(q.dtype)


class ForgetKVCache(KVCache):
    """A decoding cache for FoX: keys, values and each key's cumulative log gate.

    The cache keeps a running total ``c_t = sum_{s<=t} log_f[s]`` (``c_now``)
    and stores ``c_j`` next to ``k_j, v_j`` (in pages, like them).  Reading it
    at step ``t`` adds the bias ``c_t - c_j = sum_{s=j+1..t} log_f[s]`` to each
    logit, page by page, merged with :func:`pathedu.nope.online_softmax_step`.
    Appending a token costs O(1); nothing already cached is rewritten.

    ``c`` is kept in float64 whatever the working dtype: it grows without bound,
    and a float32 running total loses the small gates (after 1024 gates of
    -30, ``|c|`` is 3e4, where float32's spacing is 2e-3: each later gate of
    -1e-3 is rounded to -2e-3, and ``c_t - c_j``, a difference of two large
    numbers, is wrong by far more than the gates it should measure).  The
    difference is small, and is cast to the working dtype.

    Shapes: ``append(k_t: (..., D), v_t: (..., Dv), log_f_t: (...))``;
    ``attend(q_t: (..., D), scale) -> (..., Dv)``; ``c``: ``(..., len)``, float64.
    """

    def __init__(self, lead, D, Dv, T_max=None, *, dtype, device, page: int = 64):
        super().__init__(lead, D, Dv, T_max, dtype=dtype, device=device, page=page)
        self.c_pages: list[torch.Tensor] = []  # each (..., <= page), float64
        self.c_now = torch.zeros(tuple(lead), dtype=torch.float64, device=device)

    def append(self, k_t, v_t, log_f_t):
        self.c_now = self.c_now + log_f_t.to(torch.float64)
        self._write(self.c_pages, self.c_now[..., None], dim=-1)
        super().append(k_t, v_t)

    @property
    def c(self) -> torch.Tensor:
        return torch.cat(self.c_pages, dim=-1) if self.c_pages else \
            torch.empty(self.lead + (0,), dtype=torch.float64, device=self.device)

    def attend(self, q_t, scale):
        # sum_{s=j+1..t} log_f[s] = c_t - c_j (in float64), added as each page is read.
        def bias(start, end):
            c_page = self.c_pages[start // self.page]
            return (self.c_now[..., None] - c_page).to(q_t.dtype)

        return super().attend(q_t, scale, bias=bias)


def fox_recurrent(q, k, v, log_f, *, scale=None, page: int = 64):
    """Decoding: token by token, append ``(k_t, v_t, log_f[t])`` to a :class:`ForgetKVCache`, then attend.

    The running cumulative log gate is all the state the gate adds to an
    ordinary KV cache (kept in float64: see :class:`ForgetKVCache`).  Shapes
    as :func:`fox_naive`.
    """
    n, scale, dt = _prepare_fox(q, k, v, log_f, scale)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_, g = q.to(dt), k.to(dt), v.to(dt), log_f.to(dt)
    cache = ForgetKVCache(n.lead, n.D, n.Dv, n.T, dtype=dt, device=q.device, page=page)
    outs = []
    for t in range(n.T):
        cache.append(k_[..., t, :], v_[..., t, :], g[..., t])
        outs.append(cache.attend(q_[..., t, :], scale))
    return torch.stack(outs, dim=-2).to(q.dtype)


def fox_matrix(q, k, v, log_f, *, scale=None):
    """Parallel form: ``softmax(scale Q K^T + D) V`` with ``D`` from :func:`log_gate_matrix`
    (``-inf`` above the diagonal: the causal mask is part of ``D``).

    Shapes as :func:`fox_naive`; O(T^2) memory.
    """
    n, scale, dt = _prepare_fox(q, k, v, log_f, scale)
    if n.T == 0:
        return empty_output(q, v)
    logits = scale * q.to(dt) @ k.to(dt).transpose(-1, -2) + _log_gate_matrix(log_f.to(dt))
    return causal_softmax(logits, v.to(dt)).to(q.dtype)  # the -inf above the diagonal re-imposed by a select


def fox_blockwise(q, k, v, log_f, *, scale=None, block_m: int = 64, block_n: int = 64):
    """FlashAttention with a forget gate in PyTorch: the reference the Triton kernel follows.

    :func:`pathedu.nope.nope_blockwise` plus one line: the cumulative sum
    ``c = cumsum(log_f)`` is taken once, and each logit block gets the bias
    ``c_i - c_j = sum_{s=j+1..i} log_f[s]`` before the online softmax.  (The
    kernel does the same in fp32; as ``|c|`` grows with T, ``c_i - c_j`` keeps
    an absolute error of about ``|c| 2^-24``, harmless while it is small.)
    Shapes as :func:`fox_naive`.
    """
    n, scale, dt = _prepare_fox(q, k, v, log_f, scale)
    block_m, block_n = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if n.T == 0:
        return empty_output(q, v)
    c = torch.cumsum(log_f.to(dt), dim=-1)
    bias = lambda rows, cols: c[..., rows, None] - c[..., None, cols]  # noqa: E731  (the forget-gate bias)
    out = blockwise_softmax(q.to(dt), k.to(dt), v.to(dt), scale, bias=bias, block_m=block_m, block_n=block_n)
    return out.to(q.dtype)


def fox_triton(q, k, v, log_f, *, scale=None):
    """FoX in Triton: :func:`pathedu.kernels.flash_attention.attention` with ``log_f``.

    One small launch takes the fp32 cumulative sum once and checks the gates as it reads them
    (:func:`pathedu.kernels.gates.cumulative_log_gates`); the kernel adds
    ``c_r - c_j`` to each logit block, ``r`` the block's first query row: it
    differs from :func:`fox_blockwise`'s ``c_i - c_j`` by ``c_i - c_r``, the same
    for a whole row, which softmax ignores.
    Accepts fp16/bf16/fp32 ``q, k, v`` and head dims 16..128.  Shapes as
    :func:`fox_naive`.  Every argument is validated by the kernel entry point
    (:func:`pathedu.kernels.flash_attention.biased_attention`; values read once the kernel is queued).
    """
    from .kernels.flash_attention import biased_attention

    return biased_attention(q, k, v, "loggate", log_f, scale=scale, name="log_f")


# ---------------------------------------------------------------------------
# Linear side: GLA (per-channel gate) and Mamba2 (per-token gate)
# ---------------------------------------------------------------------------

def _prepare_gla(q, k, v, log_f):
    """Validate; return sizes, the gate as ``(..., T, G)`` (``G = 1``: per token, ``G = D``:
    per key channel), whether it is per channel, and the working dtype."""
    n: QKV = check_qkv(q, k, v)
    if isinstance(log_f, torch.Tensor) and log_f.dim() == q.dim():
        check_per_token(log_f, "log_f", n, q, extra=(n.D,))
        channel = True
    else:
        if isinstance(log_f, torch.Tensor) and log_f.dim() != q.dim() - 1:
            raise ValueError(f"`log_f` must have shape {n.lead + (n.T,)} (a gate per token) or "
                             f"{n.lead + (n.T, n.D)} (a gate per token and key channel), got {tuple(log_f.shape)}")
        check_per_token(log_f, "log_f", n, q)
        channel = False
    _check_log_values(log_f)
    dt = _work_dtype(q, log_f)
    g = log_f.to(dt) if channel else log_f.to(dt)[..., None]
    return n, g, channel, dt


def gla_naive(q, k, v, log_f):
    """The definition, one query at a time::

        o_i = sum_{j<=i} (sum_d q_id k_jd exp(D_ijd)) v_j,   D_ijd = sum_{s=j+1..i} log_f[s, d]

    (``D_ij`` shared by every channel when ``log_f`` is per token).  Shapes:
    ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``log_f: (..., T)`` or
    ``(..., T, D)``, entries <= 0 -> ``(..., T, Dv)``.
    """
    n, g, _, dt = _prepare_gla(q, k, v, log_f)
    if n.T == 0:
        return empty_output(q, v)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    E = torch.zeros_like(g)  # E[..., j, :] = sum_{s=j+1..i} log_f[s], grown as i advances
    outs = []
    for i in range(n.T):
        E[..., :i, :] += g[..., i, None, :]  # token i's gate acts on every earlier key; E_ii = 0
        decay = torch.exp(E[..., : i + 1, :])  # (..., i+1, G), every exponent <= 0
        w = (k_[..., : i + 1, :] * q_[..., i, None, :] * decay).sum(-1)  # sum_d q_id k_jd e^{D_ijd}
        outs.append(torch.einsum("...j,...jd->...d", w, v_[..., : i + 1, :]))
    return torch.stack(outs, dim=-2).to(q.dtype)


def gla_recurrent(q, k, v, log_f, *, initial_state=None, return_state: bool = False):
    """The RNN: ``S_t = S_{t-1} diag(exp(log_f[t])) + v_t k_t^T``, ``o_t = S_t q_t``.

    The gate scales the state's *columns* (key channels); a per-token gate
    scales all of them alike.  ``initial_state``/returned state: ``(..., Dv, D)``.
    Shapes as :func:`gla_naive`.
    """
    n, g, _, dt = _prepare_gla(q, k, v, log_f)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    S = _initial_state(initial_state, n, q, dtype=dt)
    outs = []
    for t in range(n.T):
        S = S * torch.exp(g[..., t, None, :]) + v_[..., t, :, None] * k_[..., t, None, :]
        outs.append((S @ q_[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2).to(q.dtype) if outs else empty_output(q, v)
    return (out, S) if return_state else out


def gla_matrix(q, k, v, log_f):
    """Parallel form: ``W V`` with ``W_ij = sum_d q_id k_jd exp(D_ijd)`` (0 above the diagonal).

    Per-token gate: ``W = (Q K^T) * exp(D)``, ``D`` from :func:`log_gate_matrix`.
    Per-channel gate: one such term per channel, ``W = sum_d (q_d k_d^T) * exp(D_d)``
    (O(T^2) memory, O(T^2 D) work).  Shapes as :func:`gla_naive`.
    """
    n, g, channel, dt = _prepare_gla(q, k, v, log_f)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    if not channel:
        W = (q_ @ k_.transpose(-1, -2)) * torch.exp(_log_gate_matrix(g[..., 0]))
    else:
        # Accumulated key-major, W^T[j, i]: the layout in which log_gate_matrix builds D (its
        # transpose is contiguous), so each channel's pass reads memory in order.
        Wt = q_.new_zeros(n.lead + (n.T, n.T))
        for d in range(n.D):
            decay_t = torch.exp_(_log_gate_matrix(g[..., d]).transpose(-1, -2))  # exp(D_d)^T
            Wt.addcmul_(k_[..., :, d, None] * q_[..., None, :, d], decay_t)
        W = Wt.transpose(-1, -2)
    # exp(-inf) = 0 above the diagonal, but 0 * nan is NaN: zero the future by a select.
    return causal_matmul(W.tril(), v_).to(q.dtype)


# The chunk length of the per-channel gate's chunked forms, this one's default and the kernel's only one: its
# intra-chunk term is a C x C x D broadcast (C x C x BLOCK_DC in the kernel), so C stays small.
CHANNEL_CHUNK = 16


def gla_chunked(q, k, v, log_f, *, chunk: int | None = None):
    """Chunkwise-parallel form: the reference :mod:`pathedu.kernels.linear_attention` follows.

    Within a chunk, ``b_i = sum_{s<=i} log_f[s]`` from the chunk start (<= 0;
    a D-vector for a per-channel gate), ``H = S^T`` (D x Dv) the state after the
    previous chunk::

        O_c = (Q_c * e^b) H + A_c V_c,   A_c[i, j] = sum_d q_id k_jd e^{b_id - b_jd} (j <= i, else 0)
        H  <- diag(e^{b_last}) H + (K_c * e^{b_last - b})^T V_c

    Every exponent is <= 0: ``A_c`` is masked *before* it is exponentiated.
    For a per-token gate ``A_c = (Q_c K_c^T) * e^{b_i - b_j}``, a matrix product;
    for a per-channel gate it is a ``C x C x D`` broadcast sum (factorising it
    as ``(q_i e^{b_i}) . (k_j e^{-b_j})`` would overflow).  ``chunk=None``: the
    kernel's choice, 64 tokens for a per-token gate and
    ``CHANNEL_CHUNK = 16`` for a per-channel one.  Shapes as :func:`gla_naive`.
    """
    n, g, channel, dt = _prepare_gla(q, k, v, log_f)
    C = check_positive_int(chunk, "chunk") if chunk is not None else (CHANNEL_CHUNK if channel else 64)
    q_, k_, v_ = q.to(dt), k.to(dt), v.to(dt)
    v_finite = bool(torch.isfinite(v_).all())
    H = q_.new_zeros(n.lead + (n.D, n.Dv))
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=dt, device=q.device)
    for s in range(0, n.T, C):
        e = min(s + C, n.T)
        qc, kc, vc = q_[..., s:e, :], k_[..., s:e, :], v_[..., s:e, :]
        b = g[..., s:e, :].cumsum(-2)  # (..., c, G)
        b_last = b[..., -1:, :]  # (..., 1, G)
        mask = causal_mask(e - s, q.device)
        if channel:
            diff = masked_logits(b[..., :, None, :] - b[..., None, :, :], mask[..., None])  # (..., c, c, D)
            A = torch.einsum("...id,...jd,...ijd->...ij", qc, kc, torch.exp(diff))
        else:
            A = (qc @ kc.transpose(-1, -2)) * torch.exp(masked_logits(b - b.transpose(-1, -2), mask))
        A = A.tril()  # exp(-inf) = 0 above the diagonal, but 0 * nan is NaN: zero the future by a select
        out[..., s:e, :] = (qc * torch.exp(b)) @ H + causal_matmul(A, vc, finite=v_finite)
        H = H * torch.exp(b_last).transpose(-1, -2) + (kc * torch.exp(b_last - b)).transpose(-1, -2) @ vc
    return out.to(q.dtype)


def gla_triton(q, k, v, log_f, *, initial_state=None, return_state: bool = False):
    """GLA / Mamba2 in Triton: :func:`pathedu.kernels.linear_attention.chunked_linear_attention` with ``log_f``.

    A per-token gate takes the kernel's ``"scalar"`` path (chunks of 64, matrix
    products), a per-channel gate its ``"channel"`` path (chunks of 16, a 3-D
    broadcast for the intra-chunk scores).  Accepts fp16/bf16/fp32 and head dims
    16..128; fp32 state.  Shapes as :func:`gla_naive`.  ``initial_state`` / ``return_state``
    as :func:`gla_recurrent` (``(..., Dv, D)``; the returned state is fp32).  Differentiable in
    ``q, k, v``, ``log_f`` and ``initial_state``, and through the returned state.  Every argument
    is validated by the kernel entry point (:func:`pathedu.kernels.linear_attention.gated_linear_attention`;
    values read once the kernel is queued).
    """
    from .kernels.linear_attention import gated_linear_attention

    return gated_linear_attention(q, k, v, "log_f", log_f, initial_state=initial_state, return_state=return_state)
