"""On a GPU: a model of about 1B parameters (gpt3-1.3b) on one GPU in bf16, measured against
the cost model's prediction. Skipped without a GPU (tests/conftest.py).

The figures are printed for the README; the assertions are the ones that must hold on any
GPU: the run is in bf16 on CUDA, trains (finite, falling loss), reports an MFU in (0, 1), and
its peak memory is within a factor of the prediction (issue 5's goal is 10%; the bound here
is loose until it has been measured on the device).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.plan.planfile import write_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
def test_one_gpu_1b_model_against_prediction(tmp_path):
    import torch

    from costmodel.catalog import get_model
    from costmodel.specs import ParallelConfig, Workload, default_stages
    from costmodel.training import estimate
    from planner.plan.planfile import Plan
    from costmodel.files.clusters import load_cluster

    name = torch.cuda.get_device_name(0)
    cluster = load_cluster("dgx-h200" if "H200" in name else "dgx-h100").with_gpus(1)
    model = get_model("gpt3-1.3b")
    wl = Workload(global_batch=8, seq_len=2048, dtype="bf16", optimizer="adamw")
    par = ParallelConfig(micro_batch=1, grad_accum=8)
    stages = default_stages(model.layers, 1)
    # priced as this project's runtime runs it (the target "builtin"), the runtime the test launches
    est = estimate(model, cluster, wl, par, stages=stages, framework="builtin")
    plan = Plan(model=model, cluster=cluster, workload=wl, parallel=par, stages=stages, estimate=est.to_dict(),
                target="builtin")
    p = tmp_path / "gpt3-1.3b-1gpu.yaml"
    write_plan(plan, p)
    out = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "runtime.train", "--plan", str(p), "--steps", "6", "--device", "cuda",
                        # 1e-4: the default 1e-3 without warm-up spiked the loss at step 4 on an H200 (session 31)
                        "--lr", "1e-4", "--json-out", str(out)], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-4000:]
    s = json.loads(out.read_text())
    pred_mem, pred_t = est.peak_bytes, est.step_time_s
    print(f"{name}: gpt3-1.3b bf16, batch 8 x 2048: step {s['step_time_s']:.3f} s (predicted {pred_t:.3f} s), "
          f"MFU {s['mfu']:.3f} (predicted {est.mfu:.3f}), peak {s['peak_memory_bytes'] / 2**30:.2f} GiB "
          f"(predicted {pred_mem / 2**30:.2f} GiB), losses {[round(x, 3) for x in s['losses']]}")
    assert s["device"] == "cuda" and s["dtype"] == "bf16"
    assert all(math.isfinite(x) for x in s["losses"]) and s["losses"][-1] < s["losses"][0]
    assert 0 < s["mfu"] < 1
    assert 0.5 < s["peak_memory_bytes"] / pred_mem < 1.5
