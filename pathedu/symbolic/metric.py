r"""The distance a forget gate induces between positions (shared by chapters 2-4).

A scalar forget gate ``f_s`` in ``(0, 1]`` acting at step ``s`` has the log gate
``log f_s <= 0``.  The product of the gates between key ``j`` and query ``i`` is
``exp(G_ij) = exp(-d(j, i))``, with the log gate ``G_ij`` and the *induced distance*::

    d(j, i) = -G_ij = -sum_{s=j+1}^{i} log f_s      for j <= i
    d(j, i) = +oo                                  for j >  i

and the softmax side adds ``G_ij = -d(j, i)`` to the logit of key ``j`` for query ``i``.
The distance is always written key first, ``d(j, i)``: from key ``j`` to query ``i``.

**Why ``+oo`` above the diagonal** (rather than "undefined"): a query never
sees a later key, and ``exp(-oo) = 0`` is exactly the causal mask of the
linear side, ``-oo`` exactly the causal mask of the softmax side.  So the one
function ``d`` carries both the decay and the mask, and with the usual
conventions ``a + oo = oo``, ``a <= oo`` the triangle inequality holds for *all*
triples, not only ordered ones.  What fails is symmetry: ``d(j, i)`` is finite
for ``j < i`` while ``d(i, j) = oo``.  A function with these properties is a
(extended) *quasi-metric*: the right notion of distance for causal models,
where "how far back" is not "how far ahead".

The identity of indiscernibles (``d(j, i) > 0`` for ``j < i``) needs every gate
``< 1`` (every ``log f_s < 0``): with gates equal to 1 (NoPE, chapter 1; a pure
rotation, chapter 4) distinct positions are at distance 0, a *pseudo*-quasi-metric.

Conventions (the book's): positions are 0-based, ``0 .. n``; the *cost* of a step is
``-log f_s >= 0``, and ``costs[s-1]`` is the cost of the gate of token ``s = 1 .. n``
(token 0's gate never acts: there is nothing before it).  :func:`step_costs` writes the
costs in the book's letters, ``-log f_1 .. -log f_n`` (each log gate is a sympy symbol
named ``\log f_s``); :func:`constant_costs` puts ALiBi's slope ``lambda`` at every step.
:func:`distance_matrix` is laid out like ``d`` itself: entry ``(j, i)`` is ``d(j, i)``,
row = key ``j``, column = query ``i``; its transpose is ``-G`` in the attention layout
(row = query).  Every function returns sympy objects; :func:`properties` returns sympy
booleans (``sympy.true``/``sympy.false``, or an unevaluated condition when the answer
depends on the gates).
"""
from __future__ import annotations

import itertools
import numbers

import sympy as sp

from ..checks import check_int

f = sp.IndexedBase("f", positive=True)  # the gates f_s > 0 at symbolic positions s
i, j, m, s = sp.symbols("i j m s", integer=True)
lam = sp.Symbol("lambda", positive=True)  # ALiBi's slope: the cost of every step of a constant gate

__all__ = [
    "f", "i", "j", "m", "s", "lam",
    "log_gates", "step_costs", "costs_from_gates", "constant_costs", "distance", "distance_matrix",
    "distance_sum", "line_additivity", "properties",
]


def log_gates(n: int, *, negative: bool = False) -> tuple:
    r"""``n`` symbolic log gates ``log f_1 .. log f_n`` (sympy symbols named ``\log f_s``):
    nonpositive (gates in (0, 1]) or, with ``negative=True``, negative (gates in (0, 1))."""
    n = check_int(n, "n", minimum=0)
    kw = dict(negative=True) if negative else dict(nonpositive=True)
    return tuple(sp.Symbol(rf"\log f_{{{k}}}", **kw) for k in range(1, n + 1))


def step_costs(n: int, *, positive: bool = False) -> tuple:
    """The costs ``-log f_1 .. -log f_n`` of ``n`` symbolic gates: nonnegative (gates in (0, 1]) or,
    with ``positive=True``, positive (gates in (0, 1))."""
    return tuple(-g for g in log_gates(n, negative=positive))


def costs_from_gates(gates) -> tuple:
    """Costs ``-log f_s`` of gates given as sympy expressions (or numbers) ``f_1 .. f_n``."""
    return tuple(-sp.log(sp.sympify(g)) for g in gates)


def constant_costs(n: int, value=lam) -> tuple:
    """``n`` equal costs (default ALiBi's slope ``lambda``): a constant gate ``gamma = e^{-lambda}``,
    RetNet's decay and ALiBi's bias (chapter 2)."""
    return (sp.sympify(value),) * check_int(n, "n", minimum=0)


