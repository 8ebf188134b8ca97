"""How long the serving search takes: ``planner plan --mode infer`` with TTFT and TPOT goals,
continuous batching, aggregated and disaggregated layouts (``--disaggregation auto``), on 8 to 64
H100s, for a dense and a MoE model. Each case runs the command in a fresh process (Python start,
imports, problem loading, candidate scoring, the disaggregated layouts, CP-SAT, the plan); reported:
the command's wall time and its CPU time (user + system: what it costs on an idle core, the
figure to read on a shared machine), and the search's own wall time (``solver.wall_time_s``),
best of ``--repeat`` runs.

    python bench/bench_serving.py [--repeat 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [  # model, gpus, prompt, output, ttft ms, tpot ms
    ("llama-3.1-70b", 8, 1000, 200, 400, 30),
    ("llama-3.1-70b", 16, 1000, 200, 400, 30),
    ("llama-3.1-70b", 32, 2000, 500, 1000, 40),
    ("llama-3.1-70b", 64, 1000, 200, 400, 30),
    ("mixtral-8x7b", 8, 2000, 500, 500, 25),
    ("mixtral-8x7b", 64, 2000, 500, 500, 25),
    ("qwen3-235b-a22b", 64, 2000, 500, 1000, 50),
]


def run_case(model, gpus, P, O, ttft, tpot) -> dict:
    import os
    import resource
    import subprocess
    argv = [sys.executable, "-m", "planner", "plan", "--mode", "infer", "--model", model, "--cluster", "dgx-h100",
            "--gpus", str(gpus), "--prompt-len", str(P), "--output-len", str(O), "--ttft-slo-ms", str(ttft),
            "--tpot-slo-ms", str(tpot), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    d = json.loads(r.stdout)
    comp = d["solver"].get("comparison", {})
    best = lambda k: (comp.get(k) or {}).get("output_tokens_per_s_per_gpu")  # noqa: E731
    return {"model": model, "gpus": gpus, "prompt": P, "output": O, "rc": r.returncode, "wall_s": wall,
            "cpu_s": cpu, "search_s": d["solver"]["wall_time_s"], "candidates": d["solver"]["candidates"],
            "status": d["status"], "aggregated": best("aggregated"), "disaggregated": best("disaggregated")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for case in CASES:
        runs = [run_case(*case) for _ in range(a.repeat)]
        r = min(runs, key=lambda x: x["cpu_s"])
        rows.append(r)
        if not a.json:
            fmt = lambda v: "none" if v is None else f"{v:,.1f}"  # noqa: E731
            print(f"{r['model']:>16} {r['gpus']:>3} GPUs {r['prompt']}/{r['output']}: command {r['wall_s']:.2f} s wall, "
                  f"{r['cpu_s']:.2f} s CPU; search {r['search_s']:.2f} s, "
                  f"{r['candidates']} candidates, {r['status']}; best tok/s/GPU aggregated {fmt(r['aggregated'])}, "
                  f"disaggregated {fmt(r['disaggregated'])}")
    if a.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
