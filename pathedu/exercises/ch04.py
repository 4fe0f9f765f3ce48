"""Chapter 4 exercises: RoPE and the complex recurrence.

The checks run the student's functions on fresh random float64 inputs against :mod:`pathedu.rope`.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.
"""
from __future__ import annotations

import torch

from .. import rope
from ._grader import Exercises, Verdict, check_function, randn64, seeded, paragraph

__all__ = ["check_apply_rope_half", "check_relative_logit", "check_complex_step", "check_slowest_period",
           "check_why_far_logits_shrink", "check_rope_bug", "hint"]

EXERCISES = Exercises("ch04", {
    1: ("RoPE turns pairs of channels by an angle that grows with the position. In the half layout, which channels "
        "form a pair, and by which angle is pair n of row t turned?",
        "Split x (..., T, D) into a = its first D/2 channels and b = its last D/2; a (T, D/2) table of angles "
        "t * Omega_n with Omega_n = 10000^(-2n/D); rotate each (a, b) pair by its angle and concatenate the two "
        "rotated halves back to (..., T, D).",
        "Pair channel n with channel n + D/2 (not 2n with 2n+1), rotate (a, b) -> (a cos - b sin, a sin + b cos) "
        "by the angle t * Omega_n, and put the halves back in place: torch.cat([a * cos - b * sin, "
        "a * sin + b * cos], -1)."),
    2: ("Your function is never told t. Rotations compose: which single rotation, of one vector only, gives the "
        "same dot product as turning q by t and k by j?",
        "(R^t q) . (R^j k) = q^T (R^t)^T R^j k, and (R^t)^T = R^{-t}: the logit is the dot product of one vector "
        "turned by an amount that depends on delta alone with the other vector as it is. q, k are (B, D); the "
        "result is (B,). rope.apply_rope takes an offset.",
        "Your function is never told t. Use rotation composition: (R^t q) . (R^j k) = q^T (R^t)^T R^j k, and "
        "(R^t)^T = R^{-t}; rotate one vector only, by the right amount: "
        "(rope.apply_rope(q[:, None, :], offset=delta)[:, 0] * k).sum(-1)."),
    3: ("One step of an RNN has three parts: change the old state, write the new token, read with the query. For "
        "the complex recurrence, what is the change, what exactly is written, and in which order do they come?",
        "S (Dv, D/2) complex: the gate is one phase e^{i omega_n} per column; the write is the outer product of "
        "v_t (Dv,) with a (D/2,) complex version of the key; the output is the real part of the new state read "
        "with q_t, (Dv,). Return (S_new, o_t).",
        "Three steps, in this order: turn the old state (column n times e^{i omega_n}), add the outer product of "
        "v_t with the *conjugated* key, then read the new state with q_t and keep the real part."),
    4: ("Each pair turns by Omega_n radians per token; a full turn takes 2 pi / Omega_n tokens. Which pair is "
        "slowest?",
        "Omega_n = 10000^(-2n/D) falls with n; the last pair, n = D/2 - 1, has the longest period.",
        "2 pi / Omega_{D/2-1} = 2 pi * 10000^((D - 2)/D) tokens: for D = 64, 2 pi * 10000^(62/64)."),
    5: ("Write the logit as a sum over channel pairs, each term turned by its own angle Omega_n (t - j). What do "
        "many turned terms add up to, and does any of them lose its size?",
        "Two statements: what happens to the sum on average for large distances (the phases spread), and what "
        "does not happen (no term shrinks; the complex recurrence's |S| is constant).",
        "Far apart, the pairs' phases spread over the circle and their terms cancel on average, so the typical "
        "logit shrinks (the long-range figure); but every term keeps its modulus and nothing is forgotten: a key "
        "that matches on the slow pairs still scores high at any distance."),
    6: ("Compare the planted form with rope.apply_rope(x, pairing=\"half\") on a tensor with T = 1.",
        "Row t must turn by t * Omega_n, with t counted from 0: row 0 stays as it is.",
        "The planted form counts positions from 1 (bug kind \"index\"): use torch.arange(T). The logits still "
        "depend on t - j only, so only the outputs, not the relative logits, show it."),
})
hint = EXERCISES.hint


@EXERCISES.check(1, allow=("pathedu.rope.frequencies",))
def check_apply_rope_half(student_fn):
    """Exercise 1: ``student_fn(x)`` rotates ``x: (..., T, D)`` with the *half* pairing,
    channels ``(n, n + D/2)``, row t by ``t * Omega_n``, ``Omega_n = 10000^(-2n/D)``."""

    def make_inputs(seed):
        g = seeded(1000 + seed)
        T = [1, 9, 33][seed % 3]
        D = [8, 16, 6][seed % 3]
        return (randn64(g, 2, 3, T, D),)

    return check_function(
        "apply_rope, half pairing", student_fn, lambda x: rope.apply_rope(x, pairing="half"), make_inputs,
        trials=3, rtol=1e-9)


