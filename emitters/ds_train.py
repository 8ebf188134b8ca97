"""The minimal training script shipped beside the DeepSpeed files (``train_deepspeed.py``): a
documented starting point, not a model library. It builds a pre-norm decoder of the plan's shape
(RMSNorm or LayerNorm with the model's eps, RoPE with the model's base, grouped-query attention,
SwiGLU or GELU, tied or untied embeddings), feeds it synthetic tokens or a token file, runs the
engine the config describes, saves a checkpoint to ``CHECKPOINT_DIR`` and resumes from it, and
prints one JSON line per rank at the end (world size, loss per step, a checksum of the parameters).
What it does not do: pipeline stages (``PipelineModule``), AutoTP, MoE layers, RoPE scaling and
sliding windows; ``script(plan)`` refuses those plans so the file never trains another model.
"""
from __future__ import annotations

from emitters.base import CannotExpress, comment_block
from planner.plan.planfile import Plan

NAME = "train_deepspeed.py"

_BODY = r'''
import argparse
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import deepspeed


def norm():
    if MODEL["norm"] == "rmsnorm":
        return nn.RMSNorm(MODEL["hidden"], eps=MODEL["eps"])
    return nn.LayerNorm(MODEL["hidden"], eps=MODEL["eps"])


def rope(x, theta):
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        h, hd = MODEL["hidden"], MODEL["head_dim"]
        self.attn_norm, self.mlp_norm = norm(), norm()
        self.wq = nn.Linear(h, MODEL["heads"] * hd, bias=MODEL["qkv_bias"])
        self.wk = nn.Linear(h, MODEL["kv_heads"] * hd, bias=MODEL["qkv_bias"])
        self.wv = nn.Linear(h, MODEL["kv_heads"] * hd, bias=MODEL["qkv_bias"])
        self.wo = nn.Linear(MODEL["heads"] * hd, h, bias=MODEL["bias"])
        gated = MODEL["mlp"] == "swiglu"
        self.w1 = nn.Linear(h, MODEL["ffn"], bias=MODEL["bias"])
        self.w3 = nn.Linear(h, MODEL["ffn"], bias=MODEL["bias"]) if gated else None
        self.w2 = nn.Linear(MODEL["ffn"], h, bias=MODEL["bias"])

    def forward(self, x):
        b, s, hd = x.shape[0], x.shape[1], MODEL["head_dim"]
        y = self.attn_norm(x)
        q = self.wq(y).view(b, s, -1, hd)
        k = self.wk(y).view(b, s, -1, hd)
        v = self.wv(y).view(b, s, -1, hd)
        if MODEL["rope_theta"]:
            q, k = rope(q, MODEL["rope_theta"]), rope(k, MODEL["rope_theta"])
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        y = self.mlp_norm(x)
        hidden = F.silu(self.w1(y)) * self.w3(y) if self.w3 is not None else F.gelu(self.w1(y), approximate="tanh")
        return x + self.w2(hidden)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(MODEL["vocab"], MODEL["hidden"])
        self.pos = None if MODEL["rope_theta"] else nn.Embedding(MODEL["seq_len"], MODEL["hidden"])
        self.blocks = nn.ModuleList(Block() for _ in range(MODEL["layers"]))
        self.norm = norm()
        self.head = nn.Linear(MODEL["hidden"], MODEL["vocab"], bias=False)
        if MODEL["tied"]:
            self.head.weight = self.tok.weight

    def forward(self, tokens):
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))[None]
        for blk in self.blocks:
            x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False) if CHECKPOINT_LAYERS else blk(x)
        return self.head(self.norm(x))


def batches(args, micro, rank, world):
    """Micro-batches of [micro, seq_len + 1] ids: a token file (uint16 up to 65,536 ids, else
    uint32), or synthetic ids; each rank reads its own slice of every step."""
    t = MODEL["seq_len"] + 1
    if args.data:
        ids = np.memmap(args.data, dtype="uint16" if MODEL["vocab"] <= 65536 else "uint32", mode="r")
    step = 0
    while True:
        g = torch.Generator().manual_seed(1000003 * step + rank)
        if args.data:
            starts = torch.randint(0, len(ids) - t, (micro,), generator=g).tolist()
            yield torch.from_numpy(np.stack([np.asarray(ids[s:s + t], dtype=np.int64) for s in starts]))
        else:
            yield torch.randint(0, MODEL["vocab"], (micro, t), generator=g)
        step += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "10")))
    p.add_argument("--data", default=os.environ.get("DATA", ""))
    p.add_argument("--local_rank", type=int, default=-1)
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)                      # every rank starts from the same weights
    model = Decoder()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    ckpt = os.environ["CHECKPOINT_DIR"]
    if os.path.exists(os.path.join(ckpt, "latest")):
        engine.load_checkpoint(ckpt)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    data = batches(args, engine.train_micro_batch_size_per_gpu(), rank, world)
    losses = []
    for _ in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            ids = next(data)
            logits = engine(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
            engine.backward(loss)
            engine.step()
        losses.append(float(loss))
    engine.save_checkpoint(ckpt)
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        checksum = float(sum(x.detach().double().sum() for x in params))
    print(json.dumps({"rank": rank, "world": world, "zero": engine.zero_optimization_stage(),
                      "losses": losses, "checksum": checksum, "steps": engine.global_steps}), flush=True)
    torch.distributed.barrier()               # no rank closes its sockets while a peer is in the last collective
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # leave without the interpreter's teardown: on CPU, gloo's threads are destroyed there and sometimes
    # abort the process ("terminate called without an active exception") after the work is done
    os._exit(0)
'''


