"""Every Triton form (tests/forms.py, kind "triton") on a real GPU against its family's matrix form in
float64: bf16, fp16 and fp32 inputs, sequence lengths that are no multiple of any block (1, 77, 300,
1000), head dims 16, 32, 64 and 128, Dv != D.

The inputs are drawn in float64 and rounded to the dtype under test; the reference runs on those same
rounded numbers (and on the extra arguments the kernels see, in fp32), so the error measured is the
kernel's own.  Tolerances are the book's (CONTRIBUTING.md): max |out - ref| / max |ref| <= 2e-3 (fp32),
1e-2 (fp16), 2e-2 (bf16).
"""
import pytest
import torch
from forms import FORMS, call, matrix_form
from helpers import rand_qkv, rel_err

TOL = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (lead dims, T, D, Dv): every head dim once, two with Dv != D, T = 1 and T past several blocks.
SHAPES = [((2, 3), 1, 16, 16), ((1, 2), 77, 32, 48), ((2, 1), 300, 64, 64), ((1, 2), 1000, 128, 32)]
TRITON = [f for f in FORMS if f.kind == "triton"]


def inputs(form, shape, dtype, *, seed=0, device="cuda"):
    """``(q, k, v, extras)`` for the kernel and ``(q, k, v, extras)`` in float64 for the reference."""
    q, k, v = rand_qkv(*shape, dtype=dtype, seed=seed, device=device)  # float64 draws, rounded to dtype
    q64, k64, v64 = (x.double() for x in (q, k, v))
    extras = {name: x.float() for name, x in form.extras(q64, k64, v64, seed).items()}  # gates: fp32
    return (q, k, v, extras), (q64, k64, v64, {name: x.double() for name, x in extras.items()})


def check_form(form, shape, dtype, *, device="cuda") -> float:
    (q, k, v, ex), (q64, k64, v64, ex64) = inputs(form, shape, dtype, device=device)
    out = call(form, q, k, v, ex)
    ref = call(matrix_form(form), q64, k64, v64, ex64)
    assert out.dtype == dtype and out.shape == ref.shape and out.device == q.device
    return rel_err(out, ref)  # asserts a finite output


def test_the_registry_has_a_triton_form_in_every_family():
    assert {f.family for f in TRITON} == {f.family for f in FORMS}


