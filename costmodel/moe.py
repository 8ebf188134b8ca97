"""Mixture-of-experts rules, one function each, shared by training (``costmodel.layers``) and
serving (``costmodel.inference``): how fast the grouped expert GEMMs run, what permutation and the
router cost, how unevenly the routed tokens fall on the expert-parallel ranks, how many bytes the
dispatch moves and at what fraction of the link the chosen dispatcher reaches, and the host's share
of a dropless MoE layer. Pure; every constant names its source. ``[REF §n]`` marks a number
transcribed (in section n of the authors' MoE reference notes, not part of this repository) from
the primary source named beside it: cite that source.

What the launch file selects is ``MoeExecution`` (``FrameworkProfile.moe``): the token dispatcher,
fused permutation, fused router, FP8 dispatch. A rule that depends on one of them is priced only
as the file sets it; the Megatron emitter writes each of them (``emitters/megatron.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .units import US

if TYPE_CHECKING:                      # only the attributes are read: no import cycle through specs
    from .comm import GroupLayout, Network
    from .specs import LinkSpec

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


def grouped_gemm_compute_factor(k: float) -> float:
    """The grouped kernel's efficiency against one dense GEMM of the same total size where it is
    compute-bound (large per-expert M): the grouped kernel at large M and the reduction width
    ``k`` (the expert FFN width for the down projection) against ``GROUPED_HALF_K``. Serving
    prices its expert GEMMs as a roofline with the weight reads apart, and takes only this part
    (``costmodel.inference.grouped_expert_gemm``)."""
    k_factor = min(1.0, (k / (k + GROUPED_HALF_K)) / (_K_REF / (_K_REF + GROUPED_HALF_K)))
    return GROUPED_LARGE_M_RATIO * k_factor


def grouped_gemm_factor(tokens_per_expert: float, k: float) -> float:
    """How much slower than one dense GEMM of the same total size a grouped expert GEMM runs,
    as a factor <= 1 on its efficiency: ``grouped_gemm_compute_factor`` and the per-expert M
    (``tokens_per_expert``) against ``GROUPED_HALF_TOKENS``. The M part is DeepGEMM's whole
    small-M fall, weight reads included: training's compute-bound GEMMs take it; serving's
    roofline, which reads the weights in its own term, must not (it would count them twice)."""
    m = max(tokens_per_expert, 1e-9)
    return m / (m + GROUPED_HALF_TOKENS) * grouped_gemm_compute_factor(k)


# ---- permutation and router ----------------------------------------------------------------------
# A standalone permute (gather) kernel on H200 reaches 1.5-2.4 TB/s of 4.8 (0.31-0.50) in a tuned
# kernel, 0.84-1.61 TB/s (0.18-0.34) as PyTorch ops (TileOPs PR #603, [REF §2]). Unfused permutation
# (index ops): the PyTorch middle, 0.25 of HBM. Fused (TE's moe_permute/unpermute, Megatron's
# --moe-permute-fusion: 1.1-1.6x faster permute, 1.7-3x faster unpermute, TE PR #1921): the tuned
# kernel's middle, 0.40 of HBM (0.25 x 1.6, the middle of 1.1-3x).
PERMUTE_HBM_FRACTION = {False: 0.25, True: 0.40}
# The router's softmax/sigmoid, top-k and aux-loss statistics: unfused it is launch-bound, 4 kernels
# in 15.5 us (3.9 us each), fused 1 kernel in 2.0 us (Megatron-LM PR #6456, 128 experts, 256 tokens,
# [REF §2]): those are its floors.
KERNEL_LAUNCH_S = 15.5 * US / 4
ROUTER_FLOOR_S = {False: 15.5 * US, True: 2.0 * US}
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
    fraction of HBM, never under its measured launch-bound floor."""
    bw = PERMUTE_HBM_FRACTION[fused] * hbm_bytes_per_s
    return max(router_bytes(tokens, experts) / bw, ROUTER_FLOOR_S[fused])


# ---- host synchronisation ------------------------------------------------------------------------
# Dropless routing copies the per-expert token counts to the host once per MoE layer forward (the
# all-to-all's split sizes and the grouped GEMM's group sizes; Megatron-LM PR #5258 names this
# per-layer ``.item()`` sync, and its README that dropless MoE layers cannot be captured in CUDA
# graphs [REF §5]). The queue drains there: the GPU waits one device-to-host round trip and the
# launch of the next kernel -- taken as two kernel launches (no published per-sync figure was found;
# [REF §5] "not found").
HOST_SYNC_S = 2 * KERNEL_LAUNCH_S
DROPLESS_SYNC_S = HOST_SYNC_S       # one such sync per MoE layer forward


def host_sync_s(dropless: bool = True) -> float:
    """Exposed host time per MoE layer forward: the dropless token-count sync; none when a
    capacity factor fixes the shapes."""
    return DROPLESS_SYNC_S if dropless else 0.0


