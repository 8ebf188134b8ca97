"""The planner's solver: branch and bound over outer configurations, CP-SAT for the pipeline.

1. ``space.enumerate_candidates`` lists every legal outer configuration (degrees, ZeRO stage,
   micro-batch, virtual stages, base recompute policy, mesh order).
2. Each gets a valid lower bound on its objective from the cost model: with stage times linear
   in their layer counts, ``m*max(t) + (sum(t) - max(t))/v >= (m - 1/v) * sum(t)/p + sum(t)/v``,
   recomputation and exposed data-parallel time counted as zero.
3. Candidates are solved in increasing bound order; the search stops when the next bound is no
   better than the K-th best plan found, which proves those K optimal under the cost model.
4. Solving one candidate is a CP-SAT model (``_PipelineModel``): integer layers per stage
   ``n_i`` (contiguous blocks, summing to the model's layers), for heterogeneous clusters a
   boolean per (stage, node group) with each group's stage count, and per-stage tables from the
   cost model -- time per micro-batch, exposed data-parallel time and optimizer time at the
   least full recomputation that fits the stage's memory (``r*(i, n)``; infeasible ``n`` are cut
   from the domain). The objective is the step time, ``v*m*T + S - T + v*E + v*O`` in integer
   nanoseconds, with ``T >= t_i``, ``S = sum(t_i)``, ``E >= e_i``, ``O >= o_i``.
5. The reported numbers come from re-running the float cost model on the chosen plan.

``--exhaustive`` enumerates every stage split (and group assignment) of every candidate over
the same tables: the reference the tests hold CP-SAT to.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from costmodel.comm import group_layout, layout_for
from costmodel.layers import ends_cost, layer_cost
from costmodel.specs import ClusterSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload, default_stages
from costmodel.training import FRAGMENTATION, Estimate, estimate, inflight_microbatches, stage_model
from costmodel.units import GIB
from planner.plan.errors import InfeasibleError, SolverStopped, UsageError
from planner.search.space import Candidate, enumerate_candidates

NS = 1e9               # integer time unit of the CP-SAT model: nanoseconds
KIB = 1024             # integer memory unit for the memory objective
INFEASIBLE = None


@dataclass
class Solution:
    cand: Candidate
    objective: float                  # seconds (throughput), dollars/step (cost) or bytes (memory)
    stages: tuple[StageSpec, ...]
    estimate: Estimate
    table_objective: float = 0.0      # the same objective from the integer tables CP-SAT saw
    status: str = "OPTIMAL"

    @property
    def par(self) -> ParallelConfig:
        return self.cand.par


@dataclass
class SolveResult:
    status: str                       # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN
    solutions: list[Solution]
    objective: float | None
    bound: float | None
    wall_time_s: float
    candidates: int
    solved: int
    objective_name: str
    scored: list[dict[str, Any]] = field(default_factory=list)
    solved_worlds: list[int] = field(default_factory=list)   # GPU counts of the candidates solved

    @property
    def gap(self) -> float:
        if self.objective is None or self.bound is None or self.objective == 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


# --------------------------------------------------------------------------------------
# per-candidate stage tables
# --------------------------------------------------------------------------------------

@dataclass
class StageTables:
    """For stage i on group g and n layers: integer time, exposed DP, optimizer, memory; and r*."""

    lo: int
    hi: int
    t: dict[tuple[int, str], list]      # (stage, group) -> [value or None for n in lo..hi]
    e: dict[tuple[int, str], list]
    o: dict[tuple[int, str], list]
    mem: dict[tuple[int, str], list]
    r: dict[tuple[int, str], list]


class Problem:
    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, objective: str = "throughput",
                 price_per_gpu_hour: float | None = None):
        self.model, self.cluster, self.workload = model, cluster, workload
        self.objective = objective
        self.price = price_per_gpu_hour

    # objective scale: what one second of step time is worth
    def weight(self, cand: Candidate) -> float:
        if self.objective == "cost":
            price = self.price if self.price is not None else self.cluster.gpu.price_per_hour or 1.0
            return cand.world * price / 3600.0
        return 1.0

    def _groups(self, cand: Candidate) -> list[str]:
        return [g for g, c in cand.stage_counts if c > 0]

    def stage_model_for(self, cand: Candidate, group: str, i: int):
        p = cand.par.pp
        hetero = len(self.cluster.groups) > 1
        gpn = self.cluster.group(group).gpus_per_node
        degrees = {"pp": p, "dp": cand.par.dp, "cp": cand.par.cp, "tp": cand.par.tp}
        order = cand.order
        stride = 1
        for d in order[order.index("pp") + 1:]:
            stride *= degrees[d]
        crosses = hetero or stride >= gpn or stride * p > gpn
        return stage_model(self.model, self.cluster, self.workload, cand.par, order, group, i == 0, i == p - 1,
                           crosses and p > 1)

    def lower_bound(self, cand: Candidate) -> float:
        """A valid lower bound on the candidate's objective, or inf when it cannot fit memory."""
        par = cand.par
        p, m, v, L = par.pp, par.grad_accum, par.vpp, self.model.layers
        moe_frac = self.model.moe_layers / L
        if not self._may_fit(cand, moe_frac):
            return math.inf
        if self.objective == "memory":
            return self._memory_bound(cand, moe_frac)
        if p == 1:
            # one stage, one split: the exact objective, at the least recompute that fits
            g = self._groups(cand)[0]
            sm = self.stage_model_for(cand, g, 0)
            nd, nm = L * (1 - moe_frac), L * moe_frac
            if par.recompute == "full":
                r = L if par.recompute_layers < 0 else min(par.recompute_layers, L)
            else:
                r = self._least_recompute(sm, nd, nm, L, 1.0)
            if r is None:
                return math.inf
            c = sm.cost(nd, nm, r)
            return (m * c.t + sm.dp_exposed(c, 0) + c.opt) * self.weight(cand)
        best = math.inf
        for g in self._groups(cand):
            sms = {pos: self.stage_model_for(cand, g, i) for pos, i in
                   (("first", 0), ("mid", min(1, p - 1)), ("last", p - 1))}
            mid = sms["mid"]
            c1, c2 = mid.cost(1 - moe_frac, moe_frac, 0), mid.cost(2 - 2 * moe_frac, 2 * moe_frac, 0)
            slope = (c2.t - c2.fsdp) - (c1.t - c1.fsdp)
            if p == 1:
                c = sms["first"].cost(L * (1 - moe_frac), L * moe_frac, 0)
                s_total = c.t - c.fsdp
            else:
                cf = sms["first"].cost(1 - moe_frac, moe_frac, 0)
                cl = sms["last"].cost(1 - moe_frac, moe_frac, 0)
                intercepts = (cf.t - cf.fsdp - slope) + (cl.t - cl.fsdp - slope) + (p - 2) * (c1.t - c1.fsdp - slope)
                s_total = slope * L + intercepts
            best = min(best, s_total)
        bound = (m - 1 / v) * best / p + best / v if p > 1 else m * best
        if self.objective == "memory":
            return 0.0
        return bound * self.weight(cand)

    def compute_bound(self, members: list) -> float:
        """A bound shared by a group of candidates with the same degrees and micro-batch: the
        average stage's compute and TP/EP/CP communication for all micro-batches (the least over
        the group's mesh orders), nothing else."""
        by_order = {c.order: c for _, c in members}
        cand = next(iter(by_order.values()))
        par = cand.par
        L, p, m = self.model.layers, par.pp, par.grad_accum
        n_moe = self.model.moe_layers
        best = math.inf
        # straight from the (memoized) layer costs: building whole stage models here costs more
        # than the bound saves; the terms are exactly StageModel.cost's at r = 0
        degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
        selective = par.recompute == "selective"
        for c_ in by_order.values():
            for g in self._groups(c_):
                grp = self.cluster.group(g)
                gpn = grp.gpus_per_node
                tp_lay = group_layout(degrees, c_.order, "tp", gpn)
                cp_lay = group_layout(degrees, c_.order, "cp", gpn)
                stride = 1
                for d in c_.order[c_.order.index("dp") + 1:]:
                    stride *= degrees[d]
                ep_lay = layout_for(par.ep, stride, gpn)
                args = (self.workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch, grp.gpu, self.cluster,
                        grp.intra_node, tp_lay, ep_lay, cp_lay)
                per_stage = 0.0
                for moe, n in ((False, (L - n_moe) / p), (True, n_moe / p)):
                    if not n:
                        continue
                    lc = layer_cost(self.model, moe, *args)
                    per = 3 * lc.fwd_s + 2 * lc.tp_fwd_s + 2 * lc.ep_fwd_s + 3 * max(0.0, lc.cp_fwd_s - lc.attn_fwd_s)
                    per_stage += n * (per + (lc.selective_extra_s if selective else 0.0))
                ec = ends_cost(self.model, self.workload, par.tp, par.cp, par.sp, par.micro_batch, grp.gpu,
                               self.cluster)
                best = min(best, m * (per_stage + 3 * ec.head_fwd_s / p))
        if self.objective == "memory":
            return 0.0
        return best * self.weight(cand)

    def group_may_fit(self, members: list) -> bool:
        """Whether the group's least-memory member (highest ZeRO stage, widest shard) can hold
        its model states; when it cannot, no member can."""
        least = max((c for _, c in members), key=lambda c: (c.par.zero, c.par.dp_shard))
        return self._may_fit(least, self.model.moe_layers / self.model.layers)

    def group_bound(self, members: list) -> float:
        """``compute_bound`` with the pipeline bubble: the stages' summed time ``S`` has
        ``S/p >= cb/m``, so each member's weak bound ``(m - 1/v)*S/p + S/v`` is at least
        ``cb*(1 + (p-1)/(v*m))`` with ``v`` the group's largest virtual-stage count. Memory is
        not looked at (``group_may_fit``)."""
        par = members[0][1].par
        v = max(c.par.vpp for _, c in members)
        cb = self.compute_bound(members)
        if self.objective == "memory" or par.pp == 1:
            return cb
        return cb * (1 + (par.pp - 1) / (v * par.grad_accum))

    def strong_bound(self, cand: Candidate, weak: float, makespan: bool = False) -> float:
        """A tighter valid bound, worth its cost only for candidates near the front: the stage
        with the most layers holds at least ceil(L/p) of them, at its least recompute that fits
        (stage time grows with layers), and every other stage at least the minimum."""
        par = cand.par
        p, m, v, L = par.pp, par.grad_accum, par.vpp, self.model.layers
        if p == 1 or self.objective == "memory":
            return weak
        moe_frac = self.model.moe_layers / L
        lo = max(1, par.vpp)
        big = -(-L // p)
        t_big = t_small = math.inf
        for g in self._groups(cand):
            for i in sorted({0, max(0, p - 2), p - 1}):
                sm = self.stage_model_for(cand, g, i)
                inflight = inflight_microbatches(par, i)
                for n, slot in ((big, "big"), (lo, "small")):
                    nd, nm = n * (1 - moe_frac), n * moe_frac
                    if par.recompute == "full":
                        r = n if par.recompute_layers < 0 else min(par.recompute_layers, n)
                    else:
                        r = self._least_recompute(sm, nd, nm, n, inflight)
                    if r is None:
                        continue
                    t = sm.cost(nd, nm, r).t
                    if slot == "big":
                        t_big = min(t_big, t)
                    else:
                        t_small = min(t_small, t)
        if t_big == math.inf:
            return math.inf
        if makespan and len(self._groups(cand)) == 1:
            t_big = max(t_big, self._makespan_bound(cand, big, lo, moe_frac))
        w = self.weight(cand)
        # the weak bound's sum of stage times (no recomputation) still bounds S from below
        s_lb = weak / w / ((m - 1 / v) / p + 1 / v)
        s_lb = max(s_lb, t_big + (p - 1) * t_small)
        return max(weak, ((m - 1 / v) * t_big + s_lb / v) * w)

    def _makespan_bound(self, cand: Candidate, big: int, lo: int, moe_frac: float, width: int = 3) -> float:
        """The least T at which the stages can hold all layers: with stage times increasing in
        their layer counts, a stage within T holds at most n_i(T) layers, so sum n_i(T) >= L.
        The first and last stages (embedding, head) are counted as they are; the middle ones as
        the most favourable middle stage (the fewest micro-batches in flight). Evaluated on a
        window of layer counts around L/p; outside it, nothing is claimed."""
        par = cand.par
        p, L = par.pp, self.model.layers
        g = self._groups(cand)[0]
        n_lo = max(lo, big - width)
        ns = list(range(n_lo, big + width + 1))
        slots = [(0, 1), (p - 1, 1)] + ([(p - 2, p - 2)] if p > 2 else [])
        curves = []
        for i, count in slots:
            sm = self.stage_model_for(cand, g, i)
            inflight = inflight_microbatches(par, i)
            ts = []
            for n in ns:
                nd, nm = n * (1 - moe_frac), n * moe_frac
                if par.recompute == "full":
                    r = n if par.recompute_layers < 0 else min(par.recompute_layers, n)
                else:
                    r = self._least_recompute(sm, nd, nm, n, inflight)
                ts.append(math.inf if r is None else sm.cost(nd, nm, r).t)
            curves.append((count, ts))
        for tau in sorted({t for _, ts in curves for t in ts if t < math.inf}):
            cap = 0
            for count, ts in curves:
                fits = [n for n, t in zip(ns, ts) if t <= tau]
                if not fits:
                    if n_lo == lo:
                        cap = -1          # this stage cannot hold even the minimum within tau
                        break
                    cap += count * (n_lo - 1)   # below the window: at most n_lo - 1 layers
                    continue
                if fits[-1] == ns[-1]:
                    return tau            # could hold more than the window: no bound beyond tau
                cap += count * fits[-1]
            if cap >= L:
                return tau
        finite = [t for _, ts in curves for t in ts if t < math.inf]
        return max(finite) if finite else math.inf

    def _memory_bound(self, cand: Candidate, moe_frac: float) -> float:
        """A lower bound on the peak memory of any split, as the memory objective's tables count
        it (every layer recomputed: the least activation memory). A stage's peak grows with its
        layers, so the peak is at least (a) the fullest stage's, which holds ``ceil(L/p)`` layers
        at some position: the least over positions; (b) the first and the last stage's with the
        fewest layers a stage may hold (the embedding, the head and their in-flight
        activations)."""
        par = cand.par
        p, L = par.pp, self.model.layers
        frag = 1 + FRAGMENTATION
        big, lo = -(-L // p), max(1, par.vpp)

        def peak(g: str, i: int, n: int) -> float:
            sm = self.stage_model_for(cand, g, i)
            c = sm.cost(n * (1 - moe_frac), n * moe_frac, n)
            w, gr, op = c.states
            acts = inflight_microbatches(par, i) * (c.act_stored + c.embed_act) + c.act_fixed
            return w + gr + op + sm.reserved + c.buffers + frag * acts

        groups = self._groups(cand)
        if p == 1:
            return min(peak(g, 0, L) for g in groups)
        # each part on its own least node group: on a mixed cluster the fullest, the first and
        # the last stage may each run on another group
        fullest = min(peak(g, i, big) for g in groups for i in range(p))
        return max(fullest, min(peak(g, 0, lo) for g in groups), min(peak(g, p - 1, lo) for g in groups))

    def _may_fit(self, cand: Candidate, moe_frac: float) -> bool:
        """Necessary condition: the average stage's model states plus the fixed overheads fit
        (the fullest stage holds at least the average; recomputation cannot shrink states)."""
        par = cand.par
        L, p = self.model.layers, par.pp
        for g in self._groups(cand):
            sm = self.stage_model_for(cand, g, min(1, p - 1))
            n = L / p
            c = sm.cost(n * (1 - moe_frac), n * moe_frac, n)
            w, gr, o = c.states
            ends = (self.model.embedding_params() + self.model.vocab * self.model.hidden) / par.tp / p
            from costmodel.memory import model_state_bytes
            ends_b = model_state_bytes(ends, par.dp_shard, par.zero, self.workload.dtype, self.workload.optimizer).total
            if w + gr + o + ends_b + sm.reserved <= sm.capacity:
                return True
        return False

    def tables(self, cand: Candidate, memory_objective: bool = False, cutoff: float | None = None) -> StageTables:
        """Per stage (and node group) and layer count n: the least full recomputation r* that
        fits memory, and the stage's time, exposed DP time, optimizer time and memory there.

        A stage's cost is linear in r for r >= 1 (each recomputed layer swaps its stored
        activations for its input and adds one forward), so two cost-model calls per
        (position, n) give every stage's entry in closed form; the chosen plans are re-scored
        with the full float model afterwards.
        """
        par = cand.par
        p, L = par.pp, self.model.layers
        lo = max(1, par.vpp)
        hi = L - lo * (p - 1)
        moe_frac = self.model.moe_layers / L
        t, e, o, mem, rr = {}, {}, {}, {}, {}
        frag = 1 + FRAGMENTATION
        for g in self._groups(cand):
            rows_by_pos: dict[tuple[bool, bool], list] = {}
            for i in range(p):
                pos = (i == 0, i == p - 1)
                if pos not in rows_by_pos:
                    sm = self.stage_model_for(cand, g, i)
                    rows = []
                    for n in range(lo, hi + 1):
                        nd, nm = n * (1 - moe_frac), n * moe_frac
                        c0 = sm.cost(nd, nm, 0)
                        if cutoff is not None and par.grad_accum * c0.t > cutoff:
                            break                      # this many layers alone exceed the incumbent
                        cn = sm.cost(nd, nm, n)
                        w, gr, op = c0.states
                        rows.append((n, c0, cn, w + gr + op + sm.reserved + c0.buffers, sm.capacity))
                    rows_by_pos[pos] = (sm, rows)
                sm, rows = rows_by_pos[pos]
                inflight = inflight_microbatches(par, i)
                key = (i, g)
                tl, el, ol, ml, rl = [], [], [], [], []
                for n, c0, cn, base, cap in rows:
                    a0 = inflight * (c0.act_stored + c0.embed_act)
                    an = inflight * (cn.act_stored + cn.embed_act)
                    peak0 = base + frag * (a0 + c0.act_fixed)
                    if memory_objective or (par.recompute == "full" and par.recompute_layers < 0):
                        r = n
                    elif par.recompute == "full":
                        r = min(par.recompute_layers, n)
                    elif peak0 <= cap:
                        r = 0
                    else:
                        per = (a0 - an) / n            # memory freed per recomputed layer
                        need = base + frag * (a0 + cn.act_fixed) - cap
                        r = max(1, math.ceil(need / (frag * per) - 1e-9)) if per > 0 else n + 1
                    peak = (base + frag * (a0 + (an - a0) * r / n + (cn.act_fixed if r else c0.act_fixed))
                            if r <= n else math.inf)
                    if r > n or peak > cap:
                        tl.append(None), el.append(None), ol.append(None), ml.append(None), rl.append(None)
                        continue
                    time_r = c0.t + (cn.t - c0.t) * r / n
                    tl.append(int(round(time_r * NS)))
                    el.append(int(round(sm.dp_exposed(c0, i) * NS)))
                    ol.append(int(round(c0.opt * NS)))
                    ml.append(int(math.ceil(peak / KIB)))
                    rl.append(r)
                pad = (hi - lo + 1) - len(tl)
                for lst in (tl, el, ol, ml, rl):
                    lst.extend([None] * pad)
                t[key], e[key], o[key], mem[key], rr[key] = tl, el, ol, ml, rl
        return StageTables(lo=lo, hi=hi, t=t, e=e, o=o, mem=mem, r=rr)

    @staticmethod
    def _least_recompute(sm, nd: float, nm: float, n: int, inflight: float, allow: bool = True) -> int | None:
        """The fewest fully recomputed layers that fit the stage in memory (memory falls
        linearly in r once r > 0), or None if even full recomputation does not fit."""
        cap = sm.capacity
        c0 = sm.cost(nd, nm, 0)
        if sm.memory(c0, inflight)["peak_bytes"] <= cap:
            return 0
        c1 = sm.cost(nd, nm, 1)
        m1 = sm.memory(c1, inflight)["peak_bytes"]
        if m1 <= cap:
            return 1
        if n == 1:
            return None
        cn = sm.cost(nd, nm, n)
        mn = sm.memory(cn, inflight)["peak_bytes"]
        if mn > cap:
            return None
        per = (m1 - mn) / (n - 1)
        r = 1 + math.ceil((m1 - cap) / per - 1e-9)
        r = min(max(r, 1), n)
        while r > 1 and sm.memory(sm.cost(nd, nm, r - 1), inflight)["peak_bytes"] <= cap:
            r -= 1
        while r < n and sm.memory(sm.cost(nd, nm, r), inflight)["peak_bytes"] > cap:
            r += 1
        return r


# --------------------------------------------------------------------------------------
# CP-SAT model of one candidate's pipeline
# --------------------------------------------------------------------------------------

class _PipelineModel:
    """CP-SAT: which layer count (and node group) each stage takes, minimizing the step time.

    Variables (one family each):
      y[i, g, k]  stage i runs on group g and holds ``lo + k`` layers (boolean; exactly one per
                  stage; only the (g, k) whose table entry fits memory exist at all)
      t_i, e_i, o_i, mem_i  the stage's time per micro-batch, exposed DP time, optimizer time and
                  memory, linear in y (table lookups)
      T, E, O, M  their maxima
    Constraints: the layer counts sum to the model's layers; each group runs its number of
    stages. Costs are integer nanoseconds (``NS``) and KiB.
    """

    def __init__(self, prob: Problem, cand: Candidate, tab: StageTables, memory_objective: bool = False,
                 cutoff: float | None = None):
        self.prob, self.cand, self.tab = prob, cand, tab
        self.m = cp_model.CpModel()
        par = cand.par
        self.p, self.v, self.mb = par.pp, par.vpp, par.grad_accum
        self.groups = [g for g, c in cand.stage_counts if c > 0]
        self.counts = dict(cand.stage_counts)
        self.memory_objective = memory_objective
        self.cutoff = cutoff
        self.ok = True
        self._add_choice_vars()
        if self.ok:
            self._add_stage_costs()
            self._add_objective(cutoff)

    def _add_choice_vars(self):
        tab = self.tab
        self.y: dict[tuple[int, str, int], Any] = {}
        self.rows: list[list[tuple[str, int, Any]]] = []
        # with an incumbent, a stage whose own time already makes m*t exceed it is useless
        limit = (self.cutoff * NS / self.mb) if self.cutoff is not None and not self.memory_objective else math.inf
        for i in range(self.p):
            row = []
            for g in self.groups:
                for k, val in enumerate(tab.t[(i, g)]):
                    if val is not None and val <= limit:
                        var = self.m.new_bool_var(f"y_{i}_{g}_{tab.lo + k}")
                        self.y[i, g, k] = var
                        row.append((g, k, var))
            if not row:
                self.ok = False
                return
            self.m.add_exactly_one(v for _, _, v in row)
            self.rows.append(row)
        self.m.add(cp_model.LinearExpr.weighted_sum(list(self.y.values()), [tab.lo + k for (_, _, k) in self.y])
                   == self.prob.model.layers)
        if len(self.groups) > 1:
            for g in self.groups:
                self.m.add(sum(v for (_, gg, _), v in self.y.items() if gg == g) == self.counts[g])

    def _lin(self, table: dict, i: int):
        row = self.rows[i]
        return cp_model.LinearExpr.weighted_sum([v for _, _, v in row], [table[(i, g)][k] for g, k, _ in row])

    def _add_stage_costs(self):
        tab = self.tab

        def big(tbl):
            return max((v for lst in tbl.values() for v in lst if v is not None), default=0) + 1

        self.bigs = (big(tab.t), big(tab.e), big(tab.o), big(tab.mem))
        self.t, self.e, self.o, self.mem = [], [], [], []
        for i in range(self.p):
            for name, tbl, lst, hi in (("t", tab.t, self.t, self.bigs[0]), ("e", tab.e, self.e, self.bigs[1]),
                                       ("o", tab.o, self.o, self.bigs[2]), ("mem", tab.mem, self.mem, self.bigs[3])):
                var = self.m.new_int_var(0, hi, f"{name}_{i}")
                self.m.add(var == self._lin(tbl, i))
                lst.append(var)

    def _add_objective(self, cutoff: float | None):
        """v * step = v*m*T + (S - T) + v*E + v*O, T = max t_i, E = max e_i, O = max o_i."""
        big_t, big_e, big_o, big_m = self.bigs
        T = self.m.new_int_var(0, big_t, "T")
        E = self.m.new_int_var(0, big_e, "E")
        O = self.m.new_int_var(0, big_o, "O")
        M = self.m.new_int_var(0, big_m, "M")
        for lst, var in ((self.t, T), (self.e, E), (self.o, O), (self.mem, M)):
            for x in lst:
                self.m.add(var >= x)          # minimization makes each the maximum
        if self.memory_objective:
            self.m.add_max_equality(M, self.mem)
            obj = M
        elif self.p == 1:
            obj = self.mb * T + E + O
        else:
            obj = self.v * self.mb * T + sum(self.t) - T + self.v * E + self.v * O
        if cutoff is not None and not self.memory_objective:
            # branch and bound: only splits that beat the incumbent are of interest
            self.m.add(obj <= int(cutoff * self.v * NS) + 1)
        self.m.minimize(obj)

    def solve(self, time_limit_s: float, hint: list[int] | None = None):
        if hint and len(self.groups) == 1:
            g = self.groups[0]
            for i, n in enumerate(hint):
                for k in range(self.tab.hi - self.tab.lo + 1):
                    if (i, g, k) in self.y:
                        self.m.add_hint(self.y[i, g, k], int(self.tab.lo + k == n))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
        solver.parameters.num_workers = 1
        # the models are small (a boolean per stage and layer count); presolve costs more than
        # it saves here (measured: 10 ms against 4 ms per candidate on 70B/64 GPUs)
        solver.parameters.cp_model_presolve = False
        status = solver.solve(self.m)
        return solver, status

    def read(self, solver) -> tuple[list[int], list[str]]:
        ns, gs = [0] * self.p, [""] * self.p
        for (i, g, k), v in self.y.items():
            if solver.value(v):
                ns[i], gs[i] = self.tab.lo + k, g
        return ns, gs


def objective_value(prob: Problem, cand: Candidate, tab: StageTables, ns: list[int], gs: list[str],
                    memory_objective: bool = False) -> float | None:
    """The solver's objective for a given split, from the same integer tables (exhaustive mode
    and the tests use this)."""
    par = cand.par
    ts, es, os_, ms = [], [], [], []
    for i, (n, g) in enumerate(zip(ns, gs)):
        k = n - tab.lo
        if not 0 <= k <= tab.hi - tab.lo or tab.t[(i, g)][k] is None:
            return None
        ts.append(tab.t[(i, g)][k])
        es.append(tab.e[(i, g)][k])
        os_.append(tab.o[(i, g)][k])
        ms.append(tab.mem[(i, g)][k])
    if memory_objective:
        return float(max(ms))
    v, m = par.vpp, par.grad_accum
    if par.pp == 1:
        return (m * ts[0] + es[0] + os_[0]) / NS
    return (v * m * max(ts) + sum(ts) - max(ts) + v * max(es) + v * max(os_)) / v / NS


def _stages_from(tab: StageTables, cand: Candidate, ns: list[int], gs: list[str]) -> tuple[StageSpec, ...]:
    out, first = [], 0
    for i, (n, g) in enumerate(zip(ns, gs)):
        r = tab.r[(i, g)][n - tab.lo]
        out.append(StageSpec(first_layer=first, num_layers=n, recompute_layers=int(r),
                             group=g if len(cand.stage_counts) > 1 else ""))
        first += n
    return tuple(out)


def finalize_par(cand: Candidate, stages: tuple[StageSpec, ...]) -> ParallelConfig:
    """Record the recompute choice: all layers full -> recompute=full; else per stage."""
    par = cand.par
    if par.recompute != "full" and stages and all(s.recompute_layers == s.num_layers for s in stages):
        return dataclasses.replace(par, recompute="full", recompute_layers=-1)
    return par


# --------------------------------------------------------------------------------------
# the search
# --------------------------------------------------------------------------------------

def solve(model: ModelSpec, cluster: ClusterSpec, workload: Workload, fixed: dict, *, gpus: int | None = None,
          objective: str = "throughput", price_per_gpu_hour: float | None = None, top: int = 1,
          max_time_s: float = 60.0, exhaustive: bool = False, score_all: bool = False,
          hint: dict | None = None, cutoff: float | None = None,
          worlds: Sequence[int] | None = None) -> SolveResult:
    """Best plan(s) under the cost model; see the module docstring.

    ``hint``: ParallelConfig fields of a plan to try first (a warm start): the matching candidate
    with the least bound is solved before anything else, and its objective prunes the rest.
    ``cutoff``: an objective already achieved elsewhere; only plans better than it are of
    interest, everything whose bound is not below it is pruned. When nothing beats it the
    result has status ``CUTOFF``, no solutions, and ``bound`` the least bound left unexplored.
    ``worlds``: search plans on each of these GPU counts (at most ``gpus``) in one branch and
    bound, instead of on ``gpus`` alone; ``cluster`` is the whole cluster and each plan is
    estimated on the part of it it uses. ``SolveResult.solved_worlds`` says which were solved.
    """
    t0 = time.perf_counter()
    gpus = gpus or cluster.total_gpus
    prob = Problem(model, cluster, workload, objective, price_per_gpu_hour)
    cands = enumerate_candidates(model, cluster, workload, fixed, gpus, objective, worlds=worlds)
    mem_obj = objective == "memory"
    import heapq
    # level -1: a group of candidates sharing degrees and micro-batch, bounded by compute alone;
    # level 0: one candidate, weak bound; level 1: strong bound; then it is solved.
    groups: dict[tuple, list] = {}
    for k, c in enumerate(cands):
        p_ = c.par
        groups.setdefault((c.world,) + _group_fields(p_), []).append((k, c))
    heap = []
    hinted = []
    # a hint on the group's own fields matches a whole group or none of it
    group_level_hint = hint is not None and set(hint) <= set(_GROUP_FIELDS)
    for gk, (key, members) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0][0])):
        if hint and not (exhaustive or mem_obj) and (_matches(members[0][1], hint) if group_level_hint else
                                                     any(_matches(c, hint) for _, c in members)):
            for k, c in members:
                lb_ = prob.lower_bound(c)
                heap.append((lb_, 0, k, c))
                if _matches(c, hint) and lb_ < math.inf:
                    hinted.append((lb_, k, c))
        elif exhaustive or mem_obj:
            heap += [(prob.lower_bound(c), 1, k, c) for k, c in members]
        else:
            # the group's bound with the bubble; whether it can hold its model states at all is
            # asked only when it comes to the front (--csv scores every candidate: there a group
            # is only ordered, never cut for memory)
            gb = prob.compute_bound(members) if score_all else prob.group_bound(members)
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
    while heap:
        lb, strong, k, cand = heapq.heappop(heap)
        if lb == math.inf:
            break
        if strong == -1:
            kth = _kth(sols, top, cutoff)
            if lb >= kth * (1 - 1e-9) and not score_all:
                remaining_bound = lb
                break
            if not score_all and not prob.group_may_fit(cand):
                continue
            for kk, c in cand:
                heapq.heappush(heap, (prob.lower_bound(c), 0, kk, c))
            continue
        kth = _kth(sols, top, cutoff)
        if not exhaustive and lb >= kth * (1 - 1e-9):
            remaining_bound = lb
            if not score_all:
                break
            scored.append(_score_row(cand, lb, None, None))
            continue
        if strong < 2 and not exhaustive and lb >= 0 and cand.par.pp > 1:
            # tighten lazily: the cheap strong bound first, the makespan bound only for those
            # that still come out ahead
            heapq.heappush(heap, (prob.strong_bound(cand, lb, makespan=strong == 1), strong + 1, k, cand))
            continue
        if time.perf_counter() - t0 > max_time_s:
            timed_out = True
            remaining_bound = lb
            break
        solved += 1
        if cand.world not in solved_worlds:
            solved_worlds.append(cand.world)
        cut_s = kth / prob.weight(cand) if (kth < math.inf and not exhaustive and not mem_obj) else None
        tab = prob.tables(cand, memory_objective=mem_obj, cutoff=cut_s)
        if exhaustive:
            res = _exhaustive_one(prob, cand, tab, mem_obj)
        else:
            cut = kth / prob.weight(cand) if kth < math.inf else None
            res = _cpsat_one(prob, cand, tab, mem_obj, max(0.1, max_time_s - (time.perf_counter() - t0)), cut)
        if res is None:
            if score_all:
                scored.append(_score_row(cand, lb, None, None))
            continue
        obj, ns, gs = res
        stages = _stages_from(tab, cand, ns, gs)
        par = finalize_par(cand, stages)
        used = cluster if cand.world == cluster.total_gpus else cluster.with_gpus(cand.world)
        est = estimate(model, used, workload, par, stages=stages, order=cand.order)
        weight = prob.weight(cand)
        value = est.peak_bytes if mem_obj else est.step_time_s * weight
        sols.append(Solution(cand=Candidate(par=par, order=cand.order, stage_counts=cand.stage_counts),
                             objective=value, stages=stages, estimate=est, table_objective=obj * weight))
        if score_all:
            scored.append(_score_row(cand, lb, est, value))
    if score_all:
        scored += [_score_row(c, lb_, None, None) for lb_, _, _, c in heap]
    sols.sort(key=lambda s: s.objective)
    sols = sols[:top]
    wall = time.perf_counter() - t0
    if not sols and cutoff is not None and not timed_out:
        return SolveResult(status="CUTOFF", solutions=[], objective=None,
                           bound=remaining_bound if remaining_bound is not None else math.inf, wall_time_s=wall,
                           candidates=len(cands), solved=solved, objective_name=objective, scored=scored,
                           solved_worlds=solved_worlds)
    if not sols:
        if timed_out:
            raise SolverStopped(f"the solver stopped after {max_time_s:g} s before any feasible plan "
                                f"({solved} of {len(cands)} candidates tried); raise --max-time")
        raise InfeasibleError(_why_infeasible(prob, cands, gpus))
    best = sols[0].objective
    if timed_out:
        status = "FEASIBLE"
        bound = min(best, remaining_bound) if remaining_bound is not None else best
    else:
        status = "OPTIMAL"
        bound = best
    return SolveResult(status=status, solutions=sols, objective=best, bound=bound, wall_time_s=wall,
                       candidates=len(cands), solved=solved, objective_name=objective, scored=scored,
                       solved_worlds=solved_worlds)


