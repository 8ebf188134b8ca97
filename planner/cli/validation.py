"""Holding the cost model against published runs: ``calibration/*.yaml`` -> a table of
case, published, predicted, error. ``planner validate --write costmodel/VALIDATION.md``
regenerates the committed table; tests assert the tolerances.

Each case states its model shape, cluster, GPU count, batch and parallel degrees; the
execution facts not in the table are set here from what the source's software did, once per
source, never per case:

* Megatron-LM runs of 2021-2022 (Narayanan et al., Korthikanti et al.) used fp16/bf16 mixed
  precision, Adam, and attention that writes the score matrix (FlashAttention came to
  Megatron-LM in 2023): ``attention_kernel: materialized``; GPT models there use dropout.
* torchtitan runs use fused SDPA (flash) attention, bf16 and AdamW.
* A micro-batch size the source does not give is 1 (Megatron's default), except on a trainer whose
  default is the whole per-rank batch in one pass (``default_micro_batch``: SageMaker model parallel).
* A case may name a cluster file (``calibration/clusters/*.yaml``, a path from the repository root)
  where its source states a network the catalog cluster lacks (``case_cluster``), and an
  ``attention_kernel`` where the run did not use a fused one.
* Every case is predicted with its own framework's profile (``costmodel.frameworks``): the
  ``framework`` field of ``calibration/published_runs_frameworks.yaml``, else the software the
  source names (Narayanan/Korthikanti: megatron; torchtitan); Meta's Llama 3 stack is none of the
  targets and is predicted with the neutral profile. Megatron-LM runs from 2023 on use
  Transformer Engine's fused attention; only the 2021-22 ones (``published_runs.yaml``) write the
  score matrix.
* FP8 rows (``dtype: fp8`` in the framework file; NeMo 24.07's FP8 table,
  ``calibration/published_runs_fp8.yaml``) are predicted with the framework's default FP8
  recipe (``costmodel.fp8.default_recipe``: Transformer Engine delayed scaling for NeMo on H100,
  torchao tensorwise for torchtitan) unless the case names one (``fp8_recipe``, or "rowwise" in
  its name); they form the FP8 section. A run whose files gather the weights in FP8 (Megatron-core's
  ``fp8_param_gather``, NeMo's ``fp8_params``) says so (``fp8_param_gather: true``, with the line
  that sets it in its ``assumed``): its data-parallel all-gather moves one byte per weight.
* NeMo 24.07 (assumed, as NeMo's recipes of that release set them): sequence parallelism with
  tp > 1, Transformer Engine fused attention, no recomputation, the distributed optimizer;
  ``virtual_stages`` is the interleaved schedule's vpp (``unpublished``: a source that implies the
  interleaved schedule without its count; priced at the default, the range over the counts).
  Nemotron's squared-ReLU MLP has the shape of a GELU one (two matrices, not gated).
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from costmodel.specs import ModelSpec, ParallelConfig, SpecError, Workload, stages_from_counts
from costmodel.memory import model_state_bytes
from costmodel.frameworks import FRAMEWORKS, as_pytorch_fsdp
from costmodel.layers import causal_attention_flops_per_token
from costmodel.training import estimate
from costmodel.files.clusters import load_cluster
from planner.plan import targets as T

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "calibration" / "published_runs.yaml"
HOLDOUT = ROOT / "calibration" / "holdout_runs.yaml"
FRAMEWORK_RUNS = ROOT / "calibration" / "published_runs_frameworks.yaml"
FP8_RUNS = ROOT / "calibration" / "published_runs_fp8.yaml"
MOE_RUNS = ROOT / "calibration" / "published_runs_moe.yaml"
MORE_RUNS = ROOT / "calibration" / "published_runs_more.yaml"


@dataclass
class Row:
    case: str
    metric: str
    published: float
    predicted: float
    source: str
    split: str = "calibration"
    framework: str = "generic"

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published


def _model(d: dict, name: str) -> ModelSpec:
    if "catalog" in d:
        from costmodel.catalog import get_model
        # the run's own router settings (the launch file's --moe-aux-loss-coeff), vocabulary (a run
        # that trained the catalog's layers with another tokenizer) and multi-token prediction layers (a
        # run without DeepSeek-V3's MTP module) over the catalog's; any other key is refused, not ignored
        allowed = ("router_aux_coeff", "router_balance", "vocab", "mtp_layers")
        unknown = sorted(set(d) - {"catalog", "seq_len", *allowed})
        if unknown:
            raise SpecError(f"{name}: model: {', '.join(unknown)} cannot be set over the catalog's "
                            f"{d['catalog']!r} (a record may set {', '.join(allowed)})")
        over = {k: d[k] for k in allowed if k in d}
        return dataclasses.replace(get_model(d["catalog"]), **over) if over else get_model(d["catalog"])
    fam = d.get("family", "gpt")
    base: dict[str, Any] = dict(name=name, layers=d["layers"], hidden=d["hidden"], heads=d["heads"],
                                ffn_hidden=d.get("ffn_hidden", 4 * d["hidden"]), vocab=d["vocab"])
    if str(fam).startswith("nemotron"):
        # squared-ReLU, not gated: the matrices of a GELU MLP; LayerNorm, RoPE, no biases
        base.update(family="nemotron", mlp="gelu", norm="layernorm", kv_heads=d.get("kv_heads", d["heads"]),
                    max_seq_len=max(8192, d.get("seq_len", 0)))
    elif fam == "gpt":
        base.update(family="gpt", mlp="gelu", norm="layernorm", positions="learned", tied_embeddings=True,
                    bias=True, dropout=True, max_seq_len=max(2048, d.get("seq_len", 2048)))
    else:
        base.update(family=fam, kv_heads=d.get("kv_heads", d["heads"]), max_seq_len=max(8192, d.get("seq_len", 0)))
    # what the record says of the block over its family's defaults (GLM-130B: a Llama-family block with LayerNorm,
    # biases, dropout and tied embeddings; SmolLM3: a Llama with tied embeddings)
    base.update({k: d[k] for k in MODEL_OVERRIDES if k in d})
    # a mixture of experts stated inline: its routed experts (expert width the FFN's unless stated), shared
    # experts and router
    base.update({k: d[k] for k in MOE_FIELDS if k in d})
    if d.get("num_experts") and "expert_ffn_hidden" not in d:
        base["expert_ffn_hidden"] = base["ffn_hidden"]
    unknown = sorted(set(d) - {"family", "layers", "hidden", "heads", "ffn_hidden", "vocab", "kv_heads",
                                *MODEL_OVERRIDES, *MOE_FIELDS, *MODEL_NOTES})
    if unknown:
        raise SpecError(f"{name}: model: {', '.join(unknown)} is not a field a record's model may state "
                        f"(it may state {', '.join(MODEL_OVERRIDES + MOE_FIELDS)} over its family's defaults)")
    return ModelSpec(**base)


# the block settings a record's ``model`` may state over its family's defaults (``_model``). Not the positions: the
# BLOOM records name ALiBi, which their family prices as learned positions and the megatron-deepspeed target, which
# prices their runs, refuses; its cost beside learned positions is nil (a bias added inside the fused softmax)
MODEL_OVERRIDES = ("mlp", "norm", "bias", "qkv_bias", "dropout", "tied_embeddings")
# a mixture of experts' fields a record may state inline (``ModelSpec``'s names)
MOE_FIELDS = ("num_experts", "top_k", "expert_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden",
              "router_aux_coeff")
# keys a record's model carries for the reader, never priced: the sequence (the workload's), a description of
# the block, and the BLOOM records' ALiBi positions (above)
MODEL_NOTES = ("seq_len", "variant", "positions")


# what a case's hardware note says when its machines are not the catalog cluster it names: lower
# power limits and HBM2e H100s (torchtitan's Grand Teton runs), half the inter-node links (Jean Zay's
# four Omni-Path links, GPT-NeoX's four HCAs per node)
_OTHER_HARDWARE = ("500 W", "lower TDP", "Omni-Path", "4 ConnectX", "HBM2e")


def hardware_matches(case: dict) -> bool:
    """Whether the run's machines are the catalog cluster it names (else reported apart, not fitted)."""
    note = str(case.get("hardware_note", ""))
    return not any(k in note for k in _OTHER_HARDWARE)


