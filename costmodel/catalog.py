"""The model catalog: published architectures by name, and Hugging Face ``config.json`` parsing.

Pure data and pure functions (a dict in, a ``ModelSpec`` out); reading files is the caller's
business. Shapes are from each model's published config.json / paper; ``published_params`` is
the figure its card or paper quotes, and a test holds our count to it.
"""
from __future__ import annotations

import difflib
import math
from typing import Any, Mapping

from .limits import MAX_EXPERTS, MAX_LAYERS, MAX_ROPE_THETA, MAX_SEQ, describe
from .specs import ModelSpec, SpecError

_LLAMA3 = dict(family="llama", mlp="swiglu", norm="rmsnorm", positions="rotary", vocab=128256,
               head_dim=128, kv_heads=8, max_seq_len=131072, rope_theta=500000.0, rope_scaling=8.0)
_LLAMA3_0 = dict(_LLAMA3, rope_scaling=0.0)   # Llama 3 (not 3.1): no RoPE scaling, 8k context
_GPT = dict(family="gpt", mlp="gelu", norm="layernorm", positions="learned", tied_embeddings=True,
            bias=True, dropout=True, max_seq_len=2048)

_GPT_OSS = dict(family="gpt_oss", hidden=2880, ffn_hidden=2880, expert_ffn_hidden=2880, heads=64, kv_heads=8,
                head_dim=64, vocab=201088, max_seq_len=131072, top_k=4, bias=True, attention_sinks=True,
                sliding_window=128, sliding_window_pattern=2, rope_theta=150000.0)
_GEMMA2 = dict(family="gemma2", vocab=256000, max_seq_len=8192, tied_embeddings=True, norm_eps=1e-6,
               sliding_window=4096, sliding_window_pattern=2, attn_softcap=50.0, final_softcap=30.0)

