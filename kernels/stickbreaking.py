r"""Stick-breaking attention forward: key blocks scanned right to left, the remaining stick carried.

Stick-breaking attention (:mod:`pathedu.stickbreaking`) has no softmax.  With
``z_ij = scale * q_i . k_j`` and keys strictly before the query::

    log A_ij = log sigma(z_ij) + sum_{m=j+1..i-1} log sigma(-z_im),     o_i = sum_{j<i} A_ij v_j

Each weight needs the gates of every key *between* it and the query, so a query
block visits its key blocks **right to left**, from the diagonal back to 0, as
PaTH's kernel does (:mod:`.path_attention`), and carries one number per row
instead of a query: ``c_i = sum log sigma(-z_im)`` over the keys already passed,
the log of the stick those keys left over (``c = 0`` at the start).

**One softplus per logit.**  ``log sigma(z) = z - softplus(z)`` and
``log sigma(-z) = -softplus(z)``, so the key's own share folds into the sum of
the gates: ``log A_ij = z_ij + sum_{m=j..i-1} log sigma(-z_im)``, the gates of
``j`` *and* every key right of it, an inclusive reverse sum.  Per tile of
``BLOCK_N`` keys (:func:`_stick_tile`), in base 2 (``s = z log2 e``; ``LOG2E`` is
folded into the scale, so ``exp2`` is one hardware instruction, and ``log2`` can
be: see **Precision**)::

    s      = scale log2(e) q K^T                           [BM, BN], fp32
    g      = -softplus2(s) = log2 sigma(-z)                one exp2 and one log2 per entry
    g      = 0 where j >= i (diagonal tiles; a select)
    log2 w = s + revcumsum(g) + c                          inclusive: j's own gate, those right of it, then c
    acc   += exp2(log2 w) V                                (0 where j >= i)
    c     += rowsum(g)

Three transcendental functions per logit (``exp2``, ``log2``, ``exp2``), where
FlashAttention needs one.  ``revcumsum`` is ``tl.cumsum(..., reverse=True)`` along
the keys (fp32 adds, not a product with a triangular matrix, which the tensor
cores would round to tf32).  This is
:func:`pathedu.stickbreaking.stickbreaking_blockwise`, tile by tile.

**No maximum, no normaliser.**  FlashAttention keeps a running maximum because
``exp(logit)`` overflows and the softmax needs its sum; here every exponent is a
sum of log-sigmoids, ``log w <= 0``, so ``exp`` lies in [0, 1] and cannot
overflow, and a weight is final as soon as it is computed: ``acc`` is never
rescaled and the output is ``acc`` itself.  (A weight that underflows to 0 is
below any value's resolution.)

**Precision, and the one instruction that costs the most.**
``softplus2(s) = max(s, 0) + log2(1 + e)`` with ``e = 2^-|s|``.  Triton's
``tl.math.log2`` is an accurate library routine, many instructions long; on the
H100 it made the kernel about 1.25x slower than the same loop with the hardware's
one-instruction approximation (``lg2.approx``, error about 2^-22; measured, see
``kernels/NOTES_flash.md``).  So 16-bit inputs on a GPU take the approximation
(``FAST_LOG2``): its error is far below what a bf16 output keeps.  fp32 inputs
(and the interpreter, which cannot run PTX) take the accurate routine, and more:
a plain ``log2(1 + e)`` rounds every ``e`` below 6e-8 to 0, and those lost gates
are all of one sign, so over thousands of keys that barely break the stick the
bias adds up.  :func:`_softplus2` corrects ``log2(u)``, ``u = 1 + e``, by the
rounding error of ``u`` itself (``(u - 1) - e``, exact in fp32), which keeps a
tiny gate's leading digits without a division.  ``s`` comes from a product in
the input dtype (fp32: exact ``"ieee"`` dots), everything after it in fp32;
``w`` is rounded to the input dtype as a product operand, as FlashAttention
rounds ``p``.

**Non-finite inputs.**  Gates of hidden keys are replaced by 0 *before* the
cumulative sum, and diagonal tiles multiply through :func:`._pieces._masked_dot`
with the rows that see a NaN/inf value given it back by :func:`._pieces._poison`
(a row ``i`` sees the keys ``<= i - 1``): a NaN or inf in ``q``, ``k`` or ``v`` at
position ``t`` changes outputs at positions ``>= t`` only.

Forward only: :func:`stickbreaking_attention` refuses inputs that require grad
while grad mode is on (:func:`._launch.refuse_grad`).  Inputs are validated once,
there (see :mod:`._launch`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_positive_int, check_scale
from ._launch import Flat, dot_precision, interpreting, next_pow2, prepare_qkv
from ._pieces import (LOG2E, _first_nonfinite, _load_rows, _log2_approx, _masked_dot, _no_nonfinite, _poison,
                      _query_block, _store_rows)

__all__ = ["stickbreaking_attention"]


@triton.jit
def _softplus2(s, FAST_LOG2: tl.constexpr):
    """``log2(1 + 2^s)`` of an fp32 tile: one ``exp2`` and one ``log2``.

    ``max(s, 0) + log2(u)`` with ``u = 1 + 2^-|s|``.  Accurate (``FAST_LOG2`` false: fp32 inputs and the
    interpreter): minus the rounding error of ``u`` (``(u - 1) - e``, exact) times ``d log2(u) / du`` at
    ``u = 1``, correct to a few ulps where ``log2(u)`` alone would give 0 (``e`` below 6e-8).  Fast (16-bit
    inputs on a GPU): the hardware's approximate ``log2`` (:func:`._pieces._log2_approx`), whose error (about
    2^-22) is far below what a 16-bit output keeps, and then the correction would change nothing."""
    e = tl.math.exp2(-tl.abs(s))
    u = 1.0 + e
    if FAST_LOG2:
        return tl.maximum(s, 0.0) + _log2_approx(u)
    INV_LN2: tl.constexpr = 1.4426950408889634  # d log2(u) / du at u = 1
    return tl.maximum(s, 0.0) + (tl.math.log2(u) - ((u - 1.0) - e) * INV_LN2)


@triton.jit
def _stick_tile(acc, carry, bad, q, K, V, start_n, start_m, offs_m, T, stride_kt, stride_vt, qk_scale,
                HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr, FAST_LOG2: tl.constexpr):
    """Fold key block ``[start_n, start_n + BLOCK_N)`` into ``acc`` ``[BM, BDV]`` and ``carry`` ``[BM]``.

    ``MASKED``: the block reaches the query block (or runs past T): a row ``i`` sees only keys
    ``j < i``; ``bad`` then takes the block's NaN/inf values (:func:`._pieces._first_nonfinite`,
    positions relative to ``start_m``).  Unmasked blocks are whole and every key is seen."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(K, offs_n, tl.arange(0, BLOCK_D), stride_kt, T, HEAD_DIM, MASKED, BLOCK_D != HEAD_DIM)  # [BN, BD]
    v = _load_rows(V, offs_n, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, MASKED,
                   BLOCK_DV != HEAD_DV)  # [BN, BDV]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BM, BN] fp32, base 2
    g = -_softplus2(s, FAST_LOG2)  # [BM, BN]: log2 sigma(-z), each key's gate
    if MASKED:
        seen = offs_n[None, :] < offs_m[:, None]  # [BM, BN]: strictly causal
        g = tl.where(seen, g, 0.0)  # a hidden key breaks nothing (and its NaN stays out)
    # log2 sigma(z_j) = s_j + g_j: j's own share, then the gates right of j inside the tile
    # (inclusive reverse sum), then those of the blocks already passed.
    w = tl.math.exp2(s + tl.cumsum(g, axis=1, reverse=True) + carry[:, None])  # [BM, BN], in [0, 1]
    if MASKED:
        w = tl.where(seen, w, 0.0)
        acc = _masked_dot(w.to(v.dtype), v, acc, PRECISION)
        bad = _first_nonfinite(v, offs_n - start_m, bad)
    else:
        acc = tl.dot(w.to(v.dtype), v, acc=acc, input_precision=PRECISION)  # [BM, BDV]
    carry += tl.sum(g, axis=1)  # [BM]: the stick this block left over, in log2
    return acc, carry, bad


