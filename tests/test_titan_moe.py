"""torchtitan's mixture-of-experts layouts and settings: expert parallel next to tensor parallel (whole
experts over the TP ranks, etp 1), and ``framework.mxfp8_experts`` (the routed experts in torchao's MXFP8).

torchtitan has no expert tensor parallel. Its expert mesh (``torchtitan/distributed/parallel_dims.py``
``build_mesh``: the sparse mesh ``pp, dp_replicate, efsdp, ep`` with ``efsdp = dp_shard*cp*tp/ep``) takes the
expert-parallel ranks from dp_shard x cp x tp, so EP next to TP keeps each expert whole and routes the
sequence-parallel tokens of every TP rank: the cost model's folded layout with etp 1. The table, the search and
the emitter accept that layout and refuse experts split over TP.
"""
from __future__ import annotations

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, Workload, stages_from_counts
from emitters.base import CannotExpress
from emitters import torchtitan as titan
from planner.plan import targets as T
from planner.plan.planfile import Plan
from planner.search import target_space as tg
from planner.search.space import enumerate_candidates

MODEL = "qwen3-30b-a3b"
WL = Workload(global_batch=64, seq_len=4096)


def _par(**kw) -> ParallelConfig:
    base = dict(tp=2, dp=8, ep=8, etp=1, zero=3, sp=True, micro_batch=1, grad_accum=8)
    base.update(kw)
    return ParallelConfig(**base)


def _plan(par: ParallelConfig) -> Plan:
    m = get_model(MODEL)
    return Plan(model=m, cluster=load_cluster("dgx-h100").with_gpus(16), workload=WL, parallel=par,
                stages=stages_from_counts([m.layers]), target="torchtitan")


def test_the_table_takes_whole_experts_over_tp_and_refuses_split_ones():
    m = get_model(MODEL)
    assert T.config_problems("torchtitan", m, WL, _par(), ("pp", "dp", "cp", "tp")) == []
    split = T.config_problems("torchtitan", m, WL, _par(etp=2), ("pp", "dp", "cp", "tp"))
    assert len(split) == 1 and "--etp 1" in split[0], split
    # folded but expert TP above 1 (tp 4, etp 2): torchtitan has no expert TP either
    part = T.config_problems("torchtitan", m, WL, _par(tp=4, dp=4, etp=2), ("pp", "dp", "cp", "tp"))
    assert len(part) == 1 and "--etp 1" in part[0], part
    # Megatron runs both
    assert T.config_problems("megatron", m, WL, _par(etp=2, zero=1), ("pp", "dp", "cp", "tp")) == []
    assert T.config_problems("megatron", m, WL, _par(zero=1), ("pp", "dp", "cp", "tp")) == []


def test_ep_ok_by_expert_tp():
    assert tg.ep_ok("torchtitan", 2, 8, 1)
    assert not tg.ep_ok("torchtitan", 2, 8, 2) and not tg.ep_ok("torchtitan", 2, 8)
    assert tg.ep_ok("torchtitan", 1, 8)
    assert tg.ep_ok("megatron", 2, 8) and tg.ep_ok("megatron", 2, 8, 1)


def test_the_search_offers_torchtitan_folded_experts_only():
    m, c = get_model(MODEL), load_cluster("dgx-h100").with_gpus(16)
    cands = enumerate_candidates(m, c, WL, {}, 16, target="torchtitan")
    with_tp = [x.par for x in cands if x.par.ep > 1 and x.par.tp > 1]
    assert with_tp, "no EP-with-TP candidate for torchtitan"
    assert all(p.etp == 1 for p in with_tp)
    for x in cands:
        assert T.config_problems("torchtitan", m, WL, x.par, x.order) == [], x.par


def test_the_emitter_writes_the_degrees_and_refuses_expert_tp():
    text = titan.config(_plan(_par()))
    assert "tensor_parallel_degree=2," in text and "expert_parallel_degree=8," in text, text[:2000]
    assert "data_parallel_shard_degree=8," in text      # efsdp = 8 * 1 * 2 / 8 = 2 in torchtitan's mesh
    with pytest.raises(CannotExpress, match="etp=1"):
        titan.config(_plan(_par(etp=2)))


