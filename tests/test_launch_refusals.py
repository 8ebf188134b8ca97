"""`planner launch` refuses, before starting any process, what the built-in runtime cannot run here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]


def planner(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_a_gpu_cluster_plan_is_not_started_as_64_cpu_processes():
    r = planner("launch", "plans/llama-3-70b-64xh100.yaml", "--steps", "1", "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert "needs 64 processes" in r.stderr and "H100" in r.stderr and "runtime: rank" not in r.stderr


def test_context_parallel_is_refused_before_launch(tmp_path):
    plan = tmp_path / "cp.yaml"
    r = planner("plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "4", "--global-batch", "8",
                "--seq-len", "512", "--cp", "2", "--out", str(plan))
    assert r.returncode == 0, r.stderr
    r = planner("launch", str(plan), "--steps", "1")
    assert r.returncode == 2
    assert "context parallel is not supported" in r.stderr and "runtime: rank" not in r.stderr
