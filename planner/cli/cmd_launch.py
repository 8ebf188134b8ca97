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

HELP = "run a plan with the built-in runtime (torchrun) and compare measured with predicted"
REPO_ROOT = Path(__file__).resolve().parents[2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="plan file (YAML) from `planner plan`")
    p.add_argument("--steps", type=int, default=10, help="train up to this step (default 10)")
    p.add_argument("--checkpoint-dir", default="", help="directory for DCP checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="checkpoint every K steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (multi-node)")
    p.add_argument("--rdzv-endpoint", default="", help="host:port of the c10d rendezvous (multi-node)")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes on this node (default: world size / nnodes); must match the plan")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="elastic restarts after a failure; each resumes from the last complete checkpoint")
    p.add_argument("--inject-failure", default="", metavar="rank=R,step=S",
                   help="for tests: kill rank R at step S on the first attempt (phase=save: while saving; "
                        "permanent: on every attempt that uses that device)")
    p.add_argument("--on-failure", choices=("stop", "replan"), default="stop",
                   help="stop: report the failed rank (after --max-restarts); replan: exclude a device whose "
                        "rank keeps failing, replan for the rest and resume (one node)")
    p.add_argument("--dead-after", type=int, default=2, metavar="N",
                   help="with --on-failure replan: a device whose rank fails N times is dead (default 2)")
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
    if args.checkpoint_every < 0 or args.max_restarts < 0:
        raise UsageError("--checkpoint-every and --max-restarts must be >= 0")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if args.max_restarts and not args.checkpoint_dir:
        raise UsageError("--max-restarts needs --checkpoint-dir (a restart resumes from the last checkpoint)")
    if args.inject_failure:
        m = re.fullmatch(r"rank=(\d+),step=(\d+)(,phase=(step|save))?(,permanent)?", args.inject_failure)
        if not m:
            raise UsageError(f"--inject-failure {args.inject_failure!r}: expected "
                             "rank=R,step=S[,phase=step|save][,permanent]")
        if int(m.group(1)) >= world:
            raise UsageError(f"--inject-failure rank {m.group(1)} is not a rank of this {world}-process plan")
    if args.nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {args.nnodes}")
    if args.on_failure == "replan":
        if not args.checkpoint_dir:
            raise UsageError("--on-failure replan needs --checkpoint-dir (the job resumes from the last checkpoint)")
        if args.nnodes > 1 or _in_torchrun():
            raise UsageError("--on-failure replan runs the job on this node itself; it is not available with "
                             "--nnodes > 1 or inside torchrun (replan with `planner replan` and relaunch)")
        if args.dead_after < 1:
            raise UsageError(f"--dead-after must be >= 1, got {args.dead_after}")
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
    if plan.mode == "train":
        # the runtime's own checks, before any process starts (otherwise every rank refuses alone)
        from runtime.errors import PlanNotRunnable
        from runtime.parallel import Dims
        wl = plan.workload
        try:
            Dims.from_plan(plan.model, plan.parallel, plan.mesh_order, wl.seq_len, wl.global_batch, world)
        except PlanNotRunnable as e:
            raise UsageError(f"the built-in runtime cannot run {args.plan}: {e}") from None
        from planner.plan import targets as T
        cannot = T.problems("builtin", plan)      # the built-in target's table (planner/plan/targets.py)
        if cannot:
            raise UsageError(f"the built-in runtime cannot run {args.plan} as planned: {'; '.join(cannot)}; a plan it "
                             f"runs: `{T.plan_command(plan, 'builtin', args.plan)}`")
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
    return a


def torchrun_command(args: argparse.Namespace, nproc: int, device: str, json_out: str, metrics: str) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nnodes),
           "--nproc-per-node", str(nproc), "--max-restarts", str(args.max_restarts),
           "--monitor-interval", "0.2", "--rdzv-backend", "c10d"]
    if args.nnodes == 1 and not args.rdzv_endpoint:
        cmd += ["--rdzv-endpoint", "localhost:0", "--rdzv-id", f"launch-{os.getpid()}"]
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
                  env_extra: dict[str, str] | None = None) -> tuple[int, str]:
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
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
            if not quiet:
                sys.stderr.write(line)
                sys.stderr.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        rc = proc.wait(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        t.join(timeout=5)
        raise CheckFailed(f"the job did not finish in --timeout {timeout_s:g} s; stopped it") from None
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
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
                   inject=Failure.parse(args.inject_failure) if args.inject_failure else None, device=device)
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
            rc, tail = _run_torchrun(cmd, left, quiet=False, env_extra=env)
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
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------

def predicted_figures(estimate: dict) -> dict[str, Any]:
    """The estimate's figures this command compares (None where the plan has none)."""
    est = dict(estimate or {})
    mem = est.get("memory") or {}
    return {"step_time_s": est.get("step_time_s"), "tokens_per_s": est.get("tokens_per_s"),
            "peak_memory_bytes": mem.get("peak_bytes", est.get("peak_memory_bytes")), "mfu": est.get("mfu")}


