"""Chapter 4: every form of RoPE attention and of the complex recurrence against float64 references."""
import math

import pytest
import torch
import triton
import triton.language as tl
from helpers import N_FIXED, TOL_F64, TOL_TRITON, case_id, gradient_errors, rand_qkv, random_shapes, rel_err, run_in_pieces

from pathedu import nope, rope
from pathedu.kernels._pieces import rope_cos_sin, rope_shift
from pathedu.kernels.rope import rotate_qk, trig_error

CASES = random_shapes(6, seed=4, dims=(16, 32))  # RoPE rotates channel pairs: even head dims D only
PAIRINGS = ["interleaved", "half"]
SOFTMAX_FORMS = [rope.rope_naive, rope.rope_recurrent, rope.rope_matrix, rope.rope_blockwise]
LINEAR_FORMS = [rope.complex_naive, rope.complex_recurrent, rope.complex_matrix, rope.complex_chunked]
TRITON_FORMS = [rope.rope_triton, rope.complex_triton]
ALL_FORMS = SOFTMAX_FORMS + LINEAR_FORMS + TRITON_FORMS


# ---------------------------------------------------------------------------
# References written independently of the module: complex numbers, explicit phases
# ---------------------------------------------------------------------------

def rotate_reference(x, pairing, base=10000.0, offset=0):
    """Rotate row t of x by e^{+i (offset + t) Omega_n}, pairs read as complex numbers, in float64."""
    x = x.double()
    T, D = x.shape[-2:]
    omega = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    phase = torch.exp(1j * (offset + torch.arange(T, dtype=torch.float64))[:, None] * omega)
    if pairing == "interleaved":
        z = torch.complex(x[..., 0::2], x[..., 1::2]) * phase
        return torch.stack([z.real, z.imag], -1).reshape(x.shape)
    z = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * phase
    return torch.cat([z.real, z.imag], -1)


def softmax_reference(q, k, v, pairing, scale=None):
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    logits = scale * rotate_reference(q, pairing) @ rotate_reference(k, pairing).transpose(-1, -2)
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, -1) @ v.double()


def linear_reference(q, k, v, pairing):
    T = q.shape[-2]
    w = rotate_reference(q, pairing) @ rotate_reference(k, pairing).transpose(-1, -2)
    return (w * torch.ones(T, T, dtype=torch.float64).tril()) @ v.double()


# ---------------------------------------------------------------------------
# Every form against float64
# ---------------------------------------------------------------------------

FORMS_AND_REFERENCES = ([(f, softmax_reference) for f in SOFTMAX_FORMS]
                        + [(f, linear_reference) for f in LINEAR_FORMS])


@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form, reference", FORMS_AND_REFERENCES, ids=lambda f: f.__name__)
def test_forms_match_float64(form, reference, case, pairing):
    """Every softmax form against ``softmax_reference``, every linear form against ``linear_reference``."""
    q, k, v = rand_qkv(*case, seed=hash(case) % 1000)
    assert rel_err(form(q, k, v, pairing=pairing), reference(q, k, v, pairing)) <= TOL_F64


def test_other_base_and_chunk_sizes():
    q, k, v = rand_qkv((2,), 45, 16, 8, seed=2)
    for base in (10.0, 500000.0):
        ref = rope.rope_matrix(q, k, v, base=base)
        assert rel_err(rope.rope_blockwise(q, k, v, base=base, block_m=16, block_n=8), ref) <= TOL_F64
        assert rel_err(rope.rope_naive(q, k, v, base=base), ref) <= TOL_F64
        lref = rope.complex_matrix(q, k, v, base=base)
        for chunk in (1, 7, 64):
            assert rel_err(rope.complex_chunked(q, k, v, base=base, chunk=chunk), lref) <= TOL_F64
    # the base matters: a different base gives different outputs
    assert rel_err(rope.rope_matrix(q, k, v, base=10.0), rope.rope_matrix(q, k, v)) > 1e-3


def test_explicit_scale_is_used():
    q, k, v = rand_qkv((2,), 9, 16)
    for form in SOFTMAX_FORMS + [rope.rope_triton]:
        dt = torch.float32 if form is rope.rope_triton else torch.float64
        out = form(q.to(dt), k.to(dt), v.to(dt), scale=0.3)
        assert rel_err(out, softmax_reference(q, k, v, "interleaved", scale=0.3)) <= 2e-3
        assert rel_err(out, softmax_reference(q, k, v, "interleaved")) > 1e-2


