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

from .comm import DEFAULT_ORDER, GroupLayout, Network, group_layout, layout_for
from .layers import ends_cost, layer_cost
from .memory import bytes_per_param, expert_shard, model_state_bytes
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
    """What every configuration on one (model, cluster, workload) shares: bytes per value, the
    model's parameter counts, each node group's network and GPU constants, and the layer and
    ends costs already looked up (plain-tuple keys: cheaper than hashing the specs again)."""

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
        # node group -> (group, network, peak FLOP/s in the workload's dtype)
        self.groups = {g.name: (g, _network(cluster, g.intra_node), g.gpu.peak(dt)) for g in cluster.groups}
        self.layers: dict[tuple, LayerCost] = {}
        self.ends: dict[tuple, EndsCost] = {}
        self.splits: dict[int, tuple] = {}

    def layer(self, moe: bool, par: ParallelConfig, grp, tp_lay, ep_lay, cp_lay) -> LayerCost:
        key = (moe, par.tp, par.cp, par.ep, par.sp, par.micro_batch, grp.name, tp_lay, ep_lay, cp_lay)
        lc = self.layers.get(key)
        if lc is None:
            lc = self.layers[key] = layer_cost(self.model, moe, self.workload, par.tp, par.cp, par.ep, par.sp,
                                               par.micro_batch, grp.gpu, self.cluster, grp.intra_node, tp_lay,
                                               ep_lay, cp_lay)
        return lc

    def ends_of(self, par: ParallelConfig, grp) -> EndsCost:
        key = (par.tp, par.cp, par.sp, par.micro_batch, grp.name)
        ec = self.ends.get(key)
        if ec is None:
            ec = self.ends[key] = ends_cost(self.model, self.workload, par.tp, par.cp, par.sp, par.micro_batch,
                                            grp.gpu, self.cluster)
        return ec

    def split(self, pp: int) -> tuple:
        """The default even split into ``pp`` stages, and its stage shapes: ``(stages, first
        layers, shape of each stage, shapes)``, a shape being ``(first, last, layers, MoE layers,
        index of its first stage)``: stages of one shape cost the same."""
        sp = self.splits.get(pp)
        if sp is None:
            stages = default_stages(self.model.layers, pp)
            ids: list[int] = []
            shapes: dict[tuple, int] = {}
            for i, st in enumerate(stages):
                key = (i == 0, i == pp - 1, st.num_layers, self.model.moe_layers_in(st.first_layer, st.last_layer))
                ids.append(shapes.setdefault(key, len(shapes)))
            first_index = {s: ids.index(s) for s in range(len(shapes))}
            sp = self.splits[pp] = (stages, [st.first_layer for st in stages], ids,
                                    [key + (first_index[s],) for key, s in shapes.items()])
        return sp