def launch_json(summary: dict[str, Any], plan, metrics: str) -> dict[str, Any]:
    if plan.mode == "infer":
        out = {k: v for k, v in summary.items() if k != "predicted"}
        out["predicted"] = dict(plan.estimate or {})
        out["predicted_run"] = summary.get("predicted")
        return out
    out = {k: summary.get(k) for k in ("losses", "steps", "step_time_s", "tokens_per_s", "peak_memory_bytes",
                                       "peak_memory_bytes_per_rank", "mfu", "world_size", "device", "dtype",
                                       "resumed_from_step", "last_checkpoint_step", "restart_count")}
    out["predicted"] = dict(plan.estimate or {})
    ran = summary.get("dtype")
    if out["predicted"] and ran and ran != plan.workload.dtype:
        again = estimate_as_run(plan, ran)
        if again is not None:
            out["predicted"] = again
            out["predicted_for_dtype"] = ran
    out["metrics_file"] = metrics
    return out


def estimate_as_run(plan, dtype: str) -> dict[str, Any] | None:
    """The plan's estimate for the precision the runtime actually used (the CPU runtime trains in
    fp32 whatever the plan says: comparing with a bf16 prediction would charge the precision to
    the cost model). None when the cluster has no peak for that precision."""
    from costmodel.specs import SpecError
    from costmodel.training import estimate
    try:
        wl = dataclasses.replace(plan.workload, dtype=dtype)
        return estimate(plan.model, plan.cluster, wl, plan.parallel, stages=plan.stages,
                        order=plan.mesh_order).to_dict()
    except (SpecError, ValueError):
        return None


def _fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "s":
        return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"
    if kind == "bytes":
        return f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.1f} MiB"
    if kind == "pct":
        return f"{v * 100:.1f}%"
    return f"{v:,.0f}"


def print_table(out: dict[str, Any], plan) -> None:
    from rich.console import Console
    from rich.table import Table
    if plan.mode == "infer":
        from runtime.serve import compare_rows
        t = Table(title=f"{plan.model.name} serving: predicted vs measured ({out['world_size']} {out['device']} "
                        f"processes, {out['dtype']}, batch {out['batch']} x {out['replicas']} replicas, "
                        f"prompt {out['prompt_len']} + output {out['output_len']})", header_style="bold")
        for c in ("", "predicted", "measured", "measured / predicted"):
            t.add_column(c, justify="right" if c else "left")
        for label, p, m, kind in compare_rows({**out, "predicted": out.get("predicted_run")}):
            t.add_row(label, _fmt(p, kind), _fmt(m, kind), f"{m / p:.2f}" if (p and m is not None) else "-")
        c = Console(highlight=False)
        c.print(t)
        if out["device"] == "cpu":
            c.print("[dim]CPU processes over gloo; predictions are for the plan's GPUs[/dim]")
        return
    pred = predicted_figures(out["predicted"])
    again = (f"; predicted for {out['predicted_for_dtype']}, the plan says {plan.workload.dtype}"
             if out.get("predicted_for_dtype") else "")
    t = Table(title=f"{plan.model.name}: predicted vs measured ({out['world_size']} {out['device']} processes, "
                    f"{out['dtype']}{again})", header_style="bold")
    for c in ("", "predicted", "measured", "measured / predicted"):
        t.add_column(c, justify="right" if c else "left")
    rows = [("step time", "step_time_s", "s"), ("tokens/s", "tokens_per_s", "n"),
            ("peak memory per rank (max)", "peak_memory_bytes", "bytes"), ("MFU", "mfu", "pct")]
    for label, key, kind in rows:
        p, m = pred.get(key), out.get(key)
        ratio = f"{m / p:.2f}" if (p and m is not None) else "-"
        t.add_row(label, _fmt(p, kind), _fmt(m, kind), ratio)
    c = Console(highlight=False)
    c.print(t)
    per = out.get("peak_memory_bytes_per_rank") or []
    if per:
        c.print("peak memory by rank: " + ", ".join(f"{i}: {_fmt(b, 'bytes')}" for i, b in enumerate(per)))
    if out["device"] == "cpu":
        c.print("[dim]CPU processes: peak memory is each process's resident set (torch included); "
                "predictions are for the plan's GPUs[/dim]")
        cores = os.cpu_count() or 1
        if out["world_size"] > cores:
            c.print(f"[yellow]{out['world_size']} processes share {cores} CPU cores: measured step times include "
                    f"about {out['world_size'] / cores:.1f}x of time-sharing the prediction does not have[/yellow]")
    losses = out.get("losses") or []
    if losses:
        c.print(f"loss: step {out['steps'][0]} {losses[0]:.4f} -> step {out['steps'][-1]} {losses[-1]:.4f}"
                + (f" (resumed from step {out['resumed_from_step']})" if out.get("resumed_from_step") else ""))
    for r in out.get("replans") or []:
        c.print(f"replanned after rank {r['failed_rank']} failed (devices excluded: {', '.join(r['excluded_devices'])}): "
                f"{'; '.join(r['changes'])}; plan {r['plan']}")
    c.print(f"metrics: {out['metrics_file']}")


def run(args: argparse.Namespace) -> int:
    from planner.plan.planfile import read_plan
    plan = read_plan(args.plan)
    args._mode = plan.mode
    nproc, device = _check_args(args, plan)
    metrics = args.metrics or _default_metrics()
    Path(metrics).parent.mkdir(parents=True, exist_ok=True)
    if _in_torchrun():
        summary = _run_inside(args, plan, device, metrics)
        if summary is None:
            return 0
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
    if args.json:
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_table(out, plan)
    return 0
