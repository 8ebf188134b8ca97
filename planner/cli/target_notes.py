"""The target ``planner estimate`` prices a configuration for (the plan's own, or ``--target``: its
framework profile, and what that target cannot run of the configuration), and the exact
``planner plan --target T ...`` command that gives a plan a target runs."""
from __future__ import annotations

import argparse
from typing import Any

from costmodel.specs import MESH_AXES, default_stages
from planner.plan import targets as T
from planner.plan.errors import UsageError


def estimate_target(args: argparse.Namespace, model, cluster, wl, par, stages, order):
    """``(target or "", its problems with this configuration, estimate's framework keyword)``."""
    from costmodel.training import estimate
    from planner.plan.planfile import Plan
    from planner.search.target_space import framework_kwargs
    target = getattr(args, "target", None)
    items = [x for x in (getattr(args, "framework_setting", None) or "").split(",") if x]
    switches: dict = {}
    if getattr(args, "plan", None):
        from planner.plan.planfile import read_plan
        made = read_plan(args.plan)
        if target is None or target == made.target:
            target, switches = made.target or None, dict(made.framework)
    if target in T.FSDP_TRAINERS:
        # a PyTorch FSDP trainer: the generic target (nothing it cannot run), its validated profile with the
        # settings asked for (compile, as the validation prices a compiled run)
        settings = framework_settings(items, target, {"tp": par.tp})
        return T.GENERIC, [], {"framework": T.profile_for(target, settings)}
    if target in T.STAND_INS:
        target = T.STAND_INS[target][0]
    if items and (not target or target == T.GENERIC):
        raise UsageError("--framework-setting is one framework's: give --target (e.g. --target torchtitan)")
    if not target or target == T.GENERIC:
        return (target or ""), [], {}
    if target not in T.TRAIN:
        raise UsageError(f"--target {target!r}: training targets are {', '.join(T.names('train'))}"
                         f"{T.stand_in_hint(target)}")
    if items:
        switches = dict(switches, **framework_settings(items, target, {"tp": par.tp}))
    plan = Plan(model=model, cluster=cluster, workload=wl, parallel=par,
                stages=stages or default_stages(model.layers, par.pp), mesh_order=tuple(order or MESH_AXES),
                target=target, framework=switches)
    return target, T.problems(target, plan), framework_kwargs(estimate, target, switches)


# --------------------------------------------------------------------------------------
# The command that plans for a target (moved from planner.plan.targets)
# --------------------------------------------------------------------------------------

def plan_command(plan: Any, target: str, plan_path: str | None = None) -> str:
    """The ``planner plan --target T ...`` command for ``plan``'s problem (same model, cluster,
    GPUs, batch and sequence, dtype and optimizer): a plan ``target`` runs, or the reason it
    has none. A model that is not the catalog's entry of its name is read back from the plan
    file itself (``--like PLAN``)."""
    import shlex

    from costmodel.catalog import get_model, model_names
    w = plan.workload
    target = {"torchrun": "builtin", "slurm": "slurm", "kubernetes": "kubernetes"}.get(target, target)
    catalog_model = plan.model.name in model_names() and get_model(plan.model.name) == plan.model
    src = (plan.provenance or {}).get("cluster_source", "catalog")
    if not catalog_model or (src == "catalog" and ":" in plan.cluster.name):
        if plan_path:
            return f"planner plan --like {shlex.quote(str(plan_path))} --target {target}"
    args = ["planner", "plan"]
    if w.mode == "infer":
        args += ["--mode", "infer"]
    args += ["--model", plan.model.name if catalog_model else f"<{plan.model.name} model file>"]
    whole_file = src != "catalog"
    cluster = src if whole_file else plan.cluster.name
    args += ["--cluster", cluster]
    if not (whole_file and (":" in plan.cluster.name or len(plan.cluster.groups) > 1)):
        args += ["--gpus", str(plan.cluster.total_gpus)]
    if w.mode == "infer":
        args += ["--prompt-len", str(w.prompt_len), "--output-len", str(w.output_len), "--batch", str(w.global_batch)]
    else:
        args += ["--global-batch", str(w.global_batch), "--seq-len", str(w.seq_len)]
    if w.dtype != "bf16":
        args += ["--dtype", w.dtype]
    if w.mode == "train" and w.optimizer != "adamw":
        args += ["--optimizer", w.optimizer]
    args += ["--target", target]
    return " ".join(shlex.quote(a) if not a.startswith("<") else a for a in args)


