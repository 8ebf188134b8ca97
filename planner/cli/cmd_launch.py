"""``planner launch``: run a plan with the built-in runtime and compare measured with predicted.

On one machine it starts torchrun (``python -m torch.distributed.run``) with the plan's world
size as processes on this node (GPUs where present, CPU processes over gloo otherwise); with
``--nnodes/--node-rank/--rdzv-endpoint`` it is one node of a multi-node job. Run inside an
existing torchrun (``torchrun ... -m planner launch PLAN``) it trains in that process. Every
rank runs ``python -m runtime.train`` (the emitters' entry point too); rank 0 writes the
per-step metrics (JSONL) and the summary this command prints.

Refused before any process starts (exit 2): a plan whose world size is not the launch's
(``--nnodes x --nproc-per-node``, or ``WORLD_SIZE`` of the torchrun we are in), a plan that
is not a training plan, bad flags. A rank that fails: torchrun stops the others, this
command names the rank and exits 1 (after ``--max-restarts`` elastic restarts, each of which
resumes from the newest complete checkpoint).

``--on-failure replan`` (one node): this command restarts the job itself, so that it sees which
rank failed each time. A device (a GPU; on the CPU, a process slot) whose rank fails
``--dead-after`` times (default 2) is dead: it is excluded, the plan is replanned for the
devices left (``planner.search.replan``: the checkpoint's layout kept where that costs little, the
global batch kept, the world size rounded down to one that has a plan), the new plan is
written next to the checkpoint directory (``D.replan-1.yaml``, ...) and the job resumes from the
last complete checkpoint under it. Other failures restart on the same plan, at most
``max(--max-restarts, --dead-after - 1)`` times in a row.

``--on-failure replan`` on several nodes (``--nnodes N --node-rank I --rdzv-endpoint H:P``, every
node): an elastic torchrun job whose rounds are agreed in the c10d rendezvous; a node that is
killed or silent for ``--dead-after Ts`` is dropped, the survivors replan for the nodes left and
resume from the last intact checkpoint with resharding (``planner.cli.elastic``).

Stragglers: ``--straggler-factor F --straggler-steps K`` (1.5, 5) name a rank slower than F x the
median for K steps, with its host; ``--on-straggler replan`` treats it as lost (its device, or its
node, is excluded and replanned away). ``--inject-failure rank=R,slow=X`` makes a rank X times
slower. ``--async-checkpoint`` saves with ``torch.distributed.checkpoint.async_save``.

Files and processes (issue 15): on one node this command locks ``--checkpoint-dir`` for the
whole job (``runtime.lock``; a second launch into it is refused, exit 2) and refuses, before any
process starts, a directory that already holds checkpoints unless ``--resume`` (continue them)
or ``--overwrite-checkpoints`` (remove them first); a resume reads only an intact step
(``runtime.manifest``). The one-node rendezvous listens on 127.0.0.1 only (``runtime.launcher``,
``GLOO_SOCKET_IFNAME=lo``). CPU processes are bounded by the cores unless ``--force``
(``planner.cli.procs``). SIGTERM is handled like Ctrl-C: torchrun and every worker are stopped
(none is left behind, even if torchrun itself dies first), the last complete checkpoint stays,
and the command exits 143 (Ctrl-C: 130) with a message on stderr.

No torch import at module level: the CLI must start fast.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from planner.plan.errors import CheckFailed, UsageError
from planner.cli.launch_report import launch_json, print_table

HELP = "run a plan with the built-in runtime (torchrun) and compare measured with predicted"
REPO_ROOT = Path(__file__).resolve().parents[2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="plan file (YAML) from `planner plan`")
    p.add_argument("--steps", type=int, default=10, help="train up to this step (default 10)")
    p.add_argument("--checkpoint-dir", default="", help="directory for DCP checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="checkpoint every K steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint")
    p.add_argument("--overwrite-checkpoints", action="store_true",
                   help="start afresh in a --checkpoint-dir that holds checkpoints, removing them first "
                        "(without it, or --resume, such a launch is refused)")
    p.add_argument("--force", action="store_true",
                   help="start more CPU processes than this machine's cores take (memory still bounds them)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (multi-node)")
    p.add_argument("--rdzv-endpoint", default="", help="host:port of the c10d rendezvous (multi-node)")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes on this node (default: world size / nnodes); must match the plan")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="elastic restarts after a failure; each resumes from the last complete checkpoint")
    p.add_argument("--inject-failure", default="", metavar="rank=R,step=S",
                   help="for tests: kill rank R at step S on the first attempt (phase=save: while saving; "
                        "permanent: on every attempt that uses that device); rank=R,slow=X[,step=S]: make "
                        "rank R X times slower (a straggler)")
    p.add_argument("--on-failure", choices=("stop", "replan"), default="stop",
                   help="stop: report the failed rank (after --max-restarts); replan: exclude a device whose "
                        "rank keeps failing (one node) or a node that is gone (--nnodes > 1), replan for the rest "
                        "and resume")
    p.add_argument("--dead-after", default="2", metavar="N|Ts",
                   help="with --on-failure replan: N: a device whose rank fails N times is dead (default 2); "
                        "Ts: a rank or node silent for T seconds is dead (default 30s with --nnodes > 1)")
    p.add_argument("--local-addr", default="", help="this node's address in a multi-node job (as the others reach it)")
    from runtime.train import add_resilience_args
    add_resilience_args(p)
    p.add_argument("--metrics", default="", help="JSONL of per-step metrics (default runs/launch-<time>.jsonl)")
    p.add_argument("--data", default="", help="token file (numpy memmap of ids); default synthetic tokens")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: GPUs when there are enough, else CPU processes")
    p.add_argument("--timeout", type=float, default=0, metavar="S", help="stop the job after S seconds")
    p.add_argument("--json", action="store_true", help="print one JSON object (the stable contract)")
    g = p.add_argument_group("inference plans (mode infer: runtime.serve)")
    g.add_argument("--prompt-len", type=int, default=0, help="prompt tokens (default: the plan's)")
    g.add_argument("--output-len", type=int, default=0, help="tokens to generate (default: the plan's)")
    g.add_argument("--batch", type=int, default=0, help="sequences per replica (default: the plan's)")


# --------------------------------------------------------------------------------------
# Checks before anything starts
# --------------------------------------------------------------------------------------

def _gpu_count() -> int:
    """GPUs visible through NVML (no torch import); 0 when there is no NVML or no GPU."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            n = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([v for v in vis.split(",") if v.strip()]))
    return n


