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


@pytest.mark.parametrize("zero_key", [False, True], ids=["key", "zero_key"])
@pytest.mark.parametrize("form", TRITON, ids=lambda f: f.name)
def test_non_finite_value_reaches_no_earlier_output(form, zero_key):
    """The fast passes multiply plainly and leave NaN/inf values to a careful second launch: the FlashAttention
    template flags a block whose accumulator is not finite, the linear template a program whose final state is
    not finite.  Both flags rest on NaN surviving the GPU's arithmetic (0 * NaN = NaN on the tensor cores, and the
    tf32 rounding of the operands: this test found DeltaNet's loop losing the GPU's canonical NaN there,
    kernels/NOTES_path.md 13.1), which the interpreter cannot show: here a NaN or inf value in the middle of a chunk (position 150 of 300, one channel of
    one head), with its key row also 0 in the ``zero_key`` case (then only 0 * NaN carries it to the state).  Every
    output before it, and the other head, must be bit-identical to the clean run's; the poisoned channel must be
    non-finite from its row on (strictly after it for stick-breaking, whose weights never look at the own row)."""
    (q, k, v, ex), _ = inputs(form, ((1, 2), 300, 64, 64), torch.bfloat16, seed=3)
    clean = call(form, q, k, v, ex)
    at, d = 150, 3
    for value in (float("nan"), float("inf")):
        kp, vp = k.clone(), v.clone()
        vp[0, 1, at, d] = value
        if zero_key:
            kp[0, 1, at] = 0.0
            clean_k = call(form, q, kp, v, ex)
        else:
            clean_k = clean
        out = call(form, q, kp, vp, ex)
        assert torch.equal(out[..., :at, :], clean_k[..., :at, :]), f"{value} at {at} reached an earlier row"
        assert torch.equal(out[0, 0], clean_k[0, 0]), "the other head changed"
        first = at + 1 if form.family == "stickbreaking" else at
        assert not torch.isfinite(out[0, 1, first:, d]).any(), "rows that see the value stayed finite"
