"""Compute time: GEMM efficiency as a function of size, and memory-bound (elementwise) time.

Model (one rule for every GPU; the constants live in the cluster file, not here):

* A GEMM of m x k times k x n runs at ``peak * eff(g)`` with ``g = (m*n*k) ** (1/3)``, the
  geometric-mean dimension. Without a measured table
  ``eff(g) = matmul_efficiency * g / (g + matmul_half_size)``: a saturating curve that captures
  the fixed per-kernel costs (launch, prologue, epilogue, pipeline fill) that dominate small
  GEMMs (the shape of the cuBLAS efficiency curves in NVIDIA's "Matrix Multiplication Background"
  guide, and of the size-dependent efficiency tables Calculon keeps per system).
  ``matmul_efficiency`` is the fraction of peak a transformer layer's large GEMMs reach in
  training (including kernel gaps), ``matmul_half_size`` the size where half of it is reached.
* Every GEMM's time multiplies that curve by its shape's wave, tile and alignment factor
  (``costmodel.gemm_shape.gemm_shape_factor``, which says how the two compose without counting
  anything twice): the tail wave of thread blocks on the GPU's SMs, padded tiles, and leading
  dimensions that are not multiples of 16 bytes.
* With a measured table (``ClusterSpec.matmul_table``: square-GEMM size -> efficiency, written
  by ``planner profile``), ``eff`` is interpolated in log-size and clamped at the ends.
* Elementwise work (norms, activations, dropout, residuals, softmax when attention is not
  fused, FP8 casts, the loss over the logits, the optimizer) is bound by HBM bandwidth, at the
  fraction of it the framework's kernels reach (``memory_bound_factor``): ``bytes / hbm_bandwidth``
  divided by that fraction.
* Fused (flash) attention in training is priced on the kernel's published curve
  (``costmodel.attention``; the generic profile takes PyTorch SDPA's kernel). Only the two paths
  that name no kernel, Accelerate's Megatron-LM engine and serving's decode attention (its compute
  side; decode is bound by reading the KV cache), reach ``FLASH_ATTENTION_EFFICIENCY`` of the GEMM
  efficiency: FlashAttention-2 (Dao, 2023, Fig. 4-6) reaches 50-73% of A100 peak forward+backward
  where cuBLAS GEMMs reach 80-90%, a ratio of about 0.75 -- a kernel benchmark, not a fit on
  training throughput, so not in ``costmodel.fitted``.
"""
from __future__ import annotations

import bisect
import math

from .fp8 import gemm_efficiency as _fp8_gemm_efficiency
from .gemm_shape import (ALIGN1_FACTOR, ALIGN_BYTES, GEMM_TILES, GPU_SMS, MISALIGNED_FACTOR, alignment_factor,  # noqa: F401
                         gemm_shape_factor, gpu_sms, wave_tile_factor)
from .specs import ClusterSpec, GpuSpec

FLASH_ATTENTION_EFFICIENCY = 0.75


