"""Check functions for the exercises at the end of each lab notebook.

Each chapter has a module ``chNN`` whose ``check_*`` functions take a
student's answer (usually a function), test it on fresh random inputs against
the library's reference forms, print a verdict with a hint, and return
``True``/``False``.  They never raise on a wrong answer: a student should see
what is wrong, not a stack trace.  ``chNN.hint(n, level)`` prints exercise
``n``'s hint of level 1 (a nudge), 2 (the structure) or 3 (the recipe).

Beyond writing a function, an exercise can ask to *predict, then run* (commit to a number or a shape before a
cell reveals it: :func:`check_prediction`, graded with a tolerance), to *explain* (a short written answer that a
person marks against a rubric: :func:`check_explanation`, status "Needs marking"), or to *find the bug* (name the
planted bug among :data:`BUG_KINDS` and fix the function: :func:`check_bug`, partial credit).  Each exercise is
worth points (:data:`KINDS`); a verdict's ``fraction`` says how many it earned.

In grading mode (``with pathedu.exercises.grading(): ...`` or the environment
variable ``PATHEDU_GRADING=1``) a check also rejects an answer that uses
pathedu's own implementation; see :mod:`pathedu.exercises._grader`.

A check runs in the process of the code it checks and trusts it: it gives
feedback.  Grades come from ``python -m pathedu.course grade``, which runs the
same checks in its own process on what the answers return (:mod:`pathedu.course`).
"""
from ._grader import (BUG_KINDS, KINDS, REGISTRY, Exercises, Verdict, call_student, check_bug, check_explanation,
                      check_function, check_prediction, diagnose, grading, grading_mode, rel_error, verdict)

__all__ = ["BUG_KINDS", "KINDS", "REGISTRY", "Exercises", "Verdict", "call_student", "check_bug", "check_explanation",
           "check_function", "check_prediction", "diagnose", "grading", "grading_mode", "rel_error", "verdict"]
