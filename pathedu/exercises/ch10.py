"""Check functions for the exercises of chapter 10 (stick-breaking attention).

The references are :mod:`pathedu.stickbreaking`'s forms.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.

Positions are 0-based: row ``i`` of a ``(..., T, T)`` logit matrix ``ell`` is the query, column ``j`` the key,
and a query sees the keys ``j < i`` only (the first token sees nothing).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import stickbreaking as sb
from ..masks import causal_mask
from ._grader import (Exercises, Verdict, call_student as _call, check_function, check_parts, fallback_hint,
                      student_failed, verdict, rand64, randn64, seeded, paragraph)

__all__ = ["check_stick_log_weights", "check_stick_remainder", "check_stick_block_step", "check_even_sticks",
           "check_why_no_positions", "check_stick_bug", "hint"]

EXERCISES = Exercises("ch10", {
    1: ("Walk the stick backwards from the query: key j takes sigma(l_ij) of what the keys between j and the query "
        "left. Which keys lie strictly between them, and in which space do you add their shares up?",
        "log alpha[..., i, j] = logsigmoid(ell[..., i, j]) + the sum of logsigmoid(-ell[..., i, s]) over s = j+1 .. i-1; "
        "-inf where j >= i (the query itself and the future are not keys). For each row that sum is a reverse "
        "cumulative sum along the keys, strictly after j; the gates of keys s >= i must be 0 before you sum.",
        "seen = torch.ones(T, T, dtype=torch.bool).tril(-1); g = F.logsigmoid(-ell).masked_fill(~seen, 0.0); "
        "after = g.flip(-1).cumsum(-1).flip(-1) - g (the sum over s > j); "
        "return (F.logsigmoid(ell) + after).masked_fill(~seen, -inf). Never torch.log(1 - torch.sigmoid(ell))."),
    2: ("Each key breaks off a share of the stick; what is left after query i has visited all its keys is a "
        "product of one factor per key. Which keys does row i visit, and how long is the stick of a query that "
        "has no key at all?",
        "r[..., i] = prod over j < i of (1 - sigma(ell[..., i, j])): the output has shape (..., T), and r[..., 0] "
        "is an empty product. In log space, 1 - sigma(ell) is sigma(-ell), so the product is exp of a masked sum of "
        "logsigmoid(-ell) along the last dim.",
        "seen = torch.ones(T, T, dtype=torch.bool).tril(-1); "
        "return torch.exp(F.logsigmoid(-ell).masked_fill(~seen, 0.0).sum(-1)) (row 0 sums nothing: exp(0) = 1)."),
    3: ("The keys right of the block have already broken off their shares: the carry is the log of what they left. "
        "Every weight in this block is scaled by that leftover, and the block leaves less for the keys on its left.",
        "With g = logsigmoid(-ell) (..., M, N): log w[..., r, c] = logsigmoid(ell[..., r, c]) + (sum of g[..., r, s] "
        "over block columns s > c) + carry[..., r]; acc' = acc + exp(log w) @ v (..., M, Dv); carry' = carry + "
        "g.sum(-1) (..., M). No mask: every key of the block is left of every query.",
        "g = F.logsigmoid(-ell); after = g.flip(-1).cumsum(-1).flip(-1) - g; "
        "w = torch.exp(F.logsigmoid(ell) + after + carry[..., None]); return acc + w @ v, carry + g.sum(-1)."),
    4: ("With every logit 0, each key breaks off sigma(0) = 1/2 of what is left when the stick reaches it.",
        "Query 5 meets keys 4, 3, 2, ... in that order; key 2's weight is its share of what keys 4 and 3 left. "
        "The leftover is what all five keys left.",
        "alpha_{5,2} = (1/2) (1/2)^2; leftover = (1/2)^5."),
    5: ("Follow the stick of one query: which keys does it meet first, and what does each key's break do to the "
        "keys behind it?",
        "Two points: where the preference for recent keys comes from (the order of the breaks, factors "
        "1 - sigma(l) of the keys in between), and what the weights do not have to do (sum to 1).",
        "The nearest keys break off first and every key between j and i multiplies key j's weight by "
        "1 - sigma(l_is): a recency bias set by content, as a forget gate chosen by the query, with no position "
        "encoding; the weights sum to 1 minus the leftover stick, so a query may attend to nothing."),
    6: ("Run the planted form for T = 2: query 1 has one key. What weight should key 0 get, and what does it get?",
        "Key j takes sigma(l_ij) of what is left *before* its own break; the factor 1 - sigma(l_ij) acts on the "
        "keys behind it only.",
        "The planted form shrinks the stick by key j's own break before giving key j its share (bug kind "
        "\"self\"): compute the weight first, then shrink what is left."),

})
hint = EXERCISES.hint

_NEG_INF = float("-inf")


def _logits(seed, shapes, scales):
    """Float64 logits ``(..., T, T)``; the scale of trial ``seed`` sets how large they get."""
    g = seeded(900 + seed)
    return scales[seed] * randn64(g, *shapes[seed])


def _seen(T):
    return causal_mask(T, strict=True)  # j < i


# Known mistakes of exercise 1, each a function of z, and what to say about it.
def _log_weights_inclusive(z):
    """Key j's own gate counted too: sum over s = j .. i-1."""
    seen = _seen(z.shape[-1])
    return (sb._log_weights(z) + F.logsigmoid(-z)).masked_fill(~seen, _NEG_INF)


