r"""Several runs of one experiment at once, each group of runs in its own process, all on one device.

``python -m pathedu.experiments NAME --jobs K ...`` (or :func:`run_parallel`) splits the experiment's runs
into ``K`` groups and trains each group in a separate Python process; the parent merges the groups' records
into one, in the order a single process would have run them.

Why processes.  The experiments' models are small and their sequences short, so a training step is a
few dozen small kernels and most of a step's time is Python launching them: on one H100 a step of the
word-problem model takes 5-10 ms at one layer, about the same at lengths 10 to 40 (launch-bound, see
:mod:`pathedu.experiments.word_problem`), while the GPU waits.  Separate processes launch independently,
so their kernels can fill each other's gaps.  How much that gains on a given machine is measured, not
assumed: the record keeps ``parallel = {"jobs", "elapsed_s"}`` beside the sum of the groups' own wall times.

Each process rewrites its part (``part<i>.json``: the runs it has finished, with its command, commit and
device) after every run.  With ``workdir`` (``--workdir DIR``) the parts stay in that folder, so a series cut
short (a time limit, a lost machine) keeps every finished run: ``python -m pathedu.experiments.merge OUT
DIR/part*.json`` makes a record of them.

Every run seeds itself (:func:`pathedu.experiments._common.train_run`), so a run's result does not depend
on which process trained it or what ran beside it (up to the GPU's own run-to-run differences in floating
point).  Each process gets ``cores // K`` CPU threads.

Which settings enumerate the runs is each experiment module's ``GRID``: a dict from a list-valued setting
(``"seeds"``) to the field that names its value in a run's record (``"seed"``).  The runs are the product
of those lists, in the module's loop order.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["grid_points", "run_parallel", "process_devices", "narrowed"]


def grid_points(name: str, config: dict) -> list[dict]:
    """Every run of experiment ``name`` under ``config``, as ``{setting: one value}`` (e.g.
    ``{"seeds": 0, "mixers": "path"}``), in the order a single process runs them."""
    from . import get_module

    keys = list(get_module(name).GRID)
    return [dict(zip(keys, values)) for values in itertools.product(*(config[k] for k in keys))]


def _narrow(config: dict, point: dict) -> dict:
    """``config`` with every grid setting reduced to the one value of ``point``."""
    return {**config, **{k: [v] for k, v in point.items()}}


def narrowed(config: dict, points: list[dict], keys) -> dict:
    """``config`` with each grid setting in ``keys`` reduced to the values that ``points`` take (in ``config``'s
    order when ``points`` come in grid order): the settings of a record holding just those runs."""
    return {**config, **{k: list(dict.fromkeys(p[k] for p in points)) for k in keys}}


def process_devices(device, n: int) -> list:
    """The device of each of ``n`` processes: ``device`` for every one (None: CUDA when available, chosen by each
    process), except that ``"cuda"`` or None on a machine with several GPUs spreads the processes over them in
    turn (``cuda:0, cuda:1, ..., cuda:0, ...``); a numbered device (``"cuda:1"``) keeps them all on that one."""
    import torch

    if (device is None or str(device) == "cuda") and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        return [f"cuda:{i % torch.cuda.device_count()}" for i in range(n)]
    return [None if device is None else str(device)] * n


def run_parallel(name: str, config: dict, *, jobs: int, device=None, out=None, command: str | None = None,
                 progress: bool = True, workdir=None, overwrite: bool = True, skip=()) -> dict:
    """Run experiment ``name`` with ``config`` in ``jobs`` processes (see the module's text) and return the
    merged record, written as :func:`pathedu.experiments.write_record` does (``out=None``: a new file in the
    current folder; ``False``: not written; an existing ``out`` only with ``overwrite``).

    ``device``: every process's device (default: CUDA when available; several GPUs share the processes,
    :func:`process_devices`).  The record is what
    :func:`pathedu.experiments.run_experiment` would write, with ``runs`` in the single-process order,
    ``parts`` (each process's command, commit, device and wall time) and ``parallel``.  ``workdir``: a folder
    that keeps the processes' parts, logs and specs (default: a temporary one, removed at the end).  ``out`` is
    rewritten whenever a run finishes, with the runs finished so far (a series cut short keeps them).  ``skip``:
    records whose runs are not trained again, as for :func:`pathedu.experiments.run_experiment`."""
    from tqdm.auto import tqdm

    from . import done_points, get_module, merge_records, point_key, record_writer

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"`jobs` must be a positive int, got {jobs!r}")
    mod = get_module(name)
    points = grid_points(name, config)
    if not points:
        raise ValueError(f"`config` enumerates no runs: one of {list(mod.GRID)} is empty")
    done = done_points(name, config, skip)
    points = [p for p in points if point_key(name, p) not in done]
    if not points:
        raise ValueError("every run of `config` is in the records to skip: nothing to run")
    write = record_writer(out, name, overwrite=overwrite)
    order = {point_key(name, p): n for n, p in enumerate(points)}

    def merged(records):  # the parts as one record, runs in the single process's order
        record = merge_records(records)
        record["runs"].sort(key=lambda r: order[point_key(name, r)])
        finished = {point_key(name, r) for r in record["runs"]}
        ran = [p for p in points if point_key(name, p) in finished]
        record["config"] = narrowed(config, ran, mod.GRID)
        record["summary"] = mod.summarize(record["runs"], record["config"])
        if command is not None:
            record["command"] = command
        return record

    groups = [points[i::jobs] for i in range(min(jobs, len(points)))]  # round robin: cheap and dear runs mixed
    threads = max(1, (os.cpu_count() or 1) // len(groups))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        if any(Path(workdir).glob("part*.json")):
            raise ValueError(f"`workdir` {str(workdir)!r} already holds parts of a series: use an empty folder")
    with (contextlib.nullcontext(str(workdir)) if workdir is not None
          else tempfile.TemporaryDirectory(prefix=f"pathedu_{name}_")) as tmp:
        tmp = Path(tmp)

        def write_parts():  # the runs the processes have finished so far, as the record
            parts = [json.loads(f.read_text()) for f in sorted(tmp.glob("part*.json"))]
            if parts:
                write({**merged(parts), "parallel": {"jobs": len(groups), "elapsed_s": time.perf_counter() - start}})

        procs = []
        devices = process_devices(device, len(groups))
        for i, group in enumerate(groups):
            spec = {"name": name, "config": config, "points": group, "device": devices[i],
                    "out": str(tmp / f"part{i}.json"), "done": str(tmp / f"done{i}.txt"),
                    "command": f"{command or 'run_parallel'} [process {i + 1} of {len(groups)}: {len(group)} runs]"}
            (tmp / f"spec{i}.json").write_text(json.dumps(spec))
            log = open(tmp / f"log{i}.txt", "w")
            procs.append((subprocess.Popen([sys.executable, "-m", "pathedu.experiments.parallel", "--worker",
                                            str(tmp / f"spec{i}.json")], env=env, stdout=log,
                                           stderr=subprocess.STDOUT), log))
        bar = tqdm(total=len(points), desc=f"{name}: {len(points)} runs in {len(groups)} processes",
                   disable=not progress, dynamic_ncols=True)
        while any(p.poll() is None for p, _ in procs):
            time.sleep(1.0)
            n_done = _count_done(tmp, len(groups))
            if n_done > bar.n and n_done < len(points):  # a run finished: the record so far
                try:
                    write_parts()
                except (OSError, ValueError, KeyError) as e:  # the parts stay; the record waits for the next run
                    print(f"record not rewritten after a finished run: {e!r}", file=sys.stderr)
            bar.update(n_done - bar.n)
        bar.update(_count_done(tmp, len(groups)) - bar.n)
        bar.close()
        for _, log in procs:
            log.close()
        failed = [i for i, (p, _) in enumerate(procs) if p.returncode != 0]
        if failed:
            write_parts()  # the runs the processes finished stay in the record
            i, code = failed[0], procs[failed[0]][0].returncode
            tail = (tmp / f"log{i}.txt").read_text()[-3000:]
            raise RuntimeError(f"process {i + 1} of {len(groups)} failed (exit code {code}):\n{tail}")
        records = [json.loads((tmp / f"part{i}.json").read_text()) for i in range(len(groups))]
    record = merged(records)
    record["parallel"] = {"jobs": len(groups), "elapsed_s": time.perf_counter() - start}
    return write(record)


def _count_done(tmp: Path, n: int) -> int:
    return sum(len((tmp / f"done{i}.txt").read_text().splitlines()) for i in range(n)
               if (tmp / f"done{i}.txt").exists())


def _worker(spec_path: str) -> int:
    """One process of :func:`run_parallel`: train its runs one by one, rewriting its record after each."""
    import torch

    from . import get_module, metadata

    spec = json.loads(Path(spec_path).read_text())
    mod, config = get_module(spec["name"]), spec["config"]
    device = torch.device(spec["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    start = time.perf_counter()
    runs, done = [], []
    for point in spec["points"]:
        runs.extend(mod.run(_narrow(config, point), device=device, progress=False)[0])
        done.append(point)
        # The settings of the runs finished so far, so that a part cut short merges as it stands.
        record = {"experiment": spec["name"], **metadata(device), "command": spec["command"],
                  "config": narrowed(config, done, mod.GRID), "wall_time_s": time.perf_counter() - start,
                  "runs": runs, "summary": None}
        tmp = Path(spec["out"] + ".tmp")
        tmp.write_text(json.dumps(record, allow_nan=True))
        os.replace(tmp, spec["out"])  # the parent reads parts while the processes run: never half a file
        with open(spec["done"], "a") as f:
            f.write(json.dumps(point) + "\n")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m pathedu.experiments.parallel",
                                description="a worker of run_parallel (not meant to be started by hand)")
    p.add_argument("--worker", required=True, help="the worker's spec file")
    raise SystemExit(_worker(p.parse_args().worker))