@triton.jit
def _stickbreaking_fwd(Q, K, V, O, T, qk_scale,
                       stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                       HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                       FAST_LOG2: tl.constexpr):
    """One program per block of ``BLOCK_M`` queries of one (batch, head); ``BLOCK_M = R * BLOCK_N``.

    Key blocks right to left: first the ``R`` blocks inside the query block (masked), then every
    whole block strictly left of it (no mask).  Grid ``(query blocks, BH)``, heaviest first."""
    R: tl.constexpr = BLOCK_M // BLOCK_N
    bh, start_m, offs_m = _query_block(BLOCK_M)
    K += bh * stride_kb
    V += bh * stride_vb
    q = _load_rows(Q + bh * stride_qb + start_m * stride_qt, tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D),
                   stride_qt, T - start_m, HEAD_DIM, True, BLOCK_D != HEAD_DIM)  # [BM, BD]
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    carry = tl.zeros([BLOCK_M], dtype=tl.float32)  # log2 of the stick left: log2 1 = 0
    bad = _no_nonfinite(BLOCK_DV)
    # The diagonal region, right to left (keys past T load as 0 and are hidden: j >= T > i).
    for c in tl.static_range(R):
        acc, carry, bad = _stick_tile(acc, carry, bad, q, K, V, start_m + (R - 1 - c) * BLOCK_N, start_m, offs_m, T,
                                      stride_kt, stride_vt, qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                      True, PRECISION, FAST_LOG2)
    # The region multiplied values without their NaN/inf; the rows that see one (keys <= i - 1) get it back.
    acc = _poison(acc, offs_m - start_m - 1, bad)
    # Key blocks strictly left of the query block, right to left: whole, and seen by every row.
    for jj in range(0, start_m // BLOCK_N):
        acc, carry, bad = _stick_tile(acc, carry, bad, q, K, V, start_m - (jj + 1) * BLOCK_N, start_m, offs_m, T,
                                      stride_kt, stride_vt, qk_scale, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
                                      False, PRECISION, FAST_LOG2)
    _store_rows(O + bh * stride_ob, acc, offs_m, tl.arange(0, BLOCK_DV), stride_ot, T, HEAD_DV)


# Tile shapes (BLOCK_M, BLOCK_N).  fp32 takes exact dots, slow to compile: one shape.  16-bit inputs
# let the autotuner choose; on the H100 at D = 64 it picks 64 x 32 (2 or 4 warps) or 128 x 32: the narrow
# key tiles keep the [BM, BN] fp32 tiles of logits, gates and weights in registers.  BLOCK_M % BLOCK_N == 0 keeps the "diagonal, then whole blocks" split exact.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (64, 32, 2, 3), (128, 32, 4, 3)]
]
_FP32_CONFIG = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
_stickbreaking_fwd_tuned = triton.autotune(_GPU_CONFIGS, key=["T", "HEAD_DIM", "HEAD_DV", "PRECISION"])(
    _stickbreaking_fwd)


