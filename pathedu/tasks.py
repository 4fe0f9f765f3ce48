r"""Synthetic tasks that separate the position encodings: flip-flop, word problems, MQRAR-N.

Every generator is seeded (a :class:`torch.Generator` made from ``seed``) and
returns CPU tensors; the same arguments give the same tensors on every machine.
Positions are 0-based.  Bad arguments raise ``ValueError``/``TypeError`` naming the
argument in backticks.

* :func:`flipflop` -- flip-flop language modelling (Liu et al., 2023; the PaTH paper's Table 1):
  instruction/bit pairs ``w b`` (write), ``r b`` (read: ``b`` is the last written bit),
  ``i b`` (ignore).  Ids :data:`FLIPFLOP_VOCAB`: ``w=0, r=1, i=2, '0'=3, '1'=4``.
* :func:`group_elements`, :func:`compose_table`, :func:`cycles_to_perm` -- small permutation groups
  (``S3 S4 S5 S6``, ``A3 A4 A5 A6``, cyclic ``Z2 .. Z12``).
* :func:`word_problem`, :func:`word_problem_labels` -- the word problem of a group (Merrill et al.):
  a sequence of group elements; at each position, the product of the prefix.
* :func:`mqrar`, :func:`mqrar_targets` -- multi-query repeated associative recall with N-back
  (the PaTH paper, section 4.1).

Permutations are tuples ``p`` of 0-based images: ``p[i]`` is the image of ``i``.  Products
apply the *earlier* element first: the prefix product after ``g_0 .. g_t`` is the map
``i -> g_t[ ... g_1[g_0[i]] ... ]``, i.e. ``labels[t][i] = g_t[labels[t-1][i]]``.
"""
from __future__ import annotations

import itertools
import numbers
import re
from functools import lru_cache

import torch

from .checks import check_int as _int

__all__ = [
    "FLIPFLOP_VOCAB", "W", "R", "I", "ZERO", "ONE", "flipflop", "flipflop_mask", "flipflop_reads",
    "GROUPS", "group_elements", "compose_table", "inverse_indices", "cycles_to_perm", "A5_PAPER_GENERATORS",
    "word_problem", "word_problem_labels",
    "mqrar", "mqrar_targets", "IGNORE",
]

IGNORE = -100
"""The target value that cross-entropy ignores (PyTorch's ``ignore_index``)."""

W, R, I, ZERO, ONE = 0, 1, 2, 3, 4
FLIPFLOP_VOCAB = {"w": W, "r": R, "i": I, "0": ZERO, "1": ONE}
"""Flip-flop token ids: instructions ``w=0, r=1, i=2``, bits ``'0'=3, '1'=4`` (vocabulary size 5)."""


# ---------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------

def _prob(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"`{name}` must be a number in [0, 1], got {type(x).__name__}")
    if not 0.0 <= float(x) <= 1.0:
        raise ValueError(f"`{name}` must be in [0, 1], got {x}")
    return float(x)


def _generator(seed) -> torch.Generator:
    seed = _int(seed, "seed", minimum=0)
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------
# Flip-flop
# ---------------------------------------------------------------------------

def flipflop(n: int, length: int, *, p_ignore: float = 0.8, seed: int = 0):
    """Flip-flop sequences: ``(tokens, mask)``, both ``(n, length)``.

    ``tokens`` (long) are instruction/bit pairs: even positions hold an instruction
    (``w=0``, ``r=1``, ``i=2``), odd positions a bit (``'0'=3``, ``'1'=4``).  The first
    instruction is a write; every later one is ``i`` with probability ``p_ignore`` and
    ``w`` or ``r`` with probability ``(1 - p_ignore) / 2`` each.  The bit after an ``r``
    equals the bit of the most recent ``w``; every other bit is uniform.
    ``mask`` (bool) is true exactly at the bits that follow an ``r``: the positions a
    model is scored on (predicted from the ``r`` one position earlier).

    ``length`` must be even (>= 2); ``p_ignore`` in [0, 1].  The paper's splits:
    ``p_ignore = 0.8`` (train, in-distribution), ``0.98`` (sparse), ``0.1`` (dense).
    """
    n = _int(n, "n")
    length = _int(length, "length", minimum=2)
    if length % 2:
        raise ValueError(f"`length` must be even (instruction/bit pairs), got {length}")
    p_ignore = _prob(p_ignore, "p_ignore")
    g = _generator(seed)
    pairs = length // 2
    probs = torch.tensor([(1 - p_ignore) / 2, (1 - p_ignore) / 2, p_ignore], dtype=torch.float64)
    instr = torch.multinomial(probs.expand(n, 3), pairs, replacement=True, generator=g)  # (n, pairs) in {0,1,2}
    instr[:, 0] = W
    bits = torch.randint(0, 2, (n, pairs), generator=g)
    # The most recent write at or before each pair (pair 0 is a write, so one always exists).
    idx = torch.arange(pairs).expand(n, pairs)
    last_w = torch.where(instr == W, idx, torch.zeros_like(idx)).cummax(dim=1).values
    read = instr == R
    bits = torch.where(read, bits.gather(1, last_w), bits)
    tokens = torch.empty(n, length, dtype=torch.long)
    tokens[:, 0::2] = instr
    tokens[:, 1::2] = bits + ZERO
    return tokens, flipflop_mask(tokens)


