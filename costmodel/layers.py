"""One transformer layer on one GPU for one micro-batch: FLOPs, time, communication, activations.

Everything here is per GPU (after TP/CP/EP sharding) and per micro-batch of ``b`` sequences;
``T = b * s / cp`` tokens pass through a rank. Layers of a model are of two kinds (dense-MLP and
MoE); their costs are computed once per kind and multiplied by counts per stage.

Sources, per term:
* FLOPs: Narayanan et al., SC'21, eq. 2-3 (a GEMM of m x k by k x n is 2mnk; backward is twice
  forward; attention scores add 4*s*h per token per layer forward). "Model" FLOPs count the
  full s x s score matrix as the papers do; the time uses what kernels actually compute (fused
  causal attention skips the masked half).
* Activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", MLSys'23, Sec. 4.1 (34*s*b*h + 5*a*s^2*b bytes per layer in 16-bit, of which
  10*s*b*h are replicated across TP ranks without sequence parallelism), generalised here term
  by term to GQA, SwiGLU, MLA and MoE, with dropout masks only where the model uses dropout
  and no s x s terms under fused attention (FlashAttention keeps only the softmax statistics).
* TP communication: Megatron's f/g operators (Shoeybi et al., 2019, Fig. 3): two all-reduces of
  T*h activations per layer forward and two backward; with sequence parallelism each becomes a
  reduce-scatter plus an all-gather of the same total volume (Korthikanti Sec. 4.2.2). Full
  recomputation repeats the forward ones.
* MoE (``costmodel.moe``, one function per rule): one all-to-all to dispatch and one to combine
  the T*top_k routed token copies per MoE layer forward, and the same backward (GShard, Lepikhin
  et al., 2020), at the bandwidth the framework's dispatcher reaches; with expert tensor parallel
  ``etp > 1`` the received tokens are all-gathered over the ETP group and the outputs
  reduce-scattered back (Megatron-Core's alltoall dispatcher); the expert GEMMs as grouped GEMMs
  at the busiest rank's tokens per expert; permutation and the router at the bandwidth their
  kernels reach; the dropless per-layer host sync.
* CP: ring attention (Liu et al., 2023) passes K and V around the ring, cp-1 hops forward, K, V
  and their gradients backward; it overlaps with the attention computation.
* Elementwise traffic: each stored activation is written once and read once forward
  (``ELEMENTWISE_TRAFFIC_PER_STORED_BYTE``) and twice that backward.
* FP8 training (``costmodel.fp8``): the linear GEMMs (not the router, attention or head) at the
  FP8 peak and curve (``compute.fp8_gemm_time_s``), their saved inputs at the recipe's bytes,
  the rest BF16; quantizing the GEMM inputs (and, where the recipe caches no FP8 weights, the
  weights) is HBM traffic per GEMM, forward and backward by what each recipe casts
  (``Fp8Recipe.cast_bytes``: the inputs forward, the output gradients backward); SP all-gathers
  move FP8 where the recipe does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from .attention import (DKV_BYTES_PER_KV_BYTE, RING_MERGE_KIND, TORCH_SDPA_RING_IMPLEMENTATIONS, attention_fwd_bwd_s, fp8_kernel,
                        head_dim_padding, kernel_for, kv_width_passed, ring_merge_bytes, torch_cp_exposed_s, torch_cp_step0_s)
from .comm import GroupLayout, Network, launched
from .compute import (FLASH_ATTENTION_EFFICIENCY, MEMORY_BOUND_FRACTION, fp8_gemm_time_s, gemm_time_s, matmul_efficiency,
                      memory_bound_factor, memory_time_s)
from .fp8 import COMPUTE_DTYPE as FP8_COMPUTE_DTYPE
from .fp8 import Fp8Recipe, is_blackwell, torchao_mxfp8_experts
from .host import layer_floor_s
from .matrices import Matrix, _mlp, kv_heads_per_rank, kv_width_per_rank, layer_matrices  # noqa: F401  (re-exported)
from .moe import (DEFAULT_EXECUTION, MoeExecution, dispatch_bytes, dispatch_time_s, dispatch_value_bytes,
                  expert_gemm_host_floor_s, fused_mlp_elementwise, grouped_gemm_factor, host_excess_s, host_sync_s,
                  layer_host_s, load_factor, multi_node_nvlink, permute_time_s, router_time_s)
from .scale import straggler_factor
from .specs import RECOMPUTE_MODULES, ClusterSpec, GpuSpec, LinkSpec, ModelSpec, Workload, low_precision
from .units import dtype_bytes

ELEMENTWISE_TRAFFIC_PER_STORED_BYTE = 2.0
VOCAB_PAD = 128         # Megatron-LM's --make-vocab-size-divisible-by default (per TP rank)
FP32_LOGITS_BYTES = 4   # cross-entropy upcasts the logits to fp32 (Megatron, torchtitan)
# What the embedding lookup keeps for its backward, per token: the token ids (int64) its gradient
# scatters by (torch's embedding_backward takes ``indices``), and under TP the vocabulary-range mask
# (bool) with which Megatron's VocabParallelEmbedding zeroes the rows other ranks own (its
# ``masked_input`` and ``input_mask``). Its output is the first layer's input, which that layer's
# norm stores (the layer's activations count it), so it is not counted again here.
EMBED_IDS_BYTES = 8
EMBED_MASK_BYTES = 1


# --------------------------------------------------------------------------------------
# The layer description training and serving share: which weight matrices a layer has, their
# shapes on one GPU, and the parameters that follows
# --------------------------------------------------------------------------------------

# (in ``costmodel.matrices``, imported above: ``layer_matrices`` and ``kv_heads_per_rank``)




# --------------------------------------------------------------------------------------
# Model FLOPs: the one definition behind every MFU this project prints (cost model, runtime)
# --------------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def layer_model_flops_per_token(model: ModelSpec, moe: bool, seq_len: int) -> float:
    """Model FLOPs of one layer's forward pass per token of a ``seq_len`` sequence: 2 per
    multiply-add of every weight matrix a token passes through (``layer_matrices`` unsharded: the
    routed experts at ``top_k / num_experts`` of their copies; no biases, norms or elementwise
    work), plus the attention core at ``4 * seq_len * score_dim`` (QK^T and AV over the *full*
    s x s score matrix, causal mask or not). That is the papers' convention: PaLM (Chowdhery et
    al. 2022, App. B: 6N + 12LHQT per token for training), Megatron-LM (Narayanan et al., SC'21,
    App.: the s/6h term of 72BsLh^2) and torchtitan's ``get_num_flop_per_token``, so our MFU
    compares with published MFUs. It is a property of the model, not of the layout: replicated
    work (the router or MLA's down-projections on every TP rank, KV heads copied when
    tp > kv_heads) is not counted again."""
    share = model.top_k / model.num_experts if moe else 0.0
    gemm = sum(2 * m.k * m.n * m.count * (share if m.role == "expert" else 1.0)
               for m in layer_matrices(model, moe, 1, 1, 1))
    return gemm + 4 * seq_len * model.score_dim


@lru_cache(maxsize=1024)
def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training model FLOPs per token: forward plus backward, 3 x forward (backward computes the
    input and the weight gradients, each as large as the forward; Narayanan et al., eq. 2), over
    every layer (``layer_model_flops_per_token``) and the output head (2 * vocab * hidden: it
    runs whether or not its matrix is tied to the embedding; the embedding lookup is no GEMM).
    The MFU of ``training.estimate`` and of ``runtime.train`` both divide this."""
    n_moe = sum(1 for i in range(model.layers) if model.is_moe_layer(i))
    fwd = (model.layers - n_moe) * layer_model_flops_per_token(model, False, seq_len) + 2 * model.vocab * model.hidden
    if n_moe:
        fwd += n_moe * layer_model_flops_per_token(model, True, seq_len)
    return 3.0 * fwd


