"""Hostile and careless input, round two (issue 21): a test per class of the issue, in process
through ``planner.cli.main`` where a command is the way in. Each refusal is exit 2 and one line
naming the field or flag (``check_refusal``); each case that must work works. The encoders and
the emitted Python are in ``test_input_encode.py`` and ``test_emit_safety.py``; the fuzzers of the
goodput, serving and launch numbers are at the end of this file.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import yaml

from cli_harness import check_refusal, run

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "data" / "hf"
PLAN = ROOT / "plans" / "tiny-llama-cpu.yaml"
TRAIN_PLAN = ["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "64",
              "--seq-len", "2048", "--target", "megatron"]
SERVE_PLAN = ["plan", "--mode", "infer", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--gpus", "8",
              "--prompt-len", "512", "--output-len", "128"]
EST = ["estimate", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", "--seq-len", "128"]


def refused(argv, *names, timeout_s: int = 20):
    t0 = time.monotonic()
    r = run([str(a) for a in argv], timeout_s=timeout_s)
    check_refusal(r)
    for n in names:
        assert n in r.err, r.where()
    return r, time.monotonic() - t0


def _example(name: str):
    from test_emit_support import examples
    return examples()[name]


# ---- 2. emit --target all of a disaggregated serving plan -------------------------------

def test_emit_all_of_a_disaggregated_plan(tmp_path):
    from planner.plan.planfile import write_plan
    plan = _example("llama-3.1-70b-serve-pd-h100x8")
    write_plan(plan, tmp_path / "d.yaml")
    r = run(["emit", tmp_path / "d.yaml", "-t", "all", "-o", tmp_path / "out"])
    assert r.code in (0, 4), r.where()          # 4: some target refused (named on stderr)
    assert "internal error" not in r.err and "Traceback" not in r.err
    out = tmp_path / "out"
    # vllm and sglang both write prefill.sh and decode.sh: each has its own folder, both whole
    for target in ("vllm", "sglang"):
        assert (out / target / "prefill.sh").is_file() and (out / target / "decode.sh").is_file(), r.where()
    assert (out / "vllm" / "prefill.sh").read_text() != (out / "sglang" / "prefill.sh").read_text()
    assert "vllm/prefill.sh" in (out / "README.md").read_text()
    again = run(["emit", tmp_path / "d.yaml", "-t", "all", "-o", tmp_path / "out"])
    assert again.code in (0, 4), again.where()      # the same files again: nothing changes, no --force needed


# ---- 3. --resume over a malformed manifest.json ------------------------------------------

@pytest.mark.parametrize("text", ["[1, 2, 3]", "[" * 200_000 + "]" * 200_000, '"a string"', "17", "null",
                                  '{"format": 1, "files": {"a": {"sha256": "x", "bytes": true}}}', "{not json"])
def test_malformed_manifest_is_a_skipped_step(tmp_path, text):
    from runtime import checkpoint as ckpt
    from runtime.manifest import MANIFEST, UnsafeCheckpoint, verify
    step = tmp_path / ckpt.step_name(3)
    step.mkdir()
    (step / MANIFEST).write_text(text)
    (step / "meta.json").write_text("{}")
    (step / ".metadata").write_bytes(b"")
    why = verify(step)
    assert isinstance(why, str) and why and "\n" not in why
    skipped = []
    with pytest.raises(UnsafeCheckpoint, match="intact"):      # no intact step: refused, by name, no crash
        ckpt.find_intact(tmp_path, log=skipped.append)
    assert skipped and "step-00000003" in skipped[0], skipped


@pytest.mark.parametrize("text,match", [("[1]", "not an object"), ("[" * 200_000, "nested too deeply"),
                                        ("nope", "not readable JSON")])
def test_meta_json_read_safely(tmp_path, text, match):
    from runtime.checkpoint import read_meta
    from runtime.manifest import UnsafeCheckpoint
    (tmp_path / "meta.json").write_text(text)
    with pytest.raises(UnsafeCheckpoint, match=match):
        read_meta(tmp_path)


# ---- 4, 5. goodput hangs and overflows: the model itself, then the flags -------------------

def test_goodput_model_finishes_on_extreme_numbers():
    """The cost model's own guard: no hang and no overflow for any finite positive input (the
    loops over nodes down stop at the node count; the useful fraction is computed in logs)."""
    from costmodel import reliability as R
    ck = R.checkpoint_cost(1e9, 10.0, False, 25e9)
    for mtbf_s, repair_s, restart_s in [(3.6e-6, 86400.0, 150.0), (36000.0, 3.6e15, 150.0), (36000.0, 86400.0, 1e15),
                                        (1e-300, 1e300, 1e300), (1e300, 1e-300, 0.0)]:
        t0 = time.monotonic()
        g = R.goodput(step_time_s=1.0, nodes=8, node_mtbf_s=mtbf_s, checkpoint=ck,
                      restart=R.RestartCost(overhead_s=restart_s, load_s=1.0, warmup_s=1.0), repair_s=repair_s,
                      spares=R.spares_needed(8, mtbf_s, repair_s))
        assert time.monotonic() - t0 < 2.0, (mtbf_s, repair_s, restart_s)
        assert 0.0 <= g.goodput <= 1.0 and math.isfinite(g.steps_per_hour), (mtbf_s, repair_s, restart_s, g)
    assert R.useful_fraction(10.0, 1.0, 1e15, 3600.0) == 0.0        # exp(1e15/3600) would overflow


def test_useful_fraction_in_logs_matches_the_direct_formula():
    """The log form is the same number as Daly's eq. 13 where the direct form does not overflow."""
    from costmodel import reliability as R
    for tau, delta, r, m in [(100.0, 10.0, 150.0, 3600.0), (3600.0, 60.0, 0.0, 1e5), (1.0, 0.0, 0.0, 1e7),
                             (5e4, 600.0, 3600.0, 2e4)]:
        direct = tau / (m * math.exp(r / m) * math.expm1((tau + delta) / m))
        assert math.isclose(R.useful_fraction(tau, delta, r, m), direct, rel_tol=1e-9)


