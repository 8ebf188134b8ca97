"""The search space: every legal outer configuration (degrees, ZeRO, micro-batch, schedule,
base recompute policy, mesh order), enumerated in sorted order with the user's fixed
dimensions respected. The pipeline split and per-stage recompute are left to CP-SAT.

Dominated choices are left out unless fixed, each for a reason the cost model makes exact:
ZeRO-0 costs the same time as ZeRO-1 with more memory; sequence parallelism moves the same
bytes as plain TP with less memory; context parallelism only for sequences of at least
``MIN_TOKENS_PER_CP_RANK`` tokens per rank (shorter chunks leave attention too small to hide
the ring).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from costmodel.limits import MAX_LAYERS
from costmodel.moe import DISPATCHERS as MOE_DISPATCHERS, deepep_fabric_problem, dispatcher_fabric_problem
from costmodel.specs import MESH_AXES, ClusterSpec, ModelSpec, ParallelConfig, SpecError, Workload, tp_problems
from planner.plan.errors import UsageError

MIN_TOKENS_PER_CP_RANK = 4096
MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 4)
ORDERS = (MESH_AXES, ("dp", "pp", "cp", "tp"))


@dataclass(frozen=True)
class Candidate:
    par: ParallelConfig
    order: tuple[str, ...]
    stage_counts: tuple[tuple[str, int], ...]   # node group -> stages it runs (heterogeneous)
    # the target's split rule (planner.search.targets): any | even | last (all but the last equal);
    # whether a stage may recompute layers of its own; the least layers a stage holds
    split: str = "any"
    stage_recompute: bool = True
    least_layers: int = 0
    uniform_recompute: bool = False      # one stage: its own count is the policy's (finalize_par)
    counts: tuple[int, ...] = ()         # split "fixed": the layers of each stage (DeepSpeed's partition)
    switches: tuple[tuple[str, object], ...] = ()   # the framework settings the plan carries

    @property
    def world(self) -> int:
        return self.par.world_size


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    return not tp_problems(model, tp)


def _choices(fixed: dict, key: str, default: list) -> list:
    if key in fixed:
        return [fixed[key]]
    return default


def world_sizes(cluster: ClusterSpec, gpus: int, objective: str) -> list[int]:
    """GPU counts to consider: all of them, or (``--objective cost``) whole-node fractions."""
    if objective != "cost" or len(cluster.groups) > 1:
        return [gpus]
    gpn = cluster.gpus_per_node
    out = {gpus}
    w = gpus
    while w > 1:
        w //= 2
        if w >= gpn and w % gpn == 0 or w < gpn and gpn % w == 0:
            out.add(w)
    return sorted(out, reverse=True)


def enumerate_candidates(model: ModelSpec, cluster: ClusterSpec, workload: Workload, fixed: dict, gpus: int,
                         objective: str = "throughput", worlds: Sequence[int] | None = None,
                         target: str | None = None) -> list[Candidate]:
    """Every legal outer configuration, in a deterministic order: on ``gpus`` GPUs, on the GPU
    counts ``world_sizes`` allows for the objective, or on each of ``worlds`` when given (a
    replan searching several world sizes at once). With ``target``, only what that execution
    target runs (``planner.search.targets``)."""
    out: list[Candidate] = []
    for shape in shapes(model, cluster, workload, fixed, gpus, objective, worlds):
        out += shape_candidates(model, workload, fixed, shape, target)
    return out


def candidate_kinds(model: ModelSpec, cluster: ClusterSpec, workload: Workload, fixed: dict, gpus: int,
                    objective: str = "throughput", worlds: Sequence[int] | None = None,
                    target: str | None = None) -> tuple[list[Kind], int]:
    """``enumerate_candidates``' candidates as ``Kind`` s not written out yet, each with the index
    of its first candidate (``Kind.start``), and how many candidates there are: the same count,
    the same candidates at the same indices (``Kind.write_out``, ``Kind.member``)."""
    out: list[Kind] = []
    n = 0
    for shape in shapes(model, cluster, workload, fixed, gpus, objective, worlds):
        for k in _kinds(model, workload, fixed, shape.tp, shape.cp, shape.pp, shape.dp, shape.gpn,
                        shape.stage_counts, target, None, shape.rdma, host=shape.host):
            k.start = n
            n += k.size
            out.append(k)
    return out, n


@dataclass(frozen=True)
class Shape:
    """One outer shape of the search: the degrees, the NVLink domain and the stages per node
    group. ``enumerate_candidates`` is ``shape_candidates`` of every shape, in ``shapes``' order."""
    tp: int
    cp: int
    pp: int
    dp: int
    gpn: int
    stage_counts: tuple[tuple[str, int], ...]
    rdma: bool = True        # the inter-node link is an RDMA fabric (costmodel.moe.deepep_fabric_problem)
    host: int = 0            # GPUs per host: an NVLink domain of several (gpn > host) is multi-node NVLink


