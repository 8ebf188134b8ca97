"""Refit the FP8 GEMM efficiency curve (``costmodel.fp8``: ``FP8_GEMM_EFFICIENCY`` and
``FP8_HALF_SIZE_FACTOR``) on the FP8 runs on catalog hardware.

    python bench/fit_fp8.py

The two constants, their grid, their prior and the families they are fitted on are recorded in
``costmodel/fitted.py``; the fit is ``planner.cli.validation_cross.fit`` with every family in (the
procedure ``planner validate --cross`` runs with one family out): the BF16 GPU curves first, then
the FP8 pair on the FP8 runs (NeMo 24.07's FP8 table and torchtitan's Float8 rows on catalog
hardware), least median absolute error of tokens/s per GPU. Prints the shipped pair and the refit
with their errors. The chosen values are written into ``costmodel/fp8.py`` by hand.
"""
from __future__ import annotations

import statistics

from planner.cli import validation_cross as vc


def main() -> None:
    cases, _ = vc.load_cases()
    rows = vc._rows_for("fp8", cases)
    shipped = vc.shipped_values()
    full = vc.fit(cases)
    for label, v in (("shipped", shipped), ("refit", full.values)):
        with vc.module_constants(v):
            e = [abs(vc._err(r, vc.predict(r, v)[0])) for r in rows]
        print(f"{label:<8} eff {v['fp8.gemm_efficiency']:.2f} half x{v['fp8.half_size_factor']:g} "
              f"(BF16 H100 curve {v['gpu.H100.matmul_efficiency']:.2f}/{v['gpu.H100.matmul_half_size']:g}): "
              f"{len(e)} figures, median {statistics.median(e) * 100:.1f}%, largest {max(e) * 100:.1f}%")
    print(f"families: {', '.join(full.families['fp8'])}")


if __name__ == "__main__":
    main()
