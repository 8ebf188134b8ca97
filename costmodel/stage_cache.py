"""What the training estimates of one (model, cluster, workload, framework) share, cached: bytes
per value, each node group's network, one layer's cost and terms per shape (``_Shared.layer``),
a mesh's groups and collective-time functions (``StageMesh``), an even split's stage kinds, a
stage kind's two cost parts and its exposed DP time on its mesh (``kind_cost``, for ``estimate``;
``stage_cost``), a stage model's settings per mesh (``StageMesh.settings``), Megatron's end
tensors and bucket counts (``_Shared.ends_tensors``, ``stage_buckets``); and placed stage models
keyed on a whole configuration (``stage_model``, for the solver's tables and bounds).
``clear_stage_costs`` forgets the kinds' parts, the settings and the Megatron memos (not the
per-shape terms, meshes, placements or splits).
Nothing here is a rule: each entry is what a rule in ``costmodel.stage_terms`` (or
``costmodel.layers``, ``costmodel.comm``) returns, computed once.
"""
from __future__ import annotations

import dataclasses
import weakref
from functools import lru_cache
from operator import itemgetter

from .comm import GroupLayout, Network, axis_stride, group_layout, layout_for
from . import fp8 as fp8_recipes
from .frameworks import (FrameworkProfile, attention_impl, curves_measured, framework_profile, kernel_efficiency_on,
                         tp_overlap_mode)
from .scale import step_reductions_s
from .layers import (EndsCost, LayerCost, ends_cost, ends_params, layer_cost, layer_matrices, layer_params,
                     model_flops_per_token)
from .memory import (bytes_per_param, ends_weight_bytes_per_param, expert_shard,
                     optimizer_traffic_bytes_per_param, param_gather_bytes_per_param)
from .moe import comm_sm_share
from .specs import (ClusterSpec, ModelSpec, ParallelConfig, Workload,
                    default_stages)
from .units import dtype_bytes
from .stage_terms import (LayerSums, LayerTerms, StageCost, StageMesh, StageModel, _degrees, _new_cost,
                          fp8_recipe_of, head_compute_s, inflight_microbatches, layer_sums, layer_terms, megatron_layer_numels,
                          megatron_stage_buckets, stage_crosses)


# every live _Shared (those estimate looks up by identity or equality, and any built directly), so
# that clear_stage_costs reaches each one's memos
_ALL_SHARED: "weakref.WeakSet[_Shared]" = weakref.WeakSet()


@lru_cache(maxsize=256)
def _network(cluster: ClusterSpec, intra) -> Network:
    return Network(cluster, intra)


