"""Accepted = run: layouts the frameworks' own published recipes run are accepted by their target
and fit on the same GPUs in the cost model's memory. Each recipe names its public source; none of
them sets a constant (the NeMo figures are 24.07's, not the held-out 25.x summaries)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from costmodel.catalog import from_hf_config, get_model
from costmodel.specs import ParallelConfig, Workload, default_stages
from costmodel.training import estimate
from planner.plan import targets as T
from planner.plan.planfile import Plan
from costmodel.files.clusters import load_cluster

ROOT = Path(__file__).resolve().parents[1]
NEMO = ("NVIDIA NeMo 24.07 performance summary (NVIDIA/NeMo docs/source/performance/performance_summary.md), "
        "DGX H100, FP8")
TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
NEMO2 = ("NVIDIA/NeMo v2.0.0 (the 24.09 release) nemo/collections/llm/recipes/{}.py pretrain_recipe defaults: "
         "bf16-mixed with grad_reduce_in_fp32=True, the distributed optimizer, no recompute, micro-batch 1")
NEMO_340B = ("NVIDIA NeMo 24.07 performance summary row (128 H100, GBS 32, tp8 pp8 vpp12, FP8) with "
             "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_340b.yaml at the 24.07 "
             "tag (selective recompute, sequence parallel, optim distributed_fused_adam with dtype bf16 and "
             "grad_sync_dtype bf16)")


def _model(name: str):
    if name == "nemotron-4-340b":
        return from_hf_config(json.loads((ROOT / "tests/data/hf/nemotron-4-340b.json").read_text()), name)
    return get_model(name)


# The recompute each 24.07 recipe runs is its NeMo-Framework-Launcher training config's
# (launcher_scripts/conf/training/..., mid-2024): activations_checkpoint_granularity null for gpt3/175b,
# llama/llama3_70b and llama/llama2_70b (the last with block method and 0 layers: none either), selective
# (Megatron's core_attn module) for nemotron/nemotron_340b.
INTERLEAVED = dict(sp=True, micro_batch=1, schedule="interleaved")
LAUNCHER = "; recompute as NeMo-Framework-Launcher launcher_scripts/conf/training/{} sets it"
RECIPES = {
    # name: (source, model, target, GPUs, global batch, seq, dtype, parallel)
    "nemo-llama3-70b": (NEMO + LAUNCHER.format("llama/llama3_70b.yaml"), "llama-3-70b", "megatron", 64, 128, 8192,
                        "fp8", dict(tp=4, pp=4, cp=2, dp=2, vpp=5, grad_accum=64, recompute="none", **INTERLEAVED)),
    "nemo-llama2-70b": (NEMO + LAUNCHER.format("llama/llama2_70b.yaml"), "llama-2-70b", "megatron", 64, 128, 4096,
                        "fp8", dict(tp=4, pp=4, dp=4, vpp=20, grad_accum=32, recompute="none", **INTERLEAVED)),
    "nemo-gpt3-175b": (NEMO + LAUNCHER.format("gpt3/175b.yaml"), "gpt3-175b", "megatron", 128, 256, 2048, "fp8",
                       dict(tp=4, pp=8, dp=4, vpp=6, grad_accum=64, recompute="none", **INTERLEAVED)),
    "nemo-nemotron4-340b": (NEMO_340B, "nemotron-4-340b", "megatron", 128, 32, 4096, "fp8",
                            dict(tp=8, pp=8, dp=2, vpp=12, grad_accum=16, recompute="selective", **INTERLEAVED)),
    # NeMo 2.0's recipes, as their trainer() and pretrain_recipe() defaults set them (num_nodes as their
    # docstrings' examples where the default does not hold the layout)
    "nemo2-llama3-8b": (NEMO2.format("llama3_8b"), "llama-3-8b", "megatron", 8, 512, 8192, "bf16",
                        dict(tp=1, pp=1, cp=2, dp=4, micro_batch=1, grad_accum=128, recompute="none")),
    "nemo2-llama3-70b": (NEMO2.format("llama3_70b") + ", num_nodes=4", "llama-3-70b", "megatron", 32, 512, 8192,
                         "bf16", dict(tp=4, pp=4, cp=2, dp=1, vpp=5, sp=True, schedule="interleaved",
                                      micro_batch=1, grad_accum=512, recompute="none")),
    "nemo2-mixtral-8x7b": (NEMO2.format("mixtral_8x7b"), "mixtral-8x7b", "megatron", 64, 512, 4096, "bf16",
                           dict(tp=1, pp=4, dp=16, ep=8, vpp=8, schedule="interleaved", micro_batch=1,
                                grad_accum=32, recompute="none")),
    "titan-llama31-70b-2d": (TITAN + " Table 4 (FSDP 32, TP 8, local batch 16, full AC)", "llama-3.1-70b", "torchtitan",
                             256, 512, 8192, "bf16",
                             dict(tp=8, dp=32, sp=True, zero=3, micro_batch=16, grad_accum=1, recompute="full")),
    # Megatron-LM's own example (examples/llama/train_llama3_8b_h100_fp8.sh, 2026-07): 8 H100, TP1 PP1 CP1,
    # micro-batch 1, GBS 128, seq 8192, FP8 hybrid with --fp8-param-gather and --grad-reduce-in-bf16, the
    # distributed optimizer, no recompute (its own settings: WORKLOAD and FRAMEWORK below)
    "megatron-llama3-8b-fp8": ("NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh", "llama-3-8b",
                               "megatron", 8, 128, 8192, "fp8",
                               dict(tp=1, pp=1, cp=1, dp=8, zero=1, micro_batch=1, grad_accum=16, recompute="none")),
    # its Megatron-FSDP twin (examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh): the same run with
    # --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params (ZeRO-3) and --fp8-param-gather
    "megatron-fsdp-llama3-8b-fp8": ("NVIDIA/Megatron-LM examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh",
                                    "llama-3-8b", "megatron", 8, 128, 8192, "fp8",
                                    dict(tp=1, pp=1, cp=1, dp=8, zero=3, micro_batch=1, grad_accum=16,
                                         recompute="none")),
    # torchtitan's own 405B preset ("a preset for 128 H100 GPUs"): FSDP over the rest, 8-way TP (async),
    # local batch 2 at 8,192 tokens, full AC, compile and Float8. Float8 is not planned for torchtitan yet,
    # so it is priced in BF16: an upper bound on its memory (Float8Linear saves BF16 inputs, and the FP8
    # FSDP all-gather only shrinks the gathered weights)
    "titan-llama31-405b-2d": ("pytorch/torchtitan torchtitan/models/llama3/train_configs/llama3_405b.toml (priced in "
                              "BF16 without its float8 converter)", "llama-3.1-405b", "torchtitan", 128, 32, 8192,
                              "bf16", dict(tp=8, dp=16, sp=True, zero=3, micro_batch=2, grad_accum=1,
                                           recompute="full")),
    "titan-llama31-8b-fsdp": (TITAN + " Table 1 (FSDP 8, local batch 2, selective AC)", "llama-3.1-8b", "torchtitan",
                              8, 16, 8192, "bf16",
                              dict(dp=8, zero=3, micro_batch=2, grad_accum=1, recompute="selective")),
}
# the framework settings a recipe's own file sets (planner.plan.targets.SWITCHES), priced and written
FRAMEWORK = {
    # its 24.07 launcher config's optim: grad_sync_dtype bf16 (BF16 gradients) and dtype bf16: Adam's state
    # in BF16 (NeMo r2.0.0rc1 megatron_base_model.setup_optimization passes optim.dtype as Apex
    # DistributedFusedAdam's dtype, "datatype for optimizer state"), written for Megatron-LM as its
    # precision-aware optimizer with BF16 moments (test_nemotron_runs_on_its_bf16_adam_state below)
    "nemo-nemotron4-340b": {"grads_bf16": True, "adam_moments_bf16": True},
    "megatron-llama3-8b-fp8": {"grads_bf16": True},   # --grad-reduce-in-bf16
}
# the workload settings a recipe's own file sets
WORKLOAD = {
    "megatron-llama3-8b-fp8": {"fp8_param_gather": True},    # --fp8-param-gather: FP8 weights, no BF16 copy
    "megatron-fsdp-llama3-8b-fp8": {"fp8_param_gather": True},
}
# what does not fit yet, with the figure it gets (a strict xfail: it fails loudly once it fits)
NOT_YET: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[n]))
                                  if n in NOT_YET else n for n in RECIPES])
def test_a_published_recipe_is_accepted_and_fits(name):
    source, model, target, gpus, gb, seq, dtype, par = RECIPES[name]
    m = _model(model)
    p = ParallelConfig(**par)
    plan = Plan(model=m, cluster=load_cluster("dgx-h100").with_gpus(gpus),
                workload=Workload(global_batch=gb, seq_len=seq, dtype=dtype, **WORKLOAD.get(name, {})), parallel=p,
                stages=default_stages(m.layers, p.pp), target=target, framework=FRAMEWORK.get(name, {}))
    assert T.problems(target, plan) == [], source
    est = estimate(plan.model, plan.cluster, plan.workload, p, stages=plan.stages,
                   framework=T.profile_for(target, plan.framework))
    worst = max(est.stages, key=lambda s: s.memory["peak_bytes"] / s.capacity_bytes)
    assert est.fits, (f"{name} ({source}): stage {worst.index} needs {worst.memory['peak_bytes'] / 2**30:.1f} GiB "
                      f"of {worst.capacity_bytes / 2**30:.1f}")


def _nemotron_estimate(dtype: str, framework: dict):
    source, model, target, gpus, gb, seq, _, par = RECIPES["nemo-nemotron4-340b"]
    m = _model(model)
    p = ParallelConfig(**par)
    return estimate(m, load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb, seq_len=seq, dtype=dtype),
                    p, stages=default_stages(m.layers, p.pp), framework=T.profile_for(target, framework))


@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_nemotron_bf16_gradients_its_file_sets_halve_the_buffer(dtype):
    # the recipe's own grad_sync_dtype: bf16 halves the gradient buffer and nothing else in memory
    # (whether the recipe fits at all: NOT_YET above)
    fp32 = _nemotron_estimate(dtype, {})
    bf16 = _nemotron_estimate(dtype, {"grads_bf16": True})
    for a, b in zip(fp32.stages, bf16.stages):
        assert b.memory["grads_bytes"] == pytest.approx(a.memory["grads_bytes"] / 2)
        assert b.memory["weights_bytes"] == a.memory["weights_bytes"]
        assert b.memory["optimizer_bytes"] == a.memory["optimizer_bytes"]
    # half the bytes on the wire too: the step is not slower
    assert bf16.step_time_s <= fp32.step_time_s


def test_the_bf16_gradient_setting_is_written_and_refused_where_megatron_cannot_run_it():
    from emitters import CannotExpress
    from emitters import megatron
    source, model, target, gpus, gb, seq, dtype, par = RECIPES["nemo-nemotron4-340b"]
    m = _model(model)
    p = ParallelConfig(**par)
    plan = Plan(model=m, cluster=load_cluster("dgx-h100").with_gpus(gpus),
                workload=Workload(global_batch=gb, seq_len=seq, dtype="bf16"), parallel=p,
                stages=default_stages(m.layers, p.pp), target=target, framework={"grads_bf16": True})
    assert "--grad-reduce-in-bf16" in megatron.training_args(plan)
    assert "--grad-reduce-in-bf16" not in megatron.training_args(
        dataclasses.replace(plan, framework={}))
    with pytest.raises(CannotExpress, match="grads_bf16"):
        megatron.training_args(dataclasses.replace(plan, workload=Workload(global_batch=gb, seq_len=seq,
                                                                           dtype="fp16")))


def test_nemo_llama31_405b_is_refused_for_megatrons_own_interleaved_rule():
    """NeMo v2.0.0's llama31_405b recipe (tp8 pp9 vpp2 cp4, 72 nodes, GBS 512, micro-batch 1: dp 2, 256
    micro-batches) breaks Megatron's interleaved-schedule check with its default group size (pp): 256 % 9 = 4.
    Megatron-Core before 2024-11 required M % pp == 0 (schedules.py); since then M % N must be 0 or >= pp for
    N = microbatch_group_size_per_vp_stage, default pp, which the recipe does not set. No GBS of 2^k runs on
    pp 9 at the default, so the refusal is Megatron's, and it names the fix."""
    m = get_model("llama-3.1-405b")
    p = ParallelConfig(tp=8, pp=9, cp=4, dp=2, vpp=2, sp=True, schedule="interleaved", micro_batch=1, grad_accum=256)
    plan = Plan(model=m, cluster=load_cluster("dgx-h100").with_gpus(576),
                workload=Workload(global_batch=512, seq_len=8192, dtype="bf16"), parallel=p,
                stages=default_stages(m.layers, p.pp), target="megatron")
    probs = T.problems("megatron", plan)
    assert len(probs) == 1 and "256 micro-batches" in probs[0] and "multiple of pp=9" in probs[0], probs
    # the same layout with a multiple of pp micro-batches is accepted
    ok = dataclasses.replace(p, grad_accum=252)
    plan = dataclasses.replace(plan, parallel=ok, workload=Workload(global_batch=504, seq_len=8192, dtype="bf16"))
    assert T.problems("megatron", plan) == []