def _interp_log(table: tuple[tuple[float, float], ...], g: float) -> float:
    sizes = [s for s, _ in table]
    if g <= sizes[0]:
        return table[0][1] * g / sizes[0] if g < sizes[0] else table[0][1]
    if g >= sizes[-1]:
        return table[-1][1]
    i = bisect.bisect_right(sizes, g)
    (s0, e0), (s1, e1) = table[i - 1], table[i]
    w = (math.log(g) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return e0 + w * (e1 - e0)


def matmul_efficiency(gpu: GpuSpec, cluster: ClusterSpec | None, m: float, n: float, k: float) -> float:
    """Fraction of peak for an m x k by k x n GEMM (see the module docstring)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 1.0
    g = (m * n * k) ** (1.0 / 3.0)
    if cluster is not None and cluster.matmul_table:
        return max(1e-3, _interp_log(cluster.matmul_table, g))
    return gpu.matmul_efficiency * g / (g + gpu.matmul_half_size)


def _elem_bytes(dtype: str) -> float:
    return {"fp8": 1.0, "fp32": 4.0, "float32": 4.0, "tf32": 4.0}.get(dtype, 2.0)


def _size_efficiency(gpu: GpuSpec, cluster: ClusterSpec | None, m: float, n: float, k: float,
                     shape: float) -> float:
    """The size curve at (m, n, k) with the shape factor applied (see the comment above)."""
    if cluster is not None and cluster.matmul_table:
        g = (m * n * k) ** (1.0 / 3.0)
        square = wave_tile_factor(gpu_sms(gpu.name), g, g)
        best = max(e for _, e in cluster.matmul_table)
        return max(1e-3, min(best, _interp_log(cluster.matmul_table, g) * shape / square))
    return matmul_efficiency(gpu, cluster, m, n, k) * shape


def gemm_time_s(gpu: GpuSpec, cluster: ClusterSpec | None, dtype: str, m: float, n: float, k: float,
                count: float = 1.0, train: bool = False, waves: bool = True) -> float:
    """Time of ``count`` GEMMs of m x k by k x n (2*m*n*k FLOPs each): the size curve
    (``matmul_efficiency``) times the wave, tile and alignment factor of the shape
    (``gemm_shape_factor``; ``train``: the mean over forward, dgrad and wgrad, for a forward-unit
    time whose backward the caller counts twice). ``waves=False``: a GEMM whose row count is the
    mean of a batch that varies from step to step (serving's continuous batching): quantizing at
    the mean misprices every step (the tail wave of a varying batch is neither full nor empty), so
    only its alignment is priced; the size curve serving validated keeps the rest."""
    if m <= 0 or n <= 0 or k <= 0 or count <= 0:
        return 0.0
    flops = 2.0 * m * n * k * count
    eb = _elem_bytes(dtype)
    shape = gemm_shape_factor(gpu.name, m, n, k, eb, train) if waves else alignment_factor(n, k, eb)
    return flops / (gemm_rate(gpu, cluster, dtype) * _size_efficiency(gpu, cluster, m, n, k, shape))


def gemm_rate(gpu: GpuSpec, cluster: ClusterSpec | None, dtype: str) -> float:
    """The rate a GEMM's efficiency multiplies: the part's sustained rate (``GpuSpec.rate``: the datasheet
    peak times its ``clock_factor``) on the curve, the datasheet peak itself where a measured table
    (``ClusterSpec.matmul_table``, fractions of that peak) prices the GEMM: the measurement already holds the
    part's clock."""
    return gpu.peak(dtype) if cluster is not None and cluster.matmul_table else gpu.rate(dtype)


def memory_time_s(gpu: GpuSpec, n_bytes: float) -> float:
    """``n_bytes`` moved at the GPU's full HBM bandwidth; a kernel's achieved fraction is applied
    by the caller (``memory_bound_factor``)."""
    return n_bytes / gpu.hbm_bandwidth_bytes_per_s


# The fraction of HBM bandwidth memory-bound training kernels reach, forward and backward, by how
# they run. Source: NVIDIA/cudnn-frontend @ 3929da2e, benchmark/norms/results/h200 (RMSNorm, bf16,
# LLM shapes 4096x16384 .. 16384x4096, all_models_*.csv): cuDNN's fused kernel 69-80% forward /
# 64-79% backward, eager PyTorch 50-70% / 30-38%, torch.compile 71-87% / 34-47% -- the midpoints
# below; the GB200 rows of the same benchmark fall in the same ranges. The term this prices is mostly
# pointwise traffic (residual adds, activations, dropout, casts), with the norms a small part of it;
# the eager and compiled backward figures are a norm's backward (a reduction kernel), not a pointwise
# kernel's, so every shipped profile uses "fused" (FrameworkProfile.elementwise) until a table for
# pointwise kernels per framework exists; "eager" and "compiled" stay for a profile that measures them.
MEMORY_BOUND_FRACTION: dict[str, tuple[float, float]] = {
    "fused": (0.75, 0.71), "eager": (0.60, 0.34), "compiled": (0.79, 0.40)}
ELEMENTWISE_KINDS = tuple(MEMORY_BOUND_FRACTION)


def memory_bound_factor(kind: str, backward: bool = True) -> float:
    """How much longer than at full HBM bandwidth the framework's memory-bound kernels take: for a
    forward-unit time whose backward counts twice (``LayerTerms``: forward + 2x backward), the
    mean over the three of 1/fraction; ``backward=False`` for work that only runs once forward
    (the optimizer step)."""
    f, b = MEMORY_BOUND_FRACTION[kind]
    return 1.0 / f if not backward else (1.0 / f + 2.0 / b) / 3.0


def fp8_gemm_time_s(gpu: GpuSpec, cluster: ClusterSpec | None, m: float, n: float, k: float,
                    count: float = 1.0, fmt: str = "fp8") -> float:
    """Time of ``count`` FP8 training GEMMs (a linear layer under an FP8 recipe) at the FP8 peak
    and the FP8 efficiency curve (``costmodel.fp8.gemm_efficiency``: smaller GEMMs gain less);
    ``fmt`` "fp4": NVFP4's, at the FP4 peak (``Fp8Recipe.gemm_format``).
    Serving's FP8 weights keep ``gemm_time_s`` (their GEMMs are memory-bound at decode)."""
    if m <= 0 or n <= 0 or k <= 0 or count <= 0:
        return 0.0
    g = (m * n * k) ** (1.0 / 3.0)
    shape = gemm_shape_factor(gpu.name, m, n, k, 1, True)
    eff = _fp8_gemm_efficiency(gpu, _size_efficiency(gpu, cluster, m, n, k, shape), g, fmt)
    return 2.0 * m * n * k * count / (gemm_rate(gpu, cluster, fmt) * eff)
