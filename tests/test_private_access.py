"""Public APIs only: every access to a private name of another package in ``src/shardflow``, ``flows`` and ``tasks``.

A private name is one with a single leading underscore (``_name``, not a dunder).
The scan reads each source file with ``ast`` (nothing is imported) and flags:

* ``X._name`` where ``X`` is not ``self``, ``cls`` or ``super()`` and is not a
  module or object of this project: a name imported from another package is
  always flagged; any other base (a local, a call's result, an attribute of an
  attribute) is flagged unless ``_name`` is defined somewhere in the project (a
  ``def``, a ``class``, an assignment, ``self._name = ...``), because without
  types the scan cannot tell whose object it is, and the project's own private
  names between its modules are not what this guards;
* ``import pkg._private`` and ``from pkg._private import x`` and
  ``from pkg import _name`` for any package other than shardflow;
* ``getattr``/``setattr``/``hasattr``/``delattr`` with a private name as a
  string, under the same rule as ``X._name``;
* ``inspect.getsource`` (reading a dependency's source text to patch it is
  never a public API, whatever the name).

Not private, though spelled with an underscore, because the standard library
documents them as public API: ``os._exit`` (the os module's documentation: "exit
the process ... without calling cleanup handlers") and the namedtuple methods
``_replace``, ``_asdict``, ``_make``, ``_fields`` and ``_field_defaults`` (named
with an underscore "to prevent conflicts with field names", collections'
documentation).

``ALLOWED`` holds the accesses that have no public alternative, at most three,
each with why. A new finding fails the test with the list of them.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src/shardflow", "flows", "tasks")
PROJECT_PACKAGE = "shardflow"

# Documented public API of the standard library, spelled with an underscore (see the module docstring).
DOCUMENTED_PUBLIC_ATTRS = frozenset({"_replace", "_asdict", "_make", "_fields", "_field_defaults"})
DOCUMENTED_PUBLIC_QUALIFIED = frozenset({"os._exit"})

# "path:expr" -> why it has no public alternative. At most three entries.
ALLOWED: dict[str, str] = {}

_ATTR_FUNCTIONS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One private access: where it is and the expression as written."""

    path: str
    line: int
    expr: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.expr}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.expr}"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"


def _is_project_module(module: str | None, level: int) -> bool:
    return level > 0 or module == PROJECT_PACKAGE or (module or "").startswith(PROJECT_PACKAGE + ".")


def project_defined_names(trees: dict[str, ast.Module]) -> frozenset[str]:
    """Every private name the project defines: functions, classes, assignments, attribute assignments, arguments."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Call) and _called_name(node) in {"setattr", "__setattr__"}:
                # object.__setattr__(self, "_x", ...) in frozen dataclasses, setattr(obj, "_x", ...)
                for arg in node.args[:2]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        names.add(arg.value)
    return frozenset(n for n in names if is_private(n))


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _imports(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Names bound by imports anywhere in the file: ``{name: qualified name}`` of other packages, and the project's."""
    foreign: dict[str, str] = {}
    project: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                qualified = alias.name if alias.asname else bound
                if _is_project_module(alias.name, 0):
                    project.add(bound)
                else:
                    foreign[bound] = qualified
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name
                if _is_project_module(node.module, node.level):
                    project.add(bound)
                else:
                    foreign[bound] = f"{node.module}.{alias.name}"
    # A name imported from shardflow in one place and from elsewhere in another is not trusted.
    return foreign, project - set(foreign)


