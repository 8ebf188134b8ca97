"""The best model-FLOP utilization ever published per GPU architecture and precision: a predicted
MFU above it is more likely the cost model's optimism than a discovery, and is flagged unless a
measured profile of the user's hardware backs the prediction (issue 23).

One count for both sides (``causal_mfu``). A published run's throughput (tokens/s per GPU: printed,
or from its step time, or its TFLOP/s or MFU converted with that source's own FLOP formula,
``planner.cli.validation_cross.published_tokens_per_s``) times this model's FLOPs per token with
the causal mask's skipped half of attention taken out (``layers.causal_attention_flops_per_token``),
over the dense peak of the precision it ran (FP8 runs on the FP8 peak, as the cost model's MFU of
an FP8 plan is). A prediction is compared by the same count. The papers' full count (PaLM, SC'21,
torchtitan: ``layers.model_flops_per_token``, the MFU the planner prints) credits a run with the
masked half of its score matrix: 1-7% more work at 2-4k tokens (GPT-3 175B at 2k, Llama 2 7B at 4k)
but 68% more for Llama 3.1 8B at 131k, where by the full count any long-context plan would read as a
record (the ceilings' runs are all at 2-8k). Each ceiling is the highest such figure among the dense
runs in ``calibration/``, every source and every way of publishing (``tests/test_validation_ceilings.py``
recomputes them from the files, so a new record there must be copied here). Architectures without a
published run here (AMD, L40S) have no ceiling: nothing is flagged there, and
the output says there is nothing to compare with.

Thin steps (``ideal_step_s``, ``THIN_STEP_S``). A problem that gives each GPU only a few
milliseconds of work per step at peak (model FLOPs per GPU per step / the peak of the precision:
the step time at 100% MFU, ``mfu * step_time``; it depends on the problem, model, batch, sequence,
GPU count and GPU, not on the layout) is where fixed costs the model prices only in part (per-kernel
time on the GPU, collectives' latency at small messages, the NVLink domain boundary) are most of the
step. The published runs here with an ideal step under ``THIN_STEP_S`` (MLPerf Llama 3.1 8B on 512
and 1,024 GB200/GB300 at 512-1,024 tokens per GPU per step, 6-12 ms) all ran slower than predicted
(by 8-44% since the cross-rack collectives drive one NIC per channel, ``costmodel.comm.RING_NICS``;
26-67% before; the signed range is in ``costmodel/uncertainty_bands.yaml``), those above it (47 ms
and more) within the usual band (``planner validate --cross``,
table "By ideal step per GPU"). Such a prediction takes the ``train-thin`` band (its own
out-of-source residuals, ``costmodel.uncertainty``) and a warning. ``THIN_STEP_S`` was set after
seeing those rows: 25 ms, between the largest thin run (11.9 ms) and the smallest run predicted
within the usual band (47 ms); it decides which band a prediction is shown with, not any
prediction.

PyTorch's ring attention (``torch_cp_flag``). Dense runs whose context parallelism is PyTorch's
(``costmodel.attention.torch_ring``: torchtitan's published long-context runs, Llama 3's 131k-token
run priced the same way) ran slower than predicted, within each torchtitan series by more as the ring
grows, while Transformer Engine's ring (Megatron, NeMo, MLPerf) is predicted about as well as the rest
(``planner validate --cross``, table "By context parallelism": 2% median, 12% largest over its 26
runs that are not thin steps, at stop 29; at stop 42, with Fujii's A100 sweep, 5.6% median over 77 runs, most of
them too fast, so it has a band of its own, ``train-cp``). The model prices the ring's exchanges, merges and
per-step blocks (``costmodel.attention``), and what it still misses was not measured here. Such a
prediction takes the ``train-torch-cp`` band (its runs' own out-of-source residuals, on whatever
hardware they ran) and a warning; it changes no prediction.
"""
from __future__ import annotations

from .specs import low_precision
from .units import fmt_seconds

