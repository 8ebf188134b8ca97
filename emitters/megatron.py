"""Megatron-LM / Megatron-Core: ``pretrain_gpt.py`` arguments and a torchrun launch line.

Flag names are those of ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM, 2025-2026;
unchanged by the 2026-01 move to dataclass-generated flags): virtual stages with
``--num-virtual-stages-per-pipeline-rank`` (there is no ``--virtual-pipeline-model-parallel-size``
flag), uneven splits with ``--decoder-first/last-pipeline-num-layers`` or, where those cannot state
the split, ``--pipeline-model-parallel-layout`` (any layers per stage, virtual stages too), ZeRO-1 as
``--use-distributed-optimizer``, ZeRO-2/3 as Megatron-FSDP. Megatron orders ranks
tp-cp-ep-dp-pp (TP innermost), or tp-cp-ep-pp-dp with ``--use-tp-pp-dp-mapping``.
"""
from __future__ import annotations

from emitters.base import (CannotExpress, Raw, bash_array, nodes_and_procs, recompute_per_stage, require,
                           virtual_counts,
                           require_mode, require_one_group, require_order, script_header, stage_layers)
from costmodel.frameworks import NO_TP_OVERLAP_DTYPES, framework_profile, tp_overlap_of
from emitters.recipe import (Need, checkpoint_need, model_settings, needs_block, priced_assumptions, recipe, sci,
                             warmup_shell)
from planner.plan.planfile import Plan
from planner.plan.targets import FUSED_MLP_INTERLEAVE, default_fp8_recipe, dispatcher_fabric_problem, fused_mlp_problem

TARGET = "megatron"
MODE = "train"
FORMAT = "Megatron-LM pretrain_gpt.py flags (megatron/training/arguments.py, core_r0.13+ / 2026 main)"
SUMMARY = "Megatron-LM pretrain_gpt.py arguments with a torchrun launch line"
RUN = ("`MEGATRON=/path/to/Megatron-LM DATA_PATH=<indexed dataset prefix> TOKENIZER=<HF tokenizer> "
       "TRAIN_ITERS=<steps> CHECKPOINT_DIR=<dir> bash megatron.sh` on every node (multi-node: also `NODE_RANK` "
       "and `MASTER_ADDR`, which the script requires); "
       "`MOCK_DATA=1` instead of DATA_PATH and TOKENIZER trains on synthetic tokens. The script checks each "
       "value before it starts.")

MASTER_PORT = 6000


def _moe_layer_pattern(plan: Plan) -> str | None:
    """``--moe-layer-freq`` as Megatron's list expression, e.g. ``([0]*3+[1]*58)``; None for every layer."""
    m = plan.model
    flags = [1 if m.is_moe_layer(i) else 0 for i in range(m.layers)]
    if all(flags):
        return None
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def model_args(plan: Plan) -> list:
    m = plan.model
    w = plan.workload
    a: list = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden,
               "--num-attention-heads", m.heads]
    if m.attention == "mla":
        a += ["--multi-latent-attention", "--kv-lora-rank", m.kv_lora_rank, "--qk-head-dim", m.qk_nope_head_dim,
              "--qk-pos-emb-head-dim", m.qk_rope_head_dim, "--v-head-dim", m.v_head_dim]
        if m.q_lora_rank:
            a += ["--q-lora-rank", m.q_lora_rank]
    else:
        a += ["--kv-channels", m.head_dim]
        if m.kv_heads < m.heads:
            a += ["--group-query-attention", "--num-query-groups", m.kv_heads]
    a += ["--seq-length", w.seq_len, "--max-position-embeddings", max(m.max_seq_len, w.seq_len)]
    if m.positions == "alibi":
        raise CannotExpress(TARGET, "ALiBi positions", f"{m.name} uses ALiBi and Megatron-Core GPT offers "
                            "learned_absolute, rope, mrope, relative and none")
    a += ["--position-embedding-type", "rope" if m.positions == "rotary" else "learned_absolute"]
    if m.positions == "rotary":
        require(float(m.rope_theta).is_integer(), TARGET, f"rope_theta {m.rope_theta}",
                "--rotary-base takes an integer")
        a += ["--rotary-base", int(m.rope_theta)]
        if m.rope_scaling:
            a += ["--use-rope-scaling", "--rope-scaling-factor", m.rope_scaling]
    a += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm", "--norm-epsilon", m.norm_eps]
    if m.mlp == "swiglu":
        a.append("--swiglu")
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        a.append("--disable-bias-linear")
        if m.qkv_bias:
            a.append("--add-qkv-bias")        # Qwen2: biases on q, k, v only
    if not m.dropout:
        a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    a += ["--make-vocab-size-divisible-by", vocab_divisor(m.vocab, plan.parallel.tp),
          "--init-method-std", recipe(plan).init_std]
    a += ["--attention-backend", attention_backend(plan)]
    if m.is_moe:
        a += ["--num-experts", m.num_experts, "--moe-router-topk", m.top_k,
              "--moe-ffn-hidden-size", m.expert_ffn_hidden]
        if m.shared_experts:
            a += ["--moe-shared-expert-intermediate-size", m.shared_experts * m.shared_expert_ffn_hidden]
        pattern = _moe_layer_pattern(plan)
        if pattern:
            a += ["--moe-layer-freq", pattern]
        a += moe_args(plan)
    return a