def _check_tokens(tokens, name: str = "tokens") -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"`{name}` must be a 2-D long tensor (n, length), got {tuple(tokens.shape)} {tokens.dtype}")
    return tokens


def flipflop_mask(tokens) -> torch.Tensor:
    """The scored positions of flip-flop ``tokens: (n, length)``: bool ``(n, length)``, true at
    each odd position whose preceding instruction is ``r``."""
    tokens = _check_tokens(tokens)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 1::2] = tokens[:, 0::2][:, : tokens.shape[1] // 2] == R
    return mask


def flipflop_reads(tokens) -> torch.Tensor:
    """What a perfect model outputs at the read bits of ``tokens: (n, length)``: long ``(n, length)``,
    the token id of the most recently written bit at every position of :func:`flipflop_mask`,
    :data:`IGNORE` elsewhere (and :data:`IGNORE` at a read with no earlier write)."""
    tokens = _check_tokens(tokens)
    n, L = tokens.shape
    out = torch.full_like(tokens, IGNORE)
    last = torch.full((n,), IGNORE, dtype=torch.long)
    for t in range(0, L - 1, 2):
        ins, bit = tokens[:, t], tokens[:, t + 1]
        out[:, t + 1] = torch.where(ins == R, last, out[:, t + 1])
        last = torch.where(ins == W, bit, last)
    return out


# ---------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------

GROUPS = tuple([f"S{m}" for m in range(2, 7)] + [f"A{m}" for m in range(3, 7)] + [f"Z{m}" for m in range(2, 13)])
"""The groups :func:`group_elements` knows: symmetric ``S2..S6``, alternating ``A3..A6``, cyclic ``Z2..Z12``."""


def _parity(p) -> int:
    """0 for an even permutation, 1 for an odd one (count of inversions mod 2)."""
    return sum(p[a] > p[b] for a in range(len(p)) for b in range(a + 1, len(p))) % 2


def _check_group(group) -> str:
    if not isinstance(group, str) or group not in GROUPS:
        raise ValueError(f"`group` must be one of {', '.join(GROUPS)}; got {group!r}")
    return group


@lru_cache(maxsize=None)
def _elements(group: str) -> tuple:
    kind, m = group[0], int(group[1:])
    if kind == "Z":  # the rotations i -> i + s (mod m), as permutations of m points; s = 0 first
        return tuple(tuple((i + s) % m for i in range(m)) for s in range(m))
    perms = list(itertools.permutations(range(m)))  # lexicographic: the identity first
    if kind == "A":
        perms = [p for p in perms if _parity(p) == 0]
    return tuple(perms)


def group_elements(group: str) -> list[tuple[int, ...]]:
    """The elements of ``group`` as permutations: tuples ``p`` of 0-based images (``p[i]`` = image of ``i``).

    ``"S5"`` (120 elements), ``"A5"`` (60, the even permutations), ``"S3"`` (6), and the rest of
    :data:`GROUPS` (``"Z5"``: the 5 rotations of 5 points).  Index 0 is the identity; ``S``/``A``
    are in lexicographic order, ``Z_m``'s element ``s`` is the rotation ``i -> i + s mod m``.
    """
    return list(_elements(_check_group(group)))


@lru_cache(maxsize=None)
def _table(group: str) -> torch.Tensor:
    els = _elements(group)
    index = {p: a for a, p in enumerate(els)}
    G = len(els)
    table = torch.empty(G, G, dtype=torch.long)
    for a, p in enumerate(els):
        for b, q in enumerate(els):
            table[a, b] = index[tuple(p[q[i]] for i in range(len(q)))]
    return table


def compose_table(group: str) -> torch.Tensor:
    """``(G, G)`` long: ``table[a, b]`` is the index of ``p_a o p_b``, the map ``i -> p_a[p_b[i]]``
    (``p_b`` applied first), ``p = group_elements(group)``.  So the word-problem labels are
    ``labels[t] = table[tokens[t], labels[t-1]]``."""
    return _table(_check_group(group)).clone()


def inverse_indices(group: str) -> torch.Tensor:
    """``(G,)`` long: the index of each element's inverse."""
    t = _table(_check_group(group))
    return (t == 0).long().argmax(dim=0)  # table[a, b] = identity  <=>  a = b^{-1}


def cycles_to_perm(cycles: str, m: int) -> tuple[int, ...]:
    """A permutation of ``m`` points in 1-based cycle notation -> a tuple of 0-based images.

    ``"(1 2 3)"`` means 1 -> 2 -> 3 -> 1, i.e. 0-based ``0 -> 1, 1 -> 2, 2 -> 0``: with ``m = 5``
    the tuple ``(1, 2, 0, 3, 4)``.  Several cycles compose right to left, as in algebra:
    ``"(1 2)(2 3)"`` applies ``(2 3)`` first.  ``"()"`` is the identity.
    """
    m = _int(m, "m")
    if not isinstance(cycles, str) or not re.fullmatch(r"\s*(\(\s*(\d+\s*)*\)\s*)+", cycles):
        raise ValueError(f"`cycles` must look like '(1 2 3)' or '(1 2)(3 4)', got {cycles!r}")
    perm = list(range(m))
    for body in reversed(re.findall(r"\(([^)]*)\)", cycles)):  # the rightmost cycle acts first
        pts = [int(s) - 1 for s in body.split()]
        if any(not 0 <= p < m for p in pts) or len(set(pts)) != len(pts):
            raise ValueError(f"`cycles` {cycles!r}: points must be distinct and in 1..{m}")
        c = list(range(m))
        for a, b in zip(pts, pts[1:] + pts[:1]):
            c[a] = b
        perm = [c[perm[i]] for i in range(m)]
    return tuple(perm)


A5_PAPER_GENERATORS = ("(1 2 3)", "(1 2 4)", "(1 2 5)")
"""The PaTH paper's A5 generators, three 3-cycles in 1-based cycle notation
(0-based tuples: ``(1, 2, 0, 3, 4)``, ``(1, 3, 2, 0, 4)``, ``(1, 4, 2, 3, 0)``)."""


def _generator_indices(group: str, generators) -> torch.Tensor:
    """Indices of the given generators and their inverses (sorted, without repeats)."""
    els = _elements(group)
    m = len(els[0])
    index = {p: a for a, p in enumerate(els)}
    if isinstance(generators, str) or (isinstance(generators, (tuple, list)) and generators
                                       and isinstance(generators[0], numbers.Integral)):
        generators = [generators]  # one generator given on its own
    if not isinstance(generators, (list, tuple)):
        raise ValueError(f"`generators` must be a list of permutations or cycle strings, got {generators!r}")
    gens = list(generators)
    if not gens:
        raise ValueError("`generators` must not be empty")
    idx = set()
    for g in gens:
        p = cycles_to_perm(g, m) if isinstance(g, str) else tuple(int(x) for x in g)
        if p not in index:
            raise ValueError(f"`generators`: {g!r} is not an element of {group} (a tuple of {m} 0-based images, "
                             f"or 1-based cycles like '(1 2 3)')")
        idx.add(index[p])
    inv = inverse_indices(group)
    idx |= {int(inv[a]) for a in idx}
    return torch.tensor(sorted(idx), dtype=torch.long)


def word_problem_labels(group: str, tokens) -> torch.Tensor:
    """The prefix products of ``tokens: (n, length)`` (indices into ``group_elements(group)``):
    long ``(n, length)``, ``labels[:, t]`` = index of ``g_t o ... o g_1 o g_0`` (``g_0`` applied first),
    i.e. ``labels[t][i] = g_t[labels[t-1][i]]`` as permutations."""
    group = _check_group(group)
    tokens = _check_tokens(tokens)
    table = _table(group)
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= table.shape[0]):
        raise ValueError(f"`tokens` must be indices in [0, {table.shape[0]})")
    labels = torch.empty_like(tokens)
    cur = torch.zeros(tokens.shape[0], dtype=torch.long)  # the identity
    for t in range(tokens.shape[1]):
        cur = table[tokens[:, t], cur]
        labels[:, t] = cur
    return labels


