"""A target is one record (planner/plan/targets.py ``REGISTRY``): every registered target has
every part (its capability table with a source per fact, its cost profile, its emitter, its
search hook, and for a training framework how a launcher starts it), and frameworks compose
with launchers (torchrun, Slurm, Kubernetes) when emitting. No solver; the launcher tests
start ``bash -n`` to parse the scripts (subprocess mark)."""
from __future__ import annotations

import dataclasses
import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import emitters
from costmodel.batching import SERVERS
from costmodel.frameworks import FRAMEWORKS
from emitters.slurm import Site
from planner.plan import targets as T
from planner.plan.planfile import read_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "plans"


def _resolve(ref: str):
    mod, _, fn = ref.partition(":")
    return getattr(importlib.import_module(mod), fn)


def missing_parts(r: T.Target) -> list[str]:
    """What record ``r`` lacks; empty when it is complete."""
    out = []
    if r.mode == "train":
        if not isinstance(r.table, T.TrainTarget):
            out.append("a training capability table")
        else:
            for sub in [s for _, _, s in r.table.variants] or [r.table]:
                for field in sorted({c.field for c in T.CAPS}):
                    if not sub.sources.get(field):
                        out.append(f"a source for {field}")
        if r.profile not in FRAMEWORKS:
            out.append(f"a cost profile (costmodel.frameworks has no {r.profile!r})")
        if r.launcher:
            if r.launcher not in emitters.LAUNCHERS:
                out.append(f"a launcher module for {r.launcher!r}")
        elif r.start is None:
            out.append("how a launcher starts it (Start)")
        elif not r.start.source or not r.start.script:
            out.append("Start's script and source")
    else:
        if not isinstance(r.table, T.ServeTarget):
            out.append("a serving capability table")
        else:
            for f in dataclasses.fields(r.table):
                if f.name not in ("name", "summary", "runs", "sources", "mode") and not r.table.sources.get(f.name):
                    out.append(f"a source for {f.name}")
        if r.profile not in SERVERS and r.profile != "static":
            out.append(f"a serving profile (costmodel.batching has no server {r.profile!r})")
    try:
        mod = importlib.import_module(r.emitter)
        for attr in ("emit", "FORMAT", "SUMMARY", "RUN"):
            if not hasattr(mod, attr):
                out.append(f"{r.emitter}.{attr}")
    except ImportError:
        out.append(f"an emitter ({r.emitter} does not import)")
    try:
        if not callable(_resolve(r.search)):
            out.append(f"a search hook ({r.search} is not callable)")
    except (ImportError, AttributeError):
        out.append(f"a search hook ({r.search} does not resolve)")
    return out


@pytest.mark.parametrize("r", T.REGISTRY, ids=lambda r: f"{r.mode}-{r.name}")
def test_every_registered_target_has_every_part(r):
    assert missing_parts(r) == []


@pytest.mark.parametrize("change,lacks", [
    (dict(profile="no-such-framework"), "a cost profile"),
    (dict(emitter="emitters.no_such_module"), "an emitter"),
    (dict(search="planner.search.targets:no_such_function"), "a search hook"),
    (dict(start=None), "how a launcher starts it"),
    (dict(table=dataclasses.replace(T.MEGATRON, sources={k: v for k, v in T.MEGATRON.sources.items() if k != "cp"})),
     "a source for cp"),
])
def test_the_completeness_check_catches_a_missing_part(change, lacks):
    broken = dataclasses.replace(T.record("megatron"), **change)
    assert any(lacks in m for m in missing_parts(broken)), missing_parts(broken)


def test_the_registry_is_the_one_list():
    """Each (name, mode) once; the views and the emitters' list come from it."""
    keys = [(r.name, r.mode) for r in T.REGISTRY]
    assert len(keys) == len(set(keys))
    assert set(T.TRAIN) == {r.name for r in T.records("train")}
    assert set(T.SERVE) == {r.name for r in T.records("infer")}
    assert set(emitters.TARGETS.values()) == {r.emitter for r in T.REGISTRY}
    for r in T.REGISTRY:
        assert T.get(r.name, r.mode) is r.table
        if r.mode == "train":
            assert T.framework_of(r.name) == r.profile


# --------------------------------------------------------------------------------------
# Frameworks x launchers
# --------------------------------------------------------------------------------------

FRAMEWORK_PLANS = {          # an 8-node plan each framework runs (plans/, made by `make plans`)
    "megatron": "megatron/llama-3-70b-64xh100.yaml",
    "torchtitan": "torchtitan/llama-3-70b-64xh100.yaml",
    "deepspeed": "deepspeed/llama-3-70b-64xh100.yaml",
    "accelerate": "accelerate/llama-3-70b-64xh100.yaml",
    "builtin": "builtin/llama-3-70b-64xh100.yaml",
}


