"""Hugging Face Accelerate: a config YAML for ``accelerate launch`` and the launch command.

Which backend the config selects follows the plan: tensor or pipeline parallel -> the Megatron-LM
plugin (``distributed_type: MEGATRON_LM``); ZeRO-2/3 or context parallel -> FSDP2
(``fsdp_version: 2``, with ``parallelism_config`` for HSDP and CP); ZeRO-1 -> the DeepSpeed plugin
(stage 1); ZeRO-0 -> DDP (``MULTI_GPU``). Keys as read by accelerate 1.x
(``commands/config/config_args.py``, ``commands/launch.py``, ``utils/launch.py``). The training
script takes the per-device batch (the plan's micro-batch) itself; the launch script exports
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, which ``Accelerator`` reads.
"""
from __future__ import annotations

from emitters.base import (require_no_stage_recompute, CannotExpress, Raw, bash_array, even_stages, full_recompute_all,
                           nodes_and_procs,
                           recompute_per_stage, require, require_mode, require_one_group, require_order,
                           script_header, stage_layers)
from costmodel.frameworks import accelerate_backend
from emitters import accelerate_train
from emitters.base import comment_block
from emitters.encode import yaml_document
from emitters.recipe import Need, checkpoint_need, model_settings, needs_block, priced_assumptions, recipe
from planner.plan.planfile import Plan

TARGET = "accelerate"
MODE = "train"
FORMAT = "Accelerate 1.x config YAML (accelerate launch --config_file), FSDP2 / Megatron-LM plugin"
SUMMARY = "Accelerate config YAML: FSDP2 (HSDP/CP), Megatron-LM plugin for TP/PP, DeepSpeed for ZeRO-1"
RUN = ("`TRAIN_SCRIPT=your_train.py bash accelerate.sh [script args]` on every node (multi-node: "
       "`MACHINE_RANK=<i> MAIN_PROCESS_IP=<node 0>`). Your script builds its DataLoader with the "
       "plan's micro-batch per device.")

PORT = 29500
MIXED = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "no", "float32": "no",
         "tf32": "no", "fp8": "fp8"}


def _megatron(plan: Plan) -> dict:
    p = plan.parallel
    m = plan.model
    require(p.vpp == 1, TARGET, f"vpp={p.vpp}", "the Megatron-LM plugin's config keys have no virtual stages",
            "use the megatron target")
    require(not (p.pp > 1 and p.schedule == "gpipe"), TARGET, "the GPipe schedule", "Megatron runs 1F1B")
    require(p.zero <= 1, TARGET, f"ZeRO-{p.zero} with tp={p.tp} pp={p.pp}",
            "the Megatron-LM plugin offers the distributed optimizer (ZeRO-1) only from a config file")
    require(not (p.zero == 1 and p.hsdp), TARGET, "distributed optimizer over part of dp (HSDP)",
            "the plugin has no --num-distributed-optimizer-instances")
    layers = stage_layers(plan)
    cfg: dict = {"megatron_lm_tp_degree": p.tp, "megatron_lm_pp_degree": p.pp,
                 "megatron_lm_num_micro_batches": p.grad_accum,
                 "megatron_lm_sequence_parallelism": p.sp,
                 "megatron_lm_use_distributed_optimizer": p.zero == 1,
                 "megatron_lm_context_parallel_size": p.cp,
                 "megatron_lm_expert_model_parallel_size": p.ep if m.is_moe else 1,
                 "megatron_lm_expert_tensor_parallel_size": p.tp,
                 "megatron_lm_gradient_clipping": 1.0}
    if p.ep > 1 and not m.is_moe:
        raise CannotExpress(TARGET, f"ep={p.ep}", f"{m.name} has no experts")
    if not even_stages(plan):
        require(len(set(layers[:-1])) == 1, TARGET, f"stage split {layers}",
                "the plugin sets only the last stage's layer count (decoder_last_pipeline_num_layers)",
                "use the megatron target")
        cfg["megatron_lm_decoder_last_pipeline_num_layers"] = layers[-1]
    # accelerate 1.x MegatronLMPlugin defaults recompute_granularity to "full" (method uniform,
    # 1 layer) when read from a config file, so "no recompute" cannot be stated.
    if p.recompute == "none":
        raise CannotExpress(TARGET, "no activation recompute with the Megatron-LM plugin",
                            "accelerate's MegatronLMPlugin turns full recompute on (granularity full, "
                            "method uniform) unless the config file says otherwise, and has no 'off'",
                            "plan recompute=full, or use the megatron target")
    if p.recompute == "selective":
        raise CannotExpress(TARGET, "selective recompute with the Megatron-LM plugin",
                            "the plugin always passes a recompute method, which Megatron rejects with "
                            "selective granularity", "use the megatron target")
    per = recompute_per_stage(plan)
    if per == layers:
        cfg.update(megatron_lm_recompute_granularity="full", megatron_lm_recompute_method="uniform",
                   megatron_lm_recompute_num_layers=1)
    else:
        require(len(set(per)) == 1 and per[0] > 0, TARGET, f"recompute layers per stage {per}",
                "recompute_num_layers is one count for every stage")
        cfg.update(megatron_lm_recompute_granularity="full", megatron_lm_recompute_method="block",
                   megatron_lm_recompute_num_layers=per[0])
    return cfg


