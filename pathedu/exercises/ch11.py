"""Check functions for the exercises of chapter 11 (CoPE: contextual positions counted by gates).

The references are :mod:`pathedu.cope`'s forms; the typical mistakes (a forward instead of a reverse
cumulative sum, an end of the count left out, gates of the future counted, interpolating before clamping,
the position term scaled) get their own diagnosis.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.
"""
from __future__ import annotations

import torch

from .. import cope
from ._grader import Exercises, Verdict, check_function, rand64, randn64, seeded, paragraph

__all__ = ["check_positions_from_gates", "check_position_logits", "check_cope_matrix", "check_half_open_count",
           "check_what_counts", "check_cope_bug", "hint"]

EXERCISES = Exercises("ch11", {
    1: ("The position of key j seen from query i counts the gates that query i opens on the keys from j up to "
        "itself. Which keys does that range hold when j moves left, and which one cumulative sum gives every "
        "such range at once?",
        "g has shape (..., T, T), row i = query, column j = key; keep g only where j <= i (the rest is the future "
        "and counts nothing), then sum along the last dim from the right: p[..., i, j] = g[..., i, j] + "
        "g[..., i, j+1] + ... + g[..., i, i]. The result has g's shape, 0 above the diagonal.",
        "g = g * torch.ones(T, T).tril() (or torch.where with the causal mask); p = g.flip(-1).cumsum(-1).flip(-1). "
        "Both ends are included: p[i, i] = g[i, i]."),
    2: ("A position p is a fractional row number of the table E. What happens to a count larger than the last "
        "row, and in which order do you clamp and split p into its two neighbouring rows?",
        "qe (..., T, P) holds q_i . E[n] for every integer n; p (..., T, T) the counts. Clamp p to [0, P - 1] "
        "first, then lo = floor(p), hi = ceil(p) (integer tensors of p's shape), w = p - lo; gather qe's row i at "
        "lo and at hi along the last dim (qe expanded to (..., T, P) rows, indices (..., T, T)).",
        "p = p.clamp(0, P - 1); lo = p.floor(); w = p - lo; hi = p.ceil(); rows = qe.expand(p.shape[:-1] + (P,)); "
        "return (1 - w) * rows.gather(-1, lo.long()) + w * rows.gather(-1, hi.long())."),
    3: ("CoPE is causal softmax attention with one extra term on each logit, and that term is looked up at a "
        "position the query counted itself. Which pieces from exercises 1 and 2 does it need, and does the "
        "1/sqrt(D) scale touch the position term?",
        "z = Q K^T / sqrt(D) (..., T, T); gates sigmoid(z); counts p from exercise 1; qe = Q E^T (..., T, P) "
        "(E (P, D) or (..., P, D): transpose its last two dims); logits = z + exercise 2's position term (not "
        "scaled); then -inf above the diagonal, softmax over keys, @ V.",
        "z = (q @ k.mT) * q.shape[-1] ** -0.5; p = positions_from_gates(torch.sigmoid(z)); "
        "qe = q @ pos_emb.mT; logits = z + position_logits(qe, p); "
        "logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf); "
        "return torch.softmax(logits, -1) @ v."),
    4: ("With q = 0 every gate is sigma(0) = 1/2. Which gates does p_{9,3} add up?",
        "p_ij sums g_im for m = j .. i: both ends included.",
        "Seven gates (m = 3 .. 9) of 1/2 each."),
    5: ("What decides the position of key j for query i in CoPE, and in RoPE?",
        "Two points: where the count comes from (gates computed from the query and every key in between) and "
        "what RoPE's position is (the token distance, whatever the tokens are).",
        "p_ij counts the gates sigma(q_i . k_m), m = j..i, which the query opens on the tokens it cares about "
        "(sentence ends, a word): positions in units the query chooses, interpolated between table rows; "
        "RoPE's i - j counts every token. The price: positions depend on the query, so no key can be rotated "
        "or embedded once for all queries."),
    6: ("Run the planted form with every gate open (a large query along a shared key direction): what is p_ii?",
        "The count p_ij includes the key's own gate: m runs from j to i, so p_ii = g_ii.",
        "The planted form subtracts the key's own gate, counting m = j+1 .. i (bug kind \"index\"): drop the "
        "subtraction."),

})
hint = EXERCISES.hint


