"""One owner per rule (issue 20): each rule below is one function, and two (or more) of its callers
must give the same answer. Where one caller had its own copy before, the test is the case where the
copies disagreed.

- recompute count: ``ParallelConfig.full_recompute_layers`` (emitters, cost model, runtime);
- model FLOPs: ``layers.model_flops_per_token`` (the cost model's MFU, the runtime's MFU), and
  against a hand count;
- node crossing: ``comm.crosses_nodes`` on the NVLink domain (plan file layout, training, serving
  KV transfer), on an NVL72 rack where a host count gives another answer;
- serving peak memory: ``inference.stage_memory_parts`` (aggregated estimate, engine KV pool);
- KV heads and TP: ``specs.kv_heads_shard`` / ``kv_heads_fit`` (tp_problems, the serving space,
  the runtime, the framework capability checks);
- MoE load imbalance: ``moe.load_factor`` (training's layer cost, serving's busiest rank).
"""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.batching import transfer_crosses_nodes
from costmodel.catalog import get_model, model_names
from costmodel.comm import crosses_nodes, group_layout
from costmodel.inference import _Serving, estimate_inference, serving_stage_memory
from costmodel.layers import model_flops_per_token
from costmodel.specs import (ParallelConfig, Workload, default_stages, kv_heads_fit, kv_heads_shard,
                             tp_problems)
from costmodel.training import estimate, stage_crosses
from planner.plan.planfile import Plan
from costmodel.files.clusters import load_cluster


# ---- recompute count ----------------------------------------------------------------------

def test_recompute_count_is_one_rule_for_emitters_cost_model_and_runtime():
    """pp 2, full recompute, recompute_layers 1, stages asking (3, 0): the emitters used to give
    [3, 0] while the cost model and the runtime gave [1, 1]."""
    from emitters.base import recompute_per_stage
    from runtime.parallel import recompute_layers
    m = get_model("llama-3-8b")
    c = load_cluster("dgx-h100").with_gpus(16)
    par = ParallelConfig(tp=8, pp=2, dp=1, recompute="full", recompute_layers=1, micro_batch=1, grad_accum=8)
    st = tuple(dataclasses.replace(s, recompute_layers=r) for s, r in zip(default_stages(m.layers, 2), (3, 0)))
    w = Workload(global_batch=8, seq_len=2048)
    plan = Plan(model=m, cluster=c, workload=w, parallel=par, stages=st, estimate={})
    emitted = recompute_per_stage(plan)
    runtime = [recompute_layers(par, s.num_layers, s.recompute_layers) for s in st]
    priced = [s.recompute_layers for s in estimate(m, c, w, par, stages=st).stages]
    assert emitted == runtime == priced == [1, 1]
    # without the full policy each stage's own count holds, for all three
    sel = dataclasses.replace(par, recompute="selective", recompute_layers=-1)
    plan = dataclasses.replace(plan, parallel=sel)
    assert recompute_per_stage(plan) == [recompute_layers(sel, s.num_layers, s.recompute_layers) for s in st] \
        == [s.recompute_layers for s in estimate(m, c, w, sel, stages=st).stages] == [3, 0]


# ---- model FLOPs --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-3-8b", "tiny-llama", "mixtral-8x7b", "deepseek-v3"])
def test_runtime_and_cost_model_count_the_same_model_flops(name):
    from runtime.model import flops_per_token
    m = get_model(name)
    for s in (512, 2048, 8192):
        assert flops_per_token(m, s) == model_flops_per_token(m, s)


def test_model_flops_by_hand_for_a_dense_model():
    """llama-3-8b (no biases, untied head): 6 per matrix parameter of the layers and the head,
    plus 12 * layers * s * q_dim for the full score matrix (PaLM App. B)."""
    m = get_model("llama-3-8b")
    h, L, V, s = 4096, 32, 128256, 4096
    q, kv, ffn = 4096, 1024, 14336
    layer = h * q + 2 * h * kv + q * h + 3 * h * ffn
    assert (m.hidden, m.layers, m.vocab, m.q_dim, m.kv_dim, m.ffn_hidden) == (h, L, V, q, kv, ffn)
    assert model_flops_per_token(m, s) == pytest.approx(6 * (L * layer + V * h) + 12 * L * s * q, rel=1e-12)


