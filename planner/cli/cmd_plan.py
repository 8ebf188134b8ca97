"""``planner plan``: prove the best hybrid plan and write it as a plan file."""
from __future__ import annotations

import argparse
import sys

from planner.cli.args import (add_degree_args, add_problem_args, check_writable, cluster_source_of, fixed_degrees,
                              load_problem, mesh_order)

HELP = "solve for the best plan (any dimension may be fixed); --out writes the plan file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_problem_args(p)
    add_degree_args(p)
    g = p.add_argument_group("search")
    g.add_argument("--mode", choices=["train", "infer"], default="train")
    g.add_argument("--objective", choices=["throughput", "cost", "memory"], default="throughput",
                   help="throughput: fastest step; cost: cheapest per token (may use fewer GPUs); "
                        "memory: lowest peak memory")
    g.add_argument("--price-per-gpu-hour", type=float, help="USD per GPU-hour for --objective cost")
    g.add_argument("--top", type=int, default=1, help="the K best distinct plans")
    g.add_argument("--max-time", type=float, default=60.0, help="solver time limit in seconds")
    g.add_argument("--exhaustive", action="store_true", help="brute-force reference over the same space")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON (the stable contract)")
    o.add_argument("--out", help="write the best plan to this YAML file")
    o.add_argument("--csv", help="write every scored candidate to this CSV file")
    from planner.cli import infer_args
    infer_args.add_arguments(p)
    from planner.cli import failures
    failures.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.mode == "infer":
        from planner.cli import infer_plan
        return infer_plan.run(args)
    from planner.plan.errors import UsageError
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if args.max_time <= 0:
        raise UsageError(f"--max-time must be > 0, got {args.max_time}")
    check_writable(args.out)
    check_writable(args.csv)
    model, cluster, wl = load_problem(args)
    fixed = fixed_degrees(args)
    order = mesh_order(args)
    if order:
        fixed["mesh_order"] = order
    from planner.search.bnb import solve
    from planner.cli.result import plans_from_result, result_json, print_result

    res = solve(model, cluster, wl, fixed, gpus=cluster.total_gpus, objective=args.objective,
                price_per_gpu_hour=args.price_per_gpu_hour, top=args.top, max_time_s=args.max_time,
                exhaustive=args.exhaustive, score_all=bool(args.csv))
    plans = plans_from_result(res, model, cluster, wl, cluster_source=cluster_source_of(args.cluster))
    if args.out:
        from planner.plan.planfile import write_plan
        write_plan(plans[0], args.out)
    if args.csv:
        import pandas as pd

        from profiles.safeio import write_text
        write_text(args.csv, pd.DataFrame(res.scored).to_csv(index=False), "--csv")
    from planner.cli.failures import for_plan_command, text as failures_text
    fail = for_plan_command(args, res, plans)       # None without a failure rate
    if args.json:
        from planner.cli.report import print_json
        print_json(dict(result_json(res, plans), **({"failures": fail} if fail else {})))
    else:
        print_result(res, plans, args.out)
        print(failures_text(fail), end="")
    if args.out and not args.json:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0

