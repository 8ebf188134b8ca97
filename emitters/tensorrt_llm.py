"""TensorRT-LLM: a ``trtllm-serve`` command (PyTorch backend) and its extra LLM-API options YAML.

Flags from ``tensorrt_llm/commands/serve.py`` (TensorRT-LLM 1.x): ``--tp_size``, ``--pp_size``,
``--gpus_per_node``, ``--max_batch_size`` (the plan's concurrent requests), ``--max_num_tokens``
(the token budget per in-flight batching iteration), ``--max_seq_len`` (prompt + output),
``--kv_cache_free_gpu_memory_fraction``: the fraction of the memory left *after* weights and
buffers that goes to the KV cache, set so the pool is the one the plan sized (the engine share
``emitters.serving.settings`` less weights and buffers, over what is free after them), rounded
up to 0.01. The ``--extra_llm_api_options`` YAML holds the dtypes (``dtype``,
``kv_cache_config.dtype``) and ``enable_chunked_prefill: true`` (context chunks share iterations
with generation, as the plan's in-flight model has them). One server is one replica on one node;
MoE plans with the experts over all of tp1 replicas (ep = dp) run as one server with attention
data parallelism (``--tp_size ep --ep_size ep``, ``enable_attention_dp: true``); other
data-parallel replicas, plans spanning nodes and disaggregated plans are refused.
"""
from __future__ import annotations

from emitters.base import CannotExpress, Raw, bash_array, require, script_header
from emitters.encode import yaml_document
from emitters.serving import (WEIGHT_DTYPES, batching_note, check, fraction, layout, memory, model_line,
                              require_aggregated, settings)
from planner.plan.planfile import Plan

TARGET = "tensorrt-llm"
MODE = "infer"
FORMAT = "TensorRT-LLM 1.x `trtllm-serve` flags (tensorrt_llm/commands/serve.py) + LLM API options YAML"
SUMMARY = "trtllm-serve (PyTorch backend) with tp/pp sizes, KV-cache memory fraction and limits"
RUN = "`bash trtllm.sh` on the node (MODEL=<hf id or path> overrides the model); the server listens on port 8000."


def serve_args(plan: Plan) -> tuple[list, dict, list[str]]:
    require_aggregated(plan, TARGET)        # first: a disaggregated plan's pools are checked apart
    check(plan, TARGET)
    p = plan.parallel
    w = plan.workload
    extra: dict = {}
    notes = []
    tp_size, ep_size = p.tp, 1
    if p.ep > 1:
        if not (p.tp == 1 and p.ep == p.dp):
            raise CannotExpress(TARGET, f"ep={p.ep} over {p.dp} replicas of tp{p.tp}",
                                "trtllm-serve spreads experts with --ep_size over one server's ranks; with replicas "
                                "that is attention data parallelism, one rank per attention replica (tp=1, ep=dp)",
                                "use the vllm or sglang target, or plan tp=1 ep=replicas")
        tp_size, ep_size = p.ep, p.ep
        extra["enable_attention_dp"] = True
        notes.append(f"attention data parallel over {p.dp} ranks, experts over {p.ep} (one server)")
    else:
        require(p.dp == 1, TARGET, f"dp={p.dp} replicas", "trtllm-serve serves one replica",
                "start one server per replica behind a load balancer, or use vllm/sglang")
    lay = layout(plan, TARGET)
    require(lay.nnodes == 1, TARGET, f"a replica of {lay.replica_gpus} GPUs over {lay.nnodes} nodes",
            "multi-node trtllm-serve runs under MPI/Slurm (trtllm-llmapi-launch), which this emitter "
            "does not write", "use the vllm or sglang target")
    if w.dtype not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"weights in {w.dtype}", "quantized weights come from a quantized "
                            "checkpoint (ModelOpt), which the plan does not name")
    extra["dtype"] = WEIGHT_DTYPES[w.dtype]
    kv = w.kv_dtype or w.dtype
    kv_cfg: dict = {}
    if kv == "fp8":
        kv_cfg["dtype"] = "fp8"
    elif kv not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"KV cache in {kv}", "TensorRT-LLM stores the KV cache in the model dtype or fp8")
    s = settings(plan, TARGET)
    if s.token_budget is not None:
        extra["enable_chunked_prefill"] = True
    a: list = ["--backend", "pytorch", "--tp_size", tp_size, "--pp_size", p.pp]
    if ep_size > 1:
        a += ["--ep_size", ep_size]
    a += ["--gpus_per_node", plan.cluster.gpus_per_node, "--max_batch_size", s.max_num_seqs]
    if s.token_budget is not None:
        a += ["--max_num_tokens", s.token_budget]
    a += ["--max_seq_len", w.seq_len]
    mem = memory(plan)
    if {"weights_bytes", "activations_bytes", "other_bytes"} <= set(mem):
        total = plan.cluster.gpu.memory_bytes
        fixed = mem["weights_bytes"] + mem["activations_bytes"] + mem["other_bytes"]
        free = total - fixed
        pool = float((plan.estimate or {}).get("schedule", {}).get("kv_pool_bytes") or (s.utilization * total - fixed))
        pool = max(pool, mem.get("kv_cache_bytes", 0.0))
        frac = fraction(TARGET, "--kv_cache_free_gpu_memory_fraction", pool, free)
        a += ["--kv_cache_free_gpu_memory_fraction", f"{frac:.2f}"]
        kv_cfg["free_gpu_memory_fraction"] = frac
        notes.append(f"--kv_cache_free_gpu_memory_fraction {frac:.2f} = the plan's KV pool "
                     f"{pool / 2**30:.2f} GiB / {free / 2**30:.2f} GiB left after weights and buffers, rounded up")
    else:
        notes.append("the plan has no memory estimate: TensorRT-LLM's default KV fraction (0.9) applies")
    notes += [s.note, batching_note(s, TARGET)]
    if kv_cfg:
        extra["kv_cache_config"] = kv_cfg
    return a, extra, notes


def emit(plan: Plan) -> dict[str, str]:
    args, extra, notes = serve_args(plan)
    usage = ["bash trtllm.sh [extra trtllm-serve flags]  (MODEL=<hf id or local path> overrides the model)"] + notes
    body = model_line(plan) + 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    body += bash_array("SERVE_ARGS", args + ["--extra_llm_api_options", Raw('"$HERE/trtllm_extra.yaml"')])
    body += 'exec trtllm-serve "$MODEL" "${SERVE_ARGS[@]}" "$@"\n'
    extra_text = ("# LLM API options for trtllm-serve --extra_llm_api_options (generated by planner emit)\n"
                  + yaml_document(extra))
    return {"trtllm.sh": script_header(plan, TARGET, FORMAT, usage) + body, "trtllm_extra.yaml": extra_text}
