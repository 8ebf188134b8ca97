"""costmodel/attention.py: which kernel each attention implementation runs on each GPU, and the
context-parallel ring priced on its blocks, checked against the ring walked rank by rank."""
from __future__ import annotations

import pytest

from costmodel.attention import block_s, attention_fwd_bwd_s, efficiency, kernel_for
from costmodel.catalog import get_model
from costmodel.comm import group_layout
from costmodel.files.clusters import load_cluster
from costmodel.layers import layer_cost
from costmodel.specs import Workload

H100 = load_cluster("dgx-h100").gpu
A100 = load_cluster("dgx-a100-80gb").gpu
B200 = load_cluster("dgx-b200").gpu


def test_kernel_each_implementation_runs():
    # Transformer Engine (Megatron --attention-backend auto): cuDNN on Hopper+, flash-attn on Ampere
    assert [kernel_for("te", g) for g in (A100, H100, B200)] == ["fa2", "cudnn", "cudnn"]
    # the published torchtitan runs' SDPA: FlashAttention-2 below SM100
    assert [kernel_for("sdpa-torchtitan", g) for g in (A100, H100, B200)] == ["fa2", "fa2", "cudnn"]
    # torchtitan 0.3.0's VarlenAttention: FA3 on SM90, FA4 on SM100
    assert [kernel_for("varlen", g) for g in (A100, H100, B200)] == ["fa2", "fa3", "fa4"]
    assert kernel_for("flex", H100) == "flex" and kernel_for("", H100) == ""
    # a published run that called FlashAttention-3 or -4 itself (Hugging Face's attn_implementation)
    assert kernel_for("flash-attn-3", H100) == "fa3" and kernel_for("flash-attn-4", B200) == "fa4"
    # on a GPU the package does not support, the curve falls back to FA2's (attention._table)
    assert efficiency("fa3", A100, 128, 4096, True, "fb") == efficiency("fa2", A100, 128, 4096, True, "fb")
    with pytest.raises(ValueError, match="unknown attention implementation 'xformers'"):
        kernel_for("xformers", H100)


def test_curves_order_the_kernels_as_measured():
    """FA2 on Hopper uses none of Hopper's asynchronous tensor-core paths: well under cuDNN and FA3
    there; every curve rises with the sequence; causal is slower than full at a short sequence."""
    for s in (1024, 8192, 65536):
        fa2 = efficiency("fa2", H100, 128, s, True, "fb")
        assert fa2 < 0.35 and fa2 < efficiency("cudnn", H100, 128, s, True, "fb") < efficiency("fa3", H100, 128, s, True, "fb")
        assert efficiency("flex", H100, 128, s, True, "fb") < fa2
    for k in ("fa2", "cudnn", "fa3"):
        effs = [efficiency(k, H100, 128, s, True, "fb") for s in (512, 2048, 8192, 32768)]
        assert effs == sorted(effs)
        assert efficiency(k, H100, 128, 1024, True, "fb") < efficiency(k, H100, 128, 1024, False, "fb")


def _ring_walked(kernel, gpu, flops, hd, s, cp):
    """The load-balanced ring of torch's _templated_ring_attention, rank by rank and step by step:
    step 0 the local causal pair; step i > 0 on rank r all queries against the first key chunk
    (i <= r) or the second query chunk against all keys (i > r). Every rank waits for the ring at
    each step, so a step takes its slowest rank's block; a block is priced at its shorter side."""
    local = s / cp
    pairs_per_rank = s * s / 2 / cp              # causal (query, key) pairs a rank computes
    per_pair = flops / pairs_per_rank
    f_tot = b_tot = 0.0
    for i in range(cp):
        steps = []
        for r in range(cp):
            if i == 0:
                q, k, causal = local, local, True
            elif i <= r:
                q, k, causal = local, local / 2, False
            else:
                q, k, causal = local / 2, local, False
            pairs = q * k / 2 if causal else q * k
            steps.append(block_s(kernel, gpu, gpu.peak("bf16"), pairs * per_pair, hd, min(q, k), causal))
        f_tot += max(f for f, _ in steps)
        b_tot += max(b for _, b in steps)
    return f_tot, b_tot


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("kernel,gpu", [("fa2", H100), ("cudnn", H100), ("fa2", A100), ("cudnn", B200)])
def test_cp_ring_equals_the_ring_walked_rank_by_rank(cp, kernel, gpu):
    s, hd = 131072, 128
    flops = 4 * (s / cp) * s * 4096 / 2          # a rank's causal forward FLOPs, 32 heads of 128
    fast = attention_fwd_bwd_s(kernel, gpu, gpu.peak("bf16"), flops, hd, s, cp)
    slow = _ring_walked(kernel, gpu, flops, hd, s, cp)
    assert fast == pytest.approx(slow, rel=1e-12)
    # and the ring's blocks together do the causal work once: at cp = 1 the same rule is one block
    assert attention_fwd_bwd_s(kernel, gpu, gpu.peak("bf16"), flops, hd, s, 1) == \
        block_s(kernel, gpu, gpu.peak("bf16"), flops, hd, s, True)


