"""The serving search: the best split among the enumerated candidates (``serving_space``), proved.

3. CP-SAT picks one candidate (``_ServingModel``): a boolean per candidate, exactly one true;
   the chosen one's peak memory at most its limit (the GPU's; in-flight: the engine's share,
   ``gpu_memory_utilization``), its TTFT and TPOT at most the goals (linear in the booleans,
   integer parts per million / microseconds). Aggregated and disaggregated candidates
   (``serving_disagg``) compete in one model. The objective: output tokens/s per GPU
   (``THROUGHPUT_SCALE`` milli-tokens), ties to the lower request latency; with ``--batch`` or
   ``--request-rate`` fixed, the request latency (ttft + (O-1) tpot, integer ns). ``--top K``
   re-solves K times, each time forbidding the layouts already chosen.
4. The reported numbers are the float estimate of the chosen candidate. ``OPTIMAL`` means
   optimal over the enumerated candidates (the batch grid, not every integer batch).
   ``--exhaustive`` ranks the same candidates in Python: the reference CP-SAT is tested against.

No plan: ``ServingInfeasible`` (exit 1) naming the binding constraint -- context longer than
the model supports, a batch that fits no split, latency goals no split meets -- with the
closest plan and what it achieves.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from costmodel.inference import estimate_inference
from costmodel.specs import ClusterSpec, ModelSpec, ParallelConfig, SpecError, Workload
from costmodel.units import GIB
from planner.plan.errors import InfeasibleError, SolverStopped
from planner.search.serving_space import Candidate, enumerate_candidates, goal_us, latency_us, meets_goal

THROUGHPUT_SCALE = 1000          # objective unit: milli-tokens/s per GPU
TIE_SCALE = 1_000_000            # secondary objective: request latency in us, below one milli-token
MEMORY_SCALE = 1_000_000         # memory constraint unit: parts per million of the limit


def _memory_ppm(c: Candidate, capacity: float) -> int:
    limit = c.est.capacity_bytes if c.est.batching != "static" else capacity
    return math.ceil(c.est.peak_bytes / limit * MEMORY_SCALE)


class ServingInfeasible(InfeasibleError):
    """No serving plan; ``closest`` is the candidate nearest to feasible (or None)."""

    def __init__(self, message: str, closest: "Candidate | None" = None, reason: str = ""):
        super().__init__(message)
        self.closest = closest
        self.reason = reason


@dataclass
class ServeResult:
    status: str
    solutions: list[Candidate]
    objective: float
    bound: float
    wall_time_s: float
    candidates: int
    objective_name: str
    scored: list[Candidate] = field(default_factory=list)
    comparison: dict = field(default_factory=dict)      # best aggregated / disaggregated under the goals


# --------------------------------------------------------------------------------------
# CP-SAT
# --------------------------------------------------------------------------------------

class _ServingModel:
    """One boolean per candidate (``x_i``: candidate i is the plan), exactly one true; every
    constraint and the objective are linear in the booleans with integer coefficients."""

    def __init__(self, cands: list[Candidate], capacity: float, ttft_slo_s: float | None,
                 tpot_slo_s: float | None, minimize_latency: bool):
        from ortools.sat.python import cp_model
        self.cp_model = cp_model
        self.cands = cands
        self.m = m = cp_model.CpModel()
        self.x = [m.new_bool_var(f"x_{c.tp}_{c.pp}_{c.dp}_{c.ep}_b{c.batch}") for c in cands]
        m.add_exactly_one(self.x)
        self._add_memory(capacity)
        self._add_slo("ttft", ttft_slo_s, lambda c: c.est.ttft_s)
        self._add_slo("tpot", tpot_slo_s, lambda c: c.est.tpot_s)
        self._add_objective(minimize_latency)

    def _add_memory(self, capacity: float) -> None:
        # peak memory per GPU of the chosen candidate as parts per million of its limit (rounded
        # up), at most 10^6: the GPU's memory (static) or the engine's share of it (in-flight)
        ppm = [_memory_ppm(c, capacity) for c in self.cands]
        self.m.add(sum(k * x for k, x in zip(ppm, self.x)) <= MEMORY_SCALE)

    def _add_slo(self, name: str, slo_s: float | None, value) -> None:
        # the chosen candidate's latency in microseconds (rounded up), at most the goal
        if slo_s is None:
            return
        us = [latency_us(value(c)) for c in self.cands]
        self.m.add(sum(u * x for u, x in zip(us, self.x)) <= goal_us(slo_s))

    def _add_objective(self, minimize_latency: bool) -> None:
        lat_ns = [int(round(c.est.request_latency_s * 1e9)) for c in self.cands]
        if minimize_latency:
            self.scale = 1e9
            self.m.minimize(sum(v * x for v, x in zip(lat_ns, self.x)))
            return
        # primary: milli-tokens/s per GPU; secondary (below one milli-token): latency in us
        thr = [int(round(c.est.output_tokens_per_s_per_gpu * THROUGHPUT_SCALE)) for c in self.cands]
        tie = [min(TIE_SCALE - 1, int(round(v / 1e3))) for v in lat_ns]
        self.scale = THROUGHPUT_SCALE * TIE_SCALE
        self.m.maximize(sum((t * TIE_SCALE - s) * x for t, s, x in zip(thr, tie, self.x)))

    def forbid(self, degrees: tuple) -> None:
        for c, x in zip(self.cands, self.x):
            if c.degrees == degrees:
                self.m.add(x == 0)

    def solve(self, time_limit_s: float):
        solver = self.cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
        solver.parameters.num_workers = 1          # deterministic: golden tests compare objectives
        status = solver.solve(self.m)
        return solver, solver.status_name(status)


def solve_serving(model: ModelSpec, cluster: ClusterSpec, wl: Workload, fixed: dict[str, int], *,
                  batch: int | None = None, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
                  top: int = 1, max_time_s: float = 60.0, batch_limit: int = 4096,
                  candidates: tuple[list[Candidate], dict] | None = None, exhaustive: bool = False,
                  sched=None, rate_per_s: float | None = None, disaggregation: str = "off",
                  prefill_sched=None) -> ServeResult:
    """The best ``top`` plans (module docstring); ``candidates`` reuses an ``enumerate_candidates``
    result of the same problem; ``exhaustive`` ranks the candidates in Python instead of CP-SAT
    (the reference the tests hold CP-SAT to). ``sched`` (a ``costmodel.batching.SchedulerConfig``)
    selects continuous batching, ``None`` static batches; ``rate_per_s`` is the whole deployment's
    request rate; ``disaggregation`` off | auto (both kinds compete) | only."""
    t0 = time.perf_counter()
    P, O = wl.prompt_len, wl.output_len
    if P + O > model.max_seq_len:
        raise _context_infeasible(model, cluster, wl, fixed, batch, ttft_slo_s, tpot_slo_s, batch_limit, sched)
    if candidates is None:
        cands, max_b = ([], {}) if disaggregation == "only" and sched is not None else \
            enumerate_candidates(model, cluster, wl, fixed, batch, batch_limit, sched, rate_per_s)
        if sched is not None and disaggregation in ("auto", "only") and batch is None and rate_per_s is None:
            from planner.search.serving_disagg import enumerate_disaggregated
            cands = cands + enumerate_disaggregated(model, cluster, wl, sched, fixed, ttft_slo_s, tpot_slo_s,
                                                    prefill_sched)
    else:
        cands, max_b = candidates
    if not cands and max_b and any(max_b.values()) and (batch is not None or rate_per_s is not None):
        raise _why_infeasible(model, cluster, wl, cands, max_b, batch, ttft_slo_s, tpot_slo_s, sched, rate_per_s)
    if not cands and sched is not None and not any((max_b or {}).values()) and disaggregation != "only":
        raise _no_kv_room(model, cluster, wl, fixed, sched)
    if not cands:
        if disaggregation == "only":
            raise ServingInfeasible(f"no disaggregated layout of {model.name} over {cluster.total_gpus} GPUs meets "
                                    f"{_slo_text(ttft_slo_s, tpot_slo_s) or 'the memory limits'}; try "
                                    "--disaggregation auto", None, "latency")
        raise ServingInfeasible(f"no legal split of {model.name} over {cluster.total_gpus} GPUs with the fixed "
                                f"dimensions {fixed or '{}'} (tp must divide heads {model.heads} and stay in a "
                                f"node of {cluster.gpus_per_node}; in-flight: a request of {P}+{O} tokens must fit "
                                "the KV pool)", None, "no legal split")
    minimize_latency = batch is not None or rate_per_s is not None
    if exhaustive:
        res = _exhaustive(model, cluster, wl, cands, max_b, batch, ttft_slo_s, tpot_slo_s, top, t0, sched,
                          minimize_latency)
        res.comparison = _comparison(res.scored, cluster.gpu.memory_bytes, ttft_slo_s, tpot_slo_s, minimize_latency,
                                     _kinds(disaggregation, sched, batch, rate_per_s, cands))
        return res
    sm = _ServingModel(cands, cluster.gpu.memory_bytes, ttft_slo_s, tpot_slo_s, minimize_latency)
    sols: list[Candidate] = []
    status, objective, bound = "INFEASIBLE", 0.0, 0.0
    for k in range(top):
        left = max_time_s - (time.perf_counter() - t0)
        if left <= 0:
            break
        solver, st = sm.solve(left)
        if st not in ("OPTIMAL", "FEASIBLE"):
            if k == 0:
                if st == "UNKNOWN":
                    raise SolverStopped(f"CP-SAT stopped after {max_time_s:g} s before any plan "
                                        f"({len(cands)} candidates); raise --max-time")
                raise _why_infeasible(model, cluster, wl, cands, max_b, batch, ttft_slo_s, tpot_slo_s, sched)
            break
        chosen = next(c for c, x in zip(cands, sm.x) if solver.value(x))
        sols.append(chosen)
        if k == 0:
            status = st
            if minimize_latency:
                objective, bound = chosen.est.request_latency_s, solver.best_objective_bound / sm.scale
            else:
                objective = chosen.est.output_tokens_per_s_per_gpu
                bound = max(objective, math.floor(solver.best_objective_bound / TIE_SCALE) / THROUGHPUT_SCALE)
        sm.forbid(chosen.degrees)
    return ServeResult(status=status, solutions=sols, objective=objective, bound=bound,
                       wall_time_s=time.perf_counter() - t0, candidates=len(cands),
                       objective_name="request_latency_s" if minimize_latency else "output_tokens_per_s_per_gpu",
                       scored=cands,
                       comparison=_comparison(cands, cluster.gpu.memory_bytes, ttft_slo_s, tpot_slo_s,
                                              minimize_latency, _kinds(disaggregation, sched, batch, rate_per_s, cands)))


def _kinds(disaggregation: str, sched, batch, rate_per_s, cands) -> tuple[str, ...]:
    """The kinds of plan the search considered (or that the given candidates hold)."""
    pd = sched is not None and disaggregation in ("auto", "only") and batch is None and rate_per_s is None
    kinds = {"disaggregated"} if pd else set()
    if disaggregation != "only":
        kinds.add("aggregated")
    kinds |= {"disaggregated" if c.disaggregated else "aggregated" for c in cands}
    return tuple(k for k in ("aggregated", "disaggregated") if k in kinds)


def _feasible(c: Candidate, capacity: float, ttft_slo_s: float | None, tpot_slo_s: float | None) -> bool:
    """The CP-SAT model's constraints on one candidate, with its integer rounding."""
    return (_memory_ppm(c, capacity) <= MEMORY_SCALE
            and meets_goal(c.est.ttft_s, ttft_slo_s) and meets_goal(c.est.tpot_s, tpot_slo_s))


