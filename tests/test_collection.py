"""CI's test collection: every ``test_*.py`` under ``tests/`` contributes tests to the README's ``python -m pytest -q``.

pytest's default ``norecursedirs`` holds ``build``, which once dropped all of
``tests/pipeline/`` (golden bytes, resume) from CI without a sound. This runs the
collection exactly as CI does (repository root, no path arguments, so
pyproject's ``testpaths`` and ``norecursedirs`` apply) and compares it with the
files on disk, so a directory name can't silently drop tests again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO
from support.suite import COLLECTED, LONGEST_FIRST

TESTS = REPO / "tests"


def collected_files(*extra_args: str) -> tuple[set[Path], str]:
    """The test files that ``python -m pytest --collect-only -q`` from the repository root takes tests from, and its output."""
    env = dict(os.environ)
    # The outer run's options (say PYTEST_ADDOPTS='-m "not slow"') would deselect tests; CI sets none.
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        # -n 0: the same collection in this one process (pyproject's -n 2 would collect it once per worker).
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *extra_args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"collection failed (exit {done.returncode}):\n{output[-4000:]}"
    files = {(REPO / line.split("::", 1)[0]).resolve() for line in done.stdout.splitlines() if "::" in line}
    return files, output


@pytest.mark.slow
def test_ci_collection_includes_every_test_file(request: pytest.FixtureRequest):
    config = request.config
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and config.invocation_params.dir == REPO:
        # This session is CI's collection (the repository root, no path arguments): no second one needed.
        collected, output = {(REPO / f).resolve() for f in config.stash[COLLECTED]}, ""
    else:
        collected, output = collected_files()
    on_disk = {p.resolve() for p in TESTS.rglob("test_*.py")}
    missing = sorted(str(p.relative_to(REPO)) for p in on_disk - collected)
    assert not missing, (
        "`python -m pytest -q` from the repository root collects no test from these files; "
        f"check norecursedirs/testpaths in pyproject.toml or the file's test names: {missing}\n{output[-2000:]}"
    )
    assert any(p.parent.name == "pipeline" for p in collected)


def test_the_longest_first_files_exist():
    """The scheduling list names real files: a renamed one would quietly fall back to collection order."""
    missing = [path for path in LONGEST_FIRST if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that are gone: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
