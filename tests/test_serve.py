"""runtime.serve, proven with real gloo processes on the CPU (fp32).

Equality: the tokens a split generates (greedy, KV cache) equal the one-process run's exactly,
and the winning logit of every token agrees within ``LOGIT_TOL`` (a finer check: a randomly
initialised model repeats tokens, so tokens alone would miss a wrong cache). The one-process
run itself equals generation without a cache (the full forward of ``runtime.model`` re-run on
the growing sequence). Splits: TP=2, PP=2 (uneven stages), TP=2 x PP=2, two replicas, and for
GPT-style (learned positions, tied embeddings split over stages) and MoE models.

The jobs share one pool of worker processes (``runtime.local.LocalPool``: started once, each job its
own gloo group over the first ``world`` workers); the command line runs once under torchrun and once
alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.serve import ServeOptions

pytestmark = pytest.mark.multiproc

ROOT = Path(__file__).resolve().parents[1]
LOGIT_TOL = 1e-4
PROMPT, OUTPUT = 12, 6


class ServePool:
    """``runtime.local.LocalPool`` running ``runtime.serve.serve`` jobs."""

    def __init__(self, n: int):
        from runtime.local import LocalPool
        self._pool = LocalPool(n)

    def run(self, plan, opts: ServeOptions | None = None) -> dict:
        return self._pool.run(plan, opts or ServeOptions(quiet=True, warmup=0), entry="serve")

    def close(self) -> None:
        self._pool.close()


@pytest.fixture(scope="module")
def pool():
    p = ServePool(4)
    yield p
    p.close()


def serving_plan(model: str = "tiny-llama", batch: int = 4, stages: list[int] | None = None, **par):
    """A serving plan on the cpu cluster without the solver (the solver's plans are tested in
    test_inference_cli; one of them runs below under torchrun)."""
    from costmodel.catalog import get_model
    from costmodel.specs import ParallelConfig, Workload, default_stages, stages_from_counts
    from planner.plan.planfile import Plan
    from costmodel.files.clusters import load_cluster
    spec = get_model(model)
    p = ParallelConfig(**par)
    if stages is None:
        st = default_stages(spec.layers, p.pp)
    else:
        st = stages_from_counts(stages)
    w = Workload(global_batch=batch, seq_len=PROMPT + OUTPUT, mode="infer", dtype="fp32", prompt_len=PROMPT,
                 output_len=OUTPUT, seed=3)
    return Plan(model=spec, cluster=load_cluster("cpu").with_gpus(p.world_size), workload=w, parallel=p,
                stages=st)


_refs: dict = {}


def reference(pool, model: str) -> dict:
    if model not in _refs:
        _refs[model] = pool.run(serving_plan(model))
    return _refs[model]


def assert_same(got: dict, ref: dict) -> None:
    assert got["tokens"] == ref["tokens"]
    diff = max(abs(a - b) for ra, rb in zip(got["token_logits"], ref["token_logits"]) for a, b in zip(ra, rb))
    assert diff <= LOGIT_TOL, diff


SPLITS = {
    # name: (model, plan overrides)
    "tp2": ("tiny-llama", dict(tp=2)),
    "pp2_uneven": ("tiny-llama", dict(pp=2, stages=[3, 1])),
    "tp2_pp2": ("tiny-llama", dict(tp=2, pp=2)),
    "replicas2": ("tiny-llama", dict(dp=2, batch=2)),
    "gpt_tied_pp2_tp2": ("tiny-gpt", dict(pp=2, tp=2)),
    "moe_tp2": ("tiny-moe", dict(tp=2)),
    # expert parallel as vLLM deploys it (EP = TP x DP): wide EP with data-parallel attention, and
    # experts over the TP ranks of two replicas
    "moe_ep4_dp4": ("tiny-moe", dict(dp=4, ep=4, batch=1)),
    "moe_ep4_tp2_dp2": ("tiny-moe", dict(tp=2, dp=2, ep=4, batch=2)),
    "moe_ep2_dp2_pp2": ("tiny-moe", dict(pp=2, dp=2, ep=2, batch=2)),
}


@pytest.mark.parametrize("name", list(SPLITS))
def test_split_generates_the_single_process_tokens(pool, name):
    model, kw = SPLITS[name]
    got = pool.run(serving_plan(model, **kw))
    ref = reference(pool, model)
    assert len(got["tokens"]) == 4 and all(len(r) == OUTPUT for r in got["tokens"])
    assert_same(got, ref)
    assert got["world_size"] == serving_plan(model, **kw).world_size
    assert got["ttft_s"] > 0 and got["tpot_s"] > 0
    assert got["predicted"]["tpot_s"] > 0
    par = serving_plan(model, **kw).parallel
    if par.ep > 1:           # the experts really are spread: E / ep per rank
        from costmodel.catalog import get_model
        assert got["experts_per_rank"] == get_model(model).num_experts // par.ep


def test_kv_cache_generation_equals_recomputation(pool):
    """The one-process run against the model's own forward re-run on the whole sequence."""
    import torch

    from runtime.data import TokenStream
    from runtime.model import build_model, init_weights
    for model in ("tiny-llama", "tiny-gpt"):
        ref = reference(pool, model)
        plan = serving_plan(model)
        m = build_model(plan.model)
        init_weights([m], plan.workload.seed, plan.model)
        m.eval()
        seq = TokenStream(global_batch=4, seq_len=PROMPT - 1, vocab=plan.model.vocab, seed=plan.workload.seed).batch(0)
        toks, vals = [], []
        with torch.no_grad():
            for _ in range(OUTPUT):
                top = m(seq)[:, -1].max(dim=-1)
                toks.append(top.indices[:, None])
                vals.append(top.values[:, None])
                seq = torch.cat([seq, top.indices[:, None]], dim=1)
        assert_same(ref, {"tokens": torch.cat(toks, 1).tolist(), "token_logits": torch.cat(vals, 1).tolist()})


