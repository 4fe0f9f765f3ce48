"""Registers, spills and shared memory of the kernels, compiled for an H100 (sm_90) on any machine.

    python -m pathedu.bench.registers [--kernels NAME ...] [--dtype bf16] [--loops] [--serialized] [--sass]

Triton compiles for a GPU that it does not have to run on: this compiles each named kernel variant for sm_90
(``triton.compile`` with a ``GPUTarget``; no GPU, no CUDA driver) and reads its cubin's resource usage with the
``cuobjdump`` that ships with Triton's NVIDIA backend: registers per thread (255 is the ceiling), stack bytes
(registers spilled to local memory) and static shared memory.  What the numbers say about speed: a multiprocessor
has 65536 registers, so a program of ``W`` warps at ``R`` registers leaves room for ``65536 // (32 W R)`` programs
at once.  Head dims, tiles and dtypes are the benchmarks'
(D = Dv = 64, chunks and UT blocks of 64, bf16 inputs).

``--loops`` also prints, for every loop of the machine code (a backward branch of the SASS, from
``cuobjdump -sass``), its instruction count and most frequent opcodes per iteration: what one trip round the
FlashAttention template's main loop issues per thread, say (a multiply per logit that the softmax update's
exponent could absorb shows there).  Every entry is compiled as the JIT compiles it at the
benchmarks' sizes, where every pointer is 16-byte aligned and every integer argument (``T``, strides, block counts)
a multiple of 16: those arguments are marked divisible by 16, which lets the compiler vectorise the tile loads
(without the marks, loads of 2 bytes and more registers: numbers that do not describe the run; the preparation
pass compiled without them reports 608 stack bytes where the run's code has 168).  Run it with the device's
Triton (3.6 on the GPU machines the book's numbers come from): another version compiles other code.

pathedu switches Triton's interpreter on when there is no GPU, and a kernel defined under the interpreter cannot
be compiled; so without a GPU the command reruns itself in a fresh process with ``TRITON_INTERPRET=0``.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import os
import subprocess
import sys
import tempfile

# name -> (module, kernel, constexprs, pointer dtypes other than fp32 (bf16 inputs), warps)
_D = dict(HEAD_DIM=64, BLOCK_D=64)
_LIN = dict(_D, HEAD_DV=64, BLOCK_DV=64, CHUNK=64, PRECISION="tf32", BLOCK_DC=32, ROTATE="none", LOAD_H0=False,
            STORE_STATES=False, STORE_FINAL=False)
_QKVO = ("Q", "K", "V", "O")
KERNELS = {
    "_ut_diag_inverse (DeltaNet)": ("ut_prepare", "_ut_diag_inverse", dict(_D, BT=64, W_IS_K=True, GATED=False,
                                                                                COUNT=True, PRECISION="tf32"), ("K", "W"), 1),
    "_ut_diag_inverse (Gated DeltaNet)": ("ut_prepare", "_ut_diag_inverse", dict(_D, BT=64, W_IS_K=True, GATED=True,
                                                                                      COUNT=True, PRECISION="tf32"), ("K", "W"), 1),
    "_ut_diag_inverse (PaTH)": ("ut_prepare", "_ut_diag_inverse", dict(_D, BT=64, W_IS_K=False, GATED=False,
                                                                            COUNT=True, PRECISION="tf32"), ("K",), 1),
    "_wy_prepare": ("ut_prepare", "_wy_prepare", dict(_D, HEAD_DV=64, BLOCK_DV=64, BT=64, GATED=False,
                                                      PRECISION="fp16"), ("K", "V"), 4),
    "_wy_prepare (gated)": ("ut_prepare", "_wy_prepare", dict(_D, HEAD_DV=64, BLOCK_DV=64, BT=64, GATED=True,
                                                              PRECISION="fp16"), ("K", "V"), 4),
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
    "_linear_fwd (Householder RNN)": ("linear_attention", "_linear_fwd", dict(_LIN, GATE="householder", DECAY="none"),
                                      ("Q", "K", "O"), 4),
    "_linear_fwd (gated Householder RNN)": ("linear_attention", "_linear_fwd",
                                            dict(_LIN, GATE="householder", DECAY="token"), ("Q", "K", "O"), 4),
    # the linear template's training forward (each chunk's starting state stored) and its backward's kernels
    "_linear_fwd (Mamba2, storing the states)": ("linear_attention", "_linear_fwd",
                                                 dict(_LIN, GATE="none", DECAY="token", STORE_STATES=True,
                                                      STORE_FINAL=True), _QKVO, 4),
    "_linear_bwd_state (Mamba2)": ("linear_attention", "_linear_bwd_state",
                                   dict(_D, HEAD_DV=64, BLOCK_DV=64, CHUNK=64, GATE="none", DECAY="token",
                                        PRECISION="tf32n", LOAD_DHT=True), ("Q", "DO"), 4),
    # the chunks' gradients at 8 warps (4 spill at chunks of 64), the key channels whole (blocks of 32 at D = 128)
    **{f"_linear_bwd_chunk ({name})": ("linear_attention", "_linear_bwd_chunk",
                                       dict(_D, HEAD_DV=64, BLOCK_DV=64, BLOCK_K=64, CHUNK=64, DECAY=decay,
                                            PRECISION="tf32n"), ("Q", "K", "V", "DO", "DQ", "DK", "DV"), 8)
       for name, decay in (("linear attention", "none"), ("Mamba2: a gate per token", "token"),
                           ("RetNet: a gate per head", "head"))},
    "_linear_bwd_channel (GLA)": ("linear_attention", "_linear_bwd_channel",
                                  dict(_D, HEAD_DV=64, BLOCK_DV=32, CHUNK=16, BLOCK_DC=32, PRECISION="tf32n"),
                                  ("Q", "K", "V", "DO", "DQ", "DK", "DV"), 4),
    # PaTH's preparation pass (the forward's; the backward's keeps the inverses), with the fp16 products that a
    # tf32 pass launches (ut_prepare.main_pass_precision), then its backward's O(T D^2) steps
    **{f"_ut_prepare (PaTH {pass_}{', 8 warps' if warps == 8 else ''})": (
        "ut_prepare", "_ut_prepare", dict(_D, BT=64, NORM_Q=pass_ == "forward", STORE_UT=False,
                                          STORE_INV=pass_ == "backward", PRECISION="fp16"),
        ("Q", "K", "QT", "KT", "GM"), warps)
       for pass_ in ("forward", "backward") for warps in (4, 8)},
    # the carries at levels from 2, and at level 1 (FIRST), whose launch writes level 0's rows too; a training
    # forward keeps the carries themselves (SAVE) for the reversed carries
    **{f"_carry_fwd{' (level 1)' if first else ''}": (
        "path_carry", "_carry_fwd", dict(_D, BT=64, CARRY="fp16", FIRST=first, SAVE=True),
        ("QT", "KT", "GM", "X", "X0", "CS"), 4)
       for first in (False, True)},
    # the reversed carries with tf32 products (fp32 factors; fp16 ones for heads of 32 or fewer)
    **{f"_carry_bwd{' (level 1)' if first else ''}": (
        "path_carry", "_carry_bwd", dict(_D, BT=64, PRECISION="tf32n", FIRST=first), ("QT", "KT", "GM", "CS"), 4)
       for first in (False, True)},
    # the same with fp16 products (fp16 factors, each gradient tile scaled): carry_backward's default for D > 32
    **{f"_carry_bwd (fp16{', level 1' if first else ''})": (
        "path_carry", "_carry_bwd", dict(_D, BT=64, PRECISION="fp16", FIRST=first),
        ("QT:fp16", "KT:fp16", "GM:fp16", "CS:fp16"), 4)
       for first in (False, True)},
}
_FLASH = dict(HEAD_DIM=64, HEAD_DV=64, BLOCK_D=64, BLOCK_DV=64, PRECISION="tf32", STORE_LSE=False, ROTATE="none")
KERNELS.update({  # the FlashAttention template's fast pass, with the tiles the autotuner picked at T = 1024 / 8192
    f"_flash_fwd ({bias}, {bm} x {bn}, {w} warps)": ("flash_attention", "_flash_fwd",
                                                    dict(_FLASH, BIAS=bias, BLOCK_M=bm, BLOCK_N=bn), _QKVO, w)
    for bias in ("none", "alibi", "loggate") for bm, bn, w in ((64, 64, 4), (128, 64, 8), (128, 64, 4))})
_SCAN = {k: v for k, v in _FLASH.items() if k != "ROTATE"}  # the scan has no rotation hook
KERNELS.update({  # PaTH's scan, R blocks of 64 queries per program (the autotuner's R = 1 at T = 1024): the carried
    # query and the transitions in fp16 (the update dtype of 16-bit inputs), k~ and v in the inputs' dtype
    f"_path_fwd (R = {r})": ("path_attention", "_path_fwd",
                             dict(_SCAN, R=r, BLOCK_N=64, UPDATE="dense", GATED=False),
                             ("QT:fp16", "GM:fp16", "WC:fp16", "NU:fp16", "KT", "V", "O"), 4)
    for r in (1, 2)})
_STAGES = {"_flash_fwd": 3, "_path_fwd": 2}  # the autotuner's pipelining depth for these tiles; 1 for the others
KERNELS.update({  # the four kernels of the UT factors' backward, at 4 and 8 warps (the autotuner's two choices), with
    # the products of 16-bit inputs: fp16, each tile of gradients scaled (ut_prepare.backward_precision)
    name + ("" if warps == 4 else f" ({warps} warps)"): ("ut_prepare", name, dict(_D, BT=64, PRECISION="fp16"),
                                                          ("Q", "K"), warps)
    for name in ("_ut_bwd_aw", "_ut_bwd_scores", "_ut_bwd_qk", "_ut_bwd_w_inverse") for warps in (4, 8)})
KERNELS.update({  # the same at the head dims that keep tf32 products (ut_prepare.backward_precision): --sass compares
    # their machine code with an older tree's (kernels/NOTES_path.md, "Compiler faults to remember")
    f"{name} (D = {d}, tf32n)": ("ut_prepare", name, dict(HEAD_DIM=d, BLOCK_D=d, BT=64, PRECISION="tf32n"),
                                 ("Q", "K"), 4)
    for d in (16, 32) for name in ("_ut_bwd_aw", "_ut_bwd_scores", "_ut_bwd_qk", "_ut_bwd_w_inverse")})
KERNELS.update({  # the delta rule's chunk gradients (delta_rule_backward): the Householder RNN's values as given,
    # DeltaNet's made as beta v on load, with and without the gate; 16-bit v, dO and dV, fp32 UT factors and states
    f"_hh_bwd_chunk ({label})": ("delta_rule_backward", "_hh_bwd_chunk",
                                 dict(_D, HEAD_DV=64, BLOCK_DV=64, BLOCK_G=32, CHUNK=64, GATED=gated, BETA_V=beta_v,
                                      PRECISION="tf32n", SUM_PRECISION="x3n"), ("V", "DO", "DV"), 8)
    for label, gated, beta_v in (("Householder RNN", False, False), ("DeltaNet", False, True),
                                 ("Gated DeltaNet", True, True))})
_BWD = {k: v for k, v in _FLASH.items() if k not in ("STORE_LSE", "ROTATE")}  # the backward has neither
KERNELS.update({  # the attention backward passes, with the autotuner's tiles (flash_attention and path_attention's
    # _BWD_CONFIGS): 16-bit q, k, v, dO, fp16 meeting-point rows X for PaTH, fp32 statistics and accumulators
    **{f"_flash_bwd ({bias}, {o} x {i}, {w} warps{', atomic dQ' if atomic else ''})": (
        "flash_attention", "_flash_bwd", dict(_BWD, BIAS=bias, OUTER=o, INNER=i, ATOMIC_DQ=atomic), ("Q", "K", "V", "DO"), w)
       for bias in ("none", "loggate") for o, i, w in ((64, 64, 4), (128, 64, 8)) for atomic in (False, True)
       if not (atomic and bias != "none")},
    **{f"_path_bwd (INNER = {i})": ("path_attention", "_path_bwd", dict(_BWD, BT=64, INNER=i, BIAS="none"),
                                    ("X:fp16", "V", "DO"), 4) for i in (32, 64)},
    # the forward of a call to be differentiated (the backward's schedule; the output in the inputs' dtype)
    **{f"_path_dyadic_fwd (INNER = {i})": ("path_attention", "_path_dyadic_fwd",
                                           dict(_BWD, BT=64, INNER=i, BIAS="none"), ("X:fp16", "V", "O"), 4)
       for i in (32, 64)},
})
_SB = dict(HEAD_DIM=64, HEAD_DV=64, BLOCK_D=64, BLOCK_DV=64, PRECISION="tf32", FAST_LOG2=True)
KERNELS.update({  # stick-breaking: the forward with the tile's sums by tl.cumsum and by products (the 16-bit path),
    # at the tiles the autotuner picked for the cumsum forward on the H100, and the backward's two sweeps
    **{f"_stickbreaking_fwd ({scan}, 64 x 32)": ("stickbreaking", "_stickbreaking_fwd",
                                                  dict(_SB, BLOCK_M=64, BLOCK_N=32, SCAN=scan), _QKVO, 4)
       for scan in ("cumsum", "dot")},
    **{f"{name} (64 x 32)": ("stickbreaking", name, dict(_SB, BLOCK_M=64, BLOCK_N=32, SCAN="dot"),
                             ("Q", "K", "V", "DO", "DQ", "DK", "DV", "VBAD:i32"), 4)
       for name in ("_stickbreaking_bwd_query", "_stickbreaking_bwd_key")},
})
_STAGES.update({"_flash_bwd": 2, "_path_bwd": 2, "_path_dyadic_fwd": 2, "_stickbreaking_fwd": 3,
                "_stickbreaking_bwd_query": 2, "_stickbreaking_bwd_key": 2})
_INTS = ("T", "NB", "h", "LEVELS")  # integer scalars besides the strides
_FLOATS = ("log2_base", "qk_scale", "scale")  # float scalars


def _signature(fn, constexprs: dict, ptrs: tuple, dtype: str) -> dict:
    """Triton's signature for ``fn``: constexprs by name, ``dtype`` pointers for ``ptrs``, fp32 pointers for the
    other tensors, i32 for ``T`` and strides, fp32 for other scalars."""
    sig = {}
    fixed = dict(p.split(":") for p in ptrs if ":" in p)  # "QT:fp16": that pointer's dtype whatever the inputs'
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in fixed:
            sig[name] = "*" + fixed[name]
        elif name in ptrs:
            sig[name] = "*" + dtype
        elif name in _INTS or name.startswith("stride"):
            sig[name] = "i32"
        elif name in _FLOATS:
            sig[name] = "fp32"
        elif name == "FLAGS":
            sig[name] = "*i8"
        else:
            sig[name] = "*fp32"
    return sig


def _cubin_tool(cubin: bytes, *args: str) -> str:
    """The output of Triton's ``cuobjdump`` with ``args`` on ``cubin``."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *args, f.name], capture_output=True, text=True, check=True).stdout


