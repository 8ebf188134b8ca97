"""Emitters: one module per launch target, each a pure function from a plan to file texts.

``TARGETS`` maps the target name users type to its module; ``get(name)`` imports it. Every
module has ``TARGET``, ``MODE`` (train or infer), ``FORMAT`` (the tool and format version it
writes), ``SUMMARY``, ``RUN`` (how to run the files, for the README) and ``emit(plan)``.
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
    "torchtitan": "emitters.torchtitan",
    "accelerate": "emitters.accelerate",
    "vllm": "emitters.vllm",
    "sglang": "emitters.sglang",
    "tensorrt-llm": "emitters.tensorrt_llm",
}


def names() -> list[str]:
    return list(TARGETS)


def get(name: str) -> ModuleType:
    if name not in TARGETS:
        raise KeyError(name)
    return importlib.import_module(TARGETS[name])


def emit(plan, name: str) -> dict[str, str]:
    return get(name).emit(plan)


__all__ = ["TARGETS", "CannotExpress", "names", "get", "emit"]
