"""Round trips: every emitted file is parsed back and the parsed degrees, batch sizes and
recompute settings must equal the plan's.

Real parsers where the target installs on a CPU machine: torchrun's argument parser (always, it
is torch's), and from ``.venv-targets`` (``make targets-env``, which ``make test`` runs: a pip
``--target`` folder beside .venv, appended to sys.path here, so .venv's own packages win):
DeepSpeed's ``DeepSpeedConfig`` and launcher parser, Accelerate's launch parser and env
preparation (+ ``MegatronLMPlugin``), torchtitan 0.3.0's ``ConfigManager`` (``--module/--config``)
and its llama3 model built on the meta device, SGLang's ``ServerArgs`` parser and Megatron-Core's
``PipelineParallelLayerLayout``. Without .venv-targets those tests skip and say how to create it;
with it, an import that fails is a failure. vLLM is not installed there (``VLLM_SKIP``): its
tests use a parser built from the documented flags, and ``test_vllm_real_parser`` skips.
Parsers built from each target's documented flags (sources cited at each) run always, for
Megatron-LM, vLLM, SGLang, TensorRT-LLM, Slurm and the Kubernetes manifest.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml

from costmodel.specs import stages_from_counts
from emitters import torchtitan as tt_emitter
from emitters.base import recompute_per_stage, stage_layers
from emitters.serving import context_limit
from planner.plan.planfile import plan_from_dict, plan_to_dict

from test_emit_support import ROOT, examples, make_plan, run_script, split_module_args, write

pytestmark = pytest.mark.subprocess     # these tests start processes (the planner command, torchrun, scripts)

TRAIN = [n for n, p in examples().items() if p.mode == "train"]
INFER = [n for n, p in examples().items() if p.mode == "infer" and not (p.serving or {}).get("disaggregation")]


TARGETS_ENV = ROOT / ".venv-targets"      # Makefile: targets-env


def targets_package(module: str, what: str):
    """Import ``module`` with .venv-targets on sys.path: skip without that folder, fail when it is
    there and the import breaks (CI creates it, so a broken install is not a silent skip)."""
    if str(TARGETS_ENV) not in sys.path:
        sys.path.append(str(TARGETS_ENV))
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if (TARGETS_ENV / ".installed").exists():
            pytest.fail(f"{what} is in {TARGETS_ENV.name} but `import {module}` fails: {e}")
        pytest.skip(f"{what} is not installed: `make targets-env` puts it in {TARGETS_ENV.name}")


def vars_of(obj) -> dict:
    """A (slots) dataclass's fields as a dict, one level deep."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _emits(name: str, target: str) -> bool:
    from emitters import CannotExpress, get
    try:
        get(target).emit(examples()[name])
        return True
    except CannotExpress:
        return False


def plans_for(target: str, names) -> list[str]:
    return [n for n in names if _emits(n, target)]


def torchrun_args(argv: list[str]) -> argparse.Namespace:
    """torchrun's own parser (torch/distributed/run.py)."""
    from torch.distributed.run import get_args_parser
    return get_args_parser().parse_args(argv)


def runtime_args(argv: list[str]) -> argparse.Namespace:
    """The built-in runtime's contract: --plan PLAN [--steps N] [--checkpoint-dir D] [--checkpoint-every K] [--resume]."""
    try:
        from runtime.train import build_parser
        return build_parser().parse_args(argv)
    except ImportError:
        p = argparse.ArgumentParser()
        p.add_argument("--plan", required=True)
        p.add_argument("--steps", type=int)
        p.add_argument("--checkpoint-dir")
        p.add_argument("--checkpoint-every", type=int)
        p.add_argument("--resume", action="store_true")
        return p.parse_args(argv)


def _same_plan(path: str, plan) -> None:
    back = plan_from_dict(yaml.safe_load(Path(path).read_text()))
    assert plan_to_dict(back) == plan_to_dict(plan)


# --------------------------------------------------------------------------------------
# torchrun
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", plans_for("torchrun", TRAIN))
def test_torchrun_round_trip(name, tmp_path):
    plan = examples()[name]
    out = write(plan, "torchrun", tmp_path / "out")
    hetero = len(plan.cluster.groups) > 1
    nnodes = plan.rank_layout()["nodes"] if not hetero else plan.cluster.nodes
    total = 0
    for rank in range(nnodes):
        calls = run_script(out / "torchrun.sh", ["torchrun"], {"HEAD_ADDR": "head0", "NODE_RANK": str(rank)})
        assert [c["prog"] for c in calls] == ["torchrun"]
        own, prog = split_module_args(calls[0]["argv"])
        a = torchrun_args(own)
        assert a.module and a.training_script == "runtime.train"
        assert int(a.nnodes) == nnodes
        total += int(a.nproc_per_node)
        r = runtime_args(prog)
        _same_plan(r.plan, plan)
        assert r.steps == 10
        if hetero:
            assert a.rdzv_backend == "static" and a.master_addr == "head0" and a.node_rank == rank
        else:
            assert a.rdzv_backend == "c10d"
            assert a.rdzv_endpoint == ("localhost:0" if nnodes == 1 else "head0:29400")
            assert int(a.nproc_per_node) * nnodes == plan.world_size
            break   # every node runs the same command
    if hetero:
        assert total == plan.world_size


def test_torchrun_passes_runtime_options(tmp_path):
    plan = make_plan(tp=2, dp=2, micro_batch=2, grad_accum=2)
    out = write(plan, "torchrun", tmp_path / "out")
    calls = run_script(out / "torchrun.sh", ["torchrun"], {"STEPS": "3", "CHECKPOINT_DIR": "/ck",
                                                           "CHECKPOINT_EVERY": "2", "RESUME": "1"})
    _, prog = split_module_args(calls[0]["argv"])
    r = runtime_args(prog)
    assert (r.steps, r.checkpoint_dir, r.checkpoint_every, r.resume) == (3, "/ck", 2, True)


# --------------------------------------------------------------------------------------
# Slurm: #SBATCH options (sbatch(1): --job-name, --nodes, --ntasks, --ntasks-per-node,
# --gpus-per-task, --cpus-per-task, --output) and the srun + torchrun line
# --------------------------------------------------------------------------------------

