"""Every chapter's GPU checks (pathedu.bench.checks), one test per section: every record ok.

Each test runs the checks' command line for one ``CHAPTER.SECTION`` and writes its file into
``$PATHEDU_CHECKS_DIR`` (a temporary folder when unset); ``tests/gpu/run.sh`` merges those files into
the results file (``python -m pathedu.bench.checks --merge``).  ``$PATHEDU_FLA``: ``yes`` (the run
script: a missing flash-linear-attention fails), ``auto`` (default: compare with it where installed).
"""
import json
import os
from pathlib import Path

import pytest

from pathedu import bench
from pathedu.bench import checks

# Rough seconds on an H100 with a cold Triton cache (compiles, fla's autotuning): only orders the schedule.
SECONDS = {"alibi.fla_retention": 300, "path.growth": 240, "path.fla_path": 200, "path.fla_delta": 200,
           "alibi.fla_fox": 150, "path.small": 150, "path.robust": 90, "nope.bench_sizes": 60}


def test_every_chapter_has_gpu_checks():
    assert set(checks.CHECKS) == set(bench.CHAPTERS)


@pytest.mark.parametrize("target", [
    pytest.param(f"{c}.{s}", marks=pytest.mark.heavy(seconds=SECONDS.get(f"{c}.{s}", 40)))
    for c, s in checks.targets()])
def test_gpu_checks(target, tmp_path):
    out = Path(os.environ.get("PATHEDU_CHECKS_DIR") or tmp_path) / f"gpu_checks_{target}.json"
    rc = checks.main([target, "--out", str(out), "--fla", os.environ.get("PATHEDU_FLA", "auto")])
    records = json.loads(out.read_text())["records"]
    bad = [checks.format_record(r) for r in records if not r["ok"]]
    assert records and not bad, "\n".join(bad)
    assert rc == 0
