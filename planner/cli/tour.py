"""The README's five-minute tour, and the command that keeps it true.

``python -m planner.cli.tour --write README.md`` (``make readme``) runs each command of the tour in a
scratch folder, exactly as a user would type it (``planner ...``; stdout and stderr together, as
a terminal shows them, not a terminal, so tables print whole), and rewrites the README between
the markers ``<!-- tour:begin -->`` and ``<!-- tour:end -->``. ``--check README.md`` runs the tour
and exits 1 with a diff when the README no longer shows what the commands print, modulo what
differs run to run (``normalise``: wall times, and the measured side of ``planner launch``).
``--screenshot DIR`` also renders the tour's HTML report with headless Chromium into DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BEGIN, END = "<!-- tour:begin -->", "<!-- tour:end -->"


@dataclasses.dataclass(frozen=True)
class Step:
    title: str
    text: str
    args: tuple[str, ...]
    measured: bool = False     # its numbers are measurements of this machine (normalised away)


STEPS = (
    Step("1. `planner estimate`: the cost model for one configuration you choose",
         "Llama 3 70B on 64 H100s, 512 sequences of 8,192 tokens, split tp=8 x pp=2 with selective "
         "recomputation: memory per GPU and step time, term by term.",
         ("estimate", "--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
          "--seq-len", "8192", "--tp", "8", "--pp", "2", "--recompute", "selective")),
    Step("2. `planner plan`: the best configuration, proven, for each framework",
         "The same job with nothing fixed: for each training framework (Megatron-LM, torchtitan, DeepSpeed, "
         "Accelerate, the built-in runtime) the solver searches every split that framework runs, priced as "
         "it runs it, and proves the best (OPTIMAL: no plan it runs is faster under the cost model). The "
         "plans side by side, what each cannot run of the best one, and the best written as the plan file "
         "(`--target T` plans for one framework; `--out DIR` writes one file per framework).",
         ("plan", "--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
          "--seq-len", "8192", "--out", "plan.yaml")),
    Step("3. `planner explain`: why this plan",
         "Where the time and memory go, what separates it from the runner-up, and what would change the "
         "answer; `--html` writes the report with charts (a screenshot is below).",
         ("explain", "plan.yaml", "--html", "report.html")),
    Step("4. `planner emit`: the files that run it",
         "Launch files for every training target; a target that cannot run or express the plan refuses, "
         "says why and gives the command that plans for it, rather than write something that would run "
         "differently (exit 4: some written, some refused).",
         ("emit", "plan.yaml", "--target", "all", "--out", "launch")),
    Step("5. `planner launch`: run a plan here",
         "A plan for this machine (tiny-llama on two CPU processes standing in for GPUs), run for a few "
         "steps with the built-in runtime, predicted against measured.",
         ("plan", "--model", "tiny-llama", "--cluster", "cpu", "--gpus", "2", "--global-batch", "8",
          "--seq-len", "128", "--target", "builtin", "--out", "tiny.yaml")),
    Step("", "", ("launch", "tiny.yaml", "--steps", "5"), measured=True),
)


def run_steps(workdir: Path, steps=STEPS) -> list[tuple[Step, str]]:
    """Each step's output (stdout and stderr as they interleave), run in ``workdir``."""
    env = {**os.environ, "COLUMNS": "80"}      # what a narrow terminal would give; tables ignore it off a TTY
    env.pop("FORCE_COLOR", None)
    out = []
    for s in steps:
        r = subprocess.run([sys.executable, "-m", "planner", *s.args], cwd=workdir, env=env, timeout=600,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode not in (0, 1, 4):   # emit --target all exits 4 when some targets refuse
            raise RuntimeError(f"planner {' '.join(s.args)} exited {r.returncode}:\n{r.stdout}")
        out.append((s, r.stdout))
    return out


def render(results: list[tuple[Step, str]]) -> str:
    parts = []
    for s, output in results:
        if s.title:
            parts.append(f"#### {s.title}\n\n{s.text}\n")
        body = "\n".join(line.rstrip() for line in output.rstrip("\n").splitlines())
        parts.append("```\n$ planner " + " ".join(s.args) + "\n" + body + "\n```\n")
    return "\n".join(parts)


def normalise(section: str) -> str:
    """What may differ between two runs of the tour: solver wall times, and everything ``planner
    launch`` measures: its whole block (step times, memory, throughput, the metrics file's name)
    with digits, table rules and spacing (column widths follow the numbers) evened out."""
    out: list[str] = []
    block: list[str] = []
    measured = False

    def flush():
        text = re.sub(r"\d[\d,.]*\d|\d", "#", "\n".join(block))
        text = re.sub(r"[─━═]+", "─", text)
        out.append(re.sub(r"\s+", " ", text).strip())
        block.clear()

    for line in section.splitlines():
        line = line.rstrip()
        if line.startswith("$ planner "):
            measured = line.startswith("$ planner launch")
        elif line.startswith("```") and measured:
            flush()
            measured = False
        elif measured:
            block.append(line)
            continue
        out.append(re.sub(r"^(solver: .*), \d+\.\d+ s$", r"\1, # s", line))
    if block:
        flush()
    return "\n".join(out).strip() + "\n"


def readme_section(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"the README has no {BEGIN} ... {END} markers")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def replace_section(text: str, section: str) -> str:
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n{section.strip()}\n{END}{tail}"


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 4000) -> None:
    """The whole page as Chromium draws it headless, cropped below the last thing drawn."""
    import matplotlib.image as mpimg
    import numpy as np
    exe = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if exe is None:
        raise RuntimeError("no chromium on PATH (apt-get install -y chromium)")
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", "--virtual-time-budget=5000", f"--screenshot={png}",
                    page.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    img = mpimg.imread(png)
    rows = np.nonzero((img[..., :3] < 0.97).any(axis=-1).any(axis=-1))[0]
    if len(rows):
        mpimg.imsave(png, img[:min(img.shape[0], rows[-1] + 40)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.cli.tour", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="README", help="rewrite the tour section of this file")
    g.add_argument("--check", metavar="README", help="exit 1 with a diff if the file's tour is out of date")
    ap.add_argument("--screenshot", metavar="DIR", help="also save the tour's HTML report as DIR/explain-report.png")
    a = ap.parse_args(argv)
    path = Path(a.write or a.check)
    text = path.read_text()
    readme_section(text)                       # markers present, before minutes of work
    with tempfile.TemporaryDirectory(prefix="planner-tour-") as d:
        section = render(run_steps(Path(d)))
        if a.screenshot:
            Path(a.screenshot).mkdir(parents=True, exist_ok=True)
            screenshot(Path(d) / "report.html", Path(a.screenshot) / "explain-report.png")
    if a.write:
        path.write_text(replace_section(text, section))
        print(f"wrote the tour into {path}", file=sys.stderr)
        return 0
    old, new = normalise(readme_section(text)), normalise(section)
    if old == new:
        return 0
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "README", "now"))
    print(f"{path}'s tour is out of date: run `make readme`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
