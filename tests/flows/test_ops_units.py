"""Operations pieces that need no Prefect server: artifact contents and keys, progress display,
URL sources, the tasks' retry and result settings, and ``shardflow serve``'s deployment."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from shardflow.cli.commands import main
from shardflow.cli.progress import Progress, ProgressDisplay, choose_mode, format_eta, format_rate
from shardflow.flows.report import artifact_key, dataset_slug, shard_rows, summary_description, summary_markdown
from shardflow.pipeline import build
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError, InputError, ValidationError
from shardflow.manifest import read_manifest
from shardflow.cli.options import is_url
from shardflow.sources.storage import local_path as file_url_to_path

from support.builds import version_files
from support.paths import SAMPLE

KEY_RE = re.compile(r"^[a-z0-9-]+$")


@pytest.fixture(scope="module")
def small_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus built without Prefect (3 train + 1 val shards); returns the version directory."""
    root = tmp_path_factory.mktemp("small")
    cfg = BuildConfig(name="wiki_en.v2", sources=(str(SAMPLE),), shard_tokens=50_000, val_fraction=0.1, unit_bytes=1)
    result = build(cfg, data_root=root / "data", catalog=root / "cat", workers=2)
    return Path(result.manifest_path).parent


# -- artifact keys and contents -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, slug",
    [("wiki", "wiki"), ("wiki_en.v2", "wiki-en-v2"), ("a--b__c", "a-b-c"), ("0day", "0day"), ("x.", "x")],
)
def test_artifact_keys_are_lowercase_letters_digits_and_dashes(name, slug):
    assert dataset_slug(name) == slug
    for kind in ("progress", "shards", "summary", "manifest"):
        key = artifact_key(name, kind)
        assert KEY_RE.match(key), key
        assert key == f"{slug}-{kind}"
    with pytest.raises(ValueError):
        artifact_key(name, "other")


def test_shard_table_rows_follow_the_manifest(small_version):
    m = read_manifest(small_version)
    rows = shard_rows(m)
    assert [r["file"] for r in rows] == [s.file for e in m.splits.values() for s in e.shards]
    assert {r["split"] for r in rows} == {"train", "val"}
    assert set(rows[0]) == {"split", "file", "tokens", "documents", "bytes", "sha256"}
    assert sum(r["tokens"] for r in rows) == m.totals["tokens"]
    assert sum(r["documents"] for r in rows) == m.totals["documents"]
    for r in rows:
        assert (small_version / r["file"]).stat().st_size == r["bytes"]
        assert re.fullmatch(r"[0-9a-f]{64}", r["sha256"])
    json.dumps(rows)  # a table artifact must be JSON


def test_summary_has_totals_throughput_tokenizer_dtype_format_validation_ref_and_manifest(small_version):
    m = read_manifest(small_version)
    path = small_version / "metadata.yaml"
    md = summary_markdown(m, manifest_path=path, created=True, seconds=2.0, tokenize_seconds=1.0, units=4,
                          input_bytes=1_000_000)
    for needle in (
        m.ref, str(path), "Validation", "passed", m.tokenized_info["tokenizer"], m.dtype, m.format_name,
        "Totals", "Throughput", f"{m.totals['tokens']:,}", f"{m.totals['tokens'] / 2.0:,.0f} tokens/s",
        "4 work units", "| train |", "| val |",
    ):
        assert needle in md, needle
    # The boundary token's '|' would split the table cell; it is escaped.
    assert "`<\\|endoftext\\|>`" in md
    assert m.ref in summary_description(m, created=True)
    unchanged = summary_markdown(m, manifest_path=path, created=False)
    assert "No new version" in unchanged and "Nothing was tokenized" in unchanged


# -- progress display -------------------------------------------------------------------------------


def _events(n: int = 4) -> list[Progress]:
    evs = [Progress(dataset="d", phase="tokenize", done=i, total=n, tokens=1000 * i, elapsed=0.5 * i) for i in range(n + 1)]
    evs += [Progress(dataset="d", phase="write", done=i, total=2, tokens=10 * i, elapsed=0.1 * i) for i in range(3)]
    return evs + [Progress(dataset="d", phase="done", done=1, total=1, ref="d@v1")]


def test_progress_math_and_formatting():
    ev = Progress(dataset="d", phase="tokenize", done=2, total=8, tokens=4_000_000, elapsed=2.0)
    assert ev.fraction == 0.25 and ev.tokens_per_second == 2e6 and ev.eta == 6.0
    assert format_rate(2e6) == "2.0M tokens/s" and format_rate(512) == "512 tokens/s"
    assert format_eta(3725) == "ETA 1:02:05" and format_eta(None) == "ETA ?"