# How this file runs MoE layers: the alltoall dispatcher with Transformer Engine's fused permutation
# and router (the Megatron-Core MoE README's performance recommendations). The megatron profile
# prices exactly these (``costmodel.frameworks`` ``FRAMEWORKS["megatron"].moe``, rules in
# ``costmodel.moe``); tests/test_moe_etp.py parses the file back and holds the two together.
MOE_DISPATCHER = "alltoall"
MOE_PERMUTE_FUSION = True
MOE_ROUTER_FUSION = True
# --moe-grouped-gemm without --moe-use-legacy-grouped-gemm: Transformer Engine's GroupedLinear, one GEMM
# call per local expert (priced: costmodel.moe.expert_gemm_host_floor_s); no --cuda-graph-impl: MoE
# layers run eagerly (priced: costmodel.moe.MEGATRON_LAYER_HOST_S).


def moe_args(plan: Plan) -> list:
    """The MoE execution flags (``MOE_*`` above) and the router as the model's config has it: its
    score function, group-limited routing, and its balancing, whose coefficient sets the priced
    load factor (``costmodel.moe.load_factor``; an unknown coefficient is priced as a weak loss and
    written as 1e-3, Qwen3's). Megatron-Core 0.16 names (transformer_config.py)."""
    m, p = plan.model, plan.parallel
    # the plan's dispatcher and EP overlap (ParallelConfig.moe_dispatcher / ep_overlap, priced by
    # costmodel.stage_cache over the profile's; the target's table says what Megatron accepts)
    disp = p.moe_dispatcher or MOE_DISPATCHER
    if disp in ("deepep", "hybridep"):
        # the flex dispatcher's backend with its SMs, as priced (costmodel.moe: DeepEP's as compute lost
        # while it overlaps, comm_sm_share; HybridEP's rate by its SMs, hybridep_fraction)
        sms = "--moe-deepep-num-sms" if disp == "deepep" else "--moe-hybridep-num-sms"
        a: list = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", disp, sms,
                   _flex_sms(disp)]
    else:
        a = ["--moe-token-dispatcher-type", MOE_DISPATCHER]
    a.append("--moe-grouped-gemm")
    if (plan.framework or {}).get("fused_grouped_mlp"):
        # the plan's framework setting (planner.plan.targets.SWITCHES), priced as TE's fused grouped MLP
        # (costmodel.moe.fused_mlp_elementwise; one grouped kernel per matrix, not a GEMM per expert);
        # Megatron-Core asserts where its fused path cannot run, so the file refuses those plans first
        why = fused_mlp_problem(TARGET, m, plan.workload, plan.cluster.groups[0].gpu, p)
        if why:
            raise CannotExpress(TARGET, "framework.fused_grouped_mlp", why)
        a += ["--use-transformer-engine-op-fuser", "--moe-mlp-glu-interleave-size", FUSED_MLP_INTERLEAVE]
    if p.ep_overlap:
        a.append("--overlap-moe-expert-parallel-comm")
        if _delay_wgrad():
            # the backward all-to-alls priced beside the experts' weight gradients too
            # (costmodel.moe.ep_backward_window_s); Megatron-Core accepts it only with the overlap
            a.append("--delay-wgrad-compute")
    if p.offload_modules:
        # Megatron-Core's fine-grained activation offloading of the priced modules (costmodel.stage_terms
        # offload_terms; its NVTE_CPU_OFFLOAD_V1 export is in the file's environment)
        a += ["--fine-grained-activation-offloading", "--offload-modules", *p.offload_modules]
    if MOE_PERMUTE_FUSION:
        a.append("--moe-permute-fusion")
    if MOE_ROUTER_FUSION:
        a.append("--moe-router-fusion")
    a += ["--moe-router-dtype", "fp32"]
    if m.router_scoring == "sigmoid":
        a += ["--moe-router-score-function", "sigmoid"]
    if m.router_groups:
        a += ["--moe-router-num-groups", m.router_groups, "--moe-router-group-topk", m.router_topk_groups]
    if m.mtp_layers:
        # DeepSeek-V3's multi-token prediction (priced on the last stage: costmodel.training); the
        # report's loss weight 0.1 for the first 10T tokens (Sec. 4.2)
        a += ["--mtp-num-layers", m.mtp_layers, "--mtp-loss-scaling-factor", "0.1"]
    if m.router_balance == "aux_free":
        # DeepSeek-V3: the bias update (rate 1e-3, Sec. 2.1.2) and a small sequence-wise loss
        a += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1e-3",
              "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", sci(m.router_aux_coeff or 1e-4)]
    else:
        a += ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", sci(m.router_aux_coeff or 1e-3)]
    return a


