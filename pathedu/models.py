r"""A small decoder-only model whose token mixer is any of the book's mechanisms.

::

    tokens (B, T) -> embedding (B, T, d)                       (no absolute position embedding)
                  -> n_layers x [ x + Mixer(LN(x));  x + MLP(LN(x)) ]   (pre-norm blocks)
                  -> LN -> LM head -> logits (B, T, out_vocab)

The mixer is chosen by name from a registry of layer classes (:data:`pathedu.layers.LAYERS`; :data:`MIXERS`
lists the names): each block's mixer is an instance of that class, whose docstring says what it computes and
which paper it follows.

============== =========== ================================================= ==========================
name           side        per-token quantities (from the token, per head)    function (PyTorch / Triton)
============== =========== ================================================= ==========================
nope           softmax     --                                                 ``nope_matrix`` / ``nope_triton``
alibi          softmax     fixed slopes :func:`pathedu.alibi.alibi_slopes`     ``alibi_matrix`` / ``alibi_triton``
fox            softmax     ``log_f = log sigma(W_f x + b_f)``                  ``fox_matrix`` / ``fox_triton``
rope           softmax     fixed rotation, base 10000                         ``rope_matrix`` / ``rope_triton``
path           softmax     ``w = normalize(W_w x)``, ``beta = 2 sigma(W_b x + b_b)``  ``path_matrix`` / ``path_triton``
pathfox        softmax     PaTH's ``w, beta`` and FoX's ``log_f``              ``pathfox_matrix`` / ``pathfox_triton``
stickbreaking  softmax     -- (no softmax: sigmoids of the logits)            ``stickbreaking_matrix`` / ``_triton``
cope           softmax     a table of ``npos_max`` position embeddings         ``cope_matrix`` / ``cope_triton``
linear         linear      --                                                 ``linear_matrix`` / ``linear_triton``
retnet         linear      fixed decays :func:`pathedu.alibi.retnet_gammas`    ``retnet_matrix`` / ``retnet_triton``
gla            linear      per-channel ``log_f = log sigma(W2 W1 x + b) / 16``  ``gla_chunked`` / ``gla_triton``
deltanet       linear      ``beta = beta_max sigma(W_b x + b_b)``, ``w = k``   ``deltanet_matrix`` / ``deltanet_chunked``
gated_deltanet linear      DeltaNet's ``beta`` and ``log_f``                   ``gated_deltanet_matrix`` / ``_chunked``
============== =========== ================================================= ==========================

Choices, following the papers:

* Forget gates (``fox``, ``pathfox``, ``gated_deltanet``) are ``log sigma(W_f x + b_f)``, one per
  head, with ``b_f`` initialised to ``linspace(2, 6)`` over the heads, so that at initialisation
  the gates are 0.88 .. 0.9975 (near 1: long memory first, forgetting learnt).  GLA's gate is
  per key channel, low rank (16) with temperature 16 as in the GLA paper.
* PaTH's ``w`` is an L2-normalised projection of the token (unit vectors: ``H`` is a reflection
  at ``beta = 2``) and ``beta = beta_max sigma(.)`` with ``beta_max = 2`` by default (PaTH) and 1
  for DeltaNet / Gated DeltaNet (pass ``beta_max=2.0`` for DeltaNet with ``beta`` in (0, 2), the
  negative-eigenvalue variant).  The PaTH paper also passes ``w``'s projection through a short
  convolution; ``w_conv=K`` (path, pathfox) adds one: causal, depthwise, filter size ``K``, no
  activation, PyTorch's default initialisation (our choices), before the normalisation.  The default
  ``w_conv=0`` leaves it out.  The paper's projection of ``w`` is low rank (32); ``w_rank=r`` makes it
  ``d -> r -> HD`` (default: one full-rank projection).
* ``short_conv=K`` (any mixer; 0, the default, leaves it out): a causal depthwise convolution of filter size
  ``K`` followed by SiLU on each of the ``q``, ``k``, ``v`` projections, as the DeltaNet, Gated DeltaNet and GLA
  implementations do by default (flash-linear-attention's ``ShortConvolution``, size 4).  It lets a token see the
  few before it without any attention: on recall tasks, a value can carry its key.  The linear side normalises
  ``q`` and ``k`` after it.
* The linear side L2-normalises ``q`` and ``k`` per head (DeltaNet needs unit keys for
  ``I - beta k k^T`` to be a contraction; the others get the same for a fair comparison) and puts a
  per-head RMSNorm on the mixer output (as in GLA / DeltaNet implementations), since
  unnormalised linear attention grows with T.  The softmax side uses ``scale = D^-1/2``.
* Stick-breaking (Tan et al.) has no parameter beyond ``q, k, v, o`` and no position encoding; its leftover
  stick goes nowhere (chapter 10).  CoPE (Golovneva et al.) adds one table ``pos_emb: (npos_max, head_dim)``
  per layer, shared by the heads, zeros at the start as in the paper's code; ``npos_max=64`` by default.

The form (:func:`select_form`): ``"auto"`` takes the Triton kernel when the mechanism has a Triton
backward (every mixer's: :func:`pathedu.layers.triton_trains`) and
the input is on a CUDA GPU; otherwise the PyTorch
``*_matrix`` form (``*_chunked`` for the linear side when ``T > matrix_max_T``, and always for GLA's
per-channel gate).  ``path_matrix`` and ``pathfox_matrix`` cost O(T^3) for the triangular solve and
O(T^2) memory: fine at T <= 512.  PyTorch forms run in float32 with autocast switched off; Triton
forms take bf16 ``q, k, v`` under autocast (gates, ``w`` and ``beta`` in fp32).

Parameter count (:func:`parameter_count`, equal to ``sum(p.numel())``), with ``d = d_model``,
``HD = n_heads * head_dim``, ``h = mlp_ratio * d``::

    vocab*d + d*out_vocab + 2d                                        (embedding, LM head, final LN)
    + n_layers * (4d + (2 d h + h + d) + 4 d HD + extra)             (2 LNs, MLP, q k v o)
    extra: fox 'd*H + H'; path 'd*HD + d*H + H' (+ 'HD*K' with w_conv=K; 'r (d + HD)' in place of 'd*HD' with
           w_rank=r); pathfox both; deltanet 'd*H + H';
           gated_deltanet '2 (d*H + H)'; gla '16 d + 16 HD + HD'; linear-side output norm '+ head_dim';
           cope 'npos_max * head_dim'; short_conv=K '3 HD K'.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn

from .checks import check_int
from .layers import FUNCS as _FUNCS
from .layers import GLA_RANK, LAYERS, LINEAR_SIDE, TokenMixer, choose_form, triton_trains
from .layers import causal_depthwise as _causal_depthwise  # noqa: F401  (kept for readers of the old name)
from .layers import convolve as _convolve  # noqa: F401

__all__ = ["MIXERS", "SOFTMAX_MIXERS", "LINEAR_MIXERS", "FORMS", "Mixer", "make_mixer", "Block", "LM",
           "build_model", "parameter_count", "select_form", "forced_form"]

MIXERS = tuple(LAYERS)  # the registry: name -> layer class (pathedu.layers.LAYERS)
LINEAR_MIXERS = tuple(m for m in MIXERS if m in LINEAR_SIDE)
SOFTMAX_MIXERS = tuple(m for m in MIXERS if m not in LINEAR_SIDE)
FORMS = ("auto", "matrix", "chunked", "triton")
Mixer = TokenMixer  # every mixer is a pathedu.layers.TokenMixer
NPOS_MAX = 64


def _check_mixer(mixer) -> str:
    if mixer not in MIXERS:
        raise ValueError(f"`mixer` must be one of {', '.join(MIXERS)}; got {mixer!r}")
    return mixer


def select_form(mixer: str, form: str = "auto", *, device=None, T: int = 0, matrix_max_T: int = 1024) -> str:
    """The form a mixer runs in a model: ``"triton"``, ``"matrix"`` or ``"chunked"`` (blockwise on the softmax side).

    ``"auto"``: Triton when ``mixer``'s Triton form has a backward pass (:func:`pathedu.layers.triton_trains`:
    every mixer's), Triton compiles for a GPU
    (:func:`pathedu.triton_mode`) and ``device`` is CUDA, in training and evaluation alike; else ``"matrix"``,
    or ``"chunked"`` for the linear side when ``T > matrix_max_T`` and for ``gla`` (its matrix form holds a
    T x T x D tensor): :func:`pathedu.layers.choose_form`.  An explicit form the mixer lacks in a model (a
    Triton form without a backward pass) raises ``ValueError``.
    """
    mixer = _check_mixer(mixer)
    if form not in FORMS:
        raise ValueError(f"`form` must be one of {', '.join(FORMS)}; got {form!r}")
    if form == "triton" and not triton_trains(mixer):
        available = ", ".join(f for f in _FUNCS[mixer] if f in FORMS and f != "triton")
        raise ValueError(f"`form` {form!r} is not available for mixer {mixer!r} in a model (its Triton kernels "
                         f"have no backward pass); available: {available}")
    return choose_form(mixer, form, device=device, T=T, matrix_max_T=matrix_max_T, needs_grad=True,
                       triton_without_grad=False)


def make_mixer(mixer: str, d_model: int, n_heads: int, head_dim: int, *, beta_max: float | None = None,
               form: str = "auto", matrix_max_T: int = 1024, rope_base: float = 10000.0, w_conv: int = 0,
               short_conv: int = 0, npos_max: int = NPOS_MAX, w_rank: int | None = None) -> TokenMixer:
    """The layer of :data:`pathedu.layers.LAYERS` named ``mixer``, with the model's settings: each argument goes
    to the layers that have it (``beta_max`` to those with a beta, ``w_conv`` and ``w_rank`` to PaTH's,
    ``rope_base`` to RoPE's, ``npos_max`` to CoPE's); ``w`` from one full-rank projection with no short
    convolution unless ``w_rank`` and ``w_conv`` say otherwise; the same form in training and evaluation.  Shapes: ``(B, T, d_model) -> (B, T, d_model)``."""
    cls = LAYERS[_check_mixer(mixer)]
    select_form(mixer, form)  # validates form
    kwargs = dict(form=form, matrix_max_T=matrix_max_T, short_conv=short_conv, triton_without_grad=False)
    if cls.has_beta:
        kwargs["beta_max"] = beta_max
    if cls.has_w:
        kwargs["w_conv"], kwargs["w_rank"] = w_conv, w_rank
    if mixer == "rope":
        kwargs["rope_base"] = rope_base
    if mixer == "cope":
        kwargs["npos_max"] = npos_max
    return cls(d_model, n_heads, head_dim, **kwargs)


class Block(nn.Module):
    """Pre-norm block: ``x + Mixer(LN(x))``, then ``x + MLP(LN(x))`` (MLP: Linear, GELU, Linear)."""

    def __init__(self, mixer: str, d_model: int, n_heads: int, head_dim: int, mlp_ratio: int, **mixer_kwargs):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.mixer = make_mixer(mixer, d_model, n_heads, head_dim, **mixer_kwargs)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(),
                                 nn.Linear(mlp_ratio * d_model, d_model))

    def forward(self, x):
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    """The decoder-only model: ``forward(tokens: (B, T) long in [0, vocab)) -> logits (B, T, out_vocab)``.

    Causal: the logits at position ``t`` depend on ``tokens[:, :t+1]`` only.  Build it with
    :func:`build_model`; ``config`` holds the arguments it was built with.
    """

    def __init__(self, mixer: str, *, vocab: int, d_model: int, n_layers: int, n_heads: int, head_dim: int,
                 out_vocab: int, mlp_ratio: int, **mixer_kwargs):
        super().__init__()
        self.vocab, self.out_vocab = vocab, out_vocab
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(mixer, d_model, n_heads, head_dim, mlp_ratio, **mixer_kwargs)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, out_vocab, bias=False)
        self.config = dict(mixer=mixer, vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           head_dim=head_dim, out_vocab=out_vocab, mlp_ratio=mlp_ratio, **mixer_kwargs)
        self._init(n_layers)

    def _init(self, n_layers: int) -> None:
        """GPT-2 style: N(0, 0.02) weights, zero biases, residual output projections scaled by
        ``1/sqrt(2 n_layers)``; LayerNorms at 1/0; then the gate biases (:meth:`Mixer.reset_gates`)."""
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)
        for blk in self.blocks:
            nn.init.normal_(blk.mixer.o.weight, std=0.02 / math.sqrt(2 * n_layers))
            nn.init.normal_(blk.mlp[2].weight, std=0.02 / math.sqrt(2 * n_layers))
            blk.mixer.reset_gates()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError("`tokens` must be a (B, T) long tensor, got "
                             + (f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor)
                                else type(tokens).__name__))
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab):
            raise ValueError(f"`tokens` must be ids in [0, {self.vocab})")
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _resolve(mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio):
    mixer = _check_mixer(mixer)
    vocab = check_int(vocab, "vocab")
    d_model = check_int(d_model, "d_model")
    n_layers = check_int(n_layers, "n_layers")
    n_heads = check_int(n_heads, "n_heads")
    mlp_ratio = check_int(mlp_ratio, "mlp_ratio")
    out_vocab = vocab if out_vocab is None else check_int(out_vocab, "out_vocab")
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"`d_model` ({d_model}) must be divisible by `n_heads` ({n_heads}), or pass `head_dim`")
        head_dim = d_model // n_heads
    head_dim = check_int(head_dim, "head_dim")
    return mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio


def build_model(mixer: str, *, vocab: int, d_model: int, n_layers: int, n_heads: int, head_dim: int | None = None,
                out_vocab: int | None = None, mlp_ratio: int = 4, beta_max: float | None = None,
                form: str = "auto", matrix_max_T: int = 1024, rope_base: float = 10000.0, w_conv: int = 0,
                short_conv: int = 0, npos_max: int | None = None, w_rank: int | None = None) -> LM:
    """A decoder-only :class:`LM` with ``n_layers`` pre-norm blocks of the mixer ``mixer`` (:data:`MIXERS`).

    ``vocab``: input ids; ``out_vocab`` (default ``vocab``): logits; ``head_dim`` (default
    ``d_model // n_heads``); ``mlp_ratio``: MLP width / ``d_model``; ``beta_max``: ``beta = beta_max
    sigma(.)`` (default 2 for path/pathfox, 1 for deltanet/gated_deltanet); ``w_conv``: filter size of a
    causal short convolution on PaTH's ``w`` (0: none; path and pathfox only); ``w_rank``: the rank of ``w``'s
    projection (None, the default: full rank; path and pathfox only); ``short_conv``: filter size of a
    causal short convolution (+ SiLU) on ``q``, ``k``, ``v`` (0: none; any mixer); ``npos_max``: rows of CoPE's
    table of position embeddings (cope only; default 64); ``form``: one of
    :data:`FORMS` (:func:`select_form`).  The Triton kernels need ``head_dim`` in 16..128.
    Seed with ``torch.manual_seed`` before calling for reproducible weights.  Parameter count:
    :func:`parameter_count` (module docstring).
    """
    mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio = _resolve(
        mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio)
    cls = LAYERS[mixer]
    if beta_max is not None and not cls.has_beta:
        with_beta = ", ".join(m for m in MIXERS if LAYERS[m].has_beta)
        raise ValueError(f"`beta_max` only applies to the mixers with a beta ({with_beta}); got mixer {mixer!r}")
    w_conv = check_int(w_conv, "w_conv", minimum=0)
    if w_conv and not cls.has_w:
        with_w = ", ".join(m for m in MIXERS if LAYERS[m].has_w)
        raise ValueError(f"`w_conv` only applies to the mixers with a w ({with_w}); got mixer {mixer!r}")
    short_conv = check_int(short_conv, "short_conv", minimum=0)
    extra = {}
    if npos_max is not None and mixer != "cope":
        raise ValueError(f"`npos_max` only applies to the mixer cope; got mixer {mixer!r}")
    if mixer == "cope":
        extra["npos_max"] = check_int(NPOS_MAX if npos_max is None else npos_max, "npos_max")
    if w_rank is not None:
        if not cls.has_w:
            with_w = ", ".join(m for m in MIXERS if LAYERS[m].has_w)
            raise ValueError(f"`w_rank` only applies to the mixers with a w ({with_w}); got mixer {mixer!r}")
        extra["w_rank"] = check_int(w_rank, "w_rank")
    return LM(mixer, vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim,
              out_vocab=out_vocab, mlp_ratio=mlp_ratio, beta_max=beta_max, form=form, matrix_max_T=matrix_max_T,
              rope_base=rope_base, w_conv=w_conv, short_conv=short_conv, **extra)


def parameter_count(mixer: str, *, vocab: int, d_model: int, n_layers: int, n_heads: int, head_dim: int | None = None,
                    out_vocab: int | None = None, mlp_ratio: int = 4, w_conv: int = 0, short_conv: int = 0,
                    npos_max: int | None = None, w_rank: int | None = None, **_ignored) -> int:
    """The number of parameters of :func:`build_model` with the same arguments, from the formula in
    the module docstring (no model is built)."""
    mixer, vocab, d, L, H, Dh, out_vocab, r = _resolve(mixer, vocab, d_model, n_layers, n_heads, head_dim,
                                                       out_vocab, mlp_ratio)
    w_conv = check_int(w_conv, "w_conv", minimum=0)
    short_conv = check_int(short_conv, "short_conv", minimum=0)
    HD, h = H * Dh, r * d
    cls = LAYERS[mixer]
    extra = 0
    if cls.gate == "head":
        extra += d * H + H
    if cls.gate == "channel":
        extra += GLA_RANK * d + GLA_RANK * HD + HD
    if cls.has_beta:
        extra += d * H + H
    if cls.has_w:
        extra += (d * HD if w_rank is None else check_int(w_rank, "w_rank") * (d + HD)) + HD * w_conv
    if mixer in LINEAR_MIXERS:
        extra += Dh
    if mixer == "cope":
        extra += check_int(NPOS_MAX if npos_max is None else npos_max, "npos_max") * Dh
    extra += 3 * HD * short_conv
    per_layer = 4 * d + (2 * d * h + h + d) + 4 * d * HD + extra
    return vocab * d + d * out_vocab + 2 * d + L * per_layer


@contextlib.contextmanager
def forced_form(model: "LM", form: str):
    """Within the ``with`` block every mixer of ``model`` runs ``form`` (one of :data:`FORMS`), e.g. the
    PyTorch ``"matrix"`` form in place of the Triton kernels, to compare their gradients on one batch;
    each mixer's own form comes back on exit.  An unavailable form raises ``ValueError`` at once."""
    if not isinstance(model, LM):
        raise TypeError(f"`model` must be a pathedu.models.LM, got {type(model).__name__}")
    mixers = [blk.mixer for blk in model.blocks]
    for m in mixers:
        select_form(m.mixer, form)
    saved = [m.form for m in mixers]
    try:
        for m in mixers:
            m.form = form
        yield model
    finally:
        for m, f in zip(mixers, saved):
            m.form = f


@torch.no_grad()
def per_token_quantities(model: "LM", tokens: torch.Tensor) -> list[dict]:
    """What each layer's mixer computed from ``tokens: (B, T)``: one dict per layer with the per-token
    quantities it passes to its mechanism, e.g. ``{"beta": (B, H, T), "w": (B, H, T, Dh)}`` for PaTH,
    ``{"log_f": (B, H, T)}`` for FoX (empty for NoPE, ALiBi, RoPE, stick-breaking, CoPE, linear, RetNet).  For
    reading what a trained model learnt (does PaTH use reflections, beta near 2?).  Runs the model once in eval mode."""
    if not isinstance(model, LM):
        raise TypeError(f"`model` must be a pathedu.models.LM, got {type(model).__name__}")
    mixers = [blk.mixer for blk in model.blocks]
    was_training = model.training
    model.eval()
    try:
        for m in mixers:
            m.keep_extra, m.kept = True, {}
        model(tokens)
        return [dict(m.kept) for m in mixers]
    finally:
        for m in mixers:
            m.keep_extra, m.kept = False, {}
        model.train(was_training)
