#!/usr/bin/env bash
# The GPU run: one command on the device machine, from the repository root.
#
#     PATHEDU_COMMIT=<the commit of this tree> bash tests/gpu/run.sh      (device tool: carry [".whl"])
#
# 1. installs the wheels of tests/gpu/wheels.txt (fetched here with tests/gpu/fetch_wheels.sh into the
#    git-ignored .whl/, which the call carries) into /tmp/site: a Jupyter kernel and nbclient for the
#    notebooks, flash-linear-attention for the checks;
# 2. runs tests/gpu on several xdist workers (every chapter's GPU checks, every Triton form against
#    float64 in bf16/fp16/fp32, every lab notebook in a kernel of this Python), log in $OUT/gpu_tests.log, each
#    test's outcome in $OUT/gpu_junit.xml (also for a run cut by its time limit: which tests never ran);
# 3. merges the checks' records into $OUT/gpu_checks.json: commit it as pathedu/data/gpu_checks.json.
#
# Knobs: PATHEDU_GPU_WORKERS (default 10), PATHEDU_GPU_TIMEOUT (seconds for pytest, default 510: the
# whole script stays under the device's 10-minute limit; on a timeout pytest is interrupted, reports
# what ran, and the checks that finished are still merged), PATHEDU_GPU_PYTEST_ARGS (default -x: stop at
# the first failure; set it empty to run everything), PATHEDU_GPU_TESTS (default tests/gpu: the test files
# or folders to run, e.g. "tests/gpu/test_checks.py tests/gpu/test_notebooks.py" to split the run over two
# device calls), PATHEDU_GPU_SELECT (a pytest -k expression, e.g. "cope or 10_cope"), PYTHON (default
# python3).  Each worker (and each notebook kernel) gets an equal share of the CPU cores as its torch/OpenMP
# threads (with 14 workers at the default, a CPU training cell of lab 9 that takes 10 s on two cores ran past
# 5 minutes; oversubscription is the likely cause, not a proven one).
# Run it on the tree as the device tool copies it.  Do not clean that copy with git first: its .git can be stale,
# and `git checkout -- .` there silently reverts the tree to an older commit (2026-11-23: two runs tested old code
# under a new commit's name and were thrown away).
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
OUT=${OUT:-/tmp/pathedu_gpu_out}
mkdir -p "$OUT"
LOG="$OUT/gpu_tests.log"
PY=${PYTHON:-python3}

if ! ls .whl/*.whl > /dev/null 2>&1; then
    echo "run.sh: no wheels in .whl/: run 'bash tests/gpu/fetch_wheels.sh' here and carry [\".whl\"]" >&2
    exit 3
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > /tmp/pathedu_pip.log 2>&1 || { cat /tmp/pathedu_pip.log; echo "run.sh: installing .whl/ failed" >&2; exit 3; }
# pathedu from this tree through a link, and no current directory on sys.path (PYTHONSAFEPATH): the tree's
# top-level folder kernels/ would otherwise shadow the PyPI package `kernels`, which transformers (imported by
# fla.layers) looks for, and fla's import fails.  pathedu maps kernels/ to pathedu.kernels itself.
mkdir -p /tmp/pathedu_src && ln -sfn "$PWD/pathedu" /tmp/pathedu_src/pathedu
export PYTHONPATH="/tmp/site:/tmp/pathedu_src"
export PYTHONSAFEPATH=1
export PYTHONUNBUFFERED=1
export PATHEDU_FLA=yes
export PATHEDU_CHECKS_DIR=/tmp/pathedu_checks
export PATHEDU_GPU_FAILURES="$OUT/gpu_failures.log"  # each failure as it happens (conftest.py)
rm -f "$PATHEDU_GPU_FAILURES"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ${PATHEDU_GPU_WORKERS:-10} > 0 ? $(nproc) / ${PATHEDU_GPU_WORKERS:-10} : 1 ))}
rm -rf "$PATHEDU_CHECKS_DIR" && mkdir -p "$PATHEDU_CHECKS_DIR"

{
    echo "== tests/gpu/run.sh, commit ${PATHEDU_COMMIT:-(git)}"
    nvidia-smi -L
    "$PY" -c "import sys, torch, triton, fla, ipykernel, nbclient, pathedu, xdist
print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__,
      '| fla', fla.__version__, '| ipykernel', ipykernel.__version__, '| nbclient', nbclient.__version__,
      '| pytest-xdist', xdist.__version__, '| pathedu from', pathedu.__file__, '| triton mode', pathedu.triton_mode())"
} 2>&1 | tee "$LOG"

timeout -s INT -k 30 "${PATHEDU_GPU_TIMEOUT:-510}" \
    "$PY" -m pytest ${PATHEDU_GPU_TESTS:-tests/gpu} ${PATHEDU_GPU_SELECT:+-k "$PATHEDU_GPU_SELECT"} -o addopts="" -p no:cacheprovider ${PATHEDU_GPU_PYTEST_ARGS--x} -q --durations=20 \
    -n "${PATHEDU_GPU_WORKERS:-10}" --junitxml "$OUT/gpu_junit.xml" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}

parts=("$PATHEDU_CHECKS_DIR"/gpu_checks_*.json)
if [ -e "${parts[0]}" ]; then
    "$PY" -m pathedu.bench.checks --merge "${parts[@]}" --out "$OUT/gpu_checks.json" \
        --command "bash tests/gpu/run.sh (tests/gpu/test_checks.py: one checks command a section, merged)" \
        2>&1 | tee -a "$LOG"
    echo "checks merged: ${#parts[@]} of $("$PY" -m pathedu.bench.checks --list | wc -l) sections" | tee -a "$LOG"
else
    echo "no GPU-check results to merge" | tee -a "$LOG"
fi
echo "run.sh: pytest exit code $rc; $(( $(date +%s) - start )) s in all" | tee -a "$LOG"
exit "$rc"
