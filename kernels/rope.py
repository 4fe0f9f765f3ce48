r"""The RoPE rotation pre-pass: one fused Triton pass that rotates q and k.

RoPE needs no attention kernel of its own.  Rotate every query and key by its
absolute position once, then run the templates unchanged:

* :func:`pathedu.rope.rope_triton` = :func:`rotary_attention` = the rotation
  followed by :func:`pathedu.kernels.flash_attention.attention`;
* :func:`pathedu.rope.complex_triton` = :func:`rotary_linear_attention` =
  :func:`pathedu.kernels.linear_attention.chunked_linear_attention` on rotated q, k
  (the complex recurrence *is* linear attention on rotated q, k), rotated as each chunk is loaded.

The composed entry points validate ``q, k, v`` once and call the internal,
unvalidated launchers of both kernels (``_rotate_launch``, then
``flat_attention`` or :func:`.linear_attention.flat_linear_attention`).

The other way, ``rotation="fused"``: both templates have a rotation hook
(``ROTATE``) that turns q and k as they are loaded, with the same pieces
(:func:`._pieces.rope_cos_sin`, :func:`._pieces.rope_shift`,
:func:`._pieces.load_rotated`), so no rotated copy is written; the FlashAttention
template turns each key tile once per query block.  Measured on the H100
(``NOTES_flash.md``, "RoPE's rotation"), the hook is the faster way on the linear side, where each chunk is
turned once (``complex_triton``'s default), and the slower one on the FlashAttention side.  There
``rope_triton`` splits the work: without gradients the pass turns the keys alone and stores the cos/sin it
computed in a small table (``(2, T, D/2)`` fp32, written by the first heads' programs), from which the
template's queries-only hook (``ROTATE="..._q"``) turns each query tile once per program; with gradients
the pass turns both and the template runs unchanged.

One program owns ``BLOCK_T`` positions of one (batch, head) row of both ``q``
and ``k`` (the keys-only pass: of :data:`ROPE_HEADS` rows of ``k``).  It computes, in fp32 and in registers,

* the frequencies ``Omega_n = base^(-2n/D) = 2^(-(n / (D/2)) log2(base))``,
* the angles ``theta = (offset + t) * Omega_n`` and their cos/sin (shared by q and k),

loads the two components ``(a, b)`` of every channel pair (``pairing``:
``"interleaved"`` pairs channels ``(2n, 2n+1)``, ``"half"`` pairs ``(n, n + D/2)``),
and writes ``(a cos - b sin, a sin + b cos)`` in the input dtype.  Nothing is
precomputed on the host: no cos/sin table is read from memory.  Interleaved
rows are loaded and stored whole and split into pairs in registers
(``tl.split`` / ``tl.join``); ``"half"`` pairs are two contiguous halves.  Either
way each byte of q and k moves once in and once out: the pass is bound by memory.

Precision.  Everything is fp32, so the angle drifts from its exact value as the
position grows.  Two roundings add up: the frequency ``exp2`` of a rounded
exponent (the exponent reaches ``-log2(base) ~ -13``, so ``Omega_n`` carries a
relative error up to ~5e-7, about four units in the last place; a GPU's fast
``exp2`` may add one or two more), then the product ``t * Omega_n`` (half a unit
in the last place of the angle).  Both grow like ``t``: :func:`trig_error`
measures the largest error of the kernel's cos/sin against float64 as about
``1.3 t 2^-24`` on the CPU interpreter, 4.5e-6 for ``t < 64`` and 6.5e-4 at
``t < 8192`` (``tests/test_rope.py`` bounds it by ``4 t 2^-24``, i.e. 2e-3 at
8192; the GPU checks measure the GPU: ``python -m pathedu.bench.checks rope.trig``).  Every RoPE that
computes ``t * inv_freq`` in fp32 drifts the same way; it is far below the
storage precision of bf16 q and k (rounded to a relative 2^-8 = 3.9e-3).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..checks import check_bool, check_scale, check_state
from ..rope import channel_pairs, check_base, check_offset, check_pairing, check_rotation, frequencies
from ._launch import Flat, interpreting, prepare_qkv, wants_grad
from ._pieces import load_pairs, load_rotated, rope_cos_sin
from .flash_attention import attention_launch, flat_attention
from .linear_attention import flat_linear_attention

__all__ = ["rotate_qk", "rotary_attention", "rotary_linear_attention", "trig_table", "trig_error"]

ROPE_HEADS = 8  # heads per program of the keys-only pass (see _rotate_launch)


@triton.jit
def _rotate_rows(X, XO, rows, stride, T, c, s, HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                 INTERLEAVED: tl.constexpr, PAIR_ORDER: tl.constexpr):
    """Rotate rows ``rows`` of one head's ``(T, D)`` matrix ``X`` by ``(c, s)`` and store them to ``XO`` in the
    same layout, or with ``PAIR_ORDER`` in pair order (:func:`._pieces.load_rotated`: a permutation of the
    channels for ``"half"`` pairs, what the template's rotation hook gives the queries); fp32 math
    (:func:`._pieces.load_pairs`: interleaved rows move whole, split in registers)."""
    if INTERLEAVED or PAIR_ORDER:  # the rotated tile in pair order (for interleaved pairs the original order)
        y = load_rotated(X, rows, stride, T, c, s, HALF, BLOCK_T, BLOCK_H, INTERLEAVED)  # [BT, 2 BH]
        cols = tl.arange(0, 2 * BLOCK_H)
        tl.store(XO + rows[:, None] * stride + cols[None, :], y.to(XO.dtype.element_ty),
                 mask=(rows[:, None] < T) & (cols[None, :] < 2 * HALF))
    else:  # two contiguous halves
        a, b = load_pairs(X, rows, stride, T, HALF, BLOCK_T, BLOCK_H, False)  # [BT, BH] each
        ptrs = XO + rows[:, None] * stride + tl.arange(0, BLOCK_H)[None, :]
        mask = (rows[:, None] < T) & (tl.arange(0, BLOCK_H)[None, :] < HALF)
        tl.store(ptrs, (a * c - b * s).to(XO.dtype.element_ty), mask=mask)
        tl.store(ptrs + HALF, (a * s + b * c).to(XO.dtype.element_ty), mask=mask)


@triton.jit
def _rope_fwd(Q, K, QO, KO, TRIG, T, BH, offset, log2_base, sign, stride_b, stride_t,
              HALF: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr, KEYS_ONLY: tl.constexpr, HEADS: tl.constexpr):
    """Rotate ``BLOCK_T`` rows of ``HEADS`` (batch, head) rows of ``q`` and ``k`` (of ``BH``): row ``t`` by
    ``R^(offset + t)`` (``sign = -1``: by its inverse, the backward pass).  The same cos/sin turn the queries and the
    keys of every head: computed once per program (an accurate cos/sin is a library routine, dozens of instructions),
    they would cost a pass that moves only the keys more than its bytes.  ``KEYS_ONLY``: ``k`` alone, stored in pair
    order, for the template's queries-only rotation hook; the first heads' programs also store the cos and sin in
    ``TRIG`` (``(2, T, BLOCK_H)`` fp32), from which that hook turns the queries (the same numbers, not computed again
    by every query block)."""
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # positions
    c, s = rope_cos_sin(offset + rows, log2_base, HALF, BLOCK_H)  # [BT, BH] fp32
    s = s * sign
    if KEYS_ONLY:
        if tl.program_id(1) == 0:
            p = TRIG + rows[:, None] * BLOCK_H + tl.arange(0, BLOCK_H)[None, :]
            tl.store(p, c, mask=rows[:, None] < T)
            tl.store(p + T * BLOCK_H, s, mask=rows[:, None] < T)
    for h in tl.static_range(HEADS):
        bh = tl.program_id(1) * HEADS + h
        if bh < BH:
            head = bh.to(tl.int64) * stride_b
            if not KEYS_ONLY:
                _rotate_rows(Q + head, QO + head, rows, stride_t, T, c, s, HALF, BLOCK_T, BLOCK_H, INTERLEAVED, False)
            _rotate_rows(K + head, KO + head, rows, stride_t, T, c, s, HALF, BLOCK_T, BLOCK_H, INTERLEAVED, KEYS_ONLY)


def rotate_qk(q, k, *, base: float = 10000.0, offset: int = 0, pairing: str = "interleaved"):
    """Rotate ``q`` and ``k`` by their positions in one fused pass: row t by ``R^{offset + t}``.

    Shapes: ``q, k: (..., T, D)`` with equal shapes, ``D`` even and at most 256;
    returns ``(q_rot, k_rot)`` of the same shapes and dtype (fp16/bf16/fp32).
    Conventions exactly as :func:`pathedu.rope.apply_rope` (frequencies
    ``base^(-2n/D)``, rotation by ``+(offset + t) Omega_n``, ``pairing``
    ``"interleaved"`` = channels (2n, 2n+1), ``"half"`` = channels (n, n + D/2)),
    but with fp32 angles computed in the kernel.  Leading dims are flattened.
    In interpreter mode bf16 is rotated in fp32 and rounded back to bf16.
    Differentiable: the backward pass rotates the gradients back (the same kernel, ``-theta``).
    """
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and k.dtype != q.dtype:
        raise TypeError(f"`q` and `k` must share one dtype, got {q.dtype} and {k.dtype}")
    x = prepare_qkv(q, k, None, min_dim=2, max_dim=256, even=True, backward=True)  # v=None: q and k only
    qo, ko = _rotated(x, check_base(base), check_offset(offset), check_pairing(pairing))
    return x.result(qo), x.result(ko)


def rotary_attention(q, k, v, *, base: float = 10000.0, scale=None, pairing: str = "interleaved",
                     rotation: str = "prepass"):
    """RoPE softmax attention on the FlashAttention template, validated once.

    ``rotation="prepass"``: the keys rotated by a pass through memory and the queries by the template's
    rotation hook as each program loads them, once (``ROTATE="..._q"``: half the pass's traffic, and the
    same rotated, rounded q as the pass would store); when autograd wants gradients, :func:`rotate_qk`
    (offset 0) turns both and the template runs unchanged.  ``"fused"``: the template's rotation hook
    turns q and k as it loads them (no pass through memory, but every key tile is turned once per
    query block); when autograd wants gradients the pre-pass path runs instead.

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``; ``D`` even,
    ``D, Dv`` in 16..128; fp16/bf16/fp32; ``scale=None`` means ``D ** -0.5``.  Differentiable:
    the backward pass is the template's, then the rotation's transpose (the same kernel, ``-theta``).
    """
    x, base, pairing = _check_rotary(q, k, v, base, pairing, backward=True)
    scale = check_scale(scale, x.n.D)
    if not wants_grad(x.q, x.k, x.v):
        if check_rotation(rotation) == "fused":
            return x.result(attention_launch(x, scale, rotate=(base, pairing)))
        trig, k_rot = _rotate_launch(x, base, 0, pairing, keys_only=True)
        return x.result(attention_launch(x.with_qk(x.q, k_rot), scale, bias_arg=trig,
                                         rotate=(base, pairing + "_q")))
    check_rotation(rotation)
    return x.result(flat_attention(x.with_qk(*_rotated(x, base, 0, pairing)), scale))


def rotary_linear_attention(q, k, v, *, base: float = 10000.0, pairing: str = "interleaved",
                            rotation: str = "prepass", initial_state=None, return_state: bool = False):
    """The complex recurrence ``S_t = S_{t-1} e^{i Omega} + v_t k~_t^H``, ``o_t = Re{S_t q~_t}``: plain
    chunked linear attention (:func:`pathedu.kernels.linear_attention.chunked_linear_attention`) on q and k
    rotated by their positions, validated once.  ``rotation="prepass"``: :func:`rotate_qk` (offset 0) first,
    a pass through memory that rounds the rotated q, k to the input dtype; ``"fused"``: the template's
    rotation hook turns them in registers as each chunk is loaded (kept in fp32).

    Shapes: ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` -> ``(..., T, Dv)``; ``D`` even,
    ``D, Dv`` in 16..128; fp16/bf16/fp32, fp32 state.  ``initial_state``: ``S_{-1}``, complex (or real)
    ``(..., Dv, D/2)``, as :func:`pathedu.rope.complex_recurrent` takes it (default 0); ``return_state=True``
    returns ``(out, S_{T-1})``, the state complex64 ``(..., Dv, D/2)``: a sequence can be run in pieces, each
    piece's positions counted from 0 (the recurrence never reads a position).

    The template's real state is ``H = S'^T`` with ``S' = sum_j v_j k_j'^T`` over the turned keys ``k_j'``; a
    complex state ``S`` enters as ``S e^{i Omega} = a - i b`` (``a``, ``b``: the real columns of each channel pair)
    and leaves as ``S_{T-1} = (a - i b) e^{i Omega (T - 1)}`` (:func:`_state_to_real`, :func:`_state_to_complex`).
    Differentiable in ``q, k, v`` and ``initial_state``, and through the returned state: a call with gradients
    runs the pre-pass (whichever ``rotation``), then the template; the backward is the template's, then the
    rotation's transpose (the same pass with ``-theta``).
    """
    x, base, pairing = _check_rotary(q, k, v, base, pairing, backward=True)
    # With gradients the pre-pass turns q and k (its backward turns their gradients back) and the template runs
    # without the hook, whichever `rotation`: the turned tiles as a product's second operand (dq = P K~) do not
    # compile for Hopper in Triton 3.6 ("Illegal shared layout"), and the pass costs little beside a backward.
    fused = check_rotation(rotation) == "fused" and not wants_grad(x.q, x.k, x.v, initial_state)
    layout = "pairs" if fused else pairing  # the hook's state rows are in pair order, the pre-pass's in the input's
    h0 = None
    if initial_state is not None:
        n = x.n
        check_state(initial_state, n.lead + (n.Dv, n.D // 2), x.like, allow_complex=True,
                    shape_note=" (leading dims, Dv, D/2)")
        h0 = _state_to_real(initial_state, x, base, layout)
    return_state = check_bool(return_state, "return_state")
    if fused:
        out, ht = flat_linear_attention(x, "none", rotate=(base, pairing), h0=h0, want_state=return_state)
    else:
        out, ht = flat_linear_attention(x.with_qk(*_rotated(x, base, 0, pairing)), "none", h0=h0,
                                        want_state=return_state)
    if return_state:
        return x.result(out), _state_to_complex(ht, x, base, layout)
    return x.result(out)


def _pair_phases(D: int, base: float, steps: int, device) -> torch.Tensor:
    """``e^{i Omega_n steps}`` for the channel pairs ``n < D/2``, complex128 (angles in float64)."""
    theta = frequencies(D, base=base, dtype=torch.float64, device=device) * steps
    return torch.polar(torch.ones_like(theta), theta)


def _state_to_real(state, x: Flat, base: float, layout: str) -> torch.Tensor:
    """A complex state ``S: (..., Dv, D/2)`` (validated) as the template's ``H`` for a sequence that starts after it:
    fp32 ``(BH, D, Dv)`` with ``a = Re(S e^{i Omega})`` in the first channel of each pair and ``b = -Im(S e^{i Omega})``
    in the second, the pairs laid out as ``layout`` says (``"pairs"`` or ``"interleaved"``: ``(2n, 2n + 1)``;
    ``"half"``: ``(n, n + D/2)``).  Then the template's ``o_t`` gets ``a . q'_a + b . q'_b = Re{S e^{i Omega (t + 1)}
    q~_t}`` from it, as the recurrence does.  Differentiable."""
    n = x.n
    z = state.to(torch.complex128) * _pair_phases(n.D, base, 1, state.device)
    a, b = z.real, -z.imag  # (..., Dv, D/2)
    s = torch.cat([a, b], -1) if layout == "half" else torch.stack([a, b], -1).flatten(-2)  # (..., Dv, D)
    return s.reshape(x.BH, n.Dv, n.D).transpose(1, 2).float().contiguous()


def _state_to_complex(ht: torch.Tensor, x: Flat, base: float, layout: str) -> torch.Tensor:
    """The template's final ``H`` (fp32 ``(BH, D, Dv)``) as the complex recurrence's ``S_{T-1}``:
    ``(a - i b) e^{i Omega (T - 1)}``, complex64 ``(..., Dv, D/2)`` (:func:`_state_to_real`'s inverse after ``T``
    steps).  Differentiable."""
    n = x.n
    s = ht.transpose(1, 2).reshape(n.lead + (n.Dv, n.D))
    if layout == "half":
        a, b = s[..., : n.D // 2], s[..., n.D // 2:]
    else:
        a, b = s[..., 0::2], s[..., 1::2]
    return torch.complex(a, -b) * _pair_phases(n.D, base, n.T - 1, ht.device).to(torch.complex64)


def _check_rotary(q, k, v, base, pairing, backward=False):
    return prepare_qkv(q, k, v, even=True, backward=backward), check_base(base), check_pairing(pairing)


def _rotate_launch(x: Flat, base: float, offset: int, pairing: str, *, inverse: bool = False, qk=None,
                   keys_only: bool = False):
    """Rotate validated ``x.q, x.k`` (``(BH, T, D)``): returns new ``(BH, T, D)`` tensors, compute dtype.
    ``inverse``: rotate by ``-(offset + t) Omega`` instead (the transpose); ``qk``: rotate this
    pair of ``(BH, T, D)`` tensors instead of ``x.q, x.k`` (the backward pass's gradients);
    ``keys_only``: the keys alone, their channels in pair order, and the cos/sin table the template's queries-only
    hook turns the queries with, in the same order (returns ``(trig, k_rot)``, ``trig``: ``(2, T, BLOCK_H)`` fp32,
    ``BLOCK_H`` the pairs rounded up to a power of two)."""
    q3, k3 = (x.q, x.k) if qk is None else (t.to(x.dtype).contiguous() for t in qk)
    qo, ko = (q3 if keys_only else torch.empty_like(q3)), torch.empty_like(k3)
    half = x.n.D // 2
    block_h = triton.next_power_of_2(half)
    trig = torch.empty(2, x.n.T, block_h, dtype=torch.float32, device=k3.device) if keys_only else k3
    if not x.empty_input:
        # Interpreter: few large programs (its cost is per program).  GPU: ~2048 fp32 values per tile.
        block_t = 128 if interpreting() else max(16, min(128, 2048 // block_h))
        # The keys-only pass moves half the bytes per cos/sin of the two-tensor one: 8 heads per program share one
        # evaluation (114 -> 94 us at T = 1024, 222 -> 183 at 2048 on the H100, pathedu/data/choice_rope_heads_per_program.json).
        # The two-tensor pass ran at the speed of a copy already (parts_rope.json): one head per program.
        heads = ROPE_HEADS if keys_only else 1
        grid = (triton.cdiv(x.n.T, block_t), triton.cdiv(x.BH, heads))
        _rope_fwd[grid](
            Q=q3, K=k3, QO=qo, KO=ko, TRIG=trig,
            T=x.n.T, BH=x.BH, offset=offset, log2_base=math.log2(base), sign=-1.0 if inverse else 1.0,
            stride_b=q3.stride(0), stride_t=q3.stride(1),
            HALF=half, BLOCK_T=block_t, BLOCK_H=block_h, INTERLEAVED=pairing == "interleaved", KEYS_ONLY=keys_only,
            HEADS=heads, num_warps=4,
        )
    return (trig if keys_only else qo), ko


class _Rotate(torch.autograd.Function):
    """:func:`_rotate_launch` with a backward pass: a rotation's transpose is its inverse, so the
    gradients are rotated back by the same kernel with ``-theta``."""

    @staticmethod
    def forward(ctx, q3, k3, flat, base, offset, pairing):
        ctx.args = (flat, base, offset, pairing)
        return _rotate_launch(flat.with_qk(q3, k3), base, offset, pairing)

    @staticmethod
    def backward(ctx, dq, dk):
        flat, base, offset, pairing = ctx.args
        dq, dk = (torch.zeros_like(flat.q) if g is None else g for g in (dq, dk))
        return (*_rotate_launch(flat, base, offset, pairing, inverse=True, qk=(dq, dk)), None, None, None, None)


def _rotated(x: Flat, base: float, offset: int, pairing: str):
    """``x.q, x.k`` rotated, through :class:`_Rotate` when autograd wants their gradients."""
    if wants_grad(x.q, x.k):
        return _Rotate.apply(x.q, x.k, x, base, offset, pairing)
    return _rotate_launch(x, base, offset, pairing)


def trig_table(T: int, D: int, *, base: float = 10000.0, offset: int = 0, device=None):
    """The cos and sin the kernel computes, each ``(T, D/2)`` fp32, read off by rotating unit pairs ``(1, 0)``."""
    device = torch.device("cpu" if interpreting() else "cuda") if device is None else device
    x = torch.zeros(1, T, D, dtype=torch.float32, device=device)
    a, _ = channel_pairs(x, "half")
    a.fill_(1.0)
    xr, _ = rotate_qk(x, x, base=base, offset=offset, pairing="half")
    return channel_pairs(xr[0], "half")


def trig_error(T: int = 8192, D: int = 128, *, base: float = 10000.0, device=None) -> torch.Tensor:
    """Per position t < T: the largest error of the kernel's fp32 cos/sin against float64, ``(T,)`` float64.

    ``max_n max(|cos_k - cos|, |sin_k - sin|)`` of the angle ``t * Omega_n``: the
    largest change the fp32 angle makes to any rotated coordinate of a unit pair.
    """
    from ..rope import frequencies

    c, s = trig_table(T, D, base=base, device=device)
    theta = torch.arange(T, dtype=torch.float64, device=c.device)[:, None] * frequencies(D, base=base, device=c.device)
    err = torch.maximum((c.double() - torch.cos(theta)).abs(), (s.double() - torch.sin(theta)).abs())
    return err.amax(-1).cpu()
