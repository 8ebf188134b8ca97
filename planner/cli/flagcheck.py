"""Every flag checked once, after parsing and before a command runs: numbers in range (finite,
positive where a count is, below the ceilings of ``costmodel.limits``), flags that the chosen
mode or input would ignore refused by name, and output paths that name a folder refused.

argparse has already checked types (``--tp x`` is not an integer) and choices. What a flag
was *given* (not left at its default) is found by parsing the same arguments again with every
default replaced by a sentinel: ``--dtype bf16`` given explicitly is then told apart from the
default ``bf16``.

Every number has an upper bound with its reason (``_COMMON``/``_BY_COMMAND``: the reason is the
note printed with a refusal); a string flag may not be empty or hold a control character (a
newline in a name or a path is never meant); every flag a mode does not use is refused by one table
(``MODE_ONLY``); the launch flags that name a network endpoint are checked for form and range
before any process starts.

Called from ``planner.cli.main``; raises ``UsageError`` (exit 2) with the flag, the value and
what to do.
"""
from __future__ import annotations

import argparse
import math
import re
import unicodedata
from pathlib import Path
from typing import Any, Callable

from costmodel.limits import (MAX_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_NODES, MAX_PRICE, MAX_SEED,
                              MAX_SEQ, num)
from planner.plan.errors import UsageError

_SENTINEL = object()
INF = math.inf

# ---- ceilings with their reasons (a value past one is a typo, and would overflow or stall) ----
MAX_SOLVER_S = 7 * 86400.0          # a week of solver time: a search that long is a mistake
MAX_RUN_S = 30 * 86400.0            # a launch limit of 30 days (longer runs restart from checkpoints)
MAX_MTBF_H = 1e7                    # node MTBF, hours: 1,100 years (Llama 3's fleet: 6,335 h)
MIN_MTBF_H = 1e-3                   # 3.6 s: below it no step of any model completes between failures
MAX_REPAIR_H = 1e5                  # 11 years out of service is a node retired, not repaired
MAX_RESTART_S = 1e6                 # 11.6 days to restart a job (FlashRecovery measured 150 s)
MAX_SLO_MS = 1e7                    # a latency goal of 2.8 hours is no latency goal
MAX_REQUEST_RATE = 1e7              # requests per second to one deployment (the largest services: ~10^5)
MAX_STRAGGLER_FACTOR = 1e3          # a rank 1000x slower than the median is dead, not slow

# (lo, hi, lo_exclusive, note) by dest; per-command rules override the common ones.
_COMMON: dict[str, tuple[float, float, bool, str]] = {
    "gpus": (0, MAX_GPUS, True, "GPUs this planner handles"),
    "global_batch": (0, MAX_BATCH, True, ""),
    "seq_len": (0, MAX_SEQ, True, "tokens"),
    "seed": (0, MAX_SEED, False, ""),
    **{k: (1, MAX_GPUS, False, "") for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "dp_shard")},
    "micro_batch": (1, MAX_BATCH, False, ""),
    "grad_accum": (1, MAX_BATCH, False, ""),
    "recompute_layers": (0, MAX_LAYERS, False, ""),
    "max_time": (0, MAX_SOLVER_S, True, "seconds (a week of solver time)"),
    "mtbf_hours": (MIN_MTBF_H, MAX_MTBF_H, False, "hours (3.6 s to 1,100 years; Llama 3's fleet: 6,335)"),
    "repair_hours": (0, MAX_REPAIR_H, True, "hours (11 years out of service is a retired node)"),
    "restart_overhead_s": (0, MAX_RESTART_S, False, "seconds (11.6 days; FlashRecovery measured 150)"),
}
_BY_COMMAND: dict[str, dict[str, tuple[float, float, bool, str]]] = {
    "plan": {"top": (1, 1000, False, "plans"), "price_per_gpu_hour": (0, MAX_PRICE, True, "USD per GPU-hour"),
             "prompt_len": (1, MAX_SEQ, False, "tokens"), "output_len": (1, MAX_SEQ, False, "tokens"),
             "batch": (1, MAX_BATCH, False, ""), "max_batch": (1, MAX_BATCH, False, ""),
             "ttft_slo_ms": (0, MAX_SLO_MS, True, "ms (2.8 hours is no latency goal)"),
             "tpot_slo_ms": (0, MAX_SLO_MS, True, "ms (2.8 hours is no latency goal)"),
             "request_rate": (0, MAX_REQUEST_RATE, True, "requests per second"),
             "max_num_batched_tokens": (1, MAX_SEQ, False, "tokens"),
             "max_num_seqs": (1, MAX_BATCH, False, "sequences"),
             "gpu_memory_utilization": (0, 1, True, "(a fraction of the GPU's memory)")},
    "replan": {"gpus": (1, MAX_GPUS, False, "GPUs this planner handles"),
               "lose_nodes": (1, MAX_NODES, False, ""), "add_nodes": (1, MAX_NODES, False, ""),
               "compatible_within": (0, 1000, False, "%")},
    "profile": {"timeout": (0, MAX_RUN_S, True, "seconds"), "max_bytes": (1, 1 << 40, False, "bytes"),
                "nproc": (1, MAX_GPUS_PER_NODE, False, "processes on this machine")},
    "launch": {"steps": (1, 10**9, False, ""), "checkpoint_every": (1, 10**9, False, "steps"),
               "nnodes": (1, MAX_NODES, False, ""), "node_rank": (0, MAX_NODES - 1, False, ""),
               "nproc_per_node": (1, MAX_GPUS_PER_NODE, False, ""), "max_restarts": (0, 1000, False, ""),
               "dead_after": (1, 1000, False, ""), "timeout": (0, MAX_RUN_S, True, "seconds (30 days)"),
               "straggler_factor": (1, MAX_STRAGGLER_FACTOR, True, "times the median step"),
               "straggler_steps": (1, 10**6, False, "steps"),
               "prompt_len": (0, MAX_SEQ, False, "tokens (0: the plan's)"),
               "output_len": (0, MAX_SEQ, False, "tokens (0: the plan's)"),
               "batch": (0, MAX_BATCH, False, "(0: the plan's)")},
}

