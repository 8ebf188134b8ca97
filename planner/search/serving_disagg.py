"""Disaggregated serving layouts: a prefill pool and a decode pool over all of a cluster's GPUs.

1. Instance shapes: ``(tp, pp)`` with tp legal for the model and inside a node, an instance
   filling part of a node evenly or whole nodes. Each instance is its own engine (as the P/D
   deployments of vLLM and SGLang run them), so a MoE pool's experts are split inside one
   instance: ``ep`` 1 (each expert over TP) or ``tp`` (whole experts over the TP ranks); wide EP
   across instances is left to aggregated plans.
2. Every split of the GPUs ``r_p g_p + r_d g_d = G`` into ``r_p`` prefill instances of ``g_p``
   GPUs and ``r_d`` decode instances of ``g_d`` (the pool ratio), each pool with its own shape.
3. Per layout, the decode batch ``d``: the decode pool's steady states on a grid of ``d``
   (``costmodel.batching``), the largest that meets the TPOT goal and that the prefill pool
   keeps up with at the utilization the TTFT goal allows (the M/D/1 wait that fits
   what is left of the goal after the prefill, the KV transfer and the decoder's first step);
   where a goal binds between two grid points, the ``d`` at which it binds (bisection on the
   steady state itself, ``_best_d``).
   One candidate per layout: the most it serves under the goals (no goals: at most
   ``RHO_CAP`` prefill utilization).

The candidates join the aggregated ones in the CP-SAT choice (``planner.search.serving``).
``frontier_points`` gives every (layout, ``d``) point for the Pareto frontier.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.batching import (InflightReplica, Pool, PrefillPool, SchedulerConfig, decode_capacity, decode_grid,
                                disagg_estimate, disagg_point, kv_transfer_s, pool_cluster, transfer_crosses_nodes)
from costmodel.inference import check_invariants
from costmodel.specs import ClusterSpec, ModelSpec, SpecError, Workload
from planner.search.serving_space import BATCHES_PER_OCTAVE, Candidate, _divisors, _tp_ok, meets_goal

RHO_CAP = 0.95          # prefill utilization without a TTFT goal (the M/D/1 wait grows as 1/(1 - rho))
JOIN_STEPS = 1.5        # TTFT: the residual of the decoder's step in progress + its first step


@dataclass
class _Decode:
    rep: InflightReplica
    grid: list[float]
    tau: list[float]
    rate: list[float]          # requests/s per instance at each d: d / (O tau)


def instance_shapes(model: ModelSpec, cluster: ClusterSpec, fixed: dict[str, int]) -> list[tuple[int, int]]:
    """(tp, pp) of one instance (module docstring), sorted."""
    gpus, gpn = cluster.total_gpus, cluster.gpus_per_node
    tps = [fixed["tp"]] if "tp" in fixed else [t for t in _divisors(min(gpn, gpus)) if _tp_ok(model, t)]
    out = []
    for tp in tps:
        for pp in ([fixed["pp"]] if "pp" in fixed else range(1, model.layers + 1)):
            g = tp * pp
            if g >= gpus:
                break
            if pp > model.layers or not (gpn % g == 0 or g % gpn == 0):
                continue
            out.append((tp, pp))
    return sorted(out)


def _eps(model: ModelSpec, tp: int, replicas: int, fixed: dict[str, int]) -> list[int]:
    """Expert parallel inside one instance (module docstring): 1, or tp."""
    if not model.is_moe:
        return [1]
    eps = [1] if model.expert_ffn_hidden % tp == 0 else []
    if tp > 1 and model.num_experts % tp == 0:
        eps.append(tp)
    del replicas
    if "ep" in fixed:
        eps = [e for e in eps if e == fixed["ep"]]
    return eps


class DisaggSpace:
    """Pools built once and shared by the layouts that use them."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, wl: Workload, sched: SchedulerConfig,
                 prefill_sched: SchedulerConfig | None, fixed: dict[str, int]):
        self.model, self.cluster, self.wl, self.sched = model, cluster, wl, sched
        self.psched = prefill_sched or sched
        self.fixed = fixed
        self._pre: dict = {}
        self._dec: dict = {}
        self._kv: dict = {}

    def prefill(self, tp: int, pp: int, ep: int, r: int) -> PrefillPool | None:
        key = (tp, pp, ep, r if ep > 1 else 1)
        if key not in self._pre:
            try:
                pool = PrefillPool(self.model, self.cluster, self.wl, Pool(tp, pp, ep, key[3]), self.psched)
                self._pre[key] = pool if pool.fits else None
            except SpecError:
                self._pre[key] = None
        return self._pre[key]

    def decode(self, tp: int, pp: int, ep: int, r: int) -> _Decode | None:
        key = (tp, pp, ep, r if ep > 1 else 1)
        if key not in self._dec:
            self._dec[key] = None
            try:
                pool = Pool(tp, pp, ep, key[3])
                rep = InflightReplica(self.model, pool_cluster(self.cluster, pool), self.wl, pool.par, self.sched)
            except SpecError:
                return None
            cap = decode_capacity(rep)
            if cap >= 1:
                O = rep.sm.O
                ctx = rep.sm.P + O / 2.0
                grid = decode_grid(cap, BATCHES_PER_OCTAVE)
                tau = [rep.sm.step(d, ctx)[0] for d in grid]
                self._dec[key] = _Decode(rep, grid, tau, [d / (O * t) for d, t in zip(grid, tau)])
        return self._dec[key]

    def transfer(self, p: Pool, d: Pool) -> tuple[float, bool]:
        key = (p.gpus_per_instance, d.gpus_per_instance, p.gpus + d.gpus)
        if key not in self._kv:
            cross = transfer_crosses_nodes(self.cluster, p, d)
            self._kv[key] = (kv_transfer_s(self.model, self.cluster, self.wl, p, d, cross), cross)
        return self._kv[key]

    def layouts(self):
        """(prefill pool, decode pool) over all the GPUs, sorted (module docstring)."""
        G = self.cluster.total_gpus
        shapes = instance_shapes(self.model, self.cluster, self.fixed)
        for tp_p, pp_p in shapes:
            g_p = tp_p * pp_p
            for tp_d, pp_d in shapes:
                g_d = tp_d * pp_d
                for r_d in range(1, G // g_d + 1):
                    rest = G - r_d * g_d
                    if rest < g_p or rest % g_p:
                        continue
                    r_p = rest // g_p
                    for ep_p in _eps(self.model, tp_p, r_p, self.fixed):
                        for ep_d in _eps(self.model, tp_d, r_d, self.fixed):
                            yield Pool(tp_p, pp_p, ep_p, r_p), Pool(tp_d, pp_d, ep_d, r_d)


# Halvings of the gap between the last grid point that meets the goals and the first that does
# not: the decode batch where a goal binds, to 2**-40 of the gap. A fixed count from the same
# bracket keeps the answer monotone in the goals (a looser goal never ends lower).
BISECT_STEPS = 40


def _meets(space: DisaggSpace, pre: PrefillPool, dec: _Decode, p: Pool, d: Pool, dd: float,
           ttft_slo_s: float | None, tpot_slo_s: float | None) -> bool:
    """Whether ``dd`` decoding requests per decode instance meet the goals, judged on the steady
    state itself (``costmodel.batching.disagg_point``, the one owner of TTFT and TPOT) as the
    search judges any candidate (``serving_space.meets_goal``), with the prefill pool under
    ``RHO_CAP``."""
    t_kv, cross = space.transfer(p, d)
    pt = disagg_point(pre, dec.rep, dd, t_kv, cross, p, d)
    return (pt is not None and pt.prefill_utilization <= RHO_CAP
            and meets_goal(pt.ttft_s, ttft_slo_s) and meets_goal(pt.tpot_s, tpot_slo_s))


def _best_d(space: DisaggSpace, pre: PrefillPool, dec: _Decode, p: Pool, d: Pool, ttft_slo_s: float | None,
            tpot_slo_s: float | None) -> float | None:
    """The decode batch of this layout (module docstring, step 3), or None: the last grid point
    that meets the goals, then bisection towards the next one (which does not) on the same check.
    An interpolated batch, not checked, could miss a goal by a hair and drop the layout at a tight
    goal that a looser one kept (the search was not monotone in --slo-margin)."""
    best = None
    for i, dd in enumerate(dec.grid):
        if not _meets(space, pre, dec, p, d, dd, ttft_slo_s, tpot_slo_s):
            break
        best = i
    if best is None:
        return None
    if best + 1 == len(dec.grid):
        return dec.grid[best]
    lo, hi = dec.grid[best], dec.grid[best + 1]
    for _ in range(BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        if _meets(space, pre, dec, p, d, mid, ttft_slo_s, tpot_slo_s):
            lo = mid
        else:
            hi = mid
    return lo


def enumerate_disaggregated(model: ModelSpec, cluster: ClusterSpec, wl: Workload, sched: SchedulerConfig,
                            fixed: dict[str, int], ttft_slo_s: float | None, tpot_slo_s: float | None,
                            prefill_sched: SchedulerConfig | None = None) -> list[Candidate]:
    """One candidate per layout that meets the goals (module docstring)."""
    if cluster.total_gpus < 2:
        return []
    space = DisaggSpace(model, cluster, wl, sched, prefill_sched, fixed)
    out: list[Candidate] = []
    G = cluster.total_gpus
    for p, d in space.layouts():
        pre = space.prefill(p.tp, p.pp, p.ep, p.replicas)
        if pre is None:
            continue
        dec = space.decode(d.tp, d.pp, d.ep, d.replicas)
        if dec is None:
            continue
        dd = _best_d(space, pre, dec, p, d, ttft_slo_s, tpot_slo_s)
        if dd is None or dd <= 0:
            continue
        t_kv, cross = space.transfer(p, d)
        pt = disagg_point(pre, dec.rep, dd, t_kv, cross, p, d)
        if pt is None:
            continue
        est = disagg_estimate(pt, pre, dec.rep, G)
        if not (meets_goal(est.ttft_s, ttft_slo_s) and meets_goal(est.tpot_s, tpot_slo_s)):
            continue
        check_invariants(est)
        out.append(Candidate(d.tp, d.pp, d.replicas, d.ep, max(1, int(round(dd))), est,
                             prefill=(p.tp, p.pp, p.ep, p.replicas)))
    return out


def frontier_points(model: ModelSpec, cluster: ClusterSpec, wl: Workload, sched: SchedulerConfig,
                    fixed: dict[str, int], ttft_slo_s: float | None = None,
                    prefill_sched: SchedulerConfig | None = None) -> list[dict]:
    """Every (layout, decode batch) point with the prefill pool under ``RHO_CAP`` (and the TTFT
    goal): per-user and per-GPU output tokens/s, TTFT, TPOT; plain numbers, cheap to sweep."""
    if cluster.total_gpus < 2:
        return []
    space = DisaggSpace(model, cluster, wl, sched, prefill_sched, fixed)
    G = cluster.total_gpus
    O = wl.output_len
    pts = []
    for p, d in space.layouts():
        pre = space.prefill(p.tp, p.pp, p.ep, p.replicas)
        dec = space.decode(d.tp, d.pp, d.ep, d.replicas) if pre is not None else None
        if dec is None:
            continue
        t_kv, _ = space.transfer(p, d)
        for dd, tau, rate in zip(dec.grid, dec.tau, dec.rate):
            X = d.replicas * rate
            rho = X * pre.service_s / p.replicas
            if rho >= RHO_CAP:
                break
            ttft = rho * pre.service_s / (2 * (1 - rho)) + pre.alone_s + t_kv + JOIN_STEPS * tau
            if ttft_slo_s is not None and ttft > ttft_slo_s:
                continue
            pts.append({"prefill": p, "decode": d, "decode_batch": dd, "ttft_s": ttft, "tpot_s": tau,
                        "tokens_per_s_per_user": 1.0 / tau, "output_tokens_per_s_per_gpu": X * O / G})
    return pts


def candidate_for(model: ModelSpec, cluster: ClusterSpec, wl: Workload, sched: SchedulerConfig, p: Pool, d: Pool,
                  decode_batch: float, prefill_sched: SchedulerConfig | None = None) -> Candidate | None:
    """The candidate of one frontier point (the full estimate)."""
    space = DisaggSpace(model, cluster, wl, sched, prefill_sched, {})
    pre = space.prefill(p.tp, p.pp, p.ep, p.replicas)
    dec = space.decode(d.tp, d.pp, d.ep, d.replicas)
    if pre is None or dec is None:
        return None
    t_kv, cross = space.transfer(p, d)
    pt = disagg_point(pre, dec.rep, decode_batch, t_kv, cross, p, d)
    if pt is None:
        return None
    est = disagg_estimate(pt, pre, dec.rep, cluster.total_gpus)
    return Candidate(d.tp, d.pp, d.replicas, d.ep, max(1, int(math.floor(decode_batch + 0.5))), est,
                     prefill=(p.tp, p.pp, p.ep, p.replicas))
