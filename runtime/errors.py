"""The runtime's error types for what a user can cause (exit 2, one line, no traceback).

Kept free of torch so that refusing bad input costs no torch import.
"""
from __future__ import annotations


class RuntimeUsageError(ValueError):
    """Bad flags or an unusable input for the runtime."""


class PlanNotRunnable(ValueError):
    """The plan asks for something this runtime cannot run here; the message has the numbers."""


class RuntimeModelError(ValueError):
    """A model the runtime cannot build; the message says which field and why."""


class DataError(ValueError):
    """A token file that cannot be used (missing, too short, ids beyond the vocabulary)."""


class CheckpointMismatch(ValueError):
    """A checkpoint of another model or workload; the message names what differs."""


__all__ = ["RuntimeUsageError", "PlanNotRunnable", "RuntimeModelError", "DataError", "CheckpointMismatch"]