def framework_settings(items: list[str], target: str, fixed: dict, problem: tuple | None = None) -> dict:
    """``--framework-setting KEY=VALUE`` options as the plan's ``framework:`` section, each checked
    against the target's settings (``planner.plan.targets.SWITCHES``): ``UsageError`` naming the
    setting, its value and what the target takes. ``problem`` (model, workload, GPU) checks the
    settings a problem cannot run (``targets.setting_problem``); ``fused_grouped_mlp`` then fixes
    ``fixed["etp"]`` at 1 (whole experts: what Megatron's fused path needs) unless it is fixed."""
    if not items:
        return {}
    known = T.switches_for(target)
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--framework-setting {item!r}: write KEY=VALUE, e.g. compile=true")
        if key not in known or key == "partition_method":
            takes = ", ".join(k for k in sorted(known) if k != "partition_method") or "none"
            raise UsageError(f"--framework-setting {key}: --target {target} takes {takes}"
                             + (" (DeepSpeed's partition_method is chosen by the search)" if key == "partition_method"
                                else ""))
        kind = known[key][0]
        if kind is bool:
            if raw.lower() not in ("true", "false"):
                raise UsageError(f"--framework-setting {key}={raw}: true or false")
            out[key] = raw.lower() == "true"
        else:
            out[key] = raw
    if out.get("async_tp") and not (out.get("compile") and fixed.get("tp", 1) > 1):
        raise UsageError(f"--framework-setting async_tp=true: torchtitan's async TP needs compile=true and a fixed "
                         f"--tp above 1 (got compile={out.get('compile', False)}, tp={fixed.get('tp', 'free')})")
    if out.get("fused_grouped_mlp") and problem is not None:
        if "etp" in fixed and fixed["etp"] != 1:
            raise UsageError(f"--framework-setting fused_grouped_mlp=true with --etp {fixed['etp']}: Megatron's fused "
                             "grouped MLP needs whole experts on each rank (--etp 1)")
        fixed["etp"] = 1
    if problem is not None:
        for key, value in out.items():
            why = T.setting_problem(key, target, *problem) if value is True else ""
            if why:
                raise UsageError(f"--framework-setting {key}=true: {why}")
    return out


# The framework settings ``planner plan`` names where they could run the best plan and were not asked for:
# (framework, setting) -> (what it is, why it is off by default). Where each runs is its rule in
# ``targets.setting_problem``.
HINTED_SETTINGS: dict[tuple[str, str], tuple[str, str]] = {
    ("megatron", "fused_grouped_mlp"): (
        "Transformer Engine's fused grouped MLP",
        "it needs TE 2.14+ with cuDNN frontend's CuTe DSL kernels and stores the experts' FC1 rows interleaved"),
    ("torchtitan", "mxfp8_experts"): (
        "torchao's MXFP8 on the routed experts",
        "it needs torchao's MoE training prototype and changes the experts' numerics (MXFP8 GEMMs)"),
}


def setting_hints(target: str, switches: dict, plan: Any) -> list[str]:
    """Lines for ``planner plan`` where a setting of ``HINTED_SETTINGS`` (Megatron's ``fused_grouped_mlp``,
    torchtitan's ``mxfp8_experts``) could run the best plan and was not asked for: the plan priced with it, and
    why it is off by default; none where it cannot run the plan or gains under half a percent."""
    out: list[str] = []
    if not plan.model.is_moe:
        return out
    for (framework, setting), (what, why_off) in HINTED_SETTINGS.items():
        if T.framework_of(target) != framework or (switches or {}).get(setting):
            continue
        if T.setting_problem(setting, target, plan.model, plan.workload, plan.cluster.groups[0].gpu, plan.parallel):
            continue
        from planner.cli.explain import plan_estimate
        # the plan's own price is the one the solver wrote into it; only the variant is priced again
        now = plan.estimate.get("step_time_s") or plan_estimate(plan).step_time_s
        on = plan_estimate(plan.replace(framework=dict(plan.framework or {}, **{setting: True}))).step_time_s
        if on > 0.995 * now:
            continue
        out.append(f"planner plan: --framework-setting {setting}=true ({what}) prices this plan at {on:.3f} s a step, "
                   f"{1 - on / now:.1%} faster; it is off by default: {why_off} (docs/targets.md)")
    return out