# ---- per-expert launches of the expert GEMMs --------------------------------------------------------
# Megatron's ``--moe-grouped-gemm`` without ``--moe-use-legacy-grouped-gemm`` runs the routed experts as
# TEGroupedMLP (Megatron-LM's own argument check names the pair), whose Transformer Engine
# ``GroupedLinear`` is not one grouped kernel: it issues one cuBLAS GEMM per local expert on several
# streams (TransformerEngine PR #853, "Grouped GEMM via multi-stream cuBLAS"; TE issue #1386: batched
# GEMM cannot take unequal sizes and cuBLAS/CUTLASS grouped kernels were slower). Every one of those
# calls costs the host its own operations: the input's split by expert and the GEMM call itself (TE
# issue #1499, a maintainer: the gap between GroupedLinear and its GEMMs is the CPU overhead of
# ``torch.split`` and the per-GEMM allocations), each at the measured per-operation cost
# ``KERNEL_LAUNCH_S``. Two host operations per expert GEMM are counted (the split and the call; FP8's
# per-GEMM allocations are not counted: a lower bound). torchtitan's ``torch._grouped_mm`` and the
# legacy grouped GEMM are one kernel per matrix: no per-expert floor. CUDA graphs do not remove it
# where Megatron captures them for dropless MoE (attn, moe_router, moe_preprocess: the experts stay
# eager, [REF §5] from the Megatron-Core MoE README); the emitted file captures none.
HOST_OPS_PER_EXPERT_GEMM = 2


def expert_gemm_host_floor_s(local_experts: float, per_expert_launches: bool) -> float:
    """The least time one expert matrix's forward GEMMs take when the host issues one GEMM per
    local expert (``per_expert_launches``: TE's GroupedLinear): ``local_experts`` x
    ``HOST_OPS_PER_EXPERT_GEMM`` host operations at ``KERNEL_LAUNCH_S``; 0 for a single grouped
    kernel. The backward issues two GEMMs per expert (input and weight gradients), twice this,
    as the cost model's backward is twice its forward."""
    if not per_expert_launches:
        return 0.0
    return max(local_experts, 0.0) * HOST_OPS_PER_EXPERT_GEMM * KERNEL_LAUNCH_S


# ---- host pacing of a whole MoE layer -------------------------------------------------------------
# A dropless MoE layer drains the launch queue once per forward (``host_sync_s``), so the host cannot run a
# layer ahead: a layer takes at least the host's time to issue it. Megatron-Core runs the layer eagerly from
# Python (router, aux loss, the dispatcher's preprocessing, permutation, per-expert GEMMs, combine); its
# README's remedy for a CPU-bound step is a larger micro-batch "to reduce kernel launches" or CUDA graphs [REF
# §5], and for dropless layers graphs cover only attn, moe_router and moe_preprocess (the emitted file
# captures none). No per-layer host figure was published ([REF §5] "not found"), so the fixed part is FITTED
# (bench/fit_moe_host.py) on the two public Megatron runs whose layers come out host-paced:
# yanring/Megatron-MoE-ModelZoo issue #7 (Qwen3-30B-A3B on 8 B200, EP8, micro-batch 1, forced balance, "~150
# TFLOPs / GPU", Aug 2025; its nsys summary puts most GPU time in the dispatcher's kernels -- all-to-alls
# waiting on the other ranks' hosts -- and the repository's answer, run_30b.sh @8c19702 the next day, was
# micro-batch 4 on B200) -> 12.16 ms; the ModelZoo's Qwen3-235B-A22B TP4 EP8 PP8 row (256 H100, 16 local
# experts and 1,024 tokens a rank; the README of Mar 2026 names its code: Megatron-LM main 1e057005,
# 2025-05-24) -> 8.61 ms. Stop 22 (lead) added a third public run: NVIDIA/Megatron-LM issue 2762
# (Qwen3-30B-A3B on 32 H100, TP1 EP8 micro-batch 1, forced balance, "around 120 TFLOPS", Dec 2025) -> 15.02
# ms; added after moe4's check priced it 39% too fast with the two-run median (said so in
# docs/notes/stop-22/README.md). The median of the three, 12.11 ms (the B200 run's value; the bisection of the
# three values above, rerun by bench/fit_moe_host.py); the spread (8.6-15.0 ms: three software versions, three
# host CPUs) is this constant's uncertainty. It does not follow the code's date: the lowest value comes from
# the oldest code (May 2025), the highest from Dec 2025 (stop 53 read the commit dates; Megatron-Core's
# changelogs of 0.14-0.17 show opt-in graph scopes and TE-side CPU work, no measured step in the default eager
# path). Forward + backward of one MoE layer, per micro-batch, whatever its token count; the per-expert GEMM
# calls (``expert_gemm_host_floor_s``, three per expert matrix: forward, dgrad, wgrad) on top.
MEGATRON_LAYER_HOST_S = 12.11e-3


