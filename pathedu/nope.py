r"""NoPE softmax attention and vanilla linear attention: every form of both sides.

Softmax side (no position encoding; the causal mask is the only order signal)::

    o_i = sum_{j<=i} softmax_j(scale * q_i . k_j) v_j

Linear side (no normalisation, no scale)::

    S_t = S_{t-1} + v_t k_t^T,     o_t = S_t q_t   (S_t is Dv x D)

Both are the gated recurrence ``S_t = S_{t-1} A_t + v_t k_t^T`` with the gate
``A_t = 1``: the "distance" between positions j and i is the empty product 1.

Shapes everywhere: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, output
``(..., T, Dv)``; the leading dims (batch, heads, ...) must agree.

Forms, from the definition towards the kernel:

================  ==============================  ==============================
form              softmax side                    linear side
================  ==============================  ==============================
naive             ``nope_naive``: loop over i     ``linear_naive``: loop over i, j
recurrent         ``nope_recurrent``: KV cache    ``linear_recurrent``: state S_t
matrix            ``nope_matrix``: softmax(QK^T)  ``linear_matrix``: (QK^T*M) V
blockwise         ``nope_blockwise``: online      ``linear_chunked``: chunks +
                  softmax over key blocks         carried state
Triton            ``nope_triton``                 ``linear_triton``
================  ==============================  ==============================

Non-finite inputs: a NaN or inf in ``q``, ``k`` or ``v`` at position t changes
only the outputs at positions >= t (masked weights never multiply it:
:func:`pathedu.masks.causal_matmul`).
"""
from __future__ import annotations


import torch

from .checks import QKV, check_positive_int, check_qkv, check_scale, check_state
from .masks import causal_mask, causal_matmul, masked_logits

__all__ = [
    "nope_naive", "nope_recurrent", "nope_matrix", "nope_blockwise", "nope_triton",
    "linear_naive", "linear_recurrent", "linear_matrix", "linear_chunked", "linear_triton",
    "KVCache", "decode_with_cache", "online_softmax_step", "blockwise_softmax", "causal_softmax", "chunk_scan",
    "empty_output",
]


def empty_output(q, v):
    """The output of an empty sequence: ``(..., 0, Dv)``."""
    return q.new_empty(q.shape[:-1] + (v.shape[-1],))


def _state_or_zeros(state, want: tuple, dtype: torch.dtype, like: torch.Tensor, *,
                    allow_complex: bool = False, shape_note: str = "") -> torch.Tensor:
    """Zeros of shape ``want`` in ``dtype`` on ``like``'s device, or ``state`` checked
    (:func:`pathedu.checks.check_state`: a tensor of shape ``want`` on ``like``'s device, floating, or complex
    too where ``allow_complex``) and copied in ``dtype``.  Errors name ``initial_state``; ``shape_note`` follows
    the wanted shape in the message."""
    if state is None:
        return torch.zeros(want, dtype=dtype, device=like.device)
    check_state(state, want, like, allow_complex=allow_complex, shape_note=shape_note)
    return state.to(dtype).clone()


def _initial_state(state, n: QKV, like: torch.Tensor, *, dtype=None) -> torch.Tensor:
    """The starting state of a linear-side recurrent/chunked form: zeros, or ``state: (..., Dv, D)``
    checked (a real tensor of that shape on ``like``'s device) and copied in ``dtype``
    (default ``like``'s).  Errors name ``initial_state``."""
    dtype = like.dtype if dtype is None else dtype
    return _state_or_zeros(state, n.lead + (n.Dv, n.D), dtype, like, shape_note=" (leading dims, Dv, D)")


# ---------------------------------------------------------------------------
# Softmax side
# ---------------------------------------------------------------------------