MODELS: dict[str, dict[str, Any]] = {
    # Llama 3 / 3.1 (Meta, "The Llama 3 Herd of Models", 2024, Table 3)
    "llama-3-8b": dict(_LLAMA3_0, layers=32, hidden=4096, ffn_hidden=14336, heads=32, max_seq_len=8192,
                       published_params=8.03e9),
    "llama-3-70b": dict(_LLAMA3_0, layers=80, hidden=8192, ffn_hidden=28672, heads=64, max_seq_len=8192,
                        published_params=70.6e9),
    "llama-3.1-8b": dict(_LLAMA3, layers=32, hidden=4096, ffn_hidden=14336, heads=32, published_params=8.03e9),
    "llama-3.1-70b": dict(_LLAMA3, layers=80, hidden=8192, ffn_hidden=28672, heads=64, published_params=70.6e9),
    "llama-3.1-405b": dict(_LLAMA3, layers=126, hidden=16384, ffn_hidden=53248, heads=128,
                           published_params=405.9e9),
    "llama-2-7b": dict(family="llama", layers=32, hidden=4096, ffn_hidden=11008, heads=32, vocab=32000,
                       max_seq_len=4096, published_params=6.74e9),
    "llama-2-13b": dict(family="llama", layers=40, hidden=5120, ffn_hidden=13824, heads=40, vocab=32000,
                        max_seq_len=4096, published_params=13.0e9),
    "llama-2-70b": dict(family="llama", layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8,
                        vocab=32000, max_seq_len=4096, published_params=69.0e9),
    # Mixtral (Mistral AI, "Mixtral of Experts", 2024): 46.7B total / 12.9B active
    "mixtral-8x7b": dict(family="mixtral", layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8,
                         vocab=32000, max_seq_len=32768, rope_theta=1e6, num_experts=8, top_k=2, published_params=46.7e9,
                         router_balance="aux_loss", router_aux_coeff=0.02),
    # Mixtral 8x22B (v0.1 model card): 141B total / 39B active
    "mixtral-8x22b": dict(family="mixtral", layers=56, hidden=6144, ffn_hidden=16384, heads=48, kv_heads=8,
                          vocab=32000, max_seq_len=65536, rope_theta=1e6, num_experts=8, top_k=2, published_params=141e9,
                          router_balance="aux_loss", router_aux_coeff=0.001),
    # DeepSeek-V3 (technical report, 2024): 671B total / 37B active, MLA, 1 shared + 256 routed
    "deepseek-v3": dict(family="deepseek", layers=61, hidden=7168, ffn_hidden=18432, heads=128,
                        vocab=129280, max_seq_len=163840, num_experts=256, top_k=8, shared_experts=1,
                        expert_ffn_hidden=2048, first_dense_layers=3, attention="mla", q_lora_rank=1536,
                        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        head_dim=192, norm_eps=1e-6, published_params=671e9,
                        # config.json: scoring_func sigmoid, n_group 8, topk_group 4, topk_method noaux_tc,
                        # aux_loss_alpha 0.001 (the sequence-wise loss), num_nextn_predict_layers 1
                        router_scoring="sigmoid", router_groups=8, router_topk_groups=4, router_balance="aux_free",
                        router_aux_coeff=0.001, mtp_layers=1),
    # Qwen3-235B-A22B (Qwen3 technical report, 2025): 235B total / 22B active
    "qwen3-235b-a22b": dict(family="qwen3", layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4,
                            head_dim=128, vocab=151936, max_seq_len=40960, num_experts=128, top_k=8,
                            expert_ffn_hidden=1536, rope_theta=1e6, norm_eps=1e-6, published_params=235e9,
                            router_balance="aux_loss", router_aux_coeff=0.001),
    # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 30.5B total / 3.3B active, 128 experts of 768
    "qwen3-30b-a3b": dict(family="qwen3", layers=48, hidden=2048, ffn_hidden=6144, heads=32, kv_heads=4,
                          head_dim=128, vocab=151936, max_seq_len=40960, num_experts=128, top_k=8,
                          expert_ffn_hidden=768, rope_theta=1e6, norm_eps=1e-6, published_params=30.5e9,
                          router_balance="aux_loss", router_aux_coeff=0.001),
    # gpt-oss (OpenAI model card, 2025): 20.91B / 116.83B total; MoE every layer, biases, attention
    # sinks, 128-token sliding window on every other layer (layer 0 sliding)
    "gpt-oss-20b": dict(_GPT_OSS, layers=24, num_experts=32, published_params=20.91e9),
    "gpt-oss-120b": dict(_GPT_OSS, layers=36, num_experts=128, published_params=116.83e9),
    # Gemma 2 (report, 2024): local 4,096-token window on every other layer, logit soft-capping, tied
    "gemma-2-9b": dict(_GEMMA2, layers=42, hidden=3584, ffn_hidden=14336, heads=16, kv_heads=8, head_dim=256,
                       published_params=9.242e9),
    "gemma-2-27b": dict(_GEMMA2, layers=46, hidden=4608, ffn_hidden=36864, heads=32, kv_heads=16, head_dim=128,
                        published_params=27.227e9),
    # Gemma 3 27B, text model (report, Table 1: 1,416M embedding + 25,600M non-embedding): five
    # 1,024-token local layers to one global
    "gemma-3-27b": dict(family="gemma3_text", layers=62, hidden=5376, ffn_hidden=21504, heads=32, kv_heads=16,
                        head_dim=128, vocab=262208, max_seq_len=131072, tied_embeddings=True, rope_theta=1e6,
                        norm_eps=1e-6, sliding_window=1024, sliding_window_pattern=6, published_params=27.016e9),
    # Phi-3-mini-4k (Phi-3 report, 2024: 3.8B): a 2,047-token window on every layer
    "phi-3-mini-4k": dict(family="phi3", layers=32, hidden=3072, ffn_hidden=8192, heads=32, vocab=32064,
                          max_seq_len=4096, sliding_window=2047, published_params=3.8e9),
    # Llama 4 Scout, text model (Meta card: 17B active, 109B total with the vision encoder): 16
    # experts + 1 shared on every layer, 8,192-token attention chunks on 3 of 4 layers
    "llama-4-scout-17b-16e": dict(_LLAMA3, layers=48, hidden=5120, ffn_hidden=16384, heads=40, vocab=202048,
                                  max_seq_len=10485760, num_experts=16, top_k=1, shared_experts=1,
                                  expert_ffn_hidden=8192, sliding_window=8192, sliding_window_pattern=4,
                                  published_params=109e9),
    # GPT-3 (Brown et al., 2020, Table 2.1)
    "gpt3-175b": dict(_GPT, layers=96, hidden=12288, ffn_hidden=49152, heads=96, vocab=50257,
                      published_params=175e9),
    "gpt3-1.3b": dict(_GPT, layers=24, hidden=2048, ffn_hidden=8192, heads=16, vocab=50257,
                      published_params=1.3e9),
    # small enough for multi-process CPU tests (about 2M and 3M parameters)
    "tiny-llama": dict(family="llama", layers=4, hidden=128, ffn_hidden=352, heads=4, kv_heads=2,
                       vocab=1024, max_seq_len=512),
    "tiny-moe": dict(family="mixtral", layers=4, hidden=128, ffn_hidden=256, heads=4, kv_heads=2,
                     vocab=1024, max_seq_len=512, num_experts=4, top_k=2),
    # a mixed model in miniature (DeepSeek-V3's first dense layers): layer 0 dense, 1-3 MoE
    "tiny-moe-dense1": dict(family="mixtral", layers=4, hidden=128, ffn_hidden=256, heads=4, kv_heads=2,
                            vocab=1024, max_seq_len=512, num_experts=4, top_k=2, first_dense_layers=1,
                            shared_experts=1),
    "tiny-gpt": dict(_GPT, layers=4, hidden=128, ffn_hidden=512, heads=4, vocab=1024, max_seq_len=512,
                     dropout=False),
}


