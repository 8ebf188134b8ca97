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
prefetch buffers (two layers of gathered weights) and 5% allocator fragmentation on top of the
activations.

Optimizer: Adam reads and writes the fp32 master weights and both moments and reads the
gradient: about 30 bytes of HBM traffic per local parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter

from .comm import DEFAULT_ORDER, GroupLayout, Network, group_layout, layout_for
from .layers import EndsCost, LayerCost, ends_cost, layer_cost
from .memory import bytes_per_param, expert_shard
from .specs import (ClusterSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload, default_stages,
                    validate)
from .units import dtype_bytes

ADAM_TRAFFIC_BYTES_PER_PARAM = 30.0
FRAGMENTATION = 0.05
DDP_BUCKET_BYTES = 2 * 25e6 * 4          # two 25M-element fp32 buckets in flight


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


def _recompute_layers(par: ParallelConfig, st: StageSpec) -> int:
    if par.recompute == "full":
        return st.num_layers if par.recompute_layers < 0 else min(par.recompute_layers, st.num_layers)
    return min(st.recompute_layers, st.num_layers)


def _stride(order: tuple[str, ...], degrees: dict[str, int], dim: str) -> int:
    stride = 1
    for d in order[order.index(dim) + 1:]:
        stride *= degrees[d]
    return stride


@dataclass
class StageCost:
    """A stage's cost per micro-batch (times) and its memory parts, before in-flight scaling."""

    comp: float
    rec: float
    tp: float
    ep: float
    cp: float
    pp: float
    fsdp: float
    grad_s: float
    gather_s: float
    opt: float
    model_flops: float
    hw_flops: float
    act_stored: float        # per micro-batch in flight
    act_fixed: float         # recompute working set + logits (last stage)
    embed_act: float         # per micro-batch in flight, first stage
    states: tuple[float, float, float]
    buffers: float

    @property
    def t(self) -> float:
        return self.comp + self.rec + self.tp + self.ep + self.cp + self.pp + self.fsdp


