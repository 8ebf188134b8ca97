"""``planner plan --mode infer``: the flags, the serving search (``planner.search.serving``), and
the plans, JSON, CSV and table it prints.

The batching the figures assume: ``--batching inflight`` (default; continuous batching as the
``--target`` engine schedules it, ``costmodel.batching``) or ``static``. The plan file's
``serving`` section records it: the batching, the engine and its scheduler settings (token
budget, running-request cap, KV block size, memory utilization), the Hugging Face id the
serving files load, the load the figures are for, the goals, for disaggregated plans both pools
(``parallel`` is the decode pool), the best aggregated and disaggregated plans under the goals,
and with ``--pareto`` the frontier.

No plan: exit 1 naming the binding constraint, with the closest plan and what it achieves (also in
the ``--json`` envelope under ``closest``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from costmodel.inference import kv_dtype_of
from costmodel.specs import MESH_AXES, ClusterSpec, ModelSpec, StageSpec, Workload, default_stages
from planner.plan.errors import UsageError
from planner.search.serving import ServeResult, ServingInfeasible
from planner.search.serving_space import BATCHES_PER_OCTAVE, Candidate
from planner.search.target_serving import solve_serving_for

SERVING_ORDER = MESH_AXES
TRAINING_ONLY = ("cp", "vpp", "micro_batch", "grad_accum", "dp_shard", "recompute_layers", "zero", "sp",
                 "recompute", "schedule", "moe_dispatcher", "ep_overlap", "recompute_modules", "offload_modules")
ENGINES = ("vllm", "sglang", "tensorrt-llm")
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# --------------------------------------------------------------------------------------
# The problem from the command line
# --------------------------------------------------------------------------------------

def _check_usage(args: argparse.Namespace) -> None:
    for k in ("prompt_len", "output_len"):
        if getattr(args, k, None) is None:
            raise UsageError(f"--mode infer needs --{k.replace('_', '-')} (tokens per request)")
        if getattr(args, k) < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {args.batch}")
    for k in ("ttft_slo_ms", "tpot_slo_ms", "request_rate"):
        v = getattr(args, k, None)
        if v is not None and not v > 0:
            raise UsageError(f"--{k.replace('_', '-')} must be > 0, got {v}")
    if args.batch is not None and getattr(args, "request_rate", None) is not None:
        raise UsageError("--batch (concurrency per replica) and --request-rate fix the same load; give one")
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if args.max_time <= 0:
        raise UsageError(f"--max-time must be > 0, got {args.max_time}")
    if getattr(args, "objective", "throughput") != "throughput":
        raise UsageError(f"--objective {args.objective}: serving maximizes output tokens/s per GPU (or, with "
                         "--batch or --request-rate, minimizes request latency); --objective applies to training")
    given = [k for k in TRAINING_ONLY if getattr(args, k, None) is not None and not (k == "cp" and args.cp == 1)]
    if given:
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in given)}: training options; a serving "
                         "plan chooses only --tp, --pp, --dp (replicas), --ep and the batch")
    for k in ("tp", "pp", "dp", "ep", "max_num_batched_tokens", "max_num_seqs"):
        v = getattr(args, k, None)
        if v is not None and v < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    u = getattr(args, "gpu_memory_utilization", None)
    if u is not None and not 0.05 <= u <= 1.0:
        raise UsageError(f"--gpu-memory-utilization must be in [0.05, 1], got {u:g} (a fraction, e.g. 0.9)")
    slo_margins(args)          # a bad --slo-margin: exit 2 before any work
    hf = getattr(args, "hf_id", None)
    if hf is not None and not (HF_ID.match(hf) or hf.startswith("/")):
        raise UsageError(f"--hf-id {hf!r} is not a Hugging Face id (org/name) or an absolute path")


def slo_margins(args: argparse.Namespace) -> dict[str, Any]:
    """The margin kept below each latency goal: ``--slo-margin`` (a fraction, both goals), or by
    default each goal's validated error band (``costmodel.uncertainty.relative_band``: serve-ttft,
    serve-tpot). The plan must predict at most goal / (1 + margin)."""
    from costmodel.uncertainty import relative_band
    raw = getattr(args, "slo_margin", None)
    if raw is None or str(raw).strip().lower() == "auto":
        return {"ttft": relative_band("serve-ttft"), "tpot": relative_band("serve-tpot"),
                "source": "auto: the cost model's validated serving error (costmodel/uncertainty_bands.yaml)"}
    try:
        m = float(raw)
    except ValueError:
        m = float("nan")
    if not 0.0 <= m < 1.0:
        raise UsageError(f"--slo-margin {raw}: must be auto or a fraction in [0, 1) (e.g. 0.1 keeps each "
                         "prediction 10% below its goal; 0 plans on the goals themselves)")
    return {"ttft": m, "tpot": m, "source": "--slo-margin"}


def engine_and_batching(args: argparse.Namespace) -> tuple[str, str]:
    """(engine, batching) from ``--target`` and ``--batching``: the built-in runtime serves static
    batches; the servers default to in-flight batching."""
    target = getattr(args, "target", None) or "vllm"
    if target in ("all", "generic"):
        target = "vllm"          # --target all compares the targets (plan_all); the default server's scheduler
    batching = getattr(args, "batching", None)
    if target == "builtin":
        if batching == "inflight":
            raise UsageError("--target builtin serves static batches (prefill, then decode); use --batching static "
                             "or a server target (vllm, sglang, tensorrt-llm) for continuous batching")
        return "builtin", "static"
    if target not in ENGINES:
        raise UsageError(f"--target {target}: serving plans are for {', '.join(ENGINES)} or builtin")
    batching = batching or "inflight"
    if batching == "inflight" and args.output_len is not None and args.output_len < 2:
        raise UsageError(f"--output-len {args.output_len}: continuous batching needs at least 2 output tokens (the "
                         "first comes from the prefill); plan a prompt-only workload with --batching static")
    if batching == "static":
        for k in ("request_rate", "max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization"):
            if getattr(args, k, None) is not None:
                raise UsageError(f"--{k.replace('_', '-')} describes continuous batching; drop it or use "
                                 "--batching inflight")
        if getattr(args, "disaggregation", "auto") == "only":
            raise UsageError("--disaggregation only needs --batching inflight (the pools batch continuously)")
    return target, batching


def scheduler_for(args: argparse.Namespace, engine: str, cluster: ClusterSpec):
    from costmodel.batching import scheduler_defaults
    return scheduler_defaults(engine, cluster.gpu, token_budget=getattr(args, "max_num_batched_tokens", None),
                              max_num_seqs=getattr(args, "max_num_seqs", None),
                              gpu_memory_utilization=getattr(args, "gpu_memory_utilization", None))


def hf_id_for(args: argparse.Namespace, model: ModelSpec) -> str | None:
    """The Hugging Face id the serving files load: ``--hf-id``; a config.json's ``_name_or_path``
    when it is an id (not a local path); the catalog's id; else None (the files then need MODEL)."""
    if getattr(args, "hf_id", None):
        return args.hf_id
    p = Path(str(args.model))
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" and p.is_file():
        try:
            name = json.loads(p.read_text()).get("_name_or_path")
        except (OSError, ValueError, AttributeError):
            name = None
        if isinstance(name, str) and HF_ID.match(name):
            return name
    from costmodel.catalog import hf_id
    return hf_id(model.name)


