"""costmodel.reliability: the failure math, held to its sources and to a simulation.

Pure and fast: Daly's expected wall time is checked against a seeded Monte Carlo run of the
process it models (exponential failures, checkpoints, restarts), Young's and Daly's intervals
against the exact optimum, the spare count against the Poisson tail it promises.
"""
from __future__ import annotations

import math
import random

import pytest

from costmodel import reliability as R


def test_llama3_per_node_mtbf_is_derived_from_the_published_counts():
    # 419 unexpected interruptions in 54 days on 16,384 GPUs = 2,048 nodes of 8
    m = R.llama3_node_mtbf_s()
    assert m == pytest.approx(54 * 24 * 3600 * 2048 / 419)
    assert m / 3600 == pytest.approx(6334.6, abs=0.1)
    assert R.job_mtbf_s(m, 2048) / 3600 == pytest.approx(54 * 24 / 419)      # one every 3.09 h


def test_default_storage_bandwidth_is_tectonic_per_node():
    assert R.DEFAULT_STORAGE_BYTES_PER_S_PER_NODE == pytest.approx(2e12 / 2048)


def simulate_fraction(tau, delta, restart, mtbf, work, seed=0):
    """Wall time of ``work`` seconds of work: checkpoints every ``tau`` (cost ``delta``), failures
    at exponential times (also during checkpoints and restarts), each costing ``restart`` and the
    work since the last completed checkpoint."""
    rng = random.Random(seed)
    wall, done = 0.0, 0.0
    next_fail = rng.expovariate(1 / mtbf)
    while done < work - 1e-9:
        seg = min(tau, work - done)
        need = seg + delta
        if next_fail >= need:                  # the segment and its checkpoint complete
            wall += need
            next_fail -= need
            done += seg
            continue
        wall += next_fail                      # lost: the partial segment
        while True:                            # restart, itself interruptible
            f = rng.expovariate(1 / mtbf)
            if f >= restart:
                wall += restart
                next_fail = f - restart
                break
            wall += f
    return work / wall


@pytest.mark.parametrize("tau,delta,restart,mtbf", [(300, 10, 120, 3600), (1000, 60, 600, 4000), (50, 2, 5, 900)])
def test_daly_useful_fraction_matches_a_simulation(tau, delta, restart, mtbf):
    want = R.useful_fraction(tau, delta, restart, mtbf)
    got = simulate_fraction(tau, delta, restart, mtbf, work=4000 * mtbf)
    assert got == pytest.approx(want, rel=0.01), (got, want)
    assert 0.3 < want < 1


def test_young_and_daly_agree_with_the_exact_optimum_when_checkpoints_are_cheap():
    m = R.job_mtbf_s(R.llama3_node_mtbf_s(), 2048)
    for delta in (1.0, 3.0, 30.0):
        best = R.best_interval_s(delta, 150.0, m)
        assert R.young_interval_s(delta, m) == pytest.approx(math.sqrt(2 * delta * m))
        assert R.young_interval_s(delta, m) == pytest.approx(best, rel=0.1)       # first order
        assert R.daly_interval_s(delta, m) == pytest.approx(best, rel=2e-3)       # higher order
        f = lambda t: R.useful_fraction(t, delta, 150.0, m)   # noqa: E731
        assert f(best) >= max(f(best * 0.7), f(best * 1.4))
    # the optimum does not depend on the restart cost (it scales the fraction)
    assert R.best_interval_s(10, 0, 3600) == pytest.approx(R.best_interval_s(10, 900, 3600), rel=1e-6)


def test_daly_interval_is_the_mtbf_when_a_checkpoint_costs_two_mtbf():
    assert R.daly_interval_s(8000, 3600) == 3600


def test_fraction_first_order_and_limits():
    tau, delta, r, m = 300.0, 3.0, 100.0, 1e6
    first = tau / (tau + delta) * (1 - (r + (tau + delta) / 2) / m)     # Daly's first-order form
    assert R.useful_fraction(tau, delta, r, m) == pytest.approx(first, abs=1e-6)
    assert R.useful_fraction(tau, 0.0, 0.0, 1e15) == pytest.approx(1.0, abs=1e-9)
    assert R.useful_fraction(tau, delta, 2 * r, m) < R.useful_fraction(tau, delta, r, m)
    assert R.useful_fraction(tau, 2 * delta, r, m) < R.useful_fraction(tau, delta, r, m)


