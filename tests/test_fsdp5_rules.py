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


def _run2(fsdp2: bool, accum: int):
    model = get_model("llama-2-13b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    wl = Workload(global_batch=8 * accum, seq_len=4096)
    par = ParallelConfig(dp=8, zero=2, micro_batch=1, grad_accum=accum)
    fw = dataclasses.replace(FRAMEWORKS["generic"], fsdp2_copies=fsdp2)
    return estimate(model, cluster, wl, par, framework=fw).step_time_s


def test_zero2_gathers_once_per_micro_batch():
    """FSDP2's ZeRO-2 (no resharding after forward, resharding after backward): one copy-out and the
    copy-in per micro-batch, 10 bytes per parameter, and the weights' all-gather before every
    micro-batch's forward (overlapped with it) instead of once per step. With one micro-batch the
    step grows by the copies alone; with m it grows by m copies and m - 1 more overlapped gathers."""
    model = get_model("llama-2-13b")
    gpu = load_cluster("dgx-h100").groups[0].gpu
    copies = fsdp2_copy_bytes(model.total_params(), 2, 2, 4, gathers=1) / (
        gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor(FRAMEWORKS["generic"].elementwise, backward=False))
    assert _run2(True, 1) - _run2(False, 1) == pytest.approx(copies, rel=1e-6)
    g4 = (_run2(True, 4) - _run2(False, 4) - 4 * copies) / 3
    g8 = (_run2(True, 8) - _run2(False, 8) - 8 * copies) / 7
    assert g8 > 0 and g4 == pytest.approx(g8, rel=1e-6)


# -- torchao's rowwise FP8 (costmodel.fp8.Fp8Recipe.axiswise_bytes) --------------------------------


def test_rowwise_bytes_by_hand():
    from costmodel.fp8 import resolve
    gpu = load_cluster("dgx-h100").groups[0].gpu
    row, ten = resolve("rowwise", "torchtitan", gpu), resolve("tensorwise", "torchtitan", gpu)
    m, n, k = 8192.0, 768.0, 4096.0
    # the second output-gradient cast (2 reads + 1 FP8 write = 5 bytes a value) and the rescale of the
    # two backward outputs (read and write BF16: 4 bytes a value)
    assert row.axiswise_bytes(m, n, k) == m * n * 5 + (m * k + n * k) * 4
    assert ten.axiswise_bytes(m, n, k) == 0.0
    assert row.cast_bytes(m, n, k) - ten.cast_bytes(m, n, k) == row.axiswise_bytes(m, n, k)



def test_torchao_float8_all_gather_casts_no_weight_by_hand():
    """torchao's float8 FSDP all-gather (pytorch/ao torchao/float8/fsdp_utils.py fsdp_pre_all_gather) casts
    each rank's shard before the gather, so a GEMM of m x k by k x n casts only its activations: the input
    forward, the output gradient and the saved input backward; without it the weight (n x k) is cast
    again at each use, forward and dgrad."""
    from costmodel.fp8 import resolve
    gpu = load_cluster("dgx-h100").groups[0].gpu
    plain, gathered = resolve("tensorwise", "torchtitan", gpu), resolve("tensorwise", "torchtitan", gpu, True)
    assert not plain.param_gather and gathered.param_gather
    assert not resolve("rowwise", "torchtitan", gpu, True).param_gather      # tensorwise only, as torchao
    m, n, k = 8192.0, 768.0, 4096.0
    assert gathered.gemm_cast_values(m, n, k) == (m * k, m * n + m * k)
    assert plain.gemm_cast_values(m, n, k) == (m * k + n * k, m * n + n * k + m * k)


def test_the_float8_all_gather_drops_weight_casts_only_where_fsdp_shards_the_weights():
    """The switch is the run's (``fp8_param_gather``), and it acts only on FSDP-sharded weights
    (``stage_cache.StageCache.layer_fp8``): under DDP (ZeRO-0) a Float8Linear casts its weight at every
    use whatever the config says, so the step is the one priced without the switch; under FSDP (ZeRO-3
    over 8 GPUs) the switch makes the step shorter."""
    m = get_model("llama-3.1-8b")
    c = load_cluster("dgx-h100").with_gpus(8)
    fw = dataclasses.replace(FRAMEWORKS["torchtitan"].with_switches(compile=True), attention="sdpa-torchtitan")

    def step(zero: int, gather: bool) -> float:
        par = ParallelConfig(dp=8, zero=zero, micro_batch=1, grad_accum=1, recompute="selective")
        wl = Workload(global_batch=8, seq_len=8192, dtype="fp8", fp8_recipe="tensorwise", fp8_param_gather=gather)
        return estimate(m, c, wl, par, framework=fw).step_time_s
    assert step(0, True) == step(0, False)
    assert step(3, True) < step(3, False)

def test_torchao_readme_rowwise_against_tensorwise():
    """pytorch/ao @6243040807 torchao/float8/README.md "Training benchmarks": Llama3-8b on 8 H100,
    torchtitan, batch 1, sequence 8192, torch.compile, FSDP2, per-op SAC: bf16 6150 tokens/s,
    tensorwise (float8 all-gather) 7689.5, rowwise (bf16 all-gather) 6768, so rowwise / tensorwise
    = 0.880. The rule's ratio is within 6% of it (0.885 since stop 39 prices the float8 all-gather's
    uncast weights, costmodel.fp8.Fp8Recipe.gemm_cast_values; 0.926 before; without the rule 0.981: the
    forward's CUTLASS rowwise kernel speed is not priced), and rowwise over BF16 within 3% of the published
    1.10."""
    m = get_model("llama-3.1-8b")
    c = load_cluster("dgx-h100").with_gpus(8)
    par = ParallelConfig(dp=8, zero=3, micro_batch=1, grad_accum=1, recompute="selective")
    fw = dataclasses.replace(FRAMEWORKS["torchtitan"].with_switches(compile=True), attention="sdpa-torchtitan")
    tps = {}
    for name, dt in (("bf16", "bf16"), ("tensorwise", "fp8"), ("rowwise", "fp8")):
        wl = Workload(global_batch=8, seq_len=8192, dtype=dt, fp8_recipe="" if dt == "bf16" else name,
                      fp8_param_gather=name == "tensorwise")      # the README's "tensorwise (float8 all-gather)"
        tps[name] = estimate(m, c, wl, par, framework=fw).tokens_per_s_per_gpu
    assert tps["rowwise"] / tps["tensorwise"] == pytest.approx(6768 / 7689.5, rel=0.06)
    assert tps["rowwise"] / tps["bf16"] == pytest.approx(6768 / 6150, rel=0.03)
    assert tps["rowwise"] < tps["tensorwise"]
