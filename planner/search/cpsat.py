"""One candidate's pipeline as a CP-SAT model: which layer count (and node group) each stage takes.

Integer layers per stage ``n_i`` (contiguous blocks, summing to the model's layers), for
heterogeneous clusters a boolean per (stage, node group) with each group's stage count, and the
per-stage tables of ``Problem.tables``. The objective is the step time, ``v*m*T + S - T + v*E + v*O``
in integer nanoseconds, with ``T >= t_i``, ``S = sum(t_i)``, ``E >= e_i``, ``O >= o_i``.
"""
from __future__ import annotations

import math
from typing import Any

from costmodel.specs import default_stages
from costmodel.training import pipeline_step
from planner.search import satmodel
from planner.search.problem import NS, Outcome, Problem, StageTables, objective_value
from planner.search.space import Candidate


class PipelineModel:
    """CP-SAT: which layer count (and node group) each stage takes, minimizing the step time.

    Variables (one family each):
      y[i, g, b, k]  stage i runs on group g, starts in first-layer bucket b and holds ``lo + k``
                  layers (boolean; exactly one per stage; only the (g, b, k) whose table entry
                  fits memory exist at all). Buckets (``StageTables``) exist for models whose
                  dense and MoE layers mix (DeepSeek-V3's dense first layers): a y with bucket b
                  forces the stage's first layer ``F_i = sum_{j<i} n_j`` into b, so every stage
                  is costed with its exact dense and MoE layer counts.
      t_i, e_i, o_i, mem_i  the stage's time per micro-batch, exposed DP time, optimizer time and
                  memory, linear in y (table lookups)
      T, E, O, M  their maxima
    Constraints: the layer counts sum to the model's layers; each group runs its number of
    stages; a target that states only the last stage's count (``Candidate.split == "last"``)
    gets every other stage equal. Costs are integer nanoseconds (``NS``) and KiB.
    """

    def __init__(self, prob: Problem, cand: Candidate, tab: StageTables, memory_objective: bool = False,
                 cutoff: float | None = None, model_class: Any = None):
        self.prob, self.cand, self.tab = prob, cand, tab
        # OR-Tools' model without cp_model's numpy/pandas import (``satmodel``); the tests pass
        # ``cp_model.CpModel`` to hold the two equal
        self.m = (model_class or satmodel.MODEL)()
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
        self.y: dict[tuple[int, str, int, int], Any] = {}
        self.rows: list[list[tuple[str, int, int, Any]]] = []
        # with an incumbent, a stage whose own time already makes m*t exceed it is useless
        limit = (self.cutoff * NS / self.mb) if self.cutoff is not None and not self.memory_objective else math.inf
        for i in range(self.p):
            row = []
            for g in self.groups:
                for b in tab.buckets():
                    for k, val in enumerate(tab.t.get((i, g, b), ())):
                        if val is not None and val <= limit:
                            var = self.m.new_bool_var(f"y_{i}_{g}_{b}_{tab.lo + k}")
                            self.y[i, g, b, k] = var
                            row.append((g, b, k, var))
            if not row:
                self.ok = False
                return
            self.m.add_exactly_one(v for *_, v in row)
            self.rows.append(row)
        self.m.add(satmodel.LinearExpr.weighted_sum(list(self.y.values()), [tab.lo + k for (*_, k) in self.y])
                   == self.prob.model.layers)
        if self.cand.split == "fixed":
            # the target places the layers itself (DeepSpeed's partition_method): that split only
            for i, n in enumerate(self.cand.counts):
                self.m.add(self._layers(i) == n)
        if self.cand.split == "last" and self.p > 2:
            # the target states only the last stage's layer count: every other stage holds the first's
            for i in range(1, self.p - 1):
                self.m.add(self._layers(i) == self._layers(0))
        if len(self.groups) > 1:
            for g in self.groups:
                self.m.add(sum(v for (_, gg, _, _), v in self.y.items() if gg == g) == self.counts[g])
        if not tab.trivial:
            self._add_bucket_constraints()

    def _add_bucket_constraints(self):
        """The bucket a stage's y names is the bucket of its first layer ``F_i``."""
        tab, L = self.tab, self.prob.model.layers
        d, f = tab.dense_first, tab.freq
        first = 0
        for i in range(self.p):
            F = self.m.new_int_var(0, L, f"F_{i}")
            self.m.add(F == first)
            q = self.m.new_int_var(0, L, f"q_{i}") if f > 1 else None
            for g, b, k, var in self.rows[i]:
                if b < d:
                    self.m.add(F == b).only_enforce_if(var)
                elif q is None:
                    self.m.add(F >= d).only_enforce_if(var)
                else:
                    self.m.add(F == b + f * q).only_enforce_if(var)
            first = F + satmodel.LinearExpr.weighted_sum([v for *_, v in self.rows[i]],
                                                         [tab.lo + k for _, _, k, _ in self.rows[i]])

    def _layers(self, i: int):
        row = self.rows[i]
        return satmodel.LinearExpr.weighted_sum([v for *_, v in row], [self.tab.lo + k for _, _, k, _ in row])

    def _lin(self, table: dict, i: int):
        row = self.rows[i]
        return satmodel.LinearExpr.weighted_sum([v for *_, v in row], [table[(i, g, b)][k] for g, b, k, _ in row])

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
        """v * step = v*m*T + (S - T) + v*F + v*E + v*O, T = max t_i, E = max e_i, O = max o_i, F the
        interleaved fill's extra hand-offs (``StageTables.fill``, a constant of the candidate)."""
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
        else:
            # v x the step (training.pipeline_step); one stage: sum(t) - T = 0
            obj = pipeline_step(self.v * self.mb, 1, T, sum(self.t), self.v * E, self.v * O, self.v * self.tab.fill)
        if cutoff is not None and not self.memory_objective:
            # branch and bound: only splits that beat the incumbent are of interest
            self.m.add(obj <= int(cutoff * self.v * NS) + 1)
        self.m.minimize(obj)

    def solve(self, time_limit_s: float, hint: list[int] | None = None):
        order = [g for g in self.groups for _ in range(self.counts[g])]
        if hint and len(order) == len(hint):
            # the even split, the node groups taking their stages in the candidate's order: a
            # starting point only (CP-SAT repairs a hint that breaks a constraint), which on
            # memory-tight heterogeneous pipelines finds a first plan where search alone may not
            starts = [sum(hint[:i]) for i in range(len(hint))]
            bucket = [self.tab.bucket(f) for f in starts]
            for (j, gg, b, k), var in self.y.items():
                self.m.add_hint(var, int(gg == order[j] and self.tab.lo + k == hint[j] and b == bucket[j]))
        # one worker; the models are small (a boolean per stage and layer count): presolve costs
        # more than it saves here (measured: 10 ms against 4 ms per candidate on 70B/64 GPUs)
        solver = satmodel.solve(self.m, max(1e-3, time_limit_s), num_workers=1, presolve=False)
        return solver, solver.status

    def read(self, solver) -> tuple[list[int], list[str]]:
        ns, gs = [0] * self.p, [""] * self.p
        for (i, g, _, k), v in self.y.items():
            if solver.value(v):
                ns[i], gs[i] = self.tab.lo + k, g
        return ns, gs


