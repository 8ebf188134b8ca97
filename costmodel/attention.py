"""Fused attention: which kernel a framework runs on a GPU, and the fraction of the GPU's peak it
reaches by head dimension, sequence length, causal mask and direction.

One rule (``attention_fwd_bwd_s``), called by ``costmodel.layers.layer_cost`` for training and so
by the estimate and by the search's tables and bounds alike.

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
* Blackwell Ultra (GB300, B300): the cuDNN and FA4 curves above times ``ULTRA_OF_BLACKWELL`` per
  direction: the median ratio GB300 / GB200 of cuDNN's bf16 TFLOP/s in the same repository's
  same-day runs (``.../llama3.1/gb300/llama3.1_20260724_040919.csv`` against
  ``.../gb200/llama3.1_20260724_040930.csv``, cuDNN backend 9.26.0, d = 128, sequences 2k-32k,
  causal and not, non-deterministic backward): forward 1.20-1.34 (median 1.28), backward 1.05-1.18
  (1.08). Blackwell Ultra doubles the special-function units' exponential throughput (the softmax's
  share of a forward pass); the BF16 and FP8 GEMM peaks are the same as Blackwell's.
* FlashAttention-2 on A100, forward + backward: Dao-AILab/flash-attention README,
  ``assets/flash2_a100_fwd_bwd_benchmark.png`` [1-2%]; head dim 256 is not in it (clamped to 128).
* FlashAttention-2 on Hopper, forward and backward apart: measured on an H200 by this project's
  device check (session 31: PyTorch 2.11's SDPA flash backend, the FA2 code PyTorch vendors;
  ``bench/results/device-h200/cluster.yaml``, head dims 64 and 128, sequences 512-16k, batch x
  sequence 16k tokens and 16 heads of 128, as the published benchmarks) [1-5%], fitted by
  ``bench/fit_attention_curves.py``; head dim 256 clamped to 128. It replaced (session 32) the
  README's H100 forward + backward plot (``flash2_h100_fwd_bwd_benchmark.png``: 0.35 of peak at
  most, one figure for both directions), because the measurement splits the directions, which the
  published plot does not: the forward
  reaches 0.35-0.36 at head dim 128, as published, and the backward 0.31-0.32, below it (the
  plot's single figure made the backward 5-29% faster than measured, most at short sequences).
  H100 and H200 are the same GH100 chip (132 SMs, the same clocks): the H200's larger HBM
  changes little for a kernel this compute-bound. FA2 uses none of Hopper's asynchronous
  tensor-core instructions, hence about a third of peak.
* FlashAttention (version 1, the flash-attn 1.x package), forward + backward on A100 and H100: the
  FlashAttention-2 paper's benchmark figures (Dao, arXiv 2307.08691, Fig. 4 and Fig. 7; the
  repository's ``assets/flash2_{a100,h100}_fwd_bwd_benchmark.png``), its "FlashAttention" bars, head
  dims 64 and 128 [3-10%]: about 0.26-0.34 of the A100's peak and 0.13-0.17 of the H100's (it runs
  Ampere code on Hopper). Fitted by ``bench/fit_attention_curves.py --published fa1``; head dim 256
  clamped to 128 (FA1 stops at 128); Blackwell takes Hopper's fractions, as FA2 does.
* FlexAttention: 90% of FA2 forward and 85% backward (PyTorch FlexAttention blog, Aug 2024, A100
  causal): priced as FA2 times 3.5 / (1/0.9 + 2.5/0.85) = 0.864 on every architecture. On
  Blackwell that puts FA4 at 2.2x its forward and 2.0x its backward (sequence 8k, head dim 128),
  inside what the PyTorch blog "FlexAttention + FlashAttention-4: Fast and Flexible" (2026) gives
  its FA4 backend over the Triton one on GB200 (1.6-3.2x forward, 1.85-2.3x backward).
  Its Triton template pads each head dimension to a power of two (``head_dim_padding``).

Which kernel runs (``kernel_for``), from the framework profile's ``attention`` field
(``costmodel.frameworks``), each checked against the code that makes the choice:

* "te": Transformer Engine's ``DotProductAttention`` with Megatron's ``--attention-backend auto``
  (what ``emitters/megatron.py`` writes). TE's ``get_attention_backend``
  (``transformer_engine/pytorch/attention/dot_product_attention/utils.py``) disables FlashAttention
  "to give FusedAttention preference on Hopper+" when both are eligible: cuDNN fused attention on
  Hopper and Blackwell; on Ampere no preference applies and flash-attn (FA2) runs. The published
  Megatron-LM and NeMo runs (the Megatron-Core era) ran the same choice.
* "flex": torchtitan 0.3.0's llama3 model (``torchtitan/models/llama3/__init__.py``:
  ``model_registry(flavor, attn_backend="flex")``, the default the torchtitan emitter keeps) runs
  FlexAttention, a Triton kernel: FA2's curve times ``FLEX_OF_FA2`` (the FlexAttention blog's
  A100 ratio; no H100/B200 table from a primary source exists, so the same ratio everywhere -- an
  assumption). Its mask is block-causal by document (``torchtitan/models/common/config_utils.py``
  ``get_attention_config``: the dataloaders emit per-document positions), so it skips the blocks
  across documents, by an amount the data sets; it is priced as the full causal mask, an upper
  bound on its time.
* "varlen": torchtitan 0.3.0's VarlenAttention (its gpt_oss package's default,
  ``costmodel.frameworks.TITAN_VARLEN_FAMILIES``) activates the FlashAttention build of the GPU
  (``torchtitan/tools/utils.py`` ``get_cuda_flash_attention_impl``: FA4 on SM100, FA3 on SM90;
  PyTorch's FA2 below). Its sliding-window layers are priced as full causal (an upper bound).
* "sdpa-torchtitan": the published torchtitan runs (2024-08 to 2025-06) called
  ``F.scaled_dot_product_attention``, first with PyTorch's default order and from 2025 through
  torchtitan's ``ScaledDotProductAttention`` with the order FLASH, EFFICIENT, MATH and cuDNN put
  first only on SM100 (pytorch/torchtitan#1196): FA2 on Ampere and Hopper, cuDNN on Blackwell.
  ``planner validate`` prices those runs with it.
* "sdpa": a plain ``F.scaled_dot_product_attention`` call (this project's runtime, DeepSpeed's
  training script, Hugging Face models under Accelerate) takes PyTorch's default order. In the
  PyTorch this project installs (2.13) ``check_prefer_cudnn_attention`` (``aten/src/ATen/native/
  transformers/cuda/sdp_utils.cpp``) puts cuDNN first on sm90 and sm100 once the bundled cuDNN is
  at least 9.15.1 (the guard pytorch/pytorch#138522 added after 2.5): cuDNN on Hopper and
  Blackwell, FA2 on Ampere. Older PyTorch (2.8-2.9: flash first) would run FA2 on Hopper, slower.
* "flash-attn": the flash-attn package (Megatron-DeepSpeed with --use-flash-attn): FA2.
* "flash-attn-1": the flash-attn 1.x package, which Transformer Engine 0.8's ``DotProductAttention``
  called for a causal mask on sm_80+ (``transformer_engine/pytorch/transformer.py`` at v0.8:
  ``flash_attn_unpadded_func``, ``use_flash_attention`` unless ``NVTE_FLASH_ATTN=0``): FA1. Only a
  published run that ran it names it (MLPerf Training v3.0's GPT-3); no target writes it.
* "flash-attn-3", "flash-attn-4": the FlashAttention-3 (Hopper) and FlashAttention-4 (Blackwell) packages a
  published run called itself (Hugging Face transformers' ``attn_implementation="flash_attention_3"`` or
  ``"flash_attention_4"``): FA3 or FA4; on another architecture the kernel's fallback, FA2 (``_table``).
* "" keeps the older rule (``compute.FLASH_ATTENTION_EFFICIENCY`` of the GEMM curve): only
  Accelerate's Megatron-LM engine, whose model code the plugin does not pin. The generic profile
  (framework unknown) takes "sdpa", the kernel a user's own PyTorch code reaches; a published run
  whose kernel is known names it in its record (``profile: {attention: ...}``).

Grid (``grid_factor``): a fused-attention kernel runs one thread block per (batch, head, 128-row
tile of queries) forward (FlashAttention-2/3's and cuDNN's ``Br`` = 128 at head dims up to 128;
per key tile backward, the same count for the square and shorter-side blocks priced here), with no
split of the sequence in training, so a grid of fewer blocks than the GPU has SMs leaves SMs idle,
and a grid of a few waves idles part of its last one -- the wave quantization
``costmodel.gemm_shape`` prices for GEMMs. The published curves were measured on large grids
(16k tokens per call and ``heads * d`` = 2048, or 64 heads), so a block is priced at its curve
times its own grid's useful fraction over the benchmark grid's at the same sequence, never above 1:
1 for a training layer's usual grids (Llama-3 8B at 8k tokens, 32 heads: 2,048 blocks), about 0.43
for 8 heads of 1,024 queries on a 148-SM Blackwell (64 blocks: tensor and context parallelism at
few tokens per GPU). Serving's prefill keeps the curve alone (its validation, VALIDATION_INFERENCE,
priced none).

AMD, Ada and CPUs: no table; FA2's Ampere curve (an assumption).

Measured curves (``GpuSpec.attention_table``, written by ``planner profile``:
``profiles/bench_attention.py``): where a profile measured a kernel on the user's own device --
PyTorch SDPA's flash backend (FA2) and its cuDNN backend on a GPU, SDPA's fused CPU kernel on a CPU,
recorded as "fa2", the kernel a CPU is priced with -- that kernel is priced on the measured points
instead of its published curve: per head dimension, piecewise linear in log sequence length between
the measured lengths and flat beyond them; between head dimensions linear in log2 of the head
dimension, flat beyond them (``measured_efficiency``). FlexAttention keeps its ratio to FA2. A kernel
or direction the profile did not measure keeps its published curve.

Context parallel (``attention_fwd_bwd_s`` with ``cp > 1``): Transformer Engine's and PyTorch's
ring attention both split the sequence into ``2 cp`` chunks and give rank ``r`` chunks ``r`` and
``2cp-1-r`` (the load-balanced causal layout: TE ``attn_forward_func_with_cp`` /
``get_seq_chunk_ids_for_reordering``; torch ``_HeadTailLoadBalancer``). Step 0 is the rank's own
``s/cp`` queries against its own keys, causal; each of the other ``cp-1`` steps is one
non-causal block of half the work: either all ``s/cp`` queries against half the keys
(``s/(2cp)``) or half the queries against all ``s/cp`` keys (torch ``_templated_ring_attention``:
``i <= rank`` and ``i > rank``). The curves are measured on square blocks; a block is priced at
its shorter side, ``s/(2cp)`` for both kinds (the forward loops over keys, the backward over
queries), so every rank takes the same time per step and the ring's per-step wait costs nothing
more (``tests/test_attention.py`` checks this against the ring walked rank by rank, step by step).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

from .gemm_shape import gpu_sms

if TYPE_CHECKING:
    from .specs import GpuSpec

# (kernel, architecture) -> direction -> mask -> (eta_max at head dim 64, 128, 256; s0 in tokens,
# one for all head dims or one per head dim).
# direction "fb": forward + backward together (FlashAttention-2's published A100 table).
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
    # measured on an H200 (module docstring); head dim 256 clamped to 128 as FA2's published tables were
    ("fa2", "hopper"): {
        "fwd": {"none": ((0.313, 0.364, 0.364), 80.0), "causal": ((0.314, 0.349, 0.349), 470.0)},
        "bwd": {"none": ((0.296, 0.315, 0.315), 380.0), "causal": ((0.290, 0.320, 0.320), 910.0)},
    },
}
# FlashAttention 1: the FlashAttention-2 paper's published forward + backward speeds (module docstring;
# bench/fit_attention_curves.py --published fa1 prints these); head dim 256 clamped to 128
_CURVES[("fa1", "ampere")] = {"fb": {"none": ((0.343, 0.262, 0.262), 80.0), "causal": ((0.297, 0.264, 0.264), 300.0)}}
_CURVES[("fa1", "hopper")] = {"fb": {"none": ((0.169, 0.137, 0.137), 50.0), "causal": ((0.145, 0.128, 0.128), 130.0)}}
# Blackwell FA2 (and FA1): no published table; Hopper's fractions (they use no Hopper/Blackwell features)
_CURVES[("fa2", "blackwell")] = _CURVES[("fa2", "hopper")]
_CURVES[("fa1", "blackwell")] = _CURVES[("fa1", "hopper")]
FLEX_OF_FA2 = 3.5 / (1 / 0.90 + 2.5 / 0.85)      # FlexAttention blog: 0.90 fwd, 0.85 bwd of FA2
BACKWARD_FLOPS_OF_FORWARD = 2.5                   # benchmark_flash_attention.py's convention
KERNELS = ("fa1", "fa2", "fa3", "fa4", "cudnn", "flex")
# GB300 / GB200 cuDNN attention, same-day runs (module docstring): forward, backward
ULTRA_OF_BLACKWELL = {"fwd": 1.28, "bwd": 1.08}
ULTRA_KERNELS = ("cudnn", "fa4")      # the Blackwell-specific kernels (FA2 runs Hopper's code)


def is_blackwell_ultra(gpu: GpuSpec) -> bool:
    """GB300 and B300 (Blackwell Ultra)."""
    return gpu.name.upper().startswith(("GB300", "B300"))


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


# a FlashAttention package a run calls itself: one kernel on every GPU (the curve's own fallback,
# ``_table``, where the package has no build for the architecture)
PACKAGE_KERNELS = {"flash-attn": "fa2", "flash-attn-1": "fa1", "flash-attn-3": "fa3", "flash-attn-4": "fa4"}


def kernel_for(attention: str, gpu: GpuSpec) -> str:
    """The kernel a profile's ``attention`` field runs on ``gpu`` (module docstring); "" for the
    GEMM-curve rule."""
    if not attention:
        return ""
    arch = architecture(gpu)
    if attention in ("te", "sdpa"):
        return "cudnn" if arch in ("hopper", "blackwell") else "fa2"
    if attention == "sdpa-torchtitan":
        return "cudnn" if arch == "blackwell" else "fa2"
    if attention == "flex":
        return "flex"
    if attention == "varlen":
        return {"hopper": "fa3", "blackwell": "fa4"}.get(arch, "fa2")
    if attention in PACKAGE_KERNELS:
        return PACKAGE_KERNELS[attention]
    raise ValueError(f"unknown attention implementation {attention!r}; known: {', '.join(ATTENTION_IMPLEMENTATIONS[1:])}")


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
        t = _CURVES[("fa1" if k == "fa1" else "fa2", "hopper" if arch in ("hopper", "blackwell") else "ampere")]
    return t, (FLEX_OF_FA2 if kernel == "flex" else 1.0)


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise linear through ``points`` (sorted by x, x already on the scale to interpolate
    on), flat beyond the first and the last."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


@lru_cache(maxsize=256)
def _measured_rows(gpu: GpuSpec, kernel: str, direction: str, mask: str) -> tuple[tuple[float, tuple], ...]:
    """The measured points of one kernel, direction and mask, as ((log2 head dim, ((log seq,
    efficiency), ...)), ...) sorted; empty when the profile did not measure them."""
    by_dim: dict[float, dict[float, float]] = {}
    for k, d, m, hd, seq, eff in gpu.attention_table:
        if (k, d, m) == (kernel, direction, mask):
            by_dim.setdefault(float(hd), {})[float(seq)] = float(eff)
    return tuple((math.log2(hd), tuple(sorted((math.log(s), e) for s, e in pts.items())))
                 for hd, pts in sorted(by_dim.items()))


def measured_efficiency(kernel: str, gpu: GpuSpec, head_dim: float, seq_len: float, causal: bool,
                        direction: str) -> float | None:
    """The fraction of peak ``gpu.attention_table`` gives ``kernel`` in ``direction`` ("fwd" or
    "bwd"), interpolated (module docstring); None where the profile did not measure it."""
    if not gpu.attention_table:
        return None
    scale = FLEX_OF_FA2 if kernel == "flex" else 1.0
    rows = _measured_rows(gpu, "fa2" if kernel == "flex" else kernel, direction, "causal" if causal else "none")
    if not rows:
        return None
    ls = math.log(max(seq_len, 1.0))
    per_dim = [(ld, _interp(list(pts), ls)) for ld, pts in rows]
    return scale * _interp(per_dim, math.log2(max(head_dim, 1.0)))


def efficiency(kernel: str, gpu: GpuSpec, head_dim: float, seq_len: float, causal: bool, direction: str) -> float:
    """Fraction of the GPU's 16-bit peak ``kernel`` reaches in ``direction`` ("fwd", "bwd" or
    "fb" for the two together): measured where the GPU's profile measured it, else published."""
    if gpu.attention_table:
        if direction == "fb":
            f = measured_efficiency(kernel, gpu, head_dim, seq_len, causal, "fwd")
            b = measured_efficiency(kernel, gpu, head_dim, seq_len, causal, "bwd")
            if f is not None and b is not None:
                return (1 + BACKWARD_FLOPS_OF_FORWARD) / (1 / f + BACKWARD_FLOPS_OF_FORWARD / b)
        else:
            got = measured_efficiency(kernel, gpu, head_dim, seq_len, causal, direction)
            if got is not None:
                return got
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
    if kernel in ULTRA_KERNELS and direction in ULTRA_OF_BLACKWELL and is_blackwell_ultra(gpu):
        scale *= ULTRA_OF_BLACKWELL[direction]
    return scale * _eta_max(points, head_dim) * seq_len / (seq_len + s0)