def model_names() -> list[str]:
    return sorted(MODELS)


def closest(name: str, names: list[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, names, n=n, cutoff=0.3)


def name_key(text: str) -> str:
    """A name as the catalogs and the target tables spell it, however it was typed: case folded, ``_`` and runs
    of spaces read as one ``-`` ("DGX_H100" -> "dgx-h100", "Llama 3 8B" -> "llama-3-8b"). The one rule behind
    model (``get_model``), cluster (``costmodel.files.clusters.catalog_key``) and target
    (``planner.plan.targets.canonical``) names."""
    return "-".join(text.strip().casefold().replace("_", " ").split())


def get_model(name: str) -> ModelSpec:
    """A catalog model by name, however it is typed (``name_key``); SpecError with the closest names otherwise."""
    key = name_key(name)
    if key not in MODELS:
        hint = closest(key, model_names())
        raise SpecError(f"unknown model {name!r}" + (f"; did you mean {', '.join(hint)}?" if hint else "")
                        + f" (catalog: {', '.join(model_names())}; or give a .yaml or config.json path)")
    return ModelSpec(name=key, **MODELS[key])


# --------------------------------------------------------------------------------------
# Hugging Face config.json (read as plain JSON, no transformers package)
# --------------------------------------------------------------------------------------

def _rope_scaling(cfg: Mapping[str, Any]) -> float:
    """The Llama 3.1-style scaling factor of ``rope_scaling`` (0 for none or another kind: YaRN,
    linear and dynamic scaling are not expressed by the emitters)."""
    rs = cfg.get("rope_scaling")
    if rs is None:
        return 0.0
    if not isinstance(rs, Mapping):
        raise SpecError(f"field 'rope_scaling' must be a mapping such as {{\"rope_type\": \"llama3\", \"factor\": 8.0}} "
                        f"(or null), got {describe(rs)}")
    kind = rs.get("rope_type") or rs.get("type")
    if kind is not None and not isinstance(kind, str):
        raise SpecError(f"field 'rope_scaling.rope_type' must be a string, got {describe(kind)}")
    factor = rs.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not 1 <= factor < float("inf")):
        raise SpecError(f"field 'rope_scaling.factor' must be a number >= 1 (how many times the trained context "
                        f"it stretches to; Llama 3.1: 8), got {describe(factor)}")
    if kind == "llama3":
        return float(factor or 0.0)
    return 0.0


def _number(cfg: Mapping[str, Any], k: str, lo: float, hi: float, what: str, hi_open: bool = False) -> float:
    """``cfg[k]`` as a float in (lo, hi] (or (lo, hi)), or SpecError naming the field."""
    v = cfg[k]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v \
            or (v >= hi if hi_open else v > hi):
        raise SpecError(f"field {k!r} must be a number in ({lo:g}, {hi:g}{')' if hi_open else ']'}: {what}; "
                        f"got {describe(v)}")
    return float(v)


def _settings(cfg: Mapping[str, Any], *eps_keys: str, theta_keys: tuple[str, ...] = ("rope_theta",)) -> dict:
    """rope_theta, rope_scaling and norm_eps where the config states them (else the defaults)."""
    d: dict[str, Any] = {}
    for k in theta_keys:
        if cfg.get(k):
            d["rope_theta"] = _number(cfg, k, 0.0, MAX_ROPE_THETA, "the RoPE base (Llama 3: 500000)")
            break
    for k in eps_keys:
        if cfg.get(k):
            d["norm_eps"] = _number(cfg, k, 0.0, 1.0, "an epsilon added to a variance (Llama: 1e-5)", hi_open=True)
            break
    if _rope_scaling(cfg):
        d["rope_scaling"] = _rope_scaling(cfg)
    return d


HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gpt2",
                  "gptj", "gpt_neox", "bloom", "opt", "falcon", "deepseek_v3", "deepseek_v2", "nemotron",
                  "gpt_oss", "gemma2", "gemma3", "gemma3_text", "phi3", "llama4", "llama4_text", "mpt")
# multimodal wrappers whose language model is their ``text_config`` (the vision tower is not planned)
_HF_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
# transformers' Gemma3TextConfig defaults (models/gemma3/configuration_gemma3.py): a published
# text_config leaves out what equals them (gemma-3-4b's names neither its heads nor its vocabulary)
_GEMMA3_TEXT_DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                             num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                             max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
                             rope_theta=1e6, sliding_window=4096, sliding_window_pattern=6)
