"""`planner explain`: the words, the runner-up, the what-ifs and a self-contained HTML report."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def test_explain_text_json_and_html(tmp_path):
    plan = tmp_path / "p.yaml"
    r = run("plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "64",
            "--seq-len", "4096", "--out", str(plan), "--json")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "r.html"
    r = run("explain", str(plan), "--html", str(out))
    assert r.returncode == 0, r.stderr
    assert "Where the time goes" in r.stdout and "Runner-up" in r.stdout and "What would change" in r.stdout
    page = out.read_text()
    import yaml
    pp = yaml.safe_load(plan.read_text())["parallel"]["pp"]
    # memory, time by term, top plans; the schedule only when there is a pipeline
    assert page.count("data:image/png;base64,") == 3 + (pp > 1) and "http" not in page.split("<body>")[1][:2000]
    r = run("explain", str(plan), "--json", "--no-what-if")
    d = json.loads(r.stdout)
    assert d["runner_up"]["step_time_s"] >= d["estimate"]["step_time_s"]
    assert d["solver_status"] == "OPTIMAL"


def test_explain_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hello: world\n")
    r = run("explain", str(bad))
    assert r.returncode == 2 and "not a plan file" in r.stderr
    r = run("explain", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read plan file" in r.stderr
