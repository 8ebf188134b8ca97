"""What the cost model predicts for the public small-expert MoE measurement of
``calibration/moe_small_expert_sources.yaml`` (torchtitan-dsv3-16b-b200-8gpu): torchtitan's DeepSeek-V3
"16B" (DeepSeek-V2-Lite's shape, torchtitan/models/deepseek_v3/__init__.py ``_16b``) on 8 B200, FSDP
(ZeRO-3), EP1, no activation checkpointing, at the local batches and sequence lengths the source tried.
Prints the model-FLOPs MFU next to the reported torchtitan MFU. Not a validation row (see the file).

    python bench/check_small_experts.py
"""
from __future__ import annotations

import dataclasses

from costmodel.catalog import get_model
from costmodel.files.clusters import load_cluster
from costmodel.specs import ParallelConfig, Workload
from costmodel.training import estimate

# (local batch, sequence length, the source's reported MFU)
POINTS = ((4, 4096, 0.18), (6, 4096, 0.20), (4, 6144, 0.21))


def model():
    return dataclasses.replace(
        get_model("deepseek-v3"), name="torchtitan-deepseek-v3-16b", layers=27, hidden=2048, heads=16, kv_heads=16,
        vocab=102400, ffn_hidden=10944, num_experts=64, top_k=6, shared_experts=2, expert_ffn_hidden=1408,
        shared_expert_ffn_hidden=1408, first_dense_layers=1, q_lora_rank=0, router_scoring="softmax",
        router_balance="aux_loss", router_aux_coeff=0.0, router_groups=0, router_topk_groups=0, mtp_layers=0,
        published_params=0.0)


def main() -> None:
    m = model()
    c = load_cluster("dgx-b200").with_gpus(8)
    for mb, seq, reported in POINTS:
        par = ParallelConfig(tp=1, pp=1, dp=8, ep=1, micro_batch=mb, grad_accum=1, zero=3, recompute="none")
        e = estimate(m, c, Workload(global_batch=8 * mb, seq_len=seq), par, framework="torchtitan")
        print(f"local batch {mb} seq {seq}: predicted MFU {e.mfu:.3f}, reported {reported:.2f}, "
              f"ratio {e.mfu / reported:.2f}, fits {e.fits}")


if __name__ == "__main__":
    main()
