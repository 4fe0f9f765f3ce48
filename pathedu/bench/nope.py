"""Chapter 1 ops: our FlashAttention-style kernel and chunked linear attention vs SDPA."""
from . import Op
from ._common import sdpa


def ops():
    from .. import nope

    return [
        Op("sdpa", sdpa, peer=True),
        Op("nope_triton", lambda q, k, v: (lambda: nope.nope_triton(q, k, v)), reference="sdpa"),
        Op("linear_triton", lambda q, k, v: (lambda: nope.linear_triton(q, k, v))),
    ]
