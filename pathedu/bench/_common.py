"""What the benchmark ops of every chapter and the GPU checks share (one home).

* :func:`generator`, :func:`seeded_qkv`: seeded inputs on any device;
* :func:`sdpa`: PyTorch's causal ``scaled_dot_product_attention`` as a zero-argument op;
* :func:`to_bthd`, :func:`from_bthd`: flash-linear-attention's layout ``[B, T, H, D]`` from
  ours ``[B, H, T, D]`` (a contiguous copy) and back (a free view);
* :func:`rel_rms`, :func:`rel_rms_head`, :func:`rel_max`, :func:`max_abs` (:data:`METRICS`):
  the error measures, in float64, chunked so that large outputs need little extra memory;
* :func:`commit`, :func:`run_meta`: what a data file records about the run that wrote it;
* :func:`write_rows`: a data file ``{"meta": ..., "rows": [...]}`` written.
"""
from __future__ import annotations

import datetime
import platform

import torch
import torch.nn.functional as F

from .._provenance import git_commit


# --- inputs -------------------------------------------------------------------

def generator(device, seed: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (CPU or CUDA) seeded with ``seed``."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def seeded_qkv(lead, T: int, D: int, Dv: int | None = None, *, seed: int, device, dtype=torch.float32):
    """``q, k: (*lead, T, D)``, ``v: (*lead, T, Dv)`` from ``N(0, 1)``, drawn in ``dtype`` in that order
    from one generator seeded with ``seed`` on ``device``."""
    g = generator(device, seed)
    Dv = D if Dv is None else Dv
    lead = tuple(lead)
    q = torch.randn(*lead, T, D, device=device, dtype=dtype, generator=g)
    k = torch.randn(*lead, T, D, device=device, dtype=dtype, generator=g)
    v = torch.randn(*lead, T, Dv, device=device, dtype=dtype, generator=g)
    return q, k, v


# --- ops and layouts ----------------------------------------------------------

def sdpa(q, k, v):
    """PyTorch's causal SDPA on ``(B, H, T, D)`` inputs, as a zero-argument op (the bench's peer)."""
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def to_bthd(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, ...]`` (ours) -> ``[B, T, H, ...]`` (flash-linear-attention's), contiguous.  A tensor that
    requires grad gives a new leaf that requires grad: a forward+backward benchmark then times the peer's
    op alone, not the layout change's backward."""
    y = x.transpose(1, 2).contiguous()
    return y.detach().requires_grad_() if x.requires_grad else y


def from_bthd(x: torch.Tensor) -> torch.Tensor:
    """``[B, T, H, ...]`` -> ``[B, H, T, ...]``, a view (no copy: outside any timed region it costs nothing)."""
    return x.transpose(1, 2)


# --- error measures (float64, chunked over the leading dims) ----------------------

_CHUNK = 1 << 24  # elements per float64 chunk: 128 MB


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)


def _stats(out: torch.Tensor, ref: torch.Tensor, per_row_group: int | None = None):
    """Sums of squares and maxima of ``out - ref`` and ``ref`` in float64, a chunk of rows at a time."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    o, r = _rows(out), _rows(ref)
    step = max(1, _CHUNK // max(1, o.shape[-1]))
    sq_d = sq_r = 0.0
    mx_d = mx_r = 0.0
    for s in range(0, o.shape[0], step):
        od, rd = o[s:s + step].double(), r[s:s + step].to(device=o.device, dtype=torch.float64)
        d = od - rd
        sq_d += d.pow(2).sum().item()
        sq_r += rd.pow(2).sum().item()
        mx_d = max(mx_d, d.abs().max().item() if d.numel() else 0.0)
        mx_r = max(mx_r, rd.abs().max().item() if rd.numel() else 0.0)
    return sq_d, sq_r, mx_d, mx_r


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` over the whole tensor (a relative RMS error), in float64."""
    sq_d, sq_r, _, _ = _stats(out, ref)
    return (sq_d / sq_r) ** 0.5 if sq_r > 0 else (0.0 if sq_d == 0 else float("inf"))


def rel_max(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out - ref| / max |ref|`` (the tests' measure), in float64."""
    _, _, mx_d, mx_r = _stats(out, ref)
    return mx_d / mx_r if mx_r > 0 else (0.0 if mx_d == 0 else float("inf"))


def rel_rms_head(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative RMS error of one ``(T, Dv)`` slice (one batch entry, one head), in float64."""
    o, r = out.reshape(-1, *out.shape[-2:]), ref.reshape(-1, *ref.shape[-2:])
    return max((rel_rms(o[i], r[i]) for i in range(o.shape[0])), default=0.0)


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out - ref|``, in float64."""
    return _stats(out, ref)[2]


METRICS = {"rel_rms": rel_rms, "rel_max": rel_max, "rel_rms_head": rel_rms_head, "max_abs": max_abs}


# --- provenance -----------------------------------------------------------------

def commit() -> str:
    """The commit as a data file's meta records it: :func:`pathedu._provenance.git_commit`, with ``+dirty``
    appended when the checkout has changes (``PATHEDU_COMMIT``, when set, is recorded as given)."""
    sha, dirty = git_commit()
    return sha + ("+dirty" if dirty else "")


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def write_rows(path, meta: dict, rows: list, *, say: bool = True) -> None:
    """Write a benchmark data file, ``{"meta": meta, "rows": rows}`` (values JSON cannot hold, as strings); the
    tools call it after every sequence length, so a run cut short still leaves what it measured."""
    import json

    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1, default=str)
    if say:
        print(f"wrote {path}")


def run_meta(command: str, device=None) -> dict:
    """Command, commit, device, versions (torch, triton, Python, flash-linear-attention) and UTC date."""
    import triton

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cpu = f"cpu ({platform.processor() or platform.machine()})"
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu
    from .. import triton_mode

    return dict(
        command=command, commit=commit(), device=name, triton_mode=triton_mode(), torch=torch.__version__,
        triton=triton.__version__, python=platform.python_version(), fla=_version("fla-core"),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
