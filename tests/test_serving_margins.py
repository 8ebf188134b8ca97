"""Serving plans keep a margin below their goals (issue 25): the margin, the slack of each goal,
and the smaller serving-output fixes (no word on a search that never ran, each pool's memory, the
chosen point in the frontier table)."""
from __future__ import annotations

import json

import pytest

from costmodel.uncertainty import relative_band
from planner.cli import main

pytestmark = pytest.mark.solver

BASE = ["plan", "--mode", "infer", "--model", "llama-3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
        "--prompt-len", "1000", "--output-len", "200", "--ttft-slo-ms", "400", "--tpot-slo-ms", "30"]


def _json(capsys, *extra) -> dict:
    assert main(BASE + list(extra) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_margin_is_the_validated_error_and_every_pick_keeps_it(capsys):
    d = _json(capsys, "--top", "3")
    band_t, band_p = relative_band("serve-ttft"), relative_band("serve-tpot")
    for p in d["plans"]:
        est, slo = p["estimate"], p["serving"]["slo"]
        assert slo["margin"]["ttft"] == band_t and slo["margin"]["tpot"] == band_p
        assert est["ttft_s"] * 1e3 <= 400 / (1 + band_t) + 1e-9
        assert est["tpot_s"] * 1e3 <= 30 / (1 + band_p) + 1e-9
    goals = {g["goal"]: g for g in d["plans"][0]["serving"]["goals"]}
    assert set(goals) == {"TTFT", "TPOT"}
    for g in goals.values():
        assert g["slack"] == pytest.approx((g["goal_ms"] - g["predicted_ms"]) / g["goal_ms"])
        assert g["slack"] >= g["margin"] / (1 + g["margin"]) - 1e-9


def test_margin_zero_plans_on_the_goal_and_a_margin_costs_throughput(capsys):
    tight = _json(capsys)["plans"][0]["estimate"]["output_tokens_per_s_per_gpu"]
    loose = _json(capsys, "--slo-margin", "0")["plans"][0]
    assert loose["serving"]["slo"]["margin"]["tpot"] == 0
    # without a margin the search may go closer to the TPOT goal, never slower
    assert loose["estimate"]["output_tokens_per_s_per_gpu"] >= tight
    assert loose["estimate"]["tpot_s"] * 1e3 <= 30


def test_slack_printed_for_each_goal(capsys):
    assert main(BASE) == 0
    out = capsys.readouterr().out
    for name, goal in (("TTFT", 400), ("TPOT", 30)):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{name} goal {goal} ms"))
        assert "slack" in line and "margin" in line


@pytest.mark.parametrize("bad", ["-0.1", "1", "lots"])
def test_bad_margin_is_one_line_exit_2(capsys, bad):
    assert main(BASE + ["--slo-margin", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--slo-margin" in err and "[0, 1)" in err


def test_margin_is_a_serving_flag(capsys):
    rc = main(["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
               "--seq-len", "4096", "--slo-margin", "0.1"])
    assert rc == 2 and "--slo-margin" in capsys.readouterr().err


def test_disaggregation_off_says_nothing_of_the_search_it_skipped(capsys):
    assert main(BASE + ["--disaggregation", "off"]) == 0
    out = capsys.readouterr().out
    assert "best aggregated" in out
    assert "best disaggregated" not in out


def test_disaggregated_memory_table_shows_each_pool(capsys):
    assert main(BASE + ["--disaggregation", "only"]) == 0
    out = capsys.readouterr().out
    header = next(ln for ln in out.splitlines() if "category" in ln)
    assert "prefill pool" in header and "decode pool" in header


def test_frontier_table_marks_the_chosen_plan(capsys):
    assert main(BASE + ["--pareto"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if "chosen" in ln and "│" in ln]
    assert len(rows) == 1


def test_sequence_cap_is_named_when_it_binds_and_its_hints_plan(capsys):
    """--batch above the scheduler's running-request cap while memory holds it: the message names
    the cap, not memory, and both commands it suggests plan."""
    import re
    base = ["plan", "--mode", "infer", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--prompt-len", "200", "--output-len", "200", "--tp", "8"]
    assert main(base + ["--batch", "600", "--max-num-seqs", "64"]) == 1
    err = capsys.readouterr().err
    assert "does not fit" not in err.split("Closest")[0] and "--max-num-seqs" in err
    m = re.search(r"use --max-num-seqs (\d+) or --batch (\d+)", err)
    assert m, err
    assert main(base + ["--batch", "600", "--max-num-seqs", m.group(1)]) == 0
    assert main(base + ["--batch", m.group(2), "--max-num-seqs", "64"]) == 0
    capsys.readouterr()


def test_disaggregated_emit_readme_and_headers_say_what_runs(tmp_path, capsys):
    """The README of a disaggregated emit runs the files it lists (no `bash vllm.sh`), and every
    header names both pools with their own sizes, not the decode pool's as the plan's."""
    import re
    plan = tmp_path / "pd.yaml"
    assert main(BASE + ["--disaggregation", "only", "--out", str(plan)]) == 0
    assert main(["emit", str(plan), "--target", "vllm", "--out", str(tmp_path / "em")]) == 0
    capsys.readouterr()
    files = {p.name for p in (tmp_path / "em").iterdir()}
    readme = (tmp_path / "em" / "README.md").read_text()
    for script in re.findall(r"bash (\w+\.sh)", readme):
        assert script in files, f"README runs {script}, which is not in {sorted(files)}"
    from planner.plan.planfile import read_plan
    dis = read_plan(plan).serving["disaggregation"]
    for name in ("prefill.sh", "decode.sh", "proxy.sh"):
        header = (tmp_path / "em" / name).read_text().splitlines()[2]
        assert f"prefill {dis['prefill']['replicas']} x tp={dis['prefill']['tp']} pp={dis['prefill']['pp']}" in header
        assert f"decode {dis['decode']['replicas']} x tp={dis['decode']['tp']}" in header
        assert not re.search(r": tp=\d+ pp=\d+ dp=", header), header


def test_every_target_keeps_the_margin(capsys):
    """--target all: each engine's plan is held to the same margins and records them."""
    argv = [a for a in BASE] + ["--target", "all", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["plans"]) >= 2
    for p in d["plans"]:
        slo = p["serving"]["slo"]
        assert slo["margin"]["tpot"] == relative_band("serve-tpot")
        assert p["estimate"]["tpot_s"] * 1e3 <= slo["planned_ms"]["tpot"] + 1e-9
        assert p["estimate"]["ttft_s"] * 1e3 <= slo["planned_ms"]["ttft"] + 1e-9
