"""Reader of the GPU-check files written before :mod:`pathedu.bench.checks` (to be deleted).

Until ``pathedu/data/gpu_checks.json`` holds a GPU run of :mod:`pathedu.bench.checks`, the book's
check results come from the old per-chapter ``gpu_checks()`` dicts: ``gpu_checks_fox_alibi.json``
(keys ``fox`` and ``alibi``) and the ``checks`` of ``bench_rope.json``.  :func:`legacy_checks`
converts them to the new record schema, so that the book reads one schema.  Once the new file
is committed: delete this module, ``gpu_checks_fox_alibi.json``, the ``checks`` key of
``bench_rope.json`` (optional), and the two lines of :func:`pathedu.bench.load_checks` that call it.
"""
from __future__ import annotations

import json

from . import DATA_DIR
from .checks import ALIBI_SLOPES, PREPASS_BF16, REL_RMS, ROPE_REL_MAX, TRIG_TOL_64, TRIG_TOL_8192


def _record(chapter, check, op, reference, dtype, T, shape, metric, value, limit, finite=True, params=None, error=None):
    ok = bool(finite) and value is not None and (limit is None or value <= limit)
    r = dict(chapter=chapter, check=check, op=op, reference=reference, dtype=dtype, T=T, shape=shape, metric=metric,
             value=value, limit=limit, finite=bool(finite), ok=ok and error is None, params=params or {})
    if error:
        r["error"] = error
    return r


def _fox(old: dict) -> list:
    T, H, D = old["T"], old["H"], old["D"]
    ops = {"fox_triton": ("fox_triton", "float64 fox_matrix"),
           "gla_scalar_triton": ("gla_triton (token gate)", "float64 gla_chunked"),
           "gla_channel_triton": ("gla_triton (channel gate)", "float64 gla_chunked")}
    out = []
    for key, c in old.items():
        if not isinstance(c, dict):
            continue
        error = c.get("error")
        if key.startswith(tuple(ops)) and "_bf16_" in key:
            name, gate = key.split("_bf16_")
            op, ref = ops[name]
            out.append(_record("fox", "robust", op, ref, "bfloat16", T, [1, H, T, D], "rel_max", c.get("rel_err"),
                               c.get("tol"), c.get("finite", False), dict(gate=gate), error))
        elif key == "gla_channel_fp32_D128_Dv32":
            Ts = min(T, 1024)
            out.append(_record("fox", "fp32", "gla_triton (channel gate)", "float64 gla_chunked", "float32", Ts,
                               [1, H, Ts, 32], "rel_max", c.get("rel_err"), c.get("tol"), c.get("finite", False),
                               dict(gate="random", D=128, Dv=32), error))
        elif key == "gla_channel_matches_scalar":
            out.append(_record("fox", "channel", "gla_triton (channel gate)", "gla_triton (token gate)", "bfloat16", T,
                               [1, H, T, D], "rel_max", c.get("rel_err"), c.get("tol"), c.get("finite", False),
                               dict(gate="random"), error))
    return out


