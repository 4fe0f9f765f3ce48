"""Registers, spills and shared memory of the kernels, compiled for an H100 (sm_90) on any machine.

    python -m pathedu.bench.registers [--kernels NAME ...] [--dtype bfloat16]

Triton compiles for a GPU that it does not have to run on: this compiles each named kernel variant for sm_90
(``triton.compile`` with a ``GPUTarget``; no GPU, no CUDA driver) and reads its cubin's resource usage with the
``cuobjdump`` that ships with Triton's NVIDIA backend: registers per thread (255 is the ceiling), stack bytes
(registers spilled to local memory) and static shared memory.  What the numbers say about speed: a multiprocessor
has 65536 registers, so a program of ``W`` warps at ``R`` registers leaves room for ``65536 // (32 W R)`` programs
at once (``kernels/NOTES_path.md``, section 9, reads them).  Head dims, tiles and dtypes are the benchmarks'
(D = Dv = 64, chunks and UT blocks of 64, bf16 inputs).

pathedu switches Triton's interpreter on when there is no GPU, and a kernel defined under the interpreter cannot
be compiled; so without a GPU the command reruns itself in a fresh process with ``TRITON_INTERPRET=0``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile

# name -> (module, kernel, constexprs, pointer dtypes other than fp32 (bf16 inputs), warps)
_D = dict(HEAD_DIM=64, BLOCK_D=64)
_LIN = dict(_D, HEAD_DV=64, BLOCK_DV=64, CHUNK=64, PRECISION="tf32", BLOCK_DC=32, ROTATE="none")
_QKVO = ("Q", "K", "V", "O")
KERNELS = {
    "_ut_diag_inverse (DeltaNet)": ("ut_prepare", "_ut_diag_inverse", dict(_D, BT=64, W_IS_K=True, GATED=False,
                                                                                COUNT=True, PRECISION="tf32"), ("K", "W"), 1),
    "_ut_diag_inverse (Gated DeltaNet)": ("ut_prepare", "_ut_diag_inverse", dict(_D, BT=64, W_IS_K=True, GATED=True,
                                                                                      COUNT=True, PRECISION="tf32"), ("K", "W"), 1),
    "_ut_diag_inverse (PaTH)": ("ut_prepare", "_ut_diag_inverse", dict(_D, BT=64, W_IS_K=False, GATED=False,
                                                                            COUNT=True, PRECISION="tf32"), ("K",), 1),
    "_wy_prepare": ("ut_prepare", "_wy_prepare", dict(_D, HEAD_DV=64, BLOCK_DV=64, BT=64, GATED=False,
                                                      PRECISION="tf32"), ("K", "V"), 4),
    "_wy_prepare (gated)": ("ut_prepare", "_wy_prepare", dict(_D, HEAD_DV=64, BLOCK_DV=64, BT=64, GATED=True,
                                                              PRECISION="tf32"), ("K", "V"), 4),
    "_linear_fwd (linear attention)": ("linear_attention", "_linear_fwd", dict(_LIN, GATE="none", DECAY="none"),
                                       _QKVO, 4),
    "_linear_fwd (Mamba2: a gate per token)": ("linear_attention", "_linear_fwd",
                                               dict(_LIN, GATE="none", DECAY="token"), _QKVO, 4),
    "_linear_fwd (RetNet: a gate per head)": ("linear_attention", "_linear_fwd",
                                              dict(_LIN, GATE="none", DECAY="head"), _QKVO, 4),
    "_linear_fwd (DeltaNet: delta)": ("linear_attention", "_linear_fwd", dict(_LIN, GATE="delta", DECAY="none"),
                                      ("Q", "K", "O"), 4),
    "_linear_fwd (Gated DeltaNet: delta + decay)": ("linear_attention", "_linear_fwd",
                                                    dict(_LIN, GATE="delta", DECAY="token"), ("Q", "K", "O"), 4),
    # PaTH's preparation pass (the forward's; the backward's keeps the inverses), then its backward's O(T D^2) steps
    **{f"_ut_prepare (PaTH {pass_}{', 8 warps' if warps == 8 else ''})": (
        "ut_prepare", "_ut_prepare", dict(_D, BT=64, NORM_Q=pass_ == "forward", STORE_UT=False,
                                          STORE_INV=pass_ == "backward", PRECISION="tf32"),
        ("Q", "K", "QT", "KT", "GM"), warps)
       for pass_ in ("forward", "backward") for warps in (4, 8)},
    "_carry_fwd": ("path_carry", "_carry_fwd", dict(_D, BT=64, CARRY="fp16"), ("QT", "KT", "GM", "X"), 4),
    "_carry_bwd": ("path_carry", "_carry_bwd", dict(_D, BT=64, CARRY="fp16", PRECISION="tf32"),
                   ("QT", "KT", "GM", "SCRATCH"), 4),
}
KERNELS.update({  # the five kernels of the UT factors' backward, at 4 and 8 warps (the autotuner's two choices)
    name + ("" if warps == 4 else f" ({warps} warps)"): ("ut_prepare", name, dict(_D, BT=64, PRECISION="tf32"),
                                                          ("Q", "K"), warps)
    for name in ("_ut_bwd_aw", "_ut_bwd_scores", "_ut_bwd_qk", "_ut_bwd_w", "_ut_bwd_inverse") for warps in (4, 8)})
_INTS = ("T", "NB", "h")  # integer scalars besides the strides


def _signature(fn, constexprs: dict, ptrs: tuple, dtype: str) -> dict:
    """Triton's signature for ``fn``: constexprs by name, ``dtype`` pointers for ``ptrs``, fp32 pointers for the
    other tensors, i32 for ``T`` and strides, fp32 for other scalars."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = "*" + dtype
        elif name in _INTS or name.startswith("stride"):
            sig[name] = "i32"
        elif name == "log2_base":
            sig[name] = "fp32"
        else:
            sig[name] = "*fp32"
    return sig


