"""The ``shardflow`` command line (``shardflow.cli.commands.main``), run in-process without Prefect."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest

from support.cli import run_main
from support.corpus import write_parquet
from support.paths import SAMPLE
from shardflow.cli.commands import main


@pytest.fixture
def cli(cli, tmp_path, monkeypatch):
    """conftest's ``cli`` (``shardflow ARGS`` in this process) in tmp_path, for relative --data-root/--catalog."""
    monkeypatch.chdir(tmp_path)
    return cli


BUILD = ("--data-root", "data", "--catalog", "cat", "--no-prefect")


@pytest.mark.slow
def test_build_prints_the_ref_and_last_the_absolute_manifest_path(cli, tmp_path):
    status, out, err = cli("build", str(SAMPLE), "--name", "demo", "--shard-tokens", "60000", "--workers", "2", *BUILD)
    assert status == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == "published demo@v1"
    last = Path(lines[-1])
    assert last.is_absolute() and last == tmp_path / "data" / "demo" / "v1" / "metadata.yaml" and last.is_file()
    # An identical rebuild publishes nothing and says so; the last line is still the manifest's path.
    status, out, _ = cli("build", str(SAMPLE), "--name", "demo", "--shard-tokens", "60000", *BUILD)
    assert status == 0
    assert out.strip().splitlines() == ["nothing new: demo@v1 is identical", str(last)]


def test_inputs_back_to_an_older_versions_say_that_latest_is_another(cli, tmp_path, tiny_parquet):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(tiny_parquet, src / "a.parquet")
    assert cli("build", str(src), "--name", "back", *BUILD)[0] == 0
    shutil.copy(SAMPLE, src / "b.parquet")
    assert cli("build", str(src), "--name", "back", *BUILD)[0] == 0
    (src / "b.parquet").unlink()  # back to v1's inputs: v1 is theirs, and @latest stays v2
    status, out, _ = cli("build", str(src), "--name", "back", *BUILD)
    assert status == 0 and out.splitlines()[0] == (
        "nothing new: back@v1 is identical; back@latest is back@v2, built from other inputs: read back@v1 for these")


def test_an_empty_val_split_is_in_the_summary_printed_last(cli, tiny_parquet):
    """``--val-fraction`` that selects no document: the result line says so, not only a log line above it."""
    status, out, _ = cli("build", str(tiny_parquet), "--name", "noval", "--val-fraction", "0.01", *BUILD)
    assert status == 0 and out.splitlines()[0] == (
        "published noval@v1; its val split is empty: --val-fraction 0.01 selected none of its 3 documents "
        "(raise --val-fraction, or use --val-count N)")
    assert cli("build", str(tiny_parquet), "--name", "noval", "--val-fraction", "0.01", *BUILD)[1].startswith(
        "nothing new: noval@v1 is identical; its val split is empty")


@pytest.mark.slow
def test_build_options_reach_the_manifest(cli, small_vocab, tmp_path):
    from shardflow.manifest import read_manifest

    status, out, err = cli(
        "build", str(SAMPLE), "--name", "opts", "--eos", "--format", "nanogpt-legacy", "--tokenizer", str(small_vocab),
        "--val-count", "5", "--seed", "3", "--description", "a test", *BUILD,
    )
    assert status == 0, err
    m = read_manifest(out.strip().splitlines()[-1])
    assert m.boundary["placement"] == "eos" and m.format_name == "nanogpt-legacy" and m.dtype == "uint16"
    assert m.splits["val"].documents == 5 and m.config["seed"] == 3 and m.description == "a test"


