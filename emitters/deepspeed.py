"""DeepSpeed: the JSON config, a hostfile and the ``deepspeed`` launcher command.

Batch rule (``DeepSpeedConfig._batch_assertion``): ``train_batch_size ==
train_micro_batch_size_per_gpu * gradient_accumulation_steps * world``, where ``world`` is the
data-parallel size when the engine gets a topology (pipelines) and the whole world otherwise;
the config writes all three numbers so DeepSpeed infers nothing. ZeRO stage from the plan,
tensor parallel through AutoTP (``tensor_parallel.autotp_size``), expert parallel through AutoEP
(``expert_parallel``), pipelines through the ``pipeline`` section read by ``PipelineEngine``.
Written for DeepSpeed 0.19 (which removed MiCS, so no hybrid sharding).
"""
from __future__ import annotations

from emitters.base import (require_no_stage_recompute, CannotExpress, Raw, bash_array, even_stages, full_recompute_all,
                           nodes_and_procs,
                           require, require_mode, require_one_group, require_order, script_header,
                           stage_layers)
from emitters.encode import json_text
from emitters.recipe import Need, model_settings, needs_block, recipe, warmup_shell
from planner.plan import targets as T
from planner.plan.planfile import Plan

TARGET = "deepspeed"
MODE = "train"
FORMAT = "DeepSpeed 0.19 config JSON (deepspeed/runtime/config.py) + deepspeed launcher (launcher/runner.py)"
SUMMARY = "DeepSpeed config JSON (batch rule, ZeRO, bf16, pipeline) and launcher command with a hostfile"
RUN = ("Edit `hostfile` to name your nodes (one line per node, `slots=` GPUs), then "
       "`TRAIN_SCRIPT=your_train.py TRAIN_STEPS=<steps> bash deepspeed.sh` on the first node (it writes "
       "`ds_config.run.json`, the config with the run's length, next to itself: multi-node, keep this folder "
       "at the same path on every node, as TRAIN_SCRIPT must be). The script must call "
       "`deepspeed.initialize(..., config=ds_config.json)` (the launcher passes "
       "`--deepspeed --deepspeed_config`) and, with pipeline stages, build "
       "`PipelineModule(num_stages=config['pipeline']['stages'])`.")

MASTER_PORT = 29500


