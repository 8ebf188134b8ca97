"""Megatron's ``framework.fused_grouped_mlp``: Transformer Engine's fused grouped MLP, planned, priced
(``costmodel.moe.fused_mlp_elementwise``, one grouped kernel per matrix) and written
(``--use-transformer-engine-op-fuser --moe-mlp-glu-interleave-size 32``, ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``),
and refused, with the reason, where Megatron-Core's fused path cannot run."""
from __future__ import annotations

import json

import pytest

from costmodel.training import estimate
from planner.cli import main
from planner.cli.explain import plan_estimate
from planner.plan.planfile import PlanError, dump_plan, read_plan
from test_priced_is_written import megatron_as_written

# Qwen3-30B-A3B on 16 GB200 in MXFP8, the layout fixed (the Megatron-LM recipe's: EP16, micro-batch 4)
PROBLEM = ["--model", "qwen3-30b-a3b", "--cluster", "gb200-nvl72", "--gpus", "16", "--global-batch", "256",
           "--seq-len", "4096", "--dtype", "fp8", "--fp8-recipe", "mxfp8", "--target", "megatron",
           "--tp", "1", "--pp", "1", "--dp", "16", "--ep", "16", "--micro-batch", "4", "--zero", "1",
           "--recompute", "none", "--max-time", "20"]
SWITCH = ["--framework-setting", "fused_grouped_mlp=true"]


def _plan(tmp_path, extra, name):
    out = tmp_path / name
    assert main(["plan", *PROBLEM, *extra, "--out", str(out)]) == 0
    return read_plan(out)


def test_the_switch_is_priced_as_its_file_runs(tmp_path, capsys):
    fused = _plan(tmp_path, SWITCH, "fused.yaml")
    plain = _plan(tmp_path, [], "plain.yaml")
    capsys.readouterr()
    assert fused.framework == {"fused_grouped_mlp": True} and fused.parallel.etp in (0, 1)
    priced = plan_estimate(fused)
    # faster than the same layout without it: the SwiGLU passes, two casts and the per-expert GEMM calls go
    assert priced.step_time_s < plan_estimate(plain).step_time_s
    w = megatron_as_written(fused, tmp_path / "emit")
    assert w.profile.moe.fused_grouped_mlp and not w.profile.moe.per_expert_gemms
    again = estimate(w.model, fused.cluster, w.workload, w.par, stages=w.stages, order=fused.mesh_order,
                     framework=w.profile)
    assert again.step_time_s == pytest.approx(priced.step_time_s, rel=1e-12)
    # the plain plan's file sets neither flag nor the switch
    w0 = megatron_as_written(plain, tmp_path / "emit0")
    assert not w0.profile.moe.fused_grouped_mlp and w0.profile.moe.per_expert_gemms


@pytest.mark.parametrize("change,says", [
    (["--model", "llama-3-8b"], "has no routed SwiGLU experts (a dense model)"),
    (["--dtype", "bf16"], "MXFP8 on Blackwell"),
    (["--cluster", "dgx-h100", "--fp8-recipe", "delayed"], "MXFP8 on Blackwell"),
    (["--etp", "2", "--ep", "8"], "needs whole experts on each rank (--etp 1)"),
])
def test_refused_where_megatron_cannot_run_it(change, says, capsys):
    args = list(PROBLEM)
    for i in range(0, len(change), 2):
        k, v = change[i], change[i + 1]
        if k in args:
            args[args.index(k) + 1] = v
        else:
            args += [k, v]
    drop = {"llama-3-8b": "--ep", "bf16": "--fp8-recipe"}
    for value, flag in drop.items():
        if value in change:
            i = args.index(flag)
            del args[i:i + 2]
    assert main(["plan", *args, *SWITCH]) == 2
    err = capsys.readouterr().err
    assert "fused_grouped_mlp" in err and says in err


def test_a_plan_file_with_the_switch_and_split_experts_is_refused(tmp_path, capsys):
    plan = _plan(tmp_path, SWITCH, "fused.yaml")
    capsys.readouterr()
    bad = plan.replace(parallel=plan.parallel.__class__(**{**plan.parallel.__dict__, "etp": 2, "ep": 8}))
    f = tmp_path / "bad.yaml"
    f.write_text(dump_plan(bad))
    with pytest.raises(PlanError, match="expert TP 2: Megatron's fused grouped MLP needs whole experts"):
        read_plan(f)


def test_estimate_reports_the_switch_on_a_dense_model_as_a_problem(capsys):
    assert main(["estimate", "--model", "llama-3-8b", "--cluster", "gb200-nvl72", "--gpus", "8", "--global-batch",
                 "64", "--seq-len", "4096", "--dtype", "fp8", "--tp", "1", "--dp", "8", "--target", "megatron",
                 *SWITCH, "--json"]) in (0, 1)
    out = capsys.readouterr()
    assert "has no routed SwiGLU experts" in out.out + out.err
    json.loads(out.out)


def test_plan_names_the_setting_where_it_would_run_and_was_not_asked(tmp_path, capsys):
    """Without the setting, a plan it could run says so, with the price it would have; with it, or where it
    cannot run (H100), nothing is said."""
    plain = _plan(tmp_path, [], "plain.yaml")
    err = capsys.readouterr().err
    fused = plan_estimate(plain.replace(framework={"fused_grouped_mlp": True})).step_time_s
    assert f"--framework-setting fused_grouped_mlp=true (Transformer Engine's fused grouped MLP) prices this plan " \
           f"at {fused:.3f} s a step" in err
    _plan(tmp_path, SWITCH, "fused.yaml")
    assert "prices this plan" not in capsys.readouterr().err
    h100 = ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "256",
            "--seq-len", "4096", "--dtype", "fp8", "--target", "megatron", "--max-time", "20"]
    assert main(["plan", *h100, "--out", str(tmp_path / "h100.yaml")]) == 0
    assert "fused_grouped_mlp" not in capsys.readouterr().err
