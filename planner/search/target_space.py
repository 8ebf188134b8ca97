"""The search space of one execution target: which candidates a target can run, and what its
table does to the stage split.

``space.enumerate_candidates(..., target=T)`` asks this module for the choices a target widens
(ZeRO-0 where ZeRO-1 is not what runs, sequence parallel off where the target has none, GPipe
where torch's 1F1B needs more micro-batches than there are, whole-model full recompute and
Megatron's uniform ``--recompute-num-layers N`` where a stage cannot pick its own count) and
keeps only those ``planner.plan.targets.config_problems`` accepts. Each candidate carries its
target's split rule (``Candidate.split``, ``stage_recompute``, ``least_layers``), which the
stage tables, the CP-SAT model and the brute force obey. Of two candidates that differ only in
a choice the cost model prices identically or worse (ZeRO-0 against ZeRO-1, plain TP against
sequence parallel, GPipe against 1F1B), the dominated one is dropped, as the space does for the
generic target.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import operator

from costmodel.moe import dispatcher_fabric_problem, multi_node_nvlink
from costmodel.specs import ModelSpec, ParallelConfig, Workload
from planner.plan import targets as T


def widened(target: str | None) -> bool:
    return bool(target) and target != T.GENERIC


def zero_choices(target: str, dp: int, cp: int, pp: int = 1) -> list[int]:
    """ZeRO stages to try: with data or context parallelism, those the target's table runs at this
    pp (any of its variants'; the table still checks each configuration), else 1 (nothing to shard)."""
    if dp * cp <= 1:
        return [1]
    t = T.get(target)
    allowed: set[int] = set()
    for sub in [s for _, _, s in t.variants] or [t]:
        allowed |= sub.zero_pp if pp > 1 else sub.zero
    return [z for z in (0, 1, 2, 3) if z in allowed]


def folds_experts(target: str | None) -> bool:
    """Whether the target runs MoE parallel folding (``TrainTarget.expert_fold``: expert TP apart
    from TP, EP over tp x cp x dp), so the search offers it."""
    return widened(target) and T.get(target).expert_fold


def ep_ok(target: str, tp: int, ep: int, etp: int | None = None) -> bool:
    """Whether the target may run expert parallel ``ep`` next to tensor parallel ``tp`` at all, with
    expert TP ``etp`` (default ``tp``): experts split over TP (``TrainTarget.expert_tp``), or folded
    (``etp != tp``) where the target folds (``TrainTarget.expert_fold``; its table checks which etp)."""
    if ep == 1:
        return True
    t = T.get(target)
    folded = etp is not None and etp != tp
    return any(sub.ep and (tp == 1 or sub.expert_tp or (folded and sub.expert_fold))
               for sub in [s for _, _, s in t.variants] or [t])


def moe_exec_choices(target: str, model: ModelSpec, par: ParallelConfig, gpn: int, fixed: dict,
                     rdma: bool = True, host: int = 0) -> list[tuple[str, bool]]:
    """(dispatcher, EP overlap) pairs to try for ``par`` (``ParallelConfig.moe_dispatcher`` /
    ``ep_overlap``): the plan's defaults only, unless the target's file can set them
    (``TrainTarget.moe_dispatchers`` / ``ep_overlap``) for an MoE model with expert parallelism.
    DeepEP is offered only where the EP group spans more than one NVLink domain (``gpn`` GPUs):
    inside one, Megatron's maintainers recommend the alltoall dispatcher (Megatron-LM#1456); and
    only over an RDMA fabric (``rdma``: ``costmodel.moe.deepep_fabric_problem`` of the cluster's
    inter-node link), and not where the NVLink domain spans several hosts of ``host`` GPUs (GB200
    NVL72): Megatron-Core 0.16 runs multi-node NVLink with HybridEP only
    (``TransformerConfig.moe_flex_dispatcher_backend``). There HybridEP is offered once the EP
    group leaves one host (NVIDIA's GB200 recipes run it); elsewhere it is not, as the cost model
    prices DeepEP at or above it on every tier (``costmodel.moe.HYBRIDEP_GB_PER_S``). ``fixed``
    (``--moe-dispatcher``, ``--ep-overlap``) pins either. The table checks each pair (``runs``)."""
    t = T.get(target)
    if not (model.is_moe and par.ep > 1):
        return [(fixed.get("moe_dispatcher", ""), fixed.get("ep_overlap", False))]
    # where each flex backend is worth trying; where the fabric cannot carry it, the filter below drops it
    offered = {"deepep": par.ep > gpn, "hybridep": multi_node_nvlink(gpn, host) and par.ep > host}
    disp = [""] + [d for d in t.moe_dispatchers if offered.get(d, False)]
    over = [False, True] if t.ep_overlap else [False]
    if "moe_dispatcher" in fixed:
        disp = [fixed["moe_dispatcher"]]
    # none where the cluster's fabric cannot carry it (costmodel.moe.dispatcher_fabric_problem), pinned or not
    disp = [d for d in disp if not dispatcher_fabric_problem(d, par.ep, gpn, host, rdma)[0]]
    if "ep_overlap" in fixed:
        over = [fixed["ep_overlap"]]
    return [(d, o) for d in disp for o in over]


def sp_choices(target: str, tp: int) -> list[bool]:
    return [True, False] if tp > 1 else [False]


def schedule_choices(target: str, pp: int, vpp: int) -> list[str]:
    if vpp > 1:
        return ["interleaved"]
    return ["1f1b", "gpipe"] if pp > 1 else ["1f1b"]


def runnable_schedules(target: str, pp: int, vpp: int) -> list[str]:
    """``schedule_choices`` less the schedules no table of the target runs with pipeline stages
    (any of its variants' ``schedules``; the table still checks each configuration): the search
    does not build a configuration the table refuses on its schedule alone."""
    out = schedule_choices(target, pp, vpp)
    if pp == 1:
        return out
    t = T.get(target)
    runs_any: set[str] = set()
    for sub in [s for _, _, s in t.variants] or [t]:
        runs_any |= sub.schedules
    return [s for s in out if s in runs_any]


def recompute_choices(target: str, model: ModelSpec, pp: int, vpp: int, fixed: dict) -> list[tuple[str, int]]:
    """``(recompute, recompute_layers)`` policies to try: the target's whole-model policies, and
    with Megatron's block method every uniform count N a stage split can hold (N a multiple of
    vpp; N below ``layers / pp``: at ``layers / pp`` every layer would recompute)."""
    t = T.get(target)
    pols = set()
    for sub in [s for _, _, s in t.variants] or [t]:
        pols |= sub.recompute
    block = any(s.recompute_block and not s.recompute_per_stage for s in [x for _, _, x in t.variants] or [t])
    if "recompute" in fixed:
        bases = [fixed["recompute"]]
    elif t.recompute_per_stage:
        bases = [b for b in ("none", "selective") if b in pols]
    else:
        bases = [b for b in ("none", "selective", "full") if b in pols]
    out: list[tuple[str, int]] = []
    for b in bases:
        if b != "full":
            out.append((b, -1))
            continue
        if "recompute_layers" in fixed:
            out.append(("full", fixed["recompute_layers"]))
            continue
        out.append(("full", -1))
        if block and pp > 1:            # one stage picks its own count: split_of
            step = vpp if vpp > 1 else 1
            top = model.layers // pp - (1 if model.layers % pp == 0 else 0) if pp > 1 else model.layers - 1
            out += [("full", n) for n in range(step, top + 1, step)]
    return out


# (position in the search's choice key, the dominated value, the value that dominates it)
DOMINATED = ((3, 0, 1), (5, False, True), (7, "gpipe", "1f1b"))


def prune_dominated(found: list[tuple[tuple, ParallelConfig]]) -> list[tuple[tuple, ParallelConfig]]:
    """Drop a configuration when the one that differs only by the better choice is also there.
    ``found`` holds ``(key, config)`` with the key ``(micro_batch, ep, etp, zero, dp_shard, sp, vpp,
    schedule, recompute, recompute_layers, order)`` of ``space._inner``."""
    present = {k for k, _ in found}
    out = []
    for k, par in found:
        if any(k[i] == worse and (k[:i] + (better,) + k[i + 1:]) in present for i, worse, better in DOMINATED):
            continue
        out.append((k, par))
    return out


def runs(target: str, model: ModelSpec, workload: Workload, par: ParallelConfig, order: tuple) -> bool:
    return T.runs_config(target, model, workload, par, order)


class _NotChosen(Exception):
    """A rule read a field of the configuration (or its mesh order) that is not chosen yet."""


_PAR_FIELDS = frozenset(f.name for f in dataclasses.fields(ParallelConfig))
_SHAPE_FIELDS = ("tp", "pp", "dp", "cp")


class _ShapeOnly(ParallelConfig):
    """An outer shape's degrees, as a configuration of which nothing else is chosen: reading any
    other field (directly, or through a property or method) raises ``_NotChosen``."""

    def __getattribute__(self, name: str):
        if name in _PAR_FIELDS:
            try:
                return object.__getattribute__(self, "__dict__")[name]
            except KeyError:
                raise _NotChosen(name) from None
        return object.__getattribute__(self, name)


class _OrderNotChosen:
    """The mesh order before it is chosen: any use raises ``_NotChosen``."""

    def _later(self, *_a, **_k):
        raise _NotChosen("order")

    __iter__ = __len__ = __getitem__ = __contains__ = __eq__ = __hash__ = index = count = _later


_ORDER_LATER = _OrderNotChosen()


class ShapeRules:
    """``runs(target, model, workload, par, order)`` for the configurations of one outer shape
    (``tp``, ``pp``, ``dp``, ``cp``). ``runs_config`` asks pure predicates of the configuration
    (``targets.config_checks``); each is asked first of the shape alone (``_ShapeOnly``). One that
    reads nothing else has its verdict for every configuration of the shape: broken, it refuses
    them all; holding, it is not asked again. The rest are asked of each configuration, in
    ``runs_config``'s order. Where the table that applies (``TrainTarget.for_config``) depends
    on more than the shape, every configuration is asked of ``runs``. tests/test_space_fast_path.py
    holds the candidates equal to asking ``runs``."""

    def __init__(self, target: str, model: ModelSpec, workload: Workload, tp: int, pp: int, dp: int, cp: int):
        self.target, self.model, self.workload = target, model, workload
        self.base = T.get(target)
        self.checks = None            # None: ask runs itself; () with ``none``: every configuration refused
        self.none = False
        self.by_order: dict = {}      # mesh order -> the checks left once it is chosen (None: all refused)
        self.memo: dict = {}          # _same_but_mb -> id(checks) -> (broken, the rules asked again)
        self.interned: dict = {}
        self.ask_fields: dict = {}
        self.plans: dict = {}
        shape = self.shape = object.__new__(_ShapeOnly)
        object.__getattribute__(shape, "__dict__").update(tp=tp, pp=pp, dp=dp, cp=cp)
        try:
            self.t = self.base.for_config(shape)
            self.ask_fields = dict(t=self.t, name=self.base.name, model=model, wl=workload, plan_check=False)
            checks = T.config_checks(T.Ask(self.t, self.base.name, model, workload, shape, _OrderNotChosen(), False))
        except _NotChosen:
            return
        left = None if checks is None else self._left(checks, _OrderNotChosen())
        self.none = left is None
        self.checks = left or ()

    def _left(self, checks: tuple, order) -> tuple | None:
        """Of ``checks``, those the shape (and ``order``) alone do not decide; None when one of
        them breaks."""
        ask = T.Ask(self.t, self.base.name, self.model, self.workload, self.shape, order, False)
        keep = []
        for broken in checks:
            try:
                if broken(ask):
                    return None
            except Exception:       # reads more than the shape (_NotChosen), or cannot be asked of it
                keep.append(broken)
        return tuple(keep)

    def runs(self, par: ParallelConfig, order: tuple) -> bool:
        if self.none:
            return False
        if self.checks is None:
            return runs(self.target, self.model, self.workload, par, order)
        order = tuple(order)
        checks = self.by_order.get(order, self)
        if checks is self:
            checks = self.by_order[order] = self._left(self.checks, order)
        if checks is None:
            return False
        ask = T.Ask(self.t, self.base.name, self.model, self.workload, par, order, False)
        for broken in checks:
            if broken(ask):
                return False
        return True

    def runs_orders(self, par: ParallelConfig, orders: tuple) -> tuple[bool, ...]:
        """``runs(par, order)`` for each of ``orders`` (tuples), each rule asked as seldom as its
        reads allow. Rules are pure functions of what they read, so a verdict holds for every
        configuration and order that agree on what the rule read. A kind (every field but the
        micro-batch and the gradient accumulation: ``_same_but_mb``) has its first configuration
        asked of every rule traced (``_Traced``), the order not chosen (``_OrderNotChosen``): a
        rule that read neither the order nor those two fields has its verdict for the whole
        kind (broken: all refused; holding: not asked again). The rest are asked of each
        configuration and order. tests/test_space_fast_path.py holds the candidates equal to
        asking ``runs`` of each configuration and order."""
        if self.none or self.checks is None:
            return tuple(self.runs(par, o) for o in orders)
        plan = self.plans.get(orders)
        if plan is None:
            plan = self.plans[orders] = self._plan(orders)
        key = _same_but_mb(par)
        ents = self.memo.get(key)
        if ents is None:
            ents = self.memo[key] = {}
        out = [False] * len(orders)
        for checks, idxs in plan:
            again = ents.get(id(checks))
            if again is None:
                again = ents[id(checks)] = self._traced(par, checks)
            if again is _BROKEN:
                continue
            for i in idxs:
                if again:
                    ask = self._ask(par, orders[i])
                    if any(b(ask) for b in again):
                        continue
                out[i] = True
        return tuple(out)

    def _ask(self, par: ParallelConfig, order) -> T.Ask:
        """``T.Ask(self.t, name, model, workload, par, order, False)``, built without the frozen
        dataclass's per-field ``__setattr__`` (asked tens of thousands of times)."""
        ask = object.__new__(T.Ask)
        d = ask.__dict__
        d.update(self.ask_fields)
        d["par"], d["order"] = par, order
        return ask

    def _plan(self, orders: tuple) -> list:
        """For each distinct list of rules the orders leave (``by_order``), the orders that ask it."""
        plan: dict = {}
        for i, order in enumerate(orders):
            checks = self.by_order.get(order, self)
            if checks is self:
                checks = self._left(self.checks, order)
                if checks is not None:        # one object per distinct list (the memo's key)
                    checks = self.interned.setdefault(checks, checks)
                self.by_order[order] = checks
            if checks is not None:
                plan.setdefault(id(checks), (checks, []))[1].append(i)
        return [(checks, tuple(idxs)) for checks, idxs in plan.values()]

    def _traced(self, par: ParallelConfig, checks: tuple):
        """Ask each rule of ``checks`` of ``par`` traced, the order not chosen: ``_BROKEN`` when a
        rule that read neither the micro-batch, the gradient accumulation nor the order breaks;
        else the rules that read one of them (or raised), to ask of each configuration and order,
        in order."""
        traced = object.__new__(_Traced)
        object.__getattribute__(traced, "__dict__").update(par.__dict__)
        ask = self._ask(traced, _ORDER_LATER)
        again = []
        for broken in checks:
            _TOUCHED[0] = False
            try:
                hit = broken(ask)
            except Exception:       # read the order (_NotChosen), or raised: asked of each order
                again.append(broken)
                continue
            if _TOUCHED[0]:
                again.append(broken)
            elif hit:
                return _BROKEN
        return tuple(again)


_BROKEN = ("broken",)


_PAR_GETTER = operator.attrgetter(*sorted(_PAR_FIELDS - {"micro_batch", "grad_accum"}))


def _same_but_mb(par: ParallelConfig) -> tuple:
    return _PAR_GETTER(par)


_TOUCHED = [False]


class _Traced(ParallelConfig):
    """A configuration that notes (``_TOUCHED``) when its micro-batch or gradient accumulation is
    read, directly or through a property or method; reading its ``__dict__`` counts as reading
    them (a rule that looks at the whole configuration)."""

    def __getattribute__(self, name: str):
        if name in _TRACED_FIELDS:
            _TOUCHED[0] = True
        return object.__getattribute__(self, name)


_TRACED_FIELDS = frozenset({"micro_batch", "grad_accum", "__dict__"})


def splits_of(target: str, par: ParallelConfig, fixed: dict | None, model: ModelSpec) -> list[dict]:
    """The Candidate fields of each split the target may run for ``par``: one, or for a target
    that places the layers itself (DeepSpeed's partition methods) one per distinct split, each
    fixed and naming its method."""
    base = split_of(target, par, fixed)
    if not widened(target) or base["split"] != "partition":
        return [base]
    if par.pp == 1:
        return [{**base, "split": "any"}]
    return [{**base, "split": "fixed", "counts": counts, "switches": (("partition_method", method),)}
            for counts, method in T.partition_splits(target, model, par.pp).items()]


def split_count(target: str, par: ParallelConfig, fixed: dict | None, model: ModelSpec) -> int:
    """``len(splits_of(...))``: one wherever no table of the target places the layers itself
    (``split_rule``'s split is its table's, or even), without asking ``split_of``."""
    if not widened(target) or not _places_layers(target):
        return 1
    return len(splits_of(target, par, fixed, model))


@functools.lru_cache(maxsize=None)
def _places_layers(target: str) -> bool:
    t = T.get(target)
    return any(sub.split == "partition" for sub in [t] + [s for _, _, s in t.variants])


def split_of(target: str, par: ParallelConfig, fixed: dict | None = None) -> dict:
    """The Candidate fields that carry the target's split rule (``--recompute-layers 0`` without
    full recompute: no stage recomputes on its own either)."""
    split, per_stage, least = T.split_rule(target, par)
    uniform = False
    if not per_stage and par.pp == 1 and par.recompute == "none" and _has_block(target, par):
        per_stage = uniform = True          # one stage: its count is the uniform N (finalize_par)
    if fixed and fixed.get("recompute_layers") == 0 and par.recompute != "full":
        per_stage = uniform = False
    if policy_fixed(fixed):
        per_stage = uniform = False
    return {"split": split, "stage_recompute": per_stage, "least_layers": least, "uniform_recompute": uniform}


def policy_fixed(fixed: dict | None) -> bool:
    """``--recompute none|selective`` without ``--recompute-layers``: the user asked for that policy
    on every layer, so no stage recomputes layers of its own on top (which would silently turn it
    into partial full recompute)."""
    return bool(fixed) and fixed.get("recompute") in ("none", "selective") and "recompute_layers" not in fixed


def _has_block(target: str, par: ParallelConfig) -> bool:
    t = T.get(target).for_config(par)
    return t.recompute_block and "full" in t.recompute


@functools.lru_cache(maxsize=None)
def _takes_framework(fn) -> bool:
    try:
        return "framework" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def framework_kwargs(fn, target: str | None, switches=None) -> dict:
    """``{"framework": profile}`` for a cost-model function (``estimate``, ``stage_model``,
    ``Problem``) that prices a target's framework (``costmodel.frameworks``), with the plan's
    framework settings (``switches``: compile, async TP, ...) priced; ``{}`` for the generic
    target or a function that takes no framework."""
    if not widened(target) or not _takes_framework(fn):
        return {}
    if switches:
        return {"framework": T.profile_for(target, switches)}
    return {"framework": T.framework_of(target)}
