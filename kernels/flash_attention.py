r"""Causal FlashAttention forward: the softmax-side template of the book.

One program owns a block of ``BLOCK_M`` queries of one (batch, head) and
streams over key/value blocks of ``BLOCK_N`` rows, keeping three running
quantities per query row (the *online softmax*):

* ``m``: the largest logit seen so far (in log2 units),
* ``l``: the sum of ``2^(logit - m)`` over keys seen so far,
* ``acc``: the sum of ``2^(logit - m) v_j``, in fp32.

When a new block raises the maximum from ``m`` to ``m'``, what was summed so far
is rescaled by ``2^(m - m')``.  The output is ``acc / l``.  This is
:func:`pathedu.nope.nope_blockwise` line by line, with two kernel habits:

* logits are kept in base 2 (``exp2`` is one instruction; ``exp`` is ``exp2``
  after a multiply): ``scale`` is folded into ``scale * log2(e)``;
* key blocks strictly left of the query block need no causal mask, so the loop
  is split in two: unmasked blocks, then the blocks on the diagonal.

The position encoding is a hook: ``BIAS`` adds to every logit

* ``"none"``: nothing (NoPE, chapter 1);
* ``"alibi"``: ``-slope * (i - j)`` with a per-head slope (chapter 2);
* ``"loggate"``: ``c_i - c_j`` with ``c`` the fp32 cumulative sum of per-token
  log forget gates, i.e. ``sum_{s=j+1..i} log f_s`` (chapter 3).

Both biases have the form ``g(i) - g(j)``; the kernel adds only ``g(r) - g(j)``,
``r`` the query block's first row, since the remaining ``g(i) - g(r)`` is a
constant per row and softmax ignores it (see ``_attend``).

RoPE is a second hook, ``ROTATE`` (``"none"``, ``"interleaved"``, ``"half"``): q is turned
by its positions once, as the program loads it, and every key tile as it is loaded
(:func:`._pieces.load_rotated`; cos/sin computed in the kernel, channels in pair order,
which leaves every dot product unchanged).  ``"interleaved_q"``, ``"half_q"``: q only, the keys
having been rotated by a pass through memory, which also leaves the cos/sin it computed in a table
that the hook reads (:func:`.rope.rotary_attention`'s default for inference: a query tile is turned
once per program, a key tile would be once per query block; accurate cos/sin evaluated by every
query block cost the template a sixth of its time at T = 1024).  The alternative, used for training,
is a rotation pre-pass of both through memory and the kernel unchanged.

Shared pieces (:mod:`._pieces`): the online-softmax update is
:func:`._pieces.softmax_fold_scaled` (PaTH uses the same one), which takes the logits' scale into
its exponent's multiply-add instead of a multiply per logit.  Inputs are validated
once, at :func:`attention` (see :mod:`._launch`).

Causality for NaN and inf costs one reduction when there are none.  A hidden
(future) key has weight 0 on the diagonal blocks, and ``0 * NaN`` is NaN, so a
plain product would carry a NaN value to earlier rows.  The forward is two
launches: the *fast* pass (:func:`_flash_fwd`) multiplies plainly and flags each
query block whose accumulator holds a NaN or inf (which a NaN/inf value always
causes, weight 0 or not; a finite accumulator means every product was the
careful one's, bit for bit); the *careful* pass (:func:`_flash_careful`, one
small launch that reads the flags) redoes only the flagged blocks, with the same
tiles, multiplying the diagonal blocks through :func:`._pieces.masked_dot` (the
values without their NaN/inf) and giving the rows that do see one their NaN or
inf back (:func:`._pieces.first_nonfinite`, :func:`._pieces.poison`).  One
launch doing both (the careful code in every program) cost 3-13% at B = H = 32,
D = 64 on an H100; two cost nothing measurable (``NOTES_flash.md``, "Two launches for non-finite values").
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..alibi import slope_condition
from ..checks import check_scale, checked_after
from .gates import cumulative_log_gates
from ._launch import (Flat, dot_precision, interpreting, next_pow2, per_head, per_token, prepare_qkv, rotate_args,
                      row_strides, wants_grad)
from ._pieces import (LOG2E, any_nonfinite, first_nonfinite, gate_keys, gate_ref, gate_rows, load_rotated,
                      load_rows, no_nonfinite, poison, query_block, rope_cos_sin, rope_shift, softmax_fold_scaled,
                      store_rows)

__all__ = ["attention", "biased_attention", "LOG2E"]


@triton.jit
def _attend(acc, m_i, l_i, bad, q, K, V, bias_arg, c_ref, start_m, offs_m, lo, hi, T, stride_kt, stride_vt, qk_scale,
            log2_base, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
            BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr,
            ROTATE: tl.constexpr, SAFE: tl.constexpr):
    """Fold key blocks [lo, hi) into the running (acc, m_i, l_i) of one query block.

    ``SAFE`` (masked blocks only): multiply the values without their NaN/inf (:func:`._pieces.masked_dot`)
    and record in ``bad``, per value channel, where the first NaN, +inf and -inf are
    (:func:`._pieces.first_nonfinite`); without it the product is plain and ``bad`` is left alone."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if BIAS == "alibi":
        key0 = bias_arg * tl.arange(0, BLOCK_N).to(tl.float32)  # [BN]
    ROTATE_K: tl.constexpr = ROTATE == "interleaved" or ROTATE == "half"  # "..._q": the keys come rotated
    if ROTATE_K:  # cos/sin of the offsets inside a key tile, once: every tile shifts them (rope_shift)
        c0, s0 = rope_cos_sin(tl.arange(0, BLOCK_N), log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [BN, BD / 2]
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # Only diagonal blocks can run past T; blocks left of the diagonal are whole.
        if not ROTATE_K:
            k = load_rows(K, offs_n, offs_d, stride_kt, T, HEAD_DIM, CAUSAL_MASK, BLOCK_D != HEAD_DIM)
        else:  # RoPE: each key turned by its position as it is loaded, channels in pair order (as q's)
            ck, sk = rope_shift(c0, s0, start_n, log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [BN, BD / 2]
            k = load_rotated(K, offs_n, stride_kt, T, ck, sk, HEAD_DIM // 2, BLOCK_N, BLOCK_D // 2,
                             ROTATE == "interleaved").to(K.dtype.element_ty)  # [BN, BD]
        v = load_rows(V, offs_n, offs_dv, stride_vt, T, HEAD_DV, CAUSAL_MASK, BLOCK_DV != HEAD_DV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BM, BN], log2 units once scaled by qk_scale
        # The bias b_ij = g(i) - g(j) is split at the query block's first row r:
        # b_ij = (g(r) - g(j)) - (g(r) - g(i)).  The second term is the same for a
        # whole row and softmax ignores per-row constants, so only the key term,
        # a vector of BLOCK_N numbers, is added: with the scale, one fused multiply-add per logit.
        if BIAS == "alibi":
            # g(t) = slope * t, bias_arg = slope * log2(e): slope (j - r) as this tile's offset plus the tile's
            # own slope (j - start_n), made once (key0): one add per key.
            s = s * qk_scale + (key0 + bias_arg * (start_n - start_m).to(tl.float32))[None, :]
        elif BIAS == "loggate":
            # g(t) = c_t log2(e), the cumulative log gate; c_ref = g(r).
            s = s * qk_scale + gate_keys(bias_arg, c_ref, offs_n, T, CAUSAL_MASK)[None, :]
        if CAUSAL_MASK:  # i >= j, as offsets from the query block's first row
            s = tl.where((offs_m - start_m)[:, None] >= (start_n - start_m) + tl.arange(0, BLOCK_N)[None, :], s,
                         float("-inf"))
        # The online-softmax update; on diagonal blocks a product that keeps hidden keys out.
        # Without a bias the scale rides in the update (one multiply per logit fewer); the mask's -inf
        # stays -inf under a positive scale.
        acc, m_i, l_i = softmax_fold_scaled(acc, m_i, l_i, s, qk_scale, v, False, CAUSAL_MASK and SAFE, PRECISION,
                                            "scalar" if BIAS == "none" else "none")
        if CAUSAL_MASK and SAFE:  # where this block's NaN/inf values are (for poison)
            bad = first_nonfinite(v, offs_n - start_m, bad)
    return acc, m_i, l_i, bad


@triton.jit
def _flash_block(Q, K, V, O, BIAS_ARG, LSE, bh, pid_m, T, qk_scale, log2_base,
                 stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                 HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 STORE_LSE: tl.constexpr, ROTATE: tl.constexpr, SAFE: tl.constexpr):
    """Query block ``pid_m`` of head ``bh``: its output rows and, with ``STORE_LSE``, their log-sum-exp.  The query
    tile is loaded once (turned by ``ROTATE``), then :func:`_attend` folds the key blocks left of it unmasked and
    the blocks on the diagonal masked (``SAFE``: the careful pass, see :func:`_attend`).  Returns whether the
    accumulator holds a NaN or inf (the fast pass's question; the careful pass's answer is final: False)."""
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    K += bh * stride_kb
    V += bh * stride_vb
    if ROTATE == "none":
        q = load_rows(Q + bh * stride_qb + start_m * stride_qt, tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D),
                      stride_qt, T - start_m, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    else:  # RoPE: the queries turned once, as they are loaded (the keys in _attend, tile by tile, or by a pass)
        QUERIES_ONLY: tl.constexpr = ROTATE == "interleaved_q" or ROTATE == "half_q"  # the keys came rotated
        if QUERIES_ONLY:  # the keys' pass left its cos/sin in a table, (2, T, BD / 2) at BIAS_ARG
            p_trig = BIAS_ARG + offs_m[:, None] * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)[None, :]
            cq = tl.load(p_trig, mask=offs_m[:, None] < T, other=0.0)  # [BM, BD / 2]
            sq = tl.load(p_trig + T * (BLOCK_D // 2), mask=offs_m[:, None] < T, other=0.0)
        else:
            cq, sq = rope_cos_sin(offs_m, log2_base, HEAD_DIM // 2, BLOCK_D // 2)  # [BM, BD / 2]
        q = load_rotated(Q + bh * stride_qb, offs_m, stride_qt, T, cq, sq, HEAD_DIM // 2, BLOCK_M, BLOCK_D // 2,
                         ROTATE == "interleaved" or ROTATE == "interleaved_q").to(Q.dtype.element_ty)  # [BM, BD]
        if QUERIES_ONLY and HEAD_DV >= HEAD_DIM:
            # Through this program's own output rows and back: a tile that comes from a load is staged in shared
            # memory for the products, one that comes from arithmetic stays in registers through the whole loop
            # (137 registers instead of 126 for 128 x 64 tiles of 8 warps: one program per multiprocessor instead
            # of two; kernels/NOTES_flash.md, "RoPE's rotation").  The rows are overwritten by the output at the end.
            p_o = O + bh * stride_ob + start_m * stride_ot
            store_rows(p_o, q, tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D), stride_ot, T - start_m, HEAD_DIM)
            tl.debug_barrier()
            q = load_rows(p_o, tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D), stride_ot, T - start_m, HEAD_DIM, True,
                          BLOCK_D != HEAD_DIM)
    bias_arg = 0.0
    c_ref = 0.0
    if BIAS == "alibi":
        bias_arg = tl.load(BIAS_ARG + bh) * 1.4426950408889634
    elif BIAS == "loggate":
        bias_arg = BIAS_ARG + bh * T
        c_ref = gate_ref(bias_arg, start_m)  # start_m < T for every launched block

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    bad = no_nonfinite(BLOCK_DV)
    # Key blocks strictly before the query block: every key is visible, no mask.
    acc, m_i, l_i, bad = _attend(acc, m_i, l_i, bad, q, K, V, bias_arg, c_ref, start_m, offs_m, 0, start_m, T,
                                 stride_kt, stride_vt, qk_scale, log2_base, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV,
                                 BLOCK_N, False, BIAS, PRECISION, ROTATE, SAFE)
    # Key blocks on the diagonal: hide the future (and anything past T).
    acc, m_i, l_i, bad = _attend(acc, m_i, l_i, bad, q, K, V, bias_arg, c_ref, start_m, offs_m, start_m,
                                 tl.minimum(start_m + BLOCK_M, T), T, stride_kt, stride_vt, qk_scale, log2_base,
                                 HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N, True, BIAS, PRECISION, ROTATE, SAFE)
    if SAFE:  # the diagonal blocks multiplied values without their NaN/inf; the rows that see one get it back
        o = poison(acc / l_i[:, None], offs_m - start_m, bad)
        redo = False
    else:
        o = acc / l_i[:, None]
        # Row sums: a NaN or inf anywhere in a row reaches its sum (a reduction along the rows, cheap in
        # the product's layout; an overflow of finite values would only send the block to the careful pass).
        redo = any_nonfinite(tl.sum(acc, 1))
    store_rows(O + bh * stride_ob, o, offs_m, tl.arange(0, BLOCK_DV), stride_ot, T, HEAD_DV)
    if STORE_LSE:
        # For the backward pass: the log-sum-exp (log2 units) of the *true* logits, whose bias is
        # g(i) - g(j), not the g(r) - g(j) added above; the per-row difference g(i) - g(r) goes back in.
        lse = m_i + tl.log2(l_i)
        if BIAS == "alibi":
            lse -= bias_arg * (offs_m - start_m).to(tl.float32)
        elif BIAS == "loggate":
            lse += gate_rows(bias_arg, c_ref, offs_m, T)
        tl.store(LSE + bh * T + offs_m, lse, mask=offs_m < T)
    return redo


@triton.jit
def _flash_fwd(Q, K, V, O, BIAS_ARG, LSE, FLAGS, T, qk_scale, log2_base,
               stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
               HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr,
               STORE_LSE: tl.constexpr, ROTATE: tl.constexpr):
    """The template's forward, one program per (block of ``BLOCK_M`` queries, head): grid ``(cdiv(T, BLOCK_M), BH)``.

    ``Q, K: (BH, T, D)``, ``V, O: (BH, T, Dv)`` (strided); ``BIAS_ARG``: per-head ALiBi slopes ``(BH,)`` or the
    cumulative log gates ``(BH, T)`` fp32, or for ``ROTATE="..._q"`` the queries' cos/sin table ``(2, T, BD / 2)``
    fp32 (:func:`.rope._rotate_launch`); ``LSE``: ``(BH, T)`` fp32, written with ``STORE_LSE``; ``FLAGS``:
    ``(BH, cdiv(T, BLOCK_M))`` int8, set to 1 where the block must be redone carefully (:func:`_flash_careful`).
    The module docstring has the hooks, the base-2 logits and the fast and careful passes."""
    bh, start_m, _ = query_block(BLOCK_M)  # heaviest query blocks first
    pid_m = start_m // BLOCK_M
    redo = _flash_block(Q, K, V, O, BIAS_ARG, LSE, bh, pid_m, T, qk_scale, log2_base, stride_qb, stride_qt, stride_kb,
                        stride_kt, stride_vb, stride_vt, stride_ob, stride_ot, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV,
                        BLOCK_M, BLOCK_N, BIAS, PRECISION, STORE_LSE, ROTATE, False)
    tl.store(FLAGS + bh * tl.num_programs(0) + pid_m, redo.to(tl.int8))


@triton.jit
def _flash_careful(Q, K, V, O, BIAS_ARG, LSE, FLAGS, n_blocks, n_flags, T, qk_scale, log2_base,
                   stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                   HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   STORE_LSE: tl.constexpr, ROTATE: tl.constexpr, BLOCK_F: tl.constexpr):
    """The careful pass: program ``p`` reads the flags ``[p BLOCK_F, (p + 1) BLOCK_F)`` of :func:`_flash_fwd` (one
    vector load; usually all 0, and then it is done) and redoes each flagged query block with the values of its
    diagonal blocks multiplied without their NaN/inf (``SAFE``), with :func:`_flash_fwd`'s tiles: every row gets
    the bits that the fast pass gives it when no value is NaN or inf.  Grid ``(cdiv(n_flags, BLOCK_F),)``."""
    first = tl.program_id(0) * BLOCK_F
    offs_f = first + tl.arange(0, BLOCK_F)
    if tl.max(tl.load(FLAGS + offs_f, mask=offs_f < n_flags, other=0)) != 0:
        for f in range(first, tl.minimum(first + BLOCK_F, n_flags)):
            if tl.load(FLAGS + f) != 0:
                _flash_block(Q, K, V, O, BIAS_ARG, LSE, (f // n_blocks).to(tl.int64), f % n_blocks, T, qk_scale,
                             log2_base, stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob,
                             stride_ot, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N, BIAS, PRECISION,
                             STORE_LSE, ROTATE, True)


@triton.jit
def bwd_logits(s, bias_arg, m, n, T, MASK: tl.constexpr, BIAS: tl.constexpr):
    """A backward tile's logits (log2 units): the scores ``s`` plus the whole bias ``b = g(i) - g(j)`` (no
    per-block reference here: each tile is on its own), and ``-inf`` where the tile hides an entry (``MASK``:
    the tile straddles the diagonal or the end of the sequence; selected away, never multiplied by 0).
    Orientation and broadcasting as :func:`bwd_probs`.  PaTH's training forward
    (:func:`.path_attention._path_dyadic_fwd`) saves the log-sum-exp of these same logits: the two must agree bit
    for bit, so both call this."""
    if BIAS == "alibi":
        s += bias_arg * (n - m).to(tl.float32)  # -slope (i - j) log2(e)
    elif BIAS == "loggate":
        c_m = tl.load(bias_arg + m, mask=m < T, other=0.0)
        c_n = tl.load(bias_arg + n, mask=n < T, other=0.0)
        s += (c_m - c_n) * 1.4426950408889634  # c_i - c_j: the difference first, then the scale
    if MASK:
        s = tl.where((m >= n) & (m < T), s, float("-inf"))
    return s


@triton.jit
def bwd_probs(s, dp, lse, delta, bias_arg, m, n, T, MASK: tl.constexpr, BIAS: tl.constexpr):
    """``(p, dz)`` of one backward tile, fp32, from its scores ``s`` (logits without the bias, log2 units) and
    ``dp = dO v^T``, both in one orientation: ``[BM, BN]`` (queries along rows) or ``[BN, BM]`` (keys
    along rows, what :func:`dkdv_steps` uses).  ``lse``, ``delta`` and the query positions ``m`` are
    broadcast along the key axis and the key positions ``n`` along the query axis: ``[BM, 1]`` and
    ``[1, BN]`` in the first orientation, ``[1, BM]`` and ``[BN, 1]`` in the second.

    The probabilities are recomputed from the saved log-sum-exp, ``p = 2^(logit - lse)`` with the logits of
    :func:`bwd_logits` (hidden entries give 0), and ``dz = p * (dp - delta)`` is the gradient of the
    natural-log logit, ``delta_i = dO_i . O_i``.  PaTH's backward passes its own ``s``.
    """
    p = tl.exp2(bwd_logits(s, bias_arg, m, n, T, MASK, BIAS) - lse)
    return p, p * (dp - delta)


@triton.jit
def _row_pair(A, B, offs, stride_at, stride_bt, T, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASK: tl.constexpr):
    """Rows ``offs`` of a ``D``-wide tensor ``A`` (``q`` or ``k``: ``[BM, BD]``) and of a ``Dv``-wide one ``B``
    (``dO`` or ``v``: ``[BM, BDV]``), the two tiles a backward step loads per inner tile."""
    a = load_rows(A, offs, tl.arange(0, BLOCK_D), stride_at, T, HEAD_DIM, MASK, BLOCK_D != HEAD_DIM)
    b = load_rows(B, offs, tl.arange(0, BLOCK_DV), stride_bt, T, HEAD_DV, MASK, BLOCK_DV != HEAD_DV)
    return a, b


@triton.jit
def dkdv_steps(dk, dv, col, k, v, Q, DO, LSE, DELTA, bias_arg, offs_n, lo, hi, T, qk_scale, stride_qt, stride_vt,
               HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               INNER: tl.constexpr, MASK: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr,
               DQA, DBRA, ATOMIC_DQ: tl.constexpr):
    """Fold the query tiles ``[lo, hi)`` (``INNER`` rows each) into one key block's ``dK`` (unscaled),
    ``dV`` and column sums of ``dz``.  With ``ATOMIC_DQ``, also add each tile's share of ``dQ``
    (``dz k``, unscaled, fp32, rows of ``HEAD_DIM``) into ``DQA`` and its row sums of ``dz`` into ``DBRA``
    with atomic adds: FlashAttention-2's single pass (five tile products instead of seven).

    The tile is computed transposed, keys along rows (``s^T = k q^T``, ``[BN, BM]``), as Triton's
    fused-attention tutorial does: then ``p^T`` and ``dz^T`` are already the left operands of
    ``dV += p^T dO`` and ``dK += dz^T Q``, and the column sums of ``dz`` are row sums.  Every transpose
    falls on a tile loaded from memory (a view of its shared-memory copy), none on a computed one.

    The gradient products ``dz^T Q`` (here) and ``dz K`` (:func:`dq_steps`) run in ``dO``'s dtype.  It is
    the rows' own everywhere but in PaTH's backward, whose meeting-point rows are fp16 beside bf16 gradients:
    a trained layer's ``dz`` can sit below fp16's normal range (6.1e-5), where bf16 keeps fp32's."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(lo, hi, INNER):
        offs_m = start_m + tl.arange(0, INNER)
        q, do = _row_pair(Q, DO, offs_m, stride_qt, stride_vt, T, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, MASK)
        if MASK:
            lse = tl.load(LSE + offs_m, mask=offs_m < T, other=0.0)
            delta = tl.load(DELTA + offs_m, mask=offs_m < T, other=0.0)
        else:
            lse = tl.load(LSE + offs_m)
            delta = tl.load(DELTA + offs_m)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # [BN, BM], log2 units
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # [BN, BM]
        p_t, dz_t = bwd_probs(s_t, dp_t, lse[None, :], delta[None, :], bias_arg, offs_m[None, :], offs_n[:, None],
                              T, MASK, BIAS)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)  # [BN, BDV]
        # In dO's dtype, not the rows': PaTH's fp16 meeting points beside bf16 gradients (a no-op elsewhere).
        dk += tl.dot(dz_t.to(do.dtype), q.to(do.dtype), input_precision=PRECISION)  # [BN, BD]
        col += tl.sum(dz_t, axis=1)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(dz_t.to(do.dtype)), k.to(do.dtype), input_precision=PRECISION)  # [BM, BD]
            ptrs = DQA + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            tl.atomic_add(ptrs, dq, mask=(offs_m[:, None] < T) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")
            if BIAS != "none":
                tl.atomic_add(DBRA + offs_m, tl.sum(dz_t, axis=0), mask=offs_m < T, sem="relaxed")
    return dk, dv, col


@triton.jit
def _bwd_tile(q, k, v, do, lse, delta, bias_arg, offs_m, offs_n, T, qk_scale,
              MASK: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """One (query block, key block) tile in the query-rows orientation: ``(p, dz)``, both ``[BM, BN]``
    fp32, from ``q [BM, BD]``, ``k [BN, BD]``, ``v [BN, BDV]``, ``do [BM, BDV]`` (:func:`bwd_probs`)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BM, BN], log2 units
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # [BM, BN]
    return bwd_probs(s, dp, lse[:, None], delta[:, None], bias_arg, offs_m[:, None], offs_n[None, :], T, MASK, BIAS)


@triton.jit
def dq_steps(dq, row, q, do, lse, delta, K, V, bias_arg, offs_m, lo, hi, T, qk_scale, stride_kt, stride_vt,
             HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             INNER: tl.constexpr, MASK: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key tiles ``[lo, hi)`` (``INNER`` keys each) into one query block's ``dQ`` (unscaled) and
    row sums of ``dz``.  Unmasked tiles leave rows past ``T`` with garbage that is never stored."""
    for start_n in range(lo, hi, INNER):
        offs_n = start_n + tl.arange(0, INNER)
        k, v = _row_pair(K, V, offs_n, stride_kt, stride_vt, T, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, MASK)
        p, dz = _bwd_tile(q, k, v, do, lse, delta, bias_arg, offs_m, offs_n, T, qk_scale, MASK, BIAS, PRECISION)
        dq += tl.dot(dz.to(do.dtype), k.to(do.dtype), input_precision=PRECISION)  # [BM, BD], as in dkdv_steps
        row += tl.sum(dz, axis=1)
    return dq, row


@triton.jit
def _flash_bwd(Q, K, V, DO, LSE, DELTA, BIAS_ARG, DQ, DK, DV, DBR, DBC, T, qk_scale, scale,
               stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
               HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               OUTER: tl.constexpr, INNER: tl.constexpr, BIAS: tl.constexpr, PRECISION: tl.constexpr,
               ATOMIC_DQ: tl.constexpr):
    """The backward pass of :func:`_flash_fwd`, FlashAttention-2's way: nothing ``T x T`` is stored.

    Grid ``(blocks of OUTER rows, BH, 2)``.  Programs with ``program_id(2) == 0`` own a block of
    ``OUTER`` keys and walk the queries at or after it, ``INNER`` at a time, accumulating
    ``dK = scale dz^T Q``, ``dV = p^T dO`` and the column sums of ``dz``; programs with
    ``program_id(2) == 1`` own a block of ``OUTER`` queries and walk the keys at or before it,
    accumulating ``dQ = scale dz K`` and the row sums of ``dz``.  Both recompute ``p`` and ``dz``
    tile by tile (:func:`_bwd_tile`): a large block kept on chip, small tiles streamed past it.
    Each walk is split into loops with and without masks (a runtime branch inside one loop
    gave wrong ``dK``/``dV`` for 16-bit inputs with triton 3.6 on an H100, where fp32 and the
    interpreter were right).  ``dQ``, ``dK``, ``dV`` have the strides of ``Q``, ``K``, ``V``;
    ``DO`` those of ``V``.  The bias's gradient is assembled from the sums on the host: a logit's
    bias ``g(i) - g(j)`` gets ``dz_ij`` through ``g(i)`` (row sums, ``DBR``) and ``-dz_ij`` through
    ``g(j)`` (column sums, ``DBC``), both ``(BH, T)`` fp32.

    ``ATOMIC_DQ``: grid ``(blocks, BH, 1)``, the key role alone; it adds ``dQ`` (unscaled) and the row sums
    into the zeroed fp32 ``DQ`` ``(BH, T, HEAD_DIM)`` and ``DBR`` with atomic adds (:func:`dkdv_steps`).
    """
    bh = tl.program_id(1).to(tl.int64)
    start = tl.program_id(0) * OUTER
    offs_b = start + tl.arange(0, OUTER)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    Q, K, V, DO = Q + bh * stride_qb, K + bh * stride_kb, V + bh * stride_vb, DO + bh * stride_vb
    LSE, DELTA = LSE + bh * T, DELTA + bh * T  # this head's rows
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    CHECK_DV: tl.constexpr = BLOCK_DV != HEAD_DV
    bias_arg = 0.0
    if BIAS == "alibi":
        bias_arg = tl.load(BIAS_ARG + bh) * 1.4426950408889634
    elif BIAS == "loggate":
        bias_arg = BIAS_ARG + bh * T
    diag_end = tl.minimum(start + OUTER, T)
    if tl.program_id(2) == 0:
        # dK, dV for keys [start, start + OUTER): the query tiles on the diagonal (masked), the whole
        # tiles after them (unmasked), and a last partial tile (masked: rows past T).
        k = load_rows(K, offs_b, offs_d, stride_kt, T, HEAD_DIM, True, CHECK_D)  # [BN, BD]
        v = load_rows(V, offs_b, offs_dv, stride_vt, T, HEAD_DV, True, CHECK_DV)  # [BN, BDV]
        dk = tl.zeros([OUTER, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([OUTER, BLOCK_DV], dtype=tl.float32)
        col = tl.zeros([OUTER], dtype=tl.float32)
        whole_end = (T // INNER) * INNER
        DQA = DQ + bh * T * HEAD_DIM  # with ATOMIC_DQ: this head's fp32 accumulator
        DBRA = DBR + bh * T
        dk, dv, col = dkdv_steps(dk, dv, col, k, v, Q, DO, LSE, DELTA, bias_arg, offs_b, start, diag_end, T,
                                 qk_scale, stride_qt, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER, True,
                                 BIAS, PRECISION, DQA, DBRA, ATOMIC_DQ)
        dk, dv, col = dkdv_steps(dk, dv, col, k, v, Q, DO, LSE, DELTA, bias_arg, offs_b, start + OUTER, whole_end,
                                 T, qk_scale, stride_qt, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER,
                                 False, BIAS, PRECISION, DQA, DBRA, ATOMIC_DQ)
        dk, dv, col = dkdv_steps(dk, dv, col, k, v, Q, DO, LSE, DELTA, bias_arg, offs_b,
                                 tl.maximum(whole_end, start + OUTER), T, T, qk_scale, stride_qt, stride_vt,
                                 HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER, True, BIAS, PRECISION, DQA, DBRA,
                                 ATOMIC_DQ)
        store_rows(DK + bh * stride_kb, dk * scale, offs_b, offs_d, stride_kt, T, HEAD_DIM)
        store_rows(DV + bh * stride_vb, dv, offs_b, offs_dv, stride_vt, T, HEAD_DV)
        if BIAS != "none":
            tl.store(DBC + bh * T + offs_b, col, mask=offs_b < T)
    else:
        # dQ for queries [start, start + OUTER): the key tiles before them (unmasked), then on the diagonal.
        q = load_rows(Q, offs_b, offs_d, stride_qt, T, HEAD_DIM, True, CHECK_D)  # [BM, BD]
        do = load_rows(DO, offs_b, offs_dv, stride_vt, T, HEAD_DV, True, CHECK_DV)  # [BM, BDV]
        lse = tl.load(LSE + offs_b, mask=offs_b < T, other=0.0)
        delta = tl.load(DELTA + offs_b, mask=offs_b < T, other=0.0)
        dq = tl.zeros([OUTER, BLOCK_D], dtype=tl.float32)
        row = tl.zeros([OUTER], dtype=tl.float32)
        dq, row = dq_steps(dq, row, q, do, lse, delta, K, V, bias_arg, offs_b, 0, start, T, qk_scale, stride_kt,
                           stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER, False, BIAS, PRECISION)
        dq, row = dq_steps(dq, row, q, do, lse, delta, K, V, bias_arg, offs_b, start, diag_end, T, qk_scale,
                           stride_kt, stride_vt, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, INNER, True, BIAS, PRECISION)
        store_rows(DQ + bh * stride_qb, dq * scale, offs_b, offs_d, stride_qt, T, HEAD_DIM)
        if BIAS != "none":
            tl.store(DBR + bh * T + offs_b, row, mask=offs_b < T)


@triton.jit
def _bwd_delta(O, DO, DELTA, T, stride_ob, stride_ot, HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """``delta_i = dO_i . O_i`` for ``BLOCK_T`` rows of one head, fp32 (the backward's pre-pass)."""
    bh = tl.program_id(1).to(tl.int64)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_dv = tl.arange(0, BLOCK_DV)
    o = load_rows(O + bh * stride_ob, offs_t, offs_dv, stride_ot, T, HEAD_DV, True, BLOCK_DV != HEAD_DV)
    do = load_rows(DO + bh * stride_ob, offs_t, offs_dv, stride_ot, T, HEAD_DV, True, BLOCK_DV != HEAD_DV)
    tl.store(DELTA + bh * T + offs_t, tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1), mask=offs_t < T)


def bwd_delta(out, do) -> torch.Tensor:
    """``delta_i = dO_i . O_i`` (fp32 ``(BH, T)``) of ``(BH, T, Dv)`` outputs and their gradients, one
    launch (the backward's pre-pass; PaTH's backward uses it too)."""
    BH, T, Dv = out.shape
    delta = torch.empty(BH, T, dtype=torch.float32, device=out.device)
    block_t = 64 if interpreting() else 128
    _bwd_delta[(triton.cdiv(T, block_t), BH)](
        O=out, DO=do, DELTA=delta,
        T=T,
        **row_strides(o=out),
        HEAD_DV=Dv, BLOCK_DV=next_pow2(Dv), BLOCK_T=block_t,
    )
    return delta


# Backward tiles: a block of OUTER keys (queries) stays on chip while tiles of INNER queries (keys) stream
# past it.  OUTER % INNER == 0, so that the diagonal region is whole inner tiles.  Two pipeline stages
# only: with three stages and 32-row inner tiles, dK came out wrong on an H100 with triton 3.6 (relative
# RMS 3e-2 to 8e-2 against fp32, every other gradient right; kernels/NOTES_flash.md, "Compiler faults to
# remember").
_BWD_CONFIGS = [
    triton.Config({"OUTER": o, "INNER": i}, num_warps=w, num_stages=2)
    for o, i, w in [(64, 64, 4), (128, 32, 4), (128, 32, 8), (128, 64, 8), (64, 32, 4), (128, 128, 8)]
]
_FP32_BWD_CONFIG = dict(OUTER=32, INNER=32, num_warps=4, num_stages=2)
_BWD_KEY = ["T", "HEAD_DIM", "HEAD_DV", "BIAS", "PRECISION"]
_flash_bwd_tuned = triton.autotune(_BWD_CONFIGS, key=_BWD_KEY)(_flash_bwd)
# The single-pass variant accumulates with atomic adds: every config the autotuner tries, and the chosen one's
# final launch, must start from zeroed accumulators.
_flash_bwd_atomic_tuned = triton.autotune(_BWD_CONFIGS, key=_BWD_KEY, reset_to_zero=["DQ", "DBR"])(_flash_bwd)

# Measured on an H100 (B = H = 32, D = 64, bf16, forward + backward, kernels/NOTES_flash.md, "dQ by atomic additions"): without a bias the
# single pass is faster from T = 4096 (1.29 / 1.25x SDPA at 4096 / 8192 against 1.31 / 1.31x) and slower below
# (1.28 / 1.32x at 1024 / 2048 against 1.11 / 1.21x: half the programs, and the atomics' traffic); with FoX's gate
# it is slower at every T (1.91-1.95x against 1.43-1.51x).
SINGLE_PASS_MIN_T = 4096


def single_pass(bias: str, T: int) -> bool:
    """Whether the backward of a ``bias`` (``"none"``, ``"alibi"``, ``"loggate"``) attention over ``T`` tokens takes
    the single pass when the caller does not choose (``atomic_dq=None``): no bias and ``T >= SINGLE_PASS_MIN_T``.

    The backward has two schedules: FlashAttention-2's single pass (dQ by atomic adds, five tile products per pair
    of tiles) and two roles without atomics (seven).  :func:`attention`'s ``atomic_dq`` picks one (``True`` /
    ``False``) or leaves it to this rule (``None``)."""
    return bias == "none" and T >= SINGLE_PASS_MIN_T


# Tile shapes.  The interpreter's cost grows with the number of program
# instances, so on a CPU one large fixed tile is used; on a GPU the autotuner
# picks among shapes that suit Hopper and Ampere.  BLOCK_M % BLOCK_N == 0 keeps
# the "unmasked blocks, then diagonal blocks" split exact.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [
        (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 3), (64, 32, 4, 4),
    ]
]
# fp32 inputs take the exact ("ieee") dots: a precision path, not a speed path, and
# Triton compiles exact fp32 dots over many tiles for a minute or more per shape.  So
# they get one tile shape instead of the six the autotuner would compile.
_FP32_CONFIG = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
# The careful pass's programs each read this many flags of the fast pass (one vector load).
_FLAG_BLOCK = 1024
# T is part of the key: the best tile for T = 1024 need not be the best for 8192.
_flash_fwd_tuned = triton.autotune(_GPU_CONFIGS, key=["T", "HEAD_DIM", "HEAD_DV", "BIAS", "PRECISION", "ROTATE"])(
    _flash_fwd)


def attention(q, k, v, *, scale=None, alibi_slope=None, log_f=None, atomic_dq=None):
    """Causal softmax attention with an optional additive position bias.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``;
    ``D, Dv`` in 16..128; fp16/bf16/fp32 (fp32 accumulation throughout).
    Logits are ``scale * q_i.k_j + bias_ij`` with ``scale=None`` meaning ``D**-0.5`` and

    * ``alibi_slope`` (float or tensor broadcastable to the leading dims, finite, >= 0):
      ``bias_ij = -slope * (i - j)``;
    * ``log_f`` ``(..., T)``, finite entries <= 0: ``bias_ij = sum_{s=j+1..i} log_f[s]``
      (not multiplied by ``scale``).

    ``atomic_dq``: the backward's schedule, FlashAttention-2's single pass with ``dQ`` added atomically
    (``True``), two roles without atomics (``False``), or the one measured faster for the case (``None``, the
    default: :func:`single_pass`).  Both give the same gradients up to rounding (the atomic adds' order is not
    fixed, so the single pass's ``dQ`` is not bitwise reproducible).

    Every argument is validated here (values read once the kernel is queued).  When
    autograd wants gradients (of ``q, k, v``, ``alibi_slope`` or ``log_f``), the output has
    a ``grad_fn`` whose backward is one more kernel (:class:`_FlashAttention`).
    A NaN or inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at
    positions ``>= t`` only.
    """
    if alibi_slope is not None and log_f is not None:
        raise ValueError("pass at most one of `alibi_slope` and `log_f`")
    if alibi_slope is not None:
        return biased_attention(q, k, v, "alibi", alibi_slope, scale=scale, name="alibi_slope", atomic_dq=atomic_dq)
    if log_f is not None:
        return biased_attention(q, k, v, "loggate", log_f, scale=scale, name="log_f", atomic_dq=atomic_dq)
    return biased_attention(q, k, v, "none", None, scale=scale, atomic_dq=atomic_dq)


def biased_attention(q, k, v, bias: str, bias_arg, *, scale=None, name: str = "", atomic_dq=None):
    """:func:`attention` with the bias hook named: ``bias`` is ``"none"``, ``"alibi"``
    (``bias_arg`` = the slope) or ``"loggate"`` (``bias_arg`` = ``log_f``), and error
    messages call ``bias_arg`` ``name`` (the chapter forms pass ``"slope"``, ``"log_f"``).
    A missing ``bias_arg`` is an error here, never a silent NoPE.  ``atomic_dq``: as in :func:`attention`."""
    if atomic_dq is not None and not isinstance(atomic_dq, bool):
        raise TypeError(f"`atomic_dq` must be True, False or None, got {atomic_dq!r}")
    x = prepare_qkv(q, k, v, backward=True)
    scale = check_scale(scale, x.n.D)
    conditions = ()
    if bias == "alibi":
        bias_arg = per_head(bias_arg, name, x, backward=True)
        conditions = (slope_condition(bias_arg, name),)
    elif bias == "loggate":
        bias_arg = per_token(bias_arg, name, x, backward=True)
    elif bias != "none":
        raise ValueError(f"`bias` must be 'none', 'alibi' or 'loggate', got {bias!r}")
    with checked_after(*conditions) as check:  # the values are read once the kernel is queued
        if bias == "loggate":  # the prefix sums, once, in fp32, outside the kernel; the gates checked as they are read
            bias_arg = cumulative_log_gates(bias_arg, name, check)
        return x.result(flat_attention(x, scale, bias, bias_arg, atomic_dq=atomic_dq))


def attention_launch(x: Flat, scale: float, bias: str = "none", bias_arg=None, lse=None,
                     rotate=None) -> torch.Tensor:
    """Launch on validated inputs (:func:`._launch.prepare_qkv`): returns ``(BH, T, Dv)``.
    ``bias_arg``: fp32 ``(BH,)`` slopes or ``(BH, T)`` cumulative log gates.  ``lse``: an fp32
    ``(BH, T)`` tensor that receives each row's log-sum-exp (log2 units), for the backward pass.
    ``rotate``: ``(base, pairing)`` to turn q and k by RoPE's rotations as they are loaded (the rotation
    hook; ``pairing`` ``"interleaved"`` or ``"half"``, ``D`` even), or None."""
    n = x.n
    out = x.new_output(n.Dv)
    if x.empty_input:
        return out
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                BIAS=bias, PRECISION=dot_precision(x.dtype), STORE_LSE=lse is not None)
    meta["ROTATE"], log2_base = rotate_args(rotate)
    # One flag per query block (sized for the smallest BLOCK_M of the configs), written by every fast program.
    flags = torch.empty(x.BH * triton.cdiv(n.T, 16), dtype=torch.int8, device=x.device)
    args = dict(
        Q=x.q, K=x.k, V=x.v, O=out, BIAS_ARG=x.q if bias_arg is None else bias_arg, LSE=x.q if lse is None else lse,
        FLAGS=flags,
        T=n.T, qk_scale=scale * LOG2E, log2_base=log2_base,
        **row_strides(q=x.q, k=x.k, v=x.v, o=out),
    )
    if interpreting():
        bm = 32 if n.T <= 32 else 64
        tiles = dict(BLOCK_M=bm, BLOCK_N=bm)
        _flash_fwd[(triton.cdiv(n.T, bm), x.BH)](**args, **tiles, **meta)
    elif meta["PRECISION"] == "ieee":
        tiles = dict(_FP32_CONFIG)
        _flash_fwd[(triton.cdiv(n.T, tiles["BLOCK_M"]), x.BH)](**args, **tiles, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["BLOCK_M"]), x.BH)  # noqa: E731
        _flash_fwd_tuned[grid](**args, **meta)
        best = _flash_fwd_tuned.best_config
        tiles = dict(best.kwargs, num_warps=best.num_warps, num_stages=best.num_stages)
    # The careful pass, with the fast pass's tiles (the same bits for every row): one small launch that
    # reads the flags and, unless a value was NaN or inf, does nothing else.
    n_flags = x.BH * triton.cdiv(n.T, tiles["BLOCK_M"])
    _flash_careful[(triton.cdiv(n_flags, _FLAG_BLOCK),)](
        n_blocks=triton.cdiv(n.T, tiles["BLOCK_M"]), n_flags=n_flags,
        **args, **tiles, **meta, BLOCK_F=_FLAG_BLOCK,
    )
    return out


