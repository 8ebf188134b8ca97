"""The runtime, proven with real gloo processes on the CPU (fp32).

Numerical equivalence: for every parallel layout the losses of the first steps equal the
one-process run of the same workload within 1e-5. The workload uses SGD with momentum and a
large learning rate: unlike Adam, SGD is not invariant to the scale of a gradient, so a
missing or doubled data-parallel average, a wrong expert-gradient scale or a lost tied
gradient changes the losses (a deliberately wrong expert scale moved them by 7e-5).

Checkpoints: saved under one plan, resumed under others (resharding on load), continuing
with equal losses; a crash while saving leaves the previous checkpoint complete and
loadable, and a run resumed from it matches the uninterrupted one.

All jobs run in one pool of 8 worker processes started once (``runtime.local.LocalPool``);
each job is its own gloo process group over the first ``world`` workers.
"""
from __future__ import annotations

import shutil
import time

import pytest

from runtime.local import JobFailed, LocalPool, make_plan
from runtime.train import Failure, Options

pytestmark = pytest.mark.multiproc

STEPS = 3
TOL = 1e-5
SGD_LR = 1.0


@pytest.fixture(scope="module")
def pool():
    holder = {"pool": LocalPool(8, timeout_s=150)}

    class Handle:
        def run(self, plan, opts, **kw):
            if not holder["pool"].alive:      # a test that kills a worker ends the pool
                holder["pool"] = LocalPool(8, timeout_s=150)
            return holder["pool"].run(plan, opts, **kw)

    yield Handle()
    holder["pool"].close()


_refs: dict = {}


def reference(pool, model: str, optimizer: str = "sgd", steps: int = STEPS, lr: float = SGD_LR) -> list[float]:
    """The one-process run of the workload: world 1, the whole batch as micro-batches of 1."""
    key = (model, optimizer, steps, lr)
    if key not in _refs:
        plan = make_plan(model, optimizer=optimizer, grad_accum=8)
        _refs[key] = pool.run(plan, Options(steps=steps, quiet=True, lr=lr))["losses"]
    return _refs[key]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


EQUIVALENCE = {
    # name: (model, parallel degrees and choices)
    "dp_zero0": ("tiny-llama", dict(dp=2, zero=0, grad_accum=4)),
    "dp_zero1": ("tiny-llama", dict(dp=2, zero=1, grad_accum=4)),
    "fsdp_zero2": ("tiny-llama", dict(dp=2, zero=2, grad_accum=4)),
    "fsdp_zero3_selective": ("tiny-llama", dict(dp=2, zero=3, grad_accum=4, recompute="selective")),
    "hsdp": ("tiny-llama", dict(dp=4, dp_shard=2, zero=3, grad_accum=2)),
    "tp": ("tiny-llama", dict(tp=2, grad_accum=8, recompute="full", recompute_layers=2)),
    "tp_sp": ("tiny-llama", dict(tp=2, sp=True, grad_accum=8, recompute="selective")),
    "pp_gpipe_uneven": ("tiny-llama", dict(pp=2, grad_accum=8, schedule="gpipe", stages=[1, 3])),
    "pp_1f1b_uneven": ("tiny-llama", dict(pp=2, grad_accum=8, schedule="1f1b", stages=[3, 1], recompute="full")),
    "pp_interleaved": ("tiny-llama", dict(pp=2, vpp=2, grad_accum=8, schedule="interleaved")),
    "ep": ("tiny-moe", dict(dp=2, ep=2, zero=3, grad_accum=4)),
    "ep_tp_sp": ("tiny-moe", dict(dp=2, ep=2, tp=2, sp=True, zero=1, grad_accum=4)),
    # a dense first layer then MoE layers with a shared expert, split over two stages
    "pp_ep_dense_first": ("tiny-moe-dense1", dict(pp=2, dp=2, ep=2, zero=1, grad_accum=4, schedule="1f1b",
                                                  stages=[1, 3])),
    "gpt_tied_pp_tp": ("tiny-gpt", dict(pp=2, tp=2, sp=True, grad_accum=8, schedule="1f1b")),
    "3d_pp2_dp2_tp2": ("tiny-llama", dict(pp=2, dp=2, tp=2, sp=True, zero=3, grad_accum=4, schedule="1f1b")),
}