def shapes(model: ModelSpec, cluster: ClusterSpec, workload: Workload, fixed: dict, gpus: int,
           objective: str = "throughput", worlds: Sequence[int] | None = None) -> list[Shape]:
    """The outer shapes ``enumerate_candidates`` goes through, in its order."""
    _check_fixed(model, workload, fixed, gpus)
    gpn = max(g.nvlink_gpus for g in cluster.groups)
    rdma = not deepep_fabric_problem(cluster.inter_node)
    host = min(g.gpus_per_node for g in cluster.groups)
    if fixed.get("moe_dispatcher") and fixed.get("ep", 1) > 1:
        why, hint = dispatcher_fabric_problem(fixed["moe_dispatcher"], fixed["ep"], gpn, host, rdma)
        if why:
            raise UsageError(f"--moe-dispatcher {fixed['moe_dispatcher']} with --ep {fixed['ep']} on {cluster.name} "
                             f"({gpn}-GPU NVLink domains of {host}-GPU hosts, inter-node link "
                             f"{cluster.inter_node.name}): {why}; {hint}")
    out = []
    for world in (world_sizes(cluster, gpus, objective) if worlds is None else worlds):
        for tp, cp, pp, dp in outer_shapes(model, workload, fixed, gpn, world):
            stage_counts = _stage_counts(cluster, tp * dp * cp, pp)
            if stage_counts is not None:
                out.append(Shape(tp, cp, pp, dp, gpn, stage_counts, rdma, host))
    return out


def shape_candidates(model: ModelSpec, workload: Workload, fixed: dict, shape: Shape,
                     target: str | None = None, micro_batch: int | None = None,
                     kept: dict | None = None) -> list[Candidate]:
    """The candidates of one outer shape, in ``enumerate_candidates``' order; with
    ``micro_batch``, those of that micro-batch alone (the micro-batch is the outermost choice,
    and nothing about one micro-batch's candidates depends on another's, so these are a
    contiguous part of the shape's list). ``kept``: a dict the caller keeps for one search, in
    which each shape's rules and their verdicts are kept between its micro-batches."""
    return _inner(model, workload, fixed, shape.tp, shape.cp, shape.pp, shape.dp, shape.gpn, shape.stage_counts,
                  target, micro_batch, shape.rdma, kept, shape.host)


def group_representatives(model: ModelSpec, workload: Workload, fixed: dict, shape: Shape,
                          target: str | None = None) -> list[list[Candidate]] | None:
    """For the search's lazy expansion (``bnb``): one configuration per choice of the fields a
    group shares (micro-batch, expert layout, sequence parallel; of the recompute policies the
    one whose bound is least) that ``_inner`` may build for ``shape``, as one candidate per mesh
    order it may take, at the largest virtual-stage count it may take; none of them asked of
    the target (they bound a superset of the groups). ``[]``: the shape has no candidates at all; None: a representative did not
    pass ``ParallelConfig``'s checks (the shape is then expanded rather than bounded)."""
    tp, cp, pp, dp = shape.tp, shape.cp, shape.pp, shape.dp
    ch = _choice_lists(model, workload, fixed, tp, cp, pp, dp, target)
    if ch is None or not ch.zeros:
        return []
    out = []
    base_par = None
    for mb in ch.mbs:
        ga = ch.per_replica // mb
        if "grad_accum" in fixed and fixed["grad_accum"] != ga:
            continue
        vpps = _vpps(model, fixed, pp, ga)
        if not vpps:
            continue
        v = max(vpps)
        policies = {b for b, _ in ch.policies(v)} if ch.wide else set(ch.bases)
        # the bound reads the recompute policy only as "selective or not" (stage_compute_time),
        # and selective only adds its extra backward (layer_sums, a time >= 0) to the same sum:
        # with none or full among the policies, none's bound is below all of theirs
        if not policies:
            continue
        bases = ["none"] if policies - {"selective"} else ["selective"]
        for ep, etp in ch.experts:
            for sp in ch.sps:
                for base in bases:
                    fields = dict(ep=ep, etp=etp, sp=sp, vpp=v, micro_batch=mb, grad_accum=ga, recompute=base,
                                  schedule="interleaved" if v > 1 else "1f1b", recompute_modules=ch.modules,
                                  offload_modules=fixed.get("offload_modules", ()))
                    if base_par is None:
                        try:
                            par = base_par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, zero=ch.zeros[0],
                                                            dp_shard=dp, **fields)
                        except SpecError:
                            return None
                    else:
                        # a bound only, never a candidate: copied, not checked again (a
                        # configuration the checks would refuse only lowers the shape's bound)
                        par = _copied(base_par, fields)
                    out.append([Candidate(par=par, order=tuple(o), stage_counts=shape.stage_counts)
                                for o in ch.orders])
                    # an MoE group's members may carry any MoE execution (dispatcher, EP overlap:
                    # ``_moe_variants``), each priced apart: one representative per pair, so the
                    # shape's bound is at most every member's
                    if ep > 1:
                        for disp, over in _MOE_EXEC_PAIRS:
                            if (disp, over) != (par.moe_dispatcher, par.ep_overlap):
                                alt = _copied(par, dict(moe_dispatcher=disp, ep_overlap=over))
                                out.append([Candidate(par=alt, order=tuple(o), stage_counts=shape.stage_counts)
                                            for o in ch.orders])
    return out


