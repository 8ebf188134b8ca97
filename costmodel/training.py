"""``estimate()``: memory per GPU and time per training step of one configuration, its stages
put together: each kind of stage costed once (``StageModel.cost``, its two parts and its exposed
DP time memoized by ``stage_cache.kind_cost``), every stage's peak memory, and the step
(``pipeline_step_time``); every stage's row (``Estimate.stages``) is built when first read.

Three rooms: the rules (``costmodel.stage_terms``: layer and stage terms, the step and its
sources), the caches (``costmodel.stage_cache``), and this module. The names the rest of the
code imports from here (``inflight_microbatches``, ``pipeline_step``, ``stage_model`` ...) are
re-exported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, NamedTuple

from .comm import DEFAULT_ORDER
from .frameworks import FrameworkProfile, framework_profile
from .memory import activations_in_flight, stage_memory, stage_peak_bytes
from .specs import (ClusterSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload,
                    default_stages, end_slots, stage_floor, validate)
from .stage_cache import _per_stage, _shared, stage_compute_time, stage_model
from .stage_cache import kind_cost as cost_of_kind
from .stage_terms import (LayerSums, LayerTerms, StageCost, StageMesh, StageModel, ZeroSharding, exposed_dp_time,
                          fewest_full_recompute_layers, fp8_recipe_of, head_compute_s, inflight_microbatches,
                          layer_sums, layer_terms, overlapped, pipeline_step, pipeline_step_time, stage_crosses,
                          hand_off_s, interleaved_fill_hops, ep_unpaired_s)

# the names other modules take from here (the rules and caches live in the two modules above)
__all__ = ["Estimate", "LayerSums", "LayerTerms", "PeakInputs", "StageCost", "StageEstimate", "StageKind", "StageMesh",
           "StageModel", "ZeroSharding", "estimate", "exposed_dp_time", "head_compute_s",
           "fewest_full_recompute_layers", "fp8_recipe_of", "hand_off_s", "inflight_microbatches",
           "interleaved_fill_hops", "ep_unpaired_s", "layer_sums", "layer_terms",
           "overlapped", "pipeline_step", "pipeline_step_time", "stage_compute_time", "stage_crosses", "stage_groups",
           "stage_model"]


@dataclass
class StageEstimate:
    index: int
    first_layer: int
    num_layers: int
    recompute_layers: int
    group: str
    time_per_microbatch_s: float
    memory: dict[str, float]
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.memory["peak_bytes"] <= self.capacity_bytes

    def to_dict(self) -> dict:
        return {"layers": [self.first_layer, self.first_layer + self.num_layers],
                "recompute_layers": self.recompute_layers, "device_group": self.group,
                "time_per_microbatch_s": self.time_per_microbatch_s, "memory": dict(self.memory),
                "capacity_bytes": self.capacity_bytes, "fits": self.fits}


@dataclass(eq=False)
class Estimate:
    """One configuration's estimate. ``stages``, every stage's row (``StageEstimate``), is built
    from the stage kinds when first read: what the search asks of most estimates (the step time,
    the peak, whether it fits) is here without them, and equal either way."""

    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory: dict[str, float]
    time: dict[str, float]
    gpus: int = 0
    capacity_bytes: float = 0.0
    bottleneck_stage: int = 0
    fits: bool = True                  # every stage's peak within its capacity
    rows: "list[StageEstimate] | Callable[[], list[StageEstimate]]" = field(default_factory=list, repr=False)

    @property
    def stages(self) -> list[StageEstimate]:
        rows = self.rows
        if callable(rows):
            rows = self.rows = rows()
        return rows

    @property
    def peak_bytes(self) -> float:
        return self.memory["peak_bytes"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Estimate) and self.to_dict() == other.to_dict()

    def to_dict(self, stages: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
            "memory": dict(self.memory), "time": dict(self.time), "fits": self.fits,
            "memory_capacity_bytes": self.capacity_bytes, "bottleneck_stage": self.bottleneck_stage,
        }
        if stages:
            d["stages"] = [s.to_dict() for s in self.stages]
        return d


def stage_groups(cluster: ClusterSpec, par: ParallelConfig, stages: tuple[StageSpec, ...]) -> list[str]:
    """The node group of each stage; checks that every group has room for its stages."""
    per_stage = par.tp * par.dp * par.cp
    names = [s.group or cluster.groups[0].name for s in stages]
    if len(cluster.groups) > 1 and not any(s.group for s in stages):
        # default: fill groups in order, as many stages as each holds
        names = []
        for g in cluster.groups:
            names += [g.name] * (g.gpus // per_stage)
        if len(names) < len(stages):
            raise SpecError(f"the node groups hold {len(names)} stages of tp*dp*cp = {per_stage} GPUs; "
                            f"pp = {len(stages)} needs more")
        names = names[:len(stages)]
    for g in cluster.groups:
        need = names.count(g.name) * per_stage
        if need > g.gpus:
            raise SpecError(f"node group {g.name!r} has {g.gpus} GPUs but its {names.count(g.name)} stage(s) "
                            f"of tp*dp*cp = {per_stage} need {need}")
    for n in names:
        cluster.group(n)
    return names


class StageKind(NamedTuple):
    """What every stage of one kind (``estimate``: same node group, position, neighbour placement,
    layers and recompute) shares: its cost, the inputs of its peak memory besides the
    micro-batches in flight (``PeakInputs``), its layers and node group."""

    cost: StageCost
    peak_inputs: "PeakInputs"
    num_layers: int
    recompute_layers: int
    group: str


class PeakInputs(NamedTuple):
    """A stage kind's part of ``memory.stage_peak_bytes``: its summed model states, activations
    per micro-batch in flight and fixed, the GPU's reserved memory, buffers, and capacity."""

    states_bytes: float
    act_per_microbatch_bytes: float
    act_fixed_bytes: float
    reserved_bytes: float
    buffers_bytes: float
    capacity_bytes: float


