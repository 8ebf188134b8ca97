"""The shared entry and exit of a runtime worker process (``runtime.train``, ``runtime.serve``).

A user-caused error is one line on stderr and exit code 2. A worker that finished cleanly waits at
a barrier for its peers before it tears the process group down, so no rank closes its sockets
while a peer is still inside the last collective. Run as a script, the worker then leaves with
``os._exit``: C++ objects of torch (gloo's threads) are not destroyed at interpreter exit, where
their destructors race and sometimes abort the process ("terminate called without an active
exception", seen once in six runs of a 4-rank job) after the work, checkpoint and summary are
already written and closed.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run(prog: str, body: Callable[[], None], errors: tuple[type[BaseException], ...]) -> int:
    """Run ``body``; an error of ``errors`` is one line and exit code 2. Tears torch.distributed down."""
    rank = os.environ.get("RANK", "0")
    ok = False
    try:
        body()
        ok = True
    except errors as e:
        print(f"{prog}: rank {rank}: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        finish_process_group(synchronize=ok)
    return 0


def finish_process_group(synchronize: bool) -> None:
    """Destroy the default process group, after a barrier when every rank is known to have finished."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):
        if synchronize:
            dist.barrier()
        dist.destroy_process_group()


def write_json(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader sees the old file or the whole new one)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, p)


def exit_now(code: int) -> None:
    """Leave the process with ``code`` after flushing Python's streams, skipping C++ teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
