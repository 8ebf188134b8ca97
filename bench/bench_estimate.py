"""Full cost-model estimates per second on one core (the solver scores thousands of candidates).

    python bench/bench_estimate.py [--seconds 2] [--repeat 3] [--case deepseek]

Scores a mix of configurations (dense and MoE, 8 to 16,384 GPUs, pipelines of 1 to 16 stages)
in a loop on one process and prints estimates per second for each and overall (best of
``--repeat`` runs).

Each case is a family of distinct configurations around one base configuration: micro-batch
(and so grad_accum), recompute mode, ZeRO stage and, for interleaved pipelines, vpp vary, so
consecutive calls never repeat one configuration. Before every pass over a family the caches
keyed on a whole configuration (``costmodel.stage_cache._stage_model``, behind ``stage_model``, used by the solver's
tables) are cleared, so what is measured is a sweep of configurations not seen before; caches
keyed on sub-terms that distinct configurations share (one layer's cost for a shape, network
and per-model constants) stay warm, as they do in a real sweep.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from costmodel import stage_cache  # noqa: E402
from costmodel.catalog import get_model  # noqa: E402
from costmodel.specs import ParallelConfig, SpecError, Workload, validate  # noqa: E402
from costmodel.training import estimate  # noqa: E402
from costmodel.files.clusters import load_cluster  # noqa: E402

CASES = [
    ("llama-3-8b", "dgx-h100", 8, 64, 8192, dict(tp=1, pp=1, dp=8, zero=3, grad_accum=8)),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, dict(tp=8, pp=2, dp=4, sp=True, grad_accum=128, recompute="selective")),
    ("llama-3.1-405b", "dgx-h100", 16384, 2048, 8192, dict(tp=8, pp=16, dp=128, sp=True, vpp=4, grad_accum=16)),
    ("mixtral-8x7b", "dgx-h100", 32, 256, 4096, dict(tp=2, pp=1, dp=16, ep=8, grad_accum=16)),
    ("deepseek-v3", "dgx-h100", 2048, 4096, 4096, dict(tp=1, pp=16, dp=128, ep=64, grad_accum=32, recompute="full")),
]


def variants(model, cluster, wl: Workload, base: dict) -> list[ParallelConfig]:
    """Distinct valid configurations around ``base`` (the base first)."""
    p0 = ParallelConfig(**base)
    per_replica = wl.global_batch // p0.dp
    out = [p0]
    zeros = (0, 1, 2, 3) if p0.dp > 1 else (1,)
    vpps = sorted({p0.vpp, 1}, reverse=True)
    for mb, rc, zero, vpp in itertools.product((1, 2, 4), ("none", "selective", "full"), zeros, vpps):
        if per_replica % mb:
            continue
        try:
            par = dataclasses.replace(p0, micro_batch=mb, grad_accum=per_replica // mb, recompute=rc, zero=zero,
                                      vpp=vpp, schedule="")
            validate(model, cluster, wl, par)
        except SpecError:
            continue
        if par not in out:
            out.append(par)
    return out


def _clear_config_caches() -> None:
    """Drop caches keyed on a whole configuration, so no call is served from an identical one."""
    stage_cache._stage_model.cache_clear()
    stage_cache.clear_stage_costs()


def run_case(m, c, wl, pars: list[ParallelConfig], seconds: float) -> tuple[float, float]:
    """(estimates per wall second, per CPU second of this process). On a shared machine the wall
    rate falls with the other jobs' load; the CPU rate much less (it still pays for shared caches)."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        _clear_config_caches()
        for par in pars:
            estimate(m, c, wl, par)
        n += len(pars)
    return n / (time.perf_counter() - t0), n / max(1e-9, time.process_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the best is reported")
    ap.add_argument("--case", default="", help="only the cases whose model name contains this")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'case':40s} {'configs':>8s} {'estimates/s':>12s} {'per CPU s':>10s}")
    rates, cpu_rates = [], []
    for model, cluster, gpus, gb, seq, par in CASES:
        if args.case not in model:
            continue
        m, c = get_model(model), load_cluster(cluster).with_gpus(gpus)
        wl = Workload(global_batch=gb, seq_len=seq)
        pars = variants(m, c, wl, par)
        for p in pars:                    # warm the per-shape caches once, outside the timing
            estimate(m, c, wl, p)
        runs = [run_case(m, c, wl, pars, args.seconds) for _ in range(args.repeat)]
        rate, cpu_rate = max(r for r, _ in runs), max(c_ for _, c_ in runs)
        rates.append(rate)
        cpu_rates.append(cpu_rate)
        print(f"{model + ' on ' + str(gpus) + f' (pp {pars[0].pp})':40s} {len(pars):8d} {rate:12,.0f} {cpu_rate:10,.0f}")
    # harmonic mean: estimates per second over an equal number of calls of each case
    print(f"{'overall':40s} {'':8s} {len(rates) / sum(1 / r for r in rates):12,.0f} "
          f"{len(cpu_rates) / sum(1 / r for r in cpu_rates):10,.0f}")


if __name__ == "__main__":
    main()