def _alibi(old: dict) -> list:
    T, B, D = old["T"], old["B"], old["D"]
    H = len(old.get("slopes", ALIBI_SLOPES))
    lim = REL_RMS["bfloat16"]
    out = []

    def add(check, op, ref, value, limit, finite=True, dtype="bfloat16", T_=T, params=None):
        if isinstance(value, str):  # "error: ..."
            out.append(_record("alibi", check, op, ref, dtype, T_, [B, H, T_, D], "rel_rms_head", None, limit, False,
                               params, value))
        elif value is not None:
            out.append(_record("alibi", check, op, ref, dtype, T_, [B, H, T_, D], "rel_rms_head", value, limit, finite,
                               params))

    add("robust", "alibi_triton", "fp32 alibi_blockwise", old.get("alibi_triton_bf16_rel_rms"), lim,
        old.get("alibi_triton_bf16_finite", False))
    hooks = old.get("alibi_hooks_agree") or {}
    if isinstance(hooks, dict):
        add("robust", "attention(log_f=-slope)", "fp32 alibi_blockwise", hooks.get("rel_rms_vs_fp32"), lim,
            hooks.get("finite", False))
        add("robust", "attention(log_f=-slope)", "alibi_triton", hooks.get("rel_rms_vs_alibi_hook"), 5e-3,
            hooks.get("finite", False))
    add("robust", "retnet_triton", "fp32 retnet_chunked", old.get("retnet_triton_bf16_rel_rms"), lim,
        old.get("retnet_triton_bf16_finite", False))
    for key, check, op, ref in (
            ("fla_fox_const_gate", "fla_fox", "fla.parallel_forgetting_attn", "fp32 alibi_blockwise"),
            ("fla_simple_gla_g_gamma", "fla_retention", "fla.chunk_simple_gla", "fp32 retnet_chunked")):
        c = old.get(key)
        if isinstance(c, dict):
            add(check, op, ref, c.get("rel_rms_vs_fp32"), lim, c.get("finite", False))
        elif c is not None:
            add(check, op, ref, c, lim)
    fp32 = old.get("fp32_T1024")
    if isinstance(fp32, dict):
        Ts = min(T, 1024)
        add("fp32", "alibi_triton", "float64 alibi_blockwise", fp32.get("alibi_triton_fp32_rel_rms"),
            REL_RMS["float32"], dtype="float32", T_=Ts)
        add("fp32", "retnet_triton", "float64 retnet_chunked", fp32.get("retnet_triton_fp32_rel_rms"),
            REL_RMS["float32"], dtype="float32", T_=Ts)
    return out


def _rope(old: dict) -> list:
    out = []
    for key, value in old.items():
        if not isinstance(value, float):
            continue
        if key.startswith(("rope_triton_", "complex_triton_")) and key.endswith("_rel_err"):
            form = "rope_triton" if key.startswith("rope_") else "complex_triton"
            dtype, pairing, T = key[len(form) + 1:-len("_rel_err")].split("_")
            T = int(T[1:])
            ref = "float64 rope_matrix" if form == "rope_triton" else "float64 linear_matrix(apply_rope)"
            finite = old.get(key[:-len("_rel_err")] + "_finite", False)
            out.append(_record("rope", "robust", form, ref, dtype, T, [1, 2, T, 64], "rel_max", value,
                               ROPE_REL_MAX[dtype], finite, dict(pairing=pairing)))
        elif key.startswith("prepass_fp32_trig_max_err_T"):
            T, D = key[len("prepass_fp32_trig_max_err_T"):].split("_D")
            T, D = int(T), int(D)
            out.append(_record("rope", "trig", "rotate_qk angles (fp32)", "float64 cos/sin", "float32", T, [T],
                               "max_abs", value, TRIG_TOL_8192 if T > 64 else TRIG_TOL_64, True, dict(D=D)))
        elif key.startswith("prepass_bf16_rel_err_"):
            pairing, offset = key[len("prepass_bf16_rel_err_"):].split("_offset")
            out.append(_record("rope", "prepass", "rotate_qk", "float64 apply_rope", "bfloat16", 8192,
                               [2, 32, 8192, 64], "rel_max", value, PREPASS_BF16, True,
                               dict(pairing=pairing, offset=int(offset))))
    return out


def legacy_checks(chapter: str) -> dict:
    """``{"meta", "records"}`` for ``fox``, ``alibi`` (``gpu_checks_fox_alibi.json``) or ``rope``
    (``bench_rope.json``'s ``checks``); ``FileNotFoundError`` for any other chapter."""
    if chapter in ("fox", "alibi"):
        path = DATA_DIR / "gpu_checks_fox_alibi.json"
        if path.exists():
            data = json.loads(path.read_text())
            if chapter in data:
                records = _fox(data["fox"]) if chapter == "fox" else _alibi(data["alibi"])
                return dict(meta=dict(data["meta"], source=path.name), records=records)
    if chapter == "rope":
        path = DATA_DIR / "bench_rope.json"
        if path.exists():
            data = json.loads(path.read_text())
            if data.get("checks"):
                return dict(meta=dict(data["meta"], source=path.name), records=_rope(data["checks"]))
    raise FileNotFoundError(f"no GPU check results for chapter {chapter!r} in {DATA_DIR}; "
                            f"run `python -m pathedu.bench.checks {chapter} --out FILE` on a GPU")
