"""What Prefect prints on the console during ``shardflow build``, and what is kept off it.

* **One message per error.** A user error (a ``ShardflowError``) is printed
  once, by the command line, as ``shardflow: error: ...``. Prefect's console
  would also print it as the failed task's state, the flow's exception and the
  flow's state: :class:`ConsoleFilter` drops those on the console only (the
  run's logs on the server keep them).
* **No dead links.** The temporary server's ``View at http://127.0.0.1:PORT/...``
  is dead once the command exits; :func:`recorded_note` says instead where the
  run is recorded and how to see it (``prefect server start`` on that database).
* **Above the bar.** Prefect's console lines print through the progress bar's
  console (:func:`console_to`).
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Any, Iterator

from prefect.logging.handlers import PrefectConsoleHandler

from shardflow.errors import ShardflowError

__all__ = ["NoTracebackForUserErrors", "quiet_prefect_tracebacks", "ConsoleFilter", "filtered_console", "recorded_note",
           "console_to"]


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
    handlers = prefect_console_handlers()
    for handler in handlers:
        handler.addFilter(flt)
    try:
        yield flt
    finally:
        for handler in handlers:
            handler.removeFilter(flt)


def prefect_console_handlers() -> list[Any]:
    """Every ``PrefectConsoleHandler`` of this process's loggers, once each."""
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




@contextlib.contextmanager
def console_to(console: Any) -> Iterator[None]:
    """Route Prefect's console log lines through ``console`` (a progress bar's), so they print above the bar."""
    swapped = [(handler, handler.console) for handler in prefect_console_handlers()] if console is not None else []
    for handler, _ in swapped:
        handler.console = console
    try:
        yield
    finally:
        for handler, old in swapped:
            handler.console = old