# output flags that name a file (never a folder), by command, with an example name
# plan --out may name a folder (one <target>.yaml per target there: planner.cli.cmd_plan.out_path)
_FILE_OUTPUTS = {"plan": {"csv": "candidates.csv"}, "replan": {"out": "plan.yaml"},
                 "explain": {"html": "report.html"}, "calibrate": {"out": "cluster.yaml"},
                 "validate": {"write": "VALIDATION.md"}, "launch": {"metrics": "metrics.jsonl"}}

_PROBLEM = ("model", "cluster", "gpus", "global_batch", "seq_len", "dtype", "optimizer", "attention_kernel",
            "seed", "allow_long_context")
_DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "grad_accum", "dp_shard", "recompute_layers",
            "zero", "sp", "recompute", "schedule", "mesh_order", "moe_dispatcher", "ep_overlap", "recompute_modules",
            "offload_modules")
_SERVING = ("prompt_len", "output_len", "batch", "ttft_slo_ms", "tpot_slo_ms", "slo_margin", "kv_dtype", "max_batch",
            "request_rate", "batching", "disaggregation", "max_num_batched_tokens", "max_num_seqs",
            "gpu_memory_utilization", "pareto", "pareto_csv", "hf_id")
_FAILURES = ("mtbf_hours", "repair_hours", "restart_overhead_s", "async_checkpoint")
_TRAINING_ONLY_IN_PLAN = ("global_batch", "seq_len", "optimizer", "attention_kernel", "price_per_gpu_hour",
                          "allow_long_context") + _FAILURES
_LAUNCH_TRAINING = ("checkpoint_dir", "checkpoint_every", "resume", "overwrite_checkpoints", "max_restarts",
                    "inject_failure", "on_failure", "dead_after", "async_checkpoint", "straggler_factor",
                    "straggler_steps", "on_straggler", "data")

# One table: per command, the flags each mode does not use (the mode is --mode for `plan`, the
# plan file's for the others), with what to do instead.
MODE_ONLY: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "plan": {"infer": (_TRAINING_ONLY_IN_PLAN, "training options; --mode infer takes --batch, --prompt-len and "
                                               "--output-len instead (the sequence is prompt + output)"),
             "train": (_SERVING, "serving options; add --mode infer, or drop them for a training plan")},
    "explain": {"infer": (_FAILURES, "training options (the goodput of a training run under failures); "
                                     "{plan} is a serving plan: drop them")},
    "launch": {"infer": (_LAUNCH_TRAINING, "training options; {plan} is an inference plan: drop them"),
               "train": (("prompt_len", "output_len", "batch"), "serving options; {plan} is a training plan")},
}


