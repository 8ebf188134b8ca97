"""``estimate()``: memory per GPU and time per training step, term by term.

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
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter
from typing import Any, Callable, NamedTuple

from .comm import DEFAULT_ORDER, GroupLayout, Network, axis_stride, crosses_nodes, group_layout, layout_for
from . import fp8 as fp8_recipes
from .frameworks import TP_OVERLAP_MODES, FrameworkProfile, backend_profile, framework_profile, tp_overlap_mode
from .layers import EndsCost, LayerCost, ends_cost, ends_params, layer_cost, layer_matrices, layer_params
from .memory import (DDP_BUCKET_BYTES, activations_in_flight, bytes_per_param, expert_shard,
                     optimizer_traffic_bytes_per_param, param_gather_bytes_per_param, stage_memory, zero_divisors)
from .specs import (ClusterSpec, ModelSpec, NodeGroup, ParallelConfig, SpecError, StageSpec, Workload,
                    default_stages, validate)
from .units import dtype_bytes


@dataclass
class StageEstimate:
    index: int
    first_layer: int
    num_layers: int
    recompute_layers: int
    group: str
    time_per_microbatch_s: float
    memory: dict[str, float]
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.memory["peak_bytes"] <= self.capacity_bytes

    def to_dict(self) -> dict:
        return {"layers": [self.first_layer, self.first_layer + self.num_layers],
                "recompute_layers": self.recompute_layers, "device_group": self.group,
                "time_per_microbatch_s": self.time_per_microbatch_s, "memory": dict(self.memory),
                "capacity_bytes": self.capacity_bytes, "fits": self.fits}


@dataclass
class Estimate:
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory: dict[str, float]
    time: dict[str, float]
    stages: list[StageEstimate] = field(default_factory=list)
    gpus: int = 0
    capacity_bytes: float = 0.0
    bottleneck_stage: int = 0

    @property
    def peak_bytes(self) -> float:
        return self.memory["peak_bytes"]

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    def to_dict(self, stages: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
            "memory": dict(self.memory), "time": dict(self.time), "fits": self.fits,
            "memory_capacity_bytes": self.capacity_bytes, "bottleneck_stage": self.bottleneck_stage,
        }
        if stages:
            d["stages"] = [s.to_dict() for s in self.stages]
        return d


@lru_cache(maxsize=256)
def _network(cluster: ClusterSpec, intra) -> Network:
    return Network(cluster, intra)


def stage_groups(cluster: ClusterSpec, par: ParallelConfig, stages: tuple[StageSpec, ...]) -> list[str]:
    """The node group of each stage; checks that every group has room for its stages."""
    per_stage = par.tp * par.dp * par.cp
    names = [s.group or cluster.groups[0].name for s in stages]
    if len(cluster.groups) > 1 and not any(s.group for s in stages):
        # default: fill groups in order, as many stages as each holds
        names = []
        for g in cluster.groups:
            names += [g.name] * (g.gpus // per_stage)
        if len(names) < len(stages):
            raise SpecError(f"the node groups hold {len(names)} stages of tp*dp*cp = {per_stage} GPUs; "
                            f"pp = {len(stages)} needs more")
        names = names[:len(stages)]
    for g in cluster.groups:
        need = names.count(g.name) * per_stage
        if need > g.gpus:
            raise SpecError(f"node group {g.name!r} has {g.gpus} GPUs but its {names.count(g.name)} stage(s) "
                            f"of tp*dp*cp = {per_stage} need {need}")
    for n in names:
        cluster.group(n)
    return names


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

    compute_s: float             # forward + backward: 3 x forward
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


def layer_terms(lc: LayerCost, slowdown: float, tp_overlap: "bool | str" = False, ep_overlap: bool = False) -> LayerTerms:
    """``LayerTerms`` of a layer cost; ``slowdown`` is the cluster's ``compute_comm_slowdown``
    (0 gives the terms without it, which bound them from below). ``tp_overlap`` is a
    ``tp_overlap_mode`` (True means ``full``): ``full`` (the framework pipelines TP's collectives
    with the GEMMs next to them) prices TP communication as overlapped with the layer's GEMMs, in
    forward and backward; ``backward`` overlaps half of the backward's TP traffic (the
    column-parallel linears' input-gradient collectives) with half of its GEMM time (their weight
    gradients) and leaves the rest exposed; with ``ep_overlap`` (``FrameworkProfile.ep_comm_overlap``)
    the all-to-alls overlap the layer's compute."""
    mode = ("full" if tp_overlap else "none") if isinstance(tp_overlap, bool) else tp_overlap
    assert mode in TP_OVERLAP_MODES, mode
    cp_fwd = overlapped(lc.cp_fwd_s, lc.attn_fwd_s, slowdown)
    if mode == "full":
        tp_fwd = tp_bwd = overlapped(lc.tp_fwd_s, lc.gemm_fwd_s, slowdown)
    elif mode == "backward":
        tp_fwd = lc.tp_fwd_s
        tp_bwd = lc.tp_fwd_s / 2 + overlapped(lc.tp_fwd_s / 2, lc.gemm_fwd_s / 2, slowdown)
    else:
        tp_fwd = tp_bwd = lc.tp_fwd_s
    ep_fwd = overlapped(lc.ep_fwd_s, lc.fwd_s, slowdown) if ep_overlap else lc.ep_fwd_s
    return LayerTerms(compute_s=3 * lc.fwd_s, tp_comm_s=tp_fwd + tp_bwd, ep_comm_s=2 * ep_fwd,
                      cp_comm_s=3 * cp_fwd, recompute_s=lc.fwd_s + tp_fwd + ep_fwd + cp_fwd,
                      model_flops=3 * lc.model_flops_fwd, hw_flops=3 * lc.hw_flops_fwd,
                      recompute_flops=lc.hw_flops_fwd, selective_s=lc.selective_extra_s,
                      selective_flops=lc.selective_extra_flops, act_selective_bytes=lc.act_selective_bytes,
                      act_bytes=lc.act_bytes, act_input_bytes=lc.act_input_bytes)