# ---------------------------------------------------------------------------
# The chapter's claims
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pairing", PAIRINGS)
def test_complex_recurrence_is_linear_attention_on_rotated_qk(pairing):
    """S_t = S_{t-1} e^{i Omega} + v_t k~_t^H, o_t = Re{S_t q~_t}  ==  linear attention on R^t q_t, R^j k_j."""
    q, k, v = rand_qkv((2, 3), 50, 32, 12, seed=11)
    lin = nope.linear_matrix(rope.apply_rope(q, pairing=pairing), rope.apply_rope(k, pairing=pairing), v)
    for form in LINEAR_FORMS:
        assert rel_err(form(q, k, v, pairing=pairing), lin) <= TOL_F64
    # The direction is +Omega t: rotating the other way is a different recurrence (gate e^{-i Omega}).
    T = q.shape[-2]
    back = -torch.arange(T, dtype=torch.float64)
    lin_neg = nope.linear_matrix(rope._rotate(q, back, 1e4, pairing), rope._rotate(k, back, 1e4, pairing), v)
    assert rel_err(rope.complex_recurrent(q, k, v, pairing=pairing), lin_neg) > 0.1


def test_pairings_differ_by_a_channel_permutation():
    q, k, v = rand_qkv((3,), 20, 16, seed=6)
    D = q.shape[-1]
    perm = torch.arange(D).reshape(2, D // 2).T.reshape(-1)  # half layout -> interleaved layout: [0, 8, 1, 9, ...]
    assert torch.allclose(rope.apply_rope(q[..., perm], pairing="interleaved"),
                          rope.apply_rope(q, pairing="half")[..., perm], atol=1e-12)
    assert rel_err(rope.rope_matrix(q[..., perm], k[..., perm], v, pairing="interleaved"),
                   rope.rope_matrix(q, k, v, pairing="half")) <= TOL_F64
    # ... but on the same channels they are different encodings.
    assert rel_err(rope.rope_matrix(q, k, v, pairing="interleaved"), rope.rope_matrix(q, k, v, pairing="half")) > 1e-3


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_logits_are_invariant_to_shifting_all_positions(pairing):
    q, k, _ = rand_qkv((2,), 24, 16, seed=3)
    base_logits = rope.rope_logits(q, k, pairing=pairing)
    for offset in (1, 17, 1000, -5):
        shifted = rope.rope_logits(q, k, pairing=pairing, offset=offset)
        assert rel_err(shifted, base_logits) <= 1e-12
    # Absolute rotations do change: the rotated keys themselves are not shift invariant.
    assert rel_err(rope.apply_rope(k, offset=17, pairing=pairing), rope.apply_rope(k, pairing=pairing)) > 1e-2


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_apply_rope_preserves_norms_and_composes(pairing):
    x = rand_qkv((2, 3), 11, 24, seed=8)[0]
    xr = rope.apply_rope(x, offset=3, pairing=pairing)
    assert torch.allclose(xr.norm(dim=-1), x.norm(dim=-1), rtol=1e-13)
    # pair norms are preserved one by one
    a, b = rope.channel_pairs(x, pairing)
    ar, br = rope.channel_pairs(xr, pairing)
    assert torch.allclose(ar ** 2 + br ** 2, a ** 2 + b ** 2, rtol=1e-12)
    R = lambda p: rope.rotation_matrix(p, 24, pairing=pairing)  # noqa: E731
    row = x[0, 0, :1, :]  # one row: apply_rope(row, offset=p) is R^p row
    for t, j in [(5, 2), (0, 7), (40, 40), (1000, 3)]:
        assert torch.allclose(R(t) @ R(-j), R(t - j), atol=1e-12)
        assert torch.allclose(R(t).T, R(-t), atol=1e-15)
        assert torch.allclose(R(t).T @ R(t), torch.eye(24, dtype=torch.float64), atol=1e-12)
        two_steps = rope.apply_rope(rope.apply_rope(row, offset=-j, pairing=pairing), offset=t, pairing=pairing)
        assert torch.allclose(two_steps, rope.apply_rope(row, offset=t - j, pairing=pairing), atol=1e-12)
        assert torch.allclose(rope.apply_rope(row, offset=t, pairing=pairing)[0], R(t) @ row[0], atol=1e-12)


def test_rotation_matrix_matches_the_complex_logit():
    """Re{conj(k~) e^{i Omega (t-j)} q~} = k^T R^{t-j} q."""
    q, k, _ = rand_qkv((), 1, 16, seed=9)
    q, k = q[0], k[0]
    for pairing in PAIRINGS:
        zq, zk = rope.to_complex(q, pairing), rope.to_complex(k, pairing)
        for d in (0, 3, 50):
            phase = torch.exp(1j * d * rope.frequencies(16))
            lhs = (zk.conj() * phase * zq).sum().real
            assert torch.isclose(lhs, k @ rope.rotation_matrix(d, 16, pairing=pairing) @ q, atol=1e-12)
        assert torch.equal(rope.from_complex(zq, pairing), q)


def test_frequencies():
    om = rope.frequencies(8, base=100.0)
    assert torch.allclose(om, torch.tensor([1.0, 100 ** -0.25, 100 ** -0.5, 100 ** -0.75], dtype=torch.float64))
    with pytest.raises(ValueError, match="`D`"):
        rope.frequencies(7)


@pytest.mark.parametrize("form", SOFTMAX_FORMS + LINEAR_FORMS, ids=lambda f: f.__name__)
def test_causal(form):
    """Changing future keys and values changes no earlier output (the seed's RoPE snippet had no mask)."""
    q, k, v = rand_qkv((2,), 20, 16, seed=12)
    out = form(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[..., 10:, :] += 3.0
    v2[..., 10:, :] -= 2.0
    out2 = form(q, k2, v2)
    assert torch.allclose(out[..., :10, :], out2[..., :10, :], atol=1e-12)
    assert not torch.allclose(out[..., 10:, :], out2[..., 10:, :])


def test_complex_state_never_decays_and_resumes():
    q, k, v = rand_qkv((2,), 30, 16, 8, seed=5)
    first, S = rope.complex_recurrent(q[..., :13, :], k[..., :13, :], v[..., :13, :], return_state=True)
    rest = rope.complex_recurrent(q[..., 13:, :], k[..., 13:, :], v[..., 13:, :], initial_state=S)
    assert rel_err(torch.cat([first, rest], -2), linear_reference(q, k, v, "interleaved")) <= TOL_F64
    assert S.shape == (2, 8, 8) and S.dtype == torch.complex128
    # Feeding zero keys: the state only turns, |S| stays entry by entry (|e^{i Omega}| = 1).
    zeros = torch.zeros(2, 200, 16, dtype=torch.float64)
    _, S2 = rope.complex_recurrent(zeros, zeros, torch.zeros(2, 200, 8, dtype=torch.float64), initial_state=S,
                                   return_state=True)
    assert torch.allclose(S2.abs(), S.abs(), rtol=1e-12)
    assert not torch.allclose(S2, S)
    with pytest.raises(ValueError, match="`initial_state`"):
        rope.complex_recurrent(q, k, v, initial_state=S[..., :4])


# ---------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("rotation", ["prepass", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES[:N_FIXED], ids=case_id)  # the interpreter is slow: fixed cases only
def test_triton_forms_match_float64(case, dtype, rotation):
    """Both ways to rotate: a pass through memory, or the templates' hook (q, k turned as they are loaded)."""
    q, k, v = rand_qkv(*case, seed=7)
    tol = TOL_TRITON[dtype]
    for pairing in PAIRINGS:
        out = rope.rope_triton(q.to(dtype), k.to(dtype), v.to(dtype), pairing=pairing, rotation=rotation)
        assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
        assert rel_err(out, softmax_reference(q, k, v, pairing)) <= tol
        out = rope.complex_triton(q.to(dtype), k.to(dtype), v.to(dtype), pairing=pairing, rotation=rotation)
        assert out.dtype == dtype
        assert rel_err(out, linear_reference(q, k, v, pairing)) <= tol


def test_fused_rotation_crosses_key_blocks_and_other_bases():
    """The hook at a length of several key blocks (T = 150 > the interpreter's 64-row tiles) and head dims that
    are not powers of two (padding pairs), with a non-default base, against float64; a bad `rotation` is
    refused by name; with gradients the pre-pass path runs and gives the same output."""
    for D, Dv in ((48, 32), (16, 24)):
        q, k, v = rand_qkv((2,), 150, D, Dv, seed=8)
        for pairing in PAIRINGS:
            ref = rope.rope_matrix(q, k, v, base=500.0, pairing=pairing)
            out = rope.rope_triton(q.float(), k.float(), v.float(), base=500.0, pairing=pairing, rotation="fused")
            assert rel_err(out, ref) <= TOL_TRITON[torch.float32]
            ref = rope.complex_matrix(q, k, v, base=500.0, pairing=pairing)
            out = rope.complex_triton(q.float(), k.float(), v.float(), base=500.0, pairing=pairing, rotation="fused")
            assert rel_err(out, ref) <= TOL_TRITON[torch.float32]
    with pytest.raises(ValueError, match="`rotation`"):
        rope.rope_triton(q.float(), k.float(), v.float(), rotation="inline")
    with pytest.raises(ValueError, match="`rotation`"):
        rope.complex_triton(q.float(), k.float(), v.float(), rotation=None)
    qg = q.float().requires_grad_()
    out = rope.rope_triton(qg, k.float(), v.float(), rotation="fused")
    assert out.grad_fn is not None
    assert torch.allclose(out.detach(), rope.rope_triton(q.float(), k.float(), v.float()), atol=1e-6)


def test_prepass_inference_turns_the_queries_in_the_template():
    """Without gradients, ``rotation="prepass"`` rotates only the keys through memory (in pair order) and the
    template turns each query tile as it loads it (``ROTATE="..._q"``): the same logits as rotating both by the
    pass, over several key blocks and with padding pairs.  Interleaved pairs keep their order, so there the output
    equals the two-tensor pass's bit for bit (fp32, interpreter); "half" pairs sum the channels in pair order."""
    from pathedu.kernels.flash_attention import attention
    from pathedu.kernels.rope import rotate_qk

    for D, Dv in ((48, 32), (64, 64), (32, 48)):  # Dv >= D: the turned queries pass through the output rows
        q, k, v = (t.float() for t in rand_qkv((2,), 150, D, Dv, seed=9))
        for pairing in PAIRINGS:
            out = rope.rope_triton(q, k, v, base=500.0, pairing=pairing)
            both = attention(*rotate_qk(q, k, base=500.0, pairing=pairing), v)
            if pairing == "interleaved":
                assert torch.equal(out, both)
            else:
                assert rel_err(out, both) <= 1e-6
            assert rel_err(out, rope.rope_matrix(q.double(), k.double(), v.double(), base=500.0,
                                                 pairing=pairing)) <= TOL_TRITON[torch.float32]


def test_keys_pass_leaves_the_cos_sin_table_the_queries_hook_reads():
    """The keys-only pass stores the cos/sin it turned the keys with, ``(2, T, BLOCK_H)`` fp32: the numbers of
    :func:`pathedu.kernels.rope.trig_table` (the pass's own cos/sin, read off unit pairs), bit for bit."""
    from pathedu.kernels._launch import prepare_qkv
    from pathedu.kernels.rope import _rotate_launch, trig_table

    T, D = 70, 48  # 24 pairs: the table is padded to 32
    q, k, v = (t.float() for t in rand_qkv((2,), T, D, seed=4))
    trig, _ = _rotate_launch(prepare_qkv(q, k, v, even=True), 500.0, 0, "half", keys_only=True)
    cos, sin = trig_table(T, D, base=500.0)
    assert trig.shape == (2, T, 32) and trig.dtype == torch.float32
    assert torch.equal(trig[0, :, :24], cos) and torch.equal(trig[1, :, :24], sin)


def test_triton_accepts_bf16_on_cpu_via_fp32():
    q, k, v = rand_qkv((1, 2), 33, 16, dtype=torch.bfloat16)
    out = rope.rope_triton(q, k, v)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, softmax_reference(q, k, v, "interleaved")) <= 2e-2
    out = rope.complex_triton(q, k, v, pairing="half")
    assert out.dtype == torch.bfloat16
    assert rel_err(out, linear_reference(q, k, v, "half")) <= 2e-2


@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,offset", [((2, 3, 1, 16), 0), ((1, 2, 130, 24), 0), ((5, 70, 64), 37),
                                          ((2, 1, 2, 19, 2), 1000), ((3, 128), -9)])
