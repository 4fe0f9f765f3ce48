"""Chapter 4 ops: RoPE and the complex recurrence, each as a rotation pre-pass plus an unchanged template.

Softmax side (checked against ``torch_rope_sdpa``):

* ``sdpa``: PyTorch SDPA without any position encoding (the floor: what the rotation adds to);
* ``torch_rope_sdpa``: :func:`pathedu.rope.apply_rope` on q and k (eager PyTorch), then SDPA,
  both timed as one op (the reference);
* ``rope_triton``: our fused rotation pre-pass + our FlashAttention template;
* ``fla_rope_sdpa``: flash-linear-attention's Triton rotary kernel (``fla.modules.rotary``;
  its cos/sin cache is built at the first call, outside the timing, and stored in the
  input dtype, bf16 here, which shows in its error against the reference) + SDPA.

Linear side (checked against ``torch_rope_linear``):

* ``torch_rope_linear``: :func:`pathedu.rope.apply_rope` + our chunked linear-attention kernel
  (``pathedu.nope.linear_triton``): linear attention on rotated inputs;
* ``complex_triton``: our pre-pass + the same kernel (:func:`pathedu.rope.complex_triton`);
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

BASE = 10000.0
PAIRING = "interleaved"


def _fla_rotary(q):
    """fla's rotary module for q's head dim, on q's device, with our conventions."""
    from fla.modules.rotary import RotaryEmbedding

    return RotaryEmbedding(q.shape[-1], base=BASE, interleaved=PAIRING == "interleaved", device=q.device)


def ops():
    from .. import nope, rope

    def sdpa(q, k, v):
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def torch_rope_sdpa(q, k, v):
        def fn():
            qr = rope.apply_rope(q, base=BASE, pairing=PAIRING)
            kr = rope.apply_rope(k, base=BASE, pairing=PAIRING)
            return F.scaled_dot_product_attention(qr, kr, v, is_causal=True)
        return fn

    def rope_triton(q, k, v):
        return lambda: rope.rope_triton(q, k, v, base=BASE, pairing=PAIRING)

    def fla_rope_sdpa(q, k, v):
        emb = _fla_rotary(q)
        qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # [B, T, H, D]

        def fn():
            qr, kr = emb(qt, kt)
            return F.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), v, is_causal=True)
        return fn

    def torch_rope_linear(q, k, v):
        def fn():
            qr = rope.apply_rope(q, base=BASE, pairing=PAIRING)
            kr = rope.apply_rope(k, base=BASE, pairing=PAIRING)
            return nope.linear_triton(qr, kr, v)
        return fn

    def complex_triton(q, k, v):
        return lambda: rope.complex_triton(q, k, v, base=BASE, pairing=PAIRING)

    def fla_rope_linear(q, k, v):
        from fla.ops.linear_attn import chunk_linear_attn

        emb = _fla_rotary(q)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [B, T, H, D]

        def fn():
            qr, kr = emb(qt, kt)
            o, _ = chunk_linear_attn(qr, kr, vt, scale=1.0, normalize=False)
            return o.transpose(1, 2)
        return fn

    return [
        Op("sdpa", sdpa, peer=True),
        Op("torch_rope_sdpa", torch_rope_sdpa),
        Op("rope_triton", rope_triton, reference="torch_rope_sdpa"),
        Op("fla_rope_sdpa", fla_rope_sdpa, reference="torch_rope_sdpa", peer=True),
        Op("torch_rope_linear", torch_rope_linear),
        Op("complex_triton", complex_triton, reference="torch_rope_linear"),
        Op("fla_rope_linear", fla_rope_linear, reference="torch_rope_linear", peer=True),
    ]


# Bounds for gpu_checks (max abs error relative to max |reference|, against float64).
GPU_TOL = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 5e-2}
TRIG_TOL_8192 = 2e-3  # fp32 angles up to position 8192 (tests/test_rope.py uses the same bound on the CPU)


