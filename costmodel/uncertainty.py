"""How far the cost model's predictions can be trusted: one relative band per kind of prediction.

The band of a kind is the ``QUANTILE`` (nearest rank) of the absolute relative errors
|predicted - published| / published over that kind's validation rows (``band_from_residuals``):
a prediction ``x`` of that kind is expected within ``x * (1 +/- band)`` for about that share of
cases. The numbers live in ``costmodel/uncertainty_bands.yaml`` (kind -> band, n, how, source),
written by ``python -m planner.cli.uncertainty_bands --write`` from the validation tables; a test
recomputes them and fails when the file is stale.

Kinds (``KINDS``):

* ``train-dense``, ``train-moe``: training step time / throughput of dense and MoE models;
* ``train-moe-host``: MoE training whose eager MoE layers are host-paced (``costmodel.ceilings.is_host_paced``:
  the host's time to issue a layer, a fitted constant, sets the pace), systematic again: the published runs
  were all faster than predicted;
* ``train-thin``: dense training on a thin step (``costmodel.ceilings.is_thin``: under
  ``THIN_STEP_S`` of work per GPU per step at peak), where the residuals are systematic, not
  spread around zero (each kind carries its signed range, ``lowest`` .. ``highest``);
* ``train-torch-cp``: dense training whose attention runs PyTorch's ring attention under context
  parallelism (``costmodel.attention.torch_ring``: torchtitan, the generic target, this project's
  runtime), again systematic: the published runs were slower than predicted (all but one, within a tenth
  of a percent, since stop 55 priced Meta's 500 W power limit);
* ``train-cp``: dense training under context parallelism on any other ring (Transformer Engine's:
  Megatron, NeMo), whose published runs spread wider than the rest and mostly on the slow side
  (stop 42: Fujii's A100 sweep);
* ``train-nvfp4``: dense training in NVFP4 (``costmodel.fp8.nvfp4``), a recipe whose constants come from
  kernel tables and no fitted run: its own published runs' residuals;
* ``serve-ttft``: time to the first token (a lone request's prefill);
* ``serve-tpot``: time per output token (decode step, ITL);
* ``serve-throughput``: output tokens/s.

Who reads them: serving's SLO picks keep a margin of ``relative_band`` below each latency goal
(``margin_goal``; the plan must meet goal / (1 + band)), and the training reports draw the band
around each prediction and call plans inside each other's band ties (``within_band``).

Pure: the YAML is package data, read once (no other I/O).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

KINDS = ("train-dense", "train-moe", "train-moe-host", "train-thin", "train-torch-cp", "train-cp", "train-nvfp4",
         "serve-ttft", "serve-tpot", "serve-throughput")
# The share of validation errors a band covers. 0.8: a one-sided goal then fails for roughly one
# case in ten when errors are symmetric (the other tenth errs on the safe side); chosen before the
# residuals were looked at, the same for every kind.
QUANTILE = 0.8
BANDS_FILE = Path(__file__).with_name("uncertainty_bands.yaml")


@dataclass(frozen=True, kw_only=True)
class Band:
    kind: str
    band: float        # relative, e.g. 0.12 for +/-12%
    n: int             # validation rows it is computed from
    how: str           # the rows and the statistic, in words
    source: str        # where the rows come from (a file of this repository)
    lowest: float | None = None     # the smallest signed residual (predicted / published - 1)
    highest: float | None = None    # the largest

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"uncertainty kind {self.kind!r} unknown; known: {', '.join(KINDS)}")
        if not (0.0 < self.band < 1.0) or not math.isfinite(self.band):
            raise ValueError(f"uncertainty band of {self.kind} is {self.band!r}; must be in (0, 1) "
                             "(no prediction is perfect, and a band of 100% says nothing)")
        if self.n < 1:
            raise ValueError(f"uncertainty band of {self.kind} rests on n={self.n} rows; needs at least 1")
        rng = self.signed_range()
        if (rng is None and (self.lowest, self.highest) != (None, None)) or (rng and rng[0] > rng[1]):
            raise ValueError(f"uncertainty band of {self.kind}: signed range {self.lowest!r} .. {self.highest!r} "
                             "needs both ends, lowest <= highest")

    def to_dict(self) -> dict:
        rng = self.signed_range()
        return {"band": self.band, "n": self.n, **(dict(lowest=rng[0], highest=rng[1]) if rng else {}),
                "how": self.how, "source": self.source}

    def signed_range(self) -> tuple[float, float] | None:
        """(lowest, highest) signed residual, or None for a band written without them."""
        if self.lowest is None or self.highest is None:
            return None
        return self.lowest, self.highest

    @classmethod
    def of(cls, kind: str, residuals: Sequence[float], how: str, source: str) -> "Band":
        """The band of ``residuals`` (``band_from_residuals``) with their signed range, rounded as
        the file keeps them."""
        return cls(kind=kind, band=round(band_from_residuals(residuals), 4), n=len(residuals), how=how,
                   source=source, lowest=round(min(residuals), 4), highest=round(max(residuals), 4))


def band_from_residuals(residuals: Sequence[float], quantile: float = QUANTILE) -> float:
    """The ``quantile`` (nearest rank: the ceil(q * n)-th smallest) of |residual|, residuals being
    relative errors (predicted - published) / published. The one statistic every kind uses."""
    if not residuals:
        raise ValueError("band_from_residuals: no residuals (a band needs at least one validation row)")
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"band_from_residuals: quantile {quantile!r} must be in (0, 1]")
    errs = sorted(abs(float(r)) for r in residuals)
    if not all(math.isfinite(e) for e in errs):
        raise ValueError("band_from_residuals: a residual is not finite")
    return errs[max(0, math.ceil(quantile * len(errs)) - 1)]


def parse_bands(data: dict, complete: bool = True) -> dict[str, Band]:
    """``uncertainty_bands.yaml``'s mapping -> Band per kind; every kind of ``KINDS`` must be present
    (``complete=False``: the writer's read, which fills in a kind the file does not have yet)."""
    if not isinstance(data, dict):
        raise ValueError("uncertainty bands: expected a mapping of kind -> {band, n, how, source}")
    unknown = sorted(set(data) - set(KINDS))
    if unknown:
        raise ValueError(f"uncertainty bands: unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    missing = [k for k in KINDS if k not in data]
    if missing and complete:
        raise ValueError(f"uncertainty bands: missing kind(s) {', '.join(missing)}")
    out = {}
    for kind, rec in data.items():
        extra = sorted(set(rec) - {"band", "n", "how", "source", "lowest", "highest"})
        if extra:
            raise ValueError(f"uncertainty bands: {kind} has unknown key(s) {', '.join(extra)}")
        lo, hi = rec.get("lowest"), rec.get("highest")
        out[kind] = Band(kind=kind, band=float(rec["band"]), n=int(rec["n"]), how=str(rec["how"]),
                         source=str(rec["source"]), lowest=None if lo is None else float(lo),
                         highest=None if hi is None else float(hi))
    return out


@lru_cache(maxsize=1)
def bands() -> dict[str, Band]:
    import yaml
    with open(BANDS_FILE) as f:
        return parse_bands(yaml.safe_load(f))


def band_record(kind: str) -> Band:
    b = bands()
    if kind not in b:
        raise ValueError(f"uncertainty kind {kind!r} unknown; known: {', '.join(KINDS)}")
    return b[kind]


def relative_band(kind: str) -> float:
    """The relative uncertainty of a prediction of ``kind`` (``KINDS``): e.g. 0.12 for +/-12%."""
    return band_record(kind).band


def margin_goal(goal: float, band: float) -> float:
    """The value a prediction must reach so that the real figure, up to ``band`` worse, still meets
    an upper-bound goal (a latency): goal / (1 + band)."""
    if band < 0:
        raise ValueError(f"margin {band!r} must be >= 0")
    return goal / (1.0 + band)


def within_band(a: float, b: float, band: float) -> bool:
    """True when two predictions cannot be told apart: the larger lies inside the smaller's band
    (then the smaller lies inside the larger's too)."""
    lo, hi = sorted((abs(a), abs(b)))
    return hi <= lo * (1.0 + band)


__all__ = ["KINDS", "QUANTILE", "Band", "band_from_residuals", "parse_bands", "bands", "band_record",
           "relative_band", "margin_goal", "within_band"]