def _rank_key(c: Candidate, minimize_latency: bool):
    if minimize_latency:
        return (round(c.est.request_latency_s * 1e9),)
    return (-round(c.est.output_tokens_per_s_per_gpu * THROUGHPUT_SCALE),
            min(TIE_SCALE - 1, round(c.est.request_latency_s * 1e6)))


def _comparison(cands: list[Candidate], capacity: float, ttft_slo_s, tpot_slo_s, minimize_latency: bool,
                kinds: tuple[str, ...] = ("aggregated", "disaggregated")) -> dict:
    """The best aggregated and the best disaggregated candidate under the goals (None: none meets
    them), for the kinds the search considered."""
    out: dict = {}
    for kind, want in (("aggregated", False), ("disaggregated", True)):
        if kind not in kinds:
            continue
        ok = [c for c in cands if c.disaggregated == want and _feasible(c, capacity, ttft_slo_s, tpot_slo_s)]
        out[kind] = min(ok, key=lambda c: _rank_key(c, minimize_latency)) if ok else None
    return out


def _exhaustive(model, cluster, wl, cands, max_b, batch, ttft_slo_s, tpot_slo_s, top, t0, sched=None,
                minimize_latency=None) -> ServeResult:
    """Every candidate checked and ranked in Python, with the CP-SAT model's integer rounding."""
    if minimize_latency is None:
        minimize_latency = batch is not None
    cap = cluster.gpu.memory_bytes
    ok = [c for c in cands if _feasible(c, cap, ttft_slo_s, tpot_slo_s)]
    if not ok:
        raise _why_infeasible(model, cluster, wl, cands, max_b, batch, ttft_slo_s, tpot_slo_s, sched)
    ok.sort(key=lambda c: _rank_key(c, minimize_latency))
    sols, seen = [], set()
    for c in ok:
        if c.degrees not in seen:
            seen.add(c.degrees)
            sols.append(c)
        if len(sols) == top:
            break
    obj = sols[0].est.request_latency_s if minimize_latency else sols[0].est.output_tokens_per_s_per_gpu
    return ServeResult(status="OPTIMAL", solutions=sols, objective=obj, bound=obj,
                       wall_time_s=time.perf_counter() - t0, candidates=len(cands),
                       objective_name="request_latency_s" if minimize_latency else "output_tokens_per_s_per_gpu",
                       scored=cands)


