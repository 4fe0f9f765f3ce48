"""``python -m pathedu.experiments NAME [--preset P] [--mixers ...] [--steps N] [--seeds ...] [--device DEV]
[--out FILE [--overwrite]] [--skip-done RECORD ...] [--tiny] [--set KEY=JSON ...] [--jobs K [--workdir DIR]]
[--no-progress]``: see :mod:`pathedu.experiments` (without ``--out``, a new file ``exp_NAME.json`` in the current
folder).  The record is rewritten after every finished run, so a command cut short leaves its finished runs;
``--skip-done`` leaves out the runs already in the given records (same settings) and writes the others, a part
to merge with them (``python -m pathedu.experiments.merge``)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from pathlib import Path

from . import EXPERIMENTS, check_out, done_points, get_module, make_config, point_key, run_experiment


def _parse_set(items):
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--set expects KEY=VALUE (VALUE in JSON), got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a bare string
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m pathedu.experiments",
                                description="Train small models on the PaTH paper's synthetic tasks and write "
                                            "the record to a new file exp_NAME.json in the current folder "
                                            "(or --out FILE).")
    p.add_argument("name", choices=EXPERIMENTS)
    p.add_argument("--preset", help="named settings of the experiment (its module's PRESETS, e.g. 'paper'), "
                                    "applied before --tiny and the other options")
    p.add_argument("--mixers", nargs="+", help="mixers to train (default: the experiment's)")
    p.add_argument("--steps", type=int, help="optimizer steps per run")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (every seed is run and reported)")
    p.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda when available)")
    p.add_argument("--out", help="output JSON (default: a new file exp_NAME.json, or exp_NAME-2.json, ... in the "
                                 "current folder)")
    p.add_argument("--overwrite", action="store_true", help="let --out replace an existing file (e.g. the "
                                                            "book's pathedu/data/exp_NAME.json)")
    p.add_argument("--skip-done", nargs="+", metavar="RECORD", default=[],
                   help="records (JSON files) of the same experiment and settings, e.g. a command cut short: their "
                        "runs are not trained again, and --out holds only the others")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: a CPU run of seconds (tests, labs)")
    p.add_argument("--set", action="append", metavar="KEY=JSON", help="override any setting, e.g. --set lengths=[10,20]")
    p.add_argument("--jobs", type=int, default=1,
                   help="train the runs in this many processes at once, on one device (default 1)")
    p.add_argument("--workdir", help="with --jobs: keep each process's part (rewritten after every run) in this "
                                      "folder, so that a series cut short keeps its finished runs")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument("--show-config", action="store_true", help="print the configuration and exit")
    args = p.parse_args(argv)

    overrides = _parse_set(args.set)
    overrides.update(mixers=args.mixers, steps=args.steps, seeds=args.seeds)
    try:
        config = make_config(args.name, tiny=args.tiny, preset=args.preset, **overrides)
    except ValueError as e:
        p.error(str(e))
    try:
        skip = [json.loads(Path(f).read_text()) for f in args.skip_done]
        done = done_points(args.name, config, skip)
    except (OSError, json.JSONDecodeError, ValueError, KeyError) as e:
        p.error(f"--skip-done: {e}")
    if args.tiny and args.device is None:
        args.device = "cpu"
    if args.show_config:
        print(json.dumps(config, indent=1))
        return 0
    from .parallel import grid_points

    todo = [pt for pt in grid_points(args.name, config) if point_key(args.name, pt) not in done]
    if not todo:
        print(f"nothing to run: every run of this configuration is in {' '.join(args.skip_done)}")
        return 0
    command = "python -m pathedu.experiments " + " ".join(shlex.quote(a) for a in argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.workdir is not None and args.jobs < 2:
        p.error("--workdir goes with --jobs K (K >= 2)")
    if args.overwrite and args.out is None:
        p.error("--overwrite goes with --out FILE (without --out a run writes a new file)")
    try:
        check_out(args.out, args.overwrite)  # before any training
    except FileExistsError as e:
        p.error(str(e))
    if args.jobs > 1:
        from .parallel import run_parallel

        record = run_parallel(args.name, config, jobs=args.jobs, device=args.device, out=args.out,
                              progress=not args.no_progress, command=command, workdir=args.workdir,
                              overwrite=args.overwrite, skip=skip)
    else:
        record = run_experiment(args.name, config=config, device=args.device, out=args.out,
                                progress=not args.no_progress, command=command, overwrite=args.overwrite, skip=skip)
    print(json.dumps(record["summary"], indent=1))
    print(f"{len(record['runs'])} runs in {record['wall_time_s']:.1f} s on {record['device']}; "
          f"written to {record['written_to']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
