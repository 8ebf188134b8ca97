"""`planner plan` end to end: JSON envelope, plan file, CSV, a measured profile, exit codes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from planner.plan.check import check_plan
from planner.plan.planfile import read_plan

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]


def planner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


BASE = ["--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096"]


def test_plan_json_out_and_csv(tmp_path):
    out, csv = tmp_path / "plan.yaml", tmp_path / "cands.csv"
    r = planner("plan", *BASE, "--target", "builtin", "--top", "2", "--json", "--out", str(out), "--csv", str(csv))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "OPTIMAL" and d["solver"]["status"] == "OPTIMAL"
    assert {"objective", "bound", "wall_time_s", "candidates"} <= set(d["solver"])
    assert d["solver"]["objective"] == pytest.approx(d["solver"]["bound"])
    assert len(d["plans"]) == 2
    p0 = d["plans"][0]
    assert {"parallel", "estimate", "stages"} <= set(p0)
    assert sum(s["layers"][1] - s["layers"][0] for s in p0["stages"]) == 32
    plan = read_plan(out)
    assert check_plan(plan) == []
    assert plan.estimate["step_time_s"] == pytest.approx(p0["estimate"]["step_time_s"])
    # the plan file re-estimates to the same numbers
    r2 = planner("estimate", "--plan", str(out), "--json")
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["estimate"]["step_time_s"] == pytest.approx(p0["estimate"]["step_time_s"], rel=1e-12)
    df = pd.read_csv(csv)
    assert len(df) == d["solver"]["candidates"]
    assert {"tp", "pp", "dp", "zero", "lower_bound", "step_time_s"} <= set(df.columns)
    assert df["solved"].sum() >= 1


def test_fully_fixed_plan_equals_estimate():
    fixed = ["--tp", "2", "--pp", "2", "--dp", "4", "--cp", "1", "--zero", "1", "--micro-batch", "1",
             "--vpp", "1", "--recompute", "selective", "--mesh-order", "pp,dp,cp,tp", "--sp"]
    r = planner("plan", *BASE, *fixed, "--json")
    e = planner("estimate", *BASE, *fixed, "--json")
    assert r.returncode == 0 and e.returncode == 0, (r.stderr, e.stderr)
    pe = json.loads(r.stdout)["plans"][0]
    ee = json.loads(e.stdout)
    for k in ("tp", "pp", "dp", "cp", "ep", "zero", "sp", "vpp", "micro_batch", "grad_accum"):
        assert pe["parallel"][k] == ee["parallel"][k]
    stages = pe["stages"]
    if all(s["recompute_layers"] == 0 for s in stages) and [s["layers"] for s in stages] == [[0, 16], [16, 32]]:
        assert pe["estimate"]["step_time_s"] == pytest.approx(ee["estimate"]["step_time_s"], rel=1e-12)
    else:   # the solver may split unevenly or recompute some layers: never worse than the even split
        assert pe["estimate"]["step_time_s"] <= ee["estimate"]["step_time_s"] * (1 + 1e-9)


def test_measured_two_tier_profile_keeps_tp_inside_a_node():
    prof = ROOT / "profiles" / "measured" / "cpu-2x2-netns.yaml"
    r = planner("plan", "--model", "tiny-llama", "--cluster", str(prof), "--global-batch", "8", "--seq-len", "128",
                "--tp", "2", "--top", "3", "--json")
    assert r.returncode == 0, r.stderr
    for p in json.loads(r.stdout)["plans"]:
        assert p["mesh"]["tp_within_node"], p["mesh"]


def test_human_output_shows_status_and_placement():
    r = planner("plan", *BASE)
    assert r.returncode == 0, r.stderr
    assert "OPTIMAL" in r.stdout and "placement" in r.stdout and "tokens/s" in r.stdout


@pytest.mark.parametrize("args,code,msg", [
    (["--tp", "8", "--pp", "4"], 2, "tp=8 * pp=4 = 32 does not divide --gpus 16"),
    (["--tp", "3"], 2, "fixed tp=3 = 3 does not divide --gpus 16"),
    (["--tp", "6", "--gpus", "48"], 2, "--tp 6 does not divide"),
    (["--top", "0"], 2, "--top must be >= 1"),
    (["--out", "/proc/nope/plan.yaml"], 2, "cannot"),
])
def test_bad_input(args, code, msg):
    r = planner("plan", *BASE, *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert msg in r.stderr and "Traceback" not in r.stderr


def test_infeasible_exit_1_with_binding_constraint():
    r = planner("plan", "--model", "llama-3.1-405b", "--cluster", "dgx-a100-40gb", "--gpus", "16",
                "--global-batch", "64", "--seq-len", "8192")
    assert r.returncode == 1, r.stderr
    assert "needs at least" in r.stderr and "GiB per GPU" in r.stderr and "A100-SXM4-40GB has" in r.stderr
