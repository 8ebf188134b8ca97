"""The search's lazy expansion (``bnb._LazyShapes``: an outer shape's candidates are built only
when the branch and bound reaches it) against the eager search it replaces: on every instance
the same candidates are solved in the same order, with the same plans, status and bounds; and
a shape waits in the heap under a bound no larger than any of its groups' bounds."""
from __future__ import annotations

import math
import random

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import Workload
from planner.plan.errors import InfeasibleError
from planner.search import bnb, bounds
from planner.search.problem import Problem
from planner.search.replan import has_shape, world_sizes_upto

pytestmark = pytest.mark.solver     # these tests run the search (CP-SAT)

# (model, cluster, GPUs available, global batch, seq, target, fixed, hint, how many world sizes)
INSTANCES = [
    ("llama-3-8b", "dgx-a100-40gb", 120, 96, 4096, None, {}, None, 8),
    ("llama-3-8b", "dgx-a100-40gb", 120, 96, 4096, "megatron", {}, {"tp": 2, "pp": 2}, 8),
    ("llama-3-8b", "dgx-h100", 248, 256, 8192, "torchtitan", {}, {"tp": 4, "pp": 1}, 6),
    ("llama-3-8b", "dgx-h100", 248, 256, 8192, "deepspeed", {}, None, 6),
    ("llama-3-8b", "dgx-h100", 64, 128, 4096, "accelerate", {}, None, 1),
    ("llama-3-70b", "dgx-h100", 248, 256, 8192, "megatron", {}, {"tp": 8, "pp": 4}, 5),
    ("llama-3-70b", "dgx-h100", 248, 256, 8192, None, {"cp": 1}, {"tp": 8}, 5),
    ("mixtral-8x7b", "dgx-h100", 120, 128, 4096, "megatron", {}, None, 4),
    ("llama-3-70b", "dgx-a100-40gb", 64, 64, 4096, "megatron", {}, None, 1),   # memory-tight
]


def _run(inst, lazy, cutoff=None, top=1):
    name, cl, n, gb, seq, target, fixed, hint, nw = inst
    model, wl = get_model(name), Workload(global_batch=gb, seq_len=seq)
    cluster = load_cluster(cl).with_gpus(n)
    gpn = cluster.gpus_per_node
    worlds = [w for w in world_sizes_upto(cluster, n) if has_shape(model, wl, min(gpn, w), w)][:nw]
    order = []
    real = bnb.cpsat_one

    def spy(prob, cand, *a, **k):
        order.append((cand.par, cand.order, cand.split, cand.counts))
        return real(prob, cand, *a, **k)

    bnb.cpsat_one = spy
    try:
        res = bnb.solve(model, cluster, wl, fixed, gpus=n, worlds=worlds if nw > 1 else None, target=target,
                        hint=hint, cutoff=cutoff, top=top, lazy=lazy)
    except InfeasibleError as e:
        return ("infeasible", str(e)), order
    finally:
        bnb.cpsat_one = real
    return res, order


def _same(a, b):
    assert a.status == b.status
    assert [(s.par, s.cand.order, s.objective, s.stages) for s in a.solutions] == \
        [(s.par, s.cand.order, s.objective, s.stages) for s in b.solutions]
    assert a.objective == b.objective and a.solved == b.solved and a.solved_worlds == b.solved_worlds
    assert a.bound == b.bound or a.status == "CUTOFF"


@pytest.mark.parametrize("inst", INSTANCES, ids=[f"{i[0]}-{i[2]}-{i[5] or 'generic'}-{i[8]}w" for i in INSTANCES])
def test_lazy_solves_what_eager_solves_in_the_same_order(inst):
    eager, e_order = _run(inst, lazy=False)
    lazy, l_order = _run(inst, lazy=True)
    if isinstance(eager, tuple):
        assert lazy == eager                  # the same refusal, word for word
        return
    assert l_order == e_order and len(e_order) >= 1
    _same(lazy, eager)
    assert lazy.candidates <= eager.candidates
    # top-3 and a cutoff just above the best: the same again
    e3, o3 = _run(inst, lazy=False, top=3)
    l3, p3 = _run(inst, lazy=True, top=3)
    assert p3 == o3
    _same(l3, e3)
    cut = eager.objective * 1.02
    ec, oc = _run(inst, lazy=False, cutoff=cut)
    lc, pc = _run(inst, lazy=True, cutoff=cut)
    assert pc == oc
    _same(lc, ec)
    # the optimum as cutoff: the same again (CUTOFF, or a hinted plan that ties it), and a
    # CUTOFF's bound left is still a bound
    ez, oz = _run(inst, lazy=False, cutoff=eager.objective)
    lz, pz = _run(inst, lazy=True, cutoff=eager.objective)
    assert pz == oz
    _same(lz, ez)
    if lz.status == "CUTOFF":
        assert not lz.solutions and lz.bound >= eager.objective * (1 - 1e-9)


