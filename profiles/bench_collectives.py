"""Collective benchmarks inside a running process group, and the alpha-beta fit per tier.

Owns: the group shapes a plan uses (``group_shapes``: a pair and the whole node inside one node,
a pair and the world across nodes), the message sizes, one timed measurement per (group, op,
size) (``run_collectives``, called on every rank), the nccl-tests bus-bandwidth convention
(``busbw_factor``), the compute/communication overlap measurement on GPUs, and the latency and
bandwidth fit (``fit_alpha_beta``).

Convention (NVIDIA/nccl-tests doc/PERFORMANCE.md): S is the total bytes of the operation (for
all-gather the output, for reduce-scatter the input), ``algbw = S / t`` and ``busbw = algbw x
factor`` with all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n, send/recv 1.
Send/recv is measured as nccl-tests' sendrecv: each of the pair sends S to the other at once.
The time of a measurement is the slowest rank's (nccl-tests ``-a 3``).

Latency model for the fit: ``t = hops(op, n) * alpha + S * factor / B``, where hops is the number
of sequential ring steps (all-reduce 2(n-1), all-gather/reduce-scatter/all-to-all n-1,
send/recv 1), alpha the per-step latency and B the asymptotic bus bandwidth of the tier.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def busbw_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def hops(op: str, n: int) -> int:
    if op == "all_reduce":
        return 2 * (n - 1)
    if op == "send_recv":
        return 1
    return n - 1


@dataclass(frozen=True)
class GroupShape:
    """A group of ranks measured together. ``table``: rows go into the cluster file's
    ``measured.collectives`` (one group per (tier, group_size)); other groups are report-only."""

    name: str
    tier: str              # intra | inter
    ranks: tuple[int, ...]
    table: bool = True
    note: str = ""

    @property
    def size(self) -> int:
        return len(self.ranks)


def group_shapes(node_of_rank: list[str], extra_pairs: list[tuple[int, str]] = ()) -> list[GroupShape]:
    """The groups a plan uses, each holding rank 0 (which therefore records every result).

    Inside the first node: a pair (0, 1) and the whole node (when larger than a pair). Across
    nodes: a pair (rank 0 and the first rank of the second node) and the world. ``extra_pairs``:
    ``(peer, label)`` pairs inside the node worth a separate measurement (for a PCIe box, one
    per topology level seen from GPU 0); report-only.
    """
    world = len(node_of_rank)
    nodes: dict[str, list[int]] = {}
    for r, n in enumerate(node_of_rank):
        nodes.setdefault(n, []).append(r)
    first = nodes[node_of_rank[0]]
    shapes: list[GroupShape] = []
    if len(first) >= 2:
        if len(first) > 2:
            shapes.append(GroupShape("pair", "intra", (first[0], first[1])))
        shapes.append(GroupShape("node", "intra", tuple(first)))
        for peer, label in extra_pairs:
            if peer in first and peer != first[1]:
                shapes.append(GroupShape(f"pair-{label}", "intra", (first[0], peer), table=False,
                                         note=f"GPU 0 and GPU {peer}: {label}"))
    if len(nodes) > 1:
        second = next(rs for n, rs in nodes.items() if n != node_of_rank[0])
        if world > 2:
            shapes.append(GroupShape("pair-x", "inter", (first[0], second[0])))
        shapes.append(GroupShape("world", "inter", tuple(range(world))))
    return shapes


def message_sizes(device_type: str, quick: bool, max_bytes: int | None = None) -> list[int]:
    """KB to 1 GiB by 4x on GPUs; on a CPU (gloo over loopback) up to 64 MiB, 4 MiB with quick."""
    if device_type == "cuda":
        lo, hi = (64 * KIB, 256 * MIB) if quick else (KIB, GIB)
    else:
        lo, hi = (4 * KIB, 4 * MIB) if quick else (4 * KIB, 64 * MIB)
    if max_bytes:
        hi = min(hi, max_bytes)
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def ops_for(shape: GroupShape) -> tuple[str, ...]:
    return OPS if shape.size == 2 else tuple(o for o in OPS if o != "send_recv")


def count_measurements(shapes: list[GroupShape], sizes: list[int]) -> int:
    return sum(len(ops_for(s)) * len(sizes) for s in shapes)


# --------------------------------------------------------------------------------------
# In-rank measurement
# --------------------------------------------------------------------------------------

class _Fault:
    """Test hook: ``PLANNER_PROFILE_FAULT='rank=1,after=3,mode=exit|hang'`` makes that rank die
    (exit code 17) or hang after that many measurements, to exercise the error paths."""

    def __init__(self, rank: int) -> None:
        spec = os.environ.get("PLANNER_PROFILE_FAULT", "")
        kv = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
        self.on = bool(kv) and int(kv.get("rank", -1)) == rank
        self.after = int(kv.get("after", 0))
        self.mode = kv.get("mode", "exit")

    def check(self, done: int) -> None:
        if self.on and done >= self.after:
            if self.mode == "hang":
                time.sleep(10**6)
            os._exit(17)


def _buffers(op: str, nbytes: int, n: int, dtype: Any, device: Any) -> tuple[int, Any, Any]:
    import torch
    esize = torch.empty((), dtype=dtype).element_size()
    elems = max(n, nbytes // esize // n * n)        # divisible by the group size
    if op == "all_gather":
        return elems * esize, torch.ones(elems // n, dtype=dtype, device=device), torch.empty(elems, dtype=dtype, device=device)
    if op == "reduce_scatter":
        return elems * esize, torch.ones(elems, dtype=dtype, device=device), torch.empty(elems // n, dtype=dtype, device=device)
    return elems * esize, torch.ones(elems, dtype=dtype, device=device), torch.empty(elems, dtype=dtype, device=device)


def _op_fn(op: str, inp: Any, out: Any, group: Any, peer: int) -> Callable[[], None]:
    import torch.distributed as dist
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp, group=group)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if op == "send_recv":
        def sendrecv() -> None:
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, peer, group),
                                           dist.P2POp(dist.irecv, out, peer, group)])
            for r in reqs:
                r.wait()
        return sendrecv
    raise ValueError(op)


def run_collectives(shapes: list[GroupShape], sizes: list[int], *, device: Any, target_s: float,
                    max_iters: int = 50, reps: int = 2, on_row: Callable[[dict], None] | None = None,
                    on_progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Measure every (group, op, size) on every rank of the world (collective: all ranks call it
    with the same arguments). Rows are returned on the group's first rank (rank 0)."""
    import warnings

    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float32
    groups = [dist.new_group(list(s.ranks)) if s.size < world else dist.group.WORLD for s in shapes]
    total = count_measurements(shapes, sizes)
    fault = _Fault(rank)
    done = 0
    rows: list[dict] = []
    sync = (lambda: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else (lambda: None)
    for shape, group in zip(shapes, groups):
        member = rank in shape.ranks
        for op in ops_for(shape):
            for nbytes in sizes:
                desc = f"{op} {_fmt(nbytes)} in {shape.name} {list(shape.ranks)}"
                fault.check(done)
                if on_progress:
                    on_progress(done, total, "begin " + desc)
                if member:
                    row = _measure_one(shape, group, op, nbytes, device, dtype, target_s, max_iters, sync, reps)
                    if rank == shape.ranks[0]:
                        rows.append(row)
                        if on_row:
                            on_row(row)
                done += 1
                if on_progress:
                    on_progress(done, total, "end " + desc)
    return rows


def _group_max(x: float, group: Any, device: Any) -> float:
    import torch
    import torch.distributed as dist
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _measure_one(shape: GroupShape, group: Any, op: str, nbytes: int, device: Any, dtype: Any,
                 target_s: float, max_iters: int, sync: Callable[[], None], reps: int) -> dict:
    import torch.distributed as dist
    n = shape.size
    rank = dist.get_rank()
    peer = shape.ranks[1] if rank == shape.ranks[0] else shape.ranks[0]
    actual, inp, out = _buffers(op, nbytes, n, dtype, device)
    fn = _op_fn(op, inp, out, group, peer)
    fn()                                   # warm-up (first use of a group connects it)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = _group_max(time.perf_counter() - t0, group, device)   # every rank picks the same count
    iters = int(min(max_iters, max(1, target_s / reps / max(one, 1e-7))))
    dt = float("inf")
    for _ in range(reps):                  # the fastest window: others were interrupted
        _group_max(0.0, group, device)     # a barrier of the group
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        dt = min(dt, _group_max((time.perf_counter() - t0) / iters, group, device))
    algbw = actual / dt
    return {"group": shape.name, "tier": shape.tier, "op": op, "group_size": n, "bytes": actual,
            "time_s": dt, "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": algbw * busbw_factor(op, n),
            "iters": iters, "ranks": " ".join(map(str, shape.ranks)), "table": shape.table}


def measure_overlap(shape: GroupShape, device: Any, nbytes: int = 256 * MIB, gemm: int = 8192) -> dict | None:
    """GPU only: how much a bf16 GEMM loop slows while all-reduces of ``nbytes`` run beside it
    (and how much the all-reduces slow). Collective over ``shape`` ranks; None elsewhere."""
    import torch
    import torch.distributed as dist
    if torch.device(device).type != "cuda":
        return None
    group = dist.new_group(list(shape.ranks)) if shape.size < dist.get_world_size() else None  # all ranks
    if dist.get_rank() not in shape.ranks:
        return None
    a = torch.randn(gemm, gemm, device=device, dtype=torch.bfloat16)
    b = torch.randn(gemm, gemm, device=device, dtype=torch.bfloat16)
    buf = torch.ones(nbytes // 4, device=device)

    def gemms(k: int) -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(k):
            torch.matmul(a, b)
        e1.record()
        return e0, e1

    gemms(2)
    dist.all_reduce(buf, group=group)
    torch.cuda.synchronize(device)
    e0, e1 = gemms(10)
    torch.cuda.synchronize(device)
    t_gemm = e0.elapsed_time(e1) / 10 / 1e3
    t0 = time.perf_counter()
    for _ in range(4):
        dist.all_reduce(buf, group=group)
    torch.cuda.synchronize(device)
    t_comm = (time.perf_counter() - t0) / 4
    k = max(4, int(4 * t_comm / t_gemm))      # as long as the four all-reduces
    dist.barrier(group=group)
    t0 = time.perf_counter()
    works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(4)]
    e0, e1 = gemms(k)
    for w in works:
        w.wait()
    torch.cuda.synchronize(device)
    t_both = time.perf_counter() - t0
    t_gemm_overlap = e0.elapsed_time(e1) / k / 1e3
    slow = _group_max(t_gemm_overlap / t_gemm - 1.0, group, device)
    return {"compute_slowdown": max(0.0, slow), "gemm_alone_s": t_gemm, "gemm_overlapped_s": t_gemm_overlap,
            "allreduce_alone_s": t_comm, "overlapped_total_s": t_both, "allreduce_bytes": nbytes,
            "gemm_size": gemm, "ranks": list(shape.ranks)}


def measure_overlap_cpu(shape: GroupShape, device: Any, nbytes: int = 8 * MIB, gemm: int = 256) -> dict | None:
    """CPU processes: what overlapping costs. ``k`` fp32 GEMMs (as long as four all-reduces of
    ``nbytes``) run while the all-reduces proceed asynchronously on gloo's thread; with the
    GEMMs alone taking ``Tg``, the all-reduces alone ``Tc`` and both together ``Tb``,
    ``compute_slowdown = (Tb - max(Tg, Tc)) / min(Tg, Tc)`` in [0, 1]: 0 when communication
    hides completely, 1 when it only time-shares the core (the cost model charges
    ``max(C, T) + s * min(C, T)`` for communication ``C`` overlapped with compute ``T``)."""
    import torch
    import torch.distributed as dist
    group = dist.new_group(list(shape.ranks)) if shape.size < dist.get_world_size() else None
    if dist.get_rank() not in shape.ranks:
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(gemm, gemm), torch.randn(gemm, gemm)
        buf = torch.ones(nbytes // 4)

        def gemms(k: int) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                torch.matmul(a, b)
            return time.perf_counter() - t0

        gemms(4)
        dist.all_reduce(buf, group=group)
        t_gemm = min(gemms(20) for _ in range(3)) / 20
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(4):
            dist.all_reduce(buf, group=group)
        t_comm = (time.perf_counter() - t0) / 4
        k = max(4, int(4 * t_comm / t_gemm))
        dist.barrier(group=group)
        t0 = time.perf_counter()
        works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(4)]
        t_g = gemms(k)
        for w in works:
            w.wait()
        t_both = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    tg, tc = k * t_gemm, 4 * t_comm
    s = (t_both - max(tg, tc)) / min(tg, tc)
    s = _group_max(min(1.0, max(0.0, s)), group, device)
    return {"compute_slowdown": s, "gemm_alone_s": t_gemm, "gemm_overlapped_s": t_g / k, "allreduce_alone_s": t_comm,
            "overlapped_total_s": t_both, "allreduce_bytes": nbytes, "gemm_size": gemm, "gemms": k,
            "ranks": list(shape.ranks), "definition": "(Tb - max(Tg, Tc)) / min(Tg, Tc)"}


def _fmt(nbytes: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{nbytes:.0f} B"


# --------------------------------------------------------------------------------------
# Fit
# --------------------------------------------------------------------------------------

@dataclass
class AlphaBeta:
    tier: str
    group: str
    op: str
    group_size: int
    alpha_s: float                 # per ring step
    bandwidth_bytes_per_s: float   # asymptotic bus bandwidth
    max_busbw_bytes_per_s: float
    points: int
    rms_rel_error: float

    def predict_s(self, nbytes: float) -> float:
        return (hops(self.op, self.group_size) * self.alpha_s
                + nbytes * busbw_factor(self.op, self.group_size) / self.bandwidth_bytes_per_s)

    def to_dict(self) -> dict:
        return asdict(self)


def fit_alpha_beta(rows: list[dict]) -> list[AlphaBeta]:
    """One fit per (tier, group, op): least squares of the relative error of
    ``t = hops * alpha + S * factor / B`` (so small and large messages count alike)."""
    import numpy as np
    keys = sorted({(r["tier"], r["group"], r["op"], r["group_size"]) for r in rows})
    fits = []
    for tier, group, op, n in keys:
        pts = [r for r in rows if (r["tier"], r["group"], r["op"], r["group_size"]) == (tier, group, op, n)]
        t = np.array([r["time_s"] for r in pts])
        x = np.array([r["bytes"] * busbw_factor(op, n) for r in pts])
        h = float(hops(op, n))
        max_bw = float(max(r["busbw_bytes_per_s"] for r in pts))
        a = np.stack([np.full_like(t, h) / t, x / t], axis=1)
        if len(pts) >= 2:
            (alpha, inv_b), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        else:
            alpha, inv_b = 0.0, 1.0 / max_bw
        if inv_b <= 0:                      # latency-bound everywhere: the best seen is the bandwidth
            inv_b = 1.0 / max_bw
            alpha = max(0.0, float(np.mean((t - x * inv_b) / h)))
        if alpha < 0:                       # refit the bandwidth alone through the origin
            alpha = 0.0
            inv_b = float(np.sum(x / t) / np.sum((x / t) ** 2))
        pred = h * alpha + x * inv_b
        err = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
        fits.append(AlphaBeta(tier=tier, group=group, op=op, group_size=n, alpha_s=float(alpha),
                              bandwidth_bytes_per_s=float(1.0 / inv_b), max_busbw_bytes_per_s=max_bw,
                              points=len(pts), rms_rel_error=err))
    return fits


def tier_fit(fits: list[AlphaBeta], tier: str, rows: list[dict]) -> AlphaBeta | None:
    """The fit that stands for a tier in the cluster file's link: all-reduce (the operation
    nccl-tests quotes) on the largest table group of that tier; another op if none."""
    table_groups = {r["group"] for r in rows if r.get("table", True)}
    cands = [f for f in fits if f.tier == tier and f.group in table_groups]
    if not cands:
        return None
    cands.sort(key=lambda f: (f.op != "all_reduce", -f.group_size, f.op))
    return cands[0]
