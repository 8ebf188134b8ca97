"""Rules of the session-22 dense physics (issue 23): the host's issue floor per dense layer
(``costmodel.host``), the per-step reductions and the gradient norm's read (``costmodel.scale``),
each framework's data-parallel bucket (``stage_terms.dp_bucket_bytes``) and NCCL's ring latency
for all-gathers and reduce-scatters (``comm.Network``). Each against a hand count or the slow
obvious version."""
from __future__ import annotations

import dataclasses
import math

import pytest

from costmodel import host, layers
from costmodel.catalog import get_model
from costmodel.comm import ALLREDUCE_HOP_S, ALLREDUCE_SMALL_HOP_S, COLLECTIVE_LAUNCH_S, RING_NICS, GroupLayout, Network
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS
from costmodel.scale import step_reductions_s
from costmodel.specs import ParallelConfig, SpecError, Workload
from costmodel.stage_terms import DEEPSPEED_BUCKET_ELEMENTS, DP_BUCKET_BYTES, dp_bucket_bytes, megatron_layer_numels
from costmodel.training import estimate
from planner.cli import validation

# -- the host floor -------------------------------------------------------------------------------


def test_layer_ops_by_hand():
    llama = get_model("llama-3-8b")          # SwiGLU, rotary, no dropout
    # two norms of 6, Q/K/V/output + 3 MLP GEMMs, rotary 9, attention 1 + 5 layout ops, 2 residual
    # adds, SiLU and the gate product
    assert host.layer_ops(llama, "eager") == 12 + 7 + 9 + 6 + 2 + 2 == 38
    assert host.layer_ops(llama, "compiled") == 7 + 1 + 5
    assert host.layer_ops(llama, "fused") == host.layer_ops(llama, "graphs") == 11
    gpt = get_model("gpt3-175b")            # GELU, learned positions
    assert host.layer_ops(gpt, "fused") == 10
    assert host.layer_ops(gpt, "eager") == 12 + 6 + 0 + 6 + 2 + 1 + (2 if gpt.dropout else 0)
    with pytest.raises(ValueError):
        host.layer_ops(llama, "lazy")


def test_issue_time_and_floor():
    llama = get_model("llama-3-8b")
    # the H200's measured launch floor (session 31: 9.65 us per eager kernel, 0.96 per graph node)
    assert host.issue_s(llama, "eager") == pytest.approx(38 * 9.65e-6)
    assert host.issue_s(llama, "graphs") == pytest.approx(11 * 0.96e-6)
    # a framework's own measured cost per op replaces the bare op's (FrameworkProfile.host_op_s)
    assert host.issue_s(llama, "eager", 27.2e-6) == pytest.approx(38 * 27.2e-6)
    assert host.layer_floor_s(1e-6, llama, "eager") == host.issue_s(llama, "eager")     # binds
    assert host.layer_floor_s(1.0, llama, "eager") == 1.0                                 # hidden
    assert host.layer_floor_s(1e-6, llama, "") == 1e-6                                    # no floor


def _layer(model, launch, moe=False, tokens=1):
    cl = load_cluster("dgx-h100").with_gpus(8)
    g = cl.groups[0]
    wl = Workload(global_batch=8, seq_len=tokens)
    one = GroupLayout(1, 1)
    layers.layer_cost.cache_clear()
    return layers.layer_cost(model, moe, wl, 1, 1, 1, False, 1, g.gpu, cl, g.intra_node, one, one, one,
                             launch=launch)


def test_a_tiny_layer_costs_the_hosts_issue_time():
    """One token through a llama-3-8b layer on an H100: microseconds of GPU work, so eager
    PyTorch's layer takes its issue time; fused and graphs take less; a long sequence hides it."""
    m = get_model("llama-3-8b")
    none, eager, fused, graphs = (_layer(m, x).fwd_s for x in ("", "eager", "fused", "graphs"))
    assert none < host.issue_s(m, "graphs") < host.issue_s(m, "eager")
    assert eager == pytest.approx(host.issue_s(m, "eager"))
    assert fused == pytest.approx(host.issue_s(m, "fused"))
    assert graphs == pytest.approx(max(none, host.issue_s(m, "graphs")))
    long_none, long_eager = _layer(m, "", tokens=8192).fwd_s, _layer(m, "eager", tokens=8192).fwd_s
    assert long_none == long_eager > host.issue_s(m, "eager")


