"""The model's own settings and the optimizer schedule in emitted training scripts, and the
values a user supplies, checked at the top of each script (exit 2 naming the value)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from costmodel.catalog import from_hf_config, get_model
from emitters import get
from emitters.megatron import padded_vocab, vocab_divisor
from emitters.recipe import GPT3_LR, peak_lr, recipe
from test_emit_support import ROOT, fake_bin, make_plan, write


def test_peak_lr_is_gpt3_table_2_1_and_falls_with_size():
    for n, lr in GPT3_LR:                       # Brown et al. 2020, Table 2.1, row by row
        assert peak_lr(n) == pytest.approx(lr, rel=1e-3)
    sizes = [1e8, 3e8, 1e9, 8e9, 7e10, 4e11]
    lrs = [peak_lr(n) for n in sizes]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] == 6e-4 and lrs[-1] == 0.6e-4
    # between rows, log-log: 70.6B lies between 13B (1e-4) and 175B (0.6e-4)
    assert 0.6e-4 < peak_lr(70.6e9) < 1e-4


def test_recipe_for_llama_3_70b_is_not_the_small_model_default():
    plan = make_plan("llama-3-70b", gpus=64, gb=512, seq=8192, cluster="dgx-h100", tp=8, pp=1, dp=8,
                     zero=3, sp=True, grad_accum=64)
    r = recipe(plan)
    assert r.lr < 1e-4 and r.min_lr == pytest.approx(r.lr / 10, rel=0.01)
    assert r.warmup_steps == 90                 # ceil(375M tokens / (512 x 8192))
    assert (r.weight_decay, r.grad_clip, r.beta1, r.beta2) == (0.1, 1.0, 0.9, 0.95)
    assert r.init_std == pytest.approx((2 / (5 * 8192)) ** 0.5, rel=1e-2)


def test_model_settings_in_catalog_and_hf_configs():
    m = get_model("llama-3-70b")
    assert (m.rope_theta, m.rope_scaling, m.norm_eps) == (500000.0, 0.0, 1e-5)
    assert get_model("llama-3.1-405b").rope_scaling == 8.0
    assert get_model("mixtral-8x7b").rope_theta == 1e6 and get_model("deepseek-v3").norm_eps == 1e-6
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0,
           "rms_norm_eps": 1e-05, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    hf = from_hf_config(cfg)
    assert (hf.rope_theta, hf.norm_eps, hf.rope_scaling) == (500000.0, 1e-5, 8.0)
    neox = from_hf_config({"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100,
                           "rotary_emb_base": 10000, "layer_norm_eps": 1e-6})
    assert (neox.rope_theta, neox.norm_eps) == (10000.0, 1e-6)
    # defaults stay out of the plan file (older plans read the same)
    assert "rope_theta" not in get_model("tiny-llama").to_dict() and get_model("llama-3-8b").to_dict()["rope_theta"]


@pytest.mark.parametrize("vocab,tp,divisor,padded", [(128256, 1, 128, 128256), (128256, 8, 32, 128256),
                                                     (32000, 8, 32, 32000), (50257, 2, 1, 50258)])
def test_megatron_vocab_padding(vocab, tp, divisor, padded):
    # Megatron pads to a multiple of make_vocab_size_divisible_by * tp (vocab_size_with_padding)
    assert vocab_divisor(vocab, tp) == divisor
    assert padded_vocab(vocab, tp) == padded
    assert padded % (divisor * tp) == 0 and padded - vocab < divisor * tp


def test_megatron_script_carries_llama3_settings(tmp_path):
    plan = make_plan("llama-3-70b", gpus=64, gb=512, seq=8192, cluster="dgx-h100", tp=8, pp=1, dp=8,
                     zero=1, sp=True, grad_accum=64)
    text = get("megatron").emit(plan)["megatron.sh"]
    for flag in ("--rotary-base 500000", "--norm-epsilon 1e-05", "--untie-embeddings-and-output-weights",
                 "--swiglu", "--group-query-attention", "--num-query-groups 8", "--position-embedding-type rope",
                 "--lr-decay-style cosine", '--lr-warmup-iters "$WARMUP_ITERS"', "--weight-decay 0.1",
                 "--make-vocab-size-divisible-by 32", "--tokenizer-type HuggingFaceTokenizer"):
        assert flag in text, flag
    assert "--use-rope-scaling" not in text              # Llama 3, not 3.1
    assert f'--lr "${{LR:-{recipe(plan).lr:.2e}}}"' in text and "3.0e-4" not in text


def _run(script, env, fakes=("torchrun",)):
    d = script.parent.parent / ("bin-" + "-".join(fakes))   # a PATH with exactly these fakes
    d.mkdir(exist_ok=True)
    b = fake_bin(d, list(fakes))
    e = {"PATH": f"{b}:/usr/bin:/bin", "ARGV_OUT": str(script.parent / "argv.jsonl"),
         "CHECKPOINT_DIR": str(script.parent / "checkpoints"), **env}
    return subprocess.run(["bash", str(script)], env=e, capture_output=True, text=True, timeout=60)


@pytest.mark.subprocess
@pytest.mark.parametrize("missing", ["MEGATRON", "TRAIN_ITERS", "DATA_PATH", "TOKENIZER", "CHECKPOINT_DIR"])
def test_megatron_script_stops_on_each_missing_value(tmp_path, missing):
    plan = make_plan("tiny-llama", gpus=2, tp=2, sp=True, grad_accum=1, micro_batch=8)
    out = write(plan, "megatron", tmp_path / "out")
    meg = tmp_path / "Megatron-LM"
    meg.mkdir()
    (meg / "pretrain_gpt.py").write_text("")
    env = {"MEGATRON": str(meg), "TRAIN_ITERS": "1000", "DATA_PATH": "/data/x_text_document", "TOKENIZER": "tok",
           "CHECKPOINT_DIR": str(tmp_path / "ck")}
    assert _run(out / "megatron.sh", env).returncode == 0
    env[missing] = ""                                         # empty counts as unset
    r = _run(out / "megatron.sh", env)
    assert r.returncode == 2 and f"set {missing} to" in r.stderr and r.stderr.count("\n") == 1
    if missing in ("DATA_PATH", "TOKENIZER"):                 # MOCK_DATA=1 needs neither
        assert _run(out / "megatron.sh", {**env, "MOCK_DATA": "1"}).returncode == 0


@pytest.mark.subprocess
def test_scripts_refuse_bad_values_and_a_missing_environment(tmp_path):
    plan = make_plan("tiny-llama", gpus=2, tp=2, sp=True, grad_accum=1, micro_batch=8)
    out = write(plan, "megatron", tmp_path / "out")
    meg = tmp_path / "Megatron-LM"
    meg.mkdir()
    r = _run(out / "megatron.sh", {"MEGATRON": str(meg), "TRAIN_ITERS": "1000", "MOCK_DATA": "1"})
    assert r.returncode == 2 and "no file" in r.stderr and "pretrain_gpt.py" in r.stderr
    (meg / "pretrain_gpt.py").write_text("")
    r = _run(out / "megatron.sh", {"MEGATRON": str(meg), "TRAIN_ITERS": "ten", "MOCK_DATA": "1"})
    assert r.returncode == 2 and "TRAIN_ITERS must be an integer" in r.stderr
    r = _run(out / "megatron.sh", {"MEGATRON": str(meg), "TRAIN_ITERS": "100", "WARMUP_ITERS": "100",
                                   "MOCK_DATA": "1"})
    assert r.returncode == 2 and "WARMUP_ITERS must be an integer below TRAIN_ITERS" in r.stderr
    r = _run(out / "megatron.sh", {"MEGATRON": str(meg), "TRAIN_ITERS": "100", "MOCK_DATA": "1"}, fakes=())
    assert r.returncode == 2 and "torchrun is not on PATH" in r.stderr
    # the built-in runtime's launcher checks that python finds this repository's runtime
    out = write(plan, "torchrun", tmp_path / "tr")
    py = shutil.which("python3", path="/usr/bin:/bin")     # a python without this repo installed
    if py is None:
        pytest.skip("no system python3 to check the import with")
    r = subprocess.run(["bash", str(out / "torchrun.sh")], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{fake_bin(tmp_path, ['torchrun'])}:/usr/bin:/bin", "PYTHON": py,
                            "ARGV_OUT": str(tmp_path / "a.jsonl")})
    assert r.returncode == 2 and "cannot import runtime" in r.stderr
    r = subprocess.run(["bash", str(out / "torchrun.sh")], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{fake_bin(tmp_path, ['torchrun'])}:/usr/bin:/bin", "PYTHON": py,
                            "ARGV_OUT": str(tmp_path / "a.jsonl"), "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr


@pytest.mark.subprocess
def test_deepspeed_writes_the_run_length_into_its_schedule(tmp_path):
    import json
    plan = make_plan("tiny-llama", gpus=2, dp=2, zero=2, grad_accum=1, micro_batch=4)
    out = write(plan, "deepspeed", tmp_path / "out")
    cfg = json.loads((out / "ds_config.json").read_text())
    r = recipe(plan)
    assert cfg["optimizer"]["params"]["lr"] == r.lr and cfg["scheduler"]["type"] == "WarmupCosineLR"
    train = tmp_path / "train.py"
    train.write_text("")
    res = _run(out / "deepspeed.sh", {"TRAIN_SCRIPT": str(train), "TRAIN_STEPS": "400"}, fakes=("deepspeed",))
    assert res.returncode == 0, res.stderr
    run = json.loads((out / "ds_config.run.json").read_text())
    assert run["scheduler"]["params"]["total_num_steps"] == 400
    assert run["scheduler"]["params"]["warmup_num_steps"] == min(40, r.warmup_steps)
    assert {k: v for k, v in run.items() if k != "scheduler"} == {k: v for k, v in cfg.items() if k != "scheduler"}
    res = _run(out / "deepspeed.sh", {"TRAIN_STEPS": "400"}, fakes=("deepspeed",))
    assert res.returncode == 2 and "set TRAIN_SCRIPT to" in res.stderr
