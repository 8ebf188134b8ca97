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

from .specs import ModelSpec, ParallelConfig, StageSpec
from .units import dtype_bytes


@dataclass(frozen=True)
class StateBytes:
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


@lru_cache(maxsize=64)
def bytes_per_param(dtype: str, optimizer: str = "adamw") -> tuple[float, float, float]:
    """(weights, grads, optimizer state) bytes per parameter."""
    w = dtype_bytes(dtype)
    g = 4.0 if dtype in ("bf16", "bfloat16") else w
    if dtype in ("fp32", "float32"):
        return 4.0, 4.0, (8.0 if optimizer in ("adam", "adamw") else 4.0)
    k = 12.0 if optimizer in ("adam", "adamw") else 8.0
    return w, g, k


def model_state_bytes(params: float, shard: int, zero: int, dtype: str = "fp16",
                      optimizer: str = "adamw") -> StateBytes:
    """Weights, gradients and optimizer state per GPU for ``params`` parameters sharded over
    ``shard`` data-parallel ranks at ZeRO stage ``zero``."""
    w, g, k = bytes_per_param(dtype, optimizer)
    d = max(1, shard)
    return StateBytes(weights=params * w / (d if zero >= 3 else 1),
                      grads=params * g / (d if zero >= 2 else 1),
                      optimizer=params * k / (d if zero >= 1 else 1))


def expert_shard(par: ParallelConfig) -> int:
    """Ranks over which one expert's parameters can be ZeRO-sharded."""
    return max(1, min(par.dp_shard, par.dp * par.cp // par.ep))


def stage_param_counts(model: ModelSpec, par: ParallelConfig, stage_index: int,
                       stages: tuple[StageSpec, ...]) -> tuple[float, float]:
    """Parameters per GPU of one pipeline stage, after TP and EP sharding and before ZeRO:
    ``(dense, routed_expert)``. The embedding sits on the first stage and the output head
    (with the final norm) on the last, both split over TP (vocab-parallel); with tied
    embeddings and ``pp > 1`` the last stage keeps its own copy, as Megatron-LM does."""
    st = stages[stage_index]
    t = par.tp
    norms = 2 * model.norm_params()
    n_moe = model.moe_layers_in(st.first_layer, st.last_layer)
    n_dense = st.num_layers - n_moe
    dense = n_dense * ((model.attention_params() + model.dense_mlp_params()) / t + norms)
    expert = 0.0
    if n_moe:
        routed = model.num_experts * model.expert_params()
        expert = n_moe * routed / (par.ep * t)
        router = model.hidden * model.num_experts     # kept whole on every TP rank (Megatron, our runtime)
        dense += n_moe * ((model.attention_params() + model.moe_mlp_params() - routed - router) / t + router + norms)
    if stage_index == 0:
        dense += model.embedding_params() / t
    if stage_index == len(stages) - 1:
        if model.tied_embeddings and len(stages) == 1:
            dense += model.norm_params()
        else:
            dense += model.vocab * model.hidden / t + model.norm_params()
    return dense, expert
