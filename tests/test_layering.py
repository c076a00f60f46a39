"""Layering: only ``shardflow.flows`` and ``shardflow.tasks`` import Prefect; the library imports them only in the
``build`` and ``serve`` commands; no import cycle (type-hint imports included); no stage imports a later stage."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from collections import deque
from pathlib import Path

import shardflow

SRC = Path(shardflow.__file__).resolve().parent
REPO = SRC.parent.parent
ORCHESTRATION = {"shardflow.flows": REPO / "flows", "shardflow.tasks": REPO / "tasks"}
# The only places of the library that may import shardflow.flows, inside the function: the commands that run Prefect.
COMMANDS_ON_PREFECT = {("cli/build.py", "cmd_build"), ("cli/build.py", "cmd_serve")}


def _is(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imported_modules(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node, node.args[0].value))
    return found


def _enclosing_functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node inside a top-level function -> that function's name."""
    return {node: top.name for top in getattr(tree, "body", []) if isinstance(top, ast.FunctionDef)
            for node in ast.walk(top)}


def test_only_flows_and_tasks_import_prefect_and_the_library_imports_them_only_in_two_commands():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 15
    offenders = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = _enclosing_functions(tree)
        for node, module in _imported_modules(tree):
            place = f"src/shardflow/{path.relative_to(SRC)}:{node.lineno} imports {module}"
            if _is(module, "prefect", "prefect_dask"):
                offenders.append(place)
            elif _is(module, "shardflow.flows", "shardflow.tasks") and \
                    (path.relative_to(SRC).as_posix(), where.get(node)) not in COMMANDS_ON_PREFECT:
                offenders.append(place)
    assert not offenders, "\n".join(offenders)


def test_every_module_of_flows_and_tasks_imports_prefect_or_serves_only_those_that_do():
    """flows/ and tasks/ hold the Prefect layer and nothing else: a module there imports Prefect, or only modules
    there that do import it (a helper of theirs)."""
    modules = {f"{package}.{path.stem}".removesuffix(".__init__"): path
               for package, root in ORCHESTRATION.items() for path in sorted(root.glob("*.py"))}
    prefect_users = {m for m, path in modules.items()
                     if any(_is(name, "prefect") for _, name in _imported_modules(ast.parse(path.read_text())))}
    importers: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in modules.items():
        for _, name in _imported_modules(ast.parse(path.read_text())):
            if name in importers:
                importers[name].add(m)
    helpers = {m for m in modules if m not in prefect_users and not m.endswith(("flows", "tasks"))}
    assert prefect_users >= {"shardflow.flows.build", "shardflow.flows.launch", "shardflow.tasks.build"}
    stray = {m: sorted(importers[m]) for m in helpers if not importers[m] or not importers[m] <= prefect_users}
    assert not stray, f"modules of flows/ or tasks/ that neither import Prefect nor serve only those that do: {stray}"


_PROBE = r"""
import importlib, json, pkgutil, sys
import shardflow
skipped, imported = [], []
for info in pkgutil.walk_packages(shardflow.__path__, "shardflow."):
    name = info.name
    # The orchestration packages (installed as shardflow.flows / shardflow.tasks) are not the core.
    if name.startswith(("shardflow.flows", "shardflow.tasks")) or name == "shardflow.__main__":
        continue
    # Training-side torch adapters are optional extras; everything else must import.
    if name.startswith("shardflow.runtime.") and "torch" in name:
        skipped.append(name)
        continue
    importlib.import_module(name)
    imported.append(name)
bad = sorted(m for m in sys.modules if m.split(".")[0] == "prefect" or m.startswith(("shardflow.flows", "shardflow.tasks")))
print(json.dumps({"imported": imported, "skipped": skipped, "bad": bad}))
"""


def test_importing_every_core_module_loads_no_prefect():
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"shardflow.pipeline", "shardflow.cli", "shardflow.bucket.build", "shardflow.reader"} <= set(result["imported"])
    assert result["bad"] == []


# ---------------------------------------------------------------- no import cycles


def _module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package's ``__init__`` is the package)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Who imports whom among the modules of ``package`` (rooted at ``root``), function-level imports and those under
    ``if TYPE_CHECKING:`` (type hints) included.

    ``from X import name`` is an edge to ``X.name`` when that is a module of the
    package, else to ``X`` (or the nearest enclosing module that exists). No
    implicit edges to parent packages are added: importing ``a.b.c`` runs
    ``a/__init__`` and ``a/b/__init__`` first, but a package ``__init__`` that
    re-exports its submodules is not a cycle with them.
    """
    modules = _module_names(root, package)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        # The package a relative import starts from: the module's own for an __init__.
        own_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = own_package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                for alias in node.names:
                    full = f"{origin}.{alias.name}"
                    targets.append(full if full in modules else origin)
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets.append(node.args[0].value)
        for target in targets:
            resolved = known(target) if target == package or target.startswith(package + ".") else None
            if resolved is not None and resolved != module:  # a module importing itself is no cycle
                graph[module].add(resolved)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of ``graph`` as chains ``[a, b, c, a]``: enough shortest cycles to cover every
    edge that lies on a cycle (one chain per edge at most), in a stable order."""
    # Strongly connected components (Tarjan, iterative): an edge lies on a cycle iff both ends share one.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    component: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = index[node]
                    if member == node:
                        break

    def shortest_path(src: str, dst: str, scc: int) -> list[str]:
        previous = {src: src}
        queue = deque([src])
        while queue:
            node = queue.popleft()
            if node == dst:
                break
            for child in sorted(graph.get(node, ())):
                if child not in previous and component.get(child) == scc:
                    previous[child] = node
                    queue.append(child)
        path = [dst]
        while path[-1] != src:
            path.append(previous[path[-1]])
        return path[::-1]

    cycles: list[list[str]] = []
    covered: set[tuple[str, str]] = set()
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if (a, b) in covered or component.get(a) != component.get(b):
                continue
            chain = [a, a] if a == b else [a, *shortest_path(b, a, component[a])]
            covered.update(itertools.pairwise(chain))
            cycles.append(chain)
    return cycles


