"""The processes ``planner launch`` and ``planner profile`` start: how many this machine can
take, and how they stop.

* Bounds: CPU processes standing in for GPUs are bounded by the cores (``CPU_PER_CORE`` per
  core: beyond that the run measures time-sharing, not the plan) and by the memory available
  (about ``PROCESS_BYTES`` each: torch and gloo); ``--force`` lifts the first bound, never the
  second.
* SIGTERM is handled like Ctrl-C (``sigterm_as_exception``): the command stops everything it
  started and says so on stderr, then exits 143 (128 + SIGTERM; Ctrl-C: 130).
* Stopping a tree (``stop_tree``): torchrun starts its workers in sessions of their own, so a
  signal to torchrun's process group does not reach them, and a torchrun killed outright leaves
  them running. This process therefore becomes a child subreaper (Linux ``prctl``): workers
  whose parent died become its children. ``stop_tree`` sends SIGTERM to the launcher (torchrun
  passes it on to its workers), waits, then SIGKILLs whatever of the tree is still alive, the
  adopted orphans included, and reaps them.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator

from planner.plan.errors import UsageError
from costmodel.units import GIB

CPU_PER_CORE = 4
PROCESS_BYTES = int(0.35 * GIB)
EXIT_SIGTERM = 128 + signal.SIGTERM    # 143
EXIT_SIGINT = 128 + signal.SIGINT      # 130


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_cpu_processes(n: int, flag: str, force: bool, what: str = "CPU processes") -> None:
    """Refuse ``n`` CPU processes beyond this machine's bounds (UsageError, exit 2)."""
    c = cores()
    mem = available_memory_bytes()
    if mem is not None and n * PROCESS_BYTES > mem:
        raise UsageError(f"{flag} {n}: {n} {what} need about {n * PROCESS_BYTES / GIB:.1f} GiB "
                         f"({PROCESS_BYTES / GIB:.2f} GiB each) and this machine has {mem / GIB:.1f} GiB "
                         f"available; use at most {max(1, mem // PROCESS_BYTES)}")
    if not force and n > CPU_PER_CORE * c:
        raise UsageError(f"{flag} {n}: more than {CPU_PER_CORE} {what} per core on this {c}-core machine "
                         f"(at most {CPU_PER_CORE * c}); the run would measure time-sharing. Use fewer, or "
                         "--force to start them anyway")


# --------------------------------------------------------------------------------------
# Signals and process trees
# --------------------------------------------------------------------------------------

class Terminated(BaseException):
    """SIGTERM arrived (raised in the main thread, like KeyboardInterrupt for SIGINT)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.stopped = 0          # processes stopped on the way out (set by whoever stopped them)


@contextmanager
def sigterm_as_exception() -> Iterator[None]:
    """Within: SIGTERM raises ``Terminated`` in the main thread (no-op elsewhere)."""
    def handler(signum, frame):
        raise Terminated(signum)
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:            # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def become_subreaper() -> bool:
    """Orphaned descendants become this process's children (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0       # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) > 2 and rest[0] != "Z":
            out[int(name)] = int(rest[1])
    return out


def descendants(pid: int) -> list[int]:
    """Living descendants of ``pid`` (children first), from /proc; [] where there is no /proc."""
    try:
        parents = _parents()
    except OSError:
        return []
    kids: dict[int, list[int]] = {}
    for p, pp in parents.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(proc: subprocess.Popen, grace_s: float = 15.0) -> int:
    """Stop ``proc`` and everything under it (see the module docstring); returns how many
    processes were running in the tree."""
    tree = [proc.pid] + descendants(proc.pid)
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    left = [p for p in dict.fromkeys(tree + descendants(os.getpid())) if p != os.getpid() and _alive(p)]
    deadline = time.monotonic() + 5.0
    while left and time.monotonic() < deadline:     # workers torchrun is still stopping
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    _reap()
    return len(tree)


def stop_orphans(grace_s: float = 5.0) -> int:
    """SIGTERM, then SIGKILL, every living descendant of this process (after its launcher ended:
    the orphans it adopted as subreaper); returns how many there were."""
    left = descendants(os.getpid())
    if not left:
        _reap()
        return 0
    for p in left:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    alive = left
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        _reap()
        alive = [p for p in alive if _alive(p)]
    for p in alive:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
    _reap()
    return len(left)


__all__ = ["Terminated", "stop_orphans", "sigterm_as_exception", "become_subreaper", "descendants", "stop_tree",
           "check_cpu_processes", "cores", "EXIT_SIGTERM", "EXIT_SIGINT", "CPU_PER_CORE"]
