"""A group's bound is at most each member's own bound when the members differ in MoE execution
(dispatcher, EP overlap: ``ParallelConfig.moe_dispatcher`` / ``ep_overlap``, which the Megatron
target searches). ``bounds.compute_bound`` prices one member per mesh order, so a group must
never mix executions that are priced apart (``bnb._GROUP_FIELDS`` holds them)."""
from __future__ import annotations

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import Workload
from planner.plan.targets import framework_of
from planner.search import bnb, bounds
from planner.search.problem import Problem
from planner.search.space import enumerate_candidates


def test_a_group_bound_is_at_most_each_members_bound_across_moe_executions():
    model, wl = get_model("mixtral-8x7b"), Workload(global_batch=128, seq_len=4096)
    cluster = load_cluster("dgx-h100").with_gpus(64)
    cands = enumerate_candidates(model, cluster, wl, {"tp": 2, "pp": 2}, 64, target="megatron")
    prob = Problem(model, cluster, wl, "throughput", framework=framework_of("megatron"))
    execs = {(c.par.moe_dispatcher, c.par.ep_overlap) for c in cands}
    assert len(execs) > 1, execs                 # the target does search more than one execution
    groups: dict = {}
    for i, c in enumerate(cands):
        groups.setdefault((c.world,) + bnb._group_fields(c.par), []).append((i, c))
    checked = 0
    for members in groups.values():
        # in either order of the members (compute_bound keeps one member per mesh order)
        gb = max(bounds.group_bound(prob, members), bounds.group_bound(prob, members[::-1]))
        for _, c in members:
            lb = bounds.lower_bound(prob, c)
            assert gb <= lb * (1 + 1e-12), (c.par, gb, lb)
            checked += 1
    assert checked == len(cands) > 0