def nope_naive(q, k, v, *, scale=None):
    """The definition, one query at a time: ``o_i = softmax(scale q_i K_{<=i}^T) V_{<=i}``.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    outs = []
    for i in range(n.T):
        logits = scale * torch.einsum("...d,...jd->...j", q[..., i, :], k[..., : i + 1, :])
        outs.append(torch.einsum("...j,...jd->...d", torch.softmax(logits, dim=-1), v[..., : i + 1, :]))
    return torch.stack(outs, dim=-2)


class KVCache:
    """A paged decoding cache: keys and values appended one token at a time.

    The cache is a list of pages of ``page`` tokens (the last one may be partly
    filled): ``append`` writes a token into the last page, opening a new page
    when it is full, and ``attend(q_t)`` reads the cache page by page and merges
    the per-page softmaxes with the online-softmax rule, as a decoding kernel
    does (each page could live on a different memory block or thread block).

    A serving kernel writes each token into preallocated memory; here a page is
    rebuilt out of place (``torch.cat``), so that autograd can differentiate
    through decoding.  ``T_max``, if given, is the most tokens the cache may
    hold.  ``k``, ``v``: every cached key and value, ``(..., len, D)`` and
    ``(..., len, Dv)`` (the pages joined, for inspection).

    Shapes: ``append(k_t: (..., D), v_t: (..., Dv))``; ``attend(q_t: (..., D)) -> (..., Dv)``.
    """

    def __init__(self, lead, D, Dv, T_max=None, *, dtype, device, page: int = 64):
        self.lead, self.D, self.Dv, self.T_max = tuple(lead), D, Dv, T_max
        self.dtype, self.device = dtype, device
        self.page = check_positive_int(page, "page")
        self.k_pages: list[torch.Tensor] = []  # each (..., <= page, D)
        self.v_pages: list[torch.Tensor] = []  # each (..., <= page, Dv)
        self.len = 0

    def _write(self, pages, row, dim: int = -2):
        """Append ``row`` (one token along ``dim``) to the last page of ``pages``, or open a new page."""
        if self.len % self.page == 0:
            pages.append(row)
        else:
            pages[-1] = torch.cat((pages[-1], row), dim=dim)

    def append(self, k_t, v_t):
        if self.T_max is not None and self.len >= self.T_max:
            raise ValueError(f"the cache is full (`T_max` = {self.T_max} tokens)")
        self._write(self.k_pages, k_t[..., None, :])
        self._write(self.v_pages, v_t[..., None, :])
        self.len += 1

    def pages(self):
        """``(start, end, k_page, v_page)`` for every page, in order (cached tokens ``start..end-1``)."""
        for p, (k_p, v_p) in enumerate(zip(self.k_pages, self.v_pages)):
            start = p * self.page
            yield start, start + k_p.shape[-2], k_p, v_p

    @property
    def k(self) -> torch.Tensor:
        return torch.cat(self.k_pages, dim=-2) if self.k_pages else \
            torch.empty(self.lead + (0, self.D), dtype=self.dtype, device=self.device)

    @property
    def v(self) -> torch.Tensor:
        return torch.cat(self.v_pages, dim=-2) if self.v_pages else \
            torch.empty(self.lead + (0, self.Dv), dtype=self.dtype, device=self.device)

    def attend(self, q_t, scale, bias=None):
        """Attend from ``q_t: (..., D)`` to every cached token; ``bias(start, end)``,
        if given, returns the additive logit bias ``(..., end - start)`` of cached
        tokens ``start..end-1`` for this query (ALiBi, FoX and PaTH use it)."""
        m = torch.full(q_t.shape[:-1] + (1,), float("-inf"), dtype=q_t.dtype, device=q_t.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_t.shape[:-1] + (1, self.Dv), dtype=q_t.dtype, device=q_t.device)
        for start, end, k_p, v_p in self.pages():
            s = scale * torch.einsum("...d,...jd->...j", q_t, k_p)
            if bias is not None:
                s = s + bias(start, end)
            # One query row: the same online-softmax merge as the blockwise form.  Every
            # cached token is in the query's past, so no weight is masked.
            m, l, acc = online_softmax_step(m, l, acc, s[..., None, :], v_p)
        return (acc / l[..., None])[..., 0, :]


def nope_recurrent(q, k, v, *, scale=None, page: int = 64):
    """Decoding: token by token, append ``(k_t, v_t)`` to a :class:`KVCache`, then attend.

    The state of softmax attention is the whole cache, which grows with t:
    O(t) memory and O(t D) work per token, against linear attention's fixed
    ``Dv x D`` state.  Shapes as :func:`nope_naive`.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)
    return decode_with_cache(q, k, v, scale, page=page)


