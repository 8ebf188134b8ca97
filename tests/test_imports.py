"""The seams hold: dependencies point one way, and planning never imports torch.

    costmodel <- costmodel.files <- profiles <- planner.plan <- planner.search <- emitters / runtime <- planner.cli

Each source file belongs to the layer of its package path (the longest prefix in ``LAYERS``);
no file is exempt by its name. Every import counts: module-level and inside functions, absolute
and relative, and ``importlib.import_module`` / ``__import__`` with a literal name.

Beyond each file's own imports: no module imports itself through others (no module cycle, no
package cycle), and what a layer pulls in *transitively* stays within what it may use
(``CLOSURE_BANNED``: the runtime reads the plan file, and must not pull in the profiler
through it).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("costmodel", "profiles", "planner", "emitters", "runtime")

# layer (a package path) -> the packages of ours it may import besides itself
LAYERS: dict[str, set[str]] = {
    "costmodel": set(),
    # the files people write (cluster files and catalog, bounded readers, atomic writes, the
    # tool's version): the one part of the cost model's package that touches the disk; the
    # rules never import it, the plan file and the runtime do (without reaching the profiler)
    "costmodel.files": {"costmodel"},
    "profiles": {"costmodel"},
    "planner.plan": {"costmodel", "profiles"},
    "planner.search": {"costmodel", "profiles", "planner.plan"},
    "emitters": {"costmodel", "planner.plan"},
    "runtime": {"costmodel", "planner.plan"},
    "planner.cli": {"costmodel", "profiles", "planner.plan", "planner.search", "emitters", "runtime"},
    # the package root: ``python -m planner`` hands over to the command line
    "planner": {"planner.cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def layer_of(mod: str) -> str:
    return max((k for k in LAYERS if _within(mod, k)), key=len)


def _literal_prefix(node: ast.AST) -> str | None:
    """The module name an ``import_module``/``__import__`` argument names: a literal string, or
    the literal head of an f-string (``f"planner.cli.cmd_{name}"`` -> ``planner.cli``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value).rsplit(".", 1)[0]
    return None


