"""The serving search for one serving target: ``solve_serving`` over the candidate splits that
target runs (``planner.plan.targets.serve_problems``). The serving targets' records name
``solve_serving_for`` as their search hook; the command line calls it."""
from __future__ import annotations

from costmodel.specs import ClusterSpec, ModelSpec, Workload
from planner.plan import targets as T
from planner.search.serving import ServingInfeasible, solve_serving
from planner.search.serving_space import enumerate_candidates


def solve_serving_for(target: str, model: ModelSpec, cluster: ClusterSpec, wl: Workload, fixed: dict, **kw):
    """``solve_serving`` over the candidates serving target ``target`` runs (all of them for
    ``generic``); none: ``ServingInfeasible`` naming what the target lacks."""
    if target == T.GENERIC:
        return solve_serving(model, cluster, wl, fixed, **kw)
    sched, rate = kw.get("sched"), kw.get("rate_per_s")
    cands, max_b = enumerate_candidates(model, cluster, wl, fixed, kw.get("batch"), kw.get("batch_limit", 4096),
                                        sched, rate)
    if sched is not None and kw.get("disaggregation") in ("auto", "only") and kw.get("batch") is None \
            and rate is None:
        from planner.search.serving_disagg import enumerate_disaggregated
        if kw.get("disaggregation") == "only":
            cands = []
        cands = cands + enumerate_disaggregated(model, cluster, wl, sched, fixed, kw.get("ttft_slo_s"),
                                                kw.get("tpot_slo_s"), kw.get("prefill_sched"))
    why: dict[str, int] = {}
    kept = []
    for c in cands:
        pr = T.serve_problems(target, model, wl, c.par, cluster.gpus_per_node, len(cluster.groups))
        for m in pr:
            why[m] = why.get(m, 0) + 1
        if not pr:
            kept.append(c)
    if cands and not kept:
        worst = sorted(why, key=lambda m: -why[m])[:3]
        raise ServingInfeasible(f"{target} serves none of the {len(cands)} candidate splits: " + "; ".join(worst),
                                reason="target", closest=None)
    return solve_serving(model, cluster, wl, fixed, candidates=(kept, max_b), **kw)