def layer_host_s(base_s: float, local_experts: float, per_expert_launches: bool) -> float:
    """Host time to issue one MoE layer's forward and backward for one micro-batch: the
    framework's fixed part ``base_s`` (``MoeExecution.layer_host_s``) and its per-expert GEMM
    calls (two matrices, each forward + two backward GEMMs per local expert)."""
    if base_s <= 0:
        return 0.0
    return base_s + 2 * 3 * expert_gemm_host_floor_s(local_experts, per_expert_launches)


def host_excess_s(gpu_layer_s: float, host_s: float) -> float:
    """What a host-paced layer adds to its GPU time: the host's time beyond it (the layer takes
    the longer of the two; the dropless sync keeps the host from running a layer ahead)."""
    return max(0.0, host_s - gpu_layer_s)


# ---- load imbalance ------------------------------------------------------------------------------
# The busiest expert-parallel rank's routed tokens over the mean, by how the router balances.
# * aux_free (DeepSeek-V3's bias update): Wang et al., "Auxiliary-Loss-Free Load Balancing"
#   (arXiv 2408.15664), Table 2: MaxVio_global 0.04 [REF §3].
# * aux_loss, a strong coefficient (>= 1e-2) and a weak one (< 1e-2): fitted by
#   ``bench/fit_moe_imbalance.py`` on the Megatron-MoE-ModelZoo runs that publish the same layout
#   dropless and with ``--moe-router-force-load-balancing`` (calibration/published_runs_moe.yaml,
#   ``forced_balance`` cases): Mixtral-8x22B, coefficient 1e-2, 445 vs 465 TFLOPS on 128 H100; Qwen3-235B-A22B,
#   coefficient 1e-3, 237/277/320/357 vs 295/335/368/389 TFLOPS at 16k-128k tokens on 256 H100.
#   The factor that makes this cost model's dropless/forced step-time ratio equal the published one:
#   1.061 (Mixtral, one pair); 1.516-1.544 over the four Qwen3 pairs, median 1.532, when it was fitted.
#   Rerun at stop 52 (the model had moved since: 1.552 before that stop's DeepEP share, 1.541 after it,
#   range 1.523-1.547): 1.54. The weak figure agrees with LFB's aux-loss MaxVio_global at the same
#   coefficient (1.52 at 3B), which nothing fitted.
LOAD_FACTOR = {"aux_free": 1.04, "aux_loss_strong": 1.06, "aux_loss_weak": 1.54}
STRONG_AUX_COEFF = 1e-2


def balance_kind(balance: str, aux_coeff: float) -> str:
    """``LOAD_FACTOR``'s key for a router: aux-free, or an auxiliary loss strong or weak (an
    unknown coefficient counts as weak: the slower assumption)."""
    if balance == "aux_free":
        return "aux_free"
    return "aux_loss_strong" if aux_coeff >= STRONG_AUX_COEFF else "aux_loss_weak"


def load_factor(balance: str = "aux_loss", aux_coeff: float = 0.0, capacity_factor: float = 0.0,
                ep: int = 2) -> float:
    """How much more than the mean share of routed tokens the busiest expert-parallel rank
    handles (``LOAD_FACTOR``); 1 without expert parallelism (one rank holds every expert). With a
    capacity factor ``c`` every expert's input is cut to, and padded up to, ``c`` times the mean
    (Megatron's ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``, the
    only capacity mode Megatron-Core can capture in CUDA graphs [REF §5]): exactly ``c``, on every
    rank, whatever the routing."""
    if capacity_factor > 0:
        return capacity_factor
    if ep <= 1:
        return 1.0
    return LOAD_FACTOR[balance_kind(balance, aux_coeff)]


# ---- dispatch ------------------------------------------------------------------------------------
# Bytes per value of an FP8 dispatch with 1x128 FP32 scales: (1 + 4/128) (DeepEP's and HybridEP's
# ``fp8_factor`` counts (1 + 4/128)/2 of BF16) [REF §4]. The combine stays BF16 [DSV3 §3.3].
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0