def load_serving_problem(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, Workload]:
    """Model, cluster and serving workload from the flags (``load_problem`` wants a batch and a
    sequence length: here they are the batch, or 1 while searching, and prompt + output)."""
    from planner.cli.args import load_problem
    a = argparse.Namespace(**vars(args))
    a.global_batch = args.batch or 1
    a.seq_len = args.prompt_len + args.output_len
    model, cluster, wl = load_problem(a, mode="infer")
    if len(cluster.groups) > 1:
        raise UsageError(f"cluster {cluster.name!r} has {len(cluster.groups)} node groups; serving plans use "
                         "one kind of GPU (give one group's cluster file)")
    wl = dataclasses.replace(wl, prompt_len=args.prompt_len, output_len=args.output_len,
                             kv_dtype=args.kv_dtype or "")
    wl = dataclasses.replace(wl, kv_dtype=kv_dtype_of(wl))     # recorded explicitly in the plan
    return model, cluster, wl


def _fixed(args: argparse.Namespace) -> dict[str, int]:
    return {k: getattr(args, k) for k in ("tp", "pp", "dp", "ep") if getattr(args, k, None) is not None}


# --------------------------------------------------------------------------------------
# Plans, JSON, the table
# --------------------------------------------------------------------------------------

def solver_json(res: ServeResult) -> dict[str, Any]:
    gap = 0.0
    if res.objective and res.bound is not None:
        gap = abs(res.bound - res.objective) / abs(res.objective)
    out = {"status": res.status, "objective": res.objective, "bound": res.bound, "gap": gap,
           "wall_time_s": res.wall_time_s, "candidates": res.candidates, "solved": res.candidates,
           "objective_name": res.objective_name, "space": f"degree tuples x batch grid ({BATCHES_PER_OCTAVE} "
           "sizes per doubling up to each tuple's largest fitting batch)"}
    if res.comparison:
        out["comparison"] = {k: _candidate_summary(c) for k, c in res.comparison.items()}
    return out