def stickbreaking_attention(q, k, v, *, scale=None):
    """Causal stick-breaking attention (forward only)::

        A_ij = sigma(z_ij) prod_{m=j+1..i-1} (1 - sigma(z_im))  (j < i),   o_i = sum_{j<i} A_ij v_j

    with ``z_ij = scale * q_i . k_j``, ``scale=None`` meaning ``D ** -0.5``; ``o_0 = 0``.
    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``; ``D, Dv`` in 16..128;
    fp16/bf16/fp32 (fp32 accumulation).  There is no backward pass: inputs that require grad are
    refused while grad mode is on (call it under ``torch.no_grad()``, or train through
    :func:`pathedu.stickbreaking.stickbreaking_matrix`).  Every argument is validated here.
    """
    x = prepare_qkv(q, k, v)
    scale = check_scale(scale, x.n.D)
    return x.result(_stickbreaking_launch(x, scale))


def _stickbreaking_launch(x: Flat, scale: float, *, block_m=None, block_n=None) -> torch.Tensor:
    """Launch on validated inputs (:func:`._launch.prepare_qkv`): returns ``(BH, T, Dv)``.
    ``block_m``, ``block_n``: fixed tiles (powers of two, ``block_m`` a multiple of ``block_n``;
    tests use small ones to make the carry cross several blocks), else the defaults."""
    n = x.n
    out = x.new_output(n.Dv)
    if x.empty_input:
        return out
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                PRECISION=dot_precision(x.dtype), FAST_LOG2=not interpreting() and x.dtype != torch.float32)
    args = (x.q, x.k, x.v, out, n.T, scale * LOG2E, x.q.stride(0), x.q.stride(1), x.k.stride(0), x.k.stride(1),
            x.v.stride(0), x.v.stride(1), out.stride(0), out.stride(1))
    if block_m is not None or block_n is not None:
        bm, bn = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
        if bm % bn or bm & (bm - 1) or bn & (bn - 1):
            raise ValueError(f"`block_m` ({bm}) must be a multiple of `block_n` ({bn}), both powers of two")
        _stickbreaking_fwd[(triton.cdiv(n.T, bm), x.BH)](*args, BLOCK_M=bm, BLOCK_N=bn, **meta)
    elif interpreting():  # few large programs: the interpreter's cost is per program and loop trip
        bm = 16 if n.T <= 16 else 32 if n.T <= 32 else 64
        _stickbreaking_fwd[(triton.cdiv(n.T, bm), x.BH)](*args, BLOCK_M=bm, BLOCK_N=bm, **meta)
    elif meta["PRECISION"] == "ieee":
        _stickbreaking_fwd[(triton.cdiv(n.T, _FP32_CONFIG["BLOCK_M"]), x.BH)](*args, **_FP32_CONFIG, **meta)
    else:
        grid = lambda META: (triton.cdiv(n.T, META["BLOCK_M"]), x.BH)  # noqa: E731
        _stickbreaking_fwd_tuned[grid](*args, **meta)
    return out
