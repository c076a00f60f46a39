"""Concurrency: builds started together never corrupt the catalog, and a duplicate run is told to wait.

* The same build twice at once: one publishes, the other fails at once with a
  clear message (or, asked to wait, waits and reports the published version).
* Two builds of the same dataset with different inputs at once: both publish,
  as distinct versions, and the catalog lists both.
* Many processes adding catalog entries at once lose none (flock + atomic replace).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from support.builds import build_in, fault_options, versions
from support.cli import start_build_cli
from support.corpus import small_vocab, split_sample
from shardflow.pipeline import build, build_lock, plan_build
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.errors import CatalogError
from shardflow.manifest import read_manifest
from shardflow.validation import validate_dir

NAME = "race"


@pytest.fixture(scope="module")
def races(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two races at once (four subprocesses started together), made deterministic with a barrier.

    Every run that gets its lock stops inside it, at the layout step
    (``SHARDFLOW_FAULT=wait:layout``), until the test releases it: only after
    the duplicate run of the same build has given up and both runs of the two
    different builds hold their locks. So the runs really overlap, however
    loaded the machine is.
    """
    base = tmp_path_factory.mktemp("races")
    options = fault_options(small_vocab(base))
    src = split_sample(base / "src")
    x = split_sample(base / "x", (30, 31))
    y = base / "y"
    y.mkdir()
    (x / "part1.parquet").rename(y / "part1.parquet")
    release = base / "release"
    env = {"SHARDFLOW_FAULT": "wait:layout", "SHARDFLOW_FAULT_RELEASE": str(release)}
    procs = {
        "same": [start_build_cli(src, base / "same", NAME, options, env=env) for _ in range(2)],
        "diff": [start_build_cli(d, base / "diff", NAME, options, env=env) for d in (x, y)],
    }
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        waiting = len(list(base.glob("release.reached-*")))
        gave_up = sum(p.poll() is not None for p in procs["same"])
        if waiting >= 3 and gave_up >= 1:
            break
        time.sleep(0.05)
    release.touch()
    out = {key: [SimpleNamespace(returncode=p.wait(timeout=120), stdout=p.stdout.read(), stderr=p.stderr.read())
                 for p in ps] for key, ps in procs.items()}
    for ps in procs.values():
        for p in ps:
            p.stdout.close()
            p.stderr.close()
    return {"base": base, "procs": out, "options": options, "src": src, "waiting": waiting}


@pytest.mark.slow
def test_the_same_build_twice_at_once_publishes_once(races):
    root = races["base"] / "same"
    assert races["waiting"] == 3  # the winner of the duplicate pair and both different builds
    procs = sorted(races["procs"]["same"], key=lambda p: p.returncode)
    assert [p.returncode for p in procs] == [0, 2], [p.stderr for p in procs]
    # Progress lines may precede it on stderr (plain lines when not a terminal); the error is one line.
    errors = [line for line in procs[1].stderr.splitlines() if line.startswith("shardflow: error:")]
    assert len(errors) == 1, procs[1].stderr
    loser = errors[0]
    assert loser.startswith("shardflow: error: the build of 'race'")
    assert "is locked by another process" in loser and "Wait for it to finish and run the command again" in loser
    assert "Traceback" not in loser
    assert versions(root, NAME) == ["v1"]
    validate_dir(root / "data" / NAME / "v1")
    # Run again, it reports the published version.
    again = build_in(root, races["src"], NAME, races["options"])
    assert not again.created and again.ref == f"{NAME}@v1"


@pytest.mark.slow
def test_different_builds_of_one_dataset_at_once_both_publish(races):
    root = races["base"] / "diff"
    procs = races["procs"]["diff"]
    assert [p.returncode for p in procs] == [0, 0], [p.stderr for p in procs]
    refs = sorted(p.stdout.splitlines()[0].split()[-1] for p in procs)
    assert refs == [f"{NAME}@v1", f"{NAME}@v2"]
    data = yaml.safe_load((root / "catalog" / f"{NAME}.yaml").read_text())
    assert data["latest"] == "v2" and [v["version"] for v in data["versions"]] == ["v1", "v2"]
    inputs = set()
    for v in ("v1", "v2"):
        directory = root / "data" / NAME / v
        validate_dir(directory, published=True, catalog=root / "catalog")
        inputs.add(tuple(i["relname"] for i in read_manifest(directory).inputs))
    assert inputs == {("part0.parquet",), ("part1.parquet",)}


