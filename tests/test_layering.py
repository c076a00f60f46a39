"""Layering: the core library never imports Prefect or the orchestration packages."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import shardflow

SRC = Path(shardflow.__file__).resolve().parent
FORBIDDEN = ("prefect", "flows", "tasks")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def test_no_source_file_imports_orchestration():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 15
    offenders = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for lineno, module in _imported_modules(tree):
            if module.split(".")[0] in FORBIDDEN:
                offenders.append(f"{path.relative_to(SRC.parent)}:{lineno} imports {module}")
    assert not offenders, "\n".join(offenders)


_PROBE = r"""
import importlib, json, pkgutil, sys
import shardflow
skipped, imported = [], []
for info in pkgutil.walk_packages(shardflow.__path__, "shardflow."):
    name = info.name
    # Training-side torch adapters are optional extras; everything else must import.
    if name.startswith("shardflow.runtime.") and "torch" in name:
        skipped.append(name)
        continue
    importlib.import_module(name)
    imported.append(name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("prefect", "flows", "tasks"))
print(json.dumps({"imported": imported, "skipped": skipped, "bad": bad}))
"""


def test_importing_every_core_module_loads_no_prefect():
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"shardflow.build", "shardflow.sources", "shardflow.reader", "shardflow.formats.nanogpt"} <= set(result["imported"])
    assert result["bad"] == []
