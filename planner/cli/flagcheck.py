"""Every flag checked once, after parsing and before a command runs: numbers in range (finite,
positive where a count is, below the ceilings of ``costmodel.limits``), flags that the chosen
mode or input would ignore refused by name, and output paths that name a folder refused.

argparse has already checked types (``--tp x`` is not an integer) and choices. What a flag
was *given* (not left at its default) is found by parsing the same arguments again with every
default replaced by a sentinel: ``--dtype bf16`` given explicitly is then told apart from the
default ``bf16``.

Called from ``planner.cli.main``; raises ``UsageError`` (exit 2) with the flag, the value and
what to do.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable

from costmodel.limits import (MAX_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_NODES, MAX_PRICE, MAX_SEED,
                              MAX_SEQ, num)
from planner.plan.errors import UsageError

_SENTINEL = object()
INF = math.inf

# (lo, hi, lo_exclusive, note) by dest; per-command rules override the common ones.
_COMMON: dict[str, tuple[float, float, bool, str]] = {
    "gpus": (0, MAX_GPUS, True, "GPUs this planner handles"),
    "global_batch": (0, MAX_BATCH, True, ""),
    "seq_len": (0, MAX_SEQ, True, "tokens"),
    "seed": (0, MAX_SEED, False, ""),
    **{k: (1, MAX_GPUS, False, "") for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "dp_shard")},
    "micro_batch": (1, MAX_BATCH, False, ""),
    "grad_accum": (1, MAX_BATCH, False, ""),
    "recompute_layers": (0, MAX_LAYERS, False, ""),
    "max_time": (0, INF, True, "seconds"),
}
_BY_COMMAND: dict[str, dict[str, tuple[float, float, bool, str]]] = {
    "plan": {"top": (1, 1000, False, "plans"), "price_per_gpu_hour": (0, MAX_PRICE, True, "USD per GPU-hour"),
             "prompt_len": (1, MAX_SEQ, False, "tokens"), "output_len": (1, MAX_SEQ, False, "tokens"),
             "batch": (1, MAX_BATCH, False, ""), "max_batch": (1, MAX_BATCH, False, ""),
             "ttft_slo_ms": (0, INF, True, "ms"), "tpot_slo_ms": (0, INF, True, "ms")},
    "replan": {"gpus": (1, MAX_GPUS, False, "GPUs this planner handles"),
               "lose_nodes": (1, MAX_NODES, False, ""), "add_nodes": (1, MAX_NODES, False, ""),
               "compatible_within": (0, 1000, False, "%")},
    "profile": {"timeout": (0, INF, True, "seconds"), "max_bytes": (1, 1 << 40, False, "bytes"),
                "nproc": (1, INF, False, "")},
    "launch": {"steps": (1, 10**9, False, ""), "checkpoint_every": (0, 10**9, False, ""),
               "nnodes": (1, MAX_NODES, False, ""), "node_rank": (0, MAX_NODES - 1, False, ""),
               "nproc_per_node": (1, MAX_GPUS_PER_NODE, False, ""), "max_restarts": (0, 1000, False, ""),
               "dead_after": (1, 1000, False, ""), "timeout": (0, INF, False, "seconds (0: no limit)"),
               "prompt_len": (0, MAX_SEQ, False, "tokens (0: the plan's)"),
               "output_len": (0, MAX_SEQ, False, "tokens (0: the plan's)"),
               "batch": (0, MAX_BATCH, False, "(0: the plan's)")},
}

# output flags that name a file (never a folder), by command, with an example name
_FILE_OUTPUTS = {"plan": {"out": "plan.yaml", "csv": "candidates.csv"}, "replan": {"out": "plan.yaml"},
                 "explain": {"html": "report.html"}, "calibrate": {"out": "cluster.yaml"},
                 "validate": {"write": "VALIDATION.md"}, "launch": {"metrics": "metrics.jsonl"}}

_PROBLEM = ("model", "cluster", "gpus", "global_batch", "seq_len", "dtype", "optimizer", "attention_kernel",
            "seed", "allow_long_context")
_DEGREES = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "grad_accum", "dp_shard", "recompute_layers",
            "zero", "sp", "recompute", "schedule", "mesh_order")
_SERVING = ("prompt_len", "output_len", "batch", "ttft_slo_ms", "tpot_slo_ms", "slo_margin", "kv_dtype", "max_batch")
_TRAINING_ONLY_IN_PLAN = ("global_batch", "seq_len", "optimizer", "attention_kernel", "price_per_gpu_hour",
                          "allow_long_context")


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


def _range(dest: str, v: Any, rule: tuple[float, float, bool, str]) -> None:
    lo, hi, lo_open, note = rule
    unit = f" {note}" if note and not note.startswith("(") else ""
    extra = f" {note}" if note.startswith("(") else ""
    if (v <= lo) if lo_open else (v < lo):
        raise UsageError(f"{flag(dest)} must be {'>' if lo_open else '>='} {num(lo)}{extra}, got {num(v)}")
    if v > hi:
        raise UsageError(f"{flag(dest)} {num(v)} is more than {num(hi)}{unit or ' (the most this planner takes)'}; "
                         "is it a typo?")


def check_numbers(command: str, args: argparse.Namespace) -> None:
    """Every float flag finite; every numeric flag with a rule inside its range."""
    rules = {**_COMMON, **_BY_COMMAND.get(command, {})}
    for dest, v in sorted(vars(args).items()):
        if dest.startswith("_") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{flag(dest)} must be a finite number, got {v}")
        if dest in rules:
            _range(dest, v, rules[dest])


def check_applicable(command: str, args: argparse.Namespace, given: set[str]) -> None:
    """Refuse, by name, flags that this command would ignore with the other flags given."""
    if command == "estimate" and "plan" in given:
        ignored = [d for d in _PROBLEM + _DEGREES if d in given]
        if ignored:
            raise UsageError(f"{_flags(ignored)}: not used with --plan (the plan fixes the model, cluster, workload "
                             "and degrees); drop them, or estimate from flags without --plan "
                             "(`planner replan` plans for another cluster)")
    if command == "plan":
        infer = getattr(args, "mode", "train") == "infer"
        if infer:
            ignored = [d for d in _TRAINING_ONLY_IN_PLAN if d in given]
            if ignored:
                raise UsageError(f"{_flags(ignored)}: training options; --mode infer takes --batch, --prompt-len and "
                                 "--output-len instead (the sequence is prompt + output)")
        else:
            ignored = [d for d in _SERVING if d in given]
            if ignored:
                raise UsageError(f"{_flags(ignored)}: serving options; add --mode infer, or drop them for a "
                                 "training plan")
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
    if command == "launch" and {"prompt_len", "output_len", "batch"} & given:
        from planner.plan.planfile import read_plan
        if read_plan(args.plan).mode == "train":
            ignored = [d for d in ("prompt_len", "output_len", "batch") if d in given]
            raise UsageError(f"{_flags(ignored)}: serving options; {args.plan} is a training plan")
    if command == "replan" and "group" in given and not ({"lose_nodes", "add_nodes"} & given):
        raise UsageError("--group says which node group loses or gains nodes; give --lose-nodes K or --add-nodes K")


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
    check_numbers(command, args)
    check_applicable(command, args, given_dests(make_parser, argv))
    check_outputs(command, args)
