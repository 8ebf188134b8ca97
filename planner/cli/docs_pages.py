"""The generated parts of the README and the reference pages under ``docs/``.

Each page is prose written by hand with blocks generated from the code between markers
``<!-- gen:NAME -->`` and ``<!-- /gen:NAME -->``: the commands' help, the catalog, the file keys,
the uncertainty bands, the validation summaries, the targets' cell legend, the layering of the
packages, the quick start's measured figures, the index of pages. ``python -m
planner.cli.docs_pages --write`` regenerates every block; ``--check`` exits 1 naming the stale
ones (``tests/test_docs_pages.py`` runs it). Nothing here runs the solver: every block is cheap.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/commands.md", "docs/file-formats.md", "docs/cost-model.md", "docs/validation.md",
         "docs/targets.md", "docs/serving.md", "docs/failures.md", "docs/architecture.md")
MARK = re.compile(r"(<!-- gen:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /gen:(?P=name) -->)", re.S)
GIB = 2**30


def _table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right or set()
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------

def commands_help() -> str:
    """``planner COMMAND --help`` of every command, at 100 columns."""
    from planner.cli import build_parser
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        out = []
        for name, sp in sub.choices.items():
            buf = io.StringIO()
            with redirect_stdout(buf):
                sp.print_help()
            text = buf.getvalue().replace("usage: planner " + name, "usage: planner " + name)
            out += [f"### `planner {name}`", "", "```", text.rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def command_list() -> str:
    from planner.cli import COMMANDS, build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = [[f"[`planner {n}`](docs/commands.md#planner-{n})", sub.choices[n].description or ""]
            for n in COMMANDS if n in sub.choices]
    return _table(["command", "does"], rows)


def _flags(command: str, group: str | None = None, names: tuple[str, ...] = ()) -> str:
    """A table of a command's flags (one argument group, or the named flags) and their help."""
    from planner.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = []
    for g in sub.choices[command]._action_groups:
        if group is not None and not (g.title or "").startswith(group):
            continue
        for a in g._group_actions:
            if not a.option_strings or (names and not set(a.option_strings) & set(names)):
                continue
            metavar = "" if a.nargs == 0 else " " + (a.metavar or (a.dest.upper() if not a.choices else
                                                                   "|".join(map(str, a.choices))))
            rows.append([f"`{a.option_strings[-1]}{metavar}`", (a.help or "").replace("%%", "%")])
    return _table(["flag", "what it does"], rows)


def serving_flags() -> str:
    return _flags("plan", "serving")


def failure_flags() -> str:
    return ("`planner plan` and `planner explain` (the goodput report):\n\n" + _flags("plan", "failures")
            + "\n`planner launch` (running, checkpoints, failures):\n\n"
            + _flags("launch", None, ("--checkpoint-dir", "--checkpoint-every", "--resume", "--async-checkpoint",
                                      "--max-restarts", "--on-failure", "--dead-after", "--inject-failure",
                                      "--straggler-factor", "--straggler-steps", "--on-straggler", "--nnodes",
                                      "--node-rank", "--rdzv-endpoint")))


def catalog_clusters() -> str:
    from profiles.clusters import cluster_names, load_cluster
    rows = []
    for n in cluster_names():
        c = load_cluster(n)
        for g in c.groups:
            gpu = g.gpu
            rows.append([f"`{n}`" + (f" ({g.name})" if len(c.groups) > 1 else ""), gpu.name, str(g.gpus_per_node),
                         str(g.nodes), f"{gpu.memory_bytes / GIB:.0f}",
                         f"{gpu.peak_flops_per_s.get('bf16', 0) / 1e12:,.0f}" if isinstance(gpu.peak_flops_per_s, dict)
                         else "", f"{g.intra_node.bandwidth_bytes_per_s / 1e9:,.0f}",
                         f"{c.inter_node.bandwidth_bytes_per_s / 1e9:,.1f}" if c.inter_node else ""])
    return _table(["name", "GPU", "GPUs/node", "nodes", "GiB", "bf16 TFLOP/s", "intra-node GB/s", "inter-node GB/s"],
                  rows, {2, 3, 4, 5, 6, 7})


