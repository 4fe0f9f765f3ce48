"""pathedu: forget gates and position encodings as one object.

Each mechanism lives in one module holding every form of both sides of the
duality (naive, recurrent, matrix, blockwise/chunked, Triton):

* :mod:`pathedu.nope`  NoPE softmax attention  <->  vanilla linear attention

The device policy (:mod:`pathedu._device`) runs first: without a CUDA GPU,
Triton's interpreter is switched on before any kernel is defined.
"""
from ._device import configure as _configure

_configure()

from ._device import default_device, triton_mode  # noqa: E402

__version__ = "0.1.0"
__all__ = ["triton_mode", "default_device", "__version__"]