def causal_attention_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """The part of ``model_flops_per_token``'s attention core a causal mask skips: half of the full
    s x s score matrix's 12 s score_dim per layer (forward and backward), i.e. 6 s score_dim per
    layer. Megatron-LM counts attention this way since 2025 (``num_floating_point_operations``:
    "causal mask (only half of the mask is non-zero)"); ``model_flops_per_token`` minus it is the
    work a causal run really does, which is how ``costmodel.ceilings`` compares runs whose sequences
    differ (the full count is 1.68x the causal one for Llama 3.1 8B at 131k tokens, 1-7% more at 2-4k)."""
    return 6.0 * seq_len * model.score_dim * model.layers


class LayerParams(NamedTuple):
    """Parameters of one layer on one GPU, by how they are stored and sharded."""

    matrices: float      # dense weight matrices and their biases (attention, dense MLP, shared experts)
    router: float        # the MoE router, whole on every TP rank
    experts: float       # routed experts (sharded over ep x expert_tp; ZeRO shards them separately)
    norms: float         # norm weights (and MLA's latent norms), replicated

    @property
    def total(self) -> float:
        return self.matrices + self.router + self.experts + self.norms


@lru_cache(maxsize=4096)
def layer_params(model: ModelSpec, moe: bool, tp: int, ep: int = 1, expert_tp: int | None = None) -> LayerParams:
    """One layer's parameters on one GPU, from ``layer_matrices`` (at tp = ep = 1 they sum to
    ``ModelSpec.layer_params``; a test keeps it so)."""
    mats = layer_matrices(model, moe, tp, ep, expert_tp)
    norms = 2 * model.norm_params()
    if model.attention == "mla":
        norms += model.kv_lora_rank + model.q_lora_rank       # the latents' RMSNorms
    return LayerParams(matrices=sum(m.params for m in mats if m.role == "dense"),
                       router=sum(m.params for m in mats if m.role == "router"),
                       experts=sum(m.params for m in mats if m.role == "expert"), norms=norms)


class EndsParams(NamedTuple):
    """Embedding and output-head parameters on one GPU of a stage (vocab-parallel over TP)."""

    embedding: float
    head: float
    norm: float          # the final norm, on the last stage

    @property
    def total(self) -> float:
        return self.embedding + self.head + self.norm


def ends_params(model: ModelSpec, tp: int, pp: int, first: bool, last: bool) -> EndsParams:
    """The embedding on the first stage and the output head with the final norm on the last,
    both split over TP (vocab-parallel). Tied embeddings share the embedding's matrix when one
    stage holds both; with ``pp > 1`` the last stage keeps its own copy, as Megatron-LM does."""
    emb = model.embedding_params() / tp if first else 0.0
    head = norm = 0.0
    if last:
        norm = model.norm_params()
        if not (model.tied_embeddings and pp == 1):
            head = model.vocab * model.hidden / tp
    return EndsParams(emb, head, norm)


@dataclass(frozen=True)
class LayerCost:
    """Per GPU, per micro-batch, for one layer of one kind."""

    model_flops_fwd: float      # paper convention (full score matrix); MFU: model_flops_per_token
    hw_flops_fwd: float         # same convention (Megatron's and BLOOM's published "hardware TFLOP/s"
    #                             count the full s x s too); recomputation is added on top
    fwd_s: float                # forward compute (GEMMs, attention, elementwise)
    attn_fwd_s: float           # of which the attention core (for CP overlap)
    gemm_fwd_s: float           # of which the GEMMs (for TP communication overlap)
    elementwise_fwd_s: float    # of which memory-bound
    selective_extra_s: float    # extra backward time under selective recompute
    selective_extra_flops: float
    tp_fwd_s: float             # TP collectives of one forward pass
    ep_fwd_s: float             # EP all-to-alls of one forward pass
    etp_fwd_s: float            # the dispatcher's gather / reduce-scatter over expert TP, one forward
    cp_fwd_s: float             # CP ring traffic of one forward pass (before overlap)
    act_bytes: float            # stored for backward without recompute
    act_selective_bytes: float  # stored under selective recompute (op-level: torchtitan's SAC)
    act_input_bytes: float      # stored under full recompute (the layer input)
    params: float               # parameters on this GPU (after TP/EP sharding)
    expert_params: float        # of which routed-expert parameters
    # Megatron's selective recompute (``--recompute-modules core_attn``, its default): the core
    # attention module checkpointed, its inputs Q, K, V kept (``layers.core_attn_recompute``)
    act_core_attn_bytes: float = 0.0
    core_attn_extra_s: float = 0.0
    core_attn_extra_flops: float = 0.0
    # the attention kernel's backward beyond twice its forward (``costmodel.attention``: a
    # backward of 2.5 forwards' FLOPs at its own efficiency); backward only, never recomputed
    attn_bwd_extra_s: float = 0.0
    # of ``gemm_fwd_s``, the routed experts' GEMMs (what ``costmodel.moe.ep_backward_window_s`` takes
    # out of the backward all-to-alls' overlap when the weight gradients are not delayed)
    expert_gemm_fwd_s: float = 0.0
    # Megatron-Core's selective recompute by module (``--recompute-modules``; priced in ``layer_cost``):
    # (module, bytes it no longer stores, extra backward time, extra FLOPs) for each module this
    # layer has, in ``specs.RECOMPUTE_MODULES`` order
    modules: tuple[tuple[str, float, float, float], ...] = ()
    # Megatron-Core's fine-grained activation offloading (``--offload-modules``; ``offload_bytes``):
    # (module, bytes it no longer keeps on the GPU, bytes it moves each way over the host link) per module
    # this layer has, in ``specs.OFFLOAD_MODULES`` order
    offload: tuple[tuple[str, float, float], ...] = ()
    # the TP collectives of one forward pass block by block, each beside the GEMMs next to it
    # (``_tp_blocks``): (column-parallel side's collective, its GEMMs, row-parallel side's collective,
    # its GEMM), forward times; () without TP
    tp_blocks: tuple[tuple[float, float, float, float], ...] = ()


