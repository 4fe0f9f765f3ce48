r"""CoPE (contextual position encoding): the FlashAttention template scanning right to left, and its backward.

CoPE's position of key ``j`` seen from query ``i`` is a count of sigmoid gates
(:mod:`pathedu.cope`)::

    z_ij = scale * q_i . k_j,    p_ij = sum_{m=j..i} sigmoid(z_im)  clamped to [0, P - 1]
    logit_ij = z_ij + (1 - w) qe[i, floor p_ij] + w qe[i, ceil p_ij],   w = p_ij - floor p_ij

with ``qe = Q E^T`` (``E = pos_emb``, ``(P, D)`` per head): ``q_i . E[n]`` for every integer
position ``n``, computed once by a pre-pass (a PyTorch product in fp32, ``(BH, T, P)``).

**Why right to left.**  The count of key ``j`` needs the gates of every key *after* it, up to
the query.  So the main kernel (:func:`_cope_fwd`, one program per block of ``BLOCK`` queries,
heaviest blocks first as in :func:`.flash_attention._flash_fwd`) walks key blocks from the
diagonal down to 0, carrying per query row ``c_i``, the sum of its gates on the keys already
passed.  In each ``[BM, BN]`` tile::

    z  = scale q K_J^T                     gates g = sigmoid(z), 0 for hidden keys (a select)
    p  = c + reverse cumsum of g along keys    (tl.cumsum(..., reverse=True))
    c += row sums of g
    p  clamped; lo = floor p, hi = min(lo + 1, P - 1), w = p - lo
    s  = z + (1 - w) qe[i, lo] + w qe[i, hi]   (two gathers from the row of qe: loads at computed offsets)
    fold s, V_J into the online softmax (m, l, acc)

The online softmax does not care about the order of the blocks (it keeps a running maximum and
rescales), so the template's update :func:`._pieces.softmax_fold` is reused as is: guarded and
masked on the diagonal tile (rows past ``T`` see nothing; hidden keys multiply through
:func:`._pieces.masked_dot`), plain on the tiles left of it.  Query and key blocks have one
size, so the diagonal region is one tile.  The diagonal tile's values are folded into
:func:`._pieces.first_nonfinite` and :func:`._pieces.poison` gives their NaN/inf back to the
rows that see them: a NaN or inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at
positions ``>= t`` only (a NaN count indexes row 0 of ``qe``, never memory out of bounds; the
logit is NaN through ``z`` anyway).  The counts' sums inside a tile are ``tl.cumsum`` for fp32 inputs and the
interpreter, products with a 0/1 triangular matrix for 16-bit inputs on a GPU (``SCAN="dot"``,
:func:`._pieces.scan_dot`: a scan along a product's rows costs about eleven warp shuffles per entry on sm_90).

**Backward** (:class:`_Cope`).  With ``lam_ij`` the logit, ``alpha`` the softmax weights and
``delta_i = dO_i . o_i``::

    dlam_ij = alpha_ij (dO_i . v_j - delta_i)                       (softmax, as in the template)
    dv_j    = sum_i alpha_ij dO_i
    dqe[i, n] = sum_j dlam_ij ((1 - w_ij) [n = lo_ij] + w_ij [n = hi_ij])         (each logit's two neighbours)
    dpc_ij  = dlam_ij (qe[i, hi_ij] - qe[i, lo_ij])                 (d logit / d p; 0 where p is clamped)
    dz_im   = dlam_im + g_im (1 - g_im) sum_{j <= m} dpc_ij          (p_ij counts the gates m = j..i)

and ``dq_i = scale sum_m dz_im k_m + sum_n dqe[i, n] E[n]``, ``dk_m = scale sum_i dz_im q_i``,
``dE = sum_i dqe[i]^T q_i``.  The counts are a suffix sum of gates, so their adjoint is a prefix sum of ``dpc``:
the keys left of ``m``.  The floor and ceil and the clamp are flat between integers: where ``p`` is an integer
``n``, ``lo = n``, ``w = 0``, and the kernel takes the slope ``qe[n + 1] - qe[n]`` of the piece to the right
(autograd through :func:`pathedu.cope.cope_matrix`, whose ``floor p = ceil p`` there, takes 0; the function is
continuous and its derivative jumps there).  Two sweeps, no atomics between programs, as in
:mod:`.stickbreaking`: a **query sweep** (:func:`_cope_bwd_query`, key blocks right to left with the carried
counts) gives ``dq`` through ``q K^T`` (the prefix sums' part from blocks not yet visited through one more
accumulator ``B = sum g (1 - g) k`` over the visited ones), writes per row and key block the carried gates and
the running sum of ``dpc`` (``O(T^2 / BLOCK)`` fp32 per head), and scatters ``dqe`` into its own rows with
relaxed atomic adds (no other program writes them; the clamped entries, most of a long row, are summed in
registers and added once); a **key sweep** (:func:`_cope_bwd_key`) gives ``dk`` and ``dv`` from those snapshots,
with ``Q^T`` and ``dO^T`` loaded transposed (a product's tile is never transposed).  Autograd takes ``dqe``
through the pre-pass ``qe = Q E^T`` to ``q`` and ``pos_emb``.  Hidden entries are 0 by selects, and hidden rows of
``K``, ``Q``, ``dO`` enter the diagonal tiles' products as 0: a NaN/inf input leaves the gradients that do not
depend on it finite and unchanged.

Precision: ``z``, gates, counts, the interpolation and the softmax are fp32 whatever the input
dtype; the two products (``q K^T`` and ``p V``) take the input dtype, as in the template.
Inputs are validated once, at :func:`cope_attention` (see :mod:`._launch`).

**Measured** (one H100, triton 3.6, torch 2.11, forward; a first look with 64-row tiles, before they were found
wrong at D = 128, see ``_GPU_CONFIG``; not the chapter's benchmark).  Against
:func:`pathedu.cope.cope_matrix` in float64 on the same rounded inputs, ``B = 2, H = 4, D = 64``: bf16
relative RMS 1.7e-3 (T = 1000, P = 16) and 2.0e-3 (T = 2048, P = 64), fp16 2.1e-4 and 2.5e-4; fp32
max error 1.8e-5 of the largest output at T = 1000.  Time at ``B = 8, H = 16, T = 2048, D = 64``, bf16:
4.4 ms, against 0.19 ms for SDPA in the same run: the two gathers per logit (``[BM, BN]`` loads at
data-dependent offsets) and the scan cost far more than the products.  Untried: ``tl.gather`` from a
``[BM, P]`` tile of ``qe`` held in registers (small ``P``), and autotuned tiles.
"""
from __future__ import annotations