_ADDER = """
import sys
from shardflow.catalog import Catalog, VersionEntry
cat = Catalog(sys.argv[1])
for i in range(int(sys.argv[3])):
    with cat.lock("many"):
        v = cat.next_version("many")
        cat.add("many", VersionEntry(version=v, path=sys.argv[1] + "/d/" + v, created_at="t", build_key=sys.argv[2] + str(i)))
"""


@pytest.mark.slow
def test_concurrent_catalog_writers_lose_no_entry(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", _ADDER, str(tmp_path), f"p{n}-", "10"], stderr=subprocess.PIPE)
        for n in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode()
    cat = Catalog(tmp_path)
    got = cat.versions("many")
    assert [v.version for v in got] == [f"v{i}" for i in range(1, 41)]
    assert len({v.build_key for v in got}) == 40
    assert cat.latest("many") == "v40"
    assert not list(tmp_path.glob(".*.tmp-*"))


@pytest.mark.slow
def test_a_second_run_waits_when_asked_to(tmp_path):
    options = fault_options(small_vocab(tmp_path))
    config = BuildConfig(name="wait", sources=(str(split_sample(tmp_path / "src")),), **options)
    kw = dict(data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    plan = plan_build(config, **kw)
    released = threading.Event()

    def hold() -> None:
        with build_lock(plan):
            time.sleep(1.0)
        released.set()

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.2)
    with pytest.raises(CatalogError, match=r"the build of 'wait' .* is locked by another process"):
        build(config, **kw)
    result = build(config, **kw, lock_timeout=None)  # waits for the holder, then builds
    assert released.is_set() and result.created and result.ref == "wait@v1"
    holder.join()


@pytest.mark.slow
def test_a_run_that_waited_reports_what_the_other_published(tmp_path):
    options = fault_options(small_vocab(tmp_path))
    config = BuildConfig(name="w2", sources=(str(split_sample(tmp_path / "src")),), **options)
    kw = dict(data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    plan = plan_build(config, **kw)
    done: list = []

    def first() -> None:
        with build_lock(plan):
            time.sleep(0.5)
        done.append(build(config, **kw, lock_timeout=None))

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.1)
    # Waits for the lock; by then the build may be published: nothing is built twice.
    second = build(config, **kw, lock_timeout=None)
    t.join()
    refs = {second.ref, done[0].ref}
    assert refs == {"w2@v1"} and [second.created, done[0].created].count(True) == 1
    assert versions(tmp_path, "w2") == ["v1"]


def test_the_lock_then_recheck_sequence_is_written_once_and_every_runner_goes_through_it():
    """Plan -> published? -> lock -> published meanwhile? -> stages: only ``drive`` (pipeline/run.py) takes the
    build's lock (``build_lock``, its default, or a build to a bucket's, which takes ``build_lock`` and then the
    bucket's lease: bucket/driving.py); the Prefect flow and the command line's runners call it through
    ``run_request`` with their executor."""
    import re

    root = Path(__file__).resolve().parents[2]
    files = [*root.joinpath("src", "shardflow").rglob("*.py"), *root.joinpath("flows").rglob("*.py"),
             *root.joinpath("tasks").rglob("*.py")]
    takers = sorted(str(f.relative_to(root)) for f in files if re.search(r"with build_lock\(", f.read_text()))
    assert takers == ["src/shardflow/bucket/driving.py"]
    lockers = sorted(str(f.relative_to(root)) for f in files if re.search(r"with lock\(plan", f.read_text()))
    assert lockers == ["src/shardflow/pipeline/run.py"]
    assert "lock: Callable[..., ContextManager[BuildPlan]] = build_lock" in (root / "src/shardflow/pipeline/run.py").read_text()
    assert "run_request(" in (root / "flows" / "build.py").read_text()
    assert "run_request(" in (root / "src" / "shardflow" / "cli" / "build.py").read_text()
