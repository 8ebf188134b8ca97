"""``planner plan --mode infer``: the flags, the serving search (``planner.search.serving``), and
the plans, JSON, CSV and table it prints.

No plan: exit 1 naming the binding constraint, with the closest plan and what it achieves (also in
the ``--json`` envelope under ``closest``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from costmodel.inference import kv_dtype_of
from costmodel.specs import MESH_AXES, ClusterSpec, ModelSpec, Workload, default_stages
from planner.plan.errors import UsageError
from planner.search.serving import ServeResult, ServingInfeasible, solve_serving
from planner.search.serving_space import BATCHES_PER_OCTAVE, Candidate

SERVING_ORDER = MESH_AXES
TRAINING_ONLY = ("cp", "vpp", "micro_batch", "grad_accum", "dp_shard", "recompute_layers", "zero", "sp",
                 "recompute", "schedule")


# --------------------------------------------------------------------------------------
# The problem from the command line
# --------------------------------------------------------------------------------------

def _check_usage(args: argparse.Namespace) -> None:
    for k in ("prompt_len", "output_len"):
        if getattr(args, k, None) is None:
            raise UsageError(f"--mode infer needs --{k.replace('_', '-')} (tokens per request)")
        if getattr(args, k) < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    for k in ("ttft_slo_ms", "tpot_slo_ms"):
        v = getattr(args, k, None)
        if v is not None and not v > 0:
            raise UsageError(f"--{k.replace('_', '-')} must be > 0, got {v}")
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if args.max_time <= 0:
        raise UsageError(f"--max-time must be > 0, got {args.max_time}")
    if getattr(args, "objective", "throughput") != "throughput":
        raise UsageError(f"--objective {args.objective}: serving maximizes output tokens/s per GPU (or, with "
                         "--batch, minimizes request latency); --objective applies to training")
    given = [k for k in TRAINING_ONLY if getattr(args, k, None) is not None and not (k == "cp" and args.cp == 1)]
    if given:
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in given)}: training options; a serving "
                         "plan chooses only --tp, --pp, --dp (replicas), --ep and the batch")
    for k in ("tp", "pp", "dp", "ep"):
        v = getattr(args, k, None)
        if v is not None and v < 1:
            raise UsageError(f"--{k} must be >= 1, got {v}")


def load_serving_problem(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, Workload]:
    """Model, cluster and serving workload from the flags (``load_problem`` wants a batch and a
    sequence length: here they are the batch, or 1 while searching, and prompt + output)."""
    from planner.cli.args import load_problem
    a = argparse.Namespace(**vars(args))
    a.global_batch = args.batch or 1
    a.seq_len = args.prompt_len + args.output_len
    model, cluster, wl = load_problem(a, mode="infer")
    if len(cluster.groups) > 1:
        raise UsageError(f"cluster {cluster.name!r} has {len(cluster.groups)} node groups; serving plans use "
                         "one kind of GPU (give one group's cluster file)")
    wl = dataclasses.replace(wl, prompt_len=args.prompt_len, output_len=args.output_len,
                             kv_dtype=args.kv_dtype or "")
    wl = dataclasses.replace(wl, kv_dtype=kv_dtype_of(wl))     # recorded explicitly in the plan
    return model, cluster, wl


def _fixed(args: argparse.Namespace) -> dict[str, int]:
    return {k: getattr(args, k) for k in ("tp", "pp", "dp", "ep") if getattr(args, k, None) is not None}


# --------------------------------------------------------------------------------------
# Plans, JSON, the table
# --------------------------------------------------------------------------------------

def solver_json(res: ServeResult) -> dict[str, Any]:
    gap = 0.0
    if res.objective and res.bound is not None:
        gap = abs(res.bound - res.objective) / abs(res.objective)
    return {"status": res.status, "objective": res.objective, "bound": res.bound, "gap": gap,
            "wall_time_s": res.wall_time_s, "candidates": res.candidates, "solved": res.candidates,
            "objective_name": res.objective_name, "space": f"degree tuples x batch grid ({BATCHES_PER_OCTAVE} "
            "sizes per doubling up to each tuple's largest fitting batch)"}


def make_plan(model: ModelSpec, cluster: ClusterSpec, wl: Workload, c: Candidate, solver: dict | None = None,
              cluster_source: str = "catalog", target: str = ""):
    from planner.plan.planfile import Plan, provenance
    used = cluster if c.par.world_size == cluster.total_gpus else cluster.with_gpus(c.par.world_size)
    return Plan(model=model, cluster=used, workload=dataclasses.replace(wl, global_batch=c.batch), parallel=c.par,
                stages=default_stages(model.layers, c.pp), mesh_order=SERVING_ORDER, estimate=c.est.to_dict(),
                solver=dict(solver or {}), provenance=provenance(cluster_source), target=target)


def plan_json(plan) -> dict[str, Any]:
    from planner.cli.report import parallel_json
    w = plan.workload
    return {"parallel": parallel_json(plan.parallel), "estimate": dict(plan.estimate),
            "stages": [s.to_dict() for s in plan.stages],
            "mesh": {"order": list(plan.mesh_order), **plan.rank_layout()}, "gpus": plan.world_size,
            **({"target": plan.target} if plan.target else {}),
            "serving": {"replicas": plan.parallel.dp, "batch_per_replica": w.global_batch,
                        "prompt_len": w.prompt_len, "output_len": w.output_len, "dtype": w.dtype,
                        "kv_dtype": w.kv_dtype}}


def _candidate_json(c: Candidate | None) -> dict | None:
    if c is None:
        return None
    return {"parallel": {"tp": c.tp, "pp": c.pp, "dp": c.dp, "ep": c.ep}, "batch": c.batch,
            "estimate": c.est.to_dict(stages=False)}


def _csv_rows(cands: list[Candidate]) -> list[dict]:
    rows = []
    for c in cands:
        e = c.est
        rows.append({"tp": c.tp, "pp": c.pp, "replicas": c.dp, "ep": c.ep, "batch": c.batch, "ttft_s": e.ttft_s,
                     "tpot_s": e.tpot_s, "output_tokens_per_s_per_gpu": e.output_tokens_per_s_per_gpu,
                     "peak_bytes": e.peak_bytes, "fits": e.fits, "max_batch": e.max_batch})
    return rows


def print_table(res: ServeResult, plans: list) -> None:
    from rich.table import Table

    from costmodel.units import fmt_bytes, fmt_seconds
    from planner.cli.report import console
    c = console()
    best = plans[0]
    w = best.workload
    c.print(f"[bold]{best.model.name}[/bold] serving on {best.world_size} x {best.cluster.gpu.name} "
            f"({best.cluster.name}): prompt {w.prompt_len} + output {w.output_len} tokens, weights {w.dtype}, "
            f"KV cache {w.kv_dtype}")
    t = Table(title=f"top {len(plans)} plan(s)", header_style="bold")
    for col in ("#", "tp", "pp", "replicas", "ep", "batch", "TTFT", "TPOT", "tok/s/GPU", "peak mem", "max batch"):
        t.add_column(col, justify="right")
    for k, (p, s) in enumerate(zip(plans, res.solutions), 1):
        e = s.est
        t.add_row(str(k), str(s.tp), str(s.pp), str(s.dp), str(s.ep), str(s.batch), fmt_seconds(e.ttft_s),
                  fmt_seconds(e.tpot_s), f"{e.output_tokens_per_s_per_gpu:,.1f}", fmt_bytes(e.peak_bytes),
                  str(e.max_batch))
    c.print(t)
    e = res.solutions[0].est
    tt = Table(title="best plan: time", header_style="bold")
    tt.add_column("term")
    tt.add_column("time", justify="right")
    for k, v in e.time.items():
        if v:
            tt.add_row(k.removesuffix("_s").replace("_", " "), fmt_seconds(v))
    mt = Table(title="memory per GPU (fullest stage)", header_style="bold")
    mt.add_column("category")
    mt.add_column("bytes", justify="right")
    for k in ("weights_bytes", "kv_cache_bytes", "activations_bytes", "other_bytes"):
        mt.add_row(k.removesuffix("_bytes").replace("_", " "), fmt_bytes(e.memory[k]))
    mt.add_row("[bold]peak[/bold]", f"[bold]{fmt_bytes(e.peak_bytes)} of {fmt_bytes(e.capacity_bytes)}[/bold]")
    c.print(tt)
    c.print(mt)
    c.print(f"{e.output_tokens_per_s:,.0f} output tokens/s ({e.output_tokens_per_s_per_gpu:,.1f} per GPU), "
            f"request latency {fmt_seconds(e.request_latency_s)}, KV cache {fmt_bytes(e.kv_cache_bytes_per_token)}"
            f" per token per GPU, room for {e.kv_cache_capacity_tokens:,} tokens")
    gap = f", gap {solver_json(res)['gap'] * 100:.2f}%" if res.status != "OPTIMAL" else ""
    c.print(f"solver: [bold]{res.status}[/bold]{gap}, objective {res.objective:.6g} ({res.objective_name}), "
            f"bound {res.bound:.6g}, {res.candidates} candidates, {res.wall_time_s:.2f} s")


def solve_serving_for(target: str, model: ModelSpec, cluster: ClusterSpec, wl: Workload, fixed: dict, **kw):
    """``solve_serving`` over the candidates serving target ``target`` runs (all of them for
    ``generic``); none: ``ServingInfeasible`` naming what the target lacks."""
    from planner.plan import targets as T
    from planner.search.serving_space import enumerate_candidates
    if target == T.GENERIC:
        return solve_serving(model, cluster, wl, fixed, **kw)
    cands, max_b = enumerate_candidates(model, cluster, wl, fixed, kw.get("batch"), kw.get("batch_limit", 4096))
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


def run(args: argparse.Namespace) -> int:
    from planner.cli.args import check_writable, cluster_source_of
    from planner.cli.report import print_json
    _check_usage(args)
    check_writable(args.out)
    check_writable(getattr(args, "csv", None))
    model, cluster, wl = load_serving_problem(args)
    slo_t = args.ttft_slo_ms / 1e3 if args.ttft_slo_ms is not None else None
    slo_p = args.tpot_slo_ms / 1e3 if args.tpot_slo_ms is not None else None
    target = getattr(args, "target", None) or "generic"
    if target == "all":
        from planner.cli.plan_all import infer_all
        return infer_all(args, model, cluster, wl, slo_t, slo_p)
    try:
        res = solve_serving_for(target, model, cluster, wl, _fixed(args), batch=args.batch, ttft_slo_s=slo_t,
                                tpot_slo_s=slo_p, top=args.top, max_time_s=args.max_time, batch_limit=args.max_batch,
                                exhaustive=bool(getattr(args, "exhaustive", False)))
    except ServingInfeasible as e:
        if args.json:
            print_json({"status": "INFEASIBLE", "plans": [], "reason": e.reason, "message": str(e),
                        "closest": _candidate_json(e.closest),
                        "solver": {"status": "INFEASIBLE", "objective": None, "bound": None}})
        raise
    source = cluster_source_of(args.cluster)
    sj = solver_json(res)
    plans = [make_plan(model, cluster, wl, c, sj, source, target) for c in res.solutions]
    if args.out:
        from planner.plan.planfile import write_plan
        write_plan(plans[0], args.out)
    if getattr(args, "csv", None):
        import pandas as pd
        from profiles.safeio import write_text
        write_text(args.csv, pd.DataFrame(_csv_rows(res.scored)).to_csv(index=False), "--csv")
    if args.json:
        print_json({"status": res.status, "plans": [plan_json(p) for p in plans], "solver": sj})
    else:
        print_table(res, plans)
        if args.out:
            print(f"wrote {args.out}", file=sys.stderr)
    return 0
