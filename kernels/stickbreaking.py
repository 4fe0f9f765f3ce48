r"""Stick-breaking attention: the forward scans key blocks right to left carrying the stick; the backward is two sweeps.

Stick-breaking attention (:mod:`pathedu.stickbreaking`) has no softmax.  In the book's notation, with the logits
``l_ij = tau q_i . k_j`` and keys strictly before the query::

    log alpha_ij = log sigma(l_ij) + G^(i)_ij,   G^(i)_ij = sum_{m=j+1..i-1} log sigma(-l_im),   o_i = sum_{j<i} alpha_ij v_j

``G^(i)`` is query ``i``'s own cumulative log gate: the gates of every key *between* ``j`` and the query.

**Forward.**  A query block visits its key blocks **right to left**, from the diagonal back to 0, as PaTH's kernel
does (:mod:`.path_attention`), and carries one number per row instead of a query: ``c_i = sum log sigma(-l_im)``
over the keys already passed, the log of the stick they left over (``c = 0`` at the start).  In base 2
(``s = l log2 e``; ``LOG2E`` is folded into the scale), per tile of ``BLOCK_N`` keys (:func:`_stick_tile`)::

    s      = tau log2(e) q K^T                                   [BM, BN], fp32
    e      = 2^-|s|,  lg = log2(1 + e)                           one exp2 and one log2 per logit (:func:`_gates`)
    g      = -(max(s, 0) + lg) = log2 sigma(-l)                  a key's gate (0 where j >= i: a select)
    ls     = min(s, 0) - lg    = log2 sigma(l)                   a key's own share
    log2 w = ls + (sum of g over the tile's keys right of j) + c     (:func:`_log2_weights`)
    acc   += 2^(log2 w) V                                        the third transcendental
    c     += rowsum(g)

No maximum and no normaliser: every exponent is a sum of log-sigmoids, ``<= 0``, so a weight is final as soon as
it is computed and the output is ``acc`` itself.  This is :func:`pathedu.stickbreaking.stickbreaking_blockwise`,
tile by tile.

**Where the forward's time went, and the sum inside a tile.**  Compiled for sm_90 with Triton 3.6 (offline:
``python -m pathedu.bench.registers --loops --kernels "_stickbreaking_fwd (cumsum, 64 x 32)"``), one trip of the
loop with 64 x 32 tiles and 4 warps issued, per
thread and 16 logits, 533 instructions: 180 warp shuffles, 48 transcendentals (three per logit), 136 adds.  The
shuffles are ``tl.cumsum`` along the keys: the tile's rows are spread over four threads in pairs of columns, and
the scan's lowering shuffles for every pair.  A multiprocessor's shuffle unit serves one warp instruction per clock,
its transcendental units two per clock and its fp32 units four, so the loop cost about 720 clocks of shuffles
against 384 of transcendentals: the scan, not the three transcendentals, set the forward's 4.7x SDPA
(FlashAttention's loop: one transcendental and no shuffle per logit).  So for 16-bit inputs on a GPU the sum
inside a tile is a product with a 0/1 triangular matrix on the tensor cores (``SCAN="dot"``,
:func:`._pieces.scan_dot`: the gates split into two fp16 parts, 22 significant bits; clamped to ``[-256, 0]``,
which changes no weight, since ``2^-256`` is 0 in fp32).  The same loop then counts 418 instructions, no
shuffle, the same 48 transcendentals: bound by issue (418 clocks) and the transcendental units (384), about 1.7x
fewer clocks per logit than the scan's 720 (an estimate from the instruction counts; the GPU benchmark measures
it).  fp32 inputs and the interpreter keep ``tl.cumsum`` (``SCAN="cumsum"``, exact fp32 adds); tests run both.

**Precision.**  ``lg`` is Triton's accurate ``tl.math.log2`` with a correction for tiny gates
(:func:`_softplus2`; fp32 inputs and the interpreter), or for 16-bit inputs on a GPU the hardware's approximation
(``FAST_LOG2``, :func:`._pieces.log2_approx`, error about 2^-22, far below what a 16-bit output keeps).  ``s``
comes from a product in the input dtype (fp32: exact ``"ieee"`` dots), everything after it in fp32; ``w`` is
rounded to the input dtype as a product operand, as FlashAttention rounds ``p``.

**Backward.**  With ``u_ij = alpha_ij dO_i . v_j`` (what ``alpha_ij`` is worth to the loss), the gradient of the
logit ``l_im`` collects the direct term (through ``log sigma(l_im)``, derivative ``sigma(-l_im)``) and, for every
key ``j < m``, the gate term (through ``log sigma(-l_im)`` in ``G^(i)_ij``, derivative ``-sigma(l_im)``)::

    dl_im = sigma(-l_im) u_im - sigma(l_im) sum_{j<m} u_ij = u_im - sigma(l_im) S_im,   S_im = sum_{j<=m} u_ij
    dv_j  = sum_i alpha_ij dO_i,    dq_i = tau sum_m dl_im k_m,    dk_m = tau sum_i dl_im q_i

``alpha`` needs the gates right of a key (a suffix sum, the forward's carry) and ``dl`` the values left of it (a
prefix sum ``S``): no single scan direction serves both.  Two sweeps, neither with atomics, each recomputing the
logits, gates and weights from ``q, k, v`` (the forward saves nothing but its inputs: a ``T x T`` matrix is never
stored, and the recomputation costs the same transcendentals the forward spends):

* **Query sweep** (:func:`_stickbreaking_bwd_query`, one program per block of queries, key blocks right to left as
  in the forward, carrying ``c``): ``dq`` without knowing ``S`` in advance.  Split ``S_im`` into its part inside
  the tile (a running sum, :func:`._pieces.scan_dot` or ``tl.cumsum``) and ``P_i(J) = sum_{j < J} u_ij``, the
  values of the blocks left of the tile ``J``, not yet visited.  The unknown part contributes
  ``-sum_J P_i(J) b_i(J)`` with ``b_i(J) = sum_{m in J} sigma(l_im) k_m``; reordered,
  ``sum_J P_i(J) b_i(J) = sum_J r_i(J) B_i(J)``, where ``r_i(J)`` is block ``J``'s row sum of ``u`` and
  ``B_i(J) = sum_{m >= J + BN} sigma(l_im) k_m`` the sum over the blocks already visited: one more ``[BM, D]``
  accumulator ``B`` (``B += sigma K`` after each tile, ``dq -= r B`` before).  No difference of long sums.
  The sweep also writes, per row and key block, the carry ``c`` at the block's right edge and the running sum
  ``sum_{j >= J} u_ij`` (``O(T^2 / BLOCK_N)`` fp32 per head), and each row's total ``u_i = sum_j u_ij``.
* **Key sweep** (:func:`_stickbreaking_bwd_key`, one program per block of keys, query tiles from the diagonal
  down): ``dk`` and ``dv``.  Each tile takes its rows' carry and ``P_i(J) = u_i - sum_{j >= J} u_ij`` from the
  query sweep, so it is exact on its own.  The products ``dK^T += Q^T dl`` and ``dV^T += dO^T alpha`` take ``Q``
  and ``dO`` transposed as loaded from memory (a tile made by a product is never transposed: Triton 3.4 to 3.7.0
  miscompiles ``tl.trans`` of a wgmma-layout tile on Hopper), and the results are stored transposed.

**Where a training step's time goes.**  Compiled for sm_90 with Triton 3.6 (offline, bf16 inputs: ``python -m
pathedu.bench.registers --loops --kernels "_stickbreaking_fwd (dot, 64 x 32)" "_stickbreaking_bwd_query (64 x 32)"
"_stickbreaking_bwd_key (64 x 32)"``), one trip over a 64 x 32 tile (4 warps, 16 logits a thread) takes 392
instructions in the forward (48 transcendentals), 741 in the query sweep (64) and 728 in the key sweep's
off-diagonal loop (64; its diagonal loops 1123 and 1169, a third of them the masks' selects).  The two sweeps
recompute every logit's gates and add ``sigma(l)`` for ``dl``: a training step issues about 4.7 times the forward's
instructions per tile, against FlashAttention's two exponentials per logit in all.  Measured on an H200 (B = H = 32,
D = 64, bf16), forward + backward is 3.7 to 4.0 times SDPA's forward + backward at T = 2048 and 8192
(``pathedu/data/bench_stickbreaking_fwdbwd.json``).

**Non-finite inputs.**  Masks are selects.  Forward: gates of hidden keys are replaced by 0 *before* any sum,
diagonal tiles multiply through :func:`._pieces.masked_dot` and the rows that see a NaN/inf value get it back
(:func:`._pieces.poison`): a NaN or inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at positions
``>= t`` only.  The products of the sums inside a tile (``SCAN="dot"``) would carry a NaN to every key of its
row, so a NaN gate enters them as ``+65504``, which makes the weights left of it infinite and leaves those right
of it alone.  Backward: the gradients that do not depend on a non-finite input stay finite and unchanged.  A
NaN/inf value ``v_t`` enters the backward's products as 0, and the gradients that depend on it are set to NaN
afterwards: ``dq_i`` for ``i > t`` and ``dk_m`` for ``t <= m < T - 1`` (the first such ``t`` per head, found
by one reduction over ``v``); hidden keys' and queries' rows enter the diagonal tiles' products as 0.

Inputs are validated once, at :func:`stickbreaking_attention` (see :mod:`._launch`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_positive_int, check_scale
from ._launch import Flat, dot_precision, interpreting, next_pow2, prepare_qkv, row_strides, wants_grad
from ._pieces import (LOG2E, finite_or_zero, first_nonfinite, load_rows, log2_approx, masked_dot, no_nonfinite,
                      poison, prefix_sums, query_block, query_rows_and_grad, scan_dot, store_rows)

__all__ = ["stickbreaking_attention"]


@triton.jit
def _softplus2(s, FAST_LOG2: tl.constexpr):
    """``log2(1 + 2^s)`` of an fp32 tile: one ``exp2`` and one ``log2``.

    ``max(s, 0) + log2(u)`` with ``u = 1 + 2^-|s|``.  Accurate (``FAST_LOG2`` false: fp32 inputs and the
    interpreter): minus the rounding error of ``u`` (``(u - 1) - e``, exact) times ``d log2(u) / du`` at
    ``u = 1``, correct to a few ulps where ``log2(u)`` alone would give 0 (``e`` below 6e-8).  Fast (16-bit
    inputs on a GPU): the hardware's approximate ``log2`` (:func:`._pieces.log2_approx`), whose error (about
    2^-22) is far below what a 16-bit output keeps, and then the correction would change nothing."""
    return tl.maximum(s, 0.0) + _log1p2(tl.math.exp2(-tl.abs(s)), FAST_LOG2)


@triton.jit
def _log1p2(e, FAST_LOG2: tl.constexpr):
    """``log2(1 + e)`` for ``e = 2^-|s|`` in [0, 1] (see :func:`_softplus2`)."""
    u = 1.0 + e
    if FAST_LOG2:
        return log2_approx(u)
    INV_LN2: tl.constexpr = 1.4426950408889634  # d log2(u) / du at u = 1
    return tl.math.log2(u) - ((u - 1.0) - e) * INV_LN2


@triton.jit
def _gates(s, FAST_LOG2: tl.constexpr):
    """``(g, ls)`` of base-2 logits ``s``: ``g = log2 sigma(-l) = -softplus2(s)``, a key's gate, and
    ``ls = log2 sigma(l) = s + g``, its own share, from one ``exp2`` and one ``log2`` (both ``<= 0``)."""
    lg = _log1p2(tl.math.exp2(-tl.abs(s)), FAST_LOG2)
    return -(tl.maximum(s, 0.0) + lg), tl.minimum(s, 0.0) - lg


@triton.jit
def _log2_weights(s, g, ls, carry, BLOCK_N: tl.constexpr, SCAN: tl.constexpr):
    """``log2 alpha_ij`` of one tile: the key's own share, the gates of the tile's keys right of it, the carried
    gates of the keys right of the tile (``carry`` ``[BM]``); ``g`` already 0 for hidden keys.

    ``"cumsum"``: ``s + (inclusive reverse cumsum of g) + carry`` (``ls - g = s``), fp32 adds.  ``"dot"``:
    ``ls + carry`` plus the exclusive reverse sums as products (:func:`._pieces.scan_dot`) of the gates clamped
    to ``[-256, 0]`` with NaN as ``+65504`` (module docstring)."""
    if SCAN == "dot":
        gs = tl.where(g == g, tl.maximum(g, -256.0), 65504.0)
        return scan_dot(gs, ls + carry[:, None], BLOCK_N, True, False)
    else:
        return s + tl.cumsum(g, axis=1, reverse=True) + carry[:, None]


@triton.jit
def _stick_tile(acc, carry, bad, q, K, V, start_n, start_m, offs_m, T, stride_kt, stride_vt, qk_scale,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr, FAST_LOG2: tl.constexpr,
                SCAN: tl.constexpr):
    """Fold key block ``[start_n, start_n + BLOCK_N)`` into ``acc`` ``[BM, BDV]`` and ``carry`` ``[BM]``.

    ``MASKED``: the block reaches the query block (or runs past T): a row ``i`` sees only keys
    ``j < i``; ``bad`` then takes the block's NaN/inf values (:func:`._pieces.first_nonfinite`,
    positions relative to ``start_m``).  Unmasked blocks are whole and every key is seen."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = load_rows(K, offs_n, tl.arange(0, BLOCK_D), stride_kt, T, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BN, BD]
    v = load_rows(V, offs_n, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, MASKED,
                   BLOCK_DV != HEAD_DV)  # [BN, BDV]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BM, BN] fp32, base 2
    g, ls = _gates(s, FAST_LOG2)  # [BM, BN]: log2 sigma(-l), log2 sigma(l)
    if MASKED:
        seen = offs_n[None, :] < offs_m[:, None]  # [BM, BN]: strictly causal
        g = tl.where(seen, g, 0.0)  # a hidden key breaks nothing (and its NaN stays out)
    w = tl.math.exp2(_log2_weights(s, g, ls, carry, BLOCK_N, SCAN))  # [BM, BN], in [0, 1]
    if MASKED:
        w = tl.where(seen, w, 0.0)
        acc = masked_dot(w.to(v.dtype), v, acc, PRECISION)
        bad = first_nonfinite(v, offs_n - start_m, bad)
    else:
        acc = tl.dot(w.to(v.dtype), v, acc=acc, input_precision=PRECISION)  # [BM, BDV]
    carry += tl.sum(g, axis=1)  # [BM]: the stick this block left over, in log2
    return acc, carry, bad