def distance(j: int, i: int, costs) -> sp.Expr:
    """``d(j, i)`` for concrete positions ``0 <= j, i <= len(costs)``: the sum of the costs of
    steps ``s = j+1 .. i`` when ``j <= i`` (0 for ``j = i``), ``sympy.oo`` when ``j > i``."""
    n = len(costs)
    for name, p in (("j", j), ("i", i)):
        if isinstance(p, bool) or not isinstance(p, numbers.Integral):
            raise TypeError(f"`{name}` must be an int position, got {type(p).__name__}")
        if not 0 <= p <= n:
            raise ValueError(f"`{name}` must lie in 0..{n} (positions of {n} steps), got {p}")
    if j > i:
        return sp.oo
    return sp.Add(*costs[j:i])  # costs[s-1] for s = j+1 .. i


def distance_matrix(costs) -> sp.Matrix:
    """The ``(n+1) x (n+1)`` matrix of ``d(j, i)``: entry ``(j, i)``, row = key ``j``, column =
    query ``i`` (``oo`` below the diagonal, where the key comes after the query).  Its transpose
    is ``-G``, the softmax side's additive bias in the attention layout."""
    n = len(costs)
    return sp.Matrix(n + 1, n + 1, lambda key, query: distance(key, query, costs))


def distance_sum(lower=j, upper=i, cost=None) -> sp.Expr:
    """``d(lower, upper)`` for symbolic positions ``lower <= upper``.

    Default: ``-Sum(log f_s, (s, lower+1, upper))``, arbitrary gates ``f_s``; with ``cost``
    (an expression in :data:`s`), ``Sum(cost, (s, lower+1, upper))``, e.g. ``cost=lam`` gives
    ALiBi's ``lambda (upper - lower)`` after ``.doit()``.
    """
    if cost is None:
        return -sp.Sum(sp.log(f[s]), (s, lower + 1, upper))
    return sp.Sum(sp.sympify(cost), (s, lower + 1, upper))


def line_additivity() -> tuple[sp.Eq, sp.Boolean]:
    """For ``j <= m <= i`` and arbitrary gates: ``d(j, m) + d(m, i) = d(j, i)``.

    The triangle inequality is an *equality* along the line: going from ``j`` to
    ``i`` through ``m`` costs exactly as much as going straight, since the gates
    in between are the same.  Returns ``(equation, holds)``, written with ``log f_s``;
    sympy combines the two adjacent sums into one.
    """
    lhs = distance_sum(j, m) + distance_sum(m, i)
    rhs = distance_sum(j, i)
    return sp.Eq(lhs, rhs, evaluate=False), sp.true if sp.simplify(lhs - rhs) == 0 else sp.false


def properties(costs) -> dict:
    """Check every metric axiom on all positions ``0 .. n`` for the given costs (``n = len(costs)``).

    Returns ``{name: sympy boolean}``:

    * ``"nonnegative"``: ``d(j, i) >= 0`` for all ``j, i``;
    * ``"zero on the diagonal"``: ``d(i, i) = 0``;
    * ``"positive off the diagonal"``: ``d(j, i) > 0`` for ``j != i`` (identity of
      indiscernibles; ``true`` for positive costs, ``false`` with a zero cost,
      an unevaluated condition on the log gates when the costs may be zero);
    * ``"triangle inequality"``: ``d(j, i) <= d(j, m) + d(m, i)`` for all ``j, m, i``;
    * ``"equality along the line"``: ``d(j, m) + d(m, i) = d(j, i)`` for ``j <= m <= i``;
    * ``"symmetric"``: ``d(j, i) = d(i, j)`` for all ``j, i`` (``false`` as soon as ``n >= 1``).
    """
    n = len(costs)
    pos = range(n + 1)
    d = {(a, b): distance(a, b, costs) for a in pos for b in pos}
    triples = list(itertools.product(pos, repeat=3))
    return {
        "nonnegative": sp.And(*[sp.Ge(d[a, b], 0) for a in pos for b in pos]),
        "zero on the diagonal": sp.And(*[sp.Eq(d[a, a], 0) for a in pos]),
        "positive off the diagonal": sp.And(*[sp.Gt(d[a, b], 0) for a in pos for b in pos if a != b]),
        "triangle inequality": sp.And(*[sp.Le(d[a, b], d[a, x] + d[x, b]) for a, x, b in triples]),
        "equality along the line": sp.And(*[sp.Eq(sp.expand(d[a, x] + d[x, b] - d[a, b]), 0)
                                            for a, x, b in triples if a <= x <= b]),
        "symmetric": sp.And(*[sp.Eq(d[a, b], d[b, a]) for a in pos for b in pos]),
    }