import numbers

import torch
import triton
import triton.language as tl

from ..checks import check_scale, require
from ..cope import check_pos_emb, pos_emb_condition
from ._launch import Flat, dot_precision, interpreting, next_pow2, prepare_qkv, row_strides, wants_grad
from ._pieces import (finite_or_zero, first_nonfinite, load_rows, no_nonfinite, poison, prefix_sums, query_block,
                      query_rows_and_grad, scan_dot, softmax_fold, store_rows)
from .flash_attention import bwd_delta

__all__ = ["cope_attention"]


@triton.jit
def _counts(z, carry, offs_m, offs_n, P, DIAG: tl.constexpr, BLOCK_N: tl.constexpr, SCAN: tl.constexpr):
    """``(g, p)`` of one tile of natural logits ``z``: the gates ``sigmoid(z)`` (0 for hidden keys, a select) and
    the counts ``p_ij = carry_i + sum_{m >= j in the tile} g_im``, clamped to ``[0, P - 1]`` (``SCAN``: ``tl.cumsum``
    or a product, :func:`._pieces.scan_dot`; gates lie in (0, 1), and a NaN gate's row is NaN anyway)."""
    g = tl.sigmoid(z)  # [BM, BN], the gates
    if DIAG:
        g = tl.where(offs_m[:, None] >= offs_n[None, :], g, 0.0)  # a NaN key never reaches an earlier row
    if SCAN == "dot":
        p = scan_dot(g, tl.zeros_like(g) + carry[:, None], BLOCK_N, True, True)
    else:
        p = tl.cumsum(g, axis=1, reverse=True) + carry[:, None]  # [BM, BN]: sum_{m=j..i} g_im
    p = tl.where(p > P - 1.0, P - 1.0, p)  # clamp to [0, P - 1] (p >= 0 already; NaN stays NaN)
    p = tl.where(p < 0.0, 0.0, p)
    return g, p


@triton.jit
def _position_term(p, QE, offs_m, T, P, stride_et):
    """``(lo, hi, w, e_lo, e_hi)`` of clamped counts ``p``: the neighbours ``floor p`` and ``min(lo + 1, P - 1)``, the
    weight ``w = p - lo`` of ``hi``, and the two gathers ``qe[i, lo]``, ``qe[i, hi]`` (loads at computed offsets)."""
    lo = tl.where(p == p, p, 0.0).to(tl.int32)  # [BM, BN], floor (p >= 0); a NaN count reads row 0
    w = p - lo.to(tl.float32)  # [BM, BN], the weight of the upper neighbour
    hi = tl.minimum(lo + 1, P - 1)  # = ceil p wherever w > 0
    row = QE + offs_m[:, None] * stride_et  # [BM, 1] pointers to the rows of qe
    in_t = offs_m[:, None] < T
    e_lo = tl.load(row + lo, mask=in_t, other=0.0)  # [BM, BN], a gather: qe[i, lo_ij]
    e_hi = tl.load(row + hi, mask=in_t, other=0.0)  # [BM, BN], qe[i, hi_ij]
    return lo, hi, w, e_lo, e_hi


