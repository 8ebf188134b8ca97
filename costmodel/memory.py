"""Memory per GPU: parameters held by each pipeline stage, and model states under ZeRO.

Model states (Rajbhandari et al., "ZeRO", SC'20, Sec. 3.1 and Fig. 1), per parameter:
mixed-precision Adam keeps 16-bit weights (2 bytes), gradients, and K = 12 bytes of optimizer
state (fp32 master weights, momentum, variance). Gradients are 2 bytes in fp16 training as in
the paper; in bf16 training Megatron-LM and torchtitan accumulate and reduce gradients in fp32
(4 bytes: Megatron's ``main_grad`` buffers, torchtitan's ``reduce_dtype=float32``). SGD with
momentum keeps K = 8. ZeRO-1 shards the optimizer states over the ``dp_shard`` ranks, ZeRO-2
also the gradients, ZeRO-3 (FSDP) also the weights; HSDP shards over ``dp_shard < dp`` and
replicates across the rest. Routed-expert parameters are replicated over ``dp*cp / ep`` ranks
only, so they shard over at most that many.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .fp8 import Fp8Recipe
from .layers import ends_params, layer_params
from .specs import LOW_PRECISION_DTYPES, ModelSpec, ParallelConfig, StageSpec, low_precision
from .units import MIB, dtype_bytes


@dataclass(frozen=True)
class StateBytes:
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


@lru_cache(maxsize=64)
def bytes_per_param(dtype: str, optimizer: str = "adamw", fp8: Fp8Recipe | None = None,
                    grads_bf16: bool = False, moments_bf16: bool = False) -> tuple[float, float, float]:
    """(weights, grads, optimizer state) bytes per parameter. FP8 training (``costmodel.fp8``)
    keeps FP32 master weights and moments (12), FP32 gradients (4) and the recipe's model weights
    (BF16 and the cached FP8 copies: ``Fp8Recipe.weight_bytes_per_param``); without a recipe the
    least any recipe keeps (1 byte: FP8 weights, one copy, on Blackwell), a floor for bounds.
    ``grads_bf16`` (BF16 and FP8 training): the gradient buffer is BF16, 2 bytes (Megatron-LM's
    ``--grad-reduce-in-bf16``, ``DistributedDataParallelConfig.grad_reduce_in_fp32=False``; NeMo's
    ``optim.grad_sync_dtype: bf16`` in NeMo-Framework-Launcher's ``conf/training/nemotron/
    nemotron_340b.yaml`` and ``grad_reduce_in_fp32 = False`` in its 2.0 recipes' performance mode).
    The distributed optimizer then makes the FP32 copy of its own gradient shard only inside the
    optimizer step (Megatron ``DistributedOptimizer._copy_model_grads_to_main_grads``), after the
    activations are freed, so it does not add to the peak this model counts.
    ``moments_bf16`` (Adam, BF16 and FP8 training): Adam's state as ``adam_state_bytes_bf16_moments``
    counts it."""
    k = 12.0 if optimizer in ("adam", "adamw") else 8.0
    low = dtype in ("bf16", "bfloat16", *LOW_PRECISION_DTYPES) and grads_bf16
    if moments_bf16 and optimizer in ("adam", "adamw") and dtype in ("bf16", "bfloat16", *LOW_PRECISION_DTYPES):
        k = adam_state_bytes_bf16_moments(dtype, fp8)
    if low_precision(dtype):
        return (fp8.weight_bytes_per_param() if fp8 is not None else 1.0), (2.0 if low else 4.0), k
    w = dtype_bytes(dtype)
    g = (2.0 if low else 4.0) if dtype in ("bf16", "bfloat16") else w
    if dtype in ("fp32", "float32"):
        return 4.0, 4.0, (8.0 if optimizer in ("adam", "adamw") else 4.0)
    return w, g, k


def adam_state_bytes_bf16_moments(dtype: str, fp8: Fp8Recipe | None = None) -> float:
    """Adam's optimizer state per parameter with its two moments kept in BF16: Megatron-LM's
    precision-aware optimizer (``--use-precision-aware-optimizer --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16``, megatron/training/arguments.py; ``OptimizerConfig`` in
    megatron/core/optimizer/optimizer_config.py). 2 + 2 bytes of moments, and the FP32 master
    weight: Transformer Engine's FusedAdam holds it as the 16 bits the BF16 parameter lacks
    (``store_param_remainders``, Megatron's default, TE >= 2.1: an int16 ``master_param`` shard in
    ``DistributedOptimizer``) where the parameters are BF16 and TE manages the master weights,
    which Megatron lets it do in BF16 training and under FP8's delayed scaling
    (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``): 6 bytes. Under the other FP8 recipes
    Megatron keeps the master itself in FP32: 8 bytes. Without a recipe (a floor for bounds) the
    least: 6."""
    if low_precision(dtype) and fp8 is not None and (fp8.name != "delayed" or fp8.fp8_weights):
        return 4.0 + 2.0 + 2.0
    return 2.0 + 2.0 + 2.0


def ends_weight_bytes_per_param(dtype: str, optimizer: str = "adamw", fp8: Fp8Recipe | None = None) -> float:
    """Working-weight bytes per parameter of the embedding, the output layer and the final norm.
    FP8 training quantizes only the transformer layers' linear GEMMs: Megatron's embedding
    (``VocabParallelEmbedding``) and output layer (``tensor_parallel.ColumnParallelLinear``) are not
    Transformer Engine modules, so they get no cached FP8 copies and ``--fp8-param-gather`` leaves
    them BF16; torchtitan's float8 converter skips embeddings and its configs filter ``output``
    (``filter_fqns``). So 2 bytes (BF16) in FP8 training, the working dtype's bytes otherwise."""
    if low_precision(dtype):
        return 2.0
    return bytes_per_param(dtype, optimizer, fp8)[0]


def zero_divisors(zero: int, shard: int) -> tuple[int, int, int]:
    """What divides the (weights, gradients, optimizer state) of parameters sharded over
    ``shard`` ranks at ZeRO stage ``zero``: stage 1 shards the optimizer state, 2 also the
    gradients, 3 also the weights (ZeRO, Sec. 5)."""
    d = max(1, shard)
    return (d if zero >= 3 else 1, d if zero >= 2 else 1, d if zero >= 1 else 1)


def model_state_bytes(params: float, shard: int, zero: int, dtype: str = "fp16",
                      optimizer: str = "adamw", fp8: Fp8Recipe | None = None) -> StateBytes:
    """Weights, gradients and optimizer state per GPU for ``params`` parameters sharded over
    ``shard`` data-parallel ranks at ZeRO stage ``zero``."""
    w, g, k = bytes_per_param(dtype, optimizer, fp8)
    dw, dg, dk = zero_divisors(zero, shard)
    return StateBytes(weights=params * w / dw, grads=params * g / dg, optimizer=params * k / dk)


def expert_shard(par: ParallelConfig) -> int:
    """Ranks over which one expert's parameters can be ZeRO-sharded: the expert data-parallel
    group (folded: ``ParallelConfig.expert_dp``), within the ZeRO shard group."""
    if par.folded:
        return max(1, par.expert_dp if not par.hsdp else min(par.dp_shard, par.expert_dp))
    return max(1, min(par.dp_shard, par.dp * par.cp // par.ep))


def param_gather_bytes_per_param(dtype: str, fp8: Fp8Recipe | None = None) -> float:
    """Bytes per parameter a weight all-gather moves (ZeRO-1/2 after the step, ZeRO-3 before
    each use) and a gathered-weight buffer holds: the working precision (BF16 under FP8
    training), FP8 with the recipe's FP8 parameter gather (``costmodel.fp8``)."""
    if low_precision(dtype):
        return fp8.copy_bytes if fp8 is not None and fp8.param_gather else 2.0
    return bytes_per_param(dtype)[0]


def optimizer_traffic_bytes_per_param(dtype: str, optimizer: str = "adamw", fp8: Fp8Recipe | None = None,
                                      grads_bf16: bool = False, moments_bf16: bool = False) -> float:
    """HBM bytes the optimizer step moves per local parameter: it reads the optimizer state
    (fp32 master weights and moments, ``k`` bytes) and the gradient (``g``), and writes the
    state back and the new working-precision weights (``w``): ``2k + g + w``. Mixed-precision
    Adam with fp32 gradients: 2 x 12 + 4 + 2 = 30 bytes (what Megatron's fused Adam and
    torch's fused AdamW touch; torch's default ``foreach`` AdamW makes more passes: 30 ms, not this
    rule's 14, for GPT-3 1.3B on an H200, bench/results/device-h200); fp16 gradients 28, plus FP16's dynamic loss scaling
    (``loss_scaling_bytes_per_param``, 18): 46; fp32 training 2 x 8 + 4 + 4 = 24.
    FP8 recipes that cache FP8 weights quantize them once per step after it (Megatron's
    ``is_first_microbatch``): the BF16 write (an FP8 one with FP8 weights) and that cast; the
    delayed recipe on Hopper: 24 + 4 + 2 + (2 + 2) = 34."""
    w, g, k = bytes_per_param(dtype, optimizer, fp8, grads_bf16, moments_bf16)
    if low_precision(dtype):
        if fp8 is None or not fp8.weight_copies:
            return 2 * k + g + 2.0
        write = fp8.copy_bytes if fp8.fp8_weights else 2.0
        return 2 * k + g + write + fp8.cast_bytes_per_value()
    return 2 * k + g + w + loss_scaling_bytes_per_param(dtype)


def loss_scaling_bytes_per_param(dtype: str) -> float:
    """HBM bytes per local parameter that FP16 training's dynamic loss scaling adds to the
    optimizer step (0 for every other dtype: BF16 and FP8 recipes run without a loss scaler).

    Source: Megatron-LM ``megatron/core/optimizer/optimizer.py`` (NVIDIA/Megatron-LM at
    001199898c), ``MixedPrecisionOptimizer.prepare_grads``, which runs before every step:

    * ``_copy_model_grads_to_main_grads``: ``main_param.grad = model_param.main_grad.float()``.
      With FP16 the gradient buffer is FP16 (``--accumulate-allreduce-grads-in-fp32`` is off
      unless bf16 turns it on, ``memory.bytes_per_param``), so ``.float()`` reads 2 bytes and
      writes a 4-byte FP32 copy (with FP32 main grads, BF16's case, it is the same tensor: no
      traffic). The distributed optimizer does the same on its shard.
    * ``_unscale_main_grads_and_check_for_nan``: ``torch._amp_foreach_non_finite_check_and_unscale_``
      over the FP32 main grads with the scaler's inverse scale (``if self.grad_scaler``: FP16
      only; Megatron builds no scaler for BF16): reads and writes 4 bytes each.
    * Adam and the gradient norm then read those 4-byte FP32 grads where
      ``optimizer_traffic_bytes_per_param`` and ``scale.GRAD_NORM_READS`` count the 2-byte FP16
      gradient: 2 bytes more each.

    6 + 8 + 2 + 2 = 18 bytes. Also FP16-only, priced elsewhere: the ``found_inf`` all-reduce
    (``scale.step_reductions_s``). Not priced: the steps the scaler skips on overflow (the
    step's work is done and thrown away, at most ``hysteresis`` = 2 steps per
    ``loss_scale_window`` = 1,000, Megatron's defaults, about 0.2%); published throughput counts
    every iteration alike, so a skipped step changes no published tokens/s or FLOP/s."""
    if dtype not in ("fp16", "float16"):
        return 0.0
    copy = 2.0 + 4.0          # .float(): read the FP16 gradient, write the FP32 main grad
    unscale = 4.0 + 4.0       # foreach non-finite check and unscale: read and write it
    fp32_reads = 2 * (4.0 - 2.0)   # Adam and the norm read 4-byte grads, not 2
    return copy + unscale + fp32_reads


# Allocator fragmentation (PyTorch's caching allocator keeps freed blocks of one size for reuse,
# so tensors of changing sizes leave reserved-but-unallocated memory) has one owner: the
# framework's ``memory_headroom_fraction`` of the GPU's memory (``costmodel.frameworks``), which
# the plan must leave free. Until stop 19 a second term, 5% of the activations, counted the same
# reserved-but-unallocated blocks again on top of it; it is gone.
# Data-parallel gradient buckets in flight for ZeRO 0-2: torch DDP fills buckets of
# ``bucket_cap_mb = 25`` (MiB) and reduces one while the next fills, so two are live.
DDP_BUCKET_BYTES = 2 * 25 * MIB


def activations_in_flight(inflight: float, per_microbatch_bytes: float, fixed_bytes: float) -> float:
    """Activation memory of a stage: what one micro-batch stores for its backward times the
    micro-batches in flight (``costmodel.training.inflight_microbatches``), plus what does not
    scale with them (the recompute working set, the logits on the last stage)."""
    return inflight * per_microbatch_bytes + fixed_bytes


def other_bytes(activations_bytes: float, reserved_bytes: float, buffers_bytes: float) -> float:
    """A stage's memory besides model states and activations: the GPU's reserved memory (CUDA
    context, library workspaces) and communication buffers (DDP buckets or ZeRO-3 prefetch).
    Fragmentation is the framework's memory headroom (see above), not a term here;
    ``activations_bytes`` stays in the signature for the callers that pass it."""
    return reserved_bytes + buffers_bytes


def stage_memory(weights_bytes: float, grads_bytes: float, optimizer_bytes: float, activations_bytes: float,
                 reserved_bytes: float, buffers_bytes: float) -> dict[str, float]:
    """The peak memory of one GPU of a training stage by category (the ``memory`` of
    ``planner estimate --json``): model states (ZeRO, Rajbhandari et al. Sec. 3.1), activations
    in flight, and ``other_bytes``; the categories add up to ``peak_bytes``. The one rule for a
    stage's peak: ``estimate``, the solver's tables (``stage_peak_bytes``) and its bounds."""
    other = other_bytes(activations_bytes, reserved_bytes, buffers_bytes)
    return {"peak_bytes": weights_bytes + grads_bytes + optimizer_bytes + activations_bytes + other,
            "weights_bytes": weights_bytes, "grads_bytes": grads_bytes, "optimizer_bytes": optimizer_bytes,
            "activations_bytes": activations_bytes, "other_bytes": other}


def stage_peak_bytes(states_bytes: float, activations_bytes: float, reserved_bytes: float,
                     buffers_bytes: float) -> float:
    """``stage_memory(...)["peak_bytes"]`` from the summed model states (the solver's hot path)."""
    return states_bytes + activations_bytes + other_bytes(activations_bytes, reserved_bytes, buffers_bytes)


def stage_param_counts(model: ModelSpec, par: ParallelConfig, stage_index: int,
                       stages: tuple[StageSpec, ...]) -> tuple[float, float]:
    """Parameters per GPU of one pipeline stage, after TP and EP sharding and before ZeRO:
    ``(dense, routed_expert)``, from the layer description (``costmodel.layers.layer_params``)
    and the embedding and head (``ends_params``)."""
    st = stages[stage_index]
    n_moe = model.moe_layers_in(st.first_layer, st.last_layer)
    n_dense = st.num_layers - n_moe
    dense = layer_params(model, False, par.tp, par.ep)
    expert = 0.0
    total = n_dense * dense.total if n_dense else 0.0
    if n_moe:
        moe = layer_params(model, True, par.tp, par.ep)
        total += n_moe * (moe.total - moe.experts)
        expert = n_moe * moe.experts
    total += ends_params(model, par.tp, len(stages), stage_index == 0, stage_index == len(stages) - 1).total
    return total, expert
