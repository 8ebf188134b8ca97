"""The Megatron-DeepSpeed target (issue 22): its record, its stage split against DeepSpeed's own
partition function, the published layouts of BLOOM-176B, MT-NLG 530B and GPT-NeoX-20B accepted
and priced through it (and refused by the DeepSpeed target), the emitted files parsed back
(ds_config.json through DeepSpeed's own DeepSpeedConfig from .venv-targets; the
pretrain_gpt.py flags against the fork's argument names: its parser is not on PyPI)."""
from __future__ import annotations

import dataclasses
import json
import random

import pytest

from costmodel.frameworks import FRAMEWORKS
from costmodel.specs import ModelSpec, ParallelConfig, Workload, stages_from_counts
from planner.plan import targets as T
from planner.plan.planfile import Plan
from costmodel.files.clusters import load_cluster
from test_emit_roundtrip import targets_package
from test_emit_support import run_script, write

NAME = "megatron-deepspeed"

# every flag the emitter may write, as microsoft/Megatron-DeepSpeed f4157bea megatron/arguments.py
# defines it (group.add_argument names, read from the fork with `fetch`); --deepspeed and
# --deepspeed_config come from DeepSpeed's own add_config_arguments (checked against it below)
FORK_FLAGS = frozenset("""
--num-layers --hidden-size --ffn-hidden-size --num-attention-heads --seq-length --max-position-embeddings
--layernorm-epsilon --num-key-value-heads --swiglu --normalization --use-rotary-position-embeddings
--no-position-embedding --rotary-position-embeddings-theta --untie-embeddings-and-output-weights
--disable-bias-linear --attention-dropout --hidden-dropout --use-flash-attn-v2 --tensor-model-parallel-size
--pipeline-model-parallel-size --micro-batch-size --global-batch-size --zero-stage --no-pipeline-parallel
--checkpoint-activations --checkpoint-num-layers --train-iters --lr --min-lr --lr-decay-style --lr-warmup-iters
--optimizer --adam-beta1 --adam-beta2 --adam-eps --weight-decay --clip-grad --init-method-std --log-interval
--eval-iters --eval-interval --bf16 --fp16 --data-path --data-impl --split --tokenizer-type --tokenizer-model
--save --load --save-interval""".split())


def _gpt(name, layers, hidden, heads, vocab, seq=2048, **kw) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn_hidden=4 * hidden, vocab=vocab,
                     family="gpt", mlp="gelu", norm="layernorm", positions=kw.pop("positions", "learned"),
                     tied_embeddings=kw.pop("tied", True), bias=True, max_seq_len=seq, **kw)


# the published layouts (calibration/published_runs_frameworks.yaml, each case's source there)
PUBLISHED = {
    # BigScience tr11-176B-ml: 70 layers, tp4 pp12 dp8 on 384 A100 80GB, ZeRO-1, full recompute, bf16
    "bloom-176b": (_gpt("bloom-176b", 70, 14336, 112, 250880), "dgx-a100-80gb", 384,
                   ParallelConfig(tp=4, pp=12, dp=8, zero=1, micro_batch=2, grad_accum=128, recompute="full"),
                   Workload(global_batch=2048, seq_len=2048, dtype="bf16")),
    # MT-NLG 530B: 105 layers, tp8 pp35 dp8 on 2240 A100 (Smith et al. 2022), ZeRO-1, full recompute
    "mt-nlg-530b": (_gpt("mt-nlg-530b", 105, 20480, 128, 51200), "dgx-a100-80gb", 2240,
                    ParallelConfig(tp=8, pp=35, dp=8, zero=1, micro_batch=1, grad_accum=240, recompute="full"),
                    Workload(global_batch=1920, seq_len=2048, dtype="bf16")),
    # GPT-NeoX-20B: 44 layers, tp2 pp4 dp12 on 96 A100 40GB, ZeRO-1, untied, rotary, fp16
    "gpt-neox-20b": (_gpt("gpt-neox-20b", 44, 6144, 64, 50432, positions="rotary", tied=False),
                     "dgx-a100-40gb", 96,
                     ParallelConfig(tp=2, pp=4, dp=12, zero=1, micro_batch=4, grad_accum=32, recompute="full"),
                     Workload(global_batch=1536, seq_len=2048, dtype="fp16")),
}


