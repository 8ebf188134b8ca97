"""Moved to ``costmodel.files.safeio`` (below the plan file, so the runtime does not reach the
profiler through it). This name is the same module object, kept for code written against the
old path; new code imports ``costmodel.files.safeio``."""
import sys

from costmodel.files import safeio as _moved

sys.modules[__name__] = _moved
