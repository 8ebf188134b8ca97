"""Dump (or compare) the full training estimates of many configurations, every float exact.

    python bench/check_identity.py --write out.pkl [--limit N]
    python bench/check_identity.py --compare base.pkl new.pkl

For a speed change to the cost model's caches (``costmodel.stage_cache``): run ``--write`` on the
commit before and after the change (same interpreter, same order) and ``--compare`` the two
files; every configuration's ``Estimate.to_dict()`` (its stages included) must be the same,
``repr`` of every float equal. The configurations are the candidate configurations
(``planner.search.space.enumerate_candidates``) of several models, clusters and execution
targets, each priced under its target's framework profile and under variants a search tries
(full recompute with per-stage counts, GPipe, no overlap, ZeRO 0, explicit uneven splits), in
one process and in a fixed order, so that later estimates are served from the caches earlier
ones filled, as in a search; the stage-cost caches are cleared between problems, and once in a
while in between, so that cold and warm answers are both compared.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pickle
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from costmodel import stage_cache  # noqa: E402
from costmodel.catalog import get_model  # noqa: E402
from costmodel.files.clusters import load_cluster  # noqa: E402
from costmodel.specs import SpecError, StageSpec, Workload, default_stages  # noqa: E402
from costmodel.training import estimate  # noqa: E402
from planner.plan import targets as T  # noqa: E402
from planner.search.space import enumerate_candidates  # noqa: E402

PROBLEMS = [
    ("llama-3-8b", "dgx-h100", 8, dict(global_batch=64, seq_len=8192)),
    ("llama-3-8b", "dgx-h100", 64, dict(global_batch=256, seq_len=4096, dtype="fp8")),
    ("llama-3-70b", "dgx-h100", 64, dict(global_batch=512, seq_len=8192)),
    ("llama-3.1-405b", "dgx-h100", 16384, dict(global_batch=2048, seq_len=8192)),
    ("mixtral-8x7b", "dgx-h100", 32, dict(global_batch=256, seq_len=4096)),
    ("deepseek-v3", "dgx-h100", 2048, dict(global_batch=4096, seq_len=4096)),
    ("gpt3-175b", "dgx-a100-80gb", 1024, dict(global_batch=1536, seq_len=2048, dtype="fp16",
                                              attention_kernel="materialized")),
    ("llama-2-7b", "plans/clusters/mixed-h100-a100.yaml", 96, dict(global_batch=192, seq_len=4096)),
    ("tiny-moe", "profiles/measured/cpu-2x2-netns.yaml", 4, dict(global_batch=16, seq_len=256)),
    ("tiny-gpt", "cpu", 4, dict(global_batch=8, seq_len=512, optimizer="sgd", dtype="fp32")),
]


def _targets() -> list[str | None]:
    return [None] + [t for t in T.planning_targets("train")]


def _variants(rng: random.Random, cand, model, cluster):
    """The candidate as enumerated, then one variant a search might try (or an explicit split)."""
    par = cand.par
    yield par, None
    pick = rng.random()
    if pick < 0.25:
        par = dataclasses.replace(par, recompute="full", recompute_layers=rng.choice([-1, 0, 1, 3]))
    elif pick < 0.4 and par.vpp == 1 and par.pp > 1:
        par = dataclasses.replace(par, schedule="gpipe")
    elif pick < 0.55:
        par = dataclasses.replace(par, overlap_dp_comm=False, zero=0, dp_shard=0)
    elif pick < 0.7:
        par = dataclasses.replace(par, recompute=rng.choice(["none", "selective", "full"]),
                                  zero=rng.choice([0, 1, 2, 3]), dp_shard=0)
    stages = None
    if len(cluster.groups) > 1 or rng.random() < 0.2:
        ns = [s.num_layers for s in default_stages(model.layers, par.pp)]
        if par.pp > 1:
            i, j = rng.sample(range(par.pp), 2)
            if ns[i] > max(1, par.vpp):
                ns[i] -= 1
                ns[j] += 1
        groups = [g for g, c in cand.stage_counts for _ in range(c)]
        use_groups = len(cluster.groups) > 1 and rng.random() < 0.8
        first, st = 0, []
        for i, n in enumerate(ns):
            st.append(StageSpec(first_layer=first, num_layers=n, recompute_layers=rng.choice([0, 1, n]),
                                group=groups[i] if use_groups and i < len(groups) else ""))
            first += n
        stages = tuple(st)
    yield par, stages


def run(limit: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, cluster_name, gpus, wl in PROBLEMS:
        model = get_model(name)
        cluster = load_cluster(cluster_name)
        if len(cluster.groups) == 1:
            cluster = cluster.with_gpus(gpus)
        workload = Workload(**wl)
        for target in _targets():
            stage_cache.clear_stage_costs()
            fw = T.framework_of(target or T.GENERIC)
            try:
                cands = enumerate_candidates(model, cluster, workload, {}, cluster.total_gpus, target=target)
            except Exception as e:          # a target that runs nothing of this problem
                out.append((f"{name} {target} enumerate", f"error {type(e).__name__}"))
                continue
            rng = random.Random(f"{name} {target}")
            if len(cands) > limit:
                cands = rng.sample(cands, limit)
            for k, cand in enumerate(cands):
                if k % 97 == 96:
                    stage_cache.clear_stage_costs()
                for par, stages in _variants(rng, cand, model, cluster):
                    key = f"{name} {cluster_name} {target} {fw} {par} {cand.order} {stages}"
                    try:
                        est = estimate(model, cluster, workload, par, stages=stages, order=cand.order,
                                       framework=fw)
                        # the summary first (what a search reads before the rows), then the rows
                        d = est.to_dict(stages=False)
                        d["stages"] = [s.to_dict() for s in est.stages]
                        val = repr(d)
                    except SpecError as e:
                        val = f"SpecError {e}"
                    out.append((key, val))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", help="pickle the outputs to this file")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two pickles")
    ap.add_argument("--limit", type=int, default=2500, help="candidates per (problem, target) at most")
    args = ap.parse_args()
    if args.compare:
        a, b = (pickle.load(open(p, "rb")) for p in args.compare)
        assert len(a) == len(b), (len(a), len(b))
        bad = [(x, y) for x, y in zip(a, b) if x != y]
        errors = sum(v.startswith("SpecError") for _, v in a)
        print(f"{len(a)} configurations ({len(a) - errors} estimates, {errors} refused), {len(bad)} differ")
        for x, y in bad[:5]:
            print("A:", x)
            print("B:", y)
        sys.exit(1 if bad else 0)
    t0 = time.perf_counter()
    out = run(args.limit)
    digest = hashlib.sha256(repr(out).encode()).hexdigest()[:16]
    print(f"{len(out)} configurations in {time.perf_counter() - t0:.1f}s, digest {digest}")
    if args.write:
        with open(args.write, "wb") as f:
            pickle.dump(out, f)


if __name__ == "__main__":
    main()
