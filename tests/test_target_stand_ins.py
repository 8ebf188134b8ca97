"""Framework names that are not targets (``planner.plan.targets.STAND_INS``): ``planner estimate`` prices
NeMo and Megatron-Bridge as the megatron target and MaxText with the generic profile, and says so; ``plan``
and ``emit``, which write a target's files, refuse them (exit 2) with the target to use. A MoE problem,
where the megatron and generic profiles price differently (Megatron's fused permute and router), so the
test can tell the stand-ins apart. PyTorch FSDP trainers (Composer, llm-foundry, OLMo-core, fms-fsdp) are
priced by ``estimate`` as the validation prices their published runs."""
from __future__ import annotations

import dataclasses
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
    deepspeed = _estimate(capsys, "--target", "megatron-deepspeed")
    out = _estimate(capsys, "--target", "gpt-neox")
    assert out["estimate"]["step_time_s"] == deepspeed["estimate"]["step_time_s"]
    assert out["target"]["name"] == "megatron-deepspeed" and out["target"]["asked"] == "gpt-neox"
    assert out["target"]["problems"] == deepspeed["target"]["problems"]
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


def _record(name: str) -> dict:
    from planner.cli.validation import all_cases
    return next(case for case, _split in all_cases() if case["name"] == name)


def _validated(name: str, tmp_path) -> tuple[dict, object, float, Path]:
    """A published case, its workload, the validation's tokens/s per GPU for it, and its model as a file."""
    import yaml

    from costmodel.training import estimate
    from planner.cli.validation import case_inputs
    case = _record(name)
    model, cluster, wl, par, prof, _fw = case_inputs(case)
    validated = estimate(model, cluster, wl, par, framework=prof).tokens_per_s_per_gpu
    f = tmp_path / "model.yaml"
    f.write_text(yaml.safe_dump(model.to_dict(), sort_keys=False))
    return case, wl, validated, f


