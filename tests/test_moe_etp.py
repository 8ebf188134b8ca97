"""Expert tensor parallel and EP folding (``ParallelConfig.etp``): the layout rule, the search, the
cost model's expert groups against Megatron-Core's own rank generator, and a published Megatron MoE
layout with ETP != TP planned, emitted and read back by Megatron-Core."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from costmodel.catalog import get_model
from costmodel.comm import GroupLayout, layout_for
from costmodel.frameworks import FRAMEWORKS
from costmodel.layers import layer_params
from costmodel.specs import ParallelConfig, SpecError, Workload, validate
from costmodel.training import estimate
from planner.plan.planfile import plan_from_dict
from planner.search.space import enumerate_candidates
from costmodel.files.clusters import load_cluster
from test_emit_roundtrip import megatron_as_parsed, targets_package
from test_emit_support import ROOT

QWEN = get_model("qwen3-235b-a22b")
H100_256 = load_cluster("dgx-h100").with_gpus(256)
WL = Workload(global_batch=2048, seq_len=4096)
# Megatron-MoE-ModelZoo best_practice/qwen3/readme.md: Qwen3-235B-A22B on 256 H100, TP2 EP32 PP8 ETP1 VPP4
PUBLISHED = dict(tp=2, pp=8, dp=16, ep=32, etp=1, vpp=4, sp=True, micro_batch=1, grad_accum=128,
                 schedule="interleaved")


def test_published_folded_layout_is_valid_and_the_unfolded_rule_is_unchanged():
    par = ParallelConfig(**PUBLISHED)
    validate(QWEN, H100_256, WL, par)
    assert par.folded and par.expert_dp == 1
    # etp == tp is the old rule: ep divides dp x cp
    with pytest.raises(SpecError, match=r"ep 32 must divide dp\*cp = 16"):
        validate(QWEN, H100_256, WL, ParallelConfig(**dict(PUBLISHED, etp=2)))
    # folded: etp x ep must divide the stage's tp x cp x dp, with every number in the message
    with pytest.raises(SpecError, match=r"etp\*ep = 1\*64 = 64 must divide tp\*cp\*dp = 32"):
        validate(QWEN, H100_256, WL, ParallelConfig(**dict(PUBLISHED, ep=64)))
    with pytest.raises(SpecError, match="needs sequence parallel"):
        validate(QWEN, H100_256, WL, ParallelConfig(**dict(PUBLISHED, sp=False)))
    # the plan file omits etp at its default (plans without expert TP stay as they were)
    assert "etp" not in ParallelConfig(tp=2).to_dict() and ParallelConfig(**PUBLISHED).to_dict()["etp"] == 1


def test_whole_experts_under_etp1():
    # ETP 1: each local expert whole; ETP = TP: split over TP; the local expert count is E / ep either way
    whole = layer_params(QWEN, True, 2, 32, 1).experts
    split = layer_params(QWEN, True, 2, 32, 2).experts
    assert whole == pytest.approx(2 * split)
    assert whole == pytest.approx(QWEN.num_experts / 32 * QWEN.expert_params())


def test_expert_groups_match_megatron_core_rank_generator():
    """The cost model's EP and expert-DP groups (``training.StageMesh``: ETP innermost along TP, then
    EP, then expert-DP) against Megatron-Core's RankGenerator with its default order tp-cp-ep-dp-pp:
    the same members per node, and Megatron's own check that the expert and dense grids share
    their pipeline groups."""
    ps = targets_package("megatron.core.parallel_state", "megatron-core 0.16.1")
    gpn = 8
    for tp, cp, dp, pp, ep, etp in ((2, 1, 16, 8, 32, 1), (4, 1, 8, 8, 8, 1), (2, 2, 4, 2, 16, 1), (8, 1, 4, 2, 8, 2)):
        world = tp * cp * dp * pp
        order = "tp-cp-ep-dp-pp"
        dense = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
        edp = world // (etp * ep * pp)
        expert = ps.RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
        assert dense.get_ranks("pp") == expert.get_ranks("pp")
        for group in expert.get_ranks("ep"):
            per_node = max(sum(1 for r in group if r // gpn == n) for n in {r // gpn for r in group})
            assert layout_for(ep, etp, gpn) == GroupLayout(ep, per_node), (tp, cp, dp, pp, ep, etp)
        for group in expert.get_ranks("dp"):
            per_node = max(sum(1 for r in group if r // gpn == n) for n in {r // gpn for r in group})
            assert layout_for(edp, etp * ep, gpn) == GroupLayout(edp, per_node)


def test_folding_is_searched_for_megatron_only():
    fixed = {"tp": 2, "pp": 8, "micro_batch": 1, "vpp": 4}
    meg = enumerate_candidates(QWEN, H100_256, WL, fixed, 256, target="megatron")
    assert any(c.par.etp == 1 and c.par.ep == 32 for c in meg)
    # the builtin runtime has expert parallel (inside dp, experts split over TP) but no folding
    own = enumerate_candidates(QWEN, H100_256, WL, dict(fixed, vpp=1), 256, target="builtin")
    assert any(c.par.ep > 1 for c in own) and all(not c.par.folded for c in own)


def test_folding_wins_where_ep_would_cross_nodes_unfolded():
    # TP2 with EP8: unfolded, EP strides over dp (ranks 2 apart: 4 per node, across 2 nodes);
    # folded, EP8 sits inside one node. The folded all-to-all is cheaper.
    wl = Workload(global_batch=256, seq_len=4096)
    m = get_model("mixtral-8x22b")
    cl = load_cluster("dgx-h100").with_gpus(128)
    base = dict(tp=2, pp=8, dp=8, ep=8, vpp=7, sp=True, micro_batch=1, grad_accum=32, schedule="interleaved")
    unfolded = estimate(m, cl, wl, ParallelConfig(**base), framework=FRAMEWORKS["megatron"])
    folded = estimate(m, cl, wl, ParallelConfig(**dict(base, etp=1)), framework=FRAMEWORKS["megatron"])
    assert folded.time["ep_comm_s"] < unfolded.time["ep_comm_s"]


@pytest.mark.subprocess
def test_published_etp1_layout_planned_emitted_and_read_by_megatron_core(tmp_path):
    out = tmp_path / "plan.yaml"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--model", "qwen3-235b-a22b", "--cluster",
                        "dgx-h100", "--gpus", "256", "--global-batch", "2048", "--seq-len", "4096", "--target",
                        "megatron", "--tp", "2", "--pp", "8", "--ep", "32", "--etp", "1", "--vpp", "4",
                        "--micro-batch", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    plan = plan_from_dict(yaml.safe_load(out.read_text()))
    p = plan.parallel
    assert (p.tp, p.pp, p.ep, p.etp) == (2, 8, 32, 1)
    a, world, files = megatron_as_parsed(plan, tmp_path)
    assert (a.expert_tensor_parallel_size, a.expert_model_parallel_size) == (1, 32)
    # priced = written: the profile's MoE execution is what the file sets
    # (the plan's own MoE execution where it chose one: DeepEP is Megatron's flex dispatcher)
    ex = FRAMEWORKS["megatron"].moe
    if p.moe_dispatcher == "deepep":
        assert (a.moe_token_dispatcher_type, a.moe_flex_dispatcher_backend) == ("flex", "deepep")
    else:
        assert a.moe_token_dispatcher_type == ex.dispatcher
    assert a.overlap_moe_expert_parallel_comm == p.ep_overlap
    assert (a.moe_permute_fusion, a.moe_router_fusion, a.moe_grouped_gemm) == (ex.permute_fusion, ex.router_fusion,
                                                                              True)
    assert a.moe_router_load_balancing_type == "aux_loss" and a.moe_aux_loss_coeff == pytest.approx(1e-3)
    # Megatron-Core's own objects take the parsed values: the expert grid (initialize_model_parallel's
    # RankGenerator pair and its pipeline-group check) and the MoE settings (TransformerConfig's
    # __post_init__ checks; the TE-only fusions are off here: Transformer Engine is not installed)
    ps = targets_package("megatron.core.parallel_state", "megatron-core 0.16.1")
    tc = targets_package("megatron.core.transformer.transformer_config", "megatron-core 0.16.1")
    import torch
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    etp, ep = a.expert_tensor_parallel_size, a.expert_model_parallel_size
    assert world % (etp * ep * pp) == 0
    dense = ps.RankGenerator(tp=tp, ep=1, dp=world // (tp * pp * cp), pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    expert = ps.RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    assert dense.get_ranks("pp") == expert.get_ranks("pp")
    cfg = tc.TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups, ffn_hidden_size=a.ffn_hidden_size, num_moe_experts=a.num_experts,
        moe_router_topk=a.moe_router_topk, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16, bf16=True,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, sequence_parallel=a.sequence_parallel,
        moe_token_dispatcher_type=a.moe_token_dispatcher_type, moe_grouped_gemm=a.moe_grouped_gemm,
        moe_router_load_balancing_type=a.moe_router_load_balancing_type, moe_aux_loss_coeff=a.moe_aux_loss_coeff,
        moe_router_dtype=a.moe_router_dtype)
    assert (cfg.expert_tensor_parallel_size, cfg.expert_model_parallel_size) == (1, 32)
    fields = {f for f in tc.TransformerConfig.__dataclass_fields__}
    assert {"moe_permute_fusion", "moe_router_fusion", "moe_flex_dispatcher_backend"} <= fields


def test_deepseek_router_flags_are_megatron_core_fields():
    from emitters.megatron import moe_args
    from test_emit_support import make_plan
    plan = make_plan("deepseek-v3", gpus=64, gb=64, seq=4096, cluster="dgx-h100", tp=1, pp=8, dp=8, ep=8)
    args = [str(x) for x in moe_args(plan)]
    tc = targets_package("megatron.core.transformer.transformer_config", "megatron-core 0.16.1")
    fields = set(tc.TransformerConfig.__dataclass_fields__)
    for flag in (x for x in args if x.startswith("--")):
        assert flag[2:].replace("-", "_") in fields, flag
    assert args[args.index("--moe-router-score-function") + 1] == "sigmoid"
    assert args[args.index("--moe-router-group-topk") + 1] == "4"
    assert "--moe-router-enable-expert-bias" in args


def test_etp_on_a_dense_model_is_refused_with_a_hint():
    from planner.plan.errors import UsageError
    dense = get_model("llama-3-8b")
    with pytest.raises(UsageError, match="--etp 1 but llama-3-8b has no experts"):
        enumerate_candidates(dense, load_cluster("dgx-h100").with_gpus(8), WL, {"etp": 1}, 8)
    with pytest.raises(UsageError, match="divide qwen3-235b-a22b's expert FFN width 1536"):
        enumerate_candidates(QWEN, H100_256, WL, {"etp": 7}, 256)
