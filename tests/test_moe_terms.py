"""MoE rules (``costmodel.moe``), each against a hand derivation or the published figure it rests
on; how ``layer_cost`` uses them; the all-to-all overlap a framework may run; the MoE validation
rows."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel import moe
from costmodel.catalog import from_hf_config, get_model
from costmodel.comm import GroupLayout
from costmodel.frameworks import FRAMEWORKS
from costmodel.layers import layer_cost, layer_matrices
from costmodel.specs import LinkSpec, ParallelConfig, SpecError, Workload
from costmodel.training import estimate
from costmodel.files.clusters import load_cluster
from costmodel.units import US

ONE = GroupLayout(1, 1)
NVLINK4 = LinkSpec(name="nvlink4", bandwidth_bytes_per_s=450e9, latency_s=3 * US)
IB = LinkSpec(name="ib", bandwidth_bytes_per_s=50e9, latency_s=5 * US)


# ---- grouped GEMM ------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, published", [(1024, 0.92), (512, 0.77), (256, 0.69), (128, 0.40)])
def test_grouped_gemm_falls_with_tokens_per_expert_as_deepgemm_measured(tokens, published):
    # DeepGEMM on H800 (reference §1): the fraction of the large-M rate at small tokens per group;
    # m/(m+153) stays within 0.08 of each published point (a one-parameter curve through four)
    big = moe.grouped_gemm_factor(8192, 7168)
    assert moe.grouped_gemm_factor(tokens, 7168) / big == pytest.approx(published, abs=0.08)


def test_grouped_gemm_narrow_k_is_slower_as_published():
    # K=2048 shapes run 10-25% below K=7168 ones at the same M (DeepGEMM): K0 puts it at 0.82
    r = moe.grouped_gemm_factor(4096, 2048) / moe.grouped_gemm_factor(4096, 7168)
    assert r == pytest.approx(0.82, abs=0.005)
    assert 0.75 <= r <= 0.90
    # a wider K never beats the reference width; and 4096-token groups at K=7168 run at 0.94 x
    # m/(m+153) of the dense kernel (1346 vs 1426 TFLOPS)
    assert moe.grouped_gemm_factor(4096, 16384) == pytest.approx(0.94 * 4096 / (4096 + 153))


def test_small_experts_make_the_moe_layer_slower_than_its_flops_say():
    # Qwen3-30B-A3B's 768-wide experts: its expert GEMMs run at a lower fraction of peak than
    # Mixtral's 14336-wide ones at the same tokens per expert
    cl = load_cluster("dgx-h100").with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=8, seq_len=4096)

    def expert_rate(name):
        m = get_model(name)
        lc = layer_cost(m, True, wl, 1, 1, 1, False, 1, g.gpu, cl, g.intra_node, ONE, ONE, ONE)
        mats = layer_matrices(m, True, 1, 1)
        t = 4096 * m.top_k / m.num_experts
        flops = sum(2 * t * mx.n * mx.k * mx.count for mx in mats if mx.role == "expert")
        others = sum(2 * 4096 * mx.n * mx.k * mx.count for mx in mats if mx.role != "expert")
        return flops, others, lc.gemm_fwd_s
    f_small, o_small, t_small = expert_rate("qwen3-30b-a3b")
    f_big, o_big, t_big = expert_rate("mixtral-8x7b")
    assert f_small / t_small < f_big / t_big


# ---- permutation, router, host ------------------------------------------------------------------

def test_permutation_and_router_by_hand():
    # 4096 tokens routed 8 ways, h 7168, BF16: permute reads T*h and writes T*k*h, unpermute the
    # reverse; at 0.25 of HBM unfused, 0.40 fused
    T, k, h, E = 4096, 8, 7168, 256
    hbm = 3.35e12
    assert moe.permute_bytes(T, k, h, 2) == 2 * (T * h + T * k * h) * 2
    assert moe.permute_time_s(hbm, T, k, h, 2, False) == pytest.approx(2 * (T * h + T * k * h) * 2 / (0.25 * hbm))
    assert moe.permute_time_s(hbm, T, k, h, 2, True) == pytest.approx(2 * (T * h + T * k * h) * 2 / (0.40 * hbm))
    assert moe.router_bytes(T, E) == 2 * T * E * 4
    # the tiny case is launch-bound: five unfused kernels of 3.9 us
    assert moe.permute_time_s(hbm, 1, 1, 128, 2, False) == pytest.approx(5 * 15.5e-6 / 4)


def test_router_floor_is_the_published_decode_measurement():
    # Megatron-LM PR #6456: 128 experts, 256 tokens: 4 kernels in 15.5 us unfused, 1 in 2.0 us fused
    assert moe.router_time_s(3.35e12, 256, 128, False) == pytest.approx(15.5e-6)
    assert moe.router_time_s(3.35e12, 256, 128, True) == pytest.approx(2.0e-6)


def test_dropless_pays_a_host_sync_a_capacity_factor_does_not():
    assert moe.MoeExecution().dropless and moe.host_sync_s(True) > 0
    cf = moe.MoeExecution(capacity_factor=1.25)
    assert not cf.dropless and moe.host_sync_s(cf.dropless) == 0.0


# ---- imbalance ----------------------------------------------------------------------------------

def test_load_factor_by_balancing():
    assert moe.load_factor("aux_free", 0.0) == pytest.approx(1.04)       # LFB Table 2
    strong = moe.load_factor("aux_loss", 1e-2)
    weak = moe.load_factor("aux_loss", 1e-3)
    assert 1.0 < strong < weak
    assert moe.load_factor("aux_loss", 0.0) == weak                       # unknown: the slower one
    assert moe.load_factor("aux_loss", 1e-3, capacity_factor=1.1) == 1.1  # dropped above, padded below
    assert moe.load_factor("aux_free", 0.0, capacity_factor=1.25) == 1.25
    assert moe.load_factor("aux_loss", 1e-3, ep=1) == 1.0                 # one rank holds every expert


def test_load_factors_reproduce_their_forced_balance_pairs():
    # bench/fit_moe_imbalance.py's result is what costmodel/moe.py holds (to the rounding)
    import bench.fit_moe_imbalance as fit
    import yaml
    cases = {c["name"]: c for c in yaml.safe_load(fit.RUNS.read_text())["cases"] if c.get("fit")}
    for name in ("zoo-mixtral-8x22b-h100-128gpu", "zoo-qwen3-235b-h100-16k-cp1"):
        kind, _, f = fit.fit_pair(cases[name + "-dropless"], cases[name + "-forced"])
        assert moe.LOAD_FACTOR[kind] == pytest.approx(f, abs=0.02)


def test_busiest_rank_sets_the_pace_and_holds_the_memory():
    m = get_model("qwen3-235b-a22b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=8, seq_len=4096)
    ep8 = GroupLayout(8, 8)
    args = (wl, 1, 1, 8, False, 1, g.gpu, cl, g.intra_node, ONE, ep8, ONE)
    dropless = layer_cost(m, True, *args)
    forced = layer_cost(m, True, *args, 1.0, None, 0, None, moe.MoeExecution(forced_balance=True))
    assert dropless.gemm_fwd_s > forced.gemm_fwd_s
    assert dropless.ep_fwd_s > forced.ep_fwd_s
    assert dropless.act_bytes > forced.act_bytes
    assert dropless.model_flops_fwd == pytest.approx(forced.model_flops_fwd)   # the excess is time, not work


# ---- dispatch ------------------------------------------------------------------------------------

def test_dispatch_rules_have_one_owner_for_training_and_serving():
    """Training's all-to-all dispatchers move ``dispatch_bytes``; serving's engines run the gather
    dispatcher (``moe.gather_dispatch_s``, tests/test_moe_serving.py), and both take the busiest
    rank's load from ``moe.load_factor`` (tests/test_rule_owners.py)."""
    assert moe.dispatch_bytes(2048, 8, 4096, 2) == 2048 * 8 * 4096 * 2
    assert moe.dispatch_bytes(2048, 8, 4096, 2, load=1.5) == 1.5 * 2048 * 8 * 4096 * 2
    import inspect

    from costmodel import inference, layers
    assert "dispatch_bytes(" in inspect.getsource(layers.layer_cost)
    assert "gather_dispatch_s(" in inspect.getsource(inference)
    assert "all_to_all(" not in inspect.getsource(inference)