def test_auto_mode_is_plain_when_piped_or_under_ci(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert choose_mode("auto", Tty()) == "bar"
    assert choose_mode("auto", io.StringIO()) == "plain"  # piped
    monkeypatch.setenv("CI", "true")
    assert choose_mode("auto", Tty()) == "plain"
    assert choose_mode("bar", io.StringIO()) == "bar"


def test_plain_lines_are_throttled_but_keep_first_and_last_of_each_phase():
    out = io.StringIO()
    with ProgressDisplay("plain", stream=out, interval=3600) as display:
        for ev in _events():
            display(ev)
    lines = out.getvalue().splitlines()
    assert lines == [
        "shardflow: d: tokenize 0/4 work units (0%), 0 tokens, 0 tokens/s, ETA ?",
        "shardflow: d: tokenize 4/4 work units (100%), 4,000 tokens, 2.0k tokens/s",
        "shardflow: d: write 0/2 shards (0%), ETA ?",
        "shardflow: d: write 2/2 shards (100%)",
        "shardflow: d: done, d@v1",
    ]
    out = io.StringIO()
    with ProgressDisplay("plain", stream=out, interval=0) as display:
        for ev in _events():
            display(ev)
    assert len(out.getvalue().splitlines()) == len(_events())
    assert "ETA 0:00:01" in out.getvalue()  # 2 of 4 units in 1 s


def test_bar_shows_units_tokens_per_second_and_eta():
    out = io.StringIO()
    with ProgressDisplay("bar", stream=out) as display:
        for ev in _events()[:3]:
            display(ev)
    text = out.getvalue()
    assert "d tokenize" in text and "2/4" in text and "work units" in text
    assert "2.0k tokens/s" in text and "ETA 0:00:01" in text
    assert "\x1b[" in text  # drawn for a terminal


@pytest.mark.slow
def test_cli_without_prefect_prints_plain_progress_and_keeps_stdout_clean(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHARDFLOW_PROGRESS_INTERVAL", "0")
    status = main(["build", str(SAMPLE), "--name", "p", "--data-root", "d", "--catalog", "c", "--no-prefect",
                   "--progress", "plain", "--shard-tokens", "100000"])
    assert status == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["published p@v1", str(tmp_path / "d" / "p" / "v1" / "metadata.yaml")]
    assert "shardflow: p: tokenize 1/1 work units (100%)" in err and "tokens/s" in err
    assert "shardflow: p: done, p@v1" in err


# -- URL sources ---------------------------------------------------------------------------------------


@pytest.fixture
def memfs():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = "/shardflow-test-bucket"
    if fs.exists(root):
        fs.rm(root, recursive=True)
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_file_urls_map_to_local_paths():
    assert is_url("s3://b/x") and is_url("file:///x") and not is_url("/data/x.parquet") and not is_url("a/b")
    assert file_url_to_path("file:///data/my%20corpus/x.parquet") == "/data/my corpus/x.parquet"
    assert file_url_to_path("file://localhost/data/x.parquet") == "/data/x.parquet"
    with pytest.raises(InputError, match="local path"):
        file_url_to_path("file://otherhost/data/x.parquet")


def test_memory_urls_are_listed_in_place_with_the_same_relative_names(memfs, tmp_path):
    from shardflow.sources import discover_inputs

    fs, root = memfs
    fs.put_file(str(SAMPLE), f"{root}/corpus/a.parquet")
    fs.put_file(str(SAMPLE), f"{root}/corpus/sub/b.parquet")
    fs.pipe(f"{root}/corpus/notes.txt", b"not data")
    d = discover_inputs([f"memory://{root}/corpus/"])
    assert [i.relname for i in d] == ["a.parquet", "sub/b.parquet"]
    assert [i.path for i in d] == [f"memory://{root}/corpus/a.parquet", f"memory://{root}/corpus/sub/b.parquet"]
    assert all(i.identity and i.size == SAMPLE.stat().st_size and not i.sha256 for i in d)
    g = discover_inputs([f"memory://{root}/corpus/*.parquet"])
    assert [i.relname for i in g] == ["a.parquet"]
    f = discover_inputs([f"memory://{root}/corpus/sub/b.parquet"])
    assert [i.relname for i in f] == ["b.parquet"]
    assert not list(tmp_path.iterdir())  # nothing downloaded anywhere


def test_bad_urls_are_user_errors(memfs, tmp_path):
    from shardflow.sources import discover_inputs

    fs, root = memfs
    with pytest.raises(InputError, match="no such bucket or object"):
        discover_inputs([f"memory://{root}/missing/"])
    fs.pipe(f"{root}/empty/readme.txt", b"x")
    with pytest.raises(InputError, match="holds no input files"):
        discover_inputs([f"memory://{root}/empty/"])
    with pytest.raises(InputError, match="matches no objects"):
        discover_inputs([f"memory://{root}/empty/*.parquet"])
    with pytest.raises(InputError, match="no fsspec filesystem|not a usable"):
        discover_inputs(["nosuchscheme://bucket/x.parquet"])


@pytest.mark.slow
def test_build_from_a_url_is_byte_identical_to_the_local_build(memfs, tmp_path, monkeypatch, capsys):
    fs, root = memfs
    local = tmp_path / "local-corpus"
    (local / "sub").mkdir(parents=True)
    shutil.copy(SAMPLE, local / "a.parquet")
    shutil.copy(SAMPLE, local / "sub" / "b.parquet")
    fs.put(str(local), f"{root}/corpus", recursive=True)
    monkeypatch.chdir(tmp_path)
    common = ["--name", "u", "--shard-tokens", "60000", "--no-prefect", "--progress", "none"]
    assert main(["build", str(local), *common, "--data-root", "a", "--catalog", "ca"]) == 0
    a = Path(capsys.readouterr().out.splitlines()[-1]).parent
    assert main(["build", f"memory://{root}/corpus/", *common, "--data-root", "b", "--catalog", "cb"]) == 0
    b = Path(capsys.readouterr().out.splitlines()[-1]).parent
    # Read in place: no mirror, no copy of an input under the data root.
    assert not (tmp_path / "b" / "u" / ".sources").exists()
    assert not [p for p in (tmp_path / "b").rglob("*.parquet")]
    assert version_files(a) == version_files(b) and len(version_files(a)) >= 4
    # Planned from the store's identity of each object; hashed by the workers: the local build's key and hashes.
    mb = read_manifest(b)
    assert read_manifest(a).build_key == mb.build_key and all(i["identity"] for i in mb.inputs)
    assert [i["sha256"] for i in read_manifest(a).inputs] == [i["sha256"] for i in mb.inputs]
    assert main(["build", f"file://{local}", *common, "--data-root", "c", "--catalog", "cc"]) == 0
    c = Path(capsys.readouterr().out.splitlines()[-1]).parent
    assert version_files(a) == version_files(c)


# -- retries and results -------------------------------------------------------------------------------


def test_only_io_tasks_retry_and_only_on_transient_os_errors():
    from shardflow.tasks.build import STAGE_TASKS, is_transient, plan_task

    every = [plan_task, *STAGE_TASKS.values()]
    retried = {t.name for t in every if t.retries}
    assert retried == {"plan", "tokenize-unit", "write-shard", "publish"}
    for t in every:
        assert t.retries in (0, 2) and t.retry_condition_fn is (is_transient if t.retries else None), t.name
        assert t.persist_result is False, t.name  # results are small metadata, never persisted

    class State:
        def __init__(self, exc):
            self.data = exc

    assert is_transient(None, None, State(OSError("stale NFS handle")))
    assert is_transient(None, None, State(TimeoutError("read timed out")))
    for exc in (InputError("bad row"), ValidationError("checksum"), ConfigError("opt"), FileNotFoundError("x"),
                PermissionError("x"), ValueError("x")):
        assert not is_transient(None, None, State(exc)), exc


# -- shardflow serve ------------------------------------------------------------------------------------


def test_serve_dry_run_shows_the_one_deployment_with_cron_tags_and_parameters(tmp_path, monkeypatch, capsys):
    from shardflow.flows.build import build_dataset

    monkeypatch.chdir(tmp_path)
    assert main(["serve", "corpora/wiki/", "s3://corpora/code/*.parquet", "--name", "wiki", "--deployment", "wiki-nightly",
                 "--cron", "0 2 * * *", "--timezone", "Europe/Paris", "--shard-tokens", "1000000",
                 "--val-fraction", "0.01", "--workers", "8", "--data-root", "out/data", "--catalog", "out/manifests",
                 "--runner", "dask", "--address", "tcp://10.0.0.5:8786", "--dry-run"]) == 0
    dep = json.loads(capsys.readouterr().out)
    assert dep["deployment"] == "build-dataset/wiki-nightly"
    assert (dep["cron"], dep["timezone"]) == ("0 2 * * *", "Europe/Paris")
    assert dep["tags"] == ["shardflow", "dataset:wiki"]
    params = dep["parameters"]
    # Local paths made absolute (a served run may start elsewhere), URLs as given.
    assert params["config"]["sources"] == [str(tmp_path / "corpora" / "wiki"), "s3://corpora/code/*.parquet"]
    assert params["data_root"] == str(tmp_path / "out" / "data")
    assert params["catalog"] == str(tmp_path / "out" / "manifests")
    assert (params["workers"], params["runner"], params["address"]) == (8, "dask", "tcp://10.0.0.5:8786")
    # The parameters are what the flow accepts.
    config = build_dataset.validate_parameters(params)["config"]
    assert isinstance(config, BuildConfig)
    assert (config.name, config.shard_tokens, config.val_fraction) == ("wiki", 1_000_000, 0.01)

    # No --cron: a deployment whose runs start by hand only; the deployment is named after the dataset.
    assert main(["serve", "/data/c", "--name", "code", "--dry-run"]) == 0
    dep = json.loads(capsys.readouterr().out)
    assert dep["deployment"] == "build-dataset/code" and dep["cron"] is None
    # The defaults resolved now, absolute, and the installed module as the entrypoint: no run depends on its directory.
    assert (dep["parameters"]["data_root"], dep["parameters"]["catalog"]) == (str(tmp_path / "data"),
                                                                            str(tmp_path / "manifests"))
    assert dep["entrypoint"] == "shardflow.flows.build.build_dataset"
    monkeypatch.setenv("SHARDFLOW_DATA_ROOT", "s3://bucket/data")  # a bucket's URLs as given, from the environment too
    monkeypatch.setenv("SHARDFLOW_CATALOG", "s3://bucket/catalog")
    assert main(["serve", "/data/c", "--name", "code", "--dry-run"]) == 0
    params = json.loads(capsys.readouterr().out)["parameters"]
    assert (params["data_root"], params["catalog"]) == ("s3://bucket/data", "s3://bucket/catalog")


@pytest.mark.parametrize(
    "options, message",
    [
        (["--cron", "0 25 * * *"], r"--cron '0 25 \* \* \*': Invalid cron string: .*e\.g\. '0 2 \* \* \*'"),
        (["--cron", "every night"], r"--cron 'every night': Invalid cron string"),
        (["--cron", "0 2 * * *", "--timezone", "Mars/Base"], r"--timezone 'Mars/Base': not a timezone; give an IANA name"),
        (["--timezone", "UTC"], r"--timezone is the timezone of --cron; give --cron"),
        (["--runner", "dask"], r"--runner dask needs --address tcp://HOST:PORT"),
        (["--workers", "0"], r"--workers must be at least 1, not 0"),
        (["--name", "W!"], r"not allowed"),
    ],
)
def test_bad_serve_options_are_one_line_user_errors(capsys, options, message):
    assert main(["serve", "corpus/", "--name", "w", *options, "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert re.fullmatch(rf"shardflow: error: .*{message}.*\n", captured.err), captured.err
    assert captured.out == ""


def test_serve_takes_one_dataset_and_points_to_prefect_yaml_for_several(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--dry-run"])
    assert exit_.value.code == 2 and "required: sources, --name" in capsys.readouterr().err
    # The schedules file is gone: several datasets are prefect.yaml's deployments.
    with pytest.raises(SystemExit):
        main(["serve", "corpus/", "--name", "w", "--schedules", "schedules.yaml"])
    assert "unrecognized arguments: --schedules schedules.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "Several datasets: declare them in prefect.yaml (docs/OPERATIONS.md)" in " ".join(capsys.readouterr().out.split())


def test_a_plan_handle_travels_as_its_staging_directory_not_as_the_whole_plan(tmp_path):
    """Every task carries the plan: pickled as the path of plan.json, its size does not grow with the corpus."""
    import dataclasses
    import pickle

    from shardflow.pipeline import build_lock, plan_build
    from shardflow.tasks.build import PlanHandle

    sizes = []
    for unit_bytes in (1 << 30, 1):  # 1 unit, then one unit per row group
        config = BuildConfig(name=f"ph{unit_bytes}", sources=(str(SAMPLE),), unit_bytes=unit_bytes)
        plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat")
        with build_lock(plan) as plan:
            raw = pickle.dumps(PlanHandle(plan))
            assert pickle.loads(raw).plan == plan
            sizes.append((len(plan.units), len(raw), len(pickle.dumps(plan))))
        # A plan that is not its staging directory's plan.json travels whole.
        other = dataclasses.replace(plan, units=plan.units[:1])
        assert pickle.loads(pickle.dumps(PlanHandle(other))).plan == other
    (u1, h1, p1), (u2, h2, p2) = sizes
    assert u2 > u1 and p2 > p1 and h2 - h1 < 16 and h2 < p1  # only the names differ in length
