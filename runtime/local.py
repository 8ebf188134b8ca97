"""A pool of local worker processes that run plans one after another, for tests and demos.

Starting a process that imports torch costs seconds of CPU; a test suite that checks a dozen
plans would spend most of its time importing. ``LocalPool(n)`` starts ``n`` processes once,
from a fork server that has imported the runtime (``multiprocessing``'s ``forkserver`` start
method: a clean process, not a fork of the caller), and runs each job on the first
``job.world`` of them: each job joins a fresh gloo process group (a ``FileStore`` rendezvous
of its own), trains through ``runtime.train.train`` exactly as ``python -m runtime.train``
does (or serves through ``runtime.serve.serve``: ``run(..., entry="serve")``), and leaves the
group. Rank 0's summary comes back; an error on any rank comes back with the rank named.

The torchrun path (``python -m runtime.train`` under ``torch.distributed.run``) is the one
``planner launch`` uses; this pool is the same code in long-lived processes.
"""
from __future__ import annotations

import os
import queue
import tempfile
import time
import traceback
from typing import Any
from costmodel.units import GIB

_PRELOAD = ["torch", "torch.distributed.pipelining", "torch.distributed.checkpoint", "torch.distributed.fsdp",
            "torch.distributed.tensor.parallel", "runtime.train", "runtime.serve", "runtime.parallel", "runtime.model",
            "planner.plan.planfile"]


class JobFailed(RuntimeError):
    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank


def _worker(rank: int, inbox, outbox, store_dir: str) -> None:  # pragma: no cover - child process
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RUNTIME_TIMEOUT_S", "60")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    from runtime.serve import serve
    from runtime.train import train
    from runtime.worker import finish_process_group
    entries = {"train": train, "serve": serve}
    while True:
        job = inbox.get()
        if job is None:
            return
        jid, plan, opts, world, env, entry = job
        if rank >= world:
            continue
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        ok = False
        try:
            dist.init_process_group("gloo", init_method=f"file://{store_dir}/store-{jid}", rank=rank,
                                    world_size=world)
            summary = entries[entry](plan, opts)
            ok = True
            outbox.put((jid, rank, "ok", summary if rank == 0 else None))
        except BaseException as e:   # report every failure, with the rank, and keep serving
            outbox.put((jid, rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"))
        finally:
            finish_process_group(synchronize=ok)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _root_cause(results: dict[int, tuple[str, Any]]) -> tuple[int, str]:
    """The first failing rank whose error is not just a lost peer."""
    errors = sorted((r, v) for r, (s, v) in results.items() if s == "error")
    own = [(r, v) for r, v in errors if not any(p in v for p in _PEER_LOST)]
    return (own or errors)[0]


class LocalPool:
    def __init__(self, processes: int, timeout_s: float = 120.0):
        import multiprocessing as mp
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        self.timeout_s = timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="runtime-pool-")
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(processes)]
        self._procs = [ctx.Process(target=_worker, args=(r, self._inboxes[r], self._outbox, self._tmp.name),
                                   daemon=True) for r in range(processes)]
        for p in self._procs:
            p.start()
        self._next = 0
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._procs)

    def run(self, plan, opts, world: int | None = None, env: dict[str, str] | None = None,
            entry: str = "train") -> dict[str, Any]:
        """Run one plan on the first ``world`` workers (default: the plan's world size): train it
        (``opts``: ``runtime.train.Options``) or, ``entry="serve"``, serve it
        (``runtime.serve.ServeOptions``)."""
        world = plan.world_size if world is None else world
        if world > self.size:
            raise ValueError(f"the job needs {world} processes; the pool has {self.size}")
        jid = self._next
        self._next += 1
        for box in self._inboxes:
            box.put((jid, plan, opts, world, dict(env or {}), entry))
        results: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(results) < world:
            try:
                got = self._outbox.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs[:world]) if not p.is_alive()]
                if dead:
                    self.close(force=True)
                    raise JobFailed(dead[0], f"worker process died (exit code {self._procs[dead[0]].exitcode})") \
                        from None
                if time.monotonic() > deadline:
                    self.close(force=True)
                    raise TimeoutError(f"job {jid} did not finish in {self.timeout_s:.0f} s "
                                       f"(ranks done: {sorted(results)}); pool stopped") from None
                continue
            if got[0] != jid:
                continue
            results[got[1]] = (got[2], got[3])
            if got[2] == "error" and len(results) < world:
                # the other ranks are likely blocked in a collective with the failed one: give
                # them a moment to report, name the root cause, stop the pool
                end = time.monotonic() + 2.0
                while len(results) < world and time.monotonic() < end:
                    try:
                        more = self._outbox.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    if more[0] == jid:
                        results[more[1]] = (more[2], more[3])
                dead = [r for r, p in enumerate(self._procs[:world]) if not p.is_alive()]
                codes = {r: self._procs[r].exitcode for r in dead}
                self.close(force=True)
                if dead:   # a worker that died (killed) is the cause of the others' lost peers
                    raise JobFailed(dead[0], f"worker process died (exit code {codes[dead[0]]})")
                rank, msg = _root_cause(results)
                raise JobFailed(rank, msg)
        if any(s == "error" for s, _ in results.values()):
            raise JobFailed(*_root_cause(results))
        return results[0][1]

    @property
    def alive(self) -> bool:
        return not self._closed and all(p.is_alive() for p in self._procs)

    def close(self, force: bool = False) -> None:
        """Stop the workers: politely, or (``force``) at once, for workers stuck in a collective."""
        if self._closed:
            return
        self._closed = True
        for box in self._inboxes:
            try:
                box.put(None)
            except Exception:
                pass
        for p in self._procs:
            if force and p.is_alive():
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._tmp.cleanup()

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def local_cluster(processes: int):
    """This machine's processes as a one-node cluster (gloo over loopback), for plans made here.
    Figures are nominal: a plan needs a cluster; a local run does not use it."""
    from costmodel.specs import ClusterSpec, GpuSpec, LinkSpec, NodeGroup
    proc = GpuSpec(name="cpu-process", memory_bytes=2 * GIB, peak_flops_per_s={"fp32": 5e10, "bf16": 2e10},
                   hbm_bandwidth_bytes_per_s=1e10)
    loop = LinkSpec(name="gloo-loopback", bandwidth_bytes_per_s=1.2e9, latency_s=150e-6, efficiency=1.0)
    group = NodeGroup(name="local", gpu=proc, gpus_per_node=processes, nodes=1, intra_node=loop)
    return ClusterSpec(name="local-cpu", groups=(group,), inter_node=loop)


