"""Chapter 3 ops: FoX through the FlashAttention template's log-gate hook, GLA / Mamba2 through
the chunked template's per-token (``"scalar"``) and per-channel (``"channel"``) gate hooks,
and their peers.

Inputs arrive as ``(B, H, T, D)`` CUDA tensors.  The forget gates are built inside ``setup``
from a seeded CUDA generator, so every op of a run sees the same gates:
``log_f = logsigmoid(3 + N(0, 1))`` (gates around 0.95, a memory of some twenty tokens),
fp32, shape ``(B, H, T)`` per token or ``(B, H, T, D)`` per channel.

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

GATE_SEED = 3


def _log_f(q, per_channel: bool = False, seed: int = GATE_SEED):
    """Deterministic fp32 log gates for ``q: (B, H, T, D)``: ``(B, H, T)`` or ``(B, H, T, D)``."""
    g = torch.Generator(device=q.device).manual_seed(seed)
    shape = tuple(q.shape) if per_channel else tuple(q.shape[:-1])
    return F.logsigmoid(3.0 + torch.randn(shape, device=q.device, dtype=torch.float32, generator=g))


def _bthd(x):
    return x.transpose(1, 2).contiguous()


# --- softmax side -----------------------------------------------------------

def _sdpa(q, k, v):
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _fla_fox(q, k, v):
    from fla.ops.forgetting_attn import parallel_forgetting_attn

    g = _log_f(q).transpose(1, 2).contiguous()  # [B, T, H], fp32, natural log
    qt, kt, vt = _bthd(q), _bthd(k), _bthd(v)
    return lambda: parallel_forgetting_attn(qt, kt, vt, g).transpose(1, 2)


def _fox_triton(q, k, v):
    from ..fox import _prepare_fox
    from ..kernels.flash_attention import attention

    log_f = _log_f(q)
    _prepare_fox(q, k, v, log_f, None)  # validate once, outside the timed region
    return lambda: attention(q, k, v, log_f=log_f)


# --- linear side --------------------------------------------------------------

def _fla_simple_gla(q, k, v):
    from fla.ops.simple_gla import chunk_simple_gla

    g = _log_f(q).transpose(1, 2).contiguous()  # [B, T, H]
    qt, kt, vt = _bthd(q), _bthd(k), _bthd(v)
    return lambda: chunk_simple_gla(qt, kt, vt, g=g, scale=1.0)[0].transpose(1, 2)


def _fla_gla(q, k, v):
    from fla.ops.gla import chunk_gla

    g = _bthd(_log_f(q, per_channel=True))  # [B, T, H, D]
    qt, kt, vt = _bthd(q), _bthd(k), _bthd(v)
    return lambda: chunk_gla(qt, kt, vt, g, scale=1.0)[0].transpose(1, 2)


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
        Op("sdpa", _sdpa, peer=True),
        Op("fla_fox", _fla_fox, peer=True),
        Op("fox_triton", _fox_triton, reference="fla_fox"),
        Op("fla_simple_gla", _fla_simple_gla, peer=True),
        Op("gla_scalar_triton", _gla_triton(False), reference="fla_simple_gla"),
        Op("fla_gla", _fla_gla, peer=True),
        Op("gla_channel_triton", _gla_triton(True), reference="fla_gla"),
    ]


# --- GPU checks ---------------------------------------------------------------

def _rel_max(out, ref) -> float:
    """max |out - ref| / max |ref| (the tests' measure), in float64."""
    out, ref = out.double(), ref.double()
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def gpu_checks(T: int = 4096, H: int = 2, D: int = 64, seed: int = 0, device: str = "cuda") -> dict:
    """The bf16 robustness case on the GPU; returns ``{check: result}`` and never raises.

    ``B = 1``, ``H`` heads, ``T = 4096``, bf16 ``q, k, v`` from a seeded generator, three gates:

    * ``strong``: ``log_f = -20`` at every step (each token sees essentially only itself);
    * ``random``: ``logsigmoid(3 + N(0, 1))`` (the benchmark's gates);
    * ``jumps``: ``-20`` or ``-0.01`` at random (long and short memories interleaved).

    For each, ``fox_triton`` (per-token gate), ``gla_triton`` with the per-token gate and
    ``gla_triton`` with a per-channel gate are run in bf16 and compared with float64
    references on the *same* bf16-rounded inputs (``fox_matrix``, ``gla_chunked``), so the
    numbers are the kernels' own error.  Each result is ``{"finite", "rel_err", "tol", "ok"}``
    with ``rel_err = max |out - ref| / max |ref|`` and ``tol = 2e-2`` (bf16).  Two more checks:
    ``gla_channel_fp32_D128_Dv32`` (the channel path with fp32 inputs, exact fp32 dots, the
    largest head dim, ``Dv != D``; ``tol = 2e-3``) and ``gla_channel_matches_scalar`` (a
    per-channel gate constant across channels equals the per-token gate).  ``all_ok`` sums up.
    A check that fails to run records ``{"ok": False, "error": ...}``.  ``device="cpu"`` runs
    the same code in Triton's interpreter (use a small ``T``: a smoke test of this function).
    """
    from .. import fox

    results: dict = {"T": T, "H": H, "D": D, "dtype": "bfloat16", "device": str(device)}
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        results["error"] = "no CUDA GPU"
        results["all_ok"] = False
        return results
    g = torch.Generator(device=dev).manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(3))
    q64, k64, v64 = q.double(), k.double(), v.double()  # the same (bf16-rounded) inputs
    u = torch.rand(1, H, T, D, device=dev, generator=g)
    per_channel = {
        "strong": torch.full((1, H, T, D), -20.0, device=dev),
        "random": F.logsigmoid(3.0 + torch.randn(1, H, T, D, device=dev, generator=g)),
        "jumps": torch.where(u < 0.5, -20.0, -0.01),
    }

    def record(name, fn, tol):
        try:
            out, ref = fn()
            finite = bool(torch.isfinite(out).all())
            err = _rel_max(out, ref) if finite else float("inf")
            results[name] = {"finite": finite, "rel_err": err, "tol": tol, "ok": finite and err <= tol}
        except Exception as exc:  # recorded, not fatal: the lead has one GPU run
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}

    for kind, lf_ch in per_channel.items():
        lf_tok = lf_ch[..., 0].contiguous()
        record(f"fox_triton_bf16_{kind}",
               lambda: (fox.fox_triton(q, k, v, lf_tok), fox.fox_matrix(q64, k64, v64, lf_tok.double())), 2e-2)
        record(f"gla_scalar_triton_bf16_{kind}",
               lambda: (fox.gla_triton(q, k, v, lf_tok), fox.gla_chunked(q64, k64, v64, lf_tok.double())), 2e-2)
        record(f"gla_channel_triton_bf16_{kind}",
               lambda: (fox.gla_triton(q, k, v, lf_ch), fox.gla_chunked(q64, k64, v64, lf_ch.double())), 2e-2)

    def fp32_wide():
        Ts = min(T, 1024)
        g2 = torch.Generator(device=dev).manual_seed(seed + 1)
        q2, k2 = (torch.randn(1, H, Ts, 128, device=dev, generator=g2) for _ in range(2))
        v2 = torch.randn(1, H, Ts, 32, device=dev, generator=g2)
        lf = F.logsigmoid(3.0 + torch.randn(1, H, Ts, 128, device=dev, generator=g2))
        return fox.gla_triton(q2, k2, v2, lf), fox.gla_chunked(q2.double(), k2.double(), v2.double(), lf.double())

    record("gla_channel_fp32_D128_Dv32", fp32_wide, 2e-3)

    def channel_vs_scalar():
        lf_tok = per_channel["random"][..., 0].contiguous()
        wide = lf_tok[..., None].expand(1, H, T, D).contiguous()
        return fox.gla_triton(q, k, v, wide), fox.gla_triton(q, k, v, lf_tok)

    record("gla_channel_matches_scalar", channel_vs_scalar, 2e-2)
    results["all_ok"] = all(r.get("ok", False) for r in results.values() if isinstance(r, dict))
    return results
