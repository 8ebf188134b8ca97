"""Where one training micro-step of the planner's own runtime spends its time on this device: the
runtime's model (``runtime.model``), autocast to bf16 on a GPU as ``runtime.train`` runs it, its loss,
and AdamW, timed by micro-batch size and profiled kernel by kernel (``torch.profiler``).

    python bench/device_step.py [--model gpt3-1.3b] [--seq 2048] [--mbs 1,2,4,8] [--json OUT]

It answers what `planner launch`'s predicted-vs-measured table cannot: whether a gap is GPU work the
cost model under-prices (its GEMMs, attention, memory-bound kernels, the loss) or time the GPU waits
on the host. Per micro-batch size it reports the wall time of one forward + backward, the GPU's busy
time in the same pass (the sum of its kernels' times: one stream, so they do not overlap), the kernel
count, and the busy time by kind (GEMM, attention, the rest); and the optimizer step's wall time.
Nothing here changes the cost model. On a CPU it runs the same code on a small model in fp32 (the
test suite runs it so, ``tests/test_device_curves.py``), without kernel times.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GEMM_MARKS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "sm90_", "sm100_")
ATTN_MARKS = ("flash", "fmha", "attention", "cudnn", "sdpa", "attn")


def kind_of(kernel: str) -> str:
    """GEMM, attention or other, by the kernel's name (cuBLAS/cuBLASLt, CUTLASS, FlashAttention, cuDNN)."""
    k = kernel.lower()
    if any(m in k for m in ATTN_MARKS):
        return "attention"
    if any(m in k for m in GEMM_MARKS):
        return "gemm"
    return "other"


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def micro_step(torch: Any, model: Any, x: Any, y: Any, bf16: bool) -> None:
    """One forward + backward as ``runtime.train`` runs it (autocast; the loss in fp32)."""
    import contextlib

    import torch.nn.functional as F
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(0, 1))
    loss.backward()


def profile_pass(torch: Any, fn: Any, dev: Any, trace: str | None = None) -> dict:
    """Kernel count, busy time and busy time by kind over one call of ``fn`` (CUDA only), plus
    the host-side launch calls counted."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        _sync(torch, dev)
    if trace:                        # the timeline (chrome://tracing, Perfetto): where the GPU waits
        prof.export_chrome_trace(trace)
    by_kind = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    kernels, launches, top = 0, 0, []
    for e in prof.key_averages():
        name = e.key
        if name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"):
            launches += e.count
        dev_us = float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)
        on_gpu = getattr(e, "device_type", None) == DeviceType.CUDA if hasattr(e, "device_type") \
            else not name.startswith(("aten::", "autograd::", "torch::", "cuda", "Optimizer", "ProfilerStep"))
        if dev.type != "cuda" or dev_us <= 0 or not on_gpu:
            continue
        if "Memcpy" in name or "Memset" in name:
            kind = "other"
        else:
            kind = kind_of(name)
        by_kind[kind] += dev_us * 1e-6
        kernels += e.count
        top.append((dev_us * 1e-6, e.count, kind, name[:110]))
    top.sort(reverse=True)
    sort = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    try:
        table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90)
    except Exception as e:          # a renamed sort key in another PyTorch
        table = f"{type(e).__name__}: {e}"
    return {"table": table, "kernels": kernels, "launch_calls": launches, "busy_s": round(sum(by_kind.values()), 6),
            "busy_by_kind_s": {k: round(v, 6) for k, v in by_kind.items()},
            "top_kernels": [{"s": round(s, 6), "count": c, "kind": k, "name": n} for s, c, k, n in top[:25]]}


def sync_points(torch: Any, dev: Any, fn: Any) -> list[str] | None:
    """The operations of one call of ``fn`` that make the host wait for the GPU (PyTorch's sync debug
    mode, as warnings): where the GPU's queue drains and then idles while the host issues again."""
    if dev.type != "cuda":
        return None
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _sync(torch, dev)
    return sorted({str(w.message)[:160] for w in caught})