@functools.lru_cache(maxsize=None)  # --loops reads the same compile as the resource report
def _compile(name: str, dtype: str):
    """Kernel variant ``name`` compiled for sm_90 (Triton's ``CompiledKernel``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, constexprs, ptrs, warps = KERNELS[name]
    fn = getattr(importlib.import_module(f"pathedu.kernels.{module}"), kernel)
    if not hasattr(fn, "arg_names") or type(fn).__name__ == "InterpretedFunction":
        raise RuntimeError("the kernels were defined under Triton's interpreter: run with TRITON_INTERPRET=0")
    sig = _signature(fn, constexprs, ptrs, dtype)
    # as the JIT marks 16-aligned pointers and integers divisible by 16 (module docstring)
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a].startswith("*") or sig[a] == "i32"}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": _STAGES.get(kernel, 1)})


def resource_usage(name: str, dtype: str = "bf16") -> dict:
    """Compile kernel variant ``name`` (a key of :data:`KERNELS`) for sm_90; return ``{"kernel", "warps", "REG",
    "STACK", "SHARED", "LOCAL"}`` (registers per thread; bytes).  Needs Triton in compile mode (not the interpreter)."""
    out = _cubin_tool(_compile(name, dtype).asm["cubin"], "--dump-resource-usage")
    line = next(x for x in out.splitlines() if "REG:" in x)
    usage = dict(field.split(":") for field in line.split() if field.split(":")[0] in ("REG", "STACK", "SHARED", "LOCAL"))
    return {"kernel": name, "warps": KERNELS[name][4], **{k: int(v) for k, v in usage.items()}}


def wgmma_serialized(name: str, dtype: str = "bf16") -> str | None:
    """Why ``ptxas`` serialises the Hopper tensor-core products (``wgmma``) of kernel variant ``name``, or None.

    The asynchronous products of a warp group run as a pipeline only if ``ptxas`` can prove that nothing else
    touches their accumulators while they are in flight; when it cannot (an instruction defining an accumulator
    register inside the pipeline stage, too few registers to keep the stage's operands alive, ...), it waits for
    each product before issuing the next, and says so in its verbose output (message ``C7515``).  Triton does not
    show that output; this compiles the kernel's PTX again with Triton's own ``ptxas -v`` for sm_90a and returns the
    reason it gives (FoX's 3-stage tiles and PaTH's carries are two kernels it reports so)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = _compile(name, dtype).asm["ptx"]
    ptxas = get_ptxas(90).path  # the ptxas this Triton compiles sm_90 with (its name changed between versions)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "kernel.cubin")],
                             capture_output=True, text=True, check=True)
    for line in (out.stdout + out.stderr).splitlines():
        if "serialized due to" in line:
            return line.split("serialized due to", 1)[1].split(" in the function")[0].strip()
    return None


