r"""The carries of PaTH's backward pass: queries and keys moved to the boundaries where they meet.

PaTH's backward (:mod:`.path_attention`, :func:`pathedu.path.path_dyadic`) meets query block ``I`` and
key block ``J < I`` at one level ``l``: the blocks are grouped in nodes of ``2^(l+1)``, ``J`` lies in the
left half of its node, ``I`` in the right half, and both are carried to the boundary ``mid`` between
the halves.  With each block's transition in row form, ``Phi_B = P_B^T`` (``(D, D)``), the carries are ::

    right half (queries):  X_I = q~_I C_I,   C_I = Phi_{I-1} ... Phi_mid          (C_mid = I)
    left half  (keys):     X_J = k~_J E_J,   E_J = Phi_{J+1}^T ... Phi_{mid-1}^T  (E_{mid-1} = I)

:func:`_carry_fwd` runs one half per program: a ``D x D`` product carried across the half's blocks
(``C <- Phi_I C`` going right, ``E <- Phi_J^T E`` going left), one ``BT x D x D`` product per block.

The backward is the reversed scan.  For the right half, ``dq~_I = dX_I C_I^T``, and the transition of
block ``B`` collects every later block's query: with ``M_I = q~_I^T dX_I`` (``D x D``) ::

    dPhi_B = S_B C_B^T,     S_B = sum_{I > B in the half} (Phi_{I-1} ... Phi_{B+1})^T M_I,
    S_{B-1} = M_B + Phi_B^T S_B                    (right to left, S = 0 after the last block)

and for the left half, with ``N_J = k~_J^T dX_J`` ::

    dk~_J = dX_J E_J^T,     dPhi_B = E_B U_B^T,    U_B = sum_{J < B in the half} Phi_{B-1} ... Phi_{J+1} N_J,
    U_{B+1} = Phi_B U_B + N_B                      (left to right, U = 0 before the first block)

So each sweep runs *against* the direction in which its carry was built: it needs ``C_B`` (or ``E_B``) in the
order opposite to the one that makes them.  :func:`_carry_fwd` stores every block's carry as it goes
(``keep_carries``; ``D x D`` per block and level, as many numbers as the level's rows of ``X`` when the block is
``D`` rows), and :func:`_carry_bwd` reads them back while it walks the other way with ``S`` (or ``U``).
Rebuilding them in the backward instead, in a first sweep through a scratch tensor, takes 0.85 ms more per
training step at T = 2048 on an H200, where storing them costs the forward 0.27 ms
(``pathedu/data/choice_carries_kept.json``; ``NOTES_path.md``, "The carries").  Every block
belongs to one half per level, so one launch per level writes each gradient row once (level 1's launch, which folds
level 0 in, writes every row; each later one adds to what the levels before left).  Products are
:func:`._pieces.dot` at the preparation pass's precision (:func:`.ut_prepare.prep_precision`).
:func:`carry_forward` and :func:`carry_backward` launch them; :func:`pathedu.path._meeting_points` is the same map in PyTorch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import interpreting, next_pow2
from ._pieces import dot, dot_ready, load_rows, scaled, store_rows
from .ut_prepare import backward_precision, prep_precision


@triton.jit
def _level_zero_rows(QT, KT, X0, b, rows, offs_d, HEAD_DIM: tl.constexpr, BT: tl.constexpr, CHECK_D: tl.constexpr):
    """Block ``b``'s rows of level 0 into ``X0``: ``q~`` for an odd block, ``k~`` for an even one (the caller has
    just read one of the two, so the second read of it is served by the cache)."""
    dtype = X0.dtype.element_ty  # each branch converts, so that both leave x in one dtype
    if b % 2 == 1:
        x = load_rows(QT + b * BT * HEAD_DIM, rows, offs_d, HEAD_DIM, BT, HEAD_DIM, False, CHECK_D).to(dtype)
    else:
        x = load_rows(KT + b * BT * HEAD_DIM, rows, offs_d, HEAD_DIM, BT, HEAD_DIM, False, CHECK_D).to(dtype)
    store_rows(X0 + b * BT * HEAD_DIM, x, rows, offs_d, HEAD_DIM, BT, HEAD_DIM)


@triton.jit
def _carried_rows(SIDE, QT, KT, GM, X, X0, CS, b, carry, rows, offs_d, HEAD_DIM: tl.constexpr, BT: tl.constexpr,
                  CHECK_D: tl.constexpr, CARRY: tl.constexpr, FIRST: tl.constexpr, SAVE: tl.constexpr):
    """Block ``b``'s step of :func:`_carry_fwd` that both halves take: its rows of ``X``, the rows of ``SIDE``
    (``q~`` in the right half, ``k~`` in the left) times the half's ``carry``; with ``SAVE`` the carry itself into
    ``CS``; with ``FIRST`` the block's rows of level 0.  Returns the block's ``G_b``, which moves the carry on."""
    DD: tl.constexpr = HEAD_DIM * HEAD_DIM
    x = load_rows(SIDE + b * BT * HEAD_DIM, rows, offs_d, HEAD_DIM, BT, HEAD_DIM, False, CHECK_D)
    store_rows(X + b * BT * HEAD_DIM, dot(x, carry, CARRY), rows, offs_d, HEAD_DIM, BT, HEAD_DIM)
    if SAVE:
        store_rows(CS + b * DD, carry, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM)
    if FIRST:
        _level_zero_rows(QT, KT, X0, b, rows, offs_d, HEAD_DIM, BT, CHECK_D)
    return load_rows(GM + b * DD, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM, CHECK_D, CHECK_D)


@triton.jit
def _carry_fwd(QT, KT, GM, X, X0, CS, NB, h, stride_tb, stride_pb,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, CARRY: tl.constexpr,
               FIRST: tl.constexpr, SAVE: tl.constexpr):
    """One half of one node at one level (grid ``(nodes, 2, BH)``; halves of ``h`` blocks): its rows of ``X``.
    ``QT, KT``: ``(BH, NB * BT, D)``; ``X``: the same shape, any float dtype; ``GM``: ``(BH, NB, D, D)``,
    ``G_b = Phi_b - I`` (the preparation pass's ``G``: a carry moves as ``C + G C``); all three fp32, or fp16
    with ``CARRY = "fp16"``.  ``FIRST`` (level 1, ``h = 2``): the half's rows of level 0 too, into ``X0`` (shaped
    like ``X``): there every half is one block and its carry the identity, so ``X0`` is ``q~`` on odd blocks and
    ``k~`` on even ones, which the program reads anyway but for one tile (a launch and a pass through memory
    fewer than a copy).  ``SAVE``: also store each block's carry (``C_b`` or ``E_b``, before its own transition)
    into ``CS`` (shaped like ``GM``, its dtype), where :func:`_carry_bwd` reads them instead of rebuilding them."""
    node = tl.program_id(0)
    bh = tl.program_id(2).to(tl.int64)
    mid = node * 2 * h + h  # the boundary, in blocks
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    rows_of_head, blocks_of_head = bh * stride_tb, bh * stride_pb  # offsets of this head's rows and D x D blocks
    QT, KT, X, X0 = QT + rows_of_head, KT + rows_of_head, X + rows_of_head, X0 + rows_of_head
    GM, CS = GM + blocks_of_head, CS + blocks_of_head
    carry = (offs_d[:, None] == offs_d[None, :]).to(tl.float32)  # [BD, BD]
    if tl.program_id(1) == 1:  # right half: queries carried left, C <- Phi_b C
        for t in range(0, tl.minimum(h, NB - mid)):
            b = mid + t
            g = _carried_rows(QT, QT, KT, GM, X, X0, CS, b, carry, rows, offs_d, HEAD_DIM, BT, CHECK_D, CARRY, FIRST,
                              SAVE)
            carry += dot(g, carry, CARRY)
    else:  # left half: keys carried right, E <- Phi_b^T E, from the boundary leftwards
        for t in range(tl.maximum(mid - NB, 0), h):  # blocks past NB (a last, partial node) are skipped
            b = mid - 1 - t
            g = _carried_rows(KT, QT, KT, GM, X, X0, CS, b, carry, rows, offs_d, HEAD_DIM, BT, CHECK_D, CARRY, FIRST,
                              SAVE)
            carry += dot(tl.trans(g), carry, CARRY)


@triton.jit
def _level_zero_grad(DX0, b, PARITY: tl.constexpr, rows, offs_d, HEAD_DIM: tl.constexpr, BT: tl.constexpr,
                     CHECK_D: tl.constexpr):
    """Level 0's gradient of block ``b``'s ``q~`` (``PARITY = 1``) or ``k~`` (``0``): ``dX0``'s rows where the
    block's parity is ``PARITY``, else 0 (a load masked off entirely reads nothing).  ``[BT, BLOCK_D]`` fp32."""
    n = tl.where(b % 2 == PARITY, BT, 0)
    return load_rows(DX0 + b * BT * HEAD_DIM, rows, offs_d, HEAD_DIM, n, HEAD_DIM, True, CHECK_D).to(tl.float32)