def decode_with_cache(q, k, v, scale, *, page: int = 64, bias=None):
    """Decode token by token: append ``(k_t, v_t)`` to a :class:`KVCache`, then
    attend from ``q_t``; ``bias(t, start, end)``, if given, is the additive bias of
    cached tokens ``start..end-1`` seen from query ``t`` (``(..., end - start)``).
    Inputs already validated; shapes as :func:`nope_naive`.
    """
    T, D, Dv = q.shape[-2], q.shape[-1], v.shape[-1]
    cache = KVCache(q.shape[:-2], D, Dv, T, dtype=q.dtype, device=q.device, page=page)
    outs = []
    for t in range(T):
        cache.append(k[..., t, :], v[..., t, :])
        b = None if bias is None else (lambda start, end, t=t: bias(t, start, end))
        outs.append(cache.attend(q[..., t, :], scale, bias=b))
    return torch.stack(outs, dim=-2)


def nope_matrix(q, k, v, *, scale=None):
    """Parallel form: ``softmax(scale Q K^T + M) V`` with ``M`` = 0 on/below the diagonal, -inf above.

    Shapes as :func:`nope_naive`; O(T^2) memory for the logits.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    return causal_softmax(scale * q @ k.transpose(-1, -2), v)


def causal_softmax(logits, v):
    """``softmax(logits + M) V`` for validated ``logits: (..., T, T)`` (row = query) and
    ``v: (..., T, Dv)``: the future is hidden by a select (``-inf``), never by adding
    ``-inf`` (``nan + -inf`` is NaN), and the weights meet ``v`` through
    :func:`pathedu.masks.causal_matmul`.  Shared by every softmax-side matrix form."""
    p = torch.softmax(masked_logits(logits, causal_mask(logits.shape[-1], logits.device)), dim=-1)
    return causal_matmul(p, v)


def online_softmax_step(m, l, acc, s, v_blk, *, masked: bool = False, finite=None):
    """Fold one block of logits ``s: (..., M, N)`` and values ``v_blk: (..., N, Dv)``
    into the running max ``m``, normaliser ``l`` (both ``(..., M)``) and numerator
    ``acc: (..., M, Dv)``.  Rows whose logits are all -inf so far keep m = -inf.

    ``masked=True``: some logits of the block are masked (``-inf``, weight 0), as
    on the diagonal; the weights then meet the values through
    :func:`pathedu.masks.causal_matmul` (``finite`` passed on), so that a NaN or
    inf value stays out of the rows that cannot see it.
    """
    m_new = torch.maximum(m, s.amax(-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # avoid inf - inf
    p = torch.exp(s - m_safe[..., None])
    alpha = torch.exp(m - m_safe)
    l = alpha * l + p.sum(-1)
    pv = causal_matmul(p, v_blk, finite=finite) if masked else p @ v_blk
    acc = alpha[..., None] * acc + pv
    return m_new, l, acc


def blockwise_softmax(q, k, v, scale, *, bias=None, load=None, block_m: int = 64, block_n: int = 64):
    """The FlashAttention loop in PyTorch, shared by every chapter's blockwise form.

    For each query block of ``block_m`` rows, stream key/value blocks of
    ``block_n`` rows left to right, keeping a running max ``m``, normaliser ``l``
    and numerator ``acc`` (the online softmax, :func:`online_softmax_step`).  Key
    blocks strictly left of the query block need no mask; only blocks that
    straddle the diagonal do.  Never materialises a ``T x T`` matrix.

    Hooks (what a position encoding changes):

    * ``bias(rows, cols)``: additive logit bias of a block, broadcastable to
      ``(..., len(rows), len(cols))`` (ALiBi, FoX);
    * ``load(x, start, end)``: rows ``start..end-1`` of ``q`` or ``k`` as the
      kernel would load them (RoPE rotates them by their positions).

    ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, already validated; ``scale`` a float;
    ``block_m``, ``block_n`` positive ints (validated by the caller).
    """
    T, Dv = q.shape[-2], v.shape[-1]
    load = load or (lambda x, start, end: x[..., start:end, :])
    v_finite = bool(torch.isfinite(v).all())  # one check for every diagonal block
    out = torch.empty(q.shape[:-1] + (Dv,), dtype=q.dtype, device=q.device)
    for start_m in range(0, T, block_m):
        end_m = min(start_m + block_m, T)
        q_blk = load(q, start_m, end_m) * scale
        rows = torch.arange(start_m, end_m, device=q.device)
        m = torch.full(q_blk.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_blk.shape[:-1] + (Dv,), dtype=q.dtype, device=q.device)
        for start_n in range(0, end_m, block_n):
            end_n = min(start_n + block_n, end_m)
            cols = torch.arange(start_n, end_n, device=q.device)
            s = q_blk @ load(k, start_n, end_n).transpose(-1, -2)
            if bias is not None:
                s = s + bias(rows, cols)
            diagonal = end_n > start_m + 1
            if diagonal:  # the block reaches the diagonal: hide the future
                s = masked_logits(s, cols[None, :] <= rows[:, None])
            m, l, acc = online_softmax_step(m, l, acc, s, v[..., start_n:end_n, :], masked=diagonal, finite=v_finite)
        out[..., start_m:end_m, :] = acc / l[..., None]
    return out


def nope_blockwise(q, k, v, *, scale=None, block_m: int = 64, block_n: int = 64):
    """FlashAttention in PyTorch: the reference :mod:`pathedu.kernels.flash_attention` follows.

    :func:`blockwise_softmax` with no hooks: the online softmax over key blocks,
    unmasked blocks first, then the blocks on the diagonal.  Shapes as :func:`nope_naive`.
    """
    n = check_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    block_m, block_n = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if n.T == 0:
        return empty_output(q, v)
    return blockwise_softmax(q, k, v, scale, block_m=block_m, block_n=block_n)


def nope_triton(q, k, v, *, scale=None):
    """FlashAttention-style Triton kernel (:func:`pathedu.kernels.flash_attention.attention`).

    Accepts fp16/bf16/fp32 and head dims 16..128; accumulates in fp32.  Shapes
    as :func:`nope_naive`.  On a CPU it runs in Triton's interpreter, where bf16
    inputs are computed in fp32 (the interpreter's bf16 is wrong).
    """
    from .kernels.flash_attention import attention

    return attention(q, k, v, scale=scale)


# ---------------------------------------------------------------------------
# Linear side
# ---------------------------------------------------------------------------

def linear_naive(q, k, v):
    """The definition: ``o_i = sum_{j<=i} (q_i . k_j) v_j``, a loop over i and j.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``.
    """
    n = check_qkv(q, k, v)
    out = torch.zeros(q.shape[:-1] + (n.Dv,), dtype=q.dtype, device=q.device)
    for i in range(n.T):
        for j in range(i + 1):
            w = (q[..., i, :] * k[..., j, :]).sum(-1)
            out[..., i, :] += w[..., None] * v[..., j, :]
    return out


def linear_recurrent(q, k, v, *, initial_state=None, return_state: bool = False):
    """The RNN: ``S_t = S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``; O(D Dv) memory per step.

    ``initial_state``/returned state: ``(..., Dv, D)``.  Shapes as :func:`linear_naive`.
    """
    n = check_qkv(q, k, v)
    S = _initial_state(initial_state, n, q)
    outs = []
    for t in range(n.T):
        S = S + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    out = torch.stack(outs, dim=-2) if outs else empty_output(q, v)
    return (out, S) if return_state else out


def linear_matrix(q, k, v):
    """Parallel form: ``(Q K^T * M) V`` with the 0/1 causal mask M (diagonal included).

    The mask is applied as a select (``tril``: entries above the diagonal set to
    0, whatever they hold) and the product with ``V`` is
    :func:`pathedu.masks.causal_matmul`, so a NaN or inf at position t reaches
    no earlier output.  Shapes as :func:`linear_naive`; O(T^2) memory.
    """
    check_qkv(q, k, v)
    return causal_matmul((q @ k.transpose(-1, -2)).tril(), v)


def linear_chunked(q, k, v, *, chunk: int = 64):
    """Chunkwise-parallel form: the reference :mod:`pathedu.kernels.linear_attention` follows.

    Split T into chunks of ``C = chunk`` tokens.  With ``H = S^T`` (D x Dv) the
    state after the previous chunk, chunk c's output is an inter-chunk term plus
    an intra-chunk (masked, quadratic in C) term, and the state advances by one
    matrix product::

        O_c = Q_c H + (Q_c K_c^T * M) V_c,      H <- H + K_c^T V_c

    O(T C D) work in matrix products, O(D Dv) state.  Shapes as :func:`linear_naive`.
    """
    check_qkv(q, k, v)
    chunk = check_positive_int(chunk, "chunk")

    def step(s, e, qc, kc, vc, H):
        intra = (qc @ kc.transpose(-1, -2)).tril()  # the mask M as a select
        return qc @ H, intra, H + kc.transpose(-1, -2) @ vc

    return chunk_scan(q, k, v, chunk, step)


def chunk_scan(q, k, v, chunk: int, step):
    """The loop every chunked linear form shares: chunks ``[s, e)`` of ``chunk`` tokens, left to
    right, with the state ``H = S^T`` (``(..., D, Dv)``, zero at the start) carried between them.

    ``step(s, e, qc, kc, vc, H) -> (inter, intra, H_next)``: the chunk's inter-chunk output
    ``(..., C, Dv)`` (what the state before it contributes), its intra-chunk weights ``(..., C, C)``
    (exactly zero above the diagonal, set by a select) and the state after it.  The output is
    ``inter + intra @ vc``, the product taken by :func:`pathedu.masks.causal_matmul` so that a
    NaN or inf value never reaches an earlier row.  Inputs already validated.
    """
    T, Dv = q.shape[-2], v.shape[-1]
    H = q.new_zeros(q.shape[:-2] + (q.shape[-1], Dv))
    out = torch.empty(q.shape[:-1] + (Dv,), dtype=q.dtype, device=q.device)
    v_finite = bool(torch.isfinite(v).all())
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        vc = v[..., s:e, :]
        inter, intra, H = step(s, e, q[..., s:e, :], k[..., s:e, :], vc, H)
        out[..., s:e, :] = inter + causal_matmul(intra, vc, finite=v_finite)
    return out


def linear_triton(q, k, v, *, initial_state=None, return_state: bool = False):
    """Chunked linear attention in Triton (:func:`pathedu.kernels.linear_attention.chunked_linear_attention`).

    Accepts fp16/bf16/fp32, head dims 16..128, accumulates in fp32.  Shapes as
    :func:`linear_naive`.  ``initial_state`` / ``return_state`` as :func:`linear_recurrent`
    (``(..., Dv, D)``; the returned state is fp32): a long sequence can be run in pieces.
    Differentiable in ``q, k, v`` and ``initial_state``, and through the returned state (the
    kernel's backward pass).  Every argument is validated by the kernel entry point.
    """
    from .kernels.linear_attention import chunked_linear_attention

    return chunked_linear_attention(q, k, v, initial_state=initial_state, return_state=return_state)
