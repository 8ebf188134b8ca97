"""Pipeline parallel: the plan's stage split, the virtual stages of each rank, the schedule.

The plan lists ``pp`` stages, one per pipeline rank, with their layer counts (possibly uneven).
With ``vpp > 1`` (interleaved 1F1B) a rank's layers are cut into ``vpp`` chunks, and the model
runs through virtual stages ``0 .. pp*vpp-1`` in order, virtual stage ``v*pp + r`` living on
rank ``r`` (torchtitan's "loop" style). Virtual stage ``s`` holds the next ``count[r][v]``
layers, where ``count[r]`` splits rank ``r``'s layers as evenly as possible (the extra ones
first). So the layers on a rank are the plan's count, but with ``vpp > 1`` not contiguous:
the plan's ``first_layer`` fields only hold for ``vpp == 1``.

The embedding lives on virtual stage 0 (rank 0), the final norm and head on the last one
(rank ``pp - 1``).
"""
from __future__ import annotations

from costmodel.specs import ParallelConfig, StageSpec


def virtual_stage_layers(stages: tuple[StageSpec, ...], par: ParallelConfig, layers: int) -> list[list[int]]:
    """Global layer ids of each virtual stage, in pipeline order."""
    pp, vpp = par.pp, par.vpp
    total = sum(s.num_layers for s in stages)
    if len(stages) != pp or total != layers:
        raise ValueError(f"stage split {[s.num_layers for s in stages]} must have pp = {pp} stages and "
                         f"{layers} layers in all (has {total})")
    if vpp == 1:
        return [list(range(s.first_layer, s.last_layer)) for s in stages]
    counts = []
    for r, s in enumerate(stages):
        if s.num_layers < vpp:
            raise ValueError(f"stage {r} has {s.num_layers} layers, fewer than vpp = {vpp} virtual stages")
        base, extra = divmod(s.num_layers, vpp)
        counts.append([base + (1 if v < extra else 0) for v in range(vpp)])
    out, nxt = [], 0
    for sidx in range(pp * vpp):
        r, v = sidx % pp, sidx // pp
        out.append(list(range(nxt, nxt + counts[r][v])))
        nxt += counts[r][v]
    return out


def stage_ids(pp_rank: int, par: ParallelConfig) -> list[int]:
    return [pp_rank + v * par.pp for v in range(par.vpp)]


def schedule_class(name: str):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[name]


def build_schedule(pipeline_stages: list, par: ParallelConfig, loss_fn):
    cls = schedule_class(par.schedule)
    if par.schedule == "interleaved":
        return cls(pipeline_stages, n_microbatches=par.grad_accum, loss_fn=loss_fn, scale_grads=True)
    assert len(pipeline_stages) == 1, "single-stage schedules hold one stage per rank"
    return cls(pipeline_stages[0], n_microbatches=par.grad_accum, loss_fn=loss_fn, scale_grads=True)


__all__ = ["virtual_stage_layers", "stage_ids", "schedule_class", "build_schedule"]
