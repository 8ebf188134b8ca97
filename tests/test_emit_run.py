"""The torchrun and Slurm outputs executed for real: the built-in runtime trains tiny-llama on CPU
processes over gloo. The Slurm script runs with ``scontrol`` and ``srun`` replaced by small fakes
that start one "node" (a torchrun agent) per task on this machine."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_emit_support import ROOT, make_plan, write

pytestmark = pytest.mark.multiproc


def _runtime_or_skip():
    """The runtime is part of the project: a failure to import it is a failure, not a skip."""
    import runtime.train  # noqa: F401


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "SLURM_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            del env[k]
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"   # torchrun of this venv
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _summary(path: Path) -> dict:
    assert path.exists(), "the runtime wrote no summary"
    return json.loads(path.read_text())


def test_torchrun_script_trains_a_step(tmp_path):
    _runtime_or_skip()
    plan = make_plan("tiny-llama", gpus=2, gb=4, seq=32, tp=2, micro_batch=2, grad_accum=2)
    out = write(plan, "torchrun", tmp_path / "out")
    summary = tmp_path / "summary.json"
    r = subprocess.run(["bash", str(out / "torchrun.sh"), "--json-out", str(summary), "--device", "cpu"],
                       env=_env(STEPS="1"), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = _summary(summary)
    assert s["world_size"] == 2 and s["steps"][-1] == 1


FAKE_SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST: this machine, once per allocated node
for i in $(seq 1 "$SLURM_JOB_NUM_NODES"); do echo localhost; done
"""

FAKE_SRUN = """#!/bin/bash
# srun --nodes=N --ntasks=N ... cmd: start N tasks here, one per "node", and wait for all of them
n=1
while [[ "$1" == -* ]]; do
  case "$1" in --ntasks=*) n="${1#--ntasks=}";; esac
  shift
done
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 "$@" > "$FAKE_LOG.$i" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""


def test_slurm_script_runs_two_nodes(tmp_path):
    _runtime_or_skip()
    # two "nodes" of one CPU process each: TP 2 across them, c10d rendezvous at the head node
    plan = make_plan("tiny-llama", gpus=2, gpus_per_node=1, gb=4, seq=32, tp=2, micro_batch=2, grad_accum=2)
    out = write(plan, "slurm", tmp_path / "out")
    text = (out / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    fb = tmp_path / "fakebin"
    fb.mkdir()
    for name, body in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (fb / name).write_text(body)
        (fb / name).chmod(0o755)
    summary = tmp_path / "summary.json"
    env = _env(STEPS="1", SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="node[1-2]",
               SLURM_SUBMIT_DIR=str(out), RDZV_PORT=str(_free_port()), FAKE_LOG=str(tmp_path / "task"))
    env["PATH"] = f"{fb}:{env['PATH']}"
    r = subprocess.run(["bash", str(out / "slurm.sbatch"), "--json-out", str(summary), "--device", "cpu"],
                       env=env, cwd=out, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("task.*")))
    assert r.returncode == 0, r.stderr[-2000:] + logs
    s = _summary(summary)
    assert s["world_size"] == 2 and s["steps"][-1] == 1