def catalog_models() -> str:
    from costmodel.catalog import MODELS, get_model, hf_id
    rows = []
    for n in sorted(MODELS):
        m = get_model(n)
        pub = MODELS[n].get("published_params")
        rows.append([f"`{n}`", m.family, str(m.layers), str(m.hidden), f"{m.heads}/{m.kv_heads}",
                     str(m.num_experts) + (f" (top {m.top_k})" if m.num_experts else "") if m.is_moe else "",
                     f"{pub / 1e9:,.1f}B" if pub else "", f"`{hf_id(n)}`" if hf_id(n) else ""])
    return _table(["name", "family", "layers", "hidden", "heads/kv", "experts", "params", "Hugging Face id"], rows,
                  {2, 3})


def cluster_keys() -> str:
    import profiles.clusters as C
    rows = [["top level", ", ".join(f"`{k}`" for k in sorted(C._TOP_KEYS))],
            ["`gpu:`", ", ".join(f"`{k}`" for k in sorted(C._GPU_KEYS))],
            ["`intra_node:`, `inter_node:`", ", ".join(f"`{k}`" for k in sorted(C._LINK_KEYS))],
            ["`groups:` (each)", ", ".join(f"`{k}`" for k in sorted(C._GROUP_KEYS))],
            ["`storage:`", ", ".join(f"`{k}`" for k in sorted(C._STORAGE_KEYS))],
            ["`reliability:`", ", ".join(f"`{k}`" for k in sorted(C._RELIABILITY_KEYS))]]
    return _table(["where", "keys (anything else is refused, with a did-you-mean)"], rows)


def model_fields() -> str:
    import dataclasses

    from costmodel.specs import ModelSpec
    rows = []
    for f in dataclasses.fields(ModelSpec):
        default = "" if f.default is dataclasses.MISSING else repr(f.default)
        rows.append([f"`{f.name}`", default or "(required)"])
    return _table(["field", "default"], rows)


def plan_keys() -> str:
    from planner.plan.planfile import read_plan
    plan = read_plan(ROOT / "plans" / "llama-3-70b-64xh100.yaml")
    from planner.plan.planfile import plan_to_dict
    d = plan_to_dict(plan)
    rows = [[f"`{k}`", type(v).__name__ if not isinstance(v, dict) else "mapping: " + ", ".join(
        f"`{x}`" for x in list(v)[:12]) + (", ..." if len(v) > 12 else "")] for k, v in d.items()]
    return _table(["key", "holds"], rows)


def uncertainty_table() -> str:
    from costmodel.uncertainty import KINDS, QUANTILE, bands
    b = bands()
    rows = [[f"`{k}`", f"±{b[k].band * 100:.1f}%", str(b[k].n), b[k].source] for k in KINDS]
    return (f"The {QUANTILE * 100:.0f}th percentile of the absolute relative error over each kind's validation rows "
            "(`costmodel/uncertainty_bands.yaml`, written by `python -m planner.cli.uncertainty_bands --write`):\n\n"
            + _table(["kind", "band", "rows", "from"], rows, {1, 2}))


_SUMMARY = re.compile(r"Median absolute error ([\d.]+%), largest ([\d.]+%) over (\d+) figures")


def _section_summaries(path: Path) -> list[list[str]]:
    """(section, figures, median, largest) of every section of a validation file that ends in its
    "Median absolute error ..., largest ... over N figures." line."""
    rows, title = [], ""
    for ln in path.read_text().splitlines():
        if ln.startswith("## "):
            title = ln[3:].strip()
        m = _SUMMARY.search(ln)
        if m and title:
            rows.append([title, m.group(3), m.group(1), m.group(2)])
    return rows