@pytest.mark.parametrize("name", list(EQUIVALENCE))
def test_losses_equal_single_process(pool, name):
    model, par = EQUIVALENCE[name]
    plan = make_plan(model, optimizer="sgd", **par)
    t0 = time.perf_counter()
    got = pool.run(plan, Options(steps=STEPS, quiet=True, lr=SGD_LR))
    wall = time.perf_counter() - t0
    ref = reference(pool, model)
    assert got["steps"] == list(range(1, STEPS + 1))
    assert got["world_size"] == plan.world_size
    # the run trains: the loss moves by far more than the tolerance
    assert max(ref) - min(ref) > 100 * TOL
    d = max_diff(got["losses"], ref)
    print(f"{name}: world {plan.world_size}, max |loss - single| = {d:.2e}, wall {wall:.1f} s")
    assert d <= TOL, f"{name}: losses {got['losses']} vs single-process {ref} (max diff {d:.2e})"


def test_adamw_fsdp_equals_single_process(pool):
    """The optimizer the real runs use, on sharded DTensor parameters."""
    plan = make_plan("tiny-llama", optimizer="adamw", dp=2, zero=3, grad_accum=4)
    got = pool.run(plan, Options(steps=STEPS, quiet=True, lr=1e-2))["losses"]
    ref = reference(pool, "tiny-llama", optimizer="adamw", lr=1e-2)
    assert max_diff(got, ref) <= TOL


def test_another_seed_is_another_run(pool):
    a = pool.run(make_plan("tiny-llama", optimizer="sgd", dp=2, zero=0, grad_accum=4, seed=1),
                 Options(steps=1, quiet=True, lr=SGD_LR))["losses"]
    ref = reference(pool, "tiny-llama")
    assert abs(a[0] - ref[0]) > 1e-3      # another seed: another model and other tokens


# --------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------

def _copy_checkpoint(src_root, step: int, dst_root):
    from runtime.checkpoint import step_name
    dst_root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src_root / step_name(step), dst_root / step_name(step))
    return dst_root


def test_checkpoint_resumes_under_other_plans(pool, tmp_path):
    """Saved by tp=2 x dp=2 (FSDP, 4 processes) at step 4; resumed at step 5 by 2-process plans
    (tp=2 alone, and pp=2): losses of steps 5..8 equal the uninterrupted 4-process run."""
    ck = tmp_path / "ck"
    plan4 = make_plan("tiny-llama", optimizer="adamw", tp=2, dp=2, zero=3, grad_accum=4)
    full = pool.run(plan4, Options(steps=8, quiet=True, checkpoint_dir=str(ck), checkpoint_every=4))
    assert full["steps"] == list(range(1, 9))
    assert full["last_checkpoint_step"] == 8
    for name, plan2 in {"tp2": make_plan("tiny-llama", optimizer="adamw", tp=2, grad_accum=8),
                        "pp2": make_plan("tiny-llama", optimizer="adamw", pp=2, grad_accum=8)}.items():
        d = _copy_checkpoint(ck, 4, tmp_path / f"resume-{name}")
        got = pool.run(plan2, Options(steps=8, quiet=True, checkpoint_dir=str(d), resume=True))
        assert got["resumed_from_step"] == 4
        assert got["steps"] == list(range(1, 9))          # the history comes back with the checkpoint
        diff = max_diff(got["losses"][4:], full["losses"][4:])
        print(f"resume on {name}: steps 5-8 max |diff| = {diff:.2e}")
        assert diff <= 1e-4, (name, got["losses"], full["losses"])
        assert got["losses"][:4] == full["losses"][:4]


