"""NVFP4 training (``--dtype nvfp4``, costmodel.fp8.nvfp4): its two constants reproduce the kernel table they were
read from, its bytes are the format's, it runs only where Transformer Engine trains NVFP4 (Blackwell, Megatron-LM),
the Megatron file writes it without the TP overlap it cannot run, and other 4-bit names get a hint."""
from __future__ import annotations

import dataclasses

import pytest

from cli_harness import run
from costmodel import fp8
from costmodel.comm import GroupLayout
from costmodel.compute import fp8_gemm_time_s
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import tp_overlap_of
from costmodel.layers import layer_cost
from costmodel.specs import SpecError, Workload
from costmodel.training import estimate
from test_emit_support import make_plan, write

B300 = load_cluster("dgx-b300").with_gpus(8)
ARGS = ["--model", "llama-3-8b", "--cluster", "dgx-b300", "--gpus", "8", "--global-batch", "16", "--seq-len", "8192"]


def _layer_gemm_ms(recipe: fp8.Fp8Recipe, pre_quantized: bool) -> float:
    """The TE benchmark's layer (``fp8.TE_LAYER_GEMMS``: QKV, projection, FC1, FC2 at M = 15,872) on a B300, its 12
    GEMMs (each shape forward, dgrad and wgrad, equal FLOPs) and, unless pre-quantized, their casts at the fused
    memory-bound rate, as ``layers.layer_cost`` prices them."""
    from costmodel.compute import memory_bound_factor, memory_time_s
    gpu = B300.gpu
    t = sum(3 * fp8_gemm_time_s(gpu, B300, m, n, k, fmt=recipe.gemm_format) for m, n, k in fp8.TE_LAYER_GEMMS)
    if not pre_quantized:
        t += memory_time_s(gpu, sum(recipe.cast_bytes(m, n, k) for m, n, k in fp8.TE_LAYER_GEMMS)) \
            * memory_bound_factor("fused")
    return t * 1e3


def test_fp4_curves_reproduce_the_kernel_tables_they_were_read_from():
    """Each Blackwell generation's FP4 constant, solved from its measurement: torchao's B200 8192^3 GEMM (NVFP4
    5.37e15 FLOP/s, BF16 1.42e15) and TE's B300 layer (BF16 13.102 ms, NVFP4 3.764 ms pre-quantized); the peak
    ratios the constants divide by are the catalog's."""
    from costmodel.compute import gemm_time_s
    b200 = load_cluster("dgx-b200")
    m = fp8.TORCHAO_B200[0]
    assert (gemm_time_s(b200.gpu, b200, "bf16", m, m, m, train=True)
            / fp8_gemm_time_s(b200.gpu, b200, m, m, m, fmt="fp4")) == pytest.approx(5.37 / 1.42, rel=1e-9)
    bf16 = sum(gemm_time_s(B300.gpu, B300, "bf16", m, n, k, train=True) for m, n, k in fp8.TE_LAYER_GEMMS)
    fp4 = sum(fp8_gemm_time_s(B300.gpu, B300, m, n, k, fmt="fp4") for m, n, k in fp8.TE_LAYER_GEMMS)
    assert bf16 / fp4 == pytest.approx(13.102 / 3.764, rel=1e-9)
    assert fp8.TORCHAO_B200[2] == b200.gpu.peak("fp4") / b200.gpu.peak("bf16")
    assert fp8.TE_B300_LAYER[1] == B300.gpu.peak("fp4") / B300.gpu.peak("bf16")
    assert fp8.TORCHAO_B200[3] == b200.gpu.matmul_half_size and fp8.TE_B300_LAYER[2] == B300.gpu.matmul_half_size
    # GB200 takes B200's constant, GB300 B300's: the same GEMM is faster on a B200 than on a B300 per FLOP of peak
    gb200, gb300 = load_cluster("gb200-nvl72").gpu, load_cluster("gb300-nvl72").gpu
    assert fp8.gemm_efficiency(gb200, 0.6, 8192, "fp4") > fp8.gemm_efficiency(gb300, 0.6, 8192, "fp4")


def test_nvfp4_quantization_costs_what_the_table_measured_over_mxfp8():
    """Autocast less pre-quantized: NVFP4's casts take 2.689 / 1.823 = 1.475x MXFP8's in the table; the model's
    casts of the same layer, at the same memory-bound rate, keep that ratio."""
    mx, nv = fp8.resolve("mxfp8", "megatron", B300.gpu), fp8.nvfp4(B300.gpu)
    cast_mx = _layer_gemm_ms(mx, False) - _layer_gemm_ms(mx, True)
    cast_nv = _layer_gemm_ms(nv, False) - _layer_gemm_ms(nv, True)
    assert cast_nv / cast_mx == pytest.approx((6.453 - 3.764) / (8.984 - 7.161), rel=1e-6)
    # and the autocast layer is faster than MXFP8's, slower than NVFP4's GEMMs alone
    assert _layer_gemm_ms(nv, True) < _layer_gemm_ms(nv, False) < _layer_gemm_ms(mx, False)


