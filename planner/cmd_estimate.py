"""``planner estimate``: the cost model alone, for one fully given configuration."""
from __future__ import annotations

import argparse

from planner.args import add_degree_args, add_problem_args, complete_config, fixed_degrees, load_problem, mesh_order

HELP = "the cost model alone for one configuration: memory per GPU and step time, term by term"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", help="estimate a plan file's configuration instead of flags")
    add_problem_args(p)
    add_degree_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (the stable contract)")


def run(args: argparse.Namespace) -> int:
    from costmodel.training import estimate
    from planner.report import (console, describe_parallel, estimate_json, estimate_tables, parallel_json,
                                print_json, throughput_line)

    if args.plan:
        from planner.planfile import read_plan
        plan = read_plan(args.plan)
        model, cluster, wl, par = plan.model, plan.cluster, plan.workload, plan.parallel
        stages, order = plan.stages, plan.mesh_order
    else:
        model, cluster, wl = load_problem(args)
        par = complete_config(fixed_degrees(args), cluster.total_gpus, wl)
        stages, order = None, mesh_order(args)
    est = estimate(model, cluster, wl, par, stages=stages, order=order)
    if args.json:
        print_json({"parallel": parallel_json(par), "estimate": estimate_json(est)})
        return 0
    c = console()
    c.print(f"[bold]{model.name}[/bold] on {par.world_size} x {cluster.gpu.name} ({cluster.name}), "
            f"batch {wl.global_batch} x {wl.seq_len} tokens")
    c.print(describe_parallel(par))
    t, mt = estimate_tables(est)
    c.print(t)
    c.print(mt)
    c.print(throughput_line(est))
    if not est.fits:
        c.print(f"[red]does not fit:[/red] peak {est.peak_bytes / 2**30:.1f} GiB per GPU on stage "
                f"{max(est.stages, key=lambda s: s.memory['peak_bytes'] / s.capacity_bytes).index}, "
                f"capacity {est.capacity_bytes / 2**30:.1f} GiB; try more tp/pp, zero 3 or recompute full")
    return 0