@pytest.mark.parametrize("name,tp", [("llama-3-8b", 8), ("tiny-llama", 4), ("deepseek-v3", 8)])
def test_estimate_mfu_divides_the_one_model_flops(name, tp):
    """The estimate's MFU is model_flops_per_token x tokens / step / peak, whatever the layout:
    replicated work (the router, MLA's down-projections, KV heads copied when tp > kv_heads) is
    not counted again."""
    m = get_model(name)
    gpus = tp * 2
    c = load_cluster("dgx-h100").with_gpus(gpus)
    w = Workload(global_batch=16, seq_len=1024)
    par = ParallelConfig(tp=tp, pp=1, dp=2, micro_batch=1, grad_accum=8, zero=3 if m.is_moe else 1,
                         ep=2 if m.is_moe else 1)
    est = estimate(m, c, w, par)
    peak = c.gpu.peak(w.dtype) * gpus
    assert est.mfu == pytest.approx(model_flops_per_token(m, w.seq_len) * w.global_batch * w.seq_len
                                    / est.step_time_s / peak, rel=1e-12)


# ---- node crossing ------------------------------------------------------------------------

def _nvl72(gpus: int):
    c = load_cluster("gb200-nvl72").with_gpus(gpus)
    assert c.gpus_per_node == 4 and c.nvlink_gpus == min(72, gpus)
    return c


@pytest.mark.parametrize("order", [("pp", "dp", "cp", "tp"), ("dp", "pp", "cp", "tp"), ("pp", "cp", "tp", "dp")])
def test_plan_layout_and_cost_model_agree_on_what_stays_in_an_nvlink_domain(order):
    """On NVL72 (hosts of 4 GPUs, one NVLink domain of 72) tp 8 stays inside the domain: the plan
    file used to count hosts and say it crossed."""
    m = get_model("llama-3-70b")
    c = _nvl72(64)
    par = ParallelConfig(tp=8, pp=2, dp=4, micro_batch=1, grad_accum=8)
    plan = Plan(model=m, cluster=c, workload=Workload(global_batch=32, seq_len=2048), parallel=par,
                stages=default_stages(m.layers, 2), estimate={}, mesh_order=order)
    degrees = {d: plan.degree(d) for d in order}
    inside = plan.rank_layout()["within_node"]
    for d in ("tp", "pp", "dp"):
        lay = group_layout(degrees, order, d, c.nvlink_gpus)
        assert (d in inside) == (not lay.crosses_nodes) == (not crosses_nodes(degrees, order, d, c.nvlink_gpus))
    assert "tp" in inside and plan.rank_layout()["tp_within_node"]
    # the cost model's pipeline neighbours, the same rule
    assert stage_crosses(c, par, order, None, 0) == crosses_nodes(degrees, order, "pp", c.nvlink_gpus)


def test_serving_kv_transfer_counts_the_nvlink_domain():
    """Disaggregated serving on 16 GPUs of one NVL72 rack moves the KV over NVLink (it used to
    count 16 > 4 GPUs per host and price the network); on 8-GPU hosts 16 GPUs cross."""
    from costmodel.batching import Pool
    pre, dec = Pool(4, 1, 1, 2), Pool(8, 1, 1, 1)
    assert pre.gpus + dec.gpus == 16
    assert transfer_crosses_nodes(_nvl72(72), pre, dec) is False
    assert transfer_crosses_nodes(load_cluster("dgx-h100").with_gpus(16), pre, dec) is True


# ---- serving peak memory ------------------------------------------------------------------

