r"""Causal FlashAttention forward: the softmax-side template of the book.

One program owns a block of ``BLOCK_M`` queries of one (batch, head) and
streams over key/value blocks of ``BLOCK_N`` rows, keeping three running
quantities per query row (the *online softmax*):

* ``m``: the largest logit seen so far (in log2 units),
* ``l``: the sum of ``2^(logit - m)`` over keys seen so far,
* ``acc``: the sum of ``2^(logit - m) v_j``, in fp32.

When a new block raises the maximum from ``m`` to ``m'``, what was summed so far
is rescaled by ``2^(m - m')``.  The output is ``acc / l``.  This is
:func:`pathedu.nope.nope_blockwise` line by line, with two kernel habits:

* logits are kept in base 2 (``exp2`` is one instruction; ``exp`` is ``exp2``
  after a multiply): ``scale`` is folded into ``scale * log2(e)``;
* key blocks strictly left of the query block need no causal mask, so the loop
  is split in two: unmasked blocks, then the blocks on the diagonal.

The position encoding is a hook: ``BIAS`` adds to every logit

* ``"none"``: nothing (NoPE, chapter 1);
* ``"alibi"``: ``-slope * (i - j)`` with a per-head slope (chapter 2);
* ``"loggate"``: ``c_i - c_j`` with ``c`` the fp32 cumulative sum of per-token
  log forget gates, i.e. ``sum_{s=j+1..i} log f_s`` (chapter 3).

Both biases have the form ``g(i) - g(j)``; the kernel adds only ``g(r) - g(j)``,
``r`` the query block's first row, since the remaining ``g(i) - g(r)`` is a
constant per row and softmax ignores it (see ``_attend``).

Rotated q/k (RoPE) reuse the kernel unchanged after a rotation pre-pass.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..checks import check_scale
from ._launch import dot_precision, interpreting, next_pow2, per_head, prepare_per_token, prepare_qkv

LOG2E = 1.4426950408889634


@triton.jit
def _load_rows(ptr, rows, cols, stride, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a (len(rows), len(cols)) tile; masks only where the sizes demand it."""
    ptrs = ptr + rows[:, None] * stride + cols[None, :]
    if CHECK_ROWS and CHECK_COLS:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif CHECK_ROWS:
        return tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_COLS:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _attend(acc, m_i, l_i, q, K, V, bias_arg, c_ref, start_m, offs_m, lo, hi, T, stride_kt, stride_vt, qk_scale,
            HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
            BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key blocks [lo, hi) into the running (acc, m_i, l_i) of one query block."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # Only diagonal blocks can run past T; blocks left of the diagonal are whole.
        k = _load_rows(K, offs_n, offs_d, stride_kt, T, HEAD_DIM, CAUSAL_MASK, BLOCK_D != HEAD_DIM)
        v = _load_rows(V, offs_n, offs_dv, stride_vt, T, HEAD_DV, CAUSAL_MASK, BLOCK_DV != HEAD_DV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 units
        # The bias b_ij = g(i) - g(j) is split at the query block's first row r:
        # b_ij = (g(r) - g(j)) - (g(r) - g(i)).  The second term is the same for a
        # whole row and softmax ignores per-row constants, so only the key term,
        # a vector of BLOCK_N numbers, is added: one add per logit, like NoPE's scale.
        if BIAS == "alibi":
            # g(t) = slope * t, bias_arg = slope * log2(e); (j - r) is an exact integer.
            s += (bias_arg * (offs_n - start_m).to(tl.float32))[None, :]
        elif BIAS == "loggate":
            # g(t) = c_t, the cumulative log gate; c_ref = c_r.
            if CAUSAL_MASK:
                c_n = tl.load(bias_arg + offs_n, mask=offs_n < T, other=0.0)
            else:
                c_n = tl.load(bias_arg + offs_n)
            s += ((c_ref - c_n) * 1.4426950408889634)[None, :]
        if CAUSAL_MASK:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old maximum
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _flash_fwd(Q, K, V, O, BIAS_ARG, T, qk_scale,
               stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
               HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr):
    # Heaviest query blocks (those with the most keys) are launched first: a shorter tail.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    Q += bh * stride_qb
    K += bh * stride_kb
    V += bh * stride_vb
    O += bh * stride_ob

    q = _load_rows(Q + start_m * stride_qt, tl.arange(0, BLOCK_M), offs_d, stride_qt, T - start_m, HEAD_DIM,
                   True, BLOCK_D != HEAD_DIM)
    bias_arg = 0.0
    c_ref = 0.0
    if BIAS == "alibi":
        bias_arg = tl.load(BIAS_ARG + bh) * 1.4426950408889634
    elif BIAS == "loggate":
        bias_arg = BIAS_ARG + bh * T
        c_ref = tl.load(bias_arg + start_m)  # start_m < T for every launched block

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # Key blocks strictly before the query block: every key is visible, no mask.
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, K, V, bias_arg, c_ref, start_m, offs_m, 0, start_m, T, stride_kt, stride_vt,
                            qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N, False, BIAS, PRECISION)
    # Key blocks on the diagonal: hide the future (and anything past T).
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, K, V, bias_arg, c_ref, start_m, offs_m, start_m, tl.minimum(start_m + BLOCK_M, T),
                            T, stride_kt, stride_vt, qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N, True,
                            BIAS, PRECISION)
    o = acc / l_i[:, None]
    o_ptrs = O + offs_m[:, None] * stride_ot + offs_dv[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < T) & (offs_dv[None, :] < HEAD_DV))


