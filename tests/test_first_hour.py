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


HINTED = ["plan", "--model", "llama-3-70b", "--cluster", "dgx-h100", "--global-batch", "512", "--seq-len", "8192",
          "--max-time", "30"]


@pytest.mark.parametrize("gpus,target", [(7, "megatron"), (2, "deepspeed"), (8, "megatron"), (16, "megatron")])
def test_infeasibility_hint_is_the_smallest_command_that_plans(gpus, target, capsys):
    """The hint names a --gpus the tool accepts, at which a plan exists, and no smaller accepted
    count above the asked one plans; the layout it quotes uses exactly the GPUs asked for."""
    from planner.search.bnb import accepted_gpu_counts
    from profiles.clusters import load_cluster
    assert main(HINTED + ["--gpus", str(gpus), "--target", target]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    degrees = dict((k, int(v)) for k, v in re.findall(r"\b(tp|pp|dp|cp)=(\d+)", err.split("even at")[1]))
    assert degrees["tp"] * degrees["pp"] * degrees["dp"] * degrees.get("cp", 1) == gpus, err
    hinted = int(re.search(r"the smallest change: --gpus (\d+)", err).group(1))
    assert main(HINTED + ["--gpus", str(hinted), "--target", target]) == 0, "the hinted command does not plan"
    capsys.readouterr()
    below = [n for n in accepted_gpu_counts(load_cluster("dgx-h100"), gpus, hinted) if n < hinted]
    if below:       # the accepted count just below the hint: refused for memory, so the hint is the smallest
        assert main(HINTED + ["--gpus", str(below[-1]), "--target", target]) == 1
        capsys.readouterr()
