"""The fast tier's wall time and per-file line coverage: ``python tests/fast_tier.py`` from the repository root.

Runs ``python -m pytest -q -m "not slow"`` under coverage.py (settings in
pyproject.toml's ``[tool.coverage.*]``: the ``shardflow`` package, which holds
``src/shardflow``, ``flows/`` and ``tasks/``, child processes included), then
prints the wall time and coverage's per-file table, and lists every file under
the tier's floor of 50% line coverage. Exit status: pytest's if it failed,
else 1 when a file is under the floor, else 0. Extra arguments go to pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOOR = 50.0


def main(pytest_args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="fast-tier-cov-") as tmp:
        # An absolute data file, so child processes started in temporary directories write beside it.
        env = {**os.environ, "COVERAGE_FILE": str(Path(tmp) / ".coverage")}
        env.pop("PYTEST_ADDOPTS", None)
        cov = [sys.executable, "-m", "coverage"]
        start = time.monotonic()
        tests = subprocess.run([*cov, "run", "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", "-n", "0",
                                *pytest_args], cwd=REPO, env=env)
        wall = time.monotonic() - start
        subprocess.run([*cov, "combine", "-q"], cwd=REPO, env=env, check=True)
        subprocess.run([*cov, "report"], cwd=REPO, env=env, check=True)
        report = Path(tmp) / "coverage.json"
        subprocess.run([*cov, "json", "-q", "-o", str(report)], cwd=REPO, env=env, check=True)
        files = json.loads(report.read_text())["files"]
    under = sorted((f["summary"]["percent_covered"], name) for name, f in files.items() if f["summary"]["percent_covered"] < FLOOR)
    print(f"\nfast tier: pytest exit {tests.returncode}, {wall:.0f} s wall (coverage on; plain pytest is faster)")
    for percent, name in under:
        print(f"under {FLOOR:.0f}%: {name} {percent:.0f}%")
    print(f"{len(files)} files measured, {len(under)} under {FLOOR:.0f}%")
    return tests.returncode or (1 if under else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