def _future(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).triu(1)


def _reverse_cumsum(x):
    return x.flip(-1).cumsum(-1).flip(-1)


# ---------------------------------------------------------------------------
# Exercise 1: positions from gates
# ---------------------------------------------------------------------------

def _positions(g):
    """The reference: ``p_ij = sum_{m=j..i} g_im`` for ``j <= i``, 0 above the diagonal."""
    return _reverse_cumsum(g.masked_fill(_future(g.shape[-1]), 0.0))


_POSITION_MISTAKES = [
    (lambda g: g.masked_fill(_future(g.shape[-1]), 0.0).cumsum(-1).tril(),
     "you summed from the left (a forward cumsum: the gates of keys 0..j). A key's count runs from the key to the "
     "query, m = j..i: sum from the right (flip, cumsum, flip), so that the nearest key gets the smallest position."),
    (lambda g: _positions(g) - g.tril(),
     "you left out the key's own gate: the count runs over m = j..i with both ends included, so the diagonal "
     "p[i, i] is g[i, i], not 0."),
    (lambda g: _positions(g) - torch.diagonal(g, dim1=-2, dim2=-1)[..., :, None] * torch.ones_like(g).tril(),
     "you left out the query's own gate g[i, i]: the count runs over m = j..i, both ends included."),
    (lambda g: _reverse_cumsum(g).tril(),
     "you counted the gates of future keys (j > i): mask g to j <= i *before* the cumulative sum, not after it."),
    (lambda g: _reverse_cumsum(g),
     "you counted the gates of future keys (j > i), and left them above the diagonal: mask g to j <= i before the "
     "cumulative sum."),
]


@EXERCISES.check(1)
def check_positions_from_gates(fn) -> Verdict:
    """``fn(g: (..., T, T)) -> p: (..., T, T)`` with ``p[..., i, j] = sum_{m=j..i} g[..., i, m]`` for ``j <= i``
    and 0 above the diagonal; ``g`` holds gates in (0, 1) everywhere, the future included (to be ignored)."""
    def make(seed):
        lead, T = [((2,), 9), ((3, 2), 6), ((), 1)][seed]
        return (rand64(seeded(1000 + seed), *lead, T, T) * 0.98 + 0.01,)

    return check_function("positions from gates", fn, _positions, make, rtol=1e-9, wrong_variants=_POSITION_MISTAKES)


# ---------------------------------------------------------------------------
# Exercise 2: clamp, then interpolate the scalars q_i . E[n]
# ---------------------------------------------------------------------------

def _position_logits(qe, p):
    """The reference, from :mod:`pathedu.cope`'s own pieces."""
    return cope._position_logits(qe, p, qe.shape[-1])


def _extrapolated(qe, p):
    """Interpolating before clamping: ``lo`` kept below the last row and ``hi = lo + 1``, so a count past
    ``P - 1`` extrapolates the last segment linearly instead of reading ``E[P - 1]``."""
    P = qe.shape[-1]
    lo = p.floor().clamp(0, max(P - 2, 0))
    hi = (lo + 1).clamp(max=P - 1)
    w = p - lo
    rows = qe.expand(p.shape[:-1] + (P,))
    return (1 - w) * rows.gather(-1, lo.long()) + w * rows.gather(-1, hi.long())


def _swapped(qe, p):
    P = qe.shape[-1]
    pc = p.clamp(0, P - 1)
    lo, hi = pc.floor(), pc.ceil()
    w = pc - lo
    rows = qe.expand(p.shape[:-1] + (P,))
    return w * rows.gather(-1, lo.long()) + (1 - w) * rows.gather(-1, hi.long())


def _rounded(qe, p):
    P = qe.shape[-1]
    rows = qe.expand(p.shape[:-1] + (P,))
    return rows.gather(-1, p.clamp(0, P - 1).round().long())


