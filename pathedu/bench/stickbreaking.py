"""Chapter 10 ops: stick-breaking attention's kernels, timed beside PyTorch's SDPA (forward, or with ``--backward``
forward + backward).

* ``sdpa``: PyTorch SDPA, causal softmax (a different function: the speed of light for one pass of attention);
* ``fla_stickbreaking``: flash-linear-attention's ``parallel_stickbreaking_attn`` (``attend_current=False``:
  keys strictly before the query, the first output zero; the same function as ours), in its layout
  ``[B, T, H, D]`` (inputs transposed outside the timing; its second output, the unused stick, is dropped).
  With ``--backward`` its backward is timed too: in fla 0.6 each key block has one owner, so its gradients need
  no lock (the reference implementation's lock-based accumulation of ``dK, dV`` was reported to hang on an H200
  with Triton 3.6: https://github.com/shawntan/stickbreaking-attention/issues/7);
* ``stickbreaking_triton``: our kernel (:func:`pathedu.kernels.stickbreaking.stickbreaking_attention`), validated
  (the public entry point is timed, its validation included), checked against ``fla_stickbreaking``.

The kernels' accuracy against float64 ``stickbreaking_matrix`` is checked by the GPU checks
(``python -m pathedu.bench.checks stickbreaking``), fla's included.
"""
from __future__ import annotations

from . import Op
from ._common import from_bthd, sdpa, to_bthd


def _fla_stickbreaking(q, k, v):
    from fla.ops.stickbreaking_attn import parallel_stickbreaking_attn

    qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
    return lambda: from_bthd(parallel_stickbreaking_attn(qt, kt, vt)[0])


def _stickbreaking_triton(q, k, v):
    from ..kernels.stickbreaking import stickbreaking_attention

    stickbreaking_attention(q[..., :1, :], k[..., :1, :], v[..., :1, :])  # compile and validate outside the timing
    return lambda: stickbreaking_attention(q, k, v)


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        Op("fla_stickbreaking", _fla_stickbreaking, peer=True),
        Op("stickbreaking_triton", _stickbreaking_triton, reference="fla_stickbreaking"),
    ]