# every (dispatcher, EP overlap) pair a plan may carry ("" is the target's default dispatcher)
_MOE_EXEC_PAIRS = tuple((d, o) for d in ("",) + MOE_DISPATCHERS for o in (False, True))


def _copied(par: ParallelConfig, fields: dict) -> ParallelConfig:
    """``par`` with ``fields`` set, its cached hash and memos dropped, no check run."""
    out = object.__new__(ParallelConfig)
    src = par.__dict__
    d = out.__dict__
    for k in _PAR_FIELDS:       # the fields alone: the hash and memos were cached from par's
        d[k] = src[k]
    d.update(fields)
    return out


_PAR_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelConfig))


@dataclass
class _Choices:
    wide: bool
    per_replica: int
    mbs: list
    experts: list
    zeros: list
    sps: list
    bases: list
    orders: tuple
    policies: Callable[[int], list]   # vpp -> the (recompute, recompute_layers) policies (a widened target)
    # what the candidates' selective recompute runs (ParallelConfig.recompute_modules: the fixed set, else the
    # target's, ``targets.selective_modules``), carried under every policy, read under selective only
    modules: tuple = ()


def _choice_lists(model, workload, fixed, tp, cp, pp, dp, target) -> _Choices | None:
    """The choices ``_inner`` goes through for one outer shape (None: the target runs no
    configuration of this model)."""
    from planner.search import target_space as tg
    wide = tg.widened(target)
    if wide and tg.T.model_problems(target, model, workload):
        return None                   # the target runs no configuration of this model (planner.search.refusal says why)
    per_replica = workload.global_batch // dp
    mbs = _choices(fixed, "micro_batch", [b for b in MICRO_BATCHES if per_replica % b == 0])
    mbs = [mb for mb in mbs if per_replica % mb == 0]
    # expert layouts (ep, etp): EP inside dp x cp with the attention's TP, and, folded (Megatron-Core's
    # "MoE parallel folding"), EP over tp x cp x dp with whole experts (etp 1), searched for a target
    # that runs it (the generic target keeps EP inside dp); --etp fixes it
    # (``costmodel.specs.expert_layout_problems`` is the rule, ``targets`` what a framework runs)
    etps = _choices(fixed, "etp", sorted({tp, 1}) if model.is_moe and tg.folds_experts(target) else [tp])
    eps = _choices(fixed, "ep", [e for e in divisors(model.num_experts)] if model.is_moe else [1])
    experts = ([(e, et) for et in etps for e in eps if et == tp and (dp * cp) % e == 0]
               + [(e, et) for et in etps for e in eps if et != tp and e > 1 and (tp * cp * dp) % (e * et) == 0])
    if wide:      # what the target's table refuses outright is not enumerated (the table checks the rest)
        experts = [(e, et) for e, et in experts if tg.ep_ok(target, tp, e, et)]
    zeros = _choices(fixed, "zero", tg.zero_choices(target, dp, cp, pp) if wide else [1, 2, 3] if dp > 1 else [1])
    sps = _choices(fixed, "sp", tg.sp_choices(target, tp) if wide else [tp > 1])
    bases = ["full"] if fixed.get("recompute") == "full" else _choices(fixed, "recompute", ["none", "selective"])
    orders = ORDERS if pp > 1 and dp > 1 and "mesh_order" not in fixed else (fixed.get("mesh_order", ORDERS[0]),)
    modules = fixed.get("recompute_modules") or tg.T.selective_modules(target, model, workload)
    return _Choices(wide, per_replica, mbs, experts, zeros, sps, bases, orders,
                    lambda vpp: tg.recompute_choices(target, model, pp, vpp, fixed), modules)


