"""GPU checks of every chapter: one module, one record schema, one command line.

    python -m pathedu.bench.checks [CHAPTER | CHAPTER.SECTION ...] [--out FILE] [--fla auto|yes|no]
    python -m pathedu.bench.checks --merge PART.json [PART.json ...] --out FILE
    python -m pathedu.bench.checks --smoke --device cpu --out FILE     (tiny sizes, Triton's interpreter)

Each chapter's checks are sections (functions ``section(rec, device, fla, **params)``) in
:data:`CHECKS`; they measure what the unit tests cannot on a CPU: bf16 on a real GPU,
long sequences, extreme gates, agreement with flash-linear-attention, the GPU's own
trigonometry.  Every measurement is one **record**, a dict with the same keys everywhere:

``chapter``, ``check`` (the section), ``op`` (what ran), ``reference`` (what it is compared with),
``dtype`` (of ``op``'s output), ``T``, ``shape`` (of ``op``'s output), ``metric``
(``rel_rms``, ``rel_max``, ``rel_rms_head``, ``max_abs``: :data:`pathedu.bench._common.METRICS`),
``value``, ``limit`` (``None``: recorded, not bounded: a peer's known inaccuracy), ``finite``
(output and value finite), ``ok`` (``finite`` and ``value <= limit``), ``params`` (the case:
gates, pairing, variant, ...), and ``error`` (only when the check raised: ``ok`` is then false).

A check never raises: a failure is a record with ``ok: false``, so one GPU run reports
everything.  The command writes ``{"meta": {...}, "records": [...]}`` (meta: command, commit
(``PATHEDU_COMMIT`` overrides git), device, versions, date, seconds per section) and exits 1
when a record is not ok.  ``pathedu/data/gpu_checks.json`` is the committed run
(:func:`pathedu.bench.load_checks` reads it); ``tests/gpu`` runs every section and asserts every
record ok.  ``--smoke`` runs the same code at the sizes of :data:`SMOKE` (CPU tests do, in
Triton's interpreter).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ._common import METRICS, from_bthd, generator, run_meta, seeded_qkv, to_bthd

BF16, FP16, FP32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
# Limits, by the dtype of the op under test.  fp32 inputs get exact fp32 dots (TF32 would give ~1e-3).
REL_MAX = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}  # max |out - ref| / max |ref|
REL_RMS = {"bfloat16": 1e-2, "float16": 5e-3, "float32": 1e-4}  # ||out - ref|| / ||ref||


def _name(dtype) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _appendix_bar(dtype) -> dict:
    """The appendix kernels' bar for ``rec.compare``: relative RMS <= 5e-3 in bf16, max error
    ``REL_MAX`` in fp32."""
    return dict(metric="rel_rms", limit=5e-3) if dtype == BF16 else dict(limit=REL_MAX[_name(dtype)])


class Recorder:
    """Collects the records of one section of a chapter's checks; :meth:`compare` runs a case and never raises."""

    def __init__(self, chapter: str, section: str, log=None):
        self.chapter, self.section = chapter, section
        self.records: list[dict] = []
        self.log = log or (lambda line: None)

    def compare(self, op: str, fn, *, reference: str, limit, metric: str = "rel_max", T=None,
                dtype=None, params=None) -> dict:
        """Run ``fn() -> (out, ref)`` and record ``metric(out, ref)`` against ``limit`` (``dtype``, ``T``:
        given when ``out`` is not the op's output itself, else read off ``out``)."""
        rec = dict(chapter=self.chapter, check=self.section, op=op, reference=reference, dtype=_name(dtype), T=T,
                   shape=None, metric=metric, value=None, limit=limit, finite=False, ok=False,
                   params=dict(params or {}))
        try:
            out, ref = fn()
            rec["dtype"] = rec["dtype"] or _name(out.dtype)
            rec["shape"] = list(out.shape)
            if rec["T"] is None:
                rec["T"] = int(out.shape[-2] if out.dim() >= 2 else out.shape[-1])
            value = float(METRICS[metric](out, ref))
            finite = bool(torch.isfinite(out).all()) and math.isfinite(value)
            rec.update(value=value if math.isfinite(value) else None, finite=finite,
                       ok=finite and (limit is None or value <= limit))
        except Exception as exc:  # recorded, not fatal: one GPU run reports every check
            rec["error"] = f"{type(exc).__name__}: {exc}"[:400]
        self.records.append(rec)
        self.log(format_record(rec))
        return rec


class _Lazy:
    """``get(name)``: ``makers[name]()`` computed on first use and kept (a failing one fails only the records
    that use it, inside :meth:`Recorder.compare`); ``get.clear()`` drops what was kept (large float64
    references, before the next case)."""

    def __init__(self, **makers):
        self.makers, self.kept = makers, {}

    def __call__(self, name):
        if name not in self.kept:
            self.kept[name] = self.makers[name]()
        return self.kept[name]

    def clear(self) -> None:
        self.kept.clear()


def format_record(r: dict) -> str:
    case = " ".join(f"{k}={v}" for k, v in r.get("params", {}).items())
    value = "-" if r["value"] is None else f"{r['value']:.2e}"
    limit = "-" if r["limit"] is None else f"{r['limit']:.0e}"
    status = "ok" if r["ok"] else "FAILED"
    line = (f"{status:6s} {r['chapter']}.{r['check']:12s} {r['op']:28s} {str(r['dtype']):9s} T={str(r['T']):6s} "
            f"{r['metric']:12s} {value:>9s} <= {limit:5s}  vs {r['reference']}  {case}")
    return line + (f"  [{r['error']}]" if "error" in r else "")


def per_slice64(fn, *args, max_elems: int = 1 << 28):
    """``fn`` in float64 on a few slices of the flattened leading dims at a time (as many as keep one
    ``T x T`` float64 matrix under ``max_elems`` entries), concatenated: bounds the memory of
    quadratic float64 references at long T.  ``args``: tensors ``(..., T, ...)`` sharing ``args[0]``'s
    leading dims ``args[0].shape[:-2]``; per-token ones ``(..., T)`` included."""
    lead = tuple(args[0].shape[:-2])
    T = args[0].shape[-2]
    flat = [a.reshape(-1, *a.shape[len(lead):]).to(F64) for a in args]
    step = max(1, max_elems // max(1, T * T))
    outs = [fn(*(a[s:s + step] for a in flat)) for s in range(0, flat[0].shape[0], step)]
    out = torch.cat(outs, 0)
    return out.reshape(*lead, *out.shape[1:])


def _want_fla(fla: str, rec: Recorder) -> bool:
    """``fla``: ``"yes"`` (run; a missing fla is a failed record), ``"no"``, ``"auto"`` (run if importable)."""
    if fla == "no":
        return False
    if importlib.util.find_spec("fla") is not None:
        return True
    if fla == "yes":
        def missing():
            import fla  # noqa: F401  (raises: recorded)

        rec.compare("fla", missing, reference="-", limit=None)
    else:
        rec.log(f"  {rec.chapter}.{rec.section}: flash-linear-attention is not installed; its comparisons are skipped")
    return False


def _raise(exc):
    raise exc


def _sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize()


# =============================================================================
# Chapter 1: NoPE and linear attention
# =============================================================================

def nope_bench_sizes(rec, dev, fla, *, Ts=(1024, 2048, 4096, 8192), B=32, H=32, D=64, **_):
    """``nope_triton`` in bf16 at the benchmark's sizes against PyTorch's SDPA (relative RMS <= 5e-3)."""
    from .. import nope

    for T in Ts:
        def case(T=T):
            q, k, v = seeded_qkv((B, H), T, D, seed=T, device=dev, dtype=BF16)
            return nope.nope_triton(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)

        rec.compare("nope_triton", case, reference="torch SDPA (bf16)", metric="rel_rms", limit=5e-3)


def nope_robust(rec, dev, fla, *, T=4096, H=2, D=64, **_):
    """Both kernels in bf16 at ``T`` against float64 matrix forms on the same (rounded) inputs."""
    from .. import nope

    q, k, v = (x.to(BF16) for x in seeded_qkv((1, H), T, D, seed=1, device=dev))
    q64, k64, v64 = (x.to(F64) for x in (q, k, v))
    rec.compare("nope_triton", lambda: (nope.nope_triton(q, k, v), nope.nope_matrix(q64, k64, v64)),
                reference="float64 nope_matrix", limit=REL_MAX["bfloat16"])
    rec.compare("linear_triton", lambda: (nope.linear_triton(q, k, v), nope.linear_matrix(q64, k64, v64)),
                reference="float64 linear_matrix", limit=REL_MAX["bfloat16"])


def nope_fp32(rec, dev, fla, *, H=2, fp32_T=1024, **_):
    """Both kernels on fp32 inputs (exact fp32 dots), the largest head dim and ``Dv != D``, against float64."""
    from .. import nope

    q, k, v = seeded_qkv((1, H), fp32_T, 128, 32, seed=2, device=dev)
    q64, k64, v64 = (x.to(F64) for x in (q, k, v))
    rec.compare("nope_triton", lambda: (nope.nope_triton(q, k, v), nope.nope_matrix(q64, k64, v64)),
                reference="float64 nope_matrix", limit=REL_MAX["float32"], params=dict(D=128, Dv=32))
    rec.compare("linear_triton", lambda: (nope.linear_triton(q, k, v), nope.linear_matrix(q64, k64, v64)),
                reference="float64 linear_matrix", limit=REL_MAX["float32"], params=dict(D=128, Dv=32))


# =============================================================================
# Chapter 2: ALiBi and RetNet
# =============================================================================

# Eight heads from extreme to none: ALiBi slopes from 8 down to 0, RetNet log gates from -20 up to 0.
ALIBI_SLOPES = [8.0, 4.0, 2.0, 1.0, 0.5, 2.0 ** -4, 2.0 ** -8, 0.0]
RETNET_LOG_GAMMAS = [-20.0, -8.0, -1.0, math.log(0.9), math.log(0.99), math.log(0.999), -2.0 ** -12, 0.0]


def _alibi_inputs(dev, T, B, D, seed=0):
    g = generator(dev, seed)
    H = len(ALIBI_SLOPES)
    q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=BF16, generator=g) for _ in range(3))
    slopes = torch.tensor(ALIBI_SLOPES, device=dev)
    log_gammas = torch.tensor(RETNET_LOG_GAMMAS, device=dev, dtype=F64)
    return q, k, v, slopes, log_gammas