@triton.jit
def _carried_rows_grad(CS, DX, SIDE, GM, DX0, DOUT, b, PARITY: tl.constexpr, rows, offs_d, HEAD_DIM: tl.constexpr,
                       BT: tl.constexpr, CHECK_D: tl.constexpr, PRECISION: tl.constexpr, FIRST: tl.constexpr):
    """Block ``b``'s step of :func:`_carry_bwd` that both halves take: its rows' gradient ``dX_b`` carried back
    through the block's carry ``C_b`` (``CS``) and added to ``DOUT`` (``dq~`` in the right half, ``PARITY = 1``;
    ``dk~`` in the left, ``0``), onto level 0's gradient with ``FIRST``, else onto what the levels before left.
    Returns what the half's running sum reads next: ``C_b``, ``dX_b`` scaled by a power of two (``dx, dx_u``:
    :func:`._pieces.scaled`), the block's ``q~`` or ``k~`` rows (``SIDE``) and its ``G_b``."""
    DD: tl.constexpr = HEAD_DIM * HEAD_DIM
    RD: tl.constexpr = BT * HEAD_DIM
    c = load_rows(CS + b * DD, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM, CHECK_D, CHECK_D)
    dx, dx_u = scaled(load_rows(DX + b * RD, rows, offs_d, HEAD_DIM, BT, HEAD_DIM, False, CHECK_D).to(tl.float32),
                      PRECISION)  # [BT, BD], read by two products
    side = load_rows(SIDE + b * RD, rows, offs_d, HEAD_DIM, BT, HEAD_DIM, False, CHECK_D)
    g = load_rows(GM + b * DD, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM, CHECK_D, CHECK_D)
    if FIRST:
        d = _level_zero_grad(DX0, b, PARITY, rows, offs_d, HEAD_DIM, BT, CHECK_D)
    else:
        d = load_rows(DOUT + b * RD, rows, offs_d, HEAD_DIM, BT, HEAD_DIM, False, CHECK_D)
    store_rows(DOUT + b * RD, d + dot_ready(dx, tl.trans(c), True, False, PRECISION) * dx_u, rows, offs_d, HEAD_DIM,
               BT, HEAD_DIM)
    return c, dx, dx_u, side, g