# The fraction of the link's per-direction bandwidth (``LinkSpec.gb_per_s``) a dispatcher's
# all-to-all reaches, inside the NVLink domain and across nodes [REF §4]:
# * alltoall (NCCL), inside the NVLink domain: 0.75 of the link. That is what nccl-tests alltoall_perf measures with
#   default settings at large messages (out of place, busbw / line rate): 8 GPUs at 8-16 GiB 0.751 on HGX B300,
#   0.755-0.761 on two GB300 trays, 0.731-0.736 on two GB200 trays (oracle-quickstart/oci-gpu-quickstarts,
#   nvidia/{B300,GB300,GB200} READMEs, NCCL 2.27-2.28); 4 H100 at 500 MiB 0.744 (NVIDIA/nccl#2169, NCCL 2.30.4;
#   0.796 with registered buffers, which the frameworks' all_to_all_single does not use); 0.75 is their median.
#   NCCL's maintainer puts the
#   ceiling at about 0.80-0.82 on H100 ("with the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth
#   of 370GB/s", nccl-tests#212). Each call also has a fixed part (``NCCL_A2A_NVLINK_FIXED_S``), set so that
#   SGLang#22583's 8 x H100 table holds at 64 MiB (210 us); its 8 and 16 MiB points then price at 58 and 80 us
#   against 60 and 87 (2 MiB: 41 against 28, NCCL's low-latency protocol). Until stop 54 the fraction was that
#   64 MiB point alone, 58.7 MB / 210 us = 0.62 of 450 GB/s, which put the fixed part into the rate and priced a
#   1 GB dispatch 21% slower than the measured rate. Not measured: H800's and A800's narrower NVLink (no NCCL
#   all-to-all table was found; DeepEP's kernels reach 0.78 of H800's, below), and nccl#2169's report of a 12-15%
#   drop above 512 MiB per rank on H100 (Ring, Simple), which the Blackwell tables do not show.
#   Across nodes one NIC's rate, 48-49 of 50 GB/s (CX7 NDR, nccl-tests#267) = 0.97.
# * deepep (DeepEP V1, H800): 153-158 GB/s, the middle 155.5 of the catalog H800's 200 GB/s per direction
#   (costmodel/files/catalog/clusters.yaml dgx-h800: 400 GB/s bidirectional) = 0.78 (0.7775). DeepEP's table states
#   its figures against "~160 GB/s NVLink maximum bandwidth", an achieved maximum, not the link's rate;
#   stops before 52 took 155.5 / 160 = 0.96 and applied it to the catalog's rate, which put DeepEP at 96% of
#   every NVLink's theoretical rate (432 of H100's 450 GB/s). On the rate's basis, as every other fraction
#   here is taken, 0.78 sits inside the range of B200's own figures (643-735 of 900 GB/s, 0.71-0.82,
#   [REF §4]); across nodes its RDMA
#   "bottleneck bandwidth" is 43, 58 and 51 GB/s at EP16, 32 and 64 on 50 GB/s NICs (legacy.md
#   table): the median, 51 of 50 = 1.02 (its count of bytes is not ours exactly: [REF §7] "DeepEP
#   bandwidth definitions differ"; above 1 only by that).
DISPATCH_LINK_FRACTION = {"alltoall": {"intra": 0.75, "inter": 0.97}, "deepep": {"intra": (153 + 158) / 2 / 200, "inter": 1.02}}
# * deepep over a multi-node NVLink domain (more than DeepEP's 8 NVLink peers: GB200 NVL72's trays of 4):
#   the only published run is Megatron-LM's DeepSeek-V3 GB200 guide (NVIDIA/Megatron-LM at eb0783b6d3,
#   docs/discussions/deepseek-v3-gb200-optimization, the DeepEP step: EP32 over MNNVL through DeepEP PR 218,
#   24 SMs), "about 400 GB/s" dispatch and "about 190 GB/s" combine of NVLink 5's 900 per direction:
#   0.44 and 0.21. Megatron-Core 0.16's own ``TransformerConfig.moe_flex_dispatcher_backend`` says only
#   HybridEP supports the multi-node NVLink case, so the Megatron target does not plan it (planner/plan/targets.py).
DEEPEP_NVL_PEERS = 8
DEEPEP_MNNVL_FRACTION = (400.0 / 900.0, 190.0 / 900.0)        # (dispatch, combine)
# * hybridep (HybridEP, DeepEP's hybrid-ep branch: Megatron's --moe-flex-dispatcher-backend hybridep with
#   --moe-hybridep-num-sms, default 16): the same guide's HybridEP figure (top-8, one direction, GB/s, by the
#   number of SMs -- "CUDA blocks" -- its kernels take), as (dispatch, combine) over the link it ran on:
#   - "mnnvl": GB200 NVL36, EP36, NVLink 5 (900 GB/s);
#   - "node": one DGX H100, EP8, NVLink 4 (450 GB/s): priced for any NVLink domain of one host;
#   - "inter": four DGX H100, the bytes each NIC carries (the figure's "NIC-bus" bandwidth), 400 Gb/s
#     ConnectX-7 (50 GB/s); it sends a token once per destination node, as DeepEP does.
#   Between the SM counts measured, linear; beyond them, the nearest.
HYBRIDEP_GB_PER_S = {
    "mnnvl": (900.0, {4: (213.95, 185.44), 8: (422.78, 386.59), 16: (694.1, 617.62), 32: (714.66, 657.72)}),
    "node": (450.0, {4: (177.76, 191.24), 8: (344.06, 358.93), 12: (349.29, 363.05), 16: (368.9, 368.87)}),
    "inter": (50.0, {2: (24.4, 20.8), 4: (43.4, 42.7), 8: (44.2, 45.0)}),
}
HYBRIDEP_SMS = 16               # Megatron-Core 0.16 TransformerConfig.moe_hybridep_num_sms
DISPATCHERS = tuple(DISPATCH_LINK_FRACTION) + ("hybridep",)
# NCCL's all-to-all inside the NVLink domain: its fixed part per call (the comment above: 36 us, what the 64 MiB
# point spends beyond its transfer at 0.75 of the link), in place of the link's latency, less the collective's
# launch (``comm.COLLECTIVE_LAUNCH_S``, 10 us), which every caller adds (comm imports this module's package-mates,
# so the 10 us is written here; tests/test_moe_terms.py holds the sum to 36 us)
NCCL_A2A_NVLINK_FIXED_S = 26.0 * US


