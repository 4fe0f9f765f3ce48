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

The interpreter computes bfloat16 on the raw 16-bit patterns (wrong numbers),
so in interpreter mode the Triton wrappers upcast bf16 inputs to fp32 before
launching; bf16 arithmetic itself is only exercised on a GPU.
"""
from __future__ import annotations

import os

_MODE: str | None = None


def configure() -> str:
    """Choose the Triton mode once and return it (``"gpu"`` or ``"interpreter"``)."""
    global _MODE
    if _MODE is not None:
        return _MODE
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
    when they run on the CPU through Triton's interpreter."""
    return configure()


def default_device():
    """The device the notebooks put tensors on: ``cuda`` in GPU mode, else ``cpu``."""
    import torch

    return torch.device("cuda" if triton_mode() == "gpu" else "cpu")
