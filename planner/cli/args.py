"""Flags shared by ``planner estimate``, ``plan`` and ``replan``: the problem (model, cluster,
workload) and the parallel dimensions. A dimension left out is ``None``: ``estimate`` fills a
default, ``plan`` solves for it."""
from __future__ import annotations

import argparse
from typing import Callable

from costmodel.specs import (MESH_AXES, OFFLOAD_MODULES, RECOMPUTE_MODULES, ClusterSpec, ModelSpec, ParallelConfig,
                             SpecError, Workload, offload_module_set, recompute_module_set)
from planner.plan.errors import UsageError
from planner.plan.inputs import load_cluster_sized, load_model


def target_name(text: str) -> str:
    """``--target``'s type: the name as the targets know it however it is typed ("Megatron-LM", "NeMo",
    "llm_foundry": ``planner.plan.targets.canonical``); another name unchanged, for the command to refuse."""
    from planner.plan.targets import canonical
    return canonical(text)


def _bool_flag(p: argparse.ArgumentParser, name: str, help: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction, default=None,
                   help=help)


def add_problem_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("problem")
    g.add_argument("--model", required=False, help="catalog name, model .yaml, or Hugging Face config.json")
    g.add_argument("--cluster", required=False, help="catalog name (any case: DGX-H100) or cluster .yaml (e.g. a profile)")
    g.add_argument("--gpus", type=int, help="GPUs to use (default: the whole cluster)")
    g.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    g.add_argument("--seq-len", type=int, help="tokens per sequence")
    g.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "fp8", "nvfp4", "int8", "int4"],
                   help="precision of the weights and compute (training: bf16, fp16, fp32, fp8: an FP8 recipe, "
                        "see --fp8-recipe, or nvfp4: Transformer Engine's NVFP4 on Blackwell, Megatron only)")
    g.add_argument("--fp8-recipe", default="",
                   choices=["", "delayed", "current", "mxfp8", "blockwise", "tensorwise", "rowwise"],
                   help="FP8 training recipe (with --dtype fp8): Transformer Engine delayed or current scaling, "
                        "MXFP8 (Blackwell), blockwise (DeepSeek-V3's), torchao tensorwise or rowwise; default: "
                        "delayed on Hopper, mxfp8 on Blackwell (torchtitan's runs: tensorwise)")
    g.add_argument("--fp8-param-gather", action="store_true",
                   help="store the weights in FP8 and all-gather them in FP8 (Megatron's --fp8-param-gather)")
    g.add_argument("--optimizer", default="adamw", choices=["adamw", "adam", "sgd"])
    g.add_argument("--attention-kernel", default="flash", choices=["flash", "materialized"],
                   help="fused (flash) attention, or scores written to memory")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--allow-long-context", action="store_true",
                   help="train on sequences longer than the model's position limit (max_seq_len), e.g. with "
                        "RoPE scaling; without it such a --seq-len is refused (ALiBi models are only warned)")


def add_degree_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel dimensions (fixed when given)")
    for name, help in (("tp", "tensor parallel"), ("pp", "pipeline stages"), ("dp", "data parallel"),
                       ("cp", "context parallel"), ("ep", "expert parallel (inside dp x cp; with --etp, tp x cp x dp)"),
                       ("etp", "expert tensor parallel (default tp; 1 folds EP over TP: Megatron's MoE parallel folding)"),
                       ("vpp", "virtual stages per pipeline rank"), ("micro-batch", "sequences per micro-batch"),
                       ("grad-accum", "micro-batches per step"), ("dp-shard", "ZeRO shard group (< dp: HSDP)"),
                       ("recompute-layers", "layers per stage with full recompute")):
        g.add_argument(f"--{name}", type=int, help=help)
    g.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="ZeRO stage (3 = FSDP)")
    _bool_flag(g, "sp", "sequence parallel (with tp > 1)")
    g.add_argument("--recompute", choices=["none", "selective", "full"])
    g.add_argument("--recompute-modules", type=_module_list, metavar="A,B",
                   help="with --recompute selective on Megatron: the modules it recomputes (--recompute-modules: "
                        f"{', '.join(RECOMPUTE_MODULES)}; default: the target's, moe_act,layernorm "
                        "(+mla_up_proj) for a mixture of experts, else core_attn)")
    g.add_argument("--offload-modules", type=_offload_list, metavar="A,B",
                   help="Megatron's fine-grained activation offloading of these modules' saved inputs to host memory "
                        f"(--offload-modules: {', '.join(OFFLOAD_MODULES)}; priced over the GPU's host link)")
    g.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"])
    g.add_argument("--mesh-order", help="mesh order outer->inner, e.g. pp,dp,cp,tp")
    g.add_argument("--moe-dispatcher", choices=["alltoall", "deepep", "hybridep"],
                   help="MoE token dispatcher (default: searched where the target writes several; else alltoall)")
    _bool_flag(g, "ep-overlap", "overlap the expert-parallel all-to-alls with compute (Megatron's "
                                "--overlap-moe-expert-parallel-comm; default: searched where the target writes it)")


