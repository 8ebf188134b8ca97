"""Fit the FP8 GEMM efficiency curve (``costmodel.fp8``: ``FP8_GEMM_EFFICIENCY`` and
``FP8_HALF_SIZE_FACTOR``) on the FP8 runs on catalog hardware.

    python bench/fit_fp8.py

The runs: NeMo 24.07's FP8 table (``calibration/published_runs_fp8.yaml``) and the torchtitan Float8
rows of ``calibration/published_runs_frameworks.yaml`` whose machines are the catalog cluster
(``planner.cli.validation``, split ``fp8``). Two physics parameters shared by every case are scanned
on a grid and the pair with the least median absolute error printed, with the error before and
after; the chosen values are written into ``costmodel/fp8.py`` by hand. Never fitted on: the
performance summaries of NeMo 25.x and Megatron-Bridge (held out), runs on other machines.
"""
from __future__ import annotations

import statistics

from costmodel import fp8, layers, stage_cache
from planner.cli import validation


def _clear() -> None:
    layers.layer_cost.cache_clear()
    layers.ends_cost.cache_clear()
    stage_cache._shared_equal.cache_clear()
    stage_cache._stage_model.cache_clear()
    stage_cache._SHARED_BY_ID.clear()


def errors(eff: float, half: float) -> list[float]:
    old = fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR
    fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR = eff, half
    _clear()
    try:
        return [abs(r.error) for r in validation.all_rows(include_holdout=False) if r.split == "fp8"]
    finally:
        fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR = old
        _clear()


def main() -> None:
    now = errors(fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR)
    best = None
    for half in (1.0, 1.5, 2.0, 3.0, 4.0, 6.0):
        for k in range(60, 101, 2):
            e = errors(k / 100, half)
            key = (statistics.median(e), max(e))
            if best is None or key < best[0]:
                best = (key, k / 100, half)
    (med, big), eff, half = best
    print(f"figures {len(now)}: now eff {fp8.FP8_GEMM_EFFICIENCY:.2f} half x{fp8.FP8_HALF_SIZE_FACTOR:g}: median "
          f"{statistics.median(now) * 100:.1f}% largest {max(now) * 100:.1f}%")
    print(f"fitted eff {eff:.2f} half x{half:g}: median {med * 100:.1f}% largest {big * 100:.1f}%")


if __name__ == "__main__":
    main()