# The model and data code of the script, shared with Accelerate's starting point (emitters/accelerate_train.py)
MODEL_CODE = _BODY[_BODY.index("\ndef norm():"):_BODY.index("\ndef main():")]


def model_constants(plan: Plan, target: str = "deepspeed", launcher: str = "deepspeed.sh") -> dict:
    """The ``MODEL`` dict the script's decoder is built from, or CannotExpress for a plan whose model
    or layout the plain decoder does not build."""
    m, p = plan.model, plan.parallel
    refuse = [(p.pp > 1, f"pp={p.pp}", "the starting-point script builds no PipelineModule"),
              (p.tp > 1, f"tp={p.tp}", "the starting-point script does not call AutoTP"),
              (m.is_moe, "mixture of experts", "the starting-point script builds dense layers only"),
              (m.attention != "mha", "multi-latent attention", "the starting-point script has GQA attention"),
              (m.positions == "alibi", "ALiBi positions", "the starting-point script has RoPE or learned positions"),
              (bool(m.rope_scaling), "RoPE scaling", "the starting-point script has plain RoPE"),
              (bool(m.sliding_window), "sliding windows", "the starting-point script attends fully")]
    for bad, part, why in refuse:
        if bad:
            raise CannotExpress(target, part, why, f"write your own TRAIN_SCRIPT; {launcher} runs it")
    return dict(layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                 ffn=m.ffn_hidden, vocab=m.vocab, seq_len=plan.workload.seq_len, mlp=m.mlp, norm=m.norm,
                 eps=float(m.norm_eps), rope_theta=float(m.rope_theta) if m.positions == "rotary" else 0.0,
                 tied=m.tied_embeddings, bias=m.bias, qkv_bias=m.bias or m.qkv_bias)


def script(plan: Plan) -> str:
    """``train_deepspeed.py`` for the plan's model, or CannotExpress for what it does not build."""
    p = plan.parallel
    model = model_constants(plan)
    head = ('"""A starting point for deepspeed.sh, generated by `planner emit --target deepspeed`: the plan\'s\n'
            'model as a plain pre-norm decoder (see emitters/ds_train.py). Replace the model and the data with yours."""\n'
            + comment_block([f"model: {plan.model.name}"]))
    consts = (f"MODEL = {model!r}\n"
              f"CHECKPOINT_LAYERS = {p.recompute == 'full'!r}   # the plan's recompute: each layer's input kept\n")
    return head + _BODY.replace("\nimport deepspeed\n", "\nimport deepspeed\n\n" + consts, 1)
