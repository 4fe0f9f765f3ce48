"""Chapter 8 exercises: check functions for ``notebooks/08_six_dualities_lab.ipynb``, the capstone.

The lab puts a gate that no chapter used through every form and both kernel templates: the *capped key gate*
``f_t = gamma * sigmoid(a . k_t)``, a constant per head (RetNet's ``gamma``) times a gate that each token's key
chooses (a learned projection ``a``).  It is a scalar per token, so ``log f_t = log gamma + logsigmoid(a . k_t)``
and everything of chapter 8 applies: ``G_ij = sum_{s=j+1..i} log f_s``, the softmax side's logit
``l_ij = tau q_i . k_j + G_ij`` and the linear side's weight ``omega_ij = e^{G_ij} q_i . k_j``, tied by
``omega_ij = e^{G_ij} (l_ij - G_ij) / tau``.

Exercises:

1. :func:`check_chunked_gated`: the linear side's chunked form for any scalar gate per token.
2. :func:`check_logits_from_weights`: the duality identity read backwards, the softmax side's logits from the
   linear side's weights.
3. :func:`check_capped_entry` (predict, then run): one entry of ``G`` for ``a = 0``.
4. :func:`check_why_scalar_gates` (explain): why every scalar gate has both sides and a per-channel gate does not.
5. :func:`check_bias_bug` (find the bug): the softmax side with its bias scaled.

What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import fox
from ._grader import Exercises, Verdict, check_function, randn64, seeded, paragraph

__all__ = ["check_chunked_gated", "check_logits_from_weights", "check_capped_entry",
           "check_why_scalar_gates", "check_bias_bug", "hint"]

EXERCISES = Exercises("ch08", {
    1: ("Chapter 1's chunk step, with a decay: within a chunk, what multiplies the state a query reads, and what "
        "multiplies the score of a key j <= i?",
        "With b the chunk's cumulative log gate (b_i = sum of log_f from the chunk start to i): the inter-chunk "
        "term is scaled by e^{b_i}, the intra-chunk score by e^{b_i - b_j} (j <= i); the state leaving the chunk "
        "is e^{b_last} S plus the writes scaled by e^{b_last - b_j}. Every exponent is <= 0.",
        "For each chunk: b = cumsum(log_f_c); o_c = e^{b}[:, None] * (q_c @ S.mT) + ((q_c @ k_c.mT) * "
        "exp(b[:, None] - b[None, :]) * M) @ v_c with M causal (diagonal kept, the -inf above masked before "
        "exp); S = e^{b_last} S + (v_c * e^{b_last - b}[:, None]).mT @ k_c."),
    2: ("Solve the identity omega = e^G (l - G) / tau for l.",
        "On and below the diagonal l = tau omega e^{-G} + G; above it the logit is -inf (no weight at all). "
        "omega, G: (..., T, T); tau a float.",
        "torch.where(G == -inf, -inf, tau * omega * torch.exp(-G) + G) (compute exp(-G) only where G is "
        "finite, e.g. on G.masked_fill(G == -inf, 0))."),
    3: ("With a = 0 every key chooses sigmoid(0) = 1/2.",
        "Every gate is f = gamma / 2; G_{4,1} sums log f over s = 2, 3, 4.",
        "G_{4,1} = 3 log(gamma / 2) with gamma = 0.9."),
    4: ("What does a scalar commute with, and what does a diagonal matrix of per-channel gates not commute "
        "with inside a dot product?",
        "Two points: why any scalar gate, however it is computed, splits off as e^{G_ij} and becomes a bias "
        "(softmax) and a factor (linear); and why a per-channel gate does not reduce to one number per (i, j).",
        "A scalar gate commutes with every matrix, so the product between j and i is e^{G_ij} times the matrix "
        "part, G_ij depending on (i, j) only: a bias added to the logit, a factor on the score, whatever "
        "computes f_t. A per-channel gate weighs q_id k_jd e^{b_id - b_jd} channel by channel: no single G_ij, so "
        "it belongs to the matrix part and has no softmax bias."),
    5: ("Which of the logit's two terms does the scale tau multiply?",
        "l_ij = tau Z_ij + G_ij: the score is scaled, the scalar part of the gate is added as it is.",
        "The planted form scales the bias too, tau (Z + G) (bug kind \"scale\"): it computes a gate "
        "f^tau, weaker than the linear side's."),
})
hint = EXERCISES.hint


def capped_log_gate(k, a, gamma):
    """The capped key gate ``log f_t = log gamma + logsigmoid(k_t . a)``: ``k: (..., T, D)``, ``a: (D,)``,
    ``gamma`` a float in (0, 1] -> ``(..., T)``."""
    return torch.log(torch.as_tensor(gamma, dtype=k.dtype)) + F.logsigmoid(k @ a)


# ---------------------------------------------------------------------------
# Exercise 1: the chunked form of the linear side
# ---------------------------------------------------------------------------

def _chunked_inputs(seed):
    g = seeded(1400 + seed)
    lead, T, D, Dv, chunk = [((2,), 11, 6, 4, 4), ((2, 2), 7, 4, 5, 3), ((), 20, 8, 3, 16)][seed % 3]
    q, k, v = randn64(g, *lead, T, D), randn64(g, *lead, T, D), randn64(g, *lead, T, Dv)
    log_f = capped_log_gate(k, randn64(g, D), [0.9, 0.7, 0.95][seed % 3])
    return q, k, v, log_f, chunk


def _chunked_reference(q, k, v, log_f, chunk):
    return fox.gla_recurrent(q, k, v, log_f)


def _chunked_own_gate(q, k, v, log_f, chunk):
    """A wrong variant: each token's own gate decays its own write (the sum s = j .. i)."""
    return fox.gla_recurrent(q, k, v * torch.exp(log_f)[..., None], log_f)


