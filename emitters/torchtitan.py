"""torchtitan 0.3: a Python job config (a function returning ``Trainer.Config``) and its torchrun launch.

Format: torchtitan's config system since the 2026-02 refactor ("TOML to Python Dataclass
Registry", first released in torchtitan 0.3.0, the release ``pip install torchtitan`` gives): a job
is a Python function that returns a complete ``Trainer.Config`` (``torchtitan/trainer.py``), made
of ``ParallelismConfig`` / ``TrainingConfig`` / ``DebugConfig`` (``torchtitan/config/configs.py``),
``LRSchedulersContainer.Config`` and ``OptimizersContainer.Config`` with one ``ParamGroupConfig``
(``torchtitan/components/optimizer``), ``FullAC.Config`` or ``None`` for activation checkpointing
(``torchtitan/distributed/activation_checkpoint.py``) and a llama3 ``ModelSpec`` from
``torchtitan.models.llama3.model_registry``. ``python -m torchtitan.train --module <module>
--config <function>`` imports the module and calls the function (``torchtitan/config/manager.py``);
``--section.field value`` overrides still apply on top. TOML job files (torchtitan 0.2.2 and
older) are no longer written: 0.3.0 has no ``--job.config_file``.

The exact stage split is stated with ``parallelism.module_fqns_per_model_part`` (one list of
module names per model chunk, loop style: rank r holds chunks r, r+pp, ...). A model shape that is
not one of torchtitan's stock llama3 flavors is registered in the job module as flavor
``planner``, built the way torchtitan builds its own flavors (``torchtitan/models/llama3/__init__.py``).
"""
from __future__ import annotations

from emitters.base import (require_no_stage_recompute, CannotExpress, Raw, bash_array, full_recompute_all, nodes_and_procs,
                           require,
                           require_mode, require_one_group, require_order, script_header,
                           stage_layers, virtual_counts)
from emitters.encode import one_line, py_docstring, py_literal as lit
from emitters.recipe import Need, checkpoint_need, model_settings, needs_block, priced_assumptions, recipe, warmup_shell
from planner.plan.planfile import Plan

TARGET = "torchtitan"
MODE = "train"
VERSION = "0.3.0"
FORMAT = (f"torchtitan {VERSION} Python job config (a function returning Trainer.Config, run with "
          "--module/--config; the TOML job files of torchtitan <= 0.2.2 are not written)")
SUMMARY = f"torchtitan {VERSION} Python job config (Trainer.Config: parallelism, batch, activation checkpointing) and launch"
RUN = (f"In an environment with torchtitan {VERSION}: `HF_ASSETS=<tokenizer folder> DATASET=<dataset name> "
       "TRAIN_STEPS=<steps> bash torchtitan.sh` (multi-node: `HEAD_ADDR=<first node>` on every node); "
       "`MOCK_DATA=1`, from a torchtitan checkout, uses its test tokenizer and c4_test instead. The script "
       "checks each value before it starts.")

JOB_MODULE = "torchtitan_planner_job"
JOB_FUNCTION = "planner_job"
CUSTOM_FLAVOR = "planner"
C10D_PORT = 29400
# torchtitan's test tokenizer (tests/assets/tokenizer, what MOCK_DATA=1 uses) holds 2,020 tokens: a
# model with a smaller vocabulary would index past its embedding
MOCK_TOKENIZER_TOKENS = 2020
CHECKPOINT_EVERY = 500              # CheckpointManager.Config's default interval
# torchtitan's README: "each stable release pins the nightly versions of torch and torchao" (its
# docs/release.md); a released torch parses the job but is not the one the release was tested on
TORCH_NOTE = (f"torchtitan {VERSION} runs on the PyTorch nightly its release pins (torchtitan docs/release.md), "
              "not on a released torch")

