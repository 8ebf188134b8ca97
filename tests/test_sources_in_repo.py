"""Sources cited inside the project are ones a user's clone can follow: no path to the notes of
the machine the project was written on (``/work/shared``, ``../shared``). Cite the primary source
(the framework's repository and file at a commit, the paper and table); rows the tool reads live
in ``calibration/``."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"/work/shared|\.\./shared")
PENDING: set[str] = set()      # files allowed to cite outside for now (none)


def test_no_citation_points_outside_the_repository():
    bad = []
    for folder in ("costmodel", "profiles", "planner", "emitters", "runtime", "calibration", "bench", "docs"):
        for p in sorted((ROOT / folder).rglob("*")):
            rel = p.relative_to(ROOT).as_posix()
            if not p.is_file() or p.suffix not in (".py", ".md", ".yaml", ".yml") or rel.startswith("docs/notes/"):
                continue
            if rel in PENDING:
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "citations outside the repository:\n" + "\n".join(bad)
