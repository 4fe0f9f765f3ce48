r"""PaTH attention forward: the FlashAttention template with a right-to-left scan.

PaTH's logit between key ``j`` and query ``i`` carries the product of the
Householder-like transitions between them (0-based, smallest index on the left)::

    H_s = I - beta_s w_s w_s^T,      logit_ij = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i   (j <= i)

The kernel is :func:`pathedu.path.path_blockwise` in three launches.

**Preparation pass** (all blocks of ``BT`` tokens ``[s, e]`` in parallel).  From
the block's UT factor ``A = (I + N)^{-1} D_beta``, ``N = strictLower(D_beta W W^T)``
(``BT x BT``, lower; ``W`` holds the block's ``w`` as rows), it writes

* ``q~_i = H_s ... H_i q_i`` (boundary-adjusted queries), as rows
  ``Q~ = Q - (lower(Q W^T) A) W``, scaled to unit length, the norms kept apart
  (see *Precision*);
* ``k~_j = H_e ... H_{j+1} k_j`` (boundary-adjusted keys, so
  ``k~_j^T = k_j^T H_{j+1} ... H_e``), as rows ``K~ = K - (A strictLower(W K^T))^T W``;
* the in-block scores ``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` (j <= i) by the
  masked UT form ``Ã = lower(Q K^T) - lower(Q W^T) A strictLower(W K^T)``;
* the block's whole transition ``P_J = H_s ... H_e = I - W^T A^T W`` as one
  dense ``D x D`` matrix ``G_J = P_J^T - I = -W^T A W`` (optionally also the
  compact factors ``W`` and ``-U = -A W``).

The triangular inverse is the only sequential part.  :func:`_ut_diag_inverse`
solves the ``16 x 16`` diagonal blocks of ``I + N`` by forward substitution
(exact fp32, small tiles, many programs per multiprocessor), and
:func:`_ut_prepare` merges them into the ``BT x BT`` inverse with two matrix
products per level (block forward substitution: stable for every ``beta`` in
[0, 2], also for reflections of nearly parallel ``w``) before everything else.

**Main pass** (:func:`_path_fwd`, one program per block of ``BLOCK_M = R * BT``
queries).  Like :func:`.flash_attention._flash_fwd` it keeps the online softmax
``(m, l, acc)`` in fp32 and launches the heaviest query blocks first; unlike
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
tf32 products on fp32 tiles with operands rounded to nearest (:func:`_rn`: the
tensor cores truncate, and a truncated ``G_J`` shrinks ``q^`` a little at every
block, an error that grows linearly with T).  fp32 inputs run about fp32
throughout.  kernels/NOTES_path.md has the measurements behind each choice.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_per_token, check_scale
from ._launch import dot_precision, interpreting, next_pow2, prepare_per_token, prepare_qkv
from .flash_attention import LOG2E, _load_rows

MAX_R = 2  # a query block holds at most this many UT blocks; prepared tensors are padded to MAX_R * block rows


# ---------------------------------------------------------------------------
# Preparation pass (shared with the chunked Householder RNN / DeltaNet in delta_rule.py)
# ---------------------------------------------------------------------------

SUB = tl.constexpr(16)  # the triangular inverse is solved row by row on SUB x SUB diagonal blocks, then merged


@triton.jit
def _rn(x, PRECISION: tl.constexpr):
    """Round fp32 ``x`` to the nearest tf32 value when products run in tf32.

    The tensor cores read an fp32 operand's top 19 bits, i.e. they *truncate*
    towards zero.  A biased rounding is harmless once, but the block transitions
    ``P_J`` are applied again and again (to the carried query, to the RNN's state):
    truncated factors made every ``P_J`` slightly too short and the error grew
    linearly with T (kernels/NOTES_path.md).  Rounding to nearest first (add half
    a tf32 ulp to the bit pattern, clear the 13 low bits) makes it unbiased.
    """
    if PRECISION == "tf32":
        return ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
    else:
        return x


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` for fp32 tiles.  ``"tf32"``: operands rounded to nearest first; ``"x3"``:
    three tf32 products of high and low parts (``a_hi b_hi + a_hi b_lo + a_lo b_hi``,
    about fp32 accuracy on the tensor cores; fp32 inputs on a GPU, where the
    ``"ieee"`` FMA products of this many 64 x 64 tiles take minutes to compile);
    ``"ieee"``: exact fp32."""
    if PRECISION == "x3":
        a_hi = _rn(a, "tf32")
        b_hi = _rn(b, "tf32")
        lo = tl.dot(_rn(a - a_hi, "tf32"), b_hi, input_precision="tf32")
        lo = tl.dot(a_hi, _rn(b - b_hi, "tf32"), acc=lo, input_precision="tf32")
        return tl.dot(a_hi, b_hi, acc=lo, input_precision="tf32")
    else:
        return tl.dot(_rn(a, PRECISION), _rn(b, PRECISION), input_precision=PRECISION)


def prep_precision(dtype) -> str:
    """Product precision of the preparation pass: tf32 (rounded to nearest) for 16-bit inputs,
    ``"x3"`` for fp32 inputs on a GPU, exact ``"ieee"`` in the interpreter."""
    p = dot_precision(dtype)
    return "x3" if p == "ieee" and not interpreting() else p


@triton.jit
def _unit_lower_inverse(nt, rows, BT: tl.constexpr):
    """``(I + N)^{-1}`` for a strictly lower ``N``, given ``nt = N^T`` (``BT x BT``).

    Forward substitution: row ``i`` of the inverse ``X`` is ``e_i - sum_{j<i} N_ij X_j``,
    and rows ``j < i`` are final when row ``i`` is formed.  ``N^T`` is passed so that
    row ``i`` of ``N`` comes out of a reduction as a vector along the rows of ``X``.
    Exact fp32 arithmetic, stable for every ``beta`` in [0, 2], but ``BT - 1``
    sequential steps: used on ``SUB x SUB`` blocks only.
    """
    x = (rows[:, None] == rows[None, :]).to(tl.float32)
    for i in range(1, BT):
        n_i = tl.sum(tl.where(rows[None, :] == i, nt, 0.0), axis=1)  # n_i[j] = N[i, j], zero for j >= i
        x = tl.where(rows[:, None] == i, x - tl.sum(n_i[:, None] * x, axis=0)[None, :], x)
    return x


@triton.jit
def _ut_diag_inverse(K, W, BETA, X, T, stride_kb, stride_kt, stride_wb, stride_wt, stride_xb, stride_xt,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, W_IS_K: tl.constexpr):
    """First half of the triangular inverse: ``(I + N_bb)^{-1}`` for one ``SUB x SUB`` diagonal block.

    ``N = strictLower(D_beta W W^T)`` of the enclosing ``BT`` block.  The block's
    inverse goes to rows ``[s, s + SUB)``, columns ``[c, c + SUB)`` of ``X``
    (``(BH, T_pad, BT)``, ``c`` = the block's offset inside its ``BT`` block); the
    rest of ``X`` is left alone.  Everything is exact fp32, and the small tiles
    (one warp per program) keep many programs on each multiprocessor.
    """
    start = tl.program_id(0) * SUB
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, SUB)
    offs_d = tl.arange(0, BLOCK_D)
    if W_IS_K:
        W = K
        stride_wb = stride_kb
        stride_wt = stride_kt
    w = _load_rows(W + bh * stride_wb + start * stride_wt, rows, offs_d, stride_wt, T - start, HEAD_DIM,
                   True, BLOCK_D != HEAD_DIM).to(tl.float32)
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < T - start, other=0.0)
    gram = tl.dot(w, tl.trans(w), input_precision="ieee")
    nt = tl.where(rows[:, None] < rows[None, :], gram * beta[None, :], 0.0)  # N_bb^T
    x = _unit_lower_inverse(nt, rows, SUB)
    col = start % BT
    tl.store(X + bh * stride_xb + (start + rows[:, None]) * stride_xt + col + rows[None, :], x)