@triton.jit
def _add_dphi(ptr, a, b, scale, nonzero, offs_d, HEAD_DIM: tl.constexpr, CHECK_D: tl.constexpr,
              PRECISION: tl.constexpr, FIRST: tl.constexpr, A_READY: tl.constexpr, B_READY: tl.constexpr):
    """``dPhi += (a b) scale`` at ``ptr`` (a ``D x D`` tile) where ``nonzero`` (a half's end block has none to add);
    with ``FIRST`` the tile is written instead, zeros where ``not nonzero``.  ``*_READY``: as
    :func:`._pieces.dot_ready`; ``scale``: the ``1 / s`` of a scaled operand (:func:`._pieces.scaled`), or 1."""
    if FIRST:
        if nonzero:
            store_rows(ptr, dot_ready(a, b, A_READY, B_READY, PRECISION) * scale, offs_d, offs_d, HEAD_DIM, HEAD_DIM,
                       HEAD_DIM)
        else:
            store_rows(ptr, tl.zeros([a.shape[0], b.shape[1]], dtype=tl.float32), offs_d, offs_d, HEAD_DIM, HEAD_DIM,
                       HEAD_DIM)
    elif nonzero:
        dg = load_rows(ptr, offs_d, offs_d, HEAD_DIM, HEAD_DIM, HEAD_DIM, CHECK_D, CHECK_D)
        store_rows(ptr, dg + dot_ready(a, b, A_READY, B_READY, PRECISION) * scale, offs_d, offs_d, HEAD_DIM,
                   HEAD_DIM, HEAD_DIM)


