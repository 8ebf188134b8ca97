"""MoE in serving (issue 24, "the same rules in serving"): the decode grouped GEMM derived as a
roofline (weights read once per touched expert, compute at the grouped kernel's compute-bound
efficiency), the busiest expert-parallel rank's load, and the engines' gather dispatcher, each
against a hand derivation or a published figure."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.comm import Network, layout_for, launched
from costmodel.files.clusters import load_cluster
from costmodel.inference import (HBM_EFFICIENCY, _Serving, expected_experts_touched, grouped_expert_gemm,
                                 serving_gpu, soft_roofline)
from costmodel.compute import gemm_time_s
from costmodel.moe import gather_dispatch_s, grouped_gemm_compute_factor, grouped_gemm_factor, load_factor
from costmodel.specs import ParallelConfig, Workload

# DeepGEMM README @55ab91f7 (H800, FP8, N x K = 4096 x 7168; reference moe-and-fp8.md §1): masked
# grouped layout, groups x tokens per expert -> TFLOPS, and the contiguous 4 x 8192 large-M point.
DEEPGEMM_MASKED = ((1, 1024, 1233.0), (2, 512, 1040.0), (4, 256, 932.0))
DEEPGEMM_LARGE = (4, 8192, 1346.0)
N, K = 4096, 7168


def _tflops(groups: int, m: int, with_m_factor: bool) -> float:
    c = load_cluster("dgx-h800")
    g = serving_gpu(c.gpu)
    hbm = g.hbm_bandwidth_bytes_per_s * HBM_EFFICIENCY
    weights = groups * N * K * 1.0                    # FP8 weights, read once per expert
    comp, mem = grouped_expert_gemm(g, c, "fp8", hbm, 2.0, m, groups, N, K, weights)
    if with_m_factor:        # the double count: DeepGEMM's whole small-M fall on top of the weight reads
        comp = gemm_time_s(g, c, "fp8", groups * m, N, K) / grouped_gemm_factor(m, K)
    return 2.0 * groups * m * N * K / soft_roofline(comp, mem) / 1e12


def test_decode_grouped_gemm_follows_deepgemm_small_m_without_counting_weights_twice():
    """DeepGEMM's small-M fall, as a fraction of its large-M rate (0.92, 0.77, 0.69), is what the
    roofline gives from the weight reads alone: within 12% at each point. Applying the grouped
    kernel's M factor to the compute as well (what training does, where the weights are not a
    term) errs by more at the smallest M. The absolute rate is the catalog's dense FP8 curve
    (cuBLAS-like, below DeepGEMM's), so fractions are compared."""
    big = _tflops(*DEEPGEMM_LARGE[:2], with_m_factor=False)
    big_double = _tflops(*DEEPGEMM_LARGE[:2], with_m_factor=True)
    errs, errs_double = [], []
    for groups, m, published in DEEPGEMM_MASKED:
        want = published / DEEPGEMM_LARGE[2]
        errs.append(abs(_tflops(groups, m, False) / big / want - 1))
        errs_double.append(abs(_tflops(groups, m, True) / big_double / want - 1))
    assert max(errs) < 0.12, errs
    assert errs_double[-1] > 2 * errs[-1] and max(errs_double) > max(errs), (errs, errs_double)


def test_grouped_gemm_factor_is_the_compute_factor_times_the_m_part():
    for m in (16.0, 153.0, 4096.0):
        for k in (768.0, 2048.0, 7168.0):
            assert grouped_gemm_factor(m, k) == pytest.approx(m / (m + 153.0) * grouped_gemm_compute_factor(k))
    assert grouped_gemm_compute_factor(7168.0) == pytest.approx(0.94)
    assert grouped_gemm_compute_factor(768.0) < grouped_gemm_compute_factor(2048.0) < 0.94


def _sv(ep: int, tp: int, dp: int, gpus: int = 8, name: str = "qwen3-30b-a3b") -> _Serving:
    m = get_model(name)
    c = load_cluster("dgx-h100").with_gpus(gpus)
    w = Workload(global_batch=64, seq_len=1280, mode="infer", prompt_len=1024, output_len=256)
    return _Serving(m, c, w, ParallelConfig(tp=tp, pp=1, dp=dp, ep=ep))


def test_decode_expert_terms_by_hand():
    """Qwen3-30B-A3B (128 experts, top-8, expert FFN 768, hidden 2048) on 8 H100, tp1 ep8, 64
    sequences decoding per replica. By hand: the EP group's tokens are 8 x 64 = 512; each rank holds
    16 experts, of which 16 (1 - (1 - 8/128)^512) are touched (all 16); the mean routed copies on a
    rank are 512 x 8 x 16 / 128 = 512, the busiest rank's 1.54 x 512 (aux-loss coefficient 1e-3:
    ``load_factor`` weak, the rule training uses); each touched expert's matrices (gate and up
    fused, 2048 x 1536, and down, 768 x 2048) are read once in BF16: 16 x 3 x 768 x 2048 x 2 bytes."""
    sv = _sv(8, 1, 8)
    m = sv.m
    assert sv.load == load_factor(m.router_balance, m.router_aux_coeff, 0.0, 8) == pytest.approx(1.54)
    touched = 16 * (1 - (1 - 8 / 128) ** 512)
    assert touched == pytest.approx(16 * expected_experts_touched(128, 8, 512) / 128)
    per = 512 * 1.54 / touched
    dense = sv.mixed_layer(False, 64, 1152, 0, 0, 0)
    moe = sv.mixed_layer(True, 64, 1152, 0, 0, 0)
    # the weights: the MoE layer's routed experts against the dense layer's FFN (the attention
    # matrices are the same), and the router's 16-bit matrix
    expert_bytes = touched * 3 * 768 * 2048 * 2
    dense_ffn = 3 * m.ffn_hidden * m.hidden * 2 if m.ffn_hidden else 0.0
    router = 128 * 2048 * 2
    assert (moe.weights - dense.weights) * sv.hbm == pytest.approx(expert_bytes + router - dense_ffn, rel=1e-9)
    # the expert GEMM: the soft roofline of its compute and memory terms, by hand
    hbm = sv.hbm
    want = 0.0
    for n, k in ((2 * 768, 2048), (2048, 768)):     # gate and up fused, then down
        comp = 2 * per * touched * n * k / (sv.gpu.peak("bf16") * _eff(sv, per * touched, n, k)) \
            / grouped_gemm_compute_factor(k)
        mem = (touched * n * k * 2 + per * touched * (n + k) * 2) / hbm
        want += soft_roofline(comp, mem)
    got = _expert_gemm_s(sv, per, touched)
    assert got == pytest.approx(want, rel=1e-9)
    # decode at this batch is memory-bound: the weights dominate the expert GEMMs
    assert touched * 3 * 768 * 2048 * 2 / hbm > 0.6 * got


def _eff(sv: _Serving, m: float, n: float, k: float) -> float:
    from costmodel.compute import matmul_efficiency
    return matmul_efficiency(sv.gpu, sv.c, m, n, k)


def _expert_gemm_s(sv: _Serving, per: float, touched: float) -> float:
    from costmodel.inference import _Pass
    out = _Pass()
    for mx in (x for x in _matrices(sv) if x.role == "expert"):
        sv._expert_gemm(per, mx.n, mx.k, touched, touched * mx.n * mx.k * sv.wb, out)
    return out.gemm


def _matrices(sv: _Serving):
    from costmodel.layers import layer_matrices
    return layer_matrices(sv.m, True, sv.par.tp, sv.par.ep, sv.etp)


def test_gather_dispatch_by_hand_and_in_the_layer():
    """The engines' default exchange: tp2 ep8 on 8 GPUs is 4 replicas of tp2; the 4 ranks holding
    different tokens (stride 2, one NVLink domain) all-gather 4 x 64 x 2048 x 2 bytes and
    reduce-scatter it back, each collective with its launch cost. It does not depend on top_k (every
    rank receives every token), and it is 0 where the EP group is one replica (ep = tp)."""
    sv = _sv(8, 2, 4)
    net = Network(sv.c)
    lay = layout_for(4, 2, 8)
    gathered = 4 * 64 * 2048 * 2.0
    by_hand = launched(net.all_gather(gathered, lay)) + launched(net.reduce_scatter(gathered, lay))
    assert sum(launched(c) for c in gather_dispatch_s(64 * 2048 * 2.0, lay, net)) == pytest.approx(by_hand)
    assert sv.mixed_layer(True, 64, 1152, 0, 0, 0).ep == pytest.approx(by_hand)
    k2 = dataclasses.replace(sv.m, top_k=2)
    sv2 = _Serving(k2, sv.c, sv.w, sv.par)
    assert sv2.mixed_layer(True, 64, 1152, 0, 0, 0).ep == pytest.approx(by_hand)
    assert _sv(2, 2, 4).mixed_layer(True, 64, 1152, 0, 0, 0).ep == 0.0
    # more replicas in the group: more bytes gathered per rank
    assert _sv(8, 1, 8).mixed_layer(True, 64, 1152, 0, 0, 0).ep > by_hand


def test_moe_serving_validation_rows_meet_the_moe_bar():
    """The MoE serving validation (calibration/published_inference.yaml ``moe_cases``: TensorRT-LLM
    0.9's Mixtral-8x7B on two A100s, TP2, FP16): every recorded figure is predicted, and their median
    absolute error is within the issue-24 bar for MoE (15%). No constant was fitted to them."""
    import statistics

    import yaml

    from planner.cli.validation_inference import CALIBRATION, moe_rows
    rows = moe_rows()
    cases = yaml.safe_load(CALIBRATION.read_text())["moe_cases"]
    assert {r.case.split(" (")[0] for r in rows} == {c["name"] for c in cases}
    assert all(r.split == "moe" for r in rows)
    assert statistics.median(abs(r.error) for r in rows) <= 0.15, [(r.case, r.metric, r.error) for r in rows]


def test_excluded_mixtral_figure_is_above_the_weight_read_bound():
    """The one Mixtral figure of the same table not validated (2048/2048 at batch 32, 801 output tokens/s
    per GPU) is above what the stated setup can reach: at batch 32 every expert is touched, so each decode
    step reads each GPU's half of the FP16 weights at no more than the A100's HBM peak."""
    m = get_model("mixtral-8x7b")
    gpu = load_cluster("dgx-a100-80gb").gpu
    touched = expected_experts_touched(m.num_experts, m.top_k, 32)
    assert touched > m.num_experts - 0.01                   # all 8 experts at 64 routed copies
    per_gpu_bytes = m.total_params() * 2 / 2                 # FP16, TP2
    step_floor = per_gpu_bytes / gpu.hbm_bandwidth_bytes_per_s
    bound = 32 / step_floor / 2
    assert 690 < bound < 705 and 801 > bound * 1.1