def _log_weights_through_query(z):
    """The query's own token counted as a gate: sum over s = j+1 .. i."""
    seen = _seen(z.shape[-1])
    own = torch.diagonal(F.logsigmoid(-z), dim1=-2, dim2=-1)[..., :, None]
    return (sb._log_weights(z) + own).masked_fill(~seen, _NEG_INF)


def _log_weights_linear(z):
    """The factors 1 - sigma(ell) formed in linear space, then their log."""
    seen = _seen(z.shape[-1])
    g = torch.log(1 - torch.sigmoid(z)).masked_fill(~seen, 0.0)
    after = g.flip(-1).cumsum(-1).flip(-1) - g
    return (torch.log(torch.sigmoid(z)) + after).masked_fill(~seen, _NEG_INF)


@EXERCISES.check(1)
def check_stick_log_weights(fn) -> Verdict:
    """``fn(ell: (..., T, T)) -> log alpha: (..., T, T)`` with ``log alpha_ij = log sigma(l_ij) + sum_{s=j+1..i-1}
    log sigma(-l_is)`` for ``j < i`` and ``-inf`` for ``j >= i``; checked on float64 logits of a few shapes,
    the last trial with logits large enough (|l| > 37) that ``1 - sigmoid(ell)`` rounds to 0 even in float64."""
    name = "stick-breaking log weights"
    shapes, scales = [(2, 7, 7), (3, 11, 11), (1, 9, 9)], [1.5, 3.0, 25.0]
    for seed in range(3):
        z = _logits(seed, shapes, scales)
        T = z.shape[-1]
        got, err = _call(fn, z.clone())
        if err:
            return student_failed(name, err)
        if not isinstance(got, torch.Tensor):
            return verdict(name, False, f"expected a torch.Tensor, got {type(got).__name__}.")
        if tuple(got.shape) != tuple(z.shape):
            return verdict(name, False, f"expected shape {tuple(z.shape)} for ell of shape {tuple(z.shape)}, "
                                        f"got {tuple(got.shape)}.")
        got = got.double()
        seen = _seen(T)
        if bool(torch.isnan(got).any()):
            return verdict(name, False, "your answer has NaN entries, an -inf - (-inf) somewhere. Either the log "
                                        "gates were formed as log(1 - sigmoid(ell)), which is -inf once l > 37 (1 - "
                                        "sigmoid(ell) rounds to 0, even in float64): form them as logsigmoid(-ell); or "
                                        "-inf was put in before summing: give the gates of the keys a row does not "
                                        "see the value 0, sum, and write -inf only at the end.")
        hidden = got[..., ~seen]
        if not bool((hidden == _NEG_INF).all()):
            diag = torch.diagonal(got, dim1=-2, dim2=-1)
            if bool((diag > _NEG_INF).any()):
                return verdict(name, False, "the diagonal must be -inf too: a query is not a key of its own row "
                                            "(keys j < i only), so the first token sees nothing and row 0 is all "
                                            "-inf.")
            return verdict(name, False, "above the diagonal (j > i, the future) log alpha must be -inf, not 0: "
                                        "exp(0) = 1 would give every future key a whole stick.")
        want = sb._log_weights(z)
        got_s, want_s = got[..., seen], want[..., seen]
        if bool(torch.isneginf(got_s).any()):
            return verdict(name, False, "some weights below the diagonal are exactly 0 (log = -inf) where the true "
                                        "value is tiny but positive: 1 - sigmoid(ell) rounds to 0 once l > 37 even in "
                                        "float64. Form log(1 - sigma(ell)) as logsigmoid(-ell), never as "
                                        "log(1 - sigmoid(ell)).")
        if not torch.allclose(got_s, want_s, rtol=1e-9, atol=1e-9):
            for wrong, message in [
                (_log_weights_inclusive, "you counted key j's own gate: the product runs over the keys strictly "
                                         "after j, s = j+1 .. i-1 (key j takes sigma(l_ij), it does not also "
                                         "leave 1 - sigma(l_ij))."),
                (_log_weights_through_query, "you counted the query's own token as a gate: the product stops at "
                                             "s = i-1, since the query is not a key of its own row."),
                (lambda x: -sb._log_weights(x), "the sign is flipped: every log weight is <= 0."),
            ]:
                ref = wrong(z)[..., seen]
                if torch.allclose(got_s, ref, rtol=1e-9, atol=1e-9):
                    return verdict(name, False, message)
            return verdict(name, False, "wrong values below the diagonal: log alpha_ij = logsigmoid(l_ij) + "
                                        "logsigmoid(-ell_i,j+1) + ... + logsigmoid(-ell_i,i-1). " + fallback_hint())
    return verdict(name, True, "-inf on and above the diagonal, and below it log sigma(l_ij) plus the log gates "
                               "of the keys between j and the query, exact even where 1 - sigmoid(ell) rounds to 0.")


