"""One run per checkpoint directory: an exclusive lock, and the refusal of another run's checkpoints.

The lock is ``flock`` on ``D/.lock``. The kernel drops it when the process holding it ends,
however it ends (``kill -9`` included), so a lock is never stale; the file keeps the holder's
pid, host, command and start time, which a refused launch prints. It is never deleted (deleting
a lock file while another process waits on it would let two runs in).

Who holds it: ``planner launch`` (one node) for the whole job, restarts and replans included,
and tells its workers so through ``PLANNER_CHECKPOINT_LOCK`` (the directory's real path);
otherwise (``python -m runtime.train`` under torchrun, as the emitted scripts run it, or several
nodes) rank 0 of the job, for the length of its run.

``existing_checkpoints`` lists what a fresh run (no ``--resume``) would overwrite; such a run is
refused unless asked to overwrite, and ``clear_checkpoints`` then removes only checkpoint
entries (step folders, interrupted writes, ``latest``), nothing else.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from .errors import RuntimeUsageError

LOCK_FILE = ".lock"
ENV_HELD = "PLANNER_CHECKPOINT_LOCK"
_ENTRY = re.compile(r"^(step-\d{8}|\.tmp-step-\d{8}|\.old-step-\d{8}|latest|\.latest\.tmp)$")


class CheckpointDirBusy(RuntimeUsageError):
    """Another run holds the checkpoint directory (exit 2)."""


class DirectoryLock:
    def __init__(self, root: str | os.PathLike, what: str = "") -> None:
        self.root = Path(root)
        self.what = what or " ".join([Path(sys.argv[0]).name] + sys.argv[1:3])
        self._fd: int | None = None

    def acquire(self) -> "DirectoryLock":
        path = self.root / LOCK_FILE
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise RuntimeUsageError(f"cannot lock checkpoint directory {self.root}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise CheckpointDirBusy(f"checkpoint directory {self.root} is in use by {holder}; wait for that run "
                                    "to finish, or use another --checkpoint-dir") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.what,
                "since": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(info: dict) -> str:
    if not info.get("pid"):
        return "another process"
    return (f"pid {info['pid']} on {info.get('host', '?')} ({info.get('command', '?')}, since "
            f"{info.get('since', '?')})")


def held_by_launcher(root: str | os.PathLike) -> bool:
    """Whether the ``planner launch`` that started this worker holds the lock of ``root``."""
    return os.environ.get(ENV_HELD) == os.path.realpath(root)


def existing_checkpoints(root: str | os.PathLike) -> list[str]:
    """The checkpoint entries in ``root`` (sorted names), which a fresh run would overwrite."""
    d = Path(root)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if _ENTRY.match(p.name))


def refuse_other_run(root: str | os.PathLike, flag: str = "--overwrite-checkpoints") -> None:
    """A fresh run into a directory that holds checkpoints: refused, naming them."""
    found = existing_checkpoints(root)
    if not found:
        return
    steps = [n for n in found if n.startswith("step-")]
    what = (f"{len(steps)} checkpoint(s) ({', '.join(steps[-3:])})" if steps
            else f"the remains of an interrupted run ({', '.join(found[:3])})")
    raise RuntimeUsageError(f"checkpoint directory {root} already holds {what} of another run; pass --resume to "
                            f"continue it, {flag} to replace it, or choose another --checkpoint-dir")


def clear_checkpoints(root: str | os.PathLike) -> list[str]:
    """Remove the checkpoint entries of ``root`` (the caller holds its lock); returns their names."""
    d = Path(root)
    gone = existing_checkpoints(d)
    for name in gone:
        p = d / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return gone


__all__ = ["DirectoryLock", "CheckpointDirBusy", "ENV_HELD", "held_by_launcher", "existing_checkpoints",
           "refuse_other_run", "clear_checkpoints"]