@pytest.mark.parametrize("extra,names", [
    (["--mtbf-hours", "1e-9"], ["--mtbf-hours", "0.001", "6335"]),
    (["--mtbf-hours", "10", "--repair-hours", "1e12"], ["--repair-hours", "100,000"]),
    (["--mtbf-hours", "10", "--restart-overhead-s", "1e15"], ["--restart-overhead-s", "1,000,000"]),
    (["--mtbf-hours", "1e300"], ["--mtbf-hours"]),
])
def test_goodput_flags_bounded(extra, names):
    r, took = refused(TRAIN_PLAN + extra, *names)
    assert took < 10


@pytest.mark.parametrize("flag", ["--ttft-slo-ms", "--tpot-slo-ms"])
def test_serving_slo_bounded(flag):
    refused(SERVE_PLAN + [flag, "1e308"], flag, "10,000,000")


# ---- 6, 7, 9. model configs -----------------------------------------------------------

def _hf_file(tmp_path, src: str, **over) -> Path:
    d = json.loads((HF / src).read_text())
    for k, v in over.items():
        if "." in k:
            outer, inner = k.split(".")
            d[outer] = dict(d.get(outer) or {}, **{inner: v})
        else:
            d[k] = v
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("src,field,where", [
    ("gpt-oss-20b.json", "num_local_experts", None), ("deepseek-v2-lite.json", "n_routed_experts", None),
    ("llama-4-scout.json", "num_local_experts", "text_config"), ("mixtral-8x7b.json", "num_local_experts", None),
    ("qwen3-30b-a3b.json", "num_experts", None)])
def test_moe_config_with_zero_experts_refused(tmp_path, src, field, where):
    over = {f"{where}.{field}": 0} if where else {field: 0}
    p = _hf_file(tmp_path, src, **over)
    refused(EST + ["--model", p], field, "mixture of experts")


