"""Chapter 1 exercises: check functions for ``notebooks/01_nope_linear_lab.ipynb``.

The checks run the student's functions on fresh random float64 inputs against the library's reference forms.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.

Exercises:

1. :func:`check_linear_matrix`: causal linear attention in matrix form,
   ``o_i = sum_{j<=i} (q_i . k_j) v_j``, written from the recurrence
   ``S_t = S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``.
2. :func:`check_online_softmax_merge`: merge two partial softmax results
   ``(m, l, acc)`` over disjoint sets of keys, as FlashAttention does.
3. :func:`check_chunk_step`: one chunk of causal linear attention with the
   state of the prefix, ``O_c = Q_c S^T + (Q_c K_c^T * M) V_c`` and
   ``S <- S + V_c^T K_c``.
4. :func:`check_state_shape` (predict, then run): the shape of linear attention's state.
5. :func:`check_why_order` (explain): what the causal mask tells a model without positions.
6. :func:`check_chunked_bug` (find the bug): a chunked form with one planted error.

"""
from __future__ import annotations


import torch

from .. import nope
from ..masks import causal_mask
from ._grader import Exercises, Verdict, check_function, check_parts, randn64, seeded, paragraph

__all__ = ["check_linear_matrix", "check_online_softmax_merge", "check_chunk_step", "check_state_shape",
           "check_why_order", "check_chunked_bug", "hint"]

EXERCISES = Exercises("ch01", {
    1: ("Unroll the recurrence: which outer products does S_t hold, and what does S_t q_t become once you "
        "expand it? Write o_t as a sum over tokens, then look for one matrix product that computes every such "
        "sum at once.",
        "o_i = sum over j <= i of (q_i . k_j) v_j. All the dot products q_i . k_j form one (..., T, T) matrix; "
        "the entries with j > i must not count; a product with V (..., T, Dv) then gives (..., T, Dv).",
        "o_i = sum_{j<=i} (q_i . k_j) v_j; multiply Q K^T (q @ k.mT) by a lower-triangular 0/1 mask (diagonal "
        "kept: torch.ones(T, T).tril()), then by V. No softmax, no scale."),
    2: ("Each partial was summed with its own maximum subtracted in the exponent. Two such sums can only be added "
        "once they are written relative to the same maximum: which one, and what factor converts a partial to it?",
        "The merged m is the elementwise maximum of m1 and m2, shape (..., M). Each partial needs one factor per "
        "row, shape (..., M), that multiplies its l (..., M) and, broadcast over the last dim, its acc "
        "(..., M, Dv); the rescaled partials then add.",
        "m = max(m1, m2); rescale each partial's l and acc by exp(m_a - m) (a factor <= 1; acc needs it as "
        "[..., None]), then add: l = a1 l1 + a2 l2, acc = a1 acc1 + a2 acc2."),
    3: ("Split each output of the chunk into what it reads from the tokens before the chunk (all summarised in S) "
        "and what it reads from the chunk's own tokens up to itself: exercise 1 already solved the second part.",
        "Two output terms of shape (..., C, Dv): the state S (..., Dv, D) read by every query of the chunk, and "
        "exercise 1's masked (C, C) product applied to V_c. The new state adds one outer product v_j k_j^T per "
        "token of the chunk: a (Dv, C) @ (C, D) product.",
        "o_c = Q_c S^T + (Q_c K_c^T * M) V_c with M causal (diagonal kept); S_new = S + V_c^T K_c."),
    4: ("The state is a sum of outer products v_t k_t^T, one per token, kept for every batch and head.",
        "Leading dims (B, H) stay; the token dim is summed away; an outer product of a (Dv,) and a (D,) vector "
        "is (Dv, D).",
        "(B, H, Dv, D): o_t = S_t q_t maps a D-vector to a Dv-vector."),
    5: ("Compare what token i sees with and without the mask: a set of keys, and how many.",
        "Two facts: the past is seen as an unordered set (shuffling it changes nothing), and the set has i + 1 "
        "elements, which the softmax's normalisation can reveal.",
        "A zero query averages its i + 1 visible values uniformly; if only token 0 carries a 1, token i reads "
        "1/(i+1): a count, hence a position; without the mask every token sees the same set."),
    6: ("Run it next to nope.linear_recurrent on a tiny input and compare the chunks' terms one by one.",
        "Each chunk has two terms: the prefix read through S and the masked intra-chunk product. Linear "
        "attention has no scale at all.",
        "The intra-chunk term is multiplied by D ** -0.5: a softmax habit. Drop it (bug kind \"scale\")."),
})
hint = EXERCISES.hint


