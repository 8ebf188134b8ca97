"""Error types a user can cause, each with its documented exit code.

0 done; 1 no feasible plan or a failed check; 2 bad usage or input; 3 solver stopped before
any solution; 70 (``EXIT_BUG``, sysexits' EX_SOFTWARE) an internal error: a bug, reported as one
line asking for a report (the traceback with ``--debug``).
"""
from __future__ import annotations

from costmodel.specs import SpecError


EXIT_BUG = 70


class PlannerError(Exception):
    exit_code = 2


class UsageError(PlannerError):
    """Bad flags or input (exit 2)."""
    exit_code = 2


class InfeasibleError(PlannerError):
    """No plan satisfies the constraints (exit 1); the message says what binds and what would help."""
    exit_code = 1


class CheckFailed(PlannerError):
    """A check on a plan or a run failed (exit 1)."""
    exit_code = 1


class SolverStopped(PlannerError):
    """The solver stopped before it found any solution (exit 3)."""
    exit_code = 3


def exit_code_for(e: BaseException) -> int | None:
    """The exit code for an expected error, or None for a programmer error."""
    from planner.plan.planfile import PlanError
    from costmodel.files.safeio import OutputError
    if isinstance(e, PlannerError):
        return e.exit_code
    if isinstance(e, (SpecError, PlanError, OutputError)):
        return 2
    return None
