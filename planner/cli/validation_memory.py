"""The memory model against published outcomes: did a layout fit, or run out of memory?

``calibration/memory_outcomes.yaml`` lists layouts a source reports as having run or as having run out of memory,
each as a training record (``base``) with other degrees. Each is priced by the shipped model
(``validation.case_inputs``, then ``estimate``) and classified by its memory count: ``fits`` or not. A layout that
ran out of memory but is priced as fitting is the dangerous miss: the planner could choose it and the run would
crash. A layout that ran but is priced as not fitting is hidden from the planner.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from costmodel.units import GIB
from planner.cli import validation
from planner.cli.targets_table import compact

OUTCOMES = Path(__file__).resolve().parents[2] / "calibration" / "memory_outcomes.yaml"


@dataclass(frozen=True)
class MemoryOutcome:
    base: str
    sheet: str
    trial: int
    layout: str            # the degrees as the targets tables write them (``targets_table.compact``)
    ran: bool              # published: it ran (else it ran out of memory)
    fits: bool             # priced: the shipped memory count puts it within the GPUs' usable memory
    peak_gib: float
    capacity_gib: float


def outcome_case(base: dict, row: dict) -> dict:
    """The training record ``base`` with the row's degrees: data parallel = GPUs / (tp x pp)."""
    case = copy.deepcopy(base)
    tp, pp = int(row["tp"]), int(row["pp"])
    case["name"] = f"{base['name']}@tp{tp}-pp{pp}-mb{row['micro_batch']}{'-sp' if row['sp'] else ''}"
    case["parallel"].update(tp=tp, pp=pp, dp=case["num_gpus"] // (tp * pp), micro_batch=int(row["micro_batch"]),
                            sp=bool(row["sp"]))
    return case


def memory_outcomes(path: Path = OUTCOMES) -> list[MemoryOutcome]:
    """Every row of the outcomes file, priced by the shipped model."""
    from costmodel.training import estimate
    rows = yaml.safe_load(path.read_text())["outcomes"]
    bases = {c["name"]: c for c, _split in validation.all_cases()}
    out = []
    for row in rows:
        case = outcome_case(bases[row["base"]], row)
        model, cluster, wl, par, prof, _fw = validation.case_inputs(case)
        est = estimate(model, cluster, wl, par, stages=validation.case_stages(case), framework=prof)
        out.append(MemoryOutcome(row["base"], row["sheet"], int(row["trial"]), compact(par), row["outcome"] == "ran",
                                 est.fits, est.peak_bytes / GIB, est.capacity_bytes / GIB))
    return out


def markdown(rows: list[MemoryOutcome]) -> list[str]:
    """The section of ``docs/validation.md``: the confusion counts, then every row the count gets wrong."""
    if not rows:
        return []
    ran_fit = sum(r.ran and r.fits for r in rows)
    ran_not = sum(r.ran and not r.fits for r in rows)
    oom_fit = sum(not r.ran and r.fits for r in rows)
    oom_not = sum(not r.ran and not r.fits for r in rows)
    out = ["## Memory: fit or out of memory (`calibration/memory_outcomes.yaml`)", "",
           f"Layouts a source reports as having run or as having run out of memory, priced by the shipped model "
           f"(`planner.cli.validation_memory`): {ran_fit + oom_not} of {len(rows)} classified as they went. "
           f"{oom_fit} ran out of memory but are priced as fitting (the planner could choose them, and they would "
           f"crash); {ran_not} ran but are priced as not fitting (hidden from the planner).", "",
           "| published | priced: fits | priced: does not fit |", "|---|---:|---:|",
           f"| ran | {ran_fit} | {ran_not} |", f"| out of memory | {oom_fit} | {oom_not} |", "",
           "The rows classified wrongly (peak stage, GiB):", "",
           "| record the layout varies | layout | trial | published | priced peak | capacity |",
           "|---|---|---:|---|---:|---:|"]
    for r in rows:
        if r.ran != r.fits:
            out.append(f"| {r.base} | {r.layout} | {r.trial} | {'ran' if r.ran else 'out of memory'} | "
                       f"{r.peak_gib:.1f} | {r.capacity_gib:.1f} |")
    return out + [""]
