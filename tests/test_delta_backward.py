"""The backward pass of the chunked Householder RNN and DeltaNet, gated and not (kernels/delta_rule_backward.py), and
their ``initial_state`` / ``return_state``: what the contract test (tests/test_contract.py, which checks the default
chunk at T = 1, 37, 150) leaves out.  Every gradient against float64 autograd through the recurrent or matrix forms,
at every chunk length, under extreme gates and ``beta`` at both ends of [0, 2], through the states, and a sequence run
in pieces.  Tiny sizes (one batch, two heads, D = 16): the kernels run in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import gradient_errors, rand_qkv, rel_err, run_in_pieces

from pathedu import path, pathfox
from pathedu.kernels.delta_rule import chunked_delta_rule, chunked_householder

D, DV = 16, 24


def _draws(T, seed, *, unit_k=False):
    """``q, k, v`` ``(1, 2, T, .)``, unit ``w``, ``u`` uniform in [0, 1) ``(1, 2, T)``: float64."""
    q, k, v = rand_qkv((1, 2), T, D, DV, seed=seed)
    g = torch.Generator().manual_seed(100 + seed)
    w = F.normalize(torch.randn(1, 2, T, D, generator=g, dtype=torch.float64), dim=-1)
    u = torch.rand(1, 2, T, generator=g, dtype=torch.float64)
    return q, F.normalize(k, dim=-1) if unit_k else k, v, w, u


def _gates(u, kind):
    return {"mild": F.logsigmoid(2.0 + 3.0 * (u - 0.5)), "uniform": -20 * u,
            "jumps": torch.where(u < 0.5, -20.0, -0.01).double(), "strong": torch.full_like(u, -20.0)}[kind]


def _forms(chunk):
    """name -> (kernel, reference, which extras): the kernel with ``chunk``, the family's float64 reference."""
    return {
        "householder": (lambda q, k, v, w, beta, **kw: chunked_householder(q, k, v, w, beta, chunk=chunk, **kw),
                        path.householder_recurrent, ("w", "beta")),
        "deltanet": (lambda q, k, v, beta, **kw: chunked_delta_rule(q, k, v, beta, chunk=chunk, **kw),
                     path.deltanet_recurrent, ("beta",)),
        "gated_householder": (lambda q, k, v, w, beta, log_f, **kw: chunked_householder(q, k, v, w, beta, log_f=log_f,
                                                                                       chunk=chunk, **kw),
                              pathfox.gated_householder_recurrent, ("w", "beta", "log_f")),
        "gated_deltanet": (lambda q, k, v, beta, log_f, **kw: chunked_delta_rule(q, k, v, beta, log_f=log_f,
                                                                                chunk=chunk, **kw),
                           pathfox.gated_deltanet_recurrent, ("beta", "log_f")),
    }


FAMILIES = list(_forms(16))


def _args(name, q, k, v, w, beta, log_f):
    extras = dict(w=w, beta=beta, log_f=log_f)
    return dict(q=q, k=k, v=v, **{n: extras[n] for n in _forms(16)[name][2]})


@pytest.mark.parametrize("chunk", [16, 32])
@pytest.mark.parametrize("name", FAMILIES)
def test_gradients_at_every_chunk_length(name, chunk):
    """T = 37 (no multiple of any chunk), with an initial state and a gradient into the returned state: every
    argument's gradient, the initial state's included, within 2e-6 of the largest float64 entry (fp32 rounding).  The
    contract test covers chunks of 64, without a state."""
    fn, ref, _ = _forms(chunk)[name]
    q, k, v, w, u = _draws(37, seed=chunk, unit_k=True)
    args = _args(name, q, k, v, w, 2 * u, _gates(u, "mild"))
    S0 = torch.randn(1, 2, DV, D, generator=torch.Generator().manual_seed(chunk), dtype=torch.float64)
    errs = gradient_errors(fn, ref, args, initial_state=S0)
    assert max(errs.values()) <= 2e-6, errs


@pytest.mark.parametrize("beta_at", ["near_0", "near_2"])
@pytest.mark.parametrize("gates", ["uniform", "jumps", "strong"])
@pytest.mark.parametrize("name", ["gated_householder", "gated_deltanet"])
def test_gradients_under_extreme_gates(name, gates, beta_at):
    """Log gates uniform in [-20, 0], jumping between -20 and -0.01, or -20 everywhere; ``beta`` within 1e-3 of 0 or
    of 2 (unit keys and ``w``: reflections for ``beta`` = 2): every gradient, the gate's included, within 1e-4 of the
    largest float64 entry (at -20, a weight e^{-20} is 2e-9: the gradients of order e^{-20} must not drown in the
    rounding of larger terms)."""
    fn, ref, _ = _forms(16)[name]
    q, k, v, w, u = _draws(37, seed=3, unit_k=True)
    beta = 1e-3 * u if beta_at == "near_0" else 2 - 1e-3 * u
    errs = gradient_errors(fn, ref, _args(name, q, k, v, w, beta, _gates(u, gates)))
    assert max(errs.values()) <= 1e-4, errs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("beta_at", ["near_0", "near_2"])
