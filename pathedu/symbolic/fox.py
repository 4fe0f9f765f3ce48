r"""Symbolic checks for chapter 3 (FoX, GLA, Mamba2), with sympy.

Four facts, each a function returning the sympy expressions involved and the
booleans that the book displays and the tests assert:

* :func:`gate_product_log_sum`: the product of gates ``prod_{s=j+1..i} f_s``
  equals ``exp(sum_{s=j+1..i} log f_s)``, so the cumulative gate can live in
  log space as a sum.
* :func:`gated_softmax_is_biased_softmax`: a softmax whose weights are
  multiplied by gates ``F_j > 0`` equals a softmax whose logits get the
  additive bias ``log F_j``: FoX's bias form.
* :func:`per_channel_gate_reading`: with a per-channel (GLA) gate the linear
  attention weight ``sum_d q_d k_d exp(b_id - b_jd)`` equals
  ``(q * e^{b_i}) . (k * e^{-b_j})``: a data-dependent per-channel rescaling
  of q and k, which reduces to a scalar factor (a bias, in log space) only
  when every channel carries the same gate.
* :func:`rescaling_overflow`: why the rescaled form is unstable: ``e^{-b_j}``
  grows without bound (it overflows float32 after a few tokens of strong
  decay), while every exponent of the bias form, ``b_i - b_j``, is <= 0.

Positions are 1-based in the symbol names (``f_1 .. f_n``) to read like the
paper; the facts do not depend on it.
"""
from __future__ import annotations

import math

import sympy as sp

__all__ = ["gate_product_log_sum", "gated_softmax_is_biased_softmax", "per_channel_gate_reading",
           "rescaling_overflow"]


def gate_product_log_sum(n: int = 4) -> dict:
    """``prod_{s=1..n} f_s`` and ``exp(sum_{s=1..n} log f_s)`` for gates ``0 < f_s``.

    Returns ``dict(gates, product, log_sum, exp_log_sum, equal)``; ``equal`` is
    True when sympy proves the two forms identical.  (Read ``s = 1..n`` as the
    ``n = i - j`` tokens ``j+1 .. i`` between a key and a query.)
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive int, got {n!r}")
    f = sp.symbols(f"f_1:{n + 1}", positive=True)
    product = sp.Mul(*f)
    log_sum = sp.Add(*[sp.log(x) for x in f])
    exp_log_sum = sp.exp(log_sum, evaluate=False)
    equal = sp.simplify(exp_log_sum.doit() - product) == 0 and sp.expand_log(sp.log(product)) == log_sum
    return dict(gates=f, product=product, log_sum=log_sum, exp_log_sum=exp_log_sum, equal=bool(equal))


def gated_softmax_is_biased_softmax(n: int = 3) -> dict:
    """Softmax over ``n`` keys with logits ``z_j`` (real) and gate products ``F_j > 0``:

    ``F_j e^{z_j} / sum_k F_k e^{z_k}``  (multiplicative gate weights) equals
    ``e^{z_j + log F_j} / sum_k e^{z_k + log F_k}``  (additive log-gate bias).

    Returns ``dict(multiplicative, additive, equal)`` with the two weight
    vectors (lists of expressions) and whether they agree entry by entry.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive int, got {n!r}")
    z = sp.symbols(f"z_1:{n + 1}", real=True)
    Fs = sp.symbols(f"F_1:{n + 1}", positive=True)
    num_mult = [Fj * sp.exp(zj) for Fj, zj in zip(Fs, z)]
    num_bias = [sp.exp(zj + sp.log(Fj), evaluate=False) for Fj, zj in zip(Fs, z)]
    multiplicative = [x / sp.Add(*num_mult) for x in num_mult]
    additive = [x / sp.Add(*num_bias) for x in num_bias]
    equal = all(sp.simplify(a.doit() - m) == 0 for a, m in zip(additive, multiplicative))
    return dict(multiplicative=multiplicative, additive=additive, equal=bool(equal))


