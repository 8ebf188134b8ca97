"""The few CP-SAT model calls the pipeline model (``cpsat``) makes, on OR-Tools' compiled helper
alone.

``ortools.sat.python.cp_model`` imports numpy and pandas when it loads (its annotations name
``pd.Index``), 0.35-0.45 CPU s on the team's 2-core machine, more than a whole ``planner
replan`` of a 1,024-GPU plan spends solving; pandas is 0.23 s of it. (numpy stays: the helper
imports it when it builds its first model.) Its ``CpModel`` is a Python layer over
``cp_model_helper.CpBaseModel`` (C++), which builds the same ``CpModelProto``; ``CpSolver.solve``
hands that proto to ``cp_model_helper.SolveWrapper``. This module makes those calls directly:
the model, the parameters and the solver are OR-Tools' own, only the Python layer is left out.

``tests/test_satmodel.py`` holds it to ``cp_model``: the same pipeline models built through
``cp_model.CpModel`` give byte-identical protos, and ``cp_model.CpSolver`` solves them to the same
status and objective. Where the helper lacks a method this relies on (another OR-Tools version),
``MODEL`` is ``cp_model.CpModel`` and everything still works, at the old import cost.
"""
from __future__ import annotations

import numpy  # noqa: F401  (the helper imports it on its first model: here, outside any solve's time limit)
from ortools.sat.python import cp_model_helper as cmh
from ortools.util.python.sorted_interval_list import Domain

OPTIMAL = cmh.CpSolverStatus.OPTIMAL
FEASIBLE = cmh.CpSolverStatus.FEASIBLE
INFEASIBLE = cmh.CpSolverStatus.INFEASIBLE
MODEL_INVALID = cmh.CpSolverStatus.MODEL_INVALID
LinearExpr = cmh.LinearExpr

_NEEDS = ("_add_bounded_linear_expression", "_add_bool_argument_constraint", "_add_linear_argument_constraint",
          "model_proto")


class SatModel(cmh.CpBaseModel):
    """``cp_model.CpModel``'s calls that ``cpsat.PipelineModel`` makes, each building the proto
    as ``CpModel`` does (boolean and integer variables with a domain, linear constraints, exactly
    one, max equality, hints, an integer objective to minimize)."""

    def __init__(self) -> None:
        cmh.CpBaseModel.__init__(self, None)

    @property
    def proto(self):
        return self.model_proto

    def new_int_var(self, lb: int, ub: int, name: str):
        return cmh.IntVar(self.model_proto).with_name(name).with_domain(Domain(lb, ub))

    def new_bool_var(self, name: str):
        return self.new_int_var(0, 1, name)

    def add(self, ct):
        if isinstance(ct, cmh.BoundedLinearExpression):
            return self._add_bounded_linear_expression(ct)
        if isinstance(ct, bool):      # a comparison Python settled (a sum over no variables): or(true) / or()
            return self._add_bool_argument_constraint(cmh.BoolArgumentConstraint.bool_or, *([True] if ct else []))
        raise TypeError(f"SatModel.add takes a linear (in)equality, not {type(ct).__name__}")

    def add_exactly_one(self, *literals):
        return self._add_bool_argument_constraint(cmh.BoolArgumentConstraint.exactly_one, *literals)

    def add_max_equality(self, target, *expressions):
        return self._add_linear_argument_constraint(cmh.LinearArgumentConstraint.max, target, *expressions)

    def add_hint(self, var, value) -> None:
        hint = self.model_proto.solution_hint
        if var.index >= 0:
            hint.vars.append(var.index)
            hint.values.append(int(value))
        else:                               # a negated literal: its variable takes the opposite
            hint.vars.append(-var.index - 1)
            hint.values.append(int(not value))

    def minimize(self, obj) -> None:
        """An integer linear objective (the only kind the pipeline model has)."""
        proto = self.model_proto
        proto.clear_objective()
        proto.clear_floating_point_objective()
        if isinstance(obj, int):
            proto.objective.offset = obj
            proto.objective.scaling_factor = 1.0
            return
        if not (isinstance(obj, cmh.LinearExpr) and obj.is_integer()):
            raise TypeError(f"SatModel.minimize takes an integer linear expression, not {obj!r}")
        flat = cmh.FlatIntExpr(obj)
        for var in flat.vars:
            proto.objective.vars.append(var.index)
        proto.objective.scaling_factor = 1.0
        proto.objective.offset = flat.offset
        proto.objective.coeffs.extend(flat.coeffs)


class Solved:
    """A finished solve: its status, values and CP-SAT's bound (``cp_model.CpSolver``'s reads)."""

    def __init__(self, response):
        self.response = response
        self.status = response.status

    def value(self, expr) -> int:
        return cmh.ResponseHelper.value(self.response, expr)

    @property
    def best_objective_bound(self) -> float:
        return self.response.best_objective_bound


def solve(model, max_time_s: float, num_workers: int = 1, presolve: bool = True) -> Solved:
    """Solve ``model`` (a ``SatModel`` or a ``cp_model.CpModel``: both hold a ``CpModelProto``)
    with OR-Tools' solver, as ``cp_model.CpSolver().solve`` does with these parameters."""
    params = cmh.SatParameters()
    params.max_time_in_seconds = max_time_s
    params.num_workers = num_workers
    params.cp_model_presolve = presolve
    wrapper = cmh.SolveWrapper()
    wrapper.set_parameters(params)
    return Solved(wrapper.solve(model.proto))


def _usable() -> bool:
    return all(hasattr(cmh.CpBaseModel, n) for n in _NEEDS) and hasattr(cmh, "SolveWrapper") \
        and hasattr(cmh, "FlatIntExpr")


MODEL: type
if _usable():
    MODEL = SatModel
else:                                       # pragma: no cover - another OR-Tools version
    from ortools.sat.python import cp_model
    MODEL = cp_model.CpModel
