"""Solving for execution targets: one target (``solve_target``, the search hook the training
targets' records name: ``planner.plan.targets.REGISTRY``), every target (``solve_all``), and
the node groups a target that launches one kind of node may use. What a target's search space
is lives in ``planner.search.target_space``; why a target has no plan in
``planner.search.refusal``."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from costmodel.specs import ModelSpec, Workload
from planner.plan import targets as T
from planner.search.target_space import widened


# --------------------------------------------------------------------------------------
# Solving for a target, and for every target
# --------------------------------------------------------------------------------------

def clusters_for(cluster, target: str | None) -> list:
    """The clusters a target's plan may use: the whole cluster, or, for a target that launches
    one kind of node on a cluster of several node groups, each group on its own (named
    ``cluster:group``)."""
    if not widened(target) or len(cluster.groups) == 1 or T.get(target).heterogeneous:
        return [cluster]
    return [dataclasses.replace(cluster, name=f"{cluster.name}:{g.name}", groups=(g,)) for g in cluster.groups]


@dataclasses.dataclass
class TargetResult:
    """One target's solve: its result and the cluster (or node group) its plans use, or why
    there is no plan (``error``, with the exit code it would have on its own)."""
    target: str
    result: object | None            # planner.search.problem.SolveResult
    cluster: object | None
    error: str = ""
    exit_code: int = 0


def solve_target(model: ModelSpec, cluster, workload: Workload, fixed: dict, target: str | None,
                 **kw) -> tuple[object, object]:
    """``bnb.solve`` for one target: ``(SolveResult, cluster used)``. A target that launches one
    kind of node is solved on each node group of a mixed cluster, and the best group kept."""
    from planner.plan.errors import InfeasibleError, SolverStopped
    from planner.search.bnb import solve
    subs = clusters_for(cluster, target)
    if len(subs) == 1:
        return solve(model, cluster, workload, fixed, target=target, **{"gpus": cluster.total_gpus, **kw}), cluster
    best, errors = None, []
    for sub in subs:
        try:
            res = solve(model, sub, workload, fixed, target=target, **{**kw, "gpus": sub.total_gpus})
        except (InfeasibleError, SolverStopped) as e:
            errors.append((sub.name, e))
            continue
        if best is None or res.objective < best[0].objective:
            best = (res, sub)
    if best is None:
        first = errors[0][1]
        msg = "; ".join(f"on {name}: {e}" for name, e in errors)
        raise type(first)(f"{target} launches one kind of node, and no node group has a plan ({msg})")
    return best


def solve_all(model: ModelSpec, cluster, workload: Workload, fixed: dict, targets: Sequence[str],
              **kw) -> list[TargetResult]:
    """One solve per target; the results best first (targets without a plan last)."""
    from planner.plan.errors import InfeasibleError, SolverStopped
    out = []
    for t in targets:
        try:
            res, used = solve_target(model, cluster, workload, fixed, t, **kw)
            out.append(TargetResult(t, res, used))
        except (InfeasibleError, SolverStopped) as e:     # bad input is every target's: it propagates
            out.append(TargetResult(t, None, None, str(e), e.exit_code))
    order = {t: i for i, t in enumerate(targets)}
    out.sort(key=lambda r: (r.result is None, r.result.objective if r.result else 0.0, order[r.target]))
    return out