def scan_tree(path: str, tree: ast.Module, defined: frozenset[str]) -> list[Finding]:
    """The private accesses of one file's syntax ``tree`` (``path`` names it in the findings)."""
    foreign, project = _imports(tree)
    found: list[Finding] = []

    def add(node: ast.AST, expr: str | None = None) -> None:
        found.append(Finding(path=path, line=getattr(node, "lineno", 0), expr=expr or ast.unparse(node)))

    def base_is_private_access(base: ast.expr, name: str) -> bool:
        """Whether ``base._name`` (or ``getattr(base, "_name")``) reaches into another package."""
        if name in DOCUMENTED_PUBLIC_ATTRS:
            return False
        if isinstance(base, ast.Name):
            if base.id in {"self", "cls"} or base.id in project:
                return False
            if base.id in foreign:
                return f"{foreign[base.id]}.{name}" not in DOCUMENTED_PUBLIC_QUALIFIED
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            return False
        return name not in defined

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if base_is_private_access(node.value, node.attr):
                add(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_project_module(alias.name, 0) and any(is_private(p) for p in alias.name.split(".")):
                    add(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not _is_project_module(node.module, node.level):
            module = node.module or ""
            if any(is_private(p) for p in module.split(".")):
                add(node, f"from {module} import {', '.join(a.name for a in node.names)}")
            else:
                for alias in node.names:
                    if is_private(alias.name) and f"{module}.{alias.name}" not in DOCUMENTED_PUBLIC_QUALIFIED:
                        add(node, f"from {module} import {alias.name}")
        elif isinstance(node, ast.Call):
            called = _called_name(node)
            if called in _ATTR_FUNCTIONS and isinstance(node.func, ast.Name) and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                    if base_is_private_access(node.args[0], name.value):
                        add(node)
            elif called == "getsource":
                func = node.func
                from_inspect = (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                                and foreign.get(func.value.id) == "inspect")
                if from_inspect or (isinstance(func, ast.Name) and foreign.get(func.id) == "inspect.getsource"):
                    add(node)
    return sorted(found, key=lambda f: (f.line, f.expr))


def project_files() -> list[Path]:
    """Every ``.py`` file scanned."""
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def project_trees() -> dict[str, ast.Module]:
    """``{path relative to the repository: syntax tree}`` of every ``.py`` file scanned."""
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in project_files()}


@functools.lru_cache(maxsize=1)
def scan_project() -> tuple[Finding, ...]:
    """Every finding of the scanned files (once per test session: parsing them takes most of a second)."""
    trees = project_trees()
    defined = project_defined_names(trees)
    return tuple(f for path, tree in trees.items() for f in scan_tree(path, tree, defined))


def scan_source(path: str, text: str) -> list[Finding]:
    """The findings of one module's source ``text``, alone (only its own definitions count as the project's)."""
    tree = ast.parse(text)
    return scan_tree(path, tree, project_defined_names({path: tree}))


def test_no_private_access_to_other_packages() -> None:
    findings = scan_project()
    for finding in findings:
        print(finding)
    new = [f for f in findings if f.key not in ALLOWED]
    assert not new, (
        f"{len(new)} access(es) to a private name of another package (use its public API, "
        "or add an entry with why to ALLOWED in tests/test_private_access.py):\n" + "\n".join(map(str, new))
    )


def allow_list_problems(allowed: dict[str, str], findings: tuple[Finding, ...]) -> list[str]:
    """What is wrong with an allow-list: too long, an entry without why, an entry the code no longer needs."""
    problems = [f"{len(allowed)} entries; at most three"] if len(allowed) > 3 else []
    problems += [f"{key}: says no why" for key, why in allowed.items() if not why.strip()]
    found = {f.key for f in findings}
    problems += [f"{key}: the code no longer makes this access; remove it" for key in sorted(set(allowed) - found)]
    return problems


def test_the_allow_list_is_short_explained_and_current() -> None:
    assert allow_list_problems(ALLOWED, scan_project()) == []
    # What the check refuses.
    seen = (Finding(path="a.py", line=3, expr="lib._x"),)
    assert allow_list_problems({"a.py:lib._x": "no public way to do it"}, seen) == []
    assert allow_list_problems({"a.py:lib._x": " "}, seen) == ["a.py:lib._x: says no why"]
    assert allow_list_problems({"b.py:lib._y": "gone"}, seen) == ["b.py:lib._y: the code no longer makes this access; remove it"]
    four = {f"a.py:lib._{n}": "why" for n in "wxyz"}
    assert allow_list_problems(four, tuple(Finding(path="a.py", line=1, expr=k[5:]) for k in four)) == ["4 entries; at most three"]


def test_the_scan_covers_the_project() -> None:
    sources = [p.relative_to(ROOT).as_posix() for p in project_files()]
    # The three layers are all read (a wrong root would scan nothing and pass).
    assert any(p.startswith("src/shardflow/") for p in sources)
    assert any(p.startswith("flows/") for p in sources) and any(p.startswith("tasks/") for p in sources)
    assert len(sources) > 50


_SAMPLE = '''
import os
import threading
import inspect
import prefect.flow_engine as engine
import tiktoken._educational
from inspect import getsource
from gigatoken._load.sentencepiece import convert
from collections import _chain
from . import _io
from ..build import stages
from shardflow.flows import options

class Mine:
    def __init__(self, encoding):
        self._encoding = encoding
        super()._setup()

    def ids(self, text):
        a = self._encoding._special_tokens.get(text)  # flagged: tiktoken's, not the project's
        b = self._encoding  # the project's own
        return a, b, cls._other

def run(point, enc):
    os._exit(0)  # documented public
    threading._shutdown()
    engine._send_heartbeats = None
    getattr(threading, "_threading_atexits", None)
    getattr(point, "_encoding")  # a project name
    hasattr(point, "__slots__")
    point._replace(x=1)  # namedtuple's documented method
    _io.start_writeback(1)
    stages._private(1)
    options.build_config("x")
    enc.x._pat_str
    inspect.getsource(run)
    getsource(run)
'''


def test_the_scan_flags_each_form_of_private_access() -> None:
    got = [f"{f.line - 1}: {f.expr}" for f in scan_source("m.py", _SAMPLE)]
    assert got == [
        "5: import tiktoken._educational",
        "7: from gigatoken._load.sentencepiece import convert",
        "8: from collections import _chain",
        "19: self._encoding._special_tokens",
        "25: threading._shutdown",
        "26: engine._send_heartbeats",
        "27: getattr(threading, '_threading_atexits', None)",
        "34: enc.x._pat_str",
        "35: inspect.getsource(run)",
        "36: getsource(run)",
    ]


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("import os\nos._exit(1)", []),  # documented public
        ("import os as o\no._exit(1)", []),
        ("import sys\nsys._getframe()", ["sys._getframe"]),
        ("from os import _exit\n_exit(1)", []),
        ("from sys import _getframe\n", ["from sys import _getframe"]),
        ("import numpy as np\nnp.__version__", []),
        ("from shardflow import _io\n_io.x", []),
        ("import shardflow._io as io_\nio_._sync_file_range", []),
        ("import _collections_abc\n", ["import _collections_abc"]),
        ("from prefect._internal.concurrency import services\n", ["from prefect._internal.concurrency import services"]),
        ("from prefect.runner import Runner\nRunner._deployment_registry", ["Runner._deployment_registry"]),
        ("def f(encoding):\n    return encoding._pat_str", ["encoding._pat_str"]),
        ("setattr(x, '_private', 1)\n", []),  # defines _private, as far as the scan knows
        ("hasattr(x, '_private')\n", ["hasattr(x, '_private')"]),
    ],
)
def test_the_scan_rules_on_names(source: str, flagged: list[str]) -> None:
    assert [f.expr for f in scan_source("m.py", source)] == flagged


