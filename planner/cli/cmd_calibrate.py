"""``planner calibrate``: fit a cluster file's efficiency terms to measured step times.

Input: a cluster file (a profile or a catalog name) and a YAML file of runs::

    - {plan: plans/a.yaml, measured_step_time_s: 1.84}
    - {plan: plans/b.yaml, measured_step_time_s: 2.31}

(plan paths relative to that file). Each plan is re-estimated on the given cluster with
``costmodel.training.estimate``; three factors are fitted, each only if some plan's prediction
depends on it:

* ``compute`` -- GEMM efficiency (``gpu.matmul_efficiency`` and the ``measured.matmul``
  table); a factor above 1 raises the peak instead (an efficiency stays <= 1);
* ``intra``, ``inter`` -- each tier's collective efficiency (the link's ``efficiency`` and
  that tier's ``measured.collectives`` bus bandwidths); above 1, the link bandwidth.

Fit: minimize the mean squared log error ``log(predicted / measured)`` plus a small pull of each
log-factor towards 0 (so a factor the runs cannot tell apart stays at 1), by Levenberg-Marquardt
on the log-factors (numeric Jacobian, each kept in [-3, 3]: factors 0.05 to 20). Writes the calibrated cluster file (provenance
gains a ``calibration`` entry: the runs, the factors, the error before and after) and reports
the error before and after. Exit codes: 0 done; 2 bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

HELP = "fit a cluster file's efficiency terms to measured step times of a few plans; report error before/after"

FACTORS = ("compute", "intra", "inter")
RIDGE = 1e-4                 # pull of each log-factor towards 0 (factor 1)
BOUND = 3.0                  # log-factor search range: factors from e^-3 (0.05) to e^3 (20)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, help="cluster file to calibrate (a profile, a YAML file or a catalog name)")
    p.add_argument("--measured", required=True, metavar="FILE",
                   help="YAML list of {plan: PATH, measured_step_time_s: S} (paths relative to this file)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="calibrated cluster file (default: <cluster>.calibrated.yaml beside the input)")
    p.add_argument("--fit", default=",".join(FACTORS),
                   help=f"factors to fit, comma-separated, from {', '.join(FACTORS)} (default: all)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


# --------------------------------------------------------------------------------------
# Pure part
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    name: str
    plan: Any                    # planner.plan.planfile.Plan
    measured_step_time_s: float


def _scale_link(link: Any, f: float) -> Any:
    eff = link.efficiency * f
    if eff <= 1.0:
        return dataclasses.replace(link, efficiency=eff)
    return dataclasses.replace(link, efficiency=1.0, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * eff)


def apply_factors(cluster: Any, factors: dict[str, float]) -> Any:
    """The cluster with the factors applied (see the module docstring)."""
    fc, fi, fx = (factors.get(k, 1.0) for k in FACTORS)
    groups = []
    for g in cluster.groups:
        gpu = g.gpu
        if fc <= 1.0:
            gpu = dataclasses.replace(gpu, matmul_efficiency=gpu.matmul_efficiency * fc)
        else:
            gpu = dataclasses.replace(gpu, peak_flops_per_s={k: v * fc for k, v in gpu.peak_flops_per_s.items()})
        groups.append(dataclasses.replace(g, gpu=gpu, intra_node=_scale_link(g.intra_node, fi)))
    table = cluster.matmul_table
    if fc <= 1.0:
        table = tuple((s, e * fc) for s, e in table)
    coll = tuple((t, op, n, b, bw * (fi if t == "intra" else fx)) for t, op, n, b, bw in cluster.collective_table)
    return dataclasses.replace(cluster, groups=tuple(groups), inter_node=_scale_link(cluster.inter_node, fx),
                               matmul_table=table, collective_table=coll)


def _sized(cluster: Any, world: int) -> Any:
    return cluster if cluster.total_gpus == world else cluster.with_gpus(world)


def predict(cluster: Any, runs: list[Run], factors: dict[str, float]) -> list[float]:
    from planner.cli.explain import plan_estimate
    c = apply_factors(cluster, factors)
    # each run's plan on the factored cluster, as its target runs it (the plan's own estimate was priced so)
    return [plan_estimate(dataclasses.replace(r.plan, cluster=_sized(c, r.plan.world_size))).step_time_s
            for r in runs]


def _errors(pred: list[float], runs: list[Run]) -> list[float]:
    return [p / r.measured_step_time_s - 1.0 for p, r in zip(pred, runs)]


def _residuals(cluster: Any, runs: list[Run], x: dict[str, float]) -> list[float]:
    pred = predict(cluster, runs, {k: math.exp(v) for k, v in x.items()})
    n = len(runs)
    return ([math.log(p / r.measured_step_time_s) / math.sqrt(n) for p, r in zip(pred, runs)]
            + [math.sqrt(RIDGE) * v for v in x.values()])


def _levenberg_marquardt(cluster: Any, runs: list[Run], names: list[str], iters: int = 60) -> dict[str, float]:
    """Minimize the sum of squared residuals over the log-factors (numeric Jacobian, steps
    clipped to the search range)."""
    import numpy as np
    x = np.zeros(len(names))

    def res(v: "np.ndarray") -> "np.ndarray":
        return np.array(_residuals(cluster, runs, dict(zip(names, v))))

    r = res(x)
    cost, lam = float(r @ r), 1e-2
    for _ in range(iters):
        h = 1e-5
        jac = np.stack([(res(x + h * np.eye(len(x))[j]) - r) / h for j in range(len(x))], axis=1)
        g, a = jac.T @ r, jac.T @ jac
        improved = False
        for _ in range(12):
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            xn = np.clip(x + step, -BOUND, BOUND)
            rn = res(xn)
            cn = float(rn @ rn)
            if cn < cost:
                improved = cost - cn > 1e-14
                x, r, cost, lam = xn, rn, cn, max(lam / 3, 1e-9)
                break
            lam *= 4
        if not improved:
            break
    return dict(zip(names, (float(v) for v in x)))


def calibrate(cluster: Any, runs: list[Run], fit: tuple[str, ...] = FACTORS) -> dict:
    """Fit the factors; returns ``{factors, active, inactive, before, after, cluster}``."""
    if not runs:
        raise ValueError("no runs to calibrate against")
    before = predict(cluster, runs, {})
    active, inactive = [], []
    for k in fit:                          # a factor no prediction depends on is not fitted
        moved = predict(cluster, runs, {k: 0.5})
        (active if any(abs(a / b - 1) > 1e-9 for a, b in zip(moved, before)) else inactive).append(k)
    x = _levenberg_marquardt(cluster, runs, active) if active else {}
    factors = {k: math.exp(v) for k, v in x.items()}
    after = predict(cluster, runs, factors)
    return {"factors": factors, "active": active, "inactive": inactive, "before": before, "after": after,
            "cluster": apply_factors(cluster, factors)}


def _summary(errors: list[float]) -> dict:
    a = [abs(e) for e in errors]
    return {"mean_abs_error": sum(a) / len(a), "max_abs_error": max(a),
            "rms_log_error": math.sqrt(sum(math.log(1 + e) ** 2 for e in errors) / len(errors))}


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------

def load_runs(path: Path) -> list[Run]:
    from planner.plan.errors import UsageError
    from planner.plan.planfile import read_plan
    from costmodel.files.readers import load_yaml
    data = load_yaml(path, "measured step times")     # bounded, UTF-8, no alias bomb, finite numbers
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    if not isinstance(data, list) or not data:
        raise UsageError(f"{path}: expected a list of {{plan: PATH, measured_step_time_s: S}}")
    runs = []
    for i, item in enumerate(data):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected a mapping with plan and measured_step_time_s")
        unknown = sorted(set(item) - {"plan", "measured_step_time_s", "name", "note"})
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: plan, measured_step_time_s, name, note")
        if "plan" not in item or "measured_step_time_s" not in item:
            raise UsageError(f"{where}: needs plan and measured_step_time_s")
        t = item["measured_step_time_s"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e9:
            raise UsageError(f"{where}: measured_step_time_s must be a positive number of seconds, got {t!r}")
        for k in ("plan", "name", "note"):
            if k in item and not isinstance(item[k], str):
                raise UsageError(f"{where}: {k} must be a string, got {type(item[k]).__name__}")
        ppath = Path(item["plan"])
        if not ppath.is_absolute():
            ppath = path.parent / ppath
        plan = read_plan(ppath)
        if plan.mode != "train":
            raise UsageError(f"{where}: {ppath} is a {plan.mode} plan; calibrate fits training step times")
        runs.append(Run(name=str(item.get("name") or ppath.stem), plan=plan, measured_step_time_s=float(t)))
    return runs


def _hardware(c: Any) -> list[tuple[str, int]]:
    return [(g.gpu.name, g.gpus_per_node) for g in c.groups]


def _check_same_hardware(cluster: Any, runs: list[Run], name: str) -> None:
    """Each run's plan was made for this cluster's hardware: the GPU and node size of every node
    group once the cluster is sized to the plan's world (as ``predict`` sizes it). A fit to runs
    on other hardware would be written as this cluster's and mislead every plan made from it."""
    from planner.plan.errors import UsageError
    for r in runs:
        got, want = _hardware(r.plan.cluster), _hardware(_sized(cluster, r.plan.world_size))
        if got != want:
            show = lambda hw: " + ".join(f"{n}/node x {g}" for g, n in hw)  # noqa: E731
            raise UsageError(f"run {r.name!r}: its plan was made for {r.plan.world_size} GPUs of "
                             f"{r.plan.cluster.name!r} ({show(got)}), not for --cluster {name} ({show(want)}); "
                             "calibrate a cluster with runs measured on it")


