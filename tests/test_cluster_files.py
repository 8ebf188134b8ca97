"""The calibration cluster files' inter-node fabrics: a fabric its source publishes as RoCE or as RDMA
over Ethernet is priced at RoCE's ECMP efficiency (costmodel.specs.ROCE_ECMP_EFFICIENCY, stop 43), an
InfiniBand one at the catalog's InfiniBand efficiency; files whose fabric is not published keep the
catalog's value and say so in their comments."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from costmodel.files.clusters import load_cluster
from costmodel.specs import ROCE_ECMP_EFFICIENCY
from costmodel.training import estimate
from planner.cli import validation

CLUSTERS = Path(__file__).resolve().parents[1] / "calibration" / "clusters"
FILES = sorted(CLUSTERS.glob("*.yaml"))


def _fabric(path: Path) -> str:
    """What the file's own description says its inter-node fabric is."""
    text = yaml.safe_load(path.read_text())["description"]
    if "RoCE" in text or "RDMA" in text:
        # several queue pairs per connection spread a connection's flows over ECMP's paths: the static
        # value does not apply (costmodel.specs.ROCE_ECMP_EFFICIENCY)
        return "roce-spread" if "queue pairs" in text else "roce"
    if "InfiniBand" in text:
        return "ib"
    return "other"


def test_the_ethernet_rdma_fabrics_on_file_are_found():
    # the families priced on them: internlm, skywork (RoCE, their sources' words) and megatron-llama
    # ("RDMA", read as RoCE in the file's comment) under static ECMP; megatron-kwai's with eight queue pairs
    assert {p.name for p in FILES if _fabric(p) == "roce"} == {
        "internlm-a100-80gb-4x100g.yaml", "skywork-a800-80gb-800g.yaml", "alibaba-a100-80gb-4x200g.yaml"}
    assert {p.name for p in FILES if _fabric(p) == "roce-spread"} == {"kwai-h800-8x100g.yaml"}


@pytest.mark.parametrize("path", [p for p in FILES if _fabric(p) != "other"], ids=lambda p: p.stem)
def test_a_roce_fabric_is_priced_at_ecmp_efficiency_and_infiniband_at_the_catalogs(path: Path):
    cluster = load_cluster(str(path))
    base = load_cluster(yaml.safe_load(path.read_text())["extends"])
    if _fabric(path) == "roce":
        assert cluster.inter_node.efficiency == ROCE_ECMP_EFFICIENCY
        assert "ROCE_ECMP_EFFICIENCY" in path.read_text()      # the file names where its value comes from
    else:
        assert cluster.inter_node.efficiency == base.inter_node.efficiency == pytest.approx(0.9)


def test_a_fabric_of_another_kind_keeps_the_catalogs_efficiency_or_names_its_measurement():
    """EFA, GPUDirect-TCPX/TCPXO and the IBM clusters' unnamed fabric: a file that moves the efficiency off its
    base's says what measured it (p4d's nccl-tests figure, tests/test_cluster_p4d.py)."""
    others = [p for p in FILES if _fabric(p) == "other"]
    assert others
    for path in others:
        cluster = load_cluster(str(path))
        base = load_cluster(yaml.safe_load(path.read_text())["extends"])
        if cluster.inter_node.efficiency != base.inter_node.efficiency:
            assert "nccl" in path.read_text().lower(), path.name


def test_ecmp_costs_a_roce_cluster_its_data_parallel_time():
    """The same InternLM run on its RoCE cluster and on the cluster with InfiniBand's efficiency: the compute
    is the same, the exposed data-parallel time grows, and the step by less than the bandwidth ratio."""
    case = next(c for c, _ in validation.all_cases() if c["name"] == "internlm-7b-a100-1024gpu-mb2-m1-nockpt")
    model, cluster, wl, par, prof, _ = validation.case_inputs(case)
    ib = dataclasses.replace(cluster, inter_node=dataclasses.replace(cluster.inter_node, efficiency=0.9))
    roce_est = estimate(model, cluster, wl, par, framework=prof)
    ib_est = estimate(model, ib, wl, par, framework=prof)
    assert roce_est.time["compute_s"] == pytest.approx(ib_est.time["compute_s"])
    assert roce_est.time["dp_comm_s"] > ib_est.time["dp_comm_s"]
    assert 1.0 < roce_est.step_time_s / ib_est.step_time_s < 0.9 / ROCE_ECMP_EFFICIENCY