@lru_cache(maxsize=65536)
def layer_cost(model: ModelSpec, moe: bool, workload: Workload, tp: int, cp: int, ep: int, sp: bool,
               micro_batch: int, gpu: GpuSpec, cluster: ClusterSpec, intra: LinkSpec, tp_lay: GroupLayout,
               ep_lay: GroupLayout, cp_lay: GroupLayout, kernel_efficiency: float = 1.0,
               fp8: Fp8Recipe | None = None, etp: int = 0, etp_lay: GroupLayout | None = None,
               moe_exec: MoeExecution | None = None, elementwise: str = "fused", attention: str = "",
               launch: str = "", autocast: str = "", host_op_s: float = 0.0, fp8_attention: bool = False) -> LayerCost:
    """Memoized: the solver asks for the same few layer shapes many thousands of times.
    ``kernel_efficiency``: the framework's GEMM and attention speed relative to the cluster's
    efficiency curve (``costmodel.frameworks``); ``fp8``: the FP8 recipe of an fp8 workload;
    ``etp``: expert tensor parallel (0: ``tp``), its group laid out as ``etp_lay`` (default the
    TP group's); ``moe_exec``: how the framework runs MoE layers (``costmodel.moe.MoeExecution``);
    ``elementwise``: how its memory-bound kernels run (``compute.memory_bound_factor``);
    ``attention``: the attention implementation its model code calls (``costmodel.attention``);
    ``launch``: how its host issues a dense layer's kernels (``costmodel.host``: the layer's time is
    at least the host's issue time; "" for none); ``autocast``: the layer runs the runtime's eager ops
    under autocast, its residual stream in "fp32" (fp32 parameters, no FSDP mixed precision) or in the
    compute dtype ("16-bit"); ``autocast_eager_bytes`` prices its memory-bound ops ("" for none);
    ``fp8_attention``: cuDNN's FP8 attention under the FP8 recipe (``attention.fp8_attention_factor``)."""
    net = Network(cluster, intra)
    mem_factor = memory_bound_factor(elementwise)
    dt = FP8_COMPUTE_DTYPE if low_precision(workload.dtype) else workload.dtype
    a_bytes = dtype_bytes(dt)
    lin_b = fp8.saved_input_bytes if fp8 is not None else a_bytes   # a saved linear-layer input
    t = tp
    b, s = micro_batch, workload.seq_len
    T = b * s / cp
    h = model.hidden
    flash = workload.attention_kernel == "flash"

    # ---- GEMMs (forward), from the layer's matrices -----------------------------------
    mats = 3 if model.mlp == "swiglu" else 2
    et = t if etp <= 0 else etp
    ex = moe_exec or DEFAULT_EXECUTION
    matrices = layer_matrices(model, moe, t, ep, et)
    lp = layer_params(model, moe, t, ep, et)
    params, expert_params = lp.total, lp.experts
    # the tokens a rank routes: its sequence-parallel share (the TP ranks hold copies otherwise)
    t_route = T / t if sp else T
    # the busiest expert-parallel rank's share of the routed token copies (``costmodel.moe.load_factor``)
    load = (load_factor(model.router_balance, model.router_aux_coeff, ex.capacity_factor, ep)
            if moe and not ex.forced_balance else 1.0)
    # tokens per local expert on a rank: the routed copies of its EP group's ranks, gathered over
    # the ETP group (with SP each TP rank routes its own share)
    mean_per_expert = t_route * ep * (et if sp else 1) * model.top_k / model.num_experts if moe else 0.0
    tokens_per_expert = mean_per_expert * load
    gemms = [(tokens_per_expert if mx.role == "expert" else T, mx.n, mx.k, mx.count) for mx in matrices]
    mlp_act = 0.0          # stored MLP bytes per token, TP-sharded part
    moe_extra_act = 0.0
    moe_ew_s = 0.0         # permutation, router and the host sync (costmodel.moe)
    ep_fwd_s = 0.0
    etp_fwd_s = 0.0
    if moe:
        E, k = model.num_experts, model.top_k
        fe = model.expert_ffn_hidden
        if model.shared_experts:
            fs = model.shared_expert_ffn_hidden * model.shared_experts
            mlp_act += ((mats - 1) * a_bytes + lin_b) * fs / t
        # routed copies: permuted inputs (gathered over ETP), expert intermediates (k copies of
        # each token), on the busiest rank
        mlp_act += k * load * (lin_b * h * et / t + ((mats - 1) * a_bytes + lin_b) * fe / t)
        moe_extra_act = 4 * E   # fp32 router logits per token
        inter = cluster.inter_node
        # an NVLink domain of several hosts (GB200 NVL72): the dispatchers' own measured rates there
        mnnvl = multi_node_nvlink(cluster.nvlink_gpus, cluster.gpus_per_node)
        for combine in (False, True):
            sent = dispatch_bytes(t_route, k, h, dispatch_value_bytes(a_bytes, ex, combine))
            if ep > 1:      # one collective each, with its launch cost (comm.launched)
                ep_fwd_s += launched(dispatch_time_s(sent, k, ep_lay.n, ep_lay.k, intra, inter, ex,
                                                     model.router_groups, model.router_topk_groups, load,
                                                     combine, mnnvl))
        if et > 1:
            # the received copies all-gathered over the ETP group, the outputs reduce-scattered back
            gathered = et * dispatch_bytes(t_route, k, h, a_bytes, load)
            lay = etp_lay if etp_lay is not None else tp_lay
            etp_fwd_s = launched(net.all_gather(gathered, lay)) + launched(net.reduce_scatter(gathered, lay))
        hbm = gpu.hbm_bandwidth_bytes_per_s
        moe_ew_s = (permute_time_s(hbm, t_route * load, k, h, a_bytes, ex.permute_fusion)
                    + router_time_s(hbm, t_route, E, ex.router_fusion))
    else:
        # GELU: fc1 out, fc2 in; SwiGLU: w1, w3 out, product (the fc2 / w2 input: a linear input)
        mlp_act += ((mats - 1) * a_bytes + lin_b) * model.ffn_hidden / t

    # Transformer Engine's fused grouped MLP (costmodel.moe.fused_mlp_elementwise): where it runs (MXFP8 on
    # Blackwell, a SwiGLU MLP, whole experts: Megatron-Core's GroupedMLP takes the fused path only with expert
    # TP 1), what it removes from the routed experts' elementwise traffic and casts
    fused_mlp = (moe and ex.fused_grouped_mlp and fp8 is not None and fp8.name == "mxfp8" and is_blackwell(gpu)
                 and mats == 3 and et == 1)
    fused_ew_bytes = fused_cast_f = fused_cast_b = 0.0
    if fused_mlp:
        fe_local = model.expert_ffn_hidden / et
        fused_ew_bytes, fused_cast_f, fused_cast_b = fused_mlp_elementwise(
            tokens_per_expert * model.num_experts / ep, fe_local, ((mats - 1) * a_bytes + lin_b) * fe_local,
            ELEMENTWISE_TRAFFIC_PER_STORED_BYTE, (mats - 1) * fe_local)

    # torchao's MXFP8 grouped GEMMs on the routed experts of a BF16 model (MoeExecution.fp8_experts,
    # costmodel.fp8.torchao_mxfp8_experts): the experts' GEMMs at the FP8 curve, their casts per use; every
    # other linear, the saved inputs and the collectives stay BF16; Blackwell only, else nothing is priced
    efp8 = (torchao_mxfp8_experts() if moe and fp8 is None and ex.fp8_experts == "mxfp8" and is_blackwell(gpu)
            else None)

    # the quantized GEMMs' format: the recipe's (NVFP4: "fp4"), torchao's MXFP8 experts "fp8"
    fmt = fp8.gemm_format if fp8 is not None else "fp8"

    def _time(m: float, n: float, kk: float, c: float, mx: Matrix, fp8_gemm: bool) -> float:
        if mx.role == "expert":
            # one grouped GEMM over the local experts: the dense curve at the whole problem's
            # size, slowed by the grouped kernel's factor (``costmodel.moe.grouped_gemm_factor``)
            base = (fp8_gemm_time_s(gpu, cluster, m * c, n, kk, fmt=fmt) if fp8_gemm
                    else gemm_time_s(gpu, cluster, dt, m * c, n, kk, train=True))
            # never under the host's issue time where the framework calls one GEMM per local expert
            # (``costmodel.moe.expert_gemm_host_floor_s``)
            return max(base / grouped_gemm_factor(m, kk), expert_gemm_host_floor_s(c, ex.per_expert_gemms))
        if fp8_gemm:
            return fp8_gemm_time_s(gpu, cluster, m, n, kk, c, fmt)
        return gemm_time_s(gpu, cluster, dt, m, n, kk, c, train=True)

    if fp8 is None:
        gemm_s = sum(_time(m, n, kk, c, mx, efp8 is not None and mx.role == "expert")
                     for (m, n, kk, c), mx in zip(gemms, matrices))
        quant_s = 0.0
        if efp8 is not None:
            # the experts' casts, forward and backward, in forward units (a third of the total, as below)
            expert_casts = sum(efp8.cast_bytes(m, n, kk) * c for (m, n, kk, c), mx in zip(gemms, matrices)
                               if mx.role == "expert")
            quant_s = memory_time_s(gpu, expert_casts / 3.0) * mem_factor
    else:
        # the router is a plain (BF16) linear in Megatron and torchtitan alike
        lin = [g for g, mx in zip(gemms, matrices) if mx.role != "router"]
        gemm_s = sum(_time(m, n, kk, c, mx, mx.role != "router") for (m, n, kk, c), mx in zip(gemms, matrices))
        # each GEMM's casts, forward and backward (``Fp8Recipe.cast_bytes``), in forward units (the
        # layer counts its backward twice: a third of the total)
        cast_bytes = sum(fp8.cast_bytes(m, n, kk) * c for m, n, kk, c in lin)
        if fused_mlp:
            # the fused grouped MLP quantizes FC2's input and FC1's output gradient in the GEMMs'
            # epilogues (costmodel.moe.fused_mlp_elementwise)
            cast_bytes -= (fused_cast_f + fused_cast_b) * fp8.cast_bytes_per_value()
        quant_s = memory_time_s(gpu, cast_bytes / 3.0) * mem_factor
    # the routed experts' part of it (costmodel.moe.ep_backward_window_s)
    expert_gemm_s = sum(_time(m, n, kk, c, mx, fp8 is not None or efp8 is not None)
                        for (m, n, kk, c), mx in zip(gemms, matrices) if mx.role == "expert")
    if kernel_efficiency != 1.0:
        gemm_s /= kernel_efficiency
        expert_gemm_s /= kernel_efficiency
    # FLOPs at the mean share of the routed tokens (the busiest rank's excess is time, not work)
    gemm_flops = sum(2 * (m / load if mx.role == "expert" else m) * n * kk * c
                     for (m, n, kk, c), mx in zip(gemms, matrices))

    # ---- attention core ------------------------------------------------------------------
    score = model.score_dim / t                     # per-token QK^T+AV width on this GPU
    attn_model_flops = 4 * T * s * score            # full s x s (paper convention)
    causal = 0.5 if flash else 1.0                  # fused causal kernels skip the masked half
    attn_hw_flops = attn_model_flops * causal
    hd = model.head_dim
    kernel = kernel_for(attention, gpu) if flash else ""
    if fp8_attention and fp8 is not None:
        # Transformer Engine's FP8 dot-product attention: cuDNN's FP8 kernel, MXFP8 or per-tensor scaled as the
        # recipe is (costmodel.attention.fp8_attention_factor); other kernels have none
        kernel = fp8_kernel(kernel, "mxfp8" if fp8.name == "mxfp8" else "fp8")
    attn_bwd_extra_s = 0.0
    torch_cp_overlap_s = -1.0       # PyTorch's all-gather K/V exchange, when it runs (below)
    if kernel:
        # the kernel's published curve by head dim, keys per block, mask and direction, over the
        # ring's blocks under CP (costmodel.attention); the forward is the forward, and what its
        # backward takes beyond the "twice the forward" the layer's compute counts is added apart
        # batch x heads on this rank: the kernels' grid (costmodel.attention.grid_factor)
        pairs = b * model.heads / t
        attn_s, attn_bwd_s = attention_fwd_bwd_s(kernel, gpu, gpu.attention_rate(dt), attn_hw_flops, hd, s, cp, pairs)
        # the head widths the kernel pads (FlexAttention's power-of-two tiles: MLA's 192)
        pad_f, pad_b = head_dim_padding(kernel, model.qk_head_width, model.v_head_width)
        attn_s *= pad_f
        attn_bwd_s *= pad_b
        # the ring's own merges and buffer copies under CP (costmodel.attention.ring_merge_bytes)
        q_width = model.heads * hd / t
        kv_w = kv_width_passed(attention, q_width, kv_width_per_rank(model, t))
        merge_f, merge_b = ring_merge_bytes(attention, T, q_width, kv_w, cp, fused=kernel.startswith("cudnn"))
        if merge_f or merge_b:
            frac = 1.0 / MEMORY_BOUND_FRACTION[RING_MERGE_KIND][0]
            attn_s += memory_time_s(gpu, merge_f) * frac
            attn_bwd_s += memory_time_s(gpu, merge_b) * frac
        if cp > 1 and attention in TORCH_SDPA_RING_IMPLEMENTATIONS:
            # PyTorch's ring gathers K and V once and waits for them after step 0; the gradients'
            # last hop waits at the backward's end (costmodel.attention.torch_cp_exposed_s)
            kv_passed_bytes = T * 2 * kv_w * a_bytes
            torch_gather_s = launched(net.all_gather(cp * kv_passed_bytes, cp_lay))
            dkv_s = launched(net.p2p(DKV_BYTES_PER_KV_BYTE * kv_passed_bytes, cp_lay.crosses_nodes, cp))
            step0_f, step0_b = torch_cp_step0_s(kernel, gpu, gpu.attention_rate(dt), attn_hw_flops, hd, s, cp, pairs)
            step0_f, step0_b = step0_f * pad_f, step0_b * pad_b
            exp_f, exp_b = torch_cp_exposed_s(torch_gather_s, dkv_s, step0_f, step0_b)
            attn_s += exp_f
            attn_bwd_s += exp_b
            # what runs beside step 0 (the CP traffic stage_terms overlaps with the attention)
            torch_cp_overlap_s = min(torch_gather_s, step0_f)
        attn_bwd_extra_s = attn_bwd_s - 2 * attn_s
    else:
        attn_eff = matmul_efficiency(gpu, cluster, T, s * causal, hd)
        if flash:
            attn_eff *= FLASH_ATTENTION_EFFICIENCY
        attn_s = attn_hw_flops / (gpu.attention_rate(dt) * attn_eff * kernel_efficiency)

    # ---- activations (bytes per token stored for backward) -----------------------------
    heads_local = model.heads / t
    replicated = 2 * h * a_bytes            # inputs of the two norms
    replicated += 2 * h * lin_b             # QKV input (attn norm out) + MLP input (mlp norm out)
    if model.dropout:
        replicated += 2 * h                 # two 1-byte dropout masks after the projections
    kv_width = kv_width_per_rank(model, t)
    sharded = a_bytes * (model.q_dim / t + 2 * kv_width)           # Q, K, V
    sharded += lin_b * model.attn_out_dim / t                     # output-projection input
    sharded += mlp_act + moe_extra_act
    if model.attention == "mla":
        sharded += lin_b * (model.kv_lora_rank + (model.q_lora_rank or 0))     # latent inputs
    scores = 0.0
    if not flash:
        scores = heads_local * s * (2 * a_bytes + (1 + a_bytes if model.dropout else 0))  # softmax (+mask, dropout out)
    else:
        scores = heads_local * 4                                   # softmax log-sum-exp, fp32
    rep = replicated / t if sp else replicated
    act_per_token = rep + sharded + scores
    # a dense layer of this project's runtime under autocast: its saved tensors and eager ops are
    # counted from its code (autocast_saved_bytes, autocast_eager_bytes)
    runtime_eager = bool(autocast) and not moe and a_bytes < 4
    if runtime_eager:
        # what the runtime's eager ops under autocast save, counted from its code (autocast_saved_bytes)
        act_per_token = autocast_saved_bytes(model, t, a_bytes, sp)
    act_bytes = T * act_per_token
    if flash:
        # Fused attention already recomputes its scores, so "selective" means op-level selective
        # checkpointing (torchtitan's policy: keep the outputs of every other matmul and of the
        # attention kernel, recompute the rest): about half the stored activations.
        act_sel = 0.5 * act_bytes
    else:
        # Megatron's selective recompute: drop the s x s terms, recompute the attention core
        act_sel = T * (rep + sharded + heads_local * 4)
    # the layer's input, in the residual stream's dtype (fp32 under the runtime's autocast at dp 1)
    act_input = T * h * (4.0 if runtime_eager and autocast == "fp32" else a_bytes) / (t if sp else 1)
    if flash:
        act_core, core_s, core_flops = core_attn_recompute(act_bytes, T * scores, attn_s, attn_hw_flops)
    else:   # unfused attention: Megatron's selective recompute is the rule above
        act_core = act_sel

    # ---- elementwise (memory-bound) time ----------------------------------------------
    if runtime_eager:
        # the runtime's own eager ops, counted from its code, at the measured eager pointwise fraction
        # (autocast_eager_bytes), in place of the rule below
        ew_s = (memory_time_s(gpu, T * autocast_eager_bytes(model, t, a_bytes, autocast == "fp32"))
                / EAGER_POINTWISE_FRACTION + quant_s)
    else:
        ew_bytes = ELEMENTWISE_TRAFFIC_PER_STORED_BYTE * act_bytes
        if not flash:
            # the s x s scores are not "written once, read once" per stored byte: their kernels' own
            # traffic, in forward units (``score_traffic_bytes``), replaces that rule's share for them
            ew_bytes += T * (heads_local * s * score_traffic_bytes(a_bytes, model.dropout)
                             - ELEMENTWISE_TRAFFIC_PER_STORED_BYTE * scores)
        ew_s = memory_time_s(gpu, ew_bytes - fused_ew_bytes) * mem_factor + moe_ew_s + quant_s
    # a host-bound device's fixed cost per layer (GpuSpec.layer_overhead_s: forward + backward,
    # backward counted as twice the forward like the compute)
    # the slowest of the job's ranks sets the pace (costmodel.scale); CPU devices (a measured
    # host floor, GpuSpec.layer_overhead_s) are the runtime's own test rigs and keep their measurement
    straggler = _straggler(gpu, cluster)
    fwd_s = (gemm_s + attn_s + ew_s) * straggler
    if not moe and launch and not gpu.layer_overhead_s:
        # the host's issue time floors a dense layer (costmodel.host; MoE layers are host-paced by
        # costmodel.moe's rule below, CPU devices by their measured overhead)
        fwd_s = layer_floor_s(fwd_s, model, launch, host_op_s)
    fwd_s += gpu.layer_overhead_s / 3
    attn_bwd_extra_s *= straggler
    if moe:
        # the dropless token-count sync, once per layer forward (compute counts 3 forwards)
        fwd_s += host_sync_s(ex.dropless) / 3

    # selective recompute: the attention core (and its memory traffic) again in backward
    if flash:
        # op-level SAC: every other matmul's forward and the elementwise ops run again
        sel_extra_s = 0.5 * gemm_s + ew_s
        sel_extra_flops = 0.5 * gemm_flops
    else:
        sel_extra_s = attn_s + memory_time_s(gpu, T * heads_local * s * score_traffic_bytes(
            a_bytes, model.dropout, forward_only=True)) * mem_factor
        sel_extra_flops = attn_model_flops

    # ---- communication of one forward pass ---------------------------------------------
    tp_bytes = T * h * a_bytes
    # two blocks (attention, MLP), each one all-reduce, or with SP one all-gather + one reduce-scatter;
    # every collective with its launch cost (comm.launched, as serving prices it)
    tp_blocks: tuple[tuple[float, float, float, float], ...] = ()
    if t <= 1:
        tp_fwd_s = 0.0
    elif sp:
        # Transformer Engine all-gathers the quantized input of the column-parallel GEMM; an MoE
        # layer's MLP block moves its tokens in the dispatcher instead (the ETP gather above)
        ag_bytes = T * h * fp8.copy_bytes if fp8 is not None and fp8.tp_gather_fp8 else tp_bytes
        ag_s, rs_s = launched(net.all_gather(ag_bytes, tp_lay)), launched(net.reduce_scatter(tp_bytes, tp_lay))
        tp_blocks = _tp_blocks(model, moe, matrices, gemms, _time, kernel_efficiency, fp8, efp8, ag_s, rs_s)
        tp_fwd_s = sum(b[0] + b[2] for b in tp_blocks)
    else:
        ar_s = launched(net.all_reduce(tp_bytes, tp_lay))
        tp_blocks = _tp_blocks(model, moe, matrices, gemms, _time, kernel_efficiency, fp8, efp8, 0.0, ar_s,
                               dense_mlp_block=True)
        tp_fwd_s = sum(b[0] + b[2] for b in tp_blocks)
    kv_bytes = T * 2 * kv_width * a_bytes
    cp_fwd_s = launched(net.p2p(kv_bytes, cp_lay.crosses_nodes, cp), cp - 1) if cp > 1 else 0.0
    if torch_cp_overlap_s >= 0:
        # PyTorch's CP moves K and V by one all-gather, not the ring: its part beside step 0 (the
        # rest is in the attention time above)
        cp_fwd_s = torch_cp_overlap_s

    if moe and ex.layer_host_s > 0:
        # a host-paced layer: the host's issue time beyond the layer's GPU time (compute three
        # forwards, the EP/ETP/TP collectives forward and backward), spread over the compute
        local = model.num_experts / ep
        gpu_layer = 3 * fwd_s + attn_bwd_extra_s + 2 * (ep_fwd_s + etp_fwd_s + tp_fwd_s)
        fwd_s += host_excess_s(gpu_layer, layer_host_s(ex.layer_host_s, local, ex.per_expert_gemms)) / 3

    # ---- Megatron-Core's selective recompute by module (LayerCost.modules) -------------------
    def _rerun(names: tuple[str, ...]) -> tuple[float, float]:
        """The forward of the named matrices again: time (with FP8's casts, forward share) and FLOPs."""
        t_s = fl = casts = 0.0
        for (m, n, kk, c), mx in zip(gemms, matrices):
            if mx.name not in names:
                continue
            low = (fp8 is not None and mx.role != "router") or (efp8 is not None and mx.role == "expert")
            t_s += _time(m, n, kk, c, mx, low) / kernel_efficiency
            fl += 2 * (m / load if mx.role == "expert" else m) * n * kk * c
            rec = fp8 if fp8 is not None and mx.role != "router" else efp8 if low else None
            if rec is not None:
                casts += rec.cast_bytes(m, n, kk) * c / 3.0
        return t_s + memory_time_s(gpu, casts) * mem_factor, fl

    def _ew_again(traffic: float) -> float:
        return memory_time_s(gpu, traffic) * mem_factor

    # a BF16 read, a quantized write (its scales not counted): a linear's input cast again
    cast_extra = (a_bytes + fp8.value_bytes) if fp8 is not None else 0.0
    rep_div = t if sp else 1
    tp_block_s = tp_fwd_s / 2 if t > 1 else 0.0       # one block's TP collectives (attention, MLP)
    mods: list[tuple[str, float, float, float]] = [
        ("core_attn", act_bytes - act_core, (core_s if flash else sel_extra_s),
         (core_flops if flash else sel_extra_flops))]
    if moe:
        # the routed experts' activation (SwiGLU or GELU) output, FC2's input, dropped and recomputed from
        # FC1's output, which its backward keeps anyway (with FP8, FC2 saves the original input: cast again);
        # Megatron-Core takes moe_act only with --moe-grouped-gemm, which the Megatron file writes for MoE
        copies = T * model.top_k * load / t
        saved = copies * lin_b * model.expert_ffn_hidden
        again = _ew_again(copies * model.expert_ffn_hidden * (mats * a_bytes + cast_extra))
        mods.append(("moe_act", saved, again * straggler, 0.0))
    # norms that are modules of their own in Megatron-Core's Transformer Engine layer spec
    # (gpt_layer_specs.py): MLA's input norm and an MoE layer's pre-MLP norm; the others are fused into
    # the next linear (TELayerNormColumnParallelLinear), where "layernorm" drops nothing
    norms = (1 if model.attention == "mla" else 0) + (1 if moe else 0)
    if norms:
        per = T * norms * h / rep_div
        mods.append(("layernorm", per * lin_b, _ew_again(per * (2 * a_bytes + cast_extra)) * straggler, 0.0))
    if model.attention == "mla":
        # the up-projections' outputs (Q, K, V) dropped, the up-projections and RoPE run again
        saved = T * a_bytes * (model.q_dim / t + 2 * kv_width)
        g_s, g_fl = _rerun(("q_up", "kv_up"))
        mods.append(("mla_up_proj", saved, (g_s + _ew_again(saved)) * straggler, g_fl))
    if not moe:
        # the dense MLP checkpointed (its input kept): its fused norm's output and its activations dropped
        saved = T * (mlp_act + h * lin_b / rep_div)
        g_s, g_fl = _rerun(("mlp_in", "mlp_out"))
        mods.append(("mlp", saved, (g_s + _ew_again(ELEMENTWISE_TRAFFIC_PER_STORED_BYTE * saved)) * straggler
                     + tp_block_s, g_fl))
    if moe:
        # the whole MoE layer checkpointed: router, dispatch, experts and combine again
        saved = T * (mlp_act + moe_extra_act)
        g_s, g_fl = _rerun(("router", "expert_in", "expert_out", "shared_expert_in", "shared_expert_out"))
        again = (g_s + moe_ew_s + _ew_again(ELEMENTWISE_TRAFFIC_PER_STORED_BYTE * saved)) * straggler
        mods.append(("moe", saved, again + ep_fwd_s + etp_fwd_s + (tp_block_s if model.shared_experts else 0.0),
                     g_fl))
    if moe and model.shared_experts:
        fs = model.shared_expert_ffn_hidden * model.shared_experts
        saved = T * ((mats - 1) * a_bytes + lin_b) * fs / t
        g_s, g_fl = _rerun(("shared_expert_in", "shared_expert_out"))
        mods.append(("shared_experts", saved, (g_s + _ew_again(ELEMENTWISE_TRAFFIC_PER_STORED_BYTE * saved))
                     * straggler + tp_block_s, g_fl))

    # ---- Megatron-Core's fine-grained activation offloading (offload_bytes) -----------------------
    offload = offload_bytes(model, T, t, et, load, lin_b, a_bytes, mats, fp8) if moe else ()

    model_flops_fwd = gemm_flops + attn_model_flops
    return LayerCost(
        model_flops_fwd=model_flops_fwd, hw_flops_fwd=model_flops_fwd, fwd_s=fwd_s,
        attn_fwd_s=attn_s, gemm_fwd_s=gemm_s, elementwise_fwd_s=ew_s, selective_extra_s=sel_extra_s,
        selective_extra_flops=sel_extra_flops, tp_fwd_s=tp_fwd_s, ep_fwd_s=ep_fwd_s, etp_fwd_s=etp_fwd_s,
        cp_fwd_s=cp_fwd_s, attn_bwd_extra_s=attn_bwd_extra_s, expert_gemm_fwd_s=expert_gemm_s, tp_blocks=tp_blocks,
        act_bytes=act_bytes, act_selective_bytes=act_sel, act_input_bytes=act_input,
        params=params, expert_params=expert_params,
        act_core_attn_bytes=act_core, core_attn_extra_s=core_s if flash else sel_extra_s,
        core_attn_extra_flops=core_flops if flash else sel_extra_flops,
        modules=tuple(sorted(mods, key=lambda m: RECOMPUTE_MODULES.index(m[0]))), offload=offload)


