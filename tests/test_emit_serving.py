"""Serving files a user can run: the model id, the scheduler flags the plan assumed, the memory
share, and the disaggregated prefill/decode scripts (vLLM + NIXL proxy, SGLang + router), run
with bash against fake launchers and parsed with each server's documented flags (the parsers
of test_emit_roundtrip) and the vLLM toy proxy's own argument list."""
from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from emitters.serving import context_limit
from test_emit_roundtrip import sglang_parser, vllm_parser
from test_emit_support import examples, write

pytestmark = pytest.mark.subprocess     # the emitted scripts run under bash

FAKE = """#!{python}
import json, os, sys
with open(os.environ["ARGV_OUT"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "env": {{k: os.environ.get(k)
                        for k in ("CUDA_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_PORT")}}}}) + "\\n")
"""


def run(script: Path, fakes: list[str], env: dict) -> tuple[int, list[dict], str]:
    b = script.parent.parent / "fakebin"
    b.mkdir(exist_ok=True)
    for n in fakes:
        f = b / n
        f.write_text(FAKE.format(python=sys.executable))
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    out = script.parent / "argv.jsonl"
    if out.exists():
        out.unlink()
    e = {k: v for k, v in os.environ.items() if k not in ("INSTANCE", "MODEL", "PROXY", "NODE_ADDRS")}
    e.update({"PATH": f"{b}:{e['PATH']}", "ARGV_OUT": str(out), "PYTHON": str(b / "python-fake")}, **env)
    r = subprocess.run(["bash", str(script)], env=e, capture_output=True, text=True, timeout=60)
    calls = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    return r.returncode, calls, r.stderr