@triton.jit
def _carry_bwd(QT, KT, GM, DX, DX0, DQT, DKT, DGM, CS, NB, h, stride_tb, stride_pb,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BT: tl.constexpr, PRECISION: tl.constexpr,
               FIRST: tl.constexpr):
    """The reverse of :func:`_carry_fwd` for one half: adds this level's ``dq~`` (right halves), ``dk~`` (left
    halves) and ``dPhi`` (both) to ``DQT``, ``DKT``, ``DGM`` (fp32, shaped like ``QT``, ``KT``, ``GM``).
    ``DX``: the level's ``dX`` (fp32); ``CS``: the level's carries as :func:`_carry_fwd` stored them
    (``(BH, NB, D, D)``, ``GM``'s dtype).  Every product with a gradient runs in ``PRECISION``; with ``"fp16"`` (fp16
    factors only) each tile of ``dX`` and each trip's running sum ``S`` or ``U`` is scaled into fp16's range by a power
    of two first (:func:`._pieces.scaled`: gradients can be far smaller, or larger, than fp16's normal range).

    ``FIRST`` (level 1, ``h = 2``, the first launch): the outputs are written, not added to, and level 0 is
    folded in from ``DX0`` (its ``dX``; there ``dq~`` is ``dX``'s rows on odd blocks, ``dk~`` on even ones, and
    ``dPhi`` is 0).  The right half's program then writes the node's every ``dq~`` row, the left half's every
    ``dk~`` row, each its own blocks' ``dPhi``: the outputs need no zero fill and level 0 no launch."""
    node = tl.program_id(0)
    bh = tl.program_id(2).to(tl.int64)
    mid = node * 2 * h + h
    rows = tl.arange(0, BT)
    offs_d = tl.arange(0, BLOCK_D)
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    DD: tl.constexpr = HEAD_DIM * HEAD_DIM
    RD: tl.constexpr = BT * HEAD_DIM
    rows_of_head, blocks_of_head = bh * stride_tb, bh * stride_pb  # offsets of this head's rows and D x D blocks
    QT, KT, DX, DX0 = QT + rows_of_head, KT + rows_of_head, DX + rows_of_head, DX0 + rows_of_head
    DQT, DKT = DQT + rows_of_head, DKT + rows_of_head
    GM, DGM, CS = GM + blocks_of_head, DGM + blocks_of_head, CS + blocks_of_head
    if tl.program_id(1) == 1:  # right half
        n_right = tl.minimum(h, NB - mid)
        s = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)  # S_b: later blocks' M_I carried back to b
        for tt in range(0, n_right):  # right to left
            b = mid + n_right - 1 - tt
            c, dx, dx_u, q, g = _carried_rows_grad(CS, DX, QT, GM, DX0, DQT, b, 1, rows, offs_d,
                                                   HEAD_DIM, BT, CHECK_D, PRECISION, FIRST)
            s_r, s_u = scaled(s, PRECISION)  # read by two products
            _add_dphi(DGM + b * DD, s_r, tl.trans(c), s_u, tt > 0, offs_d, HEAD_DIM, CHECK_D, PRECISION, FIRST, True,
                      False)
            s += (dot_ready(tl.trans(q), dx, False, True, PRECISION) * dx_u
                  + dot_ready(tl.trans(g), s_r, False, True, PRECISION) * s_u)
        if FIRST:  # the left half's dq~ rows: level 0's alone
            for b in range(mid - h, tl.minimum(mid, NB)):
                store_rows(DQT + b * RD, _level_zero_grad(DX0, b, 1, rows, offs_d, HEAD_DIM, BT, CHECK_D), rows,
                           offs_d, HEAD_DIM, BT, HEAD_DIM)
    else:  # left half
        t0 = tl.maximum(mid - NB, 0)
        u = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)  # U_b: earlier blocks' N_J carried forward to b
        for t in range(0, h - t0):  # left to right
            b = mid - h + t
            e, dx, dx_u, k, g = _carried_rows_grad(CS, DX, KT, GM, DX0, DKT, b, 0, rows, offs_d,
                                                   HEAD_DIM, BT, CHECK_D, PRECISION, FIRST)
            u_r, u_u = scaled(u, PRECISION)  # read by two products
            _add_dphi(DGM + b * DD, e, tl.trans(u_r), u_u, t > 0, offs_d, HEAD_DIM, CHECK_D, PRECISION, FIRST, False,
                      True)
            u += (dot_ready(g, u_r, False, True, PRECISION) * u_u
                  + dot_ready(tl.trans(k), dx, False, True, PRECISION) * dx_u)
        if FIRST:  # the right half's dk~ rows: level 0's alone
            for b in range(mid, tl.minimum(mid + h, NB)):
                store_rows(DKT + b * RD, _level_zero_grad(DX0, b, 0, rows, offs_d, HEAD_DIM, BT, CHECK_D), rows,
                           offs_d, HEAD_DIM, BT, HEAD_DIM)


