"""The fast tier holds: under ``--fast`` an unmarked test that starts a process or runs CP-SAT
fails (even when it swallows the error), a marked one is left out, pure tests run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DUMMY = '''
import subprocess, sys
import pytest

def test_pure():
    assert 1 + 1 == 2

def test_unmarked_process():
    try:
        subprocess.run([sys.executable, "-c", "pass"])
    except Exception:
        pass                                   # swallowed: the tier still fails it

def test_unmarked_solver():
    from ortools.sat.python import cp_model
    m = cp_model.CpModel()
    m.new_bool_var("x")
    cp_model.CpSolver().solve(m)

@pytest.mark.subprocess
def test_marked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


@pytest.mark.subprocess
def test_the_fast_tier_refuses_unmarked_processes_and_solvers(tmp_path):
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_dummy.py").write_text(DUMMY)
    fast = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fast", "-rfE", "test_dummy.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = fast.stdout
    assert fast.returncode == 1, out
    assert "1 deselected" in out, out
    assert "FAILED test_dummy.py::test_unmarked_solver" in out, out
    assert "ERROR test_dummy.py::test_unmarked_process" in out, out          # failed at teardown
    assert "needs @pytest.mark.subprocess" in out and "needs @pytest.mark.solver" in out, out
    assert "test_pure" not in out.split("short test summary")[-1], out
    full = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_dummy.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert full.returncode == 0 and "4 passed" in full.stdout, full.stdout