ATTENTION_TILE_ROWS = 128       # query (forward) / key (backward) rows per thread block (module docstring)
BENCH_TOKENS = 16384            # the published curves' tokens per call (batch x sequence) ...
BENCH_WIDTH = 2048              # ... and heads x head dim


def _waves(blocks: float, sms: int) -> float:
    """Useful fraction of ``blocks`` thread blocks run in whole waves on ``sms`` SMs."""
    return blocks / (math.ceil(blocks / sms) * sms)


def grid_factor(gpu: GpuSpec, pairs: float, head_dim: float, seq_len: float) -> float:
    """The grid's useful fraction of the GPU for ``pairs`` (batch x heads on this rank) over
    ``seq_len`` rows, relative to the published curves' grid at that length; at most 1, and 1 when
    ``pairs`` is 0 (not given) or the GPU's SM count is unknown (module docstring)."""
    sms = gpu_sms(gpu.name)
    if pairs <= 0 or sms <= 0 or seq_len <= 0:
        return 1.0
    tiles = math.ceil(seq_len / ATTENTION_TILE_ROWS)
    bench = max(1.0, BENCH_TOKENS / seq_len) * max(1.0, BENCH_WIDTH / max(head_dim, 1.0)) * tiles
    return min(1.0, _waves(math.ceil(pairs) * tiles, sms) / _waves(math.ceil(bench), sms))


