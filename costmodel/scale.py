"""What grows with the number of ranks: a synchronous step waits for the slowest of them.

Every training step ends in collectives (the data-parallel gradient reduction, the pipeline's and
TP's exchanges) that wait for the slowest rank. With per-rank compute times independent, of mean
``mu`` and standard deviation ``c_v * mu``, the expected maximum over ``N`` ranks is
``mu * (1 + c_v * z_N)``, ``z_N`` the expected maximum of ``N`` standard normals: exactly
``1 / sqrt(pi)`` = 0.564 for two (textbook order statistics) and by Monte Carlo 1.42 (8), 2.35 (64),
3.05 (512), 3.23 (1024), 3.63 (4096), 3.98 (16384) (each under the ``sqrt(2 ln N)`` bound;
``tests/test_refit_rules.py`` checks one against a simulation), interpolated in log N; beyond the
table grown as ``sqrt(2 ln N)``.

``JITTER_CV`` = 0.02: a healthy fleet's per-rank coefficient of variation of 1-3% is an assumption,
not a published figure (the only fleet-level figure the project's reference notes found is the
Llama 3 report's 1-2% diurnal throughput swing, arXiv:2407.21783 Sec. 3.3.4). The middle is taken,
written here before any fit or validation run with it; it is not fitted.

Per-step work that does not shrink with data parallelism (``step_reductions_s``): every step ends
with two latency-bound all-reduces of a few numbers: the gradient norm for clipping (Megatron-LM
``clip_grads.get_grad_norm_fp32``: the squared norms summed over the ranks that hold different
gradients, the model-parallel and, with the distributed optimizer, the data-parallel ranks -- the
whole job; torch's ``clip_grad_norm_`` over DTensor shards alike) and the loss averaged over the
data-parallel ranks for the log (Megatron ``average_losses_across_data_parallel_group``; torchtitan's
``dist_mean``). Each costs one collective's fixed time on its group (``comm.Network.latency_s``,
an all-reduce of a small message: ``small=True``) and its launch (``comm.launched``); their bytes
are nothing. The norm also reads every local gradient once more (``GRAD_NORM_READS``, priced with
the optimizer step by ``stage_terms`` at the optimizer's achieved bandwidth). The optimizer step itself is
``stage_terms``' (the local states at the framework's memory-bound fraction). Not priced, with why:
data loading (overlapped by the loaders' worker processes and pinned-memory prefetch in Megatron's,
torchtitan's and torch's loaders: an assumption; no figure for a pretraining loader's exposed time
was found).
"""
from __future__ import annotations

import bisect
import math

from .comm import GroupLayout, Network, launched

JITTER_CV = 0.02
_Z = ((1, 0.0), (2, 0.564), (8, 1.42), (64, 2.35), (512, 3.05), (1024, 3.23), (4096, 3.63), (16384, 3.98))


def expected_max_z(n: int) -> float:
    """``z_N``: the expected maximum of ``n`` independent standard normals (module docstring)."""
    if n <= 1:
        return 0.0
    ns = [x for x, _ in _Z]
    if n >= ns[-1]:
        last_n, last_z = _Z[-1]
        return last_z + math.sqrt(2 * math.log(n)) - math.sqrt(2 * math.log(last_n))
    i = bisect.bisect_right(ns, n)
    (n0, z0), (n1, z1) = _Z[i - 1], _Z[i]
    w = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
    return z0 + w * (z1 - z0)


def straggler_factor(n_ranks: int, cv: float = JITTER_CV) -> float:
    """How much longer the slowest of ``n_ranks`` computes than the mean: ``1 + cv * z_N``."""
    return 1.0 + cv * expected_max_z(n_ranks)


# the gradient norm reads each local gradient once more before the optimizer step (module docstring)
GRAD_NORM_READS = 1


def step_reductions_s(net: Network, world: GroupLayout, dp: GroupLayout, loss_scaled: bool = False) -> float:
    """The per-step reductions that do not shrink with scale (module docstring): the gradient
    norm's all-reduce over the whole job and the loss's over the data-parallel group, each its
    collective's fixed time and launch; 0 on one GPU. ``loss_scaled`` (FP16 training's dynamic
    loss scaling): one more all-reduce over the whole job, the overflow flag (Megatron-LM
    ``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``: ``all_reduce(self.found_inf,
    op=MAX, group=self.get_grad_stats_parallel_group())``, the whole world under the distributed
    optimizer), before the step can go on; its HBM traffic is ``memory.loss_scaling_bytes_per_param``'s."""
    t = launched(net.latency_s(world, 2, small=True)) if world.n > 1 else 0.0
    if loss_scaled and world.n > 1:
        t += launched(net.latency_s(world, 2, small=True))
    return t + (launched(net.latency_s(dp, 2, small=True)) if dp.n > 1 else 0.0)
