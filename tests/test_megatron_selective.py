"""Megatron's selective recompute is per module (``--recompute-modules``, default ``core_attn``), not
torchtitan's per-op SAC: with a fused attention kernel it keeps all but the kernel's softmax
statistics and runs the attention forward again; with materialized attention it drops the s x s
terms (Korthikanti et al. 2022). The emitted file writes the module set the price assumes."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import FRAMEWORKS, FrameworkProfile
from costmodel.specs import ParallelConfig, SpecError, Workload, default_stages
from costmodel.training import estimate
from planner.plan import targets as T

GPUS = 8


def _est(recompute: str, kernel: str, profile: FrameworkProfile, tp: int = 1):
    m = get_model("llama-3-8b")
    p = ParallelConfig(tp=tp, dp=GPUS // tp, sp=tp > 1, zero=1, micro_batch=1, grad_accum=1, recompute=recompute)
    wl = Workload(global_batch=GPUS // tp, seq_len=4096, dtype="bf16", attention_kernel=kernel)
    return estimate(m, load_cluster("dgx-h100").with_gpus(GPUS), wl, p, stages=default_stages(m.layers, 1),
                    framework=profile)


def _act(e) -> float:
    return e.stages[0].memory["activations_bytes"]


@pytest.mark.parametrize("tp", [1, 2])
def test_fused_attention_core_attn_keeps_all_but_the_softmax_statistics(tp):
    meg = T.profile_for("megatron", {})
    assert meg.selective_recompute == "core_attn"
    none, sel = _est("none", "flash", meg, tp), _est("selective", "flash", meg, tp)
    m = get_model("llama-3-8b")
    # FP32 log-sum-exp per local head and token, for every layer (one micro-batch in flight)
    stats = m.layers * 4096 * (m.heads / tp) * 4
    assert _act(none) - _act(sel) == pytest.approx(stats, rel=1e-9)
    # the recompute costs time: the fused attention forward again
    assert sel.step_time_s > none.step_time_s


def test_megatron_selective_is_not_torchtitans_op_level_sac():
    op = dataclasses.replace(T.profile_for("megatron", {}), selective_recompute="op")
    meg = T.profile_for("megatron", {})
    none = _act(_est("none", "flash", meg))
    # op-level SAC keeps about half; Megatron's module recompute keeps nearly everything
    assert _act(_est("selective", "flash", op)) < 0.6 * none < _act(_est("selective", "flash", meg))
    assert T.profile_for("torchtitan", {}).selective_recompute == "op"


def test_materialized_attention_drops_the_score_matrix_under_either_rule():
    meg = T.profile_for("megatron", {})
    op = dataclasses.replace(meg, selective_recompute="op")
    a, b = _est("selective", "materialized", meg), _est("selective", "materialized", op)
    assert _act(a) == _act(b) and a.step_time_s == b.step_time_s
    assert _act(a) < 0.5 * _act(_est("none", "materialized", meg))


def test_unknown_selective_rule_is_refused():
    with pytest.raises(SpecError, match="selective recompute"):
        dataclasses.replace(FRAMEWORKS["megatron"], selective_recompute="mlp")


def test_the_file_writes_the_module_set_it_is_priced_with(tmp_path):
    from emitters import megatron
    from test_emit_support import make_plan
    plan = make_plan("llama-3-8b", gpus=8, gb=64, seq=4096, cluster="dgx-h100", tp=2, sp=True, dp=4, zero=1,
                     grad_accum=8, recompute="selective").replace(target="megatron")
    args = [str(a) for a in megatron.parallel_args(plan)[0]]
    i = args.index("--recompute-granularity")
    assert args[i:i + 4] == ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
