"""Execution targets as data: what each framework can run, each fact with its source.

A *target* is where a plan runs: a training framework (``megatron``, ``torchtitan``,
``deepspeed``, ``accelerate``, ``builtin`` = this project's runtime), a launch wrapper that
starts the built-in runtime (``torchrun``, ``slurm``, ``kubernetes``: builtin's table, and for
the last two one kind of node), or a serving engine (``vllm``, ``sglang``, ``tensorrt-llm``,
``builtin``). Each has one table (``TrainTarget`` / ``ServeTarget``): plain fields that say what
it runs, and ``sources`` naming where each fact is stated (file and line at the commit the
reference notes in ``/work/shared/reference/`` were read from, or the emitter that writes the
files). A table states what this project can launch on the target: the framework's own limits,
and where the files the emitter writes can state less than the framework runs, the emitter's.

``problems(target, plan)`` lists everything a plan asks that its target cannot run, each with
the numbers and what to change; the search asks ``config_problems`` of every candidate (no
stage split yet) and keeps the split within ``split_rule``. Imports ``costmodel`` and the plan
file only: the search, the emitters, the runtime and the command line may all read it.

Where the sources disagree or a combination is unconfirmed (reference section 8: Megatron-FSDP
with pipeline stages, DeepSpeed AutoTP with ZeRO-3), the table says no: a plan the solver
proves best must be one that runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from costmodel.specs import MESH_AXES, ModelSpec, ParallelConfig, StageSpec, Workload, kv_heads_shard

REF = "reference/training-targets.md"       # /work/shared/reference/, see the module docstring
LREF = "reference/launchers.md"
SREF = "reference/serving-and-hardware.md"

TRAIN_TARGETS = ("megatron", "torchtitan", "deepspeed", "accelerate", "builtin")
SERVE_TARGETS = ("vllm", "sglang", "tensorrt-llm", "builtin")
LAUNCHERS = ("torchrun", "slurm", "kubernetes")   # start the built-in runtime
GENERIC = "generic"     # every layout the cost model knows; no framework runs all of them


# --------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------

Rule = Callable[[ModelSpec, Workload, ParallelConfig, tuple], "str | None"]


@dataclass(frozen=True, kw_only=True)
class Extra:
    """A target-specific rule that no field states: ``check`` returns a problem or None."""
    what: str
    source: str
    check: Rule


@dataclass(frozen=True, kw_only=True)
class TrainTarget:
    """What a training target runs. ZeRO sets apply when there is data or context parallelism
    (``dp * cp > 1``); with neither there is nothing to shard."""

    name: str
    summary: str
    runs: str                                  # the framework whose behaviour applies
    zero: frozenset[int]                       # ZeRO stages without pipeline stages
    zero_pp: frozenset[int]                    # ... with pp > 1
    hsdp: frozenset[int]                       # ZeRO stages that may shard over part of dp
    cp: bool
    cp_seq: Callable[[ParallelConfig], int]    # seq_len must be a multiple of this when cp > 1
    cp_seq_text: str
    ep: bool
    expert_tp: bool                            # ep > 1 together with tp > 1
    vpp: bool
    vpp_split: str                             # any | even (layers % (pp*vpp) == 0, every stage equal)
    split: str                                 # any | even | last (every stage but the last equal)
    recompute: frozenset[str]                  # whole-model policies: none, selective, full
    recompute_block: bool                      # full recompute of the first N layers of every stage
    recompute_per_stage: bool                  # each stage its own count on top of none/selective
    sp: str                                    # optional | with_tp (always with tp > 1) | never
    schedules: frozenset[str]
    microbatches: str                          # rule for micro-batches per step: megatron | torch | none
    orders: tuple[tuple[str, ...], ...] | None  # rank orders (outermost first); None: any
    tp_with_pp: bool
    dtypes: frozenset[str]
    mla: bool
    moe: bool
    alibi: bool
    kv_heads_divisible: bool                   # tp must divide the KV heads (no replication)
    heterogeneous: bool                        # stages on node groups of different kinds
    sources: Mapping[str, str]
    extra: tuple[Extra, ...] = ()
    variants: tuple[tuple[str, Callable[[ParallelConfig], bool], "TrainTarget"], ...] = ()
    # ZeRO-1 runs as ZeRO-0 (DDP: the optimizer state is not sharded): never planned, and a plan
    # of ZeRO-1 is accepted when it fits as ZeRO-0 (``problems``)
    zero1_as_zero0: bool = False
    mode: str = "train"

    def for_config(self, par: ParallelConfig) -> "TrainTarget":
        """The table that applies to ``par`` (Accelerate picks its backend from the degrees)."""
        for _, applies, table in self.variants:
            if applies(par):
                return table
        return self


@dataclass(frozen=True, kw_only=True)
class ServeTarget:
    """What a serving target runs: one replica is ``tp x pp`` GPUs, ``dp`` replicas."""

    name: str
    summary: str
    runs: str
    ep: str                                    # none | tp_dp (ep == tp*dp) | tp (ep == tp, within a replica)
    replicas: bool                             # dp > 1 in one launch
    multi_node_replica: bool                   # a replica over several nodes
    replicas_over_nodes: bool                  # several replicas spread over nodes
    dtypes: frozenset[str]
    kv_dtypes: frozenset[str]
    kv_heads_divisible: bool
    mla: bool
    heterogeneous: bool
    sources: Mapping[str, str]
    mode: str = "infer"


def _megatron_cp(par: ParallelConfig) -> int:
    return 2 * par.cp


def _titan_cp(par: ParallelConfig) -> int:
    return 2 * par.cp * par.tp


ALL_ORDERS = None
MEGATRON_ORDERS = (MESH_AXES, ("dp", "pp", "cp", "tp"))


def _megatron_expert_grid(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    """Megatron's expert grid (ETP x EP x PP, cp folded in) keeps pp outermost unless dense DP
    equals expert DP: with pp inside dp (``--use-tp-pp-dp-mapping``) that is ``ep == cp``."""
    if par.pp > 1 and par.ep > 1 and tuple(order).index("dp") < tuple(order).index("pp") and par.ep != par.cp:
        return (f"ep={par.ep} with pp={par.pp} under mesh order {','.join(order)}: Megatron's expert grid needs "
                f"dense dp ({par.dp}) = expert dp (dp*cp/ep = {par.dp * par.cp // par.ep}) unless pp is outermost; "
                "plan --mesh-order pp,dp,cp,tp")
    return None


def _titan_model(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    checks = [(model.mlp == "swiglu", f"the {model.mlp} MLP"),
              (model.norm == "rmsnorm", model.norm), (model.positions == "rotary", f"{model.positions} positions"),
              (not model.tied_embeddings, "tied embeddings"), (not model.bias, "linear biases"),
              (model.head_dim * model.heads == model.hidden, f"head_dim {model.head_dim}")]
    bad = [what for ok, what in checks if not ok]
    if bad:
        return (f"{model.name} has {', '.join(bad)}: the torchtitan target writes its llama3 model (dense, "
                "SwiGLU, RMSNorm, RoPE, untied, no biases); use the megatron target")
    return None


def _titan_ddp(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    others = [f"{k}={getattr(par, k)}" for k in ("tp", "pp", "cp") if getattr(par, k) > 1]
    if par.zero == 0 and par.dp > 1 and others:
        return (f"zero=0 (DDP) with {', '.join(others)}: torchtitan applies DDP only when data parallel is the "
                "sole parallelism; plan --zero 2 or 3")
    return None


def _titan_bf16(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    fsdp = (par.zero >= 2 and par.dp_shard > 1) or par.cp > 1
    if wl.dtype in ("bf16", "bfloat16") and (par.tp > 1 or par.pp > 1) and not fsdp:
        return (f"bf16 with tp={par.tp} pp={par.pp} and no FSDP (dp_shard={par.dp_shard}, zero={par.zero}): "
                "torchtitan mixes precision through fully_shard; plan dp > 1 with --zero 2 or 3")
    return None


def _ds_autotp_zero3(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if par.tp > 1 and par.zero == 3 and par.dp > 1:
        return (f"tp={par.tp} with ZeRO-3: DeepSpeed's docs disagree on AutoTP with ZeRO-3 (config-json says "
                "stages 0-3, the AutoTP tutorial 0-2); plan --zero 2 or lower")
    return None


def _ds_recompute_needs_pp(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if par.recompute == "full" and par.pp == 1:
        return ("full recompute without pipeline stages: DeepSpeed's config turns checkpointing on only for "
                "PipelineModule (activation_checkpoint_interval); plan --recompute none or --pp 2 or more")
    return None


def _accel_fsdp_recompute(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if par.recompute == "full" and par.zero < 2:
        return (f"full recompute with ZeRO-{par.zero}: Accelerate's DDP and DeepSpeed-ZeRO-1 configs have no "
                "activation-checkpointing key (FSDP's fsdp_activation_checkpointing does); plan --zero 2 or 3, "
                "or --recompute none")
    return None


def _accel_fsdp_cp(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if par.cp > 1 and par.zero < 2:
        return (f"cp={par.cp} with ZeRO-{par.zero}: Accelerate's context parallel runs under FSDP2, which shards "
                "parameters; plan --zero 2 or 3")
    return None


MEGATRON_SOURCES = {
    "zero": f"{REF} 1.7: --use-distributed-optimizer (ZeRO-1), --use-megatron-fsdp optim_grads / "
            "optim_grads_params (ZeRO-2/3), arguments.py ~3170",
    "zero_pp": f"{REF} 1.7 and 8: the distributed optimizer with PP; torch-FSDP2 refuses PP (arguments.py ~1034); "
               "Megatron-FSDP with PP is unconfirmed (no refusal, no test), so not planned",
    "hsdp": f"{REF} 1.2: --num-distributed-optimizer-instances (distributed optimizer over part of dp x cp); "
            "Megatron-FSDP's --outer-dp-sharding-strategy is not written by emitters/megatron.py",
    "cp": f"{REF} 1.5: --context-parallel-size; seq_length % (2*CP) == 0 (arguments.py ~1336)",
    "ep": f"{REF} 1.6: num_experts % EP == 0 (arguments.py ~1656); expert grid ETP x EP x PP (parallel_state.py ~870)",
    "expert_tp": f"{REF} 1.2: --expert-tensor-parallel-size (default = TP)",
    "vpp": f"{REF} 1.4: --num-virtual-stages-per-pipeline-rank or the layout; PP > 1 (arguments.py ~1000)",
    "vpp_split": f"{LREF} 3: --pipeline-model-parallel-layout, stage count = pp*vpp, any layers per stage",
    "split": f"{REF} 1.4: --pipeline-model-parallel-layout (transformer_config.py ~2240), any layers per stage",
    "recompute": f"{REF} 1.8: --recompute-granularity full|selective; full needs a method and num-layers "
                 "(transformer_config.py ~1905)",
    "recompute_block": f"{REF} 1.8: --recompute-method block: the first N layers of every pipeline stage "
                       "(transformer_config.py ~543); with vpp, of every virtual stage",
    "recompute_per_stage": f"{REF} 1.4: no CLI for a different recompute per stage",
    "sp": f"{REF} 1.3: --sequence-parallel, forced off with TP = 1 (arguments.py ~1432)",
    "schedules": f"{REF} 1.4: 1F1B, interleaved 1F1B with VPP; no GPipe (schedules.py)",
    "microbatches": f"{REF} 1.4: interleaved: microbatch_group_size_per_vp_stage = PP in [PP, M], M mod group "
                    "0 or >= PP (schedules.py ~1160-1172), so M % PP == 0",
    "orders": f"{REF} 1.2: order tp-cp-ep-dp-pp (parallel_state.py ~617), or --use-tp-pp-dp-mapping",
    "tp_with_pp": f"{REF} 1.2: DP = world / (TP x PP x CP)",
    "dtypes": "emitters/megatron.py training_args: --bf16, --fp16, fp32, fp8 through TE --fp8-format",
    "models": "emitters/megatron.py model_args: Megatron-Core GPT has no ALiBi; MLA (--multi-latent-attention) "
              "and MoE supported",
    "kv_heads_divisible": "megatron/core/transformer/attention.py: num_query_groups_per_partition = "
                          "divide(num_query_groups, tp)",
    "heterogeneous": "emitters/base.py require_one_group: one launch line, the same processes on every node",
}

MEGATRON = TrainTarget(
    name="megatron", summary="Megatron-LM / Megatron-Core pretrain_gpt.py", runs="megatron",
    zero=frozenset({0, 1, 2, 3}), zero_pp=frozenset({0, 1}), hsdp=frozenset({1}),
    cp=True, cp_seq=_megatron_cp, cp_seq_text="2*cp", ep=True, expert_tp=True,
    vpp=True, vpp_split="any", split="any",
    recompute=frozenset({"none", "selective", "full"}), recompute_block=True, recompute_per_stage=False,
    sp="optional", schedules=frozenset({"1f1b", "interleaved"}), microbatches="megatron",
    orders=MEGATRON_ORDERS, tp_with_pp=True, dtypes=frozenset({"bf16", "fp16", "fp32", "fp8"}),
    mla=True, moe=True, alibi=False, kv_heads_divisible=True, heterogeneous=False,
    sources=MEGATRON_SOURCES,
    extra=(Extra(what="expert grid", source=f"{REF} 1.2: parallel_state.py ~870-907", check=_megatron_expert_grid),),
)

TORCHTITAN = TrainTarget(
    name="torchtitan", summary="torchtitan (FSDP2, DTensor TP, torch pipelining, CP)", runs="torchtitan",
    zero=frozenset({0, 2, 3}), zero_pp=frozenset({2, 3}), hsdp=frozenset({2, 3}),
    cp=True, cp_seq=_titan_cp, cp_seq_text="2*cp*tp", ep=False, expert_tp=False,
    vpp=True, vpp_split="even", split="any",
    recompute=frozenset({"none", "full"}), recompute_block=False, recompute_per_stage=False,
    sp="with_tp", schedules=frozenset({"1f1b", "gpipe", "interleaved"}), microbatches="torch",
    orders=(MESH_AXES,), tp_with_pp=True, dtypes=frozenset({"bf16", "fp32"}),
    mla=False, moe=False, alibi=False, kv_heads_divisible=True, heterogeneous=False,
    sources={
        "zero": f"{REF} 2.2 and 2.6: FSDP2 only (fsdp_reshard_after_forward never = ZeRO-2, always = ZeRO-3); "
                "no optimizer-only sharding; DDP only when dp is the sole parallelism (emitters/torchtitan.py)",
        "zero_pp": f"{REF} 2.2: FSDP2 with PP, no reshard by default (fsdp.py ~112-132)",
        "hsdp": f"{REF} 2.2: data_parallel_replicate_degree x data_parallel_shard_degree",
        "cp": f"{REF} 2.2: context_parallel_degree; emitters/torchtitan.py: seq_len % (tp*2*cp)",
        "ep": f"{REF} 2.2: EP exists (divides dp_shard*cp*tp), but the torchtitan emitter writes dense llama3 only",
        "expert_tp": f"{REF} 2.2: expert TP deprecated (c4b409af2)",
        "vpp": f"{REF} 2.2: Interleaved1F1B and other multi-stage schedules, >= 2 stages per rank",
        "vpp_split": "emitters/torchtitan.py model_parts: with vpp > 1, pp*vpp equal chunks",
        "split": f"{REF} 2.3: module_fqns_per_model_part, any layers per stage",
        "recompute": f"{REF} 2.4: none, full (every block), selective per-op (saves matmul outputs: not the "
                     "attention-only selective the cost model prices, emitters/torchtitan.py)",
        "recompute_block": f"{REF} 2.4: apply() wraps every block; no every-N-layers option",
        "recompute_per_stage": f"{REF} 2.4 and 2.6: no per-stage or per-layer recompute",
        "sp": "emitters/torchtitan.py: SequenceParallel norms always with TP (enable_sequence_parallel)",
        "schedules": f"{REF} 2.2: get_schedule_class names (1F1B, GPipe, Interleaved1F1B, ...)",
        "microbatches": "torch/distributed/pipelining/schedules.py: Schedule1F1B needs micro-batches >= stages "
                        "(~1020); Interleaved1F1B a multiple of max(1, M // pp) rounds (~2937)",
        "orders": f"{REF} 9 / parallel_dims.py: pp, dp_replicate, dp_shard, cp, tp",
        "tp_with_pp": f"{REF} 2.2: dp_replicate*dp_shard*cp*tp*pp == WORLD_SIZE",
        "dtypes": "emitters/torchtitan.py: mixed_precision_param bfloat16 or float32",
        "models": "emitters/torchtitan.py _check_model: llama3 (dense, SwiGLU, RMSNorm, RoPE, untied, no biases)",
        "kv_heads_divisible": "torchtitan llama3 parallelize: wk/wv column-parallel, KV heads split over tp",
        "heterogeneous": "emitters/base.py require_one_group",
    },
    extra=(Extra(what="model", source="emitters/torchtitan.py _check_model", check=_titan_model),
           Extra(what="DDP", source="emitters/torchtitan.py _data_parallel", check=_titan_ddp),
           Extra(what="bf16 needs FSDP", source="emitters/torchtitan.py config", check=_titan_bf16)),
)

DEEPSPEED = TrainTarget(
    name="deepspeed", summary="DeepSpeed 0.19 (ZeRO, AutoTP, PipelineModule, AutoEP)", runs="deepspeed",
    zero=frozenset({0, 1, 2, 3}), zero_pp=frozenset({0, 1}), hsdp=frozenset(),
    cp=False, cp_seq=_megatron_cp, cp_seq_text="-", ep=True, expert_tp=False,
    vpp=False, vpp_split="even", split="even",
    recompute=frozenset({"none", "full"}), recompute_block=False, recompute_per_stage=False,
    sp="never", schedules=frozenset({"1f1b"}), microbatches="none",
    orders=(MESH_AXES,), tp_with_pp=False, dtypes=frozenset({"bf16", "fp16", "fp32"}),
    mla=True, moe=True, alibi=True, kv_heads_divisible=False, heterogeneous=False,
    sources={
        "zero": f"{REF} 3.2: zero_optimization.stage 0-3",
        "zero_pp": f"{REF} 3.3: PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py ~74-77)",
        "hsdp": f"{REF} 3.2: hpZ is a secondary parameter partition, not replicas of shards; MiCS removed in 0.19 "
                "(emitters/deepspeed.py)",
        "cp": f"{REF} 3.5: Ulysses sequence parallel (all-to-all over heads), not ring context parallel",
        "ep": f"{REF} 3.6: AutoEP expert_parallel.autoep_size (divides world/pp)",
        "expert_tp": f"{REF} 3.6: AutoEP expert_tensor_parallel_size: only 1 accepted (config-json ~940)",
        "vpp": f"{REF} 3.3: TrainSchedule is synchronous 1F1B; no interleaved schedule",
        "vpp_split": f"{REF} 3.3",
        "split": f"{REF} 3.3: partition_method balances parameters or layer types; no explicit per-stage counts, "
                 "so only an even split is known to be what runs",
        "recompute": f"{REF} 3.3 and 3.7: PipelineModule activation_checkpoint_interval (every layer); no selective "
                     "mode; a plain model checkpoints in its own code (emitters/deepspeed.py)",
        "recompute_block": f"{REF} 3.3: one activation_checkpoint_interval for the whole module",
        "recompute_per_stage": f"{REF} 3.3: no per-stage variation",
        "sp": "emitters/deepspeed.py: AutoTP has no Megatron-style sequence-parallel norms",
        "schedules": f"{REF} 3.3: TrainSchedule (1F1B)",
        "microbatches": f"{REF} 3.1: gradient_accumulation_steps = pipeline micro-batches",
        "orders": f"{LREF} 4: PipeModelDataParallelTopology axes pipe, data, model (model innermost)",
        "tp_with_pp": f"{REF} 3.4: AutoTP with PipelineModule not confirmed in source",
        "dtypes": "emitters/deepspeed.py: bf16 / fp16 sections or fp32",
        "models": "DeepSpeed runs the user's model code; AutoTP/AutoEP presets cover llama, mixtral, deepseek",
        "kv_heads_divisible": f"{REF} 3.4: AutoTP distributes heads unevenly",
        "heterogeneous": "emitters/base.py require_one_group",
    },
    extra=(Extra(what="AutoTP with ZeRO-3", source=f"{REF} 3.4", check=_ds_autotp_zero3),
           Extra(what="recompute needs PipelineModule", source="emitters/deepspeed.py config",
                 check=_ds_recompute_needs_pp)),
)

_ACCEL_MEGATRON = dataclasses.replace(
    MEGATRON, name="accelerate", summary="Accelerate, Megatron-LM plugin (tp > 1 or pp > 1)", runs="megatron",
    zero=frozenset({0, 1}), zero_pp=frozenset({0, 1}), hsdp=frozenset(), vpp=False, split="last",
    recompute=frozenset({"full"}), recompute_block=True, schedules=frozenset({"1f1b"}), microbatches="none",
    orders=(MESH_AXES,), dtypes=frozenset({"bf16", "fp16", "fp32", "fp8"}),
    sources={**MEGATRON_SOURCES,
             "zero": f"{REF} 4.2: MegatronLMPlugin use_distributed_optimizer (ZeRO-1) only",
             "zero_pp": f"{REF} 4.2: MegatronLMPlugin use_distributed_optimizer (ZeRO-1) only",
             "hsdp": "emitters/accelerate.py: the plugin has no --num-distributed-optimizer-instances",
             "vpp": f"{REF} 4.2: num_layers_per_virtual_pipeline_stage, not written by emitters/accelerate.py",
             "split": f"{REF} 4.2: decoder_last_pipeline_num_layers only (the first via other args, untested)",
             "recompute": "emitters/accelerate.py: MegatronLMPlugin always passes a recompute method (full "
                          "granularity); no 'off', and a method with selective is refused by Megatron",
             "schedules": f"{REF} 4.2: Megatron 1F1B",
             "orders": f"{REF} 1.2: Megatron tp-cp-ep-dp-pp"},
    extra=())

_ACCEL_FSDP = TrainTarget(
    name="accelerate", summary="Accelerate, FSDP2 / DDP / DeepSpeed ZeRO-1 (tp = pp = 1)", runs="accelerate",
    zero=frozenset({0, 1, 2, 3}), zero_pp=frozenset(), hsdp=frozenset({2, 3}),
    cp=True, cp_seq=_megatron_cp, cp_seq_text="2*cp", ep=False, expert_tp=False,
    vpp=False, vpp_split="even", split="even",
    recompute=frozenset({"none", "full"}), recompute_block=False, recompute_per_stage=False,
    sp="optional", schedules=frozenset({"1f1b"}), microbatches="none",
    orders=(MESH_AXES, ("dp", "pp", "cp", "tp")), tp_with_pp=True,
    dtypes=frozenset({"bf16", "fp16", "fp32", "fp8"}),
    mla=True, moe=True, alibi=True, kv_heads_divisible=False, heterogeneous=False,
    sources={
        "zero": f"{REF} 4.1 / 4.3: FSDP2 reshard_after_forward (ZeRO-3) or not (ZeRO-2); DeepSpeed plugin stage 1; "
                "DDP (emitters/accelerate.py)",
        "zero_pp": f"{REF} 4.1: ParallelismConfig has no PP field",
        "hsdp": f"{REF} 4.1: dp_replicate_size x dp_shard_size",
        "cp": f"{REF} 4.1: cp_size (torch backend) under FSDP2",
        "ep": f"{REF} 4.1: no EP field",
        "expert_tp": f"{REF} 4.1", "vpp": f"{REF} 4.1", "vpp_split": f"{REF} 4.1", "split": f"{REF} 4.1",
        "recompute": f"{REF} 4.1: FSDP plugin activation_checkpointing (bool, whole model)",
        "recompute_block": f"{REF} 4.1", "recompute_per_stage": f"{REF} 4.1",
        "sp": f"{REF} 4.1: no TP here", "schedules": f"{REF} 4.1", "microbatches": f"{REF} 4.1",
        "orders": f"{REF} 4.1: mesh dp_replicate, dp_shard, cp, tp",
        "tp_with_pp": f"{REF} 4.1", "dtypes": "emitters/accelerate.py MIXED: no, fp16, bf16, fp8",
        "models": "Accelerate runs the user's model", "kv_heads_divisible": "no TP here",
        "heterogeneous": "emitters/base.py require_one_group",
    },
    extra=(Extra(what="recompute under DDP", source="emitters/accelerate.py config", check=_accel_fsdp_recompute),
           Extra(what="CP under FSDP2", source="emitters/accelerate.py _fsdp", check=_accel_fsdp_cp)),
)

ACCELERATE = dataclasses.replace(
    _ACCEL_MEGATRON, summary="Hugging Face Accelerate 1.x: the Megatron-LM plugin for tp/pp, else FSDP2/DDP",
    variants=(("tp > 1 or pp > 1: the Megatron-LM plugin", lambda p: p.tp > 1 or p.pp > 1, _ACCEL_MEGATRON),
              ("tp = pp = 1: FSDP2 / DDP / DeepSpeed ZeRO-1", lambda p: p.tp == 1 and p.pp == 1, _ACCEL_FSDP)))

BUILTIN_SOURCES = {
    "zero": "runtime/parallel.py: FSDP2 fully_shard for ZeRO-2/3, replicate (DDP) for ZeRO-0/1; ZeRO-1 does "
            "not shard the optimizer state (README), so it is planned as ZeRO-0",
    "zero_pp": "runtime/parallel.py apply_dp(pp_enabled=...): FSDP2 on every stage",
    "hsdp": "runtime/parallel.py Dims: dp_replicate x dp_shard 2-D mesh for ZeRO-2/3",
    "cp": "runtime/parallel.py Dims.from_plan: cp > 1 refused (torch's CPU attention has no CP rule)",
    "ep": "runtime/parallel.py Dims.from_plan: ep divides num_experts and the dp shard group",
    "expert_tp": "runtime/parallel.py: expert weights are DTensors on ep x tp (the FFN dimension)",
    "vpp": "runtime/pipeline.py: ScheduleInterleaved1F1B, a rank's layers cut into vpp chunks",
    "vpp_split": "runtime/pipeline.py virtual_stage_layers: any counts, each >= vpp",
    "split": "runtime/pipeline.py virtual_stage_layers: the plan's stage split as it is",
    "recompute": "runtime/parallel.py parallelize step 3: full and op-selective (attention core) checkpointing",
    "recompute_block": "costmodel.specs.ParallelConfig.full_recompute_layers, applied per stage by the runtime",
    "recompute_per_stage": "runtime/parallel.py step 3: the first recompute_layers blocks of each stage",
    "sp": "runtime/parallel.py tp_plan: SequenceParallel norms when sp",
    "schedules": "runtime/pipeline.py schedule_class: GPipe, 1F1B, Interleaved1F1B",
    "microbatches": "torch/distributed/pipelining/schedules.py: Schedule1F1B needs micro-batches >= stages "
                    "(~1020); Interleaved1F1B a multiple of max(1, M // pp) rounds (~2937)",
    "orders": "runtime/parallel.py build_mesh: the plan's mesh order",
    "tp_with_pp": "runtime/parallel.py Dims",
    "dtypes": "runtime/train.py: bf16 autocast on CUDA (fp16 plans too), fp32 otherwise; no fp8",
    "models": "runtime/model.py check_supported: no multi-latent attention, no ALiBi",
    "kv_heads_divisible": "runtime/parallel.py Dims.from_plan: the runtime shards K/V heads, never replicates",
    "heterogeneous": "emitters/torchrun.py: static rendezvous, node ranks by group",
}


def _builtin_shapes(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    out = []
    if model.positions == "learned" and model.max_seq_len % par.tp:
        out.append(f"tp {par.tp} does not divide max_seq_len {model.max_seq_len} (learned positions are sharded "
                   "like the vocabulary)")
    if model.is_moe and model.expert_ffn_hidden % par.tp:
        out.append(f"tp {par.tp} does not divide expert_ffn_hidden {model.expert_ffn_hidden}")
    shard = par.dp_shard if par.zero >= 2 else par.dp
    if par.ep > 1 and shard % par.ep:
        out.append(f"ep {par.ep} must divide the data-parallel shard group {shard} (experts are spread over "
                   "dp ranks)")
    return "; ".join(out) + "; plan other degrees" if out else None


BUILTIN = TrainTarget(
    name="builtin", summary="this project's runtime (python -m runtime.train under torchrun)", runs="builtin",
    zero=frozenset({0, 2, 3}), zero_pp=frozenset({0, 2, 3}), hsdp=frozenset({2, 3}),
    cp=False, cp_seq=_megatron_cp, cp_seq_text="-", ep=True, expert_tp=True,
    vpp=True, vpp_split="any", split="any",
    recompute=frozenset({"none", "selective", "full"}), recompute_block=True, recompute_per_stage=True,
    sp="optional", schedules=frozenset({"1f1b", "gpipe", "interleaved"}), microbatches="torch",
    orders=ALL_ORDERS, tp_with_pp=True, dtypes=frozenset({"bf16", "fp16", "fp32"}),
    mla=False, moe=True, alibi=False, kv_heads_divisible=True, heterogeneous=True,
    sources=BUILTIN_SOURCES, zero1_as_zero0=True,
    extra=(Extra(what="shapes", source="runtime/parallel.py Dims.from_plan", check=_builtin_shapes),),
)


def _launcher(name: str, summary: str, heterogeneous: bool) -> TrainTarget:
    src = dict(BUILTIN_SOURCES)
    if not heterogeneous:
        src["heterogeneous"] = f"emitters/{name}.py: require_one_group (one task or pod template for every node)"
    return dataclasses.replace(BUILTIN, name=name, summary=summary, heterogeneous=heterogeneous, sources=src)


SERVE_DTYPES = frozenset({"bf16", "fp16", "fp32"})

VLLM = ServeTarget(
    name="vllm", summary="vllm serve", runs="vllm", ep="tp_dp", replicas=True, multi_node_replica=True,
    replicas_over_nodes=True, dtypes=SERVE_DTYPES | {"fp8"}, kv_dtypes=SERVE_DTYPES | {"fp8"},
    kv_heads_divisible=False, mla=True, heterogeneous=False,
    sources={"ep": f"{SREF} 3.1: --enable-expert-parallel gives EP = TP x DP",
             "replicas": f"{LREF} 5.1: --data-parallel-size (-local, -start-rank over nodes)",
             "multi_node_replica": f"{LREF} 5.1: --nnodes/--node-rank/--headless, one replica over nodes",
             "replicas_over_nodes": "emitters/vllm.py: node-sized replicas or one replica over nodes, not a "
                                    "replica over nodes and several replicas",
             "dtypes": "emitters/vllm.py: --dtype, fp8 as --quantization fp8; int8/int4 need a named method",
             "kv_dtypes": "emitters/vllm.py: --kv-cache-dtype fp8 or the model dtype",
             "kv_heads_divisible": f"{LREF} 5.1: KV heads replicated when tp > kv heads",
             "mla": f"{SREF} 3.1: DeepSeek MLA served", "heterogeneous": "emitters/base.py require_one_group"})

SGLANG = ServeTarget(
    name="sglang", summary="python -m sglang.launch_server", runs="sglang", ep="none", replicas=True,
    multi_node_replica=True, replicas_over_nodes=True, dtypes=SERVE_DTYPES, kv_dtypes=SERVE_DTYPES | {"fp8"},
    kv_heads_divisible=False, mla=True, heterogeneous=False,
    sources={"ep": "emitters/sglang.py: --ep-size splits experts within one TP group (ep = tp); the serving "
                   f"planner spreads them over replicas ({SREF} 3.2)",
             "replicas": f"{LREF} 5.2: --dp-size", "multi_node_replica": f"{LREF} 5.2: --nnodes --node-rank",
             "replicas_over_nodes": f"{LREF} 5.2", "dtypes": "emitters/sglang.py: --dtype float16/bfloat16/float32",
             "kv_dtypes": "emitters/sglang.py: --kv-cache-dtype fp8_e4m3 or the model dtype",
             "kv_heads_divisible": f"{SREF} 3.2", "mla": f"{SREF} 3.2: DeepSeek served",
             "heterogeneous": "emitters/base.py require_one_group"})

TRTLLM = ServeTarget(
    name="tensorrt-llm", summary="trtllm-serve (PyTorch backend)", runs="tensorrt-llm", ep="none", replicas=False,
    multi_node_replica=False, replicas_over_nodes=False, dtypes=SERVE_DTYPES, kv_dtypes=SERVE_DTYPES | {"fp8"},
    kv_heads_divisible=False, mla=True, heterogeneous=False,
    sources={"ep": "emitters/tensorrt_llm.py: --ep_size splits the experts of one TP group",
             "replicas": "emitters/tensorrt_llm.py: trtllm-serve serves one replica",
             "multi_node_replica": "emitters/tensorrt_llm.py: multi-node runs under MPI/Slurm, not written",
             "replicas_over_nodes": "emitters/tensorrt_llm.py",
             "dtypes": "emitters/tensorrt_llm.py: quantized weights come from a ModelOpt checkpoint",
             "kv_dtypes": "emitters/tensorrt_llm.py: fp8 or the model dtype",
             "kv_heads_divisible": f"{LREF} 5.3", "mla": f"{SREF} 3.3",
             "heterogeneous": "emitters/base.py require_one_group"})

BUILTIN_SERVE = ServeTarget(
    name="builtin", summary="this project's runtime (python -m runtime.serve under torchrun)", runs="builtin",
    ep="none", replicas=True, multi_node_replica=True, replicas_over_nodes=True,
    dtypes=SERVE_DTYPES, kv_dtypes=SERVE_DTYPES, kv_heads_divisible=True, mla=False, heterogeneous=False,
    sources={"ep": "runtime/serve.py check: ep > 1 refused", "replicas": "runtime/serve.py: replicas",
             "multi_node_replica": "runtime/serve.py: torchrun", "replicas_over_nodes": "runtime/serve.py",
             "dtypes": "runtime/serve.py: the model dtype", "kv_dtypes": "runtime/serve.py: the model dtype",
             "kv_heads_divisible": "runtime/serve.py check: K/V heads sharded, never replicated",
             "mla": "runtime/model.py check_supported: no multi-latent attention",
             "heterogeneous": "runtime/serve.py: one kind of node"})

TRAIN: dict[str, TrainTarget] = {t.name: t for t in (MEGATRON, TORCHTITAN, DEEPSPEED, ACCELERATE, BUILTIN)}
TRAIN.update({"torchrun": _launcher("torchrun", "torchrun + the built-in runtime", True),
              "slurm": _launcher("slurm", "sbatch + torchrun + the built-in runtime", False),
              "kubernetes": _launcher("kubernetes", "Kubeflow PyTorchJob + the built-in runtime", False)})
SERVE: dict[str, ServeTarget] = {t.name: t for t in (VLLM, SGLANG, TRTLLM, BUILTIN_SERVE)}


def names(mode: str) -> tuple[str, ...]:
    """Target names a plan of ``mode`` may name (planning targets first, then launch wrappers)."""
    return TRAIN_TARGETS + LAUNCHERS if mode == "train" else SERVE_TARGETS


def planning_targets(mode: str) -> tuple[str, ...]:
    """The targets ``--target all`` solves for: frameworks, not the wrappers that start one."""
    return TRAIN_TARGETS if mode == "train" else SERVE_TARGETS


def get(name: str, mode: str = "train") -> TrainTarget | ServeTarget:
    """The table of target ``name`` for plans of ``mode``; ``KeyError`` for an unknown one."""
    table = TRAIN if mode == "train" else SERVE
    if name not in table:
        raise KeyError(name)
    return table[name]


def check_name(name: str, mode: str) -> None:
    """``ValueError`` naming the known targets when ``name`` is none of them."""
    if name != GENERIC and name not in (TRAIN if mode == "train" else SERVE):
        raise ValueError(f"unknown {mode} target {name!r}; targets: {', '.join(names(mode))}")


def framework_of(name: str) -> str:
    """The cost model's framework profile for a training target (``costmodel.frameworks``)."""
    if not name or name == GENERIC:
        return GENERIC
    t = TRAIN.get(name)
    return t.runs if t is not None else GENERIC