def test_triton_prepass_matches_apply_rope(shape, offset, dtype, pairing):
    g = torch.Generator().manual_seed(sum(shape))
    q, k = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(2))
    qr, kr = rotate_qk(q.to(dtype), k.to(dtype), offset=offset, pairing=pairing)
    assert qr.dtype == dtype and qr.shape == q.shape and kr.shape == k.shape
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert rel_err(qr, rotate_reference(q.to(dtype), pairing, offset=offset)) <= tol
    assert rel_err(kr, rotate_reference(k.to(dtype), pairing, offset=offset)) <= tol
    assert rel_err(qr, rope.apply_rope(q, offset=offset, pairing=pairing)) <= 2 * tol


def test_triton_prepass_other_base_and_empty():
    q, k, _ = rand_qkv((2,), 40, 32, seed=1)
    qr, _ = rotate_qk(q.float(), k.float(), base=500000.0, pairing="half")
    assert rel_err(qr, rotate_reference(q, "half", base=500000.0)) <= 1e-5
    e = torch.zeros(2, 0, 16)
    qr, kr = rotate_qk(e, e)
    assert qr.shape == (2, 0, 16) and kr.shape == (2, 0, 16)


# Measured on the interpreter (numpy fp32): max error 6.5e-4 at T = 8192, D = 128, i.e. about 1.3 * T * 2^-24.
TRIG_TOL_8192 = 2e-3


