"""The rules of a training step, term by term: one layer's terms (``layer_terms``), a stage's
(``layer_sums``, ``StageModel.cost``, ``StageCost``), its exposed data-parallel time, its
micro-batches in flight and its recompute count, and the step (``pipeline_step``).
``costmodel.stage_cache`` keeps what configurations share; ``costmodel.training.estimate``
puts the stages of one configuration together.

Pipeline (Narayanan et al., SC'21, Sec. 2.2): with ``m`` micro-batches and per-micro-batch stage
times ``t_i`` (forward + backward + recompute + exposed communication), a 1F1B or GPipe step
takes ``m * max(t) + (sum(t) - max(t))`` -- for equal stages ``(m + p - 1) * t``, the bubble
fraction ``(p-1)/m`` -- and the interleaved schedule with ``v`` virtual stages divides the
fill/drain part by ``v``. Uneven stages make the slowest one the bottleneck.

Data parallel: gradients are reduced once per step (ZeRO 0: all-reduce; ZeRO 1: reduce-scatter
then an all-gather of the updated 16-bit weights; ZeRO 2 reduce-scatters after every
micro-batch's backward, as it keeps only its gradient shard), overlapped with the backward of the last
micro-batch (and the gather with the first forward); stage ``i`` of a pipeline has ``i``
backward passes of slack before the step ends. ZeRO-3/FSDP gathers weights before each forward
and backward and reduce-scatters gradients after each backward, per micro-batch, overlapped
with that micro-batch's compute; HSDP adds one all-reduce across replicas per step.

Memory: model states per ``costmodel/memory.py``; activations per ``costmodel/layers.py``
times the micro-batches in flight (1F1B: ``p - i`` on stage ``i``; interleaved: times
``1 + (p-1)/(p*v)``, Korthikanti et al. Sec. 4.2.3; GPipe: all ``m``), plus the logits on the
last stage; other = the CUDA context and library workspaces, communication buffers, ZeRO-3
prefetch buffers (two layers of gathered weights) and allocator fragmentation on top of the
activations (``costmodel.memory.stage_memory``, the one rule for a stage's peak).

Optimizer: Adam reads and writes the fp32 master weights and both moments, reads the gradient
and writes the working-precision weights (``memory.optimizer_traffic_bytes_per_param``: 30
bytes per local parameter in bf16 with fp32 gradients), bound by HBM bandwidth.

Layers that recompute fully: ``ParallelConfig.full_recompute_layers`` (the policy, or each
stage's own count); the fewest that fit a stage's memory: ``fewest_full_recompute_layers``.
Whether a stage's pipeline neighbour is on another node: ``stage_crosses``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from .comm import Network, crosses_nodes, launched
from . import fp8 as fp8_recipes
from .compute import memory_bound_factor
from .fsdp import fsdp2_copy_bytes
from .frameworks import TP_OVERLAP_MODES, FrameworkProfile, backend_profile, framework_profile
from .layers import EndsCost, LayerCost, autocast_cast_bytes, ends_params, grad_accum_add_bytes, recomputed_modules
from .matrices import layer_matrices
from .memory import DDP_BUCKET_BYTES, activations_in_flight, stage_memory, zero_divisors
from .moe import HOST_SYNC_S, ep_backward_window_s, sm_share_overlap_s
from .scale import GRAD_NORM_READS
from .specs import ClusterSpec, NodeGroup, ParallelConfig, Workload, low_precision

if TYPE_CHECKING:
    from .stage_cache import _Shared


def _degrees(par: ParallelConfig) -> dict[str, int]:
    return {"pp": par.pp, "dp": par.dp, "cp": par.cp, "tp": par.tp}


def stage_crosses(cluster: ClusterSpec, par: ParallelConfig, order: tuple[str, ...], groups: list[str] | None,
                  i: int) -> bool:
    """Does stage ``i``'s pipeline neighbour sit on another node? Yes when the neighbour runs on
    another node group, or when the pipeline group spans nodes (``comm.crosses_nodes``). With
    ``groups`` unknown (the solver's tables, before the stages are assigned to node groups) a
    cluster of several groups counts as crossing: the slower hand-off, never the faster."""
    if par.pp == 1:
        return False
    if groups is None:
        if len(cluster.groups) > 1:
            return True
        grp = cluster.groups[0]
    else:
        grp = cluster.group(groups[i])
        nxt = groups[i + 1] if i + 1 < par.pp else groups[max(0, i - 1)]
        if nxt != grp.name:
            return True
    return crosses_nodes(_degrees(par), order, "pp", grp.nvlink_gpus)


class LayerTerms(NamedTuple):
    """One layer's terms per micro-batch, which a stage multiplies by its layer counts
    (``StageModel.cost``). Backward costs twice the forward (Narayanan et al., SC'21, eq. 2)."""

    compute_s: float             # forward + backward: 3 x forward (+ the attention backward's excess)
    tp_comm_s: float             # TP collectives, forward and backward
    ep_comm_s: float             # EP all-to-alls, forward and backward
    cp_comm_s: float             # exposed CP ring traffic: backward moves K, V and their gradients
    recompute_s: float           # one more forward, with its communication (full recompute)
    model_flops: float           # forward + backward, paper convention
    hw_flops: float
    recompute_flops: float       # the extra forward of a fully recomputed layer
    selective_s: float           # extra backward time under selective recompute
    selective_flops: float
    act_selective_bytes: float   # stored under selective recompute
    act_bytes: float             # stored without recompute
    act_input_bytes: float       # stored under full recompute (the layer input)
    # what the EP overlap hides of this layer's all-to-alls, forward and backward (0 without it): what a
    # pass the schedule leaves unpaired exposes again (``ep_unpaired_chunks``)
    ep_hidden_s: float = 0.0
    # Megatron-Core's fine-grained activation offloading (``offload_terms``): the bytes a layer that is not
    # fully recomputed no longer keeps on the GPU per micro-batch (its time waiting on the host link is in
    # ``compute_s``)
    offload_bytes: float = 0.0


def offload_terms(lc: LayerCost, modules: tuple[str, ...], host_bytes_per_s: float,
                  ep_overlap: bool = False) -> tuple[float, float]:
    """(bytes a layer no longer keeps on the GPU, time its compute waits on the host link) per micro-batch under
    Megatron-Core's fine-grained activation offloading of ``modules`` (``costmodel.layers.offload_bytes``), over a
    link of ``host_bytes_per_s`` a direction (``GpuSpec.host_link_bytes_per_s``).

    From NVIDIA/Megatron-LM at d98e8a64 (``fine_grained_activation_offload.py``, a helper's reading): each group's
    copy to the host starts after its module's forward on a copy stream, and compute does not wait for it; the
    link is full duplex, and in a pipeline's steady state a layer's forward comes once per forward and backward of a
    layer (three forwards' time), so only copies longer than that fall behind, priced as the excess. In the backward
    a group is reloaded when the backward finishes the group after it (in forward order) and waited for at its own
    backward,
    so its reload overlaps only the backward in between: ``expert_fc1`` followed by ``moe_act`` has almost none
    between them (priced exposed), while the last offloaded group of a layer overlaps the backward of the next
    layer's attention, router and dispatch, taken as twice the layer's forward less its routed experts' GEMMs. Under
    the EP overlap (``ep_overlap``: Megatron-Core's 1F1B all-to-all overlap runs each layer's backward beside another
    micro-batch's layer forward) the reloads also overlap that forward. No published measurement of this cost was
    found (PRs report 0.3-3%); the one run on file with offloading (NVIDIA's Qwen3-235B on 256 GB200, with the EP
    overlap) came out 19% slow with the copies priced against the forward alone and without the EP overlap's
    forward, 3.6% slow with both (as published): an estimate, checked on one run."""
    if not modules or host_bytes_per_s <= 0:
        return 0.0, 0.0
    sel = [o for o in lc.offload if o[0] in modules]
    if not sel:
        return 0.0, 0.0
    kept = sum(o[1] for o in sel)
    moved = [o[2] / host_bytes_per_s for o in sel]
    exposed = max(0.0, sum(moved) - 3.0 * lc.fwd_s)
    window = 2.0 * max(0.0, lc.fwd_s - lc.expert_gemm_fwd_s)
    # all but the last group reload right before their own backward; the last one over the window
    reload = sum(moved[:-1]) + max(0.0, moved[-1] - window)
    return kept, exposed + (max(0.0, reload - lc.fwd_s) if ep_overlap else reload)


def paired_tp_s(blocks: tuple[tuple[float, float, float, float], ...], mode: str, sp: bool,
                slowdown: float) -> tuple[float, float]:
    """(forward, backward) TP communication a layer leaves exposed under TP overlap ``mode``, each
    collective overlapped only with the GEMMs beside it (``costmodel.layers._tp_blocks``: per block the
    column side's collective and GEMMs, the row side's collective and GEMM, forward). The backward
    runs the mirror collectives: with sequence parallelism the column-parallel GEMMs' input-gradient
    reduce-scatter (the column side) and the row-parallel GEMM's output-gradient all-gather (the row
    side), each the size of its forward partner as ``tp_fwd_s`` counts them; without it the one
    all-reduce, of the column-parallel GEMMs' input gradients (the column side).

    * ``full`` (Transformer Engine's userbuffers): every collective beside its own GEMM, forward and
      backward (the backward's dgrad and wgrad GEMMs each as long as the forward's: the forward's
      length is taken, as the aggregate rule took one forward of GEMMs for the backward's window);
    * ``async_tp`` (PyTorch's micro-pipelined TP): the forward's as ``full``; in the backward the
      output-gradient all-gathers beside their row-parallel GEMMs, the input-gradient reduce-scatters
      exposed (they follow a sum of GEMMs, not one matmul);
    * ``backward`` (Megatron-LM without ``--tp-comm-overlap``): the forward's exposed; in the backward
      the column-parallel linears' input-gradient collective beside their own weight-gradient GEMMs
      (``LinearWithGradAccumulationAndAsyncCommunication``), the rest exposed;
    * ``none``: all exposed."""
    fwd = bwd = 0.0
    for col_c, col_g, row_c, row_g in blocks:
        bcol, brow = (col_c, row_c) if sp else (row_c, col_c)
        if mode in ("full", "async_tp"):
            fwd += overlapped(col_c, col_g, slowdown) + overlapped(row_c, row_g, slowdown)
        else:
            fwd += col_c + row_c
        if mode == "full":
            bwd += overlapped(bcol, col_g, slowdown) + overlapped(brow, row_g, slowdown)
        elif mode == "async_tp":
            bwd += bcol + overlapped(brow, row_g, slowdown)
        elif mode == "backward":
            bwd += overlapped(bcol, col_g, slowdown) + brow
        else:
            bwd += bcol + brow
    return fwd, bwd


def layer_terms(lc: LayerCost, slowdown: float, tp_overlap: "bool | str" = False, ep_overlap: bool = False,
                selective: "str | tuple[str, ...]" = "op", ep_sm_share: float = 0.0, sp: bool = True,
                delay_wgrad: bool = True, offload: tuple[str, ...] = (), host_bytes_per_s: float = 0.0) -> LayerTerms:
    """``LayerTerms`` of a layer cost; ``slowdown`` is the cluster's ``compute_comm_slowdown``
    (0 gives the terms without it, which bound them from below). ``tp_overlap`` is a
    ``frameworks.tp_overlap_mode`` (True means ``full``): ``full`` (the framework pipelines TP's
    collectives with the GEMMs next to them) prices TP communication as overlapped with the layer's
    GEMMs, in forward and backward; ``async_tp`` (torchtitan's async TP) does so in the forward and for
    the backward's gathers only, its reduce-scatters exposed; ``backward`` overlaps half of the backward's TP traffic (the
    column-parallel linears' input-gradient collectives) with half of its GEMM time (their weight
    gradients) and leaves the rest exposed; with ``ep_overlap`` (``FrameworkProfile.ep_comm_overlap``)
    the all-to-alls overlap the layer's compute, slowing it by the cluster's ``slowdown`` or, where
    the dispatcher's kernels hold a known share of the SMs (``ep_sm_share``: DeepEP,
    ``costmodel.moe.comm_sm_share``), by the compute lost on those SMs
    (``costmodel.moe.sm_share_overlap_s``). ``selective`` (``FrameworkProfile.selective_recompute``)
    picks what selective recompute stores and reruns: op-level SAC, Megatron's core_attn module, or a
    tuple of Megatron-Core's modules (``ParallelConfig.recompute_modules``: ``LayerCost.modules``, summed).
    Without sequence parallelism (``sp`` False) the backward's TP traffic is the two all-reduces of
    the column-parallel linears' input gradients (Megatron's ``f`` operator; the row-parallel ``g``
    is the identity backward), so under ``backward`` all of it overlaps their weight-gradient GEMMs;
    with it, half is the input all-gathers those GEMMs wait for (Megatron re-gathers the saved SP
    shard), which stays exposed. Korthikanti et al. (MLSys'23, Sec. 6.2, Table 4) measure the
    no-SP case on the 22B model: a 7.7 ms forward and an 11.9 ms backward, the backward's
    all-reduces hidden behind the weight-gradient computation. ``delay_wgrad``
    (``MoeExecution.delay_wgrad``): under the EP overlap, whether the backward's all-to-alls also run
    beside the experts' weight gradients (``costmodel.moe.ep_backward_window_s``)."""
    mode = ("full" if tp_overlap else "none") if isinstance(tp_overlap, bool) else tp_overlap
    assert mode in TP_OVERLAP_MODES, mode
    cp_fwd = overlapped(lc.cp_fwd_s, lc.attn_fwd_s, slowdown)
    if lc.tp_blocks:
        tp_fwd, tp_bwd = paired_tp_s(lc.tp_blocks, mode, sp, slowdown)
    elif mode == "full":
        tp_fwd = tp_bwd = overlapped(lc.tp_fwd_s, lc.gemm_fwd_s, slowdown)
    elif mode == "async_tp":
        # torch's micro-pipeline TP (frameworks: tp_overlap_scope): the forward's gathers and
        # scatters fused with its GEMMs; in the backward the output-gradient gathers fused with half of
        # its GEMMs, the input-gradient reduce-scatters exposed (they follow a sum, not a matmul)
        tp_fwd = overlapped(lc.tp_fwd_s, lc.gemm_fwd_s, slowdown)
        tp_bwd = lc.tp_fwd_s / 2 + overlapped(lc.tp_fwd_s / 2, lc.gemm_fwd_s / 2, slowdown)
    elif mode == "backward" and not sp:
        tp_fwd = lc.tp_fwd_s
        tp_bwd = overlapped(lc.tp_fwd_s, lc.gemm_fwd_s / 2, slowdown)
    elif mode == "backward":
        tp_fwd = lc.tp_fwd_s
        tp_bwd = lc.tp_fwd_s / 2 + overlapped(lc.tp_fwd_s / 2, lc.gemm_fwd_s / 2, slowdown)
    else:
        tp_fwd = tp_bwd = lc.tp_fwd_s
    if not ep_overlap:
        ep_fwd = ep_bwd = lc.ep_fwd_s
    else:
        # the forward's all-to-alls beside a layer forward's compute; the backward's beside the same,
        # less the experts' weight gradients where they are not delayed
        window_bwd = ep_backward_window_s(lc.fwd_s, lc.expert_gemm_fwd_s, delay_wgrad)
        if ep_sm_share > 0 and slowdown:
            ep_fwd = sm_share_overlap_s(lc.ep_fwd_s, lc.fwd_s, ep_sm_share)
            ep_bwd = sm_share_overlap_s(lc.ep_fwd_s, window_bwd, ep_sm_share)
        else:
            ep_fwd = overlapped(lc.ep_fwd_s, lc.fwd_s, slowdown)
            ep_bwd = overlapped(lc.ep_fwd_s, window_bwd, slowdown)
    # the MoE dispatcher's expert-TP gather is TP traffic no TP overlap covers (``costmodel.layers``)
    tp_fwd += lc.etp_fwd_s
    tp_bwd += lc.etp_fwd_s
    if isinstance(selective, tuple):
        # Megatron-Core's modules (ParallelConfig.recompute_modules; costmodel.layers: LayerCost.modules)
        names = recomputed_modules(selective)
        sel = [m for m in lc.modules if m[0] in names]
        chosen = {"selective_s": sum(m[2] for m in sel), "selective_flops": sum(m[3] for m in sel),
                  "act_selective_bytes": max(0.0, lc.act_bytes - sum(m[1] for m in sel))}
    elif selective == "core_attn":
        chosen = {"selective_s": lc.core_attn_extra_s, "selective_flops": lc.core_attn_extra_flops,
                  "act_selective_bytes": lc.act_core_attn_bytes}
    else:
        chosen = {"selective_s": lc.selective_extra_s, "selective_flops": lc.selective_extra_flops,
                  "act_selective_bytes": lc.act_selective_bytes}
    off_bytes, off_s = offload_terms(lc, offload, host_bytes_per_s, ep_overlap)
    return LayerTerms(compute_s=3 * lc.fwd_s + lc.attn_bwd_extra_s + off_s, tp_comm_s=tp_fwd + tp_bwd,
                      ep_comm_s=ep_fwd + ep_bwd, ep_hidden_s=max(0.0, 2 * lc.ep_fwd_s - ep_fwd - ep_bwd),
                      cp_comm_s=3 * cp_fwd, recompute_s=lc.fwd_s + tp_fwd + ep_fwd + cp_fwd,
                      model_flops=3 * lc.model_flops_fwd, hw_flops=3 * lc.hw_flops_fwd,
                      recompute_flops=lc.hw_flops_fwd, act_bytes=lc.act_bytes, act_input_bytes=lc.act_input_bytes,
                      offload_bytes=off_bytes, **chosen)


def head_compute_s(ends: EndsCost) -> float:
    """The output head's forward and backward per micro-batch (backward twice the forward)."""
    return 3 * ends.head_fwd_s


class LayerSums(NamedTuple):
    """The layer terms of a stage holding ``k`` layers of each kind, ``kr`` of them recomputed
    fully (``LayerSums(*layer_sums(...))``), per micro-batch."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    ep_comm_s: float
    cp_comm_s: float
    model_flops: float
    hw_flops: float
    act_stored_bytes: float
    act_work_bytes: float

    @property
    def time_s(self) -> float:
        """The layers' part of the stage's time on the critical path (``StageCost.time_s`` adds
        the head's compute, pipeline and ZeRO communication)."""
        return self.compute_s + self.recompute_s + self.tp_comm_s + self.ep_comm_s + self.cp_comm_s


def layer_sums(dense: LayerTerms, n_dense: float, r_dense: float, moe: LayerTerms | None, n_moe: float,
               r_moe: float, selective: bool) -> tuple[float, ...]:
    """The stage's layer terms: ``n_dense`` dense layers with ``LayerTerms`` ``dense``, ``r_dense``
    of them recomputed fully, and ``n_moe`` MoE layers (``moe``, ``r_moe``) (an extra forward with its
    communication; each stores its input only), the others storing their activations (selective
    recompute: the smaller set, and the extra backward time). The one rule ``StageModel.cost``
    and the search's compute bound (``stage_compute_time``) share. The fields of ``LayerSums``, as a
    plain tuple: ``StageModel.cost`` unpacks it on the estimate's hot path, where building the
    named tuple costs more than the rest of the call; ``LayerSums(*layer_sums(...))`` names them."""
    comp = rec = tp = ep = cp = model_flops = hw_flops = act_stored = act_work = 0.0
    for lt, k, kr in ((dense, n_dense, r_dense), (moe, n_moe, r_moe)):
        if not k:
            continue
        comp += lt.compute_s * k
        tp += lt.tp_comm_s * k
        ep += lt.ep_comm_s * k
        cp += lt.cp_comm_s * k
        rec += kr * lt.recompute_s
        model_flops += lt.model_flops * k
        hw_flops += lt.hw_flops * k + kr * lt.recompute_flops
        if selective:
            rec += (k - kr) * lt.selective_s
            hw_flops += (k - kr) * lt.selective_flops
            act_stored += (k - kr) * lt.act_selective_bytes
        else:
            act_stored += (k - kr) * lt.act_bytes
        act_stored += kr * lt.act_input_bytes
        if kr > 0:
            act_work = max(act_work, lt.act_bytes)     # one layer's activations while it recomputes
        if lt.offload_bytes:
            # offloaded activations leave the GPU (costmodel.stage_terms.offload_terms); a fully recomputed
            # layer keeps only its input, and one layer's groups stay (Megatron-Core keeps the last group of
            # each module on the GPU, and a reloaded group until its backward)
            act_stored -= (k - kr) * lt.offload_bytes
            act_work += lt.offload_bytes
    return comp, rec, tp, ep, cp, model_flops, hw_flops, act_stored, act_work


class StageCost(NamedTuple):
    """A stage's cost per micro-batch (times), its FLOPs, and its memory parts before the
    micro-batches in flight are counted (``StageModel.memory``). The fields come in the order
    ``StageModel.cost`` puts them together: its layers' part (``StageModel.layers_part``), the
    pipeline hand-off of its placement, its model-state part (``StageModel.states_part``)."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    ep_comm_s: float
    cp_comm_s: float
    model_flops: float
    hw_flops: float
    act_stored_bytes: float        # per micro-batch in flight
    act_fixed_bytes: float         # recompute working set + logits (last stage)
    pp_comm_s: float
    fsdp_comm_s: float             # exposed ZeRO-3 gathers and scatters (with FSDP2's copies), ZeRO-2 scatters, per micro-batch
    dp_grad_s: float               # once per step: gradient reduction (before overlap)
    dp_gather_s: float             # once per step: ZeRO-1/2 weight all-gather (before overlap)
    optimizer_s: float
    embed_act_bytes: float         # per micro-batch in flight, first stage
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    buffers_bytes: float
    dp_grad_tail_s: float          # of dp_grad_s: the last bucket's, which only starts after the backward
    dp_gather_head_s: float        # of dp_gather_s: the first bucket's, which the first layer waits for
    fsdp_tail_s: float             # of fsdp_comm_s (ZeRO-2/3): the last micro-batch's last reduce-scatter
    fsdp_head_s: float             # of fsdp_comm_s (ZeRO-3): the first layer's all-gather

    @property
    def time_s(self) -> float:
        """Time per micro-batch on the critical path."""
        return (self.compute_s + self.recompute_s + self.tp_comm_s + self.ep_comm_s + self.cp_comm_s
                + self.pp_comm_s + self.fsdp_comm_s)

    @property
    def states_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def act_per_microbatch_bytes(self) -> float:
        return self.act_stored_bytes + self.embed_act_bytes


# StageCost(...) from its parts without the keyword handling of the generated __new__ (the
# estimate's hot path): ``_new_cost(StageCost, layers + (pp_comm_s,) + states)``
_new_cost = tuple.__new__


class ZeroSharding(NamedTuple):
    """ZeRO stage and what divides the model states of dense and routed-expert parameters
    (``memory.zero_divisors`` of their shard groups)."""

    zero: int
    dense_shard: int
    expert_shard: int
    dense: tuple[int, int, int]        # (weights, grads, optimizer) divisors
    expert: tuple[int, int, int]


@dataclass(slots=True)
class StageMesh:
    """What a stage's cost needs that is fixed by the node group, the mesh and the micro-batch
    (not by ZeRO, recompute or the stage's position): its layers' costs and terms, its ends,
    its parameters per layer, and the collective-time functions of the groups it reduces
    gradients over (``comm.Network.*_fn``: bytes -> seconds on that group)."""

    group: NodeGroup
    network: Network
    dense: LayerCost
    dense_terms: LayerTerms
    moe: LayerCost | None
    moe_terms: LayerTerms | None
    ends: EndsCost
    head_compute_s: float              # output head forward + backward
    head_model_flops: float
    boundary_bytes: float              # activations crossing a stage boundary, per micro-batch
    dense_layer_params: float          # per GPU
    dense_scale_bytes: float           # FP8 scaling state of a dense layer on a GPU (0 without FP8)
    moe_scale_bytes: float
    moe_layer_params: float            # per GPU, routed experts apart
    routed_per_gpu: float              # routed-expert parameters of one MoE layer on a GPU
    expert_shard: int
    data_parallel: int                 # ranks holding the same dense weights: dp x cp
    dense_shard: int                   # ZeRO shard group of the dense weights: dp_shard x cp
    shard_latency_s: float             # fixed time of one all-gather / reduce-scatter on it
    expert_latency_s: float
    replicas: int                      # dense replica group size (HSDP; 1 without)
    expert_replicas: int
    all_gather_shard: Callable[[float], float]     # = reduce-scatter on the ZeRO shard group
    all_gather_expert: Callable[[float], float]
    all_reduce_dp: Callable[[float], float]
    all_reduce_expert_dp: Callable[[float], float]
    all_reduce_replicas: Callable[[float], float]
    all_reduce_expert_replicas: Callable[[float], float]
    placements: dict                   # (first, last, crosses) -> (pp_comm_s, ends params), memoized
    layers_parts: dict                 # stage_cache.layers_key -> StageModel.layers_part, memoized by estimate
    states_parts: dict                 # stage_cache.states_key -> StageModel.states_part, memoized by estimate
    exposed_parts: dict                # stage_cache.exposed_key -> (states part, exposed DP time, states bytes)
    settings: dict                     # stage_model_key -> StageModel's settings (_SETTINGS), memoized
    dp_latency_s: float = 0.0          # fixed time of one all-reduce on the dp x cp group
    replica_latency_s: float = 0.0     # and on the (HSDP) replica group
    step_fixed_s: float = 0.0          # per-step reductions that do not shrink (scale.step_reductions_s)


def fp8_recipe_of(cluster: ClusterSpec, workload: Workload, framework: "str | FrameworkProfile"
                  ) -> fp8_recipes.Fp8Recipe | None:
    """The FP8 recipe a training workload runs (None unless ``dtype`` is "fp8" or "nvfp4"): the workload's,
    else the framework's default for the first node group's GPU; every node group must run it."""
    if not low_precision(workload.dtype) or workload.mode != "train":
        return None
    name = framework_profile(framework).name
    recipe = "nvfp4" if workload.dtype == "nvfp4" else workload.fp8_recipe
    rec = fp8_recipes.resolve(recipe, name, cluster.groups[0].gpu, workload.fp8_param_gather)
    for g in cluster.groups[1:]:
        fp8_recipes.resolve(rec.name, name, g.gpu)
    return rec



# torch DDP's ``bucket_cap_mb`` (25 MiB; ``memory.DDP_BUCKET_BYTES`` holds two of them, the one
# being reduced and the one filling): data parallel moves a stage's gradients, and ZeRO-1/2 its
# updated parameters, in calls of at most this size, each one collective with its launch cost.
# Megatron's and DeepSpeed's differ (``dp_bucket_bytes``, by ``FrameworkProfile.dp_bucket``).
DP_BUCKET_BYTES = DDP_BUCKET_BYTES / 2
# Megatron-Core's default bucket (``DistributedDataParallelConfig.bucket_size`` unset):
# ``max(40000000, 1000000 * dp_size)`` parameters, dp_size the data-parallel group without CP
# (megatron/core/distributed/distributed_data_parallel_config.py: "larger DP sizes need larger buckets
# to ensure collectives do not become latency-bound"; DistributedDataParallel.__init__ takes
# ``get_data_parallel_world_size()`` at core_v0.14.0 and ``dp_group.size()`` at main d98e8a64, both
# ``with_context_parallel=False``: megatron/core/process_groups_config.py; bucket4, stop 22)
MEGATRON_BUCKET_MIN_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_RANK = 1_000_000
# DeepSpeed's ZeRO ``reduce_bucket_size`` / ``allgather_bucket_size`` default: 5e8 elements
# (deepspeed/runtime/zero/config.py)
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
DP_BUCKET_KINDS = ("torch", "megatron", "deepspeed")


def megatron_bucket_count(numels: Sequence[float], bucket_size: float | None) -> int:
    """How many buckets Megatron-Core's DDP makes of a buffer's parameter tensors (``numels``, in
    buffer order: the model's parameters reversed, roughly backprop order), ``bucket_size`` the
    ``DistributedDataParallelConfig.bucket_size`` in parameters (None: one bucket). A bucket closes
    at a parameter boundary once it holds at least ``bucket_size`` parameters; what is left forms a
    last bucket. So a bucket size below the smallest tensor (the MLPerf 405B runs' 200, Cisco's 64)
    gives one bucket per tensor. Source: megatron/core/distributed/param_and_grad_buffer.py at
    core_v0.14.0, ``_ParamAndGradBuffer.__init__`` (the loop ``for param in params[::-1]``,
    ``(param_end_index - bucket_start_index) >= bucket_size``). Padding (to the DP size, 128, or
    2^16 with ``pad_buckets_for_high_nccl_busbw``) and the shared embedding's own bucket under the
    distributed optimizer add no bucket of their own worth pricing here."""
    if not numels:
        return 0
    if bucket_size is None:
        return 1
    count, held = 0, 0.0
    for n in numels:
        held += n
        if held >= bucket_size:
            count, held = count + 1, 0.0
    return count + (1 if held > 0 else 0)


def megatron_bucket_size(bucket_params: int, data_parallel: int) -> int:
    """Megatron-Core's ``bucket_size`` in parameters: the run's own (``bucket_params`` > 0, a
    record's ``profile: {dp_bucket_params: N}``), else the default ``max(40M, 1M x dp)``."""
    if bucket_params > 0:
        return bucket_params
    return max(MEGATRON_BUCKET_MIN_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * data_parallel)


def dp_bucket_bytes(kind: str, data_parallel: int, bytes_per_value: float, zero: int = 0,
                    layer_values: float = 0.0, bucket_params: int = 0) -> float:
    """Bytes one data-parallel bucket moves (``FrameworkProfile.dp_bucket``; ``data_parallel`` the
    data-parallel group without CP): Megatron-Core's
    nominal ``bucket_size`` (``megatron_bucket_size``: the run's ``bucket_params`` or
    ``max(40M, 1M x dp)``; a stage's dense buffer is counted at tensor boundaries by
    ``megatron_stage_buckets``), DeepSpeed's 5e8 values, each value ``bytes_per_value`` bytes
    on the wire; for torch, DDP's 25 MiB under ZeRO-0, and under ZeRO-1/2 one layer's values
    (``layer_values``): FSDP2 (``fully_shard`` per transformer block, as torchtitan, the built-in
    runtime and Accelerate's FSDP2 apply it) reduce-scatters and gathers each block on its own.
    "fsdp2": one layer's values at every ZeRO stage, ZeRO-0 included: a framework whose pure data
    parallelism is FSDP2 as well (the built-in runtime's ``replicate_with_fsdp``, runtime/parallel.py
    ``apply_dp``; torchtitan 0.3.0's replicate axis of ``fully_shard``, it has no DDP) all-reduces each
    block on its own, not in DDP's buckets."""
    if kind == "megatron":
        return megatron_bucket_size(bucket_params, data_parallel) * bytes_per_value
    if kind == "deepspeed":
        return DEEPSPEED_BUCKET_ELEMENTS * bytes_per_value
    if kind == "fsdp2" and layer_values > 0:
        return layer_values * bytes_per_value
    if zero in (1, 2) and layer_values > 0:
        return layer_values * bytes_per_value
    return DP_BUCKET_BYTES


def megatron_layer_numels(model, tp: int, ep: int = 1, expert_tp: int | None = None) -> tuple[float, ...]:
    """One transformer layer's parameter tensors on one GPU as Megatron-Core's buffer holds them,
    in backprop order (the layer's parameters reversed): each matrix's weight (its bias a tensor
    of its own), and the layer's two norms (the input norm first, the pre-MLP norm before the first
    MLP or router matrix; where they sit changes no count, each being a few thousand values).
    The layer is a dense one where the model has any, else a MoE layer (one weight tensor per
    local expert matrix copy)."""
    moe = all(model.is_moe_layer(i) for i in range(model.layers))
    norm = float(model.norm_params())
    out: list[float] = [norm]
    pre_mlp = False
    for m in layer_matrices(model, moe, tp, ep, expert_tp):
        if not pre_mlp and (m.role != "dense" or not m.name.startswith(("q", "kv", "attn"))):
            out.append(norm)
            pre_mlp = True
        for _ in range(max(1, round(m.count))):
            out.append(m.k * m.n)
            if m.bias:
                out.append(m.bias)
    return tuple(reversed(out))


def _calls(transfer_s: float, calls: float, group: int) -> float:
    """``transfer_s`` of transfer in ``calls`` collectives on a group of ``group`` GPUs, each
    launched (``comm.launched``; a group of one GPU makes no call)."""
    return launched(transfer_s / calls, calls) if group > 1 and calls > 0 else transfer_s


# Megatron-Core's NaN/Inf checks (``FrameworkProfile.nan_checks``; Megatron-LM at d98e8a64):
# ``_ParamAndGradBucketGroup.check_grads`` (megatron/core/distributed/param_and_grad_buffer.py), called as
# each bucket group's gradient sync starts, reads every bucket's gradients once (``grad_data.norm(p=2)``)
# and validates the norm twice (NaN, Inf) through ``RerunStateMachine.validate_result``, whose
# ``if result_rejected:`` reads a CUDA tensor on the host: a sync each; the last stage's loss function
# validates each micro-batch's loss the same two ways (pretrain_gpt.py ``loss_func``). Each sync costs the
# queue's drain and relaunch (``moe.HOST_SYNC_S``); the read, the gradients at the optimizer's HBM rate.
# Computed from the code, not measured: about 9 ms of a 56 s Llama-3-70B step on 64 H100 (stop 52's note).
# Under ZeRO-3 (Megatron-FSDP) the gradient checks are not priced: its overlapped reduce-scatter checks a
# gradient only with ``report_nan_in_param_grad`` (megatron_fsdp.py, default False, which Megatron's adapter
# leaves); its bulk path (no overlapped reduction) checks each parameter group's buffer once, not priced. The
# loss checks are priced there too.
NAN_CHECK_SYNCS = 2          # NaN and Inf, per bucket and per last-stage micro-batch


def nan_check_s(buckets: float, grad_bytes: float, hbm_bytes_per_s: float) -> float:
    """Once per step: the gradient checks of ``buckets`` buckets holding ``grad_bytes`` (their syncs and
    one read of the gradients at ``hbm_bytes_per_s``; the loss checks are per micro-batch, in
    ``StageModel.layers_part``)."""
    return buckets * NAN_CHECK_SYNCS * HOST_SYNC_S + grad_bytes / hbm_bytes_per_s


@lru_cache(maxsize=65536)
def megatron_stage_buckets(layer_numels: tuple[float, ...], layers: int, ends: tuple[float, ...], embedding: float,
                           bucket_size: int | None, first: bool, vpp: int = 1) -> int:
    """How many buckets (one collective each) Megatron-Core makes of one pipeline stage's dense
    gradient buffer: ``layers`` layers of tensors ``layer_numels`` (backprop order), after them the
    stage's ``ends`` (output head and final norm, last stage) before and its ``embedding`` (first
    stage) after, ``vpp`` model chunks. Every stage after the first makes one bucket per chunk
    (``DistributedDataParallel.__init__``: ``if pp_rank > 0: self.bucket_size = None``), and so
    does every chunk after the first (megatron/training/training.py ``get_model``:
    ``disable_bucketing=(model_chunk_idx > 0)``), both at core_v0.14.0; the first chunk of the
    first stage is counted by ``megatron_bucket_count`` (``bucket_size`` None: one bucket, as
    without overlapped gradient reduction)."""
    vpp = max(1, vpp)
    if not first:
        return vpp
    chunk_layers = math.ceil(layers / vpp) if vpp > 1 else layers
    tensors = (ends if vpp == 1 else ()) + layer_numels * chunk_layers + ((embedding,) if embedding else ())
    return max(1, megatron_bucket_count(tensors, bucket_size)) + vpp - 1


def _one_bucket(total_s: float, nbytes: float, group: int, bucket_bytes: float = DP_BUCKET_BYTES,
                calls: int = 0) -> float:
    """One bucket's share of a bucketed collective's time ``total_s`` (``_bucketed``'s, with the
    same ``nbytes``, ``bucket_bytes`` and ``calls``): the part a framework cannot overlap at the
    ends of the step (``exposed_dp_time``); 0 where the group has one GPU (no call)."""
    if group < 2 or total_s <= 0:
        return 0.0
    return total_s / (calls or math.ceil(nbytes / bucket_bytes) or 1)


def _bucketed(collective: Callable[[float], float], nbytes: float, group: int,
              bucket_bytes: float = DP_BUCKET_BYTES, latency_s: float = 0.0, calls: int = 0) -> float:
    """One collective's time for ``nbytes`` on a group of ``group`` GPUs, moved in buckets of
    ``bucket_bytes``, each launched (``comm.launched``; a group of one GPU makes no call) and each
    paying the collective's fixed time ``latency_s`` (which ``collective`` counts once); ``calls``,
    where given, the buckets' count (``megatron_stage_buckets``) instead of ``bucket_bytes``."""
    t = collective(nbytes)
    if group < 2:
        return t
    calls = calls or math.ceil(nbytes / bucket_bytes) or 1
    return launched(t / calls + latency_s * (calls - 1) / calls, calls)


def stage_model_key(par: ParallelConfig) -> tuple:
    """What ``StageModel``'s settings (``_SETTINGS``) read of a configuration besides its mesh
    (``stage_cache._Shared.mesh`` keys that on order, pp, dp, cp, tp, ep, etp, dp_shard, sp,
    micro-batch, node group, dispatcher and EP overlap): the ZeRO stage and the data-parallel
    overlap. The settings are kept per mesh under it (``StageMesh.settings``)."""
    return (par.zero, par.overlap_dp_comm)


# the attributes ``StageModel._settings`` sets, in the order ``StageMesh.settings`` holds them
_SETTINGS = ("deferred_sync", "regather", "buffers_bytes", "zero", "reserved_bytes", "capacity_bytes",
             "overlap_grad", "overlap_gather", "hbm_bytes_per_s", "slowdown", "grad_bucket_bytes",
             "gather_bucket_bytes", "megatron_buckets", "wrap_block_s", "wrap_param_s", "tp_host_s")


def layer_param_tensors(model, moe: bool) -> int:
    """Parameter tensors of one transformer block as the built-in runtime builds it (``runtime.model``:
    two norms, Q, K, V and output projections, the MLP's matrices, their biases where the model has
    them; a MoE block's router and its grouped experts' three tensors, and its shared experts')."""
    norms = 2 * (2 if model.norm == "layernorm" else 1)
    attn = 4 + (4 if model.bias else 3 if model.qkv_bias else 0)
    mats = 3 if model.mlp == "swiglu" else 2
    mlp = mats * (2 if model.bias else 1)
    if moe:
        mlp = 1 + 3 + (mats if model.shared_experts else 0)
    return norms + attn + mlp


def fsdp2_wrap_counts(model, n_blocks: float, n_moe: float, first: bool, last: bool, ep: int) -> tuple[float, float]:
    """(modules FSDP2 wraps, parameter tensors) on one pipeline stage of the built-in runtime,
    ``n_blocks`` blocks of which ``n_moe`` are MoE: what ``runtime.parallel.dp_wrapped_modules``
    wraps (every block, a MoE block's experts again under EP, the embedding on the first stage and
    the final norm with the head on the last unless the stage holds both ends of a tied embedding,
    and the stage itself) and what ``runtime.model`` builds (the blocks' tensors, the token and
    learned position embeddings, the final norm, and the head's matrix unless it is the embedding's
    own, i.e. tied on a stage that holds both ends: a last stage without the embedding keeps a copy).
    ``tests/test_costmodel.py`` holds both equal to the runtime's real modules."""
    tied_here = model.tied_embeddings and first and last
    wraps = n_blocks + (n_moe if ep > 1 else 0) + 1 + (0 if tied_here else int(first) + int(last))
    tensors = (n_blocks - n_moe) * layer_param_tensors(model, False) + n_moe * layer_param_tensors(model, True)
    if first:
        tensors += 1 + (1 if model.positions == "learned" else 0)
    if last:
        tensors += (2 if model.norm == "layernorm" else 1) + (0 if tied_here else 1)
    return wraps, tensors


class StageModel:
    """The cost of one pipeline stage as a function of how many layers it holds (``n``, of which
    ``n_moe`` are MoE layers) and how many of them recompute fully (``r``). Built once per
    (configuration, node group, position) for the solver's tables; ``estimate`` builds one per
    node group and ``place``s it at each kind of stage in turn; both call ``cost``, so the two
    always agree."""

    __slots__ = ("sh", "par", "mesh", "zero", "buffers_bytes", "selective", "reserved_bytes", "capacity_bytes",
                 "hbm_bytes_per_s", "slowdown", "overlap_grad", "overlap_gather", "first", "last", "pp_comm_s",
                 "ends_params", "grad_bucket_bytes", "gather_bucket_bytes", "megatron_buckets", "deferred_sync",
                 "regather", "wrap_block_s", "wrap_param_s", "tp_host_s")

    def __init__(self, sh: "_Shared", par: ParallelConfig, order: tuple[str, ...], grp: NodeGroup):
        mesh = sh.mesh(par, order, grp)
        self.sh, self.par, self.mesh = sh, par, mesh
        # the settings below read the mesh and, of the configuration, only ``stage_model_key``:
        # computed once per mesh and key (``StageMesh.settings``), then copied
        key = stage_model_key(par)
        settings = mesh.settings.get(key)
        if settings is None:
            self._settings(sh, par, mesh, grp)
            mesh.settings[key] = tuple(getattr(self, name) for name in _SETTINGS)
        else:
            (self.deferred_sync, self.regather, self.buffers_bytes, self.zero, self.reserved_bytes,
             self.capacity_bytes, self.overlap_grad, self.overlap_gather, self.hbm_bytes_per_s, self.slowdown,
             self.grad_bucket_bytes, self.gather_bucket_bytes, self.megatron_buckets, self.wrap_block_s,
             self.wrap_param_s, self.tp_host_s) = settings
        self.selective = par.recompute == "selective"
        self.first = self.last = False
        self.pp_comm_s = self.ends_params = 0.0

    def _settings(self, sh: "_Shared", par: ParallelConfig, mesh: StageMesh, grp: NodeGroup) -> None:
        """The stage model's settings (``_SETTINGS``, all but recompute): its ZeRO sharding and buffers, overlaps,
        memory capacity, HBM rate and data-parallel buckets, from the mesh and ``stage_model_key``."""
        z = par.zero
        # torch.distributed.pipelining (torch 2.13 ``stage.py`` ``backward_maybe_with_nosync``: on an
        # FSDP2 stage every micro-batch's backward runs with ``set_requires_gradient_sync(False)`` and
        # ``set_reshard_after_backward(False)``; ``schedules.py`` ``_add_reduce_grad`` /
        # ``perform_reduce_grad``: one REDUCE_GRAD after the stage's last backward, which reduce-scatters
        # and reshards): under pipeline parallelism FSDP2 keeps the stage's weights gathered and its
        # gradients unsharded (``FSDPParam.unsharded_accumulated_grad``, in the reduce dtype) for the
        # whole step and reduces them once, after the stage's last backward. Its model states are then
        # ZeRO-1's (only the optimizer state and master weights sharded), its weights gathered once per
        # step and its gradients reduce-scattered once, none of it beside that stage's own backward.
        # ZeRO-3 where the framework still reshards after each forward under PP (torchtitan's
        # fsdp_reshard_after_forward "always"): the weights stay sharded but for the layer in use and are
        # gathered again for each micro-batch's backward (left gathered after it, so the next forward
        # finds them); only the gradients stay whole all step
        self.deferred_sync = z >= 2 and par.pp > 1 and sh.framework.pipelining_defers_fsdp_sync
        self.regather = self.deferred_sync and z >= 3 and sh.framework.fsdp_reshards_under_pp
        if self.deferred_sync and not self.regather:
            z = 1
        if z >= 3:
            biggest = max(mesh.dense.params, mesh.moe.params if mesh.moe else 0.0)
            # FSDP prefetches the next layer's weights while the current one runs: two
            # layers of gathered weights live
            self.buffers_bytes = 2 * biggest * sh.gather_b if mesh.dense_shard > 1 else 0.0
        else:
            whole = sh.total_params / (par.tp * par.pp) * sh.g_b
            self.buffers_bytes = min(DDP_BUCKET_BYTES, whole) if mesh.data_parallel > 1 else 0.0
        dense_div, expert_div = zero_divisors(z, mesh.dense_shard), zero_divisors(z, mesh.expert_shard)
        if self.regather:               # whole gradients, sharded weights and optimizer state
            dense_div, expert_div = (dense_div[0], 1, dense_div[2]), (expert_div[0], 1, expert_div[2])
        self.zero = ZeroSharding(z, mesh.dense_shard, mesh.expert_shard, dense_div, expert_div)
        gpu = grp.gpu
        fw = sh.framework
        # what a plan may use: the GPU's memory less the framework's headroom (costmodel.frameworks)
        self.reserved_bytes = gpu.reserved_bytes
        self.capacity_bytes = gpu.memory_bytes * (1.0 - fw.memory_headroom_fraction)
        engine = backend_profile(fw, par)        # Accelerate: the engine it hands this config to
        self.overlap_grad = par.overlap_dp_comm and engine.overlap_grad_reduce
        self.overlap_gather = par.overlap_dp_comm and engine.overlap_param_gather
        # the optimizer step's memory-bound kernels at the framework's forward fraction
        self.hbm_bytes_per_s = gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor(fw.elementwise, backward=False)
        self.slowdown = sh.slowdown
        # the framework's data-parallel bucket (dp_bucket_bytes), for gradients and gathered weights
        layer = max(mesh.dense_layer_params, mesh.moe_layer_params + mesh.routed_per_gpu)
        # (Megatron's default grows with the data-parallel group without CP: par.dp)
        self.grad_bucket_bytes = dp_bucket_bytes(fw.dp_bucket, par.dp, sh.g_b, z, layer, fw.dp_bucket_params)
        self.gather_bucket_bytes = dp_bucket_bytes(fw.dp_bucket, par.dp, sh.gather_b, z, layer, fw.dp_bucket_params)
        # a host-bound device's FSDP2 wrapper time (GpuSpec.fsdp2_block_s, dtensor_param_step_s: measured
        # by `planner profile` on CPUs, 0 on GPUs) where the framework wraps its data parallelism in
        # FSDP2 at every ZeRO stage (runtime/parallel.py apply_dp: only when dp > 1)
        wrapped = par.dp > 1 and fw.dp_bucket == "fsdp2"
        self.wrap_block_s = gpu.fsdp2_block_s if wrapped else 0.0
        self.wrap_param_s = gpu.dtensor_param_step_s if wrapped else 0.0
        # DTensor TP's host time per layer per micro-batch on a host-bound device (the same frameworks)
        self.tp_host_s = gpu.dtensor_tp_layer_s if par.tp > 1 and fw.dp_bucket == "fsdp2" else 0.0
        # Megatron-Core counts its dense buckets at tensor boundaries, per stage and model chunk
        # (megatron_stage_buckets; bucket_size None, one bucket, without overlapped reduction:
        # DistributedDataParallel.__init__ at core_v0.14.0)
        self.megatron_buckets = None
        if fw.dp_bucket == "megatron":
            size = megatron_bucket_size(fw.dp_bucket_params, par.dp) if self.overlap_grad else None
            self.megatron_buckets = (sh.layer_numels(par.tp, par.ep, par.etp or None), size)

    def place(self, first: bool, last: bool, crosses: bool) -> "StageModel":
        """Put the stage first and/or last in the pipeline, its neighbour on another node or not."""
        self.first, self.last = first, last
        pl = self.mesh.placements.get((first, last, crosses))
        if pl is None:
            pl = self.mesh.placements[first, last, crosses] = self._placement(first, last, crosses)
        self.pp_comm_s, self.ends_params = pl
        return self

    def _ends_tensors(self) -> tuple[tuple[float, ...], float]:
        """This stage's output head and final norm (backprop order, last stage) and embedding
        (first stage) as Megatron-Core's buffer holds them (``megatron_stage_buckets``)."""
        par = self.par
        return self.sh.ends_tensors(par.tp, par.pp, self.first, self.last)

    def _placement(self, first: bool, last: bool, crosses: bool) -> tuple[float, float]:
        """(pipeline send/receive time per micro-batch, embedding and head parameters)."""
        par, mesh = self.par, self.mesh
        pp_s = 0.0
        if par.pp > 1:
            pp_s = hand_offs(first, last) * launched(mesh.network.p2p(mesh.boundary_bytes, crosses, par.pp))
        return pp_s, ends_params(self.sh.model, par.tp, par.pp, first, last).total

    def cost(self, n_dense: float, n_moe: float, r: float) -> StageCost:
        """The stage's ``StageCost`` with ``n_dense + n_moe`` layers, ``r`` of them recomputed
        fully (spread over the two kinds in proportion; the cost is linear in ``r``): its layers'
        part, its pipeline hand-off, its model-state part."""
        lay = self.layers_part(n_dense, n_moe, r)
        return _new_cost(StageCost, lay + (self.pp_comm_s,) + self.states_part(n_dense, n_moe, lay[0]))

    def layers_part(self, n_dense: float, n_moe: float, r: float) -> tuple[float, ...]:
        """The first fields of ``StageCost`` (``compute_s`` to ``act_fixed_bytes``): the layers'
        terms (``layer_sums``), the output head and the MTP modules on the last stage. They read
        the mesh, ``last``, ``selective`` and the counts (and ``first`` where an unfused gradient
        accumulation counts the embedding), nothing of ZeRO or of the placement's neighbour
        (``stage_cache.stage_cost`` keys them so)."""
        mesh, sh = self.mesh, self.sh
        n = n_dense + n_moe
        r_moe = r * n_moe / n if n else 0.0
        comp, rec, tp, ep, cp, model_flops, hw_flops, act_stored, act_work = layer_sums(
            mesh.dense_terms, n_dense, r - r_moe, mesh.moe_terms, n_moe, r_moe, self.selective)
        mtp = sh.model.mtp_layers if self.last else 0
        autocast = sh.autocast_mode(self.par) == "fp32"
        if autocast or sh.grad_accum_add:
            # the per-micro-batch passes over the stage's weights: its layers and experts, and one
            # vocabulary matrix per embedding or head it holds
            layer_params = n_dense * mesh.dense_layer_params + n_moe * (mesh.moe_layer_params + mesh.routed_per_gpu)
            end_matrix = sh.model.vocab * sh.model.hidden / self.par.tp
            if autocast:
                # autocast's casts of the stage's fp32 weights (layers.autocast_cast_bytes): no FSDP2
                # mixed-precision policy casts them once (_Shared.autocast_mode); the embedding is not
                # autocast, the (tied) head is
                params = layer_params + (end_matrix if self.last else 0.0)
                comp += autocast_cast_bytes(params, sh.a_bytes) / self.hbm_bytes_per_s
            if sh.grad_accum_add:
                # the unfused gradient accumulation (layers.grad_accum_add_bytes): the embedding and the
                # head each accumulate their own gradient, a tied pair once where one stage holds both
                held = ((1 if self.first else 0) + (1 if self.last else 0)
                        - (1 if self.first and self.last and sh.model.tied_embeddings else 0))
                params = layer_params + held * end_matrix
                comp += grad_accum_add_bytes(params, sh.a_bytes, sh.g_b) / self.hbm_bytes_per_s
        if self.last:
            comp += mesh.head_compute_s
            if sh.framework.nan_checks:
                comp += NAN_CHECK_SYNCS * HOST_SYNC_S      # the loss's NaN/Inf checks (nan_check_s)
            model_flops += mesh.head_model_flops
            hw_flops += mesh.head_model_flops
        if mtp:
            # DeepSeek-V3's multi-token-prediction modules (Sec. 2.2; Megatron's --mtp-num-layers, on
            # the last stage): each one more layer of the model's kind, the shared output head once
            # more and its 2h -> h projection (counted with the head: same token count, 2h/V of it)
            lt = mesh.moe_terms or mesh.dense_terms
            head = 1.0 + 2.0 * sh.model.hidden / sh.model.vocab
            comp += mtp * (lt.compute_s + head * mesh.head_compute_s)
            tp += mtp * lt.tp_comm_s
            ep += mtp * lt.ep_comm_s
            cp += mtp * lt.cp_comm_s
            model_flops += mtp * (lt.model_flops + head * mesh.head_model_flops)
            hw_flops += mtp * (lt.hw_flops + head * mesh.head_model_flops)
            act_stored += mtp * (lt.act_selective_bytes if self.selective else lt.act_bytes)
        return (comp, rec, tp, ep, cp, model_flops, hw_flops, act_stored,
                act_work + (mesh.ends.head_act_bytes if self.last else 0.0) + self._ep_overlap_bytes(n_moe))

    def states_part(self, n_dense: float, n_moe: float, comp: float) -> tuple[float, ...]:
        """The last fields of ``StageCost`` (``fsdp_comm_s`` to ``buffers_bytes``): the stage's
        parameters, their ZeRO and data-parallel communication (ZeRO-2/3's overlapped with
        ``comp``, the layers' compute time) and model states. They read the mesh, ``first``,
        ``last``, the ZeRO stage, the gradient overlap and the counts, nothing of recompute
        (``stage_cache.stage_cost`` keys them so)."""
        mesh, sh = self.mesh, self.sh
        n = n_dense + n_moe
        mtp = sh.model.mtp_layers if self.last else 0
        mtp_dense = (mesh.moe_layer_params if mesh.moe_terms else mesh.dense_layer_params) if mtp else 0.0
        dense_params = (n_dense * mesh.dense_layer_params + n_moe * mesh.moe_layer_params + self.ends_params
                        + mtp * (mtp_dense + 2.0 * sh.model.hidden ** 2 / self.par.tp))
        expert_params = (n_moe + (mtp if mesh.moe_terms else 0)) * mesh.routed_per_gpu
        w_b, g_b, k_b = sh.w_b, sh.g_b, sh.k_b
        zs = self.zero
        zero = zs.zero
        slowdown = self.slowdown
        # routed-expert collectives only where the stage holds experts (adding their 0.0 changes
        # nothing); all_gather = reduce_scatter in time
        fsdp = fsdp_tail = fsdp_head = bwd_comm = 0.0
        if zero >= 3:
            # FSDP2 and DeepSpeed stage 3 gather and scatter each layer on its own: the bytes of
            # the whole stage, and one collective's fixed time per layer (the ring's latency
            # grown with the nodes: comm.Network._coefficients), each collective launched
            # (comm.launched) where the group has more than one GPU
            extra = max(0.0, n - 1)
            ag = _calls(mesh.all_gather_shard(dense_params * sh.gather_b) + extra * mesh.shard_latency_s,
                        extra + 1, mesh.dense_shard)
            rs = _calls(mesh.all_gather_shard(dense_params * g_b) + extra * mesh.shard_latency_s,
                        extra + 1, mesh.dense_shard)
            if expert_params:
                extra_e = max(0.0, n_moe - 1)
                ag += _calls(mesh.all_gather_expert(expert_params * sh.gather_b) + extra_e * mesh.expert_latency_s,
                             extra_e + 1, mesh.expert_shard)
                rs += _calls(mesh.all_gather_expert(expert_params * g_b) + extra_e * mesh.expert_latency_s,
                             extra_e + 1, mesh.expert_shard)
            # what runs beside each micro-batch's backward (a chunked loss's extra head reduce-scatters too)
            bwd_comm = ag + rs + self._chunked_head_rs(g_b)
            if self.regather:
                # under torch's pipelining (StageModel.__init__): one gather per micro-batch, beside its
                # backward; the reduce-scatter once per step, after the stage's last backward (below)
                bwd_comm = ag
                fsdp = overlapped(ag, 2 * comp / 3, slowdown)
            else:
                fsdp = overlapped(ag, comp / 3, slowdown) + overlapped(bwd_comm, 2 * comp / 3, slowdown)
            if sh.framework.fsdp2_copies:
                # FSDP2's all-gather copy-outs and reduce-scatter copy-in on the compute stream, at the
                # framework's memory-bound fraction (costmodel.fsdp): not overlapped; only what is sharded
                sharded = ((dense_params if zs.dense_shard > 1 else 0.0)
                           + (expert_params if zs.expert_shard > 1 else 0.0))
                fsdp += fsdp2_copy_bytes(sharded, sh.gather_b, sh.a_bytes, g_b) / self.hbm_bytes_per_s
            if mesh.dense_shard > 1:
                # one layer's collectives at the step's ends (exposed_dp_time)
                fsdp_tail, fsdp_head = rs / (extra + 1), ag / (extra + 1)
            if self.regather:
                fsdp_tail, step_rs = 0.0, rs
        grad_s = gather_s = tail = head = 0.0
        if mesh.data_parallel > 1:
            # gradients and ZeRO-1/2's updated parameters move in buckets, one collective each
            e_dp = mesh.data_parallel // self.par.ep          # ranks holding the same experts
            # each bucket one collective with its fixed time (dp_bucket_bytes: the framework's bucket)
            gb, wb = self.grad_bucket_bytes, self.gather_bucket_bytes
            dcalls = 0                          # the dense buffer's buckets where counted
            if self.megatron_buckets is not None:
                dcalls = sh.stage_buckets(self, int(round(n)))
            if zero == 0:
                grad_s = _bucketed(mesh.all_reduce_dp, dense_params * g_b, mesh.data_parallel, gb, mesh.dp_latency_s,
                                   dcalls)
                tail = _one_bucket(grad_s, dense_params * g_b, mesh.data_parallel, gb, dcalls)
                if expert_params:
                    grad_s += _bucketed(mesh.all_reduce_expert_dp, expert_params * g_b, e_dp, gb)
            else:
                # the replica groups are single ranks unless sharding is hybrid (HSDP): no call then
                if mesh.replicas > 1:
                    grad_s = _bucketed(mesh.all_reduce_replicas, dense_params * g_b / zs.dense_shard, mesh.replicas,
                                       gb, mesh.replica_latency_s, dcalls)
                    tail = _one_bucket(grad_s, dense_params * g_b / zs.dense_shard, mesh.replicas, gb, dcalls)
                if expert_params and mesh.expert_replicas > 1:
                    grad_s += _bucketed(mesh.all_reduce_expert_replicas, expert_params * g_b / zs.expert_shard,
                                        mesh.expert_replicas, gb)
                if zero < 3:
                    rs = _bucketed(mesh.all_gather_shard, dense_params * g_b, mesh.dense_shard, gb,
                                   mesh.shard_latency_s, dcalls)
                    gather_s = _bucketed(mesh.all_gather_shard, dense_params * sh.gather_b, mesh.dense_shard, wb,
                                         mesh.shard_latency_s, dcalls)
                    head = _one_bucket(gather_s, dense_params * sh.gather_b, mesh.dense_shard, wb, dcalls)
                    if expert_params:
                        rs += _bucketed(mesh.all_gather_expert, expert_params * g_b, mesh.expert_shard, gb,
                                        mesh.expert_latency_s)
                        gather_s += _bucketed(mesh.all_gather_expert, expert_params * sh.gather_b, mesh.expert_shard,
                                              wb, mesh.expert_latency_s)
                    if zero == 1:
                        tail += _one_bucket(rs, dense_params * g_b, mesh.dense_shard, gb, dcalls)
                        grad_s += rs
                    else:
                        # ZeRO-2 keeps only its gradient shard, so it cannot accumulate over
                        # micro-batches: a reduce-scatter after every backward (DeepSpeed
                        # stage 2), overlapped with that backward where the framework does
                        # (and a chunked loss's extra head reduce-scatters, StageModel._chunked_head_rs)
                        rs2 = rs + self._chunked_head_rs(g_b)
                        fsdp = overlapped(rs2, 2 * comp / 3, slowdown) if self.overlap_grad else rs2
                        bwd_comm = rs2
                        if sh.framework.fsdp2_copies:
                            # FSDP2 without resharding after forward (ZeRO-2) reshards after backward by
                            # default (costmodel.fsdp), so it gathers the weights before every micro-batch's
                            # forward, beside that forward, not once per step after the optimizer; and pays one
                            # copy-out per micro-batch and the copy-in (costmodel.fsdp)
                            fsdp += (overlapped(gather_s, comp / 3, slowdown) if self.overlap_gather else gather_s)
                            # the first gather still waits before the first layer (exposed_dp_time's ZeRO-3 head),
                            # now once per step on top of the per-micro-batch gathers
                            fsdp_head, gather_s, head = head, 0.0, 0.0
                            sharded = ((dense_params if zs.dense_shard > 1 else 0.0)
                                       + (expert_params if zs.expert_shard > 1 else 0.0))
                            fsdp += fsdp2_copy_bytes(sharded, sh.gather_b, sh.a_bytes, g_b,
                                                     gathers=1) / self.hbm_bytes_per_s
                        if self.overlap_grad:
                            fsdp_tail = _one_bucket(rs, dense_params * g_b, mesh.dense_shard, gb, dcalls)
        if (zero >= 2 and mesh.replicas > 1 and grad_s and sh.framework.hsdp_all_reduce_each_micro_batch
                and not self.deferred_sync):
            # HSDP whose framework leaves FSDP2's replica all-reduce on (FrameworkProfile): after every
            # micro-batch's reduce-scatter, in the same backward window, not once per step (a pipeline
            # schedule holds it to the stage's last backward with the rest: deferred_sync)
            window = 2 * comp / 3
            fsdp += (overlapped(bwd_comm + grad_s, window, slowdown) - overlapped(bwd_comm, window, slowdown)
                     if self.overlap_grad else grad_s)
            fsdp_tail += tail
            grad_s = tail = 0.0
        if self.regather:
            grad_s += step_rs
        if self.deferred_sync:
            # torch's pipelining reduces the whole stage after its last backward (StageModel.__init__):
            # all of it waits as the last bucket does, beside only the later stages' draining backward
            # (exposed_dp_time); the weights are gathered once, before the first micro-batch's forward
            tail = grad_s
        (dw, dg, dk), (ew, eg, ek) = zs.dense, zs.expert
        local = dense_params / dk + expert_params / ek     # what ZeRO-1 and up shard: the optimizer
        # the optimizer step over the local states, the gradient norm's read of the local gradients
        # (clipping: one more pass, scale.GRAD_NORM_READS) and the per-step reductions (scale.step_reductions_s)
        opt_s = (sh.opt_traffic + GRAD_NORM_READS * g_b) * local / self.hbm_bytes_per_s + mesh.step_fixed_s
        if sh.framework.nan_checks and zero < 3:
            # Megatron-Core's gradient NaN/Inf checks before the reduction (nan_check_s): the dense buffer's
            # buckets as it forms them, the expert buffer's one per model chunk (its first stage's bucketed)
            chunks = max(1, self.par.vpp)
            buckets = (sh.stage_buckets(self, int(round(n))) if self.megatron_buckets is not None else chunks)
            if expert_params:
                size = self.megatron_buckets[1] if self.megatron_buckets is not None else None
                buckets += (math.ceil(expert_params / size) + chunks - 1 if self.first and size else chunks)
            opt_s += nan_check_s(buckets, (dense_params + expert_params) * g_b, self.hbm_bytes_per_s)
        if self.wrap_block_s or self.wrap_param_s:
            # FSDP2's host work on a host-bound device: each module the runtime wraps, its hooks every
            # micro-batch, and the optimizer step's DTensor dispatch per parameter tensor (GpuSpec;
            # fsdp2_wrap_counts; multi-token-prediction blocks counted as blocks of the stage's kind)
            wraps, tensors = fsdp2_wrap_counts(sh.model, n + mtp, n_moe + (mtp if n_moe else 0), self.first,
                                               self.last, self.par.ep)
            fsdp += wraps * self.wrap_block_s
            opt_s += tensors * self.wrap_param_s
        if self.tp_host_s:
            # DTensor tensor parallelism's host work, every layer every micro-batch (GpuSpec)
            fsdp += (n + mtp) * self.tp_host_s
        return (fsdp, grad_s, gather_s, opt_s,
                mesh.ends.embed_act_bytes if self.first else 0.0,
                ((dense_params * w_b + self.ends_params * (sh.ends_w_b - w_b)) / dw + expert_params * w_b / ew
                 + n_dense * mesh.dense_scale_bytes + n_moe * mesh.moe_scale_bytes),
                dense_params * g_b / dg + expert_params * g_b / eg,
                dense_params * k_b / dk + expert_params * k_b / ek,
                self.buffers_bytes, tail, head, fsdp_tail, fsdp_head)

    def _chunked_head_rs(self, g_b: float) -> float:
        """The output head's extra gradient reduce-scatters per micro-batch under a chunked loss
        (``FrameworkProfile.loss_chunks``; torchtitan's ``ChunkedLossWrapper``: "Reduce-scatter fires per-chunk",
        its FSDP2 post-backward hook running after each chunk's head backward): chunks - 1 more of the head's
        gradient shard collective, on the last stage where its FSDP shards the head (ZeRO-2/3); the chunks by
        ``FrameworkProfile.chunked_loss``, as the logits held are."""
        mesh, sh = self.mesh, self.sh
        chunks = sh.framework.chunked_loss(sh.model.mtp_layers)
        if not self.last or chunks <= 1 or mesh.dense_shard <= 1 or self.regather or self.deferred_sync:
            # (under torch's pipelining the stage's gradients are reduced once, after its last backward)
            return 0.0
        extra = chunks - 1
        return _calls(mesh.all_gather_shard(extra * mesh.ends.head_params * g_b) + (extra - 1) * mesh.shard_latency_s,
                      extra, mesh.dense_shard)

    def _ep_overlap_bytes(self, n_moe: float) -> float:
        """What Megatron's EP overlap (``--overlap-moe-expert-parallel-comm``: ``ParallelConfig.
        ep_overlap`` or the profile's ``ep_comm_overlap``) adds to a stage's peak activations: one
        MoE layer's stored activations. Its combined 1F1B step runs the forward of layer ``i`` of
        one micro-batch beside the backward of layer ``L-1-i`` of another, and frees that backward
        layer's state only after the pair
        (Megatron-LM @d98e8a64 ``models/common/model_chunk_schedule_plan.py``, the combined loop;
        ``pipeline_parallel/combined_1f1b.py`` for pp 1). The two micro-batches then hold ``i + 1``
        and ``L - i`` layers: ``L + 1``, one layer more than 1F1B's peak. The extra warm-up forward
        the interleaved schedule runs with the overlap (``schedules.get_pp_rank_microbatches``:
        ``num_warmup_microbatches + 1``) is that same peak reached earlier: the first combined step
        starts with it stored and frees one layer of it for each layer the new forward stores, so
        it adds nothing beyond the one layer. Transient working buffers of the two layers at once
        are not counted."""
        mesh, par = self.mesh, self.par
        # on as the time rule has it (costmodel.stage_cache: the plan's or the profile's overlap)
        on = (par.ep_overlap or self.sh.framework.ep_comm_overlap) and par.ep > 1
        if not (on and n_moe > 0 and mesh.moe_terms is not None):
            return 0.0
        lt = mesh.moe_terms
        return lt.act_selective_bytes if self.selective else lt.act_bytes

    def activations(self, c: StageCost, inflight: float) -> float:
        """The stage's activation memory with ``inflight`` micro-batches in flight."""
        return activations_in_flight(inflight, c.act_stored_bytes + c.embed_act_bytes, c.act_fixed_bytes)

    def memory(self, c: StageCost, inflight: float) -> dict[str, float]:
        """The stage's peak memory by category (``memory.stage_memory``)."""
        return stage_memory(c.weights_bytes, c.grads_bytes, c.optimizer_bytes, self.activations(c, inflight),
                            self.reserved_bytes, c.buffers_bytes)

    def dp_exposed(self, c: StageCost, index: int) -> float:
        """Once-per-step DP communication left exposed by stage ``index`` (``exposed_dp_time``)."""
        return exposed_dp_time(c, index, self.overlap_grad, self.overlap_gather, self.slowdown)


def overlapped(comm: float, compute: float, slowdown: float) -> float:
    """What communication ``comm`` adds to ``compute`` it runs beside: the part longer than the
    compute, and ``slowdown`` (the cluster's ``compute_comm_slowdown``) of the overlapped part."""
    if comm <= compute:
        return slowdown * comm
    return comm - compute + slowdown * compute


def exposed_dp_time(c: StageCost, index: int, overlap_grad: bool, overlap_gather: bool, slowdown: float) -> float:
    """Once-per-step DP communication left exposed by stage ``index``: gradients overlap the last
    backward and the ``index`` backward passes of earlier stages still draining; the weight
    all-gather overlaps the first forward. It falls with ``index`` (``slowdown`` <= 1). Without
    the framework's overlap (``StageModel.overlap_*``) each is exposed whole.

    Each end of the step has one bucket nothing of the stage's own compute can hide
    (``StageCost.dp_grad_tail_s``, ``dp_gather_head_s``; ``_one_bucket``): a bucket's reduction
    starts once every gradient in it is ready (Megatron-Core ``distributed/param_and_grad_buffer.py``,
    ``register_grad_ready``: "If all params in bucket group have grads available, issue
    communication call"; torch DDP's ``Reducer`` alike), and the bucket holding the first layers
    (and the embedding) gets its last gradient when the backward ends, so its reduction runs after
    it, overlapping only the backward of earlier pipeline stages still draining (``index``
    backward passes); the optimizer waits for it (``finish_grad_sync``). With the weights'
    all-gather overlapped (``overlap_param_gather``) the first layer's forward pre-hook waits for
    its bucket's gather (``distributed_data_parallel.py``, the forward pre-hook's
    ``finish_param_sync``; ``distrib_optimizer.py``: "the first all-gather is launched
    asynchronously in the next optimizer.zero_grad() call and subsequent all-gathers are launched
    in the forward pre-hook"): exposed but for the ``index`` forwards a later stage waits before
    its first. The rest overlaps as before. ZeRO-2's reduce-scatter after each backward and
    ZeRO-3's per-layer gathers and scatters (``fsdp_comm_s``, priced per micro-batch at the
    overlapped rate) have the same two ends once per step: the last micro-batch's last bucket
    (ZeRO-3: the first layer's reduce-scatter, the last the backward reaches) and, under ZeRO-3,
    the first layer's all-gather before the forward (FSDP prefetches the next layer's, not the
    first); the step pays them whole less the overlapped share ``fsdp_comm_s`` already holds."""
    fwd = c.compute_s / 3
    bwd = 2 * fwd
    # ZeRO-2/3's per-micro-batch collectives (fsdp_comm_s) charge their end buckets at the
    # overlapped rate; at the step's ends they wait whole: the difference (>= 0, ``overlapped``)
    ends = (overlapped(c.fsdp_tail_s, index * bwd, slowdown) - slowdown * c.fsdp_tail_s
            + overlapped(c.fsdp_head_s, index * fwd, slowdown) - slowdown * c.fsdp_head_s)
    if overlap_grad:
        grad = (overlapped(c.dp_grad_tail_s, index * bwd, slowdown)
                + overlapped(c.dp_grad_s - c.dp_grad_tail_s, bwd + index * bwd, slowdown))
    else:
        grad = c.dp_grad_s
    if overlap_gather:
        gather = (overlapped(c.dp_gather_head_s, index * fwd, slowdown)
                  + overlapped(c.dp_gather_s - c.dp_gather_head_s, fwd, slowdown))
    else:
        gather = c.dp_gather_s
    return grad + gather + ends


def inflight_microbatches(par: ParallelConfig, index: int) -> float:
    """Micro-batches whose activations stage ``index`` holds at its peak: 1F1B ``p - index``,
    GPipe all ``m``, interleaved ``1 + (p-1)/(p*v)`` times 1F1B's (Korthikanti et al. 4.2.3)."""
    p, m, v = par.pp, par.grad_accum, par.vpp
    if p == 1:
        return 1.0
    if par.schedule == "gpipe":
        return float(m)
    k = float(min(p - index, m))
    if par.schedule == "interleaved":
        k = min(float(m), k * (1 + (p - 1) / (p * v)))
    return k


def fewest_full_recompute_layers(num_layers: int, capacity_bytes: float, peak_none: float, peak_one: float,
                                 peak_all: float) -> int | None:
    """The fewest of a stage's ``num_layers`` layers to recompute fully so that its peak fits
    ``capacity_bytes``, given its peak with none, one and all of them recomputed (the peak falls
    linearly in their number from one on: each swaps its stored activations for its input, and
    the working set of one recomputing layer appears at the first); ``None`` if even all do not
    fit. The one rule for the solver's tables and bounds."""
    if peak_none <= capacity_bytes:
        return 0
    if peak_one <= capacity_bytes:
        return 1
    if num_layers <= 1 or peak_all > capacity_bytes:
        return None
    per_layer = (peak_one - peak_all) / (num_layers - 1)
    r = 1 + math.ceil((peak_one - capacity_bytes) / per_layer - 1e-9)
    return min(max(r, 1), num_layers)


def interleaved_fill_hops(p: int, v: int) -> float:
    """The pipeline hand-offs an interleaved schedule's fill and drain cross beyond what the step
    rule's bubble ``(S - T) / v`` already holds (0 without virtual stages).

    The first micro-batch's forward crosses every virtual-stage boundary, ``p v - 1`` hand-offs,
    and its last backward as many again; each waits for the one before (the Zero Bubble paper's
    schedule constraints, Qi et al., arXiv 2401.10241 Appendix G: ``E(i,j,F) >= E(i-1,j,F) + T_comm
    + T(i,j,F)``; "the amount of communication also increases by v", Narayanan et al., SC'21 Sec.
    2.2.2). The stage times in ``S`` hold ``hand_offs``: one for each end stage, two for each middle
    one, so with a middle stage the slowest the bubble holds ``(2p - 4) / v`` of them against 1F1B's
    ``2p - 4`` (1F1B's own fill and drain, ``2(p - 1)``, is what the rule has always priced, left as it
    is; an end stage the slowest, or ``p = 2``, shifts either count by one hand-off). What interleaving adds:
    ``2(pv - 1) - (2p - 4) / v - (2(p - 1) - (2p - 4)) = 2p(v - 1) + (2p - 4)(1 - 1/v)``."""
    if p < 2 or v < 2:
        return 0.0
    return 2 * p * (v - 1) + (2 * p - 4) * (1 - 1 / v)


def ep_unpaired_chunks(p: int, v: int, m: int) -> int:
    """Model chunks whose forward, and as many whose backward, Megatron's EP overlap runs unpaired on
    the first pipeline stage in one step (``--overlap-moe-expert-parallel-comm``): its combined 1F1B
    step hides one micro-batch's all-to-alls behind another's compute only where a forward and a
    backward run together, so the warm-up's forwards and the cool-down's backwards run alone, their
    all-to-alls exposed. Megatron-Core at d98e8a64, ``pipeline_parallel/schedules.py``
    ``get_pp_rank_microbatches``: with virtual stages (which the overlap needs when PP > 1,
    ``transformer_config.py`` __post_init__) rank r warms up with ``(p - r - 1) * 2 + (v - 1) *
    microbatch_group_size_per_vp_stage`` chunks (the group size defaults to p) and "one extra
    micro-batch forward step before the 1f1b stages" under the overlap; rank 0, the first stage, has
    the most, and both its warm-up and its cool-down lie on the step's critical path. Without pipeline
    parallelism (``combined_1f1b_schedule_for_no_pipelining``) the first forward and the last backward
    run alone: 1. At most every chunk of the step (``m * v``)."""
    if p <= 1:
        return min(1, m)
    if v <= 1:      # no combined 1F1B without virtual stages (Megatron refuses the overlap there)
        return 0
    return min(m * v, (p - 1) * 2 + (v - 1) * p + 1)


def ep_unpaired_s(p: int, v: int, m: int, moe_layers: int, ep_hidden_s: float) -> float:
    """Once per step: the EP all-to-all time the overlap hides per MoE layer (``LayerTerms.ep_hidden_s``,
    forward and backward) exposed again for the unpaired chunks (``ep_unpaired_chunks``), each
    holding the model's average share of MoE layers, ``moe_layers / (p v)``. The one rule for
    ``estimate`` and the solver's tables (``planner.search.problem``), which add it to the pipeline's
    fill. 0 without the overlap."""
    if ep_hidden_s <= 0.0 or moe_layers <= 0:
        return 0.0
    vv = max(1, v)
    return ep_unpaired_chunks(p, vv, m) * moe_layers / (p * vv) * ep_hidden_s


def pipeline_step(m, v, t_max, t_sum, dp_exposed_s, optimizer_s, fill_s=0):
    """The step time ``m * T + (S - T) / v + F + E + O`` of a pipeline whose slowest stage takes
    ``T`` per micro-batch and whose stages sum to ``S``, ``E`` and ``O`` the slowest stage's exposed
    once-per-step DP time and optimizer (module docstring; Narayanan et al., SC'21, Sec. 2.2), ``F``
    the interleaved fill and drain's extra hand-offs (``interleaved_fill_hops`` times one hand-off).
    The one rule for the step: ``estimate`` (``pipeline_step_time``), the solver's objective on
    its integer tables (``problem.objective_value``) and CP-SAT's objective (``cpsat``), which
    pass ``v * step = pipeline_step(v * m, 1, T, S, v * E, v * O, v * F)`` (with ``v == 1`` nothing is
    divided, so integers and CP-SAT expressions stay what they are)."""
    bubble = t_sum - t_max if v == 1 else (t_sum - t_max) / v
    return m * t_max + bubble + fill_s + dp_exposed_s + optimizer_s


def pipeline_step_time(m: int, v: int, stage_times: tuple[float, ...], dp_exposed_s: float,
                       optimizer_s: float, fill_s: float = 0.0) -> tuple[float, float]:
    """(step time, bubble) of stages taking ``stage_times`` per micro-batch (``pipeline_step``);
    the bubble holds the interleaved fill's extra hand-offs ``fill_s``."""
    t_max = max(stage_times)
    t_sum = sum(stage_times) if len(stage_times) > 1 else t_max
    return (pipeline_step(m, v, t_max, t_sum, dp_exposed_s, optimizer_s, fill_s),
            (t_sum - t_max) / v + fill_s)


def hand_offs(first: bool, last: bool) -> int:
    """Pipeline hand-offs a stage's time holds per micro-batch: the forward activation out and the
    gradient back per boundary, one boundary at an end stage, two in the middle."""
    return 1 if (first or last) else 2


def hand_off_s(pp_comm_s: float, first: bool, last: bool) -> float:
    """One pipeline hand-off of a stage whose ``pp_comm_s`` holds ``hand_offs`` of them."""
    return pp_comm_s / hand_offs(first, last)
