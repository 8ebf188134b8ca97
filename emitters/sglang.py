"""SGLang: ``python -m sglang.launch_server`` commands for an inference plan (aggregated, or
disaggregated prefill/decode behind ``sglang_router``).

Flags from ``python/sglang/srt/server_args.py`` (SGLang 0.4-0.5): ``--tp-size``, ``--pp-size``,
``--dp-size`` (replicas), ``--context-length``, and the scheduler the plan assumed:
``--chunked-prefill-size`` (the token budget per step), ``--enable-mixed-chunk`` (prefill chunks
share steps with running decodes, as the plan's in-flight model has them; SGLang's default runs
prefill batches apart from decode batches), ``--max-running-requests``,
``--mem-fraction-static``: the fraction of GPU memory for the *static* pool, model weights plus
the KV cache: the plan's engine share minus its activations and other buffers. MoE plans whose
experts span all replicas (ep = tp x dp) run as SGLang's data-parallel attention: ``--tp-size ep
--dp-size dp --enable-dp-attention --ep-size ep`` (each attention replica tp-way, the experts over
all GPUs); other ep are refused. Multi-node: ``--nnodes``/``--node-rank``/``--dist-init-addr``.

Disaggregated plans (docs/advanced_features/pd_disaggregation.md): one server per prefill and
decode instance with ``--disaggregation-mode prefill|decode``, ``--disaggregation-transfer-backend``
(``mooncake`` by default, ``nixl``), each prefill with its own ``--disaggregation-bootstrap-port``,
``--base-gpu-id`` placing it on its node, and ``python -m sglang_router.launch_router
--pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ...`` in front. Needs: the
``sglang-router`` package, and Mooncake (``pip install mooncake-transfer-engine``) or NIXL with
RDMA between the pools' nodes (``--disaggregation-ib-device`` via ``IB_DEVICE``).
"""
from __future__ import annotations

from emitters.base import CannotExpress, Raw, bash_array, require, script_header
from emitters.serving import (WEIGHT_DTYPES, batching_note, check, context_limit, disaggregation, fraction, instances,
                              layout, memory, model_line, pool_notes, settings)
from planner.plan.planfile import Plan

TARGET = "sglang"
MODE = "infer"
FORMAT = "SGLang 0.5 `python -m sglang.launch_server` flags (python/sglang/srt/server_args.py)"
SUMMARY = "sglang.launch_server with tp/pp/dp sizes, the planned chunked prefill, static memory fraction, context"
RUN = ("`bash sglang.sh` (multi-node: on every node with `NODE_RANK=<i>` and `HEAD_ADDR=<node 0>`); the "
       "server listens on port 30000.")
RUN_DISAGGREGATED = "`INSTANCE=<i> bash prefill.sh`, `INSTANCE=<j> bash decode.sh`, then `bash router.sh`."

DIST_PORT = 50000
PREFILL_PORT = 30000
DECODE_PORT = 30100
BOOTSTRAP_PORT = 8998
KV_DTYPES = {"fp8": "fp8_e4m3"}


def _parallel(plan: Plan, tp: int, pp: int, dp: int, ep: int) -> tuple[list, list[str]]:
    if ep > 1:
        if ep != tp * dp:
            raise CannotExpress(TARGET, f"ep={ep} over {dp} replicas of tp{tp}",
                                "SGLang spreads experts over the whole tensor-parallel group, with data-parallel "
                                "attention inside it (ep = tp-size)", f"plan ep={tp * dp} or 1")
        return (["--tp-size", ep, "--pp-size", pp, "--dp-size", dp, "--enable-dp-attention", "--ep-size", ep],
                [f"data-parallel attention: {dp} attention replicas of tp{tp}, experts over {ep} GPUs"])
    return ["--tp-size", tp, "--pp-size", pp, "--dp-size", dp], []


