"""``GpuSpec.clock_factor``: a part's sustained compute rate against its datasheet peaks (GB300 against
GB200 at equal peaks, stop 46). It scales the time of compute-bound work (``GpuSpec.rate``: GEMMs,
attention), not the peaks MFU is counted on; a fitted constant with its record and prior; a lower bound
that prices FLOPs reads the rate too."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from costmodel import fitted
from costmodel.compute import fp8_gemm_time_s, gemm_time_s
from costmodel.catalog import get_model
from costmodel.files.clusters import gpu_to_dict, load_cluster
from costmodel.specs import ParallelConfig, SpecError, Workload
from costmodel.training import estimate
from planner.cli import validation
from planner.cli.validation_cross import shipped_values


def _with_factor(cluster, f):
    groups = tuple(dataclasses.replace(g, gpu=dataclasses.replace(g.gpu, clock_factor=f)) for g in cluster.groups)
    return dataclasses.replace(cluster, groups=groups)


def test_rate_is_the_peak_times_the_factor_and_gemms_run_at_it():
    gb300 = load_cluster("gb300-nvl72").groups[0].gpu
    assert gb300.clock_factor == pytest.approx(1.204)
    assert gb300.rate("bf16") == pytest.approx(gb300.peak("bf16") * 1.204)
    plain = dataclasses.replace(gb300, clock_factor=1.0)
    for m, n, k in ((8192, 8192, 8192), (4096, 2048, 7168), (512, 4096, 4096)):
        assert gemm_time_s(plain, None, "bf16", m, n, k) / gemm_time_s(gb300, None, "bf16", m, n, k) == \
            pytest.approx(1.204)
        assert fp8_gemm_time_s(plain, None, m, n, k) / fp8_gemm_time_s(gb300, None, m, n, k) == pytest.approx(1.204)


def test_compute_runs_faster_and_mfu_keeps_the_datasheet_peak():
    model = get_model("llama-3-8b")
    wl = Workload(global_batch=64, seq_len=8192, dtype="bf16")
    par = ParallelConfig(tp=1, pp=1, dp=8, zero=1, micro_batch=1, grad_accum=8)
    fast = load_cluster("gb300-nvl72").with_gpus(8)
    plain = _with_factor(fast, 1.0)
    a, b = estimate(model, fast, wl, par, framework="megatron"), estimate(model, plain, wl, par, framework="megatron")
    # GEMMs and attention scale, the memory-bound kernels do not: between the two
    assert 1.0 < b.time["compute_s"] / a.time["compute_s"] < 1.204
    assert a.step_time_s < b.step_time_s
    # MFU on the datasheet peak: model FLOPs / (step x peak) is the same count on both
    assert a.mfu * a.step_time_s == pytest.approx(b.mfu * b.step_time_s, rel=1e-9)


def test_a_cluster_file_carries_it_and_refuses_nonsense(tmp_path):
    d = {"extends": "gb200-nvl72", "description": "test", "gpu": {"name": "x", "clock_factor": 1.1}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    g = load_cluster(str(p)).groups[0].gpu
    assert g.clock_factor == pytest.approx(1.1)
    assert gpu_to_dict(g)["clock_factor"] == pytest.approx(1.1)
    assert "clock_factor" not in gpu_to_dict(load_cluster("gb200-nvl72").groups[0].gpu)
    for bad in (0, -1, 3):
        d["gpu"]["clock_factor"] = bad
        p.write_text(yaml.safe_dump(d))
        with pytest.raises(SpecError, match="clock_factor"):
            load_cluster(str(p))


def test_it_is_a_fitted_constant_with_a_prior_and_reproduces_its_pair():
    rec = {c.name: c for c in fitted.FITTED}["gpu.GB300.clock_factor"]
    assert rec.families == ("mlperf",) and rec.prior == 1.0 and not rec.grid
    assert shipped_values()["gpu.GB300.clock_factor"] == pytest.approx(1.204)
    # the value is the one at which the model's step ratio on the same-config 72-GPU pair is the published one
    cases = {c["name"]: c for c, _ in validation.all_cases()}
    a, b = "mlperf51-llama3.1-8b-gb200-72gpu-fp8", "mlperf51-llama3.1-8b-gb300-72gpu-fp8"
    pred = {r.case: r.predicted for n in (a, b) for r in validation.case_rows(cases[n], "more")}
    pub = cases[a]["reported"]["step_time_s"] / cases[b]["reported"]["step_time_s"]
    assert pred[a] / pred[b] == pytest.approx(pub, rel=0.005)


def test_the_flop_bound_reads_the_rate():
    """``replan.flop_bound`` must stay below any plan's step on a part faster than its peaks say."""
    from planner.search.problem import Solution
    from planner.search.replan import flop_bound
    from planner.search.space import enumerate_candidates
    model = get_model("llama-3-8b")
    wl = Workload(global_batch=64, seq_len=4096, dtype="bf16")
    cluster = load_cluster("gb300-nvl72").with_gpus(8)
    checked = 0
    for cand in enumerate_candidates(model, cluster, wl, {}, 8)[:20]:
        est = estimate(model, cluster, wl, cand.par, order=cand.order)
        if not est.fits:
            continue
        sol = Solution(cand=cand, objective=est.step_time_s, stages=(), estimate=est)
        assert flop_bound(sol, cluster, wl, 8) <= est.step_time_s
        # the FLOPs at the part's rate: the bound on the same part without its factor is 1.204 times longer
        assert flop_bound(sol, _with_factor(cluster, 1.0), wl, 8) == pytest.approx(
            1.204 * flop_bound(sol, cluster, wl, 8), rel=1e-9)
        checked += 1
    assert checked


