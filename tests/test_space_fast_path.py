"""The search space's fast path: ``space.with_recompute_layers`` copies a checked configuration
with another Megatron recompute count N instead of checking it again. The candidates must be
exactly those of the checked construction (``dataclasses.replace``, which runs every check)."""
from __future__ import annotations

import dataclasses

import pytest

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, SpecError, Workload
from planner.search import space


def _slow(par: ParallelConfig, n: int) -> ParallelConfig:
    return dataclasses.replace(par, recompute_layers=n)


@pytest.mark.parametrize("model,gpus,gb,seq,target", [
    ("llama-3-70b", 64, 512, 8192, "megatron"),
    ("llama-3-8b", 16, 128, 4096, "megatron"),
    ("mixtral-8x7b", 32, 256, 4096, "megatron"),
    ("llama-3-70b", 64, 512, 8192, "accelerate"),
    ("llama-3-70b", 64, 512, 8192, None),
])
def test_candidates_equal_the_checked_construction(monkeypatch, model, gpus, gb, seq, target):
    m, cl, wl = get_model(model), load_cluster("dgx-h100").with_gpus(gpus), Workload(global_batch=gb, seq_len=seq)
    fast = space.enumerate_candidates(m, cl, wl, {}, gpus, target=target)
    monkeypatch.setattr(space, "with_recompute_layers", _slow)
    slow = space.enumerate_candidates(m, cl, wl, {}, gpus, target=target)
    assert fast == slow
    assert [hash(c.par) for c in fast] == [hash(c.par) for c in slow]
    if target == "megatron":
        assert sum(c.par.recompute_layers > 0 for c in fast) > 100      # the fast path ran


def test_a_copy_forgets_what_was_cached_from_the_old_count():
    par = ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=1)
    hash(par)
    new = space.with_recompute_layers(par, 3)
    assert new.recompute_layers == 3 and par.recompute_layers == 1
    assert new == ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=3)
    assert hash(new) == hash(ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=3))


def test_an_invalid_count_is_still_refused():
    par = ParallelConfig(tp=2, pp=4, dp=2, recompute="full", recompute_layers=1)
    with pytest.raises(SpecError):
        space.with_recompute_layers(par, 10**9)
