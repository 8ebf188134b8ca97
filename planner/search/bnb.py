"""The training search: branch and bound over outer configurations, CP-SAT for the pipeline.

1. ``space.enumerate_candidates`` lists every legal outer configuration (degrees, ZeRO stage,
   micro-batch, virtual stages, base recompute policy, mesh order).
2. Each gets a valid lower bound on its objective from the cost model: with stage times linear
   in their layer counts, ``m*max(t) + (sum(t) - max(t))/v >= (m - 1/v) * sum(t)/p + sum(t)/v``,
   recomputation and exposed data-parallel time counted as zero.
3. Candidates are solved in increasing bound order; the search stops when the next bound is no
   better than the K-th best plan found, which proves those K optimal under the cost model.
4. Solving one candidate is a CP-SAT model (``cpsat.PipelineModel``): integer layers per stage
   ``n_i`` (contiguous blocks, summing to the model's layers), for heterogeneous clusters a
   boolean per (stage, node group) with each group's stage count, and per-stage tables from the
   cost model -- time per micro-batch, exposed data-parallel time and optimizer time at the
   least full recomputation that fits the stage's memory (``r*(i, n)``; infeasible ``n`` are cut
   from the domain). The objective is the step time, ``v*m*T + S - T + v*E + v*O`` in integer
   nanoseconds, with ``T >= t_i``, ``S = sum(t_i)``, ``E >= e_i``, ``O >= o_i``.
5. The reported numbers come from re-running the float cost model on the chosen plan.

``--exhaustive`` enumerates every stage split (and group assignment) of every candidate over
the same tables, pruning nothing by any bound (only its deadline stops it): the independent
reference the tests hold CP-SAT and the bounds to (``_solve_exhaustive``, ``exhaustive``).

The parts: ``space`` (candidates), ``problem`` (tables, result types), ``bounds``, ``cpsat``
(step 4), ``exhaustive``; this module is the search that ties them together.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import operator
import time
from collections.abc import Sequence

from costmodel.specs import ClusterSpec, ModelSpec, ParallelConfig, SpecError, Workload
from costmodel.training import Estimate, estimate
from costmodel.units import GIB
from planner.plan.errors import InfeasibleError, SolverStopped, UsageError
from planner.search import bounds
from planner.search.cpsat import cpsat_one
from planner.search.exhaustive import exhaustive_one
from planner.search.problem import KIB, Outcome, Problem, Solution, SolveResult, finalize_par, stages_from
from planner.search.space import (Candidate, Shape, candidate_kinds, enumerate_candidates, group_representatives,
                                   shape_candidates, shapes)
from planner.plan.targets import framework_of
from planner.search.target_space import runs, widened


def solve(model: ModelSpec, cluster: ClusterSpec, workload: Workload, fixed: dict, *, gpus: int | None = None,
          objective: str = "throughput", price_per_gpu_hour: float | None = None, top: int = 1,
          max_time_s: float = 60.0, exhaustive: bool = False, score_all: bool = False,
          hint: dict | None = None, cutoff: float | None = None,
          worlds: Sequence[int] | None = None, candidate_time_s: float | None = None,
          framework: str | None = None, target: str | None = None, lazy: bool | None = None) -> SolveResult:
    """Best plan(s) under the cost model; see the module docstring.

    ``hint``: ParallelConfig fields of a plan to try first (a warm start): the matching candidate
    with the least bound is solved before anything else, and its objective prunes the rest.
    ``cutoff``: an objective already achieved elsewhere; only plans better than it are of
    interest, everything whose bound is not below it is pruned. When nothing beats it the
    result has status ``CUTOFF``, no solutions, and ``bound`` the least bound left unexplored.
    ``worlds``: search plans on each of these GPU counts (at most ``gpus``) in one branch and
    bound, instead of on ``gpus`` alone; ``cluster`` is the whole cluster and each plan is
    estimated on the part of it it uses. ``SolveResult.solved_worlds`` says which were solved.
    ``framework``: the execution framework whose speed and memory headroom price the plans
    (``costmodel.frameworks``; default: the target's, ``generic`` without one).
    ``candidate_time_s``: CP-SAT's time limit per candidate (default: the time left of ``max_time_s``,
    which every candidate's solve and the brute force also stop at).
    ``target``: only plans that execution target runs (``planner.search.targets``); None (or
    ``generic``) searches every layout the cost model knows.
    ``lazy`` (default: with ``worlds``, a replan's search): build an outer shape's candidates only
    when the search reaches it (``_LazyShapes``); the same plans are solved in the same order,
    and ``SolveResult.candidates`` counts the candidates built, not every one.

    Status: OPTIMAL only when every candidate solved was proved and the search ended by its
    bounds. When the time limit stops the search, or any candidate's solve (CP-SAT FEASIBLE or
    UNKNOWN, a brute force cut short), it is FEASIBLE, with ``bound`` the smallest bound left
    open: the candidates not reached, and each stopped candidate's own bound.
    """
    t0 = time.perf_counter()
    gpus = gpus or cluster.total_gpus
    framework = framework or framework_of(target)
    prob = Problem(model, cluster, workload, objective, price_per_gpu_hour, framework=framework)
    mem_obj = objective == "memory"
    if lazy is None:
        lazy = worlds is not None
    lazy = (lazy and not exhaustive and not score_all and not mem_obj and (not hint or set(hint) <= _SHAPE_FIELDS)
            and (worlds is None or len(set(worlds)) == len(worlds)))
    shp = _LazyShapes(prob, fixed, gpus, worlds, target) if lazy else None
    # the plain search (no hint, the time objective, nothing scored): the candidates as kinds, each
    # group written out only when the search reaches it (``_Deferred``); else every candidate
    deferred = _DEFER and not lazy and not exhaustive and not score_all and not mem_obj and not hint
    kinds, n_kinds = candidate_kinds(model, cluster, workload, fixed, gpus, objective, worlds=worlds,
                                     target=target) if deferred else (None, 0)
    cands = None if lazy or deferred else enumerate_candidates(model, cluster, workload, fixed, gpus, objective,
                                                               worlds=worlds, target=target)
    if exhaustive:
        return _solve_exhaustive(prob, cands, gpus, top, max_time_s, cutoff, score_all, target, t0)
    # level -2 (lazy): an outer shape not built yet, bounded below every group it may hold;
    # level -1: a group of candidates sharing degrees and micro-batch, bounded by compute alone;
    # level 0: one candidate, weak bound; level 1: strong bound; then it is solved.
    heap = []
    groups: dict[tuple, list] = {}
    hinted = []

    def push_hinted(members: list, push) -> None:
        # a group the hint matches: each candidate on its own bound, the least hinted one solved first
        for k, c in members:
            lb_ = bounds.lower_bound(prob, c)
            push((lb_, 0, k, c))
            if _matches(c, hint) and lb_ < math.inf:
                hinted.append((lb_, k, c))

    if lazy:
        waiting = []         # the hint's parts, each under a bound below its candidates' own bounds
        for si in range(len(shp.shapes)):
            for mb, pb in shp.bounds(si):
                if hint and _shape_matches(shp.shapes[si], hint):
                    waiting.append((pb * (1 - _MEMBER_MARGIN), (si, mb or 0), mb))
                else:
                    heap.append((pb, -2, (si, mb or 0), (si, mb, False)))
        # the hinted candidate is the least bound of all the hint's candidates: parts in the order
        # of their bounds, until one's bound exceeds the least found (the rest wait in the heap)
        for hb, key, mb in sorted(waiting):
            if hinted and hb > min(hinted, key=lambda x: (x[0], x[1]))[0]:
                heap.append((hb, -2, key, (key[0], mb, True)))
                continue
            for _, members in shp.groups(key[0], mb):
                push_hinted(members, heap.append)
    elif deferred:
        for d in _deferred_groups(kinds):
            heap.append((bounds.group_bound(prob, d.reduced, vpp=d.vpp), -1, d.reduced[0][0], d))
    else:
        for k, c in enumerate(cands):
            groups.setdefault((c.world,) + _group_fields(c.par), []).append((k, c))
    # a hint on the group's own fields matches a whole group or none of it
    group_level_hint = hint is not None and set(hint) <= set(_GROUP_FIELDS)
    for gk, (key, members) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0][0])):
        if hint and not mem_obj and (_matches(members[0][1], hint) if group_level_hint else
                                                     any(_matches(c, hint) for _, c in members)):
            push_hinted(members, heap.append)
        elif mem_obj:
            heap += [(bounds.lower_bound(prob, c), 1, k, c) for k, c in members]
        else:
            # the group's bound with the bubble; whether it can hold its model states at all is
            # asked only when it comes to the front (--csv scores every candidate: there a group
            # is only ordered, never cut for memory)
            gb = bounds.compute_bound(prob, members) if score_all else bounds.group_bound(prob, members)
            heap.append((gb, -1, members[0][0], members))
    if hinted:
        _, k, c = min(hinted, key=lambda x: (x[0], x[1]))
        heap.append((-1.0, 2, k, c))          # solved first; its duplicate later is pruned or cheap
    heapq.heapify(heap)
    sols: list[Solution] = []
    scored: list[dict] = []
    solved = 0
    solved_worlds: list[int] = []
    timed_out = False
    remaining_bound = None
    open_bounds: list[float] = []         # bounds of the candidates whose solve stopped unproved
    while heap:
        lb, strong, k, cand = heapq.heappop(heap)
        if lb == math.inf:
            if score_all:                 # it cannot fit: scored as unsolved like the rest of the heap
                scored += [_score_row(c, lb, None, None) for _, c in cand] if strong == -1 else \
                    [_score_row(cand, lb, None, None)]
            break
        if strong == -2:
            if lb >= _kth(sols, top, cutoff) * (1 - 1e-9):
                remaining_bound = lb
                break
            si, mb, hint_shape = cand
            for _, members in shp.groups(si, mb):
                if hint_shape:
                    push_hinted(members, lambda e: heapq.heappush(heap, e))
                else:
                    heapq.heappush(heap, (bounds.group_bound(prob, members), -1, members[0][0], members))
            continue
        if strong == -1:
            kth = _kth(sols, top, cutoff)
            if lb >= kth * (1 - 1e-9) and not score_all:
                remaining_bound = lb
                break
            if isinstance(cand, _Deferred):
                if not bounds.group_may_fit(prob, cand.fit_members()):
                    continue
                cand = cand.members()
            elif not score_all and not bounds.group_may_fit(prob, cand):
                continue
            for kk, c in cand:
                heapq.heappush(heap, (bounds.lower_bound(prob, c), 0, kk, c))
            continue
        kth = _kth(sols, top, cutoff)
        if lb >= kth * (1 - 1e-9):
            remaining_bound = lb
            if not score_all:
                break
            scored.append(_score_row(cand, lb, None, None))
            continue
        if strong < 2 and lb >= 0 and cand.par.pp > 1:
            # tighten lazily: the cheap strong bound first, the makespan bound only for those
            # that still come out ahead
            heapq.heappush(heap, (bounds.strong_bound(prob, cand, lb, makespan=strong == 1), strong + 1, k, cand))
            continue
        if time.perf_counter() - t0 > max_time_s:
            timed_out = True
            remaining_bound = lb
            break
        solved += 1
        if cand.world not in solved_worlds:
            solved_worlds.append(cand.world)
        cut_s = kth / prob.weight(cand) if (kth < math.inf and not mem_obj) else None
        tab = prob.tables(cand, memory_objective=mem_obj, cutoff=cut_s)
        left = max_time_s - (time.perf_counter() - t0)
        if left <= 0:
            out = Outcome(None, proved=False)      # the tables took the time that was left
        else:
            cut = kth / prob.weight(cand) if kth < math.inf else None
            limit = left if candidate_time_s is None else min(left, candidate_time_s)
            out = cpsat_one(prob, cand, tab, mem_obj, limit, cut)
        if not out.proved:
            own = -math.inf
            if out.bound is not None:      # CP-SAT's bound, from table units to the objective's
                own = (out.bound - 1) * KIB if mem_obj else out.bound * prob.weight(cand)
            open_bounds.append(max(0.0, lb, own))
        if out.split is None:
            if score_all:
                scored.append(_score_row(cand, lb, None, None))
            continue
        sol = _solution(prob, cand, tab, out.split)
        sols.append(sol)
        if score_all:
            scored.append(_score_row(cand, lb, sol.estimate, sol.objective))
    if score_all:
        for lb_, level, _, c in heap:
            scored += [_score_row(x, lb_, None, None) for _, x in c] if level == -1 else [_score_row(c, lb_, None, None)]
    sols.sort(key=lambda s: s.objective)
    sols = sols[:top]
    wall = time.perf_counter() - t0
    stopped = timed_out or bool(open_bounds)
    n_cands = shp.built if lazy else n_kinds if deferred else len(cands)
    if not sols and cutoff is not None and not stopped:
        return SolveResult(status="CUTOFF", solutions=[], objective=None,
                           bound=remaining_bound if remaining_bound is not None else math.inf, wall_time_s=wall,
                           candidates=n_cands, solved=solved, objective_name=objective, scored=scored,
                           solved_worlds=solved_worlds)
    if not sols:
        if stopped:
            raise SolverStopped(f"the solver stopped after {max_time_s:g} s before any feasible plan "
                                f"({solved} of {n_cands} candidates tried, {len(open_bounds)} of them cut "
                                "short by the time limit); raise --max-time")
        if lazy or deferred:            # the reason looks at every candidate
            cands = enumerate_candidates(model, cluster, workload, fixed, gpus, objective, worlds=worlds, target=target)
        raise InfeasibleError(_why_infeasible(prob, cands, gpus, target, fixed))
    best = sols[0].objective
    if stopped:
        status = "FEASIBLE"
        left_open = open_bounds + ([remaining_bound] if timed_out and remaining_bound is not None else [])
        bound = min([best] + left_open)
    else:
        status = "OPTIMAL"
        bound = best
    return SolveResult(status=status, solutions=sols, objective=best, bound=bound, wall_time_s=wall,
                       candidates=n_cands, solved=solved, objective_name=objective, scored=scored,
                       solved_worlds=solved_worlds, stopped=len(open_bounds))


def _solution(prob: Problem, cand: Candidate, tab, split: tuple[float, list[int], list[str]]) -> Solution:
    """A candidate's split as a plan, re-scored with the float cost model."""
    obj, ns, gs = split
    cluster = prob.cluster
    stages = stages_from(tab, cand, ns, gs)
    par = finalize_par(cand, stages)
    used = cluster if cand.world == cluster.total_gpus else cluster.with_gpus(cand.world)
    est = estimate(prob.model, used, prob.workload, par, stages=stages, order=cand.order, framework=prob.framework)
    weight = prob.weight(cand)
    value = est.peak_bytes if prob.objective == "memory" else est.step_time_s * weight
    return Solution(cand=dataclasses.replace(cand, par=par), objective=value, stages=stages, estimate=est,
                    table_objective=obj * weight)


def _solve_exhaustive(prob: Problem, cands: list[Candidate], gpus: int, top: int, max_time_s: float,
                      cutoff: float | None, score_all: bool, target: str | None, t0: float) -> SolveResult:
    """``--exhaustive``: every candidate, every split (``exhaustive_one``), on tables built without
    an incumbent's cutoff; no bound prunes anything, so it is the reference the bounds and CP-SAT
    are tested against. Only the deadline stops it; then it is FEASIBLE with bound 0 (no bound
    is consulted, so nothing better is known about what it did not reach)."""
    mem_obj = prob.objective == "memory"
    sols: list[Solution] = []
    scored: list[dict] = []
    solved, solved_worlds = 0, []
    stopped = 0
    timed_out = False
    deadline = t0 + max_time_s
    for cand in cands:
        if time.perf_counter() > deadline:
            timed_out = True
            break
        solved += 1
        if cand.world not in solved_worlds:
            solved_worlds.append(cand.world)
        tab = prob.tables(cand, memory_objective=mem_obj)
        out = exhaustive_one(prob, cand, tab, mem_obj, deadline=deadline)
        if not out.proved:
            stopped += 1
        sol = _solution(prob, cand, tab, out.split) if out.split is not None else None
        if sol is not None:
            sols.append(sol)
        if score_all:
            scored.append(_score_row(cand, None, sol.estimate if sol else None, sol.objective if sol else None))
    if cutoff is not None:
        sols = [s for s in sols if s.objective < cutoff]
    sols.sort(key=lambda s: s.objective)
    sols = sols[:top]
    wall = time.perf_counter() - t0
    unfinished = timed_out or stopped > 0
    if not sols and cutoff is not None and not unfinished:
        return SolveResult(status="CUTOFF", solutions=[], objective=None, bound=cutoff, wall_time_s=wall,
                           candidates=len(cands), solved=solved, objective_name=prob.objective, scored=scored,
                           solved_worlds=solved_worlds)
    if not sols:
        if unfinished:
            raise SolverStopped(f"the solver stopped after {max_time_s:g} s before any feasible plan "
                                f"({solved} of {len(cands)} candidates tried, {stopped} of them cut "
                                "short by the time limit); raise --max-time")
        raise InfeasibleError(_why_infeasible(prob, cands, gpus, target))
    best = sols[0].objective
    return SolveResult(status="FEASIBLE" if unfinished else "OPTIMAL", solutions=sols, objective=best,
                       bound=0.0 if unfinished else best, wall_time_s=wall, candidates=len(cands), solved=solved,
                       objective_name=prob.objective, scored=scored, solved_worlds=solved_worlds,
                       stopped=stopped + (len(cands) - solved))


# the fields a group of candidates shares (with the world size): its bound is computed once
_GROUP_FIELDS = ("tp", "cp", "pp", "dp", "ep", "etp", "sp", "micro_batch", "recompute", "moe_dispatcher", "ep_overlap")
_group_fields = operator.attrgetter(*_GROUP_FIELDS)
_SHAPE_FIELDS = {"tp", "cp", "pp", "dp"}        # what an outer shape fixes (``space.Shape``)
# A candidate's weak bound (``bounds.lower_bound``) is at least its group's bound
# (``bounds.group_bound``'s docstring derives it) but is computed along another path: a shape
# the hint matches waits under its bound less this relative margin for the rounding.
_MEMBER_MARGIN = 1e-6


assert _GROUP_FIELDS[-2:] == ("moe_dispatcher", "ep_overlap")       # a kind's pair sets these two
_DEFER = True        # False: every candidate written out first (the tests' reference)


class _Deferred:
    """A group of candidates (``_GROUP_FIELDS``) not written out yet: its slices, each one kind's
    candidates with one MoE execution pair (``space.Kind.members``), in the search's order.
    ``reduced`` is the group's first member and its last of each mesh order (in the order the
    orders first appear), ``vpp`` its largest virtual-stage count: what ``bounds.group_bound``
    reads of the whole group (of a member, its configuration, mesh order and stages per node
    group; the split fields are left at their defaults, ``Kind.bound_member``); ``fit_members``
    its first member of each ZeRO stage and shard width: what ``bounds.group_may_fit`` reads.
    tests/test_deferred_groups.py holds each equal to the written-out group's."""
    __slots__ = ("slices", "_reduced", "vpp")

    def __init__(self):
        self.slices: list = []
        self._reduced = None
        self.vpp = 0

    @property
    def reduced(self) -> list:
        if self._reduced is None:
            last: dict = {}
            first = None
            for kind, pair in self.slices:
                rows = kind.layout[0]
                for r, (_, order, p, n) in enumerate(rows):
                    if p == pair and n:
                        if first is None:
                            first = kind.bound_member(0, r)
                        last[order] = (kind, r, n)
            self._reduced = [first]
            for k, r, n in last.values():
                at, c = k.bound_member(len(k.Ns) - 1, r)
                self._reduced.append((at + n - 1, c))        # the row's last split: the same configuration
        return self._reduced

    def fit_members(self) -> list:
        seen: dict = {}
        for kind, pair in self.slices:
            key = (kind.par.zero, kind.par.dp_shard)
            if key not in seen:
                rows = kind.layout[0]
                r = next(i for i, (_, _, p, n) in enumerate(rows) if p == pair and n)
                seen[key] = kind.member(0, r, 0)
        return list(seen.values())

    def members(self) -> list:
        return [m for kind, pair in self.slices for m in kind.members(pair)]


def _deferred_groups(kinds: list) -> list[_Deferred]:
    """The groups ``solve`` forms of ``enumerate_candidates`` (world size and ``_GROUP_FIELDS``),
    from the kinds, none written out: in the order of their first members."""
    groups: dict[tuple, _Deferred] = {}
    for kind in kinds:
        base = (kind.par.world_size,) + _group_fields(kind.par)
        done = set()
        for pairs in kind.pairs:
            for pair in pairs:
                if pair in done:
                    continue
                done.add(pair)
                if not any(p == pair and n for _, _, p, n in kind.layout[0]):
                    continue
                key = base if pair is None else base[:-2] + pair
                d = groups.get(key)
                if d is None:
                    d = groups[key] = _Deferred()
                d.slices.append((kind, pair))
                d.vpp = max(d.vpp, kind.par.vpp)
    return sorted(groups.values(), key=lambda d: d.reduced[0][0])


def _shape_matches(shape: Shape, hint: dict) -> bool:
    return all(getattr(shape, k) == v for k, v in hint.items())


class _LazyShapes:
    """The search space as outer shapes (``space.shapes``), each built (``space.shape_candidates``,
    where the target's rules are asked) only when the search pops it.

    A shape waits in the heap at level -2 in parts, one per micro-batch (the outermost choice of
    ``space._inner``: a part's candidates are a contiguous block of the shape's), each under
    the least ``bounds.group_bound`` over ``space.group_representatives`` of that micro-batch:
    one configuration per group the part may hold, with every mesh order it may take and its
    largest virtual-stage count. A group's bound reads only the fields the group shares and the
    mesh order (``stage_cache.stage_compute_time``; of the recompute policy only whether it is
    selective, which only adds a time) and falls with more orders and a larger virtual-stage
    count, so this is at most the bound of each group the part holds, in the same
    floating-point operations. Candidate keys are ``(shape index, micro-batch, index)``, which
    sort as ``enumerate_candidates``' indices do (micro-batches ascend): each group enters the
    heap before anything above its bound leaves it, so the heap yields the groups and
    candidates in the eager order (tests/test_lazy_search.py compares the two, and checks the
    bound on every group)."""

    def __init__(self, prob: Problem, fixed: dict, gpus: int, worlds, target):
        self.prob, self.fixed, self.target = prob, fixed, target
        self.shapes = shapes(prob.model, prob.cluster, prob.workload, fixed, gpus, prob.objective, worlds=worlds)
        self.built = 0
        self.rules: dict = {}        # each shape's rules, kept between its micro-batches (space.shape_candidates)

    def bounds(self, si: int) -> list[tuple[int | None, float]]:
        """Shape ``si``'s parts, one per micro-batch, each with a bound below every group it
        holds: ``(micro_batch, bound)``; none when the shape has no candidates, and
        ``[(None, 0.0)]`` (the whole shape, built first) when a representative failed
        ``ParallelConfig``'s checks."""
        prob = self.prob
        reps = group_representatives(prob.model, prob.workload, self.fixed, self.shapes[si], self.target)
        if reps is None:
            return [(None, 0.0)]
        out: dict[int, float] = {}
        for rep in reps:
            mb = rep[0].par.micro_batch
            b = bounds.group_bound(prob, [(0, c) for c in rep])
            out[mb] = min(out.get(mb, math.inf), b)
        return sorted(out.items())

    def groups(self, si: int, mb: int | None) -> list[tuple[tuple, list]]:
        """The candidates of shape ``si`` with micro-batch ``mb`` (None: all) in groups, each
        ``(key, [(key, candidate), ...])``, in order; a candidate's key is ``(si, its
        micro-batch, its index)``, which sorts as its index in ``enumerate_candidates``."""
        prob = self.prob
        cands = shape_candidates(prob.model, prob.workload, self.fixed, self.shapes[si], self.target, mb, self.rules)
        self.built += len(cands)
        out: dict[tuple, list] = {}
        for j, c in enumerate(cands):
            out.setdefault((c.world,) + _group_fields(c.par), []).append(((si, c.par.micro_batch, j), c))
        return list(out.items())


def _kth(sols: list[Solution], top: int, cutoff: float | None) -> float:
    """The objective a new plan must beat: the K-th best so far, or the outside cutoff."""
    kth = sorted(s.objective for s in sols)[top - 1] if len(sols) >= top else math.inf
    return kth if cutoff is None else min(kth, cutoff)


def _matches(cand: Candidate, hint: dict) -> bool:
    return all(getattr(cand.par, k) == v for k, v in hint.items())


def _score_row(cand: Candidate, lb: float | None, est: Estimate | None, value: float | None) -> dict:
    row = {k: getattr(cand.par, k) for k in ("tp", "pp", "dp", "cp", "ep", "zero", "dp_shard", "sp", "vpp",
                                             "micro_batch", "grad_accum", "recompute", "schedule")}
    row["mesh_order"] = ",".join(cand.order)
    row["lower_bound"] = lb
    row["solved"] = est is not None
    row["objective"] = value
    if est is not None:
        row.update(step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s, mfu=est.mfu,
                   peak_bytes=est.peak_bytes, fits=est.fits, **est.time)
    return row


def _least_memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                  cands: list[Candidate], framework: str = "generic",
                  target: str | None = None, fixed: dict | None = None) -> tuple[float, ParallelConfig, Estimate] | None:
    """The candidate needing the least memory per GPU when fully sharded (ZeRO-3, or no data
    parallelism) and fully recomputed, with an even split: (peak bytes, config, estimate)."""
    best = None
    if widened(target):
        # the target may shard less than ZeRO-3: its most sharded shape of each degree tuple
        most: dict = {}
        for c in cands:
            key = (c.par.tp, c.par.pp, c.par.dp, c.par.cp, c.par.ep, c.par.etp, c.par.micro_batch, c.order)
            if key not in most or (c.par.zero, -c.par.dp_shard) > (most[key].par.zero, -most[key].par.dp_shard):
                most[key] = c
        cands = list(most.values())
    for c in cands:
        if not widened(target) and c.par.zero < 3 and c.par.dp > 1:
            continue
        # full recompute needs the least memory, unless the user fixed the recompute policy
        full = c.par if "recompute" in (fixed or {}) else dataclasses.replace(c.par, recompute="full",
                                                                              recompute_layers=-1)
        if widened(target) and not runs(target, model, workload, full, c.order):
            full = c.par                      # the target has no full recompute here
        try:
            est = estimate(model, cluster, workload, full, order=c.order, framework=framework)
        except SpecError:
            continue
        if best is None or est.peak_bytes < best[0]:
            best = (est.peak_bytes, full, est)
    return best


