"""The serving search's space: every legal split of a model over a cluster's GPUs, and its batches.

1. The legal degree tuples ``(tp, pp, replicas, ep)`` for ``--gpus`` are enumerated in Python
   (sorted; fixed ``--tp/--pp/--dp/--ep`` respected): tp divides the heads, the FFN and the KV
   heads (or is a multiple of them), stays inside a node; pp at most the layers; ep 1 or a
   multiple of tp that divides tp x replicas and the experts (``costmodel.inference``).
2. Static batching (``--batching static``): each tuple's largest batch that fits
   (``serving_max_batch``) bounds its batches: ``--batch``, or a grid of ``BATCHES_PER_OCTAVE``
   sizes per doubling up to it; every (tuple, batch) is one candidate, scored by the float cost
   model ``estimate_inference``.
   Continuous batching (``--batching inflight``, the default): each tuple's steady states
   (``costmodel.batching.InflightReplica``) over a grid of decode batches up to the most the
   replica sustains (the KV pool, ``max_num_seqs`` and the prefill budget), or the one steady
   state at ``--batch`` (concurrency per replica) or ``--request-rate``.
3. Disaggregated layouts (``planner.search.serving_disagg``) add their own candidates.

``planner.search.serving`` picks among the candidates.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from costmodel.inference import InferenceEstimate, check_invariants, estimate_inference, serving_max_batch
from costmodel.specs import ClusterSpec, ModelSpec, ParallelConfig, SpecError, Workload, kv_heads_fit
from costmodel.units import GIB
from planner.plan.errors import UsageError

BATCHES_PER_OCTAVE = 4


def latency_us(value_s: float) -> int:
    """A latency as the search's integer: microseconds, rounded up."""
    return math.ceil(value_s * 1e6)


def goal_us(goal_s: float) -> int:
    """A latency goal as the search's integer: microseconds, rounded down."""
    return int(math.floor(goal_s * 1e6))


def meets_goal(value_s: float, goal_s: float | None) -> bool:
    """Whether a predicted latency meets a goal, at the search's microsecond resolution (the one
    rule: the CP-SAT constraint, its Python reference and the disaggregated batch search)."""
    return goal_s is None or latency_us(value_s) <= goal_us(goal_s)


