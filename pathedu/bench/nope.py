"""Chapter 1 ops: our FlashAttention-style kernel and chunked linear attention vs SDPA and flash-linear-attention.

* ``sdpa``: PyTorch SDPA, causal: the softmax side's peer and reference;
* ``nope_triton``: our FlashAttention template, checked against ``sdpa``;
* ``linear_triton``: our chunked linear template (no gate, no scale), the linear side's reference;
* ``fla_chunk_linear_attn``, ``fla_fused_chunk_linear_attn``: flash-linear-attention's chunked linear attention
  (``scale=1``, ``normalize=False``: plain causal linear attention), checked against ``linear_triton``.

With ``--backward`` every op is timed forward + backward (q, k, v require grad; fla's inputs are fresh leaves in
its layout, so the layout change is not timed).  fla is imported inside ``setup``, so this module imports without
it; its layout is ``[B, T, H, D]``: inputs are transposed in ``setup``, outputs back as a free view.
"""
from . import Op
from ._common import from_bthd, sdpa, to_bthd


def _fla_linear(fused: bool):
    def setup(q, k, v):
        from fla.ops.linear_attn import chunk_linear_attn, fused_chunk_linear_attn

        fn = fused_chunk_linear_attn if fused else chunk_linear_attn
        qt, kt, vt = to_bthd(q), to_bthd(k), to_bthd(v)
        return lambda: from_bthd(fn(qt, kt, vt, scale=1.0, normalize=False)[0])

    return setup


def ops():
    from .. import nope

    return [
        Op("sdpa", sdpa, peer=True),
        Op("nope_triton", lambda q, k, v: (lambda: nope.nope_triton(q, k, v)), reference="sdpa"),
        Op("linear_triton", lambda q, k, v: (lambda: nope.linear_triton(q, k, v))),
        Op("fla_chunk_linear_attn", _fla_linear(False), reference="linear_triton", peer=True),
        Op("fla_fused_chunk_linear_attn", _fla_linear(True), reference="linear_triton", peer=True),
    ]
