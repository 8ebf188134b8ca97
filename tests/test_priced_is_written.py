"""Priced = written: a plan's price rests only on what its launch files set.

For each training target, the demo's plan (``plans/llama-3-70b-64xh100.yaml``), the target's example
plans (``plans/<target>/``) and a spread of configurations are emitted; each file is parsed back with
the framework's own parser where it installs (.venv-targets: DeepSpeed's ``DeepSpeedConfig`` and
launcher parser, torchtitan's ``ConfigManager``, Accelerate's launch parser and plugins; Megatron-LM's
training flags through the documented-flags parser of ``test_emit_roundtrip``, megatron-core's layout
parser where it installs), and every assumption the price rests on is derived from the parsed files
alone: degrees, batch, stage split, recompute, dtype, the model's shape where the file states it, and
the overlaps the file turns on. What no flag can set (the framework's kernel efficiency, memory
headroom, the attention kernel) is read from the ``priced-assumptions:`` header line the file states,
and engine facts from its ``engine facts:`` line. The plan is then re-priced with a profile built from
those and the price must equal the plan's, to the last bit.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
import sys
from pathlib import Path

import pytest

from costmodel.frameworks import FrameworkProfile
from costmodel.moe import MEGATRON_LAYER_HOST_S, MoeExecution
from costmodel.specs import ParallelConfig, Workload, stages_from_counts
from costmodel.training import estimate
from emitters import CannotExpress, get
from emitters.recipe import PRICED_TAG
from planner.cli.explain import plan_estimate
from planner.plan.planfile import Plan, read_plan
from test_emit_roundtrip import (megatron_as_parsed, megatron_layers_per_stage, megatron_vpp, targets_package, torchrun_args)
from test_emit_support import ROOT, make_plan, run_script, split_module_args, write

pytestmark = pytest.mark.subprocess      # the emitted scripts run (their launchers replaced by a recorder)

TARGETS = ("megatron", "deepspeed", "torchtitan", "accelerate")
DEMO = ROOT / "plans" / "llama-3-70b-64xh100.yaml"
SPREAD_PER_TARGET = 24


# --------------------------------------------------------------------------------------
# The plans: the demo's, the target's examples, and a spread of configurations
# --------------------------------------------------------------------------------------

def _emits(plan: Plan, target: str) -> bool:
    try:
        get(target).emit(plan)
        return True
    except CannotExpress:
        return False


def _spread(target: str) -> list[tuple[str, Plan]]:
    """Configurations over models, degrees, ZeRO stages, recompute, sequence parallel and DP overlap,
    in a fixed order; the first ``SPREAD_PER_TARGET`` the target emits."""
    models = [("llama-3-8b", 8), ("llama-3-70b", 64), ("mixtral-8x7b", 32), ("gpt3-1.3b", 8), ("llama-3.1-8b", 16),
              ("llama-2-13b", 16)]
    out: list[tuple[str, Plan]] = []
    grid = itertools.product((1, 2, 4, 8, 16), (1, 2, 4), (0, 1, 2, 3), ("none", "selective", "full"),
                             (True, False), (True, False))
    combos = list(grid)
    seen: set = set()
    for n, (tp, pp, zero, rec, sp, overlap) in enumerate(combos * len(models)):
        i = n % len(combos)
        model, gpus = models[(i + n // len(combos)) % len(models)]     # each pass gives a combo another model
        if gpus % (tp * pp) or (sp and tp == 1):
            continue
        dp = gpus // (tp * pp)
        ep = 8 if model == "mixtral-8x7b" and dp % 8 == 0 else 1
        accum = 8 if pp > 1 else 2
        vpp = 2 if pp > 1 and i % 3 == 0 else 1
        par = dict(tp=tp, pp=pp, dp=dp, ep=ep, zero=zero, sp=sp, vpp=vpp, micro_batch=1, grad_accum=accum,
                   recompute=rec, overlap_dp_comm=overlap)
        if vpp > 1:
            par["schedule"] = "interleaved"
        try:
            plan = make_plan(model, gpus=gpus, gb=dp * accum, seq=2048, cluster="dgx-h100", **par)
        except ValueError:
            continue
        plan = plan.replace(target=target)
        key = (model, tp, pp, vpp, zero, rec, sp, overlap)
        if key not in seen and _emits(plan, target):
            seen.add(key)
            out.append((f"{model}-tp{tp}-pp{pp}-vpp{vpp}-dp{dp}-ep{ep}-z{zero}-{rec}-sp{int(sp)}-ov{int(overlap)}",
                        plan))
        if len(out) == SPREAD_PER_TARGET:
            break
    return out


# torchtitan Float8 (torchao rowwise, what torchtitan 0.3.0 writes): FSDP, TP with SP under compile and
# async TP, pipeline stages with selective AC; name -> (model, gpus, parallel, framework settings)
FLOAT8_PLANS = {
    "8b-fsdp8": ("llama-3-8b", 8, dict(dp=8, zero=3, grad_accum=2), {}),
    "8b-fsdp8-compile": ("llama-3.1-8b", 8, dict(dp=8, zero=3, grad_accum=2, recompute="selective"), {"compile": True}),
    "70b-tp8-fsdp8-asynctp": ("llama-3-70b", 64, dict(tp=8, sp=True, dp=8, zero=3, grad_accum=2, recompute="full"),
                              {"compile": True, "async_tp": True}),
    "70b-pp4-tp2-fsdp8": ("llama-3-70b", 64, dict(tp=2, sp=True, pp=4, dp=8, zero=2, grad_accum=8), {}),
    # torchao's MXFP8Linear (MXFP8LinearConverter) on B200: FSDP with compile, and TP with SP
    "8b-fsdp8-compile-mxfp8": ("llama-3.1-8b", 8, dict(dp=8, zero=3, grad_accum=2), {"compile": True}),
    "70b-tp4-fsdp8-mxfp8": ("llama-3-70b", 32, dict(tp=4, sp=True, dp=8, zero=3, grad_accum=2, recompute="full"), {}),
}


# torchtitan mixture-of-experts (its stock qwen3 / gpt_oss flavors, expert parallel); deepseek_v3 is the
# example plan plans/torchtitan/deepseek-v3-2048xh100.yaml
MOE_PLANS = {
    "qwen3-30b-a3b-fsdp16-ep8": ("qwen3-30b-a3b", 16, dict(dp=16, ep=8, zero=3, grad_accum=2), {}),
    "qwen3-30b-a3b-pp2-fsdp8-ep4": ("qwen3-30b-a3b", 16, dict(pp=2, dp=8, ep=4, zero=2, grad_accum=8,
                                                             recompute="full"), {}),
    "gpt-oss-20b-fsdp8-ep8": ("gpt-oss-20b", 8, dict(dp=8, ep=8, zero=3, grad_accum=2, recompute="selective"),
                              {"compile": True}),
    # EP next to TP: whole experts over the TP ranks (torchtitan's efsdp mesh; the folded layout, etp 1)
    "qwen3-30b-a3b-tp2-fsdp8-ep8": ("qwen3-30b-a3b", 16, dict(tp=2, sp=True, dp=8, ep=8, etp=1, zero=3,
                                                             grad_accum=2), {}),
    # framework.mxfp8_experts: the routed experts' grouped GEMMs in torchao's MXFP8 (on B200: SM100)
    "qwen3-30b-a3b-fsdp16-ep8-mxfp8-experts": ("qwen3-30b-a3b", 16, dict(dp=16, ep=8, zero=3, grad_accum=2),
                                               {"mxfp8_experts": True, "compile": True}),
    # --dtype fp8 --fp8-recipe mxfp8: every linear but the router's gate and the experts in torchao's MXFP8 (B200)
    "qwen3-30b-a3b-fsdp16-ep8-mxfp8": ("qwen3-30b-a3b", 16, dict(dp=16, ep=8, zero=3, grad_accum=2), {"compile": True}),
    "gpt-oss-20b-fsdp8-ep8-mxfp8": ("gpt-oss-20b", 8, dict(dp=8, ep=8, zero=3, grad_accum=2, recompute="selective"),
                                    {"compile": True}),
}


# torchtitan's interleaved schedule over an uneven split (any layers per model part): the 126 layers of
# Llama 3.1 405B on pp8 x vpp2 (torchtitan's published 512-GPU run), and 32 layers in 3 chunks per rank
UNEVEN_VPP_PLANS = {
    "405b-pp8-vpp2": ("llama-3.1-405b", 512, dict(tp=8, sp=True, pp=8, vpp=2, dp=8, zero=3, grad_accum=16,
                                                  schedule="interleaved", recompute="full")),
    "8b-pp4-vpp3": ("llama-3.1-8b", 32, dict(pp=4, vpp=3, dp=8, zero=2, grad_accum=12, schedule="interleaved")),
}


def uneven_vpp_plan(which: str) -> Plan:
    model, gpus, par = UNEVEN_VPP_PLANS[which]
    dp, accum = par["dp"], par["grad_accum"]
    plan = make_plan(model, gpus=gpus, gb=dp * accum, seq=4096, cluster="dgx-h100", micro_batch=1, **par)
    return plan.replace(target="torchtitan")


def moe_plan(which: str) -> Plan:
    model, gpus, par, switches = MOE_PLANS[which]
    dp, accum = par["dp"], par["grad_accum"]
    mx = which.endswith("-mxfp8")         # the workload in torchao's MXFP8
    cluster = "dgx-b200" if switches.get("mxfp8_experts") or mx else "dgx-h100"
    plan = make_plan(model, gpus=gpus, gb=dp * accum, seq=4096, cluster=cluster, micro_batch=1, **par)
    if mx:
        plan = plan.replace(workload=dataclasses.replace(plan.workload, dtype="fp8", fp8_recipe="mxfp8"))
    return plan.replace(target="torchtitan", framework=switches)


def float8_plan(which: str) -> Plan:
    model, gpus, par, switches = FLOAT8_PLANS[which]
    dp, accum = par["dp"], par["grad_accum"]
    mx = which.endswith("-mxfp8")        # torchao's MXFP8Linear, on Blackwell
    plan = make_plan(model, gpus=gpus, gb=dp * accum, seq=4096, cluster="dgx-b200" if mx else "dgx-h100",
                     micro_batch=1, **par)
    wl = dataclasses.replace(plan.workload, dtype="fp8", fp8_recipe="mxfp8" if mx else "rowwise")
    return plan.replace(target="torchtitan", workload=wl, framework=switches)
# the MoE execution choices a plan carries (ParallelConfig.moe_dispatcher / ep_overlap): each
# written by the Megatron file and read back
MOE_CHOICES = {"alltoall-overlap": dict(ep_overlap=True), "deepep": dict(moe_dispatcher="deepep"),
               "deepep-overlap": dict(moe_dispatcher="deepep", ep_overlap=True),
               "deepep-pp2-vpp2-overlap": dict(moe_dispatcher="deepep", ep_overlap=True, pp=2, dp=16, vpp=2,
                                               schedule="interleaved", grad_accum=8),
               # HybridEP over GB200 NVL72's multi-node NVLink (EP 8 over two trays of 4)
               "hybridep-gb200": dict(moe_dispatcher="hybridep", cluster="gb200-nvl72"),
               "hybridep-gb200-overlap": dict(moe_dispatcher="hybridep", ep_overlap=True, cluster="gb200-nvl72"),
               # selective recompute by module (--recompute-modules; ParallelConfig.recompute_modules)
               "recompute-moe-act-layernorm": dict(recompute="selective", recompute_modules=("moe_act", "layernorm")),
               "recompute-moe": dict(recompute="selective", recompute_modules=("layernorm", "moe")),
               # fine-grained activation offloading (--offload-modules; ParallelConfig.offload_modules)
               "offload-experts": dict(offload_modules=("expert_fc1", "moe_act")),
               "offload-act-overlap-recompute": dict(offload_modules=("moe_act",), ep_overlap=True,
                                                     recompute="selective", recompute_modules=("moe_act", "layernorm"))}


def _moe_plan(choice: str) -> Plan:
    par = dict(tp=1, pp=1, dp=32, ep=8, zero=1, micro_batch=1, grad_accum=2)
    par.update(MOE_CHOICES[choice])
    cluster = par.pop("cluster", "dgx-h100")
    plan = make_plan("mixtral-8x7b", gpus=32, gb=par["dp"] * par["grad_accum"], seq=2048, cluster=cluster, **par)
    return plan.replace(target="megatron")


# Megatron's framework settings (planner.plan.targets.SWITCHES): NeMo 24.07's Nemotron-4 340B recipe as
# tests/test_targets_recipes.py prices it (FP8, BF16 gradients and Adam moments), and Llama 3 8B in BF16
SWITCH_PLANS = {
    "nemotron4-340b-fp8-bf16-state": ("nemotron-4-340b", 128, dict(tp=8, pp=8, dp=2, vpp=12, sp=True, micro_batch=1,
                                      grad_accum=16, zero=1, recompute="selective", schedule="interleaved"), "fp8",
                                      {"grads_bf16": True, "adam_moments_bf16": True}),
    "llama3-8b-bf16-moments": ("llama-3-8b", 8, dict(dp=8, zero=1, grad_accum=4), "bf16", {"adam_moments_bf16": True}),
}


def _switch_plan(which: str) -> Plan:
    model, gpus, par, dtype, switches = SWITCH_PLANS[which]
    if model == "nemotron-4-340b":
        from costmodel.catalog import from_hf_config
        m = from_hf_config(json.loads((ROOT / "tests/data/hf/nemotron-4-340b.json").read_text()), model)
        from costmodel.files.clusters import load_cluster
        from costmodel.specs import default_stages
        p = ParallelConfig(**par)
        return Plan(model=m, cluster=load_cluster("dgx-h100").with_gpus(gpus),
                    workload=Workload(global_batch=p.dp * p.grad_accum, seq_len=4096, dtype=dtype), parallel=p,
                    stages=default_stages(m.layers, p.pp), target="megatron", framework=switches)
    plan = make_plan(model, gpus=gpus, gb=par["dp"] * par["grad_accum"], seq=4096, cluster="dgx-h100", micro_batch=1,
                     **par)
    return plan.replace(target="megatron", workload=dataclasses.replace(plan.workload, dtype=dtype),
                        framework=switches)


# NVFP4 on Blackwell (costmodel.fp8.nvfp4): Llama 3 8B at TP 2 with sequence parallelism on a GB200 rack, where a
# BF16 or FP8 plan would turn on --tp-comm-overlap and NVFP4 cannot (costmodel.frameworks.NO_TP_OVERLAP_DTYPES), and
# the MoE path on a B200 node
NVFP4_PLANS = {
    "llama3-8b-gb200-tp2-sp": ("llama-3-8b", "gb200-nvl72", 8, dict(tp=2, dp=4, sp=True, micro_batch=1, grad_accum=2,
                                                                    zero=1)),
    "mixtral-8x7b-b200-ep8": ("mixtral-8x7b", "dgx-b200", 8, dict(tp=1, dp=8, ep=8, micro_batch=1, grad_accum=2,
                                                                  zero=1, recompute="full")),
}


def _nvfp4_plan(which: str) -> Plan:
    model, cluster, gpus, par = NVFP4_PLANS[which]
    plan = make_plan(model, gpus=gpus, gb=par["dp"] * par["grad_accum"] * par["micro_batch"], seq=4096,
                     cluster=cluster, **par)
    return plan.replace(target="megatron", workload=dataclasses.replace(plan.workload, dtype="nvfp4"))


def _cases() -> list:
    cases = [pytest.param("megatron", "demo", id="megatron-demo")]
    cases += [pytest.param("megatron", f"switch:{k}", id=f"megatron-switch-{k}") for k in SWITCH_PLANS]
    cases += [pytest.param("megatron", f"nvfp4:{k}", id=f"megatron-nvfp4-{k}") for k in NVFP4_PLANS]
    cases += [pytest.param("torchtitan", f"float8:{k}", id=f"torchtitan-float8-{k}") for k in FLOAT8_PLANS]
    cases += [pytest.param("torchtitan", f"moe:{k}", id=f"torchtitan-moe-{k}") for k in MOE_PLANS]
    cases += [pytest.param("torchtitan", f"vpp:{k}", id=f"torchtitan-uneven-vpp-{k}") for k in UNEVEN_VPP_PLANS]
    cases += [pytest.param("megatron", f"moechoice:{c}", id=f"megatron-moe-{c}") for c in MOE_CHOICES]
    for t in TARGETS:
        for f in sorted((ROOT / "plans" / t).glob("*.yaml")):
            cases.append(pytest.param(t, f"file:{f.name}", id=f"{t}-{f.stem}"))
        cases += [pytest.param(t, f"spread:{i}", id=f"{t}-spread{i}") for i in range(SPREAD_PER_TARGET)]
    return cases


_SPREADS: dict[str, list] = {}


def _plan(target: str, which: str) -> Plan | None:
    if which == "demo":
        return read_plan(DEMO)
    if which.startswith("vpp:"):
        return uneven_vpp_plan(which[4:])
    if which.startswith("moe:"):
        return moe_plan(which[4:])
    if which.startswith("float8:"):
        return float8_plan(which[7:])
    if which.startswith("switch:"):
        return _switch_plan(which[7:])
    if which.startswith("nvfp4:"):
        return _nvfp4_plan(which[6:])
    if which.startswith("moechoice:"):
        return _moe_plan(which[10:])
    if which.startswith("file:"):
        return read_plan(ROOT / "plans" / target / which[5:])
    if target not in _SPREADS:
        _SPREADS[target] = _spread(target)
    i = int(which.split(":")[1])
    return _SPREADS[target][i][1] if i < len(_SPREADS[target]) else None


def test_spread_is_wide_enough():
    # the proof asks for the demo's plan and at least 20 others per training target
    for t in TARGETS:
        assert len(_spread(t)) >= 20, f"{t}: only {len(_spread(t))} spread plans emit"


# --------------------------------------------------------------------------------------
# What a header states (the assumptions no flag sets)
# --------------------------------------------------------------------------------------

def header_assumptions(text: str) -> dict:
    m = re.search(re.escape(PRICED_TAG) + r" (.*)", text)
    assert m, "the file does not state the assumptions no flag sets"
    kv = dict(w.split("=", 1) for w in m.group(1).split())
    return {"kernel_efficiency": float(kv["kernel_efficiency"]),
            "memory_headroom_fraction": float(kv["memory_headroom_fraction"]),
            "attention_kernel": kv["attention_kernel"], "elementwise": kv["elementwise"],
            "attention": "" if kv["attention_impl"] == "-" else kv["attention_impl"],
            "launch": kv["launch"], "dp_bucket": kv["dp_bucket"]}


def kernels_of(h: dict) -> dict:
    """The profile fields a header states: memory-bound kind, attention implementation, how the host
    issues the kernels, the framework's default data-parallel bucket."""
    return {"elementwise": h["elementwise"], "attention": h["attention"], "launch": h["launch"],
            "dp_bucket": h["dp_bucket"]}


