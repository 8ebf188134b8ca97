"""Rules of the dense refit (issue 23, session 20): what a validation case says it ran, where
Megatron's full TP overlap can run, and the prior of a framework whose only sources are left out."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel import fitted
from costmodel.frameworks import FRAMEWORKS, has_cuda_multicast, tp_overlap_of
from costmodel.training import estimate
from emitters import get
from emitters.megatron import tp_comm_overlap
from planner.cli import validation
from test_emit_support import make_plan


# -- async TP: read from the record's key, not from its text --------------------------------------

def test_async_tp_false_is_not_async_tp():
    assert validation.ran_async_tp({"fsdp": "FSDP2 8 x TP 8", "async_tp": True})
    assert not validation.ran_async_tp({"fsdp": "FSDP2 8 x TP 8", "async_tp": False})
    assert not validation.ran_async_tp({"fsdp": "FSDP2 1D", "compile": True})
    assert not validation.ran_async_tp("async_tp: false")
    assert validation.ran_async_tp("FSDP2 + async TP")
    assert not validation.ran_async_tp(None)


def test_every_case_on_file_gets_tp_overlap_only_if_it_ran_async_tp():
    """Each torchtitan case's profile overlaps TP exactly when its record says ``async_tp: true``
    (``"async" in str(execution)`` used to match ``async_tp: false`` too)."""
    seen = {True: 0, False: 0}
    for case, _split in validation.all_cases(include_holdout=True):
        ex = case.get("execution")
        if not isinstance(ex, dict) or "async_tp" not in ex or validation.framework_of(case) != "torchtitan":
            continue
        prof = validation.case_inputs(case)[4]
        assert prof.tp_comm_overlap is bool(ex["async_tp"]), case["name"]
        seen[bool(ex["async_tp"])] += 1
    assert seen[True] and seen[False]          # both kinds are on file


# -- Megatron's --tp-comm-overlap needs CUDA multicast (Hopper and later) --------------------------

@pytest.mark.parametrize("name, has", [("A100-SXM4-80GB", False), ("NVIDIA A100-SXM4-80GB", False),
                                       ("L40S-48GB", False), ("MI300X-192GB", False), ("cpu-process", False),
                                       ("H100-SXM5-80GB", True), ("NVIDIA H100 80GB HBM3", True), ("H20", True),
                                       ("H800-SXM5-80GB", True), ("GH200", True), ("B200-180GB", True),
                                       ("GB200-186GB", True)])
def test_cuda_multicast_by_gpu_name(name, has):
    assert has_cuda_multicast(name) is has


def _tp8_plan(cluster: str):
    return make_plan("gpt3-175b", gpus=64, gb=64, seq=2048, cluster=cluster, tp=8, sp=True, pp=8,
                     micro_batch=1, grad_accum=64).replace(target="megatron")


@pytest.mark.parametrize("cluster, mode", [("dgx-a100-80gb", "backward"), ("dgx-h100", "full")])
def test_megatron_full_tp_overlap_only_with_multicast(cluster, mode):
    """The rule, the emitter's flag and the price agree: on an A100 the flag is not written and
    the plan is priced with the backward-only overlap, slower than with full overlap."""
    plan = _tp8_plan(cluster)
    prof = FRAMEWORKS["megatron"]
    assert tp_overlap_of(prof, plan.parallel, plan.mesh_order, plan.cluster.nvlink_gpus,
                         plan.cluster.gpu.name) == mode
    assert tp_comm_overlap(plan) is (mode == "full")
    lines = "".join(get("megatron").emit(plan).values()).splitlines()
    flags = [x.split() for x in lines if not x.lstrip().startswith("#")]
    assert any("--tp-comm-overlap" in f for f in flags) is (mode == "full")
    args = (plan.model, plan.cluster, plan.workload, plan.parallel)
    priced = estimate(*args, stages=plan.stages, order=plan.mesh_order, framework=prof)
    unlimited = estimate(*args, stages=plan.stages, order=plan.mesh_order,
                         framework=dataclasses.replace(prof, tp_overlap_needs_multicast=False))
    if mode == "full":
        assert priced.step_time_s == unlimited.step_time_s
    else:
        assert priced.step_time_s > unlimited.step_time_s


# -- the pooled prior of a framework whose only sources are left out -------------------------------

def test_pooled_prior_is_the_median_of_the_other_fits():
    c = fitted.BY_NAME["framework.deepspeed.kernel_efficiency"]
    assert c.prior_rule == "pooled"
    others = {"framework.torchtitan.kernel_efficiency": 0.91, "framework.accelerate.kernel_efficiency": 0.83}
    assert fitted.pooled_prior(c, others) == pytest.approx(0.87)
    assert fitted.pooled_prior(c, {"framework.torchtitan.kernel_efficiency": 0.9}) == 0.9
    assert fitted.pooled_prior(c, {}) == c.prior                      # nothing to pool: the stated prior
    # its own value never enters its prior
    assert fitted.pooled_prior(c, dict(others, **{c.name: 0.5})) == pytest.approx(0.87)
    # not a pooled constant: the stated prior
    g = fitted.BY_NAME["gpu.A100.matmul_efficiency"]
    assert fitted.pooled_prior(g, others) == g.prior


# -- memory-bound kernels at their achieved fraction of HBM bandwidth -------------------------------

def test_memory_bound_factor_by_hand():
    from costmodel.compute import MEMORY_BOUND_FRACTION, memory_bound_factor
    f, b = MEMORY_BOUND_FRACTION["fused"]
    assert (f, b) == (0.75, 0.71)           # cudnn-frontend H200 RMSNorm midpoints (compute.py)
    assert memory_bound_factor("fused") == pytest.approx((1 / 0.75 + 2 / 0.71) / 3)
    assert memory_bound_factor("fused", backward=False) == pytest.approx(1 / 0.75)
    for kind in MEMORY_BOUND_FRACTION:
        assert memory_bound_factor(kind) > 1.0          # never the full HBM bandwidth


def test_elementwise_time_scales_with_the_fraction():
    """The same layer, priced once at each memory-bound kind: only its elementwise time moves, by
    the ratio of the factors."""
    from costmodel.catalog import get_model
    from costmodel.comm import group_layout
    from costmodel.compute import memory_bound_factor
    from costmodel.files.clusters import load_cluster
    from costmodel.layers import layer_cost
    from costmodel.specs import Workload
    model = get_model("llama-3-8b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    g = cluster.groups[0]
    lay = group_layout({"pp": 1, "dp": 8, "cp": 1, "tp": 1}, ("pp", "dp", "cp", "tp"), "tp", 8)
    wl = Workload(global_batch=8, seq_len=4096)
    args = (model, False, wl, 1, 1, 1, False, 1, g.gpu, cluster, g.intra_node, lay, lay, lay)
    fused = layer_cost(*args, elementwise="fused")
    eager = layer_cost(*args, elementwise="eager")
    assert eager.gemm_fwd_s == fused.gemm_fwd_s and eager.attn_fwd_s == fused.attn_fwd_s
    assert eager.elementwise_fwd_s / fused.elementwise_fwd_s == pytest.approx(
        memory_bound_factor("eager") / memory_bound_factor("fused"))


def test_materialized_score_traffic_by_hand():
    """Per score in 16-bit with dropout: softmax reads 2 and writes 2, dropout reads 2 and writes 2
    plus a 1-byte mask (9 forward); backward: softmax 3 x 2, dropout 2 + 1 + 2 (11)."""
    from costmodel.layers import score_traffic_bytes
    assert score_traffic_bytes(2, True, forward_only=True) == 9
    assert score_traffic_bytes(2, True) == pytest.approx((9 + 11) / 3)
    assert score_traffic_bytes(2, False) == pytest.approx((4 + 6) / 3)


# -- stragglers ---------------------------------------------------------------------------------------

def test_expected_max_against_the_table_and_a_simulation():
    import random
    import statistics

    from costmodel.scale import expected_max_z, straggler_factor
    assert expected_max_z(1) == 0.0
    assert expected_max_z(2) == pytest.approx(0.5642, abs=1e-3)      # 1 / sqrt(pi)
    assert expected_max_z(64) == pytest.approx(2.35) and expected_max_z(16384) == pytest.approx(3.98)
    rng = random.Random(7)
    sim = statistics.fmean(max(rng.gauss(0, 1) for _ in range(256)) for _ in range(2000))
    assert expected_max_z(256) == pytest.approx(sim, abs=0.06)          # 2.75 by simulation
    assert straggler_factor(1024) == pytest.approx(1 + 0.02 * 3.23)
    zs = [expected_max_z(n) for n in (2, 8, 100, 1000, 10_000, 100_000)]
    assert zs == sorted(zs)


def test_weak_scaling_loses_per_gpu_throughput_with_more_gpus():
    """The same per-GPU work (data parallel, one micro-batch each) on 64 and on 4096 GPUs: the
    larger job waits for a slower slowest rank."""
    from costmodel.catalog import get_model
    from costmodel.files.clusters import load_cluster
    from costmodel.scale import straggler_factor
    from costmodel.specs import ParallelConfig, Workload
    import dataclasses

    from costmodel.frameworks import FRAMEWORKS
    from costmodel.moe import HOST_SYNC_S
    from costmodel.stage_terms import NAN_CHECK_SYNCS
    model = get_model("llama-3-8b")
    out = {}
    for n in (64, 4096):
        cl = load_cluster("dgx-h100").with_gpus(n)
        est = estimate(model, cl, Workload(global_batch=n, seq_len=4096),
                       ParallelConfig(dp=n, zero=1, micro_batch=1, grad_accum=1), framework="megatron")
        out[n] = est
    # the compute a rank's jitter stretches; the loss's NaN checks (host syncs, stage_terms.nan_check_s) are fixed
    loss_checks = NAN_CHECK_SYNCS * HOST_SYNC_S
    assert (out[4096].time["compute_s"] - loss_checks) / (out[64].time["compute_s"] - loss_checks) == pytest.approx(
        straggler_factor(4096) / straggler_factor(64), rel=1e-9)
    bare = dataclasses.replace(FRAMEWORKS["megatron"], nan_checks=False)
    assert estimate(model, load_cluster("dgx-h100").with_gpus(64), Workload(global_batch=64, seq_len=4096),
                    ParallelConfig(dp=64, zero=1, micro_batch=1, grad_accum=1),
                    framework=bare).time["compute_s"] == pytest.approx(out[64].time["compute_s"] - loss_checks, rel=1e-12)
    assert out[4096].tokens_per_s_per_gpu < out[64].tokens_per_s_per_gpu


# -- serving keeps the curve it was validated on ----------------------------------------------------

def test_serving_prices_with_its_own_gemm_efficiency():
    from costmodel.files.clusters import load_cluster
    from costmodel.inference import serving_gpu
    for name in ("dgx-a100-80gb", "dgx-h100", "dgx-h200"):
        gpu = load_cluster(name).groups[0].gpu
        assert gpu.serving_matmul_efficiency and serving_gpu(gpu).matmul_efficiency == gpu.serving_matmul_efficiency
        assert serving_gpu(gpu).matmul_half_size == gpu.matmul_half_size
    plain = load_cluster("dgx-b200").groups[0].gpu
    assert not plain.serving_matmul_efficiency and serving_gpu(plain) is plain
