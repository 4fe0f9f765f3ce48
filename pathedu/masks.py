"""Causal masks, built once here and reused by every matrix form, and the product of masked weights
with values that keeps a non-finite value out of the rows that cannot see it (:func:`causal_matmul`)."""
from __future__ import annotations

import torch


def causal_mask(T: int, device=None, *, strict: bool = False) -> torch.Tensor:
    """Boolean ``(T, T)`` mask, True where key ``j`` is visible to query ``i``.

    ``strict=False``: ``j <= i`` (a token sees itself); ``strict=True``: ``j < i``.
    """
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Set hidden positions to ``-inf`` (never to 0: a 0 logit still gets weight)."""
    return logits.masked_fill(~mask, float("-inf"))


def causal_matmul(weights: torch.Tensor, values: torch.Tensor, *, finite: bool | None = None) -> torch.Tensor:
    """``weights @ values`` in which a zero weight never sees a non-finite value.

    In IEEE arithmetic ``0 * nan`` and ``0 * inf`` are NaN, so a plain product lets
    a NaN or inf in ``values`` at position ``t`` spoil every row whose weight on
    ``t`` is 0, the earlier rows that a causal mask hides ``t`` from included.
    Here a zero weight contributes exactly 0 whatever its value; a nonzero weight
    meets a non-finite value as IEEE says: the entry is NaN where a value it sees
    is NaN or where ``+inf`` and ``-inf`` meet, else ``+inf`` or ``-inf`` by the
    sign of ``weight * value``.

    ``weights: (..., M, N)``, ``values: (..., N, Dv)`` -> ``(..., M, Dv)``.
    ``finite=True`` says the caller knows ``values`` are all finite (a plain
    product); ``None`` checks it here, once (one host synchronisation).
    """
    if finite is None:
        finite = bool(torch.isfinite(values).all())
    if finite:
        return weights @ values
    dt = values.dtype
    out = weights @ torch.where(torch.isfinite(values), values, torch.zeros((), dtype=dt, device=values.device))
    pos, neg = (weights > 0).to(dt), (weights < 0).to(dt)  # which weights are nonzero, by sign
    nan, up, down = torch.isnan(values).to(dt), (values == float("inf")).to(dt), (values == float("-inf")).to(dt)
    # Counts of 0/1 entries: positive exactly where some nonzero weight meets such a value.
    sees_nan = ((pos + neg) @ nan) > 0
    plus = (pos @ up + neg @ down) > 0  # a contribution of +inf
    minus = (pos @ down + neg @ up) > 0  # a contribution of -inf
    inf = torch.full((), float("inf"), dtype=out.dtype, device=out.device)
    zero = torch.zeros((), dtype=out.dtype, device=out.device)
    # IEEE addition does the rest: finite + inf = inf, inf - inf = NaN, NaN stays NaN.
    corrected = out + torch.where(plus, inf, zero) + torch.where(minus, -inf, zero)
    out = torch.where(plus | minus, corrected, out)
    return out.masked_fill(sees_nan, float("nan"))
