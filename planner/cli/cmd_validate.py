"""``planner validate``: the cost model against published runs, as a table.

``--cross``: out-of-source validation (``planner.cli.validation_cross``): each recipe family is
left out in turn, every fitted constant refitted without it, and the family predicted with the
result. ``--write-bands`` rewrites the training kinds of ``costmodel/uncertainty_bands.yaml`` from
those out-of-source errors (``planner.cli.validation_bands``).
"""
from __future__ import annotations

import argparse

HELP = "hold the cost model against published training runs (in-sample tables, or --cross: out of source)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write", metavar="FILE", help="write the Markdown table to FILE")
    p.add_argument("--json", action="store_true",
                   help="print the rows as JSON (the stable contract; scripts read this, not the table)")
    p.add_argument("--cross", action="store_true",
                   help="out-of-source validation: refit every fitted constant without one recipe family at a "
                        "time and predict that family")
    p.add_argument("--families", metavar="A,B", default=None,
                   help="with --cross: leave out only these families (default: every family)")
    p.add_argument("--write-bands", action="store_true",
                   help="with --cross over every family: rewrite the training kinds of costmodel/uncertainty_bands.yaml "
                        "from the out-of-source errors")


def run(args: argparse.Namespace) -> int:
    from planner.cli.report import print_json
    from planner.plan.errors import UsageError

    if not args.cross:
        if args.families or args.write_bands:
            raise UsageError("--families and --write-bands need --cross; try: planner validate --cross"
                             + (" --write-bands" if args.write_bands else f" --families {args.families}"))
        from planner.cli.validation import all_rows, markdown
        rows = all_rows()
        if args.json:
            print_json([{"case": r.case, "split": r.split, "metric": r.metric, "published": r.published,
                         "predicted": r.predicted, "error": r.error} for r in rows])
        else:
            print(markdown(rows), end="")
        if args.write:
            from profiles.safeio import write_text
            write_text(args.write, markdown(rows), "--write")
        return 0

    from planner.cli import validation_cross as vc
    fams = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
    if args.write_bands and fams:
        raise UsageError("--write-bands needs every family left out in turn; drop --families")
    res = vc.cross_validate(fams)
    text = vc.markdown(res)
    if args.json:
        print_json(vc.as_json(res))
    else:
        print(text, end="")
    if args.write:
        from profiles.safeio import write_text
        write_text(args.write, text, "--write")
    if args.write_bands:
        import sys
        from planner.cli.uncertainty_bands import write_training_bands
        path = write_training_bands(res)
        print(f"wrote the training bands of {path}", file=sys.stderr)
    return 0
