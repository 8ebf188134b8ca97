"""The example plans in plans/ are current (re-solved and compared) and pass the checker."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.plan.check import check_plan
from planner.cli.examples import EXAMPLES, main
from planner.plan.planfile import read_plan

PLANS = Path(__file__).resolve().parents[1] / "plans"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_plan_is_valid(name):
    plan = read_plan(PLANS / f"{name}.yaml")
    assert check_plan(plan) == []
    assert plan.solver["status"] == "OPTIMAL"


@pytest.mark.solver
def test_examples_are_current():
    assert main(["--check"]) == 0, "run `python -m planner.cli.examples`"
