"""GPUs run below their rated power: ``GpuSpec.tdp_w`` (the catalog's datasheet figure) and
``GpuSpec.power_limit_w`` (a cluster file's or a profile's), what the limit costs where a measured curve is
on file (``costmodel.power``: the H100 SXM5's; compute-bound work only), and the warning a prediction on
such GPUs carries either way (``costmodel.ceilings.power_flag``). On a part without a curve (A100) the
prediction is the same with or without the limit, and says so."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from costmodel.ceilings import power_flag
from costmodel.files.clusters import CATALOG_FILE, cluster_from_dict, cluster_to_dict, load_cluster
from costmodel.specs import SpecError
from planner.cli.report import credibility

ROOT = Path(__file__).resolve().parents[1]
GRAND_TETON = ROOT / "calibration" / "clusters" / "meta-grandteton-h100-96gb-hbm2e.yaml"
DATA = Path(__file__).parent / "data" / "nvml"


def test_every_catalog_gpu_states_its_rated_power():
    """Each catalog part but the CPU test rig carries the board power its datasheet rates it at, the
    figure of the reference notes the catalog's comment cites."""
    names = [n for n in yaml.safe_load(CATALOG_FILE.read_text()) if n != "cpu"]
    rated = {n: load_cluster(n).groups[0].gpu.tdp_w for n in names}
    assert all(w > 0 for w in rated.values()), rated
    assert rated["dgx-h100"] == rated["dgx-h200"] == rated["dgx-h800"] == 700
    assert (rated["dgx-b200"], rated["dgx-b300"], rated["gb200-nvl72"], rated["gb300-nvl72"]) == (1000, 1100, 1200, 1400)
    assert load_cluster("cpu").groups[0].gpu.tdp_w == 0


def _capped(limit: float, nodes: int = 1, base: str = "dgx-h100"):
    spec = load_cluster(base)
    gpu = dataclasses.replace(spec.groups[0].gpu, power_limit_w=limit)
    return dataclasses.replace(spec, groups=(dataclasses.replace(spec.groups[0], gpu=gpu, nodes=nodes),))


def test_the_flag_fires_only_below_the_rated_power_and_without_a_measured_profile():
    gpu = load_cluster("dgx-h100").groups[0].gpu
    capped = dataclasses.replace(gpu, power_limit_w=500)
    assert power_flag([gpu], measured=False) is None                                   # no limit given
    assert power_flag([dataclasses.replace(gpu, power_limit_w=700)], measured=False) is None   # at the rated power
    said = power_flag([capped], measured=False)
    assert said and "500 W" in said and "700 W" in said and "planner profile" in said and gpu.name in said
    assert power_flag([capped], measured=True) is None                                 # measured at the limit
    # a part whose rated power is unknown (a GPU outside the catalog): nothing to compare with
    assert power_flag([dataclasses.replace(gpu, tdp_w=0, power_limit_w=500)], measured=False) is None
    # a mixed cluster: a capped group anywhere is flagged, named by its part
    a100 = load_cluster("dgx-a100-80gb").groups[0].gpu
    assert power_flag([a100, capped], measured=False) == said


def test_the_h100_curve_is_the_published_table():
    """``costmodel.power``'s curve against the slow obvious version: the six published tokens/s per GPU of Llama 3
    8B pre-training on H100 SXM5 94 GB HBM2e at 200-700 W (arXiv 2603.16164, Table 4) over the 700 W one, linear
    between the limits, proportional below the lowest; 1 at or above the rated power, without a limit, and on a
    part with no curve."""
    from costmodel.power import power_rate_factor
    table = {200: 9699.3, 300: 17982.3, 400: 24853.4, 500: 27705.3, 600: 29250.0, 700: 30271.0}
    name = "H100-SXM5-96GB-HBM2e"
    for w, tps in table.items():
        assert power_rate_factor(name, 700, w) == pytest.approx(tps / table[700], abs=1e-12)
    assert power_rate_factor(name, 700, 550) == pytest.approx((table[500] + table[600]) / 2 / table[700])
    assert power_rate_factor(name, 700, 100) == pytest.approx(table[200] / table[700] / 2)
    assert power_rate_factor(name, 700, 0) == power_rate_factor(name, 700, 700) == power_rate_factor(name, 700, 800) == 1
    assert power_rate_factor("H100-SXM5-80GB", 700, 500) == power_rate_factor(name, 700, 500)    # the same die and board
    assert power_rate_factor("A100-SXM4-80GB", 400, 300) == power_rate_factor("H200-SXM-141GB", 700, 500) == 1.0


