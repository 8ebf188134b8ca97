"""Pure parts of the profiler: bus-bandwidth convention, alpha-beta fit, matmul efficiency fit,
group shapes, and measurements -> a cluster file that loads and round-trips (no processes)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import yaml

from costmodel.units import GB, TERA
from profiles import bench_collectives as bc
from profiles.bench_matmul import efficiency_table, fit_efficiency
from costmodel.files.clusters import cluster_from_dict, cluster_to_dict, load_cluster
from profiles.probe import ReplayNVML, probe
from profiles.profile import analyze, write_outputs

DATA = Path(__file__).parent / "data" / "nvml"


def test_busbw_factors_follow_nccl_tests():
    assert bc.busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bc.busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bc.busbw_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bc.busbw_factor("all_to_all", 2) == pytest.approx(1 / 2)
    assert bc.busbw_factor("send_recv", 2) == 1.0
    with pytest.raises(ValueError, match="unknown collective"):
        bc.busbw_factor("broadcast_tree", 2)


def _rows(tier: str, group: str, n: int, alpha: float, bw: float, op: str = "all_reduce", noise: float = 0.0):
    rows = []
    for i, s in enumerate(bc.message_sizes("cpu", quick=False)):
        t = bc.hops(op, n) * alpha + s * bc.busbw_factor(op, n) / bw
        t *= 1 + noise * (-1) ** i
        rows.append({"group": group, "tier": tier, "op": op, "group_size": n, "bytes": s, "time_s": t,
                     "algbw_bytes_per_s": s / t, "busbw_bytes_per_s": s / t * bc.busbw_factor(op, n),
                     "iters": 1, "ranks": "0 1", "table": True})
    return rows


def test_alpha_beta_fit_recovers_latency_and_bandwidth():
    rows = _rows("intra", "node", 4, 50e-6, 2.0 * GB) + _rows("inter", "world", 8, 400e-6, 0.1 * GB, noise=0.05)
    fits = {f.tier: f for f in bc.fit_alpha_beta(rows)}
    assert fits["intra"].alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert fits["intra"].bandwidth_bytes_per_s == pytest.approx(2.0 * GB, rel=1e-6)
    assert fits["inter"].bandwidth_bytes_per_s == pytest.approx(0.1 * GB, rel=0.1)
    assert fits["inter"].alpha_s == pytest.approx(400e-6, rel=0.3)
    assert bc.tier_fit(list(fits.values()), "inter", rows).group == "world"


def test_matmul_efficiency_fit_reads_plateau_and_half_point():
    table = [(64.0, 0.05), (128.0, 0.25), (256.0, 0.8), (512.0, 0.95), (1024.0, 1.0)]
    e, half = fit_efficiency(table)
    assert e == pytest.approx(0.975)
    assert 128 < half < 256
    rows = [{"dtype": "bf16", "m": s, "n": s, "k": s, "size": s, "flops_per_s": 100.0 * s} for s in (64, 128)]
    assert efficiency_table(rows, "bf16", 12800.0) == [(64.0, 0.5), (128.0, 1.0)]


def test_group_shapes_hold_rank0_and_split_tiers():
    one = bc.group_shapes(["a"] * 4)
    assert [(s.name, s.tier, s.ranks) for s in one] == [("pair", "intra", (0, 1)), ("node", "intra", (0, 1, 2, 3))]
    two = bc.group_shapes(["a", "a", "b", "b"])
    assert [(s.name, s.tier, s.ranks) for s in two] == [("node", "intra", (0, 1)), ("pair-x", "inter", (0, 2)),
                                                        ("world", "inter", (0, 1, 2, 3))]
    assert bc.group_shapes(["a"]) == []
    extra = bc.group_shapes(["a"] * 8, extra_pairs=[(2, "NODE"), (4, "SYS")])
    assert [s.name for s in extra if not s.table] == ["pair-NODE", "pair-SYS"]
    assert bc.message_sizes("cuda", quick=False)[0] == 1024 and bc.message_sizes("cuda", quick=False)[-1] == 2**30
    assert bc.message_sizes("cpu", quick=True)[-1] == 4 * 2**20


def _result(device_type: str, nodes: int, gpn: int, best_tflops: float, intra_bw: float, inter_bw: float) -> dict:
    ranks = [{"rank": r, "host": f"h{r // gpn}", "node": f"node{r // gpn}", "pid": 1, "device": device_type}
             for r in range(nodes * gpn)]
    mm = [{"dtype": "bf16", "m": s, "n": s, "k": s, "size": float(s), "time_s": 1.0,
           "flops_per_s": best_tflops * TERA * s / (s + 300), "iters": 1} for s in (256, 1024, 4096, 8192)]
    coll = _rows("intra", "node", gpn, 10e-6, intra_bw)
    if nodes > 1:
        coll += _rows("inter", "world", nodes * gpn, 20e-6, inter_bw)
    return {"ranks": ranks, "probes": {}, "backend": "nccl" if device_type == "cuda" else "gloo",
            "device_type": device_type, "torch": "2.13.0", "cuda": None, "nccl": None, "matmul": mm,
            "memory": [{"bytes": 2**30, "time_s": 1.0, "bandwidth_bytes_per_s": 3000 * GB, "iters": 1}],
            "collectives": coll, "overlap": {"compute_slowdown": 0.07, "gemm_alone_s": 1e-3, "gemm_overlapped_s": 1.07e-3,
                                             "allreduce_alone_s": 1e-3, "overlapped_total_s": 2e-3,
                                             "allreduce_bytes": 2**28, "gemm_size": 8192, "ranks": [0, 1]}}


def test_gpu_profile_keeps_datasheet_links_and_peaks(tmp_path):
    """A (synthetic) measurement on a DGX H100 pair of nodes: peak and link bandwidth stay the
    datasheet's, the measured fraction becomes the efficiency, the file loads and round-trips."""
    pr = probe(ReplayNVML.from_file(DATA / "dgx_h100.json"), host="dgx")
    res = _result("cuda", nodes=2, gpn=8, best_tflops=700.0, intra_bw=360 * GB, inter_bw=45 * GB)
    prof = analyze(pr, res, name="h100-test", quick=False, started=time.time(), method="test")
    c = prof.cluster
    assert c["gpu"]["tflops"]["bf16"] == 989 and c["gpu"]["memory_gib"] == pytest.approx(79.65, abs=0.01)
    assert c["intra_node"]["gb_per_s"] == 450 and c["intra_node"]["efficiency"] == pytest.approx(0.8, rel=1e-3)
    assert c["inter_node"]["gb_per_s"] == 50 and c["inter_node"]["efficiency"] == pytest.approx(0.9, rel=1e-3)
    assert c["intra_node"]["latency_us"] == pytest.approx(10.0, rel=1e-3)
    assert (c["nodes"], c["gpus_per_node"], c["source"]) == (2, 8, "measured")
    assert c["measured"]["compute_comm_slowdown"] == 0.07
    assert max(e for _, e in c["measured"]["matmul"]) == pytest.approx(700 / 989 * 8192 / 8492, rel=1e-3)
    summary = write_outputs(prof, tmp_path, report=True)
    spec = load_cluster(summary["cluster_file"])
    assert spec.source == "measured" and spec.total_gpus == 16
    assert spec.intra_node.effective_bytes_per_s == pytest.approx(360 * GB, rel=1e-3)
    assert {t for t, *_ in spec.collective_table} == {"intra", "inter"}
    assert cluster_from_dict(cluster_to_dict(spec)) == spec
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "http://" not in html and "https://" not in html
    md = (tmp_path / "report.md").read_text()
    assert "| intra-node bus bandwidth" in md and "NV18" in md and "80%" in md


