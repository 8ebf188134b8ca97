"""Every bound the training search prunes with is a bound: at most the true optimum of what it
prunes, on hundreds of random small instances, a third or more of them memory-tight.

The true optimum of a candidate comes from the unpruned enumerator (``exhaustive_one`` over
every stage split, on tables built with no incumbent), never from CP-SAT. Checked per candidate:
``lower_bound`` (``inf`` only when nothing fits: ``_may_fit``), ``strong_bound`` with and without
the makespan bound, ``_memory_bound`` (through ``lower_bound`` under the memory objective); per
group of candidates sharing degrees and micro-batch (the search's ``_group_fields``):
``compute_bound``, ``group_bound`` and ``group_may_fit``; per stage, ``least_recompute`` against
the least ``r`` found by trying every one.

An instance is memory-tight when the best plan among its candidates peaks within 10% of the GPU's
capacity: the GPU's memory is shrunk until the best plan of a roomy run barely fits (that plan
still fits, so it stays the best). ``run_property`` is what the test runs; the note of stop 19
runs it against the ``_may_fit`` of before (``docs/notes/stop-19/bounds.md``).

Candidates come from the generic space (the search's bound for ``--target generic``: stages may
recompute on top of the policy) and, in about half the instances, from a training target's own
space (``enumerate_candidates(..., target=T)``, priced with that target's framework profile, as
``bnb.solve`` does): candidates whose stages run the policy only (every target but builtin),
DeepSpeed's fixed ``partition_method`` splits, torchtitan's op-level selective AC, Megatron's
interleaved stages. Every training target is drawn (``Stats.covered``).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from costmodel.catalog import get_model
from costmodel.specs import ModelSpec, Workload
from costmodel.training import inflight_microbatches
from planner.plan import targets as T
from planner.plan.errors import UsageError
from planner.search import bounds
from planner.search.bnb import _group_fields
from planner.search.exhaustive import exhaustive_one
from planner.search.problem import KIB, Problem, objective_value
from planner.search.space import enumerate_candidates
from costmodel.files.clusters import cluster_from_dict

N_INSTANCES = 500
MAX_MEMBERS = 12          # candidates of a group whose optimum is enumerated (the group's bound needs them all
                          # to be exact; a sample keeps the check valid, only less likely to find a violation)
TOL_REL = 1e-9


def _model(rng: random.Random) -> ModelSpec:
    kind = rng.choice(["tiny", "dense", "dense", "moe", "moe", "moe-mixed"])
    if kind == "tiny":
        return get_model(rng.choice(["tiny-llama", "tiny-moe", "tiny-gpt"]))
    h = rng.choice([128, 256, 512])
    d = dict(name="rand", layers=rng.randint(2, 8), hidden=h, ffn_hidden=h * rng.choice([2, 4]), heads=8,
             kv_heads=rng.choice([2, 4, 8]), vocab=rng.choice([1024, 8192, 32000, 32000]), max_seq_len=4096,
             tied_embeddings=rng.random() < 0.3)
    if kind.startswith("moe"):
        d.update(num_experts=rng.choice([4, 8]), top_k=2)
        if kind == "moe-mixed":
            d["layers"] = max(d["layers"], 3)
            d.update(first_dense_layers=1, moe_layer_freq=rng.choice([1, 2]))
    return ModelSpec(**d)


def _cluster(memory_gib: float, shape: dict):
    def node(base, mem, gpn):
        return {"extends": base, "gpu": {"memory_gib": mem, "reserved_gib": 0.25}, "gpus_per_node": gpn}
    if shape["mixed"]:
        return cluster_from_dict({"name": "mixed", "groups": [
            {"name": "fast", **node("dgx-h100", memory_gib, 2), "nodes": 1},
            {"name": "slow", **node("dgx-a100-40gb", memory_gib * shape["ratio"], 2), "nodes": 1}],
            "inter_node": {"name": "ib", "gb_per_s": 25}})
    d = node(shape["base"], memory_gib, shape["gpn"])
    d["nodes"] = shape["nodes"]
    if shape.get("mesh"):
        # a direct NVLink mesh (an HGX 4-GPU board): a pair moves at a third of the GPU's links
        d["intra_node"] = {"name": "nvlink-mesh", "gb_per_s": 450, "mesh_peers": shape["gpn"] - 1}
    return cluster_from_dict(d, "small")


def _fixed(rng: random.Random, model: ModelSpec, gpus: int) -> dict:
    fixed: dict = {"pp": rng.choice([1, 1, 2, 2, 2]) if gpus > 1 else 1}
    if rng.random() < 0.6:
        fixed["zero"] = rng.choice([1, 2, 3])
    if rng.random() < 0.3:
        fixed["cp"] = 2
    if model.is_moe and rng.random() < 0.6:
        fixed["ep"] = rng.choice([2, 4])
    if rng.random() < 0.3:
        fixed["recompute"] = rng.choice(["none", "selective", "full"])
    return fixed


@dataclass
class Stats:
    instances: int = 0
    tight: int = 0
    candidates: int = 0
    feasible: int = 0
    checks: int = 0
    covered: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    def cover(self, key: str) -> None:
        self.covered[key] = self.covered.get(key, 0) + 1


def _optimum(prob: Problem, cand) -> tuple[float | None, float | None]:
    """(objective, peak bytes) of the candidate's best split by enumeration, or (None, None)."""
    mem_obj = prob.objective == "memory"
    tab = prob.tables(cand, memory_objective=mem_obj)
    out = exhaustive_one(prob, cand, tab, mem_obj)
    assert out.proved
    if out.split is None:
        return None, None
    val, ns, gs = out.split
    peak = objective_value(prob, cand, tab, ns, gs, memory_objective=True) * KIB
    return (val * KIB if mem_obj else val * prob.weight(cand)), peak


