"""FP8 training (``costmodel.fp8``): a Transformer Engine recipe's bytes against a hand
derivation, the refusals, and the compute and communication rules that FP8 changes."""
from __future__ import annotations

import statistics

import pytest

from costmodel.catalog import get_model
from costmodel.comm import GroupLayout
from costmodel.fp8 import resolve
from costmodel.layers import layer_cost
from costmodel.memory import bytes_per_param, optimizer_traffic_bytes_per_param
from costmodel.specs import ParallelConfig, SpecError, Workload
from costmodel.training import estimate
from costmodel.files.clusters import load_cluster

ONE = GroupLayout(1, 1)


def _layer(model, wl, cluster, tp=1, sp=False, recipe=None):
    grp = cluster.groups[0]
    return layer_cost(model, False, wl, tp, 1, 1, sp, 1, grp.gpu, cluster, grp.intra_node,
                      GroupLayout(tp, tp) if tp > 1 else ONE, ONE, ONE, 1.0, recipe)


def test_delayed_scaling_on_hopper_matches_a_hand_derivation():
    """Llama-3-8B on 8 H100, dp 8, distributed optimizer (ZeRO-1), Megatron + TE delayed scaling.
    Per parameter: BF16 working weight 2 + FP8 copy 1 + its transpose 1 (Hopper GEMMs are TN
    only) = 4, for the transformer layers' weights; the embedding, the output layer and the final
    norm are not TE modules and stay BF16, 2 (memory.ends_weight_bytes_per_param); FP32 main
    gradient 4; FP32 master + Adam moments 12, sharded over 8. Scaling state: 4 GEMM weights per
    layer x 5 quantized tensors x (history 1 + scale + inverse) x 4 B."""
    m = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    wl = Workload(global_batch=64, seq_len=4096, dtype="fp8")
    est = estimate(m, cl, wl, ParallelConfig(dp=8, zero=1, grad_accum=8), framework="megatron")
    p = m.total_params()
    ends = 2 * m.vocab * m.hidden + m.hidden          # untied embedding and head, final RMSNorm
    scale_state = m.layers * 4 * 5 * 4 * (1 + 2)
    mem = est.stages[0].memory
    assert mem["weights_bytes"] == pytest.approx(4 * (p - ends) + 2 * ends + scale_state, rel=1e-9)
    assert mem["grads_bytes"] == pytest.approx(4 * p, rel=1e-9)
    assert mem["optimizer_bytes"] == pytest.approx(12 * p / 8, rel=1e-9)
    # not the 1 byte per parameter of "fp8 weights" (7.48 GiB), which no recipe keeps
    assert mem["weights_bytes"] / 2**30 > 27


def test_fp8_activations_save_only_the_linear_inputs_in_fp8():
    """Bytes per token one layer saves (flash attention, no dropout, tp 1), by hand:
    norm inputs 2 x h x 2 (BF16); QKV and MLP inputs 2 x h x 1 (FP8); Q, K, V 2 x (q + 2 kv)
    (BF16, attention stays BF16); output-projection input 1 x q (FP8); SwiGLU: w1 and w3 outputs
    2 x 2 x ffn (BF16), the product 1 x ffn (FP8, the w2 input); softmax statistics 4 x heads."""
    m = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    h, q, kv, f, a = m.hidden, m.q_dim, m.kv_heads * m.head_dim, m.ffn_hidden, m.heads
    fp8 = resolve("delayed", "megatron", cl.groups[0].gpu)
    lc8 = _layer(m, Workload(global_batch=8, seq_len=4096, dtype="fp8"), cl, recipe=fp8)
    lc16 = _layer(m, Workload(global_batch=8, seq_len=4096, dtype="bf16"), cl)
    hand8 = 2 * h * 2 + 2 * h * 1 + 2 * (q + 2 * kv) + 1 * q + (2 * 2 + 1) * f + 4 * a
    hand16 = 4 * h * 2 + 2 * (q + 2 * kv) + 2 * q + 3 * 2 * f + 4 * a
    assert lc8.act_bytes / 4096 == pytest.approx(hand8)
    assert lc16.act_bytes / 4096 == pytest.approx(hand16)
    # the recipe's gain: GEMMs faster, elementwise slower (the casts)
    assert lc8.gemm_fwd_s < 0.7 * lc16.gemm_fwd_s
    assert lc8.elementwise_fwd_s > lc16.elementwise_fwd_s


