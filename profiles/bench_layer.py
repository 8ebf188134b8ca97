"""Host overhead per transformer layer: the fixed time the runtime spends on one layer's forward
and backward for one micro-batch, whatever its size.

An eager framework on a CPU device runs each operator synchronously: a layer's time is its
FLOPs at the matmul rate *plus* a fixed cost per operator (dispatch, autograd bookkeeping,
allocation), dozens of operators per layer. For the small models that stand in for GPUs on a
CPU that fixed cost dominates, and a cost model without it predicts steps several times too fast.

Measured with a llama-style layer built here the way the built-in runtime builds its own
(``runtime.model.Block``: RMSNorm, q/k/v/o projections with grouped K/V heads, rotary positions,
scaled-dot-product attention, SwiGLU MLP, the same operator sequence; this package may not import
the runtime) at ``tiny-llama``'s shape and a token count where compute is negligible (one
sequence of 8 tokens): forward and backward through stacks of 1 and of 4 layers; the slope per
layer, less that layer's FLOPs at the fastest fp32 rate measured, is the overhead.

On a GPU the host enqueues kernels asynchronously and the time hides behind the kernels of any
real layer, so the profiler records this only for CPU devices (``GpuSpec.layer_overhead_s``).
"""
from __future__ import annotations

from typing import Any, Callable

from .bench_matmul import time_op

TOKENS = 8
LAYERS = (1, 4)
ROUNDS = 4


def _layer_stack(n: int, hidden: int, heads: int, kv_heads: int, ffn: int):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            d = hidden // heads
            self.d = d
            self.n1, self.n2 = nn.RMSNorm(hidden, eps=1e-5), nn.RMSNorm(hidden, eps=1e-5)
            self.wq, self.wo = nn.Linear(hidden, heads * d, bias=False), nn.Linear(heads * d, hidden, bias=False)
            self.wk = nn.Linear(hidden, kv_heads * d, bias=False)
            self.wv = nn.Linear(hidden, kv_heads * d, bias=False)
            self.w1, self.w3 = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
            self.w2 = nn.Linear(ffn, hidden, bias=False)

        def _rope(self, q, k):
            s, d = q.shape[1], q.shape[-1]
            inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=q.device) / d))
            ang = torch.outer(torch.arange(s, dtype=torch.float32, device=q.device), inv)
            cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

            def rot(x):
                xf = x.float().unflatten(-1, (-1, 2))
                a, b = xf[..., 0], xf[..., 1]
                return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)
            return rot(q), rot(k)

        def forward(self, x):
            b, s = x.shape[0], x.shape[1]
            y = self.n1(x)
            q = self.wq(y).view(b, s, -1, self.d)
            k = self.wk(y).view(b, s, -1, self.d)
            v = self.wv(y).view(b, s, -1, self.d)
            q, k = self._rope(q, k)
            rep = q.shape[2] // k.shape[2]
            if rep > 1:
                k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            h = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
            y = self.n2(h)
            return h + self.w2(F.silu(self.w1(y)) * self.w3(y))

    return nn.Sequential(*[Layer() for _ in range(n)])


def bench_layer_overhead(device: Any, fp32_flops_per_s: float, target_s: float = 0.8) -> dict:
    """``{"layer_s": ..., "overhead_s": ..., "flops_per_layer": ...}``: seconds per layer
    (forward + backward, one micro-batch of ``TOKENS`` tokens) and that less its FLOPs at
    ``fp32_flops_per_s`` (never below zero)."""
    import torch

    from costmodel.catalog import get_model
    spec = get_model("tiny-llama")
    dev = torch.device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        x = torch.randn(1, TOKENS, spec.hidden, device=dev, requires_grad=True)
        steps = []
        for n in LAYERS:
            model = _layer_stack(n, spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden).to(dev)

            def step(model=model):
                model.zero_grad(set_to_none=True)
                model(x).float().mean().backward()

            steps.append(step)
        # alternate the two stacks over ROUNDS, keeping each one's fastest: a slow spell of a
        # shared machine then hits both alike instead of one
        times = [float("inf")] * len(LAYERS)
        for _ in range(ROUNDS):
            for j, step in enumerate(steps):
                times[j] = min(times[j], time_op(step, dev, target_s / ROUNDS, reps=3)[0])
    finally:
        torch.set_num_threads(threads)
    per_layer = max(0.0, (times[1] - times[0]) / (LAYERS[1] - LAYERS[0]))
    # the layer's matmuls forward and backward, and its attention scores (causal: about half)
    params = spec.attention_params() + spec.dense_mlp_params()
    flops = 6 * TOKENS * params + 3 * 4 * TOKENS * TOKENS * spec.heads * spec.head_dim
    overhead = max(0.0, per_layer - flops / fp32_flops_per_s) if fp32_flops_per_s > 0 else per_layer
    return {"layer_s": per_layer, "overhead_s": overhead, "flops_per_layer": flops, "tokens": TOKENS,
            "model_times_s": dict(zip((str(n) for n in LAYERS), times))}


