"""Emitters: one module per launch target, each a pure function from a plan to file texts;
and the launchers that start a framework's files on a cluster.

``TARGETS`` maps the target name users type to its module; ``get(name)`` imports it. Every
module has ``TARGET``, ``MODE`` (train or infer), ``FORMAT`` (the tool and format version it
writes), ``SUMMARY``, ``RUN`` (how to run the files, for the README) and ``emit(plan)``. The
target records (``planner.plan.targets.REGISTRY``) name these modules; a test keeps the two
lists equal.

Frameworks and launchers are two registries composed when emitting, not one record per pair:
``LAUNCHERS`` maps ``torchrun``, ``slurm`` and ``kubernetes`` to modules with
``launch(plan, framework, start, files, ...)``, and ``compose(plan, framework, launcher)`` writes
the framework's files plus the launcher's file that starts them on every node (how, the
framework's record says: ``planner.plan.targets.Start``).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from emitters.base import CannotExpress

TARGETS: dict[str, str] = {
    "torchrun": "emitters.torchrun",
    "slurm": "emitters.slurm",
    "kubernetes": "emitters.kubernetes",
    "megatron": "emitters.megatron",
    "deepspeed": "emitters.deepspeed",
    "megatron-deepspeed": "emitters.megatron_deepspeed",
    "torchtitan": "emitters.torchtitan",
    "accelerate": "emitters.accelerate",
    "vllm": "emitters.vllm",
    "sglang": "emitters.sglang",
    "tensorrt-llm": "emitters.tensorrt_llm",
}

LAUNCHERS: dict[str, str] = {
    "torchrun": "emitters.torchrun",
    "slurm": "emitters.slurm",
    "kubernetes": "emitters.kubernetes",
}


def names() -> list[str]:
    return list(TARGETS)


def get(name: str) -> ModuleType:
    if name not in TARGETS:
        raise KeyError(name)
    return importlib.import_module(TARGETS[name])


def emit(plan, name: str) -> dict[str, str]:
    return get(name).emit(plan)


def compose(plan, framework: str, launcher: str, files: dict[str, str] | None = None, **site) -> dict[str, str]:
    """``framework``'s files (``files``, or its emitter's) plus ``launcher``'s file that starts
    them on every node. ``site``: the launcher's site options (Slurm: ``emitters.slurm.Site``
    fields). ``KeyError`` for an unknown launcher; ``CannotExpress`` for a framework without a
    ``Start`` (a serving engine, or a wrapper that is already a launcher)."""
    from planner.plan import targets as T
    if launcher not in LAUNCHERS:
        raise KeyError(launcher)
    rec = T.record(framework, "train") if framework in T.TRAIN else None
    if rec is None or rec.start is None:
        raise CannotExpress(launcher, f"the {framework} target",
                            "only training frameworks are started by a cluster launcher",
                            "emit --target " + framework + " without --launcher")
    if launcher != "slurm" and any(site.values()):
        raise ValueError(f"--launcher {launcher} takes no site options ({', '.join(k for k, v in site.items() if v)}); "
                         "they are sbatch options: --launcher slurm")
    mod = importlib.import_module(LAUNCHERS[launcher])
    args = ()
    if launcher == "slurm":
        from emitters.slurm import Site
        args = (Site(**site),)
        args[0].check()
    out = dict(files if files is not None else importlib.import_module(rec.emitter).emit(plan))
    extra = mod.launch(plan, framework, rec.start, out, *args)
    clash = sorted(set(extra) & set(out))
    assert not clash, f"{launcher} would overwrite {framework}'s {clash}"
    return {**out, **extra}


__all__ = ["TARGETS", "LAUNCHERS", "CannotExpress", "names", "get", "emit", "compose"]
