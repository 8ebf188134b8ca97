"""Execution targets as data (planner/plan/targets.py): every fact has a source, each target refuses
what it cannot run with the numbers and what to change, the search only offers what a target runs,
and the plan file records its target. Pure: no solver, no process."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.specs import MESH_AXES, ParallelConfig, StageSpec, Workload, stages_from_counts
from planner.cli.target_notes import plan_command
from planner.cli.targets_table import FEATURES, table_rows
from planner.plan import targets as T
from planner.plan.planfile import Plan, PlanError, dump_plan, plan_from_dict, plan_to_dict, read_plan
from planner.search.space import enumerate_candidates
from profiles.clusters import load_cluster

import yaml


def _plan(model="llama-3-70b", gpus=64, gb=512, seq=8192, stages=None, order=MESH_AXES, cluster="dgx-h100",
          **par) -> Plan:
    m = get_model(model)
    p = ParallelConfig(**par)
    return Plan(model=m, cluster=load_cluster(cluster).with_gpus(gpus), workload=Workload(global_batch=gb, seq_len=seq),
                parallel=p, stages=stages or stages_from_counts([m.layers // p.pp] * p.pp), mesh_order=order)


# the issue's plan: tp2 pp4 dp4 cp2, ZeRO-2, stages 19/20/21/20, 6 and 2 layers recomputed in the first two
ISSUE = dict(tp=2, pp=4, dp=4, cp=2, zero=2, sp=True, micro_batch=1, grad_accum=128,
             stages=tuple(StageSpec(first_layer=f, num_layers=n, recompute_layers=r)
                          for f, n, r in ((0, 19, 6), (19, 20, 2), (39, 21, 0), (60, 20, 0))))


@pytest.mark.parametrize("name", T.TRAIN_TARGETS + T.LAUNCHERS)
def test_every_fact_in_a_table_has_a_source(name):
    rows = table_rows(name)
    assert len(rows) >= len(FEATURES)
    for feature, value, source in rows:
        if feature == "backend":
            continue
        assert value, (name, feature)
        assert source, f"{name}: {feature} has no source"


def test_serving_tables_have_sources():
    for t in T.SERVE.values():
        for f in dataclasses.fields(t):
            if f.name not in ("name", "summary", "runs", "sources", "mode"):
                assert t.sources.get(f.name), (t.name, f.name)


def test_the_issues_plan_is_refused_by_every_framework_with_the_reason():
    plan = _plan(**ISSUE)
    got = {t: T.problems(t, plan) for t in T.TRAIN_TARGETS + T.LAUNCHERS}
    assert any("ZeRO-2 with pp=4" in m and "plan --zero 1" in m for m in got["megatron"])
    assert any("per-stage recompute [6, 2, 0, 0]" in m for m in got["megatron"])
    assert not any("stage split" in m for m in got["megatron"])          # the layout flag states any split
    assert any("stage split [19, 20, 21, 20]" in m for m in got["deepspeed"])
    assert any("per-stage recompute" in m for m in got["torchtitan"])
    for launcher in ("builtin",) + T.LAUNCHERS:                           # they start the built-in runtime
        assert any(m.startswith(f"{launcher}: cp=2: ") and "plan --cp 1" in m for m in got[launcher]), got[launcher]
    assert all(m.startswith(f"{t}: ") for t, ms in got.items() for m in ms)


def test_a_plan_each_runs_is_accepted():
    even = _plan(tp=8, pp=4, dp=2, zero=1, sp=True, grad_accum=256, recompute="full")
    assert T.problems("megatron", even) == []
    assert T.problems("accelerate", even) == []
    ds = _plan(tp=1, pp=4, dp=16, zero=1, grad_accum=32, recompute="full")
    assert T.problems("deepspeed", ds) == []
    titan = _plan(tp=4, pp=2, dp=8, zero=3, sp=True, grad_accum=64, vpp=2)
    assert T.problems("torchtitan", titan) == []
    assert T.problems("builtin", titan) == []


def test_megatron_block_recompute_is_one_count_on_every_stage():
    block = _plan(tp=8, pp=4, dp=2, sp=True, grad_accum=256, recompute="full", recompute_layers=5,
                  stages=stages_from_counts([19, 21, 21, 19]))
    assert T.problems("megatron", block) == []
    short = _plan(tp=8, pp=4, dp=2, sp=True, grad_accum=256, recompute="full", recompute_layers=20,
                  stages=stages_from_counts([19, 21, 21, 19]))
    assert any("block method" in m for m in T.problems("megatron", short))
    assert any("recomputes every layer or none" in m for m in T.problems("torchtitan", block))
    vpp = _plan(tp=8, pp=4, dp=2, sp=True, grad_accum=256, recompute="full", recompute_layers=3, vpp=2)
    assert any("--recompute-layers 4" in m for m in T.problems("megatron", vpp))


def test_accelerate_picks_its_backend_from_the_degrees():
    fsdp = _plan(model="llama-3-8b", gpus=8, gb=64, dp=8, zero=3, grad_accum=8, recompute="full")
    assert T.problems("accelerate", fsdp) == []
    zero1_full = dataclasses.replace(fsdp, parallel=dataclasses.replace(fsdp.parallel, zero=1))
    assert any("no activation-checkpointing key" in m for m in T.problems("accelerate", zero1_full))
    plugin_none = _plan(model="llama-3-8b", gpus=8, gb=64, tp=2, dp=4, sp=True, grad_accum=16)
    assert any("recompute none" in m for m in T.problems("accelerate", plugin_none))
    last_only = _plan(model="llama-3-8b", gpus=8, gb=64, pp=4, dp=2, grad_accum=32, recompute="full",
                      stages=stages_from_counts([9, 9, 9, 5]))
    assert T.problems("accelerate", last_only) == []
    middle = dataclasses.replace(last_only, stages=stages_from_counts([9, 8, 10, 5]))
    assert any("only the last stage" in m for m in T.problems("accelerate", middle))


def test_builtin_zero1_runs_as_ddp_and_is_accepted_only_where_that_fits():
    tiny = _plan(model="tiny-llama", gpus=4, gb=8, seq=128, cluster="cpu", dp=4, zero=1, grad_accum=1,
                 micro_batch=2)
    assert T.problems("builtin", tiny) == []
    # ZeRO-1 is never planned for builtin: the search offers ZeRO-0 (what runs) instead
    assert "ZeRO-1" in T.config_problems("builtin", tiny.model, tiny.workload, tiny.parallel)[0]
    big = _plan(gpus=64, tp=8, dp=8, zero=1, sp=True, grad_accum=64)
    got = T.problems("builtin", big)
    assert len(got) == 1 and "ZeRO-1 runs as DDP" in got[0] and "GiB" in got[0]


def test_models_a_target_does_not_run():
    moe = _plan(model="mixtral-8x7b", gpus=32, gb=256, seq=4096, dp=32, ep=8, zero=2, grad_accum=8)
    # torchtitan 0.3 trains MoE only in its own model families (deepseek_v3, qwen3, gpt_oss): not Mixtral
    assert any("ships mixture-of-experts model code for deepseek_v3, gpt_oss, qwen3 only" in m
               for m in T.problems("torchtitan", moe))
    assert T.problems("megatron", moe) == []
    ds = _plan(model="deepseek-v3", gpus=2048, gb=4096, seq=4096, tp=4, pp=32, dp=16, ep=2, sp=True, grad_accum=256,
               stages=stages_from_counts([2] * 29 + [1, 1, 1]))
    assert any("multi-latent attention" in m for m in T.problems("builtin", ds))
    tp_over_kv = _plan(model="tiny-llama", gpus=8, gb=8, seq=128, cluster="cpu", tp=8, grad_accum=8)
    assert tp_over_kv.model.kv_heads < 8
    assert any("KV heads" in m for m in T.problems("megatron", tp_over_kv))


@pytest.mark.parametrize("target", T.TRAIN_TARGETS)
def test_the_search_offers_only_what_the_target_runs(target):
    m = get_model("llama-3-8b")
    c = load_cluster("dgx-h100").with_gpus(16)
    wl = Workload(global_batch=64, seq_len=8192)
    cands = enumerate_candidates(m, c, wl, {}, 16, target=target)
    assert cands
    for cand in cands:
        assert T.config_problems(target, m, wl, cand.par, cand.order) == [], cand.par
        split, per_stage, least = T.split_rule(target, cand.par)
        if split == "partition":         # DeepSpeed places the layers: one candidate per method's split
            assert (cand.split, cand.counts) == (("fixed", cand.counts) if cand.par.pp > 1 else ("any", ()))
            if cand.par.pp > 1:
                method = dict(cand.switches)["partition_method"]
                assert T.ds_split(m, cand.par.pp, method) == cand.counts
            split = cand.split
        assert cand.split == split and cand.least_layers == least
        assert cand.stage_recompute == per_stage or (cand.uniform_recompute and cand.par.pp == 1)


def test_the_generic_space_is_unchanged_by_targets():
    m = get_model("llama-3-70b")
    c = load_cluster("dgx-h100").with_gpus(64)
    wl = Workload(global_batch=512, seq_len=8192)
    assert len(enumerate_candidates(m, c, wl, {}, 64)) == len(enumerate_candidates(m, c, wl, {}, 64,
                                                                                  target=T.GENERIC)) == 4544


def test_targets_widen_the_space_where_their_defaults_do_not_run():
    m = get_model("llama-3-70b")
    c = load_cluster("dgx-h100").with_gpus(64)
    wl = Workload(global_batch=512, seq_len=8192)
    ds = enumerate_candidates(m, c, wl, {}, 64, target="deepspeed")
    assert any(x.par.tp > 1 and not x.par.sp for x in ds)          # DeepSpeed: TP without SP
    # DeepSpeed places the layers itself: each pipelined candidate holds one partition method's split
    piped = [x for x in ds if x.par.pp > 1]
    assert piped and all(x.split == "fixed" and T.ds_split(m, x.par.pp, dict(x.switches)["partition_method"])
                         == x.counts for x in piped)
    assert {dict(x.switches)["partition_method"] for x in piped} == set(T.DS_METHODS)
    mg = enumerate_candidates(m, c, wl, {}, 64, target="megatron")
    ns = {x.par.recompute_layers for x in mg if x.par.recompute == "full" and x.par.pp == 4}
    assert set(range(1, 20)) <= ns and 20 not in ns               # uniform N below layers / pp
    assert all(x.par.recompute_layers % x.par.vpp == 0 for x in mg if x.par.recompute_layers > 0)
    bi = enumerate_candidates(m, c, wl, {}, 64, target="builtin")
    assert {x.par.zero for x in bi if x.par.dp > 1} <= {0, 2, 3} and any(x.par.zero == 0 for x in bi)


def test_plan_file_records_the_target_and_reads_old_files(tmp_path):
    plan = _plan(model="tiny-llama", gpus=4, gb=8, seq=128, cluster="cpu", dp=4, zero=2, grad_accum=1, micro_batch=2)
    with_target = plan.replace(target="torchtitan")
    d = plan_to_dict(with_target)
    assert list(d)[:3] == ["schema", "mode", "target"] and d["target"] == "torchtitan"
    assert plan_from_dict(yaml.safe_load(dump_plan(with_target))).target == "torchtitan"
    old = plan_to_dict(plan)
    assert "target" not in old and plan_from_dict(old).target == ""          # files from before targets
    bad = dict(d, target="horovod")
    with pytest.raises(PlanError, match="unknown train target 'horovod'"):
        plan_from_dict(bad, "p.yaml")
    serve_target = dict(d, target="vllm")
    with pytest.raises(PlanError, match="train target 'vllm'"):
        plan_from_dict(serve_target, "p.yaml")


def test_plan_command_names_the_problem(tmp_path):
    plan = _plan(**ISSUE).replace(provenance={"cluster_source": "catalog"})
    cmd = plan_command(plan, "megatron")
    assert cmd == ("planner plan --model llama-3-70b --cluster dgx-h100 --gpus 64 --global-batch 512 --seq-len 8192 "
                   "--target megatron")
    assert plan_command(plan, "torchrun").endswith("--target builtin")
    fp32 = plan.replace(workload=dataclasses.replace(plan.workload, dtype="fp32", optimizer="sgd"))
    assert plan_command(fp32, "deepspeed").endswith("--dtype fp32 --optimizer sgd --target deepspeed")
    # a node group of a mixed cluster: the whole cluster file, no --gpus (each group is tried again)
    mixed = plan.replace(cluster=dataclasses.replace(plan.cluster, name="mixed-h100-a100:h100"),
                         provenance={"cluster_source": "plans/clusters/mixed-h100-a100.yaml"})
    cmd = plan_command(mixed, "megatron")
    assert "--cluster plans/clusters/mixed-h100-a100.yaml" in cmd and "--gpus" not in cmd
    # a model that is not the catalog's: read back from the plan itself
    custom = plan.replace(model=dataclasses.replace(plan.model, name="my-model"))
    assert plan_command(custom, "megatron", "p.yaml") == "planner plan --like p.yaml --target megatron"


def test_the_example_plans_name_their_target_and_it_runs_them():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "plans"
    files = sorted(root.glob("*/*.yaml"))
    files = [f for f in files if f.parent.name in T.TRAIN_TARGETS]
    assert len(files) >= 28
    for f in files:
        plan = read_plan(f)
        assert plan.target == f.parent.name, f
        assert T.problems(plan.target, plan) == [], f
    for f in sorted(root.glob("*.yaml")):
        best = read_plan(f)
        assert best.target in T.TRAIN_TARGETS and T.problems(best.target, best) == [], f


@pytest.mark.parametrize("target", T.TRAIN_TARGETS)
def test_the_search_fast_check_agrees_with_the_messages(target):
    """``runs_config`` (the search's yes/no, stops at the first broken rule) against
    ``config_problems`` (every message) on every generic configuration of two problems; and
    ``model_problems`` (asked before enumerating) is a subset of what each configuration hears."""
    for name, gpus, gb, seq in (("llama-3-70b", 64, 512, 8192), ("mixtral-8x7b", 32, 256, 4096),
                                ("deepseek-v3", 256, 1024, 4096)):
        m, c = get_model(name), load_cluster("dgx-h100").with_gpus(gpus)
        wl = Workload(global_batch=gb, seq_len=seq)
        always = T.model_problems(target, m, wl)
        for cand in enumerate_candidates(m, c, wl, {}, gpus)[::7]:
            for order in (cand.order, ("dp", "pp", "cp", "tp")):
                got = T.config_problems(target, m, wl, cand.par, order)
                assert T.runs_config(target, m, wl, cand.par, order) == (not got)
                assert set(always) <= set(got)