def test_a_capped_h100_is_priced_slower_on_compute_and_flagged():
    """At 500 W the H100's compute-bound work runs at the curve's 0.915 (its rate; GEMM and attention time
    scale by 1/0.915), memory-bound work and communication do not, so the step is slower by less than
    1/0.915; memory is the same. The credibility keeps the warning and says what it was priced on."""
    from costmodel.catalog import get_model
    from costmodel.power import power_rate_factor
    from costmodel.specs import ParallelConfig, Workload
    from costmodel.training import estimate
    model = get_model("llama-3-8b")
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, dp=16, micro_batch=1, grad_accum=4, zero=1)
    free, capped = _capped(0.0, nodes=2), _capped(500.0, nodes=2)
    f = power_rate_factor(capped.groups[0].gpu.name, 700, 500)
    assert capped.groups[0].gpu.rate("bf16") == pytest.approx(free.groups[0].gpu.rate("bf16") * f)
    assert capped.groups[0].gpu.peak("bf16") == free.groups[0].gpu.peak("bf16")      # MFU's basis is unchanged
    a, b = estimate(model, free, wl, par), estimate(model, capped, wl, par)
    assert a.step_time_s < b.step_time_s < a.step_time_s / f and a.memory == b.memory
    ca = credibility(model, free, wl, a.step_time_s, a.mfu, par=par)
    cb = credibility(model, capped, wl, b.step_time_s, b.mfu, par=par)
    assert ca["power_flag"] is None and "500 W" in cb["power_flag"] and f"{f:.3f}" in cb["power_flag"]
    # the same capped cluster once measured (a profile's GEMM table, taken at the limit): priced on the table at
    # the datasheet peak, with no warning
    measured = dataclasses.replace(capped, matmul_table=((4096.0, 0.7), (8192.0, 0.75)))
    assert measured.measured_profile
    assert credibility(model, measured, wl, b.step_time_s, b.mfu, par=par)["power_flag"] is None


def test_a_capped_part_without_a_curve_is_priced_the_same_and_flagged():
    """An A100 at 300 W (no curve on file): the estimate is the rated part's to the last bit; the warning says
    the limit is not priced."""
    from costmodel.catalog import get_model
    from costmodel.specs import ParallelConfig, Workload
    from costmodel.training import estimate
    model = get_model("llama-3-8b")
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, dp=16, micro_batch=1, grad_accum=4, zero=1)
    free, capped = _capped(0.0, nodes=2, base="dgx-a100-80gb"), _capped(300.0, nodes=2, base="dgx-a100-80gb")
    a, b = estimate(model, free, wl, par), estimate(model, capped, wl, par)
    assert a.step_time_s == b.step_time_s and a.memory == b.memory
    cb = credibility(model, capped, wl, b.step_time_s, b.mfu, par=par)
    assert "300 W" in cb["power_flag"] and "not priced" in cb["power_flag"]


def test_the_fields_round_trip_and_bad_values_are_refused():
    spec = load_cluster(str(GRAND_TETON))
    gpu = spec.groups[0].gpu
    assert (gpu.tdp_w, gpu.power_limit_w) == (700, 500)        # the rated part's, from the catalog it extends
    assert cluster_from_dict(cluster_to_dict(spec)) == spec
    base = yaml.safe_load(GRAND_TETON.read_text())
    for bad in (-1, "500W", float("nan")):
        d = dict(base, gpu=dict(base["gpu"], power_limit_w=bad))
        with pytest.raises(SpecError, match="power_limit_w"):
            cluster_from_dict(d)


