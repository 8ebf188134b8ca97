"""The p4d.24xlarge cluster file (calibration/clusters/aws-p4d-a100-40gb.yaml): its EFA figures are
derived from the sources its comments quote, by hand here (stop 23, efa5)."""
from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.files.clusters import load_cluster
from costmodel.units import GB, US

P4D = Path(__file__).resolve().parents[1] / "calibration" / "clusters" / "aws-p4d-a100-40gb.yaml"


def test_efa_on_p4d_is_priced_from_its_measurement_and_nccls_latency_rule():
    p4d, dgx = load_cluster(str(P4D)), load_cluster("dgx-a100-40gb")
    inter = p4d.inter_node
    # 400 Gb/s per instance over its 8 GPUs
    assert inter.bandwidth_bytes_per_s == pytest.approx(400 / 8 / 8 * GB)
    # NVIDIA/nccl#527: all_reduce_perf busbw 29.61 GB/s on 4 p4d.24xlarge, against 50 GB/s per instance
    assert inter.efficiency == pytest.approx(round(29.61 / (400 / 8), 2))
    # NCCL's tuner: per inter-node step its network latency plus the plugin's, twice under Simple;
    # aws-ofi-nccl reports 75 us for p4d.24xlarge, NCCL's InfiniBand transport none
    assert inter.latency_s == pytest.approx(dgx.inter_node.latency_s + 2 * 75 * US)
    # the node itself is the catalog's DGX A100 40GB
    assert p4d.intra_node == dgx.intra_node
