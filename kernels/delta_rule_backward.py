r"""The backward pass of the chunked Householder RNN and DeltaNet (:mod:`.delta_rule`), gated or not.

Both recurrences are one: DeltaNet is the Householder RNN with ``w = k`` and values ``beta v``, so one backward
serves both, on the UT form of the chunk (:class:`.ut_prepare.Prepared`: ``q~``, ``k~``, ``Ã``, ``G``).  For a chunk
with local cumulative log gate ``b`` (0 without a gate, ``b_last`` its last entry), state ``H_in = S^T`` entering it
and ``H_out`` leaving it, the forward is ::

    O_c   = diag(e^b) Q~ H_in + (Ã * E) V,                          E_ij = e^{b_i - b_j} (j <= i), else 0
    H_out = e^{b_last} (I + G) H_in + (diag(e^{b_last - b}) K~)^T V

and its backward, given ``dO`` and ``dH_out``::

    dH_in = e^{b_last} (I + G)^T dH_out + (diag(e^b) Q~)^T dO         (right to left, chunk after chunk)
    dQ~   = diag(e^b) dO H_in^T              dK~ = diag(e^{b_last - b}) V dH_out^T
    dÃ    = (dO V^T) * E                      dG  = e^{b_last} dH_out H_in^T
    dV    = (Ã * E)^T dO + diag(e^{b_last - b}) K~ dH_out

Three launches and the UT pass's own backward:

1. the forward (the linear template's ``"householder"`` or ``"delta"`` hook) stores the state entering every chunk;
2. :func:`_hh_bwd_state` scans the chunks right to left for every ``dH_out`` (its last ``dH_in`` is the initial
   state's gradient);
3. :func:`_hh_bwd_chunk`, all chunks in parallel: ``dQ~, dK~, dÃ`` and the gate's gradient in one program per
   chunk, ``dV`` in a second, the rows of ``dG`` (``D x D``) in others beside them;
4. :func:`.ut_prepare.ut_prepare_backward` takes ``dQ~, dK~, dÃ, dG`` back through the UT factor
   ``L = (I + strictLower(diag(beta) W W^T))^{-1} diag(beta)`` to ``dq, dk, dw, dbeta``.

DeltaNet's forward keeps its WY form (two stored factors instead of four); its backward makes the UT factors with
``w = k`` (a non-finite ``k_t`` replaced by 0 in the transitions, as the WY pass does) and adds the ``w`` role's
gradient to ``dk``; the values ``beta v`` give ``dv = beta dV`` and ``dbeta += v . dV``, both made in the chunk
kernel, which scales ``v`` by ``beta`` as it loads it (no ``beta v`` in memory, no pass over ``dV`` after it).

The gate.  ``log_f[s]`` of a chunk enters ``b_i`` for ``i >= s``, so it weighs every term that spans it: the row
terms ``i >= s`` (``q~_i . dq~_i``), the in-chunk pairs ``j < s <= i`` (``dÃ_ij Ã_ij``), the writes ``j < s``
(``k~_j . dk~_j``) and the carried state (``e^{b_last} <dH_out, (I + G) H_in> = e^{b_last} <dH_out, H_in> + <G,
dG>``).  Each is summed over the pairs that span ``s`` only, never as a difference of two larger sums, so strong
gates (``log_f = -20``) leave no rounding noise in gradients of order ``e^{-20}``.

On Hopper, Triton 3.4 to 3.7.0 miscompiles the transpose of a tile that a product made (wrong gradients): no
product's result is transposed here.  Every transposed operand (``G^T``, ``Q~^T``, ``H_in^T``, ``dH_out^T``,
``Ã^T``) is read so from memory, and ``V^T`` is the transpose of a loaded tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import Flat, interpreting, next_pow2, row_strides
from ._pieces import dot, load_rows, store_rows
from .linear_attention import bdot, linear_launch, backward_precision
from .ut_prepare import Prepared, WYPrepared, prep_precision, ut_prepare_backward

__all__ = ["HouseholderRNN", "DeltaRule"]


@triton.jit
def _chunk_b(LOG_F, bh, offs_t, offs_c, T, CHUNK: tl.constexpr):
    """``(b, b_last)``: a chunk's cumulative log gates ``b [C]`` from its start (rows past ``T``: gate 0) and the
    last one."""
    b = tl.cumsum(tl.load(LOG_F + bh * T + offs_t, mask=offs_t < T, other=0.0), axis=0)
    return b, tl.sum(tl.where(offs_c == CHUNK - 1, b, 0.0), axis=0)


@triton.jit
def _hh_bwd_state(QT, GM, DO, LOG_F, DHT, DH, DH0, T, stride_pb, stride_pt, stride_gb, stride_gj, stride_ob,
                  stride_ot, HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr, CHUNK: tl.constexpr, GATED: tl.constexpr, LOAD_DHT: tl.constexpr,
                  PRECISION: tl.constexpr):
    """The state's gradient, right to left, one program per (block of ``BLOCK_DV`` value channels, head): stores
    ``dH_out`` of every chunk to ``DH`` (fp32 ``(BH, NC, D, Dv)``) and the initial state's gradient to ``DH0`` (fp32
    ``(BH, D, Dv)``), from the final state's ``DHT`` (``LOAD_DHT``; else 0).  ``QT``: ``q~`` (``(BH, T_pad, D)``),
    ``GM``: the chunks' ``G`` (``(BH, NC_pad, D, D)``), ``DO``: ``(BH, T, Dv)``, ``LOG_F``: ``(BH, T)`` fp32
    (``GATED``).  ``G^T`` and ``Q~^T`` are read transposed from memory."""
    bh = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    in_d = offs_d < HEAD_DIM
    tile = offs_d[:, None] * HEAD_DV + offs_dv[None, :]  # [BD, BDV] of a (D, Dv) state
    tile_mask = in_d[:, None] & (offs_dv[None, :] < HEAD_DV)
    size = HEAD_DIM * HEAD_DV
    n_chunks = tl.cdiv(T, CHUNK)
    if LOAD_DHT:
        dh = tl.load(DHT + bh * size + tile, mask=tile_mask, other=0.0)
    else:
        dh = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i
        offs_t = c * CHUNK + offs_c
        tl.store(DH + (bh * n_chunks + c) * size + tile, dh, mask=tile_mask)
        # G^T [BD, BD]: entry (r, s) is G[s, r]
        gt = tl.load(GM + bh * stride_gb + c * stride_gj + offs_d[None, :] * HEAD_DIM + offs_d[:, None],
                     mask=in_d[:, None] & in_d[None, :], other=0.0)
        carried = dh + bdot(gt, dh, PRECISION)  # (I + G)^T dH_out
        # Q~^T [BD, C]
        qtt = tl.load(QT + bh * stride_pb + offs_t[None, :] * stride_pt + offs_d[:, None],
                      mask=in_d[:, None] & (offs_t[None, :] < T), other=0.0)
        do = load_rows(DO + bh * stride_ob, offs_t, offs_dv, stride_ot, T, HEAD_DV, True, True)  # [C, BDV]
        if GATED:
            b, b_last = _chunk_b(LOG_F, bh, offs_t, offs_c, T, CHUNK)
            carried = carried * tl.exp(b_last)
            qtt = qtt * tl.exp(b)[None, :]
        dh = carried + bdot(qtt, do, PRECISION)
    tl.store(DH0 + bh * size + tile, dh, mask=tile_mask)


@triton.jit
def _hh_bwd_chunk(QT, KT, AD, GM, V, BETA, DO, LOG_F, STATES, DH, DQT, DKT, DAD, DG, DV, DBETA_V, DLOG_F, DSTATE, T,
                  stride_pb, stride_pt, stride_ab, stride_at, stride_gb, stride_gj, stride_vb, stride_vt,
                  stride_ob, stride_ot, stride_dvb, stride_dvt,
                  HEAD_DIM: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  BLOCK_G: tl.constexpr, CHUNK: tl.constexpr, GATED: tl.constexpr, BETA_V: tl.constexpr,
                  PRECISION: tl.constexpr, SUM_PRECISION: tl.constexpr):
    """One chunk's gradients (the module docstring's equations), grid ``(NC, BH, 2 + cdiv(D, BLOCK_G))``, the value
    channels ``BLOCK_DV`` at a time, in three roles (the third program index).  Role 0: ``dQ~, dK~`` (``DQT, DKT``,
    fp32, laid out as ``QT``), ``dÃ`` (``DAD``, as ``AD``, zero above the diagonal) and with ``GATED`` the row, pair
    and write terms of the gradient of ``log_f`` (``DLOG_F``, fp32 ``(BH, T)``).  Role 1: ``dV`` (``(BH, T, Dv)``).
    Role ``r >= 2``: ``BLOCK_G`` rows of ``dG`` (``DG``, as ``GM``) and their part of the carried state's term
    (``DSTATE``, fp32 ``(BH, NC, roles - 2)``).  ``BETA_V`` (DeltaNet): the values written are ``beta_t v_t``, made
    from ``V`` and ``BETA`` (fp32 ``(BH, T)``) on load rather than stored; role 1 then stores ``beta_t dV_t`` in
    ``DV`` (``V``'s dtype) and ``v_t . dV_t``, the values' share of ``beta``'s gradient, in ``DBETA_V`` (fp32 ``(BH,
    T)``).  ``STATES``, ``DH``: the states entering and the gradients leaving every chunk (fp32 ``(BH, NC, D,
    Dv)``).  Compiled for Hopper (Triton 3.9, offline), one program holding every
    tile spilled: 320 bytes a thread at ``D = C = 64`` with ``dG`` in it, 744 at ``D = 128`` with ``dV`` in it (8
    warps); split so, none.  ``SUM_PRECISION``: the one product that sums gradient pieces for the gate (``"ieee"`` or
    ``"x3n"``: about fp32 accuracy, so that small sums stay exact)."""
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    role = tl.program_id(2)
    start = c * CHUNK
    offs_c = tl.arange(0, CHUNK)
    offs_t = start + offs_c
    offs_d = tl.arange(0, BLOCK_D)
    in_d = offs_d < HEAD_DIM
    CHECK_D: tl.constexpr = BLOCK_D != HEAD_DIM
    size = HEAD_DIM * HEAD_DV
    n_chunks = tl.cdiv(T, CHUNK)
    base = (bh * n_chunks + c) * size
    if GATED:
        b, b_last = _chunk_b(LOG_F, bh, offs_t, offs_c, T, CHUNK)
    causal = offs_c[:, None] >= offs_c[None, :]  # [i, j]: j <= i
    later = offs_c[:, None] <= offs_c[None, :]  # [j, i]: i >= j
    p_ad = AD + bh * stride_ab + start * stride_at
    if role == 0:
        dqt = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)
        dkt = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)
        p = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)  # dO V^T, [i, j]
        for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
            offs_dv = dv0 + tl.arange(0, BLOCK_DV)
            v = load_rows(V + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)  # [C, BDV]
            if BETA_V:
                v = v * tl.load(BETA + bh * T + offs_t, mask=offs_t < T, other=0.0)[:, None]
            do = load_rows(DO + bh * stride_ob, offs_t, offs_dv, stride_ot, T, HEAD_DV, True, True)  # [C, BDV]
            # H_in^T and dH_out^T [BDV, BD], read transposed from memory
            t_offs = offs_dv[:, None] + offs_d[None, :] * HEAD_DV
            t_mask = (offs_dv[:, None] < HEAD_DV) & in_d[None, :]
            dqt += bdot(do, tl.load(STATES + base + t_offs, mask=t_mask, other=0.0), PRECISION)
            dkt += bdot(v, tl.load(DH + base + t_offs, mask=t_mask, other=0.0), PRECISION)
            p += bdot(do, tl.trans(v), PRECISION)  # v came from memory
        if GATED:
            dqt = dqt * tl.exp(b)[:, None]
            dkt = dkt * tl.exp(b_last - b)[:, None]
            dad = p * tl.exp(tl.where(causal, b[:, None] - b[None, :], float("-inf")))
        else:
            dad = p
        dad = tl.where(causal, dad, 0.0)
        tl.store(DAD + bh * stride_ab + start * stride_at + offs_c[:, None] * stride_at + offs_c[None, :], dad)
        store_rows(DQT + bh * stride_pb, dqt, offs_t, offs_d, stride_pt, T, HEAD_DIM)
        store_rows(DKT + bh * stride_pb, dkt, offs_t, offs_d, stride_pt, T, HEAD_DIM)
        if GATED:
            # log_f[s] weighs the terms that span s (the module docstring): rows i >= s, pairs j < s <= i, writes
            # j < s; the carried state's term comes from the dG programs (DSTATE)
            qt = load_rows(QT + bh * stride_pb, offs_t, offs_d, stride_pt, T, HEAD_DIM, True, CHECK_D)
            rows = tl.sum(qt * dqt, axis=1)  # [C]: q~_i . dq~_i
            kt = load_rows(KT + bh * stride_pb, offs_t, offs_d, stride_pt, T, HEAD_DIM, True, CHECK_D)
            writes = tl.sum(kt * dkt, axis=1)  # [C]: k~_j . dk~_j
            a = tl.load(p_ad + offs_c[:, None] * stride_at + offs_c[None, :])  # Ã [i, j]
            x = tl.where(causal & (offs_c[:, None] != offs_c[None, :]), dad * a, 0.0)  # [i, j], j < i
            before = (offs_c[:, None] < offs_c[None, :]).to(tl.float32)  # [j, s]: j < s
            y = dot(x, before, SUM_PRECISION)  # [i, s]: sum_{j < s} x_ij
            from_rows = tl.sum(tl.where(causal, rows[:, None] + y, 0.0), axis=0)  # [s]: i >= s
            from_writes = tl.sum(tl.where(later & (offs_c[:, None] != offs_c[None, :]), writes[:, None], 0.0), axis=0)
            tl.store(DLOG_F + bh * T + offs_t, from_rows + from_writes, mask=offs_t < T)
    elif role == 1:
        # dV = (Ã * E)^T dO + diag(e^{b_last - b}) K~ dH_out, with Ã^T read transposed from memory
        at = tl.load(p_ad + offs_c[None, :] * stride_at + offs_c[:, None])  # [j, i]
        kd = load_rows(KT + bh * stride_pb, offs_t, offs_d, stride_pt, T, HEAD_DIM, True, CHECK_D)  # [C, BD]: k~
        if GATED:
            at = at * tl.exp(tl.where(later, b[None, :] - b[:, None], float("-inf")))
            kd = kd * tl.exp(b_last - b)[:, None]  # key j's weight in the chunk's write
        at = tl.where(later, at, 0.0)  # a select: NaN and inf above the diagonal stay out
        if BETA_V:
            beta = tl.load(BETA + bh * T + offs_t, mask=offs_t < T, other=0.0)  # [C]
            v_dv = tl.zeros([CHUNK], dtype=tl.float32)  # v_t . dV_t
        for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
            offs_dv = dv0 + tl.arange(0, BLOCK_DV)
            do = load_rows(DO + bh * stride_ob, offs_t, offs_dv, stride_ot, T, HEAD_DV, True, True)  # [C, BDV]
            dh_out = tl.load(DH + base + offs_d[:, None] * HEAD_DV + offs_dv[None, :],
                             mask=in_d[:, None] & (offs_dv[None, :] < HEAD_DV), other=0.0)  # [BD, BDV]
            dv = bdot(at, do, PRECISION) + bdot(kd, dh_out, PRECISION)  # [C, BDV]: the gradient of what is written
            if BETA_V:
                v = load_rows(V + bh * stride_vb, offs_t, offs_dv, stride_vt, T, HEAD_DV, True, True)  # [C, BDV]
                v_dv += tl.sum(v * dv, axis=1)
                dv = dv * beta[:, None]
            store_rows(DV + bh * stride_dvb, dv, offs_t, offs_dv, stride_dvt, T, HEAD_DV)
        if BETA_V:
            tl.store(DBETA_V + bh * T + offs_t, v_dv, mask=offs_t < T)
    else:
        # rows r0 .. r0 + BLOCK_G of dG = e^{b_last} dH_out H_in^T, summed over the value channels
        offs_r = (role - 2) * BLOCK_G + tl.arange(0, BLOCK_G)
        in_r = offs_r < HEAD_DIM
        dg = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        hdh = 0.0  # <dH_out, H_in> over these rows
        for dv0 in tl.static_range(0, HEAD_DV, BLOCK_DV):
            offs_dv = dv0 + tl.arange(0, BLOCK_DV)
            in_dv = offs_dv < HEAD_DV
            r_offs = offs_r[:, None] * HEAD_DV + offs_dv[None, :]
            r_mask = in_r[:, None] & in_dv[None, :]
            dh_rows = tl.load(DH + base + r_offs, mask=r_mask, other=0.0)  # [BG, BDV]
            h_in_t = tl.load(STATES + base + offs_dv[:, None] + offs_d[None, :] * HEAD_DV,
                             mask=in_dv[:, None] & in_d[None, :], other=0.0)  # [BDV, BD]
            dg += bdot(dh_rows, h_in_t, PRECISION)
            if GATED:
                hdh += tl.sum(tl.sum(dh_rows * tl.load(STATES + base + r_offs, mask=r_mask, other=0.0), axis=1), 0)
        if GATED:
            dg = dg * tl.exp(b_last)
        p_g = bh * stride_gb + c * stride_gj + offs_r[:, None] * HEAD_DIM + offs_d[None, :]
        g_mask = in_r[:, None] & in_d[None, :]
        tl.store(DG + p_g, dg, mask=g_mask)
        if GATED:
            # the carried state's term: e^{b_last} <dH_out, (I + G) H_in> = e^{b_last} <dH_out, H_in> + <G, dG>
            g = tl.load(GM + p_g, mask=g_mask, other=0.0)
            tl.store(DSTATE + (bh * n_chunks + c) * (tl.num_programs(2) - 2) + role - 2,
                     tl.exp(b_last) * hdh + tl.sum(tl.sum(g * dg, axis=1), axis=0))


def householder_backward(x: Flat, v3, log_f3, prep: Prepared, states, do, dht, chunk: int, beta_v=None):
    """Launches 2 and 3 of the backward and the UT pass's backward, on validated inputs: ``x`` (``q, k``), ``v3``
    (the values, ``(BH, T, Dv)``), ``log_f3`` (fp32 ``(BH, T)`` or None), ``prep`` (the UT factors of chunks of
    ``chunk`` tokens, ``keep_inverse``), ``states`` (fp32 ``(BH, NC, D, Dv)``, the forward's), ``do`` (``(BH, T,
    Dv)`` or None: 0), ``dht`` (fp32 ``(BH, D, Dv)`` or None: 0).  Returns ``dq, dk`` (compute dtype), ``dv`` (``v3``'s
    dtype), ``dw, dbeta`` (fp32), ``dlog_f`` (fp32 ``(BH, T)`` or None) and ``dh0`` (fp32 ``(BH, D, Dv)``).
    ``beta_v`` (DeltaNet, fp32 ``(BH, T)``): the values written are ``beta_v[t] v3[t]``, scaled in the kernel; ``dv``
    is then the gradient of ``v3`` and ``dbeta`` holds the values' share of ``beta_v``'s gradient too."""
    n, BH = x.n, x.BH
    T, D, Dv = n.T, n.D, n.Dv
    n_chunks = triton.cdiv(T, chunk)
    do = torch.zeros(BH, T, Dv, dtype=v3.dtype, device=x.device) if do is None else do.contiguous()
    f32 = dict(dtype=torch.float32, device=x.device)
    dh = torch.empty(BH, n_chunks, D, Dv, **f32)
    dh0 = torch.empty(BH, D, Dv, **f32)
    # the UT pass's layouts, padded rows and chunks zero (its backward reads whole blocks)
    dqt, dkt = torch.zeros_like(prep.qt, dtype=torch.float32), torch.zeros_like(prep.kt, dtype=torch.float32)
    dad = torch.zeros_like(prep.ad)
    dg = torch.zeros_like(prep.g, dtype=torch.float32)
    dv = torch.empty_like(v3)
    dbeta_v = None if beta_v is None else torch.empty(BH, T, **f32)
    dlog_f = None if log_f3 is None else torch.empty(BH, T, **f32)
    precision = backward_precision(x.dtype)
    block_d, block_dv = next_pow2(D), min(next_pow2(Dv), 64)
    gated = log_f3 is not None
    log_f = dh0 if log_f3 is None else log_f3
    _hh_bwd_state[(triton.cdiv(Dv, block_dv), BH)](
        QT=prep.qt, GM=prep.g, DO=do, LOG_F=log_f, DHT=dh0 if dht is None else dht.contiguous(), DH=dh, DH0=dh0,
        T=T,
        **row_strides(p=prep.qt, o=do), stride_gb=prep.g.stride(0), stride_gj=prep.g.stride(1),
        HEAD_DIM=D, HEAD_DV=Dv, BLOCK_D=block_d, BLOCK_DV=block_dv, CHUNK=chunk, GATED=gated,
        LOAD_DHT=dht is not None, PRECISION=precision, num_warps=4 if D <= 64 else 8,
    )
    # Compiled for Hopper (Triton 3.9, offline) with these warps, neither kernel spills at D = 16, 32, 64 (chunks of
    # 64) or 128 (chunks of 32), and the chunk's kernel 8 bytes a thread at D = 64 with chunks of 32 and a gate; at 4
    # warps it spilled 48-96 bytes at D = 64 with a gate.
    block_g = min(block_d, 32)
    n_g = triton.cdiv(D, block_g)
    dstate = torch.empty(BH, n_chunks, n_g, **f32) if gated else dh0
    _hh_bwd_chunk[(n_chunks, BH, 2 + n_g)](
        QT=prep.qt, KT=prep.kt, AD=prep.ad, GM=prep.g, V=v3, BETA=dh0 if beta_v is None else beta_v, DO=do,
        LOG_F=log_f, STATES=states, DH=dh, DQT=dqt, DKT=dkt, DAD=dad, DG=dg, DV=dv,
        DBETA_V=dh0 if dbeta_v is None else dbeta_v, DLOG_F=dh0 if dlog_f is None else dlog_f, DSTATE=dstate,
        T=T,
        **row_strides(p=prep.qt, a=prep.ad, v=v3, o=do, dv=dv), stride_gb=prep.g.stride(0), stride_gj=prep.g.stride(1),
        HEAD_DIM=D, HEAD_DV=Dv, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_G=block_g, CHUNK=chunk, GATED=gated,
        BETA_V=beta_v is not None, PRECISION=precision, SUM_PRECISION="ieee" if interpreting() else "x3n",
        num_warps=8 if D > 32 else 4,
    )
    if gated:  # the carried state's term, the same for every token of a chunk
        dlog_f += dstate.sum(-1).repeat_interleave(chunk, dim=1)[:, :T]
    del dh
    q3, k3, w3, beta3 = prep._args[:4]
    # gated: e^{b_i - b_j} in dÃ spans more than one fp16 tile holds (ut_prepare_backward's wide_range)
    dq, dk, dw, dbeta = ut_prepare_backward(q3, k3, w3, beta3, prep, dqt, dkt, dad, dg, wide_range=gated)
    if dbeta_v is not None:
        dbeta += dbeta_v
    return dq, dk, dv, dw, dbeta, dlog_f, dh0


def ut_factors(x: Flat, w3, beta3, chunk: int, check=None) -> Prepared:
    """The UT factors of a forward to be differentiated: :class:`.ut_prepare.Prepared` in fp32, the inverses kept
    for :func:`.ut_prepare.ut_prepare_backward`."""
    f32 = torch.float32
    return Prepared(x.q, x.k, w3, beta3, x.n.T, chunk, q_dtype=f32, k_dtype=f32, update_dtype=f32,
                    keep_inverse=True, precision=prep_precision(x.dtype), check=check)


def _empty_grads(x: Flat, h0_given: bool, dht, *tensors):
    """The gradients of an empty call: zeros for every input, ``dht`` (or zeros) for the initial state."""
    dh0 = None
    if h0_given:
        dh0 = torch.zeros(x.BH, x.n.D, x.n.Dv, dtype=torch.float32, device=x.device) if dht is None else dht
    return tuple(None if t is None else torch.zeros_like(t) for t in tensors) + (dh0,)


def _forward_start(ctx, q3, k3, v3, h0, flat, chunk):
    """What both autograd Functions' forwards begin with: the inputs as a :class:`._launch.Flat`, the context's
    sizes kept for the backward, and the fp32 final state ``(BH, D, Dv)`` to be written."""
    x = Flat(flat.n, q3, k3, v3, flat.dtype, flat.like)
    ctx.flat, ctx.chunk, ctx.has_h0 = flat, chunk, h0 is not None
    ctx.set_materialize_grads(False)
    return x, torch.empty(x.BH, x.n.D, x.n.Dv, dtype=torch.float32, device=x.device)


class HouseholderRNN(torch.autograd.Function):
    """The chunked (gated) Householder RNN with a backward pass.

    Inputs: the flattened ``q, k, v`` of a :class:`._launch.Flat` (``flat``), fp32 ``w3: (BH, T, D)``, ``beta3:
    (BH, T)``, ``log_f3: (BH, T)`` or None, ``h0`` (fp32 ``(BH, D, Dv)``, the initial ``S^T``, or None), then
    ``flat``, ``chunk`` and the value check (:class:`pathedu.checks.checked_after`) that receives the UT pass's
    counts.  Outputs ``(out, ht)``: ``(BH, T, Dv)`` in the compute dtype and the final ``S^T`` (fp32 ``(BH, D,
    Dv)``), both differentiable.  Saves the inputs, the UT factors (fp32, with the inverses) and the state entering
    every chunk (fp32 ``(BH, NC, D, Dv)``)."""

    @staticmethod
    def forward(ctx, q3, k3, v3, w3, beta3, log_f3, h0, flat, chunk, check):
        x, ht = _forward_start(ctx, q3, k3, v3, h0, flat, chunk)
        if x.empty_input:
            ctx.save_for_backward(q3, k3, v3, w3, beta3, log_f3)
            out = linear_launch(x, "householder", log_f3, chunk=chunk, h0=h0, final=ht)
            return out, ht
        prep = ut_factors(x, w3, beta3, chunk, check)
        states = torch.empty(x.BH, triton.cdiv(x.n.T, chunk), x.n.D, x.n.Dv, dtype=torch.float32, device=x.device)
        out = linear_launch(x, "householder", log_f3, chunk=chunk, prep=prep, precision=prep_precision(x.dtype),
                             h0=h0, states=states, final=ht)
        ctx.save_for_backward(q3, k3, v3, w3, beta3, log_f3, states, *prep.factors())
        return out, ht

    @staticmethod
    def backward(ctx, do, dht):
        q3, k3, v3, w3, beta3, log_f3, *rest = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        if x.empty_input:
            return _empty_grads(x, ctx.has_h0, dht, q3, k3, v3, w3, beta3, log_f3) + (None,) * 3
        states, *factors = rest
        prep = Prepared.from_factors(q3, k3, w3, beta3, x.n.T, ctx.chunk, *factors,
                                     precision=prep_precision(x.dtype))
        dq, dk, dv, dw, dbeta, dlog_f, dh0 = householder_backward(x, v3, log_f3, prep, states, do, dht, ctx.chunk)
        return dq, dk, dv, dw, dbeta, dlog_f, dh0 if ctx.has_h0 else None, None, None, None


class DeltaRule(torch.autograd.Function):
    """Chunked (Gated) DeltaNet with a backward pass.

    Inputs: the flattened ``q, k, v`` (``flat``), fp32 ``beta3: (BH, T)``, ``log_f3: (BH, T)`` or None, ``h0`` (fp32
    ``(BH, D, Dv)`` or None), then ``flat``, ``chunk``, the WY factors' dtype and the value check.  Outputs as
    :class:`HouseholderRNN`'s.  The forward is the WY form (:class:`.ut_prepare.WYPrepared`, the ``"delta"`` hook)
    and stores the state entering every chunk; the backward makes the UT factors with ``w = k`` and runs the
    Householder RNN's backward on the values ``beta v`` (module docstring)."""

    @staticmethod
    def forward(ctx, q3, k3, v3, beta3, log_f3, h0, flat, chunk, wy_dtype, check):
        x, ht = _forward_start(ctx, q3, k3, v3, h0, flat, chunk)
        if x.empty_input:
            ctx.save_for_backward(q3, k3, v3, beta3, log_f3)
            return linear_launch(x, "delta", log_f3, chunk=chunk, h0=h0, final=ht), ht
        precision = prep_precision(x.dtype)
        prep = WYPrepared(x.k, x.v, beta3, log_f3, x.n.T, chunk, dtype=wy_dtype, precision=precision, check=check)
        states = torch.empty(x.BH, triton.cdiv(x.n.T, chunk), x.n.D, x.n.Dv, dtype=torch.float32, device=x.device)
        out = linear_launch(x, "delta", log_f3, chunk=chunk, prep=prep, precision=precision, h0=h0, states=states,
                             final=ht)
        ctx.save_for_backward(q3, k3, v3, beta3, log_f3, states)
        return out, ht

    @staticmethod
    def backward(ctx, do, dht):
        q3, k3, v3, beta3, log_f3, *rest = ctx.saved_tensors
        x = Flat(ctx.flat.n, q3, k3, v3, ctx.flat.dtype, ctx.flat.like)
        if x.empty_input:
            return _empty_grads(x, ctx.has_h0, dht, q3, k3, v3, beta3, log_f3) + (None,) * 4
        (states,) = rest
        finite = torch.isfinite(k3)
        w3 = torch.where(finite, k3, 0).float()  # the transitions' keys, as the WY pass reads them
        prep = ut_factors(x, w3, beta3, ctx.chunk)
        # each token writes beta_t v_t: the chunk kernel scales v on load and returns v's gradient, dbeta's share
        dq, dk, dv, dw, dbeta, dlog_f, dh0 = householder_backward(x, v3, log_f3, prep, states, do, dht, ctx.chunk,
                                                                  beta_v=beta3)
        dk = (dk.float() + torch.where(finite, dw, 0)).to(k3.dtype)  # k as a key and as the transitions' w
        return dq, dk, dv, dbeta, dlog_f, dh0 if ctx.has_h0 else None, None, None, None, None
