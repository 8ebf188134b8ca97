"""Failures, checkpoints and restarts: what they cost a training job, and how to spend against them.

Pure functions in SI units (seconds, bytes, bytes/s); no I/O. The planner's reports
(``planner.cli.failures``) call them with a plan's step time, state size and cluster.

The failure model. Nodes fail independently at a constant rate (exponential times between
failures), so a job on ``n`` nodes of per-node MTBF ``m`` fails every ``M = m / n`` on average.
Every failure stops the whole synchronous job: it loses the work since the last durable
checkpoint and spends ``R`` restarting (detecting the failure, rendezvous, reloading the
checkpoint, warming up). Checkpoints every ``tau`` seconds of work cost ``delta`` each.

* Expected wall time and goodput: Daly (2006), "A higher order estimate of the optimum
  checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), eq. (13):
  for ``T`` seconds of work, ``T_wall = M * exp(R / M) * (exp((tau + delta) / M) - 1) * T / tau``
  (exact under exponential failures, failures during a restart or a checkpoint included). The
  useful fraction of wall time is ``T / T_wall``.
* The best interval: Young (1974), "A first order approximation to the optimum checkpoint
  interval", CACM 17(9): ``tau = sqrt(2 * delta * M)``; Daly's higher-order form (eq. 20),
  ``sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta`` for ``delta < 2M``,
  else ``M``; and ``best_interval_s``, the exact maximum of the useful fraction (Young and Daly
  agree with it to first order; the test holds them to it).
* Asynchronous checkpoints (torch.distributed.checkpoint's ``async_save``): the job stalls only
  for the snapshot (``delta`` = the staging copy), and the write runs beside training for
  ``write_s``. A checkpoint is durable only when its write completes, so a failure in that
  window falls back one more interval: on average ``write_s`` more lost work per failure (a
  failure lands in the window with probability ``write_s / tau`` and then loses ``tau`` more),
  which enters Daly's formula as part of ``R``.
* Spare nodes: failed nodes come back after a repair time ``r``. The number of nodes down at
  once is then Poisson with mean ``n * r / m`` (the M/G/infinity queue in steady state, any
  repair-time distribution: Palm's theorem). ``spares_needed`` is the least ``S`` with
  ``P(down > S) <= risk``. With ``S`` spares held back, a failure restarts on the same layout
  (a spare takes the dead node's place); beyond them, the job runs degraded on fewer nodes
  until a repair (``expected_rate``).

Reference figures kept here, with their sources:

* Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4 and Table 5: 466 job interruptions
  in a 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 GPUs (2,048 nodes of 8), 419
  of them unexpected, and more than 90 % effective training time; section 3.3.1: checkpoints go to
  Tectonic, 240 PB on 7,500 servers, 2 TB/s sustained and 7 TB/s peak throughput, each GPU saving
  1 MB to 4 GB.
* The default storage bandwidth, ``DEFAULT_STORAGE_BYTES_PER_S_PER_NODE``: Tectonic's sustained
  2 TB/s shared by the 2,048 nodes of that job, about 1 GB/s per node.
* The default restart overhead, ``DEFAULT_RESTART_OVERHEAD_S``: 150 s, the restoration time
  FlashRecovery (Zhang et al. 2025, arXiv 2509.03047) measures on 4,800 devices with active
  failure detection and scale-independent restart; PyTorch's own collective timeout (up to 30
  min) is what detection costs without such monitoring. The planner adds the checkpoint load
  (state size / storage bandwidth) and the warm-up steps to it.
* The default repair time, ``DEFAULT_REPAIR_S``: 24 h, an assumption (no published figure for a
  node's time out of service in these jobs); the reports name it and ``--repair-hours`` sets it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.specs import SpecError

HOUR = 3600.0
DAY = 86400.0

# Meta's Llama 3 405B pre-training (The Llama 3 Herd of Models, 2024, section 3.3)
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_SNAPSHOT_S = 54 * DAY
LLAMA3_GPUS = 16384
LLAMA3_GPUS_PER_NODE = 8
LLAMA3_STORAGE_BYTES_PER_S = 2e12          # Tectonic, sustained

DEFAULT_STORAGE_BYTES_PER_S_PER_NODE = LLAMA3_STORAGE_BYTES_PER_S / (LLAMA3_GPUS // LLAMA3_GPUS_PER_NODE)
DEFAULT_RESTART_OVERHEAD_S = 150.0         # FlashRecovery, 4,800 devices (arXiv 2509.03047)
DEFAULT_REPAIR_S = 24 * HOUR               # an assumption; see the module docstring
DEFAULT_WARMUP_STEPS = 2                   # steps after a restart that run slower (allocator, kernels, caches)
DEFAULT_SPARE_RISK = 0.01                  # spares cover the nodes down at once but in 1 % of the time


def _positive(**kw: float) -> None:
    for k, v in kw.items():
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise SpecError(f"{k} must be a positive number, got {v!r}")


def _non_negative(**kw: float) -> None:
    for k, v in kw.items():
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise SpecError(f"{k} must be >= 0, got {v!r}")


def _log_expm1(x: float) -> float:
    """``log(e^x - 1)`` for x > 0 without overflow (``x + log(1 - e^-x)`` past 30)."""
    return x + math.log1p(-math.exp(-x)) if x > 30 else math.log(math.expm1(x))


def _mean_down(nodes: int, node_mtbf_s: float, repair_s: float) -> float:
    """The mean number of nodes down at once, ``nodes * repair / MTBF`` (the Poisson mean). Every
    loop over ``k`` nodes down stops at ``nodes`` (no more are down than exist), so a repair time
    of many MTBFs (a mean above ``nodes``) costs at most ``nodes`` terms: the probability mass past
    them runs at the last rate (for a job without a smaller plan, 0: it waits)."""
    # capped at 1e300: a finite mean whose exp(-mean) is 0 (an infinite one would turn 0 * inf into NaN)
    return min(nodes * repair_s / node_mtbf_s, 1e300) if repair_s else 0.0


# --------------------------------------------------------------------------------------
# Failure rates
# --------------------------------------------------------------------------------------

def job_mtbf_s(node_mtbf_s: float, nodes: int) -> float:
    """A job on ``nodes`` nodes fails ``nodes`` times as often as one node."""
    _positive(node_mtbf_s=node_mtbf_s, nodes=nodes)
    return node_mtbf_s / nodes


def node_mtbf_from_job(failures: int, duration_s: float, nodes: int) -> float:
    """The per-node MTBF that ``failures`` interruptions of a ``nodes``-node job in ``duration_s``
    imply (every interruption charged to one node): ``duration * nodes / failures``."""
    _positive(failures=failures, duration_s=duration_s, nodes=nodes)
    return duration_s * nodes / failures


def llama3_node_mtbf_s() -> float:
    """Meta's Llama 3 405B run: 419 unexpected interruptions in 54 days on 2,048 nodes, so
    54 * 24 * 2,048 / 419 = 6,335 node-hours between failures per node."""
    return node_mtbf_from_job(LLAMA3_UNEXPECTED_INTERRUPTIONS, LLAMA3_SNAPSHOT_S,
                              LLAMA3_GPUS // LLAMA3_GPUS_PER_NODE)


# --------------------------------------------------------------------------------------
# Checkpoint interval and goodput (Young 1974, Daly 2006)
# --------------------------------------------------------------------------------------

def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 * checkpoint cost * MTBF)``, the work between checkpoints."""
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006) eq. (20), the higher-order optimum; ``M`` when the checkpoint costs 2M or more."""
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    if checkpoint_s >= 2 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2 * mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s


def useful_fraction(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """The fraction of wall time that is useful work: ``tau / (M e^(R/M) (e^((tau+delta)/M) - 1))``
    (Daly 2006, eq. 13; exponential failures). 1 when nothing fails and checkpoints are free."""
    _positive(interval_s=interval_s, mtbf_s=mtbf_s)
    _non_negative(checkpoint_s=checkpoint_s, restart_s=restart_s)
    m = mtbf_s
    # in logs, so that a restart or an interval of many MTBFs gives a fraction that underflows to 0
    # rather than an overflow (expm1 keeps precision when tau + delta << M)
    log_f = math.log(interval_s) - math.log(m) - restart_s / m - _log_expm1((interval_s + checkpoint_s) / m)
    return math.exp(log_f) if log_f < 700 else math.inf


def best_interval_s(checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval that maximises ``useful_fraction`` (golden-section search on log tau; the
    fraction is unimodal in tau). Does not depend on ``restart_s`` (it scales the fraction)."""
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    _non_negative(restart_s=restart_s)
    f = lambda lt: -useful_fraction(math.exp(lt), checkpoint_s, 0.0, mtbf_s)  # noqa: E731
    lo = math.log(min(checkpoint_s, mtbf_s) * 1e-3)
    hi = math.log(mtbf_s * 10)
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
        if b - a < 1e-10:
            break
    return math.exp((a + b) / 2)


