"""Flags of ``planner plan --mode infer`` (serving), added to the ``plan`` parser.

The shared flags (``--model --cluster --gpus --dtype --tp --pp --dp --ep --top --json --out``)
come from ``planner.cli.args`` and ``planner.cli.cmd_plan``; in serving ``--dp`` is the number of
replicas and ``--dtype`` the weights' precision (bf16, fp16, fp8, int8, int4). ``--target`` (the
engine whose scheduler the plan models: vllm, sglang, tensorrt-llm, or builtin) is the plan
command's own where it has one; it is added here otherwise.
"""
from __future__ import annotations

import argparse

from planner.cli.args import target_name

KV_DTYPE_CHOICES = ["bf16", "fp16", "fp8", "int8"]
SERVING_TARGETS = ("vllm", "sglang", "tensorrt-llm", "builtin")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving (--mode infer)")
    g.add_argument("--prompt-len", type=int, help="prompt tokens per request (required with --mode infer)")
    g.add_argument("--output-len", type=int, help="generated tokens per request (required with --mode infer)")
    g.add_argument("--batch", type=int,
                   help="concurrent requests per replica, fixed (then the plan minimizes request latency); "
                        "default: solved, maximizing output tokens/s per GPU")
    g.add_argument("--request-rate", type=float,
                   help="requests per second over the whole deployment (Poisson arrivals), fixed: the plan that "
                        "serves it with the lowest request latency")
    g.add_argument("--ttft-slo-ms", type=float, help="time-to-first-token goal in milliseconds (mean)")
    g.add_argument("--tpot-slo-ms", type=float, help="time-per-output-token goal in milliseconds (mean)")
    g.add_argument("--slo-margin", default=None, metavar="auto|FRACTION",
                   help="how far below each goal the predicted TTFT and TPOT must stay, as a fraction of the goal "
                        "(the plan must meet goal / (1 + margin)); default auto: the cost model's validated "
                        "serving error (costmodel/uncertainty_bands.yaml: serve-ttft, serve-tpot); 0 plans on "
                        "the goals themselves")
    g.add_argument("--kv-dtype", choices=KV_DTYPE_CHOICES,
                   help="KV-cache precision (default: the weights' dtype; 16-bit for int8/int4 weights)")
    g.add_argument("--max-batch", type=int, default=4096,
                   help="largest concurrent requests per replica the search considers (default 4096)")
    g.add_argument("--batching", choices=["inflight", "static"], default=None,
                   help="inflight (default): continuous batching with chunked prefill as vLLM, SGLang and "
                        "TensorRT-LLM run it, the figures from its steady state; static: whole batches, prefill "
                        "then decode (offline jobs; the built-in runtime)")
    g.add_argument("--disaggregation", choices=["auto", "off", "only"], default="auto",
                   help="prefill/decode disaggregation: auto (default) searches both and reports the best of "
                        "each; off: aggregated replicas only; only: disaggregated layouts only")
    g.add_argument("--max-num-batched-tokens", type=int,
                   help="scheduler token budget per step (vLLM --max-num-batched-tokens, SGLang "
                        "--chunked-prefill-size, TensorRT-LLM --max_num_tokens); default: the engine's")
    g.add_argument("--max-num-seqs", type=int, help="running requests per replica cap (default: the engine's)")
    g.add_argument("--gpu-memory-utilization", type=float,
                   help="share of GPU memory the engine takes for weights, activations and KV cache "
                        "(default 0.90; the emitted server flags use the same value)")
    g.add_argument("--pareto", action="store_true",
                   help="also the frontier of output tokens/s per GPU against tokens/s per user over "
                        "concurrency and layouts (table; in the plan file for `planner explain --html`)")
    g.add_argument("--pareto-csv", metavar="FILE", help="write the frontier as CSV")
    g.add_argument("--hf-id", help="Hugging Face model id the serving files load (default: the config's "
                                   "_name_or_path, or the catalog's id)")
    if "--target" not in p._option_string_actions:     # the plan command's own --target wins
        g.add_argument("--target", choices=SERVING_TARGETS, default=None, type=target_name,
                       help="serving engine whose scheduler the plan models and whose flags it emits "
                            "(default vllm; builtin: the built-in runtime, static batches)")
