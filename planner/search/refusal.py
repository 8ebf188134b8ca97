"""Why a target has no plan: the capability problems of the configurations asked for, so that a
refusal names the binding reason of the layout the user fixed, not the reasons of others."""
from __future__ import annotations

from costmodel.specs import ModelSpec, Workload
from planner.plan import targets as T
from planner.search.space import enumerate_candidates


def why_no_candidate(model: ModelSpec, cluster, workload: Workload, gpus: int, target: str) -> str:
    """Why target ``target`` runs none of the configurations the cost model knows: the problems
    every one of them has (``MLA``, a dtype), else the most frequent ones."""
    from collections import Counter
    cands = enumerate_candidates(model, cluster, workload, {}, gpus)
    if not cands:
        return (f"no legal configuration of {model.name} on {gpus} GPUs with batch {workload.global_batch}: "
                "check that the global batch is divisible by a data-parallel degree")
    seen: Counter = Counter()
    for c in cands:
        seen.update(dict.fromkeys(T.config_problems(target, model, workload, c.par, c.order), 1))
    common = [m for m, k in seen.most_common() if k == len(cands)]
    shown = common or [m for m, _ in seen.most_common(3)]
    return (f"{target} runs none of the {len(cands)} configurations of {model.name} on {gpus} GPUs: "
            + "; ".join(shown))