def cpsat_one(prob: Problem, cand: Candidate, tab: StageTables, mem_obj: bool, time_limit: float,
              cutoff: float | None = None) -> Outcome:
    """The candidate's best split. A solve that stops at ``time_limit`` (CP-SAT's FEASIBLE or
    UNKNOWN) is not a proof: the outcome says so and carries CP-SAT's own bound."""
    if all(all(v is None for v in lst) for lst in tab.t.values()):
        return Outcome(None)
    if cand.par.pp == 1:
        # one stage, nothing to split: the table is the answer
        g = prob.groups(cand)[0]
        k = tab.hi - tab.lo
        if tab.t[(0, g, 0)][k] is None:
            return Outcome(None)
        ns, gs = [tab.hi], [g]
        return Outcome((objective_value(prob, cand, tab, ns, gs, mem_obj), ns, gs))
    pm = PipelineModel(prob, cand, tab, mem_obj, cutoff=cutoff)
    if not pm.ok:
        return Outcome(None)
    even = [s.num_layers for s in default_stages(prob.model.layers, cand.par.pp)]
    solver, status = pm.solve(time_limit, hint=even)
    if status == satmodel.INFEASIBLE:           # no split (or none that beats the cutoff): proved
        return Outcome(None)
    if status == satmodel.MODEL_INVALID:
        raise AssertionError(f"CP-SAT model invalid for {cand.par}")
    split = None
    if status in (satmodel.OPTIMAL, satmodel.FEASIBLE):
        ns, gs = pm.read(solver)
        split = (objective_value(prob, cand, tab, ns, gs, mem_obj), ns, gs)
    if status == satmodel.OPTIMAL:
        return Outcome(split)
    # stopped at the time limit: CP-SAT's bound on the objective, in the tables' units
    scale = 1 if mem_obj else pm.v * NS
    return Outcome(split, proved=False, bound=solver.best_objective_bound / scale)
