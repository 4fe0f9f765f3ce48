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
  sixth of RetNet's time at T = 8192: ``kernels/NOTES_path.md`` section 13).  A gate
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

  with products whose operands are rounded to nearest (:func:`._pieces._dot`: the
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
their positions as each chunk is loaded (:func:`._pieces._load_rotated`, channels in pair
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
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..alibi import gamma_condition
from ..checks import QKV, check_positive_int, checked_after, log_gate_condition
from ._launch import Flat, dot_precision, interpreting, next_pow2, per_head, per_token, prepare_qkv, rotate_args
from ._pieces import _dot, _input_dot, _load_rotated, _quiet_fp32, _quiet_nan, _load_rows, _rope_cos_sin, _rope_shift, _store_rows

__all__ = ["chunked_linear_attention", "gated_linear_attention", "CHANNEL_CHUNK"]

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
    thread with it made at the chunk's start, 8 without; ``kernels/NOTES_path.md``, section 26)."""
    return tl.exp(tl.where(causal, b[:, None] - b[None, :], float("-inf")))


@triton.jit
def _linear_chunks(Q, K, V, O, LOG_F, AD, GM, T, log2_base,
                   stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                   stride_ab, stride_at, stride_gb, stride_gj,
                   HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_DC: tl.constexpr, ROTATE: tl.constexpr, SAFE: tl.constexpr):
    """The chunked template, one program per (block of ``BLOCK_DV`` value channels, head): grid
    ``(cdiv(Dv, BLOCK_DV), BH)``; the state ``H = S^T [BD, BDV]`` stays in registers for the whole sequence,
    and is returned.

    ``Q, K: (BH, T, D)``, ``V, O: (BH, T, Dv)``; ``LOG_F``: ``(BH, T)`` (``DECAY == "token"``), ``(BH,)``
    (``DECAY == "head"``) or ``(BH, T, D)`` (``GATE == "channel"``); ``AD, GM``: the preparation pass's
    in-chunk scores and chunk transitions (``GATE == "householder"``), or ``AD``: the rows of DeltaNet's ``W``
    and ``V``: its ``U~`` (``GATE == "delta"``).  The module docstring has the hooks and the chunk equations.

    ``SAFE`` (the careful pass): the products see the values without their NaN/inf, and the rows at or after a
    channel's first NaN/inf get NaN in that channel.  Without it the products are plain: a NaN or inf value
    then reaches earlier rows of its chunk (``0 * NaN``), and the state, which :func:`_linear_fwd` checks."""
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
        b = tl.load(LOG_F + bh) * (offs_c + 1).to(tl.float32)
        b_last = _chunk_last(b, offs_c, CHUNK)
        decay = _decay_tile(b, causal)
    H = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)  # the state S^T, on chip for the whole sequence
    if SAFE:
        first = tl.full([BLOCK_DV], CHUNK, tl.int32)  # no NaN/inf value seen yet
    if ROTATE != "none":  # cos/sin of the offsets inside a chunk, once: every chunk shifts them (_rope_shift)
        c0, s0 = _rope_cos_sin(offs_c, log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [C, BD / 2]
    for start in range(0, T, CHUNK):
        # This chunk's rows (absolute positions: offsets computed in the loop, not held in
        # registers across it); padding past T loads as zeros.
        offs_t = start + offs_c
        if ROTATE == "none":
            # In the inputs' dtype, turned to fp32 where a product needs it (Q K^T needs not: a 16-bit
            # value is exact in tf32, so the 16-bit product is the one fp32 tiles gave, at twice the rate).
            q = _load_rows(Q, offs_t, offs_d, stride_qt, T, HEAD_DIM, True, CHECK_D)
            k = _load_rows(K, offs_t, offs_d, stride_kt, T, HEAD_DIM, True, CHECK_D)
            if GATE == "delta":  # fp32 inputs meet _dot's tf32 rounding (_rn): their NaNs made quiet first
                q = _quiet_fp32(q)
                k = _quiet_fp32(k)
        else:  # the complex recurrence: q and k turned by their positions as they are loaded (pair order)
            cr, sr = _rope_shift(c0, s0, start, log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [C, BD / 2]
            q = _load_rotated(Q, offs_t, stride_qt, T, cr, sr, HEAD_DIM // 2, CHUNK, BLOCK_D // 2,
                              ROTATE == "interleaved")  # [C, BD] fp32
            k = _load_rotated(K, offs_t, stride_kt, T, cr, sr, HEAD_DIM // 2, CHUNK, BLOCK_D // 2,
                              ROTATE == "interleaved")
        v = _load_rows(V, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)
        if GATE == "householder" and not SAFE:
            # fp32 values go through _dot's tf32 rounding, which would turn a canonical NaN (0x7FFFFFFF, what GPU
            # arithmetic returns) into -0.0: the state would stay finite and the flag miss it.  DeltaNet's values
            # are quieted after U~ - W S below.
            v = _quiet_fp32(v)
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
            bc = tl.cumsum(_load_rows(G, offs_t, offs_d, HEAD_DIM, T, HEAD_DIM, True, CHECK_D), axis=0)
            bc_last = tl.sum(tl.where(offs_c[:, None] == CHUNK - 1, bc, 0.0), axis=0)
            s = _channel_scores(Q, K, G, offs_t, offs_t < T, stride_qt, stride_kt, HEAD_DIM, BLOCK_D, BLOCK_DC, CHUNK)
            o = tl.dot(q.to(tl.float32) * tl.exp(bc), H, input_precision=PRECISION)  # [C, BDV]
            h = H * tl.exp(bc_last)[:, None]
            k = k.to(tl.float32) * tl.exp(bc_last[None, :] - bc)
        elif GATE == "householder":
            # Q, K hold q~, k~; Ã (zero above the diagonal) and G_c come from the preparation pass.
            g = _load_rows(GM + bh * stride_gb + (start // CHUNK) * stride_gj, offs_d, offs_d, HEAD_DIM, HEAD_DIM,
                           HEAD_DIM, CHECK_D, CHECK_D)  # [BD, BD]
            o = _dot(q, H, PRECISION)
            h = H + _dot(g, H, PRECISION)  # P^T H
            s = _load_rows(AD + bh * stride_ab, offs_t, offs_c, stride_at, T, CHUNK, False, False)  # [C, C]: late,
            # as DeltaNet's scores below (registers)
        elif GATE == "delta":
            # V holds U~ (A V), AD the rows of W (A diag(e^b) K): the pseudo-values U = U~ - W S^T given
            # the state, then the plain template with U in place of V.
            wc = _load_rows(AD + bh * stride_ab, offs_t, offs_d, stride_at, T, HEAD_DIM, True, CHECK_D)  # [C, BD]
            v -= _dot(wc.to(tl.float32), H, PRECISION)  # [C, BDV]
            if not SAFE:
                # A NaN in U~ comes out of this subtraction as the GPU's canonical NaN, which the rounding of
                # the state's update would turn into -0.0: the state would stay finite and the flag miss it.
                v = _quiet_nan(v)
            o = _dot(q.to(tl.float32), H, PRECISION)
            s = tl.where(causal, _input_dot(q, tl.trans(k), PRECISION), 0.0)  # [C, C]: late, so that it is not
            h = H  # kept through the two products above (registers)
        else:
            if ROTATE == "none":
                s = tl.where(causal, _input_dot(q, tl.trans(k), PRECISION), 0.0)
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
            else:
                s = s * decay
            h = h * tl.exp(b_last)
            k = k.to(tl.float32) * tl.exp(b_last - b)[:, None]
            if GATE == "householder" or GATE == "delta":
                k = _quiet_nan(k)  # a product: the GPU's canonical NaN, which _dot's rounding would lose
        if GATE == "householder" or GATE == "delta":
            # _dot rounds its operands to tf32 (_rn), which keeps only quiet NaNs, and the scores, the keys (after a
            # decay) and the state come out of arithmetic, whose NaN on a GPU is the canonical one: each is made
            # quiet where it meets the rounding (a NaN of q or k reaches the rows from its own on through them).
            # Two selects per chunk, three with a decay: on the H100 DeltaNet under 0.5% slower, Gated DeltaNet
            # 2.5-3% (kernels/NOTES_path.md, section 14).
            o += _dot(_quiet_nan(s), v, PRECISION)
            # H <- P^T H + K~^T V (householder), H + K^T U (delta); quiet for the next chunk's products
            H = _quiet_nan(h + _dot(tl.trans(k.to(tl.float32)), v, PRECISION))
        else:
            o += tl.dot(s, v, input_precision=PRECISION)
            H = h + tl.dot(tl.trans(k.to(tl.float32)), v, input_precision=PRECISION)
        if SAFE:
            # The rows at or after a NaN/inf of their channel get NaN (IEEE would give NaN or +-inf,
            # depending on signs); a later chunk sees it from its first row on.
            o = tl.where(first[None, :] <= offs_c[:, None], float("nan"), o)
        _store_rows(O + bh * stride_ob, o, offs_t, offs_dv, stride_ot, T, HEAD_DV)
        if SAFE:
            first = tl.where(first < CHUNK, 0, CHUNK)
    return H


@triton.jit
def _linear_fwd(Q, K, V, O, LOG_F, AD, GM, FLAGS, T, log2_base,
                stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                stride_ab, stride_at, stride_gb, stride_gj,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_DC: tl.constexpr, ROTATE: tl.constexpr):
    """The fast pass: :func:`_linear_chunks` with plain products, then a flag per program (``FLAGS``: int8, one
    per program, row-major over the grid): set when the final state holds a NaN or inf.  Every value of a
    sequence reaches the state (``H += K^T V``, and ``0 * NaN`` is NaN), and no product, sum or decay turns a NaN
    or inf back into a finite number (the one rounding that could, :func:`._pieces._rn` of a canonical GPU NaN, gets
    quiet NaNs: the scores, keys, state and DeltaNet's ``U~ - W S`` are made quiet where they meet it, fp32 inputs
    where they are loaded, and the preparation passes store their fp32 factors quiet), so a finite final state means
    no value was NaN or inf: then every product equals the careful pass's bit for bit, and the outputs are final."""
    H = _linear_chunks(Q, K, V, O, LOG_F, AD, GM, T, log2_base, stride_qb, stride_qt, stride_kb, stride_kt,
                       stride_vb, stride_vt, stride_ob, stride_ot, stride_ab, stride_at, stride_gb, stride_gj,
                       HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, CHUNK, GATE, DECAY, PRECISION, BLOCK_DC, ROTATE, False)
    bad = tl.max(tl.max(tl.where(tl.abs(H) < float("inf"), 0, 1), axis=1), axis=0)  # NaN fails the test too
    tl.store(FLAGS + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), bad.to(tl.int8))


@triton.jit
def _linear_careful(Q, K, V, O, LOG_F, AD, GM, FLAGS, T, log2_base,
                    stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                    stride_ab, stride_at, stride_gb, stride_gj,
                    HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    CHUNK: tl.constexpr, GATE: tl.constexpr, DECAY: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_DC: tl.constexpr, ROTATE: tl.constexpr):
    """The careful pass, on :func:`_linear_fwd`'s grid: a program whose flag is set redoes its sequence with
    ``SAFE`` (the others read one byte and stop)."""
    if tl.load(FLAGS + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)) != 0:
        _linear_chunks(Q, K, V, O, LOG_F, AD, GM, T, log2_base, stride_qb, stride_qt, stride_kb, stride_kt,
                       stride_vb, stride_vt, stride_ob, stride_ot, stride_ab, stride_at, stride_gb, stride_gj,
                       HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, CHUNK, GATE, DECAY, PRECISION, BLOCK_DC, ROTATE, True)


def chunked_linear_attention(q, k, v, *, log_f=None, chunk: int = 64):
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
    Every argument is validated here (values read once the kernel is queued); no
    input may require grad while grad mode is on (there is no backward pass yet).
    """
    if log_f is None:
        return gated_linear_attention(q, k, v, "none", None, chunk=chunk)
    return gated_linear_attention(q, k, v, "log_f", log_f, chunk=chunk)


def gated_linear_attention(q, k, v, gate: str, gate_arg, *, chunk: int = 64, name: str | None = None):
    """:func:`chunked_linear_attention` with the gate named: ``gate`` is ``"none"``,
    ``"log_f"`` (``gate_arg`` = the log gates, ``(..., T)`` or ``(..., T, D)``) or
    ``"gamma"`` (``gate_arg`` = RetNet's constant gate per head, a float or a tensor
    broadcastable to the leading dims, in (0, 1]; ``S_t = gamma S_{t-1} + v_t k_t^T``).
    Error messages call ``gate_arg`` ``name`` (default: ``gate``).  A missing ``gate_arg``
    is an error here, never a silent ungated run."""
    name = gate if name is None else name
    x = prepare_qkv(q, k, v)
    chunk = _check_chunk(chunk)
    kind, log_f3, condition = "none", None, None
    if gate == "log_f":
        kind = _gate_kind(gate_arg, name, x.n, q)
        log_f3 = per_token(gate_arg, name, x, extra=(x.n.D,) if kind == "channel" else ())
        condition = log_gate_condition(log_f3, name)
    elif gate == "gamma":
        kind = "head"
        g = per_head(gate_arg, name, x, dtype=torch.float64)  # the log is taken in float64
        condition = gamma_condition(g, name)
        log_f3 = torch.log(g).to(torch.float32)  # (BH,): the kernel makes the chunk's decays from it once
    elif gate != "none":
        raise ValueError(f"`gate` must be 'none', 'log_f' or 'gamma', got {gate!r}")
    with checked_after(condition):  # the values are read once the kernel is queued
        return x.result(_linear_launch(x, kind, log_f3, chunk=chunk))


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


def _linear_launch(x: Flat, gate: str, log_f3=None, *, chunk: int = 64, prep=None, precision=None,
                   rotate=None) -> torch.Tensor:
    """Launch on validated inputs (:func:`._launch.prepare_qkv`): returns ``(BH, T, Dv)``.

    ``rotate``: ``(base, pairing)`` to turn q and k by RoPE's rotations as they are loaded (the rotation
    hook, chapter 4's complex recurrence; ``gate`` ``"none"``, ``"scalar"`` or ``"head"`` only), or None.

    ``gate``: ``"none"``, ``"scalar"`` / ``"channel"`` (``log_f3``: fp32 ``(BH, T)`` /
    ``(BH, T, D)``), ``"head"`` (``log_f3``: fp32 ``(BH,)``, one log gate per head: RetNet) or ``"householder"`` (``prep``: the :class:`.ut_prepare.Prepared`
    factors of chunks of ``chunk`` tokens, read in place of ``q`` and ``k``; with
    ``log_f3`` (fp32 ``(BH, T)``) the transition is ``a_t H_t``, chapter 7's gated
    Householder RNN), or ``"delta"`` (``prep``: the :class:`.ut_prepare.WYPrepared` factors, read in
    place of ``v``; with ``log_f3``, made with the same gate: Gated DeltaNet).
    """
    n = x.n
    out = x.new_output(n.Dv)
    if x.empty_input:
        return out
    q3, k3, v3, ad, gm = x.q, x.k, x.v, x.q, x.q  # dummy pointers for the hooks that do not read them
    if gate == "head":
        decay = "head"
    elif gate == "scalar" or (gate in ("householder", "delta") and log_f3 is not None):
        decay = "token"
    else:
        decay = "none"
    transition = "none" if gate in ("scalar", "head") else gate
    if rotate is not None and transition != "none":
        raise ValueError(f"the rotation hook runs with the 'none', 'scalar' and 'head' gates, not {gate!r}")
    if gate == "channel":
        chunk = CHANNEL_CHUNK
    elif gate == "householder":
        q3, k3, ad, gm = prep.qt, prep.kt, prep.ad, prep.g
    elif gate == "delta":
        v3, ad = prep.u, prep.w
    precision = dot_precision(x.dtype) if precision is None else precision
    block_d = next_pow2(n.D)
    block_dv = min(next_pow2(n.Dv), 64)  # 32 measured slower (NOTES_path section 9): the state loop is the long pole
    grid = (triton.cdiv(n.Dv, block_dv), x.BH)
    rotate_hook, log2_base = rotate_args(rotate)
    flags = torch.empty(grid[0] * grid[1], dtype=torch.int8, device=out.device)  # written by every program
    args = (q3, k3, v3, out, x.q if log_f3 is None else log_f3, ad, gm, flags, n.T, log2_base,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
            out.stride(0), out.stride(1), ad.stride(0), ad.stride(1), gm.stride(0), gm.stride(1))
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=chunk, GATE=transition,
                DECAY=decay, PRECISION=precision, BLOCK_DC=min(block_d, 32), ROTATE=rotate_hook,
                num_warps=4, num_stages=1 if interpreting() else 2)
    # Two launches, as the FlashAttention template's forward: plain products, then a redo with the NaN/inf
    # bookkeeping of the programs whose final state is not finite (usually none).  The bookkeeping inside
    # the fast loop cost a fifth of its time (kernels/NOTES_path.md section 13).
    _linear_fwd[grid](*args, **meta)
    _linear_careful[grid](*args, **meta)
    return out