def test_megatrons_fp8_example_fits_because_of_its_fp8_weights_and_bf16_gradients():
    """Megatron's own 8-GPU FP8 Llama-3 8B example sets --fp8-param-gather and --grad-reduce-in-bf16; without
    either the same layout does not fit (BF16 weights beside the FP8 ones add 13 GiB, FP32 gradients 15),
    so the fit comes from the file's settings, not from a loose rule. The same two settings are what the NeMo
    24.07 FP8 rows would need (docs/notes/stop-20/megfix.md)."""
    source, model, target, gpus, gb, seq, dtype, par = RECIPES["megatron-llama3-8b-fp8"]
    m = get_model(model)
    p = ParallelConfig(**par)
    fits = {}
    for pg in (False, True):
        for g16 in (False, True):
            est = estimate(m, load_cluster("dgx-h100").with_gpus(gpus),
                           Workload(global_batch=gb, seq_len=seq, dtype=dtype, fp8_param_gather=pg), p,
                           stages=default_stages(m.layers, p.pp),
                           framework=T.profile_for(target, {"grads_bf16": True} if g16 else {}))
            fits[pg, g16] = est.fits
    assert fits == {(False, False): False, (False, True): False, (True, False): False, (True, True): True}


def test_nemotron_runs_on_its_bf16_adam_state():
    """Nemotron-4 340B fits because its 24.07 config keeps Adam's state in BF16 (optim.dtype: bf16). The run
    itself was NeMo's Apex DistributedFusedAdam, which no target writes, so its states are counted here by hand
    from the sources, beside the cost model's price of the Megatron-LM file that writes the same setting:
    - Apex DistributedFusedAdam (apex/contrib/optimizers/distributed_fused_adam.py, 2024-04): the moments
      (exp_avg_shard, exp_avg_sq_shard) in ``dtype``, over the data-parallel shard; a master copy
      (params_shard) only with store_params, which NeMo r2.0.0rc1 turns off when the optimizer's dtype is
      the model's (megatron_base_model.setup_optimization: bf16 == bf16); the contiguous grad buffer
      (_init_grad_buffer) holds every gradient in grad_sync_dtype (BF16), the word embedding's in FP32
      (megatron_gpt_model.configure_optimizers: with_fp32_embedding_grads defaults to True), and each
      bucket keeps its reduce-scattered shard (grads_shard) for the step.
    - Megatron-LM with --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: the
      same moments, Transformer Engine's 16-bit master remainders, and the BF16 gradients reduced in place.
    Both fit; without the BF16 state (Megatron's FP32 Adam, or NeMo's default dtype fp32, which stores the
    master's remainders) neither does: the fit comes from the recipe's own setting."""
    from costmodel.layers import ends_params
    from costmodel.memory import stage_param_counts
    source, model, target, gpus, gb, seq, dtype, par = RECIPES["nemo-nemotron4-340b"]
    m = _model(model)
    p = ParallelConfig(**par)
    stages = default_stages(m.layers, p.pp)

    def est(framework):
        return estimate(m, load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb, seq_len=seq,
                        dtype=dtype), p, stages=stages, framework=T.profile_for(target, framework))

    priced = est(FRAMEWORK["nemo-nemotron4-340b"])
    fp32_state = est({"grads_bf16": True})
    assert priced.fits and not fp32_state.fits
    s0, f0 = priced.stages[0], fp32_state.stages[0]
    params, experts = stage_param_counts(m, p, 0, stages)
    emb = ends_params(m, p.tp, p.pp, True, False).total          # the first stage's ends: the word embedding
    assert experts == 0 and emb > 0
    dp = p.dp * p.cp
    # the priced Megatron file: 2 + 2 bytes of BF16 moments and 2 of master remainders, over dp
    assert s0.memory["optimizer_bytes"] == pytest.approx(params * 6 / dp)
    assert f0.memory["optimizer_bytes"] == pytest.approx(params * 12 / dp)
    assert s0.memory["grads_bytes"] == pytest.approx(params * 2)
    # what the NeMo 24.07 run held on the same GPU (weights, activations and the rest as priced)
    rest = s0.memory["peak_bytes"] - s0.memory["grads_bytes"] - s0.memory["optimizer_bytes"]
    dfa_grads = ((params - emb) * 2 + emb * 4) * (1 + 1 / dp)
    dfa = {"bf16": rest + dfa_grads + params * (2 + 2) / dp,
           "fp32": rest + dfa_grads + params * (4 + 4 + 2) / dp}   # NeMo's default: FP32 moments, remainders
    assert dfa["bf16"] <= s0.capacity_bytes < dfa["fp32"], {k: v / 2**30 for k, v in dfa.items()}


