"""Launch files keep the model and ask for what the run needs: the model's own settings are written
(Qwen2's q/k/v biases, RoPE base and scaling, norm eps, the MoE balancing loss), what a framework
cannot express is named in the header, every training script asks for CHECKPOINT_DIR, multi-node
Megatron asks for NODE_RANK and MASTER_ADDR, and the built-in runtime builds the model's own RoPE and
norm. MPT configs (llm-foundry's models) read."""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess

import pytest
import torch

from costmodel.catalog import from_hf_config, get_model
from emitters import CannotExpress, get
from runtime.model import ROPE_HIGH_FREQ_FACTOR, ROPE_LOW_FREQ_FACTOR, ROPE_ORIGINAL_CONTEXT, build_model, rope_frequencies
from test_emit_support import make_plan, run_script, write

# Qwen2-7B's config.json (Qwen/Qwen2-7B): q/k/v carry biases, nothing else does
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 131072}
# MPT-7B's config.json (mosaicml/mpt-7b): ALiBi, no biases, GELU MLP of 4 x d_model, tied embeddings
MPT_7B = {"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4,
          "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "learned_pos_emb": True,
          "attn_config": {"alibi": True, "attn_type": "multihead_attention", "alibi_bias_max": 8}}


def test_qwen2_keeps_its_qkv_biases():
    m = from_hf_config(QWEN2_7B, "qwen2-7b")
    assert m.qkv_bias and not m.bias
    no_bias = dataclasses.replace(m, qkv_bias=False)
    # the biases of q (28 x 128), k and v (4 x 128 each) on every layer, and nothing else
    assert m.total_params() - no_bias.total_params() == 28 * (3584 + 2 * 4 * 128)


def _megatron_args(plan, tmp_path, **env) -> list[str]:
    from test_emit_roundtrip import fake_megatron
    out = write(plan, "megatron", tmp_path / "out")
    meg = fake_megatron(tmp_path)
    calls = run_script(out / "megatron.sh", ["torchrun"], {"MEGATRON": meg, "TRAIN_ITERS": "100", "MOCK_DATA": "1",
                                                            **env})
    argv = calls[0]["argv"]
    return argv[argv.index(f"{meg}/pretrain_gpt.py") + 1:]


@pytest.mark.subprocess
def test_megatron_writes_qkv_bias(tmp_path):
    m = from_hf_config(QWEN2_7B, "qwen2-7b")
    plan = make_plan("llama-3-8b", gpus=8, gb=8, seq=4096, cluster="dgx-h100", tp=4, sp=True, dp=2)
    plan = plan.replace(model=m)
    a = _megatron_args(plan, tmp_path)
    assert "--disable-bias-linear" in a and "--add-qkv-bias" in a
    assert a[a.index("--norm-epsilon") + 1] == "1e-06" and a[a.index("--rotary-base") + 1] == "1000000"
    # mock data keeps the vocabulary: NullTokenizer adds one EOD token to --vocab-size
    assert int(a[a.index("--vocab-size") + 1]) + 1 == m.vocab


@pytest.mark.subprocess
def test_megatron_moe_trains_a_balanced_router(tmp_path):
    plan = make_plan("mixtral-8x7b", gpus=32, gb=32, seq=4096, cluster="dgx-h100", tp=2, sp=True, dp=16, ep=8)
    a = _megatron_args(plan, tmp_path, NODE_RANK="0", MASTER_ADDR="n0")
    assert float(a[a.index("--moe-aux-loss-coeff") + 1]) == (plan.model.router_aux_coeff or 1e-3) > 0
    assert a[a.index("--moe-router-load-balancing-type") + 1] == "aux_loss"
    assert "--moe-expert-capacity-factor" not in a          # dropless, as priced


def test_megatron_names_what_it_cannot_write():
    m = dataclasses.replace(get_model("llama-3-8b"), sliding_window=4096, sliding_window_pattern=2)
    plan = make_plan("llama-3-8b", gpus=8, gb=8, seq=8192, cluster="dgx-h100", tp=8, sp=True).replace(model=m)
    text = get("megatron").emit(plan)["megatron.sh"]
    assert "# sliding-window attention (4096 tokens, every 2-th layer global): not written" in text


def _fakebin(tmp_path) -> str:
    """A PATH whose launchers exit 0 (the checks before them are what is tested)."""
    fakebin = tmp_path / "bin"
    fakebin.mkdir(exist_ok=True)
    for prog in ("torchrun", "deepspeed", "accelerate"):
        (fakebin / prog).write_text("#!/bin/sh\nexit 0\n")
        (fakebin / prog).chmod(0o755)
    return f"{fakebin}:/usr/bin:/bin"