# the attention matrices that read the block's gathered input (every one but the output projection; the
# multi-latent up-projections read the latents the down-projections make from it, in the same block)
_ATTN_COLUMN = ("qkv", "q", "q_down", "q_up", "kv_down", "kv_up")


def _tp_blocks(model: ModelSpec, moe: bool, matrices, gemms, time_fn, kernel_efficiency: float, fp8, efp8,
               col_s: float, row_s: float, dense_mlp_block: bool = False) -> tuple[tuple[float, float, float, float], ...]:
    """The layer's TP collectives, block by block, each with the GEMMs an overlap can run it beside: what
    a TP overlap hides is priced collective by collective against those GEMMs, not against the layer's
    GEMMs in sum (``stage_terms.layer_terms``).

    Transformer Engine's userbuffers overlap (Megatron's ``--tp-comm-overlap``) and PyTorch's
    micro-pipelined async TP both split a collective into chunks and run each chunk's transfer beside a
    chunk of the GEMM that consumes or produces it: the sequence-parallel all-gather beside the
    column-parallel GEMM that reads the gathered input (QKV, the MLP's first), the reduce-scatter beside
    the row-parallel GEMM whose partial sums it reduces (the attention output, the MLP's second), and in
    the backward the mirror pairs (Transformer Engine's ``ub_overlap_ag`` / ``ub_overlap_rs`` / bulk
    ``ub_bulk_dgrad`` / ``ub_bulk_wgrad`` options, each named for the GEMM it rides on: NVIDIA
    TransformerEngine ``transformer_engine/pytorch/module/base.py`` ``initialize_ub`` and its
    comm-GEMM-overlap example; PyTorch ``torch/distributed/_symmetric_memory`` ``fused_all_gather_matmul``
    and ``fused_matmul_reduce_scatter``, which take the one matmul the collective feeds or drains). A
    collective longer than its own GEMM is exposed by the difference, whatever the rest of the layer
    computes: with grouped-query attention the QKV GEMM is narrow (a quarter of the hidden width as
    keys and values), so its gather is the one most often longer than its GEMM; an MoE layer's
    attention collectives have only the attention's GEMMs beside them, never the experts'.

    Per block (attention; the dense MLP or the shared experts, an MoE layer's routed experts moving
    their tokens in the dispatcher): (column side's collective, the column-parallel GEMMs, row side's
    collective, the row-parallel GEMM), forward, GEMM times as ``gemm_fwd_s`` counts them (no casts, no
    straggler). With sequence parallelism the column side's collective is the all-gather and the row
    side's the reduce-scatter; without it the row side's all-reduce is the block's only forward
    collective (the column side's 0: ``col_s``), and the backward's all-reduce sits on the column side
    (``layer_terms``); an MoE layer then all-reduces its MLP block's output too (``dense_mlp_block``: two
    blocks, the second beside the shared experts' GEMMs where it has them, else beside none). The
    blocks' collectives are ``tp_fwd_s``."""
    def g(names: tuple[str, ...]) -> float:
        out = 0.0
        for (m, n, kk, c), mx in zip(gemms, matrices):
            if mx.name in names:
                low = (fp8 is not None and mx.role != "router") or (efp8 is not None and mx.role == "expert")
                out += time_fn(m, n, kk, c, mx, low)
        return out / kernel_efficiency

    cols: list[tuple[str, tuple[str, ...]]] = [("attn_out", _ATTN_COLUMN)]
    if not moe:
        cols.append(("mlp_out", ("mlp_in",)))
    elif model.shared_experts:
        cols.append(("shared_expert_out", ("shared_expert_in",)))
    elif dense_mlp_block:
        cols.append(("", ()))
    return tuple((col_s, g(col), row_s, g((row,))) for row, col in cols)


