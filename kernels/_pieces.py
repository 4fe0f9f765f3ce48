r"""Jit pieces that every kernel of the book shares, in one place.

* :func:`load_rows` / :func:`store_rows`: a ``(rows, cols)`` tile of a row-major
  ``(T, dim)`` matrix, with bound masks only where the sizes demand them.
* :func:`query_block`: the prologue of the softmax kernels (which ``(batch, head)``
  and which block of queries this program owns; heaviest blocks first).
* :func:`rn` / :func:`dot`: products of fp32 tiles with operands rounded to the
  nearest tf32 value first (the tensor cores truncate), or about fp32 accuracy from
  three tf32 products; used wherever a factor is applied again and again (the UT
  preparation pass, the Householder state).
* :func:`softmax_fold`: the online-softmax update ``(m, l, acc)`` of FlashAttention
  (:mod:`.flash_attention`) and PaTH (:mod:`.path_attention`); :func:`softmax_fold_scaled` takes the
  logits' positive scale into the update instead of a multiply per logit.
* Causality for non-finite values.  Inside a plain product a hidden (future) key
  still counts: its weight is 0, and ``0 * NaN`` and ``0 * inf`` are NaN.  So every
  tile that straddles the diagonal is multiplied by :func:`masked_dot`, on the
  values with their NaN/inf replaced by 0 (one select per value; bit-identical to
  the plain product for every row that sees no non-finite value), and the rows that
  do see one get it back from :func:`poison`, which reads where the first NaN,
  +inf and -inf of each channel are (:func:`first_nonfinite`: one packed integer
  per channel, folded tile by tile) and costs one branch when there is none.  The
  softmax kernels apply it once per query block, after their loops (so the main
  loops keep their registers); the FlashAttention template only in a careful pass
  that redoes the few blocks whose fast pass saw a NaN or inf (:mod:`.flash_attention`).  The linear kernels (:mod:`.linear_attention`) do the
  same in a simpler form: they multiply only finite values, state included, and set
  to NaN the output channels whose values had a NaN or inf at or before each row.
  With masks that are selects (``tl.where``, never a
  multiply by 0), this keeps every kernel causal for non-finite inputs: a NaN or
  inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at positions
  ``>= t`` only.
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # logits are kept in base 2: exp(x) = exp2(x * log2(e))


@triton.jit
def log2_approx(x):
    """``log2`` of an fp32 tile by the GPU's one-instruction approximation (``lg2.approx.f32``, absolute error
    about 2^-22 on [1, 2]).  ``tl.math.log2`` compiles to an accurate library routine, many instructions
    long: in stick-breaking's kernel, which takes one per logit, it cost about a fifth of the time
    (``NOTES_flash.md``, "Stick-breaking's log2").  PTX, so GPU only: callers choose it with a constexpr, never in the
    interpreter."""
    return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _rope_omega(log2_base, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """RoPE's frequencies ``Omega_n = base^(-n / HALF)`` for pairs ``n < BLOCK_H``, ``[BH]`` fp32, computed
    as ``2^(-(n / HALF) log2(base))``."""
    return tl.exp2(-(tl.arange(0, BLOCK_H).to(tl.float32) / HALF) * log2_base)


@triton.jit
def rope_cos_sin(pos, log2_base, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """RoPE's ``cos`` and ``sin`` of the angles ``pos_t Omega_n`` for positions ``pos`` ``[BR]`` (int) and
    pairs ``n < BLOCK_H``: two ``[BR, BH]`` fp32 tiles (frequencies from :func:`_rope_omega`, no table read
    from memory)."""
    theta = pos.to(tl.float32)[:, None] * _rope_omega(log2_base, HALF, BLOCK_H)[None, :]  # [BR, BH]
    return tl.cos(theta), tl.sin(theta)


@triton.jit
def rope_shift(c0, s0, start, log2_base, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """``cos`` and ``sin`` of ``(start + j) Omega_n`` from a table ``c0, s0`` (``[BR, BH]``) of ``j Omega_n``
    for the local offsets ``j`` (:func:`rope_cos_sin` of ``0..BR-1``), by angle addition: one accurate
    cos/sin per pair for the tile's start, then four multiply-adds per entry.  Triton's ``tl.cos``/``tl.sin``
    are accurate library routines (range reduction, dozens of instructions, not one special-function
    instruction), so a loop that turns a tile per iteration computes the table once, outside the loop."""
    a = (start + 0 * tl.arange(0, BLOCK_H)).to(tl.float32) * _rope_omega(log2_base, HALF, BLOCK_H)  # [BH]
    ca, sa = tl.cos(a)[None, :], tl.sin(a)[None, :]
    return c0 * ca - s0 * sa, s0 * ca + c0 * sa


@triton.jit
def load_pairs(ptr, rows, stride, n_rows, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
               INTERLEAVED: tl.constexpr):
    """The channel pairs ``(a_n, b_n)`` of rows ``rows`` of a row-major ``(T, 2 HALF)`` matrix: two
    ``[BR, BH]`` fp32 tiles (rows ``>= n_rows`` and pairs ``n >= HALF`` load as 0).  ``INTERLEAVED``: pair
    ``n`` is channels ``(2n, 2n + 1)``; each row is loaded whole and split in registers (stride-2 pointers
    would touch twice the bytes they use).  Else ``(n, n + HALF)``: two contiguous halves."""
    if INTERLEAVED:
        cols = tl.arange(0, 2 * BLOCK_H)
        x = tl.load(ptr + rows[:, None] * stride + cols[None, :],
                    mask=(rows[:, None] < n_rows) & (cols[None, :] < 2 * HALF), other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(x, [BLOCK_R, BLOCK_H, 2]))
    else:
        offs_n = tl.arange(0, BLOCK_H)
        mask = (rows[:, None] < n_rows) & (offs_n[None, :] < HALF)
        a = tl.load(ptr + rows[:, None] * stride + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(ptr + rows[:, None] * stride + HALF + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return a, b


@triton.jit
def load_rotated(ptr, rows, stride, n_rows, c, s, HALF: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rows ``rows`` of a row-major ``(T, 2 HALF)`` matrix, each pair rotated by the angles whose ``cos, sin``
    are ``c, s`` (``[BR, BH]``): a ``[BR, 2 BH]`` fp32 tile with its channels in *pair order*
    ``(a_0, b_0, a_1, b_1, ...)`` (padding pairs 0).  For interleaved pairs that is the original order; for
    ``"half"`` pairs it is a permutation of it.  Attention needs no more: a dot product is unchanged when both
    of its vectors' channels are permuted the same way, so q and k loaded through here give the logits of
    the rotated q and k in their own order (the RoPE rotation hook of the templates)."""
    a, b = load_pairs(ptr, rows, stride, n_rows, HALF, BLOCK_R, BLOCK_H, INTERLEAVED)
    return tl.reshape(tl.join(a * c - b * s, a * s + b * c), [BLOCK_R, 2 * BLOCK_H])