def test_fp8_dispatch_moves_the_scales_and_combines_in_bf16():
    ex = moe.MoeExecution(fp8_dispatch=True)
    assert moe.dispatch_value_bytes(2, ex, combine=False) == pytest.approx(1 + 4 / 128)   # DeepEP's fp8_factor x 2
    assert moe.dispatch_value_bytes(2, ex, combine=True) == 2
    assert moe.dispatch_value_bytes(2, moe.MoeExecution(), combine=False) == 2


def test_nccl_all_to_all_inside_a_node_matches_the_published_times():
    """NCCL all-to-all inside an NVLink domain: 0.75 of the link at large messages (nccl-tests alltoall_perf with
    default settings: 0.73-0.76 on 8 Blackwell GPUs, 0.744 on 4 H100; costmodel.moe's comment), plus a fixed part
    set on SGLang#22583's 8 x H100 table at 64 MiB (210 us); its 8 and 16 MiB points, which chose nothing, within
    5% and 10% (60 and 87 us)."""
    from costmodel.comm import COLLECTIVE_LAUNCH_S, launched
    assert moe.NCCL_A2A_NVLINK_FIXED_S + COLLECTIVE_LAUNCH_S == pytest.approx(36e-6)

    def a2a(mib):
        return launched(moe.dispatch_time_s(mib * 2**20, 8, 8, 8, NVLINK4, IB, moe.MoeExecution()))
    assert a2a(64) == pytest.approx(210e-6, rel=0.01)
    assert a2a(8) == pytest.approx(60e-6, rel=0.05)
    assert a2a(16) == pytest.approx(87e-6, rel=0.10)
    rate = (1024 - 512) * 2**20 * 7 / 8 / (a2a(1024) - a2a(512))
    assert rate == pytest.approx(0.75 * NVLINK4.bandwidth_bytes_per_s, rel=1e-6)
    # the 64 MiB point alone (0.62 of the link, the rule until stop 54) is slower than this at 1 GiB
    assert 7 / 8 * 2**30 / a2a(1024) > 0.62 * NVLINK4.bandwidth_bytes_per_s


