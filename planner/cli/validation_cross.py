"""``planner validate --cross``: the cost model's error on recipe families it was not fitted on.

For each recipe family (``planner.cli.validation_families``) in turn: refit every fitted constant
(``costmodel.fitted.FITTED``) on the published runs of the *other* families, predict the left-out
family's runs with the result, and record the error. A constant with no rows left falls back to
its prior (stated in ``costmodel/fitted.py``) and the row says so. The errors are then tabled by
family, framework, GPU generation, dense or MoE, and scale.

What is compared: tokens/s per GPU, one figure per run. A run that publishes tokens/s or a step
time is compared on it; one that publishes only TFLOP/s or MFU is converted to tokens/s with that
source's own FLOP formula (``source_flops_per_token``); the conversion is named on its row.

Unpublished settings: a case whose micro-batch or recompute policy the source does not give is
priced at the setting on file (the framework's default, ``planner.cli.validation``) and, beside
it, over the alternatives that fit in memory; the row shows that range. A published MFU whose
source names its formula but not whether the attention term counts the causal half or the full
square (``published_alternatives``) is the same kind of unpublished setting, on the published
side: the row's range runs over both counts and every configuration alternative.

The fit (``fit``): the constants of one group are chosen together on a grid by the least mean
absolute error of the rows that group reads (ties: the smaller largest error), in a fixed order:
the GPU curves' efficiency on Megatron's bf16/fp16 runs (its kernel efficiency is 1.0 by construction), then
torch.compile's factor on the ratio of each compiled run to its eager twin (``compile_pairs``; since stop 54), the
PyTorch sm_90 factor, each framework's kernel efficiency on its own bf16/fp16 runs, then the FP8 curve on the FP8 runs.
Constants without a grid are not refitted: the attention efficiency (from a kernel benchmark,
not from these runs) and the GEMM curves' half sizes (which end-to-end runs do not pin down: a
scan ran to the edge of its grid); each keeps its value unless its family is left out, then takes
its prior. Only runs on catalog hardware are fitted (the compile pairs aside: a ratio's hardware is its two runs'
own, so it cancels); MoE runs are
predicted but never fitted (their physics is issue 24's), and runs on other machines are
predicted and tabled apart.

Why the mean and not the median (stop 36): for a constant that scales every row's speed, the least mean
absolute error lands where as many rows are too fast as too slow (the median of the per-row ratios), so
one far-off row moves it no more than a near one, and every row counts. Until stop 36 the fit took the
least *median* absolute error, whose minimum over 15-16 rows is flat to a few hundredths of a point: one
new H100 row, itself 19% too fast, tipped the H100 curve from 0.77 to 0.79 (median |error| 5.67% ->
5.55%) while the mean error grew 8.6% -> 9.3% and the rows' median signed error +1.3% -> +3.3%
(docs/notes/stop-36).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from costmodel import ceilings, fitted, fp8, frameworks, layers, stage_cache
from costmodel.frameworks import COMPILE_KERNEL_FACTOR, FRAMEWORKS, curves_measured, sm90_factor_applies
from costmodel.specs import ParallelConfig, SpecError, low_precision
from costmodel.training import estimate
from costmodel.units import GIB
from planner.cli import validation, validation_memory
from planner.cli.targets_table import compact
from planner.cli.validation_families import family_of, generation, scale_bucket

FIT_SPLITS = ("calibration", "frameworks", "fp8", "more", "holdout")     # catalog hardware, dense
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")


@dataclass
class CrossCase:
    name: str
    family: str
    framework: str
    gen: str
    dtype: str
    moe: bool
    num_gpus: int
    split: str
    source: str
    inputs: tuple                 # model, cluster, workload, parallel, profile
    published: float              # tokens/s per GPU
    how: str                      # how the published figure was read
    alternatives: tuple[tuple[str, ParallelConfig], ...] = ()
    unpublished: tuple[str, ...] = ()
    stages: Any = None            # a pipeline split the case names (validation.case_stages), else the even one
    published_alts: tuple[tuple[str, float], ...] = ()   # the published figure under an unpublished FLOP count

    @property
    def fitted_on(self) -> bool:
        # NVFP4 runs are read by no fit: the recipe's constants come from kernel tables alone (costmodel.fp8)
        return self.split in FIT_SPLITS and not self.moe and self.dtype != "nvfp4"

    @property
    def catalog_hardware(self) -> bool:
        return not self.split.endswith("-hardware")


# --------------------------------------------------------------------------------------
# The published figure, as tokens/s per GPU
# --------------------------------------------------------------------------------------

def _megatron_model_flops_per_token(m: Any, s: int, causal: bool = False) -> float:
    """Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py, r0.8) per
    token: 12 l h^2 [(1 + g/a + s/h) + (ffn/h) x (1.5 if gated) + V / (2 l h)] (no recomputation,
    full causal square counted). For a GPT (ffn 4h, g = a) it is 72 l h^2 (1 + s/(6h) + V/(12 l h))."""
    h, l_ = m.hidden, m.layers
    gate = 1.5 if m.mlp in ("swiglu", "geglu", "gated") else 1.0
    g_over_a = (m.kv_heads or m.heads) / m.heads
    # MoE (every layer an MoE layer, as Megatron's formula of r0.8 counts it): the routed experts'
    # width times top-k in place of the dense MLP's
    ffn = (m.expert_ffn_hidden or m.ffn_hidden) * m.top_k if m.is_moe else m.ffn_hidden
    # Megatron-LM since 2025 counts half the s x s attention ("causal mask": tflops_kind model-causal),
    # and scales the attention by query_projection_size / hidden (kv_channels x heads: Qwen3's 128 x 32
    # over 2,048 is 2) in that same formula (training.py num_floating_point_operations)
    att = s / h / (2 if causal else 1)
    q_ratio = m.q_dim / h if causal else 1.0
    return 12 * l_ * h * h * ((1 + g_over_a + att) * q_ratio + (ffn / h) * gate + m.vocab / (2 * l_ * h))


def _narayanan_hardware_flops_per_token(m: Any, s: int) -> float:
    """Narayanan et al. SC'21 eq. 3 per token: 96 l h^2 (1 + s/(6h) + V/(16 l h)) (GPT, full
    recomputation counted)."""
    h, l_ = m.hidden, m.layers
    return 96 * l_ * h * h * (1 + s / (6 * h) + m.vocab / (16 * l_ * h))


def _six_n_flops_per_token(m: Any, s: int) -> float:
    """6 x parameters + 12 l h s (torchtitan's MFU formula; Meta's Llama 3 report does not print
    its own, and this one is assumed for it)."""
    return 6 * m.total_params() + 12 * m.layers * m.hidden * s


def _six_n_causal_flops_per_token(m: Any, s: int) -> float:
    """6 x parameters + 6 l h s: the same count with the attention term halved for the causal mask
    (the s x s products below the diagonal only; FlashAttention skips the masked blocks). Megatron-LM
    counts attention this way since 2025 (``_megatron_model_flops_per_token(causal=True)``: its s/h
    term halved); PaLM's Appendix B and torchtitan count the full square ("we follow the convention
    and do not account for sparsity in causal attention", torchtitan ``get_num_flop_per_token``)."""
    return 6 * m.total_params() + 6 * m.layers * m.hidden * s


