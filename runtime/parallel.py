"""Parallelism as data, applied as a short ordered pass (torchtitan's ``parallelize_llama``).

``Dims.from_plan`` checks a plan against what the runtime can run, once, with every number in
the message. ``build_mesh`` makes the device mesh in the plan's mesh order (outer to inner),
with the data-parallel dimension expanded to ``dp_replicate x dp_shard_mod_ep x ep`` so that
HSDP and expert parallel are slices of one mesh:

    dp           = dp_replicate * dp_shard_mod_ep * ep   (data loading, loss average)
    dp_shard     = dp_shard_mod_ep * ep                  (FSDP for dense parameters)
    ep                                                  (experts spread, all-to-all dispatch)
    dp_shard_mod_ep                                     (FSDP for expert parameters)

``parallelize`` then applies, to one model part (a whole model or one pipeline stage):

1. tensor parallel (+ sequence parallel, loss parallel on the head) from ``tp_plan``: a dict
   of module name to ``ParallelStyle``;
2. expert parallel: expert weights become DTensors on ``ep`` (x ``tp``: the FFN dimension)
   and the MoE dispatcher becomes all-to-all;
3. activation checkpointing: the first ``recompute_layers`` blocks of the stage fully, the
   rest op-selectively (the attention core) when ``recompute == selective``;
4. data parallel: FSDP2 ``fully_shard`` for ZeRO-3 (ZeRO-2: ``reshard_after_forward=False``),
   HSDP on a 2-D mesh when ``dp_shard < dp``, FSDP-style ``replicate`` (DDP) for ZeRO-0/1.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn as nn

from costmodel.specs import ModelSpec, ParallelConfig, kv_heads_shard

from .errors import PlanNotRunnable


@dataclass(frozen=True)
class Dims:
    pp: int
    dp: int
    cp: int
    tp: int
    ep: int
    dp_replicate: int      # HSDP replicas (1 unless ZeRO-3 with dp_shard < dp)
    dp_shard: int          # FSDP shard group size (dp for DDP: everything is replicated)
    zero: int
    sp: bool
    order: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def dp_shard_mod_ep(self) -> int:
        return self.dp_shard // self.ep

    @property
    def fsdp(self) -> bool:
        return self.zero >= 2

    @classmethod
    def from_plan(cls, model: ModelSpec, par: ParallelConfig, order: tuple[str, ...], seq_len: int,
                  global_batch: int, world_size: int | None = None) -> "Dims":
        problems = []
        if world_size is not None and par.world_size != world_size:
            problems.append(f"the plan needs tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = "
                            f"{par.world_size} processes but the launch has {world_size}")
        if par.cp > 1:
            problems.append(f"cp {par.cp} > 1: context parallel is not supported by the built-in runtime "
                            "(torch's CPU attention has no sharding rule for it); plan with cp=1")
        if model.heads % par.tp:
            problems.append(f"tp {par.tp} does not divide heads {model.heads}")
        if not kv_heads_shard(model, par.tp):
            problems.append(f"tp {par.tp} does not divide kv_heads {model.kv_heads} (the runtime shards "
                            "K/V heads; it does not replicate them)")
        if model.ffn_hidden % par.tp or (model.is_moe and model.expert_ffn_hidden % par.tp):
            problems.append(f"tp {par.tp} does not divide ffn_hidden {model.ffn_hidden}"
                            + (f" / expert_ffn_hidden {model.expert_ffn_hidden}" if model.is_moe else ""))
        if model.positions == "learned" and model.max_seq_len % par.tp:
            problems.append(f"tp {par.tp} does not divide max_seq_len {model.max_seq_len} (learned positions "
                            "are sharded like the vocabulary)")
        if par.sp and seq_len % par.tp:
            problems.append(f"sequence parallel: tp {par.tp} does not divide seq_len {seq_len}")
        zero3 = par.zero >= 2
        dp_shard = par.dp_shard if zero3 else par.dp
        if par.ep > 1:
            if not model.is_moe:
                problems.append(f"ep {par.ep} > 1 but {model.name} has no experts")
            elif model.num_experts % par.ep:
                problems.append(f"ep {par.ep} does not divide num_experts {model.num_experts}")
            if dp_shard % par.ep:
                problems.append(f"ep {par.ep} must divide the data-parallel shard group {dp_shard} "
                                f"(dp {par.dp}, dp_shard {par.dp_shard}): experts are spread over dp ranks")
        if global_batch != par.dp * par.micro_batch * par.grad_accum:
            problems.append(f"dp*micro_batch*grad_accum = {par.dp}*{par.micro_batch}*{par.grad_accum} = "
                            f"{par.dp * par.micro_batch * par.grad_accum}, but global_batch is {global_batch}")
        if problems:
            raise PlanNotRunnable("; ".join(problems))
        return cls(pp=par.pp, dp=par.dp, cp=par.cp, tp=par.tp, ep=par.ep,
                   dp_replicate=par.dp // dp_shard, dp_shard=dp_shard, zero=par.zero, sp=par.sp,
                   order=tuple(order))

    def mesh_dims(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for d in self.order:
            if d == "dp":
                out += [("dp_replicate", self.dp_replicate), ("dp_shard_mod_ep", self.dp_shard_mod_ep),
                        ("ep", self.ep)]
            else:
                out.append((d, getattr(self, d)))
        return out


def build_mesh(dims: Dims, device_type: str):
    """The world mesh in the plan's order, with the flattened data-parallel views ``dp`` and
    ``dp_shard`` (sliced back from the root mesh, as torchtitan's 2025 ``ParallelDims`` does;
    torch 2.13 warns that this will change, the warning is silenced here)."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    names, sizes = zip(*dims.mesh_dims())
    mesh = init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))
    mesh[("dp_replicate", "dp_shard_mod_ep", "ep")]._flatten("dp")
    mesh[("dp_shard_mod_ep", "ep")]._flatten("dp_shard")
    return mesh


