"""``planner plan``: prove the best hybrid plan and write it as a plan file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from costmodel.specs import ClusterSpec
    from planner.search.problem import SolveResult

from planner.cli.args import (add_degree_args, add_problem_args, check_writable, cluster_source_of, fixed_degrees,
                              load_problem, mesh_order, target_name)

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
    g.add_argument("--target", default=None, type=target_name,
                   help="the framework to plan for: megatron, torchtitan, deepspeed, accelerate, builtin (train; "
                        "torchrun, slurm, kubernetes run builtin), vllm, sglang, tensorrt-llm, builtin (infer); "
                        "all (the default for training): each framework, side by side; for serving the default is vllm "
                        "(its continuous-batching scheduler); generic: every layout the cost model knows "
                        "(a bound: no framework runs all of them)")
    g.add_argument("--framework-setting", metavar="KEY=VALUE[,KEY=VALUE]",
                   help="framework settings the plan is priced with and its files write: torchtitan "
                        "compile=true, async_tp=true (needs compile and --tp > 1)")
    g.add_argument("--like", metavar="PLAN", help="take the model, cluster, GPUs, batch and sequence (and dtype, "
                   "optimizer) from this plan file")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON (the stable contract)")
    o.add_argument("--out", help="write the best plan to this YAML file")
    o.add_argument("--csv", help="write every scored candidate to this CSV file")
    from planner.cli import infer_args
    infer_args.add_arguments(p)
    from planner.cli import failures
    failures.add_arguments(p)


def _check_target(args: argparse.Namespace) -> None:
    from planner.plan import targets as T
    from planner.plan.errors import UsageError
    if args.target is None:          # the default: every training target side by side; vLLM for serving
        args.target = "vllm" if args.mode == "infer" else "all"
    known = ("all", T.GENERIC) + T.names(args.mode)
    if args.target not in known:
        raise UsageError(f"--target {args.target!r}: {args.mode} targets are {', '.join(T.names(args.mode))}, "
                         f"all or {T.GENERIC}{T.stand_in_hint(args.target) if args.mode == 'train' else ''}")


def _like(args: argparse.Namespace) -> None:
    """``--like PLAN``: the problem flags not given are the plan's."""
    from planner.plan.planfile import read_plan
    plan = read_plan(args.like)
    w = plan.workload
    src = (plan.provenance or {}).get("cluster_source", "catalog")
    args._like_model = plan.model
    if args.cluster is None:
        args.cluster = src if src != "catalog" else plan.cluster.name
        if args.gpus is None and not (src != "catalog" and (":" in plan.cluster.name or len(plan.cluster.groups) > 1)):
            args.gpus = plan.world_size
    for k, v in (("global_batch", w.global_batch), ("seq_len", w.seq_len)):
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.model is None:
        args.model = plan.model.name
    args.dtype, args.optimizer = w.dtype, w.optimizer


def out_path(out: str | None, target: str) -> str | None:
    """``--out``: a file, or an existing folder, which gets ``<target>.yaml`` (with ``--target all``
    one file per target, ``planner.cli.plan_all``). Re-running a command overwrites its files."""
    if out and target != "all" and Path(out).is_dir() and not Path(out).is_symlink():
        return str(Path(out) / f"{target}.yaml")
    return out


def run(args: argparse.Namespace) -> int:
    _check_target(args)
    if getattr(args, "like", None):
        _like(args)
    default = "vllm" if args.mode == "infer" else "all"       # each mode's default target
    args.out = out_path(args.out, getattr(args, "target", None) or default)
    if args.mode == "infer":
        from planner.cli import infer_plan
        return infer_plan.run(args)
    from planner.plan.errors import UsageError
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if args.max_time <= 0:
        raise UsageError(f"--max-time must be > 0, got {args.max_time}")
    from planner.cli.plan_all import _is_file
    check_writable(args.out if args.target != "all" or not args.out or _is_file(args.out)
                   else str(Path(args.out) / "megatron.yaml"))
    check_writable(args.csv)
    model, cluster, wl = load_problem(args)
    if args.objective == "cost" and args.price_per_gpu_hour is None and not any(
            g.gpu.price_per_hour for g in cluster.groups):
        raise UsageError(f"--objective cost: cluster {cluster.name} states no price (gpu price_per_hour is 0), so "
                         "there is no cost to minimise; give --price-per-gpu-hour USD, or set price_per_hour in "
                         "the cluster file")
    if getattr(args, "_like_model", None) is not None and args.model == args._like_model.name:
        model = args._like_model
    fixed = fixed_degrees(args)
    order = mesh_order(args)
    if order:
        fixed["mesh_order"] = order
    if args.target is None:
        args.target = "all"
    if args.target == "all":
        if args.framework_setting:
            from planner.plan.errors import UsageError
            raise UsageError("--framework-setting is one framework's: give --target (e.g. --target torchtitan)")
        from planner.cli.failures import node_mtbf_s
        if node_mtbf_s(args, cluster):
            print("planner plan: goodput is reported for one target's plans: add --target T (e.g. --target "
                  "megatron) to rank them by goodput", file=sys.stderr)
        from planner.cli.plan_all import train_all
        return train_all(args, model, cluster, wl, fixed)
    from planner.cli.result import plans_from_result, result_json, print_result
    from planner.plan import targets as T
    from planner.search.targets import solve_target

    target = args.target
    from planner.cli.target_notes import framework_settings
    switches = framework_settings([x for x in (args.framework_setting or '').split(',') if x], target, fixed,
                                  (model, wl, cluster.groups[0].gpu))
    extra = {"framework": T.profile_for(target, switches)} if switches else {}
    res, used = solve_target(model, cluster, wl, fixed, None if target == T.GENERIC else target,
                             objective=args.objective, price_per_gpu_hour=args.price_per_gpu_hour, top=args.top,
                             max_time_s=args.max_time, exhaustive=args.exhaustive, score_all=bool(args.csv), **extra)
    res = cast("SolveResult", res)
    used = cast("ClusterSpec", used)
    plans = plans_from_result(res, model, used, wl, cluster_source=cluster_source_of(args.cluster), target=target,
                              switches=switches)
    from planner.cli.target_notes import setting_hints
    for hint in (setting_hints(target, switches, plans[0]) if plans else []):
        print(hint, file=sys.stderr)
    if target == T.GENERIC:
        print(f"planner plan: --target {T.GENERIC} searches every layout the cost model knows; no framework runs "
              "all of them (a bound, not a plan to launch: `planner emit` checks the target's table)",
              file=sys.stderr)
    if args.out:
        from planner.plan.planfile import write_plan
        write_plan(plans[0], args.out)
    if args.csv:
        import pandas as pd

        from costmodel.files.safeio import write_text
        write_text(args.csv, pd.DataFrame(res.scored).to_csv(index=False), "--csv")
    from planner.cli.failures import for_plan_command, text as failures_text
    fail = for_plan_command(args, res, plans)       # None without a failure rate
    if args.json:
        from planner.cli.report import print_json
        print_json(dict(result_json(res, plans), **({"failures": fail} if fail else {})))
    else:
        print(f"target: {target}" + (f" (on {used.name})" if used is not cluster else ""))
        print_result(res, plans, args.out)
        print(failures_text(fail), end="")
    if args.out and not args.json:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0

