"""``estimate()`` groups identical pipeline stages into kinds, precomputes per-(model, cluster,
workload) and per-mesh constants and binds collective times to their groups. This checks it
against a straightforward computation -- every stage costed on its own, from the layer costs,
the collective formulas and ``model_state_bytes`` -- over many configurations: dense and MoE,
pipelines of 1 to 32 stages, ZeRO 0-3 and HSDP, every recompute mode, interleaved and GPipe
schedules, uneven and explicit stage splits, a mixed H100/A100 cluster and a measured one."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from costmodel.catalog import get_model
from costmodel.comm import DEFAULT_ORDER, GroupLayout, Network, group_layout, launched, layout_for
from costmodel.layers import ends_cost, ends_params, layer_cost, layer_params, model_flops_per_token
from costmodel.memory import (DDP_BUCKET_BYTES, FRAGMENTATION, bytes_per_param, expert_shard, model_state_bytes,
                              optimizer_traffic_bytes_per_param)
from costmodel.specs import StageSpec, SpecError, Workload, default_stages, validate
from costmodel.training import estimate, inflight_microbatches, stage_groups
from costmodel.units import dtype_bytes
from planner.search.space import enumerate_candidates
from profiles.clusters import load_cluster


# ---- the reference: one stage at a time, nothing shared or precomputed ---------------------

def _ov(comm: float, compute: float, slowdown: float) -> float:
    """Communication beside compute: the part longer than it, and ``slowdown`` of the rest."""
    return max(0.0, comm - compute) + slowdown * min(comm, compute)


def _all_reduce(net: Network, size: float, lay) -> float:
    if lay.n <= 1 or size <= 0:
        return 0.0
    k, m = lay.k, max(1, lay.n // lay.k)
    t = 0.0
    if k > 1:
        t += 2 * (k - 1) / k * size / net._bw("intra", "all_reduce", k, size) + 2 * (k - 1) * net.intra.latency_s
    if m > 1:
        shard = size / k
        # NCCL picks a tree across nodes once its 2 log2(m) steps beat the ring's 2 (m - 1)
        steps = min(2 * (m - 1), 2 * math.log2(m)) if m > 2 else 2 * (m - 1)
        t += 2 * (m - 1) / m * shard / net._bw("inter", "all_reduce", m, shard) + steps * net.inter.latency_s
    return t


def _all_gather(net: Network, size: float, lay) -> float:
    if lay.n <= 1 or size <= 0:
        return 0.0
    k, m = lay.k, max(1, lay.n // lay.k)
    t = 0.0
    if k > 1:
        t += (k - 1) / k * size / net._bw("intra", "all_gather", k, size) + (k - 1) * net.intra.latency_s
    if m > 1:
        shard = size / k
        t += (m - 1) / m * shard / net._bw("inter", "all_gather", m, shard) + (m - 1) * net.inter.latency_s
    return t


def _stride(order, degrees, dim):
    stride = 1
    for d in order[order.index(dim) + 1:]:
        stride *= degrees[d]
    return stride


def _stage(model, cluster, workload, par, order, grp, first, last, crosses, n_dense, n_moe, r):
    """One stage's times per micro-batch, FLOPs and memory parts, straight from the formulas."""
    p, t = par.pp, par.tp
    w_b, g_b, _ = bytes_per_param(workload.dtype, workload.optimizer)
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    gpn = grp.gpus_per_node
    net = Network(cluster, grp.intra_node)
    tp_lay = group_layout(degrees, order, "tp", gpn)
    cp_lay = group_layout(degrees, order, "cp", gpn)
    dp_lay = group_layout(degrees, order, "dp", gpn)
    dp_stride = _stride(order, degrees, "dp")
    ep_lay = layout_for(par.ep, dp_stride, gpn)
    args = (workload, par.tp, par.cp, par.ep, par.sp, par.micro_batch, grp.gpu, cluster, grp.intra_node, tp_lay,
            ep_lay, cp_lay)
    dense = layer_cost(model, False, *args)
    moe = layer_cost(model, True, *args) if model.is_moe else None
    ec = ends_cost(model, workload, par.tp, par.cp, par.sp, par.micro_batch, grp.gpu, cluster)
    pp_s = 0.0
    if p > 1:
        boundary = (par.micro_batch * workload.seq_len / par.cp * model.hidden * dtype_bytes(workload.dtype)
                    / (par.tp if par.sp else 1))
        pp_s = (1 if (first or last) else 2) * launched(net.p2p(boundary, crosses))   # comm.launched: each send
    e_shard = expert_shard(par)
    shard_lay = layout_for(par.dp_shard, dp_stride, gpn) if par.dp > 1 else layout_for(1, 1, gpn)
    # dense weights are held by the dp x cp ranks: reduce and shard over both
    dcp = par.dp * par.cp
    dense_shard = par.dp_shard * par.cp
    dp_lay = GroupLayout(dcp, min(gpn, dp_lay.k * cp_lay.k, dcp)) if dcp > 1 else GroupLayout(1, 1)
    shard_lay = (GroupLayout(dense_shard, min(gpn, shard_lay.k * cp_lay.k, dense_shard)) if dense_shard > 1
                 else GroupLayout(1, 1))
    e_lay = layout_for(e_shard, dp_stride * par.ep, gpn)
    rep_lay = layout_for(par.dp // par.dp_shard, dp_stride * par.dp_shard, gpn)
    e_rep_lay = layout_for(max(1, par.dp * par.cp // par.ep // e_shard), dp_stride * par.ep * e_shard, gpn)
    e_all_lay = layout_for(par.dp * par.cp // par.ep, dp_stride * par.ep, gpn)
    # parameters on this GPU (the layer description's per-GPU counts, memory.stage_param_counts' sum)
    lp_dense = layer_params(model, False, t, par.ep)
    dense_params = n_dense * lp_dense.total
    expert_params = 0.0
    if model.is_moe:
        lp_moe = layer_params(model, True, t, par.ep)
        dense_params += n_moe * (lp_moe.total - lp_moe.experts)
        expert_params = n_moe * lp_moe.experts
    dense_params += ends_params(model, t, p, first, last).total
    if par.zero >= 3:
        biggest = max(dense.params, moe.params if moe else 0.0)
        buffers = 2 * biggest * w_b if dense_shard > 1 else 0.0
    else:
        buffers = min(DDP_BUCKET_BYTES, model.total_params() / (par.tp * par.pp) * g_b) if dcp > 1 else 0.0
    # layers
    n = n_dense + n_moe
    r_moe = r * n_moe / n if n else 0.0
    comp = rec = tp = ep = cp = model_flops = hw_flops = act_stored = act_work = 0.0
    for lc, k, kr in ((dense, n_dense, r - r_moe), (moe, n_moe, r_moe)):
        if not k:
            continue
        comp += 3 * lc.fwd_s * k
        tp += 2 * lc.tp_fwd_s * k
        ep += 2 * lc.ep_fwd_s * k
        cp_exposed = _ov(lc.cp_fwd_s, lc.attn_fwd_s, cluster.compute_comm_slowdown)
        cp += 3 * cp_exposed * k
        rec += kr * (lc.fwd_s + lc.tp_fwd_s + lc.ep_fwd_s + cp_exposed)
        model_flops += 3 * lc.model_flops_fwd * k
        hw_flops += 3 * lc.hw_flops_fwd * k + kr * lc.hw_flops_fwd
        if par.recompute == "selective":
            rec += (k - kr) * lc.selective_extra_s
            hw_flops += (k - kr) * lc.selective_extra_flops
            act_stored += (k - kr) * lc.act_selective_bytes
        else:
            act_stored += (k - kr) * lc.act_bytes
        act_stored += kr * lc.act_input_bytes
        if kr > 0:
            act_work = max(act_work, lc.act_bytes)
    if last:
        comp += 3 * ec.head_fwd_s
        model_flops += 3 * ec.head_model_flops_fwd
        hw_flops += 3 * ec.head_model_flops_fwd
    # data parallelism
    fsdp = 0.0
    if par.zero >= 3:
        ag = _all_gather(net, dense_params * w_b, shard_lay) + _all_gather(net, expert_params * w_b, e_lay)
        rs = _all_gather(net, dense_params * g_b, shard_lay) + _all_gather(net, expert_params * g_b, e_lay)
        # one all-gather and one reduce-scatter per layer: their fixed times, beyond the first
        lat = _all_gather(net, 1e-300, shard_lay)
        lat_e = _all_gather(net, 1e-300, e_lay) if expert_params else 0.0
        ag += max(0, n - 1) * lat + max(0, n_moe - 1) * lat_e
        rs += max(0, n - 1) * lat + max(0, n_moe - 1) * lat_e
        sl = cluster.compute_comm_slowdown
        fsdp = _ov(ag, comp / 3, sl) + _ov(ag + rs, 2 * comp / 3, sl)
    grad_s = gather_s = 0.0
    if dcp > 1:
        if par.zero == 0:
            grad_s = (_all_reduce(net, dense_params * g_b, dp_lay)
                      + _all_reduce(net, expert_params * g_b, e_all_lay))
        else:
            grad_s = (_all_reduce(net, dense_params * g_b / dense_shard, rep_lay)
                      + _all_reduce(net, expert_params * g_b / e_shard, e_rep_lay))
            if par.zero in (1, 2):
                rs = _all_gather(net, dense_params * g_b, shard_lay) + _all_gather(net, expert_params * g_b, e_lay)
                if par.zero == 1:
                    grad_s += rs
                else:
                    fsdp = _ov(rs, 2 * comp / 3, cluster.compute_comm_slowdown)
                gather_s = (_all_gather(net, dense_params * w_b, shard_lay)
                            + _all_gather(net, expert_params * w_b, e_lay))
    shard = dense_shard if par.zero >= 1 else 1
    local = dense_params / shard + expert_params / (e_shard if par.zero >= 1 else 1)
    st_d = model_state_bytes(dense_params, dense_shard, par.zero, workload.dtype, workload.optimizer)
    st_e = model_state_bytes(expert_params, e_shard, par.zero, workload.dtype, workload.optimizer)
    return dict(comp=comp, rec=rec, tp=tp, ep=ep, cp=cp, pp=pp_s, fsdp=fsdp, grad_s=grad_s, gather_s=gather_s,
                opt=optimizer_traffic_bytes_per_param(workload.dtype, workload.optimizer) * local
                / grp.gpu.hbm_bandwidth_bytes_per_s,
                model_flops=model_flops, hw_flops=hw_flops, act_stored=act_stored,
                act_fixed=act_work + (ec.head_act_bytes if last else 0.0),
                embed_act=ec.embed_act_bytes if first else 0.0,
                states=(st_d.weights + st_e.weights, st_d.grads + st_e.grads, st_d.optimizer + st_e.optimizer),
                buffers=buffers, reserved=grp.gpu.reserved_bytes, capacity=grp.gpu.memory_bytes,
                peak_flops=grp.gpu.peak(workload.dtype))


def reference_estimate(model, cluster, workload, par, stages=None, order=None) -> dict:
    validate(model, cluster, workload, par)
    order = tuple(order or DEFAULT_ORDER)
    stages = stages or default_stages(model.layers, par.pp)
    groups = stage_groups(cluster, par, stages)
    p, m, v = par.pp, par.grad_accum, par.vpp
    degrees = {"pp": p, "dp": par.dp, "cp": par.cp, "tp": par.tp}
    pp_stride = _stride(order, degrees, "pp")
    rows = []
    for i, st in enumerate(stages):
        grp = cluster.group(groups[i])
        nxt = groups[i + 1] if i + 1 < p else groups[max(0, i - 1)]
        crosses = nxt != grp.name or pp_stride >= grp.gpus_per_node or pp_stride * p > grp.gpus_per_node
        n_moe = sum(model.is_moe_layer(x) for x in range(st.first_layer, st.last_layer))
        if par.recompute == "full":
            r = st.num_layers if par.recompute_layers < 0 else min(par.recompute_layers, st.num_layers)
        else:
            r = min(st.recompute_layers, st.num_layers)
        c = _stage(model, cluster, workload, par, order, grp, i == 0, i == p - 1, crosses, st.num_layers - n_moe,
                   n_moe, r)
        c["t"] = c["comp"] + c["rec"] + c["tp"] + c["ep"] + c["cp"] + c["pp"] + c["fsdp"]
        if par.dp * par.cp <= 1:
            c["dp_exposed"] = 0.0
        elif not par.overlap_dp_comm:
            c["dp_exposed"] = c["grad_s"] + c["gather_s"]
        else:
            bwd = 2 * c["comp"] / 3
            sl = cluster.compute_comm_slowdown
            c["dp_exposed"] = _ov(c["grad_s"], bwd + i * bwd, sl) + _ov(c["gather_s"], c["comp"] / 3, sl)
        acts = inflight_microbatches(par, i) * (c["act_stored"] + c["embed_act"]) + c["act_fixed"]
        other = c["reserved"] + c["buffers"] + FRAGMENTATION * acts
        w, g, o = c["states"]
        c["memory"] = {"peak_bytes": w + g + o + acts + other, "weights_bytes": w, "grads_bytes": g,
                       "optimizer_bytes": o, "activations_bytes": acts, "other_bytes": other}
        rows.append((i, st, groups[i], r, c))
    times = [c["t"] for *_, c in rows]
    t_max = max(times)
    bubble = (sum(times) - t_max) / v if p > 1 else 0.0
    dp_exposed = max(c["dp_exposed"] for *_, c in rows)
    opt_s = max(c["opt"] for *_, c in rows)
    step = m * t_max + bubble + dp_exposed + opt_s
    j = times.index(t_max)
    b = rows[j][4]
    per_stage = par.tp * par.dp * par.cp
    hw_flops = sum(c["hw_flops"] for *_, c in rows) * per_stage * m
    peak = sum(c["peak_flops"] for *_, c in rows) * per_stage
    tokens = workload.global_batch * workload.seq_len
    # model FLOPs: a property of the model, not of the layout (layers.model_flops_per_token; its
    # hand count is in tests/test_rule_owners.py)
    model_flops = model_flops_per_token(model, workload.seq_len) * tokens
    ps = max(rows, key=lambda row: row[4]["memory"]["peak_bytes"] / row[4]["capacity"])[4]
    return {
        "step_time_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_gpu": tokens / step / par.world_size,
        "model_tflops_per_gpu": model_flops / step / par.world_size / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / par.world_size / 1e12,
        "mfu": model_flops / step / peak, "hfu": hw_flops / step / peak, "memory": ps["memory"],
        "time": {"compute_s": m * b["comp"], "recompute_s": m * b["rec"], "tp_comm_s": m * b["tp"],
                 "cp_comm_s": m * b["cp"], "ep_comm_s": m * b["ep"], "dp_comm_s": m * b["fsdp"] + dp_exposed,
                 "pp_comm_s": m * b["pp"], "bubble_s": bubble, "optimizer_s": opt_s},
        "fits": all(c["memory"]["peak_bytes"] <= c["capacity"] for *_, c in rows),
        "memory_capacity_bytes": ps["capacity"], "bottleneck_stage": j,
        "stages": [{"layers": [st.first_layer, st.last_layer], "recompute_layers": r, "device_group": g,
                    "time_per_microbatch_s": c["t"], "memory": c["memory"], "capacity_bytes": c["capacity"],
                    "fits": c["memory"]["peak_bytes"] <= c["capacity"]} for _, st, g, r, c in rows],
    }


# ---- the comparison ------------------------------------------------------------------------

def _close(a, b, path: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


PROBLEMS = [
    ("llama-3-8b", "dgx-h100", 8, dict(global_batch=64, seq_len=8192)),
    ("llama-3-70b", "dgx-h100", 64, dict(global_batch=512, seq_len=8192)),
    ("llama-3.1-405b", "dgx-h100", 16384, dict(global_batch=2048, seq_len=8192)),
    ("mixtral-8x7b", "dgx-h100", 32, dict(global_batch=256, seq_len=4096)),
    ("deepseek-v3", "dgx-h100", 2048, dict(global_batch=4096, seq_len=4096)),
    ("gpt3-175b", "dgx-a100-80gb", 1024, dict(global_batch=1536, seq_len=2048, dtype="fp16",
                                              attention_kernel="materialized")),
    ("llama-2-7b", "plans/clusters/mixed-h100-a100.yaml", 96, dict(global_batch=192, seq_len=4096)),
    ("tiny-moe", "profiles/measured/cpu-2x2-netns.yaml", 4, dict(global_batch=16, seq_len=256)),
    ("tiny-gpt", "cpu", 4, dict(global_batch=8, seq_len=512, optimizer="sgd", dtype="fp32")),
]


@pytest.mark.parametrize("name,cluster_name,gpus,wl", PROBLEMS, ids=[p[0] + "/" + p[1].split("/")[-1]
                                                                     for p in PROBLEMS])
def test_estimate_matches_stage_by_stage_reference(name, cluster_name, gpus, wl):
    rng = random.Random(name)
    model = get_model(name)
    cluster = load_cluster(cluster_name)
    if len(cluster.groups) == 1:
        cluster = cluster.with_gpus(gpus)
    workload = Workload(**wl)
    cands = enumerate_candidates(model, cluster, workload, {}, cluster.total_gpus)
    checked = 0
    for cand in rng.sample(cands, min(60, len(cands))):
        par = cand.par
        pick = rng.random()
        if pick < 0.25:
            par = dataclasses.replace(par, recompute="full", recompute_layers=rng.choice([-1, 0, 1, 3]))
        elif pick < 0.4 and par.vpp == 1 and par.pp > 1:
            par = dataclasses.replace(par, schedule="gpipe")
        elif pick < 0.55:
            par = dataclasses.replace(par, overlap_dp_comm=False, zero=0, dp_shard=0)
        stages = None
        if len(cluster.groups) > 1 or rng.random() < 0.3:
            # an explicit, possibly uneven split with per-stage recompute and node groups
            ns = [s.num_layers for s in default_stages(model.layers, par.pp)]
            if par.pp > 1:
                i, j = rng.sample(range(par.pp), 2)
                if ns[i] > max(1, par.vpp):
                    ns[i] -= 1
                    ns[j] += 1
            groups = [g for g, c in cand.stage_counts for _ in range(c)]
            use_groups = len(cluster.groups) > 1 and rng.random() < 0.8
            first, st = 0, []
            for i, n in enumerate(ns):
                st.append(StageSpec(first_layer=first, num_layers=n, recompute_layers=rng.choice([0, 1, n]),
                                    group=groups[i] if use_groups else ""))
                first += n
            stages = tuple(st)
        try:
            want = reference_estimate(model, cluster, workload, par, stages=stages, order=cand.order)
        except SpecError:
            with pytest.raises(SpecError, match="."):
                estimate(model, cluster, workload, par, stages=stages, order=cand.order)
            continue
        got = estimate(model, cluster, workload, par, stages=stages, order=cand.order).to_dict()
        _close(got, want, f"{name} {par} {cand.order}")
        checked += 1
    assert checked >= 20