# --------------------------------------------------------------------------------------
# No plan: the binding constraint and the closest plan
# --------------------------------------------------------------------------------------

def _slo_text(ttft_slo_s: float | None, tpot_slo_s: float | None) -> str:
    parts = []
    if ttft_slo_s is not None:
        parts.append(f"TTFT <= {ttft_slo_s * 1e3:g} ms")
    if tpot_slo_s is not None:
        parts.append(f"TPOT <= {tpot_slo_s * 1e3:g} ms")
    return " and ".join(parts)


def _why_infeasible(model, cluster, wl, cands, max_b, batch, ttft_slo_s, tpot_slo_s, sched=None,
                    rate_per_s=None) -> ServingInfeasible:
    cap = cluster.gpu.memory_bytes
    fitting = [c for c in cands if _memory_ppm(c, cap) <= MEMORY_SCALE]
    if not fitting and rate_per_s is not None and max_b and any(max_b.values()):
        best_deg = max(max_b, key=lambda d: (max_b[d], -d[1], d))
        closest = _evaluate(model, cluster, wl, best_deg, max_b[best_deg], sched)
        top = closest.est.schedule.get("request_rate_per_s", 0.0) * best_deg[2]
        return ServingInfeasible(
            f"no split of {model.name} over {cluster.total_gpus} GPUs sustains {rate_per_s:g} requests/s of "
            f"{wl.prompt_len}+{wl.output_len} tokens; the most is {top:.3g}/s (tp={best_deg[0]} pp={best_deg[1]} "
            f"replicas={best_deg[2]}); use more GPUs or --kv-dtype fp8. Closest: {closest.describe()}", closest,
            "load")
    if not fitting:
        best_deg = max(max_b, key=lambda d: (max_b[d], -d[1], d)) if max_b else None
        if (best_deg is None or max_b[best_deg] == 0) and cands:
            one = min(cands, key=lambda c: c.est.peak_bytes)
            if one.batch != 1 and not one.disaggregated:
                one = _evaluate(model, cluster, wl, one.degrees, 1)
            return ServingInfeasible(
                f"{model.name} does not fit {cluster.total_gpus} x {cluster.gpu.name}: even one sequence of "
                f"{wl.prompt_len}+{wl.output_len} tokens at the largest sharding (tp={one.tp} pp={one.pp} "
                f"ep={one.ep}) needs {one.est.peak_bytes / GIB:.2f} GiB per GPU (weights "
                f"{one.est.memory['weights_bytes'] / GIB:.2f} GiB), has {cap / GIB:.2f} GiB; use more GPUs "
                f"(--gpus) or smaller weights (--dtype fp8/int4). Closest: {one.describe()}", one, "memory")
        closest = _evaluate(model, cluster, wl, best_deg, max_b[best_deg], sched)
        capped = _seq_cap_binds(model, cluster, wl, best_deg, sched, batch)
        if capped:
            return ServingInfeasible(capped + f". Closest: {closest.describe()}", closest, "scheduler")
        return ServingInfeasible(
            f"batch {batch} does not fit any split of {model.name} over {cluster.total_gpus} GPUs at context "
            f"{wl.prompt_len}+{wl.output_len}: the most that fits is {max_b[best_deg]} sequences per replica "
            f"(tp={best_deg[0]} pp={best_deg[1]} ep={best_deg[3]}); use --batch {max_b[best_deg]}, more "
            f"GPUs or --kv-dtype fp8. Closest: {closest.describe()}", closest, "memory")
    slo = {"ttft": ttft_slo_s, "tpot": tpot_slo_s}

    def violation(c: Candidate) -> float:
        v = 0.0
        if ttft_slo_s:
            v = max(v, c.est.ttft_s / ttft_slo_s)
        if tpot_slo_s:
            v = max(v, c.est.tpot_s / tpot_slo_s)
        return v

    closest = min(fitting, key=lambda c: (violation(c), -c.est.output_tokens_per_s_per_gpu, str(c.degrees), c.batch))
    best_ttft = min(c.est.ttft_s for c in fitting)
    best_tpot = min(c.est.tpot_s for c in fitting)
    binds = [n for n, s in slo.items() if s is not None and
             (best_ttft if n == "ttft" else best_tpot) > s]
    what = ("; the fastest any split reaches: " + ", ".join(
        f"{n.upper()} {(best_ttft if n == 'ttft' else best_tpot) * 1e3:.2f} ms" for n in binds)) if binds else \
        "; each goal alone can be met, but not both at once"
    at_batch = f" at batch {batch}" if batch else ""
    return ServingInfeasible(
        f"no split of {model.name} over {cluster.total_gpus} GPUs meets {_slo_text(ttft_slo_s, tpot_slo_s)}"
        f"{at_batch}{what}. Closest: {closest.describe()}", closest, "latency")