def _plan_file(tmp_path: Path, name: str, *args: str) -> Path:
    from planner.cli import main
    out = tmp_path / f"{name}.yaml"
    rc = main(["plan", "--mode", "infer", "--model", "tiny-llama", "--cluster", "cpu", "--prompt-len", str(PROMPT),
               "--output-len", str(OUTPUT), "--batch", "4", "--seed", "3", "--dtype", "fp32", "--out", str(out),
               "--json", *args])
    assert rc == 0
    return out


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def test_cli_under_torchrun_and_alone(pool, tmp_path, capsys):
    tp2 = _plan_file(tmp_path, "infer_tp2", "--gpus", "2", "--tp", "2")
    one = _plan_file(tmp_path, "infer_one", "--gpus", "1")
    capsys.readouterr()
    out2, out1 = tmp_path / "tp2.json", tmp_path / "one.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "localhost:0", "--rdzv-id", f"serve-test-{os.getpid()}", "-m", "runtime.serve",
           "--plan", str(tp2), "--json-out", str(out2), "--warmup", "0"]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    r1 = subprocess.run([sys.executable, "-m", "runtime.serve", "--plan", str(one), "--json-out", str(out1)],
                        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r1.returncode == 0, r1.stderr[-3000:]
    a, b = json.loads(out2.read_text()), json.loads(out1.read_text())
    assert_same(a, b)
    assert_same(b, reference(pool, "tiny-llama"))          # the solver's plan = the hand-built one
    # measured beside predicted, on stdout and in the file
    line = json.loads(r1.stdout.strip().splitlines()[-1])
    for s in (a, line):
        assert s["ttft_s"] > 0 and s["tpot_s"] > 0
        assert s["predicted"]["tpot_s"] > 0 and s["predicted"]["ttft_s"] > 0
    assert "TTFT" in r1.stderr and "predicted" in r1.stderr


def test_refusals_exit_2_without_a_traceback(tmp_path):
    from planner.plan.planfile import write_plan
    from runtime.local import make_plan
    train = write_plan(make_plan("tiny-llama"), tmp_path / "infer_train.yaml")
    two = write_plan(serving_plan(tp=2), tmp_path / "infer_two.yaml")
    ep = write_plan(serving_plan("tiny-moe", dp=2, ep=4, batch=2), tmp_path / "infer_ep.yaml")
    pd = write_plan(serving_plan().replace(serving={"batching": "disaggregated", "disaggregation": {
        "prefill": {"tp": 1, "pp": 1, "ep": 1, "replicas": 1}, "decode": {"tp": 1, "pp": 1, "ep": 1, "replicas": 1}}}),
        tmp_path / "infer_pd.yaml")
    for path, msg in ((train, "serves inference plans"), (two, "needs tp*pp*replicas = 2*1*1 = 2 processes"),
                      (ep, "ep 4 must be a multiple of tp 1 dividing tp*replicas = 2"),
                      (pd, "disaggregated prefill/decode")):
        r = subprocess.run([sys.executable, "-m", "runtime.serve", "--plan", str(path)], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert msg in r.stderr and "Traceback" not in r.stderr
    one = write_plan(serving_plan(), tmp_path / "infer_one.yaml")
    r = subprocess.run([sys.executable, "-m", "runtime.serve", "--plan", str(one), "--prompt-len", "600"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "max_seq_len" in r.stderr


@pytest.mark.gpu
def test_serve_on_one_gpu(tmp_path):  # pragma: no cover - needs a GPU
    from planner.plan.planfile import write_plan
    plan = serving_plan("tiny-llama")
    path = write_plan(plan, tmp_path / "infer_gpu.yaml")
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-m", "runtime.serve", "--plan", str(path), "--device", "cuda",
                        "--json-out", str(out)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["device"] == "cuda" and len(s["tokens"]) == 4 and s["tpot_s"] > 0