def _alibi_ref64(q, k, v, slopes):
    from .. import alibi

    return alibi.alibi_blockwise(q.to(F64), k.to(F64), v.to(F64), slopes.to(F64), block_m=256, block_n=256)


def _retnet_ref64(q, k, v, log_gammas):
    from .. import alibi

    return alibi.retnet_chunked(q.to(F64), k.to(F64), v.to(F64), torch.exp(log_gammas.to(F64)), chunk=128)


def alibi_robust(rec, dev, fla, *, T=4096, B=2, D=64, **_):
    """bf16 at ``T`` with slopes up to 8 and log gates down to -20 per step: both kernels against float64
    blockwise/chunked forms (largest relative RMS error of one head), and the kernel's ``"alibi"`` and
    ``"loggate"`` hooks on the same problem (ALiBi is FoX with a constant gate)."""
    from .. import alibi
    from ..kernels.flash_attention import attention

    q, k, v, slopes, log_gammas = _alibi_inputs(dev, T, B, D)
    params = dict(slopes="8 ... 0 (8 heads)")
    get = _Lazy(ref=lambda: _alibi_ref64(q, k, v, slopes), ours=lambda: alibi.alibi_triton(q, k, v, slopes))

    def via_loggate():
        return attention(q, k, v, log_f=(-slopes)[None, :, None].expand(B, len(ALIBI_SLOPES), T).contiguous())

    rec.compare("alibi_triton", lambda: (get("ours"), get("ref")), reference="float64 alibi_blockwise",
                metric="rel_rms_head", limit=REL_RMS["bfloat16"], params=params)
    rec.compare("attention(log_f=-slope)", lambda: (via_loggate(), get("ref")),
                reference="float64 alibi_blockwise", metric="rel_rms_head", limit=REL_RMS["bfloat16"], params=params)
    rec.compare("attention(log_f=-slope)", lambda: (via_loggate(), get("ours")), reference="alibi_triton",
                metric="rel_rms_head", limit=5e-3, params=params)
    get.clear()  # frees the float64 reference before the next case
    rec.compare("retnet_triton",
                lambda: (alibi.retnet_triton(q, k, v, torch.exp(log_gammas)), _retnet_ref64(q, k, v, log_gammas)),
                reference="float64 retnet_chunked", metric="rel_rms_head", limit=REL_RMS["bfloat16"],
                params=dict(log_gammas="-20 ... 0 (8 heads)"))


def _alibi_fla_inputs(dev, T, B, D, fla_T):
    q, k, v, slopes, log_gammas = _alibi_inputs(dev, T, B, D)
    Tf = min(T, fla_T)  # the first fla_T tokens: causal outputs depend on no later token
    return tuple(x[:, :, :Tf] for x in (q, k, v)) + (slopes, log_gammas)


def alibi_fla_fox(rec, dev, fla, *, T=4096, B=2, D=64, fla_T=1024, **_):
    """flash-linear-attention's FoX (``parallel_forgetting_attn``) with the constant gate ``-slope`` on the
    robustness problem (its first ``fla_T`` tokens): our ALiBi convention and fla's agree."""
    if not _want_fla(fla, rec):
        return
    q, k, v, slopes, _ = _alibi_fla_inputs(dev, T, B, D, fla_T)

    def fox():
        from fla.ops.forgetting_attn import parallel_forgetting_attn

        gate = (-slopes).expand(q.shape[0], q.shape[2], q.shape[1]).contiguous()  # [B, T, H] fp32
        out = parallel_forgetting_attn(to_bthd(q), to_bthd(k), to_bthd(v), gate)
        return from_bthd(out), _alibi_ref64(q, k, v, slopes)

    rec.compare("fla.parallel_forgetting_attn", fox, reference="float64 alibi_blockwise",
                metric="rel_rms_head", limit=REL_RMS["bfloat16"], params=dict(gate="-slope"))


def alibi_fla_retention(rec, dev, fla, *, T=4096, B=2, D=64, fla_T=1024, **_):
    """flash-linear-attention's ``chunk_simple_gla`` with ``g_gamma = log gamma`` (``scale=1``: RetNet) on the
    robustness problem (its first ``fla_T`` tokens).  A section of its own: fla autotunes this op for
    minutes on its first call."""
    if not _want_fla(fla, rec):
        return
    q, k, v, _, log_gammas = _alibi_fla_inputs(dev, T, B, D, fla_T)

    def simple_gla():
        from fla.ops.simple_gla import chunk_simple_gla

        out = chunk_simple_gla(to_bthd(q), to_bthd(k), to_bthd(v), g_gamma=log_gammas.float(), scale=1.0)[0]
        return from_bthd(out), _retnet_ref64(q, k, v, log_gammas)

    rec.compare("fla.chunk_simple_gla", simple_gla, reference="float64 retnet_chunked",
                metric="rel_rms_head", limit=REL_RMS["bfloat16"], params=dict(g_gamma="log gamma"))


def alibi_fp32(rec, dev, fla, *, T=4096, B=2, D=64, fp32_T=1024, **_):
    """Both kernels on fp32 inputs (exact fp32 dots) against float64."""
    from .. import alibi

    q, k, v, slopes, log_gammas = _alibi_inputs(dev, T, B, D)
    q, k, v = (x[:, :, :min(T, fp32_T)].float() for x in (q, k, v))
    rec.compare("alibi_triton", lambda: (alibi.alibi_triton(q, k, v, slopes), _alibi_ref64(q, k, v, slopes)),
                reference="float64 alibi_blockwise", metric="rel_rms_head", limit=REL_RMS["float32"])
    rec.compare("retnet_triton",
                lambda: (alibi.retnet_triton(q, k, v, torch.exp(log_gammas)), _retnet_ref64(q, k, v, log_gammas)),
                reference="float64 retnet_chunked", metric="rel_rms_head", limit=REL_RMS["float32"])


# =============================================================================
# Chapter 3: FoX and GLA
# =============================================================================

def _fox_inputs(dev, T, H, D, seed=0):
    """bf16 q, k, v ``(1, H, T, D)`` and three per-channel log gates: ``strong`` (-20 every step),
    ``random`` (``logsigmoid(3 + N(0, 1))``, the benchmark's) and ``jumps`` (-20 or -0.01 at random)."""
    g = generator(dev, seed)
    q, k, v = (torch.randn(1, H, T, D, device=dev, generator=g).to(BF16) for _ in range(3))
    u = torch.rand(1, H, T, D, device=dev, generator=g)
    gates = {
        "strong": torch.full((1, H, T, D), -20.0, device=dev),
        "random": F.logsigmoid(3.0 + torch.randn(1, H, T, D, device=dev, generator=g)),
        "jumps": torch.where(u < 0.5, -20.0, -0.01),
    }
    return q, k, v, gates


def fox_robust(rec, dev, fla, *, T=4096, H=2, D=64, **_):
    """bf16 at ``T`` with three gates: ``fox_triton`` (per-token gate), ``gla_triton`` with the per-token and
    with a per-channel gate, against float64 ``fox_matrix`` / ``gla_chunked`` on the same inputs."""
    from .. import fox

    q, k, v, gates = _fox_inputs(dev, T, H, D)
    q64, k64, v64 = (x.to(F64) for x in (q, k, v))
    lim = REL_MAX["bfloat16"]
    for kind, lf_ch in gates.items():
        lf_tok = lf_ch[..., 0].contiguous()
        rec.compare("fox_triton", lambda: (fox.fox_triton(q, k, v, lf_tok),
                                                     fox.fox_matrix(q64, k64, v64, lf_tok.to(F64))),
                    reference="float64 fox_matrix", limit=lim, params=dict(gate=kind))
        rec.compare("gla_triton (token gate)", lambda: (fox.gla_triton(q, k, v, lf_tok),
                                                                  fox.gla_chunked(q64, k64, v64, lf_tok.to(F64))),
                    reference="float64 gla_chunked", limit=lim, params=dict(gate=kind))
        rec.compare("gla_triton (channel gate)", lambda: (fox.gla_triton(q, k, v, lf_ch),
                                                                    fox.gla_chunked(q64, k64, v64, lf_ch.to(F64))),
                    reference="float64 gla_chunked", limit=lim, params=dict(gate=kind))