@pytest.mark.subprocess
def test_megatron_multinode_asks_for_rank_and_address(tmp_path):
    from test_emit_roundtrip import fake_megatron
    plan = make_plan("llama-3-8b", gpus=16, gb=16, seq=4096, cluster="dgx-h100", tp=8, sp=True, dp=2)
    out = write(plan, "megatron", tmp_path / "out")
    env = {"MEGATRON": fake_megatron(tmp_path), "TRAIN_ITERS": "100", "MOCK_DATA": "1", "CHECKPOINT_DIR": "/ck",
           "PATH": _fakebin(tmp_path)}
    r = subprocess.run(["bash", str(out / "megatron.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "set NODE_RANK" in r.stderr
    r = subprocess.run(["bash", str(out / "megatron.sh")], env={**env, "NODE_RANK": "1"}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "set MASTER_ADDR" in r.stderr
    text = (out / "megatron.sh").read_text()
    assert "localhost" not in text and '"$NODE_RANK"' in text


@pytest.mark.subprocess
@pytest.mark.parametrize("target,script,env", [
    ("megatron", "megatron.sh", {"TRAIN_ITERS": "100", "MOCK_DATA": "1"}),
    ("deepspeed", "deepspeed.sh", {"TRAIN_STEPS": "100"}),
    ("torchtitan", "torchtitan.sh", {"TRAIN_STEPS": "100", "MOCK_DATA": "1"}),
    ("accelerate", "accelerate.sh", {}),
])
def test_every_training_script_asks_for_checkpoint_dir(target, script, env, tmp_path):
    plan = make_plan(gpus=4, dp=4, zero=3 if target in ("torchtitan", "accelerate") else 1, grad_accum=2)
    plan = plan.replace(model=dataclasses.replace(plan.model, vocab=4096))   # MOCK_DATA's tokenizer fits
    out = write(plan, target, tmp_path / "out")
    train = tmp_path / "train.py"
    train.write_text("# the user's script\n")
    from test_emit_roundtrip import fake_megatron
    base = {"PATH": _fakebin(tmp_path), "MEGATRON": fake_megatron(tmp_path), "TRAIN_SCRIPT": str(train), **env}
    r = subprocess.run(["bash", str(out / script)], env=base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "set CHECKPOINT_DIR" in r.stderr, r.stderr
    r = subprocess.run(["bash", str(out / script)], env={**base, "CHECKPOINT_DIR": str(tmp_path / "ck")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.subprocess
def test_torchtitan_mock_tokenizer_must_fit(tmp_path):
    plan = make_plan(gpus=4, dp=4, zero=3, grad_accum=2)          # tiny-llama: 1,024 tokens
    out = write(plan, "torchtitan", tmp_path / "out")
    r = subprocess.run(["bash", str(out / "torchtitan.sh")], capture_output=True, text=True, timeout=60,
                       env={"PATH": _fakebin(tmp_path), "TRAIN_STEPS": "10", "MOCK_DATA": "1", "CHECKPOINT_DIR": "/c"})
    assert r.returncode in (2,) and "2020 tokens" in r.stderr and "1024" in r.stderr


@pytest.mark.subprocess
def test_deepspeed_short_run_warms_up_one_step(tmp_path):
    plan = make_plan(gpus=4, dp=4, zero=1, grad_accum=2)
    out = write(plan, "deepspeed", tmp_path / "out")
    train = tmp_path / "train.py"
    train.write_text("# the user's script\n")
    calls = run_script(out / "deepspeed.sh", ["deepspeed"], {"TRAIN_SCRIPT": str(train), "TRAIN_STEPS": "5"})
    cfg = json.loads((out / "ds_config.run.json").read_text())
    assert cfg["scheduler"]["params"]["warmup_num_steps"] == 1 and cfg["scheduler"]["params"]["total_num_steps"] == 5
    assert "--hostfile" not in calls[0]["argv"] and not (out / "hostfile").exists()     # one node: no ssh


def test_mpt_reads():
    m = from_hf_config(MPT_7B, "mpt-7b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (32, 4096, 32, 32, 16384, 50432)
    assert (m.positions, m.mlp, m.norm, m.bias, m.tied_embeddings) == ("alibi", "gelu", "layernorm", False, True)
    # llm-foundry's RoPE + grouped-query + gated-MLP variant
    cfg = {**MPT_7B, "attn_config": {"alibi": False, "rope": True, "rope_theta": 500000,
                                     "attn_type": "grouped_query_attention", "kv_n_heads": 8},
           "ffn_config": {"ffn_type": "mptglu"}}
    m2 = from_hf_config(cfg, "mpt-rope")
    assert (m2.positions, m2.rope_theta, m2.kv_heads, m2.mlp) == ("rotary", 500000.0, 8, "swiglu")
    with pytest.raises(ValueError, match="expansion_ratio"):
        from_hf_config({**MPT_7B, "expansion_ratio": "4"}, "bad")


def test_mpt_alibi_is_refused_where_it_cannot_run():
    m = from_hf_config(MPT_7B, "mpt-7b")
    plan = make_plan("llama-3-8b", gpus=8, gb=8, seq=2048, cluster="dgx-h100", dp=8, zero=1).replace(model=m)
    with pytest.raises(CannotExpress, match="ALiBi"):
        get("megatron").emit(plan)
    assert "ds_config.json" in get("deepspeed").emit(plan)      # the user's model code runs it


# --------------------------------------------------------------------------------------
# The built-in runtime builds the model's own RoPE and norm
# --------------------------------------------------------------------------------------

def _llama31_reference(head_dim: int, theta: float, factor: float) -> list[float]:
    """Llama 3.1's scaled inverse frequencies, one by one (Meta's reference apply_scaling)."""
    out = []
    for i in range(0, head_dim, 2):
        f = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / f
        if wavelen < ROPE_ORIGINAL_CONTEXT / ROPE_HIGH_FREQ_FACTOR:
            out.append(f)
        elif wavelen > ROPE_ORIGINAL_CONTEXT / ROPE_LOW_FREQ_FACTOR:
            out.append(f / factor)
        else:
            smooth = (ROPE_ORIGINAL_CONTEXT / wavelen - ROPE_LOW_FREQ_FACTOR) / (ROPE_HIGH_FREQ_FACTOR - ROPE_LOW_FREQ_FACTOR)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def test_rope_scaling_matches_the_reference():
    got = rope_frequencies(128, 500000.0, 8.0).tolist()
    assert got == pytest.approx(_llama31_reference(128, 500000.0, 8.0), rel=1e-5)
    plain = rope_frequencies(128, 500000.0).tolist()
    assert got != pytest.approx(plain, rel=1e-3)          # the scaling changes the long wavelengths


def test_runtime_builds_the_models_rope_and_norm():
    spec = dataclasses.replace(get_model("tiny-llama"), rope_theta=500000.0, rope_scaling=8.0, norm_eps=1e-6,
                               qkv_bias=True)
    model = build_model(spec)
    norms = [mod for mod in model.modules() if isinstance(mod, torch.nn.RMSNorm)]
    assert norms and all(n.eps == 1e-6 for n in norms)
    attn = [mod for mod in model.modules() if hasattr(mod, "rope_theta")]
    assert attn and all((a.rope_theta, a.rope_scaling) == (500000.0, 8.0) for a in attn)
    assert all(a.wq.bias is not None and a.wo.bias is None for a in attn)
    assert sum(p.numel() for p in model.parameters()) == spec.total_params()
    # the base changes what the model computes
    torch.manual_seed(0)
    x = torch.randint(0, spec.vocab, (1, 16))
    base = build_model(dataclasses.replace(spec, rope_theta=10000.0))
    base.load_state_dict(model.state_dict())
    assert not torch.allclose(model(x), base(x))


def test_token_files_hold_the_vocabulary(tmp_path):
    """A 128K vocabulary does not fit uint16 ids: the runtime reads uint32 for it, refuses a uint16
    file, and torchrun.sh documents the right type."""
    import numpy as np

    from runtime.data import DataError, TokenStream, token_dtype
    assert token_dtype("auto", 65536) == "uint16" and token_dtype("auto", 128256) == "uint32"
    with pytest.raises(DataError, match="uint32"):
        token_dtype("uint16", 128256)
    f = tmp_path / "tokens.bin"
    np.arange(100000, 101000, dtype=np.uint32).tofile(f)       # ids above 65535
    s = TokenStream(global_batch=2, seq_len=8, vocab=128256, path=str(f), dtype=token_dtype("auto", 128256))
    assert int(s.batch(0).min()) >= 100000
    plan = make_plan("llama-3-8b", gpus=8, gb=8, seq=4096, cluster="dgx-h100", dp=8, zero=3)
    assert "numpy memmap of uint32 ids: 128256 tokens" in get("torchrun").emit(plan)["torchrun.sh"]
