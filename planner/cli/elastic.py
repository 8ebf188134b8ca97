"""Multi-node recovery: ``planner launch PLAN --nnodes N ... --on-failure replan`` on every node.

How a lost node is handled, from the top:

1. Each node's ``planner launch`` runs torchrun as an elastic job (``--nnodes 1:N``, c10d
   rendezvous, ``--max-restarts``) whose workers are ``python -m planner.cli.elastic`` (this
   module), a thin wrapper around ``runtime.train``. The node with ``--node-rank 0`` writes the
   job's session file, ``D.elastic.json`` next to ``--checkpoint-dir D`` (which every node
   reaches: a resume reads it), before its torchrun starts.
2. A node dies: its agent is killed (its heartbeats to the rendezvous stop) or its ranks stop
   answering (every collective has ``--dead-after`` seconds, the process group's timeout). The
   surviving ranks fail on their next collective, their agents stop them and meet again in the
   c10d rendezvous; the dead node, silent for ``--dead-after`` seconds (``keep_alive_interval`` 1 s
   x ``keep_alive_max_attempt``), is dropped from it. The new round *is* the survivors'
   agreement: every agent gets the same members, ranks and world size.
3. In the new round every worker writes its node's name to the round's store; rank 0 reads them
   and the session, and decides for everyone: the plan for the nodes present (the current plan
   if its world size is the job's; otherwise ``planner.search.replan`` for the nodes left, the
   checkpoint's layout kept where that costs little, written as ``D.replan-K.yaml``), the ranks
   that take part (all but an excluded straggler's node, and any beyond the new plan's world
   size, which leave at once), and whether to resume (always, after the first round). It writes
   the decision to the store and appends the round to the session file.
4. The ranks that take part join a process group of that size over the round's store and train
   (``runtime.train``): the resume reads the newest intact checkpoint (``runtime.manifest``) and
   torch.distributed.checkpoint reshards it onto the new layout; the loss curve continues.

A straggler (``--on-straggler replan``): every rank sees it at the same step (``runtime.stragglers``);
the job saves, rank 0 records the straggler's node in the session as excluded, the straggler
leaves (exit 75), and the next round runs without that node's ranks: the same path as a loss.

Limits: the node that hosts the rendezvous (``--rdzv-endpoint``; torchrun's c10d store lives in
its agent) must survive: losing it stops the job, which the other nodes report. Nodes must start
within ``--dead-after`` seconds of each other (a later one joins as a membership change: one
restart).

Each round gets a store of its own (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: rank 0 of the round
hosts it), so nothing of a dead round's keys is read by the next; the attempt number the runtime
sees is the session's (the same on every rank), not the agent's restart count (agents that
restarted for a membership change do not count it).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

NODE_ENV = "PLANNER_NODE"
DEFAULT_DEAD_AFTER_S = 30.0


# --------------------------------------------------------------------------------------
# --dead-after: N failures (one node), or T seconds of silence
# --------------------------------------------------------------------------------------

def parse_dead_after(text: str) -> tuple[int, float | None]:
    """``--dead-after N`` (a device failing N times is dead, one node), ``Ts`` (a rank or node
    silent for T seconds is dead), or both, ``N,Ts``. Returns (count, seconds or None)."""
    from planner.plan.errors import UsageError
    count, secs = 2, None
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)s", part)
        if m:
            secs = float(m.group(1))
            if not secs > 0:
                raise UsageError(f"--dead-after {text!r}: seconds must be > 0")
        elif part.isdigit():
            count = int(part)
            if count < 1:
                raise UsageError(f"--dead-after must be >= 1, got {count}")
        else:
            raise UsageError(f"--dead-after {text!r}: expected N (failures), Ts (seconds of silence) or N,Ts, "
                             "e.g. 2, 30s or 2,30s")
    return count, secs


# --------------------------------------------------------------------------------------
# The session file
# --------------------------------------------------------------------------------------

def session_path(ckpt_dir: str | os.PathLike) -> Path:
    d = Path(ckpt_dir).resolve()
    return d.parent / f"{d.name}.elastic.json"


def replan_path(ckpt_dir: str | os.PathLike, k: int) -> Path:
    d = Path(ckpt_dir).resolve()
    return d.parent / f"{d.name}.replan-{k}.yaml"


def _write(path: Path, obj: Any) -> None:
    from runtime.worker import write_json
    write_json(str(path), obj)


def checkpoint_dir_of(session_file: str | os.PathLike) -> Path:
    p = Path(session_file)
    return p.with_name(p.name.removesuffix(".elastic.json"))


def read_session(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def start_session(args: argparse.Namespace) -> Path:
    """The node with ``--node-rank 0``, before its torchrun starts: a fresh session for this launch."""
    path = session_path(args.checkpoint_dir)
    plan = str(Path(args.plan).resolve())
    _write(path, {"launch": uuid.uuid4().hex, "started": _now(), "plan": plan, "current": plan,
                  "resume": bool(args.resume), "attempts": [], "replans": [], "excluded_nodes": [],
                  "stragglers": []})
    return path


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_name(args: argparse.Namespace) -> str:
    """How a node is named in the session and the reports: host, and its address or node rank
    (network namespaces and containers share a host name)."""
    host = socket.gethostname()
    where = getattr(args, "local_addr", "") or (f"node{args.node_rank}" if args.node_rank is not None else "")
    return f"{host}/{where}" if where else host


# --------------------------------------------------------------------------------------
# torchrun for the elastic job
# --------------------------------------------------------------------------------------

def torchrun_command(args: argparse.Namespace, nproc: int, train_args: list[str], session: Path) -> list[str]:
    host = args.rdzv_endpoint.rsplit(":", 1)[0].strip("[]")
    secs = args.dead_after_s or DEFAULT_DEAD_AFTER_S
    conf = [f"last_call_timeout={max(2, int(round(secs)))}", "keep_alive_interval=1",
            f"keep_alive_max_attempt={max(2, int(round(secs)))}", "join_timeout=900"]
    if getattr(args, "local_addr", "") and args.local_addr == host:
        conf.insert(0, "is_host=1")          # this node hosts the rendezvous store
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", f"1:{args.nnodes}",
           "--nproc-per-node", str(nproc), "--max-restarts", str(args.max_restarts or 3),
           "--monitor-interval", "0.2", "--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint,
           "--rdzv-id", "planner-launch", "--rdzv-conf", ",".join(conf)]
    if getattr(args, "local_addr", ""):
        cmd += ["--local-addr", args.local_addr]
    return cmd + ["-m", "planner.cli.elastic", "--session", str(session), "--dead-after-s", f"{secs:g}"] + train_args


def job_env(args: argparse.Namespace) -> dict[str, str]:
    return {NODE_ENV: node_name(args), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


# --------------------------------------------------------------------------------------
# The worker: decide the round's plan, then train
# --------------------------------------------------------------------------------------

def _say(msg: str) -> None:
    print(f"runtime: {msg}", file=sys.stderr, flush=True)


def _unique(xs: list[str]) -> list[str]:
    out: list[str] = []
    for x in xs:
        if x not in out:
            out.append(x)
    return out


def decide(session_file: str, nodes: list[str], local_world: int) -> dict[str, Any]:
    """Rank 0 of a round: the plan, the ranks that take part, the attempt and whether to resume
    (module docstring, step 3). ``nodes[r]`` names rank r's node."""
    import dataclasses

    from planner.cli.result import plans_from_result
    from planner.plan.errors import PlannerError
    from planner.plan.planfile import read_plan, write_plan
    from planner.search.replan import changed_cluster, describe_changes, replan

    sess = read_session(session_file)
    attempt = len(sess["attempts"])
    excluded = list(sess.get("excluded_nodes", []))
    present = _unique(nodes)
    alive = [n for n in present if n not in excluded]
    active = [r for r, n in enumerate(nodes) if n in alive]
    cur_path = sess["current"]
    cur = read_plan(cur_path)
    prev_nodes = sess["attempts"][-1]["nodes"] if sess["attempts"] else alive
    lost = [n for n in prev_nodes if n not in present]
    change = None
    if len(active) < cur.world_size or (len(active) > cur.world_size and attempt and
                                         read_plan(sess["plan"]).world_size == len(active)):
        if len(active) > cur.world_size:      # the nodes are back: the launch's own plan again
            new_path, new = sess["plan"], read_plan(sess["plan"])
            rp_time = 0.0
        else:
            ckpt_dir = str(checkpoint_dir_of(session_file))
            try:
                c = cur.cluster
                whole = (len(c.groups) == 1 and c.gpus_per_node == local_world and c.total_gpus == cur.world_size
                         and len(active) % local_world == 0)
                # as `planner replan --lose-nodes K` (whole nodes of the plan's cluster), else --gpus N
                cluster = (changed_cluster(c, lose_nodes=c.nodes - len(active) // local_world) if whole
                           else changed_cluster(c, gpus=len(active)))
                rp = replan(cur, cluster, max_time_s=60.0)
            except PlannerError as e:
                return {"error": f"{len(active)} ranks on {len(alive)} node(s) are left "
                                 f"({', '.join(lost) or 'none'} lost) and no plan fits them: {e}"}
            new = plans_from_result(dataclasses.replace(rp.result, solutions=[rp.solution]), cur.model, cluster,
                                    cur.workload, cluster_source="replan")[0]
            k = len(sess["replans"]) + 1
            new = new.replace(provenance=dict(new.provenance, replanned_from=cur_path, lost_nodes=lost,
                                              excluded_nodes=excluded, nodes=alive))
            new_path = str(replan_path(ckpt_dir, k))
            write_plan(new, new_path)
            rp_time = rp.wall_time_s
        from runtime.checkpoint import find_latest
        latest = find_latest(checkpoint_dir_of(session_file))
        change = {"plan": new_path, "world_size": new.world_size, "lost_nodes": lost, "excluded_nodes": excluded,
                  "nodes": alive, "attempt": attempt, "changes": describe_changes(cur, new),
                  "resume_from": str(latest) if latest else None, "replan_wall_time_s": rp_time}
        sess["replans"].append(change)
        cur_path, cur = new_path, new
    if len(active) > cur.world_size:        # more ranks than the plan uses: the last ones leave
        active = active[:cur.world_size]
    used = _unique([nodes[r] for r in active])
    sess["attempts"].append({"attempt": attempt, "time": _now(), "unix_time": time.time(), "nodes": used, "present": present,
                             "world_size": len(active), "plan": cur_path, "lost_nodes": lost})
    sess["current"] = cur_path
    _write(Path(session_file), sess)
    return {"plan": cur_path, "active": active, "attempt": attempt,
            "resume": bool(sess["resume"]) if attempt == 0 else True, "change": change, "nodes": nodes}


def _exclude(session_file: str, node: str, report: dict) -> None:
    sess = read_session(session_file)
    if node not in sess["excluded_nodes"]:
        sess["excluded_nodes"].append(node)
    sess["stragglers"].append(dict(report, node=node))
    _write(Path(session_file), sess)


def main(argv: list[str] | None = None) -> int:
    from runtime import worker
    from runtime.train import (build_parser, check_resilience_args, expected_errors, options_from_args, train)

    p = build_parser()
    p.prog = "python -m planner.cli.elastic"
    p.add_argument("--session", required=True, help="the job's session file (planner launch writes it)")
    p.add_argument("--dead-after-s", type=float, default=DEFAULT_DEAD_AFTER_S,
                   help="a collective that waits this long for a rank fails (the rank is taken for dead)")
    args = p.parse_args(argv)

    def body() -> None:
        import datetime

        import torch.distributed as dist
        from torch.distributed.rendezvous import rendezvous

        from planner.plan.planfile import read_plan
        from runtime.stragglers import STRAGGLER_EXIT, StragglerFound
        check_resilience_args(args)
        # the round's store; generous: rank 0 may be replanning while the others wait on it
        store, rank, world = next(rendezvous("env://", timeout=datetime.timedelta(seconds=max(300.0,
                                                                                             4 * args.dead_after_s))))
        me = os.environ.get(NODE_ENV) or socket.gethostname()
        store.set(f"planner/node/{rank}", me)
        if rank == 0:
            nodes = [store.get(f"planner/node/{r}").decode() for r in range(world)]
            try:
                d = decide(args.session, nodes, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
            except Exception as e:       # every rank must hear of it, or they wait forever
                d = {"error": f"{type(e).__name__}: {e}"}
            store.set("planner/decision", json.dumps(d))
            if d.get("change"):
                c = d["change"]
                _say(f"round {d['attempt']}: {', '.join(c['lost_nodes'] + c['excluded_nodes']) or 'a node'} "
                     f"gone; replanned for {c['world_size']} ranks on {len(c['nodes'])} node(s): "
                     f"{'; '.join(c['changes'])}; wrote {c['plan']}; resuming from "
                     f"{Path(c['resume_from']).name if c['resume_from'] else 'step 1'}")
        d = json.loads(store.get("planner/decision"))
        if "error" in d:
            raise _Refused(d["error"])
        active = d["active"]
        if rank not in active:
            print(f"runtime: rank {rank} ({me}): not in this round's plan ({len(active)} ranks); leaving",
                  file=sys.stderr, flush=True)
            return
        new_rank, new_world = active.index(rank), len(active)
        os.environ.update(RANK=str(new_rank), WORLD_SIZE=str(new_world),
                          TORCHELASTIC_RESTART_COUNT=str(d["attempt"]), RUNTIME_TIMEOUT_S=f"{args.dead_after_s:g}")
        device = args.device
        kw = {}
        if device == "cuda" or (device == "auto" and _cuda()):
            import torch
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            kw["device_id"] = torch.device("cuda", local)
            backend = "cuda:nccl,cpu:gloo"
        else:
            backend = "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("planner/train", store), rank=new_rank,
                                world_size=new_world, timeout=datetime.timedelta(seconds=args.dead_after_s), **kw)
        plan = read_plan(d["plan"])
        opts = options_from_args(args)
        opts.resume = d["resume"]
        if d["attempt"] > 0:
            opts.overwrite_checkpoints = False
        try:
            train(plan, opts)
        except StragglerFound as e:
            s = e.report
            node = d["nodes"][active[s.rank]]
            if new_rank == 0:
                _exclude(args.session, node, s.to_dict())
                _say(f"straggler: {e}; excluding node {node} and replanning without it")
            dist.barrier()
            if new_rank == s.rank:
                print(f"runtime: rank {new_rank}: straggler: {e}; leaving the job (exit {STRAGGLER_EXIT})",
                      file=sys.stderr, flush=True)
                worker.exit_now(STRAGGLER_EXIT)
            time.sleep(3600)          # torchrun stops the rest once the straggler has left

    class _Refused(RuntimeError):
        pass

    return worker.run("runtime", body, expected_errors() + (_Refused,))


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


# --------------------------------------------------------------------------------------
# The launcher's report
# --------------------------------------------------------------------------------------

def report(session: Path) -> dict[str, Any]:
    """What the node with rank 0 adds to its summary: the rounds, replans and stragglers."""
    try:
        s = read_session(session)
    except (OSError, ValueError):
        return {"replans": [], "rounds": 0, "stragglers": [], "plan": None}
    return {"replans": s.get("replans", []), "rounds": len(s.get("attempts", [])),
            "stragglers": s.get("stragglers", []), "excluded_nodes": s.get("excluded_nodes", []),
            "plan": s.get("current"), "session": str(session), "round_log": s.get("attempts", [])}


if __name__ == "__main__":
    from runtime.worker import exit_now
    exit_now(main())


# --------------------------------------------------------------------------------------
# planner launch's side (one call per node)
# --------------------------------------------------------------------------------------

def launch(args: argparse.Namespace, nproc: int, device: str, metrics: str, train_args, run_torchrun, failure):
    """Run this node's part of the elastic job (module docstring). Returns (rank 0's summary, the
    plan that finished, the replans, the rounds after the first) on the node where rank 0 ran,
    None on the others. ``train_args``, ``run_torchrun`` and ``failure`` are ``planner launch``'s."""
    import shutil
    import tempfile

    from planner.plan.errors import CheckFailed
    from planner.plan.planfile import read_plan
    session = session_path(args.checkpoint_dir)
    if args.node_rank == 0:
        start_session(args)
    tmpdir = tempfile.mkdtemp(prefix="planner-launch-")
    try:
        json_out = os.path.join(tmpdir, "summary.json")
        cmd = torchrun_command(args, nproc, train_args(args, device, json_out, str(Path(metrics).resolve())), session)
        rc, tail = run_torchrun(cmd, args.timeout, quiet=False, env_extra=job_env(args))
        if rc != 0:
            raise failure(tail, rc, args.checkpoint_dir)
        if not os.path.exists(json_out):
            if "not in this round's plan" in tail and args.node_rank != 0:
                print(f"planner launch: this node ({node_name(args)}) left the job: a later round's plan does not "
                      "use it", file=sys.stderr, flush=True)
            return None            # rank 0 ran on another node and reports there
        summary = json.loads(Path(json_out).read_text())
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    rep = report(session)
    if not rep["plan"]:
        raise CheckFailed(f"the job finished but its session file {session} is unreadable")
    summary["rounds"] = rep["rounds"]
    summary["round_log"] = rep["round_log"]
    summary["stragglers_excluded"] = rep["stragglers"]
    return summary, read_plan(rep["plan"]), rep["replans"], max(0, rep["rounds"] - 1)
