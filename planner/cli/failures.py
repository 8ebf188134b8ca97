"""What failures will cost a plan, before it starts: the goodput report of ``planner plan`` and
``planner explain`` (``--mtbf-hours`` per node, or the cluster file's ``reliability:``).

For each plan compared (the solver's top plans; ``--top K`` for more), from its step time, its
state size and the cluster's storage (``costmodel.reliability``):

* the checkpoint: state bytes (weights and optimizer state, ``costmodel.memory.bytes_per_param``:
  14 B per parameter for bf16 AdamW) over the storage bandwidth of the nodes it uses
  (``storage: {gb_per_s}`` per node, capped by ``total_gb_per_s``; default 1 GB/s per node,
  Meta's Tectonic); asynchronous (``--async-checkpoint``): the job stalls only for the copy to
  host memory;
* the restart: ``--restart-overhead-s`` (default 150 s: detection, rendezvous, process group),
  the checkpoint read back at the same bandwidth, and two warm-up steps;
* the best checkpoint interval (Young 1974, Daly 2006) in seconds and steps;
* the layout on fewer nodes: the plan's tp, pp, cp (and ep, virtual stages) kept, data
  parallelism cut to the largest degree that fits the nodes left and divides the global batch
  (what ``planner replan`` keeps when the checkpoint's layout costs little); the stage split,
  recompute and micro-batch kept too when that still fits, else solved again with the degrees
  fixed;
* spare nodes: how many to hold back so that the nodes down at once (repairs take
  ``--repair-hours``, default 24, an assumption) exceed them but 1 % of the time, and two ways to
  run: on every node without spares (degraded while nodes are down), or the layout on ``N - S``
  nodes with ``S`` spares held back. The report gives the goodput (useful steps per hour) of
  both and of the plan with ``S`` spares added to the cluster.

The ranking is by useful steps per hour in this cluster (the better of the two ways): a plan
that keeps most of its speed on fewer nodes can beat a faster one that does not.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from costmodel import reliability as R

SNAPSHOT_BYTES_PER_S = 25e9     # GPU -> host copy of an async checkpoint: PCIe 4.0 x16 is 32 GB/s a direction
MAX_MISSING = 4                 # degraded step times computed for 1..MAX_MISSING nodes missing


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("failures (a goodput report: useful steps per hour, checkpoint interval, spares)")
    g.add_argument("--mtbf-hours", type=float, metavar="H",
                   help="mean time between failures of one node, hours (default: the cluster file's "
                        "reliability.node_mtbf_hours; Meta's Llama 3 run implies 6335)")
    g.add_argument("--repair-hours", type=float, default=R.DEFAULT_REPAIR_S / 3600, metavar="H",
                   help="how long a failed node stays out (default 24, an assumption): sets the spares")
    g.add_argument("--restart-overhead-s", type=float, default=R.DEFAULT_RESTART_OVERHEAD_S, metavar="S",
                   help="detection, rendezvous and process-group set-up of a restart, before the checkpoint "
                        "load (default 150, FlashRecovery's measured restoration on 4,800 devices)")
    g.add_argument("--async-checkpoint", action="store_true",
                   help="price checkpoints as asynchronous (the job stalls only for the copy to host memory)")


def node_mtbf_s(args: argparse.Namespace, cluster) -> float | None:
    """The per-node MTBF: ``--mtbf-hours``, else the cluster's; None when neither is given."""
    from planner.plan.errors import UsageError
    h = getattr(args, "mtbf_hours", None)
    for flag in ("mtbf_hours", "repair_hours", "restart_overhead_s"):
        v = getattr(args, flag, None)
        if v is not None and not (math.isfinite(v) and v >= 0 and (flag == "restart_overhead_s" or v > 0)):
            raise UsageError(f"--{flag.replace('_', '-')} must be a number > 0, got {v:g}; e.g. --mtbf-hours 6335 "
                             "(Meta's Llama 3 run: 54 days x 24 h x 2,048 nodes / 419 failures)")
    if h is not None:
        return h * 3600.0
    return cluster.node_mtbf_s or None


def state_bytes(model, workload) -> float:
    """What a checkpoint holds: every parameter's weights and optimizer state."""
    from costmodel.memory import bytes_per_param
    w, _, k = bytes_per_param(workload.dtype, workload.optimizer)
    return model.total_params() * (w + k)


def _nodes(cluster, world: int) -> int:
    return max(1, math.ceil(world / cluster.gpus_per_node))