def tied_pair_group(mesh, dims: Dims):
    """With tied embeddings split over pipeline stages: the group of {first stage, last stage}
    ranks that share every other coordinate (None on middle-stage ranks)."""
    import torch.distributed as dist
    layout = mesh.mesh                              # rank ids, one axis per mesh dim
    ax = mesh.mesh_dim_names.index("pp")
    first = layout.select(ax, 0).reshape(-1).tolist()
    last = layout.select(ax, dims.pp - 1).reshape(-1).tolist()
    group, _ = dist.new_subgroups_by_enumeration([[a, b] for a, b in zip(first, last)])
    return group


# --------------------------------------------------------------------------------------
# 1. Tensor parallel, as data
# --------------------------------------------------------------------------------------

def tp_plan(part: nn.Module, spec: ModelSpec, sp: bool) -> dict[str, Any]:
    """Module name -> parallel style for one model part (torchtitan's llama plan, extended to
    GPT-style learned positions, biases and MoE layers)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                                   PrepareModuleOutput, RowwiseParallel, SequenceParallel)
    seq = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {}
    if part.embed is not None:
        if part.embed.pos is None:
            plan["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        else:   # both tables vocab/position-parallel; the sum is split over the sequence after
            plan["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
            plan["embed.pos"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
            if sp:
                plan["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    if part.norm is not None:
        if sp:
            plan["norm"] = SequenceParallel()
        # loss parallel: logits stay sharded over the vocabulary
        plan["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    for key, blk in part.layers.items():
        p = f"layers.{key}"
        if sp:
            plan[f"{p}.attention_norm"] = SequenceParallel()
            plan[f"{p}.ffn_norm"] = SequenceParallel()
            plan[f"{p}.attention"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for w in ("wq", "wk", "wv"):
            plan[f"{p}.attention.{w}"] = ColwiseParallel()
        plan[f"{p}.attention.wo"] = RowwiseParallel(output_layouts=seq)
        if blk.moe is None:
            if sp:
                plan[f"{p}.feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                               desired_input_layouts=(Replicate(),))
            plan[f"{p}.feed_forward.w1"] = ColwiseParallel()
            plan[f"{p}.feed_forward.w2"] = RowwiseParallel(output_layouts=seq)
            if blk.feed_forward.w3 is not None:
                plan[f"{p}.feed_forward.w3"] = ColwiseParallel()
        else:
            # The MoE layer sees every token of the sequence on each TP rank; routed experts are
            # split on their FFN dimension (runtime.parallel.apply_experts), shared ones as an MLP.
            if sp:
                plan[f"{p}.moe"] = PrepareModuleInputOutput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                    output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)
            if blk.moe.shared is not None:
                plan[f"{p}.moe.shared.w1"] = ColwiseParallel()
                plan[f"{p}.moe.shared.w2"] = RowwiseParallel(output_layouts=Replicate())
                if blk.moe.shared.w3 is not None:
                    plan[f"{p}.moe.shared.w3"] = ColwiseParallel()
    return plan


def apply_tp(part: nn.Module, tp_mesh, spec: ModelSpec, sp: bool) -> None:
    from torch.distributed.tensor.parallel import parallelize_module
    parallelize_module(part, tp_mesh, tp_plan(part, spec, sp))
    part.retie()


# --------------------------------------------------------------------------------------
# 2. Expert parallel (and expert tensor parallel)
# --------------------------------------------------------------------------------------

class AllToAllDispatch:
    """Expert-parallel token dispatch: tokens grouped by global expert go to the rank owning the
    expert (``all_to_all_single``, uneven splits, differentiable), are computed there grouped
    by local expert, and come back in their original order."""

    def __init__(self, group, ep: int, num_experts: int):
        self.group, self.ep, self.local = group, ep, num_experts // ep

    def __call__(self, experts, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd
        ep, el = self.ep, self.local
        by_dest = counts.view(ep, el).contiguous()              # [dest rank, its local expert]
        recv_counts = torch.empty_like(by_dest)                 # [source rank, my local expert]
        dist.all_to_all_single(recv_counts, by_dest, group=self.group)
        send = by_dest.sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        xr = all_to_all_single_autograd(xs.contiguous(), recv, send, self.group)
        # regroup source-major -> expert-major
        segs = torch.arange(sum(recv), device=xs.device).split(recv_counts.reshape(-1).tolist())
        perm = torch.cat([segs[s * el + e] for e in range(el) for s in range(ep)]) if segs else \
            torch.zeros(0, dtype=torch.long, device=xs.device)
        ys = experts(xr[perm], recv_counts.sum(0).tolist())
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=perm.device)
        return all_to_all_single_autograd(ys[inv].contiguous(), send, recv, self.group)


def apply_experts(part: nn.Module, mesh, dims: Dims) -> None:
    """Expert weights become DTensors: dim 0 (experts) over ``ep``, the FFN dimension over ``tp``."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    if dims.ep == 1 and dims.tp == 1:
        return
    names = tuple(n for n, k in (("ep", dims.ep), ("tp", dims.tp)) if k > 1)
    sub = mesh[names] if len(names) > 1 else mesh[names[0]]
    ffn_dim = {"w1": 2, "w3": 2, "w2": 1, "b1": 1, "b3": 1, "b2": None}
    for blk in part.layers.values():
        moe = getattr(blk, "moe", None)
        if moe is None:
            continue
        ex = moe.experts
        for n, d in ffn_dim.items():
            p = getattr(ex, n)
            if p is None:
                continue
            pl = []
            if dims.ep > 1:
                pl.append(Shard(0))
            if dims.tp > 1:
                pl.append(Shard(d) if d is not None else Replicate())
            setattr(ex, n, nn.Parameter(distribute_tensor(p.data, sub, pl, src_data_rank=None)))
        if dims.ep > 1:
            moe.dispatch = AllToAllDispatch(mesh["ep"].get_group(), dims.ep, moe.num_experts)
            # an expert's gradient sums the tokens of all ep ranks; the data-parallel average over
            # dp/ep replicas then leaves it ep times too large
            ex.grad_scale = 1.0 / dims.ep
        if dims.tp > 1:
            ex.tp_group = mesh["tp"].get_group()


