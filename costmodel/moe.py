"""Mixture-of-experts terms beyond the GEMMs: token permutation, the router's elementwise work,
and load imbalance. ``costmodel.layers.layer_cost`` calls these for an MoE layer.

* Permutation (Megatron's ``moe_permute`` / ``unpermute``, torchtitan's ``generate_permute_indices``):
  before the experts each token's hidden state is copied once per chosen expert into expert
  order (read ``T*h``, write ``T*k*h``), and after them the ``k`` outputs are gathered back and
  summed with their routing weights (read ``T*k*h``, write ``T*h``): memory-bound, BF16.
* Router: a BF16 GEMM to ``E`` logits (in ``layer_matrices``), then softmax or sigmoid, top-k and
  the auxiliary-loss statistics over ``T*E`` FP32 values (Megatron recommends FP32 routing with
  32 or more experts): read and written once each.
* Load imbalance (dropless routing): the busiest expert-parallel rank receives ``imbalance``
  times the mean share of the routed tokens, and every rank waits for it in the combine
  all-to-all; its expert GEMMs and its all-to-all volume scale by it. ``MOE_LOAD_IMBALANCE`` is
  1.0, perfectly balanced routing: an assumption, not a measurement (no published per-rank load
  figure was found; DeepSeek-V3's report says its auxiliary-loss-free balancing keeps the load
  balanced through training and drops no tokens). A capacity factor ``c`` (token dropping, GShard)
  bounds it: ``min(imbalance, c)``.
"""
from __future__ import annotations

MOE_LOAD_IMBALANCE = 1.0
ROUTER_FP32_BYTES = 4


def permute_bytes(tokens: float, top_k: int, hidden: float, a_bytes: float) -> float:
    """HBM bytes of permuting ``tokens`` routed ``top_k`` ways and unpermuting them, forward."""
    return 2.0 * (tokens * hidden + tokens * top_k * hidden) * a_bytes


def router_bytes(tokens: float, experts: int) -> float:
    """HBM bytes of the router's softmax / top-k over the FP32 logits, forward."""
    return 2.0 * tokens * experts * ROUTER_FP32_BYTES


def load_factor(imbalance: float = MOE_LOAD_IMBALANCE, capacity_factor: float = 0.0) -> float:
    """How much more than the mean share of routed tokens the busiest rank handles."""
    return min(imbalance, capacity_factor) if capacity_factor > 0 else imbalance
