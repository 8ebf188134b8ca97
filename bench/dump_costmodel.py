"""Dump the cost model's numbers over a fixed set of configurations, and compare two dumps.

    python bench/dump_costmodel.py dump OUT.json        # every value, keyed by configuration
    python bench/dump_costmodel.py diff BEFORE.json AFTER.json [--rel 1e-12]

What is dumped (deterministic, about 8,000 configurations):

* training ``estimate`` of every legal outer configuration the search space lists for seven
  problems (dense and MoE, 8 to 2,048 GPUs, a mixed H100/A100 cluster, the CPU cluster), thinned
  to at most 1,200 per problem: each time term, memory category, per-stage rows, MFU/HFU;
* the same configurations with an uneven stage split and one fully recomputed layer on the
  first stage (where pp > 1);
* the solver's per-candidate stage tables (time, exposed DP, optimizer, memory, least recompute)
  and its lower bounds for every 25th candidate;
* serving ``estimate_inference`` over tp x pp x batch x KV dtype for four models.

A refactoring of the cost model must leave every value unchanged except where a copy of a rule
was wrong; ``diff`` lists what changed, grouped by the quantity, with the largest relative change
and the configurations it happened in.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")

from costmodel.catalog import get_model  # noqa: E402
from costmodel.inference import estimate_inference  # noqa: E402
from costmodel.specs import ParallelConfig, SpecError, StageSpec, Workload  # noqa: E402
from costmodel.training import estimate  # noqa: E402
from costmodel.files.clusters import load_cluster  # noqa: E402

try:                                       # the search package (issue 11's layout)
    from planner.search import bounds as _bounds  # noqa: E402
    from planner.search.problem import Problem  # noqa: E402
    from planner.search.space import enumerate_candidates  # noqa: E402

    def _lower_bound(prob, cand):
        return _bounds.lower_bound(prob, cand)

    def _strong_bound(prob, cand, lb):
        return _bounds.strong_bound(prob, cand, lb, makespan=True)
except ImportError:                        # the layout before it, to dump the baseline
    from planner.solver import Problem  # noqa: E402
    from planner.space import enumerate_candidates  # noqa: E402

    def _lower_bound(prob, cand):
        return prob.lower_bound(cand)

    def _strong_bound(prob, cand, lb):
        return prob.strong_bound(cand, lb, makespan=True)

# (model, cluster, gpus, global batch, sequence length)
TRAIN = [
    ("llama-3-8b", "dgx-h100", 8, 64, 8192),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192),
    ("llama-3-70b", "plans/clusters/mixed-h100-a100.yaml", None, 512, 4096),
    ("mixtral-8x7b", "dgx-h100", 32, 256, 4096),
    ("deepseek-v3", "dgx-h100", 256, 1024, 4096),
    ("llama-3.1-405b", "dgx-a100-80gb", 512, 1024, 4096),
    ("tiny-llama", "cpu", 4, 8, 128),
]
PER_PROBLEM = 1200
TABLE_EVERY = 25
SERVE = [("llama-3-8b", "dgx-h100", 8), ("llama-3-70b", "dgx-h100", 8), ("mixtral-8x7b", "dgx-h100", 8),
         ("deepseek-v3", "dgx-h200", 8)]


def _flat(prefix: str, obj, out: dict) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}", v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flat(f"{prefix}[{i}]", v, out)
    elif isinstance(obj, bool) or obj is None:
        out[prefix] = obj
    elif isinstance(obj, (int, float)):
        out[prefix] = float(obj)


def _key(par: ParallelConfig, order) -> str:
    f = ("tp", "pp", "dp", "cp", "ep", "zero", "dp_shard", "sp", "vpp", "micro_batch", "grad_accum",
         "recompute", "recompute_layers", "schedule")
    return ",".join(f"{k}={getattr(par, k)}" for k in f) + ",order=" + "-".join(order)


def _uneven(L: int, p: int) -> tuple[StageSpec, ...] | None:
    base = [L // p + (1 if i < L % p else 0) for i in range(p)]
    if p < 2 or base[-1] < 3:
        return None
    base[0] += 1
    base[-1] -= 1
    out, first = [], 0
    for i, n in enumerate(base):
        out.append(StageSpec(first_layer=first, num_layers=n, recompute_layers=1 if i == 0 else 0))
        first += n
    return tuple(out)


def dump() -> dict:
    out: dict = {}
    for name, cname, gpus, gb, seq in TRAIN:
        model = get_model(name)
        cluster = load_cluster(cname)
        if gpus:
            cluster = cluster.with_gpus(gpus) if gpus != cluster.total_gpus else cluster
        wl = Workload(global_batch=gb, seq_len=seq)
        cands = enumerate_candidates(model, cluster, wl, {}, cluster.total_gpus)
        step = max(1, math.ceil(len(cands) / PER_PROBLEM))
        prob = Problem(model, cluster, wl)
        for j, cand in enumerate(cands[::step]):
            used = cluster if cand.world == cluster.total_gpus else cluster.with_gpus(cand.world)
            tag = f"{name}@{os.path.basename(cname)}x{cluster.total_gpus}|{_key(cand.par, cand.order)}"
            try:
                est = estimate(model, used, wl, cand.par, order=cand.order)
                _flat(tag + "|even", est.to_dict(), out)
            except SpecError as e:
                out[tag + "|even.error"] = str(e)
            un = _uneven(model.layers, cand.par.pp)
            if un is not None and len(cluster.groups) == 1:
                par = dataclasses.replace(cand.par, recompute="selective" if cand.par.recompute == "full"
                                          else cand.par.recompute)
                try:
                    _flat(tag + "|uneven", estimate(model, used, wl, par, stages=un, order=cand.order).to_dict(), out)
                except SpecError as e:
                    out[tag + "|uneven.error"] = str(e)
            if j % TABLE_EVERY == 0:
                lb = _lower_bound(prob, cand)
                out[tag + "|lower_bound"] = lb
                if lb < math.inf:
                    out[tag + "|strong_bound"] = _strong_bound(prob, cand, lb)
                    tab = prob.tables(cand)
                    for field in ("t", "e", "o", "mem", "r"):
                        for (i, g, bk), lst in sorted(getattr(tab, field).items()):
                            where = f"{i}.{g}" + (f".b{bk}" if bk else "")     # first-layer bucket (StageTables)
                            _flat(f"{tag}|table.{field}.{where}", [v for v in lst], out)
    for name, cname, gpus in SERVE:
        model = get_model(name)
        cluster = load_cluster(cname).with_gpus(gpus)
        for tp in (1, 2, 4, 8):
            for pp in (1, 2):
                if tp * pp > gpus:
                    continue
                for batch in (1, 16, 64):
                    for kv in ("", "fp8"):
                        wl = Workload(mode="infer", global_batch=batch, prompt_len=1024, output_len=256, seq_len=1280,
                                      kv_dtype=kv)
                        par = ParallelConfig(tp=tp, pp=pp, dp=gpus // (tp * pp))
                        tag = f"serve:{name}|tp={tp},pp={pp},batch={batch},kv={kv or 'w'}"
                        try:
                            _flat(tag, estimate_inference(model, cluster, wl, par).to_dict(), out)
                        except SpecError as e:
                            out[tag + ".error"] = str(e)
    return out


def diff(before: dict, after: dict, rel: float) -> int:
    changed: dict[str, list] = defaultdict(list)
    only = sorted(set(before) ^ set(after))
    for k in sorted(set(before) & set(after)):
        a, b = before[k], after[k]
        if a == b:
            continue
        if isinstance(a, float) and isinstance(b, float):
            if math.isinf(a) and math.isinf(b):
                continue
            d = abs(b - a) / max(abs(a), abs(b), 1e-300)
            if d <= rel:
                continue
        else:
            d = math.inf
        # the quantity: the last part of the key, list indices dropped (stage rows, table entries)
        quantity = re.sub(r"\[\d+\]", "[]", k.split("|")[-1])
        if k.startswith("serve:"):
            quantity = "serve." + k.split("|")[-1].split(".", 1)[-1]
        changed[quantity].append((d, k, a, b))
    n = sum(len(v) for v in changed.values())
    print(f"{len(before)} values before, {len(after)} after; {n} changed beyond {rel:g}; "
          f"{len(only)} present on one side only")
    for k in only[:20]:
        print(f"  only {'before' if k in before else 'after'}: {k}")
    for q, rows in sorted(changed.items(), key=lambda kv: -len(kv[1])):
        rows.sort(reverse=True)
        d, k, a, b = rows[0]
        print(f"- {q}: {len(rows)} values, largest relative change {d:.3g} ({a!r} -> {b!r})\n    at {k}")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    c = sub.add_parser("diff")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--rel", type=float, default=1e-12)
    a = ap.parse_args(argv)
    if a.cmd == "dump":
        out = dump()
        configs = len({k.split("|")[0] + "|" + k.split("|")[1] if "|" in k else k.split(".")[0] for k in out})
        with open(a.out, "w") as f:
            json.dump(out, f, sort_keys=True)
        print(f"{len(out)} values over {configs} configurations -> {a.out}", file=sys.stderr)
        return 0
    with open(a.before) as f:
        before = json.load(f)
    with open(a.after) as f:
        after = json.load(f)
    diff(before, after, a.rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
