r"""Chunked linear attention: the linear-side template of the book.

One program owns one (batch, head) and one block of ``BLOCK_DV`` value
channels.  It walks the sequence chunk by chunk, carrying the state
``H = S^T`` (``D x BLOCK_DV``, fp32) in registers::

    O_c = Q_c H + (Q_c K_c^T * M) V_c        (M: causal 0/1 mask, diagonal kept)
    H  <- H + K_c^T V_c

which is :func:`pathedu.nope.linear_chunked` line by line.  Work is
``O(T C D)`` in matrix products; the state never leaves the chip.

The gate is two hooks that compose.  ``DECAY`` multiplies the transition by a
per-token scalar, and ``GATE`` picks the transition itself:

* ``DECAY``: a per-token log forget gate ``log_f[t] <= 0`` (a scalar per
  head, as in RetNet's constant gamma or Mamba2's data-dependent gate), so that
  ``S_t = a_t S_{t-1} A_t + v_t k_t^T`` with ``a_t = exp(log_f[t])`` and ``A_t``
  the transition below (the identity for plain linear attention: the launcher's
  ``"scalar"`` gate).  A scalar commutes with every transition, so within a chunk
  with cumulative log gate ``b`` (``b_i = sum_{s<=i} log_f[s]``, from the chunk
  start) it only rescales what the transition computed::

      O_c = diag(e^{b}) O_c^inter + (S_c * e^{b_i - b_j} * M) V_c
      H  <- e^{b_last} P_c^T H + (K_c * e^{b_last - b_j})^T V_c

  Every exponent is <= 0, so nothing overflows however strong the decay.

  ``DECAY == "head"`` is RetNet's case, one gate per head (``LOG_F``: ``(BH,)``, the
  log of gamma): then ``b_i = (i + 1) log gamma`` in every chunk, so the decays are made
  once per program, before the chunk loop, with no load and no prefix sum in it (a
  sixth of RetNet's time at T = 8192, measured on an H100).  A gate
  per token (``DECAY == "token"``, ``LOG_F``: ``(BH, T)``) needs each chunk's own sums.

* ``"none"``: plain linear attention (chapter 1), ``O_c^inter = Q_c H``,
  ``S_c = Q_c K_c^T * M``, ``P_c = I``.

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

* ``"householder"``: the Householder RNN / DeltaNet transition
  ``S_t = S_{t-1} (I - beta_t w_t w_t^T) + v_t k_t^T`` (chapter 5).  Its chunk factors
  come from the UT preparation pass (:mod:`.ut_prepare`, launched by
  :mod:`.delta_rule`): ``Q`` and ``K`` then hold the boundary-adjusted ``q~``, ``k~``,
  and the hook reads the in-chunk scores Ã and the chunk transition ``G_c = P_c^T - I``::

      O_c = Q~_c H + Ã_c V_c
      H  <- H + G_c H + K~_c^T V_c

  with products whose operands are rounded to nearest (:func:`._pieces.dot`: the
  state is multiplied by ``I + G_c`` chunk after chunk, and truncated tf32 operands
  would shrink it a little every time).  With ``DECAY`` on top this is chapter 7's
  gated Householder RNN: the UT factors stay gate-free.

* ``"delta"``: DeltaNet's transition ``S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` in the
  WY form (:mod:`.delta_rule`).  ``V`` holds the preparation pass's ``U~ = A V`` and ``AD`` its
  ``W = A K`` (:class:`.ut_prepare.WYPrepared`); the hook turns them into the pseudo-values given
  the state, and the rest is the ungated template with ``U`` in place of ``V``::

      U_c = U~_c - W_c H,   O_c = Q_c H + (Q_c K_c^T * M) U_c,   H <- H + K_c^T U_c

  With ``DECAY`` this is Gated DeltaNet; the decay then also sits inside ``A`` and ``W``
  (the preparation pass's ``log_f``), since DeltaNet's correction reads the decayed state.

RoPE (chapter 4's complex recurrence) is a third hook, ``ROTATE``: q and k are turned by
their positions as each chunk is loaded (:func:`._pieces.load_rotated`, channels in pair
order), so the rotation costs no pass through memory; every tile is loaded once anyway.

Non-finite inputs.  Every causal mask is a select, never a multiply by 0.  A NaN or
inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at positions ``>= t``
only: the rows that see it, and through the state every later row (NaN in ``q`` or
``k``; NaN in the channel for ``v``).  Values need care: inside ``A_c V_c`` a NaN
would reach the earlier rows of its chunk as ``0 * NaN``.  The forward is two
launches, as the FlashAttention template's: :func:`_linear_fwd` multiplies plainly
and flags each program whose final state is not finite (every value reaches the
state, and nothing makes a NaN finite again); :func:`_linear_careful` redoes the
flagged ones with the values' NaN/inf replaced by 0 in the products and the
channels that had one set to NaN from its row on.  Inputs are validated once, at
the entry point (:mod:`._launch`).

The state.  ``initial_state`` starts ``H`` from a given ``S^T`` instead of 0, and the final ``H`` can be
returned: a sequence runs in pieces (prefill in chunks, then decoding a token at a time), each piece
starting from the last one's state, as the recurrent forms do.

The backward pass (gates ``"none"``, per token, per head, per channel; the rotation, Householder and
delta hooks have none: a call with gradients turns q and k first) is three launches, for a chunk with local cumulative log gate
``b`` (``b_last`` its last entry), state ``H_in`` entering it and ``H_out`` leaving it::

    O_c   = diag(e^b) Q_c H_in + (Q_c K_c^T * E * M) V_c,        E_ij = e^{b_i - b_j}
    H_out = e^{b_last} H_in + (K_c * e^{b_last - b})^T V_c

1. the forward stores ``H_in`` of every chunk (``STORE_STATES``, fp32 ``(BH, NC, D, Dv)``) and the
   final state;
2. :func:`_linear_bwd_state` scans right to left for ``dH_out`` of every chunk, from the final state's
   gradient: ``dH_in = e^{b_last} dH_out + (Q_c * e^b)^T dO_c`` (its last one is the initial state's);
3. :func:`_linear_bwd_chunk` (:func:`_linear_bwd_channel` for the per-channel gate) gives each chunk's::

       dQ = diag(e^b) dO H_in^T + (dO V^T * E * M) K
       dK = (dO V^T * E * M)^T Q + diag(e^{b_last - b}) V dH_out^T
       dV = (Q K^T * E * M)^T dO + diag(e^{b_last - b}) K dH_out

   and the gates' gradient, through the cumulative log gates ``c``: the outputs read them only through
   ``q_t e^{c_t}`` and ``k_t e^{-c_t}``, and the final state through its factor ``e^{c_{T-1}}``, so
   ``dc_t = q_t . dq_t - k_t . dk_t`` plus ``<dS, S>`` at ``t = T - 1``, and ``d log_f[s] = sum_{t >= s}
   dc_t`` (:func:`_gate_grad`).  Terms that cancel exactly in ``dc`` are left out of its sums, so that
   strong gates (``log_f = -20``) leave no rounding noise in a gradient of order ``e^{-20}``.

On Hopper, Triton 3.4 to 3.7.0 miscompiles the transpose of a tile that a product made (wrong
gradients): no product's result is transposed here.  A transposed operand is read so from memory, or
made as the product in the other order (``(Q K^T)^T`` as ``K Q^T``).  Every causal mask of the
backward is a select, so a NaN or inf in ``q``, ``k`` or ``v`` reaches only the gradient rows that
read it (the products that would carry it further, ``0 * NaN``, see the input without it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..alibi import gamma_condition
from ..checks import QKV, check_bool, check_positive_int, checked_after, log_gate_condition
from ..fox import CHANNEL_CHUNK  # the per-channel path's chunk length: the reference form owns it
from ._launch import (Flat, dot_precision, interpreting, next_pow2, per_head, per_token, prepare_qkv,
                      rotate_args, row_strides, state_result, state_rows, wants_grad)
from ._pieces import (any_nonfinite, dot, finite_or_zero, input_dot, load_rotated, load_rows, quiet_fp32,
                      quiet_nan, rope_cos_sin, rope_shift, store_rows)

__all__ = ["chunked_linear_attention", "gated_linear_attention", "CHANNEL_CHUNK"]


@triton.jit
def _channel_scores(Q, K, G, offs_t, in_t, stride_qt, stride_kt,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, CHUNK: tl.constexpr):
    """Intra-chunk scores ``A[i, j] = sum_d q_id k_jd exp(b_id - b_jd)`` for ``j <= i``, else 0.

    ``G`` points at this head's per-channel log gates, ``(T, HEAD_DIM)`` contiguous.
    Channels are visited ``BLOCK_DC`` at a time (bounded registers); each slice's
    cumulative gate is recomputed from the loads, which hit the cache.
    """
    offs_c = tl.arange(0, CHUNK)
    causal = offs_c[:, None] >= offs_c[None, :]
    a = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_D, BLOCK_DC):
        offs_e = d0 + tl.arange(0, BLOCK_DC)
        mask = in_t[:, None] & (offs_e[None, :] < HEAD_DIM)
        q = tl.load(Q + offs_t[:, None] * stride_qt + offs_e[None, :], mask=mask, other=0.0).to(tl.float32)
        k = tl.load(K + offs_t[:, None] * stride_kt + offs_e[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.cumsum(tl.load(G + offs_t[:, None] * HEAD_DIM + offs_e[None, :], mask=mask, other=0.0), axis=0)
        # Mask first, exponentiate second: only b_id - b_jd with j <= i (never > 0) reaches exp.
        decay = tl.exp(tl.where(causal[:, :, None], b[:, None, :] - b[None, :, :], float("-inf")))
        a += tl.sum(q[:, None, :] * k[None, :, :] * decay, axis=2)
    # Select, not multiply: a NaN or inf in a future key made q_i k_j * 0 = NaN above the diagonal.
    return tl.where(causal, a, 0.0)


@triton.jit
def _chunk_last(b, offs_c, CHUNK: tl.constexpr):
    """The last entry ``b_last`` of a chunk's cumulative log gates ``b [C]`` (``b_i``: the gates of its rows ``<= i``
    summed)."""
    return tl.sum(tl.where(offs_c == CHUNK - 1, b, 0.0), axis=0)


@triton.jit
def _decay_tile(b, causal):
    """The decays ``e^{b_i - b_j}`` ``[C, C]`` of a chunk's cumulative log gates ``b [C]``, 0 above the diagonal:
    masked before exp, so every exponent is a sum of gates, ``<= 0``.  A ``[C, C]`` fp32 tile is 32 registers per
    thread at 4 warps: made where it is used, not kept through the chunk (Gated DeltaNet's loop spilled 152 bytes a
    thread with it made at the chunk's start, 8 without)."""
    return tl.exp(tl.where(causal, b[:, None] - b[None, :], float("-inf")))


@triton.jit
def _state_tile(ptr, offs_d, offs_dv, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Pointers and mask of a block of one head's fp32 state ``H = S^T``, ``(D, Dv)`` row-major at ``ptr``: rows
    ``offs_d``, columns ``offs_dv`` (``[BD, BDV]``), or with ``TRANSPOSED`` the transposed block ``[BDV, BD]``,
    read so from memory (a product that needs ``H^T`` gets it without a transpose in registers)."""
    if TRANSPOSED:
        return (ptr + offs_dv[:, None] + offs_d[None, :] * HEAD_DV,
                (offs_dv[:, None] < HEAD_DV) & (offs_d[None, :] < HEAD_DIM))
    else:
        return (ptr + offs_d[:, None] * HEAD_DV + offs_dv[None, :],
                (offs_d[:, None] < HEAD_DIM) & (offs_dv[None, :] < HEAD_DV))


@triton.jit
def _linear_chunks(Q, K, V, O, LOG_F, AD, GM, H0, STATES, T, log2_base,
                   stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                   stride_ab, stride_at, stride_gb, stride_gj,
                   HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_DC: tl.constexpr, ROTATE: tl.constexpr, SAFE: tl.constexpr, LOAD_H0: tl.constexpr,
                   STORE_STATES: tl.constexpr):
    """The chunked template, one program per (block of ``BLOCK_DV`` value channels, head): grid
    ``(cdiv(Dv, BLOCK_DV), BH)``; the state ``H = S^T [BD, BDV]`` stays in registers for the whole sequence,
    and is returned.

    ``Q, K: (BH, T, D)``, ``V, O: (BH, T, Dv)``; ``LOG_F``: ``(BH, T)`` (``DECAY == "token"``), ``(BH,)``
    (``DECAY == "head"``) or ``(BH, T, D)`` (``GATE == "channel"``); ``AD, GM``: the preparation pass's
    in-chunk scores and chunk transitions (``GATE == "householder"``), or ``AD``: the rows of DeltaNet's ``W``
    and ``V``: its ``U~`` (``GATE == "delta"``).  The module docstring has the hooks and the chunk equations.

    ``SAFE`` (the careful pass): the products see the values without their NaN/inf, and the rows at or after a
    channel's first NaN/inf get NaN in that channel.  Without it the products are plain: a NaN or inf value
    then reaches earlier rows of its chunk (``0 * NaN``), and the state, which :func:`_linear_fwd` checks.

    ``LOAD_H0``: the state starts from ``H0`` (fp32 ``(BH, D, Dv)``, the initial ``S^T`` of each head) instead of 0.
    ``STORE_STATES``: the state entering each chunk is stored to ``STATES`` (fp32 ``(BH, NC, D, Dv)``,
    ``NC = cdiv(T, CHUNK)``), for the backward pass (:func:`_linear_bwd_state`, :func:`_linear_bwd_chunk`)."""
    bh = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    Q += bh * stride_qb
    K += bh * stride_kb
    V += bh * stride_vb
    causal = offs_c[:, None] >= offs_c[None, :]
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM

    if DECAY == "head":  # RetNet: b_i = (i + 1) log gamma in every chunk, so the decays are made once
        log_g = tl.load(LOG_F + bh)
        b = log_g * (offs_c + 1).to(tl.float32)
        b_last = _chunk_last(b, offs_c, CHUNK)
        decay = _decay_tile(b, causal)
    if LOAD_H0:  # the state S^T, on chip for the whole sequence
        h0_ptrs, h0_mask = _state_tile(H0 + bh * HEAD_DIM * HEAD_DV, offs_d, offs_dv, HEAD_DIM, HEAD_DV, False)
        H = tl.load(h0_ptrs, mask=h0_mask, other=0.0)
    else:
        H = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    if SAFE:
        first = tl.full([BLOCK_DV], CHUNK, tl.int32)  # no NaN/inf value seen yet
    if ROTATE != "none":  # cos/sin of the offsets inside a chunk, once: every chunk shifts them (rope_shift)
        c0, s0 = rope_cos_sin(offs_c, log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [C, BD / 2]
    for start in range(0, T, CHUNK):
        # This chunk's rows (absolute positions: offsets computed in the loop, not held in
        # registers across it); padding past T loads as zeros.
        offs_t = start + offs_c
        if STORE_STATES:  # the state entering this chunk, for the backward pass
            st_ptrs, st_mask = _state_tile(STATES + (bh * tl.cdiv(T, CHUNK) + start // CHUNK) * HEAD_DIM * HEAD_DV,
                                           offs_d, offs_dv, HEAD_DIM, HEAD_DV, False)
            tl.store(st_ptrs, H, mask=st_mask)
        if ROTATE == "none":
            # In the inputs' dtype, turned to fp32 where a product needs it (Q K^T needs not: a 16-bit
            # value is exact in tf32, so the 16-bit product is the one fp32 tiles gave, at twice the rate).
            q = load_rows(Q, offs_t, offs_d, stride_qt, T, HEAD_DIM, True, CHECK_D)
            k = load_rows(K, offs_t, offs_d, stride_kt, T, HEAD_DIM, True, CHECK_D)
            if GATE == "delta":  # fp32 inputs meet dot's tf32 rounding (_rn): their NaNs made quiet first
                q = quiet_fp32(q)
                k = quiet_fp32(k)
        else:  # the complex recurrence: q and k turned by their positions as they are loaded (pair order)
            cr, sr = rope_shift(c0, s0, start, log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [C, BD / 2]
            q = load_rotated(Q, offs_t, stride_qt, T, cr, sr, HEAD_DIM // 2, CHUNK, BLOCK_D // 2,
                              ROTATE == "interleaved")  # [C, BD] fp32
            k = load_rotated(K, offs_t, stride_kt, T, cr, sr, HEAD_DIM // 2, CHUNK, BLOCK_D // 2,
                              ROTATE == "interleaved")
        v = load_rows(V, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
        if GATE == "householder" and not SAFE:
            # fp32 values go through dot's tf32 rounding, which would turn a canonical NaN (0x7FFFFFFF, what GPU
            # arithmetic returns) into -0.0: the state would stay finite and the flag miss it.  DeltaNet's values
            # are quieted after U~ - W S below.
            v = quiet_fp32(v)
        v = v.to(tl.float32)
        if SAFE:
            # Products see finite values only: in a product, 0 * NaN = NaN would reach the rows
            # before a NaN.  `first`: per value channel, the first row with a NaN/inf (CHUNK: none).
            finite = tl.abs(v) < float("inf")
            first = tl.minimum(first, tl.min(tl.where(finite, CHUNK, offs_c[:, None]), axis=0))
            v = tl.where(finite, v, 0.0)
        if DECAY == "token":
            # The scalar log gate, from the chunk start: b_i = sum_{s<=i} log_f[s] (padding past T
            # gets 0, a = 1: it changes nothing, and k = v = 0 there).
            b = tl.cumsum(tl.load(LOG_F + bh * T + offs_t, mask=offs_t < T, other=0.0), axis=0)
            b_last = _chunk_last(b, offs_c, CHUNK)
        # Each transition gives the inter-chunk output o = Q H, the intra-chunk scores s (zero
        # above the diagonal) and the carried state h = P^T H before this chunk's writes.
        if GATE == "channel":
            # Per-channel cumulative log gate from the chunk start, (CHUNK, BLOCK_D); padding gets 0.
            G = LOG_F + bh * T * HEAD_DIM
            bc = tl.cumsum(load_rows(G, offs_t, offs_d, HEAD_DIM, T, HEAD_DIM, True, CHECK_D), axis=0)
            bc_last = tl.sum(tl.where(offs_c[:, None] == CHUNK - 1, bc, 0.0), axis=0)
            s = _channel_scores(Q, K, G, offs_t, offs_t < T, stride_qt, stride_kt, HEAD_DIM, BLOCK_D, BLOCK_DC, CHUNK)
            o = tl.dot(q.to(tl.float32) * tl.exp(bc), H, input_precision=PRECISION)  # [C, BDV]
            h = H * tl.exp(bc_last)[:, None]
            k = k.to(tl.float32) * tl.exp(bc_last[None, :] - bc)
        elif GATE == "householder":
            # Q, K hold q~, k~; Ã (zero above the diagonal) and G_c come from the preparation pass.
            g = load_rows(GM + bh * stride_gb + (start // CHUNK) * stride_gj, offs_d, offs_d, HEAD_DIM, HEAD_DIM,
                           HEAD_DIM, CHECK_D, CHECK_D)  # [BD, BD]
            o = dot(q, H, PRECISION)
            h = H + dot(g, H, PRECISION)  # P^T H
            s = load_rows(AD + bh * stride_ab, offs_t, offs_c, stride_at, T, CHUNK, False, False)  # [C, C]: late,
            # as DeltaNet's scores below (registers)
        elif GATE == "delta":
            # V holds U~ (A V), AD the rows of W (A diag(e^b) K): the pseudo-values U = U~ - W S^T given
            # the state, then the plain template with U in place of V.
            wc = load_rows(AD + bh * stride_ab, offs_t, offs_d, stride_at, T, HEAD_DIM, True, CHECK_D)  # [C, BD]
            v -= dot(wc.to(tl.float32), H, PRECISION)  # [C, BDV]
            if not SAFE:
                # A NaN in U~ comes out of this subtraction as the GPU's canonical NaN, which the rounding of
                # the state's update would turn into -0.0: the state would stay finite and the flag miss it.
                v = quiet_nan(v)
            o = dot(q.to(tl.float32), H, PRECISION)
            s = tl.where(causal, input_dot(q, tl.trans(k), PRECISION), 0.0)  # [C, C]: late, so that it is not
            h = H  # kept through the two products above (registers)
        else:
            if ROTATE == "none":
                s = tl.where(causal, input_dot(q, tl.trans(k), PRECISION), 0.0)
            else:  # turned q and k are fp32
                s = tl.where(causal, tl.dot(q, tl.trans(k), input_precision=PRECISION), 0.0)
            o = tl.dot(q.to(tl.float32), H, input_precision=PRECISION)
            h = H
        if DECAY != "none":
            # The gate commutes with every transition: row i of the inter-chunk term decays by
            # e^{b_i}, score (i, j) by e^{b_i - b_j}, the carried state by e^{b_last}, and key j's
            # write by e^{b_last - b_j}.
            o = o * tl.exp(b)[:, None]
            if DECAY == "token":
                s = s * _decay_tile(b, causal)
                h = h * tl.exp(b_last)
                k = k.to(tl.float32) * tl.exp(b_last - b)[:, None]
            else:
                s = s * decay
                # A last chunk cut by T ends at row T - 1: the state decays by gamma^(T - start), and the rows past T
                # (k = 0) get the weight 1, as the gate 0 that pads a gate per token gives them.
                b_end = tl.where(start + CHUNK > T, log_g * (T - start).to(tl.float32), b_last)
                h = h * tl.exp(b_end)
                k = k.to(tl.float32) * tl.exp(tl.minimum(b_end - b, 0.0))[:, None]
            if GATE == "householder" or GATE == "delta":
                k = quiet_nan(k)  # a product: the GPU's canonical NaN, which dot's rounding would lose
        if GATE == "householder" or GATE == "delta":
            # dot rounds its operands to tf32 (_rn), which keeps only quiet NaNs, and the scores, the keys (after a
            # decay) and the state come out of arithmetic, whose NaN on a GPU is the canonical one: each is made
            # quiet where it meets the rounding (a NaN of q or k reaches the rows from its own on through them).
            # Two selects per chunk, three with a decay: on the H100 DeltaNet under 0.5% slower, Gated DeltaNet
            # 2.5-3% (kernels/NOTES_path.md, "NaNs through the rounding").
            o += dot(quiet_nan(s), v, PRECISION)
            # H <- P^T H + K~^T V (householder), H + K^T U (delta); quiet for the next chunk's products
            H = quiet_nan(h + dot(tl.trans(k.to(tl.float32)), v, PRECISION))
        else:
            o += tl.dot(s, v, input_precision=PRECISION)
            H = h + tl.dot(tl.trans(k.to(tl.float32)), v, input_precision=PRECISION)
        if SAFE:
            # The rows at or after a NaN/inf of their channel get NaN (IEEE would give NaN or +-inf,
            # depending on signs); a later chunk sees it from its first row on.
            o = tl.where(first[None, :] <= offs_c[:, None], float("nan"), o)
        store_rows(O + bh * stride_ob, o, offs_t, offs_dv, stride_ot, T, HEAD_DV)
        if SAFE:
            first = tl.where(first < CHUNK, 0, CHUNK)
    return H


@triton.jit
def _linear_fwd(Q, K, V, O, LOG_F, AD, GM, H0, STATES, HT, FLAGS, T, log2_base,
                stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                stride_ab, stride_at, stride_gb, stride_gj,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_DC: tl.constexpr, ROTATE: tl.constexpr, LOAD_H0: tl.constexpr, STORE_STATES: tl.constexpr,
                STORE_FINAL: tl.constexpr):
    """The fast pass: :func:`_linear_chunks` with plain products, then a flag per program (``FLAGS``: int8, one
    per program, row-major over the grid): set when the final state holds a NaN or inf.  Every value of a
    sequence reaches the state (``H += K^T V``, and ``0 * NaN`` is NaN), and no product, sum or decay turns a NaN
    or inf back into a finite number (the one rounding that could, :func:`._pieces._rn` of a canonical GPU NaN, gets
    quiet NaNs: the scores, keys, state and DeltaNet's ``U~ - W S`` are made quiet where they meet it, fp32 inputs
    where they are loaded, and the preparation passes store their fp32 factors quiet), so a finite final state means
    no value was NaN or inf: then every product equals the careful pass's bit for bit, and the outputs are final.

    The states this pass stores (``STORE_STATES``; ``STORE_FINAL``: the final state ``H`` to ``HT``, fp32
    ``(BH, D, Dv)``) are the plain products' too: a NaN or inf value stays in every later state, as it does in the
    recurrence (the careful pass, which multiplies the values without their NaN/inf, stores none)."""
    H = _linear_chunks(Q, K, V, O, LOG_F, AD, GM, H0, STATES, T, log2_base, stride_qb, stride_qt, stride_kb,
                       stride_kt, stride_vb, stride_vt, stride_ob, stride_ot, stride_ab, stride_at, stride_gb,
                       stride_gj, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, CHUNK, GATE, DECAY, PRECISION, BLOCK_DC,
                       ROTATE, False, LOAD_H0, STORE_STATES)
    if STORE_FINAL:
        offs_dv = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
        ht_ptrs, ht_mask = _state_tile(HT + tl.program_id(1).to(tl.int64) * HEAD_DIM * HEAD_DV, tl.arange(0, BLOCK_D),
                                       offs_dv, HEAD_DIM, HEAD_DV, False)
        tl.store(ht_ptrs, H, mask=ht_mask)
    bad = tl.max(tl.max(tl.where(tl.abs(H) < float("inf"), 0, 1), axis=1), axis=0)  # NaN fails the test too
    tl.store(FLAGS + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), bad.to(tl.int8))


@triton.jit
def _linear_careful(Q, K, V, O, LOG_F, AD, GM, H0, STATES, HT, FLAGS, T, log2_base,
                    stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                    stride_ab, stride_at, stride_gb, stride_gj,
                    HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_DC: tl.constexpr, ROTATE: tl.constexpr, LOAD_H0: tl.constexpr, STORE_STATES: tl.constexpr,
                    STORE_FINAL: tl.constexpr):
    """The careful pass, on :func:`_linear_fwd`'s grid: a program whose flag is set redoes its outputs with
    ``SAFE`` (the others read one byte and stop); it stores no state (``STORE_STATES``, ``STORE_FINAL``: the fast
    pass's, which keep every NaN and inf)."""
    if tl.load(FLAGS + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)) != 0:
        _linear_chunks(Q, K, V, O, LOG_F, AD, GM, H0, STATES, T, log2_base, stride_qb, stride_qt, stride_kb,
                       stride_kt, stride_vb, stride_vt, stride_ob, stride_ot, stride_ab, stride_at, stride_gb,
                       stride_gj, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, CHUNK, GATE, DECAY, PRECISION, BLOCK_DC,
                       ROTATE, True, LOAD_H0, False)


# ---------------------------------------------------------------------------------------------------------------
# The backward pass (three launches: the forward storing each chunk's starting state, then the two below)
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def bdot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` for the backward kernels, fp32 result.  Two 16-bit tiles multiply exactly (fp32 accumulation, the
    tensor cores' full rate); otherwise both operands in fp32 with ``PRECISION``: ``"ieee"`` (exact), ``"tf32n"``
    (:func:`._pieces.dot`: fp32 operands rounded to the nearest tf32 value, every NaN kept; the tensor cores alone
    would truncate them, a bias that does not average out in the sums of the gates' gradient), or ``"x3n"`` (three
    tf32 products, about fp32 accuracy, every NaN kept: fp32 inputs on a GPU)."""
    if a.dtype != tl.float32 and b.dtype == a.dtype:
        return tl.dot(a, b)
    elif PRECISION == "ieee":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return dot(a, b, PRECISION)


@triton.jit
def _nan_from_rows(x, src, offs_c, CHUNK: tl.constexpr, LATER: tl.constexpr):
    """``x`` ``[C, BD]`` with NaN in channel ``d`` of the rows that a non-finite ``src[t, d]`` (``[C, BD]``) reaches
    through a causal product: rows ``>= t`` (``LATER``: ``x_i = sum_{j <= i} w_ij src_j``) or rows ``<= t``
    (``x_j = sum_{i >= j} w_ji src_i``)."""
    finite = tl.abs(src.to(tl.float32)) < float("inf")
    if LATER:
        first = tl.min(tl.where(finite, CHUNK, offs_c[:, None]), axis=0)  # [BD]: first bad row, CHUNK if none
        return tl.where(first[None, :] <= offs_c[:, None], float("nan"), x)
    else:
        last = tl.max(tl.where(finite, -1, offs_c[:, None]), axis=0)  # [BD]: last bad row, -1 if none
        return tl.where(last[None, :] >= offs_c[:, None], float("nan"), x)


@triton.jit
def _causal_dot(acc, w, src, offs_c, CHUNK: tl.constexpr, LATER: tl.constexpr, PRECISION: tl.constexpr):
    """``acc + w @ src`` for a causal weight tile ``w`` (exactly 0 off its triangle, by a select) and an input tile
    ``src`` (``q`` or ``k``).  A NaN or inf of ``src`` would reach the rows whose weight on it is 0 (``0 * NaN``), so
    a tile that holds one (one reduction tells; usually none) is multiplied without it and the rows that do see it
    get NaN in its channel (:func:`_nan_from_rows`)."""
    if any_nonfinite(src):
        out = _nan_from_rows(acc + bdot(w, finite_or_zero(src), PRECISION), src, offs_c, CHUNK, LATER)
    else:
        out = acc + bdot(w, src, PRECISION)
    return out


@triton.jit
def _chunk_gates(LOG_F, bh, offs_t, offs_c, T, DECAY: tl.constexpr, CHUNK: tl.constexpr):
    """A chunk's cumulative log gates ``b`` ``[C]`` from its start and their last entry ``b_last``: from the per-token
    gates (``DECAY == "token"``, ``LOG_F``: ``(BH, T)``) or the head's one gate (``"head"``, ``LOG_F``: ``(BH,)``,
    ``b_i = (i + 1) log gamma``), as the forward makes them; rows past ``T`` get the gate 0 (``b`` stays at its last
    row's value)."""
    if DECAY == "head":
        b = tl.load(LOG_F + bh) * (tl.minimum(offs_t, T - 1) - offs_t + offs_c + 1).to(tl.float32)
    else:
        b = tl.cumsum(tl.load(LOG_F + bh * T + offs_t, mask=offs_t < T, other=0.0), axis=0)
    return b, _chunk_last(b, offs_c, CHUNK)


@triton.jit
def _linear_bwd_state(Q, DO, LOG_F, DHT, DH, DH0, T, stride_qb, stride_qt, stride_vb, stride_vt,
                      HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                      LOAD_DHT: tl.constexpr):
    """The backward's scan, right to left: the gradient ``dH`` of the state after each chunk.

    Grid ``(cdiv(Dv, BLOCK_DV), BH)``, one program per block of value channels and head, as the forward.  With
    ``dH_out`` the gradient reaching the state after chunk ``c`` (``DHT``, the final state's gradient, for the last
    chunk when ``LOAD_DHT``; else 0), the gradient reaching the state before it is::

        dH_in = e^{b_last} dH_out + (Q_c * e^{b})^T dO_c          (per channel: diag(e^{b_last}) dH_out)

    since ``H_out = e^{b_last} H_in + ...`` and ``O_c = diag(e^b) Q_c H_in + ...``.  Stores ``dH_out`` of chunk
    ``c`` to ``DH[bh, c]`` (fp32 ``(BH, NC, D, Dv)``) and the last ``dH_in``, the initial state's gradient, to
    ``DH0`` (fp32 ``(BH, D, Dv)``).  ``Q^T`` (and the per-channel gates' ``b^T``) is read transposed from memory;
    the gates are made as the forward makes them."""
    bh = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    size = HEAD_DIM * HEAD_DV
    s_offs, s_mask = _state_tile(0, offs_d, offs_dv, HEAD_DIM, HEAD_DV, False)  # this block of a (D, Dv) state
    if LOAD_DHT:
        dh = tl.load(DHT + bh * size + s_offs, mask=s_mask, other=0.0)
    else:
        dh = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    Q += bh * stride_qb
    n_chunks = tl.cdiv(T, CHUNK)
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i
        offs_t = c * CHUNK + offs_c
        tl.store(DH + (bh * n_chunks + c) * size + s_offs, dh, mask=s_mask)
        do = load_rows(DO + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
        in_dt = (offs_t[None, :] < T) & (offs_d[:, None] < HEAD_DIM)
        qt = tl.load(Q + offs_t[None, :] * stride_qt + offs_d[:, None], mask=in_dt, other=0.0)  # [BD, C]
        if GATE == "channel":
            bt = tl.cumsum(tl.load(LOG_F + bh * T * HEAD_DIM + offs_t[None, :] * HEAD_DIM + offs_d[:, None],
                                   mask=in_dt, other=0.0), axis=1)
            bt_last = tl.sum(tl.where(offs_c[None, :] == CHUNK - 1, bt, 0.0), axis=1)  # [BD]
            dh = dh * tl.exp(bt_last)[:, None] + bdot(qt.to(tl.float32) * tl.exp(bt), do, PRECISION)
        elif DECAY != "none":
            b, b_last = _chunk_gates(LOG_F, bh, offs_t, offs_c, T, DECAY, CHUNK)
            dh = dh * tl.exp(b_last) + bdot(qt.to(tl.float32) * tl.exp(b)[None, :], do, PRECISION)
        else:
            dh += bdot(qt, do, PRECISION)
    tl.store(DH0 + bh * size + s_offs, dh, mask=s_mask)


@triton.jit
def _linear_bwd_chunk(Q, K, V, DO, LOG_F, STATES, DH, DQ, DK, DV, DC, T,
                      stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_dc,
                      HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr):
    """The gradients of one chunk's ``q, k, v`` (gate none, per token or per head): grid
    ``(NC, BH, 1 + cdiv(D, BLOCK_K))``, one program per chunk, head and role: ``dv`` (role 0), or ``dq, dk`` of the
    key channels ``[(r - 1) BLOCK_K, r BLOCK_K)`` (role ``r >= 1``), the value channels ``BLOCK_DV`` at a time.
    The roles share no tile but ``q`` and ``k``, so each program holds a part of what one program for the whole
    chunk would (registers), and more of them run at once.

    With ``E_ij = e^{b_i - b_j}`` on and below the diagonal (0 above, by a select; 1 without a gate), ``H_in`` the
    state entering the chunk (``STATES``) and ``dH_out`` the gradient of the state after it (``DH``)::

        dQ = diag(e^b) dO H_in^T + (dO V^T * E) K
        dK = (dO V^T * E)^T Q + diag(e^{b_last - b}) V dH_out^T
        dV = (Q K^T * E)^T dO + diag(e^{b_last - b}) K dH_out

    No product's result is ever transposed: ``(Q K^T * E)^T`` is made as ``K Q^T * E^T``, ``(dO V^T)^T`` as
    ``V dO^T``, ``H_in^T`` and ``dH_out^T`` are read transposed from memory.  With a gate the ``dq, dk`` roles also
    store their channels' part of the gradient ``dc`` of the cumulative log gates ``c`` to ``DC`` (fp32
    ``(BH, cdiv(D, BLOCK_K), T)``, rows ``stride_dc`` apart, summed by the caller; RetNet's gate per head, whose
    gradient weighs them by their positions, also gets ``<dH_in, H_in>`` of each chunk after the ``T`` entries: see
    :func:`_gate_grad`): the outputs depend on them only through ``q_t e^{c_t}`` and
    ``k_t e^{-c_t}``, and the final state ``S = e^{c_{T-1}} (S_{-1} + sum_j e^{-c_j} v_j k_j^T)`` also through its
    factor ``e^{c_{T-1}}``, so ``dc_t = q_t . dq_t - k_t . dk_t``, plus ``<dS, S>`` at ``t = T - 1`` (``dS``: the
    final state's gradient, ``DH`` of the last chunk); the terms that cancel exactly are left out of the sums
    (:func:`_bwd_chunk_dqk`)."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = (bh * tl.num_programs(0) + c) * HEAD_DIM * HEAD_DV  # this chunk's (D, Dv) states
    role = tl.program_id(2)
    if role == 0:
        _bwd_chunk_dv(Q, K, DO, LOG_F, DH, DV, base, bh, c * CHUNK, T, stride_qb, stride_qt, stride_kb, stride_kt,
                      stride_vb, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_K, BLOCK_DV, CHUNK, DECAY, PRECISION)
    else:
        _bwd_chunk_dqk(Q, K, V, DO, LOG_F, STATES, DH, DQ, DK, DC, base, bh, c * CHUNK, (role - 1) * BLOCK_K, T,
                       stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_dc, HEAD_DIM, HEAD_DV, BLOCK_K,
                       BLOCK_DV, CHUNK, DECAY, PRECISION)


@triton.jit
def _bwd_chunk_dv(Q, K, DO, LOG_F, DH, DV, base, bh, start, T, stride_qb, stride_qt, stride_kb, stride_kt,
                  stride_vb, stride_vt, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`_linear_bwd_chunk`'s ``dv`` role: ``dV = (K Q^T * E^T) dO + diag(e^{b_last - b}) K dH_out``, the key
    channels ``BLOCK_K`` at a time (both products sum over them)."""
    offs_c = tl.arange(0, CHUNK)
    offs_t = start + offs_c
    later = offs_c[:, None] <= offs_c[None, :]  # [j, i]: i >= j
    at = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for d0 in tl.static_range(0, HEAD_DIM, BLOCK_K):
        offs_d = d0 + tl.arange(0, BLOCK_K)
        q = load_rows(Q + bh * stride_qb, offs_t, offs_d, stride_qt, T, HEAD_DIM, True, True)
        k = load_rows(K + bh * stride_kb, offs_t, offs_d, stride_kt, T, HEAD_DIM, True, True)
        at += bdot(k, tl.trans(q), PRECISION)  # [j, i] = k_j . q_i
    if DECAY != "none":
        b, b_last = _chunk_gates(LOG_F, bh, offs_t, offs_c, T, DECAY, CHUNK)
        at = at * tl.exp(tl.where(later, b[None, :] - b[:, None], float("-inf")))
        w = tl.exp(b_last - b)[:, None]  # key j's weight in the chunk's write
    at = tl.where(later, at, 0.0)  # a select: NaN and inf above the diagonal stay out
    for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
        offs_dv = dv0 + tl.arange(0, BLOCK_DV)
        do = load_rows(DO + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
        dv = bdot(at, do, PRECISION)
        for d0 in tl.static_range(0, HEAD_DIM, BLOCK_K):
            offs_d = d0 + tl.arange(0, BLOCK_K)
            k = load_rows(K + bh * stride_kb, offs_t, offs_d, stride_kt, T, HEAD_DIM, True, True)
            if DECAY != "none":
                k = k.to(tl.float32) * w
            h_offs, h_mask = _state_tile(base, offs_d, offs_dv, HEAD_DIM, HEAD_DV, False)  # [BK, BDV]
            dv += bdot(k, tl.load(DH + h_offs, mask=h_mask, other=0.0), PRECISION)
        store_rows(DV + bh * stride_vb, dv, offs_t, offs_dv, stride_vt, T, HEAD_DV)


@triton.jit
def _value_block(V, DO, STATES, DH, base, bh, offs_t, offs_k, dv0, T, stride_vb, stride_vt, HEAD_DIM: tl.constexpr,
                 HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Value channels ``dv0 .. dv0 + BLOCK_DV`` of one chunk, as the backward's ``dq, dk`` roles read them: ``v`` and
    ``dO`` ``[C, BDV]``, and for the key channels ``offs_k`` the entering state ``H_in^T`` and the leaving state's
    gradient ``dH_out^T`` ``[BDV, BK]`` (read transposed from memory at ``base``)."""
    offs_dv = dv0 + tl.arange(0, BLOCK_DV)
    v = load_rows(V + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
    do = load_rows(DO + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
    ht_offs, ht_mask = _state_tile(base, offs_k, offs_dv, HEAD_DIM, HEAD_DV, True)  # [BDV, BK]
    return (v, do, tl.load(STATES + ht_offs, mask=ht_mask, other=0.0),
            tl.load(DH + ht_offs, mask=ht_mask, other=0.0))


@triton.jit
def _bwd_chunk_dqk(Q, K, V, DO, LOG_F, STATES, DH, DQ, DK, DC, base, bh, start, d0, T, stride_qb, stride_qt,
                   stride_kb, stride_kt, stride_vb, stride_vt, stride_dc, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, DECAY: tl.constexpr,
                   PRECISION: tl.constexpr):
    """:func:`_linear_bwd_chunk`'s ``dq, dk`` role for the key channels ``d0 .. d0 + BLOCK_K`` (and their part of
    ``dc``)."""
    offs_c = tl.arange(0, CHUNK)
    offs_t = start + offs_c
    offs_d = d0 + tl.arange(0, BLOCK_K)
    causal = offs_c[:, None] >= offs_c[None, :]  # [i, j]: j <= i
    later = offs_c[:, None] <= offs_c[None, :]  # [j, i]: i >= j
    q = load_rows(Q + bh * stride_qb, offs_t, offs_d, stride_qt, T, HEAD_DIM, True, True)
    k = load_rows(K + bh * stride_kb, offs_t, offs_d, stride_kt, T, HEAD_DIM, True, True)
    p = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)  # dO V^T, [i, j]
    pt = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)  # V dO^T, [j, i]
    dq = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    dk = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    hdh = 0.0  # <dH_out, H_in> over these key channels
    for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
        v, do, h_in_t, dh_out_t = _value_block(V, DO, STATES, DH, base, bh, offs_t, offs_d, dv0, T, stride_vb,
                                               stride_vt, HEAD_DIM, HEAD_DV, BLOCK_DV)
        p += bdot(do, tl.trans(v), PRECISION)
        pt += bdot(v, tl.trans(do), PRECISION)
        dq += bdot(do, h_in_t, PRECISION)
        dk += bdot(v, dh_out_t, PRECISION)
        if DECAY != "none":
            hdh += tl.sum(tl.sum(h_in_t * dh_out_t, axis=1), axis=0)
    if DECAY == "none":
        dq = _causal_dot(dq, tl.where(causal, p, 0.0), k, offs_c, CHUNK, True, PRECISION)
        dk = _causal_dot(dk, tl.where(later, pt, 0.0), q, offs_c, CHUNK, False, PRECISION)
    else:
        b, b_last = _chunk_gates(LOG_F, bh, offs_t, offs_c, T, DECAY, CHUNK)
        dq = dq * tl.exp(b)[:, None]
        dc_row = DC + (bh * tl.cdiv(HEAD_DIM, BLOCK_K) + d0 // BLOCK_K) * stride_dc
        if DECAY == "head":  # <dH_in, H_in> = e^{b_last} <dH_out, H_in> + sum_i q_i . (dq_i's part from H_in)
            tl.store(dc_row + T + start // CHUNK, tl.exp(b_last) * hdh + tl.sum(tl.sum(q.to(tl.float32) * dq, 1), 0))
        dk = dk * tl.exp(b_last - b)[:, None]  # the state's part of dk: key j's write, read by dH_out
        p = p * tl.exp(tl.where(causal, b[:, None] - b[None, :], float("-inf")))
        pt = pt * tl.exp(tl.where(later, b[None, :] - b[:, None], float("-inf")))
        # dc_t = q_t . dq_t - k_t . dk_t is a sum of terms of both signs, and two kinds of them cancel exactly while
        # each may be far larger than dc (strong gates: every other pair weighs e^{-20}): rounded apart they would
        # leave that much noise.  They are left out of the sums: the diagonal pair (j = i = t), q_t . k_t (dO_t . v_t)
        # in both products, is added to dq and dk after dc is taken; and the last token's own write into the final
        # state, k^T dS v, which the final state's term <dS, S> holds too: row T - 1 gets <dS, S> less that write,
        # e^{b_last} <dS, H_in> + sum_{j < T-1} k_j . dk_j(state) (the last chunk's dH_out is dS), instead of both.
        eye = offs_c[:, None] == offs_c[None, :]
        p_diag = tl.sum(tl.where(eye, p, 0.0), axis=1)  # dO_t . v_t
        kds = tl.sum(k.to(tl.float32) * dk, axis=1)  # k_j . dk_j, the state's part
        dq = _causal_dot(dq, tl.where(causal & (~eye), p, 0.0), k, offs_c, CHUNK, True, PRECISION)
        dki = _causal_dot(tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32), tl.where(later & (~eye), pt, 0.0), q,
                          offs_c, CHUNK, False, PRECISION)
        last = offs_t == T - 1
        final = tl.exp(b_last) * hdh + tl.sum(tl.where(offs_t < T - 1, kds, 0.0), axis=0)  # used by row T - 1 only
        dct = (tl.sum(q.to(tl.float32) * dq, axis=1) - tl.sum(k.to(tl.float32) * dki, axis=1)
               + tl.where(last, final, -kds))
        tl.store(dc_row + offs_t, dct, mask=offs_t < T)
        dq += p_diag[:, None] * k.to(tl.float32)
        dk += dki + p_diag[:, None] * q.to(tl.float32)
    store_rows(DQ + bh * stride_qb, dq, offs_t, offs_d, stride_qt, T, HEAD_DIM)
    store_rows(DK + bh * stride_kb, dk, offs_t, offs_d, stride_kt, T, HEAD_DIM)


@triton.jit
def _linear_bwd_channel(Q, K, V, DO, LOG_F, STATES, DH, DQ, DK, DV, DC, T,
                        stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                        HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, BLOCK_DC: tl.constexpr,
                        PRECISION: tl.constexpr):
    """:func:`_linear_bwd_chunk` for the per-channel gate (GLA), on the forward's terms: chunks of
    ``CHANNEL_CHUNK`` tokens, the decays ``e^{b_id - b_jd}`` of a ``C x C x BLOCK_DC`` tile masked before the
    exponential (every exponent formed is ``<= 0``; no ``e^{-b}``).  With ``P = dO V^T``::

        dQ_id = e^{b_id} (dO H_in^T)_id + sum_{j <= i} P_ij k_jd e^{b_id - b_jd}
        dK_jd = e^{b_last,d - b_jd} (V dH_out^T)_jd + sum_{i >= j} P_ij q_id e^{b_id - b_jd}
        dV_j  = sum_{i >= j} A_ij dO_i + (K * e^{b_last - b})_j dH_out,   A_ij = sum_d q_id k_jd e^{b_id - b_jd}

    The sums are exact fp32 broadcasts, each term masked by a select (a NaN or inf reaches only the rows that see
    it), ``P`` and the state terms tile products.  Stores ``dc_td = q_td dq_td - k_td dk_td`` to ``DC`` (fp32
    ``(BH, T, D)``)."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_t = c * CHUNK + offs_c
    in_t = offs_t < T
    causal = (offs_c[:, None] >= offs_c[None, :])[:, :, None]  # [i, j, 1]: j <= i
    before = (offs_c[:, None] > offs_c[None, :])[:, :, None]  # [i, j, 1]: j < i
    size = HEAD_DIM * HEAD_DV
    base = (bh * tl.num_programs(0) + c) * size
    G = LOG_F + bh * T * HEAD_DIM
    p = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)  # dO V^T
    for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
        offs_dv = dv0 + tl.arange(0, BLOCK_DV)
        v = load_rows(V + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
        do = load_rows(DO + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
        p += bdot(do, tl.trans(v), PRECISION)
    p_diag = tl.sum(tl.where(offs_c[:, None] == offs_c[None, :], p, 0.0), axis=1)  # dO_t . v_t
    a = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_D, BLOCK_DC):
        offs_e = d0 + tl.arange(0, BLOCK_DC)
        mask = in_t[:, None] & (offs_e[None, :] < HEAD_DIM)
        q = tl.load(Q + bh * stride_qb + offs_t[:, None] * stride_qt + offs_e[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        k = tl.load(K + bh * stride_kb + offs_t[:, None] * stride_kt + offs_e[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        bc = tl.cumsum(tl.load(G + offs_t[:, None] * HEAD_DIM + offs_e[None, :], mask=mask, other=0.0), axis=0)
        bc_last = tl.sum(tl.where(offs_c[:, None] == CHUNK - 1, bc, 0.0), axis=0)  # [DC]
        decay = tl.exp(tl.where(causal, bc[:, None, :] - bc[None, :, :], float("-inf")))  # [i, j, d]
        a += tl.sum(tl.where(causal, q[:, None, :] * k[None, :, :] * decay, 0.0), axis=2)
        dq = tl.sum(tl.where(before, p[:, :, None] * k[None, :, :] * decay, 0.0), axis=1)  # [i, d], j < i
        dk = tl.sum(tl.where(before, p[:, :, None] * q[:, None, :] * decay, 0.0), axis=0)  # [j, d], i > j
        dq_in = tl.zeros([CHUNK, BLOCK_DC], dtype=tl.float32)
        dk_out = tl.zeros([CHUNK, BLOCK_DC], dtype=tl.float32)
        hdh = tl.zeros([BLOCK_DC], dtype=tl.float32)  # <dH_out, H_in> per key channel
        for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
            v, do, h_in_t, dh_out_t = _value_block(V, DO, STATES, DH, base, bh, offs_t, offs_e, dv0, T, stride_vb,
                                                   stride_vt, HEAD_DIM, HEAD_DV, BLOCK_DV)
            dq_in += bdot(do, h_in_t, PRECISION)
            dk_out += bdot(v, dh_out_t, PRECISION)
            hdh += tl.sum(h_in_t * dh_out_t, axis=0)
        dq += dq_in * tl.exp(bc)
        dk_out = dk_out * tl.exp(bc_last[None, :] - bc)  # the state's part of dk
        # dc without the terms that cancel exactly (see _linear_bwd_chunk): the diagonal pair q_td P_tt k_td, left
        # out of dq and dk until dc is taken, and the last token's write into the final state, which row T - 1
        # takes from <dS, S> per channel less that write
        kds = k * dk_out
        last = (offs_t == T - 1)[:, None]
        final = tl.exp(bc_last) * hdh + tl.sum(tl.where((offs_t < T - 1)[:, None], kds, 0.0), axis=0)  # [DC]
        dct = q * dq - k * dk + tl.where(last, final[None, :], -kds)
        tl.store(DC + bh * T * HEAD_DIM + offs_t[:, None] * HEAD_DIM + offs_e[None, :], dct, mask=mask)
        dq += p_diag[:, None] * k
        dk += dk_out + p_diag[:, None] * q
        tl.store(DQ + bh * stride_qb + offs_t[:, None] * stride_qt + offs_e[None, :], dq.to(DQ.dtype.element_ty),
                 mask=mask)
        tl.store(DK + bh * stride_kb + offs_t[:, None] * stride_kt + offs_e[None, :], dk.to(DK.dtype.element_ty),
                 mask=mask)
    # the values: key j's weight in the chunk's write, all channels at once
    offs_d = tl.arange(0, BLOCK_D)
    kw = load_rows(K + bh * stride_kb, offs_t, offs_d, stride_kt, T, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    b = tl.cumsum(load_rows(G, offs_t, offs_d, HEAD_DIM, T, HEAD_DIM, True, BLOCK_D != HEAD_DIM), axis=0)
    b_last = tl.sum(tl.where(offs_c[:, None] == CHUNK - 1, b, 0.0), axis=0)
    kw = kw.to(tl.float32) * tl.exp(b_last[None, :] - b)
    for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
        offs_dv = dv0 + tl.arange(0, BLOCK_DV)
        do = load_rows(DO + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True).to(tl.float32)
        h_ptrs, h_mask = _state_tile(base, offs_d, offs_dv, HEAD_DIM, HEAD_DV, False)  # [BD, BDV]
        dv = tl.sum(tl.where(causal, a[:, :, None] * do[:, None, :], 0.0), axis=0)  # [j, BDV]
        dv += bdot(kw, tl.load(DH + h_ptrs, mask=h_mask, other=0.0), PRECISION)
        store_rows(DV + bh * stride_vb, dv, offs_t, offs_dv, stride_vt, T, HEAD_DV)


def chunked_linear_attention(q, k, v, *, log_f=None, chunk: int = 64, initial_state=None,
                             return_state: bool = False):
    """Causal linear attention, optionally with a log forget gate per token or per token and key channel.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``;
    ``D, Dv`` in 16..128; fp16/bf16/fp32 inputs, fp32 state and accumulation.
    ``o_t = S_t q_t`` (no scale), with ``log_f``

    * None: ``S_t = S_{t-1} + v_t k_t^T`` (no gate);
    * ``(..., T)``, finite entries <= 0, a scalar per token (RetNet, Mamba2):
      ``S_t = exp(log_f[t]) S_{t-1} + v_t k_t^T``;
    * ``(..., T, D)``, finite entries <= 0, one gate per key channel (GLA):
      ``S_t = S_{t-1} diag(exp(log_f[t])) + v_t k_t^T``.  This path always uses
      chunks of ``CHANNEL_CHUNK = 16`` tokens (``chunk`` is ignored; see the
      module docstring for why).

    ``chunk`` (a power of two in 16..128) is the chunk length of the other paths.
    ``initial_state``: ``S_{-1}``, ``(..., Dv, D)`` (any floating dtype; default 0); ``return_state=True``
    returns ``(out, S_{T-1})``, the state fp32 ``(..., Dv, D)``, the recurrent forms' conventions
    (:func:`pathedu.nope.linear_recurrent`): a sequence can be run in pieces, each starting from the last one's state.
    Every argument is validated here (values read once the kernel is queued).  Differentiable in ``q, k, v``,
    ``log_f`` and ``initial_state``, and through the returned state (:class:`_LinearAttention`).
    """
    if log_f is None:
        return gated_linear_attention(q, k, v, "none", None, chunk=chunk, initial_state=initial_state,
                                      return_state=return_state)
    return gated_linear_attention(q, k, v, "log_f", log_f, chunk=chunk, initial_state=initial_state,
                                  return_state=return_state)


def gated_linear_attention(q, k, v, gate: str, gate_arg, *, chunk: int = 64, name: str | None = None,
                           initial_state=None, return_state: bool = False):
    """:func:`chunked_linear_attention` with the gate named: ``gate`` is ``"none"``,
    ``"log_f"`` (``gate_arg`` = the log gates, ``(..., T)`` or ``(..., T, D)``) or
    ``"gamma"`` (``gate_arg`` = RetNet's constant gate per head, a float or a tensor
    broadcastable to the leading dims, in (0, 1]; ``S_t = gamma S_{t-1} + v_t k_t^T``;
    a tensor that requires grad gets its gradient).  Error messages call ``gate_arg``
    ``name`` (default: ``gate``).  A missing ``gate_arg`` is an error here, never a silent
    ungated run.  ``initial_state``, ``return_state``: as :func:`chunked_linear_attention`."""
    name = gate if name is None else name
    x = prepare_qkv(q, k, v, backward=True)
    chunk = _check_chunk(chunk)
    kind, log_f3, condition = "none", None, None
    if gate == "log_f":
        kind = _gate_kind(gate_arg, name, x.n, q)
        log_f3 = per_token(gate_arg, name, x, extra=(x.n.D,) if kind == "channel" else (), backward=True)
        condition = log_gate_condition(log_f3, name)
    elif gate == "gamma":
        kind = "head"
        g = per_head(gate_arg, name, x, dtype=torch.float64, backward=True)  # the log is taken in float64
        condition = gamma_condition(g, name)
        log_f3 = torch.log(g).to(torch.float32)  # (BH,): the kernel makes the chunk's decays from it once
    elif gate != "none":
        raise ValueError(f"`gate` must be 'none', 'log_f' or 'gamma', got {gate!r}")
    h0 = None if initial_state is None else state_rows(initial_state, x)
    return_state = check_bool(return_state, "return_state")
    with checked_after(condition):  # the values are read once the kernel is queued
        out, ht = flat_linear_attention(x, kind, log_f3, chunk=chunk, h0=h0, want_state=return_state)
        return (x.result(out), state_result(ht, x)) if return_state else x.result(out)


def _check_chunk(chunk) -> int:
    chunk = check_positive_int(chunk, "chunk")
    if chunk not in (16, 32, 64, 128):
        raise ValueError(f"`chunk` must be a power of two in 16..128, got {chunk}")
    return chunk


def _gate_kind(log_f, name: str, n: QKV, like) -> str:
    """``"channel"`` for ``(..., T, D)``, ``"scalar"`` for ``(..., T)`` (the rest is checked by ``per_token``)."""
    if isinstance(log_f, torch.Tensor) and log_f.dim() == like.dim():
        return "channel"
    if isinstance(log_f, torch.Tensor) and log_f.dim() != like.dim() - 1:
        raise ValueError(f"`{name}` must have shape {n.lead + (n.T,)} (a gate per token) or "
                         f"{n.lead + (n.T, n.D)} (a gate per token and key channel), got {tuple(log_f.shape)}")
    return "scalar"


def flat_linear_attention(x: Flat, gate: str, log_f3=None, *, chunk: int = 64, rotate=None, h0=None,
                          want_state: bool = False):
    """The template on validated inputs (:func:`._launch.prepare_qkv`), through :class:`_LinearAttention` when
    autograd wants gradients (of ``x.q, x.k, x.v``, ``log_f3`` or ``h0``): the entry the public functions call.

    ``gate``: ``"none"``, ``"scalar"`` / ``"channel"`` (``log_f3``: fp32 ``(BH, T)`` / ``(BH, T, D)``) or
    ``"head"`` (``log_f3``: fp32 ``(BH,)``); ``rotate``: as :func:`linear_launch`, without gradients only (a
    caller that wants them turns q and k first); ``h0``: fp32 ``(BH, D, Dv)``, the initial ``S^T`` of each head
    (:func:`._launch.state_rows`), or None.  Returns ``(out, ht)``: ``out`` ``(BH, T, Dv)`` in the compute dtype,
    ``ht`` the final ``S^T``, fp32 ``(BH, D, Dv)`` (None unless ``want_state`` or a backward pass will follow)."""
    if wants_grad(x.q, x.k, x.v, log_f3, h0):
        if rotate is not None:
            raise ValueError("the rotation hook has no backward pass: turn q and k first (rotate_qk)")
        return _LinearAttention.apply(x.q, x.k, x.v, log_f3, h0, x, gate, chunk)
    ht = torch.empty(x.BH, x.n.D, x.n.Dv, dtype=torch.float32, device=x.device) if want_state else None
    return linear_launch(x, gate, log_f3, chunk=chunk, rotate=rotate, h0=h0, final=ht), ht


def _hooks(gate: str, log_f3, chunk: int) -> tuple[str, str, int]:
    """``(GATE, DECAY, chunk)`` of the template for a launcher's ``gate`` (the transition, the scalar decay, and the
    chunk length: ``CHANNEL_CHUNK`` for the per-channel gate)."""
    if gate == "head":
        decay = "head"
    elif gate == "scalar" or (gate in ("householder", "delta") and log_f3 is not None):
        decay = "token"
    else:
        decay = "none"
    transition = "none" if gate in ("scalar", "head") else gate
    return transition, decay, CHANNEL_CHUNK if gate == "channel" else chunk


def linear_launch(x: Flat, gate: str, log_f3=None, *, chunk: int = 64, prep=None, precision=None,
                   rotate=None, h0=None, states=None, final=None) -> torch.Tensor:
    """Launch on validated inputs (:func:`._launch.prepare_qkv`): returns ``(BH, T, Dv)``.

    ``rotate``: ``(base, pairing)`` to turn q and k by RoPE's rotations as they are loaded (the rotation
    hook, chapter 4's complex recurrence; ``gate`` ``"none"``, ``"scalar"`` or ``"head"`` only), or None.
    The state's rows (the key channels) are then in the hook's pair order (:func:`._pieces.load_rotated`).

    ``gate``: ``"none"``, ``"scalar"`` / ``"channel"`` (``log_f3``: fp32 ``(BH, T)`` /
    ``(BH, T, D)``), ``"head"`` (``log_f3``: fp32 ``(BH,)``, one log gate per head: RetNet) or ``"householder"`` (``prep``: the :class:`.ut_prepare.Prepared`
    factors of chunks of ``chunk`` tokens, read in place of ``q`` and ``k``; with
    ``log_f3`` (fp32 ``(BH, T)``) the transition is ``a_t H_t``, chapter 7's gated
    Householder RNN), or ``"delta"`` (``prep``: the :class:`.ut_prepare.WYPrepared` factors, read in
    place of ``v``; with ``log_f3``, made with the same gate: Gated DeltaNet).

    The state ``H = S^T`` of each head, fp32: ``h0`` ``(BH, D, Dv)`` starts it (default 0); ``states``
    ``(BH, NC, D, Dv)`` receives the state entering each chunk (``NC = cdiv(T, chunk)``, the chunk length
    used), ``final`` ``(BH, D, Dv)`` the state after the last token.
    """
    n = x.n
    out = x.new_output(n.Dv)
    if x.empty_input:
        if final is not None:
            final.copy_(h0) if h0 is not None else final.zero_()
        return out
    q3, k3, v3, ad, gm = x.q, x.k, x.v, x.q, x.q  # dummy pointers for the hooks that do not read them
    transition, decay, chunk = _hooks(gate, log_f3, chunk)
    if rotate is not None and transition != "none":
        raise ValueError(f"the rotation hook runs with the 'none', 'scalar' and 'head' gates, not {gate!r}")
    if gate == "householder":
        q3, k3, ad, gm = prep.qt, prep.kt, prep.ad, prep.g
    elif gate == "delta":
        v3, ad = prep.u, prep.w
    precision = dot_precision(x.dtype) if precision is None else precision
    block_d = next_pow2(n.D)
    block_dv = min(next_pow2(n.Dv), 64)  # 32 slower (NOTES_linear.md, "One program per head and value block, the state in registers")
    grid = (triton.cdiv(n.Dv, block_dv), x.BH)
    rotate_hook, log2_base = rotate_args(rotate)
    flags = torch.empty(grid[0] * grid[1], dtype=torch.int8, device=out.device)  # written by every program
    dummy = flags
    args = dict(Q=q3, K=k3, V=v3, O=out, LOG_F=x.q if log_f3 is None else log_f3, AD=ad, GM=gm,
                H0=dummy if h0 is None else h0, STATES=dummy if states is None else states,
                HT=dummy if final is None else final, FLAGS=flags,
                T=n.T, log2_base=log2_base,
                **row_strides(q=q3, k=k3, v=v3, o=out, a=ad), stride_gb=gm.stride(0), stride_gj=gm.stride(1))
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=chunk, GATE=transition,
                DECAY=decay, PRECISION=precision, BLOCK_DC=min(block_d, 32), ROTATE=rotate_hook,
                LOAD_H0=h0 is not None, STORE_STATES=states is not None, STORE_FINAL=final is not None,
                num_warps=4, num_stages=1 if interpreting() else 2)
    # Two launches, as the FlashAttention template's forward: plain products, then a redo with the NaN/inf
    # bookkeeping of the programs whose final state is not finite (usually none).  The bookkeeping inside
    # the fast loop cost a fifth of its time (kernels/NOTES_linear.md, "Two launches for non-finite values").
    _linear_fwd[grid](**args, **meta)
    _linear_careful[grid](**args, **meta)
    return out


def backward_precision(dtype: torch.dtype) -> str:
    """The products of the backward kernels (:func:`bdot`): 16-bit inputs tf32 with fp32 operands rounded to
    nearest (``"tf32n"``; two 16-bit operands multiply exactly), fp32 inputs about fp32 accuracy: exact ``"ieee"``
    in the interpreter, three tf32 products (``"x3n"``) on a GPU, where exact fp32 products of this many tiles take
    minutes to compile."""
    if dtype != torch.float32:
        return "tf32n"
    return "ieee" if interpreting() else "x3n"


def _linear_bwd_launch(x: Flat, gate: str, log_f3, states, do, dht, *, chunk: int):
    """The backward kernels on the forward's validated inputs ``x`` and the states it stored (``states``, fp32
    ``(BH, NC, D, Dv)``): ``do`` the output's gradient ``(BH, T, Dv)`` (None: 0), ``dht`` the final state's, fp32
    ``(BH, D, Dv)`` (None: 0).  Returns ``dq, dk, dv`` (compute dtype), ``dh0`` (fp32 ``(BH, D, Dv)``, the initial
    state's gradient), ``dc`` (fp32 ``(BH, T)`` or ``(BH, T, D)``: the gradient of the cumulative log gates,
    :func:`_linear_bwd_chunk`; ``(BH, T + NC)`` for the gate per head; None without a gate) and the chunk length
    used."""
    n = x.n
    transition, decay, chunk = _hooks(gate, log_f3, chunk)
    n_chunks = triton.cdiv(n.T, chunk)
    do = torch.zeros_like(x.v) if do is None else do.to(x.dtype).contiguous()
    dq, dk, dv = torch.empty_like(x.q), torch.empty_like(x.k), torch.empty_like(x.v)
    dh = torch.empty(x.BH, n_chunks, n.D, n.Dv, dtype=torch.float32, device=x.device)
    dh0 = torch.empty(x.BH, n.D, n.Dv, dtype=torch.float32, device=x.device)
    precision = backward_precision(x.dtype)
    block_d = next_pow2(n.D)
    block_dv = min(next_pow2(n.Dv), 64)
    # The key channels in blocks of 32 for D = 128 and fp32 inputs (whose x3 products hold three times the tiles),
    # else whole: compiled offline for Hopper, D = 128 spilled 192 bytes a thread with blocks of 64, none with 32.
    # The interpreter takes them whole (its cost is per program).
    block_k = block_d if interpreting() or (block_d <= 64 and precision != "x3n") else 32
    n_k = triton.cdiv(n.D, block_k)
    dc = None
    if gate == "channel":
        dc = torch.empty(x.BH, n.T, n.D, dtype=torch.float32, device=x.device)
    elif decay != "none":  # the gate per head also gets <dH_in, H_in> of every chunk, after the T entries
        dc = torch.empty(x.BH, n_k, n.T + (n_chunks if decay == "head" else 0), dtype=torch.float32, device=x.device)
    log_f = dh0 if log_f3 is None else log_f3
    _linear_bwd_state[(triton.cdiv(n.Dv, block_dv), x.BH)](
        Q=x.q, DO=do, LOG_F=log_f, DHT=dh0 if dht is None else dht.contiguous(), DH=dh, DH0=dh0,
        T=n.T,
        stride_qb=x.q.stride(0), stride_qt=x.q.stride(1), stride_vb=do.stride(0), stride_vt=do.stride(1),
        HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=chunk, GATE=transition, DECAY=decay,
        PRECISION=precision, LOAD_DHT=dht is not None, num_warps=4,
    )
    args = dict(Q=x.q, K=x.k, V=x.v, DO=do, LOG_F=log_f, STATES=states, DH=dh, DQ=dq, DK=dk, DV=dv,
                DC=dh0 if dc is None else dc,
                T=n.T,
                **row_strides(q=x.q, k=x.k, v=x.v))
    if gate == "channel":
        _linear_bwd_channel[(n_chunks, x.BH)](
            **args,
            HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=block_d, BLOCK_DV=min(next_pow2(n.Dv), 32), CHUNK=chunk,
            BLOCK_DC=min(block_d, 32), PRECISION=precision, num_warps=4,
        )
    else:
        # 8 warps for chunks of 64 or more: at 4, the chunk's tiles spill (Hopper, compiled offline)
        _linear_bwd_chunk[(n_chunks, x.BH, 1 + n_k)](
            **args, stride_dc=dh0.stride(0) if dc is None else dc.stride(1),
            HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_K=block_k, CHUNK=chunk,
            DECAY=decay, PRECISION=precision, num_warps=4 if chunk <= 32 else 8,
        )
        if dc is not None:
            dc = dc.sum(1)  # the key-channel blocks' parts
    return dq, dk, dv, dh0, dc, chunk


def _gate_grad(gate: str, dc, T: int, chunk: int):
    """The gradient of the launcher's ``log_f3`` from the kernels' ``dc`` (:func:`_linear_bwd_launch`), the
    gradient of the cumulative log gates ``c_t = sum_{s <= t} log_f[s]``: ``d log_f[s] = sum_{t >= s} dc_t``.

    RetNet's one gate per head, ``c_t = (t + 1) log gamma``, gets ``sum_t (t + 1) dc_t``.  Summed so, a pair of
    tokens ``j < i`` enters twice, as ``(i + 1) w`` and ``-(j + 1) w``, for a net ``(i - j) w``: at T = 2048 the
    rounding of the two large terms (tf32 products) left a relative error of 3e-2.  With ``a`` the start of t's chunk
    and ``X_c = <dH_in, H_in>`` at the start of chunk ``c`` (the kernel stores it after the T entries of ``dc``),
    the sum of ``dc`` over one chunk is ``X_c - X_{c+1}``, and summation by parts gives the same number as
    ``sum_t (t - a + 1) dc_t + C sum_{c >= 1} X_c``: weights up to ``C`` only, and ``X_c``, a state times its
    gradient, holds no cancelling pair."""
    if gate == "head":
        local = torch.arange(T, device=dc.device) % chunk + 1
        return ((dc[:, :T].double() * local).sum(-1) + chunk * dc[:, T + 1:].double().sum(-1)).float()
    return dc.flip(1).cumsum(1).flip(1)


class _LinearAttention(torch.autograd.Function):
    """:func:`linear_launch` with a backward pass, for the gates ``"none"``, ``"scalar"``, ``"head"`` and
    ``"channel"``.

    Inputs: the flattened ``q, k, v`` of a :class:`._launch.Flat` (``flat``), ``log_f3`` (the launcher's, or None),
    ``h0`` (fp32 ``(BH, D, Dv)`` or None), ``gate``, ``chunk``.  Outputs: ``(out, ht)``, ``ht`` the final ``S^T``
    (fp32 ``(BH, D, Dv)``), differentiable too.  The forward stores the state entering each chunk (fp32
    ``(BH, NC, D, Dv)``) and keeps it with ``q, k, v`` and the gates; the backward is two more launches: the
    gradients of the states right to left (:func:`_linear_bwd_state`, whose last one is ``h0``'s), then each
    chunk's ``dq, dk, dv`` (:func:`_linear_bwd_chunk`, :func:`_linear_bwd_channel`); the gates' gradient follows
    from theirs (:func:`_gate_grad`)."""

    @staticmethod
    def forward(ctx, q3, k3, v3, log_f3, h0, flat, gate, chunk):
        x = Flat(flat.n, q3, k3, v3, flat.dtype, flat.like)
        _, _, used = _hooks(gate, log_f3, chunk)
        states = torch.empty(x.BH, triton.cdiv(x.n.T, used), x.n.D, x.n.Dv, dtype=torch.float32, device=x.device)
        ht = torch.empty(x.BH, x.n.D, x.n.Dv, dtype=torch.float32, device=x.device)
        out = linear_launch(x, gate, log_f3, chunk=chunk, h0=h0, states=states, final=ht)
        ctx.save_for_backward(q3, k3, v3, log_f3, states)
        ctx.flat, ctx.gate, ctx.chunk, ctx.has_h0 = flat, gate, chunk, h0 is not None
        ctx.set_materialize_grads(False)
        return out, ht

    @staticmethod
    def backward(ctx, do, dht):
        q3, k3, v3, log_f3, states = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        if x.empty_input:
            dh0 = x.q.new_zeros(x.BH, x.n.D, x.n.Dv, dtype=torch.float32) if dht is None else dht
            d_log_f = None if log_f3 is None else torch.zeros_like(log_f3)
            return (torch.zeros_like(q3), torch.zeros_like(k3), torch.zeros_like(v3), d_log_f,
                    dh0 if ctx.has_h0 else None, None, None, None)
        dq, dk, dv, dh0, dc, used = _linear_bwd_launch(x, ctx.gate, log_f3, states, do, dht, chunk=ctx.chunk)
        d_log_f = None if dc is None else _gate_grad(ctx.gate, dc, x.n.T, used)
        return dq, dk, dv, d_log_f, dh0 if ctx.has_h0 else None, None, None, None
