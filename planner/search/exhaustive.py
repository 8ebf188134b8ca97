"""The brute-force reference: every stage split (and node-group assignment) of one candidate,
scored on the same integer tables the CP-SAT model sees (``--exhaustive``; the tests hold CP-SAT
to it)."""
from __future__ import annotations

import itertools
import math
import time

from planner.search.problem import Outcome, Problem, StageTables, objective_value
from planner.search.space import Candidate


def compositions(total: int, parts: int, lo: int, hi: int):
    """All (n_0, ..., n_{parts-1}) with lo <= n_i <= hi summing to total."""
    if parts == 1:
        if lo <= total <= hi:
            yield (total,)
        return
    for first in range(lo, min(hi, total - lo * (parts - 1)) + 1):
        for rest in compositions(total - first, parts - 1, lo, hi):
            yield (first,) + rest


def exhaustive_one(prob: Problem, cand: Candidate, tab: StageTables, mem_obj: bool,
                   deadline: float = math.inf) -> Outcome:
    """The best split by enumeration; past ``deadline`` (a ``time.perf_counter()`` value) it stops
    with the best split so far, not proved."""
    groups = prob.groups(cand)
    counts = dict(cand.stage_counts)
    p = cand.par.pp
    if len(groups) > 1:
        assigns = {perm for perm in itertools.permutations([g for g in groups for _ in range(counts[g])])}
        assigns = sorted(assigns)
    else:
        assigns = [tuple([groups[0]] * p)]
    best = None
    for ns in compositions(prob.model.layers, p, tab.lo, tab.hi):
        if cand.split == "last" and len(set(ns[:-1])) > 1:
            continue                     # the target states only the last stage's count
        if cand.split == "fixed" and tuple(ns) != cand.counts:
            continue                     # the target places the layers itself
        if time.perf_counter() > deadline:
            return Outcome(best, proved=False)
        for gs in assigns:
            val = objective_value(prob, cand, tab, list(ns), list(gs), mem_obj)
            if val is not None and (best is None or val < best[0]):
                best = (val, list(ns), list(gs))
    return Outcome(best)