def _h100_llama8b_layer_args(seq_len: int) -> tuple:
    """``layer_cost``'s arguments for one Llama-3.1-8B layer on 8 H100, data parallel only."""
    m = get_model("llama-3.1-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    wl = Workload(global_batch=8, seq_len=seq_len)
    lay = group_layout({"tp": 1, "cp": 1, "dp": 8, "pp": 1}, ("tp", "cp", "dp", "pp"), "tp", 8)
    return (m, False, wl, 1, 1, 1, False, 1, cl.gpu, cl, cl.groups[0].intra_node, lay, lay, lay)


def test_layer_prices_the_kernel_the_framework_runs():
    """The same layer on H100 with TE's cuDNN against SDPA's FA2: the attention core, forward and
    backward, is slower on FA2; its backward beyond twice the forward is compute, not recompute."""
    args = _h100_llama8b_layer_args(32768)
    te = layer_cost(*args, attention="te")
    fa2 = layer_cost(*args, attention="sdpa-torchtitan")
    old = layer_cost(*args, attention="")
    assert fa2.attn_fwd_s > 1.5 * te.attn_fwd_s
    assert fa2.attn_bwd_extra_s > 0 and te.attn_bwd_extra_s > 0 and old.attn_bwd_extra_s == 0
    assert te.gemm_fwd_s == fa2.gemm_fwd_s == old.gemm_fwd_s


def test_torch_cp_exposed_exchange_by_hand():
    """PyTorch's all-gather rotater (torch _attention.py): the forward waits for the one K/V
    all-gather after step 0; the backward waits for it again after step 0's backward and for the
    K/V gradients' last ring hop after its loop."""
    from costmodel.attention import torch_cp_exposed_s
    # gather 40 ms, gradient hop 12 ms, step 0: 13 ms forward, 33 ms backward
    f, b = torch_cp_exposed_s(0.040, 0.012, 0.013, 0.033)
    assert f == pytest.approx(0.027) and b == pytest.approx(0.007 + 0.012)
    # a gather shorter than step 0 is hidden; the last gradient hop never is
    assert torch_cp_exposed_s(0.010, 0.003, 0.026, 0.066) == (0.0, 0.003)


def _cp_layer_args(name: str, gpus: int, batch: int, s: int, cp: int, tp: int, pp: int):
    """A dense layer's ``layer_cost`` arguments on DGX H100s under TP ``tp`` and CP ``cp`` (mesh tp, cp, dp, pp;
    one micro-batch of ``batch`` sequences of ``s`` tokens): the model, the cluster and the arguments."""
    m = get_model(name)
    cl = load_cluster("dgx-h100").with_gpus(gpus)
    wl = Workload(global_batch=batch, seq_len=s)
    order = ("tp", "cp", "dp", "pp")
    par = {"tp": tp, "cp": cp, "dp": 1, "pp": pp}
    tp_lay = group_layout(par, order, "tp", 8)
    cp_lay = group_layout(par, order, "cp", 8)
    return m, cl, (m, False, wl, tp, cp, 1, True, 1, cl.gpu, cl, cl.groups[0].intra_node, tp_lay, tp_lay, cp_lay)


def test_layer_adds_torch_cp_exchange_by_hand():
    """llama 3.1 405B's layer at TP 8, CP 8 across hosts, 262144 tokens (torchtitan's 2024-12
    4D run): the attention time of PyTorch's CP (sdpa-torchtitan, FA2) less that of the same
    FA2 ring with a library's bookkeeping (flash-attn: Transformer Engine's merges, grouped K/V) is
    PyTorch's merges less the library's plus the exposed exchange derived here: K and V passed at the
    query width (repeat_kv: 16 heads x 128 per TP rank), 32768 tokens per rank, BF16."""
    from costmodel.attention import block_s, ring_merge_bytes
    from costmodel.comm import Network, launched
    from costmodel.compute import MEMORY_BOUND_FRACTION, memory_time_s
    s, cp, tp = 262144, 8, 8
    m, cl, args = _cp_layer_args("llama-3.1-405b", 512, 8, s, cp, tp, 8)
    cp_lay = args[-1]
    assert cp_lay.crosses_nodes
    intra = cl.groups[0].intra_node
    torch_cp = layer_cost(*args, attention="sdpa-torchtitan")
    plain = layer_cost(*args, attention="flash-attn")
    T = s / cp
    width = 128 * 128 / tp                                 # q width per TP rank; K, V passed as wide
    peak = cl.gpu.peak("bf16")
    flops = 4 * T * s * width / 2                          # a rank's causal forward FLOPs
    f0, b0 = block_s("fa2", cl.gpu, peak, flops / cp, 128, T, True)
    net = Network(cl, intra)
    kv = T * 2 * width * 2
    gather = launched(net.all_gather(cp * kv, cp_lay))
    hop = launched(net.p2p(2 * kv, True))
    merge_f, merge_b = ring_merge_bytes("sdpa-torchtitan", T, width, width, cp)
    # the library ring's own: K/V at the grouped width (8 KV heads over TP 8: one of 128), FA2 (not fused)
    lib_f, lib_b = ring_merge_bytes("flash-attn", T, width, 128, cp, fused=False)
    assert 0 < lib_f < merge_f and 0 < lib_b < merge_b
    merge_f, merge_b = merge_f - lib_f, merge_b - lib_b
    frac = 1.0 / MEMORY_BOUND_FRACTION["eager"][0]
    want_f = memory_time_s(cl.gpu, merge_f) * frac + max(0.0, gather - f0)
    assert gather > f0                                     # across hosts the gather outlasts step 0
    assert torch_cp.attn_fwd_s - plain.attn_fwd_s == pytest.approx(want_f, rel=1e-9)
    from costmodel.layers import _straggler
    # the layer's attention backward (its part beyond twice the forward carries the straggler factor)
    def bwd(lc):
        return lc.attn_bwd_extra_s / _straggler(cl.gpu, cl) + 2 * lc.attn_fwd_s
    want_b = memory_time_s(cl.gpu, merge_b) * frac + max(0.0, gather - b0) + hop
    assert bwd(torch_cp) - bwd(plain) == pytest.approx(want_b, rel=1e-9)
    # the part of the gather beside step 0 is the CP traffic the stage overlaps
    assert torch_cp.cp_fwd_s == pytest.approx(min(gather, f0))


# --------------------------------------------------------------------------------------
# Measured curves (GpuSpec.attention_table, written by `planner profile`)
# --------------------------------------------------------------------------------------

def _measured(gpu, rows):
    import dataclasses
    return dataclasses.replace(gpu, attention_table=tuple(sorted(rows)))


def test_measured_points_replace_the_published_curve_where_measured():
    """A table holding the published cuDNN curve's own values at a few points gives those values
    back at the points and, between them, the straight line in log sequence length (computed here
    by hand); a kernel, mask or direction not in the table keeps its published curve."""
    import math
    pts = [(hd, s, d) for hd in (64, 128) for s in (1024, 4096) for d in ("fwd", "bwd")]
    rows = [("cudnn", d, "causal", hd, s, round(efficiency("cudnn", H100, hd, s, True, d), 4)) for hd, s, d in pts]
    g = _measured(H100, rows)
    for hd, s, d in pts:
        assert efficiency("cudnn", g, hd, s, True, d) == pytest.approx(efficiency("cudnn", H100, hd, s, True, d), abs=1e-4)
    # between the sequence lengths: linear in log s (2048 is the midpoint of 1024 and 4096)
    e1, e4 = (dict(((hd, s), e) for _, d, _, hd, s, e in rows if d == "fwd")[(128, s)] for s in (1024, 4096))
    assert efficiency("cudnn", g, 128, 2048, True, "fwd") == pytest.approx((e1 + e4) / 2, rel=1e-9)
    # between head dims: linear in log2 (90.5 = 2^6.5, halfway between 64 and 128); flat beyond
    e64 = dict(((hd, s), e) for _, d, _, hd, s, e in rows if d == "bwd")[(64, 4096)]
    e128 = dict(((hd, s), e) for _, d, _, hd, s, e in rows if d == "bwd")[(128, 4096)]
    assert efficiency("cudnn", g, 2 ** 6.5, 4096, True, "bwd") == pytest.approx((e64 + e128) / 2, rel=1e-9)
    assert efficiency("cudnn", g, 256, 65536, True, "bwd") == pytest.approx(e128, rel=1e-9)
    assert efficiency("cudnn", g, 32, 128, True, "fwd") == pytest.approx(
        dict(((hd, s), e) for _, d, _, hd, s, e in rows if d == "fwd")[(64, 1024)], rel=1e-9)
    # not measured: the non-causal mask, FA2, FA3 -- published, unchanged
    for k, causal in (("cudnn", False), ("fa2", True), ("fa3", True)):
        assert efficiency(k, g, 128, 4096, causal, "fwd") == efficiency(k, H100, 128, 4096, causal, "fwd")
    assert not math.isnan(efficiency("cudnn", g, 128, 3000, True, "fb"))


def test_measured_fa2_prices_each_direction_and_flex_keeps_its_ratio():
    """FA2's published A100 curve is forward + backward together; a measured FA2 prices the two apart
    (block_s), and FlexAttention stays FA2 times the blog's ratio."""
    from costmodel.attention import FLEX_OF_FA2
    rows = [("fa2", "fwd", "causal", 128, 4096, 0.40), ("fa2", "bwd", "causal", 128, 4096, 0.25)]
    g = _measured(H100, rows)
    f, b = block_s("fa2", g, 1e15, 1e12, 128, 4096, True)
    assert f == pytest.approx(1e12 / (1e15 * 0.40)) and b == pytest.approx(2.5e12 / (1e15 * 0.25))
    fx, bx = block_s("flex", g, 1e15, 1e12, 128, 4096, True)
    assert fx == pytest.approx(f / FLEX_OF_FA2) and bx == pytest.approx(b / FLEX_OF_FA2)
    # only the forward measured: on A100 the published forward + backward figure both ways, as before;
    # on Hopper, whose catalog curves are per direction, the measured forward and the catalog backward
    a1 = _measured(A100, rows[:1])
    assert block_s("fa2", a1, 1e15, 1e12, 128, 4096, True) == block_s("fa2", A100, 1e15, 1e12, 128, 4096, True)
    g1 = _measured(H100, rows[:1])
    f1, b1 = block_s("fa2", g1, 1e15, 1e12, 128, 4096, True)
    assert f1 == pytest.approx(1e12 / (1e15 * 0.40)) and b1 == block_s("fa2", H100, 1e15, 1e12, 128, 4096, True)[1]


def test_measured_table_reaches_the_layer_and_round_trips_a_cluster_file(tmp_path):
    """The layer's attention core is priced on the GPU's measured table (a slower measured cuDNN
    makes it slower by the ratio), and a cluster file keeps the table through write and load."""
    import yaml
    from costmodel.files.clusters import cluster_from_dict, cluster_to_dict, gpu_from_dict, gpu_to_dict
    m = get_model("llama-3.1-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    wl = Workload(global_batch=8, seq_len=8192)
    lay = group_layout({"tp": 1, "cp": 1, "dp": 8, "pp": 1}, ("tp", "cp", "dp", "pp"), "tp", 8)
    slow = _measured(cl.gpu, [("cudnn", d, "causal", 128, s, round(0.5 * efficiency("cudnn", cl.gpu, 128, s, True, d), 6))
                              for d in ("fwd", "bwd") for s in (4096, 8192, 16384)])
    args = (m, False, wl, 1, 1, 1, False, 1)
    pub = layer_cost(*args, cl.gpu, cl, cl.groups[0].intra_node, lay, lay, lay, attention="te")
    meas = layer_cost(*args, slow, cl, cl.groups[0].intra_node, lay, lay, lay, attention="te")
    assert meas.attn_fwd_s == pytest.approx(2 * pub.attn_fwd_s, rel=1e-4)
    assert meas.gemm_fwd_s == pub.gemm_fwd_s
    assert gpu_from_dict(gpu_to_dict(slow), "gpu") == slow
    d = cluster_to_dict(cl)
    d["gpu"] = gpu_to_dict(slow)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    assert load_cluster(str(p)).gpu.attention_table == slow.attention_table
    assert cluster_from_dict(d, "c").gpu == slow


@pytest.mark.parametrize("row, says", [
    (["xformers", "fwd", "causal", 128, 4096, 0.3], "kernel must be one of fa1, fa2, fa3, fa4, cudnn, got 'xformers'"),
    (["fa2", "both", "causal", 128, 4096, 0.3], "direction must be one of fwd, bwd"),
    (["fa2", "fwd", "sliding", 128, 4096, 0.3], "mask must be one of causal, none"),
    (["fa2", "fwd", "causal", 128, 4096, 1.5], "'efficiency' must be at most 1, got 1.5"),
    (["fa2", "fwd", "causal", 0, 4096, 0.3], "'head_dim' must be > 0, got 0"),
    (["fa2", "fwd", "causal", 128, ".nan", 0.3], "'seq_len' must be a number"),
    (["fa2", "fwd", "causal", 128], "expected [kernel, direction, mask, head_dim, seq_len, efficiency]"),
])
def test_bad_attention_rows_are_refused_with_their_place(row, says):
    from costmodel.files.clusters import gpu_from_dict, gpu_to_dict
    from costmodel.specs import SpecError
    d = gpu_to_dict(H100)
    d["attention_table"] = [["fa2", "fwd", "causal", 128, 1024, 0.3], row]
    with pytest.raises(SpecError) as e:
        gpu_from_dict(d, "cluster.gpu")
    assert "cluster.gpu.attention_table[1]" in str(e.value) and says in str(e.value)


# cuDNN bf16 TFLOP/s, d = 128, 64 query / 8 KV heads, batch 2, same day, same cuDNN (9.26.0):
# NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/llama3.1/{gb300,gb200}/
# llama3.1_20260724_*.csv (mask, direction, sequence) -> (GB300, GB200)
_CUDNN_SAME_DAY = {("causal", "fwd", 2048): (1467, 1098), ("causal", "fwd", 8192): (1991, 1646),
                   ("causal", "fwd", 16384): (2065, 1728), ("causal", "bwd", 8192): (1448, 1344),
                   ("causal", "bwd", 16384): (1516, 1327), ("none", "fwd", 8192): (2161, 1758),
                   ("none", "bwd", 8192): (1549, 1458)}


def test_blackwell_ultra_attention_is_the_same_day_ratio_of_the_blackwell_curve():
    from costmodel.attention import ULTRA_OF_BLACKWELL
    g2, g3 = (load_cluster(c).groups[0].gpu for c in ("gb200-nvl72", "gb300-nvl72"))
    for kernel in ("cudnn", "fa4"):
        for d in ("fwd", "bwd"):
            for causal in (True, False):
                assert efficiency(kernel, g3, 128, 8192, causal, d) == pytest.approx(
                    ULTRA_OF_BLACKWELL[d] * efficiency(kernel, g2, 128, 8192, causal, d))
    # FA2 runs Hopper's code on both: no gain; B300 (DGX) is Blackwell Ultra too
    assert efficiency("fa2", g3, 128, 8192, True, "fb") == efficiency("fa2", g2, 128, 8192, True, "fb")
    b3 = load_cluster("dgx-b300").groups[0].gpu
    assert efficiency("cudnn", b3, 128, 8192, True, "fwd") > efficiency("cudnn", g2, 128, 8192, True, "fwd")
    # the factors are the medians of the same-day ratios, and the GB300 curve lands near the GB300 runs
    ratios = {d: sorted(a / b for (_, dd, _), (a, b) in _CUDNN_SAME_DAY.items() if dd == d) for d in ("fwd", "bwd")}
    for d, r in ratios.items():
        assert r[0] <= ULTRA_OF_BLACKWELL[d] <= r[-1]
    for (mask, d, s), (tf300, _) in _CUDNN_SAME_DAY.items():
        got = efficiency("cudnn", g3, 128, s, mask == "causal", d) * g3.peak("bf16") / 1e12
        assert got == pytest.approx(tf300, rel=0.1), (mask, d, s)


def test_grid_factor_counts_the_waves_by_hand():
    """8 heads of 1,024 queries on a 148-SM GB200: 64 thread blocks of 128 rows in one wave, 64/148 of
    the SMs busy, against the published curve's grid at 1,024 (16 sequences x 16 heads x 8 tiles =
    2,048 blocks, 14 waves of 148, the last partly idle)."""
    from costmodel.attention import block_s, grid_factor
    g = load_cluster("gb200-nvl72").groups[0].gpu
    assert grid_factor(g, 8, 128, 1024) == pytest.approx((64 / 148) / (2048 / (14 * 148)))
    # twice the heads: 128 blocks, still one wave
    assert grid_factor(g, 16, 128, 1024) == pytest.approx((128 / 148) / (2048 / (14 * 148)))
    # a training layer's usual grid (32 heads of 8k queries: 2,048 blocks) is the curve's own: no change
    assert grid_factor(g, 32, 128, 8192) == 1.0
    # not given, or a GPU without a known SM count: no factor
    assert grid_factor(g, 0, 128, 1024) == 1.0
    cpu = load_cluster("cpu").groups[0].gpu
    assert grid_factor(cpu, 8, 64, 256) == 1.0
    # the block's time is the curve's over the factor, both directions
    f0, b0 = block_s("cudnn", g, g.peak("bf16"), 1e12, 128, 1024, False)
    f1, b1 = block_s("cudnn", g, g.peak("bf16"), 1e12, 128, 1024, False, pairs=8)
    k = grid_factor(g, 8, 128, 1024)
    assert (f1, b1) == (pytest.approx(f0 / k), pytest.approx(b0 / k))


def test_the_layer_prices_its_attention_grid():
    """Llama-3 8B at 8k on GB200 with TP 4 and CP 4 (8 heads per rank; blocks of 2,048 and 1,024
    queries): the layer's attention takes longer than the same work on the curve alone, by the grid
    factors of its ring's blocks; without CP, 32 heads of 8k queries (2,048 blocks) take no longer."""
    from costmodel.attention import attention_fwd_bwd_s, grid_factor
    g = load_cluster("gb200-nvl72").groups[0].gpu
    flops = 1e12
    plain = attention_fwd_bwd_s("cudnn", g, g.peak("bf16"), flops, 128, 8192, 4)
    tp4 = attention_fwd_bwd_s("cudnn", g, g.peak("bf16"), flops, 128, 8192, 4, 8)
    assert attention_fwd_bwd_s("cudnn", g, g.peak("bf16"), flops, 128, 8192, 1, 32) == \
        attention_fwd_bwd_s("cudnn", g, g.peak("bf16"), flops, 128, 8192, 1)
    assert grid_factor(g, 8, 128, 2048) < 1 and grid_factor(g, 8, 128, 1024) < 1
    assert tp4[0] > plain[0] and tp4[1] > plain[1]
    assert tp4[0] <= plain[0] / grid_factor(g, 8, 128, 1024) + 1e-15


def _h200_measured():
    """The GPU of the H200's measured profile (the device check's cluster file)."""
    from planner.cli.device_results import H200
    return load_cluster(str(H200 / "cluster.yaml")).groups[0].gpu


def test_fa2_hopper_curve_is_the_h200_measurement():
    """FlashAttention-2's Hopper curves were fitted to the H200's measured table (the project's device
    check, bench/results/device-h200/cluster.yaml): every measured point, each direction and mask, head
    dims 64 and 128, within 6% of the curve the catalog prices an H100 and an H200 with; and the
    backward is slower than the forward, which the published plot's one figure for both hid."""
    catalog = load_cluster("dgx-h200").groups[0].gpu
    points = [r for r in _h200_measured().attention_table if r[0] == "fa2"]
    assert len(points) == 48
    for _, direction, mask, hd, seq, eff in points:
        for gpu in (catalog, H100):
            got = efficiency("fa2", gpu, hd, seq, mask == "causal", direction)
            assert abs(got / eff - 1) < 0.06, (direction, mask, hd, seq, got, eff)
    for s in (1024, 4096, 16384):
        assert efficiency("fa2", H100, 128, s, True, "bwd") < efficiency("fa2", H100, 128, s, True, "fwd")


def test_fa2_hopper_constants_are_the_fit_of_the_h200_table(bench_module):
    """The catalog's FlashAttention-2 Hopper numbers are what bench/fit_attention_curves.py derives from
    the H200's table (eta_max at head dims 64 and 128 to the printed 3 decimals, s0 exactly; head dim
    256 clamped to 128's value), so the curve can be re-derived from the measurement."""
    from costmodel.attention import _CURVES
    fitted = bench_module("fit_attention_curves").fit_table(_h200_measured().attention_table, "fa2")
    table = _CURVES[("fa2", "hopper")]
    assert set(fitted) == {(d, m) for d in table for m in table[d]}
    for (direction, mask), (worst, s0, etas) in fitted.items():
        points, s0_cat = table[direction][mask]
        assert s0_cat == s0 and worst < 0.06
        assert points == (round(etas[64], 3), round(etas[128], 3), round(etas[128], 3))


def test_fa1_constants_are_the_fit_of_its_published_speeds(bench_module):
    """FlashAttention 1's curves are bench/fit_attention_curves.py's fit of the FlashAttention-2 paper's
    published FA1 bars (A100 and H100, forward + backward, head dims 64 and 128): s0 exactly, eta_max
    to 3 decimals, head dim 256 at 128's; every published point within 11% of the curve; and FA1 is
    well under FA2 on both GPUs (FA2 on Hopper as the H200 measured it)."""
    from costmodel.attention import _CURVES
    mod = bench_module("fit_attention_curves")
    for (arch, mask), (worst, s0, etas) in mod.fit_published("fa1").items():
        points, s0_cat = _CURVES[("fa1", arch)]["fb"][mask]
        assert s0_cat == s0 and worst < 0.11
        assert points == (round(etas[64], 3), round(etas[128], 3), round(etas[128], 3))
        gpu = {"ampere": A100, "hopper": H100}[arch]
        for hd, tflops in mod.PUBLISHED["fa1"][arch][mask].items():
            for seq, t in zip(mod.PUBLISHED_SEQS, tflops):
                got = efficiency("fa1", gpu, hd, seq, mask == "causal", "fb")
                assert abs(got * mod.PUBLISHED_PEAK[arch] / t - 1) < 0.11, (arch, mask, hd, seq)
    assert _CURVES[("fa1", "blackwell")] is _CURVES[("fa1", "hopper")]
    for s in (1024, 4096, 16384):
        assert efficiency("fa1", A100, 128, s, True, "fb") < 0.6 * efficiency("fa2", A100, 128, s, True, "fb")
        assert efficiency("fa1", H100, 128, s, True, "fb") < 0.65 * efficiency("fa2", H100, 128, s, True, "fb")


def test_flash_attn_1_is_the_fa1_kernel_everywhere():
    """A published run that ran the flash-attn 1.x package (TE 0.8's DotProductAttention) names
    "flash-attn-1": FA1 on every GPU, and a layer priced with it is slower than with FA2."""
    assert [kernel_for("flash-attn-1", g) for g in (A100, H100, B200)] == ["fa1", "fa1", "fa1"]
    args = _h100_llama8b_layer_args(8192)
    fa1 = layer_cost(*args, attention="flash-attn-1")
    fa2 = layer_cost(*args, attention="flash-attn")
    assert fa1.attn_fwd_s > 1.8 * fa2.attn_fwd_s and fa1.gemm_fwd_s == fa2.gemm_fwd_s


def test_transformer_engine_ring_merges_by_hand():
    """Transformer Engine's ring (AttnFuncWithCPAndKVP2P, TE v1.9; v2.4 alike) on its busiest rank, BF16:
    forward, the K/V concatenation (8 bytes per K/V value), the output zeroed (2 per output value) and one fused
    correction per step (6); backward, the K/V copy (8), and per step dQ added (6) and dK/dV added into the
    ring's buffer (12), plus their concatenation after cuDNN's fused kernel (8). Nothing without CP; PyTorch's
    ring moves more."""
    from costmodel.attention import library_ring, ring_merge_bytes
    T, qw, kvw, cp = 2048.0, 2048.0, 512.0, 4
    q, kv = T * qw, T * kvw
    assert ring_merge_bytes("te", T, qw, kvw, 1) == (0.0, 0.0)
    assert ring_merge_bytes("te", T, qw, kvw, cp) == (8 * kv + 2 * q + 4 * 6 * q, 8 * kv + 4 * (6 * q + 12 * kv))
    assert ring_merge_bytes("te", T, qw, kvw, cp, fused=True)[1] == 8 * kv + 4 * (6 * q + 20 * kv)
    torch_f, torch_b = ring_merge_bytes("sdpa", T, qw, kvw, cp)
    te_f, te_b = ring_merge_bytes("te", T, qw, kvw, cp, fused=True)
    assert te_f < torch_f and te_b < torch_b
    assert library_ring("te", 2) and not library_ring("te", 1) and not library_ring("sdpa", 2)


def test_a_transformer_engine_cp_layer_pays_its_merges():
    """Llama 3.1 8B at 8,192 tokens, TP 2, CP 4 on a DGX H100 under Megatron (TE on cuDNN): the layer's
    attention forward is the kernel's ring time plus the merges' bytes at the eager fraction of HBM."""
    from costmodel.attention import attention_fwd_bwd_s, ring_merge_bytes
    from costmodel.compute import MEMORY_BOUND_FRACTION, memory_time_s
    s, cp, tp = 8192, 4, 2
    m, cl, args = _cp_layer_args("llama-3.1-8b", 8, 1, s, cp, tp, 1)
    lc = layer_cost(*args, attention="te")
    T = s / cp
    qw, kvw = m.heads * m.head_dim / tp, m.kv_heads * m.head_dim / tp
    flops = 4 * T * s * (m.heads * m.head_dim / tp) / 2
    pairs = m.heads / tp
    f0, _b0 = attention_fwd_bwd_s("cudnn", cl.gpu, cl.gpu.peak("bf16"), flops, m.head_dim, s, cp, pairs)
    mf, _mb = ring_merge_bytes("te", T, qw, kvw, cp, fused=True)
    want = f0 + memory_time_s(cl.gpu, mf) / MEMORY_BOUND_FRACTION["eager"][0]
    assert lc.attn_fwd_s == pytest.approx(want, rel=1e-9)


def test_fp8_attention_is_the_measured_ratio_over_bf16():
    """cuDNN's FP8 attention (Transformer Engine's FP8 dot-product attention) runs at cudnn-frontend's measured
    FP8 / BF16 ratio: at a measured point exactly, interpolated between, and not at all where no FP8 kernel was
    measured (Ampere)."""
    from costmodel.attention import FP8_ATTENTION_OF_BF16, FP8_ATTENTION_SEQS, fp8_attention_factor, fp8_kernel
    gb200 = load_cluster("gb200-nvl72").gpu
    gb300 = load_cluster("gb300-nvl72").gpu
    # GB200, DeepSeek-V3's head dim 192, MXFP8, causal, at 4,096: cudnn-frontend's dsv3 CSV (2026-04-24) gives
    # 1.369 forward and 1.290 backward
    assert fp8_attention_factor(gb200, "mxfp8", 192, 4096, True, "fwd") == 1.369
    assert fp8_attention_factor(gb200, "mxfp8", 192, 4096, True, "bwd") == 1.290
    # between measured sequences and head dims: between the neighbours
    mid = fp8_attention_factor(gb200, "fp8", 160, 6000, False, "bwd")
    lo = min(FP8_ATTENTION_OF_BF16[("blackwell", "fp8", hd, False, "bwd")][i] for hd in (128, 192) for i in (1, 2))
    hi = max(FP8_ATTENTION_OF_BF16[("blackwell", "fp8", hd, False, "bwd")][i] for hd in (128, 192) for i in (1, 2))
    assert lo < mid < hi
    # GB300 has its own table (its BF16 kernel is already faster); Hopper per-tensor only; Ampere none
    assert fp8_attention_factor(gb300, "mxfp8", 192, 4096, True, "fwd") == 1.583
    assert fp8_attention_factor(H100, "fp8", 128, FP8_ATTENTION_SEQS[-1], True, "bwd") == 0.637    # slower
    assert fp8_attention_factor(H100, "mxfp8", 128, 4096, True, "fwd") == 1.0
    assert fp8_attention_factor(A100, "fp8", 128, 4096, True, "fwd") == 1.0
    # the FP8 block is the BF16 block divided by the ratio, per direction; only cuDNN has an FP8 variant
    f, b = block_s("cudnn", gb200, 2.5e15, 1e12, 192, 4096, True)
    f8, b8 = block_s(fp8_kernel("cudnn", "mxfp8"), gb200, 2.5e15, 1e12, 192, 4096, True)
    assert (f / f8, b / b8) == pytest.approx((1.369, 1.290), rel=1e-12)
    assert fp8_kernel("fa2", "fp8") == "fa2"


def test_fp8_attention_reaches_the_layer_only_under_fp8():
    from costmodel import fp8 as fp8m
    m = get_model("deepseek-v3")
    cl = load_cluster("gb200-nvl72").with_gpus(8)
    g = cl.groups[0]
    one = group_layout({"tp": 1, "cp": 1, "dp": 8, "pp": 1}, ("tp", "cp", "dp", "pp"), "tp", 8)
    rec = fp8m.resolve("mxfp8", "megatron", g.gpu)
    wl8 = Workload(global_batch=8, seq_len=4096, dtype="fp8")

    def lc(wl, recipe, on):
        return layer_cost(m, False, wl, 1, 1, 1, False, 1, g.gpu, cl, g.intra_node, one, one, one, 1.0, recipe,
                          attention="te", fp8_attention=on)
    plain, fast = lc(wl8, rec, False), lc(wl8, rec, True)
    assert fast.attn_fwd_s == pytest.approx(plain.attn_fwd_s / 1.369, rel=1e-9)
    assert fast.fwd_s < plain.fwd_s and fast.gemm_fwd_s == plain.gemm_fwd_s
    # a BF16 workload has no FP8 recipe: the switch prices nothing
    wl16 = Workload(global_batch=8, seq_len=4096, dtype="bf16")
    assert lc(wl16, None, True).fwd_s == lc(wl16, None, False).fwd_s


def _torch_flex_rounded_widths(qk: int, v: int) -> tuple[int, int]:
    """The widths FlexAttention's Triton template tiles, from PyTorch's own kernel options
    (``torch/_inductor/kernel/flex/common.py`` ``set_head_dim_values``)."""
    common = pytest.importorskip("torch._inductor.kernel.flex.common")

    class _Sizes:
        @staticmethod
        def guard_int(n: int) -> int:
            return int(n)

    opts: dict = {}
    common.set_head_dim_values(opts, qk, v, _Sizes())
    return opts["QK_HEAD_DIM_ROUNDED"], opts["V_HEAD_DIM_ROUNDED"]


@pytest.mark.parametrize("qk,v", [(192, 128), (128, 128), (96, 96), (80, 80), (256, 256), (64, 64)])
def test_flex_pads_the_head_widths_torch_tiles(qk, v):
    """FlexAttention's time scales by the padded over the model's tensor-core work: forward one
    GEMM of each width, backward three of the query/key width and two of the value width, with the
    widths PyTorch's template really tiles. Other kernels pad nothing."""
    from costmodel.attention import head_dim_padding
    pq, pv = _torch_flex_rounded_widths(qk, v)
    fwd, bwd = head_dim_padding("flex", qk, v)
    assert fwd == pytest.approx((pq + pv) / (qk + v))
    assert bwd == pytest.approx((3 * pq + 2 * pv) / (3 * qk + 2 * v))
    assert (fwd > 1) == (pq != qk or pv != v)
    for kernel in ("fa2", "fa3", "fa4", "cudnn"):
        assert head_dim_padding(kernel, qk, v) == (1.0, 1.0)


def test_deepseek_v3_layer_under_flex_pays_the_padded_query_width():
    """DeepSeek-V3's MLA (query/key 192, value 128) under FlexAttention: the attention core is
    1.2x forward and 1.23x backward the same layer's unpadded price; under cuDNN it is not padded;
    Llama's 128-wide heads are not padded either."""
    from costmodel.attention import attention_fwd_bwd_s
    m = get_model("deepseek-v3")
    assert (m.qk_head_width, m.v_head_width) == (192, 128)
    cl = load_cluster("dgx-b200").with_gpus(8)
    wl = Workload(global_batch=8, seq_len=4096)
    lay = group_layout({"tp": 1, "cp": 1, "dp": 8, "pp": 1}, ("tp", "cp", "dp", "pp"), "tp", 8)
    args = (m, False, wl, 1, 1, 1, False, 1, cl.gpu, cl, cl.groups[0].intra_node, lay, lay, lay)
    flex = layer_cost(*args, attention="flex")
    flops = 4 * 4096 * 4096 * m.score_dim * 0.5          # one sequence, causal: the layer's count
    f, b = attention_fwd_bwd_s("flex", cl.gpu, cl.gpu.attention_rate("bf16"), flops, m.head_dim, 4096, 1,
                               m.heads)
    assert flex.attn_fwd_s == pytest.approx(f * 1.2)
    # the backward beyond twice the forward, at the layer's straggler factor over 8 GPUs
    from costmodel.scale import straggler_factor
    assert flex.attn_bwd_extra_s == pytest.approx((b * 1024 / 832 - 2 * f * 1.2) * straggler_factor(8))
    cudnn = layer_cost(*args, attention="te")
    cf, _ = attention_fwd_bwd_s("cudnn", cl.gpu, cl.gpu.attention_rate("bf16"), flops, m.head_dim, 4096, 1, m.heads)
    assert cudnn.attn_fwd_s == pytest.approx(cf)
    llama = get_model("llama-3.1-8b")
    assert (llama.qk_head_width, llama.v_head_width) == (128, 128)