# (architecture, precision class) -> (MFU by the causal count, "record name: the run that reached it"); module docstring
BEST_MEASURED_MFU: dict[tuple[str, str], tuple[float, str]] = {
    ("A100", "16-bit"): (0.6536, "aa-llama13b-a100-64gpu-tp1-pp1-mb1: a LLaMA-shaped 13B at 2k tokens on 64 A100, "
                                 "tensor and pipeline parallel 1, one sequence per micro-batch, no recomputation "
                                 "(Hagemann et al., Aleph Alpha, arXiv 2311.05610, 2023), 2,469 tokens/s per GPU; "
                                 "67.3% by the full count, 70.5% by the paper's own (both 128k embedding matrices "
                                 "counted)"),
    # since stop 42 (Lightning-Thunder's rows recorded); stop 41: JAX-Toolbox's MaxText Llama-2-7B on one DGX H100
    # at 49.2%; before it, Megatron-LM README's GPT 16B on 192 H100 at 47.1%
    ("Hopper", "16-bit"): (0.5138, "thunder-llama2-7b-h100-8gpu-fsdp2-zero2-compile-bf16: Llama-2-7B at 4k tokens on 8 "
                                   "H100, PyTorch FSDP2 (no resharding after forward) with torch.compile, one sequence "
                                   "per GPU, random tokens (Lightning-Thunder's litgpt benchmark, pull request #940, "
                                   "2024-08), 11,856 tokens/s per GPU; 55.2% by the full count"),
    ("Hopper", "fp8"): (0.4785, "mlperf41-gpt3-175b-h100-256gpu-fp8: GPT-3 175B at 2k tokens on 256 H100 (MLPerf "
                                "Training v4.1, NVIDIA), its logged step time; 48.5% of the FP8 peak by the full count"),
    ("Blackwell", "16-bit"): (0.4786, "gpurec-a4-qwen2.5-32b-b200-16gpu-bf16: a Qwen2.5-shaped 32B at 4k tokens on 16 B200 "
                                      "(Google Cloud A4), NeMo 1.0 / Megatron-core, pipeline 2 with 32 virtual stages, no "
                                      "recomputation (AI-Hypercomputer/gpu-recipes' own log, 2025), 5,385 tokens/s per GPU; "
                                      "49.8% by the full count"),
    ("Blackwell", "fp8"): (0.4268, "mlperf41-gpt3-175b-b200-64gpu-fp8: GPT-3 175B at 2k tokens on 64 B200 (MLPerf "
                                   "Training v4.1, NVIDIA), its logged step time; 43.3% of the FP8 peak by the full "
                                   "count"),
    # since stop 51 (NVFP4 priced and its MLPerf runs recorded): MFU on the FP4 peak
    ("Blackwell", "nvfp4"): (0.2685, "mlperf51-llama3.1-405b-gb200-512gpu-nvfp4: Llama 3.1 405B at 8k tokens on 512 "
                                     "GB200 in NVFP4 (MLPerf Training v5.1, NVIDIA), its logged step time, 1,068 "
                                     "tokens/s per GPU; 27.9% of the FP4 peak by the full count"),
}


THIN_STEP_S = 0.025


def ideal_step_s(mfu: float, step_time_s: float) -> float:
    """The step time at 100% MFU (model FLOPs per GPU per step / peak): ``mfu * step_time_s`` (the
    estimate's MFU is model FLOPs over step time and peak, so the prediction cancels out)."""
    return mfu * step_time_s


def problem_ideal_step_s(model, workload, gpus: int, gpu) -> float:
    """``ideal_step_s`` from the problem alone: model FLOPs per token (``layers.model_flops_per_token``,
    the estimate's definition) times the tokens a GPU handles per step, over the GPU's peak in the
    workload's precision (the estimate's MFU basis)."""
    from .layers import model_flops_per_token
    tokens = workload.global_batch * workload.seq_len / gpus
    return tokens * model_flops_per_token(model, workload.seq_len) / gpu.peak(workload.dtype)


def is_thin(ideal_s: float) -> bool:
    """Whether a step of ``ideal_s`` at peak (``ideal_step_s`` or ``problem_ideal_step_s``) is
    thin: under ``THIN_STEP_S``. The one rule for the reports and the validation's split."""
    return ideal_s < THIN_STEP_S


def published_range(n: int, seen: tuple[float, float] | None, which: str, none: str) -> str:
    """The flags' clause on the ``n`` published runs ``which`` (a phrase: "like it") and the signed out-of-source
    errors ``seen`` (lowest, highest: predicted / published - 1) the cost model had on them; ``none`` where
    nothing was seen."""
    if not seen:
        return none
    return (f"on the {n} published run{'s' if n != 1 else ''} {which} the cost model was off by "
            f"{seen[0] * 100:+.0f}% .. {seen[1] * 100:+.0f}% (predicted / published speed - 1)")


