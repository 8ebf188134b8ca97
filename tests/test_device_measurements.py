"""The cost model's figures taken from this project's H200 measurements (bench/results/device-h200,
written by bench/device_check.sh and bench/device_step.py in session 31) are recomputed here from the
files, so a constant cannot drift from the measurement it names; and the builtin target's price is held
against the measured step of the runtime it prices (the same files), with the error the README reports.
"""
from __future__ import annotations

import json

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.gemm_shape import ALIGN1_FACTOR, alignment_factor
from planner.cli import device_results
from planner.cli.device_results import H200, LAUNCHES

_step = device_results.step_profile


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


@pytest.mark.parametrize("launch, model, batch, mb", LAUNCHES)
def test_builtin_price_against_the_measured_launch(launch, model, batch, mb):
    """`planner launch` on the H200 (bench/results/device-h200/launch-*.txt, fused AdamW) against the
    builtin target's price on the profiled cluster (a Megatron price was 2.04x optimistic against the
    runtime, launch-before.txt): within 10% at 8 sequences per micro-batch, GPT-3 1.3B's and the Llama
    3.2 1B shape's (on which nothing was fitted); at one sequence, where the host sets the pace (priced
    per layer at the runtime's measured host cost per op, fitted on this configuration's own pass), the
    price is 5-20% slow: the host's and the kernels' time overlap across layers, which a per-layer
    floor does not see."""
    r = device_results.launch(launch, model, batch, mb)
    err = r.step_s / r.priced_step_s - 1
    print(f"{launch}: step {r.priced_step_s * 1e3:.1f} ms priced, {r.step_s * 1e3:.1f} measured ({err:+.1%})")
    assert (abs(err) < 0.10) if mb > 1 else (-0.2 < err < -0.05)


def test_builtin_ranks_the_micro_batches_as_measured():
    """Priced, micro-batch 8 beats 1 for GPT-3 1.3B's batch of 8 on the H200, as measured (403 against
    537 ms); priced as Megatron the planner had chosen 1 and the run took 611 ms (launch-before.txt)."""
    one, eight = device_results.launch(*LAUNCHES[0]), device_results.launch(*LAUNCHES[1])
    assert eight.priced_step_s < one.priced_step_s and eight.step_s < one.step_s
    before = device_results.launch(*device_results.BEFORE)
    assert before.step_s / before.predicted_step_s > 2.0


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


def test_builtin_host_cost_is_the_measured_one():
    """The builtin target's host time per op: GPT-3 1.3B's measured host time for one sequence's pass
    over the ops ``costmodel.host.layer_ops`` counts for it; that pass was host-bound (host time above
    the kernels' busy time, below the wall)."""
    from costmodel.frameworks import FRAMEWORKS
    from costmodel.host import layer_ops
    model = get_model("gpt3-1.3b")
    row = json.loads((H200 / "step-gpt3-1.3b-host.json").read_text())["runs"][0]["by_micro_batch"][0]
    assert row["micro_batch"] == 1 and row["busy_s"] < row["host_issue_s"] < row["fwd_bwd_wall_s"]
    per_op = row["host_issue_s"] / (3 * model.layers * layer_ops(model, "eager"))
    assert FRAMEWORKS["builtin"].host_op_s == pytest.approx(per_op, rel=0.002)


def test_launch_floor_is_the_measured_one():
    """costmodel.host's per-kernel issue costs are the H200's measured launch floor (device_curves.json)."""
    from costmodel.host import GRAPH_NODE_S, HOST_OP_S
    launch = json.loads((H200 / "device_curves.json").read_text())["launch"]
    assert HOST_OP_S == pytest.approx(launch["eager_us_per_kernel"] * 1e-6, rel=1e-9)
    assert GRAPH_NODE_S == pytest.approx(launch["graph_us_per_kernel"] * 1e-6, rel=1e-9)


@pytest.mark.parametrize("launch, model, batch, mb", LAUNCHES)
def test_builtin_peak_memory_against_the_measured_launch(launch, model, batch, mb):
    """The builtin target's peak memory (autocast's saved tensors and the eager loss counted from the
    runtime's code: layers.autocast_saved_bytes, EAGER_LOSS_BYTES) against each H200 launch's measured
    peak: never more than 5% short (a plan that fits on paper must fit), at most 12% over. Before these
    terms the Llama 3.2 1B shape was predicted at 52.0 GiB and used 77.4."""
    r = device_results.launch(launch, model, batch, mb)
    ratio = r.priced_peak_gib / r.peak_gib
    print(f"{launch}: peak {r.priced_peak_gib:.2f} GiB priced, {r.peak_gib:.2f} measured ({ratio - 1:+.1%})")
    assert 0.95 < ratio < 1.12


def test_autocast_casts_follow_the_runtimes_data_parallel_wrap():
    """The runtime wraps FSDP2's mixed precision only at dp > 1 (runtime.parallel.apply_dp), context
    parallelism or not: at dp 1 with cp 2 every weight is cast each micro-batch (layers.autocast_cast_bytes
    priced on the step); at dp 2 they are not, and the residual stream is 16-bit."""
    import dataclasses

    from costmodel.frameworks import FRAMEWORKS
    from costmodel.layers import autocast_cast_bytes
    from costmodel.specs import ParallelConfig, Workload, default_stages
    from costmodel.training import _shared, estimate
    model = get_model("gpt3-1.3b")
    cluster = load_cluster(str(H200 / "cluster.yaml")).with_gpus(2)
    wl = Workload(global_batch=8, seq_len=2048, dtype="bf16")
    builtin = FRAMEWORKS["builtin"]
    sh = _shared(model, cluster, wl, builtin)
    assert sh.autocast_mode(ParallelConfig(cp=2, micro_batch=1, grad_accum=8)) == "fp32"
    assert sh.autocast_mode(ParallelConfig(dp=2, micro_batch=1, grad_accum=4)) == "16-bit"
    par = ParallelConfig(cp=2, micro_batch=1, grad_accum=8)

    def compute(fw) -> float:
        return estimate(model, cluster, wl, par, stages=default_stages(model.layers, 1), framework=fw).time["compute_s"]
    without = dataclasses.replace(builtin, autocast_casts=False)
    casts = 8 * autocast_cast_bytes(model.total_params() - model.embedding_params() + model.vocab * model.hidden, 2)
    # the casts at least at full bandwidth, and the eager ops' own rule on top of the generic one
    assert compute(builtin) - compute(without) > casts / cluster.groups[0].gpu.hbm_bandwidth_bytes_per_s