def gpu_checks(T: int = 4096, D: int = 64, *, T_prepass: int = 8192, device: str = "cuda") -> dict:
    """Checks to run once on a CUDA GPU; returns a flat dict of results (``ok``: all passed).

    1. Robustness, bf16 (and fp16 once): ``rope_triton`` and ``complex_triton`` at ``T``
       (angles up to ``T`` radians; one batch, two heads) are finite and match float64
       references (:func:`pathedu.rope.rope_matrix`, linear attention on
       :func:`pathedu.rope.apply_rope`-rotated q, k), for both pairings.
    2. The fp32 angles of the pre-pass up to position 8192 against float64
       (:func:`pathedu.kernels.rope.trig_error`), D = 64 and 128, and the GPU's
       ``exp2``/``cos``/``sin``.
    3. The pre-pass on a bf16 ``(2, 32, T_prepass, 64)`` block at offset 0 and 4096 against
       float64 ``apply_rope``, both pairings.

    Every check is wrapped: an exception is recorded as ``<name>_error`` and makes ``ok`` False.
    ``device="cpu"`` with small ``T`` and ``T_prepass`` runs the same code in Triton's interpreter,
    as a smoke test (``tests/test_rope.py`` does).
    """
    import torch

    from .. import nope, rope
    from ..kernels.rope import rotate_qk, trig_error

    res, fails = {}, []
    dev = device
    sync = torch.cuda.synchronize if torch.device(dev).type == "cuda" else (lambda: None)

    def rel(out, ref):
        out, ref = out.double(), ref.double()
        return ((out - ref).abs().max() / ref.abs().max()).item()

    def record(name, value, ok):
        res[name] = value
        if not ok:
            fails.append(name)

    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, D, device=dev, generator=g, dtype=torch.float32) for _ in range(3))
    for pairing in rope.PAIRINGS:
        try:
            q64, k64, v64 = q.double(), k.double(), v.double()
            ref_soft = rope.rope_matrix(q64, k64, v64, pairing=pairing)
            qr64, kr64 = rope.apply_rope(q64, pairing=pairing), rope.apply_rope(k64, pairing=pairing)
            ref_lin = nope.linear_matrix(qr64, kr64, v64)
            dtypes = [torch.bfloat16, torch.float16] if pairing == "interleaved" else [torch.bfloat16]
            for dtype in dtypes:
                name = str(dtype).replace("torch.", "")
                for form, ref in ((rope.rope_triton, ref_soft), (rope.complex_triton, ref_lin)):
                    out = form(q.to(dtype), k.to(dtype), v.to(dtype), pairing=pairing)
                    sync()
                    key = f"{form.__name__}_{name}_{pairing}_T{T}"
                    finite = bool(torch.isfinite(out).all())
                    record(key + "_finite", finite, finite)
                    err = rel(out, ref) if finite else float("nan")
                    record(key + "_rel_err", err, err <= GPU_TOL[name])
        except Exception as exc:  # recorded, not fatal: the lead sees every result of one run
            record(f"robustness_{pairing}_error", f"{type(exc).__name__}: {exc}", False)

    for Dk in (64, 128):
        try:
            err = trig_error(8192, Dk, device=dev)
            record(f"prepass_fp32_trig_max_err_T8192_D{Dk}", err.max().item(), err.max().item() <= TRIG_TOL_8192)
            record(f"prepass_fp32_trig_max_err_T64_D{Dk}", err[:64].max().item(), err[:64].max().item() <= 1e-5)
        except Exception as exc:
            record(f"prepass_trig_D{Dk}_error", f"{type(exc).__name__}: {exc}", False)

    try:
        x = torch.randn(2, 32, T_prepass, 64, device=dev, generator=g, dtype=torch.float32)
        for offset in (0, 4096):
            for pairing in rope.PAIRINGS:
                xr, _ = rotate_qk(x.bfloat16(), x.bfloat16(), offset=offset, pairing=pairing)
                err = rel(xr, rope.apply_rope(x.bfloat16().double(), offset=offset, pairing=pairing))
                record(f"prepass_bf16_rel_err_{pairing}_offset{offset}", err, err <= 8e-3)
    except Exception as exc:
        record("prepass_bf16_error", f"{type(exc).__name__}: {exc}", False)

    res["failed"] = fails
    res["ok"] = not fails
    return res
