"""What ``planner launch`` prints: the measured run beside the plan's prediction (also the demo's
last table)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any
from costmodel.units import GIB, MIB


def predicted_figures(estimate: dict) -> dict[str, Any]:
    """The estimate's figures this command compares (None where the plan has none)."""
    est = dict(estimate or {})
    mem = est.get("memory") or {}
    return {"step_time_s": est.get("step_time_s"), "tokens_per_s": est.get("tokens_per_s"),
            "peak_memory_bytes": mem.get("peak_bytes", est.get("peak_memory_bytes")), "mfu": est.get("mfu")}


def launch_json(summary: dict[str, Any], plan, metrics: str) -> dict[str, Any]:
    if plan.mode == "infer":
        out = {k: v for k, v in summary.items() if k != "predicted"}
        out["predicted"] = dict(plan.estimate or {})
        out["predicted_run"] = summary.get("predicted")
        return out
    out = {k: summary.get(k) for k in ("losses", "steps", "step_time_s", "tokens_per_s", "peak_memory_bytes",
                                       "peak_memory_bytes_per_rank", "mfu", "world_size", "device", "dtype",
                                       "resumed_from_step", "last_checkpoint_step", "restart_count",
                                       "hosts", "stragglers", "checkpoints")}
    for k in ("rounds", "round_log", "stragglers_excluded"):          # a multi-node elastic job (planner.cli.elastic)
        if k in summary:
            out[k] = summary[k]
    out["predicted"] = dict(plan.estimate or {})
    ran = summary.get("dtype") or plan.workload.dtype
    target = plan.target or "generic"
    if out["predicted"] and (target != RUNTIME_TARGET or ran != plan.workload.dtype):
        again = estimate_as_run(plan, ran)
        if again is not None:
            if target != RUNTIME_TARGET:
                # what the plan's own framework would take: the plan's figure, kept beside the runtime's
                out["predicted_plan_target"] = {"target": target, **predicted_figures(out["predicted"])}
            out["predicted"] = again
            if ran != plan.workload.dtype:
                out["predicted_for_dtype"] = ran
    out["metrics_file"] = metrics
    return out


# the framework `planner launch` runs every plan with: this project's runtime (costmodel.frameworks)
RUNTIME_TARGET = "builtin"


def estimate_as_run(plan, dtype: str) -> dict[str, Any] | None:
    """The plan's estimate as ``planner launch`` runs it: by this project's runtime (the target
    "builtin": its kernels, its unpadded head, its autocast casts), whatever framework the plan was
    made for, and in the precision the runtime actually used (the CPU runtime trains in fp32 whatever
    the plan says). Comparing the run with another framework's price would charge that framework's
    kernels to the cost model: a Megatron price held against this runtime on an H200 was 2.04x
    optimistic (bench/results/device-h200/launch-before.txt). None when the cluster has no peak for
    that precision."""
    from costmodel.specs import SpecError
    from planner.cli.explain import plan_estimate
    # another framework's switches (compile, async TP, ...) are not the runtime's: its defaults then
    own = plan.target == RUNTIME_TARGET
    runs = dataclasses.replace(plan, target=RUNTIME_TARGET, framework=plan.framework if own else {},
                               workload=dataclasses.replace(plan.workload, dtype=dtype))
    try:
        return plan_estimate(runs).to_dict()
    except (SpecError, ValueError):
        return None


def _fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "s":
        return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"
    if kind == "bytes":
        return f"{v / GIB:.2f} GiB" if v >= GIB else f"{v / MIB:.1f} MiB"
    if kind == "pct":
        return f"{v * 100:.1f}%"
    return f"{v:,.0f}"


