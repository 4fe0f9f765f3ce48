"""Chapter 9 exercises: check functions for ``notebooks/09_what_they_learn_lab.ipynb``.

The checks run the student's functions on fresh seeded inputs from :mod:`pathedu.tasks` against the
library's own labels and name the mistake when an answer matches a known wrong variant.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.

Exercises:

1. :func:`check_flipflop_answers`: the flip-flop read rule.  From ``tokens (n, length)``
   (ids ``w=0, r=1, i=2, '0'=3, '1'=4``), return the answers a perfect model gives: at each
   bit that follows an ``r``, the id of the bit of the most recent ``w``; ``-100`` elsewhere
   (:func:`pathedu.tasks.flipflop_reads`).
2. :func:`check_prefix_products`: the labels of a word problem.  From a group's composition
   table (``table[a, b]`` = index of ``p_a o p_b``, ``p_b`` applied first) and ``tokens (n, length)``,
   return the prefix products, ``labels[:, t] = table[tokens[:, t], labels[:, t-1]]`` from the
   identity (:func:`pathedu.tasks.word_problem_labels`).
3. :func:`check_fewest_layers`: the reading of the paper's Fig. 2.  From ``acc (cases, depths)``, the accuracy of
   models of 1, 2, ... layers (one row per task, mixer and length), return ``(cases,)`` long: the fewest layers
   whose accuracy is at least ``threshold``, 0 where no depth reaches it (:func:`pathedu.experiments.plots.min_layers`
   reads the committed records the same way).

"""
from __future__ import annotations

import torch

from .. import tasks
from ._grader import Exercises, Verdict, check_function, seeded, paragraph

__all__ = ["check_flipflop_answers", "check_prefix_products", "check_fewest_layers", "check_sparse_reads",
           "check_represent_learn", "check_error_bug", "hint"]

EXERCISES = Exercises("ch09", {
    1: ("Walk along the sequence one instruction/bit pair at a time and keep one thing in memory. Which pairs "
        "change it, and at which position does a read put its answer?",
        "tokens (n, length): instructions at even positions, bits at odd ones. Keep `last` (n,), the id of the "
        "most recently written bit; the answer of a read at pair p sits at position 2p + 1 (the bit after the r); "
        "every other position of the (n, length) long output is -100.",
        "out = full_like(tokens, -100); for t in 0, 2, 4, ...: where tokens[:, t] == r, out[:, t + 1] = last; "
        "where tokens[:, t] == w, last = tokens[:, t + 1] (read before you update)."),
    2: ("The label at t is the state after every element up to and including t has acted. Which element acts "
        "first, and which side of the table's product is it on?",
        "cur (n,) starts at the identity, index 0; for each t, one table lookup combines the new element "
        "tokens[:, t] with cur; labels (n, length) long holds cur after each step.",
        "cur = zeros(n, long); for t in range(length): cur = table[tokens[:, t], cur]; labels[:, t] = cur."),
    3: ("For each row, which depths are good enough, and which of those is the answer? What does a row with none "
        "return?",
        "ok = acc >= threshold, (cases, depths) bool; column j is depth j + 1. The answer is the first True "
        "column of each row, plus one; rows without a True get 0.",
        "ok = acc >= threshold; first = ok.long().argmax(dim=1) (the first maximum: the first True); "
        "return torch.where(ok.any(dim=1), first + 1, 0)."),
    4: ("How many instructions does a sequence of 512 tokens have, and how likely is each one to be an r?",
        "The first instruction is a write; each later one is r with probability (1 - p_ignore) / 2.",
        "(512 / 2 - 1) * (1 - 0.98) / 2 reads on average."),
    5: ("Separate two questions: can some weights of this architecture compute the task at every length, and "
        "does training at this budget find them?",
        "Use flip-flop (star-free: a fixed depth can represent it; still one RoPE layer fails here) and the A5 "
        "word problem (no fixed depth at every length unless TC0 = NC1; still three RoPE layers solve length "
        "10).",
        "Expressivity is about the existence of weights for all lengths; a trained model is what a budget found "
        "on one length: RoPE's flip-flop errors are failures to learn a representable rule, and solving A5 at "
        "length 10 is a finite problem that says nothing about all lengths."),
    6: ("Which logits predict the bit at position t + 1?",
        "A causal language model's output at position t predicts token t + 1: compare logits[:, t] with "
        "tokens[:, t + 1] where mask[:, t + 1] is true.",
        "The planted form compares the logits at the scored bit itself (bug kind \"index\"): use "
        "logits[:, :-1] against tokens[:, 1:] under mask[:, 1:]."),

})
hint = EXERCISES.hint


