"""The seams hold: dependencies point one way, and planning never imports torch."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = {"costmodel", "profiles", "planner", "emitters", "runtime"}
# what each package may import (besides itself)
ALLOWED = {
    "costmodel": set(),
    "profiles": {"costmodel"},
    "emitters": {"costmodel", "planner.planfile", "planner.errors"},
    "runtime": {"costmodel", "planner.planfile", "planner.errors"},
    "planner": {"costmodel", "profiles"},
}
# command modules are the CLI: they may reach the emitters and the runtime
CLI_EXTRA = {"emitters", "runtime"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_dependencies_point_one_way():
    bad = []
    for pkg, allowed in ALLOWED.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            extra = CLI_EXTRA if pkg == "planner" and (f.name.startswith("cmd_") or f.name == "demo.py") else set()
            if f.name == "regen_golden.py":      # a maintenance script, not an emitter
                extra = {"profiles", "planner"}
            for mod in _imports(f):
                top = mod.split(".")[0]
                if top not in OURS or top == pkg:
                    continue
                if not any(mod == a or mod.startswith(a + ".") or top == a for a in allowed | extra):
                    bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_planning_does_not_import_torch():
    code = ("import sys\nfrom planner.cli import main\n"
            "rc = main(['estimate', '--model', 'llama-3-8b', '--cluster', 'dgx-h100', '--global-batch', '8',"
            " '--seq-len', '1024', '--json'])\n"
            "rc2 = main(['plan', '--model', 'tiny-llama', '--cluster', 'cpu', '--gpus', '4', '--global-batch', '8',"
            " '--seq-len', '128', '--json'])\n"
            "assert rc == rc2 == 0\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "NO-TORCH" in r.stderr