def engine_facts(text: str) -> str:
    m = re.search(r"engine facts: (.*)", text)
    return m.group(1) if m else ""


# --------------------------------------------------------------------------------------
# Each target's files -> (model, workload, parallel config, stages, order, profile)
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class AsWritten:
    model: object
    workload: Workload
    par: ParallelConfig
    stages: tuple
    profile: FrameworkProfile
    world: int


def _adam_moments_bf16(a) -> bool:
    """Adam's moments in BF16, from Megatron's precision-aware optimizer flags; its own checks
    (megatron/core/optimizer/optimizer_config.py OptimizerConfig.__post_init__: Adam, the distributed
    optimizer), and only the dtypes the cost model prices (costmodel.memory.adam_state_bytes_bf16_moments)."""
    if not a.use_precision_aware_optimizer:
        assert (a.exp_avg_dtype, a.exp_avg_sq_dtype, a.main_params_dtype) == ("fp32", "fp32", "fp32")
        return False
    assert a.optimizer == "adam" and a.use_distributed_optimizer
    assert (a.exp_avg_dtype, a.exp_avg_sq_dtype, a.main_params_dtype) == ("bf16", "bf16", "fp32"), "unpriced dtypes"
    return True


def _recompute_layers(counts: list[int], per: list[int] | None) -> int:
    """ParallelConfig.recompute_layers for a full recompute of ``per`` layers per stage: -1 for all."""
    return -1 if not per or per == counts else per[0]