def offload_bytes(model: ModelSpec, T: float, t: int, et: int, load: float, lin_b: float, a_bytes: float, mats: int,
                  fp8: Fp8Recipe | None) -> tuple[tuple[str, float, float], ...]:
    """What Megatron-Core's fine-grained activation offloading takes off an MoE layer's GPU memory per
    micro-batch, module by module: (module, bytes the GPU no longer keeps, bytes moved to the host and
    back). Source: NVIDIA/Megatron-LM at d98e8a64 (a helper's reading, docs/notes/stop-50): each module
    offloads what autograd saves inside its span, after its forward, on a copy stream of its own
    (``fine_grained_activation_offload.py``), and reloads it for the backward one group ahead.
    ``expert_fc1``: the routed copies' FC1 input (``layer_cost``'s stored routed input); under an FP8
    recipe other than MXFP8 Megatron-Core makes FC1 save its BF16 input to offload it
    (``set_save_original_input``, experts.py ~280), so the link moves BF16 where the GPU had kept FP8.
    ``moe_act``: the activation's input, FC1's output ((mats - 1) x the expert FFN in the compute dtype),
    which the activation's backward keeps (also what its recompute checkpoint keeps)."""
    fe = model.expert_ffn_hidden
    copies = T * model.top_k * load / t
    fc1_kept = copies * lin_b * model.hidden * et
    fc1_moved = copies * (a_bytes if fp8 is not None and fp8.name != "mxfp8" else lin_b) * model.hidden * et
    act = copies * (mats - 1) * a_bytes * fe
    return (("expert_fc1", fc1_kept, fc1_moved), ("moe_act", act, act))