def _candidate_summary(c: Candidate | None) -> dict | None:
    if c is None:
        return None
    e = c.est
    d = {"layout": c.layout(), "disaggregated": c.disaggregated, "gpus": c.gpus, "ttft_s": e.ttft_s,
         "tpot_s": e.tpot_s, "output_tokens_per_s": e.output_tokens_per_s,
         "output_tokens_per_s_per_gpu": e.output_tokens_per_s_per_gpu,
         "concurrency": e.schedule.get("concurrency", c.batch)}
    if c.disaggregated:
        assert c.prefill is not None           # a disaggregated candidate names its prefill pool
        tp, pp, ep, r = c.prefill
        d["prefill"] = {"tp": tp, "pp": pp, "ep": ep, "replicas": r}
        d["decode"] = {"tp": c.tp, "pp": c.pp, "ep": c.ep, "replicas": c.dp}
    else:
        d["parallel"] = {"tp": c.tp, "pp": c.pp, "dp": c.dp, "ep": c.ep}
    return d


def serving_section(c: Candidate, engine: str, batching: str, sched, hf_id: str | None, slo: dict,
                    load: dict, comparison: dict | None = None, pareto: dict | None = None) -> dict[str, Any]:
    """The plan file's ``serving`` section (module docstring)."""
    s: dict[str, Any] = {"batching": "disaggregated" if c.disaggregated else batching, "engine": engine,
                         "hf_id": hf_id, "slo": slo, "load": load}
    if sched is not None:
        s["scheduler"] = sched.to_dict()
    sch = c.est.schedule or {}
    if batching == "inflight" and not c.disaggregated:
        s["operating_point"] = {k: sch[k] for k in ("concurrency", "decode_batch", "request_rate_per_s", "running",
                                                    "chunk_tokens", "mixed_fraction", "max_concurrency",
                                                    "kv_capacity_tokens", "max_running") if k in sch}
    if c.disaggregated:
        dis = sch["disaggregation"]
        s["disaggregation"] = {
            "prefill": {k: dis["prefill"][k] for k in ("tp", "pp", "ep", "replicas")},
            "decode": {k: dis["decode"][k] for k in ("tp", "pp", "ep", "replicas")},
            "decode_batch": sch["decode_batch"], "kv_transfer_s": dis["kv_transfer_s"],
            "kv_transfer_tier": dis["kv_transfer_tier"], "prefill_utilization": dis["prefill"]["utilization"]}
    if comparison:
        s["comparison"] = {k: _candidate_summary(v) for k, v in comparison.items()}
    if pareto:
        s["pareto"] = pareto
    return s


def make_plan(model: ModelSpec, cluster: ClusterSpec, wl: Workload, c: Candidate, solver: dict | None = None,
              cluster_source: str = "catalog", target: str = "", serving: dict | None = None):
    from planner.plan.planfile import Plan, provenance
    world = c.gpus
    used = cluster if world == cluster.total_gpus else cluster.with_gpus(world)
    return Plan(model=model, cluster=used, workload=dataclasses.replace(wl, global_batch=c.batch), parallel=c.par,
                stages=default_stages(model.layers, c.pp), mesh_order=SERVING_ORDER, estimate=c.est.to_dict(),
                solver=dict(solver or {}), provenance=provenance(cluster_source), target=target,
                serving=dict(serving or {}))


def serving_power_flag(plan) -> str | None:
    """``costmodel.ceilings.power_flag`` for a serving plan: its GPUs below their rated power, no
    measured profile behind the prediction."""
    from costmodel.ceilings import power_flag
    return power_flag([g.gpu for g in plan.cluster.groups], plan.cluster.measured_profile,
                      expect="lower throughput and longer latencies")


