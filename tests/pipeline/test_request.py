"""The build request: workers, runner, address and the bucket's places are checked and resolved in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.pipeline import BuildRequest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = BuildConfig(name="r", sources=("corpus",))


@pytest.mark.parametrize("options, message", [
    (dict(workers=0), r"^--workers must be at least 1, not 0$"),
    (dict(workers=True), r"^--workers must be at least 1, not True$"),
    (dict(runner="ray"), r"^--runner ray: unknown; use one of threads, dask$"),
    (dict(runner="dask"), r"^--runner dask needs --address tcp://HOST:PORT"),
    (dict(address="tcp://h:8786"), r"^--address is for --runner dask"),
    (dict(data_root="s3://b/data"), r"^--catalog \(unset\): a build to a bucket needs both"),
    (dict(data_root="s3://b/data", catalog="s3://other/catalog"), r"one bucket"),
])
def test_a_request_is_checked_when_it_is_made(options, message):
    with pytest.raises(ConfigError, match=message):
        BuildRequest(config=CONFIG, **options)


def test_a_request_resolves_a_bucket_once_and_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_DATA_ROOT", "s3://b/data")
    monkeypatch.setenv("SHARDFLOW_CATALOG", "s3://b/catalog")
    request = BuildRequest(config=CONFIG, scratch=str(tmp_path))
    assert request.places is request.places  # resolved once, when made
    assert request.local == (str(tmp_path / "b" / "data"), str(tmp_path / "b" / "catalog"))
    assert request.places.version_url("r@v2") == "s3://b/data/r/v2"
    monkeypatch.delenv("SHARDFLOW_DATA_ROOT")
    monkeypatch.delenv("SHARDFLOW_CATALOG")
    local = BuildRequest(config=CONFIG, data_root="d", catalog="c")
    assert (local.places, local.local) == (None, ("d", "c"))


def _code(*dirs: str) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for d in dirs for p in (ROOT / d).rglob("*.py")}


def test_workers_runner_address_and_bucket_places_are_decided_in_one_place():
    """The checks are written once (BuildRequest); the command line, the flow and build() make a request."""
    code = _code("src/shardflow", "flows", "tasks")
    del code["src/shardflow/cli/lifecycle.py"]  # push's own --workers (files sent at once), not a build's
    checks = {
        "workers": re.compile(r"workers\s*<\s*1"),
        "runner": re.compile(r"--runner dask needs --address"),
        "address": re.compile(r"--address is for"),
        "bucket places": re.compile(r"\bbucket_places\("),
    }
    for what, pattern in checks.items():
        where = sorted(path for path, text in code.items() if pattern.search(text) and not path.endswith("bucket/build.py"))
        assert where == ["src/shardflow/pipeline/request.py"], (what, where)
    for path in ("flows/build.py", "src/shardflow/cli/build.py", "src/shardflow/pipeline/run.py"):
        assert "BuildRequest(" in code[path], path
    # The catalog of a build to a bucket is synced in one place: run_request, in the process that runs the build.
    assert sorted(p for p, text in code.items() if re.search(r"\bsync_catalog\(", text)) == \
        ["src/shardflow/bucket/build.py", "src/shardflow/pipeline/run.py"]