@EXERCISES.check(1)
def check_chunked_gated(chunked) -> Verdict:
    """Exercise 1: ``chunked(q, k, v, log_f, chunk) -> (..., T, Dv)``, the linear side with a scalar log gate per
    token (``S_t = f_t S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``) computed chunk by chunk; ``q, k: (..., T, D)``,
    ``v: (..., T, Dv)``, ``log_f: (..., T)``; compared with :func:`pathedu.fox.gla_recurrent`, with a last chunk
    shorter than the others."""
    return check_function("the chunked linear side", chunked, _chunked_reference, _chunked_inputs, rtol=1e-9,
                          wrong_variants=[(_chunked_own_gate, "Each token's own gate acts on its own write: the "
                                                              "decay of a key j runs over s = j+1 .. i.")])


# ---------------------------------------------------------------------------
# Exercise 2: the identity read backwards
# ---------------------------------------------------------------------------

def _weights_inputs(seed):
    g = seeded(1500 + seed)
    lead, T, D = [((2,), 9, 6), ((2, 2), 5, 4), ((), 12, 16)][seed % 3]
    q, k = randn64(g, *lead, T, D), randn64(g, *lead, T, D)
    G = fox.log_gate_matrix(capped_log_gate(k, randn64(g, D), 0.9))
    omega = torch.exp(G) * (q @ k.mT)
    return omega, G, D ** -0.5, q, k


def _logits_reference(omega, G, tau, q, k):
    return torch.exp(tau * (q @ k.mT) + G)


def _finite(G):
    return G.masked_fill(torch.isneginf(G), 0.0)


def _above(G, logits):
    """``logits`` with -inf where ``G`` is -inf (above the diagonal)."""
    return logits.masked_fill(torch.isneginf(G), float("-inf"))


def _exp_logits(answer):
    """The check compares e^{l} (0 where l = -inf) rather than l itself."""
    def run(omega, G, tau, q, k):
        out = answer(omega, G, tau)
        return torch.exp(out) if isinstance(out, torch.Tensor) else out
    return run