def _dtypes(plan: Plan) -> list:
    w = plan.workload
    if w.dtype not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"weights in {w.dtype}", "SGLang's --dtype is float16, bfloat16 or "
                            "float32; quantized weights come from a quantized checkpoint")
    a: list = ["--dtype", WEIGHT_DTYPES[w.dtype]]
    kv = w.kv_dtype or w.dtype
    if kv in KV_DTYPES:
        a += ["--kv-cache-dtype", KV_DTYPES[kv]]
    elif kv not in WEIGHT_DTYPES:
        raise CannotExpress(TARGET, f"KV cache in {kv}", "SGLang stores the KV cache in the model dtype or fp8")
    return a


def _scheduler(plan: Plan, s, running: int) -> tuple[list, list[str]]:
    w = plan.workload
    a: list = ["--context-length", context_limit(plan)]
    if s.token_budget is not None:
        a += ["--chunked-prefill-size", s.token_budget, "--enable-mixed-chunk"]
    a += ["--max-running-requests", running]
    notes = []
    mem = memory(plan)
    total = plan.cluster.gpu.memory_bytes
    if {"activations_bytes", "other_bytes"} <= set(mem):
        buffers = mem["activations_bytes"] + mem["other_bytes"]
        frac = fraction(TARGET, "--mem-fraction-static", max(0.0, s.utilization * total - buffers), total)
        frac = min(frac, s.utilization)
        notes.append(f"--mem-fraction-static {frac:.2f} = (engine share {s.utilization:.2f} x "
                     f"{total / 2**30:.2f} GiB - activations and buffers {buffers / 2**30:.2f} GiB) / "
                     f"{total / 2**30:.2f} GiB: weights plus the KV pool")
        a += ["--mem-fraction-static", f"{frac:.2f}"]
    else:
        notes.append("the plan has no memory estimate: SGLang picks --mem-fraction-static itself")
    a += ["--random-seed", w.seed]
    return a, notes


def launch_args(plan: Plan) -> tuple[list, list[str]]:
    check(plan, TARGET)
    p = plan.parallel
    a, notes = _parallel(plan, p.tp, p.pp, p.dp, p.ep)
    a += _dtypes(plan)
    s = settings(plan, TARGET)
    sa, sn = _scheduler(plan, s, s.max_num_seqs)
    return a + sa, notes + sn + [s.note, batching_note(s, TARGET)]


def emit(plan: Plan) -> dict[str, str]:
    if disaggregation(plan):
        return emit_disaggregated(plan)
    args, notes = launch_args(plan)
    lay = layout(plan, TARGET)
    usage = ["bash sglang.sh [extra server flags]  (MODEL=<hf id or local path> overrides the model)"] + notes
    body = model_line(plan) + 'PYTHON="${PYTHON:-python3}"\n'
    if lay.nnodes > 1:
        usage.append(f"On each of the {lay.nnodes} nodes: NODE_RANK=<0..{lay.nnodes - 1}> HEAD_ADDR=<node 0> bash sglang.sh")
        body += (': "${NODE_RANK:?set NODE_RANK (0 on the head node)}"\n'
                 ': "${HEAD_ADDR:?set HEAD_ADDR to node 0 address}"\n')
        args += ["--nnodes", lay.nnodes, "--node-rank", Raw('"$NODE_RANK"'),
                 "--dist-init-addr", Raw(f'"$HEAD_ADDR:${{DIST_PORT:-{DIST_PORT}}}"')]
    body += bash_array("SERVER_ARGS", args)
    body += 'exec "$PYTHON" -m sglang.launch_server --model-path "$MODEL" "${SERVER_ARGS[@]}" "$@"\n'
    return {"sglang.sh": script_header(plan, TARGET, FORMAT, usage) + body}


# --------------------------------------------------------------------------------------
# Disaggregated prefill / decode
# --------------------------------------------------------------------------------------