def test_recipes_per_generation_and_refusals():
    h100 = load_cluster("dgx-h100").groups[0].gpu
    b200 = load_cluster("dgx-b200").groups[0].gpu
    a100 = load_cluster("dgx-a100-80gb").groups[0].gpu
    assert resolve("", "megatron", h100).name == "delayed"
    assert resolve("", "megatron", b200).name == "mxfp8"
    assert resolve("", "torchtitan", h100).name == "tensorwise"
    # MXFP8: rowwise and columnwise copies, one E8M0 scale byte per 32 values, plus BF16
    assert bytes_per_param("fp8", "adamw", resolve("mxfp8", "megatron", b200))[0] == pytest.approx(2 + 2 * (1 + 1 / 32))
    # Blackwell reads FP8 columnwise natively: no transpose copy
    assert bytes_per_param("fp8", "adamw", resolve("delayed", "megatron", b200))[0] == 3
    # --fp8-param-gather: the FP8 weight (and its transpose) is the model weight
    assert bytes_per_param("fp8", "adamw", resolve("delayed", "megatron", h100, True))[0] == 2
    # torchao casts per use: the BF16 weight only
    assert bytes_per_param("fp8", "adamw", resolve("tensorwise", "torchtitan", h100))[0] == 2
    # the optimizer step writes BF16 weights and re-quantizes them: 24 + 4 + 2 + (2 + 1 + 1)
    assert optimizer_traffic_bytes_per_param("fp8", "adamw", resolve("delayed", "megatron", h100)) == 34
    with pytest.raises(SpecError, match="no FP8 tensor cores"):
        resolve("", "megatron", a100)
    with pytest.raises(SpecError, match="needs Blackwell"):
        resolve("mxfp8", "megatron", h100)
    with pytest.raises(SpecError, match="fp8 recipe is a setting of fp8 training"):
        Workload(global_batch=8, seq_len=128, dtype="bf16", fp8_recipe="delayed")
    m = get_model("llama-3-8b")
    with pytest.raises(SpecError, match="A100.*no FP8 tensor cores"):
        estimate(m, load_cluster("dgx-a100-80gb").with_gpus(8), Workload(global_batch=64, seq_len=4096, dtype="fp8"),
                 ParallelConfig(dp=8, grad_accum=8))


def test_small_gemms_gain_less_and_current_scaling_costs_more():
    m = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    gpu = cl.groups[0].gpu
    from costmodel.compute import fp8_gemm_time_s, gemm_time_s
    gain = [gemm_time_s(gpu, cl, "bf16", g, g, g) / fp8_gemm_time_s(gpu, cl, g, g, g) for g in (256, 1024, 8192)]
    assert gain[0] < gain[1] < gain[2] < 2.0
    wl = Workload(global_batch=8, seq_len=4096, dtype="fp8")
    delayed = _layer(m, wl, cl, recipe=resolve("delayed", "megatron", gpu))
    current = _layer(m, wl, cl, recipe=resolve("current", "megatron", gpu))
    assert current.elementwise_fwd_s > delayed.elementwise_fwd_s
    assert current.gemm_fwd_s == delayed.gemm_fwd_s


def test_sequence_parallel_all_gathers_move_fp8():
    m = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    gpu = cl.groups[0].gpu
    wl8 = Workload(global_batch=8, seq_len=4096, dtype="fp8")
    te = _layer(m, wl8, cl, tp=8, sp=True, recipe=resolve("delayed", "megatron", gpu))
    # torchao under torchtitan's TP: tensorwise gathers FP8 as Transformer Engine does (Float8ColwiseParallel),
    # rowwise gathers BF16 (tests/test_titan_float8.py has the collectives by hand)
    ao = _layer(m, wl8, cl, tp=8, sp=True, recipe=resolve("tensorwise", "torchtitan", gpu))
    ao_row = _layer(m, wl8, cl, tp=8, sp=True, recipe=resolve("rowwise", "torchtitan", gpu))
    bf = _layer(m, Workload(global_batch=8, seq_len=4096), cl, tp=8, sp=True)
    assert te.tp_fwd_s == pytest.approx(ao.tp_fwd_s)
    assert ao_row.tp_fwd_s == pytest.approx(bf.tp_fwd_s)
    assert ao.tp_fwd_s < ao_row.tp_fwd_s


def test_fp8_calibration_within_ten_percent():
    from planner.cli.validation import REFUSED, all_rows
    rows = [r for r in all_rows(include_holdout=False) if r.split == "fp8"]
    # a run is priced only through a target that accepts it: torchtitan's Float8 runs are refused
    # (with the reason) until the torchtitan target plans fp8, and priced again when it does
    titan_fp8 = {n for n, why in REFUSED.items() if n.startswith("tt") and "dtype fp8" in why}
    assert len(rows) >= 24 or (len(rows) >= 8 and titan_fp8)
    assert "megatron" in {r.framework for r in rows} <= {"megatron", "torchtitan"}
    assert statistics.median(abs(r.error) for r in rows) < 0.10


@pytest.mark.subprocess
def test_plans_record_the_recipe_they_were_priced_with(tmp_path):
    import subprocess
    import sys

    import yaml
    out = tmp_path / "p.yaml"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--model", "llama-3-8b", "--cluster", "dgx-h100",
                        "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--dtype", "fp8", "--tp", "1",
                        "--pp", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(out.read_text())["workload"]["fp8_recipe"] == "delayed"


def test_megatron_launch_carries_the_priced_recipe():
    from emitters import CannotExpress
    from emitters.megatron import training_args
    from planner.plan.planfile import Plan, default_stages
    m = get_model("llama-3-8b")
    cl = load_cluster("dgx-h100").with_gpus(8)
    par = ParallelConfig(dp=8, grad_accum=8)

    def args(**wl):
        plan = Plan(model=m, cluster=cl, workload=Workload(global_batch=64, seq_len=4096, dtype="fp8", **wl),
                    parallel=par, stages=default_stages(m.layers, 1))
        return [str(a) for a in training_args(plan)]

    a = args(fp8_recipe="current", fp8_param_gather=True)
    assert a[a.index("--fp8-recipe") + 1] == "tensorwise" and "--fp8-param-gather" in a
    d = args()                                   # none named: Megatron's own default (delayed)
    assert "--fp8-recipe" not in d and "--fp8-param-gather" not in d
    with pytest.raises(CannotExpress, match="rowwise"):
        args(fp8_recipe="rowwise")