def _priced_as(fn, target: str | None, switches) -> dict:
    """The keyword that prices ``fn`` (``estimate``, ``solve``) as the plan's target runs it, with
    its framework settings: what the plan itself was priced with."""
    from planner.search.target_space import framework_kwargs
    return framework_kwargs(fn, target or None, dict(switches or {}))


def same_layout(model, cluster, workload, par, stages, order, nodes: int, target: str | None = None,
                switches=None):
    """The plan's layout on ``nodes`` nodes: tp, pp, cp, ep, stages, micro-batch kept, the largest
    data-parallel degree that fits and divides the global batch (whole nodes), priced as ``target``
    runs it with the plan's framework ``switches`` (as the plan was). Returns
    ``(ParallelConfig, Estimate)`` or None when none fits (memory, or no such degree)."""
    from costmodel.specs import SpecError
    from costmodel.training import estimate
    fw = _priced_as(estimate, target, switches)
    gpn = cluster.gpus_per_node
    model_par = par.tp * par.pp * par.cp
    for dp in range(min(par.dp, nodes * gpn // model_par), 0, -1):
        if workload.global_batch % (dp * par.micro_batch):
            continue
        world = dp * model_par
        if world >= gpn and world % gpn:
            continue
        if par.ep > 1 and (dp * par.cp) % par.ep:
            continue
        shard = par.dp_shard if par.dp_shard < par.dp and dp % par.dp_shard == 0 else dp
        new = dataclasses.replace(par, dp=dp, dp_shard=shard,
                                  grad_accum=workload.global_batch // (dp * par.micro_batch))
        try:
            sized = cluster.with_gpus(world)
            est = estimate(model, sized, workload, new, stages=stages, order=order, **fw)
        except (SpecError, ValueError):
            continue
        if est.fits:
            return new, est
        return _resolved(model, sized, workload, par, dp, target, switches)   # more recompute, another stage split
    return None


def _resolved(model, cluster, workload, par, dp: int, target: str | None = None, switches=None):
    """The best plan with the layout (tp, pp, cp, ep, virtual stages) and ``dp`` fixed, the rest
    (recompute, stage split, micro-batch, ZeRO) solved: ``planner replan``'s compatible plan at
    that size. None when nothing fits."""
    from planner.plan.errors import InfeasibleError, SolverStopped
    from planner.search.bnb import solve
    fixed = {"tp": par.tp, "pp": par.pp, "cp": par.cp, "vpp": par.vpp, "dp": dp}
    if model.is_moe:
        fixed["ep"] = par.ep
    try:
        res = solve(model, cluster, workload, fixed, gpus=cluster.total_gpus, max_time_s=20.0,
                    target=target or None, **_priced_as(solve, target, switches))
    except (InfeasibleError, SolverStopped):
        return None
    s = res.solutions[0]
    return s.par, s.estimate


def _degraded(model, cluster, workload, par, stages, order, nodes: int, target: str | None = None,
              switches=None) -> list[float | None]:
    out: list[float | None] = []
    for j in range(1, MAX_MISSING + 1):
        got = (same_layout(model, cluster, workload, par, stages, order, nodes - j, target, switches)
               if nodes - j >= 1 else None)
        out.append(got[1].step_time_s if got else None)
    return out


def assess(model, cluster, workload, par, stages, order, step_time_s: float, node_mtbf: float,
           args: argparse.Namespace, target: str | None = None, switches=None) -> dict[str, Any]:
    """One plan's goodput, three ways (no spares; ``S`` spares held back in the cluster; ``S``
    spares added), with the figures they come from; the smaller layouts priced as ``target`` runs
    them (with the plan's framework ``switches``), like ``step_time_s``."""
    world = par.world_size
    nodes = _nodes(cluster, world)
    repair = (getattr(args, "repair_hours", None) or R.DEFAULT_REPAIR_S / 3600) * 3600.0
    overhead = getattr(args, "restart_overhead_s", None)
    overhead = R.DEFAULT_RESTART_OVERHEAD_S if overhead is None else overhead
    asyn = bool(getattr(args, "async_checkpoint", False))
    per_node = cluster.storage_bytes_per_s_per_node or R.DEFAULT_STORAGE_BYTES_PER_S_PER_NODE
    cap = cluster.storage_total_bytes_per_s
    state = state_bytes(model, workload)

    def run(n_nodes: int, t: float, degraded: list, spares: int):
        write = R.checkpoint_write_s(state, n_nodes, per_node, cap)
        ck = R.checkpoint_cost(state / (n_nodes * cluster.gpus_per_node), write, asyn, SNAPSHOT_BYTES_PER_S)
        rs = R.RestartCost(overhead_s=overhead, load_s=write, warmup_s=R.DEFAULT_WARMUP_STEPS * t)
        return R.goodput(step_time_s=t, nodes=n_nodes, node_mtbf_s=node_mtbf, checkpoint=ck, restart=rs,
                         spares=spares, repair_s=repair, degraded_step_times_s=degraded)

    spares = R.spares_needed(nodes, node_mtbf, repair)
    degraded = _degraded(model, cluster, workload, par, stages, order, nodes, target, switches)
    no_spares = run(nodes, step_time_s, degraded, 0)
    added = run(nodes, step_time_s, degraded, spares)
    held = None
    if spares and nodes - spares >= 1:
        got = same_layout(model, cluster, workload, par, stages, order, nodes - spares, target, switches)
        if got is not None:
            p2, e2 = got
            n2 = _nodes(cluster, p2.world_size)
            held_run = run(n2, e2.step_time_s, _degraded(model, cluster, workload, p2, stages, order, n2, target,
                                                         switches),
                           min(spares, nodes - n2))
            held = {"nodes": n2, "dp": p2.dp, "step_time_s": e2.step_time_s, **_goodput_json(held_run)}
    ways = [("no_spares", no_spares.steps_per_hour)] + ([("spares_held", held["steps_per_hour"])] if held else [])
    best_way = max(ways, key=lambda kv: kv[1])
    return {"nodes": nodes, "gpus": world, "dp": par.dp, "step_time_s": step_time_s, "state_bytes": state,
            "node_mtbf_h": node_mtbf / 3600, "job_mtbf_h": no_spares.job_mtbf_s / 3600,
            "checkpoint": {"stall_s": no_spares.checkpoint.stall_s, "write_s": no_spares.checkpoint.write_s,
                           "asynchronous": asyn, "storage_gb_per_s_per_node": per_node / 1e9,
                           "storage_default": not cluster.storage_bytes_per_s_per_node},
            "restart": {"overhead_s": overhead, "load_s": no_spares.restart.load_s,
                        "warmup_s": no_spares.restart.warmup_s, "total_s": no_spares.restart.total_s},
            "interval": {"best_s": no_spares.interval_s, "best_steps": no_spares.interval_steps,
                         "young_s": no_spares.young_interval_s, "daly_s": no_spares.daly_interval_s},
            "repair_h": repair / 3600, "spares": spares,
            "degraded_step_time_s": degraded,
            "keeps_layout_on_one_node_less": degraded[0] is not None,
            "slowdown_one_node_less": (degraded[0] / step_time_s) if degraded[0] else None,
            "no_spares": _goodput_json(no_spares), "spares_added": _goodput_json(added), "spares_held": held,
            "best_way": best_way[0], "steps_per_hour": best_way[1]}


def _goodput_json(g: R.Goodput) -> dict[str, Any]:
    return {"steps_per_hour": g.steps_per_hour, "goodput": g.goodput, "useful_fraction": g.useful_fraction,
            "degraded_fraction": g.degraded_fraction, "interval_steps": g.interval_steps, "spares": g.spares}


def report(args: argparse.Namespace, entries: list[tuple[str, Any, Any, Any, float]], model, cluster,
           workload, target: str | None = None, switches=None) -> dict[str, Any] | None:
    """The goodput report of the plans ``entries`` (label, parallel config, stages, mesh order, step
    time, each priced for ``target`` with ``switches``), best first by useful steps per hour; None
    without a failure rate."""
    m = node_mtbf_s(args, cluster)
    if m is None:
        return None
    rows = []
    for label, par, stages, order, t in entries:
        a = assess(model, cluster, workload, par, stages, order, t, m, args, target, switches)
        rows.append(dict(a, plan=label))
    ranked = sorted(range(len(rows)), key=lambda i: -rows[i]["steps_per_hour"])
    for r, i in enumerate(ranked, 1):
        rows[i]["goodput_rank"] = r
    src = "--mtbf-hours" if getattr(args, "mtbf_hours", None) is not None else "cluster file"
    return {"node_mtbf_h": m / 3600, "source": src, "plans": rows, "best": rows[ranked[0]]["plan"],
            "best_is_fastest": ranked[0] == 0}


def for_plan_command(args: argparse.Namespace, res, plans) -> dict[str, Any] | None:
    """``planner plan``: the report over the plans it found (``--top``)."""
    if not plans or plans[0].mode != "train":
        return None
    from planner.cli.report import distinct_labels
    p0 = plans[0]
    labels = distinct_labels([(p.parallel, p.stages, p.mesh_order) for p in plans])
    entries = [(f"#{k} " + lab, p.parallel, p.stages, p.mesh_order, s.estimate.step_time_s)
               for k, (lab, p, s) in enumerate(zip(labels, plans, res.solutions), 1)]
    return report(args, entries, p0.model, p0.cluster, p0.workload, p0.target, p0.framework)


def for_explain(args: argparse.Namespace, plan, info: dict[str, Any]) -> dict[str, Any] | None:
    """``planner explain``: this plan and the runners-up the solver found."""
    from planner.cli.report import distinct_labels
    est = info["estimate"]
    entries = [("", plan.parallel, plan.stages, plan.mesh_order, est.step_time_s)]
    for s in info["solver"].solutions:
        if s.par == plan.parallel and s.stages == plan.stages:
            continue
        entries.append(("", s.par, s.stages, s.cand.order, s.estimate.step_time_s))
    entries = entries[:5]
    labels = distinct_labels([(e[1], e[2], e[3]) for e in entries])
    entries = [(("this plan: " if k == 0 else "") + lab, *e[1:]) for k, (lab, e) in enumerate(zip(labels, entries))]
    return report(args, entries, plan.model, plan.cluster, plan.workload, plan.target, plan.framework)


def text(rep: dict[str, Any] | None) -> str:
    """The report in words, for the plan and explain printers ('' without one)."""
    if not rep:
        return ""
    rows = rep["plans"]
    b = rows[0]
    ck, rs, iv = b["checkpoint"], b["restart"], b["interval"]
    stor = f"{ck['storage_gb_per_s_per_node']:.3g} GB/s per node" + (" (default: Meta's Tectonic 2 TB/s over 2,048 "
                                                                     "nodes)" if ck["storage_default"] else "")
    lines = ["", f"Failures: one node fails every {rep['node_mtbf_h']:,.0f} h ({rep['source']}); this job of "
                 f"{b['nodes']:,} nodes every {b['job_mtbf_h']:.3g} h.",
             f"  checkpoint: {b['state_bytes'] / 1e12:.3g} TB of weights and optimizer state at {stor}: "
             f"{ck['write_s']:.3g} s to write"
             + (f", the job stalls {ck['stall_s']:.3g} s (asynchronous)" if ck["asynchronous"] else "")
             + f"; restart {rs['total_s']:.3g} s ({rs['overhead_s']:.3g} s detection and rendezvous, "
               f"{rs['load_s']:.3g} s load, {rs['warmup_s']:.3g} s warm-up)",
             f"  best checkpoint interval: every {iv['best_steps']:,} steps ({iv['best_s'] / 60:.3g} min; Young "
             f"sqrt(2 x {ck['stall_s']:.3g} s x {b['job_mtbf_h']:.3g} h) = {iv['young_s'] / 60:.3g} min, "
             f"Daly {iv['daly_s'] / 60:.3g} min)",
             f"  spares: hold back {b['spares']} node(s) (repairs take {b['repair_h']:g} h; more nodes are down at "
             "once only 1% of the time)"]
    lines.append("  goodput, useful steps per hour (ideal = no failures, no checkpoints):")
    for r in rows:
        d1 = (f"on {r['nodes'] - 1:,} nodes {r['slowdown_one_node_less']:.2f}x the step time" if
              r["keeps_layout_on_one_node_less"] else f"no run on {r['nodes'] - 1:,} nodes with this layout")
        held = r["spares_held"]
        left = r["nodes"] - r["spares"]
        hs = (f"{held['steps_per_hour']:,.1f} with {r['spares']} spare(s) held back ({left:,} nodes left; this "
              f"layout fills {held['nodes']:,} of them: dp {r['dp']} -> {held['dp']}"
              + (f", {left - held['nodes']:,} idle" if left > held["nodes"] else "")
              + f", step {held['step_time_s']:.3g} s)" if held else "no layout with spares held back")
        ideal = 3600 / r["step_time_s"]
        lines.append(f"    {r['goodput_rank']}. {r['plan']}: step {r['step_time_s']:.3g} s, ideal {ideal:,.1f}; "
                     f"{r['no_spares']['steps_per_hour']:,.1f} without spares, {hs}; "
                     f"{r['spares_added']['steps_per_hour']:,.1f} with {r['spares']} spare(s) added "
                     f"({r['spares_added']['goodput'] * 100:.1f}%); {d1}")
    if not rep["best_is_fastest"]:
        lines.append(f"  under failures the best is {rep['best']}, not the fastest plan")
    return "\n".join(lines) + "\n"


__all__ = ["add_arguments", "node_mtbf_s", "state_bytes", "same_layout", "assess", "report", "for_plan_command",
           "for_explain", "text"]
