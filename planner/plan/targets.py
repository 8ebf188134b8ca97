"""Execution targets as data: what each framework can run, each fact with its source.

A *target* is where a plan runs: a training framework (``megatron``, ``torchtitan``,
``deepspeed``, ``accelerate``, ``builtin`` = this project's runtime), a launch wrapper that
starts the built-in runtime (``torchrun``, ``slurm``, ``kubernetes``: builtin's table, and for
the last two one kind of node), or a serving engine (``vllm``, ``sglang``, ``tensorrt-llm``,
``builtin``). Each has one table (``TrainTarget`` / ``ServeTarget``): plain fields that say what
it runs, and ``sources`` naming where each fact is stated: the framework's repository at the
commit read (``MEGATRON_SRC`` ... below) with the file and line, or the emitter that writes the
files. A table states what this project can launch on the target: the framework's own limits,
and where the files the emitter writes can state less than the framework runs, the emitter's.

``problems(target, plan)`` lists everything a plan asks that its target cannot run, each with
the numbers and what to change; the search asks ``config_problems`` of every candidate (no
stage split yet) and keeps the split within ``split_rule``. Imports ``costmodel`` and the plan
file only: the search, the emitters, the runtime and the command line may all read it.

Where the sources disagree or a combination is unconfirmed (Megatron-FSDP with pipeline stages,
DeepSpeed AutoTP with ZeRO-3), the table says no: a plan the solver
proves best must be one that runs.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from costmodel.moe import deepep_fabric_problem, dispatcher_fabric_problem
from costmodel.specs import (MESH_AXES, ModelSpec, ParallelConfig, StageSpec, Workload, end_slots, kv_heads_shard,
                             recompute_module_set)

# Primary sources: each framework's GitHub repository at the commit its code was read (the file
# and line follow in each row); the serving engines by repository and file, or the document
MEGATRON_SRC = "NVIDIA/Megatron-LM@d98e8a64"
TORCHTITAN_SRC = "pytorch/torchtitan@b5bcd76c"
DEEPSPEED_SRC = "deepspeedai/DeepSpeed@edaa7221"
ACCELERATE_SRC = "huggingface/accelerate@16cb6eb8"
VLLM_SRC = "vllm-project/vllm vllm/engine/arg_utils.py, vllm/config/parallel.py"
SGLANG_SRC = "sgl-project/sglang python/sglang/srt/server_args.py"
TRTLLM_SRC = "NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py"
VLLM_EP_SRC = "vllm-project/vllm docs/serving/expert_parallel_deployment.md@01702569"
SGLANG_EP_SRC = "sgl-project/sglang docs/advanced_features/expert_parallelism.md@020017c4"
DEEPSEEK_SERVING_SRC = "lm-sys/lm-sys.github.io blog/2025-05-05-large-scale-ep.md@2db4e404"

GENERIC = "generic"     # every layout the cost model knows; no framework runs all of them


# --------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------

Rule = Callable[[ModelSpec, Workload, ParallelConfig, tuple], "str | None"]


@dataclass(frozen=True, kw_only=True)
class Extra:
    """A target-specific rule that no field states: ``check`` returns a problem or None.
    ``model_only``: it reads only the model and workload (no configuration avoids it)."""
    what: str
    source: str
    check: Rule
    model_only: bool = False


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
    vpp_split: str                             # any | even (layers % (pp*vpp) == 0, every stage equal) | ends
                                               # (any, and the end virtual stages may hold only the embedding
                                               # or the loss: costmodel.specs.end_slots)
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
    # MoE parallel folding: routed experts on their own expert-TP x EP grid over the stage's
    # tp x cp x dp ranks (``ParallelConfig.etp`` != tp); the sources entry "expert_fold" says where
    expert_fold: bool = False
    # how MoE layers may run, as the launch file can set it (``ParallelConfig.moe_dispatcher`` and
    # ``ep_overlap``, priced by costmodel.moe); the sources entries of the same names say where
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    ep_overlap: bool = False
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


TITAN_MOE_FAMILIES = {"deepseek": "deepseek_v3", "qwen3": "qwen3", "gpt_oss": "gpt_oss"}


# The mixture-of-experts flavors torchtitan 0.3.0 ships (torchtitan/models/{qwen3,gpt_oss,deepseek_v3}/__init__.py
# *_configs), by the model shape they build: (family, hidden, layers, heads, kv_heads, experts, top_k,
# expert FFN width, vocab) -> (model package, flavor, RoPE base, RoPE max_seq_len). Each builds the
# catalog model's parameters up to weights the cost model does not count (Qwen3's q/k norms,
# gpt-oss's attention sinks and router biases; tests/test_priced_is_written.py checks on meta).
TITAN_MOE_FLAVORS: dict[tuple, tuple[str, str, float, int]] = {
    ("qwen3", 2048, 48, 32, 4, 128, 8, 768, 151936): ("qwen3", "30B-A3B", 1e6, 40960),
    ("qwen3", 4096, 94, 64, 4, 128, 8, 1536, 151936): ("qwen3", "235B-A22B", 5e6, 40960),
    ("gpt_oss", 2880, 24, 64, 8, 32, 4, 2880, 201088): ("gpt_oss", "20b", 150000.0, 131072),
    ("gpt_oss", 2880, 36, 64, 8, 128, 4, 2880, 201088): ("gpt_oss", "120b", 150000.0, 131072),
    ("deepseek", 7168, 61, 128, 128, 256, 8, 2048, 129280): ("deepseek_v3", "671B", 10000.0, 16384),
}


def titan_moe_flavor(model: ModelSpec) -> tuple[str, str, float, int] | None:
    """torchtitan's stock flavor for a mixture-of-experts model (``TITAN_MOE_FLAVORS``), None if none."""
    return TITAN_MOE_FLAVORS.get((model.family, model.hidden, model.layers, model.heads, model.kv_heads,
                                  model.num_experts, model.top_k, model.expert_ffn_hidden, model.vocab))


def titan_moe_problem(model: ModelSpec, wl: Workload) -> str | None:
    """Why torchtitan's stock flavors cannot train this mixture-of-experts model as priced, or None."""
    fl = titan_moe_flavor(model)
    if fl is None:
        return (f"{model.name}: torchtitan 0.3 builds its mixture-of-experts models from stock flavors "
                "(qwen3 30B-A3B, 235B-A22B; gpt_oss 20b, 120b; deepseek_v3 671B) and this shape is none of them; "
                "use the megatron target")
    pkg, flavor, theta, max_len = fl
    if model.rope_theta != theta:
        return (f"{model.name}: RoPE base {model.rope_theta:g}, torchtitan's {pkg} {flavor} flavor uses {theta:g}; "
                "use the megatron target")
    if wl.seq_len > max_len:
        return (f"seq_len {wl.seq_len}: torchtitan's {pkg} {flavor} flavor has RoPE for {max_len} positions; plan "
                f"--seq-len {max_len} or less")
    return None