def per_channel_gate_reading(D: int = 2) -> dict:
    """The linear-attention weight of a per-channel gate, for head dim ``D``.

    Symbols: query ``q_1..q_D`` (at position i), key ``k_1..k_D`` (at j), and the
    per-channel cumulative log gates ``b_{i,d}``, ``b_{j,d}`` (``b_t = sum_{s<=t} log f_s``),
    so ``b_{i,d} - b_{j,d} = sum_{s=j+1..i} log f_{s,d}``.

    Returns a dict with

    * ``weight``: ``sum_d q_d k_d exp(b_{i,d} - b_{j,d})`` (what GLA computes),
    * ``rescaled``: ``(q * e^{b_i}) . (k * e^{-b_j})`` and ``rescaled_equal``;
    * ``shared``: ``weight`` with one gate for all channels (``b_{t,d} = c_t``),
      ``shared_factor``: it divided by ``q . k`` and ``shared_is_scalar``
      (the factor ``exp(c_i - c_j)`` depends on neither q nor k: in softmax's
      log space it is the additive bias ``c_i - c_j`` of FoX);
    * ``per_channel_is_scalar``: False: with distinct channel gates,
      ``weight / (q . k)`` depends on q and k, so no additive bias reproduces it.
    """
    if not isinstance(D, int) or D < 2:
        raise ValueError(f"`D` must be an int >= 2, got {D!r}")
    q = sp.symbols(f"q_1:{D + 1}", real=True)
    k = sp.symbols(f"k_1:{D + 1}", real=True)
    bi = sp.symbols(f"b_i1:{D + 1}", real=True)
    bj = sp.symbols(f"b_j1:{D + 1}", real=True)
    weight = sp.Add(*[q[d] * k[d] * sp.exp(bi[d] - bj[d]) for d in range(D)])
    q_res = [q[d] * sp.exp(bi[d]) for d in range(D)]
    k_res = [k[d] * sp.exp(-bj[d]) for d in range(D)]
    rescaled = sp.Add(*[a * b for a, b in zip(q_res, k_res)])
    ci, cj = sp.symbols("c_i c_j", real=True)
    shared = weight.subs({**{bi[d]: ci for d in range(D)}, **{bj[d]: cj for d in range(D)}})
    qk = sp.Add(*[q[d] * k[d] for d in range(D)])
    shared_factor = sp.simplify(shared / qk)
    shared_is_scalar = not (shared_factor.free_symbols & (set(q) | set(k)))
    factor = sp.simplify(weight / qk)
    per_channel_is_scalar = not (factor.free_symbols & (set(q) | set(k)))
    return dict(weight=weight, q_rescaled=q_res, k_rescaled=k_res, rescaled=rescaled,
                rescaled_equal=bool(sp.simplify(weight - rescaled) == 0),
                shared=shared, shared_factor=shared_factor, shared_is_scalar=bool(shared_is_scalar),
                per_channel_factor=factor, per_channel_is_scalar=bool(per_channel_is_scalar))


def rescaling_overflow(n: int = 6, log_f: float = -20.0, max_exponent: float | None = None) -> dict:
    """Why ``k_j e^{-b_j}`` is unstable and the bias ``b_i - b_j`` is not.

    Symbolically, with log gates ``g_1..g_n <= 0`` (``g_s = log f_s``) and
    ``b_t = g_1 + ... + g_t``:

    * ``bias_exponents``: ``b_i - b_j`` for all ``1 <= j <= i <= n``: sums of
      nonpositive symbols, so sympy proves each ``<= 0`` (``bias_nonpositive``);
      ``e^{b_i - b_j} <= 1`` can underflow to 0 but never overflow.
    * ``key_exponents``: ``-b_j``: sympy proves each ``>= 0``
      (``key_nonnegative``): ``e^{-b_j}`` only grows.

    Numerically, with every ``g_s = log_f``: ``-b_j = -j log_f``; the first
    position whose ``e^{-b_j}`` overflows float32 (``e^x`` overflows for
    ``x > max_exponent = ln(float32 max) = 88.72...``) is ``first_overflow``.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive int, got {n!r}")
    if not log_f < 0:
        raise ValueError(f"`log_f` must be < 0 for the overflow position to exist, got {log_f}")
    if max_exponent is None:
        max_exponent = math.log(3.4028234663852886e38)  # float32's largest finite value
    g = sp.symbols(f"g_1:{n + 1}", nonpositive=True)
    b = [sp.Add(*g[: t + 1]) for t in range(n)]
    bias = {(i + 1, j + 1): b[i] - b[j] for i in range(n) for j in range(i + 1)}
    key = [-bt for bt in b]
    first = math.floor(max_exponent / -log_f) + 1  # smallest j with -j log_f > max_exponent
    return dict(gates=g, cumulative=b, bias_exponents=bias, key_exponents=key,
                bias_nonpositive=all(bool(x.is_nonpositive) for x in bias.values()),
                key_nonnegative=all(bool(x.is_nonnegative) for x in key),
                max_exponent=max_exponent, first_overflow=first)