def _in_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


CPU_PROCESS_LIMIT = 16   # CPU stand-ins for GPUs on one machine, beyond which a launch is refused


def _check_args(args: argparse.Namespace, plan) -> tuple[int, str]:
    """(processes on this node, device). Raises UsageError with the numbers."""
    world = plan.world_size
    if plan.mode == "infer":
        training = [f for f, on in (("--checkpoint-dir", args.checkpoint_dir), ("--resume", args.resume),
                                    ("--max-restarts", args.max_restarts), ("--inject-failure", args.inject_failure),
                                    ("--data", args.data)) if on]
        if training:
            raise UsageError(f"{', '.join(training)}: training options; {args.plan} is an inference plan")
        for flag, v in (("--prompt-len", args.prompt_len), ("--output-len", args.output_len), ("--batch", args.batch)):
            if v < 0:
                raise UsageError(f"{flag} must be >= 0 (0: the plan's), got {v}")
    elif plan.mode != "train":
        raise UsageError(f"{args.plan} is a {plan.mode!r} plan; `planner launch` runs train and infer plans")
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.resume and getattr(args, "overwrite_checkpoints", False):
        raise UsageError("--resume continues the checkpoints that --overwrite-checkpoints would remove; give one")
    if args.checkpoint_every < 0 or args.max_restarts < 0:
        raise UsageError("--checkpoint-every and --max-restarts must be >= 0")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if args.max_restarts and not args.checkpoint_dir:
        raise UsageError("--max-restarts needs --checkpoint-dir (a restart resumes from the last checkpoint)")
    if isinstance(args.dead_after, str):
        from planner.cli.elastic import parse_dead_after
        args.dead_after, args.dead_after_s = parse_dead_after(args.dead_after)
    from runtime.errors import RuntimeUsageError
    from runtime.train import Failure, check_resilience_args
    try:
        check_resilience_args(args)
    except RuntimeUsageError as e:
        raise UsageError(str(e)) from None
    if args.on_straggler == "replan" and args.on_failure != "replan":
        raise UsageError("--on-straggler replan needs --on-failure replan (the straggler is then treated as lost)")
    if args.inject_failure:
        m = re.match(r"rank=(\d+),", args.inject_failure + ",")
        try:
            injected = Failure.parse(args.inject_failure)
        except RuntimeUsageError as e:
            raise UsageError(str(e)) from None
        if injected.step > args.steps:      # it would never fire: accepted and ignored
            raise UsageError(f"--inject-failure step {injected.step} is after the last step (--steps {args.steps}); "
                             f"give a step from 1 to {args.steps}")
        if not m:
            raise UsageError(f"--inject-failure {args.inject_failure!r}: expected "
                             "rank=R,step=S[,phase=step|save][,permanent] or rank=R,slow=X[,step=S][,permanent]")
        if int(m.group(1)) >= world:
            raise UsageError(f"--inject-failure rank {m.group(1)} is not a rank of this {world}-process plan")
    if args.nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {args.nnodes}")
    if args.on_failure == "replan":
        if not args.checkpoint_dir:
            raise UsageError("--on-failure replan needs --checkpoint-dir (the job resumes from the last checkpoint)")
        if _in_torchrun():
            raise UsageError("--on-failure replan runs the job itself; it is not available inside torchrun "
                             "(replan with `planner replan` and relaunch)")
        if args.nnodes > 1 and args.node_rank is None:
            raise UsageError(f"--on-failure replan with --nnodes {args.nnodes} needs --node-rank (0 on the node "
                             "that writes the job's session file)")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise UsageError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")
    if _in_torchrun():
        launched = int(os.environ["WORLD_SIZE"])
        if launched != world:
            raise UsageError(f"the plan needs {world} processes ({_degrees(plan)}) but this torchrun has "
                             f"WORLD_SIZE {launched}; relaunch with {world} processes or replan for {launched}")
        return int(os.environ.get("LOCAL_WORLD_SIZE", launched)), args.device
    nproc = args.nproc_per_node if args.nproc_per_node is not None else world // args.nnodes
    if nproc * args.nnodes != world:
        raise UsageError(f"the plan needs {world} processes ({_degrees(plan)}) but the launch has "
                         f"--nnodes {args.nnodes} x --nproc-per-node {nproc} = {nproc * args.nnodes}; "
                         f"use {world // args.nnodes if world % args.nnodes == 0 else 'a divisor of ' + str(world)} "
                         f"per node, or replan with `planner replan {args.plan} --gpus {nproc * args.nnodes}`")
    device = args.device
    gpus = _gpu_count() if device != "cpu" else 0
    if device == "cuda" and gpus < nproc:
        raise UsageError(f"--device cuda: {nproc} processes per node need {nproc} GPUs; this node has {gpus}")
    if device == "auto":
        device = "cuda" if gpus >= nproc else "cpu"
    if device == "cpu" and nproc > CPU_PROCESS_LIMIT:
        raise UsageError(f"the plan needs {nproc} processes on this node ({_degrees(plan)}, planned for "
                         f"{plan.cluster.gpu.name}), but it has no GPUs for them; as CPU processes that is more "
                         f"than {CPU_PROCESS_LIMIT} (about 0.35 GiB each). Run it on its cluster (`planner emit`), "
                         f"or plan for this machine: `planner plan --cluster cpu --gpus N ...`")
    if device == "cpu":
        from planner.cli.procs import check_cpu_processes
        check_cpu_processes(nproc, "--nproc-per-node" if args.nproc_per_node is not None else "the plan's",
                            getattr(args, "force", False), "CPU processes standing in for GPUs")
    if plan.mode == "train":
        # the runtime's own checks, before any process starts (otherwise every rank refuses alone)
        from runtime.errors import PlanNotRunnable
        from runtime.parallel import Dims
        wl = plan.workload
        try:
            Dims.from_plan(plan.model, plan.parallel, plan.mesh_order, wl.seq_len, wl.global_batch, world)
        except PlanNotRunnable as e:
            raise UsageError(f"the built-in runtime cannot run {args.plan}: {e}") from None
        from planner.cli import target_notes
        from planner.plan import targets as T
        cannot = T.problems("builtin", plan)      # the built-in target's table (planner/plan/targets.py)
        if cannot:
            raise UsageError(f"the built-in runtime cannot run {args.plan} as planned: {'; '.join(cannot)}; a plan it "
                             f"runs: `{target_notes.plan_command(plan, 'builtin', args.plan)}`")
    return nproc, device


