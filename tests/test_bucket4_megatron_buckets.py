"""Megatron-Core's data-parallel buckets as the runs set them (issue 23, bucket4): how
``bucket_size`` forms buckets (``stage_terms.megatron_bucket_count``, at tensor boundaries), which
stages bucket at all (``megatron_stage_buckets``), and a record's ``profile: {dp_bucket_params: N}``
reaching the estimate. Hand counts from Llama 3.1 8B's shapes (hidden 4096, FFN 14336, 8 KV heads
of 128, vocabulary 128256, untied head), each tensor written out here, not taken from the model."""
from __future__ import annotations

import dataclasses
import math

import pytest

from costmodel.catalog import get_model
from costmodel.comm import COLLECTIVE_LAUNCH_S
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS
from costmodel.specs import ParallelConfig, SpecError, Workload
from costmodel.stage_cache import stage_model
from costmodel.stage_terms import (megatron_bucket_count, megatron_bucket_size, megatron_layer_numels,
                                   megatron_stage_buckets)

H, F, KV, V = 4096, 14336, 8 * 128, 128256


def _layer_by_hand(tp: int) -> list[float]:
    """One Llama 3.1 8B layer's tensors on one GPU, backprop order: fc2, fc1 (gate and up), the
    pre-MLP norm, the attention output, QKV, the input norm."""
    return [F * H / tp, H * 2 * F / tp, H, H * H / tp, H * (H + 2 * KV) / tp, H]


def _greedy(tensors, size):
    """The slow obvious loop: a bucket closes once it holds >= size parameters."""
    buckets, cur = [], 0.0
    for t in tensors:
        cur += t
        if size is not None and cur >= size:
            buckets.append(cur)
            cur = 0.0
    if cur:
        buckets.append(cur)
    return buckets


def test_layer_tensors_match_the_hand_list():
    m = get_model("llama-3.1-8b")
    for tp in (1, 2, 8):
        assert megatron_layer_numels(m, tp) == pytest.approx(tuple(_layer_by_hand(tp)))


def test_bucket_counts_by_hand():
    layer = tuple(_layer_by_hand(2))
    stage = layer * 32
    # Cisco's 64 and the 405B runs' 200: below every tensor, one bucket per tensor
    assert megatron_bucket_count(stage, 64) == megatron_bucket_count(stage, 200) == 32 * 6
    # a whole TP2 stage with its head, final norm and embedding: 195 buckets at 64
    assert megatron_stage_buckets(layer, 32, (V * H / 2, H), V * H / 2, 64, True) == 32 * 6 + 3
    # 40M at TP2, by hand: fc2 + fc1 (88.1M) close the first; then each layer boundary gives
    # "norm + proj + QKV + norm (21.0M) + next fc2 (29.4M)" and "fc1 (58.7M)"; the last tail is left
    assert megatron_bucket_count(stage, 40_000_000) == 1 + 31 * 2 + 1
    # no bucket size (no overlapped reduction, or a later pipeline stage): one bucket
    assert megatron_bucket_count(stage, None) == 1
    # the v5.1 8B runs' 768M at TP2 (head 262.7M + norm, 32 x 109.1M, embedding 262.7M)
    tensors = (V * H / 2, H) + stage + (V * H / 2,)
    assert megatron_bucket_count(tensors, 768_000_000) == len(_greedy(tensors, 768_000_000)) == 5
    for size in (64, 200, 1e6, 40e6, 256e6, 768e6, 5e9):
        assert megatron_bucket_count(tensors, size) == len(_greedy(tensors, size))


def test_default_size_and_stages():
    assert megatron_bucket_size(0, 8) == 40_000_000
    assert megatron_bucket_size(0, 512) == 512_000_000
    assert megatron_bucket_size(64, 512) == 64
    layer = tuple(_layer_by_hand(8))
    # after the first stage: one bucket per model chunk
    assert megatron_stage_buckets(layer, 16, (), 0.0, 64, False, 1) == 1
    assert megatron_stage_buckets(layer, 16, (), 0.0, 64, False, 4) == 4
    # first stage, 4 virtual chunks of 4 layers: the first chunk per tensor (24 + embedding), 3 more
    assert megatron_stage_buckets(layer, 16, (), V * H / 8, 64, True, 4) == 4 * 6 + 1 + 3


def _sm(pp_first: bool, framework, pp: int = 1, vpp: int = 1):
    model = get_model("llama-3.1-8b")
    cl = load_cluster("dgx-h100").with_gpus(64 * pp)
    wl = Workload(global_batch=512, seq_len=8192)
    par = ParallelConfig(tp=2, dp=32, pp=pp, vpp=vpp, zero=1, micro_batch=1, grad_accum=16)
    return model, stage_model(model, cl, wl, par, ("tp", "cp", "dp", "pp"), cl.groups[0].name, pp_first,
                              pp == 1, False, framework)


