"""The training kinds of ``costmodel/uncertainty_bands.yaml`` from out-of-source residuals. ``train-dense``: the
errors of ``planner validate --cross`` on dense runs on catalog hardware, each predicted with constants
refitted without its own recipe family; ``train-moe``: the same for MoE runs that chose no MoE constant (split
``moe-fit`` left out) and are not host-paced; ``train-moe-host``: those that are
(``validation_cross.host_paced_case``: the host's issue time of an eager MoE layer sets its pace);
``train-thin``: the dense runs on a thin step (``costmodel.ceilings.is_thin``), which ``train-dense`` then
leaves out; ``train-torch-cp``: the dense runs on PyTorch's ring attention
(``validation_cross.torch_cp_case``), on every machine, which ``train-dense`` leaves out too; ``train-cp``:
the dense runs on catalog hardware under context parallelism on any other ring (``validation_cross.cp_case``:
Transformer Engine's), which ``train-dense`` leaves out as well; ``train-nvfp4``: the dense NVFP4 runs
(``validation_cross.nvfp4_rows``), which every other kind leaves out. The band is
``costmodel.uncertainty.band_from_residuals`` of them (the statistic every kind uses). ``planner validate
--cross --write-bands`` rewrites the training kinds and keeps the serving kinds as they are
(``planner.cli.uncertainty_bands.write_training_bands``); ``python -m planner.cli.uncertainty_bands`` (which
computes the serving kinds) takes the training kinds from here.
"""
from __future__ import annotations

from functools import lru_cache

HOW = {
    "train-dense": "OUT OF SOURCE: tokens/s per GPU of the dense runs on catalog hardware in `planner validate "
                   "--cross` (but the thin steps, train-thin, PyTorch's ring attention, train-torch-cp, and the other "
                   "context-parallel runs, train-cp), each "
                   "predicted with every fitted constant refitted without its own recipe family",
    "train-thin": "OUT OF SOURCE: tokens/s per GPU of the dense runs on catalog hardware in `planner validate "
                  "--cross` whose ideal step (model FLOPs per GPU per step at peak) is under "
                  "costmodel.ceilings.THIN_STEP_S, each predicted with every fitted constant refitted without its "
                  "own recipe family",
    "train-torch-cp": "OUT OF SOURCE: tokens/s per GPU of the dense runs in `planner validate --cross` whose "
                      "attention runs PyTorch's ring attention under context parallelism (costmodel.attention."
                      "torch_ring), thin steps apart, on the catalog cluster and on other machines alike, each "
                      "predicted with every fitted constant refitted without its own recipe family",
    "train-cp": "OUT OF SOURCE: tokens/s per GPU of the dense runs on catalog hardware in `planner validate --cross` "
                "under context parallelism on a ring other than PyTorch's (validation_cross.cp_case: Transformer "
                "Engine's, Megatron and NeMo), thin steps apart, each predicted with every fitted constant refitted "
                "without its own recipe family",
    "train-nvfp4": "OUT OF SOURCE: tokens/s per GPU of the dense NVFP4 runs on catalog hardware in `planner validate "
                   "--cross` (validation_cross.nvfp4_rows; the NVFP4 recipe's constants come from kernel tables, none "
                   "fitted on a run), which train-dense and its regimes leave out",
    "train-moe": "OUT OF SOURCE: tokens/s per GPU of the MoE runs on catalog hardware in `planner validate --cross` "
                 "that chose no MoE constant (the moe-fit runs, which chose the load factors and the layer host "
                 "time of costmodel/moe.py, are left out) and whose layers are not host-paced (train-moe-host)",
    "train-moe-host": "OUT OF SOURCE: tokens/s per GPU of the MoE runs on catalog hardware in `planner validate "
                      "--cross` that chose no MoE constant and whose MoE layers are host-paced (costmodel.ceilings."
                      "host_paced_share above HOST_PACED_SHARE: the host's time to issue an eager layer, "
                      "costmodel.moe.MEGATRON_LAYER_HOST_S, sets the pace)",
}
SOURCE = {
    "train-dense": "docs/validation.md (planner validate --cross; calibration/published_runs*.yaml, "
                   "holdout_runs.yaml)",
    "train-moe": "docs/validation.md (planner validate --cross; calibration/published_runs_moe.yaml)",
    "train-moe-host": "docs/validation.md (planner validate --cross; calibration/published_runs_moe.yaml)",
    "train-nvfp4": "docs/validation.md (planner validate --cross, the line 'NVFP4, apart'; "
                   "calibration/published_runs_more.yaml)",
    "train-thin": "docs/validation.md (planner validate --cross, table 'By ideal step per GPU'; "
                  "calibration/published_runs*.yaml)",
    "train-torch-cp": "docs/validation.md (planner validate --cross, table 'By context parallelism'; "
                      "calibration/published_runs*.yaml)",
    "train-cp": "docs/validation.md (planner validate --cross, table 'By context parallelism'; "
                "calibration/published_runs*.yaml)",
}


@lru_cache(maxsize=1)
def _cross() -> dict:
    from planner.cli.validation_cross import cross_validate
    return cross_validate()


def training_residuals(res: dict | None = None) -> dict[str, list[float]]:
    """Out-of-source relative errors (predicted / published - 1) of the training kinds."""
    from planner.cli.validation_cross import (cp_case, headline_rows, host_paced_case, nvfp4_rows, thin_case,
                                              torch_cp_case)
    res = res if res is not None else _cross()
    split: dict[str, list[float]] = {"train-dense": [], "train-thin": [], "train-torch-cp": [], "train-cp": [],
                                     "train-nvfp4": [r.error for r in nvfp4_rows(res["rows"])]}
    headline = set(map(id, headline_rows(res["rows"])))
    for r in res["rows"]:
        if r.case.dtype == "nvfp4":                # its own kind (above)
            continue
        if torch_cp_case(r.case):                  # every machine
            split["train-torch-cp"].append(r.error)
        elif id(r) in headline:                    # dense, catalog hardware
            split["train-thin" if thin_case(r.case) else "train-cp" if cp_case(r.case) else "train-dense"].append(
                r.error)
    moe = [r for r in res["rows"] if r.case.moe and r.case.catalog_hardware and r.case.split != "moe-fit"]
    paced = [host_paced_case(r.case) for r in moe]
    return {**split,
            "train-moe": [r.error for r, p in zip(moe, paced) if not p],
            "train-moe-host": [r.error for r, p in zip(moe, paced) if p]}


def training_bands(res: dict | None = None) -> dict:
    """Band per training kind (``costmodel.uncertainty.Band``)."""
    from costmodel.uncertainty import QUANTILE, Band
    q = f"{QUANTILE * 100:.0f}th percentile (nearest rank) of |predicted - published| / published"
    out = {}
    for kind, errs in training_residuals(res).items():
        if errs:
            out[kind] = Band.of(kind, errs, f"{q} over {len(errs)} rows; {HOW[kind]}", SOURCE[kind])
    return out