def fox_channel(rec, dev, fla, *, T=4096, H=2, D=64, **_):
    """A per-channel gate constant across channels gives what the per-token gate gives (bf16 outputs)."""
    from .. import fox

    q, k, v, gates = _fox_inputs(dev, T, H, D)
    lf_tok = gates["random"][..., 0].contiguous()
    wide = lf_tok[..., None].expand(1, H, T, D).contiguous()
    rec.compare("gla_triton (channel gate)",
                lambda: (fox.gla_triton(q, k, v, wide), fox.gla_triton(q, k, v, lf_tok)),
                reference="gla_triton (token gate)", limit=REL_MAX["bfloat16"], params=dict(gate="random"))


def fox_fp32(rec, dev, fla, *, T=4096, H=2, fp32_T=1024, **_):
    """fp32 inputs (exact fp32 dots), the largest head dim and ``Dv != D``: FoX and the GLA channel path."""
    from .. import fox

    Ts = min(T, fp32_T)
    g = generator(dev, 1)
    q, k = (torch.randn(1, H, Ts, 128, device=dev, generator=g) for _ in range(2))
    v = torch.randn(1, H, Ts, 32, device=dev, generator=g)
    lf = F.logsigmoid(3.0 + torch.randn(1, H, Ts, 128, device=dev, generator=g))
    q64, k64, v64, lf64 = (x.to(F64) for x in (q, k, v, lf))
    lf_tok = lf[..., 0].contiguous()
    rec.compare("fox_triton", lambda: (fox.fox_triton(q, k, v, lf_tok), fox.fox_matrix(q64, k64, v64, lf64[..., 0])),
                reference="float64 fox_matrix", limit=REL_MAX["float32"], params=dict(gate="random", D=128, Dv=32))
    rec.compare("gla_triton (channel gate)",
                lambda: (fox.gla_triton(q, k, v, lf), fox.gla_chunked(q64, k64, v64, lf64)),
                reference="float64 gla_chunked", limit=REL_MAX["float32"], params=dict(gate="random", D=128, Dv=32))


# =============================================================================
# Chapter 4: RoPE and the complex recurrence
# =============================================================================

ROPE_REL_MAX = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 5e-2}  # angles up to T radians, D = 64
TRIG_TOL_8192 = 2e-3  # fp32 angles up to position 8192 (tests/test_rope.py uses the same bound on the CPU)
TRIG_TOL_64 = 1e-5
PREPASS_BF16 = 8e-3


def rope_robust(rec, dev, fla, *, T=4096, D=64, **_):
    """``rope_triton`` and ``complex_triton`` at ``T`` (angles up to ``T`` radians; one batch, two heads) in bf16
    (and fp16 once) against float64 references (``rope_matrix``; linear attention on ``apply_rope``-rotated
    q, k), for both pairings and both rotations (pre-pass, and the templates' hook: ``rotation=fused``)."""
    from .. import nope, rope

    q, k, v = seeded_qkv((1, 2), T, D, seed=0, device=dev)
    for pairing in rope.PAIRINGS:
        refs = {}

        def ref(side, pairing=pairing):
            if side not in refs:
                q64, k64, v64 = (x.to(F64) for x in (q, k, v))
                refs[side] = (rope.rope_matrix(q64, k64, v64, pairing=pairing) if side == "softmax" else
                              nope.linear_matrix(rope.apply_rope(q64, pairing=pairing),
                                                 rope.apply_rope(k64, pairing=pairing), v64))
            return refs[side]

        dtypes = [BF16, FP16] if pairing == "interleaved" else [BF16]
        for dtype in dtypes:
            for form, side, name in ((rope.rope_triton, "softmax", "float64 rope_matrix"),
                                     (rope.complex_triton, "linear", "float64 linear_matrix(apply_rope)")):
                for rotation in rope.ROTATIONS:  # a pass through memory, or the templates' hook
                    params = dict(pairing=pairing, **({"rotation": rotation} if rotation != "prepass" else {}))
                    rec.compare(form.__name__,
                                lambda: (form(q.to(dtype), k.to(dtype), v.to(dtype), pairing=pairing,
                                              rotation=rotation), ref(side)),
                                reference=name, limit=ROPE_REL_MAX[_name(dtype)], params=params)


def rope_trig(rec, dev, fla, *, trig_T=8192, **_):
    """The pre-pass's fp32 angles against float64 (:func:`pathedu.kernels.rope.trig_error`: per position, the
    largest change of a rotated unit pair) up to position ``trig_T``, D = 64 and 128: the GPU's own exp2/cos/sin."""
    from ..kernels.rope import trig_error

    for Dk in (64, 128):
        get = _Lazy(err=lambda Dk=Dk: trig_error(trig_T, Dk, device=dev))

        def err():
            return get("err")

        rec.compare("rotate_qk angles (fp32)", lambda: (err(), torch.zeros_like(err())),
                    reference="float64 cos/sin", metric="max_abs", limit=TRIG_TOL_8192, T=trig_T, dtype=FP32,
                    params=dict(D=Dk))
        rec.compare("rotate_qk angles (fp32)", lambda: (err()[:64], torch.zeros_like(err()[:64])),
                    reference="float64 cos/sin", metric="max_abs", limit=TRIG_TOL_64, T=min(64, trig_T),
                    dtype=FP32, params=dict(D=Dk))


def rope_prepass(rec, dev, fla, *, T_prepass=8192, prepass_lead=(2, 32), **_):
    """The rotation pre-pass on a bf16 ``(2, 32, T_prepass, 64)`` block at offsets 0 and 4096 against float64
    ``apply_rope``, both pairings."""
    from .. import rope
    from ..kernels.rope import rotate_qk

    x = torch.randn(*prepass_lead, T_prepass, 64, device=dev, generator=generator(dev, 1)).to(BF16)
    for offset in (0, 4096):
        for pairing in rope.PAIRINGS:
            rec.compare("rotate_qk", lambda: (rotate_qk(x, x, offset=offset, pairing=pairing)[0],
                                                         rope.apply_rope(x.to(F64), offset=offset, pairing=pairing)),
                        reference="float64 apply_rope", limit=PREPASS_BF16, params=dict(pairing=pairing, offset=offset))


# =============================================================================
# Chapter 5: PaTH, the Householder RNN and DeltaNet
# =============================================================================