def _stages(counts: list[int], recompute: list[int] | None = None) -> tuple:
    st = stages_from_counts(counts)
    if recompute:
        st = tuple(dataclasses.replace(s, recompute_layers=r) for s, r in zip(st, recompute))
    return st


# Megatron's --attention-backend as the cost model's kernel: ``auto`` is Transformer Engine's own choice,
# a fused kernel (cuDNN on Hopper+, FlashAttention on Ampere); ``unfused`` stores the scores. ``local`` is
# Megatron's own PyTorch path, which the emitter never writes.
MEGATRON_KERNEL = {"auto": "flash", "fused": "flash", "flash": "flash", "unfused": "materialized"}
# the attention implementation Megatron's --attention-backend runs (costmodel.attention): auto leaves
# the choice to Transformer Engine; unfused has no fused kernel (the workload says materialized)
MEGATRON_ATTENTION = {"auto": "te", "unfused": "te"}


def _fused_mlp(a, text: str) -> bool:
    """Whether the file runs Transformer Engine's fused grouped MLP: Megatron-Core's GroupedMLP takes it with
    the op fuser and the CuTe DSL switch exported (moe/experts.py ``_is_fused_impl_supported``, core_v0.19.0)."""
    fused = bool(a.use_transformer_engine_op_fuser) and "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in text
    assert not fused or a.moe_mlp_glu_interleave_size == 32, "the CuTe DSL kernel's interleaved GLU rows"
    return fused


