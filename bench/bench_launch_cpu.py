"""Predicted against measured step time of the built-in runtime on this machine's CPU.

    python bench/bench_launch_cpu.py [--cluster out/profile/cluster.yaml] [--steps 8]

Profiles the machine (`planner profile --quick`) unless a cluster file is given, then for a few
layouts of tiny-llama (one process; dp=2 with ZeRO-3; tp=2 with sequence parallelism; pp=2)
plans with those degrees fixed on the profiled cluster, runs the plan with `planner launch
--json`, and prints the prediction (re-estimated for the precision the runtime ran: fp32 on a
CPU) beside the measured median step time. Processes never outnumber the cores the profile ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = [("1 process", 1, []), ("dp2 zero3", 2, ["--dp", "2", "--zero", "3"]),
           ("tp2 sp", 2, ["--tp", "2"]), ("pp2 1f1b", 2, ["--pp", "2"])]


def planner(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="", help="cluster file (default: profile this machine first)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    cluster = args.cluster
    if not cluster:
        r = planner("profile", "--quick", "--out", str(tmp / "profile"))
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
        cluster = str(tmp / "profile" / "cluster.yaml")
    import yaml
    per_node = int(yaml.safe_load(Path(cluster).read_text()).get("gpus_per_node", 1))
    print("| layout | processes | predicted step | measured step (median) | measured / predicted |")
    print("|---|---:|---:|---:|---:|")
    for label, n, extra in LAYOUTS:
        if n > per_node:
            continue
        plan = tmp / f"{label.replace(' ', '-')}.yaml"
        r = planner("plan", "--model", "tiny-llama", "--cluster", cluster, "--gpus", str(n), "--global-batch",
                    str(args.global_batch), "--seq-len", str(args.seq_len), *extra, "--out", str(plan))
        if r.returncode != 0:
            print(f"| {label} | {n} | plan failed: {r.stderr.strip().splitlines()[-1]} | | |")
            continue
        r = planner("launch", str(plan), "--steps", str(args.steps), "--json", "--metrics", str(tmp / "m.jsonl"))
        if r.returncode != 0:
            print(f"| {label} | {n} | launch failed: {r.stderr.strip().splitlines()[-1]} | | |")
            continue
        out = json.loads(r.stdout)
        pred, meas = out["predicted"]["step_time_s"], out["step_time_s"]
        print(f"| {label} | {n} | {pred * 1e3:.1f} ms | {meas * 1e3:.1f} ms | {meas / pred:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