def plan_json(plan) -> dict[str, Any]:
    from planner.cli.report import parallel_json
    w = plan.workload
    srv = dict(plan.serving or {})
    out = {"parallel": parallel_json(plan.parallel), "estimate": dict(plan.estimate),
           "stages": [s.to_dict() for s in plan.stages],
           "mesh": {"order": list(plan.mesh_order), **plan.rank_layout()}, "gpus": plan.world_size,
           "serving": {"replicas": plan.parallel.dp, "batch_per_replica": w.global_batch,
                       "prompt_len": w.prompt_len, "output_len": w.output_len, "dtype": w.dtype,
                       "kv_dtype": w.kv_dtype,
                       **{k: v for k, v in srv.items() if k not in ("pareto", "comparison")},
                       "goals": goal_slack(plan), "power_flag": serving_power_flag(plan)}}
    if plan.target:
        out["target"] = plan.target
    return out


def _candidate_json(c: Candidate | None) -> dict | None:
    if c is None:
        return None
    d = {"parallel": {"tp": c.tp, "pp": c.pp, "dp": c.dp, "ep": c.ep}, "batch": c.batch,
         "estimate": c.est.to_dict(stages=False)}
    if c.disaggregated:
        assert c.prefill is not None
        d["prefill"] = dict(zip(("tp", "pp", "ep", "replicas"), c.prefill))
    return d


def _csv_rows(cands: list[Candidate]) -> list[dict]:
    rows = []
    for c in cands:
        e = c.est
        rows.append({"layout": c.layout(), "disaggregated": c.disaggregated, "tp": c.tp, "pp": c.pp,
                     "replicas": c.dp, "ep": c.ep, "batch": c.batch,
                     "concurrency": e.schedule.get("concurrency", c.batch), "ttft_s": e.ttft_s,
                     "tpot_s": e.tpot_s, "output_tokens_per_s_per_gpu": e.output_tokens_per_s_per_gpu,
                     "peak_bytes": e.peak_bytes, "fits": e.fits, "max_batch": e.max_batch})
    return rows


def same_point(p: dict | None, q: dict | None) -> bool:
    """Two frontier points are the same plan at the same operating point."""
    if not p or not q:
        return False
    return (p["layout"] == q["layout"] and p["kind"] == q["kind"]
            and abs(p["tpot_s"] - q["tpot_s"]) <= 1e-9 * max(p["tpot_s"], 1e-12)
            and abs(p["output_tokens_per_s_per_gpu"] - q["output_tokens_per_s_per_gpu"])
            <= 1e-9 * max(p["output_tokens_per_s_per_gpu"], 1e-12))