@triton.jit
def _cope_tile(acc, m_i, l_i, carry, q, K, V, QE, offs_m, start_n, T, P, scale, stride_kt, stride_vt, stride_et,
               HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr, DIAG: tl.constexpr, PRECISION: tl.constexpr, SCAN: tl.constexpr):
    """Fold key block ``[start_n, start_n + BLOCK_N)`` into ``(acc, m_i, l_i)`` and the carried counts.

    ``DIAG``: the tile holds the diagonal (hidden keys and keys past ``T``: gates 0, logits -inf);
    otherwise every key is visible and whole.  Returns the values tile too (for the non-finite
    bookkeeping of the diagonal)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = load_rows(K, offs_n, tl.arange(0, BLOCK_D), stride_kt, T, HEAD_DIM, DIAG, BLOCK_D != HEAD_DIM)  # [BN, BD]
    v = load_rows(V, offs_n, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, DIAG, BLOCK_DV != HEAD_DV)  # [BN, BDV]
    z = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BM, BN], natural units
    g, p = _counts(z, carry, offs_m, offs_n, P, DIAG, BLOCK_N, SCAN)
    carry += tl.sum(g, axis=1)  # [BM]
    lo, hi, w, e_lo, e_hi = _position_term(p, QE, offs_m, T, P, stride_et)
    s = (z + (1.0 - w) * e_lo + w * e_hi) * 1.4426950408889634  # [BM, BN], log2 units
    if DIAG:
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    acc, m_i, l_i = softmax_fold(acc, m_i, l_i, s, v, DIAG, DIAG, PRECISION)
    return acc, m_i, l_i, carry, v


@triton.jit
def _cope_fwd(Q, K, V, QE, O, LSE, T, P, scale,
              stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_eb, stride_et,
              stride_ob, stride_ot,
              HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
              BLOCK: tl.constexpr, PRECISION: tl.constexpr, SCAN: tl.constexpr, STORE_LSE: tl.constexpr):
    """CoPE's forward, one program per (block of ``BLOCK`` queries, head), heaviest first: grid
    ``(cdiv(T, BLOCK), BH)``.

    ``Q, K: (BH, T, D)``, ``V, O: (BH, T, Dv)``, ``QE = Q E^T: (BH, T, P)`` fp32; ``LSE``: ``(BH, T)`` fp32, each
    row's log-sum-exp (log2 units), written with ``STORE_LSE`` (for the backward).  The diagonal tile first, then
    key blocks right to left, carrying each row's sum of gates (:func:`_cope_tile`); the module docstring has the
    counts and the interpolation."""
    bh, start_m, offs_m = query_block(BLOCK)  # heaviest query blocks first
    K += bh * stride_kb
    V += bh * stride_vb
    QE += bh * stride_eb
    q = load_rows(Q + bh * stride_qb, offs_m, tl.arange(0, BLOCK_D), stride_qt, T, HEAD_DIM, True,
                   BLOCK_D != HEAD_DIM)  # [BM, BD]
    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_DV], dtype=tl.float32)
    carry = tl.zeros([BLOCK], dtype=tl.float32)  # per row: the gates of the keys already passed
    # The diagonal tile first (the counts start at the query), masked.
    acc, m_i, l_i, carry, v = _cope_tile(acc, m_i, l_i, carry, q, K, V, QE, offs_m, start_m, T, P, scale, stride_kt,
                                         stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK, True,
                                         PRECISION, SCAN)
    bad = first_nonfinite(v, tl.arange(0, BLOCK), no_nonfinite(BLOCK_DV))  # [BDV], packed positions
    # Then the key blocks left of it, right to left: every key visible, every block whole.
    for jj in range(0, start_m // BLOCK):
        start_n = start_m - (jj + 1) * BLOCK
        acc, m_i, l_i, carry, v = _cope_tile(acc, m_i, l_i, carry, q, K, V, QE, offs_m, start_n, T, P, scale,
                                             stride_kt, stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV,
                                             BLOCK, False, PRECISION, SCAN)
    # The diagonal tile multiplied values without their NaN/inf; the rows that see one get it back.
    o = poison(acc / l_i[:, None], offs_m - start_m, bad)
    store_rows(O + bh * stride_ob, o, offs_m, tl.arange(0, BLOCK_DV), stride_ot, T, HEAD_DV)
    if STORE_LSE:
        tl.store(LSE + bh * T + offs_m, m_i + tl.log2(l_i), mask=offs_m < T)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

@triton.jit
def _cope_bwd_tile(q, k, v, do, QE, lse, delta, carry, offs_m, offs_n, T, P, scale, stride_et,
                   BLOCK_N: tl.constexpr, DIAG: tl.constexpr, PRECISION: tl.constexpr, SCAN: tl.constexpr):
    """What both sweeps recompute for one ``[BM, BN]`` tile (queries along rows), fp32: ``alpha`` (the softmax
    weights, from the forward's log-sum-exp), ``dlam = alpha (dO v^T - delta)`` (the logits' gradient), the count
    gradient's seed ``dpc = dlam (qe[i, hi] - qe[i, lo])``, ``gp = g (1 - g)`` (the gates' slopes, 0 where hidden),
    the gates ``g`` and the interpolation ``(lo, hi, w)``.  Hidden entries are 0 by selects."""
    z = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BM, BN], natural units
    g, p = _counts(z, carry, offs_m, offs_n, P, DIAG, BLOCK_N, SCAN)
    lo, hi, w, e_lo, e_hi = _position_term(p, QE, offs_m, T, P, stride_et)
    alpha = tl.math.exp2((z + (1.0 - w) * e_lo + w * e_hi) * 1.4426950408889634 - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # [BM, BN]
    dlam = alpha * (dp - delta[:, None])
    dpc = dlam * (e_hi - e_lo)  # 0 where the count is clamped (hi = lo = P - 1)
    gp = g * (1.0 - g)
    if DIAG:
        seen = (offs_m[:, None] >= offs_n[None, :]) & (offs_m[:, None] < T)
        alpha = tl.where(seen, alpha, 0.0)
        dlam = tl.where(seen, dlam, 0.0)
        dpc = tl.where(seen, dpc, 0.0)
        gp = tl.where(seen, gp, 0.0)
    return g, alpha, dlam, dpc, gp, lo, hi, w


@triton.jit
def _cope_bwd_query_tile(acc, bk, carry, su, rest, q, do, lse, delta, K, V, QE, DQE, SR, SU, offs_m, start_n, T, P,
                         scale, stride_kt, stride_vt, stride_et, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, DIAG: tl.constexpr,
                         PRECISION: tl.constexpr, SCAN: tl.constexpr):
    """Fold key block ``J = [start_n, start_n + BLOCK_N)`` into ``dq`` (``acc``, unscaled), ``B`` (``bk``), the carried
    gates, the running sum of ``dpc`` and ``dqe``; write the block's snapshots for the key sweep."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = load_rows(K, offs_n, tl.arange(0, BLOCK_D), stride_kt, T, HEAD_DIM, DIAG, BLOCK_D != HEAD_DIM)
    v = load_rows(V, offs_n, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, DIAG, BLOCK_DV != HEAD_DV)
    g, alpha, dlam, dpc, gp, lo, hi, w = _cope_bwd_tile(q, k, v, do, QE, lse, delta, carry, offs_m, offs_n, T, P,
                                                        scale, stride_et, BLOCK_N, DIAG, PRECISION, SCAN)
    dz = dlam + gp * prefix_sums(dpc, BLOCK_N, SCAN)  # the part of dz whose sum of dpc lies inside the tile
    if DIAG:
        k = finite_or_zero(k)  # hidden keys' rows meet zeros: a NaN key stays out of earlier rows' dq
    r = tl.sum(dpc, axis=1)
    acc = tl.dot(dz.to(k.dtype), k, acc=acc, input_precision=PRECISION) + r[:, None] * bk
    bk = tl.dot(gp.to(k.dtype), k, acc=bk, input_precision=PRECISION)
    # dqe: each logit's gradient split between its two neighbours, scattered with atomic adds into this program's
    # own rows (no other program writes them); the clamped entries (lo = P - 1, w = 0), most of a long row, are
    # summed in registers instead and added once at the end.
    row = DQE + offs_m[:, None] * stride_et
    inside = (lo < P - 1) & (dlam != 0.0) & (offs_m[:, None] < T)
    if DIAG:
        inside = inside & (offs_m[:, None] >= offs_n[None, :]) & (offs_m[:, None] < T)
    tl.atomic_add(row + lo, (1.0 - w) * dlam, mask=inside, sem="relaxed")
    tl.atomic_add(row + hi, w * dlam, mask=inside & (w != 0.0), sem="relaxed")
    rest += tl.sum(tl.where(lo < P - 1, 0.0, dlam), axis=1)
    snap = (start_n // BLOCK_N) * T + offs_m
    tl.store(SR + snap, carry, mask=offs_m < T)
    carry += tl.sum(g, axis=1)
    su += r
    tl.store(SU + snap, su, mask=offs_m < T)
    return acc, bk, carry, su, rest


@triton.jit
def _cope_bwd_query(Q, K, V, DO, QE, LSE, DELTA, DQ, DQE, SR, SU, UT, T, P, NB, scale,
                    stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_eb, stride_et,
                    HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    BLOCK: tl.constexpr, PRECISION: tl.constexpr, SCAN: tl.constexpr):
    """The query sweep of CoPE's backward: ``dq`` (the part through ``q K^T``, unscaled then scaled) and ``dqe``
    (``DQE``, zeroed, ``QE``'s layout) of a block of ``BLOCK`` queries, key blocks right to left as in the forward.
    ``LSE``, ``DELTA``: ``(BH, T)`` fp32; ``SR``, ``SU``: ``(BH, NB, T)`` fp32 snapshots per key block (the carried
    gates at the block's right edge; ``sum_{j >= J} dpc_ij``); ``UT``: each row's ``sum_j dpc_ij``.  Grid
    ``(cdiv(T, BLOCK), BH)``, heaviest first."""
    bh, start_m, offs_m = query_block(BLOCK)
    K, V, QE, DQE = K + bh * stride_kb, V + bh * stride_vb, QE + bh * stride_eb, DQE + bh * stride_eb  # this head's
    SR, SU = SR + bh * NB * T, SU + bh * NB * T
    offs_d = tl.arange(0, BLOCK_D)
    q, do = query_rows_and_grad(Q, DO, bh, offs_m, stride_qb, stride_qt, stride_vb, stride_vt, T, HEAD_DIM, HEAD_DV,
                                BLOCK_D, BLOCK_DV)
    lse = tl.load(LSE + bh * T + offs_m, mask=offs_m < T, other=0.0)
    delta = tl.load(DELTA + bh * T + offs_m, mask=offs_m < T, other=0.0)
    acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    bk = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    su = tl.zeros([BLOCK], dtype=tl.float32)
    rest = tl.zeros([BLOCK], dtype=tl.float32)
    acc, bk, carry, su, rest = _cope_bwd_query_tile(acc, bk, carry, su, rest, q, do, lse, delta, K, V, QE, DQE, SR,
                                                    SU, offs_m, start_m, T, P, scale, stride_kt, stride_vt, stride_et,
                                                    HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK, True, PRECISION,
                                                    SCAN)
    for jj in range(0, start_m // BLOCK):
        acc, bk, carry, su, rest = _cope_bwd_query_tile(acc, bk, carry, su, rest, q, do, lse, delta, K, V, QE, DQE,
                                                        SR, SU, offs_m, start_m - (jj + 1) * BLOCK, T, P, scale,
                                                        stride_kt, stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D,
                                                        BLOCK_DV, BLOCK, False, PRECISION, SCAN)
    tl.store(UT + bh * T + offs_m, su, mask=offs_m < T)
    tl.atomic_add(DQE + offs_m * stride_et + (P - 1), rest, mask=offs_m < T, sem="relaxed")
    store_rows(DQ + bh * stride_qb, acc * scale, offs_m, offs_d, stride_qt, T, HEAD_DIM)


@triton.jit
def _cope_bwd_key_tile(dkt, dvt, k, v, Q, DO, QE, LSE, DELTA, SR, SU, UT, offs_n, start_m, J, T, P, scale, stride_qt,
                       stride_vt, stride_et, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, DIAG: tl.constexpr, PRECISION: tl.constexpr,
                       SCAN: tl.constexpr):
    """Fold query tile ``[start_m, start_m + BLOCK)`` into key block ``J``'s ``dK^T`` (unscaled) and ``dV^T``.
    ``DIAG``: the tile holds hidden entries or rows past ``T``."""
    offs_m = start_m + tl.arange(0, BLOCK)
    in_t = offs_m < T
    q = load_rows(Q, offs_m, tl.arange(0, BLOCK_D), stride_qt, T, HEAD_DIM, DIAG, BLOCK_D != HEAD_DIM)
    do = load_rows(DO, offs_m, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, DIAG, BLOCK_DV != HEAD_DV)
    lse = tl.load(LSE + offs_m, mask=in_t, other=0.0)
    delta = tl.load(DELTA + offs_m, mask=in_t, other=0.0)
    carry = tl.load(SR + J * T + offs_m, mask=in_t, other=0.0)
    left = tl.load(UT + offs_m, mask=in_t, other=0.0) - tl.load(SU + J * T + offs_m, mask=in_t, other=0.0)
    g, alpha, dlam, dpc, gp, lo, hi, w = _cope_bwd_tile(q, k, v, do, QE, lse, delta, carry, offs_m, offs_n, T, P,
                                                        scale, stride_et, BLOCK, DIAG, PRECISION, SCAN)
    dz = dlam + gp * (prefix_sums(dpc, BLOCK, SCAN) + left[:, None])
    if DIAG:
        q = finite_or_zero(q)  # hidden queries' rows meet zeros
        do = finite_or_zero(do)
    dkt = tl.dot(tl.trans(q), dz.to(q.dtype), acc=dkt, input_precision=PRECISION)  # [BD, BN]
    dvt = tl.dot(tl.trans(do), alpha.to(do.dtype), acc=dvt, input_precision=PRECISION)  # [BDV, BN]
    return dkt, dvt


@triton.jit
def _cope_bwd_key(Q, K, V, DO, QE, LSE, DELTA, DK, DV, SR, SU, UT, T, P, NB, scale,
                  stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_eb, stride_et,
                  HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  BLOCK: tl.constexpr, PRECISION: tl.constexpr, SCAN: tl.constexpr):
    """The key sweep: ``dk``, ``dv`` of key block ``J`` (``BLOCK`` keys), query tiles from the diagonal to ``T``
    (the diagonal one and a partial last one masked), with the query sweep's snapshots.  Arguments as
    :func:`_cope_bwd_query`.  Grid ``(NB, BH)``, the last key block first."""
    bh, start_n, offs_n = query_block(BLOCK)  # the program order of the query sweep, over key blocks
    J = start_n // BLOCK
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    Q, DO, QE = Q + bh * stride_qb, DO + bh * stride_vb, QE + bh * stride_eb  # this head's rows
    LSE, DELTA, UT = LSE + bh * T, DELTA + bh * T, UT + bh * T
    SR, SU = SR + bh * NB * T, SU + bh * NB * T
    k = load_rows(K + bh * stride_kb, offs_n, offs_d, stride_kt, T, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    v = load_rows(V + bh * stride_vb, offs_n, offs_dv, stride_vt, T, HEAD_DV, True, BLOCK_DV != HEAD_DV)
    dkt = tl.zeros([BLOCK_D, BLOCK], dtype=tl.float32)
    dvt = tl.zeros([BLOCK_DV, BLOCK], dtype=tl.float32)
    dkt, dvt = _cope_bwd_key_tile(dkt, dvt, k, v, Q, DO, QE, LSE, DELTA, SR, SU, UT, offs_n, start_n, J, T, P, scale,
                                  stride_qt, stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK, True,
                                  PRECISION, SCAN)
    whole_end = (T // BLOCK) * BLOCK
    for start_m in range(start_n + BLOCK, whole_end, BLOCK):
        dkt, dvt = _cope_bwd_key_tile(dkt, dvt, k, v, Q, DO, QE, LSE, DELTA, SR, SU, UT, offs_n, start_m, J, T, P,
                                      scale, stride_qt, stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV,
                                      BLOCK, False, PRECISION, SCAN)
    for start_m in range(tl.maximum(start_n + BLOCK, whole_end), T, BLOCK):
        dkt, dvt = _cope_bwd_key_tile(dkt, dvt, k, v, Q, DO, QE, LSE, DELTA, SR, SU, UT, offs_n, start_m, J, T, P,
                                      scale, stride_qt, stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV,
                                      BLOCK, True, PRECISION, SCAN)
    # Stored transposed: the products' tiles are never transposed in registers.
    dk_ptrs = DK + bh * stride_kb + offs_n[None, :] * stride_kt + offs_d[:, None]
    tl.store(dk_ptrs, (dkt * scale).to(DK.dtype.element_ty), mask=(offs_n[None, :] < T) & (offs_d[:, None] < HEAD_DIM))
    dv_ptrs = DV + bh * stride_vb + offs_n[None, :] * stride_vt + offs_dv[:, None]
    tl.store(dv_ptrs, dvt.to(DV.dtype.element_ty), mask=(offs_n[None, :] < T) & (offs_dv[:, None] < HEAD_DV))


# Tiles: one size for query and key blocks (the diagonal region is one tile).  The interpreter's cost
# is per program and loop trip, so it gets few large blocks.  On a GPU, 32-row tiles and one stage, both
# forced by triton 3.6 on an H100 (probes of 2026-11-23, B = 1, H = 2, T = 1000, D = 128, Dv = 32, bf16):
# with 64-row tiles and 4 warps every row from 16 on came out wrong (relative error 1.33: only the first
# warp's rows were right), with 8 warps the kernel read out of bounds (an illegal address); 32-row tiles
# gave 2.4e-3.  Two stages fail to compile (``PassManager::run failed`` in ``TritonGPUPipeline``, fp16).
# tests/gpu/test_forms.py runs every dtype and head dim through this configuration.
_GPU_CONFIG = dict(BLOCK=32, num_warps=4, num_stages=1)
# The backward's sweeps take 16-row tiles for 16-bit inputs on a GPU.  Measured on an H200 (triton 3.6, torch 2.11;
# B = 2, H = 1, T = 300, D = Dv = 64, P = 16, bf16, gradients against float64 autograd through cope_matrix): with
# 32-row tiles the key sweep's dk and dv came out wrong (max error 0.89 and 0.77 of the largest entry, with the
# counts summed by tl.cumsum) or the kernel read out of bounds (an illegal address, counts summed by products),
# while dq and dpos_emb were right (6e-3, 4e-3); with 16-row tiles every gradient was within 6e-3, by either way of
# summing.  fp32 inputs are right with 32-row tiles (every gradient within 6e-6), so they keep them.
_GPU_BWD_BLOCK_16BIT = 16


def _check_block(block) -> int | None:
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, numbers.Integral):
        raise TypeError(f"`block` must be a power of two in 16..128 or None, got {type(block).__name__} {block!r}")
    if block not in (16, 32, 64, 128):
        raise ValueError(f"`block` must be a power of two in 16..128 or None, got {block}")
    return int(block)


def cope_attention(q, k, v, pos_emb, *, scale=None, block=None):
    """Causal CoPE attention (:func:`pathedu.cope.cope_matrix`'s numbers).

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``pos_emb: (P, D)`` or broadcastable to
    ``(..., P, D)`` -> ``(..., T, Dv)``; ``D, Dv`` in 16..128; fp16/bf16/fp32 (gates, counts and
    the softmax in fp32; ``qe = Q E^T`` taken once in fp32).  ``scale=None`` means ``D ** -0.5``
    (it scales ``q . k``, not the position term).  ``block``: the tile size (16, 32, 64 or 128; None: 32 on a
    GPU, 16 for the backward of 16-bit inputs there, 32 or 64 in the interpreter).  Every argument is validated
    here (values with one host synchronisation).  When autograd wants gradients of ``q``, ``k``, ``v`` or ``pos_emb``, the
    output has a ``grad_fn``: the kernels' backward gives ``dq`` (through ``q K^T``), ``dk``, ``dv`` and ``dqe``,
    and autograd takes ``dqe`` through the pre-pass ``qe = Q E^T`` to ``q`` and ``pos_emb`` (:class:`_Cope`).
    """
    x = prepare_qkv(q, k, v, backward=True)
    scale = check_scale(scale, x.n.D)
    P = check_pos_emb(pos_emb, x.n, q)
    block = _check_block(block)
    require(pos_emb_condition(pos_emb))
    if x.empty_input:
        return x.result(x.new_output(x.n.Dv))
    # The pre-pass: q_i . E[n] for every integer position, fp32, (BH, T, P); differentiable (autograd's own ops).
    qe = (x.q.reshape(x.n.lead + (x.n.T, x.n.D)).to(torch.float32)
          @ pos_emb.to(torch.float32).transpose(-1, -2)).reshape(x.BH, x.n.T, P).contiguous()
    if wants_grad(x.q, x.k, x.v, qe):
        return x.result(_Cope.apply(x.q, x.k, x.v, qe, x, scale, block))
    out = x.new_output(x.n.Dv)
    _cope_launch(x, qe, P, scale, out, block)
    return x.result(out)


def _tiles(x: Flat, block=None, backward: bool = False) -> dict:
    """The launch's tile and its compile options: ``block`` (tests), the interpreter's few large tiles, or
    :data:`_GPU_CONFIG` (the backward of 16-bit inputs: :data:`_GPU_BWD_BLOCK_16BIT`)."""
    if block is not None:
        cfg = dict(_GPU_CONFIG, BLOCK=block)
    elif interpreting():
        cfg = dict(BLOCK=32 if x.n.T <= 32 else 64)
    elif backward and x.dtype != torch.float32:
        cfg = dict(_GPU_CONFIG, BLOCK=_GPU_BWD_BLOCK_16BIT)
    else:
        cfg = dict(_GPU_CONFIG)
    if interpreting():
        cfg = {"BLOCK": cfg["BLOCK"]}
    return cfg


def _scan_mode(x: Flat) -> str:
    """``"dot"`` (the counts' sums inside a tile as products, :func:`._pieces.scan_dot`) for 16-bit inputs on a
    GPU, ``"cumsum"`` for fp32 inputs and the interpreter."""
    return "dot" if not interpreting() and x.dtype != torch.float32 else "cumsum"


def _meta(x: Flat, scan=None) -> dict:
    n = x.n
    return dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                PRECISION=dot_precision(x.dtype), SCAN=scan or _scan_mode(x))


def _cope_launch(x: Flat, qe, P: int, scale: float, out, block=None, lse=None, scan=None) -> None:
    """Launch on validated inputs: ``qe`` fp32 ``(BH, T, P)``; writes ``out`` ``(BH, T, Dv)`` and, given an fp32
    ``(BH, T)`` ``lse``, each row's log-sum-exp (log2 units).  ``scan``: as :func:`_scan_mode` (tests run both)."""
    n = x.n
    cfg = _tiles(x, block)
    _cope_fwd[(triton.cdiv(n.T, cfg["BLOCK"]), x.BH)](
        Q=x.q, K=x.k, V=x.v, QE=qe, O=out, LSE=qe if lse is None else lse,
        T=n.T, P=P, scale=scale,
        **row_strides(q=x.q, k=x.k, v=x.v, e=qe, o=out),
        **cfg, **_meta(x, scan), STORE_LSE=lse is not None,
    )


def _cope_bwd_launch(x: Flat, qe, out, lse, do, P: int, scale: float, block=None, scan=None):
    """The backward's two sweeps on the forward's validated inputs, its output ``out`` and log-sum-exp ``lse``, and
    the output's gradient ``do`` (``(BH, T, Dv)``): returns ``dq`` (through ``q K^T`` only), ``dk``, ``dv`` in the
    compute dtype and ``dqe`` fp32 ``(BH, T, P)``."""
    n = x.n
    do = do.to(x.dtype).contiguous()
    cfg = _tiles(x, block, backward=True)
    NB = triton.cdiv(n.T, cfg["BLOCK"])
    dq, dk, dv = torch.empty_like(x.q), torch.empty_like(x.k), torch.empty_like(x.v)
    dqe = torch.zeros_like(qe)
    sr = torch.empty(x.BH, NB, n.T, dtype=torch.float32, device=x.device)
    su = torch.empty_like(sr)
    ut = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
    delta = bwd_delta(out, do)
    shared = dict(Q=x.q, K=x.k, V=x.v, DO=do, QE=qe, LSE=lse, DELTA=delta, SR=sr, SU=su, UT=ut,
                  T=n.T, P=P, NB=NB, scale=scale,
                  **row_strides(q=x.q, k=x.k, v=x.v, e=qe),
                  **cfg, **_meta(x, scan))
    _cope_bwd_query[(NB, x.BH)](DQ=dq, DQE=dqe, **shared)
    _cope_bwd_key[(NB, x.BH)](DK=dk, DV=dv, **shared)
    return dq, dk, dv, dqe


class _Cope(torch.autograd.Function):
    """:func:`_cope_launch` with a backward pass (:func:`_cope_bwd_launch`).

    Inputs: the flattened ``q, k, v`` of a :class:`._launch.Flat` (``flat``), ``qe = Q E^T`` (fp32 ``(BH, T, P)``,
    made by autograd's own ops, which take its gradient on to ``q`` and ``pos_emb``), ``scale`` and ``block``.
    Saves ``q, k, v, qe``, the output and the log-sum-exp (``O(T)`` per head); the backward recomputes the rest."""

    @staticmethod
    def forward(ctx, q3, k3, v3, qe, flat, scale, block):
        x = Flat(flat.n, q3, k3, v3, flat.dtype, flat.like)
        out = x.new_output(x.n.Dv)
        lse = torch.empty(x.BH, x.n.T, dtype=torch.float32, device=x.device)
        _cope_launch(x, qe, qe.shape[-1], scale, out, block, lse=lse)
        ctx.save_for_backward(q3, k3, v3, qe, out, lse)
        ctx.flat, ctx.scale, ctx.block = flat, scale, block
        return out

    @staticmethod
    def backward(ctx, do):
        q3, k3, v3, qe, out, lse = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        dq, dk, dv, dqe = _cope_bwd_launch(x, qe, out, lse, do, qe.shape[-1], ctx.scale, ctx.block)
        return dq, dk, dv, dqe, None, None, None
