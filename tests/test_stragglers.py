"""Stragglers and asynchronous checkpoints with real processes (CPU, gloo).

A rank made 3x slower (``--inject-failure rank=R,slow=3``) is found and named with its host;
``--on-straggler replan`` saves, excludes its device, replans and resumes with the loss curve of
the uninterrupted run. ``--async-checkpoint`` writes beside training, the manifest last: a crash
after the write but before the commit leaves the previous checkpoint the newest intact one, and
a resume matches the uninterrupted run.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner.plan.planfile import read_plan, write_plan
from runtime.checkpoint import find_intact, read_meta, step_name
from runtime.local import LocalPool, make_plan
from runtime.manifest import MANIFEST, verify
from runtime.stragglers import StragglerWatch
from runtime.train import Failure, Options

ROOT = Path(__file__).resolve().parents[1]


def test_watch_needs_k_steps_in_a_row():
    w = StragglerWatch(["a", "b", "c"], factor=1.5, steps=3)
    assert w.observe(1, [1.0, 1.0, 2.0]) == [] and w.observe(2, [1.0, 1.0, 2.0]) == []
    assert w.observe(3, [1.0, 1.0, 1.2]) == []                 # the run breaks
    assert w.observe(4, [1.0, 1.0, 2.0]) == [] and w.observe(5, [1.0, 1.0, 2.0]) == []
    [s] = w.observe(6, [1.0, 1.0, 2.0])
    assert (s.rank, s.host, s.first_step, s.step, s.steps) == (2, "c", 4, 6, 3) and s.ratio == 2.0
    assert w.observe(7, [1.0, 1.0, 2.0]) == []                 # reported once
    with pytest.raises(ValueError, match="factor must be > 1"):
        StragglerWatch(["a"], factor=1.0)


def test_slow_parser():
    f = Failure.parse("rank=3,slow=2.5,step=4")
    assert (f.rank, f.slow, f.step) == (3, 2.5, 4)
    assert Failure.parse("rank=1,slow=3").step == 1


@pytest.fixture(scope="module")
def pool():
    with LocalPool(4, timeout_s=150) as p:
        yield p


def max_diff(a, b):
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.multiproc
def test_a_slow_rank_is_found_with_its_host(pool):
    plan = make_plan("tiny-llama", optimizer="adamw", dp=4, zero=3, grad_accum=2)
    ref = pool.run(plan, Options(steps=6, quiet=True, straggler_steps=3))
    assert ref["stragglers"] == []
    got = pool.run(plan, Options(steps=6, quiet=True, inject=Failure.parse("rank=1,slow=3"), straggler_steps=3))
    [s] = got["stragglers"]
    assert s["rank"] == 1 and s["host"].startswith(socket.gethostname()) and s["steps"] == 3
    assert s["ratio"] > 2.0 and s["step"] == 3          # found as soon as K=3 steps were slow
    # a slower rank does not change what is computed
    assert max_diff(got["losses"], ref["losses"]) <= 1e-6


@pytest.mark.multiproc
def test_async_checkpoint_commits_after_the_write_and_resumes(pool, tmp_path):
    plan = make_plan("tiny-llama", optimizer="adamw", dp=2, zero=3, grad_accum=4)
    ref = pool.run(plan, Options(steps=8, quiet=True))["losses"]
    ck = tmp_path / "ck"
    os.environ["PLANNER_TEST_ASYNC_SAVE_DELAY_S"] = "1.5"    # the write outlasts a few steps
    try:
        got = pool.run(plan, Options(steps=8, quiet=True, checkpoint_dir=str(ck), checkpoint_every=4,
                                     async_checkpoint=True))
    finally:
        del os.environ["PLANNER_TEST_ASYNC_SAVE_DELAY_S"]
    first = got["checkpoints"][0]
    assert first["async"] and first["step"] == 4
    assert first["committed_after_step"] > 4                  # training went on while it was written
    assert first["stall_s"] < 1.5                             # the job did not wait for the write
    assert got["losses"] == pytest.approx(ref, abs=1e-6)
    for st in (4, 8):
        assert verify(ck / step_name(st)) is None
        m = json.loads((ck / step_name(st) / MANIFEST).read_text())
        assert m["step"] == st
    # resume from step 4 (its own copy): steps 5-8 equal the uninterrupted run
    res = tmp_path / "res"
    res.mkdir()
    import shutil
    shutil.copytree(ck / step_name(4), res / step_name(4))
    again = pool.run(plan, Options(steps=8, quiet=True, checkpoint_dir=str(res), resume=True, async_checkpoint=True))
    assert again["resumed_from_step"] == 4 and max_diff(again["losses"][4:], ref[4:]) <= 1e-6


def planner(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.multiproc
def test_async_crash_before_the_manifest_keeps_the_previous_checkpoint(tmp_path):
    """Rank 1 dies after its async write of step 4 completed, before the commit: no manifest for
    step 4, step 2 is the newest intact checkpoint."""
    plan = make_plan("tiny-llama", optimizer="adamw", dp=2, zero=3, grad_accum=4)
    p = tmp_path / "dp2.yaml"
    write_plan(plan, p)
    ck = tmp_path / "ck"
    r = planner("launch", str(p), "--steps", "6", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                "--async-checkpoint", "--inject-failure", "rank=1,step=4,phase=save",
                "--metrics", str(tmp_path / "m.jsonl"), "--timeout", "150")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "injected failure while saving step 4" in r.stderr
    assert not (ck / step_name(4)).exists() and not (ck / f".tmp-{step_name(4)}" / MANIFEST).exists()
    assert find_intact(ck) == ck / step_name(2) and read_meta(ck / step_name(2))["step"] == 2


@pytest.mark.multiproc
def test_on_straggler_replan_excludes_the_slow_device(pool, tmp_path):
    """4 processes, rank 3 three times slower from step 1 on: found after 2 steps (step 2), the job
    saves step 2, rank 3 leaves; the launcher excludes device 3, replans for the rest and resumes;
    the losses are the uninterrupted run's."""
    plan = make_plan("tiny-llama", optimizer="adamw", dp=4, zero=3, grad_accum=2)
    p = tmp_path / "dp4.yaml"
    write_plan(plan, p)
    ref = pool.run(plan, Options(steps=6, quiet=True))["losses"]
    ck = tmp_path / "ck"
    r = planner("launch", str(p), "--steps", "6", "--json", "--checkpoint-dir", str(ck), "--checkpoint-every", "3",
                "--inject-failure", "rank=3,slow=3,permanent", "--straggler-steps", "2", "--on-straggler", "replan",
                "--on-failure", "replan", "--metrics", str(tmp_path / "m.jsonl"), "--timeout", "200")
    assert r.returncode == 0, r.stderr[-4000:]
    log = (tmp_path / "ck.workers.log").read_text()        # --on-failure replan keeps worker output there
    assert "straggler: rank 3 on" in log and "x the median rank's working time for 2 steps" in log
    assert "rank 3 (device 3) straggled" in r.stderr
    got = json.loads(r.stdout)
    [rp] = got["replans"]
    assert rp["excluded_devices"] == ["3"] and rp["failed_rank"] == 3
    assert rp["resume_from"] == str(ck / step_name(2))
    assert got["world_size"] < 4 and got["resumed_from_step"] == 2 and got["stragglers"] == []
    assert read_plan(tmp_path / "ck.replan-1.yaml").world_size == got["world_size"]
    assert max_diff(got["losses"], ref) <= 1e-4