def make_plan(model: str = "tiny-llama", global_batch: int = 8, seq_len: int = 32, optimizer: str = "adamw",
              seed: int = 0, stages: list[int] | None = None, order: tuple[str, ...] | None = None,
              cluster=None, **parallel: Any):
    """A plan for local runs without the solver: a catalog model, an fp32 workload, the given
    degrees (``ParallelConfig`` fields), an optional uneven stage split as layer counts, and
    ``cluster`` (a ``ClusterSpec``; default this machine's processes)."""
    from costmodel.catalog import get_model
    from costmodel.specs import ParallelConfig, StageSpec, Workload, default_stages
    from planner.plan.planfile import DEFAULT_ORDER, Plan
    spec = get_model(model)
    par = ParallelConfig(**parallel)
    if stages is None:
        st = default_stages(spec.layers, par.pp)
    else:
        firsts = [sum(stages[:i]) for i in range(len(stages))]
        st = tuple(StageSpec(first_layer=f, num_layers=n) for f, n in zip(firsts, stages))
    wl = Workload(global_batch=global_batch, seq_len=seq_len, dtype="fp32", optimizer=optimizer, seed=seed)
    return Plan(model=spec, cluster=cluster or local_cluster(par.world_size), workload=wl, parallel=par,
                stages=tuple(st), mesh_order=tuple(order or DEFAULT_ORDER))


__all__ = ["LocalPool", "JobFailed", "make_plan", "local_cluster"]
