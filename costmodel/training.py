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
    m = par.grad_accum
    p, v = par.pp, par.vpp
    dt = workload.dtype
    a_bytes = dtype_bytes(dt)
    w_b, g_b, _ = bytes_per_param(dt, workload.optimizer)

    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    cache: dict[tuple[str, bool], LayerCost] = {}
    ends: dict[str, Any] = {}
    stage_terms = []
    for i, st in enumerate(stages):
        grp = cluster.group(groups[i])
        gpn = grp.gpus_per_node
        gpu = grp.gpu
        net = Network(cluster, grp.intra_node)
        tp_lay = group_layout(degrees, order, "tp", gpn)
        cp_lay = group_layout(degrees, order, "cp", gpn)
        dp_lay = group_layout(degrees, order, "dp", gpn)
        dp_stride = 1
        for d in order[order.index("dp") + 1:]:
            dp_stride *= degrees[d]
        ep_lay = layout_for(par.ep, dp_stride, gpn)
        for moe in (False, True):
            if (grp.name, moe) not in cache and (not moe or model.is_moe):
                cache[(grp.name, moe)] = layer_cost(model, moe, workload, par, gpu, cluster, net, tp_lay,
                                                    ep_lay, cp_lay)
        if grp.name not in ends:
            ends[grp.name] = ends_cost(model, workload, par, gpu, cluster)
        ec = ends[grp.name]

        n_moe = sum(model.is_moe_layer(j) for j in range(st.first_layer, st.last_layer)) if model.is_moe else 0
        n_dense = st.num_layers - n_moe
        n_full = _recompute_layers(par, st)
        # full recompute goes to dense layers first only for bookkeeping; the costs are per kind
        full_moe = min(n_moe, round(n_full * n_moe / st.num_layers)) if st.num_layers else 0
        full_dense = n_full - full_moe
        kinds = [(cache[(grp.name, False)], n_dense, full_dense)] if n_dense else []
        if n_moe:
            kinds.append((cache[(grp.name, True)], n_moe, full_moe))

        comp = rec = tp = ep = cp = 0.0
        model_flops = hw_flops = 0.0
        act_stored = 0.0
        act_work = 0.0
        for lc, n, nf in kinds:
            comp += 3 * lc.fwd_s * n
            tp += 2 * lc.tp_fwd_s * n
            ep += 2 * lc.ep_fwd_s * n
            cp += (max(0.0, lc.cp_fwd_s - lc.attn_fwd_s) + max(0.0, 2 * lc.cp_fwd_s - 2 * lc.attn_fwd_s)) * n
            rec += nf * (lc.fwd_s + lc.tp_fwd_s + lc.ep_fwd_s + max(0.0, lc.cp_fwd_s - lc.attn_fwd_s))
            model_flops += 3 * lc.model_flops_fwd * n
            hw_flops += 3 * lc.hw_flops_fwd * n + nf * lc.hw_flops_fwd
            if par.recompute == "selective":
                rec += (n - nf) * lc.selective_extra_s
                hw_flops += (n - nf) * lc.selective_extra_flops
                act_stored += (n - nf) * lc.act_selective_bytes
            else:
                act_stored += (n - nf) * lc.act_bytes
            act_stored += nf * lc.act_input_bytes
            if nf:
                act_work = max(act_work, lc.act_bytes)
        last = i == p - 1
        if last:
            comp += 3 * ec.head_fwd_s
            model_flops += 3 * ec.head_model_flops_fwd
            hw_flops += 3 * ec.head_model_flops_fwd
        pp_s = 0.0
        if p > 1:
            boundary = par.micro_batch * workload.seq_len / par.cp * model.hidden * a_bytes / (par.tp if par.sp else 1)
            nxt = groups[i + 1] if i + 1 < p else groups[i - 1]
            pp_stride = 1
            for d in order[order.index("pp") + 1:]:
                pp_stride *= degrees[d]
            crosses = nxt != grp.name or pp_stride >= gpn or pp_stride * p > gpn
            pp_s = (1 if i == 0 or last else 2) * net.p2p(boundary, crosses)  # sends + receives per fwd/bwd

        # ZeRO-3 / FSDP: gather weights for forward and backward, reduce-scatter grads, per micro-batch
        dense_params, expert_params = stage_param_counts(model, par, i, stages)
        fsdp_s = 0.0
        shard_lay = layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else GroupLayout(1, 1)
        e_shard = expert_shard(par)
        e_lay = layout_for(e_shard, dp_stride * par.ep, gpn)
        if par.zero >= 3:
            ag = net.all_gather(dense_params * w_b, shard_lay) + net.all_gather(expert_params * w_b, e_lay)
            rs = net.reduce_scatter(dense_params * g_b, shard_lay) + net.reduce_scatter(expert_params * g_b, e_lay)
            fwd_c = comp / 3
            bwd_c = 2 * comp / 3
            fsdp_s = max(0.0, ag - fwd_c) + max(0.0, ag + rs - bwd_c)
        t_i = comp + rec + tp + ep + cp + pp_s + fsdp_s

        # once-per-step data-parallel communication and its exposure
        dp_s = 0.0
        if par.dp > 1:
            rep = par.dp // par.dp_shard
            rep_lay = layout_for(rep, dp_stride * par.dp_shard, gpn)
            e_rep = max(1, par.dp * par.cp // par.ep // e_shard)
            e_rep_lay = layout_for(e_rep, dp_stride * par.ep * e_shard, gpn)
            if par.zero == 0:
                grad_s = net.all_reduce(dense_params * g_b, dp_lay) + net.all_reduce(
                    expert_params * g_b, layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn))
                gather_s = 0.0
            elif par.zero in (1, 2):
                grad_s = net.reduce_scatter(dense_params * g_b, shard_lay) + net.reduce_scatter(expert_params * g_b, e_lay)
                grad_s += net.all_reduce(dense_params * g_b / par.dp_shard, rep_lay) + net.all_reduce(
                    expert_params * g_b / e_shard, e_rep_lay)
                gather_s = net.all_gather(dense_params * w_b, shard_lay) + net.all_gather(expert_params * w_b, e_lay)
            else:
                grad_s = net.all_reduce(dense_params * g_b / par.dp_shard, rep_lay) + net.all_reduce(
                    expert_params * g_b / e_shard, e_rep_lay)
                gather_s = 0.0
            bwd_last = 2 * comp / 3 + rec
            fwd_first = comp / 3
            if par.overlap_dp_comm:
                slack = i * (t_i * 2 / 3)
                dp_s = max(0.0, grad_s - bwd_last - slack) + max(0.0, gather_s - fwd_first)
            else:
                dp_s = grad_s + gather_s
        # optimizer step
        shard = par.dp_shard if par.zero >= 1 else 1
        local = dense_params / shard + expert_params / (e_shard if par.zero >= 1 else 1)
        opt_s = ADAM_TRAFFIC_BYTES_PER_PARAM * local / gpu.hbm_bandwidth_bytes_per_s

        # memory
        states = model_state_bytes(dense_params, par.dp_shard, par.zero, dt, workload.optimizer)
        e_states = model_state_bytes(expert_params, e_shard, par.zero, dt, workload.optimizer)
        if p == 1:
            inflight = 1.0
        elif par.schedule == "gpipe":
            inflight = float(m)
        else:
            inflight = float(min(p - i, m))
            if par.schedule == "interleaved":
                inflight = min(float(m), inflight * (1 + (p - 1) / (p * v)))
        acts = inflight * act_stored + act_work
        if i == 0:
            acts += inflight * ec.embed_act_bytes
        if last:
            acts += ec.head_act_bytes
        if par.zero >= 3:
            biggest = max(lc.params for lc, _, _ in kinds) if kinds else 0.0
            buffers = 2 * biggest * w_b * (1 if par.dp_shard > 1 else 0)
        else:
            buffers = min(DDP_BUCKET_BYTES, (dense_params + expert_params) * g_b) if par.dp > 1 else 0.0
        other = gpu.reserved_bytes + buffers + FRAGMENTATION * acts
        weights = states.weights + e_states.weights
        grads = states.grads + e_states.grads
        optim = states.optimizer + e_states.optimizer
        peak = weights + grads + optim + acts + other
        mem = {"peak_bytes": peak, "weights_bytes": weights, "grads_bytes": grads, "optimizer_bytes": optim,
               "activations_bytes": acts, "other_bytes": other}
        stage_terms.append(dict(t=t_i, comp=comp, rec=rec, tp=tp, ep=ep, cp=cp, pp=pp_s, fsdp=fsdp_s, dp=dp_s,
                                opt=opt_s, model_flops=model_flops, hw_flops=hw_flops, mem=mem,
                                gpus=par.tp * par.dp * par.cp, peak=gpu.peak(dt), cap=gpu.memory_bytes,
                                st=st, nf=n_full, group=grp.name))

    times = [s["t"] for s in stage_terms]
    t_max = max(times)
    j = times.index(t_max)
    bubble = (sum(times) - t_max) / v if p > 1 else 0.0
    dp_exposed = max(s["dp"] for s in stage_terms)
    opt_s = max(s["opt"] for s in stage_terms)
    step = m * t_max + bubble + dp_exposed + opt_s
    b = stage_terms[j]
    time = {"compute_s": m * b["comp"], "recompute_s": m * b["rec"], "tp_comm_s": m * b["tp"],
            "cp_comm_s": m * b["cp"], "ep_comm_s": m * b["ep"], "dp_comm_s": m * b["fsdp"] + dp_exposed,
            "pp_comm_s": m * b["pp"], "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    model_flops_total = sum(s["model_flops"] * s["gpus"] * m for s in stage_terms)
    hw_flops_total = sum(s["hw_flops"] * s["gpus"] * m for s in stage_terms)
    peak_total = sum(s["peak"] * s["gpus"] for s in stage_terms)
    tokens = workload.global_batch * workload.seq_len
    peak_stage = max(range(p), key=lambda k: stage_terms[k]["mem"]["peak_bytes"] / stage_terms[k]["cap"])
    st_list = [StageEstimate(index=k, first_layer=s["st"].first_layer, num_layers=s["st"].num_layers,
                             recompute_layers=s["nf"], group=s["group"], time_per_microbatch_s=s["t"],
                             memory=s["mem"], capacity_bytes=s["cap"]) for k, s in enumerate(stage_terms)]
    return Estimate(
        step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / gpus,
        model_tflops_per_gpu=model_flops_total / step / gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops_total / step / gpus / 1e12,
        mfu=model_flops_total / step / peak_total, hfu=hw_flops_total / step / peak_total,
        memory=dict(stage_terms[peak_stage]["mem"]), time=time, stages=st_list, gpus=gpus,
        capacity_bytes=stage_terms[peak_stage]["cap"], bottleneck_stage=j)