def test_moe_config_with_zero_experts_per_token_refused(tmp_path):
    refused(EST + ["--model", _hf_file(tmp_path, "mixtral-8x7b.json", num_experts_per_tok=0)], "num_experts_per_tok")


def test_gemma2_with_a_billion_layers_is_refused_at_once(tmp_path):
    p = _hf_file(tmp_path, "gemma-2-9b.json", num_hidden_layers=10**9)
    r, took = refused(EST + ["--model", p], "num_hidden_layers", "4,096")
    assert took < 5, took


@pytest.mark.parametrize("src,over,names", [
    ("minitron-4b.json", {"norm_eps": "tiny"}, ["norm_eps", "'tiny'"]),
    ("llama-3-8b.json", {"rms_norm_eps": -1.0}, ["rms_norm_eps"]),
    ("llama-3-8b.json", {"rope_theta": "big"}, ["rope_theta"]),
    ("llama-3-8b.json", {"rope_scaling": "yes"}, ["rope_scaling", "'yes'"]),
    ("llama-3-8b.json", {"rope_scaling": {"rope_type": "llama3", "factor": -4}}, ["rope_scaling.factor", "-4"]),
    ("llama-3-8b.json", {"rope_scaling": {"type": "linear", "factor": -4}}, ["rope_scaling.factor"]),
    ("llama-3-8b.json", {"rope_scaling": {"rope_type": 5, "factor": 2}}, ["rope_scaling.rope_type"]),
])
def test_config_fields_typed(tmp_path, src, over, names):
    p = tmp_path / "config.json"
    d = json.loads((HF / src).read_text())
    d.update(over)
    p.write_text(json.dumps(d))
    refused(EST + ["--model", p], *names)


def test_published_rope_scaling_still_read(tmp_path):
    """Llama 3.1's own rope_scaling block (factor 8) is still planned with its factor."""
    from costmodel.catalog import from_hf_config
    d = json.loads((HF / "llama-3-8b.json").read_text())
    d["rope_scaling"] = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert from_hf_config(d).rope_scaling == 8.0
    d["rope_scaling"] = None
    assert from_hf_config(d).rope_scaling == 0.0


# ---- 8. launch flags ------------------------------------------------------------------

@pytest.mark.parametrize("extra,names", [
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:99999"], ["--rdzv-endpoint", "65535"]),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "$(touch x):29500"], ["--rdzv-endpoint", "host"]),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "29500"], ["HOST:PORT"]),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:0"], ["port"]),
    (["--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "h:29500"], ["--node-rank 5", "--nnodes 2"]),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:29500", "--local-addr", "a b;c"], ["--local-addr"]),
    (["--timeout", "0"], ["--timeout", "default"]),
    (["--checkpoint-every", "0"], ["--checkpoint-every", "default"]),
    (["--inject-failure", "rank=0,step=1,step=2"], ["--inject-failure", "step given more than once"]),
    (["--inject-failure", "rank=0,rank=1,step=2"], ["rank given more than once"]),
    (["--inject-failure", "rank=0,step=50", "--steps", "10"], ["step 50 is after the last step", "--steps 10"]),
])
def test_launch_flags_checked_before_any_process(extra, names, tmp_path):
    before = set(os.listdir(tmp_path))
    refused(["launch", PLAN, *extra], *names)
    assert set(os.listdir(tmp_path)) == before
    assert not (Path.cwd() / "x").exists()


# ---- 10. flags a mode does not use --------------------------------------------------------

@pytest.mark.parametrize("argv,names", [
    (TRAIN_PLAN + ["--pareto"], ["--pareto", "serving options"]),
    (TRAIN_PLAN + ["--request-rate", "3"], ["--request-rate"]),
    (SERVE_PLAN + ["--async-checkpoint"], ["--async-checkpoint", "training options"]),
    (SERVE_PLAN + ["--mtbf-hours", "100"], ["--mtbf-hours"]),
    (SERVE_PLAN + ["--repair-hours", "3", "--restart-overhead-s", "10"], ["--repair-hours", "--restart-overhead-s"]),
])
def test_flags_a_mode_does_not_use(argv, names):
    refused(argv, *names)


