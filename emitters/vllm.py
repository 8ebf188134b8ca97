"""vLLM: ``vllm serve`` commands for an inference plan (aggregated, or disaggregated prefill/decode).

Flags from ``vllm/engine/arg_utils.py`` (EngineArgs, vLLM 0.9+): ``--tensor-parallel-size``,
``--pipeline-parallel-size``, ``--data-parallel-size`` (replicas), ``--enable-expert-parallel``
(MoE layers then shard over tp * dp ranks with data-parallel attention, so the plan's ep must
equal tp * dp), ``--max-model-len`` (``emitters.serving.context_limit``: the model's context, within
the KV pool), and the scheduler the plan assumed:
``--enable-chunked-prefill``, ``--max-num-batched-tokens`` (the token budget per step),
``--max-num-seqs`` (the concurrent requests), ``--block-size``, ``--gpu-memory-utilization``
(the engine's share of *total* GPU memory; ``emitters.serving.settings``). Multi-node: replicas
that fit a node spread with ``--data-parallel-size-local``/``--data-parallel-start-rank``
(workers ``--headless``); one replica larger than a node uses ``--nnodes``/``--node-rank``/
``--master-addr`` (the multiprocessing backend).

Disaggregated plans (docs/features/disagg_prefill.md, nixl_connector_usage.md): one ``vllm
serve`` per prefill and decode instance, each with ``--kv-transfer-config
'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`` (NIXL moves the KV cache; the role is
decided by the proxy), and vLLM's toy proxy (``tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py`` in the vLLM repository: ``--prefiller-hosts/--prefiller-ports/
--decoder-hosts/--decoder-ports``) in front. Needs: the ``nixl`` package (``pip install nixl``)
on every node, UCX reaching the other nodes (``UCX_NET_DEVICES``), ``VLLM_NIXL_SIDE_CHANNEL_PORT``
distinct per instance on one host, prompts longer than one block.
"""
from __future__ import annotations

from emitters.base import CannotExpress, Raw, bash_array, require, script_header
from emitters.serving import (WEIGHT_DTYPES, batching_note, check, context_limit, disaggregation, instances, layout,
                              model_line, pool_notes, settings)
from planner.plan.planfile import Plan

TARGET = "vllm"
MODE = "infer"
FORMAT = "vLLM >= 0.9 `vllm serve` flags (vllm/engine/arg_utils.py EngineArgs)"
SUMMARY = "vllm serve with tensor/pipeline/data/expert parallel, the planned scheduler, memory share, context"
RUN = ("`bash vllm.sh` (multi-node: on every node with `NODE_RANK=<i>` and `HEAD_ADDR=<node 0>`; the head "
       "serves the OpenAI API on port 8000).")
RUN_DISAGGREGATED = ("`INSTANCE=<i> bash prefill.sh` and `INSTANCE=<j> bash decode.sh` on the nodes the scripts name, "
                     "then `bash proxy.sh` (the OpenAI API in front of both pools).")

DP_RPC_PORT = 13345
MASTER_PORT = 29501
PREFILL_PORT = 8100
DECODE_PORT = 8200
NIXL_SIDE_PORT = 5600
KV_TRANSFER = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def _common(plan: Plan, tp: int, pp: int, dp: int, ep: int) -> tuple[list, list[str]]:
    """Flags for one engine instance of ``tp x pp`` (``dp`` replicas, ``ep`` experts)."""
    w = plan.workload
    m = plan.model
    notes = []
    a: list = ["--tensor-parallel-size", tp, "--pipeline-parallel-size", pp, "--data-parallel-size", dp]
    if ep > 1:
        require(ep == tp * dp, TARGET, f"ep={ep} with tp={tp} dp={dp}",
                "--enable-expert-parallel shards MoE layers over tp * dp ranks", f"plan ep={tp * dp} or 1")
        a.append("--enable-expert-parallel")
        notes.append(f"expert parallel over {ep} GPUs with data-parallel attention ({dp} attention replicas of tp{tp})")
    if w.dtype in WEIGHT_DTYPES:
        a += ["--dtype", WEIGHT_DTYPES[w.dtype]]
    elif w.dtype == "fp8":
        a += ["--dtype", "bfloat16", "--quantization", "fp8"]
    else:
        raise CannotExpress(TARGET, f"weights in {w.dtype}", "vLLM serves int8/int4 weights only from a "
                            "checkpoint quantized for a named method (AWQ, GPTQ, ...), which the plan does not name")
    kv = w.kv_dtype or w.dtype
    if kv == "fp8":
        a += ["--kv-cache-dtype", "fp8"]
    elif kv not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"KV cache in {kv}", "vLLM stores the KV cache in the model dtype or fp8")
    if m.max_seq_len < w.seq_len:
        raise CannotExpress(TARGET, f"context {w.seq_len}", f"{m.name} supports {m.max_seq_len} tokens")
    return a, notes


