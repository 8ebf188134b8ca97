"""Data-parallel and FSDP collectives carry the collective launch cost (``comm.launched``, one
owner), as TP/EP/CP and the pipeline sends do: one launch per gradient bucket for DDP and
ZeRO-1/2, one per layer for ZeRO-3's gathers and scatters, none on a group of one GPU."""
from __future__ import annotations

import math

import costmodel.stage_terms as stage_terms
from costmodel.comm import COLLECTIVE_LAUNCH_S
from costmodel.files.clusters import load_cluster
from costmodel.catalog import get_model
from costmodel.specs import ParallelConfig, Workload
from costmodel.stage_cache import stage_model
from costmodel.stage_terms import DP_BUCKET_BYTES, dp_bucket_bytes
from costmodel.memory import DDP_BUCKET_BYTES

WL = Workload(global_batch=64, seq_len=4096)


def _stage(model_name: str, gpus: int, **par):
    model = get_model(model_name)
    cluster = load_cluster("dgx-h100").with_gpus(gpus)
    p = ParallelConfig(**par)
    sm = stage_model(model, cluster, WL, p, ("tp", "cp", "ep", "dp", "pp"), cluster.groups[0].name,
                     True, True, False)
    return model, sm


def test_the_bucket_is_torch_ddps():
    assert DP_BUCKET_BYTES == DDP_BUCKET_BYTES / 2 == 25 * 2**20


def test_ddp_all_reduce_pays_one_launch_per_bucket():
    model, sm = _stage("llama-3-8b", 8, dp=8, zero=0, grad_accum=8)
    n = model.layers
    c = sm.cost(n, 0, 0)
    nbytes = (n * sm.mesh.dense_layer_params + sm.ends_params) * sm.sh.g_b
    # the profile's bucket (stage_terms.dp_bucket_bytes: generic's grows with the data-parallel group)
    calls = math.ceil(nbytes / dp_bucket_bytes(sm.sh.framework.dp_bucket, 8, sm.sh.g_b))
    assert calls > 100 or sm.sh.framework.dp_bucket != "torch"   # torch's 25 MiB: hundreds of buckets
    assert calls > 1
    # each bucket one all-reduce: its launch and its fixed time (the collective counts the latter once)
    assert sm.mesh.dp_latency_s > 0
    assert math.isclose(c.dp_grad_s, sm.mesh.all_reduce_dp(nbytes) + (calls - 1) * sm.mesh.dp_latency_s
                        + calls * COLLECTIVE_LAUNCH_S, rel_tol=1e-12)


def test_zero1_scatter_and_gather_each_pay_per_bucket():
    model, sm = _stage("llama-3-8b", 8, dp=8, zero=1, grad_accum=8)
    n = model.layers
    c = sm.cost(n, 0, 0)
    params = n * sm.mesh.dense_layer_params + sm.ends_params
    g, w = params * sm.sh.g_b, params * sm.sh.gather_b
    lat = sm.mesh.shard_latency_s
    kind = sm.sh.framework.dp_bucket
    cg, cw = math.ceil(g / dp_bucket_bytes(kind, 8, sm.sh.g_b)), math.ceil(w / dp_bucket_bytes(kind, 8, sm.sh.gather_b))
    assert math.isclose(c.dp_grad_s, sm.mesh.all_gather_shard(g) + (cg - 1) * lat + cg * COLLECTIVE_LAUNCH_S,
                        rel_tol=1e-12)
    assert math.isclose(c.dp_gather_s, sm.mesh.all_gather_shard(w) + (cw - 1) * lat + cw * COLLECTIVE_LAUNCH_S,
                        rel_tol=1e-12)


def test_zero3_launches_one_collective_per_layer(monkeypatch):
    """FSDP gathers and reduce-scatters each layer on its own: a 6-layer stage launches 6
    gathers and 6 reduce-scatters (the backward re-gather is priced as the forward's again)."""
    _, sm = _stage("llama-3-8b", 8, dp=8, zero=3, grad_accum=8)
    counts = []

    def counting(each_s, count=1):
        counts.append(count)
        return count * (each_s + COLLECTIVE_LAUNCH_S)
    monkeypatch.setattr(stage_terms, "launched", counting)
    with_launch = sm.cost(6, 0, 0).fsdp_comm_s
    assert counts == [6, 6]
    monkeypatch.setattr(stage_terms, "launched", lambda each_s, count=1: count * each_s)
    assert with_launch > sm.cost(6, 0, 0).fsdp_comm_s


def test_a_group_of_one_gpu_makes_no_call(monkeypatch):
    counts = []
    monkeypatch.setattr(stage_terms, "launched", lambda each_s, count=1: counts.append(count) or 0.0)
    for zero in (1, 3):
        _, sm = _stage("llama-3-8b", 1, dp=1, zero=zero, grad_accum=64)
        c = sm.cost(32, 0, 0)
        assert c.dp_grad_s == c.dp_gather_s == c.fsdp_comm_s == 0.0
    assert counts == []