def _degrees(plan) -> str:
    p = plan.parallel
    return f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp}"


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------

def _default_metrics() -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return str(Path("runs") / f"launch-{stamp}-{os.getpid()}.jsonl")


def _train_args(args: argparse.Namespace, device: str, json_out: str, metrics: str) -> list[str]:
    a = ["--plan", str(Path(args.plan).resolve()), "--steps", str(args.steps), "--json-out", json_out,
         "--metrics", metrics, "--device", device]
    if args.checkpoint_dir:
        a += ["--checkpoint-dir", str(Path(args.checkpoint_dir).resolve())]
    if args.checkpoint_every:
        a += ["--checkpoint-every", str(args.checkpoint_every)]
    if args.resume:
        a.append("--resume")
    if args.inject_failure:
        a += ["--inject-failure", args.inject_failure]
    if args.data:
        a += ["--data", str(Path(args.data).resolve())]
    if getattr(args, "async_checkpoint", False):
        a.append("--async-checkpoint")
    for flag in ("straggler_factor", "straggler_steps", "on_straggler"):
        if getattr(args, flag, None) is not None:
            a += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return a


def _one_node(args: argparse.Namespace) -> bool:
    return args.nnodes == 1 and not args.rdzv_endpoint


def torchrun_command(args: argparse.Namespace, nproc: int, device: str, json_out: str, metrics: str) -> list[str]:
    # one node: torchrun with its stores on loopback only (runtime.launcher); several: torchrun itself
    runner = "runtime.launcher" if _one_node(args) else "torch.distributed.run"
    cmd = [sys.executable, "-m", runner, "--nnodes", str(args.nnodes),
           "--nproc-per-node", str(nproc), "--max-restarts", str(args.max_restarts),
           "--monitor-interval", "0.2", "--rdzv-backend", "c10d"]
    if _one_node(args):
        cmd += ["--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1", "--rdzv-id", f"launch-{os.getpid()}"]
    else:
        cmd += ["--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", "planner-launch"]
    if args.node_rank is not None:
        cmd += ["--node-rank", str(args.node_rank)]
    if getattr(args, "_mode", "train") == "infer":
        from runtime.serve import launch_module_args
        return cmd + launch_module_args(args.plan, device, json_out, args.prompt_len, args.output_len, args.batch)
    return cmd + ["-m", "runtime.train"] + _train_args(args, device, json_out, metrics)


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_RUNTIME_ERR = re.compile(r"runtime: rank (\d+): error: (.*)")


