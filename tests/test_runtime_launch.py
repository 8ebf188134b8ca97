"""``planner launch``: torchrun processes on this machine, end to end through the CLI.

* a plan for another world size is refused before any process starts (exit 2, both numbers);
* a run with a rank killed at step 5 and ``--max-restarts 1`` restarts from the checkpoint of
  step 4 and its losses equal the uninterrupted run's within 1e-6 (4 processes, as issue 8 asks);
* a rank killed without restarts: the job stops, exit 1, the message names the rank and the
  last complete checkpoint, which loads;
* the ``--json`` contract keys.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.plan.planfile import write_plan
from runtime.local import make_plan

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]
JSON_KEYS = {"losses", "steps", "step_time_s", "tokens_per_s", "peak_memory_bytes", "peak_memory_bytes_per_rank",
             "mfu", "predicted", "world_size", "device", "metrics_file"}


def planner(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        e.pop(k, None)
    e.update(env or {})
    e["PYTHONPATH"] = str(ROOT)
    e.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=e,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def plan_dp4(tmp_path_factory):
    p = tmp_path_factory.mktemp("plans") / "dp4.yaml"
    write_plan(make_plan("tiny-llama", optimizer="adamw", dp=4, zero=3, grad_accum=2), p)
    return p


def test_world_size_mismatch_is_refused_before_starting(plan_dp4, tmp_path):
    t0 = time.perf_counter()
    r = planner("launch", str(plan_dp4), "--nproc-per-node", "3", "--metrics", str(tmp_path / "m.jsonl"))
    assert r.returncode == 2, r.stderr
    assert "needs 4 processes" in r.stderr and "= 3" in r.stderr
    assert "Traceback" not in r.stderr
    assert "torch.distributed.run" not in r.stderr and not (tmp_path / "m.jsonl").exists()
    assert time.perf_counter() - t0 < 30


def test_world_size_mismatch_inside_torchrun_is_refused(plan_dp4):
    r = planner("launch", str(plan_dp4), env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert r.returncode == 2
    assert "needs 4 processes" in r.stderr and "WORLD_SIZE 2" in r.stderr


def test_bad_plan_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: 1\nmodel: {name: x}\n")
    r = planner("launch", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "missing section" in r.stderr


@pytest.mark.multiproc
def test_crash_and_elastic_restart_match_the_uninterrupted_run(plan_dp4, tmp_path):
    """Issue 8's proof: 4 processes, rank 2 killed at step 5, a checkpoint every 2 steps,
    ``--max-restarts 1``: the job resumes from step 4 and every loss equals the uninterrupted
    run's within 1e-6. The uninterrupted run is the same plan and code in a local pool."""
    from planner.plan.planfile import read_plan
    from runtime.local import LocalPool
    from runtime.train import Options
    with LocalPool(4) as pool:
        ref = pool.run(read_plan(plan_dp4), Options(steps=6, quiet=True))["losses"]

    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    r = planner("launch", str(plan_dp4), "--steps", "6", "--json", "--checkpoint-dir", str(ck),
                "--checkpoint-every", "2", "--inject-failure", "rank=2,step=5", "--max-restarts", "1",
                "--metrics", str(metrics))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 2: injected failure at step 5" in r.stderr
    got = json.loads(r.stdout)
    assert JSON_KEYS <= set(got), set(got)
    assert got["restart_count"] == 1 and got["resumed_from_step"] == 4 and got["last_checkpoint_step"] == 6
    assert got["steps"] == [1, 2, 3, 4, 5, 6] and got["world_size"] == 4 and got["device"] == "cpu"
    assert got["predicted"] == {} and got["step_time_s"] > 0 and got["tokens_per_s"] > 0
    assert len(got["peak_memory_bytes_per_rank"]) == 4 and got["peak_memory_bytes"] > 0
    diff = max(abs(a - b) for a, b in zip(got["losses"], ref))
    print(f"restart: max |loss diff| over 6 steps = {diff:.2e}")
    assert diff <= 1e-6, (got["losses"], ref)
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    steps = [x["step"] for x in lines if "step" in x]
    assert steps[:4] == [1, 2, 3, 4] and steps[-2:] == [5, 6]     # both attempts, one file
    assert "summary" in lines[-1] and lines[-1]["summary"]["losses"] == got["losses"]


@pytest.mark.multiproc
def test_crash_without_restarts_names_the_rank_and_keeps_the_checkpoint(tmp_path):
    from runtime.checkpoint import find_latest, read_meta
    p = tmp_path / "dp2.yaml"
    write_plan(make_plan("tiny-llama", optimizer="adamw", dp=2, zero=3, grad_accum=4), p)
    ck = tmp_path / "ck"
    t0 = time.perf_counter()
    r = planner("launch", str(p), "--steps", "6", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                "--inject-failure", "rank=1,step=3", "--metrics", str(tmp_path / "m.jsonl"), timeout=120)
    wall = time.perf_counter() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("planner launch: error: rank 1 failed"), last
    assert "SIGKILL" in last and "step-00000002" in last
    assert wall < 60, f"the surviving rank was not stopped promptly ({wall:.0f} s)"
    latest = find_latest(ck)
    assert latest is not None and read_meta(latest)["step"] == 2
