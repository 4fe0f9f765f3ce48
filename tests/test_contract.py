"""The contract every public form keeps, checked over the registry ``tests/forms.py``.

One test per promise, parametrized over every form (ids: the form's name):

* shapes and dtype for T = 0 and T = 1, leading dims none / (2,) / (2, 3),
  Dv != D, and agreement with the family's matrix form (there and at T = 11;
  float64, fp32 for the Triton forms, with the tolerances of ``tests/helpers.py``);
* bad input (non-tensors, integer or mixed dtypes, mismatched shapes, extras of
  the wrong shape or out of range, ``meta`` tensors) raises ``TypeError`` /
  ``ValueError`` naming the argument in backticks;
* every tuning argument refuses -1, 0, 2.5 and True, naming itself;
* autograd: every PyTorch form's gradients equal the matrix form's (float64,
  T not a multiple of the tuning block); every Triton form has a backward pass,
  its gradients within fp32 rounding of float64 autograd through the matrix
  form, and runs under ``torch.no_grad()`` without a graph;
* non-finite causality: NaN or inf at position t of ``v`` (NaN of ``k``)
  leaves every output before t unchanged.

Chapter test files keep only what is specific to their chapter; a new form is
registered in ``tests/forms.py`` and is then checked here.  Sizes are tiny
(T <= 11, D = 16): the naive forms are Python loops and the Triton forms run in
the interpreter on a CPU.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest
import torch
from forms import FORMS, KINDS, TRITON_WITH_BACKWARD, Form, call, matrix_form
from helpers import TOL_F64, TOL_TRITON, rand_qkv, rel_err

import pathedu

D, DV = 16, 24  # Dv != D everywhere
TUNING_NAMES = ("page", "block_m", "block_n", "chunk", "block")
TORCH_FORMS = [f for f in FORMS if f.kind != "triton"]
TRITON_FORMS = [f for f in FORMS if f.kind == "triton"]
TRITON_BACKWARD = [f for f in TRITON_FORMS if f.name in TRITON_WITH_BACKWARD]


def native_dtype(form: Form) -> torch.dtype:
    """What a form is tested in: float64, or fp32 for the Triton forms (which take no float64)."""
    return torch.float32 if form.kind == "triton" else torch.float64


def tolerance(form: Form) -> float:
    return TOL_TRITON[torch.float32] if form.kind == "triton" else TOL_F64


def make_inputs(form: Form, lead, T, *, seed=0, dtype=None):
    """``q, k, v, extras`` in the form's dtype, and the same in float64 (for the matrix form)."""
    dtype = native_dtype(form) if dtype is None else dtype
    q, k, v = rand_qkv(lead, T, D, DV, seed=seed)
    ex = form.extras(q, k, v, seed)
    lo = tuple(x.to(dtype) for x in (q, k, v)) + ({n: x.to(dtype) for n, x in ex.items()},)
    return lo, (q, k, v, ex)


def params(cases, forms=FORMS):
    """``pytest.param(form, case)`` for every form and case, id ``<form>-<case id>``;
    ``cases`` is a list of ``(id, value)`` or a function of the form returning one."""
    out = []
    for form in forms:
        for cid, case in (cases(form) if callable(cases) else cases):
            out.append(pytest.param(form, case, id=f"{form.name}-{cid}"))
    return out


def names(form: Form) -> list[str]:
    """The names of the extra arguments of ``form`` (read off a call of its ``extras``)."""
    q, k, v = rand_qkv((1,), 2, D, DV)
    return list(form.extras(q, k, v, 0))


# ---------------------------------------------------------------------------
# The registry itself
# ---------------------------------------------------------------------------

FORM_NAME = re.compile(r"^[a-z][a-z0-9_]*_(" + "|".join(KINDS) + r")$")


def public_forms():
    """Every function ``<prefix>_<kind>(q, k, v, ...)`` defined in a top-level module of pathedu."""
    found = set()
    for info in pkgutil.iter_modules(pathedu.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"pathedu.{info.name}")
        for name, fn in vars(module).items():
            if (FORM_NAME.match(name) and inspect.isfunction(fn) and fn.__module__ == module.__name__
                    and list(inspect.signature(fn).parameters)[:3] == ["q", "k", "v"]):
                found.add(fn)
    return found


