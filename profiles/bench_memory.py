"""Memory copy bandwidth: ``dst.copy_(src)`` over buffer sizes, HBM on a GPU, DRAM on a CPU.

Bandwidth counts both the read and the write (2 x bytes per copy), as STREAM's Copy and the
HBM datasheet figures do. Small buffers fit in cache (CPU L2/L3, GPU L2) and read high; the
figure a cluster file keeps is the one of the largest buffer (``sustained_bandwidth``).
"""
from __future__ import annotations

from typing import Any, Callable

from .bench_matmul import time_op


def copy_sizes(device_type: str, quick: bool) -> list[int]:
    mib = 2**20
    if device_type == "cuda":
        return [m * mib for m in ((64, 256, 1024) if quick else (16, 64, 256, 1024, 2048, 4096))]
    return [m * mib for m in ((4, 64) if quick else (1, 4, 16, 64, 256))]


def bench_copy(device: Any, sizes: list[int], target_s: float = 0.05,
               on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Rows ``{bytes, time_s, bandwidth_bytes_per_s, iters}``; one thread on a CPU (one process
    is one "GPU" of the ``cpu`` cluster)."""
    import torch
    dev = torch.device(device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    rows = []
    try:
        for nbytes in sizes:
            src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
            dst = torch.empty_like(src)
            t, iters = time_op(lambda src=src, dst=dst: dst.copy_(src), dev, target_s)
            row = {"bytes": nbytes, "time_s": t, "bandwidth_bytes_per_s": 2.0 * nbytes / t, "iters": iters}
            rows.append(row)
            if on_row:
                on_row(row)
            del src, dst
    finally:
        torch.set_num_threads(threads)
    return rows


def sustained_bandwidth(rows: list[dict]) -> float:
    """The copy bandwidth of the largest buffer (out of cache), bytes/s."""
    if not rows:
        raise ValueError("no copy measurements")
    return max(rows, key=lambda r: r["bytes"])["bandwidth_bytes_per_s"]
