"""Megatron-Core's selective recompute by module (``--recompute-modules``; ``ParallelConfig.recompute_modules``,
``costmodel.layers`` ``LayerCost.modules``): each module drops what it says it drops, counted here by hand
from the layer's shapes, and runs again what it says; the Megatron target plans the output-discarding set
for a mixture of experts and refuses what Megatron-Core refuses."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.matrices import layer_matrices
from costmodel.specs import ParallelConfig, SpecError, Workload, default_stages
from costmodel.training import estimate
from planner.plan import targets as T

ROOT = Path(__file__).resolve().parent.parent
PLANNER = str(Path(sys.executable).with_name("planner"))
SEQ = 4096


def _profile():
    """Megatron's profile with every routed token share equal (the load factor 1), so that the bytes are exact."""
    meg = T.profile_for("megatron", {})
    return dataclasses.replace(meg, moe=dataclasses.replace(meg.moe, forced_balance=True))


def _est(model: str, modules: tuple[str, ...] | None, gpus: int = 8, ep: int = 1, dtype: str = "bf16",
         recipe: str = ""):
    m = get_model(model)
    rec = "none" if modules is None else "selective"
    p = ParallelConfig(tp=1, dp=gpus, ep=ep, zero=1, micro_batch=1, grad_accum=1, recompute=rec,
                       recompute_modules=modules or ())
    wl = Workload(global_batch=gpus, seq_len=SEQ, dtype=dtype, fp8_recipe=recipe)
    cluster = load_cluster("dgx-b200" if dtype == "fp8" else "dgx-h100").with_gpus(gpus)
    return estimate(m, cluster, wl, p, stages=default_stages(m.layers, 1), framework=_profile())


def _act(e) -> float:
    return e.stages[0].memory["activations_bytes"]


def test_moe_act_drops_each_routed_copys_fc2_input():
    m = get_model("qwen3-30b-a3b")
    none, act = _est("qwen3-30b-a3b", None, ep=8), _est("qwen3-30b-a3b", ("moe_act",), ep=8)
    # every layer is MoE: top-k routed copies of each token, FC2's BF16 input (expert FFN wide) each
    assert _act(none) - _act(act) == pytest.approx(m.layers * SEQ * m.top_k * m.expert_ffn_hidden * 2, rel=1e-9)
    # the activation again: a memory-bound kernel, a small share of the step
    assert 0 < act.step_time_s - none.step_time_s < 0.02 * none.step_time_s


def test_layernorm_drops_the_separate_norms_outputs_only():
    m = get_model("qwen3-30b-a3b")
    none, ln = _est("qwen3-30b-a3b", None, ep=8), _est("qwen3-30b-a3b", ("layernorm",), ep=8)
    # an MoE layer's pre-MLP norm is a module of its own (its input norm is fused into the QKV linear)
    assert _act(none) - _act(ln) == pytest.approx(m.layers * SEQ * m.hidden * 2, rel=1e-9)
    assert ln.step_time_s > none.step_time_s
    # a dense layer's norms are fused into the next linear (TELayerNormColumnParallelLinear): nothing to drop
    d_none, d_ln = _est("llama-3-8b", None), _est("llama-3-8b", ("layernorm",))
    assert _act(d_none) == _act(d_ln) and d_none.step_time_s == d_ln.step_time_s


def test_mla_up_proj_drops_q_k_v_and_runs_the_up_projections_again():
    m = get_model("deepseek-v3")
    none, up = _est("deepseek-v3", None, gpus=64, ep=64), _est("deepseek-v3", ("mla_up_proj",), gpus=64, ep=64)
    # every layer's attention, the multi-token-prediction layer's too
    assert _act(none) - _act(up) == pytest.approx((m.layers + m.mtp_layers) * SEQ * 2 * (m.q_dim + 2 * m.kv_dim),
                                                  rel=1e-9)
    # the two up-projections of every layer again: more than their FLOPs at the peak
    up_flops = sum(2 * SEQ * mx.k * mx.n for mx in layer_matrices(m, True, 1, 64) if mx.name in ("q_up", "kv_up"))
    peak = load_cluster("dgx-h100").gpu.peak_flops_per_s["bf16"]
    assert up.step_time_s - none.step_time_s > (m.layers + m.mtp_layers) * up_flops / peak