def test_explain_and_launch_refuse_training_flags_on_a_serving_plan(tmp_path):
    from planner.plan.planfile import write_plan
    write_plan(_example("tiny-llama-serve-cpu"), tmp_path / "s.yaml")
    refused(["explain", tmp_path / "s.yaml", "--mtbf-hours", "100"], "--mtbf-hours", "serving plan")
    refused(["explain", tmp_path / "s.yaml", "--async-checkpoint"], "--async-checkpoint")
    refused(["launch", tmp_path / "s.yaml", "--checkpoint-dir", tmp_path / "c", "--checkpoint-every", "2"],
            "--checkpoint-dir", "--checkpoint-every", "inference plan")


def test_mode_table_covers_every_serving_and_failure_flag():
    """The one table names every flag of the serving and failure groups of `planner plan` (a new flag
    in those groups that the table misses would be accepted and ignored in the other mode)."""
    from planner.cli import build_parser
    from planner.cli.flagcheck import MODE_ONLY
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["plan"]
    groups = {g.title: [a.dest for a in g._group_actions] for g in sub._action_groups}
    serving = [d for d in groups["serving (--mode infer)"] if d != "target"]
    failures = next(v for k, v in groups.items() if k.startswith("failures"))
    assert set(serving) <= set(MODE_ONLY["plan"]["train"][0]), set(serving) - set(MODE_ONLY["plan"]["train"][0])
    assert set(failures) <= set(MODE_ONLY["plan"]["infer"][0]), set(failures) - set(MODE_ONLY["plan"]["infer"][0])


# ---- 11. plan files: stored estimates, duplicate keys, names; --out ''; cost without a price ---

def _plan_doc(edit=None) -> dict:
    d = yaml.safe_load(PLAN.read_text())
    if edit:
        edit(d)
    return d