def _problem(inst: dict, cluster) -> Problem:
    """The instance's problem on ``cluster``, priced as ``bnb.solve`` prices its target."""
    return Problem(inst["model"], cluster, inst["wl"], inst["objective"], price_per_gpu_hour=2.0,
                   framework=T.framework_of(inst["target"]))


def _instance(seed: int):
    """(problem maker, candidates' group, sampled members, fixed, target) of one random instance, or None."""
    rng = random.Random(seed)
    model = _model(rng)
    shape = {"mixed": rng.random() < 0.12, "ratio": rng.choice([0.5, 1.0, 1.5]),
             "base": rng.choice(["dgx-h100", "dgx-a100-40gb"]), "gpn": rng.choice([2, 4, 8]),
             "nodes": rng.choice([1, 1, 2])}
    wl = Workload(global_batch=rng.choice([4, 8, 16, 32]), seq_len=rng.choice([512, 1024, 2048]))
    # half the instances search a training target's own space (None: the generic search)
    target = rng.choice([None] * len(T.TRAIN_TARGETS) + list(T.TRAIN_TARGETS))
    # the memory objective is the one place _memory_bound prunes: drawn more often for targets,
    # whose stages run the recompute policy as it is (the bound must count what their tables count)
    objective = rng.choices(["throughput", "cost", "memory"], [0.75, 0.1, 0.15] if target is None
                            else [0.5, 0.1, 0.4])[0]
    if target is not None and not T.get(target).heterogeneous:
        shape["mixed"] = False        # it launches one kind of node: solve_target solves each group alone
    # a third of the 4-GPU nodes are direct meshes (LinkSpec.mesh_peers), chosen by the seed so that the
    # random draws above, and so every other instance, stay as they were
    shape["mesh"] = not shape["mixed"] and shape["gpn"] == 4 and seed % 3 == 0
    cluster = _cluster(80.0, shape)
    fixed = _fixed(rng, model, cluster.total_gpus)
    try:
        cands = enumerate_candidates(model, cluster, wl, fixed, cluster.total_gpus, objective, target=target)
    except UsageError:
        return None
    if not cands:
        return None
    groups: dict = {}
    for c in cands:
        groups.setdefault((c.world,) + _group_fields(c.par), []).append((len(groups), c))
    keys = sorted(groups)
    members = groups[keys[rng.randrange(len(keys))]]
    picked = rng.sample(range(len(members)), min(MAX_MEMBERS, len(members)))
    tight = rng.random() < 0.55
    return dict(rng=rng, model=model, shape=shape, wl=wl, objective=objective, fixed=fixed,
                members=members, picked=sorted(picked), tight=tight, target=target)


def _check(prob: Problem, members: list, picked: list[int], st: Stats, seed: int, target: str) -> tuple:
    """Check every bound on one group; return the peak of its best plan and the least peak of
    its members' best plans (None, None if none fits)."""
    mem_obj = prob.objective == "memory"

    def fail(what: str, bound: float, opt) -> None:
        st.failures.append(f"seed {seed}: {what} = {bound!r} > optimum {opt!r}")

    par0 = members[0][1].par
    # the tables round each stage's time, exposed DP and optimizer to integer nanoseconds: the
    # step's rounding is at most half a nanosecond per micro-batch, stage and once-per-step term
    tol_abs = 0.0 if mem_obj else 0.5e-9 * (par0.grad_accum + par0.pp + 2) * prob.weight(members[0][1])

    def above(bound: float, opt: float) -> bool:
        return bound > opt * (1 + TOL_REL) + tol_abs

    opts = []
    for k in picked:
        cand = members[k][1]
        opt, peak = _optimum(prob, cand)
        opts.append((opt, peak, cand))
        par = cand.par
        st.candidates += 1
        st.cover(f"target {target}")
        if cand.split == "fixed":
            st.cover("fixed split")
        if not cand.stage_recompute:
            st.cover("policy-only recompute")
        if par.recompute == "selective" and target == "torchtitan":
            st.cover("torchtitan selective AC")
        st.cover(f"pp{par.pp}")
        st.cover(f"zero{par.zero}")
        if par.cp > 1:
            st.cover("cp>1")
        if par.ep > 1:
            st.cover("moe ep>1")
        if any(g.intra_node.mesh_peers for g in prob.cluster.groups):
            st.cover("mesh node")
        lb = bounds.lower_bound(prob, cand)
        st.checks += 1
        if opt is None:
            continue
        st.feasible += 1
        if lb == math.inf or above(lb, opt):
            fail(f"lower_bound {par}", lb, opt)
            continue
        if not bounds._may_fit(prob, cand, prob.model.moe_layers / prob.model.layers):
            fail(f"_may_fit False {par}", 0.0, opt)
        if par.pp > 1 and not mem_obj:
            for makespan in (False, True):
                sb = bounds.strong_bound(prob, cand, lb, makespan=makespan)
                st.checks += 1
                if above(sb, opt):
                    fail(f"strong_bound(makespan={makespan}) {par}", sb, opt)
    feasible = [(o, p, c) for o, p, c in opts if o is not None]
    group = [m for m in members]
    st.checks += 3
    if not bounds.group_may_fit(prob, group) and feasible:
        fail(f"group_may_fit False {feasible[0][2].par}", 0.0, feasible[0][0])
    if feasible:
        best = min(o for o, _, _ in feasible)
        for name, fn in (("compute_bound", bounds.compute_bound), ("group_bound", bounds.group_bound)):
            b = fn(prob, group)
            if above(b, best):
                fail(f"{name} {group[0][1].par}", b, best)
    _check_least_recompute(prob, opts[0][2], st, seed)
    if not feasible:
        return None, None
    return min(feasible, key=lambda x: x[0])[1], min(p for _, p, _ in feasible)


