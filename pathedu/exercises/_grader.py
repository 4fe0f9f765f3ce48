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


def _run_trials(name, student_fn, reference_fn, make_inputs, trials, hint, compare, success) -> Verdict:
    """The trial loop shared by the checks: run ``student_fn`` and ``reference_fn`` on
    ``trials`` fresh inputs; ``compare(out, ref, seed)`` returns what is wrong (a message
    without the hint) or ``None``.  The first failure is the verdict; else ``success``."""
    for seed in range(trials):
        args = make_inputs(seed)
        ref = reference_fn(*args)
        out, err = call_student(student_fn, *args)
        problem = err if err is not None else compare(out, ref, seed)
        if problem is not None:
            return verdict(name, False, f"{problem}. {hint}")
    return verdict(name, True, success)


def _tensor_problem(out, ref, seed, rtol, says) -> str | None:
    """What is wrong with tensor ``out`` against ``ref`` (type, shape, then values), phrased
    with ``says = (not-a-tensor, wrong-shape, values-differ)`` prefixes; ``None`` when right."""
    not_tensor, bad_shape, differs = says
    if not isinstance(out, torch.Tensor):
        return f"{not_tensor}, got {type(out).__name__}"
    if out.shape != ref.shape:
        return f"{bad_shape} {tuple(ref.shape)}, got {tuple(out.shape)}"
    err = rel_error(out, ref)
    if not err <= rtol:
        return f"{differs} (relative error {err:.2e} on trial {seed})"
    return None


def check_function(name, student_fn, reference_fn, make_inputs, *, trials: int = 3, rtol: float = 1e-6,
                   hint: str = "", wrong_variants=()) -> Verdict:
    """Run ``student_fn`` and ``reference_fn`` on ``trials`` fresh inputs from
    ``make_inputs(seed) -> tuple`` and compare (max error relative to max |ref|).
    When the answer matches one of ``wrong_variants`` (``(fn, message)``, see
    :func:`diagnose`), that message replaces ``hint``."""
    if wrong_variants:
        hint = diagnose(student_fn, make_inputs(0), wrong_variants) or hint

    def compare(out, ref, seed):
        return _tensor_problem(out, ref, seed, rtol, ("expected a torch.Tensor", "expected shape",
                                                      "values differ from the reference"))

    return _run_trials(name, student_fn, reference_fn, make_inputs, trials, hint, compare,
                       f"matches the reference on {trials} random inputs.")


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

    def compare(out, ref, seed):
        if not isinstance(out, (tuple, list)) or len(out) != len(part_names):
            got = (f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list))
                   else type(out).__name__)
            return f"expected a tuple {want}, got {got}"
        problems = (_tensor_problem(o, r, seed, rtol, (f"`{part}` should be a torch.Tensor",
                                                       f"`{part}` should have shape",
                                                       f"`{part}` differs from the reference"))
                    for part, o, r in zip(part_names, out, ref))
        return next((p for p in problems if p is not None), None)

    return _run_trials(name, student_fn, reference_fn, make_inputs, trials, hint, compare,
                       f"{want} match the reference on {trials} random inputs.")
