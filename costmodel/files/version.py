"""The tool's version: pyproject.toml's ``version`` is the only copy; the code reads it from the
installed ``shardplan`` distribution. A source tree that was never installed says ``0+unknown``
(a visible unknown, never a guess). It lives here, in the lowest layer that records it (a profile's
provenance), so that the plan file and the command line read the same string."""
from __future__ import annotations

from functools import lru_cache
from importlib import metadata

DISTRIBUTION = "shardplan"
UNKNOWN = "0+unknown"


@lru_cache(maxsize=1)
def tool_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN
