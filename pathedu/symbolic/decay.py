r"""Sympy derivations for chapter 2: a constant forget gate and ALiBi's bias are one object.

Each function returns sympy objects (expressions, equations, booleans) that the
book and the lab display and that the tests assert.  Symbols:

* ``gamma`` (:data:`gamma`): RetNet's constant gate, positive (the chapter takes ``0 < gamma <= 1``);
* ``lambda`` (:data:`lam`): ALiBi's slope, positive here (slope 0 is ``gamma = 1``);
* ``j <= t`` (:data:`j`, :data:`t`): key and query positions, 0-based integers; ``s`` runs over the
  gates between them, ``s = j+1 .. t`` (a token's own gate never acts on itself);
* ``delta``: the distance ``t - j >= 0`` of one key, ``Delta`` (:data:`Delta`) a threshold on it
  (``d`` is reserved for the distance function ``d(j, i)`` of :mod:`pathedu.symbolic.metric`; the
  attribute :data:`d` is the same symbol as :data:`Delta`, for code that uses that name);
* ``T``: the number of keys a query sees, for the last query of a sequence of ``T`` tokens.

The chain the chapter follows::

    prod_{s=j+1}^{t} gamma = gamma^(t-j) = exp(-lambda (t-j))      (gamma = e^{-lambda})
    log prod_s f_s = sum_s log f_s                                  (any positive gates)
    log gamma^(t-j) = -lambda (t-j)                                 (ALiBi's additive bias)
"""
from __future__ import annotations

import sympy as sp

gamma = sp.Symbol("gamma", positive=True)
lam = sp.Symbol("lambda", positive=True)
t, j, s, i = sp.symbols("t j s i", integer=True)
Delta, delta = sp.symbols("Delta delta", integer=True, nonnegative=True)
d = Delta  # the same symbol under a second name
T = sp.Symbol("T", integer=True, positive=True)
h = sp.Symbol("h", positive=True)
f = sp.IndexedBase("f", positive=True)  # per-step gates f_s > 0 (chapter 3 makes them data dependent)

__all__ = [
    "gamma", "lam", "t", "j", "s", "i", "Delta", "d", "delta", "T", "h", "f",
    "gate_product", "product_is_power", "power_is_exponential", "log_product_is_sum", "alibi_bias_from_gate",
    "softmax_ignores_row_constant", "half_life", "gamma_for_half_life", "mass_beyond", "mean_distance",
]


def gate_product() -> tuple[sp.Product, sp.Expr]:
    """The unrolled product of the constant gate between key ``j`` and query ``t``:
    ``(Product(gamma, (s, j+1, t)), gamma**(t - j))``, the unevaluated product and its value."""
    P = sp.Product(gamma, (s, j + 1, t))
    return P, P.doit()


def product_is_power() -> sp.Boolean:
    """``prod_{s=j+1}^{t} gamma == gamma^(t-j)``: ``t - j`` equal factors (``sympy.true``)."""
    _, value = gate_product()
    return sp.Eq(value, gamma ** (t - j))


def power_is_exponential() -> tuple[sp.Eq, sp.Boolean]:
    """With ``gamma = exp(-lambda)``: ``gamma^(t-j) = exp(-lambda (t-j))``.

    Returns ``(equation, holds)``; ``holds`` is ``sympy.true`` when the difference simplifies to 0.
    """
    lhs = sp.Pow(sp.exp(-lam), t - j, evaluate=False)  # gamma^(t-j) with gamma = e^{-lambda}, kept unevaluated
    rhs = sp.exp(-lam * (t - j))
    return sp.Eq(lhs, rhs, evaluate=False), sp.true if sp.simplify(lhs - rhs) == 0 else sp.false


def log_product_is_sum() -> tuple[sp.Eq, sp.Boolean]:
    """For positive gates ``f_s``: ``log prod_{s=j+1}^{t} f_s = sum_{s=j+1}^{t} log f_s``.

    The logarithm turns the multiplicative gate into an additive bias; for a
    constant gate every term is ``log gamma = -lambda``.  Returns ``(equation, holds)``.
    """
    lhs = sp.log(sp.Product(f[s], (s, j + 1, t)))
    rhs = sp.Sum(sp.log(f[s]), (s, j + 1, t))
    return sp.Eq(lhs, rhs, evaluate=False), sp.true if sp.expand_log(lhs) == rhs else sp.false


def alibi_bias_from_gate() -> tuple[sp.Eq, sp.Boolean]:
    """``log (e^{-lambda})^(i-j) = -lambda (i - j)``: the constant gate's log product is ALiBi's bias
    (negative for ``j < i``: distance is penalised).  Returns ``(equation, holds)``."""
    lhs = sp.log(sp.Pow(sp.exp(-lam), i - j, evaluate=False), evaluate=False)
    rhs = -lam * (i - j)
    return sp.Eq(lhs, rhs, evaluate=False), sp.true if sp.expand_log(lhs.doit()) == rhs else sp.false