# ---- FP8 attention ------------------------------------------------------------------------------
# Transformer Engine's FP8 dot-product attention (Megatron's --fp8-dot-product-attention, MLPerf's
# FP8_DPA) runs cuDNN's FP8 fused attention. Its speed over cuDNN's BF16 kernel, from NVIDIA/cudnn-frontend's
# own training benchmark (``benchmark/sdpa_benchmark_training/results`` at 3929da2), the same runs as the
# Blackwell BF16 curves above: GB200 and GB300 (cuDNN 9.22.0, 2026-04-24) at head dim 192/128 (DeepSeek-V3:
# 128 heads, ``dsv3_*.csv``) and 128 (Llama 3.1: 64 query / 8 KV heads, ``llama3.1_*.csv``); H200 (cuDNN
# 9.19.1, ``h200_919_only_cudnn/llama3.1_*.csv``) at 128, per-tensor FP8 only (MXFP8 is Blackwell's). Ratio of
# TFLOP/s, FP8 over BF16, non-deterministic backward, at sequences ``FP8_ATTENTION_SEQS``, by architecture
# (Blackwell Ultra apart: its BF16 kernel is already ``ULTRA_OF_BLACKWELL`` faster), scaling ("fp8": per-tensor
# current or delayed scaling; "mxfp8"), head dim, causal mask and direction. The gain depends on all of them:
# 1.2-1.8x forward; the backward from 0.64x (H200, causal, 32k: FP8 is slower) to 2.06x.
FP8_ATTENTION_SEQS = (2048, 4096, 8192, 16384, 32768)
FP8_ATTENTION_OF_BF16: dict[tuple[str, str, int, bool, str], tuple[float, ...]] = {
    ("blackwell", "fp8", 192, True, "fwd"): (1.548, 1.49, 1.512, 1.482, 1.404),
    ("blackwell", "fp8", 192, True, "bwd"): (1.551, 1.601, 1.642, 1.735, 1.726),
    ("blackwell", "fp8", 192, False, "fwd"): (1.458, 1.511, 1.468, 1.429, 1.477),
    ("blackwell", "fp8", 192, False, "bwd"): (1.724, 1.763, 1.886, 1.828, 1.779),
    ("blackwell", "mxfp8", 192, True, "fwd"): (1.432, 1.369, 1.4, 1.403, 1.336),
    ("blackwell", "mxfp8", 192, True, "bwd"): (1.238, 1.29, 1.252, 1.369, 1.424),
    ("blackwell", "mxfp8", 192, False, "fwd"): (1.353, 1.39, 1.369, 1.375, 1.365),
    ("blackwell", "mxfp8", 192, False, "bwd"): (1.435, 1.426, 1.493, 1.506, 1.437),
    ("blackwell", "fp8", 128, True, "fwd"): (1.294, 1.282, 1.301, 1.261, 1.355),
    ("blackwell", "fp8", 128, True, "bwd"): (0.939, 1.026, 1.092, 1.229, 1.376),
    ("blackwell", "fp8", 128, False, "fwd"): (1.313, 1.309, 1.265, 1.334, 1.36),
    ("blackwell", "fp8", 128, False, "bwd"): (1.08, 1.168, 1.262, 1.336, 1.446),
    ("blackwell", "mxfp8", 128, True, "fwd"): (1.212, 1.197, 1.208, 1.17, 1.261),
    ("blackwell", "mxfp8", 128, True, "bwd"): (0.842, 0.918, 0.966, 1.081, 1.162),
    ("blackwell", "mxfp8", 128, False, "fwd"): (1.224, 1.216, 1.174, 1.239, 1.267),
    ("blackwell", "mxfp8", 128, False, "bwd"): (0.951, 0.996, 1.065, 1.131, 1.173),
    ("ultra", "fp8", 192, True, "fwd"): (1.782, 1.753, 1.714, 1.68, 1.69),
    ("ultra", "fp8", 192, True, "bwd"): (1.653, 1.734, 1.789, 1.889, 1.867),
    ("ultra", "fp8", 192, False, "fwd"): (1.728, 1.706, 1.682, 1.692, 1.754),
    ("ultra", "fp8", 192, False, "bwd"): (1.879, 1.899, 1.929, 2.057, 1.979),
    ("ultra", "mxfp8", 192, True, "fwd"): (1.61, 1.583, 1.55, 1.524, 1.486),
    ("ultra", "mxfp8", 192, True, "bwd"): (1.267, 1.332, 1.379, 1.416, 1.445),
    ("ultra", "mxfp8", 192, False, "fwd"): (1.558, 1.557, 1.538, 1.534, 1.598),
    ("ultra", "mxfp8", 192, False, "bwd"): (1.491, 1.516, 1.558, 1.6, 1.563),
    ("ultra", "fp8", 128, True, "fwd"): (1.423, 1.487, 1.561, 1.595, 1.591),
    ("ultra", "fp8", 128, True, "bwd"): (0.976, 1.119, 1.241, 1.35, 1.428),
    ("ultra", "fp8", 128, False, "fwd"): (1.511, 1.573, 1.567, 1.58, 1.661),
    ("ultra", "fp8", 128, False, "bwd"): (1.146, 1.287, 1.379, 1.417, 1.526),
    ("ultra", "mxfp8", 128, True, "fwd"): (1.275, 1.334, 1.385, 1.424, 1.426),
    ("ultra", "mxfp8", 128, True, "bwd"): (0.839, 0.916, 0.978, 1.037, 1.067),
    ("ultra", "mxfp8", 128, False, "fwd"): (1.353, 1.417, 1.423, 1.434, 1.533),
    ("ultra", "mxfp8", 128, False, "bwd"): (0.96, 1.028, 1.069, 1.1, 1.159),
    ("hopper", "fp8", 128, True, "fwd"): (1.442, 1.445, 1.497, 1.501, 1.515),
    ("hopper", "fp8", 128, True, "bwd"): (1.062, 0.994, 0.795, 0.646, 0.637),
    ("hopper", "fp8", 128, False, "fwd"): (1.374, 1.45, 1.48, 1.503, 1.532),
    ("hopper", "fp8", 128, False, "bwd"): (1.054, 1.075, 1.071, 1.077, 1.178),
}