DEGREE_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "grad_accum", "dp_shard", "recompute_layers",
               "zero", "sp", "recompute", "schedule", "moe_dispatcher", "ep_overlap", "recompute_modules",
               "offload_modules")


def _modules_arg(parse: Callable[[list[str]], tuple[str, ...]], field: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for a comma-separated module list (``--recompute-modules``, ``--offload-modules``) read by
    ``parse`` (``costmodel.specs.recompute_module_set``, ``offload_module_set``): argparse's error on others."""
    def read(text: str) -> tuple[str, ...]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        try:
            return parse(names) if names else parse([text])
        except SpecError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"parallel: {field}: ")) from None
    return read


_module_list = _modules_arg(recompute_module_set, "recompute_modules")
_offload_list = _modules_arg(offload_module_set, "offload_modules")


def fixed_degrees(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in DEGREE_KEYS if getattr(args, k, None) is not None}


def mesh_order(args: argparse.Namespace) -> tuple[str, ...] | None:
    if not getattr(args, "mesh_order", None):
        return None
    order = tuple(x.strip() for x in args.mesh_order.split(","))
    if sorted(order) != sorted(MESH_AXES):
        raise UsageError(f"--mesh-order {args.mesh_order!r} must be a permutation of {','.join(MESH_AXES)}")
    return order


def load_problem(args: argparse.Namespace, mode: str = "train") -> tuple[ModelSpec, ClusterSpec, Workload]:
    missing = [f"--{k.replace('_', '-')}" for k in ("model", "cluster", "global_batch", "seq_len")
               if getattr(args, k, None) is None]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or give --plan FILE)")
    for k in ("global_batch", "seq_len", "gpus"):
        v = getattr(args, k, None)
        if v is not None and v <= 0:
            raise UsageError(f"--{k.replace('_', '-')} must be > 0, got {v}")
    model = load_model(args.model)
    rl = getattr(args, "recompute_layers", None)
    if rl is not None and rl > model.layers:
        raise UsageError(f"--recompute-layers {rl} is more than the {model.layers} layers of {model.name}; give at "
                         f"most {model.layers} (-1 or --recompute full: every layer)")
    cluster = load_cluster_sized(args.cluster, args.gpus)
    wl = Workload(global_batch=args.global_batch, seq_len=args.seq_len, dtype=args.dtype, optimizer=args.optimizer,
                  attention_kernel=args.attention_kernel, seed=args.seed, mode=mode,
                  fp8_recipe=getattr(args, "fp8_recipe", "") or "",
                  fp8_param_gather=bool(getattr(args, "fp8_param_gather", False)))
    if mode == "train" and wl.dtype == "nvfp4":
        from costmodel.fp8 import nvfp4
        for grp in cluster.groups:       # refuses a GPU without FP4 training tensor cores
            nvfp4(grp.gpu)
    if mode == "train" and wl.dtype == "fp8":
        import dataclasses

        from costmodel.fp8 import resolve
        for grp in cluster.groups:       # refuses a GPU without FP8 tensor cores, MXFP8 before Blackwell
            resolve(wl.fp8_recipe, "generic", grp.gpu, wl.fp8_param_gather)
        if not wl.fp8_recipe:            # the plan records the recipe it was priced with
            from planner.plan.targets import default_fp8_recipe
            wl = dataclasses.replace(wl, fp8_recipe=default_fp8_recipe(getattr(args, "target", None),
                                                                       cluster.groups[0].gpu))
    if mode == "train" and wl.seq_len > model.max_seq_len:
        over = f"--seq-len {wl.seq_len} is {wl.seq_len / model.max_seq_len:.3g}x the position limit of " \
               f"{model.name} (max_seq_len {model.max_seq_len})"
        # ALiBi has no position table: its max_seq_len is the length it was trained at, and training
        # it longer is how such models reach long contexts (Press et al., "Train Short, Test Long",
        # ICLR 2022; MPT-7B-StoryWriter was fine-tuned at 65k from 2k): warned, not refused
        alibi = model.positions == "alibi"
        if not (alibi or getattr(args, "allow_long_context", False)):
            raise UsageError(f"{over}; lower --seq-len, or pass --allow-long-context to plan it anyway "
                             "(a model extended to longer contexts, e.g. RoPE scaling)")
        import sys
        why = "ALiBi positions extrapolate" if alibi else "--allow-long-context"
        print(f"planner: warning: {over}; planned anyway ({why})", file=sys.stderr)
    return model, cluster, wl


