r"""RoPE softmax attention and the complex-valued linear recurrence: every form of both sides.

Complex side (a diagonal gate of unit modulus, ``A_t = e^{i Omega}``)::

    S_t = S_{t-1} e^{i Omega} + v_t k~_t^H,      o_t = Re{ S_t q~_t }     (S_t is Dv x D/2, complex)

Unrolled, the product of gates between key j and query t is ``e^{i Omega (t-j)}``::

    o_t = sum_{j<=t} Re{ k~_j^H e^{i Omega (t-j)} q~_t } v_j = sum_{j<=t} (R^{t-j} q_t . k_j) v_j

where ``R^p`` rotates channel pair n by the angle ``p * Omega_n``.  Because
``R^{t-j} = (R^j)^T R^t`` (rotations compose), the same logit is ``(R^t q_t) . (R^j k_j)``:
rotate each query and key by its own absolute position, then use any attention
code unchanged.  With a softmax readout instead of the linear one, this is
RoPE (RoFormer):

    o_i = sum_{j<=i} softmax_j(scale * (R^i q_i) . (R^j k_j)) v_j

Conventions, used by every function here and by :mod:`pathedu.kernels.rope`:

* **Frequencies** ``Omega_n = base ** (-2 n / D)`` for ``n = 0 .. D/2 - 1``
  (:func:`frequencies`); ``D`` (the head dim of ``q`` and ``k``) must be even.
* **Channel pairing** (``pairing=``): the pair ``(a_n, b_n)`` that rotates
  together, read as the complex number ``a_n + i b_n``:

  - ``"interleaved"`` (RoFormer): ``a_n = x[2n]``, ``b_n = x[2n + 1]``;
  - ``"half"`` (GPT-NeoX / Llama style): ``a_n = x[n]``, ``b_n = x[n + D/2]``.

  Both give the same attention as long as ``q`` and ``k`` use the same one;
  they differ by a fixed permutation of the channels.
* **Rotation direction**: position ``p`` turns each pair counter-clockwise by
  ``+p * Omega_n``: ``(a, b) -> (a cos - b sin, a sin + b cos)``, i.e.
  ``a + i b -> (a + i b) e^{+i p Omega_n}``.  This is the direction in which the
  complex recurrence above equals linear attention on rotated ``q``, ``k``
  (checked in the tests; rotating by ``-p Omega`` corresponds to the gate ``e^{-i Omega}``).
* **Positions** are 0-based: row ``t`` of a ``(..., T, D)`` tensor sits at
  position ``offset + t`` (:func:`apply_rope`).
* **Angles** ``p * Omega_n`` are computed in float64 in every reference form, then
  cos/sin are cast to the working dtype (the Triton pre-pass computes them in
  fp32; see :mod:`pathedu.kernels.rope` for what that costs at large ``p``).

Shapes everywhere: ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, output
``(..., T, Dv)``; the leading dims (batch, heads, ...) must agree.

Non-finite inputs: a NaN or inf in ``q``, ``k`` or ``v`` at position t changes
only the outputs at positions >= t (masks are selects, and masked weights never
multiply it: :func:`pathedu.masks.causal_matmul`).

================  ==================================  ==================================
form              softmax side (RoPE)                 linear side (complex recurrence)
================  ==================================  ==================================
naive             ``rope_naive``: loop over i,        ``complex_naive``: loop over i,
                  relative rotation ``R^{i-j} q_i``   ``Re{conj(k~_j) e^{iO(i-j)} q~_i}``
recurrent         ``rope_recurrent``: KV cache of     ``complex_recurrent``: complex
                  rotated keys                        state ``S_t``
matrix            ``rope_matrix``: softmax of         ``complex_matrix``: phases
                  rotated ``Q K^T``                   ``e^{iOt} e^{-iOj}``
blockwise         ``rope_blockwise``: online softmax  ``complex_chunked``: chunks, phases
                  over key blocks, rotated per block  relative to the chunk start
Triton            ``rope_triton``: rotation pre-pass  ``complex_triton``: rotation
                  + FlashAttention template           pre-pass + chunked linear template
================  ==================================  ==================================
"""
from __future__ import annotations

import math
import numbers

import torch

