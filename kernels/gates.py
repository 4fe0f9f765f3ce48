r"""The log gates' prefix sums for the softmax side's gate hook (FoX, PaTH-FoX): one launch that also checks them.

FoX's bias is ``c_i - c_j`` with ``c_t = sum_{s <= t} log_f[s]`` the cumulative log gate, taken once per call in
fp32 before the attention kernel (the kernels add ``c_r - c_j`` per key block: :func:`._pieces.gate_keys`).  As
``torch.cumsum`` of the ``(BH, T)`` gates plus the gates' check (``torch.aminmax``,
:func:`pathedu.checks.log_gate_condition`) this prologue took 32 + 8 us at T = 1024, BH = 1024 on an H100
(``pathedu/data/launches_softmax_fwd.json``): a tenth of SDPA's whole forward, for 8 MB of traffic that costs about
3 us.  :func:`_gate_prefix` reads each head's gates once, writes their prefix sums, and counts the gates that break
``-inf < log_f <= 0`` as it goes, for :meth:`pathedu.checks.checked_after.defer` (as the UT preparation pass
counts ``w`` and ``beta``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import log_gate_condition
from ._launch import interpreting, next_pow2

__all__ = ["cumulative_log_gates"]

MAX_BLOCK_T = 2048  # gates per step of a program's walk (a power of two): one step up to T = 2048


@triton.jit
def _gate_prefix(LOG_F, C, BAD, T, BLOCK_T: tl.constexpr, COUNT: tl.constexpr, REVERSE: tl.constexpr):
    """Program ``bh``: ``C[bh, t] = sum_{s <= t} LOG_F[bh, s]`` for ``(BH, T)`` contiguous fp32 tensors (with
    ``REVERSE``, ``sum_{s >= t}``: the gradient's reversed sum), ``BLOCK_T`` gates a step: each step's inclusive
    scan plus the sum of the steps before it, in float64 and rounded once to fp32 (a scan in fp32 was 7-14 ulps off
    at T = 1024-2048 in the interpreter, where PyTorch's CPU ``cumsum``, which sums in float64, is within half of
    one; the bytes, not the arithmetic, set this launch's time).  ``COUNT``: the number of gates that break
    ``-inf < log_f <= 0`` (NaN breaks both comparisons) is added to both entries of ``BAD`` (``(2,)`` fp32, zeroed
    by the caller; an atomic add only where a gate is bad)."""
    bh = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_T)
    carry = tl.zeros([], dtype=tl.float64)
    bad = 0.0
    steps = tl.cdiv(T, BLOCK_T)
    for i in range(0, steps):
        t = (steps - 1 - i if REVERSE else i) * BLOCK_T + offs
        x = tl.load(LOG_F + bh * T + t, mask=t < T, other=0.0)  # [BLOCK_T]; past T: 0, a good gate
        c = carry + tl.cumsum(x.to(tl.float64), axis=0, reverse=REVERSE)  # [BLOCK_T], float64: rounded once
        tl.store(C + bh * T + t, c.to(tl.float32), mask=t < T)
        carry = tl.sum(tl.where(offs == (0 if REVERSE else BLOCK_T - 1), c, 0.0), axis=0)  # the step's whole sum
        if COUNT:
            bad += tl.sum(tl.where((x <= 0.0) & (x > float("-inf")), 0.0, 1.0), axis=0)
    if COUNT:
        if bad > 0:
            tl.atomic_add(BAD + tl.arange(0, 2), tl.zeros([2], dtype=tl.float32) + bad)


def _launch(log_f3: torch.Tensor, name: str, check, reverse: bool = False) -> torch.Tensor:
    """:func:`_gate_prefix` on ``(BH, T)`` fp32 gates (``reverse``: suffix sums); with ``check`` its count goes to
    ``check.defer``."""
    log_f3 = log_f3.detach().float().contiguous()
    c = torch.empty_like(log_f3)
    BH, T = log_f3.shape
    if log_f3.numel() == 0:
        return c
    bad = torch.zeros(2, dtype=torch.float32, device=log_f3.device) if check is not None else c
    block = min(next_pow2(T), MAX_BLOCK_T)
    _gate_prefix[(BH,)](
        LOG_F=log_f3, C=c, BAD=bad,
        T=T,
        BLOCK_T=block, COUNT=check is not None, REVERSE=reverse,
        num_warps=1 if interpreting() else max(1, min(8, block // 256)),
    )
    if check is not None:
        check.defer(log_gate_condition(log_f3, name, counted=bad), stats=bad)
    return c


class _GatePrefix(torch.autograd.Function):
    """:func:`_launch` with its backward: ``c_t = sum_{s <= t} log_f[s]``, so ``d log_f[s] = sum_{t >= s} dc_t``
    (the same launch walking right to left: one pass, summed in float64 and rounded once, where
    ``flip``, ``cumsum`` and ``flip`` again took three)."""

    @staticmethod
    def forward(ctx, log_f3, name, check):
        return _launch(log_f3, name, check)

    @staticmethod
    def backward(ctx, dc):
        return _launch(dc, "dc", None, reverse=True), None, None


def cumulative_log_gates(log_f3: torch.Tensor, name: str = "log_f", check=None) -> torch.Tensor:
    """``c = cumsum(log_f3, dim=-1)``: ``log_f3`` ``(BH, T)`` fp32 (validated, :func:`._launch.per_token`), ``c`` the
    same shape, fp32, contiguous.  ``check``: a :class:`pathedu.checks.checked_after` that receives the condition
    "``name`` is a log gate" (``-inf < log_f <= 0``), decided from the count the launch makes as it reads the gates,
    or None.  Differentiable in ``log_f3``."""
    if log_f3.requires_grad and torch.is_grad_enabled():
        return _GatePrefix.apply(log_f3, name, check)
    return _launch(log_f3, name, check)