# --------------------------------------------------------------------------------------
# Checkpoint and restart cost of a plan
# --------------------------------------------------------------------------------------

def checkpoint_write_s(state_bytes: float, nodes: int, per_node_bytes_per_s: float,
                       total_bytes_per_s: float = 0.0) -> float:
    """Seconds to write ``state_bytes`` from ``nodes`` nodes at ``per_node_bytes_per_s`` each,
    capped by the storage's ``total_bytes_per_s`` when given (0: no cap). Every shard is written
    once (torch.distributed.checkpoint writes a replicated tensor from one rank), so the bytes are
    the whole state, spread over the writers."""
    _positive(nodes=nodes, per_node_bytes_per_s=per_node_bytes_per_s)
    _non_negative(state_bytes=state_bytes, total_bytes_per_s=total_bytes_per_s)
    bw = nodes * per_node_bytes_per_s
    if total_bytes_per_s:
        bw = min(bw, total_bytes_per_s)
    return state_bytes / bw


@dataclass(frozen=True, kw_only=True)
class CheckpointCost:
    """What one checkpoint costs: ``stall_s`` the job waits (all of the write when synchronous;
    the snapshot to host memory when asynchronous), ``write_s`` until it is durable."""

    stall_s: float
    write_s: float
    asynchronous: bool = False

    def __post_init__(self) -> None:
        _non_negative(stall_s=self.stall_s, write_s=self.write_s)


