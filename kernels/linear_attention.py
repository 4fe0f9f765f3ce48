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

* ``"channel"``: a per-token, per-key-channel log gate ``log_f[t, d] <= 0``
  (GLA's diagonal gate), ``S_t = S_{t-1} diag(a_t) + v_t k_t^T`` with
  ``a_t = exp(log_f[t])`` a D-vector.  With ``b_i`` now a D-vector (the
  per-channel cumulative log gate from the chunk start)::

      O_c = (Q_c * e^{b}) H + A_c V_c,    A_c[i, j] = sum_d q_id k_jd e^{b_id - b_jd}  (j <= i)
      H  <- diag(e^{b_last}) H + (K_c * e^{b_last - b})^T V_c

  The intra-chunk scores ``A_c`` no longer factor into a matrix product with a
  scalar decay.  The usual factorisation ``(q_i * e^{b_i}) . (k_j * e^{-b_j})``
  needs ``e^{-b_j}``, the exp of a *positive* number: with ``log_f = -20`` it
  overflows fp32 (``e^{88.7}``) after five tokens.  One reference point per
  chunk only moves the problem (some ``b_i - b_ref`` or ``b_ref - b_j`` is then
  positive); a reference per pair of sub-chunks rescues the off-diagonal
  sub-blocks, but the diagonal ones still need the unfactorised sum.  So this
  path never factorises: the chunk
  is small (``CHANNEL_CHUNK = 16`` tokens, whatever ``chunk`` says) and
  ``A_c`` is a 3-D broadcast sum over channels, ``C x C x BLOCK_DC`` at a time,
  with the mask applied *before* the exponential (``e^{-inf} = 0``), so every
  exponent that is ever formed is ``b_id - b_jd <= 0`` (``j <= i``).  The cost
  is ``O(C D)`` exponentials per token instead of a tensor-core product, the
  price of exactness: nothing is rescaled, so the only error is fp32 rounding.
  The exponents are differences of chunk-local prefix sums, ``|b| <= 16 max|log_f|``,
  so ``b_id - b_jd`` carries an absolute error of about ``16 max|log_f| 2^-24``,
  i.e. a relative error of at most ~2e-5 on a weight when ``log_f`` reaches -20
  (one more reason for short chunks).  Measured against float64 in the
  interpreter, fp32 (max error / max |ref|, ``tests/test_fox.py``): ~1e-7 for
  smooth gates (logsigmoid of N(2, 1)), like the ungated path; up to ~2e-6 for
  gates uniform in [-20, 0]; up to ~1.5e-5 for gates that jump between -20 and
  -0.01.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import dot_precision, interpreting, next_pow2, prepare_per_token, prepare_qkv

CHANNEL_CHUNK = 16  # chunk length of the per-channel path (its intra-chunk term is C x C x BLOCK_DC)


@triton.jit
def _channel_scores(Q, K, G, offs_t, in_t, stride_qt, stride_kt,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, CHUNK: tl.constexpr):
    """Intra-chunk scores ``A[i, j] = sum_d q_id k_jd exp(b_id - b_jd)`` for ``j <= i``, else 0.

    ``G`` points at this head's per-channel log gates, ``(T, HEAD_DIM)`` contiguous.
    Channels are visited ``BLOCK_DC`` at a time (bounded registers); each slice's
    cumulative gate is recomputed from the loads, which hit the cache.
    """
    offs_c = tl.arange(0, CHUNK)
    causal = (offs_c[:, None] >= offs_c[None, :])[:, :, None]
    a = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_D, BLOCK_DC):
        offs_e = d0 + tl.arange(0, BLOCK_DC)
        mask = in_t[:, None] & (offs_e[None, :] < HEAD_DIM)
        q = tl.load(Q + offs_t[:, None] * stride_qt + offs_e[None, :], mask=mask, other=0.0).to(tl.float32)
        k = tl.load(K + offs_t[:, None] * stride_kt + offs_e[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.cumsum(tl.load(G + offs_t[:, None] * HEAD_DIM + offs_e[None, :], mask=mask, other=0.0), axis=0)
        # Mask first, exponentiate second: only b_id - b_jd with j <= i (never > 0) reaches exp.
        decay = tl.exp(tl.where(causal, b[:, None, :] - b[None, :, :], float("-inf")))
        a += tl.sum(q[:, None, :] * k[None, :, :] * decay, axis=2)
    return a


@triton.jit
def _linear_fwd(Q, K, V, O, LOG_F, T,
                stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                CHUNK: tl.constexpr, GATE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_DC: tl.constexpr):
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
        elif GATE == "channel":
            # Per-channel cumulative log gate from the chunk start, (CHUNK, BLOCK_D); padding gets 0.
            G = LOG_F + bh * T * HEAD_DIM
            b = tl.cumsum(tl.load(G + offs_t[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_qk, other=0.0), axis=0)
            b_last = tl.sum(tl.where(offs_c[:, None] == CHUNK - 1, b, 0.0), axis=0)
            s = _channel_scores(Q, K, G, offs_t, in_t, stride_qt, stride_kt, HEAD_DIM, BLOCK_D, BLOCK_DC, CHUNK)
            o = tl.dot(q * tl.exp(b), H, input_precision=PRECISION)
            o += tl.dot(s, v, input_precision=PRECISION)
            H = H * tl.exp(b_last)[:, None] + tl.dot(tl.trans(k * tl.exp(b_last[None, :] - b)), v,
                                                     input_precision=PRECISION)
        else:
            s = tl.where(causal, s, 0.0)
            o = tl.dot(q, H, input_precision=PRECISION) + tl.dot(s, v, input_precision=PRECISION)
            H += tl.dot(tl.trans(k), v, input_precision=PRECISION)
        tl.store(O + offs_t[:, None] * stride_ot + offs_dv[None, :], o.to(O.dtype.element_ty), mask=mask_v)


def chunked_linear_attention(q, k, v, *, log_f=None, chunk: int = 64):
    """Causal linear attention, optionally with a log forget gate per token or per token and key channel.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``;
    ``D, Dv`` in 16..128; fp16/bf16/fp32 inputs, fp32 state and accumulation.
    ``o_t = S_t q_t`` (no scale), with ``log_f``

    * None: ``S_t = S_{t-1} + v_t k_t^T`` (no gate);
    * ``(..., T)``, entries <= 0, a scalar per token (RetNet, Mamba2):
      ``S_t = exp(log_f[t]) S_{t-1} + v_t k_t^T``;
    * ``(..., T, D)``, entries <= 0, one gate per key channel (GLA):
      ``S_t = S_{t-1} diag(exp(log_f[t])) + v_t k_t^T``.  This path always uses
      chunks of ``CHANNEL_CHUNK = 16`` tokens (``chunk`` is ignored; see the
      module docstring for why).

    ``chunk`` (a power of two >= 16) is the chunk length of the other paths.
    The caller validates ``log_f``'s values (the chapter modules do); its shape
    is checked here, since it selects the path.
    """
    n, q3, k3, v3, dtype = prepare_qkv(q, k, v)
    BH = q3.shape[0]
    out = torch.empty(q3.shape[:-1] + (n.Dv,), dtype=dtype, device=q.device)
    gate, log_f3 = "none", q3  # a dummy pointer when there is no gate
    if log_f is not None:
        if not isinstance(log_f, torch.Tensor):
            raise TypeError(f"`log_f` must be a torch.Tensor or None, got {type(log_f).__name__}")
        if tuple(log_f.shape) == n.lead + (n.T,):
            gate = "scalar"
        elif tuple(log_f.shape) == n.lead + (n.T, n.D):
            gate = "channel"
        else:
            raise ValueError(f"`log_f` must have shape {n.lead + (n.T,)} (a gate per token) or "
                             f"{n.lead + (n.T, n.D)} (a gate per token and key channel), got {tuple(log_f.shape)}")
        if log_f.device != q.device:
            raise ValueError(f"`log_f` must be on {q.device}, got {log_f.device}")
    if n.T == 0 or BH == 0:
        return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
    if gate == "scalar":
        log_f3 = prepare_per_token(log_f, n, BH)
    elif gate == "channel":
        log_f3 = log_f.reshape(BH, n.T, n.D).to(torch.float32).contiguous()
        chunk = CHANNEL_CHUNK
    block_d = next_pow2(n.D)
    block_dv = min(next_pow2(n.Dv), 64)
    grid = (triton.cdiv(n.Dv, block_dv), BH)
    _linear_fwd[grid](q3, k3, v3, out, log_f3, n.T, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                      v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
                      HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=block_d, BLOCK_DV=block_dv,
                      CHUNK=chunk, GATE=gate, PRECISION=dot_precision(dtype), BLOCK_DC=min(block_d, 32),
                      num_warps=4, num_stages=1 if interpreting() else 2)
    return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