def validation_summary() -> str:
    """Every section's summary line of the two validation files (each regenerated by its command
    and checked for staleness by its own test), as one table each."""
    train = ROOT / "costmodel" / "VALIDATION.md"
    infer = ROOT / "costmodel" / "VALIDATION_INFERENCE.md"
    out = ["Training (`costmodel/VALIDATION.md`, written by `planner validate --write costmodel/VALIDATION.md`):", "",
           _table(["section", "figures", "median error", "largest"], _section_summaries(train), {1, 2, 3})]
    out += ["Serving (`costmodel/VALIDATION_INFERENCE.md`, written by `python -m planner.cli.validation_inference "
            "--write-validation costmodel/VALIDATION_INFERENCE.md`):", "",
            _table(["section", "figures", "median error", "largest"], _section_summaries(infer), {1, 2, 3})]
    out += [ln for ln in infer.read_text().splitlines() if ln.startswith("Over ") and "rows" in ln]
    return "\n".join(out).rstrip() + "\n"


def validation_by_framework() -> str:
    """The per-framework table of ``costmodel/VALIDATION.md`` as ``planner validate`` writes it."""
    text = (ROOT / "costmodel" / "VALIDATION.md").read_text().splitlines()
    start = next((i for i, ln in enumerate(text) if ln.startswith("|") and "framework" in ln.lower()
                  and i > 0 and "by framework" in "\n".join(text[max(0, i - 4):i]).lower()), None)
    if start is None:
        return "(no per-framework table in costmodel/VALIDATION.md)\n"
    end = start
    while end < len(text) and text[end].startswith("|"):
        end += 1
    return "\n".join(text[start:end]) + "\n"


COMPACT_LEGEND = [
    ("`tp4 pp2 dp8`", "tensor-, pipeline- and data-parallel degrees (`--tp`, `--pp`, `--dp`)"),
    ("`cp2`, `ep8`", "context- and expert-parallel degrees, shown when above 1"),
    ("`z1`", "ZeRO stage 0-3 (`--zero`): 0 plain data parallel, 1 optimizer states, 2 + gradients, 3 + weights (FSDP)"),
    ("`z3/2`", "ZeRO-3 sharded over groups of 2 of the data-parallel ranks, replicated across groups (HSDP, "
               "`--dp-shard 2`)"),
    ("`sp`", "sequence parallelism with tensor parallelism"),
    ("`vpp4`", "4 virtual pipeline stages per rank (interleaved 1F1B)"),
    ("`mb1`", "micro-batch size (`--micro-batch`)"),
    ("`none`, `selective`, `full`", "activation recomputation (`--recompute`)"),
    ("`full/1`", "full recomputation of the first 1 layer(s) of every stage (Megatron-LM's block method, "
                 "`--recompute-layers 1`)"),
    ("`[10 9/2 ...]`", "layers per pipeline stage; `/2`: that stage recomputes 2 of them"),
]


def targets_legend() -> str:
    """What the compact plan cells of the targets tables mean (``targets_table.compact``); the test
    checks every token kind ``compact`` can print is explained here."""
    return _table(["cell", "means"], [[a, b] for a, b in COMPACT_LEGEND])


def layering() -> str:
    """The import layers, as ``tests/test_imports.py`` enforces them."""
    tree = ast.parse((ROOT / "tests" / "test_imports.py").read_text())
    layers = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.AnnAssign)
                  and getattr(n.target, "id", "") == "LAYERS")
    rows = [[f"`{k}`", ", ".join(f"`{x}`" for x in sorted(v)) or "nothing of ours"] for k, v in layers.items()]
    return _table(["package", "may import"], rows)


