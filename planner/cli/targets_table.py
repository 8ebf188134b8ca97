"""Tables about execution targets: what each runs (the capability tables of
``planner.plan.targets``, side by side) and the best plan of each target side by side, with why
the others lose (``planner plan --target all``; the demo prints both)."""
from __future__ import annotations

from typing import Any, Sequence

from planner.plan import targets as T
from costmodel.units import GIB


def model_error(model) -> float:
    """The cost model's out-of-source band for this model's kind (``costmodel.uncertainty``, written by
    ``planner validate --cross --write-bands``): plans closer than this are not told apart by it."""
    from costmodel.uncertainty import relative_band
    return relative_band("train-moe" if model.is_moe else "train-dense")


# --------------------------------------------------------------------------------------
# The capability tables as rows (moved from planner.plan.targets: printing is the command line's)
# --------------------------------------------------------------------------------------

FEATURES = (
    ("zero", "ZeRO without PP"), ("zero_pp", "ZeRO with PP"), ("hsdp", "HSDP"), ("cp", "context parallel"),
    ("ep", "expert parallel"), ("expert_tp", "expert TP"), ("vpp", "virtual stages"),
    ("split", "stage split"), ("recompute", "recompute"), ("recompute_block", "recompute N per stage"),
    ("recompute_per_stage", "per-stage recompute"), ("sp", "sequence parallel"), ("schedules", "schedules"),
    ("orders", "rank orders"), ("dtypes", "dtypes"), ("models", "models"), ("heterogeneous", "node groups"),
)


def _value(t: T.TrainTarget, key: str) -> str:
    v = {"models": None}.get(key, getattr(t, key, None))
    if key == "models":
        no = [k for k, ok in (("MLA", t.mla), ("MoE", t.moe), ("ALiBi", t.alibi)) if not ok]
        return "no " + ", ".join(no) if no else "any"
    if key == "cp":
        return f"yes, seq % {t.cp_seq_text}" if t.cp else "no"
    if key == "vpp":
        return ("no" if not t.vpp else "yes" + (", even split" if t.vpp_split == "even" else
                                                ", end stages may leave one to the embedding or the loss"
                                                if t.vpp_split == "ends" else "")
                + (", M % pp == 0" if t.microbatches == "megatron" else ""))
    if key == "orders":
        return "any" if v is None else " | ".join(",".join(o) for o in v)
    if key == "sp":
        return {"optional": "optional", "with_tp": "always with TP", "never": "no"}[v]
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, frozenset):
        return T._stages(v) if v and all(isinstance(x, int) for x in v) else (", ".join(sorted(v)) or "none")
    return str(v)


def table_rows(name: str) -> list[tuple[str, str, str]]:
    """``(feature, value, source)`` rows of a training target's table (each variant's in turn)."""
    t = T.TRAIN[name]
    tables = [(label, sub) for label, _, sub in t.variants] or [("", t)]
    rows = []
    for label, sub in tables:
        if label:
            rows.append(("backend", label, ""))
        for key, title in FEATURES:
            src = sub.sources.get(key, "")
            rows.append((title, _value(sub, key), src))
    return rows


def summary(name: str) -> dict[str, str]:
    """A training target's table in one short value per feature (the side-by-side table)."""
    t = T.TRAIN[name]
    subs = [sub for _, _, sub in t.variants] or [t]
    out = {}
    for key, title in FEATURES:
        vals = [_value(s, key) for s in subs]
        out[title] = vals[0] if len(set(vals)) == 1 else " / ".join(vals)
    return out


def short_reasons(target: str, plan) -> list[str]:
    """Why ``target`` could not run ``plan`` (another target's plan), one short clause each:
    the part of each problem before its explanation (``cp=2``, ``ZeRO-2 with pp=4``, ...)."""
    out = []
    for msg in T.problems(target, plan):
        body = msg.split(": ", 1)[1] if ": " in msg else msg
        clause = body.split(": ", 1)[0]
        if clause not in out:
            out.append(clause)
    return out