def softmax_ignores_row_constant(n: int = 3) -> tuple[list, sp.Boolean]:
    """``softmax_j(x_j + c) = softmax_j(x_j)`` for ``n`` symbolic logits and any ``c``.

    So ALiBi's ``-lambda (i - j) = -lambda i + lambda j`` acts only through ``+lambda j``:
    what matters is the distance, not the absolute position.  Returns ``(differences, holds)``
    with the simplified differences (all 0).
    """
    x = sp.symbols(f"x0:{n}", real=True)
    c = sp.Symbol("c", real=True)

    def softmax(xs):
        z = sum(sp.exp(a) for a in xs)
        return [sp.exp(a) / z for a in xs]

    diffs = [sp.simplify(a - b) for a, b in zip(softmax([a + c for a in x]), softmax(x))]
    return diffs, sp.true if all(e == 0 for e in diffs) else sp.false


def half_life() -> tuple[sp.Expr, sp.Expr]:
    """The distance ``h`` at which the decay has halved, ``gamma^h = 1/2``:
    returns ``(h in terms of gamma, h in terms of lambda)`` = ``(-log 2 / log gamma, log 2 / lambda)``."""
    (in_gamma,) = sp.solve(sp.Eq(gamma ** h, sp.Rational(1, 2)), h)
    (in_lam,) = sp.solve(sp.Eq(sp.exp(-lam * h), sp.Rational(1, 2)), h)
    return in_gamma, in_lam


def gamma_for_half_life(H) -> sp.Expr:
    """The gate whose half-life is ``H`` tokens: ``gamma = 2^(-1/H)`` (``H`` a number or a positive symbol).

    Solved in the slope (``log 2 / lambda = H``, one real root), then ``gamma = e^{-lambda}``.
    """
    (slope,) = sp.solve(sp.Eq(half_life()[1], sp.sympify(H)), lam)
    return sp.simplify(sp.exp(-slope))


def mass_beyond(finite: bool = True) -> sp.Expr:
    """The attention mass a query puts on keys farther than ``Delta`` under ALiBi alone.

    With equal content scores (``q . k_j`` the same for every key), the weight of
    the key at distance ``delta`` is ``e^{-lambda delta}`` normalised over the
    ``T`` keys ``delta = 0 .. T-1`` that the last query of ``T`` tokens sees; the mass
    at distances ``> Delta`` is::

        (e^{-lambda (Delta+1)} - e^{-lambda T}) / (1 - e^{-lambda T})    (finite=True)
        e^{-lambda (Delta+1)}                                            (finite=False, T -> oo)

    Returns the expression in ``lambda``, ``Delta`` (and ``T``); valid for ``0 <= Delta < T``.
    """
    w = sp.exp(-lam * delta)
    frac = sp.Sum(w, (delta, Delta + 1, T - 1)).doit() / sp.Sum(w, (delta, 0, T - 1)).doit()
    frac = sp.piecewise_fold(sp.simplify(frac))
    if isinstance(frac, sp.Piecewise):  # sympy also covers exp(-lambda) = 1, excluded by lambda > 0
        frac = frac.args[-1][0]
    # The same fraction written with decays only (every exponent <= 0); sympy checks they agree.
    tidy = (sp.exp(-lam * (Delta + 1)) - sp.exp(-lam * T)) / (1 - sp.exp(-lam * T))
    if sp.simplify(frac - tidy) != 0:
        raise AssertionError("sympy could not confirm the closed form of the mass beyond Delta")
    if finite:
        return tidy
    return sp.limit(tidy, T, sp.oo)


def mean_distance() -> sp.Expr:
    """The mean distance ``sum_delta delta w_delta`` attended to under ALiBi alone over an
    unbounded past (weights ``w_delta`` proportional to ``e^{-lambda delta}``): ``1 / (e^lambda - 1)``,
    about ``1/lambda`` for small slopes."""
    r = sp.Symbol("r", positive=True)  # r = e^{-lambda}, 0 < r < 1

    def converged(expr):  # sympy returns Piecewise((value, r < 1), (Sum, True)): keep the r < 1 branch
        return next(e for e, cond in expr.args if cond == (r < 1)) if isinstance(expr, sp.Piecewise) else expr

    num = converged(sp.Sum(delta * r ** delta, (delta, 0, sp.oo)).doit())
    den = converged(sp.Sum(r ** delta, (delta, 0, sp.oo)).doit())
    return sp.simplify((num / den).subs(r, sp.exp(-lam)))
