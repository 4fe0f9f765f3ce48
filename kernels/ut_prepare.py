r"""The UT preparation pass, shared by PaTH attention (:mod:`.path_attention`) and the chunked
Householder RNN (the ``"householder"`` gate of :mod:`.linear_attention`, driven by
:mod:`.delta_rule`), and DeltaNet's lighter WY pass (:func:`_wy_prepare`, :class:`WYPrepared`: only
``W = A K`` and ``U~ = A V``, for the ``"delta"`` gate).

For every block of ``BT`` tokens ``[s, e]``, all blocks in parallel, from the block's UT
factor ``A = (I + N)^{-1} D_beta``, ``N = strictLower(D_beta W W^T)`` (``BT x BT``,
lower; ``W`` holds the block's ``w`` as rows; ``H_t = I - beta_t w_t w_t^T``), it writes

* ``q~_i = H_s ... H_i q_i`` (boundary-adjusted queries), as rows
  ``Q~ = Q - (lower(Q W^T) A) W`` (optionally scaled to unit length, norms kept apart);
* ``k~_j = H_e ... H_{j+1} k_j`` (boundary-adjusted keys), as rows
  ``K~ = K - (A strictLower(W K^T))^T W``;
* the in-block scores ``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` (j <= i) by the masked UT form
  ``Ã = lower(Q K^T) - lower(Q W^T) A strictLower(W K^T)``;
* the block's whole transition ``P_J = H_s ... H_e = I - W^T A^T W`` as one dense
  ``D x D`` matrix ``G_J = P_J^T - I = -W^T A W`` (optionally also the compact factors
  ``W`` and ``-U = -A W``).

The triangular inverse is the only sequential part.  :func:`_ut_diag_inverse` solves the
``SUB x SUB`` (16 x 16) diagonal blocks of ``I + N`` by forward substitution (the Gram products
on the tensor cores, the substitution in exact fp32, small tiles, many programs per multiprocessor), and :func:`_ut_prepare` merges them into
the ``BT x BT`` inverse with two matrix products per level (block forward substitution:
stable for every ``beta`` in [0, 2], also for reflections of nearly parallel ``w``) before
everything else.  Products are :func:`._pieces.dot`: for 16-bit inputs operands with 10 mantissa
bits (fp16 in :func:`_ut_prepare`, the rows of ``q`` and ``k`` scaled by powers of two into its range, and in
:func:`_wy_prepare`, each block conjugated into it: :func:`main_pass_precision`; fp16 in the backward too, each tile
of gradients scaled: :func:`backward_precision`; tf32 rounded to nearest elsewhere), three tf32 products ("x3") for
fp32 inputs on a GPU, exact fp32 in the interpreter (:func:`prep_precision`).  :class:`Prepared`
runs both launches.

Non-finite inputs.  Every mask is a select (``tl.where``), never a multiply by 0, so a NaN
or inf in ``q_i`` or ``k_j`` reaches only the rows and columns that use it (``q~_i``,
``k~_j``, row ``i`` and column ``j`` of Ã on and below the diagonal).  DeltaNet's
transitions are built from ``k`` itself (``w = k``: :func:`_ut_diag_inverse` with ``W_IS_K``
and :func:`_wy_prepare`); there a non-finite ``k_j`` would poison the whole inverse through
``0 * NaN`` inside the products, so its non-finite entries are replaced by 0 in the
transitions only (``H_j`` is then wrong, but every output from position ``j`` on already
sees the non-finite ``k_j``: the chunk loop's in-chunk scores ``q_i . k_j`` and its state).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import (TRANSITION_TOL, check_positive_int, finite_condition, log_gate_condition, range_condition,
                      transition_condition)
from ._launch import dot_precision, interpreting, keeping_nans, next_pow2, row_strides
from ._pieces import (dot, dot_ready, finite_abs, finite_or_zero, input_dot, load_rows, pow2, quiet_for,
                      quiet_fp32, rn, scaled, store_rows)

MAX_R = 2  # a query block holds at most this many UT blocks; prepared tensors are padded to MAX_R * block rows
SUB = tl.constexpr(16)  # the triangular inverse is solved row by row on SUB x SUB diagonal blocks, then merged
BETA_WHY = " (H = I - beta w w^T)"  # the reason given when `beta` is outside [0, 2]
COUNTED = ("w", "beta", "log_f", "transition")  # what _ut_diag_inverse counts, in its order (_diag_block_n)
COUNTS = 4  # _diag_block_n's counts (a power of two for tl.arange)
TRANSITION_MAX = tl.constexpr(2.0 + TRANSITION_TOL)  # beta_t |w_t|^2 at most (pathedu.checks.transition_condition)


def prep_precision(dtype) -> str:
    """Product precision of the preparation pass: tf32 (rounded to nearest) for 16-bit inputs,
    ``"x3"`` for fp32 inputs on a GPU, exact ``"ieee"`` in the interpreter."""
    p = dot_precision(dtype)
    return "x3" if p == "ieee" and not interpreting() else p


def main_pass_precision(precision: str) -> str:
    """The products of :func:`_ut_prepare` for a pass of ``precision`` (:func:`prep_precision`): where the pass
    would round fp32 operands to tf32 it converts them to fp16, which keeps the same 10 mantissa bits (so the
    same numbers) in half the registers and multiplies at twice the tensor cores' rate: 0.65 ms against 1.02 for
    the pass at T = 1024, B = H = 32, D = 64 on an H200 (``NOTES_path.md``, "fp16 products in the preparation
    pass").  What it multiplies
    stays inside fp16's range: the factors of reflections (unit ``w``, as for the scan's fp16 ``G``) and the rows
    of ``q`` and ``k`` scaled by powers of two (:func:`_pow2_rows`).  DeltaNet's WY pass (:func:`_wy_prepare`)
    takes the same precision, its keys and values brought into range by the block's conjugation (0.48 ms against
    0.67 at T = 1024; ``NOTES_linear.md``, "fp16 products in the WY pass").  Other precisions are kept."""
    return "fp16" if precision == "tf32" else precision


def backward_precision(precision: str, head_dim: int, *, fp16: bool = True) -> str:
    """The products of the UT backward (:func:`ut_prepare_backward`) for a pass of ``precision`` and head dim
    ``head_dim``: fp16 where the pass multiplies in fp16 (:func:`main_pass_precision`), every tile of gradients (and
    of ``q``, ``k``) scaled into its range by a power of two per tile (:func:`._pieces.scaled`), for ``D > 32``;
    otherwise the version that keeps every NaN of the gradients' arithmetic (:func:`._launch.keeping_nans`:
    ``"tf32n"``, ``"x3n"`` for fp32 inputs, ``"ieee"`` in the interpreter).  With ``D <= 32`` (tiles of 16 or 32
    columns) Triton 3.6 made fp16 versions of :func:`_ut_bwd_w_inverse` that fault on the H200 (illegal address, at
    some T and warps only; ``NOTES_path.md``, "Compiler faults to remember"); such heads are small, and tf32 costs
    them little.  ``fp16=False``: never fp16 (the caller's tiles cannot take it: factors that are not fp16, or
    gradient tiles whose entries span more than one scale brings into fp16's range)."""
    p = main_pass_precision(precision)
    return keeping_nans(precision if p == "fp16" and (head_dim <= 32 or not fp16) else p)


@triton.jit
def _diag_block_n(K, W, BETA, LOG_F, T, start, bh, stride_kb, stride_kt, stride_wb, stride_wt,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, W_IS_K: tl.constexpr, GATED: tl.constexpr,
                  PRECISION: tl.constexpr):
    """``(N_bb, bad)``: ``N_bb``, ``[SUB, SUB]`` fp32, the strictly lower ``D_beta W W^T`` of the ``SUB x SUB``
    diagonal block at rows ``[start, start + SUB)``, or with ``W_IS_K`` (DeltaNet's WY pass) the column form
    ``strictLower(K K^T) D_beta`` (never gated: :func:`_wy_prepare` says why); ``bad``, ``[4]`` fp32, how many of
    the values read break their condition, in :data:`COUNTED`'s order: ``w`` not finite (0 with ``W_IS_K``, whose
    non-finite entries are dropped), ``beta`` outside [0, 2], ``log_f`` outside (-inf, 0] (read only with
    ``GATED``, to be counted; else 0), and the rows whose transition expands, ``beta_t |w_t|^2`` (``|w_t|^2``:
    the Gram matrix's diagonal) above :data:`TRANSITION_MAX` (0 with ``W_IS_K``: not checked for DeltaNet).  NaN breaks every
    condition (a comparison with NaN is false); padding loads as 0 and is not counted.

    The Gram matrix runs on the tensor cores: for 16-bit ``w`` as a plain product (two 16-bit numbers
    multiply exactly in fp32, and the sums are fp32), for fp32 ``w`` as :func:`._pieces.dot` in
    ``PRECISION`` (``"x3"`` on a GPU: about fp32 accuracy); in column slices of at most 64 (registers)."""
    rows = tl.arange(0, SUB)
    if W_IS_K:
        W = K
        stride_wb = stride_kb
        stride_wt = stride_kt
    p_w = W + bh * stride_wb + start * stride_wt
    D_SLICE: tl.constexpr = 64 if BLOCK_D > 64 else BLOCK_D
    gram = tl.zeros([SUB, SUB], dtype=tl.float32)
    bad_w = 0.0
    for d0 in tl.static_range(0, BLOCK_D, D_SLICE):
        w = load_rows(p_w + d0, rows, tl.arange(0, D_SLICE), stride_wt, T - start, HEAD_DIM - d0,
                      True, BLOCK_D != HEAD_DIM)  # [SUB, D_SLICE], in w's dtype
        if W_IS_K:
            w = finite_or_zero(w)  # DeltaNet's w = k: see the module docstring
        else:
            bad_w += tl.sum(tl.where(tl.abs(w) < float("inf"), 0.0, 1.0))
        if W.dtype.element_ty == tl.float32:
            gram += dot(w, tl.trans(w), PRECISION)  # [SUB, SUB]
        else:
            gram = tl.dot(w, tl.trans(w), acc=gram)  # [SUB, SUB]
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < T - start, other=0.0)  # [SUB]
    bad_b = tl.sum(tl.where((beta >= 0.0) & (beta <= 2.0), 0.0, 1.0))
    lower = rows[:, None] > rows[None, :]
    bad_f = 0.0
    if GATED:
        log_f = tl.load(LOG_F + bh * T + start + rows, mask=rows < T - start, other=0.0)  # [SUB]
        bad_f = tl.sum(tl.where((log_f <= 0.0) & (log_f > float("-inf")), 0.0, 1.0))
    bad_h = 0.0
    if not W_IS_K:  # |w_t|^2 is the Gram matrix's diagonal
        norm2 = tl.sum(tl.where(rows[:, None] == rows[None, :], gram, 0.0), axis=1)  # [SUB]
        off = tl.where(beta * norm2 <= TRANSITION_MAX, 0.0, 1.0)  # NaN: off
        bad_h = tl.sum(tl.where(rows < T - start, off, 0.0))
    which = tl.arange(0, 4)
    bad = tl.where(which == 0, bad_w, tl.where(which == 1, bad_b, tl.where(which == 2, bad_f, bad_h)))  # [4]
    if W_IS_K:  # DeltaNet's WY pass inverts the column form I + strictLower(K K^T) D_beta (_wy_prepare says why)
        return tl.where(lower, gram * beta[None, :], 0.0), bad
    else:
        return tl.where(lower, gram * beta[:, None], 0.0), bad


