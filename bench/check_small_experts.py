"""What the cost model predicts for the public small-expert MoE measurement of
``calibration/moe_small_expert_sources.yaml`` (torchtitan-dsv3-16b-b200-8gpu): torchtitan's DeepSeek-V3
"16B" (DeepSeek-V2-Lite's shape, torchtitan/models/deepseek_v3/__init__.py ``16B``) on 8 B200, FSDP
(ZeRO-3), EP1, no activation checkpointing, at the local batches and sequence lengths the source tried.
Prints the predicted MFU in torchtitan's own definition next to the reported torchtitan MFU. Not a
validation row (see the file).

torchtitan's MFU (torchtitan @bb308da6, the last commit before the source's 2025-11-05 notes):
``components/metrics.py`` divides ``num_flops_per_token x tokens/s per GPU`` by ``get_peak_flops``,
2.25e15 for a B200 (``tools/utils.py``, BF16 dense); ``models/utils.get_moe_model_nparams_and_flops``
counts ``6 x`` the parameters outside the embedding, with the routed experts at ``top_k / num_experts``
and the router, shared experts and output head whole, plus ``6 x layers x heads x (qk_nope + qk_rope + v)
x seq`` for attention (no causal halving). ``torchtitan_flops_per_token`` restates that count from the
model's shape, independently of ``costmodel.layers``; the two agree to 0.01% and the peaks are equal
(tests/test_moe_terms.py), so the MFU figures compare like with like.

Then the file's ``check_cases`` (the Megatron-LM and NeMo-RL Qwen3-30B-A3B reports, as far as their
text states them), each predicted through ``planner validate``'s own ``case_rows`` (the Megatron
target's profile), published against predicted.

    python bench/check_small_experts.py
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ModelSpec, ParallelConfig, Workload
from costmodel.training import estimate

# (local batch, sequence length, the source's reported MFU)
POINTS = ((4, 4096, 0.18), (6, 4096, 0.20), (4, 6144, 0.21))
TORCHTITAN_B200_PEAK = 2.25e15      # torchtitan tools/utils.get_peak_flops, "B200" (BF16 dense)


def model() -> ModelSpec:
    return dataclasses.replace(
        get_model("deepseek-v3"), name="torchtitan-deepseek-v3-16b", layers=27, hidden=2048, heads=16, kv_heads=16,
        vocab=102400, ffn_hidden=10944, num_experts=64, top_k=6, shared_experts=2, expert_ffn_hidden=1408,
        shared_expert_ffn_hidden=1408, first_dense_layers=1, q_lora_rank=0, router_scoring="softmax",
        router_balance="aux_loss", router_aux_coeff=0.0, router_groups=0, router_topk_groups=0, mtp_layers=0,
        published_params=0.0)


def torchtitan_flops_per_token(m: ModelSpec, seq: int) -> float:
    """torchtitan's FLOPs per token for a DeepSeek-V3-family MoE without q LoRA (see the module
    docstring), from the shape: each weight counted once, routed experts at top_k / num_experts."""
    h, nh = m.hidden, m.heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    attn = (h * nh * qk                                            # wq (q_lora_rank 0)
            + h * (m.kv_lora_rank + m.qk_rope_head_dim)            # wkv_a
            + m.kv_lora_rank                                       # kv_norm
            + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)   # wkv_b
            + nh * m.v_head_dim * h                                # wo
            + 2 * h)                                               # attention and FFN norms
    dense_ffn = 3 * h * m.ffn_hidden
    router = h * m.num_experts
    shared = 3 * h * m.shared_expert_ffn_hidden * m.shared_experts
    routed_active = 3 * h * m.expert_ffn_hidden * m.num_experts * m.top_k // m.num_experts
    n_dense = m.first_dense_layers
    n_moe = m.layers - n_dense
    active = (m.layers * attn + n_dense * dense_ffn + n_moe * (router + shared + routed_active)
              + h + h * m.vocab)                                   # final norm, output head (embedding excluded)
    return 6 * active + 6 * m.layers * nh * (qk + m.v_head_dim) * seq


SOURCES = Path(__file__).resolve().parents[1] / "calibration" / "moe_small_expert_sources.yaml"


def check_rows() -> list:
    """``planner validate``'s rows for the file's ``check_cases`` (split ``check``): not validation."""
    from planner.cli.validation import REFUSED, case_rows
    rows = []
    for case in yaml.safe_load(SOURCES.read_text()).get("check_cases", []):
        got = case_rows(case, "check")
        if not got:
            raise SystemExit(f"{case['name']}: refused by every target ({REFUSED.get(case['name'])})")
        rows += got
    return rows


def main() -> None:
    m = model()
    c = load_cluster("dgx-b200").with_gpus(8)
    for mb, seq, reported in POINTS:
        par = ParallelConfig(tp=1, pp=1, dp=8, ep=1, micro_batch=mb, grad_accum=1, zero=3, recompute="none")
        e = estimate(m, c, Workload(global_batch=8 * mb, seq_len=seq), par, framework="torchtitan")
        tt_mfu = torchtitan_flops_per_token(m, seq) * e.tokens_per_s_per_gpu / TORCHTITAN_B200_PEAK
        print(f"local batch {mb} seq {seq}: predicted MFU {e.mfu:.3f} (torchtitan's count {tt_mfu:.3f}), "
              f"reported {reported:.2f}, ratio {tt_mfu / reported:.2f}, step {e.step_time_s:.3f} s, fits {e.fits}")
    for r in check_rows():
        print(f"{r.case}: {r.metric} published {r.published:g}, predicted {r.predicted:.4g} ({r.error * 100:+.1f}%)")


if __name__ == "__main__":
    main()
