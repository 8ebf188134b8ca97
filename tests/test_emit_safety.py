"""Emitted files that cannot hurt (issue 15, files part).

* a model, cluster or node-group name holding a newline, ``$(touch ...)`` and backquotes is inert
  in every emitted shell script: ``bash -n`` parses it, executing the script (launchers faked)
  creates no file, and the name reaches the launcher as one literal value where it is one;
  the Kubernetes YAML gains no key from it;
* ``planner emit`` never overwrites a file without ``--force`` (and keeps the other files with it);
* an emit killed with ``kill -9`` half-way leaves the old folder exactly, never a mix of two plans;
* a symbolic link, FIFO or device where an output goes is refused (exit 2), for ``emit``,
  ``plan --out`` and ``--csv``; outputs get the user's umask.
"""
from __future__ import annotations

import copy
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from emitters import get
from planner.plan.planfile import read_plan, write_plan
from test_emit_support import ROOT, examples, make_plan, run_script

pytestmark = pytest.mark.subprocess     # the emitted scripts run under bash

EVIL = "evil\n$(touch PWNED1)\ntouch PWNED2 `touch PWNED3`; touch PWNED4 \u2028touch PWNED5 '\"x"


def _renamed(obj, **fields):
    """A copy of a frozen spec with other field values, set past its validation: the emitters must
    be safe even with a name no loader would accept."""
    new = copy.copy(obj)                # no __post_init__: the copy is not validated again
    for k, v in fields.items():
        object.__setattr__(new, k, v)
    new.__dict__.pop("_hash", None)
    return new


def _hostile(plan):
    groups = tuple(_renamed(g, name=f"g{i}\ntouch PWNED6") for i, g in enumerate(plan.cluster.groups))
    return _renamed(plan, model=_renamed(plan.model, name=EVIL),
                    cluster=_renamed(plan.cluster, name="cl\n$(touch PWNED7)", groups=groups))


