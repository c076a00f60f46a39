"""The exceptions shardflow raises for problems a user can fix.

Every ``ShardflowError`` carries one complete message: what is wrong, which file
(and row, where known), and how to fix it. The command line prints that message
and exits non-zero without a traceback; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

__all__ = [
    "ShardflowError",
    "ConfigError",
    "InputError",
    "ValidationError",
    "ManifestError",
    "CatalogError",
    "is_transient",
    "RetryPolicy",
    "RETRY",
    "describe_os_error",
    "network_unreachable",
    "missing_credentials",
    "describe_storage_error",
]


class ShardflowError(Exception):
    """A problem the user can fix; the message says how."""


class ConfigError(ShardflowError, ValueError):
    """An invalid option or combination of options."""


class InputError(ShardflowError):
    """Bad input data: a missing column, a corrupt file, an empty corpus.

    Deterministic: retrying does not help, so orchestration never retries it.
    """


class ValidationError(ShardflowError):
    """Written or published data does not match its manifest or format."""


class ManifestError(ShardflowError):
    """A ``metadata.yaml`` that cannot be read with this version of shardflow."""


class CatalogError(ShardflowError):
    """A reference that does not resolve, or a catalog that cannot be updated."""


# OSErrors that a retry a few seconds later cannot fix: the path is wrong, the
# permissions are, or the disk is full or read-only (a person must act).
# The same as classes: such an error raised by Python code carries no errno.
_PERMANENT_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
_PERMANENT_ERRNOS = frozenset(
    {
        _errno.ENOENT,
        _errno.EACCES,
        _errno.EPERM,
        _errno.EISDIR,
        _errno.ENOTDIR,
        _errno.EEXIST,
        _errno.ENAMETOOLONG,
        _errno.ENOSPC,
        _errno.EDQUOT,
        _errno.EROFS,
        _errno.EFBIG,
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the step that raised ``exc`` may succeed.

    Only I/O errors (``OSError``) of a flaky disk or network mount are; bad input
    and bad configuration (every ``ShardflowError``) never are, nor OSErrors
    that need a person (missing paths, permissions, a full or read-only disk).
    """
    if network_unreachable(exc):
        return True
    return (isinstance(exc, OSError) and not isinstance(exc, (ShardflowError, *_PERMANENT_OS_ERRORS))
            and exc.errno not in _PERMANENT_ERRNOS)


@dataclass(frozen=True)
class RetryPolicy:
    """How a job that failed on a transient error (``is_transient``) is retried: the one policy of every executor.

    Jobs are idempotent, so a retry redoes only what did not finish. Retry ``n``
    (from 1) waits ``delay * n`` seconds; the Prefect tasks take the same numbers.
    """

    retries: int = 2
    delay: float = 1.0

    def delays(self) -> list[float]:
        """The pause before each retry, in order."""
        return [self.delay * (n + 1) for n in range(self.retries)]


RETRY = RetryPolicy()


def _botocore(*names: str) -> tuple[type, ...]:
    """botocore's exception classes ``names``, if botocore is loaded (else no exception can be one of them)."""
    module = sys.modules.get("botocore.exceptions")
    return tuple(getattr(module, name) for name in names if hasattr(module, name)) if module else ()


def network_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is an object store that could not be reached or dropped the connection.

    botocore's connection errors (endpoint down, refused, reset, timed out) are
    not ``OSError``s; a retry a few seconds later may find the endpoint back.
    """
    classes = _botocore("ConnectionError", "HTTPClientError")
    return bool(classes) and isinstance(exc, classes)


def missing_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` is an object store's client finding no (or partial) credentials."""
    return isinstance(exc, _botocore("NoCredentialsError", "PartialCredentialsError"))


def describe_storage_error(exc: BaseException) -> str | None:
    """One line for an object-store failure the command line met (no credentials, endpoint down), else None."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if missing_credentials(exc):
        return (
            f"no usable credentials for the object store ({detail}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY or AWS_PROFILE (and AWS_ENDPOINT_URL for an S3-compatible store)"
        )
    if network_unreachable(exc):
        return (
            f"the object store could not be reached ({detail}); check AWS_ENDPOINT_URL and the network. "
            "Nothing partial was published; run the same command again: finished work is reused"
        )
    return None


def _full_place(filename: str | None, places: Mapping[str, Path]) -> tuple[str | None, str]:
    """Which of ``places`` (option -> directory) a full disk is: ``(path to name, option to change)``.

    The file that failed if it is known (a write() names none), else the place
    whose filesystem has the least space left.
    """
    if not places:
        return filename, "--data-root"
    if filename:
        target = Path(os.path.abspath(os.fsdecode(filename)))
        for option, place in sorted(places.items(), key=lambda kv: -len(str(kv[1]))):
            if target == place or place in target.parents:
                return filename, option
        return filename, " or ".join(places)

    def free(place: Path) -> tuple[int, int]:
        for candidate in (place, *place.parents):  # the place itself may not exist yet
            with contextlib.suppress(OSError):
                st = os.statvfs(candidate)
                return st.f_bavail * st.f_frsize, os.stat(candidate).st_dev
        return 1 << 62, -1

    state = {option: free(Path(place)) for option, place in places.items()}
    option = min(state, key=lambda o: state[o][0])
    same = [o for o in places if state[o][1] == state[option][1]]
    return str(places[option]), " and ".join(same)


def describe_os_error(exc: OSError, *, places: Mapping[str, Path] | None = None) -> str:
    """One line for an I/O error at the command line: what failed, where, and what to do.

    ``places``: the command's directories by option (``{"--data-root": ..., "--catalog": ...}``), so a
    full disk names the path on the full filesystem and the option that moves it.
    """
    where = f"{exc.filename}: " if exc.filename else ""
    what = exc.strerror or str(exc)
    if exc.errno in (_errno.ENOSPC, _errno.EDQUOT):
        path, option = _full_place(exc.filename, {o: Path(p).absolute() for o, p in (places or {}).items()})
        where = f"{path}: " if path else ""
        return (
            f"{where}{what} (the disk or quota is full). Nothing was published and the catalog is unchanged; "
            f"free some space there (or use another {option}) and run the same command again: finished work is reused"
        )
    if exc.errno == _errno.EROFS:
        return f"{where}{what}; write to a writable --data-root and --catalog"
    if exc.errno in (_errno.EACCES, _errno.EPERM):
        return f"{where}{what}; check the permissions of this path"
    if exc.errno in (_errno.ENOTDIR, _errno.EEXIST):  # a rerun meets the same file where a directory belongs
        return (f"{where}{what}: a file is where a directory belongs; move it away (a rerun meets it again). "
                "Nothing partial was published")
    return (
        f"{where}{what} (an I/O error). Nothing partial was published; run the same command again: "
        "finished work is reused"
    )
