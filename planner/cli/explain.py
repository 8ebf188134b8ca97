"""Why this plan: where time and memory go, the runner-up and what separates them, and what
would change the answer. The HTML report draws it with matplotlib (PNG, base64-embedded).
"""
from __future__ import annotations

import base64
import dataclasses
import html
from typing import Any

from costmodel.training import Estimate, estimate
from costmodel.units import GIB
from planner.plan.planfile import Plan
from planner.cli.report import describe_parallel

TIME_WORDS = {"compute_s": "compute", "recompute_s": "recomputation", "tp_comm_s": "tensor-parallel communication",
              "cp_comm_s": "context-parallel communication", "ep_comm_s": "expert all-to-all",
              "dp_comm_s": "exposed data-parallel communication", "pp_comm_s": "pipeline sends",
              "bubble_s": "the pipeline bubble", "optimizer_s": "the optimizer step"}


TOP_K = 5    # plans the report compares: the solver's best five (the runner-up is the best other one)


def plan_estimate(plan: Plan) -> Estimate:
    """The plan's estimate, priced with its target's framework profile."""
    from planner.search.target_space import framework_kwargs
    return estimate(plan.model, plan.cluster, plan.workload, plan.parallel, stages=plan.stages,
                    order=plan.mesh_order, **framework_kwargs(estimate, plan.target, plan.framework))


def _solve(plan: Plan, cluster=None, workload=None, top: int = 2, max_time: float = 30.0):
    """Re-solve the plan's problem for the plan's own target (the runner-up is one it runs too)."""
    from planner.search.bnb import solve
    c = cluster or plan.cluster
    return solve(plan.model, c, workload or plan.workload, {}, gpus=c.total_gpus, top=top, max_time_s=max_time,
                 target=plan.target or None)


def explain(plan: Plan, what_if: bool = True, max_time: float = 30.0) -> dict[str, Any]:
    """Everything the text and the HTML report show, as data."""
    est = plan_estimate(plan)
    out: dict[str, Any] = {"plan": describe_parallel(plan.parallel), "estimate": est}
    total = est.step_time_s
    terms = sorted(est.time.items(), key=lambda kv: -kv[1])
    out["time_words"] = [f"{TIME_WORDS[k]} {v / total * 100:.1f}%" for k, v in terms if v / total >= 0.005]
    mem = est.memory
    out["memory_words"] = [f"{k.removesuffix('_bytes')} {mem[k] / GIB:.1f} GiB" for k in
                           ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes")]
    res = _solve(plan, top=TOP_K, max_time=max_time)
    out["solver"] = res
    ranked = [s for s in res.solutions if not (s.par == plan.parallel and s.stages == plan.stages)]
    if ranked:
        ru = ranked[0]
        diff = {k: ru.estimate.time[k] - est.time[k] for k in est.time}
        big = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:3]
        out["runner_up"] = {"plan": describe_parallel(ru.par), "step_time_s": ru.estimate.step_time_s,
                            "slower_by": ru.estimate.step_time_s / total - 1, "estimate": ru.estimate,
                            "terms": [(TIME_WORDS[k], d) for k, d in big if abs(d) > 0]}
    if what_if:
        out["what_if"] = _what_if(plan, max_time)
    return out


