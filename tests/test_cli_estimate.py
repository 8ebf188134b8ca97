"""`planner estimate`: the JSON contract, exit codes and messages for bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

ESTIMATE_KEYS = {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                 "hardware_tflops_per_gpu", "mfu", "hfu", "memory", "time"}
MEMORY_KEYS = {"peak_bytes", "weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"}
TIME_KEYS = {"compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "dp_comm_s", "pp_comm_s",
             "bubble_s", "optimizer_s"}
PARALLEL_KEYS = {"tp", "pp", "dp", "cp", "ep", "zero", "sp", "vpp", "micro_batch", "grad_accum", "recompute"}


def planner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=120)


BASE = ["--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
        "--seq-len", "8192"]


def test_estimate_json_contract():
    r = planner("estimate", *BASE, "--tp", "8", "--pp", "2", "--recompute", "selective", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert PARALLEL_KEYS <= set(d["parallel"])
    assert d["parallel"]["dp"] == 4 and d["parallel"]["grad_accum"] == 128
    e = d["estimate"]
    assert ESTIMATE_KEYS <= set(e) and MEMORY_KEYS <= set(e["memory"]) and TIME_KEYS <= set(e["time"])
    assert sum(e["time"][k] for k in TIME_KEYS) == pytest.approx(e["step_time_s"], rel=1e-9)
    parts = sum(e["memory"][k] for k in MEMORY_KEYS - {"peak_bytes"})
    assert parts == pytest.approx(e["memory"]["peak_bytes"], rel=1e-9)
    assert 0 < e["mfu"] <= e["hfu"] < 1


def test_estimate_human_output():
    r = planner("estimate", *BASE, "--tp", "8", "--pp", "2")
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stdout and "peak" in r.stdout and "bubble" in r.stdout


@pytest.mark.parametrize("args,code,msg", [
    (["--model", "llama-3-70x", "--cluster", "dgx-h100", "--global-batch", "8", "--seq-len", "128"], 2,
     "did you mean llama-3-70b"),
    (["--model", "llama-3-8b", "--cluster", "dgx-h10", "--global-batch", "8", "--seq-len", "128"], 2,
     "did you mean dgx-h100"),
    ([*BASE, "--tp", "3"], 2, "tp*pp*cp = 3*1*1 = 3 does not divide the 64 GPUs"),
    ([*BASE, "--tp", "8", "--dp", "4"], 2, "tp*pp*dp*cp = 8*1*4*1 = 32, but there are 64 GPUs"),
    (["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch", "32",
      "--seq-len", "4096", "--ep", "3", "--tp", "2"], 2, "ep 3 does not divide experts 8"),
    ([*BASE[:-1], "0"], 2, "--seq-len must be > 0, got 0"),
    (["--cluster", "dgx-h100"], 2, "missing --model"),
])
def test_bad_input_exits_2_with_numbers(args, code, msg):
    r = planner("estimate", *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert msg in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_config_json(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"model_type": "t5", "d_model": 512}')
    r = planner("estimate", "--model", str(f), "--cluster", "dgx-h100", "--global-batch", "8", "--seq-len", "128")
    assert r.returncode == 2 and str(f) in r.stderr and "model_type" in r.stderr and "llama" in r.stderr
    f.write_text('{"model_type": "llama", "hidden_size": 64')
    r = planner("estimate", "--model", str(f), "--cluster", "dgx-h100", "--global-batch", "8", "--seq-len", "128")
    assert r.returncode == 2 and "not valid JSON" in r.stderr


def test_hf_config_estimates(tmp_path):
    r = planner("estimate", "--model", "tests/data/hf/mistral-7b.json", "--cluster", "dgx-a100-80gb", "--gpus", "8",
                "--global-batch", "64", "--seq-len", "4096", "--zero", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["estimate"]["step_time_s"] > 0