def _published(key: str, counts=None) -> Plan:
    m, cluster, gpus, par, wl = PUBLISHED[key]
    counts = counts or list(T.mds_split(m, par.pp))
    return Plan(model=m, cluster=load_cluster(cluster).with_gpus(gpus), workload=wl, parallel=par,
                stages=stages_from_counts(counts), target=NAME)


def test_the_record_is_complete():
    rec = T.record(NAME)
    assert rec.profile in FRAMEWORKS and rec.start is not None and rec.start.script == "megatron_deepspeed.sh"
    from emitters import TARGETS, get
    assert TARGETS[NAME] == rec.emitter and get(NAME).TARGET == NAME
    fields = {f.name for f in dataclasses.fields(T.TrainTarget)} - {
        "name", "summary", "runs", "cp_seq", "cp_seq_text", "sources", "extra", "variants", "zero1_as_zero0", "mode"}
    table_keys = set(rec.table.sources)
    assert fields - {"mla", "moe", "alibi"} <= table_keys and "models" in table_keys
    prof = FRAMEWORKS[rec.profile]
    # what the file writes is what the profile prices: no TP overlap, no overlapped gradient reduction
    assert not prof.tp_comm_overlap and not prof.overlap_grad_reduce and not prof.overlap_param_gather


def test_split_equals_deepspeeds_own_partition_balanced():
    """GPTModelPipe's layer list with partition_method='type:transformer' through DeepSpeed 0.19's
    own partition_balanced (the weights PipelineModule._partition_layers builds for type:)."""
    utils = targets_package("deepspeed.runtime.utils", "DeepSpeed 0.19")
    rng = random.Random(22)
    cases = [(70, 12), (105, 35), (44, 4), (72, 6), (96, 8)] + [(rng.randint(2, 130), rng.randint(2, 40))
                                                                  for _ in range(200)]
    for layers, pp in cases:
        m = _gpt("x", layers, 256, 4, 1024)
        w = [0, 0] + [1] * layers + [0, 0, 0]
        b = utils.partition_balanced(weights=w, num_parts=pp)
        theirs = tuple(sum(1 for i in range(b[s], b[s + 1]) if 2 <= i < 2 + layers) for s in range(pp))
        ours = T.mds_split(m, pp)
        assert ours == (theirs if all(theirs) else None), (layers, pp, theirs, ours)


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_published_layouts_accepted_and_priced(key):
    plan = _published(key)
    assert T.problems(NAME, plan) == []
    assert T.targets_running("deepspeed", plan) == [NAME]
    assert any("does not combine its tensor parallel with pipeline stages" in x
               for x in T.problems("deepspeed", dataclasses.replace(plan, target="deepspeed")))
    from costmodel.training import estimate
    est = estimate(plan.model, plan.cluster, plan.workload, plan.parallel, stages=plan.stages,
                   framework=T.profile_for(NAME))
    assert est.step_time_s > 0 and 0 < est.mfu < 1


def test_a_split_the_model_code_does_not_place_is_refused():
    plan = _published("gpt-neox-20b", counts=[10, 12, 11, 11])
    msg = " ".join(T.problems(NAME, plan))
    assert "no Megatron-DeepSpeed partition_method places the blocks so" in msg and "[11, 11, 11, 11]" in msg


def test_validation_prices_these_runs_through_the_new_target():
    from planner.cli import validation as V
    rows = V.all_rows(include_holdout=False)
    cases = {r.case for r in rows if r.framework == "deepspeed"}
    # GPT-NeoX-20B's figure is of another kind (tflops_kind other): no row, but its layout is accepted
    assert {"bloom-176b-a100-384gpu-production", "mtnlg-530b-a100-2240gpu"} <= cases
    assert not [n for n in V.REFUSED if n.startswith(("bloom", "mtnlg", "gpt-neox"))]
    for key in PUBLISHED:
        m, cluster, gpus, par, wl = PUBLISHED[key]
        via, stages, why = V.target_for("deepspeed", m, load_cluster(cluster).with_gpus(gpus), wl, par)
        assert via == NAME and [s.num_layers for s in stages] == list(T.mds_split(m, par.pp)) and why == ""
    m, cluster, gpus, par, wl = PUBLISHED["bloom-176b"]
    # a layout no target runs is refused with its reason, not priced
    bad = dataclasses.replace(par, zero=2)
    via, stages, why = V.target_for("deepspeed", m, load_cluster(cluster).with_gpus(gpus), wl, bad)
    assert via == "" and "ZeRO" in why