def accepted_gpu_counts(cluster, above: int, limit: int) -> list[int]:
    """The ``--gpus`` values above ``above`` (up to ``limit``) that ``cluster`` accepts
    (``ClusterSpec.with_gpus``: part of one host, or whole hosts), in increasing order."""
    per = cluster.groups[0].gpus_per_node
    out = set(range(above + 1, min(per, limit + 1)))
    out |= {k * per for k in range(1, limit // per + 1)}
    return sorted(n for n in out if n > above)


def _as_written(cluster):
    """The cluster as its catalog entry has it: ``with_gpus`` shrinks a cluster asked for less
    than one host to one host of that many, which no larger count fits."""
    from costmodel.files.clusters import cluster_names, load_cluster
    if len(cluster.groups) == 1 and cluster.name in cluster_names():
        full = load_cluster(cluster.name)
        if len(full.groups) == 1 and full.groups[0].gpu == cluster.groups[0].gpu:
            return full
    return cluster


# An uneven stage split can lower the fullest stage below the even split's only by moving a few
# layers (the fullest stage of any split holds at least the average): the least-memory even split
# needing more than this factor of the capacity leaves no plan, and is not searched.
_NEAR_FIT = 1.5
_HINTING: list[bool] = []       # set while a hint's own searches run: they give no hints of their own


def smallest_fitting_gpus(prob: Problem, gpus: int, target: str | None = None, factor: int = 32) -> int | None:
    """The smallest GPU count above ``gpus`` (one the cluster accepts, up to ``factor`` x) at which
    a plan exists: the ``--gpus`` an infeasibility hint suggests. A count where the least-memory
    configuration fits has one; one where it fits within ``_NEAR_FIT`` is searched (the target's
    stage splits may fit where the even split does not)."""
    model, wl = prob.model, prob.workload
    base = _as_written(prob.cluster)
    for n in accepted_gpu_counts(base, gpus, gpus * factor):
        try:
            bigger = base.with_gpus(n)
            more = _least_memory(model, bigger, wl, enumerate_candidates(model, bigger, wl, {}, n, target=target),
                                 prob.framework, target)
        except (SpecError, UsageError):
            continue
        if more is None:
            continue
        if more[2].fits:
            return n
        if more[0] <= _NEAR_FIT * more[2].capacity_bytes and _plans_at(prob, bigger, n, target):
            return n
    return None


def _plans_at(prob: Problem, cluster: ClusterSpec, n: int, target: str | None) -> bool:
    """Whether the search finds a plan on ``n`` GPUs (no hint of its own; a short time limit)."""
    _HINTING.append(True)
    try:
        solve(prob.model, cluster, prob.workload, {}, gpus=n, max_time_s=20.0, framework=prob.framework,
              target=target)
        return True
    except (InfeasibleError, SolverStopped, SpecError, UsageError):
        return False
    finally:
        _HINTING.pop()


def _why_infeasible(prob: Problem, cands: list[Candidate], gpus: int, target: str | None = None,
                    fixed: dict | None = None) -> str:
    """The binding constraint and the smallest change that would make a plan exist."""
    model, cluster, wl = prob.model, prob.cluster, prob.workload
    if not cands:
        if widened(target):
            from planner.search.refusal import why_no_candidate
            return why_no_candidate(model, cluster, wl, gpus, target, fixed)
        return (f"no legal configuration of {model.name} on {gpus} GPUs with batch {wl.global_batch}: "
                "check that the global batch is divisible by a data-parallel degree and the fixed dimensions agree")
    best = _least_memory(model, cluster, wl, cands, prob.framework, target, fixed)
    if best is None:
        return f"no configuration of {model.name} fits on {gpus} GPUs"
    need, par, est = best
    hint = "; try GPUs with more memory, a shorter --seq-len or a smaller --global-batch"
    if len(cluster.groups) == 1:
        more_gpus = None if _HINTING else smallest_fitting_gpus(prob, gpus, target)
        if more_gpus is not None:
            hint = f"; the smallest change: --gpus {more_gpus} (or GPUs with more memory)"
    degrees = ", ".join(f"{k}={getattr(par, k)}" for k in ("tp", "pp", "dp", "cp", "ep")
                        if k in ("tp", "pp", "dp") or getattr(par, k) > 1)
    if est.fits:
        # the least-memory shape fits with an even split: what binds is the stage split (a stage's peak)
        return (f"{model.name} fits at {degrees}, zero={par.zero}, {par.recompute} "
                f"recompute, micro-batch {par.micro_batch} with an even split ({need / GIB:.1f} of "
                f"{est.capacity_bytes / GIB:.1f} GiB per GPU), but no stage split the search may use fits"
                + (f" under {target}'s split rule" if widened(target) else "")
                + "; try --target megatron (any split) or more GPUs")
    return (f"{model.name} needs at least {need / GIB:.1f} GiB per GPU even at {degrees}, "
            f"zero={par.zero}, {par.recompute} recompute, micro-batch {par.micro_batch}"
            + (f" (the most {target} can shard)" if widened(target) else "") + "; "
            f"{cluster.gpu.name} has {est.capacity_bytes / GIB:.1f} GiB{hint}")