# the fields a group of candidates shares (with the world size): its bound is computed once
_GROUP_FIELDS = ("tp", "cp", "pp", "dp", "ep", "sp", "micro_batch", "recompute")
_group_fields = operator.attrgetter(*_GROUP_FIELDS)


def _kth(sols: list[Solution], top: int, cutoff: float | None) -> float:
    """The objective a new plan must beat: the K-th best so far, or the outside cutoff."""
    kth = sorted(s.objective for s in sols)[top - 1] if len(sols) >= top else math.inf
    return kth if cutoff is None else min(kth, cutoff)


def _matches(cand: Candidate, hint: dict) -> bool:
    return all(getattr(cand.par, k) == v for k, v in hint.items())


def _score_row(cand: Candidate, lb: float, est: Estimate | None, value: float | None) -> dict:
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


def _cpsat_one(prob: Problem, cand: Candidate, tab: StageTables, mem_obj: bool, time_limit: float,
               cutoff: float | None = None):
    if all(all(v is None for v in lst) for lst in tab.t.values()):
        return None
    if cand.par.pp == 1:
        # one stage, nothing to split: the table is the answer
        g = prob._groups(cand)[0]
        k = tab.hi - tab.lo
        if tab.t[(0, g)][k] is None:
            return None
        ns, gs = [tab.hi], [g]
        return objective_value(prob, cand, tab, ns, gs, mem_obj), ns, gs
    pm = _PipelineModel(prob, cand, tab, mem_obj, cutoff=cutoff)
    if not pm.ok:
        return None
    even = [s.num_layers for s in default_stages(prob.model.layers, cand.par.pp)]
    solver, status = pm.solve(time_limit, hint=even)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    ns, gs = pm.read(solver)
    return objective_value(prob, cand, tab, ns, gs, mem_obj), ns, gs


