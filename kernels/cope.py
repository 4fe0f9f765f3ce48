r"""CoPE (contextual position encoding): the FlashAttention template scanning right to left.

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
rescales), so the template's update :func:`._pieces._softmax_fold` is reused as is: guarded and
masked on the diagonal tile (rows past ``T`` see nothing; hidden keys multiply through
:func:`._pieces._masked_dot`), plain on the tiles left of it.  Query and key blocks have one
size, so the diagonal region is one tile.  The diagonal tile's values are folded into
:func:`._pieces._first_nonfinite` and :func:`._pieces._poison` gives their NaN/inf back to the
rows that see them: a NaN or inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at
positions ``>= t`` only (a NaN count indexes row 0 of ``qe``, never memory out of bounds; the
logit is NaN through ``z`` anyway).

Precision: ``z``, gates, counts, the interpolation and the softmax are fp32 whatever the input
dtype; the two products (``q K^T`` and ``p V``) take the input dtype, as in the template.
Forward only: inputs that require grad are refused while grad mode is on (use
:func:`pathedu.cope.cope_matrix` to train).  Inputs are validated once, at
:func:`cope_attention` (see :mod:`._launch`).

**Measured** (one H100, triton 3.6, torch 2.11; a first look with 64-row tiles, before they were found
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
from ._launch import Flat, dot_precision, interpreting, next_pow2, prepare_qkv, refuse_grad
from ._pieces import _first_nonfinite, _load_rows, _no_nonfinite, _poison, _query_block, _softmax_fold, _store_rows

__all__ = ["cope_attention"]


@triton.jit
def _cope_tile(acc, m_i, l_i, carry, q, K, V, QE, offs_m, start_n, T, P, scale, stride_kt, stride_vt, stride_et,
               HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr, DIAG: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key block ``[start_n, start_n + BLOCK_N)`` into ``(acc, m_i, l_i)`` and the carried counts.

    ``DIAG``: the tile holds the diagonal (hidden keys and keys past ``T``: gates 0, logits -inf);
    otherwise every key is visible and whole.  Returns the values tile too (for the non-finite
    bookkeeping of the diagonal)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(K, offs_n, tl.arange(0, BLOCK_D), stride_kt, T, HEAD_DIM, DIAG, BLOCK_D != HEAD_DIM)  # [BN, BD]
    v = _load_rows(V, offs_n, tl.arange(0, BLOCK_DV), stride_vt, T, HEAD_DV, DIAG, BLOCK_DV != HEAD_DV)  # [BN, BDV]
    z = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BM, BN], natural units
    g = tl.sigmoid(z)  # [BM, BN], the gates
    if DIAG:
        visible = offs_m[:, None] >= offs_n[None, :]  # [BM, BN]
        g = tl.where(visible, g, 0.0)  # a select: a NaN key never reaches an earlier row
    p = tl.cumsum(g, axis=1, reverse=True) + carry[:, None]  # [BM, BN]: sum_{m=j..i} g_im
    carry += tl.sum(g, axis=1)  # [BM]
    p = tl.where(p > P - 1.0, P - 1.0, p)  # clamp to [0, P - 1] (p >= 0 already; NaN stays NaN)
    p = tl.where(p < 0.0, 0.0, p)
    lo = tl.where(p == p, p, 0.0).to(tl.int32)  # [BM, BN], floor (p >= 0); a NaN count reads row 0
    w = p - lo.to(tl.float32)  # [BM, BN], the weight of the upper neighbour
    hi = tl.minimum(lo + 1, P - 1)  # = ceil p wherever w > 0
    row = QE + offs_m[:, None] * stride_et  # [BM, 1] pointers to the rows of qe
    in_t = offs_m[:, None] < T
    e_lo = tl.load(row + lo, mask=in_t, other=0.0)  # [BM, BN], a gather: qe[i, lo_ij]
    e_hi = tl.load(row + hi, mask=in_t, other=0.0)  # [BM, BN], qe[i, hi_ij]
    s = (z + (1.0 - w) * e_lo + w * e_hi) * 1.4426950408889634  # [BM, BN], log2 units
    if DIAG:
        s = tl.where(visible, s, float("-inf"))
    acc, m_i, l_i = _softmax_fold(acc, m_i, l_i, s, v, DIAG, DIAG, PRECISION)
    return acc, m_i, l_i, carry, v


@triton.jit
def _cope_fwd(Q, K, V, QE, O, T, P, scale,
              stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_eb, stride_et,
              stride_ob, stride_ot,
              HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
              BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    """CoPE's forward, one program per (block of ``BLOCK`` queries, head), heaviest first: grid
    ``(cdiv(T, BLOCK), BH)``.

    ``Q, K: (BH, T, D)``, ``V, O: (BH, T, Dv)``, ``QE = Q E^T: (BH, T, P)`` fp32.  The diagonal tile first, then
    key blocks right to left, carrying each row's sum of gates (:func:`_cope_tile`); the module docstring has
    the counts and the interpolation."""
    bh, start_m, offs_m = _query_block(BLOCK)  # heaviest query blocks first
    K += bh * stride_kb
    V += bh * stride_vb
    QE += bh * stride_eb
    q = _load_rows(Q + bh * stride_qb, offs_m, tl.arange(0, BLOCK_D), stride_qt, T, HEAD_DIM, True,
                   BLOCK_D != HEAD_DIM)  # [BM, BD]
    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_DV], dtype=tl.float32)
    carry = tl.zeros([BLOCK], dtype=tl.float32)  # per row: the gates of the keys already passed
    # The diagonal tile first (the counts start at the query), masked.
    acc, m_i, l_i, carry, v = _cope_tile(acc, m_i, l_i, carry, q, K, V, QE, offs_m, start_m, T, P, scale, stride_kt,
                                         stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK, True,
                                         PRECISION)
    bad = _first_nonfinite(v, tl.arange(0, BLOCK), _no_nonfinite(BLOCK_DV))  # [BDV], packed positions
    # Then the key blocks left of it, right to left: every key visible, every block whole.
    for jj in range(0, start_m // BLOCK):
        start_n = start_m - (jj + 1) * BLOCK
        acc, m_i, l_i, carry, v = _cope_tile(acc, m_i, l_i, carry, q, K, V, QE, offs_m, start_n, T, P, scale,
                                             stride_kt, stride_vt, stride_et, HEAD_DIM, HEAD_DV, BLOCK_D, BLOCK_DV,
                                             BLOCK, False, PRECISION)
    # The diagonal tile multiplied values without their NaN/inf; the rows that see one get it back.
    o = _poison(acc / l_i[:, None], offs_m - start_m, bad)
    _store_rows(O + bh * stride_ob, o, offs_m, tl.arange(0, BLOCK_DV), stride_ot, T, HEAD_DV)


# Tiles: one size for query and key blocks (the diagonal region is one tile).  The interpreter's cost
# is per program and loop trip, so it gets few large blocks.  On a GPU, 32-row tiles and one stage, both
# forced by triton 3.6 on an H100 (probes of 2026-11-23, B = 1, H = 2, T = 1000, D = 128, Dv = 32, bf16):
# with 64-row tiles and 4 warps every row from 16 on came out wrong (relative error 1.33: only the first
# warp's rows were right), with 8 warps the kernel read out of bounds (an illegal address); 32-row tiles
# gave 2.4e-3.  Two stages fail to compile (``PassManager::run failed`` in ``TritonGPUPipeline``, fp16).
# tests/gpu/test_forms.py runs every dtype and head dim through this configuration.
_GPU_CONFIG = dict(BLOCK=32, num_warps=4, num_stages=1)


def _check_block(block) -> int | None:
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, numbers.Integral):
        raise TypeError(f"`block` must be a power of two in 16..128 or None, got {type(block).__name__} {block!r}")
    if block not in (16, 32, 64, 128):
        raise ValueError(f"`block` must be a power of two in 16..128 or None, got {block}")
    return int(block)


def cope_attention(q, k, v, pos_emb, *, scale=None, block=None):
    """Causal CoPE attention, forward only (:func:`pathedu.cope.cope_matrix`'s numbers).

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``pos_emb: (P, D)`` or broadcastable to
    ``(..., P, D)`` -> ``(..., T, Dv)``; ``D, Dv`` in 16..128; fp16/bf16/fp32 (gates, counts and
    the softmax in fp32; ``qe = Q E^T`` taken once in fp32).  ``scale=None`` means ``D ** -0.5``
    (it scales ``q . k``, not the position term).  ``block``: the tile size (16, 32, 64 or 128;
    None: 32 on a GPU, 32 or 64 in the interpreter).  Every argument is validated here (values
    with one host synchronisation); inputs that require grad are refused while grad mode is on.
    """
    x = prepare_qkv(q, k, v)  # refuses q, k, v that require grad
    scale = check_scale(scale, x.n.D)
    P = check_pos_emb(pos_emb, x.n, q)
    refuse_grad(pos_emb, "pos_emb")
    block = _check_block(block)
    require(pos_emb_condition(pos_emb))
    out = x.new_output(x.n.Dv)
    if x.empty_input:
        return x.result(out)
    # The pre-pass: q_i . E[n] for every integer position, fp32, (BH, T, P).
    qe = (x.q.reshape(x.n.lead + (x.n.T, x.n.D)).to(torch.float32)
          @ pos_emb.to(torch.float32).transpose(-1, -2)).reshape(x.BH, x.n.T, P).contiguous()
    _cope_launch(x, qe, P, scale, out, block)
    return x.result(out)


def _cope_launch(x: Flat, qe, P: int, scale: float, out, block=None) -> None:
    """Launch on validated inputs: ``qe`` fp32 ``(BH, T, P)``; writes ``out`` ``(BH, T, Dv)``."""
    n = x.n
    meta = dict(HEAD_DIM=n.D, HEAD_DV=n.Dv, BLOCK_D=next_pow2(n.D), BLOCK_DV=next_pow2(n.Dv),
                PRECISION=dot_precision(x.dtype))
    if block is not None:
        cfg = dict(_GPU_CONFIG, BLOCK=block)
    elif interpreting():
        cfg = dict(BLOCK=32 if n.T <= 32 else 64)
    else:
        cfg = dict(_GPU_CONFIG)
    if interpreting():
        cfg = {"BLOCK": cfg["BLOCK"]}
    _cope_fwd[(triton.cdiv(n.T, cfg["BLOCK"]), x.BH)](
        x.q, x.k, x.v, qe, out, n.T, P, scale,
        x.q.stride(0), x.q.stride(1), x.k.stride(0), x.k.stride(1), x.v.stride(0), x.v.stride(1),
        qe.stride(0), qe.stride(1), out.stride(0), out.stride(1), **cfg, **meta)
