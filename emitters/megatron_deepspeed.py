"""Megatron-DeepSpeed: pretrain_gpt.py arguments and the ds_config.json it hands to DeepSpeed.

The stack BLOOM-176B, MT-NLG 530B and GPT-NeoX-20B ran on: Megatron's tensor parallelism (its
mpu) inside DeepSpeed's pipeline engine and ZeRO-1. Written for microsoft/Megatron-DeepSpeed
(commit f4157bea; ``megatron/arguments.py`` for every flag, ``megatron/model/gpt_model.py``
``GPTModelPipe`` for the layer list and ``partition_method='type:transformer'``) and DeepSpeed
0.19's config (``deepspeed/runtime/config.py``), written as ``megatron_deepspeed_config.json`` (a
name of its own: the DeepSpeed target writes ``ds_config.json``). The fork's argument parser is not
on PyPI (the repo is not a package), so only the config is read back by a framework's own parser
in the tests (DeepSpeed's ``DeepSpeedConfig``); the flags are checked against the fork's ``arguments.py``
names in ``tests/test_megads.py``.

What the file sets is what the price assumes (``costmodel.frameworks`` ``megatron-deepspeed``):
no TP communication overlap (the fork's TP has none), ``overlap_comm: false`` (the pipeline
engine reduces gradients after the last micro-batch), ZeRO stage from the plan, the stage split
GPTModelPipe's ``type:transformer`` balance gives (``planner.plan.targets.mds_split``).
"""
from __future__ import annotations

from emitters.base import (CannotExpress, Raw, bash_array, full_recompute_all, nodes_and_procs, require,
                           require_mode, require_no_stage_recompute, require_one_group, require_order,
                           script_header, stage_layers)
from emitters.encode import json_text
from emitters.recipe import Need, model_settings, needs_block, recipe, warmup_shell
from planner.plan import targets as T
from planner.plan.planfile import Plan

TARGET = "megatron-deepspeed"
MODE = "train"
FORMAT = ("Megatron-DeepSpeed pretrain_gpt.py flags (microsoft/Megatron-DeepSpeed f4157bea megatron/arguments.py) "
          "+ DeepSpeed 0.19 config JSON")
SUMMARY = "Megatron-DeepSpeed pretrain_gpt.py arguments, its ds_config (ZeRO, pipeline engine) and a launch line"
RUN = ("`MEGATRON_DS=/path/to/Megatron-DeepSpeed DATA_PATH=<indexed dataset prefix> TOKENIZER=<HF tokenizer> "
       "TRAIN_ITERS=<steps> bash megatron_deepspeed.sh` on every node with NODE_RANK=<i> MASTER_ADDR=<node 0>.")

MASTER_PORT = 6000

# what this file cannot say, named in its header
NOT_EXPRESSED = [
    "Attention kernel: the price assumes {kernel} attention; this fork writes the score matrix unless "
    "--use-flash-attn-v2 is given (written when the plan assumes flash).",
    "RoPE scaling (Llama 3.1 style) has no flag in this fork: a model with rope_scaling trains without it.",
]


def _check(plan: Plan) -> None:
    p, m, w = plan.parallel, plan.model, plan.workload
    bad = [x for x in T.problems(TARGET, plan)]
    if bad:
        raise CannotExpress(TARGET, "the plan", "; ".join(bad), f"plan --target {TARGET}")
    require_order(plan, TARGET, ("pp", "dp", "tp"), note=" (PipeModelDataParallelTopology: pipe, data, model)")
    require(w.dtype in ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32"), TARGET, f"dtype {w.dtype}",
            "--bf16, --fp16 or neither (fp32)")
    if p.recompute == "full":
        require(full_recompute_all(plan), TARGET, "recompute of some layers per stage",
                "--checkpoint-activations checkpoints every block", "plan recompute of all layers")
    require(m.attention != "mla" and not m.is_moe, TARGET, m.name, "GPTModelPipe has no MLA or MoE layers")
    require(m.sliding_window == 0 and not m.attention_sinks and not m.attn_softcap and not m.final_softcap,
            TARGET, m.name, "this fork has no sliding-window attention, sinks or soft-capping")
    require(m.head_dim * m.heads == m.hidden, TARGET, f"head_dim {m.head_dim}",
            "--kv-channels with heads*kv_channels != hidden is not priced here")


def ds_config(plan: Plan) -> dict:
    p, w = plan.parallel, plan.workload
    cfg: dict = {
        # DeepSpeed's batch rule with Megatron's mpu: train_batch = micro * accumulation * dp
        "train_batch_size": w.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
        "gradient_clipping": recipe(plan).grad_clip,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
        # priced as not overlapped (costmodel.frameworks megatron-deepspeed): written so
        "zero_optimization": {"stage": p.zero, "overlap_comm": False},
    }
    if w.dtype in ("bf16", "bfloat16"):
        cfg["bf16"] = {"enabled": True}
    elif w.dtype in ("fp16", "float16"):
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return cfg


def model_args(plan: Plan) -> list:
    m, w = plan.model, plan.workload
    out: list = ["--num-layers", m.layers, "--hidden-size", m.hidden, "--ffn-hidden-size", m.ffn_hidden,
                 "--num-attention-heads", m.heads, "--seq-length", w.seq_len,
                 "--max-position-embeddings", max(m.max_seq_len, w.seq_len),
                 "--layernorm-epsilon", f"{m.norm_eps:g}"]
    if m.kv_heads < m.heads:
        out += ["--num-key-value-heads", m.kv_heads]
    if m.mlp == "swiglu":
        out += ["--swiglu"]
    if m.norm == "rmsnorm":
        out += ["--normalization", "rmsnorm"]
    if m.positions == "rotary":
        out += ["--use-rotary-position-embeddings", "--no-position-embedding",
                "--rotary-position-embeddings-theta", int(m.rope_theta)]
    if not m.tied_embeddings:
        out += ["--untie-embeddings-and-output-weights"]
    if not m.bias:
        out += ["--disable-bias-linear"]
    drop = 0.1 if m.dropout else 0.0
    out += ["--attention-dropout", drop, "--hidden-dropout", drop]
    if w.attention_kernel == "flash":
        out += ["--use-flash-attn-v2"]
    return out


