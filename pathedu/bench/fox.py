"""Chapter 3 ops: FoX through the FlashAttention template's log-gate hook, GLA / Mamba2 through
the chunked template's per-token (``"scalar"``) and per-channel (``"channel"``) gate hooks,
and their peers.

Inputs arrive as ``(B, H, T, D)`` CUDA tensors.  The forget gates are built inside ``setup``
from a seeded CUDA generator, so every op of a run sees the same gates:
``log_f = logsigmoid(3 + N(0, 1))`` (gates around 0.95, a memory of some twenty tokens),
fp32, shape ``(B, H, T)`` per token or ``(B, H, T, D)`` per channel; with ``--backward`` they require grad, as
q, k, v do (learned gates: every op computes their gradient too).

Softmax side:

* ``sdpa``: PyTorch SDPA, causal, no gate: the speed of light for softmax attention;
* ``fla_fox``: fla's ``parallel_forgetting_attn`` (logit ``scale q.k + sum g``, g in natural
  log, the same convention as ours);
* ``fox_triton``: our kernel, ``attention(q, k, v, log_f=...)``; checked against ``fla_fox``.

Linear side (no scale: fla is called with ``scale=1.0``; its recurrence
``h_t = h_{t-1} * exp(g_t) + k_t v_t^T``, ``o_t = scale q_t h_t`` is ours with ``h = S^T``):

* ``fla_simple_gla``: ``chunk_simple_gla`` with a per-token gate ``g: [B, T, H]``;
* ``gla_scalar_triton``: our kernel's ``"scalar"`` path; checked against ``fla_simple_gla``;
* ``fla_gla``: ``chunk_gla`` with a per-channel gate ``g: [B, T, H, D]``;
* ``gla_channel_triton``: our kernel's ``"channel"`` path; checked against ``fla_gla``.

Our ops validate their inputs once in ``setup`` (with :mod:`pathedu.fox`'s checks) and time
the kernel entry point, so no host-side check (and no device sync) sits in the timed region.
fla is imported inside ``setup``, so this module imports without it; fla's layout is
``[B, T, H, D]``: inputs are transposed in ``setup``, outputs back as a free view.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Op
from ._common import from_bthd, generator, sdpa, to_bthd

GATE_SEED = 3


def _log_f(q, per_channel: bool = False, seed: int = GATE_SEED):
    """Deterministic fp32 log gates for ``q: (B, H, T, D)``: ``(B, H, T)`` or ``(B, H, T, D)``."""
    g = generator(q.device, seed)
    shape = tuple(q.shape) if per_channel else tuple(q.shape[:-1])
    log_f = F.logsigmoid(3.0 + torch.randn(shape, device=q.device, dtype=torch.float32, generator=g))
    return log_f.requires_grad_(q.requires_grad)  # learned gates when the benchmark times a backward pass


# --- softmax side -----------------------------------------------------------

def _fla_fox(q, k, v):
    from fla.ops.forgetting_attn import parallel_forgetting_attn

    g = to_bthd(_log_f(q))  # [B, T, H], fp32, natural log
    qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
    return lambda: from_bthd(parallel_forgetting_attn(qt, kt, vt, g))


def _fox_triton(q, k, v):
    from ..fox import _prepare_fox
    from ..kernels.flash_attention import attention

    log_f = _log_f(q)
    _prepare_fox(q, k, v, log_f, None)  # validate once, outside the timed region
    return lambda: attention(q, k, v, log_f=log_f)


# --- linear side --------------------------------------------------------------

def _fla_simple_gla(q, k, v):
    from fla.ops.simple_gla import chunk_simple_gla

    g = to_bthd(_log_f(q))  # [B, T, H]
    qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
    return lambda: from_bthd(chunk_simple_gla(qt, kt, vt, g=g, scale=1.0)[0])


def _fla_gla(q, k, v):
    from fla.ops.gla import chunk_gla

    g = to_bthd(_log_f(q, per_channel=True))  # [B, T, H, D]
    qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
    return lambda: from_bthd(chunk_gla(qt, kt, vt, g, scale=1.0)[0])


def _gla_triton(per_channel: bool):
    def setup(q, k, v):
        from ..fox import _prepare_gla
        from ..kernels.linear_attention import chunked_linear_attention

        log_f = _log_f(q, per_channel=per_channel)
        _prepare_gla(q, k, v, log_f)  # validate once, outside the timed region
        return lambda: chunked_linear_attention(q, k, v, log_f=log_f)

    return setup


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        Op("fla_fox", _fla_fox, peer=True),
        Op("fox_triton", _fox_triton, reference="fla_fox"),
        Op("fla_simple_gla", _fla_simple_gla, peer=True),
        Op("gla_scalar_triton", _gla_triton(False), reference="fla_simple_gla"),
        Op("fla_gla", _fla_gla, peer=True),
        Op("gla_channel_triton", _gla_triton(True), reference="fla_gla"),
    ]