def compositions(total: int, parts: int, lo: int, hi: int):
    """All (n_0, ..., n_{parts-1}) with lo <= n_i <= hi summing to total."""
    if parts == 1:
        if lo <= total <= hi:
            yield (total,)
        return
    for first in range(lo, min(hi, total - lo * (parts - 1)) + 1):
        for rest in compositions(total - first, parts - 1, lo, hi):
            yield (first,) + rest


def _exhaustive_one(prob: Problem, cand: Candidate, tab: StageTables, mem_obj: bool):
    groups = prob._groups(cand)
    counts = dict(cand.stage_counts)
    p = cand.par.pp
    if len(groups) > 1:
        assigns = {perm for perm in itertools.permutations([g for g in groups for _ in range(counts[g])])}
        assigns = sorted(assigns)
    else:
        assigns = [tuple([groups[0]] * p)]
    best = None
    for ns in compositions(prob.model.layers, p, tab.lo, tab.hi):
        for gs in assigns:
            val = objective_value(prob, cand, tab, list(ns), list(gs), mem_obj)
            if val is not None and (best is None or val < best[0]):
                best = (val, list(ns), list(gs))
    return best


def _least_memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                  cands: list[Candidate]) -> tuple[float, ParallelConfig, Estimate] | None:
    """The candidate needing the least memory per GPU when fully sharded (ZeRO-3, or no data
    parallelism) and fully recomputed, with an even split: (peak bytes, config, estimate)."""
    best = None
    for c in cands:
        if c.par.zero < 3 and c.par.dp > 1:
            continue
        full = dataclasses.replace(c.par, recompute="full", recompute_layers=-1)
        try:
            est = estimate(model, cluster, workload, full, order=c.order)
        except SpecError:
            continue
        if best is None or est.peak_bytes < best[0]:
            best = (est.peak_bytes, full, est)
    return best