def hybridep_fraction(tier: str, sms: int, combine: bool) -> float:
    """HybridEP's share of the link's bandwidth on ``tier`` ("mnnvl", "node" or "inter") with its
    kernels on ``sms`` SMs, dispatch or ``combine`` (``HYBRIDEP_GB_PER_S``)."""
    link, table = HYBRIDEP_GB_PER_S[tier]
    pts = sorted((n, gb[1 if combine else 0]) for n, gb in table.items())
    if sms <= pts[0][0]:
        return pts[0][1] / link
    for (n0, g0), (n1, g1) in zip(pts, pts[1:]):
        if sms <= n1:
            return (g0 + (g1 - g0) * (sms - n0) / (n1 - n0)) / link
    return pts[-1][1] / link


def dispatch_link_fraction(execution: "MoeExecution", tier: str, combine: bool = False, mnnvl: bool = False,
                           peers: int = 0) -> float:
    """The fraction of the ``tier`` ("intra" or "inter") link's per-direction bandwidth the
    execution's dispatcher reaches for a dispatch or its ``combine``: ``mnnvl`` when the NVLink
    domain spans hosts (GB200 NVL72), ``peers`` the EP ranks inside it (the comments above)."""
    d = execution.dispatcher
    if d == "hybridep":
        t = "inter" if tier == "inter" else ("mnnvl" if mnnvl else "node")
        return hybridep_fraction(t, execution.hybridep_sms, combine)
    if d == "deepep" and tier == "intra" and mnnvl and peers > DEEPEP_NVL_PEERS:
        return DEEPEP_MNNVL_FRACTION[1 if combine else 0]
    return DISPATCH_LINK_FRACTION[d][tier]


def node_deduplicating(dispatcher: str) -> bool:
    """Whether the dispatcher sends a token once per destination node and forwards it over NVLink
    there (DeepEP's internode kernels, HybridEP's), rather than once per destination rank."""
    return dispatcher in ("deepep", "hybridep")


# ---- DeepEP's SMs while it overlaps compute ----------------------------------------------------------
# DeepEP's dispatch and combine kernels run on a fixed number of SMs, taken from the compute running
# beside them. Megatron's default is 20 (Megatron-Core 0.16 ``TransformerConfig.moe_deepep_num_sms =
# 20``, ``--moe-deepep-num-sms``; Megatron-LM @d98e8a64 keeps "None -> 20" for the flex dispatcher's
# DeepEP backend in token_dispatcher.py), the figure DeepSeek-V3 reports as enough to saturate IB and
# NVLink ("20 out of the 132 SMs", Sec. 3.2.2).
DEEPEP_SMS = 20
# SMs per GPU, by the catalog's GPU name prefix: GH100 in its SXM form has 132 (NVIDIA H100 Tensor Core
# GPU Architecture whitepaper; DeepSeek-V3 Sec. 3.2.2 for the H800; the H200 is the same GH100 SXM
# part). A GPU not listed keeps the cluster's generic overlap slowdown (``specs.OVERLAP_SLOWDOWN``).
GPU_SMS = {"H100-SXM": 132, "H800-SXM": 132, "H200-SXM": 132}


def comm_sm_share(gpu_name: str, sms: int) -> float:
    """The fraction of the GPU's SMs a dispatcher's ``sms`` kernels take; 0 where the GPU's SM count
    is not in ``GPU_SMS`` (the caller then prices the generic overlap slowdown)."""
    for prefix, total in GPU_SMS.items():
        if gpu_name.startswith(prefix):
            return min(1.0, max(sms, 0) / total)
    return 0.0


def sm_share_overlap_s(comm_s: float, compute_s: float, share: float) -> float:
    """What communication of ``comm_s`` on a ``share`` of the SMs adds to ``compute_s`` of compute it
    overlaps: while it runs the compute has ``1 - share`` of the SMs, so the pair takes
    ``max(comm_s, compute_s + share x comm_s)`` (the compute's SM-seconds conserved), which is
    ``compute_s`` plus ``max(comm_s - compute_s, share x comm_s)``."""
    if comm_s <= 0:
        return 0.0
    return max(comm_s - compute_s, share * comm_s)


# DeepEP's internode kernels are GPU-initiated RDMA (NVSHMEM; its README: tested on InfiniBand, "theoretically
# compatible" with RoCE; IBGDA): an inter-node link that is an RDMA fabric (``specs.LinkSpec.rdma``). On AWS
# EFA without IBGDA NCCL's all-to-all beat DeepEP (awslabs/awsome-distributed-ai PR #1144, [REF §4]).
def deepep_fabric_problem(inter: "LinkSpec") -> str:
    """Why DeepEP cannot run across nodes over the inter-node link ``inter`` ("" if it can)."""
    if inter.rdma:
        return ""
    return (f"DeepEP across nodes needs GPU-initiated RDMA (NVSHMEM over InfiniBand or RoCE, DeepEP's README), "
            f"and the inter-node link {inter.name!r} is not an RDMA fabric (ib-*, cx7*, cx8*, roce*)")