def test_a_pytorch_fsdp_trainer_is_priced_as_the_validation_prices_its_published_run(capsys, tmp_path):
    """``--target fms-fsdp`` on the published fms-fsdp run's problem and layout gives the validation's
    price of that run (the rule behind ``planner validate --cross``'s ibm-fsdp family), not generic's,
    whose Megatron-grade kernels price it faster on an H100."""
    case, wl, validated, f = _validated("ibm-fsdp-llama2-7b-h100-96gpu", tmp_path)
    p = case["parallel"]
    problem = ["estimate", "--model", str(f), "--cluster", str(ROOT / case["cluster"]), "--gpus", str(case["num_gpus"]),
               "--global-batch", str(case["global_batch"]), "--seq-len", str(wl.seq_len), "--micro-batch",
               str(p["micro_batch"]), "--dp-shard", str(p["dp_shard"]), "--json"]
    assert main(problem + ["--target", "fms-fsdp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["zero"] == 3                       # FSDP's full shard where --zero is not given
    assert out["estimate"]["tokens_per_s_per_gpu"] == pytest.approx(validated, rel=1e-9)
    assert out["target"] == {"name": "generic", "problems": [], "asked": "fms-fsdp", "note": out["target"]["note"]}
    assert "PyTorch FSDP trainer" in out["target"]["note"] and "FSDP1" in out["target"]["note"]
    assert main(problem + ["--zero", "3"]) == 0
    generic = json.loads(capsys.readouterr().out)["estimate"]["tokens_per_s_per_gpu"]
    assert generic > 1.1 * validated
    assert main(problem + ["--target", "fms-fsdp", "--zero", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["zero"] == 2     # --zero is kept


def test_a_compiled_fsdp_trainer_run_is_priced_as_the_validation_prices_it(capsys, tmp_path):
    """OLMo-core's published Llama 8B run compiled its model (the record's ``compile: true``): with
    ``--framework-setting compile=true`` the stand-in gives the validation's price of that run; without it,
    the uncompiled (slower) price. Anything but compile is refused with what the name takes."""
    import yaml

    from costmodel.training import estimate
    from planner.cli.validation import case_inputs
    case = _record("olmo-core-llama3-8b-h100-8gpu-bf16")
    model, cluster, wl, par, prof, _fw = case_inputs(case)
    assert "compile" in prof.name
    validated = estimate(model, cluster, wl, par, framework=prof).tokens_per_s_per_gpu
    f = tmp_path / "model.yaml"
    f.write_text(yaml.safe_dump(model.to_dict(), sort_keys=False))
    problem = ["estimate", "--model", str(f), "--cluster", case["cluster"], "--gpus", str(case["num_gpus"]),
               "--global-batch", str(case["global_batch"]), "--seq-len", str(wl.seq_len), "--micro-batch",
               str(case["parallel"]["micro_batch"]), "--target", "olmo-core", "--json"]
    assert main(problem + ["--framework-setting", "compile=true"]) == 0
    compiled = json.loads(capsys.readouterr().out)["estimate"]["tokens_per_s_per_gpu"]
    assert compiled == pytest.approx(validated, rel=1e-9)
    assert main(problem) == 0
    assert json.loads(capsys.readouterr().out)["estimate"]["tokens_per_s_per_gpu"] < 0.95 * compiled
    assert main(problem + ["--framework-setting", "async_tp=true"]) == 2
    assert "--target olmo-core takes compile" in capsys.readouterr().err


def test_each_fsdp_trainer_profile_is_the_validated_rule_with_its_own_defaults():
    from costmodel.frameworks import FRAMEWORKS, as_pytorch_fsdp
    from planner.plan import targets as T
    for name, trainer in T.FSDP_TRAINERS.items():
        prof = T.stand_in_profile(name)
        assert prof.pytorch_native and prof.launch == "eager" and prof.fsdp2_copies == trainer.fsdp2
        assert prof.attention == (trainer.attention or FRAMEWORKS["generic"].attention)
        assert prof == dataclasses.replace(as_pytorch_fsdp(FRAMEWORKS["generic"], trainer.fsdp2),
                                           attention=prof.attention)
        assert T.STAND_INS[name][0] == "generic"
    assert T.stand_in_profile("nemo") is None and T.stand_in_profile("torchtitan") is None
    # OLMo-core trains FP8 with torchao's Float8Linear; Composer and llm-foundry with Transformer Engine
    assert T.default_fp8_recipe("olmo-core", None) == "tensorwise"
    assert T.default_fp8_recipe("llm-foundry", None) == "delayed"


@pytest.mark.parametrize("name", ["composer", "llm-foundry"])
def test_plan_and_emit_refuse_an_fsdp_trainer_and_name_estimate_and_the_fsdp2_targets(capsys, name):
    assert main(["plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "128", "--target", name]) == 2
    err = capsys.readouterr().err
    assert f"planner estimate --target {name}" in err and "--target torchtitan or accelerate" in err
    assert main(["emit", str(ROOT / "plans" / "megatron" / "llama-3-70b-64xh100.yaml"), "--target", name,
                 "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert f"planner estimate --target {name}" in err and "--target torchtitan or accelerate" in err


def test_an_unknown_name_gets_no_hint(capsys):
    assert main(PROBLEM + ["--target", "horovod"]) == 2
    err = capsys.readouterr().err
    assert "training targets are" in err and "use --target" not in err and "FSDP" not in err


def test_nanotron_is_priced_as_the_validation_prices_smollm3s_run(capsys, tmp_path):
    """``--target nanotron`` on SmolLM3's published problem and layout gives the validation's price of that
    run (family smollm: PyTorch-native kernels, eager launches, FlashAttention-2), at nanotron's own ZeRO
    stage (0, DDP) where ``--zero`` is not given; generic's Megatron-grade kernels price it faster."""
    case, wl, validated, f = _validated("smollm3-3b-h100-384gpu-bf16", tmp_path)
    p = case["parallel"]
    problem = ["estimate", "--model", str(f), "--cluster", case["cluster"], "--gpus", str(case["num_gpus"]),
               "--global-batch", str(case["global_batch"]), "--seq-len", str(wl.seq_len), "--tp", str(p["tp"]),
               "--micro-batch", str(p["micro_batch"]), "--json"]
    assert main(problem + ["--target", "nanotron"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["zero"] == 0 and out["parallel"]["sp"]
    assert out["estimate"]["tokens_per_s_per_gpu"] == pytest.approx(validated, rel=1e-9)
    assert "nanotron is a PyTorch trainer" in out["target"]["note"] and "ZeRO-0" in out["target"]["note"]
    assert main(problem + ["--zero", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["estimate"]["tokens_per_s_per_gpu"] > 1.1 * validated


@pytest.mark.parametrize("typed,meant", [("Megatron-LM", "megatron"), ("megatron_lm", "megatron"),
                                         ("NeMo", "nemo"), ("LLM_Foundry", "llm-foundry"), ("MaxText", "maxtext"),
                                         ("TorchTitan", "torchtitan"), ("Megatron DeepSpeed", "megatron-deepspeed")])
def test_a_target_is_known_however_it_is_typed(capsys, typed, meant):
    """``--target`` takes a framework's name as people write it: case, ``_`` and spaces do not matter, and
    Megatron-LM is the megatron target (whose launch files are Megatron-LM's). The estimate is the
    canonical name's to the digit."""
    want = _estimate(capsys, "--target", meant)
    got = _estimate(capsys, "--target", typed)
    assert got["estimate"]["step_time_s"] == want["estimate"]["step_time_s"]
    assert got["target"] == want["target"]


def test_plan_emit_and_serving_take_a_target_however_it_is_typed(capsys, tmp_path):
    out = tmp_path / "plan.yaml"
    assert main(["plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "128", "--target", "Megatron-LM", "--out", str(out), "--max-time", "10"]) == 0
    from planner.plan.planfile import read_plan
    assert read_plan(str(out)).target == "megatron"
    capsys.readouterr()
    assert main(["emit", str(out), "--target", "MEGATRON", "--out", str(tmp_path / "launch")]) == 0
    assert (tmp_path / "launch").is_dir()
    capsys.readouterr()
    assert main(["plan", "--mode", "infer", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "1",
                 "--prompt-len", "64", "--output-len", "16", "--batch", "4", "--target", "TRT-LLM", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["target"] == "tensorrt-llm"
    # a name that is none of them is refused as typed
    assert main(PROBLEM + ["--target", "Horovod"]) == 2
    assert "'Horovod'" in capsys.readouterr().err