def print_table(res: ServeResult, plans: list, pareto: list | None = None) -> None:
    from rich.table import Table

    from costmodel.units import fmt_bytes, fmt_seconds
    from planner.cli.report import console
    c = console()
    best = plans[0]
    w = best.workload
    srv = best.serving or {}
    regime = {"inflight": f"continuous batching ({srv.get('engine')})", "static": "static batches",
              "disaggregated": f"disaggregated prefill/decode ({srv.get('engine')})"}.get(str(srv.get("batching")), "")
    c.print(f"[bold]{best.model.name}[/bold] serving on {best.world_size} x {best.cluster.gpu.name} "
            f"({best.cluster.name}): prompt {w.prompt_len} + output {w.output_len} tokens, weights {w.dtype}, "
            f"KV cache {w.kv_dtype}; {regime}")
    t = Table(title=f"top {len(plans)} plan(s)", header_style="bold")
    for col in ("#", "layout", "concurrency", "TTFT", "TPOT", "tok/s/user", "tok/s/GPU", "peak mem"):
        t.add_column(col, justify="right")
    for rank, s in enumerate(res.solutions, 1):
        e = s.est
        conc = e.schedule.get("concurrency", s.batch)
        t.add_row(str(rank), s.layout(), f"{conc:,.1f}" if isinstance(conc, float) else str(conc),
                  fmt_seconds(e.ttft_s), fmt_seconds(e.tpot_s), f"{1 / e.tpot_s:,.1f}",
                  f"{e.output_tokens_per_s_per_gpu:,.1f}", fmt_bytes(e.peak_bytes))
    c.print(t)
    e = res.solutions[0].est
    tt = Table(title="best plan: time", header_style="bold")
    tt.add_column("term")
    tt.add_column("time", justify="right")
    for k, v in e.time.items():
        if v:
            tt.add_row(k.removesuffix("_s").replace("_", " "), fmt_seconds(v))
    pools = [("bytes", e.memory)]
    dis = (e.schedule or {}).get("disaggregation") if e.batching == "disaggregated" else None
    if dis:          # each pool's own memory: never one pool's weights beside the other's KV room
        pools = [("prefill pool", dis["prefill"]["memory"]), ("decode pool", dis["decode"]["memory"])]
    mt = Table(title="memory per GPU (fullest stage" + (" of each pool)" if dis else ")"), header_style="bold")
    mt.add_column("category")
    for name, _ in pools:
        mt.add_column(name, justify="right")
    for k in ("weights_bytes", "kv_cache_bytes", "activations_bytes", "other_bytes"):
        mt.add_row(k.removesuffix("_bytes").replace("_", " "), *(fmt_bytes(m.get(k, 0.0)) for _, m in pools))
    mt.add_row("[bold]peak[/bold]", *(f"[bold]{fmt_bytes(m['peak_bytes'])} of {fmt_bytes(e.capacity_bytes)}[/bold]"
                                      for _, m in pools))
    c.print(tt)
    c.print(mt)
    c.print(f"{e.output_tokens_per_s:,.0f} output tokens/s ({e.output_tokens_per_s_per_gpu:,.1f} per GPU), "
            f"request latency {fmt_seconds(e.request_latency_s)}, KV cache {fmt_bytes(e.kv_cache_bytes_per_token)}"
            f" per token per GPU, room for {e.kv_cache_capacity_tokens:,} tokens" + (" (decode pool)" if dis else ""))
    sch = e.schedule or {}
    if e.batching == "inflight":
        c.print(f"steady state: {sch['concurrency']:.1f} requests per replica ({sch['request_rate_per_s']:.2f}/s), "
                f"{sch['decode_batch']:.1f} decoding per step, {sch['mixed_fraction'] * 100:.0f}% of steps carry a "
                f"{sch['chunk_tokens']:.0f}-token prefill chunk ({fmt_seconds(sch['mixed_step_s'])} vs "
                f"{fmt_seconds(sch['decode_step_s'])} decode-only); token budget {sch['scheduler']['token_budget']}, "
                f"at most {sch['max_running']} running (KV pool {fmt_bytes(sch['kv_pool_bytes'])})")
    elif e.batching == "disaggregated":
        dis = sch["disaggregation"]
        c.print(f"pools {dis['ratio']} GPUs (prefill:decode), {sch['decode_batch']:.1f} decoding per decode instance, "
                f"prefill pool {dis['prefill']['utilization'] * 100:.0f}% busy, KV transfer "
                f"{fmt_seconds(dis['kv_transfer_s'])} over {dis['kv_transfer_tier']}")
    comp = res.comparison or {}
    if comp.get("aggregated") is not None or comp.get("disaggregated") is not None:
        a, d = comp.get("aggregated"), comp.get("disaggregated")
        line = []
        for name, x in (("aggregated", a), ("disaggregated", d)):
            if name not in comp:
                continue                    # not searched (--disaggregation off, or a fixed load)
            line.append(f"best {name}: " + (f"{x.layout()} {x.est.output_tokens_per_s_per_gpu:,.1f} tok/s/GPU "
                                            f"(TTFT {fmt_seconds(x.est.ttft_s)}, TPOT {fmt_seconds(x.est.tpot_s)})"
                                            if x is not None else "none meets the goals"))
        if a is not None and d is not None:
            ratio = d.est.output_tokens_per_s_per_gpu / a.est.output_tokens_per_s_per_gpu
            line.append(f"disaggregated/aggregated {ratio:.2f}x")
        c.print("; ".join(line))
    if pareto:
        pt = Table(title="frontier: output tokens/s per GPU vs tokens/s per user", header_style="bold")
        for col in ("", "kind", "layout", "concurrency", "tok/s/user", "tok/s/GPU", "TTFT", "TPOT"):
            pt.add_column(col, justify="right")
        chosen = ((best.serving or {}).get("pareto") or {}).get("chosen")
        rows = [(p, same_point(p, chosen)) for p in pareto]
        if chosen and not any(on for _, on in rows):     # the chosen plan inside the frontier: its own row
            rows.append((chosen, True))
            rows.sort(key=lambda r: r[0]["tokens_per_s_per_user"])
        for p, on in rows:
            conc = p.get("concurrency")
            pt.add_row("chosen" if on else "", p["kind"], p["layout"], "" if conc is None else f"{conc:,.1f}",
                       f"{p['tokens_per_s_per_user']:,.1f}", f"{p['output_tokens_per_s_per_gpu']:,.1f}",
                       fmt_seconds(p["ttft_s"]), fmt_seconds(p["tpot_s"]), style="bold" if on else None)
        c.print(pt)
    gap = f", gap {solver_json(res)['gap'] * 100:.2f}%" if res.status != "OPTIMAL" else ""
    c.print(f"solver: [bold]{res.status}[/bold]{gap}, objective {res.objective:.6g} ({res.objective_name}), "
            f"bound {res.bound:.6g}, {res.candidates} candidates, {res.wall_time_s:.2f} s")