def thin_flag(ideal_s: float, seen: tuple[float, float] | None, n: int) -> str | None:
    """A one-line warning for a thin step (``is_thin``), with the signed out-of-source errors
    ``seen`` (lowest, highest: predicted / published - 1) of the ``n`` published runs like it; else None."""
    if not is_thin(ideal_s):
        return None
    said = published_range(n, seen, f"with under {THIN_STEP_S * 1e3:.0f} ms", "no published run this thin is on file")
    return (f"thin step: each GPU has {ideal_s * 1e3:.1f} ms of work per step at peak; "
            f"{said}; expect a slower step than predicted (per-kernel and per-collective fixed costs dominate). "
            "More tokens per GPU per step (a larger global batch, or fewer GPUs) puts the plan where the model "
            "was validated")


def torch_cp_flag(cp: int, seen: tuple[float, float] | None, n: int) -> str:
    """A one-line warning for a prediction on PyTorch's ring attention (``costmodel.attention.torch_ring``)
    at context parallelism ``cp``, with the signed out-of-source errors ``seen`` (lowest, highest:
    predicted / published - 1) of the ``n`` published runs like it."""
    said = published_range(n, seen, "with it", "no published run with it is on file")
    return (f"context parallel {cp} runs PyTorch's ring attention: {said}; expect a slower step than predicted. "
            "Transformer Engine's ring (--target megatron) was predicted closer on its published runs, with a band "
            "of its own, train-cp (docs/validation.md, table 'By context parallelism')")


# Host-paced MoE layers (``host_paced_share``). A dropless MoE layer run eagerly by Megatron-Core takes at least
# its host's time to issue (``costmodel.moe.layer_host_s``, ``MEGATRON_LAYER_HOST_S``: a constant fitted on three
# runs, 8.6-15.0 ms a layer). Where that time sets the pace, the prediction rests on the constant more than on any
# GPU term, and out of source it was too slow on every such run on file (the ``train-moe-host`` band's signed range
# in costmodel/uncertainty_bands.yaml: among them NVIDIA's own recipes on H100 and GB200, which the constant's three
# runs predate). ``HOST_PACED_SHARE``: the share of the
# predicted step the host's pacing adds above which a prediction takes that band; 0.10, a choice (the MoE runs on
# file are either under 5% or over 35%, so any value between splits them the same).
HOST_PACED_SHARE = 0.10


def host_paced_share(model, cluster, workload, par, framework, stages=None, order=None) -> float:
    """The share of a training step's predicted time that the host's pacing of its MoE layers adds: 1 - the
    step priced with no host time per MoE layer (``MoeExecution.layer_host_s`` 0) over the step as priced.
    0 for a dense model or a framework that prices no host pacing (torchtitan, CUDA-graphed layers).
    ``framework``: a ``FrameworkProfile`` or its name; ``stages`` and ``order``: the pipeline split and the mesh
    order, as ``estimate`` takes them."""
    import dataclasses

    from .frameworks import framework_profile
    from .training import estimate
    prof = framework_profile(framework)
    if not model.is_moe or prof.moe.layer_host_s <= 0:
        return 0.0
    free = dataclasses.replace(prof, moe=dataclasses.replace(prof.moe, layer_host_s=0.0))
    paced = estimate(model, cluster, workload, par, stages=stages, order=order, framework=prof).step_time_s
    free_s = estimate(model, cluster, workload, par, stages=stages, order=order, framework=free).step_time_s
    return max(0.0, 1.0 - free_s / paced)


def is_host_paced(share: float) -> bool:
    """Whether a prediction's MoE layers are host-paced (``host_paced_share`` above ``HOST_PACED_SHARE``)."""
    return share > HOST_PACED_SHARE


def host_paced_flag(share: float, seen: tuple[float, float] | None, n: int) -> str | None:
    """A one-line warning for a prediction whose MoE layers are host-paced (``is_host_paced``), with the
    signed out-of-source errors ``seen`` (lowest, highest: predicted / published - 1) of the ``n`` published
    runs like it; else None."""
    if not is_host_paced(share):
        return None
    said = published_range(n, seen, "like it", "no published run like it is on file")
    return (f"host-paced MoE layers: the host's time to issue each eager MoE layer adds {share * 100:.0f}% to the "
            f"predicted step (costmodel.moe.MEGATRON_LAYER_HOST_S, a constant fitted on three runs); {said}. "
            "A larger micro-batch takes the host off the critical path (so does capturing whole MoE layers in CUDA "
            "graphs, which needs fixed shapes: a capacity factor, or Megatron's paged stash)")