# ---------------------------------------------------------------------------
# Exercise 1: the flip-flop read rule
# ---------------------------------------------------------------------------

def _flipflop_inputs(seed):
    n, length, p_ignore = [(4, 40, 0.8), (3, 64, 0.5), (5, 30, 0.2)][seed % 3]
    tokens, _ = tasks.flipflop(n, length, p_ignore=p_ignore, seed=800 + seed)
    return (tokens,)


def _flipflop_reference(tokens):
    return tasks.flipflop_reads(tokens)


def _flipflop_with(tokens, *, remember="write", where="bit", first=False, ids=True, every=False):
    """Variants of the read rule: what is remembered (the last written bit or the last bit of any pair),
    where the answer is put (after the r, or on the r), the first write instead of the last, bits as 0/1."""
    n, L = tokens.shape
    out = torch.full_like(tokens, tasks.IGNORE)
    last = torch.full((n,), tasks.IGNORE, dtype=torch.long)
    seen = torch.zeros(n, dtype=torch.bool)
    for t in range(0, L - 1, 2):
        ins, bit = tokens[:, t], tokens[:, t + 1]
        value = last if ids else torch.where(last >= 0, last - tasks.ZERO, last)
        pos = t + 1 if where == "bit" else t
        at = torch.ones_like(seen) if every else ins == tasks.R
        out[:, pos] = torch.where(at, value, out[:, pos])
        update = (ins == tasks.W) if remember == "write" else torch.ones_like(seen)
        if first:
            update = update & ~seen
        last = torch.where(update, bit, last)
        seen = seen | (ins == tasks.W)
    return out


_FLIPFLOP_WRONG = [
    (lambda tokens: _flipflop_with(tokens, remember="any"),
     "Your answer is the bit of the previous pair, whatever its instruction: an `i` pair's bit is noise. Remember "
     "only the bits that follow a `w`."),
    (lambda tokens: _flipflop_with(tokens, first=True),
     "Your answer is the *first* written bit: every later `w` overwrites the memory, so a read returns the most "
     "recent write."),
    (lambda tokens: _flipflop_with(tokens, where="instruction"),
     "You put each answer on the `r` itself: the answer belongs at the position of the bit that follows the `r` "
     "(the model predicts it at the `r`, one position earlier, but the label sits on the bit)."),
    (lambda tokens: _flipflop_with(tokens, ids=False),
     "You returned bits 0/1: return token ids, '0' = 3 and '1' = 4 (tasks.ZERO, tasks.ONE)."),
    (lambda tokens: _flipflop_with(tokens, every=True),
     "You answered after every instruction: only the bits that follow an `r` are scored; put -100 after `w` "
     "and `i`."),
]


@EXERCISES.check(1)
def check_flipflop_answers(flipflop_answers) -> Verdict:
    """Exercise 1: ``flipflop_answers(tokens) -> answers``, both ``(n, length)`` long.

    ``tokens`` alternate an instruction (``w=0, r=1, i=2``) and a bit (``'0'=3, '1'=4``), the first
    instruction a write.  ``answers[:, t]`` is, at each bit ``t`` whose instruction ``t - 1`` is ``r``,
    the id of the bit of the most recent ``w`` before it; ``-100`` at every other position.
    """
    return check_function("flip-flop read rule", flipflop_answers, _flipflop_reference, _flipflop_inputs,
                          trials=3, rtol=0.0, wrong_variants=_FLIPFLOP_WRONG)


# ---------------------------------------------------------------------------
# Exercise 2: prefix products of a word
# ---------------------------------------------------------------------------

_WORD_GROUPS = ("S3", "A4", "S4")  # non-abelian, of sizes 6, 12, 24: the order of a product matters
_GROUP_OF_SIZE = {len(tasks.group_elements(g)): g for g in _WORD_GROUPS}


def _word_inputs(seed):
    group = _WORD_GROUPS[seed % 3]
    n, length = [(4, 12), (3, 20), (2, 9)][seed % 3]
    tokens, _ = tasks.word_problem(group, n, length, seed=880 + seed)
    return tasks.compose_table(group), tokens