def megatron_as_written(plan: Plan, tmp: Path) -> AsWritten:
    a, world, out = megatron_as_parsed(plan, tmp)
    text = (out / "megatron.sh").read_text()
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    dp = world // (tp * pp * cp)
    if a.use_megatron_fsdp:
        zero = {"optim_grads": 2, "optim_grads_params": 3}[a.data_parallel_sharding_strategy]
    else:
        zero = 1 if a.use_distributed_optimizer else 0
    dp_shard = dp // (a.num_distributed_optimizer_instances or 1) if zero == 1 else dp
    vpp = megatron_vpp(a)
    counts = megatron_layers_per_stage(a) if not (vpp > 1 and not a.pipeline_model_parallel_layout) \
        else [a.num_layers // pp] * pp
    recompute, per = "none", None
    if a.recompute_granularity == "selective":
        recompute = "selective"
    elif a.recompute_granularity == "full":
        recompute = "full"
        if a.recompute_method == "uniform":
            assert a.recompute_num_layers == 1          # every layer's input checkpointed
            per = counts
        else:                                           # block: the first N of each virtual stage
            per = [min(a.recompute_num_layers * vpp, c) for c in counts]
    if a.tp_comm_overlap:
        # Megatron's own check (arguments.py), and the userbuffers' reach: one NVLink domain
        assert a.sequence_parallel and tp <= plan.cluster.nvlink_gpus and a.tp_comm_bootstrap_backend
    # the EP overlap and the dispatcher as the plan sets them (and the file writes them)
    assert a.overlap_moe_expert_parallel_comm == plan.parallel.ep_overlap
    # Megatron-Core accepts --delay-wgrad-compute only with the overlap (TransformerConfig); the
    # overlap's price assumes it (costmodel.moe.ep_backward_window_s)
    assert a.delay_wgrad_compute == plan.parallel.ep_overlap
    flex = a.moe_token_dispatcher_type == "flex"
    backend = a.moe_flex_dispatcher_backend if flex else ""
    assert flex == (plan.parallel.moe_dispatcher in ("deepep", "hybridep"))
    assert not flex or backend == plan.parallel.moe_dispatcher
    # the backend's SMs (DeepEP's priced as compute lost while it overlaps, HybridEP's rate by them): written,
    # never Megatron's default assumed
    assert (a.moe_deepep_num_sms is not None) == (backend == "deepep")
    assert (a.moe_hybridep_num_sms is not None) == (backend == "hybridep")
    h = header_assumptions(text)
    # Megatron's linear layers overlap the backward's column-parallel collectives without any flag
    assert "column-parallel input-gradient collectives" in engine_facts(text)
    prof = FrameworkProfile(name="megatron", tp_comm_overlap=a.tp_comm_overlap, tp_comm_overlap_backward=True,
                            overlap_grad_reduce=a.overlap_grad_reduce, overlap_param_gather=a.overlap_param_gather,
                            ep_comm_overlap=a.overlap_moe_expert_parallel_comm,
                            kernel_efficiency=h["kernel_efficiency"],
                            memory_headroom_fraction=h["memory_headroom_fraction"], elementwise=h["elementwise"],
                            attention=MEGATRON_ATTENTION[a.attention_backend], launch=h["launch"],
                            # no --ddp-bucket-size written: Megatron-Core's default bucket, which the header names
                            dp_bucket=h["dp_bucket"] if getattr(a, "ddp_bucket_size", None) is None else "torch",
                            moe=MoeExecution(dispatcher=backend or a.moe_token_dispatcher_type or "alltoall",
                                             permute_fusion=a.moe_permute_fusion, router_fusion=a.moe_router_fusion,
                                             capacity_factor=a.moe_expert_capacity_factor or 0.0,
                                             # TE's GroupedLinear (one GEMM per expert) unless the legacy kernel
                                             # or TE's fused grouped MLP (the op fuser with its CuTe DSL switch)
                                             per_expert_gemms=(a.moe_grouped_gemm and not a.moe_use_legacy_grouped_gemm
                                                               and not _fused_mlp(a, text)),
                                             fused_grouped_mlp=_fused_mlp(a, text),
                                             # eager MoE layers: the host time of costmodel.moe, unless graphed
                                             layer_host_s=MEGATRON_LAYER_HOST_S if a.cuda_graph_impl == "none" else 0.0,
                                             deepep_sms=a.moe_deepep_num_sms or MoeExecution().deepep_sms,
                                             hybridep_sms=a.moe_hybridep_num_sms or MoeExecution().hybridep_sms,
                                             # the EP overlap's backward beside the delayed weight gradients
                                             delay_wgrad=a.delay_wgrad_compute),
                            grads_bf16=a.grad_reduce_in_bf16, adam_moments_bf16=_adam_moments_bf16(a),
                            # Megatron's selective recompute is per module; core_attn is its default (the file's
                            # other module sets are read into ParallelConfig.recompute_modules below)
                            selective_recompute="core_attn",
                            # Megatron's NaN/Inf checks of each gradient bucket and loss, on unless the file
                            # writes --no-check-for-nan-in-loss-and-grad (costmodel.stage_terms.nan_check_s)
                            nan_checks=a.check_for_nan_in_loss_and_grad)
    m = plan.model
    fields = dict(layers=a.num_layers, hidden=a.hidden_size, ffn_hidden=a.ffn_hidden_size, heads=a.num_attention_heads,
                  kv_heads=a.num_query_groups or a.num_attention_heads, vocab=a.vocab_size + 1,
                  mlp="swiglu" if a.swiglu else "gelu", norm="rmsnorm" if a.normalization == "RMSNorm" else "layernorm",
                  norm_eps=a.norm_epsilon, tied_embeddings=not a.untie_embeddings_and_output_weights,
                  bias=not a.disable_bias_linear, qkv_bias=a.add_qkv_bias or not a.disable_bias_linear and m.qkv_bias,
                  positions="rotary" if a.position_embedding_type == "rope" else "learned")
    if not a.multi_latent_attention:
        fields["head_dim"] = a.kv_channels
    if a.position_embedding_type == "rope":
        fields.update(rope_theta=float(a.rotary_base), rope_scaling=a.rope_scaling_factor if a.use_rope_scaling else 0.0)
    if a.num_experts:
        fields.update(num_experts=a.num_experts, top_k=a.moe_router_topk, expert_ffn_hidden=a.moe_ffn_hidden_size)
        assert a.moe_aux_loss_coeff and a.moe_aux_loss_coeff > 0     # balanced routing, as priced
    model = dataclasses.replace(m, **fields)
    assert not (a.fp8_format and a.fp4_format), "Megatron refuses --fp4-format with --fp8-format"
    assert not a.fp4_param_gather, "FP4 parameter gather is not priced"
    dtype = ("nvfp4" if a.fp4_format == "e2m1" and a.fp4_recipe == "nvfp4" else "fp8" if a.fp8_format
             else "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32")
    recipe = {"tensorwise": "current"}.get(a.fp8_recipe, a.fp8_recipe or "") if dtype == "fp8" else ""
    wl = dataclasses.replace(plan.workload, global_batch=a.global_batch_size, seq_len=a.seq_length, dtype=dtype,
                             fp8_recipe=recipe if recipe else plan.workload.fp8_recipe if dtype == "fp8" else "",
                             fp8_param_gather=a.fp8_param_gather,
                             attention_kernel=MEGATRON_KERNEL[a.attention_backend],
                             optimizer="sgd" if a.optimizer == "sgd" else "adamw")
    assert h["attention_kernel"] == wl.attention_kernel
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=a.expert_model_parallel_size or 1,
                         etp=a.expert_tensor_parallel_size or tp, zero=zero, dp_shard=dp_shard,
                         sp=a.sequence_parallel, vpp=vpp, micro_batch=a.micro_batch_size,
                         grad_accum=a.global_batch_size // (a.micro_batch_size * dp), recompute=recompute,
                         recompute_layers=_recompute_layers(counts, per) if recompute == "full" else -1,
                         schedule="interleaved" if vpp > 1 else "1f1b",
                         overlap_dp_comm=a.overlap_grad_reduce or dp * cp == 1,
                         recompute_modules=tuple(a.recompute_modules or ())
                         if recompute == "selective" and (a.recompute_modules or ["core_attn"]) != ["core_attn"] else (),
                         offload_modules=tuple(a.offload_modules or ()) if a.fine_grained_activation_offloading else ())
    if a.fine_grained_activation_offloading:
        # Megatron-LM asserts without it under Transformer Engine 2.10+ (arguments.py at d98e8a64)
        assert "export NVTE_CPU_OFFLOAD_V1=1" in text
    return AsWritten(model, wl, par, _stages(counts, per if recompute == "full" else None), prof, world)