def multi_node_nvlink(nvlink_gpus: int, host: int) -> bool:
    """Whether an NVLink domain of ``nvlink_gpus`` GPUs spans several hosts of ``host`` GPUs (GB200 NVL72's
    trays of 4): where the dispatchers run at their multi-node NVLink rates (``dispatch_link_fraction``) and
    where Megatron-Core runs HybridEP only (``dispatcher_fabric_problem``). ``host`` 0: unknown, taken as no."""
    return 0 < host < nvlink_gpus


def dispatcher_fabric_problem(dispatcher: str, ep: int, nvlink_gpus: int, host: int, rdma: bool) -> tuple[str, str]:
    """Why Megatron-Core cannot run ``dispatcher`` for an EP group of ``ep`` ranks on a cluster whose
    NVLink domain holds ``nvlink_gpus`` GPUs in hosts of ``host`` (a domain of several hosts: multi-node
    NVLink, GB200 NVL72) and whose inter-node link is (``rdma``) or is not an RDMA fabric, and what to
    plan instead: ("", "") when it can. DeepEP and HybridEP leave the domain by GPU-initiated RDMA
    (``deepep_fabric_problem``); Megatron-Core 0.16 runs multi-node NVLink with HybridEP only
    (``TransformerConfig.moe_flex_dispatcher_backend``: "Currently only 'hybridep' backend supports the
    MNNVL case"). The one rule for the search (``planner.search.target_space.moe_exec_choices``) and the
    Megatron file (``emitters.megatron.moe_notes``)."""
    if dispatcher == "deepep" and multi_node_nvlink(nvlink_gpus, host) and ep > host:
        return ("DeepEP does not support an NVLink domain of more than 8 GPUs (Megatron-LM's DeepSeek-V3 GB200 guide) "
                "and Megatron-Core 0.16 runs multi-node NVLink with its HybridEP backend only "
                "(TransformerConfig.moe_flex_dispatcher_backend)", "plan --moe-dispatcher hybridep on this cluster")
    if dispatcher in ("deepep", "hybridep") and ep > nvlink_gpus and not rdma:
        name = "DeepEP" if dispatcher == "deepep" else "HybridEP"
        return (f"{name} across nodes needs GPU-initiated RDMA (NVSHMEM over InfiniBand or RoCE) and the inter-node "
                "link is not an RDMA fabric", "plan --moe-dispatcher alltoall on this cluster")
    return "", ""


@dataclass(frozen=True)
class MoeExecution:
    """How a framework runs MoE layers, as its launch file sets them."""

    dispatcher: str = "alltoall"     # Megatron --moe-token-dispatcher-type alltoall | flex + DeepEP
    permute_fusion: bool = False     # Megatron --moe-permute-fusion (TE fused permute/unpermute)
    router_fusion: bool = False      # Megatron --moe-router-fusion
    fp8_dispatch: bool = False       # FP8 tokens in the dispatch (DeepEP / HybridEP under FP8 training)
    capacity_factor: float = 0.0     # Megatron --moe-expert-capacity-factor (with padding); 0: dropless
    forced_balance: bool = False     # Megatron --moe-router-force-load-balancing (benchmarks only)
    per_expert_gemms: bool = False   # one GEMM call per local expert (Megatron's TEGroupedMLP: --moe-grouped-gemm
    #                                  without --moe-use-legacy-grouped-gemm); False: one grouped kernel
    layer_host_s: float = 0.0        # host time to issue one MoE layer fwd+bwd (eager); 0: not priced
    deepep_sms: int = DEEPEP_SMS     # Megatron --moe-deepep-num-sms: SMs DeepEP's kernels take while overlapped
    hybridep_sms: int = HYBRIDEP_SMS  # Megatron --moe-hybridep-num-sms: SMs HybridEP's kernels take
    delay_wgrad: bool = True         # weight gradients scheduled apart from the input gradients where the EP
    #                                  all-to-alls overlap compute: Megatron --delay-wgrad-compute (its emitter
    #                                  writes it with the overlap), DualPipe's split backward
    #                                  (``ep_backward_window_s``)
    fused_grouped_mlp: bool = False  # Transformer Engine's fused grouped MLP (``fused_mlp_elementwise``): the
    #                                  routed experts' SwiGLU and its MXFP8 casts in the GEMMs' epilogues
    fp8_experts: str = ""            # "mxfp8": a BF16 model whose routed experts' grouped GEMMs run torchao's
    #                                  dynamic MXFP8 (torchtitan's MXFP8GroupedExpertsConverter; ``fp8.
    #                                  torchao_mxfp8_experts``), Blackwell only; "": the workload's dtype

    @property
    def dispatcher_sms(self) -> int:
        """The SMs the dispatcher's own kernels hold (DeepEP's or HybridEP's); 0 for NCCL's all-to-all,
        which the cluster's generic overlap slowdown prices."""
        return {"deepep": self.deepep_sms, "hybridep": self.hybridep_sms}.get(self.dispatcher, 0)

    @property
    def dropless(self) -> bool:
        """No capacity factor: the per-layer token-count sync, nothing dropped."""
        return self.capacity_factor <= 0

    def __post_init__(self) -> None:
        if self.dispatcher not in DISPATCHERS:
            raise ValueError(f"moe dispatcher {self.dispatcher!r} is not one of {', '.join(DISPATCHERS)}")
        if self.fp8_experts not in ("", "mxfp8"):
            raise ValueError(f"moe fp8_experts {self.fp8_experts!r}: only \"mxfp8\" (torchao's MXFP8 grouped GEMMs) "
                             "or \"\"")