def _delay_wgrad() -> bool:
    """Whether Megatron's profile prices the EP overlap with delayed weight gradients
    (``MoeExecution.delay_wgrad``): the file writes what the price assumes."""
    return framework_profile(TARGET).moe.delay_wgrad


def _flex_sms(dispatcher: str) -> int:
    """The flex backend's SMs as Megatron's profile prices them (``MoeExecution.deepep_sms`` or
    ``hybridep_sms``)."""
    ex = framework_profile(TARGET).moe
    return ex.deepep_sms if dispatcher == "deepep" else ex.hybridep_sms


def moe_notes(plan: Plan) -> list[str]:
    """The header's lines on the MoE execution the price rests on and the file cannot check: DeepEP's
    SMs, and its fabric across nodes (``costmodel.specs.LinkSpec.rdma``, the rule of
    ``costmodel.moe.deepep_fabric_problem``). A DeepEP plan whose EP group must leave the NVLink
    domain over a link that is not RDMA is refused."""
    p, c = plan.parallel, plan.cluster
    notes = []
    if p.ep_overlap and _delay_wgrad():
        # Megatron's validate_args (core_v0.16.0): --delay-wgrad-compute needs Transformer Engine's layers,
        # and TE >= 2.8 with --overlap-grad-reduce (2.7 without gradient-accumulation fusion)
        notes.append("--delay-wgrad-compute (the EP overlap's backward all-to-alls beside the experts' weight "
                     "gradients, as priced) needs Transformer Engine >= 2.8 with --overlap-grad-reduce")
    if (plan.framework or {}).get("fused_grouped_mlp"):
        notes.append("framework.fused_grouped_mlp: Transformer Engine's fused grouped MLP (priced: the experts' SwiGLU "
                     "and MXFP8 casts in the grouped GEMMs' epilogues) needs TE 2.14 or later with cuDNN frontend's "
                     "CuTe DSL kernels (nvidia-cudnn-frontend[cutedsl]); Megatron-Core stores the experts' FC1 rows "
                     f"gate and up interleaved in blocks of {FUSED_MLP_INTERLEAVE} (--moe-mlp-glu-interleave-size): a "
                     "checkpoint written without it needs its FC1 rows reordered")
    if p.offload_modules:
        gpu = c.groups[0].gpu
        notes.append(f"--offload-modules {' '.join(p.offload_modules)}: priced over the host link at "
                     f"{gpu.host_link_bytes_per_s / 1e9:g} GB/s a direction per GPU (the cluster's "
                     f"host_link_gb_per_s), reloads hidden where the schedule leaves compute beside them; the host "
                     f"memory they fill ({gpu.host_memory_bytes / 2 ** 30:g} GiB a GPU here) is not checked; Megatron-LM "
                     "with offloading on binds each rank's CPU affinity at start, which needs cuda-python and pynvml installed")
    disp = p.moe_dispatcher or MOE_DISPATCHER
    if disp not in ("deepep", "hybridep"):
        return notes
    inter = c.inter_node
    why, hint = dispatcher_fabric_problem(disp, p.ep, c.nvlink_gpus, c.gpus_per_node, inter.rdma)
    if why:
        raise CannotExpress(TARGET, f"moe_dispatcher {disp} with ep={p.ep} over {c.nvlink_gpus}-GPU NVLink domains of "
                            f"{c.gpus_per_node}-GPU hosts, inter-node link {inter.name!r}", why, hint)
    if disp == "hybridep":
        where = (f"; across NVLink domains it needs GPU-initiated RDMA, priced on the inter-node link {inter.name} "
                 f"({inter.bandwidth_bytes_per_s / 1e9:g} GB/s)" if p.ep > c.nvlink_gpus else
                 f"; the EP group stays inside one {c.nvlink_gpus}-GPU NVLink domain")
        return notes + [f"HybridEP (--moe-flex-dispatcher-backend hybridep) priced at its measured rate on "
                        f"{_flex_sms(disp)} SMs (--moe-hybridep-num-sms; costmodel.moe.HYBRIDEP_GB_PER_S){where}"]
    return notes + [f"DeepEP (--moe-flex-dispatcher-backend deepep) priced with its kernels on {_flex_sms(disp)} SMs "
            f"(--moe-deepep-num-sms) taken from the compute they overlap; across nodes it needs GPU-initiated RDMA "
            f"(NVSHMEM over InfiniBand or RoCE, DeepEP's README), priced on the inter-node link {inter.name} "
            f"({inter.bandwidth_bytes_per_s / 1e9:g} GB/s)"]


