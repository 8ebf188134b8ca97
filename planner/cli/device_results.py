"""The H200 measurements (bench/results/device-h200: written by bench/device_check.sh,
bench/device_step.py and `planner launch` on a lent H200 in session 31) beside what the cost model
prices for them now: the README's "Measured on a GPU" block (``planner.cli.docs_pages``) and the tests
that hold the model to them (tests/test_device_measurements.py) read them through here."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bench" / "results" / "device-h200"

# (launch table, model (catalog name or a model file beside it), global batch, micro-batch): each run
# `planner launch` of a plan for this profile, 2,048 tokens per sequence, one GPU, bf16
LAUNCHES = (("launch-builtin-mb1.txt", "gpt3-1.3b", 8, 1), ("launch-builtin-planned.txt", "gpt3-1.3b", 8, 8),
            ("launch-gpt3-1.3b-b32.txt", "gpt3-1.3b", 32, 8), ("launch-llama-3.2-1b.txt", "llama-3.2-1b.yaml", 16, 8))
# the first launch, before session 31's changes: the plan `planner plan` chose priced as Megatron
# (micro-batch 1), run by the runtime with its foreach AdamW
BEFORE = ("launch-before.txt", "gpt3-1.3b", 8, 1)


@dataclass(frozen=True)
class Launch:
    file: str
    model: str
    batch: int
    micro_batch: int
    step_s: float            # measured, mean over the run's steps
    peak_gib: float          # measured, the rank's peak
    predicted_step_s: float  # the table's own prediction when it ran
    priced_step_s: float     # the builtin target's price now, on the profiled cluster
    priced_peak_gib: float


def step_profile(name: str) -> dict:
    """bench/device_step.py's measurement of one model (``step-NAME.json``)."""
    return json.loads((H200 / f"step-{name}.json").read_text())


def _table_value(text: str, row: str, column: int) -> float:
    """A figure of a launch table's row (0: predicted, 1: measured), in seconds or GiB."""
    cells = re.search(rf"{re.escape(row)} +│ +([\d.,]+) (ms|s|GiB) │ +([\d.,]+) (ms|s|GiB) │", text)
    if cells is None:
        raise ValueError(f"no {row!r} row in the launch table")
    value, unit = float(cells.group(1 + 2 * column).replace(",", "")), cells.group(2 + 2 * column)
    return value * (1e-3 if unit == "ms" else 1.0)


