"""Specs: the three inputs of the cost model, kept apart (model, cluster, execution).

* ``ModelSpec``   -- the network: a decoder-only transformer, dense or mixture-of-experts,
                     with multi-head / grouped-query / multi-latent (MLA) attention.
* ``ClusterSpec`` -- the hardware: node groups of GPUs, the links inside and between nodes,
                     and optional measured tables (matmul efficiency, collective bandwidth).
* ``Workload``    -- what is run on it: batch, sequence length, dtype, optimizer.
* ``ParallelConfig`` -- how it is split: tp, pp, dp, cp, ep, ZeRO stage, recompute, ...

All frozen dataclasses, keyword-only, validated in ``__post_init__``, SI units inside.
``from_dict`` rejects unknown keys and names them. Nothing here reads files.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .limits import (MAX_BANDWIDTH, MAX_FLOPS, MAX_GPUS, MAX_MESSAGE_BYTES, check_ranges, check_types, describe, num,
                     range_problem,
                     type_problem)
from .attention import KERNELS as ATTENTION_KERNELS
from .moe import DISPATCHERS as MOE_DISPATCHERS
from .power import power_rate_factor
from .units import GIB, US, dtype_bytes

# What communication overlapped with compute still costs when nothing measured it: NCCL's
# kernels occupy SMs while they run (an H100 all-gather takes 24 of 132 SMs, 18%: NVIDIA developer
# forum, "Compute-communication overlap causes severe GEMM performance degradation", 2025), so the
# overlapped GEMMs slow down by about that much; Lee et al., "Characterizing Compute-Communication
# Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114, 2025) measure 18.9% on
# average (up to 40%). 0.18 of the overlapped time, until `planner profile` measures the cluster.
OVERLAP_SLOWDOWN = 0.18

# The mesh axes a training plan orders (outermost first by default); the one copy of this tuple.
MESH_AXES = ("pp", "dp", "cp", "tp")


def _cached_hash(self) -> int:
    """Frozen specs are hashed often (memo keys); compute the field hash once."""
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.hash is not False
                       and f.compare))
        object.__setattr__(self, "_hash", h)
    return h


def _memo(fn):
    """Cache a no-argument method of a frozen spec in its instance dict."""
    key = "_memo_" + fn.__name__

    def wrapper(self):
        d = self.__dict__
        if key not in d:
            d[key] = fn(self)
        return d[key]

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


class SpecError(ValueError):
    """Bad user input in a spec: the message carries the numbers and a hint."""


def _check_keys(cls, data: Mapping[str, Any], where: str) -> None:
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a mapping of {cls.__name__} fields, got {describe(data)}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in set(data) - names)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")


def _positive(where: str, **values: float) -> None:
    for name, v in values.items():
        if v is None or v <= 0:
            raise SpecError(f"{where}: {name} must be > 0, got {v}")


# --------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Dense when ``num_experts == 0``."""
    __hash__ = _cached_hash

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    vocab: int
    kv_heads: int = 0                 # 0 -> heads (MHA); < heads -> GQA/MQA
    head_dim: int = 0                 # 0 -> hidden // heads
    family: str = "llama"             # informational: llama, gpt, mixtral, deepseek, ...
    mlp: str = "swiglu"               # swiglu (3 matrices) | gelu (2 matrices)
    norm: str = "rmsnorm"             # rmsnorm | layernorm
    positions: str = "rotary"         # rotary | learned | alibi
    max_seq_len: int = 8192
    tied_embeddings: bool = False
    bias: bool = False                # linear-layer biases (GPT-2, BLOOM, OPT)
    qkv_bias: bool = False            # biases on the query, key and value projections only (Qwen2, Qwen2-MoE)
    dropout: bool = False             # dropout masks kept for backward (Megatron GPT)
    # settings that change no cost but the model itself; the emitters pass them to each framework
    rope_theta: float = 10000.0       # RoPE base (Llama 3: 500000; Mixtral, Qwen3: 1e6)
    rope_scaling: float = 0.0         # Llama 3.1-style RoPE frequency scaling factor (0: none; 3.1: 8)
    norm_eps: float = 1e-5            # epsilon of every RMSNorm / LayerNorm
    # mixture of experts
    num_experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    expert_ffn_hidden: int = 0        # 0 -> ffn_hidden
    shared_expert_ffn_hidden: int = 0  # 0 -> expert_ffn_hidden (per shared expert)
    first_dense_layers: int = 0       # leading layers with a dense MLP (DeepSeek-V3: 3)
    moe_layer_freq: int = 1           # every n-th layer after those is MoE
    # the router (config.json: scoring_func, n_group/topk_group, topk_method / aux-loss coefficient)
    router_scoring: str = ""          # softmax | sigmoid ("" -> softmax)
    router_balance: str = ""          # aux_loss | aux_free (DeepSeek-V3's bias update, "noaux_tc"); "" -> aux_loss
    router_aux_coeff: float = 0.0     # the auxiliary loss's coefficient (Mixtral 0.02, Qwen3 0.001); 0: not given
    router_groups: int = 0            # expert groups (DeepSeek-V3: 8); 0: none
    router_topk_groups: int = 0       # groups a token may use (DeepSeek-V3: 4, node-limited routing)
    mtp_layers: int = 0               # multi-token-prediction modules (DeepSeek-V3: 1), trained with the model
    # multi-latent attention (DeepSeek-V2/V3)
    attention: str = "mha"            # mha (covers GQA/MQA) | mla
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # local attention (Mistral v0.1, Phi-3, Gemma 2/3, gpt-oss; Llama 4's chunked attention): a
    # local layer attends to at most ``sliding_window`` tokens, so its KV cache holds no more
    sliding_window: int = 0           # tokens a local layer sees; 0: every layer attends fully
    sliding_window_pattern: int = 0   # with a window: layers i with (i+1) % n == 0 attend fully (Gemma 3: 6,
    #                                   Gemma 2 and gpt-oss: 2, Llama 4: 4); 0: every layer is local
    attention_sinks: bool = False     # a learned sink logit per head per layer (gpt-oss; 64 numbers a layer, not counted)
    attn_softcap: float = 0.0         # tanh soft-capping of attention logits (Gemma 2: 50; 0: none)
    final_softcap: float = 0.0        # ... of the output logits (Gemma 2: 30; 0: none)
    published_params: float = 0.0     # the figure the model card quotes, for the record

    def __post_init__(self) -> None:
        where = f"model {describe(self.name)}"
        check_types(self, where, SpecError)
        _positive(where, layers=self.layers, hidden=self.hidden, ffn_hidden=self.ffn_hidden,
                  heads=self.heads, vocab=self.vocab)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise SpecError(f"{where}: hidden {self.hidden} is not divisible by heads {self.heads}; "
                                "give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise SpecError(f"{where}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.mlp not in ("swiglu", "gelu"):
            raise SpecError(f"{where}: mlp must be swiglu or gelu, got {self.mlp!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise SpecError(f"{where}: norm must be rmsnorm or layernorm, got {self.norm!r}")
        if self.positions not in ("rotary", "learned", "alibi"):
            raise SpecError(f"{where}: positions must be rotary, learned or alibi, got {self.positions!r}")
        if not self.rope_theta > 0 or not 0 < self.norm_eps < 1 or not (self.rope_scaling == 0 or self.rope_scaling >= 1):
            raise SpecError(f"{where}: rope_theta {self.rope_theta} must be > 0, norm_eps {self.norm_eps} in (0, 1) "
                            f"and rope_scaling {self.rope_scaling} 0 (none) or >= 1")
        if self.attention not in ("mha", "mla"):
            raise SpecError(f"{where}: attention must be mha or mla, got {self.attention!r}")
        if self.num_experts:
            if not 0 < self.top_k <= self.num_experts:
                raise SpecError(f"{where}: top_k {self.top_k} must be in 1..num_experts ({self.num_experts})")
            if self.expert_ffn_hidden == 0:
                object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
            if self.shared_expert_ffn_hidden == 0:
                object.__setattr__(self, "shared_expert_ffn_hidden", self.expert_ffn_hidden)
            if self.router_scoring not in ("", "softmax", "sigmoid"):
                raise SpecError(f"{where}: router_scoring must be softmax or sigmoid, got {self.router_scoring!r}")
            if self.router_balance not in ("", "aux_loss", "aux_free"):
                raise SpecError(f"{where}: router_balance must be aux_loss or aux_free, got {self.router_balance!r}")
            if self.router_topk_groups > self.router_groups or (
                    self.router_groups and self.num_experts % self.router_groups):
                raise SpecError(f"{where}: router_topk_groups {self.router_topk_groups} must be <= router_groups "
                                f"{self.router_groups}, which must divide num_experts {self.num_experts}")
            if self.moe_layer_freq < 1 or self.first_dense_layers < 0 or self.first_dense_layers > self.layers:
                raise SpecError(f"{where}: moe_layer_freq {self.moe_layer_freq} must be >= 1 and "
                                f"first_dense_layers {self.first_dense_layers} in 0..{self.layers}")
        if self.attention == "mla":
            _positive(where, kv_lora_rank=self.kv_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
                      qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim)
        if self.sliding_window_pattern and not self.sliding_window:
            raise SpecError(f"{where}: sliding_window_pattern {self.sliding_window_pattern} needs a sliding_window "
                            "(the tokens a local layer attends to); give one, or drop the pattern")
        if self.sliding_window_pattern == 1:
            raise SpecError(f"{where}: sliding_window_pattern 1 makes every layer global; use 0 (every layer local "
                            "with the window) or n >= 2 (every n-th layer global), or drop sliding_window")
        if self.attention_sinks and self.attention != "mha":
            raise SpecError(f"{where}: attention_sinks are per attention head of mha/GQA attention, not {self.attention}")
        check_ranges(self, where, SpecError)

    # ---- structure ---------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        if not self.is_moe or i < self.first_dense_layers:
            return False
        return (i - self.first_dense_layers) % self.moe_layer_freq == 0

    @property
    @_memo
    def moe_layers(self) -> int:
        return self.moe_layers_in(0, self.layers)

    def moe_layers_in(self, lo: int, hi: int) -> int:
        """MoE layers among layers [lo, hi), by arithmetic (the solver asks this a lot)."""
        if not self.is_moe or hi <= lo:
            return 0
        f = self.moe_layer_freq

        def upto(n: int) -> int:   # MoE layers in [0, n)
            k = n - self.first_dense_layers
            return 0 if k <= 0 else (k - 1) // f + 1

        return upto(min(hi, self.layers)) - upto(max(lo, 0))

    def is_local_attention_layer(self, i: int) -> bool:
        """Does layer ``i`` attend to a sliding window (``sliding_window``) rather than the whole
        context?"""
        if not self.sliding_window:
            return False
        p = self.sliding_window_pattern
        return p == 0 or (i + 1) % p != 0

    def local_attention_layers_in(self, lo: int, hi: int) -> int:
        """Local (sliding-window) layers among layers [lo, hi), by arithmetic."""
        lo, hi = max(lo, 0), min(hi, self.layers)
        if not self.sliding_window or hi <= lo:
            return 0
        p = self.sliding_window_pattern
        if p == 0:
            return hi - lo
        return (hi - lo) - (hi // p - lo // p)      # global layers: i + 1 a multiple of p

    def kv_tokens_in(self, lo: int, hi: int, ctx: float) -> float:
        """Cached tokens summed over layers [lo, hi) at context ``ctx``: ``ctx`` for a layer
        that attends fully, at most ``sliding_window`` for a local one. ``(hi - lo) * ctx`` for
        a model without a window."""
        local = self.local_attention_layers_in(lo, hi)
        return (hi - lo - local) * ctx + local * min(ctx, self.sliding_window)

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (all heads)."""
        if self.attention == "mla":
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of one of K or V (all KV heads) as attention sees it."""
        if self.attention == "mla":
            return self.heads * self.v_head_dim
        return self.kv_heads * self.head_dim

    @property
    def attn_out_dim(self) -> int:
        if self.attention == "mla":
            return self.heads * self.v_head_dim
        return self.heads * self.head_dim

    @property
    def qk_head_width(self) -> int:
        """One head's query/key width (MLA: its no-position and rotary parts)."""
        if self.attention == "mla":
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim

    @property
    def v_head_width(self) -> int:
        """One head's value width."""
        return self.v_head_dim if self.attention == "mla" else self.head_dim

    @property
    def score_dim(self) -> int:
        """Per-token width of QK^T plus AV work: sum over heads of (qk dim + v dim) / 2."""
        if self.attention == "mla":
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) // 2
        return self.heads * self.head_dim

    # ---- parameter counts: views of the one layer description ---------------------------
    # A layer's matrices (shapes, biases, experts) are written once, in
    # ``costmodel.layers.layer_matrices``; the counts here sum them unsharded (tp = ep = 1).
    # (Imported where used: ``costmodel.matrices`` reads this class's fields.)
    def _matrix_params(self, moe: bool, *prefixes: str) -> int:
        from .matrices import layer_matrices
        return int(round(sum(m.params for m in layer_matrices(self, moe, 1, 1, 1) if m.name.startswith(prefixes))))

    @_memo
    def attention_params(self) -> int:
        """Q, K, V and output projections with their biases; MLA's latent norms too."""
        p = self._matrix_params(False, "q", "kv", "attn_out")
        if self.attention == "mla":
            p += self.kv_lora_rank + (self.q_lora_rank or 0)
        return p

    @_memo
    def dense_mlp_params(self) -> int:
        return self._matrix_params(False, "mlp_")

    @_memo
    def expert_params(self) -> int:
        """One routed expert."""
        return self._matrix_params(True, "expert_") // self.num_experts

    @_memo
    def moe_mlp_params(self) -> int:
        """All experts, shared ones and the router of one MoE layer."""
        return self._matrix_params(True, "expert_", "shared_expert_", "router")

    @_memo
    def moe_active_mlp_params(self) -> int:
        return self.top_k * self.expert_params() + self._matrix_params(True, "shared_expert_", "router")

    @_memo
    def norm_params(self) -> int:
        per = self.hidden * (2 if self.norm == "layernorm" else 1)
        return per

    def layer_params(self, i: int) -> int:
        mlp = self.moe_mlp_params() if self.is_moe_layer(i) else self.dense_mlp_params()
        return self.attention_params() + mlp + 2 * self.norm_params()

    def layer_active_params(self, i: int) -> int:
        mlp = self.moe_active_mlp_params() if self.is_moe_layer(i) else self.dense_mlp_params()
        return self.attention_params() + mlp + 2 * self.norm_params()

    @_memo
    def embedding_params(self) -> int:
        p = self.vocab * self.hidden
        if self.positions == "learned":
            p += self.max_seq_len * self.hidden
        return p

    @_memo
    def head_params(self) -> int:
        """Output projection plus final norm (0 for the projection when tied)."""
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + self.norm_params()

    @_memo
    def total_params(self) -> int:
        return (self.embedding_params() + self.head_params()
                + sum(self.layer_params(i) for i in range(self.layers)))

    @_memo
    def active_params(self) -> int:
        return (self.embedding_params() + self.head_params()
                + sum(self.layer_active_params(i) for i in range(self.layers)))

    # ---- serialization ----------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        keep = {"name", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab"}
        return {k: v for k, v in d.items() if k in keep or v != defaults.get(k)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "model") -> "ModelSpec":
        _check_keys(cls, data, where)
        try:
            return cls(**data)
        except (TypeError, SpecError) as e:
            raise SpecError(f"{where}: {e}") from None


# --------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator, from its datasheet (or measured, when ``source`` says so)."""
    __hash__ = _cached_hash

    name: str
    memory_bytes: float
    peak_flops_per_s: Mapping[str, float] = field(hash=False)   # dense, per dtype (bf16, fp16, fp8, fp32, tf32)
    hbm_bandwidth_bytes_per_s: float
    # Achieved fraction of peak for the large GEMMs of a transformer layer, and the GEMM size
    # (geometric mean of m, n, k) at which half of it is reached. See costmodel/compute.py.
    matmul_efficiency: float = 0.70
    matmul_half_size: float = 160.0
    reserved_bytes: float = 1.0 * GIB       # CUDA context, cuBLAS/NCCL workspaces
    price_per_hour: float = 0.0             # USD per GPU-hour, for --objective cost
    # Fixed host time per transformer layer per micro-batch, forward + backward, added to the
    # layer's compute: an eager framework on a CPU device runs its dozens of operators
    # synchronously (measured by `planner profile` on CPUs: profiles/bench_layer.py). 0 for GPUs,
    # whose kernel launches are asynchronous and hide behind the kernels of real layers.
    layer_overhead_s: float = 0.0
    # What FSDP2's wrappers add on such a host-bound device (measured by `planner profile` on CPUs:
    # profiles/bench_layer.py bench_fsdp2_overhead): host time per wrapped block per micro-batch,
    # forward + backward, and per parameter tensor in the optimizer step (DTensor dispatch). Priced
    # for frameworks whose data parallelism is FSDP2 at every ZeRO stage (the built-in runtime:
    # stage_terms.StageModel). 0 for GPUs, where the host work hides behind the kernels.
    fsdp2_block_s: float = 0.0
    dtensor_param_step_s: float = 0.0
    # And what DTensor tensor parallelism adds there (the same measurement: the runtime's blocks under
    # its TP plan on a one-rank mesh less the plain blocks): host time per TP-sharded layer per
    # micro-batch, forward + backward. Priced for frameworks whose TP is DTensor (dp_bucket "fsdp2":
    # the built-in runtime, torchtitan) when tp > 1. 0 for GPUs.
    dtensor_tp_layer_s: float = 0.0
    # Fused attention measured on this device (`planner profile`: profiles/bench_attention.py):
    # rows (kernel, direction "fwd"|"bwd", mask "causal"|"none", head_dim, seq_len, fraction of the
    # 16-bit peak -- the fp32 peak on a CPU), in the kernel benchmarks' FLOP convention. Where a
    # kernel's rows are here, costmodel.attention prices that kernel on them instead of its
    # published curve. Empty: the published curves (every catalog GPU).
    attention_table: tuple[tuple[str, str, str, float, float, float], ...] = ()
    # The GPU's link to its host's memory, per direction, achieved (a pinned cudaMemcpy; the slower
    # direction), and the host memory one GPU's share of its node holds: what Megatron-Core's
    # fine-grained activation offloading moves and fills (ParallelConfig.offload_modules;
    # costmodel.layers offload_bytes). 0: not known, and offloading is refused on it.
    host_link_bytes_per_s: float = 0.0
    host_memory_bytes: float = 0.0
    # Serving's GEMM efficiency where it differs from training's (0: the same). Serving's figures
    # (costmodel/VALIDATION_INFERENCE.md) were validated on the curve before the session-20 training
    # refit; the catalog keeps that curve for serving until serving is revalidated on the new one.
    serving_matmul_efficiency: float = 0.0
    # The board power the datasheet rates the part at (W; 0: unknown), and the power limit its GPUs
    # run at where a cluster file or a profile says it is set lower (W; 0: the default, the rated
    # power). Under a lower limit a GPU sustains lower clocks in dense math than the datasheet peaks
    # assume: priced where a measured curve of throughput against the limit is on file for the part
    # (``costmodel.power``: the H100 SXM5's), in ``rate``; a prediction on such GPUs, with no measured
    # profile behind it, carries a warning either way (``costmodel.ceilings.power_flag``).
    tdp_w: float = 0.0
    power_limit_w: float = 0.0
    # The part's sustained tensor-core rate against the datasheet peaks (``peak_flops_per_s``) as its
    # generation's curve (``matmul_efficiency``) prices them: 1.0 for every part but one whose same-settings
    # runs show it faster than a sibling with equal peaks (GB300, whose 1,400 W hold a higher clock than
    # GB200's 1,200 W: the catalog's gb300-nvl72 says with which source). It scales the time of compute-bound
    # work (GEMMs, attention: ``rate``), not the peaks MFU is counted on, nor HBM-bound work.
    clock_factor: float = 1.0

    def __post_init__(self) -> None:
        check_types(self, f"gpu {describe(self.name)}", SpecError)
        _positive(f"gpu {self.name!r}", memory_bytes=self.memory_bytes,
                  hbm_bandwidth_bytes_per_s=self.hbm_bandwidth_bytes_per_s)
        if not self.peak_flops_per_s:
            raise SpecError(f"gpu {self.name!r}: peak_flops_per_s needs at least one dtype")
        for k, v in self.peak_flops_per_s.items():
            bad = type_problem("str", k) or type_problem("float", v) or range_problem(v, (0, MAX_FLOPS, True))
            if bad:
                raise SpecError(f"gpu {self.name!r}: peak FLOP/s for dtype {describe(k)} {bad}")
        if self.reserved_bytes >= self.memory_bytes:
            raise SpecError(f"gpu {self.name!r}: reserved memory {self.reserved_bytes / GIB:g} GiB leaves nothing of "
                            f"its {self.memory_bytes / GIB:g} GiB; reserved_gib must be less than memory_gib")
        if not 0 < self.matmul_efficiency <= 1:
            raise SpecError(f"gpu {self.name!r}: matmul_efficiency must be in (0, 1], got {self.matmul_efficiency}")
        if not 0 <= self.serving_matmul_efficiency <= 1:
            raise SpecError(f"gpu {self.name!r}: serving_matmul_efficiency must be in [0, 1] (0: training's), "
                            f"got {self.serving_matmul_efficiency}")
        if min(self.layer_overhead_s, self.fsdp2_block_s, self.dtensor_param_step_s, self.dtensor_tp_layer_s) < 0:
            raise SpecError(f"gpu {self.name!r}: host overheads must be >= 0, got layer {self.layer_overhead_s * 1e6:g} "
                            f"us, FSDP2 block {self.fsdp2_block_s * 1e6:g} us, DTensor parameter step "
                            f"{self.dtensor_param_step_s * 1e6:g} us, DTensor TP layer {self.dtensor_tp_layer_s * 1e6:g} us")
        check_ranges(self, f"gpu {self.name!r}", SpecError)
        if self.attention_table:
            _check_attention_table(self)

    def rate(self, dtype: str) -> float:
        """The rate compute-bound work runs at before its efficiency: the datasheet peak times the part's
        sustained ``clock_factor`` and what a power limit below its rated power leaves of it
        (``costmodel.power.power_rate_factor``: 1 where none is set or no curve is measured). Time is
        priced on it; MFU is counted on ``peak``; a measured table (fractions of the peak, the part's
        clock and power limit in them) is priced on ``peak`` (``attention_rate``, ``compute.gemm_rate``)."""
        return self.peak(dtype) * self.clock_factor * power_rate_factor(self.name, self.tdp_w, self.power_limit_w)

    def attention_rate(self, dtype: str) -> float:
        """The rate fused attention's efficiency multiplies: ``rate``, or the datasheet peak where this GPU
        carries measured attention rows (``attention_table``, fractions of the peak)."""
        return self.peak(dtype) if self.attention_table else self.rate(dtype)

    def peak(self, dtype: str) -> float:
        key = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "nvfp4": "fp4"}.get(dtype, dtype)
        if key in self.peak_flops_per_s:
            return self.peak_flops_per_s[key]
        if key in ("fp16", "bf16"):
            for alt in ("bf16", "fp16"):
                if alt in self.peak_flops_per_s:
                    return self.peak_flops_per_s[alt]
        raise SpecError(f"gpu {self.name!r} has no peak FLOP/s for dtype {dtype!r}; "
                        f"known: {', '.join(sorted(self.peak_flops_per_s))}")


# The fraction of a RoCE fabric's line rate that large collectives reach when flows are spread by static
# ECMP hashing and nothing mitigates the collisions (no adaptive routing, one queue pair per connection,
# NCCL's default NCCL_IB_QPS_PER_CONNECTION=1; a fabric whose files spread each connection over several queue
# pairs, as Megatron-Kwai's set 8, keeps the catalog's value):
# 0.70. Sources (read by a helper of stop 41, /work/research/roce_scale.md, outside the repository): Baidu's
# AIPod note (2024-07-03, "彻底解决网络哈希冲突"), ECMP hash collisions cut a 100 Gb/s link to about 70 Gb/s
# (A800, 8 rails; rising to about 95% with more queue pairs, ToR affinity and dynamic load balancing);
# NVIDIA's "just 60% data throughput" for standard Ethernet (vendor claim); Meta's production RoCE
# (SIGCOMM'24), up to 40% better all-reduce with enhanced ECMP and queue-pair scaling than with plain ECMP.
# The range they give for 32-128 nodes is 60-75%; Baidu's 70% is the one measured per-link figure, and is
# taken. InfiniBand with adaptive routing reaches 92-96% (NVIDIA maintainers: 192 of 200 GB/s on a DGX A100,
# 46-49 of 50 GB/s per NDR NIC), whose 0.9 the catalog's links keep. Not node-count dependent: no source gives
# a curve, and a job inside one leaf switch sees no ECMP at all, which this overprices. Set, with the source,
# in the calibration cluster files of fabrics published as RoCE or RDMA over Ethernet
# (``tests/test_cluster_files.py`` holds them to it); chosen in stop 43 after seeing that the three families
# on such fabrics (internlm, megatron-llama, skywork) were all predicted too fast at 256-1,024 GPUs.
ROCE_ECMP_EFFICIENCY = 0.70


# The catalog's inter-node links that are RDMA fabrics, by name prefix: InfiniBand (ib-*), ConnectX-7/8
# NICs (cx7-*, cx8-*: InfiniBand or RoCE) and RoCE (roce-*). Ethernet without RDMA (eth-*) is not.
RDMA_LINK_PREFIXES = ("ib-", "cx7", "cx8", "roce")


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A tier of the interconnect, per GPU per direction."""
    __hash__ = _cached_hash

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float = 5 * US
    # fraction of the link a well-tuned collective reaches at large messages
    # (NCCL bus bandwidth / link bandwidth)
    efficiency: float = 0.8
    # 0: a switched link (NVSwitch, a network): a GPU reaches any peer at the full rate. N > 0: a
    # direct mesh of N peers with no switch (an HGX 4-GPU board: 3 peers, 6 NVLink 4 links each),
    # where ``bandwidth_bytes_per_s`` is the GPU's total over its N links, each pair sharing 1/N
    # of it: ``mesh_share`` says what a group uses
    mesh_peers: int = 0

    def __post_init__(self) -> None:
        check_types(self, f"link {describe(self.name)}", SpecError)
        _positive(f"link {self.name!r}", bandwidth_bytes_per_s=self.bandwidth_bytes_per_s)
        if self.latency_s < 0 or not 0 < self.efficiency <= 1:
            raise SpecError(f"link {self.name!r}: latency_s must be >= 0 and efficiency in (0, 1]")
        check_ranges(self, f"link {self.name!r}", SpecError)

    @property
    def effective_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency

    def mesh_share(self, members: int) -> float:
        """The fraction of the link's rate a collective among ``members`` GPUs on it moves at: 1
        on a switched link; on a direct mesh of ``mesh_peers`` peers, each member sends to its
        ``members - 1`` peers over as many links, so ``min(members - 1, mesh_peers) / mesh_peers``
        (NCCL lays its rings over distinct links: a ring's send to one neighbour, one pair's link,
        is ``1 / mesh_peers``; channels laid over the other links of a 4-GPU mesh reach them all)."""
        if not self.mesh_peers or members <= 1:
            return 1.0
        return min(members - 1, self.mesh_peers) / self.mesh_peers

    @property
    def rdma(self) -> bool:
        """Whether the link is an RDMA fabric (GPU-initiated RDMA, what DeepEP's internode kernels
        need: ``costmodel.moe.deepep_fabric_problem``), by the catalog's name prefixes
        (``RDMA_LINK_PREFIXES``)."""
        return self.name.startswith(RDMA_LINK_PREFIXES)


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """Identical nodes: ``nodes`` hosts of ``gpus_per_node`` GPUs, joined by ``intra_node``
    within an NVLink domain of ``nvlink_domain`` GPUs.

    The host (``gpus_per_node``: what one launcher process group, one ``torchrun`` node, holds)
    and the NVLink domain (the GPUs one GPU reaches over ``intra_node``) are the same on an
    8-GPU HGX/DGX board; on a GB200/GB300 NVL72 rack the domain is 72 GPUs over 18 hosts of 4.
    A domain is whole hosts; a job may use part of one (``nvlink_gpus``)."""
    __hash__ = _cached_hash

    name: str
    gpu: GpuSpec
    gpus_per_node: int
    nodes: int
    intra_node: LinkSpec
    nvlink_domain: int = 0           # GPUs in one NVLink domain; 0: the host (stays 0 under replace())

    def __post_init__(self) -> None:
        check_types(self, f"node group {describe(self.name)}", SpecError)
        _positive(f"node group {self.name!r}", gpus_per_node=self.gpus_per_node, nodes=self.nodes)
        check_ranges(self, f"node group {self.name!r}", SpecError)
        if self.nvlink_domain == self.gpus_per_node:
            object.__setattr__(self, "nvlink_domain", 0)        # one spelling of "the host" (hash, equality)
        if self.nvlink_domain % self.gpus_per_node:
            raise SpecError(f"node group {self.name!r}: nvlink_domain {self.nvlink_domain} must be a whole number of "
                            f"hosts of gpus_per_node {self.gpus_per_node} (e.g. NVL72: nvlink_domain 72, "
                            f"gpus_per_node 4)")
        if not isinstance(self.gpu, GpuSpec) or not isinstance(self.intra_node, LinkSpec):
            raise SpecError(f"node group {self.name!r}: gpu must be a GpuSpec and intra_node a LinkSpec")
        if self.gpus > MAX_GPUS:
            raise SpecError(f"node group {self.name!r}: {self.nodes:,} nodes x {self.gpus_per_node} GPUs = "
                            f"{self.gpus:,} GPUs, more than the {num(MAX_GPUS)} this planner handles")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def nvlink_gpus(self) -> int:
        """GPUs of this group one GPU reaches over NVLink (the intra tier of the communication
        model): the NVLink domain, or the whole group when it uses only part of one."""
        return min(self.nvlink_domain or self.gpus_per_node, self.gpus)


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Node groups joined by one inter-node network; measured tables optional.

    ``matmul_table``: rows ``(size, efficiency)``, the fraction of peak measured for a square
    GEMM of that size (the profiler fills it). ``collective_table``: rows
    ``(tier, op, group_size, bytes, busbw_bytes_per_s)``, tier ``intra`` or ``inter``.
    """
    __hash__ = _cached_hash

    name: str
    groups: tuple[NodeGroup, ...]
    inter_node: LinkSpec
    matmul_table: tuple[tuple[float, float], ...] = ()
    collective_table: tuple[tuple[str, str, int, float, float], ...] = ()
    # what overlapped communication C beside compute T still costs, as a fraction of min(C, T)
    # (0: hidden completely; 1: no better than one after the other); measured by `planner
    # profile`, else OVERLAP_SLOWDOWN
    compute_comm_slowdown: float = OVERLAP_SLOWDOWN
    source: str = "datasheet"
    # checkpoint storage (cluster file ``storage: {gb_per_s, total_gb_per_s}``): write bandwidth
    # per node and the storage's own cap; 0 -> unknown (costmodel.reliability's default, no cap)
    storage_bytes_per_s_per_node: float = 0.0
    storage_total_bytes_per_s: float = 0.0
    # failures (cluster file ``reliability: {node_mtbf_hours}``): 0 -> unknown
    node_mtbf_s: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, f"cluster {describe(self.name)}", SpecError)
        if not self.groups:
            raise SpecError(f"cluster {self.name!r}: needs at least one node group")
        if not all(isinstance(g, NodeGroup) for g in self.groups) or not isinstance(self.inter_node, LinkSpec):
            raise SpecError(f"cluster {self.name!r}: groups must be NodeGroups and inter_node a LinkSpec")
        if self.total_gpus > MAX_GPUS:
            raise SpecError(f"cluster {self.name!r}: {self.total_gpus:,} GPUs, more than the {num(MAX_GPUS)} this "
                            "planner handles")
        _check_tables(self)
        for k in ("storage_bytes_per_s_per_node", "storage_total_bytes_per_s", "node_mtbf_s"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise SpecError(f"cluster {self.name!r}: {k} must be a finite number >= 0, got {v!r}")
        if not 0 <= self.compute_comm_slowdown <= 1:
            raise SpecError(f"cluster {self.name!r}: measured.compute_comm_slowdown must be in [0, 1] (0: "
                            f"communication hides behind compute; 1: it does not), got {self.compute_comm_slowdown}")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise SpecError(f"cluster {self.name!r}: node group names repeat: {names}")
        check_ranges(self, f"cluster {self.name!r}", SpecError)

    @property
    def heterogeneous(self) -> bool:
        return len({g.gpu.name for g in self.groups}) > 1 or len(self.groups) > 1

    @property
    def measured_profile(self) -> bool:
        """Whether measurements of the user's own hardware back this cluster (a `planner profile`
        or `planner calibrate` file, or a measured GEMM table), not only datasheets: the warnings
        that say the model is unsure of the hardware (the MFU ceiling, the power limit) do not fire."""
        return self.source != "datasheet" or bool(self.matmul_table)

    @property
    def main(self) -> NodeGroup:
        return self.groups[0]

    @property
    def gpu(self) -> GpuSpec:
        return self.groups[0].gpu

    @property
    def gpus_per_node(self) -> int:
        return self.groups[0].gpus_per_node

    @property
    def nvlink_gpus(self) -> int:
        """GPUs of the first group one GPU reaches over NVLink (``NodeGroup.nvlink_gpus``)."""
        return self.groups[0].nvlink_gpus

    @property
    def intra_node(self) -> LinkSpec:
        return self.groups[0].intra_node

    @property
    @_memo
    def total_gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    def group(self, name: str) -> NodeGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"cluster {self.name!r} has no node group {name!r}; groups: "
                        f"{', '.join(g.name for g in self.groups)}")

    def with_gpus(self, n: int) -> "ClusterSpec":
        """The same hardware sized to ``n`` GPUs (homogeneous clusters only).

        Fewer GPUs than one host: one host of ``n`` GPUs. Otherwise ``n`` must fill whole
        hosts (not whole NVLink domains: 256 GPUs on NVL72 racks are 64 hosts of 4, three full
        domains and part of a fourth).
        """
        if n <= 0:
            raise SpecError(f"cluster {self.name!r}: --gpus must be > 0, got {n}")
        if len(self.groups) != 1:
            if n == self.total_gpus:
                return self
            raise SpecError(f"cluster {self.name!r} is heterogeneous ({self.total_gpus} GPUs in "
                            f"{len(self.groups)} groups); --gpus {n} must equal {self.total_gpus}")
        g = self.groups[0]
        if n < g.gpus_per_node:
            ng = dataclasses.replace(g, gpus_per_node=n, nodes=1, nvlink_domain=0)
        elif n % g.gpus_per_node:
            raise SpecError(f"--gpus {n} does not fill whole nodes of {g.gpus_per_node} GPUs on "
                            f"{self.name!r}; try {n // g.gpus_per_node * g.gpus_per_node} or "
                            f"{(n // g.gpus_per_node + 1) * g.gpus_per_node}")
        else:
            ng = dataclasses.replace(g, nodes=n // g.gpus_per_node)
        return dataclasses.replace(self, groups=(ng,))


# the kernels a measured attention table may hold: costmodel.attention's, less FlexAttention (priced
# as FA2 times its ratio, so a measured FA2 prices it)
ATTENTION_TABLE_KERNELS = tuple(k for k in ATTENTION_KERNELS if k != "flex")


def _check_attention_table(g: GpuSpec) -> None:
    """The measured attention rows: every row of the right shape, every number finite and in range."""
    for i, row in enumerate(g.attention_table):
        ok = (isinstance(row, tuple) and len(row) == 6 and row[0] in ATTENTION_TABLE_KERNELS
              and row[1] in ("fwd", "bwd") and row[2] in ("causal", "none")
              and all(not isinstance(x, bool) and isinstance(x, (int, float)) and x == x for x in row[3:]))
        if (not ok or range_problem(row[3], (0, 1024, True)) or range_problem(row[4], (0, 1e8, True))
                or range_problem(row[5], (0, 1, True))):
            raise SpecError(f"gpu {g.name!r}: attention_table[{i}]: expected [kernel ({', '.join(ATTENTION_TABLE_KERNELS)}), "
                            f"direction fwd|bwd, mask causal|none, head_dim in (0, 1024], seq_len in (0, 1e8], "
                            f"efficiency in (0, 1]], got {describe(row)}")


def _check_tables(c: "ClusterSpec") -> None:
    """The measured tables: every row of the right shape, every number finite and in range."""
    where = f"cluster {c.name!r}: measured"
    for i, row in enumerate(c.matmul_table):
        ok = isinstance(row, tuple) and len(row) == 2 and all(
            not isinstance(x, bool) and isinstance(x, (int, float)) and x == x for x in row)
        if not ok or range_problem(row[0], (0, MAX_MESSAGE_BYTES, True)) or range_problem(row[1], (0, 1, True)):
            raise SpecError(f"{where}.matmul[{i}]: expected [size > 0, efficiency in (0, 1]], got {describe(row)}")
    for i, row in enumerate(c.collective_table):
        ok = (isinstance(row, tuple) and len(row) == 5 and row[0] in ("intra", "inter") and isinstance(row[1], str)
              and isinstance(row[2], int) and not isinstance(row[2], bool)
              and all(not isinstance(x, bool) and isinstance(x, (int, float)) and x == x for x in row[3:]))
        if (not ok or range_problem(row[2], (1, MAX_GPUS, False)) or range_problem(row[3], (0, MAX_MESSAGE_BYTES, True))
                or range_problem(row[4], (0, MAX_BANDWIDTH, True))):
            raise SpecError(f"{where}.collectives[{i}]: expected tier intra|inter, an op, group_size >= 1, bytes > 0 "
                            f"and a bus bandwidth > 0, got {describe(row)}")


# --------------------------------------------------------------------------------------
# Workload and parallel configuration
# --------------------------------------------------------------------------------------

RECOMPUTE = ("none", "selective", "full")
# Megatron-Core's selective recompute modules this project prices (``--recompute-modules``;
# TransformerConfig.recompute_modules at NVIDIA/Megatron-LM d98e8a64, transformer_config.py ~560:
# "core_attn", "mlp", "moe" and "shared_experts" checkpoint the module, "moe_act", "layernorm" and
# "mla_up_proj" discard its output and recompute it before the backward; costmodel.layers LayerCost.modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# Megatron-Core's fine-grained activation offloading (--offload-modules; TransformerConfig.offload_modules at
# d98e8a64): the modules this project prices, the routed experts' pair NVIDIA's MoE recipes offload
# (costmodel.layers offload_bytes); its others (attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm,
# fused_group_mlp) are refused by name
OFFLOAD_MODULES = ("expert_fc1", "moe_act")
MEGATRON_OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                            "fused_group_mlp")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
TRAINING_DTYPES = ("bf16", "fp16", "fp32", "fp8", "nvfp4")
# training dtypes whose linear GEMMs run quantized under a recipe (costmodel.fp8), everything else in BF16:
# FP8 (``Workload.fp8_recipe``) and NVFP4 (Transformer Engine's NVFP4BlockScaling, its own recipe)
LOW_PRECISION_DTYPES = ("fp8", "nvfp4")