def test_record_bucket_reaches_the_reduce_scatter():
    """A run's bucket_size of 64 makes the TP2 stage's reduce-scatter 195 calls, each its launch and
    ring latency (the slow sum over the greedy buckets), against the default's few."""
    fw = dataclasses.replace(FRAMEWORKS["megatron"], dp_bucket_params=64)
    model, sm = _sm(True, fw)
    c = sm.cost(model.layers, 0, 0)
    tensors = (V * H / 2, H) + tuple(_layer_by_hand(2)) * 32 + (V * H / 2,)
    g_b = sm.sh.g_b
    slow = sum(sm.mesh.all_gather_shard(b * g_b) + COLLECTIVE_LAUNCH_S for b in _greedy(tensors, 64))
    lat = sm.mesh.shard_latency_s
    # all_gather_shard(x) is its fixed time plus bandwidth terms: the sum counts that time per bucket
    assert c.dp_grad_s == pytest.approx(slow, rel=1e-9)
    assert len(_greedy(tensors, 64)) == 195 and lat > 0
    _, dflt = _sm(True, FRAMEWORKS["megatron"])
    d = dflt.cost(model.layers, 0, 0)
    calls = len(_greedy(tensors, 40_000_000))
    slow_d = sum(dflt.mesh.all_gather_shard(b * g_b) + COLLECTIVE_LAUNCH_S for b in _greedy(tensors, 40_000_000))
    assert d.dp_grad_s == pytest.approx(slow_d, rel=1e-9) and calls < 195
    assert c.dp_grad_s - d.dp_grad_s == pytest.approx((195 - calls) * (lat + COLLECTIVE_LAUNCH_S), rel=1e-6)


def test_later_pipeline_stage_makes_one_bucket():
    fw = dataclasses.replace(FRAMEWORKS["megatron"], dp_bucket_params=64)
    model, later = _sm(False, fw, pp=2)
    c = later.cost(16, 0, 0)
    g = (16 * later.mesh.dense_layer_params + later.ends_params) * later.sh.g_b
    assert c.dp_grad_s == pytest.approx(later.mesh.all_gather_shard(g) + COLLECTIVE_LAUNCH_S, rel=1e-12)


def test_bad_bucket_is_refused():
    with pytest.raises(SpecError, match="dp_bucket_params"):
        dataclasses.replace(FRAMEWORKS["megatron"], dp_bucket_params=-1)
    with pytest.raises(SpecError, match="dp_bucket_params"):
        dataclasses.replace(FRAMEWORKS["deepspeed"], dp_bucket_params=64)
    assert math.isfinite(megatron_bucket_size(0, 1))


def test_default_bucket_counts_dp_without_cp():
    """Megatron-Core's default ``max(40M, 1M x dp)`` takes the data-parallel group without CP: at
    dp 64 x cp 4 the bucket is 64M parameters, not 256M (DistributedDataParallel.__init__)."""
    model = get_model("llama-3.1-8b")
    cl = load_cluster("dgx-h100").with_gpus(256)
    wl = Workload(global_batch=64, seq_len=8192)
    par = ParallelConfig(dp=64, cp=4, zero=1, micro_batch=1, grad_accum=1)
    sm = stage_model(model, cl, wl, par, ("cp", "dp", "tp", "pp"), cl.groups[0].name, True, True, False,
                     FRAMEWORKS["megatron"])
    assert sm.megatron_buckets[1] == 64_000_000
    assert sm.grad_bucket_bytes == pytest.approx(64_000_000 * sm.sh.g_b)


def test_records_bucket_reaches_the_priced_step():
    """The v5.1 8B GB200 512-GPU record states its run's 768M bucket; the key survives case_inputs and the
    accepting target's override (validation._with_overrides), and fewer buckets price a shorter step
    than the same record at Megatron's default bucket; every MLPerf Llama 3.1 record states one and
    quotes its source."""
    import copy

    from planner.cli import validation
    cases = [c for c, _ in validation.all_cases()]
    llama = [c for c in cases if c["name"].startswith(("mlperf50-", "mlperf51-")) and "llama3.1" in c["name"]
             and c.get("num_gpus")]
    stated = [c for c in llama if (c.get("profile") or {}).get("dp_bucket_params")]
    assert len(stated) == 45          # 31 FP8 and BF16 runs, 14 NVFP4 runs (stop 51)
    for c in stated:
        assert any(str(a).startswith("data-parallel bucket (stop") for a in c.get("assumed", [])), c["name"]
    case = next(c for c in cases if c["name"] == "mlperf51-llama3.1-8b-gb200-512gpu-fp8")
    plain = copy.deepcopy(case)
    del plain["profile"]["dp_bucket_params"]
    prof = validation.case_inputs(case)[4]
    assert prof.dp_bucket_params == 768_000_000
    assert validation._with_overrides(prof, validation.FRAMEWORKS["megatron"]).dp_bucket_params == 768_000_000

    def step(c):
        rows = validation.case_rows(c, "test")
        assert rows, validation.REFUSED.get(c["name"])
        return next(r.predicted for r in rows if r.metric == "step time (s)")
    assert step(case) < step(plain)
