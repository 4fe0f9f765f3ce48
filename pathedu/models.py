r"""A small decoder-only model whose token mixer is any of the book's mechanisms.

::

    tokens (B, T) -> embedding (B, T, d)                       (no absolute position embedding)
                  -> n_layers x [ x + Mixer(LN(x));  x + MLP(LN(x)) ]   (pre-norm blocks)
                  -> LN -> LM head -> logits (B, T, out_vocab)

The mixer is chosen by name (:data:`MIXERS`):

============== =========== ================================================= ==========================
name           side        per-token quantities (from the token, per head)    function (PyTorch / Triton)
============== =========== ================================================= ==========================
nope           softmax     --                                                 ``nope_matrix`` / ``nope_triton``
alibi          softmax     fixed slopes :func:`pathedu.alibi.alibi_slopes`     ``alibi_matrix`` / ``alibi_triton``
fox            softmax     ``log_f = log sigma(W_f x + b_f)``                  ``fox_matrix`` / ``fox_triton``
rope           softmax     fixed rotation, base 10000                         ``rope_matrix`` / ``rope_triton``
path           softmax     ``w = normalize(W_w x)``, ``beta = 2 sigma(W_b x + b_b)``  ``path_matrix`` / ``path_triton``
pathfox        softmax     PaTH's ``w, beta`` and FoX's ``log_f``              ``pathfox_matrix`` / ``pathfox_triton``
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
  ``w_conv=0`` leaves it out.
* ``short_conv=K`` (any mixer; 0, the default, leaves it out): a causal depthwise convolution of filter size
  ``K`` followed by SiLU on each of the ``q``, ``k``, ``v`` projections, as the DeltaNet, Gated DeltaNet and GLA
  implementations do by default (flash-linear-attention's ``ShortConvolution``, size 4).  It lets a token see the
  few before it without any attention: on recall tasks, a value can carry its key.  The linear side normalises
  ``q`` and ``k`` after it.
* The linear side L2-normalises ``q`` and ``k`` per head (DeltaNet needs unit keys for
  ``I - beta k k^T`` to be a contraction; the others get the same for a fair comparison) and puts a
  per-head RMSNorm on the mixer output (as in GLA / DeltaNet implementations), since
  unnormalised linear attention grows with T.  The softmax side uses ``scale = D^-1/2``.

The form (:func:`select_form`): ``"auto"`` takes the Triton kernel when the mechanism has a Triton
backward (the six softmax-side kernels, and the linear template for ``linear``, ``retnet`` and ``gla``) and
the input is on a CUDA GPU; otherwise the PyTorch
``*_matrix`` form (``*_chunked`` for the linear side when ``T > matrix_max_T``, and always for GLA's
per-channel gate).  ``path_matrix`` and ``pathfox_matrix`` cost O(T^3) for the triangular solve and
O(T^2) memory: fine at T <= 512.  PyTorch forms run in float32 with autocast switched off; Triton
forms take bf16 ``q, k, v`` under autocast (gates, ``w`` and ``beta`` in fp32).

Parameter count (:func:`parameter_count`, equal to ``sum(p.numel())``), with ``d = d_model``,
``HD = n_heads * head_dim``, ``h = mlp_ratio * d``::

    vocab*d + d*out_vocab + 2d                                        (embedding, LM head, final LN)
    + n_layers * (4d + (2 d h + h + d) + 4 d HD + extra)             (2 LNs, MLP, q k v o)
    extra: fox 'd*H + H'; path 'd*HD + d*H + H' (+ 'HD*K' with w_conv=K); pathfox both; deltanet 'd*H + H';
           gated_deltanet '2 (d*H + H)'; gla '16 d + 16 HD + HD'; linear-side output norm '+ head_dim';
           short_conv=K '3 HD K'.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import alibi as _alibi
from . import fox as _fox
from . import nope as _nope
from . import path as _path
from . import pathfox as _pathfox
from . import rope as _rope
from ._device import triton_mode

__all__ = ["MIXERS", "SOFTMAX_MIXERS", "LINEAR_MIXERS", "FORMS", "Mixer", "Block", "LM", "build_model",
           "parameter_count", "select_form", "forced_form"]

SOFTMAX_MIXERS = ("nope", "alibi", "fox", "rope", "path", "pathfox")
LINEAR_MIXERS = ("linear", "retnet", "gla", "deltanet", "gated_deltanet")
MIXERS = SOFTMAX_MIXERS + LINEAR_MIXERS
FORMS = ("auto", "matrix", "chunked", "triton")
GLA_RANK, GLA_TEMPERATURE = 16, 16.0


@dataclass(frozen=True)
class _Spec:
    gate: str | None = None  # None, "head" (one log gate per head and token) or "channel" (GLA)
    beta: bool = False
    w: bool = False
    beta_max: float = 1.0


_SPECS = {
    "nope": _Spec(), "alibi": _Spec(), "rope": _Spec(),
    "fox": _Spec(gate="head"),
    "path": _Spec(beta=True, w=True, beta_max=2.0),
    "pathfox": _Spec(gate="head", beta=True, w=True, beta_max=2.0),
    "linear": _Spec(), "retnet": _Spec(),
    "gla": _Spec(gate="channel"),
    "deltanet": _Spec(beta=True, beta_max=1.0),
    "gated_deltanet": _Spec(gate="head", beta=True, beta_max=1.0),
}

# name -> {form: function}; the Triton entries are the kernels that have a backward pass.
_FUNCS = {
    "nope": {"matrix": _nope.nope_matrix, "chunked": _nope.nope_blockwise, "triton": _nope.nope_triton},
    "alibi": {"matrix": _alibi.alibi_matrix, "chunked": _alibi.alibi_blockwise, "triton": _alibi.alibi_triton},
    "fox": {"matrix": _fox.fox_matrix, "chunked": _fox.fox_blockwise, "triton": _fox.fox_triton},
    "rope": {"matrix": _rope.rope_matrix, "chunked": _rope.rope_blockwise, "triton": _rope.rope_triton},
    "path": {"matrix": _path.path_matrix, "chunked": _path.path_blockwise, "triton": _path.path_triton},
    "pathfox": {"matrix": _pathfox.pathfox_matrix, "chunked": _pathfox.pathfox_blockwise,
                "triton": _pathfox.pathfox_triton},
    "linear": {"matrix": _nope.linear_matrix, "chunked": _nope.linear_chunked, "triton": _nope.linear_triton},
    "retnet": {"matrix": _alibi.retnet_matrix, "chunked": _alibi.retnet_chunked, "triton": _alibi.retnet_triton},
    "gla": {"chunked": _fox.gla_chunked, "triton": _fox.gla_triton},
    "deltanet": {"matrix": _path.deltanet_matrix, "chunked": _path.deltanet_chunked},
    "gated_deltanet": {"matrix": _pathfox.gated_deltanet_matrix, "chunked": _pathfox.gated_deltanet_chunked},
}


def _check_mixer(mixer) -> str:
    if mixer not in MIXERS:
        raise ValueError(f"`mixer` must be one of {', '.join(MIXERS)}; got {mixer!r}")
    return mixer


def select_form(mixer: str, form: str = "auto", *, device=None, T: int = 0, matrix_max_T: int = 1024) -> str:
    """The form a mixer runs: ``"triton"``, ``"matrix"`` or ``"chunked"`` (blockwise on the softmax side).

    ``"auto"``: Triton when ``mixer`` has a Triton backward (softmax side; ``linear``, ``retnet``, ``gla``),
    Triton compiles for a GPU (:func:`pathedu.triton_mode`) and ``device`` is CUDA; else ``"matrix"``, or ``"chunked"`` for
    the linear side when ``T > matrix_max_T`` and for ``gla`` (its matrix form holds a T x T x D tensor).
    An explicit form the mixer lacks raises ``ValueError``.
    """
    mixer = _check_mixer(mixer)
    if form not in FORMS:
        raise ValueError(f"`form` must be one of {', '.join(FORMS)}; got {form!r}")
    funcs = _FUNCS[mixer]
    if form != "auto":
        if form not in funcs:
            why = " (DeltaNet's Triton kernels have no backward pass)" if form == "triton" else ""
            raise ValueError(f"`form` {form!r} is not available for mixer {mixer!r}{why}; "
                             f"available: {', '.join(funcs)}")
        return form
    on_gpu = device is not None and torch.device(device).type == "cuda" and triton_mode() == "gpu"
    if "triton" in funcs and on_gpu:
        return "triton"
    if "matrix" not in funcs or (mixer in LINEAR_MIXERS and T > matrix_max_T):
        return "chunked"
    return "matrix"


def _pos_int(x, name: str, minimum: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"`{name}` must be an int, got {type(x).__name__}")
    if int(x) < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {x}")
    return int(x)


def _causal_depthwise(channels: int, size: int) -> nn.Conv1d:
    """A causal depthwise convolution of filter ``size`` (no bias): padded ``size - 1`` on the left by
    :func:`_convolve`, so position ``t`` sees ``t - size + 1 .. t``; PyTorch's default initialisation."""
    return nn.Conv1d(channels, channels, kernel_size=size, groups=channels, bias=False, padding=size - 1)