from .checks import QKV, check_floating, check_positive_int, check_qkv, check_scale
from .masks import causal_matmul
from .nope import KVCache, _state_or_zeros, blockwise_softmax, causal_softmax, empty_output

__all__ = [
    "PAIRINGS", "frequencies", "apply_rope", "rotation_matrix", "to_complex", "from_complex",
    "rope_logits", "relative_kernel", "decay_bound", "upper_envelope", "plot_relative_kernel",
    "rope_naive", "rope_recurrent", "rope_matrix", "rope_blockwise", "rope_triton",
    "complex_naive", "complex_recurrent", "complex_matrix", "complex_chunked", "complex_triton",
]

ROTATIONS = ("prepass", "fused")  # how the Triton forms rotate q and k (see rope_triton)
PAIRINGS = ("interleaved", "half")


# ---------------------------------------------------------------------------
# Argument checks (each error names the argument)
# ---------------------------------------------------------------------------

def check_base(base) -> float:
    """``base`` of the frequencies: a positive finite number."""
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"`base` must be a positive number, got {type(base).__name__}")
    if not (0 < float(base) < math.inf):
        raise ValueError(f"`base` must be positive and finite, got {base}")
    return float(base)


def check_pairing(pairing) -> str:
    """``pairing``: ``"interleaved"`` (channels 2n, 2n+1) or ``"half"`` (channels n, n + D/2)."""
    if pairing not in PAIRINGS:
        raise ValueError(f"`pairing` must be one of {PAIRINGS}, got {pairing!r}")
    return pairing


def check_rotation(rotation) -> str:
    """``rotation`` (of the Triton forms) is ``"prepass"`` (q and k rotated by a pass through memory, then
    the template) or ``"fused"`` (the templates' rotation hook turns them as they are loaded)."""
    if rotation not in ROTATIONS:
        raise ValueError(f"`rotation` must be one of {ROTATIONS}, got {rotation!r}")
    return rotation


def check_offset(offset) -> int:
    """``offset``: the position of row 0, an integer (negative values rotate backwards)."""
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral):
        raise TypeError(f"`offset` must be an int, got {type(offset).__name__}")
    return int(offset)


def check_even(D: int, name: str) -> None:
    """Rotations act on channel pairs, so the head dim must be even."""
    if D % 2:
        raise ValueError(f"`{name}` must have an even head dim (RoPE rotates channel pairs), got D={D}")


def _check_rope_qkv(q, k, v, base, pairing) -> tuple[QKV, float, str]:
    n = check_qkv(q, k, v)
    check_even(n.D, "q")
    return n, check_base(base), check_pairing(pairing)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is rotated in float32 (one rounding back)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------
# Frequencies, pairs, rotations
# ---------------------------------------------------------------------------

def frequencies(D: int, *, base: float = 10000.0, dtype=torch.float64, device=None) -> torch.Tensor:
    """``Omega_n = base ** (-2 n / D)`` for ``n = 0 .. D/2 - 1``, shape ``(D/2,)``.

    Pair 0 turns by one radian per position (wavelength ``2 pi``); the last pair
    turns slowest, with wavelength ``2 pi base^{(D-2)/D}``.  Computed in float64.
    """
    if isinstance(D, bool) or not isinstance(D, numbers.Integral) or D <= 0:
        raise ValueError(f"`D` must be a positive int, got {D!r}")
    check_even(int(D), "D")
    return _frequencies(int(D), check_base(base), device).to(dtype)