# Tile shapes.  The interpreter's cost grows with the number of program
# instances, so on a CPU one large fixed tile is used; on a GPU the autotuner
# picks among shapes that suit Hopper and Ampere.  BLOCK_M % BLOCK_N == 0 keeps
# the "unmasked blocks, then diagonal blocks" split exact.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [
        (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 3), (64, 32, 4, 4),
    ]
]
# T is part of the key: the best tile for T = 1024 need not be the best for 8192.
_flash_fwd_tuned = triton.autotune(_GPU_CONFIGS, key=["T", "HEAD_DIM", "HEAD_DV", "BIAS", "PRECISION"])(_flash_fwd)


def attention(q, k, v, *, scale=None, alibi_slope=None, log_f=None):
    """Causal softmax attention with an optional additive position bias.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``;
    ``D, Dv`` in 16..128; fp16/bf16/fp32 (fp32 accumulation throughout).
    Logits are ``scale * q_i.k_j + bias_ij`` with ``scale=None`` meaning ``D**-0.5`` and

    * ``alibi_slope`` (float or tensor broadcastable to the leading dims, >= 0):
      ``bias_ij = -slope * (i - j)``;
    * ``log_f`` ``(..., T)``, entries <= 0: ``bias_ij = sum_{s=j+1..i} log_f[s]``
      (not multiplied by ``scale``).

    The caller validates the bias arguments' values (the chapter modules do).
    """
    n, q3, k3, v3, dtype = prepare_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    if alibi_slope is not None and log_f is not None:
        raise ValueError("pass at most one of `alibi_slope` and `log_f`")
    BH = q3.shape[0]
    out = torch.empty(q3.shape[:-1] + (n.Dv,), dtype=dtype, device=q.device)
    if n.T == 0 or BH == 0:
        return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
    bias, bias_arg = "none", q3  # a dummy pointer when there is no bias
    if alibi_slope is not None:
        bias, bias_arg = "alibi", per_head(alibi_slope, n, "alibi_slope", BH, q.device)
    elif log_f is not None:
        # The cumulative sum is taken once, in fp32, outside the kernel.
        bias, bias_arg = "loggate", torch.cumsum(prepare_per_token(log_f, n, BH), dim=-1)
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                BIAS=bias, PRECISION=dot_precision(dtype))
    args = (q3, k3, v3, out, bias_arg, n.T, scale * LOG2E, q3.stride(0), q3.stride(1), k3.stride(0),
            k3.stride(1), v3.stride(0), v3.stride(1), out.stride(0), out.stride(1))
    if interpreting():
        bm = 32 if n.T <= 32 else 64
        _flash_fwd[(triton.cdiv(n.T, bm), BH)](*args, BLOCK_M=bm, BLOCK_N=bm, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["BLOCK_M"]), BH)  # noqa: E731
        _flash_fwd_tuned[grid](*args, **meta)
    return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
