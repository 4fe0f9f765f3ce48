"""Causal masks, built once here and reused by every matrix form."""
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
