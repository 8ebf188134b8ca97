"""Each target refuses, naming the part, what it cannot state, rather than emit something that
would run a different configuration."""
from __future__ import annotations

import pytest

from costmodel.specs import StageSpec, Workload, stages_from_counts
from emitters import TARGETS, CannotExpress, get

from test_emit_support import examples, make_plan

GIB = 2**30




def _dtype(plan, dtype, kv=""):
    w = plan.workload
    return plan.replace(workload=Workload(global_batch=w.global_batch, seq_len=w.seq_len, mode=w.mode,
                                          dtype=dtype, kv_dtype=kv, prompt_len=w.prompt_len,
                                          output_len=w.output_len))


def _infer(gpus=2, memory=None, model="tiny-llama", cluster="cpu", **par):
    est = {}
    if memory:
        mem = {k: v * GIB for k, v in memory.items()}
        mem["peak_bytes"] = sum(mem.values())
        est = {"memory": mem}
    return make_plan(model, gpus=gpus, gb=4, seq=64, cluster=cluster, mode="infer", estimate=est, **par)


CASES = [
    # (target, plan factory, words the message must contain)
    ("megatron", lambda: make_plan(gpus=2, pp=2, grad_accum=8, recompute="selective",
                                   stages=tuple(StageSpec(first_layer=2 * i, num_layers=2, recompute_layers=1 - i)
                                                for i in range(2))), "selective recompute plus full recompute"),
    ("megatron", lambda: make_plan(gpus=2, pp=2, grad_accum=8, schedule="gpipe"), "GPipe"),
    ("megatron", lambda: examples()["tiny-llama-hsdp"], "HSDP"),
    # per-stage counts come from the stages when the policy does not fix them
    # (ParallelConfig.full_recompute_layers: under recompute=full the policy's count wins)
    ("megatron", lambda: make_plan(gpus=2, pp=2, grad_accum=8, recompute="none",
                                   stages=tuple(StageSpec(first_layer=2 * i, num_layers=2, recompute_layers=i + 1)
                                                for i in range(2))), "recompute layers per stage [1, 2]"),
    ("megatron", lambda: make_plan(gpus=4, dp=2, cp=2, seq=66, grad_accum=4), "cp=2 with seq_len=66"),
    ("deepspeed", lambda: make_plan(gpus=4, dp=2, cp=2, grad_accum=4), "cp=2"),
    ("deepspeed", lambda: examples()["tiny-llama-pp2-fsdp"], "ZeRO-3 with pp=2"),
    ("deepspeed", lambda: make_plan(gpus=4, dp=4, grad_accum=2, recompute="selective"), "selective recompute"),
    # full recompute without stages is written (the script checkpoints its blocks): tests/test_targets_switches.py
    ("deepspeed", lambda: examples()["tiny-llama-hsdp"], "HSDP"),
    ("deepspeed", lambda: make_plan(gpus=4, tp=2, pp=2, grad_accum=8), "tp=2 with pp=2"),
    ("deepspeed", lambda: examples()["tiny-llama-tp2-dp2"].replace(mesh_order=("pp", "tp", "cp", "dp")),
     "mesh order"),
    ("torchtitan", lambda: examples()["tiny-llama-dp4-zero1"], "ZeRO-1"),
    ("torchtitan", lambda: examples()["mixtral-8x7b-ep8"], "mixture of experts"),
    ("torchtitan", lambda: make_plan("tiny-gpt", gpus=2, dp=2, zero=3, grad_accum=4), "gelu MLP"),
    ("torchtitan", lambda: make_plan(gpus=2, tp=2, grad_accum=8), "tensor parallel without sequence parallel"),
    # per-op selective AC is written as SelectiveAC: tests/test_targets_switches.py
    ("torchtitan", lambda: _dtype(make_plan(gpus=2, dp=2, zero=3, grad_accum=4), "fp16"), "dtype fp16"),
    ("torchtitan", lambda: make_plan(gpus=2, pp=2, grad_accum=8), "bf16 mixed precision without FSDP"),
    ("torchtitan", lambda: make_plan(gpus=4, tp=2, dp=2, sp=True, zero=0, grad_accum=2), "DDP (zero=0) with tp=2"),
    ("accelerate", lambda: examples()["tiny-llama-tp2-dp2"], "no activation recompute"),
    ("accelerate", lambda: examples()["llama-3-70b-h100x64"], "vpp=2"),
    ("accelerate", lambda: make_plan(gpus=4, dp=2, cp=2, zero=1, grad_accum=4), "ZeRO-1 with cp=2"),
    ("accelerate", lambda: make_plan(gpus=4, dp=4, grad_accum=2, recompute="full"), "full recompute with ZeRO-1"),
    ("vllm", lambda: _infer(model="tiny-moe", gpus=4, tp=2, dp=2, ep=2), "ep=2 with tp=2 dp=2"),
    ("vllm", lambda: _dtype(_infer(tp=2), "int4"), "weights in int4"),
    ("vllm", lambda: _infer(tp=2, memory={"weights_bytes": 1.5, "kv_cache_bytes": 0.8}), "--gpu-memory-utilization"),
    ("vllm", lambda: _infer(gpus=32, cluster="dgx-h100", tp=16, dp=2, model="llama-3-70b"), "dp=2 replicas"),
    ("vllm", lambda: examples()["tiny-llama-tp2-dp2"], "mode 'train'"),
    ("sglang", lambda: _infer(model="tiny-moe", gpus=4, tp=2, dp=2, ep=2), "ep=2 over 2 replicas of tp2"),
    ("tensorrt-llm", lambda: examples()["llama-3.1-70b-serve-pd-h100x8"], "disaggregated prefill/decode"),
    ("sglang", lambda: _dtype(_infer(tp=2), "bf16", kv="int8"), "KV cache in int8"),
    ("tensorrt-llm", lambda: _infer(gpus=2, dp=2), "dp=2 replicas"),
    ("tensorrt-llm", lambda: _infer(gpus=16, cluster="dgx-h100", tp=16, model="llama-3-70b"), "over 2 nodes"),
    ("torchrun", lambda: _infer(model="tiny-moe", gpus=4, tp=2, dp=2, ep=2), "ep=2"),   # builtin serves no EP
]


