"""Faults around a running build (issue 26): a killed build's temporary server, network and storage
failures, and command-line misuse, each ending in one message (or no leftover process)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.builds import build_in
from support.cli import cli_env, run_main
from support.corpus import small_vocab
from support.paths import SAMPLE


def _processes_with(home: Path) -> list[int]:
    """Processes whose environment names this PREFECT_HOME: the build's temporary server and its watcher."""
    needle = f"PREFECT_HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_build_leaves_no_temporary_server_behind(tmp_path: Path, sig: signal.Signals) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SHARDFLOW_"))}
    # A long start-up allowance: the signal must find the build waiting for its server, never already finished
    # without it (a loaded machine's server can take over the default 20 s; the build then publishes alone).
    env.update(PREFECT_HOME=str(home), SHARDFLOW_REUSE_LOCAL_SERVER="0", CI="true", PYTHONUNBUFFERED="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    build = subprocess.Popen(
        [sys.executable, "-m", "shardflow", "build", str(SAMPLE), "--name", "killed",
         "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "cat")],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    seen: list[str] = []
    started = threading.Event()
    port: list[int] = []

    def read() -> None:
        assert build.stdout is not None
        for line in build.stdout:
            seen.append(line)
            found = re.search(r"Starting temporary server on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port.append(int(found.group(1)))
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(120), "".join(seen)[-3000:]
        assert _listening(port[0]) and _processes_with(home)  # the server is up, as the log line says
        build.send_signal(sig)
        assert build.wait(30) == -sig
        deadline = time.monotonic() + 15
        while (_processes_with(home) or _listening(port[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _processes_with(home)
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
        assert not _listening(port[0])
    finally:
        for pid in _processes_with(home):  # never leave one behind for the next test, whatever failed
            os.kill(pid, signal.SIGKILL)
        build.kill()
        build.wait()


# -- an object store without credentials, or out of reach ---------------------------------------------------


def _aws_free_env(tmp_path: Path, **values: str) -> dict[str, str]:
    """This environment without AWS settings or shardflow's, and with no credentials file to fall back on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SHARDFLOW_", "PREFECT_"))}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1", **values)
    return env


def _build_s3(url: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardflow", "build", url, "--name", "remote", "--no-prefect",
         "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "cat")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_an_object_store_without_credentials_is_one_message(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from support.s3 import S3Server

    server = S3Server()
    try:
        server.fs().mkdir("creds")
        server.fs().put(str(SAMPLE), "creds/sample.parquet")
        res = _build_s3("s3://creds/sample.parquet", tmp_path, _aws_free_env(tmp_path, AWS_ENDPOINT_URL=server.endpoint))
    finally:
        server.stop()
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.splitlines() == [
        "shardflow: error: s3://creds/sample.parquet: no usable credentials for the object store (Unable to locate "
        "credentials); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE (and AWS_ENDPOINT_URL for "
        "an S3-compatible store)"
    ]
    assert not (tmp_path / "cat").exists() or not any((tmp_path / "cat").iterdir())


@pytest.mark.slow
def test_an_object_store_out_of_reach_is_retried_then_one_message(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _aws_free_env(tmp_path, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing",
                        AWS_SECRET_ACCESS_KEY="testing", AWS_MAX_ATTEMPTS="1")
    res = _build_s3("s3://gone/sample.parquet", tmp_path, env)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    # Classed as transient: the core's retries apply (two), then one line says what to check.
    assert sum("transient I/O error" in line for line in lines) == 2, res.stderr
    errors = [line for line in lines if line.startswith("shardflow: error:")]
    assert len(errors) == 1 and errors == lines[-1:], res.stderr
    assert re.fullmatch(
        r"shardflow: error: the object store could not be reached \(Could not connect to the endpoint URL: "
        rf"\"http://127\.0\.0\.1:{port}/gone\?.*\"\); check AWS_ENDPOINT_URL and the network\. Nothing partial "
        r"was published; run the same command again: finished work is reused",
        errors[0],
    ), errors[0]
    assert not (tmp_path / "cat" / "remote.yaml").exists()


def test_object_store_connection_errors_are_transient_and_missing_credentials_are_not() -> None:
    from types import SimpleNamespace

    exceptions = pytest.importorskip("botocore.exceptions")
    from shardflow.errors import describe_storage_error, is_transient
    from shardflow.tasks.build import is_transient as task_retries

    down = exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b")
    reset = exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:9/b")
    timeout = exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:9/b")
    no_keys = exceptions.NoCredentialsError()
    for exc in (down, reset, timeout):
        assert is_transient(exc) and task_retries(None, None, SimpleNamespace(data=exc)), exc
        assert describe_storage_error(exc).startswith("the object store could not be reached")
    assert not is_transient(no_keys) and not task_retries(None, None, SimpleNamespace(data=no_keys))
    assert describe_storage_error(no_keys).startswith("no usable credentials for the object store")
    assert describe_storage_error(KeyError("x")) is None  # anything else keeps its traceback


# -- command-line misuse and a full disk -------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus built once (with a held-out split) into ROOT/data and ROOT/catalog; returns ROOT."""
    root = tmp_path_factory.mktemp("built")
    build_in(root, SAMPLE, "smp", dict(tokenizer=str(small_vocab(root)), val_fraction=0.1))
    return root


def test_show_of_a_split_the_version_lacks_is_one_message(built: Path) -> None:
    rc, out, err = run_main("show", "smp@v1", "--split", "nope", "--catalog", str(built / "catalog"))
    assert rc == 2
    assert err.splitlines() == ["shardflow: error: smp@v1 has no split 'nope'; give --split one of train, val"]
    assert out == ""  # refused before anything was printed
    assert run_main("show", "smp@v1", "--split", "val", "--catalog", str(built / "catalog")).status == 0


def test_validate_into_a_closed_pipe_says_nothing(built: Path) -> None:
    """``shardflow validate REF | head -1``: the reader has gone, so the rest goes unsaid, with no error."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write gets EPIPE
    try:
        res = subprocess.run(
            [sys.executable, "-m", "shardflow", "validate", "smp@v1", "--catalog", str(built / "catalog")],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
            env=cli_env(),
        )
    finally:
        os.close(write_end)
    assert res.returncode == 128 + signal.SIGPIPE, res.stderr
    assert res.stderr == ""  # no "Nothing partial was published", no traceback


def test_a_manifest_listing_one_shard_many_times_is_refused_in_one_line(built: Path, tmp_path: Path) -> None:
    import shutil

    import yaml

    version = tmp_path / "v1"
    shutil.copytree(built / "data" / "smp" / "v1", version)
    manifest = yaml.safe_load((version / "metadata.yaml").read_text())
    train = manifest["splits"]["train"]
    first = train["shards"][0]
    train["shards"] = [first] * 1000  # the same shard, over and over
    (version / "metadata.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    rc, _, err = run_main("validate", str(version))
    assert rc == 2
    # safe_dump writes the entry once and aliases it: the repeat is found on the parsed manifest.
    assert err.splitlines() == [
        f"shardflow: error: {version / 'metadata.yaml'}: lists the shard {first['file']} more than once "
        "(splits.train.shards[0].file and splits.train.shards[1].file); a version lists each shard once, so this "
        "manifest was changed or is corrupt: rebuild the version or restore its metadata.yaml"
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--bos-token", "4999999"],
         r"--bos-token 4999999: id 4999999 is not in the vocabulary of 'small5000', whose ids are 0 to 5000$"),
        (["--bos-token", "5001"], r"--bos-token 5001: id 5001 is not in the vocabulary of 'small5000', whose ids are 0 to 5000$"),
        (["--eos", "--eos-token", "5001"],
         r"--eos-token 5001: id 5001 is not in the vocabulary of 'small5000', whose ids are 0 to 5000$"),
        (["--bos", "--eos", "--eos-token", "4999999"],
         r"--eos-token 4999999: id 4999999 is not in the vocabulary of 'small5000', whose ids are 0 to 5000$"),
        (["--bos-token", "abc-no-such-token"], r"--bos-token 'abc-no-such-token': no token of 'small5000' has this text"),
        # An ordinary token: documents hold it, so the shards' boundaries could not be told apart.
        (["--bos-token", "0"], r"--bos-token 0: '!' \(id 0\) is an ordinary token of 'small5000', which documents contain"),
        (["--eos", "--eos-token", "!"], r"--eos-token !: '!' \(id 0\) is an ordinary token of 'small5000'"),
    ],
)
def test_a_boundary_token_outside_the_vocabulary_or_ordinary_is_refused_at_planning(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    rc, _, err = run_main("build", str(SAMPLE), "--name", "bos", "--no-prefect", "--data-root", str(tmp_path / "data"),
                          "--catalog", str(tmp_path / "cat"), "--tokenizer", str(small_vocab(tmp_path)), *flags)
    assert rc == 2
    assert len(err.splitlines()) == 1 and re.search(message, err.splitlines()[0].removeprefix("shardflow: error: ")), err
    assert not (tmp_path / "cat").exists() or not list((tmp_path / "cat").glob("*.yaml"))
    assert not (tmp_path / "data").exists()  # refused while planning: nothing staged


@pytest.fixture
def full_tmpfs(tmp_path: Path):
    """A 1 MiB tmpfs at tmp_path/full, filled up (needs root and CAP_SYS_ADMIN; skipped otherwise)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode})")
    try:
        with open(mnt / "filler", "wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * (2 << 20))
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("full", ["--catalog", "--data-root"])
def test_a_full_disk_names_the_full_place_and_its_option(full_tmpfs: Path, tmp_path: Path, full: str) -> None:
    places = {"--data-root": tmp_path / "data", "--catalog": tmp_path / "cat"}
    places[full] = full_tmpfs / "here"
    other = next(option for option in places if option != full)
    rc, _, err = run_main("build", str(SAMPLE), "--name", "full", "--no-prefect", "--tokenizer", str(small_vocab(tmp_path)),
                          *(word for option, place in places.items() for word in (option, str(place))))
    last = err.strip().splitlines()[-1]
    assert rc == 1, last
    assert last.startswith(f"shardflow: error: {places[full]}"), last  # the path on the full filesystem...
    assert f"(or use another {full})" in last and other not in last, last  # ... and the option that moves it
    assert "No space left on device" in last and "Nothing was published and the catalog is unchanged" in last


@pytest.mark.slow
def test_an_object_store_gone_mid_build_is_retried_then_one_message(tmp_path: Path) -> None:
    """The endpoint answers the plan's listing, then goes away before the objects are read."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from support.s3 import S3Server

    server = S3Server()
    release = tmp_path / "release"
    try:
        server.fs().mkdir("mid")
        server.fs().put(str(SAMPLE), "mid/sample.parquet")
        env = _aws_free_env(tmp_path, **{k: v for k, v in server.env.items() if k != "AWS_DEFAULT_REGION"},
                            AWS_MAX_ATTEMPTS="1", SHARDFLOW_FAULT="wait:plan", SHARDFLOW_FAULT_RELEASE=str(release))
        build = subprocess.Popen(
            [sys.executable, "-m", "shardflow", "build", "s3://mid/sample.parquet", "--name", "remote",
             "--no-prefect", "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "cat")],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("release.reached-*")) and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()  # planned: now the endpoint is gone
    release.touch()
    out, err = build.communicate(timeout=120)
    assert list(tmp_path.glob("release.reached-*")), err[-3000:]  # it was planned while the endpoint was up
    assert build.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    lines = err.splitlines()
    assert any("transient I/O error" in line for line in lines), err  # classed as transient: retried
    errors = [line for line in lines if line.startswith("shardflow: error:")]
    assert errors == lines[-1:] and errors[0].startswith("shardflow: error: the object store could not be reached"), err
    assert not (tmp_path / "cat" / "remote.yaml").exists()