def imports_of(path: Path) -> set[str]:
    """Every module the file imports, as absolute names (relative imports resolved)."""
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                head = ".".join(base + ([node.module] if node.module else []))
            else:
                head = node.module or ""
            out.add(head)
            if not node.module:                 # ``from . import x``: x is a module
                out |= {f"{head}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                lit = _literal_prefix(node.args[0])
                if lit:
                    out.add(lit)
    return out


def _source_files() -> list[Path]:
    return sorted(f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py"))


def violations() -> list[str]:
    bad = []
    for f in _source_files():
        me = layer_of(_module_name(f))
        allowed = LAYERS[me]
        for mod in sorted(imports_of(f)):
            if mod.split(".")[0] not in PACKAGES:
                continue                                        # not ours
            target = layer_of(mod)
            if target == me or any(_within(mod, a) for a in allowed):
                continue
            bad.append(f"{f.relative_to(ROOT)} ({me}) imports {mod} ({target})")
    return bad


def _modules() -> dict[str, Path]:
    return {_module_name(f): f for f in _source_files()}


def _runtime_nodes(tree: ast.AST):
    """Every node, except what sits under ``if TYPE_CHECKING:`` (imported only for annotations,
    never at run time, so it closes no cycle)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _is_type_checking(test: ast.AST) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def module_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports, each resolved to a module that exists
    (``from pkg import mod`` -> ``pkg.mod``; ``import a.b.c`` of a name inside ``a.b`` -> ``a.b``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    head = ".".join(base + ([node.module] if node.module else []))
                else:
                    head = node.module or ""
                names = [f"{head}.{a.name}" if f"{head}.{a.name}" in mods else head for a in node.names]
            elif isinstance(node, ast.Call) and node.args:
                f = node.func
                fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                lit = _literal_prefix(node.args[0]) if fname in ("import_module", "__import__") else None
                names = [lit] if lit else []
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod:
                    out.add(n)
        graph[mod] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def closure(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` reaches, each with the module that first imports it on the way."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in sorted(graph.get(v, ())):
            if w not in seen and w != start:
                seen[w] = v
                todo.append(w)
    return seen


# layer -> packages it must not reach even through others (what it may import directly aside)
CLOSURE_BANNED: dict[str, set[str]] = {
    "costmodel": {"profiles", "planner", "emitters", "runtime"},
    "costmodel.files": {"profiles", "planner", "emitters", "runtime"},
    "profiles": {"planner", "emitters", "runtime"},
    "planner.plan": {"planner.search", "planner.cli", "emitters", "runtime"},
    "planner.search": {"planner.cli", "emitters", "runtime"},
    "emitters": {"planner.search", "planner.cli", "runtime"},
    "runtime": {"profiles", "planner.search", "planner.cli", "emitters"},
}


def closure_violations(graph: dict[str, set[str]] | None = None) -> list[str]:
    graph = graph if graph is not None else module_graph()
    bad = []
    for mod in sorted(graph):
        banned = CLOSURE_BANNED.get(layer_of(mod), set())
        reach = closure(graph, mod)
        for w, via in sorted(reach.items()):
            if any(_within(w, b) for b in banned):
                bad.append(f"{mod} ({layer_of(mod)}) reaches {w} through {via}")
    return bad


# Cycles known and owned, each to be removed by its owner: the test fails on any other cycle, and
# on a listed one that is gone (so that the list only shrinks).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def test_no_module_cycle():
    found = {tuple(c) for c in cycles(module_graph())}
    new = sorted(found - KNOWN_CYCLES)
    assert not new, "import cycles:\n" + "\n".join(" -> ".join(c) for c in new)
    gone = sorted(KNOWN_CYCLES - found)
    assert not gone, f"these known cycles are gone: remove them from KNOWN_CYCLES: {gone}"


def test_no_package_cycle():
    """Subpackages (``planner.search``, ``planner.cli``, ``costmodel``, ...) import each other one way."""
    graph = module_graph()
    pkgs: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        me = layer_of(mod)
        pkgs.setdefault(me, set()).update(layer_of(d) for d in deps if layer_of(d) != me)
    found = cycles(pkgs)
    assert not found, found


def test_what_a_layer_pulls_in_transitively():
    bad = [b for b in closure_violations() if not b.startswith("runtime.")]
    assert not bad, "\n".join(bad[:20]) + (f"\n... {len(bad) - 20} more" if len(bad) > 20 else "")


def test_the_runtime_does_not_pull_in_profiles_through_the_plan_file():
    bad = [b for b in closure_violations() if b.startswith("runtime.")]
    assert not bad, "\n".join(bad[:20])


@pytest.mark.parametrize("files,kind", [
    ({"planner/search/a.py": "from planner.search import b", "planner/search/b.py": "def f():\n    import planner.search.a"},
     "cycle"),
    ({"runtime/x.py": "from planner.plan import p", "planner/plan/p.py": "def f():\n    from profiles import q",
      "profiles/q.py": ""}, "closure"),
    ({"runtime/x.py": "from planner.plan import p", "planner/plan/p.py": "from costmodel import c",
      "costmodel/c.py": ""}, None),
    ({"costmodel/a.py": "from costmodel import b",
      "costmodel/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from costmodel import a"}, None),
])
def test_the_cycle_and_closure_checks_catch_what_they_should(tmp_path, monkeypatch, files, kind):
    for src, text in files.items():
        f = tmp_path / src
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = module_graph()
    assert bool(cycles(graph)) == (kind == "cycle"), cycles(graph)
    assert bool(closure_violations(graph)) == (kind == "closure"), closure_violations(graph)


def test_dependencies_point_one_way():
    bad = violations()
    assert not bad, "\n".join(bad)


def test_no_module_imports_a_command_module():
    """A command module (``planner.cli.cmd_*``) is reached only through the command dispatcher,
    never by a static import: shared helpers live in the layer that needs them."""
    bad = [f"{f.relative_to(ROOT)} imports {m}" for f in _source_files() for m in imports_of(f)
           if m.startswith("planner.cli.cmd_")]
    assert not bad, "\n".join(bad)


def test_every_source_file_has_a_layer():
    """The planner's modules live in its three subpackages; its root holds only the entry points."""
    stray = [str(f.relative_to(ROOT)) for f in (ROOT / "planner").glob("*.py")
             if f.name not in ("__init__.py", "__main__.py")]
    assert not stray, stray
    for sub in ("plan", "search", "cli"):
        assert (ROOT / "planner" / sub / "__init__.py").exists()


@pytest.mark.parametrize("src,mod,ok", [
    ("runtime/x.py", "from planner.search.bnb import solve", False),      # the runtime reads the plan only
    ("runtime/x.py", "from planner.plan.planfile import read_plan", True),
    ("runtime/x.py", "from costmodel.files.clusters import cluster_from_dict", True),
    ("costmodel/x.py", "from costmodel.files.readers import load_yaml", False),     # the rules touch no file
    ("costmodel/files/x.py", "from profiles import report", False),
    ("emitters/x.py", "import profiles.report", False),
    ("planner/search/x.py", "from planner.cli.args import check_writable", False),
    ("planner/plan/x.py", "def f():\n    from planner.search import space", False),   # lazy imports count
    ("costmodel/x.py", "from ..profiles import clusters", False),                   # relative imports count
    ("planner/search/x.py", "import importlib\nimportlib.import_module('runtime.train')", False),
    ("planner/cli/x.py", "from runtime import train\nimport emitters", True),
])
def test_the_checker_catches_what_it_should(tmp_path, monkeypatch, src, mod, ok):
    """The checker itself, on a file placed in each layer (so a broken checker cannot pass)."""
    fake = tmp_path / src
    fake.parent.mkdir(parents=True)
    fake.write_text(mod + "\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert (violations() == []) is ok, violations()


@pytest.mark.subprocess
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