def serve_args(plan: Plan) -> tuple[list, list[str]]:
    """(flags after the model, notes for the header) of an aggregated plan."""
    check(plan, TARGET)
    p = plan.parallel
    a, notes = _common(plan, p.tp, p.pp, p.dp, p.ep)
    s = settings(plan, TARGET)
    a += _scheduler(plan, s, s.max_num_seqs)
    notes += [s.note, batching_note(s, TARGET)]
    return a, notes


def _scheduler(plan: Plan, s, seqs: int) -> list:
    w = plan.workload
    a: list = ["--max-model-len", context_limit(plan)]
    if s.token_budget is not None:
        a += ["--enable-chunked-prefill", "--max-num-batched-tokens", s.token_budget]
    a += ["--max-num-seqs", seqs]
    if s.block_tokens is not None:
        a += ["--block-size", s.block_tokens]
    return a + ["--gpu-memory-utilization", f"{s.utilization:.2f}", "--seed", w.seed]


def emit(plan: Plan) -> dict[str, str]:
    if disaggregation(plan):
        return emit_disaggregated(plan)
    args, notes = serve_args(plan)
    lay = layout(plan, TARGET)
    p = plan.parallel
    usage = ["bash vllm.sh [extra vllm serve flags]  (MODEL=<hf id or local path> overrides the model)"] + notes
    body = model_line(plan)
    if lay.nnodes > 1:
        usage.append(f"On each of the {lay.nnodes} nodes: NODE_RANK=<0..{lay.nnodes - 1}> HEAD_ADDR=<node 0> bash vllm.sh")
        body += (': "${NODE_RANK:?set NODE_RANK (0 on the head node)}"\n'
                 ': "${HEAD_ADDR:?set HEAD_ADDR to node 0 address}"\n')
        if lay.replicas_per_node:
            usage.append(f"{lay.replicas_per_node} replica(s) of tp*pp = {lay.replica_gpus} GPUs per node")
            args += ["--data-parallel-size-local", lay.replicas_per_node,
                     "--data-parallel-start-rank", Raw(f'"$((NODE_RANK * {lay.replicas_per_node}))"'),
                     "--data-parallel-address", Raw('"$HEAD_ADDR"'),
                     "--data-parallel-rpc-port", Raw(f'"${{DP_RPC_PORT:-{DP_RPC_PORT}}}"')]
        else:
            require(p.dp == 1, TARGET, f"dp={p.dp} replicas of {lay.replica_gpus} GPUs each spanning nodes",
                    "vLLM spans nodes with one replica (--nnodes) or spreads node-sized replicas, not both")
            usage.append(f"one replica of tp*pp = {lay.replica_gpus} GPUs over {lay.nnodes} nodes")
            args += ["--nnodes", lay.nnodes, "--node-rank", Raw('"$NODE_RANK"'),
                     "--master-addr", Raw('"$HEAD_ADDR"'), "--master-port", Raw(f'"${{MASTER_PORT:-{MASTER_PORT}}}"')]
        body += bash_array("SERVE_ARGS", args)
        body += 'if [ "$NODE_RANK" != 0 ]; then SERVE_ARGS+=(--headless); fi\n'
    else:
        body += bash_array("SERVE_ARGS", args)
    body += 'exec vllm serve "$MODEL" "${SERVE_ARGS[@]}" "$@"\n'
    return {"vllm.sh": script_header(plan, TARGET, FORMAT, usage) + body}


# --------------------------------------------------------------------------------------
# Disaggregated prefill / decode
# --------------------------------------------------------------------------------------

def _instance_case(insts, port0: int) -> str:
    """A bash ``case`` on INSTANCE setting the node, the GPUs and the port of each instance."""
    lines = ['case "$INSTANCE" in']
    for i in insts:
        lines.append(f'  {i.index}) NODE={i.node}; GPUS={i.visible}; PORT={port0 + i.index} ;;')
    lines.append(f'  *) echo "INSTANCE must be 0..{len(insts) - 1}" >&2; exit 2 ;;')
    lines.append("esac")
    return "\n".join(lines) + "\n"