def word_problem(group: str, n: int, length: int, *, seed: int = 0, generators=None):
    """The word problem of ``group``: ``(tokens, labels)``, both long ``(n, length)``, indices into
    :func:`group_elements` ``(group)``.

    ``tokens`` are uniform over the whole group (as in Merrill et al.), or, with
    ``generators``, uniform over the given generators and their inverses (duplicates
    removed).  A generator is a tuple of 0-based images or a string of 1-based cycles
    (:func:`cycles_to_perm`); the PaTH paper's A5 example is
    ``generators=A5_PAPER_GENERATORS``, the 3-cycles ``(1 2 3), (1 2 4), (1 2 5)``.
    ``labels[:, t]`` is the prefix product applying ``g_0`` first:
    ``labels[t][i] = g_t[labels[t-1][i]]`` (:func:`word_problem_labels`); the word up
    to ``t`` is the identity exactly where ``labels == 0``.
    """
    group = _check_group(group)
    n = _int(n, "n")
    length = _int(length, "length")
    g = _generator(seed)
    if generators is None:
        tokens = torch.randint(0, len(_elements(group)), (n, length), generator=g)
    else:
        allowed = _generator_indices(group, generators)
        tokens = allowed[torch.randint(0, len(allowed), (n, length), generator=g)]
    return tokens, word_problem_labels(group, tokens)


