"""``stage_cache.stage_cost`` (the estimate's memo of a stage kind's two cost parts, kept on the
stage's mesh) against the uncached rule: ``StageModel.cost`` on a fresh ``_Shared``, so that no
sub-term is served from a cache. A sweep of configurations that share meshes (ZeRO stage,
recompute, gradient overlap, virtual stages varied, as a search varies them) goes through one
``_Shared``, so later ones are answered from parts the earlier ones left; every answer must be
the uncached one exactly. Then each component of the two keys is dropped in turn: the sweep must
then find a wrong answer, so the keys hold what the parts read (and this test would see one
that did not)."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from costmodel import stage_cache
from costmodel.catalog import get_model
from costmodel.comm import DEFAULT_ORDER
from costmodel.files.clusters import load_cluster
from costmodel.frameworks import framework_profile
from costmodel.specs import ParallelConfig, SpecError, Workload, validate
from costmodel.stage_cache import _Shared, stage_cost
from costmodel.stage_terms import StageModel
from costmodel.training import estimate

# (model, cluster, GPUs, workload, base configuration, framework): dense and MoE (with MTP),
# two to sixteen stages (middle stages of 13 and 14 layers: llama-3-70b; first, middle and last of
# equal layers: llama-3-8b), HSDP, and Accelerate (whose engine, and so its overlaps, follows ZeRO)
CASES = [
    ("llama-3-70b", "dgx-h100", 48, dict(global_batch=512, seq_len=8192),
     dict(tp=4, pp=6, dp=2, sp=True, grad_accum=256), "generic"),
    ("llama-3.1-405b", "dgx-h100", 2048, dict(global_batch=2048, seq_len=8192),
     dict(tp=8, pp=16, dp=16, sp=True, vpp=4, grad_accum=128), "megatron"),
    ("deepseek-v3", "dgx-h100", 2048, dict(global_batch=4096, seq_len=4096),
     dict(tp=1, pp=16, dp=128, ep=64, grad_accum=32), "generic"),
    ("mixtral-8x7b", "dgx-h100", 32, dict(global_batch=256, seq_len=4096),
     dict(tp=2, pp=2, dp=8, ep=8, grad_accum=32, dp_shard=4), "torchtitan"),
    ("llama-3-8b", "dgx-h100", 16, dict(global_batch=64, seq_len=4096),
     dict(tp=1, pp=4, dp=4, grad_accum=16), "accelerate"),
]


def _sweep(model, cluster, wl, base: dict, micro_batches: tuple[int, ...] = ()) -> list[ParallelConfig]:
    """ZeRO stages, recompute modes, overlaps and virtual stages around ``base`` (and, given
    ``micro_batches``, each of those micro-batch sizes: meshes that share their model-state parts)."""
    p0 = ParallelConfig(**base)
    per_replica = wl.global_batch // p0.dp
    out = []
    for zero, rc, overlap, vpp, mb in itertools.product((0, 1, 2, 3), ("none", "selective", "full"), (True, False),
                                                        sorted({p0.vpp, 1}), micro_batches or (p0.micro_batch,)):
        try:
            if per_replica % mb:
                continue
            par = dataclasses.replace(p0, zero=zero, recompute=rc, overlap_dp_comm=overlap, vpp=vpp, schedule="",
                                      dp_shard=p0.dp_shard if zero == 3 else 0, micro_batch=mb,
                                      grad_accum=per_replica // mb)
            validate(model, cluster, wl, par)
        except SpecError:
            continue
        out.append(par)
    return out


def _kinds(sh, par):
    """The stage kinds of ``par``'s even split, as ``estimate`` costs them."""
    return sh.split(par, DEFAULT_ORDER)[4]


