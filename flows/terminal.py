"""What the ``shardflow`` command line prints, and what it keeps off the terminal.

* **One message per error.** A user error (a ``ShardflowError``) is printed
  once, by the command line, as ``shardflow: error: ...``. On the Prefect
  path, Prefect's console would also print it as the failed task's state, the
  flow's exception and the flow's state: :class:`ConsoleFilter` drops those on
  the console only (the run's logs on the server keep them).
* **No dead links.** The temporary server's ``View at http://127.0.0.1:PORT/...``
  is dead once the command exits; :func:`recorded_note` says instead where the
  run is recorded and how to see it (``prefect server start`` on that database).
* **A quiet broken pipe.** ``shardflow show x@latest | head -3`` ends like
  ``cat`` or ``seq`` would (:func:`quiet_broken_pipe`).
* **The runtime-only install.** ``shardflow build`` without the pipeline extra
  says what to install, in one line (:func:`check_pipeline_installed`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from shardflow.errors import ShardflowError

__all__ = [
    "NoTracebackForUserErrors", "quiet_prefect_tracebacks", "ConsoleFilter", "filtered_console", "recorded_note",
    "EXIT_BROKEN_PIPE", "stdout_closed", "quiet_broken_pipe", "PIPELINE_MODULES", "PIPELINE_HINT",
    "check_pipeline_installed",
]

EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what the shell reports for `cat` or `seq` cut off by `| head`


class NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task's traceback; for a ShardflowError the message is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ShardflowError):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_prefect_tracebacks() -> None:
    """Put :class:`NoTracebackForUserErrors` on Prefect's handlers, the run logs' included."""
    flt = NoTracebackForUserErrors()
    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs", ""):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(flt)


# -- what Prefect prints on the console during `shardflow build` -----------------------------------------

# Prefect's words for a failed run: "Task run encountered an exception InputError: ...",
# "Flow run encountered an exception: InputError: ..." and (its traceback already dropped by
# NoTracebackForUserErrors) "Encountered exception during execution: InputError('...')".
_FAILED_WITH = re.compile(
    r"(?:encountered an exception:? |Encountered exception during execution: )(?:[\w.]+\.)?(\w+)[:(]"
)


def _user_error_names() -> set[str]:
    """The class names of ``ShardflowError`` and all its subclasses (some are defined outside ``shardflow.errors``)."""
    names, todo = set(), [ShardflowError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


class ConsoleFilter(logging.Filter):
    """On Prefect's console handlers only (the run's logs on the server keep everything):

    * a user error (a ``ShardflowError``) is printed once, by the command line:
      not also as the failed task's state, the flow's exception and the flow's state;
    * with a temporary server (``hide_links``), the ``View at http://127.0.0.1:PORT/runs/...``
      link, dead once the command exits, is not printed; :attr:`run_path` keeps its path
      for :func:`recorded_note`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hide_links = False
        self.run_path: str | None = None
        self._names = _user_error_names()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ShardflowError):
            return False
        message = record.getMessage()
        failed = _FAILED_WITH.search(message)
        if failed and failed.group(1) in self._names:
            return False
        if message.startswith("View at ") and "/runs/" in message:
            self.run_path = "/runs/" + message.split("/runs/", 1)[1].strip()
            return not self.hide_links
        return True


@contextlib.contextmanager
def filtered_console() -> Iterator[ConsoleFilter]:
    """Put a :class:`ConsoleFilter` on every Prefect console handler for the block; yields it."""
    flt = ConsoleFilter()
    handlers = _prefect_console_handlers()
    for handler in handlers:
        handler.addFilter(flt)
    try:
        yield flt
    finally:
        for handler in handlers:
            handler.removeFilter(flt)


def _prefect_console_handlers() -> list[Any]:
    try:
        from prefect.logging.handlers import PrefectConsoleHandler
    except ImportError:  # pragma: no cover
        return []
    found: dict[int, Any] = {}
    for logger in [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler):
                found[id(handler)] = handler
    return list(found.values())


def recorded_note(run_path: str | None) -> str:
    """Where a run on the temporary server is recorded, and how to see it: ``prefect server start`` on that database.

    The temporary server stores its runs in Prefect's database (``PREFECT_HOME``'s
    ``prefect.db`` by default), which ``prefect server start`` serves with the UI.
    """
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = settings.server.database.connection_url
    url = url.get_secret_value() if url is not None else ""
    sqlite_file = url.startswith("sqlite") and ":///" in url
    database = url.split(":///", 1)[1] if sqlite_file else "the database of PREFECT_API_DATABASE_CONNECTION_URL"
    default_home = Path("~/.prefect").expanduser()
    home = Path(settings.home).expanduser()
    command = "prefect server start" if home == default_home else f"PREFECT_HOME={home} prefect server start"
    where = f"http://{settings.server.api.host}:{settings.server.api.port}"
    see = f"{where}{run_path}" if run_path else f"{where}/runs"
    return (f"shardflow: the run is recorded in {database} (Prefect's temporary server has stopped); "
            f"to see it, run: {command} and open {see}")


# -- standard output closed by its reader ---------------------------------------------------------------


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head``): Linux reports POLLERR on it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & select.POLLERR for _, mask in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True  # no poll (not Linux) or no real stdout: the BrokenPipeError is most likely stdout's


def quiet_broken_pipe() -> int:
    """The reader of standard output (``| head -3``) has what it wanted: end quietly, as ``cat`` or ``seq`` do.

    The status is 141 (128 + SIGPIPE), what the shell reports for a tool that
    SIGPIPE ended, so ``set -o pipefail`` scripts see what they see for ``cat``.
    Nothing is printed: the output was cut short by its reader, not by a
    failure. Standard output goes to /dev/null, so that the interpreter's last
    flush of what is still buffered does not fail again.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


# -- the runtime-only install ------------------------------------------------------------------------

# What `shardflow build` imports that the runtime install (numpy and PyYAML only) lacks.
PIPELINE_MODULES = ("pyarrow", "prefect", "tiktoken", "tokenizers", "sentencepiece", "gigatoken", "ml_dtypes",
                    "datasets", "fastapi", "matplotlib")
PIPELINE_HINT = "pip install 'shardflow[pipeline]'"


def check_pipeline_installed(args: argparse.Namespace) -> None:
    """Refuse a build in an install without the pipeline extra, before any work, in one line."""
    import importlib.util

    needed = ("pyarrow",) if args.no_prefect else ("pyarrow", "prefect")
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ShardflowError(
            f"shardflow {args.command} needs the build pipeline ({', '.join(missing)} not installed "
            f"here: this looks like the runtime-only install); {PIPELINE_HINT}"
        )
