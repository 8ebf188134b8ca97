"""torchrun: the command that runs a plan with the built-in runtime (``python -m runtime.train``).

One node: c10d rendezvous on ``localhost:0`` (torchrun picks a free port). Several identical
nodes: the same script on every node, c10d rendezvous at ``$HEAD_ADDR``. Node groups of
different kinds (a heterogeneous plan): static rendezvous with explicit node ranks, so that
nodes of the first group take the first ranks as the plan's stage-to-group split assumes, and
each node starts as many processes as its group has GPUs.
"""
from __future__ import annotations

from emitters.base import (PLAN_FILE, CannotExpress, Raw, ascii_id, bash_array, nodes_and_procs, one_line, plan_text, sh,
                           require_mode, script_header)
from emitters.recipe import Need, needs_block
from planner.plan.planfile import Plan

TARGET = "torchrun"
MODE = "train"
FORMAT = "torchrun (torch.distributed.run) of torch >= 2.8, built-in runtime `python -m runtime.train`"
SUMMARY = "torchrun command for the built-in runtime, one node or many (c10d rendezvous)"
RUN = ("Copy this folder to every node. One node: `bash torchrun.sh`. Several nodes: run "
       "`HEAD_ADDR=<first node> bash torchrun.sh` on each (heterogeneous plans also need "
       "`NODE_RANK=<i>`). `STEPS`, `CHECKPOINT_DIR`, `CHECKPOINT_EVERY` and `RESUME=1` pass "
       "through to the runtime, and so do extra arguments (e.g. `--metrics m.jsonl`).")

DEFAULT_STEPS = 10
C10D_PORT = 29400
STATIC_PORT = 29500


def runtime_needs() -> list[Need]:
    """The environment the built-in runtime needs on every node."""
    return [Need("torchrun", "activate the planner's environment (source <repo>/.venv/bin/activate)", kind="cmd"),
            Need("runtime", "run from the planner's repository, or activate its environment, or set "
                 "PYTHONPATH=<repo>", kind="py")]


def runtime_args() -> str:
    """The runtime's own flags, from environment variables with defaults."""
    return (bash_array("RUNTIME_ARGS", ["--plan", Raw('"${PLAN:-$HERE/' + PLAN_FILE + '}"'),
                                        "--steps", Raw('"${STEPS:-' + str(DEFAULT_STEPS) + '}"')],
                       "python -m runtime.train --plan PLAN [--steps N] [--checkpoint-dir D] "
                       "[--checkpoint-every K] [--resume]")
            + 'if [ -n "${CHECKPOINT_DIR:-}" ]; then\n'
            '  RUNTIME_ARGS+=(--checkpoint-dir "$CHECKPOINT_DIR")\n'
            '  if [ -n "${CHECKPOINT_EVERY:-}" ]; then RUNTIME_ARGS+=(--checkpoint-every "$CHECKPOINT_EVERY"); fi\n'
            'fi\n'
            'if [ -n "${RESUME:-}" ]; then RUNTIME_ARGS+=(--resume); fi\n'
            'if [ -n "${DATA:-}" ]; then RUNTIME_ARGS+=(--data "$DATA"); fi  # a token file; default synthetic tokens\n')


def _groups_table(plan: Plan) -> tuple[list[tuple[int, int, str]], int]:
    """[(first node rank, processes per node, group name)] in the plan's group order."""
    rows, rank = [], 0
    for g in plan.cluster.groups:
        rows.append((rank, g.gpus_per_node, g.name))
        rank += g.nodes
    return rows, rank


