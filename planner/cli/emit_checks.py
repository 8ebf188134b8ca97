"""What ``planner emit`` checks before it writes anything: the plan's own checks (those
``planner explain`` runs, ``planner.plan.check``) and each emit target's table
(``planner.plan.targets``); and the command that plans for a target, appended to every
refusal. Exit codes: 0 every target written; 1 nothing written (a failed check, or every
target refused); ``PARTIAL`` (4) with ``--target all`` when some targets were written and
others refused."""
from __future__ import annotations

from planner.plan import targets as T
from planner.plan.check import check_plan
from planner.cli import target_notes
from planner.plan.errors import CheckFailed

PARTIAL = 4

def default_target(plan) -> str | None:
    """The emit target for a plan made for ``plan.target`` (None: the plan names no target with
    an emitter, e.g. an older plan file or ``generic``): the emit target whose module is the
    target record's emitter (the built-in runtime's, training or serving, is torchrun's)."""
    from emitters import TARGETS
    if not plan.target or plan.target == T.GENERIC:
        return None
    try:
        module = T.record(plan.target, plan.mode).emitter
    except KeyError:
        return None
    return next((name for name, mod in TARGETS.items() if mod == module), None)


def require_valid(plan, plan_path: str) -> None:
    """Refuse (exit 1) a plan that fails its own checks, before any target is asked."""
    bad = check_plan(plan)
    if bad:
        target = plan.target if plan.target and plan.target != T.GENERIC else (
            "builtin" if plan.mode == "train" else "vllm")
        raise CheckFailed(f"{plan_path} fails the plan checks (`planner explain` runs them): {'; '.join(bad)}; "
                          f"plan it again: `{target_notes.plan_command(plan, target, plan_path)}`")


def refusal(name: str, plan, plan_path: str) -> str | None:
    """Why emit target ``name`` cannot run ``plan`` (its table), with the command that plans
    one it runs; None when the table has no objection."""
    if plan.mode not in ("train", "infer"):
        return None
    table = T.TRAIN if plan.mode == "train" else T.SERVE
    if name not in table:
        return None
    why = [m.split(": ", 1)[1] if m.startswith(f"{name}: ") else m for m in T.problems(name, plan)]
    if not why:
        return None
    return with_command(f"{name} cannot run this plan: " + "; ".join(why), name, plan, plan_path)


def with_command(message: str, name: str, plan, plan_path: str) -> str:
    return f"{message}; a plan {name} runs: `{target_notes.plan_command(plan, name, plan_path)}`"


def note_target(plan, name: str) -> str | None:
    """A note when the plan was made (and priced) for another target than the one it is
    emitted for."""
    made = plan.target or ""
    runs = T.TRAIN[name].runs if plan.mode == "train" and name in T.TRAIN else name
    if made and made != T.GENERIC and made != runs and made != name:
        return (f"note: the plan was made for {made}; {name} runs it with {runs}, so its estimate is "
                f"{made}'s (re-plan with --target {name} for {runs}'s)")
    if made == T.GENERIC:
        return f"note: the plan was made for no framework (--target {T.GENERIC}); its estimate assumes none"
    return None