def low_precision(dtype: str) -> bool:
    """Whether training in ``dtype`` runs its linear GEMMs under a quantization recipe (``LOW_PRECISION_DTYPES``)."""
    return dtype in LOW_PRECISION_DTYPES
TRAINING_REFUSED_DTYPES = ("int8", "int4")     # serving-only weight formats
# FP8 training recipes (costmodel/fp8.py): Transformer Engine's delayed and current per-tensor
# scaling, Blackwell's MXFP8, DeepSeek-V3's blockwise, torchao's tensorwise and rowwise dynamic scaling
FP8_RECIPES = ("delayed", "current", "mxfp8", "blockwise", "tensorwise", "rowwise")


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What is run: the data stream is a function of this alone (batch, length, seed)."""
    __hash__ = _cached_hash

    global_batch: int
    seq_len: int
    mode: str = "train"
    dtype: str = "bf16"
    optimizer: str = "adamw"
    seed: int = 0
    # the attention kernel: flash (fused, causal, no s x s scores kept) or materialized
    # (scores and softmax written to memory, as Megatron-LM before 2023)
    attention_kernel: str = "flash"
    # serving (mode == "infer"): prompt and output lengths; seq_len = prompt_len + output_len,
    # global_batch = concurrent sequences per replica
    prompt_len: int = 0
    output_len: int = 0
    kv_dtype: str = ""               # "" -> dtype
    # training with dtype fp8: the recipe ("" -> the framework's default, costmodel.fp8) and
    # whether weights are stored and all-gathered in FP8 (Megatron's --fp8-param-gather)
    fp8_recipe: str = ""
    fp8_param_gather: bool = False

    def __post_init__(self) -> None:
        check_types(self, "workload", SpecError)
        if self.fp8_recipe and self.fp8_recipe not in FP8_RECIPES:
            raise SpecError(f"workload: unknown fp8 recipe {self.fp8_recipe!r}; known: {', '.join(FP8_RECIPES)}")
        if self.dtype == "nvfp4" and (self.fp8_recipe or self.fp8_param_gather):
            raise SpecError("workload: nvfp4 training is one recipe (Transformer Engine's NVFP4BlockScaling, Megatron's "
                            "--fp4-recipe nvfp4); an fp8 recipe or FP8 parameter gather does not apply to it (drop "
                            "--fp8-recipe/--fp8-param-gather; FP4 parameter gather is not priced)")
        if (self.fp8_recipe or self.fp8_param_gather) and not (self.mode == "train" and self.dtype == "fp8"):
            raise SpecError(f"workload: an fp8 recipe is a setting of fp8 training; this workload is {self.mode} in "
                            f"{self.dtype} (use --dtype fp8 for training, or drop the recipe)")
        _positive("workload", global_batch=self.global_batch, seq_len=self.seq_len)
        if self.kv_dtype:
            dtype_bytes(self.kv_dtype)
        dtype_bytes(self.dtype)
        if self.mode not in ("train", "infer"):
            raise SpecError(f"workload: mode must be train or infer, got {self.mode!r}")
        if self.optimizer not in ("adamw", "adam", "sgd"):
            raise SpecError(f"workload: optimizer must be adamw, adam or sgd, got {self.optimizer!r}")
        if self.attention_kernel not in ("flash", "materialized"):
            raise SpecError(f"workload: attention_kernel must be flash or materialized, got {self.attention_kernel!r}")
        if self.mode == "train" and self.dtype.lower() in TRAINING_REFUSED_DTYPES:
            raise SpecError(f"workload: training in {self.dtype} is not supported (integer weights have no gradients); "
                            f"train in {', '.join(TRAINING_DTYPES)}, or plan serving with --mode infer")
        if self.mode == "infer" and self.dtype == "nvfp4":
            raise SpecError("workload: nvfp4 is a training recipe here (Transformer Engine's NVFP4BlockScaling); serving "
                            "with 4-bit weights is priced as int4 (--dtype int4)")
        if self.mode == "train" and self.kv_dtype:
            raise SpecError(f"workload: kv_dtype {self.kv_dtype!r} is a serving setting (the KV cache); a training "
                            "workload has none")
        check_ranges(self, "workload", SpecError)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if not self.fp8_recipe and not self.fp8_param_gather:
            del d["fp8_recipe"], d["fp8_param_gather"]     # plan files without FP8 stay as they were
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "workload") -> "Workload":
        _check_keys(cls, data, where)
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Degrees and execution choices. ``tp*pp*dp*cp`` is the world size.

    Routed experts have their own layout (Megatron-Core's "MoE parallel folding", Liu et al.,
    arXiv 2504.14960, and ``megatron/core/parallel_state.py``): each stage's ``tp*cp*dp`` ranks
    are regrouped as expert tensor parallel ``etp`` (innermost) x expert parallel ``ep`` x expert
    data parallel ``expert_dp``, so ``etp*ep`` must divide ``tp*cp*dp`` (Megatron asserts
    ``world % (etp*ep*pp) == 0``). ``etp`` 0 means ``tp`` (Megatron's default for
    ``--expert-tensor-parallel-size``), and then ``ep`` divides ``dp*cp`` as before."""
    __hash__ = _cached_hash

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 0                     # expert tensor parallel; 0 -> tp
    zero: int = 1                    # 0 DDP, 1 optimizer, 2 +grads, 3 +params (FSDP)
    dp_shard: int = 0                # ZeRO shard group size; 0 -> dp; < dp -> HSDP
    sp: bool = False                 # sequence parallel (with tp > 1)
    vpp: int = 1                     # virtual stages per pipeline rank
    micro_batch: int = 1
    grad_accum: int = 1              # micro-batches per step per data-parallel replica
    recompute: str = "none"          # none | selective | full
    recompute_layers: int = -1       # with full: layers per stage recomputed; -1 -> all
    schedule: str = ""               # 1f1b | gpipe | interleaved; "" -> from vpp
    overlap_dp_comm: bool = True
    # how the MoE layers run, as the launch file sets them (``costmodel.moe``): the token
    # dispatcher ("" -> the target's: alltoall) and the expert-parallel all-to-alls overlapped
    # with another micro-batch's compute (Megatron's --overlap-moe-expert-parallel-comm)
    moe_dispatcher: str = ""
    ep_overlap: bool = False
    # with recompute "selective": the modules Megatron-Core checkpoints (--recompute-modules, in
    # RECOMPUTE_MODULES' order); () -> the framework's own selective recompute (Megatron's default
    # core_attn, torchtitan's op-level SAC). Read only under "selective" (a search's candidates carry
    # the target's set under every policy; ``to_dict`` writes it only where it is read)
    recompute_modules: tuple[str, ...] = ()
    # Megatron-Core's fine-grained activation offloading: the modules whose saved inputs go to host
    # memory in the forward and come back for the backward (--offload-modules; OFFLOAD_MODULES)
    offload_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "grad_accum"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(f"parallel: {k} must be an integer >= 1, got {describe(v)}")
        check_types(self, "parallel", SpecError)
        if self.zero not in (0, 1, 2, 3):
            raise SpecError(f"parallel: zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise SpecError(f"parallel: recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.dp_shard == 0:
            object.__setattr__(self, "dp_shard", self.dp)
        if self.etp == 0:
            object.__setattr__(self, "etp", self.tp)
        if not isinstance(self.etp, int) or isinstance(self.etp, bool) or self.etp < 1:
            raise SpecError(f"parallel: etp must be an integer >= 1 (0 means tp), got {describe(self.etp)}")
        if self.dp_shard < 1 or self.dp % self.dp_shard:
            raise SpecError(f"parallel: dp_shard {self.dp_shard} must divide dp {self.dp}")
        if not self.schedule:
            object.__setattr__(self, "schedule", "interleaved" if self.vpp > 1 else "1f1b")
        if self.schedule not in SCHEDULES:
            raise SpecError(f"parallel: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.schedule != "interleaved" and self.vpp > 1:
            raise SpecError(f"parallel: vpp {self.vpp} > 1 needs the interleaved schedule, got {self.schedule!r}")
        if self.sp and self.tp == 1:
            object.__setattr__(self, "sp", False)
        if self.moe_dispatcher not in ("",) + MOE_DISPATCHERS:
            raise SpecError(f"parallel: moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)} (or empty: the "
                            f"target's), got {describe(self.moe_dispatcher)}")
        # each list checked and put in Megatron-Core's order, a tuple too (the search's fast copies keep a checked one)
        if self.recompute_modules != ():
            object.__setattr__(self, "recompute_modules", recompute_module_set(self.recompute_modules))
        if self.offload_modules != ():
            object.__setattr__(self, "offload_modules", offload_module_set(self.offload_modules))
        check_ranges(self, "parallel", SpecError)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """Expert data parallel: the ranks of a stage holding the same expert shard."""
        return max(1, self.tp * self.cp * self.dp // (self.etp * self.ep))

    @property
    def folded(self) -> bool:
        """Is the expert layout folded over TP (``etp != tp``)? Then EP spans TP ranks too."""
        return self.etp != self.tp

    @property
    def hsdp(self) -> bool:
        return self.dp_shard < self.dp

    def policy_recompute_layers(self, num_layers: int) -> int | None:
        """Layers of a stage of ``num_layers`` that recompute fully by the policy alone: under
        ``recompute=full`` all of them, or ``recompute_layers`` of them (Megatron-LM's
        ``--recompute-num-layers`` with the block method); ``None`` otherwise, where each stage
        gets its own count (``StageSpec.recompute_layers``, chosen by the planner under the
        stage's memory)."""
        if self.recompute != "full":
            return None
        return num_layers if self.recompute_layers < 0 else min(self.recompute_layers, num_layers)

    def full_recompute_layers(self, num_layers: int, stage_recompute_layers: int = 0) -> int:
        """Layers of a stage that recompute fully: the policy's count, else the stage's own. The
        one rule for the cost model, the solver and the runtime."""
        fixed = self.policy_recompute_layers(num_layers)
        return min(stage_recompute_layers, num_layers) if fixed is None else fixed

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.etp == self.tp:
            del out["etp"]           # the default: plan files without expert TP stay as they were
        for k in ("moe_dispatcher", "ep_overlap"):
            if not out[k]:
                del out[k]           # defaults: plan files of dense models (and alltoall MoE) unchanged
        if self.recompute == "selective" and self.recompute_modules:
            out["recompute_modules"] = list(self.recompute_modules)
        else:
            del out["recompute_modules"]     # read only under selective; plan files without it unchanged
        if self.offload_modules:
            out["offload_modules"] = list(self.offload_modules)
        else:
            del out["offload_modules"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "parallel") -> "ParallelConfig":
        _check_keys(cls, data, where)
        return cls(**data)


def _module_set(modules: Any, field: str, priced: tuple[str, ...], why_not: Callable[[Any], str]) -> tuple[str, ...]:
    """``modules`` (a plan file's list or a flag's) as the tuple ``ParallelConfig.<field>`` holds: each once, in
    ``priced``'s order (Megatron-Core's); a SpecError with ``why_not`` of the first name not in ``priced``."""
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
        raise SpecError(f"parallel: {field} must be a list of module names ({', '.join(priced)}), "
                        f"got {describe(modules)}")
    for m in modules:
        if not isinstance(m, str) or m not in priced:
            raise SpecError(f"parallel: {field}: {describe(m)}: {why_not(m)}; the modules priced: {', '.join(priced)}")
    return tuple(m for m in priced if m in modules)


def offload_module_set(modules: Any) -> tuple[str, ...]:
    """``ParallelConfig.offload_modules`` from a list (``_module_set``): OFFLOAD_MODULES only."""
    return _module_set(modules, "offload_modules", OFFLOAD_MODULES,
                       lambda m: ("Megatron-Core offloads it, but this project does not price it"
                                  if m in MEGATRON_OFFLOAD_MODULES else "not a module Megatron-Core offloads"))


def recompute_module_set(modules: Any) -> tuple[str, ...]:
    """``ParallelConfig.recompute_modules`` from a list (``_module_set``): RECOMPUTE_MODULES only."""
    return _module_set(modules, "recompute_modules", RECOMPUTE_MODULES,
                       lambda m: "not a module Megatron-Core recomputes (among those this project prices)")


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    """One pipeline stage: a contiguous block of layers, and where it runs."""

    first_layer: int
    num_layers: int
    recompute_layers: int = 0        # of these layers, how many recompute fully
    group: str = ""                  # node group that runs it ("" -> the first group)

    @property
    def last_layer(self) -> int:
        return self.first_layer + self.num_layers

    def to_dict(self) -> dict:
        return {"layers": [self.first_layer, self.last_layer], "recompute_layers": self.recompute_layers,
                "device_group": self.group}


def kv_heads_shard(model: ModelSpec, tp: int) -> bool:
    """Do ``tp`` ranks split the KV heads exactly, ``kv_heads / tp`` each (multi-latent attention
    has no KV heads to split: always)? Frameworks that shard K/V heads and never replicate them
    need this (Megatron-LM's ``divide(num_query_groups, tp)``, our runtime). The one rule."""
    return model.attention == "mla" or model.kv_heads % tp == 0


def kv_heads_fit(model: ModelSpec, tp: int) -> bool:
    """Can ``tp`` ranks hold the KV heads at all: split exactly (``kv_heads_shard``), or each of
    them replicated on ``tp / kv_heads`` ranks (vLLM, TensorRT-LLM; ``layers.kv_heads_per_rank``)?"""
    return kv_heads_shard(model, tp) or tp % model.kv_heads == 0


def tp_problems(model: ModelSpec, tp: int) -> list[str]:
    """What tensor parallelism of degree ``tp`` cannot split in ``model`` (training and serving)."""
    out = []
    if model.heads % tp:
        out.append(f"tp {tp} does not divide heads {model.heads}")
    elif not kv_heads_fit(model, tp):
        out.append(f"tp {tp} and kv_heads {model.kv_heads}: one must divide the other")
    if model.ffn_hidden % tp:
        out.append(f"tp {tp} does not divide ffn_hidden {model.ffn_hidden}")
    if model.is_moe and model.expert_ffn_hidden % tp:
        out.append(f"tp {tp} does not divide expert_ffn_hidden {model.expert_ffn_hidden}")
    return out


def ep_problems(model: ModelSpec, ep: int) -> list[str]:
    """What expert parallelism of degree ``ep`` cannot split in ``model``."""
    if ep <= 1:
        return []
    if not model.is_moe:
        return [f"ep {ep} > 1 but {model.name} has no experts"]
    if model.num_experts % ep:
        return [f"ep {ep} does not divide experts {model.num_experts}"]
    return []


def expert_layout_problems(par: ParallelConfig) -> list[str]:
    """Can a stage's ``tp*cp*dp`` ranks hold the expert layout ``etp x ep x expert_dp``? The one
    rule (Megatron-Core's ``world % (etp*ep*pp) == 0``, ``parallel_state.initialize_model_parallel``);
    with ``etp == tp`` it is the old ``ep`` divides ``dp*cp``. Folding EP over TP needs sequence
    parallelism when ``tp > 1`` (Megatron-LM asserts it for MoE with TP: each TP rank routes its
    own share of the tokens)."""
    out = []
    stage = par.tp * par.cp * par.dp
    if not par.folded:
        if par.ep > 1 and (par.dp * par.cp) % par.ep:
            out.append(f"ep {par.ep} must divide dp*cp = {par.dp * par.cp} (experts are spread over "
                       "data-parallel ranks); or set etp to fold EP over TP too")
        return out
    if stage % (par.etp * par.ep):
        out.append(f"etp*ep = {par.etp}*{par.ep} = {par.etp * par.ep} must divide tp*cp*dp = {stage} "
                   "(the ranks of one pipeline stage)")
    if par.tp > 1 and not par.sp:
        out.append(f"etp {par.etp} != tp {par.tp} needs sequence parallel (sp) with tp > 1")
    return out


def _shape_problems(model: ModelSpec, tp: int, ep: int) -> tuple[str, ...]:
    """``tp_problems + ep_problems``, kept on the model (validate runs for every estimate)."""
    memo = model.__dict__.setdefault("_memo_shape_problems", {})
    got = memo.get((tp, ep))
    if got is None:
        got = memo[tp, ep] = tuple(tp_problems(model, tp) + ep_problems(model, ep))
    return got


def end_slots(par: ParallelConfig, counts: Sequence[int]) -> int:
    """How many of a split's two end virtual stages it leaves to the embedding or the loss alone:
    with ``vpp > 1`` every stage holds at least ``vpp`` layers, one per virtual stage, except that
    the first stage's first virtual stage may hold only the embedding and the last stage's last
    only the loss (and the head), each stage then one layer short. Megatron-Core runs that split
    (``--pipeline-model-parallel-layout`` "E|t|...|t|L": ``PipelineParallelLayerLayout`` asks only
    that the embedding come first and the loss last; ``--account-for-embedding-in-pipeline-split``
    and ``--account-for-loss-in-pipeline-split`` say the same), as does the Zero Bubble paper's
    Megatron fork (``--allow-padding-num-layers``, one layer per virtual stage). The one rule for
    the estimate, the plan check and the targets; 0 when the split has no such slot."""
    p, v = par.pp, par.vpp
    if p < 2 or v < 2 or len(counts) != p:
        return 0
    return int(counts[0] == v - 1) + int(counts[-1] == v - 1)


def stage_floor(par: ParallelConfig, i: int, slots: int, counts: Sequence[int]) -> int:
    """The fewest layers stage ``i`` may hold: one per virtual stage (at least one), one fewer on
    an end stage whose end virtual stage holds the embedding or the loss (``end_slots``)."""
    least = max(1, par.vpp)
    if slots and i in (0, par.pp - 1) and counts[i] == par.vpp - 1:
        return least - 1
    return least


def validate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
             gpus: int | None = None, slots: int = 0) -> None:
    """Cross-checks that need more than one spec; every message has the numbers. ``slots``: the
    end virtual stages the stage split leaves to the embedding or the loss (``end_slots``)."""
    n = cluster.total_gpus if gpus is None else gpus
    problems = []
    if par.tp * par.pp * par.dp * par.cp != n:
        problems.append(f"tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = {par.world_size}, "
                        f"but there are {n} GPUs")
    problems += _shape_problems(model, par.tp, par.ep)
    if par.folded and model.is_moe and model.expert_ffn_hidden % par.etp:
        problems.append(f"etp {par.etp} does not divide expert_ffn_hidden {model.expert_ffn_hidden}")
    if par.pp * par.vpp > model.layers + slots:
        problems.append(f"pp*vpp = {par.pp}*{par.vpp} = {par.pp * par.vpp} exceeds layers {model.layers}"
                        + (f" + {slots} end virtual stage(s) for the embedding or the loss" if slots else ""))
    problems += expert_layout_problems(par)
    if workload.seq_len % par.cp:
        problems.append(f"cp {par.cp} does not divide seq_len {workload.seq_len}")
    if par.sp and workload.seq_len // par.cp % par.tp:
        problems.append(f"sequence parallel: tp {par.tp} does not divide seq_len/cp = {workload.seq_len // par.cp}")
    if workload.mode == "train":
        per_step = par.dp * par.micro_batch * par.grad_accum
        if per_step != workload.global_batch:
            problems.append(f"dp*micro_batch*grad_accum = {par.dp}*{par.micro_batch}*{par.grad_accum} = "
                            f"{per_step}, but global_batch is {workload.global_batch}")
        if par.schedule == "interleaved" and par.pp > 1 and par.grad_accum % par.pp:
            problems.append(f"interleaved schedule: micro-batches {par.grad_accum} must be a multiple of pp {par.pp}")
    if workload.seq_len > model.max_seq_len and model.positions == "learned":
        problems.append(f"seq_len {workload.seq_len} exceeds the learned positions of {model.name} "
                        f"({model.max_seq_len})")
    problems += offload_problems(model, cluster, par)
    if problems:
        raise SpecError("impossible configuration: " + "; ".join(problems))


def offload_problems(model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig) -> list[str]:
    """Why ``par.offload_modules`` cannot be priced here: the modules offload an MoE layer's tensors, and the
    host link's speed must be known (``GpuSpec.host_link_bytes_per_s``; the catalog's Hopper and Blackwell
    systems state it)."""
    if not par.offload_modules:
        return []
    mods = ",".join(par.offload_modules)
    if not model.is_moe:
        return [f"offload_modules {mods}: they offload MoE layers' inputs and {model.name} has no experts; "
                "leave offload_modules out"]
    unknown = sorted({g.gpu.name for g in cluster.groups if g.gpu.host_link_bytes_per_s <= 0})
    if unknown:
        return [f"offload_modules {mods}: no host-link speed for {', '.join(unknown)}; give host_link_gb_per_s (a "
                "measured pinned copy, the slower direction) and host_memory_gib under the cluster file's gpu, or "
                "leave offload_modules out"]
    return []


def default_stages(layers: int, pp: int, group: str = "") -> tuple[StageSpec, ...]:
    """Even split; the remainder goes to the middle stages (the end ones carry embedding/head)."""
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:extra]:
        counts[i] += 1
    return stages_from_counts(counts, group)


def stages_from_counts(counts, group: str = "") -> tuple[StageSpec, ...]:
    """Consecutive stages holding ``counts[i]`` layers each."""
    out, first = [], 0
    for c in counts:
        out.append(StageSpec(first_layer=first, num_layers=c, group=group))
        first += c
    return tuple(out)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "SpecError", "ModelSpec", "GpuSpec", "LinkSpec", "NodeGroup", "ClusterSpec", "Workload",
    "ParallelConfig", "StageSpec", "validate", "end_slots", "stage_floor", "tp_problems", "ep_problems",
    "expert_layout_problems", "default_stages",
    "RECOMPUTE", "SCHEDULES", "ceil_div",
]
