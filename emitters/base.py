"""What every emitter shares: the refusal type, the checks most targets make on a plan, and
the shell-script helpers they write with. The encoders themselves (shell words, Python literals,
YAML, JSON, TOML, HTML, #SBATCH options) live in ``emitters.encode``; the shell ones are re-exported here.

Every value that came from a file is quoted where it becomes shell (``sh``, ``bash_array``,
``sh_default``), and names are made inert where they become comments, job names or ids
(``one_line``, ``comment_block``, ``job_name``, ``ascii_id``): a model or cluster name holding a
newline or ``$(...)`` cannot start a line or a command in an emitted script.

An emitter is one module in ``emitters/`` with ``TARGET``, ``MODE`` (``train`` or ``infer``),
``FORMAT`` (the tool and the version of its format the output targets), ``SUMMARY`` and a pure
``emit(plan) -> dict[str, str]`` (file name -> text). It raises ``CannotExpress`` naming the
part of the plan the target cannot state, rather than write something that would run a
different configuration. Emitters import only the plan types (``planner.plan.planfile``,
``costmodel.specs``): no torch, no target package.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

from costmodel.specs import MESH_AXES, StageSpec, end_slots
from emitters.encode import Raw, one_line, sh, toml_value  # noqa: F401 (re-exported: the emitters' quoting)
from planner.plan.planfile import Plan, dump_plan

PLAN_FILE = "plan.yaml"


class CannotExpress(ValueError):
    """The target has no way to state part of the plan. ``part`` names it, the message says why
    and what would help. ``planner emit`` maps it to exit code 1."""

    def __init__(self, target: str, part: str, detail: str, hint: str = "") -> None:
        self.target = target
        self.part = part
        self.detail = detail
        self.hint = hint
        msg = f"{target} cannot express {part}: {detail}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


# --------------------------------------------------------------------------------------
# Facts about a plan, in the form the emitters need
# --------------------------------------------------------------------------------------

def describe(plan: Plan) -> str:
    """One line: model, cluster, degrees and batch, for headers and READMEs."""
    p = plan.parallel
    w = plan.workload
    where = f"{one_line(plan.model.name)} on {one_line(plan.cluster.name)} ({plan.world_size} GPUs), {w.mode}"
    dis = (plan.serving or {}).get("disaggregation") if w.mode == "infer" else None
    if dis:        # two pools of their own sizes: never the decode pool's degrees as the plan's
        def pool(d: dict) -> str:
            return f"{d['replicas']} x tp={d['tp']} pp={d['pp']}" + (f" ep={d['ep']}" if d.get("ep", 1) > 1 else "")
        return (f"{where}, disaggregated: prefill {pool(dis['prefill'])}, decode {pool(dis['decode'])}; "
                f"{w.global_batch} concurrent sequences, prompt {w.prompt_len} + output {w.output_len} = "
                f"{w.seq_len} tokens, {w.dtype}")
    head = f"{where}: tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} ep={p.ep}"
    if w.mode == "train":
        rc = p.recompute + (f"({','.join(p.recompute_modules)})" if p.recompute == "selective" and p.recompute_modules
                            else "")
        return (head + f" zero={p.zero} sp={str(p.sp).lower()} vpp={p.vpp} recompute={rc}; "
                f"micro_batch={p.micro_batch} x grad_accum={p.grad_accum} x dp={p.dp} = "
                f"global_batch={w.global_batch}, seq_len={w.seq_len}, {w.dtype}")
    return head + (f"; {w.global_batch} concurrent sequences per replica, prompt {w.prompt_len} + "
                   f"output {w.output_len} = {w.seq_len} tokens, {w.dtype}")


def require_mode(plan: Plan, target: str, mode: str) -> None:
    if plan.mode != mode:
        other = "inference" if plan.mode == "infer" else "training"
        want = "training" if mode == "train" else "inference (serving)"
        raise CannotExpress(target, f"mode {plan.mode!r}",
                            f"this is a {other} plan and {target} is a {want} target",
                            "list the targets with `planner emit --list`")


def require_one_group(plan: Plan, target: str) -> None:
    """Refuse heterogeneous clusters and stage-to-group assignments: one launcher, one kind of node."""
    groups = plan.cluster.groups
    used = sorted({s.group or groups[0].name for s in plan.stages})
    if len(groups) > 1 or used != [groups[0].name]:
        parts = ", ".join(f"{g.name}: {g.nodes}x{g.gpus_per_node} {g.gpu.name}" for g in groups)
        raise CannotExpress(target, "heterogeneous stage groups",
                            f"the plan spreads stages over node groups ({parts}; stages on "
                            f"{', '.join(used)}) and {target} launches one kind of node",
                            "use the torchrun target (the built-in runtime places stages by group)")


def nodes_and_procs(plan: Plan, target: str) -> tuple[int, int]:
    """(nodes, processes per node) for a homogeneous plan: whole nodes, or part of one node."""
    world = plan.world_size
    gpn = plan.cluster.gpus_per_node
    if world <= gpn:
        return 1, world
    if world % gpn:
        raise CannotExpress(target, f"world size {world}",
                            f"{world} processes do not fill whole nodes of {gpn} GPUs",
                            f"plan for {world // gpn * gpn} or {(world // gpn + 1) * gpn} GPUs")
    return world // gpn, gpn


def effective_order(plan: Plan) -> tuple[str, ...]:
    """The mesh order (outermost first) restricted to dims with degree > 1."""
    return tuple(d for d in plan.mesh_order if plan.degree(d) > 1)


def require_order(plan: Plan, target: str, *orders: Sequence[str], note: str = "") -> int:
    """The index of the first target rank order (outermost first) the plan's order agrees with.

    Only dims of degree > 1 matter: a degree-1 dim does not change which ranks are grouped.
    """
    eff = effective_order(plan)
    for i, order in enumerate(orders):
        if tuple(d for d in order if d in eff) == eff:
            return i
    names = " or ".join("[" + ", ".join(o) + "]" for o in orders)
    raise CannotExpress(target, f"mesh order {list(plan.mesh_order)}",
                        f"{target} orders ranks {names} (outermost first){note}",
                        f"plan with the default mesh order [{', '.join(MESH_AXES)}]")


def stage_layers(plan: Plan) -> list[int]:
    return [s.num_layers for s in plan.stages]


def even_stages(plan: Plan) -> bool:
    return len(set(stage_layers(plan))) <= 1


def recompute_per_stage(plan: Plan) -> list[int]:
    """Layers recomputed in full on each pipeline stage (0 without full recompute).

    The one rule is ``ParallelConfig.full_recompute_layers``: under ``recompute=full`` the
    policy's count, otherwise each stage's own count (the solver may recompute some layers
    of a stage fully on top of a none/selective policy to fit its memory). The cost model
    and the runtime call the same function, so the three agree.
    """
    p = plan.parallel
    return [p.full_recompute_layers(s.num_layers, s.recompute_layers) for s in plan.stages]


def require_no_stage_recompute(plan: Plan, target: str) -> None:
    """Refuse a none/selective plan whose stages also recompute some layers fully."""
    per = recompute_per_stage(plan)
    if plan.parallel.recompute != "full" and any(per):
        raise CannotExpress(target, f"{plan.parallel.recompute} recompute plus full recompute of {per} layers "
                            "per stage", f"{target} sets one recompute policy for every layer",
                            f"plan for it: `planner plan --target {target}` sets one policy for the whole model")


def full_recompute_all(plan: Plan) -> bool:
    """True when the plan recomputes every layer of every stage."""
    return plan.parallel.recompute == "full" and recompute_per_stage(plan) == stage_layers(plan)


def virtual_counts(plan: Plan) -> list[int]:
    """Layers of each virtual stage in pipeline order: virtual stage ``v*pp + r`` on rank ``r``
    holds the ``v``-th of rank ``r``'s ``vpp`` near-equal chunks (the extra layers first), as the
    built-in runtime cuts them (``runtime/pipeline.py``); Megatron's layout and torchtitan's model
    parts state the same chunks. An end stage one layer short of ``vpp`` (``costmodel.specs.end_slots``)
    leaves its end virtual stage empty: the first stage's first (the embedding alone), the last
    stage's last (the loss alone)."""
    p = plan.parallel
    chunks = []
    counts = stage_layers(plan)
    slots = end_slots(p, counts)
    for i, n in enumerate(counts):
        base, extra = divmod(n, p.vpp)
        chunk = [base + (1 if v < extra else 0) for v in range(p.vpp)]
        if slots and n == p.vpp - 1 and i == 0:
            chunk = chunk[-1:] + chunk[:-1]         # [0, 1, ..., 1]: the embedding's virtual stage first
        chunks.append(chunk)
    return [chunks[s % p.pp][s // p.pp] for s in range(p.pp * p.vpp)]


def virtual_stage_layers(plan: Plan, target: str) -> int:
    """Layers per virtual stage when vpp > 1: the interleaved schedule needs an even split."""
    p = plan.parallel
    n = plan.model.layers
    if not even_stages(plan) or n % (p.pp * p.vpp):
        raise CannotExpress(target, f"vpp={p.vpp} with stages {stage_layers(plan)}",
                            f"the interleaved schedule splits {n} layers into pp*vpp = {p.pp * p.vpp} "
                            "equal virtual stages", "plan an even split or vpp=1")
    return n // (p.pp * p.vpp)


def require(cond: bool, target: str, part: str, detail: str, hint: str = "") -> None:
    if not cond:
        raise CannotExpress(target, part, detail, hint)


def estimate_memory(plan: Plan) -> dict:
    """The estimate's memory breakdown (bytes), or {} when the plan carries no estimate."""
    mem = (plan.estimate or {}).get("memory") or {}
    return {k: float(v) for k, v in mem.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def ceil_fraction(x: float, step: float = 0.01) -> float:
    """Round a memory fraction up to ``step`` so the budget never falls below the estimate."""
    return round(math.ceil(x / step - 1e-9) * step, 4)


TORCH_DTYPE = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
               "fp32": "float32", "float32": "float32", "tf32": "float32"}


def plan_text(plan: Plan) -> str:
    """The plan itself, shipped next to launch files that reference it."""
    return dump_plan(plan)


def ascii_id(text: str) -> str:
    """``text`` with every character but ASCII letters and digits turned into ``-`` (lower case):
    safe as a job name, an id, or a word in a shell script."""
    return "".join(c if c.isascii() and c.isalnum() else "-" for c in text.lower())


def job_name(plan: Plan) -> str:
    """A DNS-1123 name (Kubernetes, Slurm job names) from the model name."""
    out = ascii_id(plan.model.name).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return ("planner-" + out)[:52].rstrip("-")


# --------------------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------------------

def sh_default(var: str, value: object) -> str:
    """``VAR`` from the environment, else ``value`` (quoted for the shell): one line of bash."""
    assert var.isidentifier(), var
    return f'if [ -z "${{{var}:-}}" ]; then {var}={sh(value)}; fi\n'


def bash_array(name: str, args: Iterable[object], comment: str = "") -> str:
    """``NAME=(\\n  --flag value\\n  ...)``: one flag (with its values) per line.

    ``args`` holds flags and values in order; a new line starts at every ``--flag``.
    """
    lines: list[list[str]] = []
    for a in args:
        s = sh(a)
        if isinstance(a, str) and not isinstance(a, Raw) and a.startswith("-") or not lines:
            lines.append([s])
        else:
            lines[-1].append(s)
    body = "\n".join("  " + " ".join(words) for words in lines)
    head = f"# {comment}\n" if comment else ""
    return f"{head}{name}=(\n{body}\n)\n"


def comment_block(lines: Iterable[str], prefix: str = "# ") -> str:
    """One comment line per item; any line break inside an item is escaped (``one_line``)."""
    return "".join(f"{prefix}{one_line(line)}".rstrip() + "\n" for line in lines)


def script_header(plan: Plan, target: str, fmt: str, usage: Sequence[str]) -> str:
    lines = [f"Generated by `planner emit --target {target}` from a plan; format: {fmt}.",
             describe(plan), ""]
    lines += list(usage)
    return "#!/usr/bin/env bash\n" + comment_block(lines) + "set -euo pipefail\n"


def toml_table(name: str, items: Sequence[tuple[str, object]], comments: dict | None = None) -> str:
    comments = comments or {}
    out = [f"[{name}]"]
    for k, v in items:
        line = f"{k} = {toml_value(v)}"
        if k in comments:
            line += f"  # {comments[k]}"
        out.append(line)
    return "\n".join(out) + "\n"


def stage_summary(stages: Sequence[StageSpec]) -> str:
    return ", ".join(f"[{s.first_layer},{s.last_layer})" for s in stages)