def compact(par) -> str:
    """Degrees in a few characters: ``tp4 pp2 dp8 cp2 z3 sp vpp4 mb1 full/2``."""
    parts = [f"tp{par.tp}", f"pp{par.pp}", f"dp{par.dp}"]
    parts += [f"cp{par.cp}"] if par.cp > 1 else []
    parts += [f"ep{par.ep}"] if par.ep > 1 else []
    parts += [par.moe_dispatcher] if par.moe_dispatcher else []
    parts += ["ep-overlap"] if par.ep_overlap else []
    parts.append(f"z{par.zero}" + (f"/{par.dp_shard}" if par.hsdp else ""))
    parts += ["sp"] if par.sp else []
    parts += [f"vpp{par.vpp}"] if par.vpp > 1 else []
    parts += [f"mb{par.micro_batch}"]
    rc = par.recompute + (f"/{par.recompute_layers}" if par.recompute == "full" and par.recompute_layers >= 0 else "")
    parts.append(rc)
    return " ".join(parts)


def print_capabilities(names: Sequence[str] | None = None, console=None) -> None:
    """The training targets' tables side by side: one row per feature, one column per target."""
    from rich.table import Table

    from planner.cli.report import console as make_console
    c = console or make_console()
    names = list(names or T.TRAIN_TARGETS)
    rows = {n: summary(n) for n in names}
    t = Table(title="what each training target runs (planner/plan/targets.py; sources there)", header_style="bold")
    t.add_column("feature", overflow="fold")
    for n in names:
        t.add_column(n, overflow="fold")
    for _, title in FEATURES:
        t.add_row(title, *[rows[n][title] for n in names])
    c.print(t)


def rows_json(results: list, plans: dict[str, list], best_plan) -> list[dict[str, Any]]:
    """One row per target (best first): its best plan's figures, or why it has none."""
    out = []
    best = best_plan.estimate["step_time_s"] if best_plan is not None else None
    for r in results:
        row: dict[str, Any] = {"target": r.target}
        if r.result is None:
            row.update(plan=None, error=r.error)
        else:
            p = plans[r.target][0]
            e = p.estimate
            row.update(step_time_s=e["step_time_s"], mfu=e["mfu"], peak_bytes=e["memory"]["peak_bytes"],
                       vs_best=e["step_time_s"] / best - 1 if best else 0.0,
                       cannot_run_best=short_reasons(r.target, best_plan) if p is not best_plan else [])
        out.append(row)
    return out


def print_side_by_side(results: list, plans: dict[str, list], console=None) -> None:
    """Each target's best plan: degrees, step time, MFU, peak memory, and why it loses."""
    from rich.markup import escape
    from rich.table import Table

    from planner.cli.report import console as make_console
    c = console or make_console()
    ok = [r for r in results if r.result is not None]
    best_plan = plans[ok[0].target][0] if ok else None
    t = Table(title="the best plan of each target (best first)", header_style="bold",
              caption=escape("plan: degrees [layers/recomputed per stage]; why it loses: what it cannot run of the "
                             "best plan"))
    for col in ("target", "plan", "step", "MFU", "peak mem", "vs best", "why it loses"):
        t.add_column(col, justify="right" if col in ("step", "MFU", "peak mem", "vs best") else "left",
                     overflow="fold")
    for r in results:
        if r.result is None:
            t.add_row(r.target, "[red]no plan[/red]", "", "", "", "", escape(r.error))
            continue
        p = plans[r.target][0]
        e = p.estimate
        step = e["step_time_s"]
        rel = step / best_plan.estimate["step_time_s"] - 1
        why = "" if p is best_plan else "; ".join(short_reasons(r.target, best_plan)) or "its own profile"
        where = f" on {p.cluster.name}" if ":" in p.cluster.name else ""
        split = " ".join(f"{x.num_layers}" + (f"/{x.recompute_layers}" if x.recompute_layers else "")
                         for x in p.stages) if p.parallel.pp > 1 else ""
        t.add_row(r.target, escape(compact(p.parallel) + where + (f" [{split}]" if split else "")), f"{step:.3f} s",
                  f"{e['mfu'] * 100:.1f}%",
                  f"{e['memory']['peak_bytes'] / GIB:.1f} GiB", "best" if p is best_plan else f"+{rel * 100:.1f}%",
                  escape(why))
    c.print(t)
    if not ok:
        return
    band = model_error(best_plan.model)
    near = [r.target for r in ok[1:] if plans[r.target][0].estimate["step_time_s"]
            <= best_plan.estimate["step_time_s"] * (1 + band)]
    if near:
        names = [ok[0].target] + near
        c.print(f"[yellow]the plans of {', '.join(names[:-1])} and {names[-1]} are within the cost model's error "
                f"(+/-{band * 100:.0f}%, out of source) of each other: it does not tell them apart; pick by what you run."
                "[/yellow]")
