"""FSDP2's copies on the compute stream (``costmodel.fsdp``, issue 23): the bytes per parameter by
hand, the estimate's added time against the hand count, where the rule applies and where not."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.compute import memory_bound_factor
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS
from costmodel.fsdp import FSDP2_GATHERS_PER_MICROBATCH, fsdp2_copy_bytes
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate
from planner.cli import validation


def test_copy_bytes_by_hand():
    # bf16 gathers, bf16 gradients reduced in fp32 (torchtitan's and OLMo-core's reduce_dtype):
    # two copy-outs of 2 + 2 bytes, the copy-in reads 2 and writes 4
    assert FSDP2_GATHERS_PER_MICROBATCH == 2
    assert fsdp2_copy_bytes(1.0, 2, 2, 4) == 2 * (2 + 2) + 2 + 4 == 14
    # bf16 reduction: 12; float8 all-gather (1 byte gathered), bf16 gradients, fp32 reduction: 10
    assert fsdp2_copy_bytes(1.0, 2, 2, 2) == 12
    assert fsdp2_copy_bytes(1.0, 1, 2, 4) == 10
    assert fsdp2_copy_bytes(13e9, 2, 2, 4) == pytest.approx(13e9 * 14)
    # ZeRO-2-like: one gather per micro-batch
    assert fsdp2_copy_bytes(1.0, 2, 2, 4, gathers=1) == 10
    assert fsdp2_copy_bytes(0.0, 2, 2, 4) == 0.0


def _run(fsdp2: bool, zero: int = 3, dp_shard: int = 0):
    model = get_model("llama-2-13b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(dp=8, zero=zero, dp_shard=dp_shard, micro_batch=1, grad_accum=8)
    fw = dataclasses.replace(FRAMEWORKS["generic"], fsdp2_copies=fsdp2)
    return model, cluster, estimate(model, cluster, wl, par, framework=fw)


def test_estimate_adds_the_copies_per_micro_batch():
    """One stage holding the whole model on 8 GPUs (FSDP over the node): the step grows by
    micro-batches x parameters x 14 bytes at the generic profile's forward memory-bound fraction."""
    model, cluster, on = _run(True)
    _, _, off = _run(False)
    gpu = cluster.groups[0].gpu
    per_mb = fsdp2_copy_bytes(model.total_params(), 2, 2, 4) / (
        gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor(FRAMEWORKS["generic"].elementwise, backward=False))
    assert on.step_time_s - off.step_time_s == pytest.approx(8 * per_mb, rel=1e-6)
    assert on.time["dp_comm_s"] - off.time["dp_comm_s"] == pytest.approx(8 * per_mb, rel=1e-6)
    # 13B at 14 bytes is 184 GB, about 73 ms per micro-batch at 0.75 x 3.35 TB/s
    assert 0.06 < per_mb < 0.09


def test_not_priced_without_sharding_or_below_zero3():
    _, _, a = _run(True, zero=1)
    _, _, b = _run(False, zero=1)
    assert a.step_time_s == b.step_time_s
    # a shard group of one GPU gathers nothing
    model = get_model("llama-2-7b")
    cluster = load_cluster("dgx-h100").with_gpus(1)
    wl = Workload(global_batch=4, seq_len=4096)
    par = ParallelConfig(dp=1, zero=3, micro_batch=1, grad_accum=4)
    on = estimate(model, cluster, wl, par, framework=dataclasses.replace(FRAMEWORKS["generic"], fsdp2_copies=True))
    off = estimate(model, cluster, wl, par, framework=FRAMEWORKS["generic"])
    assert on.step_time_s == off.step_time_s


def test_profiles():
    # the FSDP2 stacks: torchtitan, this project's runtime, Accelerate's fsdp_version 2
    assert FRAMEWORKS["torchtitan"].fsdp2_copies and FRAMEWORKS["builtin"].fsdp2_copies
    assert FRAMEWORKS["accelerate"].fsdp2_copies
    for name in ("generic", "megatron", "deepspeed", "megatron-deepspeed"):
        assert not FRAMEWORKS[name].fsdp2_copies


def test_records_name_their_fsdp():
    """OLMo-core's records (FSDP2 fully_shard) take the copies, IBM's fms-fsdp (FSDP1) does not."""
    seen = {"olmo": 0, "ibm": 0}
    for case, _ in validation.all_cases():
        name = case["name"]
        if not name.startswith(("olmo-core-", "ibm-fsdp-")):
            continue
        prof = validation.case_inputs(case)[4]
        if name.startswith("olmo-core-"):
            seen["olmo"] += 1
            assert prof.fsdp2_copies, name
        else:
            seen["ibm"] += 1
            assert not prof.fsdp2_copies, name
    assert seen["olmo"] == 8 and seen["ibm"] == 20
    assert validation.ran_fsdp2("OLMo-core (PyTorch FSDP2 fully_shard)")
    assert not validation.ran_fsdp2("fms-fsdp (PyTorch FSDP1, 2.3)")


def test_zero2_gathers_once_per_micro_batch():
    """FSDP2's ZeRO-2 (no resharding after forward, resharding after backward): one copy-out and the
    copy-in per micro-batch, 10 bytes per parameter."""
    model, cluster, on = _run(True, zero=2)
    _, _, off = _run(False, zero=2)
    gpu = cluster.groups[0].gpu
    per_mb = fsdp2_copy_bytes(model.total_params(), 2, 2, 4, gathers=1) / (
        gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor(FRAMEWORKS["generic"].elementwise, backward=False))
    assert on.step_time_s - off.step_time_s == pytest.approx(8 * per_mb, rel=1e-6)