# the llama-shaped types: RMSNorm, rotary, q/k/v/o and a gated MLP (Nemotron's is squared-ReLU, 2 matrices)
_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3",
               "deepseek_v2", "nemotron", "gpt_oss", "gemma2", "gemma3_text", "phi3", "llama4_text")


def _req(cfg: Mapping[str, Any], where: str, *keys: str) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise SpecError(f"{where}: missing field {' or '.join(repr(k) for k in keys)} "
                    f"(model_type {cfg.get('model_type')!r})")


# the config.json fields read below: counts (an integer >= 0, or null) and switches (true/false, or null)
_HF_COUNTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
              "intermediate_size", "head_dim", "max_position_embeddings", "n_layer", "n_embd", "n_embed", "n_head",
              "n_inner", "n_positions", "num_local_experts", "num_experts_per_tok", "num_experts",
              "moe_intermediate_size", "decoder_sparse_step", "shared_expert_intermediate_size", "n_routed_experts",
              "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank", "kv_lora_rank",
              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "ffn_dim", "seq_length", "num_kv_heads",
              "ffn_hidden_size", "sliding_window", "sliding_window_pattern", "attention_chunk_size",
              "interleave_moe_layer_step", "intermediate_size_mlp", "kv_channels", "experts_per_token",
              "no_rope_layer_interval", "d_model", "n_heads", "n_layers", "max_seq_len")
_HF_SWITCHES = ("tie_word_embeddings", "multi_query", "alibi", "bias", "attention_bias", "no_bias", "learned_pos_emb")
_HF_NUMBERS = ("attn_logit_softcapping", "final_logit_softcapping")       # a number >= 0, or null
_HF_LISTS = {"layer_types": str, "moe_layers": int, "no_rope_layers": int}   # a list of these, or null


# upper bounds of the counts, checked before any per-layer list is built (a config with 10^9 layers
# would otherwise build a 10^9-entry layout first): the ModelSpec ceilings of costmodel/limits.py
_HF_COUNT_MAX = MAX_SEQ          # 16,777,216: the largest count of anything a config states
_HF_COUNT_LIMITS = {**{k: (MAX_LAYERS, "the deepest published model has ~200 layers")
                       for k in ("num_hidden_layers", "n_layer", "first_k_dense_replace", "moe_layer_freq",
                                 "decoder_sparse_step", "interleave_moe_layer_step", "sliding_window_pattern",
                                 "no_rope_layer_interval")},
                    **{k: (MAX_EXPERTS, "DeepSeek-V3 routes over 256 experts")
                       for k in ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                 "experts_per_token", "n_shared_experts")}}
# mixture-of-experts model types and the field that counts their routed experts
_HF_MOE_FIELDS = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "llama4_text": "num_local_experts",
                  "qwen2_moe": "num_experts", "qwen3_moe": "num_experts", "deepseek_v3": "n_routed_experts",
                  "deepseek_v2": "n_routed_experts"}


def _check_hf_types(cfg: Mapping[str, Any], where: str) -> None:
    """The fields this parser reads have the types config.json gives them (a bool is not a count,
    "32" is not a number, -8 heads do not exist); named by their config.json names."""
    for k in _HF_COUNTS:
        v = cfg.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise SpecError(f"{where}: field {k!r} must be a non-negative integer (or null), got {describe(v)}")
        hi, why = _HF_COUNT_LIMITS.get(k, (_HF_COUNT_MAX, "far above any published model"))
        if v is not None and v > hi:      # before any list of layers is built from it
            raise SpecError(f"{where}: field {k!r} must be at most {hi:,} ({why}), got {v:,}; is it a typo?")
    for k in _HF_SWITCHES:
        v = cfg.get(k)
        if v is not None and not isinstance(v, bool):
            raise SpecError(f"{where}: field {k!r} must be true or false (or null), got {describe(v)}")
    for k in _HF_NUMBERS:
        v = cfg.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf")):
            raise SpecError(f"{where}: field {k!r} must be a number >= 0 (or null), got {describe(v)}")
    for k, kind in _HF_LISTS.items():
        v = cfg.get(k)
        if v is not None and (not isinstance(v, list) or len(v) > MAX_LAYERS
                              or any(isinstance(x, bool) or not isinstance(x, kind) for x in v)):
            raise SpecError(f"{where}: field {k!r} must be a list of {kind.__name__}s, one per layer at most "
                            f"(or null), got {describe(v)}")