def _vpps(model, fixed, pp: int, ga: int) -> list[int]:
    return _choices(fixed, "vpp", [v for v in VIRTUAL_STAGES if v == 1 or (pp > 1 and ga % pp == 0
                                                                          and model.layers // pp >= v)])


def outer_shapes(model: ModelSpec, workload: Workload, fixed: dict, gpn: int, world: int):
    """The degrees ``(tp, cp, pp, dp)`` that use exactly ``world`` GPUs (TP within a node of
    ``gpn``, ``dp`` dividing the global batch): the outer loop of the search space."""
    seq = workload.seq_len
    tps = _choices(fixed, "tp", [t for t in divisors(min(gpn, world)) if _tp_ok(model, t)])
    cps = _choices(fixed, "cp", [c for c in (1, 2, 4, 8, 16, 32)
                                 if seq % c == 0 and (c == 1 or seq // c >= MIN_TOKENS_PER_CP_RANK)])
    for tp in tps:
        for cp in cps:
            if world % (tp * cp):
                continue
            rest = world // (tp * cp)
            for pp in _choices(fixed, "pp", [p for p in divisors(rest) if p <= model.layers]):
                if rest % pp:
                    continue
                dp = rest // pp
                if ("dp" in fixed and fixed["dp"] != dp) or workload.global_batch % dp:
                    continue
                yield tp, cp, pp, dp


def _stage_counts(cluster: ClusterSpec, per_stage: int, pp: int) -> tuple[tuple[str, int], ...] | None:
    if len(cluster.groups) == 1:
        return ((cluster.groups[0].name, pp),)
    counts = []
    for g in cluster.groups:
        if g.gpus % per_stage:
            return None
        counts.append((g.name, g.gpus // per_stage))
    return tuple(counts) if sum(c for _, c in counts) == pp else None


def _inner(model, workload, fixed, tp, cp, pp, dp, gpn, stage_counts, target=None, only_mb=None,
           rdma: bool = True, kept: dict | None = None, host: int = 0) -> list[Candidate]:
    return [c for k in _kinds(model, workload, fixed, tp, cp, pp, dp, gpn, stage_counts, target, only_mb, rdma, kept,
                              host) for c in k.write_out()]


def _kinds(model, workload, fixed, tp, cp, pp, dp, gpn, stage_counts, target=None, only_mb=None,
           rdma: bool = True, kept: dict | None = None, host: int = 0) -> list[Kind]:
    """One outer shape's configurations as ``Kind`` s, in the search's order."""
    ch = _choice_lists(model, workload, fixed, tp, cp, pp, dp, target)
    if ch is None:
        return []
    if ch.wide:
        return _target_kinds(model, workload, fixed, tp, cp, pp, dp, gpn, target, only_mb, rdma, ch, stage_counts,
                             kept, host)
    per_replica, mbs, experts, zeros, sps, bases = ch.per_replica, ch.mbs, ch.experts, ch.zeros, ch.sps, ch.bases
    orders = tuple(tuple(o) for o in ch.orders)
    plain = tuple((None,) for _ in orders)
    out = []
    moe_fixed = _carried(fixed, ch)
    for mb, ga in _micro_batches(mbs, per_replica, only_mb, fixed):
        vpps = _vpps(model, fixed, pp, ga)
        for ep, etp in experts:
            for zero in zeros:
                for dp_shard in _dp_shards(fixed, zero, gpn, tp, cp, dp):
                    for sp in sps:
                        for vpp in vpps:
                            sched = fixed.get("schedule") or ("interleaved" if vpp > 1 else "1f1b")
                            # checked once; each policy below is a checked copy
                            first = _first_config(tp, pp, dp, cp, ep, etp, zero, dp_shard, sp, vpp, mb, ga, moe_fixed)
                            if first is None:
                                continue
                            for base in bases:
                                try:
                                    par = with_policy(first, sched, base, fixed.get("recompute_layers", -1))
                                except SpecError:
                                    continue
                                out.append(Kind((mb, ep, etp, zero, dp_shard, sp, vpp, sched, base), par,
                                                (par.recompute_layers,), orders, stage_counts, plain))
    return out


def _micro_batches(mbs, per_replica: int, only_mb, fixed: dict):
    """(micro-batch, gradient accumulation) for each micro-batch that divides a replica's batch, is
    the one asked (``only_mb``) and gives the fixed accumulation, if any."""
    for mb in mbs:
        if per_replica % mb or (only_mb is not None and mb != only_mb):
            continue
        ga = per_replica // mb
        if "grad_accum" not in fixed or fixed["grad_accum"] == ga:
            yield mb, ga


def _carried(fixed: dict, ch: _Choices) -> dict:
    """The fields every candidate of a shape carries as given: the MoE execution fixed (dispatcher, EP
    overlap), the activation offloading fixed (``--offload-modules``: the search does not choose it) and the
    selective recompute's modules (``_Choices.modules``)."""
    out = {k: fixed[k] for k in ("moe_dispatcher", "ep_overlap", "offload_modules") if k in fixed}
    if ch.modules:
        out["recompute_modules"] = ch.modules
    return out


def _first_config(tp, pp, dp, cp, ep, etp, zero, dp_shard, sp, vpp, mb, ga, moe_fixed) -> ParallelConfig | None:
    """A kind's configuration, fully checked (``ParallelConfig``'s own validation); None when it is
    refused. The kind's schedules and policies are checked copies of it."""
    try:
        return ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, zero=zero, dp_shard=dp_shard, sp=sp,
                              vpp=vpp, micro_batch=mb, grad_accum=ga, **moe_fixed)
    except SpecError:
        return None


def _dp_shards(fixed: dict, zero: int, gpn: int, tp: int, cp: int, dp: int) -> list[int]:
    """ZeRO shard widths: the whole dp group, and with ZeRO-3 also one NVLink domain (HSDP)."""
    shards = [dp]
    if zero == 3:
        node_shard = max(1, gpn // (tp * cp))
        if node_shard < dp and dp % node_shard == 0:
            shards.append(node_shard)
    return _choices(fixed, "dp_shard", shards)


@dataclass(eq=False)
class Kind:
    """Candidates of one outer shape that differ only in Megatron's uniform recompute count N
    (``recompute_layers``, ``Ns`` in the search's order; one value where there is no such
    count), the mesh order, the MoE execution pair and the split: one checked configuration
    ``par`` (at ``Ns[0]``), the mesh orders the target runs it in (after dominance), and for each
    of those orders the (dispatcher, EP overlap) pairs it runs (None: ``par``'s own). Every rule
    the table asks gives the same verdict for each N (no rule reads N beyond ``N % vpp``, which
    the choices keep 0), so the verdicts are asked once per kind.

    Its candidates, in ``enumerate_candidates``' order (``write_out``): for each N, each mesh
    order, each of that order's pairs, each split the target runs (``tg.splits_of``; with
    ``split`` None, the one plain split of the generic target). ``layout`` places them without
    writing them out, so the search can index (``member``) and count (``size``) them."""
    key: tuple                  # (micro_batch, ep, etp, zero, dp_shard, sp, vpp, schedule, recompute)
    par: ParallelConfig
    Ns: tuple
    orders: tuple
    stage_counts: tuple = ()
    pairs: tuple = ()           # per order: the accepted (dispatcher, overlap) pairs, None for par's own
    split: tuple | None = None  # (target, fixed, model) for tg.splits_of; None: one plain split
    start: int = 0              # the index of its first candidate (``candidate_kinds``)
    _layout: tuple | None = None

    def par_at(self, i: int) -> ParallelConfig:
        """The configuration at ``Ns[i]``."""
        n = self.Ns[i]
        return self.par if n == self.par.recompute_layers else with_recompute_layers(self.par, n)

    def splits(self, par: ParallelConfig) -> list[dict]:
        if self.split is None:
            return [{}]
        from planner.search import target_space as tg
        target, fixed, model = self.split
        return tg.splits_of(target, par, fixed, model)

    def split_count(self, par: ParallelConfig) -> int:
        if self.split is None:
            return 1
        from planner.search import target_space as tg
        target, fixed, model = self.split
        return tg.split_count(target, par, fixed, model)

    @property
    def layout(self) -> tuple:
        """``(offset, order, pair, splits)`` for each (mesh order, pair) in order, with the
        offset of its first candidate among one count N's, and the candidates of one N."""
        if self._layout is None:
            rows: list = []
            at = 0
            made: dict = {}
            for order, pairs in zip(self.orders, self.pairs):
                for pair in pairs:
                    n = made.get(pair)
                    if n is None:
                        n = made[pair] = self.split_count(_with_pair(self.par, pair))
                    rows.append((at, order, pair, n))
                    at += n
            self._layout = (tuple(rows), at)
        return self._layout

    @property
    def size(self) -> int:
        return len(self.Ns) * self.layout[1]

    def write_out(self) -> list[Candidate]:
        """Every candidate of the kind, in order."""
        out = []
        rows, per_n = self.layout
        for i in range(len(self.Ns)):
            pn = self.par_at(i)
            made: dict = {}
            for _, order, pair, n in rows:
                got = made.get(pair)
                if got is None:
                    pv = _with_pair(pn, pair)
                    got = made[pair] = (pv, self._splits_of(pv, n))
                pv, splits = got
                for fields in splits:
                    out.append(_candidate(pv, order, self.stage_counts, fields))
        return out

    def _splits_of(self, pv: ParallelConfig, n: int) -> list[dict]:
        splits = self.splits(pv)
        if len(splits) != n:        # the layout counts N's splits by the first N's: never seen to differ
            raise RuntimeError(f"internal: {len(splits)} splits of {pv}, but {n} of its kind's first count")
        return splits

    def member(self, i: int, row: int, s: int) -> tuple[int, Candidate]:
        """The candidate at ``Ns[i]``, layout row ``row``, split ``s``: ``(index, candidate)``."""
        rows, per_n = self.layout
        at, order, pair, n = rows[row]
        pv = _with_pair(self.par_at(i), pair)
        return self.start + i * per_n + at + s, _candidate(pv, order, self.stage_counts, self._splits_of(pv, n)[s])

    def bound_member(self, i: int, row: int) -> tuple[int, Candidate]:
        """The first candidate at ``Ns[i]`` and layout row ``row``, with its index, its split
        fields left at their defaults: what a group's bound reads of a member (its configuration,
        mesh order and stages per node group), without asking the target's split rule."""
        rows, per_n = self.layout
        at, order, pair, n = rows[row]
        return self.start + i * per_n + at, _candidate(_with_pair(self.par_at(i), pair), order, self.stage_counts, {})

    def members(self, pair) -> list[tuple[int, Candidate]]:
        """The candidates with MoE execution ``pair``, with their indices, in order."""
        rows, per_n = self.layout
        mine = [(at, order, n) for at, order, p, n in rows if p == pair and n]
        out = []
        for i in range(len(self.Ns)):
            pv = _with_pair(self.par_at(i), pair)
            splits = self._splits_of(pv, mine[0][2]) if mine else []
            for at, order, n in mine:
                base = self.start + i * per_n + at
                out += [(base + s, _candidate(pv, order, self.stage_counts, f)) for s, f in enumerate(splits)]
        return out


def _with_pair(par: ParallelConfig, pair) -> ParallelConfig:
    return par if pair is None else with_moe_exec(par, *pair)


def _target_kinds(model, workload, fixed, tp, cp, pp, dp, gpn, target, only_mb, rdma, ch,
                  stage_counts: tuple = (), kept: dict | None = None, host: int = 0) -> list[Kind]:
    """The configurations a target runs on one outer shape, as ``Kind`` s in the search's order:
    the choices of ``_choice_lists`` (schedules the target's tables may run), each built with
    ``ParallelConfig``'s checks and asked of the target's table once per kind
    (``ShapeRules.runs_orders``), dominated choices dropped (``tg.prune_dominated``' rule), MoE
    execution pairs asked of the table (``tg.moe_exec_choices``). ``kept``: the shapes' rules
    (``ShapeRules``, with their verdicts) kept by the caller for the same search (the lazy
    search builds a shape one micro-batch at a time)."""
    from planner.search import target_space as tg
    per_replica = ch.per_replica
    key = (target, tp, pp, dp, cp)
    rules = kept.get(key) if kept is not None else None
    if rules is None:
        rules = tg.ShapeRules(target, model, workload, tp, pp, dp, cp)
        if kept is not None:
            kept[key] = rules
    orders = tuple(tuple(o) for o in ch.orders)
    # the MoE execution a plan carries (dispatcher, EP overlap): as fixed, else the defaults; a target
    # whose file sets them gets each accepted pair as its own candidate below (``tg.moe_exec_choices``)
    moe_fixed = _carried(fixed, ch)
    split = (target, fixed, model)
    kinds: list[Kind] = []
    for mb, ga in _micro_batches(ch.mbs, per_replica, only_mb, fixed):
        vpps = _vpps(model, fixed, pp, ga)
        for ep, etp in ch.experts:
            for zero in ch.zeros:
                for dp_shard in _dp_shards(fixed, zero, gpn, tp, cp, dp):
                    for sp in ch.sps:
                        for vpp in vpps:
                            scheds = [fixed["schedule"]] if fixed.get("schedule") else tg.runnable_schedules(
                                target, pp, vpp)
                            runs_of = _policy_runs(ch.policies(vpp))
                            # checked once; each schedule and policy below is a checked copy
                            first = _first_config(tp, pp, dp, cp, ep, etp, zero, dp_shard, sp, vpp, mb, ga, moe_fixed)
                            if first is None:
                                continue
                            for sched in scheds:
                                for base, rls in runs_of:
                                    par = None
                                    for i, rl in enumerate(rls):
                                        try:
                                            par = with_policy(first, sched, base, rl)
                                        except SpecError:
                                            continue
                                        rls = rls[i:]
                                        break
                                    if par is None:
                                        continue
                                    ok = rules.runs_orders(par, orders)
                                    if any(ok):
                                        kinds.append(Kind((mb, ep, etp, zero, dp_shard, sp, vpp, sched, base), par,
                                                          tuple(rls), tuple(o for o, k in zip(orders, ok) if k),
                                                          stage_counts, (), split))
    kinds = _undominated(kinds)
    if model.is_moe and any(k.par.ep > 1 for k in kinds):
        for k in kinds:
            k.pairs = _moe_pairs(target, model, rules, k, gpn, fixed, rdma, host)
    else:
        for k in kinds:
            k.pairs = tuple((None,) for _ in k.orders)
    return kinds


def _policy_runs(policies: list[tuple[str, int]]) -> list[tuple[str, tuple[int, ...]]]:
    """The recompute policies in order, Megatron's uniform counts N of one policy (consecutive,
    each >= 0) as one run: ``[(recompute, (recompute_layers, ...)), ...]``."""
    out: list[tuple[str, tuple[int, ...]]] = []
    for base, rl in policies:
        if rl >= 0 and out and out[-1][0] == base and out[-1][1][-1] >= 0:
            out[-1] = (base, out[-1][1] + (rl,))
        else:
            out.append((base, (rl,)))
    return out


def _undominated(kinds: list[Kind]) -> list[Kind]:
    """``tg.prune_dominated`` on kinds: a configuration (its N and mesh order) is dropped when the
    one that differs only by the better choice is also there. Where that drops some of a kind's
    counts and not others, the kind is cut into one kind per count."""
    from planner.search import target_space as tg
    present: dict = {}
    for k in kinds:
        for o in k.orders:
            got = present.get((k.key, o))
            if got is None:
                present[(k.key, o)] = set(k.Ns)
            else:
                got.update(k.Ns)
    out = []
    for k in kinds:
        better = [k.key[:i] + (b,) + k.key[i + 1:] for i, worse, b in tg.DOMINATED if k.key[i] == worse]
        if not better:
            out.append(k)
            continue
        kept = []
        for o in k.orders:
            gone: set = set()
            for key in better:
                gone |= present.get((key, o), gone)
            kept.append((o, [n for n in k.Ns if n not in gone] if gone else list(k.Ns)))
        if all(len(ns) in (0, len(k.Ns)) for _, ns in kept):
            orders = tuple(o for o, ns in kept if ns)
            if orders:
                out.append(Kind(k.key, k.par, k.Ns, orders, k.stage_counts, (), k.split))
            continue
        for n in k.Ns:                       # partly dominated: one kind per count, in the search's order
            orders = tuple(o for o, ns in kept if n in ns)
            if orders:
                out.append(Kind(k.key, k.par if n == k.par.recompute_layers else with_recompute_layers(k.par, n),
                                (n,), orders, k.stage_counts, (), k.split))
    return out


def _moe_pairs(target, model, rules, kind: Kind, gpn: int, fixed: dict, rdma: bool, host: int = 0) -> tuple:
    """For each of the kind's mesh orders, the (dispatcher, EP overlap) pairs the target runs
    (``tg.moe_exec_choices``, in its order; None for the kind's own pair, kept as it is), each
    asked of the table (``rules``) once per kind."""
    from planner.search import target_space as tg
    par = kind.par
    per_order: list[list] = [[] for _ in kind.orders]
    for disp, over in tg.moe_exec_choices(target, model, par, gpn, fixed, rdma, host):
        if (disp, over) == (par.moe_dispatcher, par.ep_overlap):
            for got in per_order:
                got.append(None)
            continue
        ok = rules.runs_orders(with_moe_exec(par, disp, over), kind.orders)
        for got, k in zip(per_order, ok):
            if k:
                got.append((disp, over))
    return tuple(tuple(got) for got in per_order)


_CAND_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Candidate) if f.default is not dataclasses.MISSING}


def _candidate(par: ParallelConfig, order: tuple, stage_counts: tuple, fields: dict) -> Candidate:
    """``Candidate(par=par, order=order, stage_counts=stage_counts, **fields)`` without the frozen
    dataclass's per-field ``__setattr__`` (the search writes out tens of thousands); a field
    ``Candidate`` does not have goes to the constructor, which refuses it."""
    if not fields.keys() <= _CAND_DEFAULTS.keys():
        return Candidate(par=par, order=order, stage_counts=stage_counts, **fields)
    out = object.__new__(Candidate)
    d = out.__dict__
    d.update(_CAND_DEFAULTS)
    d.update(fields)
    d["par"], d["order"], d["stage_counts"] = par, order, stage_counts
    return out


def with_moe_exec(par: ParallelConfig, dispatcher: str, overlap: bool) -> ParallelConfig:
    """``par`` with its MoE execution (``moe_dispatcher``, ``ep_overlap``) set: what
    ``dataclasses.replace`` builds, without running every check again when only these change (a
    known dispatcher and a bool are valid wherever the values before were);
    tests/test_space_fast_path.py holds it equal to the checked construction."""
    if not (dispatcher in _DISPATCHER_VALUES and type(dispatcher) is str and type(overlap) is bool):
        return dataclasses.replace(par, moe_dispatcher=dispatcher, ep_overlap=overlap)
    return _copied(par, {"moe_dispatcher": dispatcher, "ep_overlap": overlap})


_DISPATCHER_VALUES = frozenset(("",) + MOE_DISPATCHERS)


def with_policy(par: ParallelConfig, schedule: str, recompute: str, recompute_layers: int) -> ParallelConfig:
    """``dataclasses.replace(par, schedule=..., recompute=..., recompute_layers=...)`` without
    running every check again: ``ParallelConfig``'s checks of these three read only them and
    ``vpp``, so a combination is checked once (on a configuration of defaults otherwise) and a
    valid one copied; an invalid one goes to ``dataclasses.replace``, which refuses it.
    tests/test_space_fast_path.py holds the candidates equal to the checked construction."""
    key = (par.vpp, schedule, type(schedule), recompute, type(recompute), recompute_layers, type(recompute_layers))
    ok = _VALID_POLICY.get(key)
    if ok is None:
        try:
            ParallelConfig(vpp=par.vpp, schedule=schedule, recompute=recompute, recompute_layers=recompute_layers)
            ok = True
        except SpecError:
            ok = False
        if len(_VALID_POLICY) > 65536:
            _VALID_POLICY.clear()
        _VALID_POLICY[key] = ok
    if not ok:
        return dataclasses.replace(par, schedule=schedule, recompute=recompute, recompute_layers=recompute_layers)
    return _copied(par, {"schedule": schedule, "recompute": recompute, "recompute_layers": recompute_layers})


_VALID_POLICY: dict = {}


def with_recompute_layers(par: ParallelConfig, n: int) -> ParallelConfig:
    """``par`` with ``recompute_layers = n``: what ``ParallelConfig(...)`` builds, without running
    its checks again when only that field changes (a count in ``0..MAX_LAYERS`` is valid wherever
    another count was; ``dataclasses.replace`` otherwise). The search builds tens of thousands of
    these (Megatron's ``--recompute-num-layers`` N for every N a stage holds); tests/test_space_fast_path.py
    holds it equal to the checked construction."""
    if not (type(n) is int and 0 <= n <= MAX_LAYERS and par.recompute_layers >= 0):
        return dataclasses.replace(par, recompute_layers=n)
    return _copied(par, {"recompute_layers": n})


def _check_fixed(model: ModelSpec, workload: Workload, fixed: dict, gpus: int) -> None:
    """Conflicting fixed dimensions: exit 2 with the numbers."""
    prod = 1
    names = []
    for k in ("tp", "pp", "dp", "cp"):
        if k in fixed:
            if fixed[k] < 1:
                raise UsageError(f"--{k} must be >= 1, got {fixed[k]}")
            prod *= fixed[k]
            names.append(f"{k}={fixed[k]}")
    if gpus % prod:
        raise UsageError(f"fixed {' * '.join(names)} = {prod} does not divide --gpus {gpus}")
    if all(k in fixed for k in ("tp", "pp", "dp", "cp")) and prod != gpus:
        raise UsageError(f"fixed {' * '.join(names)} = {prod}, but --gpus is {gpus}")
    if "tp" in fixed and not _tp_ok(model, fixed["tp"]):
        raise UsageError(f"--tp {fixed['tp']} does not divide {model.name}'s heads {model.heads} / kv heads "
                         f"{model.kv_heads} / ffn {model.ffn_hidden}")
    if "ep" in fixed:
        if fixed["ep"] > 1 and not model.is_moe:
            raise UsageError(f"--ep {fixed['ep']} but {model.name} has no experts")
        if model.is_moe and model.num_experts % fixed["ep"]:
            raise UsageError(f"--ep {fixed['ep']} does not divide {model.name}'s {model.num_experts} experts")
    if "etp" in fixed:
        if not model.is_moe:
            raise UsageError(f"--etp {fixed['etp']} but {model.name} has no experts (expert tensor parallel "
                             "splits routed experts); leave --etp out")
        if fixed["etp"] < 1 or model.expert_ffn_hidden % fixed["etp"]:
            raise UsageError(f"--etp {fixed['etp']} must be >= 1 and divide {model.name}'s expert FFN width "
                             f"{model.expert_ffn_hidden}")
    if "micro_batch" in fixed and "dp" in fixed and workload.global_batch % (fixed["micro_batch"] * fixed["dp"]):
        raise UsageError(f"--global-batch {workload.global_batch} is not a multiple of dp*micro_batch = "
                         f"{fixed['dp']}*{fixed['micro_batch']}")
    if "cp" in fixed and workload.seq_len % fixed["cp"]:
        raise UsageError(f"--cp {fixed['cp']} does not divide --seq-len {workload.seq_len}")


def replace_par(c: Candidate, **kw) -> Candidate:
    return dataclasses.replace(c, par=dataclasses.replace(c.par, **kw))
