"""Input validation shared by every form of every mechanism.

Each check raises ``TypeError`` (wrong kind of object or dtype) or
``ValueError`` (wrong shape or value) with a message that names the argument,
so that a mistake is reported at the call, not deep inside a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class QKV:
    """Sizes read off validated ``q, k, v``: ``lead`` are the batch/head dims."""

    lead: tuple
    T: int
    D: int
    Dv: int


def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"`{name}` must have a floating dtype (float16/bfloat16/float32/float64), got {x.dtype}")


def check_qkv(q, k, v) -> QKV:
    """Validate ``q, k: (..., T, D)`` and ``v: (..., T, Dv)``; return their sizes.

    The leading dims (batch, heads, ...) must be equal across the three tensors,
    as must dtype and device.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
        if x.dim() < 2:
            raise ValueError(f"`{name}` must have shape (..., T, dim) with at least 2 dims, got shape {tuple(x.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"`q`, `k`, `v` must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"`q`, `k`, `v` must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"`q`, `k`, `v` must have the same number of dims, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"leading dims of `k` {tuple(k.shape[:-2])} differ from those of `q` {tuple(q.shape[:-2])}")
    if v.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"leading dims of `v` {tuple(v.shape[:-2])} differ from those of `q` {tuple(q.shape[:-2])}")
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"sequence length of `k` ({k.shape[-2]}) differs from that of `q` ({q.shape[-2]})")
    if v.shape[-2] != q.shape[-2]:
        raise ValueError(f"sequence length of `v` ({v.shape[-2]}) differs from that of `q` ({q.shape[-2]})")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"head dim of `k` ({k.shape[-1]}) differs from that of `q` ({q.shape[-1]})")
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ValueError(f"head dims must be positive, got D={q.shape[-1]} (`q`), Dv={v.shape[-1]} (`v`)")
    return QKV(tuple(q.shape[:-2]), q.shape[-2], q.shape[-1], v.shape[-1])


def check_scale(scale, D: int) -> float:
    """``scale=None`` means ``D ** -0.5``; otherwise a positive finite number."""
    if scale is None:
        return D ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"`scale` must be a float or None, got {type(scale).__name__}")
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"`scale` must be positive and finite, got {scale}")
    return float(scale)


def check_per_token(x, name: str, sizes: QKV, like: torch.Tensor, *, extra: tuple = ()) -> torch.Tensor:
    """Validate a per-token tensor of shape ``(..., T) + extra`` matching ``like``'s leading dims."""
    _check_tensor(x, name)
    want = sizes.lead + (sizes.T,) + tuple(extra)
    if tuple(x.shape) != want:
        raise ValueError(f"`{name}` must have shape {want} (leading dims, T{', ...' if extra else ''}), got {tuple(x.shape)}")
    if x.device != like.device:
        raise ValueError(f"`{name}` must be on {like.device}, got {x.device}")
    return x


def check_kernel_inputs(sizes: QKV, dtype: torch.dtype, *, min_dim: int = 16, max_dim: int = 128) -> None:
    """What the Triton kernels accept: fp16/bf16/fp32 and head dims in [min_dim, max_dim]."""
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"Triton forms take float16, bfloat16 or float32 `q`, `k`, `v`; got {dtype} (use a reference form for float64)")
    for name, d in (("q", sizes.D), ("v", sizes.Dv)):
        if not (min_dim <= d <= max_dim):
            raise ValueError(f"Triton forms support head dims {min_dim}..{max_dim}; `{name}` has {d}")