def _bash_parses(text: str, tmp_path: Path, name: str) -> None:
    bash = shutil.which("bash")
    assert bash, "bash is needed to parse the scripts"
    f = tmp_path / name
    f.write_text(text)
    r = subprocess.run([bash, "-n", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.subprocess      # bash -n parses the scripts
@pytest.mark.parametrize("framework", sorted(FRAMEWORK_PLANS))
def test_slurm_starts_each_framework_one_task_per_node(framework, tmp_path):
    plan = read_plan(PLANS / FRAMEWORK_PLANS[framework])
    start = T.record(framework).start
    files = emitters.compose(plan, framework, "slurm", time="2-00:00:00", partition="gpu", account="proj-1",
                             exclusive=True)
    sbatch = files[f"{framework}.sbatch"]
    nnodes = plan.world_size // plan.cluster.gpus_per_node
    assert nnodes == 8
    for line in ("--time=2-00:00:00", "--partition=gpu", "--account=proj-1", "--exclusive",
                 f"--nodes={nnodes}", "--ntasks-per-node=1"):
        assert f"#SBATCH {line}\n" in sbatch
    assert f"srun --nodes={nnodes} --ntasks={nnodes} --ntasks-per-node=1" in sbatch
    assert f'"$SUBMIT_DIR/{start.script}"' in sbatch and start.script in files
    script = files[start.script]
    for var in filter(None, (start.node_rank, start.head_addr, start.port, *start.env)):
        assert var in script, f"{start.script} does not read {var}, which the launcher sets"
        assert var in sbatch
    _bash_parses(sbatch, tmp_path, "job.sbatch")
    if framework == "deepspeed":          # through torchrun, not the ssh/pdsh runner
        assert "export DS_LAUNCHER=torchrun" in sbatch
        assert 'if [ "${DS_LAUNCHER:-}" = torchrun ]; then\n  exec torchrun --nnodes 8' in script


@pytest.mark.subprocess      # bash -n parses the scripts
@pytest.mark.parametrize("framework", sorted(FRAMEWORK_PLANS))
def test_kubernetes_starts_each_framework_in_every_pod(framework, tmp_path):
    plan = read_plan(PLANS / FRAMEWORK_PLANS[framework])
    start = T.record(framework).start
    files = emitters.compose(plan, framework, "kubernetes")
    docs = list(yaml.safe_load_all(files[f"{framework}-pytorchjob.yaml"]))
    cm, job = docs
    assert cm["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    own = {k: v for k, v in files.items() if not k.endswith("pytorchjob.yaml")}
    assert cm["data"] == own                      # every file of the framework travels, unchanged
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 8
    for role in ("Master", "Worker"):
        pod = specs[role]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "pytorch"
        cmd = container["args"][0]
        assert cmd.endswith(f"exec bash /tmp/planner-run/{start.script}")
        assert pod["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
        _bash_parses(cmd, tmp_path, f"{role}.sh")


@pytest.mark.subprocess      # bash -n parses the scripts
@pytest.mark.parametrize("framework", sorted(FRAMEWORK_PLANS))
def test_torchrun_launcher_maps_one_set_of_variables(framework, tmp_path):
    plan = read_plan(PLANS / FRAMEWORK_PLANS[framework])
    start = T.record(framework).start
    files = emitters.compose(plan, framework, "torchrun")
    text = files[f"launch-{framework}.sh"]
    assert ': "${NODE_RANK:?' in text and ': "${HEAD_ADDR:?' in text
    assert text.rstrip().endswith(f'exec bash "$HERE/{start.script}" "$@"')
    if start.head_addr != "HEAD_ADDR":
        assert f'export {start.head_addr}="$HEAD_ADDR"' in text
    _bash_parses(text, tmp_path, "launch.sh")


@pytest.mark.parametrize("site,flag", [
    (dict(time="4 hours"), "--time"), (dict(time="04:00:00;rm"), "--time"),
    (dict(partition="gpu\n#SBATCH --uid=0"), "--partition"), (dict(account="a b"), "--account"),
    (dict(partition="$(id)"), "--partition"),
])
def test_site_options_slurm_does_not_take_are_refused(site, flag):
    with pytest.raises(ValueError, match=rf"^{flag} "):
        Site(**site).options()


def test_a_serving_target_or_a_wrapper_has_no_launcher():
    plan = read_plan(PLANS / FRAMEWORK_PLANS["builtin"])
    with pytest.raises(emitters.CannotExpress, match="only training frameworks"):
        emitters.compose(plan, "slurm", "kubernetes")
    with pytest.raises(ValueError, match="site options"):
        emitters.compose(plan, "megatron", "kubernetes", partition="gpu")