@pytest.mark.parametrize("name,tp,pp", [("llama-3-8b", 1, 1), ("llama-3-70b", 4, 2), ("mixtral-8x7b", 8, 1)])
def test_serving_estimate_memory_is_the_stage_rule(name, tp, pp):
    m = get_model(name)
    c = load_cluster("dgx-h100").with_gpus(tp * pp)
    w = Workload(global_batch=16, seq_len=3072, mode="infer", prompt_len=2048, output_len=1024)
    par = ParallelConfig(tp=tp, pp=pp, dp=1)
    est = estimate_inference(m, c, w, par)
    st = default_stages(m.layers, pp)
    sv = _Serving(m, c, w, par)
    rows = [serving_stage_memory(sv, s, i, w.prompt_len, w.prompt_len + w.output_len, est.batch)
            for i, s in enumerate(st)]
    worst = max(rows, key=lambda r: r["peak_bytes"])
    assert est.memory["peak_bytes"] == pytest.approx(worst["peak_bytes"], rel=1e-12)
    for r in rows:
        parts = r["weights_bytes"] + r["kv_cache_bytes"] + r["activations_bytes"] + r["other_bytes"]
        assert r["peak_bytes"] == pytest.approx(parts, rel=1e-12)


# ---- KV heads and tensor parallelism ------------------------------------------------------

def test_kv_heads_rule_has_one_answer_everywhere():
    """For every catalog model and tp 1..64: tp_problems and the serving space admit tp exactly
    when ``kv_heads_fit``; the runtime and the frameworks that shard K/V heads exactly when
    ``kv_heads_shard``."""
    from planner.search.serving_space import _tp_ok
    from runtime.parallel import Dims
    checked = 0
    for name in model_names():
        m = get_model(name)
        for tp in (1, 2, 3, 4, 8, 16, 32, 64):
            if m.heads % tp or m.ffn_hidden % tp or (m.is_moe and m.expert_ffn_hidden % tp):
                continue
            fit, shard = kv_heads_fit(m, tp), kv_heads_shard(m, tp)
            assert shard <= fit
            assert (not tp_problems(m, tp)) == fit, (name, tp)
            assert _tp_ok(m, tp) == fit, (name, tp)
            if m.attention == "mha" and not m.is_moe and m.positions != "learned":
                par = ParallelConfig(tp=tp, pp=1, dp=1)
                try:
                    Dims.from_plan(m, par, ("pp", "dp", "cp", "tp"), 64, tp, tp)
                    refused = False
                except Exception as e:   # the runtime's refusal names every problem
                    refused = "kv_heads" in str(e)
                assert refused == (not shard), (name, tp)
            checked += 1
    assert checked > 50


# ---- parameter counts -----------------------------------------------------------------------

def test_parameter_counts_are_views_of_the_layer_description_and_match_a_hand_count():
    """``ModelSpec``'s counts sum ``layers.layer_matrices`` unsharded; the per-GPU counts of the
    cost model shard the same matrices. Hand counts: llama-3-8b (Meta: 8.03B) and mixtral-8x7b
    (46.7B total, 12.9B active), layer by layer from their configs."""
    from costmodel.layers import layer_params
    h, L = 4096, 32
    attn = h * 4096 + 2 * h * 1024 + 4096 * h                      # q, k, v (8 KV heads of 128), o
    mlp = 3 * h * 14336                                             # SwiGLU gate, up, down
    llama = L * (attn + mlp + 2 * h) + 2 * 128256 * h + h           # layers, embedding + head, final norm
    assert get_model("llama-3-8b").total_params() == llama == 8_030_261_248
    router = h * 8
    mix = get_model("mixtral-8x7b")
    assert mix.total_params() == L * (attn + 8 * mlp + router + 2 * h) + 2 * 32000 * h + h == 46_702_792_704
    assert mix.active_params() == L * (attn + 2 * mlp + router + 2 * h) + 2 * 32000 * h + h == 12_879_925_248
    for name in model_names():
        m = get_model(name)
        for moe in {False, m.is_moe}:
            i = next((j for j in range(m.layers) if m.is_moe_layer(j) == moe), None)
            if i is None:
                continue
            for tp, ep in ((1, 1), (2, 1), (4, 2)):
                if tp_problems(m, tp) or (ep > 1 and (not m.is_moe or m.num_experts % ep)):
                    continue
                lp = layer_params(m, moe, tp, ep)
                # sharding splits matrices, never the router or the norms, and EP splits only experts
                whole = layer_params(m, moe, 1, 1)
                assert lp.norms == whole.norms and lp.router == whole.router
                if not m.bias:     # a row-parallel bias stays whole on every rank
                    assert lp.experts == pytest.approx(whole.experts / (tp * ep))
            assert layer_params(m, moe, 1).total == m.layer_params(i)