def _attention_bwd_launch(x: Flat, do, out, lse, scale: float, bias: str, bias_arg, _config=None,
                          atomic_dq=None):
    """The backward kernel on the forward's validated inputs ``x``, its output ``out`` and
    log-sum-exp ``lse``; ``do``: ``(BH, T, Dv)``.  Returns ``dq, dk, dv`` (compute dtype) and
    the row and column sums of ``dz`` (fp32 ``(BH, T)``; None without a bias).  ``_config``:
    fixed tiles (``OUTER``, ``INNER``, ...) instead of the defaults (tests).  ``atomic_dq``: the
    single pass with atomic adds or not (default :func:`single_pass`)."""
    n = x.n
    atomic = single_pass(bias, n.T) if atomic_dq is None else bool(atomic_dq)
    do = do.to(x.dtype).contiguous()
    dk, dv = torch.empty_like(x.k), torch.empty_like(x.v)
    rows = cols = None
    if bias != "none":
        rows = (torch.zeros if atomic else torch.empty)(x.BH, n.T, dtype=torch.float32, device=x.device)
        cols = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
    if x.empty_input:
        return torch.zeros_like(x.q), dk.zero_(), dv.zero_(), rows, cols
    # The atomic pass adds into an fp32 accumulator (and row sums, a real buffer even without a bias, since the
    # autotuner zeroes it between trials); the two-role pass writes dQ once, in the inputs' dtype.
    dq = torch.zeros(x.BH, n.T, n.D, dtype=torch.float32, device=x.device) if atomic else torch.empty_like(x.q)
    delta = bwd_delta(out, do)
    precision = dot_precision(x.dtype)
    dummy = delta
    if atomic and rows is None:
        dummy_rows = torch.zeros(x.BH, n.T, dtype=torch.float32, device=x.device)
    else:
        dummy_rows = dummy if rows is None else rows
    args = dict(
        Q=x.q, K=x.k, V=x.v, DO=do, LSE=lse, DELTA=delta, BIAS_ARG=dummy if bias_arg is None else bias_arg, DQ=dq,
        DK=dk, DV=dv, DBR=dummy_rows, DBC=dummy if cols is None else cols,
        T=n.T, qk_scale=scale * LOG2E, scale=scale,
        **row_strides(q=x.q, k=x.k, v=x.v),
    )
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv), BIAS=bias,
                PRECISION=precision, ATOMIC_DQ=atomic)
    roles = 1 if atomic else 2
    if _config is not None:
        _flash_bwd[(triton.cdiv(n.T, _config["OUTER"]), x.BH, roles)](**args, **_config, **meta)
    elif interpreting():  # few large programs: the interpreter's cost is per program
        block = 32 if n.T <= 32 else 64
        _flash_bwd[(triton.cdiv(n.T, block), x.BH, roles)](**args, OUTER=block, INNER=block, **meta)
    elif precision == "ieee":
        _flash_bwd[(triton.cdiv(n.T, _FP32_BWD_CONFIG["OUTER"]), x.BH, roles)](**args, **_FP32_BWD_CONFIG, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["OUTER"]), x.BH, roles)  # noqa: E731
        (_flash_bwd_atomic_tuned if atomic else _flash_bwd_tuned)[grid](**args, **meta)
    if atomic:
        dq = (dq * scale).to(x.dtype)
    return dq, dk, dv, rows, cols