@pytest.mark.subprocess
@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_emit_and_parse_back(key, tmp_path, monkeypatch):
    plan = _published(key)
    p, m = plan.parallel, plan.model
    out = write(plan, NAME, tmp_path / "out")
    # ds_config.json through DeepSpeed's own config class, with Megatron's mpu giving the dp world
    dsc = targets_package("deepspeed.runtime.config", "DeepSpeed 0.19")
    monkeypatch.setattr(dsc.dist, "get_rank", lambda: 0)

    class Mpu:
        def get_data_parallel_world_size(self):
            return p.dp
    c = dsc.DeepSpeedConfig(str(out / "megatron_deepspeed_config.json"), mpu=Mpu())
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == \
        (plan.workload.global_batch, p.micro_batch, p.grad_accum)
    assert c.zero_optimization_stage == p.zero
    assert c.zero_config.overlap_comm is False          # the profile prices no overlap
    assert c.bfloat16_config.enabled == (plan.workload.dtype == "bf16")
    assert c.float16_config.enabled == (plan.workload.dtype == "fp16")
    # the launch line: every flag is the fork's, and the values are the plan's
    (tmp_path / "mds").mkdir()
    calls = run_script(out / "megatron_deepspeed.sh", ["torchrun"],
                       {"MEGATRON_DS": str(tmp_path / "mds"), "DATA_PATH": "data", "TOKENIZER": "tok",
                        "TRAIN_ITERS": "1000"})
    argv = calls[0]["argv"]
    i = next(k for k, a in enumerate(argv) if a.endswith("pretrain_gpt.py"))
    args = argv[i + 1:]
    flags = {a for a in args if a.startswith("--")}
    import argparse
    deepspeed = targets_package("deepspeed", "DeepSpeed 0.19")
    ds_parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    ds_flags = {s for a in ds_parser._actions for s in a.option_strings}
    assert flags - FORK_FLAGS <= ds_flags and {"--deepspeed", "--deepspeed_config"} <= flags

    def val(flag):
        return args[args.index(flag) + 1]
    assert (int(val("--tensor-model-parallel-size")), int(val("--pipeline-model-parallel-size"))) == (p.tp, p.pp)
    assert (int(val("--num-layers")), int(val("--hidden-size")), int(val("--num-attention-heads"))) == \
        (m.layers, m.hidden, m.heads)
    assert int(val("--zero-stage")) == p.zero and "--checkpoint-activations" in flags
    assert ("--untie-embeddings-and-output-weights" in flags) == (not m.tied_embeddings)
    assert ("--use-rotary-position-embeddings" in flags) == (m.positions == "rotary")
    assert int(val("--global-batch-size")) == plan.workload.global_batch
    assert json.loads((out / "megatron_deepspeed_config.json").read_text())["zero_optimization"]["stage"] == p.zero
    assert str(list(T.mds_split(m, p.pp))) in (out / "megatron_deepspeed.sh").read_text()


@pytest.mark.subprocess
@pytest.mark.parametrize("launcher", ["slurm", "kubernetes", "torchrun"])
def test_launchers_compose(launcher):
    from emitters import compose
    files = compose(_published("gpt-neox-20b"), NAME, launcher)
    assert "megatron_deepspeed.sh" in files and "megatron_deepspeed_config.json" in files
    launch = {k: v for k, v in files.items() if k not in ("megatron_deepspeed.sh", "megatron_deepspeed_config.json")}
    assert launch and any("megatron_deepspeed.sh" in v for v in launch.values())