def test_bf16_adam_moments_are_written_and_refused_where_megatron_cannot_run_them():
    """The setting is written as Megatron's precision-aware optimizer with BF16 moments, and refused where
    Megatron would not run it or would keep another master weight than the price assumes."""
    from emitters import CannotExpress
    from emitters import megatron
    source, model, target, gpus, gb, seq, dtype, par = RECIPES["nemo-nemotron4-340b"]
    m = _model(model)
    p = ParallelConfig(zero=1, **par)
    plan = Plan(model=m, cluster=load_cluster("dgx-h100").with_gpus(gpus),
                workload=Workload(global_batch=gb, seq_len=seq, dtype=dtype), parallel=p,
                stages=default_stages(m.layers, p.pp), target=target, framework={"adam_moments_bf16": True})
    args = [str(a) for a in megatron.training_args(plan)]
    i = args.index("--use-precision-aware-optimizer")
    assert args[i + 1:i + 5] == ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    assert "--use-precision-aware-optimizer" not in megatron.training_args(dataclasses.replace(plan, framework={}))
    wl = plan.workload
    for bad, why in [(dict(workload=dataclasses.replace(wl, dtype="fp16")), "fp16"),
                     (dict(workload=dataclasses.replace(wl, optimizer="sgd")), "sgd"),
                     (dict(workload=dataclasses.replace(wl, fp8_recipe="current")), "recipe current"),
                     (dict(workload=dataclasses.replace(wl, fp8_param_gather=True)), "fp8-param-gather")]:
        with pytest.raises(CannotExpress, match=why):
            megatron.training_args(dataclasses.replace(plan, **bad))
    with pytest.raises(CannotExpress, match="zero=0"):
        megatron.emit(dataclasses.replace(plan, parallel=dataclasses.replace(p, zero=0)))