@pytest.mark.slow
def test_validate_prints_training_settings(cli):
    assert cli("build", str(SAMPLE), "--name", "demo", "--shard-tokens", "60000", *BUILD)[0] == 0
    status, out, err = cli("validate", "demo@latest", "--catalog", "cat")
    assert status == 0, err
    assert out.startswith("OK demo@v1: 3 shards, 148,378 tokens, 61 documents\n")  # numbers as show and diff print them
    for expected in (
        "settings for a training job:",
        "file pattern:  {split}/demo_{split}_*.bin",
        "format:        nanogpt (header 1024 bytes)",
        "dtype:         uint32",
        "vocab_size:    100277",
        "boundary:      <|endoftext|> = 100257 (bos)",
    ):
        assert expected in out
    assert re.search(r"\n  train\s+3 shards, 148,378 tokens, 61 documents\n", out)
    assert "path:" in out and str(Path("data/demo/v1").absolute()) in out
    assert cli("validate", "demo@v1", "--catalog", "cat", "--no-checksums")[0] == 0


@pytest.mark.slow
def test_validate_fails_on_a_corrupted_version(cli, tmp_path):
    assert cli("build", str(SAMPLE), "--name", "demo", "--shard-tokens", "60000", *BUILD)[0] == 0
    shard = tmp_path / "data" / "demo" / "v1" / "train" / "demo_train_000001.bin"
    with open(shard, "r+b") as f:
        f.seek(1024 + 4 * 500)
        f.write(struct.pack("<I", 7))
    status, out, err = cli("validate", "demo@v1", "--catalog", "cat")
    assert status == 2
    assert "OK" not in out
    assert err.startswith(f"shardflow: error: validation of {tmp_path / 'data' / 'demo' / 'v1'} failed (1 problem):")
    assert "demo_train_000001.bin: SHA-256" in err and "Traceback" not in err


@pytest.mark.slow
def test_ls_and_show(cli, tmp_path):
    status, out, _ = cli("ls", "--catalog", "cat")
    assert status == 0 and out.strip() == f"no datasets in {tmp_path / 'cat'}"
    src = write_parquet(tmp_path / "in.parquet", ["one", None, "", "two"])
    assert cli("build", str(src), "--name", "small", *BUILD)[0] == 0
    assert cli("build", str(src), "--name", "small", "--format", "npy", *BUILD)[0] == 0
    status, out, _ = cli("ls", "--catalog", "cat")
    assert status == 0 and out.strip() == "small\t2 versions\tlatest v2"
    status, out, _ = cli("ls", "small", "--catalog", "cat")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 2
    assert lines[0].startswith("  small@v1\t") and "\t2 docs\t" in lines[0] and "parent -" in lines[0]
    assert lines[1].startswith("* small@v2\t") and "parent small@v1" in lines[1]
    assert lines[1].endswith(str(tmp_path / "data" / "small" / "v2"))
    status, out, err = cli("show", "small@v1", "--catalog", "cat")
    assert status == 0, err
    assert out.startswith(f"small@v1  ({tmp_path / 'data' / 'small' / 'v1'})")
    assert "tokenizer cl100k_base" in out and "dtype uint32" in out and "format nanogpt" in out
    assert "totals: 2 documents" in out and "4 input rows, 1 null, 1 empty" in out
    assert "train: 2 documents, 4 tokens in 1 shard\n" in out  # one shard, not "1 shards"
    assert "split      4 tokens, 2 documents, 1 shard\n" in out


@pytest.mark.parametrize("option", ["--data-root", "--catalog"])
def test_a_data_root_or_catalog_that_is_a_file_is_refused_before_the_build(cli, tmp_path, option):
    (tmp_path / "notes.txt").write_text("not a directory")
    where = tmp_path / "notes.txt" / "sub"
    args = {"--data-root": str(tmp_path / "data"), "--catalog": str(tmp_path / "cat"), option: str(where)}
    status, out, err = cli("build", str(SAMPLE), "--name", "x", "--no-prefect", "--data-root", args["--data-root"],
                           "--catalog", args["--catalog"])
    assert status == 2 and out == "" and err.count("shardflow: error:") == 1
    assert err.strip().endswith(f"{option} {where}: {tmp_path / 'notes.txt'} is a file, not a directory; give {option} a directory")
    assert not (tmp_path / "data").exists() and not (tmp_path / "cat").exists()