def test_tied_embedding_checkpoint_moves_between_one_and_two_stages(pool, tmp_path):
    """tiny-gpt ties its embedding and head: one tensor on one stage, two copies over two
    stages. Saved by dp=2 (one stage), resumed by pp=2 (the head's copy loads from the
    embedding) and the other way round, losses continue as in the uninterrupted run."""
    one = make_plan("tiny-gpt", optimizer="adamw", dp=2, zero=3, grad_accum=4)
    two = make_plan("tiny-gpt", optimizer="adamw", pp=2, grad_accum=8)
    for a, b in ((one, two), (two, one)):
        ck = tmp_path / f"ck-{a.parallel.pp}"
        full = pool.run(a, Options(steps=4, quiet=True, checkpoint_dir=str(ck), checkpoint_every=2))
        d = _copy_checkpoint(ck, 2, tmp_path / f"resume-{b.parallel.pp}")
        got = pool.run(b, Options(steps=4, quiet=True, checkpoint_dir=str(d), resume=True))
        assert got["resumed_from_step"] == 2
        assert max_diff(got["losses"][2:], full["losses"][2:]) <= 1e-4, (got["losses"], full["losses"])


def test_checkpoint_on_request(pool, tmp_path):
    """A ``save-now`` file in the checkpoint directory (or SIGUSR1 to any rank) asks for a
    checkpoint at the end of the current step; the request is then cleared."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "save-now").touch()
    got = pool.run(make_plan("tiny-llama", dp=2, zero=3, grad_accum=4),
                   Options(steps=3, quiet=True, checkpoint_dir=str(ck)))
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000001", "step-00000003"]   # asked, and the end
    assert not (ck / "save-now").exists() and got["last_checkpoint_step"] == 3


def test_checkpoint_of_another_model_is_refused(pool, tmp_path):
    ck = tmp_path / "ck"
    pool.run(make_plan("tiny-llama", dp=2, zero=3, grad_accum=4), Options(steps=1, quiet=True, checkpoint_dir=str(ck)))
    with pytest.raises(JobFailed) as e:
        pool.run(make_plan("tiny-gpt", dp=2, zero=3, grad_accum=4),
                 Options(steps=2, quiet=True, checkpoint_dir=str(ck), resume=True))
    msg = str(e.value)
    assert "CheckpointMismatch" in msg and "another model or workload" in msg and "tiny-gpt" in msg


def test_crash_while_saving_keeps_the_previous_checkpoint(pool, tmp_path):
    """Rank 1 dies after writing its shards of step 4 but before the commit: step 2 stays the
    newest complete checkpoint, the half-written one is never read, and a run resumed from
    step 2 matches the uninterrupted run."""
    from runtime.checkpoint import find_latest, read_meta
    plan = make_plan("tiny-llama", optimizer="adamw", dp=2, zero=3, grad_accum=4)
    ref = pool.run(plan, Options(steps=6, quiet=True))["losses"]
    ck = tmp_path / "ck"
    with pytest.raises(JobFailed) as e:
        pool.run(plan, Options(steps=6, quiet=True, checkpoint_dir=str(ck), checkpoint_every=2,
                               inject=Failure(rank=1, step=4, phase="save")))
    assert e.value.rank == 1
    tmp = ck / ".tmp-step-00000004"
    assert tmp.is_dir() and any(tmp.iterdir()), "the interrupted write left its partial shards"
    assert not (ck / "step-00000004").exists()
    assert (ck / "latest").read_text().strip() == "step-00000002"
    latest = find_latest(ck)
    assert latest == ck / "step-00000002" and read_meta(latest)["step"] == 2
    got = pool.run(plan, Options(steps=6, quiet=True, checkpoint_dir=str(ck), checkpoint_every=2, resume=True))
    assert got["resumed_from_step"] == 2
    assert max_diff(got["losses"], ref) <= 1e-6
    assert find_latest(ck) == ck / "step-00000006"
    assert not tmp.exists()    # the next save of step 4 replaced the partial write
