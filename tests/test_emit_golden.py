"""The emitters' golden files are current: `python -m planner.cli.regen_golden` rewrites them after a
deliberate change to an emitter or an example plan, and this test fails until it is run."""
from __future__ import annotations

from planner.cli.regen_golden import GOLDEN, REFUSED, example_plans, expected, on_disk


def test_golden_files_are_current():
    want = expected()
    have = on_disk()
    missing = sorted(set(want) - set(have))
    stale = sorted(set(have) - set(want))
    changed = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    assert not (missing or stale or changed), (
        f"golden files under {GOLDEN} are out of date (missing {missing[:5]}, stale {stale[:5]}, "
        f"changed {changed[:5]}); run `python -m planner.cli.regen_golden` and review the diff")


def test_every_example_has_every_target_of_its_mode():
    from emitters import TARGETS, get
    want = expected()
    for pname, plan in example_plans().items():
        for target in TARGETS:
            has = any(k.startswith(f"{pname}/{target}/") for k in want)
            assert has == (get(target).MODE == plan.mode), (pname, target)


def test_each_target_writes_at_least_one_example():
    """No target refuses every example plan (a golden suite of refusals would prove little)."""
    from emitters import TARGETS
    want = expected()
    for target in TARGETS:
        written = {k.split("/")[0] for k in want if k.split("/")[1] == target and not k.endswith(REFUSED)}
        assert written, f"{target} refuses every example plan"