def fp8_attention_factor(gpu: GpuSpec, scaling: str, head_dim: float, seq_len: float, causal: bool,
                         direction: str) -> float:
    """How much faster cuDNN's FP8 attention runs than its BF16 kernel on ``gpu`` (``FP8_ATTENTION_OF_BF16``),
    ``scaling`` "mxfp8" or "fp8" (per-tensor), interpolated in log2 of the sequence and of the head dim
    between the measured ones, flat beyond them; 1.0 where nothing was measured (no FP8 attention kernel:
    Ampere and older)."""
    arch = architecture(gpu)
    if arch == "blackwell" and is_blackwell_ultra(gpu):
        arch = "ultra"
    dims = sorted(hd for (a, sc, hd, c, d) in FP8_ATTENTION_OF_BF16 if (a, sc, c, d) == (arch, scaling, causal, direction))
    if not dims:
        return 1.0
    ls = math.log2(max(seq_len, 1.0))
    seqs = [math.log2(s) for s in FP8_ATTENTION_SEQS]
    per_dim = [(math.log2(hd), _interp(list(zip(seqs, FP8_ATTENTION_OF_BF16[(arch, scaling, hd, causal, direction)])), ls))
               for hd in dims]
    return _interp(per_dim, math.log2(max(head_dim, 1.0)))


