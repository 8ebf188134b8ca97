"""The component measurements issue 23 asks of a lent GPU, beside the cost model's assumption for
each: memory-bound kernels (eager and torch.compile, forward and backward), FP8 GEMMs with and
without their casts, and the kernel launch floor (eager and CUDA graphs). Fused attention by head
dimension and sequence, and GEMMs by shape, are measured by `planner profile` (its cluster file's
``gpu.attention_table`` and ``measured.matmul``); this script measures what the profile does not.

    python bench/device_curves.py [--quick] [--no-compile] [--json OUT]

On a GPU (bf16, the TE layer's GEMM shapes of ``costmodel.fp8.TE_LAYER_GEMMS``) it is the device
check's second step (``bench/device_check.sh``); on a CPU it runs the same code at small sizes in
fp32, without FP8 or CUDA graphs (the test suite runs it so, ``tests/test_device_curves.py``).
Nothing here changes the cost model: each row prints the measured figure next to the model's, for
the session that reads them to replace an assumption with a measurement (and say so).

Definitions (what each figure is):

* memory-bound fraction: the bytes a kernel must move at least (each input read once, each output
  written once) over its time, divided by the device's copy bandwidth measured here (read + write
  of a large buffer, as `planner profile` measures HBM). The model's figures are
  ``costmodel.compute.MEMORY_BOUND_FRACTION`` (fused, eager, compiled; forward, backward).
* FP8 speed-up: bf16 ``a @ b`` time over ``torch._scaled_mm`` time (E4M3, per-tensor scales) on
  the same shape, the GEMMs alone and with the casts of both inputs (amax, scale, cast: what
  current scaling does per GEMM). The model's figure for the TE layer's GEMMs alone is
  ``costmodel.fp8.layer_gemm_speedup`` on the shipped FP8 pair; NVIDIA's measurement on H200 is
  ``TE_MEASURED_GEMM_SPEEDUP``.
* launch floor: wall time per call of a one-element in-place add, eager, and per replayed kernel of
  a CUDA graph of 100 of them: the figures ``costmodel.host`` prices a layer's issue time with
  (``HOST_OP_S``, ``GRAPH_NODE_S``; measured so on an H200 in session 31).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiles.bench_matmul import time_op  # noqa: E402


def _ops(torch: Any) -> dict[str, tuple[Callable, Callable, int, int]]:
    """name -> (make inputs (tokens, hidden, dtype, device) -> tensors, function, input tensors
    read, output tensors written: the minimal traffic in units of tokens x hidden elements)."""
    F = torch.nn.functional

    def rmsnorm(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    def swiglu(a, b):
        return F.silu(a) * b

    def residual(a, b):
        return a + b

    def rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def two(t, h, dt, dev):
        return [torch.randn(t, h, device=dev, dtype=dt, requires_grad=True) for _ in range(2)]

    return {
        "rmsnorm": (lambda t, h, dt, dev: [torch.randn(t, h, device=dev, dtype=dt, requires_grad=True),
                                           torch.ones(h, device=dev, dtype=dt, requires_grad=True)], rmsnorm, 1, 1),
        "swiglu": (two, swiglu, 2, 1),
        "residual": (two, residual, 2, 1),
        "rope": (lambda t, h, dt, dev: [torch.randn(t, h, device=dev, dtype=dt, requires_grad=True),
                                        torch.randn(t, h, device=dev, dtype=dt), torch.randn(t, h, device=dev, dtype=dt)],
                 rope, 3, 1),
    }


def copy_bandwidth(torch: Any, dev: Any, nbytes: int, target_s: float) -> float:
    """Bytes per second of a large buffer copy, read + write (`planner profile`'s HBM figure)."""
    a = torch.empty(nbytes // 4, device=dev, dtype=torch.float32)
    b = torch.empty_like(a)
    t, _ = time_op(lambda: b.copy_(a), dev, target_s)
    return 2 * nbytes / t


def memory_bound(torch: Any, dev: Any, tokens: int, hidden: int, dt: Any, target_s: float, bw: float,
                 compile_: bool) -> list[dict]:
    """Each op's forward and backward fraction of the copy bandwidth, eager and (optionally) compiled."""
    esize = torch.tensor([], dtype=dt).element_size()
    rows = []
    for name, (make, fn, n_in, n_out) in _ops(torch).items():
        ins = make(tokens, hidden, dt, dev)
        unit = tokens * hidden * esize
        variants = [("eager", fn)]
        if compile_:
            variants.append(("compiled", torch.compile(fn)))
        for mode, f in variants:
            try:
                rows.append(_one_op(torch, dev, name, mode, f, ins, unit, n_in, n_out, target_s, bw))
            except Exception as e:       # e.g. torch.compile without a working Triton/compiler here
                rows.append({"op": name, "mode": mode, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return rows


def _one_op(torch: Any, dev: Any, name: str, mode: str, f: Callable, ins: list, unit: int, n_in: int, n_out: int,
            target_s: float, bw: float) -> dict:
    """One op's row of ``memory_bound``."""
    out = f(*ins)
    grad = torch.ones_like(out)
    needs = [x for x in ins if x.requires_grad]

    def fwd(f=f):
        with torch.no_grad():
            f(*ins)

    def fwd_bwd(f=f, grad=grad, needs=needs):
        torch.autograd.grad(f(*ins), needs, grad)
    fwd()          # compiled: the no-grad and the autograd graphs compile here, untimed
    fwd_bwd()
    t_f, _ = time_op(fwd, dev, target_s)
    t_fb, _ = time_op(fwd_bwd, dev, target_s)
    # backward traffic at least: the output gradient and the saved inputs read, one
    # gradient written per input that needs one
    bwd_bytes = unit * (1 + n_in + len([x for x in needs if x.dim() == 2]))
    # a residual add's backward is no kernel (autograd passes the gradient on): no figure
    has_bwd = name != "residual" and t_fb > t_f
    return {"op": name, "mode": mode, "fwd_fraction": round(unit * (n_in + n_out) / t_f / bw, 3),
            "bwd_fraction": round(bwd_bytes / (t_fb - t_f) / bw, 3) if has_bwd else None}


def fp8_gemms(torch: Any, dev: Any, shapes: list[tuple[int, int, int]], target_s: float) -> list[dict]:
    """bf16 against FP8 (E4M3, per-tensor scales) per shape, GEMM alone and with both inputs' casts."""
    f8 = torch.float8_e4m3fn
    fmax = torch.finfo(f8).max
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)       # (n, k): _scaled_mm wants b column-major

        def cast(x):
            scale = (fmax / x.abs().amax().float().clamp(min=1e-12))
            return (x.float() * scale).to(f8), scale.reciprocal()
        a8, sa = cast(a)
        b8, sb = cast(b)

        def mm8():
            torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        def mm8_cast():
            x, s1 = cast(a)
            y, s2 = cast(b)
            torch._scaled_mm(x, y.t(), scale_a=s1, scale_b=s2, out_dtype=torch.bfloat16)
        t16, _ = time_op(lambda: a @ b.t(), dev, target_s)
        t8, _ = time_op(mm8, dev, target_s)
        t8c, _ = time_op(mm8_cast, dev, target_s)
        rows.append({"m": m, "n": n, "k": k, "bf16_tflops": round(2 * m * n * k / t16 / 1e12, 1),
                     "fp8_tflops": round(2 * m * n * k / t8 / 1e12, 1), "speedup_gemm": round(t16 / t8, 3),
                     "speedup_with_casts": round(t16 / t8c, 3)})
    return rows


def launch_floor(torch: Any, dev: Any, target_s: float) -> dict:
    """Seconds per eager call of a one-element add, and per kernel replayed from a CUDA graph."""
    x = torch.zeros(1, device=dev)
    eager, _ = time_op(lambda: x.add_(1), dev, target_s, max_iters=100_000)
    out = {"eager_us_per_kernel": round(eager * 1e6, 2), "graph_us_per_kernel": None}
    if dev.type == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(100):
                x.add_(1)
        t, _ = time_op(g.replay, dev, target_s)
        out["graph_us_per_kernel"] = round(t / 100 * 1e6, 3)
    return out


def model_figures() -> dict:
    """What the cost model assumes for the same components."""
    from costmodel import fp8
    from costmodel.compute import MEMORY_BOUND_FRACTION
    from costmodel.files.clusters import load_cluster
    from costmodel.host import GRAPH_NODE_S, HOST_OP_S
    half = load_cluster("dgx-h100").gpu.matmul_half_size
    return {"memory_bound_fraction": {k: {"fwd": f, "bwd": b} for k, (f, b) in MEMORY_BOUND_FRACTION.items()},
            "fp8_te_layer_gemm_speedup": round(fp8.layer_gemm_speedup(fp8.FP8_GEMM_EFFICIENCY,
                                                                      fp8.FP8_HALF_SIZE_FACTOR, half), 3),
            "fp8_te_measured_speedup_h200": list(fp8.TE_MEASURED_GEMM_SPEEDUP),
            "launch_us_per_kernel": {"eager": HOST_OP_S * 1e6, "graph": GRAPH_NODE_S * 1e6}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and shorter timings")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    args = ap.parse_args(argv)
    import torch
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)       # one process stands for one device, as the profile
    target = 0.05 if args.quick else 0.2
    # tensors well past the caches (128 MiB on a GPU, 32 MiB on a CPU): HBM / DRAM traffic, not cache
    tokens, hidden = (16384, 4096) if cuda else (8192, 1024)
    dt = torch.bfloat16 if cuda else torch.float32
    bw = copy_bandwidth(torch, dev, (1 << 30) if cuda else (64 << 20), target)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
        "dtype": str(dt).removeprefix("torch."), "tokens": tokens, "hidden": hidden,
        "copy_gb_per_s": round(bw / 1e9, 1), "model": model_figures(),
    }

    def save() -> None:
        """Each part is written as it is measured: a run stopped at its time limit keeps what it had."""
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['device']} ({res['torch']}), {res['dtype']}, {tokens} x {hidden}; copy {res['copy_gb_per_s']} GB/s")
    # the quick parts first: torch.compile's first calls can take most of a short time limit
    res["launch"] = lf = launch_floor(torch, dev, target)
    save()
    ml = res["model"]["launch_us_per_kernel"]
    print(f"  launch floor: {lf['eager_us_per_kernel']} us per eager kernel (model {ml['eager']:.2f})"
          + (f", {lf['graph_us_per_kernel']} us per CUDA-graph kernel (model {ml['graph']:.2f})"
             if lf["graph_us_per_kernel"] is not None else ""))
    if cuda and hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability(0) >= (8, 9):
        from costmodel.fp8 import TE_LAYER_GEMMS
        shapes = list(TE_LAYER_GEMMS[:2] if args.quick else TE_LAYER_GEMMS)
        try:
            res["fp8"] = fp8_gemms(torch, dev, [tuple(s) for s in shapes], target)
        except Exception as e:       # a build without torch._scaled_mm on this GPU
            res["fp8_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        save()
    for r in res.get("fp8", []):
        print(f"  fp8 {r['m']}x{r['n']}x{r['k']}: x{r['speedup_gemm']} GEMM alone, x{r['speedup_with_casts']} with "
              f"casts (bf16 {r['bf16_tflops']}, fp8 {r['fp8_tflops']} TFLOP/s); model's TE layer "
              f"x{res['model']['fp8_te_layer_gemm_speedup']}, measured on H200 x{res['model']['fp8_te_measured_speedup_h200']}")
    res["memory_bound"] = memory_bound(torch, dev, tokens, hidden, dt, target, bw, not args.no_compile)
    save()
    m = res["model"]["memory_bound_fraction"]
    for r in res["memory_bound"]:
        if "error" in r:
            print(f"  {r['op']:9s} {r['mode']:8s} not measured: {r['error']}")
            continue
        ref = m["compiled" if r["mode"] == "compiled" else "eager"]
        print(f"  {r['op']:9s} {r['mode']:8s} fwd {r['fwd_fraction']:.2f} (model {ref['fwd']:.2f})  "
              f"bwd {r['bwd_fraction'] if r['bwd_fraction'] is not None else '-'} (model {ref['bwd']:.2f}); "
              f"model's fused {m['fused']['fwd']:.2f}/{m['fused']['bwd']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
