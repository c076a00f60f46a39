"""The exceptions shardflow raises for problems a user can fix.

Every ``ShardflowError`` carries one complete message: what is wrong, which file
(and row, where known), and how to fix it. The command line prints that message
and exits non-zero without a traceback; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
    "ShardflowError",
    "ConfigError",
    "InputError",
    "ValidationError",
    "ManifestError",
    "CatalogError",
    "is_transient",
    "describe_os_error",
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
    return isinstance(exc, OSError) and not isinstance(exc, ShardflowError) and exc.errno not in _PERMANENT_ERRNOS


def describe_os_error(exc: OSError) -> str:
    """One line for an I/O error at the command line: what failed, where, and what to do."""
    where = f"{exc.filename}: " if exc.filename else ""
    what = exc.strerror or str(exc)
    if exc.errno in (_errno.ENOSPC, _errno.EDQUOT):
        return (
            f"{where}{what} (the disk or quota is full). Nothing was published and the catalog is unchanged; "
            "free some space (or use another --data-root) and run the same command again: finished work is reused"
        )
    if exc.errno == _errno.EROFS:
        return f"{where}{what}; write to a writable --data-root and --catalog"
    if exc.errno in (_errno.EACCES, _errno.EPERM):
        return f"{where}{what}; check the permissions of this path"
    return (
        f"{where}{what} (an I/O error). Nothing partial was published; run the same command again: "
        "finished work is reused"
    )