def _mode_of(command: str, args: argparse.Namespace) -> str | None:
    if command == "plan":
        return getattr(args, "mode", "train") or "train"
    plan = getattr(args, "plan", None)
    if not plan:
        return None
    from planner.plan.planfile import read_plan
    return read_plan(plan).mode


def check_mode_flags(command: str, args: argparse.Namespace, given: set[str]) -> None:
    """Refuse, by name, every flag that the command's mode does not use (``MODE_ONLY``)."""
    table = MODE_ONLY.get(command)
    if not table:
        return
    mode = None
    for m, (dests, _) in table.items():
        if any(d in given for d in dests):
            mode = mode or _mode_of(command, args)
            break
    if mode not in table:
        return
    dests, why = table[mode]
    ignored = [d for d in dests if d in given]
    if ignored:
        raise UsageError(f"{_flags(ignored)}: {why.format(plan=getattr(args, 'plan', ''))}")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _flags(dests) -> str:
    return ", ".join(flag(d) for d in dests)


def given_dests(make_parser: Callable[[], argparse.ArgumentParser], argv: list[str]) -> set[str]:
    """The dests set on the command line (not left at their defaults)."""
    parser = make_parser()
    todo = [parser]
    while todo:
        p = todo.pop()
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(a.choices.values())
            elif a.dest not in ("help", "version", "command") and a.default is not argparse.SUPPRESS:
                a.default = _SENTINEL
    ns = parser.parse_args(argv)
    return {k for k, v in vars(ns).items() if v is not _SENTINEL and not k.startswith("_")} - {"command", "debug"}


# why a lower bound above the obvious one is where it is
_WHY_LOW = {"mtbf_hours": "a node failing every 3.6 s or more often completes no step; e.g. 6335 (Meta's Llama 3 "
                          "run: 54 days x 24 h x 2,048 nodes / 419 failures)"}


def _range(dest: str, v: Any, rule: tuple[float, float, bool, str]) -> None:
    lo, hi, lo_open, note = rule
    unit = f" {note}" if note and not note.startswith("(") else ""
    extra = f" {note}" if note.startswith("(") else ""
    if (v <= lo) if lo_open else (v < lo):
        why = f"; {_WHY_LOW[dest]}" if dest in _WHY_LOW else ""
        raise UsageError(f"{flag(dest)} must be {'>' if lo_open else '>='} {num(lo)}{extra}, got {num(v)}{why}")
    if v > hi:
        raise UsageError(f"{flag(dest)} {num(v)} is more than {num(hi)}{unit or ' (the most this planner takes)'}; "
                         "is it a typo?")


# flags whose default (0: off, no limit) lies outside their range: checked only when given, so that
# `--timeout 0` or `--checkpoint-every 0` is refused by name rather than accepted and ignored
_DEFAULT_OFF = {("launch", "timeout"): "0 is the default (no limit): drop --timeout, or give seconds > 0",
                ("launch", "checkpoint_every"): "0 is the default (no checkpoints): drop --checkpoint-every, or "
                                                "give K >= 1 with --checkpoint-dir"}


def check_numbers(command: str, args: argparse.Namespace, given: set[str] | None = None) -> None:
    """Every float flag finite; every numeric flag with a rule inside its range."""
    rules = {**_COMMON, **_BY_COMMAND.get(command, {})}
    for dest, v in sorted(vars(args).items()):
        if dest.startswith("_") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{flag(dest)} must be a finite number, got {v}")
        off = _DEFAULT_OFF.get((command, dest))
        if off is not None and (given is None or dest not in given):
            continue
        if dest in rules:
            try:
                _range(dest, v, rules[dest])
            except UsageError as e:
                raise UsageError(f"{e}; {off}" if off else str(e)) from None


