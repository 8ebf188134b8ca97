"""Full cost-model estimates per second on one core (the solver scores thousands of candidates).

    python bench/bench_estimate.py [--seconds 3]

Scores a mix of configurations (dense and MoE, 8 to 16,384 GPUs, pipelines of 1 to 16 stages)
in a loop on one process and prints estimates per second for each and overall.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from costmodel.catalog import get_model  # noqa: E402
from costmodel.specs import ParallelConfig, Workload  # noqa: E402
from costmodel.training import estimate  # noqa: E402
from profiles.clusters import load_cluster  # noqa: E402

CASES = [
    ("llama-3-8b", "dgx-h100", 8, 64, 8192, dict(tp=1, pp=1, dp=8, zero=3, grad_accum=8)),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, dict(tp=8, pp=2, dp=4, sp=True, grad_accum=128, recompute="selective")),
    ("llama-3.1-405b", "dgx-h100", 16384, 2048, 8192, dict(tp=8, pp=16, dp=128, sp=True, vpp=4, grad_accum=16)),
    ("mixtral-8x7b", "dgx-h100", 32, 256, 4096, dict(tp=2, pp=1, dp=16, ep=8, grad_accum=16)),
    ("deepseek-v3", "dgx-h100", 2048, 4096, 4096, dict(tp=1, pp=16, dp=128, ep=64, grad_accum=32, recompute="full")),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    total_n, total_t = 0, 0.0
    print(f"{'case':40s} {'estimates/s':>12s}")
    for model, cluster, gpus, gb, seq, par in CASES:
        m, c = get_model(model), load_cluster(cluster).with_gpus(gpus)
        wl, p = Workload(global_batch=gb, seq_len=seq), ParallelConfig(**par)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            estimate(m, c, wl, p)
            n += 1
        dt = time.perf_counter() - t0
        total_n, total_t = total_n + n, total_t + dt
        print(f"{model + ' on ' + str(gpus):40s} {n / dt:12,.0f}")
    print(f"{'overall':40s} {total_n / total_t:12,.0f}")


if __name__ == "__main__":
    main()