def framework_of(case: dict) -> str:
    """The software that produced a published figure (module docstring)."""
    if case.get("framework"):
        return str(case["framework"])
    src = case["source"]
    if "Korthikanti" in src or "Narayanan" in src or "Megatron" in src:
        return "megatron"
    if "torchtitan" in src:
        return "torchtitan"
    return "generic"


def case_cluster(case: dict):
    """The cluster a case ran on: a catalog name, or a cluster file under ``calibration/clusters/``
    (a path from the repository root) where the source states a network the catalog lacks."""
    name = str(case["cluster"])
    return load_cluster(str(ROOT / name) if name.endswith((".yaml", ".yml")) else name)


def case_inputs(case: dict) -> tuple[ModelSpec, Any, Workload, ParallelConfig, Any, str]:
    """What ``estimate`` is called with for a published case (module docstring): model, cluster,
    workload, parallel config, framework profile, and the framework's name."""
    md = case["model"]
    model = _model(md, case["name"])
    cluster = case_cluster(case).with_gpus(case["num_gpus"])
    par_d = dict(case["parallel"])
    if "virtual_stages" in par_d:
        v = par_d.pop("virtual_stages")
        # "unpublished": the source implies the interleaved schedule but not its count; priced at the
        # framework's default (no interleaving), the range over the counts (validation_cross._alternatives)
        if v != "unpublished" and v > 1:
            par_d.update(vpp=v, schedule="interleaved")
    fw = framework_of(case)
    if case.get("nemo_defaults") and par_d.get("tp", 1) > 1:
        par_d.setdefault("sp", True)
    megatron = fw == "megatron"
    # 2021-22 Megatron-LM wrote the score matrix; its runs are the ones without a framework field
    materialized = megatron and "framework" not in case
    dp = par_d.get("dp", 1) * par_d.get("cp", 1) // max(1, par_d.get("cp", 1))
    mb = par_d.pop("micro_batch") if "micro_batch" in par_d else default_micro_batch(case, dp)
    ga = max(1, case["global_batch"] // (dp * mb))
    # a ZeRO stage the source does not give: the framework's own (planner.plan.targets.default_zero: FSDP's
    # for torchtitan and Accelerate, the distributed optimizer / ZeRO-1 otherwise; DeepSpeed's pipeline
    # engine takes no higher)
    zero = par_d.pop("zero") if "zero" in par_d else T.default_zero(fw, par_d)
    par = ParallelConfig(micro_batch=mb, grad_accum=ga, zero=zero, **par_d)
    dtype = case.get("dtype") or ("fp16" if "fp16" in str(case.get("precision", "")) else "bf16")
    recipe = ""
    if dtype == "fp8":
        recipe = case.get("fp8_recipe") or ("rowwise" if "rowwise" in case["name"] else "")
    wl = Workload(global_batch=case["global_batch"], seq_len=md["seq_len"], dtype=dtype,
                  attention_kernel=case.get("attention_kernel") or ("materialized" if materialized else "flash"),
                  fp8_recipe=recipe, fp8_param_gather=bool(case.get("fp8_param_gather")))
    prof = FRAMEWORKS.get(fw, FRAMEWORKS["generic"])
    if materialized:
        # Megatron-LM of 2021-22 had no TP communication overlap (Transformer Engine's came in 2023)
        # nor the asynchronous input-gradient all-reduce of later Megatron-Core
        prof = dataclasses.replace(prof, tp_comm_overlap=False, tp_comm_overlap_backward=False)
    if fw == "torchtitan":
        # the published torchtitan runs (2024-08 .. 2025-06) called SDPA, FA2 first below SM100
        # (costmodel.attention "sdpa-torchtitan"); torchtitan 0.3.0, which the emitter writes for,
        # defaults to FlexAttention (the profile's "flex")
        prof = dataclasses.replace(prof, attention="sdpa-torchtitan")
        # and computed the loss over the whole micro-batch's logits: ChunkedLossWrapper came in June 2026
        # (torchtitan PR #3710/#3779); a record that ran it says so (``profile: {loss_chunks: 8}``)
        prof = dataclasses.replace(prof, loss_chunks=1)
    if not materialized and ran_async_tp(case.get("execution")):
        prof = dataclasses.replace(prof, tp_comm_overlap=True)      # the run used async TP
    if fw == "generic" and ran_pytorch_fsdp(case.get("execution")):
        # a PyTorch-native stack, eager, FSDP2's copies where it ran FSDP2 (frameworks.as_pytorch_fsdp)
        prof = as_pytorch_fsdp(prof, ran_fsdp2(case.get("execution")))
    if ran_compile(case.get("execution")):
        # the run compiled its model: priced as a launch file that turns compile on would be
        # (FrameworkProfile.with_switches: COMPILE_KERNEL_FACTOR on the kernel efficiency)
        prof = prof.with_switches(compile=True)
    if ran_cuda_graphs(case.get("execution")):
        prof = dataclasses.replace(prof, launch="graphs")        # the host replays captured graphs (costmodel.host)
    if ran_full_iteration_graphs(case.get("execution")):
        prof = dataclasses.replace(prof, nan_checks=False)       # Megatron refuses its NaN checks with them
    if any(k in str(case.get("execution", "")).lower() for k in ("dualpipe", "all-to-all overlap")):
        prof = dataclasses.replace(prof, ep_comm_overlap=True)      # DualPipe / Megatron's EP overlap
    if case.get("profile"):
        prof = dataclasses.replace(prof, **case["profile"])          # switches the run's files set otherwise
    if case.get("moe"):
        # how the run executed its MoE layers (costmodel.moe.MoeExecution), over the profile's
        prof = dataclasses.replace(prof, moe=dataclasses.replace(prof.moe, **case["moe"]))
    return model, cluster, wl, par, prof, fw


def ran_async_tp(execution) -> bool:
    """Whether a case's ``execution`` record says the run used async TP: the ``async_tp`` key of
    the mapping (``async_tp: false`` is a run without it), or, for a free-text record, the words
    "async TP" / "async_tp" not followed by a false value."""
    if isinstance(execution, dict):
        value = execution.get("async_tp", False)
        return value is True or str(value).strip().lower() in ("true", "on", "yes")
    text = str(execution or "").lower().replace("-", "_").replace(" ", "_")
    for mark in ("async_tp", "asynctp"):
        at = text.find(mark)
        if at >= 0:
            rest = text[at + len(mark):].lstrip(":=_'\"")
            return not rest.startswith(("false", "off", "no"))
    return False


def default_micro_batch(case: dict, dp: int) -> int:
    """The micro-batch an unpublished setting is priced at (the framework's default): 1 (Megatron's),
    except for a run whose trainer is SageMaker's model parallel library (SMP v1) without pipeline
    parallelism, where it is the per-rank batch, global batch / data-parallel ranks, in one pass.
    SMP's ``microbatches`` parameter: "int, default 1: The number of microbatches to perform
    pipelining over. 1 means no pipelining. Batch size must be divisible by the number of
    microbatches" (aws/sagemaker-python-sdk doc/api/training/smd_model_parallel_general.rst, table
    "Common Parameters"): the batch a rank's ``smp.step`` is given runs as one micro-batch unless a
    run sets more. DeepSpeed reads a config that gives only ``train_batch_size`` the same way
    (deepspeed/runtime/config.py ``_set_batch_related_parameters``: gradient_accumulation_steps = 1,
    train_micro_batch_size_per_gpu = train_batch // world_size). A script may still accumulate by
    hand; that is why the other micro-batches stay in the row's range (``validation_cross``)."""
    ex = case.get("execution")
    trainer = str(ex.get("trainer", "") if isinstance(ex, dict) else ex or "").lower()
    smp = "sagemaker model parallel" in trainer or "(smp)" in trainer
    if smp and case["parallel"].get("pp", 1) == 1 and dp > 0 and case["global_batch"] % dp == 0:
        return case["global_batch"] // dp
    return 1


def ran_pytorch_fsdp(execution) -> bool:
    """Whether a case's ``execution`` record names a PyTorch FSDP trainer ("PyTorch FSDP1",
    "PyTorch FSDP2 fully_shard"): a PyTorch-native stack (``FrameworkProfile.pytorch_native``)."""
    return "pytorch fsdp" in str(execution or "").lower()


def ran_fsdp2(execution) -> bool:
    """Whether a case's ``execution`` record names PyTorch's per-parameter FSDP ("FSDP2",
    "fully_shard"; FrameworkProfile.fsdp2_copies), not FSDP1's flat parameters."""
    text = str(execution or "").lower()
    return "fsdp2" in text or "fully_shard" in text


def ran_cuda_graphs(execution) -> bool:
    """Whether a case's ``execution`` record says the run replayed CUDA graphs over its whole
    iteration or its layers: the ``cuda_graphs`` key of the mapping, a text that is not "none",
    "off", "false" or "not stated" (MLPerf's NeMo runs: "full iteration (FULL_CUDA_GRAPH=1, ...)")."""
    if not isinstance(execution, dict) or "cuda_graphs" not in execution:
        return False
    value = execution["cuda_graphs"]
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return bool(text) and not text.startswith(("none", "off", "false", "no", "not"))


def ran_full_iteration_graphs(execution) -> bool:
    """Whether the run captured its whole iteration in one CUDA graph (``cuda_graphs`` says "full
    iteration" or names the scope ``full_iteration``): Megatron-LM then requires
    ``--no-check-for-nan-in-loss-and-grad`` (megatron/training/arguments.py at d98e8a64), so its NaN checks
    are off (``FrameworkProfile.nan_checks``)."""
    if not ran_cuda_graphs(execution):
        return False
    text = str(execution["cuda_graphs"]).lower()
    return "full iteration" in text or "full_iteration" in text


def ran_compile(execution) -> bool:
    """Whether a case's ``execution`` record says the run used ``torch.compile``: the ``compile``
    key of the mapping (true, or a text naming torch.compile such as "regional torch.compile";
    "not stated" and false values are not), or, for a free-text record, "torch.compile" /
    "compile: true"."""
    if isinstance(execution, dict):
        value = execution.get("compile", False)
        if value is True:
            return True
        text = str(value).strip().lower()
        return text in ("true", "on", "yes") or ("torch.compile" in text and not text.startswith("not"))
    text = str(execution or "").lower()
    return "torch.compile" in text or "compile: true" in text


def case_stages(case: dict):
    """A split the source does not give: one the case names (with how it was chosen), else None (the even one)."""
    return stages_from_counts(case["stages"]) if case.get("stages") else None


def case_rows(case: dict, split: str) -> list[Row]:
    model, cluster, wl, par, prof, fw = case_inputs(case)
    md = case["model"]
    stages = case_stages(case)
    if fw in FRAMEWORKS and fw != "generic":
        # priced only through a target that runs this layout (its split, its profile), else refused
        via, stages, why = target_for(fw, model, cluster, wl, par, stages)
        if not via:
            REFUSED[case["name"]] = why
            return []
        rec = T.record(via)
        assert isinstance(rec.table, T.TrainTarget), via      # target_for picks training targets only
        runs = rec.table.for_config(par).runs
        prof = _with_overrides(prof, FRAMEWORKS.get(runs, FRAMEWORKS[rec.profile]))
    est = estimate(model, cluster, wl, par, stages=stages, framework=prof)
    rep = case["reported"]
    rows = []
    if "tflops_per_gpu" in rep and rep.get("tflops_kind") in ("hardware", "model", "model-causal", None):
        pred = est.hardware_tflops_per_gpu if rep.get("tflops_kind") == "hardware" else est.model_tflops_per_gpu
        if rep.get("tflops_kind") == "model-causal":
            # Megatron-LM's count since 2025 (training.py num_floating_point_operations: "causal mask
            # (only half of the mask is non-zero)"): half the paper convention's s x s attention, 12 s
            # score_dim FLOPs per token per layer forward and backward
            pred -= est.tokens_per_s_per_gpu * causal_attention_flops_per_token(model, md["seq_len"]) / 1e12
        rows.append(Row(case["name"], f"{rep.get('tflops_kind', 'model')} TFLOP/s per GPU", rep["tflops_per_gpu"],
                        pred, case["source"], split, fw))
    if "step_time_s" in rep:
        rows.append(Row(case["name"], "step time (s)", rep["step_time_s"], est.step_time_s, case["source"], split, fw))
    if "mfu" in rep:
        rows.append(Row(case["name"], "MFU", rep["mfu"], est.mfu, case["source"], split, fw))
    if "tokens_per_s_per_gpu" in rep:
        rows.append(Row(case["name"], "tokens/s per GPU", rep["tokens_per_s_per_gpu"], est.tokens_per_s_per_gpu,
                        case["source"], split, fw))
    return rows


# published runs no target accepts: case name -> the binding reason (planner validate prices a run
# only through a target that runs its layout: planner.plan.targets.targets_running)
REFUSED: dict[str, str] = {}


def target_for(fw: str, model, cluster, wl, par, given=None):
    """The first target that runs this published layout of framework ``fw``, with the stage split
    it places (``given``: the split the case names): ``(target, stages, "")``, or ``("", None,
    the binding reason)``."""
    from costmodel.specs import default_stages
    from planner.plan.planfile import Plan
    reasons = []
    for rec in T.records("train"):
        assert isinstance(rec.table, T.TrainTarget), rec.name
        if not rec.planned or fw not in (rec.profile, T.PUBLISHED_AS.get(rec.profile), rec.table.for_config(par).runs):
            continue
        stages = tuple(given) if given else default_stages(model.layers, par.pp)
        if not given and rec.table.split == "partition" and par.pp > 1:
            splits = T.partition_splits(rec.name, model, par.pp)
            if splits:
                stages = stages_from_counts(list(next(iter(splits))))
        plan = Plan(model=model, cluster=cluster, workload=wl, parallel=par, stages=stages, target=rec.name)
        got = T.problems(rec.name, plan)
        if not got:
            return rec.name, stages, ""
        reasons.append(got[0])
    return "", None, "; ".join(reasons) or f"no target is priced with {fw}"


def _with_overrides(case_prof, target_prof):
    """The accepting target's profile, keeping what the case's execution notes changed (TP overlap
    of 2021-22 Megatron, async TP, DualPipe) relative to the framework's profile."""
    base = FRAMEWORKS.get(case_prof.name.split("+")[0])     # "torchtitan+compile": its switches priced
    if base is None or target_prof.name == case_prof.name:
        return case_prof
    changed = {f.name: getattr(case_prof, f.name) for f in dataclasses.fields(case_prof)
               if f.name != "name" and getattr(case_prof, f.name) != getattr(base, f.name)}
    return dataclasses.replace(target_prof, **changed)


def memory_rows(ref: dict) -> list[Row]:
    rows = []
    for key, zero in (("no_zero", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)):
        sb = model_state_bytes(float(ref["params"]), int(ref["dp"]), zero, dtype="fp16", optimizer="adam")
        rows.append(Row(f"{ref['name']} {key}", "model states (GB)", ref["reported_gb"][key], sb.total / 1e9,
                        ref["source"], "memory"))
    return rows


def all_cases(include_holdout: bool = True) -> list[tuple[dict, str]]:
    """Every published training case on file with its split (the section it is tabled in):
    calibration, frameworks / fp8 (``-hardware`` when its machines are not the catalog cluster),
    moe, holdout. Duplicates of another file's run are skipped; MoE cases on a cluster the catalog
    lacks are listed in ``moe_rows.pending``."""
    with open(CALIBRATION) as f:
        cal = yaml.safe_load(f)
    out: list[tuple[dict, str]] = [(c, "calibration") for c in cal["cases"]]
    if FRAMEWORK_RUNS.exists():
        with open(FRAMEWORK_RUNS) as f:
            fwk = yaml.safe_load(f) or {}
        for c in fwk.get("cases", []):
            if "duplicate" in str(c.get("note", "")) or "same run as" in str(c.get("note", "")):
                continue
            kind = "fp8" if c.get("dtype") == "fp8" else "frameworks"
            out.append((c, kind if hardware_matches(c) else kind + "-hardware"))
    if MORE_RUNS.exists():
        with open(MORE_RUNS) as f:
            more = yaml.safe_load(f) or {}
        # ``fit: false``: a run on a stack that is neither PyTorch nor any target's (PaddlePaddle; JAX/XLA): priced
        # with the generic profile and reported, never fitted (the file's header says why)
        out += [(c, ("more" if c.get("fit", True) else "more-unfitted") if hardware_matches(c) else "frameworks-hardware")
                for c in more.get("cases", [])]
    if FP8_RUNS.exists():
        # NeMo 24.07's FP8 table: Megatron with NeMo's defaults (module docstring), FP8 with the
        # framework's default recipe
        with open(FP8_RUNS) as f:
            data = yaml.safe_load(f) or {}
        out += [(dict(c, framework="megatron", dtype="fp8", nemo_defaults=True), "fp8") for c in data.get("cases", [])]
    moe_rows.pending = []
    if MOE_RUNS.exists():
        from costmodel.files.clusters import cluster_names
        with open(MOE_RUNS) as f:
            data = yaml.safe_load(f) or {}
        for c in data.get("cases", []):
            if c["cluster"] not in cluster_names():
                moe_rows.pending.append(f"{c['name']}: cluster {c['cluster']} is not in the catalog")
            else:
                out.append((c, "moe-fit" if c.get("fit") else "moe"))
    if include_holdout and HOLDOUT.exists():
        with open(HOLDOUT) as f:
            hold = yaml.safe_load(f) or {}
        out += [(c, "holdout") for c in hold.get("cases", [])]
    return out


def all_rows(include_holdout: bool = True) -> list[Row]:
    with open(CALIBRATION) as f:
        cal = yaml.safe_load(f)
    rows: list[Row] = []
    for c, split in all_cases(include_holdout):
        if split != "calibration" and not any(r.split == "memory" for r in rows):
            for r in cal.get("memory_references", []):
                rows += memory_rows(r)
        if not split.startswith("moe"):
            rows += case_rows(c, split)
            continue
        try:
            rows += case_rows(c, split)
        except SpecError as e:
            moe_rows.pending.append(f"{c['name']}: {e}")
    return rows


def fp8_rows() -> list[Row]:
    """The FP8 rows of NeMo 24.07's table (``calibration/published_runs_fp8.yaml``)."""
    return [r for r in all_rows(include_holdout=False) if r.split == "fp8" and "nemo2407" in r.case]


def moe_rows() -> list[Row]:
    """The MoE runs (``calibration/published_runs_moe.yaml``). A case on a cluster the catalog
    does not have yet is listed in ``moe_rows.pending``, not predicted."""
    return [r for r in all_rows(include_holdout=False) if r.split in ("moe", "moe-fit")]


moe_rows.pending = []


def markdown(rows: list[Row]) -> str:
    out = ["# Cost-model validation (in-sample)", "",
           "**In-sample:** the fitted constants (`costmodel/fitted.py`) were chosen on many of these runs, so these",
           "tables measure the fit's memory as much as the model. The out-of-source error, each recipe family",
           "predicted with constants refitted without it, is in `docs/validation.md`",
           "(`planner validate --cross`).", "",
           "Regenerate with `make validation` (`planner validate --write costmodel/VALIDATION.md`).",
           "Predicted by `costmodel.training.estimate` with the catalog cluster; the execution facts each",
           "source's software implies are set once per source in `planner/cli/validation.py`.", ""]
    out += table_sections(rows, (("calibration", "Training runs (calibration set, calibration/published_runs.yaml)"),
                                 ("frameworks", "Training runs by framework (calibration/published_runs_frameworks.yaml, "
                                                "bf16/fp16)"),
                                 ("fp8", "FP8 training runs (NeMo 24.07, calibration/published_runs_fp8.yaml; "
                                         "torchtitan Float8 on catalog hardware)"),
                                 ("fp8-hardware", "FP8 training runs on machines other than the catalog cluster "
                                                  "(reported, not fitted)"),
                                 ("frameworks-hardware", "Training runs on machines other than the catalog cluster "
                                                         "(reported, not fitted: see each case's hardware_note)"),
                                 ("more", "Training runs from other public sources (calibration/published_runs_more.yaml; "
                                          "the shipped constants are fitted on them too: their out-of-source errors "
                                          "are docs/validation.md's)"),
                                 ("more-unfitted", "Training runs on stacks that are neither PyTorch nor a target's "
                                                   "(calibration/published_runs_more.yaml, fit: false; reported, never "
                                                   "fitted)"),
                                 ("moe", "Mixture-of-experts training runs (calibration/published_runs_moe.yaml; "
                                         "out of source: no constant was chosen on them)"),
                                 ("moe-fit", "Mixture-of-experts runs that chose a constant (the load factors of "
                                             "costmodel/moe.py, bench/fit_moe_imbalance.py)"),
                                 ("holdout", "Training runs first held out (calibration/holdout_runs.yaml; the "
                                             "shipped constants are now fitted on them too, so this table is "
                                             "in-sample: their out-of-source errors are docs/validation.md's)"),
                                 ("memory", "ZeRO model-state memory (Rajbhandari et al., SC'20, Fig. 1)")))
    if moe_rows.pending:
        out += ["MoE runs not predicted yet: " + "; ".join(moe_rows.pending) + ".", ""]
    if REFUSED:
        out += ["## Runs no target accepts (not priced)", "",
                "A published run is priced only through a target that runs its layout "
                "(`planner.plan.targets`); these are refused, each with the binding reason.", "",
                "| case | reason |", "|---|---|"]
        out += [f"| {name} | {why} |" for name, why in sorted(REFUSED.items())] + [""]
    out += by_framework(rows)
    return "\n".join(out) + "\n"


def by_framework(rows: list[Row]) -> list[str]:
    """Markdown lines: median and largest error of each framework's figures (training runs)."""
    sel = [r for r in rows if r.split in ("calibration", "frameworks", "fp8", "more", "more-unfitted", "moe", "holdout")]
    out = ["## Error by framework", "",
           "Each framework's runs on catalog hardware (calibration, framework, FP8, MoE and holdout tables).", "",
           "| framework | figures | median error | largest error | profile |",
           "|---|---:|---:|---:|---|"]
    for fw in sorted({r.framework for r in sel}):
        errs = [abs(r.error) for r in sel if r.framework == fw]
        prof = FRAMEWORKS.get(fw)
        state = ("calibrated" if prof and prof.calibrated else "not fitted") if prof else "-"
        out.append(f"| {fw} | {len(errs)} | {statistics.median(errs) * 100:.1f}% | {max(errs) * 100:.1f}% | {state} |")
    return out + [""]


def table_sections(rows: list[Row], splits) -> list[str]:
    """Markdown lines: one table per (split, title) that has rows, with its median and largest error."""
    out: list[str] = []
    for split, title in splits:
        sel = [r for r in rows if r.split == split]
        if not sel:
            continue
        out += [f"## {title}", "", "| case | metric | published | predicted | error |", "|---|---|---:|---:|---:|"]
        for r in sel:
            out.append(f"| {r.case} | {r.metric} | {r.published:g} | {r.predicted:.4g} | {r.error * 100:+.1f}% |")
        errs = [abs(r.error) for r in sel]
        out += ["", f"Median absolute error {statistics.median(errs) * 100:.1f}%, "
                f"largest {max(errs) * 100:.1f}% over {len(sel)} figures.", ""]
    return out
