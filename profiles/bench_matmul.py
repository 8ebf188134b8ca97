"""Matmul throughput benchmark: achieved FLOP/s by dtype and GEMM shape, and the efficiency table.

Owns: ``bench_matmul`` (time ``a @ b`` for square and transformer-like shapes, adaptive
iterations), ``efficiency_table`` (achieved / peak by GEMM size, the ``measured.matmul`` rows of
a cluster file) and ``fit_efficiency`` (the two numbers of the closed form the catalog uses).

GEMM size is the geometric mean of m, n, k (as ``GpuSpec.matmul_half_size`` is defined), and a
GEMM of m x k by k x n does 2 m n k FLOPs.

On a CPU each process stands for one "GPU" of the ``cpu`` cluster and runs with one thread
(torchrun's default OMP_NUM_THREADS=1), so the benchmark pins torch to one thread while it runs.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "tf32": "float32"}


def square_sizes(device_type: str, quick: bool) -> list[int]:
    if device_type == "cuda":
        return [512, 1024, 2048, 4096, 8192] if quick else [256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
    return [64, 128, 256, 512, 1024] if quick else [32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048]


def transformer_shapes(device_type: str, quick: bool) -> list[tuple[int, int, int]]:
    """A few (m, n, k) from transformer layers: tokens x hidden x 4 hidden, and its TP shards."""
    if quick:
        return []
    if device_type == "cuda":
        return [(8192, 4 * 8192 // tp, 8192) for tp in (1, 2, 4, 8)] + [(8192, 8192, 4 * 8192 // 8)]
    return [(1024, 4 * 512 // tp, 512) for tp in (1, 2, 4)]


# a CPU call this long is timed once, and a shape whose call would take longer is not run
LONG_CALL_S = 0.5
MAX_CALL_S = 1.0


def _is_cuda(device: Any) -> bool:
    return str(getattr(device, "type", device)).startswith("cuda")


def _sync(device: Any) -> None:
    import torch
    if _is_cuda(device):
        torch.cuda.synchronize(device)


def time_op(fn: Callable[[], Any], device: Any, target_s: float, max_iters: int = 1000,
            reps: int = 3) -> tuple[float, int]:
    """Seconds per call of ``fn``: after one warm-up, ``reps`` windows of enough calls to fill
    ``target_s / reps`` each; the fastest window counts (on a shared machine the others were
    interrupted). On a CPU a warm-up that alone takes ``LONG_CALL_S`` is the measurement: its
    one-time costs are milliseconds against seconds, and four more calls would only make a slow
    kernel (bfloat16 emulated where the CPU has no bf16 instructions) hold up the profile."""
    t0 = time.perf_counter()
    fn()
    _sync(device)
    warm = time.perf_counter() - t0
    if not _is_cuda(device) and warm >= max(target_s, LONG_CALL_S):
        return warm, 1
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    iters = int(min(max_iters, max(1, target_s / reps / one)))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best, iters


# A GEMM shorter than this per call is timed as CUDA-graph replays: launched one by one from Python, it
# measures the host's launch rate, not the GPU (session 31 on an H200: a 1,024-cube BF16 GEMM timed at
# 22 us per call, 0.14 of peak, where the launch floor alone is 9.65 us; bench/results/device-h200)
GRAPH_BELOW_S = 200e-6
GRAPH_CALLS = 20


def time_graphed(fn: Callable[[], Any], device: Any, target_s: float) -> tuple[float, int] | None:
    """Seconds per call of ``fn`` replayed ``GRAPH_CALLS`` to a CUDA graph (the host's launch cost
    out of the figure), and the calls timed; None where capture fails (the caller times it eagerly).
    Not yet run on a GPU: added after session 31's device time was spent."""
    import torch
    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
    except Exception:            # a capture this build or driver refuses
        return None
    t, replays = time_op(graph.replay, device, target_s)
    return t / GRAPH_CALLS, replays * GRAPH_CALLS