def _write(tmp_path, d, name="p.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


@pytest.mark.parametrize("value", ["fast", [1, 2], {"a": 1}, True, -1.0])
def test_stored_estimate_garbage_refused(tmp_path, value):
    p = _write(tmp_path, _plan_doc(lambda d: d["estimate"].__setitem__("step_time_s", value)))
    for argv in (["estimate", "--plan", p], ["explain", p, "--no-what-if"], ["emit", p, "-t", "torchrun", "-o",
                                                                              tmp_path / "o"]):
        refused(argv, "estimate.step_time_s")


def test_stored_estimate_lie_warned_with_its_version(tmp_path):
    def lie(d):
        d["estimate"]["step_time_s"] *= 40
        d["provenance"]["planner"] = "0.0.7"
    p = _write(tmp_path, _plan_doc(lie))
    for argv in (["estimate", "--plan", p, "--json"], ["explain", p, "--no-what-if", "--json"]):
        r = run(argv)
        assert r.code == 0, r.where()
        assert "differs" in r.err and "'0.0.7'" in r.err and "1%" in r.err, r.where()
        json.loads(r.out)          # the figures shown are the recomputed ones, as JSON


def test_stored_estimate_within_one_percent_is_quiet(tmp_path):
    """Saved plans survive a small cost-model change: 0.5 % apart, nothing is said."""
    p = _write(tmp_path, _plan_doc(lambda d: d["estimate"].__setitem__("step_time_s",
                                                                        d["estimate"]["step_time_s"] * 1.005)))
    r = run(["estimate", "--plan", p, "--json"])
    assert r.code == 0 and "differs" not in r.err, r.where()


def test_shipped_plans_agree_with_the_cost_model():
    """Every plan under plans/ recomputes to its stored figures (no drift warning)."""
    from planner.plan.planfile import read_plan
    for f in sorted(ROOT.glob("plans/*.yaml")):
        if read_plan(f).mode != "train":
            continue
        r = run(["estimate", "--plan", f, "--json"], timeout_s=60)
        assert r.code == 0 and "differs" not in r.err, r.where()


def test_serving_lie_explained_from_recomputed_figures(tmp_path):
    from planner.plan.planfile import plan_to_dict
    d = plan_to_dict(_example("tiny-llama-serve-cpu"))
    d["estimate"]["tpot_s"] = 0.0
    p = _write(tmp_path, json.loads(json.dumps(d)))
    r = run(["explain", p, "--json"])
    assert r.code == 0 and "differs" in r.err, r.where()
    assert json.loads(r.out)["estimate"]["tpot_s"] > 0


def test_duplicate_keys_refused(tmp_path):
    text = PLAN.read_text().replace("schema: 1\n", "schema: 1\nschema: 1\n", 1)
    assert text.count("schema: 1") == 2
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    refused(["estimate", "--plan", p], "'schema' appears twice")
    refused(["emit", p, "-t", "torchrun", "-o", tmp_path / "o"], "appears twice")
    assert not (tmp_path / "o").exists()
    m = tmp_path / "m.yaml"
    m.write_text("extends: llama-3-8b\nlayers: 4\nlayers: 8\n")
    refused(EST + ["--model", m], "'layers' appears twice", "lines 2 and 3")
    j = tmp_path / "c.json"
    j.write_text('{"model_type": "llama", "hidden_size": 1, "hidden_size": 2}')
    refused(EST + ["--model", j], "'hidden_size' appears twice")


@pytest.mark.parametrize("section", ["model", "cluster"])
@pytest.mark.parametrize("name", ["tiny\nllama", "tiny\rllama", "x\u2028y", "a\x00b", "bidi\u202eevil"])
def test_unprintable_names_refused(tmp_path, section, name):
    p = _write(tmp_path, _plan_doc(lambda d: d[section].__setitem__("name", name)))
    refused(["estimate", "--plan", p], f"{section} ", "name", "unprintable")
    refused(["emit", p, "-t", "torchrun", "-o", tmp_path / "o"], "unprintable")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,names", [
    (TRAIN_PLAN + ["--out", ""], ["--out is empty"]),
    (TRAIN_PLAN + ["--csv", " "], ["--csv is empty"]),
    (TRAIN_PLAN + ["--out", "a\nb.yaml"], ["--out", "control character"]),
    (TRAIN_PLAN + ["--objective", "cost", "--cluster", "cpu"], ["--objective cost", "price", "--price-per-gpu-hour"]),
    (TRAIN_PLAN + ["--recompute-layers", "33", "--recompute", "full"], ["--recompute-layers 33", "32 layers"]),
    (["explain", PLAN, "--html", ""], ["--html is empty"]),
    (["explain", ""], ["PLAN is empty"]),
    (["emit", "", "-t", "torchrun", "-o", "x"], ["PLAN is empty"]),
    (["plan", "--model", "tiny\nllama", "--cluster", "cpu", "--gpus", "2", "--global-batch", "4", "--seq-len", "32"],
     ["--model", "control character"]),
])
def test_careless_flags(argv, names):
    refused(argv, *names)


def test_estimate_recompute_layers_above_the_layer_count():
    refused(["estimate", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "4", "--global-batch", "8",
             "--seq-len", "128", "--recompute", "full", "--recompute-layers", "5"], "--recompute-layers 5", "4 layers")


def test_profile_out_an_existing_file_answers_at_once(tmp_path):
    f = tmp_path / "existing.txt"
    f.write_text("keep me\n")
    r, took = refused(["profile", "--quick", "--out", f], "--out", "is a file")
    assert took < 5 and f.read_text() == "keep me\n"


# ---- fuzzers: goodput numbers, serving numbers, launch flags --------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
_SCALE = int(os.environ.get("FUZZ_SCALE", "1"))

NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, -1.0, 1e-9, 1e-3, 0.5, 1.0, 24.0, 6335.0, 1e5, 1e7, 1e12, 1e15, 1e300, 1e308]))


def _num(x: float) -> str:
    return repr(x) if math.isfinite(x) else str(x)


