"""``planner plan --mode infer``: the JSON contract, the solver against brute force, plan files,
emitters, and bad input with its exit codes."""
from __future__ import annotations

import json
import math

import pytest

from planner.cli import main

pytestmark = pytest.mark.solver     # these tests run the search (CP-SAT)

# the serving search itself, over every split it knows (`--target all`, the default, is tested in test_targets)
BASE = ["plan", "--mode", "infer", "--target", "generic", "--model", "llama-3-70b", "--cluster", "dgx-h100",
        "--gpus", "8", "--prompt-len", "1000", "--output-len", "200"]
ESTIMATE_KEYS = {"ttft_s", "tpot_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu", "max_batch",
                 "kv_cache_bytes_per_gpu", "memory", "time"}
MEMORY_KEYS = {"peak_bytes", "weights_bytes", "kv_cache_bytes", "activations_bytes", "other_bytes"}


def run_json(capsys, *extra) -> tuple[int, dict]:
    rc = main(BASE + list(extra) + ["--json"]) if "--model" not in extra else main(list(extra) + ["--json"])
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else {})


def test_json_envelope_contract(capsys):
    rc, d = run_json(capsys, "--top", "2")
    assert rc == 0
    assert set(d) == {"status", "plans", "solver"}
    assert d["status"] == d["solver"]["status"] == "OPTIMAL"
    assert {"status", "objective", "bound", "wall_time_s", "candidates"} <= set(d["solver"])
    assert d["solver"]["objective"] == pytest.approx(d["plans"][0]["estimate"]["output_tokens_per_s_per_gpu"])
    assert d["solver"]["bound"] >= d["solver"]["objective"] - 1e-3
    assert len(d["plans"]) == 2
    for p in d["plans"]:
        assert {"parallel", "estimate", "stages", "mesh"} <= set(p)
        assert ESTIMATE_KEYS <= set(p["estimate"])
        assert set(p["estimate"]["memory"]) == MEMORY_KEYS
        par = p["parallel"]
        assert par["tp"] * par["pp"] * par["dp"] == 8
        assert p["estimate"]["memory"]["peak_bytes"] <= 80 * 2**30
        assert p["serving"]["batch_per_replica"] <= p["estimate"]["max_batch"]
    degrees = [tuple(p["parallel"][k] for k in ("tp", "pp", "dp", "ep")) for p in d["plans"]]
    assert len(set(degrees)) == 2                                   # distinct splits
    a, b = (p["estimate"]["output_tokens_per_s_per_gpu"] for p in d["plans"])
    assert a >= b


def test_cpsat_choice_equals_brute_force_over_the_same_candidates():
    from costmodel.catalog import get_model
    from costmodel.specs import Workload
    from planner.search.serving import solve_serving
    from planner.search.serving_space import enumerate_candidates
    from costmodel.files.clusters import load_cluster
    m, c = get_model("mixtral-8x7b"), load_cluster("dgx-h100").with_gpus(8)
    w = Workload(global_batch=1, seq_len=2500, mode="infer", prompt_len=2000, output_len=500, kv_dtype="bf16")
    cap = c.gpu.memory_bytes
    space = enumerate_candidates(m, c, w, {}, None, 512)
    cands = space[0]
    for slo in ((None, None), (0.5, 0.030), (0.3, 0.015)):
        res = solve_serving(m, c, w, {}, ttft_slo_s=slo[0], tpot_slo_s=slo[1], batch_limit=512, candidates=space)
        ok = [x for x in cands if x.est.peak_bytes <= cap and (slo[0] is None or x.est.ttft_s <= slo[0])
              and (slo[1] is None or x.est.tpot_s <= slo[1])]
        best = max(x.est.output_tokens_per_s_per_gpu for x in ok)
        assert res.status == "OPTIMAL"
        assert res.objective == pytest.approx(best, rel=1e-6), slo
        chosen = res.solutions[0]
        if slo[0] is not None:
            assert chosen.est.ttft_s <= slo[0] and chosen.est.tpot_s <= slo[1]
        ref = solve_serving(m, c, w, {}, ttft_slo_s=slo[0], tpot_slo_s=slo[1], batch_limit=512, candidates=space,
                            exhaustive=True, top=3)
        top = solve_serving(m, c, w, {}, ttft_slo_s=slo[0], tpot_slo_s=slo[1], batch_limit=512, candidates=space,
                            top=3)
        assert [s.est.output_tokens_per_s_per_gpu for s in top.solutions] == pytest.approx(
            [s.est.output_tokens_per_s_per_gpu for s in ref.solutions], rel=1e-6)
    # ep is searched for a MoE model
    assert any(x.ep > 1 for x in cands)


def test_slo_and_fixed_dimensions_are_respected(capsys):
    rc, free = run_json(capsys)
    rc2, d = run_json(capsys, "--ttft-slo-ms", "400", "--tpot-slo-ms", "30")
    assert rc == rc2 == 0
    e = d["plans"][0]["estimate"]
    assert e["ttft_s"] <= 0.4 and e["tpot_s"] <= 0.03
    assert e["output_tokens_per_s_per_gpu"] <= free["plans"][0]["estimate"]["output_tokens_per_s_per_gpu"]
    rc, d = run_json(capsys, "--tp", "4", "--dp", "2")
    assert rc == 0
    p = d["plans"][0]["parallel"]
    assert (p["tp"], p["pp"], p["dp"]) == (4, 1, 2)