def _check_least_recompute(prob: Problem, cand, st: Stats, seed: int) -> None:
    """``least_recompute`` is the least r whose peak fits, found by trying every r."""
    par = cand.par
    L = prob.model.layers
    g = prob.groups(cand)[0]
    frac = prob.model.moe_layers / L
    for i in sorted({0, par.pp - 1}):
        sm = prob.stage_model_for(cand, g, i)
        infl = inflight_microbatches(par, i)
        for n in range(max(1, par.vpp), L - (par.pp - 1) * max(1, par.vpp) + 1):
            nd, nm = n * (1 - frac), n * frac
            got = bounds.least_recompute(sm, nd, nm, n, infl)
            slow = next((r for r in range(n + 1)
                         if sm.memory(sm.cost(nd, nm, r), infl)["peak_bytes"] <= sm.capacity_bytes), None)
            st.checks += 1
            if got != slow:
                st.failures.append(f"seed {seed}: least_recompute {par} stage {i} n={n}: {got} != {slow}")


def run_property(n: int = N_INSTANCES, first_seed: int = 0) -> Stats:
    st = Stats()
    seed = first_seed
    while st.instances < n:
        seed += 1
        inst = _instance(seed)
        if inst is None:
            continue
        prob = _problem(inst, _cluster(80.0, inst["shape"]))
        target = inst["target"] or "generic"
        peak, least = _check(prob, inst["members"], inst["picked"], st, seed, target)
        if inst["tight"] and peak is not None:
            # shrink the GPUs until the best plan barely fits: capacity = peak / u, u in [0.9, 1);
            # or, half the time, until the member needing the least memory barely fits (where
            # model states weigh most: what _may_fit prices)
            u = inst["rng"].uniform(0.905, 0.995)
            if inst["rng"].random() < 0.5:
                peak, u = least, inst["rng"].uniform(0.95, 0.999)
            cand = inst["members"][inst["picked"][0]][1]
            cap = prob.stage_model_for(cand, prob.groups(cand)[0], 0).capacity_bytes
            mem = 80.0 * (peak / u) / cap
            shape = dict(inst["shape"], ratio=1.0)     # both groups shrunk alike
            cluster = _cluster(mem, shape)
            prob = _problem(inst, cluster)
            members = [(k, c) for k, c in inst["members"]]
            peak2, _ = _check(prob, members, inst["picked"], st, seed, target)
            cap2 = prob.stage_model_for(cand, prob.groups(cand)[0], 0).capacity_bytes
            if peak2 is not None and peak2 >= 0.9 * cap2:
                st.tight += 1
        st.instances += 1
    return st


def test_every_bound_is_at_most_the_true_optimum():
    st = run_property()
    assert not st.failures, f"{len(st.failures)} bound violations, e.g.\n" + "\n".join(st.failures[:10])
    assert st.instances >= 500
    assert st.tight * 3 >= st.instances, (st.tight, st.instances)
    assert st.feasible >= st.candidates // 3, (st.feasible, st.candidates)
    for key in ("pp1", "pp2", "zero1", "zero2", "zero3", "cp>1", "moe ep>1", "mesh node", "target generic",
                *(f"target {t}" for t in T.TRAIN_TARGETS), "policy-only recompute"):
        assert st.covered.get(key, 0) >= 20, (key, st.covered)
    # DeepSpeed's partition_method splits and torchtitan's per-op SAC are in the space drawn
    for key in ("fixed split", "torchtitan selective AC"):
        assert st.covered.get(key, 0) >= 5, (key, st.covered)