def complete_config(fixed: dict, gpus: int, workload: Workload) -> ParallelConfig:
    """Fill the dimensions ``estimate`` was not given: 1 for tp/pp/cp/ep/vpp/micro-batch, dp from
    the GPU count, gradient accumulation from the global batch."""
    d = dict(fixed)
    for k in ("tp", "pp", "cp", "ep", "vpp", "micro_batch"):
        d.setdefault(k, 1)
    d.setdefault("zero", 1)
    d.setdefault("recompute", "none")
    model_par = d["tp"] * d["pp"] * d["cp"]
    if "dp" not in d:
        if gpus % model_par:
            raise SpecError(f"tp*pp*cp = {d['tp']}*{d['pp']}*{d['cp']} = {model_par} does not divide the "
                            f"{gpus} GPUs; give --dp or change the degrees")
        d["dp"] = gpus // model_par
    if "grad_accum" not in d:
        per = d["dp"] * d["micro_batch"]
        if workload.global_batch % per:
            raise SpecError(f"global batch {workload.global_batch} is not a multiple of dp*micro_batch = "
                            f"{d['dp']}*{d['micro_batch']} = {per}")
        d["grad_accum"] = workload.global_batch // per
    if d.get("sp") is None:
        d["sp"] = d["tp"] > 1
    d.pop("dp_shard", None) if d.get("dp_shard") is None else None
    return ParallelConfig(**d)


def check_writable(path: str | None) -> None:
    """Refuse an output path whose directory cannot be created or written, before any solving."""
    import os
    from pathlib import Path

    if not path:
        return
    from costmodel.files.safeio import check_output
    check_output(path, "output")     # a link, FIFO, device or folder there: exit 2 before any work
    d = Path(path).resolve().parent
    if not d.exists():
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create the directory for {path}: {e.strerror}") from None
    if not os.access(d, os.W_OK):
        raise UsageError(f"cannot write {path}: {d} is not writable")


def cluster_source_of(cluster_arg: str) -> str:
    """What a plan's provenance records as its cluster's source: ``catalog`` or the file given."""
    from costmodel.files.clusters import catalog_key
    return "catalog" if catalog_key(cluster_arg) is not None else cluster_arg


def warn_drift(plan, fresh: dict, where: str) -> None:
    """Warn (stderr) when a plan's stored figures are not what this planner computes for it
    (``planfile.estimate_drift``: more than 1 % apart, naming the version that wrote them)."""
    import sys

    from planner.plan.planfile import estimate_drift
    msg = estimate_drift(plan, fresh, where)
    if msg:
        print(f"planner: warning: {msg}", file=sys.stderr)