@settings(max_examples=40 * _SCALE)
@given(mtbf=NUMBER, repair=st.one_of(st.none(), NUMBER), restart=st.one_of(st.none(), NUMBER),
       asynchronous=st.booleans())
def test_goodput_numbers_fuzz(mtbf, repair, restart, asynchronous):
    """`explain` of a training plan under any failure numbers: a goodput in [0, 1], or exit 2 in
    one line; never a hang (20 s), an overflow or exit 70."""
    argv = ["explain", PLAN, "--no-what-if", "--json", "--mtbf-hours", _num(mtbf)]
    if repair is not None:
        argv += ["--repair-hours", _num(repair)]
    if restart is not None:
        argv += ["--restart-overhead-s", _num(restart)]
    if asynchronous:
        argv.append("--async-checkpoint")
    r = run(argv, timeout_s=20)
    assert r.code in (0, 2), r.where()
    if r.code == 2:
        check_refusal(r)
        return
    for p in json.loads(r.out)["failures"]["plans"]:
        assert 0.0 <= p["steps_per_hour"] <= 3600.0 / p["step_time_s"] * (1 + 1e-9), p


@pytest.mark.solver          # an accepted serving plan is searched (CP-SAT)
@settings(max_examples=12 * _SCALE)
@given(ttft=st.one_of(st.none(), NUMBER), tpot=st.one_of(st.none(), NUMBER),
       rate=st.one_of(st.none(), NUMBER), util=st.one_of(st.none(), NUMBER))
def test_serving_numbers_fuzz(ttft, tpot, rate, util):
    argv = ["plan", "--mode", "infer", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "2",
            "--prompt-len", "64", "--output-len", "16", "--max-time", "5", "--json"]
    for flag, v in (("--ttft-slo-ms", ttft), ("--tpot-slo-ms", tpot), ("--request-rate", rate),
                    ("--gpu-memory-utilization", util)):
        if v is not None:
            argv += [flag, _num(v)]
    r = run(argv, timeout_s=60)
    assert r.code in (0, 1, 2), r.where()
    assert "internal error" not in r.err and "Traceback" not in r.err, r.where()
    if r.code == 2:
        check_refusal(r)


HOSTS = st.one_of(st.sampled_from(["127.0.0.1", "node0", "[::1]", "::1", "a.b-c", "", "$(touch x)", "a b", "a;b",
                                   "h\n", "..", "-x", "[zz]", "x" * 300]), st.text(max_size=12))
PORTS = st.one_of(st.integers(-5, 70000).map(str), st.sampled_from(["", "x", "0", "65535", "65536", "29500 "]))


@settings(max_examples=150 * _SCALE)
@given(host=HOSTS, port=PORTS, addr=st.one_of(st.none(), HOSTS), nnodes=st.integers(-1, 5),
       rank=st.one_of(st.none(), st.integers(-1, 6)), timeout=st.one_of(st.none(), NUMBER),
       every=st.one_of(st.none(), st.integers(-2, 3)))
def test_launch_flags_fuzz(host, port, addr, nnodes, rank, timeout, every):
    """The launch flags through the one checker (``flagcheck.check_args``), without starting
    anything: either refused with one line naming a flag, or every accepted value is in range:
    a port 1-65535, a host of letters, digits, '.', '-' (or an IP), a node rank below the nodes."""
    from planner.cli import build_parser
    from planner.cli.flagcheck import check_args
    from planner.plan.errors import UsageError
    argv = ["launch", str(PLAN), "--rdzv-endpoint", f"{host}:{port}", "--nnodes", str(nnodes)]
    if addr is not None:
        argv += ["--local-addr", addr]
    if rank is not None:
        argv += ["--node-rank", str(rank)]
    if timeout is not None:
        argv += ["--timeout", _num(timeout)]
    if every is not None:
        argv += ["--checkpoint-every", str(every)]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        return                      # argparse refused it (exit 2, its own message)
    try:
        check_args(args, argv, build_parser)
    except UsageError as e:
        assert str(e).startswith("--") and "\n" not in str(e).rstrip(), str(e)
        return
    assert port.isdigit() and 1 <= int(port) <= 65535
    for h in (host, addr or "node0"):
        assert h and all(c.isascii() and (c.isalnum() or c in ".-:[]") for c in h), h
    assert 1 <= nnodes and (rank is None or 0 <= rank < nnodes)
    assert timeout is None or 0 < timeout <= 30 * 86400
    assert every is None or every >= 1


