"""A direct NVLink mesh inside a node (``LinkSpec.mesh_peers``, ``costmodel.comm``'s "Direct meshes"):
an HGX 4-GPU board has no NVSwitch, so a pair of GPUs moves data over its own links only. Held
against the plain ring arithmetic, written out here, and against the switched link it replaces."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from costmodel.comm import GroupLayout, Network
from costmodel.files.clusters import cluster_to_dict, load_cluster
from costmodel.specs import LinkSpec, SpecError

ROOT = Path(__file__).resolve().parent.parent
TSUBAME = ROOT / "calibration/clusters/tsubame4-h100-94gb-4xndr200.yaml"
MB = 1e6


def test_share_by_group_size():
    link = LinkSpec(name="nvlink4-mesh", bandwidth_bytes_per_s=450e9, mesh_peers=3)
    assert [link.mesh_share(k) for k in (1, 2, 3, 4)] == pytest.approx([1.0, 1 / 3, 2 / 3, 1.0])
    # a switched link gives every group the whole rate
    assert LinkSpec(name="nvlink4", bandwidth_bytes_per_s=450e9).mesh_share(2) == 1.0


def test_collectives_on_the_mesh_against_the_ring_arithmetic():
    """All-gather among k GPUs of the node: (k-1)/k * S at the link's effective rate times the share,
    plus (k-1) hops of its latency; the four-GPU ring costs what the switched link costs, a pair three
    times the switched pair's transfer."""
    mesh = Network(load_cluster(str(TSUBAME)))
    link = mesh.intra
    assert link.mesh_peers == 3
    switched = Network(dataclasses.replace(load_cluster(str(TSUBAME)), groups=tuple(
        dataclasses.replace(g, intra_node=dataclasses.replace(g.intra_node, mesh_peers=0))
        for g in load_cluster(str(TSUBAME)).groups)))
    size = 64 * MB
    for k in (2, 4):
        share = min(k - 1, 3) / 3
        slow = (k - 1) / k * size / (link.effective_bytes_per_s * share) + (k - 1) * link.latency_s
        assert mesh.all_gather(size, GroupLayout(k, k)) == pytest.approx(slow)
        assert mesh.all_gather_fn(GroupLayout(k, k))(size) == pytest.approx(slow)     # the fast path agrees
        assert mesh.all_reduce(size, GroupLayout(k, k)) == pytest.approx(
            2 * (k - 1) / k * size / (link.effective_bytes_per_s * share) + 2 * (k - 1) * link.latency_s)
    pair_mesh = mesh.all_gather(size, GroupLayout(2, 2)) - link.latency_s
    pair_switched = switched.all_gather(size, GroupLayout(2, 2)) - link.latency_s
    assert pair_mesh == pytest.approx(3 * pair_switched)
    assert mesh.all_gather(size, GroupLayout(4, 4)) == pytest.approx(switched.all_gather(size, GroupLayout(4, 4)))
    # one send/recv reaches its one peer over that pair's links: a third of the switched rate at most
    assert mesh.p2p(size, False, 2) >= size / (link.effective_bytes_per_s / 3)
    # across nodes the mesh changes nothing: a group of one GPU per node only uses the network
    assert mesh.all_gather(size, GroupLayout(8, 1)) == pytest.approx(switched.all_gather(size, GroupLayout(8, 1)))


def test_the_cluster_file_round_trips_and_bad_values_are_refused(tmp_path):
    c = load_cluster(str(TSUBAME))
    d = cluster_to_dict(c)
    out = tmp_path / "c.yaml"
    out.write_text(yaml.safe_dump(d))
    assert load_cluster(str(out)).groups[0].intra_node.mesh_peers == 3
    f = tmp_path / "wide.yaml"
    f.write_text("extends: dgx-h100\ngpus_per_node: 4\nintra_node: {name: mesh, gb_per_s: 450, mesh_peers: 7}\n")
    with pytest.raises(SpecError, match="mesh_peers 7 needs at least 8 GPUs linked together, but the NVLink domain has 4"):
        load_cluster(str(f))
    for bad in (2.5, -1, "three"):
        f = tmp_path / "bad.yaml"
        f.write_text(f"extends: dgx-h100\nintra_node: {{name: mesh, gb_per_s: 450, mesh_peers: {bad!r}}}\n"
                     if isinstance(bad, str) else
                     f"extends: dgx-h100\nintra_node: {{name: mesh, gb_per_s: 450, mesh_peers: {bad}}}\n")
        with pytest.raises(SpecError, match="mesh_peers"):
            load_cluster(str(f))


def test_a_mesh_on_the_network_is_refused_with_a_hint(tmp_path):
    """``mesh_peers`` describes a node's GPU links; written on the network it would be ignored, so it is
    refused: by the loader, and by the command with exit code 2 and no traceback."""
    import subprocess
    import sys

    f = tmp_path / "bad.yaml"
    f.write_text("extends: dgx-h100\ninter_node: {name: ib, gb_per_s: 50, mesh_peers: 3}\n")
    with pytest.raises(SpecError, match="inter_node: mesh_peers=3 .*move it to intra_node"):
        load_cluster(str(f))
    res = subprocess.run([sys.executable, "-m", "planner", "estimate", "--model", "llama-3-8b", "--cluster",
                          str(f), "--gpus", "8", "--global-batch", "64", "--seq-len", "2048", "--tp", "2"],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    assert res.returncode == 2, res.stderr
    assert "move it to intra_node" in res.stderr and "Traceback" not in res.stderr