@triton.jit
def _unit_lower_inverse(n, p_tile, stride, rows, BT: tl.constexpr):
    """``(I + N)^{-1}`` (``BT x BT``) for a strictly lower ``N``, by forward substitution: row ``i`` of the inverse
    ``X`` is ``e_i - sum_{j<i} N_ij X_j``, and rows ``j < i`` are final when row ``i`` is formed.  Exact fp32
    arithmetic, stable for every ``beta`` in [0, 2], but ``BT - 1`` dependent steps: used on ``SUB x SUB``
    blocks only.  Each step needs row ``N_i`` as a vector along the rows of ``X``: ``N`` is written to the tile
    at ``p_tile`` (row stride ``stride``, memory the caller overwrites afterwards) and each row is read back in
    that layout, so that a step costs one reduction, not two (cutting the row out of the tile in registers
    is a second reduction; with the Gram matrix on the FMA units as well, that kernel took 4.7 times as long at
    T = 8192: ``NOTES_path.md``, "The triangular inverse")."""
    p = p_tile + rows[:, None] * stride + rows[None, :]  # [BT, BT]
    tl.store(p, n)
    tl.debug_barrier()  # every row of N is in memory before any lane reads it back
    x = (rows[:, None] == rows[None, :]).to(tl.float32)  # [BT, BT]
    for i in tl.static_range(1, BT):
        n_i = tl.load(p_tile + i * stride + rows)  # [BT]: n_i[j] = N[i, j], zero for j >= i
        x = tl.where(rows[:, None] == i, x - tl.sum(n_i[:, None] * x, axis=0)[None, :], x)
    tl.debug_barrier()  # every lane has read N before the caller overwrites it
    return x


@triton.jit
def _ut_diag_inverse(K, W, BETA, LOG_F, X, BAD, T, stride_kb, stride_kt, stride_wb, stride_wt, stride_xb, stride_xt,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, W_IS_K: tl.constexpr,
                     GATED: tl.constexpr, COUNT: tl.constexpr, PRECISION: tl.constexpr):
    """First half of the triangular inverse: ``(I + N_bb)^{-1}`` for one ``SUB x SUB`` diagonal block.

    ``N = strictLower(D_beta W W^T)`` of the enclosing ``BT`` block, or ``strictLower(K K^T) D_beta`` with
    ``W_IS_K`` (:func:`_diag_block_n`; ``GATED``: Gated DeltaNet's log gates ``LOG_F``, ``(BH, T)`` fp32, are read
    and counted, not applied).  The block's inverse (:func:`_unit_lower_inverse`) goes to rows
    ``[s, s + SUB)``, columns ``[c, c + SUB)`` of ``X`` (``(BH, T_pad, BT)``, ``c`` = the block's offset inside
    its ``BT`` block); the rest of ``X`` is left alone.  One warp per program, so that many programs share
    each multiprocessor (64-72 registers compiled for sm_90: 28-32 programs, the hardware's limit being 32).

    ``COUNT``: the program adds how many of the values it read break their condition (``w``, ``beta``, ``log_f``:
    :func:`_diag_block_n`) to ``BAD`` (``(8,)`` fp32, zeroed by the caller; entries ``2c`` and ``2c + 1`` for
    condition ``c``, so that each pair reads as a condition's two extremes; an atomic add only where one is
    broken): the value checks of the arguments this launch reads anyway, at no cost of their own (a separate
    reduction of ``w`` reads it once more: 95 us of PaTH's 1.98 ms at T = 1024 on an H100; ``NOTES_path.md``,
    "Value checks where the values are read")."""
    start = tl.program_id(0) * SUB
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, SUB)
    n, bad = _diag_block_n(K, W, BETA, LOG_F, T, start, bh, stride_kb, stride_kt, stride_wb, stride_wt, HEAD_DIM,
                           BLOCK_D, W_IS_K, GATED, PRECISION)  # [SUB, SUB], [4]
    p_x = X + bh * stride_xb + start * stride_xt + start % BT  # this block's [SUB, SUB] tile of X
    x = _unit_lower_inverse(n, p_x, stride_xt, rows, SUB)
    tl.store(p_x + rows[:, None] * stride_xt + rows[None, :], x)
    if COUNT:
        if tl.max(bad, axis=0) > 0:  # only on bad input: good input makes no atomics
            two = tl.arange(0, 8)  # entry e of BAD receives bad[e // 2]
            tl.atomic_add(BAD + two, tl.sum(tl.where(two[:, None] // 2 == tl.arange(0, 4)[None, :], bad[None, :],
                                                     0.0), axis=1))


