"""`planner calibrate`: recover known efficiency factors from step times, and refuse bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from costmodel.catalog import get_model
from costmodel.specs import ParallelConfig, Workload, default_stages
from planner.cli.cmd_calibrate import Run, apply_factors, calibrate, predict
from planner.plan.planfile import Plan, write_plan
from costmodel.files.clusters import load_cluster

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "measured" / "cpu-2x2-netns.yaml"

CONFIGS = [dict(tp=2, dp=2, grad_accum=8), dict(dp=4, grad_accum=4), dict(tp=4, grad_accum=16),
           dict(pp=2, dp=2, grad_accum=8)]


def _plans(cluster):
    model = get_model("tiny-llama")
    wl = Workload(global_batch=16, seq_len=256, dtype="fp32")
    out = []
    for cfg in CONFIGS:
        par = ParallelConfig(micro_batch=1, **cfg)
        out.append(Plan(model=model, cluster=cluster, workload=wl, parallel=par,
                        stages=default_stages(model.layers, par.pp)))
    return out


def test_calibration_recovers_known_factors():
    cluster = load_cluster(str(PROFILE))
    plans = _plans(cluster)
    truth = {"compute": 0.6, "intra": 0.8, "inter": 0.5}
    measured = predict(cluster, [Run("x", p, 1.0) for p in plans], truth)
    runs = [Run(f"run{i}", p, t) for i, (p, t) in enumerate(zip(plans, measured))]
    res = calibrate(cluster, runs)
    errs_before = [abs(b / r.measured_step_time_s - 1) for b, r in zip(res["before"], runs)]
    errs_after = [abs(a / r.measured_step_time_s - 1) for a, r in zip(res["after"], runs)]
    assert max(errs_before) > 0.3
    assert max(errs_after) < 0.02
    for k, v in truth.items():
        assert res["factors"][k] == pytest.approx(v, rel=0.08), (k, res["factors"])


def test_factors_above_one_raise_peak_not_efficiency():
    cluster = load_cluster(str(PROFILE))
    c = apply_factors(cluster, {"compute": 2.0, "inter": 3.0})
    assert c.gpu.matmul_efficiency == cluster.gpu.matmul_efficiency
    assert c.gpu.peak("bf16") == pytest.approx(2 * cluster.gpu.peak("bf16"))
    assert c.inter_node.efficiency == 1.0
    assert c.inter_node.effective_bytes_per_s == pytest.approx(3 * cluster.inter_node.effective_bytes_per_s)
    assert [r[4] for r in c.collective_table if r[0] == "inter"] == \
        pytest.approx([3 * r[4] for r in cluster.collective_table if r[0] == "inter"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner", "calibrate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.subprocess
def test_calibrate_command_writes_a_calibrated_cluster(tmp_path):
    cluster = load_cluster(str(PROFILE))
    plans = _plans(cluster)
    measured = predict(cluster, [Run("x", p, 1.0) for p in plans], {"compute": 0.7, "inter": 0.6})
    entries = []
    for i, (p, t) in enumerate(zip(plans, measured)):
        write_plan(p, tmp_path / "plans" / f"p{i}.yaml")
        entries.append({"plan": f"plans/p{i}.yaml", "measured_step_time_s": t})
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(entries))
    out = tmp_path / "cal.yaml"
    p = _cli("--cluster", str(PROFILE), "--measured", str(tmp_path / "runs.yaml"), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["error_before"]["mean_abs_error"] > 0.1 and r["error_after"]["mean_abs_error"] < 0.02
    cal = load_cluster(str(out))
    assert cal.source == "calibrated"
    prov = yaml.safe_load(out.read_text())["provenance"]
    assert prov["calibration"]["factors"]["compute"] == pytest.approx(0.7, rel=0.08)
    assert prov["hosts"] == ["vm"] or prov["hosts"]             # the profile's provenance is kept
    # the human form prints before/after and goes quiet on stdout otherwise
    p = _cli("--cluster", str(PROFILE), "--measured", str(tmp_path / "runs.yaml"), "--out", str(out))
    assert p.returncode == 0 and "before" in p.stdout and "after" in p.stdout


@pytest.mark.subprocess
def test_calibrate_bad_input_exits_2(tmp_path):
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([{"plan": "missing.yaml", "measured_step_time_s": 1.0}]))
    p = _cli("--cluster", str(PROFILE), "--measured", str(tmp_path / "runs.yaml"))
    assert p.returncode == 2 and "missing.yaml" in p.stderr and "Traceback" not in p.stderr
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([{"plan": "x.yaml", "step": 1.0}]))
    p = _cli("--cluster", str(PROFILE), "--measured", str(tmp_path / "runs.yaml"))
    assert p.returncode == 2 and "unknown key(s) step" in p.stderr
    p = _cli("--cluster", str(PROFILE), "--measured", str(tmp_path / "runs.yaml"), "--fit", "memory")
    assert p.returncode == 2 and "unknown factor(s) memory" in p.stderr