# --------------------------------------------------------------------------------------
# What a target cannot run
# --------------------------------------------------------------------------------------

def _eff_order(par: ParallelConfig, order: Sequence[str]) -> tuple[str, ...]:
    return tuple(d for d in order if getattr(par, d) > 1)


def _zero_sets(t: TrainTarget, par: ParallelConfig) -> frozenset[int]:
    return t.zero_pp if par.pp > 1 else t.zero


def config_problems(target: str | TrainTarget, model: ModelSpec, workload: Workload, par: ParallelConfig,
                    order: Sequence[str] = MESH_AXES, plan_check: bool = False) -> list[str]:
    """What training target ``target`` cannot run in this configuration, stage split aside.
    ``plan_check``: checking a finished plan rather than searching (ZeRO-1 on a target that runs it
    as ZeRO-0 is then left to ``problems``' memory check)."""
    base = get(target) if isinstance(target, str) else target
    t = base.for_config(par)
    name = base.name
    out: list[str] = []
    order = tuple(order)

    def add(msg: str) -> None:
        out.append(msg)

    # the model
    if model.attention == "mla" and not t.mla:
        add(f"{model.name} uses multi-latent attention, which {name} does not run; use the megatron target")
    if model.positions == "alibi" and not t.alibi:
        add(f"{model.name} uses ALiBi positions, which {name} does not run")
    if model.is_moe and not t.moe:
        add(f"{model.name} is a mixture of experts ({model.num_experts} experts), which the {name} target does "
            "not write; use the megatron target")
    if workload.dtype not in t.dtypes:
        add(f"dtype {workload.dtype}: {name} trains in {', '.join(sorted(t.dtypes))}; plan --dtype bf16")
    if t.kv_heads_divisible and not kv_heads_shard(model, par.tp):
        add(f"tp={par.tp} does not divide the {model.kv_heads} KV heads ({name} shards K/V heads, it does not "
            f"replicate them); plan --tp {_largest_divisor(model.kv_heads, par.tp)} or fewer")
    # data parallel sharding
    if par.dp * par.cp > 1:
        allowed = _zero_sets(t, par)
        if plan_check and t.zero1_as_zero0:
            allowed = allowed | {1}
        if par.zero not in allowed:
            with_pp = f" with pp={par.pp}" if par.pp > 1 else ""
            if allowed:
                add(f"ZeRO-{par.zero}{with_pp}: {name} runs ZeRO {_stages(allowed)}{with_pp}; plan --zero "
                    f"{_nearest(par.zero, allowed)}" + ("" if par.pp == 1 or not t.zero - t.zero_pp else
                                                       " (or --pp 1)"))
            else:
                add(f"pp={par.pp} with data parallelism: {name} has no pipeline stages here; plan --pp 1")
        if par.hsdp and par.zero not in t.hsdp:
            add(f"ZeRO-{par.zero} over groups of {par.dp_shard} of dp={par.dp} (HSDP): {name} shards "
                + (f"part of dp only with ZeRO {_stages(t.hsdp)}" if t.hsdp else "over the whole dp group")
                + f"; plan --dp-shard {par.dp}")
    # context and expert parallel
    if par.cp > 1:
        if not t.cp:
            add(f"cp={par.cp}: {name} has no context parallelism; plan --cp 1")
        elif workload.seq_len % t.cp_seq(par):
            add(f"cp={par.cp} with seq_len {workload.seq_len}: {name} needs seq_len to be a multiple of "
                f"{t.cp_seq_text} = {t.cp_seq(par)}; plan another --cp or --seq-len")
    if par.ep > 1:
        if not t.ep:
            add(f"ep={par.ep}: the {name} target has no expert parallelism; plan --ep 1")
        elif par.tp > 1 and not t.expert_tp:
            add(f"ep={par.ep} with tp={par.tp}: {name}'s expert parallel takes no tensor parallel experts "
                "(expert TP must be 1); plan --tp 1 or --ep 1")
    # tensor and sequence parallel
    if par.tp > 1 and par.pp > 1 and not t.tp_with_pp:
        add(f"tp={par.tp} with pp={par.pp}: {name} does not combine its tensor parallel with pipeline stages; "
            "plan --tp 1 or --pp 1")
    if par.tp > 1:
        if t.sp == "with_tp" and not par.sp:
            add(f"tp={par.tp} without sequence parallel: {name} always applies it with TP; plan --sp")
        if t.sp == "never" and par.sp:
            add(f"sequence parallel with tp={par.tp}: {name} has no Megatron-style sequence parallel; plan --no-sp")
    # pipeline
    if par.pp > 1:
        if par.schedule not in t.schedules:
            add(f"the {par.schedule} schedule: {name} runs {', '.join(sorted(t.schedules))}; plan --schedule "
                f"{'interleaved' if par.vpp > 1 and 'interleaved' in t.schedules else '1f1b'}")
        if par.vpp > 1:
            if not t.vpp:
                add(f"vpp={par.vpp}: {name} has no virtual pipeline stages; plan --vpp 1")
            elif t.vpp_split == "even" and model.layers % (par.pp * par.vpp):
                add(f"vpp={par.vpp}: {name} cuts {model.layers} layers into pp*vpp = {par.pp * par.vpp} equal "
                    "virtual stages; plan a --vpp or --pp that divides the layers")
        if t.split == "even" and model.layers % par.pp:
            add(f"pp={par.pp}: {name} splits the {model.layers} layers evenly; plan a --pp that divides them")
        m = par.grad_accum
        if t.microbatches == "megatron" and par.vpp > 1 and m % par.pp:
            add(f"vpp={par.vpp} with {m} micro-batches: Megatron's interleaved schedule needs a multiple of "
                f"pp={par.pp}; plan --grad-accum {_round_up(m, par.pp)}")
        if t.microbatches == "torch":
            if par.schedule == "1f1b" and m < par.pp:
                add(f"{m} micro-batches on pp={par.pp}: torch's Schedule1F1B needs at least one per stage; plan "
                    f"--grad-accum {par.pp} or more, or --schedule gpipe")
            if par.schedule == "interleaved" and m % max(1, m // par.pp):
                add(f"{m} micro-batches on pp={par.pp}: torch's Interleaved1F1B needs a multiple of "
                    f"{max(1, m // par.pp)} rounds")
    # recompute (whole-model policy)
    if par.recompute not in t.recompute:
        add(f"recompute {par.recompute}: {name} offers {_join(sorted(t.recompute))} recompute; plan --recompute "
            f"{'full' if 'full' in t.recompute else sorted(t.recompute)[0]}")
    elif par.recompute == "full" and par.recompute_layers >= 0 and not t.recompute_block:
        add(f"full recompute of {par.recompute_layers} layers per stage: {name} recomputes every layer or none; "
            "plan --recompute full (all layers)")
    elif (par.recompute == "full" and par.recompute_layers >= 0 and par.vpp > 1 and not t.recompute_per_stage
          and par.recompute_layers % par.vpp):
        add(f"{par.recompute_layers} recomputed layers per stage with vpp={par.vpp}: the block method recomputes "
            f"the first N layers of each virtual stage; plan --recompute-layers {_round_up(par.recompute_layers, par.vpp)}")
    # rank order
    if t.orders is not None:
        eff = _eff_order(par, order)
        if not any(tuple(d for d in o if d in eff) == eff for o in t.orders):
            add(f"mesh order {','.join(order)}: {name} orders ranks "
                + " or ".join(",".join(o) for o in t.orders) + " (outermost first); plan --mesh-order "
                + ",".join(t.orders[0]))
    for rule in t.extra:
        msg = rule.check(model, workload, par, order)
        if msg:
            add(msg)
    return [f"{name}: {m}" for m in out]


def split_rule(target: str | TrainTarget, par: ParallelConfig) -> tuple[str, bool, int]:
    """How a target lets the search split the layers: ``(split, per-stage recompute, least
    layers per stage)``. ``split`` is ``any``, ``even`` or ``last`` (all stages but the last
    equal); without per-stage recompute each stage recomputes exactly the policy's count, and a
    uniform count N (Megatron's block method) needs at least N layers on every stage."""
    base = get(target) if isinstance(target, str) else target
    t = base.for_config(par)
    split = t.split
    if par.pp > 1 and par.vpp > 1 and t.vpp_split == "even":
        split = "even"
    least = 0
    if not t.recompute_per_stage and par.recompute == "full" and par.recompute_layers >= 0:
        least = par.recompute_layers
    return split, t.recompute_per_stage, least


def stage_problems(target: str | TrainTarget, model: ModelSpec, par: ParallelConfig,
                   stages: Sequence[StageSpec], groups: int = 1) -> list[str]:
    """What target ``target`` cannot run in this stage split (and its per-stage recompute)."""
    base = get(target) if isinstance(target, str) else target
    t = base.for_config(par)
    name = base.name
    out: list[str] = []
    counts = [s.num_layers for s in stages]
    used = {s.group for s in stages}
    if not t.heterogeneous and (groups > 1 or len(used - {""}) > 1):
        out.append(f"stages on {groups} node groups: {name} launches one kind of node; plan --target {name} "
                   "plans on one group")
    split, per_stage, least = split_rule(t, par)
    if par.pp > 1:
        if split == "even" and len(set(counts)) > 1:
            out.append(f"stage split {counts}: {name} splits the layers evenly"
                       + (f" (pp*vpp = {par.pp * par.vpp} equal virtual stages)" if par.vpp > 1 else "")
                       + f"; plan --target {name}")
        if split == "last" and len(set(counts[:-1])) > 1:
            out.append(f"stage split {counts}: {name} sets only the last stage's layer count, the others are "
                       f"equal; plan --target {name}")
    if not per_stage:
        extra = [s.recompute_layers for s in stages]
        if par.recompute != "full" and any(extra):
            out.append(f"per-stage recompute {extra} (on top of {par.recompute}): {name} sets one recompute "
                       f"policy for the whole model; plan --target {name}")
        if par.recompute == "full" and par.recompute_layers >= 0:
            short = [n for n in counts if n < par.recompute_layers]
            if short:
                out.append(f"{par.recompute_layers} recomputed layers per stage, but stages hold {counts}: {name}'s "
                           "block method recomputes the same N on every stage; plan --target " + name)
            if any(s.recompute_layers not in (0, min(par.recompute_layers, s.num_layers)) for s in stages):
                out.append(f"stage recompute counts {[s.recompute_layers for s in stages]} differ from the "
                           f"policy's {par.recompute_layers}: {name} takes one count for every stage")
        if par.recompute == "full" and par.recompute_layers < 0 and any(
                s.recompute_layers not in (0, s.num_layers) for s in stages):
            out.append(f"stage recompute counts {[s.recompute_layers for s in stages]} under full recompute of every "
                       f"layer: {name} takes one policy")
    return [f"{name}: {m}" for m in out]


def serve_problems(target: str | ServeTarget, model: ModelSpec, workload: Workload, par: ParallelConfig,
                   gpus_per_node: int, groups: int = 1) -> list[str]:
    """What serving target ``target`` cannot run in this inference configuration."""
    t = get(target, "infer") if isinstance(target, str) else target
    name = t.name
    out: list[str] = []
    if groups > 1 and not t.heterogeneous:
        out.append(f"{groups} node groups: {name} serves on one kind of node")
    if par.cp > 1 or par.vpp > 1:
        out.append(f"cp={par.cp} vpp={par.vpp}: serving runs cp=1, vpp=1")
    if model.attention == "mla" and not t.mla:
        out.append(f"{model.name} uses multi-latent attention, which {name} does not serve; use the vllm target")
    if workload.dtype not in t.dtypes:
        out.append(f"weights in {workload.dtype}: {name} serves {', '.join(sorted(t.dtypes))} from a plain "
                   "checkpoint; plan --dtype bf16")
    kv = workload.kv_dtype or workload.dtype
    if kv not in t.kv_dtypes:
        out.append(f"KV cache in {kv}: {name} stores it in {', '.join(sorted(t.kv_dtypes))}; plan --kv-dtype bf16")
    if t.kv_heads_divisible and not kv_heads_shard(model, par.tp):
        out.append(f"tp={par.tp} does not divide the {model.kv_heads} KV heads ({name} does not replicate them); "
                   f"plan --tp {_largest_divisor(model.kv_heads, par.tp)}")
    if par.ep > 1:
        if t.ep == "none":
            out.append(f"ep={par.ep} over {par.dp} replicas: {name} does not spread experts over replicas; "
                       "plan --ep 1")
        elif t.ep == "tp_dp" and par.ep != par.tp * par.dp:
            out.append(f"ep={par.ep} with tp={par.tp} dp={par.dp}: {name} shards experts over tp*dp = "
                       f"{par.tp * par.dp} ranks; plan --ep {par.tp * par.dp} or 1")
    if par.dp > 1 and not t.replicas:
        out.append(f"dp={par.dp} replicas: {name} serves one replica per launch; plan --dp 1")
    replica = par.tp * par.pp
    world = replica * par.dp
    if replica > gpus_per_node:
        if not t.multi_node_replica:
            out.append(f"a replica of tp*pp = {replica} GPUs over {replica // gpus_per_node} nodes: {name} is "
                       f"launched on one node here; plan tp*pp <= {gpus_per_node}")
        elif par.dp > 1 and not t.replicas_over_nodes:
            out.append(f"{par.dp} replicas of {replica} GPUs each spanning nodes: {name}")
        elif par.dp > 1 and name == "vllm":
            out.append(f"dp={par.dp} replicas of {replica} GPUs each spanning nodes: vLLM spans nodes with one "
                       "replica or spreads node-sized replicas, not both; plan --dp 1 or tp*pp <= "
                       f"{gpus_per_node}")
    elif world > gpus_per_node and gpus_per_node % replica:
        out.append(f"replicas of {replica} GPUs on nodes of {gpus_per_node}: a replica would straddle two nodes")
    return [f"{name}: {m}" for m in out]


def problems(target: str, plan: Any) -> list[str]:
    """Everything ``plan`` (a ``planner.plan.planfile.Plan``) asks that ``target`` cannot run,
    each with the numbers and what to change; empty when the target runs it as planned."""
    if plan.mode == "infer":
        if target not in SERVE:
            return [f"{target}: a serving plan; {target} is not a serving target ({', '.join(SERVE_TARGETS)})"]
        return serve_problems(target, plan.model, plan.workload, plan.parallel, plan.cluster.gpus_per_node,
                              len(plan.cluster.groups))
    if target not in TRAIN:
        return [f"{target}: a training plan; {target} is not a training target ({', '.join(names('train'))})"]
    out = (config_problems(target, plan.model, plan.workload, plan.parallel, plan.mesh_order, plan_check=True)
           + stage_problems(target, plan.model, plan.parallel, plan.stages, len(plan.cluster.groups)))
    par = plan.parallel
    if not out and TRAIN[target].zero1_as_zero0 and par.zero == 1 and par.dp > 1:
        out += _zero1_as_zero0(target, plan)
    return out


def _zero1_as_zero0(target: str, plan: Any) -> list[str]:
    """A ZeRO-1 plan on a target that runs ZeRO-1 as DDP: fine when it fits unsharded."""
    from costmodel.training import estimate
    par = dataclasses.replace(plan.parallel, zero=0)
    est = estimate(plan.model, plan.cluster, plan.workload, par, stages=plan.stages, order=plan.mesh_order,
                   framework=framework_of(target))
    worst = max(est.stages, key=lambda s: s.memory["peak_bytes"] / s.capacity_bytes)
    peak, cap = worst.memory["peak_bytes"], worst.capacity_bytes
    if peak <= cap:
        return []
    return [f"{target}: ZeRO-1 runs as DDP here (the optimizer state is not sharded): stage {worst.index} then "
            f"needs {peak / 2**30:.1f} GiB per GPU of {cap / 2**30:.1f} GiB; plan --zero 0, 2 or 3"]


# --------------------------------------------------------------------------------------
# The table as rows (for `planner plan --target all`, the README and the demo)
# --------------------------------------------------------------------------------------

FEATURES = (
    ("zero", "ZeRO without PP"), ("zero_pp", "ZeRO with PP"), ("hsdp", "HSDP"), ("cp", "context parallel"),
    ("ep", "expert parallel"), ("expert_tp", "expert TP"), ("vpp", "virtual stages"),
    ("split", "stage split"), ("recompute", "recompute"), ("recompute_block", "recompute N per stage"),
    ("recompute_per_stage", "per-stage recompute"), ("sp", "sequence parallel"), ("schedules", "schedules"),
    ("orders", "rank orders"), ("dtypes", "dtypes"), ("models", "models"), ("heterogeneous", "node groups"),
)


def _value(t: TrainTarget, key: str) -> str:
    v = {"models": None}.get(key, getattr(t, key, None))
    if key == "models":
        no = [k for k, ok in (("MLA", t.mla), ("MoE", t.moe), ("ALiBi", t.alibi)) if not ok]
        return "no " + ", ".join(no) if no else "any"
    if key == "cp":
        return f"yes, seq % {t.cp_seq_text}" if t.cp else "no"
    if key == "vpp":
        return ("no" if not t.vpp else "yes" + (", even split" if t.vpp_split == "even" else "")
                + (", M % pp == 0" if t.microbatches == "megatron" else ""))
    if key == "orders":
        return "any" if v is None else " | ".join(",".join(o) for o in v)
    if key == "sp":
        return {"optional": "optional", "with_tp": "always with TP", "never": "no"}[v]
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, frozenset):
        return _stages(v) if v and all(isinstance(x, int) for x in v) else (", ".join(sorted(v)) or "none")
    return str(v)