def fp8_kernel(kernel: str, scaling: str) -> str:
    """The kernel name of FP8 attention over ``kernel`` (cuDNN's only: Transformer Engine's fused attention),
    ``scaling`` "mxfp8" or "fp8"; ``kernel`` unchanged for any other."""
    return f"{kernel}+{scaling}" if kernel == "cudnn" else kernel


def block_s(kernel: str, gpu: GpuSpec, peak_flops: float, fwd_flops: float, head_dim: float,
             seq_len: float, causal: bool, pairs: float = 0.0) -> tuple[float, float]:
    """(forward, backward) time of one fused-attention block doing ``fwd_flops`` in its forward
    (the kernels' convention: causal halves them; backward does 2.5 times the forward) with
    ``seq_len`` keys. FA2's published tables give forward + backward together: split in
    proportion to the FLOPs (the same efficiency both ways, an assumption). ``pairs``: batch x
    heads on this rank, for the grid's fill (``grid_factor``; 0: not priced)."""
    if fwd_flops <= 0:
        return 0.0, 0.0
    if "+" in kernel:
        # FP8 attention: cuDNN's BF16 block at its measured FP8 speed-up per direction (fp8_attention_factor)
        base, scaling = kernel.split("+", 1)
        f, b = block_s(base, gpu, peak_flops, fwd_flops, head_dim, seq_len, causal, pairs)
        return (f / fp8_attention_factor(gpu, scaling, head_dim, seq_len, causal, "fwd"),
                b / fp8_attention_factor(gpu, scaling, head_dim, seq_len, causal, "bwd"))
    if pairs > 0:
        g = grid_factor(gpu, pairs, head_dim, seq_len)
        if g < 1.0:
            f, b = block_s(kernel, gpu, peak_flops, fwd_flops, head_dim, seq_len, causal)
            return f / g, b / g
    if gpu.attention_table:
        mf = measured_efficiency(kernel, gpu, head_dim, seq_len, causal, "fwd")
        mb = measured_efficiency(kernel, gpu, head_dim, seq_len, causal, "bwd")
        if mf is not None and mb is not None:       # both directions measured: each on its own
            return fwd_flops / (peak_flops * mf), BACKWARD_FLOPS_OF_FORWARD * fwd_flops / (peak_flops * mb)
    table, _ = _table(kernel, gpu)
    if "fb" in table:
        eta = efficiency(kernel, gpu, head_dim, seq_len, causal, "fb")
        return fwd_flops / (peak_flops * eta), BACKWARD_FLOPS_OF_FORWARD * fwd_flops / (peak_flops * eta)
    ef = efficiency(kernel, gpu, head_dim, seq_len, causal, "fwd")
    eb = efficiency(kernel, gpu, head_dim, seq_len, causal, "bwd")
    return fwd_flops / (peak_flops * ef), BACKWARD_FLOPS_OF_FORWARD * fwd_flops / (peak_flops * eb)