def print_table(out: dict[str, Any], plan) -> None:
    from rich.table import Table

    from planner.cli.console import make_console
    if plan.mode == "infer":
        from runtime.serve import compare_rows
        t = Table(title=f"{plan.model.name} serving: predicted vs measured ({out['world_size']} {out['device']} "
                        f"processes, {out['dtype']}, batch {out['batch']} x {out['replicas']} replicas, "
                        f"prompt {out['prompt_len']} + output {out['output_len']})", header_style="bold")
        for col in ("", "predicted", "measured", "measured / predicted"):
            t.add_column(col, justify="right" if col else "left")
        for label, p, m, kind in compare_rows({**out, "predicted": out.get("predicted_run")}):
            t.add_row(label, _fmt(p, kind), _fmt(m, kind), f"{m / p:.2f}" if (p and m is not None) else "-")
        c = make_console()
        c.print(t)
        if out["device"] == "cpu":
            c.print("[dim]CPU processes over gloo; predictions are for the plan's GPUs[/dim]")
        return
    pred = predicted_figures(out["predicted"])
    again = (f"; predicted for {out['predicted_for_dtype']}, the plan says {plan.workload.dtype}"
             if out.get("predicted_for_dtype") else "")
    other = out.get("predicted_plan_target") or {}
    if other:
        again += "; predicted as this project's runtime runs it"
    t = Table(title=f"{plan.model.name}: predicted vs measured ({out['world_size']} {out['device']} processes, "
                    f"{out['dtype']}{again})", header_style="bold")
    for col in ("", "predicted", "measured", "measured / predicted"):
        t.add_column(col, justify="right" if col else "left")
    rows = [("step time", "step_time_s", "s"), ("tokens/s", "tokens_per_s", "n"),
            ("peak memory per rank (max)", "peak_memory_bytes", "bytes"), ("MFU", "mfu", "pct")]
    for label, key, kind in rows:
        p, m = pred.get(key), out.get(key)
        ratio = f"{m / p:.2f}" if (p and m is not None) else "-"
        t.add_row(label, _fmt(p, kind), _fmt(m, kind), ratio)
    c = make_console()
    c.print(t)
    if other and other.get("step_time_s"):
        c.print(f"the plan's own target, {other['target']}, is predicted at {_fmt(other['step_time_s'], 's')} per step "
                f"(MFU {_fmt(other.get('mfu'), 'pct')}, {plan.workload.dtype}): its launch files run that framework; "
                "`planner launch` runs this project's runtime, priced above")
    per = out.get("peak_memory_bytes_per_rank") or []
    if per:
        c.print("peak memory by rank: " + ", ".join(f"{i}: {_fmt(b, 'bytes')}" for i, b in enumerate(per)))
    if out["device"] == "cpu":
        c.print("[dim]CPU processes: peak memory is each process's resident set (torch included); "
                "predictions are for the plan's GPUs[/dim]")
        c.print("[dim]On CPU stand-ins the prediction adds the host time the profile measured (a plain layer's, "
                "FSDP2's wrappers', DTensor tensor parallelism's); it leaves out that gloo's collectives "
                "block the host, and other jobs on these cores. On GPUs that host time hides behind the "
                "kernels (docs/failures.md: Running a plan)[/dim]")
        cores = os.cpu_count() or 1
        if out["world_size"] > cores:
            c.print(f"[yellow]{out['world_size']} processes share {cores} CPU cores: measured step times include "
                    f"about {out['world_size'] / cores:.1f}x of time-sharing the prediction does not have[/yellow]")
    losses = out.get("losses") or []
    if losses:
        c.print(f"loss: step {out['steps'][0]} {losses[0]:.4f} -> step {out['steps'][-1]} {losses[-1]:.4f}"
                + (f" (resumed from step {out['resumed_from_step']})" if out.get("resumed_from_step") else ""))
    for r in out.get("replans") or []:
        c.print(f"replanned after rank {r['failed_rank']} failed (devices excluded: {', '.join(r['excluded_devices'])}): "
                f"{'; '.join(r['changes'])}; plan {r['plan']}")
    c.print(f"metrics: {out['metrics_file']}")
    if out.get("worker_log"):
        c.print(f"worker output: {out['worker_log']}")


