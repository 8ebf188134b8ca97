"""``planner estimate``: the cost model alone, for one fully given configuration."""
from __future__ import annotations

import argparse
import dataclasses

from planner.cli.args import (add_degree_args, add_problem_args, complete_config, fixed_degrees, load_problem, mesh_order,
                             target_name)
from costmodel.units import GIB

HELP = "the cost model alone for one configuration: memory per GPU and step time, term by term"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", help="estimate a plan file's configuration instead of flags")
    add_problem_args(p)
    add_degree_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (the stable contract)")
    p.add_argument("--target", type=target_name, help="price it as this framework runs it and say what it cannot run "
                                    "(default: the plan's target; generic without --plan)")
    p.add_argument("--framework-setting", metavar="KEY=VALUE[,KEY=VALUE]",
                   help="the target's framework settings to price (as `planner plan` takes them: torchtitan "
                        "compile=true, async_tp=true; megatron ...); a PyTorch FSDP trainer takes compile=true")


def run(args: argparse.Namespace) -> int:
    from costmodel.training import estimate
    from planner.plan import targets as T
    from planner.cli.report import (console, credibility, credibility_lines, describe_parallel, estimate_json,
                                estimate_tables, parallel_json, print_json, throughput_line)

    if args.plan:
        from planner.plan.planfile import read_plan
        plan = read_plan(args.plan)
        model, cluster, wl, par = plan.model, plan.cluster, plan.workload, plan.parallel
        stages, order = plan.stages, plan.mesh_order
        if plan.mode == "infer":
            return _serving(plan, args.json, args.plan)
    else:
        model, cluster, wl = load_problem(args)
        fixed = fixed_degrees(args)
        target = getattr(args, "target", None)
        fixed.setdefault("zero", T.default_zero(target, fixed))   # the target's own
        if fixed.get("sp") is None and not T.runs_sp(target):
            fixed["sp"] = False          # a target without sequence parallelism (DeepSpeed's) is not given it
        par = complete_config(fixed, cluster.total_gpus, wl)
        if fixed.get("dp_shard") is None and par.zero >= 3:
            shard = T.default_dp_shard(target, dataclasses.asdict(par), cluster.groups[0].gpus_per_node)
            if shard is not None:
                par = dataclasses.replace(par, dp_shard=shard)        # the target's own (MaxText: per host)
        if par.recompute == "selective" and not par.recompute_modules:
            # the target's own modules (Megatron's for a mixture of experts), as `planner plan` plans them
            mods = T.selective_modules(target, model, wl)
            if mods:
                par = dataclasses.replace(par, recompute_modules=mods)
        stages, order = None, mesh_order(args)
    from planner.cli.target_notes import estimate_target
    target, cannot, fw = estimate_target(args, model, cluster, wl, par, stages, order)
    est = estimate(model, cluster, wl, par, stages=stages, order=order, **fw)
    if args.plan and (not args.target or args.target == plan.target):
        from planner.cli.args import warn_drift as _warn_drift
        _warn_drift(plan, {"step_time_s": est.step_time_s}, args.plan)
    cred = credibility(model, cluster, wl, est.step_time_s, est.mfu, par=par,
                       framework=fw.get("framework", "generic"), stages=stages, order=order)
    stand_in = T.stand_in_note(getattr(args, "target", None) or "")
    if args.json:
        out = {"parallel": parallel_json(par), "estimate": estimate_json(est), "uncertainty": cred}
        if target or stand_in:
            out["target"] = {"name": target or T.GENERIC, "problems": cannot}
        if stand_in:
            out["target"].update(asked=args.target, note=stand_in)
        print_json(out)
        return 0
    c = console()
    c.print(f"[bold]{model.name}[/bold] on {par.world_size} x {cluster.gpu.name} ({cluster.name}), "
            f"batch {wl.global_batch} x {wl.seq_len} tokens")
    c.print(describe_parallel(par))
    t, mt = estimate_tables(est)
    c.print(t)
    c.print(mt)
    c.print(throughput_line(est, cred["mfu_causal"]))
    for line in credibility_lines(cred):
        c.print(line)
    if stand_in:
        c.print(f"--target {args.target}: {stand_in}")
    for msg in cannot:
        c.print(f"[red]{target} cannot run this:[/red] {msg}")
    if not est.fits:
        c.print(f"[red]does not fit:[/red] peak {est.peak_bytes / GIB:.1f} GiB per GPU on stage "
                f"{max(est.stages, key=lambda s: s.memory['peak_bytes'] / s.capacity_bytes).index}, "
                f"capacity {est.capacity_bytes / GIB:.1f} GiB; try more tp/pp, zero 3 or recompute full")
    return 0


def _serving(plan, as_json: bool, where: str = "plan") -> int:
    """An inference plan: the serving cost model, not the training one."""
    from costmodel.batching import estimate_serving
    from planner.cli.report import console, parallel_json, print_json

    # the batching the plan's figures assume (its serving section): static, in-flight or disaggregated
    est = estimate_serving(plan.model, plan.cluster, plan.workload, plan.parallel, plan.serving, stages=plan.stages)
    d = est.to_dict()
    from planner.cli.args import warn_drift as _warn_drift
    _warn_drift(plan, {k: d[k] for k in ("ttft_s", "tpot_s", "output_tokens_per_s_per_gpu") if k in d}, where)
    if as_json:
        print_json({"parallel": parallel_json(plan.parallel), "estimate": d})
        return 0
    c = console()
    wl = plan.workload
    c.print(f"[bold]{plan.model.name}[/bold] serving on {plan.world_size} x {plan.cluster.gpu.name}: "
            f"tp={plan.parallel.tp} pp={plan.parallel.pp} replicas={plan.parallel.dp} ep={plan.parallel.ep}, "
            f"batch {wl.global_batch}, prompt {wl.prompt_len} + output {wl.output_len}")
    c.print(f"time to first token {d['ttft_s'] * 1e3:.2f} ms, per output token {d['tpot_s'] * 1e3:.2f} ms, "
            f"{d['output_tokens_per_s_per_gpu']:,.0f} output tokens/s per GPU, largest batch {d['max_batch']}")
    mem = d["memory"]
    c.print("memory per GPU: " + ", ".join(f"{k.removesuffix('_bytes')} {v / GIB:.2f} GiB" for k, v in mem.items()))
    return 0
