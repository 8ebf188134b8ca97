"""``planner.search.satmodel`` (OR-Tools' model without cp_model's numpy/pandas import) against
``cp_model`` itself: the pipeline models of real candidates built through either are the same
proto, field for field (their text formats equal), and ``cp_model.CpSolver`` solves them to the same status and objective."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest
from ortools.sat.python import cp_model

from costmodel.catalog import get_model
from costmodel.specs import Workload, default_stages
from costmodel.files.clusters import load_cluster
from planner.search import satmodel
from planner.search.cpsat import PipelineModel
from planner.search.problem import Problem
from planner.search.space import enumerate_candidates

pytestmark = pytest.mark.solver     # these tests run CP-SAT

CASES = [  # (model, cluster, GPUs, global batch, seq, objective)
    ("llama-3-8b", "dgx-h100", 32, 256, 4096, "throughput"),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, "throughput"),
    ("llama-3-70b", "dgx-h100", 64, 512, 8192, "memory"),
    ("deepseek-v3", "dgx-h100", 256, 1024, 4096, "throughput"),    # dense first layers: buckets
]


def _models(case, seed):
    name, cl, gpus, gb, seq, objective = case
    model, cluster = get_model(name), load_cluster(cl).with_gpus(gpus)
    wl = Workload(global_batch=gb, seq_len=seq)
    prob = Problem(model, cluster, wl, objective)
    cands = [c for c in enumerate_candidates(model, cluster, wl, {}, gpus, objective) if c.par.pp > 1]
    rng = random.Random(seed)
    mem = objective == "memory"
    for cand in rng.sample(cands, min(6, len(cands))):
        tab = prob.tables(cand, memory_objective=mem)
        for cutoff in (None, 1e9) if not mem else (None,):
            yield cand, tab, mem, cutoff, prob


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{c[5]}" for c in CASES])
def test_same_proto_and_same_solution_as_cp_model(case):
    built = 0
    for cand, tab, mem, cutoff, prob in _models(case, seed=len(case[0])):
        ours = PipelineModel(prob, cand, tab, mem, cutoff=cutoff)
        theirs = PipelineModel(prob, cand, tab, mem, cutoff=cutoff, model_class=cp_model.CpModel)
        assert isinstance(ours.m, satmodel.SatModel)
        assert ours.ok == theirs.ok
        if not ours.ok:
            continue
        # the even split as cpsat_one hints it, on both: the protos must match with it
        hint = [s.num_layers for s in default_stages(prob.model.layers, cand.par.pp)]
        got, status = ours.solve(5.0, hint=hint)
        theirs.solve(5.0, hint=hint)          # adds the same hint to the cp_model model
        assert str(ours.m.proto) == str(theirs.m.proto)     # the text format, every field
        assert len(ours.m.proto.constraints) > 0 and "exactly_one" in str(ours.m.proto)
        assert ours.m.proto.solution_hint.vars, "the hint reached the proto"
        ref = cp_model.CpSolver()
        ref.parameters.max_time_in_seconds = 5.0
        ref.parameters.num_workers = 1
        ref.parameters.cp_model_presolve = False
        ref_status = ref.solve(theirs.m)
        assert status == ref_status
        assert status in (satmodel.OPTIMAL, satmodel.INFEASIBLE)
        if status == satmodel.OPTIMAL:
            assert got.response.objective_value == ref.objective_value
            assert got.best_objective_bound == ref.best_objective_bound
            assert sum(ours.read(got)[0]) == prob.model.layers
        built += 1
    assert built >= 3


def test_status_constants_are_cp_models():
    assert (satmodel.OPTIMAL, satmodel.FEASIBLE, satmodel.INFEASIBLE, satmodel.MODEL_INVALID) == \
        (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.INFEASIBLE, cp_model.MODEL_INVALID)
    assert satmodel.MODEL is satmodel.SatModel, "this OR-Tools version should take the fast path"


def test_a_settled_comparison_is_cp_models_too():
    """A group sum over no variables compared to a count is a Python bool: always true or never."""
    for ct in (True, False):
        ours, theirs = satmodel.SatModel(), cp_model.CpModel()
        for m in (ours, theirs):
            m.add(m.new_bool_var("x") == 1)
            m.add(ct)
        assert str(ours.proto) == str(theirs.proto)
        assert satmodel.solve(ours, 5.0).status == (satmodel.OPTIMAL if ct else satmodel.INFEASIBLE)


def test_a_non_linear_add_is_refused():
    with pytest.raises(TypeError, match="linear"):
        satmodel.SatModel().add("x")


@pytest.mark.subprocess
def test_the_search_does_not_import_pandas():
    code = ("import sys; from planner.search.bnb import solve; from costmodel.catalog import get_model; "
            "from costmodel.files.clusters import load_cluster; from costmodel.specs import Workload; "
            "m = get_model('llama-3-8b'); c = load_cluster('dgx-h100').with_gpus(16); "
            "r = solve(m, c, Workload(global_batch=64, seq_len=4096), {'pp': 2}); "
            "print(r.solved > 0, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