def test_every_public_form_is_registered():
    registered = {f.fn for f in FORMS}
    missing = sorted(f"{fn.__module__}.{fn.__name__}" for fn in public_forms() - registered)
    assert not missing, f"register these forms in tests/forms.py: {missing}"
    for form in FORMS:
        assert form.name.split(".")[0] == form.fn.__name__ and form.name.split(".")[0].endswith("_" + form.kind)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_registry_entry_matches_the_signature(form):
    """The registered tuning arguments are exactly the form's, and extras are valid inputs."""
    sig = inspect.signature(form.fn)
    tuning = tuple(p for p in sig.parameters if p in TUNING_NAMES)
    assert form.tuning == tuning
    extra_params = [p for p in list(sig.parameters)[3:] if sig.parameters[p].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    q, k, v = rand_qkv((2, 3), 5, D, DV, dtype=torch.float32)
    ex = form.extras(q, k, v, 0)
    assert list(ex) == extra_params
    for x in ex.values():
        assert isinstance(x, torch.Tensor) and x.dtype == q.dtype and x.device == q.device
    assert matrix_form(form).kind == "matrix" and matrix_form(form).family == form.family


# ---------------------------------------------------------------------------
# Shapes, dtype, agreement with the matrix form
# ---------------------------------------------------------------------------

# T = 0 and T = 1 with every leading dims; a longer T (no multiple of anything) with one: the Triton
# interpreter's cost grows with the number of heads, and the kernels flatten the leading dims anyway.
SHAPES = [(f"lead{'x'.join(map(str, lead)) or '-'}_T{T}", (lead, T))
          for lead, T in [((), 0), ((2,), 0), ((2, 3), 0), ((), 1), ((2,), 1), ((2, 3), 1), ((2,), 11)]]


@pytest.mark.parametrize("form, shape", params(SHAPES))
def test_shape_dtype_and_agreement_with_the_matrix_form(form, shape):
    lead, T = shape
    (q, k, v, ex), (q64, k64, v64, ex64) = make_inputs(form, lead, T, seed=T + len(lead))
    out = call(form, q, k, v, ex)
    assert isinstance(out, torch.Tensor)
    assert out.shape == lead + (T, DV) and out.dtype == q.dtype and out.device == q.device
    ref = call(matrix_form(form), q64, k64, v64, ex64)
    assert ref.shape == out.shape
    assert rel_err(out, ref) <= tolerance(form)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

def _other_dtype(x):
    return torch.float32 if x.dtype == torch.float64 else torch.float16


def _set_one(x, value):
    x = x.clone()
    x.view(-1)[x.numel() // 2] = value
    return x


def _transposed(x, lead):
    """The same numbers in a wrong shape: ``(T, B*H, ...)`` for ``(B, H, T, ...)``, ``(H, B)`` for ``(B, H)``."""
    if x.dim() == len(lead):
        return x.reshape(lead[::-1])
    n = len(lead)
    return x.reshape((-1,) + tuple(x.shape[n:])).transpose(0, 1)


GENERIC_BAD = [  # (id, make(q, k, v, ex) -> (q, k, v, ex), exception, needle)
    ("q_not_a_tensor", lambda q, k, v, ex: (q.numpy(), k, v, ex), TypeError, "`q`"),
    ("q_integer", lambda q, k, v, ex: (q.long(), k, v, ex), TypeError, "`q`"),
    ("k_other_dtype", lambda q, k, v, ex: (q, k.to(_other_dtype(k)), v, ex), TypeError, "`k`"),
    ("v_other_dtype", lambda q, k, v, ex: (q, k, v.to(_other_dtype(v)), ex), TypeError, "`v`"),
    ("k_other_lead", lambda q, k, v, ex: (q, k[:, :2], v, ex), ValueError, "`k`"),
    ("v_other_lead", lambda q, k, v, ex: (q, k, v[:1], ex), ValueError, "`v`"),
    ("v_more_dims", lambda q, k, v, ex: (q, k, v[None], ex), ValueError, "`v`"),
    ("k_other_T", lambda q, k, v, ex: (q, k[..., :7, :], v, ex), ValueError, "`k`"),
    ("v_other_T", lambda q, k, v, ex: (q, k, v[..., :7, :], ex), ValueError, "`v`"),
    ("k_other_D", lambda q, k, v, ex: (q, k[..., :8], v, ex), ValueError, "`k`"),
    ("q_1d", lambda q, k, v, ex: (q[0, 0, 0], k, v, ex), ValueError, "`q`"),
    ("all_on_meta", lambda q, k, v, ex: (q.to("meta"), k.to("meta"), v.to("meta"),
                                         {n: x.to("meta") for n, x in ex.items()}), (ValueError, TypeError), "`q`"),
    ("q_on_meta", lambda q, k, v, ex: (q.to("meta"), k, v, ex), (ValueError, TypeError), "`q`"),
]

# Values outside an extra's valid range, by name: (id, value written into one entry).
OUT_OF_RANGE = {
    "log_f": [("positive", 0.5), ("nan", float("nan")), ("neginf", float("-inf"))],
    "beta": [("above_2", 2.5), ("negative", -0.5), ("nan", float("nan"))],
    "gamma": [("above_1", 1.5), ("zero", 0.0), ("nan", float("nan"))],
    "slope": [("negative", -0.1), ("nan", float("nan")), ("inf", float("inf"))],
    "w": [("nan", float("nan")), ("inf", float("inf"))],
    "pos_emb": [("nan", float("nan")), ("inf", float("inf"))],
}

BAD_LEAD, BAD_T = (2, 3), 8


def bad_cases(form: Form):
    cases = [(cid, (make, exc, needle)) for cid, make, exc, needle in GENERIC_BAD]
    for name in names(form):
        needle = f"`{name}`"

        def with_extra(fn, name=name):
            return lambda q, k, v, ex: (q, k, v, {**ex, name: fn(ex[name])})

        cases.append((f"{name}_wrong_shape", (with_extra(lambda x: _transposed(x, BAD_LEAD)), ValueError, needle)))
        for vid, value in OUT_OF_RANGE[name]:
            cases.append((f"{name}_{vid}", (with_extra(lambda x, value=value: _set_one(x, value)), ValueError, needle)))
        cases.append((f"{name}_on_meta", (with_extra(lambda x: x.to("meta")), (ValueError, TypeError), needle)))
    if form.kind == "triton":  # what the kernels take: fp16/bf16/fp32, head dims 16..128
        cases += [
            ("float64", (lambda q, k, v, ex: (q.double(), k.double(), v.double(),
                                             {n: x.double() for n, x in ex.items()}), TypeError, "`q`")),
            ("D_8", (lambda q, k, v, ex: (q[..., :8], k[..., :8], v,  # extras (..., T, D) follow D
                                         {n: x[..., :8] if x.dim() == q.dim() else x for n, x in ex.items()}),
                     ValueError, "`q`")),
            ("Dv_256", (lambda q, k, v, ex: (q, k, v.repeat_interleave(11, -1)[..., :256], ex), ValueError, "`v`")),
        ]
    return cases


@pytest.mark.parametrize("form, case", params(bad_cases))
def test_bad_input_names_the_argument(form, case):
    make, exc, needle = case
    (q, k, v, ex), _ = make_inputs(form, BAD_LEAD, BAD_T, seed=1)
    args = make(q, k, v, ex)
    with pytest.raises(exc, match=re.escape(needle)):
        call(form, *args)


@pytest.mark.parametrize("form, case", params(lambda f: [(f"{n}={v!r}", (n, v)) for n in f.tuning
                                                         for v in (-1, 0, 2.5, True)],
                                              [f for f in FORMS if f.tuning]))
def test_bad_tuning_argument_names_itself(form, case):
    name, value = case
    (q, k, v, ex), _ = make_inputs(form, (2,), 5, seed=2)
    with pytest.raises((ValueError, TypeError), match=re.escape(f"`{name}`")):
        call(form, q, k, v, ex, **{name: value})


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------

GRAD_T, GRAD_BLOCK = 6, 4  # T no multiple of the block: a partial last block


def _leaves(q, k, v, ex):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    return q, k, v, {n: x.detach().clone().requires_grad_() for n, x in ex.items()}


@pytest.mark.parametrize("form", TORCH_FORMS, ids=lambda f: f.name)
def test_gradients_equal_the_matrix_forms(form):
    (q, k, v, ex), _ = make_inputs(form, (2,), GRAD_T, seed=3)
    g = torch.randn(2, GRAD_T, DV, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    grads = {}
    for f, kw in ((form, {name: GRAD_BLOCK for name in form.tuning}), (matrix_form(form), {})):
        leaves = _leaves(q, k, v, ex)
        out = call(f, *leaves, **kw)
        inputs = list(leaves[:3]) + list(leaves[3].values())
        grads[f.name] = torch.autograd.grad((out * g).sum(), inputs)
    labels = ["q", "k", "v"] + list(ex)
    for label, got, want in zip(labels, grads[form.name], grads[matrix_form(form).name]):
        assert rel_err(got, want) <= 1e-10, f"gradient of `{label}`"


def test_every_triton_form_has_a_backward_pass():
    assert TRITON_WITH_BACKWARD == {f.name for f in TRITON_FORMS}


# T = 1 (one key: every gradient of q and k is 0), 37 (no multiple of any block) and 150 (whole blocks after
# the diagonal and a partial last one, with the interpreter's blocks of 64).
@pytest.mark.parametrize("T", [1, 37, 150])
@pytest.mark.parametrize("form", TRITON_BACKWARD, ids=lambda f: f.name)
def test_triton_gradients_match_float64_autograd_through_the_matrix_form(form, T):
    """fp32 kernels (forward and backward) against float64 autograd: every argument's gradient, the gates'
    included, within 5e-3 of the largest reference entry (1e-2 when that is tiny, as at T = 1)."""
    (q, k, v, ex), (q64, k64, v64, ex64) = make_inputs(form, (2,), T, seed=7)
    g = torch.randn(2, T, DV, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    got_leaves, want_leaves = _leaves(q, k, v, ex), _leaves(q64, k64, v64, ex64)
    got = torch.autograd.grad((call(form, *got_leaves) * g.float()).sum(),
                              list(got_leaves[:3]) + list(got_leaves[3].values()))
    want = torch.autograd.grad((call(matrix_form(form), *want_leaves) * g).sum(),
                               list(want_leaves[:3]) + list(want_leaves[3].values()))
    for label, a, b in zip(["q", "k", "v"] + list(ex), got, want):
        assert a.dtype == torch.float32 and a.shape == b.shape, label
        err = (a.double() - b).abs().max().item()
        assert err <= 5e-3 * max(b.abs().max().item(), 1e-2), f"gradient of `{label}`: {err:.2e}"


@pytest.mark.parametrize("form", TRITON_FORMS, ids=lambda f: f.name)
def test_triton_runs_under_no_grad(form):
    (q, k, v, ex), (q64, k64, v64, ex64) = make_inputs(form, (), 5, seed=5)
    q, k, v, ex = _leaves(q, k, v, ex)
    with torch.no_grad():
        out = call(form, q, k, v, ex)
    assert not out.requires_grad
    assert rel_err(out, call(matrix_form(form), q64, k64, v64, ex64)) <= tolerance(form)


# ---------------------------------------------------------------------------
# Non-finite causality
# ---------------------------------------------------------------------------

CAUSAL_T, CAUSAL_AT = 11, 5
STRICTLY_CAUSAL = {"stickbreaking"}  # families whose row i sees keys j < i only: row t never sees position t
POISON = [("nan_v", "v", float("nan")), ("inf_v", "v", float("inf")), ("nan_k", "k", float("nan"))]
_CLEAN = {}  # form name -> (inputs, clean output), shared by the three cases of a form


def _clean_run(form):
    if form.name not in _CLEAN:
        (q, k, v, ex), _ = make_inputs(form, (), CAUSAL_T, seed=6)
        _CLEAN[form.name] = (q, k, v, ex), call(form, q, k, v, ex)
    return _CLEAN[form.name]


@pytest.mark.parametrize("form, case", params([(cid, (which, value)) for cid, which, value in POISON]))
def test_non_finite_input_never_reaches_earlier_outputs(form, case):
    """NaN or inf at position t can only change outputs at positions >= t (the causal mask
    must be a select, not a multiplication by 0: 0 * NaN is NaN)."""
    which, value = case
    (q, k, v, ex), clean = _clean_run(form)
    poisoned = {"k": k, "v": v}
    poisoned[which] = poisoned[which].clone()
    poisoned[which][..., CAUSAL_AT, :] = value
    out = call(form, q, poisoned["k"], poisoned["v"], ex)
    before, want = out[..., :CAUSAL_AT, :], clean[..., :CAUSAL_AT, :]
    assert torch.isfinite(want).all()
    assert torch.isfinite(before).all(), f"{which}[{CAUSAL_AT}] = {value} reached an earlier output"
    tol = 1e-6 if form.kind == "triton" else 1e-12
    assert ((before - want).abs().max() / want.abs().max().clamp_min(1.0)).item() <= tol


@pytest.mark.parametrize("form, case", params([(cid, (which, value)) for cid, which, value in POISON], TRITON_BACKWARD))
def test_a_forward_to_be_differentiated_keeps_non_finite_causality(form, case):
    """The same promise for a call whose inputs require grad (PaTH's forward then runs another kernel: the
    backward's schedule), and the converse: from position t on (t + 1 on, for a strictly causal family), the poisoned
    value's channel is non-finite in every output row (a NaN key reaches some entry of every later row)."""
    which, value = case
    (q, k, v, ex), _ = _clean_run(form)
    leaves = _leaves(q, k, v, ex)
    clean = call(form, *leaves).detach()
    q, k, v, ex = _leaves(q, k, v, ex)
    poisoned = {"k": k.detach().clone(), "v": v.detach().clone()}
    poisoned[which][..., CAUSAL_AT, :] = value
    k, v = (poisoned[n].requires_grad_() for n in "kv")
    out = call(form, q, k, v, ex)
    assert out.grad_fn is not None
    out = out.detach()
    assert torch.isfinite(clean).all() and torch.isfinite(out[..., :CAUSAL_AT, :]).all()
    assert ((out[..., :CAUSAL_AT, :] - clean[..., :CAUSAL_AT, :]).abs().max() / clean.abs().max()).item() <= 1e-6
    later = out[..., CAUSAL_AT + (form.family in STRICTLY_CAUSAL):, :]
    if which == "v":
        assert not torch.isfinite(later).all(-1).any(), f"{which}[{CAUSAL_AT}] = {value} missed a later output"
    else:
        assert (~torch.isfinite(later)).any(-1).all(), f"{which}[{CAUSAL_AT}] = {value} missed a later output"
