"""Shared grading helpers for the exercises (one home for every chapter's checks)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch


@dataclass
class Verdict:
    """What a check found; prints as one line and is truthy when the answer is right."""

    name: str
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"{'Correct' if self.ok else 'Not yet'} [{self.name}]: {self.message}"


def verdict(name: str, ok: bool, message: str) -> Verdict:
    v = Verdict(name, bool(ok), message)
    print(repr(v))
    return v


def call_student(fn, *args):
    """Run the student's function: ``(result, None)``, or ``(None, message)`` naming the
    exception and the line it came from (the student's code failed: say where, kindly)."""
    try:
        return fn(*args), None
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return None, f"your function raised {type(exc).__name__}: {exc} (line {last.lineno})"


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error relative to max |ref|, in float64; inf when ``out`` is not finite."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def diagnose(student_fn, args, wrong_variants, rtol: float = 1e-6) -> str:
    """The message of the first known wrong variant ``(fn, message)`` whose output the
    student's matches on ``args``, else ``''``: a specific hint instead of "wrong"."""
    out, err = call_student(student_fn, *args)
    if err is not None or not isinstance(out, torch.Tensor):
        return ""
    for fn, message in wrong_variants:
        ref = fn(*args)
        if out.shape == ref.shape and rel_error(out, ref) <= rtol:
            return message
    return ""


def check_function(name, student_fn, reference_fn, make_inputs, *, trials: int = 3, rtol: float = 1e-6,
                   hint: str = "") -> Verdict:
    """Run ``student_fn`` and ``reference_fn`` on ``trials`` fresh inputs from
    ``make_inputs(seed) -> tuple`` and compare (max error relative to max |ref|)."""
    for seed in range(trials):
        args = make_inputs(seed)
        ref = reference_fn(*args)
        out, err = call_student(student_fn, *args)
        if err is not None:
            return verdict(name, False, f"{err}. {hint}")
        if not isinstance(out, torch.Tensor):
            return verdict(name, False, f"expected a torch.Tensor, got {type(out).__name__}. {hint}")
        if out.shape != ref.shape:
            return verdict(name, False, f"expected shape {tuple(ref.shape)}, got {tuple(out.shape)}. {hint}")
        err = rel_error(out, ref)
        if not err <= rtol:
            return verdict(name, False, f"values differ from the reference (relative error {err:.2e} on trial {seed}). {hint}")
    return verdict(name, True, f"matches the reference on {trials} random inputs.")


def _diagnose_parts(student_fn, args, wrong_variants, rtol) -> str:
    """:func:`diagnose` for functions that return a tuple of tensors."""
    out, err = call_student(student_fn, *args)
    if err is not None:
        return ""
    for fn, message in wrong_variants:
        ref = fn(*args)
        if (isinstance(out, (tuple, list)) and len(out) == len(ref)
                and all(isinstance(o, torch.Tensor) and o.shape == r.shape and rel_error(o, r) <= rtol
                        for o, r in zip(out, ref))):
            return message
    return ""


def check_parts(name, student_fn, reference_fn, make_inputs, part_names, *, trials: int = 3, rtol: float = 1e-8,
                hint: str = "", wrong_variants=()) -> Verdict:
    """Like :func:`check_function`, for functions that return a tuple of tensors:
    each part is compared on its own, so the verdict can say which one is wrong."""
    hint = _diagnose_parts(student_fn, make_inputs(0), wrong_variants, rtol) or hint
    want = "(" + ", ".join(part_names) + ")"
    for seed in range(trials):
        args = make_inputs(seed)
        ref = reference_fn(*args)
        out, err = call_student(student_fn, *args)
        if err is not None:
            return verdict(name, False, f"{err}. {hint}")
        if not isinstance(out, (tuple, list)) or len(out) != len(part_names):
            got = (f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list))
                   else type(out).__name__)
            return verdict(name, False, f"expected a tuple {want}, got {got}. {hint}")
        for part, o, r in zip(part_names, out, ref):
            if not isinstance(o, torch.Tensor):
                return verdict(name, False, f"`{part}` should be a torch.Tensor, got {type(o).__name__}. {hint}")
            if o.shape != r.shape:
                return verdict(name, False,
                               f"`{part}` should have shape {tuple(r.shape)}, got {tuple(o.shape)}. {hint}")
            err = rel_error(o, r)
            if not err <= rtol:
                return verdict(name, False, f"`{part}` differs from the reference "
                                            f"(relative error {err:.2e} on trial {seed}). {hint}")
    return verdict(name, True, f"{want} match the reference on {trials} random inputs.")
