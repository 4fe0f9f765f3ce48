"""Chapter 5 ops: PaTH attention and DeltaNet, our Triton kernels against SDPA and flash-linear-attention.

``ops()`` is what ``python -m pathedu.bench path`` times.  PaTH's transitions
use unit ``w`` and ``beta`` uniform in [0, 2) (fp32, drawn from a generator
seeded by T, so ``path_triton`` and ``fla_path`` see the same ones); DeltaNet
uses l2-normalised ``q, k`` (made outside the timed region) and ``beta`` uniform
in [0, 1), rounded to the input dtype so that both implementations see the
same numbers.  fla's layout is ``[B, T, H, D]``: transposes happen in ``setup``,
outside the timed region; outputs are returned as ``(B, H, T, Dv)`` views.
fla's ``chunk_delta_rule`` scales ``q`` by ``D ** -0.5`` unless told otherwise
and does not normalise ``q, k`` by default: it is called with ``scale=1.0``.

The chapter's GPU checks (agreement with float64 and with fla, error growth with
T, robustness at T = 16384 with ``beta`` near 2) are in :mod:`pathedu.bench.checks`
(``python -m pathedu.bench.checks path``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Op
from ._common import from_bthd, generator, sdpa, to_bthd


def path_inputs(q):
    """Unit ``w`` (fp32, like ``q``'s shape) and ``beta`` in [0, 2) (fp32, ``q.shape[:-1]``), seeded by T; they
    require grad when ``q`` does (a forward+backward benchmark)."""
    g = generator(q.device, q.shape[-2] + 1)
    w = F.normalize(torch.randn(q.shape, device=q.device, generator=g, dtype=torch.float32), dim=-1)
    beta = 2 * torch.rand(q.shape[:-1], device=q.device, generator=g, dtype=torch.float32)
    return w.requires_grad_(q.requires_grad), beta.requires_grad_(q.requires_grad)  # learned, when timing a backward


def delta_inputs(q, k):
    """l2-normalised ``q, k`` and ``beta`` in [0, 1) rounded to ``q.dtype`` (then fp32), seeded by T.  They are
    new leaves, requiring grad when ``q`` does: the normalisation stays outside the timed region, and a timed
    backward that runs again and again never reaches a graph freed by the previous one."""
    g = generator(q.device, q.shape[-2] + 2)
    beta = torch.rand(q.shape[:-1], device=q.device, generator=g, dtype=torch.float32).to(q.dtype).float()
    with torch.no_grad():
        qn, kn = (F.normalize(x.float(), dim=-1).to(q.dtype) for x in (q, k))
    return tuple(x.requires_grad_(q.requires_grad) for x in (qn, kn, beta))


def _fla_path(q, k, v):
    from fla.ops.path_attn import parallel_path_attn

    w, beta = path_inputs(q)
    args = [to_bthd(x) for x in (q, k, v, w, beta)]
    return lambda: from_bthd(parallel_path_attn(*args)[0])


def _path_triton(q, k, v, save_factors=True):
    from ..kernels.path_attention import path_attention

    w, beta = path_inputs(q)
    return lambda: path_attention(q, k, v, w, beta, save_factors=save_factors)


def _path_triton_lean(q, k, v):
    """``path_triton`` whose forward keeps only the output and its log-sum-exp (the backward makes the factors and
    the meeting points again): FlashAttention-2's memory, at the cost of two launches more."""
    return _path_triton(q, k, v, save_factors=False)


def _fla_delta(q, k, v):
    from fla.ops.delta_rule import chunk_delta_rule

    qn, kn, beta = delta_inputs(q, k)
    args = [to_bthd(x) for x in (qn, kn, v, beta.to(q.dtype))]
    return lambda: from_bthd(chunk_delta_rule(*args, scale=1.0)[0])


def _delta_triton(q, k, v):
    from ..kernels.delta_rule import chunked_delta_rule

    qn, kn, beta = delta_inputs(q, k)
    return lambda: chunked_delta_rule(qn, kn, v, beta)


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        Op("fla_path", _fla_path, peer=True),
        Op("path_triton", _path_triton, reference="fla_path"),
        Op("path_triton_lean", _path_triton_lean, reference="fla_path", backward_only=True),
        Op("fla_delta_rule", _fla_delta, peer=True),
        Op("deltanet_triton", _delta_triton, reference="fla_delta_rule"),
    ]