def _word_reference(table, tokens):
    return tasks.word_problem_labels(_GROUP_OF_SIZE[table.shape[0]], tokens)


def _word_with(table, tokens, *, order="new_first", shift=False, accumulate=True):
    n, L = tokens.shape
    cur = torch.zeros(n, dtype=torch.long)
    labels = torch.empty_like(tokens)
    for t in range(L):
        before = cur
        if not accumulate:
            cur = tokens[:, t]
        elif order == "new_first":
            cur = table[tokens[:, t], cur]
        else:
            cur = table[cur, tokens[:, t]]
        labels[:, t] = before if shift else cur
    return labels


_WORD_WRONG = [
    (lambda table, tokens: _word_with(table, tokens, order="old_first"),
     "Your product is in the other order, table[cur, token]: that applies the new element *before* the earlier "
     "ones. The earlier elements act first, so the new one is on the left: table[token, cur]."),
    (lambda table, tokens: _word_with(table, tokens, shift=True),
     "Your labels lag by one: labels[:, t] must include the element at t itself (update, then store)."),
    (lambda table, tokens: _word_with(table, tokens, accumulate=False),
     "You returned the elements themselves: the label is the product of the whole prefix."),
]


@EXERCISES.check(2)
def check_prefix_products(prefix_products) -> Verdict:
    """Exercise 2: ``prefix_products(table, tokens) -> labels``.

    ``table (G, G)`` long: ``table[a, b]`` is the index of ``p_a o p_b`` (``p_b`` applied first), as
    :func:`pathedu.tasks.compose_table`; ``tokens (n, length)`` long indices of group elements.
    ``labels[:, t]`` is the index of ``g_t o ... o g_1 o g_0``: ``labels[:, t] = table[tokens[:, t],
    labels[:, t - 1]]``, starting from the identity (index 0).
    """
    return check_function("prefix products", prefix_products, _word_reference, _word_inputs, trials=3, rtol=0.0,
                          wrong_variants=_WORD_WRONG)


# ---------------------------------------------------------------------------
# Exercise 3: the fewest layers that solve a task
# ---------------------------------------------------------------------------

THRESHOLD = 0.9


def _layers_inputs(seed):
    """Accuracies on a grid of 0.05 with the threshold itself among them (a ">" answer then differs), rows where
    no depth reaches it, and rows that dip below it again after reaching it (the deepest is not the fewest)."""
    g = seeded(830 + seed)
    cases, depths = [(12, 4), (9, 6), (15, 3)][seed % 3]
    acc = torch.randint(10, 21, (cases, depths), generator=g).double() / 20
    acc[0] = 0.5
    acc[1, :] = THRESHOLD
    acc[2] = torch.linspace(0.95, 0.6, depths, dtype=torch.float64)
    return acc, THRESHOLD


def _layers_reference(acc, threshold):
    ok = acc >= threshold
    return torch.where(ok.any(dim=1), ok.long().argmax(dim=1) + 1, 0)


def _layers_with(acc, threshold, *, strict=False, deepest=False, best=False, zero_based=False, none=0):
    ok = acc > threshold if strict else acc >= threshold
    depth = torch.arange(1, acc.shape[1] + 1)
    if best:
        pick = acc.argmax(dim=1) + 1
    elif deepest:
        pick = torch.where(ok, depth, 0).max(dim=1).values
    else:
        pick = torch.where(ok, depth, acc.shape[1] + 1).min(dim=1).values
    pick = pick - 1 if zero_based else pick
    return torch.where(ok.any(dim=1), pick, none)


_LAYERS_WRONG = [
    (lambda acc, thr: _layers_with(acc, thr, strict=True),
     "A model whose accuracy equals the threshold reaches it: compare with >=, not >."),
    (lambda acc, thr: _layers_with(acc, thr, deepest=True),
     "You returned the deepest model that reaches the threshold: the figure asks for the fewest layers."),
    (lambda acc, thr: _layers_with(acc, thr, best=True),
     "You returned the depth with the best accuracy: a shallower model that already reaches the threshold is "
     "the answer."),
    (lambda acc, thr: _layers_with(acc, thr, zero_based=True),
     "Your depths are one short: column 0 is a model of one layer."),
    (lambda acc, thr: _layers_with(acc, thr, none=acc.shape[1] + 1),
     "Rows where no depth reaches the threshold should be 0 (none), not one more than the deepest."),
    (lambda acc, thr: _layers_with(acc, thr, none=-1),
     "Rows where no depth reaches the threshold should be 0 (none), not -1."),
]


