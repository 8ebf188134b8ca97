"""Executed, not only parsed: the DeepSpeed files run a few steps on the CPU.

``deepspeed.sh`` runs with its launcher replaced by a shim that hands the same arguments to
torchrun (the ``deepspeed`` runner would ssh/pdsh and count GPUs; this CPU machine has none), over
gloo, with the shipped ``train_deepspeed.py`` (the documented starting point) and the written
``ds_config.run.json``. Checked: DeepSpeed's world size is the plan's, its ZeRO stage the plan's,
the parameters are equal on every data-parallel rank after the steps (ZeRO-3 gathers them first),
losses are finite, and a checkpoint is saved to CHECKPOINT_DIR and resumed from it.

Needs DeepSpeed from .venv-targets and its CPU FusedAdam op: DeepSpeed JIT-compiles it on first use
(minutes on 2 cores; cached in ~/.cache/torch_extensions afterwards). Skips with the reason when
DeepSpeed is absent.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from emitters import ds_train
from test_emit_roundtrip import TARGETS_ENV
from test_emit_support import make_plan, write

pytestmark = [pytest.mark.subprocess, pytest.mark.multiproc]

SHIM = """#!/bin/sh
# deepspeed --num_gpus N --master_port P SCRIPT ARGS... -> torchrun on this machine
N=1; PORT=29500
while [ $# -gt 0 ]; do
  case "$1" in
    --num_gpus) N="$2"; shift 2;;
    --master_port) PORT="$2"; shift 2;;
    --hostfile|--num_nodes) shift 2;;
    *) break;;
  esac
done
exec "{python}" -m torch.distributed.run --nproc-per-node "$N" --master-port "$PORT" "$@"
"""


def _deepspeed_or_skip():
    if not (TARGETS_ENV / "deepspeed").is_dir():
        pytest.skip(f"DeepSpeed is not installed: `make targets-env` puts it in {TARGETS_ENV.name}")


def _run(out, tmp_path, steps: int):
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "deepspeed").write_text(SHIM.format(python=sys.executable))
    (shim / "deepspeed").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "TRAIN_SCRIPT": str(out / ds_train.NAME),
           "TRAIN_STEPS": str(steps), "CHECKPOINT_DIR": str(tmp_path / "ckpt"), "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join([str(TARGETS_ENV), os.environ.get("PYTHONPATH", "")]),
           "MASTER_PORT": str(29500 + os.getpid() % 1000)}
    r = subprocess.run(["bash", str(out / "deepspeed.sh"), "--steps", str(steps)], env=env, capture_output=True,
                       text=True, timeout=900)
    errors = "\n".join(x for x in r.stderr.splitlines() if "arn" not in x)     # DeepSpeed's warnings left out
    assert r.returncode == 0, r.stdout[-3000:] + errors[-4000:]
    # each rank prints one JSON object; two ranks' writes to the shared pipe may land on one line
    dec = json.JSONDecoder()
    return [dec.raw_decode(r.stdout, m.start())[0] for m in re.finditer(r'\{"rank"', r.stdout)]


# the first run JIT-compiles DeepSpeed's CPU Adam (minutes on a fresh 2-core machine): more than
# make test's 600 s per test
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_deepspeed_zero_runs_and_ranks_agree(zero, tmp_path):
    _deepspeed_or_skip()
    plan = make_plan(gpus=2, gb=4, dp=2, zero=zero, micro_batch=1, grad_accum=2, seq=32)
    out = write(plan, "deepspeed", tmp_path / "out")
    assert (out / ds_train.NAME).exists()
    rows = _run(out, tmp_path, steps=2)
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert {r["world"] for r in rows} == {plan.world_size} and {r["zero"] for r in rows} == {zero}
    assert rows[0]["checksum"] == rows[1]["checksum"]             # data-parallel ranks hold the same weights
    assert all(x == x and abs(x) < 1e4 for r in rows for x in r["losses"])
    assert (tmp_path / "ckpt" / "latest").exists()
    again = _run(out, tmp_path, steps=2)                          # resumes: the step count continues
    assert {r["steps"] for r in again} == {4}