# ---- 10 (end). resuming another model's checkpoint: one line per rank, no traceback ---------

@pytest.mark.multiproc
def test_resume_of_another_models_checkpoint_has_no_traceback(tmp_path):
    """Two gloo processes save a tiny-llama checkpoint; a plan for a wider model resuming it is
    refused by every rank in one line, and torchrun adds no traceback or failure report."""
    import subprocess
    import sys

    from planner.plan.planfile import write_plan
    from test_emit_support import make_plan
    plan = make_plan("tiny-llama", gpus=2, gb=4, seq=32, dp=2, micro_batch=2, grad_accum=1)
    write_plan(plan, tmp_path / "a.yaml")
    d = yaml.safe_load((tmp_path / "a.yaml").read_text())
    d["model"]["hidden"] = 256
    d["model"]["name"] = "tiny-llama-wide"
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

    def launch(*args):
        return subprocess.run([sys.executable, "-m", "planner", "launch", *map(str, args), "--device", "cpu"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400)
    first = launch(tmp_path / "a.yaml", "--steps", "2", "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    r = launch(tmp_path / "b.yaml", "--steps", "3", "--checkpoint-dir", tmp_path / "ck", "--resume")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "ChildFailedError" not in r.stderr and "Root Cause" not in r.stderr, \
        r.stderr[-3000:]
    import re
    assert re.match(r"planner launch: error: rank \d+: checkpoint ", r.stderr.strip().splitlines()[-1]), r.stderr
    assert "belongs to another model" in r.stderr


@pytest.mark.multiproc
def test_profile_out_relative_to_the_callers_folder(tmp_path):
    """`planner profile --out rel` from any folder: the ranks (started from the repository root)
    find their config in the caller's folder; the files land there."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "planner", "profile", "--quick", "--out", "rel", "--no-report"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "rel" / "cluster.yaml").is_file()
    assert "rel/cluster.yaml" in r.stdout + r.stderr


def test_every_number_flag_has_a_finite_bound_with_a_reason():
    """One validation layer for every number: each int/float flag of every command (argparse
    choices aside) has a rule in flagcheck with a finite upper bound."""
    import argparse

    from planner.cli import build_parser
    from planner.cli.flagcheck import _BY_COMMAND, _COMMON
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing, unbounded = [], []
    for cmd, sp in sub.choices.items():
        rules = {**_COMMON, **_BY_COMMAND.get(cmd, {})}
        for a in sp._actions:
            if a.type not in (int, float) or a.choices:
                continue
            if a.dest not in rules:
                missing.append(f"{cmd} --{a.dest}")
            elif not math.isfinite(rules[a.dest][1]):
                unbounded.append(f"{cmd} --{a.dest}")
    assert not missing and not unbounded, (missing, unbounded)


def test_every_number_field_of_the_specs_has_a_bound():
    """The same for the files: each int/float field of the model, cluster, GPU, link, node-group,
    workload and parallel specs has a range in costmodel.limits (StageSpec is checked by the plan
    reader against the model's layers)."""
    import dataclasses

    from costmodel import specs
    from costmodel.limits import BOUNDS
    missing = [f"{cls.__name__}.{f.name}" for cls in vars(specs).values()
               if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__name__ != "StageSpec"
               for f in dataclasses.fields(cls) if f.type in ("int", "float") and (cls.__name__, f.name) not in BOUNDS]
    assert not missing, missing
    assert all(math.isfinite(hi) for _, hi, _ in BOUNDS.values())