def test_cpu_profile_uses_measured_figures(tmp_path):
    pr = probe(ReplayNVML.from_file(DATA / "no_driver.json"), host="vm")
    res = _result("cpu", nodes=2, gpn=2, best_tflops=0.5, intra_bw=1.0 * GB, inter_bw=0.025 * GB)
    prof = analyze(pr, res, name=None, quick=True, started=time.time(), method="test")
    c = prof.cluster
    assert c["name"] == "measured-h0-x2" and c["gpu"]["name"] == "cpu-process"
    assert c["gpu"]["tflops"]["bf16"] == pytest.approx(0.5 * 8192 / 8492, rel=1e-3)   # measured best is the peak
    assert max(e for _, e in c["measured"]["matmul"]) == 1.0
    assert c["intra_node"] == {"name": "gloo-loopback (measured)", "gb_per_s": 1.0, "latency_us": 10.0, "efficiency": 1.0}
    assert c["inter_node"]["gb_per_s"] == pytest.approx(0.025)
    write_outputs(prof, tmp_path, report=False)
    loaded = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    assert loaded["provenance"]["links"] == {"intra_node": "measured", "inter_node": "measured"}
    spec = load_cluster(str(tmp_path / "cluster.yaml"))
    assert spec.with_gpus(2).total_gpus == 2 and spec.with_gpus(4).nodes == 2