class _Shared:
    """What the configurations on one (model, cluster, workload) share: bytes per value, the
    model's parameter counts, each node group's network and GPU constants; and, as they come up,
    the sub-terms many configurations have in common -- layer and ends costs, a mesh's groups,
    the stage kinds of an even split, micro-batches in flight -- under plain-tuple keys (cheaper
    than hashing the specs again)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload):
        self.model, self.cluster, self.workload = model, cluster, workload
        dt = workload.dtype
        self.a_bytes = dtype_bytes(dt)
        self.w_b, self.g_b, self.k_b = bytes_per_param(dt, workload.optimizer)
        self.norms = 2 * model.norm_params()
        self.attn_dense = model.attention_params() + model.dense_mlp_params()
        self.routed = model.num_experts * model.expert_params() if model.is_moe else 0.0
        self.router = model.hidden * model.num_experts     # replicated on every TP rank
        self.moe_rest = (model.attention_params() + model.moe_mlp_params() - self.routed - self.router
                         if model.is_moe else 0)
        self.total_params = model.total_params()
        self.embedding = model.embedding_params()
        self.head = model.vocab * model.hidden
        self.norm = model.norm_params()
        self.main = cluster.groups[0].name
        self.single = len(cluster.groups) == 1
        # the fraction of overlapped communication that still costs compute time (measured by
        # `planner profile`: ~0 where copy engines move data, ~1 where one CPU core does both)
        self.slowdown = cluster.compute_comm_slowdown
        # node group -> (group, network, peak FLOP/s in the workload's dtype)
        self.groups = {g.name: (g, _network(cluster, g.intra_node), g.gpu.peak(dt)) for g in cluster.groups}
        # the StageModel attributes fixed by the node group
        self.group_core = {g.name: {
            "model": model, "cluster": cluster, "workload": workload, "grp": g, "w_b": self.w_b, "g_b": self.g_b,
            "_k_b": self.k_b, "net": self.groups[g.name][1], "routed": self.routed,
            "reserved": g.gpu.reserved_bytes, "capacity": g.gpu.memory_bytes, "hbm": g.gpu.hbm_bandwidth_bytes_per_s,
            "slowdown": self.slowdown, "_sh": self} for g in cluster.groups}
        # sub-terms, each keyed on what it depends on (never on a whole configuration)
        self.layers: dict[tuple, tuple[LayerCost, tuple]] = {}
        self.ends: dict[tuple, EndsCost] = {}
        self.splits: dict[tuple, tuple] = {}
        self.meshes: dict[tuple, dict] = {}
        self.flights: dict[tuple, list[float]] = {}

    def layer(self, moe: bool, par: ParallelConfig, grp, tp_lay, ep_lay, cp_lay) -> tuple[LayerCost, tuple]:
        """One layer's cost, and the per-layer terms ``StageModel.cost`` multiplies by layer counts."""
        key = (moe, par.tp, par.cp, par.ep, par.sp, par.micro_batch, grp.name, tp_lay, ep_lay, cp_lay)
        hit = self.layers.get(key)
        if hit is None:
            lc = layer_cost(self.model, moe, self.workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch,
                            grp.gpu, self.cluster, grp.intra_node, tp_lay, ep_lay, cp_lay)
            cp_exposed_fwd = overlapped(lc.cp_fwd_s, lc.attn_fwd_s, self.slowdown)
            terms = (3 * lc.fwd_s, 2 * lc.tp_fwd_s, 2 * lc.ep_fwd_s,
                     3 * cp_exposed_fwd,      # backward moves K, V and their gradients: twice forward
                     lc.fwd_s + lc.tp_fwd_s + lc.ep_fwd_s + cp_exposed_fwd,   # one recomputed forward
                     3 * lc.model_flops_fwd, 3 * lc.hw_flops_fwd, lc.hw_flops_fwd,
                     lc.selective_extra_s, lc.selective_extra_flops,
                     lc.act_selective_bytes, lc.act_bytes, lc.act_input_bytes)
            hit = self.layers[key] = (lc, terms)
        return hit

    def inflight(self, par: ParallelConfig) -> list[float]:
        """Micro-batches in flight on each stage (``inflight_microbatches`` of every index)."""
        key = (par.pp, par.grad_accum, par.vpp, par.schedule)
        fl = self.flights.get(key)
        if fl is None:
            fl = self.flights[key] = [inflight_microbatches(par, i) for i in range(par.pp)]
        return fl

    def mesh(self, par: ParallelConfig, order: tuple[str, ...], grp) -> dict:
        """The ``StageModel`` attributes fixed by the node group, the mesh and the micro-batch
        (not by ZeRO, recompute or the schedule): where the dp, ZeRO-shard and replica groups sit,
        by the mesh order, with the collective-time functions ``StageModel.cost`` reduces
        gradients with; the layer and ends costs; per-layer parameter counts on a GPU."""
        key = (order, par.pp, par.dp, par.cp, par.tp, par.ep, par.dp_shard, par.sp, par.micro_batch, grp.name)
        mesh = self.meshes.get(key)
        if mesh is None:
            model, t = self.model, par.tp
            gpn = grp.gpus_per_node
            net = self.groups[grp.name][1]
            degrees = {"pp": par.pp, "dp": par.dp, "cp": par.cp, "tp": par.tp}
            dp_stride = _stride(order, degrees, "dp")
            tp_lay = group_layout(degrees, order, "tp", gpn)
            cp_lay = group_layout(degrees, order, "cp", gpn)
            dp_lay = group_layout(degrees, order, "dp", gpn)
            ep_lay = layout_for(par.ep, dp_stride, gpn)
            e_shard = expert_shard(par)
            shard_lay = layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else GroupLayout(1, 1)
            e_lay = layout_for(e_shard, dp_stride * par.ep, gpn)
            rep_lay = layout_for(par.dp // par.dp_shard, dp_stride * par.dp_shard, gpn)
            e_rep_lay = layout_for(max(1, par.dp * par.cp // par.ep // e_shard), dp_stride * par.ep * e_shard, gpn)
            e_all_lay = layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn)
            dense, dense_terms = self.layer(False, par, grp, tp_lay, ep_lay, cp_lay)
            moe, moe_terms = self.layer(True, par, grp, tp_lay, ep_lay, cp_lay) if model.is_moe else (None, None)
            ends = self.ends_of(par, grp)
            mesh = self.meshes[key] = {
                **self.group_core[grp.name],       # the node group's constants
                "dp_lay": dp_lay, "shard_lay": shard_lay, "e_shard": e_shard, "e_lay": e_lay, "rep_lay": rep_lay,
                "e_rep_lay": e_rep_lay, "e_all_lay": e_all_lay,
                "_ag_shard": net.all_gather_fn(shard_lay), "_ag_e": net.all_gather_fn(e_lay),
                "_ar_dp": net.all_reduce_fn(dp_lay), "_ar_e_all": net.all_reduce_fn(e_all_lay),
                "_ar_rep": net.all_reduce_fn(rep_lay), "_ar_e_rep": net.all_reduce_fn(e_rep_lay),
                "dense": dense, "_dense_terms": dense_terms, "moe": moe, "_moe_terms": moe_terms, "ends": ends,
                "_head3": (3 * ends.head_fwd_s, 3 * ends.head_model_flops_fwd),
                # activations crossing a stage boundary, per micro-batch
                "_boundary": (par.micro_batch * self.workload.seq_len / par.cp * model.hidden * self.a_bytes
                              / (t if par.sp else 1)),
                "dense_layer_params": self.attn_dense / t + self.norms,
                "moe_layer_params": self.moe_rest / t + self.router + self.norms if model.is_moe else 0.0,
                "routed_per_gpu": self.routed / (par.ep * t),
                "_placements": {}}     # StageModel._placement, by (first, last, crosses)
        return mesh

    def ends_of(self, par: ParallelConfig, grp) -> EndsCost:
        key = (par.tp, par.cp, par.sp, par.micro_batch, grp.name)
        ec = self.ends.get(key)
        if ec is None:
            ec = self.ends[key] = ends_cost(self.model, self.workload, par.tp, par.cp, par.sp, par.micro_batch,
                                            grp.gpu, self.cluster)
        return ec

    def split(self, par: ParallelConfig, order: tuple[str, ...], full: bool, rl: int) -> tuple:
        """The default even split into ``par.pp`` stages on the one node group, and its stage kinds:
        ``(stages, first layers, kind of each stage, _per_stage of those, kinds)``, a kind being
        ``(group, first, last, neighbour on another node, layers, MoE layers, layers recomputed
        fully, index of its first stage)``: stages of one kind cost the same. ``full`` and ``rl``:
        full recompute and of how many layers per stage (-1: all)."""
        pp = par.pp
        key = (pp, order, par.dp, par.cp, par.tp, full, rl)
        sp = self.splits.get(key)
        if sp is None:
            stages = default_stages(self.model.layers, pp)
            ids: list[int] = []
            shapes: dict[tuple, int] = {}
            for i, st in enumerate(stages):
                shape = (i == 0, i == pp - 1, st.num_layers, self.model.moe_layers_in(st.first_layer, st.last_layer))
                ids.append(shapes.setdefault(shape, len(shapes)))
            g = self.main
            gpn = self.groups[g][0].gpus_per_node
            pp_stride = _stride(order, {"pp": pp, "dp": par.dp, "cp": par.cp, "tp": par.tp}, "pp")
            crosses = pp_stride >= gpn or pp_stride * pp > gpn          # stage_crosses, one group
            descs = [(g, first, last, crosses, n, n_moe, (n if rl < 0 else min(rl, n)) if full else 0, ids.index(s))
                     for (first, last, n, n_moe), s in shapes.items()]
            sp = self.splits[key] = (stages, [st.first_layer for st in stages], ids, _per_stage(ids), descs)
        return sp


@lru_cache(maxsize=64)
def _shared_equal(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> _Shared:
    return _Shared(model, cluster, workload)


_SHARED_BY_ID: dict[tuple[int, int, int], _Shared] = {}


def _shared(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> _Shared:
    """The ``_Shared`` of these specs: looked up by identity first (hashing three specs costs more
    than the rest of a small estimate), then by equality. An identity hit is taken only when the
    entry's specs are these very objects, so a reused id never finds another's entry."""
    key = (id(model), id(cluster), id(workload))
    sh = _SHARED_BY_ID.get(key)
    if sh is None or sh.model is not model or sh.cluster is not cluster or sh.workload is not workload:
        sh = _shared_equal(model, cluster, workload)
        if len(_SHARED_BY_ID) >= 64:
            del _SHARED_BY_ID[next(iter(_SHARED_BY_ID))]
        _SHARED_BY_ID[key] = sh
    return sh


def _stage_core(sh: _Shared, par: ParallelConfig, order: tuple[str, ...], grp) -> dict:
    """The attributes of a ``StageModel`` that do not depend on the stage's position: the mesh's
    (``_Shared.mesh``) and those of ZeRO and recompute."""
    core = sh.mesh(par, order, grp).copy()
    z = par.zero
    if z >= 3:
        moe = core["moe"]
        biggest = max(core["dense"].params, moe.params if moe else 0.0)
        buffers = 2 * biggest * sh.w_b if par.dp_shard > 1 else 0.0
    else:
        whole = sh.total_params / (par.tp * par.pp) * sh.g_b
        buffers = min(DDP_BUCKET_BYTES, whole) if par.dp > 1 else 0.0
    e_shard = core["e_shard"]
    d, e = max(1, par.dp_shard), max(1, e_shard)
    core["par"] = par
    core["buffers"] = buffers
    core["selective"] = par.recompute == "selective"
    # ZeRO: the stage, its shard groups, and what divides the weights, gradients and optimizer
    # states of the dense and the expert parameters (model_state_bytes' divisors)
    core["_zero"] = (z, par.dp_shard, e_shard, d if z >= 3 else 1, e if z >= 3 else 1, d if z >= 2 else 1,
                     e if z >= 2 else 1, d if z >= 1 else 1, e if z >= 1 else 1)
    return core


class StageModel:
    """The cost of one pipeline stage as a function of how many layers it holds (``n``, of which
    ``n_moe`` are MoE layers) and how many of them recompute fully (``r``). Built once per
    (configuration, node group, position) for the solver's tables; ``estimate`` builds one per
    node group and ``place``s it at each kind of stage in turn; both call ``cost``, so the two
    always agree. The position-free part comes from ``_stage_core``."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                 order: tuple[str, ...], grp, first: bool, last: bool, crosses: bool):
        self.__dict__ = _stage_core(_shared(model, cluster, workload), par, order, grp)
        self.place(first, last, crosses)

    @classmethod
    def unplaced(cls, core: dict) -> "StageModel":
        """A stage model on ``core`` (owned from now on) for ``place`` to move between positions."""
        sm = cls.__new__(cls)
        sm.__dict__ = core
        return sm

    def place(self, first: bool, last: bool, crosses: bool) -> None:
        """Put the stage first and/or last in the pipeline, its neighbour on another node or not."""
        self.first, self.last = first, last
        self.pp_s, self.ends_params = self._placements.get((first, last, crosses)) or self._placement(
            first, last, crosses)

    def _placement(self, first: bool, last: bool, crosses: bool) -> tuple[float, float]:
        """(pipeline send/receive time per micro-batch, embedding and head parameters), kept per
        mesh (``_Shared.mesh``)."""
        par, sh = self.par, self._sh
        p, t = par.pp, par.tp
        pp_s = 0.0
        if p > 1:
            # forward activation out and gradient back per boundary; middle stages have two boundaries
            pp_s = (1 if (first or last) else 2) * self.net.p2p(self._boundary, crosses)
        ends_params = (sh.embedding / t if first else 0.0)
        if last:
            ends_params += (sh.norm if self.model.tied_embeddings and p == 1 else sh.head / t + sh.norm)
        pl = self._placements[first, last, crosses] = (pp_s, ends_params)
        return pl

    def params(self, n_dense: float, n_moe: float) -> tuple[float, float]:
        return (n_dense * self.dense_layer_params + n_moe * self.moe_layer_params + self.ends_params,
                n_moe * self.routed_per_gpu)

    def cost(self, n_dense: float, n_moe: float, r: float) -> StageCost:
        par = self.par
        n = n_dense + n_moe
        r_moe = r * n_moe / n if n else 0.0
        comp = rec = tp = ep = cp = model_flops = hw_flops = act_stored = act_work = 0.0
        selective = self.selective
        # per-layer terms of each kind (_Shared.layer): forward x3 (forward + backward), TP and
        # EP collectives x2, exposed CP ring x3, one recomputed forward, FLOPs, activations
        for terms, k, kr in ((self._dense_terms, n_dense, r - r_moe), (self._moe_terms, n_moe, r_moe)):
            if not k:
                continue
            fwd3, tp2, ep2, cp3, fwd1, mf3, hw3, hw1, sel_s, sel_flops, act_sel, act, act_in = terms
            comp += fwd3 * k
            tp += tp2 * k
            ep += ep2 * k
            cp += cp3 * k
            rec += kr * fwd1
            model_flops += mf3 * k
            hw_flops += hw3 * k + kr * hw1
            if selective:
                rec += (k - kr) * sel_s
                hw_flops += (k - kr) * sel_flops
                act_stored += (k - kr) * act_sel
            else:
                act_stored += (k - kr) * act
            act_stored += kr * act_in
            if kr > 0:
                act_work = max(act_work, act)
        ec = self.ends
        if self.last:
            head3, head_flops3 = self._head3
            comp += head3
            model_flops += head_flops3
            hw_flops += head_flops3
        # self.params(n_dense, n_moe), inlined
        dense_params = n_dense * self.dense_layer_params + n_moe * self.moe_layer_params + self.ends_params
        expert_params = n_moe * self.routed_per_gpu
        w_b, g_b, k_b = self.w_b, self.g_b, self._k_b
        zero, dp_shard, e_shard, w_d, w_e, g_d, g_e, k_d, k_e = self._zero
        # routed-expert collectives only where the stage holds experts (adding their 0.0 changes
        # nothing); the _ag/_ar functions are all_gather (= reduce_scatter) and all_reduce on the
        # stage's groups (_stage_core)
        fsdp = 0.0
        if zero >= 3:
            ag = self._ag_shard(dense_params * w_b)
            rs = self._ag_shard(dense_params * g_b)
            if expert_params:
                ag += self._ag_e(expert_params * w_b)
                rs += self._ag_e(expert_params * g_b)
            fsdp = overlapped(ag, comp / 3, self.slowdown) + overlapped(ag + rs, 2 * comp / 3, self.slowdown)
        grad_s = gather_s = 0.0
        if par.dp > 1:
            if zero == 0:
                grad_s = self._ar_dp(dense_params * g_b)
                if expert_params:
                    grad_s += self._ar_e_all(expert_params * g_b)
            else:
                # the replica groups are single ranks unless sharding is hybrid (HSDP): no call then
                if self.rep_lay[0] > 1:
                    grad_s = self._ar_rep(dense_params * g_b / dp_shard)
                if expert_params and self.e_rep_lay[0] > 1:
                    grad_s += self._ar_e_rep(expert_params * g_b / e_shard)
                if zero < 3:
                    rs = self._ag_shard(dense_params * g_b)
                    gather_s = self._ag_shard(dense_params * w_b)
                    if expert_params:
                        rs += self._ag_e(expert_params * g_b)
                        gather_s += self._ag_e(expert_params * w_b)
                    if zero == 1:
                        grad_s += rs
                    else:
                        # ZeRO-2 keeps only its gradient shard, so it cannot accumulate over
                        # micro-batches: a reduce-scatter after every backward (DeepSpeed
                        # stage 2), overlapped with that backward
                        fsdp = overlapped(rs, 2 * comp / 3, self.slowdown)
        local = dense_params / k_d + expert_params / k_e     # what ZeRO-1 and up shard: the optimizer
        opt = ADAM_TRAFFIC_BYTES_PER_PARAM * local / self.hbm
        # model states (memory.model_state_bytes of the dense and the expert parameters)
        states = (dense_params * w_b / w_d + expert_params * w_b / w_e,
                  dense_params * g_b / g_d + expert_params * g_b / g_e,
                  dense_params * k_b / k_d + expert_params * k_b / k_e)
        return StageCost(comp, rec, tp, ep, cp, self.pp_s, fsdp, grad_s, gather_s, opt, model_flops, hw_flops,
                         act_stored, act_work + (ec.head_act_bytes if self.last else 0.0),
                         ec.embed_act_bytes if self.first else 0.0, states, self.buffers)

    def memory(self, c: StageCost, inflight: float) -> dict[str, float]:
        acts = inflight * (c.act_stored + c.embed_act) + c.act_fixed
        other = self.reserved + c.buffers + FRAGMENTATION * acts
        w, g, o = c.states
        return {"peak_bytes": w + g + o + acts + other, "weights_bytes": w, "grads_bytes": g, "optimizer_bytes": o,
                "activations_bytes": acts, "other_bytes": other}

    def dp_exposed(self, c: StageCost, index: int) -> float:
        """Once-per-step DP communication left exposed by stage ``index`` (``exposed_dp_time``)."""
        return exposed_dp_time(c, index, self.par, self.slowdown)


def overlapped(comm: float, compute: float, slowdown: float) -> float:
    """What communication ``comm`` adds to ``compute`` it runs beside: the part longer than the
    compute, and ``slowdown`` (the cluster's ``compute_comm_slowdown``) of the overlapped part."""
    t = max(0.0, comm - compute)
    return t + slowdown * min(comm, compute) if slowdown else t


def exposed_dp_time(c: StageCost, index: int, par: ParallelConfig, slowdown: float) -> float:
    """Once-per-step DP communication left exposed by stage ``index``: gradients overlap the last
    backward and the ``index`` backward passes of earlier stages still draining; the weight
    all-gather overlaps the first forward. It falls with ``index`` (``slowdown`` <= 1)."""
    if par.dp <= 1:
        return 0.0
    if not par.overlap_dp_comm:
        return c.grad_s + c.gather_s
    bwd = 2 * c.comp / 3
    return overlapped(c.grad_s, bwd + index * bwd, slowdown) + overlapped(c.gather_s, c.comp / 3, slowdown)


def inflight_microbatches(par: ParallelConfig, index: int) -> float:
    p, m, v = par.pp, par.grad_accum, par.vpp
    if p == 1:
        return 1.0
    if par.schedule == "gpipe":
        return float(m)
    k = float(min(p - index, m))
    if par.schedule == "interleaved":
        k = min(float(m), k * (1 + (p - 1) / (p * v)))
    return k


def stage_crosses(cluster: ClusterSpec, par: ParallelConfig, order: tuple[str, ...], groups: list[str],
                  i: int) -> bool:
    """Does stage ``i``'s pipeline neighbour sit on another node?"""
    p = par.pp
    grp = cluster.group(groups[i])
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    pp_stride = _stride(order, degrees, "pp")
    nxt = groups[i + 1] if i + 1 < p else groups[max(0, i - 1)]
    return nxt != grp.name or pp_stride >= grp.gpus_per_node or pp_stride * p > grp.gpus_per_node


@lru_cache(maxsize=4096)
def stage_model(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                order: tuple[str, ...], group: str, first: bool, last: bool, crosses: bool) -> StageModel:
    return StageModel(model, cluster, workload, par, order, cluster.group(group), first, last, crosses)


def step_time(m: int, v: int, times: list[float], dp_exposed: float, opt: float) -> tuple[float, float]:
    """(step time, bubble) from per-micro-batch stage times (module docstring)."""
    t_max = max(times)
    bubble = (sum(times) - t_max) / v if len(times) > 1 else 0.0
    return m * t_max + bubble + dp_exposed + opt, bubble


@lru_cache(maxsize=1024)
def _per_stage_ids(ids: tuple[int, ...]):
    if len(ids) == 1:
        k = ids[0]
        return lambda values: (values[k],)
    return itemgetter(*ids)


def _per_stage(ids: list[int]):
    """``values -> tuple(values[k] for k in ids)`` (an ``itemgetter``: one C call per list)."""
    return _per_stage_ids(tuple(ids))


def estimate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
             stages: tuple[StageSpec, ...] | None = None, order: tuple[str, ...] | None = None) -> Estimate:
    """Memory per GPU and time per step of one training configuration (see module docstring).

    Stages with the same node group, position (first, last, middle), neighbour placement and
    layer counts cost the same: each such kind is costed once, then every stage gets its own
    in-flight micro-batches, memory and row."""
    validate(model, cluster, workload, par)
    order = tuple(order or DEFAULT_ORDER)
    sh = _shared(model, cluster, workload)
    m, p, v = par.grad_accum, par.pp, par.vpp
    full, rl = par.recompute == "full", par.recompute_layers
    # stage kinds: (node group, first, last, neighbour on another node, layers, MoE layers,
    # layers recomputed fully, index of the kind's first stage); ids: each stage's kind
    if stages is None and sh.single:
        # the even split on the one node group: p stages of at least vpp layers each, as
        # validate() checked pp * vpp <= layers; they fill the group, as it checked the world size
        stages, firsts, ids, per_stage_of, descs = sh.split(par, order, full, rl)
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
                   model.moe_layers_in(st.first_layer, st.last_layer), _recompute_layers(par, st))
            k = seen.get(key)
            if k is None:
                k = seen[key] = len(descs)
                descs.append(key + (i,))
            ids.append(k)
            firsts.append(st.first_layer)
        per_stage_of = _per_stage(ids)      # a kind-indexed list -> its value at every stage
    models: dict[str, StageModel] = {}      # per node group, placed at each kind's position in turn
    kinds, kind_cost, kind_peak, kind_t, kind_mf, kind_hf = [], [], [], [], [], []
    dp_exposed = opt_s = None
    for g, first, last, crosses, n, n_moe, n_full, i0 in descs:
        sm = models.get(g)
        if sm is None:
            sm = models[g] = StageModel.unplaced(_stage_core(sh, par, order, sh.groups[g][0]))
        # sm.place(first, last, crosses), inlined
        sm.first, sm.last = first, last
        sm.pp_s, sm.ends_params = sm._placements.get((first, last, crosses)) or sm._placement(first, last, crosses)
        c = sm.cost(n - n_moe, n_moe, n_full)
        # StageModel.dp_exposed at the kind's first stage (it falls with the stage index, so that
        # is the kind's largest)
        dpe = exposed_dp_time(c, i0, par, sm.slowdown)
        if dp_exposed is None or dpe > dp_exposed:
            dp_exposed = dpe
        if opt_s is None or c.opt > opt_s:
            opt_s = c.opt
        w, gr, o = c.states
        t = c.comp + c.rec + c.tp + c.ep + c.cp + c.pp + c.fsdp      # c.t
        kinds.append((c.act_stored + c.embed_act, c.act_fixed, sm.reserved + c.buffers, w + gr + o, w, gr, o,
                      sm.capacity, n, n_full, g, t))
        kind_cost.append(c)
        kind_peak.append(sh.groups[g][2])
        kind_t.append(t)
        kind_mf.append(c.model_flops)
        kind_hf.append(c.hw_flops)
    inflight = sh.inflight(par)
    # each stage's memory (StageModel.memory) and row; the stage nearest its capacity
    st_list = []
    add_row = st_list.append
    ps_mem, ps_cap, ps_ratio = None, 0.0, 0.0
    for i, kind, infl, first_layer in zip(range(p), per_stage_of(kinds), inflight, firsts):
        act_per, act_fixed, reserved, states, w, gr, o, cap, n, n_full, g, t = kind
        acts = infl * act_per + act_fixed
        other = reserved + FRAGMENTATION * acts
        peak = states + acts + other
        mem = {"peak_bytes": peak, "weights_bytes": w, "grads_bytes": gr, "optimizer_bytes": o,
               "activations_bytes": acts, "other_bytes": other}
        add_row(StageEstimate(i, first_layer, n, n_full, g, t, mem, cap))
        if ps_mem is None or peak / cap > ps_ratio:
            ps_mem, ps_cap, ps_ratio = mem, cap, peak / cap
    times = per_stage_of(kind_t)
    t_max = max(times)
    bubble = (sum(times) - t_max) / v if p > 1 else 0.0      # step_time(), inlined
    step = m * t_max + bubble + dp_exposed + opt_s
    j = times.index(t_max)
    b = kind_cost[ids[j]]
    time = {"compute_s": m * b.comp, "recompute_s": m * b.rec, "tp_comm_s": m * b.tp, "cp_comm_s": m * b.cp,
            "ep_comm_s": m * b.ep, "dp_comm_s": m * b.fsdp + dp_exposed, "pp_comm_s": m * b.pp,
            "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    per_stage = par.tp * par.dp * par.cp
    # summed stage by stage, in order, as before stages were grouped into kinds
    model_flops_total = sum(per_stage_of(kind_mf)) * per_stage * m
    hw_flops_total = sum(per_stage_of(kind_hf)) * per_stage * m
    peak_total = sum(per_stage_of(kind_peak)) * per_stage
    tokens = workload.global_batch * workload.seq_len
    # positional, in Estimate's field order: step time, tokens/s (total, per GPU), model and
    # hardware TFLOP/s per GPU, MFU, HFU, memory, time, stages, GPUs, capacity, bottleneck stage
    return Estimate(step, tokens / step, tokens / step / gpus, model_flops_total / step / gpus / 1e12,
                    hw_flops_total / step / gpus / 1e12, model_flops_total / step / peak_total,
                    hw_flops_total / step / peak_total, dict(ps_mem), time, st_list, gpus, ps_cap, j)