def test_mxfp8_experts_setting_runs_where_the_converter_does():
    """``framework.mxfp8_experts``: torchtitan's MXFP8GroupedExpertsConverter quantizes the routed experts of
    a BF16 model on Blackwell; a dense model, an FP8 workload or a Hopper GPU is refused with the reason, and
    the price takes the experts' MXFP8 (``MoeExecution.fp8_experts``)."""
    from planner.cli.target_notes import framework_settings
    from planner.plan.errors import UsageError
    moe_m, dense = get_model(MODEL), get_model("llama-3-8b")
    b200 = load_cluster("dgx-b200").groups[0].gpu
    h100 = load_cluster("dgx-h100").groups[0].gpu
    assert T.mxfp8_experts_problem(moe_m, WL, b200) == ""
    assert "dense" in T.mxfp8_experts_problem(dense, WL, b200)
    import dataclasses
    assert "--dtype bf16" in T.mxfp8_experts_problem(moe_m, dataclasses.replace(WL, dtype="fp8"), b200)
    assert "Blackwell" in T.mxfp8_experts_problem(moe_m, WL, h100)
    probs = T.switch_problems("torchtitan", _par(tp=1, etp=1), {"mxfp8_experts": True}, moe_m, WL, h100)
    assert probs and "framework.mxfp8_experts" in probs[0]
    with pytest.raises(UsageError, match="mxfp8_experts=true"):
        framework_settings(["mxfp8_experts=true"], "torchtitan", {}, (moe_m, WL, h100))
    assert framework_settings(["mxfp8_experts=true"], "torchtitan", {}, (moe_m, WL, b200)) == {"mxfp8_experts": True}
    assert T.profile_for("torchtitan", {"mxfp8_experts": True}).moe.fp8_experts == "mxfp8"
    assert T.profile_for("torchtitan", {}).moe.fp8_experts == ""
    with pytest.raises(UsageError):
        framework_settings(["mxfp8_experts=true"], "megatron", {}, (moe_m, WL, b200))


def test_plan_names_mxfp8_experts_where_it_would_gain(tmp_path, capsys):
    """``planner plan --target torchtitan`` on DeepSeek-V3 (2,048-wide experts) on B200: the best plan without the
    setting gains from it, so the command says so with that price; with the setting, or on H100, nothing is said."""
    from planner.cli import main
    from planner.cli.explain import plan_estimate
    from planner.plan.planfile import read_plan
    problem = ["--model", "deepseek-v3", "--gpus", "256", "--global-batch", "1024", "--seq-len", "4096",
               "--target", "torchtitan", "--max-time", "30"]
    out = tmp_path / "plain.yaml"
    assert main(["plan", *problem, "--cluster", "dgx-b200", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    plain = read_plan(out)
    on = plan_estimate(plain.replace(framework=dict(plain.framework or {}, mxfp8_experts=True))).step_time_s
    assert on < plain.estimate["step_time_s"]
    assert (f"--framework-setting mxfp8_experts=true (torchao's MXFP8 on the routed experts) prices this plan at "
            f"{on:.3f} s a step") in err, err
    assert main(["plan", *problem, "--cluster", "dgx-b200", "--framework-setting", "mxfp8_experts=true"]) == 0
    assert "prices this plan" not in capsys.readouterr().err
    assert main(["plan", *problem, "--cluster", "dgx-h100"]) == 0
    assert "mxfp8_experts" not in capsys.readouterr().err


def test_a_mixture_of_experts_in_mxfp8_is_planned_and_written_with_both_converters():
    """--dtype fp8 --fp8-recipe mxfp8 on B200 for Qwen3-30B-A3B: accepted; the file converts every linear but
    the router's gate (MXFP8LinearConverter over the attention, and a dense or shared FFN where there is one) and
    the routed experts (MXFP8GroupedExpertsConverter); Float8 (rowwise) on a mixture of experts is refused with
    the hint to MXFP8; MLA stays refused."""
    import dataclasses
    from emitters import get
    from planner.plan import targets as T
    from test_emit_support import make_plan
    plan = make_plan("qwen3-30b-a3b", gpus=16, gb=32, seq=4096, cluster="dgx-b200", micro_batch=1, dp=16, ep=8,
                     zero=3, grad_accum=2)
    plan = plan.replace(target="torchtitan", framework={"compile": True},
                        workload=dataclasses.replace(plan.workload, dtype="fp8", fp8_recipe="mxfp8"))
    assert T.problems("torchtitan", plan) == []
    files = get("torchtitan").emit(plan)
    job = next(v for k, v in files.items() if k.endswith(".py"))
    assert "MXFP8LinearConverter.Config(" in job and "fqns=['attention', 'feed_forward', 'shared_experts']" in job
    assert "MXFP8GroupedExpertsConverter.Config(" in job
    rowwise = plan.replace(workload=dataclasses.replace(plan.workload, fp8_recipe="rowwise"))
    (why,) = T.problems("torchtitan", rowwise)
    assert "--fp8-recipe mxfp8 on Blackwell" in why
    dsv3 = make_plan("deepseek-v3", gpus=256, gb=256, seq=4096, cluster="dgx-b200", micro_batch=1, dp=256, ep=64,
                     zero=3, grad_accum=1)
    dsv3 = dsv3.replace(target="torchtitan", workload=dataclasses.replace(dsv3.workload, dtype="fp8",
                                                                          fp8_recipe="mxfp8"))
    assert any("MLA" in w for w in T.problems("torchtitan", dsv3))