def test_triton_fp32_angles_up_to_8192_match_float64():
    """The fp32 angle t * Omega_n loses precision linearly in t: bound it by 4 ulp of t, and check it grows."""
    err = trig_error(8192, 128)
    t = torch.arange(8192, dtype=torch.float64)
    assert err.max() <= TRIG_TOL_8192
    assert bool((err <= 4 * t * 2.0 ** -24 + 1e-6).all())
    assert err[:64].max() <= 1e-5  # small positions: close to fp32 rounding of cos/sin
    assert err[4096:].max() > 10 * err[:64].max()  # ... and the loss at large t is real, not hidden


@triton.jit
def _shifted_trig_kernel(C, S, log2_base, BR: tl.constexpr, HALF: tl.constexpr, N_TILES: tl.constexpr):
    c0, s0 = rope_cos_sin(tl.arange(0, BR), log2_base, HALF, HALF)  # the table, once (as the templates do)
    rows = tl.arange(0, BR)[:, None] * HALF + tl.arange(0, HALF)[None, :]
    for tile in range(0, N_TILES):
        c, s = rope_shift(c0, s0, tile * BR, log2_base, HALF, HALF)
        tl.store(C + tile * BR * HALF + rows, c)
        tl.store(S + tile * BR * HALF + rows, s)