def _what_if(plan: Plan, max_time: float) -> list[dict[str, Any]]:
    """Re-solve under one change at a time. Each label names everything the case changes: twice
    the GPUs keeps the global batch (the same job, faster or not), twice the sequence length keeps
    the number of sequences (so twice the tokens per step), the slower link keeps everything else."""
    rows = []
    c, wl = plan.cluster, plan.workload
    base_s = plan_estimate(plan).step_time_s
    cases = []
    if len(c.groups) == 1:
        cases.append((f"twice the GPUs ({plan.world_size * 2:,}), same global batch ({wl.global_batch:,})",
                      c.with_gpus(plan.world_size * 2), wl))
    if plan.model.max_seq_len >= wl.seq_len * 2 or plan.model.positions != "learned":
        cases.append((f"twice the sequence length ({wl.seq_len * 2:,} tokens), same {wl.global_batch:,} sequences "
                      "(twice the tokens per step)", c, dataclasses.replace(wl, seq_len=wl.seq_len * 2)))
    gbps = c.inter_node.bandwidth_bytes_per_s / 1e9
    slow = dataclasses.replace(c, inter_node=dataclasses.replace(
        c.inter_node, bandwidth_bytes_per_s=c.inter_node.bandwidth_bytes_per_s / 4))
    cases.append((f"a 4x slower inter-node link ({gbps / 4:.3g} instead of {gbps:.3g} GB/s per GPU)", slow, wl))
    for label, cl, w in cases:
        try:
            r = _solve(plan, cluster=cl, workload=w, top=1, max_time=max_time)
            s = r.solutions[0]
            same = (s.par.tp, s.par.pp, s.par.cp, s.par.ep) == (plan.parallel.tp, plan.parallel.pp, plan.parallel.cp,
                                                                plan.parallel.ep)
            rows.append({"case": label, "plan": describe_parallel(s.par), "same_shape": same,
                         "step_time_s": s.estimate.step_time_s, "mfu": s.estimate.mfu,
                         "step_time_ratio": s.estimate.step_time_s / base_s,
                         "tokens_per_s_per_gpu": s.estimate.tokens_per_s_per_gpu})
        except Exception as e:  # an infeasible what-if is an answer too
            rows.append({"case": label, "plan": f"no plan ({str(e).splitlines()[0][:120]})", "same_shape": False,
                         "step_time_s": None, "mfu": None, "step_time_ratio": None, "tokens_per_s_per_gpu": None})
    return rows


