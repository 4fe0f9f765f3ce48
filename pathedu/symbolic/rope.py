r"""Chapter 4 in sympy: the cosine expansion of the complex logit and the algebra of 2x2 rotations.

Each function returns a dict of sympy objects: the two sides of an identity
(``lhs``, ``rhs``) and ``diff``, their difference after simplification, which
is ``0`` (or the zero matrix) exactly when the identity holds.  The lab
notebook displays them; :func:`verify_all` checks every identity at once.

Notation: a query channel pair is the complex number ``q~ = r_q e^{i phi_q}``,
a key pair ``k~ = r_k e^{i phi_k}``; positions ``t`` (query) and ``j`` (key);
frequency ``Omega``; ``R(a)`` the counter-clockwise rotation by angle ``a``.
"""
from __future__ import annotations

import sympy as sp

__all__ = ["rotation", "cosine_expansion", "rotation_composition", "complex_multiply_is_rotation",
           "logit_as_rotated_dot", "verify_all"]

# Real symbols shared by the identities below.
r_q, r_k = sp.symbols("r_q r_k", positive=True)
phi_q, phi_k, Omega, t, j, a, b = sp.symbols("phi_q phi_k Omega t j a b", real=True)
x1, x2, y1, y2 = sp.symbols("x_1 x_2 y_1 y_2", real=True)


def rotation(angle) -> sp.Matrix:
    """``R(angle) = [[cos, -sin], [sin, cos]]``: turns a 2-vector counter-clockwise by ``angle``."""
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def _zero(expr):
    """Simplify a scalar or a matrix difference (trig identities expanded first)."""
    if isinstance(expr, sp.MatrixBase):
        return expr.applyfunc(lambda e: sp.simplify(sp.expand_trig(sp.expand(e))))
    return sp.simplify(sp.expand_trig(sp.expand(expr)))


def cosine_expansion() -> dict:
    r"""``Re{(q~ e^{i Omega t}) conj(k~ e^{i Omega j})} = r_q r_k cos(Omega (t - j) + phi_q - phi_k)``.

    The left side is one channel pair's contribution to the logit of the complex
    recurrence; the right side shows it depends on the positions only through
    ``t - j``, and on the contents through the lengths and the phase difference.
    """
    q_c = r_q * sp.exp(sp.I * phi_q)
    k_c = r_k * sp.exp(sp.I * phi_k)
    lhs = sp.re(sp.expand_complex((q_c * sp.exp(sp.I * Omega * t)) * sp.conjugate(k_c * sp.exp(sp.I * Omega * j))))
    rhs = r_q * r_k * sp.cos(Omega * (t - j) + phi_q - phi_k)
    return {"lhs": sp.simplify(lhs), "rhs": rhs, "diff": _zero(lhs - rhs)}


def rotation_composition() -> dict:
    """``R(a) R(b) = R(a + b)``, ``R(a)^T = R(-a)`` and ``R(a)^T R(a) = I``.

    Hence ``R^t`` (``t`` steps of angle ``Omega``) is ``R(t Omega)``, and
    ``(R^j)^T R^t = R^{t - j}``: rotating the query by ``t`` and the key by ``j``
    leaves exactly the relative rotation between them.
    """
    Ra, Rb = rotation(a), rotation(b)
    return {
        "product": {"lhs": Ra * Rb, "rhs": rotation(a + b), "diff": _zero(Ra * Rb - rotation(a + b))},
        "transpose": {"lhs": Ra.T, "rhs": rotation(-a), "diff": _zero(Ra.T - rotation(-a))},
        "orthogonal": {"lhs": Ra.T * Ra, "rhs": sp.eye(2), "diff": _zero(Ra.T * Ra - sp.eye(2))},
        "relative": {"lhs": rotation(j * Omega).T * rotation(t * Omega), "rhs": rotation((t - j) * Omega),
                     "diff": _zero(rotation(j * Omega).T * rotation(t * Omega) - rotation((t - j) * Omega))},
    }


def complex_multiply_is_rotation() -> dict:
    """``(x1 + i x2) e^{i a}`` has real and imaginary parts ``R(a) [x1, x2]``."""
    z = sp.expand_complex((x1 + sp.I * x2) * sp.exp(sp.I * a))
    lhs = sp.Matrix([sp.re(z), sp.im(z)])
    rhs = rotation(a) * sp.Matrix([x1, x2])
    return {"lhs": lhs, "rhs": rhs, "diff": _zero(lhs - rhs)}


def logit_as_rotated_dot() -> dict:
    """``Re{conj(y~) e^{i a} x~} = [y1, y2] . R(a) [x1, x2]``: the complex logit is a real bilinear form.

    With ``x~ = q~_t``, ``y~ = k~_j`` and ``a = Omega (t - j)`` this is the
    logit ``k_j^T R^{t-j} q_t`` of one channel pair.
    """
    lhs = sp.re(sp.expand_complex(sp.conjugate(y1 + sp.I * y2) * sp.exp(sp.I * a) * (x1 + sp.I * x2)))
    rhs = (sp.Matrix([[y1, y2]]) * rotation(a) * sp.Matrix([x1, x2]))[0, 0]
    return {"lhs": sp.simplify(lhs), "rhs": rhs, "diff": _zero(lhs - rhs)}


def verify_all() -> dict:
    """Every identity of this module: name -> True when its difference simplifies to zero."""
    def is_zero(d):
        return all(e == 0 for e in d) if isinstance(d, sp.MatrixBase) else d == 0

    out = {"cosine_expansion": is_zero(cosine_expansion()["diff"])}
    for name, ident in rotation_composition().items():
        out[f"rotation_{name}"] = is_zero(ident["diff"])
    out["complex_multiply_is_rotation"] = is_zero(complex_multiply_is_rotation()["diff"])
    out["logit_as_rotated_dot"] = is_zero(logit_as_rotated_dot()["diff"])
    return out