def checkpoint_cost(state_bytes_per_gpu: float, write_s: float, asynchronous: bool,
                    snapshot_bytes_per_s: float) -> CheckpointCost:
    """Synchronous: the job stalls for the whole write. Asynchronous: it stalls while each GPU
    copies its shard to host memory (``state_bytes_per_gpu / snapshot_bytes_per_s``, at most the
    write itself), and the write goes on beside training."""
    _non_negative(state_bytes_per_gpu=state_bytes_per_gpu, write_s=write_s)
    if not asynchronous:
        return CheckpointCost(stall_s=write_s, write_s=write_s)
    _positive(snapshot_bytes_per_s=snapshot_bytes_per_s)
    return CheckpointCost(stall_s=min(write_s, state_bytes_per_gpu / snapshot_bytes_per_s), write_s=write_s,
                          asynchronous=True)


@dataclass(frozen=True, kw_only=True)
class RestartCost:
    """The time a failure costs besides lost work: detecting it and re-forming the job
    (``overhead_s``), reading the checkpoint back (``load_s``) and the slower first steps
    (``warmup_s``)."""

    overhead_s: float
    load_s: float
    warmup_s: float

    def __post_init__(self) -> None:
        _non_negative(overhead_s=self.overhead_s, load_s=self.load_s, warmup_s=self.warmup_s)

    @property
    def total_s(self) -> float:
        return self.overhead_s + self.load_s + self.warmup_s


# --------------------------------------------------------------------------------------
# Spare nodes and degraded operation
# --------------------------------------------------------------------------------------

def nodes_down_pmf(nodes: int, node_mtbf_s: float, repair_s: float, kmax: int) -> list[float]:
    """``P(k nodes down at once)`` for k = 0..kmax: Poisson with mean ``nodes * repair / MTBF``."""
    _positive(nodes=nodes, node_mtbf_s=node_mtbf_s)
    _non_negative(repair_s=repair_s)
    lam = _mean_down(nodes, node_mtbf_s, repair_s)
    out, p = [], math.exp(-lam)
    for k in range(min(kmax, nodes) + 1):       # no more nodes are down than there are
        out.append(p)
        p *= lam / (k + 1)
    return out


def spares_needed(nodes: int, node_mtbf_s: float, repair_s: float, risk: float = DEFAULT_SPARE_RISK) -> int:
    """The least number of spare nodes ``S`` with ``P(more than S nodes down) <= risk``."""
    if not 0 < risk < 1:
        raise ValueError(f"risk must be in (0, 1), got {risk!r}")
    _positive(nodes=nodes, node_mtbf_s=node_mtbf_s)
    _non_negative(repair_s=repair_s)
    lam = _mean_down(nodes, node_mtbf_s, repair_s)
    kmax = nodes if lam >= nodes else min(nodes, int(lam + 12 * math.sqrt(lam) + 20))
    cdf = 0.0
    for s, p in enumerate(nodes_down_pmf(nodes, node_mtbf_s, repair_s, kmax)):
        cdf += p
        if 1 - cdf <= risk:
            return s
    return kmax


def expected_rate(rates: list[float], nodes: int, node_mtbf_s: float, repair_s: float, spares: int = 0) -> float:
    """The long-run rate of a job whose rate with ``j`` nodes fewer than it needs is ``rates[j]``
    (``rates[0]``: healthy; past the end, the last entry), holding ``spares`` spare nodes: with ``k``
    nodes down, ``max(0, k - spares)`` are missing. ``nodes`` counts every node in service (the
    job's and the spares)."""
    if not rates:
        raise ValueError("rates must hold at least the healthy rate")
    _positive(nodes=nodes, node_mtbf_s=node_mtbf_s)
    _non_negative(repair_s=repair_s)
    lam = _mean_down(nodes, node_mtbf_s, repair_s)
    kmax = nodes if lam >= nodes else min(nodes, spares + len(rates) + int(lam + 12 * math.sqrt(lam) + 20))
    pmf = nodes_down_pmf(nodes, node_mtbf_s, repair_s, kmax)
    total = 0.0
    for k, p in enumerate(pmf):
        j = max(0, k - spares)
        total += p * rates[min(j, len(rates) - 1)]
    # the tail beyond kmax (negligible by construction) runs at the last rate
    return total + max(0.0, 1 - sum(pmf)) * rates[-1]


