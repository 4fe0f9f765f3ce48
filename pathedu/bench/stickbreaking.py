"""Chapter 9 ops: stick-breaking attention's forward kernel, timed beside PyTorch's SDPA.

* ``sdpa``: PyTorch SDPA, causal softmax (a different function: the speed of light for one pass of attention);
* ``stickbreaking_triton``: our kernel (:func:`pathedu.kernels.stickbreaking.stickbreaking_attention`), validated
  (the public entry point is timed, its validation included).

No peer computes the same function here (flash-linear-attention 0.6.0's ``fla.ops`` has no stick-breaking op),
so the ratio to SDPA is the number to read; the kernel's accuracy is checked by the GPU checks
(``python -m pathedu.bench.checks stickbreaking``) against float64 ``stickbreaking_matrix``.
"""
from __future__ import annotations

from . import Op
from ._common import sdpa


def _stickbreaking_triton(q, k, v):
    from ..kernels.stickbreaking import stickbreaking_attention

    stickbreaking_attention(q[..., :1, :], k[..., :1, :], v[..., :1, :])  # compile and validate outside the timing
    return lambda: stickbreaking_attention(q, k, v)


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        Op("stickbreaking_triton", _stickbreaking_triton),
    ]