def test_nemo2_llama3_8b_cp2_activations_match_a_hand_count():
    """The NeMo 2.0 Llama 3 8B recipe's activations (tp1 cp2, 4,096 tokens per rank, BF16, no recompute),
    counted by hand from what each module saves for its backward, equal the cost model's; the recipe's
    miss (NOT_YET) is not an overcount of these. Per token and layer: the two RMSNorm inputs and outputs
    (Transformer Engine's LayerNormLinear keeps its input for the norm's backward and its output for the
    weight gradient), Q, K and V (the fused attention kernel's inputs; under CP Transformer Engine's ring
    attention keeps the local Q and one K/V pair), the attention output (the output projection's input),
    the kernel's FP32 log-sum-exp per head, and SwiGLU's two projections and their product (the down
    projection's input). Once per micro-batch: the logits in BF16 and their FP32 copy (Megatron's cross
    entropy upcasts and keeps exp(logits)), and the token ids the embedding's backward scatters by; the
    embedding's output is the first layer's norm input, counted once."""
    source, model, target, gpus, gb, seq, dtype, par = RECIPES["nemo2-llama3-8b"]
    m = get_model(model)
    p = ParallelConfig(**par)
    est = estimate(m, load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb, seq_len=seq, dtype=dtype),
                   p, stages=default_stages(m.layers, p.pp), framework=T.profile_for(target, FRAMEWORK.get(
                       "nemo2-llama3-8b", {})))
    tokens = seq // p.cp
    h, q, kv, ffn, heads, vocab = 4096, 4096, 8 * 128, 14336, 32, 128256      # Llama 3 8B (config.json)
    assert (m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.layers) == (h, heads, 8, ffn, vocab, 32)
    per_layer = 2 * h * 2 + 2 * h * 2 + (q + 2 * kv) * 2 + q * 2 + heads * 4 + 3 * ffn * 2
    per_microbatch = m.layers * per_layer + vocab * (2 + 4) + 8
    assert est.stages[0].memory["activations_bytes"] == pytest.approx(tokens * per_microbatch, rel=1e-9)
