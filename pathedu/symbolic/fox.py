r"""Symbolic checks for chapter 3 (FoX, GLA, Mamba2), with sympy, in the book's letters.

Four facts, each a function returning the sympy expressions involved and the
booleans that the book displays and the tests assert:

* :func:`gate_product_log_sum`: the product of gates ``prod_{s=j+1..i} f_s``
  equals ``exp(sum_{s=j+1..i} log f_s)``, so the cumulative gate can live in
  log space as a sum.
* :func:`gated_softmax_is_biased_softmax`: a softmax whose weights
  ``e^{tau Z_ij}`` are multiplied by the gate products ``e^{G_ij}`` equals a
  softmax whose logits get the additive bias ``G_ij``: FoX's bias form.
* :func:`per_channel_gate_reading`: with a per-channel (GLA) gate the linear
  attention weight ``sum_m q_{i,m} k_{j,m} exp(c_{i,m} - c_{j,m})`` equals
  ``(q_i * e^{c_i}) . (k_j * e^{-c_j})``: a data-dependent per-channel rescaling
  of q and k, which reduces to a scalar factor (a bias, in log space) only
  when every channel carries the same gate.
* :func:`rescaling_overflow`: why the rescaled form is unstable: ``e^{-c_j}``
  grows without bound (it overflows float32 after a few tokens of strong
  decay), while every exponent of the bias form, ``c_i - c_j``, is <= 0.

The letters are the book's (its notation page): ``f_s`` the gates, ``log f_s <= 0``
their logarithms (sympy symbols named ``\log f_s``), ``c_t = sum_{s<=t} log f_s`` the
cumulative log gate, ``G_ij = c_i - c_j`` the log-gate matrix, ``Z_ij`` the score
and ``tau`` the logit scale; a per-channel quantity carries its channel ``m`` after a
comma (``c_{i,m}``).  Positions and channels are 0-based, as everywhere in the book.
"""
from __future__ import annotations

import math

import sympy as sp

__all__ = ["gate_product_log_sum", "gated_softmax_is_biased_softmax", "per_channel_gate_reading",
           "rescaling_overflow"]

tau = sp.Symbol("tau", positive=True)


def _check_positive_int(value, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"`{name}` must be an int >= {least}, got {value!r}")
    return value


def gate_product_log_sum(n: int = 4) -> dict:
    """``f_1 f_2 ... f_n`` and ``exp(log f_1 + ... + log f_n)`` for gates ``0 < f_s``.

    These are the gates between a key at position 0 and a query at position ``n``
    (``s = 1 .. n``; token 0's own gate never acts on it).  Returns
    ``dict(gates, product, log_sum, exp_log_sum, equal)``; ``log_sum`` is ``G_{n,0}``,
    and ``equal`` is True when sympy proves the two forms identical.
    """
    n = _check_positive_int(n, "n")
    f = sp.symbols(f"f_1:{n + 1}", positive=True)
    product = sp.Mul(*f)
    log_sum = sp.Add(*[sp.log(x) for x in f])
    exp_log_sum = sp.exp(log_sum, evaluate=False)
    equal = sp.simplify(exp_log_sum.doit() - product) == 0 and sp.expand_log(sp.log(product)) == log_sum
    return dict(gates=f, product=product, log_sum=log_sum, exp_log_sum=exp_log_sum, equal=bool(equal))


def gated_softmax_is_biased_softmax(n: int = 3) -> dict:
    """FoX's two readings for the query ``i = n - 1`` and its ``n`` keys ``j = 0 .. n-1``.

    Symbols: the scores ``Z_{i,j}`` (real), the scale ``tau`` and the log gates
    ``G_{i,j}`` (real) for ``j < i``, with ``G_{i,i} = 0`` (a token's own gate never acts).
    The weight of key ``j`` is, multiplicatively and additively::

        e^{G_ij} e^{tau Z_ij} / sum_m e^{G_im} e^{tau Z_im}
        e^{tau Z_ij + G_ij}   / sum_m e^{tau Z_im + G_im}

    Returns ``dict(query, scores, log_gates, multiplicative, additive, equal)``: the
    query's position, the symbols, the two weight vectors (lists of expressions, kept
    as written) and whether they agree entry by entry.
    """
    n = _check_positive_int(n, "n")
    i = n - 1
    Z = [sp.Symbol(f"Z_{{{i},{j}}}", real=True) for j in range(n)]
    G = [sp.Symbol(f"G_{{{i},{j}}}", real=True) for j in range(i)] + [sp.Integer(0)]
    num_mult = [Gj if Gj == 0 else sp.exp(Gj) for Gj in G]
    num_mult = [sp.exp(tau * Zj) if g == 0 else sp.Mul(g, sp.exp(tau * Zj), evaluate=False)
                for g, Zj in zip(num_mult, Z)]
    num_bias = [sp.exp(tau * Zj + Gj, evaluate=False) for Zj, Gj in zip(Z, G)]
    multiplicative = [sp.Mul(x, sp.Pow(sp.Add(*num_mult), -1), evaluate=False) for x in num_mult]
    additive = [sp.Mul(x, sp.Pow(sp.Add(*num_bias), -1), evaluate=False) for x in num_bias]
    equal = all(sp.simplify(a.doit() - b.doit()) == 0 for a, b in zip(additive, multiplicative))
    return dict(query=i, scores=Z, log_gates=G, multiplicative=multiplicative, additive=additive,
                equal=bool(equal))