def _emit_serve(plan: Plan) -> dict[str, str]:
    """An inference plan: torchrun starts the built-in serving runtime (``python -m runtime.serve``),
    as ``planner launch`` does, on one node or on every node (c10d)."""
    from emitters.base import require_one_group
    from planner.plan import targets as T
    require_one_group(plan, TARGET)
    batching = (plan.serving or {}).get("batching", "static")
    if batching != "static" or (plan.serving or {}).get("disaggregation"):
        raise CannotExpress(TARGET, f"a serving plan priced for {batching} batching",
                            "the built-in runtime (python -m runtime.serve) serves static batches on one pool",
                            "plan --mode infer --target builtin")
    cannot = T.serve_problems("builtin", plan.model, plan.workload, plan.parallel, plan.cluster.gpus_per_node,
                              len(plan.cluster.groups))
    if cannot:
        raise CannotExpress(TARGET, "this serving plan", "; ".join(cannot), "plan --mode infer --target builtin")
    nnodes, nproc = nodes_and_procs(plan, TARGET)
    usage = [f"Needs {PLAN_FILE} next to this script (or PLAN=path) and this repository on PYTHONPATH.",
             "Serves the plan's static batch with the built-in runtime and prints measured beside predicted."]
    body = needs_block("torchrun.sh", runtime_needs())
    body += 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    body += bash_array("RUNTIME_ARGS", ["--plan", Raw('"${PLAN:-$HERE/' + PLAN_FILE + '}"')],
                       "python -m runtime.serve --plan PLAN [--prompt-len N] [--output-len N] [--batch N]")
    if nnodes == 1:
        usage.append("Run: bash torchrun.sh")
        endpoint = Raw('"${RDZV_ENDPOINT:-localhost:0}"')
    else:
        usage.append(f"Run on each of the {nnodes} nodes: HEAD_ADDR=<first node's address> bash torchrun.sh")
        body += ': "${HEAD_ADDR:?set HEAD_ADDR to the first node address, the same on every node}"\n'
        endpoint = Raw('"$HEAD_ADDR:${RDZV_PORT:-' + str(C10D_PORT) + '}"')
    body += bash_array("TORCHRUN_ARGS", ["--nnodes", nnodes, "--nproc-per-node", nproc, "--rdzv-backend", "c10d",
                                         "--rdzv-endpoint", endpoint,
                                         "--rdzv-id", Raw('"${RDZV_ID:-' + _rdzv_id(plan) + '}"')])
    body += 'exec torchrun "${TORCHRUN_ARGS[@]}" -m runtime.serve "${RUNTIME_ARGS[@]}" "$@"\n'
    return {"torchrun.sh": script_header(plan, TARGET, FORMAT, usage) + body, PLAN_FILE: plan_text(plan)}


def emit(plan: Plan) -> dict[str, str]:
    if plan.mode == "infer":
        return _emit_serve(plan)
    require_mode(plan, TARGET, "train")
    hetero = len(plan.cluster.groups) > 1
    usage = [f"Needs {PLAN_FILE} next to this script (or PLAN=path) and this repository on PYTHONPATH."]
    usage.append("DATA=<token file> (numpy memmap of uint16 ids) trains on it; default synthetic tokens.")
    body = needs_block("torchrun.sh", runtime_needs())
    body += 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n' + runtime_args()
    if not hetero:
        nnodes, nproc = nodes_and_procs(plan, TARGET)
        if nnodes == 1:
            usage.append("Run: bash torchrun.sh")
            endpoint = Raw('"${RDZV_ENDPOINT:-localhost:0}"')
        else:
            usage.append(f"Run on each of the {nnodes} nodes: HEAD_ADDR=<first node's address> bash torchrun.sh")
            body += ': "${HEAD_ADDR:?set HEAD_ADDR to the first node address, the same on every node}"\n'
            endpoint = Raw('"$HEAD_ADDR:${RDZV_PORT:-' + str(C10D_PORT) + '}"')
        body += bash_array("TORCHRUN_ARGS", [
            "--nnodes", nnodes, "--nproc-per-node", nproc,
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", Raw('"${RDZV_ID:-' + _rdzv_id(plan) + '}"'),
        ], "c10d rendezvous: every node runs this same command")
    else:
        rows, nnodes = _groups_table(plan)
        total = sum(g.gpus for g in plan.cluster.groups)
        if total != plan.world_size:
            raise CannotExpress(TARGET, f"world size {plan.world_size}",
                                f"the node groups hold {total} GPUs and torchrun starts one process per GPU",
                                "plan for all GPUs of the cluster")
        usage.append(f"Run on each of the {nnodes} nodes: NODE_RANK=<0..{nnodes - 1}> "
                     "HEAD_ADDR=<node 0's address> bash torchrun.sh")
        usage += [f"  node ranks {lo}..{lo + g.nodes - 1}: group {g.name} ({g.gpus_per_node} x {g.gpu.name})"
                  for (lo, _, _), g in zip(rows, plan.cluster.groups)]
        body += (': "${NODE_RANK:?set NODE_RANK: nodes of the first group of the plan take the first ranks}"\n'
                 ': "${HEAD_ADDR:?set HEAD_ADDR to node 0 address}"\n')
        cases = []
        for lo, gpn, name in reversed(rows):
            cases.append(f'if [ -z "${{NPROC:-}}" ] && [ "$NODE_RANK" -ge {lo} ]; then NPROC={gpn}; fi  # {one_line(name)}')
        body += "NPROC=\n" + "\n".join(cases) + "\n"
        body += f'if [ "$NODE_RANK" -ge {nnodes} ]; then echo "NODE_RANK must be < {nnodes}" >&2; exit 2; fi\n'
        body += bash_array("TORCHRUN_ARGS", [
            "--nnodes", nnodes, "--nproc-per-node", Raw('"$NPROC"'), "--node-rank", Raw('"$NODE_RANK"'),
            "--master-addr", Raw('"$HEAD_ADDR"'), "--master-port", Raw('"${MASTER_PORT:-' + str(STATIC_PORT) + '}"'),
        ], "static rendezvous: node ranks follow the plan's node groups; processes per node differ by group")
    body += 'exec torchrun "${TORCHRUN_ARGS[@]}" -m runtime.train "${RUNTIME_ARGS[@]}" "$@"\n'
    script = script_header(plan, TARGET, FORMAT, usage) + body
    return {"torchrun.sh": script, PLAN_FILE: plan_text(plan)}


