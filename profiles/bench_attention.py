"""Fused attention on this device: the fraction of peak PyTorch's SDPA kernels reach by head
dimension, sequence length, causal mask and direction (``GpuSpec.attention_table``).

Owns: ``attention_cases`` (what is measured where), ``bench_attention`` (times
``F.scaled_dot_product_attention`` forward, and forward + backward, per case) and
``attention_table`` (the rows a cluster file keeps, as fractions of the peak).

Which kernel: on a GPU each SDPA backend this PyTorch offers is forced in turn
(``torch.nn.attention.sdpa_kernel``): FLASH_ATTENTION, PyTorch's FlashAttention-2 build, as "fa2";
CUDNN_ATTENTION as "cudnn" -- the two kernels ``costmodel.attention.kernel_for`` names for PyTorch
code; a backend this GPU or build cannot run is left out (its published curve stays). On a CPU,
SDPA's default (its fused CPU kernel) is recorded as "fa2", the kernel the cost model prices a CPU
with. The measured cuDNN rows price Transformer Engine's fused attention too (the same cuDNN
kernels, through the cuDNN this PyTorch bundles). FlashAttention-3/4 are not PyTorch's: not measured.

FLOP convention of the kernel benchmarks (Dao-AILab/flash-attention
``benchmarks/benchmark_flash_attention.py``, as ``costmodel.attention``): forward ``4 b s^2 h d``,
halved when causal; backward 2.5 times the forward. The backward's time is the forward + backward
call's less the forward's. Shapes as the published curves': ``b s`` tokens per call and ``h d`` =
2048 on a GPU (16k tokens); 1024 tokens and ``h d`` = 256 on a CPU, in its own precision (fp32).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

from costmodel.attention import BACKWARD_FLOPS_OF_FORWARD

from .bench_matmul import DTYPE_NAMES, time_op


def attention_cases(device_type: str, quick: bool) -> dict:
    """What to measure on this kind of device: head dims, sequence lengths, tokens per call, the
    width h x d, and the precision."""
    if device_type == "cuda":
        return {"head_dims": (64, 128), "seqs": (1024, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384),
                "tokens": 16384, "width": 2048, "dtype": "bf16"}
    return {"head_dims": (64,), "seqs": (128, 512) if quick else (128, 256, 512, 1024),
            "tokens": 1024, "width": 256, "dtype": "fp32"}


def _backends(device_type: str) -> list[tuple[str, Any]]:
    """(kernel name, SDPA backend to force, or None for the default) for this device."""
    if device_type != "cuda":
        return [("fa2", None)]
    from torch.nn.attention import SDPBackend
    return [("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def _forced(backend: Any):
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel([backend])


def bench_attention(device: Any, quick: bool, target_s: float = 0.05,
                    on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Rows ``{kernel, direction, mask, head_dim, seq_len, dtype, flops, time_s}`` for each kernel
    this device runs, head dim, sequence length and mask, forward and backward."""
    import torch
    import torch.nn.functional as F
    dev = torch.device(device)
    cases = attention_cases(dev.type, quick)
    tdt = getattr(torch, DTYPE_NAMES[cases["dtype"]])
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)          # one process stands for one "GPU" (bench_matmul)
    rows: list[dict] = []
    try:
        for kernel, backend in _backends(dev.type):
            for hd in cases["head_dims"]:
                heads = max(1, cases["width"] // hd)
                for seq in cases["seqs"]:
                    b = max(1, cases["tokens"] // seq)
                    q, k, v = (torch.randn(b, heads, seq, hd, device=dev, dtype=tdt, requires_grad=True)
                               for _ in range(3))
                    grad = torch.ones(b, heads, seq, hd, device=dev, dtype=tdt)
                    for causal in (True, False):
                        def fwd(q=q, k=k, v=v, causal=causal):
                            with torch.no_grad():
                                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                        def fwd_bwd(q=q, k=k, v=v, causal=causal, grad=grad):
                            # autograd.grad: the gradients returned, not accumulated into .grad
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            torch.autograd.grad(out, (q, k, v), grad)
                        try:
                            with _forced(backend):
                                fwd_bwd()     # autograd's and the kernel's one-time set-up, not timed
                                t_f, _ = time_op(fwd, dev, target_s)
                                t_fb, _ = time_op(fwd_bwd, dev, target_s)
                        except RuntimeError:
                            # this backend cannot run here (the GPU, the build, the shape): its
                            # published curve stays; the next backend is tried
                            break
                        flops = 4.0 * b * seq * seq * heads * hd * (0.5 if causal else 1.0)
                        base = {"kernel": kernel, "mask": "causal" if causal else "none", "head_dim": hd,
                                "seq_len": seq, "dtype": cases["dtype"]}
                        new = [dict(base, direction="fwd", flops=flops, time_s=t_f)]
                        if t_fb > t_f:
                            new.append(dict(base, direction="bwd", flops=BACKWARD_FLOPS_OF_FORWARD * flops,
                                            time_s=t_fb - t_f))
                        for r in new:
                            rows.append(r)
                            if on_row:
                                on_row(r)
                    del q, k, v, grad
    finally:
        torch.set_num_threads(threads)
    return rows


def attention_table(rows: list[dict], peak_flops_per_s: Callable[[str], float | None]) -> list[list]:
    """The cluster file's ``attention_table`` rows ``[kernel, direction, mask, head_dim, seq_len,
    efficiency]``: achieved FLOP/s over the peak of the precision measured (None: no peak known, the
    row is left out), capped at 1 (a peak below an achieved rate is the peak's error, not a kernel
    above its hardware), the fastest of repeated cases."""
    best: dict[tuple, float] = {}
    for r in rows:
        peak = peak_flops_per_s(r["dtype"])
        if not peak or r["time_s"] <= 0:
            continue
        key = (r["kernel"], r["direction"], r["mask"], r["head_dim"], r["seq_len"])
        best[key] = max(best.get(key, 0.0), min(1.0, r["flops"] / r["time_s"] / peak))
    return [[*key, float(f"{eff:.4g}")] for key, eff in sorted(best.items()) if eff > 0]