def recomputed_modules(selected: tuple[str, ...]) -> frozenset[str]:
    """The modules of ``selected`` (``ParallelConfig.recompute_modules``) whose savings and re-runs add up:
    "moe" checkpoints the whole MoE layer, so the "moe_act" and "shared_experts" inside it drop and re-run
    nothing more (``LayerCost.modules`` prices each module alone)."""
    names = frozenset(selected)
    return names - {"moe_act", "shared_experts"} if "moe" in names else names


def core_attn_recompute(act_bytes: float, stats_bytes: float, attn_s: float,
                        attn_hw_flops: float) -> tuple[float, float, float]:
    """(bytes stored, extra backward time, extra FLOPs) of one layer under Megatron's selective
    recompute, which checkpoints modules, not ops: ``--recompute-granularity selective`` with
    ``--recompute-modules core_attn`` (Megatron-Core ``TransformerConfig.recompute_modules``, default
    ``["core_attn"]``). ``Attention._checkpointed_attention_forward`` runs the core attention under
    ``tensor_parallel.checkpoint``: Q, K and V (its inputs) stay stored, what the core attention
    saves for its backward is dropped, and its forward runs again in backward.
    With materialized attention that drops the s x s scores, softmax and dropout (Korthikanti et al.
    2022, Sec. 5: ``layer_cost``'s unfused rule). A fused kernel (Transformer Engine's cuDNN or
    flash path, the case priced here) keeps only its softmax statistics (``stats_bytes``, FP32 per
    head and token) besides Q, K, V and the output, which the output projection keeps as its input
    anyway: that is all it drops, and the fused forward (``attn_s``) runs again. Megatron says as
    much when core_attn is set with Transformer Engine ("For fused attention, you have no need to
    set 'core_attn' to recompute", transformer_config.py)."""
    return act_bytes - stats_bytes, attn_s, attn_hw_flops


