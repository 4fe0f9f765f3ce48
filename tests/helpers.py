"""Test utilities shared by every chapter's tests (one home, imported as `helpers`)."""
from __future__ import annotations

import random

import torch

# Tolerances of the book's conventions: reference forms in float64 against a
# float64 reference; Triton forms in fp32 (interpreter: exact fp32 dots) and fp16.
TOL_F64 = 1e-8
TOL_TRITON = {torch.float32: 2e-3, torch.float16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error relative to the reference's scale (max |ref|), in float64."""
    if ref.numel() == 0:
        return 0.0
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "output has NaN or inf"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def rand_qkv(lead, T, D, Dv=None, *, dtype=torch.float64, seed=0, device="cpu"):
    """Random ``q, k: (*lead, T, D)`` and ``v: (*lead, T, Dv)``."""
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    q = torch.randn(*lead, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(*lead, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(*lead, T, Dv, generator=g, dtype=torch.float64)
    return tuple(x.to(dtype=dtype, device=device) for x in (q, k, v))


N_FIXED = 4  # random_shapes(...)[:N_FIXED]: the fixed cases, without the random ones (for the costly Triton tests)


def random_shapes(n: int, *, seed: int, max_T: int = 80, dims=(16, 32), extra=()):
    """Randomized (lead, T, D, Dv) cases, always including T = 1, a T that is no
    multiple of any block size, several leading dims and Dv != D: the first
    ``N_FIXED`` cases are those fixed ones, then ``extra``, then ``n`` random ones."""
    rng = random.Random(seed)
    cases = [((2, 3), 1, dims[0], dims[0]), ((1, 2), 37, dims[0], dims[-1] + 8), ((), 65, dims[-1], dims[0]),
             ((2, 1, 2), 19, dims[0], dims[0])] + list(extra)
    for _ in range(n):
        lead = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 3)))
        cases.append((lead, rng.randint(1, max_T), rng.choice(dims), rng.choice(dims + (24,))))
    return cases


def case_id(case) -> str:
    lead, T, D, Dv = case[:4]
    return f"lead{'x'.join(map(str, lead)) or '-'}_T{T}_D{D}_Dv{Dv}"