# ---------------------------------------------------------------- the project's own modules

# The private helper modules: shared by several modules on purpose, their names public within the package.
HELPER_MODULES = frozenset({"_io", "_yaml", "_arrow", "_bytelevel"})


def own_private_imports(path: str, tree: ast.Module) -> list[Finding]:
    """Where one module of the project reaches another's underscore name: ``from .x import _y``, ``import
    shardflow._x`` (but the helper modules), or ``x._y`` through a project module imported as ``x``."""
    found: list[Finding] = []
    modules: set[str] = set()  # names bound to a project module or package
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _is_project_module(node.module, node.level):
            parts = (node.module or "").split(".")
            names = [a.name for a in node.names]
            if any(is_private(p) and p not in HELPER_MODULES for p in parts):
                found.append(Finding(path=path, line=node.lineno, expr=f"from {node.module} import {', '.join(names)}"))
            for alias in node.names:
                if is_private(alias.name) and alias.name not in HELPER_MODULES:
                    found.append(Finding(path=path, line=node.lineno, expr=f"from {'.' * node.level}{node.module or ''} import {alias.name}"))
                elif alias.name[:1].islower():
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_project_module(alias.name, 0):
                    if any(is_private(p) and p not in HELPER_MODULES for p in alias.name.split(".")):
                        found.append(Finding(path=path, line=node.lineno, expr=f"import {alias.name}"))
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in modules and node.value.id not in HELPER_MODULES:
            found.append(Finding(path=path, line=node.lineno, expr=ast.unparse(node)))
    return found


def test_no_module_imports_another_modules_underscore_name() -> None:
    findings = [f for path, tree in project_trees().items() for f in own_private_imports(path, tree)]
    assert not findings, ("a module uses another module's underscore name: make the name public, or keep the code "
                          "in one module:\n" + "\n".join(map(str, findings)))


def test_the_own_private_import_check_finds_each_form() -> None:
    source = ("from .plan import _units\nfrom shardflow.build._x import y\nimport shardflow._hidden\n"
              "from . import _io, _yaml\nfrom .. import run\nrun._step()\nfrom .a import b as _b\n")
    found = [f.expr for f in own_private_imports("m.py", ast.parse(source))]
    assert found == ["from .plan import _units", "from shardflow.build._x import y", "import shardflow._hidden",
                     "run._step"]
