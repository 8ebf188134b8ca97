"""Hugging Face config.json of today's model types (nemotron, gpt_oss, gemma2, gemma3, phi3,
deepseek_v2, llama4): the fields that change a parameter count or the KV cache read from their
real keys. Total counts against published figures: tests/test_costmodel.py, over
tests/data/hf/expected_params.json."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from costmodel.catalog import MODELS, from_hf_config, get_model
from costmodel.inference import _Serving, kv_bytes_per_token_layer, serving_stage_memory
from costmodel.specs import ModelSpec, ParallelConfig, SpecError, StageSpec, Workload
from planner.plan.inputs import load_model
from costmodel.files.clusters import load_cluster

HF = Path(__file__).parent / "data" / "hf"


def cfg(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def test_gpt_oss_alternating_window_sinks_and_biased_experts():
    m = load_model(str(HF / "gpt-oss-20b.json"))
    assert (m.num_experts, m.top_k, m.expert_ffn_hidden, m.moe_layers) == (32, 4, 2880, 24)
    assert (m.sliding_window, m.sliding_window_pattern, m.attention_sinks, m.bias) == (128, 2, True, True)
    assert [m.is_local_attention_layer(i) for i in range(4)] == [True, False, True, False]   # layer_types
    # the card's active counts leave out the input embedding: 3.61B and 5.13B
    for name, active in (("gpt-oss-20b", 3.61e9), ("gpt-oss-120b", 5.13e9)):
        m = load_model(str(HF / f"{name}.json"))
        assert m.active_params() - m.embedding_params() == pytest.approx(active, rel=0.01)
    # biases on q, k, v, o and on the experts (gate_up 2 x 2880, down 2880): 36 x 128 x 8,640 of them
    plain = dataclasses.replace(m, bias=False)
    assert m.total_params() - plain.total_params() == m.layers * (
        m.num_experts * 3 * 2880 + (m.q_dim + 2 * m.kv_dim + m.hidden))


def test_gemma_windows_softcaps_and_tied_embeddings():
    g2 = load_model(str(HF / "gemma-2-9b.json"))
    assert (g2.sliding_window, g2.sliding_window_pattern, g2.head_dim, g2.hidden) == (4096, 2, 256, 3584)
    assert (g2.attn_softcap, g2.final_softcap, g2.tied_embeddings) == (50.0, 30.0, True)
    assert g2.local_attention_layers_in(0, 42) == 21 and g2.is_local_attention_layer(0)
    g3 = load_model(str(HF / "gemma-3-27b.json"))      # the multimodal wrapper: its text_config
    assert (g3.sliding_window, g3.sliding_window_pattern, g3.layers, g3.vocab) == (1024, 6, 62, 262208)
    assert g3.local_attention_layers_in(0, 62) == 52 and not g3.is_local_attention_layer(5)
    assert (g3.attn_softcap, g3.tied_embeddings) == (0.0, True)
    g34 = load_model(str(HF / "gemma-3-4b.json"))      # heads, kv heads, head_dim from Gemma3TextConfig defaults
    assert (g34.heads, g34.kv_heads, g34.head_dim) == (8, 4, 256)
    # layer_types, where a newer config writes it, gives the same pattern
    text = dict(cfg("gemma-3-27b")["text_config"], layer_types=[
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)])
    assert from_hf_config(text).sliding_window_pattern == 6


def test_llama4_interleaved_moe_shared_expert_and_chunked_attention():
    m = load_model(str(HF / "llama-4-scout.json"))
    assert (m.num_experts, m.top_k, m.shared_experts, m.expert_ffn_hidden, m.moe_layers) == (16, 1, 1, 8192, 48)
    assert (m.sliding_window, m.sliding_window_pattern) == (8192, 4)      # chunks on RoPE layers, every 4th NoPE
    assert m.active_params() == pytest.approx(17e9, rel=0.015)          # 17.17B; the card rounds to 17B
    # the card's 109B includes the vision encoder the text_config leaves out (~0.9B)
    assert m.total_params() == pytest.approx(109e9, rel=0.015) and m.total_params() < 109e9
    # Maverick's interleave (MoE on odd layers, dense ones of intermediate_size_mlp)
    mav = dict(cfg("llama-4-scout")["text_config"], interleave_moe_layer_step=2, num_local_experts=128,
               moe_layers=list(range(1, 48, 2)))
    mm = from_hf_config(mav)
    assert (mm.moe_layers, mm.is_moe_layer(0), mm.is_moe_layer(1), mm.ffn_hidden) == (24, False, True, 16384)
    with pytest.raises(SpecError, match="'moe_layers'.*disagrees with interleave_moe_layer_step 2"):
        from_hf_config(dict(mav, moe_layers=list(range(0, 48, 2))))


def test_nemotron_phi3_deepseek_v2_shapes():
    n = load_model(str(HF / "minitron-4b.json"))
    assert (n.mlp, n.norm, n.head_dim, n.kv_heads, n.tied_embeddings) == ("gelu", "layernorm", 128, 8, False)
    p = load_model(str(HF / "phi-3-mini-4k.json"))
    assert (p.sliding_window, p.sliding_window_pattern, p.local_attention_layers_in(0, 32)) == (2047, 0, 32)
    d = load_model(str(HF / "deepseek-v2-lite.json"))
    assert (d.attention, d.q_lora_rank, d.first_dense_layers, d.shared_experts, d.num_experts) == ("mla", 0, 1, 2, 64)


def test_sliding_window_bounds_the_kv_cache():
    """Gemma 3 27B at 32k context: 52 of its 62 layers cache 1,024 tokens, 10 the whole context."""
    m = load_model(str(HF / "gemma-3-27b.json"))
    c = load_cluster("dgx-h100").with_gpus(1)
    ctx, batch = 32768, 4
    w = Workload(global_batch=batch, seq_len=ctx, mode="infer", prompt_len=ctx - 1024, output_len=1024)
    sv = _Serving(m, c, w, ParallelConfig())
    st = StageSpec(first_layer=0, num_layers=62)
    kv = serving_stage_memory(sv, st, 0, w.prompt_len, ctx, batch)["kv_cache_bytes"]
    per = kv_bytes_per_token_layer(m, 1, "bf16")
    assert kv == batch * per * (10 * ctx + 52 * 1024)
    assert m.kv_tokens_in(0, 62, 512) == 62 * 512                           # below the window: all of it
    assert get_model("llama-3-8b").kv_tokens_in(0, 32, ctx) == 32 * ctx     # no window: unchanged


@pytest.mark.parametrize("bad, message", [
    (dict(sliding_window_pattern=6), "sliding_window_pattern 6 needs a sliding_window"),
    (dict(sliding_window=1024, sliding_window_pattern=1), "sliding_window_pattern 1 makes every layer global"),
    (dict(sliding_window=-5), "sliding_window must be >= 0, got -5"),
    (dict(attn_softcap=float("nan")), "attn_softcap must be a finite number"),
    (dict(attention_sinks=1), "attention_sinks must be true or false"),
])
def test_new_model_fields_are_validated(bad, message):
    with pytest.raises(SpecError, match=message):
        ModelSpec(**{**MODELS["tiny-llama"], "name": "x", **bad})


@pytest.mark.parametrize("change, message", [
    (dict(sliding_window="4096"), "field 'sliding_window' must be a non-negative integer"),
    (dict(attn_logit_softcapping=-1), "field 'attn_logit_softcapping' must be a number >= 0"),
    (dict(layer_types=["sliding_attention"] * 3), "'layer_types' lists 3 layers, num_hidden_layers is 42"),
    (dict(layer_types=["local"] * 42), "'layer_types' has 'local'"),
    (dict(layer_types=["full_attention" if i in (1, 2, 9) else "sliding_attention" for i in range(42)]),
     "not evenly spaced"),
])
def test_hf_new_keys_are_validated(change, message):
    with pytest.raises(SpecError, match=message):
        from_hf_config({**cfg("gemma-2-9b"), **change}, where="g/config.json")


def test_wrapper_without_text_config_is_refused():
    with pytest.raises(SpecError, match=r"x/config.json: model_type 'gemma3' is a multimodal wrapper.*'text_config'"):
        from_hf_config({"model_type": "gemma3"}, where="x/config.json")


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b", "gemma-2-9b", "gemma-2-27b", "gemma-3-27b",
                                  "phi-3-mini-4k", "llama-4-scout-17b-16e"])
def test_new_catalog_entries_match_their_configs(name):
    m = get_model(name)
    files = {"llama-4-scout-17b-16e": "llama-4-scout"}
    f = load_model(str(HF / f"{files.get(name, name)}.json"))
    assert m.total_params() == f.total_params()
    assert (m.sliding_window, m.sliding_window_pattern) == (f.sliding_window, f.sliding_window_pattern)
