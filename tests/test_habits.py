"""House habits that a test can hold: one version string, one copy of the mesh-axis names."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from costmodel.specs import MESH_AXES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [f for pkg in ("costmodel", "profiles", "planner", "emitters", "runtime") for f in (ROOT / pkg).rglob("*.py")]


def _pyproject_version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert m, "pyproject.toml has no version"
    return m.group(1)


def test_one_version_string(capsys):
    """pyproject's version is what ``planner --version``, a plan's and a profile's provenance say,
    and no source file spells it again."""
    from planner.cli import build_parser
    from planner.plan.planfile import provenance
    from costmodel.files.version import tool_version
    v = _pyproject_version()
    assert tool_version() == v            # the installed distribution (make setup: pip install -e .)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"planner {v}"
    assert provenance("catalog")["planner"] == v
    copies = [str(f.relative_to(ROOT)) for f in SOURCES if f'"{v}"' in f.read_text() or f"'{v}'" in f.read_text()]
    assert not copies, copies


def test_one_copy_of_the_mesh_axes():
    """The tuple ``costmodel.specs.MESH_AXES`` is written once; the planner, profiles and runtime
    name it. (An emitter's ``require_order`` lists its framework's own rank order, which may
    coincide with ours and must not follow it if ours changed.)"""
    copies = []
    for f in SOURCES:
        rel = f.relative_to(ROOT)
        if rel.parts[0] == "emitters" or rel == Path("costmodel/specs.py"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts) \
                    and tuple(e.value for e in node.elts) == MESH_AXES:
                copies.append(f"{rel}:{node.lineno}")
    assert not copies, copies
