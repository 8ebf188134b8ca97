"""The solver-independent plan checker: the specification a plan must meet, whoever made it.

``check_plan`` returns every problem it finds (empty means valid): degrees that do not divide
what they split, a world size that is not the cluster's, a stage split that is not contiguous
or does not cover the model, recompute counts out of range, node groups over capacity, and any
stage whose memory (by the cost model, as the plan's target runs it) exceeds its GPU. Every solver
test runs it.
"""
from __future__ import annotations

from costmodel.specs import SpecError, end_slots, stage_floor, validate
from costmodel.training import estimate, stage_groups
from costmodel.units import GIB
from planner.plan.planfile import Plan

MEMORY_TOLERANCE = 1e-6   # relative; float re-evaluation of the same plan


def check_plan(plan: Plan) -> list[str]:
    problems: list[str] = []
    par, model = plan.parallel, plan.model
    counts = [st.num_layers for st in plan.stages]
    slots = end_slots(par, counts)
    try:
        # a disaggregated serving plan's parallel is its decode pool (the prefill pool: plan.serving)
        validate(model, plan.cluster, plan.workload, par,
                 gpus=par.world_size if plan.world_size != par.world_size else None, slots=slots)
    except SpecError as e:
        problems.append(str(e))
    stages = plan.stages
    if len(stages) != par.pp:
        problems.append(f"{len(stages)} stages for pp = {par.pp}")
    first = 0
    for i, st in enumerate(stages):
        if st.first_layer != first:
            problems.append(f"stage {i} starts at layer {st.first_layer}, expected {first} (stages must be contiguous)")
        if st.num_layers < stage_floor(par, i, slots, counts):
            problems.append(f"stage {i} holds {st.num_layers} layers; needs at least vpp = {par.vpp}"
                            + (" (an end stage one fewer, its end virtual stage holding only the embedding or the loss)"
                               if par.pp > 1 and par.vpp > 1 and i in (0, par.pp - 1) else ""))
        if not 0 <= st.recompute_layers <= st.num_layers:
            problems.append(f"stage {i} recomputes {st.recompute_layers} of {st.num_layers} layers")
        first = st.first_layer + st.num_layers
    if first != model.layers:
        problems.append(f"the stages cover {first} layers; {model.name} has {model.layers}")
    try:
        stage_groups(plan.cluster, par, stages)
    except SpecError as e:
        problems.append(str(e))
    if problems:
        return problems
    if plan.mode == "infer":
        return problems
    # priced as the plan's target runs it (its memory headroom, its copies), as the solver priced it
    # (planner.search.target_space.framework_kwargs; that package imports this one)
    from planner.plan import targets as T
    fw = {"framework": T.profile_for(plan.target, plan.framework)} if plan.target and plan.target != T.GENERIC else {}
    est = estimate(model, plan.cluster, plan.workload, par, stages=stages, order=plan.mesh_order, **fw)
    for s in est.stages:
        peak, cap = s.memory["peak_bytes"], s.capacity_bytes
        if peak > cap * (1 + MEMORY_TOLERANCE):
            problems.append(f"stage {s.index} needs {peak / GIB:.2f} GiB per GPU; its GPUs have "
                            f"{cap / GIB:.2f} GiB")
    return problems
