"""The registry of every public form: one line per form, read by the contract test.

A *form* is one way of computing a mechanism (``naive``, ``recurrent``,
``matrix``, ``blockwise``/``chunked``, ``triton``).  Forms of one *family*
compute the same function of ``q, k, v`` and the family's extra arguments;
the family's ``matrix`` form is the reference the others are checked against.

``tests/test_contract.py`` runs every check that all forms share (shapes and
dtypes, agreement with the matrix form, bad input, tuning arguments, autograd,
non-finite causality) over :data:`FORMS`; ``tests/gpu`` imports it too.  A new
chapter registers its forms here (a family, its ``extras``, its tuning
arguments) instead of copying those tests; its own test file keeps only what is
specific to the chapter (references written independently of the module, the
chapter's claims, its helpers).

Import as ``from forms import FORMS, call, matrix_form`` (``tests/`` is on
``sys.path``: see ``tests/conftest.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from pathedu import alibi, cope, fox, nope, path, pathfox, rope, stickbreaking

KINDS = ("naive", "recurrent", "matrix", "blockwise", "chunked", "triton")


@dataclass(frozen=True)
class Form:
    """One public form.

    ``fn(q, k, v, *extras.values(), **tuning_kwargs)``; ``extras(q, k, v, seed)``
    returns the extra positional arguments after ``q, k, v`` (an ordered dict
    name -> tensor, floating like ``q``, on ``q``'s device, with values in their
    valid ranges); ``tuning`` names the keyword arguments that change how the
    form computes, never what (each a positive int); ``even_D``: the head dim of
    ``q, k`` must be even (RoPE rotates channel pairs).
    """

    name: str
    fn: Callable
    family: str
    kind: str
    extras: Callable
    tuning: tuple = ()
    even_D: bool = False

    def __repr__(self) -> str:  # short pytest ids and failure messages
        return f"Form({self.name})"


# ---------------------------------------------------------------------------
# Extra arguments, family by family (seeded; computed in float64 on the CPU, then
# cast to q's dtype and moved to q's device)
# ---------------------------------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 + int(seed))


def _like(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return x.to(device=q.device, dtype=q.dtype)


def _lead_T(q):
    return tuple(q.shape[:-2]), q.shape[-2], q.shape[-1]


def no_extras(q, k, v, seed=0) -> dict:
    return {}


def slope_extras(q, k, v, seed=0) -> dict:
    """ALiBi: one slope per leading index (batch and head), in [0, 0.5]."""
    lead, _, _ = _lead_T(q)
    return {"slope": _like(0.5 * torch.rand(lead, generator=_gen(seed), dtype=torch.float64), q)}


def gamma_extras(q, k, v, seed=0) -> dict:
    """RetNet: one gate per leading index, in [0.5, 1)."""
    lead, _, _ = _lead_T(q)
    return {"gamma": _like(1 - 0.5 * torch.rand(lead, generator=_gen(seed), dtype=torch.float64), q)}


def _log_gates(shape, seed):
    """Log gates of varied strength, logsigmoid(N(2, 1.5^2)): gates ~0.1 .. ~0.999, all < 1."""
    return F.logsigmoid(2.0 + 1.5 * torch.randn(shape, generator=_gen(seed), dtype=torch.float64))


def token_gate_extras(q, k, v, seed=0) -> dict:
    """FoX, GLA/Mamba2 per-token gate: ``log_f: (..., T)``, <= 0."""
    lead, T, _ = _lead_T(q)
    return {"log_f": _like(_log_gates(lead + (T,), seed), q)}


def channel_gate_extras(q, k, v, seed=0) -> dict:
    """GLA per-channel gate: ``log_f: (..., T, D)``, <= 0."""
    lead, T, D = _lead_T(q)
    return {"log_f": _like(_log_gates(lead + (T, D), seed), q)}


def householder_extras(q, k, v, seed=0) -> dict:
    """PaTH, Householder RNN: unit ``w: (..., T, D)`` and ``beta: (..., T)`` in [0, 2]."""
    lead, T, D = _lead_T(q)
    g = _gen(seed)
    w = F.normalize(torch.randn(lead + (T, D), generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(lead + (T,), generator=g, dtype=torch.float64)
    return {"w": _like(w, q), "beta": _like(beta, q)}


def deltanet_extras(q, k, v, seed=0) -> dict:
    """DeltaNet: ``beta: (..., T)`` in [0, 2], and at most ``2 / |k_t|^2`` so that every
    transition ``I - beta_t k_t k_t^T`` has eigenvalues in [-1, 1] (the keys are not unit here)."""
    lead, T, _ = _lead_T(q)
    u = torch.rand(lead + (T,), generator=_gen(seed), dtype=torch.float64)
    k2 = k.detach().to(torch.float64).pow(2).sum(-1).clamp_min(1.0)
    return {"beta": _like(2 * u.to(k2.device) / k2, q)}


def gated_householder_extras(q, k, v, seed=0) -> dict:
    """PaTH-FoX, gated Householder RNN: ``w, beta`` as :func:`householder_extras`, and ``log_f: (..., T)``."""
    return {**householder_extras(q, k, v, seed), **token_gate_extras(q, k, v, seed + 1)}


def gated_deltanet_extras(q, k, v, seed=0) -> dict:
    """Gated DeltaNet: ``beta`` as :func:`deltanet_extras`, and ``log_f: (..., T)``."""
    return {**deltanet_extras(q, k, v, seed), **token_gate_extras(q, k, v, seed + 1)}


def pos_emb_extras(q, k, v, seed=0) -> dict:
    """CoPE: one table of P = 5 position embeddings per leading index, ``pos_emb: (..., 5, D)``, entries
    N(0, 1).  Fewer positions than the contract's longest T, so far keys are clamped to the last row; and
    not 1 or 3, which would make the contract's wrong-shape case broadcastable."""
    lead, _, D = _lead_T(q)
    return {"pos_emb": _like(torch.randn(lead + (5, D), generator=_gen(seed), dtype=torch.float64), q)}


