"""The wheel users install: every package is in it, under ``shardflow`` only, with one version.

``.ci/wheel_check`` installs this wheel into fresh venvs and runs the commands; this test is the
fast check of its contents, so a subpackage left out of the wheel fails the suite too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import shardflow

pytestmark = pytest.mark.slow  # builds a wheel (about 10 s)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # Built from a copy of what the wheel is made of: setuptools reuses a build/ directory in the
    # source tree, where a module deleted since the last build would still be found.
    src = tmp_path_factory.mktemp("source")
    for name in ("src", "flows", "tasks"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(out)],
                   check=True, capture_output=True, cwd=out)
    (path,) = out.glob("shardflow-*.whl")
    return zipfile.ZipFile(path)


def _packages(root: Path, prefix: str) -> set[str]:
    return {prefix + "/".join(p.parent.relative_to(root).parts).join(["/", ""]).rstrip("/")
            for p in root.rglob("__init__.py") if ".venv" not in p.parts}


def test_every_package_of_the_checkout_is_in_the_wheel_under_shardflow(wheel: zipfile.ZipFile):
    names = wheel.namelist()
    in_wheel = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    expected = _packages(REPO / "src" / "shardflow", "shardflow") | _packages(REPO / "flows", "shardflow/flows") | _packages(REPO / "tasks", "shardflow/tasks")
    assert {"shardflow/targets", "shardflow/flows", "shardflow/tasks", "shardflow/runtime"} <= expected
    assert expected == in_wheel
    top_level = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"shardflow"}, "nothing but shardflow may land in site-packages"
    assert "shardflow/py.typed" in names


def test_the_wheel_has_one_version_and_the_script(wheel: zipfile.ZipFile):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    assert f"\nVersion: {shardflow.__version__}\n" in wheel.read(meta).decode()
    entry = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "shardflow = shardflow.cli:run" in wheel.read(entry).decode()
    requires = [line for line in wheel.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    runtime = sorted(r.split()[1].split(">")[0].split("=")[0] for r in requires if "extra ==" not in r)
    assert runtime == ["ml_dtypes", "numpy", "pyyaml"], "the runtime install stays free of Prefect, pyarrow and datasets"