def bench_matmul(device: Any, dtypes: list[str], shapes: list[tuple[int, int, int]], target_s: float = 0.05,
                 on_row: Callable[[dict], None] | None = None,
                 on_start: Callable[[str, int, int, int], None] | None = None,
                 on_skip: Callable[[str, int, int, int, float], None] | None = None) -> list[dict]:
    """Rows ``{dtype, m, n, k, size, time_s, flops_per_s, iters}`` for each dtype and shape.

    On a CPU a shape whose one call would take more than ``MAX_CALL_S`` at the rate the dtype's
    last shape ran is skipped (``on_skip`` says which, with the predicted seconds): the plateau is
    read off the shapes before it, and a profile's watchdog sees progress at least that often."""
    import torch
    dev = torch.device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    rows: list[dict] = []
    try:
        for dt in dtypes:
            tdt = getattr(torch, DTYPE_NAMES[dt])
            if dev.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
            rate = 0.0                                 # FLOP/s of this dtype's last shape
            for m, n, k in shapes:
                flops = 2.0 * m * n * k
                if dev.type == "cpu" and rate > 0 and flops / rate > MAX_CALL_S:
                    if on_skip:
                        on_skip(dt, m, n, k, flops / rate)
                    continue
                if on_start:
                    on_start(dt, m, n, k)
                a = torch.randn(m, k, device=dev).to(tdt)
                b = torch.randn(k, n, device=dev).to(tdt)
                c = torch.empty(m, n, device=dev, dtype=tdt)
                t, iters = time_op(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), dev, target_s)
                if dev.type == "cuda" and t < GRAPH_BELOW_S:
                    t, iters = time_graphed(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), dev, target_s) or (t, iters)
                row = {"dtype": dt, "m": m, "n": n, "k": k, "size": round((m * n * k) ** (1 / 3), 1),
                       "time_s": t, "flops_per_s": flops / t, "iters": iters}
                rate = flops / t
                rows.append(row)
                if on_row:
                    on_row(row)
                del a, b, c
    finally:
        torch.set_num_threads(threads)
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def efficiency_table(rows: list[dict], dtype: str, peak_flops_per_s: float) -> list[tuple[float, float]]:
    """``(size, achieved / peak)`` for the square GEMMs of ``dtype``, sorted by size, capped at 1."""
    out = [(float(r["size"]), min(1.0, r["flops_per_s"] / peak_flops_per_s))
           for r in rows if r["dtype"] == dtype and r["m"] == r["n"] == r["k"]]
    return sorted(out)


def fit_efficiency(table: list[tuple[float, float]]) -> tuple[float, float]:
    """The catalog's closed form ``eff(s) = e_max * s / (s + s_half)`` read off the table by its
    definition: ``e_max`` the plateau (mean of the two largest sizes), ``s_half`` the size where
    the measured curve crosses ``e_max / 2`` (interpolated in log size).

    A least-squares fit of that curve bends too early for hardware with a sharp knee (a CPU's
    AMX units, a GPU's tensor cores once tiles fill), and under-predicts the large GEMMs that
    dominate a step; matching the plateau and the half point keeps both ends right.
    """
    if not table:
        raise ValueError("no matmul measurements to fit")
    pts = sorted(table)
    top = [e for _, e in pts[-2:]]
    e_max = min(1.0, max(sum(top) / len(top), 1e-6))
    half = e_max / 2
    s0, e0 = pts[0]
    if e0 >= half:                          # already past half at the smallest size measured
        return e_max, max(1.0, s0 * (e_max / max(e0, 1e-9) - 1.0)) if e0 < e_max else 1.0
    for (sa, ea), (sb, eb) in zip(pts, pts[1:]):
        if ea < half <= eb:
            f = (half - ea) / (eb - ea)
            return e_max, float(2 ** (math.log2(sa) + f * (math.log2(sb) - math.log2(sa))))
    return e_max, float(pts[-1][0])          # never reached half: as large as measured