@dataclass(frozen=True)
class Candidate:
    """One scored serving plan. Aggregated: ``tp, pp, dp (replicas), ep`` shard every replica.
    Disaggregated: they are the decode pool's and ``prefill`` is the prefill pool's
    ``(tp, pp, ep, replicas)``. ``batch``: concurrent requests per replica (static: the batch)."""
    tp: int
    pp: int
    dp: int
    ep: int
    batch: int
    est: InferenceEstimate = field(compare=False, hash=False)
    prefill: tuple[int, int, int, int] | None = None

    @property
    def degrees(self) -> tuple:
        if self.prefill is not None:
            return ("pd", self.prefill, (self.tp, self.pp, self.dp, self.ep))
        return (self.tp, self.pp, self.dp, self.ep)

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None

    @property
    def par(self) -> ParallelConfig:
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep)

    @property
    def gpus(self) -> int:
        n = self.tp * self.pp * self.dp
        if self.prefill is not None:
            n += self.prefill[0] * self.prefill[1] * self.prefill[3]
        return n

    def layout(self) -> str:
        """The split in words: ``tp4 pp1 x2`` or ``P: tp4 x1 | D: tp2 x2``."""
        def one(tp, pp, ep, r):
            return f"tp{tp}" + (f" pp{pp}" if pp > 1 else "") + (f" ep{ep}" if ep > 1 else "") + f" x{r}"
        d = one(self.tp, self.pp, self.ep, self.dp)
        if self.prefill is None:
            return d
        tp, pp, ep, r = self.prefill
        return f"P: {one(tp, pp, ep, r)} | D: {d}"

    def describe(self) -> str:
        e = self.est
        if self.prefill is not None:
            tp, pp, ep, r = self.prefill
            return (f"disaggregated, prefill {r} x (tp={tp} pp={pp} ep={ep}), decode {self.dp} x (tp={self.tp} "
                    f"pp={self.pp} ep={self.ep}) at {e.schedule.get('decode_batch', 0):.1f} requests per decode "
                    f"instance: TTFT {e.ttft_s * 1e3:.2f} ms, TPOT {e.tpot_s * 1e3:.2f} ms, "
                    f"{e.output_tokens_per_s_per_gpu:,.1f} output tokens/s per GPU")
        return (f"tp={self.tp} pp={self.pp} replicas={self.dp} ep={self.ep} batch={self.batch}: TTFT "
                f"{e.ttft_s * 1e3:.2f} ms, TPOT {e.tpot_s * 1e3:.2f} ms, {e.output_tokens_per_s_per_gpu:,.1f} "
                f"output tokens/s per GPU, peak {e.peak_bytes / GIB:.2f} of {e.capacity_bytes / GIB:.2f} GiB, "
                f"max batch {e.max_batch}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    if model.heads % tp or model.ffn_hidden % tp:
        return False
    return kv_heads_fit(model, tp)


def degree_tuples(model: ModelSpec, cluster: ClusterSpec, fixed: dict[str, int]) -> list[tuple[int, int, int, int]]:
    """Legal (tp, pp, replicas, ep) for all of the cluster's GPUs, sorted (module docstring)."""
    gpus, gpn = cluster.total_gpus, cluster.nvlink_gpus
    prod = 1
    for k in ("tp", "pp", "dp"):
        prod *= fixed.get(k, 1)
    if gpus % prod:
        raise UsageError(f"fixed {' * '.join(f'{k}={v}' for k, v in fixed.items() if k != 'ep')} = {prod} does "
                         f"not divide --gpus {gpus}")
    if all(k in fixed for k in ("tp", "pp", "dp")) and prod != gpus:
        raise UsageError(f"fixed tp*pp*dp = {prod}, but --gpus is {gpus}")
    if "tp" in fixed and not _tp_ok(model, fixed["tp"]):
        raise UsageError(f"--tp {fixed['tp']} does not split {model.name}: heads {model.heads}, kv heads "
                         f"{model.kv_heads}, ffn {model.ffn_hidden}")
    if fixed.get("ep", 1) > 1 and not model.is_moe:
        raise UsageError(f"--ep {fixed['ep']} but {model.name} has no experts")
    if "ep" in fixed and model.is_moe and model.num_experts % fixed["ep"]:
        raise UsageError(f"--ep {fixed['ep']} does not divide {model.name}'s {model.num_experts} experts")
    out = []
    tps = [fixed["tp"]] if "tp" in fixed else [t for t in _divisors(min(gpn, gpus)) if _tp_ok(model, t)]
    for tp in tps:
        if gpus % tp:
            continue
        rest = gpus // tp
        pps = [fixed["pp"]] if "pp" in fixed else [p for p in _divisors(rest) if p <= model.layers]
        for pp in pps:
            if rest % pp or pp > model.layers:
                continue
            dp = rest // pp
            if fixed.get("dp", dp) != dp:
                continue
            if model.is_moe:
                eps = [1] + [e for e in _divisors(tp * dp) if e > 1 and e % tp == 0 and model.num_experts % e == 0]
            else:
                eps = [1]
            if "ep" in fixed:
                eps = [e for e in eps if e == fixed["ep"]]
            for ep in eps:
                if ep == 1 and model.is_moe and model.expert_ffn_hidden % tp:
                    continue
                out.append((tp, pp, dp, ep))
    return sorted(out)


def batch_grid(limit: int) -> list[int]:
    """1..8, then ``BATCHES_PER_OCTAVE`` geometric steps per doubling, and ``limit`` itself."""
    out = set(range(1, min(limit, 8) + 1))
    k = 0
    while True:
        b = int(round(8 * 2 ** (k / BATCHES_PER_OCTAVE)))
        if b > limit:
            break
        out.add(b)
        k += 1
    out.add(limit)
    return sorted(out)


def enumerate_candidates(model: ModelSpec, cluster: ClusterSpec, wl: Workload, fixed: dict[str, int],
                         batch: int | None, batch_limit: int, sched=None,
                         rate_per_s: float | None = None) -> tuple[list[Candidate], dict]:
    """Every scored candidate, and per degree tuple its largest fitting batch (static) or the
    most concurrent requests a replica sustains (in-flight: ``sched`` is the engine's
    ``costmodel.batching.SchedulerConfig``)."""
    if sched is not None:
        return enumerate_inflight(model, cluster, wl, fixed, batch, batch_limit, sched, rate_per_s)
    cands: list[Candidate] = []
    max_b: dict[tuple, int] = {}
    for tp, pp, dp, ep in degree_tuples(model, cluster, fixed):
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep)
        try:
            mb = serving_max_batch(model, cluster, wl, par)
        except SpecError:
            continue
        max_b[(tp, pp, dp, ep)] = mb
        batches = [batch] if batch else batch_grid(min(max(mb, 1), batch_limit))
        for b in batches:
            est = estimate_inference(model, cluster, dataclasses.replace(wl, global_batch=b), par)
            check_invariants(est)
            cands.append(Candidate(tp, pp, dp, ep, b, est))
    return cands, max_b


def enumerate_inflight(model: ModelSpec, cluster: ClusterSpec, wl: Workload, fixed: dict[str, int],
                       batch: int | None, batch_limit: int, sched, rate_per_s: float | None = None
                       ) -> tuple[list[Candidate], dict]:
    """The in-flight candidates (module docstring): per degree tuple, its steady states."""
    from costmodel.batching import InflightReplica
    cands: list[Candidate] = []
    max_n: dict[tuple, int] = {}
    for tp, pp, dp, ep in degree_tuples(model, cluster, fixed):
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep)
        try:
            rep = InflightReplica(model, cluster, wl, par, sched)
        except SpecError:
            continue
        max_n[(tp, pp, dp, ep)] = int(rep.top.concurrency) if rep.fits else 0
        if not rep.fits:
            continue
        if batch is not None and batch > rep.top.concurrency:
            continue            # more users than run at once: they would only queue (the plan's cap)
        if batch is not None or rate_per_s is not None:
            try:
                ests = [rep.at(concurrency=batch, rate_per_s=None if rate_per_s is None else rate_per_s / dp)]
            except SpecError:
                continue
        else:
            ests = [e for e in rep.curve(BATCHES_PER_OCTAVE) if e.schedule["concurrency"] <= batch_limit]
        for est in ests:
            check_invariants(est)
            cands.append(Candidate(tp, pp, dp, ep, est.batch, est))
    return cands, max_n
