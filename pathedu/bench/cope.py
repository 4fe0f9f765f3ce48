"""Chapter 11 ops: CoPE's kernels, timed beside PyTorch's SDPA (forward, or with ``--backward`` forward + backward,
the table of position embeddings then requiring grad like q, k, v).

* ``sdpa``: PyTorch SDPA, causal softmax without positions (the floor that CoPE's counts and gathers add to);
* ``cope_triton``: our kernel (:func:`pathedu.kernels.cope.cope_attention`) with one table of ``P = 64`` position
  embeddings per head (``N(0, 1)``, bf16 like the inputs); the public entry point is timed, its validation and
  the pre-pass ``qe = Q E^T`` included.

No peer computes CoPE here; the kernel's accuracy is checked by ``python -m pathedu.bench.checks cope`` against
float64 ``cope_matrix``.
"""
from __future__ import annotations

import torch

from . import Op
from ._common import generator, sdpa

P = 64  # positions in the table


def pos_emb_for(q, seed: int = 5):
    """A deterministic ``(H, P, D)`` table for ``q: (B, H, T, D)``, in ``q``'s dtype."""
    g = generator(q.device, seed)
    return torch.randn(q.shape[1], P, q.shape[-1], device=q.device, dtype=torch.float32, generator=g).to(q.dtype)


def _cope_triton(q, k, v):
    from ..kernels.cope import cope_attention

    pos_emb = pos_emb_for(q).requires_grad_(q.requires_grad)
    cope_attention(q[..., :1, :], k[..., :1, :], v[..., :1, :], pos_emb)  # compile and validate outside the timing
    return lambda: cope_attention(q, k, v, pos_emb)


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        Op("cope_triton", _cope_triton),
    ]