def test_node_limited_routing_by_hand():
    # 8 experts uniform over 8 nodes: 8 (1 - (7/8)^8) = 5.25 distinct nodes, 7/8 of them remote;
    # DeepSeek-V3's limit of 4 nodes: 4 * 7/8 = 3.5
    assert moe.remote_node_copies(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8) * 7 / 8)
    assert moe.remote_node_copies(8, 8, 4) == pytest.approx(3.5)
    assert moe.node_limit(8, 4, 8) == 4 and moe.node_limit(8, 4, 16) == 8 and moe.node_limit(0, 0, 8) == 0


def test_deepep_sends_once_per_node_alltoall_once_per_copy():
    sent = 2048 * 8 * 7168 * 2.0
    a2a = moe.dispatch_time_s(sent, 8, 64, 8, NVLINK4, IB, moe.MoeExecution())
    dep = moe.dispatch_time_s(sent, 8, 64, 8, NVLINK4, IB, moe.MoeExecution(dispatcher="deepep"), 8, 4)
    # by hand: the network tier dominates both
    # (NCCL's all-to-all pays its fixed part inside the node, the link's latency across)
    assert a2a == pytest.approx(56 / 64 * sent / (0.97 * 50e9) + moe.NCCL_A2A_NVLINK_FIXED_S + 5e-6)
    assert dep == pytest.approx(sent / 8 * 3.5 / (1.02 * 50e9) + 3e-6 + 5e-6)
    # the busiest rank's load slows alltoall's network tier, not DeepEP's (its receiver is the
    # sender's same-index GPU)
    assert moe.dispatch_time_s(sent, 8, 64, 8, NVLINK4, IB, moe.MoeExecution(), load=1.5) > 1.4 * a2a
    dep_l = moe.dispatch_time_s(sent, 8, 64, 8, NVLINK4, IB, moe.MoeExecution(dispatcher="deepep"), 8, 4, load=1.5)
    assert dep_l == pytest.approx(dep)


