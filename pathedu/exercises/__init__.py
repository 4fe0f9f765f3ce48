"""Check functions for the exercises at the end of each lab notebook.

Each chapter has a module ``chNN`` whose ``check_*`` functions take a
student's answer (usually a function), test it on fresh random inputs against
the library's reference forms, print a verdict with a hint, and return
``True``/``False``.  They never raise on a wrong answer: a student should see
what is wrong, not a stack trace.
"""
from ._grader import Verdict, call_student, check_function, diagnose, rel_error, verdict

__all__ = ["Verdict", "call_student", "check_function", "diagnose", "rel_error", "verdict"]
