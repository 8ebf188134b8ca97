"""Replanning for a changed cluster: a new plan, warm-started from the old one, that prefers the
old plan's model-parallel layout so its checkpoint loads as it is.

The search, for a cluster of ``N`` GPUs (the old plan's workload; the global batch kept):

1. The checkpoint-compatible plan: the old plan's tp, pp, cp and ep fixed (and its virtual
   stages), solved at the largest world size ``w <= N`` where that shape is legal (whole
   nodes, ``dp = w / (tp*pp*cp)`` dividing the global batch). Fixing four degrees leaves a
   few hundred candidates: this solve is fast, and its step time is the incumbent.
2. The best plan with anything free, over the world sizes ``w <= N`` that admit degrees at all
   (losing one node of 128 with a power-of-two global batch leaves 1,016 GPUs, where no
   data-parallel degree divides the batch: the plan has to use fewer GPUs; and a plan on fewer
   GPUs can be faster than the awkward shapes of more). The FLOP bound
   ``F / (w * peak * e_max)`` (no plan beats its model FLOPs at the best GEMM efficiency the
   cost model knows) rules world sizes out without enumerating them; the rest go into one
   branch and bound (``solve(..., worlds=)``) whose cutoff is ``compatible / (1 +
   COMPATIBLE_SLACK)``: the candidates of every world size share one heap, one incumbent and
   the solver's bounds (group compute bound with the bubble, weak, strong, makespan), so a
   world size is solved only when one of its candidates could still change the answer.
   (Solving world sizes one by one, least bound first, took 1.2-1.3 s for llama-3-70b losing
   one or four nodes of 128; the single search takes a fraction of that: see
   ``bench/bench_replan.py``.)
3. The compatible plan is kept when its step time is within ``COMPATIBLE_SLACK`` (5 %) of the
   best plan: a checkpoint that loads without moving layers between ranks is worth a few per
   cent of step time (one resharded load of a 70B model's 1 TB of optimizer state costs
   minutes of a large job; 5 % of a 10 s step is 0.5 s per step, so the faster layout only
   pays back after hundreds of steps and still costs the reshard). Otherwise the faster plan
   wins and the report says the checkpoint will be resharded on load.

The result's status is OPTIMAL when the search finished (every world size solved or ruled
out by a bound), FEASIBLE when ``max_time_s`` stopped it; its ``bound`` is a lower bound on any
plan's step time on at most ``N`` GPUs, so ``objective - bound`` shows at most what keeping the
checkpoint's layout costs.

Too few GPUs (no world size up to ``N`` has a plan): ``TooFewGpus`` (exit 1) naming the
smallest number of GPUs, in whole nodes, that has one (``minimum_gpus``).

Pure planning: no I/O; ``planner.cli.cmd_replan`` is the command.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from costmodel.specs import ClusterSpec, SpecError, Workload
from planner.plan.errors import InfeasibleError, SolverStopped, UsageError
from planner.plan.planfile import Plan
from planner.search import bounds
from planner.search.bnb import solve
from planner.search.problem import Problem, Solution, SolveResult
from planner.search.space import enumerate_candidates, outer_shapes

COMPATIBLE_SLACK = 0.05      # keep the checkpoint's layout when it is within 5 % of the best plan
MAX_SEARCH_GPUS = 1 << 17    # the upward search for the minimum stops here (131,072 GPUs)
_EPS = 1e-9


class TooFewGpus(InfeasibleError):
    """No plan on the GPUs given (exit 1); ``minimum_gpus`` is the least count, in whole nodes,
    that has one (None: none up to ``MAX_SEARCH_GPUS``, or a heterogeneous cluster)."""

    def __init__(self, message: str, minimum_gpus: int | None):
        super().__init__(message)
        self.minimum_gpus = minimum_gpus


# --------------------------------------------------------------------------------------
# The changed cluster
# --------------------------------------------------------------------------------------

def changed_cluster(cluster: ClusterSpec, *, gpus: int | None = None, lose_nodes: int | None = None,
                    add_nodes: int | None = None, group: str | None = None) -> ClusterSpec:
    """``cluster`` with ``gpus`` GPUs, or ``lose_nodes`` fewer / ``add_nodes`` more nodes (of
    ``group`` on a heterogeneous cluster). Raises ``UsageError`` with the numbers."""
    given = [k for k, v in (("--gpus", gpus), ("--lose-nodes", lose_nodes), ("--add-nodes", add_nodes))
             if v is not None]
    if len(given) > 1:
        raise UsageError(f"give one of --gpus, --lose-nodes, --add-nodes (got {', '.join(given)})")
    if gpus is not None:
        if gpus < 1:
            raise UsageError(f"--gpus must be >= 1, got {gpus}")
        try:
            return cluster.with_gpus(gpus)
        except SpecError as e:
            raise UsageError(str(e)) from None
    delta = 0
    if lose_nodes is not None:
        if lose_nodes < 1:
            raise UsageError(f"--lose-nodes must be >= 1, got {lose_nodes}")
        delta = -lose_nodes
    elif add_nodes is not None:
        if add_nodes < 1:
            raise UsageError(f"--add-nodes must be >= 1, got {add_nodes}")
        delta = add_nodes
    if delta == 0:
        return cluster
    names = [g.name for g in cluster.groups]
    if group is None:
        if len(cluster.groups) > 1:
            raise UsageError(f"cluster {cluster.name!r} has node groups {', '.join(names)}; say which with --group")
        group = names[0]
    if group not in names:
        raise UsageError(f"cluster {cluster.name!r} has no node group {group!r}; groups: {', '.join(names)}")
    groups = []
    for g in cluster.groups:
        if g.name != group:
            groups.append(g)
            continue
        n = g.nodes + delta
        if n < 0 or (n == 0 and len(cluster.groups) == 1):
            raise UsageError(f"--lose-nodes {-delta}: node group {g.name!r} has only {g.nodes} node(s)")
        if n > 0:
            groups.append(dataclasses.replace(g, nodes=n))
    return dataclasses.replace(cluster, groups=tuple(groups))


# --------------------------------------------------------------------------------------
# World sizes and bounds
# --------------------------------------------------------------------------------------

def has_shape(model, workload: Workload, gpn: int, world: int, fixed: dict | None = None) -> bool:
    """Whether some (tp, cp, pp, dp) with ``dp`` dividing the global batch uses exactly ``world``
    GPUs (``planner.search.space.outer_shapes``; the inner choices are never empty), with a fixed
    expert-parallel degree dividing ``dp * cp``."""
    fixed = fixed or {}
    ep = fixed.get("ep") if model.is_moe else None
    return any(not (ep and (dp * cp) % ep) for _, cp, _, dp in outer_shapes(model, workload, fixed, gpn, world))


def world_sizes_upto(cluster: ClusterSpec, n: int) -> list[int]:
    """GPU counts a plan may use out of ``n``, largest first: whole nodes, or part of one node
    (``ClusterSpec.with_gpus``); a heterogeneous cluster is used whole."""
    if len(cluster.groups) > 1:
        return [cluster.total_gpus]
    gpn = cluster.gpus_per_node
    if n <= gpn:
        return list(range(n, 0, -1))
    return [k * gpn for k in range(n // gpn, 1, -1)] + list(range(gpn, 0, -1))


def sized(cluster: ClusterSpec, world: int) -> ClusterSpec:
    return cluster if world == cluster.total_gpus else cluster.with_gpus(world)


def flop_bound(solution: Solution, cluster: ClusterSpec, workload: Workload, world: int) -> float:
    """A lower bound on any plan's step time on ``world`` GPUs: the model FLOPs of one step at
    the cost model's best GEMM efficiency (``costmodel.compute``: ``eff <= matmul_efficiency``,
    or the best row of a measured table; flash attention runs below it) of the fastest rate any term
    is priced at (``GpuSpec.rate``: the part's sustained rate; a measured table prices at the peak, which
    is no faster, so the bound holds under one too) on every GPU."""
    est = solution.estimate
    model_flops = est.model_tflops_per_gpu * 1e12 * est.gpus * est.step_time_s
    gpu = cluster.gpu
    e_max = max([gpu.matmul_efficiency] + [e for _, e in cluster.matmul_table])
    return model_flops * (1 - 1e-6) / (world * gpu.rate(workload.dtype) * min(1.0, e_max))


# --------------------------------------------------------------------------------------
# The replan
# --------------------------------------------------------------------------------------

@dataclass
class Replan:
    old: Plan
    cluster: ClusterSpec                  # the changed cluster (all its GPUs)
    workload: Workload
    result: SolveResult                   # the solve that produced the chosen plan
    solution: Solution
    compatible: Solution | None           # the best plan with the checkpoint's layout, if any
    best_other: Solution | None           # the best plan found with everything free
    chosen: str                           # "compatible" or "best"
    bound_s: float                        # lower bound on any plan's step time on <= N GPUs
    wall_time_s: float
    worlds_solved: list[int] = field(default_factory=list)
    worlds_pruned: int = 0
    old_step_time_s: float | None = None
    slack: float = COMPATIBLE_SLACK

    @property
    def world(self) -> int:
        return self.solution.par.world_size


def _compatible_fixed(old: Plan) -> dict[str, Any]:
    p = old.parallel
    fixed = {"tp": p.tp, "pp": p.pp, "cp": p.cp, "vpp": p.vpp}
    if old.model.is_moe:
        fixed["ep"] = p.ep
    return fixed


def old_step_time(old: Plan) -> float | None:
    """The old plan's step time under this cost model, priced with its own target's profile and
    framework settings, as the new plan is (its stored estimate if it cannot be re-estimated)."""
    from costmodel.training import estimate
    from planner.search.target_space import framework_kwargs
    try:
        return estimate(old.model, old.cluster, old.workload, old.parallel, stages=old.stages,
                        order=old.mesh_order,
                        **framework_kwargs(estimate, old.target or None, old.framework)).step_time_s
    except (SpecError, ValueError, KeyError):
        v = (old.estimate or {}).get("step_time_s")
        return float(v) if v is not None else None


def replan(old: Plan, cluster: ClusterSpec, workload: Workload | None = None, *, max_time_s: float = 60.0,
           slack: float = COMPATIBLE_SLACK) -> Replan:
    """The new plan for ``cluster`` (see the module docstring). ``workload`` defaults to the old
    plan's (same global batch)."""
    t0 = time.perf_counter()
    deadline = t0 + max_time_s
    wl = workload or old.workload
    model = old.model
    n = cluster.total_gpus
    hetero = len(cluster.groups) > 1
    gpn = cluster.gpus_per_node
    legal = [w for w in world_sizes_upto(cluster, n) if hetero or has_shape(model, wl, min(gpn, w), w)]
    # the old plan's tp and pp seed the free search: one matching candidate is solved first
    hint = {"tp": old.parallel.tp, "pp": old.parallel.pp}
    solved: list[int] = []
    pruned = 0
    timed_out = False

    def run(worlds: list[int], fixed: dict, target: float) -> SolveResult | None:
        nonlocal timed_out
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            return None
        kw = {"cutoff": target, "hint": hint} if target < math.inf else {}
        one = hetero or len(worlds) == 1
        try:
            res = solve(model, sized(cluster, worlds[0]) if one else cluster, wl, fixed, gpus=worlds[0],
                        max_time_s=left, worlds=None if one else worlds, target=old.target or None, **kw)
        except InfeasibleError:
            return None
        except SolverStopped:
            timed_out = True
            return None
        solved.extend(w for w in (res.solved_worlds or worlds[:1]) if w not in solved)
        if res.status == "FEASIBLE":
            timed_out = True
        return res

    # 1. the checkpoint's layout, at the largest world size that takes it
    fixed = _compatible_fixed(old)
    compat: Solution | None = None
    compat_res: SolveResult | None = None
    for w in legal:
        if has_shape(model, wl, min(gpn, w), w, fixed):
            compat_res = run([w], fixed, math.inf)
            compat = compat_res.solutions[0] if compat_res is not None else None
            break

    # 2. anything free: one branch and bound over every world size the FLOP bound leaves, with
    # the compatible plan (less the slack) as its cutoff, so the incumbent and the bounds of
    # one world size prune the others
    best: Solution | None = None
    best_res: SolveResult | None = None
    bound = math.inf                  # least bound on what was pruned or left unexplored
    target = compat.objective / (1 + slack) if compat else math.inf
    worlds = []
    for w in legal:
        fb = flop_bound(compat, cluster, wl, w) if compat is not None and not hetero else 0.0
        if fb >= target * (1 - _EPS):
            bound = min(bound, fb)
            pruned += 1
        else:
            worlds.append(w)
    res = run(worlds, {}, target) if worlds and not timed_out else None
    if res is not None:
        if res.status in ("CUTOFF", "FEASIBLE"):
            bound = min(bound, res.bound)
        if res.solutions:
            best, best_res = res.solutions[0], res
    pruned += len([w for w in worlds if w not in solved])

    if compat is None and best is None:
        if timed_out:
            raise SolverStopped(f"the solver stopped after {max_time_s:g} s before any plan on up to {n} GPUs; "
                                "raise --max-time")
        raise too_few(old, cluster, wl)
    if compat is not None and (best is None or compat.objective <= (1 + slack) * best.objective):
        chosen, sol, res = "compatible", compat, compat_res
    else:
        chosen, sol, res = "best", best, best_res
    found = min(s.objective for s in (compat, best) if s is not None)
    lb = min(bound, found)
    wall = time.perf_counter() - t0
    res = dataclasses.replace(res, status="FEASIBLE" if timed_out else "OPTIMAL", objective=sol.objective,
                              bound=lb, wall_time_s=wall)
    return Replan(old=old, cluster=cluster, workload=wl, result=res, solution=sol, compatible=compat,
                  best_other=best, chosen=chosen, bound_s=lb, wall_time_s=wall, worlds_solved=solved,
                  worlds_pruned=pruned, old_step_time_s=old_step_time(old), slack=slack)