# ---------------------------------------------------------------------------
# Exercise 1: linear attention, matrix form
# ---------------------------------------------------------------------------

def _linear_inputs(seed):
    g = seeded(100 + seed)
    lead, T, D, Dv = [((2, 3), 11, 8, 6), ((4,), 17, 5, 7), ((), 1, 4, 3)][seed % 3]
    return randn64(g, *lead, T, D), randn64(g, *lead, T, D), randn64(g, *lead, T, Dv)


def _linear_reference(q, k, v):
    return nope.linear_recurrent(q, k, v)


_LINEAR_WRONG = [
    (lambda q, k, v: ((q @ k.transpose(-1, -2)) * causal_mask(q.shape[-2], strict=True)) @ v,
     "Your output matches a mask that hides the diagonal: token i must also see itself (j <= i, not j < i)."),
    (lambda q, k, v: (q @ k.transpose(-1, -2)) @ v,
     "Your output matches attention with no mask: token i sees the future. Keep only j <= i."),
    (lambda q, k, v: ((q @ k.transpose(-1, -2)) * causal_mask(q.shape[-2]).transpose(0, 1)) @ v,
     "Your mask keeps j >= i: the upper triangle. Keys must come from the past (lower triangle)."),
    (lambda q, k, v: ((q @ k.transpose(-1, -2)) * causal_mask(q.shape[-2]) * q.shape[-1] ** -0.5) @ v,
     "Your output is scaled by D**-0.5: linear attention, as the recurrence defines it, has no scale."),
]


@EXERCISES.check(1)
def check_linear_matrix(linear_matrix) -> Verdict:
    """Exercise 1: ``linear_matrix(q, k, v)`` must return ``(Q K^T * M) V``.

    ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` (float64) -> ``(..., T, Dv)``,
    ``M`` the 0/1 causal mask with the diagonal kept; compared with
    :func:`pathedu.nope.linear_recurrent` on three shapes (one with T = 1).
    """
    return check_function("linear attention, matrix form", linear_matrix, _linear_reference, _linear_inputs,
                          trials=3, rtol=1e-8, wrong_variants=_LINEAR_WRONG)


# ---------------------------------------------------------------------------
# Exercise 2: one online-softmax merge
# ---------------------------------------------------------------------------

def _partial(s, v):
    """Partial softmax over one set of keys: ``m`` row max, ``l = sum e^{s-m}``, ``acc = sum e^{s-m} v``."""
    m = s.amax(-1)
    p = torch.exp(s - m[..., None])
    return m, p.sum(-1), p @ v


def _merge_inputs(seed):
    """Two partials over disjoint key sets; logits spread wide enough that a
    missing rescale is a large error, not a rounding one."""
    g = seeded(200 + seed)
    lead, M, N1, N2, Dv = [((2,), 5, 4, 7, 3), ((2, 3), 4, 9, 2, 6), ((), 6, 1, 5, 4)][seed % 3]
    s = 8.0 * randn64(g, *lead, M, N1 + N2)
    v = randn64(g, *lead, N1 + N2, Dv)
    return _partial(s[..., :N1], v[..., :N1, :]) + _partial(s[..., N1:], v[..., N1:, :])


def _merge_reference(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)  # rescale each partial to the common maximum
    return m, a1 * l1 + a2 * l2, a1[..., None] * acc1 + a2[..., None] * acc2


