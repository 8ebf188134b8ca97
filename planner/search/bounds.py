"""Valid lower bounds on a candidate's objective, from the cost model, cheapest first.

* ``group_bound`` / ``compute_bound``: a group of candidates sharing degrees and micro-batch, by
  the average stage's compute and TP/EP/CP communication (and the pipeline bubble); ``group_may_fit``
  asks whether the group's least-memory member can hold its model states at all.
* ``lower_bound``: one candidate; with stage times linear in their layer counts,
  ``m*max(t) + (sum(t) - max(t))/v >= (m - 1/v) * sum(t)/p + sum(t)/v``, recomputation and exposed
  data-parallel time counted as zero (exact for one stage; ``_memory_bound`` for the memory objective).
* ``strong_bound``: tighter, for candidates near the front: the stage with the most layers at its
  least recompute that fits, and optionally the makespan bound.
"""
from __future__ import annotations

import math

from costmodel.memory import stage_peak_bytes
from costmodel.training import fewest_full_recompute_layers, inflight_microbatches, pipeline_step, stage_compute_time
from planner.search.problem import Problem, _peak
from planner.search.space import Candidate


def extreme_mixes(prob: Problem, n: float, moe_frac: float) -> list[tuple[float, float]]:
    """(dense, MoE) layer counts bounding those of any n-layer stage. The solver's tables cost each
    stage with its exact counts (``StageTables`` buckets), which for a model mixing dense and MoE
    layers need not be the average: a bound on one stage takes the least over the extremes (the
    cost is linear in the counts). For a dense or all-MoE model, the one exact mix."""
    model = prob.model
    if not model.is_moe or model.moe_layers in (0, model.layers):
        return [(n * (1 - moe_frac), n * moe_frac)]
    dense = model.layers - model.moe_layers
    lo_m, hi_m = max(0.0, n - dense), min(float(n), float(model.moe_layers))
    return [(n - lo_m, lo_m), (n - hi_m, hi_m)]


def lower_bound(prob: Problem, cand: Candidate) -> float:
    """A valid lower bound on the candidate's objective, or inf when it cannot fit memory."""
    par = cand.par
    p, m, v, L = par.pp, par.grad_accum, par.vpp, prob.model.layers
    moe_frac = prob.model.moe_layers / L
    if not _may_fit(prob, cand, moe_frac):
        return math.inf
    if prob.objective == "memory":
        return _memory_bound(prob, cand, moe_frac)
    if p == 1:
        # one stage, one split: the exact objective, at the least recompute that fits
        g = prob.groups(cand)[0]
        sm = prob.stage_model_for(cand, g, 0)
        nd, nm = L * (1 - moe_frac), L * moe_frac
        r = par.policy_recompute_layers(L)
        if r is None:       # a target without per-stage recompute: every stage runs the policy (the tables' r = 0)
            r = least_recompute(sm, nd, nm, L, 1.0) if cand.stage_recompute else 0
        if r is None:
            return math.inf
        c = sm.cost(nd, nm, r)
        return pipeline_step(m, 1, c.time_s, c.time_s, sm.dp_exposed(c, 0), c.optimizer_s) * prob.weight(cand)
    best = math.inf
    for g in prob.groups(cand):
        sms = {pos: prob.stage_model_for(cand, g, i) for pos, i in
               (("first", 0), ("mid", min(1, p - 1)), ("last", p - 1))}
        mid = sms["mid"]
        c1, c2 = mid.cost(1 - moe_frac, moe_frac, 0), mid.cost(2 - 2 * moe_frac, 2 * moe_frac, 0)
        slope = (c2.time_s - c2.fsdp_comm_s) - (c1.time_s - c1.fsdp_comm_s)
        cf = sms["first"].cost(1 - moe_frac, moe_frac, 0)
        cl = sms["last"].cost(1 - moe_frac, moe_frac, 0)
        intercepts = ((cf.time_s - cf.fsdp_comm_s - slope) + (cl.time_s - cl.fsdp_comm_s - slope)
                      + (p - 2) * (c1.time_s - c1.fsdp_comm_s - slope))
        best = min(best, slope * L + intercepts)
    # p > 1 here: one stage returned its exact objective above
    return ((m - 1 / v) * best / p + best / v) * prob.weight(cand)