def _rdzv_id(plan: Plan) -> str:
    return ascii_id(plan.model.name)


FORMAT_LAUNCH = "bash script: the framework's per-node script with one set of rendezvous variables"


def launch(plan: Plan, framework: str, start, files: dict[str, str]) -> dict[str, str]:
    """A per-node script that starts ``framework``'s files by hand (no cluster scheduler): run on
    every node with ``NODE_RANK`` and ``HEAD_ADDR``; it sets the variables the framework's own
    script reads (``planner.plan.targets.Start``) and runs that script, which starts torchrun
    (DeepSpeed too: ``DS_LAUNCHER=torchrun`` replaces its ssh/pdsh runner)."""
    require_mode(plan, TARGET, "train")
    if start.script not in files:
        raise CannotExpress(TARGET, f"{framework}'s files", f"they hold no {start.script} to run on each node",
                            f"emit --target {framework} first")
    nnodes, nproc = nodes_and_procs(plan, framework)
    usage = [f"Starts {framework} ({start.script}) on this node: {nnodes} node(s) x {nproc} process(es).",
             f"How {framework} is started: {start.source}."]
    body = 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    if nnodes > 1:
        usage.append(f"Run on each of the {nnodes} nodes: NODE_RANK=<0..{nnodes - 1}> HEAD_ADDR=<node 0's address> "
                     f"bash launch-{framework}.sh")
        body += (': "${NODE_RANK:?set NODE_RANK to this node (0 on the head node)}"\n'
                 ': "${HEAD_ADDR:?set HEAD_ADDR to node 0 address, the same on every node}"\n')
        if start.node_rank and start.node_rank != "NODE_RANK":
            body += f'export {start.node_rank}="$NODE_RANK"\n'
        if start.head_addr and start.head_addr != "HEAD_ADDR":
            body += f'export {start.head_addr}="$HEAD_ADDR"\n'
    else:
        usage.append(f"Run: bash launch-{framework}.sh")
    body += "".join(f"export {k}={sh(v)}\n" for k, v in sorted(start.env.items()))
    body += f'exec bash "$HERE/{start.script}" "$@"\n'
    return {f"launch-{framework}.sh": script_header(plan, f"{framework} --launcher {TARGET}", FORMAT_LAUNCH, usage)
            + body}
