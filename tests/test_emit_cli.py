"""`planner emit`: listing, writing, README, exit codes for bad plans, unknown targets, refusals
and occupied output folders; and no torch on the way."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from costmodel.specs import Workload
from planner.cli import main
from costmodel.units import fmt_seconds
from planner.plan.planfile import dump_plan, read_plan, write_plan

from test_emit_support import ROOT, examples, make_plan


def emit(*argv) -> int:
    return main(["emit", *map(str, argv)])


@pytest.fixture
def plan_file(tmp_path):
    return write_plan(examples()["tiny-llama-tp2-dp2"], tmp_path / "plan.yaml")


def test_list(capsys):
    assert emit("--list") == 0
    out = capsys.readouterr().out
    for t in ("torchrun", "slurm", "kubernetes", "megatron", "deepspeed", "torchtitan", "accelerate", "vllm",
              "sglang", "tensorrt-llm"):
        assert t in out
    assert "torchtitan 0.3.0" in out          # the torchtitan format version is stated
    assert emit("--list", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["mode"] for r in rows} == {"train", "infer"} and all(r["format"] for r in rows)


def test_one_target(plan_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert emit(plan_file, "--target", "megatron", "--out", out) == 0
    assert sorted(os.listdir(out)) == ["README.md", "megatron.sh"]
    assert os.access(out / "megatron.sh", os.X_OK)
    readme = (out / "README.md").read_text()
    assert "## megatron" in readme and "Format:" in readme and "tp=2" in readme
    assert "## What to expect" not in readme               # a plan file without an estimate has nothing to say
    # writing again into the folder it wrote is fine
    assert emit(plan_file, "--target", "megatron", "--out", out) == 0


def test_all_targets_with_refusals(plan_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert emit(plan_file, "--target", "all", "--out", out, "--json") == 4   # partial: torchtitan and accelerate refuse
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert set(res["written"]) == {"torchrun", "slurm", "kubernetes", "megatron", "deepspeed", "megatron-deepspeed"}
    assert set(res["refused"]) == {"torchtitan", "accelerate"}
    assert set(res["skipped"]) == {"vllm", "sglang", "tensorrt-llm"}
    assert "torchtitan cannot run this plan" in cap.err
    assert "a plan torchtitan runs: `planner plan --model tiny-llama --cluster cpu --gpus 4" in cap.err
    readme = (out / "README.md").read_text()
    assert "cannot express this plan" in readme and "**accelerate**" in readme and "vllm" in readme
    assert (out / "plan.yaml").exists() and not (out / "torchtitan.sh").exists()


def test_all_targets_every_one_written(tmp_path, capsys):
    # fp32, dp=1, pp=2, ZeRO-1, full recompute: a plan every training target can state
    plan = make_plan(gpus=2, pp=2, zero=1, micro_batch=1, grad_accum=8, recompute="full")
    plan = plan.replace(workload=Workload(global_batch=8, seq_len=64, dtype="fp32"))
    f = write_plan(plan, tmp_path / "p.yaml")
    assert emit(f, "--target", "all", "--out", tmp_path / "out") == 0
    names = set(os.listdir(tmp_path / "out"))
    assert {"torchrun.sh", "slurm.sbatch", "pytorchjob.yaml", "megatron.sh", "ds_config.json", "deepspeed.sh",
            "torchtitan_planner_job.py", "accelerate.yaml", "README.md", "plan.yaml"} <= names


def test_infer_plan_all(tmp_path, capsys):
    f = write_plan(examples()["llama-3-70b-serve-h100x8"], tmp_path / "p.yaml")
    assert emit(f, "--target", "all", "--out", tmp_path / "out") == 0
    assert {"vllm.sh", "sglang.sh", "trtllm.sh", "trtllm_extra.yaml"} <= set(os.listdir(tmp_path / "out"))
    assert "training targets" in (tmp_path / "out" / "README.md").read_text()


def test_refusal_is_exit_1_and_writes_nothing(tmp_path, capsys):
    f = write_plan(examples()["llama-3-8b-hetero"], tmp_path / "p.yaml")
    assert emit(f, "--target", "slurm", "--out", tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert "slurm cannot run this plan: stages on 2 node groups" in err and "--target slurm" in err
    assert not (tmp_path / "out").exists()


def test_mode_mismatch_is_refused(plan_file, tmp_path, capsys):
    assert emit(plan_file, "--target", "vllm", "--out", tmp_path / "out") == 1
    assert "mode 'train'" in capsys.readouterr().err


def test_unknown_target_lists_targets(plan_file, tmp_path, capsys):
    assert emit(plan_file, "--target", "horovod", "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "unknown target 'horovod'" in err and "torchrun" in err and "tensorrt-llm" in err


@pytest.mark.parametrize("text, needle", [
    ("just: a mapping\n", "not a plan file"),
    ("- a list\n", "not a plan file"),
    (None, "newer"),
    ("truncate", "truncated"),
])
def test_bad_plan_files(text, needle, tmp_path, capsys):
    good = dump_plan(examples()["tiny-llama-tp2-dp2"])
    if text is None:
        text = good.replace("schema: 1", "schema: 99", 1)
    elif text == "truncate":
        text = good[: good.index("parallel:")]
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    assert emit(f, "--target", "torchrun", "--out", tmp_path / "out") == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_truncated_mid_line(tmp_path, capsys):
    good = dump_plan(examples()["tiny-llama-tp2-dp2"])
    f = tmp_path / "bad.yaml"
    f.write_text(good[: len(good) // 3] + "{oops: [")
    assert emit(f, "--target", "torchrun", "--out", tmp_path / "out") == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_missing_plan_file(tmp_path, capsys):
    assert emit(tmp_path / "nope.yaml", "--target", "torchrun", "--out", tmp_path / "out") == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_occupied_out_dir(plan_file, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert emit(plan_file, "--target", "torchrun", "--out", out) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and "--force" in err
    assert sorted(os.listdir(out)) == ["notes.txt"]
    assert emit(plan_file, "--target", "torchrun", "--out", out, "--force") == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "torchrun.sh").exists()


def test_usage_errors(plan_file, tmp_path, capsys):
    assert emit("--target", "torchrun", "--out", tmp_path) == 2
    assert emit(plan_file, "--out", tmp_path) == 2
    assert emit(plan_file, "--target", "torchrun") == 2


@pytest.mark.subprocess
def test_no_torch_imported():
    code = ("import sys, tempfile\n"
            "from planner.cli import main\n"
            "from planner.cli.regen_golden import builtin_plans\n"
            "from planner.plan.planfile import write_plan\n"
            "d = tempfile.mkdtemp()\n"
            "f = write_plan(builtin_plans()['tiny-llama-tp2-dp2'], d + '/p.yaml')\n"
            "main(['emit', str(f), '--target', 'all', '--out', d + '/out'])\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            "assert not bad, bad[:5]\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_emitters_import_only_plan_types():
    """emitters/ imports nothing of ours but the plan types (planner.plan.planfile, costmodel.specs), the
    framework profiles whose switches they write (costmodel.frameworks: priced = written), the target records
    (planner.plan.targets: how a launcher starts a framework) and each other (the golden-file tool,
    ``planner.cli.regen_golden``, lives with the command line)."""
    import ast
    allowed = {"planner.plan.planfile", "costmodel.specs", "costmodel.frameworks", "planner.plan",
               "planner.plan.targets"}
    for path in sorted((ROOT / "emitters").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for m in mods:
                top = m.split(".")[0]
                if top in ("costmodel", "planner", "profiles", "runtime"):
                    assert m in allowed, f"{path.name} imports {m}"
                assert top not in ("torch", "deepspeed", "accelerate", "torchtitan", "vllm", "sglang"), \
                    f"{path.name} imports {m}"


def test_readme_says_what_to_expect(tmp_path, capsys):
    """A plan with a training estimate: its step, tokens/s and MFU as its target runs it, the
    out-of-source range, and the warnings (the 70B on 64 H100 is above Hopper's best published MFU)."""
    src = ROOT / "plans" / "llama-3-70b-64xh100.yaml"
    plan = read_plan(src)
    out = tmp_path / "out"
    assert emit(src, "--target", "megatron", "--out", out) == 0
    readme = (out / "README.md").read_text()
    assert "## What to expect" in readme and fmt_seconds(plan.estimate["step_time_s"]) in readme
    assert f"MFU {plan.estimate['mfu'] * 100:.1f}%" in readme and f"as {plan.target} runs it" in readme
    assert "- uncertainty: " in readme and "- warning: predicted MFU" in readme and "[yellow]" not in readme
