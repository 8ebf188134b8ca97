"""One fitted constant's grid, row by row: the least-median and least-mean objectives side by side.

For the constant named (default ``gpu.H100.matmul_efficiency``) and the rows its group is fitted on
(``planner.cli.validation_cross._rows_for``), prints at each grid value the median and the mean absolute
error, the median signed error and the largest, every other constant at its shipped value. Stop 36 used it
to show why the fit takes the least mean absolute error: the least median over the H100 curve's 16 rows is
flat to a few hundredths of a point (docs/notes/stop-36, section 3).

    .venv/bin/python bench/scan_fit_objective.py [--constant NAME] [--values 0.75,0.76,...]
"""
from __future__ import annotations

import argparse
import statistics

from costmodel import fitted
from planner.cli import validation_cross as vc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--constant", default="gpu.H100.matmul_efficiency")
    ap.add_argument("--values", default="", help="comma-separated grid values (default: the constant's grid "
                                                  "within 0.05 of its shipped value)")
    args = ap.parse_args()
    const = fitted.BY_NAME[args.constant]
    cases, _ = vc.load_cases()
    rows = vc._rows_for(const.group, cases)
    shipped = vc.shipped_values()
    if args.values:
        grid = [float(x) for x in args.values.split(",")]
    else:
        grid = [x for x in const.grid if abs(x - shipped[const.name]) <= 0.05 + 1e-9]
    print(f"{const.name}: {len(rows)} rows ({', '.join(sorted({r.family for r in rows}))}); shipped "
          f"{shipped[const.name]}")
    print(f"{'value':>7} {'median |e|':>11} {'mean |e|':>9} {'median e':>9} {'largest':>8}")
    for x in grid:
        vals = dict(shipped, **{const.name: x})
        with vc.module_constants(vals):
            errs = [vc._err(r, vc.predict(r, vals)[0]) for r in rows]
        a = [abs(e) for e in errs]
        print(f"{x:7.3f} {100 * statistics.median(a):10.2f}% {100 * statistics.fmean(a):8.2f}% "
              f"{100 * statistics.median(errs):+8.2f}% {100 * max(a):7.1f}%")


if __name__ == "__main__":
    main()
