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