@lru_cache(maxsize=64)
def _shared(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> _Shared:
    return _Shared(model, cluster, workload)


def _stage_core(sh: _Shared, par: ParallelConfig, order: tuple[str, ...], grp) -> dict:
    """The attributes of a ``StageModel`` that do not depend on the stage's position."""
    model, workload = sh.model, sh.workload
    p = par.pp
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    gpn = grp.gpus_per_node
    gpu = grp.gpu
    tp_lay = group_layout(degrees, order, "tp", gpn)
    cp_lay = group_layout(degrees, order, "cp", gpn)
    dp_lay = group_layout(degrees, order, "dp", gpn)
    dp_stride = _stride(order, degrees, "dp")
    ep_lay = layout_for(par.ep, dp_stride, gpn)
    dense = sh.layer(False, par, grp, tp_lay, ep_lay, cp_lay)
    moe = sh.layer(True, par, grp, tp_lay, ep_lay, cp_lay) if model.is_moe else None
    e_shard = expert_shard(par)
    t = par.tp
    routed = sh.routed
    if par.zero >= 3:
        biggest = max(dense.params, moe.params if moe else 0.0)
        buffers = 2 * biggest * sh.w_b if par.dp_shard > 1 else 0.0
    else:
        whole = sh.total_params / (par.tp * par.pp) * sh.g_b
        buffers = min(DDP_BUCKET_BYTES, whole) if par.dp > 1 else 0.0
    return {
        "model": model, "cluster": sh.cluster, "workload": workload, "par": par, "grp": grp,
        "w_b": sh.w_b, "g_b": sh.g_b, "net": sh.groups[grp.name][1], "dp_lay": dp_lay,
        "ends": sh.ends_of(par, grp), "dense": dense, "moe": moe,
        "_boundary": (par.micro_batch * workload.seq_len / par.cp * model.hidden * sh.a_bytes
                      / (par.tp if par.sp else 1)),
        "shard_lay": layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else GroupLayout(1, 1),
        "e_shard": e_shard,
        "e_lay": layout_for(e_shard, dp_stride * par.ep, gpn),
        "rep_lay": layout_for(par.dp // par.dp_shard, dp_stride * par.dp_shard, gpn),
        "e_rep_lay": layout_for(max(1, par.dp * par.cp // par.ep // e_shard), dp_stride * par.ep * e_shard, gpn),
        "e_all_lay": layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn),
        "dense_layer_params": sh.attn_dense / t + sh.norms,
        "routed": routed,
        "moe_layer_params": sh.moe_rest / t + sh.router + sh.norms if model.is_moe else 0.0,
        "routed_per_gpu": routed / (par.ep * t),
        "buffers": buffers,
        "selective": par.recompute == "selective",
        "reserved": gpu.reserved_bytes, "capacity": gpu.memory_bytes, "hbm": gpu.hbm_bandwidth_bytes_per_s,
        "_k_b": sh.k_b, "_sh": sh,
    }


class StageModel:
    """The cost of one pipeline stage as a function of how many layers it holds (``n``, of which
    ``n_moe`` are MoE layers) and how many of them recompute fully (``r``). Built once per
    (configuration, node group, position), used by ``estimate`` and by the solver's tables, so
    the two always agree. The position-free part (``_stage_core``) is shared by the stages of
    one configuration in one node group."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                 order: tuple[str, ...], grp, first: bool, last: bool, crosses: bool):
        self.__dict__.update(_stage_core(_shared(model, cluster, workload), par, order, grp))
        self._place(first, last, crosses)

    @classmethod
    def placed(cls, core: dict, first: bool, last: bool, crosses: bool) -> "StageModel":
        sm = cls.__new__(cls)
        sm.__dict__.update(core)
        sm._place(first, last, crosses)
        return sm

    def _place(self, first: bool, last: bool, crosses: bool) -> None:
        self.first, self.last = first, last
        par, sh = self.par, self._sh
        p, t = par.pp, par.tp
        self.pp_s = 0.0
        if p > 1:
            # forward activation out and gradient back per boundary; middle stages have two boundaries
            self.pp_s = (1 if (first or last) else 2) * self.net.p2p(self._boundary, crosses)
        self.ends_params = (sh.embedding / t if first else 0.0)
        if last:
            self.ends_params += (sh.norm if self.model.tied_embeddings and p == 1
                                 else sh.head / t + sh.norm)

    def params(self, n_dense: float, n_moe: float) -> tuple[float, float]:
        return (n_dense * self.dense_layer_params + n_moe * self.moe_layer_params + self.ends_params,
                n_moe * self.routed_per_gpu)

    def cost(self, n_dense: float, n_moe: float, r: float) -> StageCost:
        par, net = self.par, self.net
        n = n_dense + n_moe
        r_moe = r * n_moe / n if n else 0.0
        comp = rec = tp = ep = cp = model_flops = hw_flops = act_stored = act_work = 0.0
        for lc, k, kr in ((self.dense, n_dense, r - r_moe), (self.moe, n_moe, r_moe)):
            if not k:
                continue
            comp += 3 * lc.fwd_s * k
            tp += 2 * lc.tp_fwd_s * k
            ep += 2 * lc.ep_fwd_s * k
            cp_exposed_fwd = max(0.0, lc.cp_fwd_s - lc.attn_fwd_s)
            cp += 3 * cp_exposed_fwd * k      # backward moves K, V and their gradients: twice forward
            rec += kr * (lc.fwd_s + lc.tp_fwd_s + lc.ep_fwd_s + cp_exposed_fwd)
            model_flops += 3 * lc.model_flops_fwd * k
            hw_flops += 3 * lc.hw_flops_fwd * k + kr * lc.hw_flops_fwd
            if self.selective:
                rec += (k - kr) * lc.selective_extra_s
                hw_flops += (k - kr) * lc.selective_extra_flops
                act_stored += (k - kr) * lc.act_selective_bytes
            else:
                act_stored += (k - kr) * lc.act_bytes
            act_stored += kr * lc.act_input_bytes
            if kr > 0:
                act_work = max(act_work, lc.act_bytes)
        ec = self.ends
        if self.last:
            comp += 3 * ec.head_fwd_s
            model_flops += 3 * ec.head_model_flops_fwd
            hw_flops += 3 * ec.head_model_flops_fwd
        dense_params, expert_params = self.params(n_dense, n_moe)
        w_b, g_b = self.w_b, self.g_b
        fsdp = 0.0
        if par.zero >= 3:
            ag = net.all_gather(dense_params * w_b, self.shard_lay) + net.all_gather(expert_params * w_b, self.e_lay)
            rs = (net.reduce_scatter(dense_params * g_b, self.shard_lay)
                  + net.reduce_scatter(expert_params * g_b, self.e_lay))
            fsdp = max(0.0, ag - comp / 3) + max(0.0, ag + rs - 2 * comp / 3)
        grad_s = gather_s = 0.0
        if par.dp > 1:
            if par.zero == 0:
                grad_s = (net.all_reduce(dense_params * g_b, self.dp_lay)
                          + net.all_reduce(expert_params * g_b, self.e_all_lay))
            else:
                grad_s = (net.all_reduce(dense_params * g_b / par.dp_shard, self.rep_lay)
                          + net.all_reduce(expert_params * g_b / self.e_shard, self.e_rep_lay))
                if par.zero in (1, 2):
                    rs = (net.reduce_scatter(dense_params * g_b, self.shard_lay)
                          + net.reduce_scatter(expert_params * g_b, self.e_lay))
                    if par.zero == 1:
                        grad_s += rs
                    else:
                        # ZeRO-2 keeps only its gradient shard, so it cannot accumulate over
                        # micro-batches: a reduce-scatter after every backward (DeepSpeed
                        # stage 2), overlapped with that backward
                        fsdp = max(0.0, rs - 2 * comp / 3)
                    gather_s = (net.all_gather(dense_params * w_b, self.shard_lay)
                                + net.all_gather(expert_params * w_b, self.e_lay))
        zero = par.zero
        shard = par.dp_shard if zero >= 1 else 1
        local = dense_params / shard + expert_params / (self.e_shard if zero >= 1 else 1)
        opt = ADAM_TRAFFIC_BYTES_PER_PARAM * local / self.hbm
        # model states (memory.model_state_bytes, inlined: dense part sharded over dp_shard, experts
        # over e_shard)
        d, e, k_b = max(1, par.dp_shard), max(1, self.e_shard), self._k_b
        states = (dense_params * w_b / (d if zero >= 3 else 1) + expert_params * w_b / (e if zero >= 3 else 1),
                  dense_params * g_b / (d if zero >= 2 else 1) + expert_params * g_b / (e if zero >= 2 else 1),
                  dense_params * k_b / (d if zero >= 1 else 1) + expert_params * k_b / (e if zero >= 1 else 1))
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
        """Once-per-step DP communication left exposed by stage ``index``: gradients overlap the
        last backward and the ``index`` backward passes of earlier stages still draining; the
        weight all-gather overlaps the first forward."""
        if self.par.dp <= 1:
            return 0.0
        if not self.par.overlap_dp_comm:
            return c.grad_s + c.gather_s
        bwd = 2 * c.comp / 3
        return max(0.0, c.grad_s - bwd - index * bwd) + max(0.0, c.gather_s - c.comp / 3)


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
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    pp_stride = _stride(order, degrees, "pp")
    full, rl = par.recompute == "full", par.recompute_layers
    # stage kinds: (node group, first, last, neighbour on another node, layers, MoE layers,
    # layers recomputed fully, index of the kind's first stage); ids: each stage's kind
    if stages is None and sh.single:
        # the even split on the one node group: p stages of at least vpp layers each, as
        # validate() checked pp * vpp <= layers; they fill the group, as it checked the world size
        stages, firsts, ids, shapes = sh.split(p)
        g = sh.main
        gpn = sh.groups[g][0].gpus_per_node
        crosses = pp_stride >= gpn or pp_stride * p > gpn
        descs = [(g, f, la, crosses, n, n_moe, (n if rl < 0 else min(rl, n)) if full else 0, i0)
                 for f, la, n, n_moe, i0 in shapes]
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
    cores: dict[str, dict] = {}
    placed: dict[tuple, StageModel] = {}
    kinds, kind_cost, kind_peak = [], [], []
    dp_exposed = opt_s = None
    for g, first, last, crosses, n, n_moe, n_full, i0 in descs:
        sm = placed.get((g, first, last, crosses))
        if sm is None:
            core = cores.get(g)
            if core is None:
                core = cores[g] = _stage_core(sh, par, order, sh.groups[g][0])
            sm = placed[g, first, last, crosses] = StageModel.placed(core, first, last, crosses)
        c = sm.cost(n - n_moe, n_moe, n_full)
        # the exposed DP time falls with the stage index: a kind's largest is at its first stage
        dpe = sm.dp_exposed(c, i0)
        if dp_exposed is None or dpe > dp_exposed:
            dp_exposed = dpe
        if opt_s is None or c.opt > opt_s:
            opt_s = c.opt
        w, gr, o = c.states
        kinds.append((c.act_stored + c.embed_act, c.act_fixed, sm.reserved + c.buffers, w + gr + o, w, gr, o,
                      sm.capacity, n, n_full, g, c.t))
        kind_cost.append(c)
        kind_peak.append(sh.groups[g][2])
    # micro-batches in flight per stage (inflight_microbatches)
    if p == 1:
        inflight = [1.0]
    elif par.schedule == "gpipe":
        inflight = [float(m)] * p
    elif par.schedule == "interleaved":
        factor = 1 + (p - 1) / (p * v)
        inflight = [min(float(m), float(min(p - i, m)) * factor) for i in range(p)]
    else:
        inflight = [float(min(p - i, m)) for i in range(p)]
    # each stage's memory (StageModel.memory) and row; the stage nearest its capacity
    st_list = []
    ps_mem, ps_cap, ps_ratio = None, 0.0, 0.0
    for i in range(p):
        act_per, act_fixed, reserved, states, w, gr, o, cap, n, n_full, g, t = kinds[ids[i]]
        acts = inflight[i] * act_per + act_fixed
        other = reserved + FRAGMENTATION * acts
        peak = states + acts + other
        mem = {"peak_bytes": peak, "weights_bytes": w, "grads_bytes": gr, "optimizer_bytes": o,
               "activations_bytes": acts, "other_bytes": other}
        st_list.append(StageEstimate(i, firsts[i], n, n_full, g, t, mem, cap))
        if ps_mem is None or peak / cap > ps_ratio:
            ps_mem, ps_cap, ps_ratio = mem, cap, peak / cap
    kind_t = [k[-1] for k in kinds]
    times = [kind_t[k] for k in ids]
    step, bubble = step_time(m, v, times, dp_exposed, opt_s)
    j = times.index(max(times))
    b = kind_cost[ids[j]]
    time = {"compute_s": m * b.comp, "recompute_s": m * b.rec, "tp_comm_s": m * b.tp, "cp_comm_s": m * b.cp,
            "ep_comm_s": m * b.ep, "dp_comm_s": m * b.fsdp + dp_exposed, "pp_comm_s": m * b.pp,
            "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    per_stage = par.tp * par.dp * par.cp
    # summed stage by stage, in order, as before stages were grouped into kinds
    flops = [c.model_flops for c in kind_cost]
    model_flops_total = sum([flops[k] for k in ids]) * per_stage * m
    flops = [c.hw_flops for c in kind_cost]
    hw_flops_total = sum([flops[k] for k in ids]) * per_stage * m
    peak_total = sum([kind_peak[k] for k in ids]) * per_stage
    tokens = workload.global_batch * workload.seq_len
    return Estimate(
        step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / gpus,
        model_tflops_per_gpu=model_flops_total / step / gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops_total / step / gpus / 1e12,
        mfu=model_flops_total / step / peak_total, hfu=hw_flops_total / step / peak_total,
        memory=dict(ps_mem), time=time, stages=st_list, gpus=gpus, capacity_bytes=ps_cap,
        bottleneck_stage=j)
