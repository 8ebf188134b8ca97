"""The search space's fast path: ``space.with_recompute_layers`` copies a checked configuration
with another Megatron recompute count N instead of checking it again. The candidates must be
exactly those of the checked construction (``dataclasses.replace``, which runs every check)."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, SpecError, Workload
from planner.plan import targets as T
from planner.search import space


def _slow(par: ParallelConfig, n: int) -> ParallelConfig:
    return dataclasses.replace(par, recompute_layers=n)


@pytest.mark.parametrize("model,gpus,gb,seq,target", [
    ("llama-3-70b", 64, 512, 8192, "megatron"),
    ("llama-3-8b", 16, 128, 4096, "megatron"),
    ("mixtral-8x7b", 32, 256, 4096, "megatron"),
    ("llama-3-70b", 64, 512, 8192, "accelerate"),
    ("llama-3-70b", 64, 512, 8192, None),
])
def test_candidates_equal_the_checked_construction(monkeypatch, model, gpus, gb, seq, target):
    m, cl, wl = get_model(model), load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb, seq_len=seq)
    fast = space.enumerate_candidates(m, cl, wl, {}, gpus, target=target)
    monkeypatch.setattr(space, "with_recompute_layers", _slow)
    slow = space.enumerate_candidates(m, cl, wl, {}, gpus, target=target)
    assert fast == slow
    assert [hash(c.par) for c in fast] == [hash(c.par) for c in slow]
    if target == "megatron":
        assert sum(c.par.recompute_layers > 0 for c in fast) > 100      # the fast path ran


def test_a_copy_forgets_what_was_cached_from_the_old_count():
    par = ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=1)
    hash(par)
    new = space.with_recompute_layers(par, 3)
    assert new.recompute_layers == 3 and par.recompute_layers == 1
    assert new == ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=3)
    assert hash(new) == hash(ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=3))


def test_an_invalid_count_is_still_refused():
    par = ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=1)
    with pytest.raises(SpecError):
        space.with_recompute_layers(par, 10**9)


# --- the target enumeration's shortcuts, each against the slow obvious version -----------------

def _slow_target_candidates(m, cl, wl, fixed, gpus, target):
    """A target's candidates the slow obvious way: every choice of ``space._choice_lists`` (every
    schedule ``schedule_choices`` offers), each configuration built with every check, asked of
    the table (``runs``) on its own for each mesh order, dominated ones dropped
    (``prune_dominated``), each MoE execution pair built with every check and asked of the
    table, each split of ``splits_of``."""
    from planner.search import target_space as tg
    out = []
    for shape in space.shapes(m, cl, wl, fixed, gpus):
        tp, cp, pp, dp = shape.tp, shape.cp, shape.pp, shape.dp
        ch = space._choice_lists(m, wl, fixed, tp, cp, pp, dp, target)
        if ch is None:
            continue
        moe_fixed = {k: fixed[k] for k in ("moe_dispatcher", "ep_overlap", "offload_modules") if k in fixed}
        # every candidate carries the selective recompute's modules (the target's set for a mixture of
        # experts on Megatron: targets.selective_modules), read only under selective
        mods = fixed.get("recompute_modules") or T.selective_modules(target, m, wl)
        if mods:
            moe_fixed["recompute_modules"] = mods
        found = []
        for mb in ch.mbs:
            ga = ch.per_replica // mb
            if "grad_accum" in fixed and fixed["grad_accum"] != ga:
                continue
            for ep, etp in ch.experts:
                for zero in ch.zeros:
                    for dp_shard in space._dp_shards(fixed, zero, shape.gpn, tp, cp, dp):
                        for sp in ch.sps:
                            for vpp in space._vpps(m, fixed, pp, ga):
                                scheds = [fixed["schedule"]] if fixed.get("schedule") else \
                                    tg.schedule_choices(target, pp, vpp)
                                for sched in scheds:
                                    for base, rl in ch.policies(vpp):
                                        try:
                                            par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp,
                                                                 zero=zero, dp_shard=dp_shard, sp=sp, vpp=vpp,
                                                                 micro_batch=mb, grad_accum=ga, recompute=base,
                                                                 schedule=sched, recompute_layers=rl, **moe_fixed)
                                        except SpecError:
                                            continue
                                        for order in ch.orders:
                                            if tg.runs(target, m, wl, par, tuple(order)):
                                                found.append(((mb, ep, etp, zero, dp_shard, sp, vpp, sched, base, rl,
                                                               tuple(order)), par))
        kept = tg.prune_dominated(found)
        if m.is_moe and any(par.ep > 1 for _, par in kept):
            kept = [(key, v) for key, par in kept
                    for disp, over in tg.moe_exec_choices(target, m, par, shape.gpn, fixed, shape.rdma, shape.host)
                    for v in [par if (disp, over) == (par.moe_dispatcher, par.ep_overlap) else
                              dataclasses.replace(par, moe_dispatcher=disp, ep_overlap=over)]
                    if v is par or tg.runs(target, m, wl, v, key[-1])]
        out += [space.Candidate(par=par, order=key[-1], stage_counts=shape.stage_counts, **fields)
                for key, par in kept for fields in tg.splits_of(target, par, fixed, m)]
    return out


@pytest.mark.parametrize("model,gpus,gb,seq,target,fixed", [
    ("qwen3-30b-a3b", 64, 512, 4096, "megatron", {}),
    ("deepseek-v3", 256, 512, 4096, "megatron", {}),
    ("mixtral-8x7b", 32, 256, 4096, "megatron", {"ep_overlap": True}),
    ("gpt-oss-120b", 64, 256, 4096, "accelerate", {}),
    ("gpt-oss-120b", 64, 256, 4096, "torchtitan", {}),
    ("qwen3-30b-a3b", 64, 512, 4096, "deepspeed", {}),
    ("llama-3-70b", 64, 512, 8192, "torchtitan", {}),
    ("llama-3-8b", 16, 128, 4096, "builtin", {}),
    ("llama-3-70b", 64, 512, 8192, "megatron", {"recompute": "full"}),
    ("llama-3-8b", 32, 256, 8192, "torchtitan", {"schedule": "gpipe", "pp": 4}),
    ("mixtral-8x7b", 64, 512, 4096, "megatron", {"tp": 2}),
    ("qwen3-30b-a3b", 32, 256, 4096, "megatron", {"recompute": "full", "recompute_layers": 2}),
    ("llama-3-70b", 32, 256, 4096, "megatron-deepspeed", {}),
    ("llama-3-8b", 16, 128, 4096, "accelerate", {"zero": 3}),
])
def test_target_candidates_equal_asking_every_configuration(model, gpus, gb, seq, target, fixed):
    """A target's configurations are enumerated as kinds (``space._Kind``: one per run of
    Megatron's counts N, built once and copied per schedule and policy, ``with_policy``), the
    schedules no table runs are not built (``runnable_schedules``), the rules that read only the
    shape are asked once per shape and those that do not read the mesh order once for every
    order (``ShapeRules.runs_orders``), dominance is decided per kind, an MoE execution pair is
    copied (``with_moe_exec``) and asked once per kind: the candidates are exactly those of
    building every configuration with its checks and asking the table (``runs``) of each."""
    m, cl, wl = get_model(model), load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb, seq_len=seq)
    fast = space.enumerate_candidates(m, cl, wl, dict(fixed), gpus, target=target)
    slow = _slow_target_candidates(m, cl, wl, dict(fixed), gpus, target)
    assert fast and fast == slow
    assert [repr(c) for c in fast] == [repr(c) for c in slow]
    assert [hash(c) for c in fast] == [hash(c) for c in slow]
    if m.is_moe and target == "megatron" and not fixed:        # the MoE execution pairs were searched
        assert any(c.par.ep_overlap for c in fast) and any(c.par.moe_dispatcher == "deepep" for c in fast)


def test_a_moe_execution_copy_equals_the_checked_one():
    par = ParallelConfig(tp=2, pp=4, dp=8, ep=8, vpp=2, recompute="none")
    hash(par)
    for disp in ("", "alltoall", "deepep"):
        for over in (False, True):
            new = space.with_moe_exec(par, disp, over)
            slow = dataclasses.replace(par, moe_dispatcher=disp, ep_overlap=over)
            assert new == slow and hash(new) == hash(slow) and repr(new) == repr(slow)
    with pytest.raises(SpecError):
        space.with_moe_exec(par, "nccl-magic", False)        # an unknown dispatcher is still checked


def test_runnable_schedules_leaves_out_only_what_the_table_refuses():
    from planner.plan import targets as T
    from planner.search import target_space as tg
    m, wl = get_model("llama-3-8b"), Workload(global_batch=64, seq_len=4096)
    for target in ("megatron", "torchtitan", "deepspeed", "accelerate", "builtin", "megatron-deepspeed"):
        for pp, vpp in ((1, 1), (4, 1), (4, 2)):
            kept = tg.runnable_schedules(target, pp, vpp)
            for sched in tg.schedule_choices(target, pp, vpp):
                par = ParallelConfig(tp=1, pp=pp, dp=2, vpp=vpp, grad_accum=8, schedule=sched)
                if sched not in kept:      # dropped only where the table refuses the schedule
                    assert any("schedule" in p for p in T.config_problems(target, m, wl, par)), (target, sched)
    assert "gpipe" not in tg.runnable_schedules("megatron", 4, 1)
    assert "gpipe" in tg.runnable_schedules("torchtitan", 4, 1)


def test_a_refusal_counts_the_same_configurations_from_the_kept_generic_space(monkeypatch):
    """``refusal._generic_space`` keeps the last generic space: a second refusing target
    gets the message a fresh enumeration gives, without enumerating again."""
    from planner.search import refusal
    m, cl, wl = get_model("deepseek-v3"), load_cluster("dgx-h100").with_gpus(64), Workload(global_batch=256,
                                                                                           seq_len=4096)
    refusal._LAST.clear()
    first = refusal.why_no_candidate(m, cl, wl, 64, "builtin", {})
    calls = []
    monkeypatch.setattr(refusal, "candidate_kinds", lambda *a, **k: calls.append(a) or space.candidate_kinds(*a, **k))
    again = refusal.why_no_candidate(m, cl, wl, 64, "builtin", {})
    assert again == first and not calls
    refusal._LAST.clear()
    fresh = refusal.why_no_candidate(m, cl, wl, 64, "builtin", {})
    assert fresh == first and len(calls) == 1
    assert "runs none of the" in first and str(len(space.enumerate_candidates(m, cl, wl, {}, 64))) in first


def test_a_policy_copy_equals_the_checked_one():
    par = ParallelConfig(tp=2, pp=4, dp=2, vpp=2, grad_accum=8)
    hash(par)
    for sched in ("1f1b", "gpipe", "interleaved", "zigzag"):
        for rec in ("none", "selective", "full", "most"):
            for rl in (-1, 0, 2, 10**9, True):
                try:
                    slow = dataclasses.replace(par, schedule=sched, recompute=rec, recompute_layers=rl)
                except SpecError:
                    with pytest.raises(SpecError):           # what the checks refuse is still refused
                        space.with_policy(par, sched, rec, rl)
                    continue
                new = space.with_policy(par, sched, rec, rl)
                assert new == slow and hash(new) == hash(slow) and repr(new) == repr(slow)
    assert space.with_policy(par, "interleaved", "full", 2).recompute_layers == 2
    with pytest.raises(SpecError):
        space.with_policy(par, "1f1b", "none", -1)            # vpp 2 needs the interleaved schedule


def test_a_fast_candidate_equals_the_constructed_one():
    par = ParallelConfig(tp=2, pp=4, dp=2)
    for fields in ({}, {"split": "even", "least_layers": 3}, {"split": "fixed", "counts": (8, 8, 8, 8),
                                                              "switches": (("partition_method", "uniform"),)}):
        new = space._candidate(par, ("dp", "pp", "cp", "tp"), (("h100", 4),), fields)
        slow = space.Candidate(par=par, order=("dp", "pp", "cp", "tp"), stage_counts=(("h100", 4),), **fields)
        assert new == slow and hash(new) == hash(slow) and repr(new) == repr(slow)
    with pytest.raises(TypeError):
        space._candidate(par, ("dp", "pp", "cp", "tp"), (("h100", 4),), {"no_such_field": 1})


def _ds_balanced_slow(weights, parts):
    """partition_balanced's dynamic program as DeepSpeed writes it: tables by items, then runs."""
    n = len(weights)
    if n <= parts:
        return [min(i, n) for i in range(parts + 1)]
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    hi = [[inf] * (parts + 1) for _ in range(n + 1)]
    lo = [[inf] * (parts + 1) for _ in range(n + 1)]
    spread = [[inf] * (parts + 1) for _ in range(n + 1)]
    cut = [[0] * (parts + 1) for _ in range(n + 1)]
    hi[0][0] = 0.0
    spread[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for k in range(i):
                run = prefix[i] - prefix[k]
                top, bottom = max(hi[k][j - 1], run), min(lo[k][j - 1], run)
                if spread[i][j] >= top - bottom:
                    spread[i][j], hi[i][j], lo[i][j], cut[i][j] = top - bottom, top, bottom, k
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(cut[bounds[-1]][j])
    return bounds[::-1]


def test_the_balanced_partition_equals_deepspeeds_table():
    import random

    from planner.plan import targets as T
    rng = random.Random(7)
    for _ in range(150):
        n, parts = rng.randint(1, 30), rng.randint(1, 10)
        kind = rng.random()
        weights = ([float(rng.randint(0, 1)) for _ in range(n)] if kind < 0.4 else
                   [rng.choice([0.0, 1.0, 2.0, 1e9]) for _ in range(n)] if kind < 0.6 else
                   [rng.random() * 10 for _ in range(n)])
        assert T._ds_balanced(weights, parts) == _ds_balanced_slow(weights, parts), (weights, parts)
    for model in ("llama-3-8b", "deepseek-v3"):
        m = get_model(model)
        for pp in (2, 3, 8):
            for method in T.DS_METHODS[1:]:
                w = T.ds_layer_weights(m, method)
                assert T._ds_balanced(w, pp) == _ds_balanced_slow(w, pp)


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed", "megatron-deepspeed", "accelerate",
                                    "builtin"])
def test_the_split_count_is_the_splits_written_out(target):
    """``tg.split_count`` (one, where no table of the target places the layers itself) is the
    number of splits ``splits_of`` writes out, on every configuration of a few spaces."""
    from planner.search import target_space as tg
    for model, gpus, gb in (("llama-3-70b", 64, 512), ("qwen3-30b-a3b", 32, 256), ("llama-3-8b", 16, 128)):
        m, cl, wl = get_model(model), load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb,
                                                                                       seq_len=4096)
        seen = 0
        for c in space.enumerate_candidates(m, cl, wl, {}, gpus, target=target):
            for fixed in ({}, {"recompute_layers": 0}):
                assert tg.split_count(target, c.par, fixed, m) == len(tg.splits_of(target, c.par, fixed, m))
                seen += 1
        assert seen or target == "megatron-deepspeed"
