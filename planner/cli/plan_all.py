"""``planner plan --target all`` (the default): one solve per target, their best plans side by
side, one plan file per target with ``--out DIR`` (``--out FILE.yaml``: the best one), and the
``--json`` envelope ``{"status", "plans", "solver"}`` with the plans best first, each naming its
target. No plan that no target runs is ever the answer: ``generic`` is not one of them."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.plan import targets as T
from planner.plan.errors import InfeasibleError, SolverStopped


def _is_file(out: str | None) -> bool:
    """``--out`` names the best plan's file (``.yaml``, or anything already there that is not a
    folder, which the safe writer then judges) rather than a folder of one file per target."""
    if not out:
        return False
    p = Path(out)
    return p.suffix in (".yaml", ".yml") or (p.exists() or p.is_symlink()) and not p.is_dir()


def _status(statuses: list[str]) -> str:
    if not statuses:
        return "INFEASIBLE"
    return "OPTIMAL" if all(s == "OPTIMAL" for s in statuses) else "FEASIBLE"


def _write(plans_by_target: dict[str, list], order: list[str], out: str) -> list[str]:
    from planner.plan.planfile import write_plan
    if _is_file(out):
        write_plan(plans_by_target[order[0]][0], out)
        return [out]
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for t in order:
        written.append(str(write_plan(plans_by_target[t][0], d / f"{t}.yaml")))
    return written


def _no_plan(results) -> None:
    """Every target failed: the error of the first, with everyone's reasons."""
    msg = "no target has a plan: " + "; ".join(f"{r.target}: {r.error}" for r in results)
    if all(r.exit_code == 3 for r in results):
        raise SolverStopped(msg)
    raise InfeasibleError(msg)


def train_all(args: argparse.Namespace, model, cluster, wl, fixed: dict) -> int:
    from planner.cli.args import cluster_source_of
    from planner.cli.report import print_json
    from planner.cli.result import plans_from_result, plan_json, print_result, solver_json
    from planner.cli.targets_table import print_side_by_side, rows_json
    from planner.search.targets import solve_all

    results = solve_all(model, cluster, wl, fixed, T.planning_targets("train"), objective=args.objective,
                        price_per_gpu_hour=args.price_per_gpu_hour, top=args.top, max_time_s=args.max_time,
                        exhaustive=args.exhaustive, score_all=bool(args.csv))
    ok = [r for r in results if r.result is not None]
    if not ok:
        if args.json:
            print_json({"status": "INFEASIBLE", "plans": [],
                        "solver": {"status": "INFEASIBLE", "objective": None, "bound": None,
                                   "targets": {r.target: {"status": "INFEASIBLE", "error": r.error}
                                               for r in results}}})
        _no_plan(results)
    src = cluster_source_of(args.cluster) if args.cluster else "catalog"
    plans = {r.target: plans_from_result(r.result, model, r.cluster, wl, cluster_source=src, target=r.target)
             for r in ok}
    order = [r.target for r in ok]
    written = _write(plans, order, args.out) if args.out else []
    if args.csv:
        import pandas as pd
        rows = [{"target": r.target, **row} for r in ok for row in r.result.scored]
        pd.DataFrame(rows).to_csv(args.csv, index=False)
    if args.json:
        every = sorted(((s.objective, k, p, r) for r in ok for k, (s, p) in
                        enumerate(zip(r.result.solutions, plans[r.target]))), key=lambda x: (x[0], x[1]))
        best = ok[0].result
        print_json({
            "status": _status([r.result.status for r in ok]),
            "plans": [{**plan_json(p), "solver": solver_json(r.result)} for _, _, p, r in every],
            "solver": {**solver_json(best), "status": _status([r.result.status for r in ok]),
                       "bound": min(r.result.bound for r in ok if r.result.bound is not None),
                       "candidates": sum(r.result.candidates for r in ok),
                       "solved": sum(r.result.solved for r in ok),
                       "wall_time_s": sum(r.result.wall_time_s for r in ok),
                       "target": ok[0].target,
                       "targets": {r.target: (solver_json(r.result) if r.result is not None
                                              else {"status": "INFEASIBLE", "error": r.error}) for r in results}},
            "targets": rows_json(results, plans, plans[ok[0].target][0]),
        })
    else:
        w = wl
        from planner.cli.report import console
        c = console()
        c.print(f"[bold]{model.name}[/bold] on {cluster.total_gpus} x {cluster.gpu.name} ({cluster.name}), batch "
                f"{w.global_batch} x {w.seq_len} tokens: one plan per target (`--target T` for one)")
        print_side_by_side(results, plans, c)
        best = ok[0]
        c.print(f"\n[bold]best: {best.target}[/bold]")
        print_result(best.result, plans[best.target])
    for f in written:
        print(f"wrote {f}", file=sys.stderr)
    return 0
