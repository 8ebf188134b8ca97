"""What the serving emitters (vLLM, SGLang, TensorRT-LLM) share: the checks every engine makes on
an inference plan, the multi-node layout, and the memory numbers taken from the plan's estimate.

Inference plans: ``parallel.tp``/``pp`` shard one replica, ``parallel.dp`` is the number of
replicas, ``parallel.ep`` spreads experts over the data-parallel ranks; ``workload.global_batch``
is the concurrent sequences per replica and ``workload.seq_len`` = prompt + output tokens. The
estimate's ``memory`` holds ``peak_bytes``, ``weights_bytes``, ``kv_cache_bytes``,
``activations_bytes`` and ``other_bytes`` per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from emitters.base import CannotExpress, ceil_fraction, estimate_memory, require, require_mode, require_one_group
from planner.plan.planfile import Plan


@dataclass(frozen=True)
class Layout:
    replica_gpus: int        # tp * pp
    nnodes: int
    gpus_per_node: int       # GPUs the plan uses on each node
    replicas_per_node: int   # 0 when a replica spans nodes


def check(plan: Plan, target: str) -> None:
    require_mode(plan, target, "infer")
    require_one_group(plan, target)
    p = plan.parallel
    require(p.cp == 1, target, f"cp={p.cp}", f"{target} has no context parallel matching the plan's",
            "plan cp=1")
    require(p.vpp == 1, target, f"vpp={p.vpp}", "virtual pipeline stages are a training schedule")
    if p.ep > 1 and not plan.model.is_moe:
        raise CannotExpress(target, f"ep={p.ep}", f"{plan.model.name} has no experts")


def layout(plan: Plan, target: str) -> Layout:
    p = plan.parallel
    gpn = plan.cluster.gpus_per_node
    replica = p.tp * p.pp
    world = plan.world_size
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


WEIGHT_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "fp32": "float32", "float32": "float32"}
