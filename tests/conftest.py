"""Shared test setup: the repo root on sys.path, GPU tests skipped cleanly without a GPU, and the
fast tier.

Two tiers. ``make test`` runs everything. ``make test-fast`` (``pytest tests --fast``) leaves out
every test marked ``subprocess``, ``multiproc``, ``netns``, ``solver`` or ``gpu`` -- the tests that
start a process or run CP-SAT -- and guards the rest: in the fast tier, starting a process
(``subprocess.Popen``, ``multiprocessing``, ``os.fork``/``system``/``posix_spawn``) or calling
CP-SAT's ``CpSolver.solve`` fails the test that did it, with the marker to add. So the fast tier
cannot quietly grow slow: an unmarked test that starts a process is an error, not a slow pass.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

SLOW_MARKERS = ("subprocess", "multiproc", "netns", "solver", "gpu")


@pytest.fixture
def bench_module():
    """Load a script of ``bench/`` (not a package) by name: ``bench_module("device_curves")``."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return load


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: leave out tests marked " + ", ".join(SLOW_MARKERS)
                          + ", and fail any other test that starts a process or runs CP-SAT")


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if config.getoption("--fast"):
        kept, left = [], []
        for item in items:
            (left if any(m in item.keywords for m in SLOW_MARKERS) else kept).append(item)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class _Forbidden(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _fast_tier_guard(request, monkeypatch):
    """In the fast tier, record and refuse what only marked tests may do (a test that swallows
    the error still fails at teardown)."""
    if not request.config.getoption("--fast"):
        yield
        return
    seen: list[str] = []

    def refuse(what: str, marker: str):
        def guard(*args, **kwargs):
            seen.append(f"needs @pytest.mark.{marker}: it tried to {what}")
            raise _Forbidden(f"needs @pytest.mark.{marker}: the fast tier does not {what}")
        return guard

    import multiprocessing.process
    import platform
    import subprocess
    platform.processor()       # the standard library asks ``uname -p`` once and caches it: not the test's process
    start = "start a process"
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse(start, "subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse(start, "multiproc"))
    for name in ("fork", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(start, "subprocess"))
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        pass
    else:
        for name in ("solve", "Solve"):
            monkeypatch.setattr(cp_model.CpSolver, name, refuse("run CP-SAT", "solver"))
    yield
    if seen:
        pytest.fail("; ".join(sorted(set(seen))), pytrace=False)