def test_unknown_dispatcher_is_refused():
    with pytest.raises(ValueError, match="dispatcher"):
        moe.MoeExecution(dispatcher="nccl2")


# ---- the router from config.json -----------------------------------------------------------------

def _dsv3_config(**kw):
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
           "vocab_size": 129280, "intermediate_size": 18432, "n_routed_experts": 256, "num_experts_per_tok": 8,
           "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
           "aux_loss_alpha": 0.001, "num_nextn_predict_layers": 1, "max_position_embeddings": 163840}
    cfg.update(kw)
    return cfg


def test_router_read_from_config_json():
    m = from_hf_config(_dsv3_config(), "dsv3")
    assert (m.router_scoring, m.router_groups, m.router_topk_groups, m.router_balance, m.mtp_layers) == \
        ("sigmoid", 8, 4, "aux_free", 1)
    q = from_hf_config({"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                        "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8,
                        "moe_intermediate_size": 768, "router_aux_loss_coef": 0.001}, "q3")
    assert (q.router_balance, q.router_aux_coeff, q.router_groups) == ("aux_loss", 0.001, 0)


@pytest.mark.parametrize("field, value", [("scoring_func", "relu"), ("n_group", -1), ("router_aux_loss_coef", "x")])
def test_bad_router_field_is_named(field, value):
    with pytest.raises(SpecError, match=field.split("_coef")[0]):
        from_hf_config(_dsv3_config(**{field: value}), "dsv3")


# ---- the layer and the step ------------------------------------------------------------------------

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
    assert b.time["ep_comm_s"] < 0.5 * a.time["ep_comm_s"]
    assert b.step_time_s < a.step_time_s


def test_fused_permutation_is_priced_only_where_the_file_sets_it():
    m = get_model("qwen3-30b-a3b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=8, seq_len=4096)
    args = (wl, 1, 1, 8, False, 1, g.gpu, cl, g.intra_node, ONE, GroupLayout(8, 8), ONE, 1.0, None, 0, None)
    plain = layer_cost(m, True, *args, moe.MoeExecution())
    fused = layer_cost(m, True, *args, moe.MoeExecution(permute_fusion=True, router_fusion=True))
    assert fused.elementwise_fwd_s < plain.elementwise_fwd_s
    assert FRAMEWORKS["megatron"].moe.permute_fusion and not FRAMEWORKS["torchtitan"].moe.permute_fusion


def test_moe_validation_section():
    from planner.cli.validation import all_rows, markdown, moe_rows
    rows = all_rows(include_holdout=False)
    sel = [r for r in rows if r.split == "moe"]
    fit = [r for r in rows if r.split == "moe-fit"]
    assert any("mixtral" in r.case for r in sel) and fit
    # at least four public sources among the out-of-source rows
    assert len({r.source.split(" @")[0].split(",")[0] for r in sel}) >= 4
    text = markdown(rows)
    assert "## Mixture-of-experts training runs" in text
    for p in moe_rows.pending:
        assert p.split(":")[0] in text


# ---- host pacing -----------------------------------------------------------------------------------

def test_per_expert_gemm_floor_by_hand():
    # TE GroupedLinear: one GEMM call per local expert, two host operations each (split, call) at
    # the measured 15.5 us / 4 per operation (Megatron-LM PR #6456)
    assert moe.expert_gemm_host_floor_s(16, True) == pytest.approx(16 * 2 * 15.5e-6 / 4)
    assert moe.expert_gemm_host_floor_s(16, False) == 0.0          # one grouped kernel: no floor
    # a layer: the fixed part plus three calls per expert for each of the two matrices
    assert moe.layer_host_s(0.01, 16, True) == pytest.approx(0.01 + 6 * 16 * 2 * 15.5e-6 / 4)
    assert moe.layer_host_s(0.0, 16, True) == 0.0                   # not priced where unset
    assert moe.host_excess_s(0.004, 0.010) == pytest.approx(0.006)
    assert moe.host_excess_s(0.020, 0.010) == 0.0


def _qwen3_30b_layer(ex: moe.MoeExecution, ep: int = 8, mb: int = 1, cluster: str = "dgx-b200"):
    m = get_model("qwen3-30b-a3b")
    cl = load_cluster(cluster).with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=64, seq_len=4096)
    return layer_cost(m, True, wl, 1, 1, ep, False, mb, g.gpu, cl, g.intra_node, ONE, GroupLayout(ep, ep), ONE,
                      1.0, None, 0, None, ex)


