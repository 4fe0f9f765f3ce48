r"""The two constructions of the PaTH paper's Appendix A, as programs you can run.

Both are hand-built PaTH transformers: the token vectors, queries, keys, values,
Householder vectors ``w`` and strengths ``beta`` are written down, not learned,
and the attention itself is computed by the library's PaTH forms
(:func:`pathedu.path.path_matrix` by default; pass ``form=`` to use another,
e.g. :func:`pathedu.path.path_naive`).  The PaTH logit is (0-based positions)::

    logit_ij = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i,   H_s = I - beta_s w_s w_s^T,

the empty product (``j = i``) being the identity.

1. **Swaps of five elements** (Theorem 2.1 of the paper, after Peng et al.'s
   Lemma 2): one layer, two heads, decides after every token whether the swaps
   read so far compose to the identity permutation, an NC^1-complete problem.
   :func:`swap_model_inputs`, :func:`swap_forward`, :func:`swap_is_identity`,
   and the ground truth :func:`swap_reference`.
2. **Flip-flop language modelling** (Theorem A.1, the task of Liu et al.): two
   layers, one head each, predict the next token; after every ``r`` the model
   must output the most recently written bit.  :func:`flipflop_forward`,
   :func:`flipflop_predict`, and the ground truth :func:`flipflop_reference`.

Where the paper's printed maths is garbled, the reconstruction used here is
stated in the function's docstring (and checked for every input up to a given
length in ``tests/test_constructions.py``):

* Swaps: the logit of the last token on the start token is exactly
  ``scale * (sum_c c * list[c] - 54.5)``, which equals ``0.5 * scale`` for the
  identity (the paper says "> 0.5 n"; it is equal) and ``<= -0.5 * scale``
  otherwise.  The paper's ``n`` in the query is a sharpness that the two-head
  comparison does not need; here it is the ``scale`` argument.
* Flip-flop, layer 2: the printed value map ``h_8 e_13 + h_9 e_14``, the
  transition strength ``beta = 1{h_8 + h_9 > 0}`` and the second FFN
  ``1(h_2 = 1, h_6 = 1)`` (twice) do not do what the text says.  What the text
  says, and what is built here: the value of a *written* bit is its bit
  (``h_10 e_13 + h_11 e_14``), ``beta = 1`` throughout (the ``e_2`` direction
  of ``w`` is the "do nothing" direction: it is orthogonal to every key and
  query), and the second FFN fires ``1{h_2 = 1, h_13 = 1}`` and
  ``1{h_2 = 1, h_14 = 1}`` (an ``r`` token whose state is 0, resp. 1).
* Flip-flop: the paper makes the softmax one-hot through a query of norm ``n``
  and O(log n) precision.  Here the sharpness is the explicit ``scale``
  argument (default 100): every logit is ``scale`` or 0, so the weight left on
  unselected tokens is at most ``T * exp(-scale)`` (below 1e-40 for T <= 1e3),
  far under float64 resolution.

Neither construction can tell the right product order from the reversed one:
a reversed product of swaps is the inverse permutation (the identity exactly
when the original is, with the same logit), and the flip-flop transitions are
diagonal, so they commute.  The order is tested with random vectors in
``tests/test_path.py``.

Conventions: token sequences are integer tensors ``(..., T)``; every leading
dim is an independent sequence (vectorised); outputs keep those leading dims.
Positions are 0-based.
"""
from __future__ import annotations

import itertools
import math

import torch

from . import path as _path

__all__ = [
    "SWAP_PAIRS", "SWAP_START", "swap_token", "swap_tokens_from_pairs", "swap_model_inputs",
    "swap_forward", "swap_is_identity", "swap_reference", "swap_start_logit",
    "FF_VOCAB", "flipflop_encode", "flipflop_decode", "flipflop_embed", "flipflop_layer_inputs",
    "flipflop_forward", "flipflop_predict", "flipflop_reference", "flipflop_state",
    "FF_SLOTS", "all_flipflop_sequences", "path_attention_weights",
]


def _check_tokens(tokens, name: str = "tokens") -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"`{name}` must be an integer torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        raise TypeError(f"`{name}` must have an integer dtype, got {tokens.dtype}")
    if tokens.dim() < 1 or tokens.shape[-1] == 0:
        raise ValueError(f"`{name}` must have shape (..., T) with T >= 1, got {tuple(tokens.shape)}")
    return tokens.long()


