"""The plan file: the one seam between planning and running.

A plan is a self-contained YAML document (schema ``SCHEMA``): the model, the cluster it was
planned for, the workload, the parallel degrees, the mesh order and rank layout, the pipeline
stage split, the predicted estimate, the solver's status and provenance. Every emitter and the
runtime read only this. ``read_plan`` refuses files that are not plans, are from a newer schema,
or are truncated, with ``PlanError`` naming the problem.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from costmodel.specs import (MESH_AXES, ClusterSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload,
                             default_stages)
from profiles.clusters import cluster_from_dict, cluster_to_dict
from profiles.version import tool_version

SCHEMA = 1
DEFAULT_ORDER = MESH_AXES            # outermost first; also the set of mesh-axis names
MESH_DIMS = frozenset(MESH_AXES)


class PlanError(ValueError):
    """A plan file that cannot be used; the message names the problem."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    parallel: ParallelConfig
    stages: tuple[StageSpec, ...]
    mesh_order: tuple[str, ...] = DEFAULT_ORDER
    estimate: Mapping[str, Any] = field(default_factory=dict)
    solver: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA
    # serving plans: the batching the figures assume, the engine's scheduler settings, the model's
    # Hugging Face id, and for disaggregated plans the prefill pool (``parallel`` is then the
    # decode pool); see planner/cli/infer_plan.py. Empty for training plans.
    serving: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if sorted(self.mesh_order) != sorted(DEFAULT_ORDER):
            raise PlanError(f"mesh order {list(self.mesh_order)} must be a permutation of {list(DEFAULT_ORDER)}")
        if len(self.stages) != self.parallel.pp:
            raise PlanError(f"{len(self.stages)} stages but pp = {self.parallel.pp}")

    @property
    def mode(self) -> str:
        return self.workload.mode

    @property
    def world_size(self) -> int:
        pre = (self.serving or {}).get("disaggregation", {}).get("prefill") if self.serving else None
        return self.parallel.world_size + (int(pre["tp"]) * int(pre["pp"]) * int(pre["replicas"]) if pre else 0)

    def degree(self, dim: str) -> int:
        return getattr(self.parallel, dim)

    def rank_layout(self) -> dict[str, Any]:
        """Which ranks share a node, and which mesh dims stay inside one node."""
        gpn = self.cluster.gpus_per_node
        inside = []
        stride = 1
        for dim in reversed(self.mesh_order):
            span = stride * self.degree(dim)
            if self.degree(dim) > 1 and span <= gpn:
                inside.append(dim)
            stride = span
        n = self.world_size
        return {"gpus_per_node": gpn, "nodes": -(-n // gpn), "within_node": sorted(inside),
                "tp_within_node": self.parallel.tp == 1 or "tp" in inside}

    def replace(self, **kw) -> "Plan":
        return dataclasses.replace(self, **kw)


# --------------------------------------------------------------------------------------
# dict <-> Plan
# --------------------------------------------------------------------------------------

def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):   # numpy scalars
        return x.item()
    return x


def plan_to_dict(plan: Plan) -> dict:
    layout = plan.rank_layout()
    return _jsonable({
        "schema": plan.schema,
        "mode": plan.mode,
        "model": plan.model.to_dict(),
        "cluster": cluster_to_dict(plan.cluster),
        "workload": plan.workload.to_dict(),
        "parallel": plan.parallel.to_dict(),
        "mesh": {"order": list(plan.mesh_order), **layout},
        "stages": [s.to_dict() for s in plan.stages],
        "estimate": dict(plan.estimate),
        "solver": dict(plan.solver),
        "provenance": dict(plan.provenance),
        **({"serving": dict(plan.serving)} if plan.serving else {}),
    })


def plan_from_dict(d: Any, where: str = "plan") -> Plan:
    if not isinstance(d, Mapping):
        raise PlanError(f"{where}: not a plan file (expected a mapping with 'schema', 'model', 'parallel', ...)")
    if "schema" not in d:
        raise PlanError(f"{where}: not a plan file (no 'schema' key)")
    schema = d["schema"]
    if not isinstance(schema, int):
        raise PlanError(f"{where}: schema must be an integer, got {schema!r}")
    if schema > SCHEMA:
        raise PlanError(f"{where}: schema {schema} is newer than this planner understands ({SCHEMA}); "
                        "upgrade the planner")
    missing = [k for k in ("model", "cluster", "workload", "parallel", "stages") if k not in d]
    if missing:
        raise PlanError(f"{where}: missing section(s) {', '.join(missing)} (truncated file?)")
    try:
        model = ModelSpec.from_dict(d["model"], f"{where}.model")
        cluster = cluster_from_dict(d["cluster"], f"{where}.cluster")
        workload = Workload.from_dict(d["workload"], f"{where}.workload")
        par = ParallelConfig.from_dict(d["parallel"], f"{where}.parallel")
        stages = []
        for i, s in enumerate(d["stages"] or []):
            lo, hi = s["layers"]
            stages.append(StageSpec(first_layer=int(lo), num_layers=int(hi) - int(lo),
                                    recompute_layers=int(s.get("recompute_layers", 0)),
                                    group=str(s.get("device_group", ""))))
        order = tuple((d.get("mesh") or {}).get("order", DEFAULT_ORDER))
        return Plan(model=model, cluster=cluster, workload=workload, parallel=par, stages=tuple(stages),
                    mesh_order=order, estimate=d.get("estimate") or {}, solver=d.get("solver") or {},
                    provenance=d.get("provenance") or {}, schema=schema, serving=d.get("serving") or {})
    except (SpecError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, PlanError):
            raise
        raise PlanError(f"{where}: {e}") from None


def read_plan(path: str | os.PathLike) -> Plan:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise PlanError(f"cannot read plan file {p}: {e.strerror}") from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlanError(f"{p}: not valid YAML (truncated?): {str(e).splitlines()[0]}") from None
    return plan_from_dict(d, str(p))


def dump_plan(plan: Plan) -> str:
    return yaml.safe_dump(plan_to_dict(plan), sort_keys=False, default_flow_style=None, width=110)


def write_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Atomic write: a crash never leaves a half-written plan."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(dump_plan(plan))
    os.replace(tmp, p)
    return p


def provenance(cluster_source: str = "catalog") -> dict:
    try:
        import ortools
        ort = ortools.__version__
    except Exception:  # pragma: no cover - ortools is a dependency
        ort = "unknown"
    return {"planner": tool_version(), "ortools": ort,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cluster_source": cluster_source}