def test_the_grand_teton_file_warns_through_the_command(tmp_path):
    """The file of torchtitan's published hosts (500 W): `planner plan` prints the warning and puts it in
    its JSON; the catalog H100 the file extends gets neither."""
    planner = str(Path(sys.executable).with_name("planner"))
    args = ["--model", "llama-3-8b", "--gpus", "16", "--global-batch", "32", "--seq-len", "4096",
            "--target", "torchtitan", "--max-time", "20"]
    capped = subprocess.run([planner, "plan", "--cluster", str(GRAND_TETON), *args], capture_output=True, text=True)
    assert capped.returncode == 0, capped.stderr
    assert "500 W power limit" in capped.stdout
    out = subprocess.run([planner, "plan", "--cluster", str(GRAND_TETON), *args, "--json"], capture_output=True,
                         text=True)
    assert "500 W" in json.loads(out.stdout)["plans"][0]["uncertainty"]["power_flag"]
    rated = subprocess.run([planner, "plan", "--cluster", "dgx-h100", *args], capture_output=True, text=True)
    assert rated.returncode == 0 and "power limit" not in rated.stdout


def test_a_profile_writes_a_power_limit_below_the_rated_power(tmp_path):
    """NVML's enforced limit below the catalog part's rated power is written into the measured file
    (with the rated power); at the rated power only the rated power is."""
    from profiles.probe import ReplayNVML, probe
    from profiles.profile import analyze, write_outputs
    from test_profile_fit import _result
    from costmodel.units import GB
    calls = dict(json.loads((DATA / "dgx_h100.json").read_text())["calls"])
    res = _result("cuda", nodes=2, gpn=8, best_tflops=700.0, intra_bw=360 * GB, inter_bw=45 * GB)
    rated = analyze(probe(ReplayNVML({"calls": calls}), host="dgx"), res, name="h100", quick=True,
                    started=time.time(), method="test").cluster["gpu"]
    assert rated["tdp_w"] == 700 and "power_limit_w" not in rated
    calls["nvmlDeviceGetPowerManagementLimit"] = {"*": 500000}        # milliwatts, as NVML answers
    prof = analyze(probe(ReplayNVML({"calls": calls}), host="dgx"), res, name="h100-500w", quick=True,
                   started=time.time(), method="test")
    assert prof.cluster["gpu"]["power_limit_w"] == 500
    spec = load_cluster(write_outputs(prof, tmp_path, report=True)["cluster_file"])
    assert spec.groups[0].gpu.power_limit_w == 500
    md = (tmp_path / "report.md").read_text()                # the report's machine table shows it per GPU
    assert "| power limit |" in md and md.count("| 500 W |") == 8     # the probed host's 8 GPUs
    assert spec.measured_profile and power_flag([spec.groups[0].gpu], spec.measured_profile) is None   # at the limit


def test_a_serving_plan_on_capped_gpus_carries_the_warning():
    """Serving's plans (`planner plan --mode infer`) say the same, in serving's terms, in the human output and in
    each plan's JSON (`serving.power_flag`); null on the rated part."""
    from cli_harness import run
    args = ["plan", "--mode", "infer", "--model", "llama-3-8b", "--gpus", "8", "--prompt-len", "1024",
            "--output-len", "256", "--tpot-slo-ms", "50", "--max-time", "20"]
    capped = run([*args, "--cluster", str(GRAND_TETON)], timeout_s=120)
    assert capped.code == 0, capped.where()
    assert "warning: the H100-SXM5-96GB-HBM2e GPUs run at a 500 W power limit" in capped.out
    assert "lower throughput and longer latencies" in capped.out
    js = run([*args, "--cluster", str(GRAND_TETON), "--json"], timeout_s=120).json()
    assert "500 W" in js["plans"][0]["serving"]["power_flag"]
    rated = run([*args, "--cluster", "dgx-h100", "--json"], timeout_s=120).json()
    assert rated["plans"][0]["serving"]["power_flag"] is None
