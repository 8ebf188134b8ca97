"""The minimal training script shipped beside the Accelerate files (``train_accelerate.py``): a
documented starting point, not a model library. It builds the plan's model as the same plain
pre-norm decoder as DeepSpeed's starting point (``emitters/ds_train.py`` owns that code:
``MODEL_CODE``, ``model_constants``), feeds it synthetic tokens or a token file, and runs whatever
engine ``accelerate.yaml`` selects (FSDP2, DDP, DeepSpeed ZeRO-1) through ``Accelerator.prepare``:
gradient accumulation from ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (accelerate.sh exports it),
the plan's per-device batch, AdamW with the recipe's hyper-parameters, gradient clipping at 1.0,
``save_state``/``load_state`` in ``CHECKPOINT_DIR``. At the end each rank prints one JSON line
(world size, engine, loss per step, a checksum of the full parameters, the steps done).
Activation checkpointing is the engine's (``fsdp_activation_checkpointing``), never the script's.
What it does not build (the Megatron-LM engine's TP/PP, MoE, MLA, ...) ``script(plan)`` refuses.
"""
from __future__ import annotations

from costmodel.frameworks import accelerate_backend
from emitters import ds_train
from emitters.base import CannotExpress, comment_block
from emitters.recipe import recipe
from planner.plan.planfile import Plan

NAME = "train_accelerate.py"

_MAIN = r'''

class Steps:
    """The optimizer steps done, saved and restored with the Accelerator's state."""
    def __init__(self):
        self.done = 0

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, d):
        self.done = int(d["done"])


def full(p):
    """A parameter as one full tensor (FSDP2 shards it as a DTensor)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "10")))
    p.add_argument("--data", default=os.environ.get("DATA", ""))
    args = p.parse_args()
    # the engine accelerate.yaml selects; accumulation from the environment (accelerate.sh exports it)
    steps = int(os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1"))
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=steps,
                                                                              sync_each_batch=SYNC_EACH_BATCH))
    torch.manual_seed(0)         # every rank starts from the same weights
    model = Decoder()
    opt = torch.optim.AdamW(model.parameters(), **OPTIMIZER)
    if acc.state.deepspeed_plugin is not None:
        # DeepSpeed learns the per-device batch from a DataLoader given to prepare(), else from its config
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = MICRO_BATCH
    model, opt = acc.prepare(model, opt)
    steps = Steps()
    acc.register_for_checkpointing(steps)
    ckpt = os.environ["CHECKPOINT_DIR"]
    if os.path.isdir(ckpt) and os.listdir(ckpt):
        acc.load_state(ckpt)
    data = batches(args, MICRO_BATCH, acc.process_index, acc.num_processes)
    losses = []
    for _ in range(args.steps):
        for _ in range(acc.gradient_accumulation_steps):
            with acc.accumulate(model):
                ids = next(data)
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
        losses.append(float(loss))
        steps.done += 1
    acc.save_state(ckpt)
    with torch.no_grad():
        checksum = float(sum(full(x).detach().double().sum() for x in model.parameters()))
    print(json.dumps({"rank": acc.process_index, "world": acc.num_processes,
                      "engine": str(acc.distributed_type).split(".")[-1],
                      "accumulation": acc.gradient_accumulation_steps, "mixed_precision": acc.mixed_precision,
                      "sync_each_batch": bool(acc.gradient_state.plugin_kwargs.get("sync_each_batch")),
                      "losses": losses, "checksum": checksum, "steps": steps.done}), flush=True)
    acc.wait_for_everyone()                   # no rank closes its sockets while a peer is in the last collective
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # leave without the interpreter's teardown: on CPU, gloo's threads are destroyed there and sometimes
    # abort the process ("terminate called without an active exception") after the work is done
    os._exit(0)
'''

_IMPORTS = '''
import argparse
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
'''


def _sync_why(p) -> str:
    if sync_each_batch(p):
        return "FSDP2 reduce-scatters every micro-batch and keeps only its gradient shard, as priced"
    if p.grad_accum == 1:
        return "one micro-batch per step: nothing to skip"
    return "gradients reduce once per step, on the last micro-batch, as priced"


def sync_each_batch(p) -> bool:
    """Whether the script must keep Accelerate from skipping the gradient sync between micro-batches.

    Under ``accelerate.accumulate`` Accelerate calls ``no_sync`` on every micro-batch but the last
    (accelerate 1.x ``Accelerator.accumulate`` and ``no_sync``): on FSDP2 that is
    ``set_requires_gradient_sync(False)``, which skips the reduce-scatter and keeps each layer's
    *unsharded* gradient until the last micro-batch -- the whole model's gradients per rank, memory
    the plan's ZeRO-2/3 price does not hold (it prices sharded gradients and a reduce-scatter per
    micro-batch, ``costmodel.stage_terms``). ``GradientAccumulationPlugin(sync_each_batch=True)``
    keeps the sync on, so the FSDP2 run is the one priced. DDP (ZeRO-0) and DeepSpeed ZeRO-1 are
    priced with one reduction per step, which ``no_sync`` gives: left as Accelerate has it."""
    return accelerate_backend(p) == "FSDP" and p.grad_accum > 1


def script(plan: Plan) -> str:
    """``train_accelerate.py`` for the plan, or CannotExpress for a plan it does not train."""
    p = plan.parallel
    engine = accelerate_backend(p)
    if engine == "MEGATRON_LM":
        raise CannotExpress("accelerate", f"the Megatron-LM engine (tp={p.tp}, pp={p.pp})",
                            "the starting-point script builds a plain torch decoder, not Megatron-LM's model",
                            "write your own TRAIN_SCRIPT; accelerate.sh runs it")
    model = ds_train.model_constants(plan, "accelerate", "accelerate.sh")
    r = recipe(plan)
    opt = {"lr": r.lr, "betas": (r.beta1, r.beta2), "eps": r.eps, "weight_decay": r.weight_decay}
    head = ('"""A starting point for accelerate.sh, generated by `planner emit --target accelerate`: the plan\'s\n'
            'model as a plain pre-norm decoder (see emitters/accelerate_train.py). Replace the model and the data '
            'with yours."""\n' + comment_block([f"model: {plan.model.name}; engine: {engine}"]))
    consts = (f"MODEL = {model!r}\n"
              f"MICRO_BATCH = {p.micro_batch!r}   # the plan's per-device batch\n"
              f"OPTIMIZER = {opt!r}   # emitters/recipe.py\n"
              "CHECKPOINT_LAYERS = False   # activation checkpointing is the engine's (accelerate.yaml)\n"
              f"SYNC_EACH_BATCH = {sync_each_batch(p)!r}   # {_sync_why(p)}\n")
    return head + _IMPORTS + "\n" + consts + ds_train.MODEL_CODE + _MAIN