# ---------------------------------------------------------------------------
# 1. Swaps of five elements: one layer, two heads
# ---------------------------------------------------------------------------

#: The 20 swap tokens ``[x <-> y]`` (x != y, elements 1..5), in token-id order:
#: token id ``1 + SWAP_PAIRS.index((x, y))``.  Token id 0 is the start token ``#``.
SWAP_PAIRS = tuple((x, y) for x in range(1, 6) for y in range(1, 6) if x != y)
SWAP_START = 0
_SWAP_D = 6  # head dim: one coordinate per element, plus the offset coordinate e_6
_SWAP_OFFSET = 54.5  # between sum_i i^2 = 55 (identity) and its next value, 54


def swap_token(x: int, y: int) -> int:
    """Token id of the swap ``[x <-> y]`` (elements 1..5, ``x != y``)."""
    if (x, y) not in SWAP_PAIRS:
        raise ValueError(f"a swap needs two different elements in 1..5, got `x`={x}, `y`={y}")
    return 1 + SWAP_PAIRS.index((x, y))


def swap_tokens_from_pairs(pairs) -> torch.Tensor:
    """``[(x1, y1), (x2, y2), ...]`` -> the sequence ``# [x1<->y1] [x2<->y2] ...`` as a ``(T,)`` tensor."""
    return torch.tensor([SWAP_START] + [swap_token(x, y) for x, y in pairs], dtype=torch.long)


def _check_swap_tokens(tokens) -> torch.Tensor:
    tokens = _check_tokens(tokens)
    if not (tokens[..., 0] == SWAP_START).all():
        raise ValueError("`tokens` must start with the start token # (id 0) in every sequence")
    if ((tokens[..., 1:] < 1) | (tokens[..., 1:] > len(SWAP_PAIRS))).any():
        raise ValueError(f"`tokens` after the first position must be swap ids 1..{len(SWAP_PAIRS)}")
    return tokens


def swap_model_inputs(tokens, *, dtype=torch.float64):
    r"""The two heads' ``q, k, v, w, beta`` for swap sequences, exactly as in the paper.

    ``tokens: (..., T)``, ``tokens[..., 0] = 0`` (the start token ``#``), then swap ids.
    Returns ``q, k, v, w: (..., 2, T, 6)`` and ``beta: (..., 2, T)`` (head 0 is
    the paper's first head, head 1 the second).  Coordinates ``0..4`` stand for
    the elements 1..5 (``e_1..e_5`` in the paper), coordinate 5 for ``e_6``.

    Head 0 (the state tracker), for every token ``u``:

    * ``k[u] = 1{u = #} (e_1 + 2 e_2 + 3 e_3 + 4 e_4 + 5 e_5 - e_6)``,
    * ``q[u] = e_1 + 2 e_2 + 3 e_3 + 4 e_4 + 5 e_5 + 54.5 e_6`` (the paper
      multiplies it by ``n``: pass that factor as ``scale``),
    * ``w[x <-> y] = (e_x - e_y) / sqrt(2)``, ``w[#] = 0``, ``beta = 2``: so
      ``H = I - 2 w w^T`` is the permutation matrix swapping ``e_x`` and ``e_y``,
    * ``v[u] = 1{u = #} e_1``.

    Head 1 (the reference): ``q = k = w = 0`` (uniform attention), the same ``v``.
    """
    tokens = _check_swap_tokens(tokens)
    lead, T = tokens.shape[:-1], tokens.shape[-1]
    is_start = (tokens == SWAP_START).to(dtype)  # (..., T)
    ramp = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 0.0], dtype=dtype)
    e6 = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0], dtype=dtype)
    e1 = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=dtype)

    k0 = is_start[..., None] * (ramp - e6)
    q0 = (ramp + _SWAP_OFFSET * e6).expand(*lead, T, _SWAP_D)
    v0 = is_start[..., None] * e1
    # w[x <-> y] = (e_x - e_y)/sqrt(2): a lookup table indexed by token id (row 0: the start token, w = 0)
    table = torch.zeros(1 + len(SWAP_PAIRS), _SWAP_D, dtype=dtype)
    for n, (x, y) in enumerate(SWAP_PAIRS):
        table[1 + n, x - 1] = 2 ** -0.5
        table[1 + n, y - 1] = -(2 ** -0.5)
    w0 = table[tokens]
    beta0 = torch.full((*lead, T), 2.0, dtype=dtype)

    zeros = torch.zeros(*lead, T, _SWAP_D, dtype=dtype)
    q = torch.stack([q0, zeros], dim=-3)
    k = torch.stack([k0, zeros], dim=-3)
    v = torch.stack([v0, v0], dim=-3)
    w = torch.stack([w0, zeros], dim=-3)
    beta = torch.stack([beta0, beta0], dim=-2)
    return q, k, v, w, beta