def quickstart_figures() -> str:
    """The quick start's times and sizes, as ``bench/bench_quickstart.py`` measured them."""
    path = ROOT / "bench" / "results" / "quickstart.json"
    if not path.exists():
        return "(not measured yet: run `python bench/bench_quickstart.py --write bench/results/quickstart.json`)\n"
    q = json.loads(path.read_text())
    m = q["machine"]

    def t(key: str) -> str:
        s = q[key]["wall_s"]
        return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"

    def gb(key: str) -> str:
        v = q.get(key)
        return f"{v / 1e9:.2f} GB" if v else "not measured"
    rows = [["`git clone`", t("clone"), f"{gb('checkout_bytes')} checkout + {gb('git_bytes')} history"],
            ["`make setup` (creates `.venv`)", t("setup"), f"`.venv` {gb('venv_bytes')}"],
            ["`make demo` (after setup)", t("demo"), "writes `out/demo/`"],
            ["the tour's `planner plan` (64 H100s)", t("first_plan"), ""],
            ["`make test-fast` (no process, no solver)", t("test_fast"), f"{q.get('tests_collected') or '?'} tests in "
             "the suite, the fast tier a part of them"],
            ["`make targets-env` (frameworks' own parsers, for `make test`)",
             t("targets_env") if q.get("targets_env") else "not timed", f"`.venv-targets` {gb('targets_env_bytes')}"]]
    return (f"Measured by `python bench/bench_quickstart.py` on {q['started'][:10]}: a fresh clone on {m['cpus']} "
            f"CPU cores, {m['memory_bytes'] / 2**30:.0f} GiB, Python {m['python']}, load average "
            f"{m['load_average_start'][0]:.1f} at the start (a shared machine: upper bounds).\n\n"
            + _table(["step", "time", "size"], rows, {1}))


def docs_index() -> str:
    rows = []
    for page in PAGES[1:]:
        text = (ROOT / page).read_text().splitlines() if (ROOT / page).exists() else [""]
        title = text[0].lstrip("# ").strip()
        blurb = next((ln for ln in text[1:] if ln.strip() and not ln.startswith(("#", "<!--"))), "")
        rows.append([f"[{title}]({page})", blurb])
    return _table(["page", "what is in it"], rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "commands-help": commands_help, "command-list": command_list, "catalog-clusters": catalog_clusters,
    "catalog-models": catalog_models, "cluster-keys": cluster_keys, "model-fields": model_fields,
    "plan-keys": plan_keys, "uncertainty": uncertainty_table, "validation-summary": validation_summary,
    "validation-by-framework": validation_by_framework, "targets-legend": targets_legend, "layering": layering,
    "quickstart-figures": quickstart_figures, "docs-index": docs_index, "serving-flags": serving_flags,
    "failure-flags": failure_flags,
}


def render(text: str, where: str = "") -> str:
    """``text`` with every generated block rewritten."""
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in BLOCKS:
            raise SystemExit(f"{where}: unknown generated block {name!r}; known: {', '.join(BLOCKS)}")
        return m.group(1) + BLOCKS[name]() + m.group(4)
    return MARK.sub(sub, text)


def stale() -> list[str]:
    """The pages whose generated blocks differ from what the code gives now."""
    out = []
    for page in PAGES:
        p = ROOT / page
        if not p.exists():
            out.append(f"{page} (missing)")
            continue
        text = p.read_text()
        if render(text, page) != text:
            out.append(page)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.cli.docs_pages", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the generated blocks of every page")
    ap.add_argument("--check", action="store_true", help="exit 1 naming the pages whose blocks are stale")
    a = ap.parse_args(argv)
    if a.write:
        for page in PAGES:
            p = ROOT / page
            if p.exists():
                new = render(p.read_text(), page)
                if new != p.read_text():
                    p.write_text(new)
                    print(f"wrote {page}", file=sys.stderr)
        return 0
    bad = stale()
    if bad:
        print("stale generated blocks in: " + ", ".join(bad) + "; run python -m planner.cli.docs_pages --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