DEFAULT_EXECUTION = MoeExecution()


# ---- the fused grouped MLP ------------------------------------------------------------------------
# Transformer Engine's fused grouped MLP for MXFP8 on SM100+ (TransformerEngine PR #2622, Jan 2026, "an
# experimental fused operation for a grouped MLP block, using a CuTe DSL kernel that computes an MXFP8
# grouped GEMM and SwiGLU"; PR #2769, Mar 2026, "GEMM + Swiglu fused Grouped MLP for MXFP8", whose
# ``ops/fused/backward_grouped_mlp.py`` runs FC2's data gradient with the SwiGLU backward in its epilogue and
# writes FP8). Megatron-Core selects it with ``use_transformer_engine_op_fuser`` and ``moe_mlp_glu_interleave_size``
# 32 under ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` (NVIDIA-NeMo/RL PR #4194 names the three; Megatron-LM's
# examples/moe_recipes at 9c5258f109 set them in their full-CUDA-graph Qwen3 rows only). The same op in cuDNN,
# as torchtitan PR #4257 counts its launches: forward FC1 + SwiGLU + the quantization of the hidden
# activation, then FC2; backward FC2's data gradient + the SwiGLU backward + its quantization, FC1's data
# gradient, and the two weight gradients. So the fusion removes, per routed token copy: the SwiGLU's own
# forward and backward passes (what the layer's elementwise rule charges for the expert intermediates it
# stores, ``layers.ELEMENTWISE_TRAFFIC_PER_STORED_BYTE`` per stored byte), and two of the expert GEMMs' MXFP8
# casts: FC2's input forward and FC1's output gradient backward. The stored activations are unchanged (FC1's
# epilogue still writes the pre-activation for the backward), as are the casts of FC1's input and FC2's
# output gradient. It runs only where TE selects it: MXFP8 on Blackwell; elsewhere the flag prices nothing.


def fused_mlp_elementwise(m: float, fe: float, stored_bytes_per_copy: float, elementwise_per_stored: float,
                          fc1_out: float) -> tuple[float, float, float]:
    """What the fused grouped MLP removes for ``m`` routed token copies on a rank, each with expert
    intermediate width ``fe`` (FC2's input) and ``fc1_out`` FC1 outputs (SwiGLU: 2 x ``fe``): (elementwise
    bytes, forward cast values, backward cast values), the bytes at the layer's elementwise rule
    (``elementwise_per_stored`` per stored byte, ``stored_bytes_per_copy`` of intermediates stored per copy),
    the cast values as ``fp8.Fp8Recipe.gemm_cast_values`` counts them (FC2's input, FC1's output gradient)."""
    return elementwise_per_stored * m * stored_bytes_per_copy, m * fe, m * fc1_out


# ---- what the EP overlap hides the backward all-to-alls behind --------------------------------------
# Megatron's combined 1F1B step (``--overlap-moe-expert-parallel-comm``; Megatron-Core core_v0.16.0
# models/common/model_chunk_schedule_plan.py, ``TransformerLayerSchedulePlan.run``) runs, per layer,
# the backward micro-batch's combine beside the forward one's attention, the forward dispatch beside
# the backward expert MLP, the backward dispatch beside the forward expert MLP, the forward combine
# beside the backward attention. The backward dispatch is issued after ``mlp.backward``: without
# ``--delay-wgrad-compute`` that call computes the experts' weight gradients too, so the backward
# dispatch waits for them and cannot run beside them; with it they are deferred to ``backward_dw``,
# issued after the backward dispatch starts, which then runs beside them and the forward MLP. The
# Megatron-MoE-ModelZoo's overlap recipe writes both flags (sbatch_benchmarking.sh, A2A_OVERLAP=1:
# "--delay-wgrad-compute --overlap-moe-expert-parallel-comm"), so the validated overlap run
# (published_runs_moe.yaml zoo-qwen3-235b-h100-256gpu-tp2-ep32-pp8-etp1-a2a-overlap) priced the
# backward all-to-alls beside a whole layer forward's compute; without the flag the window loses the
# experts' weight-gradient GEMMs, as long as their forward GEMMs (the backward's two GEMMs each as
# long as the forward's: ``costmodel.stage_terms``).