def resource_usage(name: str, dtype: str = "bf16") -> dict:
    """Compile kernel variant ``name`` (a key of :data:`KERNELS`) for sm_90; return ``{"kernel", "warps", "REG",
    "STACK", "SHARED", "LOCAL"}`` (registers per thread; bytes).  Needs Triton in compile mode (not the interpreter)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, constexprs, ptrs, warps = KERNELS[name]
    fn = getattr(importlib.import_module(f"pathedu.kernels.{module}"), kernel)
    if not hasattr(fn, "arg_names") or type(fn).__name__ == "InterpretedFunction":
        raise RuntimeError("the kernels were defined under Triton's interpreter: run with TRITON_INTERPRET=0")
    src = ASTSource(fn=fn, signature=_signature(fn, constexprs, ptrs, dtype),
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if "REG:" in x)
    usage = dict(field.split(":") for field in line.split() if field.split(":")[0] in ("REG", "STACK", "SHARED", "LOCAL"))
    return {"kernel": name, "warps": warps, **{k: int(v) for k, v in usage.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.bench.registers", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", nargs="*", default=list(KERNELS), choices=list(KERNELS), metavar="NAME",
                   help="kernel variants (default: all): " + "; ".join(KERNELS))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"],
                   help="the inputs' dtype (16-bit: the variants' products are tf32; fp32 inputs take others)")
    args = p.parse_args(argv)
    import pathedu

    if pathedu.triton_mode() == "interpreter":  # see the module docstring
        env = dict(os.environ, TRITON_INTERPRET="0")
        cmd = [sys.executable, "-m", "pathedu.bench.registers", "--dtype", args.dtype, "--kernels", *args.kernels]
        return subprocess.run(cmd, env=env).returncode
    print(f"{'kernel (sm_90, ' + args.dtype + ' inputs)':48s} {'warps':>5s} {'registers':>9s} {'stack B':>8s} "
          f"{'programs/SM (by registers)':>27s}")
    for name in args.kernels:
        u = resource_usage(name, args.dtype)
        fit = 65536 // (32 * u["warps"] * max(u["REG"], 1))
        print(f"{name:48s} {u['warps']:5d} {u['REG']:9d} {u['STACK']:8d} {fit:27d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
