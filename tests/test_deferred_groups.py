"""The plain search's groups, formed from the space's kinds without writing the candidates out
(``bnb._Deferred``, ``space.candidate_kinds``), against the groups of every written-out
candidate they replace: the same count, the same members at the same indices, and the same
bounds from what the deferred group reads; and the search solves the same candidates in the
same order, with the same result."""
from __future__ import annotations

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import Workload
from planner.plan.errors import InfeasibleError
from planner.search import bnb, bounds, space
from planner.search.problem import Problem

# (model, cluster, GPUs, global batch, seq, target, fixed)
SPACES = [
    ("llama-3-8b", "dgx-h100", 16, 128, 4096, "megatron", {}),
    ("llama-3-8b", "dgx-h100", 16, 128, 4096, None, {}),
    ("llama-3-8b", "dgx-h100", 32, 256, 8192, "torchtitan", {}),
    ("llama-3-8b", "dgx-h100", 16, 128, 4096, "builtin", {}),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, "megatron", {}),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, "accelerate", {}),
    ("llama-3-70b", "dgx-h100", 32, 256, 4096, "megatron-deepspeed", {}),
    ("qwen3-30b-a3b", "dgx-h100", 64, 512, 4096, "megatron", {}),
    ("qwen3-30b-a3b", "dgx-h100", 64, 512, 4096, "deepspeed", {}),
    ("mixtral-8x7b", "dgx-h100", 32, 256, 4096, "megatron", {"ep_overlap": True}),
    ("gpt-oss-120b", "dgx-h100", 64, 256, 4096, "accelerate", {}),
    ("gpt-oss-120b", "dgx-h100", 64, 256, 4096, "torchtitan", {}),
    ("deepseek-v3", "dgx-h100", 256, 512, 4096, "megatron", {}),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, "megatron", {"recompute": "full", "pp": 4}),
]


def _written_out_groups(cands):
    groups: dict = {}
    for k, c in enumerate(cands):
        groups.setdefault((c.world,) + bnb._group_fields(c.par), []).append((k, c))
    return sorted(groups.values(), key=lambda members: members[0][0])


@pytest.mark.parametrize("inst", SPACES, ids=lambda i: f"{i[0]}-{i[2]}-{i[5]}-{len(i[6])}")
def test_deferred_groups_equal_the_written_out_groups(inst):
    name, cl, n, gb, seq, target, fixed = inst
    model, wl, cluster = get_model(name), Workload(global_batch=gb, seq_len=seq), load_cluster(cl).with_gpus(n)
    cands = space.enumerate_candidates(model, cluster, wl, dict(fixed), n, target=target)
    kinds, count = space.candidate_kinds(model, cluster, wl, dict(fixed), n, target=target)
    assert count == len(cands) > 0
    assert [c for k in kinds for c in k.write_out()] == cands
    want = _written_out_groups(cands)
    got = bnb._deferred_groups(kinds)
    assert len(got) == len(want)
    prob = Problem(model, cluster, wl, "throughput", None, framework=bnb.framework_of(target))
    for d, members in zip(got, want):
        assert d.members() == members                       # the same candidates at the same indices
        by_order: dict = {}
        for k, c in members:
            by_order.setdefault(c.order, []).append((k, c))
        # what the group's bound reads of a member: its index, configuration, mesh order, stages
        seen = lambda ms: [(k, c.par, c.order, c.stage_counts, repr(c.par)) for k, c in ms]     # noqa: E731
        assert seen(d.reduced) == seen([members[0]] + [ms[-1] for ms in by_order.values()])
        assert d.vpp == max(c.par.vpp for _, c in members)
        fit: dict = {}
        for k, c in members:
            fit.setdefault((c.par.zero, c.par.dp_shard), (k, c))
        assert d.fit_members() == list(fit.values())
        assert bounds.group_bound(prob, d.reduced, vpp=d.vpp) == bounds.group_bound(prob, members)
        assert bounds.group_may_fit(prob, d.fit_members()) == bounds.group_may_fit(prob, members)


_CPSAT_ONE = bnb.cpsat_one


def _solve(inst, defer, monkeypatch):
    name, cl, n, gb, seq, target, fixed = inst
    model, wl, cluster = get_model(name), Workload(global_batch=gb, seq_len=seq), load_cluster(cl).with_gpus(n)
    order = []
    real = _CPSAT_ONE

    def spy(prob, cand, *a, **k):
        order.append(cand)
        return real(prob, cand, *a, **k)

    monkeypatch.setattr(bnb, "cpsat_one", spy)
    monkeypatch.setattr(bnb, "_DEFER", defer)
    try:
        res = bnb.solve(model, cluster, wl, dict(fixed), gpus=n, target=target, top=2)
    except InfeasibleError as e:
        return ("infeasible", str(e)), order
    return (res.status, res.objective, res.bound, res.candidates, res.solved,
            [(s.cand, s.objective, s.stages) for s in res.solutions]), order


@pytest.mark.solver
@pytest.mark.parametrize("inst", SPACES[::2] + [SPACES[-3]], ids=lambda i: f"{i[0]}-{i[2]}-{i[5]}-{len(i[6])}")
def test_the_deferred_search_solves_what_the_written_out_search_solves(inst, monkeypatch):
    got, got_order = _solve(inst, True, monkeypatch)
    want, want_order = _solve(inst, False, monkeypatch)
    assert got == want
    assert got_order == want_order and (want_order or want[0] == "infeasible")
