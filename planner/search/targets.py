"""The search for one execution target: which candidates a target can run, and what its table
does to the stage split.

``space.enumerate_candidates(..., target=T)`` asks this module for the choices a target widens
(ZeRO-0 where ZeRO-1 is not what runs, sequence parallel off where the target has none, GPipe
where torch's 1F1B needs more micro-batches than there are, whole-model full recompute and
Megatron's uniform ``--recompute-num-layers N`` where a stage cannot pick its own count) and
keeps only those ``planner.plan.targets.config_problems`` accepts. Each candidate carries its
target's split rule (``Candidate.split``, ``stage_recompute``, ``least_layers``), which the
stage tables, the CP-SAT model and the brute force obey. Of two candidates that differ only in
a choice the cost model prices identically or worse (ZeRO-0 against ZeRO-1, plain TP against
sequence parallel, GPipe against 1F1B), the dominated one is dropped, as the space does for the
generic target.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence

from costmodel.specs import ModelSpec, ParallelConfig, Workload
from planner.plan import targets as T


def widened(target: str | None) -> bool:
    return bool(target) and target != T.GENERIC


def zero_choices(target: str, dp: int, cp: int) -> list[int]:
    return [0, 1, 2, 3] if dp * cp > 1 else [1]


def sp_choices(target: str, tp: int) -> list[bool]:
    return [True, False] if tp > 1 else [False]


def schedule_choices(target: str, pp: int, vpp: int) -> list[str]:
    if vpp > 1:
        return ["interleaved"]
    return ["1f1b", "gpipe"] if pp > 1 else ["1f1b"]


def recompute_choices(target: str, model: ModelSpec, pp: int, vpp: int, fixed: dict) -> list[tuple[str, int]]:
    """``(recompute, recompute_layers)`` policies to try: the target's whole-model policies, and
    with Megatron's block method every uniform count N a stage split can hold (N a multiple of
    vpp; N below ``layers / pp``: at ``layers / pp`` every layer would recompute)."""
    t = T.get(target)
    pols = set()
    for sub in [s for _, _, s in t.variants] or [t]:
        pols |= sub.recompute
    block = any(s.recompute_block and not s.recompute_per_stage for s in [x for _, _, x in t.variants] or [t])
    if "recompute" in fixed:
        bases = [fixed["recompute"]]
    elif t.recompute_per_stage:
        bases = [b for b in ("none", "selective") if b in pols]
    else:
        bases = [b for b in ("none", "selective", "full") if b in pols]
    out: list[tuple[str, int]] = []
    for b in bases:
        if b != "full":
            out.append((b, -1))
            continue
        if "recompute_layers" in fixed:
            out.append(("full", fixed["recompute_layers"]))
            continue
        out.append(("full", -1))
        if block and pp > 1:            # one stage picks its own count: split_of
            step = vpp if vpp > 1 else 1
            top = model.layers // pp - (1 if model.layers % pp == 0 else 0) if pp > 1 else model.layers - 1
            out += [("full", n) for n in range(step, top + 1, step)]
    return out


# (position in the search's choice key, the dominated value, the value that dominates it)
_DOMINATED = ((3, 0, 1), (5, False, True), (7, "gpipe", "1f1b"))


def prune_dominated(found: list[tuple[tuple, ParallelConfig]]) -> list[tuple[tuple, ParallelConfig]]:
    """Drop a configuration when the one that differs only by the better choice is also there.
    ``found`` holds ``(key, config)`` with the key ``(micro_batch, ep, etp, zero, dp_shard, sp, vpp,
    schedule, recompute, recompute_layers, order)`` of ``space._inner``."""
    present = {k for k, _ in found}
    out = []
    for k, par in found:
        if any(k[i] == worse and (k[:i] + (better,) + k[i + 1:]) in present for i, worse, better in _DOMINATED):
            continue
        out.append((k, par))
    return out


def folds_experts(target: str | None) -> bool:
    """Whether the target runs MoE parallel folding (``TrainTarget.expert_fold``: expert TP apart
    from TP, EP over tp x cp x dp), so the search offers it."""
    return widened(target) and T.get(target).expert_fold


def runs(target: str, model: ModelSpec, workload: Workload, par: ParallelConfig, order: tuple) -> bool:
    return not T.config_problems(target, model, workload, par, order)


def split_of(target: str, par: ParallelConfig, fixed: dict | None = None) -> dict:
    """The Candidate fields that carry the target's split rule (``--recompute-layers 0`` without
    full recompute: no stage recomputes on its own either)."""
    split, per_stage, least = T.split_rule(target, par)
    uniform = False
    if not per_stage and par.pp == 1 and par.recompute == "none" and _has_block(target, par):
        per_stage = uniform = True          # one stage: its count is the uniform N (finalize_par)
    if fixed and fixed.get("recompute_layers") == 0 and par.recompute != "full":
        per_stage = uniform = False
    return {"split": split, "stage_recompute": per_stage, "least_layers": least, "uniform_recompute": uniform}


def _has_block(target: str, par: ParallelConfig) -> bool:
    t = T.get(target).for_config(par)
    return t.recompute_block and "full" in t.recompute


@functools.lru_cache(maxsize=None)
def _takes_framework(fn) -> bool:
    try:
        return "framework" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def framework_kwargs(fn, target: str | None) -> dict:
    """``{"framework": profile}`` for a cost-model function (``estimate``, ``stage_model``,
    ``Problem``) that prices a target's framework (``costmodel.frameworks``); ``{}`` for the
    generic target or a function that takes no framework."""
    if not widened(target) or not _takes_framework(fn):
        return {}
    return {"framework": T.framework_of(target)}


def why_no_candidate(model: ModelSpec, cluster, workload: Workload, gpus: int, target: str) -> str:
    """Why target ``target`` runs none of the configurations the cost model knows: the problems
    every one of them has (``MLA``, a dtype), else the most frequent ones."""
    from collections import Counter

    from planner.search.space import enumerate_candidates
    cands = enumerate_candidates(model, cluster, workload, {}, gpus)
    if not cands:
        return (f"no legal configuration of {model.name} on {gpus} GPUs with batch {workload.global_batch}: "
                "check that the global batch is divisible by a data-parallel degree")
    seen: Counter = Counter()
    for c in cands:
        seen.update(dict.fromkeys(T.config_problems(target, model, workload, c.par, c.order), 1))
    common = [m for m, k in seen.most_common() if k == len(cands)]
    shown = common or [m for m, _ in seen.most_common(3)]
    return (f"{target} runs none of the {len(cands)} configurations of {model.name} on {gpus} GPUs: "
            + "; ".join(shown))


# --------------------------------------------------------------------------------------
# Solving for a target, and for every target
# --------------------------------------------------------------------------------------

def clusters_for(cluster, target: str | None) -> list:
    """The clusters a target's plan may use: the whole cluster, or, for a target that launches
    one kind of node on a cluster of several node groups, each group on its own (named
    ``cluster:group``)."""
    if not widened(target) or len(cluster.groups) == 1 or T.get(target).heterogeneous:
        return [cluster]
    return [dataclasses.replace(cluster, name=f"{cluster.name}:{g.name}", groups=(g,)) for g in cluster.groups]


@dataclasses.dataclass
class TargetResult:
    """One target's solve: its result and the cluster (or node group) its plans use, or why
    there is no plan (``error``, with the exit code it would have on its own)."""
    target: str
    result: object | None            # planner.search.problem.SolveResult
    cluster: object | None
    error: str = ""
    exit_code: int = 0


def solve_target(model: ModelSpec, cluster, workload: Workload, fixed: dict, target: str | None,
                 **kw) -> tuple[object, object]:
    """``bnb.solve`` for one target: ``(SolveResult, cluster used)``. A target that launches one
    kind of node is solved on each node group of a mixed cluster, and the best group kept."""
    from planner.plan.errors import InfeasibleError, SolverStopped
    from planner.search.bnb import solve
    subs = clusters_for(cluster, target)
    if len(subs) == 1:
        return solve(model, cluster, workload, fixed, target=target, **{"gpus": cluster.total_gpus, **kw}), cluster
    best, errors = None, []
    for sub in subs:
        try:
            res = solve(model, sub, workload, fixed, target=target, **{**kw, "gpus": sub.total_gpus})
        except (InfeasibleError, SolverStopped) as e:
            errors.append((sub.name, e))
            continue
        if best is None or res.objective < best[0].objective:
            best = (res, sub)
    if best is None:
        first = errors[0][1]
        msg = "; ".join(f"on {name}: {e}" for name, e in errors)
        raise type(first)(f"{target} launches one kind of node, and no node group has a plan ({msg})")
    return best


def solve_all(model: ModelSpec, cluster, workload: Workload, fixed: dict, targets: Sequence[str],
              **kw) -> list[TargetResult]:
    """One solve per target; the results best first (targets without a plan last)."""
    from planner.plan.errors import InfeasibleError, SolverStopped
    out = []
    for t in targets:
        try:
            res, used = solve_target(model, cluster, workload, fixed, t, **kw)
            out.append(TargetResult(t, res, used))
        except (InfeasibleError, SolverStopped) as e:     # bad input is every target's: it propagates
            out.append(TargetResult(t, None, None, str(e), e.exit_code))
    order = {t: i for i, t in enumerate(targets)}
    out.sort(key=lambda r: (r.result is None, r.result.objective if r.result else 0.0, order[r.target]))
    return out
