r"""Token-mixing layers, one ``torch.nn.Module`` per mechanism of the book, ready to drop into a model.

Every layer maps ``x: (B, T, d_model) -> (B, T, d_model)``, causally::

    q, k, v = x W_q, x W_k, x W_v           (B, T, n_heads * head_dim), no bias
    [short_conv: a causal depthwise convolution of filter size K on q, k, v side by side, then SiLU]
    per-token quantities from x              (gates, w, beta: see each class)
    heads (B, H, T, head_dim) -> the mechanism's function (pathedu.<mechanism>) -> (B, H, T, head_dim)
    [linear side: a per-head RMSNorm of the output]
    (B, T, H * head_dim) W_o -> (B, T, d_model)

Classes (registry name: mechanism; what each token contributes besides ``q, k, v``):

* ``NoPEAttention`` (``nope``): softmax attention, no position encoding.
* ``ALiBiAttention`` (``alibi``): a linear distance bias with fixed slopes per head.
* ``ForgettingAttention`` (``fox``): a forget gate per head, ``log_f = log sigmoid(W_f x + b_f)``.
* ``RoPEAttention`` (``rope``): fixed rotations of ``q`` and ``k``.
* ``PaTHAttention`` (``path``): Householder transitions, ``w = normalize(conv(W_w x))`` (``W_w`` low rank),
  ``beta = 2 sigmoid(.)``.
* ``PaTHFoXAttention`` (``pathfox``): PaTH's ``w, beta`` and FoX's ``log_f``.
* ``StickBreakingAttention`` (``stickbreaking``): sigmoids of the logits broken as a stick, no softmax.
* ``CoPEAttention`` (``cope``): positions counted by gates, a table of ``npos_max`` position embeddings.
* ``LinearAttention`` (``linear``): the running sum ``S_t = S_{t-1} + v_t k_t^T``.
* ``MultiScaleRetention`` (``retnet``): fixed decays per head.
* ``GatedLinearAttention`` (``gla``): a gate per key channel, ``log_f = log sigmoid(W_2 W_1 x + b) / 16``.
* ``DeltaNet`` (``deltanet``): the delta rule, ``beta = sigmoid(.)``, unit keys.
* ``GatedDeltaNet`` (``gated_deltanet``): DeltaNet's ``beta`` and a forget gate ``log_f``.

:data:`LAYERS` maps each registry name to its class; :mod:`pathedu.models` builds its decoder from it.

Forms (``form=``; :func:`choose_form`).  ``"auto"`` runs the Triton kernel when the input is on a CUDA GPU and
Triton compiles for it, provided the kernel has a backward pass whenever autograd needs one
(:func:`triton_trains`: :data:`TRITON_BACKWARD` lists the mechanisms that have one); otherwise a PyTorch form: the ``*_matrix`` form, or the ``*_chunked`` form
on the linear side beyond ``matrix_max_T`` tokens (1024 by default) and always for GLA (its matrix form holds a
``T x T x D`` tensor).  The linear side's matrix forms hold ``T x T`` matrices (DeltaNet's a ``T x T``
triangular solve), so their cost grows as ``T^2`` or ``T^3`` where the chunked forms grow as ``T``; below
``matrix_max_T`` the rule is the one :mod:`pathedu.models` trains with, so that a layer and a model given the
same weights compute the same numbers.  An explicit ``"matrix"``, ``"chunked"`` (``*_blockwise`` on the softmax
side), ``"triton"`` or ``"recurrent"`` (token by token) overrides it.  PyTorch forms compute in float32 (float64
for float64 input) with autocast off; Triton forms take ``q, k, v`` in their dtype (bf16 under autocast), gates,
``w`` and ``beta`` in fp32, and float64 input as fp32.

Decoding.  ``y_t, cache = layer.step(x_t, cache)`` takes one token ``x_t: (B, d_model)`` and the cache of the
tokens before it (``None`` for the first token) and returns ``y_t: (B, d_model)`` and the cache with ``x_t`` in it.
Calling it on ``x[:, 0], x[:, 1], ...`` gives ``layer(x)`` token by token.  The cache (:class:`DecodeCache`)
holds the mechanism's state and the last ``K - 1`` inputs of each short convolution: on the softmax side a KV
cache (:class:`pathedu.nope.KVCache` and its kin: PaTH's keys are multiplied by ``H_t`` in place when token
``t`` arrives, :class:`pathedu.path.PathKVCache`), on the linear side the ``(B, H, head_dim, head_dim)`` state of
the recurrence.  Decoding always runs the PyTorch caches (no Triton decoding kernel).  The alternative, a
``cache=`` argument of ``forward``, was not taken: ``forward`` keeps one signature for training and prefill,
and the step keeps its own shapes ``(B, d_model)``.

Shapes: ``x: (B, T, d_model)`` floating, ``T >= 0``; ``n_heads, head_dim >= 1`` (``head_dim=None``:
``d_model // n_heads``).  Bad input raises ``TypeError``/``ValueError`` naming the argument.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import alibi as _alibi
from . import cope as _cope
from . import fox as _fox
from . import nope as _nope
from . import path as _path
from . import pathfox as _pathfox
from . import rope as _rope
from . import stickbreaking as _sb
from .checks import check_int
from ._device import triton_mode

__all__ = ["TokenMixer", "NoPEAttention", "ALiBiAttention", "ForgettingAttention", "RoPEAttention", "PaTHAttention",
           "PaTHFoXAttention", "StickBreakingAttention", "CoPEAttention", "LinearAttention", "MultiScaleRetention",
           "GatedLinearAttention", "DeltaNet", "GatedDeltaNet", "LAYERS", "FUNCS", "TRITON_BACKWARD", "FORMS",
           "DecodeCache", "choose_form", "triton_trains"]

FORMS = ("auto", "matrix", "chunked", "triton", "recurrent")
GLA_RANK, GLA_TEMPERATURE = 16, 16.0


def _forms(module, name: str, chunked: str) -> dict:
    """``{form: function}`` of one mechanism: ``module.<name>_matrix``, ``_<chunked>``, ``_triton``, ``_recurrent``."""
    return {"matrix": getattr(module, f"{name}_matrix"), "chunked": getattr(module, f"{name}_{chunked}"),
            "triton": getattr(module, f"{name}_triton"), "recurrent": getattr(module, f"{name}_recurrent")}


# registry name -> {form: function}, looked up at every call.  The softmax side's chunked form is its blockwise
# online softmax, the linear side's its chunked recurrence.
FUNCS = {
    **{name: _forms(module, name, "blockwise") for name, module in (
        ("nope", _nope), ("alibi", _alibi), ("fox", _fox), ("rope", _rope), ("path", _path), ("pathfox", _pathfox),
        ("stickbreaking", _sb), ("cope", _cope))},
    **{name: _forms(module, name, "chunked") for name, module in (
        ("linear", _nope), ("retnet", _alibi), ("gla", _fox), ("deltanet", _path), ("gated_deltanet", _pathfox))},
}

# The mechanisms whose Triton form has a backward pass (a model can train through it): every one of them.
TRITON_BACKWARD = frozenset({"nope", "alibi", "fox", "rope", "path", "pathfox", "stickbreaking", "cope",
                             "linear", "retnet", "gla", "deltanet", "gated_deltanet"})
LINEAR_SIDE = frozenset({"linear", "retnet", "gla", "deltanet", "gated_deltanet"})


def triton_trains(mixer: str) -> bool:
    """Whether ``mixer``'s Triton form has a backward pass (it is in :data:`TRITON_BACKWARD`), so that a layer can
    train through it."""
    if mixer not in FUNCS:
        raise ValueError(f"`mixer` must be one of {', '.join(FUNCS)}; got {mixer!r}")
    return mixer in TRITON_BACKWARD


def choose_form(mixer: str, form: str = "auto", *, device=None, T: int = 0, matrix_max_T: int = 1024,
                needs_grad: bool = True, triton_without_grad: bool = True) -> str:
    """The form a layer runs: one of ``"triton"``, ``"matrix"``, ``"chunked"``, ``"recurrent"``.

    ``mixer``: a registry name (:data:`LAYERS`); ``form``: one of :data:`FORMS`, returned as is unless
    ``"auto"``.  ``"auto"``: ``"triton"`` when ``device`` is CUDA, Triton compiles for a GPU
    (:func:`pathedu.triton_mode`) and either the mechanism's Triton form has a backward pass
    (:func:`triton_trains`) or no gradient is needed (``needs_grad=False``) and ``triton_without_grad``;
    otherwise ``"matrix"``, or ``"chunked"`` for GLA and on the linear side when ``T > matrix_max_T``.
    """
    if mixer not in FUNCS:
        raise ValueError(f"`mixer` must be one of {', '.join(FUNCS)}; got {mixer!r}")
    if form not in FORMS:
        raise ValueError(f"`form` must be one of {', '.join(FORMS)}; got {form!r}")
    if form != "auto":
        return form
    on_gpu = device is not None and torch.device(device).type == "cuda" and triton_mode() == "gpu"
    if on_gpu and ((triton_without_grad and not needs_grad) or triton_trains(mixer)):
        return "triton"
    if mixer == "gla" or (mixer in LINEAR_SIDE and T > matrix_max_T):
        return "chunked"
    return "matrix"


def causal_depthwise(channels: int, size: int) -> nn.Conv1d:
    """A causal depthwise convolution of filter ``size`` over ``channels`` (no bias, PyTorch's default
    initialisation): padded ``size - 1`` on the left, so that :func:`convolve` lets position ``t`` see
    ``t - size + 1 .. t``."""
    return nn.Conv1d(channels, channels, kernel_size=size, groups=channels, bias=False, padding=size - 1)


def convolve(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` along the tokens of ``x: (B, T, C)``, keeping the first ``T`` outputs (the causal ones)."""
    if x.shape[1] == 0:  # PyTorch's convolutions refuse an empty sequence
        return x.new_zeros(x.shape[0], 0, conv.out_channels)
    return conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


