"""Triton 3.9 warns on every first compile that its FP-fusion default will change (``TRITON_DEFAULT_FP_FUSION is
unset``): pathedu pins the default it was tuned and tested with (``1``) when the variable is unset, and respects
it when set."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import os, warnings
import pathedu
from triton import knobs
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fused = knobs.language.fp_fusion_enabled(None)
print(os.environ.get("TRITON_DEFAULT_FP_FUSION"), fused, len(caught))
"""


@pytest.mark.parametrize("given, want", [(None, "1 True 0"), ("0", "0 False 0")])
def test_no_fp_fusion_warning_and_the_users_choice_wins(tmp_path, given, want):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if given is not None:
        env["TRITON_DEFAULT_FP_FUSION"] = given
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == want


def test_valid_kernel_calls_give_no_floating_point_warnings():
    """Triton's interpreter computes the lanes a kernel masks out (rows past T) through numpy; valid inputs must not
    make it warn (``invalid value encountered in divide``, ``divide by zero encountered in log2``)."""
    import warnings

    import torch
    import torch.nn.functional as F

    from pathedu import path, pathfox

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(3))  # 40: rows past T in every kernel
    w = F.normalize(torch.randn(1, 2, 40, 16, generator=g), dim=-1)
    beta, log_f = 2 * torch.rand(1, 2, 40, generator=g), -torch.rand(1, 2, 40, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for grad in (False, True):
            qg = q.clone().requires_grad_(grad)
            out = path.path_triton(qg, k, v, w, beta) + pathfox.pathfox_triton(qg, k, v, w, beta, log_f)
            if grad:
                out.sum().backward()
    assert not caught, [f"{c.filename}:{c.lineno}: {c.message}" for c in caught]
