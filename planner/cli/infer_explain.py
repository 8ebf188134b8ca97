"""``planner explain PLAN`` for a serving plan: the steady state its figures come from, where
TTFT and TPOT go, the best aggregated and disaggregated plans under its goals, and (``--html``)
the frontier of output tokens/s per GPU against tokens/s per user with the plan marked and the
goals drawn (``planner.cli.explain.pareto_figure``). The frontier is the plan file's (``planner
plan --pareto``), or computed again from the plan's problem when the file has none.
"""
from __future__ import annotations

import argparse
import html
from pathlib import Path
from typing import Any

from planner.plan.errors import UsageError


def _fmt_ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


def frontier_for(plan) -> dict[str, Any]:
    """The plan's frontier: its own, or solved again from the model, cluster, workload, engine
    scheduler and goals the plan records."""
    srv = dict(plan.serving or {})
    if srv.get("pareto"):
        return srv["pareto"]
    from costmodel.batching import SchedulerConfig
    from planner.cli.infer_plan import _pareto
    from planner.search.serving import solve_serving
    sched = SchedulerConfig(**srv["scheduler"]) if srv.get("scheduler") else None
    slo = srv.get("slo") or {}
    planned = slo.get("planned_ms") or {}       # the goals less the margin the plan was held to
    slo_t = (planned.get("ttft") or slo.get("ttft_ms") or 0) / 1e3 or None
    slo_p = (planned.get("tpot") or slo.get("tpot_ms") or 0) / 1e3 or None
    disagg = "auto" if sched is not None else "off"
    cluster = plan.cluster
    res = solve_serving(plan.model, cluster, plan.workload, {}, ttft_slo_s=slo_t, tpot_slo_s=slo_p, sched=sched,
                        disaggregation=disagg, max_time_s=30.0)
    _, pareto = _pareto(plan.model, cluster, plan.workload, res, sched, {}, disagg, slo_t, slo_p, res.solutions[0])
    pareto["goal"] = {"ttft_s": slo["ttft_ms"] / 1e3 if slo.get("ttft_ms") else None,
                      "tpot_s": slo["tpot_ms"] / 1e3 if slo.get("tpot_ms") else None}
    est = dict(plan.estimate)
    pareto["chosen"] = {"kind": "disaggregated" if srv.get("disaggregation") else "aggregated",
                        "layout": _layout(plan), "ttft_s": est["ttft_s"], "tpot_s": est["tpot_s"],
                        "tokens_per_s_per_user": 1.0 / est["tpot_s"],
                        "output_tokens_per_s_per_gpu": est["output_tokens_per_s_per_gpu"]}
    return pareto


def _layout(plan) -> str:
    p = plan.parallel
    dis = (plan.serving or {}).get("disaggregation")

    def one(tp, pp, ep, r):
        return f"tp{tp}" + (f" pp{pp}" if pp > 1 else "") + (f" ep{ep}" if ep > 1 else "") + f" x{r}"
    d = one(p.tp, p.pp, p.ep, p.dp)
    if not dis:
        return d
    q = dis["prefill"]
    return f"P: {one(q['tp'], q['pp'], q['ep'], q['replicas'])} | D: {d}"