def _mismatches(name, cluster_name, gpus, wl, base, fw) -> int:
    """Sweep one case through one ``_Shared`` with ``stage_cost``; count the answers that differ
    from ``StageModel.cost`` on a fresh ``_Shared`` (and assert there were plenty of answers)."""
    model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
    workload, prof = Workload(**wl), framework_profile(fw)
    sh = _Shared(model, cluster, workload, prof)
    grp = cluster.groups[0]
    bad = answers = 0
    for par in _sweep(model, cluster, workload, base):
        for _, first, last, crosses, n, n_moe, n_full, _ in _kinds(sh, par):
            got = stage_cost(StageModel(sh, par, DEFAULT_ORDER, grp).place(first, last, crosses),
                             n - n_moe, n_moe, n_full)
            fresh = _Shared(model, cluster, workload, prof)
            want = StageModel(fresh, par, DEFAULT_ORDER, grp).place(first, last, crosses).cost(n - n_moe, n_moe, n_full)
            answers += 1
            bad += got != want
    assert answers >= 40, answers
    return bad


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "/" + c[5] for c in CASES])
def test_stage_cost_equals_the_uncached_rule(case):
    assert _mismatches(*case) == 0


def test_parts_are_shared_across_the_sweep():
    """The memo is used: on one mesh, the layers' part is computed once for the four ZeRO stages
    (and both overlaps), the model-state part once for the three recompute modes."""
    name, cluster_name, gpus, wl, base, fw = CASES[2]
    model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
    workload, prof = Workload(**wl), framework_profile(fw)
    sh = _Shared(model, cluster, workload, prof)
    answers = 0
    for par in _sweep(model, cluster, workload, base):
        for _, first, last, crosses, n, n_moe, n_full, _ in _kinds(sh, par):
            stage_cost(StageModel(sh, par, DEFAULT_ORDER, cluster.groups[0]).place(first, last, crosses),
                       n - n_moe, n_moe, n_full)
            answers += 1
    mesh = next(iter(sh.meshes.values()))
    assert len(sh.meshes) == 1
    assert 4 * len(mesh.layers_parts) <= answers and 3 * len(mesh.states_parts) <= answers, (
        answers, len(mesh.layers_parts), len(mesh.states_parts))


# the components of each key (by position) dropped together. The layers' compute time ``comp``
# (where ZeRO 2/3 overlap it) follows the counts in the model-state key; on one mesh it is a
# function of ``last`` (the output head's compute) and the layer counts, so each of those is
# dropped with it; the embedding's activations (the last component, first stage only) likewise
# go with ``first``
LAYERS_KEY = {"last": (0,), "selective": (1,), "n_dense": (2,), "n_moe": (3,), "r": (4,)}
STATES_KEY = {"first": (0, 10), "last": (1, 8), "zero": (2,), "deferred_sync": (3,), "overlaps": (4, 5),
              "n_dense": (6, 8), "n_moe": (7, 8)}


def _dropping(key_fn, drop):
    def broken(*args):
        return tuple(x for i, x in enumerate(key_fn(*args)) if i not in drop)
    return broken


@pytest.mark.parametrize("drop", LAYERS_KEY.values(), ids=list(LAYERS_KEY))
def test_a_layers_key_without_a_component_gives_wrong_answers(monkeypatch, drop):
    monkeypatch.setattr(stage_cache, "layers_key", _dropping(stage_cache.layers_key, drop))
    assert any(_mismatches(*case) for case in CASES)


@pytest.mark.parametrize("drop", STATES_KEY.values(), ids=list(STATES_KEY))
def test_a_states_key_without_a_component_gives_wrong_answers(monkeypatch, drop):
    monkeypatch.setattr(stage_cache, "states_key", _dropping(stage_cache.states_key, drop))
    assert any(_mismatches(*case) for case in CASES)


