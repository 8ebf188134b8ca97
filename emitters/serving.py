"""What the serving emitters (vLLM, SGLang, TensorRT-LLM) share: the checks every engine makes on
an inference plan, the multi-node layout, the model id to load, the scheduler settings the plan
assumed, the engine's memory share, and where each instance of a disaggregated plan runs.

Inference plans: ``parallel.tp``/``pp`` shard one replica, ``parallel.dp`` is the number of
replicas, ``parallel.ep`` spreads experts over the data-parallel ranks; ``workload.global_batch``
is the concurrent sequences per replica and ``workload.seq_len`` = prompt + output tokens. The
estimate's ``memory`` holds ``peak_bytes``, ``weights_bytes``, ``kv_cache_bytes``,
``activations_bytes`` and ``other_bytes`` per GPU. The plan's ``serving`` section (plans from
``planner plan --mode infer``) adds the batching the figures assume, the engine's scheduler
settings, the Hugging Face id and, for disaggregated plans, the prefill pool (``parallel`` is
then the decode pool).

The model: the plan's Hugging Face id (``serving.hf_id``: from ``--hf-id``, the config's
``_name_or_path`` or the catalog's id), never a catalog nickname; without one, ``MODEL`` must be
set. Older plans without a ``serving`` section leave the scheduler flags at the engine's
defaults, as their figures (static batches) assumed no particular budget.

Memory: in-flight plans sized the engine's KV pool at ``serving.scheduler.gpu_memory_utilization``
(default 0.90), and the files pass that value, so the server sizes its pool as the plan did. Older
plans without a ``serving`` section get the estimate's peak fraction plus ``HEADROOM`` (CUDA
graphs, NCCL buffers and allocator fragmentation that the engines' memory profiling does not
see), and never less than the engines' default 0.90: the bare fraction the plan needs would
leave the KV pool no slack for a request longer than the plan's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from emitters.base import (CannotExpress, ceil_fraction, estimate_memory, one_line, require, require_mode,
                           require_one_group, sh, sh_default)
from planner.plan.planfile import Plan

DEFAULT_UTILIZATION = 0.90   # vLLM's CacheConfig default before 0.11 (0.92 after), TensorRT-LLM's free fraction
HEADROOM = 0.05          # of GPU memory, above the estimated peak, for plans without a serving section
MAX_UTILIZATION = 0.95   # the most of a GPU the files give an engine
MEMORY_FLAG = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static",
               "tensorrt-llm": "--kv_cache_free_gpu_memory_fraction"}


@dataclass(frozen=True)
class Layout:
    replica_gpus: int        # tp * pp
    nnodes: int
    gpus_per_node: int       # GPUs the plan uses on each node
    replicas_per_node: int   # 0 when a replica spans nodes


@dataclass(frozen=True)
class Settings:
    """What the engine is told, from the plan (module docstring)."""

    model_id: str | None          # Hugging Face id (or absolute path), None: MODEL must be set
    batching: str                 # static | inflight | disaggregated
    engine: str                   # the engine whose scheduler the plan modelled
    token_budget: int | None      # tokens per scheduler step (None: the engine's default)
    max_num_seqs: int             # running requests per replica (decode instance)
    block_tokens: int | None
    utilization: float            # share of GPU memory for the engine
    note: str                     # how utilization was chosen


def check(plan: Plan, target: str) -> None:
    require_mode(plan, target, "infer")
    require_one_group(plan, target)
    p = plan.parallel
    require(p.cp == 1, target, f"cp={p.cp}", f"{target} has no context parallel matching the plan's",
            "plan cp=1")
    require(p.vpp == 1, target, f"vpp={p.vpp}", "virtual pipeline stages are a training schedule")
    if p.ep > 1 and not plan.model.is_moe:
        raise CannotExpress(target, f"ep={p.ep}", f"{plan.model.name} has no experts")


def context_limit(plan: Plan) -> int:
    """The longest request (prompt + output tokens) the engine is told to accept (vLLM
    ``--max-model-len``, SGLang ``--context-length``): the model's context, capped by the tokens one
    replica's KV pool holds (the plan's ``kv_cache_capacity_tokens``), and never below the planned
    prompt + output. Prompt + output exactly would refuse a prompt one token longer than planned;
    the figures are still for the planned lengths."""
    w = plan.workload
    room = int((plan.estimate or {}).get("kv_cache_capacity_tokens") or 0)
    limit = min(plan.model.max_seq_len, room) if room else w.seq_len
    return max(w.seq_len, limit)


def disaggregation(plan: Plan) -> dict | None:
    """The plan's prefill/decode pools, or None for an aggregated plan."""
    return (plan.serving or {}).get("disaggregation") or None


