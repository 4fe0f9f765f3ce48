"""The kernel boundary: what every kernel entry point does before a launch.

Every public entry point (:func:`.flash_attention.attention` and its named-hook form
:func:`.flash_attention.biased_attention`, :func:`.linear_attention.chunked_linear_attention`
and :func:`.linear_attention.gated_linear_attention`, :func:`.path_attention.path_attention`,
:func:`.delta_rule.chunked_householder` / :func:`.delta_rule.chunked_delta_rule`,
:func:`.rope.rotate_qk` and the composed :func:`.rope.rotary_attention` /
:func:`.rope.rotary_linear_attention`) validates each argument exactly once, with these
helpers; the chapters' ``*_triton`` forms call an entry point and validate nothing themselves:

* :func:`prepare_qkv`: ``q, k, v`` (types, shapes, dtype, device, the kernels' head
  dims), flattened to ``(BH, T, dim)`` in the compute dtype;
* :func:`per_token`: a per-token tensor ``(..., T)`` or ``(..., T, D)`` (shape, dtype,
  device), flattened to fp32 ``(BH, T[, D])``;
* :func:`per_head`: a float or a tensor broadcastable to the leading dims, as ``(BH,)``;
* :func:`state_rows`: a linear-side ``initial_state`` ``(..., Dv, D)`` (the recurrent forms' ``S``), as the
  kernels' ``S^T`` per head, fp32 ``(BH, D, Dv)``; :func:`state_result` turns a final one back;
* every tensor: not on the meta device and, for the kernels without a backward pass
  (``backward=False``), not requiring grad while grad mode is on (:func:`refuse_grad`);
  the kernels with one take such tensors, and :func:`wants_grad` tells them to go
  through their ``torch.autograd.Function``.

Value conditions (gates <= 0, ``beta`` in [0, 2], ...) are built as 0-dim device
tensors (:mod:`pathedu.checks`: ``log_gate_condition``, ``range_condition``,
``finite_condition``) on the tensors the kernel will read, and read together with
one :class:`pathedu.checks.checked_after` around the launch: the host waits once per
public call, for the check only, after the kernels are queued behind it, so the
device never idles for validation (a bad value raises ``ValueError`` and the output
of the kernel that ran on it is discarded; the kernels are safe on any value).  Nothing is copied for validation, and each input is copied at most once
(only when its dtype or layout must change).  Internal launchers (``_*_launch``)
take what this module returns and check nothing again.
"""
from __future__ import annotations

import math
import numbers

import torch
import triton

from .._device import triton_mode
from ..checks import QKV, check_device, check_kernel_inputs, check_per_token, check_qkv, check_state
from ..rope import check_even


def next_pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots; 16-bit inputs the tensor cores' fast path."""
    return "ieee" if dtype == torch.float32 else "tf32"


def keeping_nans(precision: str) -> str:
    """The backward kernels' version of a product precision (:func:`._pieces.dot`): ``"tf32"`` and ``"x3"`` round
    fp32 operands with two integer operations that turn the GPU's canonical NaN into -0.0, which is harmless where
    the operands are inputs made quiet at the load but not in a gradient's arithmetic: a NaN or inf in ``dO`` (fp16
    training's loss scaling on overflow) vanished from PaTH's ``dq`` (``tests/gpu/test_backward.py``).
    ``"tf32n"``, ``"x3n"`` keep every NaN; ``"ieee"`` and ``"fp16"`` do already."""
    return {"tf32": "tf32n", "x3": "x3n"}.get(precision, precision)


def rotate_args(rotate) -> tuple[str, float]:
    """The templates' rotation hook as launch arguments: ``(ROTATE, log2_base)`` for ``rotate`` =
    ``(base, pairing)`` (RoPE's rotations applied as q and k are loaded), ``("none", 0.0)`` for None."""
    return ("none", 0.0) if rotate is None else (rotate[1], math.log2(rotate[0]))


def row_strides(**tensors: torch.Tensor) -> dict:
    """The launch arguments ``stride_<name>b`` and ``stride_<name>t`` of each tensor ``<name>=x`` laid out as
    ``(BH, T, ...)``: ``x.stride(0)`` (from one head to the next) and ``x.stride(1)`` (from one row to the next),
    under the names the kernels give them."""
    strides = {}
    for name, x in tensors.items():
        strides[f"stride_{name}b"], strides[f"stride_{name}t"] = x.stride(0), x.stride(1)
    return strides


def interpreting() -> bool:
    return triton_mode() == "interpreter"


def refuse_grad(x, name: str) -> None:
    """For a kernel without a backward pass: refuse inputs that would expect one."""
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"`{name}` requires grad, but this kernel has no backward pass yet: call it "
                           f"under torch.no_grad(), or use a PyTorch form (e.g. `*_matrix`) to train")