def _convolve_step(conv: nn.Conv1d, window: torch.Tensor | None, x_t: torch.Tensor):
    """One token of :func:`convolve`: ``x_t: (B, C)`` joins ``window: (B, K - 1, C)`` (the last inputs, zeros
    before the first token, as the left padding); returns ``(out_t: (B, C), the next window)``."""
    K = conv.kernel_size[0]
    if window is None:
        window = x_t.new_zeros(x_t.shape[0], K - 1, x_t.shape[1])
    full = torch.cat([window, x_t[:, None, :]], dim=1)  # (B, K, C), oldest first
    out = torch.einsum("bkc,ck->bc", full, conv.weight[:, 0, :].to(full.dtype))
    return out, full[:, 1:]


@dataclass
class DecodeCache:
    """What a layer keeps between :meth:`TokenMixer.step` calls.

    ``t``: tokens seen; ``kv``: the mechanism's KV cache (softmax side) or ``state``: its recurrent state
    ``(B, H, head_dim, head_dim)`` (linear side); ``conv``: per short convolution (``"qkv"``, ``"w"``), the
    last ``K - 1`` inputs ``(B, K - 1, C)``; ``batch``: the batch size it was started with.
    """

    batch: int
    t: int = 0
    kv: object = None
    state: torch.Tensor | None = None
    conv: dict = field(default_factory=dict)


