"""Exact memory accounting: every simulated rank's shards against the cost model's per-rank count.

One process, torch's ``"fake"`` process-group backend, the meta device
(``python -m runtime.dryrun``): the runtime builds the shards a rank of a 64-rank llama-3-70b
plan (tp=8, pp=2, dp=4, ZeRO-3, sequence parallel) would hold, with the same parallel pass as
a real run, and counts their elements. After TP (before ZeRO) each rank must hold exactly
``costmodel.memory.stage_param_counts``; the FSDP shards of one data-parallel group must add
up to it exactly, each rank holding its 1/dp_shard.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.plan.planfile import write_plan
from costmodel.files.clusters import load_cluster
from runtime.local import make_plan

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]


def expected_counts(plan, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) elements per GPU of a stage after TP/EP, before ZeRO."""
    try:
        from costmodel.memory import stage_param_counts
    except ImportError:     # the cost model's function; the same rule from ModelSpec's methods
        stage_param_counts = None
    if stage_param_counts is not None:
        return stage_param_counts(plan.model, plan.parallel, stage, plan.stages)
    m, p, st = plan.model, plan.parallel, plan.stages[stage]
    dense = expert = 0.0
    for i in range(st.first_layer, st.last_layer):
        routed = m.num_experts * m.expert_params() if m.is_moe_layer(i) else 0
        expert += routed / (p.ep * p.tp)
        dense += (m.layer_params(i) - routed - 2 * m.norm_params()) / p.tp + 2 * m.norm_params()
    if stage == 0:
        dense += m.embedding_params() / p.tp
    if stage == len(plan.stages) - 1:
        tied_here = m.tied_embeddings and len(plan.stages) == 1
        dense += (0 if tied_here else m.vocab * m.hidden / p.tp) + m.norm_params()
    return dense, expert


def dryrun(plan_path: Path, ranks: list[int]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "runtime.dryrun", "--plan", str(plan_path), "--json",
                        "--ranks", ",".join(map(str, ranks))], capture_output=True, text=True, env=env,
                       timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def plan70(tmp_path_factory):
    plan = make_plan("llama-3-70b", global_batch=32, seq_len=4096, tp=8, pp=2, dp=4, zero=3, sp=True,
                     grad_accum=8, recompute="full", cluster=load_cluster("dgx-h100").with_gpus(64))
    p = tmp_path_factory.mktemp("plans") / "llama70b-64.yaml"
    write_plan(plan, p)
    return plan, p


def test_llama_70b_on_64_ranks_matches_the_cost_model_exactly(plan70):
    plan, path = plan70
    assert plan.world_size == 64
    # mesh order pp, dp, cp, tp: rank = pp*32 + dp*8 + tp. One data-parallel group per stage:
    # tp coordinate 0 on the first stage, 7 on the last (rank 63 among them).
    groups = {0: [0, 8, 16, 24], 1: [39, 47, 55, 63]}
    out = {r["rank"]: r for r in dryrun(path, sorted(sum(groups.values(), [])))}
    for stage, ranks in groups.items():
        dense, expert = expected_counts(plan, stage)
        assert expert == 0
        for r in ranks:
            got = out[r]
            assert got["pp_rank"] == stage
            assert got["dense_params"] == dense, (r, got["dense_params"], dense)
            assert got["expert_params"] == 0
        # FSDP shards of one data-parallel group: nothing lost, nothing doubled, 1/dp each
        locals_ = [out[r]["dense_local"] for r in ranks]
        assert sum(locals_) == dense
        assert max(locals_) - min(locals_) <= 8192 * 8      # at most a row of each uneven matrix
        for r in ranks:
            got = out[r]
            assert got["param_bytes"] == 4 * got["dense_local"]
            assert got["grad_bytes"] == 4 * got["dense_local"]          # fp32 grads, sharded (ZeRO-3)
            assert got["optimizer_bytes"] == 8 * got["dense_local"]     # AdamW exp_avg + exp_avg_sq


def test_moe_experts_shard_over_ep_and_tp(tmp_path):
    """mixtral-8x7b, tp=2 x ep=4 (inside dp=8) x pp=2: routed experts per rank are exactly the
    cost model's ``experts / (ep * tp)``. The runtime keeps each MoE layer's router whole on every
    TP rank (as Megatron-LM does); the cost model (today) splits it over TP, a difference of
    ``hidden * experts * (1 - 1/tp)`` elements per layer, which this test pins."""
    plan = make_plan("mixtral-8x7b", global_batch=32, seq_len=4096, tp=2, pp=2, dp=8, ep=4, zero=3, sp=True,
                     grad_accum=4, cluster=load_cluster("dgx-h100").with_gpus(32))
    path = tmp_path / "mixtral.yaml"
    write_plan(plan, path)
    out = {r["rank"]: r for r in dryrun(path, [0, 31])}
    m, tp = plan.model, plan.parallel.tp
    for rank, stage in ((0, 0), (31, 1)):
        dense_cm, expert_cm = expected_counts(plan, stage)
        got = out[rank]
        assert got["expert_params"] == expert_cm
        st = plan.stages[stage]
        # the runtime's own rule: attention and norms as a dense layer, router whole, experts / (ep*tp)
        dense = sum((m.attention_params() / tp + 2 * m.norm_params() + m.hidden * m.num_experts)
                    for _ in range(st.first_layer, st.last_layer))
        dense += m.embedding_params() / tp if stage == 0 else m.vocab * m.hidden / tp + m.norm_params()
        assert got["dense_params"] == dense
        assert dense_cm == dense   # the cost model keeps the router whole on every TP rank too
        # experts are FSDP-sharded over dp / ep = 2 ranks
        assert got["expert_local"] * 2 == got["expert_params"]


def test_dense_first_layer_and_shared_expert_shards_match_the_cost_model(tmp_path):
    """A mixed model (layer 0 dense, layers 1-3 MoE with a shared expert), tp=2 x ep=2 x pp=2: each
    stage's dense and routed-expert elements per rank equal the cost model's stage counts (the
    dense-only first stage holds no experts)."""
    plan = make_plan("tiny-moe-dense1", global_batch=8, seq_len=64, tp=2, pp=2, dp=2, ep=2, zero=1, sp=True,
                     grad_accum=4, stages=[1, 3], cluster=load_cluster("cpu").with_gpus(8))
    path = tmp_path / "mixed.yaml"
    write_plan(plan, path)
    out = {r["rank"]: r for r in dryrun(path, [0, 7])}
    for rank, stage in ((0, 0), (7, 1)):
        dense, expert = expected_counts(plan, stage)
        got = out[rank]
        assert got["pp_rank"] == stage
        assert got["dense_params"] == dense, (rank, got["dense_params"], dense)
        assert got["expert_params"] == expert, (rank, got["expert_params"], expert)
    assert expected_counts(plan, 0)[1] == 0 and expected_counts(plan, 1)[1] > 0


def test_dryrun_refuses_a_rank_outside_the_plan(plan70):
    _, path = plan70
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "runtime.dryrun", "--plan", str(path), "--ranks", "64"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "0..63" in r.stderr and "Traceback" not in r.stderr
