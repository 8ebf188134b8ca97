"""Train a plan: ``python -m runtime.train --plan PLAN [--steps N] ...`` under torchrun.

The entry point the torchrun, Slurm and Kubernetes emitters launch (the flags below are a
contract; keep them). Under torchrun it reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
joins the process group (NCCL on GPUs, gloo on CPUs); without torchrun it runs as one process.

    python -m runtime.train --plan PLAN [--steps N] [--checkpoint-dir D] [--checkpoint-every K]
        [--resume | --overwrite-checkpoints] [--metrics FILE.jsonl] [--json-out FILE] [--data TOKENS.bin]
        [--inject-failure rank=R,step=S[,phase=step|save][,permanent] | rank=R,slow=X[,step=S]]
        [--device auto|cpu|cuda] [--lr LR] [--async-checkpoint]
        [--straggler-factor F] [--straggler-steps K] [--on-straggler report|replan]

Set-up, in order: check the plan against the launch (world size, what the runtime can run);
build the mesh in the plan's order; for each pipeline stage this rank holds, build the model
part on the meta device, apply TP, experts, activation checkpointing and FSDP/DDP
(``runtime.parallel``), then materialise only the local shards and fill them with their
slice of the deterministic initial model; resume from the newest intact checkpoint when
asked (or after an elastic restart): ``checkpoint.find_intact`` checks its manifest before any
of its files is read and names the newer steps it skipped.

The checkpoint directory belongs to one run (``runtime.lock``): rank 0 locks it (unless the
``planner launch`` that started the job holds the lock), and a fresh run (no ``--resume``, first
attempt) into a directory that holds checkpoints is refused unless ``--overwrite-checkpoints``
(which removes them first). Then train: each step's global batch comes from the
workload's token stream, the loss is the mean over the global batch, and rank 0 writes one
metrics line per step and, at the end, the JSON summary ``planner launch`` reads.

Every step the ranks exchange their working time (``runtime.stragglers``): a rank above F x the
median for K steps in a row is reported with its host (``stragglers`` in the summary);
``--on-straggler replan`` saves the step and stops the job (the straggler leaves with exit 75) so
that the launcher replans without it. ``--async-checkpoint`` writes checkpoints in the
background (``checkpoint.save_async``); a step is committed (its manifest written) at the first
step boundary where every rank's write is done, and always before the next save and at the end.

Exit codes: 0 done; 2 a plan, checkpoint or input this launch cannot use (one line on
stderr, no traceback); anything else is a crash, reported by torchrun with the rank.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import worker
from .errors import (CheckpointMismatch, DataError, PlanNotRunnable, RuntimeModelError,  # noqa: F401
                     RuntimeUsageError)

DEFAULT_LR = 1e-3


@dataclass(frozen=True)
class Failure:
    """``--inject-failure rank=R,step=S[,phase=step|save][,permanent]``: kill rank R at step S
    (before the step, or while saving its checkpoint). On the first attempt only (a transient
    fault: an elastic restart gets past it), or, ``permanent``, on every attempt (a dead device:
    only a launch without that rank gets past it).

    ``rank=R,slow=X[,step=S][,permanent]``: rank R runs X times slower from step S (default 1)
    on (``runtime.stragglers``), a straggler rather than a crash."""

    rank: int
    step: int
    phase: str = "step"
    permanent: bool = False
    slow: float = 0.0

    USAGE = "expected rank=R,step=S[,phase=step|save][,permanent] or rank=R,slow=X[,step=S][,permanent]"

    @classmethod
    def parse(cls, text: str) -> "Failure":
        items = [item for item in text.split(",") if item]
        permanent = "permanent" in items
        items = [item for item in items if item != "permanent"]
        keys = [item.split("=", 1)[0] for item in items]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise RuntimeUsageError(f"--inject-failure {text!r}: {', '.join(twice)} given more than once (the last "
                                    f"would win silently); give each once: {cls.USAGE}")
        try:
            kv = dict(item.split("=", 1) for item in items)
            slow = float(kv.pop("slow", 0.0))
            step = int(kv.pop("step")) if (not slow or "step" in kv) else 1
            f = cls(rank=int(kv.pop("rank")), step=step, phase=kv.pop("phase", "step"), permanent=permanent,
                    slow=slow)
        except (KeyError, ValueError):
            raise RuntimeUsageError(f"--inject-failure {text!r}: {cls.USAGE}") from None
        if kv or f.phase not in ("step", "save") or (f.slow and (f.slow <= 1 or f.phase != "step")) \
                or f.step < 1 or f.rank < 0 or not (f.slow == f.slow) or f.slow == float("inf"):
            raise RuntimeUsageError(f"--inject-failure {text!r}: {cls.USAGE} (slow=X needs X > 1)")
        return f

    def active(self, attempt: int) -> bool:
        """Whether it fires on this attempt (``TORCHELASTIC_RESTART_COUNT``)."""
        return self.permanent or attempt == 0


def restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Options:
    steps: int = 10
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    resume: bool = False
    overwrite_checkpoints: bool = False
    metrics: str = ""
    json_out: str = ""
    data: str = ""
    data_dtype: str = "auto"         # auto: uint16 when every id fits (vocab <= 65536), else uint32
    inject: Failure | None = None
    device: str = "auto"
    lr: float = DEFAULT_LR
    quiet: bool = False
    async_checkpoint: bool = False          # torch.distributed.checkpoint.async_save; manifest after the write
    straggler_factor: float = 1.5           # a rank above this x the median working time ...
    straggler_steps: int = 5                # ... this many steps in a row is a straggler
    on_straggler: str = "report"            # report | replan (save, then stop without it: StragglerFound)
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Process group
# --------------------------------------------------------------------------------------

def _device_type(choice: str) -> str:
    import torch
    if choice == "cpu":
        return "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeUsageError("--device cuda, but torch sees no CUDA device")
        return "cuda"
    return "cuda" if torch.cuda.is_available() else "cpu"


def init_distributed(device_type: str, timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes, or make a one-process one. Returns (rank, world)."""
    import datetime

    import torch
    import torch.distributed as dist
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    timeout = datetime.timedelta(seconds=timeout_s or float(os.environ.get("RUNTIME_TIMEOUT_S", "300")))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        backend = "cuda:nccl,cpu:gloo" if device_type == "cuda" else "gloo"
        kw = {}
        if device_type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            kw["device_id"] = torch.device("cuda", local)
        # torchrun's store outlives an elastic restart: a fresh key prefix per attempt keeps the
        # new workers from reading the dead ones' addresses (gloo: "connection refused")
        from torch.distributed.rendezvous import rendezvous
        store, rank, world = next(rendezvous("env://", timeout=timeout))
        store = dist.PrefixStore(f"runtime/attempt-{restart_count()}", store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **kw)
    else:
        dist.init_process_group("cuda:nccl,cpu:gloo" if device_type == "cuda" else "gloo",
                                store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


# --------------------------------------------------------------------------------------
# Set-up: mesh, model parts, parallelism, optimizer, pipeline
# --------------------------------------------------------------------------------------

def _loss_fn(logits, target):
    import torch.nn.functional as F
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))


