"""Moved to ``costmodel.files.version`` (below the plan file, so the runtime does not reach the
profiler through it). This name is the same module object, kept for code written against the
old path; new code imports ``costmodel.files.version``."""
import sys

from costmodel.files import version as _moved

sys.modules[__name__] = _moved
