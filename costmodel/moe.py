"""Mixture-of-experts rules, one function each, shared by training (``costmodel.layers``) and
serving (``costmodel.inference``): how fast the grouped expert GEMMs run, what permutation and the
router cost, how unevenly the routed tokens fall on the expert-parallel ranks, how many bytes the
dispatch moves and at what fraction of the link the chosen dispatcher reaches, and the host's share
of a dropless MoE layer. Pure; every constant names its source. ``[REF §n]`` is
``/work/shared/reference/moe-and-fp8.md`` section n, which copies the numbers from the sources
named beside them.

What the launch file selects is ``MoeExecution`` (``FrameworkProfile.moe``): the token dispatcher,
fused permutation, fused router, FP8 dispatch. A rule that depends on one of them is priced only
as the file sets it; the Megatron emitter writes each of them (``emitters/megatron.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .specs import LinkSpec
from .units import US

ROUTER_FP32_BYTES = 4            # router logits in FP32 (Megatron recommends --moe-router-dtype fp32) [REF §2]

# ---- grouped GEMM ------------------------------------------------------------------------------
# DeepGEMM's FP8 grouped GEMM on H800 [REF §1, DeepGEMM README @55ab91f7]: contiguous groups of
# 4,096-8,192 tokens reach 1,346 TFLOPS where its dense GEMM at M=4,096 reaches up to 1,426: a grouped
# kernel at large per-expert M runs at 1346/1426 = 0.94 of the dense one.
GROUPED_LARGE_M_RATIO = 0.94
# The same tables, small M (derived in [REF §1]): 0.92 of the large-M rate at 1,024 tokens, 0.77 at
# 512, 0.69 at 256, 0.40 at 128, 0.21 at 64. m/(m+m0) through each point gives m0 = 89, 153, 115,
# 192, 240 tokens; the median, 153, is taken.
GROUPED_HALF_TOKENS = 153.0
# Small K costs more than small N: at the same M the 7168x2048 (N x K) shapes run 10-25% below the
# 4096x7168 ones [REF §1]. K/(K+K0) through that ratio (0.82, the middle of 0.75-0.90) at K=2,048
# against K=7,168 gives K0 = 690 (derived: 2048/(2048+K0) = 0.82 * 7168/(7168+K0)); normalised to 1
# at K=7,168. Below K=2,048 it is an extrapolation of the same curve (no narrower shape published).
GROUPED_HALF_K = 690.0
_K_REF = 7168.0


def grouped_gemm_factor(tokens_per_expert: float, k: float) -> float:
    """How much slower than one dense GEMM of the same total size a grouped expert GEMM runs,
    as a factor <= 1 on its efficiency: the grouped kernel at large M, the per-expert M
    (``tokens_per_expert``) against ``GROUPED_HALF_TOKENS``, and the reduction width ``k`` (the
    expert FFN width for the down projection) against ``GROUPED_HALF_K``."""
    m = max(tokens_per_expert, 1e-9)
    m_factor = m / (m + GROUPED_HALF_TOKENS)
    k_factor = min(1.0, (k / (k + GROUPED_HALF_K)) / (_K_REF / (_K_REF + GROUPED_HALF_K)))
    return GROUPED_LARGE_M_RATIO * m_factor * k_factor


# ---- permutation and router ----------------------------------------------------------------------
# A standalone permute (gather) kernel on H200 reaches 1.5-2.4 TB/s of 4.8 (0.31-0.50) in a tuned
# kernel, 0.84-1.61 TB/s (0.18-0.34) as PyTorch ops (TileOPs PR #603, [REF §2]). Unfused permutation
# (index ops): the PyTorch middle, 0.25 of HBM. Fused (TE's moe_permute/unpermute, Megatron's
# --moe-permute-fusion: 1.1-1.6x faster permute, 1.7-3x faster unpermute, TE PR #1921): the tuned
# kernel's middle, 0.40 of HBM (0.25 x 1.6, the middle of 1.1-3x).
PERMUTE_HBM_FRACTION = {False: 0.25, True: 0.40}
# The router's softmax/sigmoid, top-k and aux-loss statistics: unfused it is launch-bound, 4 kernels
# in 15.5 us (3.9 us each), fused 1 kernel in 2.0 us (Megatron-LM PR #6456, [REF §2]).
KERNEL_LAUNCH_S = 15.5 * US / 4
ROUTER_KERNELS = {False: 4, True: 1}
# Permutation kernels a forward pass launches: index generation, sort, gather before the experts,
# scatter-add and the probability multiply after; fused, one each way (TE's fused permute and
# unpermute). Counted from Megatron-Core's moe_utils.permute/unpermute code paths, not measured.
PERMUTE_KERNELS = {False: 5, True: 2}


def permute_bytes(tokens: float, top_k: int, hidden: float, a_bytes: float) -> float:
    """HBM bytes of permuting ``tokens`` routed ``top_k`` ways and unpermuting them, forward:
    each token read once and written ``top_k`` times into expert order, and the ``top_k`` outputs
    read back and summed into one (Megatron's ``moe_permute``/``unpermute``)."""
    return 2.0 * (tokens * hidden + tokens * top_k * hidden) * a_bytes


def router_bytes(tokens: float, experts: int) -> float:
    """HBM bytes of the router's softmax / top-k over the FP32 logits, forward."""
    return 2.0 * tokens * experts * ROUTER_FP32_BYTES


def permute_time_s(hbm_bytes_per_s: float, tokens: float, top_k: int, hidden: float, a_bytes: float,
                   fused: bool) -> float:
    """Forward time of permutation plus unpermutation: the bytes at the fraction of HBM those
    kernels reach, never under their launches."""
    bw = PERMUTE_HBM_FRACTION[fused] * hbm_bytes_per_s
    return max(permute_bytes(tokens, top_k, hidden, a_bytes) / bw, PERMUTE_KERNELS[fused] * KERNEL_LAUNCH_S)


def router_time_s(hbm_bytes_per_s: float, tokens: float, experts: int, fused: bool) -> float:
    """Forward time of the router after its GEMM: its FP32 traffic at the permutation kernels'
    fraction of HBM, never under its kernels' launches."""
    bw = PERMUTE_HBM_FRACTION[fused] * hbm_bytes_per_s
    return max(router_bytes(tokens, experts) / bw, ROUTER_KERNELS[fused] * KERNEL_LAUNCH_S)


# ---- host synchronisation ------------------------------------------------------------------------
# Dropless routing copies the per-expert token counts to the host once per MoE layer forward (the
# all-to-all's split sizes and the grouped GEMM's group sizes; Megatron-LM PR #5258 names this
# per-layer ``.item()`` sync, and its README that dropless MoE layers cannot be captured in CUDA
# graphs [REF §5]). The queue drains there: the GPU waits one device-to-host round trip and the
# launch of the next kernel -- taken as two kernel launches (no published per-sync figure was found;
# [REF §5] "not found").
DROPLESS_SYNC_S = 2 * KERNEL_LAUNCH_S


def host_sync_s(dropless: bool = True) -> float:
    """Exposed host time per MoE layer forward: the dropless token-count sync; none when a
    capacity factor fixes the shapes."""
    return DROPLESS_SYNC_S if dropless else 0.0


# ---- load imbalance ------------------------------------------------------------------------------
# Wang et al., "Auxiliary-Loss-Free Load Balancing" (arXiv 2408.15664), Table 2: MaxVio_global =
# (max expert load - mean)/mean is 0.72 (1B) and 0.52 (3B) with an auxiliary loss, 0.04 with the
# bias-based, loss-free method [REF §3]. The larger model's aux-loss figure and the loss-free one
# are taken as the busiest expert's load over the mean.
EXPERT_MAX_OVER_MEAN = {"aux_loss": 1.52, "aux_free": 1.04}


def load_factor(balance: str = "aux_loss", experts_per_rank: float = 1.0, capacity_factor: float = 0.0) -> float:
    """How much more than the mean share of routed tokens the busiest expert-parallel rank
    handles. The busiest expert carries ``EXPERT_MAX_OVER_MEAN`` of the mean; a rank holding
    ``n`` experts carries it with ``n - 1`` others taken at the mean, ``1 + (f - 1)/n``
    (derived). A capacity factor ``c`` (GShard-style dropping) caps it at ``c``."""
    f = EXPERT_MAX_OVER_MEAN.get(balance or "aux_loss", EXPERT_MAX_OVER_MEAN["aux_loss"])
    rank = 1.0 + (f - 1.0) / max(1.0, experts_per_rank)
    return min(rank, capacity_factor) if capacity_factor > 0 else rank


# ---- dispatch ------------------------------------------------------------------------------------
# Bytes per value of an FP8 dispatch with 1x128 FP32 scales: (1 + 4/128) (DeepEP's and HybridEP's
# ``fp8_factor`` counts (1 + 4/128)/2 of BF16) [REF §4]. The combine stays BF16 [DSV3 §3.3].
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0

# The fraction of the link's per-direction bandwidth (``LinkSpec.gb_per_s``) a dispatcher's
# all-to-all reaches, inside the NVLink domain and across nodes [REF §4]:
# * alltoall (NCCL): 8 x H100 NVLink, 64 MB in 210 us (SGLang#22583): 7/8 of it leaves each rank,
#   58.7 MB / 210 us = 280 GB/s of 450 = 0.62; across nodes one NIC's rate, 48-49 of 50 GB/s (CX7
#   NDR, nccl-tests#267) = 0.97.
# * deepep (DeepEP V1, H800): 153-158 GB/s of NVLink's 160 = 0.96; across nodes 43 GB/s of 50 at
#   EP16, where node-limited forwarding helps least = 0.86 (legacy.md table).
DISPATCH_LINK_FRACTION = {"alltoall": {"intra": 0.62, "inter": 0.97}, "deepep": {"intra": 0.96, "inter": 0.86}}
DISPATCHERS = tuple(DISPATCH_LINK_FRACTION)


@dataclass(frozen=True)
class MoeExecution:
    """How a framework runs MoE layers, as its launch file sets them."""

    dispatcher: str = "alltoall"     # Megatron --moe-token-dispatcher-type alltoall | flex + DeepEP
    permute_fusion: bool = False     # Megatron --moe-permute-fusion (TE fused permute/unpermute)
    router_fusion: bool = False      # Megatron --moe-router-fusion
    fp8_dispatch: bool = False       # FP8 tokens in the dispatch (DeepEP / HybridEP under FP8 training)
    dropless: bool = True            # no capacity factor: a host sync per layer, no dropping
    capacity_factor: float = 0.0

    def __post_init__(self) -> None:
        if self.dispatcher not in DISPATCH_LINK_FRACTION:
            raise ValueError(f"moe dispatcher {self.dispatcher!r} is not one of {', '.join(DISPATCHERS)}")


DEFAULT_EXECUTION = MoeExecution()


def dispatch_bytes(tokens: float, top_k: float, hidden: float, value_bytes: float, load: float = 1.0) -> float:
    """Bytes one rank sends in one dispatch (or combine): its ``tokens`` times ``top_k`` routed
    copies of ``hidden`` values, on the busiest rank ``load`` times the mean. The one rule for
    training and serving."""
    return tokens * top_k * hidden * value_bytes * load


def dispatch_value_bytes(a_bytes: float, execution: MoeExecution, combine: bool) -> float:
    """Bytes per value on the wire: FP8 with scales for an FP8 dispatch, the activation dtype
    otherwise and always for the combine."""
    return FP8_DISPATCH_BYTES if execution.fp8_dispatch and not combine else a_bytes


def remote_node_copies(top_k: int, nodes: int, max_nodes: int = 0) -> float:
    """Routed copies of a token that cross the inter-node network per token, where a dispatcher
    sends a token once per destination node and forwards it inside the node over NVLink
    (DeepEP's internode kernels; DeepSeek-V3 Sec. 3.2.2): the expected number of other nodes
    among ``top_k`` experts spread uniformly over ``nodes`` nodes, ``nodes (1 - (1-1/nodes)^k)``
    less the token's own node's share, at most ``max_nodes`` (node-limited routing: DeepSeek-V3
    sends each token to at most 4 nodes)."""
    if nodes <= 1:
        return 0.0
    distinct = nodes * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    if max_nodes > 0:
        distinct = min(distinct, float(max_nodes))
    return distinct * (nodes - 1) / nodes


def node_limit(groups: int, topk_groups: int, nodes: int) -> int:
    """Most nodes one token's experts span under group-limited routing (DeepSeek-V3's
    ``n_group``/``topk_group``: 8 groups, 4 chosen, one group per node of its EP64 = "at most 4
    nodes", Sec. 3.2.2): ``topk_groups`` groups, each spread over ``nodes/groups`` nodes when the
    EP group has more nodes than groups; 0 (no limit) without groups."""
    if groups <= 0 or topk_groups <= 0:
        return 0
    return topk_groups * max(1, nodes // groups)


def dispatch_time_s(sent_bytes: float, top_k: int, ep: int, ep_per_node: int, intra: LinkSpec, inter: LinkSpec,
                    execution: MoeExecution, groups: int = 0, topk_groups: int = 0) -> float:
    """One dispatch (or combine) all-to-all among ``ep`` ranks, ``ep_per_node`` of them in each
    NVLink domain, each rank sending ``sent_bytes`` (``dispatch_bytes``: its ``top_k`` copies of
    every token). The share bound for the other ranks of its domain moves at the dispatcher's
    NVLink fraction of ``intra``; across nodes the alltoall dispatcher sends every copy bound for
    another node, DeepEP one per destination node (``remote_node_copies``, at most
    ``node_limit`` nodes), forwarded over NVLink there. The two tiers run at once and the slower sets the time, plus one latency of
    each tier used."""
    if ep <= 1 or sent_bytes <= 0:
        return 0.0
    frac = DISPATCH_LINK_FRACTION[execution.dispatcher]
    bw_intra = frac["intra"] * intra.bandwidth_bytes_per_s
    k_local = max(1, min(ep, ep_per_node))
    nodes = max(1, ep // k_local)
    t_intra = (k_local - 1) / ep * sent_bytes / bw_intra if k_local > 1 else 0.0
    t_inter = 0.0
    if nodes > 1:
        if execution.dispatcher == "deepep":
            limit = node_limit(groups, topk_groups, nodes)
            inter_bytes = sent_bytes / top_k * remote_node_copies(top_k, nodes, limit)
            if k_local > 1:
                t_intra = (k_local - 1) / k_local * sent_bytes / bw_intra
        else:
            inter_bytes = (ep - k_local) / ep * sent_bytes
        t_inter = inter_bytes / (frac["inter"] * inter.bandwidth_bytes_per_s)
    lat = (intra.latency_s if k_local > 1 else 0.0) + (inter.latency_s if nodes > 1 else 0.0)
    return max(t_intra, t_inter) + lat


def alignment_tokens(tokens_per_expert: float, align: int) -> float:
    """Tokens per expert after padding to the kernel's alignment (FP8 needs M in multiples of 16,
    MXFP8 of 32 [REF §1])."""
    return math.ceil(tokens_per_expert / align) * align if align > 1 else tokens_per_expert
