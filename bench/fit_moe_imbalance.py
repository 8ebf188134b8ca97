"""Fit the MoE load factors (``costmodel.moe.LOAD_FACTOR``: the busiest expert-parallel rank's
routed tokens over the mean) on runs published both dropless and with forced balance.

    python bench/fit_moe_imbalance.py

The pairs: the ``fit`` cases of ``calibration/published_runs_moe.yaml`` (Megatron-MoE-ModelZoo:
Mixtral-8x22B with an auxiliary-loss coefficient of 1e-2 on 128 H100; Qwen3-235B-A22B with 1e-3 on
256 H100 at 16k-128k tokens). Forced balance (``--moe-router-force-load-balancing``) gives every
rank the mean share, so the published dropless / forced throughput ratio is the cost of the
imbalance alone, whatever the rest of the model gets wrong. For each pair the factor is found by
bisection that makes this cost model's forced / dropless step-time ratio equal the published one;
the median of each kind is printed, and written into ``costmodel/moe.py`` by hand. Nothing else is
fitted here; the held-out tables (NeMo 25.x, Megatron-Bridge, dgxc-benchmarking) are never read.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import yaml

from costmodel import layers, moe, stage_cache
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate
from planner.cli import validation
from profiles.clusters import load_cluster

RUNS = Path(__file__).resolve().parent.parent / "calibration" / "published_runs_moe.yaml"


def _clear() -> None:
    layers.layer_cost.cache_clear()
    stage_cache._shared_equal.cache_clear()
    stage_cache._stage_model.cache_clear()
    stage_cache._SHARED_BY_ID.clear()


def _step_s(case: dict, kind: str, factor: float) -> float:
    """The case's predicted step time with ``LOAD_FACTOR[kind] = factor``."""
    old = moe.LOAD_FACTOR[kind]
    moe.LOAD_FACTOR[kind] = factor
    _clear()
    try:
        md = case["model"]
        model = validation._model(md, case["name"])
        cluster = load_cluster(case["cluster"]).with_gpus(case["num_gpus"])
        par_d = dict(case["parallel"])
        mb = par_d.pop("micro_batch", 1)
        par = ParallelConfig(micro_batch=mb, grad_accum=case["global_batch"] // (par_d["dp"] * mb), **par_d)
        prof = validation.FRAMEWORKS["megatron"]
        prof = dataclasses.replace(prof, **case.get("profile", {}))
        prof = dataclasses.replace(prof, moe=dataclasses.replace(prof.moe, **case.get("moe", {})))
        wl = Workload(global_batch=case["global_batch"], seq_len=md["seq_len"], dtype=case.get("dtype", "bf16"))
        return estimate(model, cluster, wl, par, framework=prof).step_time_s
    finally:
        moe.LOAD_FACTOR[kind] = old
        _clear()


def fit_pair(dropless: dict, forced: dict) -> tuple[str, float, float]:
    """(kind, published ratio, factor): the factor whose dropless/forced step ratio is the
    published forced/dropless throughput ratio."""
    model = validation._model(dropless["model"], dropless["name"])
    kind = moe.balance_kind(model.router_balance or "aux_loss", model.router_aux_coeff)
    want = forced["reported"]["tflops_per_gpu"] / dropless["reported"]["tflops_per_gpu"]
    base = _step_s(forced, kind, 1.0)
    lo, hi = 1.0, 4.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if _step_s(dropless, kind, mid) / base < want:
            lo = mid
        else:
            hi = mid
    return kind, want, 0.5 * (lo + hi)


def main() -> None:
    cases = yaml.safe_load(RUNS.read_text())["cases"]
    fits = {c["name"]: c for c in cases if c.get("fit")}
    by_kind: dict[str, list[float]] = {}
    for name, c in sorted(fits.items()):
        if not name.endswith("-dropless"):
            continue
        forced = fits[name.removesuffix("-dropless") + "-forced"]
        kind, want, f = fit_pair(c, forced)
        by_kind.setdefault(kind, []).append(f)
        print(f"{name}: published forced/dropless {want:.3f} -> {kind} factor {f:.3f}")
    for kind, fs in sorted(by_kind.items()):
        print(f"{kind}: median {statistics.median(fs):.3f} over {len(fs)} pairs (range {min(fs):.3f}-{max(fs):.3f}); "
              f"costmodel/moe.py has {moe.LOAD_FACTOR[kind]}")


if __name__ == "__main__":
    main()