def attention_time_s(kernel: str, gpu: GpuSpec, peak_flops: float, fwd_flops: float, head_dim: float,
                     seq_len: float, causal: bool) -> float:
    """Forward plus backward time of one fused-attention block (``block_s``)."""
    f, b = block_s(kernel, gpu, peak_flops, fwd_flops, head_dim, seq_len, causal)
    return f + b


@lru_cache(maxsize=4096)
def attention_fwd_bwd_s(kernel: str, gpu: GpuSpec, peak_flops: float, fwd_flops: float, head_dim: float,
                        seq_len: float, cp: int = 1, pairs: float = 0.0) -> tuple[float, float]:
    """(forward, backward) time of a rank's causal attention doing ``fwd_flops`` in its forward
    (causal work only: half the full score matrix) over a sequence of ``seq_len`` tokens split
    over ``cp`` context-parallel ranks (module docstring: the load-balanced ring's blocks). The
    one rule for training's attention core (``costmodel.layers.layer_cost``); ``pairs``: batch x
    heads on the rank, for each block's grid (``grid_factor``)."""
    if cp <= 1:
        return block_s(kernel, gpu, peak_flops, fwd_flops, head_dim, seq_len, True, pairs)
    local = seq_len / cp
    # step 0: causal over the local chunk pair; the cp - 1 others: non-causal blocks of equal
    # work whose shorter side is s/(2cp) (module docstring)
    f0, b0 = block_s(kernel, gpu, peak_flops, fwd_flops / cp, head_dim, local, True, pairs)
    f1, b1 = block_s(kernel, gpu, peak_flops, fwd_flops * (cp - 1) / cp, head_dim, local / 2, False, pairs)
    return f0 + f1, b0 + b1