def test_a_negative_sample_count_is_argparses_one_message_before_any_output(capsys):
    from shardflow.cli.commands import main

    with pytest.raises(SystemExit) as exit:
        main(["show", "ghost@v1", "--samples", "-3"])
    out, err = capsys.readouterr()
    assert exit.value.code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == "shardflow show: error: argument --samples: invalid count value: '-3'"


@pytest.mark.parametrize(
    "args,message",
    [
        (("build", "{sample}", "--name", "x", "--text-column", "body"),
         r"no column 'body'; the columns are id, text, source\. Pick the text column with --text-column NAME"),
        (("build", "{sample}", "--name", "x", "--format", "nanogpt-legacy"),
         r"format 'nanogpt-legacy' stores uint16 tokens only, but this tokenizer needs uint32"),
        (("build", "nope.parquet", "--name", "x"), r"nope\.parquet: no such file or directory"),
        (("build", "{sample}", "--name", "Bad Name"), r"dataset name 'Bad Name' is not allowed"),
        (("build", "{sample}", "--name", "x", "--workers", "0"), r"--workers must be at least 1, not 0"),
        # The flags as typed, not the config's fields (val_fraction=1.5): the library's messages name those.
        (("build", "{sample}", "--name", "x", "--val-fraction", "1.5"), r"^shardflow: error: --val-fraction 1\.5 must be in \[0, 1\)$"),
        (("build", "{sample}", "--name", "x", "--val-fraction", "0.1", "--val-count", "3"),
         r"^shardflow: error: give --val-fraction or --val-count, not both$"),
        (("build", "{sample}", "--name", "x", "--embed", "--embed-min-cosine", "2"),
         r"quality floors \(--embed-min-cosine, --embed-min-recall, --embed-pca-min-cosine, --embed-pca-min-recall\)"),
        (("embed", "ghost@v1", "--dim", "1000"), r"^shardflow: error: --dim 1000 \(all-MiniLM-L6-v2 has 384 dimensions\)"),
        (("validate", "ghost@v1", "--catalog", "cat"), r"no dataset 'ghost' in the catalog"),
        (("show", "ghost", "--catalog", "cat"), r"no dataset 'ghost' in the catalog"),
        (("ls", "ghost", "--catalog", "cat"), r"no dataset 'ghost' in the catalog"),
    ],
)
def test_user_errors_exit_2_with_one_message(cli, args, message):
    args = tuple(a.replace("{sample}", str(SAMPLE)) for a in args)
    if args[0] == "build":
        args += BUILD
    status, out, err = cli(*args)
    assert status == 2
    assert out == ""
    # Exactly one message, on the last line of stderr (progress lines may precede it).
    assert err.count("shardflow: error:") == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("shardflow: error: ")
    assert "Traceback" not in err
    assert re.search(message, last), err


def test_usage_errors_exit_2(cli, capsys):
    with pytest.raises(SystemExit) as info:
        main(["build", str(SAMPLE)])  # --name is required
    assert info.value.code == 2
    assert "--name" in capsys.readouterr().err