def _path_inputs(dev, lead, T, D, Dv, seed, *, beta_lo=0.0, beta_hi=2.0):
    """q, k, v (fp32 from float64 draws), unit ``w`` (fp32) and ``beta`` uniform in [beta_lo, beta_hi] (fp32)."""
    g = generator(dev, seed)
    q, k = (torch.randn(*lead, T, D, device=dev, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(*lead, T, Dv, device=dev, generator=g, dtype=F64)
    w = F.normalize(torch.randn(*lead, T, D, device=dev, generator=g, dtype=F64), dim=-1).float()
    u = torch.rand(*lead, T, device=dev, generator=g, dtype=F64)
    beta = (beta_lo + (beta_hi - beta_lo) * u).float()
    return q.float(), k.float(), v.float(), w, beta


def _path64(q, k, v, w, beta):
    """PaTH in float64: :func:`pathedu.path.path_matrix`, a few heads at a time."""
    from .. import path

    return per_slice64(path.path_matrix, q, k, v, w, beta)


def _householder64(q, k, v, w, beta):
    from .. import path

    return per_slice64(path.householder_matrix, q, k, v, w, beta)


def _deltanet64(q, k, v, beta):
    from .. import path

    return per_slice64(path.deltanet_matrix, q, k, v, beta)


# (dtype, [(lead, T, D, Dv)], [(R, update)]): the main pass's non-default tiles and update forms in bf16
# (the benchmark dtype), and one shape in fp16 and fp32 (tests/gpu covers every dtype and head dim with
# the defaults); D = 96 is not a power of two.
PATH_SMALL_PLAN = [
    ("bfloat16", [((2, 3), 1, 64, 64), ((1, 3), 777, 128, 32), ((2, 1), 300, 16, 48)],
     [(2, "dense"), (1, "dense"), (2, "ut")]),
    ("float16", [((1, 2), 1000, 64, 64)], [(2, "dense")]),
    ("float32", [((1, 2), 129, 96, 80)], [(2, "dense")]),
]


def path_small(rec, dev, fla, *, plan=PATH_SMALL_PLAN, **_):
    """Odd sizes in every dtype against float64 (inputs rounded to the dtype first): PaTH with fixed tiles
    (``R`` UT blocks a query block) and both update forms, the Householder RNN (``q, k / 8``) and DeltaNet
    (l2-normalised ``q, k``, ``beta / 2``)."""
    from .. import path
    from ..kernels.path_attention import path_attention

    for dtype_name, shapes, variants in plan:
        dtype = getattr(torch, dtype_name)
        lim = REL_RMS[dtype_name]
        for i, (lead, T, D, Dv) in enumerate(shapes):
            q, k, v, w, beta = _path_inputs(dev, lead, T, D, Dv, seed=i)
            q, k, v = (x.to(dtype) for x in (q, k, v))
            shape = dict(D=D, Dv=Dv)
            get = _Lazy(ref=lambda: _path64(q, k, v, w, beta))
            for R, upd in variants:
                cfg = dict(R=R, update=upd, num_warps=4 * R)
                rec.compare("path_attention", lambda: (path_attention(q, k, v, w, beta, _config=cfg), get("ref")),
                            reference="float64 path_matrix", metric="rel_rms", limit=lim,
                            params=dict(shape, R=R, update=upd))
            get.clear()  # frees the float64 reference
            qs, ks = ((x.float() / 8).to(dtype) for x in (q, k))
            rec.compare("householder_triton", lambda: (path.householder_triton(qs, ks, v, w, beta),
                                                                _householder64(qs, ks, v, w, beta)),
                        reference="float64 householder_matrix", metric="rel_rms", limit=lim, params=shape)
            qn, kn = (F.normalize(x.float(), dim=-1).to(dtype) for x in (q, k))
            rec.compare("deltanet_triton", lambda: (path.deltanet_triton(qn, kn, v, beta / 2),
                                                             _deltanet64(qn, kn, v, beta / 2)),
                        reference="float64 deltanet_matrix", metric="rel_rms", limit=lim, params=shape)


def _compare_precisions(rec, get, op: str, reference: str, *, params: dict) -> None:
    """The three robustness comparisons of one kernel on the same (bf16-rounded) inputs: its bf16 run
    against its fp32 run and against float64 (bf16 limit), its fp32 run against float64 (fp32 limit);
    ``get("bf16")``, ``get("fp32")``, ``get("f64")``."""
    rec.compare(op, lambda: (get("bf16"), get("fp32")), reference=f"{op} (fp32)",
                metric="rel_rms", limit=REL_RMS["bfloat16"], params=params)
    rec.compare(op, lambda: (get("bf16"), get("f64")), reference=reference,
                metric="rel_rms", limit=REL_RMS["bfloat16"], params=params)
    rec.compare(op, lambda: (get("fp32"), get("f64")), reference=reference,
                metric="rel_rms", limit=REL_RMS["float32"], params=params)


def _compare_with_fla(rec, get, ours: str, fla_name: str, reference: str, *, params: dict,
                      limit: float = REL_RMS["bfloat16"]) -> None:
    """The three bf16 comparisons of one of our kernels and its flash-linear-attention peer: ours and
    fla's each against the float64 reference (``get("ours")``, ``get("fla")``, ``get("ref")``), and ours
    against fla's, all by rel_rms within ``limit`` (default: the bf16 limit)."""
    lim = limit
    rec.compare(ours, lambda: (get("ours"), get("ref")), reference=reference,
                metric="rel_rms", limit=lim, params=params)
    rec.compare(fla_name, lambda: (get("fla"), get("ref")), reference=reference,
                metric="rel_rms", limit=lim, params=params)
    rec.compare(ours, lambda: (get("ours"), get("fla")), reference=fla_name,
                metric="rel_rms", limit=lim, params=params)


def path_fla_path(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16, D = 64, beta uniform in [0, 2): our PaTH and flash-linear-attention's (``parallel_path_attn``)
    against float64 and against each other."""
    if not _want_fla(fla, rec):
        return
    from .. import path

    q, k, v, w, beta = _path_inputs(dev, fla_lead, fla_T, 64, 64, seed=fla_T)
    q, k, v = (x.to(BF16) for x in (q, k, v))

    def fla_path():
        from fla.ops.path_attn import parallel_path_attn

        return from_bthd(parallel_path_attn(*(to_bthd(x) for x in (q, k, v, w, beta)))[0])

    get = _Lazy(ref=lambda: _path64(q, k, v, w, beta), ours=lambda: path.path_triton(q, k, v, w, beta), fla=fla_path)
    _compare_with_fla(rec, get, "path_triton", "fla.parallel_path_attn", "float64 path_matrix",
                      params=dict(beta="uniform [0, 2)"))


def _delta_fla_inputs(dev, lead, T):
    """DeltaNet's inputs for the fla comparisons: l2-normalised bf16 ``q, k``, bf16 ``v``, ``beta`` in [0, 1)
    rounded to bf16 (then fp32), so that ours and fla's see the same numbers."""
    q, k, v, _, beta = _path_inputs(dev, lead, T, 64, 64, seed=T)
    qn, kn = (F.normalize(x, dim=-1).to(BF16) for x in (q, k))
    return qn, kn, v.to(BF16), (beta / 2).to(BF16).float()


def path_fla_delta(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16, D = 64, l2-normalised q, k, beta in [0, 1) (rounded to bf16, so that both see the same numbers):
    our DeltaNet and flash-linear-attention's (``chunk_delta_rule``, ``scale=1``) against float64 and against
    each other."""
    if not _want_fla(fla, rec):
        return
    from .. import path

    qn, kn, v, b = _delta_fla_inputs(dev, fla_lead, fla_T)

    def fla_delta():
        from fla.ops.delta_rule import chunk_delta_rule

        return from_bthd(chunk_delta_rule(*(to_bthd(x) for x in (qn, kn, v, b.to(BF16))), scale=1.0)[0])

    get = _Lazy(ref=lambda: _deltanet64(qn, kn, v, b), ours=lambda: path.deltanet_triton(qn, kn, v, b), fla=fla_delta,
                fp32=lambda: path.deltanet_triton(qn, kn, v, b, factor_dtype=torch.float32))
    params = dict(beta="uniform [0, 1)", qk="l2-normalised")
    _compare_with_fla(rec, get, "deltanet_triton", "fla.chunk_delta_rule", "float64 deltanet_matrix", params=params)
    _fp32_factors(rec, get, "deltanet_triton", "float64 deltanet_matrix", params)


def _fp32_factors(rec, get, ours: str, reference: str, params: dict, limit: float = REL_RMS["bfloat16"]) -> None:
    """Our DeltaNet kernel with its WY factors stored in fp32 (``factor_dtype``; bf16 is the default for bf16
    inputs) against the float64 reference: what the bytes saved cost in accuracy."""
    rec.compare(f"{ours} (fp32 factors)", lambda: (get("fp32"), get("ref")), reference=reference, metric="rel_rms",
                limit=limit, params=dict(params, factors="fp32"))


# The update's variants measured as T grows (kernels/NOTES_path.md, "Rounding to nearest before tf32 products"):
# name -> (_config, limit).
PATH_GROWTH_VARIANTS = {
    "dense": (dict(update="dense"), 1e-2),
    "ut": (dict(update="ut"), 1e-2),
    "dense_bf16upd": (dict(update="dense", update_dtype=torch.bfloat16), 2e-2),
    "dense_x3prep": (dict(update="dense", prep_precision="x3"), 1e-2),
}


def path_growth(rec, dev, fla, *, growth_Ts=(512, 2048, 8192), growth_variants=tuple(PATH_GROWTH_VARIANTS), **_):
    """bf16 PaTH against float64 as T grows, ``beta`` uniform in [0, 2) and in [1.999, 2] (reflections):
    the dense and UT updates, bf16 update operands, exact-fp32 ("x3") preparation; fla's op recorded beside
    (no limit: its error grows with T for beta near 2, 3.6e-2 at T = 8192 on an H100)."""
    from ..kernels.path_attention import path_attention

    with_fla = _want_fla(fla, rec)
    for betas, lo in (("uniform", 0.0), ("near2", 1.999)):
        for T in growth_Ts:
            q, k, v, w, beta = _path_inputs(dev, (1, 2), T, 64, 64, seed=T + 7, beta_lo=lo)
            q, k, v = (x.to(BF16) for x in (q, k, v))
            get = _Lazy(ref=lambda: _path64(q, k, v, w, beta))
            for name in growth_variants:
                cfg, lim = PATH_GROWTH_VARIANTS[name]
                rec.compare("path_attention",
                            lambda: (path_attention(q, k, v, w, beta, _config=dict(R=2, num_warps=8, **cfg)),
                                     get("ref")),
                            reference="float64 path_matrix", metric="rel_rms", limit=lim,
                            params=dict(beta=betas, variant=name))
            if with_fla:
                def fla_out():
                    from fla.ops.path_attn import parallel_path_attn

                    return from_bthd(parallel_path_attn(*(to_bthd(x) for x in (q, k, v, w, beta)))[0]), get("ref")

                rec.compare("fla.parallel_path_attn", fla_out, reference="float64 path_matrix",
                            metric="rel_rms", limit=None, params=dict(beta=betas))
            get.clear()
            if torch.device(dev).type == "cuda":
                torch.cuda.empty_cache()


def path_robust(rec, dev, fla, *, robust_T=16384, robust_H=2, D=64, **_):
    """bf16 at ``T = 16384`` with ``beta`` in [1.999, 2]: finite, and close to our fp32 run and to float64."""
    from .. import path

    q, k, v, w, beta = _path_inputs(dev, (1, robust_H), robust_T, D, D, seed=5, beta_lo=1.999)
    qr, kr, vr = (x.to(BF16) for x in (q, k, v))
    q32, k32, v32 = (x.float() for x in (qr, kr, vr))  # the same rounded numbers, in fp32
    get = _Lazy(bf16=lambda: path.path_triton(qr, kr, vr, w, beta), fp32=lambda: path.path_triton(q32, k32, v32, w, beta),
                f64=lambda: _path64(q32, k32, v32, w, beta))
    _compare_precisions(rec, get, "path_triton", "float64 path_matrix", params=dict(beta="[1.999, 2]"))


# =============================================================================
# Chapter 7: PaTH-FoX, the gated Householder RNN and Gated DeltaNet
# =============================================================================

FLA_AGREEMENT = 5e-3  # chapter 7's bound on rel_rms against fla and float64


def _pathfox_gates(dev, lead, T, seed, *, strong=False):
    """fp32 log gates ``(*lead, T)``: ``logsigmoid(3 + N(0, 1))`` (gates near 0.95); ``strong``: one token in
    twenty gets a log gate uniform in [-20, 0] instead (a near-total reset)."""
    g = generator(dev, seed + 99)
    log_f = F.logsigmoid(3.0 + torch.randn(*lead, T, device=dev, generator=g, dtype=F64))
    if strong:
        hit = torch.rand(*lead, T, device=dev, generator=g, dtype=F64) < 0.05
        log_f = torch.where(hit, -20.0 * torch.rand(*lead, T, device=dev, generator=g, dtype=F64), log_f)
    return log_f.float()


def _pathfox64(q, k, v, w, beta, log_f):
    from .. import pathfox

    return per_slice64(pathfox.pathfox_matrix, q, k, v, w, beta, log_f)


def _gated_householder64(q, k, v, w, beta, log_f):
    from .. import pathfox

    return per_slice64(pathfox.gated_householder_matrix, q, k, v, w, beta, log_f)


def _gated_deltanet64(q, k, v, beta, log_f):
    from .. import pathfox

    return per_slice64(pathfox.gated_deltanet_matrix, q, k, v, beta, log_f)


# (dtype, [(lead, T, D, Dv)]): odd sizes in every dtype (tests/gpu covers every head dim with mild gates).
PATHFOX_SMALL_PLAN = [
    ("bfloat16", [((2, 3), 1, 64, 64), ((1, 3), 777, 128, 32), ((2, 1), 300, 16, 48)]),
    ("float16", [((1, 2), 1000, 64, 64)]),
    ("float32", [((1, 2), 129, 96, 80)]),
]


def pathfox_small(rec, dev, fla, *, plan=PATHFOX_SMALL_PLAN, **_):
    """Odd sizes in every dtype against float64 (inputs rounded to the dtype first), mild and strong
    gates: PaTH-FoX, the gated Householder RNN (``q, k / 8``) and Gated DeltaNet (l2-normalised ``q, k``,
    ``beta / 2``)."""
    from .. import pathfox

    for dtype_name, shapes in plan:
        dtype = getattr(torch, dtype_name)
        lim = REL_RMS[dtype_name]
        for i, (lead, T, D, Dv) in enumerate(shapes):
            q, k, v, w, beta = _path_inputs(dev, lead, T, D, Dv, seed=i)
            q, k, v = (x.to(dtype) for x in (q, k, v))
            qs, ks = ((x.float() / 8).to(dtype) for x in (q, k))
            qn, kn = (F.normalize(x.float(), dim=-1).to(dtype) for x in (q, k))
            for strong in (False, True):
                log_f = _pathfox_gates(dev, lead, T, seed=i, strong=strong)
                params = dict(D=D, Dv=Dv, gates="strong" if strong else "mild")
                rec.compare("pathfox_triton", lambda: (pathfox.pathfox_triton(q, k, v, w, beta, log_f),
                                                       _pathfox64(q, k, v, w, beta, log_f)),
                            reference="float64 pathfox_matrix", metric="rel_rms", limit=lim, params=params)
                rec.compare("gated_householder_triton",
                            lambda: (pathfox.gated_householder_triton(qs, ks, v, w, beta, log_f),
                                     _gated_householder64(qs, ks, v, w, beta, log_f)),
                            reference="float64 gated_householder_matrix", metric="rel_rms", limit=lim,
                            params=params)
                rec.compare("gated_deltanet_triton",
                            lambda: (pathfox.gated_deltanet_triton(qn, kn, v, beta / 2, log_f),
                                     _gated_deltanet64(qn, kn, v, beta / 2, log_f)),
                            reference="float64 gated_deltanet_matrix", metric="rel_rms", limit=lim,
                            params=params)


def pathfox_fla_pathfox(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16, D = 64, beta uniform in [0, 2), gates near 0.95: our PaTH-FoX and flash-linear-attention's
    (``parallel_path_attn(..., g=log_f / scale)``: fla multiplies its gate by the scale) against float64
    and against each other, within 0.005."""
    if not _want_fla(fla, rec):
        return
    from .. import pathfox

    q, k, v, w, beta = _path_inputs(dev, fla_lead, fla_T, 64, 64, seed=fla_T)
    q, k, v = (x.to(BF16) for x in (q, k, v))
    log_f = _pathfox_gates(dev, fla_lead, fla_T, seed=fla_T)

    def fla_pathfox():
        from fla.ops.path_attn import parallel_path_attn

        g = log_f * q.shape[-1] ** 0.5  # g / scale
        return from_bthd(parallel_path_attn(*(to_bthd(x) for x in (q, k, v, w, beta, g)))[0])

    get = _Lazy(ref=lambda: _pathfox64(q, k, v, w, beta, log_f),
                ours=lambda: pathfox.pathfox_triton(q, k, v, w, beta, log_f), fla=fla_pathfox)
    _compare_with_fla(rec, get, "pathfox_triton", "fla.parallel_path_attn(g)", "float64 pathfox_matrix",
                      params=dict(beta="uniform [0, 2)", gates="mild"), limit=FLA_AGREEMENT)


def pathfox_fla_gdn(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16, D = 64, l2-normalised q, k, beta in [0, 1) (rounded to bf16), gates near 0.95: our Gated
    DeltaNet and flash-linear-attention's (``chunk_gated_delta_rule``, ``scale=1``) against float64 and
    against each other, within 0.005."""
    if not _want_fla(fla, rec):
        return
    from .. import pathfox

    qn, kn, v, b = _delta_fla_inputs(dev, fla_lead, fla_T)
    log_f = _pathfox_gates(dev, fla_lead, fla_T, seed=fla_T)

    def fla_gdn():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return from_bthd(chunk_gated_delta_rule(*(to_bthd(x) for x in (qn, kn, v, log_f, b.to(BF16))), scale=1.0)[0])

    get = _Lazy(ref=lambda: _gated_deltanet64(qn, kn, v, b, log_f),
                ours=lambda: pathfox.gated_deltanet_triton(qn, kn, v, b, log_f), fla=fla_gdn,
                fp32=lambda: pathfox.gated_deltanet_triton(qn, kn, v, b, log_f, factor_dtype=torch.float32))
    params = dict(beta="uniform [0, 1)", qk="l2-normalised", gates="mild")
    _compare_with_fla(rec, get, "gated_deltanet_triton", "fla.chunk_gated_delta_rule",
                      "float64 gated_deltanet_matrix", params=params, limit=FLA_AGREEMENT)
    _fp32_factors(rec, get, "gated_deltanet_triton", "float64 gated_deltanet_matrix", params, limit=FLA_AGREEMENT)


def pathfox_robust(rec, dev, fla, *, robust_T=16384, robust_H=2, D=64, **_):
    """bf16 at ``T = 16384`` with ``beta`` in [1.999, 2] (reflections) and strong gates (one token in
    twenty with a log gate down to -20): PaTH-FoX and Gated DeltaNet (l2-normalised ``q, k``) finite,
    close to our fp32 run and to float64."""
    from .. import pathfox

    q, k, v, w, beta = _path_inputs(dev, (1, robust_H), robust_T, D, D, seed=5, beta_lo=1.999)
    log_f = _pathfox_gates(dev, (1, robust_H), robust_T, seed=5, strong=True)
    qr, kr, vr = (x.to(BF16) for x in (q, k, v))
    qnr, knr = (F.normalize(x, dim=-1).to(BF16) for x in (q, k))
    cases = {
        "pathfox_triton": (pathfox.pathfox_triton, _pathfox64, "float64 pathfox_matrix", (qr, kr, vr, w, beta, log_f)),
        "gated_deltanet_triton": (pathfox.gated_deltanet_triton, _gated_deltanet64, "float64 gated_deltanet_matrix",
                                  (qnr, knr, vr, beta, log_f)),
    }
    params = dict(beta="[1.999, 2]", gates="strong (5% in [-20, 0])")
    for op, (kernel, ref64, reference, args) in cases.items():
        args32 = tuple(x.float() for x in args)  # the same rounded numbers, in fp32
        get = _Lazy(bf16=lambda: kernel(*args), fp32=lambda: kernel(*args32), f64=lambda: ref64(*args32))
        _compare_precisions(rec, get, op, reference, params=params)
        get.clear()  # frees this case's outputs
        if torch.device(dev).type == "cuda":
            torch.cuda.empty_cache()


# =============================================================================
# Backward passes: the softmax template's gradients, chapters 1-4
# =============================================================================

GRAD_LIMIT = 1e-2  # rel_rms of a bf16 gradient against fp32 and against float64
# ALiBi's slope gets one gradient per head, sum_ij dz_ij (j - i): T^2 terms of both signs, so it carries
# several times the rounding of the other gradients (fp16 in the interpreter: 1.7e-3 against 3.6e-4 for
# q, k, v; fp32: 2.8e-5 against 8e-7).  In bf16 its bound is five times the others'.
SLOPE_GRAD_LIMIT = 5e-2
# PaTH's transition gradients (w, beta) in the stress case, T = 16384 with beta in [1.999, 2] (reflections): the
# gradients must be finite there; bf16 against fp32 measured 1.7e-2 (q, k, v: 8.4e-3; at T = 1024 and
# uniform beta every gradient is within 3e-3).  Each of them sums dz over ~T^2/2 pairs carried through up to
# 256 blocks of products in rounded tf32 (x3 for fp32): kernels/NOTES_path.md, "The dyadic schedule".
STRESS_TRANSITION_GRAD_LIMIT = 3e-2


def _grads(fn, args, names, do):
    """``{name: gradient}`` of ``(fn(*args) * do).sum()`` for the arguments named (``args``: a dict in call order,
    fresh leaves made here), and the output itself under ``"out"``."""
    leaves = {n: (x.detach().clone().requires_grad_() if n in names else x) for n, x in args.items()}
    out = fn(*leaves.values())
    grads = torch.autograd.grad(out, [leaves[n] for n in names], do.to(out.dtype))
    return {**dict(zip(names, grads)), "out": out.detach()}


def _bf16_qkv(args: dict) -> dict:
    """``args`` with ``q, k, v`` rounded to bf16 (the other arguments, fp32, as given): a bf16 run's inputs."""
    return {n: (x.to(BF16) if n in "qkv" else x) for n, x in args.items()}


def _grads64(matrix, args: dict, names, do):
    """:func:`_grads` of the matrix form ``matrix`` in float64 (:func:`per_slice64`) on ``args``' numbers, the
    reference of every gradient check (a bf16 run's rounded inputs give the same numbers in fp32)."""
    return _grads(lambda *a: per_slice64(matrix, *a), {n: x.float() for n, x in args.items()}, names, do)


def _backward_inputs(dev, chapter, lead, T, D, seed, *, strong=False):
    """``{name: tensor}`` in call order for a softmax-side form: q, k, v (fp32 from float64 draws) and the
    chapter's extra arguments (fp32): ALiBi slopes; FoX log gates (``strong``: 5% of tokens down to -20);
    PaTH's unit ``w`` and ``beta`` (uniform in [0, 2); ``strong``: in [1.999, 2], reflections); PaTH-FoX both."""
    if chapter in ("path", "pathfox"):
        q, k, v, w, beta = _path_inputs(dev, lead, T, D, D, seed, beta_lo=1.999 if strong else 0.0)
        args = dict(q=q, k=k, v=v, w=w, beta=beta)
    else:
        g = generator(dev, seed)
        q, k, v = (torch.randn(*lead, T, D, device=dev, generator=g, dtype=F64).float() for _ in range(3))
        args = dict(q=q, k=k, v=v)
    if chapter == "alibi":
        args["slope"] = torch.linspace(0.0, 0.5, lead[-1], device=dev).expand(lead).contiguous()
    elif chapter in ("fox", "pathfox"):
        args["log_f"] = _pathfox_gates(dev, lead, T, seed, strong=strong)
    return args


def _strong_label(chapter: str, strong: bool) -> dict:
    """The ``params`` that name a backward case's inputs (see :func:`_backward_inputs`)."""
    out = {}
    if chapter in ("fox", "pathfox"):
        out["gates"] = "strong (5% in [-20, 0])" if strong else "mild"
    if chapter in ("path", "pathfox"):
        out["beta"] = "[1.999, 2]" if strong else "uniform [0, 2)"
    return out


def _backward_section(rec, dev, chapter, *, T=1024, long_T=8192, lead=(1, 2), D=64):
    """A chapter's ``*_triton`` gradients: fp32 against float64 autograd through ``*_matrix`` (the same inputs)
    at ``T``; bf16 against fp32 (the same rounded inputs) and against float64 at ``T`` and ``long_T``
    (FoX: with strong gates, 5% of tokens down to -20, at ``long_T``; PaTH: with ``beta`` in [1.999, 2];
    PaTH-FoX: both)."""
    import importlib

    mod = importlib.import_module(f"pathedu.{chapter}")
    kernel, matrix = getattr(mod, f"{chapter}_triton"), getattr(mod, f"{chapter}_matrix")
    for T_case, strong in ((T, False), (long_T, chapter in ("fox", "path", "pathfox"))):
        args = _backward_inputs(dev, chapter, lead, T_case, D, seed=T_case, strong=strong)
        names = list(args)
        # The output's gradient, rounded to bf16 for every run: the bf16 run gets it in bf16, and the others
        # must see the same numbers (the slope's gradient, a sum with much cancellation, would show the rounding).
        do = torch.randn(*lead, T_case, D, device=dev, generator=generator(dev, 1), dtype=F64).to(BF16).float()
        bf = _bf16_qkv(args)
        as32 = {n: x.float() for n, x in bf.items()}  # the bf16-rounded numbers, in fp32
        params = _strong_label(chapter, strong)
        get = _Lazy(bf16=lambda: _grads(kernel, bf, names, do), fp32=lambda: _grads(kernel, as32, names, do),
                    f64=lambda: _grads64(matrix, as32, names, do))

        if chapter in ("path", "pathfox") and T_case <= 4096:
            # A forward to be differentiated runs on the backward's schedule, not the scan: its output too.
            rec.compare(f"{chapter}_triton forward with gradients", lambda: (get("bf16")["out"], get("f64")["out"]),
                        reference=f"float64 {chapter}_matrix", metric="rel_rms", limit=REL_RMS["bfloat16"],
                        dtype=BF16, T=T_case, params=params)
        for n in names:
            p = dict(params, grad=n)
            lim = SLOPE_GRAD_LIMIT if n == "slope" else GRAD_LIMIT
            if strong and n in ("w", "beta"):
                lim = STRESS_TRANSITION_GRAD_LIMIT
            rec.compare(f"{chapter}_triton backward", lambda n=n: (get("bf16")[n], get("fp32")[n]),
                        reference=f"{chapter}_triton backward (fp32)", metric="rel_rms", limit=lim,
                        dtype=BF16, T=T_case, params=p)
            if T_case <= 4096:  # float64 T x T autograd: kept to moderate T
                rec.compare(f"{chapter}_triton backward", lambda n=n: (get("bf16")[n], get("f64")[n]),
                            reference=f"float64 autograd {chapter}_matrix", metric="rel_rms", limit=lim,
                            dtype=BF16, T=T_case, params=p)
                rec.compare(f"{chapter}_triton backward", lambda n=n: (get("fp32")[n], get("f64")[n]),
                            reference=f"float64 autograd {chapter}_matrix", metric="rel_rms",
                            limit=REL_RMS["float32"], dtype=FP32, T=T_case, params=p)
        get.clear()  # frees this length's gradients
        if torch.device(dev).type == "cuda":
            torch.cuda.empty_cache()


def _backward_check(chapter: str, long_T: int):
    """``chapter``'s ``backward`` section of :data:`CHECKS`: :func:`_backward_section` at ``grad_T`` and
    ``grad_long_T`` (by default ``long_T``)."""
    def check(rec, dev, fla, *, grad_T=1024, grad_long_T=long_T, **_):
        _backward_section(rec, dev, chapter, T=grad_T, long_T=grad_long_T)

    check.__name__ = check.__qualname__ = f"{chapter}_backward"
    return check


# The long length: 8192 tokens, 16384 for FoX, PaTH and PaTH-FoX.
nope_backward, alibi_backward, rope_backward = (_backward_check(c, 8192) for c in ("nope", "alibi", "rope"))
fox_backward, path_backward, pathfox_backward = (_backward_check(c, 16384) for c in ("fox", "path", "pathfox"))


def _linear_forms(chapter: str, dev, lead, T: int, D: int, seed: int) -> list:
    """``[(name, triton form, matrix form, {argument: tensor})]``: the linear-side forms of ``chapter`` with a
    backward pass and their inputs in call order (fp32 from float64 draws): DeltaNet's keys and the Householder
    ``w`` of unit length, ``beta`` uniform in [0, 2), RetNet's ``gamma`` per head in [0.9, 0.999], log gates as
    PaTH-FoX's checks draw them (per token) or ``logsigmoid(3 + N(0, 1))`` per channel."""
    import importlib

    mod = importlib.import_module(f"pathedu.{chapter}")
    g = generator(dev, seed)
    q, k, v, w = (torch.randn(*lead, T, D, device=dev, generator=g, dtype=F64).float() for _ in range(4))
    k_unit, w = F.normalize(k, dim=-1), F.normalize(w, dim=-1)
    beta = 2 * torch.rand(*lead, T, device=dev, generator=g, dtype=F64).float()
    log_f = _pathfox_gates(dev, lead, T, seed)
    per_channel = F.logsigmoid(3 + torch.randn(*lead, T, D, device=dev, generator=g, dtype=F64)).float()
    gamma = torch.linspace(0.9, 0.999, lead[-1], device=dev).expand(lead).contiguous()
    cases = {
        "nope": [("linear", dict(q=q, k=k, v=v))],
        "alibi": [("retnet", dict(q=q, k=k, v=v, gamma=gamma))],
        "fox": [("gla", dict(q=q, k=k, v=v, log_f=log_f)), ("gla", dict(q=q, k=k, v=v, log_f=per_channel))],
        "path": [("deltanet", dict(q=q, k=k_unit, v=v, beta=beta)), ("householder", dict(q=q, k=k, v=v, w=w, beta=beta))],
        "pathfox": [("gated_deltanet", dict(q=q, k=k_unit, v=v, beta=beta, log_f=log_f)),
                    ("gated_householder", dict(q=q, k=k, v=v, w=w, beta=beta, log_f=log_f))],
    }[chapter]
    return [(f"{form}_triton" + (" (channel gate)" if args.get("log_f") is per_channel else ""),
             getattr(mod, f"{form}_triton"), getattr(mod, f"{form}_matrix"), args) for form, args in cases]


def _linear_backward_section(rec, dev, chapter, *, T=2048, lead=(1, 2), D=64):
    """bf16 gradients of every linear-side Triton form of ``chapter`` (every tensor argument) against float64
    autograd through its matrix form, the same bf16-rounded inputs, by rel_rms within :data:`GRAD_LIMIT`: the check
    of the linear side's training where fla's backward refuses to run (Gated DeltaNet, GLA with a gate per token
    on Hopper with Triton 3.4-3.7.0) and of the others beside fla's."""
    for name, kernel, matrix, args in _linear_forms(chapter, dev, lead, T, D, seed=T):
        names = list(args)
        do = torch.randn(*lead, T, D, device=dev, generator=generator(dev, 3), dtype=F64).to(BF16).float()
        bf = _bf16_qkv(args)
        get = _Lazy(bf16=lambda: _grads(kernel, bf, names, do), f64=lambda: _grads64(matrix, bf, names, do))
        for n in names:
            rec.compare(f"{name} backward", lambda n=n: (get("bf16")[n], get("f64")[n]),
                        reference=f"float64 autograd {matrix.__name__}", metric="rel_rms", limit=GRAD_LIMIT,
                        dtype=BF16, T=T, params=dict(grad=n))
        get.clear()
        if torch.device(dev).type == "cuda":
            torch.cuda.empty_cache()


def _linear_backward_check(chapter: str):
    """``chapter``'s ``linear_backward`` section of :data:`CHECKS` (:func:`_linear_backward_section` at
    ``lin_grad_T``, head dim ``D``)."""
    def check(rec, dev, fla, *, lin_grad_T=2048, D=64, **_):
        _linear_backward_section(rec, dev, chapter, T=lin_grad_T, D=D)

    check.__name__ = check.__qualname__ = f"{chapter}_linear_backward"
    return check


nope_linear_backward, alibi_linear_backward, fox_linear_backward, path_linear_backward, pathfox_linear_backward = (
    _linear_backward_check(c) for c in ("nope", "alibi", "fox", "path", "pathfox"))


def _fla_backward(rec, dev, fla, chapter: str, fla_op: str, fla_fn, *, fla_T: int, fla_lead: tuple):
    """bf16 gradients of ``{chapter}_triton`` and of its flash-linear-attention peer ``fla_fn`` (same arguments),
    each against float64 autograd through ``{chapter}_matrix`` and against each other, by rel_rms within 0.01."""
    import importlib

    if not _want_fla(fla, rec):
        return
    mod = importlib.import_module(f"pathedu.{chapter}")
    kernel, matrix = getattr(mod, f"{chapter}_triton"), getattr(mod, f"{chapter}_matrix")
    args = _backward_inputs(dev, chapter, fla_lead, fla_T, 64, seed=fla_T)
    names = list(args)
    do = torch.randn(*fla_lead, fla_T, 64, device=dev, generator=generator(dev, 2), dtype=F64).to(BF16).float()
    bf = _bf16_qkv(args)
    get = _Lazy(ours=lambda: _grads(kernel, bf, names, do), fla=lambda: _grads(fla_fn, bf, names, do),
                ref=lambda: _grads64(matrix, bf, names, do))
    reference = f"float64 autograd {chapter}_matrix"
    for n in names:
        for a, b, ref_name in (("ours", "ref", reference), ("fla", "ref", reference),
                               ("ours", "fla", f"{fla_op} backward")):
            op = f"{chapter}_triton backward" if a == "ours" else f"{fla_op} backward"
            rec.compare(op, lambda n=n, a=a, b=b: (get(a)[n], get(b)[n]), reference=ref_name, metric="rel_rms",
                        limit=GRAD_LIMIT, dtype=BF16, T=fla_T, params=dict(_strong_label(chapter, False), grad=n))


def _bthd(*xs):
    """(B, H, T, ...) -> (B, T, H, ...) copies that keep the graph (not ``to_bthd``, which makes new leaves)."""
    return [x.transpose(1, 2).contiguous() for x in xs]


def path_fla_backward(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16 PaTH gradients (q, k, v, w, beta), ours and fla's ``parallel_path_attn``, against float64 autograd
    through ``path_matrix`` and against each other."""
    def fla_path(q, k, v, w, beta):
        from fla.ops.path_attn import parallel_path_attn

        return from_bthd(parallel_path_attn(*_bthd(q, k, v, w, beta))[0])

    _fla_backward(rec, dev, fla, "path", "fla.parallel_path_attn", fla_path, fla_T=fla_T, fla_lead=fla_lead)


def pathfox_fla_backward(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16 PaTH-FoX gradients (q, k, v, w, beta, log_f), ours and fla's ``parallel_path_attn(g=log_f / scale)``
    (fla multiplies its gate by the scale), against float64 autograd through ``pathfox_matrix`` and each other."""
    def fla_pathfox(q, k, v, w, beta, log_f):
        from fla.ops.path_attn import parallel_path_attn

        return from_bthd(parallel_path_attn(*_bthd(q, k, v, w, beta, log_f * q.shape[-1] ** 0.5))[0])

    _fla_backward(rec, dev, fla, "pathfox", "fla.parallel_path_attn(g)", fla_pathfox, fla_T=fla_T,
                  fla_lead=fla_lead)


def fox_fla_backward(rec, dev, fla, *, fla_T=2048, fla_lead=(1, 4), **_):
    """bf16 FoX gradients (q, k, v, log_f), ours and flash-linear-attention's (``parallel_forgetting_attn``),
    against float64 autograd through ``fox_matrix`` and against each other."""
    def fla_fox(q, k, v, log_f):
        from fla.ops.forgetting_attn import parallel_forgetting_attn

        return from_bthd(parallel_forgetting_attn(*_bthd(q, k, v, log_f)))

    _fla_backward(rec, dev, fla, "fox", "fla.parallel_forgetting_attn", fla_fox, fla_T=fla_T, fla_lead=fla_lead)


# =============================================================================
# Registry, sizes, runner, command line
# =============================================================================

# chapter -> {section: function}; a later chapter adds its entry here.
# =============================================================================
# Chapters 10 and 11: stick-breaking attention and CoPE (forward kernels)
# =============================================================================

def stickbreaking_robust(rec, dev, fla, *, T=4096, H=2, D=64, fp32_T=1024, **_):
    """bf16 at ``T`` against float64 ``stickbreaking_matrix`` on the same (rounded) inputs (relative RMS <= 5e-3),
    also with logits scaled by 8 (gates near 0 and 1: the log-space form must hold); bf16 and fp32 inputs at
    ``fp32_T`` with the largest head dim and ``Dv != D`` against float64."""
    from .. import stickbreaking

    for spread in (1.0, 8.0):
        q, k, v = (x.to(BF16) for x in seeded_qkv((1, H), T, D, seed=9, device=dev))
        q = (spread * q.float()).to(BF16)
        q64, k64, v64 = (x.to(F64) for x in (q, k, v))
        rec.compare("stickbreaking_triton",
                    lambda: (stickbreaking.stickbreaking_triton(q, k, v), stickbreaking.stickbreaking_matrix(q64, k64, v64)),
                    reference="float64 stickbreaking_matrix", metric="rel_rms", limit=5e-3,
                    params=dict(logit_spread=spread))
    for dtype in (BF16, FP32):  # the largest head dim with Dv != D: where CoPE's 64-row tiles once went wrong
        q, k, v = (x.to(dtype) for x in seeded_qkv((1, H), fp32_T, 128, 32, seed=10, device=dev))
        q64, k64, v64 = (x.to(F64) for x in (q, k, v))
        rec.compare("stickbreaking_triton",
                    lambda: (stickbreaking.stickbreaking_triton(q, k, v),
                             stickbreaking.stickbreaking_matrix(q64, k64, v64)),
                    reference="float64 stickbreaking_matrix", params=dict(D=128, Dv=32),
                    **_appendix_bar(dtype))


def stickbreaking_fla(rec, dev, fla, *, T=4096, H=2, D=64, **_):
    """flash-linear-attention's ``parallel_stickbreaking_attn`` (``attend_current=False``) in bf16 against float64
    ``stickbreaking_matrix`` on the same rounded inputs, and against our kernel: the peer computes our function
    (keys strictly before the query, the first output zero), so the benchmark compares like with like."""
    if not _want_fla(fla, rec):
        return
    from .. import stickbreaking

    q, k, v = (x.to(BF16) for x in seeded_qkv((1, H), T, D, seed=9, device=dev))
    q64, k64, v64 = (x.to(F64) for x in (q, k, v))

    def fla_sb():
        from fla.ops.stickbreaking_attn import parallel_stickbreaking_attn

        return from_bthd(parallel_stickbreaking_attn(to_bthd(q), to_bthd(k), to_bthd(v))[0])

    rec.compare("fla.parallel_stickbreaking_attn", lambda: (fla_sb(), stickbreaking.stickbreaking_matrix(q64, k64, v64)),
                reference="float64 stickbreaking_matrix", metric="rel_rms", limit=5e-3)
    rec.compare("stickbreaking_triton", lambda: (stickbreaking.stickbreaking_triton(q, k, v), fla_sb()),
                reference="fla.parallel_stickbreaking_attn", metric="rel_rms", limit=5e-3)


def cope_robust(rec, dev, fla, *, T=4096, H=2, D=64, P=64, fp32_T=1024, **_):
    """bf16 at ``T`` with a table of ``P`` positions per head (far keys clamped) against float64 ``cope_matrix`` on
    the same (rounded) inputs (relative RMS <= 5e-3); bf16 and fp32 inputs at ``fp32_T``, head dim 128, ``Dv != D``."""
    from .. import cope

    def table(D_, dtype, seed):
        g = generator(dev, seed)
        return torch.randn(H, P, D_, device=dev, dtype=torch.float32, generator=g).to(dtype)

    q, k, v = (x.to(BF16) for x in seeded_qkv((1, H), T, D, seed=11, device=dev))
    E = table(D, BF16, 12)
    q64, k64, v64, E64 = (x.to(F64) for x in (q, k, v, E))
    rec.compare("cope_triton", lambda: (cope.cope_triton(q, k, v, E), cope.cope_matrix(q64, k64, v64, E64)),
                reference="float64 cope_matrix", metric="rel_rms", limit=5e-3, params=dict(P=P))
    for dtype in (BF16, FP32):  # head dim 128, Dv 32: 64-row tiles gave wrong rows here in bf16 (kernels/cope.py)
        q, k, v = (x.to(dtype) for x in seeded_qkv((1, H), fp32_T, 128, 32, seed=13, device=dev))
        E = table(128, dtype, 14)
        q64, k64, v64, E64 = (x.to(F64) for x in (q, k, v, E))
        rec.compare("cope_triton", lambda: (cope.cope_triton(q, k, v, E), cope.cope_matrix(q64, k64, v64, E64)),
                    reference="float64 cope_matrix", params=dict(P=P, D=128, Dv=32),
                    **_appendix_bar(dtype))


CHECKS = {
    "nope": {"bench_sizes": nope_bench_sizes, "robust": nope_robust, "fp32": nope_fp32, "backward": nope_backward,
             "linear_backward": nope_linear_backward},
    "alibi": {"robust": alibi_robust, "fla_fox": alibi_fla_fox, "fla_retention": alibi_fla_retention,
              "fp32": alibi_fp32, "backward": alibi_backward, "linear_backward": alibi_linear_backward},
    "fox": {"robust": fox_robust, "channel": fox_channel, "fp32": fox_fp32, "backward": fox_backward,
            "fla_backward": fox_fla_backward, "linear_backward": fox_linear_backward},
    "rope": {"robust": rope_robust, "trig": rope_trig, "prepass": rope_prepass, "backward": rope_backward},
    "path": {"small": path_small, "fla_path": path_fla_path, "fla_delta": path_fla_delta, "growth": path_growth,
             "robust": path_robust, "backward": path_backward, "fla_backward": path_fla_backward,
             "linear_backward": path_linear_backward},
    "pathfox": {"small": pathfox_small, "fla_pathfox": pathfox_fla_pathfox, "fla_gdn": pathfox_fla_gdn,
                "robust": pathfox_robust, "backward": pathfox_backward, "fla_backward": pathfox_fla_backward,
                "linear_backward": pathfox_linear_backward},
    "stickbreaking": {"robust": stickbreaking_robust, "fla": stickbreaking_fla},
    "cope": {"robust": cope_robust},
}

# Tiny sizes for a CPU run in Triton's interpreter (a smoke test of this module, not a check of the kernels).
SMOKE = {
    "nope": dict(Ts=(40,), B=1, H=2, D=16, T=40, fp32_T=24, grad_T=24, grad_long_T=40, lin_grad_T=24),
    "alibi": dict(T=40, B=1, D=16, fla_T=24, fp32_T=24, grad_T=24, grad_long_T=40, lin_grad_T=24),
    "fox": dict(T=40, H=2, D=16, fp32_T=24, grad_T=24, grad_long_T=40, fla_T=24, fla_lead=(1, 1), lin_grad_T=24),
    "rope": dict(T=40, D=16, trig_T=8192, T_prepass=16, prepass_lead=(1, 2), grad_T=24, grad_long_T=40),
    "path": dict(plan=[("bfloat16", [((1, 1), 33, 16, 24)], [(1, "dense"), (2, "ut")]),
                       ("float32", [((1, 1), 1, 32, 16)], [(1, "dense")])],
                 fla_T=40, fla_lead=(1, 1), growth_Ts=(24,), growth_variants=("dense_x3prep",),
                 robust_T=40, robust_H=1, D=16, grad_T=24, grad_long_T=40, lin_grad_T=24),
    "pathfox": dict(plan=[("bfloat16", [((1, 1), 33, 16, 24)]), ("float32", [((1, 1), 1, 32, 16)])],
                    fla_T=40, fla_lead=(1, 1), robust_T=40, robust_H=1, D=16, grad_T=24, grad_long_T=40,
                    lin_grad_T=24),
    "stickbreaking": dict(T=40, H=1, D=16, fp32_T=24),
    "cope": dict(T=40, H=1, D=16, P=8, fp32_T=24),
}


def targets(names=None) -> list[tuple[str, str]]:
    """``[(chapter, section)]`` for ``CHAPTER`` or ``CHAPTER.SECTION`` names (all when ``names`` is empty)."""
    out = []
    for name in names or list(CHECKS):
        chapter, _, section = name.partition(".")
        if chapter not in CHECKS:
            raise ValueError(f"unknown chapter {chapter!r}; choose from {sorted(CHECKS)}")
        if section and section not in CHECKS[chapter]:
            raise ValueError(f"unknown section {name!r}; {chapter} has {list(CHECKS[chapter])}")
        out += [(chapter, s) for s in ([section] if section else CHECKS[chapter])]
    return out


def run(names=None, *, device="cuda", fla: str = "auto", smoke: bool = False, log=None):
    """Run the named checks; returns ``(records, seconds)`` (``seconds``: per ``chapter.section``)."""
    records, seconds = [], {}
    for chapter, section in targets(names):
        rec = Recorder(chapter, section, log)
        params = SMOKE[chapter] if smoke else {}
        t0 = time.time()
        try:
            CHECKS[chapter][section](rec, device, fla, **params)
        except Exception as exc:  # a bug outside any compare(): still a record, never a crash
            rec.compare("(section)", lambda exc=exc: _raise(exc), reference="-", limit=None)
        _sync(device)
        seconds[f"{chapter}.{section}"] = round(time.time() - t0, 1)
        records += rec.records
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return records, seconds


def write(path, meta: dict, records: list) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(dict(meta=meta, records=records), indent=1, default=str) + "\n")


def merge(paths, command: str) -> dict:
    """One file from several runs' files (e.g. one per section run in parallel): records concatenated in
    :data:`CHECKS`' order; meta from the first, with ``command``, the earliest date, every part's seconds
    and, per part, its command and date."""
    parts = [json.loads(Path(p).read_text()) for p in sorted(map(str, paths))]
    if not parts:
        raise ValueError("nothing to merge")
    meta = dict(parts[0]["meta"], command=command, seconds={}, parts=[])
    for part in parts:
        m = part["meta"]
        for key in ("commit", "device", "torch", "triton"):
            if m.get(key) != meta.get(key):
                raise ValueError(f"cannot merge runs with different {key}: {m.get(key)!r} vs {meta.get(key)!r}")
        meta["seconds"].update(m.get("seconds", {}))
        meta["parts"].append(dict(command=m["command"], date=m["date"]))
    meta["date"] = min(part["date"] for part in meta["parts"])  # when the run started
    order = {key: i for i, key in enumerate(targets())}  # chapters and sections in CHECKS' order
    records = sorted((r for part in parts for r in part["records"]),
                     key=lambda r: order.get((r["chapter"], r["check"]), len(order)))
    return dict(meta=meta, records=records)


def main(argv=None) -> int:
    from . import DATA_DIR

    p = argparse.ArgumentParser(prog="python -m pathedu.bench.checks", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help=f"CHAPTER or CHAPTER.SECTION (default: all of {list(CHECKS)})")
    p.add_argument("--out", help=f"JSON file to write (default with no targets: {DATA_DIR / 'gpu_checks.json'})")
    p.add_argument("--fla", choices=["auto", "yes", "no"], default="auto",
                   help="compare with flash-linear-attention: yes (a missing fla fails), no, auto (if installed)")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu with --smoke (Triton's interpreter)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (SMOKE): a smoke test of this module")
    p.add_argument("--merge", nargs="+", metavar="PART", help="merge these files into --out instead of running")
    p.add_argument("--list", action="store_true", help="list CHAPTER.SECTION names and exit")
    p.add_argument("--command", help="with --merge: the command to record in meta (default: this one)")
    a = p.parse_args(argv)
    command = "python -m pathedu.bench.checks " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.list:
        print("\n".join(f"{c}.{s}" for c, s in targets()))
        return 0
    if a.merge:
        if not a.out:
            p.error("--merge needs --out")
        data = merge(a.merge, a.command or command)
        write(a.out, data["meta"], data["records"])
        bad = [r for r in data["records"] if not r["ok"]]
        print(f"wrote {a.out}: {len(data['records'])} records, {len(bad)} not ok")
        return 1 if bad else 0
    out = a.out or (str(DATA_DIR / "gpu_checks.json") if not a.targets else None)
    if out is None:
        p.error("--out is needed when only some checks run (the default file holds every chapter's)")
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        print("python -m pathedu.bench.checks needs a CUDA GPU (or --device cpu --smoke)", file=sys.stderr)
        return 2
    try:
        names = targets(a.targets)
    except ValueError as exc:
        p.error(str(exc))
    meta = run_meta(command, a.device)
    records, seconds = run([f"{c}.{s}" for c, s in names], device=a.device, fla=a.fla, smoke=a.smoke,
                           log=lambda line: print(line, flush=True))
    meta["seconds"] = seconds
    write(out, meta, records)
    bad = [r for r in records if not r["ok"]]
    print(f"{meta['device']}, commit {meta['commit']}: {len(records)} records, {len(bad)} not ok; "
          f"{sum(seconds.values()):.0f} s; wrote {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
