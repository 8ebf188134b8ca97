"""``make demo``'s launch step: the best plan's own framework composed with Slurm
(``planner emit --target F --launcher slurm``), and the sbatch it wrote shown whole."""
from __future__ import annotations

import pytest

import planner.cli.demo as demo
from planner.plan.planfile import read_plan

PLAN = "plans/llama-3-70b-64xh100.yaml"     # the demo's job, planned by `make plans`


@pytest.mark.subprocess
def test_the_demo_shows_the_sbatch_of_the_best_plans_framework(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "OUT", tmp_path)
    target = read_plan(PLAN).target
    assert target == "megatron"          # the best framework of the demo's job (plans/TARGETS.md)
    demo.launch_files(demo.Path(PLAN))
    out = capsys.readouterr().out
    sbatch = tmp_path / "emit" / f"{target}-slurm" / f"{target}.sbatch"
    assert sbatch.is_file()
    text = sbatch.read_text()
    assert text.startswith("#!/bin/bash") and "#SBATCH --nodes=8" in text and f"{target}.sh" in text
    assert "srun" in out and "#SBATCH --nodes=8" in out          # the file is shown, not only written
    assert "refus" not in out.lower() and "cannot" not in out.lower()