def check_strings(args: argparse.Namespace, given: set[str], positional: frozenset = frozenset()) -> None:
    """A string flag (or argument) given on the command line is not empty and holds no control
    character."""
    for dest in sorted(given):
        v = getattr(args, dest, None)
        if not isinstance(v, str):
            continue
        name = dest.upper() if dest in positional else flag(dest)
        if not v.strip():
            raise UsageError(f"{name} is empty ({v!r}); give a value" + ("" if dest in positional else
                                                                        ", or drop the flag for its default"))
        bad = next((c for c in v if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
        if bad is not None:
            raise UsageError(f"{name} {v[:60]!r} holds the control character {bad!r}; no name, path or "
                             "value takes one: retype it")


def positional_dests(make_parser: Callable[[], argparse.ArgumentParser], command: str) -> frozenset:
    """The dests of the command's positional arguments (``PLAN``)."""
    for a in make_parser()._actions:
        if isinstance(a, argparse._SubParsersAction) and command in a.choices:
            return frozenset(x.dest for x in a.choices[command]._actions if not x.option_strings)
    return frozenset()


def check_applicable(command: str, args: argparse.Namespace, given: set[str]) -> None:
    """Refuse, by name, flags that this command would ignore with the other flags given."""
    if command == "estimate" and "plan" in given:
        ignored = [d for d in _PROBLEM + _DEGREES if d in given]
        if ignored:
            raise UsageError(f"{_flags(ignored)}: not used with --plan (the plan fixes the model, cluster, workload "
                             "and degrees); drop them, or estimate from flags without --plan "
                             "(`planner replan` plans for another cluster)")
    check_mode_flags(command, args, given)
    if command == "plan":
        if getattr(args, "mode", "train") != "infer":
            if "price_per_gpu_hour" in given and getattr(args, "objective", None) != "cost":
                raise UsageError("--price-per-gpu-hour is used by --objective cost only; add --objective cost "
                                 "or drop it")
    if command == "explain" and getattr(args, "no_what_if", False) and "max_time" in given:
        raise UsageError("--max-time limits the what-if re-solves, and --no-what-if skips them; drop one")
    if command == "emit" and getattr(args, "list", False):
        ignored = [d for d in ("plan", "target", "out", "force") if d in given]
        if ignored:
            raise UsageError(f"{', '.join('PLAN' if d == 'plan' else flag(d) for d in ignored)}: not used with "
                             "--list (it lists the targets); drop them, or drop --list to write files")
    if command == "profile" and "nvml_replay" in given and "record_nvml" in given:
        raise UsageError("--record-nvml records the real NVML, and --nvml-replay replaces it; give one")
    if command == "launch":
        check_launch(args, given)
    if command == "replan" and "group" in given and not ({"lose_nodes", "add_nodes"} & given):
        raise UsageError("--group says which node group loses or gains nodes; give --lose-nodes K or --add-nodes K")


_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?|\[[0-9A-Fa-f:.]{2,45}\]|[0-9A-Fa-f:.]{2,45}")


def _host_problem(host: str) -> str | None:
    if not _HOST.fullmatch(host) or ".." in host:
        return "is not a host name or an IP address (letters, digits, '.', '-'; IPv6 in [brackets])"
    return None


def check_launch(args: argparse.Namespace, given: set[str]) -> None:
    """The rendezvous endpoint HOST:PORT (port 1-65535), this node's address, and the node rank
    below the node count: checked here, before torchrun starts and waits out its timeout."""
    ep = getattr(args, "rdzv_endpoint", "") or ""
    if ep:
        host, sep, port = ep.rpartition(":")
        if not sep or not host:
            raise UsageError(f"--rdzv-endpoint {ep!r} must be HOST:PORT, e.g. node0:29500")
        bad = _host_problem(host)
        if bad:
            raise UsageError(f"--rdzv-endpoint {ep!r}: host {host!r} {bad}; e.g. node0:29500")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise UsageError(f"--rdzv-endpoint {ep!r}: port {port!r} must be an integer from 1 to 65535; "
                             "e.g. node0:29500")
    addr = getattr(args, "local_addr", "") or ""
    if addr:
        bad = _host_problem(addr)
        if bad:
            raise UsageError(f"--local-addr {addr!r} {bad}; give this node's address as the others reach it")
    rank, nnodes = getattr(args, "node_rank", None), getattr(args, "nnodes", 1)
    if rank is not None and isinstance(nnodes, int) and rank >= nnodes:
        raise UsageError(f"--node-rank {rank} must be below --nnodes {nnodes} (ranks 0 to {nnodes - 1})")


def check_outputs(command: str, args: argparse.Namespace) -> None:
    """An output flag that names a file must not name an existing folder."""
    for dest, example in _FILE_OUTPUTS.get(command, {}).items():
        v = getattr(args, dest, None)
        if v and Path(v).is_dir():
            raise UsageError(f"{flag(dest)} {v} is a folder; give a file name, e.g. {Path(v) / example}")


def check_args(args: argparse.Namespace, argv: list[str],
               make_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """All the checks above, for the parsed ``args`` of ``argv``."""
    command = getattr(args, "command", None) or ""
    given = given_dests(make_parser, argv)
    check_numbers(command, args, given)
    check_strings(args, given, positional_dests(make_parser, command))
    check_applicable(command, args, given)
    check_outputs(command, args)
