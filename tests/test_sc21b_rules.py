"""Rules of stop 23's sc21b session (issue 23, the SC'21 free choice): FP16's dynamic loss scaling
per step (``memory.loss_scaling_bytes_per_param``, ``scale.step_reductions_s``), each against a hand
count from Megatron-LM's ``MixedPrecisionOptimizer.prepare_grads``; the data-parallel bucket at each
end of the step that no compute of the stage hides (``stage_terms.exposed_dp_time``)."""
from __future__ import annotations

import pytest

from costmodel.catalog import get_model
from costmodel.comm import COLLECTIVE_LAUNCH_S, GroupLayout, Network
from costmodel.compute import MEMORY_BOUND_FRACTION
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS
from costmodel.memory import loss_scaling_bytes_per_param, optimizer_traffic_bytes_per_param
from costmodel.scale import step_reductions_s
from costmodel.specs import ParallelConfig, Workload
from costmodel.stage_cache import stage_model
from costmodel.stage_terms import StageCost, exposed_dp_time, megatron_stage_buckets
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
    flag = net.latency_s(world, 2, small=True) + COLLECTIVE_LAUNCH_S      # a small all-reduce's
    assert step_reductions_s(net, world, dp, True) - plain == pytest.approx(flag)
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


# -- the data-parallel buckets at the step's two ends ---------------------------------------------


def _cost(**kw):
    fields = dict.fromkeys(StageCost._fields, 0.0)
    fields.update(kw)
    return StageCost(**fields)


def test_exposed_ends_by_hand():
    """The last gradient bucket runs after the backward and the first weight bucket before the
    forward: stage 0 pays both whole, the rest of the traffic as before (``overlapped``: the
    slowdown's share where it fits under the compute); a later stage hides them under the earlier
    stages' draining backward / its first forwards' wait."""
    s = 0.18
    c = _cost(compute_s=0.9, dp_grad_s=0.2, dp_grad_tail_s=0.02, dp_gather_s=0.1, dp_gather_head_s=0.01)
    assert exposed_dp_time(c, 0, True, True, s) == pytest.approx(0.02 + s * 0.18 + 0.01 + s * 0.09)
    # index 1: the tail under one backward (0.6), the head under one forward (0.3): their slowdown only
    assert exposed_dp_time(c, 1, True, True, s) == pytest.approx(s * 0.02 + s * 0.18 + s * 0.01 + s * 0.09)
    # without overlap every byte is exposed, as before
    assert exposed_dp_time(c, 0, False, False, s) == pytest.approx(0.3)
    # no buckets at the ends (zero tail and head): the old rule
    c0 = _cost(compute_s=0.9, dp_grad_s=0.2, dp_gather_s=0.1)
    assert exposed_dp_time(c0, 0, True, True, s) == pytest.approx(s * 0.2 + s * 0.1)


def test_zero2_zero3_ends_by_hand():
    """ZeRO-2/3 price their collectives per micro-batch at the overlapped rate (``fsdp_comm_s``);
    the step's two ends wait whole: stage 0 adds ``(1 - slowdown)`` of each end's bucket, a stage
    whose ends fit under earlier stages' passes adds nothing."""
    s = 0.18
    c = _cost(compute_s=0.9, fsdp_tail_s=0.02, fsdp_head_s=0.01)
    assert exposed_dp_time(c, 0, True, True, s) == pytest.approx((1 - s) * 0.03)
    assert exposed_dp_time(c, 1, True, True, s) == pytest.approx(0.0, abs=1e-15)
    # an end longer than the window it may hide under: the excess waits, the rest as overlapped
    c2 = _cost(compute_s=0.03, fsdp_tail_s=0.05)
    assert exposed_dp_time(c2, 1, True, True, s) == pytest.approx((0.05 - 0.02 + s * 0.02) - s * 0.05)


def _gpt13_stage(gpus: int, zero: int, framework: str):
    """GPT-3 1.3B in fp16 on ``gpus`` A100 80GB, pure data parallel (micro-batch 4, no accumulation):
    the model and its one stage's ``StageModel`` under ``framework``."""
    model = get_model("gpt3-1.3b")
    cl = load_cluster("dgx-a100-80gb").with_gpus(gpus)
    wl = Workload(global_batch=4 * gpus, seq_len=2048, dtype="fp16")
    par = ParallelConfig(dp=gpus, zero=zero, micro_batch=4, grad_accum=1, recompute="none")
    return model, stage_model(model, cl, wl, par, ("pp", "dp", "cp", "tp"), cl.groups[0].name, True, True, False,
                              FRAMEWORKS[framework])


def test_zero3_ends_are_one_layer_each():
    """ZeRO-3 on 64 A100 (fp16, gpt3-1.3b): the ends are the stage's per-micro-batch gathers and
    scatters divided by its layers (one collective each), and the step pays them whole."""
    model, sm = _gpt13_stage(64, 3, "torchtitan")
    c = sm.cost(model.layers, 0, 0)
    assert c.fsdp_tail_s > 0 and c.fsdp_head_s > 0
    assert c.dp_grad_tail_s == c.dp_gather_head_s == 0.0
    assert sm.dp_exposed(c, 0) >= (1 - sm.slowdown) * (c.fsdp_tail_s + c.fsdp_head_s) - 1e-15


def test_megatron_zero1_ends_are_one_bucket_each():
    """GPT-3 1.3B with ZeRO-1 on 128 A100 under Megatron (fp16): the exposed ends are one
    bucket's reduce-scatter and one bucket's all-gather, the stage's collectives divided by its
    bucket count (``megatron_stage_buckets``), and the estimate's exposed DP time pays them whole."""
    model, sm = _gpt13_stage(128, 1, "megatron")
    c = sm.cost(model.layers, 0, 0)
    numels, size = sm.megatron_buckets
    ends, emb = sm._ends_tensors()
    calls = megatron_stage_buckets(numels, model.layers, ends, emb, size, True, 1)
    assert calls > 1
    assert c.dp_grad_tail_s == pytest.approx(c.dp_grad_s / calls, rel=1e-12)
    assert c.dp_gather_head_s == pytest.approx(c.dp_gather_s / calls, rel=1e-12)
    assert sm.dp_exposed(c, 0) >= c.dp_grad_tail_s + c.dp_gather_head_s