def config(plan: Plan) -> dict:
    p = plan.parallel
    w = plan.workload
    m = plan.model
    require(p.cp == 1, TARGET, f"cp={p.cp}",
            "DeepSpeed has Ulysses sequence parallelism (all-to-all over heads), not ring context "
            "parallelism; the plan's costs assume the latter", "plan cp=1 or use megatron/torchtitan")
    require_order(plan, TARGET, ("pp", "dp", "tp"),
                  note=" (PipeModelDataParallelTopology: pipe, data, model)")
    require(not p.sp, TARGET, "sequence parallel (sp=true)",
            "AutoTP shards weights but has no Megatron-style sequence-parallel norms/dropout",
            "plan sp=false or use megatron")
    require(not (p.tp > 1 and p.pp > 1), TARGET, f"tp={p.tp} with pp={p.pp}",
            "AutoTP (tensor_parallel.autotp_size) does not compose with PipelineModule in the config; "
            "that needs a Megatron mpu in the training script", "use the megatron target")
    if p.zero > 0 and p.hsdp:
        raise CannotExpress(TARGET, f"ZeRO-{p.zero} over groups of {p.dp_shard} of dp={p.dp} (HSDP)",
                            "DeepSpeed 0.19 removed MiCS, its hybrid sharding",
                            "plan dp_shard = dp, or use torchtitan/accelerate (HSDP)")
    require(not (p.zero > 1 and p.pp > 1), TARGET, f"ZeRO-{p.zero} with pp={p.pp}",
            "DeepSpeed's PipelineEngine supports ZeRO stage 0 or 1 only", "plan zero<=1")
    require(w.dtype in ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32"), TARGET,
            f"dtype {w.dtype}", "the config enables bf16 or fp16 mixed precision, or neither (fp32)")
    if p.recompute == "selective":
        raise CannotExpress(TARGET, "selective recompute",
                            "DeepSpeed's config has no attention-only recompute; the model code decides",
                            "plan recompute=none or full")
    if p.recompute == "full":
        # without stages the script checkpoints its blocks itself (Hugging Face gradient_checkpointing_enable()
        # or deepspeed.checkpointing.checkpoint; the activation_checkpointing section configures the latter)
        require(full_recompute_all(plan), TARGET, "recompute of some layers per stage",
                "activation_checkpoint_interval checkpoints every n-th layer boundary and recomputes "
                "all layers; it cannot recompute only the first k", "plan recompute of all layers")
    method = (plan.framework or {}).get("partition_method")
    if p.pp > 1:
        # PipelineModule places the layers itself: the split must be what the plan's method gives
        # (planner.plan.targets.ds_split); an older plan without a method: an even split, as uniform-by-type
        if method is None:
            require(even_stages(plan), TARGET, f"stage split {stage_layers(plan)}",
                    "the plan names no partition_method and PipelineModule balances layers itself",
                    "plan again with --target deepspeed (the plan then names its method)")
            method = f"type:{T.DS_BLOCK_TYPE}"
        got = T.ds_split(plan.model, p.pp, method)
        require(got == tuple(stage_layers(plan)), TARGET, f"stage split {stage_layers(plan)}",
                f"partition_method {method} places {list(got) if got else 'no block on some stage'}",
                "plan again with --target deepspeed")
    require(p.vpp == 1, TARGET, f"vpp={p.vpp}", "PipelineEngine has no interleaved schedule")
    require(not (p.pp > 1 and p.schedule == "gpipe"), TARGET, "the GPipe schedule",
            "PipelineEngine runs 1F1B")

    cfg: dict = {
        "train_batch_size": w.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
        "gradient_clipping": recipe(plan).grad_clip,
        "steps_per_print": 10,
    }
    r = recipe(plan)
    if w.optimizer in ("adam", "adamw"):
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": r.lr, "betas": [r.beta1, r.beta2], "eps": r.eps,
                                                        "weight_decay": r.weight_decay}}
    # total_num_steps is the run's: deepspeed.sh writes it (and the warmup) from TRAIN_STEPS
    cfg["scheduler"] = {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 0, "warmup_num_steps": r.warmup_steps, "warmup_min_ratio": 0.0,
        "cos_min_ratio": 0.1, "warmup_type": "linear"}}
    if w.dtype in ("bf16", "bfloat16"):
        cfg["bf16"] = {"enabled": True}
    elif w.dtype in ("fp16", "float16"):
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    cfg["zero_optimization"] = {"stage": p.zero, "overlap_comm": p.overlap_dp_comm,
                                "contiguous_gradients": True, "reduce_scatter": True}
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    if m.is_moe and p.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": p.ep, "expert_tensor_parallel_size": p.tp}
    elif p.ep > 1:
        raise CannotExpress(TARGET, f"ep={p.ep}", f"{m.name} has no experts")
    if p.recompute == "full" and p.pp == 1:
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    if p.pp > 1:
        cfg["pipeline"] = {"stages": p.pp, "partition": method,
                           "activation_checkpoint_interval": 1 if p.recompute == "full" else 0}
    return cfg


def hostfile(plan: Plan, nnodes: int, nproc: int) -> str:
    if nnodes == 1:
        return f"# one node; deepspeed hostfile: <host> slots=<processes>\nlocalhost slots={nproc}\n"
    return ("# replace node-<i> with your hosts' names (reachable by ssh/pdsh from the first)\n"
            + "".join(f"node-{i} slots={nproc}\n" for i in range(nnodes)))