# Stock llama3 flavors of torchtitan 0.3.0 (torchtitan/models/llama3/__init__.py, llama3_configs):
# name -> (dim, n_layers, n_heads, n_kv_heads, ffn hidden, vocab); 1B and 3B tie their embeddings
STOCK_FLAVORS = {
    "8B": (4096, 32, 32, 8, 14336, 128256),
    "70B": (8192, 80, 64, 8, 28672, 128256),
    "405B": (16384, 126, 128, 8, 53248, 128256),
}
# ...and what every stock flavor shares: RoPE theta 500000, RMSNorm eps 1e-5 (the RMSNorm.Config
# default) and Llama 3.1 RoPE scaling (ComplexRoPE scaling="llama", scaling_factor 8.0): a model
# that differs gets the custom flavor
STOCK_SETTINGS = (500000.0, 1e-5, 8.0)
STOCK_MAX_SEQ_LEN = 131072          # ComplexRoPE.Config max_seq_len of every stock flavor
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
# Float8 plans: the modules torchao leaves in bf16 (Float8LinearConverter.Config.filter_fqns)
FLOAT8_FILTER_FQNS = ("lm_head",)
# MXFP8 plans: the modules MXFP8LinearConverter converts (Config.fqns, matched as substrings of each Linear's
# FQN, "layers.0.feed_forward.w1"): every block linear, not the head
MXFP8_FQNS = ("layers.",)
# ...and of a mixture of experts: every linear but the router's gate (layers.N.moe.router.gate stays bf16, as
# priced): the attention's, and a dense layer's or the shared experts' FFN where the model has them
MXFP8_MOE_FQNS = ("attention", "feed_forward", "shared_experts")


