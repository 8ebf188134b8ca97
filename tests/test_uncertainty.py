"""costmodel.uncertainty: the one band function (serving's SLO margins, training's error bands),
its data file, and that file's agreement with the validation tables it is computed from."""
from __future__ import annotations

import math

import pytest

from costmodel import uncertainty as U


def test_band_from_residuals_is_the_nearest_rank_quantile_of_absolute_errors():
    # ten residuals, |e| sorted 0.01..0.10: the 80th percentile by nearest rank is the 8th, 0.08
    res = [0.05, -0.01, 0.10, -0.08, 0.02, -0.03, 0.07, 0.04, -0.09, 0.06]
    assert U.band_from_residuals(res, 0.8) == pytest.approx(0.08)
    assert U.band_from_residuals(res, 1.0) == pytest.approx(0.10)
    # the slow obvious version: smallest b with at least 80% of |e| <= b
    errs = sorted(abs(r) for r in res)
    slow = next(b for b in errs if sum(e <= b for e in errs) >= 0.8 * len(errs))
    assert U.band_from_residuals(res) == pytest.approx(slow)
    with pytest.raises(ValueError, match="no residuals"):
        U.band_from_residuals([])


def test_every_kind_has_a_band_with_its_count_and_source():
    for kind in U.KINDS:
        b = U.band_record(kind)
        assert 0 < U.relative_band(kind) < 1 and math.isfinite(b.band)
        assert b.n >= 1 and b.how and b.source
    with pytest.raises(ValueError, match="unknown"):
        U.relative_band("serve-latency")


def test_parse_rejects_unknown_and_missing_kinds_and_a_zero_band():
    good = {k: {"band": 0.1, "n": 3, "how": "x", "source": "y"} for k in U.KINDS}
    assert set(U.parse_bands(good)) == set(U.KINDS)
    with pytest.raises(ValueError, match="unknown kind"):
        U.parse_bands({**good, "serve-foo": good["serve-tpot"]})
    with pytest.raises(ValueError, match="missing kind"):
        U.parse_bands({k: v for k, v in good.items() if k != "train-moe"})
    with pytest.raises(ValueError, match="must be in"):
        U.parse_bands({**good, "serve-tpot": {**good["serve-tpot"], "band": 0.0}})


def test_margin_and_ties():
    assert U.margin_goal(400.0, 0.25) == pytest.approx(320.0)
    assert U.margin_goal(400.0, 0.0) == 400.0
    assert U.within_band(100.0, 104.0, 0.05) and not U.within_band(100.0, 106.0, 0.05)


def test_bands_file_is_the_validation_tables():
    """The committed bands are what the validation tables give today (regenerate with
    ``python -m planner.cli.uncertainty_bands --write``)."""
    from planner.cli.uncertainty_bands import compute_bands
    fresh = compute_bands(("serving",))
    for kind, b in fresh.items():
        assert U.band_record(kind) == b, f"{kind} stale: run python -m planner.cli.uncertainty_bands --write"


def test_training_bands_are_computed_not_typed():
    from planner.cli.uncertainty_bands import compute_bands
    fresh = compute_bands(("training",))
    for kind, b in fresh.items():
        assert U.band_record(kind) == b, f"{kind} stale: run python -m planner.cli.uncertainty_bands --write"


def test_signed_range_is_kept_and_checked():
    good = {k: {"band": 0.1, "n": 3, "how": "x", "source": "y"} for k in U.KINDS}
    b = U.parse_bands({**good, "train-thin": {**good["train-thin"], "band": 0.7, "lowest": 0.3, "highest": 0.7}})
    assert (b["train-thin"].lowest, b["train-thin"].highest) == (0.3, 0.7) == b["train-thin"].signed_range()
    assert b["train-dense"].signed_range() is None
    assert b["train-thin"].to_dict() == {"band": 0.7, "n": 3, "lowest": 0.3, "highest": 0.7, "how": "x", "source": "y"}
    with pytest.raises(ValueError, match="needs both ends"):
        U.parse_bands({**good, "train-thin": {**good["train-thin"], "lowest": 0.3}})
    with pytest.raises(ValueError, match="lowest <= highest"):
        U.parse_bands({**good, "train-thin": {**good["train-thin"], "lowest": 0.3, "highest": 0.2}})
    # Band.of: the band and both ends from the residuals
    of = U.Band.of("train-thin", [0.275, 0.44, 0.436, 0.748], "h", "s")
    assert (of.band, of.n, of.lowest, of.highest) == (0.748, 4, 0.275, 0.748)


def test_every_training_kind_carries_its_signed_range():
    for kind in ("train-dense", "train-moe", "train-thin"):
        b = U.band_record(kind)
        assert b.lowest is not None and b.lowest <= b.highest and max(-b.lowest, b.highest) >= b.band