def test_rows_built_on_demand_agree_with_the_estimate():
    """``Estimate.stages`` is built when first read: its rows give the estimate's ``fits``, its
    fullest stage's memory and capacity, and the same rows every time; to_dict carries them."""
    model, cluster = get_model("llama-3.1-405b"), load_cluster("dgx-h100").with_gpus(2048)
    wl = Workload(global_batch=2048, seq_len=8192)
    seen = set()
    for rc, zero in itertools.product(("none", "full"), (0, 1, 3)):
        par = ParallelConfig(tp=8, pp=16, dp=16, sp=True, grad_accum=128, recompute=rc, zero=zero)
        est = estimate(model, cluster, wl, par)
        rows = est.stages
        assert est.stages is rows and len(rows) == 16
        assert est.fits == all(s.fits for s in rows)
        fullest = max(rows, key=lambda s: s.memory["peak_bytes"] / s.capacity_bytes)
        assert est.memory == fullest.memory and est.capacity_bytes == fullest.capacity_bytes
        assert est.to_dict()["stages"] == [s.to_dict() for s in rows]
        seen.add(est.fits)
    assert seen == {True, False}        # both answers of fits were checked


def _rows_agree(est) -> None:
    rows = est.stages
    assert est.fits == all(s.fits for s in rows)
    fullest = max(rows, key=lambda s: s.memory["peak_bytes"] / s.capacity_bytes)
    assert est.memory == fullest.memory and est.capacity_bytes == fullest.capacity_bytes


@pytest.mark.parametrize("schedule,vpp,batch", [("1f1b", 1, 512), ("interleaved", 2, 512), ("gpipe", 1, 32)])
def test_fullest_stage_from_each_kinds_first_stage(schedule, vpp, batch):
    """Where the micro-batches in flight fall along the pipeline, the estimate finds ``fits`` and
    the fullest stage from each kind's first stage: the same answer as every stage's row, on
    uneven splits with per-stage recompute too (kinds that recur further down the pipeline)."""
    from costmodel.specs import StageSpec
    model, cluster = get_model("llama-3-70b"), load_cluster("dgx-h100").with_gpus(64)
    wl = Workload(global_batch=batch, seq_len=8192)
    seen = set()
    for mb, rc in itertools.product((1, 2, 4), ("none", "selective", "full")):
        par = ParallelConfig(tp=4, pp=8, dp=2, sp=True, micro_batch=mb, grad_accum=batch // 2 // mb, recompute=rc,
                             vpp=vpp, schedule=schedule)
        _rows_agree(estimate(model, cluster, wl, par))
        ns = [9, 10, 10, 11, 10, 10, 10, 10]
        stages = tuple(StageSpec(first_layer=sum(ns[:i]), num_layers=n, recompute_layers=(n if i % 3 else 0))
                       for i, n in enumerate(ns))
        est = estimate(model, cluster, wl, par, stages=stages)
        _rows_agree(est)
        seen.add(est.fits)
    assert seen == {True, False}


def test_growing_inflight_checks_every_stage(monkeypatch):
    """Were the micro-batches in flight to grow along the pipeline (no schedule priced today), the
    estimate checks every stage: here they grow up to the second-to-last stage (a middle stage
    that is not its kind's first), which is the fullest."""
    monkeypatch.setattr(stage_cache, "inflight_microbatches", lambda par, i: float(i + 1) if i < par.pp - 1 else 0.0)
    monkeypatch.setattr(stage_cache, "_SHARED_BY_ID", {})
    stage_cache._shared_equal.cache_clear()
    try:
        model, cluster = get_model("llama-3-70b"), load_cluster("dgx-h100").with_gpus(64)
        par = ParallelConfig(tp=4, pp=8, dp=2, sp=True, grad_accum=256)
        est = estimate(model, cluster, Workload(global_batch=512, seq_len=8192), par)
        _rows_agree(est)
        assert est.memory == est.stages[-2].memory and est.memory != est.stages[1].memory
    finally:
        stage_cache._shared_equal.cache_clear()