@triton.jit
def _merge(x, n, rows, SIZE: tl.constexpr, PRECISION: tl.constexpr):
    """One level of block forward substitution: ``x`` inverts ``I + N`` on blocks of ``SIZE / 2``;
    the result inverts it on blocks of ``SIZE``.  For each pair of halves (1, 2) the new
    block is ``X_21 = -X_22 N_21 X_11``, i.e. ``x - x N_l x`` with ``N_l`` = ``N`` restricted
    to the (2, 1) blocks (every other product term vanishes, ``x`` being block-diagonal)."""
    same = rows[:, None] // SIZE == rows[None, :] // SIZE
    couple = same & (rows[:, None] // (SIZE // 2) != rows[None, :] // (SIZE // 2))
    return x - _dot(x, _dot(tl.where(couple, n, 0.0), x, PRECISION), PRECISION)


@triton.jit
def _ut_prepare(Q, K, W, BETA, QT, QN, KT, AD, GM, WC, NU, T,
                stride_qb, stride_qt, stride_kb, stride_kt, stride_wb, stride_wt,
                stride_pb, stride_pt, stride_nb, stride_ab, stride_at, stride_gb, stride_gj,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, W_IS_K: tl.constexpr,
                VALUE_BETA: tl.constexpr, NORM_Q: tl.constexpr, STORE_UT: tl.constexpr, PRECISION: tl.constexpr):
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

    ``W_IS_K``: DeltaNet's transitions, ``w = k``.  ``VALUE_BETA``: DeltaNet's
    values ``beta_j v_j``, folded into column ``j`` of Ã and row ``j`` of k~.
    ``NORM_Q``: store ``q~ / |q~|`` and the norms ``|q~|`` in ``QN`` (PaTH).
    """
    blk = tl.program_id(0)
    start = blk * BT
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    left = T - start
    q = _load_rows(Q + bh * stride_qb + start * stride_qt, rows, offs_d, stride_qt, left, HEAD_DIM,
                   True, CHECK_D).to(tl.float32)
    k = _load_rows(K + bh * stride_kb + start * stride_kt, rows, offs_d, stride_kt, left, HEAD_DIM,
                   True, CHECK_D).to(tl.float32)
    if W_IS_K:
        w = k
    else:
        w = _load_rows(W + bh * stride_wb + start * stride_wt, rows, offs_d, stride_wt, left, HEAD_DIM,
                       True, CHECK_D).to(tl.float32)
    beta = tl.load(BETA + bh * T + start + rows, mask=rows < left, other=0.0)
    w = _rn(w, PRECISION)  # every product below sees the same (rounded) w

    # The triangular inverse: SUB x SUB diagonal blocks from _ut_diag_inverse, merged here.
    p_ad = AD + bh * stride_ab + (start + rows[:, None]) * stride_at + rows[None, :]
    x = tl.load(p_ad, mask=rows[:, None] // SUB == rows[None, :] // SUB, other=0.0)
    n = tl.where(rows[:, None] > rows[None, :], beta[:, None] * _dot(w, tl.trans(w), PRECISION), 0.0)
    if BT >= 32:
        x = _merge(x, n, rows, 32, PRECISION)
    if BT >= 64:
        x = _merge(x, n, rows, 64, PRECISION)
    if BT >= 128:
        x = _merge(x, n, rows, 128, PRECISION)
    a = x * beta[None, :]  # A = (I + N)^{-1} D_beta

    lower = rows[:, None] >= rows[None, :]  # s <= i (diagonal kept)
    qw = tl.where(lower, _dot(q, tl.trans(w), PRECISION), 0.0)  # q_i . w_s, s <= i
    wk = tl.where(rows[:, None] > rows[None, :], _dot(w, tl.trans(k), PRECISION), 0.0)  # w_t . k_j, t > j
    r = _dot(qw, a, PRECISION)  # r_it = sum_{s<=i} (q_i . w_s) A_st
    qt = q - _dot(r, w, PRECISION)  # q~_i = H_s ... H_i q_i
    intra = tl.where(lower, _dot(q, tl.trans(k), PRECISION) - _dot(r, wk, PRECISION), 0.0)  # Ã_ij, j <= i
    kt = k - _dot(tl.trans(_dot(a, wk, PRECISION)), w, PRECISION)  # k~_j = H_e ... H_{j+1} k_j
    nu = -_dot(a, w, PRECISION)  # -U, U = A W
    g = _dot(tl.trans(w), nu, PRECISION)  # G = -W^T A W
    if VALUE_BETA:
        intra = intra * beta[None, :]
        kt = kt * beta[:, None]

    offs_p = (bh * stride_pb + start * stride_pt) + rows[:, None] * stride_pt + offs_d[None, :]
    mask_p = offs_d[None, :] < HEAD_DIM
    if NORM_Q:
        # Any positive stand-in for a zero norm is exact: q~ / n and n multiply back to q~.
        norm = tl.maximum(tl.sqrt(tl.sum(qt * qt, axis=1)), 1e-30)
        tl.store(QN + bh * stride_nb + start + rows, norm)
        qt = qt / norm[:, None]
    tl.store(QT + offs_p, qt.to(QT.dtype.element_ty), mask=mask_p)
    tl.store(KT + offs_p, kt.to(KT.dtype.element_ty), mask=mask_p)
    offs_g = (bh * stride_gb + blk * stride_gj) + offs_d[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(GM + offs_g, g.to(GM.dtype.element_ty), mask=(offs_d[:, None] < HEAD_DIM) & mask_p)
    if STORE_UT:
        tl.store(WC + offs_p, w.to(WC.dtype.element_ty), mask=mask_p)
        tl.store(NU + offs_p, nu.to(NU.dtype.element_ty), mask=mask_p)
    tl.debug_barrier()  # every thread has read its part of the diagonal inverses before Ã overwrites them
    tl.store(p_ad, intra)


class Prepared:
    """The preparation pass's outputs for ``BH`` heads (two launches: :func:`_ut_diag_inverse`,
    then :func:`_ut_prepare`).

    ``qt, kt: (BH, T_pad, D)``; ``ad: (BH, T_pad, block)`` (fp32); ``g: (BH, T_pad / block, D, D)``;
    ``qn: (BH, T_pad)`` (fp32, only with ``norm_q``); ``wc, nu: (BH, T_pad, D)`` (only with
    ``store_ut``).  ``T_pad`` is ``T`` rounded up to a multiple of ``MAX_R * block``, so
    the main pass loads whole blocks without masks.
    """

    def __init__(self, q3, k3, w3, beta3, T, block, *, q_dtype, k_dtype, update_dtype,
                 norm_q=False, w_is_k=False, value_beta=False, store_ut=False, precision="ieee", num_warps=4):
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
        w3 = k3 if w_is_k else w3
        _ut_diag_inverse[(T_pad // SUB.value, BH)](
            k3, w3, beta3, self.ad, T, k3.stride(0), k3.stride(1), w3.stride(0), w3.stride(1),
            self.ad.stride(0), self.ad.stride(1), HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=block, W_IS_K=w_is_k,
            num_warps=1, num_stages=1)
        _ut_prepare[(T_pad // block, BH)](
            q3, k3, w3, beta3, self.qt, self.qn, self.kt, self.ad, self.g, self.wc, self.nu, T,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), w3.stride(0), w3.stride(1),
            self.qt.stride(0), self.qt.stride(1), self.qn.stride(0), self.ad.stride(0), self.ad.stride(1),
            self.g.stride(0), self.g.stride(1),
            HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=block, W_IS_K=w_is_k, VALUE_BETA=value_beta, NORM_Q=norm_q,
            STORE_UT=store_ut, PRECISION=precision, num_warps=num_warps, num_stages=1)


def check_block(block, D: int, name: str = "block") -> int:
    """The UT block size: 16, 32, 64 or 128; ``None`` picks 64 for ``D <= 64`` and 32 above
    (with ``D = 128`` and 64-token blocks the preparation pass needs more shared memory than an H100 has)."""
    if block is None:
        return 64 if D <= 64 else 32
    if isinstance(block, bool) or block not in (16, 32, 64, 128):
        raise ValueError(f"`{name}` must be one of 16, 32, 64, 128 (or None), got {block!r}")
    return block


# ---------------------------------------------------------------------------
# Main pass
# ---------------------------------------------------------------------------

@triton.jit
def _fold(acc, m_i, l_i, s, v, GUARD: tl.constexpr, PRECISION: tl.constexpr):
    """Fold logits ``s`` (log2 units) and values ``v`` into the online softmax.

    ``GUARD``: some rows may have seen only ``-inf`` so far (the diagonal region is
    visited right to left, so early rows see nothing in later sub-blocks); their
    max stays ``-inf`` and is replaced by 0 in the exponents (no ``inf - inf``).
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if GUARD:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


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
        g = _load_rows(GM, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM, BLOCK_D != HEAD_DIM, BLOCK_D != HEAD_DIM)
        return tl.dot(qh.to(g.dtype), g, acc=qh, input_precision=PRECISION)
    else:
        w = _load_rows(WC, cols, offs_d, stride_pt, 0, HEAD_DIM, False, BLOCK_D != HEAD_DIM)
        nu = _load_rows(NU, cols, offs_d, stride_pt, 0, HEAD_DIM, False, BLOCK_D != HEAD_DIM)
        x = tl.dot(qh.to(w.dtype), tl.trans(w), input_precision=PRECISION)
        return tl.dot(x.to(nu.dtype), nu, acc=qh, input_precision=PRECISION)


