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
