"""Regenerate the emitters' golden files: ``python -m planner.cli.regen_golden [--check]``.

For every example plan (the plan files in ``plans/*.yaml`` and the built-in examples below,
which cover the cases the plan files may not: uneven splits, virtual stages, HSDP, experts,
heterogeneous clusters, serving) and every target of the plan's mode, writes
``tests/golden/emitters/<plan>/<target>/<file>``, or ``<target>/REFUSED.txt`` with the
refusal message when the target cannot express the plan. ``--check`` writes nothing and exits 1
when the files on disk differ (tests/test_emit_golden.py runs the same comparison).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from costmodel.catalog import get_model
from costmodel.specs import ParallelConfig, StageSpec, Workload
from costmodel.units import GIB
from emitters import TARGETS, CannotExpress, get
from planner.plan.planfile import Plan, default_stages, read_plan
from profiles.clusters import cluster_from_dict, load_cluster

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "emitters"
PLANS = ROOT / "plans"
REFUSED = "REFUSED.txt"


def _train(model: str, cluster, gb: int, seq: int, **par) -> Plan:
    m = get_model(model)
    p = ParallelConfig(**par)
    return Plan(model=m, cluster=cluster, workload=Workload(global_batch=gb, seq_len=seq), parallel=p,
                stages=default_stages(m.layers, p.pp))


def _infer(model: str, cluster, batch: int, prompt: int, output: int, memory: dict | None = None, **par) -> Plan:
    m = get_model(model)
    p = ParallelConfig(**par)
    w = Workload(global_batch=batch, seq_len=prompt + output, mode="infer", prompt_len=prompt, output_len=output)
    est = {}
    if memory:
        mem = {k: float(v * GIB) for k, v in memory.items()}
        mem["peak_bytes"] = sum(mem.values())
        est = {"memory": mem}
    return Plan(model=m, cluster=cluster, workload=w, parallel=p, stages=default_stages(m.layers, p.pp),
                estimate=est)


def builtin_plans() -> dict[str, Plan]:
    """Example plans built in code (no estimate for training; a memory estimate for serving)."""
    cpu = load_cluster("cpu")
    h100 = load_cluster("dgx-h100")
    plans = {
        # the brief's example: TP within a node, DP across
        "tiny-llama-tp2-dp2": _train("tiny-llama", cpu.with_gpus(4), 8, 64, tp=2, dp=2,
                                     micro_batch=2, grad_accum=2),
        # data parallel with a sharded optimizer (ZeRO-1)
        "tiny-llama-dp4-zero1": _train("tiny-llama", cpu.with_gpus(4), 8, 64, dp=4, zero=1,
                                       micro_batch=1, grad_accum=2),
        # pipeline with ZeRO-1 and full recompute: DeepSpeed's PipelineEngine, Accelerate's Megatron plugin
        "tiny-llama-pp2-zero1": _train("tiny-llama", cpu.with_gpus(4), 8, 64, pp=2, dp=2, zero=1,
                                       micro_batch=1, grad_accum=4, recompute="full"),
        # two pipeline stages, FSDP (ZeRO-3), full recompute
        "tiny-llama-pp2-fsdp": _train("tiny-llama", cpu.with_gpus(4), 8, 64, pp=2, dp=2, zero=3,
                                      micro_batch=1, grad_accum=4, recompute="full"),
        # HSDP: shard over 4, replicate over 2
        "tiny-llama-hsdp": _train("tiny-llama", cpu.with_gpus(8), 8, 64, dp=8, dp_shard=4, zero=3,
                                  micro_batch=1, grad_accum=1),
        # interleaved pipeline with virtual stages, selective recompute
        "llama-3-70b-h100x64": _train("llama-3-70b", h100.with_gpus(64), 512, 8192, tp=8, pp=2, dp=4,
                                      sp=True, vpp=2, micro_batch=1, grad_accum=128, recompute="selective"),
        # 126 layers on 8 stages: uneven (15 on the end stages), context parallel, partial recompute
        "llama-3.1-405b-h100x1024": _train("llama-3.1-405b", h100.with_gpus(1024), 2048, 8192, tp=8, pp=8,
                                           cp=2, dp=8, sp=True, micro_batch=1, grad_accum=256,
                                           recompute="full", recompute_layers=4),
        # experts over data-parallel ranks
        "mixtral-8x7b-ep8": _train("mixtral-8x7b", h100.with_gpus(32), 256, 4096, tp=2, dp=16, ep=8,
                                   sp=True, micro_batch=1, grad_accum=16),
    }
    mixed = cluster_from_dict({"name": "h100-a100", "groups": [
        {"name": "h100", "extends": "dgx-h100", "nodes": 1},
        {"name": "a100", "extends": "dgx-a100-80gb", "nodes": 1}],
        "inter_node": {"name": "ib-hdr-200", "gb_per_s": 25}})
    m = get_model("llama-3-8b")
    plans["llama-3-8b-hetero"] = Plan(
        model=m, cluster=mixed, workload=Workload(global_batch=64, seq_len=4096),
        parallel=ParallelConfig(tp=8, pp=2, sp=True, micro_batch=1, grad_accum=64),
        stages=(StageSpec(first_layer=0, num_layers=18, group="h100"),
                StageSpec(first_layer=18, num_layers=14, group="a100")))
    plans["llama-3-70b-serve-h100x8"] = _infer(
        "llama-3-70b", h100.with_gpus(8), 64, 2048, 512, tp=8,
        memory={"weights_bytes": 16.44, "kv_cache_bytes": 6.25, "activations_bytes": 2.0, "other_bytes": 1.5})
    plans["qwen3-235b-serve-ep16"] = _infer(
        "qwen3-235b-a22b", load_cluster("dgx-h200").with_gpus(16), 32, 4096, 1024, dp=16, ep=16,
        memory={"weights_bytes": 30.1, "kv_cache_bytes": 59.0, "activations_bytes": 3.0, "other_bytes": 2.0})
    plans["tiny-llama-serve-cpu"] = _infer("tiny-llama", cpu.with_gpus(2), 4, 48, 16, tp=2)
    from planner.cli.serving_examples import serving_plans      # solved serving plans (in-flight, P/D, wide EP)
    plans.update(serving_plans())
    return plans


def example_plans() -> dict[str, Plan]:
    """plans/*.yaml (named ``plans-<stem>``) and the built-in examples, sorted by name."""
    out = {f"plans-{p.stem}": read_plan(p) for p in sorted(PLANS.glob("*.yaml"))}
    out.update(builtin_plans())
    return dict(sorted(out.items()))


def render(plan: Plan) -> dict[str, dict[str, str]]:
    """target -> files for every target of the plan's mode (a refusal becomes REFUSED.txt)."""
    out: dict[str, dict[str, str]] = {}
    for name in TARGETS:
        mod = get(name)
        if mod.MODE != plan.mode:
            continue
        try:
            out[name] = mod.emit(plan)
        except CannotExpress as e:
            out[name] = {REFUSED: str(e) + "\n"}
    return out


def expected() -> dict[str, str]:
    """Relative path under the golden folder -> text."""
    files = {}
    for pname, plan in example_plans().items():
        for target, texts in render(plan).items():
            for fname, text in texts.items():
                files[f"{pname}/{target}/{fname}"] = text
    return files


def on_disk() -> dict[str, str]:
    if not GOLDEN.exists():
        return {}
    return {str(p.relative_to(GOLDEN)): p.read_text() for p in sorted(GOLDEN.rglob("*")) if p.is_file()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.cli.regen_golden", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 on any difference")
    args = ap.parse_args(argv)
    want = expected()
    have = on_disk()
    changed = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if args.check:
        for k in changed:
            print(f"differs: {k}", file=sys.stderr)
        return 1 if changed else 0
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    for rel, text in want.items():
        path = GOLDEN / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(want)} golden files under {GOLDEN.relative_to(ROOT)} ({len(changed)} changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
