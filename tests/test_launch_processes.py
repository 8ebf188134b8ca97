"""Processes and checkpoints of ``planner launch`` and ``planner profile`` (issue 15, files part),
with real torchrun and gloo processes on this machine.

* SIGTERM to ``planner launch`` stops torchrun and every worker (checked in /proc by the pids of
  the tree taken before the signal), keeps the last checkpoint intact and exits 143 with a
  message; a torchrun killed outright leaves no worker behind either;
* every socket the launch's processes listen on is loopback (read from /proc/net/tcp{,6} by the
  socket inodes of those processes, so other jobs on the machine do not count); the same for a
  ``planner profile`` run, which SIGTERM then stops;
* a second launch into a checkpoint directory in use is refused (exit 2, naming the holder)
  before it starts anything; a lock whose holder was killed (-9) is free again;
* a launch into another run's checkpoints without ``--resume`` is refused and leaves them as
  they were; ``--overwrite-checkpoints`` replaces them;
* a planted pickle ``.metadata`` is never loaded (its payload would create a file): refused with
  nothing run when it is the only step, skipped for the previous intact step otherwise, also with
  a forged manifest, also by the workers themselves; a corrupted shard of the latest step falls
  back to the step before;
* ``--nproc`` beyond the machine is refused unless ``--force``.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.plan.planfile import write_plan
from runtime.local import make_plan

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD_NAME = "PAYLOAD-RAN"


def _env(extra: dict | None = None) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_"))
         and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GLOO_SOCKET_IFNAME")}
    e["PYTHONPATH"] = str(ROOT)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(extra or {})
    return e


def planner(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=_env(),
                          timeout=timeout, cwd=ROOT)


def start(*args: str, log: Path) -> subprocess.Popen:
    f = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "planner", *args], stdout=subprocess.DEVNULL, stderr=f,
                            env=_env(), cwd=ROOT)


# --------------------------------------------------------------------------------------
# /proc: process trees and listening sockets
# --------------------------------------------------------------------------------------

def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2:].split()
    return None if rest[0] == "Z" else int(rest[1])


def tree(pid: int) -> list[int]:
    parents = {int(p): _ppid(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        kids = [p for p, pp in parents.items() if pp == cur]
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    return _ppid(pid) is not None


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] != "0A" or f[9] not in inodes:      # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((socket.inet_ntop(family, raw), int(hexport, 16)))
    return out


def _is_loopback(addr: str) -> bool:
    import ipaddress
    ip = ipaddress.ip_address(addr)
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the command ended early ({proc.returncode}): "
                        + (log.read_text()[-2000:] if log else ""))
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}" + (": " + log.read_text()[-2000:] if log else ""))


@pytest.fixture(scope="module")
def plan_dp2(tmp_path_factory):
    p = tmp_path_factory.mktemp("plans") / "dp2.yaml"
    write_plan(make_plan("tiny-llama", optimizer="adamw", dp=2, zero=3, grad_accum=4), p)
    return p


def _steps(ck: Path) -> list[str]:
    return sorted(p.name for p in ck.glob("step-*"))


# --------------------------------------------------------------------------------------
# SIGTERM, orphans, loopback
# --------------------------------------------------------------------------------------

@pytest.mark.multiproc
def test_sigterm_stops_every_process_binds_loopback_and_keeps_the_checkpoint(plan_dp2, tmp_path):
    from runtime.checkpoint import find_intact
    ck, log = tmp_path / "ck", tmp_path / "launch.log"
    p = start("launch", str(plan_dp2), "--steps", "400", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
              "--metrics", str(tmp_path / "m.jsonl"), log=log)
    try:
        _wait_for(lambda: (ck / "step-00000002" / "manifest.json").exists(), 180, "the first checkpoint", p, log)
        pids = tree(p.pid)
        assert len(pids) >= 3, pids               # torchrun (runtime.launcher) and two workers
        socks = listening([p.pid] + pids)
        assert len(socks) >= 3, socks             # torchrun's stores and the workers' gloo sockets
        assert all(_is_loopback(a) for a, _ in socks), f"listening beyond loopback: {socks}"
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = log.read_text()
    assert rc == 143, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "SIGTERM" in last and "stopped torchrun and its workers" in last and "last complete checkpoint" in last
    time.sleep(0.5)
    assert [q for q in pids if alive(q)] == [], "processes outlived the launch"
    latest = find_intact(ck)                       # the last checkpoint stays, intact
    assert latest is not None and latest.name in last
    r = planner("launch", str(plan_dp2), "--steps", str(int(latest.name[-8:]) + 1), "--checkpoint-dir", str(ck),
                "--resume", "--json", "--metrics", str(tmp_path / "m2.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["resumed_from_step"] == int(latest.name[-8:])


@pytest.mark.multiproc
def test_a_killed_torchrun_leaves_no_worker(plan_dp2, tmp_path):
    log = tmp_path / "launch.log"
    p = start("launch", str(plan_dp2), "--steps", "400", "--metrics", str(tmp_path / "m.jsonl"), log=log)
    try:
        _wait_for(lambda: (tmp_path / "m.jsonl").exists() and (tmp_path / "m.jsonl").read_text().count("\n") >= 2,
                  180, "two steps", p, log)
        pids = tree(p.pid)
        agent = [q for q in pids if _ppid(q) == p.pid]
        assert len(agent) == 1 and len(pids) >= 3
        os.kill(agent[0], signal.SIGKILL)       # torchrun dies without stopping its workers
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 1, log.read_text()[-2000:]
    time.sleep(0.5)
    assert [q for q in pids if alive(q)] == [], "workers outlived their torchrun"


@pytest.mark.multiproc
def test_profile_binds_loopback_and_stops_on_sigterm(tmp_path):
    log, out = tmp_path / "profile.log", tmp_path / "prof"
    p = start("profile", "--nproc", "2", "--out", str(out), "--timeout", "60", log=log)
    try:
        def ranks_listening():
            pids = tree(p.pid)
            socks = listening([p.pid] + pids)
            return (pids, socks) if len(pids) >= 2 and len(socks) >= 2 else None
        pids, socks = _wait_for(ranks_listening, 120, "the ranks' sockets", p, log)
        assert all(_is_loopback(a) for a, _ in socks), f"listening beyond loopback: {socks}"
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 143, log.read_text()[-2000:]
    assert "SIGTERM" in log.read_text()
    time.sleep(0.5)
    assert [q for q in pids if alive(q)] == [], "profile ranks outlived the command"


# --------------------------------------------------------------------------------------
# One run per directory
# --------------------------------------------------------------------------------------

@pytest.mark.multiproc
def test_second_launch_into_a_directory_in_use_is_refused(plan_dp2, tmp_path):
    ck, log = tmp_path / "ck", tmp_path / "a.log"
    a = start("launch", str(plan_dp2), "--steps", "400", "--checkpoint-dir", str(ck), "--checkpoint-every", "50",
              "--metrics", str(tmp_path / "a.jsonl"), log=log)
    try:
        _wait_for(lambda: (ck / ".lock").exists() and str(a.pid) in (ck / ".lock").read_text(), 60, "the lock", a, log)
        t0 = time.perf_counter()
        for extra in ([], ["--resume"]):
            r = planner("launch", str(plan_dp2), "--steps", "2", "--checkpoint-dir", str(ck), *extra,
                        "--metrics", str(tmp_path / "b.jsonl"))
            assert r.returncode == 2, r.stderr[-2000:]
            assert f"in use by pid {a.pid}" in r.stderr and "runtime:" not in r.stderr, r.stderr
        assert time.perf_counter() - t0 < 30 and not (tmp_path / "b.jsonl").exists()
    finally:
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=60)
    # a holder killed with -9 frees the lock (the kernel drops it): no stale lock
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from runtime.lock import DirectoryLock; DirectoryLock(sys.argv[2]).acquire(); "
                               "print('locked', flush=True); time.sleep(600)", str(ROOT), str(ck)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    from runtime.lock import CheckpointDirBusy, DirectoryLock
    with pytest.raises(CheckpointDirBusy, match=f"pid {holder.pid}"):
        DirectoryLock(ck).acquire()
    holder.kill()
    holder.wait()
    DirectoryLock(ck).acquire().release()


@pytest.mark.multiproc
def test_another_runs_checkpoints_are_refused_without_resume(plan_dp2, tmp_path):
    ck = tmp_path / "ck"
    r = planner("launch", str(plan_dp2), "--steps", "4", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                "--metrics", str(tmp_path / "a.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    before = {p.relative_to(ck): p.read_bytes() for p in ck.rglob("*") if p.is_file() and p.name != ".lock"}
    assert _steps(ck) == ["step-00000002", "step-00000004"]
    t0 = time.perf_counter()
    r = planner("launch", str(plan_dp2), "--steps", "6", "--checkpoint-dir", str(ck),
                "--metrics", str(tmp_path / "b.jsonl"))
    assert r.returncode == 2 and "already holds 2 checkpoint(s)" in r.stderr and "--resume" in r.stderr, r.stderr
    assert "--overwrite-checkpoints" in r.stderr and "runtime:" not in r.stderr
    assert time.perf_counter() - t0 < 30
    after = {p.relative_to(ck): p.read_bytes() for p in ck.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before, "a refused launch changed the other run's checkpoints"
    r = planner("launch", str(plan_dp2), "--steps", "3", "--checkpoint-dir", str(ck), "--overwrite-checkpoints",
                "--json", "--metrics", str(tmp_path / "c.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "removed" in r.stderr and json.loads(r.stdout)["resumed_from_step"] is None
    assert _steps(ck) == ["step-00000003"]


# --------------------------------------------------------------------------------------
# Checkpoints: planted pickles, forged manifests, corrupted shards
# --------------------------------------------------------------------------------------

class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(step: Path, marker: Path, forge_manifest: bool = False) -> None:
    data = pickle.dumps(_Payload(str(marker)))
    (step / ".metadata").write_bytes(data)
    if forge_manifest:                      # the attacker rewrites the manifest to match
        m = json.loads((step / "manifest.json").read_text())
        m["files"][".metadata"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (step / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def saved(plan_dp2, tmp_path_factory):
    """A real run's checkpoint directory (steps 2 and 4) and its uninterrupted losses (6 steps)."""
    d = tmp_path_factory.mktemp("saved")
    r = planner("launch", str(plan_dp2), "--steps", "4", "--checkpoint-dir", str(d / "ck"), "--checkpoint-every",
                "2", "--json", "--metrics", str(d / "m.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "ck"


def _copy(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.mark.multiproc
def test_planted_pickle_is_never_loaded(plan_dp2, saved, tmp_path):
    marker = tmp_path / PAYLOAD_NAME
    # the only step planted (its manifest forged too, or not): refused before any process starts
    for forge in (False, True):
        ck = _copy(saved, tmp_path / f"only-{forge}")
        import shutil
        shutil.rmtree(ck / "step-00000002")
        _plant(ck / "step-00000004", marker, forge_manifest=forge)
        t0 = time.perf_counter()
        r = planner("launch", str(plan_dp2), "--steps", "6", "--checkpoint-dir", str(ck), "--resume",
                    "--metrics", str(tmp_path / f"m{forge}.jsonl"))
        assert r.returncode == 2, r.stderr[-2000:]
        assert "no intact checkpoint" in r.stderr and "nothing was loaded" in r.stderr
        assert ("posix.system" in r.stderr) if forge else ("manifest" in r.stderr)
        assert "runtime:" not in r.stderr and time.perf_counter() - t0 < 20 and "Traceback" not in r.stderr
        assert not marker.exists(), "the planted pickle ran"
    # the latest step planted, an intact one before it: skipped, resumed from step 2, payload never run
    ck = _copy(saved, tmp_path / "latest")
    _plant(ck / "step-00000004", marker, forge_manifest=True)
    r = planner("launch", str(plan_dp2), "--steps", "3", "--checkpoint-dir", str(ck), "--resume", "--json",
                "--metrics", str(tmp_path / "m.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "skipping checkpoint" in r.stderr and "step-00000004" in r.stderr and "posix.system" in r.stderr
    assert json.loads(r.stdout)["resumed_from_step"] == 2
    assert not marker.exists(), "the planted pickle ran"


@pytest.mark.multiproc
def test_workers_refuse_a_planted_index_on_their_own(plan_dp2, saved, tmp_path):
    """Without the launcher's check (``python -m runtime.train``, as the emitted scripts run it):
    a rank-local ``__0.metadata`` planted in an intact step, and a forged ``.metadata``."""
    from planner.plan.planfile import read_plan
    from runtime.local import JobFailed, LocalPool
    from runtime.train import Options
    marker = tmp_path / PAYLOAD_NAME
    plan = read_plan(plan_dp2)
    ck = _copy(saved, tmp_path / "ck")
    import shutil
    shutil.rmtree(ck / "step-00000002")
    (ck / "step-00000004" / "__0.metadata").write_bytes(pickle.dumps(_Payload(str(marker))))
    with LocalPool(2) as pool:
        with pytest.raises(JobFailed) as e:
            pool.run(plan, Options(steps=5, quiet=True, checkpoint_dir=str(ck), resume=True))
    assert "not in its manifest: __0.metadata" in str(e.value) and not marker.exists()
    (ck / "step-00000004" / "__0.metadata").unlink()
    _plant(ck / "step-00000004", marker, forge_manifest=True)
    with LocalPool(2) as pool:
        with pytest.raises(JobFailed) as e:
            pool.run(plan, Options(steps=5, quiet=True, checkpoint_dir=str(ck), resume=True))
    assert "posix.system" in str(e.value) and not marker.exists()
    # and the reader itself refuses it, even if asked to load that step directly
    from runtime.manifest import UnsafeCheckpoint, safe_reader
    with pytest.raises(UnsafeCheckpoint, match="posix.system"):
        safe_reader(ck / "step-00000004").read_metadata()
    assert not marker.exists()


@pytest.mark.multiproc
def test_corrupted_latest_shard_falls_back(plan_dp2, saved, tmp_path):
    from planner.plan.planfile import read_plan
    from runtime.local import LocalPool
    from runtime.train import Options
    ck = _copy(saved, tmp_path / "ck")
    shard = sorted((ck / "step-00000004").glob("__1_*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01                    # one bit, in the middle of a tensor
    shard.write_bytes(bytes(data))
    plan = read_plan(plan_dp2)
    with LocalPool(2) as pool:
        ref = pool.run(plan, Options(steps=4, quiet=True))["losses"]
    r = planner("launch", str(plan_dp2), "--steps", "4", "--checkpoint-dir", str(ck), "--resume", "--json",
                "--metrics", str(tmp_path / "m.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"skipping checkpoint {ck / 'step-00000004'}" in r.stderr and shard.name in r.stderr
    out = json.loads(r.stdout)
    assert out["resumed_from_step"] == 2
    assert max(abs(a - b) for a, b in zip(out["losses"], ref)) <= 1e-6     # steps 3, 4 retrained from step 2


# --------------------------------------------------------------------------------------
# Bounds
# --------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_nproc_beyond_the_machine_is_refused(tmp_path):
    from planner.cli.procs import CPU_PER_CORE, cores
    n = CPU_PER_CORE * cores() + 1
    t0 = time.perf_counter()
    r = planner("profile", "--nproc", str(n), "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and "--force" in r.stderr and f"{cores()}-core" in r.stderr, r.stderr
    # 1,024: the most --nproc takes at all (flagcheck); its processes' memory is more than any such machine has
    r = planner("profile", "--nproc", "1024", "--force", "--out", str(tmp_path / "p"))
    assert r.returncode == 2 and "GiB" in r.stderr and "available" in r.stderr, r.stderr   # memory: not forceable
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "p" / "raw").exists()
    p = tmp_path / "big.yaml"
    write_plan(make_plan("tiny-llama", dp=n, grad_accum=1, global_batch=n), p)
    r = planner("launch", str(p), "--device", "cpu", "--steps", "1", "--metrics", str(tmp_path / "m.jsonl"))
    if n <= 16:
        assert r.returncode == 2 and "--force" in r.stderr and "per core" in r.stderr, r.stderr
    assert not (tmp_path / "m.jsonl").exists()
