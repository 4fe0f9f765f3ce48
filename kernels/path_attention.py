r"""PaTH attention: the FlashAttention template with a right-to-left scan, and its backward pass.

PaTH's logit between key ``j`` and query ``i`` carries the product of the
Householder-like transitions between them (0-based, smallest index on the left)::

    H_s = I - beta_s w_s w_s^T,      logit_ij = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i   (j <= i)

The kernel is :func:`pathedu.path.path_blockwise` in three launches.

**Preparation pass** (:mod:`.ut_prepare`, shared with the chunked Householder
RNN / DeltaNet; all blocks of ``BT`` tokens ``[s, e]`` in parallel, two launches).
From each block's UT factor it writes the boundary-adjusted queries
``q~_i = H_s ... H_i q_i`` (scaled to unit length, the norms kept apart: see
*Precision*), the boundary-adjusted keys ``k~_j = H_e ... H_{j+1} k_j``, the
in-block scores ``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` (j <= i) and the block's whole
transition as one dense ``D x D`` matrix ``G_J = P_J^T - I`` (optionally also the
compact factors ``W`` and ``-U = -A W``).

**Main pass** (:func:`_path_fwd`, one program per block of ``BLOCK_M = R * BT``
queries).  Like :func:`.flash_attention._flash_fwd` it keeps the online softmax
``(m, l, acc)`` in fp32 (the same :func:`._pieces.softmax_fold`) and launches the
heaviest query blocks first (:func:`._pieces.query_block`); unlike
it, keys are visited **right to left**, because the query has to be carried
across the transitions it passes::

    q^ = q~_I                               (fp32, one row per query)
    diagonal blocks: Ã, masked (rows of later sub-blocks see these keys as an earlier block)
    for J = I-1, I-2, ..., 0:
        s  = q^ K~_J^T                      logits of key block J
        fold s, V_J into (m, l, acc)
        q^ <- P_J q^,  as rows  q^ <- q^ + q^ G_J

PaTH thus costs one product more per block pair than FlashAttention: with
``D <= 2 BT`` the dense ``q^ G_J`` (``BLOCK_M x D x D``) is cheaper than the
compact ``(q^ W_J^T)(-U_J)`` (two ``BLOCK_M x BT x D`` products), which is kept
for ``D > 2 BT`` (``UPDATE`` hook).  At D = BT = 64: 3 products instead of 2,
1.5 times FlashAttention's FLOPs.

**Precision.**  ``q^`` is carried in fp32 and rounded to 16 bits only as a
product operand.  The logit product uses the input dtype (as FlashAttention
does); the update uses fp16 operands (11-bit mantissa) even for bf16 inputs,
because its rounding error is re-injected at every block and accumulates along
the scan.  So that fp16 cannot overflow whatever the input's range, each ``q~_i``
is scaled to unit length (``|P_J| <= 1`` for unit ``w`` and ``beta`` in [0, 2])
and its norm is folded into a per-row logit scale.  The preparation pass runs
tf32 products on fp32 tiles with operands rounded to nearest (:func:`._pieces.rn`: the
tensor cores truncate, and a truncated ``G_J`` shrinks ``q^`` a little at every
block, an error that grows linearly with T).  fp32 inputs run about fp32
throughout.  The measurements behind each choice: NOTES_path.md, "The carried query in fp32, its updates
in fp16", and NOTES_path.md, "Rounding to nearest before tf32 products".

**Backward pass** (:func:`_path_bwd_launch`, :class:`_PathAttention`).  Reversing the scan would need every
carried query in the opposite order.  Instead query block ``I`` and key block ``J < I`` meet once, at the
boundary between the halves of the smallest dyadic node holding both (:func:`pathedu.path.path_dyadic`):
queries are carried left to it and keys right to it (:mod:`.path_carry`), and :func:`_path_bwd` runs the
FlashAttention template's backward steps on those rectangles; the carries' reverse and the preparation
pass's backward (:func:`.ut_prepare.ut_prepare_backward`) bring the gradients back to ``q, k, w, beta``.
A forward that will be differentiated therefore runs on the same schedule (:func:`_path_dyadic_fwd`: the
preparation pass, the carries, then FlashAttention's forward on those rectangles) and saves the log-sum-exp of
exactly the logits the backward differentiates, as FlashAttention-2 does; the scan's logits are rounded
differently, and its statistics did not fit the backward's (``NOTES_path.md``, "The training forward runs on the
backward's schedule").  By
default it also keeps its factors and meeting points for the backward (``save_factors``).

**Non-finite inputs.**  The diagonal region folds through
:func:`._pieces.masked_dot`, and every mask of the preparation pass is a select:
a NaN or inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at
positions ``>= t`` only.  Inputs are validated once, at :func:`path_attention`
(see :mod:`._launch`).

**Every kernel of PaTH, in launch order: kernel (its module) <- the function that launches it.**

Forward without gradients, :func:`path_attention` -> :func:`_path_launch`:

1. ``_gate_prefix`` (:mod:`.gates`) <- :func:`.gates.cumulative_log_gates`: PaTH-FoX's ``c = cumsum(log_f)``;
2. ``_ut_diag_inverse`` (:mod:`.ut_prepare`) <- :func:`.ut_prepare.invert_diagonal_blocks`, called by
   :class:`.ut_prepare.Prepared`: each block's ``(I + L)^-1``, counting bad ``w`` and ``beta``;
3. ``_ut_prepare`` (:mod:`.ut_prepare`) <- :class:`.ut_prepare.Prepared`: ``q~, k~, Ã, G`` per block;
4. :func:`_path_fwd` <- :func:`_path_launch`: the right-to-left scan.

Forward to be differentiated, :class:`_PathAttention` -> :func:`_path_train_forward`:

1. steps 1 to 3 above, through :func:`_bwd_prepare` (which keeps the inverses);
2. ``_carry_fwd`` (:mod:`.path_carry`) <- :func:`.path_carry.carry_forward`: queries and keys to their meeting
   points;
3. :func:`_path_dyadic_fwd` <- :func:`_dyadic_forward`: FlashAttention's forward on those rectangles.

Backward, :meth:`_PathAttention.backward` -> :func:`_path_bwd_launch`:

1. ``_bwd_delta`` (:mod:`.flash_attention`) <- :func:`.flash_attention.bwd_delta`: ``delta = dO . O``;
2. :func:`_path_bwd` <- :func:`_bwd_kernel`: FlashAttention's backward steps on the rectangles: ``dX, dÃ, dV``
   and the gate's row and column sums;
3. ``_carry_bwd`` (:mod:`.path_carry`) <- :func:`.path_carry.carry_backward`: the carries reversed:
   ``dq~, dk~, dG``;
4. ``_ut_bwd_aw``, ``_ut_bwd_scores``, ``_ut_bwd_qk``, ``_ut_bwd_w_inverse`` (:mod:`.ut_prepare`, in this order)
   <- :func:`.ut_prepare.ut_prepare_backward`: the preparation pass reversed: ``dq, dk, dw, dbeta``;
5. ``_gate_prefix`` right to left <- the backward of :func:`.gates.cumulative_log_gates`: PaTH-FoX's ``dlog_f``.

The backward steps shared with FlashAttention (``dkdv_steps``, ``dq_steps``, ``bwd_logits``, ``bwd_probs``) live
in :mod:`.flash_attention`; the jit helpers shared by every kernel in :mod:`._pieces`.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ..checks import check_scale, checked_after
from ._launch import (Flat, dot_precision, interpreting, next_pow2, per_token, prepare_qkv, row_strides,
                      wants_grad)
from .flash_attention import bwd_delta, bwd_logits, bwd_probs, dkdv_steps, dq_steps
from .gates import cumulative_log_gates
from .path_carry import carry_backward, carry_forward
from ._pieces import (LOG2E, first_nonfinite, gate_keys, gate_ref, gate_rows, load_rows, no_nonfinite, poison,
                      query_block, softmax_fold, softmax_fold_scaled, store_rows)
from .ut_prepare import MAX_R, Prepared, check_block, prep_precision, ut_prepare_backward

__all__ = ["path_attention", "Prepared", "MAX_R"]


@triton.jit
def _transition(qh, GM, WC, NU, cols, offs_d, stride_pt, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                UPDATE: tl.constexpr, PRECISION: tl.constexpr):
    """``q^ <- P_J q^`` for every row (fp32 accumulation), as row vectors ``q^ <- q^ + q^ G_J``.

    ``UPDATE == "dense"``: one ``D x D`` product with ``G_J`` (``GM`` points at it);
    ``"ut"``: the compact form ``q^ + (q^ W_J^T)(-U_J)``, two ``BLOCK_N``-wide products
    (``WC``, ``NU`` point at block J's first row).  Dense costs ``D`` per row and key,
    compact ``2 BLOCK_N``: dense wins while ``D <= 2 BLOCK_N``.
    """
    if UPDATE == "dense":
        g = load_rows(GM, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM, BLOCK_D != HEAD_DIM, BLOCK_D != HEAD_DIM)
        return tl.dot(qh.to(g.dtype), g, acc=qh, input_precision=PRECISION)
    else:
        w = load_rows(WC, cols, offs_d, stride_pt, 0, HEAD_DIM, False, BLOCK_D != HEAD_DIM)
        nu = load_rows(NU, cols, offs_d, stride_pt, 0, HEAD_DIM, False, BLOCK_D != HEAD_DIM)
        x = tl.dot(qh.to(w.dtype), tl.trans(w), input_precision=PRECISION)
        return tl.dot(x.to(nu.dtype), nu, acc=qh, input_precision=PRECISION)


@triton.jit
def _gate_bias(C, c_ref, offs_n, T, GATED: tl.constexpr):
    """The FoX bias hook of the scan (PaTH-FoX, chapter 7), in log2 units, for key block ``offs_n``:
    ``(c_r - c_j) log2(e)`` with ``c`` the fp32 cumulative log gate and ``r`` the query block's first row
    (:func:`._pieces.gate_keys`).  As in the FlashAttention template the per-row rest ``c_i - c_r`` is
    left out (softmax ignores it), so the bias does not depend on the order in which key blocks are visited."""
    if GATED:
        return gate_keys(C, c_ref, offs_n, T, True)[None, :]
    else:
        return 0.0


@triton.jit
def _path_fwd(QT, QN, KT, AD, GM, WC, NU, V, O, C, LSE, T, qk_scale,
              stride_pb, stride_pt, stride_nb, stride_ab, stride_at, stride_gb, stride_gj,
              stride_vb, stride_vt, stride_ob, stride_ot,
              HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
              R: tl.constexpr, BLOCK_N: tl.constexpr, UPDATE: tl.constexpr, PRECISION: tl.constexpr,
              GATED: tl.constexpr, STORE_LSE: tl.constexpr):
    """PaTH's main pass, one program per (block of ``R * BLOCK_N`` queries, head), heaviest first: grid
    ``(cdiv(T, BLOCK_M), BH)``.

    ``QT, KT, WC, NU: (BH, T_pad, D)`` and ``AD, GM`` from the preparation pass (:mod:`.ut_prepare`), ``QN`` the
    queries' norms, ``V, O: (BH, T, Dv)``, ``C``: cumulative log gates ``(BH, T)`` (``GATED``), ``LSE``:
    ``(BH, T)`` (``STORE_LSE``).  The diagonal blocks from ``Ã``, then key blocks right to left with the
    carried query updated after each (``UPDATE``: dense ``G`` or compact ``W, -U``); the module docstring has
    the scan and its precision."""
    BLOCK_M: tl.constexpr = R * BLOCK_N
    bh, start_m, offs_m = query_block(BLOCK_M)  # heaviest query blocks first, as in the template
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    # The prepared tensors share one layout (BH, T_pad, D): one offset per head for all four.
    QT, KT, WC, NU = QT + bh * stride_pb, KT + bh * stride_pb, WC + bh * stride_pb, NU + bh * stride_pb
    GM, V = GM + bh * stride_gb, V + bh * stride_vb
    C += bh * T  # (PaTH-FoX) this head's cumulative log gates, (BH, T) fp32
    c_ref = 0.0
    if GATED:
        c_ref = gate_ref(C, start_m)  # start_m < T for every launched block

    # The carried query, fp32, unit rows; the norm goes into a per-row logit scale.
    qh = load_rows(QT + start_m * stride_pt, rows, offs_d, stride_pt, BLOCK_M, HEAD_DIM, False, CHECK_D)
    qh = qh.to(tl.float32)
    row_scale = tl.load(QN + bh * stride_nb + offs_m) * qk_scale
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Diagonal region: the R key blocks inside the query block, right to left.  Rows
    # in sub-block c take block c's in-block scores Ã; rows in later sub-blocks see
    # block c as an earlier block (logits from q^, then q^ <- P_c q^).
    sub = rows // BLOCK_N
    ad = load_rows(AD + bh * stride_ab + start_m * stride_at, rows, cols, stride_at, BLOCK_M, BLOCK_N, False, False)
    for c in tl.static_range(R):
        cc = R - 1 - c
        start_n = start_m + cc * BLOCK_N
        offs_n = start_n + cols
        s = ad * qk_scale
        if cc < R - 1:
            kt = load_rows(KT + start_n * stride_pt, cols, offs_d, stride_pt, BLOCK_N, HEAD_DIM, False, CHECK_D)
            s_off = tl.dot(qh.to(kt.dtype), tl.trans(kt), input_precision=PRECISION) * row_scale[:, None]
            s = tl.where(sub[:, None] == cc, s, s_off)
        s += _gate_bias(C, c_ref, offs_n, T, GATED)
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        v = load_rows(V + start_n * stride_vt, cols, offs_dv, stride_vt, T - start_n, HEAD_DV, True,
                      BLOCK_DV != HEAD_DV)
        # Guarded (rows may have seen only -inf so far) and masked (no NaN/inf of a hidden key
        # may reach a row through 0 * NaN).
        acc, m_i, l_i = softmax_fold(acc, m_i, l_i, s, v, True, True, PRECISION)
        if cc < R - 1:
            qn = _transition(qh, GM + (start_n // BLOCK_N) * stride_gj, WC + start_n * stride_pt,
                             NU + start_n * stride_pt, cols, offs_d, stride_pt, HEAD_DIM, BLOCK_D, UPDATE, PRECISION)
            qh = tl.where(sub[:, None] > cc, qn, qh)
    # The region multiplied values without their NaN/inf; the rows that see one get it back
    # (its values are read again, from the cache: nothing extra stays live in the loop above).
    bad = no_nonfinite(BLOCK_DV)
    for c in tl.static_range(R):
        v = load_rows(V + (start_m + c * BLOCK_N) * stride_vt, cols, offs_dv, stride_vt, T - start_m - c * BLOCK_N,
                      HEAD_DV, True, BLOCK_DV != HEAD_DV)
        bad = first_nonfinite(v, c * BLOCK_N + cols, bad)
    acc = poison(acc, rows, bad)

    # Key blocks strictly left of the query block, right to left: every key visible
    # (no causal mask) and every block whole (no row masks).
    for jj in range(0, start_m // BLOCK_N):
        start_n = start_m - (jj + 1) * BLOCK_N
        kt = load_rows(KT + start_n * stride_pt, cols, offs_d, stride_pt, 0, HEAD_DIM, False, CHECK_D)
        v = load_rows(V + start_n * stride_vt, cols, offs_dv, stride_vt, 0, HEAD_DV, False, BLOCK_DV != HEAD_DV)
        s = tl.dot(qh.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)  # [BM, BN], times row_scale
        if GATED:
            s = s * row_scale[:, None] + _gate_bias(C, c_ref, start_n + cols, T, GATED)
            acc, m_i, l_i = softmax_fold(acc, m_i, l_i, s, v, False, False, PRECISION)
        else:  # the row scale rides in the update's exponent (no multiply per logit)
            acc, m_i, l_i = softmax_fold_scaled(acc, m_i, l_i, s, row_scale, v, False, False, PRECISION, "row")
        qh = _transition(qh, GM + (start_n // BLOCK_N) * stride_gj, WC + start_n * stride_pt,
                         NU + start_n * stride_pt, cols, offs_d, stride_pt, HEAD_DIM, BLOCK_D, UPDATE, PRECISION)

    l_i = tl.where(offs_m < T, l_i, 1.0)  # rows past T (never stored) sum to 0: no 0 / 0 or log2(0) there
    store_rows(O + bh * stride_ob, acc / l_i[:, None], offs_m, offs_dv, stride_ot, T, HEAD_DV)
    if STORE_LSE:
        # For the backward pass, as in the template: the log-sum-exp (log2 units) of the true logits,
        # whose bias is c_i - c_j (the scan added c_r - c_j).
        lse = m_i + tl.log2(l_i)
        if GATED:
            lse += gate_rows(C, c_ref, offs_m, T)
        tl.store(LSE + bh * T + offs_m, lse, mask=offs_m < T)


# Tile shapes of the main pass: a query block is R UT blocks (BLOCK_M = R * BLOCK_N,
# BLOCK_N fixed by the preparation pass); the autotuner picks R, warps and stages.
_GPU_CONFIGS = [
    triton.Config({"R": r}, num_warps=w, num_stages=s)
    for r, w, s in [(1, 4, 2), (1, 4, 3), (2, 4, 2), (2, 4, 3)]
]
_TUNE_KEY = ["HEAD_DIM", "HEAD_DV", "BLOCK_N", "UPDATE", "PRECISION", "GATED", "STORE_LSE"]
_path_fwd_tuned = triton.autotune(_GPU_CONFIGS, key=_TUNE_KEY)(_path_fwd)


@triton.jit
def _ut_program(BT: tl.constexpr):
    """A backward program's head and UT block: ``(bh, start, offs_b)`` for grid ``(blocks of BT, BH, ...)``."""
    bh = tl.program_id(1).to(tl.int64)
    start = tl.program_id(0) * BT
    return bh, start, start + tl.arange(0, BT)


@triton.jit
def _schedule_program(X, V, C, T, stride_xb, stride_vb, BT: tl.constexpr, BIAS: tl.constexpr):
    """The head shared by :func:`_path_dyadic_fwd` and :func:`_path_bwd`: the program's head and UT block
    (:func:`_ut_program`), ``X`` and ``V`` moved to that head, and the gate argument of
    :func:`.flash_attention.bwd_logits` (the head's cumulative log gate, or 0 without one)."""
    bh, start, offs_b = _ut_program(BT)
    bias_arg = 0.0
    if BIAS == "loggate":
        bias_arg = C + bh * T
    return bh, start, offs_b, X + bh * stride_xb, V + bh * stride_vb, bias_arg


@triton.jit
def _diagonal_scores(AD, bh, start, stride_ab, T, BT: tl.constexpr):
    """The in-block scores ``Ã`` of the UT block at ``start`` (rows: its queries, columns: its keys),
    ``[BT, BT]``; rows past ``T`` read as 0."""
    cols = tl.arange(0, BT)
    return load_rows(AD + bh * stride_ab + start * BT, cols, cols, BT, T - start, BT, True, False)


@triton.jit
def _query_levels(start, lvl, BT: tl.constexpr):
    """The keys that the query block at ``start`` meets at level ``lvl``: ``(lo, hi, right)``.  Keys
    ``[lo, hi)`` are the left half of the block's dyadic node when the block is in its right half (``right``),
    else the range is empty.  :func:`_path_dyadic_fwd` and :func:`_path_bwd`'s query role walk these same tiles:
    the statistics are only right for the logits they are used with."""
    h = BT * (1 << lvl)  # tokens in a half at this level
    right = (start // h) % 2 == 1
    hi = (start // h) * h  # the boundary between the halves
    return tl.where(right, hi - h, hi), hi, right


@triton.jit
def _key_levels(start, lvl, T, BT: tl.constexpr):
    """The queries that the key block at ``start`` meets at level ``lvl``: ``(lo, hi, left)``, the right half of
    its dyadic node (cut at ``T``) when the block is in the left half (``left``), else empty."""
    h = BT * (1 << lvl)
    left = (start // h) % 2 == 0
    lo = (start // (2 * h)) * (2 * h) + h  # the boundary: the right half's first query
    return lo, tl.maximum(tl.where(left, tl.minimum(lo + h, T), lo), lo), left


@triton.jit
def _path_dyadic_fwd(X, AD, V, O, C, LSE, T, LEVELS, qk_scale, stride_xl, stride_xb, stride_ab, stride_vb,
                     stride_vt, stride_ob, stride_ot, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BT: tl.constexpr, INNER: tl.constexpr,
                     BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """The training forward: the output and its log-sum-exp from the logits exactly as :func:`_path_bwd` computes
    them, one UT block of queries per program (grid ``(blocks, BH)``).

    The scan (:func:`_path_fwd`) and the dyadic schedule multiply the transitions in different orders and round
    differently.  A backward that normalised its own logits with the scan's log-sum-exp was exact only in exact
    arithmetic: where logits are large (a trained model's sharp attention), a logit off by ``delta`` turns ``p``
    into ``p 2^delta``, the rows stop summing to one, and the gradients were 20-300% off float64 in a trained model
    (``NOTES_path.md``, "The training forward runs on the backward's schedule").  So a forward that will be
    differentiated walks the tiles of ``_path_bwd``'s query role instead, from the meeting-point rows ``X`` and the in-block scores ``AD``, and
    computes each logit as ``_path_bwd`` does (:func:`.flash_attention.bwd_logits`): the log-sum-exp it saves
    (``LSE``, log2 units, fp32 ``(BH, T)``) is the one of the logits that the backward differentiates, as in
    FlashAttention-2.  ``O``: ``(BH, T, Dv)``.  Non-finite values: the diagonal tile folds through
    :func:`._pieces.masked_dot` and the rows that see a NaN or inf value get it back at the end
    (:func:`._pieces.poison`), as in the scan."""
    bh, start, offs_b, X, V, bias_arg = _schedule_program(X, V, C, T, stride_xb, stride_vb, BT, BIAS)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rel = tl.arange(0, BT)  # positions relative to the block, for the non-finite bookkeeping
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    CHECK_DV: tl.constexpr = BLOCK_DV != HEAD_DV
    m_i = tl.full([BT], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BT], dtype=tl.float32)
    acc = tl.zeros([BT, BLOCK_DV], dtype=tl.float32)
    # The diagonal tile, from the in-block scores; its rows of later queries hide the later keys (selected away).
    s_d = _diagonal_scores(AD, bh, start, stride_ab, T, BT) * qk_scale
    s_d = bwd_logits(s_d, bias_arg, offs_b[:, None], offs_b[None, :], T, True, BIAS)  # [BT, BT]
    v_b = load_rows(V, offs_b, offs_dv, stride_vt, T, HEAD_DV, True, CHECK_DV)  # [BT, BDV]
    acc, m_i, l_i = softmax_fold(acc, m_i, l_i, s_d, v_b, True, True, PRECISION)
    bad = first_nonfinite(v_b, rel, no_nonfinite(BLOCK_DV))
    # Every earlier block, at the level where it meets this one: whole key tiles, no mask.
    XL = X
    for lvl in range(0, LEVELS):
        lo, hi, _ = _query_levels(start, lvl, BT)  # the tiles of _path_bwd's query role
        q = load_rows(XL, offs_b, offs_d, HEAD_DIM, T, HEAD_DIM, True, CHECK_D)  # [BT, BD]
        for start_n in range(lo, hi, INNER):
            offs_n = start_n + tl.arange(0, INNER)
            k = load_rows(XL, offs_n, offs_d, HEAD_DIM, T, HEAD_DIM, False, CHECK_D)  # [BN, BD]
            v = load_rows(V, offs_n, offs_dv, stride_vt, T, HEAD_DV, False, CHECK_DV)  # [BN, BDV]
            # (a new name: a tile of INNER keys is not the diagonal tile's shape, and Triton types loop variables)
            s_n = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BT, BN], as _bwd_tile
            s_n = bwd_logits(s_n, bias_arg, offs_b[:, None], offs_n[None, :], T, False, BIAS)
            acc, m_i, l_i = softmax_fold(acc, m_i, l_i, s_n, v, False, False, PRECISION)
        XL += stride_xl
    acc = poison(acc, rel, bad)
    l_i = tl.where(offs_b < T, l_i, 1.0)  # rows past T (never stored) sum to 0: no 0 / 0 or log2(0) there
    store_rows(O + bh * stride_ob, acc / l_i[:, None], offs_b, offs_dv, stride_ot, T, HEAD_DV)
    tl.store(LSE + bh * T + offs_b, m_i + tl.log2(l_i), mask=offs_b < T)


@triton.jit
def _path_bwd(X, AD, V, DO, LSE, DELTA, C, DX, DAD, DV, DBR, DBC, T, LEVELS, qk_scale, scale,
              stride_xl, stride_xb, stride_ab, stride_vb, stride_vt,
              HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
              BT: tl.constexpr, INNER: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """PaTH's backward pass over every pair of blocks: FlashAttention's backward on the dyadic schedule.

    Grid ``(blocks of BT, BH, 2)``, one UT block per program.  Query block ``I`` and key block
    ``J < I`` meet at one level ``l`` (the highest bit where ``I`` and ``J`` differ), where
    ``X[l]`` holds ``I``'s queries carried left to the boundary between the halves and ``J``'s keys
    carried right to it (:func:`pathedu.path._meeting_points`): their logits are the plain product
    ``scale * X[l][I] X[l][J]^T``.  So each level is a set of rectangles of FlashAttention's
    backward with no transition inside, walked by the template's own steps
    (:func:`.flash_attention.dkdv_steps`, :func:`.flash_attention.dq_steps`).  Role 0 (keys of
    block ``J``): for each level where ``J`` is in a left half, the right half's query tiles:
    ``dX[l][J] = scale dz^T X[l][I]``, ``dV`` and the column sums of ``dz``.  Role 1 (queries of
    block ``I``): for each level where ``I`` is in a right half, the left half's key tiles:
    ``dX[l][I] = scale dz X[l][J]`` and the row sums.  The diagonal tile takes its logits from the
    in-block scores ``AD`` (``Ã``, ``(BH, T_pad, BT)``): role 0 adds its ``dV`` and column sums,
    role 1 writes ``dÃ = scale dz`` (``DAD``) and its row sums.  Every row of ``dX`` and ``dÃ`` is
    written by exactly one program.  ``X``, ``DX``: ``(L, BH, T_pad, D)``; ``V``, ``DO``, ``DV``:
    ``(BH, T, Dv)``; ``C``: the cumulative log gate (``BIAS == "loggate"``, PaTH-FoX).
    """
    bh, start, offs_b, X, V, bias_arg = _schedule_program(X, V, C, T, stride_xb, stride_vb, BT, BIAS)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    CHECK_DV: tl.constexpr = BLOCK_DV != HEAD_DV
    DO += bh * stride_vb
    DX += bh * stride_xb
    LSE += bh * T
    DELTA += bh * T
    # The diagonal tile, from the in-block scores (rows: this block's queries, columns: its keys).
    ad = _diagonal_scores(AD, bh, start, stride_ab, T, BT)  # [BT, BT]
    do_b = load_rows(DO, offs_b, offs_dv, stride_vt, T, HEAD_DV, True, CHECK_DV)  # [BT, BDV]
    v_b = load_rows(V, offs_b, offs_dv, stride_vt, T, HEAD_DV, True, CHECK_DV)  # [BT, BDV]
    lse_b = tl.load(LSE + offs_b, mask=offs_b < T, other=0.0)
    delta_b = tl.load(DELTA + offs_b, mask=offs_b < T, other=0.0)
    dp = tl.dot(do_b, tl.trans(v_b), input_precision=PRECISION)  # [BT, BT]
    p, dz = bwd_probs(ad * qk_scale, dp, lse_b[:, None], delta_b[:, None], bias_arg, offs_b[:, None], offs_b[None, :],
                      T, True, BIAS)
    if tl.program_id(2) == 0:
        dv = tl.dot(tl.trans(p.to(do_b.dtype)), do_b, input_precision=PRECISION)  # [BT, BDV]
        col = tl.sum(dz, axis=0)
        XL = X  # level lvl's rows of X and dX
        DXL = DX
        for lvl in range(0, LEVELS):
            lo, hi, left = _key_levels(start, lvl, T, BT)
            whole = lo + ((hi - lo) // INNER) * INNER
            k = load_rows(XL, offs_b, offs_d, HEAD_DIM, T, HEAD_DIM, True, CHECK_D)  # [BT, BD], at the boundary
            dk = tl.zeros([BT, BLOCK_D], dtype=tl.float32)
            dk, dv, col = dkdv_steps(dk, dv, col, k, v_b, XL, DO, LSE, DELTA, bias_arg, offs_b, lo, whole, T,
                                     qk_scale, HEAD_DIM, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER,
                                     False, BIAS, PRECISION, DXL, DBC, False)
            dk, dv, col = dkdv_steps(dk, dv, col, k, v_b, XL, DO, LSE, DELTA, bias_arg, offs_b, whole, hi, T,
                                     qk_scale, HEAD_DIM, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER,
                                     True, BIAS, PRECISION, DXL, DBC, False)
            store_rows(DXL, dk * scale, offs_b, offs_d, HEAD_DIM, tl.where(left, T, 0), HEAD_DIM)
            XL += stride_xl  # the next level (pointer steps: L * BH * T * D can pass 2^31)
            DXL += stride_xl
        store_rows(DV + bh * stride_vb, dv, offs_b, offs_dv, stride_vt, T, HEAD_DV)
        if BIAS != "none":
            tl.store(DBC + bh * T + offs_b, col, mask=offs_b < T)
    else:
        store_rows(DAD + bh * stride_ab + start * BT, dz * scale, tl.arange(0, BT), tl.arange(0, BT), BT, T - start,
                   BT)  # dÃ, [BT, BT]
        row = tl.sum(dz, axis=1)
        XL = X
        DXL = DX
        for lvl in range(0, LEVELS):
            lo, hi, right = _query_levels(start, lvl, BT)
            q = load_rows(XL, offs_b, offs_d, HEAD_DIM, T, HEAD_DIM, True, CHECK_D)  # [BT, BD], at the boundary
            dq = tl.zeros([BT, BLOCK_D], dtype=tl.float32)
            dq, row = dq_steps(dq, row, q, do_b, lse_b, delta_b, XL, V, bias_arg, offs_b, lo, hi, T, qk_scale,
                               HEAD_DIM, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER, False, BIAS,
                               PRECISION)
            store_rows(DXL, dq * scale, offs_b, offs_d, HEAD_DIM, tl.where(right, T, 0), HEAD_DIM)
            XL += stride_xl
            DXL += stride_xl
        if BIAS != "none":
            tl.store(DBR + bh * T + offs_b, row, mask=offs_b < T)


# Backward tiles: the program's block is one UT block (levels are defined on UT blocks); INNER-row
# tiles stream past it, two stages only (as the template's backward, kernels/NOTES_flash.md, "Compiler faults to
# remember").
# No 8-warp config with 64-row tiles: with triton 3.6 on an H100 it gave wrong dk, dw, dbeta at D = 32 in
# bf16 and fp16 and an illegal memory access at Dv = 32, the others right at every probed shape; chosen only
# when it timed fastest, it failed in some runs and not others (NOTES_path.md, "Compiler faults to remember").
_BWD_CONFIGS = [triton.Config({"INNER": i}, num_warps=w, num_stages=2)
                for i, w in [(16, 4), (32, 4), (64, 4)]]  # 16: for block = 16


def _inner_within_block(configs, nargs, **kwargs):
    """Tiles of at most one UT block: a level's half can be one block long, and an unmasked tile longer than the
    half would read the keys (queries) of the program's own side (wrong gradients for D > 64, where BT = 32)."""
    bt = kwargs.get("BT", nargs.get("BT"))
    return [c for c in configs if c.kwargs["INNER"] <= bt and (c.kwargs["INNER"] > 16 or bt == 16)]


_BWD_KEY = ["T", "HEAD_DIM", "HEAD_DV", "BT", "BIAS", "PRECISION"]
_path_bwd_tuned = triton.autotune(_BWD_CONFIGS, key=_BWD_KEY,
                                  prune_configs_by={"early_config_prune": _inner_within_block})(_path_bwd)
# The training forward's key tiles: 32 rows (128 registers offline, four programs per multiprocessor) or 64
# (166, three), two or three stages; the backward's schedule either way.
_DYADIC_CONFIGS = [triton.Config({"INNER": i}, num_warps=4, num_stages=s) for i in (16, 32, 64) for s in (2, 3)]
_path_dyadic_fwd_tuned = triton.autotune(_DYADIC_CONFIGS, key=_BWD_KEY,
                                         prune_configs_by={"early_config_prune": _inner_within_block})(
    _path_dyadic_fwd)


def path_attention(q, k, v, w, beta, *, scale=None, block=None, log_f=None, save_factors=True, _config=None):
    """Causal PaTH attention (preparation pass, then the right-to-left scan), with a backward pass.

    Shapes: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` ->
    ``(..., T, Dv)``; ``D, Dv`` in 16..128; any T.  ``q, k, v`` fp16/bf16/fp32
    (one dtype; the output has it); ``w`` (finite) and ``beta`` (in [0, 2]) are
    used in fp32 whatever their dtype.  ``logit_ij = scale * k_j^T H_{j+1} ... H_i q_i``
    with ``H_s = I - beta_s w_s w_s^T`` (smallest index on the left; ``j = i``: plain
    ``k_i . q_i``); ``scale=None`` means ``D ** -0.5``.  ``block``: the UT block
    (key block) size, 16/32/64/128 (``None``: 64 for ``D <= 64``, else 32).
    ``w`` is used as given (models pass unit vectors).  ``log_f`` ``(..., T)`` (finite,
    <= 0), if given, adds the FoX bias ``sum_{s=j+1..i} log_f[s]`` to every logit, not
    multiplied by ``scale`` (PaTH-FoX, chapter 7).  Every argument is validated
    here (values read once the kernels are queued: :class:`pathedu.checks.checked_after`).

    When autograd wants gradients (of ``q, k, v, w, beta`` or ``log_f``), the output has a ``grad_fn``
    (:class:`_PathAttention`), and the forward runs on the backward's dyadic schedule instead of the scan
    (:func:`_path_dyadic_fwd`), so that the log-sum-exp it saves is that of the logits the backward differentiates:
    the same attention, rounded another way (both within the kernels' error of float64).  ``save_factors``
    (bool, only then): keep the preparation pass's factors, the meeting points and the carries that made them
    from the forward for the backward (fastest: ``(6 + 2 L) * 128`` more bytes per token and head for ``D = 64``,
    blocks of 64 and 16-bit inputs, with ``L = ceil(log2(T / 64))`` levels, T rounded up to a multiple of 128)
    rather than only the output and its log-sum-exp, recomputing the rest (FlashAttention-2's memory; two
    launches more in the backward).

    ``_config`` (for tests and tuning; the scan's keys only without gradients): ``dict(R=..., num_warps=...,
    num_stages=...)`` fixes the scan's tiles (query blocks of ``R * block`` rows, R in 1..MAX_R) instead of
    autotuning; ``update="dense"|"ut"`` picks the form of ``q^ <- P_J q^`` (default: dense while ``D <= 2 block``);
    ``update_dtype`` the dtype of its operands; ``prep_precision`` the preparation pass's product precision (see
    :func:`._pieces.dot`); ``backward=dict(INNER=..., num_warps=...)`` fixes the backward kernel's tiles.
    """
    cfg = dict(_config or {})
    x = prepare_qkv(q, k, v, backward=True)
    n = x.n
    scale = check_scale(scale, n.D)
    w3 = per_token(w, "w", x, extra=(n.D,), backward=True)
    beta3 = per_token(beta, "beta", x, backward=True)
    block = check_block(block, n.D)
    if not isinstance(save_factors, bool):
        raise TypeError(f"`save_factors` must be True or False, got {save_factors!r}")
    update = cfg.pop("update", "dense" if n.D <= 2 * block else "ut")
    if update not in ("dense", "ut"):
        raise ValueError(f"`_config['update']` must be 'dense' or 'ut', got {update!r}")
    if cfg.get("R", 1) not in range(1, MAX_R + 1):
        raise ValueError(f"`_config['R']` must be in 1..{MAX_R}, got {cfg['R']!r}")
    log_f3 = None if log_f is None else per_token(log_f, "log_f", x, backward=True)
    # Read once the kernels are queued: every value is counted by the launch that reads it, the gates by their
    # prefix sums' launch (taken once, in fp32, outside the kernels), w and beta by the preparation pass's first.
    with checked_after() as check:
        c = None if log_f3 is None else cumulative_log_gates(log_f3, "log_f", check)
        bwd_cfg = _backward_tiles(cfg.pop("backward", None), block)
        if wants_grad(x.q, x.k, x.v, w3, beta3, c):
            if cfg:  # the scan's tiles and precisions: a forward to be differentiated does not run the scan
                raise ValueError(f"`_config` keys {sorted(cfg)} tune the scan, which runs only without gradients "
                                 "(a forward to be differentiated runs on the backward's schedule); pass `backward`")
            return x.result(_PathAttention.apply(x.q, x.k, x.v, w3, beta3, c, x, scale, block, save_factors,
                                                 bwd_cfg, check))
        return x.result(_path_launch(x, w3, beta3, scale, block, update, cfg, c, check=check))


def _ten_bit(input_dtype):
    """Where PaTH keeps a factor that its products read with 10 mantissa bits (rounded tf32 for 16-bit inputs):
    fp16, which holds those bits in half the bytes, for 16-bit inputs; fp32 for fp32 inputs.  The carried query's
    updates, the backward's preparation factors and its meeting-point rows."""
    return torch.float32 if input_dtype == torch.float32 else torch.float16


def _prepare(x: Flat, w3, beta3, block: int, *, update: str = "dense", update_dtype=None, precision=None,
             check=None) -> Prepared:
    """PaTH's preparation pass on validated inputs.  Logits in the input dtype; the carried query's
    updates in ``update_dtype`` (default fp16, fp32 for fp32 inputs); ``precision``: the pass's
    products (default :func:`.ut_prepare.prep_precision`); ``check``: where the pass's counts of the
    entries of ``w`` and ``beta`` that break their conditions go (:class:`.ut_prepare.Prepared`), or None."""
    if update_dtype is None:
        update_dtype = _ten_bit(x.dtype)
    return Prepared(x.q, x.k, w3, beta3, x.n.T, block, q_dtype=update_dtype, k_dtype=x.dtype,
                    update_dtype=update_dtype, norm_q=True, store_ut=update == "ut",
                    precision=prep_precision(x.dtype) if precision is None else precision, check=check)


def _path_launch(x: Flat, w3, beta3, scale: float, block: int, update: str, cfg: dict, c=None,
                 lse=None, prep=None, check=None) -> torch.Tensor:
    """Launch on validated inputs: the preparation pass, then the scan.  Returns ``(BH, T, Dv)``.
    ``c``: the fp32 ``(BH, T)`` cumulative log gate (PaTH-FoX) or None.  ``lse``: an fp32 ``(BH, T)``
    tensor that receives each row's log-sum-exp (log2 units), for the backward pass.  ``prep``: the
    preparation pass already made by :func:`_prepare` with the same ``update`` (a caller that reads its
    factors too, e.g. :mod:`pathedu.distributed`), else it is made here, counting the bad entries of ``w`` and
    ``beta`` for ``check`` (a :class:`pathedu.checks.checked_after`) when one is given."""
    n = x.n
    out = x.new_output(n.Dv)
    if x.empty_input:
        return out
    if prep is None:
        prep = _prepare(x, w3, beta3, block, update=update, update_dtype=cfg.pop("update_dtype", None),
                        precision=cfg.pop("prep_precision", None), check=check)
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv), BLOCK_N=block,
                UPDATE=update, PRECISION=dot_precision(x.dtype), GATED=c is not None, STORE_LSE=lse is not None)
    dummy = prep.qn  # a pointer for the arguments a launch does not read
    args = dict(
        QT=prep.qt, QN=prep.qn, KT=prep.kt, AD=prep.ad, GM=prep.g, WC=prep.wc, NU=prep.nu, V=x.v, O=out,
        C=dummy if c is None else c, LSE=dummy if lse is None else lse,
        T=n.T, qk_scale=scale * LOG2E,
        stride_nb=prep.qn.stride(0), stride_gb=prep.g.stride(0), stride_gj=prep.g.stride(1),
        **row_strides(p=prep.qt, a=prep.ad, v=x.v, o=out),
    )
    # Fixed tiles: in the interpreter, when the caller fixes them, and for fp32 inputs (exact
    # dots: a precision path whose compile time would dominate autotuning, as in the template).
    if cfg or interpreting() or meta["PRECISION"] == "ieee":
        cfg = {"R": 1, "num_warps": 4, "num_stages": 1 if interpreting() else 2, **cfg}
        _path_fwd[(triton.cdiv(n.T, cfg["R"] * block), x.BH)](**args, **cfg, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["R"] * block), x.BH)  # noqa: E731
        _path_fwd_tuned[grid](**args, **meta)
    return out


def _bwd_prepare(x: Flat, w3, beta3, block: int, check=None) -> Prepared:
    """The preparation pass of a forward to be differentiated: the scan's, with unscaled ``q~, k~`` and ``G`` in
    fp32 for fp32 inputs and in fp16 for 16-bit ones (the carries' products round their operands to 10 mantissa
    bits either way: :func:`.path_carry._carry_precision`), and the blocks' inverses kept
    (:func:`.ut_prepare.ut_prepare_backward` reads them).  ``check``: as :func:`_prepare`'s."""
    dtype = _ten_bit(x.dtype)
    return Prepared(x.q, x.k, w3, beta3, x.n.T, block, q_dtype=dtype, k_dtype=dtype, update_dtype=dtype,
                    keep_inverse=True, precision=prep_precision(x.dtype), check=check)


def _dyadic_meta(x: Flat, c, block: int) -> dict:
    """The compile-time arguments that :func:`_path_dyadic_fwd` and :func:`_path_bwd` share."""
    n = x.n
    return dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv), BT=block,
                BIAS="none" if c is None else "loggate", PRECISION=dot_precision(x.dtype))


def _schedule_launch(plain, tuned, grid, args, meta: dict, block: int, fixed=None) -> None:
    """Launch a kernel of the dyadic schedule (:func:`_path_dyadic_fwd`, :func:`_path_bwd`): with the ``fixed``
    tiles when given (``dict(INNER=..., num_warps=...)``, two stages unless it says), whole blocks in the
    interpreter, 32-row tiles for fp32 inputs (exact products, whose compile time would dominate autotuning), else
    autotuned (``tuned``)."""
    if fixed is not None:
        plain[grid](**args, **{"num_stages": 2, **fixed}, **meta)
    elif interpreting():
        plain[grid](**args, INNER=block, **meta)
    elif meta["PRECISION"] == "ieee":
        plain[grid](**args, INNER=min(32, block), num_warps=4, num_stages=2, **meta)
    else:
        tuned[grid](**args, **meta)


def _dyadic_forward(x: Flat, c, scale: float, block: int, prep: Prepared, X):
    """:func:`_path_dyadic_fwd`: the output ``(BH, T, Dv)`` and its log-sum-exp (fp32 ``(BH, T)``, log2 units) from
    the preparation pass of :func:`_bwd_prepare` and the meeting points ``X`` of
    :func:`.path_carry.carry_forward`; its tiles as :func:`_schedule_launch` picks them."""
    n = x.n
    out = x.new_output(n.Dv)
    lse = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
    levels = X.shape[0]
    meta = _dyadic_meta(x, c, block)
    args = dict(
        X=X, AD=prep.ad, V=x.v, O=out, C=lse if c is None else c, LSE=lse,
        T=n.T, LEVELS=levels, qk_scale=scale * LOG2E,
        stride_xl=X.stride(0) if levels else 0, stride_xb=X.stride(1) if levels else 0, stride_ab=prep.ad.stride(0),
        **row_strides(v=x.v, o=out),
    )
    _schedule_launch(_path_dyadic_fwd, _path_dyadic_fwd_tuned, (triton.cdiv(n.T, block), x.BH), args, meta, block)
    return out, lse


def _bwd_kernel(x: Flat, c, do, lse, delta, scale: float, block: int, prep: Prepared, X, _config=None):
    """One launch of :func:`_path_bwd`, with the forward's log-sum-exp ``lse`` (:func:`_dyadic_forward`) and
    ``delta = dO . O`` (fp32 ``(BH, T)`` each): ``dX`` (fp32, shaped like ``X``), ``dÃ`` (fp32, like ``prep.ad``),
    ``dv`` and the row and column sums of ``dz`` (None without a gate)."""
    n = x.n
    levels = X.shape[0]
    # dX (L * BH * T * D values, the backward's largest tensor) in fp32.  bf16 would halve its bytes (the
    # reversed carries read it once) and keeps fp32's exponent range, but measured on the H100 it made PaTH's bf16
    # gradients 7-17% less accurate (w and beta 2.5e-3 and 2.4e-3 from float64 instead of 2.2e-3 and 2.0e-3) for
    # at most 2% of the time (kernels/NOTES_path.md, "dX in fp32").  Every row before T is written by exactly one
    # program of _path_bwd at every level (a block is in a left or a right half); only the rows past T, which
    # nothing writes and the reversed carries read as whole blocks, are zeroed here.
    dX = torch.empty(X.shape, dtype=torch.float32, device=X.device)
    dX[:, :, n.T:].zero_()
    dad = torch.empty_like(prep.ad)
    dad[:, n.T:].zero_()
    dv = torch.empty_like(x.v)
    rows = cols = None
    if c is not None:
        rows = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
        cols = torch.empty_like(rows)
    dummy = delta
    args = dict(
        X=X, AD=prep.ad, V=x.v, DO=do, LSE=lse, DELTA=delta, C=dummy if c is None else c, DX=dX, DAD=dad, DV=dv,
        DBR=dummy if rows is None else rows, DBC=dummy if cols is None else cols,
        T=n.T, LEVELS=levels, qk_scale=scale * LOG2E, scale=scale,
        stride_xl=X.stride(0) if levels else 0, stride_xb=X.stride(1) if levels else 0, stride_ab=prep.ad.stride(0),
        **row_strides(v=x.v),
    )
    meta = _dyadic_meta(x, c, block)
    _schedule_launch(_path_bwd, _path_bwd_tuned, (triton.cdiv(n.T, block), x.BH, 2), args, meta, block, _config)
    return dX, dad, dv, rows, cols


# The meeting-point rows: fp32 for fp32 inputs, fp16 for 16-bit ones.  A trained model's logits reach hundreds (log2
# units), where a row rounded to bf16 moves a logit by tenths and a probability by tens of percent; fp16 keeps the
# 10 mantissa bits of the tf32 products that read fp32 rows, in half their bytes and at the tensor cores' full
# rate (kernels/NOTES_path.md, "Meeting points in fp16, gradient products in dO's dtype").  The rows are carried by reflections (norm <= 1), so they stay within
# the queries' and keys' own range.  The gradient products run in dO's dtype (flash_attention.dkdv_steps): bf16
# for bf16 inputs; for fp16 inputs fp16, as in any fp16 attention backward (train with a scaled loss).
# An override for every input dtype (meeting_point_dtype); None: the rule above.
_BWD_X_DTYPE = None


def _backward_tiles(cfg, block: int):
    """``_config['backward']`` checked where the call is made (None passes): a dict of launch options whose inner
    tiles (``INNER``) are at most one UT block (:func:`_inner_within_block` says why)."""
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise TypeError(f"`_config['backward']` must be a dict, got {type(cfg).__name__}")
    if cfg.get("INNER", block) > block:
        raise ValueError(f"`_config['backward']['INNER']` must be at most the block ({block}), got {cfg['INNER']}")
    return cfg


def _stored_x_dtype(input_dtype):
    """The dtype the backward keeps its meeting-point rows in, for inputs of ``input_dtype``."""
    return _ten_bit(input_dtype) if _BWD_X_DTYPE is None else _BWD_X_DTYPE


@contextlib.contextmanager
def meeting_point_dtype(dtype):
    """Within the block, the backward keeps its meeting-point rows in ``dtype`` whatever the inputs' (None: the
    default of :func:`_stored_x_dtype`): for measuring the alternatives (``pathedu.bench.parts``, the gradient
    probe)."""
    global _BWD_X_DTYPE
    saved, _BWD_X_DTYPE = _BWD_X_DTYPE, dtype
    try:
        yield
    finally:
        _BWD_X_DTYPE = saved


def _path_train_forward(x: Flat, w3, beta3, c, scale: float, block: int, check=None, keep_carries=True):
    """A forward to be differentiated, on validated inputs: the preparation pass of :func:`_bwd_prepare`, the
    carries to the meeting points (:func:`.path_carry.carry_forward`) and :func:`_path_dyadic_fwd`.  Returns
    ``out, lse, prep, X, C`` (``out``: ``(BH, T, Dv)``; ``C``: the carries themselves, or None without
    ``keep_carries``)."""
    prep = _bwd_prepare(x, w3, beta3, block, check)
    X, C = carry_forward(prep.qt, prep.kt, prep.g, block, _stored_x_dtype(x.dtype), keep_carries)
    out, lse = _dyadic_forward(x, c, scale, block, prep, X)
    return out, lse, prep, X, C


def _path_bwd_launch(x: Flat, w3, beta3, c, out, lse, do, scale: float, block: int, x_dtype, prep=None, X=None,
                     C=None, _config=None):
    """PaTH's backward pass; ``do``: ``(BH, T, Dv)``; ``out``, ``lse``: what :func:`_path_train_forward` returned,
    and its ``prep``, ``X`` and ``C`` if the forward kept them (else they are made again, bit for bit the same: the
    launches are deterministic; ``x_dtype``: the dtype the forward's meeting points had).

    1. (when not kept) the preparation pass (:func:`_bwd_prepare`): ``q~, k~, G`` (fp16 for 16-bit inputs), ``Ã``
       and each block's inverse; the carries to the meeting points and the carries themselves
       (:func:`.path_carry.carry_forward`);
    2. ``delta = dO . O`` (:func:`.flash_attention.bwd_delta`), then FlashAttention's backward on every pair of
       blocks (:func:`_path_bwd`), with the forward's log-sum-exp: ``dX``, ``dÃ``, ``dV`` and the gate's row and
       column sums;
    3. the reversed carries (:func:`.path_carry.carry_backward`, reading the carries): ``dq~, dk~, dG``;
    4. the preparation pass's backward (:func:`.ut_prepare.ut_prepare_backward`): ``dq, dk, dw, dbeta``.

    Returns ``dq, dk, dv`` (compute dtype), ``dw, dbeta`` (fp32) and ``dc`` (None without a gate).
    """
    do = do.to(x.dtype).contiguous()
    if prep is None:
        prep = _bwd_prepare(x, w3, beta3, block)
        X, C = carry_forward(prep.qt, prep.kt, prep.g, block, x_dtype, keep_carries=True)
    delta = bwd_delta(out, do)
    dX, dad, dv, rows, cols = _bwd_kernel(x, c, do, lse, delta, scale, block, prep, X, _config)
    del X
    dqt, dkt, dg = carry_backward(prep.qt, prep.kt, prep.g, block, dX, x.dtype, C)
    del dX, C
    dq, dk, dw, dbeta = ut_prepare_backward(x.q, x.k, w3, beta3, prep, dqt, dkt, dad, dg)
    return dq, dk, dv, dw, dbeta, None if c is None else rows - cols


class _PathAttention(torch.autograd.Function):
    """PaTH attention with a backward pass: :func:`_path_train_forward`, then :func:`_path_bwd_launch`.

    Inputs: the flattened ``q, k, v`` of a :class:`._launch.Flat` (``flat``), fp32 ``w3, beta3`` and the
    cumulative log gate ``c`` (or None), then ``scale, block, save_factors``, the backward's tiles (or None) and
    the value check that receives the counts of bad ``w`` and ``beta``.  Saves the inputs, the output and its
    log-sum-exp, and with ``save_factors`` the preparation pass's factors (:meth:`.ut_prepare.Prepared.factors`),
    the meeting points and the carries that made them (:func:`.path_carry.carry_forward`), all through
    ``save_for_backward`` (so that saved-tensor hooks see every byte).  ``dc = rows - cols``: ``c_i`` enters row
    ``i``'s logits, ``-c_j`` column ``j``'s.
    """

    @staticmethod
    def forward(ctx, q3, k3, v3, w3, beta3, c, flat, scale, block, save_factors, bwd_cfg, check):
        x = Flat(flat.n, q3, k3, v3, flat.dtype, flat.like)
        ctx.flat, ctx.scale, ctx.block, ctx.bwd_config = flat, scale, block, bwd_cfg
        ctx.saved_factors = False
        if x.empty_input:
            ctx.save_for_backward(q3, k3, v3, w3, beta3, c)
            return x.new_output(flat.n.Dv)
        out, lse, prep, X, C = _path_train_forward(x, w3, beta3, c, scale, block, check, keep_carries=save_factors)
        ctx.saved_factors, ctx.x_dtype = save_factors, X.dtype
        factors = prep.factors() + (X, C) if save_factors else ()
        ctx.save_for_backward(q3, k3, v3, w3, beta3, c, out, lse, *factors)
        return out

    @staticmethod
    def backward(ctx, do):
        q3, k3, v3, w3, beta3, c, *rest = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        if x.empty_input:
            return (torch.zeros_like(q3), torch.zeros_like(k3), torch.zeros_like(v3), torch.zeros_like(w3),
                    torch.zeros_like(beta3), None if c is None else torch.zeros_like(c)) + (None,) * 6
        out, lse, *factors = rest
        prep = X = C = None
        if ctx.saved_factors:
            *kept, X, C = factors
            prep = Prepared.from_factors(q3, k3, w3, beta3, x.n.T, ctx.block, *kept,
                                         precision=prep_precision(x.dtype))
        grads = _path_bwd_launch(x, w3, beta3, c, out, lse, do, ctx.scale, ctx.block, ctx.x_dtype, prep, X, C,
                                 ctx.bwd_config)
        return grads + (None,) * 6