def test_rotation_hook_angle_addition_up_to_8192_matches_float64():
    """The hook's cos/sin of (start + j) Omega_n by angle addition (a table for j < 64, shifted per tile):
    within the pre-pass's bound (4 ulp of t) at every position up to 8192, for the default and another base."""
    from pathedu.rope import frequencies

    T, BR, D = 8192, 64, 64
    t = torch.arange(T, dtype=torch.float64)
    for base in (10000.0, 500.0):
        c = torch.empty(T, D // 2)
        s = torch.empty(T, D // 2)
        _shifted_trig_kernel[(1,)](c, s, math.log2(base), BR=BR, HALF=D // 2, N_TILES=T // BR)
        theta = t[:, None] * frequencies(D, base=base)
        err = torch.maximum((c.double() - torch.cos(theta)).abs(), (s.double() - torch.sin(theta)).abs()).amax(-1)
        assert bool((err <= 4 * t * 2.0 ** -24 + 1e-6).all()), float((err - 4 * t * 2.0 ** -24).max())
        assert err[:BR].max() <= 1e-5  # the first tile: the table itself (as the pre-pass test bounds it)


_COS_SIN_PTX = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction


def cos_sin(X, Y):
    x = tl.load(X + tl.arange(0, 128))
    tl.store(Y + tl.arange(0, 128), tl.cos(x) + tl.sin(x))


src = ASTSource(fn=JITFunction(cos_sin), signature={"X": "*fp32", "Y": "*fp32"}, constexprs={})
sys.stdout.write(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"])
"""


def test_triton_cos_sin_are_library_routines_not_one_instruction(tmp_path):
    """Why the hook computes its cos/sin table once per program: compiled for an H100 (sm_90, PTX only: no GPU
    needed), fp32 ``tl.cos``/``tl.sin`` are an accurate routine with range reduction (64-bit multiplies, a
    local-memory table walk), not the ``cos.approx``/``sin.approx`` special-function instructions.  Compiled in
    a fresh process without the interpreter, whose patches of ``triton.language`` (left behind when an
    interpreted kernel raises in this process) would break the compiler."""
    import os
    import subprocess
    import sys

    script = tmp_path / "cos_sin_ptx.py"
    script.write_text(_COS_SIN_PTX)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    ptx = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True).stdout
    assert "cos.approx" not in ptx and "sin.approx" not in ptx
    assert "mul.f64" in ptx and "ld.local" in ptx
    assert len(ptx.splitlines()) > 200


# ---------------------------------------------------------------------------
# Empty sequences, bad input
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("form", ALL_FORMS, ids=lambda f: f.__name__)
def test_bad_rope_arguments_name_them(form):
    """What RoPE adds to the shared checks of tests/test_contract.py: even D, `pairing`, `base`."""
    q, k, v = rand_qkv((2,), 8, 16, dtype=torch.float32)
    bad = [
        ((q[..., :15], k[..., :15], v), {}, ValueError, "`q` must have an even head dim"),
        ((q, k, v), {"pairing": "neox"}, ValueError, "`pairing`"),
        ((q, k, v), {"base": -1.0}, ValueError, "`base`"),
        ((q, k, v), {"base": "1e4"}, TypeError, "`base`"),
        ((q, k, v), {"base": float("nan")}, ValueError, "`base`"),
    ]
    for args, kw, exc, needle in bad:
        with pytest.raises(exc, match=needle):
            form(*args, **kw)


def test_apply_rope_bad_input():
    x = torch.randn(3, 4, 10)
    with pytest.raises(ValueError, match="`x` must have an even head dim"):
        rope.apply_rope(x[..., :9])
    with pytest.raises(TypeError, match="`offset`"):
        rope.apply_rope(x, offset=1.5)
    with pytest.raises(TypeError, match="`x`"):
        rope.apply_rope(x.numpy())
    with pytest.raises(ValueError, match="`x`"):
        rope.apply_rope(x[0, 0])
    with pytest.raises(ValueError, match="`pairing`"):
        rope.apply_rope(x, pairing="Half")
    assert rope.apply_rope(x[:, :0]).shape == (3, 0, 10)


def test_prepass_bad_input():
    q, k, _ = rand_qkv((2,), 8, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match="`q` must have an even head dim"):
        rotate_qk(q[..., :15], k[..., :15])
    with pytest.raises(TypeError, match="share one dtype"):
        rotate_qk(q, k.half())
    with pytest.raises(ValueError, match="`k`"):
        rotate_qk(q, k[..., :5, :])
    with pytest.raises(TypeError, match="float64"):
        rotate_qk(q.double(), k.double())
    with pytest.raises(TypeError, match="`offset`"):
        rotate_qk(q, k, offset=None)


# ---------------------------------------------------------------------------
# Numerical robustness at T = 4096 (angles up to 4096 rad): no NaN or inf in any form, fp32
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("form", ALL_FORMS, ids=lambda f: f.__name__)
def test_long_sequences_stay_finite(form):
    # The Triton forms run T = 1024 (FlashAttention at 4096 costs ~10 s in the interpreter); their fp32
    # angles up to 8192 are bounded by test_triton_fp32_angles_up_to_8192_match_float64.
    T = 1024 if form in TRITON_FORMS else 4096
    q, k, v = rand_qkv((1,), T, 16, dtype=torch.float32, seed=21)
    # large pages and blocks: the same arithmetic in fewer Python steps (the default page of 64 costs ~15 s)
    kw = {rope.rope_recurrent: dict(page=1024), rope.rope_blockwise: dict(block_m=512, block_n=512)}.get(form, {})
    out = form(q, k, v, **kw)
    assert torch.isfinite(out).all()
    if form in (rope.rope_matrix, rope.complex_matrix, rope.rope_triton, rope.complex_triton):
        ref = (softmax_reference(q, k, v, "interleaved") if form in (rope.rope_matrix, rope.rope_triton)
               else linear_reference(q, k, v, "interleaved"))
        # fp32 throughout; the triton forms also carry fp32 angles (error ~ t * 2^-24)
        assert rel_err(out, ref) <= 5e-3


# ---------------------------------------------------------------------------
# The benchmark module (its setup functions run on a GPU only)
# ---------------------------------------------------------------------------

def test_bench_module_imports_and_lists_ops_on_cpu():
    from pathedu.bench import CHAPTERS
    from pathedu.bench import rope as bench

    assert "rope" in CHAPTERS
    ops = bench.ops()
    names = [op.name for op in ops]
    assert len(set(names)) == len(names)
    assert {"sdpa", "torch_rope_sdpa", "rope_triton", "torch_rope_linear", "complex_triton"} <= set(names)
    by_name = {op.name: op for op in ops}
    assert by_name["rope_triton"].reference == "torch_rope_sdpa"
    assert by_name["complex_triton"].reference == "torch_rope_linear"
    for op in ops:  # every reference is itself an op, and a reference op has none
        assert op.reference is None or by_name[op.reference].reference is None
    assert by_name["sdpa"].peer and by_name["fla_rope_sdpa"].peer and not by_name["rope_triton"].peer


def test_gpu_checks_bound_the_angles_as_this_file_does():
    """The GPU checks (pathedu.bench.checks, smoke-run on the CPU in tests/test_gpu_checks_cpu.py) hold the
    pre-pass's fp32 angles to this file's bound; here the check itself, on the CPU, at T = 8192 and D = 128."""
    from pathedu.bench import checks

    records, _ = checks.run(["rope.trig"], device="cpu", fla="no", smoke=True)
    long = [r for r in records if r["T"] == 8192 and r["params"]["D"] == 128]
    assert len(long) == 1 and long[0]["ok"], long
    assert long[0]["value"] <= long[0]["limit"] == checks.TRIG_TOL_8192 == TRIG_TOL_8192


# ---------------------------------------------------------------------------
# The complex recurrence's backward pass, and runs in pieces
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("rotation", ["prepass", "fused"])
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_complex_triton_gradients_for_both_rotations_and_pairings(pairing, rotation):
    """fp32 kernel gradients against float64 autograd through the independent reference, T = 100, head dim 24 (pairs
    that pad the hook's tiles): the hook's gradients are those of the turned tiles turned back (the contract
    test covers the default, fused and interleaved)."""
    q, k, v = rand_qkv((1, 2), 100, 24, 16, seed=50)
    errs = gradient_errors(lambda q, k, v: rope.complex_triton(q, k, v, pairing=pairing, rotation=rotation),
                           lambda q, k, v: linear_reference(q, k, v, pairing), dict(q=q, k=k, v=v))
    assert max(errs.values()) <= 2e-6, errs


@pytest.mark.parametrize("rotation", ["prepass", "fused"])
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_complex_triton_state_in_and_out_is_differentiable(pairing, rotation):
    """A complex ``initial_state`` and the returned complex state against complex128 autograd through
    ``complex_recurrent`` (the template's real state is the complex one turned by e^{i Omega} going in and by
    e^{i Omega (T - 1)} coming out)."""
    q, k, v = rand_qkv((2,), 75, 16, 24, seed=51)
    g = torch.Generator().manual_seed(52)
    S0 = torch.complex(*(torch.randn(2, 24, 8, generator=g, dtype=torch.float64) for _ in range(2)))
    errs = gradient_errors(lambda *a, **kw: rope.complex_triton(*a, rotation=rotation, **kw), rope.complex_recurrent,
                           dict(q=q, k=k, v=v), initial_state=S0, pairing=pairing)
    assert max(errs.values()) <= 2e-6, errs


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_complex_triton_prefill_in_pieces_then_decoding_is_one_pass(pairing):
    """Each piece counts its positions from 0: the state carries the phase, as the recurrence's does."""
    q, k, v = (x.float() for x in rand_qkv((2,), 90, 16, 24, seed=53))

    def kernel(*a, **kw):
        return rope.complex_triton(*a, pairing=pairing, **kw)

    def decoder(*a, **kw):
        return rope.complex_recurrent(*a, pairing=pairing, **kw)

    full, S = kernel(q, k, v, return_state=True)
    pieces, S_pieces = run_in_pieces(kernel, decoder, q, k, v, lambda s, e: (), (23, 70))
    assert S.dtype == S_pieces.dtype == torch.complex64 and S.shape == (2, 24, 8)
    assert rel_err(pieces, full) <= 1e-5 and rel_err(torch.view_as_real(S_pieces), torch.view_as_real(S)) <= 1e-5
    ref_out, ref_S = decoder(q.double(), k.double(), v.double(), return_state=True)
    assert rel_err(pieces, ref_out) <= 1e-5 and rel_err(torch.view_as_real(S_pieces), torch.view_as_real(ref_S)) <= 1e-5
