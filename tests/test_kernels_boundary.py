"""The kernel boundary: every entry point of ``pathedu.kernels`` on its own.

* non-finite causality: a NaN or inf in ``q``, ``k`` or ``v`` at position t leaves
  every output before t bit-identical, and does reach the outputs that see it
  (so nothing is hidden either);
* validation: shapes (``log_f`` layouts, ``w``, ``beta``, per-head slopes and
  gammas), values (with the argument named in backticks), tuning arguments;
* refusals: meta tensors, and inputs that require grad while grad mode is on;
* at most one host synchronisation per public call, and no copy of inputs that
  are already contiguous fp32.

On a CPU the kernels run in Triton's interpreter: sizes stay small (T <= 80).
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch
from helpers import rand_qkv

from pathedu import alibi, fox, nope, path, rope
from pathedu.kernels import _launch
from pathedu.kernels.delta_rule import chunked_delta_rule, chunked_householder
from pathedu.kernels.flash_attention import attention, biased_attention
from pathedu.kernels.linear_attention import chunked_linear_attention, gated_linear_attention
from pathedu.kernels.path_attention import path_attention
from pathedu.kernels.rope import rotary_attention, rotary_linear_attention, rotate_qk

LEAD, T, D, DV = (1, 2), 80, 16, 24
AT = 37  # the poisoned position: inside a block/chunk, not on a boundary


def extras(seed=0):
    """Valid extra arguments for LEAD, T, D (fp32)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.functional.normalize(torch.randn(*LEAD, T, D, generator=g), dim=-1)
    beta = 2 * torch.rand(*LEAD, T, generator=g)
    log_f = -torch.rand(*LEAD, T, generator=g)
    log_f_channel = -torch.rand(*LEAD, T, D, generator=g)
    return dict(w=w, beta=beta, log_f=log_f, log_f_channel=log_f_channel)


# name -> (call(q, k, v, ex), softmax?)  Every public entry point, each hook.
ENTRIES = {
    "attention": (lambda q, k, v, ex: attention(q, k, v), True),
    "attention_alibi": (lambda q, k, v, ex: attention(q, k, v, alibi_slope=torch.tensor([0.3, 0.05])), True),
    "attention_loggate": (lambda q, k, v, ex: attention(q, k, v, log_f=ex["log_f"]), True),
    "linear": (lambda q, k, v, ex: chunked_linear_attention(q, k, v), False),
    "linear_chunk16": (lambda q, k, v, ex: chunked_linear_attention(q, k, v, chunk=16), False),
    "linear_scalar": (lambda q, k, v, ex: chunked_linear_attention(q, k, v, log_f=ex["log_f"]), False),
    "linear_channel": (lambda q, k, v, ex: chunked_linear_attention(q, k, v, log_f=ex["log_f_channel"]), False),
    "linear_gamma": (lambda q, k, v, ex: gated_linear_attention(q, k, v, "gamma", 0.9), False),
    "path": (lambda q, k, v, ex: path_attention(q, k, v, ex["w"], ex["beta"]), True),
    "path_block16_R2": (lambda q, k, v, ex: path_attention(q, k, v, ex["w"], ex["beta"], block=16,
                                                          _config=dict(R=2)), True),
    "householder": (lambda q, k, v, ex: chunked_householder(q / 4, k / 4, v, ex["w"], ex["beta"], chunk=32), False),
    "delta": (lambda q, k, v, ex: chunked_delta_rule(q / 4, torch.nn.functional.normalize(k, dim=-1), v,
                                                    ex["beta"] / 2, chunk=16), False),
    "rotary": (lambda q, k, v, ex: rotary_attention(q, k, v), True),
    "rotary_linear": (lambda q, k, v, ex: rotary_linear_attention(q, k, v), False),
}


def inputs(seed=0):
    q, k, v = rand_qkv(LEAD, T, D, DV, dtype=torch.float32, seed=seed)
    return q, k, v, extras(seed)


# ---------------------------------------------------------------------------
# Non-finite causality
# ---------------------------------------------------------------------------

# +inf in v and inf in k are left to test_infinities_of_both_signs_give_nan_softmax and to the
# contract test (NaN/+inf in v, NaN in k, for every Triton form): the interpreter is slow.
POISONS = [("v", float("nan")), ("v", float("-inf")), ("k", float("nan")), ("q", float("nan"))]


