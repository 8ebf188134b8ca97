"""Compute time: GEMM efficiency as a function of size, and memory-bound (elementwise) time.

Model (one rule for every GPU; the constants live in the cluster file, not here):

* A GEMM of m x k times k x n runs at ``peak * eff(g)`` with ``g = (m*n*k) ** (1/3)``, the
  geometric-mean dimension. Without a measured table
  ``eff(g) = matmul_efficiency * g / (g + matmul_half_size)``: a saturating curve that captures
  wave quantization and fixed per-kernel costs, which dominate small GEMMs (the shape of the
  cuBLAS efficiency curves in NVIDIA's "Matrix Multiplication Background" guide, and of the
  size-dependent efficiency tables Calculon keeps per system). ``matmul_efficiency`` is the
  fraction of peak a transformer layer's large GEMMs reach in training (including kernel gaps),
  ``matmul_half_size`` the size where half of it is reached.
* With a measured table (``ClusterSpec.matmul_table``: square-GEMM size -> efficiency, written
  by ``planner profile``), ``eff`` is interpolated in log-size and clamped at the ends.
* Elementwise work (norms, activations, dropout, residuals, softmax when attention is not
  fused, FP8 casts, the loss over the logits, the optimizer) is bound by HBM bandwidth, at the
  fraction of it the framework's kernels reach (``memory_bound_factor``): ``bytes / hbm_bandwidth``
  divided by that fraction.
* Fused (flash) attention of a framework whose kernel is unknown (the generic profile) and
  serving's decode attention reach ``FLASH_ATTENTION_EFFICIENCY`` of the GEMM efficiency (a framework's own kernel
  is priced on its published curve, ``costmodel.attention``):
  FlashAttention-2 (Dao, 2023, Fig. 4-6) reaches 50-73% of A100 peak forward+backward where
  cuBLAS GEMMs reach 80-90%, a ratio of about 0.75.
"""
from __future__ import annotations

import bisect
import math
from functools import lru_cache

from .fp8 import gemm_efficiency as _fp8_gemm_efficiency
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


# ---- GEMM shape: wave, tile and alignment quantization ---------------------------------------
# Source for the rule ([nv-mm] NVIDIA "Matrix Multiplication Background User's Guide", DU-09799-001,
# sections "Tile quantization" and "Wave quantization", as summarised with its figures in
# stas00/ml-engineering @744d01e1 compute/accelerator/README.md; /work/shared/reference/
# attention-and-scale.md section 3): a GEMM's m x n output is cut into Tm x Tn tiles, one thread block
# each; a partial tile costs a whole one, and the C = ceil(m/Tm) * ceil(n/Tn) blocks run in
# ceil(C / S) waves on the S SMs, the last one partly idle. Its useful fraction of the work the GPU
# does is m*n / (ceil(C/S) * S * Tm * Tn).
#
# The tiles: cuBLAS and CUTLASS run 128 x 128, 128 x 256 and 256 x 128 tiles for large BF16/FP8 GEMMs
# on Ampere, Hopper and Blackwell (CUTLASS's default SM80/SM90 tile shapes; [nv-mm]'s examples use
# 256 x 128; the reference's Llama-8B example 128 x 256). The library's heuristic picks per shape;
# the rule takes the best of the three, each at the same per-tile speed (not measured here: what a
# smaller tile loses in data reuse is the size curve's to price, below).
#
# How it composes with the size curve (``matmul_efficiency``: ``matmul_efficiency * g / (g + h)``),
# without counting anything twice:
# * A GEMM of at most one wave of blocks (C <= S) has no wave to quantize: the library splits K or
#   shrinks the tile to fill the SMs, and what that costs (fixed latency, prologue, epilogue, the
#   partial fill) is the small-GEMM regime the size curve prices. Its factor is 1.
# * A dimension under one tile runs a tile shrunk to it (rounded to 16): no padding priced, for the
#   same reason.
# * From two waves on, the factor above prices the tail wave and the padded tiles; the size curve
#   keeps pricing only per-kernel latency (``matmul_half_size``) and the large-GEMM ceiling
#   (``matmul_efficiency``). The catalog's curves were fitted on runs without this factor, so their
#   ceilings carry the mean of it over the fitted runs' GEMMs: the refit (issue 23, dense4) takes it out.
# * With a measured table of square GEMMs (``ClusterSpec.matmul_table``) the table already holds the
#   square GEMM's own factor, so a shape is priced at the table's value times its factor over the
#   square one's, capped at the table's best.
# Stream-K and split-K schedules, which cuBLAS picks for some multi-wave shapes on Hopper, soften
# the tail wave; not priced (no public measurement by shape found), so the factor is an upper
# bound of the loss for those shapes.
GEMM_TILES = ((128, 256), (256, 128), (128, 128))
# SMs per GPU, by catalog name prefix. Sources: NVIDIA A100 Tensor Core GPU Architecture whitepaper
# (108 SMs), NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs on SXM5, H200 and H800 the
# same GH100 configuration; 114 on PCIe), NVIDIA L40S datasheet (142 SMs), stas00/ml-engineering
# @744d01e1 (148 SMs on B200 and one B300 SKU; another B300 SKU has 152: the catalog's B300/GB300 take
# 148, the count the B200 die and the B300 SKU share; GB200's GPU is the B200 die). A GPU not listed
# (AMD's, whose tiles and CUs follow other rules, and CPUs) gets no wave factor: not priced, said so.
GPU_SMS = (("A100", 108), ("H100-PCIE", 114), ("H100", 132), ("H200", 132), ("H800", 132),
           ("GB200", 148), ("GB300", 148), ("B200", 148), ("B300", 148), ("L40S", 142))
