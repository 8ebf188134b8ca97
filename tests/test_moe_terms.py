"""MoE terms (``costmodel.moe``): permutation and router traffic by hand, the load factor, the
all-to-all overlap a framework may run, and the MoE validation rows."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel import moe
from costmodel.catalog import get_model
from costmodel.comm import GroupLayout
from costmodel.frameworks import FRAMEWORKS
from costmodel.layers import layer_cost
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate
from costmodel.files.clusters import load_cluster

ONE = GroupLayout(1, 1)


def test_permutation_and_router_traffic_by_hand():
    # 4096 tokens routed 8 ways, h 7168, BF16: permute reads T*h and writes T*k*h, unpermute the
    # reverse: 2 * (T*h + T*k*h) * 2 bytes; router softmax/top-k over T x 256 FP32 logits, read + write
    T, k, h, E = 4096, 8, 7168, 256
    assert moe.permute_bytes(T, k, h, 2) == 2 * (T * h + T * k * h) * 2
    assert moe.router_bytes(T, E) == 2 * T * E * 4
    assert moe.load_factor(1.3) == 1.3
    assert moe.load_factor(1.3, capacity_factor=1.1) == 1.1


def test_moe_layer_pays_the_permutation_traffic():
    m = get_model("mixtral-8x7b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=8, seq_len=4096)
    lc = layer_cost(m, True, wl, 1, 1, 1, False, 1, g.gpu, cl, g.intra_node, ONE, ONE, ONE)
    base = 2.0 * lc.act_bytes / g.gpu.hbm_bandwidth_bytes_per_s
    extra = (moe.permute_bytes(4096, m.top_k, m.hidden, 2) + moe.router_bytes(4096, m.num_experts)) \
        / g.gpu.hbm_bandwidth_bytes_per_s
    assert lc.elementwise_fwd_s == pytest.approx(base + extra)


def test_expert_all_to_all_overlap_hides_what_compute_covers():
    m = get_model("mixtral-8x7b")
    cl = load_cluster("dgx-h100").with_gpus(64)
    wl = Workload(global_batch=256, seq_len=4096)
    par = ParallelConfig(pp=4, dp=16, ep=8, vpp=8, schedule="interleaved", grad_accum=16)
    plain = FRAMEWORKS["megatron"]
    over = dataclasses.replace(plain, ep_comm_overlap=True)
    a = estimate(m, cl, wl, par, framework=plain)
    b = estimate(m, cl, wl, par, framework=over)
    assert a.time["ep_comm_s"] > 0
    # overlapped, only the slowdown share of the hidden part is left (plus any excess over compute)
    assert b.time["ep_comm_s"] < 0.5 * a.time["ep_comm_s"]
    assert b.step_time_s < a.step_time_s


def test_moe_validation_section():
    from planner.cli.validation import all_rows, markdown, moe_rows
    rows = all_rows(include_holdout=False)
    sel = [r for r in rows if r.split == "moe"]
    assert any("mixtral" in r.case for r in sel)
    text = markdown(rows)
    assert "## Mixture-of-experts training runs" in text
    # a case whose cluster the catalog lacks is named, not silently dropped
    for p in moe_rows.pending:
        assert p.split(":")[0] in text