def test_16bit_gradients_under_strong_gates(beta_at, dtype):
    """16-bit ``q, k, v`` at D = 64 (where the UT backward would multiply in fp16), every gate at -20: the gated
    Householder RNN's ``dw`` and ``dbeta``, of order e^{-20} against ``dq``'s order 1, within 2e-2 of their largest
    float64 entry.  The chunk's gates put e^{-20} between neighbouring entries of one gradient tile, more than fp16's
    range under one scale: with fp16 products both came out 0."""
    T, Dk = 70, 64
    g = torch.Generator().manual_seed(7)
    q, k, v, w = (torch.randn(1, 2, T, Dk, generator=g, dtype=torch.float64) for _ in range(4))
    k, w = F.normalize(k, dim=-1), F.normalize(w, dim=-1)
    u = torch.rand(1, 2, T, generator=g, dtype=torch.float64)
    beta = 1e-3 * u if beta_at == "near_0" else 2 - 1e-3 * u
    log_f = torch.full_like(u, -20.0)
    q, k, v = (x.to(dtype).double() for x in (q, k, v))  # the rounded inputs, for both sides
    do = torch.randn(1, 2, T, Dk, generator=g, dtype=torch.float64)
    leaves64 = [x.clone().requires_grad_() for x in (q, k, v, w, beta, log_f)]
    want = torch.autograd.grad(pathfox.gated_householder_matrix(*leaves64), leaves64[3:5], do)
    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [x.float().requires_grad_() for x in (w, beta, log_f)]
    got = torch.autograd.grad(chunked_householder(*leaves[:5], log_f=leaves[5]), leaves[3:5], do.to(dtype))
    for label, a, b in zip(["w", "beta"], got, want):
        assert b.abs().max() < 1e-6  # the case is what it claims: gradients of order e^{-20}
        err = ((a.double() - b).abs().max() / b.abs().max()).item()
        assert err <= 2e-2, f"d{label}: {err:.2e}"


@pytest.mark.parametrize("beta_at", ["near_0", "near_2"])
@pytest.mark.parametrize("name", ["householder", "deltanet"])
def test_gradients_with_beta_at_both_ends(name, beta_at):
    fn, ref, _ = _forms(16)[name]
    q, k, v, w, u = _draws(37, seed=4, unit_k=True)
    beta = 1e-3 * u if beta_at == "near_0" else 2 - 1e-3 * u
    errs = gradient_errors(fn, ref, _args(name, q, k, v, w, beta, None))
    assert max(errs.values()) <= 1e-5, errs