def text(plan: Plan, info: dict[str, Any]) -> str:
    from planner.cli.report import mfu_words, plain_credibility_lines
    est: Estimate = info["estimate"]
    cred = _credibility(plan, est)
    lines = [f"{plan.model.name} on {plan.world_size} x {plan.cluster.gpu.name}: {info['plan']}",
             f"step {est.step_time_s:.3f} s, {est.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
             f"{mfu_words(est.mfu, cred['mfu_causal'])}",
             *plain_credibility_lines(cred),
             "", "Where the time goes: " + ", ".join(info["time_words"]) + ".",
             f"Where the memory goes (peak stage, {est.peak_bytes / GIB:.1f} of {est.capacity_bytes / GIB:.1f} GiB): "
             + ", ".join(info["memory_words"]) + "."]
    if plan.parallel.pp > 1:
        lines.append("Stages: " + ", ".join(f"{s.num_layers} layers ({s.recompute_layers} recomputed)"
                                            + (f" on {s.group}" if s.group else "") for s in plan.stages))
    lay = plan.rank_layout()
    lines.append(f"Placement: mesh order {','.join(plan.mesh_order)}; inside one node: "
                 f"{', '.join(lay['within_node']) or 'nothing'}.")
    ru = info.get("runner_up")
    if ru:
        lines += ["", f"Runner-up: {ru['plan']}, {ru['slower_by'] * 100:+.2f}% step time. What separates them:"]
        for name, d in ru["terms"]:
            lines.append(f"  {name}: {d:+.3f} s in the runner-up")
    res = info["solver"]
    lines.append(f"Solver: {res.status} over {res.candidates} candidates.")
    if info.get("what_if"):
        lines += ["", "What would change the answer:"]
        for r in info["what_if"]:
            lines.append(f"  {r['case']}:")
            tail = ""
            if r["step_time_s"]:
                tail = (f" ({'same shape' if r['same_shape'] else 'a different shape'}); step {r['step_time_s']:.3f} s "
                        f"({(r['step_time_ratio'] - 1) * 100:+.1f}%), {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU")
            lines.append(f"    {r['plan']}{tail}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# HTML report
# --------------------------------------------------------------------------------------

def _label(par) -> str:
    """A plan's degrees on two lines, for figure axes."""
    return _wrap(describe_parallel(par))


def _wrap(d: str) -> str:
    """A plan's label on two lines (at " mb="), three when what tells it apart follows."""
    i = d.find(" mb=")
    d = d if i < 0 else d[:i] + "\n" + d[i + 1:]
    j = d.find(" recompute=")
    k = d.find(" ", j + 1) if j >= 0 else -1
    return d if k < 0 else d[:k] + "\n" + d[k + 1:]


def _figures(plan: Plan, info: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(title, caption, base64 PNG) per figure of the report."""
    from planner.cli.figures import png
    return [(t, c, base64.b64encode(png(f)).decode()) for t, c, f in figure_objects(plan, info)]


def figure_objects(plan: Plan, info: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(title, caption, matplotlib Figure) per figure; the drawing is in ``planner.cli.figures``."""
    from planner.cli import figures as F

    est: Estimate = info["estimate"]
    sols = info["solver"].solutions
    def same(s) -> bool:          # the plan itself: degrees, stages and mesh order
        return s.par == plan.parallel and s.stages == plan.stages and tuple(s.cand.order) == tuple(plan.mesh_order)

    chosen = [s for s in sols if same(s)]
    others = [s for s in sols if not same(s)]
    out = []
    where = plan.cluster.gpu.name if len(plan.cluster.groups) == 1 else f"{plan.cluster.name} (node groups)"
    fig = F.memory_figure(est, f"memory per GPU on each pipeline stage\n{plan.model.name} on {where}")
    out.append(("Memory per stage", "Each bar is one pipeline stage's GPU, by category; the dashed line is the "
                "GPU's usable memory.", fig))
    rows = [("this plan\n" + _label(plan.parallel), est)] + [(f"#{k}\n" + _label(s.par), s.estimate)
                                                          for k, s in enumerate(others[:TOP_K - 1], 2)]
    out.append(("Step time by term", "One bar per plan: the chosen plan on top, then the runners-up the solver "
                "found, each cut into the terms that add up to its step time.", F.time_figure(rows)))
    p = plan.parallel
    if p.pp > 1:
        shown = shown_microbatches(p.pp, p.vpp, p.grad_accum)
        out.append(("Pipeline schedule", "When each stage runs which micro-batch's forward and backward pass; "
                    "the gaps are the pipeline bubble."
                    + (f" Interleaved: each block is one of the {p.vpp} model chunks a stage holds." if p.vpp > 1
                       else ""),
                    F.timeline_figure(_timeline(plan, est), p.pp, shown, p.grad_accum, p.schedule, p.vpp)))
    from costmodel.uncertainty import relative_band
    from planner.cli.report import distinct_labels
    items = [(s.par, s.stages, tuple(s.cand.order), s.estimate, bool(chosen) and s is chosen[0]) for s in sols]
    if not chosen:
        items.append((plan.parallel, plan.stages, tuple(plan.mesh_order), est, True))
        items.sort(key=lambda r: r[3].step_time_s)
    labels = distinct_labels([(par, st, order) for par, st, order, _, _ in items])
    top = [(_wrap(("this plan: " if c else "") + lab), e, c) for lab, (_, _, _, e, c) in zip(labels, items)]
    band = relative_band("train-moe" if plan.model.is_moe else "train-dense")
    if len(top) > 1:
        out.append(("Top plans", "Step time of the best plans relative to the best one: how much choosing "
                    f"another would cost. Grey: the cost model's error band (\u00b1{band * 100:.0f}%, "
                    "costmodel/uncertainty_bands.yaml); plans inside it are ties.", F.topk_figure(top, band)))
    return out


def shown_microbatches(pp: int, vpp: int, grad_accum: int, max_mb: int = 8) -> int:
    """How many micro-batches the schedule figure draws: up to ``max_mb``; interleaved, a whole
    number of groups of ``pp`` (Megatron-LM's interleaved schedule runs micro-batches in groups of
    pp and needs their number to be a multiple of it)."""
    m = min(grad_accum, max_mb)
    if vpp > 1:
        m = min(grad_accum, max(pp, m // pp * pp))
    return m


def schedule_order(pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The order in which pipeline rank ``rank`` runs its passes: (``"f"`` or ``"b"``, micro-batch,
    model chunk). vpp = 1: 1F1B (min(pp - rank, m) forwards, then one backward and one forward in
    turn); vpp > 1: Megatron-LM's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``:
    (pp - rank - 1) x 2 + (vpp - 1) x pp warm-up forwards; micro-batches in groups of pp, forwards
    through the chunks in order, backwards in reverse)."""
    if vpp == 1:
        warm = min(pp - rank, m)
        seq = [("f", k, 0) for k in range(warm)]
        nf = warm
        for nb in range(m):
            seq.append(("b", nb, 0))
            if nf < m:
                seq.append(("f", nf, 0))
                nf += 1
        return seq
    total = m * vpp
    group = pp * vpp

    def virtual(i: int, forward: bool) -> tuple[int, int]:
        within = i % group
        chunk = within // pp
        return (i // group) * pp + within % pp, (chunk if forward else vpp - 1 - chunk)

    warm = total if m == pp else min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp)
    seq = [("f", *virtual(i, True)) for i in range(warm)]
    for i in range(total - warm):
        seq.append(("f", *virtual(warm + i, True)))
        seq.append(("b", *virtual(i, False)))
    seq += [("b", *virtual(i, False)) for i in range(total - warm, total)]
    return seq


def _timeline(plan: Plan, est: Estimate, max_mb: int = 8):
    """Forward/backward blocks (start, length, micro-batch) per pipeline rank for the first
    micro-batches of the plan's schedule (``schedule_order``): each rank runs its passes in that
    order as soon as the pass before it in the model (the previous virtual stage's forward, the
    next one's backward) is done. Interleaved, each block is one model chunk: 1/vpp of the
    stage's layers."""
    p, v = plan.parallel.pp, max(1, plan.parallel.vpp)
    m = shown_microbatches(p, v, plan.parallel.grad_accum, max_mb)
    t = [s.time_per_microbatch_s / v for s in est.stages]
    fwd = [x / 3 for x in t]
    bwd = [2 * x / 3 for x in t]
    V = p * v                                    # virtual stages: chunk c of rank r is stage c * p + r
    f_end: dict[tuple[int, int], float] = {}
    b_end: dict[tuple[int, int], float] = {}
    order = [schedule_order(p, v, m, r) for r in range(p)]
    free = [0.0] * p
    ptr = [0] * p
    intervals: list[tuple[list, list]] = [([], []) for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while ptr[r] < len(order[r]):
                kind, k, c = order[r][ptr[r]]
                j = c * p + r
                if kind == "f":
                    if j > 0 and (k, j - 1) not in f_end:
                        break
                    start = max(free[r], f_end.get((k, j - 1), 0.0))
                    f_end[(k, j)] = free[r] = start + fwd[r]
                    intervals[r][0].append((start, fwd[r], k))
                else:
                    dep = b_end.get((k, j + 1)) if j < V - 1 else f_end.get((k, j))
                    if dep is None or (k, j) not in f_end:
                        break
                    start = max(free[r], dep)
                    b_end[(k, j)] = free[r] = start + bwd[r]
                    intervals[r][1].append((start, bwd[r], k))
                ptr[r] += 1
                progress = True
    assert all(ptr[r] == len(order[r]) for r in range(p)), "the schedule deadlocked"
    return intervals


def html_report(plan: Plan, info: dict[str, Any]) -> str:
    figs = _figures(plan, info)
    body = [f"<h1>Plan: {html.escape(plan.model.name)} on {plan.world_size} x {html.escape(plan.cluster.gpu.name)}</h1>",
            f"<pre>{html.escape(text(plan, info))}</pre>"]
    for title, caption, png in figs:
        body.append(f"<h2>{html.escape(title)}</h2><p class='cap'>{html.escape(caption)}</p>"
                    f"<img alt='{html.escape(title)}' src='data:image/png;base64,{png}'/>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>planner explain</title>"
            "<style>body{font-family:sans-serif;max-width:62em;margin:2em auto;padding:0 1em}"
            "pre{background:#f6f6f6;padding:1em;white-space:pre-wrap}img{max-width:100%;height:auto}"
            ".cap{color:#555;margin:0.2em 0 0.5em}</style></head><body>" + "\n".join(body) + "</body></html>\n")


def _credibility(plan: Plan, est: Estimate) -> dict[str, Any]:
    from planner.cli.report import plan_credibility
    return plan_credibility(plan, est.step_time_s, est.mfu)


def explain_json(plan: Plan, info: dict[str, Any]) -> dict[str, Any]:
    est: Estimate = info["estimate"]
    d = {"plan": info["plan"], "estimate": est.to_dict(), "uncertainty": _credibility(plan, est),
         "time_words": info["time_words"],
         "memory_words": info["memory_words"], "solver_status": info["solver"].status}
    if info.get("runner_up"):
        ru = dict(info["runner_up"])
        ru["estimate"] = ru["estimate"].to_dict(stages=False)
        d["runner_up"] = ru
    d["what_if"] = info.get("what_if", [])
    return d


def pareto_figure(pareto: dict[str, Any]) -> tuple[str, str]:
    """(title, base64 PNG text) of the serving frontier (``planner plan --mode infer --pareto``): output tokens/s per GPU against
    tokens/s per user, aggregated and disaggregated points, the chosen plan marked, the TPOT goal
    as a vertical line (plans right of it meet it); below, each point's TTFT with the TTFT goal."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    pts, chosen, slo = pareto.get("points") or [], pareto.get("chosen") or {}, pareto.get("slo") or {}
    fig = Figure(figsize=(7, 6))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for kind, marker in (("aggregated", "o"), ("disaggregated", "s")):
        sel = [q for q in pts if q["kind"] == kind]
        if sel:
            xs = [q["tokens_per_s_per_user"] for q in sel]
            top.scatter(xs, [q["output_tokens_per_s_per_gpu"] for q in sel], marker=marker, s=18, label=kind)
            bottom.scatter(xs, [q["ttft_s"] * 1e3 for q in sel], marker=marker, s=12)
    if pts:
        top.plot([q["tokens_per_s_per_user"] for q in pts], [q["output_tokens_per_s_per_gpu"] for q in pts], "k-",
                 lw=0.8, label="frontier")
    if chosen:
        top.scatter([chosen["tokens_per_s_per_user"]], [chosen["output_tokens_per_s_per_gpu"]], marker="*", s=160,
                    c="red", zorder=5, label=f"chosen: {chosen.get('layout', '')}")
        bottom.scatter([chosen["tokens_per_s_per_user"]], [chosen["ttft_s"] * 1e3], marker="*", s=120, c="red",
                       zorder=5)
    goal = pareto.get("goal") or slo          # the user's goals; ``slo``: what the search was held to
    if goal.get("tpot_s"):
        for ax in (top, bottom):
            ax.axvline(1.0 / goal["tpot_s"], color="tab:red", ls="--", lw=1)
        top.annotate(f"TPOT goal {goal['tpot_s'] * 1e3:.3g} ms", (1.0 / goal["tpot_s"], top.get_ylim()[1]),
                     fontsize=7, color="tab:red", va="top")
    if goal.get("ttft_s"):
        bottom.axhline(goal["ttft_s"] * 1e3, color="tab:red", ls="--", lw=1)
        bottom.annotate(f"TTFT goal {goal['ttft_s'] * 1e3:.3g} ms", (bottom.get_xlim()[0], goal["ttft_s"] * 1e3),
                        fontsize=7, color="tab:red", va="bottom")
    if pareto.get("goal"):                    # the margin: where the search held the predictions
        if slo.get("tpot_s") and slo["tpot_s"] != goal.get("tpot_s"):
            for ax in (top, bottom):
                ax.axvline(1.0 / slo["tpot_s"], color="tab:red", ls=":", lw=1)
        if slo.get("ttft_s") and slo["ttft_s"] != goal.get("ttft_s"):
            bottom.axhline(slo["ttft_s"] * 1e3, color="tab:red", ls=":", lw=1)
            bottom.annotate("less the margin (dotted)", (bottom.get_xlim()[0], slo["ttft_s"] * 1e3), fontsize=7,
                            color="tab:red", va="top")
    top.set_ylabel("output tokens/s per GPU")
    top.set_title("serving frontier over concurrency and layouts")
    top.legend(fontsize=7)
    bottom.set_xlabel("tokens/s per user (1 / TPOT)")
    bottom.set_ylabel("TTFT (ms)")
    from planner.cli.figures import png
    return "Serving frontier", base64.b64encode(png(fig)).decode("ascii")


__all__ = ["explain", "text", "html_report", "explain_json", "plan_estimate", "pareto_figure"]