def _failure(stderr_tail: str, rc: int, ckpt_dir: str) -> Exception:
    """The error for a failed job: the rank that failed first, how, and the checkpoint left."""
    m = _RUNTIME_ERR.search(stderr_tail)
    if m:   # a rank refused its input (exit 2): that is a usage error, not a crash
        return UsageError(f"rank {m.group(1)}: {m.group(2)}")
    # torchrun's ChildFailedError report: the "Root Cause (first observed failure)" block
    cause = stderr_tail[stderr_tail.rfind("Root Cause"):] if "Root Cause" in stderr_tail else stderr_tail
    ranks = _ROOT_CAUSE.findall(cause)
    codes = _EXITCODE.findall(cause)
    how = ""
    if codes:
        c = int(codes[0])
        how = f"exit code {c}" + (f" ({signal.Signals(-c).name})" if c < 0 and -c in signal.Signals._value2member_map_
                                  else "")
    who = f"rank {ranks[0][0]}" if ranks else "a rank"
    msg = f"{who} failed" + (f" ({how})" if how else "") + f"; torchrun stopped the job (exit {rc})"
    if ckpt_dir:
        from runtime.checkpoint import find_latest
        latest = find_latest(ckpt_dir)
        msg += f"; last complete checkpoint: {latest}" if latest else "; no complete checkpoint"
    return CheckFailed(msg)