def _fsdp(plan: Plan) -> tuple[dict, dict | None]:
    p = plan.parallel
    require(p.zero in (2, 3), TARGET, f"ZeRO-{p.zero} with cp={p.cp}",
            "Accelerate's context parallel runs under FSDP2, which shards parameters (ZeRO-2/3)",
            "plan zero=2 or 3")
    require(p.recompute == "none" or full_recompute_all(plan), TARGET,
            f"{p.recompute} recompute of {recompute_per_stage(plan)} layers",
            "fsdp_activation_checkpointing checkpoints every transformer layer or none",
            "plan recompute=none or full for all layers")
    fsdp = {"fsdp_version": 2, "fsdp_reshard_after_forward": p.zero == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": False, "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": p.recompute == "full"}
    par = None
    if p.hsdp or p.cp > 1:
        par = {"parallelism_config_dp_replicate_size": p.dp // p.dp_shard,
               "parallelism_config_dp_shard_size": p.dp_shard,
               "parallelism_config_tp_size": 1, "parallelism_config_cp_size": p.cp}
    return fsdp, par


def config(plan: Plan, nnodes: int) -> dict:
    p = plan.parallel
    w = plan.workload
    mixed = MIXED.get(w.dtype)
    require(mixed is not None, TARGET, f"dtype {w.dtype}", "Accelerate mixes precision in no/fp16/bf16/fp8")
    cfg: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    engine = accelerate_backend(p)     # the one rule the cost model prices the engine's overlaps by
    if engine == "MEGATRON_LM":
        require_order(plan, TARGET, ("pp", "dp", "cp", "tp"), note=" (Megatron: tp-cp-ep-dp-pp)")
        cfg["distributed_type"] = "MEGATRON_LM"
        cfg["megatron_lm_config"] = _megatron(plan)
    else:
        require_order(plan, TARGET, ("dp", "cp"), note=" (dp_replicate, dp_shard, cp)")
        require(p.ep == 1, TARGET, f"ep={p.ep}", "Accelerate's FSDP/DDP configs have no expert parallel",
                "use the megatron target")
        require(p.overlap_dp_comm or engine not in ("FSDP", "MULTI_GPU") or p.dp * p.cp == 1, TARGET,
                "data-parallel communication without overlap (overlap_dp_comm=false)",
                f"{engine} always overlaps it with backward, and the price must be what runs",
                "plan with overlap_dp_comm=true")
        if engine == "FSDP":
            cfg["distributed_type"] = "FSDP"
            cfg["fsdp_config"], par = _fsdp(plan)
            if par:
                cfg["parallelism_config"] = par
        else:
            require(p.recompute == "none", TARGET, f"{p.recompute} recompute with ZeRO-{p.zero}",
                    "Accelerate's DDP and DeepSpeed configs have no activation checkpointing key",
                    "plan zero=2/3 (FSDP) or recompute=none")
            cfg["distributed_type"] = engine
            if engine == "DEEPSPEED":
                require(not p.hsdp, TARGET, "ZeRO-1 over part of dp (HSDP)", "DeepSpeed removed MiCS")
                cfg["deepspeed_config"] = {"zero_stage": 1, "gradient_accumulation_steps": p.grad_accum,
                                           "gradient_clipping": 1.0, "offload_optimizer_device": "none",
                                           "offload_param_device": "none", "zero3_init_flag": False}
    cfg.update({"mixed_precision": mixed, "num_machines": nnodes, "num_processes": plan.world_size,
                "machine_rank": 0, "main_process_port": PORT, "rdzv_backend": "static",
                "same_network": True, "use_cpu": False})
    if nnodes > 1:
        cfg["main_process_ip"] = "127.0.0.1"
    return cfg


# What each engine needs installed beside accelerate and torch (accelerate/utils/imports.py:
# is_deepspeed_available, is_megatron_lm_available; the Megatron-LM integration,
# accelerate/utils/megatron_lm.py, builds its model classes from transformers' configs)
ENGINE_PACKAGES = {"DEEPSPEED": [("deepspeed", "DeepSpeed (pip install deepspeed): the DEEPSPEED engine runs ZeRO-1"),
                                 ("transformers", "transformers: Accelerate's DeepSpeed plugin reads its version "
                                  "(utils/dataclasses.py DeepSpeedPlugin.set_deepspeed_weakref)")],
                   "MEGATRON_LM": [("megatron", "Megatron-LM (megatron-core and Megatron-LM's megatron/training on "
                                    "PYTHONPATH): the MEGATRON_LM engine runs TP/PP"),
                                   ("transformers", "transformers: Accelerate's Megatron-LM integration reads the "
                                    "model's Hugging Face config")]}


def emit(plan: Plan) -> dict[str, str]:
    require_no_stage_recompute(plan, TARGET)
    require_mode(plan, TARGET, "train")
    require_one_group(plan, TARGET)
    nnodes, _ = nodes_and_procs(plan, TARGET)
    cfg = config(plan, nnodes)
    p = plan.parallel
    engine = accelerate_backend(p)
    pkgs = ["accelerate 1.x", "torch"] + [what.split(" (")[0].split(":")[0] for _, what in ENGINE_PACKAGES.get(engine, [])]
    header = (f"# Generated by `planner emit --target {TARGET}` from a plan; format: {FORMAT}.\n"
              f"# per-device batch (your DataLoader): {p.micro_batch}; gradient accumulation: {p.grad_accum}\n"
              f"# engine: {engine}; needs installed: {', '.join(pkgs)}\n")
    facts = {"MEGATRON_LM": "engine facts: Megatron reduces gradients after backward (the plugin's keys set no "
                            "--overlap-grad-reduce) and overlaps only the backward's column-parallel TP collectives",
             "DEEPSPEED": "engine facts: DeepSpeed's ZeRO-1 runs with overlap_comm off (its default below stage 3; the "
                          "plugin's keys cannot set it) and all-gathers the weights after the step",
             "FSDP": "engine facts: FSDP2 prefetches all-gathers and reduce-scatters gradients during backward"
                     + ("; every micro-batch reduce-scatters, priced so: under accelerator.accumulate() your script "
                        "must build Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps="
                        f"{p.grad_accum}, sync_each_batch=True)) (train_accelerate.py does), else FSDP2 keeps every "
                        "layer's unsharded gradient between micro-batches, which this plan's memory does not hold"
                        if accelerate_train.sync_each_batch(p) else ""),
             "MULTI_GPU": "engine facts: DDP all-reduces gradient buckets during backward"}
    header += comment_block(priced_assumptions(plan, TARGET, [facts[engine]] if engine in facts else []))
    if nnodes > 1:
        header += "# main_process_ip: replace with node 0's address (or set MAIN_PROCESS_IP for accelerate.sh)\n"
    text = header + yaml_document(cfg)
    usage = ["Run on every node: TRAIN_SCRIPT=train.py bash accelerate.sh [script args]",
             "Your script builds the model, the optimizer, the data and the tokenizer; build this model:",
             model_settings(plan)]
    usage += recipe(plan).comment("", "")
    usage += [f"Engine {engine} also needs, in the environment accelerate runs in: {what}"
              for _, what in ENGINE_PACKAGES.get(engine, [])]
    try:
        starter = accelerate_train.script(plan)
        usage.append(f"{accelerate_train.NAME}, shipped here, is a starting point: TRAIN_SCRIPT=$PWD/"
                     f"{accelerate_train.NAME} trains the plan's model on synthetic tokens (or DATA=<token file>); "
                     "replace it with yours")
    except CannotExpress as e:
        starter = None
        usage.append(f"No starting-point script ships for this plan ({e.part}: {e.detail}); bring your own")
    body = needs_block("accelerate.sh", [
        Need("accelerate", "activate the Python environment that has Accelerate 1.x and its torch", kind="cmd"),
        Need("TRAIN_SCRIPT", "your training script (it builds the model, optimizer and data; per-device batch "
             f"{p.micro_batch})", kind="file"),
        checkpoint_need("your script saves with accelerator.save_state(CHECKPOINT_DIR) and resumes with "
                           "accelerator.load_state(CHECKPOINT_DIR)")])
    body += 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    body += f"export ACCELERATE_GRADIENT_ACCUMULATION_STEPS={p.grad_accum}\n"
    body += "export CHECKPOINT_DIR\n"
    args: list = ["--config_file", Raw('"$HERE/accelerate.yaml"')]
    if nnodes > 1:
        args += ["--machine_rank", Raw('"${MACHINE_RANK:-0}"'),
                 "--main_process_ip", Raw('"${MAIN_PROCESS_IP:?set MAIN_PROCESS_IP to node 0}"')]
    body += bash_array("LAUNCH_ARGS", args)
    body += 'exec accelerate launch "${LAUNCH_ARGS[@]}" "$TRAIN_SCRIPT" "$@"\n'
    files = {"accelerate.yaml": text, "accelerate.sh": script_header(plan, TARGET, FORMAT, usage) + body}
    if starter is not None:
        files[accelerate_train.NAME] = starter
    return files