@pytest.mark.parametrize("which, value", POISONS, ids=lambda x: str(x))
@pytest.mark.parametrize("name", ENTRIES)
def test_non_finite_input_changes_only_later_outputs(name, which, value):
    call, softmax = ENTRIES[name]
    q, k, v, ex = inputs(seed=1)
    clean = call(q, k, v, ex)
    assert torch.isfinite(clean).all()
    x = {"q": q, "k": k, "v": v}
    x[which] = x[which].clone()
    d = 3  # one channel of one head, as in a real overflow
    x[which][0, 1, AT, d] = value
    out = call(x["q"], x["k"], x["v"], ex)
    # Every output before AT is bit-identical (the other head entirely).
    assert torch.equal(out[..., :AT, :], clean[..., :AT, :])
    assert torch.equal(out[0, 0], clean[0, 0])
    seen = out[0, 1, AT:]
    if which == "q":  # a query changes its own row only
        assert not torch.isfinite(out[0, 1, AT]).all()
        assert torch.equal(out[0, 1, AT + 1:], clean[0, 1, AT + 1:])
    elif which == "k":  # the row at AT sees the key at AT (an infinite logit of -inf is a weight of 0)
        if value != value or not softmax:
            assert not torch.isfinite(out[0, 1, AT]).all()
    else:  # a value reaches every row that sees it, in its channel only
        others = torch.cat([seen[:, :d], seen[:, d + 1:]], dim=1)
        assert torch.isfinite(others).all()
        if value != value or not softmax:
            assert seen[:, d].isnan().all()  # NaN; the linear kernels do not track signs: NaN too
        else:
            assert (seen[:, d] == value).all()  # a positive weight times +-inf (IEEE)


# The linear template's entry points with a backward pass, each hook once (small chunks: several per sequence).
LINEAR_BACKWARD = {
    "linear": lambda q, k, v, ex: chunked_linear_attention(q, k, v, chunk=16),
    "linear_scalar": lambda q, k, v, ex: chunked_linear_attention(q, k, v, log_f=ex["log_f"], chunk=32),
    "linear_channel": lambda q, k, v, ex: chunked_linear_attention(q, k, v, log_f=ex["log_f_channel"]),
    "rotary_linear": lambda q, k, v, ex: rotary_linear_attention(q, k, v, rotation="fused"),
}
# Which rows of dq, dk, dv a NaN at position AT of q, k or v reaches (o_i = sum_{j <= i} w_ij (q_i . k_j) v_j):
# dq_i reads k_j, v_j for j <= i; dk_j reads q_i (i >= j) and v_j; dv_j reads q_i (i >= j) and k_j.
REACH = {"v": dict(q="later", k="at", v="none"), "k": dict(q="later", k="none", v="at"),
         "q": dict(q="none", k="earlier", v="earlier")}


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("name", list(LINEAR_BACKWARD))
def test_non_finite_input_reaches_only_the_gradients_that_read_it(name, which):
    """A NaN at position AT of q, k or v (one channel) makes non-finite exactly the gradient rows that read it
    (:data:`REACH`), and leaves every other row of dq, dk, dv as in the clean run: the backward's causal masks are
    selects too (the gates' gradient, a sum over every later position, is not checked)."""
    q, k, v, ex = inputs()
    g = torch.randn(*LEAD, T, DV, generator=torch.Generator().manual_seed(3))

    def grads(q, k, v):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        return torch.autograd.grad(LINEAR_BACKWARD[name](*leaves, ex), leaves, g)

    clean = grads(q, k, v)
    poisoned = dict(q=q, k=k, v=v)
    poisoned[which] = poisoned[which].clone()
    poisoned[which][..., AT, 3] = float("nan")
    rows = torch.arange(T)
    for grad_of, got, want in zip("qkv", grads(**poisoned), clean):
        reach = {"none": rows < 0, "at": rows == AT, "later": rows >= AT, "earlier": rows <= AT}[REACH[which][grad_of]]
        bad = ~torch.isfinite(got).all(-1)  # (*LEAD, T): rows with a non-finite entry
        assert bad[..., reach].all(), f"d{grad_of}: a row that reads {which}[{AT}] stayed finite"
        assert not bad[..., ~reach].any(), f"d{grad_of}: {which}[{AT}] reached a row that does not read it"
        scale = want.abs().max()
        assert ((got - want)[..., ~reach, :].abs().max() / scale).item() <= 1e-6, f"d{grad_of} changed"