def test_nvfp4_bytes():
    nv = fp8.nvfp4(B300.gpu)
    assert nv.copy_bytes == nv.saved_input_bytes == 0.5 + 1 / 16       # E2M1 and one E4M3 scale per 16 values
    assert nv.weight_bytes_per_param() == 2.0 + 2 * (0.5 + 1 / 16)      # BF16 working weight, two cached copies
    # a layer's activations: the linears' saved inputs at 0.5625 bytes, against MXFP8's 1.03
    model = make_plan("llama-3-8b", gpus=8, gb=8, seq=4096, cluster="dgx-b300", dp=8).model
    acts = {}
    for dtype, rec in (("nvfp4", nv), ("fp8", fp8.resolve("mxfp8", "megatron", B300.gpu))):
        wl = Workload(global_batch=8, seq_len=4096, dtype=dtype, fp8_recipe="mxfp8" if dtype == "fp8" else "")
        one = GroupLayout(1, 1)
        acts[dtype] = layer_cost(model, False, wl, 1, 1, 1, False, 1, B300.gpu, B300, B300.groups[0].intra_node,
                                 one, one, one, fp8=rec).act_bytes
    assert acts["nvfp4"] < acts["fp8"]
    # 4 saved linear inputs per layer (QKV and FC1's normed input, the projection's, FC2's): their bytes differ by
    # the two formats' (1 + 1/32 - 0.5625) bytes each
    h, f, T = model.hidden, model.ffn_hidden, 4096
    saved = T * (h + model.heads * model.head_dim + h + f)
    assert acts["fp8"] - acts["nvfp4"] == pytest.approx(saved * (1 + 1 / 32 - 0.5625), rel=0.02)


def test_nvfp4_step_is_faster_than_fp8_and_counts_mfu_on_the_fp4_peak():
    plan = make_plan("llama-3-8b", gpus=8, gb=16, seq=8192, cluster="dgx-b300", dp=8, micro_batch=2, zero=1)
    est = {d: estimate(plan.model, plan.cluster, dataclasses.replace(plan.workload, dtype=d,
                                                                       fp8_recipe="mxfp8" if d == "fp8" else ""),
                       plan.parallel, framework="megatron") for d in ("bf16", "fp8", "nvfp4")}
    assert est["nvfp4"].step_time_s < est["fp8"].step_time_s < est["bf16"].step_time_s
    # the same tokens, the same model FLOPs: MFU on the FP4 peak (3x FP8's on B300) is under FP8's on its own
    assert est["nvfp4"].model_tflops_per_gpu > est["fp8"].model_tflops_per_gpu
    assert est["nvfp4"].mfu == pytest.approx(est["nvfp4"].model_tflops_per_gpu * 1e12 / B300.gpu.peak("fp4"))


def test_nvfp4_needs_blackwell():
    h100 = load_cluster("dgx-h100")
    with pytest.raises(SpecError, match="Blackwell"):
        fp8.nvfp4(h100.gpu)
    r = run(["estimate", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16",
             "--seq-len", "8192", "--dtype", "nvfp4", "--tp", "1", "--micro-batch", "2"])
    assert r.code == 2, r.where()
    assert "Blackwell" in r.err and "fp8" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed", "accelerate"])
def test_nvfp4_is_megatron_only(target):
    r = run(["plan", *ARGS, "--dtype", "nvfp4", "--target", target])
    assert r.code != 0, r.where()
    assert "--target megatron" in r.out + r.err


def test_nvfp4_is_not_a_serving_dtype():
    with pytest.raises(SpecError, match="int4"):
        Workload(global_batch=1, seq_len=512, mode="infer", prompt_len=256, output_len=256, dtype="nvfp4")
    with pytest.raises(SpecError, match="fp8 recipe"):
        Workload(global_batch=1, seq_len=512, dtype="nvfp4", fp8_recipe="mxfp8")


def test_megatron_plans_and_writes_nvfp4_without_tp_overlap(tmp_path):
    r = run(["plan", "--model", "llama-3-8b", "--cluster", "gb200-nvl72", "--gpus", "8", "--global-batch", "64",
             "--seq-len", "8192", "--dtype", "nvfp4", "--target", "megatron", "--json"], timeout_s=120)
    assert r.code == 0, r.where()
    plan = make_plan("llama-3-8b", gpus=8, gb=16, seq=8192, cluster="gb200-nvl72", tp=2, dp=4, sp=True,
                     micro_batch=1, zero=1)
    plan = plan.replace(target="megatron", workload=dataclasses.replace(plan.workload, dtype="nvfp4"))
    # TE's userbuffers cannot gather NVFP4 inputs: backward-only overlap, where BF16 gets the full one
    args = (plan.parallel, plan.mesh_order, plan.cluster.nvlink_gpus, plan.cluster.gpu.name)
    assert tp_overlap_of("megatron", *args, "bf16") == "full"
    assert tp_overlap_of("megatron", *args, "nvfp4") == "backward"
    from planner.plan.planfile import read_plan, write_plan
    assert read_plan(write_plan(plan, tmp_path / "plan.yaml")).workload.dtype == "nvfp4"     # the plan file keeps it
    text = (write(plan, "megatron", tmp_path / "out") / "megatron.sh").read_text()
    flags = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "--fp4-format e2m1" in flags and "--fp4-recipe nvfp4" in flags
    assert "--fp8-format" not in flags and "--tp-comm-overlap" not in flags
    assert "userbuffers cannot gather nvfp4" in text and "NVTE_NVFP4_DISABLE_" in text


@pytest.mark.parametrize("command", ["plan", "estimate"])
@pytest.mark.parametrize("dtype", ["fp4", "NVFP4", "mxfp4"])
def test_other_4bit_names_get_the_nvfp4_hint(command, dtype):
    extra = ["--tp", "1", "--pp", "1", "--micro-batch", "2"] if command == "estimate" else []
    r = run([command, *ARGS, *extra, "--dtype", dtype])
    assert r.code == 2, r.where()
    line = r.err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "--dtype nvfp4" in line and "MXFP4 training is not priced" in line


def test_other_bad_dtypes_get_the_plain_message():
    r = run(["plan", *ARGS, "--dtype", "bf15"])
    assert r.code == 2 and "invalid choice" in r.err and "nvfp4 --target" not in r.err