class _FlashAttention(torch.autograd.Function):
    """:func:`attention_launch` with a backward pass (:func:`_attention_bwd_launch`).

    Inputs: the flattened ``q, k, v`` of a :class:`._launch.Flat` (``flat``, whose sizes and
    dtype are reused), ``bias_arg`` (None, the ``(BH,)`` slopes or the ``(BH, T)`` cumulative
    log gates ``c``), ``scale`` and ``bias``.  Saves ``q, k, v``, the output and the log-sum-exp
    (``O(T)`` per head) and recomputes everything else.  The bias's gradient: for ``c``,
    ``dc = rows - cols`` (``c_i`` enters row ``i``'s logits, ``-c_j`` column ``j``'s); for a slope,
    ``d slope = sum_j j cols_j - sum_i i rows_i`` (the bias is ``-slope (i - j)``).
    """

    @staticmethod
    def forward(ctx, q3, k3, v3, bias_arg, flat, scale, bias, atomic_dq):
        x = Flat(flat.n, q3, k3, v3, flat.dtype, flat.like)
        lse = torch.empty(x.BH, x.n.T, dtype=torch.float32, device=x.device)
        out = attention_launch(x, scale, bias, bias_arg, lse=lse)
        ctx.save_for_backward(q3, k3, v3, out, lse, bias_arg)
        ctx.flat, ctx.scale, ctx.bias, ctx.atomic_dq = flat, scale, bias, atomic_dq
        return out

    @staticmethod
    def backward(ctx, do):
        q3, k3, v3, out, lse, bias_arg = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        dq, dk, dv, rows, cols = _attention_bwd_launch(x, do, out, lse, ctx.scale, ctx.bias, bias_arg,
                                                       atomic_dq=ctx.atomic_dq)
        d_bias = None
        if ctx.bias == "loggate":
            d_bias = rows - cols
        elif ctx.bias == "alibi":
            pos = torch.arange(x.n.T, dtype=torch.float32, device=x.device)
            d_bias = ((cols - rows).double() @ pos.double()).float()  # float64: two large sums cancel
        return dq, dk, dv, d_bias, None, None, None, None


def flat_attention(x: Flat, scale: float, bias: str = "none", bias_arg=None, *, atomic_dq=None) -> torch.Tensor:
    """:func:`attention_launch`, through :class:`_FlashAttention` when autograd wants gradients
    (of ``x.q, x.k, x.v`` or ``bias_arg``): the one entry the public functions call.  ``atomic_dq``: the
    backward's schedule (:func:`attention`)."""
    if wants_grad(x.q, x.k, x.v, bias_arg):
        return _FlashAttention.apply(x.q, x.k, x.v, bias_arg, x, scale, bias, atomic_dq)
    return attention_launch(x, scale, bias, bias_arg)
