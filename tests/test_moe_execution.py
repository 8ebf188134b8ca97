"""The MoE execution choices a plan carries (``ParallelConfig.moe_dispatcher``, ``ep_overlap``):
priced per choice, refused where Megatron-Core refuses them (its own ``TransformerConfig`` checks
the same configurations), kept out of plan files at their defaults. The Megatron file's flags for
them are read back in tests/test_priced_is_written.py."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, SpecError, Workload, default_stages
from costmodel.training import estimate
from planner.plan.targets import config_problems
from test_emit_roundtrip import targets_package

MIXTRAL = get_model("mixtral-8x7b")
DEEPSEEK = get_model("deepseek-v3")
WL = Workload(global_batch=256, seq_len=4096)
H100_32 = load_cluster("dgx-h100").with_gpus(32)
BASE = dict(tp=1, pp=1, dp=32, ep=8, micro_batch=1, grad_accum=8)


def _par(**kw) -> ParallelConfig:
    return ParallelConfig(**{**BASE, **kw})


def test_defaults_stay_out_of_plan_files_and_bad_values_are_named():
    assert "moe_dispatcher" not in _par().to_dict() and "ep_overlap" not in _par().to_dict()
    d = _par(moe_dispatcher="deepep", ep_overlap=True).to_dict()
    assert (d["moe_dispatcher"], d["ep_overlap"]) == ("deepep", True)
    assert ParallelConfig.from_dict(d) == _par(moe_dispatcher="deepep", ep_overlap=True)
    with pytest.raises(SpecError, match="moe_dispatcher must be one of alltoall, deepep, hybridep .* got 'nccl'"):
        _par(moe_dispatcher="nccl")


def test_each_choice_is_priced():
    def ep_s(**kw) -> float:
        return estimate(MIXTRAL, H100_32, WL, _par(**kw), framework="megatron").time["ep_comm_s"]
    a2a, over = ep_s(), ep_s(ep_overlap=True)
    assert 0 < over < a2a                               # the overlap hides part of the all-to-alls
    assert ep_s(moe_dispatcher="deepep") < a2a          # EP8 in one node: DeepEP's NVLink fraction 0.78 > 0.62
    # the same choice given through the plan or through the profile prices the same
    from costmodel.frameworks import FRAMEWORKS
    prof = FRAMEWORKS["megatron"]
    prof = dataclasses.replace(prof, ep_comm_overlap=True, moe=dataclasses.replace(prof.moe, dispatcher="deepep"))
    via_plan = estimate(MIXTRAL, H100_32, WL, _par(moe_dispatcher="deepep", ep_overlap=True), framework="megatron")
    via_prof = estimate(MIXTRAL, H100_32, WL, _par(), framework=prof)
    assert via_plan.step_time_s == pytest.approx(via_prof.step_time_s, rel=1e-12)


# (refused, the message's words, the same with the named setting undone)
REFUSED = [
    (dict(ep_overlap=True, ep=1), "ep_overlap with ep=1", dict(ep=1)),
    (dict(ep_overlap=True, recompute="full"), "ep_overlap with recompute=full", dict(ep_overlap=True)),
    (dict(ep_overlap=True, pp=2, dp=16), "ep_overlap with pp=2 and vpp=1",
     dict(ep_overlap=True, pp=2, dp=16, vpp=2, schedule="interleaved")),
]


@pytest.mark.parametrize("kw, message, undone", REFUSED)
def test_refusals_are_megatron_cores_own(kw, message, undone):
    par = _par(**kw)
    problems = config_problems("megatron", MIXTRAL, WL, par)
    assert any(message in p for p in problems), problems
    # Megatron-Core 0.16.1's TransformerConfig refuses the same configuration, and takes it once
    # the named setting is undone (as the planner does)
    tc = targets_package("megatron.core.transformer.transformer_config", "megatron-core 0.16.1")
    with pytest.raises((AssertionError, ValueError)):
        _transformer_config(tc, par)
    assert config_problems("megatron", MIXTRAL, WL, _par(**undone)) == []
    _transformer_config(tc, _par(**undone))


def _transformer_config(tc, par: ParallelConfig):
    import torch
    m = MIXTRAL
    full = par.recompute == "full"
    return tc.TransformerConfig(
        num_layers=m.layers, hidden_size=m.hidden, num_attention_heads=m.heads, num_query_groups=m.kv_heads,
        ffn_hidden_size=m.ffn_hidden, num_moe_experts=m.num_experts, moe_router_topk=m.top_k,
        moe_ffn_hidden_size=m.expert_ffn_hidden, tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp, pipeline_dtype=torch.bfloat16, bf16=True,
        virtual_pipeline_model_parallel_size=par.vpp if par.vpp > 1 else None,
        expert_model_parallel_size=par.ep, expert_tensor_parallel_size=par.etp,
        moe_token_dispatcher_type="flex" if par.moe_dispatcher == "deepep" else "alltoall",
        moe_grouped_gemm=True, overlap_moe_expert_parallel_comm=par.ep_overlap,
        recompute_granularity="full" if full else None, recompute_method="uniform" if full else None,
        recompute_num_layers=1 if full else None)


def test_accepted_overlap_is_accepted_by_megatron_core():
    tc = targets_package("megatron.core.transformer.transformer_config", "megatron-core 0.16.1")
    for kw in (dict(ep_overlap=True), dict(ep_overlap=True, moe_dispatcher="deepep"),
               dict(ep_overlap=True, pp=2, dp=16, vpp=2, schedule="interleaved")):
        par = _par(**kw)
        assert config_problems("megatron", MIXTRAL, WL, par) == []
        cfg = _transformer_config(tc, par)
        assert cfg.overlap_moe_expert_parallel_comm


def test_other_refusals_name_the_binding_rule():
    dense = get_model("llama-3-8b")
    assert any("has no experts" in p for p in config_problems("megatron", dense, WL, ParallelConfig(
        dp=8, moe_dispatcher="deepep")))
    assert any("ep_overlap with dtype fp32" in p for p in config_problems(
        "megatron", MIXTRAL, dataclasses.replace(WL, dtype="fp32"), _par(ep_overlap=True)))
    # DeepSeek-V3's one MTP layer: the overlap needs pp > 1 then
    assert any("MTP layers and pp=1" in p for p in config_problems(
        "megatron", DEEPSEEK, WL, ParallelConfig(tp=1, pp=1, dp=256, ep=64, ep_overlap=True)))
    # a target whose file cannot set them
    assert any("does not overlap" in p for p in config_problems("torchtitan", MIXTRAL, WL, _par(ep_overlap=True)))
    assert any("writes the alltoall dispatcher" in p
               for p in config_problems("torchtitan", MIXTRAL, WL, _par(moe_dispatcher="deepep")))


# ---- the search ------------------------------------------------------------------------------------

def _pairs(cands) -> set:
    return {(c.par.ep, c.par.moe_dispatcher, c.par.ep_overlap) for c in cands}


def test_search_offers_each_choice_the_target_writes():
    from planner.search.space import enumerate_candidates
    q = get_model("qwen3-30b-a3b")
    wl = Workload(global_batch=64, seq_len=4096)
    cl = load_cluster("dgx-h100").with_gpus(32)
    fixed = dict(tp=1, pp=1, micro_batch=1)
    meg = _pairs(enumerate_candidates(q, cl, wl, fixed, 32, target="megatron"))
    # the overlap both ways at every EP; DeepEP only where EP leaves the 8-GPU NVLink domain
    assert {(8, "", False), (8, "", True), (16, "", True), (16, "deepep", False), (16, "deepep", True)} <= meg
    assert not any(d == "deepep" and ep <= 8 for ep, d, _ in meg)
    assert not any(o for ep, _, o in meg if ep == 1)
    # a target whose file sets neither: the defaults only
    assert {(d, o) for _, d, o in _pairs(enumerate_candidates(q, cl, wl, fixed, 32, target="torchtitan"))} \
        <= {("", False)}
    # pinned by --moe-dispatcher / --ep-overlap
    pinned = _pairs(enumerate_candidates(q, cl, wl, dict(fixed, ep=16, moe_dispatcher="deepep", ep_overlap=False),
                                         32, target="megatron"))
    assert pinned == {(16, "deepep", False)}


def test_dense_search_is_unchanged():
    from planner.search.space import enumerate_candidates
    m = get_model("llama-3-8b")
    cands = enumerate_candidates(m, load_cluster("dgx-h100").with_gpus(8), Workload(global_batch=64, seq_len=4096),
                                 dict(tp=2), 8, target="megatron")
    assert cands and all(not c.par.moe_dispatcher and not c.par.ep_overlap for c in cands)


def test_only_megatron_writes_them():
    # every table (and every variant: Accelerate's Megatron plugin is built from Megatron's) that
    # offers a dispatcher or the overlap is one whose emitter writes them
    from planner.plan import targets as T
    for name in T.TRAIN_TARGETS:
        t = T.get(name)
        for sub in [s for _, _, s in t.variants] or [t]:
            writes = name == "megatron"
            assert (sub.ep_overlap, "deepep" in sub.moe_dispatchers) == (writes, writes), name


def test_ep_overlap_memory_is_one_more_moe_layer_by_hand():
    """Megatron's combined 1F1B step (``--overlap-moe-expert-parallel-comm``) pairs the forward of
    layer i of one micro-batch with the backward of layer L-1-i of another and frees the latter after
    the pair: L + 1 layers of the two in flight, one layer beyond 1F1B's peak (``StageModel.
    _ep_overlap_bytes``). By hand on Mixtral (every layer MoE, so one layer's stored activations are
    a stage's stored activations per micro-batch over its layers): the peak grows by exactly that,
    on every stage, and the step time does not move."""
    from costmodel.training import inflight_microbatches
    kw = dict(pp=2, dp=16, vpp=2, schedule="interleaved", grad_accum=16, recompute="selective")
    base = estimate(MIXTRAL, H100_32, WL, _par(**kw), framework="megatron")
    over = estimate(MIXTRAL, H100_32, WL, _par(ep_overlap=True, **kw), framework="megatron")
    assert over.step_time_s < base.step_time_s                      # the overlap hides all-to-all time
    par = _par(**kw)
    for i, (b, o) in enumerate(zip(base.stages, over.stages)):
        extra = o.memory["activations_bytes"] - b.memory["activations_bytes"]
        one_layer = _one_layer_stored(par, i)
        assert extra == pytest.approx(one_layer, rel=1e-9), (i, extra, one_layer)
        assert extra > 0
    assert inflight_microbatches(par, 0) == inflight_microbatches(dataclasses.replace(par, ep_overlap=True), 0)


def _one_layer_stored(par: ParallelConfig, index: int) -> float:
    """One Mixtral layer's stored activations under selective recompute, per micro-batch: the
    stage model's cost with one layer more, less its cost as is."""
    from costmodel.comm import DEFAULT_ORDER
    from costmodel.stage_cache import stage_model
    sm = stage_model(MIXTRAL, H100_32, WL, par, DEFAULT_ORDER, H100_32.groups[0].name, index == 0,
                     index == par.pp - 1, False, "megatron")
    return sm.cost(0, 2, 0).act_stored_bytes - sm.cost(0, 1, 0).act_stored_bytes


def _peak_layers(layers: int, warmup: int, steps: int, combined: bool) -> int:
    """Layer by layer, the most layers' activations a rank holds: ``warmup`` chunk forwards, then
    ``steps`` steady steps. 1F1B: a chunk's forward (one layer stored at a time), then the oldest
    chunk's backward (one freed at a time). Combined (Megatron's EP overlap): one more warm-up
    forward, then each step runs forward layer i beside backward layer L-1-i, the backward layer's
    state freed after the pair (model_chunk_schedule_plan.py's loop)."""
    held = 0
    peak = 0
    chunks = []                               # layers held by each stored chunk, oldest first
    for _ in range(warmup + (1 if combined else 0)):
        chunks.append(0)
        for _ in range(layers):
            chunks[-1] += 1
            held += 1
            peak = max(peak, held)
    for _ in range(steps):
        chunks.append(0)
        if combined:
            for _ in range(layers):
                chunks[-1] += 1
                held += 1
                peak = max(peak, held)        # the pair runs: the backward layer not yet freed
                chunks[0] -= 1
                held -= 1
        else:
            for _ in range(layers):
                chunks[-1] += 1
                held += 1
                peak = max(peak, held)
            for _ in range(layers):
                chunks[0] -= 1
                held -= 1
        chunks.pop(0)
    return peak


@pytest.mark.parametrize("layers,warmup", [(1, 0), (4, 0), (2, 7), (8, 3)])
def test_combined_schedule_holds_one_layer_more_than_1f1b(layers, warmup):
    """The slow obvious count behind ``_ep_overlap_bytes``: with the extra warm-up forward and the
    paired layers, the combined schedule's peak is 1F1B's plus one layer, whatever the warm-up."""
    assert _peak_layers(layers, warmup, 6, True) == _peak_layers(layers, warmup, 6, False) + 1


# ---- DeepEP's SMs and its fabric ----------------------------------------------------------------

def test_deepep_sm_share_by_hand():
    """20 of an H100's 132 SMs: while DeepEP's kernels run beside compute, the compute has 112/132 of
    the GPU; the pair takes max(A, C + 20/132 A). A = 1 ms of all-to-all beside C = 4 ms of compute
    adds 20/132 ms; beside 0.5 ms it adds 0.5 ms (the all-to-all is the longer)."""
    from costmodel import moe
    share = moe.comm_sm_share("H100-SXM5-80GB", moe.DEEPEP_SMS)
    assert share == pytest.approx(20 / 132)
    assert moe.sm_share_overlap_s(1e-3, 4e-3, share) == pytest.approx(20 / 132 * 1e-3)
    assert moe.sm_share_overlap_s(1e-3, 0.5e-3, share) == pytest.approx(0.5e-3)
    assert moe.sm_share_overlap_s(0.0, 1e-3, share) == 0.0
    assert moe.comm_sm_share("B200-180GB", 20) == 0.0          # no SM count in the table: the generic rule


def _ep_terms(cluster, dispatcher: str, over: bool):
    from costmodel.frameworks import framework_profile
    from costmodel.stage_cache import _shared
    par = _par(moe_dispatcher=dispatcher, ep_overlap=over, ep=16)
    sh = _shared(MIXTRAL, cluster, WL, framework_profile("megatron"))
    grp = cluster.groups[0]
    lays = sh.layer_layouts(par, ("pp", "dp", "cp", "tp"), grp)
    return sh.layer(True, par, grp, *lays)


def test_deepep_sms_priced_only_with_deepep_and_the_overlap():
    """Where the plan runs DeepEP with the EP overlap on an H100, the overlapped all-to-all costs the
    compute lost on DeepEP's 20 SMs (``moe.sm_share_overlap_s``); with the alltoall dispatcher the
    cluster's generic slowdown; without the overlap the whole all-to-all; on a GPU outside the SM
    table the generic slowdown too."""
    from costmodel import moe
    from costmodel.stage_terms import overlapped
    cl = load_cluster("dgx-h100").with_gpus(32)
    lc, terms = _ep_terms(cl, "deepep", True)
    assert terms.ep_comm_s == pytest.approx(2 * moe.sm_share_overlap_s(lc.ep_fwd_s, lc.fwd_s, 20 / 132))
    lc2, terms2 = _ep_terms(cl, "", True)
    assert terms2.ep_comm_s == pytest.approx(2 * overlapped(lc2.ep_fwd_s, lc2.fwd_s, cl.compute_comm_slowdown))
    lc3, terms3 = _ep_terms(cl, "deepep", False)
    assert terms3.ep_comm_s == pytest.approx(2 * lc3.ep_fwd_s)
    other = dataclasses.replace(cl, groups=tuple(dataclasses.replace(g, gpu=dataclasses.replace(g.gpu, name="X-GPU"))
                                                 for g in cl.groups))
    lc4, terms4 = _ep_terms(other, "deepep", True)
    assert terms4.ep_comm_s == pytest.approx(2 * overlapped(lc4.ep_fwd_s, lc4.fwd_s, other.compute_comm_slowdown))


def _ethernet(cl):
    return dataclasses.replace(cl, inter_node=dataclasses.replace(cl.inter_node, name="eth-2x200"))


def test_deepep_needs_an_rdma_fabric_across_nodes():
    """DeepEP's internode kernels are GPU-initiated RDMA: the search offers it only over an RDMA
    inter-node link; a plan that pins it across nodes of an Ethernet cluster is refused by the
    emitter with the reason; over InfiniBand the header states the SMs and the fabric."""
    from costmodel.moe import deepep_fabric_problem
    from emitters.base import CannotExpress
    from emitters.megatron import emit
    from planner.plan.planfile import Plan
    from planner.search.space import enumerate_candidates
    from costmodel.specs import LinkSpec
    link = LinkSpec(name="ib-ndr-400", bandwidth_bytes_per_s=50e9)
    assert deepep_fabric_problem(link) == deepep_fabric_problem(dataclasses.replace(link, name="roce-400")) == ""
    assert "eth-2x200" in deepep_fabric_problem(dataclasses.replace(link, name="eth-2x200"))
    q = get_model("qwen3-30b-a3b")
    wl = Workload(global_batch=64, seq_len=4096)
    cl = load_cluster("dgx-h100").with_gpus(32)
    fixed = dict(tp=1, pp=1, micro_batch=1)
    ib = _pairs(enumerate_candidates(q, cl, wl, fixed, 32, target="megatron"))
    eth = _pairs(enumerate_candidates(q, _ethernet(cl), wl, fixed, 32, target="megatron"))
    assert any(d == "deepep" for _, d, _ in ib) and not any(d == "deepep" for _, d, _ in eth)
    assert {(ep, o) for ep, _, o in eth} == {(ep, o) for ep, d, o in ib if d == ""}
    par = ParallelConfig(tp=1, pp=1, dp=32, ep=16, micro_batch=1, grad_accum=2, moe_dispatcher="deepep",
                         ep_overlap=True)
    plan = Plan(model=q, cluster=cl, workload=wl, parallel=par,
                stages=default_stages(q.layers, 1), estimate={})
    text = emit(plan)["megatron.sh"]
    assert "--moe-deepep-num-sms 20" in text and "NVSHMEM over InfiniBand or RoCE" in text and "ib-ndr-400" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in text
    with pytest.raises(CannotExpress, match="eth-2x200"):
        emit(dataclasses.replace(plan, cluster=_ethernet(cl)))


# ---- --delay-wgrad-compute -----------------------------------------------------------------------

def test_delayed_weight_gradients_widen_the_backward_window_by_hand():
    """Megatron's combined step issues the backward dispatch after ``mlp.backward``: without
    --delay-wgrad-compute that includes the experts' weight gradients, so the backward all-to-alls
    run beside a layer forward less those GEMMs (costmodel.moe.ep_backward_window_s). By hand:
    forward 1.0, of which expert GEMMs 0.4, all-to-alls 0.8 each way, slowdown 0.1 of the overlapped
    part: delayed 2 x (0 + 0.1 x 0.8) = 0.16; not delayed 0.08 + (0.8 - 0.6) + 0.1 x 0.6 = 0.34."""
    from costmodel.layers import LayerCost
    from costmodel.moe import ep_backward_window_s
    from costmodel.stage_terms import layer_terms
    zero = {f.name: 0.0 for f in dataclasses.fields(LayerCost)}
    lc = LayerCost(**{**zero, "fwd_s": 1.0, "expert_gemm_fwd_s": 0.4, "ep_fwd_s": 0.8})
    assert ep_backward_window_s(1.0, 0.4, True) == 1.0 and ep_backward_window_s(1.0, 0.4, False) == pytest.approx(0.6)
    assert layer_terms(lc, 0.1, ep_overlap=True, delay_wgrad=True).ep_comm_s == pytest.approx(0.16)
    assert layer_terms(lc, 0.1, ep_overlap=True, delay_wgrad=False).ep_comm_s == pytest.approx(0.34)
    # without the overlap it changes nothing: both all-to-alls exposed
    assert layer_terms(lc, 0.1, ep_overlap=False, delay_wgrad=False).ep_comm_s == pytest.approx(1.6)
    assert layer_terms(lc, 0.1, ep_overlap=False, delay_wgrad=True).ep_comm_s == pytest.approx(1.6)


def test_delay_wgrad_priced_only_with_the_overlap_and_slower_without_it():
    """Qwen3-235B-A22B on 256 H100, tp1 pp8 ep32 (EP across nodes): the overlap with delayed weight
    gradients is faster than without them, which is faster than no overlap; the layer's expert GEMM
    time is what the window loses (a field of the priced layer, not zero)."""
    from costmodel.frameworks import FRAMEWORKS
    q = get_model("qwen3-235b-a22b")
    c = load_cluster("dgx-h100").with_gpus(256)
    wl = Workload(global_batch=256, seq_len=4096)
    par = ParallelConfig(tp=1, pp=8, dp=32, ep=32, micro_batch=1, grad_accum=8, ep_overlap=True, zero=1)
    meg = FRAMEWORKS["megatron"]
    assert meg.moe.delay_wgrad                    # the Megatron file writes it with the overlap
    no = dataclasses.replace(meg, moe=dataclasses.replace(meg.moe, delay_wgrad=False))
    delayed, not_delayed = (estimate(q, c, wl, par, framework=f).time["ep_comm_s"] for f in (meg, no))
    off = estimate(q, c, wl, dataclasses.replace(par, ep_overlap=False), framework=meg).time["ep_comm_s"]
    assert delayed < not_delayed < off
    off_no = estimate(q, c, wl, dataclasses.replace(par, ep_overlap=False), framework=no).time["ep_comm_s"]
    assert off_no == off


def test_delay_wgrad_is_accepted_by_megatron_core_only_with_the_overlap():
    tc = targets_package("megatron.core.transformer.transformer_config", "megatron-core 0.16.1")
    par = _par(ep_overlap=True)
    cfg = dataclasses.replace(_transformer_config(tc, par), delay_wgrad_compute=True)
    assert cfg.delay_wgrad_compute and cfg.overlap_moe_expert_parallel_comm
    with pytest.raises((AssertionError, ValueError), match="overlap_moe_expert_parallel_comm must be enabled"):
        dataclasses.replace(_transformer_config(tc, _par()), delay_wgrad_compute=True)


# ---- HybridEP, and DeepEP over multi-node NVLink ---------------------------------------------------

def test_hybridep_rate_is_the_published_figure_by_its_sms():
    """HybridEP's share of the link is the guide's measured GB/s over the link it ran on, by SMs:
    at a measured count exactly, between two linearly, beyond them the nearest."""
    from costmodel.moe import hybridep_fraction
    assert hybridep_fraction("mnnvl", 16, False) == pytest.approx(694.1 / 900)
    assert hybridep_fraction("mnnvl", 32, True) == pytest.approx(657.72 / 900)
    assert hybridep_fraction("mnnvl", 24, False) == pytest.approx((694.1 + 714.66) / 2 / 900)
    assert hybridep_fraction("mnnvl", 64, False) == pytest.approx(714.66 / 900)
    assert hybridep_fraction("node", 2, True) == pytest.approx(191.24 / 450)
    assert hybridep_fraction("inter", 16, False) == pytest.approx(44.2 / 50)


def test_dispatch_over_multi_node_nvlink_by_hand():
    """One dispatch and one combine of EP 32 inside GB200 NVL72's NVLink domain, by hand from the
    per-direction rates: HybridEP at its 16-SM figure, DeepEP at the 400/190 GB/s Megatron-LM's
    GB200 guide measured past its 8 NVLink peers; DeepEP inside an 8-GPU host keeps its H800 rate."""
    from costmodel.moe import MoeExecution, dispatch_time_s
    gb = load_cluster("gb200-nvl72").with_gpus(72)
    nvl = gb.intra_node
    sent = 64e6
    share = 31 / 32 * sent
    for disp, (f_d, f_c) in (("hybridep", (694.1 / 900, 617.62 / 900)), ("deepep", (400 / 900, 190 / 900))):
        ex = MoeExecution(dispatcher=disp)
        d = dispatch_time_s(sent, 8, 32, 32, nvl, gb.inter_node, ex, combine=False, mnnvl=True)
        c = dispatch_time_s(sent, 8, 32, 32, nvl, gb.inter_node, ex, combine=True, mnnvl=True)
        assert d == pytest.approx(share / (f_d * nvl.bandwidth_bytes_per_s) + nvl.latency_s)
        assert c == pytest.approx(share / (f_c * nvl.bandwidth_bytes_per_s) + nvl.latency_s)
    h100 = H100_32.intra_node
    dd = dispatch_time_s(sent, 8, 8, 8, h100, H100_32.inter_node, MoeExecution(dispatcher="deepep"), combine=True)
    # DeepEP's H800 table: 153-158 GB/s over the H800's 200 GB/s per direction, the middle of the range
    assert dd == pytest.approx(7 / 8 * sent / ((153 + 158) / 2 / 200 * h100.bandwidth_bytes_per_s) + h100.latency_s)


def test_search_offers_hybridep_over_multi_node_nvlink_and_deepep_where_it_runs():
    """On GB200 NVL72 (hosts of 4 in a 72-GPU NVLink domain) Megatron's search offers HybridEP once
    the EP group leaves a host, and never DeepEP (Megatron-Core 0.16 runs multi-node NVLink with
    HybridEP only); on DGX H100 it offers DeepEP across nodes and not HybridEP, which the cost model
    prices at or below DeepEP on every tier. Pinned, either is taken."""
    from planner.search.space import enumerate_candidates
    q = get_model("qwen3-30b-a3b")
    wl = Workload(global_batch=64, seq_len=4096)
    fixed = dict(tp=1, pp=1, micro_batch=1)
    gb = _pairs(enumerate_candidates(q, load_cluster("gb200-nvl72").with_gpus(32), wl, fixed, 32, target="megatron"))
    assert {(8, "hybridep", False), (16, "hybridep", True), (8, "", False)} <= gb
    assert not any(d == "deepep" for _, d, _ in gb)
    assert not any(d == "hybridep" and ep <= 4 for ep, d, _ in gb)
    h = _pairs(enumerate_candidates(q, H100_32, wl, fixed, 32, target="megatron"))
    assert not any(d == "hybridep" for _, d, _ in h) and any(d == "deepep" for _, d, _ in h)
    pinned = _pairs(enumerate_candidates(q, H100_32, wl, dict(fixed, ep=16, moe_dispatcher="hybridep", ep_overlap=False),
                                         32, target="megatron"))
    assert pinned == {(16, "hybridep", False)}


def test_megatron_writes_hybridep_and_refuses_deepep_over_multi_node_nvlink():
    """The file writes HybridEP as the flex backend with its SMs and says how it is priced; a plan
    that pins DeepEP across GB200's hosts is refused with Megatron-Core's reason and what to plan."""
    from emitters.base import CannotExpress
    from emitters.megatron import emit
    from planner.plan.planfile import Plan
    q = get_model("qwen3-30b-a3b")
    wl = Workload(global_batch=64, seq_len=4096)
    cl = load_cluster("gb200-nvl72").with_gpus(32)
    par = ParallelConfig(tp=1, pp=1, dp=32, ep=16, micro_batch=1, grad_accum=2, moe_dispatcher="hybridep")
    plan = Plan(model=q, cluster=cl, workload=wl, parallel=par, stages=default_stages(q.layers, 1), estimate={})
    text = emit(plan)["megatron.sh"]
    assert "--moe-flex-dispatcher-backend hybridep\n  --moe-hybridep-num-sms 16\n" in text
    assert "--moe-deepep-num-sms" not in text and "HYBRIDEP_GB_PER_S" in text
    deep = dataclasses.replace(plan, parallel=dataclasses.replace(par, moe_dispatcher="deepep"))
    with pytest.raises(CannotExpress, match="plan --moe-dispatcher hybridep"):
        emit(deep)
    # planner estimate / emit's checks name it too (targets.problems)
    from planner.plan import targets as T
    assert T.problems("megatron", dataclasses.replace(plan, target="megatron")) == []
    (why,) = T.problems("megatron", dataclasses.replace(deep, target="megatron"))
    assert "moe_dispatcher deepep with ep=16 on gb200-nvl72" in why and "plan --moe-dispatcher hybridep" in why


def test_a_pinned_dispatcher_the_fabric_cannot_carry_is_refused_before_the_search():
    """--moe-dispatcher deepep with --ep 16 on GB200 NVL72 (hosts of 4): exit 2 with DeepEP's and
    Megatron-Core's reason and what to plan; with EP left free the search keeps DeepEP only inside a
    host; HybridEP across nodes of an Ethernet cluster is refused like DeepEP."""
    from planner.plan.errors import UsageError
    from planner.search.space import enumerate_candidates
    q = get_model("qwen3-30b-a3b")
    wl = Workload(global_batch=64, seq_len=4096)
    gb = load_cluster("gb200-nvl72").with_gpus(32)
    with pytest.raises(UsageError, match=r"--moe-dispatcher deepep with --ep 16 on gb200-nvl72 .*HybridEP backend only"
                                         r".*plan --moe-dispatcher hybridep"):
        enumerate_candidates(q, gb, wl, dict(tp=1, pp=1, micro_batch=1, ep=16, moe_dispatcher="deepep"), 32,
                             target="megatron")
    free = _pairs(enumerate_candidates(q, gb, wl, dict(tp=1, pp=1, micro_batch=1, moe_dispatcher="deepep"), 32,
                                       target="megatron"))
    assert free and {ep for ep, d, _ in free if ep > 1} == {2, 4} and {d for ep, d, _ in free if ep > 1} == {"deepep"}
    eth = _ethernet(H100_32)
    with pytest.raises(UsageError, match="HybridEP across nodes needs GPU-initiated RDMA"):
        enumerate_candidates(q, eth, wl, dict(tp=1, pp=1, micro_batch=1, ep=16, moe_dispatcher="hybridep"), 32,
                             target="megatron")
