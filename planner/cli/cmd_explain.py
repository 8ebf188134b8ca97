"""``planner explain PLAN``: the breakdown in words, the runner-up, and what would change it."""
from __future__ import annotations

import argparse

HELP = "why this plan: where time and memory go, the runner-up, what would change the answer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="a plan file written by `planner plan --out`")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
    p.add_argument("--no-what-if", action="store_true", help="skip the what-if re-solves")
    p.add_argument("--max-time", type=float, default=30.0, help="time limit of each re-solve")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (the stable contract; scripts read this, not the text)")
    from planner.cli import failures
    failures.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.plan.errors import UsageError
    from planner.cli.explain import explain, explain_json, html_report, text
    from planner.plan.planfile import read_plan
    from planner.cli.report import print_json

    plan = read_plan(args.plan)
    from planner.cli.args import warn_drift as _warn_drift
    if plan.mode == "infer":            # serving plans: their own breakdown and the frontier
        from costmodel.batching import estimate_serving
        from planner.cli.infer_explain import run as run_infer
        if plan.estimate and "tpot_s" in plan.estimate:     # explained from the recomputed figures
            fresh = estimate_serving(plan.model, plan.cluster, plan.workload, plan.parallel,
                                     dict(plan.serving or {}), stages=plan.stages).to_dict()
            _warn_drift(plan, {k: fresh[k] for k in ("ttft_s", "tpot_s", "output_tokens_per_s_per_gpu")
                               if k in fresh}, args.plan)
            plan = plan.replace(estimate={**plan.estimate, **fresh})
        return run_infer(args, plan)
    from planner.cli.explain import plan_estimate
    _warn_drift(plan, {"step_time_s": plan_estimate(plan).step_time_s}, args.plan)
    if args.html:
        from profiles.safeio import check_output
        check_output(args.html, "--html")
        d = Path(args.html).resolve().parent
        if not d.is_dir():
            raise UsageError(f"cannot write {args.html}: {d} does not exist")
    from planner.cli import failures
    failures.node_mtbf_s(args, plan.cluster)          # bad failure flags: exit 2 before any solve
    info = explain(plan, what_if=not args.no_what_if, max_time=args.max_time)
    fail = failures.for_explain(args, plan, info)
    if args.json:
        print_json(dict(explain_json(plan, info), **({"failures": fail} if fail else {})))
    else:
        print(text(plan, info) + failures.text(fail), end="")
    if args.html:
        from profiles.safeio import write_text
        write_text(args.html, html_report(plan, info), "--html")
        if not args.json:
            print(f"wrote {args.html}")
    return 0
