"""vLLM: a ``vllm serve`` command for an inference plan.

Flags from ``vllm/engine/arg_utils.py`` (EngineArgs, vLLM 0.9+): ``--tensor-parallel-size``,
``--pipeline-parallel-size``, ``--data-parallel-size`` (replicas), ``--enable-expert-parallel``
(MoE layers then shard over tp * dp ranks, so the plan's ep must equal tp * dp),
``--max-model-len`` (prompt + output), ``--max-num-seqs`` (the plan's concurrent sequences),
``--gpu-memory-utilization``: the fraction of *total* GPU memory the instance may use, set to
the estimate's peak (weights + KV cache + activations + other) rounded up to 0.01. Multi-node:
replicas that fit a node spread with ``--data-parallel-size-local``/``--data-parallel-start-rank``
(workers ``--headless``); one replica larger than a node uses ``--nnodes``/``--node-rank``/
``--master-addr`` (the multiprocessing backend).
"""
from __future__ import annotations

from emitters.base import CannotExpress, Raw, bash_array, require, script_header, sh_default
from emitters.serving import WEIGHT_DTYPES, check, fraction, layout, memory
from planner.plan.planfile import Plan

TARGET = "vllm"
MODE = "infer"
FORMAT = "vLLM >= 0.9 `vllm serve` flags (vllm/engine/arg_utils.py EngineArgs)"
SUMMARY = "vllm serve with tensor/pipeline/data/expert parallel, memory utilization and context length"
RUN = ("`MODEL=<hf id or path> bash vllm.sh` (multi-node: on every node with `NODE_RANK=<i>` and "
       "`HEAD_ADDR=<node 0>`; the head serves the OpenAI API on port 8000).")

DP_RPC_PORT = 13345
MASTER_PORT = 29501


def serve_args(plan: Plan) -> tuple[list, list[str]]:
    """(flags after the model, notes for the header)."""
    check(plan, TARGET)
    p = plan.parallel
    w = plan.workload
    m = plan.model
    notes = []
    a: list = ["--tensor-parallel-size", p.tp, "--pipeline-parallel-size", p.pp, "--data-parallel-size", p.dp]
    if p.ep > 1:
        require(p.ep == p.tp * p.dp, TARGET, f"ep={p.ep} with tp={p.tp} dp={p.dp}",
                "--enable-expert-parallel shards MoE layers over tp * dp ranks", f"plan ep={p.tp * p.dp} or 1")
        a.append("--enable-expert-parallel")
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
    a += ["--max-model-len", w.seq_len, "--max-num-seqs", w.global_batch]
    mem = memory(plan)
    if "peak_bytes" in mem:
        total = plan.cluster.gpu.memory_bytes
        util = fraction(TARGET, "--gpu-memory-utilization", mem["peak_bytes"], total)
        a += ["--gpu-memory-utilization", f"{util:.2f}"]
        notes.append(f"--gpu-memory-utilization {util:.2f} = estimated peak {mem['peak_bytes'] / 2**30:.2f} GiB "
                     f"/ {total / 2**30:.2f} GiB per GPU, rounded up")
    else:
        notes.append("the plan has no memory estimate: vLLM's default --gpu-memory-utilization (0.9) applies")
    a += ["--seed", w.seed]
    if m.max_seq_len < w.seq_len:
        raise CannotExpress(TARGET, f"context {w.seq_len}", f"{m.name} supports {m.max_seq_len} tokens")
    return a, notes


def emit(plan: Plan) -> dict[str, str]:
    args, notes = serve_args(plan)
    lay = layout(plan, TARGET)
    p = plan.parallel
    usage = ["MODEL=<hf id or local path> bash vllm.sh [extra vllm serve flags]"] + notes
    body = sh_default("MODEL", plan.model.name)
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