def _floored(qe, p):
    P = qe.shape[-1]
    rows = qe.expand(p.shape[:-1] + (P,))
    return rows.gather(-1, p.clamp(0, P - 1).floor().long())


_INTERPOLATION_MISTAKES = [
    (_extrapolated, "you interpolated before clamping: a count past P - 1 extrapolated the last segment beyond the "
                    "table. Clamp p itself to [0, P - 1] first; every count past the end then reads E[P - 1]."),
    (_swapped, "the two weights are swapped: w = p - floor(p) is the weight of the *upper* neighbour ceil(p), "
               "1 - w that of floor(p) (at p = 2.9 the result must be close to qe[..., 3])."),
    (_rounded, "you rounded p to the nearest row: CoPE interpolates between floor(p) and ceil(p), so the logit "
               "moves continuously with the count."),
    (_floored, "you read row floor(p) only: CoPE interpolates between floor(p) and ceil(p) with the weight "
               "w = p - floor(p)."),
]


@EXERCISES.check(2)
def check_position_logits(fn) -> Verdict:
    """``fn(qe: (..., T, P), p: (..., T, T)) -> (..., T, T)``: ``(1 - w) qe[i, floor p'] + w qe[i, ceil p']`` with
    ``p' = clamp(p, 0, P - 1)`` and ``w = p' - floor p'``, entry by entry (counts past ``P - 1`` and integer counts
    included)."""
    def make(seed):
        lead, T, P = [((2,), 8, 4), ((1, 3), 5, 7), ((), 3, 1)][seed]
        g = seeded(1000 + seed)
        qe = randn64(g, *lead, T, P)
        p = rand64(g, *lead, T, T) * (P + 3)
        p[..., 0, :2] = torch.tensor([0.0, float(P - 1)], dtype=torch.float64)  # the two ends, exactly
        if T > 2:
            p[..., 1, 2] = 1.0  # an integer inside the table
        return qe, p

    return check_function("position logits from qe", fn, _position_logits, make, rtol=1e-9,
                          wrong_variants=_INTERPOLATION_MISTAKES)


# ---------------------------------------------------------------------------
# Exercise 3: CoPE in matrix form
# ---------------------------------------------------------------------------

def _cope_variant(q, k, v, pos_emb, *, counts=_positions, scale_position=False):
    """CoPE in matrix form with one piece swapped (for the diagnoses)."""
    scale = q.shape[-1] ** -0.5
    z = scale * (q @ k.transpose(-1, -2))
    qe = q @ pos_emb.transpose(-1, -2)
    pos = _position_logits(qe, counts(torch.sigmoid(z)))
    logits = (z + (scale * pos if scale_position else pos)).masked_fill(_future(q.shape[-2]), float("-inf"))
    return torch.softmax(logits, -1) @ v


_COPE_MISTAKES = [
    (lambda q, k, v, E: _cope_variant(q, k, v, E, scale_position=True),
     "you multiplied the position term by 1/sqrt(D): CoPE scales q . k only; q_i . e(p) enters the logit unscaled."),
    (lambda q, k, v, E: _cope_variant(q, k, v, E, counts=_POSITION_MISTAKES[0][0]),
     "your counts run from the left (a forward cumsum): a key's count sums the gates from the key to the query."),
    (lambda q, k, v, E: _cope_variant(q, k, v, E, counts=_POSITION_MISTAKES[1][0]),
     "your counts leave out the key's own gate: m = j..i, both ends included."),
    (lambda q, k, v, E: _cope_variant(q, k, v, E, counts=_POSITION_MISTAKES[3][0]),
     "your counts include the gates of future keys: set the gates above the diagonal to 0 before the cumulative "
     "sum (masking the logits alone is too late)."),
]