def _scalar(t) -> float:
    t = t.to_local() if hasattr(t, "to_local") else t
    return float(t.detach().float())


class Trainer:
    def __init__(self, plan, opts: Options, device_type: str, rank: int, world: int):
        import torch
        import torch.distributed as dist

        from .data import TokenStream, token_dtype
        from .model import build_model, init_weights
        from .parallel import (Dims, apply_ac, apply_dp, apply_experts, apply_tp, build_mesh, recompute_layers,
                               tied_pair_group)
        from .pipeline import stage_ids, virtual_stage_layers

        self.plan, self.opts, self.rank, self.world = plan, opts, rank, world
        spec, par, wl = plan.model, plan.parallel, plan.workload
        self.spec, self.par, self.wl = spec, par, wl
        self.dims = dims = Dims.from_plan(spec, par, plan.mesh_order, wl.seq_len, wl.global_batch, world)
        if device_type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.device_type = device_type
        self.bf16 = device_type == "cuda" and wl.dtype in ("bf16", "bfloat16", "fp16", "float16")
        self.mesh = mesh = build_mesh(dims, device_type)
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.tp_rank = mesh["tp"].get_local_rank()
        vstages = virtual_stage_layers(plan.stages, par, spec.layers)
        self.num_vstages = len(vstages)
        self.stage_indices = stage_ids(self.pp_rank, par)
        self.tied_split = spec.tied_embeddings and par.pp > 1
        self.tied_group = tied_pair_group(mesh, dims) if self.tied_split else None

        # rank's full-recompute budget, handed to its chunks in order (vpp > 1 splits a stage)
        st = plan.stages[self.pp_rank]
        budget = recompute_layers(par, st.num_layers, st.recompute_layers)
        self.parts = []
        for sidx in self.stage_indices:
            ids = vstages[sidx]
            with torch.device("meta"):
                part = build_model(spec, layers=ids, embed=sidx == 0, head=sidx == self.num_vstages - 1)
            if dims.tp > 1:
                apply_tp(part, mesh["tp"], spec, dims.sp)
            if spec.is_moe:
                apply_experts(part, mesh, dims)
            n_full = min(budget, len(ids))
            budget -= n_full
            apply_ac(part, n_full, par.recompute == "selective")
            apply_dp(part, mesh, dims, pp_enabled=par.pp > 1, mp_dtype=torch.bfloat16 if self.bf16 else None)
            part.to_empty(device=self.device)
            part.retie()
            if part.tied and part.output.weight is not part.embed.tok.weight:
                raise AssertionError("tied embedding lost its tie while materialising")
            init_weights([part], wl.seed, spec)
            self.parts.append(part)

        params, seen = [], set()
        for part in self.parts:
            for p in part.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        # on a GPU, Adam's fused kernel (one pass over each parameter's state, as the cost model prices
        # the step: costmodel.memory.optimizer_traffic_bytes_per_param); the default multi-tensor
        # "foreach" path took 30 ms against the model's 14 for GPT-3 1.3B on an H200
        # (bench/results/device-h200/step-gpt3-1.3b.json, optimizer_s). The CPU keeps the default.
        fused = {"fused": True} if self.device_type == "cuda" else {}
        if wl.optimizer == "sgd":
            self.opt = torch.optim.SGD(params, lr=opts.lr, momentum=0.9)
        elif wl.optimizer == "adam":
            self.opt = torch.optim.Adam(params, lr=opts.lr, betas=(0.9, 0.95), **fused)
        else:
            self.opt = torch.optim.AdamW(params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.1, **fused)

        self.schedule = None
        if par.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            from .pipeline import build_schedule
            group = mesh["pp"].get_group()
            stages = [PipelineStage(part, sidx, self.num_vstages, self.device, group=group)
                      for part, sidx in zip(self.parts, self.stage_indices)]
            self.schedule = build_schedule(stages, par, _loss_fn)
        self.has_first = 0 in self.stage_indices
        self.has_last = self.num_vstages - 1 in self.stage_indices
        self.stream = TokenStream(global_batch=wl.global_batch, seq_len=wl.seq_len, vocab=spec.vocab,
                                  seed=wl.seed, path=opts.data, dtype=token_dtype(opts.data_dtype, spec.vocab))
        self._dist = dist
        # where each rank runs (straggler reports name it), and async checkpoints' own group
        node = os.environ.get("PLANNER_NODE") or ""
        import socket
        me = socket.gethostname() + (f" ({node})" if node and node != socket.gethostname() else "")
        if world > 1:
            hosts: list = [None] * world
            dist.all_gather_object(hosts, me)
            self.hosts = [str(h) for h in hosts]
        else:
            self.hosts = [me]
        self.ckpt_group = dist.new_group(backend="gloo") if (opts.async_checkpoint and world > 1) else None

    # ---- one optimizer step ---------------------------------------------------------------
    def _context(self):
        import torch
        stack = contextlib.ExitStack()
        if self.dims.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel
            stack.enter_context(loss_parallel())
        if self.bf16:
            stack.enter_context(torch.autocast(self.device_type, dtype=torch.bfloat16))
        return stack

    def _dp_sync(self, last: bool) -> None:
        """Gradient accumulation without a pipeline, as the cost model prices it
        (``costmodel.stage_terms``): DDP (``replicate``) all-reduces once per step, on the last
        micro-batch (``set_requires_gradient_sync``: DDP's ``no_sync``; its gradients are whole on
        every rank anyway); HSDP reduce-scatters every micro-batch and all-reduces the replicas'
        shards once (``set_requires_all_reduce``, FSDP2's documented accumulation for HSDP); FSDP
        reduce-scatters every micro-batch and keeps only its shard. (A pipeline schedule holds
        every sync until the stage's last backward itself: ``torch.distributed.pipelining``.)"""
        from torch.distributed.fsdp import FSDPModule
        part = self.parts[0]
        if not isinstance(part, FSDPModule):
            return
        if not self.dims.fsdp:
            part.set_requires_gradient_sync(last)
        elif self.dims.dp_replicate > 1:
            part.set_requires_all_reduce(last)

    def step(self, step: int) -> float:
        import torch
        x, y = self.stream.local(step, self.dp_rank, self.dims.dp)
        x, y = x.to(self.device), y.to(self.device)
        self.opt.zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float32, device=self.device)
        with self._context():
            if self.schedule is not None:
                losses: list = []
                kwargs = {}
                if self.has_last:
                    kwargs.update(target=y, losses=losses)
                args = (x,) if self.has_first else ()
                self.schedule.step(*args, return_outputs=False, **kwargs)
                if self.has_last:
                    local += sum(_scalar(t) for t in losses) / len(losses)
            else:
                n, mb = self.par.grad_accum, self.par.micro_batch
                for i in range(n):
                    if n > 1:
                        self._dp_sync(last=i == n - 1)
                    out = self.parts[0](x[i * mb:(i + 1) * mb])
                    loss = _loss_fn(out, y[i * mb:(i + 1) * mb])
                    (loss / n).backward()
                    local += _scalar(loss) / n
        if self.tied_group is not None:
            from .parallel import sync_tied_grads
            sync_tied_grads(self.parts, self.tied_group)
        self.opt.step()
        # the step's loss: mean over the global batch (last stage, one TP rank per DP replica)
        if not (self.has_last and self.tp_rank == 0):
            local.zero_()
        self._dist.all_reduce(local)
        return float(local) / self.dims.dp

    # ---- measurements ---------------------------------------------------------------------
    def peak_memory_bytes(self) -> int:
        import torch
        if self.device_type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024   # Linux: KiB

    def gather_ints(self, v: int) -> list[int]:
        import torch
        t = torch.zeros(self.world, dtype=torch.int64, device=self.device)
        t[self.rank] = v
        self._dist.all_reduce(t)
        return [int(a) for a in t.tolist()]

    def any_rank(self, flag: bool) -> bool:
        import torch
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        self._dist.barrier()

    def gather_floats(self, v: float) -> list[float]:
        import torch
        t = torch.zeros(self.world, dtype=torch.float64, device=self.device)
        t[self.rank] = v
        self._dist.all_reduce(t)
        return [float(a) for a in t.tolist()]


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------

