"""A layer's weight matrices on one GPU: the one description of a layer's shapes that parameter
counts (``costmodel.specs.ModelSpec``), memory, GEMM times and serving all read.

Kept apart from ``costmodel.layers`` (which prices those matrices) so that ``costmodel.specs`` can
count parameters from it without an import cycle: this module imports nothing of ours at run time.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .specs import ModelSpec


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads one tensor-parallel rank holds (grouped-query attention): ``kv_heads / tp``, or
    one head, replicated on ``tp / kv_heads`` ranks, when ``tp > kv_heads``. That is what vLLM and
    TensorRT-LLM do (vLLM's ``QKVParallelLinear`` replicates KV heads when tp exceeds them) and
    what our runtime would have to do; Megatron-LM refuses ``tp > num_query_groups`` instead
    (``divide(num_query_groups, tp)``). ``tp_problems`` admits only tp dividing or divided by
    ``kv_heads``."""
    return 1 if tp >= model.kv_heads else -(-model.kv_heads // tp)


def kv_width_per_rank(model: ModelSpec, tp: int) -> float:
    """Width of one of K or V on one TP rank: its KV heads times ``head_dim`` (MHA/GQA), or for
    multi-latent attention the up-projected per-head values, split with the heads."""
    if model.attention == "mla":
        return model.kv_dim / tp
    return kv_heads_per_rank(model, tp) * model.head_dim


class Matrix(NamedTuple):
    """One weight matrix of a layer as one GPU holds it: ``x[m, k] @ W[k, n]``, ``count`` copies
    (the local experts of a routed-expert matrix), ``bias`` parameters per copy."""

    name: str
    k: float             # input width on this GPU
    n: float             # output width on this GPU
    count: float         # copies on this GPU
    role: str            # "dense" (every token; attention, dense MLP, shared experts) |
    #                      "router" (every token; kept whole, 16-bit in serving) | "expert" (routed tokens)
    bias: float = 0.0    # bias parameters per copy (column-parallel: split with n; row-parallel: whole)

    @property
    def params(self) -> float:
        return (self.k * self.n + self.bias) * self.count


def _mlp(name: str, model: ModelSpec, ffn: float, split: int, count: float, role: str) -> tuple[Matrix, ...]:
    """The MLP's input matrix (SwiGLU: gate and up fused; GELU: fc1), column-parallel, and its
    output matrix, row-parallel (Megatron's MLP, Shoeybi et al. 2019 Sec. 3)."""
    mats = 3 if model.mlp == "swiglu" else 2
    h = model.hidden
    b = model.bias
    return (Matrix(f"{name}_in", h, (mats - 1) * ffn / split, count, role, (mats - 1) * ffn / split if b else 0.0),
            Matrix(f"{name}_out", ffn / split, h, count, role, h if b else 0.0))


@lru_cache(maxsize=4096)
def layer_matrices(model: ModelSpec, moe: bool, tp: int, ep: int = 1, expert_tp: int | None = None
                   ) -> tuple[Matrix, ...]:
    """A layer's weight matrices on one GPU under tensor parallel ``tp``, expert parallel ``ep``
    and expert tensor parallel ``expert_tp`` (default ``tp``; the serving runtimes' expert
    parallel keeps experts whole, ``expert_tp = 1``), in the order the layer runs them.

    Attention (Megatron-LM's column-parallel QKV, row-parallel output; Shoeybi et al. 2019,
    Fig. 3): query heads split over TP, KV heads per ``kv_heads_per_rank``. Multi-latent
    attention (DeepSeek-V2 report, Sec. 2.1): the down-projections to the latents are replicated
    on every TP rank (vLLM's ``ReplicatedLinear``, Megatron's duplicated down-projections), the
    up-projections and the output split with the heads. MoE: the router whole on every rank,
    ``num_experts / ep`` local experts each split over ``expert_tp``, shared experts split over
    TP as a dense MLP is."""
    t = tp
    et = t if expert_tp is None else expert_tp
    h, b = model.hidden, model.bias
    out: list[Matrix] = []
    if model.attention == "mla":
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            out.append(Matrix("q_down", h, model.q_lora_rank, 1, "dense"))
            out.append(Matrix("q_up", model.q_lora_rank, model.heads * qk / t, 1, "dense"))
        else:
            out.append(Matrix("q", h, model.heads * qk / t, 1, "dense"))
        out.append(Matrix("kv_down", h, model.kv_lora_rank + model.qk_rope_head_dim, 1, "dense"))
        out.append(Matrix("kv_up", model.kv_lora_rank, model.heads * (model.qk_nope_head_dim + model.v_head_dim) / t,
                          1, "dense"))
        out.append(Matrix("attn_out", model.heads * model.v_head_dim / t, h, 1, "dense"))
    else:
        qkv = model.q_dim / t + 2 * kv_width_per_rank(model, t)
        out.append(Matrix("qkv", h, qkv, 1, "dense", qkv if b or model.qkv_bias else 0.0))
        out.append(Matrix("attn_out", model.attn_out_dim / t, h, 1, "dense", h if b else 0.0))
    if moe:
        E = model.num_experts
        out.append(Matrix("router", h, E, 1, "router"))
        out += _mlp("expert", model, model.expert_ffn_hidden, et, E / ep, "expert")
        if model.shared_experts:
            out += _mlp("shared_expert", model, model.shared_expert_ffn_hidden * model.shared_experts, t, 1, "dense")
    else:
        out += _mlp("mlp", model, model.ffn_hidden, t, 1, "dense")
    return tuple(out)
