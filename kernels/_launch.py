"""What every kernel wrapper does before a launch: validate, flatten, fix dtypes."""
from __future__ import annotations

import math

import torch
import triton

from .._device import triton_mode
from ..checks import QKV, check_kernel_inputs, check_qkv


def next_pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots; 16-bit inputs the tensor cores' fast path."""
    return "ieee" if dtype == torch.float32 else "tf32"


def interpreting() -> bool:
    return triton_mode() == "interpreter"


def prepare_qkv(q, k, v, *, min_dim=16, max_dim=128):
    """Validate ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` for a kernel and flatten the
    leading dims into one: returns ``(sizes, q3, k3, v3, compute_dtype)`` with
    ``q3: (BH, T, D)`` contiguous.

    In interpreter mode bf16 inputs are upcast to fp32 (the interpreter's bf16
    arithmetic is wrong); the caller casts the output back to the input dtype.
    """
    n: QKV = check_qkv(q, k, v)
    check_kernel_inputs(n, q.dtype, min_dim=min_dim, max_dim=max_dim)
    dtype = q.dtype
    if interpreting() and dtype == torch.bfloat16:
        dtype = torch.float32
    if not interpreting() and q.device.type != "cuda":
        raise ValueError(f"Triton forms need CUDA tensors on a GPU machine; `q` is on {q.device}")

    BH = math.prod(n.lead)

    def flat(x):
        return x.reshape((BH,) + tuple(x.shape[-2:])).to(dtype).contiguous()

    return n, flat(q), flat(k), flat(v), dtype


def prepare_per_token(x, n: QKV, BH: int) -> torch.Tensor:
    """A per-token tensor ``(..., T)`` as contiguous fp32 ``(BH, T)`` (gates are kept in fp32)."""
    return x.reshape(BH, n.T).to(torch.float32).contiguous()


def per_head(x, n: QKV, name: str, BH: int, device) -> torch.Tensor:
    """A float or a tensor broadcastable to the leading dims, as contiguous fp32 ``(BH,)``."""
    t = torch.as_tensor(x, dtype=torch.float32, device=device)
    try:
        t = torch.broadcast_to(t, n.lead)
    except RuntimeError:
        raise ValueError(f"`{name}` of shape {tuple(t.shape)} does not broadcast to the leading dims {n.lead}") from None
    return t.reshape(BH).contiguous()