_SAVE_REQUESTED = False


def _on_sigusr1(signum, frame):  # pragma: no cover - signal
    global _SAVE_REQUESTED
    _SAVE_REQUESTED = True


def _log(opts: Options, rank: int, msg: str) -> None:
    if rank == 0 and not opts.quiet:
        print(f"runtime: {msg}", file=sys.stderr, flush=True)


def _checkpoint_meta(plan, history: list[list[float]]) -> dict:
    return {"model": plan.model.to_dict(), "workload": plan.workload.to_dict(),
            "parallel": plan.parallel.to_dict(), "mesh_order": list(plan.mesh_order),
            "world_size": plan.world_size, "losses": history}


def train(plan, opts: Options) -> dict:
    """Run ``plan`` in this process (one rank of the job). The process group is joined (or made)
    here unless one exists. Returns the summary (the same on every rank)."""
    from . import checkpoint as ckpt

    world_env = os.environ.get("WORLD_SIZE")
    if "torch" in sys.modules and sys.modules["torch"].distributed.is_initialized():
        world = sys.modules["torch"].distributed.get_world_size()
    else:
        world = int(world_env or 1)
    if world != plan.world_size:
        raise RuntimeUsageError(f"the plan needs {plan.world_size} processes (tp*pp*dp*cp = "
                                f"{plan.parallel.tp}*{plan.parallel.pp}*{plan.parallel.dp}*{plan.parallel.cp}) "
                                f"but this launch has WORLD_SIZE {world}")
    if opts.steps < 1:
        raise RuntimeUsageError(f"--steps must be >= 1, got {opts.steps}")
    if opts.checkpoint_every and not opts.checkpoint_dir:
        raise RuntimeUsageError("--checkpoint-every needs --checkpoint-dir")
    if opts.resume and opts.overwrite_checkpoints:
        raise RuntimeUsageError("--resume continues the checkpoints that --overwrite-checkpoints would remove; "
                                "give one of them")
    device_type = _device_type(opts.device)
    rank, world = init_distributed(device_type)
    _subgroup_timeouts()
    if opts.inject is not None and not 0 <= opts.inject.rank < world:
        raise RuntimeUsageError(f"--inject-failure rank {opts.inject.rank} is not a rank of this "
                                f"{world}-process job")
    lock = _claim_checkpoint_dir(opts, rank, world) if opts.checkpoint_dir else None
    try:
        return _train(plan, opts, ckpt, device_type, rank, world)
    finally:
        if lock is not None:
            lock.release()


