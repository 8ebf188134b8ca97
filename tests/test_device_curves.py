"""bench/device_curves.py, the device check's component measurements, run on this CPU at small
sizes (no FP8, no CUDA graphs, no compile here): every row measured and shaped as documented, and
the model's figures printed beside them are the cost model's own."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_device_curves_measures_each_component_on_cpu(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("device_curves", ROOT / "bench" / "device_curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
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