def sbatch_options(text: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    for o in ("--job-name", "--output"):
        p.add_argument(o)
    for o in ("--nodes", "--ntasks", "--ntasks-per-node", "--gpus-per-task", "--cpus-per-task"):
        p.add_argument(o, type=int)
    opts = [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]
    return p.parse_args(opts)


FAKE_SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST -> one name per node
for i in $(seq 1 "${FAKE_NODES:-1}"); do echo "node$i"; done
"""
FAKE_SRUN = """#!/bin/bash
# srun [options] cmd...: record the options, run the command once (the parse test needs one copy)
while [[ "$1" == -* ]]; do echo "srun-option $1" >> "$ARGV_OUT.srun"; shift; done
exec "$@"
"""


@pytest.mark.parametrize("name", plans_for("slurm", TRAIN))
def test_slurm_round_trip(name, tmp_path):
    plan = examples()[name]
    out = write(plan, "slurm", tmp_path / "out")
    text = (out / "slurm.sbatch").read_text()
    o = sbatch_options(text)
    nnodes = o.nodes
    per_node = o.gpus_per_task or o.cpus_per_task
    assert o.ntasks == nnodes and o.ntasks_per_node == 1 and nnodes * per_node == plan.world_size
    fb = tmp_path / "fakebin"
    fb.mkdir()
    for n, body in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (fb / n).write_text(body)
        (fb / n).chmod(0o755)
    calls = run_script(out / "slurm.sbatch", ["torchrun"], {
        "PATH": f"{fb}:{tmp_path / 'fakebin'}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-9]",
        "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(out), "FAKE_NODES": str(nnodes)})
    own, prog = split_module_args(calls[0]["argv"])
    a = torchrun_args(own)
    assert (int(a.nnodes), int(a.nproc_per_node)) == (nnodes, per_node)
    assert a.rdzv_backend == "c10d" and a.rdzv_endpoint == "node1:29500" and a.rdzv_id == "77"
    _same_plan(runtime_args(prog).plan, plan)
    srun = (out / "argv.jsonl.srun").read_text().split()
    assert f"--nodes={nnodes}" in srun and f"--ntasks={nnodes}" in srun and "--ntasks-per-node=1" in srun


# --------------------------------------------------------------------------------------
# Kubernetes: the PyTorchJob structure (kubeflow.org/v1, training-operator docs) and the
# container command run through sh with the operator's environment
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", plans_for("kubernetes", TRAIN))
def test_kubernetes_round_trip(name, tmp_path):
    plan = examples()[name]
    out = write(plan, "kubernetes", tmp_path / "out")
    docs = list(yaml.safe_load_all((out / "pytorchjob.yaml").read_text()))
    cm, job = docs
    assert cm["kind"] == "ConfigMap" and job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    plan_back = plan_from_dict(yaml.safe_load(cm["data"]["plan.yaml"]))
    assert plan_to_dict(plan_back) == plan_to_dict(plan)
    specs = job["spec"]["pytorchReplicaSpecs"]
    replicas = sum(s["replicas"] for s in specs.values())
    assert specs["Master"]["replicas"] == 1 and replicas == plan.rank_layout()["nodes"]
    nproc = int(job["spec"]["nprocPerNode"])
    assert nproc * replicas == plan.world_size
    for role, spec in specs.items():
        pod = spec["template"]["spec"]
        (c,) = pod["containers"]
        assert c["name"] == "pytorch"
        limits = c["resources"]["limits"]
        assert list(limits.values()) == [nproc]
        mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["plan"]
        assert {v["name"]: v for v in pod["volumes"]}["plan"]["configMap"]["name"] == cm["metadata"]["name"]
        script = tmp_path / "k8s" / f"{role}.sh"
        script.parent.mkdir(exist_ok=True)
        script.write_text(c["args"][0] + "\n")
        calls = run_script(script, ["torchrun"], {"PET_NODE_RANK": "1" if role == "Worker" else "0",
                                                  "MASTER_ADDR": "master-0", "MASTER_PORT": "23456"})
        own, prog = split_module_args(calls[0]["argv"])
        a = torchrun_args(own)
        assert (int(a.nnodes), int(a.nproc_per_node)) == (replicas, nproc)
        assert (a.master_addr, a.master_port, a.node_rank) == ("master-0", 23456, 1 if role == "Worker" else 0)
        r = runtime_args(prog)
        assert r.plan == f"{mount}/plan.yaml"


# --------------------------------------------------------------------------------------
# Megatron-LM: a parser with the flags' documented names, types and choices
# (NVIDIA/Megatron-LM megatron/training/arguments.py at d98e8a64 and at 639c08ab82^, before
# argparse moved to dataclass generation), and the checks its validate_args makes that involve the plan.
# --------------------------------------------------------------------------------------

def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    ints = ["--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
            "--num-query-groups", "--seq-length", "--max-position-embeddings", "--num-experts", "--moe-router-topk",
            "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--q-lora-rank", "--kv-lora-rank",
            "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--tensor-model-parallel-size",
            "--pipeline-model-parallel-size", "--context-parallel-size", "--expert-model-parallel-size",
            "--expert-tensor-parallel-size", "--num-virtual-stages-per-pipeline-rank",
            "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
            "--decoder-last-pipeline-num-layers", "--recompute-num-layers", "--num-distributed-optimizer-instances",
            "--micro-batch-size", "--global-batch-size", "--seed", "--train-iters", "--log-interval",
            "--vocab-size", "--eval-iters", "--eval-interval", "--save-interval", "--rotary-base",
            "--make-vocab-size-divisible-by", "--lr-warmup-iters", "--lr-decay-iters", "--moe-router-num-groups",
            "--moe-router-group-topk", "--mtp-num-layers", "--moe-deepep-num-sms",
            # TransformerConfig.moe_hybridep_num_sms (Megatron-LM's DeepSeek-V3 GB200 guide writes it)
            "--moe-hybridep-num-sms",
            # TransformerConfig.moe_mlp_glu_interleave_size (core_v0.19.0, generated by ArgumentGroupFactory)
            "--moe-mlp-glu-interleave-size",
            # TrainingConfig.manual_gc_interval (megatron/training/config/training_config.py at 9c5258f109)
            "--manual-gc-interval"]
    for f in ints:
        p.add_argument(f, type=int)
    for f in ["--lr", "--min-lr", "--clip-grad", "--attention-dropout", "--hidden-dropout", "--norm-epsilon",
              "--rope-scaling-factor", "--init-method-std", "--weight-decay", "--adam-beta1", "--adam-beta2",
              "--adam-eps", "--moe-aux-loss-coeff", "--moe-router-bias-update-rate", "--moe-expert-capacity-factor",
              "--mtp-loss-scaling-factor"]:
        p.add_argument(f, type=float)
    flags = ["--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
             "--multi-latent-attention", "--moe-grouped-gemm", "--sequence-parallel", "--use-tp-pp-dp-mapping",
             "--use-distributed-optimizer", "--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather",
             "--bf16", "--fp16", "--mock-data", "--use-rope-scaling", "--moe-permute-fusion", "--moe-router-fusion",
             "--moe-router-enable-expert-bias", "--moe-pad-expert-input-to-capacity", "--tp-comm-overlap", "--add-qkv-bias",
             "--grad-reduce-in-bf16", "--moe-use-legacy-grouped-gemm", "--overlap-moe-expert-parallel-comm",
             "--delay-wgrad-compute",
             "--use-precision-aware-optimizer",
             # TransformerConfig.use_transformer_engine_op_fuser (core_v0.19.0, generated by ArgumentGroupFactory)
             "--use-transformer-engine-op-fuser",
             # TrainingConfig.manual_gc (megatron/training/config/training_config.py at 9c5258f109)
             "--manual-gc"]
    for f in flags:
        p.add_argument(f, action="store_true")
    # on by default, off by its negation (megatron/training/arguments.py at d98e8a64)
    p.add_argument("--no-check-for-nan-in-loss-and-grad", action="store_false", dest="check_for_nan_in_loss_and_grad")
    p.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--attention-backend", choices=["flash", "fused", "unfused", "local", "auto"])
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"])
    p.add_argument("--cuda-graph-impl", choices=["none", "local", "transformer_engine"], default="none")
    p.add_argument("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep"])
    p.add_argument("--moe-router-dtype", choices=["fp32", "fp64"])
    p.add_argument("--moe-router-score-function", choices=["softmax", "sigmoid"])
    p.add_argument("--moe-router-load-balancing-type", choices=["aux_loss", "seq_aux_loss", "global_aux_loss",
                                                                "sinkhorn", "none"])
    p.add_argument("--moe-layer-freq")
    p.add_argument("--tp-comm-bootstrap-backend", choices=["nccl", "mpi", "gloo"])
    p.add_argument("--pipeline-model-parallel-layout")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--recompute-modules", nargs="*", choices=["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp",
                                                               "moe", "shared_experts"])
    # TransformerConfig.fine_grained_activation_offloading / offload_modules (Megatron-LM at d98e8a64)
    p.add_argument("--fine-grained-activation-offloading", action="store_true")
    p.add_argument("--offload-modules", nargs="*", choices=["attn_norm", "qkv_linear", "core_attn", "attn_proj",
                                                             "mlp_norm", "expert_fc1", "moe_act", "fused_group_mlp"])
    p.add_argument("--data-parallel-sharding-strategy", choices=["no_shard", "optim", "optim_grads",
                                                                 "optim_grads_params"])
    p.add_argument("--ckpt-format", choices=["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"])
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"])
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"])
    p.add_argument("--fp8-param-gather", action="store_true")
    # TransformerConfig.fp4 / fp4_recipe / fp4_param (Megatron-LM at d98e8a64: Literal['e2m1'], 'nvfp4' or 'custom')
    p.add_argument("--fp4-format", choices=["e2m1"])
    p.add_argument("--fp4-recipe", choices=["nvfp4", "custom"])
    p.add_argument("--fp4-param-gather", action="store_true")
    p.add_argument("--optimizer", choices=["adam", "sgd"])
    p.add_argument("--main-params-dtype", default="fp32", choices=["fp32", "fp16"])
    p.add_argument("--exp-avg-dtype", default="fp32", choices=["fp32", "fp16", "bf16", "fp8"])
    p.add_argument("--exp-avg-sq-dtype", default="fp32", choices=["fp32", "fp16", "bf16", "fp8"])
    p.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    p.add_argument("--tokenizer-type", choices=["NullTokenizer", "HuggingFaceTokenizer"])
    p.add_argument("--tokenizer-model")
    p.add_argument("--data-path", nargs="*")
    p.add_argument("--split")
    p.add_argument("--save")
    p.add_argument("--load")
    return p


def fake_megatron(tmp_path) -> str:
    """A folder the script accepts as a Megatron-LM checkout (it checks for pretrain_gpt.py)."""
    d = tmp_path / "Megatron-LM"
    d.mkdir(exist_ok=True)
    (d / "pretrain_gpt.py").write_text("# stand-in: the fake torchrun records its arguments\n")
    return str(d)


def megatron_as_parsed(plan, tmp_path) -> tuple[argparse.Namespace, int, Path]:
    """The plan's ``megatron.sh`` run as written (a fake torchrun records its argv) and read back:
    Megatron's arguments through the documented-flag parser, the world size torchrun starts, and
    the folder of the emitted files."""
    out = write(plan, "megatron", tmp_path / "out")
    meg = fake_megatron(tmp_path)
    calls = run_script(out / "megatron.sh", ["torchrun"], {"MEGATRON": meg, "TRAIN_ITERS": "1000", "MOCK_DATA": "1",
                                                            "NODE_RANK": "0", "MASTER_ADDR": "node-0"})
    argv = calls[0]["argv"]
    i = argv.index(f"{meg}/pretrain_gpt.py")
    t = torchrun_args(argv[:i + 1])
    return megatron_parser().parse_args(argv[i + 1:]), int(t.nnodes) * int(t.nproc_per_node), out


def megatron_layout(a: argparse.Namespace):
    """``--pipeline-model-parallel-layout`` through Megatron-Core's own parser and check
    (megatron/core/transformer/pipeline_parallel_layer_layout.py): the layout object, whose
    ``layout[pp_rank][vpp_rank]`` lists each virtual stage's layer types."""
    mod = targets_package("megatron.core.transformer.pipeline_parallel_layer_layout", "megatron-core 0.16.1")
    # arguments.py: the layout excludes the first/last counts and the other two virtual-stage flags
    assert a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None
    assert a.num_virtual_stages_per_pipeline_rank is None and a.num_layers_per_virtual_pipeline_stage is None
    lay = mod.PipelineParallelLayerLayout(a.pipeline_model_parallel_layout, a.pipeline_model_parallel_size)
    lay.validate_layer_layout(a.num_layers, getattr(a, "mtp_num_layers", None) or 0)   # E first, L last, once each; MTP as set
    return lay


def megatron_vpp(a: argparse.Namespace) -> int:
    if a.pipeline_model_parallel_layout:
        return megatron_layout(a).virtual_pipeline_model_parallel_size
    return a.num_virtual_stages_per_pipeline_rank or 1


def megatron_layers_per_stage(a: argparse.Namespace) -> list[int]:
    """Decoder layers per pipeline rank: the layout's (all its virtual stages on that rank), or
    Megatron's first/last counts as given and the rest spread evenly over the middle stages."""
    pp, n = a.pipeline_model_parallel_size, a.num_layers
    if a.pipeline_model_parallel_layout:
        lay = megatron_layout(a)
        from megatron.core.transformer.enums import LayerType
        return [sum(chunk.count(LayerType.decoder) for chunk in row) for row in lay.layout]
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if first is None and last is None:
        assert n % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
        return [n // pp] * pp
    rest, stages = n, pp
    out_first = out_last = []
    if first is not None:
        rest, stages, out_first = rest - first, stages - 1, [first]
    if last is not None:
        rest, stages, out_last = rest - last, stages - 1, [last]
    assert stages == 0 or rest % stages == 0
    return out_first + ([rest // stages] * stages if stages else []) + out_last


@pytest.mark.parametrize("name", plans_for("megatron", TRAIN))
def test_megatron_round_trip(name, tmp_path):
    plan = examples()[name]
    p, m, w = plan.parallel, plan.model, plan.workload
    out = write(plan, "megatron", tmp_path / "out")
    meg = fake_megatron(tmp_path)
    # the caller's shell exports CUDA_DEVICE_MAX_CONNECTIONS=1, as TP recipes leave it: the file sets what its plan needs
    calls = run_script(out / "megatron.sh", ["torchrun"], {"MEGATRON": meg, "TRAIN_ITERS": "100000",
                                                            "DATA_PATH": "/data/corpus_text_document",
                                                            "TOKENIZER": "meta-llama/Meta-Llama-3-8B",
                                                            "NODE_RANK": "0", "MASTER_ADDR": "node-0",
                                                            "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    argv = calls[0]["argv"]
    i = argv.index(f"{meg}/pretrain_gpt.py")
    t = torchrun_args(argv[:i + 1])
    world = int(t.nnodes) * int(t.nproc_per_node)
    assert world == plan.world_size
    a = megatron_parser().parse_args(argv[i + 1:])
    # validate_args: world % (tp*pp*cp) == 0; dp = world // (tp*pp*cp); microbatches = gbs / (mbs*dp)
    model_size = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    assert world % model_size == 0
    dp = world // model_size
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size, dp) == \
        (p.tp, p.pp, p.cp, p.dp)
    assert a.global_batch_size % (a.micro_batch_size * dp) == 0
    assert (a.micro_batch_size, a.global_batch_size // (a.micro_batch_size * dp)) == (p.micro_batch, p.grad_accum)
    assert a.sequence_parallel == p.sp
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads, a.seq_length) == \
        (m.layers, m.hidden, m.ffn_hidden, m.heads, w.seq_len)
    assert a.num_query_groups == (m.kv_heads if m.kv_heads < m.heads else None)
    if m.is_moe:
        assert (a.num_experts, a.moe_router_topk, a.expert_model_parallel_size) == (m.num_experts, m.top_k, p.ep)
        # Megatron-Core's expert grid: world % (etp * ep * pp) == 0 (parallel_state.initialize_model_parallel)
        assert a.expert_tensor_parallel_size == p.etp and world % (p.etp * p.ep * p.pp) == 0
    if p.cp > 1:
        assert a.seq_length % (2 * a.context_parallel_size) == 0
    # pipeline split
    assert megatron_vpp(a) == p.vpp
    if p.vpp > 1 and not a.pipeline_model_parallel_layout:
        assert a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None
        assert a.num_layers % (p.pp * p.vpp) == 0
    else:
        assert megatron_layers_per_stage(a) == stage_layers(plan)
    # recompute
    if p.recompute == "none":
        assert a.recompute_granularity is None
    elif p.recompute == "selective":
        assert a.recompute_granularity == "selective" and a.recompute_method is None
        assert a.recompute_modules == ["core_attn"]      # the module set the megatron profile prices
    else:
        per = recompute_per_stage(plan)
        assert a.recompute_granularity == "full"
        if per == stage_layers(plan):
            assert (a.recompute_method, a.recompute_num_layers) == ("uniform", 1)
        else:
            assert a.recompute_method == "block" and a.recompute_num_layers * p.vpp == per[0]
    # ZeRO
    assert a.use_distributed_optimizer == (p.zero == 1)
    assert a.use_megatron_fsdp == (p.zero >= 2)
    if p.zero >= 2:
        assert a.ckpt_format == "fsdp_dtensor"
        assert a.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}[p.zero]
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in calls[0]["env"]     # Megatron-FSDP asserts it is not 1
    elif p.ep_overlap:          # the EP overlap needs more than one (Megatron-Core MoE README)
        assert int(calls[0]["env"]["CUDA_DEVICE_MAX_CONNECTIONS"]) > 1
    elif p.tp > 1 or p.cp > 1:
        assert calls[0]["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    if a.overlap_param_gather:
        assert a.overlap_grad_reduce and (a.use_distributed_optimizer or a.use_megatron_fsdp)
    # Python's collector on every rank at the same steps (emitters/megatron.py, MANUAL_GC_INTERVAL_*), never only
    # around evaluation, which the file turns off (--eval-iters 0): training.py collects when iteration % interval == 0
    assert a.manual_gc and a.manual_gc_interval == (5 if m.is_moe else 100) and a.eval_iters == 0
    # Megatron-Core's TransformerConfig (core_v0.16.0): delay_wgrad_compute needs the EP overlap and not
    # the legacy grouped GEMM; validate_args: it needs Transformer Engine's layers
    if a.delay_wgrad_compute:
        assert a.overlap_moe_expert_parallel_comm and not a.moe_use_legacy_grouped_gemm
    assert a.bf16 == (w.dtype == "bf16")
    # the model's own settings and the schedule
    assert a.norm_epsilon == m.norm_eps
    if m.positions == "rotary":
        assert a.position_embedding_type == "rope" and a.rotary_base == m.rope_theta
        assert a.use_rope_scaling == bool(m.rope_scaling)
    assert a.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert a.swiglu == (m.mlp == "swiglu")
    # Megatron pads the vocabulary to a multiple of divisor * tp (build_tokenizer.vocab_size_with_padding)
    k = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
    if m.vocab % p.tp == 0:
        assert m.vocab % k == 0
    assert (a.data_path, a.tokenizer_type, a.tokenizer_model) == \
        (["/data/corpus_text_document"], "HuggingFaceTokenizer", "meta-llama/Meta-Llama-3-8B")
    assert a.train_iters == a.lr_decay_iters == 100000 and 0 < a.lr_warmup_iters < a.train_iters
    assert a.lr_decay_style == "cosine" and a.min_lr == pytest.approx(a.lr / 10, rel=0.01)
    assert (a.weight_decay, a.clip_grad, a.adam_beta1, a.adam_beta2) == (0.1, 1.0, 0.9, 0.95)




@pytest.mark.parametrize("counts,vpp", [([10, 14], 1), ([5, 7, 7, 5], 1), ([4, 5, 5, 5, 5], 1), ([7, 6, 6, 5], 1),
                                        # middle stages that differ: only the layout flag states them
                                        ([5, 7, 6, 6], 1), ([3, 9, 4, 8], 1), ([2, 6, 6, 5, 5], 1),
                                        # virtual stages over an uneven split, and an even one
                                        ([10, 14], 2), ([5, 7, 6, 6], 2), ([6, 6, 6, 6], 3),
                                        # end stages one layer short: the embedding's and the loss's own
                                        # virtual stages (costmodel.specs.end_slots), both ends or the first
                                        ([12, 12], 13), ([11, 13], 12)])
def test_megatron_uneven_splits(counts, vpp, tmp_path):
    # gpt3-1.3b has 24 layers: pp=2 states only the first stage, longer pipelines first and/or last,
    # and any other split (or virtual stages over an uneven one) goes through --pipeline-model-parallel-layout
    plan = make_plan("gpt3-1.3b", gpus=len(counts), gb=8 * len(counts), seq=64, pp=len(counts), vpp=vpp,
                     grad_accum=8 * len(counts), schedule="interleaved" if vpp > 1 else "1f1b",
                     stages=stages_from_counts(counts))
    out = write(plan, "megatron", tmp_path / "out")
    meg = fake_megatron(tmp_path)
    argv = run_script(out / "megatron.sh", ["torchrun"], {"MEGATRON": meg, "TRAIN_ITERS": "1000",
                                                           "MOCK_DATA": "1"})[0]["argv"]
    a = megatron_parser().parse_args(argv[argv.index(f"{meg}/pretrain_gpt.py") + 1:])
    assert a.mock_data and a.tokenizer_type == "NullTokenizer"
    # Megatron's NullTokenizer adds one EOD token to --vocab-size: the model keeps its own vocabulary
    assert a.vocab_size + 1 == plan.model.vocab
    middle_equal = len(set(counts[1:-1])) <= 1
    uses_layout = (vpp > 1 and (len(set(counts)) > 1 or sum(counts) % (len(counts) * vpp) > 0)) or \
        (vpp == 1 and not middle_equal)
    assert bool(a.pipeline_model_parallel_layout) == uses_layout
    if uses_layout or vpp == 1:
        assert megatron_layers_per_stage(a) == counts
    assert megatron_vpp(a) == vpp
    if uses_layout and vpp > 1:
        lay = megatron_layout(a)
        from megatron.core.transformer.enums import LayerType
        # every rank's virtual stages are near-equal (the built-in runtime's cut), in Megatron's order
        for row, n in zip(lay.layout, counts):
            sizes = [chunk.count(LayerType.decoder) for chunk in row]
            assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
        # a stage one layer short of vpp leaves its end virtual stage to the embedding (first) or the loss (last)
        assert (lay.layout[0][0] == [LayerType.embedding]) == (counts[0] == vpp - 1)
        assert (lay.layout[-1][-1] == [LayerType.loss]) == (counts[-1] == vpp - 1)


# --------------------------------------------------------------------------------------
# DeepSpeed: the config through DeepSpeedConfig (its batch assertion included), the launcher
# command through deepspeed.launcher.runner.parse_args, the hostfile through fetch_hostfile
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", plans_for("deepspeed", TRAIN))
def test_deepspeed_batch_rule(name, tmp_path):
    plan = examples()[name]
    p = plan.parallel
    cfg = json.loads(write(plan, "deepspeed", tmp_path).joinpath("ds_config.json").read_text())
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * p.dp
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (p.micro_batch, p.grad_accum)
    assert cfg["zero_optimization"]["stage"] == p.zero


@pytest.mark.parametrize("name", plans_for("deepspeed", TRAIN))
def test_deepspeed_real_parser(name, tmp_path, monkeypatch):
    dsc = targets_package("deepspeed.runtime.config", "DeepSpeed 0.19.8")
    from deepspeed.launcher import runner
    plan = examples()[name]
    p = plan.parallel
    out = write(plan, "deepspeed", tmp_path / "out")
    monkeypatch.setattr(dsc.dist, "get_rank", lambda: 0)

    class Mpu:   # what PipelineModule / Megatron hand the engine: the data-parallel world
        def get_data_parallel_world_size(self):
            return p.dp
    c = dsc.DeepSpeedConfig(str(out / "ds_config.json"), mpu=Mpu())
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == \
        (plan.workload.global_batch, p.micro_batch, p.grad_accum)
    assert c.zero_optimization_stage == p.zero
    assert c.bfloat16_config.enabled == (plan.workload.dtype == "bf16")
    assert c.tensor_parallel_config.autotp_size == (p.tp if p.tp > 1 else 0)
    if p.pp > 1:
        assert c.pipeline["stages"] == p.pp
        assert c.pipeline["activation_checkpoint_interval"] == (1 if p.recompute == "full" else 0)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        class Wrong:
            def get_data_parallel_world_size(self):
                return p.dp + 1
        dsc.DeepSpeedConfig(str(out / "ds_config.json"), mpu=Wrong())
    script = tmp_path / "train.py"
    script.write_text("# the user's training script\n")
    calls = run_script(out / "deepspeed.sh", ["deepspeed"], {"TRAIN_SCRIPT": str(script), "TRAIN_STEPS": "2000"},
                       args=["--lr", "1"])
    a = runner.parse_args(calls[0]["argv"])
    run_cfg = dsc.DeepSpeedConfig(str(out / "ds_config.run.json"), mpu=Mpu())
    assert run_cfg.scheduler_params["total_num_steps"] == 2000
    if plan.rank_layout()["nodes"] == 1:
        # one node: no hostfile, so the launcher runs locally (no ssh to itself)
        assert not (out / "hostfile").exists() and a.hostfile == runner.DLTS_HOSTFILE
        assert a.num_gpus == plan.world_size
    else:
        hosts = runner.fetch_hostfile(a.hostfile)
        assert a.num_nodes == len(hosts) == plan.rank_layout()["nodes"]
        assert a.num_gpus * a.num_nodes == sum(hosts.values()) == plan.world_size
    assert a.user_args[:2] == ["--deepspeed", "--deepspeed_config"] and a.user_args[-2:] == ["--lr", "1"]


# --------------------------------------------------------------------------------------
# torchtitan 0.3.0: the job module read with ast always (field names from torchtitan/config/configs.py
# and torchtitan/trainer.py of the 0.3.0 wheel); with .venv-targets, torchtitan's own ConfigManager
# imports it through --module/--config as torchtitan.train does, and the model is built on meta
# --------------------------------------------------------------------------------------

TT_FIELDS = {   # the dataclass fields torchtitan 0.3.0 defines (TrainingConfig, ParallelismConfig)
    "TrainingConfig": {"local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                       "mixed_precision_param", "mixed_precision_reduce", "disable_cuda_graphs"},
    "ParallelismConfig": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                          "tensor_parallel_degree", "enable_sequence_parallel", "pipeline_parallel_degree",
                          "context_parallel_degree", "expert_parallel_degree", "pipeline_parallel_schedule",
                          "pipeline_parallel_microbatch_size", "module_fqns_per_model_part"},
}


def _titan_calls(text: str) -> dict:
    """{call name: {keyword: literal}} for the config calls in the job module, plus ``ac`` and ``flavor``."""
    out: dict = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in TT_FIELDS or name == "LRSchedulersContainer.Config":
                out[name] = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            if name == "model_registry":
                out["flavor"] = ast.literal_eval(node.args[0])
            if name == "Trainer.Config":
                out["ac"] = ast.unparse(next(k.value for k in node.keywords if k.arg == "activation_checkpoint"))
    return out


def _check_titan(par: dict, tr: dict, ac: str, plan) -> None:
    p, w = plan.parallel, plan.workload
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]) == \
        (p.tp, p.pp, p.cp)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == p.dp
    if p.zero >= 2 and p.dp > 1:
        assert par["data_parallel_shard_degree"] == p.dp_shard
    assert tr["global_batch_size"] == w.global_batch and tr["seq_len"] == w.seq_len
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    accumulation = tr["global_batch_size"] // (tr["local_batch_size"] * dp)      # Trainer.__init__
    if p.pp > 1:
        n_micro = tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"]   # build_pipeline_schedule
        assert (accumulation, n_micro, par["pipeline_parallel_microbatch_size"]) == (1, p.grad_accum, p.micro_batch)
        assert tr["disable_cuda_graphs"] is True            # Trainer.Config._validate_cuda_graphs
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == p.pp * p.vpp
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
        layer_counts = [sum(1 for f in part if f.startswith("layers.")) for part in parts]
        if p.vpp == 1:
            assert layer_counts == stage_layers(plan)
        flat = [f for part in parts for f in part if f.startswith("layers.")]
        assert flat == [f"layers.{i}" for i in range(plan.model.layers)]
    else:
        assert (accumulation, tr["local_batch_size"]) == (p.grad_accum, p.micro_batch)
    assert ac == {"none": "None", "full": "FullAC.Config()"}[p.recompute]


def _titan_run(plan, out: Path, tmp_path: Path) -> tuple[list[str], dict]:
    assets = tmp_path / "tokenizer"
    assets.mkdir(exist_ok=True)
    calls = run_script(out / "torchtitan.sh", ["torchrun"], {"HEAD_ADDR": "h", "TRAIN_STEPS": "5000",
                                                              "HF_ASSETS": str(assets), "DATASET": "c4"})
    own, prog = split_module_args(calls[0]["argv"])
    a = torchrun_args(own)
    assert a.training_script == "torchtitan.train" and int(a.nnodes) * int(a.nproc_per_node) == plan.world_size
    assert str(out) in calls[0]["env"]["PYTHONPATH"].split(":")       # --module finds the job module
    return prog, {"assets": str(assets)}


@pytest.mark.parametrize("name", plans_for("torchtitan", TRAIN))
def test_torchtitan_job(name, tmp_path):
    plan = examples()[name]
    out = write(plan, "torchtitan", tmp_path / "out")
    assert not list(out.glob("*.toml"))        # torchtitan 0.3.0 has no TOML job files
    text = (out / f"{tt_emitter.JOB_MODULE}.py").read_text()
    calls = _titan_calls(text)
    for cls, fields in TT_FIELDS.items():
        assert set(calls[cls]) <= fields, f"{cls} has fields torchtitan 0.3.0 does not define"
    _check_titan(calls["ParallelismConfig"], calls["TrainingConfig"], calls["ac"], plan)
    assert calls["flavor"] == tt_emitter.flavor(plan)
    prog, run = _titan_run(plan, out, tmp_path)
    warmup = min(500, calls["LRSchedulersContainer.Config"]["warmup_steps"])      # at most a tenth of the run
    assert prog == ["--module", tt_emitter.JOB_MODULE, "--config", tt_emitter.JOB_FUNCTION,
                    "--training.steps", "5000", "--lr_scheduler.warmup_steps", str(warmup),
                    "--checkpoint.folder", str(out / "checkpoints"), "--checkpoint.interval", "500",
                    "--hf_assets_path", run["assets"], "--dataloader.dataset", "c4"]
    m = plan.model
    from emitters.recipe import recipe
    assert f'"lr": {recipe(plan).lr!r}' in text and calls["LRSchedulersContainer.Config"]["decay_type"] == "cosine"
    if tt_emitter.flavor(plan) == tt_emitter.CUSTOM_FLAVOR:
        assert f"theta={float(m.rope_theta)!r}" in text and f"eps={float(m.norm_eps)!r}" in text
    else:
        assert (m.rope_theta, m.norm_eps, m.rope_scaling) == tt_emitter.STOCK_SETTINGS


def test_torchtitan_ffn_rule():
    # torchtitan's compute_ffn_hidden_dim with the stock flavors' arguments (llama3/__init__.py, 0.3.0)
    for dim, mo, mult, ffn in ((4096, 1024, 1.3, 14336), (8192, 4096, 1.3, 28672), (16384, 4096, 1.2, 53248),
                               (2048, 1024, 1.5, 8192), (256, 256, None, 768)):
        assert tt_emitter.ffn_hidden(dim, mo, mult) == ffn


def _titan_config(plan, out: Path, prog: list[str], monkeypatch):
    """torchtitan.train's own parse: ConfigManager imports --module from PYTHONPATH, calls --config."""
    targets_package("torchtitan", "torchtitan 0.3.0")
    from torchtitan.config import ConfigManager
    monkeypatch.syspath_prepend(str(out))
    sys.modules.pop(tt_emitter.JOB_MODULE, None)
    return ConfigManager().parse_args(prog)


def _llama_params(dim, layers, heads, kv, ffn, vocab) -> int:
    hd = dim // heads
    return 2 * vocab * dim + dim + layers * (2 * dim * heads * hd + 2 * dim * kv * hd + 3 * dim * ffn + 2 * dim)


@pytest.mark.parametrize("name", plans_for("torchtitan", TRAIN))
def test_torchtitan_real_parser(name, tmp_path, monkeypatch):
    plan = examples()[name]
    out = write(plan, "torchtitan", tmp_path / "out")
    prog, run = _titan_run(plan, out, tmp_path)
    job = _titan_config(plan, out, prog, monkeypatch)
    _check_titan(vars_of(job.parallelism), vars_of(job.training),
                 "None" if job.activation_checkpoint is None else type(job.activation_checkpoint).__qualname__ + "()",
                 plan)
    # the command line's overrides land where the script means them
    assert (job.training.steps, job.hf_assets_path, job.dataloader.dataset) == (5000, run["assets"], "c4")
    assert job.model_spec.flavor == tt_emitter.flavor(plan)
    # the model torchtitan builds is the plan's model: count parameters on the meta device
    import torch
    with torch.device("meta"):
        model = job.model_spec.model.build()
    assert sum(x.numel() for x in model.parameters()) == plan.model.total_params()


TT_MORE = {   # beyond the examples: a stock flavor, Llama 3.0's unscaled RoPE (custom flavor), virtual stages
    "llama-3.1-8b-tp4": lambda: make_plan("llama-3.1-8b", gpus=8, gb=16, seq=8192, cluster="dgx-h100",
                                          tp=4, sp=True, dp=2, zero=3, grad_accum=8),
    "llama-3-70b-pp2": lambda: make_plan("llama-3-70b", gpus=16, gb=32, seq=8192, cluster="dgx-h100",
                                         tp=4, sp=True, pp=2, dp=2, zero=2, micro_batch=1, grad_accum=16),
    "tiny-llama-vpp2": lambda: make_plan(gpus=4, pp=2, dp=2, zero=3, vpp=2, micro_batch=1, grad_accum=4,
                                         schedule="interleaved"),
}


@pytest.mark.parametrize("name", list(TT_MORE))
def test_torchtitan_real_parser_more(name, tmp_path, monkeypatch):
    plan = TT_MORE[name]()
    out = write(plan, "torchtitan", tmp_path / "out")
    prog, _ = _titan_run(plan, out, tmp_path)
    job = _titan_config(plan, out, prog, monkeypatch)
    _check_titan(vars_of(job.parallelism), vars_of(job.training),
                 "None" if job.activation_checkpoint is None else type(job.activation_checkpoint).__qualname__ + "()",
                 plan)
    assert job.model_spec.flavor == {"llama-3.1-8b-tp4": "8B"}.get(name, tt_emitter.CUSTOM_FLAVOR)
    if plan.parallel.vpp > 1:
        assert job.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    import torch
    with torch.device("meta"):
        model = job.model_spec.model.build()
    assert sum(x.numel() for x in model.parameters()) == plan.model.total_params()
    if name == "llama-3-70b-pp2":       # Llama 3.0: RoPE base 500000 without the 3.1 scaling
        rope = job.model_spec.model.layers[0].attention.rope
        assert (rope.theta, rope.scaling) == (plan.model.rope_theta, "none")


def test_torchtitan_stock_flavors_match_source():
    targets_package("torchtitan", "torchtitan 0.3.0")
    import torch
    from torchtitan.models.llama3 import model_registry
    for name, shape in tt_emitter.STOCK_FLAVORS.items():
        cfg = model_registry(name).model
        assert (cfg.dim, len(cfg.layers), cfg.vocab_size, cfg.enable_weight_tying) == \
            (shape[0], shape[1], shape[5], False)
        rope = cfg.layers[0].attention.rope
        assert (rope.theta, rope.scaling, rope.scaling_factor, cfg.norm.eps) == \
            (tt_emitter.STOCK_SETTINGS[0], "llama", tt_emitter.STOCK_SETTINGS[2], tt_emitter.STOCK_SETTINGS[1])
        assert rope.max_seq_len == tt_emitter.STOCK_MAX_SEQ_LEN
        with torch.device("meta"):
            n = sum(x.numel() for x in cfg.build().parameters())
        assert n == _llama_params(*shape), name


# --------------------------------------------------------------------------------------
# Accelerate: launch parser -> _validate_launch_command -> the env accelerate prepares,
# and the Megatron-LM plugin built from that env
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", plans_for("accelerate", TRAIN))
def test_accelerate_round_trip(name, tmp_path, monkeypatch):
    plan = examples()[name]
    p = plan.parallel
    out = write(plan, "accelerate", tmp_path / "out")
    cfg = yaml.safe_load((out / "accelerate.yaml").read_text())
    assert cfg["num_processes"] == plan.world_size
    script = tmp_path / "train.py"
    script.write_text("# the user's training script\n")
    calls = run_script(out / "accelerate.sh", ["accelerate"], {"MAIN_PROCESS_IP": "h", "TRAIN_SCRIPT": str(script)})
    assert calls[0]["argv"][0] == "launch"
    assert calls[0]["env"]["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == str(p.grad_accum)
    targets_package("accelerate", "Accelerate 1.15.0")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    args = launch_command_parser().parse_args(calls[0]["argv"][1:])
    args, defaults, mp_flag = _validate_launch_command(args)
    assert args.num_processes == plan.world_size
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
        assert (env["ACCELERATE_DEEPSPEED_ZERO_STAGE"], env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"]) == \
            (str(p.zero), str(p.grad_accum))
        return
    env = prepare_multi_gpu_env(args)
    assert (int(env.get("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", 1))
            * int(env.get("PARALLELISM_CONFIG_DP_SHARD_SIZE", p.dp)) == p.dp)
    if args.use_fsdp:
        assert env["FSDP_VERSION"] == "2"
        assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(p.zero == 3).lower()
        assert env["FSDP_ACTIVATION_CHECKPOINTING"] == str(p.recompute == "full").lower()
        assert int(env.get("PARALLELISM_CONFIG_CP_SIZE", 1)) == p.cp
    elif args.use_megatron_lm:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        from accelerate.utils import MegatronLMPlugin
        d = MegatronLMPlugin().megatron_lm_default_args
        assert (d["tensor_model_parallel_size"], d["pipeline_model_parallel_size"], d["context_parallel_size"],
                d["num_micro_batches"], d["sequence_parallel"], d["use_distributed_optimizer"]) == \
            (p.tp, p.pp, p.cp, p.grad_accum, p.sp, p.zero == 1)
        per = recompute_per_stage(plan)
        assert d["recompute_granularity"] == "full"
        assert (d["recompute_method"], d["recompute_num_layers"]) == \
            (("uniform", 1) if per == stage_layers(plan) else ("block", per[0]))


# --------------------------------------------------------------------------------------
# Serving engines
# --------------------------------------------------------------------------------------

def vllm_parser() -> argparse.ArgumentParser:
    """`vllm serve` flags as documented in vllm/engine/arg_utils.py (EngineArgs.add_cli_args) and
    docs/serving/parallelism_scaling.md (launchers.md 5.1), docs/features/disagg_prefill.md."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("model")
    for f, s in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp"),
                 ("--data-parallel-size", "-dp"), ("--data-parallel-size-local", "-dpl"),
                 ("--data-parallel-start-rank", "-dpr"), ("--data-parallel-rpc-port", "-dpp")):
        p.add_argument(f, s, type=int)
    p.add_argument("--data-parallel-address", "-dpa")
    for f in ("--max-model-len", "--max-num-seqs", "--seed", "--nnodes", "--node-rank", "--master-port",
              "--max-num-batched-tokens", "--block-size", "--port"):
        p.add_argument(f, type=int)
    p.add_argument("--master-addr")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--quantization")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    p.add_argument("--kv-transfer-config")
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--headless", action="store_true")
    return p


VLLM_SKIP = ("vLLM's own parser is not in .venv-targets: vllm 0.33.0 is a 336 MB wheel with CUDA extensions, and "
             "vllm.engine.arg_utils imports (after regex, cbor2, transformers, openai_harmony, openai, cloudpickle, "
             "cachetools, uvloop, prometheus_client) xgrammar, which needs tvm_ffi; the documented-flag parser runs")


def _vllm_real(argv: list[str]):
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception:
        return None
    p = FlexibleArgumentParser()
    p.add_argument("model")
    EngineArgs.add_cli_args(p)
    return p.parse_args(argv)


def test_vllm_real_parser():
    """vLLM's own parser reads the degrees back (and refuses what is not a flag), so the round
    trips above that use it check something."""
    a = _vllm_real(["m", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "3", "--enable-expert-parallel"])
    if a is None:
        pytest.skip(VLLM_SKIP)
    assert (a.model, a.tensor_parallel_size, a.pipeline_parallel_size, a.enable_expert_parallel) == ("m", 2, 3, True)
    with pytest.raises(SystemExit):
        _vllm_real(["m", "--no-such-flag-of-vllm", "1"])


def _expected_util(plan) -> float:
    """The engine share the files must pass (emitters/serving.py): the plan's own, or the estimated
    peak plus 5% headroom and never under 0.90."""
    import math
    sched = (plan.serving or {}).get("scheduler")
    if sched:
        return float(sched["gpu_memory_utilization"])
    mem = plan.estimate.get("memory", {})
    need = mem.get("peak_bytes", 0.0) / plan.cluster.gpu.memory_bytes
    return max(0.90, math.ceil((need + 0.05) * 100 - 1e-9) / 100)


@pytest.mark.parametrize("name", plans_for("vllm", INFER))
def test_vllm_round_trip(name, tmp_path):
    plan = examples()[name]
    p, w = plan.parallel, plan.workload
    out = write(plan, "vllm", tmp_path / "out")
    nnodes = plan.rank_layout()["nodes"]
    gpus = 0
    for rank in range(nnodes):
        calls = run_script(out / "vllm.sh", ["vllm"], {"NODE_RANK": str(rank), "HEAD_ADDR": "h", "MODEL": "m"})
        argv = calls[0]["argv"]
        assert argv[0] == "serve"
        for a in filter(None, (vllm_parser().parse_args(argv[1:]), _vllm_real(argv[1:]))):
            assert (a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size) == (p.tp, p.pp, p.dp)
            assert a.enable_expert_parallel == (p.ep > 1)
            if p.ep > 1:
                assert a.tensor_parallel_size * a.data_parallel_size == p.ep
            assert a.max_model_len == context_limit(plan) >= w.seq_len and a.max_num_seqs >= w.global_batch
            sched = (plan.serving or {}).get("scheduler")
            if sched:         # the scheduler the plan assumed; plans without one keep the engine's defaults
                assert a.enable_chunked_prefill is True and a.max_num_batched_tokens == sched["token_budget"]
                assert a.block_size == sched["block_tokens"]
            else:
                assert a.max_num_batched_tokens is None
            mem = plan.estimate.get("memory", {})
            util = float(a.gpu_memory_utilization)
            assert util == pytest.approx(_expected_util(plan))
            if mem:
                assert mem["peak_bytes"] / plan.cluster.gpu.memory_bytes + 0.05 <= util + 1e-9 or \
                    (plan.serving or {}).get("scheduler")
            assert a.headless == (rank > 0)
        local = a.data_parallel_size_local or a.data_parallel_size
        gpus += local * a.tensor_parallel_size * a.pipeline_parallel_size if nnodes == 1 or a.data_parallel_size_local \
            else a.tensor_parallel_size * a.pipeline_parallel_size // nnodes
        if a.data_parallel_size_local:
            assert a.data_parallel_start_rank == rank * a.data_parallel_size_local
    assert gpus == plan.world_size


def sglang_parser() -> argparse.ArgumentParser:
    """python -m sglang.launch_server flags (python/sglang/srt/server_args.py, SGLang 0.5; launchers.md 5.2)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--model-path", "--model")
    for f in (("--tp-size", "--tensor-parallel-size"), ("--pp-size", "--pipeline-parallel-size"),
              ("--dp-size", "--data-parallel-size"), ("--ep-size", "--expert-parallel-size", "--ep")):
        p.add_argument(*f, type=int, default=1)
    for f in ("--context-length", "--max-running-requests", "--random-seed", "--nnodes", "--node-rank",
              "--chunked-prefill-size", "--port", "--base-gpu-id", "--disaggregation-bootstrap-port"):
        p.add_argument(f, type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"])
    p.add_argument("--dist-init-addr")
    p.add_argument("--host")
    p.add_argument("--enable-mixed-chunk", action="store_true")
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"])
    p.add_argument("--disaggregation-transfer-backend", choices=["mooncake", "nixl", "ascend", "fake"])
    p.add_argument("--disaggregation-ib-device")
    return p


def _sglang_real(argv):
    """SGLang's own parser (python/sglang/srt/server_args.py, ServerArgs.add_cli_args), from .venv-targets."""
    server_args = targets_package("sglang.srt.server_args", "SGLang 0.5.23")
    p = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(p)
    return p.parse_args(argv)


def _sglang_argv(plan, tmp_path) -> list[str]:
    out = write(plan, "sglang", tmp_path / "out")
    calls = run_script(out / "sglang.sh", ["python-fake"], {"NODE_RANK": "0", "HEAD_ADDR": "h", "MODEL": "m"})
    argv = calls[0]["argv"]
    assert argv[:2] == ["-m", "sglang.launch_server"]
    return argv[2:]


def _check_sglang(a, plan) -> None:
    p, w = plan.parallel, plan.workload
    if p.ep > 1:      # data-parallel attention: the experts over the whole tensor-parallel group
        assert (a.model_path, a.tp_size, a.dp_size, a.ep_size, a.enable_dp_attention) == ("m", p.ep, p.dp, p.ep, True)
    else:
        assert (a.model_path, a.tp_size, a.pp_size, a.dp_size, a.ep_size) == ("m", p.tp, p.pp, p.dp, 1)
    assert a.context_length == context_limit(plan) >= w.seq_len and a.max_running_requests >= w.global_batch
    sched = (plan.serving or {}).get("scheduler")
    assert a.enable_mixed_chunk == bool(sched)
    assert a.chunked_prefill_size == (sched["token_budget"] if sched else None)
    mem = plan.estimate.get("memory", {})
    if mem:
        total = plan.cluster.gpu.memory_bytes
        want = (_expected_util(plan) * total - mem["activations_bytes"] - mem["other_bytes"]) / total
        assert want <= a.mem_fraction_static < want + 0.01 + 1e-9
        assert a.mem_fraction_static * total >= mem["weights_bytes"] + mem["kv_cache_bytes"]
    else:
        assert a.mem_fraction_static is None


@pytest.mark.parametrize("name", plans_for("sglang", INFER))
def test_sglang_round_trip(name, tmp_path):
    plan = examples()[name]
    _check_sglang(sglang_parser().parse_args(_sglang_argv(plan, tmp_path)), plan)


@pytest.mark.parametrize("name", plans_for("sglang", INFER))
def test_sglang_real_parser(name, tmp_path):
    plan = examples()[name]
    _check_sglang(_sglang_real(_sglang_argv(plan, tmp_path)), plan)


def trtllm_parser() -> argparse.ArgumentParser:
    """trtllm-serve options (tensorrt_llm/commands/serve.py, TensorRT-LLM 1.x; launchers.md 5.3)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("model")
    p.add_argument("--backend", choices=["pytorch", "tensorrt", "trt", "_autodeploy"])
    for f in (("--tensor_parallel_size", "--tp_size"), ("--pipeline_parallel_size", "--pp_size"),
              ("--moe_expert_parallel_size", "--ep_size"), ("--gpus_per_node",), ("--max_batch_size",),
              ("--max_seq_len",), ("--max_num_tokens",)):
        p.add_argument(*f, type=int)
    p.add_argument("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction", type=float)
    p.add_argument("--extra_llm_api_options", "--config")
    return p


@pytest.mark.parametrize("name", plans_for("tensorrt-llm", INFER))
def test_trtllm_round_trip(name, tmp_path):
    plan = examples()[name]
    p, w = plan.parallel, plan.workload
    out = write(plan, "tensorrt-llm", tmp_path / "out")
    calls = run_script(out / "trtllm.sh", ["trtllm-serve"], {"MODEL": "m"})
    a = trtllm_parser().parse_args(calls[0]["argv"])
    extra = yaml.safe_load(Path(a.extra_llm_api_options).read_text())
    if p.ep > 1:
        assert (a.tensor_parallel_size, a.moe_expert_parallel_size, extra["enable_attention_dp"]) == (p.ep, p.ep, True)
    else:
        assert a.tensor_parallel_size == p.tp
    assert (a.pipeline_parallel_size, a.max_seq_len) == (p.pp, w.seq_len) and a.max_batch_size >= w.global_batch
    sched = (plan.serving or {}).get("scheduler")
    assert extra["dtype"] == "bfloat16" and extra.get("enable_chunked_prefill", False) == bool(sched)
    assert a.max_num_tokens == (sched["token_budget"] if sched else None)
    mem = plan.estimate.get("memory", {})
    if mem:
        total = plan.cluster.gpu.memory_bytes
        free = total - mem["weights_bytes"] - mem["activations_bytes"] - mem["other_bytes"]
        pool = _expected_util(plan) * total - (total - free)
        need = max(pool, mem["kv_cache_bytes"]) / free
        assert need <= a.kv_cache_free_gpu_memory_fraction < need + 0.01 + 1e-9
        assert extra["kv_cache_config"]["free_gpu_memory_fraction"] == a.kv_cache_free_gpu_memory_fraction


def test_torchtitan_virtual_stages(tmp_path):
    plan = make_plan(gpus=4, pp=2, dp=2, zero=3, vpp=2, micro_batch=1, grad_accum=4)
    out = write(plan, "torchtitan", tmp_path / "out")
    calls = _titan_calls((out / f"{tt_emitter.JOB_MODULE}.py").read_text())
    par = calls["ParallelismConfig"]
    _check_titan(par, calls["TrainingConfig"], calls["ac"], plan)
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    # loop style: rank r runs chunks r and r + pp, one layer each for 4 layers on pp*vpp = 4 chunks
    assert [len([f for f in part if f.startswith("layers.")]) for part in par["module_fqns_per_model_part"]] == [1] * 4


def test_serving_one_replica_over_two_nodes(tmp_path):
    plan = make_plan("llama-3-70b", gpus=16, gb=8, seq=4096, cluster="dgx-h100", mode="infer", tp=8, pp=2)
    out = write(plan, "vllm", tmp_path / "vllm")
    for rank in (0, 1):
        argv = run_script(out / "vllm.sh", ["vllm"], {"NODE_RANK": str(rank), "HEAD_ADDR": "h", "MODEL": "m"})[0]["argv"]
        a = vllm_parser().parse_args(argv[1:])
        assert (a.tensor_parallel_size, a.pipeline_parallel_size, a.nnodes, a.node_rank, a.master_addr) == \
            (8, 2, 2, rank, "h")
        assert a.headless == (rank == 1)
    out = write(plan, "sglang", tmp_path / "sglang")
    argv = run_script(out / "sglang.sh", ["python-fake"], {"NODE_RANK": "1", "HEAD_ADDR": "h", "MODEL": "m"})[0]["argv"]
    a = sglang_parser().parse_args(argv[2:])
    assert (a.tp_size, a.pp_size, a.nnodes, a.node_rank, a.dist_init_addr) == (8, 2, 2, 1, "h:50000")
