"""Chapter 7 ops: PaTH-FoX and Gated DeltaNet, our Triton kernels against SDPA and flash-linear-attention.

``ops()`` is what ``python -m pathedu.bench pathfox`` times.  Inputs, made in ``setup`` outside
the timed region from generators seeded by T, so that ours and fla's see the same numbers:

* PaTH-FoX: unit ``w`` and ``beta`` uniform in [0, 2) (fp32, as chapter 5's bench,
  :func:`pathedu.bench.path.path_inputs`) and log gates ``logsigmoid(3 + N(0, 1))`` (fp32, as
  chapter 3's, :func:`pathedu.bench.fox._log_f`).  fla's ``parallel_path_attn`` multiplies its
  gate by the scale (``scale * (q.Pk + sum g)``), ours does not (FoX's convention): fla is
  given ``g = log_f / scale``, computed in ``setup``.
* Gated DeltaNet: l2-normalised ``q, k`` and ``beta`` in [0, 1) rounded to the input dtype
  (:func:`pathedu.bench.path.delta_inputs`), the same log gates.  fla's
  ``chunk_gated_delta_rule(q, k, v, g, beta)`` is called with ``scale=1.0`` (it scales ``q``
  by ``D ** -0.5`` otherwise); its recurrence with ``h = S^T`` is ours.

fla's layout is ``[B, T, H, D]``: transposes happen in ``setup``; outputs are returned as
``(B, H, T, Dv)`` views.  The chapter's GPU checks (agreement with float64 and with fla,
robustness at T = 16384 with ``beta`` near 2 and gates down to -20) are in
:mod:`pathedu.bench.checks` (``python -m pathedu.bench.checks pathfox``).
"""
from __future__ import annotations

from . import Op
from ._common import from_bthd, sdpa, to_bthd
from .fox import _log_f
from .path import delta_inputs, path_inputs


def _fla_pathfox(q, k, v):
    from fla.ops.path_attn import parallel_path_attn

    w, beta = path_inputs(q)
    g = _log_f(q) * q.shape[-1] ** 0.5  # fla multiplies its gate by scale = D ** -0.5
    args = [to_bthd(x) for x in (q, k, v, w, beta, g)]
    return lambda: from_bthd(parallel_path_attn(*args)[0])


def _pathfox_triton(q, k, v, save_factors=True):
    from ..kernels.path_attention import path_attention

    w, beta = path_inputs(q)
    log_f = _log_f(q)
    return lambda: path_attention(q, k, v, w, beta, log_f=log_f, save_factors=save_factors)


def _pathfox_triton_lean(q, k, v):
    """``pathfox_triton`` with ``save_factors=False`` (see :func:`pathedu.bench.path._path_triton_lean`)."""
    return _pathfox_triton(q, k, v, save_factors=False)


def _fla_gated_delta(q, k, v):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    qn, kn, beta = delta_inputs(q, k)
    args = [to_bthd(x) for x in (qn, kn, v, _log_f(q), beta.to(q.dtype))]
    return lambda: from_bthd(chunk_gated_delta_rule(*args, scale=1.0)[0])


def _gated_deltanet_triton(q, k, v):
    from ..kernels.delta_rule import chunked_delta_rule

    qn, kn, beta = delta_inputs(q, k)
    log_f = _log_f(q)
    return lambda: chunked_delta_rule(qn, kn, v, beta, log_f=log_f)


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        Op("fla_pathfox", _fla_pathfox, peer=True),
        Op("pathfox_triton", _pathfox_triton, reference="fla_pathfox"),
        Op("pathfox_triton_lean", _pathfox_triton_lean, reference="fla_pathfox", backward_only=True),
        Op("fla_gated_delta_rule", _fla_gated_delta, peer=True),
        Op("gated_deltanet_triton", _gated_deltanet_triton, reference="fla_gated_delta_rule"),
    ]