# --------------------------------------------------------------------------------------
# Too few GPUs
# --------------------------------------------------------------------------------------

def minimum_gpus(model, cluster: ClusterSpec, workload: Workload, above: int,
                 max_time_s: float = 60.0, target: str | None = None) -> tuple[int | None, int]:
    """The smallest GPU count above ``above`` (whole nodes, or part of one node below a node)
    with a plan, and how far the search went (up to ``MAX_SEARCH_GPUS`` or ``max_time_s``).
    Cheap checks first (degrees that divide; some candidate whose model states fit), then a
    solve to confirm."""
    if len(cluster.groups) > 1:
        return None, above
    gpn = cluster.gpus_per_node
    t0 = time.perf_counter()
    w = (above // gpn + 1) * gpn if above >= gpn else above + 1
    searched = above
    while w <= MAX_SEARCH_GPUS and time.perf_counter() - t0 < max_time_s:
        if has_shape(model, workload, min(gpn, w), w):
            c = cluster.with_gpus(w)
            prob = Problem(model, c, workload)
            if any(bounds.lower_bound(prob, x) < math.inf
                   for x in enumerate_candidates(model, c, workload, {}, w, target=target)):
                try:
                    solve(model, c, workload, {}, gpus=w, max_time_s=max(1.0, max_time_s - (time.perf_counter() - t0)),
                          target=target)
                    return w, w
                except (InfeasibleError, SolverStopped):
                    pass
        searched = w
        w += gpn if w >= gpn else 1
    return None, searched


def too_few(old: Plan, cluster: ClusterSpec, wl: Workload) -> TooFewGpus:
    """The error for a cluster too small for any plan, with the minimum that works."""
    n = cluster.total_gpus
    what = (f"{old.model.name} (batch {wl.global_batch} x {wl.seq_len}) has no plan on {n} or fewer "
            f"{cluster.gpu.name} GPUs")
    if len(cluster.groups) > 1:
        return TooFewGpus(what + "; replan with a larger --cluster", None)
    m, searched = minimum_gpus(old.model, cluster, wl, n, target=old.target or None)
    if m is None:
        return TooFewGpus(f"{what}, nor on any count up to {searched}: use GPUs with more memory, a shorter "
                          "sequence or a smaller --global-batch", None)
    gpn = cluster.gpus_per_node
    nodes = f" ({m // gpn} nodes of {gpn})" if m >= gpn else ""
    return TooFewGpus(f"{what}; the minimum that works is {m} GPUs{nodes}: replan with --gpus {m}", m)


# --------------------------------------------------------------------------------------
# What changed, in words
# --------------------------------------------------------------------------------------

_DIMS = ("tp", "pp", "dp", "cp", "ep")


def layout_unchanged(old: Plan, new: Plan) -> bool:
    """Every rank's model shard under the new plan is one the old run held: tp, pp, cp, ep,
    virtual stages and the layers of every stage unchanged. Only data parallelism differs,
    which a load re-slices along dp. (Whether the runtime accepts the checkpoint at all -- the
    same model and workload -- is ``runtime.checkpoint.check_compatible``'s call.)"""
    a, b = old.parallel, new.parallel
    same_split = [s.num_layers for s in old.stages] == [s.num_layers for s in new.stages]
    return all(getattr(a, k) == getattr(b, k) for k in ("tp", "pp", "cp", "ep", "vpp")) and same_split


def describe_changes(old: Plan, new: Plan) -> list[str]:
    """What changes, one sentence each, the degrees first ("dp 64 -> 56, tp and pp unchanged")."""
    a, b = old.parallel, new.parallel
    out: list[str] = []
    moved = [k for k in _DIMS if getattr(a, k) != getattr(b, k)]
    kept = [k for k in ("tp", "pp") if k not in moved]
    head = ", ".join(f"{k} {getattr(a, k)} -> {getattr(b, k)}" for k in moved) or "degrees unchanged"
    if moved and kept:
        head += ", " + " and ".join(kept) + " unchanged"
    out.append(head)
    if old.world_size != new.world_size:
        out.append(f"GPUs {old.world_size} -> {new.world_size}")
    for k in ("tp", "pp", "cp", "ep"):
        if getattr(a, k) != getattr(b, k):
            out.append(f"{k} {getattr(a, k)} -> {getattr(b, k)}: the checkpoint will be resharded on load")
    if a.vpp != b.vpp:
        out.append(f"virtual stages {a.vpp} -> {b.vpp}")
    if a.pp == b.pp and [s.num_layers for s in old.stages] != [s.num_layers for s in new.stages]:
        out.append("stage split " + "/".join(str(s.num_layers) for s in old.stages) + " -> "
                   + "/".join(str(s.num_layers) for s in new.stages)
                   + ": layers move between stages, the checkpoint will be resharded on load")
    if (a.micro_batch, a.grad_accum) != (b.micro_batch, b.grad_accum):
        out.append(f"micro-batch {a.micro_batch} x gradient accumulation {a.grad_accum} -> "
                   f"{b.micro_batch} x {b.grad_accum} per replica")
    if old.workload.global_batch != new.workload.global_batch:
        out.append(f"global batch {old.workload.global_batch} -> {new.workload.global_batch}: another "
                   "workload, the runtime will not resume the old checkpoint under this plan")
    else:
        out.append(f"global batch {new.workload.global_batch} kept")
    for k, label in (("zero", "ZeRO stage"), ("recompute", "recompute"), ("sp", "sequence parallel"),
                     ("schedule", "schedule")):
        if getattr(a, k) != getattr(b, k):
            out.append(f"{label} {getattr(a, k)} -> {getattr(b, k)}")
    if old.mesh_order != new.mesh_order:
        out.append(f"mesh order {','.join(old.mesh_order)} -> {','.join(new.mesh_order)}")
    return out


__all__ = ["COMPATIBLE_SLACK", "Replan", "TooFewGpus", "too_few", "replan", "changed_cluster", "minimum_gpus", "describe_changes",
           "layout_unchanged", "world_sizes_upto", "has_shape"]
