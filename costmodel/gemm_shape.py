"""GEMM shape: wave, tile and alignment quantization (issue 23), one owner for every GEMM's time
(``costmodel.compute.gemm_time_s`` and ``fp8_gemm_time_s``, and the FP8 fit's check
``costmodel.fp8.layer_gemm_speedup``). A module of its own so that both import it without a cycle."""
from __future__ import annotations

import math
from functools import lru_cache

# ---- GEMM shape: wave, tile and alignment quantization ---------------------------------------
# Source for the rule ([nv-mm] NVIDIA "Matrix Multiplication Background User's Guide", DU-09799-001,
# sections "Tile quantization" and "Wave quantization", as summarised with its figures in
# stas00/ml-engineering @744d01e1 compute/accelerator/README.md, the team's reference notes on
# attention and scale, section 3): a GEMM's m x n output is cut into Tm x Tn tiles, one thread block
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
# How it composes with the size curve (``compute.matmul_efficiency``: ``matmul_efficiency * g / (g + h)``),
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
#   square one's, capped at the table's best (``compute._size_efficiency``).
# Stream-K and split-K schedules, which cuBLAS picks for some multi-wave shapes on Hopper, soften
# the tail wave; not priced (no public measurement by shape found), so the factor is an upper
# bound of the loss for those shapes.
GEMM_TILES = ((128, 256), (256, 128), (128, 128))
# SMs per GPU, by catalog name prefix. Sources: NVIDIA A100 Tensor Core GPU Architecture whitepaper
# (108 SMs; the A800 is the same die with a narrower NVLink), NVIDIA H100 Tensor Core GPU Architecture
# whitepaper (132 SMs on SXM5, H200 and H800 the same GH100 configuration, as GH200's GPU; 114 on PCIe),
# NVIDIA L40S datasheet (142 SMs), stas00/ml-engineering @744d01e1 (148 SMs on B200 and one B300 SKU; another
# B300 SKU has 152: the catalog's B300/GB300 take 148, the count the B200 die and the B300 SKU share; GB200's GPU
# is the B200 die). A GPU not listed
# (AMD's, whose tiles and CUs follow other rules, and CPUs) gets no wave factor: not priced, said so.
GPU_SMS = (("A100", 108), ("A800", 108), ("H100-PCIE", 114), ("H100", 132), ("H200", 132), ("H800", 132), ("GH200", 132),
           ("GB200", 148), ("GB300", 148), ("B200", 148), ("B300", 148), ("L40S", 142))
# Alignment: tensor cores run at full speed when the leading dimensions are multiples of 16 bytes
# (8 BF16 values, 16 FP8) ([nv-mm], "Tensor Core requirements"). Measured on H100 (stas00/ml-engineering
# swiglu-maf-bench.py, h = 4096 SwiGLU MLP): d_ff = 10922 (not a multiple of 16 bytes) 272.7 TFLOP/s,
# d_ff = 10944 398.4 TFLOP/s, and every neighbour 10848..11008 (multiples of 64 bytes, not all of 128)
# about 395: so 272.7 / 398.4 = 0.68 below 16 bytes, and no measurable loss above it.
ALIGN_BYTES = 16
MISALIGNED_FACTOR = 272.7 / 398.4
# Below 4 bytes (an odd width in BF16: GPT-2's vocabulary of 50,257 as an unpadded output head) cuBLAS
# has no tensor-core kernel of the Hopper generation and falls back to CUTLASS's one-element-aligned
# sm_75 kernels (``cutlass_75_tensorop_bf16_s1688gemm_bf16_*_align1``). Measured on an H200 (this
# project's device check, bench/results/device-h200/step-gpt3-1.3b.json, bench/device_step.py): the
# head's three GEMMs (m = tokens, n = 50,257, k = 2,048) ran at 117-127 TFLOP/s against 749-791 for
# the same pass's aligned layer GEMMs at the same m: 0.159 of them, the mean over micro-batches 1-8
# (``tests/test_device_measurements.py`` recomputes it from the file).
ALIGN1_FACTOR = 0.159
# the byte alignment from which each factor holds: 16 bytes full speed, 4 bytes the H100 figure above
ALIGN_TIERS = ((16, 1.0), (4, MISALIGNED_FACTOR), (0, ALIGN1_FACTOR))


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
    """The factor of the least aligned leading dimension (n or k; m is the token count, the rows):
    1 when each is a multiple of ``ALIGN_BYTES``, ``MISALIGNED_FACTOR`` from 4 bytes, ``ALIGN1_FACTOR``
    below (``ALIGN_TIERS``)."""
    worst = 1.0
    for d in (n, k):
        width = d * elem_bytes
        for align, factor in ALIGN_TIERS:
            q = width / align if align else 0.0
            if not align or abs(q - round(q)) <= 1e-9:
                worst = min(worst, factor)
                break
    return worst


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
