"""The analytic core: parameter counts, invariants of the cost model, and accuracy against
published runs (the calibration set within 15%, ZeRO memory within 5%)."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from costmodel.catalog import MODELS, from_hf_config, get_model
from costmodel.comm import Network, layout_for
from costmodel.memory import model_state_bytes, stage_param_counts
from costmodel.specs import ParallelConfig, SpecError, Workload, default_stages
from costmodel.training import estimate
from planner.plan.inputs import load_model
from planner.cli.validation import all_rows
from costmodel.files.clusters import load_cluster

HF = Path(__file__).parent / "data" / "hf"


# ---- catalog ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n, d in MODELS.items() if d.get("published_params")])
def test_catalog_parameter_counts_match_published(name):
    m = get_model(name)
    assert m.total_params() == pytest.approx(m.published_params, rel=0.015)


@pytest.mark.parametrize("name,active", [("mixtral-8x7b", 12.9e9), ("mixtral-8x22b", 39e9),
                                         ("deepseek-v3", 37e9), ("qwen3-235b-a22b", 22e9)])
def test_moe_active_parameters(name, active):
    assert get_model(name).active_params() == pytest.approx(active, rel=0.03)


def test_required_catalog_entries():
    for n in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
              "qwen3-235b-a22b", "gpt3-175b", "tiny-llama", "tiny-moe"):
        get_model(n)
    assert get_model("tiny-llama").total_params() < 5e6


@pytest.mark.parametrize("name", sorted(json.loads((HF / "expected_params.json").read_text())))
def test_hf_config_parameter_counts(name):
    expected = json.loads((HF / "expected_params.json").read_text())[name]
    m = load_model(str(HF / f"{name}.json"))
    assert m.total_params() == pytest.approx(expected, rel=0.01)


def test_hf_config_errors_name_file_and_field():
    with pytest.raises(SpecError, match=r"model_type.*'t5'.*supported: llama"):
        from_hf_config({"model_type": "t5"}, where="x/config.json")
    with pytest.raises(SpecError, match=r"x/config.json: missing field 'num_hidden_layers'"):
        from_hf_config({"model_type": "llama", "hidden_size": 64}, where="x/config.json")


def test_unknown_model_suggests_closest():
    with pytest.raises(SpecError, match="did you mean llama-3-70b"):
        get_model("llama3-70b")


def test_cluster_catalog_and_extends(tmp_path):
    for n in ("dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200", "l40s-pcie", "mi300x", "cpu"):
        c = load_cluster(n)
        assert c.gpu.memory_bytes > 0 and c.intra_node.bandwidth_bytes_per_s > 0
    f = tmp_path / "slow.yaml"
    f.write_text("extends: dgx-a100-80gb\nnodes: 4\ninter_node: {gb_per_s: 6.25}\n")
    c = load_cluster(str(f))
    assert c.total_gpus == 32 and c.inter_node.bandwidth_bytes_per_s == 6.25e9
    assert c.gpu.memory_bytes == 80 * 2**30 and c.intra_node.bandwidth_bytes_per_s == 300e9
    with pytest.raises(SpecError, match="unknown key"):
        f.write_text("extends: dgx-h100\ngpu: {memory_gb: 3}\n")
        load_cluster(str(f))


# ---- invariants -------------------------------------------------------------------------

H100 = load_cluster("dgx-h100")


def est(model="llama-3-8b", gpus=8, gb=64, seq=4096, cluster=H100, **par):
    m = get_model(model)
    c = cluster.with_gpus(gpus)
    wl = Workload(global_batch=gb, seq_len=seq)
    par.setdefault("dp", gpus // (par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)))
    par.setdefault("grad_accum", gb // (par["dp"] * par.get("micro_batch", 1)))
    return estimate(m, c, wl, ParallelConfig(**par))


def test_tp1_has_no_tp_comm_and_pp1_no_bubble():
    e = est(tp=1, pp=1)
    assert e.time["tp_comm_s"] == 0 and e.time["bubble_s"] == 0 and e.time["pp_comm_s"] == 0
    assert e.time["cp_comm_s"] == 0 and e.time["ep_comm_s"] == 0
    e2 = est(tp=2, pp=2)
    assert e2.time["tp_comm_s"] > 0 and e2.time["bubble_s"] > 0


def test_single_gpu_has_no_communication():
    e = est(gpus=1, gb=4, seq=2048)
    assert sum(e.time[k] for k in ("tp_comm_s", "dp_comm_s", "pp_comm_s", "cp_comm_s", "ep_comm_s", "bubble_s")) == 0


def test_more_sharding_never_more_memory():
    peaks = [est(zero=z).peak_bytes for z in (0, 1, 2, 3)]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[3]
    tp = [est(tp=t).peak_bytes for t in (1, 2, 4, 8)]
    assert tp == sorted(tp, reverse=True)
    pp = [est(model="llama-3-70b", gpus=64, gb=64, tp=8, pp=p).peak_bytes for p in (1, 2, 4, 8)]
    assert pp == sorted(pp, reverse=True)


def test_recompute_trades_memory_for_time():
    runs = [est(recompute=r) for r in ("none", "selective", "full")]
    acts = [r.memory["activations_bytes"] for r in runs]
    assert acts[0] > acts[1] > acts[2]
    assert runs[0].time["recompute_s"] == 0 < runs[1].time["recompute_s"] < runs[2].time["recompute_s"]
    assert runs[0].hfu == pytest.approx(runs[0].mfu) and runs[2].hfu > runs[2].mfu


def test_interleaving_and_more_microbatches_shrink_the_bubble():
    kw = dict(model="llama-3-70b", gpus=64, gb=64, tp=8, pp=4)
    b1 = est(**kw).time["bubble_s"]
    b2 = est(vpp=2, **kw).time["bubble_s"]
    # half the bubble, plus the interleaved fill's extra hand-offs (stage_terms.interleaved_fill_hops:
    # 10 for p = 4, v = 2), each one activation across nodes (the pipeline group spans them)
    from costmodel.comm import Network
    from costmodel.stage_terms import interleaved_fill_hops
    hop = Network(H100.with_gpus(64)).p2p(4096 * 8192 * 2, True, 4)
    assert interleaved_fill_hops(4, 2) == pytest.approx(10.0)
    assert b2 == pytest.approx(b1 / 2 + 10 * hop, rel=0.01)
    f_small = est(model="llama-3-70b", gpus=64, gb=32, tp=8, pp=4)
    f_big = est(model="llama-3-70b", gpus=64, gb=128, tp=8, pp=4)
    assert f_big.time["bubble_s"] / f_big.step_time_s < f_small.time["bubble_s"] / f_small.step_time_s


def test_bubble_fraction_matches_narayanan():
    # equal stages, m micro-batches: bubble / (m * t) = (p - 1) / m
    e = est(model="llama-3-70b", gpus=64, gb=64, tp=8, pp=4)
    m = 64 // 2
    per_mb = (e.step_time_s - e.time["bubble_s"] - e.time["dp_comm_s"] - e.time["optimizer_s"]) / m
    assert e.time["bubble_s"] / (m * per_mb) == pytest.approx(3 / m, rel=0.15)


def test_tp_across_nodes_is_slower_than_inside():
    inside = estimate(get_model("llama-3-70b"), H100.with_gpus(64), Workload(global_batch=64, seq_len=4096),
                      ParallelConfig(tp=8, pp=2, dp=4, grad_accum=16), order=("pp", "dp", "cp", "tp"))
    across = estimate(get_model("llama-3-70b"), H100.with_gpus(64), Workload(global_batch=64, seq_len=4096),
                      ParallelConfig(tp=8, pp=2, dp=4, grad_accum=16), order=("tp", "pp", "dp", "cp"))
    assert across.time["tp_comm_s"] > 3 * inside.time["tp_comm_s"]


def test_hierarchical_allreduce_bounds():
    net = Network(H100.with_gpus(64))
    s = 1e9
    intra = net.all_reduce(s, layout_for(8, 1, 8))
    inter = net.all_reduce(s, layout_for(8, 8, 8))
    # ring all-reduce moves 2(n-1)/n of the data over the slowest link it uses
    assert intra == pytest.approx(2 * 7 / 8 * s / (450e9 * 0.8), rel=0.01)
    assert inter == pytest.approx(2 * 7 / 8 * s / (50e9 * 0.9), rel=0.01)


def test_moe_ep_comm_and_expert_sharding():
    e1 = est(model="mixtral-8x7b", gpus=32, gb=64, tp=2, pp=1, ep=1, zero=1)
    e8 = est(model="mixtral-8x7b", gpus=32, gb=64, tp=2, pp=1, ep=8, zero=1)
    assert e1.time["ep_comm_s"] == 0 < e8.time["ep_comm_s"]
    assert e8.memory["weights_bytes"] < e1.memory["weights_bytes"] / 3


def test_stage_param_counts_sum_to_model():
    m = get_model("llama-3-70b")
    par = ParallelConfig(tp=8, pp=4, dp=2, grad_accum=4)
    stages = default_stages(m.layers, 4)
    total = sum(stage_param_counts(m, par, i, stages)[0] for i in range(4))
    # everything is split over tp except the norms, which every TP rank keeps
    norms = (2 * m.layers + 1) * m.norm_params()
    assert total * 8 - 7 * norms == pytest.approx(m.total_params(), rel=1e-9)


def test_uneven_stages_make_the_slow_stage_the_bottleneck():
    m = get_model("llama-3-70b")
    c = H100.with_gpus(64)
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=8, pp=2, dp=4, grad_accum=16)
    even = estimate(m, c, wl, par)
    uneven = estimate(m, c, wl, par, stages=(dataclasses.replace(default_stages(80, 2)[0], num_layers=30),
                                             dataclasses.replace(default_stages(80, 2)[1], first_layer=30,
                                                                 num_layers=50)))
    assert uneven.step_time_s > even.step_time_s and uneven.bottleneck_stage == 1


@pytest.mark.parametrize("bad,match", [
    (dict(tp=3, dp=1, grad_accum=64), r"does not divide heads 32"),
    (dict(tp=2, dp=2, grad_accum=16), r"tp\*pp\*dp\*cp = 2\*1\*2\*1 = 4, but there are 8 GPUs"),
    (dict(tp=1, dp=8, grad_accum=3), r"dp\*micro_batch\*grad_accum = 8\*1\*3 = 24, but global_batch is 64"),
    (dict(tp=1, dp=8, ep=2, grad_accum=8), r"ep 2 > 1 but llama-3-8b has no experts"),
])
def test_impossible_configurations_name_the_numbers(bad, match):
    with pytest.raises(SpecError, match=match):
        estimate(get_model("llama-3-8b"), H100.with_gpus(8), Workload(global_batch=64, seq_len=4096),
                 ParallelConfig(**bad))


def test_zero_and_negative_sizes_rejected():
    with pytest.raises(SpecError, match="tp must be an integer >= 1, got 0"):
        ParallelConfig(tp=0)
    with pytest.raises(SpecError, match="seq_len must be > 0"):
        Workload(global_batch=1, seq_len=-5)


# ---- accuracy ---------------------------------------------------------------------------

ROWS = all_rows()


@pytest.mark.parametrize("row", [r for r in ROWS if r.split == "calibration"], ids=lambda r: f"{r.case}:{r.metric}")
def test_calibration_runs_within_15_percent(row):
    assert abs(row.error) <= 0.15, f"{row.case} {row.metric}: published {row.published}, predicted {row.predicted:.4g}"


@pytest.mark.parametrize("row", [r for r in ROWS if r.split == "memory"], ids=lambda r: r.case)
def test_zero_memory_within_5_percent(row):
    assert abs(row.error) <= 0.05


def test_holdout_median_error_under_10_percent():
    errs = [abs(r.error) for r in ROWS if r.split == "holdout"]
    assert len(errs) >= 8
    assert statistics.median(errs) < 0.10


def test_zero_model_states_formula():
    # Rajbhandari et al.: 16 bytes/param baseline, ZeRO-3 divides all by Nd
    s = model_state_bytes(1e9, 64, 0, "fp16", "adam")
    assert s.total == 16e9
    assert model_state_bytes(1e9, 64, 3, "fp16", "adam").total == pytest.approx(16e9 / 64)


def test_validation_markdown_is_current():
    from planner.cli.validation import markdown
    doc = Path(__file__).resolve().parents[1] / "costmodel" / "VALIDATION.md"
    assert doc.exists(), "run `make validation`"
    assert doc.read_text() == markdown(ROWS), "costmodel/VALIDATION.md is stale: run `make validation`"


@pytest.mark.parametrize("recompute, passes", [("none", 3), ("full", 4)])
def test_layer_overhead_adds_per_layer_per_micro_batch(recompute, passes):
    """A host-bound device's fixed cost per layer (``GpuSpec.layer_overhead_s``, forward +
    backward) adds exactly layers x micro-batches of it to a one-stage step, a third more per
    layer recomputed; memory does not change."""
    model = get_model("tiny-llama")
    base = load_cluster("cpu").with_gpus(1)
    ovh = 1.5e-3
    slow = dataclasses.replace(base, groups=tuple(dataclasses.replace(g, gpu=dataclasses.replace(g.gpu,
                               layer_overhead_s=ovh)) for g in base.groups))
    wl = Workload(global_batch=8, seq_len=128, dtype="fp32")
    par = ParallelConfig(micro_batch=2, grad_accum=4, recompute=recompute)
    a, b = estimate(model, base, wl, par), estimate(model, slow, wl, par)
    added = b.step_time_s - a.step_time_s
    assert added == pytest.approx(par.grad_accum * model.layers * ovh * passes / 3, rel=1e-9)
    assert a.peak_bytes == b.peak_bytes
    with pytest.raises(SpecError, match="host overheads"):
        dataclasses.replace(base.gpu, layer_overhead_s=-1e-6)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_fsdp2_wrapper_time_adds_per_block_and_parameter(zero):
    """A host-bound device's FSDP2 wrapper time (``GpuSpec.fsdp2_block_s`` per wrapped module per
    micro-batch, ``dtensor_param_step_s`` per parameter tensor per step) adds exactly that to a
    data-parallel built-in plan at every ZeRO stage (its runtime wraps them all in FSDP2): the
    blocks, the embedding, the final norm with the head, and the model itself, every micro-batch;
    the parameters of the blocks (9 each in a llama block: two norms, q, k, v, o, three MLP
    matrices), the embedding, the final norm and the head once. Nothing for one rank (nothing
    wrapped), nor for Megatron."""
    from costmodel.stage_terms import layer_param_tensors
    model = get_model("tiny-llama")
    base = load_cluster("cpu").with_gpus(2)
    blk, prm = 2e-3, 3e-4
    slow = dataclasses.replace(base, groups=tuple(dataclasses.replace(g, gpu=dataclasses.replace(
        g.gpu, fsdp2_block_s=blk, dtensor_param_step_s=prm)) for g in base.groups))
    wl = Workload(global_batch=8, seq_len=128, dtype="fp32")
    par = ParallelConfig(dp=2, dp_shard=2, zero=zero, micro_batch=2, grad_accum=2)
    a, b = estimate(model, base, wl, par, framework="builtin"), estimate(model, slow, wl, par, framework="builtin")
    assert layer_param_tensors(model, False) == 9
    assert not model.tied_embeddings and model.positions == "rotary" and model.norm == "rmsnorm"
    tensors = model.layers * 9 + 1 + 2
    want = par.grad_accum * (model.layers + 3) * blk + tensors * prm
    assert b.step_time_s - a.step_time_s == pytest.approx(want, rel=1e-9)
    assert a.peak_bytes == b.peak_bytes
    one = ParallelConfig(micro_batch=2, grad_accum=4)
    one_base, one_slow = base.with_gpus(1), slow.with_gpus(1)
    assert (estimate(model, one_slow, wl, one, framework="builtin").step_time_s
            == estimate(model, one_base, wl, one, framework="builtin").step_time_s)
    assert (estimate(model, slow, wl, par, framework="megatron").step_time_s
            == estimate(model, base, wl, par, framework="megatron").step_time_s)


def test_dtensor_tp_host_time_adds_per_layer_and_micro_batch():
    """A host-bound device's DTensor TP time (``GpuSpec.dtensor_tp_layer_s``) adds exactly that per
    layer per micro-batch to a built-in plan with tp > 1 (its runtime's TP is DTensor); nothing at
    tp 1, nothing for Megatron (its TP is its own modules)."""
    model = get_model("tiny-llama")
    base = load_cluster("cpu").with_gpus(2)
    tp_s = 3e-3
    slow = dataclasses.replace(base, groups=tuple(dataclasses.replace(g, gpu=dataclasses.replace(
        g.gpu, dtensor_tp_layer_s=tp_s)) for g in base.groups))
    wl = Workload(global_batch=8, seq_len=128, dtype="fp32")
    par = ParallelConfig(tp=2, micro_batch=2, grad_accum=4)
    a, b = estimate(model, base, wl, par, framework="builtin"), estimate(model, slow, wl, par, framework="builtin")
    assert b.step_time_s - a.step_time_s == pytest.approx(par.grad_accum * model.layers * tp_s, rel=1e-9)
    dp = ParallelConfig(dp=2, micro_batch=2, grad_accum=2)
    assert (estimate(model, slow, wl, dp, framework="builtin").step_time_s
            == estimate(model, base, wl, dp, framework="builtin").step_time_s)
    assert (estimate(model, slow, wl, par, framework="megatron").step_time_s
            == estimate(model, base, wl, par, framework="megatron").step_time_s)


@pytest.mark.parametrize("name, tied, pp, ep", [("tiny-llama", False, 1, 1), ("tiny-llama", False, 2, 1),
                                                 ("tiny-llama", True, 1, 1), ("tiny-llama", True, 2, 1),
                                                 ("tiny-gpt", True, 1, 1), ("tiny-gpt", True, 3, 1),
                                                 ("tiny-moe", False, 2, 2), ("tiny-moe", False, 1, 1)])
def test_fsdp2_wrap_counts_are_the_runtimes_modules(name, tied, pp, ep):
    """What the cost model counts for FSDP2's host time on each pipeline stage (modules wrapped,
    parameter tensors the optimizer steps) is what the built-in runtime builds and wraps: its own
    parts (``runtime.model.build_model``), its own list of what it wraps
    (``runtime.parallel.dp_wrapped_modules``), its parameters as the optimizer gets them."""
    from costmodel.stage_terms import fsdp2_wrap_counts
    from runtime.model import build_model
    from runtime.parallel import dp_wrapped_modules
    model = dataclasses.replace(get_model(name), tied_embeddings=tied)
    bounds = [round(i * model.layers / pp) for i in range(pp + 1)]
    for s in range(pp):
        layers = range(bounds[s], bounds[s + 1])
        part = build_model(model, layers=layers, embed=s == 0, head=s == pp - 1)
        n_moe = sum(1 for i in layers if model.is_moe_layer(i))
        wraps, tensors = fsdp2_wrap_counts(model, len(layers), n_moe, s == 0, s == pp - 1, ep)
        assert (wraps, tensors) == (len(dp_wrapped_modules(part, ep)), len(list(part.parameters()))), (name, s)


def test_overlap_slowdown_of_one_is_no_overlap():
    """``compute_comm_slowdown`` s charges ``max(C, T) + s*min(C, T)`` for communication C beside
    compute T: at s = 1 a data-parallel step costs what it costs with overlap turned off; at s = 0
    (every catalog cluster) nothing changes; in between it lies between."""
    model = get_model("llama-3-8b")
    base = load_cluster("dgx-a100-80gb").with_gpus(16)
    wl = Workload(global_batch=64, seq_len=2048)
    # torch's buckets, the same with and without overlap (Megatron's become one bucket without
    # overlapped reduction, bucket4: stage_terms.megatron_stage_buckets, so its "off" also saves latency)
    from costmodel.frameworks import FRAMEWORKS
    fw = dataclasses.replace(FRAMEWORKS["generic"], dp_bucket="torch")
    for par in (ParallelConfig(tp=2, dp=8, zero=1, micro_batch=2, grad_accum=4),
                ParallelConfig(tp=2, dp=8, zero=0, micro_batch=4, grad_accum=2)):
        on = estimate(model, base, wl, par, framework=fw)
        off = estimate(model, base, wl, dataclasses.replace(par, overlap_dp_comm=False), framework=fw)
        assert off.step_time_s > on.step_time_s             # there is overlap to lose
        one = estimate(model, dataclasses.replace(base, compute_comm_slowdown=1.0), wl, par, framework=fw)
        half = estimate(model, dataclasses.replace(base, compute_comm_slowdown=0.5), wl, par, framework=fw)
        assert one.step_time_s == pytest.approx(off.step_time_s, rel=1e-12)
        assert on.step_time_s < half.step_time_s < off.step_time_s
    z3 = ParallelConfig(dp=16, zero=3, micro_batch=1, grad_accum=4)
    a = estimate(model, base, wl, z3)
    b = estimate(model, dataclasses.replace(base, compute_comm_slowdown=1.0), wl, z3)
    assert b.time["dp_comm_s"] > a.time["dp_comm_s"]      # ZeRO-3's per-micro-batch gathers too
    with pytest.raises(SpecError, match=r"compute_comm_slowdown must be in \[0, 1\]"):
        dataclasses.replace(base, compute_comm_slowdown=3.0)