def _frequencies(D: int, base: float, device) -> torch.Tensor:
    """:func:`frequencies` (float64) of an already validated ``D`` and ``base``."""
    n = torch.arange(D // 2, dtype=torch.float64, device=device)
    return torch.pow(torch.tensor(base, dtype=torch.float64, device=device), -2.0 * n / D)


def channel_pairs(x: torch.Tensor, pairing: str):
    """The two components ``(a, b)`` of every channel pair of ``x: (..., D)``, each ``(..., D/2)``: channels
    ``2m, 2m+1`` for the ``"interleaved"`` pairing, ``m, m + D/2`` for ``"half"``."""
    if pairing == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def _unpair(a: torch.Tensor, b: torch.Tensor, pairing: str) -> torch.Tensor:
    """Inverse of :func:`channel_pairs`."""
    if pairing == "interleaved":
        return torch.stack((a, b), dim=-1).flatten(-2)
    return torch.cat((a, b), dim=-1)


def _cos_sin(pos: torch.Tensor, D: int, base: float, dtype, device):
    """``cos`` and ``sin`` of the angles ``pos[t] * Omega_n`` (computed in float64), each ``(T, D/2)`` in ``dtype``."""
    theta = pos[:, None] * _frequencies(D, base, device)[None, :]
    return torch.cos(theta).to(dtype), torch.sin(theta).to(dtype)


def _rotate_cs(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, pairing: str) -> torch.Tensor:
    """Turn every pair ``(a, b)`` of ``x`` by the angle whose cos/sin are ``c, s``: ``(a c - b s, a s + b c)``."""
    a, b = channel_pairs(x, pairing)
    return _unpair(a * c - b * s, a * s + b * c, pairing)


def _rotate(x: torch.Tensor, pos: torch.Tensor, base: float, pairing: str) -> torch.Tensor:
    """Rotate row t of ``x: (..., T, D)`` by the angles ``pos[t] * Omega`` (``pos``: float64 ``(T,)``)."""
    work = _work_dtype(x.dtype)
    c, s = _cos_sin(pos, x.shape[-1], base, work, x.device)
    return _rotate_cs(x.to(work), c, s, pairing).to(x.dtype)


def _positions(T: int, offset: int, device) -> torch.Tensor:
    return torch.arange(T, dtype=torch.float64, device=device) + offset


def apply_rope(x, *, base: float = 10000.0, offset: int = 0, pairing: str = "interleaved") -> torch.Tensor:
    """Rotate every row of ``x: (..., T, D)`` by its position: row t by ``R^{offset + t}``.

    Channel pair n of row t (``(x[2n], x[2n+1])`` for ``pairing="interleaved"``,
    ``(x[n], x[n + D/2])`` for ``pairing="half"``) turns counter-clockwise by
    ``(offset + t) * Omega_n`` with ``Omega_n = base ** (-2n/D)``:
    ``(a, b) -> (a cos - b sin, a sin + b cos)``.  ``offset`` places the block
    at any position, e.g. one decoded token at position t is
    ``apply_rope(x_t[..., None, :], offset=t)``; negative offsets rotate backwards
    (``R^{-j}``).  Angles are float64; the rotation runs in float32 (float64
    for float64 input) and the result is cast back to ``x.dtype``.
    Norm-preserving: ``|apply_rope(x)[..., t, :]| = |x[..., t, :]|``.
    """
    check_floating(x, "x")
    if x.dim() < 2:
        raise ValueError(f"`x` must have shape (..., T, D) with at least 2 dims, got shape {tuple(x.shape)}")
    check_even(x.shape[-1], "x")
    base, pairing, offset = check_base(base), check_pairing(pairing), check_offset(offset)
    return _rotate(x, _positions(x.shape[-2], offset, x.device), base, pairing)


def rotation_matrix(p, D: int, *, base: float = 10000.0, pairing: str = "interleaved",
                    dtype=torch.float64) -> torch.Tensor:
    """The real ``(D, D)`` matrix ``R^p`` (block-diagonal 2x2 rotations in the pairing's channel order).

    ``R^p @ x`` equals ``apply_rope(x[None], offset=p)[0]`` for a vector ``x: (D,)``;
    ``R^a @ R^b = R^{a+b}`` and ``(R^p)^T = R^{-p}``.  ``p`` may be any real number.
    """
    pairing = check_pairing(pairing)
    theta = float(p) * frequencies(D, base=base)
    c, s = torch.cos(theta), torch.sin(theta)
    ia, ib = channel_pairs(torch.arange(D), pairing)  # channel indices of the pairs' two components
    R = torch.zeros(D, D, dtype=torch.float64)
    R[ia, ia], R[ia, ib], R[ib, ia], R[ib, ib] = c, -s, s, c
    return R.to(dtype)


def to_complex(x: torch.Tensor, pairing: str = "interleaved") -> torch.Tensor:
    """The complex view ``x~ = a + i b`` of ``x: (..., D)``, shape ``(..., D/2)``.

    complex128 for float64 input, complex64 otherwise (torch has no usable
    16-bit complex type).  Inverse: :func:`from_complex`.
    """
    pairing = check_pairing(pairing)
    check_even(x.shape[-1], "x")
    return _to_complex(x, pairing)


def _to_complex(x: torch.Tensor, pairing: str) -> torch.Tensor:
    """:func:`to_complex` of an already validated ``x`` and ``pairing``."""
    a, b = channel_pairs(x.to(_work_dtype(x.dtype)), pairing)
    return torch.complex(a, b)


def from_complex(z: torch.Tensor, pairing: str = "interleaved") -> torch.Tensor:
    """Inverse of :func:`to_complex`: ``(..., D/2)`` complex -> ``(..., D)`` real."""
    return _unpair(z.real, z.imag, check_pairing(pairing))


def _phases(pos: torch.Tensor, D: int, base: float, cdtype, device) -> torch.Tensor:
    """``e^{i pos[t] Omega_n}``, shape ``(T, D/2)``, angles in float64."""
    theta = pos[:, None] * _frequencies(D, base, device)[None, :]
    return torch.polar(torch.ones_like(theta), theta).to(cdtype)


def rope_logits(q, k, *, base: float = 10000.0, scale=None, pairing: str = "interleaved",
                offset: int = 0) -> torch.Tensor:
    """The unmasked RoPE logits ``scale * (R^{offset+i} q_i) . (R^{offset+j} k_j)``, ``(..., T, T)``.

    They depend on ``i - j`` only, so ``offset`` changes nothing (up to rounding).
    """
    n, base, pairing = _check_rope_qkv(q, k, k, base, pairing)
    scale = check_scale(scale, n.D)
    pos = _positions(n.T, check_offset(offset), q.device)
    return scale * _rotate(q, pos, base, pairing) @ _rotate(k, pos, base, pairing).transpose(-1, -2)


# ---------------------------------------------------------------------------
# The relative-position kernel and its long-range behaviour
# ---------------------------------------------------------------------------

def relative_kernel(delta, D: int = 128, *, base: float = 10000.0, bands=None) -> torch.Tensor:
    """``mean_n cos(Omega_n * delta)``: the RoPE logit between unit pairs of equal phase, per distance.

    It is ``q . R^delta q / |q|^2`` for a query whose pairs all have the same
    length, i.e. how strongly a token still matches its own copy ``delta``
    positions back (1 at ``delta = 0``).  ``delta``: tensor or list of distances;
    ``bands=(lo, hi)`` keeps only the pairs ``lo <= n < hi``.  float64.
    """
    d = torch.as_tensor(delta, dtype=torch.float64)
    om = frequencies(D, base=base)
    if bands is not None:
        om = om[bands[0]:bands[1]]
    return torch.cos(d[..., None] * om).mean(-1)


def decay_bound(delta, D: int = 128, *, base: float = 10000.0) -> torch.Tensor:
    """RoFormer's long-term-decay envelope, normalised to 1 at ``delta = 0``.

    By Abel summation, ``|sum_n h_n e^{i delta Omega_n}| <= (max_n |h_{n+1} - h_n|) *
    sum_{m=1}^{D/2} |S_m|`` with the partial sums ``S_m = sum_{n<m} e^{i delta Omega_n}``;
    RoFormer (Su et al. 2024, section 3.4.3) plots ``(2/D) sum_m |S_m|`` against the
    distance and observes that it decays.  Returned here divided by its value at
    ``delta = 0``, ``(D/2 + 1)/2``, so that it starts at 1 like :func:`relative_kernel`.
    Shape of ``delta``, float64.
    """
    d = torch.as_tensor(delta, dtype=torch.float64)
    om = frequencies(D, base=base)
    theta = d[..., None] * om
    partial = torch.cumsum(torch.polar(torch.ones_like(theta), theta), dim=-1)
    half = D // 2
    return partial.abs().mean(-1) / ((half + 1) / 2)


def upper_envelope(values: torch.Tensor) -> torch.Tensor:
    """``env[i] = max_{i' >= i} |values[i']|``: the largest magnitude at this distance or beyond."""
    return values.abs().flip(-1).cummax(-1).values.flip(-1)


def plot_relative_kernel(ax=None, *, D: int = 128, base: float = 10000.0, max_delta: int = 8192,
                         bands=None, bound: bool = False, label=None):
    """Plot :func:`relative_kernel` against the distance (log x axis), its :func:`upper_envelope`
    (taken over distances up to ``2 max_delta``, so that the right end is not cut short),
    and, with ``bound=True``, RoFormer's normalised bound :func:`decay_bound`."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    delta = torch.arange(2 * max_delta + 1, dtype=torch.float64)
    kern = relative_kernel(delta, D, base=base, bands=bands)
    env = upper_envelope(kern)
    delta, kern, env = delta[1 : max_delta + 1], kern[1 : max_delta + 1], env[1 : max_delta + 1]
    line, = ax.plot(delta, kern, lw=0.6, alpha=0.8, label=label or "κ(Δ) = mean of cos(Ω_n Δ)")
    ax.plot(delta, env, lw=1.6, color=line.get_color(), label="envelope: max |κ| at Δ or beyond")
    if bound:
        ax.plot(delta, decay_bound(delta, D, base=base), lw=1.2, ls="--", color="gray",
                label="RoFormer's bound (normalised)")
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlim(1, max_delta)
    ax.set_xlabel("relative distance Δ = t − j")
    ax.set_ylabel("logit against its own copy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return ax


# ---------------------------------------------------------------------------
# Softmax side: RoPE attention
# ---------------------------------------------------------------------------

def rope_naive(q, k, v, *, base: float = 10000.0, scale=None, pairing: str = "interleaved"):
    """The definition through the gate product, one query at a time.

    For query i and every key ``j <= i``, rotate ``q_i`` by the *relative*
    distance, ``R^{i-j} q_i`` (the unrolled gate ``e^{i Omega (i-j)}``), and take
    ``logit_ij = scale * k_j . R^{i-j} q_i``; then a softmax over j.  No absolute
    position is ever used: that it equals ``(R^i q_i) . (R^j k_j)`` is rotation
    composition.  Shapes: ``q, k: (..., T, D)`` (D even), ``v: (..., T, Dv)`` ->
    ``(..., T, Dv)``; ``scale=None`` means ``D ** -0.5``; ``pairing`` as in the module docstring.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    work = _work_dtype(q.dtype)
    # cos/sin of the gate product for every distance d = 0..T-1 (row d: angle d * Omega_n)
    c, s = _cos_sin(_positions(n.T, 0, q.device), n.D, base, work, q.device)
    outs = []
    for i in range(n.T):
        # keys j = 0..i sit at distances i - j = i..0: the tables' first i+1 rows, reversed
        q_i = q[..., i : i + 1, :].to(work).expand(*n.lead, i + 1, n.D)
        q_rel = _rotate_cs(q_i, c[: i + 1].flip(0), s[: i + 1].flip(0), pairing).to(q.dtype)  # R^{i-j} q_i
        logits = scale * (q_rel * k[..., : i + 1, :]).sum(-1)
        outs.append(torch.einsum("...j,...jd->...d", torch.softmax(logits, dim=-1), v[..., : i + 1, :]))
    return torch.stack(outs, dim=-2)


def rope_recurrent(q, k, v, *, base: float = 10000.0, scale=None, pairing: str = "interleaved",
                   page: int = 64):
    """Decoding, token by token, with a :class:`pathedu.nope.KVCache` of *rotated* keys.

    At step t the new key is rotated once by ``R^t`` (what
    ``apply_rope(k_t, offset=t)`` does; the cos/sin of every position come from
    one table) and cached; the query rotated by ``R^t`` attends to the cache.
    Keys never need re-rotating: the angle between a cached key and any later
    query depends only on their distance.  Shapes as :func:`rope_naive`.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    scale = check_scale(scale, n.D)
    page = check_positive_int(page, "page")
    if n.T == 0:
        return empty_output(q, v)
    work = _work_dtype(q.dtype)
    c, s = _cos_sin(_positions(n.T, 0, q.device), n.D, base, work, q.device)  # row t: the angles of R^t
    cache = KVCache(n.lead, n.D, n.Dv, n.T, dtype=q.dtype, device=q.device, page=page)
    outs = []
    for t in range(n.T):
        k_t = _rotate_cs(k[..., t, :].to(work), c[t], s[t], pairing).to(q.dtype)  # R^t k_t
        q_t = _rotate_cs(q[..., t, :].to(work), c[t], s[t], pairing).to(q.dtype)  # R^t q_t
        cache.append(k_t, v[..., t, :])
        outs.append(cache.attend(q_t, scale))
    return torch.stack(outs, dim=-2)


def rope_matrix(q, k, v, *, base: float = 10000.0, scale=None, pairing: str = "interleaved"):
    """Parallel form: ``softmax(scale (R Q)(R K)^T + M) V`` with the causal mask M (-inf above the diagonal).

    Rotate all queries and keys by their absolute positions, then run NoPE's
    :func:`pathedu.nope.nope_matrix` unchanged (its body,
    :func:`pathedu.nope.causal_softmax`: the arguments are validated once, here).
    Shapes as :func:`rope_naive`.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    scale = check_scale(scale, n.D)
    if n.T == 0:
        return empty_output(q, v)
    pos = _positions(n.T, 0, q.device)
    qr, kr = _rotate(q, pos, base, pairing), _rotate(k, pos, base, pairing)
    return causal_softmax(scale * qr @ kr.transpose(-1, -2), v)  # nope_matrix's body


def rope_blockwise(q, k, v, *, base: float = 10000.0, scale=None, pairing: str = "interleaved",
                   block_m: int = 64, block_n: int = 64):
    """FlashAttention with the rotation fused into the block loads.

    Each query block (rows ``start_m..``) is rotated by its positions when it is
    loaded, each key block likewise (what ``apply_rope(block, offset=start)``
    does; the cos/sin rows come from one table, as a fused kernel would compute
    them in registers); the online softmax
    (:func:`pathedu.nope.online_softmax_step`) is NoPE's, unchanged.
    Never materialises a ``T x T`` matrix.  Shapes as :func:`rope_naive`.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    scale = check_scale(scale, n.D)
    block_m, block_n = check_positive_int(block_m, "block_m"), check_positive_int(block_n, "block_n")
    if n.T == 0:
        return empty_output(q, v)
    work = _work_dtype(q.dtype)
    c, s = _cos_sin(_positions(n.T, 0, q.device), n.D, base, work, q.device)

    def load_rotated(x, start, end):  # rows start..end-1 of x, rotated by their positions
        return _rotate_cs(x[..., start:end, :].to(work), c[start:end], s[start:end], pairing).to(q.dtype)

    return blockwise_softmax(q, k, v, scale, load=load_rotated, block_m=block_m, block_n=block_n)


def rope_triton(q, k, v, *, base: float = 10000.0, scale=None, pairing: str = "interleaved",
                rotation: str = "prepass"):
    """Triton: a rotation pre-pass (fp32 angles and cos/sin computed in-kernel), then the FlashAttention
    template (:func:`pathedu.kernels.flash_attention.attention`).  With gradients the pass turns q and k
    (:func:`pathedu.kernels.rope.rotate_qk`) and the template runs unchanged; without, the pass turns the keys
    alone and stores its cos/sin, from which the template turns each query tile as it loads it (half the pass's
    traffic, the same logits).  ``rotation="fused"``: the template's rotation hook turns q and k as it loads
    them instead (no pass through memory; inference only).  On an H100 the fused hook is 1.8-2.2x slower than
    the pre-pass (``pathedu/data/bench_rope.json``: each key tile is turned once per query block), hence the
    default (``kernels/NOTES_flash.md``, "RoPE's rotation").

    fp16/bf16/fp32, head dims 16..128 (even), fp32 accumulation.  Shapes and
    conventions as :func:`rope_naive`.  On a CPU it runs in Triton's interpreter
    (bf16 computed in fp32 there).  The launches are composed, and every
    argument validated once, by :func:`pathedu.kernels.rope.rotary_attention`.
    """
    from .kernels.rope import rotary_attention

    return rotary_attention(q, k, v, base=base, scale=scale, pairing=pairing, rotation=rotation)


# ---------------------------------------------------------------------------
# Linear side: the complex-valued recurrence
# ---------------------------------------------------------------------------

def complex_naive(q, k, v, *, base: float = 10000.0, pairing: str = "interleaved"):
    """The unrolled definition in complex arithmetic, one query at a time:
    ``o_i = sum_{j<=i} Re{ sum_n conj(k~_{j,n}) e^{i Omega_n (i-j)} q~_{i,n} } v_j``.

    ``q~, k~ = to_complex(q), to_complex(k)`` under ``pairing``.  complex128 for
    float64 input, complex64 otherwise; the output is cast to ``q.dtype``.
    No scale, no normalisation.  Shapes: ``q, k: (..., T, D)`` (D even),
    ``v: (..., T, Dv)`` -> ``(..., T, Dv)``.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    if n.T == 0:
        return empty_output(q, v)
    zq, zk = _to_complex(q, pairing), _to_complex(k, pairing)
    work = _work_dtype(q.dtype)
    gates = _phases(_positions(n.T, 0, q.device), n.D, base, zq.dtype, q.device)  # e^{i Omega d}, d = 0..T-1
    outs = []
    for i in range(n.T):
        gate = gates[: i + 1].flip(0)  # e^{i Omega (i - j)} for j = 0..i
        w = (zk[..., : i + 1, :].conj() * gate * zq[..., i : i + 1, :]).sum(-1).real
        outs.append(torch.einsum("...j,...jd->...d", w, v[..., : i + 1, :].to(work)))
    return torch.stack(outs, dim=-2).to(q.dtype)


def complex_recurrent(q, k, v, *, base: float = 10000.0, pairing: str = "interleaved",
                      initial_state=None, return_state: bool = False):
    """The RNN: ``S_t = S_{t-1} e^{i Omega} + v_t k~_t^H``, ``o_t = Re{S_t q~_t}``.

    ``S_t``: complex ``(..., Dv, D/2)``; ``e^{i Omega}`` multiplies column n of
    the state by ``e^{i Omega_n}`` (a diagonal gate acting on the right, as
    ``A_t`` does in ``S_t = S_{t-1} A_t + v_t k_t^T``).  Every eigenvalue has
    modulus 1: the state never decays, it only turns.  ``initial_state`` /
    returned state: complex ``(..., Dv, D/2)`` (complex128 for float64 input,
    complex64 otherwise).  Shapes as :func:`complex_naive`.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    S = _complex_state(initial_state, n, q)
    zq, zk = _to_complex(q, pairing), _to_complex(k, pairing)
    work = _work_dtype(q.dtype)
    gate = _phases(torch.ones(1, dtype=torch.float64, device=q.device), n.D, base, zq.dtype, q.device)[0]
    vc = v.to(work).to(zq.dtype)
    outs = []
    for t in range(n.T):
        S = S * gate + vc[..., t, :, None] * zk[..., t, None, :].conj()
        outs.append((S @ zq[..., t, :, None])[..., 0].real)
    out = torch.stack(outs, dim=-2).to(q.dtype) if outs else empty_output(q, v)
    return (out, S) if return_state else out


def _complex_state(state, n: QKV, like: torch.Tensor) -> torch.Tensor:
    """Zeros, or ``state: (..., Dv, D/2)`` (complex, or real) checked and copied as complex128
    (float64 ``like``) or complex64.  Errors name ``initial_state``."""
    cdtype = torch.complex128 if like.dtype == torch.float64 else torch.complex64
    return _state_or_zeros(state, n.lead + (n.Dv, n.D // 2), cdtype, like, allow_complex=True)


def complex_matrix(q, k, v, *, base: float = 10000.0, pairing: str = "interleaved"):
    """Parallel form: ``(Re{(Q~ e^{i Omega t}) (K~ e^{i Omega j})^H} * M) V`` with the 0/1 causal mask M.

    The gate product ``e^{i Omega (t-j)}`` factors into a phase on the query
    row and a conjugate phase on the key row: rotation composition in complex
    form.  Shapes as :func:`complex_naive`; O(T^2) memory.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    zq, zk = _to_complex(q, pairing), _to_complex(k, pairing)
    ph = _phases(_positions(n.T, 0, q.device), n.D, base, zq.dtype, q.device)
    w = ((zq * ph) @ (zk * ph).conj().transpose(-1, -2)).real.tril()  # the mask M as a select
    return causal_matmul(w, v.to(w.dtype)).to(q.dtype)


def complex_chunked(q, k, v, *, base: float = 10000.0, pairing: str = "interleaved", chunk: int = 64):
    """Chunkwise-parallel complex recurrence, with phases relative to each chunk's start.

    For a chunk of ``L`` tokens starting at ``s`` and local index ``r = 0..L-1``,
    let ``P_r = e^{i Omega (r + 1)}`` (the gate product from the state ``S_{s-1}``
    to token ``s + r``), ``Q' = Q~_c * P`` and ``K' = K~_c * P``.  Then::

        O_c = Re{Q' S^T} + (Re{Q' K'^H} * M) V_c,     S <- (S + V_c^T conj(K')) e^{i Omega L}

    the complex twin of the scalar-gate chunk template (:mod:`pathedu.kernels.linear_attention`,
    where ``e^{b}`` plays the part of ``P``).  Every angle stays below
    ``chunk * Omega_n``, whatever the position.  ``S``: complex ``(..., Dv, D/2)``.
    Shapes as :func:`complex_naive`.
    """
    n, base, pairing = _check_rope_qkv(q, k, v, base, pairing)
    chunk = check_positive_int(chunk, "chunk")
    zq, zk = _to_complex(q, pairing), _to_complex(k, pairing)
    work = _work_dtype(q.dtype)
    vw = v.to(work)
    v_finite = bool(torch.isfinite(vw).all())
    S = torch.zeros(n.lead + (n.Dv, n.D // 2), dtype=zq.dtype, device=q.device)
    out = torch.empty(q.shape[:-1] + (n.Dv,), dtype=work, device=q.device)
    # P[r] = e^{i Omega (r+1)}, r = 0..chunk-1; a chunk of L tokens advances the state by P[L-1] = e^{i Omega L}.
    P = _phases(_positions(min(chunk, n.T), 1, q.device), n.D, base, zq.dtype, q.device)
    for s in range(0, n.T, chunk):
        e = min(s + chunk, n.T)
        L = e - s
        qc, kc, vc = zq[..., s:e, :] * P[:L], zk[..., s:e, :] * P[:L], vw[..., s:e, :]
        intra = (qc @ kc.conj().transpose(-1, -2)).real.tril()  # the mask M as a select
        out[..., s:e, :] = (qc @ S.transpose(-1, -2)).real + causal_matmul(intra, vc, finite=v_finite)
        S = (S + vc.transpose(-1, -2).to(zq.dtype) @ kc.conj()) * P[L - 1]
    return out.to(q.dtype)


def complex_triton(q, k, v, *, base: float = 10000.0, pairing: str = "interleaved", rotation: str = "fused",
                   initial_state=None, return_state: bool = False):
    """Triton: chunked linear attention (:func:`pathedu.kernels.linear_attention.chunked_linear_attention`)
    whose rotation hook turns q and k by ``+Omega t`` as each chunk is loaded (``rotation="fused"``, the
    default: 0.73-0.76x the time of the pre-pass on an H100, ``pathedu/data/bench_rope.json``), or
    ``rotation="prepass"``: the rotation pre-pass (:func:`pathedu.kernels.rope.rotate_qk`) through memory,
    then the plain template.

    This *is* the chapter's claim: the complex recurrence is linear attention on
    ``q, k`` rotated by ``+Omega t``.  fp16/bf16/fp32, head dims 16..128 (even),
    fp32 state.  Shapes as :func:`complex_naive`.  ``initial_state`` / ``return_state`` as
    :func:`complex_recurrent` (complex ``(..., Dv, D/2)``; the returned state is complex64).
    Differentiable in ``q, k, v`` and ``initial_state``, and through the returned state.  The
    launches are composed, and every argument validated once, by
    :func:`pathedu.kernels.rope.rotary_linear_attention`.
    """
    from .kernels.rope import rotary_linear_attention

    return rotary_linear_attention(q, k, v, base=base, pairing=pairing, rotation=rotation,
                                   initial_state=initial_state, return_state=return_state)