def compute_bound(prob: Problem, members: list) -> float:
    """A bound shared by a group of candidates with the same degrees and micro-batch: the
    average stage's compute and TP/EP/CP communication for all micro-batches (the least over
    the group's mesh orders and node groups), nothing else: ``training.stage_compute_time`` of
    ``L/p`` layers and ``1/p`` of the head, the stages' summed time over ``p``."""
    by_order = {c.order: c for _, c in members}
    cand = next(iter(by_order.values()))
    if prob.objective == "memory":
        return 0.0
    par = cand.par
    L, p, m = prob.model.layers, par.pp, par.grad_accum
    n_moe = prob.model.moe_layers
    best = math.inf
    for c_ in by_order.values():
        for g in prob.groups(c_):
            t = stage_compute_time(prob.model, prob.cluster, prob.workload, c_.par, c_.order, g, prob.framework,
                                   (L - n_moe) / p, n_moe / p, 1 / p)
            best = min(best, m * t)
    return best * prob.weight(cand)


def group_may_fit(prob: Problem, members: list) -> bool:
    """Whether any member of the group may hold its model states (``_may_fit``): asked once per
    ZeRO stage and shard width, as the rest of a member (mesh order, virtual stages, schedule)
    changes neither its states nor its buffers. Not only the most sharded member: ZeRO-3's
    prefetch buffers can outweigh what it saves over ZeRO-2 on a stage of few layers."""
    frac = prob.model.moe_layers / prob.model.layers
    seen = {}
    for _, c in members:
        seen.setdefault((c.par.zero, c.par.dp_shard), c)
    return any(_may_fit(prob, c, frac) for c in seen.values())


def group_bound(prob: Problem, members: list, vpp: int | None = None) -> float:
    """``compute_bound`` with the pipeline bubble: the stages' summed time ``S`` has
    ``S/p >= cb/m``, so each member's weak bound ``(m - 1/v)*S/p + S/v`` is at least
    ``cb*(1 + (p-1)/(v*m))`` with ``v`` the group's largest virtual-stage count (``vpp`` when
    given: ``members`` is then the group's first member and its last of each mesh order, all
    that ``compute_bound`` reads). Memory is not looked at (``group_may_fit``)."""
    par = members[0][1].par
    v = max(c.par.vpp for _, c in members) if vpp is None else vpp
    cb = compute_bound(prob, members)
    if prob.objective == "memory" or par.pp == 1:
        return cb
    return cb * (1 + (par.pp - 1) / (v * par.grad_accum))