def test_host_pacing_is_priced_only_where_set_and_only_beyond_the_gpu():
    base = moe.MoeExecution(forced_balance=True)
    paced = dataclasses.replace(base, layer_host_s=moe.MEGATRON_LAYER_HOST_S, per_expert_gemms=True)
    free, hosted = _qwen3_30b_layer(base), _qwen3_30b_layer(paced)
    gpu = 3 * free.fwd_s + 2 * free.ep_fwd_s
    host = moe.layer_host_s(moe.MEGATRON_LAYER_HOST_S, 16, True)
    assert host > gpu                                   # Qwen3-30B-A3B, micro-batch 1, B200: host-bound
    assert 3 * hosted.fwd_s + 2 * hosted.ep_fwd_s == pytest.approx(host, rel=1e-9)
    assert hosted.model_flops_fwd == free.model_flops_fwd      # time, not work
    # a bigger micro-batch amortises the host (the ModelZoo's answer: micro-batch 4 on B200)
    big = _qwen3_30b_layer(paced, mb=8)
    assert 3 * big.fwd_s + 2 * big.ep_fwd_s > host      # GPU-bound again
    assert big.fwd_s / 8 < hosted.fwd_s


def test_per_expert_launches_make_few_ep_ranks_slow():
    # one rank holding all 128 experts issues 128 GEMM calls per matrix: the floor binds
    per = moe.MoeExecution(forced_balance=True, per_expert_gemms=True)
    one = moe.MoeExecution(forced_balance=True)
    slow, fast = _qwen3_30b_layer(per, ep=1), _qwen3_30b_layer(one, ep=1)
    assert slow.gemm_fwd_s - fast.gemm_fwd_s > 0.5 * 2 * moe.expert_gemm_host_floor_s(128, True)
    # at EP8 (16 experts a rank, ~4k tokens each) the GEMMs outlast the launches
    assert _qwen3_30b_layer(per).gemm_fwd_s == _qwen3_30b_layer(one).gemm_fwd_s


def test_megatron_profile_prices_what_its_file_runs():
    ex = FRAMEWORKS["megatron"].moe
    assert ex.per_expert_gemms and ex.layer_host_s == moe.MEGATRON_LAYER_HOST_S
    for name in ("torchtitan", "generic"):
        assert FRAMEWORKS[name].moe.layer_host_s == 0.0 and not FRAMEWORKS[name].moe.per_expert_gemms