# PeakInputs(...) without the keyword handling of its generated __new__ (a third of the cost of
# building one, on the estimate's hot path); the fields in their declared order
_new_tuple = tuple.__new__


def _stage_memory(c: StageCost, peak: PeakInputs, inflight: float) -> dict[str, float]:
    """The memory of a stage of cost ``c`` with ``inflight`` micro-batches in flight (``memory.stage_memory``)."""
    return stage_memory(c.weights_bytes, c.grads_bytes, c.optimizer_bytes,
                        activations_in_flight(inflight, peak.act_per_microbatch_bytes, peak.act_fixed_bytes),
                        peak.reserved_bytes, peak.buffers_bytes)


def _stage_rows(kind_cost: list[StageCost], kind_peak: list[PeakInputs], descs: list[tuple], ids: list[int],
                inflight: list[float], firsts: list[int]) -> list[StageEstimate]:
    """Every stage's row, from its kind (``ids``: each stage's; the kinds' costs, peak inputs and
    ``descs``, ``_Shared.split``'s kind descriptions), micro-batches in flight and first layer."""
    kinds = [StageKind(c, pk, n, n_full, g) for c, pk, (g, _, _, _, n, _, n_full, _) in zip(kind_cost, kind_peak, descs)]
    return [StageEstimate(i, first_layer, k.num_layers, k.recompute_layers, k.group, k.cost.time_s,
                          _stage_memory(k.cost, k.peak_inputs, infl), k.peak_inputs.capacity_bytes)
            for i, (k, infl, first_layer) in enumerate(zip([kinds[k] for k in ids], inflight, firsts))]


def _stage_fill(mem: PeakInputs, inflight: float) -> tuple[bool, float]:
    """Whether a stage with these memory inputs and ``inflight`` micro-batches in flight overflows
    its GPU, and its peak over its capacity (``memory.stage_peak_bytes``)."""
    states, act_per, act_fixed, reserved, buffers, cap = mem
    peak = stage_peak_bytes(states, activations_in_flight(inflight, act_per, act_fixed), reserved, buffers)
    return peak > cap, peak / cap