def slo_record(args: argparse.Namespace, margins: dict, slo_t: float | None, slo_p: float | None) -> dict:
    """The plan file's ``serving.slo``: the goals, and with any goal the margins kept and the
    goals the search was held to (``planned_ms``)."""
    slo: dict[str, Any] = {"ttft_ms": args.ttft_slo_ms, "tpot_ms": args.tpot_slo_ms}
    if slo_t is not None or slo_p is not None:
        slo["margin"] = {"ttft": margins["ttft"], "tpot": margins["tpot"], "source": margins["source"]}
        slo["planned_ms"] = {"ttft": slo_t * 1e3 if slo_t is not None else None,
                             "tpot": slo_p * 1e3 if slo_p is not None else None}
    return slo


def goal_slack(plan) -> list[dict[str, Any]]:
    """Per latency goal of a serving plan: the goal, the margin kept, the predicted value and the
    slack (goal - predicted) / goal."""
    srv = plan.serving or {}
    slo, margin = srv.get("slo") or {}, (srv.get("slo") or {}).get("margin") or {}
    est = plan.estimate or {}
    out = []
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        goal_ms = slo.get(f"{key}_ms")
        if goal_ms is None or est.get(f"{key}_s") is None:
            continue
        pred_ms = est[f"{key}_s"] * 1e3
        out.append({"goal": name, "goal_ms": goal_ms, "predicted_ms": pred_ms, "margin": margin.get(key),
                    "slack": (goal_ms - pred_ms) / goal_ms})
    return out


def slack_text(plan) -> str:
    """One line per goal: predicted against the goal, the slack, and the margin the plan was held to."""
    lines = []
    for g in goal_slack(plan):
        kept = (f" (planned with a {g['margin'] * 100:.1f}% margin below the goal)" if g["margin"] is not None
                else " (a plan from before margins: none recorded)")
        lines.append(f"{g['goal']} goal {g['goal_ms']:g} ms: predicted {g['predicted_ms']:.4g} ms, slack "
                     f"{g['slack'] * 100:.1f}%{kept}")
    if lines:
        src = ((plan.serving or {}).get("slo") or {}).get("margin", {}).get("source", "")
        if src.startswith("auto"):
            lines.append("margins: the cost model's validated serving error (--slo-margin F to change, 0 for none)")
    warn = serving_power_flag(plan)
    if warn:
        lines.append(f"warning: {warn}")
    return "".join(line + "\n" for line in lines)


def _pareto(model, cluster, wl, res: ServeResult, sched, fixed, disaggregation: str, slo_t, slo_p, chosen):
    """The frontier over the scored candidates and every disaggregated layout (``serving_pareto``)."""
    from planner.search.serving_disagg import frontier_points
    from planner.search.serving_pareto import chosen_point, frontier
    dpts = []
    if sched is not None and disaggregation != "off":
        dpts = frontier_points(model, cluster, wl, sched, fixed, slo_t)
    cands = res.scored if disaggregation != "only" else []
    pts = frontier(cands, dpts, slo_t)
    return pts, {"points": pts, "chosen": chosen_point(chosen),
                 "slo": {"ttft_s": slo_t, "tpot_s": slo_p,
                         "tokens_per_s_per_user_min": (1.0 / slo_p) if slo_p else None}}