def test_layer_host_time_reproduces_its_fit():
    # bench/fit_moe_host.py's median over its runs is what costmodel/moe.py holds (to the rounding);
    # each run alone lands within the stated spread (8.6-15.0 ms since stop 22's third run)
    import statistics

    import bench.fit_moe_host as fit
    out = fit.fits()
    assert len(out) >= 3
    assert moe.MEGATRON_LAYER_HOST_S == pytest.approx(statistics.median(out.values()), rel=0.01)
    assert all(8.0e-3 < h < 15.5e-3 for h in out.values())


def test_torchtitan_mfu_counts_the_flops_this_cost_model_counts():
    """The small-expert check (bench/check_small_experts.py) compares this planner's MFU with
    torchtitan's reported MFU: torchtitan's FLOP count (6 x active non-embedding parameters + 6 x layers x
    heads x (qk + v) x seq, restated from the shape) equals ``model_flops_per_token`` on that model to
    0.01%, and its B200 peak (2.25e15) is the catalog's BF16 peak, so the two MFUs are one definition."""
    import bench.check_small_experts as chk
    from costmodel.layers import model_flops_per_token
    m = chk.model()
    for seq in (4096, 6144):
        assert chk.torchtitan_flops_per_token(m, seq) == pytest.approx(model_flops_per_token(m, seq), rel=1e-4)
    # a count that halved causal attention would not agree: the check can fail
    half = chk.torchtitan_flops_per_token(m, 4096) - 3 * m.layers * m.heads * 320 * 4096
    assert half != pytest.approx(model_flops_per_token(m, 4096), rel=1e-2)
    assert load_cluster("dgx-b200").gpu.peak_flops_per_s["bf16"] == chk.TORCHTITAN_B200_PEAK


def test_small_expert_checks_are_priced_through_a_target():
    """Every public small-expert check (calibration/moe_small_expert_sources.yaml ``check_cases``) is
    priced through a target that runs its layout, one row each, none refused."""
    import yaml

    import bench.check_small_experts as chk
    rows = chk.check_rows()
    cases = yaml.safe_load(chk.SOURCES.read_text())["check_cases"]
    assert [r.case for r in rows] == [c["name"] for c in cases]
    assert all(r.split == "check" and r.predicted > 0 for r in rows)


def _fused_layer(fused: bool, cluster: str = "dgx-b200", recipe: str = "mxfp8"):
    from costmodel import fp8 as fp8m
    m = get_model("qwen3-30b-a3b")
    cl = load_cluster(cluster).with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=64, seq_len=4096, dtype="fp8")
    rec = fp8m.resolve(recipe, "megatron", g.gpu)
    ex = moe.MoeExecution(forced_balance=True, fused_grouped_mlp=fused)
    lc = layer_cost(m, True, wl, 1, 1, 8, False, 1, g.gpu, cl, g.intra_node, ONE, GroupLayout(8, 8), ONE,
                    1.0, rec, 0, None, ex)
    return lc, m, g.gpu, rec


def test_fused_grouped_mlp_removes_the_swiglu_passes_and_two_casts_by_hand():
    from costmodel.compute import memory_bound_factor, memory_time_s
    from costmodel.layers import ELEMENTWISE_TRAFFIC_PER_STORED_BYTE
    plain, m, gpu, rec = _fused_layer(False)
    fused, *_ = _fused_layer(True)
    # by hand: 4,096 tokens x top-8 routed copies on the rank (forced balance, EP8 over 8 ranks), each
    # storing its two FC1 outputs (BF16) and FC2's FP8 input at the expert width 768
    copies = 4096 * m.top_k
    fe = m.expert_ffn_hidden
    ew = ELEMENTWISE_TRAFFIC_PER_STORED_BYTE * copies * (2 * 2 + rec.saved_input_bytes) * fe
    casts = (copies * fe + copies * 2 * fe) * rec.cast_bytes_per_value() / 3.0
    want = (memory_time_s(gpu, ew) + memory_time_s(gpu, casts)) * memory_bound_factor("fused")
    assert plain.elementwise_fwd_s - fused.elementwise_fwd_s == pytest.approx(want, rel=1e-9)
    # the layer's time is the slowest of the 8 ranks' (costmodel.scale)
    from costmodel.scale import straggler_factor
    assert plain.fwd_s - fused.fwd_s == pytest.approx(want * straggler_factor(8), rel=1e-9)
    # the GEMMs, the FLOPs and the stored activations do not change
    assert (fused.gemm_fwd_s, fused.model_flops_fwd, fused.act_bytes) == (plain.gemm_fwd_s, plain.model_flops_fwd,
                                                                          plain.act_bytes)