@pytest.mark.parametrize("pp", [1, 16])
def test_an_estimate_with_rows_not_yet_built_pickles(pp):
    """What ``Estimate.rows`` holds until read (a ``partial`` of module-level names) pickles, and
    the copy's rows are the original's."""
    import pickle
    model, cluster = get_model("llama-3.1-405b"), load_cluster("dgx-h100").with_gpus(128 * pp)
    par = ParallelConfig(tp=8, pp=pp, dp=16, sp=True, grad_accum=8, recompute="full")
    est = estimate(model, cluster, Workload(global_batch=128, seq_len=8192), par)
    copy = pickle.loads(pickle.dumps(est))
    assert callable(est.rows) and copy == est and copy.to_dict() == est.to_dict()


def test_layer_numels_memo_equals_the_rule():
    """``_Shared.layer_numels`` (Megatron's bucket counts read it per stage model) against the
    function it memoizes, for dense and MoE models and the TP/EP degrees a search varies."""
    from costmodel.stage_terms import megatron_layer_numels
    for name, degrees in (("llama-3-70b", [(1, 1, None), (4, 1, None), (8, 1, None)]),
                          ("deepseek-v3", [(1, 64, None), (2, 8, 1), (4, 32, 2)])):
        model, cluster = get_model(name), load_cluster("dgx-h100")
        sh = _Shared(model, cluster, Workload(global_batch=64, seq_len=4096), framework_profile("megatron"))
        for tp, ep, etp in degrees * 2:            # the second pass is served from the memo
            assert sh.layer_numels(tp, ep, etp) == megatron_layer_numels(model, tp, ep, etp)
        assert len(sh.numels) == len(degrees)


# ---- Speed6: the stage model's settings, the kind's exposed DP time, Megatron's end tensors ----

def _fresh_kind(model, cluster, workload, prof, par, grp, first, last, crosses, n_dense, n_moe, r):
    """The uncached rule: a placed ``StageModel`` on a fresh ``_Shared`` (no sub-term cached) and its cost."""
    sm = StageModel(_Shared(model, cluster, workload, prof), par, DEFAULT_ORDER, grp).place(first, last, crosses)
    return sm, sm.cost(n_dense, n_moe, r)


def _kind_mismatches(name, cluster_name, gpus, wl, base, fw, micro_batches: tuple[int, ...] = ()) -> int:
    """Sweep one case through one ``_Shared`` with ``stage_cache.kind_cost`` at several stage
    indices of each kind; count the answers (cost, exposed DP time, summed states) that differ
    from the uncached rule (``StageModel.cost``, ``dp_exposed`` and ``states_bytes`` on a fresh
    ``_Shared``). ``fw`` may be a profile (a changed one, to reach what no shipped profile does)."""
    model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
    workload, prof = Workload(**wl), framework_profile(fw)
    sh = _Shared(model, cluster, workload, prof)
    grp = cluster.groups[0]
    bad = answers = 0
    for par in _sweep(model, cluster, workload, base, micro_batches):
        for _, first, last, crosses, n, n_moe, n_full, i0 in _kinds(sh, par):
            fresh, want = _fresh_kind(model, cluster, workload, prof, par, grp, first, last, crosses,
                                      n - n_moe, n_moe, n_full)
            for index in sorted({i0, 0, 1, par.pp - 1}):
                sm = StageModel(sh, par, DEFAULT_ORDER, grp).place(first, last, crosses)
                got = stage_cache.kind_cost(sm, n - n_moe, n_moe, n_full, index)
                answers += 1
                bad += got != (want, fresh.dp_exposed(want, index), want.states_bytes)
    assert answers >= 40, answers
    return bad


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "/" + c[5] for c in CASES])
def test_kind_cost_equals_the_uncached_rule(case):
    assert _kind_mismatches(*case) == 0


# a profile no shipped one is (their gradient and gather overlaps agree): the gather overlapped, the
# gradients not, so the exposed DP time differs where only the gather overlap does
_GATHER_ONLY = dataclasses.replace(framework_profile("generic"), name="generic-gather-only", overlap_grad_reduce=False)
EXPOSED_CASES = [c for c in CASES if c[5] == "generic"] + [CASES[0][:5] + (_GATHER_ONLY,)]


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "/" + c[5] for c in CASES])
def test_kind_cost_across_micro_batches_equals_the_uncached_rule(case):
    """The meshes of several micro-batch sizes share their model-state parts (``_Shared.mesh``,
    ``stage_cache.states_key``): still the uncached rule, answer by answer."""
    assert _kind_mismatches(*case, micro_batches=(1, 2, 4)) == 0