def test_moe_layers_keep_their_own_host_rule():
    m = get_model("mixtral-8x7b")
    assert _layer(m, "eager", moe=True).fwd_s == _layer(m, "", moe=True).fwd_s


def test_profiles_and_switches_set_the_launch():
    assert FRAMEWORKS["megatron"].launch == "fused"
    assert FRAMEWORKS["torchtitan"].launch == "eager"
    assert FRAMEWORKS["torchtitan"].with_switches(compile=True).launch == "compiled"
    assert FRAMEWORKS["megatron"].with_switches(compile=True).launch == "fused"
    with pytest.raises(SpecError):
        dataclasses.replace(FRAMEWORKS["megatron"], launch="lazy")


def test_cuda_graphs_read_from_the_record():
    assert validation.ran_cuda_graphs({"cuda_graphs": "full iteration (FULL_CUDA_GRAPH=1)"})
    assert validation.ran_cuda_graphs({"cuda_graphs": True})
    assert not validation.ran_cuda_graphs({"cuda_graphs": "none"})
    assert not validation.ran_cuda_graphs({"cuda_graphs": "not stated"})
    assert not validation.ran_cuda_graphs({"compile": True})
    assert not validation.ran_cuda_graphs("full CUDA graphs")      # free text: not a record of the key
    marked = [c for c, _ in validation.all_cases(True) if validation.ran_cuda_graphs(c.get("execution"))]
    assert marked and all(validation.case_inputs(c)[4].launch == "graphs" for c in marked)


# -- data-parallel buckets and NCCL's ring latency ------------------------------------------------


def test_buckets_by_hand():
    assert dp_bucket_bytes("torch", 512, 4) == DP_BUCKET_BYTES == 25 * 2**20
    assert dp_bucket_bytes("torch", 8, 4, zero=0, layer_values=1e6) == DP_BUCKET_BYTES    # DDP at ZeRO-0
    assert dp_bucket_bytes("torch", 8, 4, zero=2, layer_values=1e6) == 4e6                # FSDP2: a block
    assert dp_bucket_bytes("fsdp2", 8, 4, zero=0, layer_values=1e6) == 4e6                # FSDP2 replicate too
    assert dp_bucket_bytes("megatron", 8, 4) == 40_000_000 * 4           # the floor
    assert dp_bucket_bytes("megatron", 256, 2) == 256_000_000 * 2        # 1M per data-parallel rank
    assert dp_bucket_bytes("deepspeed", 8, 2) == DEEPSPEED_BUCKET_ELEMENTS * 2 == 1e9
    assert FRAMEWORKS["megatron"].dp_bucket == "megatron"
    assert FRAMEWORKS["deepspeed"].dp_bucket == FRAMEWORKS["megatron-deepspeed"].dp_bucket == "deepspeed"
    assert FRAMEWORKS["torchtitan"].dp_bucket == FRAMEWORKS["builtin"].dp_bucket == "fsdp2"


