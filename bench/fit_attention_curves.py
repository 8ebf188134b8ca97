"""Fit ``costmodel.attention``'s curve ``eta(s) = eta_max * s / (s + s0)`` to a measured attention table.

A profiled cluster file (``planner profile``: ``gpu.attention_table``, rows of kernel, direction, mask,
head dim, sequence, fraction of peak) is fitted per kernel, direction and mask: one ``s0`` shared by
the head dims (scanned from 20 to 3,000 tokens in steps of 10) and, per head dim, the ``eta_max`` of
least squared relative error at that ``s0``; the ``s0`` kept is the one whose largest relative error
over the points is smallest. This is how session 32 derived the catalog's FlashAttention-2 Hopper
curves from the H200's table (``bench/results/device-h200/cluster.yaml``);
``tests/test_attention.py`` runs it and checks the catalog's numbers are its output.

    python bench/fit_attention_curves.py [cluster.yaml] [--kernel fa2]
    python bench/fit_attention_curves.py --published fa1

``--published fa1`` fits the same curve to FlashAttention (version 1)'s published forward + backward
speeds (``PUBLISHED``), the catalog's ``("fa1", ...)`` curves; ``tests/test_attention.py`` checks them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

S0_GRID = range(20, 3000, 10)

# FlashAttention (version 1, the flash-attn 1.x package), forward + backward TFLOP/s at sequences
# 512, 1k, 2k, 4k, 8k and 16k (batch x sequence 16k tokens, hidden 2048), the orange "FlashAttention"
# bars of the FlashAttention-2 paper's benchmark figures (Dao, arXiv 2307.08691, Fig. 4 on A100 and
# Fig. 7 on H100), which Dao-AILab/flash-attention ships as assets/flash2_a100_fwd_bwd_benchmark.png
# ("A100 80GB SXM4") and assets/flash2_h100_fwd_bwd_benchmark.png ("H100 80GB SXM5") (read at commit
# 0251105a). FLOP convention of the repository's benchmarks/benchmark_flash_attention.py (forward
# 4 b s^2 h d, halved when causal; backward 2.5 times it), as the other published curves. Divided by
# the 16-bit dense peak of each GPU (A100 312, H100 SXM 989 TFLOP/s: the catalog's).
PUBLISHED_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
PUBLISHED_PEAK = {"ampere": 312.0, "hopper": 989.0}
PUBLISHED: dict[str, dict[str, dict[str, dict[int, tuple[float, ...]]]]] = {
    "fa1": {
        "ampere": {"none": {64: (91, 92, 104, 108, 110, 110), 128: (76, 72, 76, 80, 82, 83)},
                   "causal": {64: (58, 70, 77, 87, 92, 97), 128: (55, 62, 69, 76, 80, 83)}},
        "hopper": {"none": {64: (157, 159, 161, 161, 166, 168), 128: (127, 127, 128, 131, 137, 139)},
                   "causal": {64: (104, 123, 136, 138, 149, 156), 128: (98, 109, 108, 126, 135, 137)}},
    },
}


def fit_published(kernel: str) -> dict[tuple[str, str], tuple[float, int, dict[int, float]]]:
    """(architecture, mask) -> ``fit`` of ``PUBLISHED[kernel]`` as fractions of peak."""
    out = {}
    for arch, masks in PUBLISHED[kernel].items():
        for mask, dims in masks.items():
            pts = {hd: [(s, t / PUBLISHED_PEAK[arch]) for s, t in zip(PUBLISHED_SEQS, tf)] for hd, tf in dims.items()}
            out[(arch, mask)] = fit(pts)
    return out


def fit(points: dict[int, list[tuple[float, float]]]) -> tuple[float, int, dict[int, float]]:
    """(largest relative error, s0, {head dim: eta_max}) for ``points``: head dim -> [(seq, eta)]."""
    best: tuple[float, int, dict[int, float]] | None = None
    for s0 in S0_GRID:
        etas, worst = {}, 0.0
        for hd, pts in points.items():
            xs = [(s / (s + s0), e) for s, e in pts]
            # least squared relative error: minimize sum((a x / e - 1)^2)
            a = sum(x / e for x, e in xs) / sum((x / e) ** 2 for x, e in xs)
            etas[hd] = a
            worst = max(worst, max(abs(a * x / e - 1) for x, e in xs))
        if best is None or worst < best[0]:
            best = (worst, s0, etas)
    assert best is not None
    return best


def fit_table(rows, kernel: str) -> dict[tuple[str, str], tuple[float, int, dict[int, float]]]:
    """Every (direction, mask) of ``kernel`` in an attention table."""
    out = {}
    for direction in ("fwd", "bwd"):
        for mask in ("none", "causal"):
            pts: dict[int, list[tuple[float, float]]] = {}
            for k, d, m, hd, seq, eff in rows:
                if (k, d, m) == (kernel, direction, mask):
                    pts.setdefault(int(hd), []).append((float(seq), float(eff)))
            if pts:
                out[(direction, mask)] = fit(pts)
    return out


def main(argv: list[str] | None = None) -> int:
    from costmodel.files.clusters import load_cluster

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cluster", nargs="?", default=str(ROOT / "bench/results/device-h200/cluster.yaml"))
    ap.add_argument("--kernel", default="fa2", help="fa2 or cudnn (default fa2)")
    ap.add_argument("--published", choices=sorted(PUBLISHED), help="fit a kernel's published table instead")
    args = ap.parse_args(argv)
    if args.published:
        rows = {(f"{arch} fb", mask): f for (arch, mask), f in fit_published(args.published).items()}
        kernel = args.published
    else:
        gpu = load_cluster(args.cluster).groups[0].gpu
        rows, kernel = fit_table(gpu.attention_table, args.kernel), args.kernel
    for (curve, mask), (worst, s0, etas) in rows.items():
        per_dim = ", ".join(f"head dim {hd}: {eta:.3f}" for hd, eta in sorted(etas.items()))
        print(f"{kernel} {curve} {mask:6s} s0 {s0:5d}  eta_max {per_dim}  largest error {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