class TokenMixer(nn.Module):
    """The layer every mechanism shares: projections, per-token quantities, heads, a form, an output projection.

    Not used directly: each subclass names its mechanism (``mixer``, a key of :data:`FUNCS`) and what it computes
    from each token.  Shapes: ``forward(x: (B, T, d_model)) -> (B, T, d_model)``; ``step(x_t: (B, d_model),
    cache) -> ((B, d_model), cache)`` (module docstring).  Parameters are created in one fixed order
    (``q, k, v, o``, then the gates, ``beta``, ``w`` and the convolutions), so that a seed gives the same
    weights whatever builds the layer.
    """

    mixer: str = ""
    gate: str | None = None  # None, "head" (one log gate per head and token) or "channel" (GLA)
    has_beta: bool = False
    has_w: bool = False
    default_beta_max: float = 1.0
    per_head: tuple | None = None  # (buffer name, function of n_heads): a fixed per-head constant, passed after v

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *, form: str = "auto",
                 short_conv: int = 0, matrix_max_T: int = 1024, triton_without_grad: bool = True,
                 beta_max: float | None = None, w_conv: int = 0, w_rank: int | None = None):
        super().__init__()
        d_model = check_int(d_model, "d_model")
        n_heads = check_int(n_heads, "n_heads")
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"`d_model` ({d_model}) must be divisible by `n_heads` ({n_heads}), "
                                 f"or pass `head_dim`")
            head_dim = d_model // n_heads
        head_dim = check_int(head_dim, "head_dim")
        choose_form(self.mixer, form)  # validates form
        short_conv = check_int(short_conv, "short_conv", minimum=0)
        w_conv = check_int(w_conv, "w_conv", minimum=0)
        self.matrix_max_T = check_int(matrix_max_T, "matrix_max_T")
        if not isinstance(triton_without_grad, bool):
            raise TypeError(f"`triton_without_grad` must be a bool, got {type(triton_without_grad).__name__}")
        if beta_max is not None and not self.has_beta:
            raise ValueError(f"`beta_max` only applies to the layers with a beta; {type(self).__name__} has none")
        if w_conv and not self.has_w:
            raise ValueError(f"`w_conv` only applies to the layers with a w; {type(self).__name__} has none")
        if w_rank is not None:
            if not self.has_w:
                raise ValueError(f"`w_rank` only applies to the layers with a w; {type(self).__name__} has none")
            w_rank = check_int(w_rank, "w_rank")
        if beta_max is None:
            beta_max = self.default_beta_max
        if isinstance(beta_max, bool) or not isinstance(beta_max, numbers.Real):
            raise TypeError(f"`beta_max` must be a number, got {type(beta_max).__name__}")
        if not 0 < float(beta_max) <= 2:
            raise ValueError(f"`beta_max` must be in (0, 2], got {beta_max!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.form, self.triton_without_grad = form, triton_without_grad
        self.beta_max = float(beta_max)
        HD = n_heads * head_dim
        self.q = nn.Linear(d_model, HD, bias=False)
        self.k = nn.Linear(d_model, HD, bias=False)
        self.v = nn.Linear(d_model, HD, bias=False)
        self.o = nn.Linear(HD, d_model, bias=False)
        self.f = self.f_down = self.f_up = self.b = self.w = self.head_norm = None
        if self.gate == "head":
            self.f = nn.Linear(d_model, n_heads)
        elif self.gate == "channel":
            self.f_down = nn.Linear(d_model, GLA_RANK, bias=False)
            self.f_up = nn.Linear(GLA_RANK, HD)
        if self.has_beta:
            self.b = nn.Linear(d_model, n_heads)
        self.w_conv = self.w_down = None
        self.keep_extra, self.kept = False, {}
        if self.has_w:
            if w_rank is None:
                self.w = nn.Linear(d_model, HD, bias=False)
            else:  # low rank: d_model -> w_rank -> H * head_dim
                self.w_down = nn.Linear(d_model, w_rank, bias=False)
                self.w = nn.Linear(w_rank, HD, bias=False)
            if w_conv:
                self.w_conv = causal_depthwise(HD, w_conv)
        self.qkv_conv = causal_depthwise(3 * HD, short_conv) if short_conv else None
        if self.mixer in LINEAR_SIDE:
            self.head_norm = nn.RMSNorm(head_dim, eps=1e-6)
        if self.per_head is not None:  # fixed, not learnt, not saved: a function of n_heads
            name, values = self.per_head
            self.register_buffer(name, values(n_heads).float(), persistent=False)
        self.reset_gates()

    # -- parameters -------------------------------------------------------------------------------------------

    def reset_gates(self) -> None:
        """Gate biases: forget gates ``b_f = linspace(2, 6)`` over heads (gates 0.88 .. 0.9975: long memory
        first, forgetting learnt; 4 for one head), GLA's 0, ``beta``'s 0 (``beta = beta_max / 2`` at the start)."""
        with torch.no_grad():
            if self.f is not None:
                self.f.bias.copy_(torch.linspace(2.0, 6.0, self.n_heads) if self.n_heads > 1
                                  else torch.tensor([4.0]))
            if self.f_up is not None:
                self.f_up.bias.zero_()
            if self.b is not None:
                self.b.bias.zero_()

    # -- the full sequence ------------------------------------------------------------------------------------

    def _check_x(self, x, name: str, dims: int) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"`{name}` must have a floating dtype, got {x.dtype}")
        want = "(B, T, d_model)" if dims == 3 else "(B, d_model)"
        if x.dim() != dims or x.shape[-1] != self.d_model:
            raise ValueError(f"`{name}` must have shape {want} with d_model = {self.d_model}, "
                             f"got shape {tuple(x.shape)}")

    def _heads(self, x: torch.Tensor, B: int, T: int) -> torch.Tensor:
        return x.view(B, T, self.n_heads, x.shape[-1] // self.n_heads).transpose(1, 2)  # (B, H, T, Dh)

    @staticmethod
    def _work(x: torch.Tensor) -> torch.dtype:
        """The PyTorch forms' dtype: float64 for float64 input, float32 otherwise."""
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    def select(self, x: torch.Tensor) -> str:
        """The form :meth:`forward` runs on ``x: (B, T, d_model)`` (:func:`choose_form`)."""
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        return choose_form(self.mixer, self.form, device=x.device, T=x.shape[1], matrix_max_T=self.matrix_max_T,
                           needs_grad=needs_grad, triton_without_grad=self.triton_without_grad)

    def extras(self, x: torch.Tensor, work: torch.dtype, w_raw: torch.Tensor | None = None) -> dict:
        """The per-token quantities of ``x: (B, T, d_model)`` in ``work`` dtype (whatever the autocast state):
        ``"log_f"`` ``(B, H, T)`` (GLA: ``(B, H, T, head_dim)``), ``"beta"`` ``(B, H, T)``, ``"w"``
        ``(B, H, T, head_dim)`` unit per head; ``w_raw``: ``w``'s projection after its convolution, when the caller
        convolved it (decoding)."""
        B, T, _ = x.shape
        extra = {}
        if self.f is not None:
            extra["log_f"] = F.logsigmoid(self.f(x).to(work)).transpose(1, 2)
        if self.f_up is not None:
            raw = self.f_up(self.f_down(x)).to(work)
            extra["log_f"] = self._heads(F.logsigmoid(raw) / GLA_TEMPERATURE, B, T)
        if self.b is not None:
            extra["beta"] = (self.beta_max * torch.sigmoid(self.b(x).to(work))).transpose(1, 2)
        if self.w is not None:
            if w_raw is None:
                w_raw = self._w_projection(x).to(work)
                if self.w_conv is not None:
                    w_raw = convolve(self.w_conv, w_raw)
            extra["w"] = F.normalize(self._heads(w_raw.to(work), B, T), dim=-1)
        return extra

    def _w_projection(self, x: torch.Tensor) -> torch.Tensor:
        """``w``'s projection of ``x`` (``(..., d_model) -> (..., H * head_dim)``), low rank when ``w_down`` exists."""
        return self.w(x if self.w_down is None else self.w_down(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (B, T, d_model) -> (B, T, d_model)``, causal."""
        self._check_x(x, "x", 3)
        B, T, _ = x.shape
        form = self.select(x)
        work = self._work(x)
        if self.qkv_conv is None:
            q, k, v = (self._heads(p(x), B, T) for p in (self.q, self.k, self.v))
        else:  # one depthwise convolution over the three projections side by side, then SiLU
            qkv = F.silu(convolve(self.qkv_conv, torch.cat([p(x) for p in (self.q, self.k, self.v)], -1)))
            q, k, v = (self._heads(t, B, T) for t in qkv.chunk(3, dim=-1))
        extra = self.extras(x, work)
        if self.head_norm is not None:  # linear side: unit q and k per head
            q, k = F.normalize(q.to(work), dim=-1), F.normalize(k.to(work), dim=-1)
        if self.keep_extra:  # what the tokens chose (gates, w, beta)
            self.kept = {name: t.detach() for name, t in extra.items()}
        if form == "triton":
            dt = q.dtype if q.dtype == k.dtype == v.dtype else torch.float32
            if dt == torch.float64:  # the kernels take fp32/bf16/fp16
                dt = torch.float32
                extra = {n: t.float() for n, t in extra.items()}
            o = self._core(form, q.to(dt), k.to(dt), v.to(dt), extra)
        else:
            with torch.autocast(device_type=x.device.type, enabled=False):
                o = self._core(form, q.to(work), k.to(work), v.to(work), extra)
        if self.head_norm is not None:
            o = self.head_norm(o.to(work))
        o = o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o(o.to(x.dtype))  # x is fp32 under autocast too; the Linear casts as autocast says

    def _core(self, form: str, q, k, v, extra) -> torch.Tensor:
        args, kwargs = self.core_inputs(q, k, v, extra)
        if form == "triton":
            args = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.float64 else a for a in args]
        return FUNCS[self.mixer][form](*args, **kwargs)

    def core_inputs(self, q, k, v, extra) -> tuple[list, dict]:
        """The positional and keyword arguments of the mechanism's function (any form) for heads ``q, k, v``
        ``(B, H, T, head_dim)`` and per-token quantities ``extra`` (:meth:`extras`), in its order; here
        ``q, k, v`` and the ``per_head`` constant ``(H,)`` where the layer has one."""
        constant = [] if self.per_head is None else [getattr(self, self.per_head[0])]
        return [q, k, v, *constant], {}

    # -- decoding -------------------------------------------------------------------------------------------

    def step(self, x_t: torch.Tensor, cache: DecodeCache | None = None):
        """Decode one token: ``x_t: (B, d_model)`` and the ``cache`` of the tokens before it (``None``: the
        first token) -> ``(y_t: (B, d_model), cache)``, the cache updated with ``x_t`` (the same object).
        ``y_t`` equals ``layer(x)[:, t]`` for ``x`` the tokens decoded so far.  PyTorch only (any device)."""
        self._check_x(x_t, "x_t", 2)
        B = x_t.shape[0]
        if cache is None:
            cache = DecodeCache(batch=B)
        elif not isinstance(cache, DecodeCache):
            raise TypeError(f"`cache` must be a pathedu.layers.DecodeCache or None, got {type(cache).__name__}")
        elif cache.batch != B:
            raise ValueError(f"`cache` holds a batch of {cache.batch}, `x_t` has {B}")
        work = self._work(x_t)
        x1 = x_t[:, None, :]  # (B, 1, d_model)
        if self.qkv_conv is None:
            q, k, v = (self._heads(p(x1), B, 1) for p in (self.q, self.k, self.v))
        else:
            raw = torch.cat([p(x_t) for p in (self.q, self.k, self.v)], -1)
            out, cache.conv["qkv"] = _convolve_step(self.qkv_conv, cache.conv.get("qkv"), raw)
            q, k, v = (self._heads(t[:, None, :], B, 1) for t in F.silu(out).chunk(3, dim=-1))
        w_raw = None
        if self.w is not None:
            w_raw = self._w_projection(x_t).to(work)
            if self.w_conv is not None:
                w_raw, cache.conv["w"] = _convolve_step(self.w_conv, cache.conv.get("w"), w_raw)
            w_raw = w_raw[:, None, :]
        extra = self.extras(x1, work, w_raw)
        q, k, v = q.to(work), k.to(work), v.to(work)
        if self.head_norm is not None:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        with torch.autocast(device_type=x_t.device.type, enabled=False):
            o = self._step_core(q, k, v, {n: t[:, :, 0] for n, t in extra.items()}, cache)  # (B, H, Dh)
        cache.t += 1
        if self.head_norm is not None:
            o = self.head_norm(o)
        return self.o(o.reshape(B, -1).to(x_t.dtype)), cache

    def _step_core(self, q, k, v, extra, cache: DecodeCache) -> torch.Tensor:
        """The mechanism's step on heads ``q, k, v: (B, H, 1, head_dim)`` and this token's per-token quantities
        ``extra`` (``(B, H)`` or ``(B, H, head_dim)``): the output ``(B, H, head_dim)``; updates ``cache``."""
        raise NotImplementedError

    def _kv(self, cache: DecodeCache, cls, q) -> object:
        if cache.kv is None:
            cache.kv = cls((q.shape[0], self.n_heads), self.head_dim, self.head_dim, None, dtype=q.dtype,
                           device=q.device)
        return cache.kv

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, form={self.form!r}"
                + (f", beta_max={self.beta_max}" if self.has_beta else ""))


class _Softmax(TokenMixer):
    """The softmax side's scale: ``head_dim ** -0.5`` (the forms' default)."""

    def _scale(self) -> float:
        return self.head_dim ** -0.5


class NoPEAttention(_Softmax):
    """Softmax attention with no position encoding (causal mask only): ``softmax(Q K^T / sqrt(head_dim)) V``
    (Vaswani et al., 2017; NoPE: Kazemnejad et al., 2023).  Functions: :mod:`pathedu.nope`.  Arguments and shapes:
    :class:`TokenMixer`."""

    mixer = "nope"

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _nope.KVCache, q)
        kv.append(k[:, :, 0], v[:, :, 0])
        return kv.attend(q[:, :, 0], self._scale())


class ALiBiAttention(_Softmax):
    """ALiBi (Press et al., 2022): the logit of key ``j`` seen from query ``i`` gets ``-m_h (i - j)``, with fixed
    per-head slopes ``m_h`` in a geometric sequence (:func:`pathedu.alibi.alibi_slopes`: ``2^(-8h/H)`` for a
    power-of-two ``H``, the paper's interleaving otherwise); no parameter beyond the projections.  Decoding adds
    the bias as the plain KV cache is read.  Functions: :mod:`pathedu.alibi`.  Shapes: :class:`TokenMixer`."""

    mixer, per_head = "alibi", ("slopes", _alibi.alibi_slopes)

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _nope.KVCache, q)
        kv.append(k[:, :, 0], v[:, :, 0])
        t, lam = cache.t, self.slopes.to(q.dtype)[:, None]  # (H, 1)

        def bias(start, end):  # -m_h (t - j) for the cached keys j = start .. end - 1
            return -lam * (t - torch.arange(start, end, device=q.device, dtype=q.dtype))

        return kv.attend(q[:, :, 0], self._scale(), bias=bias)


class ForgettingAttention(_Softmax):
    """The Forgetting Transformer, FoX (Lin et al., 2025): softmax attention whose logit of key ``j`` seen from
    query ``i`` gets ``sum_{s=j+1..i} log f_s``, with a forget gate per head and token
    ``log f_t = log sigmoid(W_f x_t + b_f)`` (the paper's data-dependent scalar gate); ``b_f`` starts at
    ``linspace(2, 6)`` over the heads (gates 0.88 .. 0.9975: long memory first).  Decoding keeps each key's
    cumulative gate (:class:`pathedu.fox.ForgetKVCache`).  Functions: :mod:`pathedu.fox`.  Shapes:
    :class:`TokenMixer`."""

    mixer, gate = "fox", "head"

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, extra["log_f"]], {}

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _fox.ForgetKVCache, q)
        kv.append(k[:, :, 0], v[:, :, 0], extra["log_f"])
        return kv.attend(q[:, :, 0], self._scale())


class RoPEAttention(_Softmax):
    """RoPE (Su et al., 2021): ``q_t`` and ``k_t`` rotated by ``R^t`` before softmax attention, channel pairs
    ``(2n, 2n+1)`` turning by ``t * base^(-2n/head_dim)``, ``base`` = ``rope_base`` (10000, the paper's).
    ``head_dim`` must be even.  Decoding caches rotated keys.  Functions: :mod:`pathedu.rope`.  Shapes:
    :class:`TokenMixer`."""

    mixer = "rope"

    def __init__(self, d_model, n_heads, head_dim=None, *, rope_base: float = 10000.0, **kwargs):
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        if self.head_dim % 2:
            raise ValueError(f"`head_dim` must be even for rope (channel pairs rotate), got {self.head_dim}")
        self.rope_base = _rope.check_base(rope_base)

    def core_inputs(self, q, k, v, extra):
        return [q, k, v], {"base": self.rope_base}

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _nope.KVCache, q)
        q_t, k_t = (_rope.apply_rope(t, base=self.rope_base, offset=cache.t)[:, :, 0] for t in (q, k))
        kv.append(k_t, v[:, :, 0])
        return kv.attend(q_t, self._scale())


class PaTHAttention(_Softmax):
    """PaTH attention (Yang et al., 2025): the logit of key ``j`` seen from query ``i`` is
    ``k_j^T H_{j+1} ... H_i q_i / sqrt(head_dim)`` with ``H_t = I - beta_t w_t w_t^T``.  As in the paper,
    ``w_t`` is a low-rank projection of the token (``d_model -> w_rank -> n_heads * head_dim``, ``w_rank = 32``;
    ``w_rank=None``: one full-rank projection) passed through a short causal convolution (depthwise, filter size
    ``w_conv``, 3 by default; no activation, PyTorch's initialisation) and L2-normalised per head, and
    ``beta_t = beta_max sigmoid(W_b x_t + b_b)`` with ``beta_max = 2`` (reflections reachable); ``b_b`` starts at 0.
    ``w_conv=0`` leaves the convolution out.  Decoding multiplies every cached key by ``H_t`` when token ``t``
    arrives (:class:`pathedu.path.PathKVCache`, chapter 6).  Functions: :mod:`pathedu.path`.  Shapes:
    :class:`TokenMixer`."""

    mixer, has_beta, has_w, default_beta_max = "path", True, True, 2.0

    def __init__(self, d_model, n_heads, head_dim=None, *, w_conv: int = 3, w_rank: int | None = 32, **kwargs):
        super().__init__(d_model, n_heads, head_dim, w_conv=w_conv, w_rank=w_rank, **kwargs)

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, extra["w"], extra["beta"]], {}

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _path.PathKVCache, q)
        kv.step(k[:, :, 0], v[:, :, 0], extra["w"], extra["beta"])
        return kv.attend(q[:, :, 0], self._scale())


class PaTHFoXAttention(PaTHAttention):
    """PaTH-FoX (Yang et al., 2025): PaTH's logits (:class:`PaTHAttention`: ``w`` convolved and normalised,
    ``beta = 2 sigmoid``) plus FoX's cumulative forget gate ``sum_{s=j+1..i} log f_s``,
    ``log f_t = log sigmoid(W_f x_t + b_f)`` (:class:`ForgettingAttention`).  Decoding updates the cached keys by
    ``H_t`` and their gate sums by ``log f_t`` (:class:`pathedu.pathfox.PathForgetKVCache`).  Functions:
    :mod:`pathedu.pathfox`.  Shapes: :class:`TokenMixer`."""

    mixer, gate = "pathfox", "head"

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, extra["w"], extra["beta"], extra["log_f"]], {}

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _pathfox.PathForgetKVCache, q)
        kv.step(k[:, :, 0], v[:, :, 0], extra["w"], extra["beta"], extra["log_f"])
        return kv.attend(q[:, :, 0], self._scale())


class StickBreakingAttention(_Softmax):
    """Stick-breaking attention (Tan et al., 2025): no softmax; with ``z_ij = q_i . k_j / sqrt(head_dim)``, key
    ``j < i`` takes ``sigma(z_ij) prod_{m=j+1..i-1} sigma(-z_im)``, computed in log space with log-sigmoids, and a
    row's weights sum to at most 1.  No position encoding and no parameter beyond the projections, as in the
    paper.  By default the leftover stick ``r_i = prod_{j<i} sigma(-z_ij)`` goes nowhere (chapter 10's
    definition); ``remainder_to_self=True`` adds ``r_i v_i``, the token's own value with the weight nobody took,
    as the paper's released code does (computed beside the kernel by
    :func:`pathedu.stickbreaking.stick_remainder`, a ``T x T`` matrix: O(T^2) memory).  Decoding reads the plain
    KV cache from the newest key back before appending the token
    (:class:`pathedu.stickbreaking.StickBreakingCache`).  Functions: :mod:`pathedu.stickbreaking`.  Shapes:
    :class:`TokenMixer`."""

    mixer = "stickbreaking"

    def __init__(self, d_model, n_heads, head_dim=None, *, remainder_to_self: bool = False, **kwargs):
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        if not isinstance(remainder_to_self, bool):
            raise TypeError(f"`remainder_to_self` must be a bool, got {type(remainder_to_self).__name__}")
        self.remainder_to_self = remainder_to_self

    def _core(self, form, q, k, v, extra):
        o = super()._core(form, q, k, v, extra)
        if not self.remainder_to_self:
            return o
        dt = torch.promote_types(q.dtype, torch.float32)
        r = _sb.stick_remainder(q.to(dt), k.to(dt))  # (B, H, T)
        return (o.to(dt) + r[..., None] * v.to(dt)).to(o.dtype)

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _sb.StickBreakingCache, q)
        o, log_rest = kv.read(q[:, :, 0], self._scale())  # the token is not a key of its own row
        kv.append(k[:, :, 0], v[:, :, 0])
        if self.remainder_to_self:
            o = o + torch.exp(log_rest)[..., None] * v[:, :, 0]
        return o

    def extra_repr(self) -> str:
        return super().extra_repr() + (", remainder_to_self=True" if self.remainder_to_self else "")


class CoPEAttention(_Softmax):
    """CoPE, contextual position encoding (Golovneva et al., 2024): softmax attention with
    ``logit_ij = z_ij + q_i . e(p_ij)``, ``z_ij = q_i . k_j / sqrt(head_dim)``, where the position
    ``p_ij = sum_{m=j..i} sigmoid(z_im)`` counts the gates the query opens from the key to itself (cumulative from
    the right), clamped to ``npos_max - 1``, and ``e(p)`` interpolates linearly between the rows of a learned
    table ``pos_emb: (npos_max, head_dim)``, shared by the heads and initialised to zeros, as in the paper's code.
    ``npos_max`` (default 64) is the most positions the table tells apart.  Decoding recomputes each query's
    counts over a plain KV cache (:class:`pathedu.cope.CopeKVCache`).  Functions: :mod:`pathedu.cope`.  Shapes:
    :class:`TokenMixer`."""

    mixer = "cope"

    def __init__(self, d_model, n_heads, head_dim=None, *, npos_max: int = 64, **kwargs):
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        self.npos_max = check_int(npos_max, "npos_max")
        self.pos_emb = nn.Parameter(torch.zeros(self.npos_max, self.head_dim))

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, self.pos_emb.to(torch.float64 if q.dtype == torch.float64 else torch.float32)], {}

    def _step_core(self, q, k, v, extra, cache):
        kv = self._kv(cache, _cope.CopeKVCache, q)
        kv.append(k[:, :, 0], v[:, :, 0])
        q_t = q[:, :, 0]
        return kv.attend(q_t, self._scale(), q_t @ self.pos_emb.to(q.dtype).T)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", npos_max={self.npos_max}"


class _Linear(TokenMixer):
    """The linear side's step: the recurrent form on one token, from and to the cached state."""

    def _step_core(self, q, k, v, extra, cache):
        args, kwargs = self.core_inputs(q, k, v, {n: t[:, :, None] for n, t in extra.items()})
        o, cache.state = FUNCS[self.mixer]["recurrent"](*args, **kwargs, initial_state=cache.state,
                                                        return_state=True)
        return o[:, :, 0]


class LinearAttention(_Linear):
    """Linear attention (Katharopoulos et al., 2020): ``S_t = S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``.  As the
    linear side's implementations do, ``q`` and ``k`` are L2-normalised per head (after the optional short
    convolution ``short_conv``, SiLU on ``q, k, v`` as flash-linear-attention's) and the output gets a per-head
    RMSNorm: unnormalised linear attention grows with ``T``.  Decoding carries the ``(B, H, head_dim, head_dim)``
    state.  Functions: :mod:`pathedu.nope`.  Shapes: :class:`TokenMixer`."""

    mixer = "linear"


class MultiScaleRetention(_Linear):
    """RetNet's retention (Sun et al., 2023): ``S_t = gamma_h S_{t-1} + v_t k_t^T`` with fixed per-head decays
    ``gamma_h = 1 - 2^(-5-h)``, ``h = 0 .. H-1`` (:func:`pathedu.alibi.retnet_gammas`), ``q, k`` L2-normalised
    and the output RMS-normalised per head (:class:`LinearAttention`); no rotation (the ``xPos`` part of the
    paper is chapter 4's complex recurrence).  Functions: :mod:`pathedu.alibi`.  Shapes: :class:`TokenMixer`."""

    mixer, per_head = "retnet", ("gammas", _alibi.retnet_gammas)


class GatedLinearAttention(_Linear):
    """GLA (Yang et al., 2024): ``S_t = S_{t-1} diag(f_t) + v_t k_t^T`` with a gate per key channel,
    ``log f_t = log sigmoid(W_2 W_1 x_t + b) / 16``: low rank (``W_1: d_model -> 16``) and temperature 16, as in
    the paper; ``b`` starts at 0.  ``q, k`` normalised and the output RMS-normalised per head
    (:class:`LinearAttention`).  Functions: :mod:`pathedu.fox`.  Shapes: :class:`TokenMixer`."""

    mixer, gate = "gla", "channel"

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, extra["log_f"]], {}


class DeltaNet(_Linear):
    """DeltaNet (Schlag et al., 2021; Yang et al., 2024): ``S_t = S_{t-1} (I - beta_t k_t k_t^T) +
    beta_t v_t k_t^T`` with unit keys (``q, k`` L2-normalised per head: the transition is then a contraction) and
    ``beta_t = beta_max sigmoid(W_b x_t + b_b)``, ``beta_max = 1`` (2 gives the negative-eigenvalue variant); the
    output RMS-normalised per head; a short convolution of 4 tokens (and SiLU) on ``q, k, v`` by default, as in
    the paper's implementation (``short_conv=0`` leaves it out; :class:`LinearAttention`).
    ``"auto"`` trains through its Triton form when that has a backward pass (:func:`triton_trains`).  Functions:
    :mod:`pathedu.path`.  Shapes: :class:`TokenMixer`."""

    mixer, has_beta = "deltanet", True

    def __init__(self, d_model, n_heads, head_dim=None, *, short_conv: int = 4, **kwargs):
        super().__init__(d_model, n_heads, head_dim, short_conv=short_conv, **kwargs)

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, extra["beta"]], {}


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet (Yang et al., 2025): DeltaNet (:class:`DeltaNet`) with a forget gate per head and token,
    ``S_t = f_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``log f_t = log sigmoid(W_f x_t + b_f)``,
    ``b_f`` starting at ``linspace(2, 6)`` over the heads; the short convolution of 4 tokens by default, as
    DeltaNet's.  Functions: :mod:`pathedu.pathfox`.  Shapes: :class:`TokenMixer`."""

    mixer, gate = "gated_deltanet", "head"

    def core_inputs(self, q, k, v, extra):
        return [q, k, v, extra["beta"], extra["log_f"]], {}


LAYERS = {
    "nope": NoPEAttention, "alibi": ALiBiAttention, "fox": ForgettingAttention, "rope": RoPEAttention,
    "path": PaTHAttention, "pathfox": PaTHFoXAttention, "stickbreaking": StickBreakingAttention,
    "cope": CoPEAttention, "linear": LinearAttention, "retnet": MultiScaleRetention,
    "gla": GatedLinearAttention, "deltanet": DeltaNet, "gated_deltanet": GatedDeltaNet,
}
