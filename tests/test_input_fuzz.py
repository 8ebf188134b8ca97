"""Fuzzing every loader and flag of ``planner`` (hypothesis), in process and in the fast tier.

Each example writes hostile or careless input -- a Hugging Face config.json, a model or cluster
YAML, a plan file, a measured-runs file, an NVML recording, raw bytes, or flag values -- runs
the command through ``planner.cli.main`` and asserts what the README promises: exit 0 with
finite, physically possible numbers in the ``--json`` answer (``cli_harness.check_answer``), or
a refusal with its documented exit code and one line on stderr; never a traceback, never exit
70 (an internal error), never a hang (an alarm per command).

Inputs are drawn half from plausible values (near real ones, so the exit-0 path is exercised)
and half from hostile ones (NaN, infinity, negatives, 10^15, bools, strings, lists, nulls).

Profiles: ``ci`` (the default: derandomized, so every run tries the same examples; the whole
file takes about half a minute) and ``explore`` (``HYPOTHESIS_PROFILE=explore``: ten times the
examples, random each run).
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cli_harness import check_answer, check_refusal, run  # noqa: E402
from costmodel.catalog import get_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "data" / "hf"
NVML = ROOT / "tests" / "data" / "nvml"
PLANS = [ROOT / "plans" / n for n in ("tiny-llama-cpu.yaml", "llama-3-8b-dgx-h100.yaml", "mixtral-8x7b-32xh100.yaml",
                                      "llama-3-70b-mixed-h100-a100.yaml")]
MIXED = ROOT / "plans" / "clusters" / "mixed-h100-a100.yaml"

settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
_SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 1


def examples(n: int):
    return settings(max_examples=n * _SCALE)


_TMP = Path(tempfile.mkdtemp(prefix="planner-fuzz-"))
_COUNTER = itertools.count()


def _file(name: str, content: str | bytes) -> Path:
    p = _TMP / f"{next(_COUNTER)}-{name}"
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    return p


# ---- values ----------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.sampled_from([0, -1, -8, 2**31, 2**63, 10**12, 10**15, 0.0, -0.0, 0.5, 2.5, 1e-300, 1e300,
                     float("nan"), float("inf"), float("-inf"), True, False, None, "", "8", "1e12", "nan",
                     "x\ny", [], [1, 2], {}, {"a": 1}]),
    st.integers(-10**13, 10**13),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)


def near(v):
    """A value near a real one: scaled, nudged, or the same."""
    if isinstance(v, bool):
        return st.booleans()
    if isinstance(v, int):
        return st.sampled_from(sorted({v, max(v // 2, 0), v * 2, v + 1, max(v - 1, 0), 1, 0}))
    if isinstance(v, float):
        return st.sampled_from([v, v / 2, v * 2, v * 0.99, 0.0, 1.0])
    return st.just(v)


def mostly(good, bad, bad_in: int = 4):
    """``good``, except about one draw in ``bad_in``: ``bad`` (so the exit-0 path is exercised too)."""
    return st.sampled_from([True] * (bad_in - 1) + [False]).flatmap(lambda ok: good if ok else bad)


def value_for(v):
    return mostly(near(v), HOSTILE, 3)


def mutations(d: dict, extra_keys=(), max_n: int = 3):
    """A list of (key, value) edits of the mapping ``d``: plausible or hostile values, or a deletion."""
    keys = sorted(set(d) | set(extra_keys))
    edit = st.sampled_from(keys).flatmap(
        lambda k: st.tuples(st.just(k), mostly(value_for(d.get(k, 1)), st.just("<delete>"), 8)))
    return st.lists(edit, min_size=1, max_size=max_n)


def apply(d: dict, edits) -> dict:
    d = copy.deepcopy(d)
    for k, v in edits:
        if v == "<delete>":
            d.pop(k, None)
        else:
            d[k] = v
    return d


def leaf_paths(x, at=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaf_paths(v, at + (k,))
    elif isinstance(x, list) and x:
        for i, v in enumerate(x):
            yield from leaf_paths(v, at + (i,))
    yield at


def set_path(d, path, v):
    d = copy.deepcopy(d)
    if not path:
        return v
    node = d
    for k in path[:-1]:
        node = node[k]
    if v == "<delete>" and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = None if v == "<delete>" else v
    return d


def get_path(d, path):
    for k in path:
        d = d[k]
    return d


def _json(d) -> str:
    return json.dumps(d, allow_nan=True)      # NaN and Infinity as Python writes them (not JSON)


def _yaml(d) -> str:
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True)


# ---- loaders through `planner estimate` --------------------------------------------------

HF_CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted(HF.glob("*.json")) if p.stem != "expected_params"}
HF_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size", "max_position_embeddings", "head_dim", "tie_word_embeddings", "model_type")
WORKLOAD = st.sampled_from([["--global-batch", "64", "--seq-len", "256"], ["--global-batch", "8", "--seq-len", "512"],
                            ["--global-batch", "64", "--seq-len", "1024"], ["--global-batch", "512", "--seq-len", "4096"]])


@examples(60)
@given(name=st.sampled_from(sorted(HF_CONFIGS)), data=st.data(), wl=WORKLOAD,
       gpus=st.sampled_from(["8", "64"]))
def test_hf_config_json(name, data, wl, gpus):
    base = HF_CONFIGS[name]
    cfg = apply(base, data.draw(mutations(base, HF_KEYS, 2)))
    f = _file("config.json", _json(cfg))
    check_answer(run(["estimate", "--model", f, "--cluster", "dgx-h100", "--gpus", gpus, *wl, "--json"]))


MODEL_NAMES = ["tiny-llama", "tiny-moe", "tiny-gpt", "llama-3-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-1.3b"]
MODEL_KEYS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "head_dim", "vocab", "max_seq_len", "num_experts",
              "top_k", "moe_layer_freq", "first_dense_layers", "positions", "mlp", "attention", "name", "extends")


@examples(60)
@given(name=st.sampled_from(MODEL_NAMES), data=st.data(), wl=WORKLOAD,
       kernel=st.sampled_from(["flash", "materialized"]))
def test_model_yaml(name, data, wl, kernel):
    base = get_model(name).to_dict()
    d = apply(base, data.draw(mutations(base, MODEL_KEYS, 2)))
    f = _file("model.yaml", _yaml(d))
    check_answer(run(["estimate", "--model", f, "--cluster", "dgx-h100", "--gpus", "8", *wl,
                      "--attention-kernel", kernel, "--json"]), attention_kernel=kernel)


CLUSTER_BASE = {
    "gpu": {"memory_gib": 80, "tflops": {"bf16": 989}, "hbm_gb_per_s": 3350, "matmul_efficiency": 0.62,
            "matmul_half_size": 260, "reserved_gib": 1.0, "price_per_hour": 3.0, "layer_overhead_us": 0.0},
    "gpus_per_node": 8, "nodes": 2,
    "intra_node": {"gb_per_s": 450, "latency_us": 3, "efficiency": 0.8},
    "inter_node": {"gb_per_s": 50, "latency_us": 5, "efficiency": 0.9},
    "measured": {"compute_comm_slowdown": 0.1, "matmul": [[256, 0.4], [4096, 0.8]]},
}


@examples(80)
@given(data=st.data(), extends=mostly(st.sampled_from([None, "dgx-h100", "l40s-pcie"]),
                                     st.sampled_from([123, ["dgx-h100"], "nope", "cpu"]), 6),
       kernel=st.sampled_from(["flash", "materialized"]))
def test_cluster_yaml(data, extends, kernel):
    d = copy.deepcopy(CLUSTER_BASE)
    paths = [p for p in leaf_paths(d) if p]
    for _ in range(data.draw(st.sampled_from([1, 1, 2]))):
        path = data.draw(st.sampled_from(paths))
        old = get_path(d, path) if path in paths else 1
        d = set_path(d, path, data.draw(mostly(value_for(old), st.just("<delete>"), 8)))
        paths = [p for p in leaf_paths(d) if p]
    if extends is not None:
        d["extends"] = extends
    f = _file("cluster.yaml", _yaml(d))
    r = run(["estimate", "--model", "llama-3-8b", "--cluster", f, "--tp", "8", "--global-batch", "1024",
             "--seq-len", "2048", "--attention-kernel", kernel, "--json"])
    check_answer(r, attention_kernel=kernel)


@examples(30)
@given(data=st.data())
def test_grouped_cluster_yaml(data):
    groups = [{"name": "h100", "extends": "dgx-h100", "nodes": 1}, {"name": "a100", "extends": "dgx-a100-80gb",
                                                                     "nodes": 1}]
    d = {"name": "mixed", "groups": groups, "inter_node": {"name": "ib", "gb_per_s": 25}}
    path = data.draw(st.sampled_from([p for p in leaf_paths(d) if p]))
    d = set_path(d, path, data.draw(st.one_of(value_for(get_path(d, path)), st.just("<delete>"))))
    f = _file("mixed.yaml", _yaml(d))
    check_answer(run(["estimate", "--model", "llama-3-8b", "--cluster", f, "--tp", "8", "--pp", "2",
                      "--global-batch", "64", "--seq-len", "2048", "--json"]))


@examples(40)
@given(kind=st.sampled_from(["model.yaml", "config.json", "cluster.yaml", "plan.yaml"]),
       content=st.one_of(st.binary(max_size=200), st.text(max_size=200),
                         st.sampled_from(["{", "[[[[", "a: &a [*a]", "- - -", "schema: 1", "extends: dgx-h100\n" * 2,
                                          "model_type: llama", "\ufeffextends: dgx-h100", "!!python/object:os.system {}"])))
def test_raw_file_contents(kind, content):
    f = _file(kind, content)
    if kind == "plan.yaml":
        argv = ["estimate", "--plan", f, "--json"]
    elif kind == "cluster.yaml":
        argv = ["estimate", "--model", "tiny-llama", "--cluster", f, "--global-batch", "8", "--seq-len", "128", "--json"]
    else:
        argv = ["estimate", "--model", f, "--cluster", "cpu", "--gpus", "1", "--global-batch", "8", "--seq-len", "128",
                "--json"]
    check_answer(run(argv))


# ---- plan files ------------------------------------------------------------------------

PLAN_DOCS = {p.name: yaml.safe_load(p.read_text()) for p in PLANS}
PLAN_TEXTS = {p.name: p.read_text() for p in PLANS}


@examples(60)
@given(name=st.sampled_from(sorted(PLAN_DOCS)), data=st.data())
def test_plan_file_fields(name, data):
    d = PLAN_DOCS[name]
    paths = [p for p in leaf_paths(d) if p and p[0] not in ("provenance",)]
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(paths))
        d = set_path(d, path, data.draw(st.one_of(value_for(get_path(d, path)), st.just("<delete>"))))
        paths = [p for p in leaf_paths(d) if p and p[0] not in ("provenance",)]
    f = _file("plan.yaml", _yaml(d))
    check_answer(run(["estimate", "--plan", f, "--json"]))
    r = run(["emit", f, "--target", "torchrun", "--out", _TMP / f"emit-{next(_COUNTER)}", "--json"])
    assert r.code in (0, 1, 2) and "Traceback" not in r.err and r.code != 70, r.where()
    if r.code:
        check_refusal(r, (1, 2))


@examples(30)
@given(name=st.sampled_from(sorted(PLAN_TEXTS)), frac=st.floats(0.0, 0.999))
def test_plan_file_truncated(name, frac):
    text = PLAN_TEXTS[name]
    f = _file("plan.yaml", text[:int(len(text) * frac)])
    r = run(["estimate", "--plan", f, "--json"])
    check_refusal(r)          # a plan cut anywhere before its end is refused, never half-read


# ---- flags -----------------------------------------------------------------------------

BAD_FLAG_VALUES = ["0", "-1", "1.5", "nan", "inf", "x", "", "8000000000000", "1e3", "0x10", "-0"]


def flag_value(good):
    """A plausible value; one draw in eight a hostile one."""
    return mostly(st.sampled_from(good), st.sampled_from(BAD_FLAG_VALUES), 8)


DEGREES = {"--tp": ["1", "2", "4", "8"], "--pp": ["1", "2", "4"], "--dp": ["1", "2", "4", "8"], "--cp": ["1", "2"],
           "--ep": ["1", "2", "4"], "--vpp": ["1", "2"], "--micro-batch": ["1", "2", "4"],
           "--grad-accum": ["1", "2", "8"], "--dp-shard": ["1", "2"], "--recompute-layers": ["0", "1", "2"],
           "--zero": ["0", "1", "2", "3", "4"], "--recompute": ["none", "selective", "full", "some"],
           "--schedule": ["1f1b", "gpipe", "interleaved", "zb"],
           "--mesh-order": ["pp,dp,cp,tp", "tp,cp,dp,pp", "dp,pp,cp,tp", "pp,dp", "a,b,c,d"],
           "--dtype": ["bf16", "fp16", "fp32", "fp8", "int8", "int4", "fp64"],
           "--optimizer": ["adamw", "sgd", "lion"], "--attention-kernel": ["flash", "materialized"],
           "--seed": ["0", "7", "-3"]}
PROBLEMS = [("tiny-llama", "cpu", ["1", "2", "4", "8"], ["8", "16"], ["128", "256", "512"]),
            ("tiny-moe", "cpu", ["2", "4", "8"], ["8", "16"], ["128", "512"]),
            ("llama-3-8b", "dgx-h100", ["8", "16", "64"], ["64", "256"], ["2048", "8192"]),
            ("mixtral-8x7b", "dgx-h100", ["16", "32"], ["64", "256"], ["4096"]),
            ("llama-3-8b", str(MIXED), ["96"], ["192"], ["4096"])]


def problem_flags(data, numbers_too: bool = True):
    model, cluster, gpus, batches, seqs = data.draw(st.sampled_from(PROBLEMS))
    argv = ["--model", model, "--cluster", cluster]
    g = flag_value(gpus) if numbers_too else st.sampled_from(gpus)
    argv += ["--gpus", data.draw(g), "--global-batch", data.draw(flag_value(batches) if numbers_too else
                                                                  st.sampled_from(batches)),
             "--seq-len", data.draw(flag_value(seqs) if numbers_too else st.sampled_from(seqs))]
    return argv


# dp and grad-accum follow from the others when left out; given at random they rarely agree
COMMON_DEGREES = sorted(set(DEGREES) - {"--dp", "--grad-accum"})


def degree_flags(data, n_max: int = 4):
    pool = sorted(DEGREES) if data.draw(st.integers(0, 3)) == 0 else COMMON_DEGREES
    names = data.draw(st.lists(st.sampled_from(pool), max_size=n_max, unique=True))
    out = []
    for n in names:
        out += [n, data.draw(flag_value(DEGREES[n]))]
    return out


def _kernel(argv):
    return argv[argv.index("--attention-kernel") + 1] if "--attention-kernel" in argv else "flash"


@examples(120)
@given(data=st.data())
def test_estimate_flags(data):
    argv = ["estimate", *problem_flags(data), *degree_flags(data), "--json"]
    check_answer(run(argv), attention_kernel=_kernel(argv))


@pytest.mark.solver       # these commands search (CP-SAT): the full suite runs them
@examples(25)
@given(data=st.data(), objective=st.sampled_from([[], ["--objective", "memory"], ["--objective", "cost"],
                                                  ["--objective", "cost", "--price-per-gpu-hour", "2.5"]]),
       top=st.sampled_from(["1", "2", "1", "0", "1000000"]), max_time=st.sampled_from(["10", "10", "10", "0", "nan"]))
def test_plan_flags(data, objective, top, max_time):
    argv = ["plan", *problem_flags(data, numbers_too=data.draw(st.booleans())), *degree_flags(data, 3), *objective,
            "--top", top, "--max-time", max_time, "--json"]
    check_answer(run(argv, timeout_s=60), ok_codes=(0, 1, 3), attention_kernel=_kernel(argv))


SERVING = {"--prompt-len": ["64", "128", "1000"], "--output-len": ["16", "64"], "--batch": ["1", "8", "64"],
           "--ttft-slo-ms": ["50", "500", "0.001"], "--tpot-slo-ms": ["10", "100"], "--kv-dtype": ["bf16", "fp8", "int8"],
           "--max-batch": ["64", "4096"], "--dtype": ["bf16", "fp8", "int8", "int4"], "--tp": ["1", "2"],
           "--pp": ["1", "2"], "--dp": ["1", "2"], "--ep": ["1", "2"]}


@pytest.mark.solver       # these commands search (CP-SAT): the full suite runs them
@examples(25)
@given(data=st.data(), problem=st.sampled_from([("tiny-llama", "cpu", "2"), ("tiny-moe", "cpu", "4"),
                                                ("llama-3-8b", "dgx-h100", "8")]))
def test_serving_plan_flags(data, problem):
    model, cluster, gpus = problem
    names = data.draw(st.lists(st.sampled_from(sorted(set(SERVING) - {"--prompt-len", "--output-len"})), max_size=3,
                               unique=True))
    argv = ["plan", "--mode", "infer", "--model", model, "--cluster", cluster, "--gpus", gpus, "--max-time", "10",
            "--prompt-len", data.draw(flag_value(SERVING["--prompt-len"])),
            "--output-len", data.draw(flag_value(SERVING["--output-len"]))]
    for n in names:
        argv += [n, data.draw(flag_value(SERVING[n]))]
    check_answer(run([*argv, "--json"], timeout_s=60), ok_codes=(0, 1, 3))


@pytest.mark.solver       # these commands search (CP-SAT): the full suite runs them
@examples(20)
@given(change=st.sampled_from(["--gpus", "--lose-nodes", "--add-nodes"]), n=flag_value(["1", "2", "4", "8"]),
       extra=st.sampled_from([[], ["--global-batch", "16"], ["--global-batch", "0"], ["--max-time", "nan"],
                              ["--compatible-within", "10"], ["--compatible-within", "-1"], ["--group", "main"]]))
def test_replan_flags(change, n, extra):
    r = run(["replan", PLANS[0], change, n, *extra, "--max-time", "10", "--json"] if "--max-time" not in extra else
            ["replan", PLANS[0], change, n, *extra, "--json"], timeout_s=60)
    assert r.code != 70 and "Traceback" not in r.err, r.where()
    if r.code == 0:
        check_answer(r)
    else:
        check_refusal(r, (1, 2, 3))


# flags of launch and profile: a launch or a profile that passes its checks starts processes,
# so each example sets one flag to a value that must be refused and fuzzes the others
LAUNCH_BAD = [("--steps", "0"), ("--steps", "-3"), ("--nnodes", "0"), ("--timeout", "nan"), ("--timeout", "-1"),
              ("--max-restarts", "-1"), ("--checkpoint-every", "-2"), ("--dead-after", "0"), ("--node-rank", "-1"),
              ("--nproc-per-node", "0"), ("--prompt-len", "-1"), ("--steps", "x"), ("--timeout", "inf")]
LAUNCH_OK = {"--steps": ["1", "5"], "--nnodes": ["1"], "--timeout": ["0", "30"], "--device": ["cpu", "auto"]}


@examples(20)
@given(bad=st.sampled_from(LAUNCH_BAD), data=st.data())
def test_launch_flags_refused_before_anything_starts(bad, data):
    argv = ["launch", PLANS[0], *bad]
    for k in data.draw(st.lists(st.sampled_from(sorted(set(LAUNCH_OK) - {bad[0]})), max_size=2, unique=True)):
        argv += [k, data.draw(st.sampled_from(LAUNCH_OK[k]))]
    check_refusal(run(argv))


# ---- measured runs (`planner calibrate`) and NVML recordings (`planner profile`) -----------

@examples(25)
@given(runs=st.lists(st.fixed_dictionaries({"plan": mostly(st.just("p.yaml"), st.sampled_from(["missing.yaml", 7, None,
                                                                                              "."]), 6),
                                            "measured_step_time_s": mostly(st.sampled_from([0.01, 0.02, 1.0]),
                                                                           HOSTILE, 6)},
                                           optional={"name": mostly(st.text(max_size=5), HOSTILE, 6)}),
                     min_size=1, max_size=3),
       wrap=st.booleans())
def test_measured_runs_file(runs, wrap):
    d = _TMP / f"cal-{next(_COUNTER)}"
    d.mkdir()
    (d / "p.yaml").write_text(PLAN_TEXTS["tiny-llama-cpu.yaml"])
    (d / "runs.yaml").write_text(_yaml({"runs": runs} if wrap else runs))
    r = run(["calibrate", "--cluster", "cpu", "--measured", d / "runs.yaml", "--out", d / "cal.yaml", "--json"])
    assert r.code in (0, 2) and "Traceback" not in r.err, r.where()
    if r.code == 0:
        out = r.json()
        assert all(0 < f < 1e3 for f in out["factors"].values()), out
        assert (d / "cal.yaml").exists()
    else:
        check_refusal(r)
        assert not (d / "cal.yaml").exists()


NVML_BASE = json.loads((NVML / "dgx_h100.json").read_text())


@examples(60)
@given(data=st.data())
def test_nvml_recording(data):
    """An NVML recording is read and answers the probe, or is refused as bad input (exit 2 from
    `planner profile`); the probe is called directly: a recording that passes would start the
    benchmarks."""
    from profiles.profile import ProfileInputError, ProfileOptions, _probe_for
    d = copy.deepcopy(NVML_BASE)
    fn = data.draw(st.sampled_from(sorted(d["calls"]) + ["nvmlNope", "other"]))
    table = d["calls"].setdefault(fn, {"": 1})
    if isinstance(table, dict) and table:
        key = data.draw(st.sampled_from(sorted(table)))
        table[key] = data.draw(st.one_of(HOSTILE, st.just({"error": "NVML_ERROR_NOT_SUPPORTED"}),
                                         st.just({"error": "NVML_ERROR_BOGUS"}), st.just({"total": "x"})))
    if data.draw(st.booleans()):
        d["calls"].pop(data.draw(st.sampled_from(sorted(d["calls"]))))
    f = _file("nvml.json", _json(d))
    try:
        pr = _probe_for(ProfileOptions(out_dir=_TMP / "unused", nvml_replay=str(f)))
    except ProfileInputError as e:
        assert str(e) and "\n" not in str(e), e
        return
    assert pr.summary()
