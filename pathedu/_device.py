"""The device policy, in one place.

Triton kernels need a CUDA GPU.  Without one, Triton can still *interpret* a
kernel on the CPU (``TRITON_INTERPRET=1``), one program instance at a time,
which is slow but runs the very same kernel source.  The switch must be made
before any ``@triton.jit`` function is defined, so :mod:`pathedu` calls
:func:`configure` first thing on import, before :mod:`pathedu.kernels` exists.

Rules:

* ``TRITON_INTERPRET`` already set in the environment: respected as is.
* otherwise, no CUDA GPU visible to torch: the interpreter is switched on.
* otherwise: kernels compile for the GPU.
* ``TRITON_DEFAULT_FP_FUSION`` unset: set to ``1``, fusing multiplies and adds into FMAs as Triton has always
  done by default and as the kernels were tuned and tested (Triton 3.9 warns that this default will change in
  3.10 unless the variable is set; set it to ``0`` yourself to compile without fusion).
* Triton not installed (it has wheels for Linux only): mode ``"none"``.  ``import pathedu`` and every
  reference form work; the Triton forms and every entry point of :mod:`pathedu.kernels` raise
  :class:`TritonUnavailable`, which says what to use instead.

The interpreter computes bfloat16 on the raw 16-bit patterns (wrong numbers),
so in interpreter mode the Triton wrappers upcast bf16 inputs to fp32 before
launching; bf16 arithmetic itself is only exercised on a GPU.
"""
from __future__ import annotations

import os

_MODE: str | None = None

NO_TRITON = (
    "Triton is not installed here, and pathedu's Triton forms (`*_triton`) and kernels (`pathedu.kernels`) need "
    "it. Triton has wheels for Linux only (`pip install triton` on Linux, with or without a GPU: without one the "
    "kernels run in Triton's interpreter). Everything else works without it: use a reference form instead, "
    "e.g. `path_matrix`, `path_blockwise` or `path_recurrent` for `path_triton` (every mechanism has "
    "`*_naive`, `*_recurrent`, `*_matrix` and `*_blockwise`/`*_chunked` forms that compute the same outputs). "
    "To run the kernels, open the labs on Colab (the book's rocket button) or use a Linux machine.")


class TritonUnavailable(ImportError):
    """Raised by the Triton forms and by :mod:`pathedu.kernels` where Triton cannot be imported (no Linux)."""

    def __init__(self, cause: str = ""):
        super().__init__(NO_TRITON + (f" (import triton: {cause})" if cause else ""))


def _triton_installed() -> bool:
    """Whether a ``triton`` package can be found (without importing it: ``import pathedu`` stays fast)."""
    import importlib.util

    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken entry in sys.modules
        return False


def configure() -> str:
    """Choose the Triton mode once and return it (``"gpu"``, ``"interpreter"`` or ``"none"``)."""
    global _MODE
    if _MODE is not None:
        return _MODE
    if not _triton_installed():
        _MODE = "none"
        return _MODE
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    flag = os.environ.get("TRITON_INTERPRET")
    if flag is None:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
            flag = "1"
    _MODE = "interpreter" if flag not in (None, "", "0") else "gpu"
    return _MODE


def triton_mode() -> str:
    """``"gpu"`` when Triton kernels compile for a CUDA GPU, ``"interpreter"``
    when they run on the CPU through Triton's interpreter, ``"none"`` when Triton
    is not installed (the reference forms only: :class:`TritonUnavailable`)."""
    return configure()


def default_device():
    """The device the notebooks put tensors on: ``cuda`` in GPU mode (or without Triton, where a CUDA GPU is
    visible), else ``cpu``."""
    import torch

    mode = triton_mode()
    return torch.device("cuda" if mode == "gpu" or (mode == "none" and torch.cuda.is_available()) else "cpu")