_CARRY_CONFIGS = [triton.Config({}, num_warps=w, num_stages=1) for w in (4, 8)]  # one stage: see carry_forward
_carry_fwd_tuned = triton.autotune(_CARRY_CONFIGS, key=["HEAD_DIM", "BT", "CARRY", "h", "SAVE"])(_carry_fwd)
# The backward adds to its outputs: autotuning's trial runs must not leave their sums behind.
_carry_bwd_tuned = triton.autotune(_CARRY_CONFIGS, key=["HEAD_DIM", "BT", "PRECISION", "h"],
                                   restore_value=["DQT", "DKT", "DGM"])(_carry_bwd)


def _kernel(tuned, plain):
    """The autotuned kernel on a GPU; in the interpreter the plain one with 4 warps (each trial costs seconds)."""
    return (plain, dict(num_warps=4, num_stages=1)) if interpreting() else (tuned, {})


def _precision(dtype, D: int) -> str:
    """The preparation pass's product precision, but rounded tf32 instead of "x3" for D > 64 (fp32 inputs): three
    tf32 products of 128 x 128 tiles need more shared memory than an H100 has (294912 of 232448 bytes), and exact
    fp32 ("ieee") products of them took more than five minutes to compile with triton 3.6 (``NOTES_path.md``,
    "fp32 inputs")."""
    p = prep_precision(dtype)
    return "tf32" if p == "x3" and D > 64 else p


def _carry_precision(g, D: int) -> str:
    """How the carries are multiplied: in fp16 when the preparation pass stored its factors in fp16 (16-bit
    inputs: fp16 keeps the 10 mantissa bits of rounded tf32, and the factors are reflections, within its range),
    else as :func:`_precision` says for fp32."""
    return "fp16" if g.dtype == torch.float16 else _precision(torch.float32, D)


def levels(nb: int) -> int:
    """How many dyadic levels ``nb`` blocks need: ``ceil(log2 nb)``."""
    return max(0, (nb - 1).bit_length())