@dataclass(slots=True)
class StageCost:
    """A stage's cost per micro-batch (times), its FLOPs, and its memory parts before the
    micro-batches in flight are counted (``StageModel.memory``)."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    ep_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    fsdp_comm_s: float             # exposed ZeRO-3 gathers and scatters, ZeRO-2 scatters, per micro-batch
    dp_grad_s: float               # once per step: gradient reduction (before overlap)
    dp_gather_s: float             # once per step: ZeRO-1/2 weight all-gather (before overlap)
    optimizer_s: float
    model_flops: float
    hw_flops: float
    act_stored_bytes: float        # per micro-batch in flight
    act_fixed_bytes: float         # recompute working set + logits (last stage)
    embed_act_bytes: float         # per micro-batch in flight, first stage
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    buffers_bytes: float

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


def fp8_recipe_of(cluster: ClusterSpec, workload: Workload, framework: "str | FrameworkProfile"
                  ) -> fp8_recipes.Fp8Recipe | None:
    """The FP8 recipe a training workload runs (None unless ``dtype == "fp8"``): the workload's,
    else the framework's default for the first node group's GPU; every node group must run it."""
    if workload.dtype != "fp8" or workload.mode != "train":
        return None
    name = framework_profile(framework).name
    rec = fp8_recipes.resolve(workload.fp8_recipe, name, cluster.groups[0].gpu, workload.fp8_param_gather)
    for g in cluster.groups[1:]:
        fp8_recipes.resolve(rec.name, name, g.gpu)
    return rec


class _Shared:
    """What the configurations on one (model, cluster, workload) share: bytes per value, the
    model's parameter counts, each node group's network and GPU constants; and, as they come up,
    the sub-terms many configurations have in common -- layer and ends costs, a mesh's groups,
    the stage kinds of an even split, micro-batches in flight -- under plain-tuple keys (cheaper
    than hashing the specs again)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, framework: FrameworkProfile):
        self.model, self.cluster, self.workload, self.framework = model, cluster, workload, framework
        dt = workload.dtype
        # FP8 training: one recipe for the run (the first node group's GPU picks the default;
        # every group must have FP8 tensor cores), BF16 for all but the linear GEMMs
        self.fp8 = fp8_recipe_of(cluster, workload, framework)
        self.a_bytes = dtype_bytes(fp8_recipes.COMPUTE_DTYPE if self.fp8 else dt)
        self.w_b, self.g_b, self.k_b = bytes_per_param(dt, workload.optimizer, self.fp8)
        self.gather_b = param_gather_bytes_per_param(dt, self.fp8)
        self.opt_traffic = optimizer_traffic_bytes_per_param(dt, workload.optimizer, self.fp8)
        self.total_params = model.total_params()
        self.main = cluster.groups[0].name
        self.single = len(cluster.groups) == 1
        # the fraction of overlapped communication that still costs compute time (measured by
        # `planner profile`: ~0 where copy engines move data, ~1 where one CPU core does both)
        self.slowdown = cluster.compute_comm_slowdown
        # node group -> (group, network, peak FLOP/s in the workload's dtype)
        self.groups = {g.name: (g, _network(cluster, g.intra_node), g.gpu.peak(dt)) for g in cluster.groups}
        # sub-terms, each keyed on what it depends on (never on a whole configuration)
        self.layers: dict[tuple, tuple[LayerCost, LayerTerms]] = {}
        self.ends: dict[tuple, EndsCost] = {}
        self.splits: dict[tuple, tuple] = {}
        self.meshes: dict[tuple, StageMesh] = {}
        self.flights: dict[tuple, list[float]] = {}

    def layer(self, moe: bool, par: ParallelConfig, grp, tp_lay, ep_lay, cp_lay) -> tuple[LayerCost, LayerTerms]:
        """One layer's cost, and the per-layer terms ``StageModel.cost`` multiplies by layer counts."""
        key = (moe, par.tp, par.cp, par.ep, par.sp, par.micro_batch, grp.name, tp_lay, ep_lay, cp_lay)
        hit = self.layers.get(key)
        if hit is None:
            lc = layer_cost(self.model, moe, self.workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch,
                            grp.gpu, self.cluster, grp.intra_node, tp_lay, ep_lay, cp_lay,
                            self.framework.kernel_efficiency, self.fp8)
            tp_overlap = tp_overlap_mode(self.framework, par, tp_lay)
            hit = self.layers[key] = (lc, layer_terms(lc, self.slowdown, tp_overlap,
                                                      self.framework.ep_comm_overlap and moe and par.ep > 1))
        return hit

    def inflight(self, par: ParallelConfig) -> list[float]:
        """Micro-batches in flight on each stage (``inflight_microbatches`` of every index)."""
        key = (par.pp, par.grad_accum, par.vpp, par.schedule)
        fl = self.flights.get(key)
        if fl is None:
            fl = self.flights[key] = [inflight_microbatches(par, i) for i in range(par.pp)]
        return fl

    def mesh(self, par: ParallelConfig, order: tuple[str, ...], grp) -> StageMesh:
        """The ``StageMesh`` of a node group, mesh order and micro-batch: where the dp, ZeRO-shard
        and replica groups sit, with the collective-time functions ``StageModel.cost`` reduces
        gradients with; the layer and ends costs; per-layer parameter counts on a GPU."""
        key = (order, par.pp, par.dp, par.cp, par.tp, par.ep, par.dp_shard, par.sp, par.micro_batch, grp.name)
        mesh = self.meshes.get(key)
        if mesh is not None:
            return mesh
        model, t = self.model, par.tp
        gpn = grp.nvlink_gpus          # the NVLink domain: the fast tier of every group layout
        net = self.groups[grp.name][1]
        degrees = _degrees(par)
        dp_stride = axis_stride(degrees, order, "dp")
        tp_lay = group_layout(degrees, order, "tp", gpn)
        cp_lay = group_layout(degrees, order, "cp", gpn)
        dp_only = group_layout(degrees, order, "dp", gpn)
        ep_lay = layout_for(par.ep, dp_stride, gpn)
        e_shard = expert_shard(par)
        # the ranks that hold the same dense weights are the dp x cp ranks (context parallel
        # ranks hold the whole layer, each for part of the sequence): gradients are reduced, and
        # ZeRO shards, over dp x cp, as Megatron's distributed optimizer (``intra_dp_cp_group``)
        # and torchtitan's FSDP mesh (``dp_shard_cp``) do; members per node multiply
        shard_only = layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else GroupLayout(1, 1)
        dp_lay = _joint(dp_only, cp_lay, gpn)
        shard_lay = _joint(shard_only, cp_lay, gpn)
        e_lay = layout_for(e_shard, dp_stride * par.ep, gpn)
        rep_lay = layout_for(par.dp // par.dp_shard, dp_stride * par.dp_shard, gpn)
        e_rep_lay = layout_for(max(1, par.dp * par.cp // par.ep // e_shard), dp_stride * par.ep * e_shard, gpn)
        e_all_lay = layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn)
        dense, dense_terms = self.layer(False, par, grp, tp_lay, ep_lay, cp_lay)
        moe, moe_terms = self.layer(True, par, grp, tp_lay, ep_lay, cp_lay) if model.is_moe else (None, None)
        ends = self.ends_of(par, grp)
        dense_p = layer_params(model, False, t, par.ep)
        moe_p = layer_params(model, True, t, par.ep) if model.is_moe else None
        mesh = self.meshes[key] = StageMesh(
            group=grp, network=net, dense=dense, dense_terms=dense_terms, moe=moe, moe_terms=moe_terms, ends=ends,
            head_compute_s=3 * ends.head_fwd_s, head_model_flops=3 * ends.head_model_flops_fwd,
            boundary_bytes=(par.micro_batch * self.workload.seq_len / par.cp * model.hidden * self.a_bytes
                            / (t if par.sp else 1)),
            dense_layer_params=dense_p.total,
            dense_scale_bytes=self.scale_bytes(False, par), moe_scale_bytes=self.scale_bytes(True, par),
            moe_layer_params=moe_p.total - moe_p.experts if moe_p else 0.0,
            routed_per_gpu=moe_p.experts if moe_p else 0.0,
            expert_shard=e_shard, data_parallel=par.dp * par.cp, dense_shard=par.dp_shard * par.cp,
            shard_latency_s=net.latency_s(shard_lay), expert_latency_s=net.latency_s(e_lay),
            replicas=rep_lay.n, expert_replicas=e_rep_lay.n,
            all_gather_shard=net.all_gather_fn(shard_lay), all_gather_expert=net.all_gather_fn(e_lay),
            all_reduce_dp=net.all_reduce_fn(dp_lay), all_reduce_expert_dp=net.all_reduce_fn(e_all_lay),
            all_reduce_replicas=net.all_reduce_fn(rep_lay), all_reduce_expert_replicas=net.all_reduce_fn(e_rep_lay),
            placements={})
        return mesh

    def scale_bytes(self, moe: bool, par: ParallelConfig) -> float:
        """FP8 scaling state of one layer's GEMM weights on a GPU (``Fp8Recipe.scaling_state_bytes``)."""
        if self.fp8 is None or (moe and not self.model.is_moe):
            return 0.0
        mats = layer_matrices(self.model, moe, par.tp, par.ep)
        return self.fp8.scaling_state_bytes(sum(m.count for m in mats if m.role != "router"))

    def ends_of(self, par: ParallelConfig, grp) -> EndsCost:
        key = (par.tp, par.cp, par.sp, par.micro_batch, grp.name)
        ec = self.ends.get(key)
        if ec is None:
            ec = self.ends[key] = ends_cost(self.model, self.workload, par.tp, par.cp, par.sp, par.micro_batch,
                                            grp.gpu, self.cluster, self.framework.kernel_efficiency)
        return ec

    def split(self, par: ParallelConfig, order: tuple[str, ...]) -> tuple:
        """The default even split into ``par.pp`` stages on the one node group, and its stage kinds:
        ``(stages, first layers, kind of each stage, _per_stage of those, kinds)``, a kind being
        ``(group, first, last, neighbour on another node, layers, MoE layers, layers recomputed
        fully, index of its first stage)``: stages of one kind cost the same."""
        pp = par.pp
        key = (pp, order, par.dp, par.cp, par.tp, par.recompute, par.recompute_layers)
        sp = self.splits.get(key)
        if sp is None:
            stages = default_stages(self.model.layers, pp)
            ids: list[int] = []
            shapes: dict[tuple, int] = {}
            for i, st in enumerate(stages):
                shape = (i == 0, i == pp - 1, st.num_layers, self.model.moe_layers_in(st.first_layer, st.last_layer))
                ids.append(shapes.setdefault(shape, len(shapes)))
            g = self.main
            crosses = stage_crosses(self.cluster, par, order, None, 0)
            descs = [(g, first, last, crosses, n, n_moe, par.full_recompute_layers(n, 0), ids.index(s))
                     for (first, last, n, n_moe), s in shapes.items()]
            sp = self.splits[key] = (stages, [st.first_layer for st in stages], ids, _per_stage(ids), descs)
        return sp


def _joint(a: GroupLayout, b: GroupLayout, gpus_per_node: int) -> GroupLayout:
    """The layout of the group spanned by two orthogonal groups (dp and cp): ``a.n * b.n``
    members, the per-node members of each multiplied."""
    n = a.n * b.n
    if n <= 1:
        return GroupLayout(1, 1)
    return GroupLayout(n, max(1, min(gpus_per_node, a.k * b.k, n)))


@lru_cache(maxsize=64)
def _shared_equal(model: ModelSpec, cluster: ClusterSpec, workload: Workload, framework: FrameworkProfile) -> _Shared:
    return _Shared(model, cluster, workload, framework)


_SHARED_BY_ID: dict[tuple[int, int, int, int], _Shared] = {}


def _shared(model: ModelSpec, cluster: ClusterSpec, workload: Workload, framework: FrameworkProfile) -> _Shared:
    """The ``_Shared`` of these specs: looked up by identity first (hashing three specs costs more
    than the rest of a small estimate), then by equality. An identity hit is taken only when the
    entry's specs are these very objects, so a reused id never finds another's entry."""
    key = (id(model), id(cluster), id(workload), id(framework))
    sh = _SHARED_BY_ID.get(key)
    if (sh is None or sh.model is not model or sh.cluster is not cluster or sh.workload is not workload
            or sh.framework is not framework):
        sh = _shared_equal(model, cluster, workload, framework)
        if len(_SHARED_BY_ID) >= 64:
            del _SHARED_BY_ID[next(iter(_SHARED_BY_ID))]
        _SHARED_BY_ID[key] = sh
    return sh


class StageModel:
    """The cost of one pipeline stage as a function of how many layers it holds (``n``, of which
    ``n_moe`` are MoE layers) and how many of them recompute fully (``r``). Built once per
    (configuration, node group, position) for the solver's tables; ``estimate`` builds one per
    node group and ``place``s it at each kind of stage in turn; both call ``cost``, so the two
    always agree."""

    __slots__ = ("sh", "par", "mesh", "zero", "buffers_bytes", "selective", "reserved_bytes", "capacity_bytes",
                 "hbm_bytes_per_s", "slowdown", "overlap_grad", "overlap_gather", "first", "last", "pp_comm_s",
                 "ends_params")

    def __init__(self, sh: _Shared, par: ParallelConfig, order: tuple[str, ...], grp: NodeGroup):
        mesh = sh.mesh(par, order, grp)
        self.sh, self.par, self.mesh = sh, par, mesh
        z = par.zero
        if z >= 3:
            biggest = max(mesh.dense.params, mesh.moe.params if mesh.moe else 0.0)
            # FSDP prefetches the next layer's weights while the current one runs: two
            # layers of gathered weights live
            self.buffers_bytes = 2 * biggest * sh.gather_b if mesh.dense_shard > 1 else 0.0
        else:
            whole = sh.total_params / (par.tp * par.pp) * sh.g_b
            self.buffers_bytes = min(DDP_BUCKET_BYTES, whole) if mesh.data_parallel > 1 else 0.0
        self.zero = ZeroSharding(z, mesh.dense_shard, mesh.expert_shard, zero_divisors(z, mesh.dense_shard),
                                 zero_divisors(z, mesh.expert_shard))
        self.selective = par.recompute == "selective"
        gpu = grp.gpu
        fw = sh.framework
        # what a plan may use: the GPU's memory less the framework's headroom (costmodel.frameworks)
        self.reserved_bytes = gpu.reserved_bytes
        self.capacity_bytes = gpu.memory_bytes * (1.0 - fw.memory_headroom_fraction)
        engine = backend_profile(fw, par)        # Accelerate: the engine it hands this config to
        self.overlap_grad = par.overlap_dp_comm and engine.overlap_grad_reduce
        self.overlap_gather = par.overlap_dp_comm and engine.overlap_param_gather
        self.hbm_bytes_per_s = gpu.hbm_bandwidth_bytes_per_s
        self.slowdown = sh.slowdown
        self.first = self.last = False
        self.pp_comm_s = self.ends_params = 0.0

    def place(self, first: bool, last: bool, crosses: bool) -> "StageModel":
        """Put the stage first and/or last in the pipeline, its neighbour on another node or not."""
        self.first, self.last = first, last
        pl = self.mesh.placements.get((first, last, crosses))
        if pl is None:
            pl = self.mesh.placements[first, last, crosses] = self._placement(first, last, crosses)
        self.pp_comm_s, self.ends_params = pl
        return self

    def _placement(self, first: bool, last: bool, crosses: bool) -> tuple[float, float]:
        """(pipeline send/receive time per micro-batch, embedding and head parameters)."""
        par, mesh = self.par, self.mesh
        pp_s = 0.0
        if par.pp > 1:
            # forward activation out and gradient back per boundary; middle stages have two boundaries
            pp_s = (1 if (first or last) else 2) * mesh.network.p2p(mesh.boundary_bytes, crosses)
        return pp_s, ends_params(self.sh.model, par.tp, par.pp, first, last).total

    def cost(self, n_dense: float, n_moe: float, r: float) -> StageCost:
        """The stage's ``StageCost`` with ``n_dense + n_moe`` layers, ``r`` of them recomputed
        fully (spread over the two kinds in proportion; the cost is linear in ``r``)."""
        mesh, sh = self.mesh, self.sh
        n = n_dense + n_moe
        r_moe = r * n_moe / n if n else 0.0
        comp = rec = tp = ep = cp = model_flops = hw_flops = act_stored = act_work = 0.0
        selective = self.selective
        for lt, k, kr in ((mesh.dense_terms, n_dense, r - r_moe), (mesh.moe_terms, n_moe, r_moe)):
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
        ec = mesh.ends
        if self.last:
            comp += mesh.head_compute_s
            model_flops += mesh.head_model_flops
            hw_flops += mesh.head_model_flops
        dense_params = n_dense * mesh.dense_layer_params + n_moe * mesh.moe_layer_params + self.ends_params
        expert_params = n_moe * mesh.routed_per_gpu
        w_b, g_b, k_b = sh.w_b, sh.g_b, sh.k_b
        zs = self.zero
        zero = zs.zero
        slowdown = self.slowdown
        # routed-expert collectives only where the stage holds experts (adding their 0.0 changes
        # nothing); all_gather = reduce_scatter in time
        fsdp = 0.0
        if zero >= 3:
            # FSDP2 and DeepSpeed stage 3 gather and scatter each layer on its own: the bytes of
            # the whole stage, and one collective's fixed time per layer (the ring's latency
            # grows with the nodes: comm.Network._coefficients)
            extra = max(0.0, n - 1)
            ag = mesh.all_gather_shard(dense_params * sh.gather_b) + extra * mesh.shard_latency_s
            rs = mesh.all_gather_shard(dense_params * g_b) + extra * mesh.shard_latency_s
            if expert_params:
                extra_e = max(0.0, n_moe - 1)
                ag += mesh.all_gather_expert(expert_params * sh.gather_b) + extra_e * mesh.expert_latency_s
                rs += mesh.all_gather_expert(expert_params * g_b) + extra_e * mesh.expert_latency_s
            fsdp = overlapped(ag, comp / 3, slowdown) + overlapped(ag + rs, 2 * comp / 3, slowdown)
        grad_s = gather_s = 0.0
        if mesh.data_parallel > 1:
            if zero == 0:
                grad_s = mesh.all_reduce_dp(dense_params * g_b)
                if expert_params:
                    grad_s += mesh.all_reduce_expert_dp(expert_params * g_b)
            else:
                # the replica groups are single ranks unless sharding is hybrid (HSDP): no call then
                if mesh.replicas > 1:
                    grad_s = mesh.all_reduce_replicas(dense_params * g_b / zs.dense_shard)
                if expert_params and mesh.expert_replicas > 1:
                    grad_s += mesh.all_reduce_expert_replicas(expert_params * g_b / zs.expert_shard)
                if zero < 3:
                    rs = mesh.all_gather_shard(dense_params * g_b)
                    gather_s = mesh.all_gather_shard(dense_params * sh.gather_b)
                    if expert_params:
                        rs += mesh.all_gather_expert(expert_params * g_b)
                        gather_s += mesh.all_gather_expert(expert_params * sh.gather_b)
                    if zero == 1:
                        grad_s += rs
                    else:
                        # ZeRO-2 keeps only its gradient shard, so it cannot accumulate over
                        # micro-batches: a reduce-scatter after every backward (DeepSpeed
                        # stage 2), overlapped with that backward where the framework does
                        fsdp = overlapped(rs, 2 * comp / 3, slowdown) if self.overlap_grad else rs
        (dw, dg, dk), (ew, eg, ek) = zs.dense, zs.expert
        local = dense_params / dk + expert_params / ek     # what ZeRO-1 and up shard: the optimizer
        return StageCost(
            compute_s=comp, recompute_s=rec, tp_comm_s=tp, ep_comm_s=ep, cp_comm_s=cp, pp_comm_s=self.pp_comm_s,
            fsdp_comm_s=fsdp, dp_grad_s=grad_s, dp_gather_s=gather_s,
            optimizer_s=sh.opt_traffic * local / self.hbm_bytes_per_s,
            model_flops=model_flops, hw_flops=hw_flops, act_stored_bytes=act_stored,
            act_fixed_bytes=act_work + (ec.head_act_bytes if self.last else 0.0),
            embed_act_bytes=ec.embed_act_bytes if self.first else 0.0,
            weights_bytes=(dense_params * w_b / dw + expert_params * w_b / ew
                           + n_dense * mesh.dense_scale_bytes + n_moe * mesh.moe_scale_bytes),
            grads_bytes=dense_params * g_b / dg + expert_params * g_b / eg,
            optimizer_bytes=dense_params * k_b / dk + expert_params * k_b / ek,
            buffers_bytes=self.buffers_bytes)

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
    t = max(0.0, comm - compute)
    return t + slowdown * min(comm, compute) if slowdown else t


def exposed_dp_time(c: StageCost, index: int, overlap_grad: bool, overlap_gather: bool, slowdown: float) -> float:
    """Once-per-step DP communication left exposed by stage ``index``: gradients overlap the last
    backward and the ``index`` backward passes of earlier stages still draining; the weight
    all-gather overlaps the first forward. It falls with ``index`` (``slowdown`` <= 1). Without
    the framework's overlap (``StageModel.overlap_*``) each is exposed whole."""
    bwd = 2 * c.compute_s / 3
    grad = overlapped(c.dp_grad_s, bwd + index * bwd, slowdown) if overlap_grad else c.dp_grad_s
    gather = overlapped(c.dp_gather_s, c.compute_s / 3, slowdown) if overlap_gather else c.dp_gather_s
    return grad + gather


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


def stage_model(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                order: tuple[str, ...], group: str, first: bool, last: bool, crosses: bool,
                framework: "str | FrameworkProfile" = "generic") -> StageModel:
    """A placed ``StageModel`` (memoized: the solver's tables and bounds ask for few of them)."""
    return _stage_model(model, cluster, workload, par, order, group, first, last, crosses,
                        framework_profile(framework))


@lru_cache(maxsize=4096)
def _stage_model(model, cluster, workload, par, order, group, first, last, crosses, framework) -> StageModel:
    return StageModel(_shared(model, cluster, workload, framework), par, order, cluster.group(group)).place(
        first, last, crosses)


@lru_cache(maxsize=1024)
def _per_stage_ids(ids: tuple[int, ...]):
    if len(ids) == 1:
        k = ids[0]
        return lambda values: (values[k],)
    return itemgetter(*ids)


def _per_stage(ids: list[int]):
    """``values -> tuple(values[k] for k in ids)`` (an ``itemgetter``: one C call per list)."""
    return _per_stage_ids(tuple(ids))


def pipeline_step_time(m: int, v: int, stage_times: tuple[float, ...], dp_exposed_s: float,
                       optimizer_s: float) -> tuple[float, float]:
    """(step time, bubble): ``m * max(t) + (sum(t) - max(t)) / v`` plus the exposed once-per-step
    DP time and the optimizer (module docstring; Narayanan et al., SC'21, Sec. 2.2)."""
    t_max = max(stage_times)
    bubble = (sum(stage_times) - t_max) / v if len(stage_times) > 1 else 0.0
    return m * t_max + bubble + dp_exposed_s + optimizer_s, bubble


def estimate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
             stages: tuple[StageSpec, ...] | None = None, order: tuple[str, ...] | None = None,
             framework: "str | FrameworkProfile" = "generic") -> Estimate:
    """Memory per GPU and time per step of one training configuration (see module docstring),
    as ``framework`` runs it (``costmodel.frameworks``: its overlaps, kernels, memory headroom).

    Stages with the same node group, position (first, last, middle), neighbour placement and
    layer counts cost the same: each such kind is costed once, then every stage gets its own
    in-flight micro-batches, memory and row."""
    validate(model, cluster, workload, par)
    order = tuple(order or DEFAULT_ORDER)
    sh = _shared(model, cluster, workload, framework_profile(framework))
    m, p, v = par.grad_accum, par.pp, par.vpp
    # stage kinds: (node group, first, last, neighbour on another node, layers, MoE layers,
    # layers recomputed fully, index of the kind's first stage); ids: each stage's kind
    if stages is None and sh.single:
        # the even split on the one node group: p stages of at least vpp layers each, as
        # validate() checked pp * vpp <= layers; they fill the group, as it checked the world size
        stages, firsts, ids, per_stage_of, descs = sh.split(par, order)
    else:
        if stages is None:
            stages = default_stages(model.layers, p)
        if len(stages) != p or sum(s.num_layers for s in stages) != model.layers:
            raise SpecError(f"stage split {[s.num_layers for s in stages]} must have pp = {p} stages "
                            f"covering all {model.layers} layers")
        if any(s.num_layers < 1 for s in stages) or v > 1 and any(s.num_layers < v for s in stages):
            raise SpecError(f"every stage needs at least vpp = {v} layer(s): {[s.num_layers for s in stages]}")
        groups = stage_groups(cluster, par, stages)
        firsts, ids, seen, descs = [], [], {}, []
        for i, st in enumerate(stages):
            n = st.num_layers
            key = (groups[i], i == 0, i == p - 1, stage_crosses(cluster, par, order, groups, i), n,
                   model.moe_layers_in(st.first_layer, st.last_layer),
                   par.full_recompute_layers(n, st.recompute_layers))
            k = seen.get(key)
            if k is None:
                k = seen[key] = len(descs)
                descs.append(key + (i,))
            ids.append(k)
            firsts.append(st.first_layer)
        per_stage_of = _per_stage(ids)      # a kind-indexed list -> its value at every stage
    models: dict[str, StageModel] = {}      # per node group, placed at each kind's position in turn
    kind_cost: list[StageCost] = []
    kinds = []                              # what a stage's row needs of its kind
    kind_mf, kind_hf, kind_peak = [], [], []  # model and hardware FLOPs, peak FLOP/s
    dp_exposed = opt_s = 0.0
    for g, first, last, crosses, n, n_moe, n_full, i0 in descs:
        sm = models.get(g)
        if sm is None:
            sm = models[g] = StageModel(sh, par, order, sh.groups[g][0])
        c = sm.place(first, last, crosses).cost(n - n_moe, n_moe, n_full)
        # the exposed DP time at the kind's first stage (it falls with the stage index, so that
        # is the kind's largest); the step waits for the slowest stage's reduction and optimizer
        dp_exposed = max(dp_exposed, sm.dp_exposed(c, i0))
        opt_s = max(opt_s, c.optimizer_s)
        kind_cost.append(c)
        kinds.append((c.weights_bytes, c.grads_bytes, c.optimizer_bytes, c.act_stored_bytes + c.embed_act_bytes,
                      c.act_fixed_bytes, sm.reserved_bytes, c.buffers_bytes, sm.capacity_bytes, n, n_full, g,
                      c.time_s))
        kind_mf.append(c.model_flops)
        kind_hf.append(c.hw_flops)
        kind_peak.append(sh.groups[g][2])
    # each stage's memory and row; the stage nearest its capacity
    rows = []
    fullest_mem, fullest_cap, fullest_ratio = None, 0.0, -1.0
    for i, kind, infl, first_layer in zip(range(p), per_stage_of(kinds), sh.inflight(par), firsts):
        w, gr, o, act_per, act_fixed, reserved, buffers, cap, n, n_full, g, t = kind
        mem = stage_memory(w, gr, o, activations_in_flight(infl, act_per, act_fixed), reserved, buffers)
        rows.append(StageEstimate(i, first_layer, n, n_full, g, t, mem, cap))
        ratio = mem["peak_bytes"] / cap
        if ratio > fullest_ratio:
            fullest_mem, fullest_cap, fullest_ratio = mem, cap, ratio
    times = tuple(r.time_per_microbatch_s for r in rows)
    step, bubble = pipeline_step_time(m, v, times, dp_exposed, opt_s)
    j = times.index(max(times))
    b = kind_cost[ids[j]]
    time = {"compute_s": m * b.compute_s, "recompute_s": m * b.recompute_s, "tp_comm_s": m * b.tp_comm_s,
            "cp_comm_s": m * b.cp_comm_s, "ep_comm_s": m * b.ep_comm_s,
            "dp_comm_s": m * b.fsdp_comm_s + dp_exposed, "pp_comm_s": m * b.pp_comm_s,
            "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    per_stage = par.tp * par.dp * par.cp
    # summed stage by stage, in order
    model_flops_total = sum(per_stage_of(kind_mf)) * per_stage * m
    hw_flops_total = sum(per_stage_of(kind_hf)) * per_stage * m
    peak_total = sum(per_stage_of(kind_peak)) * per_stage
    tokens = workload.global_batch * workload.seq_len
    return Estimate(step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / gpus,
                    model_tflops_per_gpu=model_flops_total / step / gpus / 1e12,
                    hardware_tflops_per_gpu=hw_flops_total / step / gpus / 1e12,
                    mfu=model_flops_total / step / peak_total, hfu=hw_flops_total / step / peak_total,
                    memory=dict(fullest_mem), time=time, stages=rows, gpus=gpus, capacity_bytes=fullest_cap,
                    bottleneck_stage=j)