def toy_proxy_parser() -> argparse.ArgumentParser:
    """vLLM tests/v1/kv_connector/nixl_integration/toy_proxy_server.py parse_args."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="localhost")
    p.add_argument("--prefiller-hosts", "--prefiller-host", nargs="+", default=["localhost"])
    p.add_argument("--prefiller-ports", "--prefiller-port", type=int, nargs="+", default=[8100])
    p.add_argument("--decoder-hosts", "--decoder-host", nargs="+", default=["localhost"])
    p.add_argument("--decoder-ports", "--decoder-port", type=int, nargs="+", default=[8200])
    return p


PD = "llama-3.1-70b-serve-pd-h100x8"


def _pools(plan):
    dis = plan.serving["disaggregation"]
    return dis["prefill"], dis["decode"]


def test_vllm_disaggregated_scripts(tmp_path):
    plan = examples()[PD]
    pre, dec = _pools(plan)
    out = write(plan, "vllm", tmp_path / "out")
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".sh") == ["decode.sh", "prefill.sh", "proxy.sh"]
    seen_gpus: set[str] = set()
    for role, pool in (("prefill", pre), ("decode", dec)):
        ports, sides = [], []
        for i in range(pool["replicas"]):
            rc, calls, err = run(out / f"{role}.sh", ["vllm"], {"INSTANCE": str(i)})
            assert rc == 0, err
            (call,) = calls
            assert call["argv"][:2] == ["serve", "meta-llama/Llama-3.1-70B-Instruct"]       # the HF id
            a = vllm_parser().parse_args(call["argv"][1:])
            assert (a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size) == \
                (pool["tp"], pool["pp"], 1)
            assert json.loads(a.kv_transfer_config) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
            sched = plan.serving["scheduler"]
            assert (a.max_num_batched_tokens, a.block_size) == (sched["token_budget"], sched["block_tokens"])
            assert a.gpu_memory_utilization == pytest.approx(sched["gpu_memory_utilization"])
            # longer requests than planned are accepted (up to what the KV pool holds), not refused
            assert a.enable_chunked_prefill and a.max_model_len == context_limit(plan) > plan.workload.seq_len
            gpus = call["env"]["CUDA_VISIBLE_DEVICES"].split(",")
            assert len(gpus) == pool["tp"] * pool["pp"] and not seen_gpus & set(gpus)   # no GPU shared
            seen_gpus |= set(gpus)
            ports.append(a.port)
            sides.append(call["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        assert len(set(ports)) == pool["replicas"] and len(set(sides)) == pool["replicas"]
    assert len(seen_gpus) == plan.world_size == 8
    # an instance the plan does not have is refused by the script
    rc, _, err = run(out / "prefill.sh", ["vllm"], {"INSTANCE": str(pre["replicas"])})
    assert rc == 2 and "INSTANCE must be" in err
    rc, calls, err = run(out / "proxy.sh", ["python-fake"], {"PROXY": "/x/toy_proxy_server.py", "NODE_ADDRS": "n0"})
    assert rc == 0, err
    a = toy_proxy_parser().parse_args(calls[0]["argv"][1:])
    assert calls[0]["argv"][0] == "/x/toy_proxy_server.py"
    assert len(a.prefiller_hosts) == len(a.prefiller_ports) == pre["replicas"]
    assert len(a.decoder_hosts) == len(a.decoder_ports) == dec["replicas"]
    assert set(a.prefiller_hosts) | set(a.decoder_hosts) == {"n0"}


def test_sglang_disaggregated_scripts(tmp_path):
    plan = examples()[PD]
    pre, dec = _pools(plan)
    out = write(plan, "sglang", tmp_path / "out")
    bases = {}
    for role, pool in (("prefill", pre), ("decode", dec)):
        for i in range(pool["replicas"]):
            rc, calls, err = run(out / f"{role}.sh", ["python-fake"], {"INSTANCE": str(i)})
            assert rc == 0, err
            argv = calls[0]["argv"]
            assert argv[:2] == ["-m", "sglang.launch_server"]
            a = sglang_parser().parse_args(argv[2:])
            assert a.model_path == "meta-llama/Llama-3.1-70B-Instruct"
            assert (a.disaggregation_mode, a.tp_size, a.pp_size) == (role, pool["tp"], pool["pp"])
            assert a.disaggregation_transfer_backend == "mooncake" and a.enable_mixed_chunk
            assert (a.disaggregation_bootstrap_port is not None) == (role == "prefill")
            bases[(role, i)] = (a.base_gpu_id, a.port)
    firsts = sorted(b for b, _ in bases.values())
    sizes = {("prefill", i): pre["tp"] * pre["pp"] for i in range(pre["replicas"])}
    sizes.update({("decode", i): dec["tp"] * dec["pp"] for i in range(dec["replicas"])})
    # the instances tile the node's GPUs without overlap
    assert sorted(g for k, (b, _) in bases.items() for g in range(b, b + sizes[k])) == list(range(8))
    assert firsts[0] == 0
    rc, calls, err = run(out / "router.sh", ["python-fake"], {"NODE_ADDRS": "10.0.0.1"})
    assert rc == 0, err
    argv = calls[0]["argv"]
    assert argv[:3] == ["-m", "sglang_router.launch_router", "--pd-disaggregation"]
    assert argv.count("--prefill") == pre["replicas"] and argv.count("--decode") == dec["replicas"]
    i = argv.index("--prefill")
    assert argv[i + 1].startswith("http://10.0.0.1:") and argv[i + 2].isdigit()      # URL and bootstrap port


def test_tensorrt_llm_refuses_disaggregated_and_says_what_writes_it():
    from emitters import CannotExpress, get
    with pytest.raises(CannotExpress, match="vllm or sglang"):
        get("tensorrt-llm").emit(examples()[PD])


def test_model_id_is_the_hf_id_never_a_catalog_nickname(tmp_path):
    plan = examples()["llama-3.1-70b-serve-agg-h100x8"]
    for target, fake, at in (("vllm", "vllm", 1), ("sglang", "python-fake", 3), ("tensorrt-llm", "trtllm-serve", 0)):
        out = write(plan, target, tmp_path / target)
        script = next(p for p in out.iterdir() if p.suffix == ".sh")
        rc, calls, err = run(script, [fake], {})
        assert rc == 0, err
        assert calls[0]["argv"][at] == "meta-llama/Llama-3.1-70B-Instruct" != plan.model.name
    # a plan with no Hugging Face id (a model without a public checkpoint, or an old plan): the script
    # stops and says to set MODEL rather than pass a catalog nickname
    for name in ("tiny-llama-serve-cpu", "llama-3-70b-serve-h100x8"):
        out = write(examples()[name], "vllm", tmp_path / name)
        rc, calls, err = run(out / "vllm.sh", ["vllm"], {})
        assert rc != 0 and not calls and "set MODEL" in err


def test_wide_ep_emits_data_parallel_attention(tmp_path):
    plan = examples()["mixtral-8x7b-serve-wide-ep-h100x8"]
    p = plan.parallel
    assert (p.tp, p.ep, p.dp) == (1, 8, 8)
    out = write(plan, "vllm", tmp_path / "v")
    rc, calls, err = run(out / "vllm.sh", ["vllm"], {})
    a = vllm_parser().parse_args(calls[0]["argv"][1:])
    assert (a.tensor_parallel_size, a.data_parallel_size, a.enable_expert_parallel) == (1, 8, True)
    out = write(plan, "sglang", tmp_path / "s")
    rc, calls, err = run(out / "sglang.sh", ["python-fake"], {})
    a = sglang_parser().parse_args(calls[0]["argv"][2:])
    assert (a.tp_size, a.dp_size, a.ep_size, a.enable_dp_attention) == (8, 8, 8, True)
