"""The package layout holds: every module imports in a fresh interpreter, the import graph of
``cpbench/`` has no cycle (a submodule importing ``from`` its own package's ``__init__`` included),
and imports flow one way between the layers (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "cpbench"

# (importer prefix, prefixes it must not import): the one-way flows of the layout.
FORBIDDEN = [
    ("cpbench.models.pairformer.parallel", ("cpbench.models.pairformer.ops", "cpbench.models.pairformer.layers",
                                            "cpbench.models.pairformer.modules", "cpbench.models.pairformer.adapter")),
    ("cpbench.models.pairformer.ops", ("cpbench.models.pairformer.layers", "cpbench.models.pairformer.modules",
                                       "cpbench.models.pairformer.adapter")),
    ("cpbench.models.pairformer.layers", ("cpbench.models.pairformer.modules", "cpbench.models.pairformer.adapter")),
    ("cpbench.models.pairformer.modules", ("cpbench.models.pairformer.adapter",)),
    ("cpbench.models", ("cpbench.harness", "cpbench.routines", "cpbench.results", "cpbench.sweep", "cpbench.report",
                        "cpbench.job", "cpbench.config")),
    ("cpbench.results", ("cpbench.report", "cpbench.harness", "cpbench.routines", "cpbench.job", "cpbench.sweep")),
    ("cpbench.harness", ("cpbench.routines", "cpbench.job", "cpbench.sweep", "cpbench.report")),
    ("cpbench.routines", ("cpbench.job", "cpbench.sweep", "cpbench.report")),
    ("cpbench.report", ("cpbench.harness", "cpbench.routines", "cpbench.job", "cpbench.sweep")),
]


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Module -> the modules of ``package_dir`` it imports (anywhere in the file, lazy imports
    included; ``if TYPE_CHECKING:`` blocks excluded). ``from pkg import name`` counts as importing
    ``pkg`` itself (its ``__init__`` runs and is read for ``name``), and ``pkg.name`` as well when
    that is a module: so a module that ``pkg/__init__.py`` imports and that imports ``from pkg``
    is a cycle (the package-level cycle that works only while Python falls back to the submodule)."""
    modules = {module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        edges = set()
        for node in ast.walk(tree):
            if _type_checking_only(node, parents):
                continue
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
                edges.add(node.module)
                edges |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_a_submodule_importing_from_its_own_package_init_is_a_cycle(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.rows import row\n")  # the package imports its submodule ...
    (package / "rows.py").write_text("from pkg import mfu\n\ndef row():\n    return mfu.peak\n")  # ... which imports it back
    (package / "mfu.py").write_text("peak = 1.0\n")
    assert find_cycle(import_graph(package)) == ["pkg", "pkg.rows", "pkg"]
    (package / "rows.py").write_text("from pkg.mfu import peak\n\ndef row():\n    return peak\n")
    assert find_cycle(import_graph(package)) is None  # the submodule by its full name: no cycle


def test_cpbench_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 50 and graph["cpbench.job"]  # the walk found the package and its imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_imports_flow_one_way_between_the_layers():
    bad = [(name, dep) for name, deps in import_graph().items() for prefix, banned in FORBIDDEN
           if name.startswith(prefix) for dep in deps if dep.startswith(banned)]
    assert not bad, bad


def test_no_try_import_around_cpbench_modules():
    """``try: from cpbench... except ImportError`` hides a broken module behind a fallback."""
    found = []
    for path in PACKAGE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Constant(None))
                                                 for h in node.handlers):
                names = [n.module or "" for n in ast.walk(node) if isinstance(n, ast.ImportFrom)]
                names += [a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names]
                found += [f"{path.name}: {m}" for m in names if m.startswith("cpbench")]
    assert not found, found


def test_every_module_imports_in_a_fresh_interpreter():
    modules = sorted(m for m in import_graph() if not m.endswith("__main__"))
    script = ("import importlib, traceback\n"
              f"for name in {modules!r}:\n"
              "    try:\n        importlib.import_module(name)\n"
              "    except Exception:\n        print(name, traceback.format_exc().splitlines()[-1])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and not proc.stdout.strip(), (proc.stdout + proc.stderr)[-3000:]
