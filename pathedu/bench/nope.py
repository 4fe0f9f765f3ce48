"""Chapter 1 ops: our FlashAttention-style kernel and chunked linear attention vs SDPA."""
import torch.nn.functional as F

from . import Op


def ops():
    from .. import nope

    return [
        Op("sdpa", lambda q, k, v: (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), peer=True),
        Op("nope_triton", lambda q, k, v: (lambda: nope.nope_triton(q, k, v)), reference="sdpa"),
        Op("linear_triton", lambda q, k, v: (lambda: nope.linear_triton(q, k, v))),
    ]