def launch(file: str, model: str, batch: int, micro_batch: int) -> Launch:
    """One launch's measured figures and the builtin target's price of the same plan now."""
    from costmodel.catalog import get_model
    from costmodel.files.clusters import load_cluster
    from costmodel.specs import ParallelConfig, Workload, default_stages
    from costmodel.training import estimate
    from planner.plan.inputs import load_model
    text = (H200 / file).read_text()
    spec = load_model(str(H200 / model)) if model.endswith(".yaml") else get_model(model)
    est = estimate(spec, load_cluster(str(H200 / "cluster.yaml")), Workload(global_batch=batch, seq_len=2048, dtype="bf16"),
                   ParallelConfig(micro_batch=micro_batch, grad_accum=batch // micro_batch),
                   stages=default_stages(spec.layers, 1), framework="builtin")
    return Launch(file, spec.name, batch, micro_batch, _table_value(text, "step time", 1),
                  _table_value(text, "peak memory per rank (max)", 1), _table_value(text, "step time", 0),
                  est.step_time_s, est.peak_bytes / 2**30)


def markdown() -> str:
    """The README block: each launch measured against its price, then and now."""
    before = launch(*BEFORE)
    rows = [f"| {before.model} | {before.batch} | {before.micro_batch} | {before.step_s * 1e3:,.0f} ms | "
            f"{before.predicted_step_s * 1e3:,.0f} ms (as Megatron) | {before.step_s / before.predicted_step_s - 1:+.0%} | "
            f"{before.peak_gib:.1f} GiB | - |"]
    for spec in LAUNCHES:
        r = launch(*spec)
        rows.append(f"| {r.model} | {r.batch} | {r.micro_batch} | {r.step_s * 1e3:,.0f} ms | {r.priced_step_s * 1e3:,.0f} ms | "
                    f"{r.step_s / r.priced_step_s - 1:+.0%} | {r.peak_gib:.1f} GiB | {r.priced_peak_gib:.1f} GiB |")
    curves = json.loads((H200 / "device_curves.json").read_text())
    lf = curves["launch"]
    fp8 = curves.get("fp8") or []
    gemm = f"x{min(r['speedup_gemm'] for r in fp8):.2f}-{max(r['speedup_gemm'] for r in fp8):.2f}" if fp8 else "-"
    cast = f"x{min(r['speedup_with_casts'] for r in fp8):.2f}-{max(r['speedup_with_casts'] for r in fp8):.2f}" if fp8 else "-"
    te = curves["model"]["fp8_te_layer_gemm_speedup"]
    return (
        "`planner launch` on one H200 (a lent machine, session 31; bench/results/device-h200, "
        "[the note](docs/notes/stop-31/README.md)): each plan's measured step and peak against the price of this "
        "project's runtime (the target `builtin`) now. The first row is the plan `planner plan` chose before, "
        "priced as Megatron and run by the runtime (then with PyTorch's default foreach AdamW, now fused). "
        "Nothing of the model was fitted on the Llama 3.2 1B shape. Positive: the run was slower than priced.\n\n"
        "| model | batch | micro-batch | measured step | priced | error | measured peak | priced peak |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
        f"Measured there and used by the model: the launch floor ({lf['eager_us_per_kernel']} us per eager kernel, "
        f"{lf['graph_us_per_kernel']} us per CUDA-graph node); the runtime's own host time per op in its step "
        "(27.2 us: autograd, autocast and module calls), which sets the pace at one sequence per micro-batch (the "
        "price, a per-layer floor, is then 14% slow: host and kernels overlap across layers); a BF16 GEMM whose "
        "width is odd (0.16 of the aligned speed); the runtime's eager GEMMs at the profiled curve; its other "
        f"kernels and saved tensors counted from its code. Measured beside the model: FP8 GEMMs {gemm} over BF16 "
        f"(the model's Transformer Engine layer: x{te:.2f}), {cast} with unfused per-tensor casts.\n")


def attention_markdown() -> str:
    """The fused-attention kernels' efficiency the model prices a catalog H200 with (their published
    curves, ``costmodel.attention``) beside the H200's measured table (its profile), head dim 128."""
    from costmodel.attention import efficiency
    from costmodel.files.clusters import load_cluster
    catalog = load_cluster("dgx-h200").groups[0].gpu
    measured = load_cluster(str(H200 / "cluster.yaml")).groups[0].gpu
    seqs = (1024, 4096, 16384)
    rows = []
    for kernel in ("fa2", "cudnn"):
        for direction in ("fwd", "bwd"):
            for causal in (True, False):
                cells = [f"{efficiency(kernel, catalog, 128, s, causal, direction):.2f} / "
                         f"{efficiency(kernel, measured, 128, s, causal, direction):.2f}" for s in seqs]
                rows.append(f"| {kernel} | {direction} | {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    return ("Fused attention on an H200, head dim 128: the fraction of the BF16 peak the model prices a catalog "
            "H200 with / what `planner profile` measured there (session 31, bench/results/device-h200/cluster.yaml; "
            "a profiled cluster file prices with its own table). FlashAttention-2's Hopper curves are these "
            "measurements, fitted (`costmodel.attention`; since session 32, in place of the README plot's one "
            "figure for both directions, which made the backward 5-29% faster than measured). cuDNN keeps its "
            "published curves: the cuDNN measured here is the one this PyTorch bundles, newer than the "
            "Transformer Engine builds the published Megatron runs used, and pricing those runs with it made "
            "them 1-5 points more optimistic (`planner validate --cross`, session 32's note).\n\n"
            "| kernel | direction | mask | " + " | ".join(f"sequence {s:,}" for s in seqs) + " |\n"
            "|---|---|---|" + "---:|" * len(seqs) + "\n" + "\n".join(rows) + "\n")
