"""A node lost mid-run, with real processes on three "nodes": network namespaces of two CPU
processes each, on veth links through a bridge (in a fourth namespace). Every node runs
``planner launch PLAN --nnodes 3 --node-rank i ... --on-failure replan`` (torchrun, c10d
rendezvous); the test kills every process of node 2 at step 7 or later. The survivors must
agree that it is gone, replan for two nodes, write the new plan to disk, resume from the last
intact checkpoint with resharding, and finish with the losses of the uninterrupted run (within
1e-4); no rank is left running and the checkpoints are intact.

Traffic stays on loopback and inside the namespaces this test makes (addresses from
10.232.0.0/16, which exist only there); they are removed at the end, pass or fail. Skips cleanly
without root or ``ip netns`` (as ``test_profile_netns``).
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.plan.planfile import read_plan, write_plan
from runtime.checkpoint import find_intact, read_meta
from runtime.local import LocalPool, make_plan
from runtime.manifest import verify
from runtime.train import Options

pytestmark = [pytest.mark.netns, pytest.mark.multiproc]
ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY, KILL_AT = 15, 3, 7


def _ip(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *cmd], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def nodes_on_a_bridge(n: int):
    """Yield ``[(netns, address)] * n``: each namespace has ``pveth0`` (its end of a veth whose
    other end is on bridge ``br0`` in a hub namespace) and loopback up."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip"):
        pytest.skip("needs iproute2 (ip)")
    tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"
    sub = random.randrange(1, 250)
    hub = f"pmh{tag}"
    names = [f"pm{i}{tag}" for i in range(n)]
    addrs = [f"10.232.{sub}.{i + 1}" for i in range(n)]
    made: list[str] = []
    try:
        for ns in [hub] + names:
            r = _ip("netns", "add", ns)
            if r.returncode:
                pytest.skip(f"ip netns add is not allowed here: {r.stderr.strip()}")
            made.append(ns)
        steps = [("-n", hub, "link", "add", "br0", "type", "bridge"), ("-n", hub, "link", "set", "br0", "up")]
        for i, (ns, addr) in enumerate(zip(names, addrs)):
            a, b = f"pmn{i}{tag}", f"pmb{i}{tag}"
            steps += [("link", "add", a, "type", "veth", "peer", "name", b),
                      ("link", "set", a, "netns", ns), ("link", "set", b, "netns", hub),
                      ("-n", hub, "link", "set", b, "master", "br0"), ("-n", hub, "link", "set", b, "up"),
                      ("-n", ns, "link", "set", a, "name", "pveth0"),
                      ("-n", ns, "addr", "add", f"{addr}/24", "dev", "pveth0"),
                      ("-n", ns, "link", "set", "pveth0", "up"), ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            r = _ip(*step)
            if r.returncode:
                pytest.skip(f"cannot build the bridge ({' '.join(step)}): {r.stderr.strip()}")
        yield list(zip(names, addrs))
    finally:
        for ns in made:
            for pid in _pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _ip("netns", "del", ns)


def _pids(ns: str) -> list[int]:
    r = _ip("netns", "pids", ns)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def _last_step(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    steps = [json.loads(line).get("step", 0) for line in metrics.read_text().splitlines() if line.strip()]
    return max([s for s in steps if s] or [0])


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The plan (tiny-llama as tp2 x dp3 on 3 nodes of 2) and its uninterrupted losses (loopback)."""
    from costmodel.files.clusters import cluster_from_dict
    cluster = cluster_from_dict({"name": "cpu-3x2", "extends": "cpu", "gpus_per_node": 2, "nodes": 3})
    plan = make_plan("tiny-llama", optimizer="adamw", global_batch=12, tp=2, dp=3, grad_accum=4, cluster=cluster)
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    with LocalPool(6, timeout_s=150) as pool:
        ref = pool.run(plan, Options(steps=STEPS, quiet=True))["losses"]
    return plan, ref


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_lost_node_is_replanned_away_and_the_loss_curve_continues(tmp_path, how, job):
    """``killed``: every process of node 2 gets SIGKILL (its sockets close). ``frozen``: every
    process of node 2 gets SIGSTOP (its agent and ranks stop answering but hold their sockets
    open): the survivors' collectives time out after ``--dead-after 6s`` and the rendezvous drops
    the silent node."""
    plan, ref = job
    p = tmp_path / "tp2dp3.yaml"
    write_plan(plan, p)

    ck = tmp_path / "ck"
    with nodes_on_a_bridge(3) as nodes:
        host_addr = nodes[0][1]
        port = str(random.randrange(20000, 40000))
        procs, logs = [], []
        for i, (ns, addr) in enumerate(nodes):
            cmd = ["ip", "netns", "exec", ns, "env", "GLOO_SOCKET_IFNAME=pveth0", "OMP_NUM_THREADS=1",
                   f"PYTHONPATH={ROOT}", sys.executable, "-m", "planner", "launch", str(p), "--nnodes", "3",
                   "--node-rank", str(i), "--nproc-per-node", "2", "--rdzv-endpoint", f"{host_addr}:{port}",
                   "--local-addr", addr, "--steps", str(STEPS), "--checkpoint-dir", str(ck),
                   "--checkpoint-every", str(EVERY), "--on-failure", "replan", "--dead-after", "6s",
                   "--metrics", str(tmp_path / f"m{i}.jsonl"), "--timeout", "150", "--device", "cpu",
                   *(["--json"] if i == 0 else [])]
            log = open(tmp_path / f"node{i}.log", "w")
            logs.append(log)
            out = subprocess.PIPE if i == 0 else log
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=log, text=True, start_new_session=True))
        try:
            deadline = time.monotonic() + 90
            while _last_step(tmp_path / "m0.jsonl") < KILL_AT:
                assert time.monotonic() < deadline, (tmp_path / "node0.log").read_text()[-3000:]
                assert procs[0].poll() is None, (tmp_path / "node0.log").read_text()[-3000:]
                time.sleep(0.05)
            killed_at = _last_step(tmp_path / "m0.jsonl")
            victims = _pids(nodes[2][0])                     # node 2 dies: its agent and its ranks
            t_kill = time.time()
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            stdout, _ = procs[0].communicate(timeout=150)
            t_done = time.time()
            procs[1].wait(timeout=30)
            if how == "killed":
                procs[2].wait(timeout=10)
            # no rank left running on the surviving nodes (nor on the killed one)
            time.sleep(0.5)
            left = {ns: _pids(ns) for ns, _ in (nodes if how == "killed" else nodes[:2])}
        finally:
            for pr in procs:
                if pr.poll() is None:
                    os.killpg(pr.pid, signal.SIGKILL)
                    pr.wait()
            for log in logs:
                log.close()
    err0 = (tmp_path / "node0.log").read_text()
    assert len(victims) >= 3, victims                        # planner launch, torchrun, two ranks
    assert procs[0].returncode == 0, err0[-5000:]
    assert procs[1].returncode == 0, (tmp_path / "node1.log").read_text()[-3000:]
    assert left == {ns: [] for ns, _ in (nodes if how == "killed" else nodes[:2])}, left
    got = json.loads(stdout)

    # the survivors agreed, replanned for two nodes and wrote the plan
    [rp] = got["replans"]
    lost = f"/{nodes[2][1]}"
    assert [n.endswith(lost) for n in rp["lost_nodes"]] == [True], rp
    assert rp["world_size"] == got["world_size"] == 4 and len(rp["nodes"]) == 2
    new = read_plan(rp["plan"])
    assert Path(rp["plan"]) == tmp_path / "ck.replan-1.yaml" and new.world_size == 4
    assert new.workload == plan.workload and new.provenance["lost_nodes"] == rp["lost_nodes"]
    assert got["plan"] == rp["plan"] and got["rounds"] == 2
    recovery_s = got["round_log"][1]["unix_time"] - t_kill     # the kill to the survivors' new round
    assert 0 < recovery_s < 60
    assert "replanned for 4 ranks on 2 node(s)" in err0

    # resumed from the last complete checkpoint before the loss, with resharding (6 -> 4 ranks)
    resumed = got["resumed_from_step"]
    assert resumed is not None and resumed % EVERY == 0 and resumed <= killed_at + 1 and resumed >= KILL_AT - EVERY
    assert rp["resume_from"].endswith(f"step-{resumed:08d}")
    assert got["steps"] == list(range(1, STEPS + 1))
    diff = max(abs(a - b) for a, b in zip(got["losses"], ref))
    print(f"node lost after step {killed_at}; new round {recovery_s:.1f} s after the kill; resumed from step "
          f"{resumed} on {new.parallel.tp}x{new.parallel.dp} (tp x dp), finished {t_done - t_kill:.1f} s after the "
          f"kill; max |loss - uninterrupted| = {diff:.2e}")
    assert diff <= 1e-4, (got["losses"], ref)
    assert max(ref) - min(ref) > 1e-2                       # the curve moves: the comparison means something

    # checkpoints intact, the last one written by the new layout
    last = find_intact(ck)
    assert last is not None and last.name == f"step-{STEPS:08d}" and verify(last) is None
    meta = read_meta(last)
    assert meta["world_size"] == 4 and meta["parallel"] == new.parallel.to_dict()
