"""Executed, not only parsed: the Accelerate files run a few steps on the CPU.

``accelerate.sh`` runs as written: Accelerate's own ``accelerate launch`` (accelerate 1.15 from
.venv-targets; the ``accelerate`` command on PATH is a two-line wrapper that calls its CLI with
this interpreter) reads the emitted ``accelerate.yaml`` and starts the shipped
``train_accelerate.py`` (the documented starting point) on 2 ranks. Checked: Accelerate's world
size and engine are the plan's, the gradient accumulation is the plan's, the parameters are equal on
both data-parallel ranks after the steps and differ from a one-process run of the same steps (a
rank that trained alone would match it), the losses are finite, and the state saved to
CHECKPOINT_DIR resumes (steps 2 -> 4).

The one CPU adaptation: ``ACCELERATE_USE_CPU=true``, so Accelerate's state picks gloo and the CPU
for the DDP engine (``accelerate/state.py PartialState._prepare_backend``: without it, and without a
GPU, every rank runs alone). What cannot run here, each test skips saying why:
* the FSDP engine: Accelerate 1.15 turns its FSDP plugin on only for accelerator device types
  (``AcceleratorState.__init__``: MULTI_GPU, MULTI_XPU, ...; never MULTI_CPU), so on a CPU the
  same config trains as plain DDP;
* the DeepSpeed engine (ZeRO-1): without a GPU Accelerate's state counts one process while
  DeepSpeed counts two (the batch sizes then disagree), and its plugin needs transformers
  (``DeepSpeedPlugin.set_deepspeed_weakref``), which the targets environment does not install;
* the Megatron-LM engine (TP/PP) needs Megatron-LM's training code and a GPU.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from emitters import accelerate_train
from test_emit_roundtrip import TARGETS_ENV
from test_emit_support import make_plan, write

pytestmark = [pytest.mark.subprocess, pytest.mark.multiproc]

WRAPPER = """#!/bin/sh
exec "{python}" -c "import sys; from accelerate.commands.accelerate_cli import main; sys.argv[0] = 'accelerate'; main()" "$@"
"""


def _accelerate_or_skip():
    if not (TARGETS_ENV / "accelerate").is_dir():
        pytest.skip(f"Accelerate is not installed: `make targets-env` puts it in {TARGETS_ENV.name}")


def _env(tmp_path, out, extra=None) -> dict:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "accelerate").write_text(WRAPPER.format(python=sys.executable))
    (bin_ / "accelerate").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "TRAIN_SCRIPT": str(out / accelerate_train.NAME),
            "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
            "PYTHONPATH": os.pathsep.join([str(TARGETS_ENV), os.environ.get("PYTHONPATH", "")]), **(extra or {})}


def _rows(stdout: str) -> list[dict]:
    # each rank prints one JSON object; two ranks' writes to the shared pipe may land on one line
    dec = json.JSONDecoder()
    return [dec.raw_decode(stdout, m.start())[0] for m in re.finditer(r'\{"rank"', stdout)]


def _run(out, tmp_path, steps: int, extra=None) -> list[dict]:
    r = subprocess.run(["bash", str(out / "accelerate.sh"), "--steps", str(steps)], env=_env(tmp_path, out, extra),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    return _rows(r.stdout)


def _alone(out, tmp_path, steps: int) -> dict:
    """The same script and steps in one process, without Accelerate's launcher: rank 0's data only."""
    env = _env(tmp_path, out, {"CHECKPOINT_DIR": str(tmp_path / "ckpt-alone"),
                               "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2"})
    r = subprocess.run([sys.executable, str(out / accelerate_train.NAME), "--steps", str(steps)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    (row,) = _rows(r.stdout)
    return row


def test_ddp_config_runs_and_ranks_agree(tmp_path):
    _accelerate_or_skip()
    plan = make_plan(gpus=2, gb=4, dp=2, zero=0, micro_batch=1, grad_accum=2, seq=32).replace(target="accelerate")
    out = write(plan, "accelerate", tmp_path / "out")
    assert "distributed_type: MULTI_GPU" in (out / "accelerate.yaml").read_text()
    rows = _run(out, tmp_path, steps=2, extra={"ACCELERATE_USE_CPU": "true"})
    assert sorted(r["rank"] for r in rows) == [0, 1]
    # DDP on the CPU is Accelerate's MULTI_CPU: the same engine over gloo
    assert {r["world"] for r in rows} == {plan.world_size} and {r["engine"] for r in rows} == {"MULTI_CPU"}
    assert {r["accumulation"] for r in rows} == {plan.parallel.grad_accum}
    assert {r["mixed_precision"] for r in rows} == {"bf16"}
    assert rows[0]["checksum"] == rows[1]["checksum"]             # data-parallel ranks hold the same weights
    assert rows[0]["losses"] != rows[1]["losses"]                 # ... after training on different data
    assert all(x == x and abs(x) < 1e4 for r in rows for x in r["losses"])
    # one rank alone (its own data only) ends elsewhere: the ranks averaged their gradients
    assert _alone(out, tmp_path, steps=2)["checksum"] != rows[0]["checksum"]
    again = _run(out, tmp_path, steps=2, extra={"ACCELERATE_USE_CPU": "true"})    # resumes from CHECKPOINT_DIR
    assert {r["steps"] for r in again} == {4}
    assert again[0]["checksum"] == again[1]["checksum"] != rows[0]["checksum"]


def test_fsdp_config_cannot_run_on_cpu(tmp_path):
    _accelerate_or_skip()
    import torch
    if not torch.cuda.is_available():
        pytest.skip("Accelerate 1.15 turns its FSDP plugin on only for accelerator device types "
                    "(accelerate/state.py AcceleratorState.__init__: MULTI_GPU, MULTI_XPU, ...; never MULTI_CPU): "
                    "on this CPU machine the FSDP config would train as plain DDP, so it is not run")
    plan = make_plan(gpus=2, gb=4, dp=2, zero=3, micro_batch=1, grad_accum=2, seq=32).replace(target="accelerate")
    out = write(plan, "accelerate", tmp_path / "out")
    rows = _run(out, tmp_path, steps=2)
    assert {r["engine"] for r in rows} == {"FSDP"} and rows[0]["checksum"] == rows[1]["checksum"]


def test_deepspeed_config_cannot_run_on_cpu(tmp_path):
    _accelerate_or_skip()
    import torch
    if not torch.cuda.is_available() or not (TARGETS_ENV / "transformers").is_dir():
        pytest.skip("Accelerate 1.15 runs its DeepSpeed engine only on an accelerator: on a CPU-only machine its "
                    "state finds no device (accelerate/state.py _prepare_backend) and counts one process, so "
                    "prepare() sets train_batch_size for a world of 1 and DeepSpeed (world 2) refuses it; its "
                    "DeepSpeed plugin also needs transformers (utils/dataclasses.py set_deepspeed_weakref), which "
                    ".venv-targets does not install. The DeepSpeed ZeRO files themselves run in "
                    "test_emit_exec_deepspeed.py")
    plan = make_plan(gpus=2, gb=4, dp=2, zero=1, micro_batch=1, grad_accum=2, seq=32).replace(target="accelerate")
    out = write(plan, "accelerate", tmp_path / "out")
    rows = _run(out, tmp_path, steps=2, extra={"DS_ACCELERATOR": "cpu"})
    assert {r["engine"] for r in rows} == {"DEEPSPEED"} and rows[0]["checksum"] == rows[1]["checksum"]


def test_fsdp_accumulation_keeps_the_priced_gradient_sync(tmp_path):
    """An FSDP2 plan with accumulation is priced with a reduce-scatter every micro-batch and sharded
    gradients; Accelerate's accumulate() would skip the sync (no_sync: unsharded gradients held) unless
    the plugin's sync_each_batch is on. The script runs alone here (no launcher: one CPU process) and
    reports what Accelerate's own state holds; a DDP plan keeps Accelerate's default."""
    _accelerate_or_skip()
    fsdp = make_plan(gpus=2, gb=4, dp=2, zero=3, micro_batch=1, grad_accum=2, seq=32).replace(target="accelerate")
    out = write(fsdp, "accelerate", tmp_path / "fsdp")
    assert "sync_each_batch=True" in (out / "accelerate.yaml").read_text()
    row = _alone(out, tmp_path, steps=1)
    assert row["sync_each_batch"] is True and row["accumulation"] == 2
    ddp = make_plan(gpus=2, gb=4, dp=2, zero=0, micro_batch=1, grad_accum=2, seq=32).replace(target="accelerate")
    out = write(ddp, "accelerate", tmp_path / "ddp")
    assert "sync_each_batch" not in (out / "accelerate.yaml").read_text()
    assert _alone(out, tmp_path, steps=1)["sync_each_batch"] is False


def test_starting_point_ships_only_where_it_trains_the_plan():
    tp = make_plan(gpus=2, gb=4, tp=2, micro_batch=1, grad_accum=4, seq=32, recompute="full").replace(
        target="accelerate")
    files = write_files(tp)
    assert accelerate_train.NAME not in files
    assert "No starting-point script ships for this plan" in files["accelerate.sh"]
    ddp = make_plan(gpus=2, gb=4, dp=2, zero=0, micro_batch=1, grad_accum=2, seq=32).replace(target="accelerate")
    files = write_files(ddp)
    assert "TRAIN_SCRIPT=$PWD/train_accelerate.py" in files["accelerate.sh"]
    assert "MICRO_BATCH = 1" in files[accelerate_train.NAME]


def write_files(plan) -> dict:
    from emitters import get
    return get("accelerate").emit(plan)