def test_the_lazy_search_builds_fewer_candidates_on_a_replan_sized_space():
    inst = ("llama-3-70b", "dgx-h100", 504, 512, 8192, "megatron", {}, {"tp": 8, "pp": 2}, 20)
    eager, e_order = _run(inst, lazy=False)
    lazy, l_order = _run(inst, lazy=True)
    assert l_order == e_order
    _same(lazy, eager)
    assert lazy.candidates * 3 < eager.candidates, (lazy.candidates, eager.candidates)


@pytest.mark.parametrize("seed", range(6))
def test_a_shape_waits_under_each_of_its_groups_bounds(seed):
    """Each part of a shape (one micro-batch) waits under a bound at most the group bound of every
    group it holds (the heap order rests on it), and equal to the least of them somewhere (it
    is not vacuous); less ``_MEMBER_MARGIN``, at most each candidate's weak bound (where the
    hint's parts wait). The parts hold the shape's candidates, in its order."""
    rng = random.Random(seed)
    checked = tight = 0
    while checked <= 10:           # draw until an instance has groups (a target may run none of a model)
        name = rng.choice(["llama-3-8b", "llama-3-70b", "mixtral-8x7b"])
        target = rng.choice([None, "megatron", "torchtitan", "deepspeed", "accelerate"])
        n = rng.choice([64, 128, 256])
        model = get_model(name)
        wl = Workload(global_batch=rng.choice([128, 256, 512]), seq_len=rng.choice([4096, 8192]))
        cluster = load_cluster(rng.choice(["dgx-h100", "dgx-a100-40gb"])).with_gpus(n)
        prob = Problem(model, cluster, wl, "throughput")
        worlds = [w for w in world_sizes_upto(cluster, n) if has_shape(model, wl, min(8, w), w)][:4]
        shp = bnb._LazyShapes(prob, {}, n, worlds, target)
        for si in range(len(shp.shapes)):
            parts = shp.bounds(si)
            whole = shp.groups(si, None)
            if not parts:
                assert not whole
                continue
            in_parts = []
            for mb, pb in parts:
                groups = shp.groups(si, mb)
                in_parts += [k for _, members in groups for k, _ in members]
                gbs = [bounds.group_bound(prob, members) for _, members in groups]
                for gb in gbs:
                    assert pb <= gb, (shp.shapes[si], mb, pb, gb)
                    checked += 1
                # a part the hint matches waits under this less the margin: below each candidate's own bound
                hb = pb * (1 - bnb._MEMBER_MARGIN)
                for _, members in groups:
                    for _, c in members[:8]:
                        assert hb <= bounds.lower_bound(prob, c), (c.par, hb)
                if gbs and pb == min(gbs) and pb > 0:
                    tight += 1
            # the parts hold exactly the shape's candidates, in its order
            assert len(set(in_parts)) == len(in_parts) == sum(len(m) for _, m in whole)
            assert [c for _, m in whole for _, c in m] == [c for mb, _ in parts for _, m in shp.groups(si, mb)
                                                          for _, c in m]
    assert checked > 10 and tight >= 1, (checked, tight)


def test_an_infeasible_lazy_search_names_the_binding_constraint_as_the_eager_one():
    inst = ("llama-3-70b", "dgx-a100-40gb", 16, 16, 8192, "megatron", {}, None, 2)
    eager, _ = _run(inst, lazy=False)
    lazy, _ = _run(inst, lazy=True)
    assert isinstance(eager, tuple) and eager[0] == "infeasible"
    assert lazy == eager
    assert math.isfinite(len(eager[1]))