# Alignment: tensor cores run at full speed when the leading dimensions are multiples of 16 bytes
# (8 BF16 values, 16 FP8) ([nv-mm], "Tensor Core requirements"). Measured on H100 (stas00/ml-engineering
# swiglu-maf-bench.py, h = 4096 SwiGLU MLP): d_ff = 10922 (not a multiple of 16 bytes) 272.7 TFLOP/s,
# d_ff = 10944 398.4 TFLOP/s, and every neighbour 10848..11008 (multiples of 64 bytes, not all of 128)
# about 395: so 272.7 / 398.4 = 0.68 below 16 bytes, and no measurable loss above it.
ALIGN_BYTES = 16
MISALIGNED_FACTOR = 272.7 / 398.4


def gpu_sms(name: str) -> int:
    """The GPU's SM count (``GPU_SMS``), 0 when unknown."""
    n = name.upper()
    for prefix, sms in GPU_SMS:
        if n.startswith(prefix):
            return sms
    return 0


def wave_tile_factor(sms: int, m: float, n: float) -> float:
    """Useful fraction of an m x n output's tiled waves on ``sms`` SMs, at the best tile of
    ``GEMM_TILES`` (1 for at most one wave, or no known SM count: see the comment above)."""
    if sms <= 0 or m <= 0 or n <= 0:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        tm = min(tm, 16 * math.ceil(m / 16))
        tn = min(tn, 16 * math.ceil(n / 16))
        blocks = math.ceil(m / tm) * math.ceil(n / tn)
        if blocks <= sms:
            return 1.0
        best = max(best, m * n / (math.ceil(blocks / sms) * sms * tm * tn))
    return best


def alignment_factor(n: float, k: float, elem_bytes: float) -> float:
    """``MISALIGNED_FACTOR`` when a leading dimension (n or k; m is the token count, the rows) is
    not a multiple of ``ALIGN_BYTES``, else 1."""
    for d in (n, k):
        q = d * elem_bytes / ALIGN_BYTES
        if abs(q - round(q)) > 1e-9:
            return MISALIGNED_FACTOR
    return 1.0


@lru_cache(maxsize=65536)
def gemm_shape_factor(gpu_name: str, m: float, n: float, k: float, elem_bytes: float, train: bool = False) -> float:
    """Wave, tile and alignment factor of an m x k by k x n GEMM on ``gpu_name``. ``train``: the
    harmonic mean over the three GEMMs a training linear runs (forward m x n, dgrad m x k, wgrad
    n x k outputs, equal FLOPs), i.e. their time at one shared efficiency. Memoized per shape."""
    sms = gpu_sms(gpu_name)
    if train:
        wave = 3.0 / (1.0 / wave_tile_factor(sms, m, n) + 1.0 / wave_tile_factor(sms, m, k)
                      + 1.0 / wave_tile_factor(sms, n, k))
    else:
        wave = wave_tile_factor(sms, m, n)
    return wave * alignment_factor(n, k, elem_bytes)


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
                count: float = 1.0, train: bool = False) -> float:
    """Time of ``count`` GEMMs of m x k by k x n (2*m*n*k FLOPs each): the size curve
    (``matmul_efficiency``) times the wave, tile and alignment factor of the shape
    (``gemm_shape_factor``; ``train``: the mean over forward, dgrad and wgrad, for a forward-unit
    time whose backward the caller counts twice)."""
    if m <= 0 or n <= 0 or k <= 0 or count <= 0:
        return 0.0
    flops = 2.0 * m * n * k * count
    shape = gemm_shape_factor(gpu.name, m, n, k, _elem_bytes(dtype), train)
    return flops / (gpu.peak(dtype) * _size_efficiency(gpu, cluster, m, n, k, shape))


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
                    count: float = 1.0) -> float:
    """Time of ``count`` FP8 training GEMMs (a linear layer under an FP8 recipe) at the FP8 peak
    and the FP8 efficiency curve (``costmodel.fp8.gemm_efficiency``: smaller GEMMs gain less).
    Serving's FP8 weights keep ``gemm_time_s`` (their GEMMs are memory-bound at decode)."""
    if m <= 0 or n <= 0 or k <= 0 or count <= 0:
        return 0.0
    g = (m * n * k) ** (1.0 / 3.0)
    shape = gemm_shape_factor(gpu.name, m, n, k, 1, True)
    eff = _fp8_gemm_efficiency(gpu, _size_efficiency(gpu, cluster, m, n, k, shape), g)
    return 2.0 * m * n * k * count / (gpu.peak("fp8") * eff)
