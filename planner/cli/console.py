"""The one rich console every human-readable output goes through, so tables keep their content.

rich sizes output to the terminal, and to 80 columns when stdout is a pipe or a file, where it
would cut a long cell to ``configura…``. Here, when stdout is not a terminal, a table is printed
at its natural width (as wide as its longest cells need) and text lines are not wrapped: a log
holds every cell whole. On a terminal, cells that do not fit wrap (words fold) instead of being
cut with an ellipsis. Scripts should read ``--json``, not these tables.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.rule import Rule
from rich.table import Table

_UNBOUNDED = 100_000     # a width no table reaches: measure at the natural width


class PipeSafeConsole(Console):
    """A ``rich.console.Console`` whose tables never lose content (see the module docstring)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        tables = [o for o in objects if isinstance(o, Table)]
        if not self.is_terminal and any(isinstance(o, Rule) for o in objects):
            kwargs.setdefault("soft_wrap", False)
        for t in tables:
            for col in t.columns:
                if col.overflow == "ellipsis":
                    col.overflow = "fold"
        if self.is_terminal:
            super().print(*objects, **kwargs)
            return
        kwargs.setdefault("soft_wrap", not tables)
        need = max((natural_width(self, t) for t in tables), default=0)
        rules = [o for o in objects if isinstance(o, Rule)]
        need = max([need] + [len(str(r.title)) + 6 for r in rules])   # a rule cuts its title to fit
        if need <= self.width:
            super().print(*objects, **kwargs)
            return
        saved = self.width
        self.width = need
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = saved


def natural_width(console: Console, table: Table) -> int:
    """The columns a table needs to show every cell on one line."""
    return Measurement.get(console, console.options.update(width=_UNBOUNDED), table).maximum


def make_console(**kwargs: Any) -> PipeSafeConsole:
    kwargs.setdefault("highlight", False)
    return PipeSafeConsole(**kwargs)