def test_non_finite_values_on_every_diagonal_row():
    """A NaN at the edges and across the inside of a diagonal block, in turn (FlashAttention: one
    64-row block here; PaTH: 16-row UT blocks, two per query block, so 15/16/31/32 cross block edges)."""
    q, k, v, ex = inputs(seed=2)
    q, k, v = q[..., :40, :], k[..., :40, :], v[..., :40, :]
    w, beta = ex["w"][..., :40, :], ex["beta"][..., :40]
    forms = [lambda v_: attention(q, k, v_), lambda v_: path_attention(q, k, v_, w, beta, block=16, _config=dict(R=2))]
    for f in forms:
        clean = f(v)
        for t in (0, 1, 7, 15, 16, 17, 31, 32, 39):
            vp = v.clone()
            vp[..., t, 0] = float("nan")
            out = f(vp)
            assert torch.equal(out[..., :t, :], clean[..., :t, :]), t
            assert out[..., t:, 0].isnan().all() and torch.isfinite(out[..., 1:]).all(), t


def test_infinities_of_both_signs_give_nan_softmax():
    q, k, v, _ = inputs(seed=3)
    v = v.clone()
    v[..., 10, 2] = float("inf")
    v[..., 20, 2] = float("-inf")
    out = attention(q, k, v)
    assert (out[..., 10:20, 2] == float("inf")).all()
    assert out[..., 20:, 2].isnan().all()


# ---------------------------------------------------------------------------
# Shapes and values: bad input names the argument
# ---------------------------------------------------------------------------

def test_attention_refuses_log_f_in_another_layout():
    q, k, v, _ = inputs()
    good = -torch.rand(*LEAD, T)
    for bad in (good.reshape(-1, T).T.contiguous(),      # (T, B*H): the same element count
                good.reshape(-1, T),                       # (B*H, T)
                good[..., :-1], good[None], torch.zeros(7)):
        with pytest.raises(ValueError, match="`log_f`"):
            attention(q, k, v, log_f=bad)
    with pytest.raises(TypeError, match="`log_f`"):
        attention(q, k, v, log_f=-0.5)
    with pytest.raises(TypeError, match="`log_f`"):
        attention(q, k, v, log_f=good.long())
    with pytest.raises(ValueError, match="at most one"):
        attention(q, k, v, log_f=good, alibi_slope=0.1)


@pytest.mark.parametrize("value, needle", [(0.5, r"`log_f` must be <= 0"), (float("nan"), "`log_f`"),
                                           (float("-inf"), "`log_f` must be finite")])
def test_log_gate_values_are_checked_at_every_entry(value, needle):
    q, k, v, ex = inputs()
    for log_f in (ex["log_f"].clone(), ex["log_f_channel"].clone()):
        log_f[0, 1, 5] = value
        if log_f.dim() == 3:
            with pytest.raises(ValueError, match=needle):
                attention(q, k, v, log_f=log_f)
        with pytest.raises(ValueError, match=needle):
            chunked_linear_attention(q, k, v, log_f=log_f)
    # The UT kernels: Gated DeltaNet's gate is counted by its preparation pass as it reads it (every row, the
    # last, partial block's too); PaTH-FoX's and the gated Householder RNN's by a reduction of their own.
    kn = torch.nn.functional.normalize(k, dim=-1)
    for t in (0, T - 1):
        log_f = ex["log_f"].clone()
        log_f[-1, -1, t] = value
        for call in (lambda: chunked_delta_rule(q, kn, v, ex["beta"] / 2, log_f=log_f),
                     lambda: path_attention(q, k, v, ex["w"], ex["beta"], log_f=log_f),
                     lambda: chunked_householder(q / 4, k / 4, v, ex["w"], ex["beta"], log_f=log_f)):
            with pytest.raises(ValueError, match=needle):
                call()


def test_linear_refuses_bad_gate_shapes_and_chunks():
    q, k, v, _ = inputs()
    for bad in (torch.zeros(*LEAD, T, DV), torch.zeros(*LEAD, T, D, 1), torch.zeros(T), torch.zeros(*LEAD, T - 1)):
        with pytest.raises(ValueError, match="`log_f`"):
            chunked_linear_attention(q, k, v, log_f=bad)
    for chunk, exc in [(48, ValueError), (256, ValueError), (0, ValueError), (8, ValueError), (2.0, TypeError),
                       (True, TypeError)]:
        with pytest.raises(exc, match="`chunk`"):
            chunked_linear_attention(q, k, v, chunk=chunk)
    with pytest.raises(ValueError, match="`gate`"):
        gated_linear_attention(q, k, v, "cosine", None)


