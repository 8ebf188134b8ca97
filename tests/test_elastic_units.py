"""The pieces of multi-node recovery that need no processes: ``--dead-after`` parsing, the
round decision rank 0 makes (``planner.cli.elastic.decide``: the plan for the nodes present, the
ranks that take part, the attempt, resume), and ``planner launch``'s refusals of bad
resilience flags (exit 2, before anything starts)."""
from __future__ import annotations

import json

import pytest

from planner.cli import elastic, main
from planner.plan.errors import UsageError
from planner.plan.planfile import read_plan, write_plan
from runtime.local import make_plan


def test_dead_after_counts_and_seconds():
    assert elastic.parse_dead_after("2") == (2, None)
    assert elastic.parse_dead_after("30s") == (2, 30.0)
    assert elastic.parse_dead_after("3,7.5s") == (3, 7.5)
    for bad in ("0", "3x", "0s", "s"):
        with pytest.raises(UsageError):
            elastic.parse_dead_after(bad)


def _session(tmp_path, plan):
    p = tmp_path / "plan.yaml"
    write_plan(plan, p)
    import argparse
    args = argparse.Namespace(checkpoint_dir=str(tmp_path / "ck"), plan=str(p), resume=False)
    return elastic.start_session(args), p


def _plan3x2():
    from costmodel.files.clusters import cluster_from_dict
    cluster = cluster_from_dict({"name": "cpu-3x2", "extends": "cpu", "gpus_per_node": 2, "nodes": 3})
    return make_plan("tiny-llama", optimizer="adamw", global_batch=12, tp=2, dp=3, grad_accum=4, cluster=cluster)


@pytest.mark.solver
def test_decide_keeps_the_plan_then_replans_for_the_nodes_left(tmp_path):
    sess, p = _session(tmp_path, _plan3x2())
    nodes = ["h/a", "h/a", "h/b", "h/b", "h/c", "h/c"]
    d = elastic.decide(str(sess), nodes, 2)
    assert d["plan"] == str(p.resolve()) and d["active"] == list(range(6))
    assert (d["attempt"], d["resume"], d["change"]) == (0, False, None)
    # node b is gone: rank 0 replans for a, c (4 ranks) and writes the plan next to the checkpoints
    d = elastic.decide(str(sess), ["h/a", "h/a", "h/c", "h/c"], 2)
    assert d["attempt"] == 1 and d["resume"] is True and d["active"] == [0, 1, 2, 3]
    c = d["change"]
    assert c["lost_nodes"] == ["h/b"] and c["nodes"] == ["h/a", "h/c"] and c["world_size"] == 4
    assert d["plan"] == c["plan"] == str(tmp_path / "ck.replan-1.yaml")
    new = read_plan(c["plan"])
    assert new.world_size == 4 and new.cluster.nodes == 2 and new.provenance["lost_nodes"] == ["h/b"]
    assert any("global batch 12 kept" in x for x in c["changes"])
    s = json.loads(sess.read_text())
    assert [a["nodes"] for a in s["attempts"]] == [["h/a", "h/b", "h/c"], ["h/a", "h/c"]]
    assert s["current"] == c["plan"] and len(s["replans"]) == 1
    # the same two nodes again: no new plan
    d = elastic.decide(str(sess), ["h/a", "h/a", "h/c", "h/c"], 2)
    assert d["change"] is None and d["plan"] == c["plan"] and d["attempt"] == 2


@pytest.mark.solver
def test_decide_leaves_an_excluded_node_out(tmp_path):
    sess, _ = _session(tmp_path, _plan3x2())
    s = json.loads(sess.read_text())
    s["excluded_nodes"] = ["h/a"]          # a straggler's node, recorded by rank 0
    sess.write_text(json.dumps(s))
    d = elastic.decide(str(sess), ["h/a", "h/a", "h/b", "h/b", "h/c", "h/c"], 2)
    assert d["active"] == [2, 3, 4, 5] and d["change"]["excluded_nodes"] == ["h/a"]
    assert read_plan(d["plan"]).world_size == 4


def test_launch_refuses_bad_resilience_flags(tmp_path, capsys):
    p = tmp_path / "p.yaml"
    write_plan(make_plan("tiny-llama", dp=2, grad_accum=4), p)
    cases = [
        (["--on-straggler", "replan"], "--on-straggler replan needs --on-failure replan"),
        (["--dead-after", "3x"], "--dead-after '3x': expected N (failures), Ts"),
        (["--straggler-factor", "1"], "--straggler-factor must be > 1, got 1"),
        (["--inject-failure", "rank=1,slow=0.5"], "--inject-failure 'rank=1,slow=0.5': expected"),
        (["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29400", "--checkpoint-dir", str(tmp_path / "c"),
          "--on-failure", "replan"], "needs --node-rank"),
    ]
    for extra, want in cases:
        code = main(["launch", str(p), "--device", "cpu", *extra])
        err = capsys.readouterr().err
        assert code == 2 and want in err, (extra, err)