# the implementations whose context parallelism is PyTorch's ring attention
# (torch.distributed.tensor.experimental context_parallel: torchtitan, this project's runtime)
TORCH_CP_IMPLEMENTATIONS = ("sdpa", "sdpa-torchtitan", "flex", "varlen")


def torch_ring(attention: str, cp: int) -> bool:
    """Whether attention implementation ``attention`` (``costmodel.frameworks.attention_impl``) under
    context parallelism ``cp`` runs PyTorch's ring attention: the one rule for its pricing here and
    for the ``train-torch-cp`` uncertainty band (``planner.cli.report.credibility``)."""
    return cp > 1 and attention in TORCH_CP_IMPLEMENTATIONS


def library_ring(attention: str, cp: int) -> bool:
    """Whether ``attention`` under context parallelism ``cp`` runs a ring other than PyTorch's (Transformer
    Engine's, under Megatron and NeMo): the one rule for the ``train-cp`` uncertainty band
    (``planner.cli.report.credibility``) and for the validation runs that make it
    (``planner.cli.validation_cross.cp_case``)."""
    return cp > 1 and not torch_ring(attention, cp)


# PyTorch's merge of the ring's partial results runs as eager elementwise ops: priced at the eager
# forward fraction of HBM bandwidth (costmodel.compute.MEMORY_BOUND_FRACTION["eager"][0]) both
# ways -- these are plain binary ops, not the norm backward the eager backward fraction measures;
# Transformer Engine's merges (one fused correction kernel, single adds and copies) at the same fraction
RING_MERGE_KIND = "eager"