class _Shared:
    """What the configurations on one (model, cluster, workload) share: bytes per value, the
    model's parameter counts, each node group's network and GPU constants; and, as they come up,
    the sub-terms many configurations have in common -- layer and ends costs, a mesh's groups,
    the stage kinds of an even split, micro-batches in flight -- under plain-tuple keys (cheaper
    than hashing the specs again)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, framework: FrameworkProfile):
        self.model, self.cluster, self.workload, self.framework = model, cluster, workload, framework
        # the attention implementation, fixed per profile except Accelerate's (its engine depends
        # on the configuration: ``frameworks.attention_impl`` per layer then)
        self.attention = None if framework.name == "accelerate" else attention_impl(framework, None, model.family)
        dt = workload.dtype
        # FP8 training: one recipe for the run (the first node group's GPU picks the default;
        # every group must have FP8 tensor cores), BF16 for all but the linear GEMMs
        self.fp8 = fp8_recipe_of(cluster, workload, framework)
        # torchao's float8 FSDP all-gather acts only on FSDP-sharded weights (``layer_fp8``): the same recipe
        # without it, for the layouts that gather no weight
        self.fp8_ungathered = (dataclasses.replace(self.fp8, param_gather=False)
                               if self.fp8 is not None and self.fp8.param_gather and not self.fp8.weight_copies
                               else self.fp8)
        self.a_bytes = dtype_bytes(fp8_recipes.COMPUTE_DTYPE if self.fp8 else dt)
        self.w_b, self.g_b, self.k_b = bytes_per_param(dt, workload.optimizer, self.fp8, framework.grads_bf16,
                                                       framework.adam_moments_bf16)
        self.ends_w_b = ends_weight_bytes_per_param(dt, workload.optimizer, self.fp8)
        self.gather_b = param_gather_bytes_per_param(dt, self.fp8)
        # autocast's per-micro-batch weight casts (layers.autocast_cast_bytes): a framework that keeps fp32
        # parameters, training in a 16-bit dtype
        self.autocast = framework.autocast_casts and self.a_bytes < 4
        # an unfused weight-gradient accumulation every micro-batch (layers.grad_accum_add_bytes)
        self.grad_accum_add = not framework.grad_accum_fusion
        # the cluster's curves measured by `planner profile` (frameworks.kernel_efficiency_on; the
        # measurement that lifts the sm_90 factor ran dense layers only, so MoE layers keep it)
        self.measured = curves_measured(cluster)
        self.opt_traffic = optimizer_traffic_bytes_per_param(dt, workload.optimizer, self.fp8, framework.grads_bf16,
                                                             framework.adam_moments_bf16)
        self.total_params = model.total_params()
        # model FLOPs per token at the workload's sequence (their one definition)
        self.model_flops_per_token = model_flops_per_token(model, workload.seq_len)
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
        # mesh key less the micro-batch -> (StageMesh.settings, StageMesh.states_parts) of its meshes
        self.layouts: dict[tuple, tuple[dict, dict]] = {}
        self.flights: dict[tuple, tuple[list[float], bool]] = {}
        self.numels: dict[tuple, tuple[float, ...]] = {}
        self.end_tensors: dict[tuple, tuple[tuple[float, ...], float]] = {}
        self.buckets: dict[tuple, int] = {}
        _ALL_SHARED.add(self)               # for clear_stage_costs

    def stage_buckets(self, sm: StageModel, layers: int) -> int:
        """The buckets Megatron-Core makes of the dense gradient buffer of a stage of ``layers``
        layers placed as ``sm`` is (``stage_terms.megatron_stage_buckets``, from ``sm.megatron_buckets``
        and ``sm._ends_tensors``), memoized on what they read: tp, ep and expert TP (the layer's
        tensors), pp, first and last (the ends), virtual stages, layers and the bucket size."""
        par = sm.par
        numels, size = sm.megatron_buckets
        key = (par.tp, par.ep, par.etp, par.pp, par.vpp, layers, sm.first, sm.last, size)
        hit = self.buckets.get(key)
        if hit is None:
            ends, emb = sm._ends_tensors()
            hit = self.buckets[key] = megatron_stage_buckets(numels, layers, ends, emb, size, sm.first, par.vpp)
        return hit

    def ends_tensors(self, tp: int, pp: int, first: bool, last: bool) -> tuple[tuple[float, ...], float]:
        """A stage's output head and final norm (backprop order, last stage) and embedding (first
        stage) as Megatron-Core's buffer holds them (``StageModel._ends_tensors``, for
        ``stage_terms.megatron_stage_buckets``), memoized on (tp, pp, first, last)."""
        key = (tp, pp, first, last)
        hit = self.end_tensors.get(key)
        if hit is None:
            e = ends_params(self.model, tp, pp, first, last)
            hit = self.end_tensors[key] = (tuple(x for x in (e.head, e.norm) if x > 0), e.embedding)
        return hit

    def layer_numels(self, tp: int, ep: int, etp: int | None) -> tuple[float, ...]:
        """``stage_terms.megatron_layer_numels`` of the model, memoized on (tp, ep, expert TP)."""
        key = (tp, ep, etp)
        hit = self.numels.get(key)
        if hit is None:
            hit = self.numels[key] = megatron_layer_numels(self.model, tp, ep, etp)
        return hit

    def autocast_mode(self, par: ParallelConfig) -> str:
        """How a framework that keeps fp32 parameters under autocast runs this layout (``self.autocast``):
        "fp32" where the runtime wraps no data parallelism (``runtime.parallel.apply_dp`` returns at
        dp 1, context parallelism or not), so autocast casts every weight each micro-batch
        (``stage_terms.layers_part``) and the residual stream stays fp32; "16-bit" under FSDP2's
        mixed-precision policy; "" for any other framework or dtype."""
        if not self.autocast:
            return ""
        return "fp32" if par.dp == 1 else "16-bit"

    def layer(self, moe: bool, par: ParallelConfig, grp, tp_lay, ep_lay, cp_lay,
              etp_lay: GroupLayout | None = None) -> tuple[LayerCost, LayerTerms]:
        """One layer's cost, and the per-layer terms ``StageModel.cost`` multiplies by layer counts."""
        attention = self.attention
        if attention is None:       # Accelerate: its engine's model code
            attention = attention_impl(self.framework, par, self.model.family)
        autocast = self.autocast_mode(par)
        fp8 = self.layer_fp8(par)
        # what "selective" recompute runs: the plan's Megatron-Core modules, else the framework's own (the
        # terms are read only under selective: a search's candidates carry the modules under every policy)
        selective = par.recompute_modules or self.framework.selective_recompute
        key = (moe, par.tp, par.cp, par.ep, par.etp, par.sp, par.micro_batch, grp.name, tp_lay, ep_lay, cp_lay,
               etp_lay, par.moe_dispatcher, par.ep_overlap, attention, autocast, fp8 is self.fp8, selective,
               par.offload_modules)
        hit = self.layers.get(key)
        if hit is None:
            # the plan's MoE execution (its dispatcher, its EP overlap) over the framework's
            ex = self.framework.moe
            if moe and par.moe_dispatcher and par.moe_dispatcher != ex.dispatcher:
                ex = dataclasses.replace(ex, dispatcher=par.moe_dispatcher)
            lc = layer_cost(self.model, moe, self.workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch,
                            grp.gpu, self.cluster, grp.intra_node, tp_lay, ep_lay, cp_lay,
                            kernel_efficiency_on(self.framework, grp.gpu.name, self.measured and not moe), fp8,
                            par.etp, etp_lay, ex,
                            self.framework.elementwise, attention, self.framework.launch, autocast,
                            self.framework.host_op_s, self.framework.fp8_attention)
            tp_overlap = tp_overlap_mode(self.framework, par, tp_lay, grp.gpu.name, self.workload.dtype)
            ep_overlap = (self.framework.ep_comm_overlap or par.ep_overlap) and moe and par.ep > 1
            # DeepEP's kernels hold their SMs while they overlap compute (costmodel.moe.comm_sm_share)
            share = comm_sm_share(grp.gpu.name, ex.dispatcher_sms) if moe and ex.dispatcher_sms else 0.0
            hit = self.layers[key] = (lc, layer_terms(lc, self.slowdown, tp_overlap, ep_overlap,
                                                      selective, share, par.sp,
                                                      ex.delay_wgrad, par.offload_modules if moe else (),
                                                      grp.gpu.host_link_bytes_per_s))
        return hit

    def layer_fp8(self, par: ParallelConfig):
        """The FP8 recipe a layer's GEMMs run under ``par``: torchao's float8 FSDP all-gather
        (``Fp8Recipe.param_gather`` without cached weight copies) hands the GEMMs FP8 weights only where
        FSDP shards them (ZeRO-2/3 over more than one rank: ``fsdp_pre_all_gather`` runs on a shard);
        elsewhere each linear casts its weight where it uses it (``Fp8Recipe.gemm_cast_values``)."""
        sharded = par.zero >= 2 and par.dp_shard * par.cp > 1
        return self.fp8 if sharded else self.fp8_ungathered

    def layer_layouts(self, par: ParallelConfig, order: tuple[str, ...], grp) -> tuple[GroupLayout, ...]:
        """Where a layer's TP, EP, CP and expert-TP groups sit in the mesh (``comm.group_layout``):
        what its communication terms depend on. EP strides over dp; folded (``ParallelConfig.etp``
        != tp: Megatron-Core's expert rank generator, order tp-ep-dp inside a stage) ETP is innermost
        along TP and EP follows it, the stage's tp*cp*dp ranks taken as consecutive from the TP
        stride on. The expert-TP layout is None where it is the TP group's."""
        gpn = grp.nvlink_gpus
        degrees = _degrees(par)
        tp_lay, cp_lay = group_layout(degrees, order, "tp", gpn), group_layout(degrees, order, "cp", gpn)
        if par.folded:
            ts = axis_stride(degrees, order, "tp")
            return tp_lay, layout_for(par.ep, ts * par.etp, gpn), cp_lay, layout_for(par.etp, ts, gpn)
        return tp_lay, layout_for(par.ep, axis_stride(degrees, order, "dp"), gpn), cp_lay, None

    def inflight(self, par: ParallelConfig) -> tuple[list[float], bool]:
        """Micro-batches in flight on each stage (``inflight_microbatches`` of every index), and
        whether they never grow from one stage to the next (every schedule priced today: the
        first stages hold the most)."""
        key = (par.pp, par.grad_accum, par.vpp, par.schedule)
        fl = self.flights.get(key)
        if fl is None:
            counts = [inflight_microbatches(par, i) for i in range(par.pp)]
            fl = self.flights[key] = (counts, all(a >= b for a, b in zip(counts, counts[1:])))
        return fl

    def mesh(self, par: ParallelConfig, order: tuple[str, ...], grp) -> StageMesh:
        """The ``StageMesh`` of a node group, mesh order and micro-batch: where the dp, ZeRO-shard
        and replica groups sit, with the collective-time functions ``StageModel.cost`` reduces
        gradients with; the layer and ends costs; per-layer parameter counts on a GPU."""
        key = (order, par.pp, par.dp, par.cp, par.tp, par.ep, par.etp, par.dp_shard, par.sp, par.micro_batch,
               grp.name, par.moe_dispatcher, par.ep_overlap, par.recompute_modules, par.offload_modules)
        mesh = self.meshes.get(key)
        if mesh is not None:
            return mesh
        model, t = self.model, par.tp
        # what the meshes of one layout share whatever their micro-batch: the stage models' settings
        # (they read only parameter counts and groups, none of the micro-batch's terms) and the
        # kinds' model-state parts (keyed on the micro-batch's terms they read: stage_cache.states_key)
        settings, states_parts = self.layouts.setdefault(key[:9] + key[10:], ({}, {}))
        gpn = grp.nvlink_gpus          # the NVLink domain: the fast tier of every group layout
        net = self.groups[grp.name][1]
        degrees = _degrees(par)
        dp_stride = axis_stride(degrees, order, "dp")
        tp_lay, ep_lay, cp_lay, etp_lay = self.layer_layouts(par, order, grp)
        dp_only = group_layout(degrees, order, "dp", gpn)
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
        if par.folded:
            # MoE parallel folding: expert-DP follows ETP x EP (``layer_layouts``)
            base = axis_stride(degrees, order, "tp") * par.etp * par.ep
            edp = par.expert_dp
            e_lay = layout_for(e_shard, base, gpn)
            e_rep_lay = layout_for(max(1, edp // e_shard), base * e_shard, gpn)
            e_all_lay = layout_for(edp, base, gpn)
        dense, dense_terms = self.layer(False, par, grp, tp_lay, ep_lay, cp_lay)
        moe, moe_terms = (self.layer(True, par, grp, tp_lay, ep_lay, cp_lay, etp_lay) if model.is_moe
                          else (None, None))
        ends = self.ends_of(par, grp)
        dense_p = layer_params(model, False, t, par.ep)
        moe_p = layer_params(model, True, t, par.ep, par.etp) if model.is_moe else None
        mesh = self.meshes[key] = StageMesh(
            group=grp, network=net, dense=dense, dense_terms=dense_terms, moe=moe, moe_terms=moe_terms, ends=ends,
            head_compute_s=head_compute_s(ends), head_model_flops=3 * ends.head_model_flops_fwd,
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
            placements={}, layers_parts={}, states_parts=states_parts, exposed_parts={}, settings=settings,
            dp_latency_s=net.latency_s(dp_lay, 2), replica_latency_s=net.latency_s(rep_lay, 2),
            step_fixed_s=step_reductions_s(net, layout_for(par.world_size, 1, gpn), dp_lay,
                                           self.workload.dtype == "fp16"))
        return mesh

    def scale_bytes(self, moe: bool, par: ParallelConfig) -> float:
        """FP8 scaling state of one layer's GEMM weights on a GPU (``Fp8Recipe.scaling_state_bytes``)."""
        if self.fp8 is None or (moe and not self.model.is_moe):
            return 0.0
        mats = layer_matrices(self.model, moe, par.tp, par.ep, par.etp)
        return self.fp8.scaling_state_bytes(sum(m.count for m in mats if m.role != "router"))

    def ends_of(self, par: ParallelConfig, grp) -> EndsCost:
        key = (par.tp, par.cp, par.sp, par.micro_batch, grp.name)
        ec = self.ends.get(key)
        if ec is None:
            ec = self.ends[key] = ends_cost(self.model, self.workload, par.tp, par.cp, par.sp, par.micro_batch,
                                            grp.gpu, self.cluster,
                                            kernel_efficiency_on(self.framework, grp.gpu.name, self.measured),
                                            self.framework.elementwise, self.framework.vocab_pad, self.autocast,
                                            self.framework.chunked_loss(self.model.mtp_layers))
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


def layers_key(sm: StageModel, n_dense: float, n_moe: float, r: float) -> tuple:
    """What ``StageModel.layers_part`` reads besides the stage's mesh (whose cache holds the entry):
    ``first`` only where an unfused gradient accumulation counts the embedding (``_Shared.grad_accum_add``)."""
    return (sm.last, sm.selective, n_dense, n_moe, r, sm.first and sm.sh.grad_accum_add)


def states_key(sm: StageModel, n_dense: float, n_moe: float, comp: float) -> tuple:
    """What ``StageModel.states_part`` reads besides the stage's layout (``first`` and ``last`` fix
    its embedding, head and MTP parameters; the ZeRO stage its sharding and buffers; the gather
    overlap FSDP2's per-micro-batch ZeRO-2 gather; under
    Megatron's buckets the virtual stages their count: ``stage_terms.megatron_stage_buckets``).
    The meshes of one layout share the entries whatever their micro-batch (``_Shared.mesh``): of
    the micro-batch's terms the part reads only the layers' compute time ``comp``, where the ZeRO
    stage in effect is 2 or 3 (what overlaps it), and the embedding's activations on the first
    stage; the key holds each where it is read (None elsewhere)."""
    vpp = sm.par.vpp if sm.megatron_buckets is not None else 1
    zero = sm.zero.zero
    return (sm.first, sm.last, zero, sm.deferred_sync, sm.overlap_grad, sm.overlap_gather, n_dense, n_moe,
            comp if zero >= 2 else None, vpp, sm.mesh.ends.embed_act_bytes if sm.first else None)


def _layers_part(sm: StageModel, n_dense: float, n_moe: float, r: float) -> tuple:
    """``sm.layers_part(n_dense, n_moe, r)``, memoized on the stage's mesh (``layers_key``)."""
    parts, key = sm.mesh.layers_parts, layers_key(sm, n_dense, n_moe, r)
    lay = parts.get(key)
    if lay is None:
        lay = parts[key] = sm.layers_part(n_dense, n_moe, r)
    return lay


def _states_part(sm: StageModel, skey: tuple, n_dense: float, n_moe: float, comp: float) -> tuple:
    """``sm.states_part(n_dense, n_moe, comp)``, memoized on the stage's layout (``states_key`` ``skey``)."""
    parts = sm.mesh.states_parts
    st = parts.get(skey)
    if st is None:
        st = parts[skey] = sm.states_part(n_dense, n_moe, comp)
    return st


def stage_cost(sm: StageModel, n_dense: float, n_moe: float, r: float) -> StageCost:
    """``sm.cost(n_dense, n_moe, r)``, its layers' and model-state parts memoized on the stage's
    mesh (``StageMesh.layers_parts``, ``states_parts``): the configurations of one mesh that differ
    in ZeRO stage share the first, those that differ in recompute (or in micro-batches, schedule,
    virtual stages) the second. ``kind_cost`` (what ``estimate`` calls) adds the exposed DP time."""
    lay = _layers_part(sm, n_dense, n_moe, r)
    st = _states_part(sm, states_key(sm, n_dense, n_moe, lay[0]), n_dense, n_moe, lay[0])
    return _new_cost(StageCost, lay + (sm.pp_comm_s,) + st)


def exposed_key(sm: StageModel, skey: tuple, comp: float, index: int) -> tuple:
    """What the exposed DP time of a stage (``StageModel.dp_exposed``: ``exposed_dp_time``) reads
    besides the mesh (the cluster's ``slowdown``): its cost's model-state part (fixed by the states
    key ``skey``, which holds both overlaps), the layers' compute time ``comp`` and the stage's
    index. (``StageMesh.exposed_parts`` is the mesh's own, so ``comp``, fixed by the mesh, ``last``
    and the layer counts, is there for clarity.)"""
    return (skey, comp, index)


def kind_cost(sm: StageModel, n_dense: float, n_moe: float, r: float, index: int) -> tuple[StageCost, float, float]:
    """``stage_cost(sm, n_dense, n_moe, r)``, with its exposed DP time at stage ``index``
    (``sm.dp_exposed``) and its summed model states (``StageCost.states_bytes``): ``estimate``
    costs each kind of stage through it, ``index`` the kind's first stage. The exposed time and the
    states are memoized with the model-state part (``StageMesh.exposed_parts``, keyed on
    ``exposed_key``), so the configurations of one mesh that differ only in recompute share them."""
    lay = _layers_part(sm, n_dense, n_moe, r)
    comp = lay[0]
    skey = states_key(sm, n_dense, n_moe, comp)
    key = exposed_key(sm, skey, comp, index)
    exposed_parts = sm.mesh.exposed_parts
    hit = exposed_parts.get(key)
    if hit is not None:
        st, exposed, states = hit
        return _new_cost(StageCost, lay + (sm.pp_comm_s,) + st), exposed, states
    st = _states_part(sm, skey, n_dense, n_moe, comp)
    c = _new_cost(StageCost, lay + (sm.pp_comm_s,) + st)
    exposed, states = sm.dp_exposed(c, index), c.states_bytes
    exposed_parts[key] = (st, exposed, states)
    return c, exposed, states


def clear_stage_costs() -> None:
    """Forget every memoized ``stage_cost`` / ``kind_cost`` part (the layers', the model states'
    with the exposed DP time), every stage model's settings (``StageMesh.settings``) and the
    Megatron memos (``_Shared.ends_tensors``, ``stage_buckets``): ``bench/bench_estimate.py`` does
    before each sweep, so that only configurations of one sweep share them. Each is a memo of a
    rule on a key holding all it reads, so clearing changes no answer (``tests/test_stage_cost_cache.py``)."""
    for sh in list(_ALL_SHARED):
        sh.end_tensors.clear()
        sh.buckets.clear()
        for mesh in sh.meshes.values():
            mesh.layers_parts.clear()
            mesh.states_parts.clear()
            mesh.exposed_parts.clear()
            mesh.settings.clear()


@lru_cache(maxsize=1024)
def _per_stage_ids(ids: tuple[int, ...]):
    if len(ids) == 1:
        k = ids[0]
        return lambda values: (values[k],)
    return itemgetter(*ids)


def _per_stage(ids: list[int]):
    """``values -> tuple(values[k] for k in ids)`` (an ``itemgetter``: one C call per list)."""
    return _per_stage_ids(tuple(ids))


def stage_compute_time(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                       order: tuple[str, ...], group: str, framework: "str | FrameworkProfile",
                       n_dense: float, n_moe: float, head_share: float) -> float:
    """The part of a stage's time per micro-batch that no placement, ZeRO stage or recompute choice
    removes: ``n_dense + n_moe`` layers' compute and TP/EP/CP communication (with selective
    recompute's extra backward) at no full recompute (``layer_sums``), plus ``head_share`` of the
    output head. ``StageModel.cost(...).time_s`` adds the rest (pipeline and ZeRO communication,
    recompute), each term >= 0, so this bounds it from below; built from the layer terms alone
    (no ``StageMesh``), for the search's group bound."""
    sh = _shared(model, cluster, workload, framework_profile(framework))
    grp = cluster.group(group)
    tp_lay, ep_lay, cp_lay, etp_lay = sh.layer_layouts(par, order, grp)
    dense = sh.layer(False, par, grp, tp_lay, ep_lay, cp_lay)[1]
    moe = sh.layer(True, par, grp, tp_lay, ep_lay, cp_lay, etp_lay)[1] if n_moe else None
    head = head_compute_s(sh.ends_of(par, grp)) * head_share if head_share else 0.0
    return LayerSums(*layer_sums(dense, n_dense, 0.0, moe, n_moe, 0.0, par.recompute == "selective")).time_s + head
