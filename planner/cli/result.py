"""Turning a solver result into plan files, the ``--json`` envelope and the human table."""
from __future__ import annotations

from typing import Any

from costmodel.specs import ClusterSpec, ModelSpec, Workload
from costmodel.units import GIB, fmt_seconds
from planner.plan.planfile import Plan, provenance
from planner.cli.report import (console, credibility_lines, describe_parallel, estimate_json, plan_credibility,
                            estimate_tables, parallel_json, throughput_line)
from planner.search.problem import SolveResult


def solver_json(res: SolveResult) -> dict[str, Any]:
    return {"status": res.status, "objective": res.objective, "bound": res.bound, "gap": res.gap,
            "wall_time_s": res.wall_time_s, "candidates": res.candidates, "solved": res.solved,
            "objective_name": res.objective_name}


def plans_from_result(res: SolveResult, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                      cluster_source: str = "catalog", target: str = "", switches: dict | None = None) -> list[Plan]:
    out = []
    for s in res.solutions:
        used = cluster if s.par.world_size == cluster.total_gpus else cluster.with_gpus(s.par.world_size)
        out.append(Plan(model=model, cluster=used, workload=workload, parallel=s.par, stages=s.stages,
                        mesh_order=s.cand.order, estimate=estimate_json(s.estimate), solver=solver_json(res),
                        provenance=provenance(cluster_source), target=target,
                        framework={**(switches or {}), **dict(s.cand.switches)}))
    return out


def plan_json(plan: Plan) -> dict[str, Any]:
    return {"parallel": parallel_json(plan.parallel), "estimate": dict(plan.estimate),
            "stages": [s.to_dict() for s in plan.stages], "mesh": {"order": list(plan.mesh_order),
                                                                   **plan.rank_layout()},
            "gpus": plan.world_size, **({"target": plan.target} if plan.target else {}),
            **({"uncertainty": _credibility(plan)} if plan.mode == "train" and "mfu" in plan.estimate else {})}


def _credibility(plan: Plan) -> dict[str, Any]:
    return plan_credibility(plan, plan.estimate["step_time_s"], plan.estimate["mfu"])


def tie_line(plans: list[Plan]) -> str | None:
    """Which of the other plans lie inside the best plan's band (``costmodel.uncertainty.within_band``):
    the cost model cannot tell them apart. Each pair is judged with the wider of the two plans'
    ``tie_band`` (``planner.cli.report.credibility``: wider for a plan on PyTorch's ring attention)."""
    from costmodel.uncertainty import within_band
    if len(plans) < 2 or plans[0].mode != "train":
        return None
    first = _credibility(plans[0])["tie_band"]
    best = plans[0].estimate["step_time_s"]
    ties: dict[float, list[str]] = {}
    for k, p in enumerate(plans[1:], 2):
        band = max(first, _credibility(p)["tie_band"])
        if within_band(best, p.estimate["step_time_s"], band):
            ties.setdefault(band, []).append(str(k))
    if not ties:
        return None
    parts = [f"plan{'s' if len(ks) > 1 else ''} {', '.join(ks)} {'are' if len(ks) > 1 else 'is'} within the cost "
             f"model's +/-{band * 100:.0f}% band of plan 1" for band, ks in sorted(ties.items())]
    return "; ".join(parts) + ": a tie (it cannot tell them apart; pick by what you run)"


def ceiling_line(plans: list[Plan]) -> str | None:
    """The other plans that, like plan 1, are predicted faster than the best run ever published on
    their GPU would do the same work (``credibility``'s ``ceiling_step_s``: one step for every plan of
    a problem, since it is the problem's work at the ceiling's MFU): their order rests on the cost
    model where no published run checks it. None when plan 1 is not above the ceiling."""
    if len(plans) < 2 or plans[0].mode != "train":
        return None
    at = _credibility(plans[0]).get("ceiling_step_s")
    if not at:
        return None
    ks = [str(k) for k, p in enumerate(plans[1:], 2) if p.estimate["step_time_s"] < at]
    if not ks:
        return None
    return (f"plan{'s' if len(ks) > 1 else ''} {', '.join(ks)} {'are' if len(ks) > 1 else 'is'} also predicted faster "
            f"than the best published MFU on this GPU would run the same work ({fmt_seconds(at)}): their order "
            "rests on the cost model where no published run checks it")


def result_json(res: SolveResult, plans: list[Plan]) -> dict[str, Any]:
    return {"status": res.status, "plans": [plan_json(p) for p in plans], "solver": solver_json(res)}


def print_result(res: SolveResult, plans: list[Plan], out: str | None = None) -> None:
    from rich.table import Table

    c = console()
    best = plans[0]
    c.print(f"[bold]{best.model.name}[/bold] on {best.world_size} x {best.cluster.gpu.name} "
            f"({best.cluster.name}), batch {best.workload.global_batch} x {best.workload.seq_len} tokens")
    t = Table(title=f"top {len(plans)} plan(s)", header_style="bold")
    for col in ("#", "parallel", "stages (layers/recompute)", "step", "tokens/s/GPU", "MFU", "peak mem"):
        t.add_column(col, justify="right" if col not in ("parallel", "stages (layers/recompute)") else "left")
    for k, (p, s) in enumerate(zip(plans, res.solutions), 1):
        e = s.estimate
        st = " ".join(f"{x.num_layers}/{x.recompute_layers}" + (f"@{x.group}" if x.group else "") for x in p.stages)
        t.add_row(str(k), describe_parallel(p.parallel) + f" order={','.join(p.mesh_order)}", st,
                  f"{e.step_time_s:.3f} s", f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu * 100:.1f}%",
                  f"{e.peak_bytes / GIB:.1f} GiB")
    c.print(t)
    tt, mt = estimate_tables(res.solutions[0].estimate, title="best plan: time per step")
    c.print(tt)
    c.print(mt)
    cred = _credibility(best) if best.mode == "train" and "mfu" in best.estimate else None
    c.print(throughput_line(res.solutions[0].estimate, cred["mfu_causal"] if cred else None))
    if cred:
        for line in credibility_lines(cred):
            c.print(line)
        for said in (tie_line(plans), ceiling_line(plans)):
            if said:
                c.print(said)
    layout = best.rank_layout()
    c.print(f"placement: mesh order {','.join(best.mesh_order)} (outer->inner); inside a node: "
            f"{', '.join(layout['within_node']) or 'nothing'}; TP inside a node: {layout['tp_within_node']}")
    gap = f", gap {res.gap * 100:.2f}%" if res.status != "OPTIMAL" else ""
    c.print(f"solver: [bold]{res.status}[/bold]{gap}, objective {res.objective:.6g}, bound {res.bound:.6g}, "
            f"{res.candidates} candidates ({res.solved} solved with CP-SAT), {res.wall_time_s:.2f} s")