# The attention kernel the price assumes, as Megatron's --attention-backend (AttnBackend in
# megatron/core/transformer/enums.py: flash, fused, unfused, local, auto). The cost model prices a
# workload's "flash" kernel as the kernel Megatron's default ``auto`` runs (the Megatron profile's
# attention "te", costmodel.attention): it leaves the choice to Transformer Engine, which picks
# cuDNN's fused attention on Hopper and later and FlashAttention on Ampere (TE's
# dot_product_attention/utils.py get_attention_backend, "give FusedAttention preference on Hopper+").
# ``flash`` would force flash-attn (FA2 on Hopper unless FA3 is installed); a
# "materialized" workload is Megatron's ``unfused`` path (the s x s scores stored).
ATTENTION_BACKEND = {"flash": "auto", "materialized": "unfused"}


def attention_backend(plan: Plan) -> str:
    return ATTENTION_BACKEND[plan.workload.attention_kernel]


def attention_note(plan: Plan) -> str:
    """The header's line on the attention kernel: which one the price assumes and what the file asks."""
    if plan.workload.attention_kernel == "flash":
        return ("attention priced as the kernel Transformer Engine picks (costmodel.attention \"te\": cuDNN fused "
                "attention on Hopper+, FlashAttention-2 on Ampere, by head dim, sequence, mask and direction); "
                "written --attention-backend auto")
    return "attention priced unfused (scores materialized and stored); written --attention-backend unfused"


def tp_comm_overlap(plan: Plan) -> bool:
    """Whether the file turns on ``--tp-comm-overlap``: where the cost model prices full TP
    overlap for Megatron (``costmodel.frameworks.tp_overlap_mode``: sequence parallel, TP inside one
    NVLink domain, a GPU with CUDA multicast). Elsewhere Megatron's backward-only overlap is priced
    and the flag stays off."""
    return tp_overlap_of(TARGET, plan.parallel, plan.mesh_order, plan.cluster.nvlink_gpus,
                         plan.cluster.gpu.name, plan.workload.dtype) == "full"


def not_expressed(plan: Plan) -> list[str]:
    """Model settings and assumptions the file cannot set, for its header."""
    m = plan.model
    out = [attention_note(plan)]
    if m.sliding_window:
        out.append(f"sliding-window attention ({m.sliding_window} tokens"
                   + (f", every {m.sliding_window_pattern}-th layer global" if m.sliding_window_pattern else "")
                   + "): not written; pretrain_gpt.py's flags set no per-layer window, so every layer attends fully")
    if m.attention_sinks or m.attn_softcap or m.final_softcap:
        out.append("attention sinks / logit soft-capping: not written (no pretrain_gpt.py flag)")
    if plan.workload.dtype == "nvfp4":
        out.append("NVFP4 priced as Transformer Engine's default NVFP4BlockScaling (random Hadamard transform on the "
                   "weight-gradient operands, stochastic rounding of the gradients, 16x16 weight blocks: the file sets no "
                   "NVTE_NVFP4_DISABLE_* variable) on every transformer layer (no BF16 first or last layers); attention, "
                   "embedding and output layer in BF16; weights gathered in BF16 (no --fp4-param-gather)")
    if tp_comm_overlap(plan):
        out.append("priced with TP communication overlapped with the GEMMs (--tp-comm-overlap, bootstrap nccl): "
                   "it needs Transformer Engine built with userbuffers (the NGC PyTorch container's is)")
    elif plan.parallel.tp > 1 and plan.workload.dtype in NO_TP_OVERLAP_DTYPES:
        out.append(f"priced with Megatron's backward-only TP overlap: --tp-comm-overlap is not written, as Transformer "
                   f"Engine's userbuffers cannot gather {plan.workload.dtype} inputs")
    elif plan.parallel.tp > 1:
        out.append("priced with Megatron's backward-only TP overlap: --tp-comm-overlap needs sequence parallel, "
                   "TP inside one NVLink domain and a GPU with CUDA multicast (Hopper or later; Transformer "
                   "Engine's userbuffers need UB_SKIPMC=1 before that), which this plan does not have")
    return out


def _virtual_counts(plan: Plan) -> list[int]:
    """Layers of each virtual stage in pipeline order (``emitters.base.virtual_counts``)."""
    return virtual_counts(plan)


