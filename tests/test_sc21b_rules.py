"""Rules of stop 23's sc21b session (issue 23, the SC'21 free choice): FP16's dynamic loss scaling
per step (``memory.loss_scaling_bytes_per_param``, ``scale.step_reductions_s``), each against a hand
count from Megatron-LM's ``MixedPrecisionOptimizer.prepare_grads``."""
from __future__ import annotations

import pytest

from costmodel.catalog import get_model
from costmodel.comm import COLLECTIVE_LAUNCH_S, GroupLayout, Network
from costmodel.compute import MEMORY_BOUND_FRACTION
from costmodel.files.clusters import load_cluster
from costmodel.memory import loss_scaling_bytes_per_param, optimizer_traffic_bytes_per_param
from costmodel.scale import step_reductions_s
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate


def test_loss_scaling_bytes_by_hand():
    # .float() of the FP16 gradient: read 2, write 4; the foreach unscale and check: read and
    # write 4; Adam and the gradient norm read the 4-byte FP32 main grad, 2 more each
    assert loss_scaling_bytes_per_param("fp16") == (2 + 4) + (4 + 4) + 2 + 2 == 18
    for dt in ("bf16", "fp8", "fp32"):
        assert loss_scaling_bytes_per_param(dt) == 0.0
    # Adam over FP16 gradients: 2 x 12 state, 2 gradient, 2 weight, and the scaler's 18
    assert optimizer_traffic_bytes_per_param("fp16") == 2 * 12 + 2 + 2 + 18
    assert optimizer_traffic_bytes_per_param("bf16") == 30


def test_found_inf_all_reduce_by_hand():
    net = Network(load_cluster("dgx-a100-80gb"))
    world, dp = GroupLayout(256, 8), GroupLayout(32, 1)
    plain = step_reductions_s(net, world, dp)
    assert step_reductions_s(net, world, dp, True) - plain == pytest.approx(net.latency_s(world, 2) + COLLECTIVE_LAUNCH_S)
    one = GroupLayout(1, 1)
    assert step_reductions_s(net, one, one, True) == 0.0


def test_one_gpu_fp16_optimizer_by_hand():
    """gpt3-1.3b on one A100 in FP16 (no communication): the optimizer term moves 28 bytes per
    parameter for Adam, 18 for the loss scaler and 2 for the gradient norm's read of the FP16
    gradient (``scale.GRAD_NORM_READS``), at the fused kernels' forward fraction of HBM bandwidth;
    one GPU makes no reduction."""
    model = get_model("gpt3-1.3b")
    cluster = load_cluster("dgx-a100-80gb").with_gpus(1)
    par = ParallelConfig(micro_batch=1, grad_accum=2, recompute="full")
    est = estimate(model, cluster, Workload(global_batch=2, seq_len=2048, dtype="fp16"), par)
    n = model.total_params()
    frac = MEMORY_BOUND_FRACTION["fused"][0]
    want = (28 + 18 + 2) * n / (cluster.gpu.hbm_bandwidth_bytes_per_s * frac)
    assert est.time["optimizer_s"] == pytest.approx(want, rel=1e-12)
    bf16 = estimate(model, cluster, Workload(global_batch=2, seq_len=2048, dtype="bf16"), par)
    assert bf16.time["optimizer_s"] == pytest.approx((30 + 4) * n / (cluster.gpu.hbm_bandwidth_bytes_per_s * frac),
                                                     rel=1e-12)