@pytest.mark.slow
def test_prefect_flow_output_is_byte_identical_to_no_prefect(prefect_harness, tmp_path, monkeypatch):
    """The one Prefect test: the ``build_dataset`` flow (directly and via ``shardflow build``) vs ``--no-prefect``.

    No capsys here: Prefect's log handlers keep the stream they were created
    with, and a capsys stream is closed after the test (later tests would log
    into a closed file). ``run_main`` redirects to its own streams instead.
    """
    from shardflow.flows.build import build_dataset
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.manifest import read_manifest
    from support.streams import assert_whole_documents, split_streams

    def files(directory: Path) -> dict[str, bytes]:
        return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(Path(directory).rglob("*"))
                if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] != "card"}

    def run(*args: str) -> list[str]:
        status, out, err = run_main(*args)
        assert status == 0, err
        return out.strip().splitlines()

    monkeypatch.chdir(tmp_path)
    # The CLI sets this (setdefault) for the process; setting it here makes monkeypatch undo it.
    monkeypatch.setenv("PREFECT_LOGGING_EXTRA_LOGGERS", "shardflow")
    common = ["build", str(SAMPLE), "--name", "pf", "--shard-tokens", "40000", "--val-fraction", "0.1", "--eos"]
    # (one work unit: the sample's 600 kB of text are under the default unit size)
    plain = Path(run(*common, "--data-root", "plain/data", "--catalog", "plain/cat", "--no-prefect")[-1]).parent

    # The flow itself, 4 work units (one per row group) two at a time, against the same configuration built
    # without Prefect (build(): the driver on threads, as --no-prefect runs it).
    config = BuildConfig(name="pf", sources=(str(SAMPLE),), shard_tokens=40_000, val_fraction=0.1, boundary="eos", unit_bytes=1)
    ref = build_dataset(config=config, workers=2, data_root=str(tmp_path / "flow" / "data"), catalog=str(tmp_path / "flow" / "cat")).ref
    assert ref == "pf@v1"
    flow_dir = tmp_path / "flow" / "data" / "pf" / "v1"
    bare = build(config, workers=2, data_root=tmp_path / "bare" / "data", catalog=tmp_path / "bare" / "cat")
    bare_dir = Path(bare.manifest_path).parent
    assert files(flow_dir) == files(bare_dir)
    assert len(files(flow_dir)) >= 8
    # Each of its units wrote its own train shards of whole documents: other shards than the one unit's of the
    # command line, the same documents in the same order (val is gathered: the same shards).
    assert assert_whole_documents(flow_dir) >= 4 + 1
    assert files(flow_dir) != files(plain) and split_streams(flow_dir) == split_streams(plain)
    assert {k: v for k, v in files(flow_dir).items() if k.startswith("val/")} == \
        {k: v for k, v in files(plain).items() if k.startswith("val/")}

    # And through the command line without --no-prefect.
    lines = run(*common, "--data-root", "cli/data", "--catalog", "cli/cat")
    assert lines[0] == "published pf@v1"
    cli_dir = Path(lines[-1]).parent
    # Again: the flow finds the identical version, and the command line says it published nothing.
    assert run(*common, "--data-root", "cli/data", "--catalog", "cli/cat") == \
        ["nothing new: pf@v1 is identical", lines[-1]]
    assert cli_dir == tmp_path / "cli" / "data" / "pf" / "v1"
    assert files(cli_dir) == files(plain)

    a, b, c = read_manifest(plain), read_manifest(flow_dir), read_manifest(bare_dir)
    assert (b.splits, b.totals, b.boundary, b.build_key) == (c.splits, c.totals, c.boundary, c.build_key)
    # (not their build keys, shard lists or shard counts: the flow's 1-byte unit size is in its key and cuts
    # its train shards otherwise)
    counts = lambda m: ({k: v for k, v in m.totals.items() if k not in ("shards", "bytes")},  # noqa: E731
                        {s: (e.documents, e.tokens) for s, e in m.splits.items()}, m.boundary)
    assert counts(a) == counts(b) and a.build_key != b.build_key


