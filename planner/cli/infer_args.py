"""Flags of ``planner plan --mode infer`` (serving), added to the ``plan`` parser.

The shared flags (``--model --cluster --gpus --dtype --tp --pp --dp --ep --top --json --out``)
come from ``planner.cli.args`` and ``planner.cli.cmd_plan``; in serving ``--dp`` is the number of
replicas and ``--dtype`` the weights' precision (bf16, fp16, fp8, int8, int4).
"""
from __future__ import annotations

import argparse

KV_DTYPE_CHOICES = ["bf16", "fp16", "fp8", "int8"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving (--mode infer)")
    g.add_argument("--prompt-len", type=int, help="prompt tokens per request (required with --mode infer)")
    g.add_argument("--output-len", type=int, help="generated tokens per request (required with --mode infer)")
    g.add_argument("--batch", type=int,
                   help="concurrent sequences per replica, fixed (then the plan minimizes request latency); "
                        "default: solved, maximizing output tokens/s per GPU")
    g.add_argument("--ttft-slo-ms", type=float, help="time-to-first-token goal in milliseconds")
    g.add_argument("--tpot-slo-ms", type=float, help="time-per-output-token goal in milliseconds")
    g.add_argument("--kv-dtype", choices=KV_DTYPE_CHOICES,
                   help="KV-cache precision (default: the weights' dtype; 16-bit for int8/int4 weights)")
    g.add_argument("--max-batch", type=int, default=4096,
                   help="largest concurrent sequences per replica the search considers (default 4096)")
