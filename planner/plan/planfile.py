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
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from costmodel.specs import (MESH_AXES, ClusterSpec, ModelSpec, ParallelConfig, SpecError, StageSpec, Workload,
                             default_stages)  # noqa: F401  (re-exported: the plan file's readers use it)
from costmodel.comm import crosses_nodes
from costmodel.limits import describe
from costmodel.files.clusters import cluster_from_dict, cluster_to_dict
from costmodel.files.readers import parse_yaml, read_text
from costmodel.files.version import tool_version

SCHEMA = 1

DEFAULT_ORDER = MESH_AXES            # outermost first; also the set of mesh-axis names
MESH_DIMS = frozenset(MESH_AXES)
# every section a plan file holds, in the order it is written (a file cut short lacks the last ones)
SECTIONS = ("model", "cluster", "workload", "parallel", "mesh", "stages", "estimate", "solver", "provenance")


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
    target: str = ""                 # the framework planned for (planner.plan.targets); "" in older files
    # serving plans: the batching the figures assume, the engine's scheduler settings, the model's
    # Hugging Face id, and for disaggregated plans the prefill pool (``parallel`` is then the
    # decode pool); see planner/cli/infer_plan.py. Empty for training plans.
    serving: Mapping[str, Any] = field(default_factory=dict)
    # the target framework's settings the price rests on and its files write (compile, async_tp,
    # partition_method, ...: planner.plan.targets.SWITCHES); empty: each at its default
    framework: Mapping[str, Any] = field(default_factory=dict)

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
        """Which ranks share a node, and which mesh dims stay inside one NVLink domain (a host,
        or a multi-host domain such as NVL72): ``comm.crosses_nodes``, the cost model's rule."""
        gpn = self.cluster.gpus_per_node
        degrees = {d: self.degree(d) for d in self.mesh_order}
        inside = [d for d in self.mesh_order
                  if degrees[d] > 1 and not crosses_nodes(degrees, tuple(self.mesh_order), d, self.cluster.nvlink_gpus)]
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
        **({"target": plan.target} if plan.target else {}),
        **({"framework": dict(plan.framework)} if plan.framework else {}),
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
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise PlanError(f"{where}: schema must be an integer, got {describe(schema)}")
    if schema > SCHEMA:
        raise PlanError(f"{where}: schema {schema} is newer than this planner understands ({SCHEMA}); "
                        "upgrade the planner")
    if schema < 1:
        raise PlanError(f"{where}: schema {schema} is not a plan schema (this planner reads 1..{SCHEMA}); "
                        "write the plan again with `planner plan --out`")
    missing = [k for k in SECTIONS if k not in d]
    if missing:
        raise PlanError(f"{where}: missing section(s) {', '.join(missing)} (truncated file?)")
    for k in ("mesh", "estimate", "solver", "provenance"):
        if not isinstance(d[k], Mapping):        # an empty section is {}; nothing at all is a cut file
            raise PlanError(f"{where}: section {k!r} must be a mapping, got {describe(d[k])} (truncated file?)")
    check_estimate(d["estimate"], where)
    groups = d["cluster"].get("groups") if isinstance(d["cluster"], Mapping) else None
    if isinstance(d["cluster"], Mapping) and ("extends" in d["cluster"] or any(
            isinstance(g, Mapping) and "extends" in g for g in (groups if isinstance(groups, list) else []))):
        raise PlanError(f"{where}: cluster: a plan holds its cluster in full, without 'extends' (which would read "
                        "another file); write the plan again with `planner plan --out`")
    try:
        model = ModelSpec.from_dict(d["model"], f"{where}.model")
        cluster = cluster_from_dict(d["cluster"], f"{where}.cluster")
        workload = Workload.from_dict(d["workload"], f"{where}.workload")
        par = ParallelConfig.from_dict(d["parallel"], f"{where}.parallel")
        if d.get("mode", workload.mode) != workload.mode:
            raise PlanError(f"{where}: mode {describe(d['mode'])} but workload.mode {workload.mode!r}; "
                            "which is it? (write the plan again with `planner plan --out`)")
        stages = _stages(d["stages"], model, cluster, where)
        order = tuple((d.get("mesh") or {}).get("order", DEFAULT_ORDER))
        target = d.get("target") or ""
        if target:
            from planner.plan.targets import check_name
            check_name(str(target), workload.mode)
        switches = d.get("framework") or {}
        if not isinstance(switches, Mapping):
            raise PlanError(f"{where}: framework must be a mapping of settings (compile: true, ...), got "
                            f"{describe(switches)}")
        if switches and target:
            from planner.plan.targets import switch_problems
            bad = switch_problems(str(target), par, switches, model, workload, cluster.groups[0].gpu)
            if bad:
                raise PlanError(f"{where}: " + "; ".join(bad))
        return Plan(model=model, cluster=cluster, workload=workload, parallel=par, stages=tuple(stages),
                    mesh_order=order, estimate=d.get("estimate") or {}, solver=d.get("solver") or {},
                    provenance=d.get("provenance") or {}, schema=schema, target=str(target),
                    serving=d.get("serving") or {}, framework=dict(switches))
    except (SpecError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, PlanError):
            raise
        msg = str(e)
        raise PlanError(msg if msg.startswith(where) else f"{where}: {msg}") from None