@pytest.mark.slow
def test_the_readme_first_command_runs_clean_on_the_temporary_server(tmp_path):
    """`shardflow build tests/assets/sample.parquet --name sample` with no Prefect server running.

    Prefect starts its temporary server; a successful build prints no ERROR line
    and no traceback (its telemetry, which fails offline, is off by default).
    """
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["SHARDFLOW_REUSE_LOCAL_SERVER"] = "0"  # the temporary server even if `prefect server start` runs here
    proc = subprocess.run(
        [sys.executable, "-m", "shardflow", "build", str(SAMPLE), "--name", "sample"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip().splitlines()
    assert "published sample@v1" in out and out[-1] == str(tmp_path / "data" / "sample" / "v1" / "metadata.yaml")
    both = proc.stdout + proc.stderr
    assert "Starting temporary server" in both  # it really ran as a flow on the temporary server
    assert "ERROR" not in both and "Traceback" not in both, both[-3000:]
    # Not the temporary server's link, dead once the command exits, but where the run is recorded and how to
    # see it: `prefect server start` serves that database with the UI (checked by hand: the link opens the run).
    assert "View at" not in both
    note = re.search(r"shardflow: the run is recorded in (/\S+) \(Prefect's temporary server has stopped\); "
                     r"to see it, run: (?:PREFECT_HOME=\S+ )?prefect server start and open "
                     r"http://127\.0\.0\.1:4200/runs/flow-run/([0-9a-f-]{36})\n", proc.stderr)
    assert note, proc.stderr[-2000:]
    import sqlite3

    with sqlite3.connect(f"file:{note[1]}?mode=ro", uri=True) as db:
        assert db.execute("SELECT name FROM flow_run WHERE id = ?", (note[2],)).fetchall() == [("build sample",)]


@pytest.mark.slow
def test_the_console_script_exits_with_the_status_and_all_its_output(tmp_path):
    """``python -m shardflow`` (the ``shardflow`` script): the piped stdout is complete and the status
    is main's; a bad path is refused in one line before any server starts."""
    import subprocess
    import sys
    import time

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shardflow", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)

    ok = script("build", str(SAMPLE), "--name", "quick", *BUILD, "--progress", "none")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.splitlines() == ["published quick@v1", str(tmp_path / "data" / "quick" / "v1" / "metadata.yaml")]
    t0 = time.monotonic()
    bad = script("build", "nope.parquet", "--name", "x", *BUILD)
    took = time.monotonic() - t0
    assert bad.returncode == 2 and bad.stdout == "" and "nope.parquet: no such file or directory" in bad.stderr
    assert "Traceback" not in bad.stderr and "server" not in bad.stderr.lower()
    assert took < 4, took  # no server was started: the interpreter and the parser only (a server takes 4 s and more)


@pytest.mark.slow
def test_the_console_script_ends_a_build_without_the_interpreters_teardown(tmp_path):
    """After ``build`` the process ends at once (``cli.run``: the teardown of a build's libraries costs 0.1 s), its
    output complete and its status main's; after another command the interpreter's exit runs as usual (where a
    reader's pin is released)."""
    import subprocess
    import sys

    code = ("import atexit, sys; atexit.register(lambda: print('teardown ran', file=sys.stderr)); "
            "from shardflow.cli import run; run()")

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)

    built = script("build", str(SAMPLE), "--name", "quick", *BUILD, "--progress", "none")
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stdout.splitlines() == ["published quick@v1", str(tmp_path / "data" / "quick" / "v1" / "metadata.yaml")]
    assert "teardown ran" not in built.stderr
    refused = script("build", "nope.parquet", "--name", "x", *BUILD)
    assert refused.returncode == 2 and "nope.parquet: no such file or directory" in refused.stderr
    assert "teardown ran" not in refused.stderr
    listed = script("ls", "--catalog", "cat")
    assert listed.returncode == 0 and "quick" in listed.stdout
    assert "teardown ran" in listed.stderr


# -- a clean terminal (issue 25, item 8) -------------------------------------------------------------


def test_version_is_the_package_version(capsys):
    import shardflow

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"shardflow {shardflow.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", shardflow.__version__)


def test_help_lists_the_real_commands_only_in_plain_words(capsys):
    from shardflow.cli.commands import COMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = re.findall(r"^    (\w+)\s", out, flags=re.M)
    assert listed and sorted(listed) == sorted(COMMANDS)
    for command in COMMANDS:  # each runs: its own --help parses
        with pytest.raises(SystemExit, match="0"):
            main([command, "--help"])
    assert not re.search(r"`|\*\*|\.md\b|\.py\b|\.yaml\b|docs/", out), out


