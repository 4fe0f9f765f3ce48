"""Every Triton form's forward and backward at small shapes, for a memory checker on the device machine::

    compute-sanitizer --tool memcheck --print-limit 20 python3 tests/gpu/sanitize.py [--shapes small|all] [NAME ...]

(PYTHONPATH as ``tests/gpu/run.sh`` sets it.)  A kernel that reads or writes outside its tensors faults only where
the address happens to be unmapped, so a test can pass in one run and hit an illegal address in the next; the memory
checker reports every such access, with the kernel's name, on every run.  The shapes are the ones where masks and
padding matter most: one token, a sequence shorter than a chunk, odd lengths, head dims 16 and 32, Dv != D.  Each
form runs in bf16 and fp32, forward and backward where it has one; a line per call, and the exit code is 1 if a call
raised.  Without a GPU it runs on the CPU through Triton's interpreter (a smoke test of the script itself)."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: forms.py

import torch  # noqa: E402
from forms import FORMS, TRITON_WITH_BACKWARD, call  # noqa: E402
from helpers import rand_qkv  # noqa: E402

SHAPES = {"small": [((1, 2), 1, 16, 16), ((2, 1), 77, 32, 48)],
          "all": [((1, 2), 1, 16, 16), ((2, 3), 2, 16, 16), ((2, 1), 77, 32, 48), ((1, 2), 130, 64, 32)]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="Triton forms to run (default: all)")
    p.add_argument("--shapes", choices=sorted(SHAPES), default="small")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    forms = [f for f in FORMS if f.kind == "triton" and (not a.names or f.name in a.names)]
    if not forms:
        p.error(f"no Triton form among {a.names}")
    failed = 0
    for form in forms:
        for lead, T, D, Dv in SHAPES[a.shapes]:
            if form.even_D and D % 2:
                continue
            for dtype in (torch.bfloat16, torch.float32):
                q, k, v = rand_qkv(lead, T, D, Dv, dtype=dtype, seed=T, device=device)
                # the extras as tests/gpu/test_forms.py makes them: from the float64 draws, gates in fp32
                extras = {n: x.float() for n, x in form.extras(q.double(), k.double(), v.double(), 1).items()}
                grad = form.name in TRITON_WITH_BACKWARD
                what = f"{form.name:28s} T={T:<4d} D={D:<3d} Dv={Dv:<3d} {str(dtype)[6:]:8s}"
                try:
                    if grad:  # every floating input wants its gradient: each backward kernel runs
                        q, k, v = (x.requires_grad_() for x in (q, k, v))
                        extras = {n: x.requires_grad_() if x.is_floating_point() else x for n, x in extras.items()}
                    out = call(form, q, k, v, extras)
                    if grad:
                        out.float().square().sum().backward()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    print(f"ok     {what} {'forward + backward' if grad else 'forward'}", flush=True)
                except Exception as exc:  # reported, and the exit code says so; the checker reports the access
                    failed += 1
                    print(f"FAILED {what} {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
