"""The paths a manifest names, checked: text checks that need no filesystem call, and the confinement check.

Re-exported by ``shardflow.manifest``, whose readers and writers are their callers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .errors import ManifestError

__all__ = ["check_relative_file", "joined_file", "version_file", "shown"]

_CONTROL = re.compile("[\x00-\x1f\x7f]")


def shown(value: Any) -> str:
    """``value`` as a message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_relative_file(name: Any, where: str) -> str:
    """A file inside the version directory: ``FILE`` or ``DIR/FILE`` (schema 2's split directories).

    No absolute paths, no '..', no backslashes, at most one directory level. Text only: no filesystem call.
    """
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}: file name {shown(name)} is not a string")
    if _CONTROL.search(name):
        raise ManifestError(f"{where}: file name {shown(name)} holds a control character (NUL, newline...); "
                            "restore the file or rebuild the version")
    parts = name.split("/")
    if "\\" in name or os.path.isabs(name) or len(parts) > 2 or any(p in ("", ".", "..") for p in parts):
        raise ManifestError(
            f"{where}: file {name!r} escapes the version directory; shard paths must be plain file names "
            "or SPLIT/FILE"
        )
    return name


def joined_file(directory: Path, name: Any, what: str) -> Path:
    """``directory / name`` after ``version_file``'s text checks (``what``: the field), with no filesystem call: whoever
    opens the file checks it for symlinks out of the version (``version_file``, ``ShardSet`` at first map)."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{directory}: {what} names {shown(name)}, not a file name; restore the file or rebuild the version")
    parts = name.split("/")
    if _CONTROL.search(name) or "\\" in name or os.path.isabs(name) or any(p in ("", ".", "..") for p in parts):
        raise ManifestError(
            f"{directory}: {what} names {name!r}, which is not a relative path inside the version directory; "
            "restore the manifest or rebuild the version"
        )
    return directory / name


def version_file(directory: Path | str, name: Any, what: str) -> Path:
    """The one confinement check for every path a manifest names: ``directory / name``, inside the version.

    ``name`` must be relative, without ``..``, ``.``, empty parts, backslashes or
    control characters (``what`` says which field it came from: ``joined_file``), and the path,
    symlinks resolved, must lie inside the version directory, itself resolved: a
    symlinked data root, or a user's link *to* a version directory, keeps working,
    but a shard, a split directory or a tokenizer file linked outside the version
    is refused. Raises ``ManifestError`` naming the path and the field.
    """
    path = joined_file(Path(directory), name, what)
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise ManifestError(
            f"{path}: {what} resolves to {real}, outside the version directory {root} (through a symlink); "
            "a version's files must be inside it: restore the file or rebuild the version"
        )
    return path