@triton.jit
def _stickbreaking_fwd(Q, K, V, O, T, qk_scale,
                       stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                       HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                       FAST_LOG2: tl.constexpr, SCAN: tl.constexpr):
    """One program per block of ``BLOCK_M`` queries of one (batch, head); ``BLOCK_M = R * BLOCK_N``.

    Key blocks right to left: first the ``R`` blocks inside the query block (masked), then every
    whole block strictly left of it (no mask).  Grid ``(query blocks, BH)``, heaviest first."""
    R: tl.constexpr = BLOCK_M // BLOCK_N
    bh, start_m, offs_m = query_block(BLOCK_M)
    K += bh * stride_kb
    V += bh * stride_vb
    q = load_rows(Q + bh * stride_qb + start_m * stride_qt, tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D),
                   stride_qt, T - start_m, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # [BM, BD]
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    carry = tl.zeros([BLOCK_M], dtype=tl.float32)  # log2 of the stick left: log2 1 = 0
    bad = no_nonfinite(BLOCK_DV)
    # The diagonal region, right to left (keys past T load as 0 and are hidden: j >= T > i).
    for c in tl.static_range(R):
        acc, carry, bad = _stick_tile(acc, carry, bad, q, K, V, start_m + (R - 1 - c) * BLOCK_N, start_m, offs_m, T,
                                      stride_kt, stride_vt, qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                      True, PRECISION, FAST_LOG2, SCAN)
    # The region multiplied values without their NaN/inf; the rows that see one (keys <= i - 1) get it back.
    acc = poison(acc, offs_m - start_m - 1, bad)
    # Key blocks strictly left of the query block, right to left: whole, and seen by every row.
    for jj in range(0, start_m // BLOCK_N):
        acc, carry, bad = _stick_tile(acc, carry, bad, q, K, V, start_m - (jj + 1) * BLOCK_N, start_m, offs_m, T,
                                      stride_kt, stride_vt, qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                      False, PRECISION, FAST_LOG2, SCAN)
    store_rows(O + bh * stride_ob, acc, offs_m, tl.arange(0, BLOCK_DV), stride_ot, T, HEAD_DV)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

@triton.jit
def _bwd_tile(s, dp, carry, seen, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, FAST_LOG2: tl.constexpr,
              SCAN: tl.constexpr):
    """What both sweeps recompute for one ``[BM, BN]`` tile (queries along rows): from the base-2 logits ``s``,
    ``dp = dO v^T`` and the carried gates right of the tile, ``(g, alpha, u, sig)``: the gates (0 where hidden),
    the weights, ``u = alpha dp`` and ``sigma(l)`` (0 where hidden: selects, so that a NaN of a hidden entry stays
    out)."""
    g, ls = _gates(s, FAST_LOG2)
    if MASKED:
        g = tl.where(seen, g, 0.0)
    alpha = tl.math.exp2(_log2_weights(s, g, ls, carry, BLOCK_N, SCAN))
    u = alpha * dp
    sig = tl.math.exp2(ls)  # sigma(l)
    if MASKED:
        alpha = tl.where(seen, alpha, 0.0)
        u = tl.where(seen, u, 0.0)
        sig = tl.where(seen, sig, 0.0)
    return g, alpha, u, sig


@triton.jit
def _bwd_query_tile(acc, bk, carry, su, q, do, K, V, SR, SU, offs_m, start_n, T, stride_kt, stride_vt, qk_scale,
                    HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr, FAST_LOG2: tl.constexpr,
                    SCAN: tl.constexpr):
    """Fold key block ``J = [start_n, start_n + BLOCK_N)`` into ``dq`` (``acc``, unscaled), ``B`` (``bk``), the
    carried gates and the running sum of ``u``; write the block's snapshots (carry before it, running sum
    after it) for the key sweep."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = load_rows(K, offs_n, tl.arange(0, BLOCK_D), stride_kt, T, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BN, BD]
    v = finite_or_zero(load_rows(V, offs_n, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, MASKED,
                                   BLOCK_DV != HEAD_DV))  # [BN, BDV]: a NaN/inf value enters as 0
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BM, BN], base 2
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # [BM, BN]: d loss / d alpha
    seen = offs_n[None, :] < offs_m[:, None]
    g, alpha, u, sig = _bwd_tile(s, dp, carry, seen, BLOCK_N, MASKED, FAST_LOG2, SCAN)
    dl = u - sig * prefix_sums(u, BLOCK_N, SCAN)  # the part of dl whose S lies inside the tile
    if MASKED:
        dl = tl.where(seen, dl, 0.0)
        k = finite_or_zero(k)  # hidden keys' rows meet zeros: a NaN key stays out of earlier rows' dq
    r = tl.sum(u, axis=1)  # [BM]
    acc = tl.dot(dl.to(k.dtype), k, acc=acc, input_precision=PRECISION) - r[:, None] * bk
    bk = tl.dot(sig.to(k.dtype), k, acc=bk, input_precision=PRECISION)
    snap = (start_n // BLOCK_N) * T + offs_m
    tl.store(SR + snap, carry, mask=offs_m < T)
    carry += tl.sum(g, axis=1)
    su += r
    tl.store(SU + snap, su, mask=offs_m < T)
    return acc, bk, carry, su


@triton.jit
def _stickbreaking_bwd_query(Q, K, V, DO, DQ, SR, SU, UT, VBAD, T, NB, qk_scale, scale,
                             stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                             HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             PRECISION: tl.constexpr, FAST_LOG2: tl.constexpr, SCAN: tl.constexpr):
    """The query sweep: ``dq`` of a block of ``BLOCK_M = R * BLOCK_N`` queries, key blocks right to left (the
    forward's order and masks).  ``SR``, ``SU``: ``(BH, NB, T)`` fp32 snapshots per key block (``NB`` covers the diagonal regions) (carry at the block's
    right edge, log2; ``sum_{j >= J} u_ij``); ``UT``: ``(BH, T)``, each row's ``sum_j u_ij``; ``VBAD``: ``(BH,)``
    int32, the first position whose value has a NaN/inf (``T``: none).  ``DO`` has ``V``'s strides, ``DQ``
    ``Q``'s.  Grid ``(cdiv(T, BLOCK_M), BH)``, heaviest first."""
    R: tl.constexpr = BLOCK_M // BLOCK_N
    bh, start_m, offs_m = query_block(BLOCK_M)
    K, V = K + bh * stride_kb, V + bh * stride_vb  # this head's rows
    SR, SU = SR + bh * NB * T, SU + bh * NB * T
    offs_d = tl.arange(0, BLOCK_D)
    q, do = query_rows_and_grad(Q, DO, bh, offs_m, stride_qb, stride_qt, stride_vb, stride_vt, T, HEAD_DIM, HEAD_DV,
                                BLOCK_D, BLOCK_DV)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bk = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    carry = tl.zeros([BLOCK_M], dtype=tl.float32)
    su = tl.zeros([BLOCK_M], dtype=tl.float32)
    for c in tl.static_range(R):
        acc, bk, carry, su = _bwd_query_tile(acc, bk, carry, su, q, do, K, V, SR, SU, offs_m,
                                             start_m + (R - 1 - c) * BLOCK_N, T, stride_kt, stride_vt, qk_scale,
                                             HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N, True, PRECISION,
                                             FAST_LOG2, SCAN)
    for jj in range(0, start_m // BLOCK_N):
        acc, bk, carry, su = _bwd_query_tile(acc, bk, carry, su, q, do, K, V, SR, SU, offs_m,
                                             start_m - (jj + 1) * BLOCK_N, T, stride_kt, stride_vt, qk_scale,
                                             HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N, False, PRECISION,
                                             FAST_LOG2, SCAN)
    tl.store(UT + bh * T + offs_m, su, mask=offs_m < T)
    dq = acc * scale
    dq = tl.where(offs_m[:, None] > tl.load(VBAD + bh), float("nan"), dq)  # rows that see a NaN/inf value
    store_rows(DQ + bh * stride_qb, dq, offs_m, offs_d, stride_qt, T, HEAD_DIM)


@triton.jit
def _bwd_key_tile(dkt, dvt, kt, vt, Q, DO, SR, SU, UT, offs_n, start_m, J, T, stride_qt, stride_vt, qk_scale,
                  HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr,
                  FAST_LOG2: tl.constexpr, SCAN: tl.constexpr):
    """Fold query tile ``[start_m, start_m + BLOCK_M)`` into key block ``J``'s ``dK^T`` (unscaled) and ``dV^T``
    (``[BD, BN]``, ``[BDV, BN]``), with that block's snapshots of the query sweep.  ``MASKED``: the tile holds
    hidden entries (``i <= j``) or rows past ``T``."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = load_rows(Q, offs_m, tl.arange(0, BLOCK_D), stride_qt, T, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)
    do = load_rows(DO, offs_m, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, MASKED, BLOCK_DV != HEAD_DV)
    if MASKED:
        in_t = offs_m < T
        carry = tl.load(SR + J * T + offs_m, mask=in_t, other=0.0)
        left = tl.load(UT + offs_m, mask=in_t, other=0.0) - tl.load(SU + J * T + offs_m, mask=in_t, other=0.0)
    else:
        carry = tl.load(SR + J * T + offs_m)
        left = tl.load(UT + offs_m) - tl.load(SU + J * T + offs_m)  # P_i(J): the values of the blocks left of J
    s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # [BM, BN], base 2
    dp = tl.dot(do, vt, input_precision=PRECISION)
    seen = (offs_n[None, :] < offs_m[:, None]) & (offs_m[:, None] < T)
    g, alpha, u, sig = _bwd_tile(s, dp, carry, seen, BLOCK_N, MASKED, FAST_LOG2, SCAN)
    dl = u - sig * (prefix_sums(u, BLOCK_N, SCAN) + left[:, None])
    if MASKED:
        dl = tl.where(seen, dl, 0.0)
        q = finite_or_zero(q)  # hidden queries' rows meet zeros: their NaN stays out of later keys' gradients
        do = finite_or_zero(do)
    dkt = tl.dot(tl.trans(q), dl.to(q.dtype), acc=dkt, input_precision=PRECISION)  # [BD, BN]
    dvt = tl.dot(tl.trans(do), alpha.to(do.dtype), acc=dvt, input_precision=PRECISION)  # [BDV, BN]
    return dkt, dvt


@triton.jit
def _stickbreaking_bwd_key(Q, K, V, DO, DK, DV, SR, SU, UT, VBAD, T, NB, qk_scale, scale,
                           stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                           HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           PRECISION: tl.constexpr, FAST_LOG2: tl.constexpr, SCAN: tl.constexpr):
    """The key sweep: ``dk``, ``dv`` of key block ``J`` (``BLOCK_N`` keys), query tiles of ``BLOCK_M`` rows from the
    first that sees a key of the block to ``T``: masked tiles (hidden entries), whole ones, a masked last one.
    Arguments as :func:`_stickbreaking_bwd_query`; ``DK``, ``DV`` have ``K``'s and ``V``'s strides.  Grid
    ``(cdiv(T, BLOCK_N), BH)``, the last key block first."""
    bh, start_n, offs_n = query_block(BLOCK_N)  # the program order of the query sweep, over key blocks
    J = start_n // BLOCK_N
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    Q, DO = Q + bh * stride_qb, DO + bh * stride_vb  # this head's rows
    SR, SU, UT = SR + bh * NB * T, SU + bh * NB * T, UT + bh * T
    k = load_rows(K + bh * stride_kb, offs_n, offs_d, stride_kt, T, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    v = finite_or_zero(load_rows(V + bh * stride_vb, offs_n, offs_dv, stride_vt, T, HEAD_DV, True,
                                   BLOCK_DV != HEAD_DV))
    kt = tl.trans(k)  # [BD, BN], a loaded tile
    vt = tl.trans(v)
    dkt = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    dvt = tl.zeros([BLOCK_DV, BLOCK_N], dtype=tl.float32)
    lo = ((start_n + 1) // BLOCK_M) * BLOCK_M  # the first query tile with a row that sees a key of the block
    mid = tl.maximum(lo, tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M)  # from here every row sees every key
    whole_end = (T // BLOCK_M) * BLOCK_M
    for start_m in range(lo, tl.minimum(mid, T), BLOCK_M):
        dkt, dvt = _bwd_key_tile(dkt, dvt, kt, vt, Q, DO, SR, SU, UT, offs_n, start_m, J, T, stride_qt, stride_vt,
                                 qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, True, PRECISION,
                                 FAST_LOG2, SCAN)
    for start_m in range(mid, whole_end, BLOCK_M):
        dkt, dvt = _bwd_key_tile(dkt, dvt, kt, vt, Q, DO, SR, SU, UT, offs_n, start_m, J, T, stride_qt, stride_vt,
                                 qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, False, PRECISION,
                                 FAST_LOG2, SCAN)
    for start_m in range(tl.maximum(mid, whole_end), T, BLOCK_M):
        dkt, dvt = _bwd_key_tile(dkt, dvt, kt, vt, Q, DO, SR, SU, UT, offs_n, start_m, J, T, stride_qt, stride_vt,
                                 qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, True, PRECISION,
                                 FAST_LOG2, SCAN)
    vbad = tl.load(VBAD + bh)
    dkt = tl.where((offs_n[None, :] >= vbad) & (offs_n[None, :] < T - 1), float("nan"), dkt * scale)
    # Stored transposed: the products' tiles are never transposed in registers.
    dk_ptrs = DK + bh * stride_kb + offs_n[None, :] * stride_kt + offs_d[:, None]
    tl.store(dk_ptrs, dkt.to(DK.dtype.element_ty), mask=(offs_n[None, :] < T) & (offs_d[:, None] < HEAD_DIM))
    dv_ptrs = DV + bh * stride_vb + offs_n[None, :] * stride_vt + offs_dv[:, None]
    tl.store(dv_ptrs, dvt.to(DV.dtype.element_ty), mask=(offs_n[None, :] < T) & (offs_dv[:, None] < HEAD_DV))


# ---------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------

# Tile shapes (BLOCK_M, BLOCK_N).  fp32 takes exact dots, slow to compile: one shape.  16-bit inputs
# let the autotuner choose; on the H100 at D = 64 it picked 64 x 32 (2 or 4 warps) or 128 x 32 for the scan with
# tl.cumsum.  BLOCK_M % BLOCK_N == 0 keeps the "diagonal, then whole blocks" split exact.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (64, 32, 2, 3), (128, 32, 4, 3)]
]
_FP32_CONFIG = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
_stickbreaking_fwd_tuned = triton.autotune(_GPU_CONFIGS, key=["T", "HEAD_DIM", "HEAD_DV", "PRECISION", "SCAN"])(
    _stickbreaking_fwd)
# The backward's tiles: both sweeps share BLOCK_N (the snapshots are per key block); fixed, not tuned.  Compiled for
# sm_90 with Triton 3.6 (offline, pathedu.bench.registers), 64 x 64 tiles spill (312 and 560 stack bytes in the
# query and key sweeps), 64 x 32 tiles take 0 and 40; 32-key blocks double the snapshots' memory against 64 (two fp32 arrays
# of BH x T x T / 32: 17 GB at B = H = 32, T = 8192).
_BWD_GPU = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
_BWD_FP32 = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def _scan_mode(x: Flat) -> str:
    """``"dot"`` for 16-bit inputs on a GPU, ``"cumsum"`` for fp32 inputs and the interpreter (module docstring)."""
    return "dot" if not interpreting() and x.dtype != torch.float32 else "cumsum"


def _check_blocks(block_m, block_n) -> tuple[int, int]:
    bm, bn = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if bm % bn or bm & (bm - 1) or bn & (bn - 1):
        raise ValueError(f"`block_m` ({bm}) must be a multiple of `block_n` ({bn}), both powers of two")
    return bm, bn


def stickbreaking_attention(q, k, v, *, scale=None):
    """Causal stick-breaking attention::

        alpha_ij = sigma(l_ij) prod_{m=j+1..i-1} (1 - sigma(l_im))  (j < i),   o_i = sum_{j<i} alpha_ij v_j

    with ``l_ij = scale * q_i . k_j``, ``scale=None`` meaning ``D ** -0.5``; ``o_0 = 0``.
    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``; ``D, Dv`` in 16..128;
    fp16/bf16/fp32 (fp32 accumulation).  When autograd wants gradients of ``q``, ``k`` or ``v``, the output has a
    ``grad_fn`` whose backward is two more kernels (:class:`_StickBreaking`).  Every argument is validated here.
    """
    x = prepare_qkv(q, k, v, backward=True)
    scale = check_scale(scale, x.n.D)
    if wants_grad(x.q, x.k, x.v):
        return x.result(_StickBreaking.apply(x.q, x.k, x.v, x, scale))
    return x.result(_stickbreaking_launch(x, scale))


def _stickbreaking_launch(x: Flat, scale: float, *, block_m=None, block_n=None, scan=None) -> torch.Tensor:
    """Launch on validated inputs (:func:`._launch.prepare_qkv`): returns ``(BH, T, Dv)``.
    ``block_m``, ``block_n``: fixed tiles (powers of two, ``block_m`` a multiple of ``block_n``;
    tests use small ones to make the carry cross several blocks), else the defaults.  ``scan``: ``"dot"`` or
    ``"cumsum"`` for the sums inside a tile (default :func:`_scan_mode`; tests run both)."""
    n = x.n
    out = x.new_output(n.Dv)
    if x.empty_input:
        return out
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                PRECISION=dot_precision(x.dtype), FAST_LOG2=not interpreting() and x.dtype != torch.float32,
                SCAN=scan or _scan_mode(x))
    args = dict(Q=x.q, K=x.k, V=x.v, O=out,
                T=n.T, qk_scale=scale * LOG2E,
                **row_strides(q=x.q, k=x.k, v=x.v, o=out))
    if block_m is not None or block_n is not None:
        bm, bn = _check_blocks(block_m, block_n)
        _stickbreaking_fwd[(triton.cdiv(n.T, bm), x.BH)](**args, BLOCK_M=bm, BLOCK_N=bn, **meta)
    elif interpreting():  # few large programs: the interpreter's cost is per program and loop trip
        bm = 16 if n.T <= 16 else 32 if n.T <= 32 else 64
        _stickbreaking_fwd[(triton.cdiv(n.T, bm), x.BH)](**args, BLOCK_M=bm, BLOCK_N=bm, **meta)
    elif meta["PRECISION"] == "ieee":
        _stickbreaking_fwd[(triton.cdiv(n.T, _FP32_CONFIG["BLOCK_M"]), x.BH)](**args, **_FP32_CONFIG, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["BLOCK_M"]), x.BH)  # noqa: E731
        _stickbreaking_fwd_tuned[grid](**args, **meta)
    return out


def _first_bad_value(v3: torch.Tensor) -> torch.Tensor:
    """``(BH,)`` int32: per head, the first position whose value has a NaN or inf (``T``: none); one reduction."""
    T = v3.shape[1]
    pos = torch.arange(T, device=v3.device, dtype=torch.int32)
    return torch.where(torch.isfinite(v3).all(-1), T, pos).amin(-1).to(torch.int32)


def _stickbreaking_bwd_launch(x: Flat, do, scale: float, *, block_m=None, block_n=None, scan=None):
    """The backward's two sweeps on the forward's validated inputs ``x`` and the output's gradient ``do``
    (``(BH, T, Dv)``): returns ``dq, dk, dv`` in the compute dtype.  ``block_m``, ``block_n``, ``scan``: as
    :func:`_stickbreaking_launch` (tests)."""
    n = x.n
    dq, dk, dv = torch.empty_like(x.q), torch.empty_like(x.k), torch.empty_like(x.v)
    if x.empty_input:
        return dq, dk, dv
    do = do.to(x.dtype).contiguous()
    if block_m is not None or block_n is not None:
        cfg = dict(zip(("BLOCK_M", "BLOCK_N"), _check_blocks(block_m, block_n)))
    elif interpreting():
        b = 16 if n.T <= 16 else 32 if n.T <= 32 else 64
        cfg = dict(BLOCK_M=b, BLOCK_N=b)
    else:
        cfg = dict(_BWD_FP32 if x.dtype == torch.float32 else _BWD_GPU)
    if interpreting():
        cfg = {key: cfg[key] for key in ("BLOCK_M", "BLOCK_N")}
    # Snapshots for every key block that a query block's diagonal region holds, those past T included.
    NB = triton.cdiv(n.T, cfg["BLOCK_M"]) * (cfg["BLOCK_M"] // cfg["BLOCK_N"])
    sr = torch.empty(x.BH, NB, n.T, dtype=torch.float32, device=x.device)
    su = torch.empty_like(sr)
    ut = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
    vbad = _first_bad_value(x.v)
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                PRECISION=dot_precision(x.dtype), FAST_LOG2=not interpreting() and x.dtype != torch.float32,
                SCAN=scan or _scan_mode(x))
    shared = dict(Q=x.q, K=x.k, V=x.v, DO=do, SR=sr, SU=su, UT=ut, VBAD=vbad,
                  T=n.T, NB=NB, qk_scale=scale * LOG2E, scale=scale,
                  **row_strides(q=x.q, k=x.k, v=x.v),
                  **cfg, **meta)
    _stickbreaking_bwd_query[(triton.cdiv(n.T, cfg["BLOCK_M"]), x.BH)](DQ=dq, **shared)
    _stickbreaking_bwd_key[(triton.cdiv(n.T, cfg["BLOCK_N"]), x.BH)](DK=dk, DV=dv, **shared)
    return dq, dk, dv


class _StickBreaking(torch.autograd.Function):
    """:func:`_stickbreaking_launch` with a backward pass (:func:`_stickbreaking_bwd_launch`).

    Inputs: the flattened ``q, k, v`` of a :class:`._launch.Flat` (``flat``, whose sizes and dtype are reused) and
    ``scale``.  Saves ``q, k, v`` only: the backward recomputes every logit, gate and weight."""

    @staticmethod
    def forward(ctx, q3, k3, v3, flat, scale):
        x = Flat(flat.n, q3, k3, v3, flat.dtype, flat.like)
        ctx.save_for_backward(q3, k3, v3)
        ctx.flat, ctx.scale = flat, scale
        return _stickbreaking_launch(x, scale)

    @staticmethod
    def backward(ctx, do):
        q3, k3, v3 = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        dq, dk, dv = _stickbreaking_bwd_launch(x, do, ctx.scale)
        return dq, dk, dv, None, None
