"""Bounds on every number the planner accepts, and the type check of the spec dataclasses.

A spec field is checked against its annotation (an ``int`` field takes an integer and not a
bool; a ``float`` field a finite number, not a bool, not NaN or infinity; a ``str`` field a
string; a ``bool`` field a bool) and against the range below. The ranges are physical where
physics gives one (an efficiency is a fraction, a bandwidth is positive, reserved memory is
less than the memory) and otherwise a generous practical ceiling: far above any machine or
model that exists, low enough that the search and the cost model finish in seconds and no
product of two of them overflows a float. A value past a ceiling is almost always a typo
(``num_hidden_layers: 1000000000000``), so it is refused before any work starts.

Pure: no I/O. The ``__post_init__`` of each spec calls ``check_types`` first and ``check_ranges``
last (raising its ``SpecError``), so its own messages for the common mistakes come first.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

# ---- ceilings (inclusive) --------------------------------------------------------------
MAX_GPUS = 1 << 20                 # 1,048,576 accelerators in one cluster (the largest today: ~10^5)
MAX_GPUS_PER_NODE = 1024           # a scale-up domain (NVL72 has 72, a CPU host has its cores)
MAX_NODES = MAX_GPUS
MAX_LAYERS = 4096                  # transformer blocks (the deepest published: ~200)
MAX_HIDDEN = 1 << 20               # model width (GPT-3 175B: 12,288)
MAX_FFN = 1 << 22                  # MLP width
MAX_HEADS = 1 << 16                # attention heads
MAX_VOCAB = 1 << 24                # vocabulary (the largest published: ~256k)
MAX_EXPERTS = 1 << 16              # routed experts per MoE layer (DeepSeek-V3: 256)
MAX_SEQ = 1 << 24                  # tokens per sequence, 16,777,216 (the longest published: ~10M)
MAX_BATCH = 1 << 24                # sequences per step or per micro-batch
MAX_SEED = (1 << 63) - 1
MAX_PARAMS = 1e15                  # a published parameter count
MAX_MEMORY_BYTES = float(1 << 50)  # 1 PiB per accelerator
MAX_FLOPS = 1e18                   # 1 EFLOP/s per accelerator, any dtype
MAX_BANDWIDTH = 1e15               # 1 PB/s per accelerator or link
MAX_LATENCY_S = 1.0                # one hop of a link
MAX_LAYER_OVERHEAD_S = 1.0         # host time per layer per micro-batch
MAX_PRICE = 1e6                    # USD per accelerator-hour
MAX_POWER_W = 1e5                  # watts per accelerator (board power, a power limit)
MAX_HALF_SIZE = 1e6                # GEMM size at half efficiency
MAX_MESSAGE_BYTES = float(1 << 50)
MAX_SOFTCAP = 1e4                  # a logit soft-cap (Gemma 2: 50 and 30)
MAX_NAME = 256                     # characters in a model, cluster, GPU, link or group name
MAX_ROPE_THETA = 1e12              # RoPE base (published: 1e4 to 1e8)
MAX_ROPE_SCALING = 1e3             # RoPE stretch factor (Llama 3.1: 8; 1000 stretches 8k tokens to 8M)
MAX_STORAGE_TOTAL = 1e18           # a cluster's file system, bytes/s (1 EB/s; the largest today: ~10 TB/s)
MAX_NODE_MTBF_S = 3.6e10           # 10^7 hours (1,100 years) between failures of one node (Llama 3: 6,335 h)

# (lo, hi, lo_exclusive) per (class, field); a field left out has only its type checked.
_POS = True      # lo exclusive: > lo
_NN = False      # lo inclusive: >= lo
BOUNDS: dict[tuple[str, str], tuple[float, float, bool]] = {
    **{("ModelSpec", k): v for k, v in {
        "layers": (1, MAX_LAYERS, _NN), "hidden": (1, MAX_HIDDEN, _NN), "ffn_hidden": (1, MAX_FFN, _NN),
        "heads": (1, MAX_HEADS, _NN), "vocab": (1, MAX_VOCAB, _NN), "kv_heads": (0, MAX_HEADS, _NN),
        "head_dim": (0, MAX_HIDDEN, _NN), "max_seq_len": (1, MAX_SEQ, _NN),
        "num_experts": (0, MAX_EXPERTS, _NN), "top_k": (0, MAX_EXPERTS, _NN),
        "shared_experts": (0, MAX_EXPERTS, _NN), "expert_ffn_hidden": (0, MAX_FFN, _NN),
        "shared_expert_ffn_hidden": (0, MAX_FFN, _NN), "first_dense_layers": (0, MAX_LAYERS, _NN),
        "moe_layer_freq": (1, MAX_LAYERS, _NN), "router_groups": (0, MAX_EXPERTS, _NN),
        "router_topk_groups": (0, MAX_EXPERTS, _NN), "mtp_layers": (0, MAX_LAYERS, _NN),
        "router_aux_coeff": (0, 1e3, _NN), "q_lora_rank": (0, MAX_HIDDEN, _NN),
        "kv_lora_rank": (0, MAX_HIDDEN, _NN), "qk_nope_head_dim": (0, MAX_HIDDEN, _NN),
        "qk_rope_head_dim": (0, MAX_HIDDEN, _NN), "v_head_dim": (0, MAX_HIDDEN, _NN),
        "sliding_window": (0, MAX_SEQ, _NN), "sliding_window_pattern": (0, MAX_LAYERS, _NN),
        "attn_softcap": (0, MAX_SOFTCAP, _NN), "final_softcap": (0, MAX_SOFTCAP, _NN),
        "published_params": (0, MAX_PARAMS, _NN), "rope_theta": (0, MAX_ROPE_THETA, _POS),
        "rope_scaling": (0, MAX_ROPE_SCALING, _NN), "norm_eps": (0, 1, _POS)}.items()},
    **{("GpuSpec", k): v for k, v in {
        "memory_bytes": (0, MAX_MEMORY_BYTES, _POS), "hbm_bandwidth_bytes_per_s": (0, MAX_BANDWIDTH, _POS),
        "matmul_efficiency": (0, 1, _POS), "matmul_half_size": (0, MAX_HALF_SIZE, _NN),
        "reserved_bytes": (0, MAX_MEMORY_BYTES, _NN), "price_per_hour": (0, MAX_PRICE, _NN),
        "layer_overhead_s": (0, MAX_LAYER_OVERHEAD_S, _NN), "fsdp2_block_s": (0, MAX_LAYER_OVERHEAD_S, _NN),
        "dtensor_param_step_s": (0, MAX_LAYER_OVERHEAD_S, _NN),
        "dtensor_tp_layer_s": (0, MAX_LAYER_OVERHEAD_S, _NN), "serving_matmul_efficiency": (0, 1, _NN),
        "tdp_w": (0, MAX_POWER_W, _NN), "power_limit_w": (0, MAX_POWER_W, _NN),
        "clock_factor": (0, 2, _POS), "host_link_bytes_per_s": (0, MAX_BANDWIDTH, _NN),
        "host_memory_bytes": (0, MAX_MEMORY_BYTES, _NN)}.items()},
    **{("LinkSpec", k): v for k, v in {
        "bandwidth_bytes_per_s": (0, MAX_BANDWIDTH, _POS), "latency_s": (0, MAX_LATENCY_S, _NN),
        "efficiency": (0, 1, _POS), "mesh_peers": (0, MAX_GPUS_PER_NODE, _NN)}.items()},
    ("NodeGroup", "gpus_per_node"): (1, MAX_GPUS_PER_NODE, _NN),
    ("NodeGroup", "nodes"): (1, MAX_NODES, _NN),
    ("NodeGroup", "nvlink_domain"): (0, MAX_GPUS_PER_NODE, _NN),
    ("ClusterSpec", "compute_comm_slowdown"): (0, 1, _NN),
    ("ClusterSpec", "storage_bytes_per_s_per_node"): (0, MAX_BANDWIDTH, _NN),
    ("ClusterSpec", "storage_total_bytes_per_s"): (0, MAX_STORAGE_TOTAL, _NN),
    ("ClusterSpec", "node_mtbf_s"): (0, MAX_NODE_MTBF_S, _NN),
    **{("Workload", k): v for k, v in {
        "global_batch": (1, MAX_BATCH, _NN), "seq_len": (1, MAX_SEQ, _NN), "seed": (0, MAX_SEED, _NN),
        "prompt_len": (0, MAX_SEQ, _NN), "output_len": (0, MAX_SEQ, _NN)}.items()},
    **{("ParallelConfig", k): (1, MAX_GPUS, _NN) for k in ("tp", "pp", "dp", "cp", "ep", "vpp")},
    ("ParallelConfig", "micro_batch"): (1, MAX_BATCH, _NN),
    ("ParallelConfig", "grad_accum"): (1, MAX_BATCH, _NN),
    ("ParallelConfig", "dp_shard"): (0, MAX_GPUS, _NN),
    ("ParallelConfig", "etp"): (0, MAX_GPUS, _NN),
    ("ParallelConfig", "zero"): (0, 3, _NN),
    ("ParallelConfig", "recompute_layers"): (-1, MAX_LAYERS, _NN),
}

# the annotation kinds checked; others (mappings, tuples of specs) are checked by their class
_KINDS = {"int": int, "float": float, "str": str, "bool": bool}


def _plan_for(cls: type) -> tuple[tuple[str, str, tuple[float, float, bool] | None], ...]:
    """(field, kind, bounds) for each checked field of ``cls``, computed once per class."""
    plan = cls.__dict__.get("_field_checks")
    if plan is None:
        plan = tuple((f.name, f.type, BOUNDS.get((cls.__name__, f.name)))
                     for f in dataclasses.fields(cls) if f.type in _KINDS)
        setattr(cls, "_field_checks", plan)
    return plan


def describe(v: Any) -> str:
    """A value for a message: short, one line (a container is named, never printed: a YAML alias
    bomb would take minutes to print)."""
    if v is None or isinstance(v, (bool, int, float, str)) or (isinstance(v, (list, tuple, dict)) and not v):
        s = repr(v)
        return s if len(s) <= 60 else s[:57] + "..."
    return f"a {type(v).__name__}"


def type_problem(kind: str, v: Any) -> str | None:
    """What is wrong with ``v`` as a value of annotation ``kind`` (None: nothing)."""
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an integer, got {describe(v)}"
    elif kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number, got {describe(v)}"
        if not math.isfinite(v):
            return f"must be a finite number, got {v}"
    elif kind == "str":
        if not isinstance(v, str):
            return f"must be a string, got {describe(v)}"
    elif kind == "bool":
        if not isinstance(v, bool):
            return f"must be true or false, got {describe(v)}"
    return None


def num(x: float) -> str:
    """A bound or a value for a message: integers in full with thousands separators."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e16):
        return f"{int(x):,}"
    return f"{x:g}"