def _seq_cap_binds(model, cluster, wl, deg, sched, batch) -> str | None:
    """In-flight, a fixed --batch above what runs at once: when the scheduler's running-request cap
    (max_num_seqs), not the KV pool, is the limit, the message saying so (None otherwise)."""
    if sched is None or not batch:
        return None
    from costmodel.batching import InflightReplica
    tp, pp, dp, ep = deg
    try:
        rep = InflightReplica(model, cluster, wl, ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep), sched)
    except SpecError:
        return None
    kv = rep.kv
    held = int(kv.blocks // kv.blocks_per_request) if kv.blocks_per_request > 0 else 0
    if kv.kv_limited or held < batch:
        return None          # memory binds (too): the caller's message
    return (f"batch {batch} is more than run at once: the {sched.server} scheduler caps a replica at "
            f"{sched.max_num_seqs} running requests (--max-num-seqs), while its KV pool holds {held:,} requests of "
            f"{wl.prompt_len}+{wl.output_len} tokens (tp={tp} pp={pp} ep={ep}); use --max-num-seqs {batch} or "
            f"--batch {sched.max_num_seqs}")


def _no_kv_room(model, cluster, wl, fixed, sched) -> ServingInfeasible:
    """In-flight: no split leaves the engine a KV pool for one request."""
    from planner.search.serving_space import degree_tuples
    tuples = degree_tuples(model, cluster, fixed)
    if not tuples:
        return ServingInfeasible(f"no legal split of {model.name} over {cluster.total_gpus} GPUs with the fixed "
                                 f"dimensions {fixed or '{}'}", None, "no legal split")
    deg = max(tuples, key=lambda d: (d[0] * d[1], d[3], d))
    one = _evaluate(model, cluster, wl, deg, 1)
    limit = sched.gpu_memory_utilization * cluster.gpu.memory_bytes
    return ServingInfeasible(
        f"{model.name} does not fit {cluster.total_gpus} x {cluster.gpu.name}: at the largest sharding (tp={one.tp} "
        f"pp={one.pp} ep={one.ep}) the weights take {one.est.memory['weights_bytes'] / GIB:.2f} GiB per GPU and even "
        f"one sequence of {wl.prompt_len}+{wl.output_len} tokens needs {one.est.peak_bytes / GIB:.2f} GiB, over "
        f"the engine's {sched.gpu_memory_utilization:g} x {cluster.gpu.memory_bytes / GIB:.2f} = {limit / GIB:.2f} "
        "GiB; use more GPUs (--gpus), smaller weights (--dtype fp8/int4) or a higher --gpu-memory-utilization. "
        f"Closest: {one.describe()}", one, "memory")


def _evaluate(model, cluster, wl, degrees, batch, sched=None) -> Candidate:
    tp, pp, dp, ep = degrees
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep)
    if sched is not None:
        from costmodel.batching import estimate_inflight
        try:
            est = estimate_inflight(model, cluster, wl, par, sched, concurrency=max(1, batch))
            return Candidate(tp, pp, dp, ep, est.batch, est)
        except Exception:      # noqa: BLE001 - no steady state: fall back to the static figure
            pass
    est = estimate_inference(model, cluster, dataclasses.replace(wl, global_batch=max(1, batch)), par)
    return Candidate(tp, pp, dp, ep, max(1, batch), est)


def _context_infeasible(model, cluster, wl, fixed, batch, ttft_slo_s, tpot_slo_s, batch_limit,
                        sched=None) -> ServingInfeasible:
    P, O = wl.prompt_len, wl.output_len
    msg = (f"context prompt {P} + output {O} = {P + O} tokens exceeds {model.name}'s max_seq_len "
           f"{model.max_seq_len}")
    prompt = model.max_seq_len - O
    if prompt < 1:
        return ServingInfeasible(msg + f"; even the output alone is too long (use --output-len < "
                                       f"{model.max_seq_len})", None, "context")
    short = dataclasses.replace(wl, prompt_len=prompt, seq_len=prompt + O)
    try:
        res = solve_serving(model, cluster, short, fixed, batch=batch, ttft_slo_s=ttft_slo_s,
                            tpot_slo_s=tpot_slo_s, batch_limit=batch_limit, max_time_s=30.0, sched=sched)
        closest = res.solutions[0]
        tail = f"; at --prompt-len {prompt} the best plan is {closest.describe()}"
    except ServingInfeasible as e:
        closest, tail = e.closest, f"; at --prompt-len {prompt} there is no plan either: {e}"
    return ServingInfeasible(msg + tail, closest, "context")