# dtype is the outer loop: bf16 (the benchmark dtype) first, fp32 last (its exact-fp32 dots compile slowest).
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[1]}-D{s[2]}-Dv{s[3]}")
@pytest.mark.parametrize("form", TRITON, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_triton_form_matches_float64(dtype, form, shape):
    err = check_form(form, shape, dtype)
    assert err <= TOL[dtype], f"{form.name} {dtype} {shape}: relative error {err:.2e} > {TOL[dtype]:.0e}"


def test_bad_values_raise_after_the_kernel_is_queued():
    """On a GPU the value checks are read after the launch (pathedu.checks.checked_after): a bad value still
    raises ValueError naming the argument, and the next good call is unaffected."""
    from pathedu import alibi, fox, path, pathfox

    q, k, v = rand_qkv((2, 2), 300, 64, 64, dtype=torch.bfloat16, seed=0, device="cuda")
    T = q.shape[-2]
    kn = torch.nn.functional.normalize(k.float(), dim=-1).to(k.dtype)  # the delta rule's keys: unit length
    beta = torch.rand(2, 2, T, device="cuda")
    w = torch.nn.functional.normalize(torch.randn(2, 2, T, 64, device="cuda"), dim=-1)
    log_f = -torch.rand(2, 2, T, device="cuda")
    bad_f = log_f.clone()
    bad_f[1, 0, 200] = 0.5
    bad_b = beta.clone()
    bad_b[0, 1, 17] = 2.5
    bad_w = w.clone()
    bad_w[1, 1, T - 1, 3] = float("inf")  # the last row, in a partial block: counted by the preparation pass
    cases = [
        (lambda s: alibi.alibi_triton(q, k, v, s), torch.tensor([0.1, 0.2], device="cuda"),
         torch.tensor([0.1, -0.2], device="cuda"), "`slope`"),
        (lambda g: alibi.retnet_triton(q, k, v, g), 0.9, 1.5, "`gamma`"),
        (lambda f: fox.fox_triton(q, k, v, f), log_f, bad_f, "`log_f`"),
        (lambda b: path.path_triton(q, k, v, w, b), beta, bad_b, "`beta`"),
        (lambda w_: path.path_triton(q, k, v, w_, beta), w, bad_w, "`w` must be finite"),
        (lambda b: path.deltanet_triton(q, kn, v, b), beta, bad_b, "`beta`"),
        (lambda f: pathfox.gated_deltanet_triton(q, kn, v, beta, f), log_f, bad_f, "`log_f`"),
    ]
    for call, good, bad, needle in cases:
        with pytest.raises(ValueError, match=needle):
            call(bad)
        out = call(good)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()


def _nans(dtype):
    """The NaNs to plant: PyTorch's quiet NaN and, for fp32, NVIDIA's canonical NaN ``0x7FFFFFFF`` (what GPU
    arithmetic returns, e.g. an upstream ``inf - inf``), which the tf32 rounding ``rn`` turns into -0.0 unless made
    quiet first (kernels/NOTES_path.md, "NaNs through the rounding")."""
    nans = [float("nan")]
    if dtype == torch.float32:
        nans.append(torch.tensor(0x7FFFFFFF, dtype=torch.int32).view(torch.float32).item())
    return nans


def _plant(x, at, d, value):
    """A copy of ``x`` with ``value`` at ``[0, 1, at, d]`` (bit-exact for NaN payloads)."""
    x = x.clone()
    if x.dtype == torch.float32:
        x.view(torch.int32)[0, 1, at, d] = torch.tensor([value], dtype=torch.float32).view(torch.int32)[0]
    else:
        x[0, 1, at, d] = value
    return x


@pytest.mark.parametrize("norm_q", [True, False], ids=["forward", "backward"])
def test_preparation_pass_holds_any_bf16_magnitude(norm_q):
    """The preparation pass multiplies in fp16 on a GPU, the rows of bf16 q and k scaled by powers of two
    (kernels/ut_prepare.py, main_pass_precision): rows from 1e-12 to 1e12, which fp16 holds only scaled, give every
    factor within 10-bit rounding of an "x3" pass on the same numbers in fp32 (the CPU test's bounds; k~, which the
    forward stores in bf16, within 1e-2).  The forward's pass stores what PaTH's stores (fp16 q~ and G, bf16 k~);
    the backward's keeps fp32 here, since its fp16 q~ and k~ would not hold rows of 1e12 however they were made."""
    from helpers import prepared_errors

    from pathedu.kernels.ut_prepare import Prepared

    T, D, block = 1000, 64, 64
    g = torch.Generator(device="cuda").manual_seed(30)
    scales = 10.0 ** torch.randint(-12, 13, (1, T, 1), generator=g, device="cuda").float()
    q = (torch.randn(1, T, D, generator=g, device="cuda") * scales).bfloat16()
    k = (torch.randn(1, T, D, generator=g, device="cuda") * scales.flip(1)).bfloat16()
    w = torch.nn.functional.normalize(torch.randn(1, T, D, generator=g, device="cuda"), dim=-1)
    beta = 2 * torch.rand(1, T, generator=g, device="cuda")
    f32 = dict(q_dtype=torch.float32, k_dtype=torch.float32, update_dtype=torch.float32)
    if norm_q:
        kinds, stored = dict(norm_q=True), dict(q_dtype=torch.float16, k_dtype=torch.bfloat16, update_dtype=torch.float16)
    else:
        kinds, stored = dict(keep_inverse=True), f32
    fast = Prepared(q, k, w, beta, T, block, precision="tf32", **stored, **kinds)
    exact = Prepared(q.float(), k.float(), w, beta, T, block, precision="x3", **f32, **kinds)
    err = prepared_errors(fast, exact, q.float(), k.float(), T, block)
    assert all(torch.isfinite(getattr(fast, name)[0, :T]).all() for name in ("qt", "kt", "ad")), err
    kt_bound = 1e-2 if norm_q else 3e-3
    assert err["qt"] <= 3e-3 and err["kt"] <= kt_bound and err["ad"] <= 2e-3 and err["ad_above"], err
    assert err["g"] <= 2e-3 and err.get("qn", 0.0) <= 2e-3, err


def test_ut_backward_holds_any_magnitude():
    """The UT backward multiplies in fp16 on a GPU, every tile of gradients and of bf16 q, k scaled by a power of two
    (kernels/ut_prepare.py, backward_precision): blocks of q, k from 1e-12 to 1e12 and of gradients from 1e-20 to
    1e20 give every block of dq, dk (bf16, as PaTH returns them), dw and dbeta within 10-bit rounding of the "x3"
    backward of the same pass (the CPU test's bound, 2e-3, and 1e-2 for the bf16 outputs)."""
    from helpers import blockwise_errors, ut_backward_case, ut_backward_in

    T, D, block = 1000, 64, 64
    case = ut_backward_case(T, D, block, seed=31, device="cuda", qk_dtype=torch.bfloat16)
    exact, fast = ut_backward_in("x3", *case), ut_backward_in("tf32", *case)
    assert fast[0].dtype == torch.bfloat16 and all(torch.isfinite(a).all() for a in fast)
    worst = blockwise_errors(fast, exact, T, block)
    assert worst["dq"] <= 1e-2 and worst["dk"] <= 1e-2 and worst["dw"] <= 2e-3 and worst["dbeta"] <= 2e-3, worst


@pytest.mark.parametrize("T", [1, 77, 300])
@pytest.mark.parametrize("D", [16, 32, 48, 128])  # D = 64: test_ut_backward_holds_any_magnitude
def test_ut_backward_at_every_head_dim(D, T):
    """The UT backward in the precision it runs at each head dim (fp16 products above 32, tf32 at 32 and below:
    ut_prepare.backward_precision, after fp16 kernels of D = 16 and 32 faulted on the H200, kernels/NOTES_path.md,
    "Compiler faults to remember"), autotuned: every output finite; against the "x3" backward, dq and dk (bf16) within 1e-2 of each
    block, dw within 5e-3, and dbeta within 5e-3 where a block holds more than one token; and within 1e-3 of the
    same backward with tf32 products ("tf32n", the ten bits rounded the same way), dbeta included.

    A block of one token has one dbeta, a sum that cancels (here ``-(q.w)(dq~.w) - w^T dG w``): rounding ``w`` and
    the gradients to ten bits moves it by 1e-5..4e-3 of itself on the CPU (12 seeds at D = 128) and by 9.6e-3 in
    the GPU run at D = 128 (2026-11-28), in fp16 and tf32 alike.  So the comparison that can find a fault of the
    fp16 scaling there is the one with tf32 products, not with "x3"."""
    from helpers import blockwise_errors, ut_backward_case, ut_backward_in

    from pathedu.kernels.ut_prepare import check_block

    block = check_block(None, D)
    case = ut_backward_case(T, D, block, seed=D * 1000 + T, device="cuda", qk_dtype=torch.bfloat16)
    exact, fast, tf32 = (ut_backward_in(p, *case) for p in ("x3", "tf32", "tf32n"))
    torch.cuda.synchronize()  # a fault shows here, in this test
    assert all(torch.isfinite(a).all() for a in fast)
    worst = blockwise_errors(fast, exact, T, block)
    assert worst["dq"] <= 1e-2 and worst["dk"] <= 1e-2 and worst["dw"] <= 5e-3, worst
    assert worst["dbeta"] <= 5e-3 or T == 1, worst
    apart = blockwise_errors(fast, tf32, T, block)
    assert apart["dq"] <= 1e-2 and apart["dk"] <= 1e-2 and apart["dw"] <= 1e-3 and apart["dbeta"] <= 1e-3, apart


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("where", ["v", "zero_key", "k", "q"])
@pytest.mark.parametrize("form", TRITON, ids=lambda f: f.name)
def test_non_finite_value_reaches_no_earlier_output(form, where, dtype):
    _check_non_finite(form, where, dtype, grad=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("where", ["v", "zero_key", "k", "q"])
@pytest.mark.parametrize("form", [f for f in TRITON if f.family in ("path", "pathfox")], ids=lambda f: f.name)
def test_non_finite_value_with_gradients(form, where, dtype):
    """The same for PaTH's forward when its inputs require grad: it then runs on the backward's schedule (the
    preparation pass, the carries, ``_path_dyadic_fwd``) instead of the scan."""
    _check_non_finite(form, where, dtype, grad=True)


def _check_non_finite(form, where, dtype, *, grad):
    """The fast passes multiply plainly and leave NaN/inf values to a careful second launch: the FlashAttention
    template flags a block whose accumulator is not finite, the linear template a program whose final state is
    not finite.  Both flags rest on NaN surviving the GPU's arithmetic (0 * NaN = NaN on the tensor cores, and the
    tf32 rounding of the operands: this test found DeltaNet's loop, then the Householder RNN's fp32 factors and
    values, losing the GPU's canonical NaN there, kernels/NOTES_path.md, "NaNs through the rounding"), which the interpreter cannot show.
    A NaN or inf in the middle of a chunk (position 150 of 300, one channel of one head):

    * in ``v``, also with its key row 0 (``zero_key``: then only 0 * NaN carries it to the state): every output
      before it, and the other head, bit-identical to the clean run's; the poisoned channel non-finite from its
      row on (strictly after it for stick-breaking, whose weights never look at the own row);
    * a NaN in ``k``: the same for the rows before it; every later row (from it, or after it for stick-breaking)
      has a non-finite entry (an infinite key may legitimately get weight 0, so only NaN);
    * a NaN or inf in ``q``: only its own row changes, and it is not finite (stick-breaking may instead return the
      limit that an infinite logit has there)."""
    (q, k, v, ex), _ = inputs(form, ((1, 2), 300, 64, 64), dtype, seed=3)
    at, d = 150, 3
    first = at + 1 if form.family == "stickbreaking" else at

    def run(qq, kk, vv):  # fresh leaves when gradients are wanted (the planted inputs are made without them)
        if not grad:
            return call(form, qq, kk, vv, ex)
        leaves = [t.detach().clone().requires_grad_() for t in (qq, kk, vv)]
        out = call(form, *leaves, {n: t.detach().clone().requires_grad_() for n, t in ex.items()})
        assert out.grad_fn is not None
        return out.detach()

    clean = run(q, k, v)
    if where == "zero_key":
        k = k.clone()
        k[0, 1, at] = 0.0
        clean = run(q, k, v)
    values = _nans(dtype) + ([] if where == "k" else [float("inf")])
    for value in values:
        qp, kp, vp = q, k, v
        if where in ("v", "zero_key"):
            vp = _plant(v, at, d, value)
        elif where == "k":
            kp = _plant(k, at, d, value)
        else:
            qp = _plant(q, at, d, value)
        out = run(qp, kp, vp)
        case = f"{value!r} ({torch.tensor([value]).view(torch.int32).item():#x}) in {where}"
        assert torch.equal(out[0, 0], clean[0, 0]), f"{case}: the other head changed"
        if where == "q":
            others = torch.ones(300, dtype=torch.bool, device=out.device)
            others[at] = False
            assert torch.equal(out[0, 1, others], clean[0, 1, others]), f"{case}: another row changed"
            row = out[0, 1, at]
            if form.family == "stickbreaking" and value == float("inf") and torch.isfinite(row).all():
                # An infinite logit has a limit here: sigma = 1 on the nearest earlier key with k[d] > 0 (its logit
                # is +inf), whose stick then leaves nothing to the keys before it, and sigma = 0 on the keys between.
                # The kernel may return that limit or a non-finite row; a finite row must be the limit.
                (positive,) = torch.nonzero(kp[0, 1, :at, d] > 0, as_tuple=True)
                limit = vp[0, 1, positive[-1]] if len(positive) else torch.zeros_like(row)
                assert torch.allclose(row.float(), limit.float(), rtol=2e-2, atol=2e-2), f"{case}: not the limit"
            else:
                assert not torch.isfinite(row).all(), f"{case}: its own row stayed finite"
            continue
        assert torch.equal(out[..., :at, :], clean[..., :at, :]), f"{case} reached an earlier row"
        if where == "k":
            assert (~torch.isfinite(out[0, 1, first:])).any(dim=-1).all(), f"{case}: a row that sees it stayed finite"
        else:
            assert not torch.isfinite(out[0, 1, first:, d]).any(), f"{case}: rows that see the value stayed finite"