@EXERCISES.check(3)
def check_fewest_layers(fewest_layers) -> Verdict:
    """Exercise 3: ``fewest_layers(acc, threshold) -> depths``.

    ``acc (cases, depths)`` float: column ``j`` is the accuracy of the model with ``j + 1`` layers;
    ``threshold`` a float.  ``depths (cases,)`` long: per row, the smallest ``j + 1`` with
    ``acc[row, j] >= threshold``, and 0 where there is none.
    """
    return check_function("fewest layers", fewest_layers, _layers_reference, _layers_inputs, trials=3, rtol=0.0,
                          wrong_variants=_LAYERS_WRONG)


# ---------------------------------------------------------------------------
# Exercise 4 (predict, then run): how many bits a sparse sequence scores
# ---------------------------------------------------------------------------

SPARSE_LENGTH, SPARSE_P_IGNORE = 512, 0.98


def _sparse_reads() -> float:
    _, mask = tasks.flipflop(4000, SPARSE_LENGTH, p_ignore=SPARSE_P_IGNORE, seed=0)
    return mask.sum(1).double().mean().item()


@EXERCISES.prediction(4, "predict: reads in a sparse sequence", _sparse_reads, rtol=0.15, near=1.0)
def check_sparse_reads(reads) -> Verdict:
    """Exercise 4: the mean number of scored bits in a flip-flop sequence of :data:`SPARSE_LENGTH` tokens with
    ``p_ignore =`` :data:`SPARSE_P_IGNORE` (a number, within 15% of the mean over 4000 sequences; half the
    point within a factor of two)."""


# ---------------------------------------------------------------------------
# Exercise 5 (explain): represent is not learn
# ---------------------------------------------------------------------------

REPRESENT_RUBRIC = paragraph("""2 points. 1: what an architecture can represent is a statement about the existence
    of weights, for every length: flip-flop is star-free (aperiodic transitions), within reach of a fixed depth,
    while the word problem of A5 is NC1-complete, beyond any fixed depth at every length unless TC0 = NC1. 1: a
    trained model is what one budget found at one length: one RoPE layer's flip-flop errors are failures to learn a
    representable rule (attention glitches), and three RoPE layers solving A5 at length 10 solve a finite problem,
    which says nothing about all lengths. Half a point for one direction only.""")


@EXERCISES.explanation(5, "explain: represent is not learn", rubric=REPRESENT_RUBRIC)
def check_represent_learn(text) -> Verdict:
    """Exercise 5: "represent is not learn, in both directions", with flip-flop and the A5 word problem."""


# ---------------------------------------------------------------------------
# Exercise 6 (find the bug): the error on the scored bits
# ---------------------------------------------------------------------------

def _error_reference(logits, tokens, mask):
    """The error rate on the scored bits: the logits at t predict the token at t + 1."""
    wrong = logits[:, :-1].argmax(-1) != tokens[:, 1:]
    return wrong[mask[:, 1:]].double().mean()


def _error_planted(logits, tokens, mask):
    """The lab's planted form: the logits at the scored position itself are compared with its token."""
    wrong = logits.argmax(-1) != tokens
    return wrong[mask].double().mean()


def _error_bug_inputs(seed):
    n, length = [(8, 64), (5, 32), (12, 128)][seed % 3]
    tokens, mask = tasks.flipflop(n, length, p_ignore=0.5, seed=950 + seed)
    g = seeded(960 + seed)
    logits = torch.randn(n, length, len(tasks.FLIPFLOP_VOCAB), generator=g, dtype=torch.float64)
    logits[:, :-1].scatter_add_(-1, tokens[:, 1:, None], 1.5 * torch.ones(n, length - 1, 1, dtype=torch.float64))
    return logits, tokens, mask


@EXERCISES.planted_bug(6, "find the bug: the scored error", bug="index", reference=_error_reference,
                       make_inputs=_error_bug_inputs, buggy=_error_planted)
def check_error_bug(bug, scored_error_fixed) -> Verdict:
    """Exercise 6: ``bug`` names the planted error of the lab's ``scored_error_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``scored_error_fixed(logits, tokens, mask) -> ()`` (``logits: (n, L,
    V)``, ``tokens, mask: (n, L)``) is the error rate on the scored bits, fixed."""