def swap_forward(tokens, *, scale: float = 1.0, form=None, dtype=torch.float64) -> torch.Tensor:
    r"""Run the one-layer, two-head swap transformer; return its decision margin ``(..., T)``.

    Both heads go through one call of ``form(q, k, v, w, beta, scale=scale)``
    (default :func:`pathedu.path.path_matrix`) with the heads as a leading dim.
    The head outputs are concatenated into a 12-vector and the output
    projection takes coordinate 0 minus coordinate 6::

        margin_i = exp(s_i) / (exp(s_i) + i)  -  1 / (i + 1),
        s_i = scale * (sum_c c * list_i[c] - 54.5)

    where ``list_i`` is ``[1, 2, 3, 4, 5]`` after the swaps at positions
    ``1..i``.  ``margin > 0`` iff those swaps compose to the identity (for
    ``i >= 1``; at ``i = 0``, no swap yet, both heads give 1 and the margin is
    exactly 0).  The paper's FFN maps the margin to ``sign(margin)``.
    ``scale`` must be positive; any positive value decides correctly.
    """
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < math.inf):
        raise ValueError(f"`scale` must be a positive finite number, got {scale!r}")
    form = _path.path_matrix if form is None else form
    q, k, v, w, beta = swap_model_inputs(tokens, dtype=dtype)
    out = form(q, k, v, w, beta, scale=float(scale))  # (..., 2, T, 6)
    heads = torch.cat([out[..., 0, :, :], out[..., 1, :, :]], dim=-1)  # (..., T, 12): concatenated heads
    w_o = torch.zeros(2 * _SWAP_D, dtype=dtype)
    w_o[0], w_o[_SWAP_D] = 1.0, -1.0
    return heads @ w_o


def swap_is_identity(tokens, *, scale: float = 1.0, form=None) -> torch.Tensor:
    """Boolean ``(..., T)``: the model's decision, after each token, that the swaps so far are the identity.

    The paper's final FFN is ``sign(margin)``; the start token alone (no swap,
    margin exactly 0) counts as the identity, so the decision is ``margin >= 0``.
    """
    return swap_forward(tokens, scale=scale, form=form) >= 0


def swap_reference(tokens) -> torch.Tensor:
    """Ground truth, by moving list entries: ``(..., T)`` booleans, True where the
    swaps at positions ``1..i`` compose to the identity permutation."""
    tokens = _check_swap_tokens(tokens)
    pairs = torch.tensor([(0, 0)] + [(x - 1, y - 1) for x, y in SWAP_PAIRS], dtype=torch.long)
    lists = torch.arange(5).expand(*tokens.shape[:-1], 5).clone()
    out = torch.empty(tokens.shape, dtype=torch.bool)
    out[..., 0] = True
    for t in range(1, tokens.shape[-1]):
        a, b = pairs[tokens[..., t]].unbind(-1)  # positions to exchange, (...,)
        la, lb = lists.gather(-1, a[..., None]), lists.gather(-1, b[..., None])
        lists.scatter_(-1, a[..., None], lb)
        lists.scatter_(-1, b[..., None], la)
        out[..., t] = (lists == torch.arange(5)).all(-1)
    return out


def swap_start_logit(tokens) -> torch.Tensor:
    """The paper's closed form of head 0's logit on the start token, at ``scale = 1``:
    ``sum_c c * list_i[c] - 54.5`` with ``list_i`` the list after the swaps at ``1..i``
    (elements and positions numbered 1..5).  ``(..., T)``, float64."""
    tokens = _check_swap_tokens(tokens)
    pairs = torch.tensor([(0, 0)] + [(x - 1, y - 1) for x, y in SWAP_PAIRS], dtype=torch.long)
    lists = torch.arange(1, 6, dtype=torch.float64).expand(*tokens.shape[:-1], 5).clone()
    pos = torch.arange(1, 6, dtype=torch.float64)
    out = torch.empty(tokens.shape, dtype=torch.float64)
    out[..., 0] = (lists * pos).sum(-1) - _SWAP_OFFSET
    for t in range(1, tokens.shape[-1]):
        a, b = pairs[tokens[..., t]].unbind(-1)
        la, lb = lists.gather(-1, a[..., None]), lists.gather(-1, b[..., None])
        lists.scatter_(-1, a[..., None], lb)
        lists.scatter_(-1, b[..., None], la)
        out[..., t] = (lists * pos).sum(-1) - _SWAP_OFFSET
    return out


