"""GEMM wave, tile and alignment quantization (``costmodel.compute.gemm_shape_factor``) and FP8's casts
per GEMM (``costmodel.fp8.Fp8Recipe.cast_bytes``), each against a hand derivation (issue 23)."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from costmodel import fp8
from costmodel.compute import (GEMM_TILES, MEMORY_BOUND_FRACTION, MISALIGNED_FACTOR, alignment_factor,
                               fp8_gemm_time_s, gemm_shape_factor, gemm_time_s, gpu_sms, matmul_efficiency,
                               memory_bound_factor, memory_time_s, wave_tile_factor)
from costmodel.files.clusters import load_cluster


def _slow_wave_factor(sms: int, m: int, n: int) -> float:
    """The obvious version: lay out every tile of every candidate shape, hand the blocks to the
    SMs one wave at a time, and count the busy tile slots over all slots of all waves."""
    if sms <= 0:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        tm, tn = min(tm, 16 * math.ceil(m / 16)), min(tn, 16 * math.ceil(n / 16))
        blocks = [(i, j) for i in range(0, m, tm) for j in range(0, n, tn)]
        if len(blocks) <= sms:
            return 1.0
        waves = [blocks[w:w + sms] for w in range(0, len(blocks), sms)]
        useful = sum(min(tm, m - i) * min(tn, n - j) for i, j in blocks)
        best = max(best, useful / (len(waves) * sms * tm * tn))
    return best


def test_a_known_wave_count_by_hand():
    # GPT-3 175B's QKV GEMM at tp 8 and one 2048-token micro-batch on an A100 (108 SMs): the output
    # is 2048 x 4608. 128 x 256 tiles: 16 x 18 = 288 blocks, ceil(288/108) = 3 waves of which
    # 288/324 are busy; 256 x 128: the same 288; 128 x 128: 576 blocks, 6 waves, 576/648 busy.
    # Every tile divides the output, so the factor is 8/9 exactly.
    assert gpu_sms("A100-SXM4-80GB") == 108
    assert wave_tile_factor(108, 2048, 4608) == pytest.approx(8 / 9, rel=1e-12)
    # the same output on an H100 (132 SMs): 288 blocks of 128 x 256 in 3 waves (288/396), or
    # 576 of 128 x 128 in 5 waves (576/660): the better one, 576/660
    assert gpu_sms("H100-SXM5-80GB") == 132
    assert wave_tile_factor(132, 2048, 4608) == pytest.approx(576 / 660, rel=1e-12)


def test_at_most_one_wave_is_the_size_curves_and_a_partial_tile_costs_a_whole_one():
    # 4 x 8 blocks of 128 x 256 (32 <= 108): one wave, factor 1 (the size curve's regime)
    assert wave_tile_factor(108, 512, 2048) == 1.0
    # a dimension under one tile runs a tile shrunk to it: decode-sized GEMMs are not padded to 128
    assert wave_tile_factor(132, 8, 4096) == 1.0
    # tile padding: 1000 x 30000 on 132 SMs. By hand with 128 x 256: ceil(1000/128) = 8 row tiles,
    # ceil(30000/256) = 118 column tiles: 944 blocks, 8 waves: 1000*30000 / (8*132*128*256)
    by_hand = 1000 * 30000 / (8 * 132 * 128 * 256)
    assert wave_tile_factor(132, 1000, 30000) >= by_hand          # the best tile is at least that one
    assert wave_tile_factor(132, 1000, 30000) == pytest.approx(_slow_wave_factor(132, 1000, 30000), rel=1e-12)
    assert wave_tile_factor(0, 1000, 30000) == 1.0                # unknown SM count: not priced


@pytest.mark.parametrize("sms", [108, 132, 148])
def test_the_closed_form_against_the_slow_obvious_layout(sms):
    for m, n in itertools.product((64, 1000, 2048, 4096, 6144, 8192), (1536, 3072, 4608, 6400, 12288, 14336)):
        assert wave_tile_factor(sms, m, n) == pytest.approx(_slow_wave_factor(sms, m, n), rel=1e-12), (m, n)


def test_the_memo_is_the_function():
    for args in [("A100-SXM4-80GB", 2048, 4608, 12288, 2, True), ("H100-SXM5-80GB", 4096, 10922, 4096, 2, False),
                 ("B200-180GB", 16384, 3584, 8192, 1, True), ("MI300X-192GB", 4096, 4096, 4096, 2, True)]:
        assert gemm_shape_factor(*args) == gemm_shape_factor.__wrapped__(*args)


def test_training_takes_forward_dgrad_and_wgrad():
    # a linear's three GEMMs have outputs m x n, m x k and n x k; at equal FLOPs and one efficiency
    # each, the layer's time is the sum: the harmonic mean of the three factors
    m, n, k = 2048, 4608, 12288
    f = [wave_tile_factor(108, a, b) for a, b in ((m, n), (m, k), (n, k))]
    assert gemm_shape_factor("A100-SXM4-80GB", m, n, k, 2, True) == pytest.approx(3 / sum(1 / x for x in f))
    cl = load_cluster("dgx-a100-80gb").with_gpus(8)
    gpu = cl.groups[0].gpu
    slow = sum(2 * m * n * k / (gpu.peak("fp16") * matmul_efficiency(gpu, cl, m, n, k) * x) for x in f) / 3
    assert gemm_time_s(gpu, cl, "fp16", m, n, k, train=True) == pytest.approx(slow, rel=1e-12)


def test_tensor_parallel_changes_the_wave_count():
    # GPT-3 175B's QKV output at 2048 tokens: 3*12288/tp columns. The factor moves with tp, not
    # monotonically: this is what the free choice reads.
    f = {tp: wave_tile_factor(108, 2048, 3 * 12288 // tp) for tp in (1, 2, 4, 8)}
    assert len(set(round(v, 6) for v in f.values())) > 1
    assert all(0.5 < v <= 1.0 for v in f.values())


def test_misaligned_widths_lose_what_was_measured():
    # stas00/ml-engineering swiglu-maf-bench.py, H100, h = 4096: d_ff 10922 gives 272.7 TFLOP/s, 10944
    # gives 398.4, its neighbours 10848..11008 (step 32) about 395. Priced: the MLP's three GEMMs at
    # 8192 tokens (the bench's token count is not in the reference, any large one serves).
    cl = load_cluster("dgx-h100").with_gpus(8)
    gpu = cl.groups[0].gpu

    def mlp_tflops(f: int) -> float:
        t = (2 * gemm_time_s(gpu, cl, "bf16", 8192, f, 4096) + gemm_time_s(gpu, cl, "bf16", 8192, 4096, f))
        return 3 * 2 * 8192 * 4096 * f / t / 1e12

    measured = 272.7 / 398.4
    assert mlp_tflops(10922) / mlp_tflops(10944) == pytest.approx(measured, rel=0.05)
    for f in range(10848, 11009, 32):                       # the aligned neighbours: no alignment loss
        assert alignment_factor(f, 4096, 2) == 1.0
    assert alignment_factor(10922, 4096, 2) == MISALIGNED_FACTOR
    # 16 bytes: 8 BF16 values, 16 FP8 values
    assert alignment_factor(4104, 4096, 2) == 1.0 and alignment_factor(4104, 4096, 1) == MISALIGNED_FACTOR


def test_the_factor_never_raises_the_size_curve():
    # replan's bound (planner/search/replan.py) takes the curve's ceiling as the best efficiency
    for name in ("A100-SXM4-80GB", "H100-SXM5-80GB", "B200-180GB", "L40S-48GB", "cpu-process"):
        for m, n, k in itertools.product((8, 512, 3000, 8192), (128, 1376, 4608, 50304), (64, 4096, 12288)):
            for train in (False, True):
                assert 0.0 < gemm_shape_factor(name, m, n, k, 2, train) <= 1.0


def test_a_measured_table_keeps_its_square_gemms_and_its_best():
    cl = load_cluster("dgx-a100-80gb").with_gpus(8)
    gpu = cl.groups[0].gpu
    table = ((512.0, 0.40), (2048.0, 0.70), (8192.0, 0.85))
    tcl = dataclasses.replace(cl, matmul_table=table)
    for size, eff in table:
        s = int(size)
        assert gemm_time_s(gpu, tcl, "fp16", s, s, s) == pytest.approx(2 * s ** 3 / (gpu.peak("fp16") * eff), rel=1e-9)
    # a shape with a worse tail wave than the square one of its size is slower; none is faster than the best
    assert gemm_time_s(gpu, tcl, "fp16", 2048, 4608, 12288) >= 2 * 2048 * 4608 * 12288 / (gpu.peak("fp16") * 0.85)


# ---- FP8: the casts per GEMM ------------------------------------------------------------------

def test_cast_values_per_gemm_by_recipe():
    h100 = load_cluster("dgx-h100").groups[0].gpu
    te = fp8.resolve("delayed", "megatron", h100)
    ao = fp8.resolve("tensorwise", "torchtitan", h100)
    m, n, k = 4096, 12288, 4096
    assert te.gemm_cast_values(m, n, k) == (m * k, m * n)
    assert ao.gemm_cast_values(m, n, k) == (m * k + n * k, m * n + n * k + m * k)
    # delayed: one read of 2 bytes, FP8 row-wise and transposed copies; current: amax + cast reads
    assert te.cast_bytes(m, n, k) == (m * k + m * n) * (2 + 2)
    assert fp8.resolve("current", "megatron", h100).cast_bytes(m, n, k) == (m * k + m * n) * (4 + 2)
    assert ao.cast_bytes(m, n, k) == (2 * m * k + 2 * n * k + m * n) * (4 + 1)


def test_fbgemm_rowwise_8192_cubed_with_quantization():
    # pytorch/FBGEMM PR #2546 (H100 at 500 W; the reference notes on MoE and FP8, section 6): at
    # 8192^3 the FP8 row-wise GEMM alone runs 1126 TFLOP/s, 932 with the scaling and quantization of
    # both operands. Hand derivation with the rule: the forward of a row-wise (dynamic, torchao-style)
    # recipe casts the input and the weight, 2 reads of 2 bytes and 1 write each, at the fused kernels'
    # HBM fraction of H100's 3.35 TB/s.
    gpu = load_cluster("dgx-h100").groups[0].gpu
    r = fp8.resolve("rowwise", "torchtitan", gpu)
    s = 8192
    fwd_values, _ = r.gemm_cast_values(s, s, s)
    assert fwd_values == 2 * s * s
    cast_s = memory_time_s(gpu, fwd_values * r.cast_bytes_per_value()) / MEMORY_BOUND_FRACTION["fused"][0]
    gemm_s = 2 * s ** 3 / 1126e12
    predicted = 2 * s ** 3 / (gemm_s + cast_s) / 1e12
    assert predicted == pytest.approx(932, rel=0.10)


def test_te_autocast_layer_speedup_includes_the_casts():
    # Transformer Engine's GEMM profiler, 5B config on H200 NVL (moe-and-fp8.md section 6): the 12
    # GEMMs of a layer with quantization (autocast) run 1.69x (delayed) and 1.58x (current scaling)
    # faster than BF16. The model: the FP8 curve plus the casts per GEMM, on the H200.
    cl = load_cluster("dgx-h200").with_gpus(8)
    gpu = cl.groups[0].gpu
    bf16 = sum(gemm_time_s(gpu, cl, "bf16", m, n, k, train=True) for m, n, k in fp8.TE_LAYER_GEMMS)
    f8 = sum(fp8_gemm_time_s(gpu, cl, m, n, k) for m, n, k in fp8.TE_LAYER_GEMMS)
    speedup = {}
    for recipe in ("delayed", "current"):
        r = fp8.resolve(recipe, "megatron", gpu)
        cast = sum(memory_time_s(gpu, r.cast_bytes(m, n, k)) for m, n, k in fp8.TE_LAYER_GEMMS) / 3
        speedup[recipe] = bf16 / (f8 + cast * memory_bound_factor("fused"))
    assert speedup["delayed"] == pytest.approx(1.69, rel=0.10)
    assert speedup["current"] == pytest.approx(1.58, rel=0.10)
    assert speedup["current"] < speedup["delayed"]          # the amax pass


def test_the_fp8_gain_depends_on_the_gemms_shape():
    # the casts are m*k + m*n values against 2*m*n*k FLOPs: a narrow TP-sharded GEMM gains least
    cl = load_cluster("dgx-h100").with_gpus(8)
    gpu = cl.groups[0].gpu
    r = fp8.resolve("delayed", "megatron", gpu)

    def gain(m, n, k):
        cast = memory_time_s(gpu, r.cast_bytes(m, n, k)) / 3 * memory_bound_factor("fused")
        return gemm_time_s(gpu, cl, "bf16", m, n, k, train=True) / (fp8_gemm_time_s(gpu, cl, m, n, k) + cast)

    wide, narrow = gain(8192, 14336, 4096), gain(8192, 14336 // 8, 4096)
    assert wide > narrow
    assert gain(1024, 1024, 2048) < 1.2 < wide              # torchao: small linears barely gain or lose


def test_serving_prices_alignment_not_the_waves_of_a_mean_batch():
    # serving's row counts are means of a batch that varies step to step: no wave quantization at
    # the mean, the alignment still
    cl = load_cluster("dgx-h100").with_gpus(8)
    gpu = cl.groups[0].gpu
    for m, n, k in ((1300, 14336, 8192), (1300, 10922, 4096)):
        curve = 2 * m * n * k / (gpu.peak("bf16") * matmul_efficiency(gpu, cl, m, n, k) * alignment_factor(n, k, 2))
        assert gemm_time_s(gpu, cl, "bf16", m, n, k, waves=False) == pytest.approx(curve, rel=1e-12)
    assert gemm_time_s(gpu, cl, "bf16", 1300, 14336, 8192) > gemm_time_s(gpu, cl, "bf16", 1300, 14336, 8192, waves=False)
