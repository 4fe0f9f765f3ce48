"""Chapter 2 ops: ALiBi through the FlashAttention template's bias hook, RetNet through the
chunked template's scalar-gate hook, and their peers.

Inputs arrive as ``(B, H, T, D)`` CUDA tensors.  Gates are constants here (no randomness):
ALiBi's slopes ``alibi_slopes(H)`` and RetNet's ``gamma_h = 1 - 2^(-5-h)``
(``retnet_gammas(H)``, the decays of the RetNet paper and of fla's ``chunk_retention``),
built inside ``setup`` on the GPU.

Softmax side (checked against ``alibi_blockwise_fp32``, our PyTorch blockwise form in fp32):

* ``sdpa``: PyTorch SDPA, causal, no bias: the speed of light for softmax attention;
* ``sdpa_alibi_mask``: SDPA with the ALiBi bias materialised as a ``(1, H, T, T)`` mask;
* ``fla_fox_const_gate``: fla's FoX kernel with the constant gate ``log f = -slope``;
* ``alibi_triton``: our kernel, bias computed from indices (the ``"alibi"`` hook);
* ``alibi_via_loggate``: our kernel's ``"loggate"`` hook fed ``log f = -slope`` (the FoX path).

Linear side (checked against ``retnet_chunked_fp32``, our PyTorch chunked form in fp32):

* ``retnet_triton``: our chunked kernel with ``log f = log gamma`` at every step;
* ``fla_chunk_retention``: fla's RetNet kernel (``scale=1``: RetNet here has no scale).

With ``--backward`` (forward + backward) q, k, v require grad; the slopes and decays stay constants, as
in the papers and in fla's ops (which take no gradient for them).

fla is imported inside ``setup``, so this module imports without it.  fla's layout is
``[B, T, H, D]``: the transposes happen in ``setup`` (inputs) and as a free view (outputs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Op
from ._common import from_bthd, sdpa, to_bthd

ALIBI_REF = "alibi_blockwise_fp32"
RETNET_REF = "retnet_chunked_fp32"


def _slopes(q):
    from ..alibi import alibi_slopes

    return alibi_slopes(q.shape[1]).to(device=q.device, dtype=torch.float32)  # (H,)


def _gammas(q):
    from ..alibi import retnet_gammas

    return retnet_gammas(q.shape[1]).to(device=q.device)  # (H,) float64; the forms cast it


# --- softmax side -----------------------------------------------------------

def _sdpa_alibi_mask(q, k, v):
    from ..alibi import alibi_bias

    T = q.shape[2]
    mask = alibi_bias(T, _slopes(q), dtype=torch.float32, device=q.device).to(q.dtype)[None]  # (1, H, T, T)
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _fla_fox_const_gate(q, k, v):
    from fla.ops.forgetting_attn import parallel_forgetting_attn

    B, H, T, _ = q.shape
    g = (-_slopes(q)).expand(B, T, H).contiguous()  # [B, T, H] fp32: the same log gate at every step
    qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
    return lambda: from_bthd(parallel_forgetting_attn(qt, kt, vt, g))


def _alibi_triton(q, k, v):
    from ..alibi import alibi_triton

    slopes = _slopes(q)
    return lambda: alibi_triton(q, k, v, slopes)


def _alibi_via_loggate(q, k, v):
    from ..kernels.flash_attention import attention

    B, H, T, _ = q.shape
    log_f = (-_slopes(q))[None, :, None].expand(B, H, T).contiguous()
    return lambda: attention(q, k, v, log_f=log_f)


def _alibi_blockwise_fp32(q, k, v):
    from ..alibi import alibi_blockwise

    qf, kf, vf = q.float(), k.float(), v.float()
    slopes = _slopes(q)
    return lambda: alibi_blockwise(qf, kf, vf, slopes, block_m=256, block_n=256)


# --- linear side --------------------------------------------------------------

def _retnet_triton(q, k, v):
    from ..alibi import retnet_triton

    gammas = _gammas(q)
    return lambda: retnet_triton(q, k, v, gammas)


def _fla_chunk_retention(q, k, v):
    from fla.ops.retention import chunk_retention

    qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
    return lambda: from_bthd(chunk_retention(qt, kt, vt, scale=1.0)[0])


def _retnet_chunked_fp32(q, k, v):
    from ..alibi import retnet_chunked

    qf, kf, vf = q.float(), k.float(), v.float()
    gammas = _gammas(q).float()
    return lambda: retnet_chunked(qf, kf, vf, gammas, chunk=128)


def ops():
    return [
        Op("sdpa", sdpa, peer=True),
        # The fp32 PyTorch references cost ~1 s a call at T = 8192 (and the materialised
        # mask ~21 GB): they are measured up to T = 2048 / 4096 only; accuracy at larger
        # T is covered by the GPU checks (pathedu.bench.checks).
        Op(ALIBI_REF, _alibi_blockwise_fp32, max_T=2048),
        Op("sdpa_alibi_mask", _sdpa_alibi_mask, reference=ALIBI_REF, peer=True, max_T=4096),
        Op("fla_fox_const_gate", _fla_fox_const_gate, reference=ALIBI_REF, peer=True),
        Op("alibi_triton", _alibi_triton, reference=ALIBI_REF),
        Op("alibi_via_loggate", _alibi_via_loggate, reference=ALIBI_REF),
        Op(RETNET_REF, _retnet_chunked_fp32, max_T=2048),
        Op("fla_chunk_retention", _fla_chunk_retention, reference=RETNET_REF, peer=True),
        Op("retnet_triton", _retnet_triton, reference=RETNET_REF),
    ]
