"""``planner replan``: a new plan for a changed cluster, warm-started from the old plan and
keeping its checkpoint's layout where that costs little (``planner.search.replan``).

    planner replan PLAN (--gpus N | --lose-nodes K | --add-nodes K | --cluster NEW [--gpus N])
        [--global-batch G] [--json] [--out FILE] [--max-time S] [--compatible-within PCT]

Prints what changes in words, the new step time against the old, and whether the old run's
checkpoint loads as it is. ``--json`` is ``planner plan``'s envelope (``status``, ``plans``,
``solver``) plus ``changes``, ``checkpoint_compatible`` and the old/new figures.

Exit codes: 0 done; 1 no plan on the GPUs left (the message, and with ``--json`` the object on
stdout, give the minimum number of GPUs that works); 2 bad usage or input; 3 the solver stopped
before any plan.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

HELP = "a new plan for a changed cluster (lost or added GPUs/nodes), keeping the checkpoint's layout if cheap"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="the plan file (YAML) the job runs now")
    g = p.add_argument_group("the change (one of --gpus, --lose-nodes, --add-nodes; --cluster may add --gpus)")
    ex = g.add_mutually_exclusive_group()
    ex.add_argument("--gpus", type=int, help="GPUs left (whole nodes, or fewer than one node)")
    ex.add_argument("--lose-nodes", type=int, metavar="K", help="K nodes fewer than the plan's cluster")
    ex.add_argument("--add-nodes", type=int, metavar="K", help="K nodes more than the plan's cluster")
    g.add_argument("--cluster", help="another cluster (catalog name or cluster YAML) instead of the plan's")
    g.add_argument("--group", help="node group that loses or gains nodes (heterogeneous clusters)")
    w = p.add_argument_group("workload")
    w.add_argument("--global-batch", type=int,
                   help="another global batch (default: the plan's, with more gradient accumulation); "
                        "the runtime will not resume the old checkpoint under another batch")
    s = p.add_argument_group("search")
    s.add_argument("--max-time", type=float, default=60.0, help="solver time limit in seconds")
    s.add_argument("--compatible-within", type=float, default=None, metavar="PCT",
                   help="keep the checkpoint's layout (tp, pp, cp, ep) if its step time is within PCT %% "
                        "of the best plan (default 5)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON (the stable contract)")
    o.add_argument("--out", help="write the new plan to this YAML file")


def new_cluster(args: argparse.Namespace, plan):
    """The plan's cluster (or ``--cluster``) with the change applied; UsageError if none given."""
    from planner.plan.errors import UsageError
    from planner.search.replan import changed_cluster
    if args.gpus is None and args.lose_nodes is None and args.add_nodes is None and not args.cluster:
        raise UsageError("say what changed: --gpus N, --lose-nodes K, --add-nodes K or --cluster NEW")
    cluster = plan.cluster
    if args.cluster:
        from costmodel.files.clusters import load_cluster
        cluster = load_cluster(args.cluster)
    return changed_cluster(cluster, gpus=args.gpus, lose_nodes=args.lose_nodes, add_nodes=args.add_nodes,
                           group=args.group)


def checkpoint_compatible(old, new) -> bool:
    """The old run's checkpoint loads under ``new`` as it is: the runtime accepts it (same model
    and workload) and no layer changes rank (``planner.search.replan.layout_unchanged``)."""
    from planner.search.replan import layout_unchanged
    from runtime.checkpoint import CheckpointMismatch, check_compatible
    try:
        check_compatible({"model": old.model.to_dict(), "workload": old.workload.to_dict()}, new.model.to_dict(),
                         new.workload.to_dict(), "of the old plan")
    except CheckpointMismatch:
        return False
    return layout_unchanged(old, new)


def replan_json(rp, new_plan, changes: list[str], compatible: bool) -> dict[str, Any]:
    from planner.cli.result import plan_json, solver_json
    from planner.cli.report import parallel_json
    old = rp.old
    new_s = rp.solution.estimate.step_time_s
    out = {"status": rp.result.status, "plans": [plan_json(new_plan)], "solver": solver_json(rp.result),
           "changes": changes, "checkpoint_compatible": compatible,
           "chosen": rp.chosen,
           "compatible_within": rp.slack,
           "gpus_available": rp.cluster.total_gpus, "gpus_used": new_plan.world_size,
           "old": {"gpus": old.world_size, "parallel": parallel_json(old.parallel), "step_time_s": rp.old_step_time_s},
           "step_time_s": new_s,
           "step_time_ratio": (new_s / rp.old_step_time_s) if rp.old_step_time_s else None,
           "compatible_step_time_s": rp.compatible.objective if rp.compatible else None,
           "best_step_time_s": rp.best_other.objective if rp.best_other else None,
           "bound_s": rp.bound_s,
           "world_sizes_solved": rp.worlds_solved, "world_sizes_pruned": rp.worlds_pruned}
    return out