@EXERCISES.check(3)
def check_cope_matrix(fn) -> Verdict:
    """``fn(q, k, v, pos_emb) -> (..., T, Dv)``: CoPE in matrix form, ``scale = D ** -0.5`` on ``q . k`` only;
    ``pos_emb`` of shape ``(P, D)``; checked against :func:`pathedu.cope.cope_matrix` on float64 inputs, with
    tables shorter than the sequence (clamping) and longer."""
    def make(seed):
        lead, T, D, Dv, P = [((2,), 10, 8, 5, 4), ((1, 2), 7, 4, 3, 12), ((), 1, 4, 2, 2)][seed]
        g = seeded(1000 + seed)
        q, k = (1.5 * randn64(g, *lead, T, D) for _ in range(2))
        v = randn64(g, *lead, T, Dv)
        return q, k, v, 2 * randn64(g, P, D)

    return check_function("CoPE matrix form", fn, cope.cope_matrix, make, rtol=1e-9, wrong_variants=_COPE_MISTAKES)


# ---------------------------------------------------------------------------
# Exercise 4 (predict, then run): a count of half-open gates
# ---------------------------------------------------------------------------

def _half_open_count() -> float:
    T = 12
    q, k = torch.zeros(T, 4, dtype=torch.float64), torch.ones(T, 4, dtype=torch.float64)
    return cope.cope_positions(q, k)[9, 3].item()


@EXERCISES.prediction(4, "predict: a count of half-open gates", _half_open_count, rtol=1e-6)
def check_half_open_count(count) -> Verdict:
    """Exercise 4: ``p_{9,3}`` when every gate is ``sigma(0)`` (``q = 0``), unclamped (a number)."""


# ---------------------------------------------------------------------------
# Exercise 5 (explain): what counts
# ---------------------------------------------------------------------------

WHAT_COUNTS_RUBRIC = paragraph("""2 points. 1: CoPE's position of key j is the count p_ij = sum of sigma(q_i . k_m)
    over m = j..i: the query opens gates on the tokens it cares about (sentence ends, one word), so positions come
    in units it chooses, fractional counts interpolated between table rows. 1: RoPE's position is the token distance
    i - j, the same whatever the tokens are; the price of CoPE's choice is that positions depend on the query, so no
    key can be position-encoded once for every query (the count is recomputed per query). Half a point for 'CoPE is
    contextual' without the gates.""")


@EXERCISES.explanation(5, "explain: what counts", rubric=WHAT_COUNTS_RUBRIC)
def check_what_counts(text) -> Verdict:
    """Exercise 5: what CoPE counts and RoPE cannot, and what it costs."""


# ---------------------------------------------------------------------------
# Exercise 6 (find the bug): CoPE with one planted error
# ---------------------------------------------------------------------------

def _cope_planted(q, k, v, pos_emb):
    """The lab's planted form: each key's own gate is left out of its count."""
    T, D = q.shape[-2:]
    P = pos_emb.shape[-2]
    z = (q @ k.mT) * D ** -0.5
    ahead = _future(T)
    g = torch.sigmoid(z).masked_fill(ahead, 0.0)
    p = (g.flip(-1).cumsum(-1).flip(-1) - g).clamp(0, P - 1)
    lo, w = p.floor(), p - p.floor()
    qe = q @ pos_emb.mT
    term = (1 - w) * qe.gather(-1, lo.long()) + w * qe.gather(-1, p.ceil().long())
    return torch.softmax((z + term).masked_fill(ahead, -torch.inf), -1) @ v


def _cope_bug_inputs(seed):
    g = seeded(2200 + seed)
    lead, T, D, Dv, P = [((2,), 9, 8, 4, 5), ((2, 2), 6, 4, 5, 8), ((), 13, 16, 3, 6)][seed % 3]
    q, k = (3 * randn64(g, *lead, T, D) for _ in range(2))
    v = randn64(g, *lead, T, Dv)
    return q, k, v, randn64(g, P, D)


@EXERCISES.planted_bug(6, "find the bug: CoPE", bug="index", reference=cope.cope_matrix, make_inputs=_cope_bug_inputs,
                       buggy=_cope_planted)
def check_cope_bug(bug, cope_fixed) -> Verdict:
    """Exercise 6: ``bug`` names the planted error of the lab's ``cope_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``cope_fixed(q, k, v, pos_emb) -> (..., T, Dv)`` (``pos_emb: (P,
    D)``) is CoPE fixed (scale ``D ** -0.5``), compared with :func:`pathedu.cope.cope_matrix`."""