@triton.jit
def _merge(x, n, rows, SIZE: tl.constexpr, PRECISION: tl.constexpr):
    """One level of block forward substitution: ``x`` inverts ``I + N`` on blocks of ``SIZE / 2``;
    the result inverts it on blocks of ``SIZE``.  For each pair of halves (1, 2) the new
    block is ``X_21 = -X_22 N_21 X_11``, i.e. ``x - x N_l x`` with ``N_l`` = ``N`` restricted
    to the (2, 1) blocks (every other product term vanishes, ``x`` being block-diagonal)."""
    same = rows[:, None] // SIZE == rows[None, :] // SIZE
    couple = same & (rows[:, None] // (SIZE // 2) != rows[None, :] // (SIZE // 2))
    return x - dot(x, dot(tl.where(couple, n, 0.0), x, PRECISION), PRECISION)


@triton.jit
def _diagonal_blocks(p_ad, rows):
    """The ``SUB x SUB`` diagonal inverses at ``p_ad`` (a ``[BT, BT]`` tile of pointers, as
    :func:`_ut_diag_inverse` left them) as one block-diagonal ``[BT, BT]`` fp32 tile (zero elsewhere)."""
    return tl.load(p_ad, mask=rows[:, None] // SUB == rows[None, :] // SUB, other=0.0)


@triton.jit
def _merged_inverse(x, n, rows, BT: tl.constexpr, PRECISION: tl.constexpr):
    """``(I + N)^{-1}`` (``BT x BT``) from the block-diagonal tile ``x`` of the ``SUB x SUB`` diagonal inverses
    (:func:`_diagonal_blocks`) and the strictly lower ``N``: one :func:`_merge` per level."""
    if BT >= 32:
        x = _merge(x, n, rows, 32, PRECISION)
    if BT >= 64:
        x = _merge(x, n, rows, 64, PRECISION)
    if BT >= 128:
        x = _merge(x, n, rows, 128, PRECISION)
    return x


@triton.jit
def _ut_tile_as_is(ptr, bh, start, stride_b, stride_t, T, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BT: tl.constexpr):
    """Rows ``[start, start + BT)`` of head ``bh`` of a ``(BH, T, D)`` tensor: a ``[BT, BD]`` tile in the tensor's
    dtype (rows past ``T`` and columns past ``D`` load as 0).  A 16-bit tile takes half the registers of an fp32
    one: the preparation pass and its backward keep ``q`` and ``k`` this way and widen them where a product uses
    them (a 16-bit value is a tf32 value: the products see the same numbers; in the backward this cut the spills and
    3% of its time: ``NOTES_path.md``, "The UT backward in four kernels")."""
    return load_rows(ptr + bh * stride_b + start * stride_t, tl.arange(0, BT), tl.arange(0, BLOCK_D), stride_t,
                     T - start, HEAD_DIM, True, BLOCK_D != HEAD_DIM)


@triton.jit
def _ut_tile(ptr, bh, start, stride_b, stride_t, T, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             BT: tl.constexpr):
    """:func:`_ut_tile_as_is` in fp32."""
    return _ut_tile_as_is(ptr, bh, start, stride_b, stride_t, T, HEAD_DIM, BLOCK_D, BT).to(tl.float32)


@triton.jit
def _pow2_rows(x, SCALE: tl.constexpr):
    """``(s, 1 / s)``, ``[BT]`` fp32: for each row of the tile ``x``, the power of two (:func:`pow2`) that brings the
    row's largest finite ``|entry|`` into [1, 2).  Scaled so, a bf16 row converts to fp16 without overflow, and
    exactly down to entries ``2^-17`` of its largest (below that, fp16's subnormals keep fewer bits).  Ones without
    ``SCALE``."""
    if SCALE:
        return pow2(tl.max(finite_abs(x), axis=1))
    else:
        ones = tl.full([x.shape[0]], 1.0, tl.float32)
        return ones, ones


@triton.jit
def _ut_sq(ptr, bh, start, stride_b, stride_t, BT: tl.constexpr):
    """Pointers to the ``[BT, BT]`` tile of block rows ``[start, start + BT)`` of head ``bh`` (``AD``'s layout),
    made where they are used: a tile of 64-bit pointers kept between a load and a store costs registers."""
    rows = tl.arange(0, BT)
    return ptr + bh * stride_b + start * stride_t + (rows[:, None] * stride_t + rows[None, :])


@triton.jit
def _ut_a(INV, BETA, bh, start, T, stride_ab, stride_at, BT: tl.constexpr):
    """The block's ``A = (I + N)^{-1} D_beta`` (``[BT, BT]``) from the inverse kept in ``INV`` (``AD``'s layout)."""
    rows = tl.arange(0, BT)
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < T - start, other=0.0)  # [BT]
    return tl.load(_ut_sq(INV, bh, start, stride_ab, stride_at, BT)) * beta[None, :]


@triton.jit
def _ut_rd_load(ptr, bh, start, stride_b, stride_t, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BT: tl.constexpr):
    """The ``[BT, BD]`` fp32 tile of block rows ``[start, start + BT)`` of head ``bh`` in ``QT``'s layout (padded
    to whole blocks: no row mask)."""
    return load_rows(ptr + bh * stride_b + start * stride_t, tl.arange(0, BT), tl.arange(0, BLOCK_D), stride_t, BT,
                     HEAD_DIM, False, BLOCK_D != HEAD_DIM)


@triton.jit
def _ut_rd_store(ptr, x, bh, start, stride_b, stride_t, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BT: tl.constexpr):
    """Store ``x`` as the tile :func:`_ut_rd_load` reads (fp32: NaNs quiet, :func:`._pieces.quiet_for`)."""
    store_rows(ptr + bh * stride_b + start * stride_t, quiet_for(ptr, x), tl.arange(0, BT), tl.arange(0, BLOCK_D), stride_t, BT,
               HEAD_DIM)


@triton.jit
def _ut_prepare(Q, K, W, BETA, QT, QN, KT, AD, GM, WC, NU, INV, T,
                stride_qb, stride_qt, stride_kb, stride_kt, stride_wb, stride_wt,
                stride_pb, stride_pt, stride_nb, stride_ab, stride_at, stride_gb, stride_gj,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, NORM_Q: tl.constexpr,
                STORE_UT: tl.constexpr, STORE_INV: tl.constexpr, PRECISION: tl.constexpr):
    """Per-block UT factors and boundary-adjusted q/k for block ``J`` (``BT`` tokens ``[s, e]``).

    On entry ``AD`` holds, on its ``SUB x SUB`` diagonal blocks, the inverses made
    by :func:`_ut_diag_inverse`.  They are merged into ``X = (I + N)^{-1}``, one
    level at a time (blocks of ``2 SUB``, ``4 SUB``, ... ``BT``): with ``X``
    block-diagonal at the finer level and ``N_l`` the part of ``N`` that couples
    the two halves of each coarser block, ``X <- X - X N_l X`` fills in the
    coupling block ``-X_22 N_21 X_11`` of each half pair, which is block forward
    substitution (stable), two products per level.  Then ``A = X D_beta``.

    Writes rows ``[s, s + BT)`` of ``QT`` (q~) and ``KT`` (k~), ``(BH, T_pad, HEAD_DIM)``;
    of ``AD`` (the in-block scores Ã, ``(BH, T_pad, BT)``: row ``i``, column ``c`` is
    key ``s + c``); and ``GM[J] = G_J = P_J^T - I = -W^T A W`` (``HEAD_DIM x HEAD_DIM``),
    so that ``P_J x = x + G_J^T x``: for a row vector, ``x^T <- x^T + x^T G_J``.
    ``STORE_UT``: also ``WC`` (w) and ``NU`` (``-U = -A W``), the compact form
    ``x^T G_J = (x^T W^T)(-U)``.  Rows past ``T`` get ``q = k = w = 0``, ``beta = 0``
    (``H = I``): all zeros out.

    ``NORM_Q``: store ``q~ / |q~|`` and the norms ``|q~|`` in ``QN`` (PaTH).  ``STORE_INV``: also the
    merged inverse ``(I + N)^{-1}`` in ``INV`` (laid out as ``AD``), for the backward pass.

    Registers set this kernel's speed: a ``64 x 64`` fp32 tile is 32 registers per thread at 4 warps, and the
    products below need more such tiles than fit.  So each tile is loaded where it is first needed (``k`` twice,
    the second time from the L2 cache) and dies as early as the order allows: 27% less time than loading
    ``q``, ``k``, ``w`` up front, and faster than a two-launch split (``NOTES_path.md``, "One preparation program,
    tiles loaded where needed").
    ``PRECISION="fp16"`` (:func:`main_pass_precision`) halves what the products' operands take and the tensor
    cores' steps: the forward's variant does not spill (4 warps, sm_90), and the pass takes 36% less time
    (section 23).
    """
    blk = tl.program_id(0)
    start = blk * BT
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    # "fp16" products: the rows of bf16 (or fp32) q and k are scaled by powers of two into fp16's range first
    # (_pow2_rows), and every result that depends on them scaled back; fp16 q and k need nothing.
    SCALE_ROWS: tl.constexpr = PRECISION == "fp16" and (Q.dtype.element_ty != tl.float16
                                                         or K.dtype.element_ty != tl.float16)
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < T - start, other=0.0)  # [BT]
    w = rn(_ut_tile(W, bh, start, stride_wb, stride_wt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)  # [BT, BD]
    # (rounded once: every product sees the same w)
    # The triangular inverse: SUB x SUB diagonal blocks from _ut_diag_inverse, merged here.
    n = tl.where(rows[:, None] > rows[None, :], beta[:, None] * dot(w, tl.trans(w), PRECISION), 0.0)
    x = _merged_inverse(_diagonal_blocks(_ut_sq(AD, bh, start, stride_ab, stride_at, BT), rows), n, rows, BT,
                        PRECISION)  # [BT, BT]
    if STORE_INV:
        tl.store(_ut_sq(INV, bh, start, stride_ab, stride_at, BT), x)
    a = x * beta[None, :]  # [BT, BT]: A = (I + N)^{-1} D_beta
    # The keys' side: C = A strictLower(W K^T), then k~ = K - C^T W.  Both are linear in each key k_j, so they are
    # formed from the scaled keys s_j k_j (C's columns and k~'s rows come out times s_j) and k~ scaled back.
    k = quiet_fp32(_ut_tile_as_is(K, bh, start, stride_kb, stride_kt, T, HEAD_DIM, BLOCK_D, BT))  # [BT, BD], k's dtype
    k_s, k_u = _pow2_rows(k, SCALE_ROWS)  # [BT]: s_j and 1 / s_j (ones without SCALE_ROWS)
    c = dot(a, tl.where(rows[:, None] > rows[None, :], dot(w, tl.trans(k.to(tl.float32) * k_s[:, None]), PRECISION),
                        0.0), PRECISION)  # [BT, BT]: C_tj = s_j sum_s A_ts (w_s . k_j), s > j
    kt = k.to(tl.float32) - dot(tl.trans(c), w, PRECISION) * k_u[:, None]  # k~_j = H_e ... H_{j+1} k_j
    _ut_rd_store(KT, kt, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
    # The block's transition: -U = -A W, G = W^T (-U).  A dies here.
    nu = -dot(a, w, PRECISION)  # [BT, BD]
    store_rows(GM + bh * stride_gb + blk * stride_gj, quiet_for(GM, dot(tl.trans(w), nu, PRECISION)), offs_d, offs_d,
               HEAD_DIM, HEAD_DIM, HEAD_DIM)  # [BD, BD]
    if STORE_UT:
        _ut_rd_store(WC, w, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
        _ut_rd_store(NU, nu, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
    # The queries' side, through -U and C (the products with A are done): q~ = Q + lower(Q W^T)(-U), again from the
    # scaled rows r_i q_i (q~'s rows come out times r_i).
    q = quiet_fp32(_ut_tile_as_is(Q, bh, start, stride_qb, stride_qt, T, HEAD_DIM, BLOCK_D, BT))  # [BT, BD], q's dtype
    q_s, q_u = _pow2_rows(q, SCALE_ROWS)  # [BT]: r_i and 1 / r_i
    lower = rows[:, None] >= rows[None, :]  # s <= i (diagonal kept)
    qw = tl.where(lower, dot(q.to(tl.float32) * q_s[:, None], tl.trans(w), PRECISION), 0.0)  # r_i q_i . w_s, s <= i
    qt = q.to(tl.float32) * q_s[:, None] + dot(qw, nu, PRECISION)  # r_i q~_i, q~_i = H_s ... H_i q_i
    if NORM_Q:
        # Any positive stand-in for a zero norm is exact: q~ / n and n multiply back to q~.  The row's scale
        # cancels in q~ / |q~| and comes out of the norm.
        norm = tl.maximum(tl.sqrt(tl.sum(qt * qt, axis=1)), 1e-30)
        tl.store(QN + bh * stride_nb + start + rows, norm * q_u)
        qt = qt / norm[:, None]
    else:
        qt = qt * q_u[:, None]
    _ut_rd_store(QT, qt, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
    k = quiet_fp32(_ut_tile_as_is(K, bh, start, stride_kb, stride_kt, T, HEAD_DIM, BLOCK_D, BT))  # again: cheaper than keeping it
    if SCALE_ROWS:  # Ã_ij = (r_i s_j Ã_ij) / (r_i s_j), from the scaled rows and C's scaled columns
        qk = dot(q.to(tl.float32) * q_s[:, None], tl.trans(k.to(tl.float32) * k_s[:, None]), PRECISION)
        intra = tl.where(lower, (qk - dot(qw, c, PRECISION)) * q_u[:, None] * k_u[None, :], 0.0)
    else:
        intra = tl.where(lower, input_dot(q, tl.trans(k), PRECISION) - dot(qw, c, PRECISION), 0.0)  # Ã_ij, j <= i
    tl.debug_barrier()  # every thread has read its part of the diagonal inverses before Ã overwrites them
    tl.store(_ut_sq(AD, bh, start, stride_ab, stride_at, BT), intra)  # (NaNs as they come: see _linear_chunks)


@triton.jit
def _wy_prepare(K, V, BETA, LOG_F, AD, WW, WU, T, stride_kb, stride_kt, stride_vb, stride_vt, stride_ab, stride_at,
                stride_wb, stride_wt, stride_ub, stride_ut,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                BT: tl.constexpr, GATED: tl.constexpr, PRECISION: tl.constexpr):
    """DeltaNet's WY factors for block ``J`` (``BT`` tokens ``[s, e]``): ``W = A diag(e^b) K`` and ``U~ = A V``.

    ``A = (I + N)^{-1} D_beta`` with ``N_ij = beta_i (k_i . k_j) Gamma_ij`` for ``j < i``, ``Gamma_ij =
    exp(b_i - b_j)`` and ``b`` the prefix sum of ``log_f`` from the block start (``GATED``; else ``Gamma = 1``,
    ``b = 0``): the factors of :func:`pathedu.pathfox.gated_deltanet_chunked`.  Writes rows ``[s, s + BT)`` of
    ``WW`` (``(BH, T_pad, HEAD_DIM)``) and ``WU`` (``(BH, T_pad, HEAD_DV)``), in their dtypes.  Two identities
    shape the pass.

    * The decay leaves the inverse.  A scalar gate commutes with every transition: ``N = E N~ E^-1`` with ``E =
      diag(e^b)`` and the ungated ``N~ = strictLower(D_beta K K^T)``, so ``(I + N)^{-1} = E (I + N~)^{-1} E^-1``,
      entry by entry ``Gamma_ij`` times the ungated inverse.  No factor is ever multiplied by ``e^{-b}``, which
      leaves fp32's range for strong gates.
    * ``beta`` goes on the columns: ``(I + D_beta G)^{-1} D_beta = D_beta (I + G D_beta)^{-1}`` (push-through, ``G =
      strictLower(K K^T)``).  With ``Y = (I + G D_beta)^{-1}``, ``-Y_ij = (k_i^T H_{i-1} ... H_{j+1} k_j) beta_j``
      (``j < i``) is bounded, and a row of ``Y`` is not made small by a small ``beta_i``: that one stays outside
      the products, as an fp32 row factor. ::

        W = E D_beta (Y K),          U~ = D_beta V + D_beta (strictLower(Y o Gamma) V)      (o: entrywise)

    On entry ``AD`` holds ``Y``'s ``SUB x SUB`` diagonal blocks (:func:`_ut_diag_inverse` with ``W_IS_K``); they are
    merged here as in :func:`_ut_prepare`.

    ``"fp16"`` products (:func:`main_pass_precision`, 16-bit inputs): the keys need not be unit vectors (only
    ``beta_j |k_j|^2 <= 2``), so the block is conjugated by ``S = diag(s)``, ``s_i`` the power of two that brings
    ``|k_i|`` into [1, 2) (1 for a zero key; unit keys rounded to 16 bits get 1 or 2).  With ``K^ = S K`` and
    ``c_j = beta_j / s_j^2``: ``Y' = S Y S^-1 = (I + strictLower(K^ K^^T) D_c)^{-1}`` and ::

        W = E D_{beta/s} (Y' K^),       U~ = D_beta V + D_{beta/s} (strictLower(Y' o Gamma) D_s) (V C) C^-1

    with ``C`` the powers of two that bring each value channel's largest finite ``|v|`` in the block into [1, 2).
    Every operand is then bounded whatever the keys' lengths (``c_j <= beta_j |k_j|^2 <= 2``, ``|Y'_ij s_j| <= 2
    beta_j |k_j| <= 4``, ``|K^| < 2``) and every row factor too (``beta_i / s_i <= 2``).  Powers of two change no
    bit of an fp32 number; the scales are applied one at a time.

    Non-finite inputs: the transitions use ``k`` with NaN/inf replaced by 0 (the module docstring says
    why), and ``U~`` is formed from the finite values only, its rows at or after a channel's
    first non-finite value set to NaN: so the chunk loop's bookkeeping on ``U~`` finds a non-finite
    value at the same row as it would on ``V``, and no earlier row sees it through ``0 * NaN``.
    """
    blk = tl.program_id(0)
    start = blk * BT
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    left = T - start
    SCALE: tl.constexpr = PRECISION == "fp16"
    k = finite_or_zero(load_rows(K + bh * stride_kb + start * stride_kt, rows, offs_d, stride_kt, left, HEAD_DIM,
                                   True, BLOCK_D != HEAD_DIM).to(tl.float32))  # [BT, BD]
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < left, other=0.0)  # [BT]
    y = _diagonal_blocks(AD + bh * stride_ab + (start + rows[:, None]) * stride_at + rows[None, :], rows)  # [BT, BT]
    if SCALE:
        norm = tl.sqrt(tl.sum(k * k, axis=1))  # [BT]
        s, s_inv = pow2(norm)  # [BT]: |k_i| s_i in [1, 2)
        s = tl.where(norm > 0.0, s, 1.0)
        s_inv = tl.where(norm > 0.0, s_inv, 1.0)
        k = k * s[:, None]  # K^
        y = y * s[:, None] * s_inv[None, :]  # the diagonal blocks of Y' = S Y S^-1
        c = beta * s_inv * s_inv  # [BT]: beta_j / s_j^2
        row = beta * s_inv  # [BT]: beta_i / s_i
    else:
        c = beta
        row = beta
    k = rn(k, PRECISION)  # [BT, BD]: every product below sees the same keys
    strict = rows[:, None] > rows[None, :]
    n = tl.where(strict, dot(k, tl.trans(k), PRECISION) * c[None, :], 0.0)  # [BT, BT]
    y = _merged_inverse(y, n, rows, BT, PRECISION)  # [BT, BT], unit lower: Y'

    w = dot(y, k, PRECISION) * row[:, None]  # [BT, BD]
    v = load_rows(V + bh * stride_vb + start * stride_vt, rows, offs_dv, stride_vt, left, HEAD_DV, True,
                  BLOCK_DV != HEAD_DV).to(tl.float32)  # [BT, BDV]
    finite = tl.abs(v) < float("inf")
    first = tl.min(tl.where(finite, BT, rows[:, None]), axis=0)  # [BDV]: a channel's first non-finite row
    v = tl.where(finite, v, 0.0)
    if GATED:
        b = tl.cumsum(tl.load(LOG_F + bh * T + start + rows, mask=rows < left, other=0.0), axis=0)  # [BT]
        y = y * tl.exp(tl.where(strict, b[:, None] - b[None, :], float("-inf")))  # every exponent <= 0
        w = w * tl.exp(b)[:, None]
    else:
        y = tl.where(strict, y, 0.0)
    if SCALE:
        cv, cv_inv = pow2(tl.max(tl.abs(v), axis=0))  # [BDV]
        u = dot(y * s[None, :], v * cv[None, :], PRECISION) * row[:, None] * cv_inv[None, :]
    else:
        u = dot(y, v, PRECISION) * row[:, None]
    u = tl.where(rows[:, None] >= first[None, :], float("nan"), u + beta[:, None] * v)  # [BT, BDV]
    store_rows(WW + bh * stride_wb + start * stride_wt, w, rows, offs_d, stride_wt, BT, HEAD_DIM)
    store_rows(WU + bh * stride_ub + start * stride_ut, u, rows, offs_dv, stride_ut, BT, HEAD_DV)


# The UT factors' backward, in four kernels.  Its ~20 products of 64 x 64 tiles keep more fp32 tiles alive than a
# multiprocessor has registers: as two kernels both spilled 1.6-3.6 KB per thread
# (`python -m pathedu.bench.registers`) and the step took 53 ms at T = 8192 on an H100, more than its bytes cost.
# Each kernel below loads a tile where it first needs it and passes partial gradients to the next through memory
# (a 64 x 64 fp32 tile is 16 KB; a spilled one is read and written many times).  The last one does the inverse's
# terms and ``w``'s in one program, which reads the inverse, ``w`` and ``beta`` once (kernels/NOTES_path.md,
# "The UT backward in four kernels").  All four take the same arguments, so one launcher runs them in order.
#
# Their products run in fp16 for 16-bit inputs (:func:`backward_precision`).  Two kinds of operand go in: the
# factors of reflections (``w``, the inverse, ``A``, ``A W``), bounded, converted as they are (:func:`._pieces.rn`);
# and tiles that carry a gradient or the caller's ``q``, ``k``, of any magnitude, which :func:`._pieces.scaled`
# brings into fp16's range by one power of two per tile.  A product of such tiles is multiplied back by each
# factor's ``1 / s`` in turn (never by their product, which can leave fp32's range where each factor does not); a
# tile made by such a product and read by the next one keeps its scale (``# ~ 1/s of ...``: what it still has to be
# multiplied by).


@triton.jit
def _ut_bwd_aw(Q, K, W, BETA, INV, DQT, DKT, DAD, DG, DA, DQW, DWK, DAW, DQ, DK, DW, DBETA, T,
               stride_qb, stride_qt, stride_kb, stride_kt, stride_wb, stride_wt, stride_pb, stride_pt,
               stride_ab, stride_at, stride_gb, stride_gj, stride_ob, stride_ot,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, PRECISION: tl.constexpr):
    """The backward of :func:`_ut_prepare` (PaTH's outputs ``q~``, ``k~``, ``Ã``, ``G``), first of four kernels,
    one block per program.

    With ``QW = lower(Q W^T)``, ``WK = strictLower(W K^T)``, ``A = X D_beta``, ``X = (I + N)^{-1}``,
    ``N = strictLower(D_beta W W^T)``, the forward is ::

        q~ = Q - QW (A W)      k~ = K - (A WK)^T W      Ã = lower(Q K^T) - (QW A) WK      G = -W^T (A W)

    and the gradients of its outputs are ``dq~, dk~`` (``DQT, DKT``, laid out as ``QT``), ``dÃ`` (``DAD``, as
    ``AD``) and ``dG`` (``DG``, as ``GM``), all fp32.  This kernel reverses the products through ``A W``: it
    writes ``d(A W)`` (``DAW``, as ``QT``) and the first terms of ``dQW`` and ``dA`` (``DQW``, ``DA``, as ``AD``).
    """
    blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start = blk * BT
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    a = rn(_ut_a(INV, BETA, bh, start, T, stride_ab, stride_at, BT), PRECISION)  # [BT, BT]
    w = rn(_ut_tile(W, bh, start, stride_wb, stride_wt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)  # [BT, BD]
    aw = rn(dot_ready(a, w, True, True, PRECISION), PRECISION)  # [BT, BD]: A W
    dqt, dqt_u = scaled(_ut_rd_load(DQT, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT), PRECISION)
    # q~ = Q - QW (A W)
    tl.store(_ut_sq(DQW, bh, start, stride_ab, stride_at, BT),
             -dot_ready(dqt, tl.trans(aw), True, True, PRECISION) * dqt_u)
    q, q_u = scaled(_ut_tile_as_is(Q, bh, start, stride_qb, stride_qt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)
    qw = rn(tl.where(rows[:, None] >= rows[None, :], dot_ready(q, tl.trans(w), True, True, PRECISION), 0.0),
            PRECISION)  # [BT, BT] ~ 1/s of q
    daw = -dot_ready(tl.trans(qw), dqt, True, True, PRECISION) * q_u * dqt_u  # [BT, BD]
    # G = -W^T (A W)
    dg, dg_u = scaled(load_rows(DG + bh * stride_gb + blk * stride_gj, offs_d, offs_d, HEAD_DIM, HEAD_DIM,
                                  HEAD_DIM, CHECK_D, CHECK_D), PRECISION)  # [BD, BD]
    daw -= dot_ready(w, dg, True, True, PRECISION) * dg_u
    _ut_rd_store(DAW, daw, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
    daw, daw_u = scaled(daw, PRECISION)
    tl.store(_ut_sq(DA, bh, start, stride_ab, stride_at, BT),
             dot_ready(daw, tl.trans(w), True, True, PRECISION) * daw_u)


@triton.jit
def _ut_bwd_scores(Q, K, W, BETA, INV, DQT, DKT, DAD, DG, DA, DQW, DWK, DAW, DQ, DK, DW, DBETA, T,
                   stride_qb, stride_qt, stride_kb, stride_kt, stride_wb, stride_wt, stride_pb, stride_pt,
                   stride_ab, stride_at, stride_gb, stride_gj, stride_ob, stride_ot,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, PRECISION: tl.constexpr):
    """Second of four (after :func:`_ut_bwd_aw`): the products through ``Ã`` and ``k~``.  Completes ``dQW``
    (masked), ``dA`` and writes ``dWK`` (masked)."""
    blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start = blk * BT
    rows = tl.arange(0, BT)
    lower = rows[:, None] >= rows[None, :]
    strict = rows[:, None] > rows[None, :]
    # Every [BT, BT] tile here is read by products only: each is made ready (rounded or scaled) once, where it is made.
    a = rn(_ut_a(INV, BETA, bh, start, T, stride_ab, stride_at, BT), PRECISION)  # [BT, BT]
    w = rn(_ut_tile(W, bh, start, stride_wb, stride_wt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)  # [BT, BD]
    k, k_u = scaled(_ut_tile_as_is(K, bh, start, stride_kb, stride_kt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)
    wk = rn(tl.where(strict, dot_ready(w, tl.trans(k), True, True, PRECISION), 0.0), PRECISION)  # ~ 1/s of k
    # Ã = lower(Q K^T) - (QW A) WK
    dad, dad_u = scaled(tl.where(lower, tl.load(_ut_sq(DAD, bh, start, stride_ab, stride_at, BT)), 0.0), PRECISION)
    dy = rn(-dot_ready(dad, tl.trans(wk), True, True, PRECISION), PRECISION)  # d(QW A) ~ 1/s of dÃ and k
    dqw = tl.load(_ut_sq(DQW, bh, start, stride_ab, stride_at, BT)) + dot_ready(dy, tl.trans(a), True, True,
                                                                                PRECISION) * dad_u * k_u
    tl.store(_ut_sq(DQW, bh, start, stride_ab, stride_at, BT), tl.where(lower, dqw, 0.0))
    q, q_u = scaled(_ut_tile_as_is(Q, bh, start, stride_qb, stride_qt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)
    qw = rn(tl.where(lower, dot_ready(q, tl.trans(w), True, True, PRECISION), 0.0), PRECISION)  # ~ 1/s of q
    da = dot_ready(tl.trans(qw), dy, True, True, PRECISION) * q_u * dad_u * k_u  # [BT, BT]
    qwa = rn(dot_ready(qw, a, True, True, PRECISION), PRECISION)  # QW A ~ 1/s of q
    dwk = -dot_ready(tl.trans(qwa), dad, True, True, PRECISION) * q_u * dad_u  # [BT, BT]
    # k~ = K - (A WK)^T W
    dkt, dkt_u = scaled(_ut_rd_load(DKT, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT), PRECISION)
    dz = rn(-dot_ready(w, tl.trans(dkt), True, True, PRECISION), PRECISION)  # d(A WK) ~ 1/s of dk~
    tl.store(_ut_sq(DWK, bh, start, stride_ab, stride_at, BT),
             tl.where(strict, dwk + dot_ready(tl.trans(a), dz, True, True, PRECISION) * dkt_u, 0.0))
    da += dot_ready(dz, tl.trans(wk), True, True, PRECISION) * dkt_u * k_u
    p_da = _ut_sq(DA, bh, start, stride_ab, stride_at, BT)
    tl.store(p_da, tl.load(p_da) + da)


@triton.jit
def _ut_bwd_qk(Q, K, W, BETA, INV, DQT, DKT, DAD, DG, DA, DQW, DWK, DAW, DQ, DK, DW, DBETA, T,
               stride_qb, stride_qt, stride_kb, stride_kt, stride_wb, stride_wt, stride_pb, stride_pt,
               stride_ab, stride_at, stride_gb, stride_gj, stride_ob, stride_ot,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, PRECISION: tl.constexpr):
    """Third of four: ``dq, dk`` (``(BH, T, D)`` in ``Q``'s and ``K``'s dtypes; the direct terms and the masks'
    products, summed in fp32) and the masks' terms of ``dw`` (written to ``DW``, which the last one completes)."""
    blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start = blk * BT
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    left = T - start
    p_out = bh * stride_ob + start * stride_ot
    w = rn(_ut_tile(W, bh, start, stride_wb, stride_wt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)  # [BT, BD]
    k, k_u = scaled(_ut_tile_as_is(K, bh, start, stride_kb, stride_kt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)
    q, q_u = scaled(_ut_tile_as_is(Q, bh, start, stride_qb, stride_qt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)
    # dÃ, dQW and dWK are read by two products each: made ready once
    dad, dad_u = scaled(tl.where(rows[:, None] >= rows[None, :], tl.load(_ut_sq(DAD, bh, start, stride_ab, stride_at,
                                                                                  BT)), 0.0), PRECISION)  # [BT, BT]
    dqw, dqw_u = scaled(tl.load(_ut_sq(DQW, bh, start, stride_ab, stride_at, BT)), PRECISION)  # [BT, BT]
    dq = (_ut_rd_load(DQT, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
          + dot_ready(dad, k, True, True, PRECISION) * dad_u * k_u)
    store_rows(DQ + p_out, dq + dot_ready(dqw, w, True, True, PRECISION) * dqw_u, rows, offs_d, stride_ot, left,
               HEAD_DIM)
    dwk, dwk_u = scaled(tl.load(_ut_sq(DWK, bh, start, stride_ab, stride_at, BT)), PRECISION)  # [BT, BT]
    dk = (_ut_rd_load(DKT, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT)
          + dot_ready(tl.trans(dad), q, True, True, PRECISION) * dad_u * q_u)
    store_rows(DK + p_out, dk + dot_ready(tl.trans(dwk), w, True, True, PRECISION) * dwk_u, rows, offs_d, stride_ot,
               left, HEAD_DIM)
    store_rows(DW + p_out, dot_ready(tl.trans(dqw), q, True, True, PRECISION) * dqw_u * q_u
                + dot_ready(dwk, k, True, True, PRECISION) * dwk_u * k_u, rows, offs_d, stride_ot, left, HEAD_DIM)


@triton.jit
def _ut_bwd_w_inverse(Q, K, W, BETA, INV, DQT, DKT, DAD, DG, DA, DQW, DWK, DAW, DQ, DK, DW, DBETA, T,
                      stride_qb, stride_qt, stride_kb, stride_kt, stride_wb, stride_wt, stride_pb, stride_pt,
                      stride_ab, stride_at, stride_gb, stride_gj, stride_ob, stride_ot,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, PRECISION: tl.constexpr):
    """Last of four: completes ``dw`` and writes ``dbeta`` (``(BH, T)`` fp32).  First through the inverse,
    ``A = X D_beta``, ``X = (I + N)^{-1}``, ``N = strictLower(D_beta W W^T)`` (``dN = -X^T dX X^T``); then through
    ``k~ = K - (A WK)^T W``, ``G = -W^T (A W)`` and ``A W`` itself.  One program reads the inverse, ``w`` and
    ``beta`` once and ``dw`` once for both groups of terms; the first group's ``[BT, BT]`` tiles die before the
    second's products start (``NOTES_path.md``, "The UT backward in four kernels")."""
    blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start = blk * BT
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    strict = rows[:, None] > rows[None, :]
    left = T - start
    p_out = bh * stride_ob + start * stride_ot
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < left, other=0.0)  # [BT]
    xi = tl.load(_ut_sq(INV, bh, start, stride_ab, stride_at, BT))  # [BT, BT]
    w = rn(_ut_tile(W, bh, start, stride_wb, stride_wt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)  # [BT, BD]
    # Through the inverse: dbeta, and dw's terms of the Gram matrix.
    da = tl.load(_ut_sq(DA, bh, start, stride_ab, stride_at, BT))  # [BT, BT]
    dbeta = tl.sum(xi * da, axis=0)
    da, da_u = scaled(da * beta[None, :], PRECISION)
    xit = tl.trans(rn(xi, PRECISION))
    dn = tl.where(strict, -dot_ready(rn(dot_ready(xit, da, True, True, PRECISION), PRECISION), xit, True, True,
                                     PRECISION), 0.0)  # ~ 1/s of dA
    tl.store(DBETA + bh * T + start + rows, dbeta + tl.sum(dn * dot_ready(w, tl.trans(w), True, True, PRECISION),
                                                          axis=1) * da_u, mask=rows < left)
    dgram = dn * beta[:, None]
    dgram, dgram_u = scaled(dgram + tl.trans(dgram), PRECISION)
    dw = _ut_tile(DW, bh, start, stride_ob, stride_ot, T, HEAD_DIM, BLOCK_D, BT)  # [BT, BD]
    dw += dot_ready(dgram, w, True, True, PRECISION) * dgram_u * da_u
    # Through k~ = K - (A WK)^T W, G = -W^T (A W) and A W itself.
    a = rn(xi * beta[None, :], PRECISION)  # [BT, BT], A = X D_beta (as _ut_a makes it)
    k, k_u = scaled(_ut_tile_as_is(K, bh, start, stride_kb, stride_kt, T, HEAD_DIM, BLOCK_D, BT), PRECISION)
    wk = rn(tl.where(strict, dot_ready(w, tl.trans(k), True, True, PRECISION), 0.0), PRECISION)  # ~ 1/s of k
    awk = rn(dot_ready(a, wk, True, True, PRECISION), PRECISION)  # A WK ~ 1/s of k
    dkt, dkt_u = scaled(_ut_rd_load(DKT, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT), PRECISION)
    dw -= dot_ready(awk, dkt, True, True, PRECISION) * k_u * dkt_u
    dg, dg_u = scaled(load_rows(DG + bh * stride_gb + blk * stride_gj, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM,
                                  BLOCK_D != HEAD_DIM, BLOCK_D != HEAD_DIM), PRECISION)  # [BD, BD]
    dw -= dot_ready(rn(dot_ready(a, w, True, True, PRECISION), PRECISION), tl.trans(dg), True, True,
                    PRECISION) * dg_u
    daw, daw_u = scaled(_ut_rd_load(DAW, bh, start, stride_pb, stride_pt, HEAD_DIM, BLOCK_D, BT), PRECISION)
    dw += dot_ready(tl.trans(a), daw, True, True, PRECISION) * daw_u
    store_rows(DW + p_out, dw, rows, offs_d, stride_ot, left, HEAD_DIM)


def _warps_that_compile(configs, nargs, **kwargs):
    """8 warps only for D >= 64: with D = 16 and 8 warps (BT = 64) triton 3.6 made an H100 kernel that read past
    its shared memory (compute-sanitizer: "Invalid __shared__ read of size 256 bytes"; the interpreter was right)."""
    return [c for c in configs if c.num_warps <= 4 or kwargs["HEAD_DIM"] >= 64]


_UT_BWD_KERNELS = (_ut_bwd_aw, _ut_bwd_scores, _ut_bwd_qk, _ut_bwd_w_inverse)  # in launch order
_UT_BWD_CONFIGS = [triton.Config({}, num_warps=w, num_stages=1) for w in (4, 8)]
_UT_BWD_TUNING = dict(key=["HEAD_DIM", "BT", "PRECISION"], prune_configs_by={"early_config_prune": _warps_that_compile})
# Some kernels add to what one before wrote: their trial runs must not leave sums behind.
_UT_BWD_ADDS_TO = {_ut_bwd_scores: ["DQW", "DA"], _ut_bwd_w_inverse: ["DW"]}
_UT_BWD_TUNED = tuple(triton.autotune(_UT_BWD_CONFIGS, **_UT_BWD_TUNING, restore_value=_UT_BWD_ADDS_TO.get(kernel, []))
                      (kernel) for kernel in _UT_BWD_KERNELS)


def ut_prepare_backward(q3, k3, w3, beta3, prep: "Prepared", dqt, dkt, dad, dg, *, wide_range: bool = False):
    """``dq, dk`` (``(BH, T, D)`` in ``q3``'s and ``k3``'s dtypes, each rounded once from its fp32 sum) and ``dw,
    dbeta`` (fp32; ``(BH, T, D)`` and ``(BH, T)``) of PaTH's preparation pass, from the
    gradients of its outputs (fp32, in :class:`Prepared`'s layouts) and ``prep`` (made with
    ``keep_inverse=True`` and ``norm_q=False``).  Four launches, one block per program (:func:`_ut_bwd_aw`,
    :func:`_ut_bwd_scores`, :func:`_ut_bwd_qk`, :func:`_ut_bwd_w_inverse`; 4 or 8 warps, autotuned on a GPU), their
    products in :func:`backward_precision`'s precision.

    ``wide_range``: the gradient tiles' entries may span more than fp16's 24 binary orders within one tile, as they do
    under a chunked RNN's gates (``dÃ_ij`` carries ``e^{b_i - b_j}``: ``e^{-20}`` per step at ``log_f = -20``, while
    the diagonal keeps its size).  One power of two per tile cannot bring both ends into fp16, so the products stay
    in tf32 (``"tf32n"``, every entry its own exponent): with fp16 products the gated Householder RNN's ``dw`` and
    ``dbeta`` at ``log_f = -20`` came out 0 (relative error 1.0 against float64, fp16 inputs in the interpreter, bf16
    and fp16 on an H200), with tf32 within 1e-2 (``tests/test_delta_backward.py``)."""
    T, D = prep._args[4:]
    BH = q3.shape[0]
    # written once, by _ut_bwd_qk, which rounds its fp32 sums to the inputs' dtype: no fp32 copy to convert
    dq, dk = (torch.empty(BH, T, D, dtype=x.dtype, device=q3.device) for x in (q3, k3))
    dw = torch.empty(BH, T, D, dtype=torch.float32, device=q3.device)
    dbeta = torch.empty(BH, T, dtype=torch.float32, device=q3.device)
    da, dqw, dwk = (torch.empty_like(prep.ad) for _ in range(3))
    daw = torch.empty_like(dqt)
    args = dict(
        Q=q3, K=k3, W=w3, BETA=beta3, INV=prep.inv, DQT=dqt, DKT=dkt, DAD=dad, DG=dg, DA=da, DQW=dqw, DWK=dwk,
        DAW=daw, DQ=dq, DK=dk, DW=dw, DBETA=dbeta,
        T=T,
        stride_gb=prep.g.stride(0), stride_gj=prep.g.stride(1),
        **row_strides(q=q3, k=k3, w=w3, p=prep.qt, a=prep.ad, o=dq),
    )
    meta = dict(HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=prep.block,
                PRECISION=backward_precision(prep._flags["PRECISION"], D, fp16=not wide_range))
    kernels = _UT_BWD_TUNED
    if interpreting():
        kernels = _UT_BWD_KERNELS
        meta.update(num_warps=4, num_stages=1)
    grid = (triton.cdiv(T, prep.block), BH)
    for kernel in kernels:
        kernel[grid](**args, **meta)
    return dq, dk, dw, dbeta


def invert_diagonal_blocks(k3, w3, beta3, log_f3, x, T: int, block: int, *, w_is_k: bool, check=None) -> None:
    """Launch :func:`_ut_diag_inverse`: the ``SUB x SUB`` diagonal blocks of ``(I + N)^{-1}`` into ``x``
    (``(BH, T_pad, block)`` fp32); ``log_f3`` (``(BH, T)`` fp32) or None: Gated DeltaNet's gates, counted here
    (the inverse stays the ungated one, :func:`_wy_prepare`).
    ``check``: a :class:`pathedu.checks.checked_after` that receives the conditions on what the launch reads
    ("``w`` is finite" and "``beta_t |w_t|^2 <= 2``" unless ``w_is_k``, "``beta`` in [0, 2]", "``log_f`` a log gate"
    when given), decided from the launch's counts (:meth:`~pathedu.checks.checked_after.defer`), or None."""
    D = k3.shape[-1]
    bad = None if check is None else torch.zeros(2 * COUNTS, dtype=torch.float32, device=k3.device)
    _ut_diag_inverse[(x.shape[1] // SUB.value, k3.shape[0])](
        K=k3, W=w3, BETA=beta3, LOG_F=x if log_f3 is None else log_f3, X=x, BAD=x if bad is None else bad,
        T=T,
        **row_strides(k=k3, w=w3, x=x),
        HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=block, W_IS_K=w_is_k, GATED=log_f3 is not None, COUNT=bad is not None,
        PRECISION=prep_precision(w3.dtype), num_warps=1, num_stages=1,
    )
    if check is not None:
        counts = dict(zip(COUNTED, bad.split(2)))
        check.defer(None if w_is_k else finite_condition(w3, "w", counted=counts["w"]),
                    range_condition(beta3, "beta", 0.0, 2.0, BETA_WHY, counted=counts["beta"]),
                    None if log_f3 is None else log_gate_condition(log_f3, "log_f", counted=counts["log_f"]),
                    None if w_is_k else transition_condition(w3, beta3, "w", counted=counts["transition"]),
                    stats=bad[: 2 * len(COUNTED)])


class WYPrepared:
    """DeltaNet's WY factors for ``BH`` heads, chunks of ``block`` tokens (two launches:
    :func:`_ut_diag_inverse`, then :func:`_wy_prepare`): ``w: (BH, T_pad, D)`` (``A diag(e^b) K``) and
    ``u: (BH, T_pad, Dv)`` (``A V``), both in ``dtype``; ``T_pad`` is ``T`` rounded up to a multiple of
    ``block``.  ``log_f3``: ``(BH, T)`` fp32 log gates (Gated DeltaNet) or None.  ``check``: a
    :class:`pathedu.checks.checked_after` that receives the conditions on ``beta`` and ``log_f``, decided from the
    counts the first launch makes as it reads them (:func:`invert_diagonal_blocks`), or None."""

    def __init__(self, k3, v3, beta3, log_f3, T: int, block: int, *, dtype, precision: str, check=None):
        BH, _, D = k3.shape
        Dv = v3.shape[-1]
        T_pad = triton.cdiv(max(T, 1), block) * block
        self.block, self.T_pad = block, T_pad
        self.w = torch.empty(BH, T_pad, D, dtype=dtype, device=k3.device)
        self.u = torch.empty(BH, T_pad, Dv, dtype=dtype, device=k3.device)
        self._inv = torch.empty(BH, T_pad, block, dtype=torch.float32, device=k3.device)
        self._args = (k3, v3, beta3, log_f3, T)
        self._precision = precision
        self.invert_diagonal_blocks(check)
        self.prepare()

    def invert_diagonal_blocks(self, check=None) -> None:
        """The first launch (a method of its own so that :mod:`pathedu.bench.parts` can time it apart); with
        ``check``, it also counts the values of ``beta`` and ``log_f`` that break their conditions for it."""
        k3, _, beta3, log_f3, T = self._args
        invert_diagonal_blocks(k3, k3, beta3, log_f3, self._inv, T, self.block, w_is_k=True, check=check)

    def prepare(self) -> None:
        """The second launch: merges the diagonal inverses, writes ``w`` and ``u``."""
        k3, v3, beta3, log_f3, T = self._args
        D, Dv = k3.shape[-1], v3.shape[-1]
        _wy_prepare[(self.T_pad // self.block, k3.shape[0])](
            K=k3, V=v3, BETA=beta3, LOG_F=self._inv if log_f3 is None else log_f3, AD=self._inv, WW=self.w,
            WU=self.u,
            T=T,
            **row_strides(k=k3, v=v3, a=self._inv, w=self.w, u=self.u),
            HEAD_DIM=D, HEAD_DV=Dv, BLOCK_D=next_pow2(D), BLOCK_DV=next_pow2(Dv), BT=self.block,
            GATED=log_f3 is not None, PRECISION=main_pass_precision(self._precision), num_warps=4, num_stages=1,
        )


class Prepared:
    """The preparation pass's outputs for ``BH`` heads (two launches: :func:`_ut_diag_inverse`,
    then :func:`_ut_prepare`).

    ``qt, kt: (BH, T_pad, D)``; ``ad: (BH, T_pad, block)`` (fp32); ``g: (BH, T_pad / block, D, D)``;
    ``qn: (BH, T_pad)`` (fp32, only with ``norm_q``); ``wc, nu: (BH, T_pad, D)`` (only with
    ``store_ut``); ``inv: (BH, T_pad, block)`` (fp32, ``(I + N)^{-1}`` of each block, only with
    ``keep_inverse``: the backward pass's).  ``T_pad`` is ``T`` rounded up to a multiple of ``MAX_R * block``, so
    the main pass loads whole blocks without masks.  ``check``: a :class:`pathedu.checks.checked_after` that
    receives the conditions "``w`` is finite" and "``beta`` in [0, 2]", decided from the counts the first launch
    makes as it reads them (:func:`invert_diagonal_blocks`), or None (already checked).
    """

    def __init__(self, q3, k3, w3, beta3, T, block, *, q_dtype, k_dtype, update_dtype,
                 norm_q=False, store_ut=False, keep_inverse=False,
                 precision="ieee", num_warps=4, check=None):
        BH, _, D = q3.shape
        T_pad = triton.cdiv(max(T, 1), MAX_R * block) * MAX_R * block
        dev = q3.device
        self.block, self.T_pad = block, T_pad
        self.qt = torch.empty(BH, T_pad, D, dtype=q_dtype, device=dev)
        self.kt = torch.empty(BH, T_pad, D, dtype=k_dtype, device=dev)
        self.ad = torch.empty(BH, T_pad, block, dtype=torch.float32, device=dev)
        self.g = torch.empty(BH, T_pad // block, D, D, dtype=update_dtype, device=dev)
        self.qn = torch.empty(BH, T_pad, dtype=torch.float32, device=dev) if norm_q else self.ad
        self.wc = torch.empty(BH, T_pad, D, dtype=update_dtype, device=dev) if store_ut else self.g
        self.nu = torch.empty(BH, T_pad, D, dtype=update_dtype, device=dev) if store_ut else self.g
        self.inv = torch.empty_like(self.ad) if keep_inverse else self.ad
        self._args = (q3, k3, w3, beta3, T, D)
        self._flags = dict(NORM_Q=norm_q, STORE_UT=store_ut, STORE_INV=keep_inverse, PRECISION=precision)
        self._num_warps = num_warps
        self.invert_diagonal_blocks(check)
        self.prepare()

    # What PaTH's backward reads of the pass (a forward to be differentiated keeps them: ``save_factors``).
    _FACTORS = ("qt", "kt", "ad", "g", "inv")

    def factors(self) -> tuple:
        """``(qt, kt, ad, g, inv)``: the factors that PaTH's backward reads (:meth:`from_factors` takes them back)."""
        return tuple(getattr(self, name) for name in self._FACTORS)

    @classmethod
    def from_factors(cls, q3, k3, w3, beta3, T, block, qt, kt, ad, g, inv, *, precision) -> "Prepared":
        """A pass already made, from its :meth:`factors` and the arguments it was made from (no launch): what
        :func:`ut_prepare_backward` needs.  ``precision``: the pass's product precision."""
        prep = cls.__new__(cls)
        prep.block, prep.T_pad = block, qt.shape[1]
        prep.qt, prep.kt, prep.ad, prep.g, prep.inv = qt, kt, ad, g, inv
        prep.qn, prep.wc, prep.nu = ad, g, g  # not made (norm_q, store_ut off), as in __init__
        prep._args = (q3, k3, w3, beta3, T, q3.shape[-1])
        prep._flags = dict(NORM_Q=False, STORE_UT=False, STORE_INV=True, PRECISION=precision)
        prep._num_warps = 4
        return prep

    def invert_diagonal_blocks(self, check=None) -> None:
        """The first launch: the ``SUB x SUB`` diagonal blocks of ``(I + N)^{-1}``, into ``ad``
        (a method of its own so that :mod:`pathedu.bench.parts` can time it apart); with ``check``, it also
        counts the values of ``w`` and ``beta`` that break their conditions for it."""
        _, k3, w3, beta3, T, D = self._args
        invert_diagonal_blocks(k3, w3, beta3, None, self.ad, T, self.block, w_is_k=False, check=check)

    def prepare(self) -> None:
        """The second launch: merges the diagonal inverses and writes every factor (reads ``ad``
        as :meth:`invert_diagonal_blocks` left it)."""
        q3, k3, w3, beta3, T, D = self._args
        _ut_prepare[(self.T_pad // self.block, q3.shape[0])](
            Q=q3, K=k3, W=w3, BETA=beta3, QT=self.qt, QN=self.qn, KT=self.kt, AD=self.ad, GM=self.g, WC=self.wc,
            NU=self.nu, INV=self.inv,
            T=T,
            **row_strides(q=q3, k=k3, w=w3, p=self.qt, a=self.ad), stride_nb=self.qn.stride(0),
            stride_gb=self.g.stride(0), stride_gj=self.g.stride(1),
            HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=self.block,
            **dict(self._flags, PRECISION=main_pass_precision(self._flags["PRECISION"])), num_warps=self._num_warps,
            num_stages=1,
        )


def check_block(block, D: int, name: str = "block") -> int:
    """The UT block size: 16, 32, 64 or 128; ``None`` picks 64 for ``D <= 64`` and 32 above
    (with ``D = 128`` and 64-token blocks the preparation pass needs more shared memory than an H100 has)."""
    if block is None:
        return 64 if D <= 64 else 32
    if check_positive_int(block, name) not in (16, 32, 64, 128):
        raise ValueError(f"`{name}` must be one of 16, 32, 64, 128 (or None), got {block!r}")
    return int(block)