def test_ring_latency_counts_every_rank():
    """An all-gather over 256 ranks in 8 domains of 32 is one NCCL ring: 255 steps, 7 across the
    network and 248 inside a domain (NCCL tuning.cc); inside one domain the steps are k - 1, and
    the all-reduce keeps its tree's count, each step across domains at what nccl-tests measure
    (comm.ALLREDUCE_HOP_S, tests/test_allreduce_scale.py)."""
    cl = load_cluster("dgx-h100")
    net = Network(cl)
    a, b = net._intra_lat, net._inter_lat
    assert net.latency_s(GroupLayout(256, 32)) == pytest.approx(248 * a + 7 * b)
    assert net.latency_s(GroupLayout(8, 8)) == pytest.approx(7 * a)
    assert net.latency_s(GroupLayout(64, 1)) == pytest.approx(63 * b)
    hop = max(b, ALLREDUCE_HOP_S)
    assert hop > b
    assert net.latency_s(GroupLayout(64, 8), 2) == pytest.approx(2 * 7 * a + 2 * math.log2(8) * hop)
    assert net.latency_s(GroupLayout(16, 8), 2) == pytest.approx(2 * 7 * a + 2 * hop)     # two nodes: the ring's 2
    # the transfer's time is the latency plus the slower tier's transfer (the tiers run at once),
    # whatever the size; across domains the shard spreads over the NICs one per channel
    # (comm.RING_NICS), not all 32 of the domain
    s = 1e9
    t = net.all_gather(s, GroupLayout(256, 32))
    assert t == pytest.approx(net.latency_s(GroupLayout(256, 32)) + max(31 / 32 * s / net._intra_bw,
                                                                        7 / 8 * (s / min(32, RING_NICS)) / net._inter_bw))


def test_each_megatron_bucket_pays_the_ring_latency():
    """ZeRO-1 on 256 H100 under Megatron: the gradient reduce-scatter is one call per bucket
    calls, each its launch and its ring latency (the slow obvious sum over the buckets)."""
    model = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(256)
    wl = Workload(global_batch=256, seq_len=4096)
    par = ParallelConfig(dp=256, zero=1, micro_batch=1, grad_accum=1)
    from costmodel.stage_cache import stage_model
    sm = stage_model(model, cl, wl, par, ("pp", "dp", "cp", "tp"), cl.groups[0].name, True, True, False,
                     FRAMEWORKS["megatron"])
    c = sm.cost(model.layers, 0, 0)
    nbytes = (model.layers * sm.mesh.dense_layer_params + sm.ends_params) * sm.sh.g_b
    # Megatron-Core closes a bucket at a tensor boundary once it holds >= bucket_size parameters
    # (bucket4: stage_terms.megatron_bucket_count; the head, final norm, layers, embedding)
    size = dp_bucket_bytes("megatron", 256, 1.0)
    emb = model.vocab * model.hidden
    sizes, cur = [], 0.0
    for t in (emb, model.hidden) + megatron_layer_numels(model, 1) * model.layers + (emb,):
        cur += t
        if cur >= size:
            sizes.append(cur * sm.sh.g_b)
            cur = 0.0
    sizes += [cur * sm.sh.g_b] if cur else []
    assert sum(sizes) == pytest.approx(nbytes)
    slow = sum(sm.mesh.all_gather_shard(x) + COLLECTIVE_LAUNCH_S for x in sizes)
    assert c.dp_grad_s == pytest.approx(slow, rel=1e-9)


# -- per-step work -----------------------------------------------------------------------------


def test_step_reductions_by_hand():
    net = Network(load_cluster("dgx-h100"))
    one = GroupLayout(1, 1)
    assert step_reductions_s(net, one, one) == 0.0
    world, dp = GroupLayout(1024, 8), GroupLayout(128, 1)
    # two small all-reduces: each network step at the small message's step (comm.ALLREDUCE_SMALL_HOP_S)
    small = (net.latency_s(world, 2, small=True) + COLLECTIVE_LAUNCH_S) + (net.latency_s(dp, 2, small=True)
                                                                           + COLLECTIVE_LAUNCH_S)
    assert step_reductions_s(net, world, dp) == pytest.approx(small)
    a = net._intra_lat
    steps_world, steps_dp = 2 * math.log2(128), 2 * math.log2(128)
    assert net.latency_s(world, 2, small=True) == pytest.approx(2 * 7 * a + steps_world * ALLREDUCE_SMALL_HOP_S)
    assert net.latency_s(dp, 2, small=True) == pytest.approx(steps_dp * ALLREDUCE_SMALL_HOP_S)
    assert net.latency_s(dp, 2) == pytest.approx(steps_dp * ALLREDUCE_HOP_S)