@dataclass(frozen=True)
class EndsCost:
    """Embedding (first stage) and output head + loss (last stage), per GPU per micro-batch."""

    head_fwd_s: float
    head_model_flops_fwd: float
    embed_params: float
    head_params: float
    head_act_bytes: float
    embed_act_bytes: float


def score_traffic_bytes(a_bytes: float, dropout: bool, forward_only: bool = False) -> float:
    """HBM bytes per element of the s x s score matrix that unfused (materialized) attention's
    memory-bound kernels move, per forward unit (the layer's compute counts forward + twice it
    backward, so the forward + backward total is divided by 3), or its forward alone.
    Megatron-LM's core attention (megatron/model/transformer.py CoreAttention, 2021-22): the
    scale-mask-softmax is one fused kernel (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h:
    it reads the scores and writes the probabilities, one pass; its backward reads the output
    gradient and the probabilities and writes the input gradient), then dropout (reads the
    probabilities, writes the output and a 1-byte mask; backward reads the gradient and the mask,
    writes the gradient). The QK^T output and the PV input are the batched GEMMs' own traffic."""
    fwd = 2 * a_bytes + ((2 * a_bytes + 1) if dropout else 0)
    if forward_only:
        return fwd
    bwd = 3 * a_bytes + ((2 * a_bytes + 1) if dropout else 0)
    return (fwd + bwd) / 3.0


def _straggler(gpu: GpuSpec, cluster: ClusterSpec) -> float:
    """``scale.straggler_factor`` over the cluster's GPUs (1 for CPU devices: see ``layer_cost``)."""
    return 1.0 if gpu.layer_overhead_s or gpu.name.startswith("cpu") else straggler_factor(cluster.total_gpus)


# Autocast over fp32 parameters (``FrameworkProfile.autocast_casts``): per micro-batch, each weight read in
# fp32 and written in the compute dtype once in forward (autocast's cast cache lives for one autocast
# region), and its gradient read in the compute dtype and written in fp32 once in backward. Measured on an
# H200 (bench/results/device-h200/step-*.json, the copy kernels of the profiled pass less their growth
# with the micro-batch): about 30 ms per pass for Llama-3.1-8B and 7 for GPT-3 1.3B; this rule prices
# 8.0e9 x 12 bytes and 1.3e9 x 12 bytes at the framework's forward memory-bound fraction (0.75 for the
# builtin target, stage_terms.StageModel.hbm_bytes_per_s): 30 and 5 ms. Not priced: the
# fp32 accumulation into ``.grad`` on the micro-batches after the first (12 bytes more per parameter each).
AUTOCAST_CAST_BYTES_FP32 = 4.0


# The memory-bound ops of one dense layer's forward as runtime/model.py writes them under autocast, per
# token, each op's inputs read once and outputs written once (a = the compute dtype's bytes; h hidden, q
# query width, k key/value width, f FFN width, each per TP rank but h). The residual stream is fp32 over
# fp32 parameters (the runtime at dp 1: the embedding's fp32 output), else in the compute dtype (FSDP2's
# mixed-precision policy casts the parameters): r = 4 or a bytes per value.
#   norm (autocast runs it in fp32) 8h, twice, and its input's cast (r + 4)h where r < 4; each linear
#   casts its fp32 input: 3 x (4 + a)h before Q, K and V, (4 + a)h before the MLP's first GEMM (2 x under
#   SwiGLU); the attention output's transpose copy 2aq; each residual add (2r + a)h, twice; GELU 2af, or
#   SwiGLU's SiLU 2af and product 3af; rotary (runtime.model.rope, in fp32, on q and k): the upcast
#   (a + 4), four products (4 x 4), two sums (2 x 6), the stack (8) and the cast back (4 + a): 52 + 2a
#   per value; grouped-query attention's repeat_interleave of k and v: 2 x (a k + a q).
# Backward moves about twice the forward's bytes (each op's gradient reads the output gradient and its
# saved inputs and writes the input gradient), which the compute's 3 forward units count.
# EAGER_POINTWISE_FRACTION, the fraction of the HBM bandwidth these ops reach together, forward and
# backward: fitted on GPT-3 1.3B's measured pass on an H200 (bench/results/device-h200/step-gpt3-1.3b.json:
# the growth per sequence of 2,048 tokens of the kernels that are neither GEMMs nor attention, 9.1 ms, the
# loss's share priced as ends_cost does) and held against Llama-3.1-8B's, which chose nothing (51.1 ms
# measured, 51.5 priced: +1%; tests/test_device_measurements.py recomputes both). What it stands for: the
# eager kernels themselves run near the copy bandwidth (a residual add 1.01 of it, SwiGLU's two kernels
# 0.96 of their own traffic: device_curves.json), the norms' backward reductions far below it, and the
# backward moves about twice the forward's bytes, which the rule assumes.
EAGER_POINTWISE_FRACTION = 0.69


