"""Fault handling without processes: the permanent-failure flag, which rank an injected failure
hits after a device is excluded, where a replanned plan is written, and the refusals of
``planner launch --on-failure replan``."""
from __future__ import annotations

import argparse

import pytest

from planner.cli.cmd_launch import _check_args, _failed_rank, _injection, _replan_path, add_arguments
from planner.plan.errors import UsageError
from planner.plan.planfile import write_plan
from runtime.errors import RuntimeUsageError
from runtime.local import make_plan
from runtime.train import Failure


def test_permanent_failure_fires_on_every_attempt():
    once = Failure.parse("rank=1,step=5")
    dead = Failure.parse("rank=1,step=5,permanent")
    assert not once.permanent and dead.permanent and dead.rank == 1 and dead.step == 5
    assert Failure.parse("rank=0,step=2,phase=save,permanent") == Failure(rank=0, step=2, phase="save", permanent=True)
    assert [once.active(a) for a in (0, 1, 2)] == [True, False, False]
    assert [dead.active(a) for a in (0, 1, 2)] == [True, True, True]
    with pytest.raises(RuntimeUsageError, match=r"\[,permanent\]"):
        Failure.parse("rank=1,step=5,forever")


def test_an_injected_failure_follows_its_device():
    """``rank=R`` names a device (the rank it has in the first launch). A transient failure hits
    the first launch only; a permanent one every launch that still uses the device, at the rank
    the device has there; none once it is excluded."""
    used = ["0", "1", "2", "3"]
    assert _injection("rank=2,step=5", "2", used, first=True) == "rank=2,step=5"
    assert _injection("rank=2,step=5", "2", used, first=False) == ""
    assert _injection("rank=2,step=5,permanent", "2", used, first=False) == "rank=2,step=5,permanent"
    assert _injection("rank=2,step=5,permanent", "2", ["0", "2", "3"], first=False) == "rank=1,step=5,permanent"
    assert _injection("rank=2,step=5,permanent", "2", ["0", "1", "3"], first=False) == ""
    assert _injection("", None, used, first=True) == ""


def test_the_failed_rank_comes_from_torchrun_root_cause():
    report = ("[0]:\n  time : x\n  rank : 3 (local_rank: 3)\n  exitcode : 1\nRoot Cause (first observed failure):\n"
              "[0]:\n  time : y\n  rank : 2 (local_rank: 2)\n  exitcode : -9 (pid: 1)\n")
    assert _failed_rank(report) == 2
    assert _failed_rank("no report at all") is None


def test_the_replanned_plan_goes_next_to_the_checkpoint_dir(tmp_path):
    assert _replan_path(str(tmp_path / "ck"), 1) == tmp_path / "ck.replan-1.yaml"
    assert _replan_path(str(tmp_path / "ck") + "/", 2) == tmp_path / "ck.replan-2.yaml"


def test_on_failure_replan_refusals(tmp_path):
    p = tmp_path / "dp4.yaml"
    plan = make_plan("tiny-llama", dp=4, zero=3, grad_accum=2)
    write_plan(plan, p)
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    for bad, msg in ((["--on-failure", "replan"], "needs --checkpoint-dir"),
                     (["--on-failure", "replan", "--checkpoint-dir", "d", "--nnodes", "2", "--rdzv-endpoint", "h:1"],
                      "with --nnodes 2 needs --node-rank"),      # several nodes: planner.cli.elastic
                     (["--on-failure", "replan", "--checkpoint-dir", "d", "--dead-after", "0"], "--dead-after must be >= 1"),
                     (["--inject-failure", "rank=1,step=2,sometimes"], r"\[,permanent\]")):
        with pytest.raises(UsageError, match=msg):
            _check_args(ap.parse_args([str(p), *bad]), plan)
    ok = ap.parse_args([str(p), "--on-failure", "replan", "--checkpoint-dir", "d",
                        "--inject-failure", "rank=3,step=2,permanent"])
    assert _check_args(ok, plan)[0] == 4
