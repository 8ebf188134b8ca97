"""Serving plans solved by the search, for the emitters' golden files and round trips
(``planner.cli.regen_golden``): the issue's example, llama-3.1-70b on 8 H100 with prompts of
1,000 and outputs of 200 tokens under TTFT <= 400 ms and TPOT <= 30 ms, as the best aggregated
plan and as the best disaggregated one; and a MoE plan with wide expert parallelism and
data-parallel attention (mixtral-8x7b over 8 H100, ep = 8 over tp1 replicas)."""
from __future__ import annotations

import argparse

from planner.plan.planfile import Plan

CASES = {
    "llama-3.1-70b-serve-agg-h100x8": ["--model", "llama-3.1-70b", "--gpus", "8", "--prompt-len", "1000",
                                       "--output-len", "200", "--ttft-slo-ms", "400", "--tpot-slo-ms", "30",
                                       "--disaggregation", "off"],
    "llama-3.1-70b-serve-pd-h100x8": ["--model", "llama-3.1-70b", "--gpus", "8", "--prompt-len", "1000",
                                      "--output-len", "200", "--ttft-slo-ms", "400", "--tpot-slo-ms", "30",
                                      "--disaggregation", "only"],
    "mixtral-8x7b-serve-wide-ep-h100x8": ["--model", "mixtral-8x7b", "--gpus", "8", "--prompt-len", "2000",
                                          "--output-len", "500", "--tp", "1", "--ep", "8", "--disaggregation",
                                          "off"],
}


def solved_plan(argv: list[str]) -> Plan:
    """The best plan of ``planner plan --mode infer --cluster dgx-h100 <argv>``, built in process."""
    from planner.cli import cmd_plan, infer_plan
    from planner.search.serving import solve_serving
    p = argparse.ArgumentParser()
    cmd_plan.add_arguments(p)
    args = p.parse_args(["--mode", "infer", "--cluster", "dgx-h100", *argv])
    infer_plan._check_usage(args)
    engine, batching = infer_plan.engine_and_batching(args)
    model, cluster, wl = infer_plan.load_serving_problem(args)
    sched = infer_plan.scheduler_for(args, engine, cluster) if batching == "inflight" else None
    slo_t = args.ttft_slo_ms / 1e3 if args.ttft_slo_ms else None
    slo_p = args.tpot_slo_ms / 1e3 if args.tpot_slo_ms else None
    res = solve_serving(model, cluster, wl, infer_plan._fixed(args), ttft_slo_s=slo_t, tpot_slo_s=slo_p, sched=sched,
                        disaggregation=args.disaggregation, exhaustive=True)
    c = res.solutions[0]
    serving = infer_plan.serving_section(c, engine, batching, sched, infer_plan.hf_id_for(args, model),
                                         {"ttft_ms": args.ttft_slo_ms, "tpot_ms": args.tpot_slo_ms},
                                         {"concurrency_per_replica": None, "request_rate_per_s": None})
    plan = infer_plan.make_plan(model, cluster, wl, c, {"status": res.status}, "catalog", serving=serving)
    return plan.replace(provenance={})


def serving_plans() -> dict[str, Plan]:
    return {name: solved_plan(argv) for name, argv in CASES.items()}