def test_matmul_bench_bounds_each_call_on_a_cpu():
    """A slow CPU kernel (bf16 without bf16 instructions runs at a tenth of fp32 or less) must not hold
    a profile up: a shape whose call would exceed MAX_CALL_S at its dtype's last rate is skipped and
    reported with that prediction, and a call of LONG_CALL_S or more is timed once. Whichever this
    machine's kernels do, the rows and skips obey both rules, and every shape is either timed or skipped
    (on this 2-core machine bf16's 1024 and 2048 shapes are skipped, fp32's run)."""
    import torch
    from profiles import bench_matmul as bm
    shapes = [(64, 64, 64), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048)]
    started, skipped = [], []
    t0 = time.perf_counter()
    rows = bm.bench_matmul(torch.device("cpu"), ["fp32", "bf16"], shapes, target_s=0.02,
                           on_start=lambda *s: started.append(s),
                           on_skip=lambda dt, m, n, k, secs: skipped.append((dt, m, n, k, secs)))
    wall = time.perf_counter() - t0
    assert len(rows) + len(skipped) == 2 * len(shapes) == len(started) + len(skipped)
    rate: dict[str, float] = {}
    done = {(r["dtype"], r["m"]) for r in rows}
    for dt in ("fp32", "bf16"):
        for m, n, k in shapes:
            flops = 2.0 * m * n * k
            row = next((r for r in rows if r["dtype"] == dt and r["m"] == m), None)
            if row is None:
                (s,) = [s for s in skipped if s[0] == dt and s[1] == m]
                assert s[4] == pytest.approx(flops / rate[dt]) and s[4] > bm.MAX_CALL_S
                continue
            assert dt not in rate or flops / rate[dt] <= bm.MAX_CALL_S
            if row["time_s"] >= bm.LONG_CALL_S:
                assert row["iters"] == 1    # timed once: its warm-up was the measurement
            rate[dt] = flops / row["time_s"]
    assert ("fp32", 64) in done and ("bf16", 64) in done     # the smallest always runs
    # the bound: each dtype's shapes after the first cost at most MAX_CALL_S per call, a few calls each
    assert wall < 2 * len(shapes) * 6 * bm.MAX_CALL_S


def test_graph_timing_falls_back_where_it_cannot_capture():
    """Small GEMMs on a GPU are timed as CUDA-graph replays (profiles.bench_matmul.time_graphed: one by
    one from Python they measure the host's launch rate); where no graph can be captured, as on this
    CPU, it answers None and bench_matmul keeps the eager timing."""
    import torch

    from profiles import bench_matmul as bm
    a = torch.randn(64, 64)
    assert bm.time_graphed(lambda: a @ a, torch.device("cpu"), 0.01) is None
    assert bm.GRAPH_BELOW_S > 9.65e-6       # above the H200's measured eager launch floor


def _hgx_4gpu_calls() -> dict:
    """Synthetic (not a recording): the DGX H100 recording cut to 4 GPUs whose 18 NVLinks go straight to
    the other three, 6 to each (an HGX H100 4-GPU board, no NVSwitch); the remote end of each link is
    given by the peer's PCI bus id, as NVML reports it."""
    calls = json.loads((DATA / "dgx_h100.json").read_text())["calls"]
    calls = dict(calls)
    calls["nvmlDeviceGetCount"] = {"": 4}
    calls["nvmlDeviceGetNvLinkRemoteDeviceType"] = {"*,0-17": 0}     # NVML_NVLINK_DEVICE_TYPE_GPU
    bus = [calls["nvmlDeviceGetPciInfo"][str(i)]["busId"] for i in range(4)]
    remote = {}
    for i in range(4):
        for n, j in enumerate(j for j in range(4) if j != i):
            remote[f"{i},{6 * n}-{6 * n + 5}"] = {"busId": bus[j]}
    calls["nvmlDeviceGetNvLinkRemotePciInfo"] = remote
    return calls


