"""Units: the one place human units (GiB, GB/s, TFLOP/s) become SI units inside the code.

Inside the code every quantity is SI with its unit in the name (bytes, seconds, FLOP/s,
bytes/s). Files people write use human units (``memory_gib``, ``gb_per_s``, ``tflops``);
they are converted exactly once, where the file is read.
"""

KIB = 1024
MIB = 1024**2
GIB = 1024**3
KB = 1e3
MB = 1e6
GB = 1e9
TERA = 1e12
US = 1e-6
MS = 1e-3
NS_PER_S = 1e9          # nanoseconds per second (the solver's integer time unit)

# bytes per element for the dtypes the planner knows
DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "tf32": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
    "fp8": 1, "int8": 1, "int4": 0.5,
    # NVFP4 (training only): a 4-bit E2M1 value and one E4M3 scale byte per 16 values (costmodel.fp8.nvfp4)
    "nvfp4": 0.5 + 1 / 16,
}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype``; raises ValueError naming the known ones."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def gib(n_bytes: float) -> float:
    return n_bytes / GIB


def fmt_bytes(n_bytes: float) -> str:
    """Human form of a byte count, binary units (GiB), as GPU memory is quoted."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes:.0f} B"


def fmt_seconds(t_s: float) -> str:
    if t_s >= 1:
        return f"{t_s:.3f} s"
    if t_s >= 1e-3:
        return f"{t_s * 1e3:.2f} ms"
    return f"{t_s * 1e6:.1f} us"