def run(args: argparse.Namespace) -> int:
    from planner.cli.args import check_writable, cluster_source_of
    from planner.cli.report import print_json
    _check_usage(args)
    engine, batching = engine_and_batching(args)
    check_writable(args.out)
    check_writable(getattr(args, "csv", None))
    check_writable(getattr(args, "pareto_csv", None))
    model, cluster, wl = load_serving_problem(args)
    from costmodel.uncertainty import margin_goal
    margins = slo_margins(args)
    goal_t = args.ttft_slo_ms / 1e3 if args.ttft_slo_ms is not None else None
    goal_p = args.tpot_slo_ms / 1e3 if args.tpot_slo_ms is not None else None
    # what the search must meet: each goal less its margin (the goals themselves are printed with the slack)
    slo_t = margin_goal(goal_t, margins["ttft"]) if goal_t is not None else None
    slo_p = margin_goal(goal_p, margins["tpot"]) if goal_p is not None else None
    sched = scheduler_for(args, engine, cluster) if batching == "inflight" else None
    disagg = getattr(args, "disaggregation", "auto") if sched is not None else "off"
    rate = getattr(args, "request_rate", None)
    if args.batch is not None or rate is not None or _fixed(args).get("dp"):
        disagg = "off" if disagg == "auto" else disagg
    if disagg == "only" and (args.batch is not None or rate is not None):
        raise UsageError("--disaggregation only searches the highest throughput under the goals; drop --batch / "
                         "--request-rate")
    fixed = _fixed(args)
    target = getattr(args, "target", None) or "vllm"      # serving's default: vLLM's scheduler
    args._slo_record = slo_record(args, margins, slo_t, slo_p)      # what every target's plan records
    if target == "all":
        return infer_all(args, model, cluster, wl, slo_t, slo_p)
    try:
        res = solve_serving_for(target, model, cluster, wl, fixed, batch=args.batch, ttft_slo_s=slo_t,
                                tpot_slo_s=slo_p, top=args.top, max_time_s=args.max_time,
                                batch_limit=args.max_batch, exhaustive=bool(getattr(args, "exhaustive", False)),
                                sched=sched, rate_per_s=rate, disaggregation=disagg)
    except ServingInfeasible as e:
        if args.json:
            print_json({"status": "INFEASIBLE", "plans": [], "reason": e.reason, "message": str(e),
                        "closest": _candidate_json(e.closest),
                        "solver": {"status": "INFEASIBLE", "objective": None, "bound": None}})
        raise
    source = cluster_source_of(args.cluster)
    sj = solver_json(res)
    pareto_pts, pareto = (None, None)
    if getattr(args, "pareto", False) or getattr(args, "pareto_csv", None):
        pareto_pts, pareto = _pareto(model, cluster, wl, res, sched, fixed, disagg, slo_t, slo_p, res.solutions[0])
        pareto["goal"] = {"ttft_s": goal_t, "tpot_s": goal_p}        # the user's, beside the margin-held slo
    hf = hf_id_for(args, model)
    slo = args._slo_record
    if disagg == "off" and res.comparison:     # that search never ran: say nothing about it
        res.comparison = {k: v for k, v in res.comparison.items() if k != "disaggregated"}
    load = {"concurrency_per_replica": args.batch, "request_rate_per_s": rate}
    plans = [make_plan(model, cluster, wl, c, sj, source, target,
                       serving_section(c, engine, batching, sched, hf, slo, load,
                                       res.comparison if k == 0 else None, pareto if k == 0 else None))
             for k, c in enumerate(res.solutions)]
    if args.out:
        from planner.plan.planfile import write_plan
        write_plan(plans[0], args.out)
    if getattr(args, "csv", None):
        import pandas as pd
        from costmodel.files.safeio import write_text
        write_text(args.csv, pd.DataFrame(_csv_rows(res.scored)).to_csv(index=False), "--csv")
    if getattr(args, "pareto_csv", None):
        import pandas as pd
        cols = ("kind", "layout", "concurrency", "decode_batch", "tokens_per_s_per_user",
                "output_tokens_per_s_per_gpu", "ttft_s", "tpot_s")
        pd.DataFrame([{k: p.get(k) for k in cols} for p in pareto_pts or []]).to_csv(args.pareto_csv, index=False)
    if args.json:
        env = {"status": res.status, "plans": [plan_json(p) for p in plans], "solver": sj}
        if getattr(args, "pareto", False):
            env["pareto"] = pareto
        print_json(env)
    else:
        print_table(res, plans, pareto_pts if getattr(args, "pareto", False) else None)
        print(slack_text(plans[0]), end="")
        if args.out:
            print(f"wrote {args.out}", file=sys.stderr)
    return 0


__all__ = ["slo_margins", "goal_slack", "slack_text", "same_point",
           "run", "make_plan", "plan_json", "solver_json", "serving_section", "load_serving_problem",
           "engine_and_batching", "scheduler_for", "hf_id_for", "StageSpec"]


