"""Retries: transient I/O errors are retried a bounded number of times; deterministic errors never are.

Both paths use one rule, ``shardflow.errors.is_transient``: ``build()`` retries a
failed step itself (``shardflow.pipeline.retrying``), the Prefect tasks through
their ``retry_condition_fn``. Checked here without a Prefect server: the
condition function is called the way Prefect calls it, and the core retries
are driven by injected errors (``SHARDFLOW_FAULT=eio:POINT:N``).
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from support.builds import assert_same_version, build_in
from support.corpus import small_vocab, split_sample
from shardflow import pipeline as core
from shardflow import faults
from shardflow.errors import RETRY, CatalogError, ConfigError, InputError, ManifestError, RetryPolicy, ValidationError, is_transient

TRANSIENT = [
    OSError(errno.EIO, "Input/output error"),
    OSError(errno.ETIMEDOUT, "Connection timed out"),
    OSError(errno.ESTALE, "Stale file handle"),
    ConnectionResetError(errno.ECONNRESET, "reset"),
    OSError("an I/O error without an errno"),
]
PERMANENT = [
    InputError("x.parquet: no column 'text'"),
    ConfigError("unknown shard format"),
    ValidationError("checksum"),
    ManifestError("schema"),
    CatalogError("locked"),
    FileNotFoundError(errno.ENOENT, "No such file or directory"),
    PermissionError(errno.EACCES, "Permission denied"),
    IsADirectoryError(errno.EISDIR, "Is a directory"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EROFS, "Read-only file system"),
    ValueError("a bug"),
    KeyError("a bug"),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=repr)
def test_transient_io_errors_are_retried(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", PERMANENT, ids=repr)
def test_deterministic_errors_are_not_retried(exc):
    assert not is_transient(exc)


def test_prefect_tasks_retry_by_the_same_rule_and_a_bounded_number_of_times():
    pytest.importorskip("prefect")
    from shardflow.tasks import build as tasks

    # Prefect calls retry_condition_fn(task, task_run, state) with state.data = the exception.
    for exc in TRANSIENT:
        assert tasks.is_transient(None, None, SimpleNamespace(data=exc)) is True
    for exc in PERMANENT:
        assert tasks.is_transient(None, None, SimpleNamespace(data=exc)) is False
    for t in (tasks.plan_task, *tasks.STAGE_TASKS.values()):
        if t.name in ("plan", "tokenize-unit", "write-shard", "publish"):
            # The core's one policy, as the in-process executors apply it (pipeline.run.retrying).
            assert (t.retries, t.retry_delay_seconds) == (RETRY.retries, RETRY.delays()), t.name
            assert t.retry_condition_fn is tasks.is_transient, t.name
        else:  # pure compute and checks are never retried
            assert t.retries == 0, t.name


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setattr(core.run, "RETRY", RetryPolicy(delay=0.0))
    faults.reset()
    vocab = small_vocab(tmp_path)
    src = split_sample(tmp_path / "src")
    # A held-out split: its val shards are gathered (copied, with shard-mid in the copy); train's are hard-linked pieces.
    options = dict(tokenizer=str(vocab), shard_tokens=30_000, batch_rows=8, val_fraction=0.2)
    reference = build_in(tmp_path / "reference", src, "r", options)
    return tmp_path, src, options, Path(reference.manifest_path).parent


def _retry_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "transient I/O error" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["eio:tokenize-tokens:2", "eio:shard-mid:1", "eio:shard-indexed:3", "eio:publish-stamped:1", "eio:catalog-write:1", "eio:atomic-write:4"])
def test_a_transient_error_is_retried_and_the_result_is_unchanged(setup, monkeypatch, caplog, spec):
    tmp_path, src, options, reference = setup
    monkeypatch.setenv(faults.ENV, spec)
    caplog.set_level(logging.WARNING, logger="shardflow.pipeline")
    result = build_in(tmp_path / "flaky", src, "r", options, workers=2)
    assert result.created
    warnings = _retry_warnings(caplog)
    assert len(warnings) == 1 and "retry 1 of 2" in warnings[0] and "Input/output error" in warnings[0]
    assert_same_version(Path(result.manifest_path).parent, reference, ("created_at", "dataset_path"))


@pytest.mark.slow
def test_retries_are_bounded(setup, monkeypatch, caplog, capsys):
    tmp_path, src, options, _ = setup
    # Every attempt of the first gathered shard (val's) fails: 1 try + 2 retries, then the error surfaces.
    monkeypatch.setenv(faults.ENV, "eio:shard-mid:1,eio:shard-mid:2,eio:shard-mid:3,eio:shard-mid:4")
    caplog.set_level(logging.WARNING, logger="shardflow.pipeline")
    with pytest.raises(OSError) as info:
        build_in(tmp_path / "broken", src, "r", options, workers=1)
    assert info.value.errno == errno.EIO
    first = [w.split("; ")[-1] for w in _retry_warnings(caplog) if "r_val_000000" in w]
    assert first == ["retry 1 of 2", "retry 2 of 2"]
    # At the command line: one clean line, nothing published; the rerun finishes.
    from shardflow.cli.commands import main

    faults.reset()
    args = ["build", str(src), "--name", "r", "--no-prefect", "--data-root", str(tmp_path / "broken" / "data"),
            "--catalog", str(tmp_path / "broken" / "catalog"), "--tokenizer", options["tokenizer"],
            "--shard-tokens", "30000", "--batch-rows", "8", "--val-fraction", "0.2", "--workers", "1"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Input/output error" in err.strip().splitlines()[-1]
    assert not (tmp_path / "broken" / "catalog" / "r.yaml").exists()
    monkeypatch.delenv(faults.ENV)
    assert main(args) == 0


def test_bad_input_is_not_retried(setup, monkeypatch, caplog):
    tmp_path, _, options, _ = setup
    bad = tmp_path / "bad.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), bad)
    calls = []
    real = core.plan.plan_units

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(core.plan, "plan_units", counting)
    caplog.set_level(logging.WARNING, logger="shardflow.pipeline")
    with pytest.raises(InputError, match="no column 'text'"):
        build_in(tmp_path / "b", bad, "b", options)
    assert calls == [1] and _retry_warnings(caplog) == []


@pytest.mark.slow
def test_a_full_disk_is_not_retried(setup, monkeypatch, caplog):
    tmp_path, src, options, _ = setup
    monkeypatch.setenv(faults.ENV, "enospc:shard-mid")
    caplog.set_level(logging.WARNING, logger="shardflow.pipeline")
    with pytest.raises(OSError) as info:
        build_in(tmp_path / "nospace", src, "r", options, workers=1)
    assert info.value.errno == errno.ENOSPC
    assert faults.hits("shard-mid") >= 1 and _retry_warnings(caplog) == []
