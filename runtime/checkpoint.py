"""Checkpoints with torch.distributed.checkpoint (DCP): atomic, and loadable under any plan.

Layout of a checkpoint directory ``D``::

    D/step-00000004/       one complete checkpoint: DCP shards + .metadata + meta.json + manifest.json
    D/step-00000006/
    D/latest               the name of the newest complete one (replaced atomically)
    D/.tmp-step-00000008/  a write in progress (or one a crash interrupted): never read
    D/.lock                held by the run using D (``runtime.lock``)

A save writes into ``.tmp-step-N``; when every rank has finished its shards (and hashed them),
rank 0 writes ``meta.json`` and, last, ``manifest.json`` (the digest of every file,
``runtime.manifest``), renames the folder to ``step-N`` and then repoints ``latest``. A crash at
any point leaves the previous checkpoint complete and ``latest`` pointing at it. The newest
``KEEP`` checkpoints are kept.

Asynchronous saves (``save_async``, ``--async-checkpoint``): the state is staged in host memory by
``torch.distributed.checkpoint.async_save`` over a process group of its own, and written by a
background thread into ``.tmp-step-N`` while training goes on; ``PendingSave.commit`` (collective,
once the write is done on every rank) then does what ``save`` does after its write: the digests,
``meta.json`` and, last, the manifest. Until then the step is not complete.

A resume reads only an intact step (``find_intact``: its manifest matches every file, and its
DCP index holds nothing but tensors), the newest one, naming each newer step it skipped and why;
nothing of a step is unpickled before that check, and the load re-checks the bytes it reads.

What is saved, keyed by canonical parameter name (no wrapper prefixes), so that a load
reshards whatever mesh wrote it (DCP's load-time resharding, the tensors being DTensors or
plain tensors as each plan has them):

* ``model.<name>``: every parameter;
* ``optim.<name>.<state>``: the optimizer state of that parameter (AdamW: step, exp_avg,
  exp_avg_sq; SGD: momentum_buffer);
* ``meta.json``: the step (the data position: the stream is a function of the step), the loss
  history, the model and workload it belongs to, and the plan that wrote it.

A last pipeline stage's copy of a tied embedding is not saved; it loads from
``model.embed.tok.weight``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .errors import CheckpointMismatch

if TYPE_CHECKING:                      # annotations only: torch is imported where it runs
    import torch
    from torch import nn

# torch is imported where it is used: ``find_latest`` and ``read_meta`` serve the CLI, which
# must start fast

KEEP = 2
LATEST = "latest"
META = "meta.json"
# fields of the workload a checkpoint must agree on (they define the model state and the data)
WORKLOAD_KEYS = ("global_batch", "seq_len", "seed", "optimizer")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


_STEP = re.compile(r"^step-\d{8}$")


def _complete(p: Path) -> bool:
    """A committed step (its manifest written): cheap; ``find_intact`` checks it for real."""
    from .manifest import MANIFEST
    return (p.is_dir() and not p.is_symlink() and (p / META).is_file() and (p / ".metadata").is_file()
            and (p / MANIFEST).is_file())


def _candidates(root: Path) -> list[Path]:
    """Step folders, newest first: the one ``latest`` names, then the others by step."""
    steps = sorted((p for p in root.glob("step-*") if _STEP.match(p.name)), reverse=True)
    ptr = root / LATEST
    try:
        name = ptr.read_text().strip() if ptr.is_file() and not ptr.is_symlink() else ""
    except OSError:
        name = ""
    first = [root / name] if _STEP.match(name) and (root / name) in steps else []
    return first + [p for p in steps if p not in first]


def find_latest(root: str | os.PathLike) -> Path | None:
    """The newest committed checkpoint under ``root`` (``latest`` first, then a scan); for
    messages. A resume uses ``find_intact``."""
    root = Path(root)
    if not root.is_dir():
        return None
    for p in _candidates(root):
        if _complete(p):
            return p
    return None


VERIFIED_ENV = "PLANNER_CHECKPOINT_VERIFIED"


def verified_token(step_dir: str | os.PathLike) -> str:
    """What ``planner launch`` hands its workers after verifying a step (so that rank 0 does not
    hash the whole checkpoint a second time): its real path and the digest of its manifest."""
    from .manifest import MANIFEST, sha256_file
    return f"{os.path.realpath(step_dir)}|{sha256_file(Path(step_dir) / MANIFEST)}"


def find_intact(root: str | os.PathLike, log: Callable[[str], None] | None = None,
                trusted: str | None = None) -> Path | None:
    """The newest intact checkpoint under ``root`` (``runtime.manifest.verify``), naming each
    newer step it skipped through ``log``. Raises ``UnsafeCheckpoint`` when there are steps and
    none is intact (a resume must not start over silently over them). ``trusted`` (a
    ``verified_token``) spares the shard digests of a step verified by the launcher whose manifest
    is unchanged; its index is still checked, and the load checks the bytes it unpickles."""
    from .manifest import UnsafeCheckpoint, verify
    root = Path(root)
    if not root.is_dir():
        return None
    skipped = []
    for p in _candidates(root):
        try:
            shortcut = bool(trusted) and verified_token(p) == trusted
        except OSError:
            shortcut = False
        why = verify(p, digests=not shortcut)
        if why is None:
            if skipped and log:
                log(f"resuming from {p.name}, the newest intact checkpoint")
            return p
        skipped.append(f"{p.name}: {why}")
        if log:
            log(f"skipping checkpoint {p}: {why}")
    if skipped:
        raise UnsafeCheckpoint(f"no intact checkpoint in {root} ({'; '.join(skipped[:3])}); nothing was loaded. "
                               "Move those steps away (or pass --overwrite-checkpoints to start afresh over them)")
    return None


def read_meta(path: str | os.PathLike) -> dict:
    from runtime.manifest import json_object
    return json_object((Path(path) / META).read_bytes(), META)


def _full_model(d: dict) -> dict:
    """Every field of a model dict (``ModelSpec.to_dict`` leaves defaults out)."""
    import dataclasses

    from costmodel.specs import ModelSpec, SpecError
    try:
        return dataclasses.asdict(ModelSpec.from_dict(d))
    except (SpecError, TypeError):
        return dict(d)


def check_compatible(meta: dict, model: dict, workload: dict, where: str) -> None:
    diffs = []
    a, b = _full_model(meta.get("model") or {}), _full_model(model)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if keys:
        diffs.append("model " + ", ".join(f"{k}: {a.get(k)!r} in the checkpoint vs {b.get(k)!r}" for k in keys))
    w = meta.get("workload") or {}
    for k in WORKLOAD_KEYS:
        if w.get(k) != workload.get(k):
            diffs.append(f"workload {k}: {w.get(k)!r} in the checkpoint vs {workload.get(k)!r}")
    if diffs:
        raise CheckpointMismatch(f"checkpoint {where} belongs to another model or workload: " + "; ".join(diffs))


# --------------------------------------------------------------------------------------
# The state, as a flat dict of tensors that DCP reads and writes in place
# --------------------------------------------------------------------------------------

def _named_params(parts: Iterable[nn.Module], tied: bool, for_load: bool) -> list[tuple[str, nn.Parameter]]:
    from .model import canonical_name
    out = []
    for part in parts:
        for name, p in part.named_parameters():
            name = canonical_name(name)
            if tied and name == "output.weight":   # a last stage's copy of the tied embedding
                if not for_load:
                    continue
                name = "embed.tok.weight"
            out.append((name, p))
    return out


def ensure_optim_state(opt: torch.optim.Optimizer) -> None:
    """Create the optimizer state a step would create (zeros), so a load has tensors to fill."""
    import torch
    for group in opt.param_groups:
        for p in group["params"]:
            if p in opt.state and opt.state[p]:
                continue
            if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                st = {"step": torch.tensor(0.0, dtype=torch.float32),
                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif isinstance(opt, torch.optim.SGD) and group.get("momentum", 0):
                st = {"momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format)}
            else:
                st = {}
            opt.state[p].update(st)


def state_tensors(parts: Iterable[nn.Module], opt: torch.optim.Optimizer, tied: bool,
                  for_load: bool = False) -> dict[str, torch.Tensor]:
    import torch
    sd: dict[str, torch.Tensor] = {}
    for name, p in _named_params(parts, tied, for_load):
        sd[f"model.{name}"] = p
        for k, t in opt.state.get(p, {}).items():
            if isinstance(t, torch.Tensor):
                sd[f"optim.{name}.{k}"] = t
    return sd


# --------------------------------------------------------------------------------------
# Save and load
# --------------------------------------------------------------------------------------

def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _prepare(root: Path, step: int, rank: int, barrier: Callable[[], None]) -> tuple[Path, Path]:
    name = step_name(step)
    tmp, final = root / f".tmp-{name}", root / name
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    return tmp, final


def _commit(root: Path, step: int, tmp: Path, final: Path, meta: dict[str, Any], rank: int,
            barrier: Callable[[], None], before_commit: Callable[[], None] | None) -> Path:
    """Collective, once every rank's shards are written: digests, then rank 0 writes meta.json and,
    last, the manifest, renames the folder and repoints ``latest``."""
    from .manifest import write_manifest, write_rank_digests
    name = step_name(step)
    if before_commit is not None:
        before_commit()           # fault injection: a crash after the shards, before the commit
    write_rank_digests(tmp, rank)
    barrier()
    if rank == 0:
        _write_text_atomic(tmp / META, json.dumps(dict(meta, step=step), indent=1))
        write_manifest(tmp, step)     # last: a step without it is not complete
        if final.exists():        # the same step saved again after a restart
            old = root / f".old-{name}"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_dir(root)
        _write_text_atomic(root / LATEST, name + "\n")
        done = sorted(p for p in root.glob("step-*") if _complete(p))
        for p in done[:-KEEP]:
            shutil.rmtree(p, ignore_errors=True)
    barrier()
    return final


def save(root: str | os.PathLike, step: int, parts: list[nn.Module], opt: torch.optim.Optimizer, tied: bool,
         meta: dict[str, Any], rank: int, barrier: Callable[[], None],
         before_commit: Callable[[], None] | None = None) -> Path:
    """Collective: every rank calls it. Returns the final directory."""
    import torch.distributed.checkpoint as dcp
    root = Path(root)
    tmp, final = _prepare(root, step, rank, barrier)
    dcp.save(state_tensors(parts, opt, tied), checkpoint_id=str(tmp))
    return _commit(root, step, tmp, final, meta, rank, barrier, before_commit)


ASYNC_DELAY_ENV = "PLANNER_TEST_ASYNC_SAVE_DELAY_S"   # tests: hold the background write this long


class PendingSave:
    """An asynchronous save in flight (``save_async``): its shards are being written by a
    background thread; ``commit`` (collective, once ``done`` on every rank) writes the digests,
    meta.json and the manifest, last, as ``save`` does. Until then the step does not exist for a
    resume (no manifest), and the previous checkpoint stays the newest complete one."""

    def __init__(self, root: Path, step: int, tmp: Path, final: Path, future, meta: dict[str, Any]):
        self.root, self.step, self.tmp, self.final, self.future, self.meta = root, step, tmp, final, future, meta

    def done(self) -> bool:
        return self.future.done()

    def commit(self, rank: int, barrier: Callable[[], None],
               before_commit: Callable[[], None] | None = None) -> Path:
        self.future.result()          # raises what the background write raised
        return _commit(self.root, self.step, self.tmp, self.final, self.meta, rank, barrier, before_commit)


def _delayed_writer(path: Path, delay_s: float):
    from torch.distributed.checkpoint import FileSystemWriter

    class DelayedWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            import time
            time.sleep(delay_s)
            return super().write_data(plan, planner)

    return DelayedWriter(str(path))


def save_async(root: str | os.PathLike, step: int, parts: list[nn.Module], opt: torch.optim.Optimizer, tied: bool,
               meta: dict[str, Any], rank: int, barrier: Callable[[], None], group) -> PendingSave:
    """Collective: stage this rank's state in host memory and write it in a background thread
    (``torch.distributed.checkpoint.async_save``, over ``group``: a process group of its own, so
    that its collectives never interleave with training's). Returns when the state is staged;
    training may change the parameters from then on."""
    import torch.distributed.checkpoint as dcp
    root = Path(root)
    tmp, final = _prepare(root, step, rank, barrier)
    kw = {}
    delay = float(os.environ.get(ASYNC_DELAY_ENV, "0") or 0)
    if delay > 0:
        kw["storage_writer"] = _delayed_writer(tmp, delay)
    fut = dcp.async_save(state_tensors(parts, opt, tied), checkpoint_id=str(tmp), process_group=group, **kw)
    return PendingSave(root, step, tmp, final, fut, dict(meta))


def _fsync_dir(p: Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str | os.PathLike, parts: list[nn.Module], opt: torch.optim.Optimizer, tied: bool) -> dict:
    """Collective: fill parameters and optimizer state in place from ``path`` (an intact step,
    ``find_intact``), through the reader that checks what it unpickles; returns its meta."""
    import torch.distributed.checkpoint as dcp

    from .manifest import safe_reader
    ensure_optim_state(opt)
    dcp.load(state_tensors(parts, opt, tied, for_load=True), checkpoint_id=str(path),
             storage_reader=safe_reader(path))
    return read_meta(path)


__all__ = ["find_latest", "find_intact", "verified_token", "VERIFIED_ENV", "read_meta", "check_compatible", "save", "load",
           "save_async", "PendingSave", "state_tensors", "ensure_optim_state",
           "CheckpointMismatch", "step_name", "KEEP"]
