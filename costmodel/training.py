"""``estimate()``: memory per GPU and time per training step, term by term.

Pipeline (Narayanan et al., SC'21, Sec. 2.2): with ``m`` micro-batches and per-micro-batch stage
times ``t_i`` (forward + backward + recompute + exposed communication), a 1F1B or GPipe step
takes ``m * max(t) + (sum(t) - max(t))`` -- for equal stages ``(m + p - 1) * t``, the bubble
fraction ``(p-1)/m`` -- and the interleaved schedule with ``v`` virtual stages divides the
fill/drain part by ``v``. Uneven stages make the slowest one the bottleneck.

Data parallel: gradients are reduced once per step (ZeRO 0: all-reduce; ZeRO 1/2: reduce-scatter
then an all-gather of the updated 16-bit weights), overlapped with the backward of the last
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
from typing import Any

from .comm import DEFAULT_ORDER, GroupLayout, Network, group_layout, layout_for
from .layers import LayerCost, ends_cost, layer_cost
from .memory import bytes_per_param, expert_shard, model_state_bytes, stage_param_counts
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
class _Body:
    """What a stage costs per micro-batch, independent of its position in the pipeline."""

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
    act_stored: float
    act_work: float
    states: tuple[float, float, float]
    buffers: float
    ends: Any

    @property
    def t(self) -> float:
        return self.comp + self.rec + self.tp + self.ep + self.cp + self.pp + self.fsdp


def _stage_body(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
                order: tuple[str, ...], grp, num_layers: int, n_moe: int, n_full: int, first: bool, last: bool,
                crosses: bool, dense_params: float, expert_params: float) -> _Body:
    p = par.pp
    dt = workload.dtype
    a_bytes = dtype_bytes(dt)
    w_b, g_b, _ = bytes_per_param(dt, workload.optimizer)
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    gpn = grp.gpus_per_node
    gpu = grp.gpu
    net = _network(cluster, grp.intra_node)
    tp_lay = group_layout(degrees, order, "tp", gpn)
    cp_lay = group_layout(degrees, order, "cp", gpn)
    dp_lay = group_layout(degrees, order, "dp", gpn)
    dp_stride = _stride(order, degrees, "dp")
    ep_lay = layout_for(par.ep, dp_stride, gpn)
    ec = ends_cost(model, workload, par.tp, par.cp, par.sp, par.micro_batch, gpu, cluster)

    n_dense = num_layers - n_moe
    # full recompute spread over the kinds in proportion
    full_moe = min(n_moe, round(n_full * n_moe / num_layers)) if num_layers else 0
    kinds: list[tuple[LayerCost, int, int]] = []
    for moe, n, nf in ((False, n_dense, n_full - full_moe), (True, n_moe, full_moe)):
        if n:
            kinds.append((layer_cost(model, moe, workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch, gpu,
                                     cluster, grp.intra_node, tp_lay, ep_lay, cp_lay), n, nf))

    comp = rec = tp = ep = cp = 0.0
    model_flops = hw_flops = act_stored = act_work = 0.0
    selective = par.recompute == "selective"
    for lc, n, nf in kinds:
        comp += 3 * lc.fwd_s * n
        tp += 2 * lc.tp_fwd_s * n
        ep += 2 * lc.ep_fwd_s * n
        cp_exposed_fwd = max(0.0, lc.cp_fwd_s - lc.attn_fwd_s)
        cp += 3 * cp_exposed_fwd * n          # backward passes K, V and their gradients: twice forward
        rec += nf * (lc.fwd_s + lc.tp_fwd_s + lc.ep_fwd_s + cp_exposed_fwd)
        model_flops += 3 * lc.model_flops_fwd * n
        hw_flops += 3 * lc.hw_flops_fwd * n + nf * lc.hw_flops_fwd
        if selective:
            rec += (n - nf) * lc.selective_extra_s
            hw_flops += (n - nf) * lc.selective_extra_flops
            act_stored += (n - nf) * lc.act_selective_bytes
        else:
            act_stored += (n - nf) * lc.act_bytes
        act_stored += nf * lc.act_input_bytes
        if nf:
            act_work = max(act_work, lc.act_bytes)
    if last:
        comp += 3 * ec.head_fwd_s
        model_flops += 3 * ec.head_model_flops_fwd
        hw_flops += 3 * ec.head_model_flops_fwd
    pp_s = 0.0
    if p > 1:
        boundary = par.micro_batch * workload.seq_len / par.cp * model.hidden * a_bytes / (par.tp if par.sp else 1)
        # forward activation out and gradient back per boundary; middle stages have two boundaries
        pp_s = (1 if (first or last) else 2) * net.p2p(boundary, crosses)

    # ZeRO-3 / FSDP: gather weights for forward and backward, reduce-scatter grads, per micro-batch
    fsdp_s = 0.0
    shard_lay = layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else GroupLayout(1, 1)
    e_shard = expert_shard(par)
    e_lay = layout_for(e_shard, dp_stride * par.ep, gpn)
    if par.zero >= 3:
        ag = net.all_gather(dense_params * w_b, shard_lay) + net.all_gather(expert_params * w_b, e_lay)
        rs = net.reduce_scatter(dense_params * g_b, shard_lay) + net.reduce_scatter(expert_params * g_b, e_lay)
        fsdp_s = max(0.0, ag - comp / 3) + max(0.0, ag + rs - 2 * comp / 3)

    # once-per-step data-parallel communication (exposure is decided by the caller)
    grad_s = gather_s = 0.0
    if par.dp > 1:
        rep_lay = layout_for(par.dp // par.dp_shard, dp_stride * par.dp_shard, gpn)
        e_rep_lay = layout_for(max(1, par.dp * par.cp // par.ep // e_shard), dp_stride * par.ep * e_shard, gpn)
        if par.zero == 0:
            grad_s = net.all_reduce(dense_params * g_b, dp_lay) + net.all_reduce(
                expert_params * g_b, layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn))
        else:
            grad_s = net.all_reduce(dense_params * g_b / par.dp_shard, rep_lay) + net.all_reduce(
                expert_params * g_b / e_shard, e_rep_lay)
            if par.zero in (1, 2):
                grad_s += net.reduce_scatter(dense_params * g_b, shard_lay) + net.reduce_scatter(
                    expert_params * g_b, e_lay)
                gather_s = net.all_gather(dense_params * w_b, shard_lay) + net.all_gather(expert_params * w_b, e_lay)
    shard = par.dp_shard if par.zero >= 1 else 1
    local = dense_params / shard + expert_params / (e_shard if par.zero >= 1 else 1)
    opt_s = ADAM_TRAFFIC_BYTES_PER_PARAM * local / gpu.hbm_bandwidth_bytes_per_s

    st_d = model_state_bytes(dense_params, par.dp_shard, par.zero, dt, workload.optimizer)
    st_e = model_state_bytes(expert_params, e_shard, par.zero, dt, workload.optimizer)
    states = (st_d.weights + st_e.weights, st_d.grads + st_e.grads, st_d.optimizer + st_e.optimizer)
    if par.zero >= 3:
        biggest = max(lc.params for lc, _, _ in kinds) if kinds else 0.0
        buffers = 2 * biggest * w_b if par.dp_shard > 1 else 0.0
    else:
        buffers = min(DDP_BUCKET_BYTES, (dense_params + expert_params) * g_b) if par.dp > 1 else 0.0
    return _Body(comp=comp, rec=rec, tp=tp, ep=ep, cp=cp, pp=pp_s, fsdp=fsdp_s, grad_s=grad_s, gather_s=gather_s,
                 opt=opt_s, model_flops=model_flops, hw_flops=hw_flops, act_stored=act_stored, act_work=act_work,
                 states=states, buffers=buffers, ends=ec)


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
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    pp_stride = _stride(order, degrees, "pp")
    bodies: dict[tuple, _Body] = {}
    rows = []
    for i, st in enumerate(stages):
        grp = cluster.group(groups[i])
        first, last = i == 0, i == p - 1
        n_moe = model.moe_layers_in(st.first_layer, st.last_layer)
        n_full = _recompute_layers(par, st)
        nxt = groups[i + 1] if i + 1 < p else groups[max(0, i - 1)]
        crosses = nxt != grp.name or pp_stride >= grp.gpus_per_node or pp_stride * p > grp.gpus_per_node
        key = (grp.name, st.num_layers, n_moe, n_full, first, last, crosses)
        body = bodies.get(key)
        if body is None:
            dense_params, expert_params = stage_param_counts(model, par, i, stages)
            body = bodies[key] = _stage_body(model, cluster, workload, par, order, grp, st.num_layers, n_moe,
                                             n_full, first, last, crosses, dense_params, expert_params)
        rows.append((i, st, grp, body, n_full))

    times = [b.t for _, _, _, b, _ in rows]
    t_max = max(times)
    j = times.index(t_max)
    bubble = (sum(times) - t_max) / v if p > 1 else 0.0
    dp_exposed = 0.0
    st_list = []
    for i, st, grp, b, n_full in rows:
        # stage i finishes its last backward about i backward passes before the step ends
        if par.dp > 1:
            if par.overlap_dp_comm:
                slack = i * (2 * b.comp / 3)
                exp = max(0.0, b.grad_s - (2 * b.comp / 3 + b.rec) - slack) + max(0.0, b.gather_s - b.comp / 3)
            else:
                exp = b.grad_s + b.gather_s
            dp_exposed = max(dp_exposed, exp)
        if p == 1:
            inflight = 1.0
        elif par.schedule == "gpipe":
            inflight = float(m)
        else:
            inflight = float(min(p - i, m))
            if par.schedule == "interleaved":
                inflight = min(float(m), inflight * (1 + (p - 1) / (p * v)))
        acts = inflight * b.act_stored + b.act_work
        if i == 0:
            acts += inflight * b.ends.embed_act_bytes
        if i == p - 1:
            acts += b.ends.head_act_bytes
        other = grp.gpu.reserved_bytes + b.buffers + FRAGMENTATION * acts
        w, g, o = b.states
        mem = {"peak_bytes": w + g + o + acts + other, "weights_bytes": w, "grads_bytes": g, "optimizer_bytes": o,
               "activations_bytes": acts, "other_bytes": other}
        st_list.append(StageEstimate(index=i, first_layer=st.first_layer, num_layers=st.num_layers,
                                     recompute_layers=n_full, group=grp.name, time_per_microbatch_s=b.t,
                                     memory=mem, capacity_bytes=grp.gpu.memory_bytes))
    opt_s = max(b.opt for _, _, _, b, _ in rows)
    step = m * t_max + bubble + dp_exposed + opt_s
    b = rows[j][3]
    time = {"compute_s": m * b.comp, "recompute_s": m * b.rec, "tp_comm_s": m * b.tp, "cp_comm_s": m * b.cp,
            "ep_comm_s": m * b.ep, "dp_comm_s": m * b.fsdp + dp_exposed, "pp_comm_s": m * b.pp,
            "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    per_stage = par.tp * par.dp * par.cp
    dt = workload.dtype
    model_flops_total = sum(r[3].model_flops for r in rows) * per_stage * m
    hw_flops_total = sum(r[3].hw_flops for r in rows) * per_stage * m
    peak_total = sum(r[2].gpu.peak(dt) for r in rows) * per_stage
    tokens = workload.global_batch * workload.seq_len
    ps = max(st_list, key=lambda s: s.memory["peak_bytes"] / s.capacity_bytes)
    return Estimate(
        step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / gpus,
        model_tflops_per_gpu=model_flops_total / step / gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops_total / step / gpus / 1e12,
        mfu=model_flops_total / step / peak_total, hfu=hw_flops_total / step / peak_total,
        memory=dict(ps.memory), time=time, stages=st_list, gpus=gpus, capacity_bytes=ps.capacity_bytes,
        bottleneck_stage=j)