# --------------------------------------------------------------------------------------
# 3. Activation checkpointing
# --------------------------------------------------------------------------------------

# ops whose outputs selective recompute keeps: the matrix multiplies and the collectives
# (torchtitan's op-level SAC save list, without the attention kernels)
_SAVE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "linear", "embedding", "all_reduce",
                       "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "wait_tensor"})


def _sac_policy(ctx, op, *args, **kwargs):
    """Selective recompute (Korthikanti et al. 2022): keep the matmul outputs, recompute the
    attention core and the cheap elementwise work (norms, rotary, activations) in backward.
    Saving only out-of-place matmuls also never keeps a tensor a later in-place op changes."""
    from torch.utils.checkpoint import CheckpointPolicy
    name = getattr(op, "__name__", str(op)).split(".")[0]
    return CheckpointPolicy.MUST_SAVE if name in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(part: nn.Module, full_layers: int, selective: bool) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    for j, key in enumerate(list(part.layers.keys())):
        blk = part.layers[key]
        if j < full_layers:
            part.layers[key] = checkpoint_wrapper(blk, preserve_rng_state=False)
        elif selective:
            part.layers[key] = checkpoint_wrapper(
                blk, preserve_rng_state=False, context_fn=partial(create_selective_checkpoint_contexts, _sac_policy))