def estimate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, par: ParallelConfig,
             stages: tuple[StageSpec, ...] | None = None, order: tuple[str, ...] | None = None,
             framework: "str | FrameworkProfile" = "generic") -> Estimate:
    """Memory per GPU and time per step of one training configuration (see module docstring),
    as ``framework`` runs it (``costmodel.frameworks``: its overlaps, kernels, memory headroom).

    Stages with the same node group, position (first, last, middle), neighbour placement and
    layer counts cost the same: each such kind is costed once, then every stage gets its own
    in-flight micro-batches and peak (and, when ``Estimate.stages`` is read, its memory and row)."""
    counts = [s.num_layers for s in stages] if stages is not None else []
    slots = end_slots(par, counts) if counts else 0
    validate(model, cluster, workload, par, slots=slots)
    order = tuple(order or DEFAULT_ORDER)
    sh = _shared(model, cluster, workload, framework_profile(framework))
    m, p, v = par.grad_accum, par.pp, par.vpp
    # stage kinds: (node group, first, last, neighbour on another node, layers, MoE layers,
    # layers recomputed fully, index of the kind's first stage); ids: each stage's kind
    if stages is None and sh.single:
        # the even split on the one node group: p stages of at least vpp layers each, as
        # validate() checked pp * vpp <= layers; they fill the group, as it checked the world size
        stages, firsts, ids, per_stage_of, descs = sh.split(par, order)
    else:
        if stages is None:
            stages = default_stages(model.layers, p)
            counts = [s.num_layers for s in stages]
        if len(stages) != p or sum(counts) != model.layers:
            raise SpecError(f"stage split {counts} must have pp = {p} stages covering all {model.layers} layers")
        if any(n < stage_floor(par, i, slots, counts) for i, n in enumerate(counts)):
            raise SpecError(f"every stage needs at least vpp = {v} layer(s), the first and last one fewer where "
                            f"their end virtual stage holds only the embedding or the loss: {counts}")
        groups = stage_groups(cluster, par, stages)
        firsts, ids, seen, descs = [], [], {}, []
        for i, st in enumerate(stages):
            n = st.num_layers
            key = (groups[i], i == 0, i == p - 1, stage_crosses(cluster, par, order, groups, i), n,
                   model.moe_layers_in(st.first_layer, st.last_layer),
                   par.full_recompute_layers(n, st.recompute_layers))
            k = seen.get(key)
            if k is None:
                k = seen[key] = len(descs)
                descs.append(key + (i,))
            ids.append(k)
            firsts.append(st.first_layer)
        per_stage_of = _per_stage(ids)      # a kind-indexed list -> its value at every stage
    models: dict[str, StageModel] = {}      # per node group, placed at each kind's position in turn
    kind_cost: list[StageCost] = []
    kind_mem: list[PeakInputs] = []
    kind_time, kind_hf, kind_peak = [], [], []      # time per micro-batch, hardware FLOPs, peak FLOP/s
    dp_exposed = opt_s = hop_s = ep_hidden = 0.0
    # each stage's peak (memory.stage_peak_bytes: stage_memory's sum, from the kind's summed
    # states); whether all fit; the stage nearest its capacity (the first of equals). Where the
    # micro-batches in flight never grow along the pipeline and no kind's activations per
    # micro-batch are negative, a kind's peak (nondecreasing in the micro-batches in flight, as
    # activations_in_flight and stage_peak_bytes are in their arguments) is largest at its first
    # stage, the first of its equals: those stages alone decide both, checked as the kinds are
    # costed (in the kinds' order, the order of their first stages); otherwise every stage is
    # checked once all kinds are
    inflight, falling = sh.inflight(par)
    fits, fullest, fullest_ratio = True, 0, -1.0
    least_act: float | None = None          # the kinds' least activations per micro-batch (as min() finds it)
    for g, first, last, crosses, n, n_moe, n_full, i0 in descs:
        sm = models.get(g)
        if sm is None:
            sm = models[g] = StageModel(sh, par, order, sh.groups[g][0])
        # the cost, the exposed DP time at the kind's first stage (it falls with the stage index, so
        # that is the kind's largest) and the summed model states; the step waits for the slowest
        # stage's reduction and optimizer
        c, exposed, states = cost_of_kind(sm.place(first, last, crosses), n - n_moe, n_moe, n_full, i0)
        if exposed > dp_exposed:            # max(dp_exposed, exposed), without the call
            dp_exposed = exposed
        if c.optimizer_s > opt_s:
            opt_s = c.optimizer_s
        if v > 1:
            hop_s = max(hop_s, hand_off_s(c.pp_comm_s, first, last))
        mt = sm.mesh.moe_terms
        if mt is not None and mt.ep_hidden_s > ep_hidden:
            ep_hidden = mt.ep_hidden_s
        kind_cost.append(c)
        act_per, act_fixed, buffers = c.act_per_microbatch_bytes, c.act_fixed_bytes, c.buffers_bytes
        reserved, cap = sm.reserved_bytes, sm.capacity_bytes
        kind_mem.append(_new_tuple(PeakInputs, (states, act_per, act_fixed, reserved, buffers, cap)))
        kind_time.append(c.time_s)
        kind_hf.append(c.hw_flops)
        kind_peak.append(sh.groups[g][2])
        if least_act is None or act_per < least_act:
            least_act = act_per
        if falling:
            over, ratio = _stage_fill(kind_mem[-1], inflight[i0])
            if over:
                fits = False
            if ratio > fullest_ratio:
                fullest, fullest_ratio = i0, ratio
    if not (falling and least_act is not None and least_act >= 0.0):
        fits, fullest, fullest_ratio = True, 0, -1.0
        for i, mem in enumerate(per_stage_of(kind_mem)):
            over, ratio = _stage_fill(mem, inflight[i])
            if over:
                fits = False
            if ratio > fullest_ratio:
                fullest, fullest_ratio = i, ratio
    times = per_stage_of(kind_time)
    # the fill: the interleaved schedule's extra hand-offs, and the EP all-to-alls the overlap leaves
    # unpaired in the warm-up and cool-down (stage_terms.ep_unpaired_s)
    fill_s = interleaved_fill_hops(p, v) * hop_s + ep_unpaired_s(p, v, m, model.moe_layers, ep_hidden)
    step, bubble = pipeline_step_time(m, v, times, dp_exposed, opt_s, fill_s)
    j = times.index(max(times))
    b = kind_cost[ids[j]]
    time = {"compute_s": m * b.compute_s, "recompute_s": m * b.recompute_s, "tp_comm_s": m * b.tp_comm_s,
            "cp_comm_s": m * b.cp_comm_s, "ep_comm_s": m * b.ep_comm_s,
            "dp_comm_s": m * b.fsdp_comm_s + dp_exposed, "pp_comm_s": m * b.pp_comm_s,
            "bubble_s": bubble, "optimizer_s": opt_s}
    gpus = par.world_size
    per_stage = par.tp * par.dp * par.cp
    # summed stage by stage, in order; model FLOPs by their one definition (layers.model_flops_per_token)
    hw_flops_total = sum(per_stage_of(kind_hf)) * per_stage * m
    peak_total = sum(per_stage_of(kind_peak)) * per_stage
    tokens = workload.global_batch * workload.seq_len
    model_flops_total = sh.model_flops_per_token * tokens
    # Estimate(...) by position (keywords cost twice the rest of this block): its fields in order
    return Estimate(step, tokens / step, tokens / step / gpus, model_flops_total / step / gpus / 1e12,
                    hw_flops_total / step / gpus / 1e12, model_flops_total / step / peak_total,
                    hw_flops_total / step / peak_total,
                    _stage_memory(kind_cost[ids[fullest]], kind_mem[ids[fullest]], inflight[fullest]),
                    time, gpus, kind_mem[ids[fullest]].capacity_bytes, j, fits,
                    partial(_stage_rows, kind_cost, kind_mem, descs, ids, inflight, firsts))
