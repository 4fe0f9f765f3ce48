r"""Symbolic checks for CoPE (contextual position encoding), with sympy.

Three facts, each a function returning the sympy expressions involved and the booleans that
the book displays and the tests assert:

* :func:`interpolation`: the embedding at a fractional position,
  ``e(p) = (1 - w) E[floor p] + w E[ceil p]`` with ``w = p - floor p`` and ``p`` clamped to
  ``[0, P - 1]``, is the piecewise-linear function of ``p`` through the table's rows: it equals
  ``E[n]`` at every integer ``n``, is continuous there (the pieces meet), is linear between
  integers (slope ``E[n+1] - E[n]`` on ``[n, n+1]``), constant outside ``[0, P - 1]``, and has
  kinks at the integers (the slope jumps from ``E[n] - E[n-1]`` to ``E[n+1] - E[n]``).
* :func:`scalar_interpolation`: because ``q . e`` is linear in ``e``, interpolating the
  scalars ``qe_n = q . E[n]`` gives ``q . e(p)``: the optimisation that computes ``Q E^T`` once
  (``T x P`` numbers) instead of a ``D``-vector per query-key pair.
* :func:`open_gates_count`: with every gate open (``g = 1``), the position
  ``sum_{m=j..i} 1 = i - j + 1``: CoPE then reads relative positions (shifted by one, since
  the count includes the key itself).

Positions are 0-based (rows ``E[0] .. E[P-1]``), as in :mod:`pathedu.cope`.
"""
from __future__ import annotations

import sympy as sp

__all__ = ["interpolation", "scalar_interpolation", "open_gates_count"]


