"""Fused attention: which kernel a framework runs on a GPU, and the fraction of the GPU's peak it
reaches by head dimension, sequence length, causal mask and direction.

One rule (``attention_time_s``), called by ``costmodel.layers.layer_cost`` for training and so by
the estimate and by the search's tables and bounds alike.

Curve: ``eta(s) = eta_max * s / (s + s0)``, per kernel, GPU architecture, direction (forward,
backward; FlashAttention-2's published tables give forward + backward together) and mask, with
``eta_max`` at head dimensions 64, 128 and 256 (interpolated in log2 of the head dimension,
clamped at the ends). FLOP convention of the kernel benchmarks (Dao-AILab/flash-attention
``benchmarks/benchmark_flash_attention.py``): forward ``4 * b * s^2 * heads * d`` (halved when
causal), backward 2.5 times the forward (it recomputes the scores). The curves were fitted by
least relative error to the published points below (max relative error of the fit in brackets);
none of them is a training run's throughput, and none comes from a held-out source.

Sources (TFLOP/s at s = 512 ... 16k, b * s = 16k tokens, hidden 2048):

* FlashAttention-3 and cuDNN on H100 SXM5, forward: Shah et al., "FlashAttention-3",
  arXiv:2407.08608, Fig. 5 (also ``assets/flash3_fp16_fwd.png`` in Dao-AILab/flash-attention);
  backward, head dim 64 and 128, non-causal: the same paper, Fig. 6. Their causal backward is not
  published: its curve is the non-causal one with the forward's causal/non-causal ratio of
  ``eta_max`` and the causal ``s0`` of cuDNN's H200 backward (below).
* cuDNN causal backward shape: NVIDIA/cudnn-frontend ``benchmark/sdpa_benchmark_training/results/
  llama3.1/h200_919_only_cudnn/*.csv`` (cuDNN 9.19.1, 64 query / 8 KV heads, d = 128): causal
  backward s0 = 1300 against 300 non-causal [2-4%].
* cuDNN on Blackwell (GB200, cuDNN 9.22.0): the same repository's ``.../llama3.1/gb200/*.csv``,
  d = 128, all four direction x mask curves [5-8%]; other head dims scale as on Hopper.
* FlashAttention-4 on B200: the FA4 paper (``assets/fa4_paper.pdf`` in Dao-AILab/flash-attention)
  reports up to 1613 TFLOP/s forward (0.72 of 2250); no curve or backward figure is published,
  so it takes cuDNN's Blackwell curve shapes with that forward maximum.
* FlashAttention-2, forward + backward, A100 and H100: Dao-AILab/flash-attention README,
  ``assets/flash2_a100_fwd_bwd_benchmark.png`` and ``flash2_h100_fwd_bwd_benchmark.png`` [1-2%];
  head dim 256 is not in them (clamped to 128). On Hopper FA2 reaches about 0.34 of peak: it
  uses none of Hopper's asynchronous tensor-core instructions.
* FlexAttention: 90% of FA2 forward and 85% backward (PyTorch FlexAttention blog, Aug 2024, A100
  causal): priced as FA2 times 3.5 / (1/0.9 + 2.5/0.85) = 0.864 on every architecture.

Which kernel runs (``kernel_for``), from the framework profile's ``attention`` field
(``costmodel.frameworks``): "sdpa" (torchtitan, the built-in runtime, Accelerate/HF models) is
PyTorch's scaled_dot_product_attention, whose FLASH_ATTENTION backend (FlashAttention-2 inside
PyTorch) comes first on Ampere and Hopper -- PyTorch made cuDNN SDPA opt-in again after 2.5
(pytorch/pytorch#138522) -- and torchtitan puts cuDNN first only on SM100 (pytorch/torchtitan#1196);
"flash-attn" (DeepSpeed, Megatron-DeepSpeed with --use-flash-attn) is the flash-attn package, FA2.
An empty field keeps the older rule (``compute.FLASH_ATTENTION_EFFICIENCY`` of the GEMM curve):
Megatron and NeMo, whose kernel depends on what the launch file selects (the emitter writes
``--attention-backend flash``, which runs flash-attn, while the published runs used Transformer
Engine's default, cuDNN fused attention on Hopper), and the generic profile. AMD, Ada and CPUs: no
table; FA2's Ampere curve (an assumption).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .specs import GpuSpec

# (kernel, architecture) -> direction -> mask -> (eta_max at head dim 64, 128, 256; s0 in tokens,
# one for all head dims or one per head dim).
# direction "fb": forward + backward together (FlashAttention-2's published tables).
_CURVES: dict[tuple[str, str], dict[str, dict[str, tuple]]] = {
    ("fa3", "hopper"): {
        "fwd": {"none": ((0.516, 0.674, 0.794), (280.0, 200.0, 300.0)),
                "causal": ((0.513, 0.663, 0.701), (860.0, 610.0, 690.0))},
        # backward head dim 256 not published: 128's value
        "bwd": {"none": ((0.522, 0.596, 0.596), 430.0), "causal": ((0.519, 0.586, 0.526), 1300.0)},
    },
    ("cudnn", "hopper"): {
        "fwd": {"none": ((0.424, 0.633, 0.606), 130.0), "causal": ((0.402, 0.566, 0.528), (390.0, 380.0, 350.0))},
        "bwd": {"none": ((0.475, 0.547, 0.547), 370.0), "causal": ((0.449, 0.489, 0.477), 1300.0)},
    },
    ("cudnn", "blackwell"): {
        "fwd": {"none": ((0.470, 0.702, 0.672), 440.0), "causal": ((0.497, 0.700, 0.653), 1080.0)},
        "bwd": {"none": ((0.475, 0.547, 0.547), 270.0), "causal": ((0.499, 0.544, 0.530), 870.0)},
    },
    ("fa4", "blackwell"): {
        "fwd": {"none": ((0.480, 0.717, 0.686), 440.0), "causal": ((0.509, 0.717, 0.669), 1080.0)},
        "bwd": {"none": ((0.475, 0.547, 0.547), 270.0), "causal": ((0.499, 0.544, 0.530), 870.0)},
    },
    ("fa2", "ampere"): {
        "fb": {"none": ((0.570, 0.659, 0.659), 190.0), "causal": ((0.562, 0.619, 0.619), 490.0)},
    },
    ("fa2", "hopper"): {
        "fb": {"none": ((0.304, 0.348, 0.348), 195.0), "causal": ((0.296, 0.337, 0.337), 540.0)},
    },
}
# Blackwell FA2: no published table; Hopper's fractions (FA2 uses no Hopper/Blackwell features)
_CURVES[("fa2", "blackwell")] = _CURVES[("fa2", "hopper")]
FLEX_OF_FA2 = 3.5 / (1 / 0.90 + 2.5 / 0.85)      # FlexAttention blog: 0.90 fwd, 0.85 bwd of FA2
BACKWARD_FLOPS_OF_FORWARD = 2.5                   # benchmark_flash_attention.py's convention
KERNELS = ("fa2", "fa3", "fa4", "cudnn", "flex")


def architecture(gpu: GpuSpec) -> str:
    """The kernel tables' architecture of a GPU: "ampere", "hopper", "blackwell", else "other"
    (Ada, AMD, CPUs: priced on Ampere's FA2 curve, an assumption)."""
    n = gpu.name.upper()
    if n.startswith(("GB", "B1", "B2", "B3")):
        return "blackwell"
    if n.startswith(("H100", "H200", "H800", "H20", "GH200")):
        return "hopper"
    if n.startswith(("A100", "A800", "A30", "A40", "A10")):
        return "ampere"
    return "other"


def kernel_for(attention: str, gpu: GpuSpec) -> str:
    """The kernel a profile's ``attention`` field runs on ``gpu`` (module docstring); "" for the
    GEMM-curve rule."""
    if not attention:
        return ""
    if attention == "sdpa-torchtitan":
        return "cudnn" if architecture(gpu) == "blackwell" else "fa2"
    if attention in ("sdpa", "flash-attn"):
        return "fa2"
    raise ValueError(f"unknown attention implementation {attention!r}; known: sdpa, sdpa-torchtitan, flash-attn")


def _eta_max(points: tuple[float, float, float], head_dim: float) -> float:
    """A per-head-dim value (64, 128, 256) at ``head_dim``, interpolated in log2."""
    x = math.log2(max(64.0, min(256.0, head_dim))) - 6.0          # 0 at 64, 1 at 128, 2 at 256
    i = min(1, int(x))
    return points[i] + (x - i) * (points[i + 1] - points[i])


def _table(kernel: str, gpu: GpuSpec) -> tuple[dict, float]:
    arch = architecture(gpu)
    k = "fa2" if kernel == "flex" else kernel
    t = _CURVES.get((k, arch))
    if t is None:
        # a kernel that does not run on this architecture (FA3 off Hopper, FA4 off Blackwell) or a
        # GPU without tables: the framework would fall back to FA2
        t = _CURVES[("fa2", "hopper" if arch in ("hopper", "blackwell") else "ampere")]
    return t, (FLEX_OF_FA2 if kernel == "flex" else 1.0)


def efficiency(kernel: str, gpu: GpuSpec, head_dim: float, seq_len: float, causal: bool, direction: str) -> float:
    """Fraction of the GPU's 16-bit peak ``kernel`` reaches in ``direction`` ("fwd", "bwd" or
    "fb" for the two together)."""
    table, scale = _table(kernel, gpu)
    mask = "causal" if causal else "none"
    if direction not in table:
        direction = "fb"
    if direction == "fb" and "fb" not in table:
        f, b = (efficiency(kernel, gpu, head_dim, seq_len, causal, d) for d in ("fwd", "bwd"))
        return (1 + BACKWARD_FLOPS_OF_FORWARD) / (1 / f + BACKWARD_FLOPS_OF_FORWARD / b)
    points, s0 = table[direction][mask]
    if isinstance(s0, tuple):
        s0 = _eta_max(s0, head_dim)
    return scale * _eta_max(points, head_dim) * seq_len / (seq_len + s0)


@lru_cache(maxsize=4096)
def attention_time_s(kernel: str, gpu: GpuSpec, peak_flops: float, fwd_flops: float, head_dim: float,
                     seq_len: float, causal: bool) -> float:
    """Forward plus backward time of fused attention doing ``fwd_flops`` in its forward (the
    kernels' convention: causal halves them; backward does 2.5 times the forward)."""
    if fwd_flops <= 0:
        return 0.0
    table, _ = _table(kernel, gpu)
    if "fb" in table:
        eta = efficiency(kernel, gpu, head_dim, seq_len, causal, "fb")
        return (1 + BACKWARD_FLOPS_OF_FORWARD) * fwd_flops / (peak_flops * eta)
    ef = efficiency(kernel, gpu, head_dim, seq_len, causal, "fwd")
    eb = efficiency(kernel, gpu, head_dim, seq_len, causal, "bwd")
    return fwd_flops / (peak_flops * ef) + BACKWARD_FLOPS_OF_FORWARD * fwd_flops / (peak_flops * eb)


ATTENTION_IMPLEMENTATIONS = ("", "sdpa", "sdpa-torchtitan", "flash-attn")