def ffn_hidden(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """torchtitan's SwiGLU width (``compute_ffn_hidden_dim``, models/common/feed_forward.py)."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _check_model(plan: Plan) -> None:
    m = plan.model
    if m.is_moe or m.attention == "mla":
        from planner.plan.targets import titan_moe_problem, titan_mtp_problem
        why = (titan_moe_problem(m, plan.workload)
               or titan_mtp_problem(m, plan.workload, plan.parallel, tuple(plan.mesh_order)))
        if why:
            raise CannotExpress(TARGET, "this mixture of experts", why)
        return
    checks = [
        (not m.is_moe, "mixture of experts", f"{m.name} has {m.num_experts} experts and this emitter maps only "
         "dense models to torchtitan's llama3 model"),
        (m.attention == "mha", "multi-latent attention", "torchtitan's llama3 model has grouped-query attention"),
        (m.mlp == "swiglu", f"the {m.mlp} MLP", "torchtitan's llama3 model uses SwiGLU"),
        (m.norm == "rmsnorm", m.norm, "torchtitan's llama3 model uses RMSNorm"),
        (m.positions == "rotary", f"{m.positions} positions", "torchtitan's llama3 model uses RoPE"),
        (not m.tied_embeddings, "tied embeddings", "torchtitan's llama3 model has a separate output projection"),
        (not m.bias, "linear biases", "torchtitan's llama3 model has no biases"),
        (m.head_dim * m.heads == m.hidden, f"head_dim {m.head_dim}",
         f"torchtitan's llama3 model uses hidden/heads = {m.hidden // m.heads}"),
    ]
    for ok, part, detail in checks:
        if not ok:
            raise CannotExpress(TARGET, part, detail, "use the megatron target")


def moe_flavor(plan: Plan) -> tuple[str, str] | None:
    """(torchtitan model package, stock flavor) of a mixture-of-experts plan; None for llama3."""
    from planner.plan.targets import titan_moe_flavor
    fl = titan_moe_flavor(plan.model) if plan.model.is_moe or plan.model.attention == "mla" else None
    return (fl[0], fl[1]) if fl else None


def flavor(plan: Plan) -> str:
    m = plan.model
    if (moe := moe_flavor(plan)) is not None:
        return moe[1]
    shape = (m.hidden, m.layers, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)
    if (m.rope_theta, m.norm_eps, m.rope_scaling) != STOCK_SETTINGS or plan.workload.seq_len > STOCK_MAX_SEQ_LEN:
        return CUSTOM_FLAVOR
    for name, stock in STOCK_FLAVORS.items():
        if stock == shape:
            return name
    return CUSTOM_FLAVOR


def custom_model_code(plan: Plan) -> str:
    """Python that registers the plan's model as llama3 flavor ``planner`` in the job module."""
    m = plan.model
    max_len = max(m.max_seq_len, plan.workload.seq_len)
    if m.rope_scaling:
        rope = f'scaling="llama", scaling_factor={lit(float(m.rope_scaling), "rope_scaling")}'
        rope_note = f"Llama 3.1 RoPE scaling x{float(m.rope_scaling):g}"
    else:
        rope = 'scaling="none"'
        rope_note = "no RoPE scaling"
    eps = lit(float(m.norm_eps), "norm_eps")
    theta = lit(float(m.rope_theta), "rope_theta")
    dims = ", ".join(lit(v) for v in (m.hidden, m.heads, m.kv_heads, m.layers, m.vocab))
    note = one_line(f"{m.ffn_hidden}, RoPE base {float(m.rope_theta):g}, {rope_note}, RMSNorm eps {eps}.")
    return f'''

# The plan's model is not a stock torchtitan llama3 flavor: it is registered as {lit(CUSTOM_FLAVOR)}, built
# as torchtitan builds its own flavors (torchtitan/models/llama3/__init__.py, e.g. _8b): FFN width
# {note}
def _planner_model(attn_backend: str, tp_gemm_backend: str = "default") -> Llama3Model.Config:
    dim, n_heads, n_kv_heads, n_layers, vocab_size = {dims}
    layers = _build_llama3_layers(
        fuse_qkv=True, n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads,
        hidden_dim={lit(m.ffn_hidden)},
        rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len={lit(max_len)}, theta={theta},
                                {rope}),
        attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend,
    )
    for layer in layers:
        layer.attention_norm.eps = layer.ffn_norm.eps = {eps}
    return Llama3Model.Config(
        dim=dim,
        vocab_size=vocab_size,
        tok_embeddings=Embedding.Config(num_embeddings=vocab_size, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, eps={eps}, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab_size, param_init=_output_linear_init(dim)),
        layers=layers,
    )


llama3_configs[{lit(CUSTOM_FLAVOR)}] = _planner_model
'''


def model_parts(plan: Plan) -> list[list[str]] | None:
    """Module names per model chunk, in chunk order (None without pipeline parallel)."""
    p = plan.parallel
    if p.pp == 1:
        return None
    if p.vpp > 1:
        counts = virtual_counts(plan)
        require(min(counts) >= 1, TARGET, f"vpp={p.vpp} with stages {stage_layers(plan)}",
                "every virtual stage needs a layer", "plan fewer virtual stages")
        starts = [sum(counts[:i]) for i in range(len(counts))]
        bounds = [(a, a + n) for a, n in zip(starts, counts)]
    else:
        bounds = [(s.first_layer, s.last_layer) for s in plan.stages]
    parts = [[f"layers.{i}" for i in range(lo, hi)] for lo, hi in bounds]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


def _data_parallel(plan: Plan) -> tuple[int, int, str]:
    """(replicate degree, shard degree, fsdp_reshard_after_forward)."""
    p = plan.parallel
    others = [f"{k}={v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp)) if v > 1]
    if p.dp * p.cp == 1:
        return 1, 1, "default"
    if p.zero == 0:
        require(p.cp == 1, TARGET, f"ZeRO-0 with cp={p.cp}",
                "torchtitan always shards parameters (FSDP) over dp_shard x cp when cp > 1",
                "plan zero=2 or 3")
        require(not others, TARGET, f"DDP (zero=0) with {', '.join(others)}",
                "torchtitan applies DDP only when data parallel is the sole parallelism",
                "plan zero=2 or 3 (FSDP) instead")
        return p.dp, 1, "default"
    if p.zero == 1:
        raise CannotExpress(TARGET, "ZeRO-1 (sharded optimizer state only)",
                            "torchtitan shards with FSDP2: parameters, gradients and optimizer state together",
                            "plan zero=2 or 3, or use megatron/deepspeed")
    return p.dp // p.dp_shard, p.dp_shard, "never" if p.zero == 2 else "always"


def _settings(plan: Plan) -> dict:
    """The checks torchtitan's own code makes, and the values the job config states."""
    p = plan.parallel
    w = plan.workload
    _check_model(plan)
    require_order(plan, TARGET, ("pp", "dp", "cp", "tp"),
                  note=" (ParallelDims: pp, dp_replicate, dp_shard, cp, tp)")
    require(p.ep == 1 or plan.model.is_moe, TARGET, f"ep={p.ep}", "the model is dense")
    require(p.ep == 1 or p.tp == 1 or p.etp == 1, TARGET, f"ep={p.ep} with tp={p.tp} and etp={p.etp}",
            "torchtitan has no expert tensor parallel: with TP its expert parallel spans the TP ranks and keeps "
            "every expert whole (parallel_dims.py efsdp = dp_shard*cp*tp/ep)", "plan etp=1")
    require(p.tp == 1 or p.sp, TARGET, "tensor parallel without sequence parallel",
            "torchtitan always applies sequence parallel (SequenceParallel norms) with TP",
            "plan sp=true")
    if p.cp > 1 or p.tp > 1:
        div = p.tp * 2 * p.cp if p.cp > 1 else p.tp
        require(w.seq_len % div == 0, TARGET, f"seq_len {w.seq_len}",
                f"torchtitan needs seq_len divisible by tp*2*cp = {div}" if p.cp > 1
                else f"sequence parallel needs seq_len divisible by tp = {p.tp}")
    require(p.overlap_dp_comm or p.dp * p.cp == 1, TARGET, "data-parallel communication without overlap "
            "(overlap_dp_comm=false)", "FSDP2 and DDP always overlap it with backward, and the price must be what runs",
            "plan with overlap_dp_comm=true")
    replicate, shard, reshard = _data_parallel(plan)
    fsdp = shard > 1 or p.cp > 1
    if w.dtype in ("bf16", "bfloat16"):
        require(fsdp or (p.tp == 1 and p.pp == 1), TARGET, "bf16 mixed precision without FSDP",
                "torchtitan applies mixed precision through fully_shard, or autocast under DDP / one "
                "device; with TP or PP and no FSDP it trains in fp32", "plan zero=2 or 3 with dp > 1")
        param_dtype = "bfloat16"
    elif w.dtype in ("fp32", "float32", "tf32"):
        param_dtype = "float32"
    elif w.dtype == "fp8":
        require(fsdp or (p.tp == 1 and p.pp == 1), TARGET, "Float8 without FSDP",
                "torchtitan's Float8 linears run in a bf16 model whose precision fully_shard sets",
                "plan zero=2 or 3 with dp > 1")
        param_dtype = "bfloat16"
    else:
        raise CannotExpress(TARGET, f"dtype {w.dtype}", "torchtitan trains in float32, bfloat16 or Float8")
    if p.recompute == "none":
        ac = "none"
    elif full_recompute_all(plan):
        ac = "full"
    elif p.recompute == "selective" and not any(s.recompute_layers for s in plan.stages):
        ac = "selective"       # per-op SelectiveAC: the op-level selective the cost model prices (targets table)
    else:
        raise CannotExpress(TARGET, "recompute of some layers per stage",
                            "torchtitan 0.3 recomputes every block (FullAC) or applies a per-op policy to every "
                            "block (SelectiveAC)",
                            "plan recompute of all layers")
    optimizer = {"adamw": "AdamW", "adam": "Adam"}.get(w.optimizer)
    require(optimizer is not None, TARGET, f"optimizer {w.optimizer}", "torchtitan builds Adam or AdamW")
    require(not (p.pp > 1 and p.schedule == "interleaved" and p.vpp == 1), TARGET,
            "the interleaved schedule with vpp=1", "Interleaved1F1B needs two or more chunks per rank")

    fl = flavor(plan)
    if p.pp > 1:
        local_batch = p.micro_batch * p.grad_accum   # one step = grad_accum pipeline micro-batches
        batch_note = (f"local_batch_size = micro_batch {p.micro_batch} x {p.grad_accum} pipeline micro-batches; "
                      f"global = local x dp {p.dp}: no extra accumulation")
    else:
        local_batch = p.micro_batch
        batch_note = (f"gradient accumulation = global / (local x dp) = {w.global_batch} / "
                      f"({local_batch} x {p.dp}) = {p.grad_accum}")
    return dict(flavor=fl, replicate=replicate, shard=shard, reshard=reshard, param_dtype=param_dtype, ac=ac,
                optimizer=optimizer, local_batch=local_batch, batch_note=batch_note, float8=float8_recipe(plan))


def float8_recipe(plan: Plan) -> str | None:
    """The torchao recipe a Float8 plan is priced with and this file writes (None without FP8):
    the plan's recipe as the cost model resolves it (``titan_fp8_recipe``), which torchtitan 0.3.0's
    ``Float8LinearConverter`` must take."""
    if plan.workload.dtype != "fp8":
        return None
    from planner.plan.targets import TITAN_FP8_WRITES, TITAN_FP8_WRITTEN, titan_fp8_problem, titan_fp8_recipe
    why = titan_fp8_problem(plan.model, plan.workload, plan.parallel, tuple(plan.mesh_order))
    if why:
        raise CannotExpress(TARGET, "this Float8 plan", why)
    rec = titan_fp8_recipe(plan.cluster, plan.workload)
    require(rec.name in TITAN_FP8_WRITES and not rec.param_gather, TARGET, f"fp8 recipe {rec.name}"
            + (" with the FP8 FSDP all-gather" if rec.param_gather else ""),
            f"torchtitan {VERSION}'s Float8LinearConverter takes recipe_name rowwise or rowwise_with_gw_hp only "
            "(components/quantization/float8.py), and its MXFP8LinearConverter torchao's MXFP8 (Blackwell); tensorwise "
            "scaling with enable_fsdp_float8_all_gather was torchtitan <= 0.2's float8 section",
            f"plan --fp8-recipe {TITAN_FP8_WRITTEN}")
    return rec.name


def _call(name: str, items: list[tuple[str, object]], indent: int) -> str:
    pad = " " * indent
    inner = "".join(f"{pad}    {k}={lit(v, k)},\n" for k, v in items)
    return f"{name}(\n{inner}{pad})"


def config(plan: Plan) -> str:
    """The job module: ``planner_job()`` returns the plan's ``Trainer.Config``."""
    p, w = plan.parallel, plan.workload
    s = _settings(plan)
    r = recipe(plan)
    par: list[tuple[str, object]] = [
        ("data_parallel_replicate_degree", s["replicate"]), ("data_parallel_shard_degree", s["shard"]),
        ("fsdp_reshard_after_forward", s["reshard"]), ("tensor_parallel_degree", p.tp),
        ("enable_sequence_parallel", p.tp > 1),
        ("pipeline_parallel_degree", p.pp), ("context_parallel_degree", p.cp), ("expert_parallel_degree", p.ep)]
    parts = model_parts(plan)
    if parts is not None:
        par += [("pipeline_parallel_schedule", SCHEDULES[p.schedule]),
                ("pipeline_parallel_microbatch_size", p.micro_batch),
                ("module_fqns_per_model_part", parts)]
    training = [("local_batch_size", s["local_batch"]), ("global_batch_size", w.global_batch),
                ("seq_len", w.seq_len), ("max_norm", r.grad_clip), ("steps", 10),
                ("mixed_precision_param", s["param_dtype"]), ("mixed_precision_reduce", "float32")]
    # Trainer.Config._validate_cuda_graphs: CUDA graphs (on by default) refuse PP, and EP with the
    # all-to-all token dispatcher the stock MoE flavors build (it synchronises with the CPU)
    if p.pp > 1 or p.ep > 1:
        training.append(("disable_cuda_graphs", True))
    optimizer = (f'OptimizersContainer.Config(param_groups=[ParamGroupConfig(\n'
                 f'            pattern=r".*", optimizer_name={lit(s["optimizer"])},\n'
                 f'            optimizer_kwargs={{"lr": {lit(r.lr)}, "betas": ({lit(r.beta1)}, {lit(r.beta2)}), '
                 f'"eps": {lit(r.eps)}, "weight_decay": {lit(r.weight_decay)}}},\n'
                 f'        )])')
    ac = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}.get(s["ac"], "None")
    # the plan's framework settings (planner.plan.targets.SWITCHES), priced by the plan: written here
    sw = plan.framework or {}
    compile_cfg = _call("CompileConfig", [("enable", bool(sw.get("compile"))),
                                          ("enable_async_tensor_parallel", bool(sw.get("async_tp")))], 8)
    fl = s["flavor"]
    custom = fl == CUSTOM_FLAVOR
    moe = moe_flavor(plan)
    compiled = bool(sw.get("compile"))
    converters = []
    if s["float8"] == "mxfp8":
        # torchao MXFP8Linear (the converter takes the FQNs it converts): every block linear of a dense model, every
        # linear but the router's gate of a mixture of experts; the output head in bf16 as priced
        # (costmodel.fp8.torchao_mxfp8)
        converters.append(_call("MXFP8LinearConverter.Config", [
            ("fqns", list(MXFP8_MOE_FQNS if moe else MXFP8_FQNS)), ("model_compile_enabled", compiled)], 8))
    elif s["float8"]:
        # torchao Float8Linear on every block linear; the output head stays bf16 (the cost model prices
        # the head in the compute dtype; torchtitan's own 405B Float8 job filters it the same way)
        converters.append(_call("Float8LinearConverter.Config", [
            ("recipe_name", s["float8"]), ("filter_fqns", list(FLOAT8_FILTER_FQNS)),
            ("model_compile_enabled", compiled)], 8))
    if moe and (sw.get("mxfp8_experts") or s["float8"] == "mxfp8"):
        # the routed experts' grouped GEMMs in torchao's dynamic MXFP8: in a BF16 model (framework.mxfp8_experts,
        # priced by costmodel.fp8.torchao_mxfp8_experts) or beside the MXFP8 linears (the workload's recipe); the
        # converter's defaults: recipe mxfp8_rceil, groups padded to 32 tokens
        converters.append(_call("MXFP8GroupedExpertsConverter.Config", [("model_compile_enabled", compiled)], 8))
    mtp = plan.model.mtp_layers if moe else 0
    kwargs = []
    if mtp:      # DeepSeek-V3's multi-token prediction, priced on the last stage (costmodel/stage_terms.py)
        kwargs.append(f"num_mtp_layers={lit(mtp)}")
    if converters:
        kwargs.append("converters=[\n" + "".join(f"        {c},\n" for c in converters) + "    ]")
    spec = f"model_registry({lit(fl)}{''.join(', ' + k for k in kwargs)})"
    package = moe[0] if moe else "llama3"
    imports = [
        "from torchtitan.components.checkpointer import CheckpointManager",
        "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
        "from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig",
        "from torchtitan.components.quantization import Float8LinearConverter  # noqa: F401 (Float8 plans)",
        "from torchtitan.components.quantization import MXFP8GroupedExpertsConverter  # noqa: F401 (MXFP8 experts)",
        "from torchtitan.components.quantization import MXFP8LinearConverter  # noqa: F401 (MXFP8 plans)",
        "from torchtitan.config import CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401 (None = no "
        "checkpointing)",
        "from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader",
        "from torchtitan.models.common.config_utils import decoder_vocab_size",
        f"from torchtitan.models.{package} import model_registry",
        "from torchtitan.trainer import Trainer",
    ]
    if mtp:
        imports.append("from torchtitan.models.deepseek_v3 import MTPLoss")
        loss = "MTPLoss.Config(global_vocab_size=decoder_vocab_size(model_spec))"
    else:
        loss = ("ChunkedLossWrapper.Config(\n"
                "            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(model_spec)),\n"
                "        )")
    if custom:
        imports += [
            "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
            "from torchtitan.models.llama3 import (Llama3Model, _build_llama3_layers, _EMBEDDING_INIT, _NORM_INIT,",
            "                                      _output_linear_init, llama3_configs)",
        ]
    doc = py_docstring(
        f"torchtitan {VERSION} job for {one_line(plan.model.name)} on {one_line(plan.cluster.name)} "
        f"({plan.world_size} GPUs).\n\n"
        f"Generated by `planner emit --target torchtitan` from a plan; format: {FORMAT}.\n"
        f"Run: torchrun ... -m torchtitan.train --module {JOB_MODULE} --config {JOB_FUNCTION} (torchtitan.sh does).\n"
        f"{one_line(s['batch_note'])}.\n"
        f"lr: GPT-3 Table 2.1 at {r.params / 1e9:.3g}B parameters (emitters/recipe.py); torchtitan.sh passes\n"
        "$TRAIN_STEPS and $WARMUP_STEPS (375M tokens, at most a tenth of the run) on the command line.\n")
    body = f'''{doc}
{chr(10).join(imports)}
{custom_model_code(plan) if custom else ""}

def {JOB_FUNCTION}() -> Trainer.Config:
    model_spec = {spec}
    return Trainer.Config(
        model_spec=model_spec,
        hf_assets_path="./tests/assets/tokenizer",   # torchtitan.sh passes $HF_ASSETS (this one: MOCK_DATA=1)
        dump_folder="./outputs",
        loss={loss},
        optimizer={optimizer},
        lr_scheduler={_call("LRSchedulersContainer.Config", [("warmup_steps", r.warmup_steps),
                                                               ("decay_type", "cosine"), ("min_lr_factor", 0.1)], 8)},
        training={_call("TrainingConfig", training, 8)},
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4_test"),
        parallelism={_call("ParallelismConfig", par, 8)},
        activation_checkpoint={ac},
        # torchtitan.sh passes --checkpoint.folder $CHECKPOINT_DIR (an absolute folder: not under dump_folder)
        checkpoint=CheckpointManager.Config(enable=True, interval={CHECKPOINT_EVERY}, last_save_model_only=False),
        compile={compile_cfg},
        debug=DebugConfig(seed={lit(w.seed, "seed")}),
    )
'''
    return body


def emit(plan: Plan) -> dict[str, str]:
    require_no_stage_recompute(plan, TARGET)
    require_mode(plan, TARGET, "train")
    require_one_group(plan, TARGET)
    nnodes, nproc = nodes_and_procs(plan, TARGET)
    files = {JOB_MODULE + ".py": config(plan)}
    usage = [f"In an environment with torchtitan {VERSION}: bash torchtitan.sh [--section.field value ...]",
             f"(the values below override {JOB_MODULE}.{JOB_FUNCTION}()'s hf_assets_path, dataloader.dataset "
             "and training.steps)",
             model_settings(plan), TORCH_NOTE]
    usage += priced_assumptions(plan, TARGET, [
        "engine facts: FSDP2 prefetches the next layer's all-gather and reduce-scatters gradients during "
        "backward" + (" (under the pipeline schedule once per step, after each stage's last backward: torch's "
                      "pipelining keeps the stage's gradients whole until then, and the memory priced holds them)"
                      if plan.parallel.pp > 1 and (plan.parallel.dp_shard > 1 or plan.parallel.cp > 1) else "")
        + "; " + ("async TP under torch.compile: the forward's TP collectives and the backward's gathers overlap "
                         "the GEMMs beside them; the backward's input-gradient reduce-scatters do not (torch's "
                         "micro-pipeline TP pass fuses a reduce-scatter only into the matmul that produces it)"
                        if (plan.framework or {}).get("async_tp") else
                        "TP collectives are not overlapped (async TP needs torch.compile, not enabled here)")]
        + ([("MXFP8: torchao's MXFP8Linear (MXFP8LinearConverter, scales per 32 values) on every block linear "
             + ("but the router's gate, and the routed experts' grouped GEMMs (MXFP8GroupedExpertsConverter) "
                if plan.model.is_moe else "")
             + "(head in bf16), casts per use, bf16 weights all-gathered in bf16; needs torchao and SM100+ (Blackwell) "
             "GPUs") if fp8 == "mxfp8" else
            f"Float8: torchao {fp8} scaling on every block linear (head in bf16), casts per use, bf16 weights "
            "all-gathered in bf16; needs torchao and SM89+ (H100) GPUs"] if (fp8 := float8_recipe(plan)) else [])
        + (["MXFP8 experts: the routed experts' grouped GEMMs in torchao's dynamic MXFP8 (MXFP8GroupedExpertsConverter, "
            "recipe mxfp8_rceil, token groups padded to 32), every other layer in bf16; needs torchao's MoE training "
            "prototype and SM100+ (Blackwell) GPUs"] if (plan.framework or {}).get("mxfp8_experts") else []))
    usage += recipe(plan).comment("TRAIN_STEPS", "WARMUP_STEPS", init=False)
    body = needs_block("torchtitan.sh", needs(plan))
    body += warmup_shell(recipe(plan), "TRAIN_STEPS", "WARMUP_STEPS")
    body += 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    body += f'export PYTHONPATH="$HERE${{PYTHONPATH:+:$PYTHONPATH}}"  # for --module {JOB_MODULE}\n'
    if plan.model.vocab < MOCK_TOKENIZER_TOKENS:
        body += (f'if [ -n "${{MOCK_DATA:-}}" ]; then stop "MOCK_DATA=1 uses torchtitan\'s test tokenizer of '
                 f'{MOCK_TOKENIZER_TOKENS} tokens, more than this model\'s vocabulary of {plan.model.vocab}: set '
                 'HF_ASSETS to a tokenizer that fits"; fi\n')
    body += bash_array("RUN_ARGS", ["--training.steps", Raw('"$TRAIN_STEPS"'),
                                    "--lr_scheduler.warmup_steps", Raw('"$WARMUP_STEPS"'),
                                    "--checkpoint.folder", Raw('"$CHECKPOINT_DIR"'),
                                    "--checkpoint.interval", Raw(f'"${{CHECKPOINT_EVERY:-{CHECKPOINT_EVERY}}}"')])
    body += ('if [ -z "${MOCK_DATA:-}" ]; then\n'
             '  RUN_ARGS+=(--hf_assets_path "$HF_ASSETS" --dataloader.dataset "$DATASET")\n'
             '  if [ -n "${DATASET_PATH:-}" ]; then RUN_ARGS+=(--dataloader.dataset_path "$DATASET_PATH"); fi\n'
             'fi\n')
    if nnodes == 1:
        endpoint = Raw('"${RDZV_ENDPOINT:-localhost:0}"')
    else:
        usage.append(f"On each of the {nnodes} nodes: HEAD_ADDR=<first node> bash torchtitan.sh")
        body += ': "${HEAD_ADDR:?set HEAD_ADDR to the first node address, the same on every node}"\n'
        endpoint = Raw('"$HEAD_ADDR:${RDZV_PORT:-' + str(C10D_PORT) + '}"')
    body += bash_array("TORCHRUN_ARGS", ["--nnodes", nnodes, "--nproc-per-node", nproc,
                                         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint])
    body += ('export PYTORCH_ALLOC_CONF="${PYTORCH_ALLOC_CONF:-expandable_segments:True}"  # as run_train.sh\n')
    body += ('exec torchrun "${TORCHRUN_ARGS[@]}" -m torchtitan.train '
             f'--module {JOB_MODULE} --config {JOB_FUNCTION} "${{RUN_ARGS[@]}}" "$@"\n')
    files["torchtitan.sh"] = script_header(plan, TARGET, FORMAT, usage) + body
    return files


def needs(plan: Plan) -> list[Need]:
    return [
        Need("torchrun", f"activate the Python environment that has torchtitan {VERSION} and the torch nightly it "
             "pins", kind="cmd"),
        Need("TRAIN_STEPS", "the run's optimizer steps (the cosine schedule ends there)", kind="int"),
        Need("HF_ASSETS", f"the folder with {plan.model.name}'s tokenizer (torchtitan's "
             "scripts/download_hf_assets.py writes it)", kind="dir", unless="MOCK_DATA"),
        Need("DATASET", "a dataset torchtitan registers (torchtitan/hf_datasets: c4, ...); DATASET_PATH, "
             "if set, is its local copy", unless="MOCK_DATA"),
        checkpoint_need("torchtitan saves there every CHECKPOINT_EVERY steps and resumes from the latest"),
    ]