def test_the_step_pays_the_reductions_that_do_not_shrink():
    """Weak scaling of a data-parallel llama-3-8b: the optimizer term (local states shrink under
    ZeRO-1) keeps at least the two reductions, which grow with the job."""
    model = get_model("llama-3-8b")
    out = []
    for n in (8, 1024):
        cl = load_cluster("dgx-h100").with_gpus(n)
        est = estimate(model, cl, Workload(global_batch=n, seq_len=4096),
                       ParallelConfig(dp=n, zero=1, micro_batch=1, grad_accum=1), framework="megatron")
        out.append(est.time["optimizer_s"])
    net = Network(load_cluster("dgx-h100"))
    floor = step_reductions_s(net, GroupLayout(1024, 8), GroupLayout(1024, 8))
    assert out[1] >= floor > step_reductions_s(net, GroupLayout(8, 8), GroupLayout(8, 8))


# -- the backward's TP overlap without sequence parallelism (Korthikanti et al., Table 4) -----------


def _table4_layer(sp: bool, recompute: str):
    """One layer of Korthikanti's 22B model (tp 8, micro-batch 4, 2,048 tokens, materialized
    attention, the backward overlap their Sec. 6.2 describes) as the cost model prices it:
    (forward, backward) in ms, the backward with its recompute."""
    from costmodel.stage_cache import stage_model
    case = next(c for c, _ in validation.all_cases(True) if c["name"] == "korthikanti-22b-full-recompute")
    model, cluster, wl, par, prof, _ = validation.case_inputs(case)
    assert prof.tp_comm_overlap_backward and wl.attention_kernel == "materialized"
    par = dataclasses.replace(par, sp=sp, recompute=recompute)
    sm = stage_model(model, cluster, wl, par, ("pp", "dp", "cp", "tp"), cluster.groups[0].name, True, True, False,
                     prof)
    lc, lt = sm.mesh.dense, sm.mesh.dense_terms
    fwd = lc.fwd_s + lc.tp_fwd_s
    bwd = lt.compute_s - lc.fwd_s + (lt.tp_comm_s - lc.tp_fwd_s)
    extra = {"none": 0.0, "full": lt.recompute_s, "selective": lt.selective_s}[recompute]
    return fwd * 1e3, (bwd + extra) * 1e3


@pytest.mark.parametrize("sp,recompute,fwd,bwd", [
    (False, "none", 7.7, 11.9), (True, "none", 7.2, 11.8), (False, "full", 7.7, 19.5),
    (False, "selective", 7.7, 13.2), (True, "selective", 7.2, 13.1)])
def test_korthikanti_table4_per_layer(sp, recompute, fwd, bwd):
    """Korthikanti et al. MLSys'23 Table 4 (one layer of the 22B model on A100s, ms): the priced
    forward and backward within 6% of each measured row (the A100 curve is fitted on the same
    paper's end-to-end rows, not on these)."""
    got_f, got_b = _table4_layer(sp, recompute)
    assert got_f == pytest.approx(fwd, rel=0.06)
    assert got_b == pytest.approx(bwd, rel=0.06)


def test_torch_zero12_buckets_are_fsdp2_blocks():
    """FSDP2 reduce-scatters and gathers each transformer block on its own: under ZeRO-1/2 a torch
    stack's bucket is one layer's values; DDP (ZeRO-0) keeps its 25 MiB."""
    assert dp_bucket_bytes("torch", 64, 4, zero=2, layer_values=2.2e8) == 2.2e8 * 4
    assert dp_bucket_bytes("torch", 64, 2, zero=1, layer_values=2.2e8) == 2.2e8 * 2
    assert dp_bucket_bytes("torch", 64, 4, zero=0, layer_values=2.2e8) == DP_BUCKET_BYTES
    assert dp_bucket_bytes("megatron", 64, 4, zero=2, layer_values=2.2e8) == 64e6 * 4