# ---------------------------------------------------------------------------
# 2. Flip-flop language modelling: two layers, one head each
# ---------------------------------------------------------------------------

#: Vocabulary, in token-id order: write, read, ignore, bit 0, bit 1.
FF_VOCAB = ("w", "r", "i", "0", "1")

#: The residual stream's slots (0-based index -> the paper's 1-based dimension = index + 1).
FF_SLOTS = {
    "is_w": 0, "is_r": 1, "is_i": 2, "is_0": 3, "is_1": 4, "const": 5,  # embedding (paper dims 1-6)
    "prev_w": 6, "prev_r": 7, "prev_i": 8,  # layer 1 output: the instruction before a bit (7-9)
    "wrote_0": 9, "wrote_1": 10, "not_write": 11,  # FFN 1: a bit that was written (10-12)
    "state_0": 12, "state_1": 13,  # layer 2 output: the last written bit (13-14)
    "read_0": 14, "read_1": 15,  # FFN 2: an r whose answer is 0 / 1 (15-16)
}
_FF_WIDTH = 16
_S = FF_SLOTS


def flipflop_encode(text) -> torch.Tensor:
    """``"w 1 r 1 i 0"`` (or a list of symbols) -> token ids ``(T,)`` over :data:`FF_VOCAB`."""
    symbols = text.split() if isinstance(text, str) else list(text)
    unknown = [s for s in symbols if s not in FF_VOCAB]
    if unknown:
        raise ValueError(f"`text` has symbols outside {FF_VOCAB}: {unknown[:3]}")
    return torch.tensor([FF_VOCAB.index(s) for s in symbols], dtype=torch.long)


def flipflop_decode(tokens) -> str:
    """Token ids ``(T,)`` -> ``"w 1 r 1 ..."``."""
    return " ".join(FF_VOCAB[int(t)] for t in tokens)


def _check_flipflop_tokens(tokens) -> torch.Tensor:
    tokens = _check_tokens(tokens)
    if ((tokens < 0) | (tokens >= len(FF_VOCAB))).any():
        raise ValueError(f"`tokens` must be ids 0..{len(FF_VOCAB) - 1} of {FF_VOCAB}")
    T = tokens.shape[-1]
    even = torch.arange(T) % 2 == 0
    if not ((tokens[..., even] <= 2).all() and (tokens[..., ~even] >= 3).all()):
        raise ValueError("`tokens` must alternate instruction (w/r/i) and bit (0/1), starting with an instruction")
    if not (tokens[..., 0] == 0).all():
        raise ValueError("`tokens` must start with the write instruction `w` in every sequence")
    return tokens


def flipflop_embed(tokens, *, dtype=torch.float64) -> torch.Tensor:
    """The paper's embedding: ``emb(u) = e_u + e_6`` (slot ``is_<u>`` plus ``const``), in a
    16-wide residual stream; ``(..., T) -> (..., T, 16)``."""
    tokens = _check_flipflop_tokens(tokens)
    h = torch.zeros(*tokens.shape, _FF_WIDTH, dtype=dtype)
    h.scatter_(-1, tokens[..., None], 1.0)
    h[..., _S["const"]] = 1.0
    return h