def emit_disaggregated(plan: Plan) -> dict[str, str]:
    check(plan, TARGET)
    dis = disaggregation(plan)
    s = settings(plan, TARGET)
    insts = instances(plan, TARGET)
    files: dict[str, str] = {}
    for role, port0 in (("prefill", PREFILL_PORT), ("decode", DECODE_PORT)):
        pool = dis[role]
        mine = [i for i in insts if i.role == role]
        ep = int(pool["ep"])
        dp = ep // int(pool["tp"]) if ep > int(pool["tp"]) else 1
        require(dp == 1, TARGET, f"{role} pool ep={ep} over {dp} instances",
                "each disaggregated instance is its own vllm serve; expert parallel across instances needs "
                "one engine per pool", "plan the pool's ep within one instance (ep <= tp)")
        a, notes = _common(plan, int(pool["tp"]), int(pool["pp"]), 1, min(ep, int(pool["tp"])) if ep > 1 else 1)
        seqs = s.max_num_seqs if role == "decode" else max(1, (s.token_budget or 8192) // max(1, plan.workload.prompt_len))
        a += _scheduler(plan, s, seqs)
        a += ["--port", Raw('"$PORT"'), "--kv-transfer-config", KV_TRANSFER]
        usage = [f"INSTANCE=<0..{len(mine) - 1}> bash {role}.sh  on the node the case below names "
                 "(MODEL=<hf id or local path> overrides the model)"] + pool_notes(plan) + notes + [
                 s.note, "needs: pip install nixl; UCX_NET_DEVICES set to the NICs between the pools' nodes",
                 f"{role} instances listen on ports {port0}..{port0 + len(mine) - 1}"]
        body = model_line(plan)
        body += ': "${INSTANCE:?set INSTANCE to this ' + role + ' instance (0..' + str(len(mine) - 1) + ')}"\n'
        body += _instance_case(mine, port0)
        body += 'export CUDA_VISIBLE_DEVICES="$GPUS"\n'
        side = NIXL_SIDE_PORT + (0 if role == "prefill" else 100)
        body += f'export VLLM_NIXL_SIDE_CHANNEL_PORT="${{VLLM_NIXL_SIDE_CHANNEL_PORT:-$(({side} + INSTANCE * 8))}}"\n'
        body += bash_array("SERVE_ARGS", a)
        body += 'exec vllm serve "$MODEL" "${SERVE_ARGS[@]}" "$@"\n'
        files[f"{role}.sh"] = script_header(plan, TARGET, FORMAT, usage) + body
    pre = [i for i in insts if i.role == "prefill"]
    dec = [i for i in insts if i.role == "decode"]
    usage = ["PROXY=<vllm repo>/tests/v1/kv_connector/nixl_integration/toy_proxy_server.py "
             "NODE_ADDRS='<node 0 addr> <node 1 addr> ...' bash proxy.sh",
             "serves the OpenAI API on port ${PORT:-8000}; requests go prefill first, then decode"]
    body = (': "${PROXY:?set PROXY to tests/v1/kv_connector/nixl_integration/toy_proxy_server.py of the vLLM repository}"\n'
            'read -r -a ADDRS <<< "${NODE_ADDRS:-localhost}"\n'
            'addr() { if [ "$1" -lt "${#ADDRS[@]}" ]; then echo "${ADDRS[$1]}"; else echo localhost; fi; }\n')
    body += "PROXY_ARGS=(\n  --port \"${PORT:-8000}\"\n"
    body += "  --prefiller-hosts " + " ".join(f'"$(addr {i.node})"' for i in pre) + "\n"
    body += "  --prefiller-ports " + " ".join(str(PREFILL_PORT + i.index) for i in pre) + "\n"
    body += "  --decoder-hosts " + " ".join(f'"$(addr {i.node})"' for i in dec) + "\n"
    body += "  --decoder-ports " + " ".join(str(DECODE_PORT + i.index) for i in dec) + "\n)\n"
    body += 'exec "${PYTHON:-python3}" "$PROXY" "${PROXY_ARGS[@]}" "$@"\n'
    files["proxy.sh"] = script_header(plan, TARGET, FORMAT, usage) + body
    return files