def require_aggregated(plan: Plan, target: str) -> None:
    if disaggregation(plan):
        raise CannotExpress(target, "disaggregated prefill/decode pools",
                            f"this emitter writes aggregated servers for {target}",
                            "emit for vllm or sglang, which write the prefill, decode and proxy scripts")


def layout(plan: Plan, target: str) -> Layout:
    p = plan.parallel
    gpn = plan.cluster.gpus_per_node
    replica = p.tp * p.pp
    world = p.world_size
    if world <= gpn:
        return Layout(replica, 1, world, p.dp)
    require(world % gpn == 0, target, f"world size {world}", f"{world} GPUs do not fill whole nodes of {gpn}")
    nnodes = world // gpn
    if replica <= gpn:
        require(gpn % replica == 0, target, f"replicas of {replica} GPUs on nodes of {gpn}",
                "a replica would straddle two nodes")
        return Layout(replica, nnodes, gpn, gpn // replica)
    return Layout(replica, nnodes, gpn, 0)


def memory(plan: Plan) -> dict:
    return estimate_memory(plan)


def fraction(target: str, what: str, need_bytes: float, of_bytes: float) -> float:
    """``need / of`` rounded up to 0.01; refused above 1 (the plan does not fit as estimated)."""
    if of_bytes <= 0:
        raise CannotExpress(target, what, f"nothing left for it ({of_bytes / 2**30:.2f} GiB)")
    x = ceil_fraction(need_bytes / of_bytes)
    if x > 1.0:
        raise CannotExpress(target, what, f"the estimate needs {need_bytes / 2**30:.2f} GiB of "
                            f"{of_bytes / 2**30:.2f} GiB", "re-plan with more sharding")
    return max(x, 0.01)


def model_id(plan: Plan) -> str | None:
    return (plan.serving or {}).get("hf_id") or None


def model_line(plan: Plan, var: str = "MODEL") -> str:
    """``MODEL="${MODEL:-org/name}"``, or a line that stops with a message when there is no id."""
    # the id and the name come from files: quoted for the shell, on one line (emitters.base)
    mid = model_id(plan)
    if mid:
        return sh_default(var, mid)
    msg = (f"set {var} to the Hugging Face id or local path of {one_line(plan.model.name)} (the plan has no "
           "Hugging Face id: plan with --hf-id)")
    return f'if [ -z "${{{var}:-}}" ]; then echo {sh(msg)} >&2; exit 2; fi\n'


def settings(plan: Plan, target: str) -> Settings:
    """The scheduler settings and memory share the files pass (module docstring)."""
    srv = plan.serving or {}
    sched = srv.get("scheduler") or {}
    engine = srv.get("engine") or target
    batching = srv.get("batching") or "static"
    total = plan.cluster.gpu.memory_bytes
    mem = memory(plan)
    need = mem.get("peak_bytes", 0.0) / total if mem else 0.0
    if sched:
        util = float(sched["gpu_memory_utilization"])
        require(need <= util + 1e-9, target, f"{MEMORY_FLAG.get(target, 'memory share')} at {util:g}",
                f"the estimate needs {need:.3f} of the GPU", "re-plan with a higher --gpu-memory-utilization")
        note = (f"memory share {util:.2f}: the plan sized the KV pool at this share "
                f"(the operating point needs {need:.2f})")
    else:
        util = max(DEFAULT_UTILIZATION, ceil_fraction(need + HEADROOM))
        if util > MAX_UTILIZATION + 1e-9:
            raise CannotExpress(target, f"the memory share ({MEMORY_FLAG.get(target, 'memory')})",
                                f"the estimate needs {need:.3f} of the GPU, which leaves "
                                f"less than {HEADROOM:g} headroom under {MAX_UTILIZATION:g}",
                                "re-plan with more sharding or fp8 KV cache")
        note = (f"memory share {util:.2f} = max(the engines' default {DEFAULT_UTILIZATION:g}, estimated peak "
                f"{need:.2f} + {HEADROOM:g} headroom), so the KV pool holds more than the plan's batch")
    dis = disaggregation(plan)
    budget = int(sched["token_budget"]) if sched.get("token_budget") else None
    if dis:
        seqs = max(1, math.ceil(float(dis.get("decode_batch", plan.workload.global_batch)))) + 1
    else:
        op = srv.get("operating_point") or {}
        seqs = max(plan.workload.global_batch, math.ceil(float(op.get("concurrency", 0.0)) - 1e-9))
    return Settings(model_id=model_id(plan), batching=batching, engine=engine, token_budget=budget,
                    max_num_seqs=int(seqs), block_tokens=int(sched["block_tokens"]) if sched.get("block_tokens") else None,
                    utilization=round(util, 4), note=note)


def batching_note(s: Settings, target: str) -> str:
    if s.token_budget is None:
        return (f"the plan assumed static batches and no scheduler settings; {target} batches continuously with "
                "its default token budget, so expect the figures of `planner plan --batching inflight`")
    if s.batching == "static":
        return (f"the plan assumed static batches; {target} batches continuously, so expect the figures of "
                "`planner plan --batching inflight` for the same split")
    if s.engine != target:
        return (f"the plan modelled {s.engine}'s scheduler; these flags set {target}'s to the same token budget "
                f"({s.token_budget}) and request cap ({s.max_num_seqs})")
    return f"scheduler as planned: {s.token_budget} tokens per step, at most {s.max_num_seqs} running requests"


# --------------------------------------------------------------------------------------
# Disaggregated plans: where each instance runs
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instance:
    role: str                # prefill | decode
    index: int
    node: int
    first_gpu: int           # on its node
    gpus: int
    tp: int
    pp: int

    @property
    def visible(self) -> str:
        return ",".join(str(self.first_gpu + k) for k in range(self.gpus))


def instances(plan: Plan, target: str) -> list[Instance]:
    """Prefill instances on the first GPUs, decode instances after them, each inside one node."""
    dis = disaggregation(plan)
    assert dis is not None
    gpn = plan.cluster.gpus_per_node
    out, at = [], 0
    for role in ("prefill", "decode"):
        pool = dis[role]
        tp, pp, r = int(pool["tp"]), int(pool["pp"]), int(pool["replicas"])
        g = tp * pp
        for i in range(r):
            node, first = divmod(at, gpn)
            require(first + g <= gpn, target, f"{role} instance {i} of {g} GPUs",
                    f"it would straddle nodes {node} and {node + 1} (GPUs {at}..{at + g - 1} on nodes of {gpn})",
                    "plan pools whose instances fit a node")
            out.append(Instance(role, i, node, first, g, tp, pp))
            at += g
    return out


def pool_notes(plan: Plan) -> list[str]:
    dis = disaggregation(plan)
    if not dis:
        return []
    p, d = dis["prefill"], dis["decode"]
    return [f"disaggregated: prefill {p['replicas']} x tp{p['tp']} pp{p['pp']}, decode {d['replicas']} x tp{d['tp']} "
            f"pp{d['pp']}; KV cache moves over {dis.get('kv_transfer_tier', 'the network')} "
            f"(predicted {float(dis.get('kv_transfer_s', 0.0)) * 1e3:.2f} ms per request)"]


WEIGHT_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "fp32": "float32", "float32": "float32"}
