"""The best model-FLOP utilization ever published per GPU architecture and precision: a predicted
MFU above it is more likely the cost model's optimism than a discovery, and is flagged unless a
measured profile of the user's hardware backs the prediction (issue 23).

Each ceiling is the highest MFU among the published runs in ``calibration/`` (dense; the published
MFU where the source prints one, else its model TFLOP/s over the dense peak of the precision it
ran), with the run that set it; ``tests/test_validation_ceilings.py`` recomputes it from the files,
so a new record there must be copied here. Sources count FLOPs their own way (torchtitan:
6 x parameters + 12 l h s per token; Megatron: its ``num_floating_point_operations``), which can
differ from this cost model's count by a few percent. FP8 runs are on the FP8 peak, as the cost
model's MFU of an FP8 plan is. Architectures without a published run here (Blackwell, AMD, L40S)
have no ceiling: nothing is flagged there, and the output says there is nothing to compare with.

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
runs that are not thin steps, at stop 29). The model prices the ring's exchanges, merges and
per-step blocks (``costmodel.attention``), and what it still misses was not measured here. Such a
prediction takes the ``train-torch-cp`` band (its runs' own out-of-source residuals, on whatever
hardware they ran) and a warning; it changes no prediction.
"""
from __future__ import annotations

# (architecture, precision class) -> (MFU, the run that reached it)
BEST_MEASURED_MFU: dict[tuple[str, str], tuple[float, str]] = {
    ("A100", "16-bit"): (0.68, "PyTorch blog 'Maximizing Training Throughput Using PyTorch FSDP and Torch.compile' "
                               "(IBM and Meta, 2024-05-21), Table 1: Llama 2 7B, FSDP with torch.compile on 128 A100 "
                               "80GB, MFU 68%"),
    ("Hopper", "16-bit"): (0.49, "Megatron-LM README (commit f2e5db402c, 2024-07-15), weak scaling: GPT 16B on 192 "
                                 "H100, 489 model TFLOP/s, MFU 49%"),
    ("Hopper", "fp8"): (0.4255, "NeMo 24.07 performance summary: GPT-3 175B FP8 on 512 H100, 842 model TFLOP/s "
                                "of 1,979 (FP8 peak)"),
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


def thin_flag(ideal_s: float, seen: tuple[float, float] | None, n: int) -> str | None:
    """A one-line warning for a thin step (``is_thin``), with the signed out-of-source errors
    ``seen`` (lowest, highest: predicted / published - 1) of the ``n`` published runs like it; else None."""
    if not is_thin(ideal_s):
        return None
    said = (f"on the {n} published run{'s' if n != 1 else ''} with under {THIN_STEP_S * 1e3:.0f} ms the cost model "
            f"was off by {seen[0] * 100:+.0f}% .. {seen[1] * 100:+.0f}% (predicted / published speed - 1)"
            if seen else "no published run this thin is on file")
    return (f"thin step: each GPU has {ideal_s * 1e3:.1f} ms of work per step at peak; "
            f"{said}; expect a slower step than predicted (per-kernel and per-collective fixed costs dominate). "
            "More tokens per GPU per step (a larger global batch, or fewer GPUs) puts the plan where the model "
            "was validated")


def torch_cp_flag(cp: int, seen: tuple[float, float] | None, n: int) -> str:
    """A one-line warning for a prediction on PyTorch's ring attention (``costmodel.attention.torch_ring``)
    at context parallelism ``cp``, with the signed out-of-source errors ``seen`` (lowest, highest:
    predicted / published - 1) of the ``n`` published runs like it."""
    said = (f"on the {n} published run{'s' if n != 1 else ''} with it the cost model was off by "
            f"{seen[0] * 100:+.0f}% .. {seen[1] * 100:+.0f}% (predicted / published speed - 1)"
            if seen else "no published run with it is on file")
    return (f"context parallel {cp} runs PyTorch's ring attention: {said}; expect a slower step than predicted. "
            "Transformer Engine's ring (--target megatron) was predicted far closer on its published runs "
            "(docs/validation.md, table 'By context parallelism')")


def architecture(gpu_name: str) -> str | None:
    """The architecture a catalog GPU name belongs to, for the ceilings (None: none known)."""
    n = gpu_name.upper()
    if n.startswith("A100"):
        return "A100"
    if n.startswith(("H100", "H200", "H800", "GH200")):
        return "Hopper"
    return None


def mfu_ceiling(gpu_name: str, dtype: str) -> tuple[float, str] | None:
    """(best published MFU, its run) for this GPU and precision, or None when none is on file."""
    arch = architecture(gpu_name)
    if arch is None:
        return None
    return BEST_MEASURED_MFU.get((arch, "fp8" if dtype == "fp8" else "16-bit"))


def mfu_flag(mfu: float, gpu_name: str, dtype: str, measured: bool) -> str | None:
    """A one-line warning when ``mfu`` is above the best published for this GPU and precision and
    no measured profile (``measured``) backs the cost model there; else None."""
    ceil = mfu_ceiling(gpu_name, dtype)
    if ceil is None or mfu <= ceil[0] or measured:
        return None
    return (f"predicted MFU {mfu * 100:.1f}% is above the best ever published on {architecture(gpu_name)} "
            f"{'FP8' if dtype == 'fp8' else 'BF16/FP16'} ({ceil[0] * 100:.1f}%: {ceil[1]}); no measured profile "
            "backs it: likely optimistic (measure with `planner profile`, then `planner calibrate`)")