def test_mlp_checkpoints_a_dense_mlp_and_keeps_only_its_input():
    m = get_model("llama-3-8b")
    none, mlp = _est("llama-3-8b", None), _est("llama-3-8b", ("mlp",))
    # SwiGLU: gate and up outputs (BF16), FC2's input, and the fused norm's output the MLP's FC1 kept
    per_token = (2 * 2 + 2) * m.ffn_hidden + 2 * m.hidden
    assert _act(none) - _act(mlp) == pytest.approx(m.layers * SEQ * per_token, rel=1e-9)
    # the MLP's GEMMs again: at least their FLOPs at the peak, less than a whole layer forward again
    gemm_flops = 2 * SEQ * m.hidden * 3 * m.ffn_hidden * m.layers
    peak = load_cluster("dgx-h100").gpu.peak_flops_per_s["bf16"]
    full = estimate(m, load_cluster("dgx-h100").with_gpus(8), Workload(global_batch=8, seq_len=SEQ),
                    ParallelConfig(dp=8, zero=1, recompute="full"), stages=default_stages(m.layers, 1),
                    framework=_profile())
    assert gemm_flops / peak < mlp.step_time_s - none.step_time_s < full.step_time_s - none.step_time_s


def test_moe_checkpoints_the_whole_layer_and_costs_more_than_its_parts():
    light = _est("qwen3-30b-a3b", ("moe_act", "layernorm"), ep=8)
    whole = _est("qwen3-30b-a3b", ("layernorm", "moe"), ep=8)
    # the router, the dispatch, the experts and the combine again: more time, far less stored
    assert whole.step_time_s > light.step_time_s and _act(whole) < 0.7 * _act(light)


def test_modules_sum_and_no_module_is_free():
    mods = ("moe_act", "layernorm", "shared_experts")
    m = get_model("deepseek-v3")
    assert m.shared_experts
    none = _est("deepseek-v3", None, gpus=64, ep=64)
    each = {x: _est("deepseek-v3", (x,), gpus=64, ep=64) for x in mods}
    both = _est("deepseek-v3", mods, gpus=64, ep=64)
    dropped = sum(_act(none) - _act(e) for e in each.values())
    assert _act(none) - _act(both) == pytest.approx(dropped, rel=1e-9)
    assert all(e.step_time_s > none.step_time_s for e in each.values())


def test_plan_files_carry_the_modules_only_where_they_are_read():
    par = ParallelConfig(recompute="selective", recompute_modules=["layernorm", "moe_act"])
    assert par.recompute_modules == ("moe_act", "layernorm")          # Megatron-Core's order, a tuple
    d = par.to_dict()
    assert d["recompute_modules"] == ["moe_act", "layernorm"] and ParallelConfig.from_dict(d) == par
    assert "recompute_modules" not in dataclasses.replace(par, recompute="none").to_dict()
    with pytest.raises(SpecError, match="'attn': not a module"):
        ParallelConfig(recompute="selective", recompute_modules=["attn"])
    with pytest.raises(SpecError, match="list of module names"):
        ParallelConfig(recompute="selective", recompute_modules="moe_act")


def test_the_target_plans_the_output_discarding_set_for_a_mixture_of_experts():
    qwen, dsv3, llama = get_model("qwen3-30b-a3b"), get_model("deepseek-v3"), get_model("llama-3-8b")
    bf16 = Workload(global_batch=8, seq_len=SEQ)
    assert T.selective_modules("megatron", qwen, bf16) == ("moe_act", "layernorm")
    assert T.selective_modules("megatron", dsv3, bf16) == ("moe_act", "layernorm", "mla_up_proj")
    # Megatron-Core refuses moe_act and layernorm under delayed FP8 scaling
    delayed = dataclasses.replace(bf16, dtype="fp8", fp8_recipe="delayed")
    assert T.selective_modules("megatron", dsv3, delayed) == ("mla_up_proj",)
    assert T.selective_modules("megatron", qwen, dataclasses.replace(delayed, fp8_recipe="mxfp8")) == (
        "moe_act", "layernorm")
    # a dense model keeps Megatron's default (core_attn); torchtitan's selective is its own
    assert T.selective_modules("megatron", llama, bf16) == ()
    assert T.selective_modules("torchtitan", qwen, bf16) == ()


