"""Host overhead per transformer layer: the fixed time the runtime spends on one layer's forward
and backward for one micro-batch, whatever its size.

An eager framework on a CPU device runs each operator synchronously: a layer's time is its
FLOPs at the matmul rate *plus* a fixed cost per operator (dispatch, autograd bookkeeping,
allocation), dozens of operators per layer. For the small models that stand in for GPUs on a
CPU that fixed cost dominates, and a cost model without it predicts steps several times too fast.

Measured with the runtime's own model (``runtime.model``) at a token count where compute is
negligible (one sequence of 8 tokens): the step time of a 1-layer and of a 4-layer model of
``tiny-llama``'s shape, forward and backward; the slope per layer, less that layer's FLOPs at
the fastest fp32 rate measured, is the overhead. Embedding, head and loss cancel in the slope.

On a GPU the host enqueues kernels asynchronously and the time hides behind the kernels of any
real layer, so the profiler records this only for CPU devices (``GpuSpec.layer_overhead_s``).
"""
from __future__ import annotations

from typing import Any

from .bench_matmul import time_op

TOKENS = 8
LAYERS = (1, 4)


def bench_layer_overhead(device: Any, fp32_flops_per_s: float, target_s: float = 0.2) -> dict:
    """``{"layer_s": ..., "overhead_s": ..., "flops_per_layer": ...}``: seconds per layer
    (forward + backward, one micro-batch of ``TOKENS`` tokens) and that less its FLOPs at
    ``fp32_flops_per_s`` (never below zero)."""
    import torch

    from costmodel.catalog import get_model
    from runtime.model import build_model
    spec = get_model("tiny-llama")
    dev = torch.device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        x = torch.randint(0, spec.vocab, (1, TOKENS), device=dev)
        times = []
        for n in LAYERS:
            model = build_model(spec, layers=range(n)).to(dev)

            def step(model=model):
                model.zero_grad(set_to_none=True)
                model(x).float().mean().backward()

            t, _ = time_op(step, dev, target_s, reps=5)
            times.append(t)
            del model
    finally:
        torch.set_num_threads(threads)
    per_layer = max(0.0, (times[1] - times[0]) / (LAYERS[1] - LAYERS[0]))
    h, f, q, kv = spec.hidden, spec.ffn_hidden, spec.heads, spec.kv_heads
    d = h // q
    params = h * (q * d) * 2 + h * (kv * d) * 2 + 3 * h * f     # q, o, k, v projections; SwiGLU MLP
    flops = 6 * TOKENS * params + 3 * 4 * TOKENS * TOKENS * q * d  # matmuls fwd + bwd; attention scores
    overhead = max(0.0, per_layer - flops / fp32_flops_per_s) if fp32_flops_per_s > 0 else per_layer
    return {"layer_s": per_layer, "overhead_s": overhead, "flops_per_layer": flops, "tokens": TOKENS,
            "model_times_s": dict(zip((str(n) for n in LAYERS), times))}