def _check_int(x, name: str, low: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
        raise ValueError(f"`{name}` must be an int >= {low}, got {x!r}")
    return x


def _piecewise(p, rows):
    """The clamped piecewise-linear interpolation of ``rows`` (a list of P expressions) at ``p``."""
    P = len(rows)
    pieces = [(rows[0], p < 0)]
    pieces += [((n + 1 - p) * rows[n] + (p - n) * rows[n + 1], p < n + 1) for n in range(P - 1)]
    pieces.append((rows[P - 1], True))
    return sp.Piecewise(*pieces)


def _floor_ceil(p, rows):
    """The forms' recipe at a number ``p``: clamp, then ``(1 - w) E[floor p] + w E[ceil p]``."""
    pc = sp.Min(sp.Max(p, 0), len(rows) - 1)
    lo, hi = sp.floor(pc), sp.ceiling(pc)
    w = pc - lo
    return (1 - w) * rows[int(lo)] + w * rows[int(hi)]


def interpolation(P: int = 4, samples_per_unit: int = 4) -> dict:
    """The interpolation of a table of ``P`` scalars ``e_0 .. e_{P-1}`` (one channel of ``E``).

    Returns ``dict(p, rows, e, at_integers, continuous, linear, slopes, kinks, clamped,
    floor_ceil_agrees)``:

    * ``e``: the ``Piecewise`` in ``p`` (``e_0`` below 0, ``e_{P-1}`` above ``P - 1``);
    * ``at_integers``: ``e(n) = e_n`` for ``n = 0 .. P-1``;
    * ``continuous``: at every integer the left and right limits agree (and equal ``e_n``);
    * ``linear``: every piece has zero second derivative; ``slopes``: the piece derivatives
      ``e_{n+1} - e_n``; ``kinks``: at an interior integer the slope jumps (the one-sided
      derivatives differ for a generic table), so ``e`` is continuous but not smooth;
    * ``clamped``: ``e(p) = e_0`` for ``p < 0`` and ``e_{P-1}`` for ``p > P - 1``;
    * ``floor_ceil_agrees``: the forms' recipe (clamp, ``floor``, ``ceil``, ``w = p - floor p``)
      equals ``e`` exactly at rational points ``k / samples_per_unit`` from ``-1`` to ``P``.
    """
    P = _check_int(P, "P", 2)
    samples_per_unit = _check_int(samples_per_unit, "samples_per_unit", 1)
    p = sp.Symbol("p", real=True)
    rows = list(sp.symbols(f"e_0:{P}", real=True))
    e = _piecewise(p, rows)
    at_integers = all(sp.simplify(e.subs(p, n) - rows[n]) == 0 for n in range(P))
    continuous = all(sp.simplify(sp.limit(e, p, n, "-") - rows[n]) == 0
                     and sp.simplify(sp.limit(e, p, n, "+") - rows[n]) == 0 for n in range(P))
    piece_exprs = [expr for expr, _ in e.args[1:-1]]
    linear = all(sp.diff(expr, p, 2) == 0 for expr in piece_exprs)
    slopes = [sp.expand(sp.diff(expr, p)) for expr in piece_exprs]
    kinks = all(sp.simplify(slopes[n] - slopes[n - 1]) != 0 for n in range(1, P - 1))
    clamped = (sp.simplify(e.subs(p, sp.Rational(-1, 2)) - rows[0]) == 0
               and sp.simplify(e.subs(p, P - 1 + sp.Rational(1, 3)) - rows[P - 1]) == 0)
    grid = [sp.Rational(k, samples_per_unit) for k in range(-samples_per_unit, P * samples_per_unit + 1)]
    floor_ceil_agrees = all(sp.expand(_floor_ceil(x, rows) - e.subs(p, x)) == 0 for x in grid)
    return dict(p=p, rows=rows, e=e, at_integers=bool(at_integers), continuous=bool(continuous), linear=bool(linear),
                slopes=slopes, kinks=bool(kinks), clamped=bool(clamped), floor_ceil_agrees=bool(floor_ceil_agrees))


def scalar_interpolation(D: int = 3, P: int = 3) -> dict:
    """``q . e(p)`` with ``e`` interpolated as a ``D``-vector equals the interpolation of the scalars
    ``qe_n = q . E[n]``, for symbolic ``q`` (``D`` entries), table ``E`` (``P x D``) and ``p``.

    Returns ``dict(q, E, qe, vector_first, scalars_first, equal_on_pieces, equal_with_weight)``:

    * ``vector_first``: the ``Piecewise`` ``q . e(p)`` (interpolate the vector, then the dot);
    * ``scalars_first``: the ``Piecewise`` interpolation of ``qe_0 .. qe_{P-1}``;
    * ``equal_on_pieces``: the two agree on every piece (below 0, each ``[n, n+1)``, above);
    * ``equal_with_weight``: with a free weight ``w``,
      ``q . ((1 - w) a + w b) = (1 - w) q . a + w q . b`` for the vectors ``a = E[n]``, ``b = E[n+1]``.
    """
    D = _check_int(D, "D", 1)
    P = _check_int(P, "P", 2)
    p, w = sp.symbols("p w", real=True)
    q = sp.Matrix(sp.symbols(f"q_1:{D + 1}", real=True))
    E = sp.Matrix(P, D, lambda n, d: sp.Symbol(f"E_{n}{d + 1}", real=True))
    qe = [(E.row(n) * q)[0, 0] for n in range(P)]
    channels = [_piecewise(p, [E[n, d] for n in range(P)]) for d in range(D)]
    vector_first = sp.Add(*[q[d] * channels[d] for d in range(D)])
    scalars_first = _piecewise(p, qe)
    # Piece by piece: the same conditions in the same order in every channel and in the scalars.
    vec_pieces = [sp.Add(*[q[d] * channels[d].args[i][0] for d in range(D)]) for i in range(len(scalars_first.args))]
    equal_on_pieces = all(sp.expand(a - b[0]) == 0 for a, b in zip(vec_pieces, scalars_first.args))
    equal_with_weight = all(
        sp.expand((((1 - w) * E.row(n) + w * E.row(n + 1)) * q)[0, 0] - ((1 - w) * qe[n] + w * qe[n + 1])) == 0
        for n in range(P - 1))
    return dict(q=q, E=E, qe=qe, vector_first=vector_first, scalars_first=scalars_first,
                equal_on_pieces=bool(equal_on_pieces), equal_with_weight=bool(equal_with_weight))


def open_gates_count() -> dict:
    """With every gate equal to 1, ``p_ij = sum_{m=j..i} 1 = i - j + 1`` (symbolic ``j <= i``).

    Returns ``dict(count, relative, equal)``."""
    i, j, m = sp.symbols("i j m", integer=True)
    count = sp.summation(sp.Integer(1), (m, j, i))
    relative = i - j + 1
    return dict(count=count, relative=relative, equal=bool(sp.simplify(count - relative) == 0))
