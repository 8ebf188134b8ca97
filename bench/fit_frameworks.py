"""Fit each framework's ``kernel_efficiency`` (``costmodel.frameworks``) on its own published runs.

    python bench/fit_frameworks.py

For every framework with runs on catalog hardware (``planner.cli.validation``: the calibration set
and ``calibration/published_runs_frameworks.yaml``, FP8 rows and runs on other machines left out),
scans the kernel efficiency from 0.60 to 1.40 and prints the value with the least median absolute
error, with the error before and after. The chosen values are written into
``costmodel/frameworks.py`` by hand, with these figures beside them; the holdout set is never used.
"""
from __future__ import annotations

import dataclasses
import statistics

from costmodel import frameworks
from planner.cli import validation


def rows_for(fw: str, eff: float) -> list:
    base = frameworks.FRAMEWORKS[fw]
    frameworks.FRAMEWORKS[fw] = dataclasses.replace(base, kernel_efficiency=eff)
    try:
        return [r for r in validation.all_rows(include_holdout=False)
                if r.framework == fw and r.split in ("calibration", "frameworks")]
    finally:
        frameworks.FRAMEWORKS[fw] = base


def main() -> None:
    print(f"{'framework':<11} {'figures':>7} {'now':>6} {'median now':>10} {'fitted':>7} {'median fitted':>13} {'largest':>8}")
    for fw in ("megatron", "torchtitan", "deepspeed", "accelerate"):
        now = frameworks.FRAMEWORKS[fw].kernel_efficiency
        base = rows_for(fw, now)
        if not base:
            print(f"{fw:<11} {0:>7}  no runs on catalog hardware")
            continue
        best = None
        for k in range(60, 141):
            eff = k / 100
            errs = [abs(r.error) for r in rows_for(fw, eff)]
            m = statistics.median(errs)
            if best is None or m < best[1] - 1e-12:
                best = (eff, m, max(errs))
        med_now = statistics.median(abs(r.error) for r in base)
        print(f"{fw:<11} {len(base):>7} {now:>6.2f} {med_now * 100:>9.1f}% {best[0]:>7.2f} {best[1] * 100:>12.1f}% "
              f"{best[2] * 100:>7.1f}%")


if __name__ == "__main__":
    main()