# ---------------------------------------------------------------------------
# MQRAR-N
# ---------------------------------------------------------------------------

def _check_mqrar_args(n_keys, n_back, vocab):
    n_keys = _int(n_keys, "n_keys")
    n_back = _int(n_back, "n_back")
    vocab = _int(vocab, "vocab", minimum=2)
    if n_keys >= vocab:
        raise ValueError(f"`n_keys` must be < `vocab` (values use ids n_keys..vocab-1), got n_keys={n_keys}, "
                         f"vocab={vocab}")
    return n_keys, n_back, vocab


def mqrar_targets(tokens, *, n_keys: int, n_back: int) -> torch.Tensor:
    """The MQRAR-N targets of a fixed sequence ``tokens: (n, length)`` of key/value pairs
    (keys at even positions, ids ``< n_keys``; values at odd positions).

    Long ``(n, length)``: :data:`IGNORE` (-100) everywhere except at a key position whose key
    has at least ``n_back`` earlier assignments, where it is the value of the ``n_back``-th most
    recent of them.  Example (keys A, B, C, D; ``n_back = 2``): in ``A 1 B 2 C 3 D 4 A 5 B 6 A 7``
    only the third ``A`` (position 12) is scored, with target ``1``.
    """
    tokens = _check_tokens(tokens)
    n_keys = _int(n_keys, "n_keys")
    n_back = _int(n_back, "n_back")
    n, L = tokens.shape
    if L % 2:
        raise ValueError(f"`tokens` must have an even length (key/value pairs), got {L}")
    keys = tokens[:, 0::2]
    if keys.numel() and (keys.min() < 0 or keys.max() >= n_keys):
        raise ValueError(f"`tokens`: keys (even positions) must be in [0, n_keys={n_keys})")
    targets = torch.full_like(tokens, IGNORE)
    pairs = L // 2
    if n_back >= pairs or n == 0:
        return targets
    # Sort each row's pairs by key, stably: a key's assignments become adjacent and stay in time order,
    # so the n_back-th most recent earlier assignment of the pair at sorted place s sits at place s - n_back
    # exactly when the key there is the same.
    sorted_keys, order = keys.sort(dim=1, stable=True)
    sorted_vals = tokens[:, 1::2].gather(1, order)
    sorted_tgt = torch.full_like(sorted_keys, IGNORE)
    same = sorted_keys[:, n_back:] == sorted_keys[:, :-n_back]
    sorted_tgt[:, n_back:] = torch.where(same, sorted_vals[:, :-n_back], sorted_tgt[:, n_back:])
    targets[:, 0::2] = torch.empty_like(sorted_tgt).scatter_(1, order, sorted_tgt)
    return targets


def mqrar(n: int, length: int, *, n_keys: int, n_back: int, vocab: int, seed: int = 0):
    """MQRAR-N (multi-query repeated associative recall, N-back; the PaTH paper, section 4.1):
    ``(tokens, targets)``, both long ``(n, length)``.

    ``tokens`` alternate key/value assignments: keys at even positions, uniform over ids
    ``0 .. n_keys-1``; values at odd positions, uniform over ids ``n_keys .. vocab-1``.
    The same key is re-assigned many times; at each key token whose key has at least
    ``n_back`` earlier assignments, the model must output the value of the ``n_back``-th most
    recent one (:func:`mqrar_targets`); ``targets`` is :data:`IGNORE` (-100) elsewhere.
    ``length`` even; ``n_keys < vocab``; ``n_back >= 1``.
    """
    n = _int(n, "n")
    length = _int(length, "length", minimum=2)
    if length % 2:
        raise ValueError(f"`length` must be even (key/value pairs), got {length}")
    n_keys, n_back, vocab = _check_mqrar_args(n_keys, n_back, vocab)
    g = _generator(seed)
    pairs = length // 2
    tokens = torch.empty(n, length, dtype=torch.long)
    tokens[:, 0::2] = torch.randint(0, n_keys, (n, pairs), generator=g)
    tokens[:, 1::2] = torch.randint(n_keys, vocab, (n, pairs), generator=g)
    return tokens, mqrar_targets(tokens, n_keys=n_keys, n_back=n_back)