def emit_disaggregated(plan: Plan) -> dict[str, str]:
    check(plan, TARGET)
    dis = disaggregation(plan)
    s = settings(plan, TARGET)
    insts = instances(plan, TARGET)
    files: dict[str, str] = {}
    for role, port0 in (("prefill", PREFILL_PORT), ("decode", DECODE_PORT)):
        pool = dis[role]
        tp, pp, ep = int(pool["tp"]), int(pool["pp"]), int(pool["ep"])
        require(ep <= tp, TARGET, f"{role} pool ep={ep} over instances of tp{tp}",
                "each disaggregated instance is its own server", "plan the pool's ep within one instance (ep <= tp)")
        mine = [i for i in insts if i.role == role]
        a, notes = _parallel(plan, tp, pp, 1, 1)
        a += _dtypes(plan)
        running = s.max_num_seqs if role == "decode" else max(1, (s.token_budget or 8192) // max(1, plan.workload.prompt_len))
        sa, sn = _scheduler(plan, s, running)
        a += sa + ["--disaggregation-mode", role,
                   "--disaggregation-transfer-backend", Raw('"${TRANSFER_BACKEND:-mooncake}"'),
                   "--port", Raw('"$PORT"'), "--base-gpu-id", Raw('"$BASE_GPU"'), "--host", "0.0.0.0"]
        if role == "prefill":
            a += ["--disaggregation-bootstrap-port", Raw(f'"$(({BOOTSTRAP_PORT} + INSTANCE))"')]
        usage = [f"INSTANCE=<0..{len(mine) - 1}> bash {role}.sh  on the node the case below names "
                 "(MODEL=<hf id or local path> overrides the model; TRANSFER_BACKEND=mooncake|nixl; "
                 "IB_DEVICE=mlx5_0,... for RDMA)"] + pool_notes(plan) + notes + sn + [s.note]
        body = model_line(plan) + 'PYTHON="${PYTHON:-python3}"\n'
        body += ': "${INSTANCE:?set INSTANCE to this ' + role + ' instance (0..' + str(len(mine) - 1) + ')}"\n'
        body += 'case "$INSTANCE" in\n'
        for i in mine:
            body += f"  {i.index}) NODE={i.node}; BASE_GPU={i.first_gpu}; PORT={port0 + i.index} ;;\n"
        body += f'  *) echo "INSTANCE must be 0..{len(mine) - 1}" >&2; exit 2 ;;\nesac\n'
        body += bash_array("SERVER_ARGS", a)
        body += 'if [ -n "${IB_DEVICE:-}" ]; then SERVER_ARGS+=(--disaggregation-ib-device "$IB_DEVICE"); fi\n'
        body += 'exec "$PYTHON" -m sglang.launch_server --model-path "$MODEL" "${SERVER_ARGS[@]}" "$@"\n'
        files[f"{role}.sh"] = script_header(plan, TARGET, FORMAT, usage) + body
    pre = [i for i in insts if i.role == "prefill"]
    dec = [i for i in insts if i.role == "decode"]
    usage = ["NODE_ADDRS='<node 0 addr> <node 1 addr> ...' bash router.sh  (needs pip install sglang-router)",
             "serves the OpenAI API on port ${PORT:-8000}"]
    body = ('read -r -a ADDRS <<< "${NODE_ADDRS:-127.0.0.1}"\n'
            'addr() { if [ "$1" -lt "${#ADDRS[@]}" ]; then echo "${ADDRS[$1]}"; else echo 127.0.0.1; fi; }\n'
            "ROUTER_ARGS=(\n  --pd-disaggregation\n")
    for i in pre:
        body += f'  --prefill "http://$(addr {i.node}):{PREFILL_PORT + i.index}" {BOOTSTRAP_PORT + i.index}\n'
    for i in dec:
        body += f'  --decode "http://$(addr {i.node}):{DECODE_PORT + i.index}"\n'
    body += '  --host 0.0.0.0\n  --port "${PORT:-8000}"\n)\n'
    body += 'exec "${PYTHON:-python3}" -m sglang_router.launch_router "${ROUTER_ARGS[@]}" "$@"\n'
    files["router.sh"] = script_header(plan, TARGET, FORMAT, usage) + body
    return files
