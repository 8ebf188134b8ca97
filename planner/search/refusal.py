"""Why a target has no plan: the capability problems of the configurations asked for, so that a
refusal names the binding reason of the layout the user fixed, not the reasons of others."""
from __future__ import annotations

from costmodel.specs import ModelSpec, Workload
from planner.plan import targets as T
from planner.search.space import candidate_kinds


def why_no_candidate(model: ModelSpec, cluster, workload: Workload, gpus: int, target: str,
                     fixed: dict | None = None) -> str:
    """Why target ``target`` runs none of the configurations the cost model knows with the
    degrees the user fixed (``fixed``): the problems every one of them has, else the most
    frequent ones. With the layout fixed, only that layout's configurations are asked, so the
    reasons are that layout's, not another's."""
    from collections import Counter
    fixed = dict(fixed or {})
    space = _generic_space(model, cluster, workload, fixed, gpus)
    if not space.count:
        return (f"no legal configuration of {model.name} on {gpus} GPUs with batch {workload.global_batch}"
                + (f" and {_fixed_text(fixed)}" if fixed else "")
                + ": check that the global batch is divisible by a data-parallel degree")
    what = f" with {_fixed_text(fixed)}" if fixed else ""
    always = T.model_problems(target, model, workload)
    if always:                  # no configuration avoids these: no need to ask each one (nor write them out)
        return (f"{target} runs none of the {space.count} configurations of {model.name} on {gpus} GPUs{what}: "
                + "; ".join(always))
    cands = space.candidates()
    seen: Counter = Counter()
    for c in cands:
        seen.update(dict.fromkeys(_least_problems(target, model, workload, c, fixed), 1))
    common = [m for m, k in seen.most_common() if k == len(cands)]
    shown = common or [m for m, _ in seen.most_common(3)]
    return (f"{target} runs none of the {len(cands)} configurations of {model.name} on {gpus} GPUs{what}: "
            + "; ".join(shown))


_LAST: list = []        # (key, _Space): the last generic space asked (``--target all`` asks it per refusing target)


class _Space:
    """The generic space's configurations (``candidate_kinds``): counted, written out on demand."""

    def __init__(self, model, cluster, workload: Workload, fixed: dict, gpus: int):
        self.kinds, self.count = candidate_kinds(model, cluster, workload, fixed, gpus)
        self._cands: list | None = None

    def candidates(self) -> list:
        if self._cands is None:
            self._cands = [c for k in self.kinds for c in k.write_out()]
        return self._cands


def _generic_space(model: ModelSpec, cluster, workload: Workload, fixed: dict, gpus: int) -> _Space:
    """The generic space, the last one kept: the targets that refuse a model outright each count
    the same configurations."""
    try:
        key = (model, cluster, workload, tuple(sorted(fixed.items())), gpus)
        hash(key)
    except TypeError:
        return _Space(model, cluster, workload, fixed, gpus)
    if _LAST and _LAST[0][0] == key:
        return _LAST[0][1]
    got = _Space(model, cluster, workload, fixed, gpus)
    _LAST[:] = [(key, got)]
    return got


def _fixed_text(fixed: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(fixed.items()))


def _least_problems(target: str, model: ModelSpec, workload: Workload, c, fixed: dict) -> list[str]:
    """The problems of the generic candidate ``c`` that the target's own choices (ZeRO, sequence
    parallel, schedule: ``target_space``) cannot avoid: those of its best variant."""
    import dataclasses
    import itertools

    from planner.search import target_space as ts
    par = c.par
    zeros = [par.zero] if "zero" in fixed else ts.zero_choices(target, par.dp, par.cp)
    sps = [par.sp] if "sp" in fixed else ts.sp_choices(target, par.tp)
    scheds = [par.schedule] if "schedule" in fixed else ts.schedule_choices(target, par.pp, par.vpp)
    best = None
    for z, sp, sch in itertools.product(zeros, sps, scheds):
        try:
            v = dataclasses.replace(par, zero=z, sp=sp, schedule=sch)
        except ValueError:
            continue
        got = T.config_problems(target, model, workload, v, c.order)
        if best is None or len(got) < len(best):
            best = got
    return best if best is not None else T.config_problems(target, model, workload, par, c.order)
