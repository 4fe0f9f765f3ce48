r"""Symbolic checks for stick-breaking attention, with sympy.

Three facts, each a function returning the sympy expressions involved and the
booleans that the book displays and the tests assert:

* :func:`sigmoid_identities`: for a real logit ``z``, ``1 - sigma(z) = sigma(-z)``,
  ``log sigma(z) - log sigma(-z) = z`` and ``log sigma(-z) = -softplus(z)``: the
  gate a key leaves to the keys before it is ``sigma(-z)``, and its log is a
  softplus, never the log of a difference.
* :func:`product_equals_log_form`: for ``T`` tokens, every weight of the product
  form ``A_ij = s_ij prod_{m=j+1..i-1} (1 - s_im)`` equals the exponential of the
  log-space form ``log s_ij + sum_{m=j+1..i-1} log(1 - s_im)`` (``s_ij = sigma(z_ij)``).
* :func:`row_sum_is_broken_stick`: each row's weights sum to the stick that was
  broken off, ``sum_{j<i} A_ij = 1 - prod_{j<i} (1 - s_ij)``; since every factor
  lies in (0, 1), the sum lies in [0, 1): no normaliser is needed.

Positions are 0-based, as in :mod:`pathedu.stickbreaking`: query ``i``, keys
``j < i``, and the product runs over ``m = j+1 .. i-1``.  Symbol ``s_i_j`` stands
for ``sigma(z_ij)``.
"""
from __future__ import annotations

import sympy as sp

__all__ = ["sigmoid", "sigmoid_identities", "stick_symbols", "product_form", "product_equals_log_form",
           "row_sum_is_broken_stick"]


def _check_T(T) -> int:
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"`T` must be a positive int, got {T!r}")
    return T


def sigmoid(z):
    """``sigma(z) = 1 / (1 + e^{-z})`` as a sympy expression."""
    return 1 / (1 + sp.exp(-z))


def sigmoid_identities() -> dict:
    """The identities behind the log-space form, for a real symbol ``z``.

    Returns ``dict(z, one_minus, log_ratio, log_gate, complement, log_difference, softplus)``:
    ``complement``: ``1 - sigma(z) = sigma(-z)``; ``log_difference``:
    ``log sigma(z) - log sigma(-z) = z`` (so ``log A_ij`` can also be written
    ``z_ij + sum_{m=j..i-1} log sigma(-z_im)``, an inclusive sum); ``softplus``:
    ``log sigma(-z) = -log(1 + e^z)``.
    """
    z = sp.symbols("z", real=True)
    one_minus = 1 - sigmoid(z)
    log_ratio = sp.log(sigmoid(z)) - sp.log(sigmoid(-z))
    log_gate = sp.log(sigmoid(-z))
    complement = sp.simplify(one_minus - sigmoid(-z)) == 0
    log_difference = sp.simplify(sp.expand_log(log_ratio, force=True) - z) == 0
    softplus = sp.simplify(sp.expand_log(log_gate + sp.log(1 + sp.exp(z)), force=True)) == 0
    return dict(z=z, one_minus=one_minus, log_ratio=log_ratio, log_gate=log_gate,
                complement=bool(complement), log_difference=bool(log_difference), softplus=bool(softplus))


def stick_symbols(T: int) -> dict:
    """``{(i, j): s_i_j}`` for ``0 <= j < i < T``: symbols for ``sigma(z_ij)``, in (0, 1)
    (declared positive; ``1 - s`` is positive too, which the log form needs)."""
    T = _check_T(T)
    return {(i, j): sp.Symbol(f"s_{i}_{j}", positive=True) for i in range(T) for j in range(i)}


def product_form(T: int, s: dict | None = None) -> sp.Matrix:
    """The ``T x T`` matrix ``A``: ``A_ij = s_ij prod_{m=j+1..i-1} (1 - s_im)`` for ``j < i``, 0 elsewhere."""
    T = _check_T(T)
    s = stick_symbols(T) if s is None else s
    return sp.Matrix(T, T, lambda i, j: s[i, j] * sp.Mul(*[1 - s[i, m] for m in range(j + 1, i)])
                     if j < i else sp.Integer(0))


def product_equals_log_form(T: int = 4) -> dict:
    """The product form and the log-space form give the same weights, for ``T`` tokens.

    ``log_form[i, j] = log s_ij + sum_{m=j+1..i-1} log(1 - s_im)`` (for ``j < i``); ``equal`` is True
    when sympy proves ``exp(log_form[i, j]) = A_ij`` for every ``j < i``.  Returns
    ``dict(s, product, log_form, equal)``.
    """
    T = _check_T(T)
    s = stick_symbols(T)
    product = product_form(T, s)
    log_form = {(i, j): sp.log(s[i, j]) + sp.Add(*[sp.log(1 - s[i, m]) for m in range(j + 1, i)])
                for i in range(T) for j in range(i)}
    equal = all(sp.simplify(sp.powsimp(sp.exp(expr), force=True) - product[i, j]) == 0
                for (i, j), expr in log_form.items())
    return dict(s=s, product=product, log_form=log_form, equal=bool(equal))


def row_sum_is_broken_stick(T: int = 4) -> dict:
    """Row sums of the product form: ``sum_{j<i} A_ij = 1 - prod_{j<i} (1 - s_ij)``, for ``T`` tokens.

    Returns ``dict(row_sums, leftover, equal)``: ``row_sums[i]`` the sum of row ``i``,
    ``leftover[i] = prod_{j<i} (1 - s_ij)`` (1 for ``i = 0``: the whole stick is left), and
    ``equal`` True when sympy proves ``row_sums[i] + leftover[i] = 1`` for every row.
    """
    T = _check_T(T)
    s = stick_symbols(T)
    A = product_form(T, s)
    row_sums = [sp.Add(*A.row(i)) for i in range(T)]
    leftover = [sp.Mul(*[1 - s[i, j] for j in range(i)]) for i in range(T)]
    equal = all(sp.expand(r + l - 1) == 0 for r, l in zip(row_sums, leftover))
    return dict(row_sums=row_sums, leftover=leftover, equal=bool(equal))
