"""Communication: where each parallel group's ranks sit, and how long its collectives take.

Placement. Ranks are laid out by the mesh order (outer -> inner, default ``pp, dp, cp, tp``):
the innermost dimension has consecutive ranks. A group of dimension ``d`` has ``n`` members
at rank stride ``stride = product of the degrees inside d``; with ``G`` GPUs per NVLink domain
(``NodeGroup.nvlink_gpus``: the host on an 8-GPU HGX board, 72 GPUs over 18 hosts on an NVL72
rack), ``k`` members share a domain: ``k = n`` if ``stride * n <= G``, ``1`` if ``stride >= G``,
else the largest divisor of ``n`` not above ``G // stride`` (``G // stride`` itself when both
are powers of two; a domain of 72 holds 4 groups of 16 and 8 GPUs of other groups, which the
launcher places so that no group straddles two domains). That is what decides which groups
cross the domain boundary, the "intra" (NVLink) and "inter" (network) tiers below.

Cost (alpha-beta, hierarchical, per GPU link; Thakur et al., "Optimization of Collective
Communication Operations in MPICH", 2005, for the ring terms; NCCL's intra-node then
inter-node structure for the two tiers). For ``S`` bytes per rank, ``m = n / k`` nodes:

* all-reduce:  max(2(k-1)/k * S / B_intra, 2(m-1)/m * (S/k') / B_inter) + latency terms
  (reduce-scatter inside the node, all-reduce of the 1/k' shard across nodes, all-gather back),
  ``k' = min(k, RING_NICS)``: the NICs of a domain a collective keeps busy (below);
* all-gather / reduce-scatter (S = the full output): half of that;
* all-to-all: (k-1)/n * S over the intra link and (n-k)/n * S over the inter link, in parallel;
* point-to-point: S / B + latency; inside one NVLink domain ``B`` is also capped by the channels
  NCCL gives one send/recv (``nvlink_p2p_channels``, below).

Direct meshes (``LinkSpec.mesh_peers``). Without an NVSwitch (an HGX 4-GPU board: each GPU's 18
NVLink 4 links go 6 to each of its 3 peers) a pair of GPUs shares only its own links: the intra
tier's ``B_intra`` for a group of ``k`` members of the domain is ``min(k - 1, N) / N`` of the
link's rate (``LinkSpec.mesh_share``): a third for a pair (TP 2, one send/recv), all of it for a
ring over the four GPUs, whose channels NCCL lays over distinct links.

Tiers at once (``PIPELINED_TIERS``). NCCL pipelines a collective across domains: its ring (or
tree) moves each chunk over NVLink and over the network at the same time, so the transfer takes
the slower tier's time, not the sum of both (the sum, which this module priced until stop 40,
halves the bus bandwidth of a large all-reduce across 8-GPU nodes). Measured, nccl-tests
all_reduce_perf bus bandwidth at large messages (NVIDIA GTC24 session S62129, slide "Collective
Communication Bandwidth", reproduced in stas00/ml-engineering at 744d01e1,
network/benchmarks/images/all-reduce-multi-node-bandwidth.png): DGX A100 with 8x 200 Gb/s 192
GB/s, DGX H100 with 8x 400 Gb/s 380 GB/s -- the network tier's 8 x 22.5 and 8 x 45 GB/s here
(180, 360), where the sum gave 108 and 192. Every node count from 4 to 1,024 converges to
340-380 GB/s at 16 GiB in both sweeps below.

All-reduce's step across domains (``ALLREDUCE_HOP_S``). Two published nccl-tests sweeps of
all_reduce_perf on H100 with 8x 400 Gb/s nodes show the collective's fixed time growing with the
nodes far beyond NCCL's tuner constants (5-14 us per network hop): GTC24 S62129's NVLSTree plot,
32 to 8,192 GPUs (ml-engineering network/images/nccl-all-reduce-scan-nvlstree.png), and the
4-to-512-node scan of arXiv:2411.13055 (ml-engineering network/images/nccl-all-reduce-scan.png),
read off the plots by this project (``tests/test_allreduce_scale.py`` holds the 44 points from
8 MiB to 16 GiB at 32 and 8,192 GPUs, 4 and 512 nodes). Fitting ``t = alpha + 2(n-1)/n S /
busbw`` to them gives alpha near 0.2 ms at 4 nodes and near 1 ms at 512-1,024 nodes, at every size
from 8 MiB to 4 GiB: about ``2 log2(nodes)`` tree steps of 45-50 us. So an all-reduce's step across
domains is priced at 45 us (the grid's best: mean |log error| of the bus bandwidth 0.075 over the
44 points, against 0.47 with the sum of tiers and the link's 5 us), or the link's latency where
that is larger; its steps stay the tree's ``2 log2(m)`` or the ring's ``2(m-1)``, the fewer. The
figure includes the pipeline's fill at mid sizes. Small messages run on NCCL's LL and LL128
protocols, whose steps are shorter: the same plots at 1, 2 and 4 MiB (12 points, read less
precisely) give about 20 us per step (``ALLREDUCE_SMALL_HOP_S``, the best of a 5 us grid: mean |log
error| 0.16, against 0.45 at 45 us), so a step costs 20 us up to 1 MiB (``SMALL_HOP_BYTES``) and 45
us from 8 MiB (``LARGE_HOP_BYTES``), log-linear in the size between (``small_hop_fraction``). A
bucketed reduction's per-bucket fixed time (``latency_s``) is the large message's; the step's tiny
reductions (a loss, a norm) take the small one (``latency_s(small=True)``). All-gather and
reduce-scatter keep the link's latency per ring step (no sweep of theirs at scale was found; NCCL's
own ring constants and two user reports, NVIDIA/nccl#1218 and #1229, put it at or above this). A
measured profile (``collective_table``) replaces these rules for the tiers it measured; a tier it
lacks (the network, in a profile of one node) keeps them, not a latency of zero. A measured network
tier holds the fixed time of the domains it was measured across (two nodes, say); beyond them the
steps its ring or tree adds are priced by these rules (``Network._growth_s``).

``B`` is the link's per-GPU, per-direction bandwidth times its collective efficiency (NCCL bus
bandwidth / link bandwidth), or, where the profiler measured it, the bus bandwidth
interpolated from ``ClusterSpec.collective_table`` at that message size. Bus bandwidth is the
nccl-tests convention, so ``time = S * factor / busbw`` with the factors above.

NICs per domain (``RING_NICS``). Each NCCL channel's ring leaves a domain through one NIC, so a
collective across domains drives as many NICs per domain as it has channels, not every NIC of a
72-GPU rack: the inter tier moves ``S / min(k, RING_NICS)`` per busy NIC. On an 8-GPU HGX node
(``k <= 8``) nothing changes. On GB200 NVL72 racks the measurements agree with 8 and not with 72:
coreweave/nccl-tests pull request #48 (2025-04-21, NCCL all_reduce_perf, float sum, 20 racks =
1,440 GB200, one ConnectX-7 400 Gb/s per GPU) took 7,108 / 9,806 / 14,980 / 24,782 us for
0.5 / 1 / 2 / 4 GiB, against 1,807 / 3,109 / 5,589 / 10,094 us inside one rack (pull request
#43, 72 GPUs). With every NIC of the rack busy this model gives 2.25 / 4.04 / 7.61 / 14.75 ms on
20 racks (1.7-3.2x too fast, mean |log error| 0.81); with a cap of 8, 4.77 / 9.08 / 17.69 /
34.9 ms (0.25) when the tiers' times were summed. The error is flat from 7 to 11 NICs (0.24-0.25; 16:
0.37, 4: 0.50): 8 is taken,
the cap NCCL's per-communicator configuration sets where a job states it -- MLPerf Training
v5.1's NeMo recipes (NVIDIA/benchmarks/llama31_8b/implementations/nemo/conf/nccl/
custom_communicator_cta.yaml, mlcommons/training_results_v5.1 at 441d65f444) give the data-
parallel, tensor-parallel and dp x cp communicators at most 8 CTAs (channels). Inside one rack
nothing moves (1.90 / 3.37 / 6.31 / 12.19 ms against the measured 1.81 / 3.11 / 5.59 / 10.09).
The cap was chosen on the nccl-tests points; the validation runs it changes (MLPerf Llama 3.1 8B
on 512-1,024 GB200/GB300) had been seen with caps of 8 and 16 before the choice. With the tiers at
once (stop 40) the cap of 8 gives 3.6 / 6.5 / 12.1 / 23.5 ms (mean |log error| 0.34; a cap of 6
would give 0.22, but the misfit is in the shape: the 20 racks' times are about 4.8 ms plus 430 GB/s
of bus bandwidth, a fixed cost no rule here prices -- NCCL's ring over all 1,440 ranks would be one,
2 x 1,420 NVLink steps of 1.6 us -- so the cap stays MLPerf's 8 and the gap is left visible).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from functools import lru_cache
from typing import Callable, NamedTuple

from .attention import architecture
from .specs import MESH_AXES, ClusterSpec, LinkSpec
from .units import US

# NCCL's fixed cost per collective (and per point-to-point send) on top of the link latency:
# kernel launch and the protocol's handshake; nccl-tests report 10-20 us for an 8-byte
# all-reduce on A100/H100 NVSwitch. The value was chosen on a grid inside that range against
# calibration/published_inference.yaml (VALIDATION_INFERENCE.md); training uses the same value.
COLLECTIVE_LAUNCH_S = 10.0 * US


# the NICs of an NVLink domain one collective keeps busy across domains: one per NCCL channel
# (module docstring: coreweave/nccl-tests #43 and #48 on GB200 NVL72; MLPerf's 8-CTA caps)
RING_NICS = 8

# PIPELINED_TIERS: a collective across domains runs its NVLink and network parts at once (module
# docstring), so it takes the slower part's transfer time, not the sum of both.

# the fixed time of one step of an all-reduce across domains (module docstring: nccl-tests sweeps;
# tests/test_allreduce_scale.py): ALLREDUCE_HOP_S from LARGE_HOP_BYTES up, ALLREDUCE_SMALL_HOP_S up to
# SMALL_HOP_BYTES (NCCL's LL and LL128 protocols), log-linear in the size between
ALLREDUCE_HOP_S = 45.0 * US
ALLREDUCE_SMALL_HOP_S = 20.0 * US
SMALL_HOP_BYTES = 2 ** 20
LARGE_HOP_BYTES = 8 * 2 ** 20
_HOP_SPAN = math.log(LARGE_HOP_BYTES / SMALL_HOP_BYTES)


def allreduce_inter_steps(m: int) -> float:
    """An all-reduce's steps across ``m`` domains: the ring's ``2(m-1)`` or the tree's
    ``2 log2(m)``, the fewer (NCCL's tuner picks the faster; ``Network._coefficients``)."""
    return min(2 * (m - 1), 2 * math.log2(m)) if m > 1 else 0.0


def small_hop_fraction(size: float) -> float:
    """How much of the step's saving (ALLREDUCE_HOP_S - ALLREDUCE_SMALL_HOP_S) a ``size``-byte
    all-reduce takes: 1 up to SMALL_HOP_BYTES, 0 from LARGE_HOP_BYTES, log-linear between."""
    if size >= LARGE_HOP_BYTES:
        return 0.0
    if size <= SMALL_HOP_BYTES:
        return 1.0
    return math.log(LARGE_HOP_BYTES / size) / _HOP_SPAN


def launched(each_s: float, count: float = 1) -> float:
    """``count`` collectives of ``each_s`` seconds of transfer each, every one with its fixed
    launch cost (``COLLECTIVE_LAUNCH_S``). The one rule for serving and training: callers add
    it only for groups of more than one GPU."""
    return count * (each_s + COLLECTIVE_LAUNCH_S)

DEFAULT_ORDER = MESH_AXES


class GroupLayout(NamedTuple):
    """A group of ``n`` members, ``k`` of them per node (a tuple: cheap to build and to hash,
    as layer costs are memoized on layouts)."""

    n: int           # members
    k: int           # members per node (per NVLink domain: NodeGroup.nvlink_gpus)

    @property
    def nodes(self) -> int:
        return max(1, self.n // self.k)

    @property
    def crosses_nodes(self) -> bool:
        return self.n > self.k


def axis_stride(degrees: dict[str, int], order: tuple[str, ...], dim: str) -> int:
    """Rank distance between neighbours of a ``dim`` group: the product of the degrees of the
    dimensions inside it in the mesh ``order`` (outermost first)."""
    stride = 1
    for d in order[order.index(dim) + 1:]:
        stride *= degrees.get(d, 1)
    return stride


def group_layout(degrees: dict[str, int], order: tuple[str, ...], dim: str, gpus_per_node: int,
                 inner_stride: int = 1) -> GroupLayout:
    """Layout of the ``dim`` group; ``inner_stride`` multiplies the stride (EP inside dp)."""
    n = degrees.get(dim, 1)
    if n <= 1:
        return GroupLayout(1, 1)
    return layout_for(n, inner_stride * axis_stride(degrees, order, dim), gpus_per_node)


def crosses_nodes(degrees: dict[str, int], order: tuple[str, ...], dim: str, gpus_per_node: int) -> bool:
    """Does the ``dim`` group span more than one node, so that some neighbours talk across the
    network? The one rule for pipeline neighbours in training (``training.stage_crosses``), in the
    solver's tables, and in serving."""
    return group_layout(degrees, order, dim, gpus_per_node).crosses_nodes


@lru_cache(maxsize=4096)
def layout_for(n: int, stride: int, gpus_per_node: int) -> GroupLayout:
    if n <= 1:
        return GroupLayout(1, 1)
    if stride * n <= gpus_per_node:
        return GroupLayout(n, n)
    if stride >= gpus_per_node:
        return GroupLayout(n, 1)
    k = max(1, gpus_per_node // stride)
    while n % k:          # whole groups of k per domain (a power-of-two k already divides n)
        k -= 1
    return GroupLayout(n, k)


def _measured_busbw(cluster: ClusterSpec, tier: str, op: str, n: int, size: float) -> float | None:
    """Bus bandwidth measured for this tier and op at the group size nearest ``n`` (log scale),
    interpolated in log message size. Measured times include latency, so callers add none."""
    cand = [r for r in cluster.collective_table if r[0] == tier and r[1] == op] or \
        [r for r in cluster.collective_table if r[0] == tier]
    if not cand:
        return None
    best_g = min({r[2] for r in cand}, key=lambda g: (abs(math.log(max(g, 1)) - math.log(max(n, 1))), g))
    rows = [(b, bw) for _, _, g, b, bw in cand if g == best_g]
    rows.sort()
    sizes = [b for b, _ in rows]
    if size <= sizes[0]:
        return rows[0][1]
    if size >= sizes[-1]:
        return rows[-1][1]
    i = bisect.bisect_right(sizes, size)
    (s0, b0), (s1, b1) = rows[i - 1], rows[i]
    w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return b0 + w * (b1 - b0)


# ---- NCCL send/recv inside one NVLink domain ----------------------------------------------
# A pipeline hand-off or a context-parallel ring step is one NCCL send/recv pair, and NCCL runs it
# on few channels (one CTA, one SM each), not at the link's collective bus bandwidth. From NCCL's
# source (NVIDIA/nccl, src/graph/paths.cc ncclTopoComputeP2pChannels and src/enqueue.cc
# addP2pToPlan, v2.18-v2.30; read for this project, /work/research/nccl_p2p.md outside the
# repository): a communicator has ``P2P_CHANNELS`` send/recv channels; one operation starts on
# that many divided by the communicator's ranks (the per-peer count, 2 x the NVLinks rounded up
# to a power of two -- 32 on A100, H100 and B200 NVSwitch boards -- halved until it times the
# ranks fits), and doubles its channels only while each channel's part exceeds 32 steps of the
# 512 KiB NVLink chunk (NCCL_P2P_NVL_CHUNKSIZE), i.e. 16 MiB, up to the per-peer count. So a
# pipeline group of 8 on one board moves a 28 MB activation on 4 channels.
#
# Per-channel bandwidth (``P2P_CHANNEL_BYTES_PER_S``): A100, 12.8 GB/s, the middle of what
# nccl-tests' sendrecv_perf gives on an 8-GPU A100 NVLink board (li-plus/playground cuda/nccl.md:
# 110.8 GB/s at 128 MB on 8 channels by the rule above, 13.9 per channel; 188.6 GB/s at 256 MB on
# 16, 11.8). H100, 18.4 GB/s: nccl-tests' sendrecv_perf between 2 H100 SXM of one AWS p5.48xlarge
# node (Hugging Face's Smol Training Playbook, Infrastructure chapter,
# huggingface.co/spaces/HuggingFaceTB/smol-training-playbook, read through its GitHub copy
# isLinXu/smol-training-playbook app/src/content/assets/data/nccl_sendrecv_p2p_comparison.csv):
# 294.6 GB/s at 256 MB on 16 channels by the rule above, the same 16 MiB part per channel as the
# A100's two points (284.8 at 128 MB, 17.8 per channel; 353.2 at 512 MB, where the rule doubles to
# 32 channels and the NVLink path's own ~365 GB/s caps it). So per-channel bandwidth does not follow
# NCCL's per-link NVLink constants (src/graph/topo.h: SM80 20.0, SM90 20.6 GB/s: 1.03x; measured
# 1.44x at the same part). No figure was found for Blackwell (whose per-link constant, SM100 40.1,
# doubles Hopper's): priced at Hopper's measured figure, an assumption that does not credit
# NVLink 5 with a faster channel nobody measured. ``P2P_CHANNELS`` = 32: the communicator's channel
# count, a power of two of the collective channels, taken as 32 (NCCL's MAXCHANNELS before 2.19;
# an assumption for later ones; a GB300 log of NCCL 2.29 prints "32 p2p channels, 32 p2p channels
# per peer"). Checked against what nobody fitted: the Zero Bubble paper's profiled hand-off time on
# one 8-A100 board (arXiv 2401.10241 Appendix D Table 9, T_comm: 0.601 ms for 28.3 MB, 0.527 ms for
# 25.2 MB; this rule gives 0.56 and 0.50 ms, tests/test_comm_p2p.py).
# A communicator across domains keeps the network's rule (its NVLink hops use small network-sized
# parts on many channels; the hand-off is priced at the inter tier, as before). A measured
# profile's send/recv bandwidth replaces all of this. Not priced: a job's own CTA caps
# (NCCL's per-communicator max_ctas, which MLPerf's NeMo recipes set).
P2P_CHANNELS = 32
P2P_NVL_STEP = 512 * 1024
P2P_SPLIT_BYTES = 32 * P2P_NVL_STEP
P2P_MIN_PART = P2P_NVL_STEP // 8
# by the kernel tables' architecture (costmodel.attention.architecture)
_H100_P2P_CHANNEL = 294.6e9 / 16      # the measured H100 figure, Blackwell's too (comment above)
P2P_CHANNEL_BYTES_PER_S = {"ampere": 12.8e9, "hopper": _H100_P2P_CHANNEL, "blackwell": _H100_P2P_CHANNEL}
NVLINK_PREFIX = "nvlink"


def nvlink_p2p_channels(size: float, ranks: int) -> int:
    """Channels NCCL gives one send/recv of ``size`` bytes in a communicator of ``ranks`` ranks
    inside one NVLink domain (module comment above)."""
    ch = P2P_CHANNELS
    while ch > 1 and ch * max(1, ranks) > P2P_CHANNELS:
        ch //= 2
    while ch < P2P_CHANNELS and size / ch > P2P_SPLIT_BYTES:
        ch *= 2
    return max(1, min(ch, int(size // P2P_MIN_PART)))


class Network:
    """Collective times on one cluster (one node group's intra link, the shared inter link)."""

    def __init__(self, cluster: ClusterSpec, intra: LinkSpec | None = None):
        self.cluster = cluster
        self.intra = intra or cluster.intra_node
        self.inter = cluster.inter_node
        self._measured = bool(cluster.collective_table)
        # measured bus bandwidth at a message size already includes the latency: a tier the table
        # measured has none added; a tier it did not (a one-node profile's network) keeps its link's
        # latency and the all-reduce's step (ALLREDUCE_HOP_S), as on an unmeasured cluster
        tiers = {row[0] for row in cluster.collective_table}
        # a measured network tier holds the fixed time of the domains it was measured across; beyond
        # them the steps the ring and the tree add are priced at the link's latency and the
        # all-reduce's step (``_growth_s``): the largest group measured across domains, in domains
        inter_groups = [row[2] for row in cluster.collective_table if row[0] == "inter"]
        self._measured_domains = (max(2, max(inter_groups) // max(1, cluster.groups[0].nvlink_gpus))
                                  if inter_groups else 0)
        self._link_intra_lat, self._link_inter_lat = self.intra.latency_s, self.inter.latency_s
        # an all-reduce's step across domains (ALLREDUCE_HOP_S) and what a small message saves on it
        # (ALLREDUCE_SMALL_HOP_S), at the link's latency where that is larger
        self._link_hop = max(self._link_inter_lat, ALLREDUCE_HOP_S)
        self._link_small_saving = self._link_hop - max(self._link_inter_lat, ALLREDUCE_SMALL_HOP_S)
        if "intra" in tiers:
            self.intra = dataclasses.replace(self.intra, latency_s=0.0)
        if "inter" in tiers:
            self.inter = dataclasses.replace(self.inter, latency_s=0.0)
        # per-call constants, read once (collective times are asked for millions of times)
        self._intra_bw, self._inter_bw = self.intra.effective_bytes_per_s, self.inter.effective_bytes_per_s
        self._mesh = self.intra.mesh_peers    # a direct mesh inside the domain (LinkSpec.mesh_peers)
        self._intra_lat, self._inter_lat = self.intra.latency_s, self.inter.latency_s
        # a measured network tier holds its own steps
        inter_measured = "inter" in tiers
        self._allreduce_hop = 0.0 if inter_measured else self._link_hop
        self._small_saving = 0.0 if inter_measured else self._link_small_saving
        self._ar: dict[GroupLayout, tuple] = {}     # layout -> _coefficients, per collective
        self._ag: dict[GroupLayout, tuple] = {}
        self._ar_fns: dict[GroupLayout, Callable[[float], float]] = {}
        self._ag_fns: dict[GroupLayout, Callable[[float], float]] = {}
        # one send/recv channel's bandwidth inside the NVLink domain (0: the link's rate alone)
        gpu = next((g.gpu for g in cluster.groups if g.intra_node == self.intra), cluster.groups[0].gpu)
        self._p2p_channel_bw = (P2P_CHANNEL_BYTES_PER_S.get(architecture(gpu), 0.0)
                                if self.intra.name.startswith(NVLINK_PREFIX) else 0.0)

    def _bw(self, tier: str, op: str, n: int, size: float) -> float:
        if self._measured:
            bw = _measured_busbw(self.cluster, tier, op, n, size)
            if bw:
                return bw
        return self._intra_bw_for(n) if tier == "intra" else self._inter_bw

    def _intra_bw_for(self, k: int) -> float:
        """The intra tier's effective rate for a collective among ``k`` GPUs of one domain: the
        link's, times its ``mesh_share`` on a direct mesh (``LinkSpec.mesh_peers``)."""
        return self._intra_bw * self.intra.mesh_share(k) if self._mesh else self._intra_bw

    def _coefficients(self, lay: GroupLayout, factor: int) -> tuple:
        """The constants of a two-tier collective on ``lay`` (``factor`` 2 for all-reduce, 1 for
        all-gather): whether each tier is used, its ``factor * (k-1)/k`` and latency term, and
        the NICs per domain the inter tier's shard spreads over (``min(k, RING_NICS)``).

        Latency as NCCL's tuner counts it (``src/graph/tuning.cc``): a ring takes ``n - 1`` steps
        per pass (all-gather, reduce-scatter: one pass; all-reduce: two), so its latency grows
        linearly with the ring; all-reduce may also run as a tree, ``2 log2(nodes)`` steps across
        nodes, and the tuner picks the faster, so all-reduce's inter-node latency is the tree's
        once it is shorter. All-gather and reduce-scatter have no tree (NVIDIA/nccl#1473): they run
        as one ring over all ``n`` ranks, ``n - 1`` steps of which ``m - 1`` cross the network and
        ``n - m`` stay inside a domain (``tuning.cc``: ``(nsteps - nInterSteps) * intraLat +
        nInterSteps * interLat``), so their latency is linear in the ranks, not only the nodes --
        what makes ZeRO's reduce-scatters and gathers at thousands of GPUs slow."""
        n, k = lay
        m = max(1, n // k)
        inter_steps = factor * (m - 1)
        intra_steps = factor * (k - 1)
        inter_lat = self._inter_lat
        if factor == 2:
            # all-reduce across domains: a step priced at what nccl-tests measure (ALLREDUCE_HOP_S)
            inter_lat = self._allreduce_hop
            inter_steps = allreduce_inter_steps(m)
        elif m > 1:
            intra_steps = n - m
        # the last field: what a message of at most SMALL_HOP_BYTES saves on the network steps (times
        # small_hop_fraction of its size: _small_part)
        return (k > 1, factor * (k - 1) / k, intra_steps * self._intra_lat, min(k, RING_NICS),
                m > 1, factor * (m - 1) / m, inter_steps * inter_lat,
                inter_steps * self._small_saving if factor == 2 and m > 1 else 0.0)

    @staticmethod
    def _small_part(small: float, size: float) -> float:
        """What a ``size``-byte all-reduce saves of ``small`` (``_coefficients``' last field)."""
        return small * small_hop_fraction(size) if small and size < LARGE_HOP_BYTES else 0.0

    def latency_s(self, lay: GroupLayout, factor: int = 1, small: bool = False) -> float:
        """The fixed time of one collective on ``lay``: ``factor`` 1 for an all-gather or
        reduce-scatter, 2 for an all-reduce, of a large message (a bucket), or with ``small`` of a
        message of at most SMALL_HOP_BYTES (a loss, a norm: ALLREDUCE_SMALL_HOP_S)."""
        if lay[0] <= 1:
            return 0.0
        c = self._coefficients(lay, factor)
        t = (c[2] if c[0] else 0.0) + ((c[6] - (c[7] if small else 0.0)) if c[4] else 0.0)
        m = lay.nodes
        if self._measured_domains and m > self._measured_domains:
            t += self._growth_s(factor, lay.k, m, SMALL_HOP_BYTES if small else LARGE_HOP_BYTES)
        return t

    def all_reduce(self, size: float, lay: GroupLayout) -> float:
        return self._collective("all_reduce", 2, self._ar, size, lay)

    def all_gather(self, size: float, lay: GroupLayout) -> float:
        """``size`` = bytes of the gathered (full) tensor; reduce-scatter costs the same."""
        return self._collective("all_gather", 1, self._ag, size, lay)

    def _collective(self, op: str, factor: int, cache: dict, size: float, lay: GroupLayout) -> float:
        """A two-tier collective's time (``factor`` 2 for all-reduce, 1 for all-gather), its
        layout's constants kept in ``cache``."""
        if lay[0] <= 1 or size <= 0:
            return 0.0
        c = cache.get(lay)
        if c is None:
            c = cache[lay] = self._coefficients(lay, factor)
        if self._measured:
            return self._two_tier_measured(op, factor, size, lay, c)
        intra, a, lat_a, nics, inter, b, lat_b, small = c
        lat_b -= self._small_part(small, size)
        # the tiers run at once (PIPELINED_TIERS): the slower one's transfer, both tiers' latencies
        if intra and inter:
            return max(a * size / self._intra_bw_for(lay[1]), b * (size / nics) / self._inter_bw) + lat_a + lat_b
        if intra:
            return a * size / self._intra_bw_for(lay[1]) + lat_a
        return b * (size / nics) / self._inter_bw + lat_b

    def all_reduce_fn(self, lay: GroupLayout) -> Callable[[float], float]:
        """``all_reduce(size, lay)`` as a function of ``size`` alone (for a stage model's fixed groups)."""
        return self._time_fn(lay, 2, self._ar_fns, self.all_reduce)

    def all_gather_fn(self, lay: GroupLayout) -> Callable[[float], float]:
        """``all_gather(size, lay)`` (and so ``reduce_scatter``) as a function of ``size`` alone."""
        return self._time_fn(lay, 1, self._ag_fns, self.all_gather)

    def _time_fn(self, lay: GroupLayout, factor: int, fns: dict, method) -> Callable[[float], float]:
        fn = fns.get(lay)
        if fn is not None:
            return fn
        if lay[0] <= 1:
            def fn(size: float) -> float:
                return 0.0
        elif self._measured:
            def fn(size: float) -> float:
                return method(size, lay)
        else:
            # the terms of all_reduce / all_gather with the layout's constants bound; one tier's
            # time is t = 0.0 + term there, which is exactly the term
            intra, a, lat_a, nics, inter, b, lat_b, small = self._coefficients(lay, factor)
            bw_a, bw_b = self._intra_bw_for(lay[1]), self._inter_bw
            part = self._small_part
            if intra and inter:
                lat = lat_a + lat_b

                def fn(size: float) -> float:
                    return max(a * size / bw_a, b * (size / nics) / bw_b) + lat - part(small, size) if size > 0 else 0.0
            elif intra:
                def fn(size: float) -> float:
                    return a * size / bw_a + lat_a if size > 0 else 0.0
            else:
                def fn(size: float) -> float:
                    return b * (size / nics) / bw_b + lat_b - part(small, size) if size > 0 else 0.0
        fns[lay] = fn
        return fn

    def _two_tier_measured(self, op: str, factor: int, size: float, lay: GroupLayout, c: tuple) -> float:
        """All-reduce (``factor`` 2) or all-gather (1) with the bus bandwidth measured at each
        tier's message size: inside the node on ``size``, across nodes on the shard each busy NIC
        carries (``1 / min(k, RING_NICS)``, as ``_coefficients``). A measured tier's latency is in
        its bandwidth; a tier the table lacks is priced as unmeasured (its link's rate, latency and
        step: ``c``, ``_coefficients``' constants, whose latency fields are 0 for a measured tier)."""
        n, k = lay
        m = max(1, n // k)
        t_intra = t_inter = 0.0
        if k > 1:
            t_intra = factor * (k - 1) / k * size / self._bw("intra", op, k, size)
        if m > 1:
            shard = size / min(k, RING_NICS)
            t_inter = factor * (m - 1) / m * shard / self._bw("inter", op, m, shard)
        _, _, lat_a, _, _, _, lat_b, small = c
        # the tiers run at once (PIPELINED_TIERS)
        t = max(t_intra, t_inter) + (lat_a if k > 1 else 0.0) + (lat_b - self._small_part(small, size) if m > 1 else 0.0)
        return t + self._growth_s(factor, k, m, size) if self._measured_domains and m > self._measured_domains else t

    def _growth_s(self, factor: int, k: int, m: int, size: float) -> float:
        """What a collective over ``m`` domains of ``k`` adds to the fixed time a measured network
        tier holds (measured across ``_measured_domains``): an all-reduce's extra tree (or ring)
        steps at the all-reduce's step (``ALLREDUCE_HOP_S``, shorter for a small message), an
        all-gather's or reduce-scatter's extra ring steps, ``k - 1`` inside a domain and one across
        per added domain, at the links' latencies (``_coefficients``' rules)."""
        m0 = self._measured_domains
        if factor == 2:
            hop = self._link_hop - self._small_part(self._link_small_saving, size)
            return (allreduce_inter_steps(m) - allreduce_inter_steps(m0)) * hop
        return (m - m0) * (self._link_inter_lat + (k - 1) * self._link_intra_lat)

    reduce_scatter = all_gather

    def all_to_all(self, size: float, lay: GroupLayout) -> float:
        """Each rank holds ``size`` bytes spread evenly over the ``n`` members."""
        if lay.n <= 1 or size <= 0:
            return 0.0
        n, k = lay.n, lay.k
        t_intra = (k - 1) / n * size / self._bw("intra", "all_to_all", k, size) if k > 1 else 0.0
        t_inter = (n - k) / n * size / self._bw("inter", "all_to_all", n, size) if n > k else 0.0
        lat = (k - 1) * self._intra_lat + ((n - k) * self._inter_lat if n > k else 0.0)
        return max(t_intra, t_inter) + lat

    def p2p(self, size: float, cross_node: bool, ranks: int = 2) -> float:
        """One send/recv of ``size`` bytes in a communicator of ``ranks`` ranks: across nodes at
        the inter tier; inside one NVLink domain at the link's rate, capped by the channels NCCL
        gives it (``nvlink_p2p_channels``), unless a profile measured send/recv or ``ranks`` is 0
        (a transfer that is not NCCL's: NIXL, Mooncake)."""
        if size <= 0:
            return 0.0
        if cross_node:
            return size / self._bw("inter", "send_recv", 2, size) + self._inter_lat
        measured = _measured_busbw(self.cluster, "intra", "send_recv", 2, size) if self._measured else None
        if measured:
            return size / measured + self._intra_lat
        bw = self._intra_bw_for(2)
        if ranks and self._p2p_channel_bw:
            bw = min(bw, nvlink_p2p_channels(size, ranks) * self._p2p_channel_bw)
        return size / bw + self._intra_lat