# the states key's components read from the micro-batch's terms: only a sweep over micro-batches
# (meshes sharing one memo) can miss them
STATES_KEY_MB = {"comp": (8,), "embed": (10,)}


@pytest.mark.parametrize("drop", STATES_KEY_MB.values(), ids=list(STATES_KEY_MB))
def test_a_states_key_without_a_micro_batch_term_gives_wrong_answers(monkeypatch, drop):
    monkeypatch.setattr(stage_cache, "states_key", _dropping(stage_cache.states_key, drop))
    assert any(_kind_mismatches(*case, micro_batches=(1, 2, 4)) for case in CASES)


def test_kind_cost_with_a_gather_only_overlap_equals_the_uncached_rule():
    assert _kind_mismatches(*EXPOSED_CASES[-1]) == 0


# FSDP2's ZeRO-2 gathers before every micro-batch's forward, overlapped or not by the gather overlap
# (StageModel.states_part): the states key holds it, which only a gather-only profile can tell apart
_FSDP2_GATHER_ONLY = dataclasses.replace(_GATHER_ONLY, name="fsdp2-gather-only", fsdp2_copies=True)


_GRAD_ONLY = dataclasses.replace(framework_profile("generic"), name="generic-grad-only", overlap_param_gather=False)


@pytest.mark.parametrize("profile, drop", [(_FSDP2_GATHER_ONLY, (5,)), (_GRAD_ONLY, (4,))], ids=["gather", "grad"])
def test_a_states_key_without_one_overlap_gives_wrong_answers(monkeypatch, profile, drop):
    """Each overlap apart, on a profile where only that one follows the plan's DP overlap."""
    case = CASES[0][:5] + (profile,)
    assert _kind_mismatches(*case) == 0
    monkeypatch.setattr(stage_cache, "states_key", _dropping(stage_cache.states_key, drop))
    assert _kind_mismatches(*case)


EXPOSED_KEY = {"states": (0,), "index": (2,)}


@pytest.mark.parametrize("drop", EXPOSED_KEY.values(), ids=list(EXPOSED_KEY))
def test_an_exposed_key_without_a_component_gives_wrong_answers(monkeypatch, drop):
    monkeypatch.setattr(stage_cache, "exposed_key", _dropping(stage_cache.exposed_key, drop))
    assert any(_kind_mismatches(*case) for case in EXPOSED_CASES)


def _settings_mismatches(name, cluster_name, gpus, wl, base, fw) -> int:
    """``StageModel``'s attributes when its settings come from ``StageMesh.settings`` (a sweep
    through one ``_Shared``) against a ``StageModel`` on a fresh ``_Shared``."""
    from costmodel.stage_terms import _SETTINGS
    model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
    workload, prof = Workload(**wl), framework_profile(fw)
    sh = _Shared(model, cluster, workload, prof)
    grp = cluster.groups[0]
    bad = answers = 0
    for par in _sweep(model, cluster, workload, base):
        got = StageModel(sh, par, DEFAULT_ORDER, grp)
        want = StageModel(_Shared(model, cluster, workload, prof), par, DEFAULT_ORDER, grp)
        for name_ in _SETTINGS + ("selective", "first", "last", "pp_comm_s", "ends_params"):
            answers += 1
            bad += getattr(got, name_) != getattr(want, name_)
    # 16: wrap_block_s and wrap_param_s read par.dp, tp_host_s par.tp (the layout), the group's GPU and
    # the framework only
    assert answers >= 40 and len(_SETTINGS) == 16, answers
    return bad


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "/" + c[5] for c in CASES])
def test_stage_model_settings_equal_the_uncached_rule(case):
    assert _settings_mismatches(*case) == 0