def _periodic(marked: list[int], layers: int, what: str, where: str) -> tuple[int, int]:
    """``(first, step)`` of layers ``marked`` = first, first + step, ... (the only layouts
    ``ModelSpec`` expresses); SpecError naming the field otherwise."""
    if not marked:
        return 0, 0
    step = marked[1] - marked[0] if len(marked) > 1 else layers
    if step <= 0 or marked != list(range(marked[0], layers, step)) or (len(marked) == 1 and marked[0] >= layers):
        raise SpecError(f"{where}: {what} {marked[:8]}{'...' if len(marked) > 8 else ''} are not evenly spaced "
                        f"over the {layers} layers; the planner expresses every n-th layer only")
    return marked[0], step


def _window(cfg: Mapping[str, Any], where: str, layers: int, default_pattern: int, window_key: str = "sliding_window",
            local_flags: str = "") -> dict:
    """``sliding_window`` and ``sliding_window_pattern`` from a config: the window, and which
    layers attend fully, from ``layer_types`` (gpt-oss, recent Gemma), ``sliding_window_pattern``
    (Gemma 3), a list of 1 = local flags (Llama 4's ``no_rope_layers``), or the type's rule."""
    w = cfg.get(window_key)
    if not w:
        return {}
    lt, flags = cfg.get("layer_types"), cfg.get(local_flags) if local_flags else None
    if lt:
        if len(lt) != layers:
            raise SpecError(f"{where}: field 'layer_types' lists {len(lt)} layers, num_hidden_layers is {layers}")
        bad = sorted({t for t in lt if t not in ("sliding_attention", "full_attention", "chunked_attention")})
        if bad:
            raise SpecError(f"{where}: field 'layer_types' has {', '.join(map(repr, bad))}; known: sliding_attention, "
                            "full_attention, chunked_attention")
        full = [i for i, t in enumerate(lt) if t == "full_attention"]
    elif flags:
        if len(flags) != layers:
            raise SpecError(f"{where}: field {local_flags!r} lists {len(flags)} layers, num_hidden_layers is {layers}")
        full = [i for i, f in enumerate(flags) if not f]
    else:
        p = cfg.get("sliding_window_pattern") or default_pattern
        full = list(range(p - 1, layers, p)) if p else []
    if len(full) == layers:
        return {}                                   # every layer global: the window is never used
    first, step = _periodic(full, layers, "the full-attention layers", where)
    if full and first != step - 1:
        raise SpecError(f"{where}: full-attention layers {full[:4]}... start at layer {first}, not {step - 1}; the "
                        "planner expresses 'every n-th layer global' (layers n-1, 2n-1, ...) only")
    return dict(sliding_window=int(w), sliding_window_pattern=step if full else 0)


def _router(cfg: Mapping[str, Any], where: str) -> dict:
    """An MoE model's router from config.json: ``scoring_func`` (DeepSeek-V3: sigmoid; softmax
    otherwise), ``n_group``/``topk_group`` (group-limited routing), the balancing (``topk_method``
    ``noaux_tc``: DeepSeek-V3's auxiliary-loss-free bias; an auxiliary loss otherwise, its
    coefficient ``router_aux_loss_coef`` or ``aux_loss_alpha``) and the multi-token-prediction
    modules (``num_nextn_predict_layers``)."""
    out: dict = {}
    scoring = cfg.get("scoring_func")
    if scoring is not None:
        if scoring not in ("softmax", "sigmoid"):
            raise SpecError(f"{where}: field 'scoring_func' must be softmax or sigmoid, got {describe(scoring)}")
        out["router_scoring"] = scoring
    groups, topk = cfg.get("n_group"), cfg.get("topk_group")
    for k, v in (("n_group", groups), ("topk_group", topk), ("num_nextn_predict_layers",
                                                             cfg.get("num_nextn_predict_layers"))):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise SpecError(f"{where}: field {k!r} must be a non-negative integer (or null), got {describe(v)}")
    if groups and groups > 1 and topk:
        out.update(router_groups=groups, router_topk_groups=topk)
    if cfg.get("topk_method") == "noaux_tc":
        out["router_balance"] = "aux_free"
    else:
        out["router_balance"] = "aux_loss"
    coeff = cfg.get("router_aux_loss_coef", cfg.get("aux_loss_alpha"))
    if coeff is not None:
        if isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or not 0 <= coeff < 1e3:
            raise SpecError(f"{where}: field 'router_aux_loss_coef' must be a number >= 0, got {describe(coeff)}")
        out["router_aux_coeff"] = float(coeff)
    if cfg.get("num_nextn_predict_layers"):
        out["mtp_layers"] = cfg["num_nextn_predict_layers"]
    return out