def test_fixed_batch_minimizes_latency(capsys):
    rc, d = run_json(capsys, "--batch", "16", "--top", "3")
    assert rc == 0
    assert d["solver"]["objective_name"] == "request_latency_s"
    lats = [p["estimate"]["request_latency_s"] for p in d["plans"]]
    assert lats == sorted(lats)
    assert all(p["serving"]["batch_per_replica"] == 16 for p in d["plans"])
    assert d["plans"][0]["parallel"]["tp"] == 8                    # lowest latency: all 8 GPUs in one TP group


def test_plan_file_round_trip_and_vllm_emitter(tmp_path, capsys):
    from emitters import vllm
    from planner.plan.planfile import read_plan
    out = tmp_path / "infer_plan.yaml"
    rc = main(BASE + ["--batch", "32", "--out", str(out), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    plan = read_plan(out)
    assert plan.mode == "infer"
    w = plan.workload
    assert (w.mode, w.prompt_len, w.output_len, w.seq_len, w.global_batch) == ("infer", 1000, 200, 1200, 32)
    assert plan.parallel.dp * plan.parallel.tp * plan.parallel.pp == plan.world_size == 8
    assert plan.estimate["tpot_s"] == pytest.approx(d["plans"][0]["estimate"]["tpot_s"])
    assert set(plan.estimate["memory"]) >= MEMORY_KEYS
    files = vllm.emit(plan)
    text = files["vllm.sh"]
    assert f"--tensor-parallel-size {plan.parallel.tp}" in text.replace("\n", " ").replace("  ", " ") or \
        str(plan.parallel.tp) in text
    assert "--max-model-len" in text and "1200" in text and "--max-num-seqs" in text
    util = plan.estimate["memory"]["peak_bytes"] / plan.cluster.gpu.memory_bytes
    assert f"{math.ceil(util * 100 - 1e-9) / 100:.2f}" in text


def test_moe_plan_with_expert_parallel_emits_for_vllm(tmp_path, capsys):
    from emitters import vllm
    from planner.plan.planfile import read_plan
    out = tmp_path / "infer_moe.yaml"
    rc = main(["plan", "--mode", "infer", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "8",
               "--prompt-len", "512", "--output-len", "256", "--tp", "1", "--ep", "8", "--out", str(out), "--json",
               "--target", "vllm"])
    assert rc == 0
    plan = read_plan(out)
    assert (plan.parallel.tp, plan.parallel.dp, plan.parallel.ep) == (1, 8, 8)
    assert "--enable-expert-parallel" in vllm.emit(plan)["vllm.sh"]


def test_human_output_and_csv(tmp_path, capsys):
    csv = tmp_path / "infer_cands.csv"
    rc = main(BASE + ["--csv", str(csv)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "output tokens/s" in out and "solver: OPTIMAL" in out
    import pandas as pd
    df = pd.read_csv(csv)
    assert {"tp", "pp", "replicas", "ep", "batch", "ttft_s", "tpot_s"} <= set(df.columns) and len(df) > 10


# ---- bad input -----------------------------------------------------------------------------------

def test_missing_lengths_is_usage_error(capsys):
    rc = main(["plan", "--mode", "infer", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "1",
               "--prompt-len", "100"])
    assert rc == 2
    assert "--output-len" in capsys.readouterr().err


def test_training_flags_are_usage_errors(capsys):
    assert main(BASE + ["--objective", "cost"]) == 2
    assert main(BASE + ["--zero", "3"]) == 2
    assert "--zero" in capsys.readouterr().err
    assert main(BASE + ["--tp", "3"]) == 2
    assert main(BASE + ["--batch", "0"]) == 2


def test_context_longer_than_the_model_is_infeasible_with_closest(capsys):
    rc, d = run_json(capsys, "plan", "--mode", "infer", "--model", "llama-3-8b", "--cluster", "dgx-h100",
                     "--gpus", "1", "--prompt-len", "8000", "--output-len", "500")
    capsys.readouterr()
    assert rc == 1
    assert d["status"] == "INFEASIBLE" and d["reason"] == "context"
    assert "8500" in d["message"] and "8192" in d["message"]
    assert d["closest"]["estimate"]["output_tokens_per_s_per_gpu"] > 0   # the plan at prompt 7692


def test_batch_that_fits_nowhere_is_infeasible_with_closest(capsys):
    rc, d = run_json(capsys, "--batch", "100000")
    assert rc == 1
    assert d["reason"] == "memory"
    mb = d["closest"]["estimate"]["max_batch"]
    assert 0 < mb < 100000 and d["closest"]["batch"] == mb
    assert f"most that fits is {mb}" in d["message"]


def test_model_too_big_for_the_gpus(capsys):
    rc, d = run_json(capsys, "plan", "--mode", "infer", "--model", "llama-3.1-405b", "--cluster", "dgx-h100",
                     "--gpus", "4", "--prompt-len", "100", "--output-len", "100")
    assert rc == 1 and d["reason"] == "memory"
    assert "even one sequence" in d["message"]


def test_unreachable_latency_goal_names_what_the_fastest_reaches(capsys):
    rc, d = run_json(capsys, "--tpot-slo-ms", "0.5")
    assert rc == 1 and d["reason"] == "latency"
    c = d["closest"]
    assert c["batch"] == 1 and c["estimate"]["tpot_s"] > 0.0005
    assert "TPOT" in d["message"] and "Closest" in d["message"]