@triton.jit
def load_rows(ptr, rows, cols, stride, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a (len(rows), len(cols)) tile; masks only where the sizes demand it."""
    ptrs = ptr + rows[:, None] * stride + cols[None, :]
    if CHECK_ROWS and CHECK_COLS:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif CHECK_ROWS:
        return tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_COLS:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def query_rows_and_grad(Q, DO, bh, offs_m, stride_qb, stride_qt, stride_ob, stride_ot, T, HEAD_DIM: tl.constexpr,
                        HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Head ``bh``'s rows ``offs_m`` of ``Q`` ``[BM, BD]`` and of the output's gradient ``dO`` ``[BM, BDV]`` (rows past
    ``T`` and channels past the head dims read as 0): what a backward's query sweep starts from."""
    q = load_rows(Q + bh * stride_qb, offs_m, tl.arange(0, BLOCK_D), stride_qt, T, HEAD_DIM, True,
                  BLOCK_D != HEAD_DIM)
    do = load_rows(DO + bh * stride_ob, offs_m, tl.arange(0, BLOCK_DV), stride_ot, T, HEAD_DV, True,
                   BLOCK_DV != HEAD_DV)
    return q, do


@triton.jit
def store_rows(ptr, x, rows, cols, stride, n_rows, n_cols):
    """Store tile ``x`` at rows ``rows < n_rows`` and columns ``cols < n_cols``, in ``ptr``'s dtype."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tl.store(ptr + rows[:, None] * stride + cols[None, :], x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def query_block(BLOCK_M: tl.constexpr):
    """``(bh, start_m, offs_m)`` of this program: its (batch, head) row, first query and query rows.

    Grid ``(query blocks, BH)``.  The heaviest query blocks (those with the most keys) are
    launched first: a shorter tail.
    """
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    start_m = pid_m * BLOCK_M
    return tl.program_id(1).to(tl.int64), start_m, start_m + tl.arange(0, BLOCK_M)


@triton.jit
def rn(x, PRECISION: tl.constexpr):
    """Round fp32 ``x`` once to what the products of ``PRECISION`` read: the nearest tf32 value in tf32.

    The tensor cores read an fp32 operand's top 19 bits, i.e. they *truncate*
    towards zero.  A biased rounding is harmless once, but the block transitions
    ``P_J`` are applied again and again (to the carried query, to the RNN's state):
    truncated factors made every ``P_J`` slightly too short and the error grew
    linearly with T (``NOTES_path.md``, "Rounding to nearest before tf32 products").
    Rounding to nearest first (add half a tf32 ulp to the bit pattern, clear the
    13 low bits) makes it unbiased.

    Infinities and the quiet NaN that PyTorch writes (``0x7FC00000``) come out unchanged; a NaN with only its low
    13 mantissa bits set comes out as an infinity; but a NaN whose mantissa's top ten bits are all set carries into
    the sign bit and comes out as -0.0, a finite number.  NVIDIA's canonical NaN (``0x7FFFFFFF``), what arithmetic
    on a NaN returns on the GPU, is one.  So an operand that can hold one is made quiet before it gets here
    (:func:`quiet_nan`, :func:`quiet_fp32`, :func:`quiet_for`: the linear template's scores, keys and state, fp32
    inputs, the preparation passes' stored fp32 factors; ``NOTES_path.md``, "NaNs through the rounding").  A select
    inside this function instead cost PaTH's, DeltaNet's and Gated DeltaNet's forwards 6-13% on the H100, and
    ``cvt.rna.tf32.f32``, the PTX instruction for this rounding, keeps NaNs but compiles for sm_90 to that same
    select (``FSETP`` of ``|x| >= inf``, a predicated add, the mask; Triton 3.6, offline).

    ``"tf32n"`` is that select: the rounding for tiles that come out of arithmetic on gradients, where a NaN may
    arrive from anywhere upstream (the backward kernels: :func:`._launch.keeping_nans`).  ``"fp16"``: the same ten
    bits as an fp16 tile (round to nearest even; NaNs kept), in half the registers, for :func:`dot`'s fp16 products.
    """
    if x.dtype != tl.float32:  # fp16 and bf16 values are tf32 values already
        return x.to(tl.float32)
    elif PRECISION == "fp16":
        return x.to(tl.float16)
    elif PRECISION == "tf32" or PRECISION == "tf32n":
        r = ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)
        if PRECISION == "tf32n":  # every NaN stays one (the tensor cores read a NaN's top bits as a NaN)
            r = tl.where(x == x, r, x)
        return r
    else:
        return x


@triton.jit
def quiet_nan(x):
    """``x`` with every NaN replaced by the quiet NaN ``0x7FC00000``, which :func:`rn` keeps a NaN."""
    return tl.where(x == x, x, tl.full(x.shape, 0x7FC00000, tl.int32).to(tl.float32, bitcast=True))


@triton.jit
def quiet_fp32(x):
    """An fp32 input tile with its NaNs quiet (:func:`quiet_nan`), for a kernel that rounds it to tf32 (:func:`rn`):
    a canonical NaN written by GPU arithmetic upstream would otherwise vanish.  16-bit tiles come back as they are
    (their conversion to fp32 gives NaNs that the rounding keeps)."""
    if x.dtype == tl.float32:
        return quiet_nan(x)
    else:
        return x


@triton.jit
def quiet_for(ptr, x):
    """``x`` as it should be stored at ``ptr``: an fp32 tile with its NaNs quiet (:func:`quiet_nan`), since a
    later pass may round it to tf32 (:func:`rn`), which keeps only quiet NaNs; 16-bit stores keep every NaN a NaN
    anyway (the conversion does).  For the preparation passes' fp32 factors, which the linear template's
    Householder hook multiplies through :func:`dot`."""
    if ptr.dtype.element_ty == tl.float32:
        return quiet_nan(x)
    else:
        return x


@triton.jit
def finite_abs(x):
    """``|x|`` in fp32, with 0 for every NaN and inf."""
    a = tl.abs(x.to(tl.float32))
    return tl.where(a < float("inf"), a, 0.0)


@triton.jit
def pow2(m):
    """``(s, 1 / s)``, fp32 of ``m``'s shape: for finite magnitudes ``m >= 0``, the powers of two ``s`` that bring
    ``m s`` into [1, 2) (exponents clamped so that ``s`` and ``1 / s`` are normal numbers; ``m = 0`` gets
    ``2^125``).  Multiplying by a power of two changes no bit of a normal fp32 number, and a NaN or inf stays one."""
    e = tl.minimum(tl.maximum((m.to(tl.int32, bitcast=True) >> 23) & 0xFF, 2), 253)  # m's biased exponent
    s = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 2^(127 - e): m s in [1, 2)
    return s, (e << 23).to(tl.float32, bitcast=True)  # 1 / s = 2^(e - 127)


@triton.jit
def scaled(x, PRECISION: tl.constexpr):
    """``(x s, 1 / s)`` for a tile ``x`` whose magnitude is the caller's (a gradient, ``q``, ``k``): with
    ``"fp16"`` products, ``s`` is the power of two that brings the tile's largest finite ``|entry|`` into [1, 2)
    (:func:`pow2`) and ``x s`` is fp16: exact for every entry down to ``2^-14`` of the largest (below that fp16's
    subnormals keep fewer bits: absolute errors under ``2^-25`` of the largest), a NaN or inf where it was.  One
    power of two for the whole tile commutes with any product, whatever index it sums over: ``(s L)(t R) = s t L R``
    exactly (a scale per row would not, on the summed index).  An fp16 tile comes back as it is: scaling it down
    could only push its small entries into the subnormals that they were not in.  Other precisions: ``(rn(x),
    1)``.  For the backward kernels' fp16 products (:func:`.ut_prepare.backward_precision`, :mod:`.path_carry`)."""
    if PRECISION == "fp16" and x.dtype == tl.float16:
        return x, 1.0
    elif PRECISION == "fp16":
        xf = x.to(tl.float32)
        s, u = pow2(tl.max(tl.max(finite_abs(xf), axis=1), axis=0))
        return (xf * s).to(tl.float16), u
    else:
        return rn(x, PRECISION), 1.0


@triton.jit
def dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` (fp32) for fp32 or 16-bit tiles.  ``"tf32"``: operands rounded to nearest first; ``"x3"``:
    three tf32 products of high and low parts (``a_hi b_hi + a_hi b_lo + a_lo b_hi``,
    about fp32 accuracy on the tensor cores; fp32 inputs on a GPU, where the
    ``"ieee"`` FMA products of this many 64 x 64 tiles take minutes to compile);
    ``"ieee"``: exact fp32; ``"fp16"``: operands rounded to nearest fp16, the same 10 mantissa bits as
    ``"tf32"`` at twice the tensor cores' rate and half the registers, for operands whose entries stay
    within fp16's normal range (products of reflections: PaTH's carries).  ``"tf32n"``, ``"x3n"``: ``"tf32"``,
    ``"x3"`` with every NaN of an operand kept a NaN (:func:`rn`), for the backward kernels."""
    if PRECISION == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    elif PRECISION == "x3" or PRECISION == "x3n":
        ONE: tl.constexpr = "tf32n" if PRECISION == "x3n" else "tf32"  # how each tf32 part is rounded
        a_hi = rn(a, ONE)
        b_hi = rn(b, ONE)
        lo = tl.dot(rn(a - a_hi, ONE), b_hi, input_precision="tf32")
        lo = tl.dot(a_hi, rn(b - b_hi, ONE), acc=lo, input_precision="tf32")
        return tl.dot(a_hi, b_hi, acc=lo, input_precision="tf32")
    else:
        return tl.dot(rn(a, PRECISION), rn(b, PRECISION), input_precision="tf32" if PRECISION == "tf32n" else PRECISION)


@triton.jit
def dot_ready(a, b, A_READY: tl.constexpr, B_READY: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`dot` where the fp32 operands flagged ``*_READY`` already went through :func:`rn` with
    ``PRECISION``: in tf32 they are not rounded again (the rounding is idempotent, so the product is the same, bit
    for bit, without a second rounded copy of the tile in registers); any other precision is :func:`dot`'s."""
    if PRECISION == "tf32" or PRECISION == "tf32n":
        if A_READY:
            ra = a
        else:
            ra = rn(a, PRECISION)
        if B_READY:
            rb = b
        else:
            rb = rn(b, PRECISION)
        return tl.dot(ra, rb, input_precision="tf32")
    else:
        return dot(a, b, PRECISION)


@triton.jit
def input_dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` of two tiles in the inputs' dtype: 16-bit operands multiply exactly in fp32 (a plain product on
    the tensor cores, as exact as tf32 of the same values and at twice its rate); fp32 ones go through
    :func:`dot` with ``PRECISION``."""
    if a.dtype == tl.float32:
        return dot(a, b, PRECISION)
    else:
        return tl.dot(a, b)


@triton.jit
def finite_or_zero(x):
    """``x`` with its NaN and +-inf entries replaced by 0 (same dtype)."""
    return tl.where(tl.abs(x) < float("inf"), x, 0.0).to(x.dtype)


@triton.jit
def masked_dot(p, v, acc, PRECISION: tl.constexpr):
    """``acc + p @ v`` for a causal tile (``p`` exactly 0 on the keys a row does not see), with the
    non-finite values replaced by 0: a NaN or inf of a hidden key cannot reach a row through
    ``0 * NaN``.  Bit-identical to the plain product for rows that see no non-finite value;
    the rows that do see one get it back from :func:`first_nonfinite` and :func:`poison`."""
    return acc + tl.dot(p, finite_or_zero(v), input_precision=PRECISION)


# Where non-finite values are, per value channel: the (tile-relative) positions of the first
# NaN, +inf and -inf key, 10 bits each in one int32 (1023: none).  Positions are relative to
# the start of the caller's query block or chunk, so they stay below 1023.
_NONE = tl.constexpr(1023)
_ALL_NONE = tl.constexpr(1023 | (1023 << 10) | (1023 << 20))


@triton.jit
def no_nonfinite(BLOCK_DV: tl.constexpr):
    """The packed positions when no non-finite value has been seen: ``(BLOCK_DV,)`` int32."""
    return tl.full([BLOCK_DV], _ALL_NONE, tl.int32)


@triton.jit
def any_nonfinite(x):
    """Whether the tile ``x`` holds a NaN or an infinity (one reduction)."""
    return tl.min((tl.abs(x) < float("inf")).to(tl.int32)) == 0


@triton.jit
def first_nonfinite(v, pos, bad):
    """Fold a value tile (one row per key, at positions ``pos``) into the packed per-channel
    positions ``bad`` of the first NaN, +inf and -inf key (see :func:`no_nonfinite`)."""
    # One reduction tells whether the tile holds any NaN/inf (the usual answer: no, and the
    # three per-kind reductions below are skipped).
    if any_nonfinite(v):
        at = pos[:, None]
        first_nan = tl.minimum(bad & 1023, tl.min(tl.where(v != v, at, _NONE), axis=0))
        first_pinf = tl.minimum((bad >> 10) & 1023, tl.min(tl.where(v == float("inf"), at, _NONE), axis=0))
        first_ninf = tl.minimum(bad >> 20, tl.min(tl.where(v == float("-inf"), at, _NONE), axis=0))
        bad = first_nan | (first_pinf << 10) | (first_ninf << 20)
    return bad


@triton.jit
def poison(out, row_pos, bad):
    """Give back to ``out[i, d]`` the non-finite values that :func:`masked_dot` left out: row ``i``
    (at position ``row_pos[i]``) sees every key at a position ``<= row_pos[i]``; ``bad``: the
    packed positions of :func:`first_nonfinite`.

    IEEE semantics of ``out + p * v`` over the non-finite ``v`` seen, for softmax weights
    (``p > 0``): NaN for a NaN or for both infinities, otherwise the infinity seen.  Rows
    that see none are untouched; when no channel has one (the usual case), this is one
    reduction and a branch."""
    if tl.min(bad, 0) != _ALL_NONE:
        sees_nan = (bad & 1023)[None, :] <= row_pos[:, None]
        sees_pinf = ((bad >> 10) & 1023)[None, :] <= row_pos[:, None]
        sees_ninf = (bad >> 20)[None, :] <= row_pos[:, None]
        add = tl.where(sees_nan | (sees_pinf & sees_ninf), float("nan"),
                       tl.where(sees_pinf, float("inf"), tl.where(sees_ninf, float("-inf"), 0.0)))
        out = out + add
    return out


@triton.jit
def gate_ref(C, r):
    """The log-gate hook's reference for a program whose query block starts at row ``r``: ``c_r log2(e)`` from the
    fp32 cumulative log gates ``C`` (``r < T``).  Rounded once: its error is a constant of the program, which
    softmax ignores and :func:`gate_rows` takes back out of the log-sum-exp."""
    return tl.load(C + r) * 1.4426950408889634


@triton.jit
def gate_keys(C, c_ref, offs_n, T, MASK: tl.constexpr):
    """The log-gate bias's key term for keys ``offs_n`` ``[BN]``, log2 units: ``c_ref - c_j log2(e)``, one fused
    multiply-add per key (a single rounding of a number that is small near the diagonal, where the weights are).
    The bias of a logit is ``(c_i - c_j) log2(e)``; its row term ``c_i log2(e) - c_ref`` is the same for a whole
    row, so softmax ignores it and the kernels add it to the log-sum-exp only (:func:`gate_rows`).  ``MASK``:
    keys may run past ``T``."""
    if MASK:
        c_n = tl.load(C + offs_n, mask=offs_n < T, other=0.0)
    else:
        c_n = tl.load(C + offs_n)
    return c_ref - c_n * 1.4426950408889634


@triton.jit
def gate_rows(C, c_ref, offs_m, T):
    """The row term ``c_i log2(e) - c_ref`` of the log-gate bias for rows ``offs_m`` ``[BM]`` (see
    :func:`gate_keys`): what a row's log-sum-exp over the kernel's logits lacks for the true logits'."""
    return tl.load(C + offs_m, mask=offs_m < T, other=0.0) * 1.4426950408889634 - c_ref


@triton.jit
def softmax_fold(acc, m_i, l_i, s, v, GUARD: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold logits ``s`` (log2 units) and values ``v`` of one key block into the online softmax.

    ``m_i``: the largest logit seen so far per row; ``l_i``: the sum of ``2^(logit - m)``;
    ``acc``: the sum of ``2^(logit - m) v_j`` (fp32).  When the block raises the maximum
    from ``m`` to ``m'``, what was summed so far is rescaled by ``2^(m - m')``.

    ``GUARD``: some rows may have seen only ``-inf`` so far (PaTH visits its diagonal
    region right to left, so early rows see nothing in later sub-blocks); their max stays
    ``-inf`` and is replaced by 0 in the exponents (no ``inf - inf``).  ``MASKED``: the
    block holds hidden keys (weight 0), so the product is :func:`masked_dot` (the caller
    then folds ``v`` into :func:`first_nonfinite` and applies :func:`poison` once, at the
    end).  Both are compile-time flags: an unmasked block compiles to the plain update.
    """
    return softmax_fold_scaled(acc, m_i, l_i, s, 1.0, v, GUARD, MASKED, PRECISION, "none")


@triton.jit
def softmax_fold_scaled(acc, m_i, l_i, s, scale, v, GUARD: tl.constexpr, MASKED: tl.constexpr,
                        PRECISION: tl.constexpr, SCALE: tl.constexpr):
    """:func:`softmax_fold` of the logits ``s * scale``, ``scale > 0``: a scalar (``SCALE == "scalar"``), one
    number per row (``"row"``, ``[BM]``) or none (``"none"``: ``s`` is the logits).

    A positive scale commutes with the maximum, and rounding is monotone, so ``max_j fl(s_ij c)`` is
    ``fl(c max_j s_ij)``: the maximum is taken on the raw products and scaled once per row, and each logit's
    scale rides in the exponent's fused multiply-add (``2^(s c - m)``).  Scaling the tile first costs one multiply
    per logit, about a tenth of the FlashAttention loop's instructions (``NOTES_flash.md``, "The logits' scale in the
    exponent")."""
    if SCALE == "none":
        m_new = tl.maximum(m_i, tl.max(s, 1))
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
    if GUARD:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    if SCALE == "none":
        p = tl.exp2(s - m_use[:, None])
    elif SCALE == "row":
        p = tl.exp2(s * scale[:, None] - m_use[:, None])
    else:
        p = tl.exp2(s * scale - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)  # rescales what was summed under the old maximum
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        acc = masked_dot(p.to(v.dtype), v, acc * alpha[:, None], PRECISION)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def scan_dot(x, acc, BLOCK: tl.constexpr, REVERSE: tl.constexpr, INCLUSIVE: tl.constexpr):
    """``acc`` plus the running sums of an fp32 tile ``x`` ``[BM, BLOCK]`` along its rows, by two products with a 0/1
    triangular matrix on the tensor cores: ``(x M)_j = sum_m x_m M_mj``.  ``REVERSE``: sums over ``m >= j`` (``m > j``
    unless ``INCLUSIVE``), else over ``m <= j`` (``m < j``).

    :func:`tl.cumsum` along a row of a product's tile compiles to a scan across the threads that share the row: on
    sm_90 about eleven warp shuffles per entry (stick-breaking's forward, Triton 3.6, offline), and the shuffle unit
    serves one warp instruction per clock per multiprocessor, so the scan cost more than the three transcendentals
    beside it.  Here ``x = h1 + h2`` with ``h1 = fp16(x)`` and ``h2 = fp16(x - h1)`` (22 significant bits; the 0/1
    matrix is exact; products and sums in fp32), so each sum is within about ``2^-22 sum_m |x_m|`` of the exact one,
    plus ``2^-25`` per entry below fp16's normal range.  The caller keeps ``|x| <= 65504`` (log gates clamped, values
    scaled by a power of two per row); a NaN or inf in a row reaches every sum of that row (``0 * NaN``), so the
    callers choose what a non-finite entry becomes before the product."""
    r = tl.arange(0, BLOCK)
    if REVERSE:
        if INCLUSIVE:
            keep = r[:, None] >= r[None, :]
        else:
            keep = r[:, None] > r[None, :]
    else:
        if INCLUSIVE:
            keep = r[:, None] <= r[None, :]
        else:
            keep = r[:, None] < r[None, :]
    m = keep.to(tl.float16)  # [BLOCK, BLOCK]: summed index along rows, output index along columns
    h1 = x.to(tl.float16)
    h2 = (x - h1.to(tl.float32)).to(tl.float16)
    acc = tl.dot(h1, m, acc=acc)
    return tl.dot(h2, m, acc=acc)


@triton.jit
def _row_pow2(x):
    """``(s, 1 / s)`` ``[BM]`` fp32 for a tile ``x`` ``[BM, BN]``: per row, the power of two that brings the row's
    largest finite ``|entry|`` into [1, 2) (:func:`pow2`; a row of zeros or non-finite entries gets ``2^125``).
    Scaling a row by a power of two changes no bit of a normal number and commutes with any product that sums along
    the row (:func:`scan_dot` of ``x s``, then ``/ s``)."""
    return pow2(tl.max(finite_abs(x), axis=1))


@triton.jit
def prefix_sums(x, BLOCK: tl.constexpr, SCAN: tl.constexpr):
    """``S_im = sum_{j <= m} x_ij`` inside one tile ``[BM, BLOCK]`` (inclusive, along the rows), fp32: ``tl.cumsum``
    (``SCAN="cumsum"``) or :func:`scan_dot` (``"dot"``) with each row scaled by a power of two into [1, 2) first
    (:func:`_row_pow2`), so that the fp16 parts hold a row of any magnitude."""
    if SCAN == "dot":
        sc, inv = _row_pow2(x)
        return scan_dot(x * sc[:, None], tl.zeros_like(x), BLOCK, False, True) * inv[:, None]
    else:
        return tl.cumsum(x, axis=1)