def recompute_layers(par: ParallelConfig, num_layers: int, stage_recompute: int) -> int:
    """Fully recomputed blocks of a stage: the cost model's one rule
    (``ParallelConfig.full_recompute_layers``)."""
    return par.full_recompute_layers(num_layers, stage_recompute)


# --------------------------------------------------------------------------------------
# 4. Data parallel
# --------------------------------------------------------------------------------------

def _unwrap(m: nn.Module) -> nn.Module:
    return getattr(m, "_checkpoint_wrapped_module", m)


def apply_dp(part: nn.Module, mesh, dims: Dims, pp_enabled: bool, mp_dtype: torch.dtype | None) -> None:
    if dims.dp == 1:
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32) if mp_dtype else MixedPrecisionPolicy()
    if dims.fsdp:
        dense = mesh[("dp_replicate", "dp_shard")] if dims.dp_replicate > 1 else mesh["dp_shard"]
        expert = mesh[("dp_replicate", "dp_shard_mod_ep")] if dims.dp_replicate > 1 else mesh["dp_shard_mod_ep"]
        raf = dims.zero >= 3 and not pp_enabled

        def wrap(m, msh, last=False):
            fully_shard(m, mesh=msh, mp_policy=mp, reshard_after_forward=False if last else raf)
    else:
        from torch.distributed._composable.replicate_with_fsdp import replicate
        dense, expert = mesh["dp"], mesh["dp_shard_mod_ep"]

        def wrap(m, msh, last=False):
            replicate(m, mesh=msh, mp_policy=mp)
    for mods, kind in dp_wrapped_modules(part, dims.ep):
        wrap(mods, expert if kind == "expert" else dense, last=kind == "head")


def dp_wrapped_modules(part: nn.Module, ep: int) -> list[tuple[Any, str]]:
    """What ``apply_dp`` wraps in FSDP2, in order, each with its kind ("expert": a MoE block's
    experts under expert parallelism, on the expert mesh; "head": the final norm with the output
    layer; "module" otherwise): every block (its experts first under EP), the embedding and the
    head unless this part holds both ends of a tied embedding, then the part itself. The cost model
    counts the same (``costmodel.stage_terms.fsdp2_wrap_counts``; a test holds them equal)."""
    out: list[tuple[Any, str]] = []
    for blk in part.layers.values():
        moe = getattr(_unwrap(blk), "moe", None)
        if moe is not None and ep > 1:
            out.append((moe.experts, "expert"))
        out.append((blk, "module"))
    if part.embed is not None and not part.tied:
        out.append((part.embed, "module"))
    if part.norm is not None and not part.tied:
        out.append(([part.norm, part.output], "head"))
    out.append((part, "module"))
    return out


def sync_tied_grads(parts: list[nn.Module], group) -> None:
    """Sum the gradients of a tied embedding's two copies (first and last pipeline stage)."""
    import torch.distributed as dist
    if group is None:
        return
    for part in parts:
        for p in ((part.embed.tok.weight if part.embed is not None else None),
                  (part.output.weight if part.output is not None else None)):
            if p is None or p.grad is None:
                continue
            grad = p.grad
            if hasattr(grad, "placements") and tuple(grad.placements) != tuple(p.placements):
                # e.g. a vocab-parallel embedding's gradient comes back replicated: shard it
                # like its parameter so both copies reduce the same local block
                grad = grad.redistribute(p.device_mesh, p.placements)
                p.grad = grad
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


__all__ = ["Dims", "PlanNotRunnable", "build_mesh", "tied_pair_group", "tp_plan", "apply_tp", "apply_experts",
           "AllToAllDispatch", "apply_ac", "recompute_layers", "apply_dp", "sync_tied_grads"]
