"""Rules of the dense refit (issue 23, session 20): what a validation case says it ran, where
Megatron's full TP overlap can run, and the prior of a framework whose only sources are left out."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel import fitted
from costmodel.frameworks import FRAMEWORKS, has_cuda_multicast, tp_overlap_of
from costmodel.training import estimate
from emitters import get
from emitters.megatron import tp_comm_overlap
from planner.cli import validation
from test_emit_support import make_plan


# -- async TP: read from the record's key, not from its text --------------------------------------

def test_async_tp_false_is_not_async_tp():
    assert validation.ran_async_tp({"fsdp": "FSDP2 8 x TP 8", "async_tp": True})
    assert not validation.ran_async_tp({"fsdp": "FSDP2 8 x TP 8", "async_tp": False})
    assert not validation.ran_async_tp({"fsdp": "FSDP2 1D", "compile": True})
    assert not validation.ran_async_tp("async_tp: false")
    assert validation.ran_async_tp("FSDP2 + async TP")
    assert not validation.ran_async_tp(None)


def test_every_case_on_file_gets_tp_overlap_only_if_it_ran_async_tp():
    """Each torchtitan case's profile overlaps TP exactly when its record says ``async_tp: true``
    (``"async" in str(execution)`` used to match ``async_tp: false`` too)."""
    seen = {True: 0, False: 0}
    for case, _split in validation.all_cases(include_holdout=True):
        ex = case.get("execution")
        if not isinstance(ex, dict) or "async_tp" not in ex or validation.framework_of(case) != "torchtitan":
            continue
        prof = validation.case_inputs(case)[4]
        assert prof.tp_comm_overlap is bool(ex["async_tp"]), case["name"]
        seen[bool(ex["async_tp"])] += 1
    assert seen[True] and seen[False]          # both kinds are on file


# -- Megatron's --tp-comm-overlap needs CUDA multicast (Hopper and later) --------------------------

@pytest.mark.parametrize("name, has", [("A100-SXM4-80GB", False), ("NVIDIA A100-SXM4-80GB", False),
                                       ("L40S-48GB", False), ("MI300X-192GB", False), ("cpu-process", False),
                                       ("H100-SXM5-80GB", True), ("NVIDIA H100 80GB HBM3", True), ("H20", True),
                                       ("H800-SXM5-80GB", True), ("GH200", True), ("B200-180GB", True),
                                       ("GB200-186GB", True)])
def test_cuda_multicast_by_gpu_name(name, has):
    assert has_cuda_multicast(name) is has


def _tp8_plan(cluster: str):
    return make_plan("gpt3-175b", gpus=64, gb=64, seq=2048, cluster=cluster, tp=8, sp=True, pp=8,
                     micro_batch=1, grad_accum=64).replace(target="megatron")


@pytest.mark.parametrize("cluster, mode", [("dgx-a100-80gb", "backward"), ("dgx-h100", "full")])
def test_megatron_full_tp_overlap_only_with_multicast(cluster, mode):
    """The rule, the emitter's flag and the price agree: on an A100 the flag is not written and
    the plan is priced with the backward-only overlap, slower than with full overlap."""
    plan = _tp8_plan(cluster)
    prof = FRAMEWORKS["megatron"]
    assert tp_overlap_of(prof, plan.parallel, plan.mesh_order, plan.cluster.nvlink_gpus,
                         plan.cluster.gpu.name) == mode
    assert tp_comm_overlap(plan) is (mode == "full")
    lines = "".join(get("megatron").emit(plan).values()).splitlines()
    flags = [x.split() for x in lines if not x.lstrip().startswith("#")]
    assert any("--tp-comm-overlap" in f for f in flags) is (mode == "full")
    args = (plan.model, plan.cluster, plan.workload, plan.parallel)
    priced = estimate(*args, stages=plan.stages, order=plan.mesh_order, framework=prof)
    unlimited = estimate(*args, stages=plan.stages, order=plan.mesh_order,
                         framework=dataclasses.replace(prof, tp_overlap_needs_multicast=False))
    if mode == "full":
        assert priced.step_time_s == unlimited.step_time_s
    else:
        assert priced.step_time_s > unlimited.step_time_s


# -- the pooled prior of a framework whose only sources are left out -------------------------------

def test_pooled_prior_is_the_median_of_the_other_fits():
    c = fitted.BY_NAME["framework.deepspeed.kernel_efficiency"]
    assert c.prior_rule == "pooled"
    others = {"framework.torchtitan.kernel_efficiency": 0.91, "framework.accelerate.kernel_efficiency": 0.83}
    assert fitted.pooled_prior(c, others) == pytest.approx(0.87)
    assert fitted.pooled_prior(c, {"framework.torchtitan.kernel_efficiency": 0.9}) == 0.9
    assert fitted.pooled_prior(c, {}) == c.prior                      # nothing to pool: the stated prior
    # its own value never enters its prior
    assert fitted.pooled_prior(c, dict(others, **{c.name: 0.5})) == pytest.approx(0.87)
    # not a pooled constant: the stated prior
    g = fitted.BY_NAME["gpu.A100.matmul_efficiency"]
    assert fitted.pooled_prior(g, others) == g.prior