def measure(torch: Any, spec: Any, dev: Any, seq: int, mbs: list[int], reps: int, compile_: bool,
            deadline: float, optimizer: bool = True, trace: str | None = None) -> dict:
    from runtime.model import build_model
    bf16 = dev.type == "cuda"
    torch.manual_seed(0)
    with torch.device(dev):          # initialised where it runs: an 8B model's init on the host takes minutes
        model = build_model(spec)
    n_params = sum(p.numel() for p in model.parameters())
    # AdamW's fp32 state does not fit beside a larger model on one GPU: its forward + backward alone
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1) if optimizer else None
    run = model
    if compile_:
        for name, blk in list(model.layers.items()):
            model.layers[name] = torch.compile(blk)
    out: dict[str, Any] = {"params": n_params, "compiled": compile_, "by_micro_batch": []}
    for mb in mbs:
        if time.time() > deadline:
            out["stopped"] = f"time limit before micro-batch {mb}"
            break
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        x = torch.randint(0, spec.vocab, (mb, seq), device=dev)
        y = torch.randint(0, spec.vocab, (mb, seq), device=dev)
        try:
            for _ in range(2):
                micro_step(torch, run, x, y, bf16)
            _sync(torch, dev)
            t0 = time.perf_counter()
            for _ in range(reps):
                micro_step(torch, run, x, y, bf16)
            issued = (time.perf_counter() - t0) / reps     # the host's own time, where it runs ahead
            _sync(torch, dev)
            wall = (time.perf_counter() - t0) / reps
            syncs = sync_points(torch, dev, lambda: micro_step(torch, run, x, y, bf16)) if mb == mbs[0] else None
            opt_s = 0.0
            if opt is not None:
                t0 = time.perf_counter()
                for _ in range(3):
                    opt.step()
                _sync(torch, dev)
                opt_s = (time.perf_counter() - t0) / 3
            model.zero_grad(set_to_none=True)
            prof = profile_pass(torch, lambda: micro_step(torch, run, x, y, bf16), dev,
                                trace=f"{trace}.mb{mb}.json" if trace else None)
            model.zero_grad(set_to_none=True)
            peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else 0
        except Exception as e:          # out of memory at the largest micro-batch, say
            out["by_micro_batch"].append({"micro_batch": mb, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            break
        row = {"micro_batch": mb, "tokens": mb * seq, "fwd_bwd_wall_s": round(wall, 6),
               "host_issue_s": round(issued, 6), "sync_points": syncs, "optimizer_s": round(opt_s, 6),
               "peak_gib": round(peak / 2**30, 2), **prof}
        out["by_micro_batch"].append(row)
        print(f"  mb {mb}{' compiled' if compile_ else ''}: fwd+bwd {wall * 1e3:.1f} ms wall, GPU busy "
              f"{prof['busy_s'] * 1e3:.1f} ms (gemm {prof['busy_by_kind_s']['gemm'] * 1e3:.1f}, attention "
              f"{prof['busy_by_kind_s']['attention'] * 1e3:.1f}, other {prof['busy_by_kind_s']['other'] * 1e3:.1f}), "
              f"{prof['kernels']} kernels, {prof['launch_calls']} launches, host issue {issued * 1e3:.1f} ms; "
              f"optimizer {opt_s * 1e3:.1f} ms; syncs {syncs}; "
              f"peak {row['peak_gib']} GiB", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt3-1.3b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mbs", default="1,2,4,8", help="micro-batch sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also each block under torch.compile")
    ap.add_argument("--no-optimizer", action="store_true", help="forward + backward only (a model whose AdamW "
                    "state does not fit beside it)")
    ap.add_argument("--time-limit", type=float, default=150.0, help="seconds; later micro-batches are skipped")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--trace", metavar="PREFIX", help="also write each profiled pass's timeline as PREFIX.mbN.json")
    args = ap.parse_args(argv)
    import torch

    from costmodel.catalog import get_model
    deadline = time.time() + args.time_limit
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    spec = get_model(args.model)
    mbs = [int(m) for m in args.mbs.split(",")]
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
                           "model": args.model, "seq": args.seq, "runs": []}
    print(f"{res['device']} ({res['torch']}): {args.model}, sequence {args.seq}", flush=True)

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    for compile_ in ([False, True] if args.compile else [False]):
        res["runs"].append(measure(torch, spec, dev, args.seq, mbs if not compile_ else mbs[:2], args.reps,
                                   compile_, deadline, optimizer=not args.no_optimizer, trace=args.trace))
        save()
        if cuda:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