def test_fused_grouped_mlp_runs_only_in_mxfp8_on_blackwell():
    # Transformer Engine selects the CuTe DSL op for MXFP8 on SM100+ only: elsewhere the flag prices nothing
    for cluster, recipe in (("dgx-h100", "delayed"), ("dgx-b200", "current")):
        plain, *_ = _fused_layer(False, cluster, recipe)
        fused, *_ = _fused_layer(True, cluster, recipe)
        assert fused.fwd_s == plain.fwd_s
    assert not FRAMEWORKS["megatron"].moe.fused_grouped_mlp      # the emitted file does not set it


def test_mxfp8_experts_of_a_bf16_model_by_hand():
    """torchao's MXFP8 grouped GEMMs on the routed experts (``MoeExecution.fp8_experts``): the experts'
    GEMMs at the FP8 curve and their casts per use (``fp8.torchao_mxfp8_experts``, counted here by hand);
    every other GEMM, the stored activations and the FLOPs stay BF16's; only on Blackwell."""
    from costmodel.compute import fp8_gemm_time_s, gemm_time_s, memory_bound_factor, memory_time_s
    from costmodel.fp8 import torchao_mxfp8_experts
    base = moe.MoeExecution(forced_balance=True)
    plain = _qwen3_30b_layer(base)
    mx = _qwen3_30b_layer(dataclasses.replace(base, fp8_experts="mxfp8"))
    assert mx.act_bytes == plain.act_bytes and mx.model_flops_fwd == plain.model_flops_fwd
    assert mx.expert_gemm_fwd_s < plain.expert_gemm_fwd_s
    # the non-expert GEMMs are unchanged: the GEMM time falls by exactly the experts' change
    assert mx.gemm_fwd_s - mx.expert_gemm_fwd_s == pytest.approx(plain.gemm_fwd_s - plain.expert_gemm_fwd_s)
    # the casts by hand: tokens per local expert (EP 8, forced balance), per expert matrix (gate+up, down)
    m = get_model("qwen3-30b-a3b")
    cl = load_cluster("dgx-b200").with_gpus(8)
    gpu = cl.groups[0].gpu
    per_expert = 4096 * 8 * m.top_k / m.num_experts
    local = m.num_experts / 8
    r = torchao_mxfp8_experts()
    h, fe = m.hidden, m.expert_ffn_hidden
    casts = local * (r.cast_bytes(per_expert, 2 * fe, h) + r.cast_bytes(per_expert, h, fe))
    assert mx.elementwise_fwd_s - plain.elementwise_fwd_s == pytest.approx(
        memory_time_s(gpu, casts / 3.0) * memory_bound_factor("fused"), rel=1e-9)
    # one expert matrix by hand at the FP8 curve against BF16's (the grouped kernel's factor alike on both)
    f8 = fp8_gemm_time_s(gpu, cl, per_expert * local, fe, h)
    b16 = gemm_time_s(gpu, cl, "bf16", per_expert * local, fe, h, train=True)
    assert f8 < b16
    # Hopper: the converter refuses below SM100, so nothing is priced
    h100 = moe.MoeExecution(forced_balance=True, fp8_experts="mxfp8")
    assert _qwen3_30b_layer(h100, cluster="dgx-h100") == _qwen3_30b_layer(base, cluster="dgx-h100")
    with pytest.raises(ValueError, match="fp8_experts"):
        moe.MoeExecution(fp8_experts="fp8")