def _failed_rank(stderr_tail: str) -> int | None:
    """The rank torchrun names as the root cause of a failed job (None if it names none)."""
    cause = stderr_tail[stderr_tail.rfind("Root Cause"):] if "Root Cause" in stderr_tail else ""
    ranks = _ROOT_CAUSE.findall(cause)
    return int(ranks[0][0]) if ranks else None


def _run_torchrun(cmd: list[str], timeout_s: float, quiet: bool,
                  env_extra: dict[str, str] | None = None, log: Any = None) -> tuple[int, str]:
    """Runs torchrun; its workers' output goes to our stderr, or with ``log`` (an open text file)
    there instead. Returns (exit code, the output's last lines)."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env.update(_SESSION_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if "runtime.launcher" in cmd:        # one node: the workers' sockets on loopback too
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    # the workers' output goes to our stderr (stdout is for data); keep a tail to name a failure
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, text=True, start_new_session=True)
    tail: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            if len(tail) > 400:
                del tail[:100]
            if log is not None:
                log.write(line)
                log.flush()
            elif not quiet:
                sys.stderr.write(line)
                sys.stderr.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        rc = proc.wait(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
        from planner.cli.procs import stop_tree
        stop_tree(proc, grace_s=10)
        t.join(timeout=5)
        raise CheckFailed(f"the job did not finish in --timeout {timeout_s:g} s; stopped it") from None
    except BaseException as e:     # Ctrl-C, SIGTERM (planner.cli.procs.Terminated): stop the whole tree
        from planner.cli.procs import stop_tree
        n = stop_tree(proc)
        if hasattr(e, "stopped"):
            e.stopped = n
        raise
    from planner.cli.procs import stop_orphans
    left = stop_orphans()        # workers of a torchrun that died before them (adopted by this process)
    if left:
        _say(f"torchrun exited ({rc}) with {left} worker process(es) still running; stopped them")
    t.join(timeout=5)
    return rc, "".join(tail)


def _run_inside(args: argparse.Namespace, plan, device: str, metrics: str) -> dict[str, Any] | None:
    """Inside an existing torchrun: this process is one rank; train (or serve) here."""
    if plan.mode == "infer":
        from runtime.serve import ServeOptions, serve
        from runtime.train import expected_errors as errors
        try:
            summary = serve(plan, ServeOptions(prompt_len=args.prompt_len, output_len=args.output_len,
                                               batch=args.batch, device=device, quiet=True))
        except errors() as e:
            raise UsageError(str(e)) from None
        return summary if int(os.environ.get("RANK", "0")) == 0 else None
    from runtime.train import Failure, Options, expected_errors, train
    opts = Options(steps=args.steps, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                   resume=args.resume, metrics=metrics, data=args.data,
                   inject=Failure.parse(args.inject_failure) if args.inject_failure else None, device=device,
                   async_checkpoint=args.async_checkpoint, straggler_factor=args.straggler_factor,
                   straggler_steps=args.straggler_steps, on_straggler=args.on_straggler)
    try:
        summary = train(plan, opts)
    except expected_errors() as e:
        raise UsageError(str(e)) from None
    return summary if int(os.environ.get("RANK", "0")) == 0 else None


# --------------------------------------------------------------------------------------
# --on-failure replan
# --------------------------------------------------------------------------------------

def _device_slots(device: str, nproc: int) -> list[str]:
    """The devices this node's ranks run on, in local-rank order: GPU ids (as
    ``CUDA_VISIBLE_DEVICES`` names them) on CUDA, process slots ``0..n-1`` on the CPU."""
    if device == "cuda":
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [v.strip() for v in vis.split(",") if v.strip()] if vis is not None else \
            [str(i) for i in range(_gpu_count())]
        return ids[:nproc]
    return [str(i) for i in range(nproc)]


def _injection(text: str, slot: str | None, used: list[str], first: bool) -> str:
    """``--inject-failure`` for one launch: the flag names a rank of the first launch, i.e. a
    device; it fires on the first launch, or (``permanent``) on every launch that uses that
    device, at the rank the device has there."""
    if not text or slot is None or slot not in used or not (first or text.endswith(",permanent")):
        return ""
    return re.sub(r"^rank=\d+", f"rank={used.index(slot)}", text)


def worker_log_path(ckpt_dir: str) -> Path:
    """Where ``--on-failure replan`` keeps every launch's worker output: beside the checkpoint
    directory, like the replanned plans (``D.workers.log``)."""
    d = Path(ckpt_dir).resolve()
    return d.parent / f"{d.name}.workers.log"


def _replan_path(ckpt_dir: str, k: int) -> Path:
    d = Path(ckpt_dir).resolve()
    return d.parent / f"{d.name}.replan-{k}.yaml"


def _say(msg: str) -> None:
    print(f"planner launch: {msg}", file=sys.stderr, flush=True)


def _run_replanning(args: argparse.Namespace, plan, nproc: int, device: str,
                    metrics: str) -> tuple[dict[str, Any], Any, list[dict[str, Any]], int]:
    """Run the job; on a dead device, exclude it, replan, resume (see the module docstring).
    Returns (rank 0's summary, the plan that finished, the replans, the relaunches in all)."""
    from planner.plan.errors import PlannerError
    from planner.plan.planfile import write_plan
    from planner.search.replan import changed_cluster, describe_changes, replan
    from planner.cli.result import plans_from_result

    slots = _device_slots(device, nproc)
    if len(slots) < nproc:
        raise UsageError(f"{nproc} processes need {nproc} devices; this node has {len(slots)}")
    m = re.match(r"rank=(\d+)", args.inject_failure or "")
    inject_slot = slots[int(m.group(1))] if m else None
    failures: dict[str, int] = {}
    dead: list[str] = []
    replans: list[dict[str, Any]] = []
    cur, cur_path, used = plan, str(Path(args.plan).resolve()), list(slots)
    resume, first, restarts, total = args.resume, True, 0, 0
    budget = max(args.max_restarts, args.dead_after - 1)
    deadline = (time.monotonic() + args.timeout) if args.timeout else None
    tmpdir = tempfile.mkdtemp(prefix="planner-launch-")
    log_path = worker_log_path(args.checkpoint_dir)
    args._worker_log = str(log_path)
    from profiles.safeio import check_append
    check_append(str(log_path), "the worker log")
    log = open(log_path, "a")
    _say(f"worker output (every launch, tracebacks included): {log_path}")
    try:
        while True:
            a = argparse.Namespace(**vars(args))
            a.plan, a.resume, a.max_restarts = cur_path, resume, 0
            a.inject_failure = _injection(args.inject_failure, inject_slot, used, first)
            json_out = os.path.join(tmpdir, f"summary-{len(replans)}-{restarts}.json")
            cmd = torchrun_command(a, cur.world_size, device, json_out, str(Path(metrics).resolve()))
            env = {"CUDA_VISIBLE_DEVICES": ",".join(used)} if device == "cuda" else {}
            left = (deadline - time.monotonic()) if deadline else 0
            if deadline and left <= 0:
                raise CheckFailed(f"the job did not finish in --timeout {args.timeout:g} s; stopped it")
            log.write(f"==== planner launch: {' '.join(cmd)}\n")
            log.flush()
            rc, tail = _run_torchrun(cmd, left, quiet=False, env_extra=env, log=log)
            first, resume = False, True
            if rc == 0:
                if not os.path.exists(json_out):
                    raise CheckFailed(f"the job ended without a summary (torchrun exit {rc}); see the log above")
                return json.loads(Path(json_out).read_text()), cur, replans, total
            err = _failure(tail, rc, args.checkpoint_dir)
            rank = _failed_rank(tail)
            if isinstance(err, UsageError) or rank is None or rank >= len(used):
                raise err
            slot = used[rank]
            failures[slot] = failures.get(slot, 0) + 1
            what = f"rank {rank} (device {slot})"
            total += 1
            if re.search(rf"runtime: rank {rank}: straggler:", tail):       # --on-straggler replan
                failures[slot] = max(failures[slot], args.dead_after)
                what += " straggled and"
            if failures[slot] < args.dead_after:
                restarts += 1
                if restarts > budget:
                    raise err
                _say(f"{what} failed ({failures[slot]} of {args.dead_after} before it counts as dead); "
                     f"restarting on the same plan from the last checkpoint ({restarts} of {budget})")
                continue
            # a dead device: exclude it, replan for the rest, resume under the new plan
            dead.append(slot)
            alive = [s for s in slots if s not in dead]
            _say(f"{what} failed {failures[slot]} times: a dead device; excluding it and replanning for "
                 f"{len(alive)} device(s)")
            try:
                cluster = changed_cluster(cur.cluster, gpus=len(alive))
                rp = replan(cur, cluster, max_time_s=max(1.0, min(60.0, left or 60.0)))
            except PlannerError as e:
                raise CheckFailed(f"{what} is dead and no plan fits the {len(alive)} device(s) left: {e}") from None
            new = plans_from_result(dataclasses.replace(rp.result, solutions=[rp.solution]), cur.model, cluster,
                                    cur.workload, cluster_source="replan")[0]
            path = _replan_path(args.checkpoint_dir, len(replans) + 1)
            new = new.replace(provenance=dict(new.provenance, replanned_from=cur_path, excluded_devices=list(dead)))
            write_plan(new, path)
            changes = describe_changes(cur, new)
            from runtime.checkpoint import find_latest
            latest = find_latest(args.checkpoint_dir)
            replans.append({"plan": str(path), "excluded_devices": list(dead), "failed_rank": rank,
                            "world_size": new.world_size, "changes": changes,
                            "resume_from": str(latest) if latest else None,
                            "replan_wall_time_s": rp.wall_time_s})
            _say(f"replanned in {rp.wall_time_s:.2f} s: {'; '.join(changes)}; wrote {path}; resuming from "
                 f"{latest.name if latest else 'step 1 (no complete checkpoint)'}")
            cur, cur_path, used = new, str(path), alive[:new.world_size]
            failures, restarts = {}, 0
    except (CheckFailed, UsageError) as e:       # the one-line summary, with where the details are
        raise type(e)(f"{e}; worker output: {log_path}") from None
    finally:
        log.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------

_SESSION_ENV: dict[str, str] = {}     # what every torchrun of this command gets (the lock it holds)
_LOCKS: list = []                      # the checkpoint-directory lock this command holds


def run(args: argparse.Namespace) -> int:
    """The command (``_run``), with SIGTERM handled like Ctrl-C and the checkpoint directory
    locked on one node (module docstring)."""
    if _in_torchrun():
        return _run(args)
    from planner.cli.procs import EXIT_SIGTERM, Terminated, become_subreaper, sigterm_as_exception
    become_subreaper()
    with sigterm_as_exception():
        try:
            return _run(args)
        except Terminated as e:
            where = ""
            if args.checkpoint_dir:
                from runtime.checkpoint import find_latest
                latest = find_latest(args.checkpoint_dir)
                where = f"; last complete checkpoint: {latest}" if latest else "; no complete checkpoint"
            stopped = f"stopped torchrun and its workers ({e.stopped} process(es))" if e.stopped else "nothing was running"
            _say(f"{e}: {stopped}{where}; exit {EXIT_SIGTERM}")
            return EXIT_SIGTERM
        finally:
            while _LOCKS:
                _LOCKS.pop().release()
            _SESSION_ENV.clear()


def _claim_checkpoint_dir(args: argparse.Namespace):
    """One node, before any process starts: lock ``--checkpoint-dir`` and refuse another run's
    checkpoints (or remove them, ``--overwrite-checkpoints``). Returns the lock (or None)."""
    if not args.checkpoint_dir or not _one_node(args):
        return None       # several nodes: rank 0 of the job locks it (runtime.train)
    from runtime.errors import RuntimeUsageError
    from runtime.lock import ENV_HELD, DirectoryLock, clear_checkpoints, refuse_other_run
    try:
        lock = DirectoryLock(args.checkpoint_dir, "planner launch").acquire()
    except RuntimeUsageError as e:
        raise UsageError(str(e)) from None
    try:
        if args.resume:
            # the step a resume starts from, checked before any process starts (and never unpickled)
            from runtime.checkpoint import VERIFIED_ENV, find_intact, verified_token
            from runtime.manifest import UnsafeCheckpoint
            try:
                step = find_intact(args.checkpoint_dir, log=_say)
            except UnsafeCheckpoint as e:
                raise UsageError(str(e)) from None
            if step is not None:
                _SESSION_ENV[VERIFIED_ENV] = verified_token(step)
        else:
            if getattr(args, "overwrite_checkpoints", False):
                gone = clear_checkpoints(args.checkpoint_dir)
                if gone:
                    _say(f"--overwrite-checkpoints: removed {', '.join(gone)} from {args.checkpoint_dir}")
            else:
                refuse_other_run(args.checkpoint_dir)
    except (RuntimeUsageError, OSError) as e:
        lock.release()
        raise UsageError(str(e)) from None
    except BaseException:
        lock.release()
        raise
    _SESSION_ENV[ENV_HELD] = os.path.realpath(args.checkpoint_dir)
    return lock


def _run(args: argparse.Namespace) -> int:
    from planner.plan.planfile import read_plan
    plan = read_plan(args.plan)
    args._mode = plan.mode
    nproc, device = _check_args(args, plan)
    if getattr(args, "dead_after_s", None):      # a collective waits at most this long for a rank
        _SESSION_ENV["RUNTIME_TIMEOUT_S"] = f"{args.dead_after_s:g}"
    metrics = args.metrics or _default_metrics()
    from profiles.safeio import check_append
    check_append(metrics, "--metrics")
    if not _in_torchrun():
        lock = _claim_checkpoint_dir(args)
        if lock is not None:
            _LOCKS.append(lock)
    Path(metrics).parent.mkdir(parents=True, exist_ok=True)
    if _in_torchrun():
        summary = _run_inside(args, plan, device, metrics)
        if summary is None:
            return 0
    elif args.on_failure == "replan" and not _one_node(args):        # several nodes: planner.cli.elastic
        from planner.cli.elastic import launch as elastic_launch
        got = elastic_launch(args, nproc, device, metrics, _train_args, _run_torchrun, _failure)
        if got is None:
            return 0         # rank 0 ran on another node and reports there
        summary, plan, replans, restarts = got
    elif args.on_failure == "replan":
        summary, plan, replans, restarts = _run_replanning(args, plan, nproc, device, metrics)
    else:
        tmpdir = tempfile.mkdtemp(prefix="planner-launch-")
        try:
            json_out = os.path.join(tmpdir, "summary.json")
            cmd = torchrun_command(args, nproc, device, json_out, str(Path(metrics).resolve()))
            rc, tail = _run_torchrun(cmd, args.timeout, quiet=False)
            if rc != 0:
                raise _failure(tail, rc, args.checkpoint_dir)
            if not os.path.exists(json_out):
                if args.nnodes > 1 and args.node_rank not in (None, 0):
                    return 0     # rank 0 lives on another node and reports there
                raise CheckFailed(f"the job ended without a summary (torchrun exit {rc}); see the log above")
            summary = json.loads(Path(json_out).read_text())
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
    out = launch_json(summary, plan, metrics)
    if args.on_failure == "replan":
        out.update(replans=replans, restarts=restarts, plan=str(Path(args.plan).resolve()) if not replans
                   else replans[-1]["plan"])
        if getattr(args, "_worker_log", None):
            out["worker_log"] = args._worker_log
    if args.json:
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_table(out, plan)
    return 0