# --------------------------------------------------------------------------------------
# Goodput of one plan
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Goodput:
    """Expected useful training of one plan under failures."""

    job_mtbf_s: float
    interval_s: float              # work between checkpoints (the best one unless given)
    interval_steps: int
    young_interval_s: float
    daly_interval_s: float
    useful_fraction: float         # of wall time, at the healthy rate
    steps_per_hour: float          # useful steps per wall-clock hour (failures, checkpoints, degraded time)
    ideal_steps_per_hour: float    # the same without failures or checkpoints
    spares: int                    # spare nodes held back (the plan's layout survives that many down)
    degraded_fraction: float       # of the time, the job runs on fewer nodes than its plan (beyond spares)
    checkpoint: CheckpointCost
    restart: RestartCost

    @property
    def goodput(self) -> float:
        return self.steps_per_hour / self.ideal_steps_per_hour


def goodput(*, step_time_s: float, nodes: int, node_mtbf_s: float, checkpoint: CheckpointCost,
            restart: RestartCost, interval_steps: int | None = None, spares: int = 0, repair_s: float = 0.0,
            degraded_step_times_s: list[float | None] | None = None) -> Goodput:
    """Expected goodput of a plan on ``nodes`` nodes (``spares`` more held back).

    ``degraded_step_times_s[j-1]``: the step time with ``j`` nodes missing (the plan replanned for
    fewer nodes; None or absent: the job cannot run, rate 0). Without ``repair_s`` a failed node
    is replaced at once (the restart is the whole cost). ``interval_steps`` fixes the checkpoint
    interval; otherwise it is the best one, rounded to whole steps.
    """
    _positive(step_time_s=step_time_s, nodes=nodes, node_mtbf_s=node_mtbf_s)
    m = job_mtbf_s(node_mtbf_s, nodes)
    delta = checkpoint.stall_s
    r = restart.total_s + (checkpoint.write_s if checkpoint.asynchronous else 0.0)
    young = young_interval_s(max(delta, 1e-9), m)
    daly = daly_interval_s(max(delta, 1e-9), m)
    if interval_steps is None:
        best = best_interval_s(max(delta, 1e-9), r, m)
        if checkpoint.asynchronous:         # one write at a time: the next starts after the last is durable
            best = max(best, checkpoint.write_s)
        cands = {max(1, math.floor(best / step_time_s)), max(1, math.ceil(best / step_time_s))}
        interval_steps = max(cands, key=lambda k: useful_fraction(k * step_time_s, delta, r, m))
    if interval_steps < 1:
        raise ValueError(f"interval_steps must be >= 1, got {interval_steps}")
    tau = interval_steps * step_time_s
    frac = useful_fraction(tau, delta, r, m)
    rates = [1.0 / step_time_s] + [(1.0 / t if t else 0.0) for t in (degraded_step_times_s or [])]
    if len(rates) == 1 and repair_s:
        rates.append(0.0)           # no plan for fewer nodes given: the job waits for the repair
    pool = nodes + spares
    rate = expected_rate(rates, pool, node_mtbf_s, repair_s, spares) if repair_s else rates[0]
    # P(more nodes down than spares): the time the job runs on a smaller plan (or waits)
    degraded = max(0.0, 1 - sum(nodes_down_pmf(pool, node_mtbf_s, repair_s, spares))) if repair_s else 0.0
    ideal = 3600.0 / step_time_s
    return Goodput(job_mtbf_s=m, interval_s=tau, interval_steps=interval_steps, young_interval_s=young,
                   daly_interval_s=daly, useful_fraction=frac, steps_per_hour=3600.0 * rate * frac,
                   ideal_steps_per_hour=ideal, spares=spares, degraded_fraction=degraded,
                   checkpoint=checkpoint, restart=restart)


__all__ = ["job_mtbf_s", "node_mtbf_from_job", "llama3_node_mtbf_s", "young_interval_s", "daly_interval_s",
           "useful_fraction", "best_interval_s", "checkpoint_write_s", "CheckpointCost", "checkpoint_cost",
           "RestartCost", "nodes_down_pmf", "spares_needed", "expected_rate", "Goodput", "goodput",
           "DEFAULT_STORAGE_BYTES_PER_S_PER_NODE", "DEFAULT_RESTART_OVERHEAD_S", "DEFAULT_REPAIR_S",
           "DEFAULT_WARMUP_STEPS", "DEFAULT_SPARE_RISK", "HOUR", "DAY"]
