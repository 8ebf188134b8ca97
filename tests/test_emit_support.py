"""Helpers shared by the emitter tests (no tests here): example plans, writing a target's files,
and running an emitted script with the launchers replaced by a fake that records its argv."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from costmodel.catalog import get_model
from costmodel.specs import ParallelConfig, Workload
from emitters import get
from planner.cli.regen_golden import builtin_plans
from planner.plan.planfile import Plan, default_stages
from costmodel.files.clusters import load_cluster

ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def examples() -> dict[str, Plan]:
    return builtin_plans()


def make_plan(model: str = "tiny-llama", gpus: int = 4, gb: int = 8, seq: int = 64, cluster: str = "cpu",
              gpus_per_node: int | None = None, mode: str = "train", estimate: dict | None = None,
              stages=None, **par) -> Plan:
    c = load_cluster(cluster).with_gpus(gpus)
    if gpus_per_node:
        g = c.groups[0]
        c = dataclasses.replace(c, groups=(dataclasses.replace(g, gpus_per_node=gpus_per_node,
                                                               nodes=gpus // gpus_per_node),))
    m = get_model(model)
    p = ParallelConfig(**par)
    if mode == "infer":
        w = Workload(global_batch=gb, seq_len=seq, mode="infer", prompt_len=seq // 2, output_len=seq - seq // 2)
    else:
        w = Workload(global_batch=gb, seq_len=seq)
    return Plan(model=m, cluster=c, workload=w, parallel=p, stages=stages or default_stages(m.layers, p.pp),
                estimate=estimate or {})


def write(plan: Plan, target: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in get(target).emit(plan).items():
        (out / name).write_text(text)
        if name.endswith((".sh", ".sbatch")):
            (out / name).chmod(0o755)
    return out


FAKE = """#!{python}
import json, os, sys
with open(os.environ["ARGV_OUT"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "env": {{k: v for k, v in os.environ.items()
                                if k.startswith(("ACCELERATE_", "CUDA_DEVICE_MAX", "PYTHONPATH"))}}}}) + "\\n")
"""


def fake_bin(tmp: Path, names: list[str]) -> Path:
    """A folder of fake launchers that append {prog, argv, env} as a JSON line to $ARGV_OUT."""
    b = tmp / "fakebin"
    b.mkdir(exist_ok=True)
    for n in names:
        p = b / n
        p.write_text(FAKE.format(python=sys.executable))
        p.chmod(p.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return b


def run_script(script: Path, fakes: list[str], env: dict | None = None, args: list[str] = ()) -> list[dict]:
    """Run an emitted script with bash; the launchers in ``fakes`` record their arguments instead."""
    tmp = script.parent
    out = tmp / "argv.jsonl"
    if out.exists():
        out.unlink()
    b = fake_bin(tmp.parent, fakes)   # beside the script's folder: tmp_path/fakebin
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "MASTER_", "NODE_RANK", "HEAD_ADDR"))}
    e.update({"PATH": f"{b}:{e.get('PATH', '')}", "ARGV_OUT": str(out), "PYTHON": str(b / "python-fake")}
             if "python-fake" in fakes else {"PATH": f"{b}:{e.get('PATH', '')}", "ARGV_OUT": str(out)})
    e["CHECKPOINT_DIR"] = str(tmp / "checkpoints")     # every training script asks for it
    e.update(env or {})
    r = subprocess.run(["bash", str(script), *args], env=e, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{script.name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return [json.loads(line) for line in out.read_text().splitlines()]


def split_module_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """torchrun argv -> (torchrun's own args incl. -m MODULE, the program's args)."""
    i = argv.index("-m")
    return argv[:i + 2], argv[i + 2:]