def as_rows(x: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a contiguous ``shape`` tensor in ``dtype``: no copy when it already is one,
    otherwise exactly one (dtype and layout change together)."""
    if x.dtype == dtype:
        x = x.contiguous()
    else:
        x = x.to(dtype=dtype, memory_format=torch.contiguous_format)
    return x.view(shape)


def wants_grad(*xs) -> bool:
    """Whether autograd will ask for gradients of any of ``xs`` (tensors or None)."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


class Flat:
    """Validated ``q, k, v`` for a kernel (made by :func:`prepare_qkv`).

    ``n``: the sizes (:class:`pathedu.checks.QKV`); ``BH``: the leading dims flattened;
    ``q, k: (BH, T, D)``, ``v: (BH, T, Dv)`` (or None) contiguous in ``dtype``, the
    compute dtype (the input dtype, but fp32 for bf16 in the interpreter);
    ``like``: the caller's ``q`` (output dtype and device).
    """

    def __init__(self, n: QKV, q3, k3, v3, dtype, like):
        self.n, self.BH, self.dtype, self.like = n, math.prod(n.lead), dtype, like
        self.q, self.k, self.v = q3, k3, v3
        self.device = like.device

    @property
    def empty_input(self) -> bool:
        return self.n.T == 0 or self.BH == 0

    def new_output(self, dim: int) -> torch.Tensor:
        """An uninitialised ``(BH, T, dim)`` output in the compute dtype."""
        return torch.empty(self.BH, self.n.T, dim, dtype=self.dtype, device=self.device)

    def result(self, out3: torch.Tensor) -> torch.Tensor:
        """A kernel's ``(BH, T, dim)`` output as ``(..., T, dim)`` in the caller's dtype."""
        return out3.reshape(self.n.lead + tuple(out3.shape[-2:])).to(self.like.dtype)

    def with_qk(self, q3, k3) -> "Flat":
        """The same inputs with ``q, k`` replaced (e.g. rotated), for a second kernel."""
        return Flat(self.n, q3, k3, self.v, self.dtype, self.like)


def prepare_qkv(q, k, v, *, min_dim=16, max_dim=128, even=False, backward=False) -> Flat:
    """Validate ``q, k: (..., T, D)``, ``v: (..., T, Dv)`` for a kernel and flatten the
    leading dims into one (:class:`Flat`).  ``v=None``: only ``q`` and ``k`` (a pre-pass).
    ``even``: ``D`` must be even (RoPE rotates channel pairs).  ``backward``: the caller has a
    backward pass, so inputs that require grad are accepted (the flattening keeps their graph).

    In interpreter mode bf16 inputs are upcast to fp32 (the interpreter's bf16
    arithmetic is wrong); :meth:`Flat.result` casts the output back to the input dtype.
    """
    n: QKV = check_qkv(q, k, k if v is None else v)
    if even:
        check_even(n.D, "q")
    check_kernel_inputs(n, q.dtype, min_dim=min_dim, max_dim=max_dim)
    if not backward:
        for name, x in (("q", q), ("k", k), ("v", v)):
            refuse_grad(x, name)
    if not interpreting() and q.device.type != "cuda":
        raise ValueError(f"Triton forms need CUDA tensors on a GPU machine; `q` is on {q.device}")
    dtype = torch.float32 if interpreting() and q.dtype == torch.bfloat16 else q.dtype
    BH = math.prod(n.lead)
    q3 = as_rows(q, (BH, n.T, n.D), dtype)
    k3 = as_rows(k, (BH, n.T, n.D), dtype)
    v3 = None if v is None else as_rows(v, (BH, n.T, n.Dv), dtype)
    return Flat(n, q3, k3, v3, dtype, q)


def per_token(x, name: str, flat: Flat, *, extra: tuple = (), backward: bool = False) -> torch.Tensor:
    """Validate a per-token tensor ``(..., T) + extra`` and return it as contiguous fp32
    ``(BH, T) + extra`` (gates and transitions are kept in fp32).  ``backward``: as :func:`prepare_qkv`."""
    check_per_token(x, name, flat.n, flat.like, extra=extra)
    if not backward:
        refuse_grad(x, name)
    return as_rows(x, (flat.BH, flat.n.T) + tuple(extra), torch.float32)


def per_head(x, name: str, flat: Flat, dtype=torch.float32, backward: bool = False) -> torch.Tensor:
    """A real number, or a real tensor broadcastable to the leading dims, as contiguous
    ``(BH,)`` in ``dtype`` on the inputs' device (values are not checked here)."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"`{name}` must be a real tensor, got dtype {x.dtype}")
        check_device(x, name)
        if not backward:
            refuse_grad(x, name)
        t = x.to(device=flat.device, dtype=dtype)
    elif isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"`{name}` must be a float or a tensor, got {type(x).__name__}")
    else:
        t = torch.full((), float(x), dtype=dtype, device=flat.device)  # a fill, no host-to-device copy
    try:
        t = torch.broadcast_to(t, flat.n.lead)
    except RuntimeError:
        raise ValueError(f"`{name}` of shape {tuple(t.shape)} does not broadcast to the leading dims "
                         f"{flat.n.lead} (pass a float, or one value per head)") from None
    return t.reshape(flat.BH).contiguous()


def state_rows(state, flat: Flat, *, name: str = "initial_state") -> torch.Tensor:
    """Validate a linear-side state ``S: (..., Dv, D)`` (a recurrent form's ``initial_state``: any floating dtype,
    ``q``'s device) and return ``S^T`` of each head, the linear template's ``H``: contiguous fp32 ``(BH, D, Dv)``.
    The conversion is differentiable: a state that requires grad gets its gradient."""
    n = flat.n
    check_state(state, n.lead + (n.Dv, n.D), flat.like, name=name, shape_note=" (leading dims, Dv, D)")
    return as_rows(state.reshape(flat.BH, n.Dv, n.D).transpose(1, 2), (flat.BH, n.D, n.Dv), torch.float32)


def state_result(ht: torch.Tensor, flat: Flat) -> torch.Tensor:
    """A kernel's final states ``H = S^T`` (fp32 ``(BH, D, Dv)``) as the recurrent forms return ``S``:
    ``(..., Dv, D)``, fp32."""
    return ht.transpose(1, 2).reshape(flat.n.lead + (flat.n.Dv, flat.n.D))