def strong_bound(prob: Problem, cand: Candidate, weak: float, makespan: bool = False) -> float:
    """A tighter valid bound, worth its cost only for candidates near the front: the stage
    with the most layers holds at least ceil(L/p) of them, at its least recompute that fits
    (stage time grows with layers), and every other stage at least the minimum."""
    par = cand.par
    p, m, v, L = par.pp, par.grad_accum, par.vpp, prob.model.layers
    if p == 1 or prob.objective == "memory":
        return weak
    moe_frac = prob.model.moe_layers / L
    lo = _least_layers(cand)
    big = max(lo, -(-L // p))
    t_big = t_small = math.inf
    for g in prob.groups(cand):
        for i in sorted({0, max(0, p - 2), p - 1}):
            sm = prob.stage_model_for(cand, g, i)
            inflight = inflight_microbatches(par, i)
            for n, slot in ((big, "big"), (lo, "small")):
                mixes = extreme_mixes(prob, n, moe_frac)
                r = par.policy_recompute_layers(n)
                if r is None and not cand.stage_recompute:
                    r = 0           # without per-stage recompute the tables run the policy: r = 0
                if r is not None and not _policy_may_fit(sm, mixes, n, r, inflight):
                    continue        # no stage of n or more layers fits here under the policy
                for nd, nm in mixes:
                    rr = least_recompute(sm, nd, nm, n, inflight) if r is None else r
                    if rr is None:
                        continue
                    t = sm.cost(nd, nm, rr).time_s
                    if slot == "big":
                        t_big = min(t_big, t)
                    else:
                        t_small = min(t_small, t)
    if t_big == math.inf:
        return math.inf
    if makespan and len(prob.groups(cand)) == 1:
        if not _layers_may_fit(prob, cand, moe_frac):
            return math.inf
        t_big = max(t_big, _makespan_bound(prob, cand, big, lo, moe_frac))
    w = prob.weight(cand)
    # the weak bound's sum of stage times (no recomputation) still bounds S from below
    s_lb = weak / w / ((m - 1 / v) / p + 1 / v)
    s_lb = max(s_lb, t_big + (p - 1) * t_small)
    return max(weak, ((m - 1 / v) * t_big + s_lb / v) * w)


def _policy_may_fit(sm, mixes: list[tuple[float, float]], n: int, r: int, inflight: float) -> bool:
    """Whether a stage of ``n`` layers of which the policy recomputes ``r`` (the tables' own
    ``r``, not chosen to fit) can fit at this position with some (dense, MoE) mix between the
    extremes: its peak as the tables count it (``problem._peak``) is linear in the mix, so the
    least over the extremes is at most any mix's, and it grows with the layers a stage holds
    and the micro-batches in flight (so the middle position with the fewest stands for every
    middle one). Within ``_FIT_SLACK`` of the capacity it counts as fitting: the extremes are
    computed along another path than the tables' exact counts."""
    cap = sm.capacity_bytes * (1 + _FIT_SLACK)
    for nd, nm in mixes:
        c0 = sm.cost(nd, nm, 0)
        cn = c0 if r == 0 else sm.cost(nd, nm, n)
        if _peak(c0, cn, n, r, inflight, sm.reserved_bytes) <= cap:
            return True
    return False


_FIT_SLACK = 1e-9


def _least_layers(cand: Candidate) -> int:
    """The fewest layers a stage of the candidate may hold: one per virtual stage, and at least
    its target's uniform recompute count (``Candidate.least_layers``: the tables refuse fewer,
    ``problem._split_allows``)."""
    return max(1, cand.par.vpp, cand.least_layers)


def _mixes_at(prob: Problem, i: int, lo: int, p: int, n: int, moe_frac: float) -> list[tuple[float, float]]:
    """(dense, MoE) layer counts bounding those of an n-layer stage at position ``i`` (each
    stage holds at least ``lo`` layers, so stage ``i`` starts at layer ``i*lo`` or later, and
    at ``L - (p-i)*lo`` or earlier). For a model whose only dense layers lead it
    (``first_dense_layers``, every later layer MoE) the stage's dense count lies between those of
    its earliest and latest start; otherwise ``extreme_mixes``."""
    model = prob.model
    d = model.first_dense_layers
    if not (model.is_moe and model.moe_layer_freq == 1 and model.moe_layers == model.layers - d):
        return extreme_mixes(prob, n, moe_frac)
    first, last = i * lo, model.layers - (p - i) * lo
    most, least = max(0, min(n, d - first)), max(0, min(n, d - last))
    return [(float(most), float(n - most))] + ([(float(least), float(n - least))] if least != most else [])


def _layers_may_fit(prob: Problem, cand: Candidate, moe_frac: float) -> bool:
    """Necessary for any split on one node group: the most layers each stage can hold at its
    position (the largest ``n`` whose peak may fit, ``_policy_may_fit``, under the recompute the
    tables give it: the policy's, none, or where a stage picks its own the least of none, one and
    all ``n``) sum to at least
    the model's layers. A stage's peak grows with its layers, so it fits below that count and
    not above it; found by bisection."""
    par = cand.par
    p, L = par.pp, prob.model.layers
    lo = _least_layers(cand)
    hi = L - lo * (p - 1)
    if hi < lo:
        return False
    g = prob.groups(cand)[0]
    total = 0
    for i in range(p - 1, -1, -1):        # the most room first (the fewest micro-batches in flight)
        sm = prob.stage_model_for(cand, g, i)
        inflight = inflight_microbatches(par, i)

        def fits(n: int) -> bool:
            mixes = _mixes_at(prob, i, lo, p, n, moe_frac)
            r = par.policy_recompute_layers(n)
            if r is not None or not cand.stage_recompute:
                return _policy_may_fit(sm, mixes, n, r or 0, inflight)
            # the stage picks its own count: the least peak is at none, one or all of them
            # (linear from one on; ``fewest_full_recompute_layers``)
            return any(_policy_may_fit(sm, mixes, n, k, inflight) for k in sorted({0, 1, n}))

        if not fits(lo):
            return False
        a, b = lo, hi
        while a < b:
            mid = (a + b + 1) // 2
            if fits(mid):
                a = mid
            else:
                b = mid - 1
        total += a
        if total >= L:
            return True
    return False


def _makespan_bound(prob: Problem, cand: Candidate, big: int, lo: int, moe_frac: float, width: int = 3) -> float:
    """The least T at which the stages can hold all layers: with stage times increasing in
    their layer counts, a stage within T holds at most n_i(T) layers, so sum n_i(T) >= L.
    The first and last stages (embedding, head) are counted as they are; the middle ones as
    the most favourable middle stage (the fewest micro-batches in flight). Evaluated on a
    window of layer counts around L/p; outside it, nothing is claimed."""
    par = cand.par
    p, L = par.pp, prob.model.layers
    g = prob.groups(cand)[0]
    n_lo = max(lo, big - width)
    ns = list(range(n_lo, big + width + 1))
    slots = [(0, 1), (p - 1, 1)] + ([(p - 2, p - 2)] if p > 2 else [])
    curves = []
    for i, count in slots:
        sm = prob.stage_model_for(cand, g, i)
        inflight = inflight_microbatches(par, i)
        ts = []
        for n in ns:
            t = math.inf
            for nd, nm in extreme_mixes(prob, n, moe_frac):
                r = par.policy_recompute_layers(n)
                if r is None:       # without per-stage recompute the tables run the policy: r = 0
                    r = least_recompute(sm, nd, nm, n, inflight) if cand.stage_recompute else 0
                if r is not None:
                    t = min(t, sm.cost(nd, nm, r).time_s)
            ts.append(t)
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


def _memory_bound(prob: Problem, cand: Candidate, moe_frac: float) -> float:
    """A lower bound on the peak memory of any split, as the memory objective's tables count
    it (every layer recomputed: the least activation memory). A stage's peak grows with its
    layers, so the peak is at least (a) the fullest stage's, which holds ``ceil(L/p)`` layers
    at some position: the least over positions; (b) the first and the last stage's with the
    fewest layers a stage may hold (the embedding, the head and their in-flight
    activations)."""
    par = cand.par
    p, L = par.pp, prob.model.layers
    big, lo = -(-L // p), max(1, par.vpp)

    def peak(g: str, i: int, n: int) -> float:
        sm = prob.stage_model_for(cand, g, i)
        # the tables recompute every layer only where a stage may recompute on its own; a target
        # without per-stage recompute runs the policy (r = 0 on top of it): count what they count
        r = n if cand.stage_recompute else (par.policy_recompute_layers(n) or 0)
        return min(sm.memory(sm.cost(nd, nm, r), inflight_microbatches(par, i))["peak_bytes"]
                   for nd, nm in extreme_mixes(prob, n, moe_frac))

    groups = prob.groups(cand)
    if p == 1:
        return min(peak(g, 0, L) for g in groups)
    # each part on its own least node group: on a mixed cluster the fullest, the first and
    # the last stage may each run on another group
    fullest = min(peak(g, i, big) for g in groups for i in range(p))
    return max(fullest, min(peak(g, 0, lo) for g in groups), min(peak(g, p - 1, lo) for g in groups))


def _may_fit(prob: Problem, cand: Candidate, moe_frac: float) -> bool:
    """Necessary condition: the stages' model states can be held at all. A layer's states do not
    depend on the stage that holds it (``StageModel.cost`` at any position), so every split's
    stages together hold the same total ``S``: the states of all layers (on the first stage) and
    of the head (on the last). Each stage's peak is at least its states plus the reserved memory
    and the buffers (``memory.stage_peak_bytes`` with no activations), so some split fits only
    if the stages' room ``capacity - stage_peak_bytes(0, 0, reserved, buffers)``, summed over the
    stages on each node group, holds ``S`` (one group: ``S / p`` fits one stage's room)."""
    par = cand.par
    L, p = prob.model.layers, par.pp
    n_moe = prob.model.moe_layers
    counts = dict(cand.stage_counts)
    total = math.inf
    room = 0.0
    for g in prob.groups(cand):
        first = prob.stage_model_for(cand, g, 0)
        s = first.cost(L - n_moe, n_moe, 0).states_bytes
        if p > 1:
            s += prob.stage_model_for(cand, g, p - 1).cost(0, 0, 0).states_bytes
        total = min(total, s)
        room += counts.get(g, p) * (first.capacity_bytes
                                    - stage_peak_bytes(0.0, 0.0, first.reserved_bytes, first.buffers_bytes))
    return total <= room * (1 + 1e-12)


def least_recompute(sm, nd: float, nm: float, n: int, inflight: float) -> int | None:
    """The fewest fully recomputed layers that fit the stage in memory
    (``training.fewest_full_recompute_layers`` on the stage's peaks), or None if even full
    recomputation does not fit; checked against the float model on both sides, so that a
    bound built on it never counts more recomputation than needed."""
    cap = sm.capacity_bytes

    def peak(r: int) -> float:
        return sm.memory(sm.cost(nd, nm, r), inflight)["peak_bytes"]

    p0 = peak(0)
    if p0 <= cap:
        return 0
    r = fewest_full_recompute_layers(n, cap, p0, peak(1), peak(n) if n > 1 else math.inf)
    if r is None:
        return None
    while r > 1 and peak(r - 1) <= cap:
        r -= 1
    while r < n and peak(r) > cap:
        r += 1
    return r
