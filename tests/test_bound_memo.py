"""``bounds._cost`` (a stage model's cost kept between the bounds' many asks) against asking
the stage model each time: every bound equal, on random instances of the bound property test,
with the memo cold and warm."""
from __future__ import annotations

import math

from planner.search import bounds
from tests.test_bound_property import _cluster, _instance, _problem


def _all_bounds(prob, members, picked):
    out = []
    for i in picked:
        cand = members[i][1]
        weak = bounds.lower_bound(prob, cand)
        out.append(weak)
        if weak < math.inf:
            out.append(bounds.strong_bound(prob, cand, weak))
            out.append(bounds.strong_bound(prob, cand, weak, makespan=True))
    return out


def test_the_kept_stage_costs_give_the_bounds_of_asking_each_time(monkeypatch):
    insts = []
    seed = 0
    while len(insts) < 60:
        seed += 1
        inst = _instance(seed)
        if inst is not None and inst["objective"] != "memory":
            insts.append(inst)
    bounds._COSTS.clear()
    cold = [_all_bounds(_problem(i, _cluster(80.0, i["shape"])), i["members"], i["picked"]) for i in insts]
    warm = [_all_bounds(_problem(i, _cluster(80.0, i["shape"])), i["members"], i["picked"]) for i in insts]
    assert bounds._COSTS                                   # the memo was used
    monkeypatch.setattr(bounds, "_cost", lambda sm, nd, nm, r: sm.cost(nd, nm, r))
    plain = [_all_bounds(_problem(i, _cluster(80.0, i["shape"])), i["members"], i["picked"]) for i in insts]
    assert cold == plain and warm == plain
    assert sum(b < math.inf for bs in plain for b in bs) >= 50     # bounds that could differ, not all inf