def deepspeed_as_written(plan: Plan, tmp: Path) -> AsWritten:
    dsc = targets_package("deepspeed.runtime.config", "DeepSpeed 0.19.8")
    from deepspeed.launcher import runner
    out = write(plan, "deepspeed", tmp / "out")
    script = tmp / "train.py"
    script.write_text("# the user's training script\n")
    calls = run_script(out / "deepspeed.sh", ["deepspeed"], {"TRAIN_SCRIPT": str(script), "TRAIN_STEPS": "1000"})
    a = runner.parse_args(calls[0]["argv"])
    world = a.num_gpus * max(1, a.num_nodes)
    raw = json.loads((out / "ds_config.run.json").read_text())
    tp = (raw.get("tensor_parallel") or {}).get("autotp_size", 1)
    pp = (raw.get("pipeline") or {}).get("stages", 1)
    dp = world // (tp * pp)

    class Mpu:
        def get_data_parallel_world_size(self):
            return dp
    import deepspeed.comm as ds_dist
    real_rank = ds_dist.get_rank
    ds_dist.get_rank = lambda: 0
    try:
        c = dsc.DeepSpeedConfig(str(out / "ds_config.run.json"), mpu=Mpu())
    finally:
        ds_dist.get_rank = real_rank
    zero = c.zero_optimization_stage
    text = (out / "deepspeed.sh").read_text()
    h = header_assumptions(text)
    facts = engine_facts(text)
    assert "all-gather the updated weights after the step" in facts and "after the last micro-batch" in facts
    overlap = bool(c.zero_config.overlap_comm) and pp == 1    # the pipeline engine reduces after the last micro-batch
    prof = FrameworkProfile(name="deepspeed", overlap_grad_reduce=overlap, overlap_param_gather=False,
                            kernel_efficiency=h["kernel_efficiency"],
                            memory_headroom_fraction=h["memory_headroom_fraction"], **kernels_of(h))
    # pipeline: every layer boundary checkpointed; no pipeline: the model calls deepspeed.checkpointing,
    # which the activation_checkpointing section configures (the shipped script checkpoints every block)
    full = (c.pipeline["activation_checkpoint_interval"] == 1) if pp > 1 else "activation_checkpointing" in raw
    if pp > 1:
        # the split PipelineModule makes with the file's partition method (the rule tested against
        # DeepSpeed's own partition functions in tests/test_targets_switches.py)
        from planner.plan.targets import partition_split
        got = partition_split("deepspeed", plan.model, pp, c.pipeline["partition"])
        assert got, c.pipeline["partition"]
        counts = list(got)
    else:
        counts = [plan.model.layers]
    dtype = "bf16" if c.bfloat16_config.enabled else "fp16" if c.float16_config.enabled else "fp32"
    ep = (raw.get("expert_parallel") or {}).get("autoep_size", 1)
    wl = dataclasses.replace(plan.workload, global_batch=c.train_batch_size, dtype=dtype,
                             attention_kernel=h["attention_kernel"])
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, zero=zero, sp=False, micro_batch=c.train_micro_batch_size_per_gpu,
                         grad_accum=c.gradient_accumulation_steps, recompute="full" if full else "none",
                         schedule="1f1b", overlap_dp_comm=True)
    return AsWritten(plan.model, wl, par, _stages(counts, counts if full else None), prof, world)