def source_flops_per_token(case: dict, m: Any, kind: str) -> tuple[float, str]:
    """The FLOPs per token a source counted behind its TFLOP/s or MFU, and the formula's name."""
    s = case["model"]["seq_len"]
    src = case["source"]
    if kind == "hardware":
        return _narayanan_hardware_flops_per_token(m, s), "Narayanan eq. 3"
    if kind == "mfu":
        return _six_n_flops_per_token(m, s), "6N + 12lhs (assumed)"
    if kind == "model-causal":
        return _megatron_model_flops_per_token(m, s, causal=True), "Megatron's model FLOPs, causal"
    if "Megatron" in src or "NeMo" in src or case.get("framework") == "megatron" or "Korthikanti" in src:
        return _megatron_model_flops_per_token(m, s), "Megatron's model FLOPs"
    return _six_n_flops_per_token(m, s), "6N + 12lhs"


def published_tokens_per_s(case: dict, m: Any, peak_flops: float) -> tuple[float, str] | None:
    """The run's tokens/s per GPU and how it was read, or None when nothing comparable is published."""
    rep = case["reported"]
    n, tokens = case["num_gpus"], case["global_batch"] * case["model"]["seq_len"]
    if "tokens_per_s_per_gpu" in rep:
        return float(rep["tokens_per_s_per_gpu"]), "tokens/s"
    if "step_time_s" in rep:
        return tokens / (rep["step_time_s"] * n), "step time"
    kind = rep.get("tflops_kind")
    if "tflops_per_gpu" in rep and kind in ("hardware", "model", "model-causal"):
        if m.is_moe and (kind == "hardware" or m.attention == "mla" or m.shared_experts or m.first_dense_layers):
            return None                  # Megatron r0.8's formula counts neither MLA nor shared or dense layers
        f, name = source_flops_per_token(case, m, kind)
        return rep["tflops_per_gpu"] * 1e12 / f, f"{kind} TFLOP/s via {name}"
    if "mfu" in rep and not m.is_moe:
        f, name = source_flops_per_token(case, m, "mfu")
        return rep["mfu"] * peak_flops / f, f"MFU via {name}"
    return None


def published_alternatives(case: dict, m: Any, peak_flops: float) -> tuple[tuple[str, float], ...]:
    """The published tokens/s per GPU under a FLOP count the source does not state, beside the one on
    file. Only an MFU converted with the assumed 6N + 12lhs has one: Meta's Llama 3 report cites
    Chowdhery et al. (2023) for MFU (section 3.3.2, "BF16 Model FLOPs Utilization (MFU; Chowdhery et
    al. (2023))") and prints no formula, so whether its attention term is the full s x s square (PaLM's
    Appendix B, torchtitan's convention) or the causal half is not published. The causal count is the
    alternative; the full one stays on file (the cited formula as written), and neither is chosen by
    the error."""
    pub = published_tokens_per_s(case, m, peak_flops)
    if pub is None or not pub[1].startswith("MFU"):
        return ()
    s = case["model"]["seq_len"]
    return (("causal attention count", case["reported"]["mfu"] * peak_flops / _six_n_causal_flops_per_token(m, s)),)


def _alternatives(case: dict, par: ParallelConfig,
                  layers: int) -> tuple[tuple[str, ...], tuple[tuple[str, ParallelConfig], ...]]:
    """The settings a source does not publish, and the configurations they could have been: every
    micro-batch that divides the batch, every recompute policy and, where the source implies the
    interleaved schedule without its count (``virtual_stages: unpublished``), each count above 1 that
    divides a stage's ``layers`` as well as the default (no interleaving) the row is priced at."""
    given = case["parallel"]
    unpub = tuple(k for k, key in (("micro-batch", "micro_batch"), ("recompute", "recompute")) if key not in given)
    interleaved = given.get("virtual_stages") == "unpublished"
    if interleaved:
        unpub += ("virtual stages",)
    if not unpub:
        return (), ()
    dp = par.dp
    mbs = [b for b in MICRO_BATCHES if case["global_batch"] % (dp * b) == 0] if "micro-batch" in unpub else [par.micro_batch]
    rcs = list(RECOMPUTE) if "recompute" in unpub else [par.recompute]
    per_stage = layers // max(1, par.pp)
    vps = [par.vpp] + ([v for v in range(2, per_stage + 1) if per_stage % v == 0] if interleaved else [])
    out = []
    for b in mbs:
        for r in rcs:
            for v in vps:
                try:
                    alt = dataclasses.replace(par, micro_batch=b, grad_accum=case["global_batch"] // (dp * b),
                                              recompute=r, vpp=v, schedule="interleaved" if v > 1 else par.schedule)
                except (SpecError, ValueError, TypeError):
                    continue
                out.append((f"mb{b} {r}" + (f" vp{v}" if interleaved and v > 1 else ""), alt))
    return unpub, tuple(out)


def load_cases() -> tuple[list[CrossCase], list[str]]:
    """Every training case on file with one comparable figure; and the names skipped, with why."""
    cases, skipped = [], []
    for c, split in validation.all_cases(include_holdout=True):
        try:
            model, cluster, wl, par, prof, fw = validation.case_inputs(c)
        except SpecError as e:
            skipped.append(f"{c['name']}: {e}")
            continue
        gpu = cluster.groups[0].gpu
        pub = published_tokens_per_s(c, model, gpu.peak("bf16" if low_precision(wl.dtype) else wl.dtype))
        if pub is None:
            skipped.append(f"{c['name']}: no tokens/s, step time or convertible TFLOP/s published")
            continue
        unpub, alts = _alternatives(c, par, model.layers)
        pub_alts = published_alternatives(c, model, gpu.peak("bf16" if low_precision(wl.dtype) else wl.dtype))
        if pub_alts:
            unpub += ("FLOP count",)
        cases.append(CrossCase(name=c["name"], family=family_of(str(c["source"])), framework=fw,
                               gen=generation(gpu.name), dtype=wl.dtype, moe=model.is_moe, num_gpus=c["num_gpus"],
                               split=split, source=str(c["source"]), inputs=(model, cluster, wl, par, prof),
                               published=pub[0], how=pub[1], alternatives=alts, unpublished=unpub,
                               stages=validation.case_stages(c), published_alts=pub_alts))
    return cases, skipped