def power_flag(gpus, measured: bool, expect: str = "a slower step") -> str | None:
    """A one-line warning when GPUs of the cluster (``gpus``: each node group's ``GpuSpec``) run at a
    power limit below the board power their part is rated at (``GpuSpec.power_limit_w`` <
    ``GpuSpec.tdp_w``) and no measured profile backs the prediction; else None. A capped GPU sustains
    lower clocks in dense math: where a measured curve is on file for the part (``costmodel.power``, the
    H100 SXM5's) the prediction is priced on it and the warning says so (the curve is another workload's);
    elsewhere the prediction assumes the rated part's clocks and is only flagged. A
    measured profile (``planner profile`` on the capped GPUs) measures its GEMMs at the limit they run
    at, so it is not flagged. ``expect``: what to expect instead, in the caller's terms (serving: lower
    throughput and longer latencies)."""
    from .power import CURVE_SOURCE, power_curve, power_rate_factor
    gpu = next((g for g in gpus if 0 < g.power_limit_w < g.tdp_w), None)
    if measured or gpu is None:
        return None
    head = f"the {gpu.name} GPUs run at a {gpu.power_limit_w:g} W power limit, below the {gpu.tdp_w:g} W their part is rated at"
    if power_curve(gpu.name) is not None:
        f = power_rate_factor(gpu.name, gpu.tdp_w, gpu.power_limit_w)
        return (f"{head}: priced at {f:.3f} of the rated part's compute rate, read off a measured curve of another "
                f"workload ({CURVE_SOURCE}; costmodel.power), so expect {expect} than predicted if this run draws "
                "more power than that one; measure the GPUs at their limit with `planner profile` to price them")
    return (f"{head}: the prediction assumes the rated part's clocks (the power limit is not priced: no measured curve of "
            f"throughput against it is on file for this part), so expect {expect} than predicted; measure the GPUs at "
            "their limit with `planner profile` to price them")


def architecture(gpu_name: str) -> str | None:
    """The architecture a catalog GPU name belongs to, for the ceilings (None: none known)."""
    n = gpu_name.upper()
    if n.startswith(("A100", "A800")):        # the A800: the A100 die, NVLink cut to 400 GB/s
        return "A100"
    if n.startswith(("H100", "H200", "H800", "GH200")):
        return "Hopper"
    if n.startswith(("B200", "B300", "GB200", "GB300")):
        return "Blackwell"
    return None


def causal_mfu(mfu: float, model, seq_len: int) -> float:
    """``mfu`` (the papers' full count, ``layers.model_flops_per_token``) by the causal count the
    ceilings use (module docstring): the same throughput over the work a causal mask leaves."""
    from .layers import causal_attention_flops_per_token, model_flops_per_token
    full = model_flops_per_token(model, seq_len)
    return mfu * (full - causal_attention_flops_per_token(model, seq_len)) / full


def mfu_ceiling(gpu_name: str, dtype: str) -> tuple[float, str] | None:
    """(best published MFU, its run) for this GPU and precision, or None when none is on file."""
    arch = architecture(gpu_name)
    if arch is None:
        return None
    # NVFP4's MFU is counted on the FP4 peak, and so is its ceiling
    return BEST_MEASURED_MFU.get((arch, dtype if low_precision(dtype) else "16-bit"))


def mfu_flag(mfu: float, causal: float, gpu_name: str, dtype: str, measured: bool,
             step_time_s: float | None = None) -> str | None:
    """A one-line warning when the predicted MFU ``mfu`` (``causal`` by the ceilings' count,
    ``causal_mfu``) is above the best published for this GPU and precision and no measured profile
    (``measured``) backs the cost model there; else None. With the predicted ``step_time_s`` it also
    says how long the step takes at the ceiling (``ceiling_step_s``): what the best run ever
    published on that GPU would make of the same work."""
    ceil = mfu_ceiling(gpu_name, dtype)
    if ceil is None or causal <= ceil[0] or measured:
        return None
    at = (f"; at that MFU the step would take {fmt_seconds(ceiling_step_s(step_time_s, causal, ceil[0]))}"
          if step_time_s else "")
    return (f"predicted MFU {mfu * 100:.1f}% ({causal * 100:.1f}% with attention counted causal) is above the best "
            f"published on {architecture(gpu_name)} "
            f"{ {'fp8': 'FP8', 'nvfp4': 'NVFP4'}.get(dtype, 'BF16/FP16')} by that count "
            f"({ceil[0] * 100:.1f}%: {ceil[1].split(': ', 1)[1]}){at}; no measured profile backs it: likely "
            "optimistic (measure with `planner profile`, then `planner calibrate`)")


def ceiling_step_s(step_time_s: float, causal: float, ceiling: float) -> float:
    """The step time of the same work at the ceiling's MFU: ``step_time_s`` scaled by the predicted
    causal MFU over the ceiling (both by one count, so the scale is the ratio of the two)."""
    return step_time_s * causal / ceiling