def _merge_no_rescale(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2


def _merge_wrong_direction(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m - m1), torch.exp(m - m2)
    return m, a1 * l1 + a2 * l2, a1[..., None] * acc1 + a2[..., None] * acc2


_MERGE_WRONG = [
    (_merge_no_rescale, "You added l and acc as they are: each partial was summed under its own maximum, "
                        "so rescale it by exp(m_a - m) first."),
    (_merge_wrong_direction, "Your rescale factors are exp(m - m_a): the wrong way round. "
                             "A partial summed under the smaller maximum must shrink: exp(m_a - m) <= 1."),
]


@EXERCISES.check(2)
def check_online_softmax_merge(merge) -> Verdict:
    """Exercise 2: ``merge(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``.

    Each partial covers a disjoint set of keys: ``m: (..., M)`` is the row
    maximum of its logits, ``l: (..., M)`` the sum of ``exp(s - m)`` and
    ``acc: (..., M, Dv)`` the sum of ``exp(s - m) v``.  The merged triple must
    describe all keys together, with ``m`` the maximum of both (so that
    ``acc / l`` is the softmax-weighted average of the values).
    """
    return check_parts("online-softmax merge", merge, _merge_reference, _merge_inputs, ("m", "l", "acc"),
                       wrong_variants=_MERGE_WRONG)


# ---------------------------------------------------------------------------
# Exercise 3: a chunk of linear attention with the prefix state
# ---------------------------------------------------------------------------

def _chunk_inputs(seed):
    """A chunk (q_c, k_c, v_c) and the state S after a random prefix; D != Dv so a transposed state shows."""
    g = seeded(300 + seed)
    lead, P, C, D, Dv = [((2,), 9, 6, 8, 5), ((3, 2), 4, 7, 4, 6), ((), 13, 1, 6, 3)][seed % 3]
    qp, kp, vp = randn64(g, *lead, P, D), randn64(g, *lead, P, D), randn64(g, *lead, P, Dv)
    _, S = nope.linear_recurrent(qp, kp, vp, return_state=True)
    return randn64(g, *lead, C, D), randn64(g, *lead, C, D), randn64(g, *lead, C, Dv), S


def _chunk_reference(q, k, v, S):
    return nope.linear_recurrent(q, k, v, initial_state=S, return_state=True)


def _chunk_no_prefix(q, k, v, S):
    o = ((q @ k.transpose(-1, -2)) * causal_mask(q.shape[-2])) @ v
    return o, S + v.transpose(-1, -2) @ k


def _chunk_updated_state(q, k, v, S):
    S_new = S + v.transpose(-1, -2) @ k
    return q @ S_new.transpose(-1, -2) + ((q @ k.transpose(-1, -2)) * causal_mask(q.shape[-2])) @ v, S_new


_CHUNK_WRONG = [
    (_chunk_no_prefix, "Your output ignores the prefix: add the inter-chunk term Q_c S^T."),
    (_chunk_updated_state, "Your inter-chunk term uses the state *after* the chunk, so the chunk's own "
                           "tokens are counted twice (and the future leaks in); use S from before the chunk."),
]


@EXERCISES.check(3)
def check_chunk_step(chunk_step) -> Verdict:
    """Exercise 3: ``chunk_step(q_c, k_c, v_c, S) -> (o_c, S_new)``.

    ``q_c, k_c: (..., C, D)``, ``v_c: (..., C, Dv)``: one chunk of C tokens;
    ``S: (..., Dv, D)``: the state after every earlier token (the layout of
    :func:`pathedu.nope.linear_recurrent`'s state).  Must return the chunk's
    outputs ``o_c: (..., C, Dv)`` and the state after the chunk ``(..., Dv, D)``,
    equal to running the recurrence token by token from ``S``.
    """
    return check_parts("chunk with prefix state", chunk_step, _chunk_reference, _chunk_inputs, ("o_c", "S_new"),
                       wrong_variants=_CHUNK_WRONG)


# ---------------------------------------------------------------------------
# Exercise 4 (predict, then run): the shape of the state
# ---------------------------------------------------------------------------

#: The lab's sizes for exercise 4 (batch, heads, tokens, key and value widths).
STATE_SIZES = dict(B=2, H=3, T=40, D=16, Dv=24)


def _state_shape() -> tuple:
    B, H, T, D, Dv = (STATE_SIZES[n] for n in ("B", "H", "T", "D", "Dv"))
    q, k = torch.zeros(B, H, T, D, dtype=torch.float64), torch.zeros(B, H, T, D, dtype=torch.float64)
    _, S = nope.linear_recurrent(q, k, torch.zeros(B, H, T, Dv, dtype=torch.float64), return_state=True)
    return tuple(S.shape)


@EXERCISES.prediction(4, "predict: the state's shape", _state_shape)
def check_state_shape(shape) -> Verdict:
    """Exercise 4: the shape of the state that ``nope.linear_recurrent(q, k, v, return_state=True)`` returns
    for the sizes :data:`STATE_SIZES` (a tuple; one point, shared among its entries)."""


# ---------------------------------------------------------------------------
# Exercise 5 (explain): what the causal mask tells a model without positions
# ---------------------------------------------------------------------------

WHY_ORDER_RUBRIC = paragraph("""2 points. 1: without the mask attention is permutation-equivariant, and with it
    token i still sees its past as an unordered set (shuffling tokens 0..i-1 leaves o_i unchanged). 1: what the mask
    adds is the size of that set, i + 1, which the softmax's normalisation exposes (a uniform average of a value
    carried by token 0 only is 1/(i+1)), so a model can count and recover positions. No point for 'the mask encodes
    positions' without how.""")


@EXERCISES.explanation(5, "explain: what the mask tells", rubric=WHY_ORDER_RUBRIC)
def check_why_order(text) -> Verdict:
    """Exercise 5: a few sentences on how a causal model without position encoding can still learn positions."""


# ---------------------------------------------------------------------------
# Exercise 6 (find the bug): a chunked form with one planted error
# ---------------------------------------------------------------------------

def _chunked_planted(q, k, v, chunk=4):
    """The lab's planted form: the intra-chunk term carries the softmax side's scale."""
    T, D = q.shape[-2], q.shape[-1]
    S = q.new_zeros(*q.shape[:-2], v.shape[-1], D)
    out = []
    for a in range(0, T, chunk):
        q_c, k_c, v_c = q[..., a:a + chunk, :], k[..., a:a + chunk, :], v[..., a:a + chunk, :]
        keep = torch.ones(q_c.shape[-2], q_c.shape[-2], dtype=q.dtype).tril()
        out.append(q_c @ S.mT + ((q_c @ k_c.mT) * keep * D ** -0.5) @ v_c)
        S = S + v_c.mT @ k_c
    return torch.cat(out, -2)


def _chunked_bug_inputs(seed):
    g = seeded(600 + seed)
    lead, T, D, Dv = [((2,), 11, 8, 5), ((2, 2), 9, 4, 6), ((), 6, 16, 3)][seed % 3]
    return randn64(g, *lead, T, D), randn64(g, *lead, T, D), randn64(g, *lead, T, Dv)


@EXERCISES.planted_bug(6, "find the bug: chunked linear attention", bug="scale", reference=_linear_reference,
                       make_inputs=_chunked_bug_inputs, buggy=_chunked_planted)
def check_chunked_bug(bug, linear_chunked_fixed) -> Verdict:
    """Exercise 6: ``bug`` names the planted error of the lab's ``linear_chunked_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`), ``linear_chunked_fixed(q, k, v) -> (..., T, Dv)`` is the form fixed
    (``q, k: (..., T, D)``, ``v: (..., T, Dv)``, chunks of 4); compared with
    :func:`pathedu.nope.linear_recurrent`."""