# --------------------------------------------------------------------------------------
# Constants in, predictions out
# --------------------------------------------------------------------------------------

def _clear_caches() -> None:
    layers.layer_cost.cache_clear()
    layers.ends_cost.cache_clear()
    stage_cache._shared_equal.cache_clear()
    stage_cache._stage_model.cache_clear()
    stage_cache._SHARED_BY_ID.clear()


def shipped_values() -> dict[str, float]:
    """Every fitted constant's value as the cost model ships it (read from its owner)."""
    from costmodel.files.clusters import load_cluster
    out = {"pytorch.sm90_factor": frameworks.PYTORCH_SM90_FACTOR, "compile.kernel_factor": COMPILE_KERNEL_FACTOR,
           "fp8.gemm_efficiency": fp8.FP8_GEMM_EFFICIENCY, "fp8.half_size_factor": fp8.FP8_HALF_SIZE_FACTOR}
    for gen, name in (("A100", "dgx-a100-80gb"), ("H100", "dgx-h100")):
        g = load_cluster(name).groups[0].gpu
        out[f"gpu.{gen}.matmul_efficiency"] = g.matmul_efficiency
        out[f"gpu.{gen}.matmul_half_size"] = g.matmul_half_size
    out["gpu.GB300.clock_factor"] = load_cluster("gb300-nvl72").groups[0].gpu.clock_factor
    for fw in ("torchtitan", "deepspeed", "accelerate"):
        out[f"framework.{fw}.kernel_efficiency"] = FRAMEWORKS[fw].kernel_efficiency
    missing = {c.name for c in fitted.FITTED} ^ set(out)
    assert not missing, f"fitted constants without a reader (or a reader without a record): {missing}"
    return out


@contextlib.contextmanager
def module_constants(values: dict[str, float]) -> Iterator[None]:
    """The cost model's module-level fitted constants set to ``values`` (restored on exit)."""
    old = (fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR, frameworks.PYTORCH_SM90_FACTOR)
    frameworks.PYTORCH_SM90_FACTOR = values["pytorch.sm90_factor"]
    fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR = values["fp8.gemm_efficiency"], values["fp8.half_size_factor"]
    _clear_caches()
    try:
        yield
    finally:
        fp8.FP8_GEMM_EFFICIENCY, fp8.FP8_HALF_SIZE_FACTOR, frameworks.PYTORCH_SM90_FACTOR = old
        _clear_caches()


# GPUs whose curve is another's: dgx-h200 and dgx-h800 extend dgx-h100; the A800 is the A100 die with its NVLink cut
# to 400 GB/s (its cluster files extend dgx-a100-80gb and keep its GPU curve)
CURVE_OF = {"H200": "H100", "H800": "H100", "A800": "A100"}


def compiled_profile(prof: Any) -> bool:
    """Whether a case's profile prices a compiled run (``validation.case_inputs`` gave it the switch:
    ``FrameworkProfile.with_switches`` names it ``base+compile``)."""
    return "compile" in prof.name.split("+")[1:]


def _specs(case: CrossCase, values: dict[str, float]) -> tuple:
    model, cluster, wl, par, prof = case.inputs
    gen = CURVE_OF.get(case.gen, case.gen)
    e, h = values.get(f"gpu.{gen}.matmul_efficiency"), values.get(f"gpu.{gen}.matmul_half_size")
    if e is not None and not cluster.matmul_table:
        groups = tuple(dataclasses.replace(g, gpu=dataclasses.replace(g.gpu, matmul_efficiency=e, matmul_half_size=h))
                       for g in cluster.groups)
        cluster = dataclasses.replace(cluster, groups=groups)
    f = values.get(f"gpu.{case.gen}.clock_factor")
    if f is not None:       # a measured table would price at the peak anyway (compute.gemm_rate)
        groups = tuple(dataclasses.replace(g, gpu=dataclasses.replace(g.gpu, clock_factor=f)) for g in cluster.groups)
        cluster = dataclasses.replace(cluster, groups=groups)
    k = values.get(f"framework.{case.framework}.kernel_efficiency")
    compiled = compiled_profile(prof)
    # a compiled run keeps its switch over the refitted value (validation.case_inputs), at the fold's compile factor
    cf = values.get("compile.kernel_factor", COMPILE_KERNEL_FACTOR)
    if k is not None:
        prof = dataclasses.replace(prof, kernel_efficiency=k * (cf if compiled else 1.0))
    elif compiled and cf != COMPILE_KERNEL_FACTOR:
        prof = dataclasses.replace(prof, kernel_efficiency=prof.kernel_efficiency / COMPILE_KERNEL_FACTOR * cf)
    return model, cluster, wl, par, prof


def predict(case: CrossCase, values: dict[str, float], par: ParallelConfig | None = None) -> tuple[float, bool]:
    """Predicted tokens/s per GPU (module constants already set) and whether it fits in memory."""
    model, cluster, wl, p0, prof = _specs(case, values)
    est = estimate(model, cluster, wl, par or p0, stages=case.stages if par is None else None, framework=prof)
    return est.tokens_per_s_per_gpu, est.fits


def _err(case: CrossCase, pred: float) -> float:
    return pred / case.published - 1.0


# --------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------

def _sm90_factor_applies(c: CrossCase) -> bool:
    """Whether the fitted ``pytorch.sm90_factor`` multiplies a case's kernel efficiency (``frameworks.sm90_factor_applies``)."""
    cluster = c.inputs[1]
    return sm90_factor_applies(c.inputs[4], cluster.groups[0].gpu.name, curves_measured(cluster))