def autocast_eager_bytes(model: ModelSpec, tp: int, a_bytes: float, fp32_residual: bool = True) -> float:
    """HBM bytes per token of one dense layer's memory-bound forward ops under the runtime's autocast,
    its residual stream in fp32 or in the compute dtype (the comment above)."""
    a = a_bytes
    r = 4.0 if fp32_residual else a
    h = model.hidden
    q = model.heads * model.head_dim / tp
    k = model.kv_heads * model.head_dim / tp
    f = model.ffn_hidden / tp
    swiglu = model.mlp == "swiglu"
    b = 2 * 8.0 * h                                   # the two norms, in fp32
    if r < 4:
        b += 2 * (r + 4) * h                          # their inputs cast to fp32
    b += (3 + (2 if swiglu else 1)) * (4 + a) * h     # the linears' input casts
    b += 2 * a * q                                    # the attention output's transpose copy
    b += 2 * (2 * r + a) * h                          # the residual adds
    b += 5 * a * f if swiglu else 2 * a * f           # the activation
    if model.positions == "rotary":
        b += (52 + 2 * a) * (q + k)
    if k < q:
        b += 2 * (a * k + a * q)                      # repeat_interleave of k and v
    return b


def autocast_saved_bytes(model: ModelSpec, tp: int, a_bytes: float, sp: bool = False) -> float:
    """Bytes per token one dense layer of the runtime saves for its backward under autocast
    (runtime/model.py as written; a = the compute dtype's bytes, widths per TP rank as
    ``autocast_eager_bytes``): each norm's fp32 input 4h (autocast runs norms in fp32, casting a 16-bit
    input up first); each linear's own cast of the norm output a*h (Q, K and V cast it separately, so
    three copies; the MLP's first GEMMs one each); the attention kernel's Q, K, V and output, K and V at
    the query width after grouped-query attention's repeat 4aq, and its log-sum-exp 4 per head; the
    output projection's input aq; GELU's input and output 2af, or SwiGLU's two GEMM outputs, SiLU's
    output and the product 4af. Rotary and the residual adds save nothing per token. Held against the
    H200's measured peaks (bench/results/device-h200/launch-*.txt; tests/test_device_measurements.py)."""
    a = a_bytes
    h = model.hidden / (tp if sp else 1)
    q = model.heads * model.head_dim / tp
    f = model.ffn_hidden / tp
    swiglu = model.mlp == "swiglu"
    b = 2 * 4.0 * h                                   # the norms' fp32 inputs
    b += (3 + (2 if swiglu else 1)) * a * h           # the linears' cast inputs
    b += 4 * a * q + 4 * model.heads / tp             # attention's Q, K, V, output and log-sum-exp
    b += a * q                                        # the output projection's input
    b += (4 if swiglu else 2) * a * f                 # the MLP's activations
    return b


# The runtime's loss (runtime.train: the logits upcast to fp32, then cross-entropy) at the start of its
# backward holds per vocabulary entry of each token the fp32 log-softmax output it saved, that output's
# gradient and the input's gradient: 12 bytes, against the 16-bit logits and their fp32 copy (a + 4) of a
# fused loss (``ends_cost``)
EAGER_LOSS_BYTES = 12.0


def grad_accum_add_bytes(params: float, compute_bytes: float, grad_bytes: float) -> float:
    """HBM bytes an unfused weight-gradient accumulation moves per micro-batch for ``params``
    parameters (``FrameworkProfile.grad_accum_fusion`` False; Megatron-LM's ``--no-gradient-accumulation-fusion``):
    the weight-gradient GEMM writes a fresh gradient in the compute dtype, and the parameter's hook
    (Megatron ``DistributedDataParallel._make_param_hook``: ``param.main_grad.add_(param.grad.data)``)
    reads it and reads and writes the gradient buffer (``grad_bytes``: fp32, or bf16 where the run
    reduces gradients in bf16). With the fusion the GEMM accumulates into the buffer itself, in its
    epilogue, at no separate pass (priced 0). The GEMM's own write is in its time either way."""
    return params * (compute_bytes + 2.0 * grad_bytes)


def autocast_cast_bytes(params: float, compute_bytes: float) -> float:
    """HBM bytes autocast moves per micro-batch for ``params`` fp32 parameters (the comment above)."""
    return 2.0 * params * (AUTOCAST_CAST_BYTES_FP32 + compute_bytes)


@lru_cache(maxsize=16384)
def ends_cost(model: ModelSpec, workload: Workload, tp: int, cp: int, sp: bool, micro_batch: int, gpu: GpuSpec,
              cluster: ClusterSpec, kernel_efficiency: float = 1.0, elementwise: str = "fused",
              vocab_pad: int = VOCAB_PAD, eager_loss: bool = False, loss_chunks: int = 1) -> EndsCost:
    """The output head stays BF16 under FP8 recipes (Megatron's output layer is not a TE module;
    torchtitan's Float8 converter skips it). The loss over the logits runs at the framework's
    memory-bound fraction (``elementwise``: ``compute.memory_bound_factor``). ``vocab_pad``: the
    framework's padding of the vocabulary per TP rank (``FrameworkProfile.vocab_pad``); ``eager_loss``:
    the loss is the runtime's eager one, whose logits hold ``EAGER_LOSS_BYTES`` at its backward's start;
    ``loss_chunks``: the loss runs over that many chunks of the tokens, each one's backward before the next
    chunk (``FrameworkProfile.loss_chunks``), so one chunk's logits are held at a time. The time is the same
    (the same FLOPs and bytes in smaller calls: not priced apart)."""
    dt = FP8_COMPUTE_DTYPE if low_precision(workload.dtype) else workload.dtype
    a_bytes = dtype_bytes(dt)
    t = tp
    T = micro_batch * workload.seq_len / cp
    V, h = model.vocab, model.hidden
    # the head's GEMM runs over the vocabulary as the framework pads it (Megatron's ``--make-vocab-size-divisible-by``
    # 128, times tp: aligned; unpadded, an odd vocabulary is priced at its alignment, ``compute.alignment_factor``);
    # the FLOPs counted stay V's
    v_rank = vocab_pad * math.ceil(V / (vocab_pad * t)) if vocab_pad > 1 else V / t
    head_s = gemm_time_s(gpu, cluster, dt, T, v_rank, h, train=True) / kernel_efficiency
    logits_bytes = T * V / t * (a_bytes + FP32_LOGITS_BYTES)
    # softmax / cross-entropy over the logits
    head_s += memory_time_s(gpu, 2 * logits_bytes) * memory_bound_factor(elementwise)
    head_s *= _straggler(gpu, cluster)
    return EndsCost(head_fwd_s=head_s, head_model_flops_fwd=2 * T * V / t * h,
                    embed_params=model.embedding_params() / t,
                    head_params=model.vocab * h / t + model.norm_params(),
                    head_act_bytes=(T * V / t * EAGER_LOSS_BYTES if eager_loss else logits_bytes) / max(1, loss_chunks),
                   embed_act_bytes=T * (EMBED_IDS_BYTES + (EMBED_MASK_BYTES if t > 1 else 0)))
