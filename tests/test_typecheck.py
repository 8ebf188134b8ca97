"""The type checker over the package (``[tool.mypy]`` in pyproject.toml): clean, with each
exception listed there. It would have caught ``pareto_figure`` returning PNG bytes where its
signature promises text."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.subprocess]


def _mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_package_typechecks():
    r = _mypy()
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "Success: no issues found" in r.stdout


def test_checker_catches_bytes_returned_as_text(tmp_path):
    """The checker as configured flags the very bug it was added for."""
    bad = tmp_path / "bad.py"
    bad.write_text("def figure() -> tuple[str, str]:\n    return 'title', b'\\x89PNG'\n")
    r = _mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert r.returncode == 1 and "return-value" in r.stdout, r.stdout
