"""Megatron-Core's NaN/Inf checks, priced as the file Megatron runs (stop 53): with
``--check-for-nan-in-loss-and-grad`` on (Megatron's default, which the emitter keeps) every gradient
bucket's norm is read and validated twice on the host before its reduction, and the last stage
validates each micro-batch's loss twice (``costmodel.stage_terms.nan_check_s``). Counted here by
hand from Llama 3.1 8B's tensors and the step's micro-batches, not taken from the model."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.compute import memory_bound_factor
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS
from costmodel.moe import HOST_SYNC_S
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate
from planner.cli import validation

H, F, KV, V = 4096, 14336, 8 * 128, 128256


def test_checks_cost_their_syncs_and_one_read_of_the_gradients():
    model = get_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    m = 8                                   # micro-batches a step
    par = ParallelConfig(dp=8, zero=1, micro_batch=1, grad_accum=m, recompute="none")
    wl = Workload(global_batch=8 * m, seq_len=8192)
    on = FRAMEWORKS["megatron"]
    assert on.nan_checks
    off = dataclasses.replace(on, nan_checks=False)
    t_on = estimate(model, cluster, wl, par, framework=on).step_time_s
    t_off = estimate(model, cluster, wl, par, framework=off).step_time_s
    # the stage's tensors in Megatron's buffer order: head, final norm, 32 layers (backprop order), embedding
    layer = [F * H, H * 2 * F, H, H * H, H * (H + 2 * KV), H]
    tensors = [V * H, H] + layer * 32 + [V * H]
    size = max(40_000_000, 1_000_000 * 8)   # Megatron-Core's default bucket at dp 8
    buckets, cur = 0, 0.0
    for t in tensors:                       # a bucket closes once it holds >= size parameters
        cur += t
        if cur >= size:
            buckets, cur = buckets + 1, 0.0
    buckets += cur > 0
    grads = sum(tensors) * 4                # fp32 main gradients
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor("fused", backward=False)
    want = m * 2 * HOST_SYNC_S + buckets * 2 * HOST_SYNC_S + grads / hbm
    assert t_on - t_off == pytest.approx(want, rel=1e-6)
    assert 0.001 < want / t_off < 0.01     # 14 ms of a 6.5 s step: small, not nothing


def test_full_iteration_graphs_turn_the_checks_off():
    # Megatron-LM refuses its NaN checks with full-iteration CUDA graphs; per-layer graphs keep them
    assert validation.ran_full_iteration_graphs({"cuda_graphs": "full iteration (FULL_CUDA_GRAPH=1)"})
    assert validation.ran_full_iteration_graphs({"cuda_graphs": "cuda_graph_impl local, cuda_graph_scope full_iteration"})
    assert not validation.ran_full_iteration_graphs({"cuda_graphs": "per layer (FULL_CUDA_GRAPH=0, MCORE_CUDA_GRAPH=1)"})
    assert not validation.ran_full_iteration_graphs({"cuda_graphs": "none"})
    graphed = [c for c, _ in validation.all_cases() if validation.ran_full_iteration_graphs(c.get("execution"))]
    assert graphed
    for c in graphed:
        assert not validation.case_inputs(c)[4].nan_checks, c["name"]
