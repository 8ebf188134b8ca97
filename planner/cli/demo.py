"""``make demo``: the tool's value in a few minutes, on any machine (CPU-only included).

1. The cost model: a few hand-picked ways to split llama-3-70b over 64 H100s, side by side.
2. The solver: the provably best plan for the same job, why, and the plan file it wrote.
3. Launch files for that plan (torchrun, Slurm, Kubernetes, Megatron-LM).
4. This machine: a quick profile, a plan for tiny-llama on its devices, and a real run of it
   with predicted against measured.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.table import Table

OUT = Path("out/demo")
c = Console(highlight=False)


def planner(*args: str, check: bool = True) -> int:
    cmd = [sys.executable, "-m", "planner", *args]
    c.print(f"[dim]$ planner {' '.join(args)}[/dim]")
    r = subprocess.run(cmd)
    if check and r.returncode != 0:
        c.print(f"[red]planner {args[0]} exited {r.returncode}[/red]")
    return r.returncode


def compare_configs() -> None:
    from costmodel.catalog import get_model
    from costmodel.specs import ParallelConfig, Workload
    from costmodel.training import estimate
    from profiles.clusters import load_cluster

    c.print(Rule("1. the cost model: five ways to split llama-3-70b over 64 H100s (512 x 8k tokens)"))
    m, cl = get_model("llama-3-70b"), load_cluster("dgx-h100").with_gpus(64)
    wl = Workload(global_batch=512, seq_len=8192)
    configs = [
        ("FSDP only", dict(tp=1, pp=1, dp=64, zero=3, grad_accum=8, recompute="full")),
        ("TP 8 + FSDP", dict(tp=8, pp=1, dp=8, zero=3, sp=True, grad_accum=64, recompute="selective")),
        ("TP 8 across nodes", dict(tp=8, pp=1, dp=8, zero=3, sp=True, grad_accum=64, recompute="selective")),
        ("TP 8 x PP 2 (Megatron-style)", dict(tp=8, pp=2, dp=4, zero=1, sp=True, grad_accum=128,
                                              recompute="selective")),
        ("TP 4 x PP 4, interleaved", dict(tp=4, pp=4, dp=4, zero=1, sp=True, vpp=4, grad_accum=128,
                                          recompute="full")),
    ]
    t = Table(header_style="bold")
    for col in ("configuration", "step", "tokens/s/GPU", "MFU", "peak GiB/GPU", "fits", "largest overhead"):
        t.add_column(col, justify="left" if col in ("configuration", "largest overhead") else "right")
    for name, kw in configs:
        order = ("tp", "pp", "dp", "cp") if "across" in name else None
        e = estimate(m, cl, wl, ParallelConfig(**kw), order=order)
        over = max(((k, v) for k, v in e.time.items() if k != "compute_s"), key=lambda kv: kv[1])
        t.add_row(name, f"{e.step_time_s:.1f} s", f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu * 100:.1f}%",
                  f"{e.peak_bytes / 2**30:.1f}", "yes" if e.fits else "[red]no[/red]",
                  f"{over[0].removesuffix('_s').replace('_', ' ')} {over[1] / e.step_time_s * 100:.0f}%")
    c.print(t)


def main() -> int:
    t0 = time.time()
    OUT.mkdir(parents=True, exist_ok=True)
    compare_configs()

    c.print(Rule("2. the solver: the provably best plan for the same job"))
    plan70 = OUT / "llama-3-70b-64xh100.yaml"
    planner("plan", "--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "8192", "--top", "3", "--out", str(plan70))
    planner("explain", str(plan70), "--html", str(OUT / "llama-3-70b-explain.html"))

    c.print(Rule("3. launch files for that plan (a target that cannot express it refuses and says why)"))
    for target in ("torchrun", "slurm", "kubernetes", "megatron"):
        planner("emit", str(plan70), "--target", target, "--out", str(OUT / "emit" / target), "--force",
                check=False)

    c.print(Rule("4. this machine: profile, plan tiny-llama for it, run it"))
    prof = OUT / "profile"
    if planner("profile", "--quick", "--out", str(prof), check=False) == 0 and (prof / "cluster.yaml").exists():
        cluster = str(prof / "cluster.yaml")
    else:
        c.print("[yellow]profiling failed; using the catalog's cpu cluster[/yellow]")
        cluster = "cpu"
    tiny = OUT / "tiny-llama.yaml"
    gpus = _local_devices(cluster)
    args = ["plan", "--model", "tiny-llama", "--cluster", cluster, "--gpus", str(gpus), "--global-batch", "8",
            "--seq-len", "128", "--out", str(tiny)]
    if planner(*args) == 0:
        planner("launch", str(tiny), "--steps", "6", check=False)
    c.print(Rule(f"done in {time.time() - t0:.0f} s; files in {OUT}/"))
    return 0


def _local_devices(cluster: str) -> int:
    """GPUs here, or on CPU as many processes as the profile ran (one per core, at most 4):
    more processes than cores would time-share them, which no prediction accounts for."""
    try:
        import torch
        if torch.cuda.is_available():
            return max(1, torch.cuda.device_count())
    except Exception:
        pass
    if cluster != "cpu":
        from profiles.clusters import load_cluster
        per_node = load_cluster(cluster).gpus_per_node
        if per_node >= 2:
            return min(4, per_node)
    return min(4, max(2, os.cpu_count() or 2))


if __name__ == "__main__":
    sys.exit(main())