def from_hf_config(cfg: Mapping[str, Any], name: str = "", where: str = "config.json") -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` dict."""
    try:
        return _from_hf_config(cfg, name, where)
    except SpecError as e:
        msg = str(e)
        raise SpecError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _from_hf_config(cfg: Mapping[str, Any], name: str = "", where: str = "config.json") -> ModelSpec:
    mt = cfg.get("model_type")
    _check_hf_types(cfg, where)
    if mt not in HF_MODEL_TYPES:
        raise SpecError(f"{where}: field 'model_type' is {describe(mt)}, which is not supported; supported: "
                        f"{', '.join(HF_MODEL_TYPES)}")
    name = name or cfg.get("_name_or_path") or mt
    if mt in _HF_WRAPPERS:
        tc = cfg.get("text_config")
        if not isinstance(tc, Mapping):
            raise SpecError(f"{where}: model_type {mt!r} is a multimodal wrapper; its language model is field "
                            f"'text_config', which must be a mapping, got {describe(tc)}")
        inner = dict(tc)
        inner["model_type"] = _HF_WRAPPERS[mt]
        if "tie_word_embeddings" not in inner and cfg.get("tie_word_embeddings") is not None:
            inner["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        return from_hf_config(inner, str(name), f"{where}: text_config")
    if mt == "gemma3_text":
        cfg = {**_GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    g = lambda *k: _req(cfg, where, *k)  # noqa: E731
    opt = cfg.get
    d: dict[str, Any] = dict(name=str(name), family=mt)
    if mt in _LLAMA_LIKE:
        gemma = mt in ("gemma2", "gemma3_text")          # Gemma ties its embeddings unless told otherwise
        d.update(layers=g("num_hidden_layers"), hidden=g("hidden_size"), heads=g("num_attention_heads"),
                 vocab=g("vocab_size"), ffn_hidden=g("intermediate_size"),
                 kv_heads=opt("num_key_value_heads") or g("num_attention_heads"),
                 head_dim=opt("head_dim") or 0, mlp="swiglu", norm="rmsnorm", positions="rotary",
                 tied_embeddings=bool(opt("tie_word_embeddings", gemma)),
                 max_seq_len=opt("max_position_embeddings") or 8192,
                 bias=False, qkv_bias=mt in ("qwen2", "qwen2_moe"))  # Qwen2: biases on q, k, v only
        d.update(_settings(cfg, "rms_norm_eps"))
        layers = d["layers"]
        if mt == "mixtral":
            d.update(num_experts=g("num_local_experts"), top_k=g("num_experts_per_tok"))
        if mt == "nemotron":
            # Nemotron-4 / Minitron: squared-ReLU MLP (up and down: 2 matrices, counted as the gelu
            # kind), LayerNorm1P (weight and bias), partial rotary; head_dim may be kv_channels
            d.update(mlp="gelu", norm="layernorm", head_dim=opt("head_dim") or opt("kv_channels") or 0,
                     bias=bool(opt("attention_bias", False)))
            d.update(_settings(cfg, "norm_eps", "layer_norm_eps"))
        if mt == "phi3":                  # Phi-3: fused qkv and gate_up (same counts); the window on every layer
            d.update(_window(cfg, where, layers, 0))
        if gemma:
            # Gemma 2: local and global layers alternate (layer 0 local); Gemma 3: 5 local, 1 global.
            # GeGLU counts as the gated kind (3 matrices); soft-capping changes no count, it is kept
            d.update(_window(cfg, where, layers, 2 if mt == "gemma2" else 6),
                     attn_softcap=float(opt("attn_logit_softcapping") or 0.0),
                     final_softcap=float(opt("final_logit_softcapping") or 0.0))
        if mt == "gpt_oss":
            # every layer MoE, biases on attention and experts, a sink logit per head, sliding and
            # full attention alternating (``layer_types``, layer 0 sliding)
            d.update(num_experts=g("num_local_experts"), top_k=g("num_experts_per_tok", "experts_per_token"),
                     expert_ffn_hidden=g("intermediate_size"), bias=bool(opt("attention_bias", True)),
                     attention_sinks=True, **_window(cfg, where, layers, 2))
        if mt == "llama4_text":
            # MoE every ``interleave_moe_layer_step``-th layer (layers step-1, 2*step-1, ...: ``moe_layers``)
            # with one shared expert; dense layers use intermediate_size_mlp; chunked attention of
            # attention_chunk_size tokens on the RoPE layers (no_rope_layers 1), every 4th layer global
            # (NoPE): a local window for the KV cache
            step = opt("interleave_moe_layer_step") or 1
            moe = opt("moe_layers")
            if moe is not None:
                first, step_m = _periodic(list(moe), layers, "the MoE layers (field 'moe_layers')", where)
                if moe and (first, step_m) != (step - 1, step) and not (len(moe) == 1 and layers == 1):
                    raise SpecError(f"{where}: field 'moe_layers' {list(moe)[:4]}... disagrees with "
                                    f"interleave_moe_layer_step {step} (layers {step - 1}, {2 * step - 1}, ...)")
            d.update(num_experts=g("num_local_experts"), top_k=g("num_experts_per_tok"),
                     ffn_hidden=opt("intermediate_size_mlp") or g("intermediate_size"),
                     expert_ffn_hidden=g("intermediate_size"), shared_experts=1,
                     first_dense_layers=step - 1, moe_layer_freq=step)
            interval = opt("no_rope_layer_interval") or 4
            flags = opt("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
            d.update(_window({"attention_chunk_size": opt("attention_chunk_size"), "no_rope_layers": flags},
                             where, layers, 0, window_key="attention_chunk_size", local_flags="no_rope_layers"))
        if mt in ("qwen2_moe", "qwen3_moe"):
            d.update(num_experts=g("num_experts"), top_k=g("num_experts_per_tok"),
                     expert_ffn_hidden=g("moe_intermediate_size"),
                     moe_layer_freq=opt("decoder_sparse_step") or 1)
            if mt == "qwen2_moe" and opt("shared_expert_intermediate_size"):
                d.update(shared_experts=1, shared_expert_ffn_hidden=opt("shared_expert_intermediate_size"))
        if mt in ("deepseek_v3", "deepseek_v2"):      # V2 (and V2-Lite): MLA without q compression, the same keys
            d.update(num_experts=g("n_routed_experts"), top_k=g("num_experts_per_tok"),
                     shared_experts=opt("n_shared_experts") or 0, expert_ffn_hidden=g("moe_intermediate_size"),
                     first_dense_layers=opt("first_k_dense_replace") or 0, moe_layer_freq=opt("moe_layer_freq") or 1,
                     attention="mla", q_lora_rank=opt("q_lora_rank") or 0, kv_lora_rank=g("kv_lora_rank"),
                     qk_nope_head_dim=g("qk_nope_head_dim"), qk_rope_head_dim=g("qk_rope_head_dim"),
                     v_head_dim=g("v_head_dim"),
                     head_dim=g("qk_nope_head_dim") + g("qk_rope_head_dim"), kv_heads=g("num_attention_heads"))
        if mt in _HF_MOE_FIELDS and (d.get("num_experts", 0) < 1 or d.get("top_k", 0) < 1):
            field = _HF_MOE_FIELDS[mt] if d.get("num_experts", 0) < 1 else "num_experts_per_tok"
            raise SpecError(f"{where}: field {field!r} is {cfg.get(field, 0)!r}: model_type {mt!r} is a "
                            "mixture of experts and needs at least 1 (routed expert, and expert per token); a "
                            "dense model has another model_type (e.g. llama)")
    elif mt == "gpt2":
        h = g("n_embd")
        d.update(layers=g("n_layer"), hidden=h, heads=g("n_head"), vocab=g("vocab_size"),
                 ffn_hidden=opt("n_inner") or 4 * h, mlp="gelu", norm="layernorm", positions="learned",
                 tied_embeddings=True, bias=True, max_seq_len=opt("n_positions") or 1024)
        d.update(_settings(cfg, "layer_norm_epsilon"))
    elif mt == "gptj":
        h = g("n_embd")
        d.update(layers=g("n_layer"), hidden=h, heads=g("n_head"), vocab=g("vocab_size"),
                 ffn_hidden=opt("n_inner") or 4 * h, mlp="gelu", norm="layernorm", positions="rotary",
                 tied_embeddings=bool(opt("tie_word_embeddings", False)), max_seq_len=opt("n_positions") or 2048)
        d.update(_settings(cfg, "layer_norm_epsilon"))
    elif mt == "gpt_neox":
        d.update(layers=g("num_hidden_layers"), hidden=g("hidden_size"), heads=g("num_attention_heads"),
                 vocab=g("vocab_size"), ffn_hidden=g("intermediate_size"), mlp="gelu", norm="layernorm",
                 positions="rotary", tied_embeddings=bool(opt("tie_word_embeddings", False)), bias=True,
                 max_seq_len=opt("max_position_embeddings") or 2048)
        d.update(_settings(cfg, "layer_norm_eps", theta_keys=("rotary_emb_base", "rope_theta")))
    elif mt == "bloom":
        h = g("hidden_size", "n_embed")
        d.update(layers=g("n_layer", "num_hidden_layers"), hidden=h, heads=g("n_head", "num_attention_heads"),
                 vocab=g("vocab_size"), ffn_hidden=4 * h, mlp="gelu", norm="layernorm", positions="alibi",
                 tied_embeddings=True, bias=True, max_seq_len=opt("seq_length") or 2048)
        d.update(_settings(cfg, "layer_norm_epsilon"))
    elif mt == "opt":
        d.update(layers=g("num_hidden_layers"), hidden=g("hidden_size"), heads=g("num_attention_heads"),
                 vocab=g("vocab_size"), ffn_hidden=g("ffn_dim"), mlp="gelu", norm="layernorm", positions="learned",
                 tied_embeddings=bool(opt("tie_word_embeddings", True)), bias=True,
                 max_seq_len=(opt("max_position_embeddings") or 2048) + 2)
    elif mt == "falcon":
        h = g("hidden_size")
        heads = g("num_attention_heads")
        kv = opt("num_kv_heads") or (1 if opt("multi_query", True) else heads)
        d.update(layers=g("num_hidden_layers"), hidden=h, heads=heads, kv_heads=kv, vocab=g("vocab_size"),
                 ffn_hidden=opt("ffn_hidden_size") or 4 * h, mlp="gelu", norm="layernorm",
                 positions="alibi" if opt("alibi") else "rotary", tied_embeddings=bool(opt("tie_word_embeddings", True)),
                 bias=bool(opt("bias", False)), max_seq_len=opt("max_position_embeddings") or 2048)
        d.update(_settings(cfg, "layer_norm_epsilon"))
    elif mt == "mpt":
        d.update(_mpt(cfg, where))
    if d.get("num_experts"):
        d.update(_router(cfg, where))
    for k in ("layers", "hidden", "heads", "vocab", "ffn_hidden"):
        v = d.get(k)
        if not isinstance(v, int) or v <= 0:
            raise SpecError(f"{where}: field for {k} must be a positive integer, got {v!r}")
    try:
        return ModelSpec(**d)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def _mpt(cfg: Mapping[str, Any], where: str) -> dict:
    """MosaicML's MPT (llm-foundry's ``MPTConfig``, transformers' ``MptConfig``): ``d_model``,
    ``n_heads``, ``n_layers``, an MLP of ``expansion_ratio * d_model`` (``ffn_config.ffn_type``
    ``mptglu``: gated, three matrices; else ``mptmlp``: GELU, two), LayerNorm, ALiBi unless
    ``attn_config`` says RoPE or learned positions, tied embeddings, no biases (``no_bias``, default
    true), grouped-query attention with ``attn_config.kv_n_heads``. Defaults are transformers'
    ``MptConfig`` ones (d_model 2048, 16 heads, 24 layers, ratio 4, 2048 positions, vocab 50368)."""
    attn = cfg.get("attn_config") or {}
    ffn_cfg = cfg.get("ffn_config") or {}
    if not isinstance(attn, Mapping) or not isinstance(ffn_cfg, Mapping):
        raise SpecError(f"{where}: attn_config and ffn_config must be objects (model_type 'mpt')")
    h = cfg.get("d_model") or 2048
    heads = cfg.get("n_heads") or 16
    ratio = cfg.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1000:
        raise SpecError(f"{where}: field 'expansion_ratio' must be a positive number, got {describe(ratio)}")
    ffn = ffn_cfg.get("ffn_hidden_size") or int(ratio * h)
    kind = attn.get("attn_type", "multihead_attention")
    kv = {"multihead_attention": heads, "multiquery_attention": 1}.get(kind) or attn.get("kv_n_heads") or heads
    for k, v in (("attn_config.kv_n_heads", kv), ("ffn_config.ffn_hidden_size", ffn)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SpecError(f"{where}: field {k!r} must be a positive integer, got {describe(v)}")
    if attn.get("alibi", True) and not attn.get("rope"):
        positions = "alibi"
    elif attn.get("rope"):
        positions = "rotary"
    else:
        positions = "learned" if cfg.get("learned_pos_emb", True) else "alibi"
    out = dict(layers=cfg.get("n_layers") or 24, hidden=h, heads=heads, kv_heads=kv,
               vocab=cfg.get("vocab_size") or 50368, ffn_hidden=ffn,
               mlp="swiglu" if ffn_cfg.get("ffn_type") == "mptglu" else "gelu", norm="layernorm",
               positions=positions, tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
               bias=not cfg.get("no_bias", True), max_seq_len=cfg.get("max_seq_len") or 2048)
    eps = cfg.get("layer_norm_epsilon")
    if eps is not None:
        out["norm_eps"] = eps
    if positions == "rotary":
        out["rope_theta"] = float(attn.get("rope_theta", 10000))
    return out


# --------------------------------------------------------------------------------------
# Hugging Face ids of the catalog models (what a serving engine downloads); a catalog name is a
# nickname no server resolves. Models with no public checkpoint (GPT-3, the tiny test models)
# have none: their serving files need --hf-id or a local path.
# --------------------------------------------------------------------------------------

HF_IDS: dict[str, str] = {
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
}


def hf_id(name: str) -> str | None:
    """The Hugging Face id of a catalog model, None when it has none."""
    return HF_IDS.get(name.lower())