def _rows_for(group: str, cases: list[CrossCase]) -> list[CrossCase]:
    fit = [c for c in cases if c.fitted_on]
    if group.startswith("gpu."):
        # the rows priced at a kernel efficiency of exactly 1.0 that nothing else multiplies (fitted.GPU_CURVE_ROWS):
        # no framework efficiency (Megatron's and the neutral profile's), no sm_90 factor, no compile factor
        gen = group.split(".")[1]
        return [c for c in fit if CURVE_OF.get(c.gen, c.gen) == gen and c.dtype != "fp8"
                and c.framework in ("megatron", "generic") and c.inputs[4].kernel_efficiency == 1.0
                and not _sm90_factor_applies(c) and not compiled_profile(c.inputs[4])]
    if group.startswith("framework."):
        fw = group.split(".")[1]
        return [c for c in fit if c.framework == fw and c.dtype != "fp8"]
    if group == "fp8":
        return [c for c in fit if c.dtype == "fp8"]
    if group == "pytorch":         # generic-framework PyTorch FSDP runs on sm_90+ (frameworks.kernel_efficiency_on)
        return [c for c in fit if c.framework == "generic" and c.dtype != "fp8" and _sm90_factor_applies(c)]
    raise KeyError(group)     # the compile group reads pairs, not rows (compile_pairs)


def _twin_key(c: CrossCase) -> tuple:
    """What a compiled run and its eager twin share: everything the estimate reads but the compile switch."""
    model, cluster, wl, par, prof = c.inputs
    return (dataclasses.replace(model, name="-"), cluster, wl, par, prof.name.split("+")[0], c.framework, c.dtype,
            c.family, c.stages)


def compile_pairs(cases: list[CrossCase]) -> list[tuple[CrossCase, CrossCase]]:
    """Each dense bf16/fp16 run priced compiled, with its eager twin (``_twin_key``), as ``(eager, compiled)``: what
    the compile factor's fit reads (``fitted.COMPILE_PAIR_ROWS``). A pair is read on any hardware (its two runs
    share it); runs that no fit reads (``fit: false`` families, MoE, NVFP4) are not paired."""
    ok = [c for c in cases if c.split.removesuffix("-hardware") in FIT_SPLITS and not c.moe and c.dtype in ("bf16", "fp16")]
    eager: dict[tuple, list[CrossCase]] = {}
    for c in ok:
        if not compiled_profile(c.inputs[4]):
            eager.setdefault(_twin_key(c), []).append(c)
    out = []
    for c in ok:
        if compiled_profile(c.inputs[4]):
            twins = eager.get(_twin_key(c), [])
            assert len(twins) <= 1, f"{c.name}: more than one eager twin {[t.name for t in twins]}"
            out += [(twins[0], c)] if twins else []
    return out


def _pair_error(eager: CrossCase, compiled: CrossCase, values: dict[str, float]) -> float:
    """How far the priced compiled-to-eager ratio is from the published one."""
    return (predict(compiled, values)[0] / predict(eager, values)[0]) / (compiled.published / eager.published) - 1.0


def _groups() -> list[tuple[str, list[fitted.FittedConstant]]]:
    """The fitted groups in fit order (GPU curves, compile, PyTorch sm_90, kernel efficiencies, FP8)."""
    by: dict[str, list[fitted.FittedConstant]] = {}
    for c in fitted.FITTED:
        if c.grid:
            by.setdefault(c.group or c.name.rsplit(".", 1)[0], []).append(c)
    # the GPU curves, the compile factor (on pairs' ratios, which the constants below it hardly move), the
    # PyTorch sm_90 factor (on generic-framework rows, so before the kernel efficiencies whose sm_90 rows it
    # multiplies), the kernel efficiencies, FP8
    rank = {"compile": 1, "pytorch": 2}
    order = lambda g: (0 if g.startswith("gpu.") else rank.get(g, 3 if g.startswith("framework.") else 4), g)  # noqa: E731
    return [(g, by[g]) for g in sorted(by, key=order)]


@dataclass
class FitResult:
    values: dict[str, float]
    prior: list[str] = field(default_factory=list)        # constants at their prior (no rows left)
    rows: dict[str, int] = field(default_factory=dict)     # group -> rows fitted on
    families: dict[str, list[str]] = field(default_factory=dict)   # group -> families of those rows


def _scan(rows: list[CrossCase], consts: list[fitted.FittedConstant], values: dict[str, float]) -> dict[str, float]:
    import itertools
    best = None
    for combo in itertools.product(*(c.grid for c in consts)):
        v = dict(values, **{c.name: x for c, x in zip(consts, combo)})
        if consts[0].group == "fp8" and not fp8.gemm_speedup_admissible(
                v["fp8.gemm_efficiency"], v["fp8.half_size_factor"], v["gpu.H100.matmul_half_size"]):
            continue      # contradicts TE's measured GEMM speed-up (costmodel.fp8.TE_MEASURED_GEMM_SPEEDUP)
        # module-level constants (FP8 curve, attention) are set for the estimate; the others ride on the specs
        with module_constants(v) if any(c.name.startswith(_MODULE_LEVEL) for c in consts) else contextlib.nullcontext():
            errs = [abs(_err(r, predict(r, v)[0])) for r in rows]
        key = (round(statistics.fmean(errs), 12), max(errs))
        if best is None or key < best[0]:
            best = (key, combo)
    assert best is not None, "an empty grid"
    return {c.name: x for c, x in zip(consts, best[1])}


def _scan_pairs(pairs: list[tuple[CrossCase, CrossCase]], consts: list[fitted.FittedConstant],
                values: dict[str, float]) -> dict[str, float]:
    """``_scan`` for a constant read on pairs' ratios (the compile factor): the least mean absolute ratio error
    (ties: the smaller largest)."""
    (const,) = consts
    best = None
    for x in const.grid:
        errs = [abs(_pair_error(e, c, dict(values, **{const.name: x}))) for e, c in pairs]
        key = (round(statistics.fmean(errs), 12), max(errs))
        if best is None or key < best[0]:
            best = (key, x)
    assert best is not None, "an empty grid"
    return {const.name: best[1]}


_FIT_MEMO: dict[tuple, dict[str, float]] = {}
_MODULE_LEVEL = ("fp8.", "pytorch.")


