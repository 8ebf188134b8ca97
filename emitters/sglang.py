"""SGLang: a ``python -m sglang.launch_server`` command for an inference plan.

Flags from ``python/sglang/srt/server_args.py`` (SGLang 0.4-0.5): ``--tp-size``, ``--pp-size``,
``--dp-size`` (replicas), ``--context-length``, ``--max-running-requests``,
``--mem-fraction-static``: the fraction of GPU memory for the *static* pool, model weights plus
the KV cache, set from the estimate's ``weights_bytes + kv_cache_bytes`` rounded up to 0.01.
Multi-node: ``--nnodes``/``--node-rank``/``--dist-init-addr``. SGLang's ``--ep-size`` splits the
experts inside one tensor-parallel group, while the planner spreads them over replicas, so plans
with ep > 1 are refused here (the vllm target expresses them).
"""
from __future__ import annotations

from emitters.base import CannotExpress, Raw, bash_array, script_header, sh_default
from emitters.serving import WEIGHT_DTYPES, check, fraction, layout, memory
from planner.plan.planfile import Plan

TARGET = "sglang"
MODE = "infer"
FORMAT = "SGLang 0.5 `python -m sglang.launch_server` flags (python/sglang/srt/server_args.py)"
SUMMARY = "sglang.launch_server with tp/pp/dp sizes, static memory fraction and context length"
RUN = ("`MODEL=<hf id or path> bash sglang.sh` (multi-node: on every node with `NODE_RANK=<i>` and "
       "`HEAD_ADDR=<node 0>`); the server listens on port 30000.")

DIST_PORT = 50000
KV_DTYPES = {"fp8": "fp8_e4m3"}


def launch_args(plan: Plan) -> tuple[list, list[str]]:
    check(plan, TARGET)
    p = plan.parallel
    w = plan.workload
    if p.ep > 1:
        raise CannotExpress(TARGET, f"ep={p.ep} over {p.dp} replicas",
                            "SGLang's --ep-size splits the experts within one tensor-parallel group "
                            "(ep = tp); the plan spreads experts over data-parallel replicas",
                            "use the vllm target (--enable-expert-parallel) or plan ep=1")
    if w.dtype not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"weights in {w.dtype}", "SGLang's --dtype is float16, bfloat16 or "
                            "float32; quantized weights come from a quantized checkpoint")
    a: list = ["--tp-size", p.tp, "--pp-size", p.pp, "--dp-size", p.dp, "--dtype", WEIGHT_DTYPES[w.dtype]]
    kv = w.kv_dtype or w.dtype
    if kv in KV_DTYPES:
        a += ["--kv-cache-dtype", KV_DTYPES[kv]]
    elif kv not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"KV cache in {kv}", "SGLang stores the KV cache in the model dtype or fp8")
    a += ["--context-length", w.seq_len, "--max-running-requests", w.global_batch]
    notes = []
    mem = memory(plan)
    if "weights_bytes" in mem and "kv_cache_bytes" in mem:
        total = plan.cluster.gpu.memory_bytes
        static = mem["weights_bytes"] + mem["kv_cache_bytes"]
        frac = fraction(TARGET, "--mem-fraction-static", static, total)
        a += ["--mem-fraction-static", f"{frac:.2f}"]
        notes.append(f"--mem-fraction-static {frac:.2f} = (weights {mem['weights_bytes'] / 2**30:.2f} + KV cache "
                     f"{mem['kv_cache_bytes'] / 2**30:.2f} GiB) / {total / 2**30:.2f} GiB per GPU, rounded up")
    else:
        notes.append("the plan has no memory estimate: SGLang picks --mem-fraction-static itself")
    a += ["--random-seed", w.seed]
    return a, notes


def emit(plan: Plan) -> dict[str, str]:
    args, notes = launch_args(plan)
    lay = layout(plan, TARGET)
    usage = ["MODEL=<hf id or local path> bash sglang.sh [extra server flags]"] + notes
    body = sh_default("MODEL", plan.model.name) + 'PYTHON="${PYTHON:-python3}"\n'
    if lay.nnodes > 1:
        usage.append(f"On each of the {lay.nnodes} nodes: NODE_RANK=<0..{lay.nnodes - 1}> HEAD_ADDR=<node 0> bash sglang.sh")
        body += (': "${NODE_RANK:?set NODE_RANK (0 on the head node)}"\n'
                 ': "${HEAD_ADDR:?set HEAD_ADDR to node 0 address}"\n')
        args += ["--nnodes", lay.nnodes, "--node-rank", Raw('"$NODE_RANK"'),
                 "--dist-init-addr", Raw(f'"$HEAD_ADDR:${{DIST_PORT:-{DIST_PORT}}}"')]
    body += bash_array("SERVER_ARGS", args)
    body += 'exec "$PYTHON" -m sglang.launch_server --model-path "$MODEL" "${SERVER_ARGS[@]}" "$@"\n'
    return {"sglang.sh": script_header(plan, TARGET, FORMAT, usage) + body}
