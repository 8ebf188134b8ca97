"""torchtitan Float8 (torchao) as a plan setting: accepted and priced by the torchtitan target,
refused with the binding reason where torchtitan 0.3.0 cannot run it as priced.

The round trip (the written job parsed back by torchtitan's ConfigManager, re-priced from what it
states) is ``tests/test_priced_is_written.py`` (``torchtitan-float8-*``)."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from emitters import CannotExpress, get
from planner.cli.explain import plan_estimate
from planner.plan import targets as T
from test_emit_support import make_plan


def fp8_plan(recipe: str = "rowwise", gather: bool = False, model: str = "llama-3-8b", **par):
    par = {"dp": 8, "zero": 3, "grad_accum": 2, **par}
    plan = make_plan(model, gpus=8, gb=16, seq=4096, cluster="dgx-h100", micro_batch=1, **par)
    wl = dataclasses.replace(plan.workload, dtype="fp8", fp8_recipe=recipe, fp8_param_gather=gather)
    return plan.replace(target="torchtitan", workload=wl)


def test_rowwise_float8_is_accepted_priced_and_written():
    plan = fp8_plan()
    assert T.problems("torchtitan", plan) == []
    bf16 = plan.replace(workload=dataclasses.replace(plan.workload, dtype="bf16", fp8_recipe=""))
    # FP8 GEMMs on the block linears: faster than the same plan in bf16 (H100's FP8 peak is 2x)
    assert plan_estimate(plan).step_time_s < plan_estimate(bf16).step_time_s
    job = get("torchtitan").emit(plan)["torchtitan_planner_job.py"]
    assert "Float8LinearConverter.Config(" in job and "recipe_name='rowwise'" in job
    assert "filter_fqns=['lm_head']" in job          # the head stays bf16, as the cost model prices it
    assert "model_compile_enabled=False" in job


def test_compile_switch_reaches_the_converter():
    plan = fp8_plan().replace(framework={"compile": True})
    job = get("torchtitan").emit(plan)["torchtitan_planner_job.py"]
    assert "model_compile_enabled=True" in job and "enable=True" in job


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_transformer_engine_recipes_are_refused(recipe):
    (why,) = T.problems("torchtitan", fp8_plan(recipe))
    assert f"fp8 recipe {recipe}" in why and "--fp8-recipe rowwise" in why


def test_fp8_gather_needs_tensorwise():
    (why,) = T.problems("torchtitan", fp8_plan("rowwise", gather=True))
    assert "--fp8-param-gather" in why and "tensorwise" in why


def test_tensorwise_is_priced_but_not_written_by_torchtitan_0_3():
    """Tensorwise, with the FP8 FSDP all-gather where the run turned it on, is what the published runs of
    torchtitan <= 0.2 ran (the target prices them); torchtitan 0.3.0's converter has no such recipe, so
    the emitter refuses it. The all-gather moves FP8 weights, and each rank casts its shard before it, so
    no GEMM casts a weight (costmodel.fp8.Fp8Recipe.gemm_cast_values): faster than without it."""
    plan = fp8_plan("tensorwise", gather=True)
    assert T.problems("torchtitan", plan) == []
    rowwise = plan_estimate(fp8_plan("rowwise"))
    no_gather = plan_estimate(fp8_plan("tensorwise"))
    tensorwise = plan_estimate(plan)
    assert tensorwise.step_time_s < no_gather.step_time_s < rowwise.step_time_s
    assert tensorwise.time["dp_comm_s"] <= no_gather.time["dp_comm_s"]
    with pytest.raises(CannotExpress, match="rowwise or rowwise_with_gw_hp only"):
        get("torchtitan").emit(plan)


def test_widths_not_multiple_of_16_are_refused():
    model = dataclasses.replace(get_model("llama-3-8b"), ffn_hidden=14330)
    plan = fp8_plan().replace(model=model)
    why = T.titan_fp8_problem(plan.model, plan.workload, plan.parallel, plan.mesh_order)
    assert why and "ffn_hidden 14330" in why and "multiples of 16" in why


def test_float8_with_tp_and_no_fsdp_is_refused():
    (why,) = T.problems("torchtitan", fp8_plan(dp=1, tp=8, sp=True, zero=0, grad_accum=16))
    assert "fp8 with tp=8" in why and "fully_shard" in why


def test_default_recipe_is_what_the_target_writes():
    h100 = load_cluster("dgx-h100").groups[0].gpu
    assert T.default_fp8_recipe("torchtitan", h100) == T.TITAN_FP8_WRITTEN == "rowwise"
    assert T.default_fp8_recipe("megatron", h100) == "delayed"
    assert T.default_fp8_recipe(None, h100) == "delayed"
    from planner.cli.args import load_problem
    args = argparse.Namespace(model="llama-3-8b", cluster="dgx-h100", gpus=8, global_batch=16, seq_len=4096,
                              dtype="fp8", optimizer="adamw", attention_kernel="flash", seed=0, fp8_recipe="",
                              fp8_param_gather=False, recompute_layers=None, target="torchtitan")
    assert load_problem(args)[2].fp8_recipe == "rowwise"


def test_no_published_torchtitan_float8_run_is_refused_for_its_dtype():
    """`planner validate` prices the torchtitan Float8 runs through the torchtitan target now."""
    from planner.cli import validation as V
    rows = V.all_rows()
    assert [r for r in rows if r.framework == "torchtitan" and "float8" in r.case]
    assert not [why for why in V.REFUSED.values() if "dtype fp8" in why or "fp8 recipe" in why]


def test_tensorwise_tp_all_gathers_fp8_and_rowwise_bf16():
    """torchtitan's ``apply_tp`` plans a tensorwise Float8 model with torchao's ``Float8ColwiseParallel`` /
    ``Float8RowwiseParallel`` / ``PrepareFloat8ModuleInput``: the sequence-parallel input is cast to FP8 before
    its all-gather (and the output gradient before the backward's), the reduce-scatters stay BF16; rowwise runs
    the plain TP styles, every collective BF16 (costmodel.fp8 module docstring). One layer's TP traffic of one
    forward, by hand: two blocks, each an all-gather and a reduce-scatter of the layer's T x h activation."""
    from costmodel.comm import GroupLayout, Network, launched
    from costmodel.fp8 import resolve
    from costmodel.layers import layer_cost
    from costmodel.specs import Workload
    model = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    grp = cl.groups[0]
    net = Network(cl)
    tp, one = GroupLayout(8, 1), GroupLayout(1, 1)
    tokens = 2 * 4096                                        # micro-batch 2 of 4,096
    act = tokens * model.hidden                              # the layer's T x h values
    got = {}
    for name in ("tensorwise", "rowwise"):
        fp8 = resolve(name, "torchtitan", grp.gpu)
        assert fp8.tp_gather_fp8 == (name == "tensorwise")
        wl = Workload(global_batch=2, seq_len=4096, dtype="fp8", fp8_recipe=name)
        lc = layer_cost(model, False, wl, 8, 1, 1, True, 2, grp.gpu, cl, grp.intra_node, tp, one, one, fp8=fp8)
        got[name] = lc.tp_fwd_s
    rs = launched(net.reduce_scatter(act * 2, tp))
    assert got["tensorwise"] == pytest.approx(2 * (launched(net.all_gather(act * 1, tp)) + rs), rel=1e-12)
    assert got["rowwise"] == pytest.approx(2 * (launched(net.all_gather(act * 2, tp)) + rs), rel=1e-12)
    assert got["tensorwise"] < got["rowwise"]


def test_torchtitan_mxfp8_is_torchaos_not_transformer_engines():
    """A torchtitan workload in MXFP8 is priced as torchao's MXFP8Linear (casts per use, BF16 saved
    inputs, no cached FP8 weight), the recipe its grouped-GEMM sibling shares; Megatron's MXFP8 is
    Transformer Engine's (one cached FP8 weight, FP8 saved inputs). Blackwell only, both."""
    from costmodel.fp8 import resolve, torchao_mxfp8, torchao_mxfp8_experts
    from costmodel.specs import SpecError
    b200 = load_cluster("dgx-b200").gpu
    titan, te = resolve("mxfp8", "torchtitan+compile", b200), resolve("mxfp8", "megatron", b200)
    assert titan == torchao_mxfp8() == torchao_mxfp8_experts()
    assert (titan.saved_input_bytes, titan.weight_copies) == (2.0, 0) and te.saved_input_bytes < 2 < te.weight_copies + 1
    assert titan.cast_bytes(4096, 4096, 4096) > te.cast_bytes(4096, 4096, 4096)
    with pytest.raises(SpecError, match="mxfp8 needs Blackwell"):
        resolve("mxfp8", "torchtitan", load_cluster("dgx-h100").gpu)


def test_mxfp8_is_accepted_on_blackwell_priced_and_written():
    """torchtitan's MXFP8 (--fp8-recipe mxfp8 on B200): accepted, priced as torchao's MXFP8Linear and
    written as MXFP8LinearConverter over every block linear, the head in bf16; widths not multiples of
    32 are refused (MX scales blocks of 32); on H100 the recipe is refused with torchtitan's own."""
    from planner.plan.planfile import Plan
    plan = fp8_plan("mxfp8")
    plan = plan.replace(cluster=load_cluster("dgx-b200").with_gpus(8))
    assert T.problems("torchtitan", plan) == []
    files = get("torchtitan").emit(plan)
    job = next(v for k, v in files.items() if k.endswith(".py"))
    assert "MXFP8LinearConverter.Config(" in job and "fqns=['layers.']" in job and "Float8LinearConverter.Config(" not in job
    assert "MXFP8: torchao's MXFP8Linear" in files["torchtitan.sh"]
    odd = dataclasses.replace(get_model("llama-3-8b"), ffn_hidden=14352, name="odd")     # a multiple of 16, not 32
    why = T.problems("torchtitan", Plan(model=odd, cluster=plan.cluster, workload=plan.workload,
                                        parallel=plan.parallel, stages=plan.stages, target="torchtitan"))
    assert any("ffn_hidden 14352" in w and "blocks of 32" in w for w in why)
    from costmodel.fp8 import resolve
    from costmodel.specs import SpecError
    with pytest.raises(SpecError, match="use rowwise or tensorwise"):
        resolve("mxfp8", "torchtitan", load_cluster("dgx-h100").gpu)
