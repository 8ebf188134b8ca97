"""What the CLI prints: the stable JSON shapes and the rich tables for a human.

``parallel_json`` and ``estimate_json`` are the contract of ``planner estimate --json`` and of
each plan in ``planner plan --json``; keep their key names.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from costmodel.specs import ParallelConfig
from costmodel.units import fmt_bytes, fmt_seconds

PARALLEL_KEYS = ("tp", "pp", "dp", "cp", "ep", "zero", "sp", "vpp", "micro_batch", "grad_accum", "recompute")


def parallel_json(par: ParallelConfig) -> dict[str, Any]:
    d = {k: getattr(par, k) for k in PARALLEL_KEYS}
    d.update(dp_shard=par.dp_shard, schedule=par.schedule, recompute_layers=par.recompute_layers)
    if par.recompute == "selective" and par.recompute_modules:
        d["recompute_modules"] = list(par.recompute_modules)      # Megatron-Core's --recompute-modules
    if par.offload_modules:
        d["offload_modules"] = list(par.offload_modules)          # Megatron-Core's --offload-modules
    return d


def estimate_json(est) -> dict[str, Any]:
    return est.to_dict()


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def console():
    """The console for human output: tables keep every cell when piped (``planner.cli.console``)."""
    from planner.cli.console import make_console
    return make_console()


def describe_parallel(par: ParallelConfig) -> str:
    parts = [f"tp={par.tp}", f"pp={par.pp}", f"dp={par.dp}"]
    if par.cp > 1:
        parts.append(f"cp={par.cp}")
    if par.ep > 1:
        parts.append(f"ep={par.ep}")
        if par.moe_dispatcher:
            parts.append(f"dispatcher={par.moe_dispatcher}")
        if par.ep_overlap:
            parts.append("ep-overlap")
    parts.append(f"zero={par.zero}" + (f" (hsdp shard {par.dp_shard})" if par.hsdp else ""))
    if par.sp:
        parts.append("sp")
    if par.vpp > 1:
        parts.append(f"vpp={par.vpp}")
    parts.append(f"mb={par.micro_batch}")
    parts.append(f"ga={par.grad_accum}")
    rc = par.recompute + (f"({par.recompute_layers}/stage)" if par.recompute == "full" and par.recompute_layers >= 0 else "")
    if par.recompute == "selective" and par.recompute_modules:
        rc += f"({','.join(par.recompute_modules)})"
    parts.append(f"recompute={rc}")
    if par.offload_modules:
        parts.append(f"offload={','.join(par.offload_modules)}")
    return " ".join(parts)


def distinct_labels(items: list[tuple[ParallelConfig, Any, Any]]) -> list[str]:
    """``describe_parallel`` of each (parallel, stages, mesh order), with what tells apart plans
    whose descriptions coincide: the mesh order, the stage split, per-stage recomputation, or any
    other field of the parallel config that differs. No two different plans get the same label."""
    import dataclasses
    base = [describe_parallel(par) for par, _, _ in items]

    def stage_split(stages) -> str:
        return "/".join(str(s.num_layers) for s in stages or [])

    def stage_rc(stages) -> str:
        return "/".join(str(s.recompute_layers) for s in stages or [])

    extra: list[list[str]] = [[] for _ in items]
    for label in set(base):
        group = [i for i, b in enumerate(base) if b == label]
        if len(group) < 2:
            continue
        keys: list[tuple[str, Any]] = [("order", lambda i: ",".join(items[i][2] or ())),
                                       ("stages", lambda i: stage_split(items[i][1])),
                                       ("recompute layers", lambda i: stage_rc(items[i][1]))]
        keys += [(f.name, (lambda name: lambda i: str(getattr(items[i][0], name)))(f.name))
                 for f in dataclasses.fields(ParallelConfig)]
        for name, get in keys:
            if len({get(i) for i in group}) > 1:
                for i in group:
                    extra[i].append(f"{name}={get(i)}")
    return [b + ("".join(" " + e for e in x)) for b, x in zip(base, extra)]


def estimate_tables(est, title: str = ""):
    """Two rich tables: time per step by term, memory per GPU by category."""
    from rich.table import Table

    t = Table(title=title or "time per step", show_header=True, header_style="bold")
    t.add_column("term")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    total = est.step_time_s
    for k, v in est.time.items():
        t.add_row(k.removesuffix("_s").replace("_", " "), fmt_seconds(v), f"{v / total * 100:5.1f}%")
    t.add_row("[bold]step[/bold]", f"[bold]{fmt_seconds(total)}[/bold]", "100.0%")

    mt = Table(title="memory per GPU (peak stage)", show_header=True, header_style="bold")
    mt.add_column("category")
    mt.add_column("bytes", justify="right")
    for k in ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
        mt.add_row(k.removesuffix("_bytes"), fmt_bytes(est.memory[k]))
    cap = est.capacity_bytes
    style = "green" if est.fits else "red"
    mt.add_row("[bold]peak[/bold]", f"[bold {style}]{fmt_bytes(est.peak_bytes)} of {fmt_bytes(cap)}[/bold {style}]")
    return t, mt


# The full FLOP count over the causal one past which the throughput line also gives the causal MFU:
# where the masked half of the attention matrix is over a tenth of the work the MFU credits (past
# about 6k tokens for Llama 3.1 8B, 1.7x at 131k; Llama 3 70B at 8k stays under it, 1.07), so a
# long-context MFU is not read as a record (``costmodel.ceilings``).
CAUSAL_SHOWN_ABOVE = 1.1


def mfu_words(mfu: float, mfu_causal: float | None = None) -> str:
    """"MFU x%", with the causal MFU (``credibility``'s ``mfu_causal``) where the two counts differ by
    more than ``CAUSAL_SHOWN_ABOVE``."""
    causal = (f" ({mfu_causal * 100:.1f}% with attention counted causal)"
              if mfu_causal and mfu > CAUSAL_SHOWN_ABOVE * mfu_causal else "")
    return f"MFU {mfu * 100:.1f}%{causal}"


def throughput_line(est, mfu_causal: float | None = None) -> str:
    """Throughput and utilization (``mfu_words``)."""
    return (f"{est.tokens_per_s:,.0f} tokens/s ({est.tokens_per_s_per_gpu:,.0f} per GPU), "
            f"{mfu_words(est.mfu, mfu_causal)}, HFU {est.hfu * 100:.1f}%, "
            f"{sig(est.model_tflops_per_gpu)} model TFLOP/s per GPU")


def credibility(model, cluster, workload, step_time_s: float, mfu: float, *, par: ParallelConfig | None = None,
                framework: Any = "generic", stages=None, order=None) -> dict[str, Any]:
    """How far a training prediction can be trusted: the out-of-source band of its kind
    (``costmodel.uncertainty``), the step-time range it gives, a flag when the predicted MFU is
    above the best ever published for that GPU (``costmodel.ceilings``, both by its causal count,
    ``mfu_causal``) with no measured profile,
    one when the step is thin (``costmodel.ceilings.is_thin``), one when ``par`` runs PyTorch's
    ring attention under ``framework`` (``costmodel.attention.torch_ring``) and one when the GPUs run
    below their rated power with no measured profile (``costmodel.ceilings.power_flag``), and one when an MoE
    model's layers are host-paced (``costmodel.ceilings.host_paced_flag``). A dense model in such
    a regime takes that regime's band (``train-thin``, ``train-torch-cp``, ``train-cp`` for context
    parallelism on another ring, Transformer Engine's, or ``train-nvfp4``; the widest where more than one applies) for its
    range. ``tie_band`` is the band two plans are judged ties with
    (``planner.cli.result.tie_line``: the wider of the pair's): the kind's own band in the thin
    regime, which every plan of one problem shares (its ideal step is the problem's), so its
    systematic error moves them together; the torch-ring band for a plan on PyTorch's ring and the
    ``train-cp`` band for one on another ring, regimes of that plan's layout alone, whose error a plan
    without them does not share; for an MoE model, the ``train-moe-host`` band for a plan whose MoE layers are
    host-paced (``costmodel.ceilings.is_host_paced``: the micro-batch and the layout decide it; ``stages`` and
    ``order``, the prediction's pipeline split and mesh order, price it as the estimate did). A regime's
    range runs from the kind's own band below to the regime's band above where its published runs were all
    slower than predicted (the dense regimes), and the other way round where they were all faster
    (``train-moe-host``: its signed range ends below 0). ``band_below`` and ``band_above``: the range's
    sides, relative to the prediction."""
    from costmodel.attention import library_ring, torch_ring
    from costmodel.ceilings import (causal_mfu, ceiling_step_s, host_paced_flag, host_paced_share, ideal_step_s,
                                   is_host_paced, is_thin, mfu_ceiling, mfu_flag, power_flag, thin_flag, torch_cp_flag)
    from costmodel.frameworks import attention_impl, framework_profile
    from costmodel.uncertainty import band_record
    base = "train-moe" if model.is_moe else "train-dense"
    ideal = ideal_step_s(mfu, step_time_s)
    att = attention_impl(framework_profile(framework), par, model.family) if par is not None else ""
    ring = par is not None and torch_ring(att, par.cp)
    other_cp = par is not None and library_ring(att, par.cp)        # Transformer Engine's ring (train-cp)
    share = (host_paced_share(model, cluster, workload, par, framework, stages=stages, order=order)
             if model.is_moe and par is not None else 0.0)
    paced = is_host_paced(share)
    regimes = ((["train-moe-host"] if paced else []) if model.is_moe
               else [k for k, on in (("train-thin", is_thin(ideal)), ("train-torch-cp", ring), ("train-cp", other_cp),
                                     ("train-nvfp4", workload.dtype == "nvfp4")) if on])
    kind = max(regimes, key=lambda k: band_record(k).band) if regimes else base
    band = band_record(kind).band
    gpu = cluster.groups[0].gpu.name
    measured = cluster.measured_profile
    dtype = workload.dtype
    ceil = mfu_ceiling(gpu, dtype)
    causal = causal_mfu(mfu, model, workload.seq_len)
    flag = mfu_flag(mfu, causal, gpu, dtype, measured, step_time_s)
    seen, seen_cp = band_record("train-thin"), band_record("train-torch-cp")
    own = band_record(base).band
    seen_host = band_record("train-moe-host")
    layout_band = (seen_host.band if paced else 0.0) if model.is_moe else (
        seen_cp.band if ring else band_record("train-cp").band if other_cp else 0.0)
    tie = max(own, layout_band)
    # a regime whose published runs were all faster than predicted (host-paced MoE: its signed range ends below
    # 0) widens the range below the prediction, the others above it (module docstring)
    rng = band_record(kind).signed_range()
    faster = kind != base and rng is not None and rng[1] < 0
    lo, hi = (band, min(band, own)) if faster else (min(band, own), band)
    return {"kind": kind, "band": band, "step_time_s_range": [step_time_s * (1 - lo), step_time_s * (1 + hi)],
            "band_below": lo, "band_above": hi,
            "tie_band": tie, "ideal_step_s": ideal,
            "mfu_ceiling": ceil[0] if ceil else None, "mfu_ceiling_source": ceil[1] if ceil else None,
            "mfu_causal": causal, "measured_profile": measured, "mfu_flag": flag,
            "ceiling_step_s": ceiling_step_s(step_time_s, causal, ceil[0]) if flag and ceil else None,
            "thin_flag": thin_flag(ideal, seen.signed_range(), seen.n),
            "torch_cp_flag": torch_cp_flag(par.cp, seen_cp.signed_range(), seen_cp.n) if par and ring else None,
            "host_share": share, "host_flag": host_paced_flag(share, seen_host.signed_range(), seen_host.n),
            "power_flag": power_flag([g.gpu for g in cluster.groups], measured)}


def plan_credibility(plan, step_time_s: float, mfu: float) -> dict[str, Any]:
    """``credibility`` of a plan's prediction, with its layout and its target's profile and
    framework settings (``planner.plan.targets.profile_for``; the generic profile without a target)."""
    from planner.plan.targets import profile_for
    return credibility(plan.model, plan.cluster, plan.workload, step_time_s, mfu, par=plan.parallel,
                       framework=profile_for(plan.target or "", plan.framework), stages=plan.stages,
                       order=plan.mesh_order)


def plain_credibility_lines(cred: dict[str, Any]) -> list[str]:
    """``credibility_lines`` without the terminal's markup (text reports, the launch files' README)."""
    return [line.replace("[yellow]", "").replace("[/yellow]", "") for line in credibility_lines(cred)]


def credibility_lines(cred: dict[str, Any]) -> list[str]:
    lo, hi = cred["step_time_s_range"]
    below, above = cred["band_below"], cred["band_above"]      # the range's sides (credibility)
    sign = f"+/-{above * 100:.0f}%" if abs(below - above) < 1e-9 else f"-{below * 100:.0f}%/+{above * 100:.0f}%"
    out = [f"uncertainty: {sign} ({cred['kind']}, out-of-source validation): step "
           f"{fmt_seconds(lo)} .. {fmt_seconds(hi)}"]
    for key in ("mfu_flag", "thin_flag", "torch_cp_flag", "host_flag", "power_flag"):
        if cred.get(key):
            out.append(f"[yellow]warning:[/yellow] {cred[key]}")
    return out


def sig(x: float, digits: int = 3) -> str:
    """``x`` with at least ``digits`` significant digits, never in exponent form: 526, 52.6,
    0.0823 (a small figure is a small number, not a zero), 1,093 (no digit dropped above)."""
    import math
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    rounded = float(f"{x:.{digits}g}")      # 9.996 -> 10.0: count the digits after rounding
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{x:,.{decimals}f}"