@pytest.mark.parametrize("target, factory, words", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_refusal(target, factory, words):
    plan = factory()
    with pytest.raises(CannotExpress) as e:
        get(target).emit(plan)
    assert e.value.target == target
    assert words in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{target} cannot express ")


@pytest.mark.parametrize("target", [t for t in TARGETS if get(t).MODE == "train" and t != "torchrun"])
def test_heterogeneous_stage_groups(target):
    with pytest.raises(CannotExpress, match="heterogeneous stage groups"):
        get(target).emit(examples()["llama-3-8b-hetero"])


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "torchrun"])   # torchrun starts both runtimes
def test_other_mode_refused(target):
    mod = get(target)
    plan = examples()["tiny-llama-tp2-dp2" if mod.MODE == "infer" else "tiny-llama-serve-cpu"]
    with pytest.raises(CannotExpress, match="mode"):
        mod.emit(plan)


def test_per_stage_full_recompute_on_a_none_policy_is_expressed_or_refused():
    """The 70B example recomputes 6 and 2 layers of its first two stages on a `none` policy:
    Megatron cannot state different counts per stage, the others have one policy for all."""
    from pathlib import Path

    import emitters
    from emitters.base import CannotExpress
    from planner.plan.planfile import read_plan

    import dataclasses

    plan = read_plan(Path(__file__).resolve().parents[1] / "plans" / "llama-3-70b-64xh100.yaml")
    # the per-stage full-recompute counts the solver may choose (6 and 2 layers of the first two)
    counts = [6, 2] + [0] * (len(plan.stages) - 2)
    plan = plan.replace(parallel=dataclasses.replace(plan.parallel, recompute="none"),
                        stages=tuple(dataclasses.replace(st, recompute_layers=r) for st, r in zip(plan.stages, counts)))
    assert plan.parallel.recompute == "none" and any(s.recompute_layers for s in plan.stages)
    for target in ("megatron", "deepspeed", "torchtitan", "accelerate"):
        with pytest.raises(CannotExpress, match="recompute|split|stages"):
            emitters.emit(plan, target)


def test_megatron_states_any_split_with_the_layout_flag():
    """Middle stages that differ (and uneven virtual stages) go through
    --pipeline-model-parallel-layout: E on the first stage, L on the last, t*n layers each."""
    from emitters.megatron import layout, parallel_args
    plan = make_plan("gpt3-1.3b", gpus=4, pp=4, grad_accum=8, stages=stages_from_counts([5, 6, 8, 5]))
    args, _ = parallel_args(plan)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*5|t*6|t*8|t*5L"
    assert "--decoder-first-pipeline-num-layers" not in args
    # vpp 2 on ranks of 5, 6, 8, 5 layers: rank r's chunks (3, 2), (3, 3), (4, 4), (3, 2), in pipeline order
    v = make_plan("gpt3-1.3b", gpus=4, pp=4, vpp=2, grad_accum=8, stages=stages_from_counts([5, 6, 8, 5]))
    assert layout(v) == "Et*3|t*3|t*4|t*3|t*2|t*3|t*4|t*2L"
    # an even split keeps the plain flags
    even = make_plan("gpt3-1.3b", gpus=4, pp=4, grad_accum=8)
    assert "--pipeline-model-parallel-layout" not in parallel_args(even)[0]