def _why_infeasible(prob: Problem, cands: list[Candidate], gpus: int) -> str:
    """The binding constraint and the smallest change that would make a plan exist."""
    model, cluster, wl = prob.model, prob.cluster, prob.workload
    if not cands:
        return (f"no legal configuration of {model.name} on {gpus} GPUs with batch {wl.global_batch}: "
                "check that the global batch is divisible by a data-parallel degree and the fixed dimensions agree")
    best = _least_memory(model, cluster, wl, cands)
    if best is None:
        return f"no configuration of {model.name} fits on {gpus} GPUs"
    need, par, est = best
    hint = "; try GPUs with more memory, a shorter --seq-len or a smaller --global-batch"
    if len(cluster.groups) == 1:
        for mult in (2, 4, 8, 16, 32):
            try:
                bigger = cluster.with_gpus(gpus * mult)
                more = _least_memory(model, bigger, wl, enumerate_candidates(model, bigger, wl, {}, gpus * mult))
            except (SpecError, UsageError):
                continue
            if more is not None and more[2].fits:
                hint = f"; the smallest change: --gpus {gpus * mult} (or GPUs with more memory)"
                break
    return (f"{model.name} needs at least {need / GIB:.1f} GiB per GPU even at tp={par.tp}, pp={par.pp}, "
            f"dp={par.dp}, zero={par.zero}, full recompute, micro-batch {par.micro_batch}; "
            f"{cluster.gpu.name} has {est.capacity_bytes / GIB:.1f} GiB{hint}")