def fit(cases: list[CrossCase], leave_out: str | None = None) -> FitResult:
    """Every fitted constant refitted on ``cases`` without family ``leave_out``."""
    train = [c for c in cases if c.family != leave_out]
    values = shipped_values()
    res = FitResult(values=values)
    for c in fitted.FITTED:                   # not refitted (no grid): its value, or its prior when its family is out
        if not c.grid and leave_out in c.families:
            values[c.name] = c.prior
            res.prior.append(c.name)
    with module_constants(values):
        pooled: list[fitted.FittedConstant] = []
        for group, consts in _groups():
            if group == "fp8":
                continue
            if group.startswith("framework.") and not _rows_for(group, train) \
                    and all(c.prior_rule == "pooled" for c in consts):
                pooled += consts                  # after the others: its prior pools their fits
                continue
            _fit_group(group, consts, train, values, res)
            if group == "pytorch":            # the kernel efficiencies' sm_90 rows are priced with it
                frameworks.PYTORCH_SM90_FACTOR = values["pytorch.sm90_factor"]
                _clear_caches()
        fitted_here = {n: values[n] for g, cs in _groups() if g.startswith("framework.") and res.rows.get(g)
                       for n in (c.name for c in cs)}
        for c in pooled:
            group = c.name.rsplit(".", 1)[0]
            res.rows[group], res.families[group] = 0, []
            values[c.name] = fitted.pooled_prior(c, fitted_here)
            res.prior.append(c.name)
    with module_constants(values):           # the FP8 curve sits on the fitted BF16 ones
        _fit_group("fp8", [c for g, cs in _groups() if g == "fp8" for c in cs], train, values, res)
    return res


def _fit_group(group: str, consts: list[fitted.FittedConstant], train: list[CrossCase], values: dict[str, float],
               res: FitResult) -> None:
    if group == "compile":                    # read on pairs (compile_pairs): its rows are both runs of each
        pairs = compile_pairs(train)
        rows = [c for pair in pairs for c in pair]
        res.rows[group] = len(pairs)
    else:
        pairs, rows = [], _rows_for(group, train)
        res.rows[group] = len(rows)
    res.families[group] = sorted({r.family for r in rows})
    if not rows:
        for c in consts:
            values[c.name] = c.prior
            res.prior.append(c.name)
        return
    if group == "fp8":
        upstream = tuple(sorted((k, v) for k, v in values.items() if not k.startswith("fp8.")))
    else:                                     # the constants that are not refitted, and the GPU curves below a framework
        fixed = tuple(sorted((c.name, values[c.name]) for c in fitted.FITTED if not c.grid))
        below = (("gpu.", "compile.", "pytorch.") if group.startswith("framework.") else ("gpu.", "compile.")
                 if group == "pytorch" else ("gpu.", "pytorch.", "framework.") if group == "compile" else ())
        upstream = fixed + tuple(sorted((k, v) for k, v in values.items() if k.startswith(below))) if below else fixed
    key = (group, tuple(sorted(r.name for r in rows)), upstream)
    if key not in _FIT_MEMO:
        _FIT_MEMO[key] = _scan_pairs(pairs, consts, values) if group == "compile" else _scan(rows, consts, values)
    values.update(_FIT_MEMO[key])


# --------------------------------------------------------------------------------------
# Cross-validation
# --------------------------------------------------------------------------------------

# The baseline a cost model must beat: every run at a flat fraction of the GPU's dense peak for its
# precision (llm-analysis's default efficiency, 0.5), FLOPs per token 6N + 12 l h s. Stated before
# looking at any residual; it has nothing to fit.
BASELINE_MFU = 0.5


def baseline_tokens_per_s(case: CrossCase) -> float:
    model, cluster, wl, _, _ = case.inputs
    peak = cluster.groups[0].gpu.peak(wl.dtype)
    return BASELINE_MFU * peak / _six_n_flops_per_token(model, wl.seq_len)


@dataclass
class CrossRow:
    case: CrossCase
    predicted: float
    error: float                  # out of source, at the settings on file
    low: float                    # error range over the unpublished settings' alternatives that fit
    high: float
    in_sample: float              # the shipped model's error on the same figure
    priors: tuple[str, ...]       # constants that fell back to their prior for this family
    constant: float = 0.0         # the error of a flat BASELINE_MFU of peak (``baseline_tokens_per_s``)
    fits: bool = True             # the shipped model's memory count puts the run (which ran) within its GPUs

    @property
    def credited(self) -> float:
        """The smallest |error| any alternative gives (0 when the published figure is inside the range)."""
        if self.low <= 0 <= self.high:
            return 0.0
        return min(abs(self.low), abs(self.high), abs(self.error))


def _predict_rows(cases: list[CrossCase], values: dict[str, float], shipped: dict[str, float],
                  priors: tuple[str, ...]) -> list[CrossRow]:
    out = []
    with module_constants(values):
        preds = [predict(c, values)[0] for c in cases]
        ranges = []
        for c, p in zip(cases, preds):
            alts = []
            for _, par in c.alternatives:
                try:
                    alts.append(predict(c, values, par))
                except (SpecError, ValueError):         # a schedule the alternative cannot run
                    continue
            vals = [v for v, ok in alts if ok] or [p]
            # every prediction against every reading of the published figure (one, unless its FLOP count is unpublished)
            pubs = [c.published] + [q for _, q in c.published_alts]
            errs = [v / q - 1.0 for v in vals + [p] for q in pubs]
            ranges.append((min(errs), max(errs)))
    with module_constants(shipped):
        ins = [predict(c, shipped) for c in cases]
    for c, p, (lo, hi), (i, fits) in zip(cases, preds, ranges, ins):
        out.append(CrossRow(c, p, _err(c, p), lo, hi, _err(c, i), priors,
                            _err(c, baseline_tokens_per_s(c)), fits))
    return out


def over_capacity(rows: list[CrossRow], shipped: dict[str, float]) -> list[tuple[CrossRow, Any]]:
    """The published runs (each of which ran) that the shipped model's memory count puts over their GPUs'
    capacity, with that estimate (its peak, capacity and memory terms): where the memory model, or a record
    that misses a memory-saving setting the run used, would keep the planner from a layout that works."""
    out = []
    with module_constants(shipped):
        for r in rows:
            if r.fits:
                continue
            model, cluster, wl, par, prof = _specs(r.case, shipped)
            out.append((r, estimate(model, cluster, wl, par, stages=r.case.stages, framework=prof)))
    return out


