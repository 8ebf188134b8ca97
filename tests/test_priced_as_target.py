"""Every figure the tool derives from a plan is priced as the plan's target runs it.

The plan's own estimate is the target's (its overlaps, kernels, memory headroom, framework settings);
the plan checker's memory check,
``planner calibrate``'s predictions and the failure report's smaller layouts priced the generic
profile instead until session 33. Each is held here against ``explain.plan_estimate`` (the target's
price) on a real plan file, and against the generic price, which must differ (else the test could
not tell them apart). The launch report is the exception, held to the runtime that ran the plan.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from costmodel.files.clusters import cluster_from_dict
from costmodel.training import estimate
from planner.cli.explain import plan_estimate
from planner.plan.planfile import read_plan

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "plans" / "torchtitan" / "llama-3-8b-dgx-h100.yaml"


@pytest.fixture(scope="module")
def plan():
    p = read_plan(PLAN)
    assert p.target == "torchtitan"
    return p


def _generic(p, **kw):
    return estimate(p.model, p.cluster, p.workload, p.parallel, stages=p.stages, order=p.mesh_order, **kw)


def test_the_two_prices_differ(plan):
    assert plan_estimate(plan).step_time_s != pytest.approx(_generic(plan).step_time_s, rel=1e-3)


def test_launch_report_prices_the_runtime_that_ran(plan):
    """The exception, since session 31: `planner launch` runs every plan with this project's runtime,
    so its measured step is held against the runtime's price (the target "builtin"), not against the
    plan's framework's (a Megatron price was 2.04x optimistic against the runtime on an H200); the
    plan's own figure is kept beside it, named."""
    from planner.cli.launch_report import estimate_as_run, launch_json
    got = estimate_as_run(plan, "bf16")["step_time_s"]
    runtime = plan_estimate(dataclasses.replace(plan, target="builtin", framework={})).step_time_s
    assert got == pytest.approx(runtime, rel=1e-9)
    assert got != pytest.approx(plan_estimate(plan).step_time_s, rel=1e-3)
    fp32 = estimate_as_run(plan, "fp32")["step_time_s"]
    wl = dataclasses.replace(plan.workload, dtype="fp32")
    assert fp32 != pytest.approx(_generic(dataclasses.replace(plan, workload=wl)).step_time_s, rel=1e-3)
    out = launch_json({"dtype": "bf16", "step_time_s": 1.0}, plan, "m.jsonl")
    assert out["predicted"]["step_time_s"] == pytest.approx(runtime, rel=1e-9)
    assert out["predicted_plan_target"]["target"] == "torchtitan"
    assert out["predicted_plan_target"]["step_time_s"] == pytest.approx(plan.estimate["step_time_s"], rel=1e-9)
    assert "predicted_for_dtype" not in out


def test_calibrate_predicts_as_the_target_runs_it(plan):
    from planner.cli.cmd_calibrate import Run, predict
    (got,) = predict(plan.cluster, [Run("r", plan, 1.0)], {})
    assert got == pytest.approx(plan_estimate(plan).step_time_s, rel=1e-9)


def test_failure_report_prices_smaller_layouts_as_the_target(plan):
    from planner.cli.failures import same_layout
    nodes = plan.cluster.nodes
    par, est = same_layout(plan.model, plan.cluster, plan.workload, plan.parallel, plan.stages, plan.mesh_order,
                           nodes, plan.target, plan.framework)
    assert par == plan.parallel
    assert est.step_time_s == pytest.approx(plan_estimate(plan).step_time_s, rel=1e-9)
    _, gen = same_layout(plan.model, plan.cluster, plan.workload, plan.parallel, plan.stages, plan.mesh_order, nodes)
    assert gen.step_time_s == pytest.approx(_generic(plan).step_time_s, rel=1e-9)


def test_plan_check_reads_the_targets_memory(plan):
    """A GPU between the smallest the plan fits in as its target runs it (its headroom, FSDP2's copies,
    its chunked loss) and the smallest under the generic profile: the checker follows the target. Since
    stop 53 torchtitan's chunked loss holds one eighth of the logits, so this plan needs less memory as
    torchtitan runs it than under the generic profile, and a GPU between the two is accepted; the
    other way round it would be refused."""
    from planner.plan.check import check_plan

    def peak_over_cap(mem_gib: float, **kw) -> float:
        c = cluster_from_dict({"extends": "dgx-h100", "gpu": {"memory_gib": mem_gib}})
        e = estimate(plan.model, c, plan.workload, plan.parallel, stages=plan.stages, order=plan.mesh_order, **kw)
        return max(s.memory["peak_bytes"] / s.capacity_bytes for s in e.stages)

    def smallest(**kw) -> float:
        lo, hi = 1.0, 200.0         # the smallest memory the plan fits in, by bisection
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if peak_over_cap(mid, **kw) > 1 else (lo, mid)
        return hi

    from planner.search.target_space import framework_kwargs
    fw = framework_kwargs(estimate, plan.target, plan.framework)
    target, generic = smallest(**fw), smallest()
    assert abs(target - generic) > 0.01 * target, "generic and target need the same memory"
    between = (target + generic) / 2
    assert (peak_over_cap(between, **fw) > 1) == (target > generic)
    mid = dataclasses.replace(plan, cluster=cluster_from_dict({"extends": "dgx-h100", "gpu": {"memory_gib": between}}))
    refused = any("GiB per GPU" in p for p in check_plan(mid))
    assert refused == (target > generic)
    small = dataclasses.replace(plan, cluster=cluster_from_dict(
        {"extends": "dgx-h100", "gpu": {"memory_gib": target * 0.999}}))
    assert any("GiB per GPU" in p for p in check_plan(small))
    roomy = dataclasses.replace(plan, cluster=cluster_from_dict(
        {"extends": "dgx-h100", "gpu": {"memory_gib": target * 1.001}}))
    assert not check_plan(roomy)
