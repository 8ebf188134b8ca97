"""The NVML probe against recorded answers (tests/data/nvml/*.json), and the CPU path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiles.probe import (AFFINITY_WORDS, RecordingNVML, ReplayNVML, _cpu_list, catalog_for_gpu, probe)

DATA = Path(__file__).parent / "data" / "nvml"


def replay(name: str) -> ReplayNVML:
    return ReplayNVML.from_file(DATA / f"{name}.json")


def test_dgx_h100_nvswitch_topology():
    r = probe(replay("dgx_h100"), host="dgx")
    assert r.nvml and r.catalog == "dgx-h100"
    assert len(r.gpus) == 8
    g0, g7 = r.gpus[0], r.gpus[7]
    assert g0.name == "NVIDIA H100 80GB HBM3"
    assert g0.memory_total_bytes == 81559 * 2**20
    assert 0 < g0.memory_free_bytes < g0.memory_total_bytes
    assert g0.pci_bus_id == "00000000:18:00.0"        # bytes in the C struct, text here
    assert (g0.pcie_gen_max, g0.pcie_width_max) == (5, 16)
    assert g0.compute_capability == "9.0"
    # 18 links, all to NVSwitches; link indices 18..35 answer InvalidArgument and are skipped
    assert g0.nvlink_links == 18 and g0.nvlink_switch_links == 18 and g0.nvlink_peers == {}
    assert g0.nvlink_gb_per_s == pytest.approx(450.0)   # 18 x 25 GB/s per direction, the catalog's figure
    assert r.topology[0][1] == "NV18" and r.topology[3][4] == "NV18" and r.topology[5][5] == "X"
    assert all(r.nvlink_matrix[i][j] == 18 for i in range(8) for j in range(8) if i != j)
    assert (g0.numa_node, g7.numa_node) == (0, 1)
    assert g0.cpu_affinity == "0-55,112-167" and g7.cpu_affinity == "56-111,168-223"
    assert r.driver_version == "570.86.15" and r.cuda_driver_version == "12.8"
    assert g0.power_limit_w == 700 and g0.sm_clock_max_mhz == 1980


def test_l40s_pcie_box_has_no_nvlink_and_a_pcie_tree():
    r = probe(replay("l40s_pcie"), host="box")
    assert r.catalog == "l40s-pcie" and len(r.gpus) == 8
    g = r.gpus[0]
    assert g.nvlink_links == 0 and g.nvlink_version is None      # NotSupported ends the link scan
    assert (g.pcie_gen_max, g.pcie_gen_current) == (4, 1)          # idle link trained down; max is kept
    assert g.pcie_gb_per_s == pytest.approx(4 * 0 + 1.969 * 16)
    assert r.topology[0] == ["X", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert r.topology[6][7] == "PIX" and r.topology[7][4] == "NODE"
    assert all(v == 0 for row in r.nvlink_matrix for v in row)
    assert "L40S" in r.summary() and "PCIe gen4 x16" in r.summary()


def test_no_driver_is_the_cpu_path_with_a_note():
    r = probe(replay("no_driver"), host="laptop")
    assert not r.nvml and r.gpus == [] and r.catalog == "cpu"
    assert "NVML Shared Library Not Found" in r.note and "CPU path" in r.note
    assert r.cpu_count >= 1


def test_this_machine_without_a_gpu_probes_the_cpu_path():
    r = probe()
    if r.gpus:
        pytest.skip("this machine has NVIDIA GPUs")
    assert not r.nvml and r.catalog == "cpu" and r.note
    assert r.host_memory_bytes > 0


def test_replay_raises_the_real_error_classes_and_refuses_unrecorded_calls():
    import pynvml
    nv = replay("l40s_pcie")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(KeyError, match="nvmlDeviceGetEccMode"):
        nv.nvmlDeviceGetEccMode(h)
    assert isinstance(nv.nvmlDeviceGetPciInfo(h).busId, bytes)


def test_recording_replays_to_the_same_probe(tmp_path):
    """RecordingNVML around a module (here a replay) writes a file that replays identically:
    the path a real machine takes with `planner profile --record-nvml FILE`."""
    rec = RecordingNVML(replay("dgx_h100"))
    first = probe(rec, host="dgx")
    rec.save(tmp_path / "rec.json", "test")
    data = json.loads((tmp_path / "rec.json").read_text())
    assert data["calls"]["nvmlDeviceGetNvLinkState"]["0,18"] == {"error": "NVML_ERROR_INVALID_ARGUMENT"}
    assert f"0,{AFFINITY_WORDS}" in data["calls"]["nvmlDeviceGetCpuAffinity"]
    again = probe(ReplayNVML(data), host="dgx")
    assert again.to_dict() == first.to_dict()


def test_direct_nvlink_peers_are_mapped_by_bus_id():
    """Synthetic (not a recording): two GPUs joined by 4 direct links, as an NVLink bridge
    does; the peer is found by matching the remote PCI bus id (legacy and v2 forms)."""
    calls = json.loads((DATA / "l40s_pcie.json").read_text())["calls"]
    calls = {k: v for k, v in calls.items()}
    calls["nvmlDeviceGetCount"] = {"": 2}
    calls["nvmlDeviceGetNvLinkState"] = {"*,0-3": 1, "*,*": {"error": "NVML_ERROR_INVALID_ARGUMENT"}}
    calls["nvmlDeviceGetNvLinkVersion"] = {"*,*": 4}
    calls["nvmlDeviceGetNvLinkRemoteDeviceType"] = {"*,*": 0}
    calls["nvmlDeviceGetNvLinkRemotePciInfo"] = {"0,*": {"busId": "0000:1C:00.0"}, "1,*": {"busId": "00000000:1B:00.0"}}
    r = probe(ReplayNVML({"calls": calls}), host="bridge")
    assert r.gpus[0].nvlink_peers == {1: 4} and r.gpus[1].nvlink_peers == {0: 4}
    assert r.topology == [["X", "NV4"], ["NV4", "X"]]


def test_catalog_match_and_cpu_list():
    assert catalog_for_gpu("NVIDIA H200") == "dgx-h200"
    assert catalog_for_gpu("NVIDIA A100-SXM4-40GB") == "dgx-a100-40gb"
    assert catalog_for_gpu("NVIDIA A100-SXM4-80GB") == "dgx-a100-80gb"
    assert catalog_for_gpu("NVIDIA RTX 6000 Ada Generation") is None   # unknown stays unknown
    assert _cpu_list([0b1011, 1]) == "0-1,3,64"
