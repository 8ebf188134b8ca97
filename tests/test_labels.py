"""``planner.cli.report.distinct_labels``: plans that differ get different labels, showing what differs."""
from __future__ import annotations

import itertools

from costmodel.specs import ParallelConfig, StageSpec
from planner.cli.report import describe_parallel, distinct_labels


def _stages(split, rc=(0, 0)):
    out, first = [], 0
    for n, r in zip(split, rc):
        out.append(StageSpec(first_layer=first, num_layers=n, recompute_layers=r))
        first += n
    return out


def test_twins_are_told_apart_by_what_differs():
    a = ParallelConfig(tp=8, pp=2, dp=4, vpp=1, grad_accum=8)
    b = ParallelConfig(tp=8, pp=2, dp=4, vpp=1, grad_accum=8, overlap_dp_comm=False)   # not in describe_parallel
    items = [(a, _stages((40, 40)), ("pp", "dp", "cp", "tp")),
             (a, _stages((40, 40)), ("dp", "pp", "cp", "tp")),
             (a, _stages((42, 38)), ("pp", "dp", "cp", "tp")),
             (a, _stages((40, 40), (2, 0)), ("pp", "dp", "cp", "tp")),
             (b, _stages((40, 40)), ("pp", "dp", "cp", "tp"))]
    labels = distinct_labels(items)
    assert describe_parallel(a) == describe_parallel(b)
    # the slow obvious check: every pair of different plans has different labels
    for (i, x), (j, y) in itertools.combinations(enumerate(items), 2):
        if x != y:
            assert labels[i] != labels[j], (labels[i], labels[j])
    assert "order=dp,pp,cp,tp" in labels[1] and "stages=42/38" in labels[2]
    assert "recompute layers=2/0" in labels[3] and "overlap_dp_comm=False" in labels[4]


def test_a_lone_plan_keeps_its_plain_label():
    a = ParallelConfig(tp=8, pp=1, dp=8)
    c = ParallelConfig(tp=4, pp=1, dp=16)
    assert distinct_labels([(a, _stages((80,), (0,)), ("pp", "dp", "cp", "tp")),
                            (c, _stages((80,), (0,)), ("dp", "pp", "cp", "tp"))]) == \
        [describe_parallel(a), describe_parallel(c)]
