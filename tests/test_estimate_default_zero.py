"""``planner estimate``'s defaults are the target's own: without ``--zero``, the ZeRO stage the target
runs (``planner.plan.targets.default_zero``: torchtitan's FSDP2 reshards after forward unless pipelining
is on, Accelerate runs FSDP unless tensor or pipeline parallelism hands it to its Megatron-LM engine,
Megatron keeps its distributed optimizer); without ``--sp``, sequence parallelism only where the target
has it (``runs_sp``). Before, every target got ZeRO-1 and sequence parallelism, which torchtitan and
DeepSpeed cannot run, so their own estimates said "cannot run this"."""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.plan import targets as T

PROBLEM = ["estimate", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16",
           "--seq-len", "4096", "--json"]


def _estimate(capsys, *extra: str) -> dict:
    assert main(PROBLEM + list(extra)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra, zero", [
    (("--target", "torchtitan"), 3),
    (("--target", "torchtitan", "--pp", "2"), 2),       # fsdp_reshard_after_forward "default": not under PP
    (("--target", "accelerate"), 3),
    (("--target", "accelerate", "--tp", "2"), 1),       # the Megatron-LM engine's distributed optimizer
    (("--target", "builtin"), 3),
    (("--target", "megatron"), 1),
    (("--target", "deepspeed"), 1),
    (("--target", "olmo-core"), 3),
    (("--target", "maxtext"), 3),                       # base.yml ici_fsdp_parallelism -1: FSDP within a host
    (("--target", "maxtext", "--tp", "2"), 3),          # the other ICI axes leave the rest to FSDP
    ((), 1),                                            # generic
])
def test_the_zero_stage_is_the_targets_own(capsys, extra, zero):
    out = _estimate(capsys, *extra)
    assert out["parallel"]["zero"] == zero
    if extra and extra[1] in T.TRAIN:
        assert not any("ZeRO" in p for p in out["target"]["problems"]), out["target"]["problems"]


def test_maxtext_shards_within_a_host_and_replicates_across_hosts_unless_told(capsys):
    """MaxText's default mesh on GPUs (``default_zero``, ``default_dp_shard``): FSDP over a host's GPUs less its
    other ICI axes, data parallel across hosts (its own A3 scripts: ``dcn_data_parallelism`` = VMs,
    ``ici_fsdp_parallelism=8``). One host: the whole data-parallel group; a given ``--dp-shard`` is kept."""
    def par(*extra):
        return _estimate(capsys, "--target", "maxtext", "--global-batch", "64", *extra)["parallel"]
    assert (par("--gpus", "8")["dp"], par("--gpus", "8")["dp_shard"]) == (8, 8)
    p = par("--gpus", "32")
    assert (p["zero"], p["dp"], p["dp_shard"]) == (3, 32, 8)            # 4 hosts of 8 H100
    p = par("--gpus", "32", "--tp", "2")
    assert (p["dp"], p["dp_shard"]) == (16, 4)                          # ici_fsdp = 8 / ici_tensor 2
    assert par("--gpus", "32", "--dp-shard", "32")["dp_shard"] == 32
    out = _estimate(capsys, "--target", "maxtext", "--gpus", "32", "--global-batch", "64")
    full = _estimate(capsys, "--target", "maxtext", "--gpus", "32", "--global-batch", "64", "--dp-shard", "32")
    assert out["target"]["asked"] == "maxtext" and out["estimate"]["step_time_s"] != full["estimate"]["step_time_s"]
    assert T.default_dp_shard("torchtitan", {"dp": 32}, 8) is None      # every other target: its own group


def test_a_given_zero_is_kept(capsys):
    out = _estimate(capsys, "--target", "torchtitan", "--zero", "2")
    assert out["parallel"]["zero"] == 2
    out = _estimate(capsys, "--target", "megatron", "--zero", "0")
    assert out["parallel"]["zero"] == 0


def test_the_validation_prices_an_unstated_zero_by_the_same_rule():
    """A published record without ``zero`` is priced at ``default_zero`` of its framework (one rule)."""
    from planner.cli.validation import all_cases, case_inputs, framework_of
    seen = 0
    for case, _split in all_cases():
        if "zero" in case["parallel"]:
            continue
        par = case_inputs(case)[3]
        assert par.zero == T.default_zero(framework_of(case), case["parallel"]), case["name"]
        seen += 1
    assert seen > 10


@pytest.mark.parametrize("target, sp", [("megatron", True), ("deepspeed", False), ("megatron-deepspeed", False),
                                        ("gpt-neox", False), ("torchtitan", True)])
def test_sequence_parallel_by_default_only_where_the_target_runs_it(capsys, target, sp):
    """With tp > 1 the estimate takes sequence parallelism unless the target has none (DeepSpeed's tables:
    ``sp="never"``), which would otherwise price it and then say the target cannot run it."""
    out = _estimate(capsys, "--tp", "2", "--target", target)
    assert out["parallel"]["sp"] is sp
    assert not any("sequence parallel" in p for p in out["target"]["problems"])
    if not sp:
        out = _estimate(capsys, "--tp", "2", "--target", target, "--sp")     # asked for: kept, and flagged
        assert out["parallel"]["sp"] is True
        assert any("sequence parallel" in p for p in out["target"]["problems"])


def test_a_targets_framework_settings_are_priced_as_plan_prices_them(capsys):
    """``--framework-setting`` on ``estimate`` is ``plan``'s: checked against the target's settings and
    priced by the same profile (``targets.profile_for``); without a target it is refused."""
    from costmodel.files.clusters import load_cluster
    from costmodel.specs import ParallelConfig, Workload
    from costmodel.training import estimate
    from planner.cli.args import load_model
    out = _estimate(capsys, "--target", "torchtitan", "--framework-setting", "compile=true")
    plain = _estimate(capsys, "--target", "torchtitan")
    p = out["parallel"]
    par = ParallelConfig(tp=1, pp=1, dp=8, zero=p["zero"], micro_batch=1, grad_accum=2)
    by_hand = estimate(load_model("llama-3-8b"), load_cluster("dgx-h100").with_gpus(8),
                       Workload(global_batch=16, seq_len=4096), par,
                       framework=T.profile_for("torchtitan", {"compile": True}))
    assert out["estimate"]["step_time_s"] == pytest.approx(by_hand.step_time_s, rel=1e-9)
    assert out["estimate"]["step_time_s"] < plain["estimate"]["step_time_s"]
    assert main(PROBLEM + ["--framework-setting", "compile=true"]) == 2
    assert "give --target" in capsys.readouterr().err
    assert main(PROBLEM + ["--target", "megatron", "--framework-setting", "compile=true"]) == 2
    assert "--target megatron takes" in capsys.readouterr().err
