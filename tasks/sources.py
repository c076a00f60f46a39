"""Sources given as URLs: ``file://`` maps to a local path, other fsspec URLs are staged to local disk.

The core library reads local files (memory-mapped Parquet and Arrow). A source
on object storage or another fsspec filesystem (``s3://bucket/corpus/`` with
``s3fs`` installed, ``gs://``, ``memory://`` in tests, ...) is mirrored into
``<data_root>/<name>/.sources/<digest of the URL>/`` before planning:

* a file URL becomes one local file with the same name;
* a directory URL becomes a local directory with the same relative paths
  (Parquet/Arrow files, plus the ``state.json``/``dataset_info.json`` of a
  ``datasets`` ``save_to_disk`` directory);
* a glob URL becomes a local directory holding the matches, relative to the
  glob's fixed prefix.

So the inputs' names (what the build key and the manifest record) are the same
as for a local copy of the same tree, and a build from ``s3://`` is
byte-identical to one from local files. A file whose size and version tag
(ETag, mtime, checksum, whichever the filesystem reports) are unchanged is not
downloaded again; files that disappeared remotely are removed from the mirror.

No Prefect import here: the CLI's ``--no-prefect`` path uses it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterable
from urllib.parse import unquote, urlparse

from shardflow.errors import InputError
from shardflow.sources import input_suffixes

__all__ = ["is_url", "file_url_to_path", "needs_staging", "local_sources", "stage_source", "stage_sources"]

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_SIDE_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")
_INDEX = ".shardflow-mirror.json"


def is_url(spec: str) -> bool:
    return bool(_URL_RE.match(spec))


def file_url_to_path(url: str) -> str:
    """``file:///data/x.parquet`` (or ``file://localhost/...``) to ``/data/x.parquet``."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        raise ValueError(f"not a file:// URL: {url}")
    if parsed.netloc not in ("", "localhost"):
        raise InputError(f"{url}: file:// URLs must name a local path (file:///path), not host {parsed.netloc!r}")
    return unquote(parsed.path)


def needs_staging(specs: Iterable[str]) -> bool:
    """Whether any source is a URL other than ``file://``."""
    return any(is_url(s) and not s.lower().startswith("file://") for s in specs)


def local_sources(specs: Iterable[str]) -> tuple[str, ...]:
    """Map ``file://`` URLs to paths; refuse other URLs (they need ``stage_sources``)."""
    out = []
    for spec in specs:
        if spec.lower().startswith("file://"):
            out.append(file_url_to_path(spec))
        elif is_url(spec):
            raise InputError(f"{spec}: remote sources must be staged first (stage_sources)")
        else:
            out.append(spec)
    return tuple(out)


def _version_tag(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "checksum", "md5", "mtime", "LastModified", "last_modified", "updated", "created"):
        if info.get(key) is not None:
            return f"{key}={info[key]}"
    return ""


def _wanted(name: str) -> bool:
    base = PurePosixPath(name).name
    if base.startswith("."):
        return False
    # Asked of the input-kind registry at each call, so a newly registered kind is mirrored too.
    return base.lower().endswith(input_suffixes()) or base in _SIDE_FILES


def _glob_base(path: str) -> str:
    """The fixed directory prefix of a glob, up to and including its last '/' before a wildcard."""
    cut = min((i for i, ch in enumerate(path) if ch in "*?["), default=len(path))
    head = path[:cut]
    return head[: head.rfind("/") + 1]


def stage_source(spec: str, cache_root: str | os.PathLike[str]) -> str:
    """Mirror one fsspec URL under ``cache_root``; returns the local path to build from."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec comes with datasets
        raise InputError(f"{spec}: reading URLs needs fsspec (pip install fsspec, plus s3fs for s3://)") from None
    try:
        fs, root = fsspec.core.url_to_fs(spec)
    except ImportError as exc:
        scheme = spec.split("://", 1)[0]
        raise InputError(
            f"{spec}: no fsspec filesystem for {scheme}:// is installed ({exc}); "
            f"e.g. pip install s3fs for s3://, gcsfs for gs://"
        ) from None
    except ValueError as exc:
        raise InputError(f"{spec}: not a usable fsspec URL ({exc})") from None
    dest = Path(cache_root) / hashlib.sha256(spec.encode()).hexdigest()[:16]
    root = root.rstrip("/") if not any(ch in root for ch in "*?[") else root
    try:
        if any(ch in root for ch in "*?["):
            base = _glob_base(root)
            remote = [p for p in sorted(fs.glob(root)) if _wanted(p) and fs.isfile(p)]
            if not remote:
                raise InputError(f"{spec}: the pattern matches no files; check the URL and the pattern")
            files = {(p[len(base):] if p.startswith(base) else PurePosixPath(p).name).lstrip("/"): p for p in remote}
            local = dest
        elif fs.isdir(root):
            remote = sorted(fs.find(root, withdirs=False))
            files = {p[len(root):].lstrip("/"): p for p in remote}
            files = {rel: p for rel, p in files.items() if _wanted(rel)}
            if not files:
                raise InputError(f"{spec}: the directory has no Parquet or Arrow files")
            local = dest
        elif fs.isfile(root):
            name = PurePosixPath(root).name
            files = {name: root}
            local = dest / name
        else:
            raise InputError(f"{spec}: no such file or directory")
        _mirror(fs, files, dest)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{spec}: no such file or directory") from None
    return str(local)


def _mirror(fs: Any, files: dict[str, str], dest: Path) -> None:
    """Download ``files`` ({relative name: remote path}) into ``dest``, skipping unchanged ones."""
    dest.mkdir(parents=True, exist_ok=True)
    index_path = dest / _INDEX
    try:
        index: dict[str, Any] = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    new_index: dict[str, Any] = {}
    for rel, remote in files.items():
        if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
            raise InputError(f"{remote}: refusing to stage a path outside the mirror ({rel})")
        info = fs.info(remote)
        stamp = {"size": int(info.get("size") or 0), "tag": _version_tag(info)}
        target = dest / rel
        if index.get(rel) == stamp and target.exists() and target.stat().st_size == stamp["size"]:
            new_index[rel] = stamp
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        fs.get_file(remote, str(tmp))
        os.replace(tmp, target)
        new_index[rel] = stamp
    for rel in set(index) - set(new_index):  # gone remotely: gone from the mirror too
        try:
            (dest / rel).unlink()
        except FileNotFoundError:
            pass
    tmp_index = index_path.with_name(index_path.name + ".tmp")
    tmp_index.write_text(json.dumps(new_index, indent=0, sort_keys=True))
    os.replace(tmp_index, index_path)


def stage_sources(specs: Iterable[str], cache_root: str | os.PathLike[str]) -> tuple[str, ...]:
    """Local paths for every source: plain paths as they are, ``file://`` mapped, other URLs mirrored."""
    out = []
    for spec in specs:
        if spec.lower().startswith("file://"):
            out.append(file_url_to_path(spec))
        elif is_url(spec):
            out.append(stage_source(spec, cache_root))
        else:
            out.append(spec)
    return tuple(out)

