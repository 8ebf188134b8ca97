"""`planner profile` end to end on this machine: a quick gloo profile that loads and plans, the
exit code for an unwritable output, and a rank that dies or hangs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from costmodel.files.clusters import cluster_from_dict, cluster_to_dict, load_cluster

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ROOT = Path(__file__).resolve().parents[1]


def planner(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.multiproc
def test_quick_profile_writes_a_cluster_file_that_loads(tmp_path):
    p = planner("profile", "--quick", "--out", str(tmp_path / "prof"), "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["status"] == "ok" and s["backend"] == "gloo" and (s["nodes"], s["gpus_per_node"]) == (1, 2)
    assert not s["nvml"] and "CPU path" in s["note"]
    assert "NVML" in p.stderr                          # the note goes to stderr too, as a message
    # (its speed is a benchmark figure in the README, not a test: these machines are shared)
    # measured figures are sane: a CPU core does 10+ GFLOP/s fp32, loopback gloo moves 50+ MB/s
    assert s["matmul"]["best_tflops_by_dtype"]["fp32"] > 0.01
    assert 0 < s["matmul"]["efficiency_max"] <= 1
    assert s["tiers"]["intra"]["busbw_gb_per_s"] > 0.05 and "inter" not in s["tiers"]
    out = tmp_path / "prof"
    for f in ("cluster.yaml", "collectives.csv", "matmul.csv", "memory.csv", "fits.csv", "probe.json",
              "summary.json", "report.md", "report.html"):
        assert (out / f).is_file(), f
    coll = pd.read_csv(out / "collectives.csv")
    assert set(coll["op"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert (coll["busbw_bytes_per_s"] > 0).all() and coll["bytes"].max() == 4 * 2**20
    # all-reduce busbw = algbw * 2(n-1)/n, which for a pair is algbw
    ar = coll[coll["op"] == "all_reduce"]
    assert (abs(ar["busbw_bytes_per_s"] - ar["algbw_bytes_per_s"]) < 1e-6 * ar["algbw_bytes_per_s"]).all()
    spec = load_cluster(str(out / "cluster.yaml"))
    assert spec.source == "measured" and spec.gpu.name == "cpu-process"
    # the CPU's fixed cost per layer (eager operators, forward + backward): a tiny layer costs
    # more than its FLOPs at the fp32 rate; tens of microseconds at least, well under a second
    assert 10e-6 < spec.gpu.layer_overhead_s < 1.0
    assert s["layer_overhead_us"] == pytest.approx(spec.gpu.layer_overhead_s * 1e6, rel=1e-9)
    # FSDP2's wrappers (the built-in runtime's data parallelism), measured on a one-rank subgroup of
    # the profile's ranks: some host time per block and per parameter, well under a second
    assert 0 <= spec.gpu.fsdp2_block_s < 1.0 and 0 <= spec.gpu.dtensor_param_step_s < 1.0
    assert spec.gpu.fsdp2_block_s + spec.gpu.dtensor_param_step_s > 1e-6
    assert s["fsdp2_block_us"] == pytest.approx(spec.gpu.fsdp2_block_s * 1e6, rel=1e-9)
    # DTensor tensor parallelism's host time per layer (the runtime's blocks under its TP plan)
    assert 0 < spec.gpu.dtensor_tp_layer_s < 1.0
    assert s["dtensor_tp_layer_us"] == pytest.approx(spec.gpu.dtensor_tp_layer_s * 1e6, rel=1e-9)
    # fused attention, SDPA's CPU kernel recorded as the kernel a CPU is priced with (fa2): both
    # masks and directions at every measured length, fractions of the fp32 peak; the summary's
    # causal ranges are the table's
    rows = spec.gpu.attention_table
    assert {(r[0], r[1], r[2]) for r in rows} == {("fa2", d, m) for d in ("fwd", "bwd") for m in ("causal", "none")}
    assert all(0 < r[5] <= 1 for r in rows) and len({r[4] for r in rows}) >= 2
    a = s["attention"]["fa2"]
    assert a["fwd"] == [min(r[5] for r in rows if r[1:3] == ("fwd", "causal")),
                        max(r[5] for r in rows if r[1:3] == ("fwd", "causal"))]
    # what overlapping communication with compute still costs on CPU cores, measured
    assert s["compute_comm_slowdown"] is not None and 0 <= spec.compute_comm_slowdown <= 1
    assert spec.matmul_table and spec.collective_table
    assert cluster_from_dict(cluster_to_dict(spec)) == spec
    assert spec.with_gpus(2).total_gpus == 2
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3 and "<script" not in html


def test_planner_reads_the_profile():
    """A measured profile through the planner's own loader and `planner estimate` (the cost model
    reads the measured tables); `planner plan --cluster` too once the plan command exists."""
    from planner.plan.inputs import load_cluster_sized
    prof = ROOT / "profiles" / "measured" / "cpu-2x2-netns.yaml"
    spec = load_cluster_sized(str(prof), 4)
    assert (spec.nodes, spec.gpus_per_node) == (2, 2)
    assert spec.intra_node.effective_bytes_per_s > 10 * spec.inter_node.effective_bytes_per_s
    problem = ["--cluster", str(prof), "--model", "tiny-llama", "--gpus", "4", "--global-batch", "16",
               "--seq-len", "256", "--dtype", "fp32", "--json"]
    inside = json.loads(planner("estimate", *problem, "--tp", "2", "--dp", "2", "--mesh-order", "pp,dp,cp,tp").stdout)
    across = json.loads(planner("estimate", *problem, "--tp", "2", "--dp", "2", "--mesh-order", "pp,cp,tp,dp").stdout)
    # tensor parallelism over the slow veth costs more than over loopback
    assert across["estimate"]["step_time_s"] > inside["estimate"]["step_time_s"]
    p = planner("plan", *problem, timeout=300)
    assert p.returncode == 0, p.stderr
    best = json.loads(p.stdout)["plans"][0]
    assert best["parallel"]["tp"] * best["parallel"]["pp"] * best["parallel"]["dp"] * best["parallel"]["cp"] == 4


def test_unwritable_output_exits_2_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    t0 = time.time()
    p = planner("profile", "--quick", "--out", str(blocker / "sub"))
    assert p.returncode == 2
    assert "cannot write the profile" in p.stderr and "--out" in p.stderr
    assert "Traceback" not in p.stderr
    assert time.time() - t0 < 10                  # no process was spawned, nothing measured
    p = planner("profile", "--out", str(blocker))
    assert p.returncode == 2 and "is a file" in p.stderr


@pytest.mark.multiproc
@pytest.mark.parametrize("mode, after", [("exit", 3), ("hang", 4)])
def test_a_rank_that_dies_or_hangs_is_named_and_partial_results_kept(tmp_path, mode, after):
    out = tmp_path / "prof"
    p = planner("profile", "--quick", "--out", str(out), "--no-report", "--timeout", "4", "--json",
                env={"PLANNER_PROFILE_FAULT": f"rank=1,after={after},mode={mode}"})
    assert p.returncode == 1, p.stderr
    err = p.stderr.strip().splitlines()[-1]
    host = os.uname().nodename
    assert "rank 1" in err and f"host {host}" in err and "partial results kept" in err
    assert ("exited with code 17" if mode == "exit" else "stopped making progress") in err
    s = json.loads(p.stdout)
    assert s["status"] == "failed" and s["measurements"]["collectives"] == after
    coll = pd.read_csv(out / "collectives.csv")
    assert len(coll) == after and (coll["busbw_bytes_per_s"] > 0).all()
    assert len(pd.read_csv(out / "matmul.csv")) > 0
    assert not (out / "cluster.yaml").exists()


@pytest.mark.multiproc
def test_under_torchrun_a_hung_rank_is_named(tmp_path):
    """torchrun (c10d, one node): rank 0 times out in a collective and names the rank behind."""
    out = tmp_path / "prof"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    p = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "planner", "profile", "--quick",
                        "--out", str(out), "--timeout", "5", "--no-report"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PLANNER_PROFILE_FAULT": "rank=1,after=4,mode=hang"})
    assert p.returncode != 0
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "failed"
    assert s["error"].startswith("rank 1 (host ") and "stopped making progress" in s["error"]
    assert "rank 0" in s["error"] and "gave up waiting" in s["error"]
    assert len(pd.read_csv(out / "collectives.csv")) == 4


@pytest.mark.gpu
def test_gpu_quick_profile_against_the_datasheet(tmp_path):
    """On an NVIDIA GPU: NVML probe, NCCL, bf16 matmul and HBM copy within sight of the datasheet."""
    p = planner("profile", "--quick", "--out", str(tmp_path / "prof"), "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["nvml"] and s["device"] == "cuda" and s["backend"] == "nccl"
    if s["matmul"].get("datasheet_tflops"):
        assert 0.3 < s["matmul"]["best_tflops"] / s["matmul"]["datasheet_tflops"] <= 1.05
    if s["memory"].get("datasheet_gb_per_s"):
        assert 0.5 < s["memory"]["copy_gb_per_s"] / s["memory"]["datasheet_gb_per_s"] <= 1.05
    spec = load_cluster(s["cluster_file"])
    assert spec.source == "measured" and spec.gpu.memory_bytes > 10 * 2**30
