"""``estimate()`` groups identical pipeline stages into kinds and serves sub-terms from caches
(``costmodel.stage_cache``: per-(model, cluster, workload) constants, layer costs per shape, a
mesh's collective functions, an even split's kinds, stage models keyed on a whole
configuration). This checks it against the uncached rule calls -- every stage on its own, a
fresh ``_Shared`` (no sub-term cached) and ``StageModel`` per stage, its memory, exposed DP
time and the step from ``costmodel.stage_terms`` -- over many configurations: dense and MoE,
pipelines of 1 to 32 stages, ZeRO 0-3 and HSDP, every recompute mode, interleaved and GPipe
schedules, uneven and explicit stage splits, a mixed H100/A100 cluster and a measured one.

The rules themselves are checked by hand-derived cases here and in ``test_costmodel.py`` (the
bubble of Narayanan et al., ZeRO's model states, TP/PP invariants) and against published runs
(``test_costmodel.py``: the calibration set, ZeRO memory)."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from costmodel.catalog import get_model
from costmodel.comm import DEFAULT_ORDER
from costmodel.compute import MEMORY_BOUND_FRACTION
from costmodel.frameworks import framework_profile
from costmodel.layers import model_flops_per_token
from costmodel.specs import ParallelConfig, StageSpec, SpecError, Workload, default_stages, validate
from costmodel.stage_cache import _Shared
from costmodel.stage_terms import (StageModel, ep_unpaired_s, inflight_microbatches, interleaved_fill_hops,
                                   pipeline_step_time, stage_crosses)
from costmodel.training import estimate, stage_groups
from planner.search.space import enumerate_candidates
from costmodel.files.clusters import load_cluster


# ---- the reference: one stage at a time, through the rules, nothing cached between stages ---

def reference_estimate(model, cluster, workload, par, stages=None, order=None) -> dict:
    validate(model, cluster, workload, par)
    order = tuple(order or DEFAULT_ORDER)
    stages = stages or default_stages(model.layers, par.pp)
    if len(stages) != par.pp or sum(s.num_layers for s in stages) != model.layers:
        raise SpecError("split")
    groups = stage_groups(cluster, par, stages)
    p, m, v = par.pp, par.grad_accum, par.vpp
    rows = []
    ep_hidden = 0.0         # what the EP overlap hides per MoE layer, the most of any stage's mesh
    for i, st in enumerate(stages):
        sh = _Shared(model, cluster, workload, framework_profile("generic"))      # empty caches
        grp = cluster.group(groups[i])
        sm = StageModel(sh, par, order, grp).place(i == 0, i == p - 1, stage_crosses(cluster, par, order, groups, i))
        n_moe = sum(model.is_moe_layer(x) for x in range(st.first_layer, st.last_layer))
        r = par.full_recompute_layers(st.num_layers, st.recompute_layers)
        c = sm.cost(st.num_layers - n_moe, n_moe, r)
        mem = sm.memory(c, inflight_microbatches(par, i))
        rows.append((st, groups[i], r, c, mem, sm.capacity_bytes, sm.dp_exposed(c, i), grp.gpu.peak(workload.dtype)))
        if sm.mesh.moe_terms is not None:
            ep_hidden = max(ep_hidden, sm.mesh.moe_terms.ep_hidden_s)
    times = tuple(c.time_s for _, _, _, c, *_ in rows)
    dp_exposed = max(row[6] for row in rows)
    opt_s = max(row[3].optimizer_s for row in rows)
    # the interleaved fill's extra hand-offs, each the slowest stage's one hand-off (an end stage's
    # pp_comm_s holds one, a middle stage's two)
    hop = max(row[3].pp_comm_s / (1 if i in (0, p - 1) else 2) for i, row in enumerate(rows)) if v > 1 else 0.0
    # and the EP all-to-alls the overlap leaves unpaired in the warm-up and cool-down (ep_unpaired_s)
    fill = interleaved_fill_hops(p, v) * hop + ep_unpaired_s(p, v, m, model.moe_layers, ep_hidden)
    step, bubble = pipeline_step_time(m, v, times, dp_exposed, opt_s, fill)
    j = times.index(max(times))
    b = rows[j][3]
    per_stage = par.tp * par.dp * par.cp
    hw_flops = sum(row[3].hw_flops for row in rows) * per_stage * m
    peak = sum(row[7] for row in rows) * per_stage
    tokens = workload.global_batch * workload.seq_len
    # model FLOPs: a property of the model, not of the layout (layers.model_flops_per_token; its
    # hand count is in tests/test_rule_owners.py)
    model_flops = model_flops_per_token(model, workload.seq_len) * tokens
    fullest = max(rows, key=lambda row: row[4]["peak_bytes"] / row[5])
    return {
        "step_time_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_gpu": tokens / step / par.world_size,
        "model_tflops_per_gpu": model_flops / step / par.world_size / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / par.world_size / 1e12,
        "mfu": model_flops / step / peak, "hfu": hw_flops / step / peak, "memory": fullest[4],
        "time": {"compute_s": m * b.compute_s, "recompute_s": m * b.recompute_s, "tp_comm_s": m * b.tp_comm_s,
                 "cp_comm_s": m * b.cp_comm_s, "ep_comm_s": m * b.ep_comm_s,
                 "dp_comm_s": m * b.fsdp_comm_s + dp_exposed, "pp_comm_s": m * b.pp_comm_s,
                 "bubble_s": bubble, "optimizer_s": opt_s},
        "fits": all(row[4]["peak_bytes"] <= row[5] for row in rows),
        "memory_capacity_bytes": fullest[5], "bottleneck_stage": j,
        "stages": [{"layers": [st.first_layer, st.last_layer], "recompute_layers": r, "device_group": g,
                    "time_per_microbatch_s": c.time_s, "memory": mem, "capacity_bytes": cap,
                    "fits": mem["peak_bytes"] <= cap} for st, g, r, c, mem, cap, *_ in rows],
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
        elif pick < 0.7 and par.ep > 1:
            par = dataclasses.replace(par, ep_overlap=True)      # the unpaired chunks' all-to-alls (ep_unpaired_s)
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


# ---- hand-derived cases ----------------------------------------------------------------------

def test_one_gpu_by_hand():
    """llama-3-8b on one H100 (pp = tp = dp = 1, bf16, Adam): model states are 2 + 4 + 12 bytes
    per parameter (ZeRO, Sec. 3.1, with fp32 gradients); no communication, no bubble; the step is
    the micro-batches' stage time plus the optimizer, which moves 30 bytes per parameter through
    HBM (2 x 12 read and written, 4 read, 2 written), and the gradient norm's one more read of the
    4-byte gradients (costmodel.scale.GRAD_NORM_READS); one GPU makes no per-step reduction."""
    model = get_model("llama-3-8b")
    cluster = load_cluster("dgx-h100").with_gpus(1)
    wl = Workload(global_batch=4, seq_len=1024)
    par = ParallelConfig(micro_batch=1, grad_accum=4, recompute="full")
    est = estimate(model, cluster, wl, par)
    n = model.total_params()
    assert est.memory["weights_bytes"] == pytest.approx(2 * n, rel=1e-12)
    assert est.memory["grads_bytes"] == pytest.approx(4 * n, rel=1e-12)
    assert est.memory["optimizer_bytes"] == pytest.approx(12 * n, rel=1e-12)
    t = est.time
    assert t["tp_comm_s"] == t["cp_comm_s"] == t["ep_comm_s"] == t["dp_comm_s"] == t["pp_comm_s"] == t["bubble_s"] == 0
    # at the fused kernels' forward fraction of HBM bandwidth (costmodel.compute.MEMORY_BOUND_FRACTION)
    frac = MEMORY_BOUND_FRACTION["fused"][0]
    assert t["optimizer_s"] == pytest.approx((30 + 4) * n / (cluster.gpu.hbm_bandwidth_bytes_per_s * frac), rel=1e-12)
    assert est.step_time_s == pytest.approx(4 * est.stages[0].time_per_microbatch_s + t["optimizer_s"], rel=1e-12)
    assert t["compute_s"] + t["recompute_s"] == pytest.approx(4 * est.stages[0].time_per_microbatch_s, rel=1e-12)


def test_pipeline_step_by_hand():
    """Four stages of 3, 2, 2, 1 time units, 8 micro-batches, 1F1B: 8 x 3 + (8 - 3) = 29; two
    virtual stages halve the fill and drain: 24 + 2.5; one stage has no bubble."""
    assert pipeline_step_time(8, 1, (3.0, 2.0, 2.0, 1.0), 0.5, 0.25) == (29.75, 5.0)
    assert pipeline_step_time(8, 2, (3.0, 2.0, 2.0, 1.0), 0.0, 0.0) == (26.5, 2.5)
    assert pipeline_step_time(8, 1, (3.0,), 1.0, 0.0) == (25.0, 0.0)
    # the interleaved fill's hand-offs: 2p(v - 1) + (2p - 4)(1 - 1/v), none without virtual stages
    assert [interleaved_fill_hops(p, v) for p, v in ((8, 1), (1, 4), (2, 2), (8, 3), (16, 3))] == \
        [0.0, 0.0, 4.0, pytest.approx(40.0), pytest.approx(82.6667, rel=1e-4)]
    assert pipeline_step_time(8, 2, (3.0, 2.0, 2.0, 1.0), 0.0, 0.0, 0.5) == (27.0, 3.0)