# ---------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------

_SOFTMAX_TUNING = {"recurrent": ("page",), "blockwise": ("block_m", "block_n")}
_LINEAR_TUNING = {"chunked": ("chunk",)}


def _family(module, prefix: str, family: str, extras, kinds, tuning, *, even_D=False) -> list[Form]:
    suffix = ".channel" if family == "gla_channel" else ""  # the per-channel GLA gate: same functions
    return [Form(f"{prefix}_{kind}{suffix}",
                 getattr(module, f"{prefix}_{kind}"), family, kind, extras, tuning.get(kind, ()), even_D)
            for kind in kinds]


_SOFTMAX = ("naive", "recurrent", "matrix", "blockwise", "triton")
_LINEAR = ("naive", "recurrent", "matrix", "chunked", "triton")

FORMS: list[Form] = (
    _family(nope, "nope", "nope", no_extras, _SOFTMAX, _SOFTMAX_TUNING)
    + _family(nope, "linear", "linear", no_extras, _LINEAR, _LINEAR_TUNING)
    + _family(alibi, "alibi", "alibi", slope_extras, _SOFTMAX, _SOFTMAX_TUNING)
    + _family(alibi, "retnet", "retnet", gamma_extras, _LINEAR, _LINEAR_TUNING)
    + _family(fox, "fox", "fox", token_gate_extras, _SOFTMAX, _SOFTMAX_TUNING)
    + _family(fox, "gla", "gla", token_gate_extras, _LINEAR, _LINEAR_TUNING)
    + _family(fox, "gla", "gla_channel", channel_gate_extras, _LINEAR, _LINEAR_TUNING)
    + _family(rope, "rope", "rope", no_extras, _SOFTMAX, _SOFTMAX_TUNING, even_D=True)
    + _family(rope, "complex", "complex", no_extras, _LINEAR, _LINEAR_TUNING, even_D=True)
    + _family(path, "path", "path", householder_extras, _SOFTMAX, {"recurrent": ("page",), "blockwise": ("block",)})
    + _family(path, "householder", "householder", householder_extras, _LINEAR, _LINEAR_TUNING)
    + _family(path, "deltanet", "deltanet", deltanet_extras, _LINEAR, _LINEAR_TUNING)
    # chapter 7
    + _family(pathfox, "pathfox", "pathfox", gated_householder_extras, _SOFTMAX,
              {"recurrent": ("page",), "blockwise": ("block",)})
    + _family(pathfox, "gated_householder", "gated_householder", gated_householder_extras, _LINEAR,
              _LINEAR_TUNING)
    + _family(pathfox, "gated_deltanet", "gated_deltanet", gated_deltanet_extras, _LINEAR, _LINEAR_TUNING)
    # Beyond the six dualities (appendix chapters): softmax sides without a linear dual
    + _family(cope, "cope", "cope", pos_emb_extras, _SOFTMAX, _SOFTMAX_TUNING)
    + _family(stickbreaking, "stickbreaking", "stickbreaking", no_extras, _SOFTMAX, _SOFTMAX_TUNING)
)

FAMILIES: tuple = tuple(dict.fromkeys(f.family for f in FORMS))


def call(form: Form, q, k, v, extras: dict, **kw):
    """``form.fn(q, k, v, *extras.values(), **kw)``."""
    return form.fn(q, k, v, *extras.values(), **kw)


def matrix_form(form: Form) -> Form:
    """The ``matrix`` form of ``form``'s family: the reference every form of the family must match."""
    (ref,) = [f for f in FORMS if f.family == form.family and f.kind == "matrix"]
    return ref


def _self_check() -> None:
    names = [f.name for f in FORMS]
    assert len(names) == len(set(names)), "form names must be unique"
    for family in FAMILIES:
        assert sum(f.kind == "matrix" for f in FORMS if f.family == family) == 1, family
    assert all(f.kind in KINDS for f in FORMS)


_self_check()

# Triton forms with a backward pass: their outputs carry a graph (the contract test checks that every one has).
TRITON_WITH_BACKWARD = {"nope_triton", "alibi_triton", "fox_triton", "rope_triton", "path_triton", "pathfox_triton",
                        "stickbreaking_triton", "cope_triton",
                        "linear_triton", "retnet_triton", "gla_triton", "gla_triton.channel", "complex_triton",
                        "householder_triton", "deltanet_triton", "gated_householder_triton", "gated_deltanet_triton"}