def _subgroup_timeouts() -> None:
    """The groups made from here on (the mesh's, the tied pair's, async checkpoints') wait as long
    as the world group (``RUNTIME_TIMEOUT_S``), not torch's 30-minute default for new groups: a
    rank that stops answering fails every collective within that time (``--dead-after Ts``)."""
    import datetime

    import torch.distributed.distributed_c10d as c10d
    t = datetime.timedelta(seconds=float(os.environ.get("RUNTIME_TIMEOUT_S", "300")))
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if isinstance(getattr(c10d, name, None), datetime.timedelta):
            setattr(c10d, name, t)


def _agree(ok: bool, world: int) -> bool:
    """Collective: True when every rank is ok."""
    if world == 1:
        return ok
    import torch
    import torch.distributed as dist
    t = torch.tensor([0 if ok else 1], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return not t.item()


def _claim_checkpoint_dir(opts: Options, rank: int, world: int):
    """Rank 0: lock the directory (unless the launcher holds it) and refuse another run's
    checkpoints on a fresh start (or remove them, ``--overwrite-checkpoints``). Collective: every
    rank refuses when rank 0 does. Returns the lock held here, or None."""
    from .lock import DirectoryLock, clear_checkpoints, held_by_launcher, refuse_other_run
    lock, error = None, None
    if rank == 0:
        try:
            if not held_by_launcher(opts.checkpoint_dir):
                lock = DirectoryLock(opts.checkpoint_dir, "python -m runtime.train").acquire()
            if not opts.resume and restart_count() == 0:
                if opts.overwrite_checkpoints:
                    gone = clear_checkpoints(opts.checkpoint_dir)
                    if gone:
                        _log(opts, rank, f"--overwrite-checkpoints: removed {', '.join(gone)} from "
                                         f"{opts.checkpoint_dir}")
                else:
                    refuse_other_run(opts.checkpoint_dir)
        except RuntimeUsageError as e:
            error = e
            if lock is not None:
                lock.release()
                lock = None
    if not _agree(error is None, world):
        raise error or RuntimeUsageError(f"rank 0 refused checkpoint directory {opts.checkpoint_dir} (its message "
                                         "says why)")
    return lock


def _resume_point(opts: Options, rank: int, world: int):
    """The intact checkpoint to resume from (chosen by rank 0, which names what it skipped), or
    None. Collective."""
    from . import checkpoint as ckpt
    from .manifest import UnsafeCheckpoint
    step, error = 0, None
    if rank == 0:
        try:
            path = ckpt.find_intact(opts.checkpoint_dir, log=lambda m: _log(opts, rank, m),
                                    trusted=os.environ.get(ckpt.VERIFIED_ENV))
            step = -1 if path is None else int(path.name.split("-")[1])
        except UnsafeCheckpoint as e:
            error, step = e, -2
    if world > 1:
        import torch
        import torch.distributed as dist
        t = torch.tensor([step if rank == 0 else -3], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step = int(t.item())
    if step == -2:
        raise error or UnsafeCheckpoint(f"rank 0 found no intact checkpoint in {opts.checkpoint_dir}")
    return None if step < 0 else Path(opts.checkpoint_dir) / ckpt.step_name(step)


def _train(plan, opts: Options, ckpt, device_type: str, rank: int, world: int) -> dict:
    t_setup = time.perf_counter()
    tr = Trainer(plan, opts, device_type, rank, world)
    setup_s = time.perf_counter() - t_setup

    history: list[list[float]] = []     # [step, loss]
    start = 1
    resumed_from = None
    if opts.checkpoint_dir and (opts.resume or restart_count() > 0):
        path = _resume_point(opts, rank, world)
        if path is None:
            _log(opts, rank, f"no complete checkpoint in {opts.checkpoint_dir}; starting at step 1")
        else:
            meta = ckpt.read_meta(path)
            ckpt.check_compatible(meta, plan.model.to_dict(), plan.workload.to_dict(), str(path))
            ckpt.load(path, tr.parts, tr.opt, tr.tied_split)
            start = int(meta["step"]) + 1
            resumed_from = int(meta["step"])
            history = [list(h) for h in meta.get("losses", []) if h[0] <= resumed_from]
            _log(opts, rank, f"resumed from {path} (step {resumed_from}, written by "
                             f"{meta.get('world_size')} processes)")

    metrics_f = None
    if rank == 0 and opts.metrics:
        Path(opts.metrics).parent.mkdir(parents=True, exist_ok=True)
        metrics_f = open(opts.metrics, "a")
    old_handler = None
    if opts.checkpoint_dir:
        with contextlib.suppress(ValueError):   # not the main thread
            old_handler = signal.signal(signal.SIGUSR1, _on_sigusr1)
    tokens_per_step = plan.workload.global_batch * plan.workload.seq_len
    times: list[float] = []
    fail = opts.inject if (opts.inject is not None and opts.inject.active(restart_count())) else None
    slow = fail if (fail and fail.slow) else None
    if slow:
        fail = None
    last_saved = resumed_from
    from .stragglers import StragglerFound, StragglerWatch, slow_down, work_clock
    watch = StragglerWatch(tr.hosts, factor=opts.straggler_factor, steps=opts.straggler_steps)
    clock = work_clock(device_type)
    pending = None             # an asynchronous save in flight
    found = None               # StragglerFound to raise once the step is saved (--on-straggler replan)
    saves: list[dict[str, Any]] = []

    def hook_for(save_step: int):
        if not (fail and fail.phase == "save" and fail.step == save_step and fail.rank == rank):
            return None

        def hook():
            print(f"runtime: rank {rank}: injected failure while saving step {save_step}", file=sys.stderr, flush=True)
            _die()
        return hook

    def commit(pending, step_now: int) -> None:
        t = time.perf_counter()
        pending.commit(rank, tr.barrier, before_commit=hook_for(pending.step))
        saves[-1].update(committed_after_step=step_now, commit_s=time.perf_counter() - t)
        _log(opts, rank, f"checkpoint {ckpt.step_name(pending.step)} complete (written beside steps "
                         f"{pending.step + 1}-{step_now})" if step_now > pending.step else
                         f"checkpoint {ckpt.step_name(pending.step)} complete")

    try:
        for step in range(start, opts.steps + 1):
            if fail and fail.phase == "step" and fail.step == step and fail.rank == rank:
                print(f"runtime: rank {rank}: injected failure at step {step}", file=sys.stderr, flush=True)
                _die()
            t0 = time.perf_counter()
            w0 = clock()
            loss = tr.step(step)
            if device_type == "cuda":
                import torch
                torch.cuda.synchronize()
            work = clock() - w0
            if slow and slow.rank == rank and step >= slow.step:
                slow_down(work, slow.slow, clock)
                work = clock() - w0
            dt = time.perf_counter() - t0
            if world > 1:
                for s in watch.observe(step, tr.gather_floats(work)):
                    _log(opts, rank, f"straggler: {s.describe()}")
                    if opts.on_straggler == "replan":
                        found = StragglerFound(s)
            times.append(dt)
            history.append([step, loss])
            if metrics_f:
                metrics_f.write(json.dumps({"step": step, "loss": loss, "step_time_s": dt,
                                            "tokens_per_s": tokens_per_step / dt,
                                            "peak_memory_bytes": tr.peak_memory_bytes()}) + "\n")
                metrics_f.flush()
            _log(opts, rank, f"step {step}: loss {loss:.6f} ({dt * 1e3:.0f} ms)")
            stop = found is not None
            if opts.checkpoint_dir:
                trigger = Path(opts.checkpoint_dir) / "save-now"
                asked = tr.any_rank(_SAVE_REQUESTED or trigger.exists())
                if pending is not None and not tr.any_rank(not pending.done()):
                    commit(pending, step)
                    pending = None
                due = ((opts.checkpoint_every and step % opts.checkpoint_every == 0) or step == opts.steps or asked
                       or stop)
                if due:
                    if pending is not None:           # the previous one first (it is older)
                        commit(pending, step)
                        pending = None
                    t = time.perf_counter()
                    meta = _checkpoint_meta(plan, history)
                    if opts.async_checkpoint and not stop and step != opts.steps:
                        pending = ckpt.save_async(opts.checkpoint_dir, step, tr.parts, tr.opt, tr.tied_split, meta,
                                                  rank, tr.barrier, tr.ckpt_group)
                        saves.append({"step": step, "stall_s": time.perf_counter() - t, "async": True})
                    else:
                        ckpt.save(opts.checkpoint_dir, step, tr.parts, tr.opt, tr.tied_split, meta, rank, tr.barrier,
                                  before_commit=hook_for(step))
                        saves.append({"step": step, "stall_s": time.perf_counter() - t, "async": False,
                                      "committed_after_step": step})
                    last_saved = step
                    if asked:
                        _clear_request(trigger, rank)
            if stop:
                raise found
        if pending is not None:
            commit(pending, opts.steps)
            pending = None
        peak = tr.peak_memory_bytes()
        per_rank = tr.gather_ints(peak)
    finally:
        if metrics_f:
            metrics_f.close()
        if old_handler is not None:
            signal.signal(signal.SIGUSR1, old_handler)
    steady = times[1:] if len(times) > 1 else times
    step_time = statistics.median(steady) if steady else None
    summary: dict[str, Any] = {
        "losses": [h[1] for h in history],
        "steps": [int(h[0]) for h in history],
        "step_time_s": step_time,
        "tokens_per_s": (tokens_per_step / step_time) if step_time else None,
        "peak_memory_bytes": max(per_rank),
        "peak_memory_bytes_per_rank": per_rank,
        "mfu": _mfu(plan, step_time, device_type),
        "world_size": world,
        "device": device_type,
        "dtype": "bf16" if tr.bf16 else "fp32",
        "setup_s": setup_s,
        "resumed_from_step": resumed_from,
        "last_checkpoint_step": last_saved,
        "restart_count": restart_count(),
        "hosts": tr.hosts,
        "stragglers": [x.to_dict() for x in watch.reported],
        "checkpoints": saves,
        "parallel": plan.parallel.to_dict(),
        "predicted": dict(plan.estimate),
    }
    if rank == 0:
        if opts.metrics:
            with open(opts.metrics, "a") as f:
                f.write(json.dumps({"summary": {k: v for k, v in summary.items() if k != "predicted"}}) + "\n")
        if opts.json_out:
            worker.write_json(opts.json_out, summary)
    return summary


def _clear_request(trigger: Path, rank: int) -> None:
    global _SAVE_REQUESTED
    _SAVE_REQUESTED = False
    if rank == 0:
        with contextlib.suppress(FileNotFoundError):
            trigger.unlink()


def _mfu(plan, step_time: float | None, device_type: str) -> float | None:
    """Model FLOPs utilisation on GPUs: achieved training FLOP/s over the plan's GPU peak."""
    if device_type != "cuda" or not step_time:
        return None
    from .model import flops_per_token
    try:
        peak = plan.cluster.gpu.peak(plan.workload.dtype)
    except ValueError:
        return None
    tokens = plan.workload.global_batch * plan.workload.seq_len
    return flops_per_token(plan.model, plan.workload.seq_len) * tokens / step_time / (peak * plan.world_size)


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runtime.train",
                                description="Train a plan file with torch.distributed (run under torchrun, "
                                            "or alone for a one-process plan).")
    p.add_argument("--plan", required=True, help="plan file (YAML) written by `planner plan`")
    p.add_argument("--steps", type=int, default=10, help="train up to this step (default 10)")
    p.add_argument("--checkpoint-dir", default="", help="directory for DCP checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every K steps (and at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint")
    p.add_argument("--overwrite-checkpoints", action="store_true",
                   help="a fresh run into a directory that holds checkpoints: remove them first (refused otherwise)")
    p.add_argument("--metrics", default="", help="append one JSON line per step (rank 0)")
    p.add_argument("--json-out", default="", help="write the run summary as JSON (rank 0)")
    p.add_argument("--data", default="", help="token file (numpy memmap of ids); default synthetic tokens")
    p.add_argument("--data-dtype", default="auto", choices=("auto", "uint16", "uint32"),
                   help="the token file's id type; auto: uint16 when the vocabulary fits it (<= 65536), else uint32")
    p.add_argument("--inject-failure", default="", metavar="rank=R,step=S",
                   help="kill rank R at step S on the first attempt (phase=save: while checkpointing; "
                        "permanent: on every attempt, a dead device)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--lr", type=float, default=DEFAULT_LR)
    p.add_argument("--quiet", action="store_true")
    add_resilience_args(p)
    return p


def add_resilience_args(p: argparse.ArgumentParser) -> None:
    """Flags shared with ``planner launch``: asynchronous checkpoints and straggler handling."""
    p.add_argument("--async-checkpoint", action="store_true",
                   help="save checkpoints with torch.distributed.checkpoint.async_save (the job stalls only while "
                        "the state is copied; the manifest is written after the write completes)")
    p.add_argument("--straggler-factor", type=float, default=1.5, metavar="F",
                   help="a rank whose working time stays above F x the median rank's is a straggler (default 1.5)")
    p.add_argument("--straggler-steps", type=int, default=5, metavar="K",
                   help="... for K steps in a row (default 5)")
    p.add_argument("--on-straggler", choices=("report", "replan"), default="report",
                   help="report: name it (rank and host); replan: save a checkpoint and stop, so that the launcher "
                        "replans without the straggler's device (or node) and resumes")


def check_resilience_args(args) -> None:
    if not (args.straggler_factor > 1 and args.straggler_factor < float("inf")):
        raise RuntimeUsageError(f"--straggler-factor must be > 1, got {args.straggler_factor:g}")
    if args.straggler_steps < 1:
        raise RuntimeUsageError(f"--straggler-steps must be >= 1, got {args.straggler_steps}")


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(steps=args.steps, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                   resume=args.resume, overwrite_checkpoints=args.overwrite_checkpoints, metrics=args.metrics,
                   json_out=args.json_out, data=args.data,
                   data_dtype=args.data_dtype,
                   inject=Failure.parse(args.inject_failure) if args.inject_failure else None,
                   device=args.device, lr=args.lr, quiet=args.quiet, async_checkpoint=args.async_checkpoint,
                   straggler_factor=args.straggler_factor, straggler_steps=args.straggler_steps,
                   on_straggler=args.on_straggler)


def expected_errors() -> tuple[type[BaseException], ...]:
    from costmodel.specs import SpecError
    from planner.plan.planfile import PlanError

    from .manifest import UnsafeCheckpoint
    return (RuntimeUsageError, PlanError, SpecError, CheckpointMismatch, DataError, RuntimeModelError,
            PlanNotRunnable, UnsafeCheckpoint)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> None:
        from planner.plan.planfile import read_plan
        check_resilience_args(args)
        plan = read_plan(args.plan)
        if plan.mode != "train":
            raise RuntimeUsageError(f"{args.plan} is a {plan.mode!r} plan; the runtime trains (mode train)")
        run_training(plan, options_from_args(args))

    return worker.run("runtime", body, expected_errors())


def run_training(plan, opts: Options) -> dict | None:
    """``train`` in a worker process: a straggler found under ``--on-straggler replan`` (the step
    saved) makes the straggling rank leave with ``STRAGGLER_EXIT``, naming itself, so that torchrun
    and the launcher see it as the failed rank; the others wait to be stopped."""
    from .stragglers import STRAGGLER_EXIT, StragglerFound
    try:
        return train(plan, opts)
    except StragglerFound as e:
        import torch.distributed as dist
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == e.report.rank:
            print(f"runtime: rank {rank}: straggler: {e}; leaving the job (exit {STRAGGLER_EXIT})",
                  file=sys.stderr, flush=True)
            worker.exit_now(STRAGGLER_EXIT)
        time.sleep(3600)       # torchrun stops the rest once the straggler has left
        raise


if __name__ == "__main__":
    worker.exit_now(main())