def test_find_cycles_on_a_synthetic_graph():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"a"}}) == [["a", "a"]]
    # Two cycles through one module, and a separate pair; every edge on a cycle is reported once.
    found = find_cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}, "x": {"y"}, "y": {"x"}, "z": {"x"}})
    assert found == [["a", "b", "a"], ["a", "c", "a"], ["x", "y", "x"]]


def test_import_graph_resolves_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    files = {
        "__init__.py": "from .reader import open_version\n",
        "codecs.py": "",
        "catalog.py": "X = 1\n",
        "reader.py": "from . import codecs\nfrom .formats import bosidx, FORMATS\n",
        "formats/__init__.py": "from .bosidx import read\nFORMATS = {}\n",
        "formats/bosidx.py": "def read():\n    from ..catalog import X\n",
        "runtime/__init__.py": "",
        "runtime/shards.py": (
            "from typing import TYPE_CHECKING\n"
            "import numpy\n"
            "if TYPE_CHECKING:\n    from ..reader import Version\n"
            "def f():\n    import pkg.codecs\n    from pkg.runtime import shards\n"
        ),
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    assert _import_graph(pkg, "pkg") == {
        "pkg": {"pkg.reader"},
        "pkg.codecs": set(),
        "pkg.catalog": set(),
        "pkg.reader": {"pkg.codecs", "pkg.formats.bosidx", "pkg.formats"},
        "pkg.formats": {"pkg.formats.bosidx"},
        "pkg.formats.bosidx": {"pkg.catalog"},
        "pkg.runtime": set(),
        "pkg.runtime.shards": {"pkg.codecs", "pkg.reader"},  # the TYPE_CHECKING import is one; the self-import not
    }


def test_shardflow_modules_form_no_import_cycle():
    graph = _import_graph(SRC, "shardflow")
    assert len(graph) > 15
    assert "shardflow.validation" in graph["shardflow.reader"]  # a function-level import (open_version) counts
    cycles = find_cycles(graph)
    assert not cycles, "import cycles among shardflow modules (function-level and type-hint imports count):\n" + "\n".join(
        " -> ".join(chain) for chain in cycles
    )


def test_no_stage_imports_a_later_stage():
    """Data flows one way: a stage's module imports no module of a stage that runs after it."""
    from shardflow.pipeline import STAGES

    order: list[str] = []
    for stage in STAGES:
        module = stage.run.__module__
        if module not in order:
            order.append(module)
    order.insert(0, "shardflow.pipeline.plan")
    graph = _import_graph(SRC, "shardflow")
    backwards = [f"{m} imports {later}" for i, m in enumerate(order) for later in order[i + 1:] if later in graph[m]]
    assert not backwards, "\n".join(backwards)


def test_importing_the_package_or_its_errors_imports_neither_numpy_nor_pyarrow():
    """``shardflow``'s names load on first use: the command line launches Prefect's temporary server
    (flows/server.py, which needs only ``shardflow.errors``) before numpy and pyarrow are imported."""
    code = (
        "import sys, shardflow, shardflow.errors, shardflow.cli.commands, shardflow.flows.server\n"
        "heavy = sorted(m for m in ('numpy', 'pyarrow', 'prefect') if m in sys.modules)\n"
        "from shardflow import BuildConfig, open_version, Split, Version, ShardflowError\n"
        "assert BuildConfig.__module__ == 'shardflow.config' and ShardflowError is shardflow.errors.ShardflowError\n"
        "assert 'open_version' in dir(shardflow)\n"
        "try:\n    shardflow.nothing\nexcept AttributeError as e:\n    assert 'nothing' in str(e)\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=SRC.parent.parent).stdout.strip()
    assert out == "[]"


def test_a_build_without_prefect_and_the_catalog_commands_never_import_prefect(tmp_path):
    """``build --no-prefect`` and the read-only commands (``src/shardflow/cli/versions.py``) run where Prefect is
    slow to import or broken: none of them may import it, even through the command line's module."""
    sample = SRC.parent.parent / "tests" / "assets" / "sample.parquet"
    where = ["--catalog", str(tmp_path / "c")]
    commands = [
        ["build", str(sample), "--name", "s", "--data-root", str(tmp_path / "d"), "--no-prefect", "--progress", "none", *where],
        ["ls", *where], ["ls", "s", *where], ["show", "s@v1", *where], ["validate", "s@v1", *where], ["diff", "s@v1", "s@v1", *where],
    ]
    code = (
        "import json, sys\nfrom shardflow.cli.commands import main\n"
        f"for argv in json.loads({json.dumps(json.dumps(commands))}):\n"
        "    assert main(argv) == 0, argv\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": f"{SRC.parent}:{SRC.parent.parent}"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OK s@v1" in out.stdout and "s@v1 -> s@v1" in out.stdout  # the commands ran
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
