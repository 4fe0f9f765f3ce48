"""Chapter 4 ops: RoPE and the complex recurrence, each as a rotation pre-pass plus an unchanged template.

Softmax side (checked against ``torch_rope_sdpa``):

* ``sdpa``: PyTorch SDPA without any position encoding (the floor: what the rotation adds to);
* ``torch_rope_sdpa``: :func:`pathedu.rope.apply_rope` on q and k (eager PyTorch), then SDPA,
  both timed as one op (the reference);
* ``rope_triton``: our fused rotation pre-pass + our FlashAttention template;
* ``rope_triton_fused``: the template's rotation hook instead (q, k turned as they are loaded; forward only:
  with ``--backward`` it runs the pre-pass path, so skip it there);
* ``fla_rope_sdpa``: flash-linear-attention's Triton rotary kernel (``fla.modules.rotary``;
  its cos/sin cache is built at the first call, outside the timing, and stored in the
  input dtype, bf16 here, which shows in its error against the reference) + SDPA.

Linear side (checked against ``torch_rope_linear``):

* ``torch_rope_linear``: :func:`pathedu.rope.apply_rope` + our chunked linear-attention kernel
  (``pathedu.nope.linear_triton``): linear attention on rotated inputs;
* ``complex_triton``: our pre-pass + the same kernel (:func:`pathedu.rope.complex_triton`);
* ``complex_triton_fused``: the linear template's rotation hook instead (no pre-pass; with ``--backward`` it runs
  the pre-pass path, as ``complex_triton`` does: the hook has no backward);
* ``fla_rope_linear``: fla's rotary kernel + ``fla.ops.linear_attn.chunk_linear_attn``
  (``scale=1``, ``normalize=False``: plain causal linear attention).

All rotations use the book's default convention: ``base = 10000``, interleaved pairs
(channels 2n, 2n+1), position t rotated by ``+t Omega``; fla's ``interleaved=True``
is the same convention (checked against ``fla.modules.rotary.ops.rotary_embedding_ref``
in float64: equal to 4e-16; its default ``interleaved=False`` is our ``"half"``).  fla takes ``[B, T, H, D]``: the layout change is made in
``setup``, outside the timed region.  fla is imported inside ``setup`` so that this
module imports without it.
"""
from __future__ import annotations

import torch.nn.functional as F

from . import Op
from ._common import from_bthd, sdpa, to_bthd

BASE = 10000.0
PAIRING = "interleaved"


def _fla_rotary(q):
    """fla's rotary module for q's head dim, on q's device, with our conventions."""
    from fla.modules.rotary import RotaryEmbedding

    return RotaryEmbedding(q.shape[-1], base=BASE, interleaved=PAIRING == "interleaved", device=q.device)


def ops():
    from .. import nope, rope

    def torch_rope_sdpa(q, k, v):
        def fn():
            qr = rope.apply_rope(q, base=BASE, pairing=PAIRING)
            kr = rope.apply_rope(k, base=BASE, pairing=PAIRING)
            return F.scaled_dot_product_attention(qr, kr, v, is_causal=True)
        return fn

    def rope_triton(q, k, v):
        return lambda: rope.rope_triton(q, k, v, base=BASE, pairing=PAIRING)

    def rope_triton_fused(q, k, v):
        return lambda: rope.rope_triton(q, k, v, base=BASE, pairing=PAIRING, rotation="fused")

    def fla_rope_sdpa(q, k, v):
        emb = _fla_rotary(q)
        qt, kt = to_bthd(q), to_bthd(k)  # [B, T, H, D]

        def fn():
            qr, kr = emb(qt, kt)
            return F.scaled_dot_product_attention(from_bthd(qr), from_bthd(kr), v, is_causal=True)
        return fn

    def torch_rope_linear(q, k, v):
        def fn():
            qr = rope.apply_rope(q, base=BASE, pairing=PAIRING)
            kr = rope.apply_rope(k, base=BASE, pairing=PAIRING)
            return nope.linear_triton(qr, kr, v)
        return fn

    def complex_triton(q, k, v):
        return lambda: rope.complex_triton(q, k, v, base=BASE, pairing=PAIRING, rotation="prepass")

    def complex_triton_fused(q, k, v):
        return lambda: rope.complex_triton(q, k, v, base=BASE, pairing=PAIRING, rotation="fused")

    def fla_rope_linear(q, k, v):
        from fla.ops.linear_attn import chunk_linear_attn

        emb = _fla_rotary(q)
        qt, kt, vt = (to_bthd(x) for x in (q, k, v))  # [B, T, H, D]

        def fn():
            qr, kr = emb(qt, kt)
            o, _ = chunk_linear_attn(qr, kr, vt, scale=1.0, normalize=False)
            return from_bthd(o)
        return fn

    return [
        Op("sdpa", sdpa, peer=True),
        Op("torch_rope_sdpa", torch_rope_sdpa),
        Op("rope_triton", rope_triton, reference="torch_rope_sdpa"),
        Op("rope_triton_fused", rope_triton_fused, reference="torch_rope_sdpa"),
        Op("fla_rope_sdpa", fla_rope_sdpa, reference="torch_rope_sdpa", peer=True),
        Op("torch_rope_linear", torch_rope_linear),
        Op("complex_triton", complex_triton, reference="torch_rope_linear"),
        Op("complex_triton_fused", complex_triton_fused, reference="torch_rope_linear"),
        Op("fla_rope_linear", fla_rope_linear, reference="torch_rope_linear", peer=True),
    ]
