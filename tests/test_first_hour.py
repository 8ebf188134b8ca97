"""A new user's first hour (issue 25): ``plan --out DIR`` on an existing folder, infeasibility hints
that are commands the tool accepts (each hint's command is run), and the small messages."""
from __future__ import annotations

import re

import pytest

from planner.cli import main
from planner.plan.planfile import read_plan

pytestmark = pytest.mark.solver

TRAIN = ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
         "--seq-len", "4096", "--max-time", "20"]


def test_plan_out_existing_folder_twice(tmp_path, capsys):
    """The README's `--out DIR`: works on a folder that exists, and again on the same command."""
    for _ in range(2):
        assert main(TRAIN + ["--target", "megatron", "--out", str(tmp_path)]) == 0
    assert read_plan(tmp_path / "megatron.yaml").target == "megatron"
    assert main(TRAIN + ["--out", str(tmp_path)]) == 0          # --target all: one file per target
    names = {p.name for p in tmp_path.iterdir()}
    assert {"megatron.yaml", "torchtitan.yaml"} <= names
    infer = ["plan", "--mode", "infer", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8",
             "--prompt-len", "100", "--output-len", "100"]
    for _ in range(2):
        assert main(infer + ["--out", str(tmp_path)]) == 0
    assert read_plan(tmp_path / "vllm.yaml").mode == "infer"
    capsys.readouterr()
