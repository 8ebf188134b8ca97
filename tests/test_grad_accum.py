"""An unfused weight-gradient accumulation (Megatron-LM's --no-gradient-accumulation-fusion:
``FrameworkProfile.grad_accum_fusion`` False): every micro-batch each parameter's fresh gradient is read
and added into the gradient buffer, a memory-bound pass the fused GEMM epilogue does not make. Checked
against the bytes counted by hand, stage by stage, and on the published rows that ran it."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.compute import memory_bound_factor
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import framework_profile
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate


def _pair(model, cluster, wl, par):
    fused = framework_profile("megatron")
    unfused = dataclasses.replace(fused, grad_accum_fusion=False)
    return estimate(model, cluster, wl, par, framework=fused), estimate(model, cluster, wl, par, framework=unfused), fused


def test_one_stage_adds_every_parameter_every_micro_batch():
    m = get_model("llama-3.1-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, dp=8, zero=1, micro_batch=2, grad_accum=4, recompute="full")
    a, b, prof = _pair(m, cl, wl, par)
    # the layers, the embedding and the (untied) head: every parameter but the final norm
    params = m.total_params() - m.hidden
    hbm = cl.gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor(prof.elementwise, backward=False)
    by_hand = 4 * params * (2 + 2 * 4) / hbm               # 4 micro-batches; bf16 gradient, fp32 buffer
    assert b.step_time_s - a.step_time_s == pytest.approx(by_hand, rel=2e-3)
    assert b.time["compute_s"] - a.time["compute_s"] == pytest.approx(by_hand, rel=2e-3)


def test_pipeline_stages_hold_their_own_parameters():
    """With 4 stages the pass is per stage: the slowest stage's share, m times; the first stage
    carries the embedding and the last the head, so the step grows by about a quarter of the
    one-stage pass over the model (more, for the end stages' extra parameters)."""
    m = get_model("llama-3.1-8b")
    cl = load_cluster("dgx-h100").with_gpus(32)
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=1, pp=4, dp=8, zero=1, micro_batch=1, grad_accum=8, recompute="full")
    a, b, prof = _pair(m, cl, wl, par)
    hbm = cl.gpu.hbm_bandwidth_bytes_per_s / memory_bound_factor(prof.elementwise, backward=False)
    layer = (m.total_params() - 2 * m.vocab * m.hidden - m.hidden) / m.layers
    end_stage = (8 * layer + m.vocab * m.hidden) * 10 / hbm          # one micro-batch on an end stage
    grew = b.step_time_s - a.step_time_s
    assert 8 * end_stage <= grew <= 11 * end_stage                   # m = 8 plus the bubble's share


def test_rows_that_ran_unfused_say_where():
    """FP8-LM's Megatron runs and Megatron-LLaMA's pass --no-gradient-accumulation-fusion; no other record does."""
    from planner.cli import validation
    unfused = ("fp8lm-", "mllama-")
    rows = [c for c, _ in validation.all_cases() if c["name"].startswith(unfused)]
    assert len(rows) == 10
    for c in rows:
        assert c["profile"]["grad_accum_fusion"] is False
        assert any("--no-gradient-accumulation-fusion" in a for a in c["assumed"])
        m, cl, wl, par, prof, _ = validation.case_inputs(c)
        assert prof.grad_accum_fusion is False
    # every other record keeps the fusion (Megatron's default, and what the emitters leave on)
    others = [c for c, _ in validation.all_cases() if not c["name"].startswith(unfused)]
    assert all(c.get("profile", {}).get("grad_accum_fusion", True) for c in others)


def test_what_the_emitters_write_keeps_the_fusion_the_price_assumes():
    """Every shipped profile prices the fused accumulation (Megatron-LM's default), and no emitted launch file
    turns Megatron's fusion off (the golden files of every target, read as text)."""
    from pathlib import Path

    from costmodel.frameworks import FRAMEWORKS
    assert all(p.grad_accum_fusion for p in FRAMEWORKS.values())
    golden = Path(__file__).parent / "golden" / "emitters"
    files = [f for f in golden.rglob("*") if f.is_file()]
    assert any("megatron" in f.parts for f in files)
    assert not [f for f in files if "no-gradient-accumulation-fusion" in f.read_text(errors="ignore")]
