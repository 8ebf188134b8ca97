"""The runtime's pure parts, in one process: model shapes, stage split, data stream,
checkpoint bookkeeping, plan checks, flag parsing, and the launch command's refusals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from costmodel.catalog import get_model
from costmodel.specs import ParallelConfig, StageSpec
from planner.plan.planfile import write_plan
from runtime.checkpoint import CheckpointMismatch, check_compatible, find_latest
from runtime.data import DataError, TokenStream
from runtime.local import make_plan
from runtime.model import build_model, count_params, full_init_value
from runtime.parallel import Dims, PlanNotRunnable
from runtime.pipeline import virtual_stage_layers
from runtime.train import Failure, RuntimeUsageError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-moe", "tiny-gpt", "llama-3-8b", "mixtral-8x7b", "gpt3-1.3b"])
def test_model_has_exactly_the_spec_parameter_count(name):
    spec = get_model(name)
    with torch.device("meta"):
        m = build_model(spec)
    assert count_params([m]) == spec.total_params()


def test_stage_parts_partition_the_model_and_a_tied_head_gets_a_copy():
    spec = get_model("tiny-gpt")        # tied embeddings, learned positions
    par = ParallelConfig(pp=2, vpp=2, schedule="interleaved", grad_accum=2)
    stages = (StageSpec(first_layer=0, num_layers=2), StageSpec(first_layer=2, num_layers=2))
    v = virtual_stage_layers(stages, par, spec.layers)
    assert v == [[0], [1], [2], [3]]
    with torch.device("meta"):
        parts = [build_model(spec, layers=ids, embed=i == 0, head=i == len(v) - 1) for i, ids in enumerate(v)]
    names = [n for p in parts for n, _ in p.named_parameters()]
    assert len(names) == len(set(names))         # global names: no two parts share one
    assert count_params(parts) == spec.total_params() + spec.vocab * spec.hidden   # the last stage's copy
    assert parts[-1].output.weight is not None and not parts[-1].tied


def test_virtual_stages_follow_the_plans_uneven_split():
    par = ParallelConfig(pp=2, vpp=2, schedule="interleaved", grad_accum=2)
    stages = (StageSpec(first_layer=0, num_layers=3), StageSpec(first_layer=3, num_layers=5))
    v = virtual_stage_layers(stages, par, 8)
    # rank 0 holds virtual stages 0 and 2 (2 + 1 layers), rank 1 stages 1 and 3 (3 + 2 layers)
    assert [len(x) for x in v] == [2, 3, 1, 2] and sum(v, []) == list(range(8))
    plain = virtual_stage_layers(stages, ParallelConfig(pp=2), 8)
    assert plain == [[0, 1, 2], [3, 4, 5, 6, 7]]
    with pytest.raises(ValueError, match="fewer than vpp"):
        virtual_stage_layers((StageSpec(first_layer=0, num_layers=1), StageSpec(first_layer=1, num_layers=7)),
                             par, 8)


def test_initial_values_depend_on_name_and_seed_only():
    spec = get_model("tiny-llama")
    a = full_init_value("layers.1.attention.wq.weight", torch.Size([8, 4]), 0, spec)
    assert torch.equal(a, full_init_value("layers.1.attention.wq.weight", torch.Size([8, 4]), 0, spec))
    assert not torch.equal(a, full_init_value("layers.2.attention.wq.weight", torch.Size([8, 4]), 0, spec))
    assert not torch.equal(a, full_init_value("layers.1.attention.wq.weight", torch.Size([8, 4]), 1, spec))
    assert torch.equal(full_init_value("layers.0.ffn_norm.weight", torch.Size([4]), 0, spec), torch.ones(4))
    assert torch.equal(full_init_value("layers.0.moe.experts.b2", torch.Size([2, 4]), 0, spec), torch.zeros(2, 4))


def test_token_stream_is_a_function_of_the_workload():
    s = TokenStream(global_batch=8, seq_len=16, vocab=1024, seed=3)
    b = s.batch(5)
    assert b.shape == (8, 17) and b.dtype == torch.int64 and int(b.max()) < 1024
    assert torch.equal(b, TokenStream(global_batch=8, seq_len=16, vocab=1024, seed=3).batch(5))
    assert not torch.equal(b, s.batch(6))
    assert not torch.equal(b, TokenStream(global_batch=8, seq_len=16, vocab=1024, seed=4).batch(5))
    # data-parallel ranks take contiguous blocks that rebuild the global batch
    parts = [s.local(5, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([x for x, _ in parts]), b[:, :-1])
    assert torch.equal(torch.cat([y for _, y in parts]), b[:, 1:])
    # learnable: every next token is one of FANOUT successors of the current one
    pairs = {(int(a), int(c)) for row in s.batch(1) for a, c in zip(row[:-1], row[1:])}
    succ: dict[int, set] = {}
    for a, c in pairs:
        succ.setdefault(a, set()).add(c)
    assert max(len(v) for v in succ.values()) <= 4


def test_token_file_source(tmp_path):
    f = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(f)
    s = TokenStream(global_batch=4, seq_len=8, vocab=1000, path=str(f))
    b = s.batch(2)
    assert b.shape == (4, 9)
    assert all(torch.equal(row[1:] - row[:-1], torch.ones(8, dtype=torch.int64)) for row in b)   # windows
    assert torch.equal(b, s.batch(2))
    with pytest.raises(DataError, match="beyond the model's vocabulary"):
        TokenStream(global_batch=4, seq_len=8, vocab=10, path=str(f)).batch(0)
    with pytest.raises(DataError, match="does not exist"):
        TokenStream(global_batch=4, seq_len=8, vocab=10, path=str(tmp_path / "nope.bin"))


def _dims(model="tiny-llama", world=None, seq=32, gb=8, **par):
    spec = get_model(model)
    return Dims.from_plan(spec, ParallelConfig(**par), ("pp", "dp", "cp", "tp"), seq, gb, world)


def test_plan_checks_name_the_numbers():
    with pytest.raises(PlanNotRunnable, match=r"needs tp\*pp\*dp\*cp = 2\*1\*2\*1 = 4 processes but the launch has 2"):
        _dims(world=2, tp=2, dp=2, grad_accum=4)
    with pytest.raises(PlanNotRunnable, match="context parallel"):
        _dims(cp=2, grad_accum=8)
    with pytest.raises(PlanNotRunnable, match="tp 4 does not divide kv_heads 2"):
        _dims(tp=4, grad_accum=8)
    with pytest.raises(PlanNotRunnable, match="has no experts"):
        _dims(dp=2, ep=2, grad_accum=4)
    with pytest.raises(PlanNotRunnable, match="ep 4 must divide the data-parallel shard group 2"):
        _dims("tiny-moe", dp=4, dp_shard=2, ep=4, zero=3, grad_accum=2)
    d = _dims("tiny-moe", dp=4, dp_shard=2, ep=2, zero=3, grad_accum=2)
    assert (d.dp_replicate, d.dp_shard_mod_ep, d.ep) == (2, 1, 2)
    assert [n for n, _ in d.mesh_dims()] == ["pp", "dp_replicate", "dp_shard_mod_ep", "ep", "cp", "tp"]
    # DDP (ZeRO-0/1) replicates over all of dp: HSDP's dp_shard does not apply
    assert _dims(dp=4, dp_shard=2, zero=1, grad_accum=2).dp_replicate == 1


def test_failure_flag():
    assert Failure.parse("rank=3,step=5") == Failure(rank=3, step=5, phase="step")
    assert Failure.parse("rank=0,step=2,phase=save").phase == "save"
    for bad in ("rank=1", "rank=x,step=2", "rank=1,step=2,phase=later", "rank=1,step=2,extra=1"):
        with pytest.raises(RuntimeUsageError):
            Failure.parse(bad)


def test_latest_checkpoint_ignores_partial_writes(tmp_path):
    assert find_latest(tmp_path / "none") is None
    for name, complete in (("step-00000002", True), ("step-00000004", True), (".tmp-step-00000006", True),
                           ("step-00000008", False)):
        d = tmp_path / name
        d.mkdir()
        (d / ".metadata").write_text("x")
        if complete:
            (d / "meta.json").write_text(json.dumps({"step": int(name[-8:])}))
            (d / "manifest.json").write_text("{}")       # committed (find_intact checks it for real)
    assert find_latest(tmp_path) == tmp_path / "step-00000004"      # 8 has no meta.json, 6 is a temp
    (tmp_path / "latest").write_text("step-00000002\n")
    assert find_latest(tmp_path) == tmp_path / "step-00000002"      # the pointer wins when complete
    (tmp_path / "latest").write_text("step-00000008\n")
    assert find_latest(tmp_path) == tmp_path / "step-00000004"      # ... and is ignored when not


def test_checkpoint_compatibility_names_what_differs():
    a, b = get_model("tiny-llama").to_dict(), get_model("tiny-gpt").to_dict()
    wl = {"global_batch": 8, "seq_len": 32, "seed": 0, "optimizer": "adamw"}
    check_compatible({"model": a, "workload": wl}, a, dict(wl, dtype="bf16"), "ck")
    with pytest.raises(CheckpointMismatch, match="model .*norm: 'rmsnorm' in the checkpoint vs 'layernorm'"):
        check_compatible({"model": a, "workload": wl}, b, wl, "ck")
    with pytest.raises(CheckpointMismatch, match="workload seq_len: 32 in the checkpoint vs 64"):
        check_compatible({"model": a, "workload": wl}, a, dict(wl, seq_len=64), "ck")


def _run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    e.update(env or {}, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e, timeout=120, cwd=ROOT)


@pytest.mark.subprocess
def test_train_entry_point_refuses_bad_input_in_one_line(tmp_path):
    p = tmp_path / "dp2.yaml"
    write_plan(make_plan("tiny-llama", dp=2, grad_accum=4), p)
    r = _run(["-m", "runtime.train", "--plan", str(p)], env={"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "needs 2 processes" in r.stderr and "WORLD_SIZE 3" in r.stderr
    r = _run(["-m", "runtime.train", "--plan", str(tmp_path / "missing.yaml")])
    assert r.returncode == 2 and "cannot read plan file" in r.stderr and "Traceback" not in r.stderr
    r = _run(["-m", "runtime.train", "--plan", str(p), "--inject-failure", "rank=1"])
    assert r.returncode == 2 and "expected rank=R,step=S" in r.stderr


@pytest.mark.subprocess
def test_launch_module_starts_without_torch():
    r = _run(["-c", "import sys, planner.cli.cmd_launch, runtime.checkpoint; print('torch' in sys.modules)"])
    assert r.stdout.strip() == "False", r.stderr


def test_launch_builds_the_torchrun_command(tmp_path):
    import argparse

    from planner.cli.cmd_launch import _check_args, add_arguments, torchrun_command
    p = tmp_path / "p.yaml"
    plan = make_plan("tiny-llama", dp=4, zero=3, grad_accum=2)
    write_plan(plan, p)
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    args = ap.parse_args([str(p), "--steps", "5", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every",
                          "2", "--max-restarts", "2", "--device", "cpu"])
    nproc, device = _check_args(args, plan)
    assert (nproc, device) == (4, "cpu")
    cmd = torchrun_command(args, nproc, device, "/tmp/s.json", "/tmp/m.jsonl")
    s = " ".join(cmd)
    assert "-m runtime.launcher --nnodes 1 --nproc-per-node 4 --max-restarts 2" in s
    assert "--rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1" in s      # one node: loopback only
    assert "-m runtime.train --plan" in s and "--checkpoint-every 2" in s and "--json-out /tmp/s.json" in s
    from planner.plan.errors import UsageError
    for bad, msg in ((["--nnodes", "3"], "needs --rdzv-endpoint"),
                     (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--nproc-per-node", "4"], "= 8"),
                     (["--max-restarts", "1"], "needs --checkpoint-dir"),
                     (["--inject-failure", "rank=4,step=1"], "not a rank of this 4-process plan")):
        with pytest.raises(UsageError, match=msg):
            _check_args(ap.parse_args([str(p), *bad]), plan)


def test_launch_names_the_failed_rank_from_torchrun_report(tmp_path):
    from planner.cli.cmd_launch import _failure
    from planner.plan.errors import CheckFailed, UsageError
    report = """Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 1)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 2)  (SIGKILL)
"""
    e = _failure(report, 1, "")
    assert isinstance(e, CheckFailed) and str(e).startswith("rank 3 failed (exit code -9 (SIGKILL))")
    e = _failure("runtime: rank 1: error: checkpoint x belongs to another model\n" + report, 1, "")
    assert isinstance(e, UsageError) and "rank 1: checkpoint x belongs to another model" in str(e)