def test_per_head_arguments():
    q, k, v, _ = inputs()
    for slope in (-0.1, float("nan"), float("inf"), torch.tensor([0.1, -1.0])):
        with pytest.raises(ValueError, match="`alibi_slope`"):
            attention(q, k, v, alibi_slope=slope)
        with pytest.raises(ValueError, match="`slope`"):
            biased_attention(q, k, v, "alibi", slope, name="slope")
    with pytest.raises(ValueError, match="`alibi_slope`.*broadcast"):
        attention(q, k, v, alibi_slope=torch.ones(3))
    for slope in ("0.1", True, torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=torch.complex64)):
        with pytest.raises(TypeError, match="`alibi_slope`"):
            attention(q, k, v, alibi_slope=slope)
    for gamma in (0.0, 1.5, float("nan"), torch.tensor([0.9, -0.1])):
        with pytest.raises(ValueError, match="`gamma`"):
            gated_linear_attention(q, k, v, "gamma", gamma)
    with pytest.raises(TypeError, match="`gamma`"):
        gated_linear_attention(q, k, v, "gamma", None)


def test_path_and_delta_values_and_shapes():
    q, k, v, ex = inputs()
    w, beta = ex["w"], ex["beta"]
    for f in (path_attention, chunked_householder):
        # w's check is a count made by the preparation pass as it reads w: every row, the last (partial) block's
        # too, every sign of infinity
        for t, bad in [(3, float("inf")), (0, float("nan")), (T - 1, float("-inf"))]:
            bad_w = w.clone()
            bad_w[-1, -1, t, -1] = bad
            with pytest.raises(ValueError, match="`w` must be finite"):
                f(q, k, v, bad_w, beta)
        with pytest.raises(ValueError, match="`w`"):
            f(q, k, v, w.transpose(-1, -2), beta)
        for b in (beta + 2.5, -beta, beta.masked_fill(beta > 1, float("nan"))):
            with pytest.raises(ValueError, match=r"`beta` must lie in \[0, 2\]"):
                f(q, k, v, w, b)
        with pytest.raises(ValueError, match="`beta`"):
            f(q, k, v, w, beta.reshape(-1, T).T)
    with pytest.raises(ValueError, match="`beta`"):
        chunked_delta_rule(q, k, v, beta + 2.5)
    for bad, exc in [(48, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="`chunk`"):
            chunked_delta_rule(q, k, v, beta, chunk=bad)
        with pytest.raises(exc, match="`block`"):
            path_attention(q, k, v, w, beta, block=bad)


def test_chapter_forms_name_their_own_arguments():
    """The Triton forms pass their argument names to the kernel entry points."""
    q, k, v, ex = inputs()
    with pytest.raises(ValueError, match="`slope`"):
        alibi.alibi_triton(q, k, v, -1.0)
    with pytest.raises(TypeError, match="`slope`"):
        alibi.alibi_triton(q, k, v, None)
    with pytest.raises(ValueError, match="`gamma`"):
        alibi.retnet_triton(q, k, v, 1.5)
    with pytest.raises(TypeError, match="`log_f`"):
        fox.fox_triton(q, k, v, None)
    with pytest.raises(TypeError, match="`log_f`"):
        fox.gla_triton(q, k, v, None)
    with pytest.raises(ValueError, match="`beta`"):
        path.deltanet_triton(q, k, v, ex["beta"] + 3)
    with pytest.raises(ValueError, match="`q` must have an even head dim"):
        rope.rope_triton(q[..., :15], k[..., :15], v)


# ---------------------------------------------------------------------------
# Refusals: meta tensors, inputs that require grad
# ---------------------------------------------------------------------------

def _all_calls(q, k, v, ex, slope):
    """(argument name, call) for every tensor argument of every entry point."""
    return [
        ("q", lambda: attention(q, k, v)), ("k", lambda: chunked_linear_attention(q, k, v)),
        ("v", lambda: rotary_attention(q, k, v)), ("q", lambda: rotate_qk(q, k)),
        ("log_f", lambda: attention(q, k, v, log_f=ex["log_f"])),
        ("log_f", lambda: chunked_linear_attention(q, k, v, log_f=ex["log_f_channel"])),
        ("alibi_slope", lambda: attention(q, k, v, alibi_slope=slope)),
        ("gamma", lambda: gated_linear_attention(q, k, v, "gamma", slope)),
        ("w", lambda: path_attention(q, k, v, ex["w"], ex["beta"])),
        ("beta", lambda: chunked_delta_rule(q, torch.nn.functional.normalize(k, dim=-1), v, ex["beta"])),
        ("w", lambda: chunked_householder(q, k, v, ex["w"], ex["beta"])),
    ]


def _with(name, q, k, v, ex, slope, change):
    x = dict(q=q, k=k, v=v, alibi_slope=slope, gamma=slope, **ex)
    x[name] = change(x[name])
    if name in ("log_f",):
        x["log_f_channel"] = change(x["log_f_channel"])
    return x["q"], x["k"], x["v"], {n: x[n] for n in ex}, x["alibi_slope"] if name != "gamma" else x["gamma"]


# Every entry point of _all_calls has a backward pass (the softmax template, the rotation, PaTH, the linear template's
# gates, the delta rule and the Householder RNN).
WITH_BACKWARD = set(range(11))


def test_a_kernel_without_a_backward_pass_refuses_inputs_that_require_grad():
    """The boundary's rule for a kernel without a backward pass (``backward=False``): an input that requires grad is
    refused by name while grad mode is on, and taken under ``torch.no_grad()``."""
    from pathedu.kernels._launch import prepare_qkv

    q, k, v, _ = inputs()
    with pytest.raises(RuntimeError, match=r"`k` requires grad.*no backward.*no_grad"):
        prepare_qkv(q, k.clone().requires_grad_(), v)
    with torch.no_grad():
        assert prepare_qkv(q, k.clone().requires_grad_(), v).k.shape == k.reshape(-1, *k.shape[-2:]).shape


@pytest.mark.parametrize("index", sorted(WITH_BACKWARD))
def test_inputs_that_require_grad_get_a_backward_pass(index):
    """The output carries a graph back to the argument; under no_grad it carries none."""
    q, k, v, ex = inputs()
    slope = torch.tensor([0.5, 0.9])
    name, _ = _all_calls(q, k, v, ex, slope)[index]
    args = _with(name, q, k, v, ex, slope, lambda t: t.clone().requires_grad_())
    leaves = dict(q=args[0], k=args[1], v=args[2], alibi_slope=args[4], gamma=args[4], **args[3])
    leaf = leaves["log_f_channel" if index == 5 else name]  # call 5 takes the per-channel gates
    _, call = _all_calls(*args)[index]
    out = call()
    out = out if isinstance(out, torch.Tensor) else out[0]
    assert out.grad_fn is not None
    (grad,) = torch.autograd.grad(out.sum(), leaf)
    assert grad.shape == leaf.shape and torch.isfinite(grad).all()
    with torch.no_grad():
        out = call()
    out = out if isinstance(out, torch.Tensor) else out[0]
    assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize("index", range(11))
def test_meta_tensors_are_refused(index):
    q, k, v, ex = inputs()
    slope = torch.tensor([0.5, 0.9])
    name, _ = _all_calls(q, k, v, ex, slope)[index]
    args = _with(name, q, k, v, ex, slope, lambda t: t.to("meta"))
    _, call = _all_calls(*args)[index]
    with pytest.raises(ValueError, match=rf"`{name}` is on the meta device"):
        call()


# ---------------------------------------------------------------------------
# One host synchronisation per public call; no needless copies
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def count_host_syncs():
    """Count the calls, made from pathedu's own code, that read a tensor's value on the host."""
    here = (os.sep + "pathedu" + os.sep, os.sep + "kernels" + os.sep)
    counts = []
    originals = {n: getattr(torch.Tensor, n) for n in ("item", "tolist", "__bool__", "__float__", "__int__")}

    def wrap(name, fn):
        def counted(self, *a, **kw):
            import sys

            caller = sys._getframe(1).f_code.co_filename
            if any(h in caller for h in here):
                counts.append((name, caller))
            return fn(self, *a, **kw)
        return counted

    for n, fn in originals.items():
        setattr(torch.Tensor, n, wrap(n, fn))
    try:
        yield counts
    finally:
        for n, fn in originals.items():
            setattr(torch.Tensor, n, fn)


def test_at_most_one_host_sync_per_public_call():
    q, k, v, ex = inputs()
    calls = {name: (lambda c=c: c(q, k, v, ex)) for name, (c, _) in ENTRIES.items()}
    calls.update({
        "nope_triton": lambda: nope.nope_triton(q, k, v), "linear_triton": lambda: nope.linear_triton(q, k, v),
        "alibi_triton": lambda: alibi.alibi_triton(q, k, v, torch.tensor([0.1, 0.2])),
        "retnet_triton": lambda: alibi.retnet_triton(q, k, v, 0.9),
        "fox_triton": lambda: fox.fox_triton(q, k, v, ex["log_f"]),
        "gla_triton": lambda: fox.gla_triton(q, k, v, ex["log_f_channel"]),
        "rope_triton": lambda: rope.rope_triton(q, k, v), "complex_triton": lambda: rope.complex_triton(q, k, v),
        "path_triton": lambda: path.path_triton(q, k, v, ex["w"], ex["beta"]),
        "householder_triton": lambda: path.householder_triton(q / 4, k / 4, v, ex["w"], ex["beta"]),
        "deltanet_triton": lambda: path.deltanet_triton(q, k, v, ex["beta"] / 2),
        "rotate_qk": lambda: rotate_qk(q, k),
    })
    for name, call in calls.items():
        with count_host_syncs() as syncs:
            call()
        assert len(syncs) <= 1, (name, syncs)
    with count_host_syncs() as syncs:  # no value to check: no sync at all
        attention(q, k, v)
        chunked_linear_attention(q, k, v)
        rotary_attention(q, k, v)
    assert syncs == []


def test_no_copy_of_contiguous_fp32_inputs():
    q, k, v, ex = inputs()
    x = _launch.prepare_qkv(q, k, v)
    assert x.q.data_ptr() == q.data_ptr() and x.k.data_ptr() == k.data_ptr() and x.v.data_ptr() == v.data_ptr()
    assert _launch.per_token(ex["log_f"], "log_f", x).data_ptr() == ex["log_f"].data_ptr()
    assert _launch.per_token(ex["w"], "w", x, extra=(D,)).data_ptr() == ex["w"].data_ptr()
    # One copy where dtype and layout both change: the result is contiguous fp32 with the same values.
    t = ex["log_f"].double().transpose(0, 1)
    r = _launch.as_rows(t, (2, T), torch.float32)
    assert r.is_contiguous() and r.dtype == torch.float32 and torch.equal(r, t.float().reshape(2, T))


def test_chapter_triton_forms_validate_q_k_v_once(monkeypatch):
    """A Triton form validates nothing itself: ``check_qkv`` runs once per call (composed forms included)."""
    from pathedu.checks import check_qkv

    calls = []

    def counted(*a):
        calls.append(1)
        return check_qkv(*a)

    for module in (_launch, nope, alibi, fox, rope, path):
        monkeypatch.setattr(module, "check_qkv", counted, raising=False)
    q, k, v, ex = inputs()
    forms = [(nope.nope_triton, ()), (nope.linear_triton, ()), (alibi.alibi_triton, (0.1,)),
             (alibi.retnet_triton, (0.9,)), (fox.fox_triton, (ex["log_f"],)), (fox.gla_triton, (ex["log_f"],)),
             (rope.rope_triton, ()), (rope.complex_triton, ()), (path.path_triton, (ex["w"], ex["beta"])),
             (path.householder_triton, (ex["w"], ex["beta"])), (path.deltanet_triton, (ex["beta"],))]
    for form, args in forms:
        calls.clear()
        form(q, k, v, *args)
        assert len(calls) == 1, form.__name__


# ---------------------------------------------------------------------------
# The backward kernel's tiles
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bias", ["none", "alibi", "loggate"])
def test_backward_tiles_do_not_change_the_gradients(bias):
    """Outer blocks larger than the inner tiles (as the GPU's autotuned configs have them) give the gradients
    of equal tiles: the diagonal region is several masked inner tiles, and T = 150 ends in a partial one."""
    from pathedu.kernels._launch import prepare_qkv
    from pathedu.kernels.flash_attention import _attention_bwd_launch, attention_launch

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 150, 16, generator=g) for _ in range(3))
    x = prepare_qkv(q, k, v)
    bias_arg = {"none": None, "alibi": torch.tensor([0.2, 0.05]),
                "loggate": torch.cumsum(torch.nn.functional.logsigmoid(torch.randn(2, 150, generator=g) + 2), -1)}[bias]
    lse = torch.empty(2, 150)
    out = attention_launch(x, 0.25, bias, bias_arg, lse=lse)
    do = torch.randn(2, 150, 16, generator=g)
    equal = _attention_bwd_launch(x, do, out, lse, 0.25, bias, bias_arg, _config=dict(OUTER=64, INNER=64))
    nested = _attention_bwd_launch(x, do, out, lse, 0.25, bias, bias_arg, _config=dict(OUTER=64, INNER=32))
    for a, b in zip(equal, nested):
        assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    # FlashAttention-2's single pass (dQ and the row sums by atomic adds, the key role alone): the same gradients.
    for tiles in (dict(OUTER=64, INNER=64), dict(OUTER=64, INNER=32)):
        single = _attention_bwd_launch(x, do, out, lse, 0.25, bias, bias_arg, _config=tiles, atomic_dq=True)
        for a, b in zip(equal, single):
            assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    if bias == "none":
        return
    # The row sums of dz are zero only for the exact output.  With a stored output rounded as a bf16 forward
    # rounds it, delta = dO . O is off, and the row sums carry that error (and cancel it in the gate's gradient,
    # rows - cols): both passes must form them, not assume zero.
    rounded = out.to(torch.bfloat16).float()
    two = _attention_bwd_launch(x, do, rounded, lse, 0.25, bias, bias_arg, _config=dict(OUTER=64, INNER=64))
    one = _attention_bwd_launch(x, do, rounded, lse, 0.25, bias, bias_arg, _config=dict(OUTER=64, INNER=32),
                                atomic_dq=True)
    assert two[3].abs().max() > 1e-3 * two[4].abs().max()  # not zero
    for a, b in zip(two, one):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_backward_takes_the_single_pass_where_it_was_measured_faster(monkeypatch):
    """The default dispatch: the single pass (atomic dQ) for attention without a bias from SINGLE_PASS_MIN_T
    tokens, the two roles otherwise; the argument ``atomic_dq`` overrides it.  Through the public form, with the
    threshold lowered so that the interpreter reaches it: the same gradients either way."""
    from pathedu import nope
    from pathedu.kernels import flash_attention as fa

    assert fa.single_pass("none", fa.SINGLE_PASS_MIN_T) and not fa.single_pass("none", fa.SINGLE_PASS_MIN_T - 1)
    assert not fa.single_pass("loggate", 10 ** 6) and not fa.single_pass("alibi", 10 ** 6)
    with pytest.raises(TypeError, match="`atomic_dq` must be True, False or None"):
        fa.attention(*(torch.randn(1, 1, 4, 16) for _ in range(3)), atomic_dq=1)

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 150, 16, generator=g) for _ in range(3))
    do = torch.randn(1, 2, 150, 16, generator=g)
    calls = []
    real = fa._attention_bwd_launch

    def spy(*args, **kwargs):
        calls.append(fa.single_pass(args[5], args[0].n.T) if kwargs.get("atomic_dq") is None else kwargs["atomic_dq"])
        return real(*args, **kwargs)

    monkeypatch.setattr(fa, "_attention_bwd_launch", spy)
    grads = []
    monkeypatch.setattr(fa, "SINGLE_PASS_MIN_T", 64)
    for atomic in (None, False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = nope.nope_triton(*leaves) if atomic is None else fa.attention(*leaves, atomic_dq=atomic)
        grads.append(torch.autograd.grad(out, leaves, do))
    assert calls == [True, False, True]
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_checked_after_reads_conditions_around_the_launch():
    from pathedu.checks import checked_after, range_condition
    x = torch.tensor([0.5, 1.5])
    ran = []
    with checked_after(range_condition(x, "x", 0.0, 2.0), None):
        ran.append(1)
    assert ran == [1]
    # A failing condition raises on leaving the block, after the body (as on a GPU, where the body's kernels
    # are queued before the host reads the check: one read for every condition).
    with pytest.raises(ValueError, match=r"`x` must lie in \[0, 1\]; found 1.5"):
        with checked_after(range_condition(x, "x", 0.0, 1.0)):
            ran.append(2)
    assert ran == [1, 2]
    # An error of the body itself is not hidden when the values are good; a bad value's error names its cause.
    with pytest.raises(KeyError):
        with checked_after(range_condition(x, "x", 0.0, 2.0)):
            raise KeyError("body")
    with pytest.raises(ValueError, match="`x` must lie") as info:
        with checked_after(range_condition(x, "x", 0.0, 1.0)):
            raise KeyError("body")
    assert isinstance(info.value.__cause__, KeyError)


def test_checked_after_defers_a_condition_a_kernel_counts():
    """``defer``: conditions whose two numbers a kernel of the body wrote into one tensor (counts of what breaks
    them) are read with the others, once; a ``None`` condition's place is skipped; the first failing condition,
    in the order given, raises; ``stats`` must hold exactly two numbers per condition."""
    from pathedu.checks import checked_after, finite_condition, range_condition
    w = torch.tensor([1.0, float("nan"), 2.0])
    x = torch.tensor([0.5, 1.5])
    counts = torch.tensor([0.0, 0.0, 9.0, 9.0, 0.0, 0.0])  # w: 0; a skipped place; x: 0
    with checked_after(range_condition(x, "x", 0.0, 2.0)) as check:
        check.defer(finite_condition(w, "w", counted=counts[0:2]), None,
                    range_condition(x, "x", 0.0, 1.0, counted=counts[4:6]), stats=counts)  # counts decide, not x
        with pytest.raises(ValueError, match="`stats` must hold two numbers per condition"):
            check.defer(finite_condition(w, "w", counted=counts[0:2]), stats=counts)
        check.defer(None, stats=counts[:2])
    bad = torch.tensor([1.0, 1.0, 0.0, 0.0])
    for first, message in [((0.0, 2.0), "`w` must be finite; found nan"), ((0.0, 1.0), "`x` must lie")]:
        with pytest.raises(ValueError, match=message):
            with checked_after(range_condition(x, "x", *first)) as check:
                check.defer(finite_condition(w, "w", counted=bad[:2]), stats=bad[:2])
    with pytest.raises(ValueError, match=r"`x` must lie in \[0, 1\]; found 1.5"):
        with checked_after() as check:
            check.defer(None, range_condition(x, "x", 0.0, 1.0, counted=bad[2:]), stats=bad.flip(0))


@pytest.mark.parametrize("values, ok", [
    ([0.0, 0.5, 2.0], True), ([0.0, 2.0001], False), ([-1e-9, 1.0], False), ([1.0, float("nan"), 0.5], False),
    ([float("nan")], False), ([float("inf")], False), ([float("-inf"), 1.0], False),
])
def test_conditions_decide_from_two_extremes_and_nan_fails_them_all(values, ok):
    """Each condition reduces its tensor to [min, max] (one reduction, NaN propagating) and decides on the host:
    the verdict must equal the elementwise definition, in every dtype a kernel reads."""
    from pathedu.checks import extremes, finite_condition, log_gate_condition, range_condition, require

    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.tensor(values, dtype=dtype)
        assert extremes(x).shape == (2,)
        cases = [
            (range_condition(x, "x", 0.0, 2.0), bool(((x >= 0) & (x <= 2)).all())),
            (finite_condition(x, "x"), bool(torch.isfinite(x).all())),
            (range_condition(x, "x", 0.0, float("inf"), finite=True), bool((torch.isfinite(x) & (x >= 0)).all())),
            (range_condition(x, "x", 0.0, 1.0, lo_open=True), bool(((x > 0) & (x <= 1)).all())),
            (log_gate_condition(-x, "x"), bool(((-x <= 0) & (-x > float("-inf"))).all())),
        ]
        if ok:
            assert cases[0][1]
        for condition, truth in cases:
            if truth:
                require(condition)
            else:
                with pytest.raises(ValueError, match="`x` must"):
                    require(condition)


def test_require_reads_conditions_of_mixed_dtypes_together_and_reports_the_first_that_fails():
    from pathedu.checks import finite_condition, range_condition, require

    good64 = torch.tensor([0.5], dtype=torch.float64)
    bad32 = torch.tensor([3.0])
    with pytest.raises(ValueError, match=r"`b` must lie in \[0, 2\]; found 3"):
        require(finite_condition(good64, "a"), None, range_condition(bad32, "b", 0.0, 2.0),
                finite_condition(torch.tensor([float("nan")]), "c"))
    assert finite_condition(torch.empty(0), "e") is None  # nothing to check
