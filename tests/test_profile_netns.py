"""Two "nodes" on this machine: two network namespaces joined by a veth pair limited with `tc`,
two gloo ranks ("GPUs") in each, launched by torchrun with c10d rendezvous. The profiler must
find two tiers: loopback inside a namespace (fast) and the veth between them (slow).

Traffic stays on loopback and inside the two namespaces this test makes (addresses from
10.231.0.0/16, which exist only there); both are removed at the end, pass or fail. Skips
cleanly where the machine does not allow it (not root, no `ip netns`, no `tc` tbf).

``make_two_node_profile(out)`` is importable, for tests that need such a profile (the planner
keeping tensor parallelism inside a node); ``profiles/measured/cpu-2x2-netns.yaml`` is one such
profile, measured by this procedure and committed.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RATE = "200mbit"            # the veth: 25 MB/s each way, ~40x slower than gloo over loopback
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def two_namespaces(rate: str = RATE):
    """Yield ``[(netns, address), (netns, address)]``; each namespace has its end of the veth
    named ``pveth0`` (so GLOO_SOCKET_IFNAME is the same on both) and loopback up."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs iproute2 (ip, tc)")
    tag = f"{os.getpid() % 100000}{random.randrange(100):02d}"
    sub = random.randrange(1, 250)
    names = [f"pfa{tag}", f"pfb{tag}"]
    addrs = [f"10.231.{sub}.1", f"10.231.{sub}.2"]
    made: list[str] = []
    try:
        for n in names:
            r = _run("ip", "netns", "add", n)
            if r.returncode:
                pytest.skip(f"ip netns add is not allowed here: {r.stderr.strip()}")
            made.append(n)
        steps = [("ip", "link", "add", f"pva{tag}", "type", "veth", "peer", "name", f"pvb{tag}"),
                 ("ip", "link", "set", f"pva{tag}", "netns", names[0]),
                 ("ip", "link", "set", f"pvb{tag}", "netns", names[1])]
        for n, dev, addr in ((names[0], f"pva{tag}", addrs[0]), (names[1], f"pvb{tag}", addrs[1])):
            steps += [("ip", "-n", n, "link", "set", dev, "name", "pveth0"),
                      ("ip", "-n", n, "addr", "add", f"{addr}/24", "dev", "pveth0"),
                      ("ip", "-n", n, "link", "set", "pveth0", "up"),
                      ("ip", "-n", n, "link", "set", "lo", "up")]
        for step in steps:
            r = _run(*step)
            if r.returncode:
                pytest.skip(f"cannot build the veth pair ({' '.join(step)}): {r.stderr.strip()}")
        for n in names:
            r = _run("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", "pveth0", "root", "tbf",
                     "rate", rate, "burst", "64kb", "latency", "100ms")
            if r.returncode:
                pytest.skip(f"tc tbf is not available: {r.stderr.strip()}")
        yield list(zip(names, addrs))
    finally:
        for n in made:                 # deleting a namespace deletes its end of the veth, and the pair
            _run("ip", "netns", "del", n)


def make_two_node_profile(out: Path, timeout_s: float = 150, name: str = "cpu-2x2-netns") -> Path:
    """Profile 2 namespaces x 2 gloo ranks with torchrun (c10d); return the cluster file path."""
    out = Path(out)
    with two_namespaces() as ((ns_a, addr_a), (ns_b, addr_b)):
        port = str(random.randrange(20000, 40000))       # a fresh namespace: every port is free
        procs = []
        logs = []
        for node, (ns, addr) in enumerate(((ns_a, addr_a), (ns_b, addr_b))):
            cmd = ["ip", "netns", "exec", ns, "env", "GLOO_SOCKET_IFNAME=pveth0", "OMP_NUM_THREADS=1",
                   TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr_a}:{port}", "--rdzv-id", f"prof{port}",
                   # the namespaces share this machine's host name, so name each node's address
                   "--local-addr", addr, *(["--rdzv-conf", "is_host=1"] if node == 0 else []),
                   "-m", "planner", "profile", "--quick", "--out", str(out if node == 0 else out / f"node{node}"),
                   "--no-report" if node else "--json", "--timeout", "60", "--name", name]
            log = open(out.parent / f"{out.name}.node{node}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        try:
            for p in procs:
                p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for log in logs:
                log.close()
        codes = [p.returncode for p in procs]
        if codes != [0, 0]:
            tail = (out.parent / f"{out.name}.node0.log").read_text()[-3000:]
            raise AssertionError(f"torchrun exit codes {codes}; node 0 log tail:\n{tail}")
    return out / "cluster.yaml"


@pytest.mark.netns
@pytest.mark.multiproc
def test_two_namespaces_give_two_tiers(tmp_path):
    cluster_file = make_two_node_profile(tmp_path / "prof")
    d = yaml.safe_load(cluster_file.read_text())
    assert (d["nodes"], d["gpus_per_node"]) == (2, 2)
    assert len(d["provenance"]["nodes"]) == 2 and all(len(v) == 2 for v in d["provenance"]["nodes"].values())
    intra, inter = d["intra_node"]["gb_per_s"], d["inter_node"]["gb_per_s"]
    assert d["provenance"]["links"] == {"intra_node": "measured", "inter_node": "measured"}
    assert intra > 5 * inter, (intra, inter)
    # 200 Mbit/s is 0.025 GB/s each way; an all-reduce over the world cannot beat the wire by much
    assert 0.005 < inter < 0.04, inter
    tiers = {r["tier"] for r in d["measured"]["collectives"]}
    assert tiers == {"intra", "inter"}
    from costmodel.files.clusters import load_cluster
    spec = load_cluster(str(cluster_file))
    assert spec.nodes == 2 and spec.total_gpus == 4
    keep = os.environ.get("PLANNER_KEEP_NETNS_PROFILE")    # a folder: refresh the committed example
    if keep:
        shutil.copy(cluster_file, Path(keep) / "cpu-2x2-netns.yaml")
        shutil.copy(cluster_file.with_name("report.md"), Path(keep) / "cpu-2x2-netns.report.md")