@EXERCISES.check(2)
def check_logits_from_weights(logits_from_weights) -> Verdict:
    """Exercise 2: ``logits_from_weights(omega, G, tau) -> (..., T, T)``: the softmax side's logits from the linear
    side's weights ``omega`` and the log-gate matrix ``G`` (``-inf`` above the diagonal), by the identity
    ``omega = e^G (l - G) / tau``; ``-inf`` above the diagonal.  Compared through ``e^l`` with ``e^{tau q.k + G}``
    (a finite value above the diagonal is an error there)."""
    wrong = [(_exp_logits(lambda omega, G, tau: _above(G, tau * omega * torch.exp(-_finite(G)))),
              "Your logits have lost the bias: l = tau omega e^{-G} + G, the G added back."),
             (_exp_logits(lambda omega, G, tau: _above(G, omega * torch.exp(-_finite(G)) / tau + G)),
              "You divided by tau: the identity has omega = e^G (l - G) / tau, so l - G = tau omega e^{-G}.")]
    return check_function("logits from weights", _exp_logits(logits_from_weights), _logits_reference,
                          _weights_inputs, rtol=1e-9, wrong_variants=wrong)


# ---------------------------------------------------------------------------
# Exercise 3 (predict, then run): one entry of G
# ---------------------------------------------------------------------------

ENTRY_GAMMA = 0.9


def _capped_entry() -> float:
    k = torch.randn(6, 4, generator=seeded(0), dtype=torch.float64)
    G = fox.log_gate_matrix(capped_log_gate(k, torch.zeros(4, dtype=torch.float64), ENTRY_GAMMA))
    return G[4, 1].item()


@EXERCISES.prediction(3, "predict: one entry of G", _capped_entry, rtol=1e-3)
def check_capped_entry(value) -> Verdict:
    """Exercise 3: ``G_{4,1}`` of the capped key gate with ``a = 0`` and ``gamma =`` :data:`ENTRY_GAMMA` (a
    number, within 0.1%)."""


# ---------------------------------------------------------------------------
# Exercise 4 (explain): scalar gates have both sides
# ---------------------------------------------------------------------------

SCALAR_RUBRIC = paragraph("""2 points. 1: a scalar gate commutes with every matrix, so the product of gates between
    key j and query i splits as e^{G_ij} times the matrix part, with G_ij = sum of log f_s over s = j+1..i depending
    on (i, j) only: the softmax side adds it to the logit, the linear side multiplies the score by it, however f_t
    is computed from the tokens (learned, constant, capped). 1: a per-channel gate weighs each channel differently,
    sum_d q_id k_jd e^{b_id - b_jd}, which is no single number times q_i . k_j: it belongs to the matrix part P_ij
    and gives no additive bias. Half a point for 'scalars commute' alone.""")


@EXERCISES.explanation(4, "explain: scalar gates have both sides", rubric=SCALAR_RUBRIC)
def check_why_scalar_gates(text) -> Verdict:
    """Exercise 4: why every scalar gate has a softmax side and a linear side, and a per-channel gate no softmax
    bias."""


# ---------------------------------------------------------------------------
# Exercise 5 (find the bug): the softmax side with its bias scaled
# ---------------------------------------------------------------------------

def _bias_planted(q, k, v, log_f):
    """The lab's planted form: the bias G is multiplied by the scale along with the score."""
    G = fox.log_gate_matrix(log_f)
    return torch.softmax(q.shape[-1] ** -0.5 * (q @ k.mT + G), -1) @ v


def _bias_bug_inputs(seed):
    q, k, v, log_f, _ = _chunked_inputs(seed + 7)
    return q, k, v, log_f


@EXERCISES.planted_bug(5, "find the bug: the softmax side", bug="scale", reference=fox.fox_matrix,
                       make_inputs=_bias_bug_inputs, buggy=_bias_planted)
def check_bias_bug(bug, softmax_side_fixed) -> Verdict:
    """Exercise 5: ``bug`` names the planted error of the lab's ``softmax_side_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``softmax_side_fixed(q, k, v, log_f) -> (..., T, Dv)`` is the softmax
    side of a scalar gate fixed, compared with :func:`pathedu.fox.fox_matrix`."""
