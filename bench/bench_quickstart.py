"""The README's quick start, measured: a fresh clone, `make setup`, `make demo`, the first plan,
the fast test tier, and the sizes a newcomer's disk pays (the checkout, .venv, .venv-targets).

    python bench/bench_quickstart.py [--keep DIR] [--targets-env] [--write bench/results/quickstart.json]

Runs in a scratch clone of this repository (``git clone`` of the working copy's HEAD), so nothing
here is touched. ``--targets-env`` also times ``make targets-env`` (the frameworks' own parsers,
downloaded: minutes and about 1.6 GB); without it the size of an existing ``.venv-targets`` beside
this checkout is reported, marked as not timed. The machine (cores, memory, load average at the
start and end) is recorded with the figures: times on a shared or loaded machine are upper bounds.
``tests/test_docs_pages.py`` checks that the README quotes these figures as written here.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "quickstart.json"
FIRST_PLAN = ["plan", "--model", "llama-3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
              "--seq-len", "8192", "--out", "plan.yaml"]


def du_bytes(path: Path) -> int:
    """Bytes on disk under ``path`` (``du -sb``: apparent sizes, links not followed)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def timed(cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 3600) -> dict:
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise SystemExit(f"bench_quickstart: `{' '.join(cmd)}` exited {r.returncode}")
    return {"command": " ".join(cmd), "wall_s": round(wall, 1)}


def machine() -> dict:
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "platform": platform.platform(), "load_average_start": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", metavar="DIR", help="clone into DIR and keep it (default: a temporary folder)")
    p.add_argument("--targets-env", action="store_true", help="also time `make targets-env` (downloads ~1.6 GB)")
    p.add_argument("--write", metavar="FILE", help=f"write the figures as JSON (e.g. {RESULTS.relative_to(ROOT)})")
    a = p.parse_args(argv)
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="quickstart-"))
    clone = base / "planner"
    if clone.exists():
        raise SystemExit(f"bench_quickstart: {clone} exists; give an empty --keep folder")
    out: dict = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        out["clone"] = timed(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], base)
        out["checkout_bytes"] = du_bytes(clone) - du_bytes(clone / ".git")
        out["git_bytes"] = du_bytes(clone / ".git")
        out["setup"] = timed(["make", "setup"], clone)
        out["venv_bytes"] = du_bytes(clone / ".venv")
        out["demo"] = timed(["make", "demo"], clone)
        work = clone / "scratch"
        work.mkdir()
        out["first_plan"] = timed([str(clone / ".venv" / "bin" / "planner"), *FIRST_PLAN], work)
        out["test_fast"] = timed(["make", "test-fast"], clone)
        collected = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pytest", "tests", "-q",
                                    "--collect-only"], cwd=clone, capture_output=True, text=True).stdout
        last = [ln for ln in collected.splitlines() if "collected" in ln or "tests" in ln][-1:]
        out["tests_collected"] = int(last[0].split()[0]) if last and last[0].split()[0].isdigit() else None
        if a.targets_env:
            out["targets_env"] = timed(["make", "targets-env"], clone)
            out["targets_env_bytes"] = du_bytes(clone / ".venv-targets")
        else:
            existing = ROOT / ".venv-targets"
            out["targets_env"] = None
            out["targets_env_bytes"] = du_bytes(existing.resolve()) if existing.exists() else None
    finally:
        out["machine"]["load_average_end"] = list(os.getloadavg())
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(out, indent=2) + "\n"
    if a.write:
        Path(a.write).parent.mkdir(parents=True, exist_ok=True)
        Path(a.write).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
