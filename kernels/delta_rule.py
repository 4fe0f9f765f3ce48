r"""Chunked Householder RNN and DeltaNet: the linear-attention template with a UT-transformed gate.

The Householder RNN (PaTH's linear dual) and DeltaNet are ::

    S_t = S_{t-1} H_t + v_t k_t^T,                 H_t = I - beta_t w_t w_t^T,   o_t = S_t q_t
    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T                      (DeltaNet: w = k, values beta v)

(``S_t`` is ``Dv x D``; no scale, no normalisation).  As in
:mod:`.linear_attention`, one program owns one (batch, head) and a block of
``BLOCK_DV`` value channels and walks the sequence chunk by chunk with the state
``H = S^T`` (``D x BLOCK_DV``, fp32) in registers.  What the scalar gate did with
``exp`` of cumulative log gates, the Householder gate does with the chunk's UT
factors (:func:`pathedu.path.householder_chunked` line by line)::

    O_c = Q~_c H + Ã_c V_c                           (inter-chunk + intra-chunk)
    H  <- P_c^T H + K~_c^T V_c = H + G_c H + K~_c^T V_c,      G_c = P_c^T - I = -W_c^T A_c W_c

with, for chunk ``[s, e]`` and its UT factor ``A_c`` (``U_c = A_c W_c``):
``q~_i = H_s ... H_i q_i``, ``k~_j = H_e ... H_{j+1} k_j``,
``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` (j <= i, masked UT form) and
``P_c = H_s ... H_e = I - W_c^T A_c^T W_c``, whose transpose minus the
identity is kept as one dense ``D x D`` matrix ``G_c`` (one product with the
state instead of the two of the compact form ``W_c^T (U_c H)``, the same FLOPs
at ``D = 2C`` and fewer below).  These are exactly what PaTH's
preparation pass makes, so they come from the same kernels
(:class:`.path_attention.Prepared`: ``_ut_diag_inverse`` then ``_ut_prepare``),
run first for all chunks in parallel, which keeps the triangular inverse off
the sequential chunk loop.  DeltaNet
runs it with ``w = k`` and folds ``beta_j`` into column ``j`` of Ã and row
``j`` of k~ (the values ``beta_j v_j``).

Work is ``O(T C D)`` in matrix products plus the state update's two products
(``G_c H`` and ``K~_c^T V_c``) per chunk; the state never leaves the chip.  Prepared factors are fp32; products
are tf32 for 16-bit inputs with operands rounded to nearest (the state is
multiplied by ``I + G_c`` chunk after chunk, and the tensor cores' truncation
would shrink it a little every time), and about fp32 for fp32 inputs
(three tf32 products on a GPU, exact in the interpreter); see
:func:`.path_attention._dot`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_per_token
from ._launch import interpreting, next_pow2, prepare_per_token, prepare_qkv
from .flash_attention import _load_rows
from .path_attention import Prepared, _dot, check_block, prep_precision


@triton.jit
def _householder_fwd(QT, KT, AD, GM, V, O, T,
                     stride_pb, stride_pt, stride_ab, stride_at, stride_gb, stride_gj,
                     stride_vb, stride_vt, stride_ob, stride_ot,
                     HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    pid_v = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)
    QT += bh * stride_pb
    KT += bh * stride_pb
    AD += bh * stride_ab
    GM += bh * stride_gb
    V += bh * stride_vb
    O += bh * stride_ob
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM

    H = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)  # the state S^T, on chip for the whole sequence
    for start in range(0, T, CHUNK):
        # Prepared tensors are padded past T with zeros (H = I there), so only V and O need row masks.
        qt = _load_rows(QT + start * stride_pt, offs_c, offs_d, stride_pt, 0, HEAD_DIM, False, CHECK_D)
        kt = _load_rows(KT + start * stride_pt, offs_c, offs_d, stride_pt, 0, HEAD_DIM, False, CHECK_D)
        g = _load_rows(GM + (start // CHUNK) * stride_gj, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM,
                       CHECK_D, CHECK_D)
        a = _load_rows(AD + start * stride_at, offs_c, offs_c, stride_at, 0, CHUNK, False, False)
        v = _load_rows(V + start * stride_vt, offs_c, offs_dv, stride_vt, T - start, HEAD_DV, True, True).to(tl.float32)
        o = _dot(qt, H, PRECISION) + _dot(a, v, PRECISION)
        # H <- P^T H + K~^T V = H + G H + K~^T V  (tf32 operands rounded to nearest: H is multiplied
        # by G chunk after chunk, and truncated operands would shrink it a little every time)
        H += _dot(g, H, PRECISION) + _dot(tl.trans(kt), v, PRECISION)
        o_ptrs = O + (start + offs_c)[:, None] * stride_ot + offs_dv[None, :]
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=((start + offs_c)[:, None] < T) & (offs_dv[None, :] < HEAD_DV))


def _run(q, k, v, w, beta, *, delta: bool, chunk: int):
    n, q3, k3, v3, dtype = prepare_qkv(q, k, v)
    if not delta:
        check_per_token(w, "w", n, q, extra=(n.D,))
    check_per_token(beta, "beta", n, q)
    chunk = check_block(chunk, n.D, "chunk")
    BH = q3.shape[0]
    out = torch.empty(q3.shape[:-1] + (n.Dv,), dtype=dtype, device=q.device)
    if n.T == 0 or BH == 0:
        return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
    w3 = k3 if delta else w.reshape(BH, n.T, n.D).to(torch.float32).contiguous()
    precision = prep_precision(dtype)  # also for the state's products (see path_attention._dot)
    f32 = torch.float32
    prep = Prepared(q3, k3, w3, prepare_per_token(beta, n, BH), n.T, chunk, q_dtype=f32, k_dtype=f32,
                    update_dtype=f32, w_is_k=delta, value_beta=delta, precision=precision)
    block_dv = min(next_pow2(n.Dv), 64)
    grid = (triton.cdiv(n.Dv, block_dv), BH)
    _householder_fwd[grid](prep.qt, prep.kt, prep.ad, prep.g, v3, out, n.T,
                           prep.qt.stride(0), prep.qt.stride(1), prep.ad.stride(0), prep.ad.stride(1),
                           prep.g.stride(0), prep.g.stride(1),
                           v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
                           HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=block_dv,
                           CHUNK=chunk, PRECISION=precision, num_warps=4, num_stages=1 if interpreting() else 2)
    return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)


def chunked_householder(q, k, v, w, beta, *, chunk=None):
    """The Householder RNN ``S_t = S_{t-1} H_t + v_t k_t^T``, ``o_t = S_t q_t``, chunked.

    ``H_t = I - beta_t w_t w_t^T`` (``w`` used as given).  Shapes:
    ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` ->
    ``(..., T, Dv)``; ``D, Dv`` in 16..128; any T.  fp16/bf16/fp32 ``q, k, v``
    (the output has their dtype), ``w`` and ``beta`` used in fp32; fp32 state.
    Unrolled: ``o_i = sum_{j<=i} (k_j^T H_{j+1} ... H_i q_i) v_j`` (smallest index
    on the left).  ``chunk`` in {16, 32, 64, 128} (``None``: 64 for ``D <= 64``, else 32).  The caller validates
    ``beta``'s values (``pathedu.path`` requires [0, 2]).
    """
    return _run(q, k, v, w, beta, delta=False, chunk=chunk)


def chunked_delta_rule(q, k, v, beta, *, chunk=None):
    """DeltaNet ``S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``, chunked.

    No scale, no normalisation of ``q``/``k`` (normalise ``k`` yourself: the
    transition is a contraction only for ``beta_t |k_t|^2`` in [0, 2]).  Shapes:
    ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` -> ``(..., T, Dv)``;
    dtypes and sizes as :func:`chunked_householder` (``beta`` used in fp32).
    """
    return _run(q, k, v, None, beta, delta=True, chunk=chunk)