def ring_merge_bytes(attention: str, tokens: float, q_width: float, kv_width: float,
                     cp: int, fused: bool = False) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one layer's ring-attention bookkeeping on a rank holding
    ``tokens`` queries of ``q_width`` values (heads x head dim) and keys/values of ``kv_width``
    each, over ``cp`` ring steps; 0 without CP.

    Transformer Engine's ring (``library_ring``: ``AttnFuncWithCPAndKVP2P``, TE v1.9
    ``transformer_engine/pytorch/attention.py``; v2.4 ``.../dot_product_attention/context_parallel.py``
    does the same), counted in BF16 on the busiest rank (the last, whose every step is a full block):
    forward, K and V concatenated into the first send buffer (``torch.cat``: 2 x 4 bytes per K/V
    value), the output zeroed (2 bytes per output value) and each step's partial output merged into
    it (``flash_attn_fwd_out_correction``, one fused kernel: ``out.add_(out_per_step * exp(lse_step -
    lse))``, read 2 + 2, write 2: 6 bytes per output value per step); backward, K and V copied into the
    first buffer again (8 bytes per K/V value) and, each step, the step's dQ added into dQ (6 bytes
    per Q value) and its dK, dV into the buffer that travels the ring (``dkv.add_(dkv_)``: 12 bytes per
    K/V value), after concatenating them (``torch.cat((dk_, dv_))``: 8 more) where the step ran
    cuDNN's fused attention (``fused``; FlashAttention writes them into one buffer). The softmax
    statistics' corrections are per row, not per value: left out.

    PyTorch's ring, counted from PyTorch's ``_templated_ring_attention`` and its backward
    (``torch/distributed/tensor/experimental/_attention.py``), with ``convert_to_f32`` on (its
    default), on the busiest rank of each step (the ring waits for it): forward, each of the
    ``cp - 1`` steps after the first copies K and V into the send buffer (``torch.cat``: 2 x 4
    bytes per K/V value), casts the block's output to FP32 (2 + 4 bytes per output value) and
    merges it into the FP32 accumulator (``out - sigmoid(...) * (out - block_out)``: three binary
    ops, 32 bytes per value); the first step's cast and the final cast back to BF16 add 12 bytes
    per output value. Backward, each of the ``cp`` steps copies K and V again (8 bytes per K/V
    value), accumulates dQ in FP32 (read 4 + 2, write 4: 10 bytes per Q value), adds dK and dV into
    the FP32 buffers that travel the ring (``_partial_update``'s chunk-and-concatenate on the
    busiest rank: 26 bytes per K/V value) and copies them into the send buffer (16 bytes per K/V
    value)."""
    if cp <= 1:
        return 0.0, 0.0
    q, kv = tokens * q_width, tokens * kv_width
    if not torch_ring(attention, cp):
        return 8.0 * kv + 2.0 * q + cp * 6.0 * q, 8.0 * kv + cp * (6.0 * q + (20.0 if fused else 12.0) * kv)
    fwd = (cp - 1) * (38.0 * q + 8.0 * kv) + 12.0 * q
    bwd = cp * (10.0 * q + 50.0 * kv)
    return fwd, bwd


def kv_width_passed(attention: str, q_width: float, kv_width: float) -> float:
    """The K/V width the attention call receives: the published torchtitan runs' llama code
    expanded grouped K/V to every query head before SDPA (``repeat_kv`` in torchtitan's
    ``models/llama/model.py`` of 2024-25), so their ring passes ``q_width``; the others pass the
    grouped width."""
    return q_width if attention == "sdpa-torchtitan" else kv_width


ATTENTION_IMPLEMENTATIONS = ("", "sdpa", "sdpa-torchtitan", "flex", "varlen", "flash-attn", "flash-attn-1", "flash-attn-3",
                             "flash-attn-4", "te")


# PyTorch's context parallel K/V exchange: torchtitan's ``--experimental.context_parallel_rotate_method``
# defaults to "allgather" (torchtitan 9dec370, ``torchtitan/config_manager.py``, the commit of the
# published 2024-12 runs), as ``_ContextParallelOptions.rotate_method`` does in
# ``torch/distributed/tensor/experimental/_attention.py``; the backward's K/V gradients always
# travel the ring (``dkv_rotater = _create_rotater(group, 2, method=_RotateMethod.ALL_TO_ALL)``)
# (also the default of the PyTorch the index stores, pytorch/pytorch 0123248a). Priced for the
# implementations that reach torch's SDPA ring (``_templated_ring_attention``); torchtitan's newer
# FlexAttention / varlen CP runs other code (its ``distributed/context_parallel``, not read here)
# and keeps the ring's pricing.
TORCH_SDPA_RING_IMPLEMENTATIONS = ("sdpa", "sdpa-torchtitan")
DKV_BYTES_PER_KV_BYTE = 2.0      # the gradients travel in FP32 (``convert_to_f32``), K and V in BF16


# ---- head dimensions a kernel pads ------------------------------------------------------------
# FlexAttention's Triton template tiles Q.K^T over ``QK_HEAD_DIM_ROUNDED`` and P.V over
# ``V_HEAD_DIM_ROUNDED``, each ``next_power_of_two`` of the model's width (PyTorch
# ``torch/_inductor/kernel/flex/common.py``, the kernel options; ``templates/flex_attention.py.jinja``
# and ``flex_backwards.py.jinja`` load and accumulate ``[BLOCK, *_HEAD_DIM_ROUNDED]`` tiles, masking
# the padding): the tensor cores do the padded work. The forward runs one GEMM of each width
# (S = Q.K^T, O = P.V); the backward five, three over the query/key width (S again, dQ = dS.K,
# dK = dS^T.Q) and two over the value width (dP = dO.V^T, dV = P^T.dO). DeepSeek-V3's MLA (192 and
# 128) thus does 1.2x its forward work and 1.23x its backward; a 128-wide head none. The other kernels
# priced here take the model's widths as they are (cuDNN, FA3 and FA4 at DeepSeek-V3's 192/128
# among their supported shapes).
PADDED_HEAD_DIM_KERNELS = ("flex",)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def head_dim_padding(kernel: str, qk_dim: int, v_dim: int) -> tuple[float, float]:
    """(forward, backward) factor on an attention kernel's time for the head widths it pads: the
    padded over the model's tensor-core work (module comment above); (1, 1) for a kernel that
    does not pad or widths already powers of two."""
    if kernel not in PADDED_HEAD_DIM_KERNELS or qk_dim <= 0 or v_dim <= 0:
        return 1.0, 1.0
    pq, pv = _next_power_of_two(qk_dim), _next_power_of_two(v_dim)
    return (pq + pv) / (qk_dim + v_dim), (3 * pq + 2 * pv) / (3 * qk_dim + 2 * v_dim)


def torch_cp_step0_s(kernel: str, gpu: GpuSpec, peak_flops: float, fwd_flops: float, head_dim: float,
                     seq_len: float, cp: int, pairs: float = 0.0) -> tuple[float, float]:
    """(forward, backward) time of the ring's step 0 (the rank's causal pair of chunks, a ``1/cp``
    share of the causal work ``fwd_flops``): what runs before the first wait on the exchange."""
    return block_s(kernel, gpu, peak_flops, fwd_flops / cp, head_dim, seq_len / cp, True, pairs)


def torch_cp_exposed_s(gather_s: float, dkv_step_s: float, step0_fwd_s: float,
                       step0_bwd_s: float) -> tuple[float, float]:
    """(forward, backward) exchange time PyTorch's ring attention leaves exposed with the
    all-gather rotater, from ``_templated_ring_attention`` and its backward
    (``torch/distributed/tensor/experimental/_attention.py``):

    * forward: ``_AllGatherRotater.exchange_buffers`` issues one all-gather of every rank's K and V
      at step 0 ("We only need to perform allgather once"); ``next_buffer`` waits for it at step 1,
      so only step 0's block (``step0_fwd_s``) runs beside it: ``max(0, gather_s - step0_fwd_s)``;
    * backward: the K/V all-gather again, beside step 0's backward block, and the K/V gradients'
      ring (``dkv_rotater``, all-to-all): each step's exchange is issued after its block and waited
      for after the next block, except the last, which ``dkv_rotater.next_buffer()`` waits for
      after the loop with nothing left to run: one transfer of ``dkv_step_s`` exposed.

    ``gather_s``: the all-gather of ``cp`` ranks' K and V (the width the attention call receives);
    ``dkv_step_s``: one ring hop of their FP32 gradients."""
    fwd = max(0.0, gather_s - step0_fwd_s)
    bwd = max(0.0, gather_s - step0_bwd_s) + dkv_step_s
    return fwd, bwd