def test_the_old_module_paths_keep_working_with_a_warning():
    """``from shardflow.build import build`` (the README's form before shardflow.pipeline) still works."""
    import importlib
    import sys

    import shardflow.pipeline

    sys.modules.pop("shardflow.build", None)
    with pytest.warns(DeprecationWarning, match="shardflow.pipeline"):
        old = importlib.import_module("shardflow.build")
    assert old.build is shardflow.pipeline.build and old.BuildResult is shardflow.pipeline.BuildResult


def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status(cli, tmp_path):
    """``shardflow show x@latest | head -3``: no message, status 141 (128 + SIGPIPE) as ``cat`` or ``seq`` give."""
    import os
    import subprocess
    import sys

    assert cli("build", str(SAMPLE), "--name", "demo", *BUILD)[0] == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write (head -3 after its lines), every time
    try:
        proc = subprocess.run([sys.executable, "-m", "shardflow", "show", "demo@latest", "--catalog", "cat"],
                              cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


@pytest.mark.parametrize(
    "args,env,named",
    [
        (("--data-root", "s3://bucket/data", "--catalog", "cat"), {}, "--catalog cat"),
        (("--data-root", "data", "--catalog", "s3://bucket/cat"), {}, "--data-root data"),
        (("--catalog", "cat"), {"SHARDFLOW_DATA_ROOT": "s3://bucket/data"}, "--catalog cat"),
        (("--data-root", "data"), {"SHARDFLOW_CATALOG": "gs://bucket/cat"}, "--data-root data"),
    ],
)
def test_a_build_with_only_one_of_its_places_on_a_bucket_is_refused(cli, tmp_path, monkeypatch, args, env, named):
    """Not a local directory named ``s3:``, nor a local catalog listing a version on a bucket (or the reverse)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    status, out, err = cli("build", str(SAMPLE), "--name", "x", "--no-prefect", *args)
    assert status == 2 and out == ""
    assert err.splitlines() == [f"shardflow: error: {named}: a build to a bucket needs both --data-root and --catalog on "
                                "it, in one bucket, e.g. --data-root s3://BUCKET/data --catalog s3://BUCKET/catalog"]
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("args", [("ls", "--catalog", "s3://bucket/cat"), ("validate", "x@v1", "--catalog", "s3://bucket/cat"),
                                  ("diff", "x@v1", "x@v2", "--catalog", "s3://bucket/cat"),
                                  ("show", "x@v1", "--catalog", "s3://bucket/cat")])
def test_reading_commands_on_a_bucket_catalog_without_credentials_say_what_to_set(cli, tmp_path, monkeypatch, args):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    # s3fs keeps its filesystems (and their credentials) per process: one an earlier test made in this worker
    # would answer with that test's keys.
    pytest.importorskip("s3fs").S3FileSystem.clear_instance_cache()
    status, out, err = cli(*args)
    assert (status, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("shardflow: error: s3://bucket/cat") and "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in err


@pytest.mark.parametrize(
    "args,env,named",
    [
        (("card", "x@latest"), {"SHARDFLOW_CATALOG": "s3://bucket/cat"}, "SHARDFLOW_CATALOG=s3://bucket/cat"),
    ],
)
def test_a_url_where_only_a_local_directory_works_is_refused(cli, tmp_path, monkeypatch, args, env, named):
    """Not a local directory named ``s3:`` (what ``Path("s3://bucket/data")`` is), silently."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    status, out, err = cli(*(a.replace("{sample}", str(SAMPLE)) for a in args))
    assert status == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith(f"shardflow: error: {named}: a URL, but ")
    assert "must be a local directory for this command (build, serve and push publish to a bucket" in err
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists()


def test_show_prints_one_exact_length_histogram(cli, tmp_path):
    import numpy as np

    from shardflow.runtime import open_shards

    assert cli("build", str(SAMPLE), "--name", "demo", *BUILD)[0] == 0
    status, out, err = cli("show", "demo@latest", "--catalog", "cat")
    assert status == 0, err
    # Before: the statistics' quarter-octave summary too ("p50 <= 2,047") beside the exact "median 1,881".
    assert "p50 <=" not in out and "document lengths (tokens)" not in out
    assert out.count("Document lengths in tokens") == 1
    shards = open_shards(tmp_path / "data" / "demo" / "v1", split="train")
    starts = shards.all_doc_starts()
    lengths = np.diff(np.append(starts, shards.num_tokens))
    line = next(line for line in out.splitlines() if line.startswith("Document lengths in tokens"))
    assert f"min {lengths.min():,}, median {int(np.median(lengths)):,}" in line and f"max {lengths.max():,}" in line
    assert "vocabulary:" in out and "top sources" in out  # the rest of the statistics stays


_WITHOUT_PIPELINE = (
    "import sys\n"
    "for name in ('pyarrow', 'prefect', 'tiktoken', 'tokenizers', 'sentencepiece', 'gigatoken', 'ml_dtypes',\n"
    "             'datasets', 'fastapi', 'matplotlib', 'torch', 'rich'):\n"
    "    sys.modules[name] = None  # import fails as if not installed; find_spec returns None\n"
    "from shardflow.cli.commands import main\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)


@pytest.mark.slow
def test_without_the_pipeline_extra_build_says_what_to_install_and_the_read_commands_work(cli, tmp_path):
    """The runtime-only install (numpy and PyYAML): the pipeline's modules made unimportable in a subprocess."""
    import subprocess
    import sys

    assert cli("build", str(SAMPLE), "--name", "demo", *BUILD)[0] == 0

    def runtime_only(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _WITHOUT_PIPELINE, *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    for extra in ((), ("--no-prefect",)):
        proc = runtime_only("build", str(SAMPLE), "--name", "other", "--data-root", "data", "--catalog", "cat", *extra)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith("shardflow: error: shardflow build needs the build pipeline (pyarrow")
        assert proc.stderr.rstrip().endswith("pip install 'shardflow[pipeline]'")
    assert not (tmp_path / "data" / "other").exists()
    validate = runtime_only("validate", "demo@v1", "--catalog", "cat")
    assert validate.returncode == 0 and validate.stdout.startswith("OK demo@v1: 1 shard, "), validate.stderr
    listed = runtime_only("ls", "--catalog", "cat")
    assert listed.returncode == 0 and listed.stdout.startswith("demo\t1 version"), listed.stderr
    shown = runtime_only("show", "demo@v1", "--catalog", "cat")
    assert shown.returncode == 0 and "Document lengths in tokens" in shown.stdout, shown.stderr


def test_an_error_a_rerun_cannot_fix_does_not_say_to_rerun():
    from shardflow.errors import describe_os_error

    for exc in (NotADirectoryError(20, "Not a directory", "/d/x/f"), FileExistsError(17, "File exists", "/d/x")):
        text = describe_os_error(exc)
        assert text.startswith(f"{exc.filename}: {exc.strerror}: a file is where a directory belongs; move it away")
        assert "run the same command again" not in text
    assert "run the same command again" in describe_os_error(OSError(5, "Input/output error", "/d/x"))


def test_diff_shows_an_option_at_its_default_by_its_value(cli, tiny_parquet):
    assert cli("build", str(tiny_parquet), "--name", "opt", "--no-card", "--no-stats", *BUILD)[0] == 0
    assert cli("build", str(tiny_parquet), "--name", "opt", *BUILD)[0] == 0
    status, out, _ = cli("diff", "opt@v1", "opt@v2", "--catalog", "cat")
    changed = [line for line in out.splitlines() if "->" in line and ("card" in line or "stats" in line)]
    assert status == 0 and len(changed) == 2 and all("False -> True" in line for line in changed), out
    assert "None" not in out
