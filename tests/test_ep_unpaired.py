"""Megatron's EP overlap (``--overlap-moe-expert-parallel-comm``) hides one micro-batch's all-to-alls
behind another's compute only in its combined 1F1B steps; the warm-up's forwards and the cool-down's
backwards run alone (``costmodel.stage_terms.ep_unpaired_chunks``). Checked here: the count against
Megatron-Core's own warm-up rule walked rank by rank, the step against the same estimate without the
term, and the solver's tables against the estimate."""
from __future__ import annotations


import pytest

import costmodel.training as training
from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, Workload
from costmodel.stage_terms import ep_unpaired_chunks, ep_unpaired_s
from costmodel.training import estimate


def megatron_warmup(p: int, r: int, v: int, m: int, overlap: bool) -> int:
    """Megatron-Core d98e8a64 ``get_pp_rank_microbatches`` (interleaved, training): rank ``r``'s
    warm-up model chunks, capped at the step's ``m * v`` (``microbatch_group_size_per_vp_stage`` at
    its default, ``p``)."""
    total = m * v
    warm = (p - r - 1) * 2 + (v - 1) * p + (1 if overlap else 0)
    return min(warm, total)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 16, 240])
def test_the_count_is_megatrons_first_rank_warmup(p, v, m):
    ranks = [megatron_warmup(p, r, v, m, True) for r in range(p)]
    assert ep_unpaired_chunks(p, v, m) == ranks[0] == max(ranks)
    assert ep_unpaired_chunks(p, v, m) <= m * v


def test_without_pipelining_only_the_first_forward_and_last_backward_run_alone():
    assert ep_unpaired_chunks(1, 1, 8) == 1
    assert ep_unpaired_chunks(1, 1, 0) == 0
    # no combined 1F1B without virtual stages under PP (Megatron refuses the overlap there)
    assert ep_unpaired_chunks(4, 1, 8) == 0


def test_nothing_is_added_without_the_overlap():
    assert ep_unpaired_s(4, 4, 16, 58, 0.0) == 0.0
    assert ep_unpaired_s(4, 4, 16, 0, 1e-3) == 0.0
    # 19 chunks of 58 / 16 MoE layers, 1 ms hidden per layer
    assert ep_unpaired_s(4, 4, 16, 58, 1e-3) == pytest.approx(19 * 58 / 16 * 1e-3)


def _moe_case(overlap: bool):
    model = get_model("mixtral-8x7b")
    cluster = load_cluster("dgx-h100").with_gpus(64)
    wl = Workload(global_batch=64, seq_len=4096)
    par = ParallelConfig(tp=2, pp=4, vpp=2, dp=8, ep=8, zero=1, micro_batch=1, grad_accum=8, sp=True,
                         ep_overlap=overlap)
    return model, cluster, wl, par


def test_the_step_holds_the_unpaired_chunks_all_to_alls(monkeypatch):
    model, cluster, wl, par = _moe_case(True)
    with_term = estimate(model, cluster, wl, par, framework="megatron")
    monkeypatch.setattr(training, "ep_unpaired_s", lambda *a: 0.0)
    without = estimate(model, cluster, wl, par, framework="megatron")
    monkeypatch.undo()
    # the hidden time per MoE layer, from the same layer terms the estimate used
    hidden = max(sm.mesh.moe_terms.ep_hidden_s for sm in _stage_models(model, cluster, wl, par))
    assert hidden > 0
    extra = ep_unpaired_s(par.pp, par.vpp, par.grad_accum, model.moe_layers, hidden)
    assert with_term.step_time_s - without.step_time_s == pytest.approx(extra, rel=1e-9)
    assert with_term.time["bubble_s"] - without.time["bubble_s"] == pytest.approx(extra, rel=1e-9)
    # no overlap, nothing hidden, nothing added back
    model, cluster, wl, par0 = _moe_case(False)
    plain = estimate(model, cluster, wl, par0, framework="megatron")
    monkeypatch.setattr(training, "ep_unpaired_s", lambda *a: 0.0)
    assert estimate(model, cluster, wl, par0, framework="megatron").step_time_s == plain.step_time_s


def _stage_models(model, cluster, wl, par):
    from costmodel.comm import DEFAULT_ORDER
    from costmodel.frameworks import framework_profile
    from costmodel.stage_cache import _Shared
    from costmodel.stage_terms import StageModel
    sh = _Shared(model, cluster, wl, framework_profile("megatron"))
    grp = cluster.groups[0]
    return [StageModel(sh, par, tuple(DEFAULT_ORDER), grp)]


def test_the_solvers_tables_price_the_same_step():
    """The solver's objective (its integer tables, ``planner.search.problem.objective_value``) for an
    EP-overlapped interleaved candidate and its even split equals ``estimate``'s step: the term is in
    both (to the tables' nanosecond rounding)."""
    from costmodel.specs import default_stages
    from planner.search.problem import NS, Problem, objective_value
    from planner.search.space import enumerate_candidates
    model, cluster, wl, par = _moe_case(True)
    fixed = dict(tp=2, pp=4, vpp=2, ep=8, micro_batch=1, zero=1)
    cands = [c for c in enumerate_candidates(model, cluster, wl, fixed, 64, target="megatron")
             if c.par.ep_overlap and c.par.vpp == 2]
    assert cands, "no EP-overlapped interleaved candidate"
    checked = 0
    for cand in cands[:4]:
        prob = Problem(model, cluster, wl, "throughput", framework="megatron")
        tab = prob.tables(cand)
        ns = [s.num_layers for s in default_stages(model.layers, cand.par.pp)]
        gs = [cluster.groups[0].name] * cand.par.pp
        obj = objective_value(prob, cand, tab, ns, gs)
        if obj is None:
            continue
        est = estimate(model, cluster, wl, cand.par, order=cand.order, framework="megatron")
        assert obj == pytest.approx(est.step_time_s, abs=cand.par.pp * 4 / NS + 1e-9 * est.step_time_s)
        hidden_fill = ep_unpaired_s(cand.par.pp, cand.par.vpp, cand.par.grad_accum, model.moe_layers,
                                    max(sm.mesh.moe_terms.ep_hidden_s
                                        for sm in _stage_models(model, cluster, wl, cand.par)))
        assert hidden_fill > 0
        checked += 1
    assert checked