def print_replan(out: dict[str, Any], rp, new_plan, path: str | None) -> None:
    from planner.cli.report import console, describe_parallel
    c = console()
    old = rp.old
    c.print(f"[bold]{old.model.name}[/bold]: {old.world_size} -> {out['gpus_available']} GPUs available "
            f"({rp.cluster.gpu.name}), the new plan uses {new_plan.world_size}")
    for line in out["changes"]:
        c.print(f"  {line}")
    c.print(f"new plan: {describe_parallel(new_plan.parallel)} order={','.join(new_plan.mesh_order)}")
    old_s, new_s = rp.old_step_time_s, out["step_time_s"]
    if old_s:
        c.print(f"step time {old_s:.4g} s -> {new_s:.4g} s ({(new_s / old_s - 1) * 100:+.1f}%)")
    else:
        c.print(f"step time {new_s:.4g} s (the old plan has no estimate)")
    if out["checkpoint_compatible"]:
        c.print("checkpoint: loads as it is (same tp, pp, cp, ep and stage split; only data parallelism changes)")
    else:
        c.print("checkpoint: will be resharded on load")
    if rp.chosen == "compatible" and rp.best_other is not None and rp.best_other.objective < rp.compatible.objective:
        c.print(f"kept the checkpoint's layout: the best plan found ({rp.best_other.objective:.4g} s) is within "
                f"{rp.slack * 100:g}% of it")
    elif rp.chosen == "best" and rp.compatible is not None:
        c.print(f"the checkpoint's layout would take {rp.compatible.objective:.4g} s per step, more than "
                f"{rp.slack * 100:g}% slower: changed it")
    gap = f", gap {out['solver']['gap'] * 100:.2f}%" if out["status"] != "OPTIMAL" else ""
    c.print(f"solver: [bold]{out['status']}[/bold]{gap}, {rp.wall_time_s:.2f} s, world sizes solved "
            f"{rp.worlds_solved or '-'}, {rp.worlds_pruned} pruned by bounds")


def run(args: argparse.Namespace) -> int:
    from planner.plan.errors import UsageError
    from planner.plan.planfile import read_plan, write_plan
    from planner.search.replan import COMPATIBLE_SLACK, TooFewGpus, describe_changes, replan
    from planner.cli.result import plans_from_result
    from planner.cli.args import check_writable
    if args.max_time <= 0:
        raise UsageError(f"--max-time must be > 0, got {args.max_time}")
    if args.global_batch is not None and args.global_batch <= 0:
        raise UsageError(f"--global-batch must be > 0, got {args.global_batch}")
    slack = COMPATIBLE_SLACK if args.compatible_within is None else args.compatible_within / 100
    if slack < 0:
        raise UsageError(f"--compatible-within must be >= 0, got {args.compatible_within}")
    check_writable(args.out)
    old = read_plan(args.plan)
    if old.mode != "train":
        raise UsageError(f"{args.plan} is a {old.mode!r} plan; replan handles training plans "
                         "(for serving, run `planner plan --mode infer` for the new cluster)")
    cluster = new_cluster(args, old)
    wl = old.workload
    if args.global_batch is not None:
        wl = dataclasses.replace(wl, global_batch=args.global_batch)
    try:
        rp = replan(old, cluster, wl, max_time_s=args.max_time, slack=slack)
    except TooFewGpus as e:
        if args.json:
            from planner.cli.report import print_json
            print_json({"status": "INFEASIBLE", "error": str(e), "minimum_gpus": e.minimum_gpus,
                        "gpus_available": cluster.total_gpus})
        raise
    source = dict(old.provenance or {}).get("cluster_source", "plan")
    new = plans_from_result(dataclasses.replace(rp.result, solutions=[rp.solution]), old.model, cluster, wl,
                            cluster_source=source, target=old.target)[0]
    new = new.replace(provenance=dict(new.provenance, replanned_from=str(args.plan)))
    changes = describe_changes(old, new)
    compatible = checkpoint_compatible(old, new)
    out = replan_json(rp, new, changes, compatible)
    if args.out:
        write_plan(new, args.out)
    if args.json:
        from planner.cli.report import print_json
        print_json(out)
    else:
        print_replan(out, rp, new, args.out)
    if args.out and not args.json:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
