"""``planner emit``: write a plan's launch files for one target, or every target of its mode.

    planner emit PLAN --target NAME|all --out DIR [--force]
    planner emit --list [--json]

Writes each target's files and a README.md saying how to run them. Before anything is written
the plan passes the checks ``planner explain`` runs (else exit 1) and each target's table
(``planner.plan.targets``); a target that cannot run or express the plan refuses with the part
it cannot state and the ``planner plan --target T ...`` command that gives a plan it runs (exit
1); with ``--target all`` the others are still written, the README lists the refusals, and the
exit code is 4 (some written, some refused). Without ``--target``, the plan's own target. A bad
plan file or an unknown target is exit 2; so is an existing output folder holding files this
command would not write, or a file it would change, unless ``--force`` (with ``--force`` the
other files stay). The folder is written in one step (``costmodel.files.safeio.write_folder``): a run
killed at any point leaves the old folder or the new one, never a mix. No torch here: emitters
are pure text.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.cli.args import target_name
from planner.plan.errors import UsageError

HELP = "write launch files for a target (torchrun, slurm, kubernetes, megatron, deepspeed, ...) from a plan"


def add_arguments(p) -> None:
    p.add_argument("plan", nargs="?", help="plan file (YAML) written by `planner plan`")
    p.add_argument("--target", "-t", type=target_name, help="target name, or 'all' for every target of the plan's mode")
    p.add_argument("--out", "-o", help="output folder (created if missing)")
    p.add_argument("--force", action="store_true",
                   help="write into a folder that holds other files, replacing the files this command writes")
    p.add_argument("--launcher", "-l", choices=("torchrun", "slurm", "kubernetes"),
                   help="also write the file that starts a training framework's files on every node: a per-node "
                        "script (torchrun), an sbatch script (slurm) or a PyTorchJob (kubernetes)")
    g = p.add_argument_group("site options (--launcher slurm)")
    g.add_argument("--time", default="", help="sbatch --time, e.g. 04:00:00 or 2-00:00:00")
    g.add_argument("--partition", default="", help="sbatch --partition")
    g.add_argument("--account", default="", help="sbatch --account")
    g.add_argument("--exclusive", action="store_true", help="sbatch --exclusive (whole nodes)")
    p.add_argument("--list", action="store_true", help="list the targets and exit")
    p.add_argument("--json", action="store_true", help="with --list or after writing: machine-readable output")


def _targets():
    import emitters
    return [(name, emitters.get(name)) for name in emitters.names()]


def _list(as_json: bool) -> int:
    rows = [{"target": n, "mode": m.MODE, "format": m.FORMAT, "summary": m.SUMMARY} for n, m in _targets()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["target"]) for r in rows)
    for r in rows:
        print(f"{r['target']:<{width}}  {r['mode']:<5}  {r['summary']}")
        print(f"{'':<{width}}         format: {r['format']}")
    return 0


def _readme(plan, written: dict[str, list[str]], refused: dict[str, str], skipped: list[str]) -> str:
    from emitters import get
    from emitters.base import describe
    lines = ["# Launch files", "", f"Written by `planner emit` for the plan: {describe(plan)}.", ""]
    disaggregated = bool((plan.serving or {}).get("disaggregation"))
    for name, files in written.items():
        mod = get(name)
        run = getattr(mod, "RUN_DISAGGREGATED", mod.RUN) if disaggregated else mod.RUN     # what these files run
        lines += [f"## {name}", "", f"Format: {mod.FORMAT}.", "",
                  "Files: " + ", ".join(f"`{f}`" for f in files) + ".", "", run, ""]
    lines += _expectation(plan)
    if refused:
        lines += ["## Targets that cannot express this plan", ""]
        lines += [f"- **{name}**: {msg}" for name, msg in refused.items()]
        lines.append("")
    if skipped:
        other = "inference" if plan.mode == "train" else "training"
        lines += [f"Not applicable to a {plan.mode} plan ({other} targets): {', '.join(skipped)}.", ""]
    return "\n".join(lines)


def _expectation(plan) -> list[str]:
    """What the plan predicts for a training step, with its out-of-source range and warnings
    (``report.plan_credibility``), for a user to hold the first steps against; nothing for a serving
    plan or a plan file without a training estimate."""
    from costmodel.units import fmt_seconds
    from planner.cli.report import mfu_words, plain_credibility_lines, plan_credibility
    est = plan.estimate or {}
    if plan.mode != "train" or "mfu" not in est or "step_time_s" not in est:
        return []
    cred = plan_credibility(plan, est["step_time_s"], est["mfu"])
    how = f" as {plan.target} runs it" if plan.target else ""
    tok = f", {est['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU" if "tokens_per_s_per_gpu" in est else ""
    lines = ["## What to expect", "",
             f"The plan's prediction{how}: a step of {fmt_seconds(est['step_time_s'])}{tok}, "
             f"{mfu_words(est['mfu'], cred['mfu_causal'])} "
             "(priced when the plan was made). Hold the steps after warm-up against it; `planner estimate --plan "
             "PLAN --target NAME` prices the plan as another target runs it.", ""]
    lines += ["- " + line for line in plain_credibility_lines(cred)]
    return lines + [""]


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check_out(out: Path, files: dict[str, str], force: bool, subfolders: frozenset = frozenset()) -> None:
    """Refuse, before writing anything: a folder holding other files, or a file this command
    would change (unless ``force``); a link, FIFO or device where a file goes (always)."""
    from costmodel.files.safeio import check_output, check_output_folder
    if out.exists() and not out.is_dir() and not out.is_symlink():
        raise UsageError(f"--out {out} exists and is not a folder")
    check_output_folder(out, "--out")
    for name in files:
        check_output(out / name, "--out")
    if not out.exists() or force:
        return
    others = sorted(p.name for p in out.iterdir() if p.name not in files and p.name not in subfolders)
    if others:
        raise UsageError(f"--out {out} already holds other files ({_shown(others)}); choose an empty folder or "
                         "pass --force to write into it")
    changed = []
    for name, text in files.items():
        try:
            same = (out / name).read_bytes() == text.encode("utf-8")
        except FileNotFoundError:
            continue
        except OSError:
            same = False
        if not same:
            changed.append(name)
    if changed:
        raise UsageError(f"--out {out} already holds {_shown(sorted(changed))}, which this plan would change; "
                         "pass --force to replace them, or choose another folder")


def _emit_one(plan, name: str, mod, args, site: dict) -> dict[str, str]:
    """The target's files; with ``--launcher``, composed with the launcher's (``emitters.compose``);
    ``--target slurm`` takes the site options itself."""
    import emitters
    if name == "slurm" and not args.launcher:
        from emitters.slurm import Site
        return _site_checked(lambda: mod.emit(plan, Site(**site)))
    out = mod.emit(plan)
    if not args.launcher:
        return out
    return _site_checked(lambda: emitters.compose(plan, name if name != "torchrun" else "builtin", args.launcher,
                                                  out, **site))


def _site_checked(make):
    from emitters import CannotExpress
    try:
        return make()
    except CannotExpress:
        raise
    except ValueError as e:          # a site option Slurm does not accept: bad input, exit 2
        raise UsageError(str(e)) from None


def run(args) -> int:
    from emitters import TARGETS, CannotExpress
    from planner.plan.planfile import read_plan

    if args.list:
        return _list(args.json)
    from planner.cli import emit_checks
    if not args.plan:
        raise UsageError("give a plan file (or --list to see the targets)")
    if args.target and args.target != "all" and args.target not in TARGETS:
        from planner.plan.targets import stand_in_hint
        raise UsageError(f"unknown target {args.target!r}; targets: {', '.join(TARGETS)}, all"
                         f"{stand_in_hint(args.target, tuple(TARGETS))}")
    if not args.out:
        raise UsageError("give --out DIR for the files")
    plan = read_plan(args.plan)   # PlanError -> exit 2, naming the problem
    if not args.target:
        args.target = emit_checks.default_target(plan)
        if not args.target:
            raise UsageError(f"give --target: one of {', '.join(TARGETS)}, or all (the plan names no target "
                             "with launch files of its own)")
    emit_checks.require_valid(plan, args.plan)    # the checks explain runs: exit 1 before anything is written

    site = {"time": args.time, "partition": args.partition, "account": args.account, "exclusive": args.exclusive}
    if any(site.values()) and args.launcher != "slurm" and args.target != "slurm":
        raise UsageError("--time, --partition, --account and --exclusive are sbatch options: give them with "
                         "--launcher slurm (or --target slurm)")
    if args.launcher and args.target == "all":
        raise UsageError("--launcher starts one framework's files: give --target NAME (a training framework)")
    names = list(TARGETS) if args.target == "all" else [args.target]
    files: dict[str, str] = {}
    written: dict[str, list[str]] = {}
    refused: dict[str, str] = {}
    skipped: list[str] = []
    per_target: dict[str, dict[str, str]] = {}
    for name, mod in _targets():
        if name not in names:
            continue
        if args.target == "all" and mod.MODE != plan.mode:
            skipped.append(name)
            continue
        why = emit_checks.refusal(name, plan, args.plan)     # the target's table
        if why:
            refused[name] = why
            continue
        try:
            out = _emit_one(plan, name, mod, args, site)
        except CannotExpress as e:
            refused[name] = emit_checks.with_command(str(e), name, plan, args.plan)
            continue
        per_target[name] = out
        written[name] = list(out)

    if not written:
        for msg in refused.values():
            print(f"planner emit: {msg}", file=sys.stderr)
        return 1
    out_dir = Path(args.out)
    from costmodel.files.safeio import write_folder
    # with --target all, two targets may write the same file name (a disaggregated serving plan: vllm and
    # sglang both write prefill.sh and decode.sh); then each target gets its own folder under --out
    clash = sorted({f for a, fa in per_target.items() for b, fb in per_target.items() if a < b
                    for f in fa.keys() & fb.keys() if fa[f] != fb[f]})
    if clash:
        written = {name: [f"{name}/{f}" for f in fl] for name, fl in written.items()}
        top = {"README.md": _readme(plan, written, refused, skipped)}
        for name, fl in per_target.items():
            _check_out(out_dir / name, fl, args.force)
        _check_out(out_dir, top, args.force, frozenset(per_target))
        for name, fl in per_target.items():
            write_folder(out_dir / name, fl, executable={f for f in fl if f.endswith((".sh", ".sbatch"))},
                         what="--out")
        write_folder(out_dir, top, what="--out")
        print(f"planner emit: {', '.join(per_target)} write files of the same names ({_shown(clash)}): each "
              f"target's files are in its own folder under {out_dir}", file=sys.stderr)
    else:
        for fl in per_target.values():
            files.update(fl)
        files["README.md"] = _readme(plan, written, refused, skipped)
        _check_out(out_dir, files, args.force)
        write_folder(out_dir, files, executable={f for f in files if f.endswith((".sh", ".sbatch"))}, what="--out")
    if args.json:
        print(json.dumps({"out": str(out_dir), "written": written, "refused": refused, "skipped": skipped},
                         indent=2))
    else:
        for name, paths in written.items():
            print(f"{name}: {', '.join(str(out_dir / f) for f in paths)}")
    for name, msg in refused.items():
        print(f"planner emit: {msg}", file=sys.stderr)
    for name in written:
        note = emit_checks.note_target(plan, name)
        if note:
            print(f"planner emit: {name}: {note}", file=sys.stderr)
    return (emit_checks.PARTIAL if args.target == "all" else 1) if refused else 0
