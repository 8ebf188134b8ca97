"""Refit each framework's ``kernel_efficiency`` (``costmodel.frameworks``) on its own published runs.

    python bench/fit_frameworks.py

The constants, the rows each fit reads and the families they come from are recorded in
``costmodel/fitted.py``; the fit is ``planner.cli.validation_cross.fit`` with every family in (the
same procedure ``planner validate --cross`` runs with one family out): the GPU curves first, on
Megatron's runs, then each framework's kernel efficiency on its own bf16/fp16 runs on catalog
hardware (least median absolute error of tokens/s per GPU over the registry's grid). Prints, per
framework: figures, the shipped value and its median error, the refitted value and its median and
largest error. The shipped values are written into ``costmodel/frameworks.py`` by hand; the held-out
sources are never in calibration/ (tests/test_validation_sources.py).
"""
from __future__ import annotations

import statistics

from costmodel import fitted
from planner.cli import validation_cross as vc


def _errors(rows, values):
    with vc.module_constants(values):
        return [abs(vc._err(r, vc.predict(r, values)[0])) for r in rows]


def main() -> None:
    cases, _ = vc.load_cases()
    shipped = vc.shipped_values()
    full = vc.fit(cases)
    print(f"{'framework':<11} {'figures':>7} {'shipped':>7} {'median':>7} {'refit':>6} {'median':>7} {'largest':>8}  families")
    for c in fitted.FITTED:
        if not c.name.startswith("framework."):
            continue
        group = c.name.rsplit(".", 1)[0]
        rows = vc._rows_for(group, cases)
        fw = group.split(".")[1]
        if not rows:
            print(f"{fw:<11} {0:>7}  no runs on catalog hardware")
            continue
        now, new = _errors(rows, shipped), _errors(rows, full.values)
        print(f"{fw:<11} {len(rows):>7} {shipped[c.name]:>7.2f} {statistics.median(now) * 100:>6.1f}% "
              f"{full.values[c.name]:>6.2f} {statistics.median(new) * 100:>6.1f}% {max(new) * 100:>7.1f}%  "
              f"{', '.join(full.families[group])}")


if __name__ == "__main__":
    main()