def _convolve(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` along the tokens of ``x (B, T, C)``, keeping the first ``T`` outputs (the causal ones)."""
    return conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


class Mixer(nn.Module):
    """Multi-head token mixer: ``(B, T, d_model) -> (B, T, d_model)``, causal.

    Projections ``q, k, v: d_model -> n_heads * head_dim`` (no bias), heads as a leading dim
    ``(B, H, T, head_dim)`` for the mechanism's function, output projection back to ``d_model``.
    See the module docstring for the per-token quantities of each mixer.
    """

    def __init__(self, mixer: str, d_model: int, n_heads: int, head_dim: int, *, beta_max: float | None = None,
                 form: str = "auto", matrix_max_T: int = 1024, rope_base: float = 10000.0, w_conv: int = 0,
                 short_conv: int = 0):
        super().__init__()
        self.mixer = _check_mixer(mixer)
        select_form(mixer, form)  # validates form
        spec = _SPECS[mixer]
        if mixer == "rope" and head_dim % 2:
            raise ValueError(f"`head_dim` must be even for rope (channel pairs rotate), got {head_dim}")
        if beta_max is None:
            beta_max = spec.beta_max
        if not (isinstance(beta_max, numbers.Real) and 0 < float(beta_max) <= 2):
            raise ValueError(f"`beta_max` must be in (0, 2], got {beta_max!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.form, self.matrix_max_T, self.rope_base = form, matrix_max_T, float(rope_base)
        self.beta_max = float(beta_max)
        HD = n_heads * head_dim
        self.q = nn.Linear(d_model, HD, bias=False)
        self.k = nn.Linear(d_model, HD, bias=False)
        self.v = nn.Linear(d_model, HD, bias=False)
        self.o = nn.Linear(HD, d_model, bias=False)
        self.f = self.f_down = self.f_up = self.b = self.w = self.head_norm = None
        if spec.gate == "head":
            self.f = nn.Linear(d_model, n_heads)
        elif spec.gate == "channel":
            self.f_down = nn.Linear(d_model, GLA_RANK, bias=False)
            self.f_up = nn.Linear(GLA_RANK, HD)
        if spec.beta:
            self.b = nn.Linear(d_model, n_heads)
        self.w_conv = None
        self.keep_extra, self.kept = False, {}
        if spec.w:
            self.w = nn.Linear(d_model, HD, bias=False)
            if w_conv:
                self.w_conv = _causal_depthwise(HD, w_conv)
        self.qkv_conv = _causal_depthwise(3 * HD, short_conv) if short_conv else None
        if mixer in LINEAR_MIXERS:
            self.head_norm = nn.RMSNorm(head_dim, eps=1e-6)
        if mixer == "alibi":
            self.register_buffer("slopes", _alibi.alibi_slopes(n_heads).float(), persistent=False)
        if mixer == "retnet":
            self.register_buffer("gammas", _alibi.retnet_gammas(n_heads).float(), persistent=False)

    def reset_gates(self) -> None:
        """Gate biases: forget gates ``b_f = linspace(2, 6)`` over heads (gates 0.88 .. 0.9975), GLA's 0,
        ``beta``'s 0 (``beta = beta_max / 2`` at the start)."""
        with torch.no_grad():
            if self.f is not None:
                self.f.bias.copy_(torch.linspace(2.0, 6.0, self.n_heads) if self.n_heads > 1
                                  else torch.tensor([4.0]))
            if self.f_up is not None:
                self.f_up.bias.zero_()
            if self.b is not None:
                self.b.bias.zero_()

    def _heads(self, x: torch.Tensor, B: int, T: int) -> torch.Tensor:
        return x.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, Dh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        form = select_form(self.mixer, self.form, device=x.device, T=T, matrix_max_T=self.matrix_max_T)
        if self.qkv_conv is None:
            q, k, v = (self._heads(p(x), B, T) for p in (self.q, self.k, self.v))
        else:  # one depthwise convolution over the three projections side by side, then SiLU
            qkv = F.silu(_convolve(self.qkv_conv, torch.cat([p(x) for p in (self.q, self.k, self.v)], -1)))
            q, k, v = (self._heads(t, B, T) for t in qkv.chunk(3, dim=-1))
        extra = {}
        # Per-token quantities in fp32 whatever the autocast state.
        if self.f is not None:
            extra["log_f"] = F.logsigmoid(self.f(x).float()).transpose(1, 2)  # (B, H, T)
        if self.f_up is not None:
            raw = self.f_up(self.f_down(x)).float()
            extra["log_f"] = self._heads(F.logsigmoid(raw) / GLA_TEMPERATURE, B, T)  # (B, H, T, Dh)
        if self.b is not None:
            extra["beta"] = (self.beta_max * torch.sigmoid(self.b(x).float())).transpose(1, 2)  # (B, H, T)
        if self.w is not None:
            w = self.w(x).float()
            if self.w_conv is not None:
                w = _convolve(self.w_conv, w)
            extra["w"] = F.normalize(self._heads(w, B, T), dim=-1)
        if self.head_norm is not None:  # linear side: unit q and k per head
            q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        if self.keep_extra:  # what the tokens chose (gates, w, beta): see per_token_quantities
            self.kept = {name: t.detach() for name, t in extra.items()}
        if form == "triton":
            dt = q.dtype if q.dtype == k.dtype == v.dtype else torch.float32
            o = self._core(form, q.to(dt), k.to(dt), v.to(dt), extra)
        else:
            with torch.autocast(device_type=x.device.type, enabled=False):
                o = self._core(form, q.float(), k.float(), v.float(), extra)
        if self.head_norm is not None:
            o = self.head_norm(o.float())
        o = o.transpose(1, 2).reshape(B, T, -1)
        return self.o(o.to(x.dtype))  # x is fp32 under autocast too; the Linear casts as autocast says

    def _core(self, form: str, q, k, v, extra) -> torch.Tensor:
        args, kwargs = self.core_inputs(q, k, v, extra)
        return _FUNCS[self.mixer][form](*args, **kwargs)

    def core_inputs(self, q, k, v, extra) -> tuple[list, dict]:
        """The positional and keyword arguments of the mechanism's function (any form) for heads ``q, k, v``
        ``(B, H, T, Dh)`` and per-token quantities ``extra`` (``"w"``, ``"beta"``, ``"log_f"``), in its order."""
        m = self.mixer
        if m in ("nope", "linear"):
            return [q, k, v], {}
        if m == "alibi":
            return [q, k, v, self.slopes], {}
        if m == "retnet":
            return [q, k, v, self.gammas], {}
        if m == "rope":
            return [q, k, v], {"base": self.rope_base}
        if m in ("fox", "gla"):
            return [q, k, v, extra["log_f"]], {}
        if m == "path":
            return [q, k, v, extra["w"], extra["beta"]], {}
        if m == "pathfox":
            return [q, k, v, extra["w"], extra["beta"], extra["log_f"]], {}
        if m == "deltanet":
            return [q, k, v, extra["beta"]], {}
        return [q, k, v, extra["beta"], extra["log_f"]], {}  # gated_deltanet


class Block(nn.Module):
    """Pre-norm block: ``x + Mixer(LN(x))``, then ``x + MLP(LN(x))`` (MLP: Linear, GELU, Linear)."""

    def __init__(self, mixer: str, d_model: int, n_heads: int, head_dim: int, mlp_ratio: int, **mixer_kwargs):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.mixer = Mixer(mixer, d_model, n_heads, head_dim, **mixer_kwargs)
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
    vocab = _pos_int(vocab, "vocab")
    d_model = _pos_int(d_model, "d_model")
    n_layers = _pos_int(n_layers, "n_layers")
    n_heads = _pos_int(n_heads, "n_heads")
    mlp_ratio = _pos_int(mlp_ratio, "mlp_ratio")
    out_vocab = vocab if out_vocab is None else _pos_int(out_vocab, "out_vocab")
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"`d_model` ({d_model}) must be divisible by `n_heads` ({n_heads}), or pass `head_dim`")
        head_dim = d_model // n_heads
    head_dim = _pos_int(head_dim, "head_dim")
    return mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio


def build_model(mixer: str, *, vocab: int, d_model: int, n_layers: int, n_heads: int, head_dim: int | None = None,
                out_vocab: int | None = None, mlp_ratio: int = 4, beta_max: float | None = None,
                form: str = "auto", matrix_max_T: int = 1024, rope_base: float = 10000.0, w_conv: int = 0,
                short_conv: int = 0) -> LM:
    """A decoder-only :class:`LM` with ``n_layers`` pre-norm blocks of the mixer ``mixer`` (:data:`MIXERS`).

    ``vocab``: input ids; ``out_vocab`` (default ``vocab``): logits; ``head_dim`` (default
    ``d_model // n_heads``); ``mlp_ratio``: MLP width / ``d_model``; ``beta_max``: ``beta = beta_max
    sigma(.)`` (default 2 for path/pathfox, 1 for deltanet/gated_deltanet); ``w_conv``: filter size of a
    causal short convolution on PaTH's ``w`` (0: none; path and pathfox only); ``short_conv``: filter size of a
    causal short convolution (+ SiLU) on ``q``, ``k``, ``v`` (0: none; any mixer); ``form``: one of
    :data:`FORMS` (:func:`select_form`).  The Triton kernels need ``head_dim`` in 16..128.
    Seed with ``torch.manual_seed`` before calling for reproducible weights.  Parameter count:
    :func:`parameter_count` (module docstring).
    """
    mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio = _resolve(
        mixer, vocab, d_model, n_layers, n_heads, head_dim, out_vocab, mlp_ratio)
    if beta_max is not None and not _SPECS[mixer].beta:
        with_beta = ", ".join(m for m in MIXERS if _SPECS[m].beta)
        raise ValueError(f"`beta_max` only applies to the mixers with a beta ({with_beta}); got mixer {mixer!r}")
    w_conv = _pos_int(w_conv, "w_conv", minimum=0)
    if w_conv and not _SPECS[mixer].w:
        with_w = ", ".join(m for m in MIXERS if _SPECS[m].w)
        raise ValueError(f"`w_conv` only applies to the mixers with a w ({with_w}); got mixer {mixer!r}")
    short_conv = _pos_int(short_conv, "short_conv", minimum=0)
    return LM(mixer, vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim,
              out_vocab=out_vocab, mlp_ratio=mlp_ratio, beta_max=beta_max, form=form, matrix_max_T=matrix_max_T,
              rope_base=rope_base, w_conv=w_conv, short_conv=short_conv)


def parameter_count(mixer: str, *, vocab: int, d_model: int, n_layers: int, n_heads: int, head_dim: int | None = None,
                    out_vocab: int | None = None, mlp_ratio: int = 4, w_conv: int = 0, short_conv: int = 0,
                    **_ignored) -> int:
    """The number of parameters of :func:`build_model` with the same arguments, from the formula in
    the module docstring (no model is built)."""
    mixer, vocab, d, L, H, Dh, out_vocab, r = _resolve(mixer, vocab, d_model, n_layers, n_heads, head_dim,
                                                       out_vocab, mlp_ratio)
    w_conv = _pos_int(w_conv, "w_conv", minimum=0)
    short_conv = _pos_int(short_conv, "short_conv", minimum=0)
    HD, h = H * Dh, r * d
    spec = _SPECS[mixer]
    extra = 0
    if spec.gate == "head":
        extra += d * H + H
    if spec.gate == "channel":
        extra += GLA_RANK * d + GLA_RANK * HD + HD
    if spec.beta:
        extra += d * H + H
    if spec.w:
        extra += d * HD + HD * w_conv
    if mixer in LINEAR_MIXERS:
        extra += Dh
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
    ``{"log_f": (B, H, T)}`` for FoX (empty for NoPE, ALiBi, RoPE, linear, RetNet).  For reading what a
    trained model learnt (does PaTH use reflections, beta near 2?).  Runs the model once in eval mode."""
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