def cross_validate(families: list[str] | None = None) -> dict:
    """Leave each family out in turn; returns ``{rows, fits, full, skipped}``."""
    cases, skipped = load_cases()
    fams = sorted({c.family for c in cases})
    if families:
        unknown = sorted(set(families) - set(fams))
        if unknown:
            from planner.plan.errors import UsageError
            raise UsageError(f"--families: unknown family {', '.join(unknown)}; known: {', '.join(fams)}")
        fams = [f for f in fams if f in families]
    shipped = shipped_values()
    full = fit(cases, None)
    rows: list[CrossRow] = []
    fits: dict[str, FitResult] = {}
    for fam in fams:
        res = fit(cases, fam)
        fits[fam] = res
        rows += _predict_rows([c for c in cases if c.family == fam], res.values, shipped, tuple(res.prior))
    return {"rows": rows, "fits": fits, "full": full, "shipped": shipped, "skipped": skipped}


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------

def case_ideal_step_s(case: CrossCase) -> float:
    """A validation case's step at 100% MFU (``costmodel.ceilings.problem_ideal_step_s``)."""
    from costmodel.ceilings import problem_ideal_step_s
    model, cluster, wl, par = case.inputs[:4]
    return problem_ideal_step_s(model, wl, par.world_size, cluster.groups[0].gpu)


def thin_case(case: CrossCase) -> bool:
    """Whether a validation case is a thin step (``costmodel.ceilings.is_thin``): its rows make the
    ``train-thin`` band, not ``train-dense``'s (``validation_bands``)."""
    from costmodel.ceilings import is_thin
    return is_thin(case_ideal_step_s(case))


def case_attention(case: CrossCase) -> str:
    """The attention implementation a validation case is priced with (``costmodel.frameworks.attention_impl``
    of its profile, layout and model family)."""
    from costmodel.frameworks import attention_impl
    model, _cluster, _wl, par, prof = case.inputs[:5]
    return attention_impl(prof, par, model.family)


def torch_cp_case(case: CrossCase) -> bool:
    """Whether a dense validation case runs PyTorch's ring attention (``costmodel.attention.torch_ring``)
    and is not a thin step: its rows make the ``train-torch-cp`` band, on whatever hardware it ran
    (``validation_bands``)."""
    from costmodel.attention import torch_ring
    return not case.moe and torch_ring(case_attention(case), case.inputs[3].cp) and not thin_case(case)


def cp_case(case: CrossCase) -> bool:
    """Whether a dense validation case runs context parallelism on a ring other than PyTorch's (Transformer
    Engine's) and is not a thin step: on catalog hardware its rows make the ``train-cp`` band
    (``validation_bands``), as ``torch_cp_case``'s make ``train-torch-cp``."""
    from costmodel.attention import library_ring
    return not case.moe and library_ring(case_attention(case), case.inputs[3].cp) and not thin_case(case)


def host_paced_case(case: CrossCase) -> bool:
    """Whether an MoE validation case's layers are host-paced (``costmodel.ceilings.is_host_paced`` of
    ``host_paced_share`` on its inputs): its rows make the ``train-moe-host`` band, not ``train-moe``'s
    (``validation_bands``)."""
    from costmodel.ceilings import host_paced_share, is_host_paced
    model, cluster, wl, par, prof = case.inputs[:5]
    return case.moe and is_host_paced(host_paced_share(model, cluster, wl, par, prof, stages=case.stages))


def cp_group(case: CrossCase) -> str:
    """A run's group by its context parallelism: none, PyTorch's ring, or the kernel library's own. Megatron's
    ring is Transformer Engine's whatever kernel its steps run (TE 1.x under Megatron falls back to flash-attn
    where cuDNN cannot take the heads: the Kwai and TSUBAME rows), so its runs say so, kernel apart."""
    from costmodel.attention import torch_ring
    cp, att = case.inputs[3].cp, case_attention(case)
    if cp <= 1:
        return "no context parallel"
    if torch_ring(att, cp):
        return "PyTorch's ring (torch CP)"
    if att == "te":
        return "Transformer Engine's ring"
    return f"Transformer Engine's ring, {att} kernel" if case.framework == "megatron" else f"{att} ring"


def cp_placement(case: CrossCase) -> str:
    """A context-parallel run's ring (``cp_group``) and whether the ring crosses NVLink domains: the CP group of
    the mesh the estimate prices (``costmodel.comm.DEFAULT_ORDER``, TP innermost, CP next) spans more than one
    node of the cluster's ``nvlink_gpus`` (``costmodel.comm.crosses_nodes``, the one rule the estimate uses)."""
    from costmodel.comm import DEFAULT_ORDER, crosses_nodes
    from costmodel.stage_terms import _degrees
    par, cluster = case.inputs[3], case.inputs[1]
    if par.cp <= 1:
        return "no context parallel"
    across = crosses_nodes(_degrees(par), tuple(DEFAULT_ORDER), "cp", cluster.groups[0].nvlink_gpus)
    return f"{cp_group(case)}, {'across nodes' if across else 'inside a node'}"


def ideal_step_buckets() -> tuple[tuple[float, str], ...]:
    """(upper end in seconds, label) of the ideal-step groups, smallest first: by decade from the
    thin-step threshold (``costmodel.ceilings.THIN_STEP_S``, which sets the ``train-thin`` band)."""
    from costmodel.ceilings import THIN_STEP_S
    t = THIN_STEP_S * 1e3
    return ((THIN_STEP_S, f"< {t:g} ms (thin)"), (10 * THIN_STEP_S, f"{t:g}-{10 * t:g} ms"),
            (100 * THIN_STEP_S, f"{10 * t:g}-{100 * t:g} ms"), (math.inf, f">= {100 * t:g} ms"))


def ideal_step_bucket(ideal_s: float) -> str:
    """The group of a run by the work it gives each GPU per step at peak
    (``costmodel.ceilings.problem_ideal_step_s``)."""
    return next(name for top, name in ideal_step_buckets() if ideal_s < top)


def headline_rows(rows: list[CrossRow]) -> list[CrossRow]:
    """The rows the headline counts: dense runs on catalog hardware, NVFP4's apart (``nvfp4_rows``)."""
    return [r for r in rows if r.case.catalog_hardware and not r.case.moe and r.case.dtype != "nvfp4"]


def nvfp4_rows(rows: list[CrossRow]) -> list[CrossRow]:
    """Dense NVFP4 runs on catalog hardware: reported apart, as MoE's are (the recipe's constants come from a kernel
    table, costmodel.fp8, and no run was fitted; a new recipe's error is its own, not the headline's)."""
    return [r for r in rows if r.case.catalog_hardware and not r.case.moe and r.case.dtype == "nvfp4"]


def _stats(rows: list[CrossRow], attr: str = "error") -> tuple[float, float]:
    e = [abs(getattr(r, attr)) for r in rows]
    return statistics.median(e), max(e)


