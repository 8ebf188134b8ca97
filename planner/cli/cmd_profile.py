"""``planner profile``: measure this machine (or, under torchrun, every node) and write a
cluster file, raw CSVs and a report.

Standalone it spawns ``--nproc`` ranks here (NCCL on GPUs, gloo on CPUs); under torchrun
(``torchrun --nnodes M --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m planner
profile --out DIR``) every rank measures and rank 0 writes. Exit codes: 0 done; 1 a rank died,
hung or failed (partial results kept in ``--out``); 2 bad input (an unwritable ``--out``, or a
link, FIFO or device where an output goes, is refused before anything is measured); 143 stopped
by SIGTERM (handled like Ctrl-C, 130: every spawned rank is stopped, the partial results stay).
``--nproc`` is bounded by this machine's cores unless ``--force`` (``planner.cli.procs``); the spawned
ranks' store and gloo sockets listen on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import json
import sys

HELP = "measure GPUs (or CPU processes), links and collectives; write a cluster file and a report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a short run (under 20 s on a 2-core CPU machine)")
    p.add_argument("--out", default="profile", metavar="DIR",
                   help="folder for cluster.yaml, the CSVs and the report (default: ./profile)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="ranks to spawn on this machine (default: one per GPU; 2 CPU processes with --quick, else 4); "
                        "ignored under torchrun")
    p.add_argument("--force", action="store_true",
                   help="spawn more ranks than this machine's cores take (memory still bounds them)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--name", default=None, help="the cluster's name in the file (default: measured-<host>)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="a rank that makes no progress for S seconds is reported as hung (default 120)")
    p.add_argument("--max-bytes", type=int, default=None, metavar="B", help="largest collective message")
    p.add_argument("--no-report", action="store_true", help="skip report.md and report.html")
    p.add_argument("--nvml-replay", default=None, metavar="FILE",
                   help="answer NVML from a recording (tests/data/nvml/*.json) instead of this machine's driver; "
                        "benchmarks still run on this machine's CPU")
    p.add_argument("--record-nvml", default=None, metavar="FILE",
                   help="write every NVML answer the probe received to FILE (a recording for --nvml-replay)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from planner.plan.errors import CheckFailed, UsageError
    from profiles.profile import ProfileInputError, ProfileOptions, RankFailed, run_profile, under_torchrun

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.nvml_replay and not Path(args.nvml_replay).is_file():
        raise UsageError(f"--nvml-replay {args.nvml_replay}: no such file")
    from planner.cli.procs import EXIT_SIGTERM, Terminated, check_cpu_processes, sigterm_as_exception
    if args.nproc is not None and args.nproc >= 1 and not under_torchrun():
        check_cpu_processes(args.nproc, "--nproc", args.force, "ranks")
    if args.record_nvml:
        from costmodel.files.safeio import check_output
        check_output(args.record_nvml, "--record-nvml")
    rank0 = not under_torchrun() or __import__("os").environ.get("RANK", "0") == "0"
    opts = ProfileOptions(out_dir=Path(args.out), quick=args.quick, nproc=args.nproc, timeout_s=args.timeout,
                          name=args.name, max_bytes=args.max_bytes, nvml_replay=args.nvml_replay,
                          record_nvml=args.record_nvml, report=not args.no_report,
                          progress=rank0 and sys.stderr.isatty() and not args.json)

    def log(msg: str) -> None:
        if msg:
            print(f"planner profile: {msg}", file=sys.stderr)

    try:
        with sigterm_as_exception():
            summary = run_profile(opts, log=log)
    except Terminated as e:
        print(f"planner profile: {e}: stopped every rank it had started; partial results stay in {args.out}; "
              f"exit {EXIT_SIGTERM}", file=sys.stderr)
        return EXIT_SIGTERM
    except ProfileInputError as e:
        raise UsageError(str(e)) from None
    except RankFailed as e:
        if args.json and rank0:
            print(json.dumps({"status": "failed", "error": str(e), **{k: v for k, v in e.partial.items()
                                                                      if k not in ("status", "error")}}, indent=1))
        raise CheckFailed(str(e)) from None
    if not rank0:
        return 0
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    _print_human(summary)
    return 0


def _print_human(s: dict) -> None:
    mm, mem = s["matmul"], s["memory"]
    lines = [f"profile of {s['nodes']} node(s) x {s['gpus_per_node']} {s['gpu']} ({s['backend']}), "
             f"{s['wall_time_s']} s",
             f"  matmul {mm['dtype']}: best {mm['best_tflops']} TFLOP/s"
             + (f" (datasheet {mm['datasheet_tflops']})" if mm.get("datasheet_tflops") else "")
             + f"; efficiency {mm['efficiency_max']} x s/(s+{mm['half_size']})",
             f"  memory copy: {mem['copy_gb_per_s']} GB/s"
             + (f" (datasheet {mem['datasheet_gb_per_s']})" if mem.get("datasheet_gb_per_s") else "")]
    if s.get("compute_comm_slowdown") is not None:
        lines.append(f"  overlap: communication beside compute still costs {s['compute_comm_slowdown']:.2f} of "
                     "the shorter of the two")
    if s.get("layer_overhead_us") is not None:
        lines.append(f"  host overhead: {s['layer_overhead_us']:.0f} us per layer per micro-batch (forward + backward)")
    if s.get("fsdp2_block_us") is not None:
        lines.append(f"  FSDP2 wrappers: {s['fsdp2_block_us']:.0f} us per block per micro-batch, "
                     f"{s.get('dtensor_param_step_us') or 0:.0f} us per parameter in the optimizer step")
    if s.get("dtensor_tp_layer_us") is not None:
        lines.append(f"  DTensor tensor parallelism: {s['dtensor_tp_layer_us']:.0f} us per layer per micro-batch")
    for kernel, a in (s.get("attention") or {}).items():
        span = ", ".join(f"{d} {a[d][0]:.2f}-{a[d][1]:.2f}" for d in ("fwd", "bwd") if a.get(d))
        if span:
            lines.append(f"  attention {kernel} (SDPA), causal, head dim {a['head_dim']:g}: {span} of peak over "
                         f"sequences {min(a['seq_lens']):g}-{max(a['seq_lens']):g}")
    for tier, t in s["tiers"].items():
        lines.append(f"  {tier}-node: busbw {t['busbw_gb_per_s']} GB/s, latency {t['latency_us']} us/step "
                     f"({t['op']} over {t['group']} of {t['group_size']})"
                     + (f"; datasheet {t['datasheet_gb_per_s']} GB/s" if t.get("datasheet_gb_per_s") else ""))
    lines.append(f"  cluster file: {s['cluster_file']}")
    if "report_html" in s.get("files", {}):
        lines.append(f"  report: {s['files']['report_md']}, {s['files']['report_html']}")
    print("\n".join(lines))