@EXERCISES.check(2, allow=("pathedu.rope.apply_rope", "pathedu.rope.rotation_matrix", "pathedu.rope.frequencies"))
def check_relative_logit(student_fn):
    """Exercise 2: ``student_fn(q, k, delta)`` returns the RoPE logit ``(R^t q) . (R^j k)`` of a
    query at position t and a key at position ``j = t - delta``, computed from ``delta`` alone.

    ``q, k: (B, D)``, ``delta`` an int; returns ``(B,)``.  Checked against the absolute
    rotations at two positions t for each ``delta``: since the student's function never
    sees t, matching both shows the logit depends on ``t - j`` only.
    """

    # (delta, t) per trial: each delta is tried at two query positions t.
    trials = [(5, 7), (5, 1000), (0, 3), (300, 301), (300, 5000)]

    def make_inputs(seed):
        g = seeded(1000 + seed)
        delta, t = trials[seed]
        D = [16, 8, 32][seed % 3]
        q, k = (randn64(g, 4, D) for _ in range(2))
        return q, k, delta, t

    def absolute(q, k, delta, t):  # rotate q by t and k by j = t - delta, then dot
        qr = rope.apply_rope(q[:, None, :], offset=t)[:, 0]
        kr = rope.apply_rope(k[:, None, :], offset=t - delta)[:, 0]
        return (qr * kr).sum(-1)

    return check_function(
        "relative logit", lambda q, k, delta, t: student_fn(q, k, delta), absolute, make_inputs,
        trials=len(trials), rtol=1e-9)


@EXERCISES.check(3)
def check_complex_step(student_fn):
    """Exercise 3: ``student_fn(S, q_t, k_t, v_t, omega) -> (S_new, o_t)``, one step of the complex recurrence.

    ``S: (Dv, D/2)`` complex, ``q_t, k_t: (D/2,)`` complex (the complex views ``q~_t, k~_t``),
    ``v_t: (Dv,)`` real, ``omega: (D/2,)`` real frequencies.  ``S_new = S e^{i omega} + v_t k~_t^H``
    (the gate multiplies column n by ``e^{i omega_n}``), ``o_t = Re{S_new q~_t}`` ``(Dv,)``.
    Checked by running it over a whole sequence against :func:`pathedu.rope.complex_recurrent`.
    """
    pairing = "interleaved"

    def make_inputs(seed):
        g = seeded(1000 + seed)
        T, D, Dv = [(12, 8, 4), (1, 16, 16), (30, 16, 6)][seed % 3]
        return tuple(randn64(g, T, d) for d in (D, D, Dv))

    def run_student(q, k, v):
        zq, zk = rope.to_complex(q, pairing), rope.to_complex(k, pairing)
        omega = rope.frequencies(q.shape[-1])
        S = torch.zeros(v.shape[-1], q.shape[-1] // 2, dtype=torch.complex128)
        outs = []
        for t in range(q.shape[0]):
            result = student_fn(S, zq[t], zk[t], v[t], omega)
            if not (isinstance(result, tuple) and len(result) == 2):
                raise TypeError(f"return a pair (S_new, o_t), got {type(result).__name__}")
            S, o = result
            outs.append(torch.as_tensor(o).real if torch.is_complex(torch.as_tensor(o)) else torch.as_tensor(o))
        return torch.stack(outs)

    return check_function(
        "one step of the complex recurrence", run_student, lambda q, k, v: rope.complex_recurrent(q, k, v),
        make_inputs, trials=3, rtol=1e-9)


# ---------------------------------------------------------------------------
# Exercise 4 (predict, then run): the period of the slowest pair
# ---------------------------------------------------------------------------

PERIOD_D = 64


def _slowest_period() -> float:
    return (2 * torch.pi / rope.frequencies(PERIOD_D).min()).item()


@EXERCISES.prediction(4, "predict: the slowest period", _slowest_period, rtol=0.05, near=1.0)
def check_slowest_period(tokens) -> Verdict:
    """Exercise 4: the period in tokens of RoPE's slowest channel pair for ``D =`` :data:`PERIOD_D` and base
    10000 (a number, within 5%; half the point within a factor of 2)."""


# ---------------------------------------------------------------------------
# Exercise 5 (explain): far logits shrink, nothing is forgotten
# ---------------------------------------------------------------------------

FAR_RUBRIC = paragraph("""2 points. 1: the logit is a sum over channel pairs of terms turned by Omega_n (t - j); far
    apart, their phases spread over the circle and the terms cancel on average, so the typical logit (the long-range
    figure's envelope) shrinks with distance. 1: no term loses its modulus, the rotation is unitary (|S| of the
    complex recurrence never changes): nothing is forgotten, and a key that matches the query on the slow pairs
    still scores high at any distance. No point for 'RoPE decays like a gate'.""")


@EXERCISES.explanation(5, "explain: far logits shrink", rubric=FAR_RUBRIC)
def check_why_far_logits_shrink(text) -> Verdict:
    """Exercise 5: why RoPE's logits shrink with distance on average although no gate forgets."""


# ---------------------------------------------------------------------------
# Exercise 6 (find the bug): RoPE with the half pairing, one planted error
# ---------------------------------------------------------------------------

def _rope_planted(x):
    """The lab's planted form: positions counted from 1."""
    T, D = x.shape[-2:]
    h = D // 2
    omega = 10000.0 ** (-2 * torch.arange(h, dtype=x.dtype) / D)
    theta = torch.arange(1, T + 1, dtype=x.dtype)[:, None] * omega
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * theta.cos() - b * theta.sin(), a * theta.sin() + b * theta.cos()], dim=-1)


def _rope_bug_inputs(seed):
    g = seeded(1600 + seed)
    T, D = [(7, 8), (1, 16), (20, 6)][seed % 3]
    return (randn64(g, 2, T, D),)


@EXERCISES.planted_bug(6, "find the bug: RoPE", bug="index", reference=lambda x: rope.apply_rope(x, pairing="half"),
                       make_inputs=_rope_bug_inputs, buggy=_rope_planted)
def check_rope_bug(bug, rope_half_fixed) -> Verdict:
    """Exercise 6: ``bug`` names the planted error of the lab's ``rope_half_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``rope_half_fixed(x) -> (..., T, D)`` is RoPE with the half pairing,
    fixed, compared with ``rope.apply_rope(x, pairing="half")``."""