def flipflop_layer_inputs(h: torch.Tensor, layer: int):
    r"""The PaTH head's ``q, k, v, w, beta`` read off the residual stream ``h: (..., T, 16)``.

    Returns ``q, k, w: (..., T, 2)``, ``v: (..., T, 16)`` (written straight into
    the residual stream), ``beta: (..., T)``.  ``e_1, e_2`` below are the head's
    two coordinates.

    Layer 1 (the paper's, with its query norm ``n`` moved into ``scale``)::

        q = h_const e_1,  k = (h_w + h_r + h_i) e_1,  w = (h_w + h_r + h_i) e_1 + (h_0 + h_1) e_2,
        v = h_w e_prev_w + h_r e_prev_r + h_i e_prev_i,  beta = 1,

    so ``H = I - e_1 e_1^T`` after an instruction and ``I - e_2 e_2^T`` after a
    bit: a bit's query finds the instruction just before it (the e_1 coordinate
    survives one bit, never an instruction).

    Layer 2 (reconstructed; see the module docstring)::

        q = h_const e_1,  k = (h_wrote_0 + h_wrote_1) e_1,
        w = (h_wrote_0 + h_wrote_1) e_1 + h_not_write e_2,
        v = h_wrote_0 e_state_0 + h_wrote_1 e_state_1,  beta = 1,

    so every query finds the most recent written bit (a later write erases e_1).
    """
    if layer not in (1, 2):
        raise ValueError(f"`layer` must be 1 or 2, got {layer!r}")
    lead, T = h.shape[:-2], h.shape[-2]
    q = torch.zeros(*lead, T, 2, dtype=h.dtype)
    k, w = torch.zeros_like(q), torch.zeros_like(q)
    v = torch.zeros(*lead, T, _FF_WIDTH, dtype=h.dtype)
    q[..., 0] = h[..., _S["const"]]
    if layer == 1:
        instr = h[..., _S["is_w"]] + h[..., _S["is_r"]] + h[..., _S["is_i"]]
        k[..., 0] = instr
        w[..., 0] = instr
        w[..., 1] = h[..., _S["is_0"]] + h[..., _S["is_1"]]
        for src, dst in (("is_w", "prev_w"), ("is_r", "prev_r"), ("is_i", "prev_i")):
            v[..., _S[dst]] = h[..., _S[src]]
    else:
        wrote = h[..., _S["wrote_0"]] + h[..., _S["wrote_1"]]
        k[..., 0] = wrote
        w[..., 0] = wrote
        w[..., 1] = h[..., _S["not_write"]]
        v[..., _S["state_0"]] = h[..., _S["wrote_0"]]
        v[..., _S["state_1"]] = h[..., _S["wrote_1"]]
    beta = torch.ones(*lead, T, dtype=h.dtype)
    return q, k, v, w, beta


def _relu(x):
    return torch.clamp_min(x, 0.0)


def _ffn1(h):
    """One hidden ReLU layer: a 0 (resp. 1) whose previous instruction was w, and "neither"."""
    out = torch.zeros_like(h)
    wrote0 = _relu(h[..., _S["is_0"]] + h[..., _S["prev_w"]] - 1.0)
    wrote1 = _relu(h[..., _S["is_1"]] + h[..., _S["prev_w"]] - 1.0)
    out[..., _S["wrote_0"]] = wrote0
    out[..., _S["wrote_1"]] = wrote1
    out[..., _S["not_write"]] = _relu(h[..., _S["const"]]) - wrote0 - wrote1
    return out


def _ffn2(h):
    """One hidden ReLU layer: an r token whose state is 0 (resp. 1)."""
    out = torch.zeros_like(h)
    out[..., _S["read_0"]] = _relu(h[..., _S["is_r"]] + h[..., _S["state_0"]] - 1.0)
    out[..., _S["read_1"]] = _relu(h[..., _S["is_r"]] + h[..., _S["state_1"]] - 1.0)
    return out


def _lm_head(h, sharp):
    """Next-token logits over :data:`FF_VOCAB` (the paper's W_LM, with T = n = ``sharp``)."""
    logits = torch.zeros(*h.shape[:-1], len(FF_VOCAB), dtype=h.dtype)
    after_instr = h[..., _S["is_w"]] + h[..., _S["is_i"]]  # next is a bit, either one
    after_bit = h[..., _S["is_0"]] + h[..., _S["is_1"]]  # next is an instruction, any of three
    logits[..., 3] += sharp * after_instr + sharp * h[..., _S["read_0"]]
    logits[..., 4] += sharp * after_instr + sharp * h[..., _S["read_1"]]
    logits[..., 0:3] += sharp * after_bit[..., None]
    return logits