def _problems(target: str, model: str, modules: tuple[str, ...], wl: Workload | None = None) -> list[str]:
    par = ParallelConfig(dp=8, ep=8 if get_model(model).is_moe else 1, zero=1, recompute="selective",
                         recompute_modules=modules)
    return T.config_problems(target, get_model(model), wl or Workload(global_batch=8, seq_len=SEQ), par)


def test_what_megatron_core_refuses_is_refused_with_what_to_plan():
    (p,) = [x for x in _problems("megatron", "llama-3-8b", ("moe_act", "layernorm")) if "recompute_modules" in x]
    assert "has none" in p and "--recompute-modules layernorm" in p
    assert any("mla_up_proj" in x and "leave mla_up_proj out" in x
               for x in _problems("megatron", "qwen3-30b-a3b", ("mla_up_proj",)))
    delayed = Workload(global_batch=8, seq_len=SEQ, dtype="fp8", fp8_recipe="delayed")
    assert any("delayed scaling" in x for x in _problems("megatron", "qwen3-30b-a3b", ("moe_act",), delayed))
    assert any("shared experts" in x for x in _problems("megatron", "qwen3-30b-a3b", ("shared_experts",)))
    assert not [x for x in _problems("megatron", "deepseek-v3", ("moe_act", "layernorm", "mla_up_proj", "mlp"))
                if "recompute" in x]
    assert any("--recompute-modules is the Megatron target's" in x
               for x in _problems("torchtitan", "qwen3-30b-a3b", ("moe_act",)))


def _planner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PLANNER, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_estimate_prices_the_targets_modules_and_refuses_an_unknown_one():
    base = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "4096", "--ep", "8", "--recompute", "selective", "--target", "megatron", "--json"]
    out = _planner(*base)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["parallel"]["recompute_modules"] == ["moe_act", "layernorm"]
    pinned = _planner(*base, "--recompute-modules", "moe_act")
    assert json.loads(pinned.stdout)["parallel"]["recompute_modules"] == ["moe_act"]
    bad = _planner(*base, "--recompute-modules", "moe_act,attn")
    assert bad.returncode == 2 and "'attn': not a module" in bad.stderr and "Traceback" not in bad.stderr


def test_moe_holds_moe_act_and_the_shared_experts():
    # the whole MoE layer checkpointed: what moe_act and shared_experts would drop is already dropped
    whole = _est("deepseek-v3", ("moe",), gpus=64, ep=64)
    nested = _est("deepseek-v3", ("moe_act", "moe", "shared_experts"), gpus=64, ep=64)
    assert _act(nested) == _act(whole) and nested.step_time_s == whole.step_time_s


def test_a_tuple_is_checked_and_ordered_too():
    assert ParallelConfig(recompute="selective", recompute_modules=("layernorm", "moe_act", "layernorm")
                          ).recompute_modules == ("moe_act", "layernorm")
    with pytest.raises(SpecError, match="'attn': not a module"):
        ParallelConfig(recompute="selective", recompute_modules=("attn",))


def test_fp8_without_a_recipe_runs_megatrons_delayed_default():
    # the Megatron file writes no --fp8-recipe then: Megatron-Core's default, delayed, refuses moe_act and layernorm
    qwen = get_model("qwen3-30b-a3b")
    unnamed = Workload(global_batch=8, seq_len=SEQ, dtype="fp8")
    assert T.selective_modules("megatron", qwen, unnamed) == ()
    assert any("delayed scaling" in x for x in _problems("megatron", "qwen3-30b-a3b", ("moe_act",), unnamed))