# The figures of a stored estimate that the tools read back. Each is a finite number >= 0 or the
# plan is refused (untyped: a string, a list); whether it is *true* is found by recomputing it
# (``estimate_drift``), which only warns: a cost-model change must not make saved plans unreadable.
ESTIMATE_FIGURES = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                    "hardware_tflops_per_gpu", "mfu", "hfu", "memory_capacity_bytes", "ttft_s", "tpot_s",
                    "output_tokens_per_s", "output_tokens_per_s_per_gpu")
ESTIMATE_SECTIONS = ("memory", "time")       # mappings of name -> number
DRIFT_TOLERANCE = 0.01                       # 1 %: more is a changed cost model or an edited file


def _figure_problem(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"must be a number, got {describe(v)}"
    if not math.isfinite(v) or v < 0:
        return f"must be a finite number >= 0, got {v!r}"
    return None


def check_estimate(est: Mapping[str, Any], where: str) -> None:
    """Refuse a stored estimate whose figures are not numbers (see ``ESTIMATE_FIGURES``)."""
    hint = "; it is recomputed from the plan: delete the estimate section, or write the plan again"
    for k in ESTIMATE_FIGURES:
        if k in est:
            bad = _figure_problem(est[k])
            if bad:
                raise PlanError(f"{where}: estimate.{k} {bad}{hint}")
    for sec in ESTIMATE_SECTIONS:
        if sec not in est:
            continue
        if not isinstance(est[sec], Mapping):
            raise PlanError(f"{where}: estimate.{sec} must be a mapping of numbers, got {describe(est[sec])}{hint}")
        for k, v in est[sec].items():
            bad = _figure_problem(v)
            if bad:
                raise PlanError(f"{where}: estimate.{sec}.{k} {bad}{hint}")


def estimate_drift(plan: "Plan", fresh: Mapping[str, float], where: str) -> str | None:
    """A warning when the plan's stored figures differ from ``fresh`` (the same figures recomputed
    by this planner) by more than ``DRIFT_TOLERANCE``, naming the planner version that wrote them;
    None when they agree (or the plan stores none of them)."""
    diffs = []
    for k, now in fresh.items():
        was = plan.estimate.get(k)
        if was is None or _figure_problem(was) or not math.isfinite(now):
            continue
        if abs(was - now) > DRIFT_TOLERANCE * max(abs(now), 1e-300):
            diffs.append(f"{k} {was:.4g} stored vs {now:.4g} now")
    if not diffs:
        return None
    wrote = (plan.provenance or {}).get("planner", "an unknown version")
    return (f"{where}: the stored estimate differs from this planner's ({tool_version()}) by more than "
            f"{DRIFT_TOLERANCE:.0%} ({'; '.join(diffs[:3])}); it was written by planner {str(wrote)[:40]!r} "
            "(or edited): the figures shown are recomputed; write the plan again with `planner plan --like` to "
            "refresh it")


_STAGE_KEYS = {"layers", "recompute_layers", "device_group"}


def _stages(rows: Any, model: ModelSpec, cluster: ClusterSpec, where: str) -> list[StageSpec]:
    """The stage split: contiguous from layer 0, covering the model, recompute counts within each
    stage, node groups of the cluster (refused here, before a launch starts any process)."""
    if not isinstance(rows, list) or not rows:
        raise PlanError(f"{where}: stages must list at least one stage, got {describe(rows)}")
    groups = {g.name for g in cluster.groups}
    stages, first = [], 0
    for i, s in enumerate(rows):
        sw = f"{where}.stages[{i}]"
        if not isinstance(s, Mapping):
            raise PlanError(f"{sw}: expected a mapping with layers, recompute_layers, device_group")
        unknown = sorted(str(k) for k in set(s) - _STAGE_KEYS)
        if unknown:
            raise PlanError(f"{sw}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_STAGE_KEYS))}")
        span, rl, grp = s.get("layers"), s.get("recompute_layers", 0), s.get("device_group", "")
        if (not isinstance(span, list) or len(span) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in span)):
            raise PlanError(f"{sw}: layers must be [first, end] (two integers), got {describe(span)}")
        lo, hi = span
        if lo != first or hi <= lo:
            raise PlanError(f"{sw}: layers [{lo}, {hi}] must start at layer {first} and hold at least one layer "
                            "(stages are contiguous from layer 0)")
        if isinstance(rl, bool) or not isinstance(rl, int) or not 0 <= rl <= hi - lo:
            raise PlanError(f"{sw}: recompute_layers must be an integer in 0..{hi - lo} (the stage's layers), "
                            f"got {describe(rl)}")
        if not isinstance(grp, str) or (grp and grp not in groups):
            raise PlanError(f"{sw}: device_group {describe(grp)} is not a node group of the plan's cluster "
                            f"({', '.join(sorted(groups))})")
        stages.append(StageSpec(first_layer=lo, num_layers=hi - lo, recompute_layers=rl, group=grp))
        first = hi
    if first != model.layers:
        raise PlanError(f"{where}: the stages cover layers 0..{first}; {model.name} has {model.layers}")
    return stages


def read_plan(path: str | os.PathLike) -> Plan:
    """A plan file, read through ``costmodel.files.readers`` (bounded, UTF-8, no alias bomb, finite)."""
    p = Path(path)
    try:
        d = parse_yaml(read_text(p, "plan file"), str(p))
    except SpecError as e:
        raise PlanError(str(e).replace("not valid YAML (", "not valid YAML (truncated?) (", 1)) from None
    return plan_from_dict(d, str(p))


def dump_plan(plan: Plan) -> str:
    return yaml.safe_dump(plan_to_dict(plan), sort_keys=False, default_flow_style=None, width=110)


def write_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Atomic write with the user's umask, to a regular file only (``costmodel.files.safeio``): a crash
    never leaves a half-written plan, and a link, FIFO or device at ``path`` is refused."""
    from costmodel.files.safeio import write_text
    return write_text(path, dump_plan(plan), "plan file")


def provenance(cluster_source: str = "catalog") -> dict:
    try:
        import ortools
        ort = ortools.__version__
    except Exception:  # pragma: no cover - ortools is a dependency
        ort = "unknown"
    return {"planner": tool_version(), "ortools": ort,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cluster_source": cluster_source}
