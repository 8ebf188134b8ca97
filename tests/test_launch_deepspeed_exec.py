"""DeepSpeed under a cluster launcher starts through torchrun on every node, never through its own
ssh/pdsh runner (issue 22; ``planner.plan.targets.STARTS["deepspeed"]``): the composed sbatch and
PyTorchJob are executed with bash, with srun, scontrol and the launchers replaced by recorders, and
every node's command must be one torchrun with that node's rank. The other frameworks' scripts start
their node's processes themselves (torchrun / accelerate launch), so one srun task per node is each
one's convention; a per-GPU srun task would start nproc copies of torchrun on each node."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

import emitters
from planner.plan.planfile import read_plan

from test_emit_support import fake_bin

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "deepspeed" / "llama-3-70b-64xh100.yaml"
RECORDED = ["torchrun", "deepspeed", "pdsh", "ssh", "mpirun"]

# srun as Slurm runs it for --ntasks-per-node=1: the command once per node, SLURM_NODEID set
SRUN = """#!/bin/bash
n=""
while [[ "${1:-}" == --* ]]; do
  case "$1" in --nodes=*) n="${1#--nodes=}";; esac
  shift
done
echo "{\\"prog\\": \\"srun\\", \\"nodes\\": $n}" >> "$ARGV_OUT"
for ((i = 0; i < n; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" || exit $?; done
"""
SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 2
for i in 0 1 2 3 4 5 6 7; do echo "gpu-node-$i"; done
"""


def _tool(b: Path, name: str, text: str) -> None:
    p = b / name
    p.write_text(text)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def _write(files: dict[str, str], out: Path) -> Path:
    out.mkdir(parents=True)
    for name, text in files.items():
        (out / name).write_text(text)
    return out


def _env(tmp: Path, b: Path, record: Path) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "MASTER_", "NODE_RANK", "SLURM", "DS_"))}
    script = tmp / "train.py"
    script.write_text("# the user's training script\n")
    e.update(PATH=f"{b}:{e['PATH']}", ARGV_OUT=str(record), TRAIN_SCRIPT=str(script), TRAIN_STEPS="100",
             CHECKPOINT_DIR=str(tmp / "ckpt"))
    return e


def _torchruns(record: Path) -> list[dict]:
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert not [c for c in calls if c["prog"] in ("deepspeed", "pdsh", "ssh", "mpirun")], calls
    return [c for c in calls if c["prog"] == "torchrun"]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_slurm_runs_deepspeed_through_torchrun_on_each_node(tmp_path):
    plan = read_plan(PLAN)
    nnodes = plan.world_size // plan.cluster.gpus_per_node
    out = _write(emitters.compose(plan, "deepspeed", "slurm"), tmp_path / "job")
    b = fake_bin(tmp_path, RECORDED)
    _tool(b, "srun", SRUN)
    _tool(b, "scontrol", SCONTROL)
    record = tmp_path / "calls.jsonl"
    e = _env(tmp_path, b, record)
    e.update(SLURM_JOB_NODELIST="gpu-node-[0-7]", SLURM_SUBMIT_DIR=str(out))
    r = subprocess.run(["bash", str(out / "deepspeed.sbatch")], cwd=out, env=e, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    runs = _torchruns(record)
    assert len(runs) == nnodes == 8            # one torchrun per node, not one per GPU
    assert sorted(int(_flag(c["argv"], "--node-rank")) for c in runs) == list(range(nnodes))
    for c in runs:
        a = c["argv"]
        assert (_flag(a, "--nnodes"), _flag(a, "--nproc-per-node")) == (str(nnodes), str(plan.cluster.gpus_per_node))
        assert _flag(a, "--master-addr") == "gpu-node-0"
        assert "--deepspeed" in a and "--deepspeed_config" in a


def test_kubernetes_runs_deepspeed_through_torchrun_in_every_pod(tmp_path):
    from emitters import kubernetes
    plan = read_plan(PLAN)
    files = emitters.compose(plan, "deepspeed", "kubernetes")
    cm, job = yaml.safe_load_all(files["deepspeed-pytorchjob.yaml"])
    mount = _write(cm["data"], tmp_path / "mount")
    b = fake_bin(tmp_path, RECORDED)
    record = tmp_path / "calls.jsonl"
    specs = job["spec"]["pytorchReplicaSpecs"]
    rank = 0
    for role in ("Master", "Worker"):
        cmd = specs[role]["template"]["spec"]["containers"][0]["args"][0]
        for _ in range(specs[role]["replicas"]):
            run_dir = tmp_path / f"pod-{rank}"
            local = cmd.replace(kubernetes.MOUNT, str(mount)).replace(kubernetes.RUN_DIR, str(run_dir))
            e = _env(tmp_path, b, record)
            # what the training operator sets in each pod (pkg/controller.v1/pytorch/envvar.go)
            e.update(PET_NODE_RANK=str(rank), MASTER_ADDR="job-master-0", MASTER_PORT="23456")
            r = subprocess.run(["/bin/sh", "-c", local], env=e, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            rank += 1
    runs = _torchruns(record)
    assert len(runs) == rank == 8
    assert sorted(int(_flag(c["argv"], "--node-rank")) for c in runs) == list(range(8))
    assert {(_flag(c["argv"], "--master-addr"), _flag(c["argv"], "--master-port")) for c in runs} == \
        {("job-master-0", "23456")}
