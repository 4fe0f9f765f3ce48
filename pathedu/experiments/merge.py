"""``python -m pathedu.experiments.merge OUT PART.json [PART.json ...]``: merge the parts of one experiment
series (run on different seeds or mixers) into ``OUT`` (see :func:`pathedu.experiments.merge_records`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import merge_records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.experiments.merge", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("parts", nargs="+", type=Path)
    p.add_argument("--note", help="a remark about the runs, kept in the record (e.g. a part that was repeated)")
    args = p.parse_args(argv)
    record = merge_records([json.loads(path.read_text()) for path in args.parts])
    # The merge is part of how the file was made: its command (parts as given; the note is in the record).
    record["merge_command"] = "python -m pathedu.experiments.merge " + " ".join(
        [str(args.out)] + [str(p) for p in args.parts] + (["--note ..."] if args.note else []))
    if args.note:
        record = {"experiment": record["experiment"], "note": args.note, **record}
    args.out.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
    print(f"{len(record['runs'])} runs from {len(args.parts)} parts written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