def loop_mix(sass: str) -> list[dict]:
    """The loops of a SASS listing (``cuobjdump -sass``): for each backward branch, the instructions from its target
    to the branch, as ``{"start", "end", "instructions", "opcodes"}`` (opcode -> count, most frequent first, the
    opcode without its modifiers: ``FFMA``, ``MUFU``, ``HGMMA``, ...): per thread, one trip round the loop."""
    import collections
    import re

    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).split(".")[0], m.group(3)))
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            body = collections.Counter(o for a, o, _ in ins if lo <= a <= addr)
            loops.append(dict(start=lo, end=addr, instructions=sum(body.values()), opcodes=dict(body.most_common())))
    return loops


def sass_fingerprint(sass: str) -> tuple[str, int]:
    """``(hash, instructions)`` of a SASS listing (``cuobjdump -sass``): a short SHA-1 of its instructions with their
    addresses removed, and how many there are.  Two trees whose kernel compiles to the same fingerprint run the same
    machine code: a change that should not touch a kernel can be checked offline.  Compare trees with care: a tree put on ``PYTHONPATH`` beside an editable install imports its own
    ``pathedu`` but the install's ``pathedu.kernels`` unless its ``kernels/`` is linked into its ``pathedu/``
    (:func:`main` prints where the kernels came from)."""
    import hashlib
    import re

    ins = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip() for line in sass.splitlines()
           if re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+\S", line) and ";" in line]
    return hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12], len(ins)