def _titan_model(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if model.is_moe or model.attention == "mla":
        if model.family in TITAN_MOE_FAMILIES:
            return titan_moe_problem(model, wl)
        return (f"{model.name} ({model.family}, {model.num_experts} experts): torchtitan 0.3 ships mixture-of-experts "
                "model code for " + ", ".join(sorted(TITAN_MOE_FAMILIES.values())) + " only; use the megatron target")
    checks = [(model.mlp == "swiglu", f"the {model.mlp} MLP"),
              (model.norm == "rmsnorm", model.norm), (model.positions == "rotary", f"{model.positions} positions"),
              (not model.tied_embeddings, "tied embeddings"), (not model.bias, "linear biases"),
              (model.head_dim * model.heads == model.hidden, f"head_dim {model.head_dim}")]
    bad = [what for ok, what in checks if not ok]
    if bad:
        return (f"{model.name} has {', '.join(bad)}: the torchtitan target writes its llama3 model (dense, "
                "SwiGLU, RMSNorm, RoPE, untied, no biases); use the megatron target")
    return None


def titan_mtp_problem(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if model.mtp_layers and par.pp > 1:
        return (f"{model.mtp_layers} multi-token-prediction module(s) with pp={par.pp}: the torchtitan emitter "
                "states no pipeline stage for DeepSeek-V3's MTP modules (module_fqns_per_model_part); plan --pp 1")
    return None


def _titan_ep(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    """torchtitan's expert mesh: efsdp = dp_shard * cp * tp / ep (parallel_dims.py), so ep divides
    the sharded data-parallel ranks times the TP ranks; with TP it keeps every expert whole (no expert
    TP: etp 1, the cost model's folded layout)."""
    shard = (par.dp_shard if par.zero >= 2 else 1) * par.cp * par.tp
    if par.ep > 1 and par.folded and par.etp != 1:      # etp = tp is the table's expert_tp rule
        return (f"ep={par.ep} with tp={par.tp} and etp={par.etp}: torchtitan has no expert tensor parallel; with TP "
                "its expert parallel takes the TP ranks too and keeps every expert whole (parallel_dims.py efsdp); "
                "plan --etp 1")
    if par.ep > 1 and shard % par.ep:
        return (f"ep={par.ep}: torchtitan borrows expert parallel ranks from dp_shard*cp*tp = {shard} (FSDP "
                "shards, parallel_dims.py efsdp); plan an --ep that divides it, with --zero 2 or 3")
    return None


def _titan_sac(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if par.recompute == "selective" and wl.attention_kernel != "flash":
        return (f"selective recompute with the {wl.attention_kernel} attention kernel: torchtitan's SelectiveAC is "
                "per-op (it saves SDPA's output and every other matmul's), priced with fused attention; plan "
                "--recompute full or none")
    return None


def _titan_ddp(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    others = [f"{k}={getattr(par, k)}" for k in ("tp", "pp", "cp") if getattr(par, k) > 1]
    if par.zero == 0 and par.dp > 1 and others:
        return (f"zero=0 (DDP) with {', '.join(others)}: torchtitan applies DDP only when data parallel is the "
                "sole parallelism; plan --zero 2 or 3")
    return None


def _titan_bf16(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    fsdp = (par.zero >= 2 and par.dp_shard > 1) or par.cp > 1
    if wl.dtype in ("bf16", "bfloat16", "fp8") and (par.tp > 1 or par.pp > 1) and not fsdp:
        return (f"{wl.dtype} with tp={par.tp} pp={par.pp} and no FSDP (dp_shard={par.dp_shard}, zero={par.zero}): "
                "torchtitan mixes precision through fully_shard; plan dp > 1 with --zero 2 or 3")
    return None


# torchtitan's Float8 is torchao's ``Float8Linear`` (pytorch/torchtitan v0.3.0
# torchtitan/components/quantization/float8.py ``Float8LinearConverter``): dynamic scaling, casts per
# use, BF16 saved inputs (costmodel/fp8.py resolve). The published torchtitan Float8 runs (2024-12,
# 2025-06, torchtitan <= 0.2) used tensorwise scaling (with the FP8 FSDP all-gather where their configs set it), or rowwise;
# torchtitan 0.3.0's converter takes ``recipe_name`` rowwise (its default) or rowwise_with_gw_hp only,
# so rowwise is what the emitter writes and what a torchtitan plan defaults to.
# On Blackwell torchtitan 0.3.0 also runs torchao's MXFP8Linear (``components/quantization/mx.py``
# ``MXFP8LinearConverter``; costmodel/fp8.py ``torchao_mxfp8``): written as such.
TITAN_FP8_RECIPES = ("rowwise", "tensorwise", "mxfp8")
TITAN_FP8_WRITTEN = "rowwise"
TITAN_FP8_WRITES = ("rowwise", "mxfp8")
# torchao converts a Linear only when every dimension is a multiple of 16 (FP8 tensor cores;
# torchtitan/components/quantization/utils.py module_filter_fn); the cost model runs every linear
# GEMM of the blocks in FP8, so a model with another width is refused, not silently mixed. MXFP8
# scales blocks of 32 values along each operand's rows and columns (torchao ``MXTensor.to_mx``, block 32).
FP8_DIM_MULTIPLE = 16
MXFP8_DIM_MULTIPLE = 32


def titan_fp8_linear_dims(model: ModelSpec) -> dict[str, int]:
    """The widths of the block linears torchtitan converts to Float8 (fused wqkv, wo, w1/w3, w2), and of a
    mixture of experts' routed experts (their grouped GEMMs)."""
    dims = {"hidden": model.hidden, "q heads x head_dim": model.heads * model.head_dim,
            "kv heads x head_dim": model.kv_heads * model.head_dim, "ffn_hidden": model.ffn_hidden}
    if model.is_moe:
        dims["expert_ffn_hidden"] = model.expert_ffn_hidden
    return dims


def titan_fp8_problem(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if wl.dtype != "fp8":
        return None
    from costmodel.fp8 import default_recipe
    recipe = wl.fp8_recipe or default_recipe("torchtitan", None)
    if model.attention == "mla" or (model.is_moe and recipe != "mxfp8"):
        return (f"fp8 with {model.name}: torchtitan's Float8 for experts (Float8GroupedExpertsConverter) and MLA "
                "is not written by this emitter; plan --dtype bf16"
                + ("" if model.attention == "mla" else ", or --fp8-recipe mxfp8 on Blackwell (torchao's MXFP8 on "
                   "every linear but the router and the head, and on the experts' grouped GEMMs)"))
    if recipe not in TITAN_FP8_RECIPES:
        return (f"fp8 recipe {recipe}: torchtitan's Float8 is torchao's Float8Linear (recipes "
                f"{', '.join(TITAN_FP8_RECIPES)}), not Transformer Engine's; plan --fp8-recipe {TITAN_FP8_WRITTEN}")
    if wl.fp8_param_gather and recipe != "tensorwise":
        return (f"--fp8-param-gather with fp8 recipe {recipe}: torchao all-gathers FP8 weights under FSDP only "
                "with tensorwise scaling (enable_fsdp_float8_all_gather); drop --fp8-param-gather")
    mx = recipe == "mxfp8"
    multiple = MXFP8_DIM_MULTIPLE if mx else FP8_DIM_MULTIPLE
    bad = [f"{k} {v}" for k, v in titan_fp8_linear_dims(model).items() if v % multiple]
    if bad:
        why = ("torchao's MXFP8 scales blocks of 32 values along each operand (MXTensor.to_mx)" if mx else
               f"torchao converts a linear layer to Float8 only when its widths are multiples of {multiple} "
               "(module_filter_fn)")
        return (f"fp8 recipe {recipe} with {', '.join(bad)}: {why}, the cost model prices every block linear in "
                f"FP8; plan --dtype bf16")
    return None


def _ds_autotp_zero3(model: ModelSpec, wl: Workload, par: ParallelConfig, order: tuple) -> str | None:
    if par.tp > 1 and par.zero == 3 and par.dp > 1:
        return (f"tp={par.tp} with ZeRO-3: DeepSpeed's docs disagree on AutoTP with ZeRO-3 (config-json says "
                "stages 0-3, the AutoTP tutorial 0-2); plan --zero 2 or lower")
    return None


# --------------------------------------------------------------------------------------
# DeepSpeed's pipeline partition methods (deepspeed/runtime/pipe/module.py _partition_layers,
# deepspeed/runtime/utils.py partition_uniform / partition_balanced, DeepSpeed 0.19)
# --------------------------------------------------------------------------------------

# The PipelineModule layer list the DeepSpeed target's training script builds: the embedding,
# one spec per transformer block (class DS_BLOCK_TYPE), the final norm, the output head (a
# TiedLayerSpec when the embeddings are tied: DeepSpeed counts its parameters again).
DS_BLOCK_TYPE = "TransformerBlock"
DS_METHODS = ("uniform", "parameters", f"type:{DS_BLOCK_TYPE}")


def _ds_uniform(n: int, parts: int) -> list[int]:
    """Boundaries of ``n`` items in ``parts`` runs: ``n // parts`` each, the first ``n % parts``
    runs one more (partition_uniform); with ``n <= parts`` one item per run, then empty runs."""
    if n <= parts:
        return [min(i, n) for i in range(parts + 1)]
    size, extra = divmod(n, parts)
    return [i * size + min(i, extra) for i in range(parts + 1)]


def _ds_balanced(weights: Sequence[float], parts: int) -> list[int]:
    """Boundaries that partition_balanced picks: a dynamic program over (items, runs) that keeps,
    per state, the split with the least spread (largest run minus smallest), a later cut winning
    a tie; then the cuts read back from the last item."""
    n = len(weights)
    if n <= parts:
        return _ds_uniform(n, parts)
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # the state (i items in j runs) keeps the largest run, the smallest and their spread; rows by
    # runs (j), so that the innermost loop reads two lists (tests/test_space_fast_path.py holds it
    # equal to the table by items written out)
    hi = [[inf] * (n + 1) for _ in range(parts + 1)]
    lo = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    hi[0][0] = 0.0
    for i in range(1, n + 1):
        pi = prefix[i]
        for j in range(1, min(i, parts) + 1):
            hp, lp = hi[j - 1], lo[j - 1]
            best, bh, bl, bk = inf, inf, inf, 0
            for k in range(i):
                run = pi - prefix[k]
                h, low = hp[k], lp[k]
                top = h if h > run else run
                bottom = low if low < run else run
                if best >= top - bottom:
                    best, bh, bl, bk = top - bottom, top, bottom, k
            hi[j][i], lo[j][i], cut[j][i] = bh, bl, bk
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(cut[j][bounds[-1]])
    return bounds[::-1]


def ds_layer_weights(model: ModelSpec, method: str) -> list[float]:
    """The weight of each PipelineModule layer spec under ``method`` (DS_METHODS)."""
    blocks = model.layers
    if method == "uniform":
        return [1.0] * (blocks + 3)
    if method == "parameters":
        head = model.vocab * model.hidden
        return ([float(model.embedding_params())] + [float(model.layer_params(i)) for i in range(blocks)]
                + [float(model.norm_params()), float(head)])
    if method.startswith("type:"):
        return [0.0] + [1.0] * blocks + [0.0, 0.0]
    raise ValueError(f"partition_method {method!r}: DeepSpeed partitions by " + ", ".join(DS_METHODS))


@functools.lru_cache(maxsize=4096)
def ds_split(model: ModelSpec, pp: int, method: str) -> tuple[int, ...] | None:
    """Transformer blocks per pipeline stage when DeepSpeed partitions the layer list with
    ``method``; None when a stage gets no block (the planner's stages hold at least one)."""
    w = ds_layer_weights(model, method)
    b = _ds_uniform(len(w), pp) if method == "uniform" else _ds_balanced(w, pp)
    counts = tuple(sum(1 for i in range(b[s], b[s + 1]) if 1 <= i <= model.layers) for s in range(pp))
    return counts if all(counts) and sum(counts) == model.layers else None


def ds_splits(model: ModelSpec, pp: int) -> dict[tuple[int, ...], str]:
    """Each distinct split DeepSpeed's methods give, with the first method (DS_METHODS order) that gives it."""
    out: dict[tuple[int, ...], str] = {}
    for m in DS_METHODS:
        c = ds_split(model, pp, m)
        if c is not None and c not in out:
            out[c] = m
    return out


# Megatron-DeepSpeed's GPTModelPipe (microsoft/Megatron-DeepSpeed megatron/model/gpt_model.py, commit
# f4157bea): layer list = a cast function, the embedding, L x ParallelTransformerLayerPipe, the final
# norm, the (tied) head, a cast function; PipelineModule(partition_method='type:transformer') is written
# in the model code, so the blocks per stage are partition_balanced over 0/1 weights (1: the blocks).
MDS_METHOD = "type:transformer"


@functools.lru_cache(maxsize=4096)
def mds_split(model: ModelSpec, pp: int) -> tuple[int, ...] | None:
    """Transformer blocks per pipeline stage that Megatron-DeepSpeed's GPTModelPipe places; None
    when a stage gets no block."""
    w = [0.0, 0.0] + [1.0] * model.layers + [0.0, 0.0, 0.0]
    b = _ds_balanced(w, pp)
    counts = tuple(sum(1 for i in range(b[s], b[s + 1]) if 2 <= i < 2 + model.layers) for s in range(pp))
    return counts if all(counts) and sum(counts) == model.layers else None


def partition_splits(target: str, model: ModelSpec, pp: int) -> dict[tuple[int, ...], str]:
    """The splits a target that places the layers itself runs, each with its partition method:
    DeepSpeed's three methods, or Megatron-DeepSpeed's one."""
    if target == "megatron-deepspeed":
        got = mds_split(model, pp)
        return {got: MDS_METHOD} if got else {}
    return ds_splits(model, pp)


def partition_split(target: str, model: ModelSpec, pp: int, method: str) -> tuple[int, ...] | None:
    if target == "megatron-deepspeed":
        return mds_split(model, pp) if method == MDS_METHOD else None
    return ds_split(model, pp, method)


def partition_methods(target: str) -> tuple[str, ...]:
    return (MDS_METHOD,) if target == "megatron-deepspeed" else DS_METHODS


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
    "zero": f"{MEGATRON_SRC}: --use-distributed-optimizer (ZeRO-1), --use-megatron-fsdp optim_grads / "
            "optim_grads_params (ZeRO-2/3), arguments.py ~3170",
    "zero_pp": f"{MEGATRON_SRC}: the distributed optimizer with PP; torch-FSDP2 refuses PP (arguments.py ~1034); "
               "Megatron-FSDP with PP is unconfirmed (no refusal, no test), so not planned",
    "hsdp": f"{MEGATRON_SRC}: --num-distributed-optimizer-instances (distributed optimizer over part of dp x cp); "
            "Megatron-FSDP's --outer-dp-sharding-strategy is not written by emitters/megatron.py",
    "cp": f"{MEGATRON_SRC}: --context-parallel-size; seq_length % (2*CP) == 0 (arguments.py ~1336)",
    "ep": f"{MEGATRON_SRC}: num_experts % EP == 0 (arguments.py ~1656); expert grid ETP x EP x PP (parallel_state.py ~870)",
    "expert_tp": f"{MEGATRON_SRC}: --expert-tensor-parallel-size (default = TP)",
    "expert_fold": "Megatron-Core parallel_state.initialize_model_parallel: expert grid ETP x EP x EDP x PP over the "
                   "same world (world % (etp*ep*pp) == 0), 'MoE Parallel Folding' (arXiv 2504.14960)",
    "vpp": f"{MEGATRON_SRC}: --num-virtual-stages-per-pipeline-rank or the layout; PP > 1 (arguments.py ~1000)",
    "moe_dispatchers": "Megatron-Core 0.16 transformer_config.py: --moe-token-dispatcher-type alltoall, or flex with "
                       "--moe-flex-dispatcher-backend deepep or hybridep (not with --moe-pad-expert-input-to-capacity; "
                       "multi-node NVLink with hybridep only: moe_flex_dispatcher_backend)",
    "ep_overlap": "Megatron-Core 0.16 transformer_config.py __post_init__ (overlap_moe_expert_parallel_comm): EP > 1, "
                  "alltoall or flex dispatcher, no full recompute, VPP when PP > 1, bf16/fp16, at most 1 MTP layer "
                  "and then PP > 1",
    "vpp_split": f"{MEGATRON_SRC}: --pipeline-model-parallel-layout, stage count = pp*vpp, any layers per stage; "
                 "the first virtual stage may hold only the embedding (E) and the last only the loss (L): "
                 "pipeline_parallel_layer_layout.py validate_layer_layout asks only E first and L last, once each",
    "split": f"{MEGATRON_SRC}: --pipeline-model-parallel-layout (transformer_config.py ~2240), any layers per stage",
    "recompute": f"{MEGATRON_SRC}: --recompute-granularity full|selective; full needs a method and num-layers "
                 "(transformer_config.py ~1905); selective recomputes --recompute-modules, default core_attn, "
                 "priced as such (costmodel/layers.py core_attn_recompute: with a fused kernel only the softmax "
                 "statistics are dropped)",
    "recompute_block": f"{MEGATRON_SRC}: --recompute-method block: the first N layers of every pipeline stage "
                       "(transformer_config.py ~543); with vpp, of every virtual stage",
    "recompute_per_stage": f"{MEGATRON_SRC}: no CLI for a different recompute per stage",
    "sp": f"{MEGATRON_SRC}: --sequence-parallel, forced off with TP = 1 (arguments.py ~1432)",
    "schedules": f"{MEGATRON_SRC}: 1F1B, interleaved 1F1B with VPP; no GPipe (schedules.py)",
    "microbatches": f"{MEGATRON_SRC}: interleaved: microbatch_group_size_per_vp_stage = PP in [PP, M], M mod group "
                    "0 or >= PP (schedules.py ~1160-1172), so M % PP == 0",
    "orders": f"{MEGATRON_SRC}: order tp-cp-ep-dp-pp (parallel_state.py ~617), or --use-tp-pp-dp-mapping",
    "tp_with_pp": f"{MEGATRON_SRC}: DP = world / (TP x PP x CP)",
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
    cp=True, cp_seq=_megatron_cp, cp_seq_text="2*cp", ep=True, expert_tp=True, expert_fold=True,
    moe_dispatchers=("alltoall", "deepep", "hybridep"), ep_overlap=True,
    vpp=True, vpp_split="ends", split="any",
    recompute=frozenset({"none", "selective", "full"}), recompute_block=True, recompute_per_stage=False,
    sp="optional", schedules=frozenset({"1f1b", "interleaved"}), microbatches="megatron",
    orders=MEGATRON_ORDERS, tp_with_pp=True, dtypes=frozenset({"bf16", "fp16", "fp32", "fp8", "nvfp4"}),
    mla=True, moe=True, alibi=False, kv_heads_divisible=True, heterogeneous=False,
    sources=MEGATRON_SOURCES,
    extra=(Extra(what="expert grid", source=f"{MEGATRON_SRC}: parallel_state.py ~870-907", check=_megatron_expert_grid),),
)

TORCHTITAN = TrainTarget(
    name="torchtitan", summary="torchtitan (FSDP2, DTensor TP, torch pipelining, CP)", runs="torchtitan",
    zero=frozenset({0, 2, 3}), zero_pp=frozenset({2, 3}), hsdp=frozenset({2, 3}),
    cp=True, cp_seq=_titan_cp, cp_seq_text="2*cp*tp", ep=True, expert_tp=False, expert_fold=True,
    vpp=True, vpp_split="any", split="any",
    recompute=frozenset({"none", "selective", "full"}), recompute_block=False, recompute_per_stage=False,
    sp="with_tp", schedules=frozenset({"1f1b", "gpipe", "interleaved"}), microbatches="torch",
    orders=(MESH_AXES,), tp_with_pp=True, dtypes=frozenset({"bf16", "fp32", "fp8"}),
    mla=True, moe=True, alibi=False, kv_heads_divisible=True, heterogeneous=False,
    sources={
        "zero": f"{TORCHTITAN_SRC}: FSDP2 only (fsdp_reshard_after_forward never = ZeRO-2, always = ZeRO-3); "
                "no optimizer-only sharding; DDP only when dp is the sole parallelism (emitters/torchtitan.py)",
        "zero_pp": f"{TORCHTITAN_SRC}: FSDP2 with PP, no reshard by default (fsdp.py ~112-132)",
        "hsdp": f"{TORCHTITAN_SRC}: data_parallel_replicate_degree x data_parallel_shard_degree",
        "cp": f"{TORCHTITAN_SRC}: context_parallel_degree; emitters/torchtitan.py: seq_len % (tp*2*cp)",
        "ep": "pytorch/torchtitan v0.3.0 torchtitan/distributed/parallel_dims.py: expert_parallel_degree, "
              "efsdp = dp_shard*cp*tp/ep; MoE models deepseek_v3, qwen3, gpt_oss (torchtitan/models/)",
        "expert_tp": f"{TORCHTITAN_SRC}: expert TP deprecated (c4b409af2): no experts split over TP",
        "expert_fold": "torchtitan/distributed/parallel_dims.py build_mesh: the sparse mesh pp, dp_replicate, efsdp, ep "
                       "with efsdp = dp_shard*cp*tp/ep, so EP with TP spans the TP ranks and keeps every expert whole: "
                       "the cost model's folded layout with etp 1 (stop 48; the expert mesh rule below)",
        "moe_dispatchers": "its own all-to-all (priced as alltoall); emitters/torchtitan.py writes no dispatcher choice",
        "ep_overlap": "not planned: emitters/torchtitan.py writes no expert-parallel overlap",
        "vpp": f"{TORCHTITAN_SRC}: Interleaved1F1B and other multi-stage schedules, >= 2 stages per rank",
        "vpp_split": f"{TORCHTITAN_SRC}: module_fqns_per_model_part, any layers per model part; "
                     "emitters/torchtitan.py model_parts writes each rank's near-equal chunks (emitters/base.py "
                     "virtual_counts, the built-in runtime's cut)",
        "split": f"{TORCHTITAN_SRC}: module_fqns_per_model_part, any layers per stage",
        "recompute": "pytorch/torchtitan v0.3.0 torchtitan/distributed/activation_checkpoint.py: FullAC (every "
                     "block) or SelectiveAC, per-op: saves SDPA, linear, reduce-scatter and all-to-all outputs, "
                     "recomputes every second matmul; priced as op-level selective (costmodel/layers.py, fused "
                     "attention: half the stored activations, half the matmuls again)",
        "recompute_block": f"{TORCHTITAN_SRC}: apply() wraps every block; no every-N-layers option",
        "recompute_per_stage": f"{TORCHTITAN_SRC}: no per-stage or per-layer recompute",
        "sp": "emitters/torchtitan.py: SequenceParallel norms always with TP (enable_sequence_parallel)",
        "schedules": f"{TORCHTITAN_SRC}: get_schedule_class names (1F1B, GPipe, Interleaved1F1B, ...)",
        "microbatches": "torch/distributed/pipelining/schedules.py: Schedule1F1B needs micro-batches >= stages "
                        "(~1020); Interleaved1F1B a multiple of max(1, M // pp) rounds (~2937)",
        "orders": f"{TORCHTITAN_SRC} torchtitan/distributed/parallel_dims.py: pp, dp_replicate, dp_shard, cp, tp",
        "tp_with_pp": f"{TORCHTITAN_SRC}: dp_replicate*dp_shard*cp*tp*pp == WORLD_SIZE",
        "dtypes": "emitters/torchtitan.py: mixed_precision_param bfloat16 or float32; fp8 through "
                  "pytorch/torchtitan v0.3.0 torchtitan/components/quantization/float8.py Float8LinearConverter "
                  "(torchao Float8Linear on the block linears, lm_head kept in bf16 with filter_fqns)",
        "models": "emitters/torchtitan.py _check_model: llama3 (dense, SwiGLU, RMSNorm, RoPE, untied, no biases); "
                  "torchtitan/models/ deepseek_v3 (MLA + MoE), qwen3, gpt_oss for mixtures of experts",
        "kv_heads_divisible": "torchtitan llama3 parallelize: wk/wv column-parallel, KV heads split over tp",
        "heterogeneous": "emitters/base.py require_one_group",
    },
    extra=(Extra(what="model", source="emitters/torchtitan.py _check_model; torchtitan/models/", check=_titan_model,
                 model_only=True),
           Extra(what="expert mesh", source="torchtitan/distributed/parallel_dims.py efsdp", check=_titan_ep),
           Extra(what="MTP stage", source="emitters/torchtitan.py model_parts", check=titan_mtp_problem),
           Extra(what="per-op SAC", source="torchtitan/distributed/activation_checkpoint.py SelectiveAC",
                 check=_titan_sac),
           Extra(what="DDP", source="emitters/torchtitan.py _data_parallel", check=_titan_ddp),
           Extra(what="bf16 needs FSDP", source="emitters/torchtitan.py config", check=_titan_bf16),
           Extra(what="Float8", source="torchtitan/components/quantization/float8.py, utils.py module_filter_fn",
                 check=titan_fp8_problem)),
)

DEEPSPEED = TrainTarget(
    name="deepspeed", summary="DeepSpeed 0.19 (ZeRO, AutoTP, PipelineModule, AutoEP)", runs="deepspeed",
    zero=frozenset({0, 1, 2, 3}), zero_pp=frozenset({0, 1}), hsdp=frozenset(),
    cp=False, cp_seq=_megatron_cp, cp_seq_text="-", ep=True, expert_tp=False,
    vpp=False, vpp_split="even", split="partition",
    recompute=frozenset({"none", "full"}), recompute_block=False, recompute_per_stage=False,
    sp="never", schedules=frozenset({"1f1b"}), microbatches="none",
    orders=(MESH_AXES,), tp_with_pp=False, dtypes=frozenset({"bf16", "fp16", "fp32"}),
    mla=True, moe=True, alibi=True, kv_heads_divisible=False, heterogeneous=False,
    sources={
        "zero": f"{DEEPSPEED_SRC}: zero_optimization.stage 0-3",
        "zero_pp": f"{DEEPSPEED_SRC}: PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py ~74-77)",
        "hsdp": f"{DEEPSPEED_SRC}: hpZ is a secondary parameter partition, not replicas of shards; MiCS removed in 0.19 "
                "(emitters/deepspeed.py)",
        "cp": f"{DEEPSPEED_SRC}: Ulysses sequence parallel (all-to-all over heads), not ring context parallel",
        "ep": f"{DEEPSPEED_SRC}: AutoEP expert_parallel.autoep_size (divides world/pp)",
        "expert_tp": f"{DEEPSPEED_SRC}: AutoEP expert_tensor_parallel_size: only 1 accepted (config-json ~940)",
        "expert_fold": f"{DEEPSPEED_SRC}: AutoEP autoep_size divides world/pp, ETP 1 only; not planned "
                       "(emitters/deepspeed.py writes no folding)",
        "moe_dispatchers": f"{DEEPSPEED_SRC}: AutoEP's all-to-all (priced as alltoall); no dispatcher choice",
        "ep_overlap": "not planned: emitters/deepspeed.py writes no expert-parallel overlap",
        "vpp": f"{DEEPSPEED_SRC}: TrainSchedule is synchronous 1F1B; no interleaved schedule",
        "vpp_split": f"{DEEPSPEED_SRC}",
        "split": "deepspeedai/DeepSpeed v0.19 deepspeed/runtime/pipe/module.py _partition_layers: partition_method "
                 "uniform (partition_uniform over the layer list), parameters or type:REGEX (partition_balanced); "
                 "a split is run only if one of them gives it (ds_split; the plan names the method)",
        "recompute": f"{DEEPSPEED_SRC}: PipelineModule activation_checkpoint_interval (every layer); without "
                     "stages the model checkpoints its blocks itself (Hugging Face gradient_checkpointing_enable(), "
                     "or deepspeed.checkpointing.checkpoint, which the activation_checkpointing section configures: "
                     "docs/code-docs/source/activation-checkpointing.rst); no selective mode",
        "recompute_block": f"{DEEPSPEED_SRC}: one activation_checkpoint_interval for the whole module",
        "recompute_per_stage": f"{DEEPSPEED_SRC}: no per-stage variation",
        "sp": "emitters/deepspeed.py: AutoTP has no Megatron-style sequence-parallel norms",
        "schedules": f"{DEEPSPEED_SRC}: TrainSchedule (1F1B)",
        "microbatches": f"{DEEPSPEED_SRC}: gradient_accumulation_steps = pipeline micro-batches",
        "orders": f"{DEEPSPEED_SRC}: PipeModelDataParallelTopology axes pipe, data, model (model innermost)",
        "tp_with_pp": f"{DEEPSPEED_SRC}: AutoTP with PipelineModule not confirmed in source",
        "dtypes": "emitters/deepspeed.py: bf16 / fp16 sections or fp32",
        "models": "DeepSpeed runs the user's model code; AutoTP/AutoEP presets cover llama, mixtral, deepseek",
        "kv_heads_divisible": f"{DEEPSPEED_SRC}: AutoTP distributes heads unevenly",
        "heterogeneous": "emitters/base.py require_one_group",
    },
    extra=(Extra(what="AutoTP with ZeRO-3", source=f"{DEEPSPEED_SRC}", check=_ds_autotp_zero3),),
)

MEGADS_REPO = "microsoft/Megatron-DeepSpeed f4157bea"
MEGADS = TrainTarget(
    name="megatron-deepspeed", summary="Megatron-DeepSpeed pretrain_gpt.py + ds_config (Megatron TP, DeepSpeed "
    "pipeline engine and ZeRO-1): the stack of BLOOM-176B, MT-NLG 530B, GPT-NeoX-20B", runs="megatron-deepspeed",
    zero=frozenset({0, 1}), zero_pp=frozenset({0, 1}), hsdp=frozenset(),
    cp=False, cp_seq=_megatron_cp, cp_seq_text="-", ep=False, expert_tp=False,
    vpp=False, vpp_split="even", split="partition",
    recompute=frozenset({"none", "full"}), recompute_block=False, recompute_per_stage=False,
    sp="never", schedules=frozenset({"1f1b"}), microbatches="none",
    orders=(MESH_AXES,), tp_with_pp=True, dtypes=frozenset({"bf16", "fp16", "fp32"}),
    mla=False, moe=False, alibi=False, kv_heads_divisible=True, heterogeneous=False,
    sources={
        "zero": f"{MEGADS_REPO} megatron/arguments.py --zero-stage (into ds_config zero_optimization.stage); "
                "ZeRO-2/3 need --no-pipeline-parallel and the model built under deepspeed.zero.Init, which "
                "emitters/megatron_deepspeed.py does not write: stages 0 and 1 only",
        "zero_pp": f"{DEEPSPEED_SRC}: PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py ~74-77)",
        "hsdp": "DeepSpeed 0.19 removed MiCS (emitters/deepspeed.py)",
        "cp": f"{MEGADS_REPO} megatron/arguments.py --ds-sequence-parallel-size is DeepSpeed-Ulysses (all-to-all "
              "over heads), not ring context parallelism",
        "ep": f"{MEGADS_REPO}: MoE (--num-experts) runs without the pipeline engine only "
              "(GPTModelPipe has no MoE layers); not written by emitters/megatron_deepspeed.py",
        "expert_tp": "no MoE here",
        "expert_fold": "not planned: no MoE under GPTModelPipe (see ep)",
        "moe_dispatchers": "not planned: no MoE under GPTModelPipe (see ep)",
        "ep_overlap": "not planned: no MoE under GPTModelPipe (see ep)",
        "vpp": f"{DEEPSPEED_SRC}: TrainSchedule is synchronous 1F1B; no interleaved schedule",
        "vpp_split": f"{DEEPSPEED_SRC}: no virtual stages",
        "split": f"{MEGADS_REPO} megatron/model/gpt_model.py GPTModelPipe: PipelineModule(partition_method="
                 "'type:transformer'), written in the model code; the blocks per stage are DeepSpeed's "
                 "partition_balanced over the layer list (mds_split)",
        "recompute": f"{MEGADS_REPO} megatron/arguments.py --checkpoint-activations: GPTModelPipe's "
                     "activation_checkpoint_interval = --checkpoint-num-layers (1: every block); no selective "
                     "recompute under the pipeline engine",
        "recompute_block": f"{MEGADS_REPO} gpt_model.py: 'deepspeed's pipeline doesn't support the block "
                           "recompute method'",
        "recompute_per_stage": f"{DEEPSPEED_SRC}: one activation_checkpoint_interval for the whole module",
        "sp": f"{MEGADS_REPO} megatron/arguments.py --sequence-parallel exists but is not written by "
              "emitters/megatron_deepspeed.py (BLOOM, MT-NLG and NeoX ran without it)",
        "schedules": f"{DEEPSPEED_SRC}: TrainSchedule (1F1B)",
        "microbatches": f"{DEEPSPEED_SRC}: gradient_accumulation_steps = pipeline micro-batches",
        "orders": f"{MEGADS_REPO} gpt_model.py: PipeModelDataParallelTopology(num_pp, num_mp, num_dp): axes "
                  "pipe, data, model (model innermost)",
        "tp_with_pp": f"{MEGADS_REPO} megatron/arguments.py --tensor-model-parallel-size with "
                      "--pipeline-model-parallel-size: Megatron's mpu inside DeepSpeed's topology",
        "dtypes": f"{MEGADS_REPO} megatron/arguments.py --bf16 / --fp16 (and the ds_config sections)",
        "models": f"{MEGADS_REPO} megatron/arguments.py: --swiglu, --normalization rmsnorm, "
                  "--use-rotary-position-embeddings, --num-key-value-heads, --untie-embeddings-and-output-weights,"
                  " --disable-bias-linear; no ALiBi in this fork (BigScience's fork had it), no multi-latent "
                  "attention",
        "kv_heads_divisible": f"{MEGADS_REPO} megatron/model/transformer.py: KV heads split over tp",
        "heterogeneous": "emitters/base.py require_one_group",
    },
)

_ACCEL_MEGATRON = dataclasses.replace(
    MEGATRON, name="accelerate", summary="Accelerate, Megatron-LM plugin (tp > 1 or pp > 1)", runs="megatron",
    expert_fold=False, moe_dispatchers=("alltoall",), ep_overlap=False,
    zero=frozenset({0, 1}), zero_pp=frozenset({0, 1}), hsdp=frozenset(), vpp=False, split="last",
    recompute=frozenset({"full"}), recompute_block=True, schedules=frozenset({"1f1b"}), microbatches="none",
    orders=(MESH_AXES,), dtypes=frozenset({"bf16", "fp16", "fp32", "fp8"}),
    sources={**MEGATRON_SOURCES,
             "expert_fold": f"{ACCELERATE_SRC}: the MegatronLMPlugin has no expert tensor parallel size; not planned",
             "moe_dispatchers": f"{ACCELERATE_SRC}: the MegatronLMPlugin has no dispatcher field (Megatron's "
                                "default alltoall)",
             "ep_overlap": f"{ACCELERATE_SRC}: the MegatronLMPlugin has no EP overlap field; not planned",
             "zero": f"{ACCELERATE_SRC}: MegatronLMPlugin use_distributed_optimizer (ZeRO-1) only",
             "zero_pp": f"{ACCELERATE_SRC}: MegatronLMPlugin use_distributed_optimizer (ZeRO-1) only",
             "hsdp": "emitters/accelerate.py: the plugin has no --num-distributed-optimizer-instances",
             "vpp": f"{ACCELERATE_SRC}: num_layers_per_virtual_pipeline_stage, not written by emitters/accelerate.py",
             "split": f"{ACCELERATE_SRC}: decoder_last_pipeline_num_layers only (the first via other args, untested)",
             "recompute": "emitters/accelerate.py: MegatronLMPlugin always passes a recompute method (full "
                          "granularity); no 'off', and a method with selective is refused by Megatron",
             "schedules": f"{ACCELERATE_SRC}: Megatron 1F1B",
             "orders": f"{MEGATRON_SRC}: Megatron tp-cp-ep-dp-pp"},
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
        "zero": f"{ACCELERATE_SRC}  4.3: FSDP2 reshard_after_forward (ZeRO-3) or not (ZeRO-2); DeepSpeed plugin stage 1; "
                "DDP (emitters/accelerate.py)",
        "zero_pp": f"{ACCELERATE_SRC}: ParallelismConfig has no PP field",
        "hsdp": f"{ACCELERATE_SRC}: dp_replicate_size x dp_shard_size",
        "cp": f"{ACCELERATE_SRC}: cp_size (torch backend) under FSDP2",
        "ep": f"{ACCELERATE_SRC}: no EP field",
        "expert_tp": f"{ACCELERATE_SRC}", "expert_fold": f"{ACCELERATE_SRC}: no EP field", "vpp": f"{ACCELERATE_SRC}",
        "moe_dispatchers": f"{ACCELERATE_SRC}: no EP field", "ep_overlap": f"{ACCELERATE_SRC}: no EP field",
        "vpp_split": f"{ACCELERATE_SRC}", "split": f"{ACCELERATE_SRC}",
        "recompute": f"{ACCELERATE_SRC}: FSDP plugin activation_checkpointing (bool, whole model)",
        "recompute_block": f"{ACCELERATE_SRC}", "recompute_per_stage": f"{ACCELERATE_SRC}",
        "sp": f"{ACCELERATE_SRC}: no TP here", "schedules": f"{ACCELERATE_SRC}", "microbatches": f"{ACCELERATE_SRC}",
        "orders": f"{ACCELERATE_SRC}: mesh dp_replicate, dp_shard, cp, tp",
        "tp_with_pp": f"{ACCELERATE_SRC}", "dtypes": "emitters/accelerate.py MIXED: no, fp16, bf16, fp8",
        "models": "Accelerate runs the user's model", "kv_heads_divisible": "no TP here",
        "heterogeneous": "emitters/base.py require_one_group",
    },
    extra=(Extra(what="recompute under DDP", source="emitters/accelerate.py config", check=_accel_fsdp_recompute),
           Extra(what="CP under FSDP2", source="emitters/accelerate.py _fsdp", check=_accel_fsdp_cp)),
)

# priced with the accelerate profile, which prices the engine each variant hands the run to
# (costmodel.frameworks.backend_profile: the Megatron-LM plugin's overlaps and kernels, DeepSpeed's)
ACCELERATE = dataclasses.replace(
    _ACCEL_MEGATRON, summary="Hugging Face Accelerate 1.x: the Megatron-LM plugin for tp/pp, else FSDP2/DDP",
    runs="accelerate",
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
    "expert_fold": "runtime/parallel.py: experts on an ep x tp mesh inside dp; no separate expert TP",
    "moe_dispatchers": "runtime/parallel.py: its own all-to-all over the EP group (priced as alltoall)",
    "ep_overlap": "runtime/parallel.py: the all-to-alls run in line with compute; no overlap",
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
    sources={"ep": f"{VLLM_EP_SRC}: --enable-expert-parallel gives EP = TP x DP",
             "replicas": f"{VLLM_SRC}: --data-parallel-size (-local, -start-rank over nodes)",
             "multi_node_replica": f"{VLLM_SRC}: --nnodes/--node-rank/--headless, one replica over nodes",
             "replicas_over_nodes": "emitters/vllm.py: node-sized replicas or one replica over nodes, not a "
                                    "replica over nodes and several replicas",
             "dtypes": "emitters/vllm.py: --dtype, fp8 as --quantization fp8; int8/int4 need a named method",
             "kv_dtypes": "emitters/vllm.py: --kv-cache-dtype fp8 or the model dtype",
             "kv_heads_divisible": f"{VLLM_SRC}: KV heads replicated when tp > kv heads",
             "mla": f"{VLLM_EP_SRC}: DeepSeek MLA served", "heterogeneous": "emitters/base.py require_one_group"})

SGLANG = ServeTarget(
    name="sglang", summary="python -m sglang.launch_server", runs="sglang", ep="none", replicas=True,
    multi_node_replica=True, replicas_over_nodes=True, dtypes=SERVE_DTYPES, kv_dtypes=SERVE_DTYPES | {"fp8"},
    kv_heads_divisible=False, mla=True, heterogeneous=False,
    sources={"ep": "emitters/sglang.py: --ep-size splits experts within one TP group (ep = tp); the serving "
                   f"planner spreads them over replicas ({SGLANG_EP_SRC})",
             "replicas": f"{SGLANG_SRC}: --dp-size", "multi_node_replica": f"{SGLANG_SRC}: --nnodes --node-rank",
             "replicas_over_nodes": f"{SGLANG_SRC}", "dtypes": "emitters/sglang.py: --dtype float16/bfloat16/float32",
             "kv_dtypes": "emitters/sglang.py: --kv-cache-dtype fp8_e4m3 or the model dtype",
             "kv_heads_divisible": f"{SGLANG_EP_SRC}", "mla": f"{SGLANG_EP_SRC}: DeepSeek served",
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
             "kv_heads_divisible": f"{TRTLLM_SRC}", "mla": f"{DEEPSEEK_SERVING_SRC}",
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

# --------------------------------------------------------------------------------------
# The target record and its registry
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Start:
    """How a cluster launcher (``emitters.LAUNCHERS``: torchrun, Slurm, Kubernetes) starts a
    framework's files: one launcher task per node runs ``script`` (which starts the node's
    processes itself, through torchrun or the framework's own launcher) with the node's rank and
    node 0's address in the variables named here. ``""``: the script takes no such variable (a
    c10d rendezvous needs no node rank). ``env``: fixed variables the launcher also sets."""
    script: str
    node_rank: str
    head_addr: str
    port: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    source: str


@dataclass(frozen=True, kw_only=True)
class Target:
    """One execution target, every part of it in one record: what it runs (``table``: the
    capability table, each fact with its source), how fast (``profile``: the key of its cost
    profile in ``costmodel.frameworks.FRAMEWORKS``), what it writes (``emitter``: the module with
    ``emit(plan)``), how the search plans for it (``search``: ``module:function``) and, for a
    training framework, how a cluster launcher starts its files (``start``). ``launcher``: a
    wrapper target (``slurm`` = the built-in runtime started by the Slurm launcher). ``planned``:
    ``--target all`` solves for it. Parts in other layers are named, not imported, so that this
    record stays in the plan file's layer; ``tests/test_targets_record.py`` imports every one."""
    name: str
    mode: str
    table: TrainTarget | ServeTarget
    profile: str
    emitter: str
    search: str
    start: Start | None = None
    launcher: str = ""
    planned: bool = True


TRAIN_SEARCH = "planner.search.targets:solve_target"
SERVE_SEARCH = "planner.search.target_serving:solve_serving_for"

_START_SRC = "the script's DISTRIBUTED/TORCHRUN/LAUNCH arguments (emitters/{})"
STARTS = {
    "megatron": Start(script="megatron.sh", node_rank="NODE_RANK", head_addr="MASTER_ADDR", port="MASTER_PORT",
                      source=_START_SRC.format("megatron.py") + "; Megatron-LM examples start torchrun per node"),
    "torchtitan": Start(script="torchtitan.sh", node_rank="", head_addr="HEAD_ADDR", port="RDZV_PORT",
                        source=_START_SRC.format("torchtitan.py") + "; torchtitan's multinode_trainer.slurm: one "
                               "srun task per node, torchrun c10d inside"),
    "deepspeed": Start(script="deepspeed.sh", node_rank="NODE_RANK", head_addr="MASTER_ADDR", port="MASTER_PORT",
                       env={"DS_LAUNCHER": "torchrun"},
                       source=_START_SRC.format("deepspeed.py") + ": DS_LAUNCHER=torchrun starts torchrun on "
                              "this node instead of the ssh/pdsh runner (deepspeed.init_distributed reads "
                              "torchrun's environment)"),
    "megatron-deepspeed": Start(script="megatron_deepspeed.sh", node_rank="NODE_RANK", head_addr="MASTER_ADDR",
                                port="MASTER_PORT",
                                source=_START_SRC.format("megatron_deepspeed.py") + ": torchrun per node (the "
                                       "fork's examples start it so; deepspeed.init_distributed reads its env)"),
    "accelerate": Start(script="accelerate.sh", node_rank="MACHINE_RANK", head_addr="MAIN_PROCESS_IP", port="",
                        source=_START_SRC.format("accelerate.py") + ": accelerate launch --machine_rank "
                               "--main_process_ip, one per node"),
    "builtin": Start(script="torchrun.sh", node_rank="", head_addr="HEAD_ADDR", port="RDZV_PORT",
                     source=_START_SRC.format("torchrun.py") + ": c10d rendezvous"),
}

_FRAMEWORK_TABLES = (MEGATRON, TORCHTITAN, DEEPSPEED, MEGADS, ACCELERATE, BUILTIN)
_EMITTER = {"megatron": "emitters.megatron", "torchtitan": "emitters.torchtitan", "deepspeed": "emitters.deepspeed",
            "megatron-deepspeed": "emitters.megatron_deepspeed",
            "accelerate": "emitters.accelerate", "builtin": "emitters.torchrun"}
_WRAPPERS = (("torchrun", "torchrun + the built-in runtime", True),
             ("slurm", "sbatch + torchrun + the built-in runtime", False),
             ("kubernetes", "Kubeflow PyTorchJob + the built-in runtime", False))

# THE registry: every target, training and serving, once.
REGISTRY: tuple[Target, ...] = (
    *(Target(name=t.name, mode="train", table=t, profile=t.runs, emitter=_EMITTER[t.name], search=TRAIN_SEARCH,
             start=STARTS[t.name]) for t in _FRAMEWORK_TABLES),
    *(Target(name=n, mode="train", table=_launcher(n, summary, hetero), profile="builtin", emitter=f"emitters.{n}",
             search=TRAIN_SEARCH, launcher=n, planned=False) for n, summary, hetero in _WRAPPERS),
    Target(name="vllm", mode="infer", table=VLLM, profile="vllm", emitter="emitters.vllm", search=SERVE_SEARCH),
    Target(name="sglang", mode="infer", table=SGLANG, profile="sglang", emitter="emitters.sglang", search=SERVE_SEARCH),
    Target(name="tensorrt-llm", mode="infer", table=TRTLLM, profile="tensorrt-llm", emitter="emitters.tensorrt_llm",
           search=SERVE_SEARCH),
    Target(name="builtin", mode="infer", table=BUILTIN_SERVE, profile="static", emitter="emitters.torchrun",
           search=SERVE_SEARCH),
)


_BY_KEY: dict[tuple[str, str], Target] = {(r.name, r.mode): r for r in REGISTRY}


def record(name: str, mode: str = "train") -> Target:
    """The registered record of target ``name`` for plans of ``mode``; ``KeyError`` if none."""
    try:
        return _BY_KEY[name, mode]
    except KeyError:
        raise KeyError(name) from None


def records(mode: str) -> tuple[Target, ...]:
    return tuple(r for r in REGISTRY if r.mode == mode)


# Views of the registry (names kept for the callers that read them)
TRAIN: dict[str, TrainTarget] = {r.name: r.table for r in records("train")}      # type: ignore[misc]
SERVE: dict[str, ServeTarget] = {r.name: r.table for r in records("infer")}      # type: ignore[misc]
_TABLES = TRAIN
TRAIN_TARGETS = tuple(r.name for r in records("train") if r.planned)
SERVE_TARGETS = tuple(r.name for r in records("infer") if r.planned)
LAUNCHERS = tuple(r.name for r in records("train") if r.launcher)   # start the built-in runtime


def names(mode: str) -> tuple[str, ...]:
    """Target names a plan of ``mode`` may name (planning targets first, then launch wrappers)."""
    return TRAIN_TARGETS + LAUNCHERS if mode == "train" else SERVE_TARGETS


# Training frameworks that are not targets, by the name a user types: what prices them. ``planner
# estimate`` accepts such a name and says what it priced with; ``planner plan`` and ``emit``, which write
# a target's files, refuse it with the same words as a hint (``stand_in_hint``).
STAND_INS: dict[str, tuple[str, str, str]] = {
    # name: (the target that prices it, why, how it is priced)
    **{name: ("megatron", f"{label} trains with Megatron-core",
              "priced as the megatron target (whose launch files are Megatron-LM's)")
       for name, label in (("nemo", "NeMo"), ("megatron-bridge", "Megatron-Bridge"),
                           ("megatron-core", "Megatron-core"), ("mcore", "Megatron-core"))},
    # costmodel.frameworks: the megatron-deepspeed profile is "Megatron-DeepSpeed / GPT-NeoX" (Megatron's tensor
    # parallelism inside DeepSpeed's pipeline engine)
    "gpt-neox": ("megatron-deepspeed", "GPT-NeoX trains with Megatron's tensor parallelism inside DeepSpeed's pipeline "
                 "engine", "priced as the megatron-deepspeed target"),
    "maxtext": (GENERIC, "MaxText (JAX/XLA) is none of the targets",
                "priced with the generic profile (every overlap on, Megatron-grade kernels; nothing XLA-specific), "
                "by default with ZeRO-3 sharded within a host and data parallel across hosts, as its default mesh "
                "runs on GPUs (--zero and --dp-shard say otherwise)"),
}


@dataclasses.dataclass(frozen=True)
class FsdpTrainer:
    """A PyTorch trainer that is none of the targets (FSDP's, and nanotron's data parallel), as ``planner
    estimate --target NAME`` prices it: the rule the validation prices the published runs of such trainers
    with (``costmodel.frameworks.as_pytorch_fsdp``: fms-fsdp's, OLMo-core's and SmolLM3's nanotron runs,
    ``planner validate --cross`` families ``ibm-fsdp``, ``olmo-core`` and ``smollm``), with what its own
    defaults set."""
    label: str
    fsdp2: bool             # per-parameter FSDP (``fully_shard``), not FSDP1's flat parameters
    attention: str          # the kernel its default model code calls (costmodel.attention); "" generic's SDPA
    fp8_recipe: str         # what ``--dtype fp8`` runs unless ``--fp8-recipe`` says; "" generic's default
    source: str             # where the settings come from
    zero: int = 3           # the ZeRO stage it runs unless ``--zero`` says (FSDP's full shard: 3)
    kind: str = "a PyTorch FSDP trainer"


FSDP_TRAINERS: dict[str, FsdpTrainer] = {
    "fms-fsdp": FsdpTrainer("fms-fsdp", False, "flash-attn", "",
                            "FSDP1 and SDPA's FlashAttention-2: the ibm-fsdp records' execution (PyTorch blog "
                            "'Maximizing training throughput using PyTorch FSDP', 2024)"),
    "olmo-core": FsdpTrainer("OLMo-core", True, "", "tensorwise",
                             "FSDP2 fully_shard and torchao Float8Linear with dynamic scaling: the olmo-core "
                             "records' execution (allenai/OLMo-core README); attention: its automatic backend"),
    "composer": FsdpTrainer("Composer", False, "", "delayed",
                            "FSDP1 (its fsdp_config); precision amp_fp8 runs Transformer Engine's DelayedScaling "
                            "(mosaicml/composer composer/core/precision.py); attention: the user's model code"),
    "llm-foundry": FsdpTrainer("llm-foundry", False, "flash-attn", "delayed",
                               "Composer's FSDP1 and amp_fp8 (Transformer Engine DelayedScaling); attention "
                               "attn_impl 'flash' (llmfoundry/models/utils/config_defaults.py)"),
    # nanotron: data parallel with its own tensor and pipeline parallelism, no FSDP; priced as the smollm
    # family's record prices SmolLM3's run (calibration/published_runs_more.yaml: profile pytorch_native,
    # launch eager, attention flash-attn on the generic profile)
    "nanotron": FsdpTrainer("nanotron", False, "flash-attn", "",
                            "nanotron's model code (src/nanotron/models/llama.py: flash_attn's FlashAttention-2, "
                            "linears as torch modules, no Transformer Engine outside src/nanotron/fp8/); "
                            "optimizer.zero_stage 0 by default (DDP)", zero=0,
                            kind="a PyTorch trainer (data parallel with its own tensor and pipeline parallelism)"),
}
STAND_INS.update({
    name: (GENERIC, f"{t.label} is {t.kind}, none of the targets",
           f"priced as the validation prices published PyTorch {'FSDP ' if t.zero == 3 else ''}runs "
           f"(PyTorch-native kernels, host-issued eager ops"
           f"{(', FSDP2' if t.fsdp2 else ', FSDP1') if t.zero == 3 else ''}"
           f"{', FlashAttention-2' if t.attention == 'flash-attn' else ''}; "
           f"ZeRO-{t.zero} unless --zero says; compiled only with --framework-setting compile=true)")
    for name, t in FSDP_TRAINERS.items()})

# Other spellings of a target's or stand-in's name (``canonical``), after case folding and with ``_`` and
# spaces read as ``-``: Megatron-LM is what the megatron target's launch files run.
ALIASES: dict[str, str] = {
    "megatron-lm": "megatron", "megatronlm": "megatron", "megatron-ds": "megatron-deepspeed",
    "hf-accelerate": "accelerate", "torch-titan": "torchtitan",
    "trt-llm": "tensorrt-llm", "trtllm": "tensorrt-llm", "tensorrt": "tensorrt-llm",
}


def canonical(name: str) -> str:
    """The name ``--target`` means: a known target, launcher or stand-in however it is typed ("Megatron-LM",
    "NeMo", "llm_foundry", "TensorRT-LLM": ``costmodel.catalog.name_key``, then ``ALIASES``); any other name
    unchanged, so that the command refuses it with what was typed. The ``type`` of every command's
    ``--target``."""
    from costmodel.catalog import name_key
    key = name_key(name)
    key = ALIASES.get(key, key)
    known = {*TRAIN, *SERVE, *STAND_INS, GENERIC, "all"}
    return key if key in known else name


# What ``--framework-setting`` may set for a PyTorch FSDP trainer stood in for (``switches_for``)
FSDP_SWITCHES: dict[str, tuple[type, str]] = {
    "compile": (bool, "torch.compile of the model, priced as the validation prices a published compiled run "
                      "(FrameworkProfile.with_switches: COMPILE_KERNEL_FACTOR)"),
}


def _priced_as(name: str | None) -> str:
    """The target a name is priced as: a stand-in's (``STAND_INS``), else the name itself."""
    return STAND_INS[name][0] if name in STAND_INS else (name or GENERIC)


def default_zero(target: str | None, par: Mapping[str, Any]) -> int:
    """The ZeRO stage a configuration runs at under ``target`` when nobody names one (``planner estimate``
    without ``--zero``, a published record without ``zero``), from the other degrees in ``par``:

    * torchtitan: FSDP2, which reshards after forward (ZeRO-3) unless pipeline parallelism is on, then
      not (ZeRO-2): ``fsdp_reshard_after_forward`` "default" (torchtitan/distributed/fsdp.py at b5bcd76c:
      ``return not pp_enabled``);
    * the built-in runtime and the launchers that start it: FSDP2 alike (runtime/parallel.py), with
      torchtitan's rule under pipelining;
    * Accelerate: FSDP2 with resharding (ZeRO-3) where its config runs FSDP, the Megatron-LM engine's
      distributed optimizer (ZeRO-1) where tensor or pipeline parallelism hands it to that engine
      (``costmodel.frameworks.accelerate_backend``);
    * a PyTorch trainer stood in for (``FSDP_TRAINERS``): its own default (full sharding, ZeRO-3, for the FSDP
      trainers; nanotron's ZeRO-0);
    * MaxText: full sharding (ZeRO-3) within a slice, whatever the other degrees; ``default_dp_shard``
      says over which ranks. Its ``configs/base.yml`` sets ``ici_fsdp_parallelism: -1`` (every device of a
      slice not taken by another axis shards the weights) and ``dcn_data_parallelism: -1`` (plain data
      parallelism across slices);
    * every other target (Megatron's distributed optimizer, DeepSpeed, generic): ZeRO-1."""
    pp, tp = int(par.get("pp", 1) or 1), int(par.get("tp", 1) or 1)
    if target in FSDP_TRAINERS:
        return FSDP_TRAINERS[target].zero
    if target == "maxtext":
        return 3
    name = _priced_as(target)
    if name == "accelerate":
        return 3 if tp == 1 and pp == 1 else 1
    if name == "torchtitan" or name == "builtin" or name in LAUNCHERS:
        return 3 if pp == 1 else 2
    return 1


def default_dp_shard(target: str | None, par: Mapping[str, Any], gpus_per_node: int) -> int | None:
    """The ZeRO-3 shard group a configuration runs with under ``target`` when nobody names one (``planner
    estimate`` without ``--dp-shard``); None: the whole data-parallel group (the estimate's own default).

    MaxText alone differs: its mesh shards within a slice and runs data parallel across slices
    (``default_zero``), and on GPUs a slice is a host. Its own A3 (H100) scripts run ``dcn_data_parallelism``
    = the number of VMs with ``ici_fsdp_parallelism=8`` (``MaxText/configs/a3/llama_2_7b/16vm.sh``: 16 VMs,
    ``dcn_data_parallelism=16 ici_fsdp_parallelism=8``), which MaxText accepts only where the slices counted
    from the devices (``max_utils.create_device_mesh``: ``1 + max(d.slice_index)``) are the hosts. So the
    shard group is a host's GPUs over its other ICI axes (tensor, context; pipeline stages are taken to
    span hosts, as MaxText's ``dcn_pipeline_parallelism`` runs them), where the job spans more than one
    host and that divides the data-parallel group. Whether a multi-node NVLink domain (GB200 NVL72)
    counts as one slice is not established here; a host is assumed, and ``--dp-shard`` says otherwise."""
    if target != "maxtext" or gpus_per_node < 1:
        return None
    dp = int(par.get("dp", 1) or 1)
    ici_other = int(par.get("tp", 1) or 1) * int(par.get("cp", 1) or 1)
    shard = max(1, gpus_per_node // ici_other)
    return shard if shard < dp and dp % shard == 0 else None


def runs_sp(target: str | None) -> bool:
    """Whether ``target`` (or the target a stand-in is priced as) can run sequence parallelism: not where
    its table says ``sp="never"`` (DeepSpeed's, Megatron-DeepSpeed's); generic and unknown names can."""
    table = TRAIN.get(_priced_as(target))
    return table is None or table.sp != "never"


def switches_for(name: str) -> dict[str, tuple[type, str]]:
    """The framework settings ``--framework-setting`` takes for ``name``: a target's (``SWITCHES``), a
    PyTorch FSDP trainer's (``FSDP_SWITCHES``), none for generic or another name."""
    if name in FSDP_TRAINERS:
        return FSDP_SWITCHES
    return SWITCHES.get(framework_of(name), {}) if name != GENERIC else {}


def stand_in_note(name: str) -> str:
    """What ``planner estimate --target name`` priced a stand-in with ("" for a target or unknown name)."""
    if name not in STAND_INS:
        return ""
    _target, why, how = STAND_INS[name]
    return f"{why}: {how}"


def stand_in_profile(name: str):
    """The framework profile ``planner estimate --target name`` prices a PyTorch FSDP trainer with
    (``FSDP_TRAINERS``); None for any other name."""
    trainer = FSDP_TRAINERS.get(name)
    if trainer is None:
        return None
    from costmodel.frameworks import FRAMEWORKS, as_pytorch_fsdp
    prof = as_pytorch_fsdp(FRAMEWORKS[GENERIC], trainer.fsdp2)
    return dataclasses.replace(prof, attention=trainer.attention) if trainer.attention else prof


def stand_in_hint(name: str, allowed: tuple[str, ...] = ()) -> str:
    """What to use instead of ``name`` where it is not a target ("" when nothing is known of it);
    ``allowed``: the names the asking command takes, where its stand-in may not be one (``emit``
    writes no files for ``generic``)."""
    if name in FSDP_TRAINERS:
        # generic would not price it as it runs (generic's kernels are Megatron's): estimate does
        return (f"; {STAND_INS[name][1]}: `planner estimate --target {name}` prices a configuration as it "
                f"runs; to plan and write launch files, use --target torchtitan or accelerate (PyTorch FSDP2)")
    if name in STAND_INS:
        target, why, _how = STAND_INS[name]
        if allowed and target not in allowed:
            return f"; {why}, and no target writes its launch files"
        return f"; {why}: use --target {target}"
    return ""


def planning_targets(mode: str) -> tuple[str, ...]:
    """The targets ``--target all`` solves for: frameworks, not the wrappers that start one."""
    return TRAIN_TARGETS if mode == "train" else SERVE_TARGETS


def get(name: str, mode: str = "train") -> TrainTarget | ServeTarget:
    """The table of target ``name`` for plans of ``mode``; ``KeyError`` for an unknown one."""
    return record(name, mode).table


def check_name(name: str, mode: str) -> None:
    """``ValueError`` naming the known targets when ``name`` is none of them."""
    if name != GENERIC and name not in (TRAIN if mode == "train" else SERVE):
        raise ValueError(f"unknown {mode} target {name!r}; targets: {', '.join(names(mode))}")


def framework_of(name: str) -> str:
    """The cost model's framework profile for a training target (``costmodel.frameworks``)."""
    if not name or name == GENERIC:
        return GENERIC
    try:
        return record(name, "train").profile
    except KeyError:
        return GENERIC


def titan_fp8_recipe(cluster, workload: Workload):
    """The torchao recipe a torchtitan Float8 workload is priced with (``costmodel.stage_terms.fp8_recipe_of``
    with the torchtitan profile): what its emitter must write."""
    from costmodel.stage_terms import fp8_recipe_of
    return fp8_recipe_of(cluster, workload, "torchtitan")


def elementwise_recompute_refused(wl: Workload) -> bool:
    """Whether Megatron-Core refuses ``moe_act`` and ``layernorm`` recompute for this workload: under FP8's
    delayed scaling (``TransformerConfig.__post_init__`` at NVIDIA/Megatron-LM d98e8a64), which is also what a
    plan naming no recipe runs (the Megatron file then writes no ``--fp8-recipe``: Megatron's default)."""
    return wl.dtype == "fp8" and wl.fp8_recipe in ("", "delayed")


def selective_modules(target: str | None, model: ModelSpec, wl: Workload) -> tuple[str, ...]:
    """The Megatron-Core modules a plan's selective recompute runs when the user names none
    (``ParallelConfig.recompute_modules``, written as ``--recompute-modules``); () where the target
    has no such choice (its own selective recompute: torchtitan's op-level SAC) or keeps Megatron's
    default, core_attn (a dense model).

    For a mixture of experts, the output-discarding modules NVIDIA's MoE recipes run (Megatron-LM
    examples/moe_recipes, the Megatron-Core MoE report's Qwen3 and DeepSeek-V3 layouts): moe_act
    and layernorm, and mla_up_proj with multi-latent attention. They drop the routed experts' FC2
    input, the separate norms' outputs and MLA's Q, K and V for a re-run of elementwise kernels (and
    the up-projections): a little time for much memory. core_attn is left out: with a fused
    attention kernel it drops only the softmax statistics for a whole attention forward
    (``costmodel.layers.core_attn_recompute``). Under delayed FP8 scaling Megatron-Core refuses moe_act
    and layernorm (``elementwise_recompute_refused``), so they are left out there. The search
    offers this one set under "selective" (with none and full beside it), not every subset."""
    if target is None or target not in TRAIN or TRAIN[target].runs != "megatron" or not model.is_moe:
        return ()
    mods = [] if elementwise_recompute_refused(wl) else ["moe_act", "layernorm"]
    if model.attention == "mla":
        mods.append("mla_up_proj")
    return recompute_module_set(mods)


def recompute_module_problem(model: ModelSpec, wl: Workload, par: ParallelConfig) -> str | None:
    """Why Megatron-Core refuses ``par.recompute_modules`` for this model and workload
    (``TransformerConfig.__post_init__`` at NVIDIA/Megatron-LM d98e8a64), with what to plan; None if it
    takes them."""
    mods = par.recompute_modules if par.recompute == "selective" else ()
    listed = ",".join(mods)
    keep = ",".join(m for m in mods if m not in ("moe_act", "moe", "shared_experts", "mla_up_proj")) or "core_attn"
    moe_only = [m for m in mods if m in ("moe_act", "moe", "shared_experts")]
    if moe_only and not model.is_moe:
        return (f"recompute_modules {listed}: {', '.join(moe_only)} recompute parts of MoE layers and {model.name} has "
                f"none; plan --recompute-modules {keep}")
    if "shared_experts" in mods and not model.shared_experts:
        return (f"recompute_modules {listed}: {model.name} has no shared experts; leave shared_experts out")
    if "mla_up_proj" in mods and model.attention != "mla":
        return (f"recompute_modules {listed}: mla_up_proj recomputes multi-latent attention's up-projections and "
                f"{model.name} has {model.attention} attention; leave mla_up_proj out")
    if elementwise_recompute_refused(wl) and {"moe_act", "layernorm"} & set(mods):
        return (f"recompute_modules {listed} with FP8 delayed scaling: Megatron-Core refuses "
                "moe_act and layernorm recompute under delayed scaling; plan --fp8-recipe current (or mxfp8 on "
                "Blackwell), or leave moe_act and layernorm out")
    return None


def default_fp8_recipe(target: str | None, gpu) -> str:
    """The FP8 recipe a plan for ``target`` records when the user names none: what the target's
    emitter writes (torchtitan: ``TITAN_FP8_WRITTEN``), else the cost model's default for the
    target's framework (``costmodel.fp8.default_recipe``); a PyTorch FSDP trainer's (``FSDP_TRAINERS``)
    where it has one."""
    from costmodel.fp8 import default_recipe
    if target in FSDP_TRAINERS and FSDP_TRAINERS[target].fp8_recipe:
        return FSDP_TRAINERS[target].fp8_recipe         # a stand-in's own FP8 (FsdpTrainer)
    fw = framework_of(target or GENERIC) if target in TRAIN or not target else GENERIC
    return TITAN_FP8_WRITTEN if fw == "torchtitan" else default_recipe(fw, gpu)


# --------------------------------------------------------------------------------------
# Framework settings a plan carries (the plan file's ``framework:`` section)
# --------------------------------------------------------------------------------------

# Megatron-LM's examples/moe_recipes (9c5258f109) pair the fused grouped MLP with GLU rows interleaved in
# blocks of 32 (moe_mlp_glu_interleave_size), the layout TE's CuTe DSL kernel reads (NVIDIA-NeMo/RL PR #4194:
# "32 for the CuTeDSL fusion"); the experts' FC1 weights are stored so, gate and up alternating.
FUSED_MLP_INTERLEAVE = 32


# target -> setting -> (type, what it is and its source). Each is priced (``profile_for``) and
# written by the target's emitter; a plan without the section runs every one at its default.
SWITCHES: dict[str, dict[str, tuple[type, str]]] = {
    "torchtitan": {
        "compile": (bool, "torch.compile of the model and loss: CompileConfig.enable, components model, loss "
                          "(torchtitan/config/configs.py)"),
        "async_tp": (bool, "async tensor parallel: CompileConfig.enable_async_tensor_parallel; needs compile "
                           "(torchtitan/config/configs.py CompileConfig.__post_init__) and tp > 1"),
        "mxfp8_experts": (bool, "the routed experts' grouped GEMMs in torchao's dynamic MXFP8, every other layer in "
                                "BF16: the MXFP8GroupedExpertsConverter (torchtitan/components/quantization/mx.py, "
                                "recipe mxfp8_rceil); a BF16 mixture of experts on Blackwell (SM100+)"),
    },
    "megatron": {
        "grads_bf16": (bool, "gradients accumulated and reduced in BF16: --grad-reduce-in-bf16 (Megatron-LM "
                             "megatron/training/arguments.py; NeMo's optim.grad_sync_dtype: bf16); BF16 or FP8 "
                             "training"),
        "adam_moments_bf16": (bool, "Adam's two moments kept in BF16: --use-precision-aware-optimizer --exp-avg-dtype "
                                    "bf16 --exp-avg-sq-dtype bf16 (Megatron-LM megatron/training/arguments.py; NeMo "
                                    "24.07's optim.dtype: bf16); the distributed optimizer, BF16 or FP8 delayed "
                                    "training"),
        "fused_grouped_mlp": (bool, "the routed experts as Transformer Engine's fused grouped MLP (SwiGLU and MXFP8 "
                                    "casts in the grouped GEMMs' epilogues): --use-transformer-engine-op-fuser "
                                    f"--moe-mlp-glu-interleave-size {FUSED_MLP_INTERLEAVE} and "
                                    "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (Megatron-Core core_v0.19.0 TransformerConfig, "
                                    "moe/experts.py GroupedMLP._is_fused_impl_supported; TE 2.14 or later with cuDNN "
                                    "frontend's CuTe DSL kernels); a SwiGLU MoE in MXFP8 on Blackwell, expert TP 1"),
    },
    "deepspeed": {
        "partition_method": (str, "PipelineModule(partition_method=...): " + ", ".join(DS_METHODS)
                             + " (deepspeed/runtime/pipe/module.py)"),
    },
    "megatron-deepspeed": {
        "partition_method": (str, f"{MDS_METHOD} only: GPTModelPipe writes it in the model code "
                             "(megatron/model/gpt_model.py)"),
    },
}


def fused_mlp_problem(target: str, model: ModelSpec, wl: Workload, gpu, par: ParallelConfig | None = None) -> str:
    """Why ``framework.fused_grouped_mlp`` cannot run this problem ("" where it can), as the condition and
    the rule: Megatron-Core's GroupedMLP takes Transformer Engine's fused path (``moe/experts.py``,
    ``_is_fused_impl_supported``) for routed SwiGLU experts whole on each rank (expert TP 1), and TE's CuTe
    DSL kernel is MXFP8 on SM100+ (``costmodel.moe.fused_mlp_elementwise``); elsewhere Megatron asserts or
    runs unfused ops."""
    from costmodel.fp8 import is_blackwell
    if not model.is_moe or model.mlp != "swiglu":
        return (f"{model.name} has no routed SwiGLU experts{'' if model.is_moe else ' (a dense model)'}; "
                "drop the setting")
    recipe = (wl.fp8_recipe or default_fp8_recipe(target, gpu)) if wl.dtype == "fp8" else ""
    if recipe != "mxfp8" or not is_blackwell(gpu):
        return (f"dtype {wl.dtype}{f' ({recipe})' if recipe else ''} on {gpu.name}: Transformer Engine's fused "
                "grouped MLP is MXFP8 on Blackwell (--dtype fp8 --fp8-recipe mxfp8 on B200, B300, GB200 or GB300); "
                "drop the setting")
    et = (par.etp or par.tp) if par is not None else 1
    if et != 1:
        return f"expert TP {et}: Megatron's fused grouped MLP needs whole experts on each rank (plan --etp 1)"
    if par is not None and par.offload_modules:
        # moe/experts.py ~399: the fused path is not taken while expert_fc1 or moe_act is offloaded
        return (f"offload_modules {','.join(par.offload_modules)}: Megatron-Core runs the experts unfused when it "
                "offloads their inputs; drop the setting or leave offload_modules out")
    return ""


def mxfp8_experts_problem(model: ModelSpec, wl: Workload, gpu) -> str:
    """Why torchtitan's ``framework.mxfp8_experts`` cannot run this problem ("" where it can): the converter
    quantizes the routed experts of a BF16 model (``components/quantization/mx.py``
    ``MXFP8GroupedExpertsConverter``: it swaps ``GroupedExperts``) and refuses below SM100."""
    from costmodel.fp8 import is_blackwell
    if not model.is_moe:
        return f"{model.name} is a dense model: the converter quantizes routed experts only; drop the setting"
    if wl.dtype not in ("bf16", "bfloat16"):
        return (f"dtype {wl.dtype}: the experts' MXFP8 runs in a BF16 model (every other layer stays BF16); "
                "plan --dtype bf16")
    if not is_blackwell(gpu):
        return (f"{gpu.name}: MXFP8 needs Blackwell tensor cores (the converter refuses below SM100); drop the "
                "setting or plan B200, B300, GB200 or GB300")
    return ""


def setting_problem(setting: str, target: str, model: ModelSpec, wl: Workload, gpu,
                    par: ParallelConfig | None = None) -> str:
    """Why a framework setting that only some problems run cannot run this one ("" where it can, or where the
    setting has no such rule): Megatron's ``fused_grouped_mlp`` (``fused_mlp_problem``), torchtitan's
    ``mxfp8_experts`` (``mxfp8_experts_problem``). The one place the plan reader, the command line and
    ``planner plan``'s hints ask."""
    if setting == "fused_grouped_mlp":
        return fused_mlp_problem(target, model, wl, gpu, par)
    if setting == "mxfp8_experts":
        return mxfp8_experts_problem(model, wl, gpu)
    return ""


def switch_problems(target: str, par: ParallelConfig, switches: Mapping[str, Any], model: ModelSpec | None = None,
                    wl: Workload | None = None, gpu=None) -> list[str]:
    """What is wrong with a plan's framework settings for ``target``: unknown keys, wrong types,
    settings that need another (async TP needs compile and tp > 1), and, given the problem
    (``model``, ``wl``, ``gpu``), settings it cannot run (``setting_problem``)."""
    known = SWITCHES.get(TRAIN[target].runs if target in TRAIN else target, {})
    out = []
    for k, v in switches.items():
        if k not in known:
            out.append(f"framework.{k}: {target} has no such setting"
                       + (f" (it has {', '.join(sorted(known))})" if known else " (it takes none)"))
        elif not isinstance(v, known[k][0]) or (known[k][0] is int and isinstance(v, bool)):
            out.append(f"framework.{k}: {v!r} is not a {known[k][0].__name__}")
    if switches.get("async_tp") and not (switches.get("compile") and par.tp > 1):
        out.append(f"framework.async_tp with compile={bool(switches.get('compile'))}, tp={par.tp}: torchtitan's async "
                   "TP needs torch.compile and tp > 1; set compile: true or drop async_tp")
    if model is not None and wl is not None and gpu is not None:
        for k, v in switches.items():
            why = setting_problem(k, target, model, wl, gpu, par) if v is True and k in known else ""
            if why:
                out.append(f"framework.{k}: {why}")
    return [f"{target}: {m}" for m in out]


def profile_for(target: str, switches: Mapping[str, Any] | None = None):
    """The cost profile (``costmodel.frameworks``) a plan for ``target`` with these framework
    settings is priced with: the target's own (a PyTorch FSDP trainer's: ``stand_in_profile``), with each
    setting's term applied."""
    from costmodel.frameworks import framework_profile
    prof = stand_in_profile(target) or framework_profile(framework_of(target))
    sw = switches or {}
    if (sw.get("compile") or sw.get("async_tp") or sw.get("grads_bf16") or sw.get("adam_moments_bf16")
            or sw.get("fused_grouped_mlp") or sw.get("mxfp8_experts")):
        prof = prof.with_switches(compile=bool(sw.get("compile")), async_tp=bool(sw.get("async_tp")),
                                  grads_bf16=bool(sw.get("grads_bf16")),
                                  adam_moments_bf16=bool(sw.get("adam_moments_bf16")),
                                  fused_grouped_mlp=bool(sw.get("fused_grouped_mlp")),
                                  mxfp8_experts=bool(sw.get("mxfp8_experts")))
    return prof


# --------------------------------------------------------------------------------------
# What a target cannot run
# --------------------------------------------------------------------------------------

def _eff_order(par: ParallelConfig, order: Sequence[str]) -> tuple[str, ...]:
    return tuple(d for d in order if getattr(par, d) > 1)


def _zero_sets(t: TrainTarget, par: ParallelConfig) -> frozenset[int]:
    return t.zero_pp if par.pp > 1 else t.zero


@dataclass(frozen=True)
class Ask:
    """One configuration asked of one target: what every capability rule reads."""
    t: TrainTarget               # the table that applies (an Accelerate variant, say)
    name: str                    # the target's name as users type it
    model: ModelSpec
    wl: Workload
    par: ParallelConfig
    order: tuple[str, ...]
    plan_check: bool


@dataclass(frozen=True)
class Cap:
    """A capability rule: the table field it reads (whose source is ``sources[field]``), when a
    configuration breaks it, and the message naming the numbers and what to plan instead."""
    field: str
    broken: Callable[[Ask], bool]
    message: Callable[[Ask], str]


def _zero_allowed(a: Ask) -> frozenset[int]:
    allowed = _zero_sets(a.t, a.par)
    return allowed | {1} if a.plan_check and a.t.zero1_as_zero0 else allowed


def _zero_message(a: Ask) -> str:
    p, allowed = a.par, _zero_allowed(a)
    with_pp = f" with pp={p.pp}" if p.pp > 1 else ""
    if not allowed:
        return f"pp={p.pp} with data parallelism: {a.name} has no pipeline stages here; plan --pp 1"
    return (f"ZeRO-{p.zero}{with_pp}: {a.name} runs ZeRO {_stages(allowed)}{with_pp}; plan --zero "
            f"{_nearest(p.zero, allowed)}" + ("" if p.pp == 1 or not a.t.zero - a.t.zero_pp else " (or --pp 1)"))


def _order_broken(a: Ask) -> bool:
    if a.t.orders is None:
        return False
    eff = _eff_order(a.par, a.order)
    return not any(tuple(d for d in o if d in eff) == eff for o in a.t.orders)


def _pp(a: Ask) -> bool:
    return a.par.pp > 1


def _m(a: Ask) -> int:
    return a.par.grad_accum


# The capability rules in the order their messages are listed. Each reads one field of the
# table; ``config_problems`` runs them all, then the target's ``extra`` rules.
CAPS: tuple[Cap, ...] = (
    # the model
    Cap("models", lambda a: a.model.attention == "mla" and not a.t.mla,
        lambda a: f"{a.model.name} uses multi-latent attention, which {a.name} does not run; use the megatron target"),
    Cap("models", lambda a: a.model.positions == "alibi" and not a.t.alibi,
        lambda a: f"{a.model.name} uses ALiBi positions, which {a.name} does not run"),
    Cap("models", lambda a: a.model.is_moe and not a.t.moe,
        lambda a: f"{a.model.name} is a mixture of experts ({a.model.num_experts} experts), which the {a.name} "
                  "target does not write; use the megatron target"),
    Cap("dtypes", lambda a: a.wl.dtype not in a.t.dtypes,
        lambda a: f"dtype {a.wl.dtype}: {a.name} trains in {', '.join(sorted(a.t.dtypes))}; "
                  + ("NVFP4 training is priced as Transformer Engine's recipe, which Megatron-LM runs (--fp4-format "
                     f"e2m1); plan --target megatron, or --dtype {'fp8' if 'fp8' in a.t.dtypes else 'bf16'}"
                     if a.wl.dtype == "nvfp4" else "plan --dtype bf16")),
    Cap("kv_heads_divisible", lambda a: a.t.kv_heads_divisible and not kv_heads_shard(a.model, a.par.tp),
        lambda a: f"tp={a.par.tp} does not divide the {a.model.kv_heads} KV heads ({a.name} shards K/V heads, it "
                  f"does not replicate them); plan --tp {_largest_divisor(a.model.kv_heads, a.par.tp)} or fewer"),
    # data parallel sharding
    Cap("zero", lambda a: a.par.dp * a.par.cp > 1 and a.par.zero not in _zero_allowed(a), _zero_message),
    Cap("hsdp", lambda a: a.par.dp * a.par.cp > 1 and a.par.hsdp and a.par.zero not in a.t.hsdp,
        lambda a: f"ZeRO-{a.par.zero} over groups of {a.par.dp_shard} of dp={a.par.dp} (HSDP): {a.name} shards "
                  + (f"part of dp only with ZeRO {_stages(a.t.hsdp)}" if a.t.hsdp else "over the whole dp group")
                  + f"; plan --dp-shard {a.par.dp}"),
    # context and expert parallel
    Cap("cp", lambda a: a.par.cp > 1 and not a.t.cp,
        lambda a: f"cp={a.par.cp}: {a.name} has no context parallelism; plan --cp 1"),
    Cap("cp", lambda a: a.par.cp > 1 and a.t.cp and a.wl.seq_len % a.t.cp_seq(a.par) != 0,
        lambda a: f"cp={a.par.cp} with seq_len {a.wl.seq_len}: {a.name} needs seq_len to be a multiple of "
                  f"{a.t.cp_seq_text} = {a.t.cp_seq(a.par)}; plan another --cp or --seq-len"),
    Cap("ep", lambda a: a.par.ep > 1 and not a.t.ep,
        lambda a: f"ep={a.par.ep}: the {a.name} target has no expert parallelism; plan --ep 1"),
    Cap("expert_tp", lambda a: (a.par.ep > 1 and a.t.ep and a.par.tp > 1 and not a.t.expert_tp
                                and not (a.par.folded and a.t.expert_fold)),
        lambda a: f"ep={a.par.ep} with tp={a.par.tp}: {a.name}'s expert parallel takes no tensor parallel experts "
                  "(expert TP must be 1)" + ("; plan --etp 1 (whole experts over the TP ranks too)"
                                             if a.t.expert_fold else "; plan --tp 1 or --ep 1")),
    Cap("expert_fold", lambda a: a.par.folded and a.model.is_moe and not a.t.expert_fold,
        lambda a: f"etp={a.par.etp} with tp={a.par.tp}: {a.name} runs routed experts with the attention's tensor "
                  f"parallel (no expert parallel folding); plan --etp {a.par.tp} (or leave it out)"),
    # selective recompute by module: Megatron-Core's --recompute-modules (costmodel.layers LayerCost.modules)
    Cap("recompute", lambda a: a.par.recompute == "selective" and bool(a.par.recompute_modules)
        and a.t.runs != "megatron",
        lambda a: f"recompute_modules {','.join(a.par.recompute_modules)}: {a.name}'s selective recompute is its own "
                  "(Megatron-Core's --recompute-modules is the Megatron target's); leave recompute_modules out"),
    Cap("recompute", lambda a: a.t.runs == "megatron" and recompute_module_problem(a.model, a.wl, a.par) is not None,
        lambda a: recompute_module_problem(a.model, a.wl, a.par) or ""),
    # fine-grained activation offloading: Megatron-Core's --offload-modules (costmodel.stage_terms.offload_terms)
    Cap("recompute", lambda a: bool(a.par.offload_modules) and a.t.runs != "megatron",
        lambda a: f"offload_modules {','.join(a.par.offload_modules)}: {a.name} has no fine-grained activation "
                  "offloading (Megatron-Core's --offload-modules is the Megatron target's); leave offload_modules out"),
    Cap("recompute", lambda a: bool(a.par.offload_modules) and a.par.recompute == "selective"
        and "moe" in a.par.recompute_modules,
        lambda a: f"offload_modules {','.join(a.par.offload_modules)} with recompute_modules moe: Megatron-Core "
                  "refuses offloading the experts' tensors of an MoE layer it recomputes whole; leave moe out of "
                  "--recompute-modules or leave offload_modules out"),
    # how MoE layers run (costmodel.moe; Megatron-Core's TransformerConfig checks for the EP overlap)
    Cap("moe_dispatchers", lambda a: bool(a.par.moe_dispatcher) and not a.model.is_moe,
        lambda a: f"moe_dispatcher {a.par.moe_dispatcher}: {a.model.name} has no experts; leave it out"),
    Cap("moe_dispatchers", lambda a: bool(a.par.moe_dispatcher) and a.par.moe_dispatcher not in a.t.moe_dispatchers,
        lambda a: f"moe_dispatcher {a.par.moe_dispatcher}: {a.name} writes the "
                  f"{' or '.join(a.t.moe_dispatchers)} dispatcher; plan moe_dispatcher {a.t.moe_dispatchers[0]}"),
    Cap("ep_overlap", lambda a: a.par.ep_overlap and not a.t.ep_overlap,
        lambda a: f"ep_overlap: {a.name} does not overlap the expert-parallel all-to-alls with compute; leave it out"),
    Cap("ep_overlap", lambda a: a.par.ep_overlap and a.t.ep_overlap and (not a.model.is_moe or a.par.ep <= 1),
        lambda a: f"ep_overlap with ep={a.par.ep}: the overlap hides expert-parallel all-to-alls, and "
                  f"{'this plan has none' if a.model.is_moe else a.model.name + ' has no experts'}; plan --ep 2 or "
                  "more, or leave ep_overlap out"),
    Cap("ep_overlap", lambda a: a.par.ep_overlap and a.t.ep_overlap and a.par.recompute == "full",
        lambda a: f"ep_overlap with recompute=full: {a.name} refuses full recomputation with the EP overlap; "
                  "plan --recompute selective or none"),
    Cap("ep_overlap", lambda a: a.par.ep_overlap and a.t.ep_overlap and a.par.pp > 1 and a.par.vpp == 1,
        lambda a: f"ep_overlap with pp={a.par.pp} and vpp=1: {a.name} needs virtual pipeline stages for the EP "
                  "overlap when pp > 1; plan --vpp 2 or more"),
    Cap("ep_overlap", lambda a: a.par.ep_overlap and a.t.ep_overlap and a.wl.dtype == "fp32",
        lambda a: f"ep_overlap with dtype fp32: {a.name} runs the EP overlap in bf16 or fp16 models only; "
                  "plan --dtype bf16"),
    Cap("ep_overlap", lambda a: a.par.ep_overlap and a.t.ep_overlap and (a.model.mtp_layers > 1
                                                                          or a.model.mtp_layers == 1 and a.par.pp == 1),
        lambda a: f"ep_overlap with {a.model.mtp_layers} MTP layers and pp={a.par.pp}: {a.name} takes at most one "
                  "MTP layer with the EP overlap, and then pp > 1; plan --pp 2 or more, or leave ep_overlap out"),
    # tensor and sequence parallel
    Cap("tp_with_pp", lambda a: a.par.tp > 1 and a.par.pp > 1 and not a.t.tp_with_pp,
        lambda a: f"tp={a.par.tp} with pp={a.par.pp}: {a.name} does not combine its tensor parallel with pipeline "
                  "stages; plan --tp 1 or --pp 1"),
    Cap("sp", lambda a: a.par.tp > 1 and a.t.sp == "with_tp" and not a.par.sp,
        lambda a: f"tp={a.par.tp} without sequence parallel: {a.name} always applies it with TP; plan --sp"),
    Cap("sp", lambda a: a.par.tp > 1 and a.t.sp == "never" and a.par.sp,
        lambda a: f"sequence parallel with tp={a.par.tp}: {a.name} has no Megatron-style sequence parallel; "
                  "plan --no-sp"),
    # pipeline
    Cap("schedules", lambda a: _pp(a) and a.par.schedule not in a.t.schedules,
        lambda a: f"the {a.par.schedule} schedule: {a.name} runs {', '.join(sorted(a.t.schedules))}; plan --schedule "
                  f"{'interleaved' if a.par.vpp > 1 and 'interleaved' in a.t.schedules else '1f1b'}"),
    Cap("vpp", lambda a: _pp(a) and a.par.vpp > 1 and not a.t.vpp,
        lambda a: f"vpp={a.par.vpp}: {a.name} has no virtual pipeline stages; plan --vpp 1"),
    Cap("vpp_split", lambda a: _pp(a) and a.par.vpp > 1 and a.t.vpp and a.t.vpp_split == "even"
        and a.model.layers % (a.par.pp * a.par.vpp) != 0,
        lambda a: f"vpp={a.par.vpp}: {a.name} cuts {a.model.layers} layers into pp*vpp = {a.par.pp * a.par.vpp} "
                  "equal virtual stages; plan a --vpp or --pp that divides the layers"),
    Cap("split", lambda a: _pp(a) and a.t.split == "even" and a.model.layers % a.par.pp != 0,
        lambda a: f"pp={a.par.pp}: {a.name} splits the {a.model.layers} layers evenly; plan a --pp that divides "
                  "them"),
    Cap("split", lambda a: _pp(a) and a.t.split == "partition" and not partition_splits(a.name, a.model, a.par.pp),
        lambda a: f"pp={a.par.pp}: none of {a.name}'s partition methods ({', '.join(partition_methods(a.name))}) gives "
                  "each of the "
                  f"{a.par.pp} stages a block of the {a.model.layers}; plan fewer stages"),
    Cap("microbatches", lambda a: _pp(a) and a.t.microbatches == "megatron" and a.par.vpp > 1
        and _m(a) % a.par.pp != 0,
        lambda a: f"vpp={a.par.vpp} with {_m(a)} micro-batches: Megatron's interleaved schedule needs a multiple of "
                  f"pp={a.par.pp}; plan --grad-accum {_round_up(_m(a), a.par.pp)}"),
    Cap("microbatches", lambda a: _pp(a) and a.t.microbatches == "torch" and a.par.schedule == "1f1b"
        and _m(a) < a.par.pp,
        lambda a: f"{_m(a)} micro-batches on pp={a.par.pp}: torch's Schedule1F1B needs at least one per stage; "
                  f"plan --grad-accum {a.par.pp} or more, or --schedule gpipe"),
    Cap("microbatches", lambda a: _pp(a) and a.t.microbatches == "torch" and a.par.schedule == "interleaved"
        and _m(a) % max(1, _m(a) // a.par.pp) != 0,
        lambda a: f"{_m(a)} micro-batches on pp={a.par.pp}: torch's Interleaved1F1B needs a multiple of "
                  f"{max(1, _m(a) // a.par.pp)} rounds"),
    # recompute (whole-model policy)
    Cap("recompute", lambda a: a.par.recompute not in a.t.recompute,
        lambda a: f"recompute {a.par.recompute}: {a.name} offers {_join(sorted(a.t.recompute))} recompute; plan "
                  f"--recompute {'full' if 'full' in a.t.recompute else sorted(a.t.recompute)[0]}"),
    Cap("recompute_block", lambda a: a.par.recompute in a.t.recompute and a.par.recompute == "full"
        and a.par.recompute_layers >= 0 and not a.t.recompute_block,
        lambda a: f"full recompute of {a.par.recompute_layers} layers per stage: {a.name} recomputes every layer or "
                  "none; plan --recompute full (all layers)"),
    Cap("recompute_block", lambda a: a.par.recompute in a.t.recompute and a.par.recompute == "full"
        and a.par.recompute_layers >= 0 and a.t.recompute_block and a.par.vpp > 1 and not a.t.recompute_per_stage
        and a.par.recompute_layers % a.par.vpp != 0,
        lambda a: f"{a.par.recompute_layers} recomputed layers per stage with vpp={a.par.vpp}: the block method "
                  "recomputes the first N layers of each virtual stage; plan --recompute-layers "
                  f"{_round_up(a.par.recompute_layers, a.par.vpp)}"),
    # rank order
    Cap("orders", _order_broken,
        lambda a: f"mesh order {','.join(a.order)}: {a.name} orders ranks "
                  + " or ".join(",".join(o) for o in a.t.orders) + " (outermost first); plan --mesh-order "
                  + ",".join(a.t.orders[0])),
)


MODEL_FIELDS = frozenset({"models", "dtypes"})     # the rules that read only the model and the workload


def model_problems(target: str, model: ModelSpec, workload: Workload) -> list[str]:
    return list(_model_problems(target, model, workload))


@functools.lru_cache(maxsize=256)
def _model_problems(target: str, model: ModelSpec, workload: Workload) -> tuple[str, ...]:
    """What no configuration of ``target`` avoids for this model and workload (multi-latent
    attention on a target without it, a dtype): the search and the refusal ask this first."""
    base = get(target)
    par = ParallelConfig()
    found = []
    for t in [s for _, _, s in base.variants] or [base]:
        ask = Ask(t, base.name, model, workload, par, MESH_AXES, False)
        got = [cap.message(ask) for cap in CAPS if cap.field in MODEL_FIELDS and cap.broken(ask)]
        got += [m for rule in t.extra if rule.model_only and (m := rule.check(model, workload, par, MESH_AXES))]
        if not got:
            return ()
        found.append(got)
    return tuple(f"{base.name}: {m}" for m in found[0])


# the same rules, the ones that break most often in the search first (counted over every target's
# enumeration of deepseek-v3 on 2,048 H100: ZeRO 54% of the configurations refused, expert TP 17%,
# schedules 11%, rank order 2%, recompute 1%), so that runs_config stops early
_FIRST = ("zero", "expert_tp", "schedules", "orders", "recompute")
FAST_CAPS = tuple(sorted(CAPS, key=lambda c: _FIRST.index(c.field) if c.field in _FIRST else len(_FIRST)))


def runs_config(target: str | TrainTarget, model: ModelSpec, workload: Workload, par: ParallelConfig,
                order: Sequence[str] = MESH_AXES) -> bool:
    """``not config_problems(...)`` without writing any message: stops at the first broken rule
    (the search asks this of every configuration; tests/test_targets.py checks the two agree)."""
    base = _TABLES[target] if isinstance(target, str) else target
    ask = Ask(base.for_config(par), base.name, model, workload, par, tuple(order), False)
    checks = config_checks(ask)
    if checks is None:
        return False
    for broken in checks:
        if broken(ask):
            return False
    return True


_CONFIG_CHECKS: dict = {}


def config_checks(ask: Ask) -> tuple[Callable[[Ask], bool], ...] | None:
    """What ``runs_config`` asks of a configuration under its table ``ask.t``, in its order: each
    rule of ``FAST_CAPS`` but those that read only the model and the workload (``MODEL_FIELDS``),
    then the table's ``extra`` rules, each as a predicate true when the rule breaks. Built once
    per table, model and workload; None when a model-only rule breaks (every configuration is
    refused). Pure functions of the ``Ask``: the search asks once per outer shape those that read
    nothing else of the configuration (``planner.search.target_space.ShapeRules``)."""
    key = (id(ask.t), ask.model, ask.wl)
    hit = _CONFIG_CHECKS.get(key)
    if hit is None:
        if len(_CONFIG_CHECKS) > 4096:
            _CONFIG_CHECKS.clear()
        broken = any(cap.broken(ask) for cap in FAST_CAPS if cap.field in MODEL_FIELDS)
        hit = _CONFIG_CHECKS[key] = (ask.t, None if broken else
                                     tuple(cap.broken for cap in FAST_CAPS if cap.field not in MODEL_FIELDS)
                                     + tuple(_extra_broken(rule) for rule in ask.t.extra))
    return hit[1]


def _extra_broken(rule: Extra) -> Callable[[Ask], bool]:
    return lambda a: bool(rule.check(a.model, a.wl, a.par, a.order))


def config_problems(target: str | TrainTarget, model: ModelSpec, workload: Workload, par: ParallelConfig,
                    order: Sequence[str] = MESH_AXES, plan_check: bool = False) -> list[str]:
    """What training target ``target`` cannot run in this configuration, stage split aside: every
    rule of ``CAPS`` its table breaks, then its ``extra`` rules. ``plan_check``: checking a
    finished plan rather than searching (ZeRO-1 on a target that runs it as ZeRO-0 is then left to
    ``problems``' memory check)."""
    base = get(target) if isinstance(target, str) else target
    ask = Ask(base.for_config(par), base.name, model, workload, par, tuple(order), plan_check)
    out = [cap.message(ask) for cap in CAPS if cap.broken(ask)]
    out += [msg for rule in ask.t.extra if (msg := rule.check(model, workload, par, ask.order))]
    return [f"{base.name}: {m}" for m in out]


def _partition_problems(name: str, model: ModelSpec, pp: int, counts: tuple[int, ...], method: str | None) -> list[str]:
    """A DeepSpeed split runs only as a partition method places it: the plan's method, or any."""
    methods = partition_methods(name)
    if method is not None:
        if method not in methods:
            return [f"partition_method {method!r}: {name} plans with " + ", ".join(methods)]
        got = partition_split(name, model, pp, method)
        if got != counts:
            placed = list(got) if got else "no block on some stage"
            return [f"stage split {list(counts)}: partition_method {method} places {placed}; plan --target {name}"]
        return []
    splits = partition_splits(name, model, pp)
    if counts in splits:
        return []
    shown = "; ".join(f"{m} gives {list(c)}" for c, m in splits.items()) or "no stage split with a block on every stage"
    who = "Megatron-DeepSpeed" if name == "megatron-deepspeed" else "DeepSpeed"
    return [f"stage split {list(counts)}: no {who} partition_method places the blocks so ({shown}); plan --target {name}"]


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
                   stages: Sequence[StageSpec], groups: int = 1,
                   switches: Mapping[str, Any] | None = None) -> list[str]:
    """What target ``target`` cannot run in this stage split (and its per-stage recompute);
    ``switches``: the plan's framework settings (DeepSpeed's ``partition_method``)."""
    base = get(target) if isinstance(target, str) else target
    t = base.for_config(par)
    name = base.name
    out: list[str] = []
    counts = [s.num_layers for s in stages]
    if par.pp > 1 and t.split == "partition":
        out += _partition_problems(name, model, par.pp, tuple(counts), (switches or {}).get("partition_method"))
    used = {s.group for s in stages}
    if not t.heterogeneous and (groups > 1 or len(used - {""}) > 1):
        out.append(f"stages on {groups} node groups: {name} launches one kind of node; plan --target {name} "
                   "plans on one group")
    split, per_stage, least = split_rule(t, par)
    if end_slots(par, counts) and t.vpp_split != "ends":
        out.append(f"stage split {counts} with vpp={par.vpp}: an end stage leaves a virtual stage to the embedding "
                   f"or the loss alone, which {name} does not run (every virtual stage needs a layer); "
                   f"plan --target megatron or a split with at least {par.vpp} layers per stage")
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
           + stage_problems(target, plan.model, plan.parallel, plan.stages, len(plan.cluster.groups),
                            getattr(plan, "framework", None))
           + switch_problems(target, plan.parallel, getattr(plan, "framework", None) or {}, plan.model, plan.workload,
                             plan.cluster.groups[0].gpu))
    par = plan.parallel
    if par.moe_dispatcher in ("deepep", "hybridep") and plan.model.is_moe and par.ep > 1:
        # the fabric the dispatcher's kernels need (costmodel.moe.dispatcher_fabric_problem: the search's and the
        # Megatron file's rule)
        c = plan.cluster
        why, hint = dispatcher_fabric_problem(par.moe_dispatcher, par.ep, c.nvlink_gpus, c.gpus_per_node,
                                              not deepep_fabric_problem(c.inter_node))
        if why:
            out.append(f"{target}: moe_dispatcher {par.moe_dispatcher} with ep={par.ep} on {c.name} ({c.nvlink_gpus}-GPU "
                       f"NVLink domains of {c.gpus_per_node}-GPU hosts): {why}; {hint}")
    if not out and TRAIN[target].zero1_as_zero0 and par.zero == 1 and par.dp > 1:
        out += _zero1_as_zero0(target, plan)
    return out


# published runs are labelled by the engine that ran them: Megatron-DeepSpeed's and GPT-NeoX's runs
# say "deepspeed" (calibration/published_runs_frameworks.yaml); they may be priced by either target
PUBLISHED_AS = {"megatron-deepspeed": "deepspeed"}


def targets_running(framework: str, plan: Any) -> list[str]:
    """The training targets that accept ``plan``'s layout and are priced with ``framework``'s
    profile, or whose runs are published under that name (``PUBLISHED_AS``): the ones through
    which a published run of that framework may be priced (``planner validate``). BLOOM-176B,
    MT-NLG 530B and GPT-NeoX-20B (TP + PP + ZeRO-1 under DeepSpeed's engine) get the
    megatron-deepspeed target; the DeepSpeed target (AutoTP does not combine with pipelines)
    refuses them."""
    return [r.name for r in records("train")
            if framework in (r.profile, PUBLISHED_AS.get(r.profile)) and r.planned and not problems(r.name, plan)]


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