def _write(files: dict[str, str], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    return out


def _exposed(script: str) -> list[int]:
    """Offsets of "PWNED" that bash would read as code: not in a comment, not in single quotes."""
    out, i, n, state = [], 0, len(script), "code"
    while i < n:
        c = script[i]
        if state == "code":
            if script.startswith("PWNED", i):
                out.append(i)
            if c == "#" and (i == 0 or script[i - 1] in " \t\n;"):
                j = script.find("\n", i)
                i = n if j < 0 else j
                continue
            if c == "'":
                state = "squote"
            elif c == '"':
                state = "dquote"
            elif c == "\\":
                i += 1
        elif state == "squote":
            if c == "'":
                state = "code"
        else:                                   # double quotes expand $(...) and backquotes
            if script.startswith("PWNED", i):
                out.append(i)
            if c == "\\":
                i += 1
            elif c == '"':
                state = "code"
        i += 1
    return out


def _pwned(tmp: Path, *dirs: Path) -> list[str]:
    """Files the payloads would create: anywhere under the test's folder, or in the folders the
    scripts ran from."""
    return sorted(str(p) for p in list(tmp.rglob("PWNED*")) + [q for d in dirs for q in d.glob("PWNED*")])


TRAIN_TARGETS = ["torchrun", "slurm", "megatron", "deepspeed", "accelerate", "torchtitan"]
SERVE_TARGETS = [("vllm", "vllm.sh", ["vllm"]), ("sglang", "sglang.sh", ["python-fake"]),
                 ("tensorrt-llm", "trtllm.sh", ["trtllm-serve"])]


def _plan_for(target: str):
    """The first example plan (``emitters.regen_golden``) the target writes, with hostile names."""
    from emitters.base import CannotExpress
    for plan in examples().values():
        try:
            get(target).emit(plan)
        except CannotExpress:
            continue
        hostile = _hostile(plan)
        return hostile, get(target).emit(hostile)
    pytest.fail(f"no example plan that {target} writes")


@pytest.mark.parametrize("target", TRAIN_TARGETS + [t for t, _, _ in SERVE_TARGETS] + ["kubernetes"])
def test_hostile_names_parse_and_stay_comments(target, tmp_path):
    plan, files = _plan_for(target)
    out = _write(files, tmp_path / "out")
    scripts = [n for n in files if n.endswith((".sh", ".sbatch"))]
    for name in scripts:
        text = files[name]
        r = subprocess.run(["bash", "-n", str(out / name)], capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        # the hostile text appears only in comments or inside single quotes (where bash expands nothing)
        assert _exposed(text) == [], f"{name}: hostile text outside comments and single quotes"
    if target == "kubernetes":
        docs = list(yaml.safe_load_all(files["pytorchjob.yaml"]))
        assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"]
        assert set(docs[1]) == {"apiVersion", "kind", "metadata", "spec"}
        assert docs[1]["metadata"]["name"].replace("-", "").isalnum()
        inner = yaml.safe_load(docs[0]["data"]["plan.yaml"])
        assert inner["model"]["name"] == EVIL        # the plan itself keeps the name, as data
    assert _pwned(tmp_path, ROOT) == []


def test_hostile_names_executed_create_nothing(tmp_path):
    """Run the headers and bodies for real, launchers faked: nothing is created, and the model
    name reaches ``vllm serve`` as one literal argument."""
    work = tmp_path / "run"
    work.mkdir()
    train = _hostile(make_plan("tiny-llama", gpus=2, gb=4, seq=32, tp=2, micro_batch=2, grad_accum=2))
    out = _write(get("torchrun").emit(train), work / "torchrun")
    calls = run_script(out / "torchrun.sh", ["torchrun"], env={"STEPS": "1", "PYTHONPATH": str(ROOT)})
    assert calls and calls[0]["prog"] == "torchrun"
    rdzv = calls[0]["argv"][calls[0]["argv"].index("--rdzv-id") + 1]
    assert rdzv.replace("-", "").isalnum() and rdzv.isascii()
    serve = _hostile(make_plan("tiny-llama", gpus=2, gb=4, seq=32, mode="infer", tp=2, micro_batch=2))
    for target, script, fakes in SERVE_TARGETS:
        out = _write(get(target).emit(serve), work / target)
        # a plan without a Hugging Face id stops and asks for MODEL (never a catalog nickname);
        # given the hostile text as MODEL, the server gets it as one argument, byte for byte
        calls = run_script(out / script, fakes, env={"MODEL": EVIL})
        argv = calls[0]["argv"]
        assert EVIL in argv, (target, argv)
    assert _pwned(tmp_path, ROOT, Path.cwd()) == []


# --------------------------------------------------------------------------------------
# planner emit: no overwrite without --force, atomic folders
# --------------------------------------------------------------------------------------

def _planner(*args: str, env: dict | None = None, umask: int | None = None, **kw) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.update(env or {})
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=e,
                          cwd=kw.pop("cwd", ROOT), preexec_fn=pre, timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture(scope="module")
def two_plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    a, b = d / "a.yaml", d / "b.yaml"
    write_plan(make_plan("tiny-llama", gpus=2, gb=4, seq=32, dp=2, micro_batch=2, grad_accum=1), a)
    write_plan(make_plan("tiny-llama", gpus=4, gb=8, seq=64, tp=2, dp=2, micro_batch=2, grad_accum=2), b)
    return a, b


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_emit_does_not_overwrite_without_force(two_plans, tmp_path):
    a, b = two_plans
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    (out / "torchrun.sh").write_text("echo mine\n")
    r = _planner("emit", str(a), "--target", "torchrun", "--out", str(out))
    assert r.returncode == 2 and "README.md" in r.stderr and "--force" in r.stderr, r.stderr
    assert (out / "README.md").read_text() == "my notes\n" and (out / "torchrun.sh").read_text() == "echo mine\n"
    # the same plan again into its own folder changes nothing, so it needs no --force
    fresh = tmp_path / "fresh"
    assert _planner("emit", str(a), "--target", "torchrun", "--out", str(fresh)).returncode == 0
    assert _planner("emit", str(a), "--target", "torchrun", "--out", str(fresh)).returncode == 0
    # another plan into it would change torchrun.sh and plan.yaml: refused, then forced
    r = _planner("emit", str(b), "--target", "torchrun", "--out", str(fresh))
    assert r.returncode == 2 and "plan.yaml" in r.stderr and "torchrun.sh" in r.stderr
    (fresh / "notes.txt").write_text("keep me\n")
    r = _planner("emit", str(b), "--target", "torchrun", "--out", str(fresh), "--force")
    assert r.returncode == 0, r.stderr
    assert read_plan(fresh / "plan.yaml").world_size == 4
    assert (fresh / "notes.txt").read_text() == "keep me\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]     # no temporary folder left


@pytest.mark.multiproc
def test_emit_killed_half_way_leaves_the_old_folder(two_plans, tmp_path):
    a, b = two_plans
    out = tmp_path / "out"
    assert _planner("emit", str(a), "--target", "all", "--out", str(out)).returncode == 4   # partial: some refuse
    (out / "notes.txt").write_text("user file\n")
    old = _snapshot(out)
    assert len(old) >= 5
    # the new plan's files go in slowly (0.4 s each): kill -9 once two are in the temporary folder
    e = dict(os.environ, PYTHONPATH=str(ROOT), PLANNER_TEST_WRITE_PAUSE_S="0.4")
    p = subprocess.Popen([sys.executable, "-m", "planner", "emit", str(b), "--target", "all", "--out", str(out),
                          "--force"], env=e, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    stage = []
    while time.time() < deadline:
        stage = [d for d in tmp_path.glob(".out.tmp-*") if len([f for f in d.iterdir()]) >= 2]
        if stage:
            break
        time.sleep(0.02)
    assert stage, "the emit never started writing"
    written = {f.name for f in stage[0].iterdir()}
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert _snapshot(out) == old, "a killed emit changed the folder"
    assert written & set(old)            # it had written files of the same names, elsewhere
    # finished, it is the new plan's folder, the user's file kept
    r = _planner("emit", str(b), "--target", "all", "--out", str(out), "--force")
    assert r.returncode == 4, r.stderr           # partial: some targets refuse
    new = _snapshot(out)
    assert new != old and new["notes.txt"] == b"user file\n"
    assert read_plan(out / "plan.yaml").world_size == 4
    # killed at arbitrary moments (no pause): always one plan or the other, whole
    states = {tuple(sorted(old.items())), tuple(sorted(new.items()))}
    for i, delay in enumerate([0.3, 0.6, 0.9, 1.2, 1.5]):
        src = b if i % 2 == 0 else a
        p = subprocess.Popen([sys.executable, "-m", "planner", "emit", str(src), "--target", "all", "--out",
                              str(out), "--force"], env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert tuple(sorted(_snapshot(out).items())) in states, f"mixed folder after a kill at {delay} s"


# --------------------------------------------------------------------------------------
# Outputs only to regular files, with the user's umask
# --------------------------------------------------------------------------------------

PLAN_ARGS = ["plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "2", "--global-batch", "8",
             "--seq-len", "64"]


def test_plan_out_refuses_fifo_device_and_symlink(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    for flag, path, kind in [("--out", fifo, "FIFO"), ("--csv", fifo, "FIFO"), ("--out", link, "symbolic link"),
                             ("--out", "/dev/null", "character device"), ("--csv", "/dev/null", "character device")]:
        r = _planner(*PLAN_ARGS, flag, str(path), timeout=60)
        assert r.returncode == 2, (flag, path, r.stderr)
        assert kind in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and target.read_text() == "precious\n"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    # emit: a link where a file goes, and a link as the folder
    plan = tmp_path / "p.yaml"
    write_plan(make_plan("tiny-llama", gpus=2, gb=4, seq=32, dp=2, micro_batch=2, grad_accum=1), plan)
    out = tmp_path / "out"
    out.mkdir()
    (out / "torchrun.sh").symlink_to(target)
    r = _planner("emit", str(plan), "--target", "torchrun", "--out", str(out), "--force")
    assert r.returncode == 2 and "symbolic link" in r.stderr and target.read_text() == "precious\n"
    (tmp_path / "outlink").symlink_to(out)
    r = _planner("emit", str(plan), "--target", "torchrun", "--out", str(tmp_path / "outlink"), "--force")
    assert r.returncode == 2 and "symbolic link" in r.stderr


@pytest.mark.parametrize("mask,want,want_x", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)])
def test_outputs_follow_the_umask(mask, want, want_x, tmp_path):
    out, csv = tmp_path / "plan.yaml", tmp_path / "cands.csv"
    r = _planner(*PLAN_ARGS, "--out", str(out), "--csv", str(csv), umask=mask, timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == want and stat.S_IMODE(csv.stat().st_mode) == want
    r = _planner("emit", str(out), "--target", "torchrun", "--out", str(tmp_path / "emit"), umask=mask)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "emit" / "plan.yaml").stat().st_mode) == want
    assert stat.S_IMODE((tmp_path / "emit" / "torchrun.sh").stat().st_mode) == want_x
    assert stat.S_IMODE((tmp_path / "emit").stat().st_mode) == want_x


# --------------------------------------------------------------------------------------
# Generated Python run under an audit hook (issue 21, part 1)
# --------------------------------------------------------------------------------------

# Run in a fresh interpreter: the modules the job imports are imported first, then an audit hook
# (sys.addaudithook, PEP 578) records every event that a name turned code would need: starting a
# process, compiling or executing code that is not the job file itself, opening a file for
# writing, deleting or renaming a file, a network connection, loading a native library. Then the job
# module is imported (its top level runs) and its job function is called.
AUDITED_RUN = r'''
import ast, importlib, json, os, sys
job, targets_env = sys.argv[1], sys.argv[2]
sys.path.insert(0, targets_env)
sys.path.insert(0, os.path.dirname(job))
sys.dont_write_bytecode = True
name = os.path.basename(job)[:-3]
for node in ast.parse(open(job).read()).body:
    if isinstance(node, ast.ImportFrom):
        importlib.import_module(node.module)
bad = []
FORBIDDEN = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
             "subprocess.Popen", "ctypes.dlopen", "socket.connect", "socket.bind", "os.remove", "os.rename",
             "os.rmdir", "shutil.rmtree", "os.kill", "os.truncate", "os.chmod", "os.symlink", "os.link",
             "urllib.Request", "builtins.input", "webbrowser.open")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
ours = os.path.realpath(job)
def hook(event, args):
    if event in FORBIDDEN:
        bad.append(f"{event} {args!r:.200}")
        raise PermissionError(event)
    if event == "open":
        path, mode, flags = args
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS:
            bad.append(f"open for writing {path!r} {mode!r}")
            raise PermissionError(event)
    if event == "compile":
        source, filename = args
        if filename is None or os.path.realpath(str(filename)) != ours:
            bad.append(f"compile of foreign code from {filename!r}: {source!r:.120}")
            raise PermissionError(event)
    if event == "exec":
        code = args[0]
        if os.path.realpath(code.co_filename) != ours:
            bad.append(f"exec of code from {code.co_filename!r}")
            raise PermissionError(event)
sys.addaudithook(hook)
error = None
try:
    module = importlib.import_module(name)
    config = getattr(module, sys.argv[3])()
except BaseException as e:          # a refusal by the hook surfaces here; report it with the events
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"bad": bad, "error": error}))
'''


def _audited(job: Path, function: str) -> dict:
    import json as _json
    env_dir = ROOT / ".venv-targets"
    r = subprocess.run([sys.executable, "-c", AUDITED_RUN, str(job), str(env_dir), function],
                       capture_output=True, text=True, cwd=job.parent, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return _json.loads(r.stdout.strip().splitlines()[-1])


PY_PAYLOAD = 'cpu"""; __import__("os").system("touch PWNED8"); """'


def test_torchtitan_job_runs_under_audit_hook(tmp_path):
    """The issue's payload (a ``\"\"\"`` in the cluster and model names) and the hostile name set, in
    the emitted torchtitan module: importing it and building its config with torchtitan 0.3.0 starts
    nothing, compiles nothing foreign, writes nothing, and creates no PWNED file."""
    if not (ROOT / ".venv-targets" / "torchtitan").is_dir():
        if (ROOT / ".venv-targets" / ".installed").exists():
            pytest.fail("torchtitan is missing from .venv-targets")
        pytest.skip("torchtitan is not installed: `make targets-env` puts it in .venv-targets")
    from emitters import torchtitan
    plan, _ = _plan_for("torchtitan")
    for i, (model_name, cluster_name) in enumerate([(PY_PAYLOAD, PY_PAYLOAD), (EVIL, "cl\n$(touch PWNED7)")]):
        hostile = _renamed(plan, model=_renamed(plan.model, name=model_name),
                           cluster=_renamed(plan.cluster, name=cluster_name))
        out = _write(torchtitan.emit(hostile), tmp_path / f"job{i}")
        job = out / f"{torchtitan.JOB_MODULE}.py"
        got = _audited(job, torchtitan.JOB_FUNCTION)
        assert got == {"bad": [], "error": None}, got
    assert _pwned(tmp_path, ROOT) == []


def test_audit_hook_catches_an_injected_module(tmp_path):
    """The hook is not blind: the same run over a module that does what the payload did (the
    pre-fix text) reports it and creates nothing."""
    if not (ROOT / ".venv-targets" / "torchtitan").is_dir():
        pytest.skip("torchtitan is not installed: `make targets-env` puts it in .venv-targets")
    job = tmp_path / "evil_job.py"
    job.write_text('"""doc"""; __import__("os").system("touch PWNED9"); """"""\n'
                   'open("PWNED10", "w")\ndef planner_job():\n    return None\n')
    got = _audited(job, "planner_job")
    assert any(b.startswith("os.system") for b in got["bad"]), got
    assert got["error"] and "PermissionError" in got["error"]
    assert _pwned(tmp_path, ROOT) == []
