"""`planner launch` runs an inference plan with runtime.serve and reports measured beside predicted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multiproc
def test_launch_serves_an_inference_plan(tmp_path):
    plan = tmp_path / "serve.yaml"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--mode", "infer", "--model", "tiny-llama",
                        "--cluster", "cpu", "--gpus", "2", "--prompt-len", "16", "--output-len", "8", "--batch", "2",
                        "--tp", "2", "--out", str(plan)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "planner", "launch", str(plan), "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["world_size"] == 2 and d["parallel"]["tp"] == 2
    assert len(d["tokens"]) == 2 and all(len(t) == 8 for t in d["tokens"])
    assert d["ttft_s"] > 0 and d["tpot_s"] > 0
    assert d["predicted"]["mode"] == "infer" and d["predicted"]["tpot_s"] > 0


def test_estimate_of_an_inference_plan_uses_the_serving_model(tmp_path):
    plan = tmp_path / "serve.yaml"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--mode", "infer", "--model", "tiny-llama",
                        "--cluster", "cpu", "--gpus", "2", "--prompt-len", "16", "--output-len", "8", "--batch", "2",
                        "--out", str(plan), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)["plans"][0]["estimate"]
    r = subprocess.run([sys.executable, "-m", "planner", "estimate", "--plan", str(plan), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    est = json.loads(r.stdout)["estimate"]
    assert est["ttft_s"] == pytest.approx(planned["ttft_s"]) and est["tpot_s"] == pytest.approx(planned["tpot_s"])


def test_an_inflight_plan_is_predicted_as_the_static_batches_the_runtime_serves(tmp_path):
    from costmodel.inference import estimate_inference
    from planner.plan.planfile import read_plan
    from runtime.serve import predicted
    plan_path = tmp_path / "inflight.yaml"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--mode", "infer", "--model", "tiny-llama",
                        "--cluster", "cpu", "--gpus", "2", "--prompt-len", "16", "--output-len", "8", "--batch", "2",
                        "--out", str(plan_path), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = read_plan(plan_path)
    assert plan.estimate["batching"] == "inflight"
    w = plan.workload
    p = predicted(plan, w.prompt_len, w.output_len, w.global_batch)
    static = estimate_inference(plan.model, plan.cluster, w, plan.parallel, stages=plan.stages)
    assert p["tpot_s"] == pytest.approx(static.tpot_s) and p["prefill_batch_s"] == pytest.approx(static.prefill_s)
