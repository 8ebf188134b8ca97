"""The host's share of a training layer: how long the CPU takes to issue one dense layer's kernels,
by how the framework launches them (``FrameworkProfile.launch``), and the layer's time floor.

The CPU issues a layer's kernels while the GPU runs earlier ones (launches are asynchronous), so a
layer costs ``max(GPU time, CPU issue time)``: the issue time is hidden behind real work and shows
only where a layer's kernels are shorter than their issue (small models, few tokens per rank:
torch.compile's ``reduce-overhead`` CUDA graphs make Llama-3.2-1B at 512 tokens 6.0x faster on a B200,
and Llama-3.1-8B at 8,192 tokens no faster, stas00/ml-engineering's compile notes). One rule,
``layer_floor_s``, called by ``costmodel.layers.layer_cost``, so the estimate, the search's tables
and its bounds share it. MoE layers keep ``costmodel.moe``'s own host pacing (a dropless layer
drains the queue once per forward: ``moe.layer_host_s``, ``moe.host_sync_s``); this floor is for
dense layers only, so the MoE block is not counted twice.

Per-operation issue cost, eager PyTorch: measured on an H200 machine (this project's device check,
session 31: bench/device_curves.py, bench/results/device-h200/device_curves.json), a one-element
in-place add called from Python took 9.65 us per call, eager and without autograd -> ``HOST_OP_S``;
the same add replayed from a CUDA graph of 100 took 0.96 us per node -> ``GRAPH_NODE_S``. They
replace the figures read before a GPU was lent (about 5-7 us per op, pytorch/pytorch#41383 and
#82793, on 2020-22 hosts; 0.58 us per graph node, ocannl#488 on an RTX 5070 Ti): the measured
ones are larger, and no published validation run changes with them (their layers' kernels are
longer than the issue either way). Autograd, autocast and module calls add to it: this project's
runtime took 56.8 ms of host time for GPT-3 1.3B's pass at one sequence, whose kernels ran 52.7 ms
(the host set the pace), 27.2 us per op ``layer_ops`` counts -- the builtin target's own figure
(``FrameworkProfile.host_op_s``); other frameworks' in-step cost was not measured. A framework
whose layers are fused library modules (Transformer Engine in Megatron-LM/NeMo, Apex/DeepSpeed's
fused kernels) and ``torch.compile``'s generated code issue fewer, larger kernels at the same cost
each (no separate figure for their per-call cost was measured).

Operations per layer forward, counted on the layers as their code writes them (``layer_ops``):

* eager (torchtitan's Llama block, PyTorch ops): each RMSNorm/LayerNorm 6 ops (pow, mean, add,
  rsqrt, mul, mul: ``torch.nn.functional.rms_norm``'s composite), the three Q/K/V projections,
  rotary 9 (two complex views, two multiplies, two real views, flatten, two casts), attention 1
  plus 5 layout ops (transposes, the GQA repeat, the output reshape), the output projection, the
  residual adds, the MLP's GEMMs and activation (SwiGLU: 3 GEMMs, SiLU, product; GELU: 2 GEMMs,
  GELU), dropout 1 per dropout site;
* fused (a Transformer Engine layer: ``LayerNormLinear`` -> norm + QKV GEMM, fused rotary, the
  fused attention kernel, the projection, fused bias-dropout-add, ``LayerNormMLP`` -> norm, fc1,
  the activation, fc2, bias-dropout-add): 11 kernels (10 without rotary);
* compiled (Inductor): the same GEMMs and attention as eager, the pointwise chains between them
  fused into one kernel each (norm, rotary, residual + norm, activation, residual): GEMMs + 5;
* graphs (full-iteration CUDA graphs, MLPerf's Megatron/NeMo runs): the fused layer's kernels at
  the replay cost per node.

Backward issues about twice the forward's operations (``BACKWARD_OPS``: each GEMM's input and weight
gradients, each pointwise op's gradient and its accumulation); the layer's compute counts backward
as twice the forward, so the floor on the forward unit is the forward's issue time. Collectives'
launches are priced with the collectives (``comm.launched``), not here.
"""
from __future__ import annotations

from functools import lru_cache

from .specs import ModelSpec

HOST_OP_S = 9.65e-6         # eager op issue cost, measured on an H200 host (module docstring)
GRAPH_NODE_S = 0.96e-6      # CUDA-graph replay per node, measured on an H200 (module docstring)
BACKWARD_OPS = 2.0          # backward issues about twice the forward's ops
LAUNCH_MODES = ("eager", "fused", "compiled", "graphs")

_NORM_OPS_EAGER = 6
_ROTARY_OPS_EAGER = 9
_ATTN_LAYOUT_OPS_EAGER = 5


@lru_cache(maxsize=1024)
def layer_ops(model: ModelSpec, mode: str) -> int:
    """Operations the host issues for one dense layer's forward under ``mode`` (module docstring)."""
    if mode not in LAUNCH_MODES:
        raise ValueError(f"launch mode {mode!r} must be one of {', '.join(LAUNCH_MODES)}")
    rotary = model.positions == "rotary"
    mlp_gemms = 3 if model.mlp == "swiglu" else 2
    gemms = 3 + 1 + mlp_gemms                 # Q, K, V, output projection, MLP
    if mode == "eager":
        ops = 2 * _NORM_OPS_EAGER + gemms + (_ROTARY_OPS_EAGER if rotary else 0) + 1 + _ATTN_LAYOUT_OPS_EAGER
        ops += 2                               # residual adds
        ops += 2 if model.mlp == "swiglu" else 1   # activation (+ the gate product)
        ops += 2 if model.dropout else 0
        return ops
    if mode == "compiled":
        return gemms + 1 + 5                  # GEMMs, attention, five fused pointwise regions
    return 11 if rotary else 10               # a Transformer Engine layer (fused; graphs replay it)


def issue_s(model: ModelSpec, mode: str, op_s: float = 0.0) -> float:
    """Host time to issue one dense layer's forward (``layer_ops`` at the mode's per-op cost, or at
    ``op_s`` where the framework's own was measured: ``FrameworkProfile.host_op_s``)."""
    return layer_ops(model, mode) * (op_s or (GRAPH_NODE_S if mode == "graphs" else HOST_OP_S))


def layer_floor_s(gpu_fwd_s: float, model: ModelSpec, mode: str, op_s: float = 0.0) -> float:
    """A dense layer's forward time (in the forward units its backward counts twice of): the
    longer of its GPU time and the host's issue time (module docstring). ``mode`` "" prices no
    floor (a CPU device's measured overhead, ``GpuSpec.layer_overhead_s``, stands instead)."""
    if not mode:
        return gpu_fwd_s
    return max(gpu_fwd_s, issue_s(model, mode, op_s))
