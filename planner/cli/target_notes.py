"""The target ``planner estimate`` prices a configuration for: the plan's own (or ``--target``),
its framework profile, and what that target cannot run of the configuration."""
from __future__ import annotations

import argparse

from costmodel.specs import MESH_AXES, default_stages
from planner.plan import targets as T
from planner.plan.errors import UsageError


def estimate_target(args: argparse.Namespace, model, cluster, wl, par, stages, order):
    """``(target or "", its problems with this configuration, estimate's framework keyword)``."""
    from costmodel.training import estimate
    from planner.plan.planfile import Plan
    from planner.search.targets import framework_kwargs
    target = getattr(args, "target", None)
    if target is None and getattr(args, "plan", None):
        from planner.plan.planfile import read_plan
        target = read_plan(args.plan).target or None
    if not target or target == T.GENERIC:
        return (target or ""), [], {}
    if target not in T.TRAIN:
        raise UsageError(f"--target {target!r}: training targets are {', '.join(T.names('train'))}")
    plan = Plan(model=model, cluster=cluster, workload=wl, parallel=par,
                stages=stages or default_stages(model.layers, par.pp), mesh_order=tuple(order or MESH_AXES))
    return target, T.problems(target, plan), framework_kwargs(estimate, target)


