"""``planner replan``: the JSON contract, the changes in words, the checkpoint-compatibility rule
and its threshold, the global batch kept, world sizes rounded to one that has a plan, too few
GPUs (exit 1 with the minimum) and bad input (exit 2). Planning only: no torch, no processes
except the CLI runs that check the command end to end.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main
from planner.plan.planfile import read_plan, write_plan
from planner.search.replan import (COMPATIBLE_SLACK, TooFewGpus, changed_cluster, describe_changes, has_shape,
                            layout_unchanged, replan, world_sizes_upto)
from planner.cli.result import plans_from_result
from runtime.local import make_plan

pytestmark = pytest.mark.solver     # these tests run the search (CP-SAT)

ROOT = Path(__file__).resolve().parents[1]
PLAN_70B = ROOT / "plans" / "llama-3-70b-64xh100.yaml"
ENVELOPE = {"status", "plans", "solver", "changes", "checkpoint_compatible"}


def planner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def new_plan(rp):
    return plans_from_result(dataclasses.replace(rp.result, solutions=[rp.solution]), rp.old.model, rp.cluster,
                             rp.workload)[0]


@pytest.fixture(scope="module")
def tp2dp2(tmp_path_factory):
    """The plan of the resume proof: tiny-llama, tp=2 x dp=2 on 4 CPU processes."""
    p = tmp_path_factory.mktemp("plans") / "tp2dp2.yaml"
    write_plan(make_plan("tiny-llama", optimizer="adamw", tp=2, dp=2, zero=3, grad_accum=4), p)
    return p


# --------------------------------------------------------------------------------------
# The command, end to end
# --------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_lose_a_node_json_contract_and_words(tmp_path):
    """70B on 64 H100 loses a node: planner plan's envelope plus the changes and the flag; the
    plan uses at most the 56 GPUs left, keeps the global batch, and the words name every
    degree that changed with its old and new value."""
    out = tmp_path / "new.yaml"
    r = planner("replan", str(PLAN_70B), "--lose-nodes", "1", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert ENVELOPE <= set(d), set(d)
    assert d["status"] == "OPTIMAL" and d["solver"]["status"] == "OPTIMAL"
    assert isinstance(d["checkpoint_compatible"], bool) and isinstance(d["changes"], list)
    assert d["gpus_available"] == 56 and d["plans"][0]["gpus"] == d["gpus_used"] <= 56
    new, old = d["plans"][0]["parallel"], d["old"]["parallel"]
    assert new["dp"] * new["micro_batch"] * new["grad_accum"] == 512       # the global batch is kept
    head = d["changes"][0]
    for k in ("tp", "pp", "dp", "cp", "ep"):
        if old[k] != new[k]:
            assert f"{k} {old[k]} -> {new[k]}" in head, (k, head)
    kept = [k for k in ("tp", "pp") if old[k] == new[k]]
    if kept:
        assert " and ".join(kept) + " unchanged" in head
    for k in ("tp", "pp"):
        if old[k] != new[k]:
            assert f"{k} {old[k]} -> {new[k]}: the checkpoint will be resharded on load" in d["changes"]
    assert d["checkpoint_compatible"] is False or (old["tp"], old["pp"]) == (new["tp"], new["pp"])
    # the new step time against the old, both from this cost model
    assert d["old"]["step_time_s"] > 0 and d["step_time_s"] == pytest.approx(d["plans"][0]["estimate"]["step_time_s"])
    assert d["step_time_ratio"] == pytest.approx(d["step_time_s"] / d["old"]["step_time_s"])
    assert d["bound_s"] <= d["step_time_s"] * (1 + 1e-9)
    # the file written is the plan printed
    plan = read_plan(out)
    assert plan.world_size == d["gpus_used"] and plan.parallel.tp == new["tp"] and plan.parallel.pp == new["pp"]
    assert plan.provenance["replanned_from"] == str(PLAN_70B)


def test_dp_shrinks_with_the_layout_kept_in_words(tmp_path, capsys):
    """tiny-llama dp=4 on 4 processes -> 2: the layout (tp, pp) stays, only dp shrinks, and the
    checkpoint loads as it is; the human output says so. The plan is made with tp 1 and pp 1 fixed
    (the example plan's own split may be pipelined)."""
    plan = tmp_path / "dp4.yaml"
    assert main(["plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "4", "--global-batch", "8",
                 "--seq-len", "128", "--tp", "1", "--pp", "1", "--out", str(plan)]) == 0
    capsys.readouterr()
    rc = main(["replan", str(plan), "--gpus", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "dp 4 -> 2, tp and pp unchanged" in out
    assert "global batch 8 kept" in out
    assert "checkpoint: loads as it is" in out
    assert "step time" in out and "->" in out


@pytest.mark.subprocess
def test_too_few_gpus_exits_1_with_the_minimum():
    """70B (batch 512 x 8192) cannot fit one node of H100s: exit 1, and the minimum (searched
    upward over whole nodes) is a count that does have a plan."""
    r = planner("replan", str(PLAN_70B), "--gpus", "8", "--json")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "INFEASIBLE" and d["gpus_available"] == 8
    m = d["minimum_gpus"]
    assert m is not None and m > 8 and m % 8 == 0
    assert f"the minimum that works is {m} GPUs ({m // 8} nodes of 8): replan with --gpus {m}" in r.stderr
    old = read_plan(PLAN_70B)
    ok = replan(old, changed_cluster(old.cluster, gpus=m))          # the minimum works ...
    assert ok.world <= m
    with pytest.raises(TooFewGpus):                                  # ... and one node fewer does not
        replan(old, changed_cluster(old.cluster, gpus=m - 8))


@pytest.mark.parametrize("argv, message", [
    ([], "say what changed: --gpus N, --lose-nodes K, --add-nodes K or --cluster NEW"),
    (["--gpus", "0"], "--gpus must be >= 1"),
    (["--gpus", "12"], "does not fill whole nodes of 8 GPUs"),
    (["--lose-nodes", "8"], "has only 8 node(s)"),
    (["--add-nodes", "0"], "--add-nodes must be >= 1"),
    (["--gpus", "32", "--max-time", "0"], "--max-time must be > 0"),
    (["--gpus", "32", "--global-batch", "-4"], "--global-batch must be > 0"),
    (["--gpus", "32", "--compatible-within", "-1"], "--compatible-within must be >= 0"),
    (["--lose-nodes", "1", "--group", "a100"], "no node group 'a100'"),
    (["--cluster", "no-such-cluster"], "no-such-cluster"),
])
def test_bad_input_exits_2_in_one_line(argv, message, capsys):
    rc = main(["replan", str(PLAN_70B), *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.subprocess
def test_bad_plan_and_conflicting_flags_exit_2(tmp_path):
    r = planner("replan", str(tmp_path / "missing.yaml"), "--gpus", "8")
    assert r.returncode == 2 and "cannot read plan file" in r.stderr and "Traceback" not in r.stderr
    r = planner("replan", str(PLAN_70B), "--gpus", "32", "--lose-nodes", "1")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


def test_heterogeneous_cluster_needs_a_group(capsys):
    rc = main(["replan", str(ROOT / "plans" / "llama-3-70b-mixed-h100-a100.yaml"), "--lose-nodes", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "say which with --group" in err


# --------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------

def test_the_compatible_layout_wins_only_within_the_threshold(tp2dp2):
    """tp=2 x dp=2 -> 2 processes: keeping tp=2 (dp=1) is slower on the loopback than tp=1 x dp=2
    (by more than 5 %), so the default changes tp and says the checkpoint will be resharded; with
    a threshold wider than the difference the layout is kept and the checkpoint loads as it is."""
    old = read_plan(tp2dp2)
    cluster = changed_cluster(old.cluster, gpus=2)
    rp = replan(old, cluster)
    assert rp.compatible is not None and rp.best_other is not None
    ratio = rp.compatible.objective / rp.best_other.objective
    assert ratio > 1 + COMPATIBLE_SLACK
    assert rp.chosen == "best" and rp.solution.par.tp == 1
    words = describe_changes(old, new_plan(rp))
    assert "tp 2 -> 1: the checkpoint will be resharded on load" in words and words[0].startswith("tp 2 -> 1")
    assert not layout_unchanged(old, new_plan(rp))
    kept = replan(old, cluster, slack=ratio)             # within the threshold: the layout stays
    assert kept.chosen == "compatible" and kept.solution.par.tp == 2 and kept.solution.par.dp == 1
    new = new_plan(kept)
    assert layout_unchanged(old, new)
    assert describe_changes(old, new)[0] == "dp 2 -> 1, tp and pp unchanged"
    assert new.parallel.micro_batch * new.parallel.grad_accum == 8        # more accumulation, same batch
    # the bound covers every plan on <= 2 GPUs: the best one
    assert kept.bound_s <= rp.best_other.objective * (1 + 1e-9)


def test_another_global_batch_is_another_workload(tp2dp2, capsys):
    rc = main(["replan", str(tp2dp2), "--gpus", "2", "--global-batch", "16", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    p = d["plans"][0]["parallel"]
    assert p["dp"] * p["micro_batch"] * p["grad_accum"] == 16
    assert d["checkpoint_compatible"] is False
    assert any("global batch 8 -> 16" in c and "will not resume" in c for c in d["changes"])


def test_a_world_size_without_a_plan_rounds_down():
    """tiny-llama (4 heads, 4 layers, batch 8) on 7 of 8 CPU slots: 7 admits no degrees (dp=7
    does not divide the batch, tp=7 not the heads, pp=7 exceeds the layers), so the plan uses
    fewer, the best of those that do."""
    from costmodel.catalog import get_model
    from costmodel.specs import Workload
    from costmodel.files.clusters import load_cluster
    from planner.search.bnb import solve
    model, wl = get_model("tiny-llama"), Workload(global_batch=8, seq_len=128)
    cluster = load_cluster("cpu").with_gpus(8)
    old = plans_from_result(solve(model, cluster, wl, {}), model, cluster, wl)[0]
    seven = changed_cluster(cluster, gpus=7)
    assert world_sizes_upto(seven, 7) == [7, 6, 5, 4, 3, 2, 1]
    assert not has_shape(model, wl, 7, 7) and has_shape(model, wl, 6, 6)
    rp = replan(old, seven)
    assert rp.world < 7 and wl.global_batch % rp.solution.par.dp == 0
    # nothing on 6 or fewer GPUs beats it (each world size solved alone)
    for w in range(1, 7):
        if has_shape(model, wl, w, w):
            try:
                alone = solve(model, cluster.with_gpus(w), wl, {}).objective
            except Exception:
                continue
            assert rp.solution.objective <= alone * (1 + COMPATIBLE_SLACK) + 1e-12


def test_add_nodes_and_another_cluster(tmp_path, capsys):
    rc = main(["replan", str(PLAN_70B), "--add-nodes", "1", "--json", "--max-time", "60"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["gpus_available"] == 72 and d["plans"][0]["gpus"] <= 72
    assert d["step_time_s"] <= d["old"]["step_time_s"] * (1 + 1e-9)       # more GPUs are never slower
    out = tmp_path / "h200.yaml"
    rc = main(["replan", str(PLAN_70B), "--cluster", "dgx-h200", "--gpus", "64", "--json", "--out", str(out)])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["gpus_available"] == 64
    assert "H200" in read_plan(out).cluster.gpu.name and "H100" in read_plan(PLAN_70B).cluster.gpu.name


def test_changes_in_words_for_the_issue_example():
    """The issue's phrases, from two hand-made plans: dp 64 -> 56 with tp and pp unchanged;
    pp 4 -> 2 with the reshard warning."""
    a = make_plan("tiny-llama", global_batch=448 * 8, tp=2, pp=4, dp=64, grad_accum=56, stages=[1, 1, 1, 1])
    b = make_plan("tiny-llama", global_batch=448 * 8, tp=2, pp=4, dp=56, grad_accum=64, stages=[1, 1, 1, 1])
    words = describe_changes(a, b)
    assert words[0] == "dp 64 -> 56, tp and pp unchanged"
    assert "micro-batch 1 x gradient accumulation 56 -> 1 x 64 per replica" in words
    assert layout_unchanged(a, b)
    c = make_plan("tiny-llama", global_batch=448 * 8, tp=2, pp=2, dp=112, grad_accum=32)
    words = describe_changes(a, c)
    assert words[0] == "pp 4 -> 2, dp 64 -> 112, tp unchanged"
    assert "pp 4 -> 2: the checkpoint will be resharded on load" in words
    assert not layout_unchanged(a, c)


def test_one_search_over_several_world_sizes_equals_the_best_of_each_alone():
    """The replan's free search puts the candidates of every world size into one branch and
    bound (``solve(..., worlds=)``): its optimum must be the least of the world sizes solved
    one by one, and with that optimum as cutoff nothing is returned (status CUTOFF) and the
    bound left is not below it."""
    import math
    from costmodel.catalog import get_model
    from costmodel.specs import Workload
    from planner.plan.errors import InfeasibleError
    from planner.search.replan import sized
    from planner.search.bnb import solve
    from costmodel.files.clusters import load_cluster
    model, wl = get_model("llama-3-8b"), Workload(global_batch=96, seq_len=4096)
    cluster = load_cluster("dgx-a100-40gb").with_gpus(120)          # 15 nodes
    worlds = [w for w in world_sizes_upto(cluster, 120) if has_shape(model, wl, min(8, w), w)][:8]
    assert len(worlds) == 8
    joint = solve(model, cluster, wl, {}, gpus=120, worlds=worlds)
    alone = {}
    for w in worlds:
        try:
            alone[w] = solve(model, sized(cluster, w), wl, {}, gpus=w).objective
        except InfeasibleError:
            alone[w] = math.inf
    best_w = min(alone, key=alone.get)
    assert joint.status == "OPTIMAL"
    assert math.isclose(joint.objective, alone[best_w], rel_tol=1e-9), (joint.objective, alone)
    assert joint.solutions[0].par.world_size == best_w
    assert set(joint.solved_worlds) <= set(worlds) and len(joint.solved_worlds) < len(worlds)
    cut = solve(model, cluster, wl, {}, gpus=120, worlds=worlds, cutoff=joint.objective)
    assert cut.status == "CUTOFF" and not cut.solutions and cut.bound >= joint.objective * (1 - 1e-9)