def test_a_measured_table_holds_the_clock_and_is_not_scaled_again():
    """A measured GEMM table (fractions of the datasheet peak) or measured attention rows already hold the
    part's sustained clock: the factor does not multiply them again."""
    gb300 = load_cluster("gb300-nvl72")
    measured = dataclasses.replace(gb300, matmul_table=((256.0, 0.30), (1024.0, 0.55), (4096.0, 0.70)))
    plain = _with_factor(measured, 1.0)
    g_fast, g_plain = measured.groups[0].gpu, plain.groups[0].gpu
    for m, n, k in ((8192, 8192, 8192), (1024, 4096, 4096)):
        assert gemm_time_s(g_fast, measured, "bf16", m, n, k) == pytest.approx(gemm_time_s(g_plain, plain, "bf16", m, n, k))
        assert fp8_gemm_time_s(g_fast, measured, m, n, k) == pytest.approx(fp8_gemm_time_s(g_plain, plain, m, n, k))
    rows = dataclasses.replace(g_fast, attention_table=(("cudnn", "fwd", "causal", 128.0, 4096.0, 0.5),))
    assert rows.attention_rate("bf16") == rows.peak("bf16")
    assert g_fast.attention_rate("bf16") == pytest.approx(1.204 * g_fast.peak("bf16"))


def test_the_flop_bound_holds_under_a_measured_table_too():
    """Under a measured GEMM table the GEMMs price at the peak and attention (no measured rows) at the rate:
    the bound takes the rate, the faster of the two, and stays below every plan's step."""
    from planner.search.problem import Solution
    from planner.search.replan import flop_bound
    from planner.search.space import enumerate_candidates
    model = get_model("llama-3-8b")
    wl = Workload(global_batch=64, seq_len=8192, dtype="bf16")
    cluster = dataclasses.replace(load_cluster("gb300-nvl72").with_gpus(8),
                                  matmul_table=((256.0, 0.40), (1024.0, 0.80), (4096.0, 0.95)))
    checked = 0
    for cand in enumerate_candidates(model, cluster, wl, {}, 8)[:20]:
        est = estimate(model, cluster, wl, cand.par, order=cand.order)
        if est.fits:
            sol = Solution(cand=cand, objective=est.step_time_s, stages=(), estimate=est)
            assert flop_bound(sol, cluster, wl, 8) <= est.step_time_s
            checked += 1
    assert checked