def table_rows(name: str) -> list[tuple[str, str, str]]:
    """``(feature, value, source)`` rows of a training target's table (each variant's in turn)."""
    t = TRAIN[name]
    tables = [(label, sub) for label, _, sub in t.variants] or [("", t)]
    rows = []
    for label, sub in tables:
        if label:
            rows.append(("backend", label, ""))
        for key, title in FEATURES:
            src = sub.sources.get(key, "")
            rows.append((title, _value(sub, key), src))
    return rows


def summary(name: str) -> dict[str, str]:
    """A training target's table in one short value per feature (the side-by-side table)."""
    t = TRAIN[name]
    subs = [sub for _, _, sub in t.variants] or [t]
    out = {}
    for key, title in FEATURES:
        vals = [_value(s, key) for s in subs]
        out[title] = vals[0] if len(set(vals)) == 1 else " / ".join(vals)
    return out


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def _stages(s: frozenset[int]) -> str:
    return "/".join(str(x) for x in sorted(s)) if s else "none"


def _nearest(z: int, allowed: frozenset[int]) -> int:
    return min(allowed, key=lambda a: (abs(a - z), a))


def _join(xs: Sequence[str]) -> str:
    return ", ".join(xs)


def _round_up(x: int, k: int) -> int:
    return -(-x // k) * k


def _largest_divisor(n: int, below: int) -> int:
    return max(d for d in range(1, min(n, below) + 1) if n % d == 0)


# --------------------------------------------------------------------------------------
# The command that plans for a target
# --------------------------------------------------------------------------------------

def plan_command(plan: Any, target: str, plan_path: str | None = None) -> str:
    """The ``planner plan --target T ...`` command for ``plan``'s problem (same model, cluster,
    GPUs, batch and sequence, dtype and optimizer): a plan ``target`` runs, or the reason it
    has none. A model that is not the catalog's entry of its name is read back from the plan
    file itself (``--like PLAN``)."""
    import shlex

    from costmodel.catalog import get_model, model_names
    w = plan.workload
    target = {"torchrun": "builtin", "slurm": "slurm", "kubernetes": "kubernetes"}.get(target, target)
    catalog_model = plan.model.name in model_names() and get_model(plan.model.name) == plan.model
    src = (plan.provenance or {}).get("cluster_source", "catalog")
    if not catalog_model or (src == "catalog" and ":" in plan.cluster.name):
        if plan_path:
            return f"planner plan --like {shlex.quote(str(plan_path))} --target {target}"
    args = ["planner", "plan"]
    if w.mode == "infer":
        args += ["--mode", "infer"]
    args += ["--model", plan.model.name if catalog_model else f"<{plan.model.name} model file>"]
    whole_file = src != "catalog"
    cluster = src if whole_file else plan.cluster.name
    args += ["--cluster", cluster]
    if not (whole_file and (":" in plan.cluster.name or len(plan.cluster.groups) > 1)):
        args += ["--gpus", str(plan.cluster.total_gpus)]
    if w.mode == "infer":
        args += ["--prompt-len", str(w.prompt_len), "--output-len", str(w.output_len), "--batch", str(w.global_batch)]
    else:
        args += ["--global-batch", str(w.global_batch), "--seq-len", str(w.seq_len)]
    if w.dtype != "bf16":
        args += ["--dtype", w.dtype]
    if w.mode == "train" and w.optimizer != "adamw":
        args += ["--optimizer", w.optimizer]
    args += ["--target", target]
    return " ".join(shlex.quote(a) if not a.startswith("<") else a for a in args)