def text(plan) -> str:
    est = dict(plan.estimate)
    srv = dict(plan.serving or {})
    w = plan.workload
    sch = est.get("schedule") or {}
    lines = [f"{plan.model.name} serving on {plan.world_size} x {plan.cluster.gpu.name}: {_layout(plan)}, "
             f"prompt {w.prompt_len} + output {w.output_len} tokens ({srv.get('batching', 'static')} batching, "
             f"{srv.get('engine', 'engine not recorded')})",
             f"TTFT {_fmt_ms(est.get('ttft_s'))}, TPOT {_fmt_ms(est.get('tpot_s'))}, "
             f"{est.get('output_tokens_per_s_per_gpu', 0):,.1f} output tokens/s per GPU"]
    from planner.cli.infer_plan import slack_text
    lines += slack_text(plan).splitlines()      # each goal, the prediction, its slack and the margin kept
    t = est.get("time") or {}
    if est.get("batching") == "inflight":
        lines.append(f"steady state: {sch['concurrency']:.1f} requests per replica at {sch['request_rate_per_s']:.2f}/s; "
                     f"{sch['decode_batch']:.1f} decode per step; {sch['mixed_fraction'] * 100:.0f}% of steps carry a "
                     f"{sch['chunk_tokens']:.0f}-token prefill chunk ({_fmt_ms(sch['mixed_step_s'])} against "
                     f"{_fmt_ms(sch['decode_step_s'])} decode-only): TPOT is their mix")
        lines.append(f"TTFT = {_fmt_ms(t.get('ttft_residual_s'))} rest of the running step + "
                     f"{_fmt_ms(t.get('ttft_queue_s'))} waiting for prefill budget + {_fmt_ms(t.get('ttft_prefill_s'))} "
                     "of the prompt's own steps")
    elif est.get("batching") == "disaggregated":
        dis = sch["disaggregation"]
        lines.append(f"pools {dis['ratio']} GPUs (prefill:decode); prefill pool {dis['prefill']['utilization'] * 100:.0f}% "
                     f"busy; decode {sch['decode_batch']:.1f} requests per instance, no prefill in its steps")
        lines.append(f"TTFT = {_fmt_ms(t.get('ttft_queue_s'))} prefill queue + {_fmt_ms(t.get('ttft_prefill_s'))} prefill "
                     f"+ {_fmt_ms(t.get('ttft_kv_transfer_s'))} KV transfer ({dis['kv_transfer_tier']}) + "
                     f"{_fmt_ms(t.get('ttft_decode_join_s'))} joining the decoder")
    comp = srv.get("comparison") or {}
    for kind in ("aggregated", "disaggregated"):
        c = comp.get(kind)
        if c:
            lines.append(f"best {kind}: {c['layout']} {c['output_tokens_per_s_per_gpu']:,.1f} tokens/s per GPU, "
                         f"TTFT {_fmt_ms(c['ttft_s'])}, TPOT {_fmt_ms(c['tpot_s'])}")
        elif kind in comp:
            lines.append(f"best {kind}: none meets the goals")
    return "\n".join(lines) + "\n"


def html_report(plan, pareto: dict[str, Any]) -> str:
    from planner.cli.explain import pareto_figure
    title, png = pareto_figure(pareto)
    from planner.cli.infer_plan import same_point
    chosen = pareto.get("chosen")
    pts = [(q, same_point(q, chosen)) for q in pareto["points"]]
    if chosen and not any(on for _, on in pts):
        pts = sorted(pts + [(chosen, True)], key=lambda r: r[0]["tokens_per_s_per_user"])
    rows = "".join(f"<tr{' class=chosen' if on else ''}><td>{'chosen' if on else ''}</td>"
                   f"<td>{html.escape(q['kind'])}</td><td>{html.escape(q['layout'])}</td>"
                   f"<td>{q['tokens_per_s_per_user']:.1f}</td><td>{q['output_tokens_per_s_per_gpu']:.1f}</td>"
                   f"<td>{q['ttft_s'] * 1e3:.1f}</td><td>{q['tpot_s'] * 1e3:.2f}</td></tr>" for q, on in pts)
    body = [f"<h1>Serving plan: {html.escape(plan.model.name)} on {plan.world_size} x "
            f"{html.escape(plan.cluster.gpu.name)}</h1>", f"<pre>{html.escape(text(plan))}</pre>",
            f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'/>",
            "<table><tr><th></th><th>kind</th><th>layout</th><th>tok/s/user</th><th>tok/s/GPU</th><th>TTFT ms</th>"
            f"<th>TPOT ms</th></tr>{rows}</table>"]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>planner explain</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}pre{background:#f6f6f6;padding:1em;"
            "white-space:pre-wrap}td,th{padding:0 0.6em;text-align:right}tr.chosen{font-weight:bold}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def run(args: argparse.Namespace, plan) -> int:
    from planner.cli.report import print_json
    if not plan.estimate or "tpot_s" not in plan.estimate:
        raise UsageError(f"{args.plan} has no serving estimate to explain (plan it with `planner plan --mode infer`)")
    if args.html:
        d = Path(args.html).resolve().parent
        if not d.is_dir():
            raise UsageError(f"cannot write {args.html}: {d} does not exist")
    if args.json:
        print_json({"plan": _layout(plan), "estimate": dict(plan.estimate), "serving": dict(plan.serving or {})})
    else:
        print(text(plan), end="")
    if args.html:
        Path(args.html).write_text(html_report(plan, frontier_for(plan)))
        if not args.json:
            print(f"wrote {args.html}")
    return 0
