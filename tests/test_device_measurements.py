"""The cost model's figures taken from this project's H200 measurements (bench/results/device-h200,
written by bench/device_check.sh and bench/device_step.py in session 31) are recomputed here from the
files, so a constant cannot drift from the measurement it names; and the builtin target's price is held
against the measured step of the runtime it prices (the same files), with the error the README reports.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.gemm_shape import ALIGN1_FACTOR, alignment_factor
from costmodel.specs import ParallelConfig, Workload, default_stages
from costmodel.training import estimate

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "bench" / "results" / "device-h200"


def _step(name: str) -> dict:
    return json.loads((H200 / f"step-{name}.json").read_text())


def _layer_gemm_flops(model, tokens: int) -> float:
    """Forward + both backward GEMMs of every layer (not the head), 2 FLOPs per multiply-add."""
    h, f = model.hidden, model.ffn_hidden
    kv = model.kv_heads * model.head_dim
    per_token = h * (h + 2 * kv) + h * h + (3 if model.mlp == "swiglu" else 2) * h * f
    return 3 * 2 * tokens * per_token * model.layers


def test_align1_factor_is_the_measured_head_over_the_layers():
    """ALIGN1_FACTOR: GPT-3 1.3B's unpadded head (n = 50,257, one-element-aligned CUTLASS kernels)
    against the same pass's aligned layer GEMMs, throughput over throughput, mean over micro-batches."""
    model = get_model("gpt3-1.3b")
    assert model.vocab % 2 == 1
    ratios = []
    for row in _step("gpt3-1.3b")["runs"][0]["by_micro_batch"]:
        head = [k for k in row["top_kernels"] if "align1" in k["name"]]
        assert len(head) == 3 and all(k["count"] == 1 for k in head)     # forward, dgrad, wgrad
        head_s = sum(k["s"] for k in head)
        tokens = row["tokens"]
        head_rate = 3 * 2 * tokens * model.vocab * model.hidden / head_s
        layer_rate = _layer_gemm_flops(model, tokens) / (row["busy_by_kind_s"]["gemm"] - head_s)
        ratios.append(head_rate / layer_rate)
    assert len(ratios) == 4
    assert sum(ratios) / len(ratios) == pytest.approx(ALIGN1_FACTOR, abs=0.0015)
    # an odd BF16 width is priced at it; an aligned one is not
    assert alignment_factor(model.vocab, model.hidden, 2) == ALIGN1_FACTOR
    assert alignment_factor(50304, model.hidden, 2) == 1.0


def test_eager_gemms_run_at_the_profiled_curve():
    """Eager PyTorch's GEMMs run at the profiled cluster's curve, the unpadded head at its alignment:
    every GEMM of the measured pass of both models (GPT-3 1.3B; Llama-3.1-8B, whose measurement chose
    no constant) is within 12% of that price, and over 30% faster than the curve times the builtin
    target's kernel efficiency (0.94 x the sm_90 factor 0.71). So that factor is not a GEMM loss: the
    target keeps it as the stand-in for its memory-bound kernels and idle time, which it under-prices."""
    from costmodel.compute import gemm_time_s
    cluster = load_cluster(str(H200 / "cluster.yaml"))
    gpu = cluster.groups[0].gpu
    for name in ("gpt3-1.3b", "llama-3.1-8b"):
        model = get_model(name)
        h, f = model.hidden, model.ffn_hidden
        kv = model.kv_heads * model.head_dim
        shapes = [(h + 2 * kv, h), (h, h)] + [(f, h)] * (2 if model.mlp == "swiglu" else 1) + [(h, f)]
        for row in _step(name)["runs"][0]["by_micro_batch"]:
            T = row["tokens"]
            # forward and the two backward GEMMs of each, at the training GEMMs' shape factor
            priced = 3 * (model.layers * sum(gemm_time_s(gpu, cluster, "bf16", T, n, k, train=True) for n, k in shapes)
                          + gemm_time_s(gpu, cluster, "bf16", T, model.vocab, h, train=True))
            measured = row["busy_by_kind_s"]["gemm"]
            print(name, row["micro_batch"], f"priced {priced * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms")
            assert abs(priced / measured - 1) < 0.12, (name, row["micro_batch"], priced, measured)
            assert priced / (0.94 * 0.71) / measured - 1 > 0.3