def test_a_direct_nvlink_mesh_is_found_and_written(tmp_path):
    """A 4-GPU board without NVSwitch: the probe sees 6 links to each of 3 peers, the profile writes the
    intra-node link as a mesh of 3 peers at the GPU's 18 links (450 GB/s), and the planner then prices a
    pair of its GPUs at a third of the rate (costmodel.comm's direct meshes)."""
    from costmodel.comm import GroupLayout, Network
    from profiles.probe import nvlink_mesh_peers
    pr = probe(ReplayNVML({"calls": _hgx_4gpu_calls()}), host="hgx4")
    assert [g.nvlink_peers for g in pr.gpus][0] == {1: 6, 2: 6, 3: 6}
    assert nvlink_mesh_peers(pr.gpus) == 3
    assert nvlink_mesh_peers(probe(ReplayNVML.from_file(DATA / "dgx_h100.json"), host="dgx").gpus) == 0  # NVSwitch
    res = _result("cuda", nodes=1, gpn=4, best_tflops=700.0, intra_bw=360 * GB, inter_bw=45 * GB)
    prof = analyze(pr, res, name="hgx4", quick=True, started=time.time(), method="test")
    intra = prof.cluster["intra_node"]
    assert intra["mesh_peers"] == 3 and intra["gb_per_s"] == 450
    assert intra["efficiency"] == pytest.approx(0.8, rel=1e-3)        # the four-GPU ring's measured 360 of 450
    assert "mesh of 3 peers" in prof.cluster["provenance"]["links"]["intra_node"]
    spec = load_cluster(write_outputs(prof, tmp_path, report=False)["cluster_file"])
    assert spec.intra_node.mesh_peers == 3
    net = Network(dataclasses.replace(spec, collective_table=()))     # the link's rule, not the table
    size = 64e6
    pair = net.all_gather(size, GroupLayout(2, 2)) - net.intra.latency_s
    assert pair == pytest.approx(0.5 * size / (360e9 / 3))
    # a GPU the catalog lacks (no datasheet): the measured rate is the link's, and the mesh is still written
    calls = _hgx_4gpu_calls()
    calls["nvmlDeviceGetName"] = {"*": "NVIDIA Unlisted Accelerator"}
    two = _result("cuda", nodes=2, gpn=4, best_tflops=700.0, intra_bw=360 * GB, inter_bw=45 * GB)
    bare = analyze(probe(ReplayNVML({"calls": calls}), host="hgx4"), two, name="hgx4", quick=True,
                   started=time.time(), method="test").cluster["intra_node"]
    assert bare["mesh_peers"] == 3 and bare["gb_per_s"] == pytest.approx(360) and bare["efficiency"] == 1.0


def test_a_partial_or_uneven_nvlink_mesh_is_not_written_as_one():
    """Where some pairs of GPUs have no NVLink, or pairs have different link counts, one figure per GPU
    cannot describe the node: no mesh is written (the datasheet's link stays)."""
    from profiles.probe import GpuInfo, nvlink_mesh_peers
    full = [GpuInfo(index=i, name="H100", nvlink_peers={j: 6 for j in range(4) if j != i}) for i in range(4)]
    assert nvlink_mesh_peers(full) == 3
    ring = [GpuInfo(index=i, name="H100", nvlink_peers={(i + 1) % 4: 9, (i - 1) % 4: 9}) for i in range(4)]
    assert nvlink_mesh_peers(ring) == 0                      # 0 and 2 are not linked
    uneven = [GpuInfo(index=i, name="H100", nvlink_peers={j: 6 if (i + j) % 2 else 4 for j in range(4) if j != i})
              for i in range(4)]
    assert nvlink_mesh_peers(uneven) == 0
    pair = [GpuInfo(index=i, name="A100", nvlink_peers={1 - i: 12}) for i in range(2)]
    assert nvlink_mesh_peers(pair) == 0                      # a bridged pair: one peer, nothing to split


def test_one_node_of_a_gpu_outside_the_catalog_is_written_with_its_network_bounded(tmp_path):
    """One node of a GPU the catalog has no datasheet for: the network was neither measured nor has a datasheet.
    Until stop 44 this raised an internal error and wrote nothing. The file is now written, its network the GPU's
    own PCIe link (an upper bound on any NIC behind it), named and explained as such; with no PCIe figure either,
    the profile says what to do instead of failing inside."""
    from profiles.profile import RankFailed
    calls = json.loads((DATA / "dgx_h100.json").read_text())["calls"]
    calls["nvmlDeviceGetName"] = {"*": "NVIDIA Unlisted Accelerator"}
    pr = probe(ReplayNVML({"calls": calls}), host="box")
    res = _result("cuda", nodes=1, gpn=8, best_tflops=700.0, intra_bw=360 * GB, inter_bw=45 * GB)
    prof = analyze(pr, res, name="box", quick=True, started=time.time(), method="test")
    inter = prof.cluster["inter_node"]
    assert inter["gb_per_s"] == pytest.approx(pr.gpus[0].pcie_gb_per_s, rel=1e-3) and "upper bound" in inter["name"]
    assert "PCIe link as an upper bound" in prof.cluster["provenance"]["links"]["inter_node"]
    assert load_cluster(write_outputs(prof, tmp_path, report=False)["cluster_file"]).total_gpus == 8
    for g in pr.gpus:
        g.pcie_gen_max = None
    with pytest.raises(RankFailed, match="profile two nodes"):
        analyze(pr, res, name="box", quick=True, started=time.time(), method="test")