def sass_listing(name: str, dtype: str = "bf16") -> str:
    """The SASS listing (``cuobjdump -sass``) of kernel variant ``name`` compiled for sm_90."""
    return _cubin_tool(_compile(name, dtype).asm["cubin"], "-sass")


def loops(name: str, dtype: str = "bf16") -> list[dict]:
    """:func:`loop_mix` of kernel variant ``name`` compiled for sm_90."""
    return loop_mix(sass_listing(name, dtype))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.bench.registers", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", nargs="*", default=list(KERNELS), choices=list(KERNELS), metavar="NAME",
                   help="kernel variants (default: all): " + "; ".join(KERNELS))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"],
                   help="the inputs' dtype (16-bit: the variants' products are tf32; fp32 inputs take others)")
    p.add_argument("--loops", action="store_true", help="also each loop's instructions per iteration (SASS)")
    p.add_argument("--serialized", action="store_true",
                   help="also whether ptxas serialises the kernel's tensor-core products, and why (ptxas -v)")
    p.add_argument("--sass", action="store_true",
                   help="also a fingerprint of the machine code (a hash of its instructions, and their number): "
                        "the same in two trees means the same kernel")
    args = p.parse_args(argv)
    import pathedu

    if pathedu.triton_mode() == "interpreter":  # see the module docstring
        env = dict(os.environ, TRITON_INTERPRET="0")
        cmd = [sys.executable, "-m", "pathedu.bench.registers", "--dtype", args.dtype, *(["--loops"] if args.loops else []),
               *(["--serialized"] if args.serialized else []), *(["--sass"] if args.sass else []),
               "--kernels", *args.kernels]
        return subprocess.run(cmd, env=env).returncode
    if args.sass:  # the tree compared (sass_fingerprint's docstring: an editable install can lend its kernels)
        import triton

        import pathedu.kernels

        print(f"kernels from {os.path.dirname(pathedu.kernels.__file__)}, triton {triton.__version__}")
    print(f"{'kernel (sm_90, ' + args.dtype + ' inputs)':48s} {'warps':>5s} {'registers':>9s} {'stack B':>8s} "
          f"{'programs/SM (by registers)':>27s}")
    for name in args.kernels:
        u = resource_usage(name, args.dtype)
        fit = 65536 // (32 * u["warps"] * max(u["REG"], 1))
        print(f"{name:48s} {u['warps']:5d} {u['REG']:9d} {u['STACK']:8d} {fit:27d}")
        if args.serialized:
            why = wgmma_serialized(name, args.dtype)
            print(f"    tensor-core products serialised by ptxas: {why}" if why else "    tensor-core products pipelined")
        if args.sass:
            digest, n = sass_fingerprint(sass_listing(name, args.dtype))
            print(f"    machine code {digest}, {n} instructions")
        if args.loops:
            for lp in loops(name, args.dtype):
                top = ", ".join(f"{op} {n}" for op, n in list(lp["opcodes"].items())[:10])
                print(f"    loop {lp['start']:#06x}-{lp['end']:#06x}: {lp['instructions']} instructions per trip ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
