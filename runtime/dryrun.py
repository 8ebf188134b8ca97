"""Dry run: build every rank's shards of a plan in one process, on the meta device, with no
communication, and count what each rank holds.

``python -m runtime.dryrun --plan PLAN [--ranks 0,5,63 | --ranks all] [--json]``

For each simulated rank this joins torch's ``"fake"`` process group (``FakeStore``: every
collective returns at once) as that rank of the plan's world, builds the mesh, the model parts
of that rank's pipeline stages and applies the same parallel pass as the real run
(``runtime.train.Trainer``: TP, experts, activation checkpointing, FSDP/DDP), all on the meta
device, so a 70B model on 64 ranks costs seconds and no memory. It reports, per rank:

* ``dense_params`` / ``expert_params``: elements after TP and EP sharding, before ZeRO (what
  ``costmodel.memory.stage_param_counts`` predicts);
* ``dense_local`` / ``expert_local``: elements this rank stores after FSDP sharding;
* ``param_bytes``, ``grad_bytes``, ``optimizer_bytes``: the runtime's own model-state bytes
  (fp32 master parameters, fp32 gradients sharded like them under ZeRO >= 2, and the
  optimizer's per-parameter states).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from costmodel.units import GIB


def _local_numel(p) -> int:
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def _counts(parts) -> tuple[int, int]:
    dense = expert = 0
    seen = set()
    for part in parts:
        for name, p in part.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if ".moe.experts." in name:
                expert += _local_numel(p)
            else:
                dense += _local_numel(p)
    return dense, expert


def simulate_rank(plan, rank: int) -> dict[str, Any]:
    """One rank's shards, built on the meta device under the fake process group."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from .model import build_model
    from .parallel import Dims, apply_ac, apply_dp, apply_experts, apply_tp, build_mesh, recompute_layers
    from .pipeline import stage_ids, virtual_stage_layers

    spec, par, wl = plan.model, plan.parallel, plan.workload
    world = plan.world_size
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        dims = Dims.from_plan(spec, par, plan.mesh_order, wl.seq_len, wl.global_batch, world)
        mesh = build_mesh(dims, "cpu")
        pp_rank = mesh["pp"].get_local_rank()
        vstages = virtual_stage_layers(plan.stages, par, spec.layers)
        st = plan.stages[pp_rank]
        budget = recompute_layers(par, st.num_layers, st.recompute_layers)
        parts = []
        for sidx in stage_ids(pp_rank, par):
            with torch.device("meta"):
                part = build_model(spec, layers=vstages[sidx], embed=sidx == 0, head=sidx == len(vstages) - 1)
            if dims.tp > 1:
                apply_tp(part, mesh["tp"], spec, dims.sp)
            if spec.is_moe:
                apply_experts(part, mesh, dims)
            parts.append(part)
        dense_tp, expert_tp = _counts(parts)
        for part in parts:
            n_full = min(budget, len(part.layers))
            budget -= n_full
            apply_ac(part, n_full, par.recompute == "selective")
            apply_dp(part, mesh, dims, pp_enabled=par.pp > 1, mp_dtype=None)
        dense_local, expert_local = _counts(parts)
        local = dense_local + expert_local
        opt_states = {"adamw": 2, "adam": 2, "sgd": 1}[wl.optimizer]
        return {
            "rank": rank, "pp_rank": pp_rank, "stages": stage_ids(pp_rank, par),
            "coordinates": dict(zip(mesh.mesh_dim_names, mesh.get_coordinate() or [])),
            "dense_params": dense_tp, "expert_params": expert_tp,
            "dense_local": dense_local, "expert_local": expert_local,
            "param_bytes": 4 * local,
            # gradients are sharded like the parameters (ZeRO >= 2) or whole like them (DDP);
            # ZeRO-1 runs as DDP here, so its optimizer states are not sharded either
            "grad_bytes": 4 * local,
            "optimizer_bytes": 4 * opt_states * local,
        }
    finally:
        dist.destroy_process_group()


def simulate(plan, ranks: list[int]) -> list[dict[str, Any]]:
    import warnings
    warnings.filterwarnings("ignore")
    return [simulate_rank(plan, r) for r in ranks]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.dryrun", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True)
    p.add_argument("--ranks", default="0", help="comma-separated ranks, or 'all' (default 0)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from planner.plan.planfile import PlanError, read_plan

    from .errors import PlanNotRunnable
    try:
        plan = read_plan(args.plan)
        ranks = list(range(plan.world_size)) if args.ranks == "all" else [int(r) for r in args.ranks.split(",")]
        bad = [r for r in ranks if not 0 <= r < plan.world_size]
        if bad:
            raise PlanError(f"--ranks {bad}: the plan has ranks 0..{plan.world_size - 1}")
        out = simulate(plan, ranks)
    except (PlanError, PlanNotRunnable, ValueError) as e:
        print(f"runtime.dryrun: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for r in out:
            print(f"rank {r['rank']:>5} stage(s) {r['stages']}: {r['dense_params'] + r['expert_params']:,} params after "
                  f"TP/EP, {r['dense_local'] + r['expert_local']:,} stored; params {r['param_bytes'] / GIB:.2f} GiB, "
                  f"grads {r['grad_bytes'] / GIB:.2f} GiB, optimizer {r['optimizer_bytes'] / GIB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