def _group_table(rows: list[CrossRow], title: str, key, order: tuple[str, ...] = ()) -> list[str]:
    """One table of ``rows`` grouped by ``key``: groups named in ``order`` first, in that order, then
    the rest sorted."""
    out = [f"### By {title}", "", f"| {title} | runs | median out-of-source | largest | mean signed | "
                                  "median in-sample (shipped) | median credited | median flat 50% |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[str, list[CrossRow]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    for k in sorted(groups, key=lambda k: (order.index(k), "") if k in order else (len(order), k)):
        g = groups[k]
        med, big = _stats(g)
        out.append(f"| {k} | {len(g)} | {med * 100:.1f}% | {big * 100:.1f}% | "
                   f"{statistics.mean(r.error for r in g) * 100:+.1f}% | {_stats(g, 'in_sample')[0] * 100:.1f}% | "
                   f"{_stats(g, 'credited')[0] * 100:.1f}% | {_stats(g, 'constant')[0] * 100:.1f}% |")
    return out + [""]


def markdown(res: dict) -> str:
    rows = res["rows"]
    head = headline_rows(rows)
    moe = [r for r in rows if r.case.moe and r.case.catalog_hardware]
    other = [r for r in rows if not r.case.catalog_hardware]
    out = ["# Out-of-source validation", "",
           "The cost model's error on published runs it was not fitted on, by family, framework, GPU and scale.", "",
           "Regenerate with `make validation` (`planner validate --cross --write docs/validation.md`).",
           "Each recipe family is left out in turn: every fitted constant (`costmodel/fitted.py`) is refitted on",
           "the other families' runs and the left-out family is predicted with the result",
           "(`planner/cli/validation_cross.py` says how). Figures: tokens/s per GPU; a run that publishes",
           "only TFLOP/s or MFU is converted with its source's FLOP formula. Error = predicted / published - 1",
           "(positive: predicted too fast). \"In-sample\" is the shipped model on the same figure, fitted with",
           "every family in; \"credited\" is the smallest error any unpublished setting (micro-batch,",
           "recompute that fits in memory; the causal or full attention count behind a published MFU)",
           "gives; \"flat 50%\" is the baseline of every run at half the dense peak (6N + 12lhs FLOPs per",
           "token), which a cost model must beat.", ""]
    if head:
        med, big = _stats(head)
        out += [f"**Out of source, dense runs on catalog hardware: median {med * 100:.1f}%, largest "
                f"{big * 100:.1f}% over {len(head)} runs from {len({r.case.family for r in head})} families.** "
                f"In-sample (the shipped constants) on the same runs: median {_stats(head, 'in_sample')[0] * 100:.1f}%, "
                f"largest {_stats(head, 'in_sample')[1] * 100:.1f}%. A flat {BASELINE_MFU:.0%} of peak "
                f"(nothing fitted): median {_stats(head, 'constant')[0] * 100:.1f}%, largest "
                f"{_stats(head, 'constant')[1] * 100:.1f}%.", ""]
    if moe:
        med, big = _stats(moe)
        line = f"MoE, apart: median {med * 100:.1f}%, largest {big * 100:.1f}% over {len(moe)} runs"
        # the MoE constants (costmodel/moe.py: load factors, layer host time) were chosen on the runs of
        # the moe-fit split: out of source are the others
        oos = [r for r in moe if r.case.split != "moe-fit"]
        if oos and len(oos) < len(moe):
            m2, b2 = _stats(oos)
            sources = len({r.case.source.split(" @")[0].split(",")[0] for r in oos})
            line += (f"; out of source (no MoE constant chosen on them): median {m2 * 100:.1f}%, largest "
                     f"{b2 * 100:.1f}% over {len(oos)} runs from {sources} sources")
        out += [line + ".", ""]
    fp4 = nvfp4_rows(rows)
    if fp4:
        med, big = _stats(fp4)
        out += [f"NVFP4, apart (dense; the recipe's constants read from kernel tables, Transformer Engine's and "
                f"torchao's, none fitted on a run: costmodel/fp8.py): median {med * 100:.1f}%, largest "
                f"{big * 100:.1f}% over {len(fp4)} runs: "
                + ", ".join(f"{r.case.name} {r.error * 100:+.1f}%" for r in fp4) + ".", ""]
    if other:
        med, big = _stats(other)
        out += [f"Runs on machines other than the catalog's (not fitted; predicted on the catalog cluster they name, "
                f"or on the cluster file that describes their machine): median {med * 100:.1f}%, largest "
                f"{big * 100:.1f}% over {len(other)} runs.", ""]
    unfitted = [r for r in head if not r.case.fitted_on]
    if unfitted:
        # records with ``fit: false`` (validation.all_cases: split more-unfitted): in the headline, read by no fit
        fams = sorted({r.case.family for r in unfitted})
        med, big = _stats(unfitted)
        out += [f"Of the headline's runs, {len(unfitted)} are reported and read by no fit (`fit: false` in their "
                f"records: stacks that are neither PyTorch nor a target's, whose speed the GPU curves must not absorb; "
                f"families {', '.join(fams)}): median {med * 100:.1f}%, largest {big * 100:.1f}%.", ""]
    out += ["## Error by group (dense, catalog hardware)", ""]
    out += _group_table(head, "family", lambda r: r.case.family)
    out += _group_table(head, "framework", lambda r: r.case.framework)
    out += _group_table(head, "GPU generation", lambda r: r.case.gen)
    out += _group_table(head, "dtype", lambda r: r.case.dtype)
    out += _group_table(head, "scale", lambda r: scale_bucket(r.case.num_gpus))
    out += _group_table(head, "ideal step per GPU", lambda r: ideal_step_bucket(case_ideal_step_s(r.case)),
                        tuple(name for _, name in ideal_step_buckets()))
    out += _group_table([r for r in rows if r.case.catalog_hardware], "dense or MoE",
                        lambda r: "MoE" if r.case.moe else "dense, NVFP4" if r.case.dtype == "nvfp4" else "dense")
    if other:
        out += _group_table(other, "family (other hardware)", lambda r: r.case.family)
    dense_all = [r for r in rows if not r.case.moe]
    out += _group_table(dense_all, "context parallelism (dense, every machine)", lambda r: cp_group(r.case))
    cp_runs = [r for r in dense_all if r.case.inputs[3].cp > 1]
    out += _group_table(cp_runs, "context-parallel ring placement (dense, every machine)",
                        lambda r: cp_placement(r.case))
    thin_cp = [r for r in dense_all if r.case.inputs[3].cp > 1 and thin_case(r.case)]
    if thin_cp:
        out += [f"Of the context-parallel runs, {len(thin_cp)} are thin steps (the table \"By ideal step per GPU\"): "
                + ", ".join(f"{r.case.name} {r.error * 100:+.1f}%" for r in thin_cp) + ".", ""]
    over = over_capacity(rows, res["shipped"])
    out += ["## Memory: published runs priced over capacity", "",
            f"Every run here ran. The shipped model's memory count (`costmodel/memory.py`) puts {len(over)} of "
            f"{len(rows)} over their GPUs' usable memory: the model overcounts for them, or the record misses a "
            "memory-saving setting the run used. The planner would not choose such a layout. Peak stage, GiB:", "",
            "| run | family | GPUs | layout | priced peak | capacity | weights | grads | optimizer | activations | other |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r, est in over:
        mem = est.memory
        out.append(f"| {r.case.name} | {r.case.family} | {r.case.num_gpus} | {compact(r.case.inputs[3])} | "
                   f"{est.peak_bytes / GIB:.1f} | "
                   f"{est.capacity_bytes / GIB:.1f} | " + " | ".join(
                       f"{mem[k] / GIB:.1f}" for k in ("weights_bytes", "grads_bytes", "optimizer_bytes",
                                                        "activations_bytes", "other_bytes")) + " |")
    out += [""]
    out += validation_memory.markdown(validation_memory.memory_outcomes())
    out += ["## MFU ceilings (`costmodel/ceilings.py`)", "",
            "The best MFU published per GPU generation and precision among the dense runs here, by the causal "
            "count (published tokens/s x FLOPs per token less the causal mask's skipped half of attention / peak). "
            "A prediction above it, by the same count, is flagged unless a measured profile backs it.", "",
            "| GPU generation | precision | ceiling (causal count) | run |", "|---|---|---:|---|"]
    out += [f"| {arch} | {prec} | {v * 100:.1f}% | {src} |" for (arch, prec), (v, src) in ceilings.BEST_MEASURED_MFU.items()]
    out += ["", "## Fitted constants and their sources (`costmodel/fitted.py`)", "",
            "| constant | lives in | fitted on (families) | rows the fit reads | prior when none is left |",
            "|---|---|---|---|---|"]
    for c in fitted.FITTED:
        prior = "pooled" if c.prior_rule == "pooled" else f"{c.prior:g}"
        out.append(f"| {c.name} | {c.owner} | {', '.join(c.families)} | {c.rows} | {prior}: {c.prior_why} |")
    out += ["", "## Refitted constants per left-out family", "",
            "`shipped` is the value in the code; `all in` the refit on every family; a value in *italics* fell "
            "back to its prior (no rows left).", ""]
    names = [c.name for c in fitted.FITTED]
    out += ["| left out | " + " | ".join(n.replace("framework.", "").replace(".kernel_efficiency", " kernel")
                                         for n in names) + " |",
            "|---|" + "---:|" * len(names)]

    def row(label: str, fr: FitResult | None, vals: dict[str, float]) -> str:
        cells = [(f"*{vals[n]:g}*" if fr and n in fr.prior else f"{vals[n]:g}") for n in names]
        return f"| {label} | " + " | ".join(cells) + " |"

    out.append(row("shipped", None, res["shipped"]))
    out.append(row("all in", res["full"], res["full"].values))
    for fam, fr in res["fits"].items():
        out.append(row(fam, fr, fr.values))
    out += ["", "## Every run", "",
            "| run | family | framework | GPUs | published tok/s/GPU | read from | predicted | out-of-source | "
            "range (unpublished settings) | in-sample | constants at prior |",
            "|---|---|---|---:|---:|---|---:|---:|---|---:|---|"]
    for r in rows:
        c = r.case
        rng = (f"{r.low * 100:+.1f}% .. {r.high * 100:+.1f}% ({', '.join(c.unpublished)})" if c.unpublished else "-")
        pri = ", ".join(p.split(".")[1] if p.startswith(("gpu.", "framework.")) else p for p in sorted(set(r.priors)))
        out.append(f"| {c.name} | {c.family} | {c.framework} | {c.num_gpus} | {c.published:.4g} | {c.how} | "
                   f"{r.predicted:.4g} | {r.error * 100:+.1f}% | {rng} | {r.in_sample * 100:+.1f}% | {pri or '-'} |")
    if res["skipped"]:
        out += ["", "Not predicted: " + "; ".join(res["skipped"]) + "."]
    return "\n".join(out) + "\n"


def as_json(res: dict) -> dict:
    return {
        "rows": [{"case": r.case.name, "family": r.case.family, "framework": r.case.framework, "gpu": r.case.gen,
                  "dtype": r.case.dtype, "moe": r.case.moe, "num_gpus": r.case.num_gpus,
                  "catalog_hardware": r.case.catalog_hardware, "metric": "tokens/s per GPU",
                  "published": r.case.published, "read_from": r.case.how, "predicted": r.predicted,
                  "error": r.error, "error_low": r.low, "error_high": r.high, "unpublished": list(r.case.unpublished),
                  "in_sample_error": r.in_sample, "flat_50_error": r.constant, "fits": r.fits,
                  "at_prior": sorted(set(r.priors))} for r in res["rows"]],
        "fits": {fam: {"values": fr.values, "at_prior": fr.prior, "rows": fr.rows, "families": fr.families}
                 for fam, fr in res["fits"].items()},
        "all_in": {"values": res["full"].values, "rows": res["full"].rows, "families": res["full"].families},
        "shipped": res["shipped"], "skipped": res["skipped"]}


PAGE = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


def headline_block(page: Path = PAGE) -> str:
    """The out-of-source headline (the bold line, MoE, other hardware) and the by-family table of the
    committed page, for the README and docs/validation.md (``planner.cli.docs_pages`` can quote it:
    cheap, it reads the page ``make validation`` wrote, and that page's staleness is tested)."""
    lines = page.read_text().splitlines()
    head = [ln for ln in lines if ln.startswith(("**Out of source", "MoE, apart", "NVFP4, apart",
                                                 "Runs on machines other"))]
    i = lines.index("### By family")
    j = next(k for k in range(i + 2, len(lines)) if not lines[k].startswith("|") and k > i + 2)
    return "\n\n".join(head) + "\n\n" + "\n".join(lines[i + 2:j]) + "\n"