def parallel_args(plan: Plan) -> list:
    p = plan.parallel
    out: list = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
                 "--micro-batch-size", p.micro_batch, "--global-batch-size", plan.workload.global_batch,
                 "--deepspeed", "--deepspeed_config", Raw('"$HERE/megatron_deepspeed_config.json"'), "--zero-stage", p.zero]
    if p.pp == 1:
        out += ["--no-pipeline-parallel"]
    if p.recompute == "full":
        out += ["--checkpoint-activations", "--checkpoint-num-layers", 1]
    return out


def training_args(plan: Plan) -> list:
    r, w = recipe(plan), plan.workload
    out: list = ["--train-iters", Raw('"$TRAIN_ITERS"'), "--lr", f"{r.lr:g}", "--min-lr", f"{r.min_lr:g}",
                 "--lr-decay-style", "cosine", "--lr-warmup-iters", Raw('"$WARMUP_ITERS"'),
                 "--optimizer", "adam", "--adam-beta1", r.beta1, "--adam-beta2", r.beta2, "--adam-eps", f"{r.eps:g}",
                 "--weight-decay", r.weight_decay, "--clip-grad", r.grad_clip, "--init-method-std",
                 f"{r.init_std:.4g}", "--log-interval", 1, "--eval-iters", 0, "--eval-interval", 1000]
    if w.dtype in ("bf16", "bfloat16"):
        out += ["--bf16"]
    elif w.dtype in ("fp16", "float16"):
        out += ["--fp16"]
    return out


def emit(plan: Plan) -> dict[str, str]:
    require_no_stage_recompute(plan, TARGET)
    require_mode(plan, TARGET, "train")
    require_one_group(plan, TARGET)
    _check(plan)
    nnodes, nproc = nodes_and_procs(plan, TARGET)
    p = plan.parallel
    usage = ["On every node: NODE_RANK=<i> MASTER_ADDR=<node 0> bash megatron_deepspeed.sh (one node: neither).",
             f"dp = world / (tp*pp) = {plan.world_size} / ({p.tp}*{p.pp}) = {p.dp}; train_batch_size "
             f"{plan.workload.global_batch} = micro {p.micro_batch} x accumulation {p.grad_accum} x dp {p.dp}.",
             model_settings(plan)]
    if p.pp > 1:
        usage.append(f"GPTModelPipe partitions with {T.MDS_METHOD} (written in its model code): "
                     f"{stage_layers(plan)} blocks per stage, as planned.")
    usage.append(NOT_EXPRESSED[0].format(kernel=plan.workload.attention_kernel))
    if plan.model.rope_scaling:
        usage.append(NOT_EXPRESSED[1])
    usage += recipe(plan).comment()
    text = script_header(plan, TARGET, FORMAT, usage) + needs_block("megatron_deepspeed.sh", needs(plan))
    text += warmup_shell(recipe(plan))
    text += 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    if p.tp > 1:
        text += "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron's TP kernels expect ordered streams\n"
    text += bash_array("DISTRIBUTED_ARGS", [
        "--nproc-per-node", nproc, "--nnodes", nnodes, "--node-rank", Raw('"${NODE_RANK:-0}"'),
        "--master-addr", Raw('"${MASTER_ADDR:-localhost}"'),
        "--master-port", Raw('"${MASTER_PORT:-' + str(MASTER_PORT) + '}"')])
    text += bash_array("MODEL_ARGS", model_args(plan))
    text += bash_array("PARALLEL_ARGS", parallel_args(plan))
    text += bash_array("TRAINING_ARGS", training_args(plan))
    text += bash_array("DATA_ARGS", ["--data-path", Raw('"$DATA_PATH"'), "--data-impl", "mmap", "--split", "949,50,1",
                                     "--tokenizer-type", "HFTokenizer", "--tokenizer-model", Raw('"$TOKENIZER"')])
    text += bash_array("CHECKPOINT_ARGS", [])
    text += ('if [ -n "${CHECKPOINT_DIR:-}" ]; then\n'
             '  CHECKPOINT_ARGS+=(--save "$CHECKPOINT_DIR" --load "$CHECKPOINT_DIR" '
             '--save-interval "${CHECKPOINT_EVERY:-1000}")\n'
             'fi\n')
    text += ('exec torchrun "${DISTRIBUTED_ARGS[@]}" "$MEGATRON_DS/pretrain_gpt.py" \\\n'
             '  "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${DATA_ARGS[@]}" '
             '"${CHECKPOINT_ARGS[@]}"\n')
    return {"megatron_deepspeed_config.json": json_text(ds_config(plan)), "megatron_deepspeed.sh": text}


def needs(plan: Plan) -> list[Need]:
    return [
        Need("MEGATRON_DS", "a checkout of microsoft/Megatron-DeepSpeed (pretrain_gpt.py), with DeepSpeed 0.19 "
             "and its torch in the active Python environment", kind="dir"),
        Need("DATA_PATH", "the indexed dataset prefix (tools/preprocess_data.py output)", kind="set"),
        Need("TOKENIZER", "the Hugging Face tokenizer (name or folder)", kind="set"),
        Need("TRAIN_ITERS", "the run's optimizer steps (the cosine schedule ends there)", kind="int"),
    ]
