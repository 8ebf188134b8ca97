"""Stragglers: a rank whose step takes more than ``factor`` times the median rank's for ``steps``
steps in a row is reported, with the host it runs on.

What is measured. In synchronous training every rank's wall-clock step is the slowest rank's
(the collectives wait for it), so a straggler shows in the time each rank spends *working*: on
the CPU the process's CPU time over the step (a rank blocked in a gloo collective sleeps on its
socket and burns none; a slow rank burns more for the same work, and CPU time is immune to the
other processes sharing the cores), on GPUs the wall time until the rank reaches the step's end
(the waits inside the step's collectives count there too: a GPU straggler shows less sharply).
Every rank exchanges its figure once a step (one all-reduce of ``world`` floats), so every rank
reaches the same verdict at the same step.

``--inject-failure rank=R,slow=X[,step=S]`` makes rank R X times slower from step S on: after
its own work it keeps its CPU busy for ``(X - 1)`` times that work (a device that computes
slower, not one that waits).

Pure bookkeeping apart from ``slow_down``; ``runtime.train`` does the exchange.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

DEFAULT_FACTOR = 1.5
DEFAULT_STEPS = 5
STRAGGLER_EXIT = 75          # a rank leaving the job because it straggles (--on-straggler replan)


class StragglerFound(RuntimeError):
    """Raised on every rank when ``--on-straggler replan`` finds a straggler: the job saves and
    stops so that the launcher replans without its device or node."""

    def __init__(self, report: "Straggler"):
        super().__init__(report.describe())
        self.report = report


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    first_step: int
    step: int
    ratio: float               # the rank's time over the median, the last step
    steps: int

    def describe(self) -> str:
        return (f"rank {self.rank} on {self.host} straggles: {self.ratio:.2f}x the median rank's working time "
                f"for {self.steps} steps in a row (steps {self.first_step}-{self.step})")

    def to_dict(self) -> dict:
        return {"rank": self.rank, "host": self.host, "first_step": self.first_step, "step": self.step,
                "ratio": self.ratio, "steps": self.steps}


@dataclass
class StragglerWatch:
    """Counts, per rank, the steps in a row above ``factor`` x the median; reports a rank once
    when its count reaches ``steps``."""

    hosts: list[str]
    factor: float = DEFAULT_FACTOR
    steps: int = DEFAULT_STEPS
    _run: dict[int, int] = field(default_factory=dict)
    _first: dict[int, int] = field(default_factory=dict)
    reported: list[Straggler] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"straggler factor must be > 1, got {self.factor}")
        if self.steps < 1:
            raise ValueError(f"straggler steps must be >= 1, got {self.steps}")

    def observe(self, step: int, times: list[float]) -> list[Straggler]:
        """Record one step's working time per rank; return the ranks confirmed at this step."""
        if len(times) < 2:
            return []
        med = statistics.median(times)
        new = []
        done = {s.rank for s in self.reported}
        for r, t in enumerate(times):
            if med > 0 and t > self.factor * med:
                self._run[r] = self._run.get(r, 0) + 1
                self._first.setdefault(r, step)
            else:
                self._run.pop(r, None)
                self._first.pop(r, None)
                continue
            if self._run[r] >= self.steps and r not in done:
                s = Straggler(rank=r, host=self.hosts[r] if r < len(self.hosts) else "?", first_step=self._first[r],
                              step=step, ratio=t / med, steps=self._run[r])
                self.reported.append(s)
                new.append(s)
        return new


def work_clock(device_type: str):
    """The clock a rank's working time is read from (see the module docstring)."""
    return time.process_time if device_type == "cpu" else time.perf_counter


def slow_down(work_s: float, factor: float, clock=time.process_time) -> None:
    """Keep this process busy for ``(factor - 1) * work_s`` more of ``clock`` (a slower device)."""
    end = clock() + max(0.0, (factor - 1) * work_s)
    x = 0
    while clock() < end:
        for _ in range(2000):
            x += 1


__all__ = ["StragglerWatch", "Straggler", "StragglerFound", "work_clock", "slow_down", "STRAGGLER_EXIT",
           "DEFAULT_FACTOR", "DEFAULT_STEPS"]
