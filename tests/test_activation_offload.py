"""Megatron-Core's fine-grained activation offloading of the routed experts (``--offload-modules expert_fc1
moe_act``; ``ParallelConfig.offload_modules``, ``costmodel.layers.offload_bytes``,
``costmodel.stage_terms.offload_terms``): what leaves the GPU, counted by hand from the layer's shapes, what the
host link's time adds, and what is refused with what to plan."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.layers import layer_cost
from costmodel.comm import group_layout
from costmodel.specs import ParallelConfig, SpecError, Workload, default_stages
from costmodel.stage_terms import offload_terms
from costmodel.training import estimate
from planner.plan import targets as T

ROOT = Path(__file__).resolve().parent.parent
PLANNER = str(Path(sys.executable).with_name("planner"))
SEQ = 4096


def _profile(ep_overlap: bool = False):
    meg = T.profile_for("megatron", {})
    return dataclasses.replace(meg, ep_comm_overlap=ep_overlap, moe=dataclasses.replace(meg.moe, forced_balance=True))


def _est(offload: tuple[str, ...], cluster: str = "dgx-h100", ep_overlap: bool = False, model: str = "qwen3-30b-a3b"):
    m = get_model(model)
    p = ParallelConfig(dp=8, ep=8, zero=1, micro_batch=1, grad_accum=1, offload_modules=offload)
    return estimate(m, load_cluster(cluster).with_gpus(8), Workload(global_batch=8, seq_len=SEQ), p,
                    stages=default_stages(m.layers, 1), framework=_profile(ep_overlap))


def _act(e) -> float:
    return e.stages[0].memory["activations_bytes"]


def test_the_gpu_drops_the_routed_copies_fc1_inputs_and_outputs():
    m = get_model("qwen3-30b-a3b")
    none, both = _est(()), _est(("expert_fc1", "moe_act"))
    copies = SEQ * m.top_k                               # routed token copies per micro-batch (EP 8, balanced)
    fc1_in = copies * m.hidden * 2                       # BF16 FC1 input
    fc1_out = copies * 2 * m.expert_ffn_hidden * 2       # SwiGLU: gate and up, BF16
    # every layer's, less one layer's groups Megatron-Core keeps on the GPU
    assert _act(none) - _act(both) == pytest.approx((m.layers - 1) * (fc1_in + fc1_out), rel=1e-9)
    assert _act(none) - _act(_est(("moe_act",))) == pytest.approx((m.layers - 1) * fc1_out, rel=1e-9)


def _layer(cluster: str):
    m = get_model("qwen3-30b-a3b")
    cl = load_cluster(cluster).with_gpus(8)
    one = group_layout({"tp": 1}, ("tp",), "tp", 8)
    ep = group_layout({"ep": 8}, ("ep",), "ep", 8)
    return layer_cost(m, True, Workload(global_batch=8, seq_len=SEQ), 1, 1, 8, False, 1, cl.gpu, cl,
                      cl.groups[0].intra_node, one, ep, one), cl.gpu.host_link_bytes_per_s


def test_the_link_time_by_hand():
    lc, bw = _layer("dgx-h100")
    fc1, act = (o[2] / bw for o in lc.offload)
    # copies to the host longer than a layer's forward and backward fall behind; FC1's reload waits right
    # before its backward; the activation's reload overlaps the backward between two layers' groups
    window = 2 * (lc.fwd_s - lc.expert_gemm_fwd_s)
    by_hand = max(0.0, fc1 + act - 3 * lc.fwd_s) + fc1 + max(0.0, act - window)
    assert offload_terms(lc, ("expert_fc1", "moe_act"), bw)[1] == pytest.approx(by_hand, rel=1e-12)
    # under the EP overlap another micro-batch's forward runs beside the reloads
    assert offload_terms(lc, ("expert_fc1", "moe_act"), bw, True)[1] == pytest.approx(
        max(0.0, fc1 + act - 3 * lc.fwd_s) + max(0.0, fc1 + max(0.0, act - window) - lc.fwd_s), rel=1e-12)
    # nothing asked, nothing moved
    assert offload_terms(lc, (), bw) == (0.0, 0.0)


def test_a_faster_link_costs_less_and_the_overlap_hides_more():
    pcie, c2c = _est(("expert_fc1", "moe_act")), _est(("expert_fc1", "moe_act"), cluster="gb200-nvl72")
    base_pcie, base_c2c = _est(()), _est((), cluster="gb200-nvl72")
    slow = pcie.step_time_s / base_pcie.step_time_s
    fast = c2c.step_time_s / base_c2c.step_time_s
    assert slow > fast >= 1.0 and slow > 1.01
    over = _est(("expert_fc1", "moe_act"), ep_overlap=True)
    assert over.step_time_s / _est((), ep_overlap=True).step_time_s < slow


def test_nvidias_qwen3_layout_fits_gb200_only_with_it():
    m = get_model("qwen3-235b-a22b")
    cl = load_cluster("gb200-nvl72").with_gpus(256)
    wl = Workload(global_batch=3072, seq_len=SEQ, dtype="fp8", fp8_recipe="mxfp8")
    prof = dataclasses.replace(_profile(True), moe=dataclasses.replace(_profile(True).moe, dispatcher="hybridep"))
    out = {}
    for off in ((), ("expert_fc1", "moe_act")):
        p = ParallelConfig(tp=1, pp=4, vpp=6, dp=64, ep=64, etp=1, micro_batch=3, grad_accum=16, zero=1,
                           schedule="interleaved", recompute="selective", recompute_modules=("moe_act", "layernorm"),
                           offload_modules=off)
        out[off] = estimate(m, cl, wl, p, framework=prof)
    assert not out[()].fits and out[("expert_fc1", "moe_act")].fits
    assert out[("expert_fc1", "moe_act")].step_time_s == pytest.approx(out[()].step_time_s, rel=1e-9)


def test_what_is_refused():
    with pytest.raises(SpecError, match="does not price it"):
        ParallelConfig(offload_modules=["core_attn"])
    with pytest.raises(SpecError, match="not a module Megatron-Core offloads"):
        ParallelConfig(offload_modules=["everything"])
    m = get_model("llama-3-8b")
    with pytest.raises(SpecError, match="has no experts"):
        estimate(m, load_cluster("dgx-h100").with_gpus(8), Workload(global_batch=8, seq_len=SEQ),
                 ParallelConfig(dp=8, offload_modules=("moe_act",)))
    with pytest.raises(SpecError, match="no host-link speed for A100"):
        estimate(get_model("qwen3-30b-a3b"), load_cluster("dgx-a100-80gb").with_gpus(8),
                 Workload(global_batch=8, seq_len=SEQ), ParallelConfig(dp=8, ep=8, offload_modules=("moe_act",)))
    qwen, wl = get_model("qwen3-30b-a3b"), Workload(global_batch=8, seq_len=SEQ)
    par = ParallelConfig(dp=8, ep=8, offload_modules=("expert_fc1",))
    assert any("Megatron target's" in p for p in T.config_problems("torchtitan", qwen, wl, par))
    assert not T.config_problems("megatron", qwen, wl, par)
    whole = dataclasses.replace(par, recompute="selective", recompute_modules=("moe",))
    assert any("recomputes whole" in p for p in T.config_problems("megatron", qwen, wl, whole))
    fused = T.fused_mlp_problem("megatron", qwen, dataclasses.replace(wl, dtype="fp8", fp8_recipe="mxfp8"),
                                load_cluster("dgx-b200").gpu, par)
    assert "unfused" in fused


def test_the_flag_and_the_json():
    base = ["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "4096", "--ep", "8", "--target", "megatron", "--json"]
    out = subprocess.run([PLANNER, *base, "--offload-modules", "moe_act,expert_fc1"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["parallel"]["offload_modules"] == ["expert_fc1", "moe_act"]
    bad = subprocess.run([PLANNER, *base, "--offload-modules", "qkv_linear"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert bad.returncode == 2 and "does not price it" in bad.stderr and "Traceback" not in bad.stderr
