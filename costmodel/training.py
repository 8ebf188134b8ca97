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


class StageModel:
    """The cost of one pipeline stage as a function of how many layers it holds (``n``, of which
    ``n_moe`` are MoE layers) and how many of them recompute fully (``r``). Built once per
    (configuration, node group, position), used by ``estimate`` and by the solver's tables, so
    the two always agree."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                 order: tuple[str, ...], grp, first: bool, last: bool, crosses: bool):
        self.model, self.cluster, self.workload, self.par, self.grp = model, cluster, workload, par, grp
        self.first, self.last = first, last
        p = par.pp
        dt = workload.dtype
        a_bytes = dtype_bytes(dt)
        self.w_b, self.g_b, _ = bytes_per_param(dt, workload.optimizer)
        degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
        gpn = grp.gpus_per_node
        gpu = grp.gpu
        self.net = net = _network(cluster, grp.intra_node)
        tp_lay = group_layout(degrees, order, "tp", gpn)
        cp_lay = group_layout(degrees, order, "cp", gpn)
        self.dp_lay = group_layout(degrees, order, "dp", gpn)
        dp_stride = _stride(order, degrees, "dp")
        ep_lay = layout_for(par.ep, dp_stride, gpn)
        self.ends = ends_cost(model, workload, par.tp, par.cp, par.sp, par.micro_batch, gpu, cluster)
        args = (workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch, gpu, cluster, grp.intra_node, tp_lay,
                ep_lay, cp_lay)
        self.dense = layer_cost(model, False, *args)
        self.moe = layer_cost(model, True, *args) if model.is_moe else None
        self.pp_s = 0.0
        if p > 1:
            boundary = par.micro_batch * workload.seq_len / par.cp * model.hidden * a_bytes / (par.tp if par.sp else 1)
            # forward activation out and gradient back per boundary; middle stages have two boundaries
            self.pp_s = (1 if (first or last) else 2) * net.p2p(boundary, crosses)
        self.shard_lay = layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else GroupLayout(1, 1)
        self.e_shard = expert_shard(par)
        self.e_lay = layout_for(self.e_shard, dp_stride * par.ep, gpn)
        self.rep_lay = layout_for(par.dp // par.dp_shard, dp_stride * par.dp_shard, gpn)
        self.e_rep_lay = layout_for(max(1, par.dp * par.cp // par.ep // self.e_shard),
                                    dp_stride * par.ep * self.e_shard, gpn)
        self.e_all_lay = layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn)
        t = par.tp
        norms = 2 * model.norm_params()
        self.dense_layer_params = (model.attention_params() + model.dense_mlp_params()) / t + norms
        self.routed = model.num_experts * model.expert_params() if model.is_moe else 0.0
        router = model.hidden * model.num_experts     # replicated on every TP rank
        self.moe_layer_params = ((model.attention_params() + model.moe_mlp_params() - self.routed - router) / t
                                 + router + norms if model.is_moe else 0.0)
        self.routed_per_gpu = self.routed / (par.ep * t)
        self.ends_params = (model.embedding_params() / t if first else 0.0)
        if last:
            self.ends_params += (model.norm_params() if model.tied_embeddings and p == 1
                                 else model.vocab * model.hidden / t + model.norm_params())
        # communication buffers: ZeRO-3 prefetches two layers of gathered weights; otherwise
        # DDP-style buckets, at most the size of the whole (TP/PP-sharded) gradient
        if par.zero >= 3:
            biggest = max(self.dense.params, self.moe.params if self.moe else 0.0)
            self.buffers = 2 * biggest * self.w_b if par.dp_shard > 1 else 0.0
        else:
            whole = model.total_params() / (par.tp * par.pp) * self.g_b
            self.buffers = min(DDP_BUCKET_BYTES, whole) if par.dp > 1 else 0.0
        self.selective = par.recompute == "selective"
        self.reserved = gpu.reserved_bytes
        self.capacity = gpu.memory_bytes
        self.hbm = gpu.hbm_bandwidth_bytes_per_s

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
        shard = par.dp_shard if par.zero >= 1 else 1
        local = dense_params / shard + expert_params / (self.e_shard if par.zero >= 1 else 1)
        opt = ADAM_TRAFFIC_BYTES_PER_PARAM * local / self.hbm
        st_d = model_state_bytes(dense_params, par.dp_shard, par.zero, self.workload.dtype, self.workload.optimizer)
        st_e = model_state_bytes(expert_params, self.e_shard, par.zero, self.workload.dtype, self.workload.optimizer)
        return StageCost(
            comp=comp, rec=rec, tp=tp, ep=ep, cp=cp, pp=self.pp_s, fsdp=fsdp, grad_s=grad_s, gather_s=gather_s,
            opt=opt, model_flops=model_flops, hw_flops=hw_flops, act_stored=act_stored,
            act_fixed=act_work + (ec.head_act_bytes if self.last else 0.0),
            embed_act=ec.embed_act_bytes if self.first else 0.0,
            states=(st_d.weights + st_e.weights, st_d.grads + st_e.grads, st_d.optimizer + st_e.optimizer),
            buffers=self.buffers)

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
    """Memory per GPU and time per step of one training configuration (see module docstring)."""
    validate(model, cluster, workload, par)
    order = tuple(order or DEFAULT_ORDER)
    if stages is None:
        stages = default_stages(model.layers, par.pp)
    if len(stages) != par.pp or sum(s.num_layers for s in stages) != model.layers:
        raise SpecError(f"stage split {[s.num_layers for s in stages]} must have pp = {par.pp} stages "
                        f"covering all {model.layers} layers")
    if any(s.num_layers < 1 for s in stages) or par.vpp > 1 and any(s.num_layers < par.vpp for s in stages):
        raise SpecError(f"every stage needs at least vpp = {par.vpp} layer(s): {[s.num_layers for s in stages]}")
    groups = stage_groups(cluster, par, stages)
    m, p, v = par.grad_accum, par.pp, par.vpp
    rows = []
    memo: dict[tuple, tuple] = {}
    for i, st in enumerate(stages):
        n_moe = model.moe_layers_in(st.first_layer, st.last_layer)
        n_full = _recompute_layers(par, st)
        key = (groups[i], i == 0, i == p - 1, stage_crosses(cluster, par, order, groups, i), st.num_layers,
               n_moe, n_full)
        hit = memo.get(key)
        if hit is None:
            sm = stage_model(model, cluster, workload, par, order, *key[:4])
            hit = memo[key] = (sm, sm.cost(st.num_layers - n_moe, n_moe, n_full))
        rows.append((i, st, hit[0], hit[1], n_full))
    times = [c.t for _, _, _, c, _ in rows]
    dp_exposed = max(sm.dp_exposed(c, i) for i, _, sm, c, _ in rows)
    opt_s = max(c.opt for _, _, _, c, _ in rows)
    step, bubble = step_time(m, v, times, dp_exposed, opt_s)
    j = times.index(max(times))
    st_list = []
    for i, st, sm, c, n_full in rows:
        mem = sm.memory(c, inflight_microbatches(par, i))
        st_list.append(StageEstimate(index=i, first_layer=st.first_layer, num_layers=st.num_layers,
                                     recompute_layers=n_full, group=sm.grp.name, time_per_microbatch_s=c.t,
                                     memory=mem, capacity_bytes=sm.capacity))
    b = rows[j][3]
    time = {"compute_s": m * b.comp, "recompute_s": m * b.rec, "tp_comm_s": m * b.tp, "cp_comm_s": m * b.cp,
            "ep_comm_s": m * b.ep, "dp_comm_s": m * b.fsdp + dp_exposed, "pp_comm_s": m * b.pp,
            "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    per_stage = par.tp * par.dp * par.cp
    dt = workload.dtype
    model_flops_total = sum(r[3].model_flops for r in rows) * per_stage * m
    hw_flops_total = sum(r[3].hw_flops for r in rows) * per_stage * m
    peak_total = sum(r[2].grp.gpu.peak(dt) for r in rows) * per_stage
    tokens = workload.global_batch * workload.seq_len
    ps = max(st_list, key=lambda s: s.memory["peak_bytes"] / s.capacity_bytes)
    return Estimate(
        step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / gpus,
        model_tflops_per_gpu=model_flops_total / step / gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops_total / step / gpus / 1e12,
        mfu=model_flops_total / step / peak_total, hfu=hw_flops_total / step / peak_total,
        memory=dict(ps.memory), time=time, stages=st_list, gpus=gpus, capacity_bytes=ps.capacity_bytes,
        bottleneck_stage=j)