def range_problem(v: float, bounds: tuple[float, float, bool]) -> str | None:
    lo, hi, lo_open = bounds
    if (v <= lo) if lo_open else (v < lo):
        return f"must be {'>' if lo_open else '>='} {num(lo)}, got {num(v)}"
    if v > hi:
        return f"must be at most {num(hi)}, got {num(v)}"
    return None


_EXACT = {"int": int, "str": str, "bool": bool}


def check_types(obj: Any, where: str, error: type[Exception] = ValueError) -> None:
    """The type of every scalar field of a spec dataclass; ``error`` naming the first bad one.
    (Specs are built per candidate in the search, so the common case is a type identity test.)"""
    d = obj.__dict__
    for name, kind, _ in _plan_for(type(obj)):
        v = d[name]
        t = type(v)
        if t is _EXACT.get(kind) or (kind == "float" and (t is float or t is int) and v - v == 0):
            continue
        bad = type_problem(kind, v)
        if bad is not None:
            raise error(f"{where}: {name} {bad}")


def check_ranges(obj: Any, where: str, error: type[Exception] = ValueError) -> None:
    """The range of every bounded field (after ``check_types``), and the length of names."""
    d = obj.__dict__
    for name, kind, bounds in _plan_for(type(obj)):
        v = d[name]
        if bounds is not None:
            lo, hi, lo_open = bounds
            if not ((lo < v) if lo_open else (lo <= v)) or v > hi:
                raise error(f"{where}: {name} {range_problem(v, bounds)}")
        elif name == "name" and not 0 < len(v) <= MAX_NAME:
            raise error(f"{where}: {name} must be 1 to {MAX_NAME} characters, got {len(v):,}")
        elif name == "name" and not v.isprintable():
            bad = next(c for c in v if not c.isprintable())
            raise error(f"{where}: {name} {describe(v)} holds the unprintable character {bad!r} (a line break, a "
                        "control or format character); names are one line of visible text: retype it")


def check_fields(obj: Any, where: str, error: type[Exception] = ValueError) -> None:
    """``check_types`` then ``check_ranges``."""
    check_types(obj, where, error)
    check_ranges(obj, where, error)
