r"""Chunked linear attention: the linear-side template of the book.

One program owns one (batch, head) and one block of ``BLOCK_DV`` value
channels.  It walks the sequence chunk by chunk, carrying the state
``H = S^T`` (``D x BLOCK_DV``, fp32) in registers::

    O_c = Q_c H + (Q_c K_c^T * M) V_c        (M: causal 0/1 mask, diagonal kept)
    H  <- H + K_c^T V_c

which is :func:`pathedu.nope.linear_chunked` line by line.  Work is
``O(T C D)`` in matrix products; the state never leaves the chip.

The gate is a hook: ``GATE`` is

* ``"none"``: plain linear attention (chapter 1);
* ``"scalar"``: a per-token log forget gate ``log_f[t] <= 0`` (a scalar per
  head, as in RetNet's constant gamma or Mamba2's data-dependent gate), so that
  ``S_t = a_t S_{t-1} + v_t k_t^T`` with ``a_t = exp(log_f[t])``.  Within a
  chunk with cumulative log gate ``b`` (``b_i = sum_{s<=i} log_f[s]``, from the
  chunk start)::

      O_c = (Q_c * e^{b}) H + (Q_c K_c^T * e^{b_i - b_j} * M) V_c
      H  <- e^{b_last} H + (K_c * e^{b_last - b_j})^T V_c

  Every exponent is <= 0, so nothing overflows however strong the decay.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import dot_precision, interpreting, next_pow2, prepare_per_token, prepare_qkv


@triton.jit
def _linear_fwd(Q, K, V, O, LOG_F, T,
                stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                CHUNK: tl.constexpr, GATE: tl.constexpr, PRECISION: tl.constexpr):
    pid_v = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)
    Q += bh * stride_qb
    K += bh * stride_kb
    V += bh * stride_vb
    O += bh * stride_ob
    causal = offs_c[:, None] >= offs_c[None, :]

    H = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)  # the state S^T, on chip for the whole sequence
    for start in range(0, T, CHUNK):
        offs_t = start + offs_c
        in_t = offs_t < T
        mask_qk = in_t[:, None] & (offs_d[None, :] < HEAD_DIM)
        mask_v = in_t[:, None] & (offs_dv[None, :] < HEAD_DV)
        q = tl.load(Q + offs_t[:, None] * stride_qt + offs_d[None, :], mask=mask_qk, other=0.0).to(tl.float32)
        k = tl.load(K + offs_t[:, None] * stride_kt + offs_d[None, :], mask=mask_qk, other=0.0).to(tl.float32)
        v = tl.load(V + offs_t[:, None] * stride_vt + offs_dv[None, :], mask=mask_v, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if GATE == "scalar":
            # Padding past T gets log gate 0 (a = 1): it changes nothing, and k = v = 0 there.
            b = tl.cumsum(tl.load(LOG_F + bh * T + offs_t, mask=in_t, other=0.0), axis=0)
            b_last = tl.sum(tl.where(offs_c == CHUNK - 1, b, 0.0), axis=0)
            s = s * tl.exp(tl.where(causal, b[:, None] - b[None, :], float("-inf")))
            o = tl.dot(q * tl.exp(b)[:, None], H, input_precision=PRECISION)
            o += tl.dot(s, v, input_precision=PRECISION)
            H = H * tl.exp(b_last) + tl.dot(tl.trans(k * tl.exp(b_last - b)[:, None]), v, input_precision=PRECISION)
        else:
            s = tl.where(causal, s, 0.0)
            o = tl.dot(q, H, input_precision=PRECISION) + tl.dot(s, v, input_precision=PRECISION)
            H += tl.dot(tl.trans(k), v, input_precision=PRECISION)
        tl.store(O + offs_t[:, None] * stride_ot + offs_dv[None, :], o.to(O.dtype.element_ty), mask=mask_v)


def chunked_linear_attention(q, k, v, *, log_f=None, chunk: int = 64):
    """Causal linear attention, optionally with a per-token scalar log forget gate.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``;
    ``log_f``: ``(..., T)`` with entries <= 0, or None (no gate).  ``D, Dv`` in
    16..128; fp16/bf16/fp32 inputs, fp32 state and accumulation.
    ``S_t = exp(log_f[t]) S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t`` (no scale).
    The caller validates ``log_f``'s values (the chapter modules do).
    """
    n, q3, k3, v3, dtype = prepare_qkv(q, k, v)
    BH = q3.shape[0]
    out = torch.empty(q3.shape[:-1] + (n.Dv,), dtype=dtype, device=q.device)
    if n.T == 0 or BH == 0:
        return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
    gate, log_f3 = ("scalar", prepare_per_token(log_f, n, BH)) if log_f is not None else ("none", q3)
    block_dv = min(next_pow2(n.Dv), 64)
    grid = (triton.cdiv(n.Dv, block_dv), BH)
    _linear_fwd[grid](q3, k3, v3, out, log_f3, n.T, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                      v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
                      HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=block_dv,
                      CHUNK=chunk, GATE=gate, PRECISION=dot_precision(dtype),
                      num_warps=4, num_stages=1 if interpreting() else 2)
    return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