def path_attention_weights(q, k, w, beta, *, scale=None, form=None) -> torch.Tensor:
    """The PaTH attention matrix ``(..., T, T)`` (row i: the softmax over keys j <= i).

    Computed by the library's form itself: with the values ``v = I`` (token j's
    value is the one-hot vector e_j), output row i *is* attention row i.
    """
    form = _path.path_matrix if form is None else form
    T = q.shape[-2]
    eye = torch.eye(T, dtype=q.dtype, device=q.device).expand(*q.shape[:-2], T, T)
    return form(q, k, eye, w, beta, scale=scale)


def flipflop_forward(tokens, *, scale: float = 100.0, form=None, dtype=torch.float64, return_trace: bool = False):
    r"""Run the two-layer flip-flop transformer; return next-token logits ``(..., T, 5)``.

    ``tokens: (..., T)`` alternate an instruction (``w``/``r``/``i``) and a bit
    (``0``/``1``), starting with ``w`` (as FFLM sequences do).  Each layer is
    ``h <- h + PaTH(h)`` then ``h <- h + FFN(h)``, the PaTH head computed by
    ``form(q, k, v, w, beta, scale=scale)`` (default :func:`pathedu.path.path_matrix`).

    ``scale`` is the softmax sharpness (the paper's query norm ``n``): every
    logit is ``scale`` or 0, so the softmax is one-hot up to ``T exp(-scale)``.
    The LM head uses the same constant.  With ``return_trace=True`` also return a
    dict: ``"stream"`` (the residual stream ``(..., T, 16)`` after the last
    layer; slots in :data:`FF_SLOTS`) and ``"attention"`` (a list of the two
    layers' ``(..., T, T)`` attention matrices).
    """
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < math.inf):
        raise ValueError(f"`scale` must be a positive finite number, got {scale!r}")
    form = _path.path_matrix if form is None else form
    h = flipflop_embed(tokens, dtype=dtype)
    attention = []
    for layer, ffn in ((1, _ffn1), (2, _ffn2)):
        q, k, v, w, beta = flipflop_layer_inputs(h, layer)
        if return_trace:
            attention.append(path_attention_weights(q, k, w, beta, scale=float(scale), form=form))
        h = h + form(q, k, v, w, beta, scale=float(scale))
        h = h + ffn(h)
    logits = _lm_head(h, float(scale))
    return (logits, {"stream": h, "attention": attention}) if return_trace else logits


def flipflop_predict(tokens, *, scale: float = 100.0, form=None) -> torch.Tensor:
    """The model's most likely next token after each position, ``(..., T)`` ids.

    Only the positions holding ``r`` have a single right answer (the last written
    bit); elsewhere the next token is random and the model spreads its probability
    evenly over the allowed tokens (the argmax then picks the first of them).
    """
    return flipflop_forward(tokens, scale=scale, form=form).argmax(-1)


def flipflop_state(tokens) -> torch.Tensor:
    """Ground truth: the most recently written bit at each position, ``(..., T)`` (-1 before the first write)."""
    tokens = _check_flipflop_tokens(tokens)
    state = torch.full(tokens.shape[:-1], -1, dtype=torch.long)
    out = torch.empty(tokens.shape, dtype=torch.long)
    for t in range(tokens.shape[-1]):
        if t >= 1 and t % 2 == 1:
            written = tokens[..., t - 1] == 0
            state = torch.where(written, tokens[..., t] - 3, state)
        out[..., t] = state
    return out


def flipflop_reference(tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Ground truth for the deterministic predictions: ``(is_read, answer)``, both ``(..., T)``.

    ``is_read`` marks the positions holding ``r``; ``answer`` is the token id
    (3 for ``0``, 4 for ``1``) of the most recently written bit there (-1 elsewhere).
    """
    tokens = _check_flipflop_tokens(tokens)
    is_read = tokens == 1
    answer = torch.where(is_read, flipflop_state(tokens) + 3, torch.full_like(tokens, -1))
    return is_read, answer


def all_flipflop_sequences(T: int) -> torch.Tensor:
    """Every FFLM-shaped sequence of length ``T`` (``w`` first, then alternating), ``(N, T)``.

    ``w`` is fixed at position 0; each odd position holds one of 2 bits and each
    later even position one of 3 instructions: ``N = 2**(T // 2) * 3**((T - 1) // 2)``.
    """
    if T < 1:
        raise ValueError(f"`T` must be >= 1, got {T}")
    choices = [[0]] + [[0, 1, 2] if t % 2 == 0 else [3, 4] for t in range(1, T)]
    return torch.tensor(list(itertools.product(*choices)), dtype=torch.long)
