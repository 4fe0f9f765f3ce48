"""Which code produced a data file: the one place that asks git (benchmarks, GPU checks and experiments all
record it)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent  # the checkout (or site-packages folder) holding pathedu


def git_commit() -> tuple[str, bool | None]:
    """``(commit, dirty)``: the environment variable ``PATHEDU_COMMIT`` when set (the device machine gets a
    copy of the working tree whose ``.git`` may be stale, so the caller names the commit it sent; ``dirty`` is
    then None), else ``git rev-parse HEAD`` of the checkout holding pathedu and whether ``git status`` lists
    any change, else ``("unknown", None)``."""
    if os.environ.get("PATHEDU_COMMIT"):
        return os.environ["PATHEDU_COMMIT"], None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_CHECKOUT, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], cwd=_CHECKOUT, capture_output=True, text=True,
                                timeout=10, check=True).stdout
        if commit:
            return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown", None