def _remainder_reference(z):
    seen = _seen(z.shape[-1])
    return torch.exp(F.logsigmoid(-z).masked_fill(~seen, 0.0).sum(-1))


@EXERCISES.check(2)
def check_stick_remainder(fn) -> Verdict:
    """``fn(ell: (..., T, T)) -> r: (..., T)`` with ``r_i = prod_{j<i} (1 - sigma(l_ij))`` (``r_0 = 1``): what
    each query leaves of its stick, ``1 - sum_j alpha_ij``; checked against the log-space form on float64 logits."""
    shapes = [(2, 8, 8), (3, 13, 13), (1, 1, 1)]

    def make(seed):
        return (_logits(seed, shapes, [1.5, 2.0, 1.0]),)

    def diag_too(z):
        keep = torch.ones(z.shape[-1], z.shape[-1], dtype=torch.bool).tril()
        return torch.exp(F.logsigmoid(-z).masked_fill(~keep, 0.0).sum(-1))

    def first_zero(z):
        r = _remainder_reference(z).clone()
        r[..., 0] = 0.0
        return r

    def broken_not_left(z):
        return 1 - _remainder_reference(z)

    def sigma_not_complement(z):
        return torch.exp(F.logsigmoid(z).masked_fill(~_seen(z.shape[-1]), 0.0).sum(-1))

    wrong = [
        (diag_too, "you included the diagonal j = i: a query is not a key of its own row, so its own logit breaks "
                   "nothing (the product runs over j < i)."),
        (first_zero, "the first token has no key, so it breaks nothing: its whole stick is left, r_0 = 1 "
                     "(an empty product), not 0."),
        (broken_not_left, "that is the stick that was broken off (the row sum of alpha), not what is left: "
                          "r_i = 1 - sum_j alpha_ij."),
        (sigma_not_complement, "each key leaves 1 - sigma(l_ij) = sigma(-l_ij) of the stick, not sigma(l_ij)."),
    ]
    return check_function("the leftover stick", fn, _remainder_reference, make, rtol=1e-9, wrong_variants=wrong)


def _block_reference(z, v, carry, acc):
    log_w, new_carry = sb._block_log_weights(z, carry)
    return acc + torch.exp(log_w) @ v, new_carry


@EXERCISES.check(3)
def check_stick_block_step(fn) -> Verdict:
    """``fn(ell, v, carry, acc) -> (acc', carry')``: one step of the right-to-left scan over a block of ``N`` keys
    that lie left of every one of ``M`` queries (no mask). ``ell: (..., M, N)`` the logits, ``v: (..., N, Dv)``,
    ``carry: (..., M)`` the log of the stick left by the keys right of the block (<= 0), ``acc: (..., M, Dv)``;
    checked against :func:`pathedu.stickbreaking._block_log_weights` on float64 inputs."""
    dims = [((2,), 4, 5, 3), ((3,), 6, 3, 2), ((1, 2), 1, 4, 5)]

    def make(seed):
        g = seeded(930 + seed)
        lead, M, N, Dv = dims[seed]
        z = 2.0 * randn64(g, *lead, M, N)
        v = randn64(g, *lead, N, Dv)
        carry = -3.0 * rand64(g, *lead, M)
        acc = randn64(g, *lead, M, Dv)
        return z, v, carry, acc

    def no_carry_in_weights(z, v, carry, acc):
        log_w, new_carry = sb._block_log_weights(z, torch.zeros_like(carry))
        return acc + torch.exp(log_w) @ v, carry + F.logsigmoid(-z).sum(-1)

    def inclusive(z, v, carry, acc):
        g = F.logsigmoid(-z)
        log_w = F.logsigmoid(z) + g.flip(-1).cumsum(-1).flip(-1) + carry[..., None]
        return acc + torch.exp(log_w) @ v, carry + g.sum(-1)

    def carry_with_sigma(z, v, carry, acc):
        out, _ = _block_reference(z, v, carry, acc)
        return out, carry + F.logsigmoid(z).sum(-1)

    def carry_in_linear_space(z, v, carry, acc):
        out, new_carry = _block_reference(z, v, carry, acc)
        return out, torch.exp(new_carry)

    def left_to_right(z, v, carry, acc):
        g = F.logsigmoid(-z)
        before = g.cumsum(-1) - g  # the gates of the keys *left* of c inside the block
        log_w = F.logsigmoid(z) + before + carry[..., None]
        return acc + torch.exp(log_w) @ v, carry + g.sum(-1)

    wrong = [
        (no_carry_in_weights, "the carry must scale this block's weights too: the keys right of the block already "
                              "took their shares, so every weight here is multiplied by exp(carry)."),
        (inclusive, "you counted key c's own gate in its weight: within the block the sum runs over the columns "
                    "strictly right of c (key c takes sigma(ell), it does not also leave 1 - sigma(ell))."),
        (carry_with_sigma, "the carry adds what the block leaves, logsigmoid(-ell), not what it takes, logsigmoid(ell)."),
        (carry_in_linear_space, "return the carry in log space, the way it came in (a sum of logsigmoid(-ell), <= 0), "
                                "not its exponential."),
        (left_to_right, "the stick is broken from the query backwards: a key's weight depends on the keys right of "
                        "it (nearer the query), not on those left of it."),
    ]
    return check_parts("one block of the right-to-left scan", fn, _block_reference, make, ("acc", "carry"),
                       rtol=1e-9, wrong_variants=wrong)


