"""Rules of the session-21 dense refit (issue 23): a run's torch.compile priced as its file would,
PyTorch-native stacks on sm_90+ (``frameworks.kernel_efficiency_on``), and the FP8 pair held to
Transformer Engine's measured GEMM speed-up (``fp8.gemm_speedup_admissible``)."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel import fp8, frameworks
from costmodel.catalog import get_model
from costmodel.compute import fp8_gemm_time_s, gemm_time_s
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import COMPILE_KERNEL_FACTOR, FRAMEWORKS, kernel_efficiency_on
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate
from emitters.recipe import PRICED_TAG, priced_assumptions
from planner.cli import validation
from test_emit_support import make_plan


# -- compile: read from the record -----------------------------------------------------------------

def test_compile_read_from_the_record():
    assert validation.ran_compile({"compile": True})
    assert validation.ran_compile({"compile": "regional torch.compile (inductor)"})
    assert not validation.ran_compile({"compile": False})
    assert not validation.ran_compile({"compile": "not stated (the 405B toml at ...)"})
    assert not validation.ran_compile({"fsdp": "FSDP2 1D"})
    assert validation.ran_compile("FSDP2 with torch.compile")
    assert not validation.ran_compile(None)


def test_every_compiled_case_is_priced_with_compile_and_no_other():
    """A case whose record says ``compile: true`` gets the compile switch (its kernel efficiency
    x COMPILE_KERNEL_FACTOR over its framework's), and a case that says false does not."""
    seen = {True: 0, False: 0}
    for case, _split in validation.all_cases(include_holdout=True):
        ex = case.get("execution")
        if not isinstance(ex, dict) or not isinstance(ex.get("compile"), bool):
            continue
        prof = validation.case_inputs(case)[4]
        base = FRAMEWORKS.get(validation.framework_of(case), FRAMEWORKS["generic"])
        want = base.kernel_efficiency * (COMPILE_KERNEL_FACTOR if ex["compile"] else 1.0)
        assert prof.kernel_efficiency == pytest.approx(want), case["name"]
        seen[ex["compile"]] += 1
    assert seen[True] and seen[False]


def test_cross_fit_keeps_the_compile_switch_over_a_refitted_efficiency():
    from planner.cli import validation_cross as vc
    cases, _ = vc.load_cases()
    values = vc.shipped_values()
    values["framework.torchtitan.kernel_efficiency"] = 0.5
    compiled = [c for c in cases if c.framework == "torchtitan" and "compile" in c.inputs[4].name.split("+")[1:]]
    plain = [c for c in cases if c.framework == "torchtitan" and "+compile" not in c.inputs[4].name]
    assert compiled and plain
    assert vc._specs(compiled[0], values)[4].kernel_efficiency == pytest.approx(0.5 * COMPILE_KERNEL_FACTOR)
    assert vc._specs(plain[0], values)[4].kernel_efficiency == pytest.approx(0.5)


# -- PyTorch-native stacks on sm_90+ ----------------------------------------------------------------

def test_sm90_factor_by_hand():
    tt = FRAMEWORKS["torchtitan"]
    assert tt.pytorch_native and not FRAMEWORKS["megatron"].pytorch_native and not FRAMEWORKS["generic"].pytorch_native
    f = frameworks.PYTORCH_SM90_FACTOR
    assert 0 < f < 1          # the fit says so; a value of 1 would be the prior
    assert kernel_efficiency_on(tt, "H100-SXM5-80GB") == pytest.approx(tt.kernel_efficiency * f)
    assert kernel_efficiency_on(tt, "B200") == pytest.approx(tt.kernel_efficiency * f)
    assert kernel_efficiency_on(tt, "A100-SXM4-80GB") == tt.kernel_efficiency
    assert kernel_efficiency_on(FRAMEWORKS["megatron"], "H100-SXM5-80GB") == 1.0


def test_sm90_factor_slows_exactly_the_pytorch_native_stack_on_hopper():
    """Same plan, same profile but ``pytorch_native``: slower on H100 (its GEMM and attention time
    divided by the factor), identical on A100."""
    m = get_model("llama-3-8b")
    par = ParallelConfig(dp=8, zero=3, micro_batch=1, grad_accum=1)
    wl = Workload(global_batch=8, seq_len=4096)
    base = dataclasses.replace(FRAMEWORKS["torchtitan"], pytorch_native=False)
    native = FRAMEWORKS["torchtitan"]
    h100 = load_cluster("dgx-h100").with_gpus(8)
    a100 = load_cluster("dgx-a100-80gb").with_gpus(8)
    assert estimate(m, h100, wl, par, framework=native).step_time_s > estimate(m, h100, wl, par, framework=base).step_time_s
    assert estimate(m, a100, wl, par, framework=native).step_time_s == estimate(m, a100, wl, par, framework=base).step_time_s
    # the same price as a non-native profile carrying the product by hand (one rule, no other path)
    by_hand = dataclasses.replace(base, kernel_efficiency=native.kernel_efficiency * frameworks.PYTORCH_SM90_FACTOR)
    assert estimate(m, h100, wl, par, framework=native).step_time_s == pytest.approx(
        estimate(m, h100, wl, par, framework=by_hand).step_time_s, rel=1e-12)


def test_generic_pytorch_fsdp_runs_are_marked_native():
    marked = {c["name"] for c, _ in validation.all_cases() if validation.case_inputs(c)[4].pytorch_native}
    assert any(n.startswith("ibm-fsdp") for n in marked) and any(n.startswith("olmo-core") for n in marked)
    assert not any(n.startswith(("llama3-", "bloomberggpt", "fa-gpt3", "mlperf", "nemo")) for n in marked)


def test_launch_file_states_the_efficiency_it_was_priced_with():
    """The priced-assumptions line writes the kernel efficiency on the plan's GPU (the factor
    included), so a reader rebuilding the profile from the line prices the same plan."""
    plan = make_plan("llama-3-8b", gpus=8, gb=8, seq=4096, cluster="dgx-h100", dp=8, zero=3)
    line = priced_assumptions(plan, "torchtitan")[0]
    assert line.startswith(PRICED_TAG)
    kv = dict(w.split("=", 1) for w in line[len(PRICED_TAG):].split())
    assert float(kv["kernel_efficiency"]) == kernel_efficiency_on(FRAMEWORKS["torchtitan"], plan.cluster.gpu.name)


# -- FP8 pair inside TE's measured GEMM speed-up -------------------------------------------------------

def test_layer_speedup_against_the_slow_obvious_gemm_times():
    """``layer_gemm_speedup`` against timing the TE layer's four GEMMs with the cost model's own
    GEMM functions on the H100 curve (the fast closed form vs the slow obvious version)."""
    cl = load_cluster("dgx-h100").with_gpus(8)
    gpu = cl.groups[0].gpu
    bf16 = sum(gemm_time_s(gpu, cl, "bf16", m, n, k, train=True) for m, n, k in fp8.TE_LAYER_GEMMS)
    f8 = sum(fp8_gemm_time_s(gpu, cl, m, n, k) for m, n, k in fp8.TE_LAYER_GEMMS)
    ratio = gpu.peak("fp8") / gpu.peak("bf16")
    assert bf16 / f8 == pytest.approx(fp8.layer_gemm_speedup(fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR,
                                                              gpu.matmul_half_size, ratio), rel=1e-9)


def test_shipped_fp8_pair_gives_the_measured_speed_up_and_the_old_ones_did_not():
    h = load_cluster("dgx-h100").groups[0].gpu.matmul_half_size
    assert fp8.gemm_speedup_admissible(fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR, h)
    for eff, k in ((0.88, 6.0), (0.74, 2.0), (1.00, 12.0)):     # session 20's shipped, all-in, grid-edge pairs
        assert not fp8.gemm_speedup_admissible(eff, k, h)


def test_cross_fit_scans_only_admissible_fp8_pairs():
    from planner.cli import validation_cross as vc
    cases, _ = vc.load_cases()
    for leave_out in (None, "nemo-24", "mlperf"):
        v = vc.fit(cases, leave_out).values
        assert fp8.gemm_speedup_admissible(v["fp8.gemm_efficiency"], v["fp8.half_size_factor"],
                                           v["gpu.H100.matmul_half_size"]), leave_out
