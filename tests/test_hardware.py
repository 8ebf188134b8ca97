"""The hardware catalog's newer systems and the NVLink domain as its own notion: GB200/GB300
NVL72 racks (72 GPUs over NVLink, hosts of 4), DGX B300, DGX H800; jobs on part of a domain."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.comm import Network, group_layout, layout_for
from costmodel.specs import NodeGroup, ParallelConfig, SpecError, Workload
from costmodel.training import estimate
from costmodel.units import GB
from costmodel.files.clusters import cluster_from_dict, cluster_to_dict, load_cluster


@pytest.mark.parametrize("name,gpn,domain,intra,inter", [
    ("gb200-nvl72", 4, 72, 900, 50), ("gb300-nvl72", 4, 72, 900, 100),
    ("dgx-b300", 8, 8, 900, 100), ("dgx-h800", 8, 8, 200, 50)])
def test_new_systems_from_datasheets(name, gpn, domain, intra, inter):
    c = load_cluster(name)
    assert (c.gpus_per_node, c.nvlink_gpus) == (gpn, domain)
    assert c.intra_node.bandwidth_bytes_per_s == intra * GB and c.inter_node.bandwidth_bytes_per_s == inter * GB
    assert c.gpu.peak("fp8") == pytest.approx(2 * c.gpu.peak("bf16"), rel=1e-3)


def test_h800_is_an_h100_with_the_nvlink_cut():
    h100, h800 = load_cluster("dgx-h100"), load_cluster("dgx-h800")
    assert h800.gpu.peak("bf16") == h100.gpu.peak("bf16") and h800.gpu.memory_bytes == h100.gpu.memory_bytes
    assert h800.intra_node.bandwidth_bytes_per_s < h100.intra_node.bandwidth_bytes_per_s / 2


def test_nvl72_sized_to_part_of_a_domain():
    c = load_cluster("gb200-nvl72").with_gpus(256)         # 3 full racks and 40 GPUs of a fourth
    assert (c.total_gpus, c.nodes, c.gpus_per_node, c.nvlink_gpus) == (256, 64, 4, 72)
    small = load_cluster("gb200-nvl72").with_gpus(16)      # 4 trays of one rack
    assert (small.nodes, small.nvlink_gpus) == (4, 16)
    assert load_cluster("gb200-nvl72").with_gpus(2).nvlink_gpus == 2
    with pytest.raises(SpecError, match="--gpus 250 does not fill whole nodes of 4 GPUs.*try 248 or 252"):
        load_cluster("gb200-nvl72").with_gpus(250)
    assert cluster_from_dict(cluster_to_dict(c)) == c    # plan files keep the domain


@pytest.mark.parametrize("dim,degrees", [("tp", {"dp": 16, "tp": 16}), ("dp", {"dp": 16, "tp": 16})])
def test_group_of_16_stays_on_nvlink_on_nvl72_and_crosses_hosts_on_b200(dim, degrees):
    """A TP group of 16 (stride 1), and an EP group of 16 inside dp with tp 4 (stride 4), stay in
    the NVLink domain on NVL72; on DGX B200 (8 per NVLink domain) both cross the network."""
    nvl, b200 = load_cluster("gb200-nvl72").with_gpus(256), load_cluster("dgx-b200").with_gpus(256)
    order = ("pp", "dp", "cp", "tp")
    if dim == "tp":
        on_nvl = group_layout(degrees, order, "tp", nvl.nvlink_gpus)
        on_b200 = group_layout(degrees, order, "tp", b200.nvlink_gpus)
    else:   # expert group of 16 at the stride of tp 4
        on_nvl, on_b200 = layout_for(16, 4, nvl.nvlink_gpus), layout_for(16, 4, b200.nvlink_gpus)
    assert not on_nvl.crosses_nodes and on_nvl.k == 16
    assert on_b200.crosses_nodes and on_b200.k == 8 // (1 if dim == "tp" else 4)
    size = 256e6
    t_nvl, t_b200 = Network(nvl).all_reduce(size, on_nvl), Network(b200).all_reduce(size, on_b200)
    # hierarchical: a 1/8 shard crosses the 18x slower network on B200, at once with the NVLink part
    # (comm.PIPELINED_TIERS), so the network's 8 NICs set the time, plus its two steps: 1.11x the rack's
    assert t_nvl < t_b200 / 1.1
    assert Network(nvl).all_to_all(size, on_nvl) < Network(b200).all_to_all(size, on_b200) / 3


def test_layout_on_a_domain_that_is_not_a_power_of_two():
    """72 GPUs hold 18 members of a 32-member group at stride 4; whole groups of 16 are placed
    per domain, so the group spans 2 domains (not 1 with the cross-domain part lost)."""
    lay = layout_for(32, 4, 72)
    assert (lay.k, lay.nodes) == (16, 2)
    assert layout_for(8, 16, 72) == (8, 4)
    assert layout_for(32, 4, 8) == (32, 2) and layout_for(64, 1, 8) == (64, 8)   # powers of two unchanged


def test_nvlink_domain_must_be_whole_hosts(tmp_path):
    f = tmp_path / "odd.yaml"
    f.write_text("extends: gb200-nvl72\nnvlink_domain: 70\n")
    with pytest.raises(SpecError, match="'nvlink_domain' 70 must be a whole number of hosts of 'gpus_per_node' 4"):
        load_cluster(str(f))
    f.write_text("extends: gb200-nvl72\nnvlink_domain: true\n")
    with pytest.raises(SpecError, match="'nvlink_domain' must be a number"):
        load_cluster(str(f))
    g = load_cluster("gb200-nvl72").main
    with pytest.raises(SpecError, match="nvlink_domain must be >= 0, got -4"):
        dataclasses.replace(g, nvlink_domain=-4)
    # the default is the host, and stays the host when the host changes
    h = load_cluster("dgx-b200").main
    assert h.nvlink_domain == 0 and dataclasses.replace(h, gpus_per_node=2, nodes=4).nvlink_gpus == 2
    assert NodeGroup(name="x", gpu=h.gpu, gpus_per_node=8, nodes=2, intra_node=h.intra_node,
                     nvlink_domain=8).nvlink_domain == 0


def test_estimate_runs_on_part_of_an_nvl72():
    c = load_cluster("gb200-nvl72").with_gpus(256)
    m = get_model("llama-3.1-70b")
    w = Workload(global_batch=64, seq_len=8192)
    e = estimate(m, c, w, ParallelConfig(tp=4, pp=4, dp=16, micro_batch=1, grad_accum=4, sp=True))
    assert e.step_time_s > 0 and e.memory["peak_bytes"] < c.gpu.memory_bytes


def test_a_catalog_cluster_is_known_however_it_is_typed(capsys):
    """``--cluster DGX-H100`` or ``dgx_h100`` is the catalog's dgx-h100 (case, ``_`` and spaces do not matter);
    a bare GPU name is still refused, with the clusters that have it, since it names no network."""
    from planner.cli import main
    assert load_cluster("DGX-H100") == load_cluster("dgx-h100") == load_cluster(" dgx_h100 ")
    assert load_cluster("GB200-NVL72").name == "gb200-nvl72"
    with pytest.raises(SpecError, match=r"unknown cluster 'h100'; did you mean dgx-h100"):
        load_cluster("h100")
    base = ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--dp", "8", "--global-batch", "8", "--seq-len", "4096",
            "--json"]
    assert main(base + ["--cluster", "DGX_H100"]) == 0
    typed = capsys.readouterr().out
    assert main(base + ["--cluster", "dgx-h100"]) == 0
    assert typed == capsys.readouterr().out


def test_a_plan_on_a_catalog_cluster_typed_otherwise_records_the_catalog(tmp_path, capsys):
    """The plan file's provenance says where its cluster came from; a catalog name typed in capitals is the
    catalog, not a file (``planner.cli.args.cluster_source_of``), so ``planner plan --like`` finds it again."""
    from planner.cli import main
    from planner.plan.planfile import read_plan
    out = tmp_path / "plan.yaml"
    assert main(["plan", "--model", "tiny-llama", "--cluster", "DGX-H100", "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "128", "--target", "megatron", "--max-time", "5", "--out", str(out)]) == 0
    capsys.readouterr()
    plan = read_plan(str(out))
    assert plan.cluster.name.startswith("dgx-h100") and plan.provenance["cluster_source"] == "catalog"
