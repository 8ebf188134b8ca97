"""`planner replan` time for lost and added nodes on 64- and 1,024-GPU clusters, on this machine.

    python bench/bench_replan.py [--repeat 3] [--cases 64,1024]

For each cluster it solves the old plan once (not timed), then times ``planner.search.replan.replan``
in process (the command adds its start-up, about 0.5 s of imports) for each change. CPU time
is the figure to trust on a shared machine. Columns: the chosen plan, whether it kept the
checkpoint's layout, and how many world sizes were solved or pruned by bounds.
"""
from __future__ import annotations

import argparse
import time

CASES = {
    "64": ("llama-3-70b", "dgx-h100", 64, 512, 8192, [("lose 1 node", -1), ("lose 2 nodes", -2),
                                                      ("add 1 node", 1), ("half (--gpus 32)", "32")]),
    "1024": ("llama-3-70b", "dgx-h100", 1024, 1024, 8192, [("lose 1 node", -1), ("lose 4 nodes", -4),
                                                           ("lose 16 nodes", -16), ("half (--gpus 512)", "512")]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="64,1024")
    args = ap.parse_args()
    from costmodel.specs import Workload
    from planner.plan.inputs import load_cluster_sized, load_model
    from planner.search.replan import changed_cluster, replan
    from planner.cli.result import plans_from_result
    from planner.search.bnb import solve

    print("| old plan | change | wall s (best) | CPU s (best) | new plan | GPUs used | step s old -> new | "
          "kept layout | world sizes solved / pruned |")
    print("|---|---|---:|---:|---|---:|---|---|---|")
    for key in args.cases.split(","):
        model_name, cluster_name, gpus, gb, seq, changes = CASES[key]
        model = load_model(model_name)
        cluster = load_cluster_sized(cluster_name, gpus)
        wl = Workload(global_batch=gb, seq_len=seq)
        res = solve(model, cluster, wl, {}, gpus=gpus)
        old = plans_from_result(res, model, cluster, wl)[0]
        p0 = old.parallel
        name = f"{model_name} on {gpus} ({p0.tp}/{p0.pp}/{p0.dp}/{p0.cp} tp/pp/dp/cp)"
        for label, change in changes:
            if isinstance(change, str):
                new_cluster = changed_cluster(cluster, gpus=int(change))
            elif change < 0:
                new_cluster = changed_cluster(cluster, lose_nodes=-change)
            else:
                new_cluster = changed_cluster(cluster, add_nodes=change)
            best_wall = best_cpu = float("inf")
            rp = None
            for _ in range(args.repeat):
                c0, t0 = time.process_time(), time.perf_counter()
                rp = replan(old, new_cluster)
                best_wall = min(best_wall, time.perf_counter() - t0)
                best_cpu = min(best_cpu, time.process_time() - c0)
            p = rp.solution.par
            print(f"| {name} | {label} | {best_wall:.2f} | {best_cpu:.2f} | tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} "
                  f"zero{p.zero} | {p.world_size} | {rp.old_step_time_s:.2f} -> {rp.solution.objective:.2f} | "
                  f"{rp.chosen == 'compatible'} | {rp.worlds_solved} / {rp.worlds_pruned} |", flush=True)


if __name__ == "__main__":
    main()