# ---------------------------------------------------------------------------
# Exercise 4 (predict, then run): even sticks
# ---------------------------------------------------------------------------

EVEN_T = 6


def _even_sticks() -> tuple:
    q, k = torch.zeros(EVEN_T, 4, dtype=torch.float64), torch.ones(EVEN_T, 4, dtype=torch.float64)
    weights, rest = sb.stickbreaking_weights(q, k), sb.stick_remainder(q, k)
    return weights[5, 2].item(), rest[5].item()


@EXERCISES.prediction(4, "predict: even sticks", _even_sticks, rtol=1e-6)
def check_even_sticks(prediction) -> Verdict:
    """Exercise 4: ``(alpha_{5,2}, leftover of query 5)`` when every logit is 0 (a pair of numbers, half the
    point each)."""


# ---------------------------------------------------------------------------
# Exercise 5 (explain): recent keys without positions
# ---------------------------------------------------------------------------

NO_POSITIONS_RUBRIC = paragraph("""2 points. 1: the stick is broken from the query backwards, nearest key first, and
    every key s between j and i multiplies key j's weight by 1 - sigma(l_is): a preference for recent keys that the
    content sets (a forget gate chosen by the query), so no position encoding is needed for it. 1: there is no
    softmax, the weights need not sum to 1: what no key takes is the leftover stick, and a query that matches
    nothing attends to (almost) nothing. Half a point for 'it is like a forget gate' without the order of the
    breaks.""")


@EXERCISES.explanation(5, "explain: recent keys without positions", rubric=NO_POSITIONS_RUBRIC)
def check_why_no_positions(text) -> Verdict:
    """Exercise 5: why stick-breaking prefers recent keys with no position encoding, and what the leftover
    stick means."""


# ---------------------------------------------------------------------------
# Exercise 6 (find the bug): stick-breaking with one planted error
# ---------------------------------------------------------------------------

def _stick_planted(q, k, v):
    """The lab's planted form: key j's own break shrinks the stick before key j takes its share."""
    T = q.shape[-2]
    ell = q.shape[-1] ** -0.5 * q @ k.mT
    alpha = torch.zeros(*q.shape[:-2], T, T, dtype=q.dtype)
    left = torch.ones(*q.shape[:-2], T, dtype=q.dtype)
    for j in range(T - 2, -1, -1):
        share = torch.sigmoid(ell[..., j + 1:, j])
        left[..., j + 1:] = left[..., j + 1:] * (1 - share)
        alpha[..., j + 1:, j] = share * left[..., j + 1:]
    return alpha @ v


def _stick_bug_inputs(seed):
    g = seeded(1100 + seed)
    lead, T, D, Dv = [((2,), 9, 8, 4), ((2, 2), 6, 4, 5), ((), 13, 16, 3)][seed % 3]
    return tuple(randn64(g, *lead, T, d) for d in (D, D, Dv))


@EXERCISES.planted_bug(6, "find the bug: stick-breaking", bug="self", reference=sb.stickbreaking_matrix,
                       make_inputs=_stick_bug_inputs, buggy=_stick_planted)
def check_stick_bug(bug, stickbreaking_fixed) -> Verdict:
    """Exercise 6: ``bug`` names the planted error of the lab's ``stickbreaking_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``stickbreaking_fixed(q, k, v) -> (..., T, Dv)`` is stick-breaking
    attention fixed (scale ``D ** -0.5``), compared with :func:`pathedu.stickbreaking.stickbreaking_matrix`."""
