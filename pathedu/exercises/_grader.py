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


def check_function(name, student_fn, reference_fn, make_inputs, *, trials: int = 3, rtol: float = 1e-6,
                   hint: str = "") -> Verdict:
    """Run ``student_fn`` and ``reference_fn`` on ``trials`` fresh inputs from
    ``make_inputs(seed) -> tuple`` and compare (max error relative to max |ref|)."""
    for seed in range(trials):
        args = make_inputs(seed)
        ref = reference_fn(*args)
        try:
            out = student_fn(*args)
        except Exception as exc:  # the student's code failed: say where, kindly
            last = traceback.extract_tb(exc.__traceback__)[-1]
            return verdict(name, False, f"your function raised {type(exc).__name__}: {exc} (line {last.lineno}). {hint}")
        if not isinstance(out, torch.Tensor):
            return verdict(name, False, f"expected a torch.Tensor, got {type(out).__name__}. {hint}")
        if out.shape != ref.shape:
            return verdict(name, False, f"expected shape {tuple(ref.shape)}, got {tuple(out.shape)}. {hint}")
        err = ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-300)).item()
        if not err <= rtol:
            return verdict(name, False, f"values differ from the reference (relative error {err:.2e} on trial {seed}). {hint}")
    return verdict(name, True, f"matches the reference on {trials} random inputs.")