def torchtitan_params(built, model) -> int:
    """The parameters of torchtitan's built model as the cost model counts them: without the MTP
    modules (priced as compute on the last stage; their number must be the model's) and without the
    few weights the catalog's count leaves out, each named: Qwen3's q/k RMSNorms (2 x head_dim per
    layer), gpt-oss's attention sinks (one per head) and router biases (one per expert)."""
    mtp = getattr(built, "mtp_layers", None) or []
    assert len(mtp) == model.mtp_layers
    n = sum(x.numel() for x in built.parameters()) - sum(x.numel() for x in mtp.parameters()) if mtp else \
        sum(x.numel() for x in built.parameters())
    uncounted = {"qwen3": 2 * model.head_dim, "gpt_oss": model.heads + model.num_experts}.get(model.family, 0)
    return n - (uncounted * model.layers if model.is_moe else 0)


def torchtitan_float8(job, model) -> tuple[str, str, bool]:
    """(dtype, torchao recipe, FP8 all-gather) as the parsed job's model states them: which linears
    torchtitan swapped to ``Float8Linear`` and the torchao config they carry. The cost model runs
    every block linear in FP8 and the head in bf16, so the file must convert exactly those."""
    from torchtitan.models.common.linear import Linear
    linears = [(fqn, c) for fqn, c, _, _ in job.model_spec.model.traverse(Linear.Config)]
    f8 = [(fqn, c) for fqn, c in linears if type(c).__qualname__.startswith("Float8Linear")]
    mx = [(fqn, c) for fqn, c in linears if type(c).__qualname__.startswith("MXFP8Linear")]
    if mx:
        # torchao's MXFP8Linear (costmodel.fp8.torchao_mxfp8): every block linear and nothing else; in a mixture
        # of experts every one but the router's gate, which the cost model prices in bf16, and the routed experts'
        # grouped GEMMs too (torchtitan_mxfp8_experts)
        assert not f8 and job.training.mixed_precision_param == "bfloat16"
        block = {fqn for fqn, _ in linears if fqn.startswith("layers.") and not fqn.endswith(".router.gate")}
        assert {fqn for fqn, _ in mx} == block, "MXFP8 must cover every block linear but the router's gate"
        if model.is_moe:
            assert torchtitan_mxfp8_experts(job, beside_linears=True), "the experts must run MXFP8 with the linears"
        else:
            assert len(mx) == 5 * model.layers
        return "fp8", "mxfp8", False
    if not f8:
        return ("bf16" if job.training.mixed_precision_param == "bfloat16" else "fp32"), "", False
    assert job.training.mixed_precision_param == "bfloat16"
    assert {fqn for fqn, _ in f8} == {fqn for fqn, _ in linears if fqn.startswith("layers.")}, \
        "Float8 must cover every block linear and nothing else (the cost model's FP8 GEMMs)"
    assert len(f8) == 5 * model.layers              # fused wqkv, wo, w1, w2, w3 per block
    from torchao.float8 import Float8LinearConfig
    cfgs = {id(c._torchao_config): c._torchao_config for _, c in f8}
    assert len(cfgs) == 1
    cfg = next(iter(cfgs.values()))
    recipe = next(r for r in ("rowwise", "tensorwise") if Float8LinearConfig.from_recipe_name(r) == cfg)
    return "fp8", recipe, bool(cfg.enable_fsdp_float8_all_gather)


def torchtitan_as_written(plan: Plan, tmp: Path, monkeypatch=None) -> AsWritten:
    targets_package("torchtitan", "torchtitan 0.3.0")
    from torchtitan.config import ConfigManager
    if plan.workload.dtype == "fp8":
        targets_package("torchao", "torchao 0.18.0")
        import torchtitan.components.quantization.float8 as f8
        import torchtitan.components.quantization.mx as mxq
        # Float8LinearConverter asks the GPU for SM89+ while the job is built, MXFP8LinearConverter for SM100;
        # the plan's GPU has it
        assert "fp8" in plan.cluster.groups[0].gpu.peak_flops_per_s
        monkeypatch.setattr(f8, "has_cuda_capability", lambda *a: True)
        if plan.workload.fp8_recipe == "mxfp8":
            from costmodel.fp8 import is_blackwell
            assert is_blackwell(plan.cluster.groups[0].gpu)
            monkeypatch.setattr(mxq, "has_cuda_capability", lambda *a: True)

    if (plan.framework or {}).get("mxfp8_experts"):
        targets_package("torchao", "torchao 0.18.0")
        import torchtitan.components.quantization.mx as mx
        # MXFP8GroupedExpertsConverter asks the GPU for SM100 while the job is built; the plan's GPU is Blackwell
        from costmodel.fp8 import is_blackwell
        assert is_blackwell(plan.cluster.groups[0].gpu)
        monkeypatch.setattr(mx, "has_cuda_capability", lambda *a: True)

    from emitters import torchtitan as tt
    out = write(plan, "torchtitan", tmp / "out")
    assets = tmp / "tokenizer"
    assets.mkdir(exist_ok=True)
    calls = run_script(out / "torchtitan.sh", ["torchrun"], {"HEAD_ADDR": "h", "TRAIN_STEPS": "1000",
                                                              "HF_ASSETS": str(assets), "DATASET": "c4"})
    own, prog = split_module_args(calls[0]["argv"])
    t = torchrun_args(own)
    world = int(t.nnodes) * int(t.nproc_per_node)
    sys.path.insert(0, str(out))
    sys.modules.pop(tt.JOB_MODULE, None)
    try:
        job = ConfigManager().parse_args(prog)
    finally:
        sys.path.remove(str(out))
    pa, tr = job.parallelism, job.training
    tp, pp, cp = pa.tensor_parallel_degree, pa.pipeline_parallel_degree, pa.context_parallel_degree
    rep, shard = pa.data_parallel_replicate_degree, pa.data_parallel_shard_degree
    dp = rep * shard
    assert world == dp * tp * pp * cp
    fsdp = shard > 1 or cp > 1
    zero = ({"always": 3, "never": 2}[pa.fsdp_reshard_after_forward] if fsdp else 0)
    if pp > 1:
        micro = pa.pipeline_parallel_microbatch_size
        accum = tr.local_batch_size // micro
        parts = pa.module_fqns_per_model_part
        vpp = len(parts) // pp
        layer_counts = [sum(1 for f in part if f.startswith("layers.")) for part in parts]
        counts = [sum(layer_counts[r::pp]) for r in range(pp)]
        schedule = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}[pa.pipeline_parallel_schedule]
    else:
        micro, accum, vpp, counts, schedule = tr.local_batch_size, tr.global_batch_size // (tr.local_batch_size * dp), \
            1, [plan.model.layers], "1f1b"
    ac = job.activation_checkpoint
    recompute = "none" if ac is None else {"FullAC": "full", "SelectiveAC": "selective"}[type(ac).__qualname__.split(".")[0]]
    text = (out / "torchtitan.sh").read_text()
    h = header_assumptions(text)
    assert "FSDP2 prefetches" in engine_facts(text)
    async_tp = bool(job.compile.enable and job.compile.enable_async_tensor_parallel)
    dtype, recipe, fp8_gather = torchtitan_float8(job, plan.model)
    prof = FrameworkProfile(name="torchtitan", tp_comm_overlap=async_tp, overlap_grad_reduce=True,
                            # enable_async_tensor_parallel is torch Inductor's micro-pipeline TP pass
                            tp_overlap_scope="async_tp",
                            overlap_param_gather=True, kernel_efficiency=h["kernel_efficiency"],
                            memory_headroom_fraction=h["memory_headroom_fraction"], elementwise=h["elementwise"],
                            attention=torchtitan_attention(job), launch=h["launch"],
                            # torchtitan's data parallelism is fully_shard (FSDP2) whatever its file sets
                            fsdp2_copies=True,
                            # its pipeline schedules are torch.distributed.pipelining's (build_pipeline_schedule)
                            pipelining_defers_fsdp_sync=True,
                            hsdp_all_reduce_each_micro_batch=True,    # its train loop never holds FSDP2's sync
                            fsdp_reshards_under_pp=pa.fsdp_reshard_after_forward == "always",
                            dp_bucket=h["dp_bucket"],
                            # the loss the job builds: ChunkedLossWrapper's chunks (one chunk's logits held), or 1
                            loss_chunks=torchtitan_loss_chunks(job)).with_switches(compile=bool(job.compile.enable),
                                                                     mxfp8_experts=dtype != "fp8"
                                                                     and torchtitan_mxfp8_experts(job))
    import torch
    with torch.device("meta"):
        built = job.model_spec.model.build()
    assert torchtitan_params(built, plan.model) == plan.model.total_params()   # the model as priced
    wl = dataclasses.replace(plan.workload, global_batch=tr.global_batch_size, seq_len=tr.seq_len,
                             dtype=dtype, fp8_recipe=recipe, fp8_param_gather=fp8_gather,
                             attention_kernel=h["attention_kernel"])
    ep = pa.expert_parallel_degree
    # torchtitan keeps every expert whole: with TP its EP spans the TP ranks (parallel_dims.py efsdp), etp 1
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=1 if ep > 1 else tp, zero=zero,
                         dp_shard=shard if fsdp else dp,
                         sp=pa.enable_sequence_parallel and tp > 1, vpp=vpp, micro_batch=micro, grad_accum=accum,
                         recompute=recompute, schedule=schedule, overlap_dp_comm=True)
    return AsWritten(plan.model, wl, par, _stages(counts, counts if recompute == "full" else None), prof, world)


