"""Fit the fixed host time of one Megatron-Core MoE layer (``costmodel.moe.MEGATRON_LAYER_HOST_S``:
forward + backward, one micro-batch, eager) on the public runs whose layers are host-paced: the
``fit: host`` cases of ``calibration/published_runs_moe.yaml`` (Megatron-MoE-ModelZoo issue #7,
Qwen3-30B-A3B on 8 B200, EP8, micro-batch 1, forced balance, "~150 TFLOPs / GPU"; the ModelZoo's
Qwen3-235B-A22B TP4 EP8 PP8 row on 256 H100, 16 local experts and 1,024 tokens a rank at TP4).
Each run's value, then their median (what ``costmodel/moe.py`` holds).

    python bench/fit_moe_host.py

Bisection on the constant until each case's predicted throughput equals the published one; the
median is written into ``costmodel/moe.py`` by hand. Nothing else is fitted here; the held-out
tables (NeMo 25.x, Megatron-Bridge performance summaries, dgxc-benchmarking) are never read.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import yaml

from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate
from planner.cli import validation

RUNS = Path(__file__).resolve().parent.parent / "calibration" / "published_runs_moe.yaml"


def _step_s(case: dict, host_s: float) -> float:
    """The case's predicted step time with the Megatron profile's layer host time ``host_s``."""
    md = case["model"]
    model = validation._model(md, case["name"])
    cluster = load_cluster(case["cluster"]).with_gpus(case["num_gpus"])
    par_d = dict(case["parallel"])
    mb = par_d.pop("micro_batch", 1)
    par = ParallelConfig(micro_batch=mb, grad_accum=case["global_batch"] // (par_d["dp"] * mb), **par_d)
    prof = validation.FRAMEWORKS["megatron"]
    prof = dataclasses.replace(prof, **case.get("profile", {}))
    prof = dataclasses.replace(prof, moe=dataclasses.replace(prof.moe, **case.get("moe", {}), layer_host_s=host_s))
    wl = Workload(global_batch=case["global_batch"], seq_len=md["seq_len"], dtype=case.get("dtype", "bf16"))
    return estimate(model, cluster, wl, par, framework=prof).step_time_s


def fit(case: dict) -> tuple[float, float]:
    """(published / host-free predicted throughput, the host time that makes them equal)."""
    rows = [r for r in validation.moe_rows() if r.case == case["name"]]
    pred_now = rows[0].predicted                      # at the constant in costmodel/moe.py
    now = validation.FRAMEWORKS["megatron"].moe.layer_host_s
    want_step = _step_s(case, now) * pred_now / case["reported"]["tflops_per_gpu"]
    free = _step_s(case, 0.0)
    lo, hi = 0.0, 0.2
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if _step_s(case, mid) < want_step:
            lo = mid
        else:
            hi = mid
    return free / want_step, 0.5 * (lo + hi)


def fits() -> dict[str, float]:
    """Each ``fit: host`` case's layer host time (seconds)."""
    cases = yaml.safe_load(RUNS.read_text())["cases"]
    return {c["name"]: fit(c)[1] for c in cases if str(c.get("fit", "")).startswith("host")}


def main() -> None:
    out = fits()
    for name, h in out.items():
        print(f"{name}: layer host time {h * 1e3:.2f} ms (forward + backward, one micro-batch)")
    print(f"median {statistics.median(out.values()) * 1e3:.2f} ms over {len(out)} runs")


if __name__ == "__main__":
    main()