def run(args: argparse.Namespace) -> int:
    import datetime as _dt
    import json
    import sys

    import yaml

    from planner.plan.errors import UsageError
    from costmodel.files.clusters import cluster_to_dict, load_cluster

    fit = tuple(f.strip() for f in args.fit.split(",") if f.strip())
    bad = [f for f in fit if f not in FACTORS]
    if bad or not fit:
        raise UsageError(f"--fit {args.fit!r}: unknown factor(s) {', '.join(bad) or '(none given)'}; "
                         f"known: {', '.join(FACTORS)}")
    cluster = load_cluster(args.cluster)
    runs = load_runs(Path(args.measured))
    _check_same_hardware(cluster, runs, args.cluster)
    res = calibrate(cluster, runs, fit)
    eb, ea = _errors(res["before"], runs), _errors(res["after"], runs)
    src = Path(args.cluster)
    out = Path(args.out) if args.out else (src.with_name(f"{src.stem}.calibrated.yaml") if src.suffix in (".yaml", ".yml")
                                           else Path(f"{args.cluster}.calibrated.yaml"))
    d = cluster_to_dict(res["cluster"])
    raw_prov = {}
    if src.exists():
        try:
            raw_prov = (yaml.safe_load(src.read_text()) or {}).get("provenance") or {}
        except (OSError, yaml.YAMLError):
            raw_prov = {}
    d["source"] = "calibrated"
    d["provenance"] = dict(raw_prov)
    d["provenance"]["calibration"] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "from": str(args.cluster), "measured": str(args.measured),
        "factors": {k: round(v, 4) for k, v in res["factors"].items()},
        "not_fitted": {k: "no plan's prediction depends on it" for k in res["inactive"]},
        "runs": [{"name": r.name, "measured_step_time_s": r.measured_step_time_s,
                  "predicted_before_s": round(b, 6), "predicted_after_s": round(a, 6)}
                 for r, b, a in zip(runs, res["before"], res["after"])],
        "error_before": {k: round(v, 4) for k, v in _summary(eb).items()},
        "error_after": {k: round(v, 4) for k, v in _summary(ea).items()},
    }
    from costmodel.files.safeio import write_text
    write_text(out, "# Calibrated by `planner calibrate` (see provenance.calibration)\n"
               + yaml.safe_dump(d, sort_keys=False, default_flow_style=None, width=110), "calibrated cluster file")
    result = {"cluster": str(args.cluster), "out": str(out), "factors": res["factors"],
              "not_fitted": res["inactive"],
              "runs": [{"name": r.name, "world_size": r.plan.world_size, "measured_step_time_s": r.measured_step_time_s,
                        "predicted_before_s": b, "predicted_after_s": a, "error_before": e0, "error_after": e1}
                       for r, b, a, e0, e1 in zip(runs, res["before"], res["after"], eb, ea)],
              "error_before": _summary(eb), "error_after": _summary(ea)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    w = max(len(r.name) for r in runs)
    print(f"{'run':<{w}}  {'measured s':>10}  {'before s':>10}  {'err':>7}  {'after s':>10}  {'err':>7}")
    for r in result["runs"]:
        print(f"{r['name']:<{w}}  {r['measured_step_time_s']:>10.4g}  {r['predicted_before_s']:>10.4g}  "
              f"{r['error_before']:>+7.1%}  {r['predicted_after_s']:>10.4g}  {r['error_after']:>+7.1%}")
    print(f"mean |error|: {result['error_before']['mean_abs_error']:.1%} before, "
          f"{result['error_after']['mean_abs_error']:.1%} after; factors: "
          + ", ".join(f"{k} x{v:.3g}" for k, v in res["factors"].items())
          + (f"; not fitted (no effect): {', '.join(res['inactive'])}" if res["inactive"] else ""))
    print(f"calibrated cluster file: {out}", file=sys.stderr)
    return 0