def torchtitan_loss_chunks(job) -> int:
    """How many chunks the job's loss runs the output head and cross-entropy over: torchtitan's
    ``ChunkedLossWrapper`` config's ``num_chunks`` (its default where the file leaves it), else 1 (the
    whole micro-batch's logits: MTPLoss, a plain CrossEntropyLoss)."""
    from torchtitan.components.loss import ChunkedLossWrapper
    return job.loss.num_chunks if isinstance(job.loss, ChunkedLossWrapper.Config) else 1


def torchtitan_mxfp8_experts(job, beside_linears: bool = False) -> bool:
    """Whether the job's routed experts run torchao's MXFP8 grouped GEMMs (the converter swapped every
    ``GroupedExperts`` config for its MXFP8 subclass) and, unless ``beside_linears`` (an MXFP8 workload),
    nothing else in the model is quantized."""
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import GroupedExperts
    experts = [c for _, c, _, _ in job.model_spec.model.traverse(GroupedExperts.Config)]
    # the converter's subclass (mx.py ``_get_mxfp8_grouped_experts_cls``) names itself MXFP8<parent>; its Config's
    # qualified name carries that class's name
    mx = [c for c in experts if "MXFP8" in type(c).__qualname__]
    assert not mx or len(mx) == len(experts), "some experts converted, some not"
    assert beside_linears or not mx or not any(("Float8" in type(c).__qualname__ or "MXFP8" in type(c).__qualname__)
                                               for _, c, _, _ in job.model_spec.model.traverse(Linear.Config)), \
        "a linear quantized beside the experts"
    assert all(c.recipe_name == "mxfp8_rceil" for c in mx)
    return bool(mx)


def torchtitan_attention(job) -> str:
    """The attention implementation (costmodel.attention) of the model torchtitan builds from the job:
    its inner attention module's class, read off the built model (FlexAttention: "flex")."""
    import torch
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention, VarlenAttention
    with torch.device("meta"):
        built = job.model_spec.model.build()
    kinds = {type(m) for m in built.modules() if isinstance(m, (FlexAttention, ScaledDotProductAttention, VarlenAttention))}
    assert len(kinds) == 1, kinds
    return {FlexAttention: "flex", VarlenAttention: "varlen"}.get(kinds.pop(), "unpriced inner attention")


