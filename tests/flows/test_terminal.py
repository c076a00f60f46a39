"""What the command line keeps off the terminal (``shardflow.cli.terminal``): fast checks of its pieces.

The end-to-end checks run the ``shardflow`` command itself: ``tests/test_cli.py`` (a broken pipe, the
temporary server's note, ``--version``) and ``tests/reliability/test_bad_input.py`` (an error printed once).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardflow.errors import InputError, ShardflowError
from shardflow.flows.console import ConsoleFilter, recorded_note


class _ElsewhereError(ShardflowError):
    """A user error defined outside shardflow.errors, as some modules do."""


def _record(message: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, message, None, exc_info)


@pytest.mark.parametrize("error", [InputError("a.jsonl line 2: not valid JSON"), _ElsewhereError("bad thing")])
def test_a_user_error_is_left_to_the_command_line(error):
    """Prefect's three console lines for one failed build (its words in prefect 3.8's task and flow engines)."""
    name, text = type(error).__name__, str(error)
    flt = ConsoleFilter()
    assert not flt.filter(_record(f"Finished in state Failed('Task run encountered an exception {name}: {text}')"))
    assert not flt.filter(_record(f"Encountered exception during execution: {name}({text!r})", error))
    assert not flt.filter(_record(f"Encountered exception during execution: {name}({text!r})"))  # traceback dropped
    assert not flt.filter(_record(f"Finished in state Failed('Flow run encountered an exception: {name}: {text}')"))


def test_a_bug_and_ordinary_lines_still_print():
    flt = ConsoleFilter()
    bug = KeyError("x")
    assert flt.filter(_record("Finished in state Failed('Task run encountered an exception KeyError: x')"))
    assert flt.filter(_record("Encountered exception during execution: KeyError('x')", bug))
    assert flt.filter(_record("Finished in state Completed()"))
    assert flt.filter(_record("sample: 1 input file(s), 1 work unit(s), runner threads, 2 in flight"))


def test_the_view_link_is_hidden_only_for_a_temporary_server_and_its_run_kept():
    flt = ConsoleFilter()
    link = "View at http://127.0.0.1:40313/runs/flow-run/adcfa7a2-f49a-42c9-93da-95723a963e5c"
    assert flt.filter(_record(link))  # a real server: the link works
    flt.hide_links = True
    assert not flt.filter(_record(link))
    assert flt.run_path == "/runs/flow-run/adcfa7a2-f49a-42c9-93da-95723a963e5c"


def test_the_note_names_the_database_and_the_command_that_shows_it(tmp_path):
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, PREFECT_HOME, temporary_settings

    # The database named too: a test harness earlier in the session may have set one (the default one,
    # PREFECT_HOME/prefect.db, is checked end to end by tests/test_cli.py's temporary-server test).
    database = f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
    with temporary_settings(updates={PREFECT_HOME: str(tmp_path), PREFECT_API_DATABASE_CONNECTION_URL: database}):
        note = recorded_note("/runs/flow-run/abc")
    assert note == (
        f"shardflow: the run is recorded in {tmp_path / 'prefect.db'} (Prefect's temporary server has stopped); "
        f"to see it, run: PREFECT_HOME={tmp_path} prefect server start and open "
        "http://127.0.0.1:4200/runs/flow-run/abc"
    )
    with temporary_settings(updates={PREFECT_HOME: str(Path("~/.prefect").expanduser())}):
        assert "run: prefect server start and open" in recorded_note(None)


def test_stdout_closed_tells_a_gone_reader_from_a_live_one():
    """Only a pipe whose reader has gone: another pipe's BrokenPipeError stays an I/O error with its message."""
    code = ("import sys\nfrom shardflow.cli.terminal import stdout_closed\n"
            "sys.stderr.write(str(stdout_closed()))\n")
    live = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert live.stderr == "False"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        gone = subprocess.run([sys.executable, "-c", code], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    finally:
        os.close(write_end)
    assert gone.stderr == "True"


def test_a_broken_pipe_that_is_not_stdout_stays_an_io_error(tmp_path):
    """A helper process or socket gone: the one-line I/O error and status 1, not the quiet ending of ``| head``."""
    code = (
        "import errno, sys\nfrom shardflow.cli import commands as cli\n"
        "def ls(args):\n    raise BrokenPipeError(errno.EPIPE, 'Broken pipe')\n"
        "cli.COMMANDS['ls'] = ls\nraise SystemExit(cli.main(['ls', '--catalog', 'cat']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == ("shardflow: error: Broken pipe (an I/O error). Nothing partial was published; "
                           "run the same command again: finished work is reused\n")


def test_the_first_line_says_what_is_built_before_prefect_is_imported(tmp_path):
    """``shardflow build``'s first line (stderr): the dataset, its inputs counted with their size, the tokenizer;
    written before anything imports Prefect (whose import alone takes seconds). The flow is stubbed out here: the
    line is what is checked, not the build. ``--progress none`` prints none."""
    from support.paths import SAMPLE

    code = (
        "import sys\n"
        "import shardflow.flows.launch as launch\n"
        "from shardflow.cli.commands import main\n"
        "real_write = sys.stderr.write\n"
        "sys.stderr.write = lambda text: real_write(text.replace('\\n', f' [prefect {\"prefect\" in sys.modules}]\\n'))\n"
        "def flow(request, display):\n"
        "    raise SystemExit(0)\n"
        "launch.build_with_prefect = flow\n"
        "for progress in ('plain', 'none'):\n"
        "    try:\n"
        "        main(['build', sys.argv[1], sys.argv[2], '--name', 'first', '--progress', progress])\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.parquet").write_bytes(SAMPLE.read_bytes())
    size = SAMPLE.stat().st_size
    proc = subprocess.run([sys.executable, "-c", code, str(SAMPLE), str(tmp_path / "corpus")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert proc.stderr == (f"shardflow: first: building from 2 input files ({2 * size / 1024:.1f} KiB), "
                           "tokenizer cl100k_base [prefect False]\n")


def test_the_first_line_names_what_only_planning_lists():
    """Inputs on object storage are listed while planning (no listing, no credentials before the first line)."""
    from shardflow.cli.progress import first_line
    from shardflow.config import BuildConfig
    from shardflow.pipeline.request import BuildRequest

    from support.paths import SAMPLE

    request = BuildRequest(config=BuildConfig(name="mixed", sources=(str(SAMPLE), "s3://bucket/corpus/")))
    assert first_line(request) == (f"shardflow: mixed: building from 1 input file ({SAMPLE.stat().st_size / 1024:.1f} "
                                   "KiB) and s3://bucket/corpus/ (listed while planning), tokenizer cl100k_base")
