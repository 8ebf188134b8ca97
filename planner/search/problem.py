"""A training problem for the search: the model, cluster and workload, what one second of step
time is worth under the objective, each stage's cost model, and a candidate's per-stage tables
(time, exposed data-parallel time, optimizer time and memory at the least full recomputation that
fits, per layer count and node group) that the CP-SAT model and the brute force both read. Also
the result types (``Solution``, ``SolveResult``) and what turns a split into plan stages.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from costmodel.specs import ClusterSpec, ModelSpec, ParallelConfig, StageSpec, Workload
from costmodel.memory import activations_in_flight, stage_peak_bytes
from costmodel.training import (Estimate, StageCost, fewest_full_recompute_layers, hand_off_s, inflight_microbatches,
                                interleaved_fill_hops, ep_unpaired_s, pipeline_step, stage_crosses, stage_model)
from costmodel.units import KIB, NS_PER_S
from planner.search.space import Candidate

NS = NS_PER_S          # integer time unit of the CP-SAT model: nanoseconds (KIB: the memory objective's unit)


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
class Outcome:
    """One candidate's solve. ``split`` is ``(objective, layers per stage, group per stage)`` from
    the integer tables (objective in seconds of step time, or KiB for the memory objective), or
    None. ``proved``: the split is this candidate's optimum, or it has none. Otherwise the solve
    stopped at its time limit and ``bound`` (same units; None when nothing better than the
    candidate's own lower bound is known) bounds what it leaves open."""

    split: tuple[float, list[int], list[str]] | None
    proved: bool = True
    bound: float | None = None


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
    stopped: int = 0                  # candidates whose solve stopped at its time limit, unproved

    @property
    def gap(self) -> float:
        if self.objective is None or self.bound is None or self.objective == 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


@dataclass
class StageTables:
    """For stage i on group g whose first layer falls in bucket b, with n layers: integer time,
    exposed DP, optimizer, memory; and r*.

    A stage's dense and MoE layer counts depend on where it starts (DeepSeek-V3's three dense
    layers come first; Llama 4 alternates): ``model.moe_layers_in(f, f + n)`` for first layer f.
    The buckets are what that count can depend on: first layers ``0 .. dense-1`` one bucket each,
    then one per residue of ``(f - dense) mod moe_layer_freq`` (a single bucket for a dense model
    or one whose layers are all MoE, where the tables are as before)."""

    lo: int
    hi: int
    t: dict[tuple[int, str, int], list]      # (stage, group, bucket) -> [value or None for n in lo..hi]
    e: dict[tuple[int, str, int], list]
    o: dict[tuple[int, str, int], list]
    mem: dict[tuple[int, str, int], list]
    r: dict[tuple[int, str, int], list]
    dense_first: int = 0                     # leading dense layers (0 when buckets are trivial)
    freq: int = 1                            # MoE every freq-th layer after them
    fill: int = 0                            # the interleaved fill's extra hand-offs per step, integer ns
                                             # (stage_terms.interleaved_fill_hops x the slowest hand-off)

    def bucket(self, first_layer: int) -> int:
        """The bucket of a stage starting at ``first_layer``."""
        d = self.dense_first
        return first_layer if first_layer < d else d + (first_layer - d) % self.freq

    def buckets(self) -> list[int]:
        return list(range(self.dense_first + self.freq))

    @property
    def trivial(self) -> bool:
        return self.dense_first == 0 and self.freq == 1


class Problem:
    """One training problem; ``objective`` is throughput, cost or memory."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, objective: str = "throughput",
                 price_per_gpu_hour: float | None = None, framework: str = "generic"):
        self.model, self.cluster, self.workload = model, cluster, workload
        self.framework = framework
        self.objective = objective
        self.price = price_per_gpu_hour

    # objective scale: what one second of step time is worth
    def weight(self, cand: Candidate) -> float:
        if self.objective == "cost":
            price = self.price if self.price is not None else self.cluster.gpu.price_per_hour or 1.0
            return cand.world * price / 3600.0
        return 1.0

    def groups(self, cand: Candidate) -> list[str]:
        return [g for g, c in cand.stage_counts if c > 0]

    def stage_model_for(self, cand: Candidate, group: str, i: int):
        """Stage ``i``'s cost model on node group ``group`` (its neighbour's group is not known
        yet: ``stage_crosses`` counts a mixed cluster's stages as crossing nodes)."""
        p = cand.par.pp
        crosses = stage_crosses(self.cluster, cand.par, cand.order, None, i)
        return stage_model(self.model, self.cluster, self.workload, cand.par, cand.order, group, i == 0, i == p - 1,
                           crosses, self.framework)

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
        model = self.model
        mixed = model.is_moe and (model.first_dense_layers > 0 or model.moe_layer_freq > 1)
        d, f = (model.first_dense_layers, model.moe_layer_freq) if mixed else (0, 1)
        shape = StageTables(lo, hi, {}, {}, {}, {}, {}, dense_first=d, freq=f)

        def moe_count(b: int, n: int) -> int:
            """MoE layers of an n-layer stage whose first layer is in bucket b (exact)."""
            if not mixed:
                return n if model.is_moe else 0
            # bucket b < d starts at layer b; bucket d + r at d + r, the same pattern as any
            # d + r + q*freq
            return model.moe_layers_in(b, b + n)

        t, e, o, mem, rr = shape.t, shape.e, shape.o, shape.mem, shape.r
        hop = 0.0                              # the slowest hand-off of any placement (estimate's rule)
        ep_hidden = 0.0                        # what the EP overlap hides per MoE layer (estimate's rule)
        for g in self.groups(cand):
            rows_by_pos: dict[tuple[bool, bool, int], list] = {}
            for i, b in ((i, b) for i in range(p) for b in shape.buckets()):
                first_lo, first_hi = i * lo, L - (p - i) * lo     # where stage i can start
                if b < d and not first_lo <= b <= first_hi:
                    continue
                if b >= d and first_hi < d:
                    continue
                if i == 0 and shape.bucket(0) != b:
                    continue
                pos = (i == 0, i == p - 1, b)
                if pos not in rows_by_pos:
                    sm = self.stage_model_for(cand, g, i)
                    rows = []
                    for n in range(lo, hi + 1):
                        nm = moe_count(b, n)
                        nd = n - nm
                        c0 = sm.cost(nd, nm, 0)
                        if cutoff is not None and par.grad_accum * c0.time_s > cutoff:
                            break                      # this many layers alone exceed the incumbent
                        rows.append((n, c0, sm.cost(nd, nm, n)))
                    rows_by_pos[pos] = (sm, rows)
                sm, rows = rows_by_pos[pos]
                if par.vpp > 1 and rows:           # the hand-off as this position's cost holds it
                    hop = max(hop, hand_off_s(rows[0][1].pp_comm_s, i == 0, i == p - 1))
                mt = sm.mesh.moe_terms
                if mt is not None and mt.ep_hidden_s > ep_hidden:
                    ep_hidden = mt.ep_hidden_s
                inflight = inflight_microbatches(par, i)
                cap, reserved = sm.capacity_bytes, sm.reserved_bytes
                key = (i, g, b)
                tl, el, ol, ml, rl = [], [], [], [], []
                for n, c0, cn in rows:
                    if memory_objective and cand.stage_recompute:
                        r = n
                    else:
                        r = par.policy_recompute_layers(n)
                    if r is None and not cand.stage_recompute:
                        r = 0                          # the target sets one policy for every stage
                    elif r is None:
                        r = fewest_full_recompute_layers(n, cap, _peak(c0, cn, n, 0, inflight, reserved),
                                                         _peak(c0, cn, n, 1, inflight, reserved),
                                                         _peak(c0, cn, n, n, inflight, reserved))
                    peak = math.inf if r is None else _peak(c0, cn, n, r, inflight, reserved)
                    if peak > cap or not _split_allows(cand, n, L):
                        tl.append(None), el.append(None), ol.append(None), ml.append(None), rl.append(None)
                        continue
                    time_r = c0.time_s + (cn.time_s - c0.time_s) * r / n
                    tl.append(int(round(time_r * NS)))
                    el.append(int(round(sm.dp_exposed(c0, i) * NS)))
                    ol.append(int(round(c0.optimizer_s * NS)))
                    ml.append(int(math.ceil(peak / KIB)))
                    rl.append(r)
                pad = (hi - lo + 1) - len(tl)
                for lst in (tl, el, ol, ml, rl):
                    lst.extend([None] * pad)
                t[key], e[key], o[key], mem[key], rr[key] = tl, el, ol, ml, rl
        shape.fill = int(round((interleaved_fill_hops(p, par.vpp) * hop
                                + ep_unpaired_s(p, par.vpp, par.grad_accum, model.moe_layers, ep_hidden)) * NS))
        return shape


def _split_allows(cand: Candidate, n: int, layers: int) -> bool:
    """Whether the candidate's target lets a stage hold ``n`` layers: an even split holds
    ``layers / pp`` on every stage, a fixed one (DeepSpeed's partition) one of its counts;
    Megatron's uniform recompute count N needs N layers."""
    if n < cand.least_layers:
        return False
    if cand.split == "fixed":
        return n in cand.counts
    return cand.split != "even" or n * cand.par.pp == layers


def _peak(c0: StageCost, cn: StageCost, n: int, r: int, inflight: float, reserved: float) -> float:
    """A stage's peak (``memory.stage_peak_bytes``) with ``r`` of its ``n`` layers recomputed
    fully, from its costs with none and all of them: ``StageModel.cost`` is linear in ``r``, and
    the working set of one recomputing layer is there from ``r = 1`` on."""
    per0, pern = c0.act_per_microbatch_bytes, cn.act_per_microbatch_bytes
    acts = activations_in_flight(inflight, per0 + (pern - per0) * r / n, cn.act_fixed_bytes if r else c0.act_fixed_bytes)
    return stage_peak_bytes(c0.states_bytes, acts, reserved, c0.buffers_bytes)


def objective_value(prob: Problem, cand: Candidate, tab: StageTables, ns: list[int], gs: list[str],
                    memory_objective: bool = False) -> float | None:
    """The solver's objective for a given split, from the same integer tables (exhaustive mode
    and the tests use this)."""
    par = cand.par
    ts, es, os_, ms = [], [], [], []
    first = 0
    for i, (n, g) in enumerate(zip(ns, gs)):
        k = n - tab.lo
        key = (i, g, tab.bucket(first))
        first += n
        if not 0 <= k <= tab.hi - tab.lo or key not in tab.t or tab.t[key][k] is None:
            return None
        ts.append(tab.t[key][k])
        es.append(tab.e[key][k])
        os_.append(tab.o[key][k])
        ms.append(tab.mem[key][k])
    if memory_objective:
        return float(max(ms))
    v, m = par.vpp, par.grad_accum
    # v x the step in integer nanoseconds, exactly as CP-SAT's objective counts it
    return pipeline_step(v * m, 1, max(ts), sum(ts), v * max(es), v * max(os_), v * tab.fill) / v / NS


def stages_from(tab: StageTables, cand: Candidate, ns: list[int], gs: list[str]) -> tuple[StageSpec, ...]:
    out, first = [], 0
    for i, (n, g) in enumerate(zip(ns, gs)):
        r = tab.r[(i, g, tab.bucket(first))][n - tab.lo]
        out.append(StageSpec(first_layer=first, num_layers=n, recompute_layers=int(r),
                             group=g if len(cand.stage_counts) > 1 else ""))
        first += n
    return tuple(out)


def finalize_par(cand: Candidate, stages: tuple[StageSpec, ...]) -> ParallelConfig:
    """Record the recompute choice: all layers full -> recompute=full; else per stage. A
    candidate whose stage count is its target's one uniform count (``uniform_recompute``: one
    stage, Megatron's block method) records it as the policy's ``recompute_layers``."""
    par = cand.par
    if par.recompute != "full" and stages and all(s.recompute_layers == s.num_layers for s in stages):
        return dataclasses.replace(par, recompute="full", recompute_layers=-1)
    if cand.uniform_recompute and par.recompute == "none" and stages and stages[0].recompute_layers > 0:
        return dataclasses.replace(par, recompute="full", recompute_layers=stages[0].recompute_layers)
    return par
