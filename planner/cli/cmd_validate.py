"""``planner validate``: the cost model against published runs, as a table."""
from __future__ import annotations

import argparse

HELP = "hold the cost model against published training runs (calibration and holdout sets)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write", metavar="FILE", help="write the Markdown table to FILE")
    p.add_argument("--json", action="store_true",
                   help="print the rows as JSON (the stable contract; scripts read this, not the table)")


def run(args: argparse.Namespace) -> int:
    from planner.cli.report import print_json
    from planner.cli.validation import all_rows, markdown

    rows = all_rows()
    if args.json:
        print_json([{"case": r.case, "split": r.split, "metric": r.metric, "published": r.published,
                     "predicted": r.predicted, "error": r.error} for r in rows])
    else:
        print(markdown(rows), end="")
    if args.write:
        from costmodel.files.safeio import write_text
        write_text(args.write, markdown(rows), "--write")
    return 0