def carry_forward(qt, kt, g, block: int, dtype, keep_carries: bool = False):
    """``(X, C)``: the meeting-point rows ``X: (L, BH, T_pad, D)`` in ``dtype`` (:func:`_carry_fwd`, one launch per
    level from level 1, whose launch writes level 0 too) and, with ``keep_carries``, the carries ``C`` (else None).

    ``qt, kt: (BH, T_pad, D)`` (``q~``, ``k~`` in blocks of ``block`` rows), ``g: (BH, T_pad / block, D, D)``
    (each block's ``G = Phi - I``), as :class:`.ut_prepare.Prepared` makes them: all fp32, or all fp16 (then
    the carries are multiplied in fp16: :func:`_carry_precision`).  ``C: (L - 1, BH, T_pad / block, D, D)`` in
    ``g``'s dtype: each block's carry at levels 1 .. L - 1 (level 0's are the identity), for
    :func:`carry_backward`; ``D * D`` numbers per block and level, as many as ``X`` has per level when
    ``block == D``.
    """
    BH, T_pad, D = qt.shape
    nb = T_pad // block
    X = torch.empty((levels(nb), BH, T_pad, D), dtype=dtype, device=qt.device)
    C = torch.empty((max(X.shape[0] - 1, 0),) + tuple(g.shape), dtype=g.dtype, device=g.device) if keep_carries \
        else None
    if X.shape[0] == 1:  # two blocks: level 0 alone, every half one block whose carry is the identity
        blocks = X[0].view(BH, nb, block, D)
        blocks[:, 1::2] = qt.view(BH, nb, block, D)[:, 1::2]
        blocks[:, 0::2] = kt.view(BH, nb, block, D)[:, 0::2]
    kernel, fixed = _kernel(_carry_fwd_tuned, _carry_fwd)
    for lvl in range(1, X.shape[0]):
        h = 1 << lvl
        kernel[(-(-nb // (2 * h)), 2, BH)](
            QT=qt, KT=kt, GM=g, X=X[lvl], X0=X[0], CS=g if C is None else C[lvl - 1],
            NB=nb, h=h,
            stride_tb=qt.stride(0), stride_pb=g.stride(0),
            HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=block, CARRY=_carry_precision(g, D), FIRST=lvl == 1,
            SAVE=C is not None, **fixed,
        )
    return X, C


def carry_backward(qt, kt, g, block: int, dX, dtype, carries, precision=None):
    """``dq~, dk~, dG`` (fp32, shaped like ``qt, kt, g``) from ``dX`` (:func:`carry_forward`'s output's gradient) and
    the carries that made ``X`` (``carry_forward(..., keep_carries=True)``'s ``C``): :func:`_carry_bwd` once per
    level from level 1 (whose launch writes the outputs, level 0 folded in), each later one adding to what the
    levels before left.  ``dtype``: the inputs' (it sets the gradient products' precision, in the version that
    keeps every NaN: :func:`._launch.keeping_nans`).  For fp16 factors (16-bit inputs) with ``D > 32`` the products
    run in fp16, every gradient tile scaled by a power of two (:func:`._pieces.scaled`): 3.91 against 4.58 ms for
    tf32's at T = 2048, B = H = 32, D = 64 on an H200 (``NOTES_path.md``, "fp16 products in the backward"); heads of
    16 or 32 keep
    tf32, as the UT backward does (:func:`.ut_prepare.backward_precision`).  ``precision``: ``"fp16"`` or
    ``"tf32n"`` to choose (fp16 needs fp16 factors), None for that default."""
    BH, T_pad, D = qt.shape
    nb = T_pad // block
    L = dX.shape[0]
    if carries.shape != (max(L - 1, 0),) + tuple(g.shape) or carries.dtype != g.dtype:
        raise ValueError(f"`carries` must be carry_forward's C, {(max(L - 1, 0), *g.shape)} in {g.dtype}, "
                         f"got {tuple(carries.shape)} in {carries.dtype}")
    fp16_factors = all(x.dtype == torch.float16 for x in (qt, kt, g))
    if precision is None:  # fp16 factors: the UT backward's rule (fp16 products for D > 32, tf32 below)
        p = _precision(dtype, D)
        precision = backward_precision(p, D, fp16=fp16_factors)
    elif precision not in ("fp16", "tf32n"):
        raise ValueError(f"`precision` must be None, 'fp16' or 'tf32n', got {precision!r}")
    elif precision == "fp16" and not fp16_factors:
        raise ValueError("`precision='fp16'` needs fp16 factors (qt, kt, g: a 16-bit input's preparation pass), got "
                         f"{qt.dtype}, {kt.dtype}, {g.dtype}")
    make = torch.empty if L > 1 else torch.zeros  # from level 1 on, the first launch writes every row
    dqt, dkt = (make(qt.shape, dtype=torch.float32, device=qt.device) for _ in range(2))
    dg = make(g.shape, dtype=torch.float32, device=g.device)
    if L == 1:  # two blocks (see carry_forward): dq~ and dk~ are dX's rows, and no dPhi (S and U are 0)
        blocks = dX[0].view(BH, nb, block, D)
        dqt.view(BH, nb, block, D)[:, 1::2] = blocks[:, 1::2]
        dkt.view(BH, nb, block, D)[:, 0::2] = blocks[:, 0::2]
    kernel, fixed = _kernel(_carry_bwd_tuned, _carry_bwd)
    for lvl in range(1, L):
        h = 1 << lvl
        kernel[(-(-nb // (2 * h)), 2, BH)](
            QT=qt, KT=kt, GM=g, DX=dX[lvl], DX0=dX[0], DQT=dqt, DKT=dkt, DGM=dg, CS=carries[lvl - 1],
            NB=nb, h=h,
            stride_tb=qt.stride(0), stride_pb=g.stride(0),
            HEAD_DIM=D, BLOCK_D=next_pow2(D), BT=block, PRECISION=precision, FIRST=lvl == 1, **fixed,
        )
    return dqt, dkt, dg


__all__ = ["carry_forward", "carry_backward", "levels"]