def accelerate_as_written(plan: Plan, tmp: Path, monkeypatch) -> AsWritten:
    targets_package("accelerate", "Accelerate 1.15.0")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    out = write(plan, "accelerate", tmp / "out")
    script = tmp / "train.py"
    script.write_text("# the user's training script\n")
    calls = run_script(out / "accelerate.sh", ["accelerate"], {"MAIN_PROCESS_IP": "h", "TRAIN_SCRIPT": str(script)})
    args = launch_command_parser().parse_args(calls[0]["argv"][1:])
    args, defaults, _ = _validate_launch_command(args)
    world = args.num_processes
    text = (out / "accelerate.yaml").read_text()
    micro = int(re.search(r"per-device batch \(your DataLoader\): (\d+)", text).group(1))
    accum = int(calls[0]["env"]["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"])
    h = header_assumptions(text)
    facts = engine_facts(text)
    dtype = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": "fp8"}[args.mixed_precision]
    layers = plan.model.layers
    tp = pp = cp = ep = 1
    sp = False
    counts, per, recompute = [layers], None, "none"
    grad_overlap = gather_overlap = True
    tp_bwd = False
    fsdp2 = False          # FSDP2's copies on the compute stream (costmodel.fsdp): the FSDP engine at fsdp_version 2
    if args.use_megatron_lm:
        env = prepare_multi_gpu_env(args)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        from accelerate.utils import MegatronLMPlugin
        d = MegatronLMPlugin().megatron_lm_default_args
        tp, pp, cp = d["tensor_model_parallel_size"], d["pipeline_model_parallel_size"], d["context_parallel_size"]
        dp = world // (tp * pp * cp)
        ep = d.get("expert_model_parallel_size") or 1
        sp = d["sequence_parallel"]
        zero = 1 if d["use_distributed_optimizer"] else 0
        assert d["num_micro_batches"] == accum
        last = d.get("decoder_last_pipeline_num_layers")
        if last and pp > 1:
            counts = [(layers - last) // (pp - 1)] * (pp - 1) + [last]
        else:
            counts = [layers // pp] * pp
        recompute = "full"
        if d["recompute_method"] == "uniform":
            per = counts
        else:
            per = [min(d["recompute_num_layers"], c) for c in counts]
        # the plugin passes no overlap flag: Megatron reduces after backward; its linear layers still
        # overlap the backward's column-parallel collectives
        assert "no-overlap-grad-reduce" not in d and not d.get("overlap_grad_reduce")
        assert "Megatron reduces gradients after backward" in facts
        grad_overlap = gather_overlap = False
        tp_bwd = True
        dp_shard = dp
    elif args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
        zero = int(env["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
        dp = dp_shard = world
        # Accelerate's DeepSpeed keys set no overlap_comm: DeepSpeed's default, off below stage 3
        assert not any("OVERLAP" in k for k in env) and zero < 3
        assert "overlap_comm off" in facts
        grad_overlap = gather_overlap = False
    else:
        env = prepare_multi_gpu_env(args)
        dp = world
        if args.use_fsdp:
            zero = 3 if env["FSDP_RESHARD_AFTER_FORWARD"] == "true" else 2
            fsdp2 = env["FSDP_VERSION"] == "2"
            cp = int(env.get("PARALLELISM_CONFIG_CP_SIZE", 1))
            dp = world // cp
            dp_shard = int(env.get("PARALLELISM_CONFIG_DP_SHARD_SIZE", dp))
            if env["FSDP_ACTIVATION_CHECKPOINTING"] == "true":
                recompute, per = "full", counts
        else:
            zero, dp_shard = 0, dp
    prof = FrameworkProfile(name="accelerate (as written)", overlap_grad_reduce=grad_overlap,
                            overlap_param_gather=gather_overlap, tp_comm_overlap=False, tp_comm_overlap_backward=tp_bwd,
                            kernel_efficiency=h["kernel_efficiency"],
                            memory_headroom_fraction=h["memory_headroom_fraction"], fsdp2_copies=fsdp2,
                            # FSDP2 under accumulate() with sync_each_batch (the header asks a user's script
                            # for it; the shipped one sets it, checked below): every micro-batch's
                            # reduce-scatter and (HSDP) replica all-reduce
                            hsdp_all_reduce_each_micro_batch=fsdp2,
                            **kernels_of(h))
    starter = out / "train_accelerate.py"
    if fsdp2 and accum > 1:
        assert "sync_each_batch=True" in text
        assert not starter.exists() or "SYNC_EACH_BATCH = True" in starter.read_text()
    wl = dataclasses.replace(plan.workload, global_batch=micro * accum * dp, dtype=dtype,
                             attention_kernel=h["attention_kernel"])
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, zero=zero, dp_shard=dp_shard, sp=sp, micro_batch=micro,
                         grad_accum=accum, recompute=recompute, recompute_layers=_recompute_layers(counts, per),
                         schedule="1f1b", overlap_dp_comm=True)
    return AsWritten(plan.model, wl, par, _stages(counts, per), prof, world)


# --------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target,which", _cases())
def test_price_equals_what_is_written(target, which, tmp_path, monkeypatch):
    plan = _plan(target, which)
    if plan is None:
        pytest.fail(f"{target}: fewer than {SPREAD_PER_TARGET} spread plans emit (test_spread_is_wide_enough)")
    plan = plan.replace(target=target)
    priced = plan_estimate(plan)
    reader = {"megatron": megatron_as_written, "deepspeed": deepspeed_as_written}.get(target)
    w = reader(plan, tmp_path) if reader else {"torchtitan": torchtitan_as_written,
                                               "accelerate": accelerate_as_written}[target](plan, tmp_path, monkeypatch)
    assert w.world == plan.world_size
    again = estimate(w.model, plan.cluster, w.workload, w.par, stages=w.stages, order=plan.mesh_order,
                     framework=w.profile)
    assert again.step_time_s == pytest.approx(priced.step_time_s, rel=1e-12), \
        f"priced {priced.step_time_s:.4f} s, the file as written {again.step_time_s:.4f} s"
    assert again.memory["peak_bytes"] == pytest.approx(priced.memory["peak_bytes"], rel=1e-12)
    assert again.time == pytest.approx(priced.time, rel=1e-12)


def test_demo_plan_writes_tp_overlap(tmp_path):
    """The demo's plan is priced with full TP overlap, and its file turns it on."""
    plan = read_plan(DEMO)
    w = megatron_as_written(plan, tmp_path)
    assert w.profile.tp_comm_overlap and w.par.sp and plan.parallel.tp > 1


def test_megatron_leaves_the_fused_kernel_to_transformer_engine(tmp_path):
    """A fused-attention plan writes --attention-backend auto (TE's choice, which the price assumes), not
    flash (which forces flash-attn), and the header names the kernel the price assumes; a materialized
    plan writes unfused."""
    plan = read_plan(DEMO)
    assert plan.workload.attention_kernel == "flash"
    text = (write(plan, "megatron", tmp_path / "a") / "megatron.sh").read_text()
    assert "--attention-backend auto" in text and "--attention-backend flash" not in text
    head = text.split("MODEL_ARGS")[0]
    assert "attention priced as the kernel Transformer Engine picks" in head and "cuDNN fused attention on Hopper+" in head
    mat = plan.replace(workload=dataclasses.replace(plan.workload, attention_kernel="materialized"))
    text = (write(mat, "megatron", tmp_path / "b") / "megatron.sh").read_text()
    assert "--attention-backend unfused" in text and "attention priced unfused" in text


def test_no_tp_overlap_flag_across_nodes_is_priced_slower(tmp_path):
    """TP over two NVLink domains: --tp-comm-overlap cannot be on, the file does not write it, and the
    plan is priced with Megatron's backward-only overlap: slower than the same plan with the flag."""
    plan = make_plan("llama-3-70b", gpus=64, gb=16, seq=4096, cluster="dgx-h100", tp=16, sp=True, dp=4,
                     zero=1, grad_accum=4).replace(target="megatron")
    w = megatron_as_written(plan, tmp_path)
    assert not w.profile.tp_comm_overlap
    est = plan_estimate(plan)
    full = estimate(plan.model, plan.cluster, plan.workload, plan.parallel, stages=plan.stages,
                    order=plan.mesh_order, framework=dataclasses.replace(w.profile, tp_comm_overlap=True))
    none = estimate(plan.model, plan.cluster, plan.workload, plan.parallel, stages=plan.stages,
                    order=plan.mesh_order, framework=dataclasses.replace(w.profile, tp_comm_overlap_backward=False))
    # ``full`` is not legal here (TP crosses nodes), so the cost model does not apply it either
    assert full.step_time_s == est.step_time_s
    assert est.step_time_s < none.step_time_s


def test_builtin_reads_the_plan_itself(tmp_path):
    """The torchrun target starts the built-in runtime on the plan file it ships: written = priced."""
    plan = read_plan(DEMO).replace(target="")
    out = write(plan, "torchrun", tmp_path / "out")
    shipped = read_plan(out / "plan.yaml")
    assert plan_estimate(shipped).step_time_s == plan_estimate(plan).step_time_s
