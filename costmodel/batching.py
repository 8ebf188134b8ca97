"""Serving as the engines run it: continuous (in-flight) batching in steady state, and
disaggregated prefill and decode. Pure: no I/O, no solver.

The engines (vLLM V1's scheduler, TensorRT-LLM's in-flight batching, SGLang with
``--enable-mixed-chunk``) have no prefill and decode phases: every scheduler step runs one
forward over a flattened batch of tokens, the running requests' next tokens first (one each),
then as much of the waiting prompts as the step's token budget leaves (vLLM
``max_num_batched_tokens``, TensorRT-LLM ``max_num_tokens``, SGLang ``chunked_prefill_size``),
long prompts split into chunks over several steps. ``SchedulerConfig`` holds those settings with
each server's defaults (``scheduler_defaults``; sources at each value).

The steady state (``inflight_point``), per replica, with ``P`` prompt and ``O`` output tokens
per request, parametrized by ``d``, the mean number of decoding requests in a step:

* Little's law on the decode phase: a request decodes for ``O - 1`` steps (the first output
  token comes from the step that finishes its prompt), so requests finish at ``X = d / ((O - 1)
  tau)`` per second, ``tau`` the mean step time;
* prompt tokens arrive at ``X P`` per second, i.e. ``D = X P tau = d P / (O - 1)`` per step:
  the mix of a step follows from ``d`` alone;
* the budget left after the decodes, ``b = budget - d``, takes the prompt tokens. A step that
  carries prefill carries ``c = min(b, max(P, D))`` of them (one prompt, or the chunk that fits,
  or, under heavy load, every prompt that arrived during the last step), so a fraction
  ``f = D / c`` of the steps are mixed. ``D > b`` is prefill-bound: more concurrency only
  queues;
* ``tau_mix`` (``d`` decodes + ``c`` prompt tokens, ``costmodel.inference._Serving.mixed_layer``)
  and ``tau_pure`` (``d`` decodes) give ``TPOT = tau = f tau_mix + (1 - f) tau_pure``: the mean
  time per output token of a request that sees steps in the proportion they run (vLLM's
  ``benchmark_serving`` TPOT and ITL averages). With expert parallelism over ``g = ep / tp``
  replicas that step together, a step is mixed when any of them has a chunk:
  ``f_g = 1 - (1 - f)^g`` (SGLang's and vLLM's note that one DP rank's prefill stalls the
  others' decode);
* TTFT = the rest of the step in progress when the request arrives (mean residual life of the
  step-time distribution, ``E[tau^2] / (2 E[tau])``) + the wait for prefill budget (an M/D/1
  queue, Pollaczek-Khinchine: ``rho s / (2 (1 - rho))`` with ``rho = D / b`` and service
  ``s = P / b`` mixed steps; arrivals taken as Poisson) + ``ceil(P / b)`` mixed steps of its own
  chunks;
* concurrency ``N = X (TTFT + (O - 1) TPOT)`` (Little's law on the whole request), output
  tokens/s ``X O``. A fixed concurrency or request rate is met by bisection on ``d`` (both grow
  with it); above the prefill-bound point a closed loop of ``N`` users only waits longer
  (``TTFT = N / X - (O - 1) TPOT``).

KV-cache capacity, as the block managers allocate it (``kv_capacity``): the pool is
``gpu_memory_utilization x GPU memory - weights - activations of a full-budget step - other``
(vLLM's profiling run; TensorRT-LLM takes ``free_gpu_memory_fraction`` of what is left after
weights and buffers), in blocks of ``block_tokens`` (vLLM 16, TensorRT-LLM 32, SGLang pages of
1). A running request holds ``ceil(context / block)`` blocks: on average ``(P + (O - 1) / 2) /
block + 1/2`` for servers that allocate on demand and preempt (vLLM, SGLang), ``ceil((P + O) /
block)`` for TensorRT-LLM's ``GUARANTEED_NO_EVICT`` reservation. Running requests (decoding +
being prefilled) are capped by that and by ``max_num_seqs``.

Disaggregated serving (``DisaggPools``, ``estimate_disaggregated``): a prefill pool of
``r_p`` instances runs only prompts (full-budget steps, an M/D/1 queue in front), ships each
request's KV cache (``P x kv_bytes_per_token`` over ``min(g_p, g_d)`` GPU pairs in parallel, at
the tier the two instances share: NVLink inside one node, the network otherwise) to a decode
pool of ``r_d`` instances that run pure decode steps. The decoder emits the first token after
the transfer (its first step), then ``O - 1`` more: ``TPOT = tau_pure(d)`` with no prefill
interference, ``X = r_d d / (O tau_d)``, the prefill pool's utilization ``rho_p = X s_p / r_p``
must stay below 1. TTFT = prefill queue + prefill + transfer + one decode step and its residual.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .comm import crosses_nodes, launched
from .inference import (InferenceEstimate, _Pass, _pipeline, _Serving, kv_bytes_per_token,
                        kv_dtype_of, lengths, memory_parts, stage_memory_parts, validate_serving)
from .specs import ClusterSpec, GpuSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload, default_stages
from .units import GIB

SERVERS = ("vllm", "sglang", "tensorrt-llm")
BATCHING = ("inflight", "static")
# Planning value of the engine's memory share (vLLM --gpu-memory-utilization, SGLang's total for
# --mem-fraction-static, TensorRT-LLM's free fraction): vLLM's CacheConfig default was 0.9 until
# 2025 and is 0.92 in current releases; TensorRT-LLM's KvCacheConfig.free_gpu_memory_fraction
# is 0.9. The emitted server flags carry the value the plan used, so the server sizes its pool
# as the plan did.
DEFAULT_UTILIZATION = 0.90
BISECT_STEPS = 40


# --------------------------------------------------------------------------------------
# The scheduler's settings
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """What the engine's scheduler and block manager are told (names of the vLLM flags)."""

    server: str = "vllm"
    token_budget: int = 8192              # tokens per step (vLLM max_num_batched_tokens)
    max_num_seqs: int = 1024              # running requests (vLLM max_num_seqs)
    block_tokens: int = 16                # KV block / page size
    gpu_memory_utilization: float = DEFAULT_UTILIZATION
    reserve: str = "on_demand"            # on_demand (vLLM, SGLang) | full (TensorRT-LLM no-evict)

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise SpecError(f"server {self.server!r} is not one of {', '.join(SERVERS)}")
        for k in ("token_budget", "max_num_seqs", "block_tokens"):
            if getattr(self, k) < 1:
                raise SpecError(f"scheduler {k} must be >= 1, got {getattr(self, k)}")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise SpecError(f"gpu_memory_utilization must be in [0.05, 1], got {self.gpu_memory_utilization:g}")
        if self.reserve not in ("on_demand", "full"):
            raise SpecError(f"reserve must be on_demand or full, got {self.reserve!r}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _sglang_chunk(memory_bytes: float) -> int:
    """SGLang's default ``chunked_prefill_size`` by GPU memory (server_args.py
    ``_handle_gpu_memory_settings``: <20 GB 2048, <35 GB 2048, <60 GB 4096, <90 GB 8192, <160 GB
    8192, else 16384)."""
    gb = memory_bytes / 1e9
    for limit, size in ((35, 2048), (60, 4096), (160, 8192)):
        if gb < limit:
            return size
    return 16384


def scheduler_defaults(server: str, gpu: GpuSpec, **overrides: Any) -> SchedulerConfig:
    """Each server's own defaults for this GPU, then ``overrides`` (None values ignored).

    * vLLM (``EngineArgs.get_batch_defaults``, OpenAI server): GPUs with >= 70 GiB that are not
      A100s get 8192 batched tokens and 1024 sequences, others 2048 and 256; blocks of 16
      (``CacheConfig.DEFAULT_BLOCK_SIZE``);
    * SGLang: ``chunked_prefill_size`` by GPU memory (``_sglang_chunk``); running requests bounded
      by the KV pool (cap 4096 here); page size 1;
    * TensorRT-LLM: ``max_num_tokens`` 8192, ``max_batch_size`` 2048, ``tokens_per_block`` 32,
      ``GUARANTEED_NO_EVICT`` (the tuning guide and KvCacheConfig reference)."""
    if server == "vllm":
        big = gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
        d = dict(token_budget=8192 if big else 2048, max_num_seqs=1024 if big else 256, block_tokens=16)
    elif server == "sglang":
        d = dict(token_budget=_sglang_chunk(gpu.memory_bytes), max_num_seqs=4096, block_tokens=1)
    elif server == "tensorrt-llm":
        d = dict(token_budget=8192, max_num_seqs=2048, block_tokens=32, reserve="full")
    else:
        raise SpecError(f"server {server!r} is not one of {', '.join(SERVERS)} (the built-in runtime serves "
                        "static batches: --batching static)")
    d.update({k: v for k, v in overrides.items() if v is not None})
    return SchedulerConfig(server=server, **d)


# --------------------------------------------------------------------------------------
# Step times of one replica
# --------------------------------------------------------------------------------------

class StepModel:
    """Step times of one serving replica (``_Serving`` per stage, pipelined over ``pp``)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                 stages: tuple[StageSpec, ...] | None = None):
        validate_serving(model, cluster, workload, par)
        self.model, self.cluster, self.workload, self.par = model, cluster, workload, par
        self.stages = tuple(stages) if stages is not None else default_stages(model.layers, par.pp)
        self.sv = _Serving(model, cluster, workload, par)
        self.P, self.O = lengths(workload)
        if self.O < 2:
            raise SpecError(f"continuous batching needs at least 2 output tokens (the first comes from the prefill, "
                            f"the rest from decode steps), got {self.O}; a prompt-only workload is a static batch")
        self._memo: dict = {}
        self._steps: dict = {}

    def _hop(self, tokens: float) -> float:
        if self.par.pp == 1:
            return 0.0
        sv = self.sv
        return launched(sv.net.p2p(tokens * self.model.hidden * sv.ab, sv.pp_cross, self.par.pp))

    def step(self, dec: float, ctx: float, pre: float = 0.0, pre_seqs: float = 0.0, past: float = 0.0,
             group_tokens: float | None = None) -> tuple[float, _Pass]:
        """(time, slowest stage's pass) of a step with ``dec`` decoding requests at context ``ctx``
        and ``pre`` prompt tokens in ``pre_seqs`` chunks after ``past`` cached tokens. With pp > 1
        the step's requests circle the pipeline in ``min(pp, requests)`` micro-batches (vLLM's
        and TensorRT-LLM's pipelined scheduling)."""
        key = (dec, ctx, pre, pre_seqs, past, group_tokens)
        hit = self._steps.get(key)
        if hit is not None:
            return hit
        pp = self.par.pp
        reqs = dec + pre_seqs
        micro = max(1.0, min(float(pp), reqs)) if pp > 1 else 1.0
        # stages with the same layers (dense and MoE) and the same ends cost the same: once each
        last = len(self.stages) - 1
        same: dict = {}
        passes = []
        for i, st in enumerate(self.stages):
            sig = (st.num_layers, self.model.moe_layers_in(st.first_layer, st.last_layer), i == 0, i == last)
            if sig not in same:
                same[sig] = self.sv.mixed_stage_pass(st, i, dec / micro, ctx, pre / micro, pre_seqs / micro, past,
                                                     self._memo)
            passes.append(same[sig])
        times = [p.total for p in passes]
        t = _pipeline(times, self._hop((dec + pre) / micro), micro)
        k = max(range(len(times)), key=lambda i: times[i])
        self._steps[key] = (t, passes[k])
        return t, passes[k]

    def prefill_time(self, prompt: int, budget: int) -> tuple[float, float]:
        """(one prompt alone: its chunks one after the other, service time per prompt when full
        steps of ``budget`` tokens are packed with prompts) of a prefill-only instance."""
        k = max(1, math.ceil(prompt / budget))
        c = prompt / k
        alone, _ = self.step(0.0, 0.0, c, 1.0, (prompt - c) / 2.0)
        alone *= k
        full_seqs = max(1.0, budget / prompt)
        full_c = min(float(budget), prompt * full_seqs)
        t_full, _ = self.step(0.0, 0.0, full_c, full_c / min(prompt, full_c),
                              max(0.0, (prompt - budget) / 2.0) if prompt > budget else 0.0)
        per_prompt = t_full * prompt / full_c
        if self.par.pp > 1:       # chunks pipeline through the stages: one per slowest stage
            per_prompt /= min(self.par.pp, max(1.0, prompt / budget))
        return alone, per_prompt


# --------------------------------------------------------------------------------------
# KV-cache capacity (the block manager)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KvCapacity:
    pool_bytes: float               # per GPU, the stage with the least room per token
    capacity_tokens: int
    blocks: int
    blocks_per_request: float
    max_running: int                # requests whose KV fits, capped by max_num_seqs
    kv_limited: bool                # True when the KV pool, not max_num_seqs, sets max_running
    memory: dict                    # per GPU, the fullest stage: weights, activations, other, pool
    fits: bool


def kv_capacity(sm: StepModel, sched: SchedulerConfig) -> KvCapacity:
    """The engine's KV pool and how many requests it holds (module docstring)."""
    sv, P, O = sm.sv, sm.P, sm.O
    cap = sm.cluster.gpu.memory_bytes
    C = sched.token_budget
    best_tokens, worst = math.inf, None
    for i, st in enumerate(sm.stages):
        last = i == sm.par.pp - 1
        act = sv.activation_bytes(C, min(C, sched.max_num_seqs), last)
        parts = stage_memory_parts(sv, st, i, 0.0, act)      # all but the KV pool
        w, other, fixed = parts["weights_bytes"], parts["other_bytes"], parts["peak_bytes"]
        if sched.server == "tensorrt-llm":
            pool = sched.gpu_memory_utilization * (cap - fixed)
        else:
            pool = sched.gpu_memory_utilization * cap - fixed
        kv_tok = st.num_layers * sv.kv_layer
        tokens = pool / kv_tok if kv_tok > 0 else math.inf
        if tokens < best_tokens or worst is None:
            best_tokens = tokens
            worst = {"weights_bytes": w, "activations_bytes": act, "other_bytes": other,
                     "kv_pool_bytes": max(0.0, pool), "kv_bytes_per_token": kv_tok}
    B = sched.block_tokens
    tokens = int(max(0.0, best_tokens)) if math.isfinite(best_tokens) else 1 << 40
    blocks = tokens // B
    if sched.reserve == "full":
        per = float(math.ceil((P + O) / B))
    else:
        per = (P + (O - 1) / 2.0) / B + (0.5 if B > 1 else 0.0)
    running = int(blocks // per) if per > 0 else 0
    max_running = min(running, sched.max_num_seqs)
    return KvCapacity(pool_bytes=worst["kv_pool_bytes"], capacity_tokens=tokens, blocks=blocks,
                      blocks_per_request=per, max_running=max_running, kv_limited=running < sched.max_num_seqs,
                      memory=worst, fits=best_tokens > 0 and max_running >= 1)


# --------------------------------------------------------------------------------------
# The in-flight steady state
# --------------------------------------------------------------------------------------

@dataclass
class Schedule:
    """One steady state of continuous batching on one replica (module docstring); every figure
    reported for an in-flight plan comes from these fields."""

    decode_batch: float             # d: decoding requests per step (mean)
    prefill_tokens_per_step: float  # D = d P / (O - 1)
    budget_left: float              # b = token budget - d
    chunk_tokens: float             # c: prompt tokens in a step that carries prefill
    mixed_fraction: float           # f (f_g with lock-stepped EP replicas)
    mixed_step_s: float
    decode_step_s: float
    mean_step_s: float              # = TPOT
    prefill_steps: int              # ceil(P / b): the steps a prompt's chunks take
    residual_s: float               # TTFT part: the rest of the step in progress
    queue_s: float                  # TTFT part: waiting for prefill budget (and for a free slot)
    prefill_s: float                # TTFT part: the prompt's own mixed steps
    ttft_s: float
    tpot_s: float
    request_rate_per_s: float       # X
    concurrency: float              # N = X (TTFT + (O - 1) TPOT)
    running: float                  # decoding + being prefilled
    output_tokens_per_s: float      # X O
    prefill_utilization: float      # rho = D / b
    saturated: bool                 # prefill-bound (D reached b) or capped by running slots
    passes: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "passes"}


def _lockstep(par: ParallelConfig) -> int:
    """Replicas whose MoE layers step together: ep / tp under expert parallel, else 1."""
    return par.ep // par.tp if par.ep > par.tp else 1


def inflight_point(sm: StepModel, sched: SchedulerConfig, d: float) -> Schedule:
    """The steady state with ``d`` decoding requests per step (module docstring)."""
    P, O = sm.P, sm.O
    C = sched.token_budget
    ctx = P + O / 2.0
    d = max(d, 1e-9)
    D = d * P / max(O - 1, 1e-9) if O > 1 else math.inf
    b = max(C - d, 1.0)
    saturated = D >= b
    Dq = min(D, b)
    c = min(b, max(float(P), Dq))
    f = Dq / c
    pre_seqs = max(1.0, c / P) if c >= P else 1.0
    past = (P - c) / 2.0 if c < P else 0.0
    g = _lockstep(sm.par)
    group = None
    if g > 1:
        fg = 1.0 - (1.0 - f) ** g
        chunks = g * f / fg if fg > 0 else 0.0          # replicas with a chunk, given at least one
        group = (g * d + chunks * c)
    else:
        fg = f
    t_mix, p_mix = sm.step(d, ctx, c, pre_seqs, past, group)
    t_dec, p_dec = sm.step(d, ctx)
    tau = fg * t_mix + (1.0 - fg) * t_dec
    rate = d / ((O - 1) * tau) if O > 1 else Dq / (P * tau)
    if saturated and O > 1:
        rate = b / (P * tau)              # prefill-bound: every step carries b prompt tokens
    e2 = fg * t_mix ** 2 + (1.0 - fg) * t_dec ** 2
    residual = e2 / (2.0 * tau)
    rho = min(Dq / b, 1.0)
    k = max(1, math.ceil(P / b))
    s = P / b
    queue = (rho * s / (2.0 * (1.0 - rho)) * t_mix) if rho < 1.0 else math.inf
    prefill = k * t_mix
    ttft = residual + queue + prefill
    conc = rate * (ttft + (O - 1) * tau)
    running = rate * ((O - 1) * tau + prefill)
    return Schedule(decode_batch=d, prefill_tokens_per_step=D if math.isfinite(D) else Dq, budget_left=b,
                    chunk_tokens=c, mixed_fraction=fg, mixed_step_s=t_mix, decode_step_s=t_dec, mean_step_s=tau,
                    prefill_steps=k, residual_s=residual, queue_s=queue, prefill_s=prefill, ttft_s=ttft, tpot_s=tau,
                    request_rate_per_s=rate, concurrency=conc, running=running, output_tokens_per_s=rate * O,
                    prefill_utilization=rho, saturated=saturated, passes={"mixed": p_mix, "decode": p_dec})


def max_decode_batch(sm: StepModel, sched: SchedulerConfig, kv: KvCapacity) -> float:
    """The largest ``d`` the replica sustains: prefill demand within the budget (``d P / (O-1) <
    budget - d``, kept 0.5% below the pole of the M/D/1 wait) and running requests (``d`` plus
    the prompts being prefilled, ``X k tau_mix``) within the KV pool and ``max_num_seqs``."""
    P, O, C = sm.P, sm.O, sched.token_budget
    hi = C * (O - 1) / (P + O - 1) * 0.995 if O > 1 else 1.0
    hi = min(hi, float(kv.max_running), C - 1.0)
    if hi <= 0:
        return 0.0
    pt = inflight_point(sm, sched, hi)
    if pt.running <= kv.max_running:
        return hi
    # running = d + X(d) * prefill(d): the correction is small and smooth, so a fixed point on
    # d = max_running - X prefill converges in a few steps; then step down until it holds
    d = hi
    for _ in range(8):
        extra = pt.running - pt.decode_batch
        nd = min(hi, max(kv.max_running - extra, 1e-6))
        if abs(nd - d) <= 1e-6 * max(1.0, d):
            break
        d = nd
        pt = inflight_point(sm, sched, d)
    while pt.running > kv.max_running * (1 + 1e-12) and d > 1e-6:
        d *= 0.999
        pt = inflight_point(sm, sched, d)
    return d


def inflight_at(sm: StepModel, sched: SchedulerConfig, kv: KvCapacity, *, concurrency: float | None = None,
                rate_per_s: float | None = None) -> Schedule:
    """The steady state at a fixed concurrency (closed loop: ``N`` users, each sending its next
    request when the last one finishes, as ``--max-concurrency`` benchmarks do) or request rate
    (open loop). SpecError when the rate is above what the replica sustains."""
    d_max = max_decode_batch(sm, sched, kv)
    if d_max <= 0:
        raise SpecError("no request fits the KV cache at this context")
    top = inflight_point(sm, sched, d_max)
    if rate_per_s is not None:
        if rate_per_s > top.request_rate_per_s:
            raise SpecError(f"request rate {rate_per_s:.3g}/s per replica exceeds the {top.request_rate_per_s:.3g}/s "
                            f"this replica sustains ({'prefill budget' if top.saturated else 'KV cache'} bound)")
        lo, hi = 0.0, d_max
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            if inflight_point(sm, sched, mid).request_rate_per_s < rate_per_s:
                lo = mid
            else:
                hi = mid
        return inflight_point(sm, sched, (lo + hi) / 2)
    assert concurrency is not None
    if concurrency >= top.concurrency:
        # beyond what runs at once: the extra users wait for a slot (closed loop, Little's law)
        pt = dataclasses.replace(top)
        wait = concurrency / top.request_rate_per_s - (top.ttft_s + (sm.O - 1) * top.tpot_s)
        pt.queue_s += wait
        pt.ttft_s += wait
        pt.concurrency = concurrency
        pt.saturated = True
        return pt
    lo, hi = 0.0, d_max
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        if inflight_point(sm, sched, mid).concurrency < concurrency:
            lo = mid
        else:
            hi = mid
    return inflight_point(sm, sched, (lo + hi) / 2)


def decode_grid(d_max: float, per_octave: int = 4) -> list[float]:
    """Decode batches 1..8, then ``per_octave`` geometric steps per doubling, and ``d_max``."""
    if d_max < 1:
        return [d_max] if d_max > 0 else []
    out = {float(x) for x in range(1, int(min(d_max, 8)) + 1)}
    k = 0
    while True:
        v = 8 * 2 ** (k / per_octave)
        if v >= d_max:
            break
        out.add(round(v, 3))
        k += 1
    out.add(float(d_max))
    return sorted(out)


# --------------------------------------------------------------------------------------
# Estimates in the common shape
# --------------------------------------------------------------------------------------

def _memory_at(kv: KvCapacity, running: float, sm: StepModel) -> dict[str, float]:
    """Memory per GPU at the operating point (the fullest stage): the KV cache the running
    requests hold, and the pool the engine allocates."""
    m = kv.memory
    held = running * (sm.P + (sm.O - 1) / 2.0) * m["kv_bytes_per_token"]
    return memory_parts(m["weights_bytes"], held, m["activations_bytes"], m["other_bytes"])


def _engine_bytes(kv: KvCapacity) -> float:
    """The memory the engine takes per GPU: weights, activations, buffers and its KV pool
    (``gpu_memory_utilization x GPU`` for vLLM and SGLang; TensorRT-LLM's pool is a share of
    what is left after the rest)."""
    m = kv.memory
    return memory_parts(m["weights_bytes"], kv.pool_bytes, m["activations_bytes"], m["other_bytes"])["peak_bytes"]


def _time_terms(pt: Schedule, static_time: dict | None = None) -> dict[str, float]:
    dec, mix = pt.passes["decode"], pt.passes["mixed"]
    t = {"decode_step_s": pt.decode_step_s, "mixed_step_s": pt.mixed_step_s, "mean_step_s": pt.mean_step_s,
         "ttft_residual_s": pt.residual_s, "ttft_queue_s": pt.queue_s, "ttft_prefill_s": pt.prefill_s,
         "decode_gemm_s": dec.gemm, "decode_attention_s": dec.attn, "decode_elementwise_s": dec.elementwise,
         "decode_overhead_s": dec.overhead, "decode_tp_comm_s": dec.tp, "decode_ep_comm_s": dec.ep,
         "mixed_gemm_s": mix.gemm, "mixed_attention_s": mix.attn, "mixed_tp_comm_s": mix.tp,
         "mixed_ep_comm_s": mix.ep, "mixed_overhead_s": mix.overhead + mix.elementwise}
    if static_time:
        t["prefill_s"] = static_time.get("prefill_s", 0.0)
    return t


def _estimate_from(pt: Schedule, kv: KvCapacity, sm: StepModel, sched: SchedulerConfig, d_max: float,
                   top: Schedule, gpus: int, replicas: int) -> InferenceEstimate:
    mem = _memory_at(kv, pt.running, sm)
    out_tps = pt.output_tokens_per_s * replicas
    kv_tok = kv.memory["kv_bytes_per_token"]
    schedule = {"batching": "inflight", "scheduler": sched.to_dict(), **pt.to_dict(),
                "max_decode_batch": d_max, "max_concurrency": top.concurrency,
                "kv_pool_bytes": kv.pool_bytes, "kv_capacity_tokens": kv.capacity_tokens,
                "kv_blocks": kv.blocks, "kv_blocks_per_request": kv.blocks_per_request,
                "max_running": kv.max_running, "kv_limited": kv.kv_limited, "replicas": replicas}
    est = InferenceEstimate(
        ttft_s=pt.ttft_s, tpot_s=pt.tpot_s, output_tokens_per_s=out_tps, output_tokens_per_s_per_gpu=out_tps / gpus,
        max_batch=max(1, int(round(top.concurrency))), kv_cache_bytes_per_gpu=mem["kv_cache_bytes"],
        kv_cache_bytes_per_token=kv_tok, kv_cache_capacity_tokens=kv.capacity_tokens,
        request_latency_s=pt.ttft_s + (sm.O - 1) * pt.tpot_s, prefill_s=pt.prefill_s, memory=mem,
        time=_time_terms(pt), capacity_bytes=_engine_bytes(kv),
        batch=max(1, int(round(pt.concurrency))), gpus=gpus, batching="inflight", schedule=schedule)
    est.stages = [{"layers": [st.first_layer, st.last_layer], "device_group": st.group,
                   "memory": mem, "capacity_bytes": est.capacity_bytes,
                   "fits": mem["peak_bytes"] <= est.capacity_bytes} for st in sm.stages]
    return est


class InflightReplica:
    """One replica's steady states, built once per (model, cluster, workload, split, scheduler):
    the search evaluates many points of one split."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                 sched: SchedulerConfig, stages: tuple[StageSpec, ...] | None = None):
        self.sm = StepModel(model, cluster, workload, par, stages)
        self.sched = sched
        self.kv = kv_capacity(self.sm, sched)
        self.par = par
        self._top: tuple | None = None

    def _limits(self) -> tuple:
        if self._top is None:
            d_max = max_decode_batch(self.sm, self.sched, self.kv) if self.kv.fits else 0.0
            self._top = (d_max, inflight_point(self.sm, self.sched, d_max) if d_max > 0 else None)
        return self._top

    @property
    def d_max(self) -> float:
        """The largest decode batch the replica sustains (``max_decode_batch``)."""
        return self._limits()[0]

    @property
    def top(self) -> Schedule | None:
        """The steady state at ``d_max``: the most this replica serves."""
        return self._limits()[1]

    @property
    def fits(self) -> bool:
        return self.top is not None

    def estimate(self, pt: Schedule) -> InferenceEstimate:
        return _estimate_from(pt, self.kv, self.sm, self.sched, self.d_max, self.top, self.par.world_size,
                              self.par.dp)

    def at(self, *, decode_batch: float | None = None, concurrency: float | None = None,
           rate_per_s: float | None = None) -> InferenceEstimate:
        if not self.fits:
            raise SpecError(f"no request of {self.sm.P}+{self.sm.O} tokens fits the KV pool "
                            f"({self.kv.pool_bytes / GIB:.2f} GiB per GPU at gpu_memory_utilization "
                            f"{self.sched.gpu_memory_utilization:g})")
        if decode_batch is not None:
            pt = inflight_point(self.sm, self.sched, min(decode_batch, self.d_max))
        else:
            pt = inflight_at(self.sm, self.sched, self.kv, concurrency=concurrency, rate_per_s=rate_per_s)
        return self.estimate(pt)

    def curve(self, per_octave: int = 4) -> list[InferenceEstimate]:
        """The steady states over a grid of decode batches up to the largest sustained."""
        if not self.fits:
            return []
        return [self.estimate(inflight_point(self.sm, self.sched, d)) for d in decode_grid(self.d_max, per_octave)]


def estimate_inflight(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                      sched: SchedulerConfig, *, concurrency: float | None = None, rate_per_s: float | None = None,
                      decode_batch: float | None = None,
                      stages: tuple[StageSpec, ...] | None = None) -> InferenceEstimate:
    """The in-flight estimate of one split at a concurrency per replica (default the workload's
    ``global_batch``), a request rate per replica, or a decode batch."""
    if concurrency is None and rate_per_s is None and decode_batch is None:
        concurrency = workload.global_batch
    return InflightReplica(model, cluster, workload, par, sched, stages).at(
        decode_batch=decode_batch, concurrency=concurrency, rate_per_s=rate_per_s)


# --------------------------------------------------------------------------------------
# Disaggregated prefill and decode
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pool:
    tp: int
    pp: int
    ep: int
    replicas: int

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def par(self) -> ParallelConfig:
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=self.replicas, ep=self.ep)

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "replicas": self.replicas, "gpus": self.gpus}


def pool_cluster(cluster: ClusterSpec, pool: Pool) -> ClusterSpec:
    """The cluster a pool runs on: its GPUs, whole nodes or part of one."""
    return cluster.with_gpus(pool.gpus)


class PrefillPool:
    """A pool of prefill-only instances: service time per prompt, one prompt's latency, memory."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, pool: Pool, sched: SchedulerConfig):
        self.pool = pool
        self.sm = StepModel(model, pool_cluster(cluster, pool), workload, pool.par)
        self.alone_s, self.service_s = self.sm.prefill_time(self.sm.P, sched.token_budget)
        sv = self.sm.sv
        cap = self.sm.cluster.gpu.memory_bytes
        worst = None
        for i, st in enumerate(self.sm.stages):
            act = sv.activation_bytes(sched.token_budget, max(1, sched.token_budget // self.sm.P), i == pool.pp - 1)
            kv = (sched.token_budget + self.sm.P) * st.num_layers * sv.kv_layer   # the chunks in flight
            parts = stage_memory_parts(sv, st, i, kv, act)
            if worst is None or parts["peak_bytes"] > worst["peak_bytes"]:
                worst = parts
        self.memory = worst
        self.fits = worst["peak_bytes"] <= sched.gpu_memory_utilization * cap


def kv_transfer_s(model: ModelSpec, cluster: ClusterSpec, workload: Workload, prefill: Pool, decode: Pool,
                  cross_node: bool) -> float:
    """Seconds to ship one request's KV cache (all layers, ``P`` tokens) from a prefill instance to
    a decode instance: ``min(g_p, g_d)`` GPU pairs in parallel (each TP/PP rank sends its heads and
    layers; NIXL and Mooncake move per-rank block lists), each at the tier's point-to-point
    bandwidth (``costmodel.comm.Network.p2p``: measured where the profiler measured it)."""
    from .comm import Network
    P = workload.prompt_len
    total = P * kv_bytes_per_token(model, kv_dtype_of(workload))
    streams = min(prefill.gpus_per_instance, decode.gpus_per_instance)
    return launched(Network(cluster).p2p(total / streams, cross_node, ranks=0))   # NIXL/Mooncake, not NCCL


@dataclass
class DisaggPoint:
    prefill: Pool
    decode: Pool
    decode_batch: float
    ttft_s: float
    tpot_s: float
    request_rate_per_s: float
    output_tokens_per_s: float
    concurrency: float
    prefill_utilization: float
    queue_s: float
    prefill_s: float
    kv_transfer_s: float
    decode_step_s: float
    cross_node: bool


def transfer_crosses_nodes(cluster: ClusterSpec, prefill: Pool, decode: Pool) -> bool:
    """KV moves over NVLink only when the whole deployment sits in one NVLink domain (a host, or
    a multi-host domain such as NVL72); otherwise it goes over the network. The rule is
    ``comm.crosses_nodes``, on the deployment's ranks as one group."""
    return crosses_nodes({"gpus": prefill.gpus + decode.gpus}, ("gpus",), "gpus", cluster.nvlink_gpus)


def disagg_point(pre: PrefillPool, dec: InflightReplica, d: float, t_kv: float, cross: bool,
                 prefill: Pool | None = None, decode: Pool | None = None) -> DisaggPoint | None:
    """The steady state of ``prefill`` instances (each like ``pre``) feeding ``decode`` instances
    (each like ``dec``) with ``d`` decoding requests per decode instance (module docstring); None
    when the prefill pool cannot keep up."""
    prefill = prefill or pre.pool
    decode = decode or Pool(dec.par.tp, dec.par.pp, dec.par.ep, dec.par.dp)
    sm = dec.sm
    O = sm.O
    t_dec, _ = sm.step(d, sm.P + O / 2.0)
    rate = decode.replicas * d / (O * t_dec)
    rho = rate * pre.service_s / prefill.replicas
    if rho >= 1.0:
        return None
    queue = rho * pre.service_s / (2.0 * (1.0 - rho))
    ttft = queue + pre.alone_s + t_kv + 1.5 * t_dec        # residual of the decoder's step + its first step
    conc = rate * (ttft + (O - 1) * t_dec)
    return DisaggPoint(prefill=prefill, decode=decode, decode_batch=d, ttft_s=ttft, tpot_s=t_dec,
                       request_rate_per_s=rate, output_tokens_per_s=rate * O, concurrency=conc,
                       prefill_utilization=rho, queue_s=queue, prefill_s=pre.alone_s, kv_transfer_s=t_kv,
                       decode_step_s=t_dec, cross_node=cross)


def decode_capacity(dec: InflightReplica) -> float:
    """Decoding requests a decode instance holds: the KV pool (plus the one being received) and
    max_num_seqs."""
    return float(max(0, dec.kv.max_running - 1))


def disagg_estimate(pt: DisaggPoint, pre: PrefillPool, dec: InflightReplica, gpus: int) -> InferenceEstimate:
    """A disaggregated steady state in the common estimate shape: memory is the pool nearer its
    limit, ``stages`` the decode pool's, ``schedule.disaggregation`` both pools."""
    sm = dec.sm
    held = pt.decode_batch * (sm.P + sm.O / 2.0) * dec.kv.memory["kv_bytes_per_token"]
    m = dec.kv.memory
    dmem = {"peak_bytes": m["weights_bytes"] + held + m["activations_bytes"] + m["other_bytes"],
            "weights_bytes": m["weights_bytes"], "kv_cache_bytes": held, "activations_bytes": m["activations_bytes"],
            "other_bytes": m["other_bytes"]}
    cap = _engine_bytes(dec.kv)
    mem = dmem if dmem["peak_bytes"] >= pre.memory["peak_bytes"] else dict(pre.memory)
    out_tps = pt.output_tokens_per_s
    sched = dec.sched
    schedule = {"batching": "disaggregated", "scheduler": sched.to_dict(),
                "disaggregation": {"prefill": {**pt.prefill.to_dict(), "memory": dict(pre.memory),
                                               "prefill_one_prompt_s": pre.alone_s,
                                               "service_per_prompt_s": pre.service_s,
                                               "utilization": pt.prefill_utilization},
                                   "decode": {**pt.decode.to_dict(), "memory": dmem, "decode_batch": pt.decode_batch,
                                              "max_running": dec.kv.max_running},
                                   "kv_transfer_s": pt.kv_transfer_s, "kv_transfer_tier":
                                       "network" if pt.cross_node else "nvlink",
                                   "ratio": f"{pt.prefill.gpus}:{pt.decode.gpus}"},
                "decode_batch": pt.decode_batch, "request_rate_per_s": pt.request_rate_per_s,
                "concurrency": pt.concurrency, "ttft_s": pt.ttft_s, "tpot_s": pt.tpot_s,
                "queue_s": pt.queue_s, "prefill_s": pt.prefill_s, "decode_step_s": pt.decode_step_s,
                "output_tokens_per_s": out_tps, "kv_pool_bytes": dec.kv.pool_bytes,
                "kv_capacity_tokens": dec.kv.capacity_tokens}
    time = {"decode_step_s": pt.decode_step_s, "ttft_queue_s": pt.queue_s, "ttft_prefill_s": pt.prefill_s,
            "ttft_kv_transfer_s": pt.kv_transfer_s, "ttft_decode_join_s": 1.5 * pt.decode_step_s}
    est = InferenceEstimate(
        ttft_s=pt.ttft_s, tpot_s=pt.tpot_s, output_tokens_per_s=out_tps, output_tokens_per_s_per_gpu=out_tps / gpus,
        max_batch=int(decode_capacity(dec)), kv_cache_bytes_per_gpu=held,
        kv_cache_bytes_per_token=dec.kv.memory["kv_bytes_per_token"], kv_cache_capacity_tokens=dec.kv.capacity_tokens,
        request_latency_s=pt.ttft_s + (sm.O - 1) * pt.tpot_s, prefill_s=pt.prefill_s, memory=mem, time=time,
        capacity_bytes=cap, batch=max(1, int(round(pt.concurrency))), gpus=gpus, batching="disaggregated",
        schedule=schedule)
    est.stages = [{"layers": [st.first_layer, st.last_layer], "device_group": st.group, "memory": dmem,
                   "capacity_bytes": cap, "fits": dmem["peak_bytes"] <= cap} for st in sm.stages]
    return est


def estimate_disaggregated(model: ModelSpec, cluster: ClusterSpec, workload: Workload, prefill: Pool, decode: Pool,
                           sched: SchedulerConfig, *, decode_batch: float | None = None,
                           prefill_sched: SchedulerConfig | None = None) -> InferenceEstimate:
    """One disaggregated layout at ``decode_batch`` decoding requests per decode instance (default:
    the most the decode pool holds that the prefill pool keeps up with)."""
    gpus = prefill.gpus + decode.gpus
    if gpus > cluster.total_gpus:
        raise SpecError(f"prefill {prefill.gpus} + decode {decode.gpus} GPUs exceed the cluster's {cluster.total_gpus}")
    pre = PrefillPool(model, cluster, workload, prefill, prefill_sched or sched)
    dec = InflightReplica(model, pool_cluster(cluster, decode), workload, decode.par, sched)
    cross = transfer_crosses_nodes(cluster, prefill, decode)
    t_kv = kv_transfer_s(model, cluster, workload, prefill, decode, cross)
    d_cap = decode_capacity(dec)
    if d_cap < 1 or not pre.fits:
        raise SpecError(f"the {'decode' if d_cap < 1 else 'prefill'} pool does not fit: {model.name} at "
                        f"{workload.prompt_len}+{workload.output_len} tokens")
    if decode_batch is None:
        lo, hi = 0.0, d_cap
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            if disagg_point(pre, dec, mid, t_kv, cross) is None:
                hi = mid
            else:
                lo = mid
        decode_batch = lo
    pt = disagg_point(pre, dec, min(decode_batch, d_cap), t_kv, cross)
    if pt is None:
        raise SpecError(f"the prefill pool ({prefill.replicas} x tp{prefill.tp}) cannot keep up with "
                        f"{decode.replicas} decode instances at {decode_batch:g} requests each")
    return disagg_estimate(pt, pre, dec, gpus)


def synchronized_ttft(rep: InflightReplica, users: float) -> float:
    """Mean TTFT of a closed loop's first round when all ``users`` send at once, as fixed-length
    concurrency benchmarks start: the prompts fill full-budget steps in arrival order beside the
    decodes of the prompts already done; users beyond the running cap wait as in the steady state.
    An upper reference for benchmark TTFTs (their later rounds spread out towards the steady
    state, ``inflight_point``, the lower one)."""
    sm, sched = rep.sm, rep.sched
    P, C = sm.P, sched.token_budget
    R = min(float(users), float(rep.kv.max_running))
    done = t = total = 0.0
    left = R * P
    while left > 1e-9:
        b = max(C - done, 1.0)
        c = min(b, left)
        tau, _ = sm.step(done, P, c, max(1.0, c / P), 0.0)
        t += tau
        total += c / P * t
        done += c / P
        left -= c
    wave = total / R
    if users > R:
        return (R * wave + (users - R) * rep.at(concurrency=users).ttft_s) / users
    return wave


def estimate_serving(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                     serving: dict | None, stages: tuple[StageSpec, ...] | None = None) -> InferenceEstimate:
    """The estimate a serving plan's figures came from, rebuilt from its ``serving`` section (the
    batching, the scheduler, the operating point or the pools): static plans and plans without a
    section use ``estimate_inference`` at the workload's batch."""
    from .inference import estimate_inference
    serving = dict(serving or {})
    batching = serving.get("batching", "static")
    if batching == "static" or not serving.get("scheduler"):
        return estimate_inference(model, cluster, workload, par, stages=stages)
    sched = SchedulerConfig(**serving["scheduler"])
    if batching == "disaggregated":
        dis = serving["disaggregation"]
        pools = [Pool(**{k: int(dis[r][k]) for k in ("tp", "pp", "ep", "replicas")}) for r in ("prefill", "decode")]
        return estimate_disaggregated(model, cluster, workload, pools[0], pools[1], sched,
                                      decode_batch=float(dis["decode_batch"]))
    d = (serving.get("operating_point") or {}).get("decode_batch")
    if d:
        return estimate_inflight(model, cluster, workload, par, sched, decode_batch=float(d), stages=stages)
    return estimate_inflight(model, cluster, workload, par, sched, concurrency=workload.global_batch, stages=stages)


__all__ = ["estimate_serving", "synchronized_ttft", "SchedulerConfig", "scheduler_defaults",
           "StepModel", "KvCapacity", "kv_capacity", "Schedule",
           "inflight_point", "inflight_at", "max_decode_batch", "decode_grid", "InflightReplica", "estimate_inflight",
           "Pool", "PrefillPool", "kv_transfer_s", "DisaggPoint", "disagg_point", "disagg_estimate",
           "estimate_disaggregated", "transfer_crosses_nodes", "decode_capacity", "SERVERS", "BATCHING",
           "DEFAULT_UTILIZATION"]