def layout(plan: Plan) -> str:
    """``--pipeline-model-parallel-layout``: ``E`` (embedding) on the first stage, ``t*n`` decoder
    layers per stage, ``m`` per multi-token-prediction module and ``L`` (loss) on the last, stages
    separated by ``|`` (Megatron's
    ``PipelineParallelLayerLayout`` expands ``t*n``)."""
    counts = _virtual_counts(plan)
    last = len(counts) - 1
    mtp = "m" * plan.model.mtp_layers          # multi-token prediction, before the loss
    return "|".join(("E" if s == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + (mtp + "L" if s == last else "")
                    for s, n in enumerate(counts))


def vocab_divisor(vocab: int, tp: int) -> int:
    """``--make-vocab-size-divisible-by``: the largest power of two up to Megatron's default 128
    for which Megatron's padding (to a multiple of divisor * tp) leaves the model's vocabulary as
    it is; 1 when no divisor does (vocab not a multiple of tp: Megatron pads, see padded_vocab)."""
    d = 128
    while d > 1 and vocab % (d * tp):
        d //= 2
    return d


def padded_vocab(vocab: int, tp: int) -> int:
    """The embedding rows Megatron builds: vocab rounded up to a multiple of divisor * tp."""
    k = vocab_divisor(vocab, tp) * tp
    return -(-vocab // k) * k


def _pipeline_split_args(plan: Plan) -> list:
    p = plan.parallel
    layers = stage_layers(plan)
    if p.pp == 1:
        return []
    if p.vpp > 1:
        if len(set(layers)) == 1 and plan.model.layers % (p.pp * p.vpp) == 0:
            return ["--num-virtual-stages-per-pipeline-rank", p.vpp]
        return ["--pipeline-model-parallel-layout", layout(plan)]   # uneven virtual stages
    if len(set(layers)) == 1:
        return []
    if p.pp == 2:
        return ["--decoder-first-pipeline-num-layers", layers[0]]
    middle = layers[1:-1]
    if len(set(middle)) > 1:
        return ["--pipeline-model-parallel-layout", layout(plan)]   # any split
    out: list = []
    if layers[0] != middle[0]:
        out += ["--decoder-first-pipeline-num-layers", layers[0]]
    if layers[-1] != middle[0]:
        out += ["--decoder-last-pipeline-num-layers", layers[-1]]
    return out


# Megatron's selective recompute as the megatron profile prices it where a plan names no modules
# (FrameworkProfile.selective_recompute)
RECOMPUTE_MODULES = ("core_attn",)


def _recompute_args(plan: Plan) -> list:
    p = plan.parallel
    per_stage = recompute_per_stage(plan)
    if p.recompute == "none" and not any(per_stage):
        return []
    if p.recompute == "selective":
        require(not any(per_stage), TARGET, f"selective recompute plus full recompute of {per_stage} layers",
                "Megatron takes one recompute granularity", "re-plan with --recompute selective only")
        # the module set the price assumes (the plan's recompute_modules, costmodel.layers' LayerCost.modules;
        # else core_attn, costmodel.layers.core_attn_recompute), written even where it is Megatron's default
        # so that a changed default cannot change what runs
        return ["--recompute-granularity", "selective", "--recompute-modules", *(p.recompute_modules or RECOMPUTE_MODULES)]
    layers = stage_layers(plan)
    if per_stage == layers:
        # every layer: checkpoint each layer's input (uniform groups of one layer)
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    require(len(set(per_stage)) == 1, TARGET, f"recompute layers per stage {per_stage}",
            "--recompute-num-layers is one count for every pipeline stage",
            "plan the same number of recomputed layers on every stage")
    k = per_stage[0]
    if k == 0:
        return []
    if p.vpp > 1:
        require(k % p.vpp == 0, TARGET, f"{k} recomputed layers per stage with vpp={p.vpp}",
                "the block method recomputes the first N layers of each virtual stage")
        k //= p.vpp
    return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", k]


def _data_parallel_args(plan: Plan) -> tuple[list, bool]:
    """(flags, uses Megatron-FSDP)."""
    p = plan.parallel
    a: list = []
    fsdp = False
    if p.zero == 1:
        a.append("--use-distributed-optimizer")
        if p.hsdp:
            a += ["--num-distributed-optimizer-instances", p.dp // p.dp_shard]
    elif p.zero in (2, 3):
        require(not p.hsdp, TARGET, f"ZeRO-{p.zero} over groups of {p.dp_shard} of dp={p.dp} (HSDP)",
                "Megatron-FSDP shards over the whole data-parallel group",
                "plan zero=1 (distributed optimizer instances) or dp_shard = dp")
        fsdp = True
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads" if p.zero == 2 else "optim_grads_params", "--ckpt-format", "fsdp_dtensor"]
    if p.overlap_dp_comm and p.dp * p.cp > 1:
        a.append("--overlap-grad-reduce")
        if p.zero >= 1:
            a.append("--overlap-param-gather")
    return a, fsdp


def parallel_args(plan: Plan) -> tuple[list, bool]:
    p = plan.parallel
    m = plan.model
    w = plan.workload
    mapping = require_order(plan, TARGET, ("pp", "dp", "cp", "tp"), ("dp", "pp", "cp", "tp"))
    require(not (p.pp > 1 and p.schedule == "gpipe"), TARGET, "the GPipe schedule",
            "Megatron runs 1F1B, or interleaved 1F1B with virtual stages", "plan schedule=1f1b")
    if p.cp > 1:
        require(w.seq_len % (2 * p.cp) == 0, TARGET, f"cp={p.cp} with seq_len={w.seq_len}",
                "Megatron needs seq-length to be a multiple of 2 * context-parallel-size")
    a: list = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
               "--context-parallel-size", p.cp]
    if mapping == 1:
        a.append("--use-tp-pp-dp-mapping")
    if m.is_moe:
        # the expert layout (MoE parallel folding: etp x ep over the stage's tp x cp x dp ranks)
        a += ["--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size", p.etp]
    elif p.ep > 1:
        raise CannotExpress(TARGET, f"ep={p.ep}", f"{m.name} has no experts")
    if p.sp:
        a.append("--sequence-parallel")
    if tp_comm_overlap(plan):
        a += ["--tp-comm-overlap", "--tp-comm-bootstrap-backend", "nccl"]
    a += _pipeline_split_args(plan)
    a += _recompute_args(plan)
    dp_args, fsdp = _data_parallel_args(plan)
    return a + dp_args, fsdp


# Python's garbage collector, as NVIDIA's own Megatron runs set it. --manual-gc disables the automatic collector and
# collects on every rank at the same steps (megatron/training/training.py at 9c5258f109: gc.disable() at the start,
# gc.collect() when iteration % --manual-gc-interval == 0; training_config.py's help: it "helps to align the timing
# of the collection across ranks which mitigates the impact of CPU-associated jitters"). Left automatic, each rank
# pauses for a collection at its own moment and the step waits for the one that paused: costmodel.scale prices the
# per-rank jitter of a healthy fleet (2%), with no such pauses. Megatron-LM's dense H100 example sets --manual-gc
# (examples/llama/train_llama3_8b_h100_fp8.sh) and every MoE recipe sets it with an interval of 5 or 10 steps
# (examples/moe_recipes/*.yaml: 11 of 18 at 5), as does Megatron-MoE-ModelZoo's Qwen3-30B config (5), a run
# MEGATRON_LAYER_HOST_S is fitted on. The interval: 5 for MoE models, as those runs; 100 for dense models, a choice
# (the default 0 collects only around evaluation, which this file turns off, so the heap would grow for the whole
# run; at 100 a collection's pause, not priced, falls on one step in a hundred).
MANUAL_GC_INTERVAL_MOE = 5
MANUAL_GC_INTERVAL_DENSE = 100


def training_args(plan: Plan) -> list:
    p = plan.parallel
    w = plan.workload
    dtype = {"bf16": ["--bf16"], "bfloat16": ["--bf16"], "fp16": ["--fp16"], "float16": ["--fp16"],
             "fp32": [], "float32": [], "tf32": [], "fp8": ["--bf16", "--fp8-format", "hybrid"],
             # Transformer Engine's NVFP4BlockScaling with its defaults (costmodel.fp8.nvfp4 prices them)
             "nvfp4": ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]}.get(w.dtype)
    if dtype is None:
        raise CannotExpress(TARGET, f"dtype {w.dtype}", "Megatron trains in fp32, fp16, bf16, fp8 or nvfp4 (TE)")
    fp8_recipe = w.fp8_recipe if w.dtype == "fp8" else ""
    if fp8_recipe:
        # the recipe the plan was priced with (the planner records it; costmodel.fp8), in
        # Megatron's --fp8-recipe names (Transformer Engine's current scaling is "tensorwise");
        # a plan that names none gets Megatron's default (delayed)
        name = {"delayed": "delayed", "current": "tensorwise", "mxfp8": "mxfp8", "blockwise": "blockwise"}.get(fp8_recipe)
        if name is None:
            raise CannotExpress(TARGET, f"fp8 recipe {fp8_recipe}", "Megatron's FP8 recipes are delayed, current "
                                "(tensorwise), mxfp8 and blockwise; torchao's tensorwise/rowwise are torchtitan's")
        dtype = dtype + ["--fp8-recipe", name]
    if w.fp8_param_gather:
        dtype = dtype + ["--fp8-param-gather"]
    if (plan.framework or {}).get("grads_bf16"):
        # the plan's framework setting (planner.plan.targets.SWITCHES), priced as a BF16 gradient
        # buffer (costmodel.memory.bytes_per_param)
        if w.dtype not in ("bf16", "bfloat16", "fp8", "nvfp4"):
            raise CannotExpress(TARGET, f"framework.grads_bf16 with dtype {w.dtype}",
                                "--grad-reduce-in-bf16 is for BF16 (or FP8, NVFP4) training; drop the setting")
        dtype = dtype + ["--grad-reduce-in-bf16"]
    if (plan.framework or {}).get("adam_moments_bf16"):
        # priced as costmodel.memory.adam_state_bytes_bf16_moments: BF16 moments and TE's 16-bit
        # master remainders, which hold where TE keeps the master weights of BF16 parameters
        if w.optimizer == "sgd" or w.dtype not in ("bf16", "bfloat16", "fp8", "nvfp4"):
            raise CannotExpress(TARGET, f"framework.adam_moments_bf16 with {w.optimizer} in {w.dtype}",
                                "Megatron's precision-aware optimizer is Adam's, for BF16 (or FP8) training; "
                                "drop the setting")
        runs = ("nvfp4" if w.dtype == "nvfp4"
                else fp8_recipe or default_fp8_recipe(TARGET, plan.cluster.groups[0].gpu))   # what the price took
        if w.dtype in ("fp8", "nvfp4") and (runs != "delayed" or w.fp8_param_gather):
            raise CannotExpress(TARGET, f"framework.adam_moments_bf16 with recipe {runs}"
                                + (" and --fp8-param-gather" if w.fp8_param_gather else ""),
                                "only FP8's delayed scaling without FP8 parameters leaves Transformer Engine the "
                                "BF16 master remainders the price assumes; drop the setting")
        if plan.parallel.zero != 1:
            raise CannotExpress(TARGET, f"framework.adam_moments_bf16 with zero={plan.parallel.zero}",
                                "--use-precision-aware-optimizer needs Megatron's distributed optimizer (zero=1)")
        dtype = dtype + ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    r = recipe(plan)
    opt: list = ["--optimizer", "sgd" if w.optimizer == "sgd" else "adam"]
    if w.optimizer != "sgd":   # Megatron's adam is AdamW (decoupled weight decay)
        opt += ["--adam-beta1", r.beta1, "--adam-beta2", r.beta2, "--adam-eps", r.eps]
    return (["--micro-batch-size", p.micro_batch, "--global-batch-size", w.global_batch]
            + dtype + opt
            + ["--seed", w.seed, "--train-iters", Raw('"$TRAIN_ITERS"'),
               "--lr", Raw(f'"${{LR:-{sci(r.lr)}}}"'), "--min-lr", Raw(f'"${{MIN_LR:-{sci(r.min_lr)}}}"'),
               "--lr-warmup-iters", Raw('"$WARMUP_ITERS"'),
               "--lr-decay-iters", Raw('"$TRAIN_ITERS"'),
               "--lr-decay-style", "cosine", "--weight-decay", r.weight_decay, "--clip-grad", r.grad_clip,
               "--log-interval", "1", "--manual-gc", "--manual-gc-interval",
               MANUAL_GC_INTERVAL_MOE if plan.model.is_moe else MANUAL_GC_INTERVAL_DENSE])


def needs(plan: Plan) -> list[Need]:
    m = plan.model
    return [
        Need("MEGATRON", "your Megatron-LM checkout (core_r0.13 or later), the folder with pretrain_gpt.py",
             kind="file", path_in="pretrain_gpt.py"),
        Need("torchrun", "activate the Python environment that has torch and Megatron-LM's requirements "
             "(e.g. source /path/to/venv/bin/activate)", kind="cmd"),
        Need("TRAIN_ITERS", "the run's optimizer steps (the cosine schedule ends there)", kind="int"),
        Need("DATA_PATH", "your Megatron indexed dataset prefix (tools/preprocess_data.py output, without "
             ".bin/.idx)", unless="MOCK_DATA"),
        Need("TOKENIZER", f"the Hugging Face tokenizer of {m.name} (name or path; HuggingFaceTokenizer, "
             f"{m.vocab} tokens)", unless="MOCK_DATA"),
        checkpoint_need("Megatron saves there (--save) and resumes from it (--load)"),
    ] + ([Need("NODE_RANK", "this node's index, 0 to nodes-1 (0 on the node that is MASTER_ADDR)"),
          Need("MASTER_ADDR", "the address of node 0, reachable from every node")]
         if nodes_and_procs(plan, TARGET)[0] > 1 else [])


def emit(plan: Plan) -> dict[str, str]:
    require_mode(plan, TARGET, "train")
    require_one_group(plan, TARGET)
    nnodes, nproc = nodes_and_procs(plan, TARGET)
    par, fsdp = parallel_args(plan)
    p = plan.parallel
    usage = ["Run from anywhere with the values below set; multi-node: on every node with",
             "NODE_RANK=<i> MASTER_ADDR=<node 0>. MOCK_DATA=1 trains on synthetic tokens (NullTokenizer).",
             f"Megatron derives dp = world / (tp*pp*cp) = {plan.world_size} / "
             f"({p.tp}*{p.pp}*{p.cp}) = {p.dp} and micro-batches per step = "
             f"global / (micro * dp) = {plan.workload.global_batch} / ({p.micro_batch}*{p.dp}) = {p.grad_accum}."]
    env = ""
    if p.ep_overlap and not fsdp:
        # the EP overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (Megatron-Core MoE README, "Requirements for EP
        # A2A Overlap"); 32 as the Megatron-MoE-ModelZoo's 1F1B-overlap recipe sets it (interactive_benchmarking.sh)
        env += "export CUDA_DEVICE_MAX_CONNECTIONS=32  # EP all-to-all overlap: needs more than one connection\n"
    elif (p.tp > 1 or p.cp > 1) and not fsdp:
        env += "export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP communication overlap (not with Megatron-FSDP)\n"
    elif fsdp:
        # Megatron-FSDP refuses to start with CUDA_DEVICE_MAX_CONNECTIONS=1 (megatron/training/arguments.py:
        # "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset."), which TP recipes often leave exported
        env += "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs it unset or above 1\n"
    if (plan.framework or {}).get("fused_grouped_mlp") and plan.model.is_moe:
        # Megatron-Core's GroupedMLP takes TE's CuTe DSL kernel only with this set (moe/experts.py
        # _is_fused_impl_supported, core_v0.19.0)
        env += "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1  # TE's fused grouped MLP (framework.fused_grouped_mlp)\n"
    if p.offload_modules:
        # Megatron-LM refuses fine-grained activation offloading under Transformer Engine 2.10+ without it
        # (megatron/training/arguments.py at d98e8a64: "to avoid offloading weights")
        env += "export NVTE_CPU_OFFLOAD_V1=1  # fine-grained activation offloading (parallel.offload_modules)\n"
    m = plan.model
    pad = padded_vocab(m.vocab, p.tp)
    usage += [model_settings(plan) + (f"; Megatron pads the vocabulary to {pad} rows for tp={p.tp}"
                                      if pad != m.vocab else "; vocabulary kept unpadded (MOCK_DATA too: "
                                      "NullTokenizer adds one EOD token to --vocab-size)")]
    usage += not_expressed(plan) + moe_notes(plan)
    usage += priced_assumptions(plan, TARGET, [
        "engine facts: Megatron's linear layers overlap the backward's column-parallel input-gradient collectives "
        "with the weight-gradient GEMMs, with or without --tp-comm-overlap; its NaN/Inf checks of each gradient "
        "bucket and loss stay on (its default; priced: a host sync each, one read of the gradients a step)"])
    usage += recipe(plan).comment()
    text = script_header(plan, TARGET, FORMAT, usage) + needs_block("megatron.sh", needs(plan))
    text += warmup_shell(recipe(plan)) + env
    text += bash_array("DISTRIBUTED_ARGS", [
        "--nproc-per-node", nproc, "--nnodes", nnodes,
        "--node-rank", Raw('"$NODE_RANK"' if nnodes > 1 else '0'),
        "--master-addr", Raw('"$MASTER_ADDR"' if nnodes > 1 else 'localhost'),
        "--master-port", Raw('"${MASTER_PORT:-' + str(MASTER_PORT) + '}"'),
    ])
    text += bash_array("MODEL_ARGS", model_args(plan))
    text += bash_array("PARALLEL_ARGS", par)
    text += bash_array("TRAINING_ARGS", training_args(plan))
    text += ('if [ -n "${MOCK_DATA:-}" ]; then\n'
             + _indent(bash_array("DATA_ARGS", ["--mock-data", "--tokenizer-type", "NullTokenizer",
                                                "--vocab-size", m.vocab - 1]))
             + "else\n"
             + _indent(bash_array("DATA_ARGS", ["--data-path", Raw('"$DATA_PATH"'), "--tokenizer-type",
                                                "HuggingFaceTokenizer", "--tokenizer-model", Raw('"$TOKENIZER"')]))
             + "fi\n"
             + 'DATA_ARGS+=(--split 949,50,1)\n')
    text += bash_array("CHECKPOINT_ARGS", ["--eval-iters", 0, "--eval-interval", 1000])
    text += ('CHECKPOINT_ARGS+=(--save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" '
             '--save-interval "${CHECKPOINT_EVERY:-1000}")\n')
    text += ('exec torchrun "${DISTRIBUTED_ARGS[@]}" "$MEGATRON/pretrain_gpt.py" \\\n'
             '  "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${DATA_ARGS[@]}" '
             '"${CHECKPOINT_ARGS[@]}"\n')
    return {"megatron.sh": text}


def _indent(text: str) -> str:
    return "".join("  " + line + "\n" for line in text.splitlines())