def ep_backward_window_s(layer_fwd_s: float, expert_gemm_fwd_s: float, delay_wgrad: bool) -> float:
    """The compute the backward pass's EP all-to-alls of one layer overlap under the EP overlap: the
    layer's forward compute, less its experts' weight-gradient GEMMs where they are not delayed."""
    return layer_fwd_s if delay_wgrad else max(0.0, layer_fwd_s - expert_gemm_fwd_s)


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


def dispatch_time_s(sent_bytes: float, top_k: int, ep: int, ep_per_node: int, intra: "LinkSpec", inter: "LinkSpec",
                    execution: MoeExecution, groups: int = 0, topk_groups: int = 0, load: float = 1.0,
                    combine: bool = False, mnnvl: bool = False) -> float:
    """One dispatch (or ``combine``) all-to-all among ``ep`` ranks, ``ep_per_node`` of them in each
    NVLink domain (``mnnvl``: a domain of several hosts, GB200 NVL72), each rank sending
    ``sent_bytes`` (``dispatch_bytes`` at the mean share: its ``top_k`` copies of every token). The
    share bound for the other ranks of its domain moves at the dispatcher's NVLink fraction of
    ``intra`` (``dispatch_link_fraction``); across nodes the alltoall dispatcher sends every copy
    bound for another node straight to its expert's rank, DeepEP and HybridEP one per destination
    node to the GPU of the same local index, which forwards it over NVLink (``remote_node_copies``,
    at most ``node_limit`` nodes). The busiest rank receives ``load`` times the mean
    (``load_factor``): on every tier it receives from directly, so not on the deduplicating
    dispatchers' network tier, whose receiving GPU is set by the sender's index, not by the expert.
    The tiers run at once and the slower sets the time, plus one latency of each tier used."""
    if ep <= 1 or sent_bytes <= 0:
        return 0.0
    k_local = max(1, min(ep, ep_per_node))
    bw_intra = dispatch_link_fraction(execution, "intra", combine, mnnvl, k_local) * intra.bandwidth_bytes_per_s
    nodes = max(1, ep // k_local)
    t_intra = (k_local - 1) / ep * sent_bytes * load / bw_intra if k_local > 1 else 0.0
    t_inter = 0.0
    if nodes > 1:
        if node_deduplicating(execution.dispatcher):
            inter_bytes = sent_bytes / top_k * remote_node_copies(top_k, nodes, node_limit(groups, topk_groups, nodes))
            if k_local > 1:
                t_intra = (k_local - 1) / k_local * sent_bytes * load / bw_intra
        else:
            inter_bytes = (ep - k_local) / ep * sent_bytes * load
        t_inter = inter_bytes / (dispatch_link_fraction(execution, "inter", combine) * inter.bandwidth_bytes_per_s)
    lat_intra = NCCL_A2A_NVLINK_FIXED_S if execution.dispatcher == "alltoall" else intra.latency_s
    lat = (lat_intra if k_local > 1 else 0.0) + (inter.latency_s if nodes > 1 else 0.0)
    return max(t_intra, t_inter) + lat


# ---- the gather dispatcher (serving engines' default) ------------------------------------------------
# vLLM's ``--enable-expert-parallel`` without ``VLLM_ALL2ALL_BACKEND`` runs the
# ``allgather_reducescatter`` backend (its default in vllm/envs.py, 2025-2026): every rank of the
# data-parallel group all-gathers the others' tokens before the experts and reduce-scatters the partial
# outputs after them. SGLang without ``--moe-a2a-backend`` (``none``, the default) gathers and
# all-reduces instead of an all-to-all (its expert-parallelism docs, [serving-and-hardware §3.2]).
# Megatron's ``--moe-token-dispatcher-type allgather`` is the same exchange. Neither serving file sets
# an all-to-all backend (DeepEP, pplx), so serving prices this one.
GATHER_DISPATCHER = "allgather"


def gather_dispatch_s(token_bytes: float, lay: "GroupLayout", net: "Network") -> tuple[float, ...]:
    """The collectives of one MoE layer's token exchange by the gather dispatcher among the ``lay.n``
    ranks that hold different tokens, each with ``token_bytes`` of its own: the gathered tensor
    (``lay.n x token_bytes``) all-gathered before the experts and reduce-scattered after them, as
    their transfer times (the caller adds each one's launch, ``comm.launched``; () for one rank).
    Every rank receives every token, routed to it or not: the bytes grow with the group, not with
    ``top_k``, and the busiest rank receives no more than the others (imbalance shows in its expert
    GEMMs only)."""
    if lay.n <= 1 or token_bytes <= 0:
        return ()
    gathered = lay.n * token_bytes
    return net.all_gather(gathered, lay), net.reduce_scatter(gathered, lay)


def alignment_tokens(tokens_per_expert: float, align: int) -> float:
    """Tokens per expert after padding to the kernel's alignment (FP8 needs M in multiples of 16,
    MXFP8 of 32 [REF §1])."""
    return math.ceil(tokens_per_expert / align) * align if align > 1 else tokens_per_expert