def test_settings_shared_across_micro_batches_equal_the_uncached_rule():
    """The meshes of one layout share their settings whatever their micro-batch
    (``_Shared.layouts``): a sweep over micro-batches, ZeRO stages and overlaps through one
    ``_Shared`` gives every stage model's settings as a fresh ``_Shared`` does, and makes one entry
    per ZeRO stage and overlap for all its meshes."""
    from costmodel.stage_terms import _SETTINGS
    for name, cluster_name, gpus, wl, base, fw in CASES:
        model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
        workload, prof = Workload(**wl), framework_profile(fw)
        sh = _Shared(model, cluster, workload, prof)
        grp = cluster.groups[0]
        p0 = ParallelConfig(**base)
        per_replica = workload.global_batch // p0.dp
        pars = []
        for mb, zero, overlap in itertools.product((1, 2, 4), (0, 1, 2, 3), (True, False)):
            try:
                par = dataclasses.replace(p0, micro_batch=mb, grad_accum=per_replica // mb, zero=zero,
                                          overlap_dp_comm=overlap, dp_shard=p0.dp_shard if zero == 3 else 0)
                validate(model, cluster, workload, par)
            except SpecError:
                continue
            pars.append(par)
        for par in pars:
            got = StageModel(sh, par, DEFAULT_ORDER, grp)
            want = StageModel(_Shared(model, cluster, workload, prof), par, DEFAULT_ORDER, grp)
            assert [getattr(got, k) for k in _SETTINGS] == [getattr(want, k) for k in _SETTINGS], (name, par)
        # one settings memo per layout (here: per ZeRO-3 shard group), for all its micro-batches' meshes
        assert len(sh.layouts) == len({p.dp_shard for p in pars}) < len(sh.meshes)
        assert sum(len(settings) for settings, _ in sh.layouts.values()) == len({(p.zero, p.overlap_dp_comm)
                                                                                for p in pars})


def test_settings_are_shared_across_recompute():
    """The settings memo is used: one entry per ZeRO stage and overlap on the sweep's one mesh."""
    name, cluster_name, gpus, wl, base, fw = CASES[2]
    model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
    sh = _Shared(model, cluster, Workload(**wl), framework_profile(fw))
    pars = _sweep(model, cluster, Workload(**wl), base)
    for par in pars:
        StageModel(sh, par, DEFAULT_ORDER, cluster.groups[0])
    (mesh,) = sh.meshes.values()
    assert len(mesh.settings) == len({(p.zero, p.overlap_dp_comm) for p in pars}) < len(pars)


STAGE_MODEL_KEY = {"zero": (0,), "overlap_dp_comm": (1,)}


@pytest.mark.parametrize("drop", STAGE_MODEL_KEY.values(), ids=list(STAGE_MODEL_KEY))
def test_a_stage_model_key_without_a_component_gives_wrong_answers(monkeypatch, drop):
    from costmodel import stage_terms
    monkeypatch.setattr(stage_terms, "stage_model_key", _dropping(stage_terms.stage_model_key, drop))
    assert any(_settings_mismatches(*case) for case in CASES)