def infer_all(args: argparse.Namespace, model, cluster, wl, slo_t, slo_p) -> int:
    """``--mode infer --target all``: each serving target's best plan."""
    from planner.cli.args import cluster_source_of
    from planner.cli.plan_all import _status, _write
    from planner.cli.report import console, print_json
    from planner.plan import targets as T
    from planner.plan.errors import InfeasibleError, SolverStopped

    rows: list[tuple[str, Any, str]] = []
    errors: list = []
    # each server with its own scheduler (continuous batching, its defaults); builtin serves static batches
    scheds = {t: (scheduler_for(args, t, cluster) if t != "builtin" and getattr(args, "batching", None) != "static"
                  else None) for t in T.planning_targets("infer")}
    for t in T.planning_targets("infer"):
        try:
            res = solve_serving_for(t, model, cluster, wl, _fixed(args), batch=args.batch, ttft_slo_s=slo_t,
                                    tpot_slo_s=slo_p, top=args.top, max_time_s=args.max_time,
                                    batch_limit=args.max_batch, exhaustive=bool(getattr(args, "exhaustive", False)),
                                    sched=scheds[t], rate_per_s=getattr(args, "request_rate", None))
            rows.append((t, res, ""))
        except (InfeasibleError, SolverStopped) as e:
            rows.append((t, None, str(e)))
            errors.append(e)
    ok = [(t, r) for t, r, _ in rows if r is not None]
    if not ok:
        first = errors[0]
        if args.json:
            print_json({"status": "INFEASIBLE", "plans": [], "reason": getattr(first, "reason", ""),
                        "message": str(first), "closest": _candidate_json(getattr(first, "closest", None)),
                        "solver": {"status": "INFEASIBLE", "objective": None, "bound": None}})
        if len({str(e) for e in errors}) == 1:
            raise first                   # the same reason for every target (the model, the context, ...)
        raise InfeasibleError("no serving target has a plan: " + "; ".join(f"{t}: {e}" for t, _, e in rows))
    lower_better = ok[0][1].objective_name == "request_latency_s"
    ok.sort(key=lambda x: x[1].objective if lower_better else -x[1].objective)
    src = cluster_source_of(args.cluster)
    hf = hf_id_for(args, model)
    slo = getattr(args, "_slo_record", None) or {"ttft_ms": args.ttft_slo_ms, "tpot_ms": args.tpot_slo_ms}
    load = {"concurrency_per_replica": args.batch, "request_rate_per_s": getattr(args, "request_rate", None)}
    plans = {t: [make_plan(model, cluster, wl, c, solver_json(r), src, t,
                           serving_section(c, t, "static" if scheds[t] is None else "inflight", scheds[t], hf, slo,
                                           load))
                 for c in r.solutions] for t, r in ok}
    order = [t for t, _ in ok]
    written = _write(plans, order, args.out) if args.out else []
    if getattr(args, "csv", None):
        import pandas as pd

        pd.DataFrame([{"target": t, **row} for t, r in ok for row in _csv_rows(r.scored)]).to_csv(args.csv,
                                                                                                 index=False)
    if args.json:
        every = [(p, r) for t, r in ok for p in plans[t]]
        print_json({"status": _status([r.status for _, r in ok]),
                    "plans": [{**plan_json(p), "solver": solver_json(r)} for p, r in every],
                    "solver": {**solver_json(ok[0][1]), "target": order[0],
                               "targets": {t: (solver_json(r) if r is not None else {"status": "INFEASIBLE",
                                                                                     "error": e})
                                           for t, r, e in rows}}})
    else:
        from rich.table import Table
        c = console()
        tab = Table(title="the best serving plan of each target (best first)", header_style="bold")
        for col in ("target", "tp", "pp", "replicas", "ep", "batch", "tok/s/GPU", "TTFT", "TPOT", "why not"):
            tab.add_column(col)
        by = dict((t, (r, e)) for t, r, e in rows)
        for t in order + [t for t, r, _ in rows if r is None]:
            r, why = by[t]
            if r is None:
                tab.add_row(t, "", "", "", "", "", "", "", "", why)
                continue
            s = r.solutions[0]
            tab.add_row(t, str(s.tp), str(s.pp), str(s.dp), str(s.ep), str(s.batch),
                        f"{s.est.output_tokens_per_s_per_gpu:,.1f}", f"{s.est.ttft_s * 1e3:.1f} ms",
                        f"{s.est.tpot_s * 1e3:.2f} ms", "")
        c.print(tab)
        c.print(f"\n[bold]best: {order[0]}[/bold]")
        print_table(ok[0][1], plans[order[0]])
        print(slack_text(plans[order[0]][0]), end="")
    for f in written:
        print(f"wrote {f}", file=sys.stderr)
    return 0