def bench_fsdp2_overhead(device: Any, target_s: float = 0.8) -> dict | None:
    """Host time FSDP2's wrappers add on a CPU device, as the built-in runtime applies them to every
    data-parallel plan (``runtime/parallel.py`` ``apply_dp``: ``fully_shard`` per block at ZeRO-2/3,
    ``replicate_with_fsdp`` per block at ZeRO-0/1, then the root): ``{"block_s": ..., "param_step_s":
    ...}``, the forward + backward host time per wrapped block per micro-batch (its pre/post hooks,
    the copies in and out, DTensor bookkeeping) and the optimizer step's per-parameter cost of the
    parameters being DTensors (AdamW as the runtime builds it, per-operator DTensor dispatch).

    Measured on a one-rank gloo group of its own, so no collective moves anything: what is left
    is host work, which the cost model adds to the plan's layers and optimizer step; the collectives
    are priced from the collective benchmarks. Each figure is the per-layer slope over stacks of 1
    and 4 layers (the same llama-style layer as ``bench_layer_overhead``) less the plain stack's,
    the mean of the two wrappers (they differ by less than this machine's noise). With them
    ``"tp_layer_s"``: tensor parallelism's host time per layer per micro-batch (forward + backward),
    the same layers under the runtime's TP plan (``runtime.parallel.tp_plan`` without sequence
    parallelism: its styles, written here since profiles do not import the runtime) on the same
    one-rank mesh less the plain layers: DTensor's per-operator dispatch and the styles' hooks. None
    off the CPU, or
    in a process that already has a process group (a profile's rank: ``measure_fsdp2_overhead`` runs
    this in a fresh process, since a group created on one rank alone would put the ranks' group
    counters out of step)."""
    import torch
    import torch.distributed as dist

    dev = torch.device(device)
    if dev.type != "cpu" or not dist.is_available() or dist.is_initialized():
        return None
    from costmodel.catalog import get_model
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    spec = get_model("tiny-llama")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    assert group is not None
    try:
        mesh = DeviceMesh.from_group(group, "cpu")
        torch.manual_seed(0)
        x = torch.randn(1, TOKENS, spec.hidden, device=dev, requires_grad=True)
        runs: dict[tuple[str, int], tuple] = {}
        tensors = 0
        for mode in ("plain", "fully_shard", "replicate"):
            for n in LAYERS:
                model = _layer_stack(n, spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden).to(dev)
                tensors = len(list(model[0].parameters()))
                if mode != "plain":
                    wrap = fully_shard if mode == "fully_shard" else replicate
                    for blk in model:
                        wrap(blk, mesh=mesh)
                    wrap(model, mesh=mesh)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

                def step(model=model):
                    model.zero_grad(set_to_none=False)
                    model(x).float().mean().backward()

                step()
                runs[(mode, n)] = (step, opt.step)
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        # the runtime's TP plan without sequence parallelism (runtime.parallel.tp_plan: q, k, v and the
        # MLP's gate and up projections column-wise, the output projections row-wise), on the same layer
        plan = {**{f"{i}.{w}": ColwiseParallel() for i in range(max(LAYERS)) for w in ("wq", "wk", "wv", "w1", "w3")},
                **{f"{i}.{w}": RowwiseParallel() for i in range(max(LAYERS)) for w in ("wo", "w2")}}
        for n in LAYERS:
            model = _layer_stack(n, spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden).to(dev)
            parallelize_module(model, mesh, {k: v for k, v in plan.items() if int(k.split(".")[0]) < n})

            def tp_step(model=model):
                model.zero_grad(set_to_none=False)
                model(x).float().mean().backward()

            tp_step()
            runs[("tp", n)] = (tp_step, tp_step)
        times = {k: [float("inf"), float("inf")] for k in runs}
        # alternate every stack over ROUNDS, keeping each one's fastest (a slow spell hits all alike)
        for _ in range(ROUNDS):
            for k, fns in runs.items():
                for j, fn in enumerate(fns):
                    times[k][j] = min(times[k][j], time_op(fn, dev, target_s / ROUNDS / len(runs), reps=3)[0])
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    span = LAYERS[1] - LAYERS[0]

    def slope(mode: str, j: int) -> float:
        return (times[(mode, LAYERS[1])][j] - times[(mode, LAYERS[0])][j]) / span

    wrapped = ("fully_shard", "replicate")
    block = sum(max(0.0, slope(m, 0) - slope("plain", 0)) for m in wrapped) / len(wrapped)
    param = sum(max(0.0, slope(m, 1) - slope("plain", 1)) for m in wrapped) / len(wrapped) / max(1, tensors)
    # tensor parallelism's DTensor dispatch: the same layers under the runtime's TP plan, less plain
    tp = max(0.0, slope("tp", 0) - slope("plain", 0))
    return {"block_s": block, "param_step_s": param, "tp_layer_s": tp, "tensors_per_layer": tensors,
            "times_s": {f"{m}-{n}": t for (m, n), t in times.items()}}


def measure_fsdp2_overhead(target_s: float, tick: Callable[[], None] | None = None,
                           timeout_s: float = 180.0) -> dict | None:
    """``bench_fsdp2_overhead`` on the CPU in a fresh Python process (no process group of the
    caller's is touched), calling ``tick`` about twice a second while it runs (a profile's ranks
    report progress so that a stalled rank can be told from a slow measurement). None if it fails or
    takes longer than ``timeout_s``."""
    import json
    import subprocess
    import sys
    import time
    code = ("import json, sys; from profiles.bench_layer import bench_fsdp2_overhead; "
            "print(json.dumps(bench_fsdp2_overhead('cpu', float(sys.argv[1]))))")
    proc = subprocess.Popen([sys.executable, "-c", code, repr(float(target_s))], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    t0 = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            proc.wait()
            return None
        if tick is not None:
            tick()
        time.sleep(0.5)
    out = (proc.stdout.read() if proc.stdout else "").strip().splitlines()
    if proc.returncode != 0 or not out:
        return None
    try:
        got = json.loads(out[-1])
    except ValueError:
        return None
    return got if isinstance(got, dict) else None