def test_megatron_end_tensors_and_buckets_equal_the_rule():
    """``_Shared.ends_tensors`` and ``_Shared.stage_buckets`` (Megatron's bucket count per stage)
    against the functions they memoize, for every placement, layer count and virtual stages."""
    from costmodel.layers import ends_params
    from costmodel.stage_terms import megatron_stage_buckets
    for name, tp, pp, ep in (("llama-3-70b", 4, 8, 1), ("deepseek-v3", 1, 16, 64), ("llama-3.1-405b", 8, 16, 1)):
        model, cluster = get_model(name), load_cluster("dgx-h100").with_gpus(tp * pp * 8)
        wl = Workload(global_batch=512, seq_len=4096)
        sh = _Shared(model, cluster, wl, framework_profile("megatron"))
        checked = 0
        for _ in range(2):                  # the second pass is served from the memo
            for first, last, vpp, overlap in itertools.product((True, False), (True, False), (1, 2), (True, False)):
                par = ParallelConfig(tp=tp, pp=pp, dp=8, ep=ep, sp=tp > 1, grad_accum=512 // 8, vpp=vpp,
                                     overlap_dp_comm=overlap)
                sm = StageModel(sh, par, DEFAULT_ORDER, cluster.groups[0]).place(first, last, False)
                e = ends_params(model, tp, pp, first, last)
                ends, emb = tuple(x for x in (e.head, e.norm) if x > 0), e.embedding
                assert sm._ends_tensors() == (ends, emb)
                numels, size = sm.megatron_buckets
                for layers in (2, 4, 5):
                    assert sh.stage_buckets(sm, layers) == megatron_stage_buckets(numels, layers, ends, emb, size,
                                                                                  first, vpp)
                    checked += 1
        assert checked == 2 * 16 * 3 and len(sh.end_tensors) == 4


def _all_cache_sizes() -> list[int]:
    sizes = []
    for sh in list(stage_cache._ALL_SHARED):
        sizes += [len(sh.end_tensors), len(sh.buckets)]
        for mesh in sh.meshes.values():
            sizes += [len(mesh.layers_parts), len(mesh.states_parts), len(mesh.exposed_parts), len(mesh.settings)]
    return sizes


def test_clear_stage_costs_clears_every_cache_and_changes_no_answer():
    """After a sweep every Speed6 cache holds entries; ``clear_stage_costs`` empties them all, and
    the sweep then gives the same estimates (every float) from cold caches, configuration by
    configuration (each one priced right after a clear, so nothing is served from another)."""
    model, cluster = get_model("deepseek-v3"), load_cluster("dgx-h100").with_gpus(2048)
    wl = Workload(global_batch=4096, seq_len=4096)
    pars = _sweep(model, cluster, wl, dict(tp=1, pp=16, dp=128, ep=64, grad_accum=32))
    stage_cache.clear_stage_costs()
    warm = [estimate(model, cluster, wl, par, framework="megatron").to_dict() for par in pars]
    sh = stage_cache._shared(model, cluster, wl, framework_profile("megatron"))
    mesh = next(iter(sh.meshes.values()))
    assert all((mesh.layers_parts, mesh.states_parts, mesh.exposed_parts, mesh.settings, sh.end_tensors, sh.buckets))
    stage_cache.clear_stage_costs()
    assert not any(_all_cache_sizes())
    cold = []
    for par in pars:
        stage_cache.clear_stage_costs()
        cold.append(estimate(model, cluster, wl, par, framework="megatron").to_dict())
    assert cold == warm and repr(cold) == repr(warm)


def test_clear_stage_costs_reaches_a_shared_built_directly():
    """A ``_Shared`` that ``estimate`` never looked up (built directly, as the tests here do, or
    dropped from the identity table) is cleared too."""
    name, cluster_name, gpus, wl, base, fw = CASES[1]
    model, cluster = get_model(name), load_cluster(cluster_name).with_gpus(gpus)
    sh = _Shared(model, cluster, Workload(**wl), framework_profile(fw))
    par = ParallelConfig(**base)
    sm = StageModel(sh, par, DEFAULT_ORDER, cluster.groups[0])
    for _, first, last, crosses, n, n_moe, n_full, i0 in _kinds(sh, par):
        stage_cache.kind_cost(sm.place(first, last, crosses), n - n_moe, n_moe, n_full, i0)
    assert sh not in stage_cache._SHARED_BY_ID.values()
    assert sm.mesh.exposed_parts and sm.mesh.settings and sh.buckets and sh.end_tensors
    stage_cache.clear_stage_costs()
    assert not (sm.mesh.layers_parts or sm.mesh.states_parts or sm.mesh.exposed_parts or sm.mesh.settings
                or sh.buckets or sh.end_tensors)
