"""Whole `planner plan` command time for the issue's three reference problems, on this machine.

    python bench/bench_solver.py [--repeat 3] [--target all|megatron|...|generic]

Runs the real CLI in a subprocess (imports and start-up included) and reports wall and CPU
time, the solver status and the candidates scored. CPU time is the figure to trust on a
shared machine.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = [
    ("llama-3-70b on 64 H100", ["--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64",
                                "--global-batch", "512", "--seq-len", "8192"]),
    ("llama-3.1-405b on 16,384 H100", ["--model", "llama-3.1-405b", "--cluster", "dgx-h100", "--gpus", "16384",
                                       "--global-batch", "2048", "--seq-len", "8192"]),
    ("deepseek-v3 on 2,048 H100", ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "2048",
                                   "--global-batch", "4096", "--seq-len", "4096"]),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--target", default="all", help="planner plan --target (all: one solve per framework)")
    args = ap.parse_args()
    print("| problem | target | wall s (best) | CPU s (best) | status | candidates | solved by CP-SAT | plan |")
    print("|---|---|---:|---:|---|---:|---:|---|")
    for name, flags in CASES:
        best_wall = best_cpu = float("inf")
        out = None
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "planner", "plan", *flags, "--target", args.target, "--json"],
                               capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
            out = json.loads(r.stdout)
        p = out["plans"][0]["parallel"]
        shape = f"tp{p['tp']} pp{p['pp']} dp{p['dp']} cp{p['cp']} ep{p['ep']} zero{p['zero']} vpp{p['vpp']}"
        s = out["solver"]
        target = out["plans"][0].get("target", args.target)
        print(f"| {name} | {target} | {best_wall:.2f} | {best_cpu:.2f} | {s['status']} | {s['candidates']} | "
              f"{s['solved']} | {shape} |")


if __name__ == "__main__":
    main()