def per_channel_gate_reading(D: int = 2) -> dict:
    """The linear-attention weight of a per-channel gate, for head dim ``D``.

    Symbols, channels ``m = 0 .. D-1``: the query ``q_{i,m}`` (at position i), the key
    ``k_{j,m}`` (at j), and the per-channel cumulative log gates ``c_{i,m}``, ``c_{j,m}``
    (``c_{t,m} = sum_{s<=t} log f_{s,m}``), so ``c_{i,m} - c_{j,m} = sum_{s=j+1..i} log f_{s,m}``.

    Returns a dict with

    * ``weight``: ``sum_m q_{i,m} k_{j,m} exp(c_{i,m} - c_{j,m})`` (what GLA computes),
    * ``rescaled``: ``(q_i * e^{c_i}) . (k_j * e^{-c_j})`` and ``rescaled_equal``;
    * ``shared``: ``weight`` with one gate for all channels (``c_{t,m} = c_t``),
      ``shared_factor``: it divided by ``q_i . k_j`` and ``shared_is_scalar``
      (the factor ``exp(c_i - c_j)`` depends on neither q nor k: in softmax's
      log space it is the additive bias ``G_ij = c_i - c_j`` of FoX);
    * ``per_channel_is_scalar``: False: with distinct channel gates,
      ``weight / (q_i . k_j)`` depends on q and k, so no additive bias reproduces it.
    """
    D = _check_positive_int(D, "D", least=2)
    q = [sp.Symbol(f"q_{{i,{m}}}", real=True) for m in range(D)]
    k = [sp.Symbol(f"k_{{j,{m}}}", real=True) for m in range(D)]
    ci = [sp.Symbol(f"c_{{i,{m}}}", real=True) for m in range(D)]
    cj = [sp.Symbol(f"c_{{j,{m}}}", real=True) for m in range(D)]
    weight = sp.Add(*[q[m] * k[m] * sp.exp(ci[m] - cj[m]) for m in range(D)])
    q_res = [q[m] * sp.exp(ci[m]) for m in range(D)]
    k_res = [k[m] * sp.exp(-cj[m]) for m in range(D)]
    rescaled = sp.Add(*[a * b for a, b in zip(q_res, k_res)])
    c_i, c_j = sp.symbols("c_i c_j", real=True)
    shared = weight.subs({**{ci[m]: c_i for m in range(D)}, **{cj[m]: c_j for m in range(D)}})
    qk = sp.Add(*[q[m] * k[m] for m in range(D)])
    shared_factor = sp.simplify(shared / qk)
    shared_is_scalar = not (shared_factor.free_symbols & (set(q) | set(k)))
    factor = sp.simplify(weight / qk)
    per_channel_is_scalar = not (factor.free_symbols & (set(q) | set(k)))
    return dict(weight=weight, q_rescaled=q_res, k_rescaled=k_res, rescaled=rescaled,
                rescaled_equal=bool(sp.simplify(weight - rescaled) == 0),
                shared=shared, shared_factor=shared_factor, shared_is_scalar=bool(shared_is_scalar),
                per_channel_factor=factor, per_channel_is_scalar=bool(per_channel_is_scalar))


def rescaling_overflow(n: int = 6, log_f: float = -20.0, max_exponent: float | None = None) -> dict:
    r"""Why ``k_j e^{-c_j}`` is unstable and the bias ``c_i - c_j`` is not.

    Symbolically, for positions ``t = 0 .. n-1`` with log gates ``log f_t <= 0`` (symbols
    named ``\log f_t``) and ``c_t = log f_0 + ... + log f_t``:

    * ``bias_exponents``: ``{(i, j): c_i - c_j}`` for all ``0 <= j <= i < n``: sums of
      nonpositive symbols, so sympy proves each ``<= 0`` (``bias_nonpositive``);
      ``e^{c_i - c_j} <= 1`` can underflow to 0 but never overflow.
    * ``key_exponents``: ``-c_j``: sympy proves each ``>= 0`` (``key_nonnegative``):
      ``e^{-c_j}`` only grows.

    Numerically, with every ``log f_t = log_f``: ``-c_t = -(t + 1) log_f``, and
    ``overflow_position`` is the first position ``t`` whose ``e^{-c_t}`` overflows float32
    (``e^x`` overflows for ``x > max_exponent = ln(float32 max) = 88.72...``);
    ``gates_at_overflow = overflow_position + 1`` is the number of gates ``c_t`` has summed
    by then.
    """
    n = _check_positive_int(n, "n")
    if not log_f < 0:
        raise ValueError(f"`log_f` must be < 0 for the overflow position to exist, got {log_f}")
    if max_exponent is None:
        max_exponent = math.log(3.4028234663852886e38)  # float32's largest finite value
    g = tuple(sp.Symbol(rf"\log f_{{{t}}}", nonpositive=True) for t in range(n))
    c = [sp.Add(*g[: t + 1]) for t in range(n)]
    bias = {(i, j): c[i] - c[j] for i in range(n) for j in range(i + 1)}
    key = [-ct for ct in c]
    position = math.floor(max_exponent / -log_f)  # smallest t with -(t + 1) log_f > max_exponent
    return dict(log_gates=g, cumulative=c, bias_exponents=bias, key_exponents=key,
                bias_nonpositive=all(bool(x.is_nonpositive) for x in bias.values()),
                key_nonnegative=all(bool(x.is_nonnegative) for x in key),
                max_exponent=max_exponent, overflow_position=position,
                gates_at_overflow=position + 1)