# ---- rotary positions -----------------------------------------------------------------------

def test_serving_rotary_at_an_offset_is_the_training_rotary_of_the_whole_sequence():
    """runtime.serve rotates the new tokens of a decode step at their positions; the same
    function (runtime.model.rope) on the whole sequence gives the same rows."""
    import torch
    from runtime.model import ROPE_THETA, rope
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 7, 4, 16, generator=g), torch.randn(2, 7, 2, 16, generator=g)
    qa, ka = rope(q, k, ROPE_THETA)
    qb, kb = rope(q[:, 5:], k[:, 5:], ROPE_THETA, start=5)
    assert torch.allclose(qa[:, 5:], qb, atol=1e-6) and torch.allclose(ka[:, 5:], kb, atol=1e-6)
    assert not torch.allclose(qb, rope(q[:, 5:], k[:, 5:], ROPE_THETA)[0], atol=1e-3)   # the offset matters


# ---- MoE: the busiest rank's load and the grouped kernel, training and serving --------------

@pytest.mark.parametrize("load", [1.0, 2.0])
def test_moe_load_factor_is_one_rule_for_training_and_serving(monkeypatch, load):
    """``costmodel.moe.load_factor`` sets the busiest expert-parallel rank's share in training
    (``layers.layer_cost``: its routed activations, k x load copies of each token's expert input)
    and in serving (``inference._Serving.load``: its routed copies). Changing the one table moves
    both callers to the same value: no caller keeps its own copy."""
    from costmodel import moe
    from costmodel.comm import GroupLayout
    from costmodel.layers import layer_cost
    m = get_model("qwen3-30b-a3b")                    # aux loss 1e-3: LOAD_FACTOR's "aux_loss_weak"
    monkeypatch.setitem(moe.LOAD_FACTOR, "aux_loss_weak", load)
    layer_cost.cache_clear()
    c = load_cluster("dgx-h100").with_gpus(8)
    one, eight = GroupLayout(1, 1), GroupLayout(8, 8)
    w = Workload(global_batch=8, seq_len=4096)
    args = (w, 1, 1, 8, False, 1, c.gpu, c, c.intra_node, one, eight, one)
    forced = layer_cost(m, True, *args, 1.0, None, 0, None, moe.MoeExecution(forced_balance=True))
    routed = layer_cost(m, True, *args)
    # the routed activations the busiest rank stores, over the balanced one's: (load - 1) x k copies
    k, h, fe = m.top_k, m.hidden, m.expert_ffn_hidden
    per_copy = 2 * h + 3 * 2 * fe                      # BF16 expert input + SwiGLU's three intermediates
    assert (routed.act_bytes - forced.act_bytes) / 4096 == pytest.approx((load - 1) * k * per_copy, rel=1e-9)
    sv = _Serving(m, c, Workload(global_batch=8, seq_len=1280, mode="infer", prompt_len=1024, output_len=256),
                  ParallelConfig(tp=1, pp=1, dp=8, ep=8))
    assert sv.load == load
    layer_cost.cache_clear()