def test_spares_cover_the_nodes_down_but_in_risk_of_the_time():
    m, repair = R.llama3_node_mtbf_s(), 24 * 3600.0
    s = R.spares_needed(2048, m, repair, risk=0.01)
    lam = 2048 * repair / m
    pmf = R.nodes_down_pmf(2048, m, repair, s)
    assert sum(pmf) == pytest.approx(sum(math.exp(-lam) * lam ** k / math.factorial(k) for k in range(s + 1)))
    assert 1 - sum(pmf) <= 0.01 < 1 - sum(pmf[:-1])          # the least such S
    assert s == 15, s          # mean 7.8 nodes down at once, 15 cover 99 % of the time
    assert R.spares_needed(2048, m, 0.0) == 0
    assert R.spares_needed(2048, m, repair, risk=0.1) < s


def test_expected_rate_with_and_without_spares():
    m, repair = 1000.0, 10.0
    lam = 50 * repair / m                                  # 0.5 nodes down on average
    assert R.expected_rate([2.0, 0.0], 50, m, repair) == pytest.approx(2.0 * math.exp(-lam))
    assert R.expected_rate([2.0, 0.0], 50, m, repair, spares=30) == pytest.approx(2.0, rel=1e-9)
    # one node missing halves the rate, two or more stop the job
    want = 2.0 * math.exp(-lam) + 1.0 * lam * math.exp(-lam)
    assert R.expected_rate([2.0, 1.0, 0.0], 50, m, repair) == pytest.approx(want)


def test_checkpoint_write_and_async_cost():
    assert R.checkpoint_write_s(8e12, 2048, 1e9) == pytest.approx(8e12 / 2.048e12)
    assert R.checkpoint_write_s(8e12, 2048, 1e9, total_bytes_per_s=1e12) == pytest.approx(8.0)
    sync = R.checkpoint_cost(4e9, 40.0, False, 0)
    asy = R.checkpoint_cost(4e9, 40.0, True, 20e9)
    assert (sync.stall_s, sync.write_s) == (40.0, 40.0)
    assert asy.stall_s == pytest.approx(0.2) and asy.write_s == 40.0


def test_goodput_async_beats_sync_when_writes_are_slow_and_spares_help():
    m = R.llama3_node_mtbf_s()
    restart = R.RestartCost(overhead_s=150, load_s=40, warmup_s=20)
    sync = R.goodput(step_time_s=10.0, nodes=2048, node_mtbf_s=m, checkpoint=R.checkpoint_cost(4e9, 40, False, 0),
                     restart=restart)
    asy = R.goodput(step_time_s=10.0, nodes=2048, node_mtbf_s=m, checkpoint=R.checkpoint_cost(4e9, 40, True, 20e9),
                    restart=restart)
    assert asy.steps_per_hour > sync.steps_per_hour
    assert sync.interval_steps * 10.0 == pytest.approx(R.best_interval_s(40, 210, sync.job_mtbf_s), rel=0.05)
    assert 0.8 < sync.goodput < 1 and sync.ideal_steps_per_hour == 360
    # with a repair time: no spares and no smaller plan stops the job most of the time
    none = R.goodput(step_time_s=10.0, nodes=2048, node_mtbf_s=m, checkpoint=sync.checkpoint, restart=restart,
                     repair_s=24 * 3600)
    spared = R.goodput(step_time_s=10.0, nodes=2048, node_mtbf_s=m, checkpoint=sync.checkpoint, restart=restart,
                       repair_s=24 * 3600, spares=15)
    assert none.goodput < 0.01 and none.degraded_fraction > 0.99
    assert spared.goodput == pytest.approx(sync.goodput, rel=0.012) and spared.degraded_fraction <= 0.01


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match="mtbf_s must be a positive number, got 0"):
        R.young_interval_s(1.0, 0)
    with pytest.raises(ValueError, match="risk must be in"):
        R.spares_needed(10, 100, 1, risk=1.5)
    with pytest.raises(ValueError, match="interval_steps"):
        R.goodput(step_time_s=1, nodes=1, node_mtbf_s=10, checkpoint=R.CheckpointCost(stall_s=0, write_s=0),
                  restart=R.RestartCost(overhead_s=0, load_s=0, warmup_s=0), interval_steps=0)
