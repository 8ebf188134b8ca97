"""What a power limit below the rated board power costs compute-bound work: the sustained tensor-core
rate of a GPU run at ``GpuSpec.power_limit_w`` under its ``tdp_w``, as a fraction of the rated part's
(``power_rate_factor``; ``GpuSpec.rate`` multiplies it in, as it does the part's ``clock_factor``).

Under a power limit the GPU holds its board power by lowering the SM clock; the memory clock stays
(Colangelo et al., Emerald AI, "Characterizing Job Power Elasticity for Power-Flexible AI Training": the
H200 and H100 "preferentially" throttle compute, not memory). So the limit slows GEMMs and attention,
not HBM-bound kernels, and a measured GEMM table (``ClusterSpec.matmul_table``, taken at the limit the
GPUs run at) already holds it: ``compute.gemm_rate`` then prices on the datasheet peak, not on ``rate``.

One measured curve, for the H100 SXM5 with HBM2e (``H100_HBM2E_CURVE``): Mayr, Wind, Schröder, Hager,
Köstler, Wellein, "AI Application Benchmarking: Power-Aware Performance Analysis for Vision and Language
Models" (NHR@FAU, arXiv 2603.16164, Mar 2026), Table 4, row "Pre-training / H100": Llama 3 8B continued
pre-training (LitGPT) on one node of 4 H100 SXM 94 GB HBM2e (700 W rated; NHR@FAU's Helma), tokens/s per
GPU at power limits of 200 to 700 W: 9,699.3 / 17,982.3 / 24,853.4 / 27,705.3 / 29,250.0 / 30,271.0, so
0.320 / 0.594 / 0.821 / 0.915 / 0.966 / 1 of the 700 W figure. The table was read here as a public
project's transcription of it (the store holds the paper's abstract, not its tables), attributed cell by
cell; it was not checked against the PDF (docs/notes/stop-55, research/power_cap.md). The same group's
SM-clock figure for another workload (Ujeniya et al., arXiv 2604.11391, Fig. 6b: 1,731 MHz at 500 W,
1,969 MHz at 700 W, 0.879) agrees in size.

Why that curve and how far to trust it:
* it is a training step's throughput, not a GEMM's: the step's memory-bound and communication time does
  not slow with the clock, so read as the tensor-core rate it understates the slowdown a little (at
  500 W the clock figure above is 0.879, the step 0.915);
* a harder-drawing workload loses more: Emerald AI's H100 runs (dense pre-training and fine-tuning,
  24-70B) lost throughput nearly as fast as power (their power-flexibility index, the relative power cut over
  the relative throughput lost, 1.19-1.33 averaged over 200-700 W limits; this curve's is about 2.5 with the
  limit taken as the power), so a large dense model at 500 W may run nearer 0.85;
* it is measured on the H100 SXM5 with HBM2e (94/96 GB), the part Meta's Grand Teton hosts run at 500 W
  (calibration/clusters/meta-grandteton-h100-96gb-hbm2e.yaml); the other H100 SXM5 (80 GB HBM3) is priced
  on it too, as the same die and board power. Other parts (A100, H200, Blackwell) have no measured
  curve: their limit is not priced, and the prediction says so (``costmodel.ceilings.power_flag``).
A prediction on capped GPUs keeps that flag either way, with what it was priced on.
"""
from __future__ import annotations

import bisect
from functools import lru_cache

# (power limit / rated board power, throughput / throughput at the rated power): module docstring
H100_HBM2E_CURVE: tuple[tuple[float, float], ...] = (
    (200 / 700, 9699.3 / 30271.0), (300 / 700, 17982.3 / 30271.0), (400 / 700, 24853.4 / 30271.0),
    (500 / 700, 27705.3 / 30271.0), (600 / 700, 29250.0 / 30271.0), (1.0, 1.0))
CURVE_SOURCE = ("Llama 3 8B pre-training on H100 SXM5 94 GB HBM2e at 200-700 W (Mayr et al., arXiv 2603.16164, "
                "Table 4)")


def power_curve(gpu_name: str) -> tuple[tuple[float, float], ...] | None:
    """The measured curve that prices a power limit on this part, or None where none is on file."""
    return H100_HBM2E_CURVE if gpu_name.upper().startswith("H100") else None


@lru_cache(maxsize=256)
def power_rate_factor(gpu_name: str, tdp_w: float, power_limit_w: float) -> float:
    """The part's sustained compute rate at ``power_limit_w`` over its rate at the rated ``tdp_w``: 1 without
    a limit below the rated power, or without a measured curve for the part (``power_curve``); else the
    curve, linear between its points and, below its lowest, proportional to the limit (the clock cannot
    hold where the board cannot feed it)."""
    curve = power_curve(gpu_name)
    if curve is None or not (0 < power_limit_w < tdp_w):
        return 1.0
    x = power_limit_w / tdp_w
    xs = [p for p, _ in curve]
    if x <= xs[0]:
        return curve[0][1] * x / xs[0]
    i = bisect.bisect_left(xs, x)
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
