"""bench/device_curves.py, the device check's component measurements, run on this CPU at small
sizes (no FP8, no CUDA graphs, no compile here): every row measured and shaped as documented, and
the model's figures printed beside them are the cost model's own."""
from __future__ import annotations

import json


def test_device_curves_measures_each_component_on_cpu(tmp_path, capsys, bench_module):
    mod = bench_module("device_curves")
    out = tmp_path / "curves.json"
    assert mod.main(["--quick", "--no-compile", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["copy_gb_per_s"] > 0
    rows = {(r["op"], r["mode"]): r for r in res["memory_bound"]}
    assert set(rows) == {(op, "eager") for op in ("rmsnorm", "swiglu", "residual", "rope")}
    assert all(r["fwd_fraction"] > 0 for r in rows.values())
    # a residual add's backward is no kernel; the others have one
    assert rows[("residual", "eager")]["bwd_fraction"] is None
    assert all(rows[(op, "eager")]["bwd_fraction"] > 0 for op in ("rmsnorm", "swiglu", "rope"))
    assert res["launch"]["eager_us_per_kernel"] > 0 and res["launch"]["graph_us_per_kernel"] is None
    assert "fp8" not in res
    from costmodel.compute import MEMORY_BOUND_FRACTION
    from costmodel.fp8 import TE_MEASURED_GEMM_SPEEDUP
    assert res["model"]["memory_bound_fraction"]["eager"] == {"fwd": MEMORY_BOUND_FRACTION["eager"][0],
                                                              "bwd": MEMORY_BOUND_FRACTION["eager"][1]}
    lo, hi = TE_MEASURED_GEMM_SPEEDUP
    assert lo <= res["model"]["fp8_te_layer_gemm_speedup"] <= hi      # the shipped pair is admissible
    printed = capsys.readouterr().out
    assert "launch floor" in printed and "rmsnorm" in printed


def test_device_step_runs_the_runtime_model_on_cpu(tmp_path, bench_module):
    """bench/device_step.py, the device check's step profile, on this CPU: the runtime's own model
    (runtime.model) through forward, backward and AdamW at two micro-batch sizes, each timed, with
    the profiler's table and (no GPU) no kernel times; its timeline written where asked."""
    mod = bench_module("device_step")
    out = tmp_path / "step.json"
    assert mod.main(["--model", "tiny-gpt", "--seq", "64", "--mbs", "1,2", "--reps", "2", "--json", str(out),
                     "--trace", str(tmp_path / "tr")]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["model"] == "tiny-gpt"
    rows = res["runs"][0]["by_micro_batch"]
    assert [r["micro_batch"] for r in rows] == [1, 2]
    assert all(r["fwd_bwd_wall_s"] > 0 and r["optimizer_s"] > 0 and r["busy_s"] == 0 for r in rows)
    assert all("aten::" in r["table"] for r in rows) and rows[0]["sync_points"] is None
    assert (tmp_path / "tr.mb1.json").exists() and (tmp_path / "tr.mb2.json").exists()
    assert mod.kind_of("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert mod.kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma") == "attention"
    assert mod.kind_of("void at::native::vectorized_elementwise_kernel<8, bfloat16_copy>") == "other"