def emit(plan: Plan) -> dict[str, str]:
    require_no_stage_recompute(plan, TARGET)
    require_mode(plan, TARGET, "train")
    require_one_group(plan, TARGET)
    nnodes, nproc = nodes_and_procs(plan, TARGET)
    cfg = config(plan)
    p = plan.parallel
    usage = ["Edit hostfile, then on the first node: TRAIN_SCRIPT=train.py TRAIN_STEPS=N bash deepspeed.sh [script args]",
             f"train_batch_size {plan.workload.global_batch} = micro {p.micro_batch} x accumulation "
             f"{p.grad_accum} x data-parallel {p.dp}",
             "Your script builds the model, the data and the tokenizer; build this model:", model_settings(plan)]
    if p.pp > 1:
        usage.append(f"PipelineModule layers, in this order: the embedding, {plan.model.layers} x {T.DS_BLOCK_TYPE} (the "
                     f"class name partition_method type: matches), the final norm, the head; ds_config.json's "
                     f"pipeline.partition = {cfg['pipeline']['partition']} places {stage_layers(plan)} blocks per stage")
    elif p.recompute == "full":
        usage.append("Full recompute: your script checkpoints every block (Hugging Face: "
                     "model.gradient_checkpointing_enable(); or deepspeed.checkpointing.checkpoint)")
    usage += recipe(plan).comment("TRAIN_STEPS", "WARMUP_STEPS")
    usage.append("ds_config.json holds the optimizer and a WarmupCosineLR schedule; this script writes "
                 "ds_config.run.json with the run's steps.")
    text = script_header(plan, TARGET, FORMAT, usage)
    text += needs_block("deepspeed.sh", needs(plan))
    text += warmup_shell(recipe(plan), "TRAIN_STEPS", "WARMUP_STEPS")
    text += 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    text += ('RUN_CONFIG="$HERE/ds_config.run.json"\n'
             'sed -e "s/\\"total_num_steps\\": 0/\\"total_num_steps\\": $TRAIN_STEPS/" '
             '-e "s/\\"warmup_num_steps\\": [0-9]*/\\"warmup_num_steps\\": $WARMUP_STEPS/" '
             '"$HERE/ds_config.json" > "$RUN_CONFIG.tmp"\n'
             'mv "$RUN_CONFIG.tmp" "$RUN_CONFIG"\n')
    text += bash_array("LAUNCHER_ARGS", [
        "--hostfile", Raw('"$HERE/hostfile"'), "--num_nodes", nnodes, "--num_gpus", nproc,
        "--master_port", Raw('"${MASTER_PORT:-' + str(MASTER_PORT) + '}"'),
    ])
    # under a cluster launcher (planner emit --launcher slurm|kubernetes|torchrun) each node starts its own
    # processes with torchrun, not the ssh/pdsh runner (planner.plan.targets.STARTS["deepspeed"])
    text += ('if [ "${DS_LAUNCHER:-}" = torchrun ]; then\n'
             f'  exec torchrun --nnodes {nnodes} --nproc-per-node {nproc} --node-rank "${{NODE_RANK:-0}}" '
             '--master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-' + str(MASTER_PORT) + '}" '
             '"$TRAIN_SCRIPT" --deepspeed --deepspeed_config "$RUN_CONFIG" "$@"\n'
             'fi\n')
    text += ('exec deepspeed "${LAUNCHER_ARGS[@]}" "$TRAIN_SCRIPT" '
             '--deepspeed --deepspeed_config "$RUN_CONFIG" "$@"\n')
    return {"ds_config.json": json_text(cfg), "hostfile": hostfile(plan, nnodes, nproc),
            "deepspeed.sh": text}


def needs(plan: Plan) -> list[Need]:
    return [
        Need("deepspeed", "activate the Python environment that has DeepSpeed 0.19 and its torch", kind="cmd"),
        Need("TRAIN_SCRIPT", "your training script (it calls deepspeed.initialize; it builds the model, "
             "the data and the tokenizer)", kind="file"),
        Need("TRAIN_STEPS", "the run's optimizer steps (the cosine schedule ends there)", kind="int"),
    ]