@triton.jit
def _path_fwd(QT, QN, KT, AD, GM, WC, NU, V, O, T, qk_scale,
              stride_pb, stride_pt, stride_nb, stride_ab, stride_at, stride_gb, stride_gj,
              stride_vb, stride_vt, stride_ob, stride_ot,
              HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
              R: tl.constexpr, BLOCK_N: tl.constexpr, UPDATE: tl.constexpr, PRECISION: tl.constexpr):
    BLOCK_M: tl.constexpr = R * BLOCK_N
    # Heaviest query blocks (those with the most keys) are launched first, as in the template.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs_m = start_m + rows
    cols = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    QT += bh * stride_pb
    KT += bh * stride_pb
    WC += bh * stride_pb
    NU += bh * stride_pb
    GM += bh * stride_gb
    V += bh * stride_vb
    O += bh * stride_ob

    # The carried query, fp32, unit rows; the norm goes into a per-row logit scale.
    qh = _load_rows(QT + start_m * stride_pt, rows, offs_d, stride_pt, BLOCK_M, HEAD_DIM, False,
                    BLOCK_D != HEAD_DIM).to(tl.float32)
    row_scale = tl.load(QN + bh * stride_nb + offs_m) * qk_scale
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Diagonal region: the R key blocks inside the query block, right to left.  Rows
    # in sub-block c take block c's in-block scores Ã; rows in later sub-blocks see
    # block c as an earlier block (logits from q^, then q^ <- P_c q^).
    sub = rows // BLOCK_N
    ad = _load_rows(AD + bh * stride_ab + start_m * stride_at, rows, cols, stride_at, BLOCK_M, BLOCK_N, False, False)
    for c in tl.static_range(R):
        cc = R - 1 - c
        start_n = start_m + cc * BLOCK_N
        offs_n = start_n + cols
        s = ad * qk_scale
        if cc < R - 1:
            kt = _load_rows(KT + start_n * stride_pt, cols, offs_d, stride_pt, BLOCK_N, HEAD_DIM, False,
                            BLOCK_D != HEAD_DIM)
            s_off = tl.dot(qh.to(kt.dtype), tl.trans(kt), input_precision=PRECISION) * row_scale[:, None]
            s = tl.where(sub[:, None] == cc, s, s_off)
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        v = _load_rows(V + start_n * stride_vt, cols, offs_dv, stride_vt, T - start_n, HEAD_DV, True,
                       BLOCK_DV != HEAD_DV)
        acc, m_i, l_i = _fold(acc, m_i, l_i, s, v, True, PRECISION)
        if cc < R - 1:
            qn = _transition(qh, GM + (start_n // BLOCK_N) * stride_gj, WC + start_n * stride_pt,
                             NU + start_n * stride_pt, cols, offs_d, stride_pt, HEAD_DIM, BLOCK_D, UPDATE, PRECISION)
            qh = tl.where(sub[:, None] > cc, qn, qh)

    # Key blocks strictly left of the query block, right to left: every key visible
    # (no causal mask) and every block whole (no row masks).
    for jj in range(0, start_m // BLOCK_N):
        start_n = start_m - (jj + 1) * BLOCK_N
        kt = _load_rows(KT + start_n * stride_pt, cols, offs_d, stride_pt, 0, HEAD_DIM, False, BLOCK_D != HEAD_DIM)
        v = _load_rows(V + start_n * stride_vt, cols, offs_dv, stride_vt, 0, HEAD_DV, False, BLOCK_DV != HEAD_DV)
        s = tl.dot(qh.to(kt.dtype), tl.trans(kt), input_precision=PRECISION) * row_scale[:, None]
        acc, m_i, l_i = _fold(acc, m_i, l_i, s, v, False, PRECISION)
        qh = _transition(qh, GM + (start_n // BLOCK_N) * stride_gj, WC + start_n * stride_pt,
                         NU + start_n * stride_pt, cols, offs_d, stride_pt, HEAD_DIM, BLOCK_D, UPDATE, PRECISION)

    o = acc / l_i[:, None]
    o_ptrs = O + offs_m[:, None] * stride_ot + offs_dv[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < T) & (offs_dv[None, :] < HEAD_DV))


# Tile shapes of the main pass: a query block is R UT blocks (BLOCK_M = R * BLOCK_N,
# BLOCK_N fixed by the preparation pass); the autotuner picks R, warps and stages.
_GPU_CONFIGS = [
    triton.Config({"R": r}, num_warps=w, num_stages=s)
    for r, w, s in [(1, 4, 2), (1, 4, 3), (2, 4, 2), (2, 4, 3)]
]
_TUNE_KEY = ["HEAD_DIM", "HEAD_DV", "BLOCK_N", "UPDATE", "PRECISION"]
_path_fwd_tuned = triton.autotune(_GPU_CONFIGS, key=_TUNE_KEY)(_path_fwd)


def path_attention(q, k, v, w, beta, *, scale=None, block=None, _config=None):
    """Causal PaTH attention forward (preparation pass, then the right-to-left scan).

    Shapes: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` ->
    ``(..., T, Dv)``; ``D, Dv`` in 16..128; any T.  ``q, k, v`` fp16/bf16/fp32
    (one dtype; the output has it); ``w`` and ``beta`` are used in fp32 whatever
    their dtype.  ``logit_ij = scale * k_j^T H_{j+1} ... H_i q_i`` with
    ``H_s = I - beta_s w_s w_s^T`` (smallest index on the left; ``j = i``: plain
    ``k_i . q_i``); ``scale=None`` means ``D ** -0.5``.  ``block``: the UT block
    (key block) size, 16/32/64/128 (``None``: 64 for ``D <= 64``, else 32).
    The caller validates ``beta``'s values (``pathedu.path`` requires [0, 2]);
    ``w`` is used as given (models pass unit vectors).

    ``_config`` (for tests and tuning): ``dict(R=..., num_warps=..., num_stages=...)``
    fixes the main pass's tiles (query blocks of ``R * block`` rows, R in 1..MAX_R)
    instead of autotuning; ``update="dense"|"ut"`` picks the form of ``q^ <- P_J q^``
    (default: dense while ``D <= 2 block``); ``update_dtype`` the dtype of its operands;
    ``prep_precision`` the preparation pass's product precision (see :func:`_dot`).
    """
    cfg = dict(_config or {})
    n, q3, k3, v3, dtype = prepare_qkv(q, k, v)
    scale = check_scale(scale, n.D)
    check_per_token(w, "w", n, q, extra=(n.D,))
    check_per_token(beta, "beta", n, q)
    block = check_block(block, n.D)
    BH = q3.shape[0]
    out = torch.empty(q3.shape[:-1] + (n.Dv,), dtype=dtype, device=q.device)
    if n.T == 0 or BH == 0:
        return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
    w3 = w.reshape(BH, n.T, n.D).to(torch.float32).contiguous()
    beta3 = prepare_per_token(beta, n, BH)
    precision = dot_precision(dtype)
    # Logits in the input dtype; the carried query's updates in fp16 (fp32 for fp32 inputs).
    update_dtype = cfg.pop("update_dtype", torch.float32 if dtype == torch.float32 else torch.float16)
    update = cfg.pop("update", "dense" if n.D <= 2 * block else "ut")
    if update not in ("dense", "ut"):
        raise ValueError(f"`_config['update']` must be 'dense' or 'ut', got {update!r}")
    prep = Prepared(q3, k3, w3, beta3, n.T, block, q_dtype=update_dtype, k_dtype=dtype, update_dtype=update_dtype,
                    norm_q=True, store_ut=update == "ut", precision=cfg.pop("prep_precision", prep_precision(dtype)))
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv), BLOCK_N=block,
                UPDATE=update, PRECISION=precision)
    args = (prep.qt, prep.qn, prep.kt, prep.ad, prep.g, prep.wc, prep.nu, v3, out, n.T, scale * LOG2E,
            prep.qt.stride(0), prep.qt.stride(1), prep.qn.stride(0), prep.ad.stride(0), prep.ad.stride(1),
            prep.g.stride(0), prep.g.stride(1), v3.stride(0), v3.stride(1), out.stride(0), out.stride(1))
    if cfg or interpreting():
        cfg = {"R": 1, "num_warps": 4, "num_stages": 1 if interpreting() else 2, **cfg}
        if cfg["R"] not in range(1, MAX_R + 1):
            raise ValueError(f"`_config['R']` must be in 1..{MAX_R}, got {cfg['R']!r}")
        _path_fwd[(triton.cdiv(n.T, cfg["R"] * block), BH)](*args, **cfg, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["R"] * block), BH)  # noqa: E731
        _path_fwd_tuned[grid](*args, **meta)
    return out.reshape(q.shape[:-1] + (n.Dv,)).to(q.dtype)
