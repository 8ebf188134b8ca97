"""Framework names that are not targets (``planner.plan.targets.STAND_INS``): ``planner estimate`` prices
NeMo and Megatron-Bridge as the megatron target and MaxText with the generic profile, and says so; ``plan``
and ``emit``, which write a target's files, refuse them (exit 2) with the target to use; PyTorch FSDP
trainers get a hint in every command. A MoE problem, where the megatron and generic profiles price
differently (Megatron's fused permute and router), so the test can tell the stand-ins apart."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "256",
           "--seq-len", "4096", "--tp", "1", "--ep", "8", "--dp", "64", "--micro-batch", "1", "--zero", "1", "--json"]


def _estimate(capsys, *target: str) -> dict:
    assert main(PROBLEM + list(target)) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_prices_a_stand_in_as_its_target_and_says_so(capsys):
    megatron = _estimate(capsys, "--target", "megatron")
    generic = _estimate(capsys)
    assert megatron["estimate"]["step_time_s"] != pytest.approx(generic["estimate"]["step_time_s"], rel=1e-4)
    for name in ("nemo", "megatron-bridge"):
        out = _estimate(capsys, "--target", name)
        assert out["estimate"]["step_time_s"] == megatron["estimate"]["step_time_s"]
        assert out["target"]["name"] == "megatron" and out["target"]["asked"] == name
        assert "Megatron-core" in out["target"]["note"]
    out = _estimate(capsys, "--target", "maxtext")
    assert out["estimate"]["step_time_s"] == generic["estimate"]["step_time_s"]
    assert out["target"]["name"] == "generic" and "JAX/XLA" in out["target"]["note"]


def test_plan_and_emit_refuse_a_stand_in_with_the_target_to_use(capsys):
    assert main(["plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "128", "--target", "nemo"]) == 2
    assert "use --target megatron" in capsys.readouterr().err
    assert main(["emit", str(ROOT / "plans" / "megatron" / "llama-3-70b-64xh100.yaml"), "--target", "nemo",
                 "--out", "unused"]) == 2
    assert "use --target megatron" in capsys.readouterr().err
    # generic writes no files: emit names no target for MaxText (plan may search it with --target generic)
    assert main(["emit", str(ROOT / "plans" / "megatron" / "llama-3-70b-64xh100.yaml"), "--target", "maxtext",
                 "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "no target writes its launch files" in err and "use --target" not in err


@pytest.mark.parametrize("name", ["composer", "llm-foundry"])
def test_fsdp_trainers_get_the_fsdp_targets_as_a_hint(capsys, name):
    assert main(PROBLEM + ["--target", name]) == 2
    err = capsys.readouterr().err
    assert "--target torchtitan or accelerate" in err and "training targets are" in err


def test_an_unknown_name_gets_no_hint(capsys):
    assert main(PROBLEM + ["--target", "horovod"]) == 2
    err = capsys.readouterr().err
    assert "training targets are" in err and "use --target" not in err and "FSDP" not in err
