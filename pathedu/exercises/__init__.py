"""Check functions for the exercises at the end of each lab notebook.

Each chapter has a module ``chNN`` whose ``check_*`` functions take a
student's answer (usually a function), test it on fresh random inputs against
the library's reference forms, print a verdict with a hint, and return
``True``/``False``.  They never raise on a wrong answer: a student should see
what is wrong, not a stack trace.  ``chNN.hint(n, level)`` prints exercise
``n``'s hint of level 1 (a nudge), 2 (the structure) or 3 (the recipe).

In grading mode (``with pathedu.exercises.grading(): ...`` or the environment
variable ``PATHEDU_GRADING=1``) a check also rejects an answer that uses
pathedu's own implementation; see :mod:`pathedu.exercises._grader`.

A check runs in the process of the code it checks and trusts it: it gives
feedback.  Grades come from ``python -m pathedu.course grade``, which runs the
same checks in its own process on what the answers return (:mod:`pathedu.course`).
"""
from ._grader import (REGISTRY, Exercises, Verdict, call_student, check_function, diagnose, grading, grading_mode,
                      rel_error, verdict)

__all__ = ["REGISTRY", "Exercises", "Verdict", "call_student", "check_function", "diagnose", "grading",
           "grading_mode", "rel_error", "verdict"]