def test_strong_gates_leave_no_noise_in_small_gate_gradients():
    """With every gate at -20, each log gate's gradient is of order e^{-20} times the inputs' scale (a token's own
    gate never acts on itself, and every pair that spans it weighs e^{-20}): the kernel's must match float64 to 1e-3 of
    each entry's own size, not merely of the largest gradient elsewhere."""
    q, k, v, w, u = _draws(37, seed=5, unit_k=True)
    log_f = _gates(u, "strong")
    leaves64 = [x.clone().requires_grad_() for x in (q, k, v, w, 2 * u, log_f)]
    leaves32 = [x.float().clone().requires_grad_() for x in (q, k, v, w, 2 * u, log_f)]
    g = torch.randn(1, 2, 37, DV, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (want,) = torch.autograd.grad((pathfox.gated_householder_matrix(*leaves64) * g).sum(), leaves64[-1])
    (got,) = torch.autograd.grad((chunked_householder(*leaves32[:5], log_f=leaves32[5], chunk=16) * g.float()).sum(),
                                 leaves32[-1])
    assert want.abs().max() < 1e-6
    assert ((got.double() - want).abs() <= 1e-3 * want.abs() + 1e-12).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_in_pieces_then_decoding_is_one_pass(name):
    """Prefill by the kernel in two pieces (23 and 47 tokens, each from the last one's state), then two tokens by
    the kernel (T = 1) and the rest by the recurrent form: the one-pass output and final state."""
    fn, ref, which = _forms(16)[name]
    q, k, v, w, u = (x.float() for x in _draws(75, seed=7, unit_k=True))
    extras = dict(w=w, beta=2 * u, log_f=_gates(u, "mild"))
    ex = [extras[n] for n in which]

    def at(s, e):
        return [x[..., s:e, :] if x.dim() == q.dim() else x[..., s:e] for x in ex]

    full, S = fn(q, k, v, *ex, return_state=True)
    assert S.dtype == torch.float32 and S.shape == (1, 2, DV, D)
    pieces, S_pieces = run_in_pieces(fn, ref, q, k, v, at, (23, 70))
    assert rel_err(pieces, full) <= 1e-5 and rel_err(S_pieces, S) <= 1e-5
    ref_out, ref_S = ref(q.double(), k.double(), v.double(), *(x.double() for x in ex), return_state=True)
    assert rel_err(pieces, ref_out) <= 1e-5 and rel_err(S_pieces, ref_S) <= 1e-5


@pytest.mark.parametrize("name", FAMILIES)
def test_empty_sequence_passes_the_state_through(name):
    """T = 0: no output, the initial state returned as it came, and its gradient is the returned state's."""
    fn, _, which = _forms(16)[name]
    q, k, v, w, u = (x.float()[..., :0, :] if x.dim() == 4 else x.float()[..., :0] for x in _draws(4, seed=8))
    extras = dict(w=w, beta=2 * u, log_f=-u)
    S0 = torch.randn(1, 2, DV, D).requires_grad_()
    out, S = fn(q, k, v, *(extras[n] for n in which), initial_state=S0, return_state=True)
    assert out.shape == (1, 2, 0, DV) and torch.equal(S, S0.detach())
    gS = torch.randn_like(S)
    (dS0,) = torch.autograd.grad((S * gS).sum(), S0)
    assert torch.equal(dS0, gS)


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("name", ["gated_householder", "gated_deltanet"])
def test_non_finite_input_reaches_only_its_own_chunk_and_the_gradients_that_read_it(name, which):
    """A NaN in one channel of ``q``, ``k`` or ``v`` at position 20 (chunks of 16: the chunk [16, 32)) of one head.
    Every gradient of the other head stays finite.  A NaN of ``k`` or ``v`` reaches no gradient row before its chunk
    (those positions never read it: the recurrence is causal), and reaches ``dq`` at every row from 20 on (each of
    them reads it); a NaN of ``q`` reaches no row after its chunk, and ``dk``, ``dv`` at every row up to 20.  Inside
    the chunk the UT factors' backward multiplies whole blocks, so other rows of the chunk may see it too."""
    fn, _, which_ex = _forms(16)[name]
    q, k, v, w, u = (x.float() for x in _draws(40, seed=9, unit_k=True))
    args = dict(q=q, k=k, v=v)
    args[which] = args[which].clone()
    args[which][0, 1, 20, 3] = float("nan")
    extras = dict(w=w, beta=2 * u, log_f=_gates(u, "mild").float())
    leaves = [args[n].requires_grad_() for n in "qkv"] + [extras[n].clone().requires_grad_() for n in which_ex]
    do = torch.randn(1, 2, 40, DV, generator=torch.Generator().manual_seed(10))
    grads = torch.autograd.grad(fn(*leaves), leaves, do)
    rows = torch.arange(40)
    for label, grad in zip(["q", "k", "v", *which_ex], grads):
        bad = ~torch.isfinite(grad.reshape(2, 40, -1)).all(-1)  # [head, row]
        assert not bad[0].any(), f"d{label}: the other head"
        if which == "q":
            assert not bad[1, rows >= 32].any(), f"d{label}: rows after the chunk"
        else:
            assert not bad[1, rows < 16].any(), f"d{label}: rows before the chunk"
    reach = {"q": dict(k=rows <= 20, v=rows <= 20), "k": dict(q=rows >= 20), "v": dict(q=rows >= 20)}[which]
    for label, sees in reach.items():
        grad = grads["qkv".index(label)]
        assert (~torch.isfinite(grad[0, 1])).any(-1)[sees].all(), f"d{label} missed a row that reads the NaN"


@pytest.mark.parametrize("D_, Dv_", [(24, 40), (96, 20)])
def test_head_dims_that_are_no_power_of_two(D_, Dv_):
    """Gated DeltaNet and the gated Householder RNN at head dims whose tiles are masked (24 in tiles of 32, 96 in
    tiles of 128, where the kernels take the value channels 32 at a time and the default chunk is 32): every gradient,
    the initial state's included, within 2e-6 of float64."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 45, n, generator=g, dtype=torch.float64) for n in (D_, D_, Dv_))
    k, w = F.normalize(k, dim=-1), F.normalize(torch.randn(1, 2, 45, D_, generator=g, dtype=torch.float64), dim=-1)
    u = torch.rand(1, 2, 45, generator=g, dtype=torch.float64)
    S0 = torch.randn(1, 2, Dv_, D_, generator=g, dtype=torch.float64)
    for fn, ref, args in (
            (lambda q, k, v, w, b, f, **kw: chunked_householder(q, k, v, w, b, log_f=f, **kw),
             pathfox.gated_householder_recurrent, dict(q=q, k=k, v=v, w=w, beta=2 * u, log_f=_gates(u, "mild"))),
            (lambda q, k, v, b, f, **kw: chunked_delta_rule(q, k, v, b, log_f=f, **kw),
             pathfox.gated_deltanet_recurrent, dict(q=q, k=k, v=v, beta=2 * u, log_f=_gates(u, "mild")))):
        errs = gradient_errors(fn, ref, args, initial_state=S0)
        assert max(errs.values()) <= 2e-6, errs