@pytest.mark.parametrize("mb, measured_s", [(8, 0.4026), (1, 0.5372)])
def test_builtin_price_against_the_measured_launch(mb, measured_s):
    """`planner launch` of GPT-3 1.3B on the H200 (bench/results/device-h200/launch-builtin-*.txt:
    micro-batch 8 and micro-batch 1, fused AdamW) against the builtin target's price on the profiled
    cluster (it was 2.04x optimistic priced as Megatron, launch-before.txt): within 5% at 8; at 1 the
    price is 15-30% short, the GPU's idle time between kernels (about 8 ms per micro-batch,
    step-gpt3-1.3b.json: wall less busy) being unpriced; and it ranks the two as the measurement does."""
    text = (H200 / ("launch-builtin-planned.txt" if mb == 8 else "launch-builtin-mb1.txt")).read_text()
    assert f"{measured_s * 1e3:.1f} ms" in text
    cluster = load_cluster(str(H200 / "cluster.yaml"))
    model = get_model("gpt3-1.3b")
    wl = Workload(global_batch=8, seq_len=2048, dtype="bf16")

    def price(m: int) -> float:
        return estimate(model, cluster, wl, ParallelConfig(micro_batch=m, grad_accum=8 // m),
                        stages=default_stages(model.layers, 1), framework="builtin").step_time_s
    err = measured_s / price(mb) - 1
    print(f"micro-batch {mb}: measured {measured_s * 1e3:.1f} ms, priced {price(mb) * 1e3:.1f} ms ({err:+.1%})")
    assert (abs(err) < 0.05) if mb == 8 else (0.15 < err < 0.3)
    assert price(8) < price(1)


def _eager_other(name: str) -> tuple[float, float, float]:
    """(measured, priced ops at full bandwidth, priced loss at full bandwidth): seconds per sequence of
    the pass's kernels that are neither GEMMs nor attention, from micro-batch 1 to the largest."""
    from costmodel.layers import autocast_eager_bytes
    model = get_model(name)
    rows = _step(name)["runs"][0]["by_micro_batch"]
    lo, hi = rows[0], rows[-1]
    seqs = (hi["tokens"] - lo["tokens"]) / 2048
    measured = (hi["busy_by_kind_s"]["other"] - lo["busy_by_kind_s"]["other"]) / seqs
    bw = load_cluster(str(H200 / "cluster.yaml")).groups[0].gpu.hbm_bandwidth_bytes_per_s
    # the loss per sequence: the logits' upcast (2 + 4 bytes), log-softmax forward (4 + 4) and backward (3 x 4)
    loss = 2048 * model.vocab * (6 + 8 + 12) / bw
    ops = 3 * 2048 * model.layers * autocast_eager_bytes(model, 1, 2) / bw
    return measured, ops, loss


def test_eager_fraction_fitted_on_gpt3_holds_on_llama():
    """layers.EAGER_POINTWISE_FRACTION is GPT-3 1.3B's measured fraction for the runtime's eager ops
    (layers.autocast_eager_bytes, counted from runtime/model.py); on Llama-3.1-8B, whose measurement
    chose nothing, the same fraction prices them within 10%."""
    from costmodel.layers import EAGER_POINTWISE_FRACTION
    measured, ops, loss = _eager_other("gpt3-1.3b")
    assert (ops + loss) / measured == pytest.approx(EAGER_POINTWISE_FRACTION, abs=0.005)
    measured, ops, loss = _eager_other("llama-3.1-8b")
    priced = (ops + loss) / EAGER_POINTWISE_FRACTION
    print(f"llama-3.1-8b: measured {measured * 1e3:.1f} ms per sequence, priced {priced * 1e3:.1f} ms")
    assert abs(priced / measured - 1) < 0.10


def test_launch_floor_is_the_measured_one():
    """costmodel.host's per-kernel issue costs are the H200's measured launch floor (device_curves.json)."""
    from costmodel.host import GRAPH_NODE_S, HOST_OP_S
    launch = json.loads((H200 / "device_curves.json").read_text())["launch"]
    assert HOST_OP_S == pytest.approx(launch["eager_us_per_kernel"] * 1e-6, rel=1e-9)
    assert GRAPH_NODE_S == pytest.approx(launch["graph_us_per_kernel"] * 1e-6, rel=1e-9)
